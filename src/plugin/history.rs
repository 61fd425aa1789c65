//! `kubectl kandev history`: the conversation agentctl recorded on the workspace volume, read
//! with `agentctl history` (the container needs nothing else: no shell, no `cat`) through the
//! running agentctl pod, or, when none runs, through the history reader pod the operator keeps
//! while the request annotation is set (`crate::resume::reader_step`).

use std::time::Duration;

use kube::api::AttachParams;
use tokio::io::AsyncReadExt;

use k8s_openapi::api::core::v1::Pod;

use super::cli::{HistoryArgs, HistoryOutput};
use super::cluster::{Cluster, Deadline};
use super::error::{ExitCode, PluginError};
use super::output::OutputFormat;
use super::status::Snapshot;
use super::watch::{Progress, wait_for};
use super::write_stdout;
use crate::api::pod_contract::CONTAINER;
use crate::api::{HistoryOutcome, SessionState};
use crate::history::{NO_HISTORY_EXIT_CODE, parse_history, render_transcript, validate_session_id};
use crate::resume::{PodLiveness, pod_liveness};

/// The whole read (exec, `agentctl history`, status) must finish within this.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The history file relative to the container's working directory, which is the workspace's
/// mount path (agentctl records `<workspace>/.kandev/sessions/<session>.jsonl`), for messages.
pub fn history_path(session: &str) -> String {
    format!(".kandev/sessions/{session}.jsonl")
}

/// The command exec'd in the agentctl container. The workspace is `agentctl history`'s default,
/// the working directory (the workspace's mount path), so it works wherever the volume is
/// mounted.
pub fn history_command(session: &str) -> [&str; 4] {
    ["agentctl", "history", "--session-name", session]
}

/// How the exec'd `agentctl history` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Exit 0: stdout is the history.
    Printed,
    /// The session has no recorded history yet (exit 3).
    NoHistory,
    /// Anything else, with what the container said.
    Failed(String),
}

/// Classifies the exec's end: the exit code from the exec status when the transport reports it
/// (a kubelet does: `NonZeroExitCode` with an `ExitCode` cause), and agentctl's own words
/// otherwise (kwok's exec, for one, reports a failure without the code).
pub fn read_outcome(success: bool, exit_code: Option<i32>, stderr: &str) -> ReadOutcome {
    let stderr = stderr.trim();
    if success {
        ReadOutcome::Printed
    } else if exit_code == Some(NO_HISTORY_EXIT_CODE) || stderr.contains("no recorded history") {
        ReadOutcome::NoHistory
    } else if stderr.is_empty() {
        ReadOutcome::Failed(match exit_code {
            Some(code) => format!("agentctl history exited with code {code}"),
            None => "agentctl history failed".to_string(),
        })
    } else {
        ReadOutcome::Failed(stderr.to_string())
    }
}

pub async fn history(cluster: &Cluster, args: HistoryArgs) -> Result<ExitCode, PluginError> {
    let snapshot = cluster.snapshot(&args.session).await?;
    let name = snapshot.name();
    validate_session_id(&name).map_err(|e| PluginError::Exec {
        action: format!("locating the history of tasksession {name:?}"),
        reason: e.to_string(),
    })?;
    if let Some(pod) = snapshot.running_pod().and_then(|p| p.metadata.name.clone()) {
        return read_through(cluster, &name, &pod, &args).await;
    }
    if snapshot.status().state == SessionState::Created && snapshot.pods.is_empty() {
        // No agent has run yet: there is nothing to read, and no reader is started.
        say!("tasksession {name:?} has no recorded history yet");
        return Ok(ExitCode::Ok);
    }
    // No agent runs: the operator keeps a reader pod (workspace read-only, no agent) while
    // the request is set; it is withdrawn however the read ends, which removes the pod.
    let token = cluster.request_history(&name).await?;
    let read = async {
        let pod = await_reader(cluster, &name, &token, &args).await?;
        read_through(cluster, &name, &pod, &args).await
    };
    let result = tokio::select! {
        result = read => result,
        _ = tokio::signal::ctrl_c() => Err(PluginError::Interrupted(format!(
            "interrupted: the history reader pod of tasksession {name:?} is removed"
        ))),
    };
    cluster.withdraw_history(&name, &token).await;
    result
}

/// What the wait for a reader found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReaderWait {
    /// Exec into this pod: the reader, or an agent pod that started meanwhile.
    Read(String),
    /// The operator answered the request without a reader: its outcome and message.
    Answered(HistoryOutcome, String),
}

