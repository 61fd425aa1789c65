//! `kubectl kandev prompt`: make sure the agent runs, then speak ACP to it through
//! `kubectl exec <pod> -- agentctl connect` and stream its answer.

use std::io::Write;
use std::time::Duration;

use tokio::time::Instant;

use super::cluster::{Cluster, Deadline};
use super::error::{ExitCode, PluginError};
use super::view::{
    AfterFailure, AttemptStage, Readiness, Snapshot, after_failure, interpret_outcome,
    prompt_readiness, stop_reason_succeeded,
};
use super::watch::SessionWatch;
use super::write_stdout;
use crate::acp::{AcpError, AcpTimeouts, PodConnection, SessionUpdateEvent};
use crate::api::names::CONTAINER;
use crate::resume::{RestoreFailure, pod_liveness};

/// How long `initialize` (answered by agentctl from its cache) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `_kandev/disconnect` may take to end `agentctl connect`.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// After a failure: how long to watch the pod before deciding whether it vanished.
const LOSS_GRACE_AFTER_PROMPT: Duration = Duration::from_secs(10);
const LOSS_GRACE_AFTER_CONNECT: Duration = Duration::from_secs(3);
/// Resume requests one `prompt` may make while getting the session ready.
const MAX_REQUESTS: usize = 2;

/// A session ready for a prompt: its running pod and the agent's ACP session id.
struct Ready {
    pod: String,
    pod_uid: Option<String>,
    session_id: String,
}

/// How one attempt ended.
enum Attempt {
    Done { stop_reason: String },
    Failed(Failure),
    Interrupted,
}

struct Failure {
    stage: AttemptStage,
    stream_lost: bool,
    reason: String,
}

