//! `kubectl kandev complete` and `kubectl kandev cancel`: how a session is ended by its user.

use super::cli::EndArgs;
use super::cluster::{Cluster, Deadline};
use super::output::OutputFormat;
use super::watch::{Progress, wait_for};
use super::{ExitCode, PluginError, print_object, shown};
use crate::api::conditions;
use crate::api::{SessionEnd, SessionState};

/// `complete` / `cancel`: sets `spec.end` (a merge patch; the API server refuses another end
/// than the one set), then with --wait waits for the terminal state.
pub(super) async fn end(
    cluster: &Cluster,
    args: EndArgs,
    end: SessionEnd,
) -> Result<ExitCode, PluginError> {
    let name = args.session;
    let snapshot = cluster.snapshot(&name).await?;
    let wanted = match end {
        SessionEnd::Completed => SessionState::Completed,
        SessionEnd::Cancelled => SessionState::Cancelled,
    };
    let mut session = snapshot.session;
    if session.spec.end != Some(end) {
        session = cluster.set_end(&name, end).await?;
    }
    say!("tasksession {name:?}: spec.end set to {end:?}; the operator stops the agent");
    if args.wait {
        let what = format!("tasksession {name:?} to be {wanted}");
        let progress = Progress::for_output(&args.output);
        let deadline = Deadline::after(args.timeout);
        let done = wait_for(cluster, &name, &what, deadline, progress, |s| {
            Ok((s.status().state == wanted).then(|| s.clone()))
        })
        .await?;
        let message = conditions::find(&done.status().conditions, conditions::AGENT_RUNNING)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        print_object(&shown(done.session), &args.output, || {
            format!("tasksession {name:?} is {wanted}: {message}\n")
        })?;
    } else if args.output != OutputFormat::Text {
        print_object(&shown(session), &args.output, String::new)?;
    }
    Ok(ExitCode::Ok)
}