/// Where a history request stands in `snapshot`: a running agent pod or reader pod to read
/// through, the operator's answer to `token`, or nothing yet.
pub fn reader_wait(snapshot: &Snapshot, token: &str) -> Option<ReaderWait> {
    let running = |pod: Option<&Pod>| {
        pod.filter(|p| pod_liveness(Some(p)) == PodLiveness::Running)
            .and_then(|p| p.metadata.name.clone())
    };
    if let Some(pod) =
        running(snapshot.current_pod()).or_else(|| running(snapshot.reader.as_deref()))
    {
        return Some(ReaderWait::Read(pod));
    }
    snapshot
        .status()
        .history_request
        .filter(|h| h.token == token && h.outcome != HistoryOutcome::AgentRunning)
        .map(|h| ReaderWait::Answered(h.outcome, h.message))
}

/// Waits (up to `--timeout`) until a pod to read through runs, or the operator answers.
async fn await_reader(
    cluster: &Cluster,
    name: &str,
    token: &str,
    args: &HistoryArgs,
) -> Result<String, PluginError> {
    let progress = Progress::for_output(&OutputFormat::Text);
    let what = "the history reader pod (workspace read-only, no agent)";
    let found = wait_for(
        cluster,
        name,
        what,
        Deadline::after(args.timeout),
        progress,
        |s| Ok(reader_wait(s, token)),
    )
    .await?;
    match found {
        ReaderWait::Read(pod) => Ok(pod),
        ReaderWait::Answered(HistoryOutcome::WorkspaceGone, why) => Err(PluginError::NoWorkspace {
            name: name.to_string(),
            namespace: cluster.namespace.clone(),
            why,
        }),
        ReaderWait::Answered(outcome, why) => Err(PluginError::Exec {
            action: format!("reading the history of tasksession {name:?} without its agent"),
            reason: format!("{}: {why}", outcome.as_str()),
        }),
    }
}

/// Execs `agentctl history` in `pod` and prints what it read as `args` ask.
async fn read_through(
    cluster: &Cluster,
    name: &str,
    pod: &str,
    args: &HistoryArgs,
) -> Result<ExitCode, PluginError> {
    let action = format!("reading {} in pod {pod}", history_path(name));
    let (stdout, stderr, success, exit_code) = match tokio::time::timeout(
        READ_TIMEOUT,
        exec_read(cluster, pod, &history_command(name)),
    )
    .await
    {
        Ok(result) => result.map_err(|e| match e {
            ReadError::Kube(source) => cluster.kube_error(action.clone(), source),
            ReadError::Io(source) => PluginError::Io {
                context: action.clone(),
                source,
            },
        })?,
        Err(_) => {
            return Err(PluginError::Timeout {
                what: action,
                waited: READ_TIMEOUT,
                last_seen: format!("pod {pod} did not finish the read"),
            });
        }
    };
    match read_outcome(success, exit_code, &String::from_utf8_lossy(&stderr)) {
        ReadOutcome::Printed => {}
        ReadOutcome::NoHistory => {
            say!("tasksession {name:?} has no recorded history yet");
            return Ok(ExitCode::Ok);
        }
        ReadOutcome::Failed(reason) => return Err(PluginError::Exec { action, reason }),
    }
    match args.output {
        HistoryOutput::Jsonl => write_stdout(&String::from_utf8_lossy(&stdout))?,
        HistoryOutput::Text => {
            let parsed = parse_history(&String::from_utf8_lossy(&stdout));
            if parsed.entries.is_empty() {
                say!("tasksession {name:?} has no recorded history yet");
            }
            write_stdout(&render_transcript(&parsed.entries, args.timestamps))?;
            if parsed.skipped_corrupt_lines > 0 {
                say!(
                    "({} corrupt line(s) skipped; see them with -o jsonl)",
                    parsed.skipped_corrupt_lines
                );
            }
        }
    }
    Ok(ExitCode::Ok)
}

pub(super) enum ReadError {
    Kube(kube::Error),
    Io(std::io::Error),
}

/// What an exec'd command left: stdout, stderr, whether it exited with success, and its exit
/// code when the transport reported one.
pub(super) type Exited = (Vec<u8>, Vec<u8>, bool, Option<i32>);