pub async fn prompt(
    cluster: &Cluster,
    name: &str,
    text: &str,
    timeout: Duration,
) -> Result<ExitCode, PluginError> {
    let mut retried = false;
    let mut printer = Printer::default();
    loop {
        let ready = ensure_ready(cluster, name, Deadline::after(timeout)).await?;
        let failure = match attempt(cluster, name, &ready, text, &mut printer).await {
            Attempt::Done { stop_reason } => {
                printer.finish();
                eprintln!("[stop reason: {stop_reason}]");
                return if stop_reason_succeeded(&stop_reason) {
                    Ok(ExitCode::Ok)
                } else {
                    Err(PluginError::PromptFailed {
                        name: name.to_string(),
                        reason: format!("the turn ended with stop reason {stop_reason}"),
                    })
                };
            }
            Attempt::Interrupted => {
                printer.finish();
                return Err(PluginError::Interrupted(format!(
                    "disconnected from the agent, which keeps working; see its answer later with: kubectl kandev history {name} -n {}",
                    cluster.namespace
                )));
            }
            Attempt::Failed(failure) => failure,
        };
        printer.finish();
        let grace = match failure.stage {
            AttemptStage::Connect => LOSS_GRACE_AFTER_CONNECT,
            AttemptStage::Prompt => LOSS_GRACE_AFTER_PROMPT,
        };
        let pod_lost = pod_lost_within(cluster, name, &ready, grace).await?;
        match after_failure(failure.stage, failure.stream_lost, pod_lost, retried) {
            AfterFailure::ResumeAndRetry => eprintln!(
                "kubectl-kandev: the agent's pod {} vanished ({}); resuming the session and sending the prompt once more",
                ready.pod, failure.reason
            ),
            AfterFailure::RetrySamePod => {
                eprintln!(
                    "kubectl-kandev: could not reach the agent in pod {} ({}); trying once more",
                    ready.pod, failure.reason
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            AfterFailure::GiveUp => {
                let reason = match (failure.stage, failure.stream_lost, pod_lost) {
                    (AttemptStage::Prompt, true, false) => format!(
                        "the connection to pod {} broke while the agent was answering ({}); the agent keeps working on the prompt (not sent twice): see kubectl kandev history {name} -n {}",
                        ready.pod, failure.reason, cluster.namespace
                    ),
                    _ if retried => format!("{} (after one retry)", failure.reason),
                    _ => failure.reason,
                };
                return Err(PluginError::PromptFailed {
                    name: name.to_string(),
                    reason,
                });
            }
        }
        retried = true;
    }
}

/// Waits until the session waits for input with a running pod, requesting a resume when its
/// agent is gone (DESIGN §4: resume and wait for WAITING_FOR_INPUT).
async fn ensure_ready(
    cluster: &Cluster,
    name: &str,
    deadline: Deadline,
) -> Result<Ready, PluginError> {
    let mut requests: Vec<String> = Vec::new();
    let mut reported: Option<String> = None;
    let mut snapshot = cluster.snapshot(name).await?;
    let mut watch = SessionWatch::start(cluster, &snapshot);
    loop {
        let waiting_for: String;
        let status = snapshot.status();
        // Our latest request is handled: a failure ends here.
        if let Some(token) = requests.last()
            && status.last_handled_resume_request.as_deref() == Some(token.as_str())
            && reported.as_deref() != Some(token.as_str())
        {
            let outcome = interpret_outcome(&status, token);
            if !outcome.kind.succeeded() {
                return Err(PluginError::ResumeFailed {
                    name: name.to_string(),
                    verdict: format!("failed ({}): {}", outcome.reason, outcome.message),
                });
            }
            eprintln!(
                "kubectl-kandev: tasksession {name:?} resumed ({}){}",
                outcome.kind.as_str(),
                if outcome.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", outcome.message)
                }
            );
            reported = Some(token.clone());
        }
        match prompt_readiness(&status, &snapshot.evaluation(), snapshot.liveness()) {
            Readiness::Ready => {
                if let Some(ready) = ready_target(&snapshot) {
                    return Ok(ready);
                }
                waiting_for = "the agent's ACP session id (resume token)".into();
            }
            Readiness::Refuse(why) => {
                return Err(PluginError::NotResumable {
                    name: name.to_string(),
                    namespace: cluster.namespace.clone(),
                    why,
                });
            }
            Readiness::Wait(what) => waiting_for = what,
            Readiness::NeedsResume => {
                let pending = requests.last().is_some_and(|t| {
                    status.last_handled_resume_request.as_deref() != Some(t.as_str())
                });
                if pending {
                    waiting_for = format!(
                        "the operator to handle resume request {:?}",
                        requests.last().map(String::as_str).unwrap_or_default()
                    );
                } else if requests.len() >= MAX_REQUESTS {
                    return Err(PluginError::ResumeFailed {
                        name: name.to_string(),
                        verdict: format!(
                            "did not bring the agent back after {MAX_REQUESTS} requests ({})",
                            snapshot.last_seen()
                        ),
                    });
                } else {
                    let reason = snapshot.evaluation().reason;
                    let token = cluster.request_resume(&snapshot, false).await?;
                    eprintln!(
                        "kubectl-kandev: tasksession {name:?} needs a resume ({reason}); requested it (request {token}); waiting up to {}",
                        super::format_duration(deadline.total)
                    );
                    waiting_for = format!("the operator to handle resume request {token:?}");
                    requests.push(token);
                }
            }
        }
        let timeout = || PluginError::Timeout {
            what: format!("tasksession {name:?} to be ready for a prompt ({waiting_for})"),
            waited: deadline.total,
            last_seen: snapshot.last_seen(),
        };
        if deadline.passed() {
            return Err(timeout());
        }
        // Once a prompt attempt listened for Ctrl-C, SIGINT no longer ends the process: listen
        // here too.
        let next = tokio::select! {
            next = watch.changed() => next?,
            () = tokio::time::sleep_until(deadline.at) => return Err(timeout()),
            _ = tokio::signal::ctrl_c() => {
                return Err(PluginError::Interrupted(format!(
                    "stopped waiting for tasksession {name:?}; a requested resume still goes ahead"
                )));
            }
        };
        snapshot = next;
    }
}

fn ready_target(snapshot: &Snapshot) -> Option<Ready> {
    let pod = snapshot.running_pod()?;
    Some(Ready {
        pod: pod.metadata.name.clone()?,
        pod_uid: pod.metadata.uid.clone(),
        session_id: snapshot.resume_token()?.to_string(),
    })
}

/// One connection: `initialize` (agentctl answers from its cache), `session/prompt` on the
/// agent's saved session, the turn's answer streamed, then `_kandev/disconnect`.
/// How long after sending the prompt the operator is told about it (the agent has started the
/// turn by then, so the operator finds it working and follows it).
const NOTE_AFTER: Duration = Duration::from_millis(300);

async fn attempt(
    cluster: &Cluster,
    name: &str,
    ready: &Ready,
    text: &str,
    printer: &mut Printer,
) -> Attempt {
    let mut connection =
        match PodConnection::open(&cluster.exec_pods(), &ready.pod, CONTAINER).await {
            Ok(connection) => connection,
            Err(error) => {
                return Attempt::Failed(Failure {
                    stage: AttemptStage::Connect,
                    stream_lost: true,
                    reason: error.to_string(),
                });
            }
        };
    connection.client.set_timeouts(AcpTimeouts {
        initialize: CONNECT_TIMEOUT,
        session: CONNECT_TIMEOUT,
        prompt: None,
    });
    if let Err(error) = connection.client.initialize().await {
        connection.close(CLOSE_GRACE).await;
        return Attempt::Failed(Failure {
            stage: AttemptStage::Connect,
            stream_lost: stream_lost(&error),
            reason: format!("agentctl connect: {error}"),
        });
    }
    let mut updates = connection.client.subscribe_updates();
    let mut noted = false;
    let result = {
        let prompt = connection.client.prompt(&ready.session_id, text);
        tokio::pin!(prompt);
        let note = tokio::time::sleep(NOTE_AFTER);
        tokio::pin!(note);
        loop {
            tokio::select! {
                result = &mut prompt => break Some(result),
                Some(event) = updates.recv() => printer.update(&event, &ready.session_id),
                () = &mut note, if !noted => {
                    noted = true;
                    cluster.note_prompt(name).await;
                }
                _ = tokio::signal::ctrl_c() => break None,
            }
        }
    };
    if !noted {
        cluster.note_prompt(name).await;
    }
    // Updates published before the answer are queued already.
    while let Ok(event) = updates.try_recv() {
        printer.update(&event, &ready.session_id);
    }
    drop(updates);
    connection.close(CLOSE_GRACE).await;
    match result {
        None => Attempt::Interrupted,
        Some(Ok(stop_reason)) => Attempt::Done {
            stop_reason: serde_json::to_value(stop_reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{stop_reason:?}")),
        },
        Some(Err(error)) => Attempt::Failed(Failure {
            stage: AttemptStage::Prompt,
            stream_lost: stream_lost(&error),
            reason: error.to_string(),
        }),
    }
}

/// Anything but an answer from the agent means the stream (exec, agentctl) is gone.
fn stream_lost(error: &AcpError) -> bool {
    !matches!(error.failure(), Some(RestoreFailure::JsonRpc { .. }))
}

/// Watches the pod used by the failed attempt for up to `grace`: lost when it is gone,
/// terminating or dead.
async fn pod_lost_within(
    cluster: &Cluster,
    name: &str,
    ready: &Ready,
    grace: Duration,
) -> Result<bool, PluginError> {
    let until = Instant::now() + grace;
    let mut snapshot = cluster.snapshot(name).await?;
    let mut watch = SessionWatch::start(cluster, &snapshot);
    loop {
        let pod = snapshot.pods.iter().find(|p| {
            p.metadata.name.as_deref() == Some(ready.pod.as_str())
                && (ready.pod_uid.is_none() || p.metadata.uid == ready.pod_uid)
        });
        if pod_liveness(pod).is_lost() {
            return Ok(true);
        }
        tokio::select! {
            next = watch.changed() => snapshot = next?,
            () = tokio::time::sleep_until(until) => return Ok(false),
        }
    }
}

/// Streams the agent's message chunks to stdout as they arrive; tool calls go to stderr.
#[derive(Default)]
struct Printer {
    /// Something was printed since the last [`Self::finish`] and it did not end a line.
    open_line: bool,
}

impl Printer {
    fn update(&mut self, event: &SessionUpdateEvent, session_id: &str) {
        if event.session_id != session_id {
            return;
        }
        match event.kind.as_str() {
            "agent_message_chunk" => {
                if let Some(text) = event.text().filter(|t| !t.is_empty()) {
                    // A closed stdout (`| head`) is not a reason to abandon the turn.
                    let _ = write_stdout(text);
                    self.open_line = !text.ends_with('\n');
                }
            }
            "tool_call" => {
                let title = event
                    .params
                    .pointer("/update/title")
                    .and_then(|t| t.as_str())
                    .unwrap_or("tool");
                self.finish();
                let _ = writeln!(std::io::stderr(), "[tool call: {title}]");
            }
            _ => {}
        }
    }

    /// Ends an open line, so what follows (stderr notes, the shell prompt) starts clean.
    fn finish(&mut self) {
        if self.open_line {
            let _ = write_stdout("\n");
            self.open_line = false;
        }
    }
}