/// Execs `command` (an agentctl subcommand that ends by itself) in the agentctl container and
/// reads what it leaves.
pub(super) async fn exec_read(
    cluster: &Cluster,
    pod: &str,
    command: &[&str],
) -> Result<Exited, ReadError> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let mut process = cluster
        .exec_pods()
        .exec(pod, command.iter().copied(), &params)
        .await
        .map_err(ReadError::Kube)?;
    let status = process.take_status();
    let mut stdout = process.stdout();
    let mut stderr = process.stderr();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let read_out = async {
        match stdout.as_mut() {
            Some(s) => s.read_to_end(&mut out).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let read_err = async {
        match stderr.as_mut() {
            Some(s) => s.read_to_end(&mut err).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let (read_out, read_err) = tokio::join!(read_out, read_err);
    read_out.map_err(ReadError::Io)?;
    read_err.map_err(ReadError::Io)?;
    let (success, exit_code) = match status {
        Some(status) => {
            let status = status.await;
            let success = status
                .as_ref()
                .is_some_and(|s| s.status.as_deref() == Some("Success"));
            (success, status.as_ref().and_then(exit_code))
        }
        None => (true, None),
    };
    process
        .join()
        .await
        .map_err(|e| ReadError::Io(std::io::Error::other(e)))?;
    Ok((out, err, success, exit_code))
}

/// The exit code in an exec's final status (`reason: NonZeroExitCode`, cause `ExitCode`).
fn exit_code(status: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> Option<i32> {
    status
        .details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|cause| cause.reason.as_deref() == Some("ExitCode"))?
        .message
        .as_deref()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_path_is_relative_to_the_workspace() {
        assert_eq!(history_path("demo"), ".kandev/sessions/demo.jsonl");
        assert_eq!(
            history_command("demo"),
            ["agentctl", "history", "--session-name", "demo"]
        );
    }

    /// A running agent pod comes first, then a running reader, then the operator's answer to
    /// this request (an answer to another token, or "an agent runs", keeps the wait going).
    #[test]
    fn where_a_history_request_stands() {
        use crate::api::{HistoryRequestStatus, TaskSession, TaskSessionStatus};
        let pod = |name: &str, phase: &str, reader: bool| -> Pod {
            let mut labels = serde_json::Map::new();
            if reader {
                labels.insert("kandev.dev/role".into(), "history".into());
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                    "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession", "name": "s",
                    "uid": "u", "controller": true}]},
                "status": {"phase": phase, "containerStatuses": [{"name": "agentctl", "image": "i",
                    "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
            }))
            .expect("pod")
        };
        let answer = |token: &str, outcome| HistoryRequestStatus {
            token: token.into(),
            outcome,
            message: "m".into(),
        };
        let snapshot = |pods: Vec<Pod>, answered: Option<HistoryRequestStatus>| {
            let mut ts = TaskSession::new("s", Default::default());
            ts.metadata.uid = Some("u".into());
            ts.status = Some(TaskSessionStatus {
                history_request: answered,
                ..Default::default()
            });
            Snapshot::new("ns", ts, None, pods)
        };
        let read = |p: &str| Some(ReaderWait::Read(p.into()));
        #[rustfmt::skip]
        let rows = [
            ("nothing yet", snapshot(vec![], None), None),
            ("reader pending", snapshot(vec![pod("s-history", "Pending", true)], None), None),
            ("reader runs", snapshot(vec![pod("s-history", "Running", true)], None), read("s-history")),
            ("an agent runs", snapshot(vec![pod("s-agent-1", "Running", false), pod("s-history", "Running", true)], None), read("s-agent-1")),
            ("a reader of another name", snapshot(vec![pod("x-history", "Running", true)], None), None),
            ("workspace gone", snapshot(vec![], Some(answer("t", HistoryOutcome::WorkspaceGone))),
                Some(ReaderWait::Answered(HistoryOutcome::WorkspaceGone, "m".into()))),
            ("another request's answer", snapshot(vec![], Some(answer("old", HistoryOutcome::WorkspaceGone))), None),
            ("an agent starts", snapshot(vec![], Some(answer("t", HistoryOutcome::AgentRunning))), None),
        ];
        for (what, snapshot, want) in rows {
            assert_eq!(reader_wait(&snapshot, "t"), want, "{what}");
        }
    }

    #[test]
    fn how_the_read_ended() {
        let failed = |s: &str| ReadOutcome::Failed(s.to_string());
        #[rustfmt::skip]
        let rows = [
            (true, None, "", ReadOutcome::Printed),
            (true, Some(0), "noise", ReadOutcome::Printed),
            (false, Some(3), "", ReadOutcome::NoHistory),
            (false, None, "agentctl: no recorded history for session \"a\" at …", ReadOutcome::NoHistory),
            (false, Some(1), "agentctl: invalid --session-name: …\n", failed("agentctl: invalid --session-name: …")),
            (false, Some(126), "", failed("agentctl history exited with code 126")),
            (false, None, "  ", failed("agentctl history failed")),
        ];
        for (success, code, stderr, expected) in rows {
            assert_eq!(read_outcome(success, code, stderr), expected, "{stderr:?}");
        }
    }

    #[test]
    fn the_exit_code_is_read_from_the_exec_status() {
        let status: k8s_openapi::apimachinery::pkg::apis::meta::v1::Status =
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}
            }))
            .expect("status");
        assert_eq!(exit_code(&status), Some(3));
        assert_eq!(exit_code(&Default::default()), None);
    }
}
