//! `kubectl kandev prompt`: make sure the agent runs, then speak ACP to it through
//! `kubectl exec <pod> -- agentctl connect` and stream its answer.
//!
//! Two halves: first the pure rules — when a prompt may be sent ([`prompt_readiness`]), what to
//! do after a failed attempt ([`after_failure`]), whether the agent received a prompt
//! ([`prompt_received`]), which stop reasons succeed ([`stop_reason_succeeded`]), table-tested
//! at the end of the file — then the command, which talks to the cluster and the agent.
//!
//! A prompt is delivered at most once. Each carries an id of this command's
//! ([`crate::acp::PROMPT_ID_META`]), which agentctl journals with `prompt_started` on the
//! workspace volume before the agent gets the prompt. After a pod lost mid-turn, the session is
//! resumed and the new pod's journal read: only a prompt whose id is not there is sent again.
//!
//! On a terminal, the agent's permission requests during the turn are asked there (`ask.rs`:
//! `agentctl connect --permissions`); otherwise the session's policy decides them, and `prompt`
//! says once where the held ones are answered.

use std::time::Duration;

use tokio::time::Instant;

use super::ask::{AgentLink, Asker, next_ask, policy_hint};
use super::cluster::{Cluster, Deadline, RequestKind, new_token};
use super::error::{ExitCode, PluginError};
use super::history::{ReadError, exec_read};
use super::output::OutputFormat;
use super::resume::{ResumePlan, interpret_outcome, plan_resume};
use super::status::{Snapshot, liveness_name};
use super::watch::{Progress, SessionWatch};
use super::write_stdout;
use crate::acp::{AcpError, AcpTimeouts, SessionUpdateEvent};
use crate::api::pod_contract::CONTAINER;
use crate::api::pod_contract::events::{Event, EventLine};
use crate::api::{ResumeReason, SessionState, TaskSessionStatus};
use crate::jsonrpc::CallFailure;
use crate::resume::{PodLiveness, ResumeEvaluation, pod_liveness};

// ------------------------------------------------------------------------------------------
// the rules (pure)

/// Where `prompt` stands before it can send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// WAITING_FOR_INPUT with a running pod: send now.
    Ready,
    /// The agent is gone: request a resume (once).
    NeedsResume,
    /// Something is under way (a resume, a launch, a turn); poll again. The text says what.
    Wait(String),
    /// Never going to work (terminal, not resumable); the text says why.
    Refuse(String),
}

/// The rules of `prompt`: it sends only to an agent that waits for input (DESIGN §4: resume and
/// wait for `WAITING_FOR_INPUT`).
pub fn prompt_readiness(
    status: &TaskSessionStatus,
    eval: &ResumeEvaluation,
    pod: PodLiveness,
) -> Readiness {
    match plan_resume(status, eval, pod, false) {
        ResumePlan::Refuse(why) => Readiness::Refuse(why),
        ResumePlan::AwaitActive(token) => {
            Readiness::Wait(format!("the operator to finish resume request {token:?}"))
        }
        ResumePlan::Request => Readiness::NeedsResume,
        ResumePlan::AlreadyRunning if status.state == SessionState::WaitingForInput => {
            Readiness::Ready
        }
        ResumePlan::AlreadyRunning => Readiness::Wait(format!(
            "the agent to wait for input (state {})",
            status.state
        )),
        ResumePlan::Starting => Readiness::Wait(format!(
            "the agent to start (state {}, pod {})",
            status.state,
            liveness_name(pod)
        )),
    }
}

/// Where a prompt attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptStage {
    /// Opening the exec or `initialize`: nothing reached the agent's session yet.
    Connect,
    /// After `session/prompt` was sent.
    Prompt,
}

/// What to do after a failed prompt attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// The executor vanished before anything was sent: request a resume, wait for the agent,
    /// send again.
    ResumeAndRetry,
    /// The executor vanished after the prompt was sent: request a resume, wait for the agent,
    /// and send again only if the journal proves that the agent never received it.
    ResumeAndCheck,
    /// The pod still runs and nothing was sent: connect again.
    RetrySamePod,
    /// Stop and report.
    GiveUp,
}

/// DESIGN §4 "retries once if the executor vanished": one retry per command, and a prompt is
/// never sent twice. A prompt already sent to a still-running agent is not sent again (the agent
/// keeps working on it and the answer lands in the history); one sent to an agent whose pod
/// vanished is sent again only once the journal shows it never arrived; an error answer from the
/// agent is final.
pub fn after_failure(
    stage: AttemptStage,
    stream_lost: bool,
    pod_lost: bool,
    retried: bool,
) -> AfterFailure {
    if retried {
        return AfterFailure::GiveUp;
    }
    match (stage, stream_lost, pod_lost) {
        (AttemptStage::Connect, _, true) => AfterFailure::ResumeAndRetry,
        (AttemptStage::Prompt, _, true) => AfterFailure::ResumeAndCheck,
        (AttemptStage::Connect, _, false) => AfterFailure::RetrySamePod,
        (AttemptStage::Prompt, _, false) => AfterFailure::GiveUp,
    }
}

/// Whether agentctl's journal (`agentctl events` lines) shows that prompt `id` reached the agent:
/// a `prompt_started` entry with that id. Lines that are not events are skipped.
pub fn prompt_received(journal: &str, id: &str) -> bool {
    journal
        .lines()
        .filter_map(|line| serde_json::from_str::<EventLine>(line).ok())
        .any(
            |line| matches!(line.event, Event::PromptStarted { prompt_id: Some(p), .. } if p == id),
        )
}

/// The exit code of a finished turn, from its ACP `stopReason`: the turn ran to its end
/// (`end_turn`, or a limit: `max_tokens`, `max_turn_requests`) → 0; the agent refused or the turn
/// was cancelled → 1.
pub fn stop_reason_succeeded(stop_reason: &str) -> bool {
    !matches!(stop_reason, "refusal" | "cancelled")
}

// ------------------------------------------------------------------------------------------
// the command

/// How long `initialize` (answered by agentctl from its cache) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `_kandev/disconnect` may take to end `agentctl connect`.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// After a failure: how long to watch the pod before deciding whether it vanished.
const LOSS_GRACE_AFTER_PROMPT: Duration = Duration::from_secs(10);
const LOSS_GRACE_AFTER_CONNECT: Duration = Duration::from_secs(3);
/// Resume requests one `prompt` may make while getting the session ready.
const MAX_REQUESTS: usize = 2;

/// A session ready for a prompt: its running pod, the agent's ACP session id, and the journal
/// cursor of its ExecutorRunning (entries after it are newer than this readiness).
struct Ready {
    pod: String,
    pod_uid: Option<String>,
    session_id: String,
    cursor: u64,
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

/// `kubectl kandev prompt`. `asks`: the agent's permission requests are asked here (a
/// terminal), not left to the session's policy.
pub async fn prompt(
    cluster: &Cluster,
    name: &str,
    text: &str,
    timeout: Duration,
    asks: bool,
) -> Result<ExitCode, PluginError> {
    // Said once, when the prompt is about to go: without a terminal nobody is asked.
    let mut hint = !asks;
    let prompt_id = new_token();
    let mut retried = false;
    // The pod a sent prompt was lost with, and the journal cursor before it was sent.
    let mut lost_with: Option<(String, u64)> = None;
    let mut printer = Printer::default();
    loop {
        let ready = ensure_ready(cluster, name, Deadline::after(timeout)).await?;
        if let Some((pod, cursor)) = lost_with.take() {
            never_received(cluster, name, &ready.pod, &prompt_id, (pod, cursor)).await?;
        }
        if std::mem::take(&mut hint) {
            say!("{}", policy_hint(name, &cluster.namespace));
        }
        let attempted = attempt(cluster, name, &ready, text, &prompt_id, asks, &mut printer).await;
        printer.finish();
        let failure = match attempted {
            Attempt::Done { stop_reason } => return turn_done(name, &stop_reason),
            Attempt::Interrupted => {
                return Err(PluginError::Interrupted(format!(
                    "disconnected from the agent, which keeps working; see its answer later with: kubectl kandev history {name} -n {}",
                    cluster.namespace
                )));
            }
            Attempt::Failed(failure) => failure,
        };
        let grace = match failure.stage {
            AttemptStage::Connect => LOSS_GRACE_AFTER_CONNECT,
            AttemptStage::Prompt => LOSS_GRACE_AFTER_PROMPT,
        };
        let pod_lost = pod_lost_within(cluster, name, &ready, grace).await?;
        match after_failure(failure.stage, failure.stream_lost, pod_lost, retried) {
            AfterFailure::ResumeAndRetry => say!(
                "kubectl-kandev: the agent's pod {} vanished before the prompt was sent ({}); resuming the session and sending the prompt once more",
                ready.pod,
                failure.reason
            ),
            AfterFailure::ResumeAndCheck => {
                say!(
                    "kubectl-kandev: the agent's pod {} vanished after the prompt was sent ({}); resuming the session to read in agentctl's journal whether the agent received it",
                    ready.pod,
                    failure.reason
                );
                lost_with = Some((ready.pod.clone(), ready.cursor));
            }
            AfterFailure::RetrySamePod => {
                say!(
                    "kubectl-kandev: could not reach the agent in pod {} ({}); trying once more",
                    ready.pod,
                    failure.reason
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

/// A prompt sent into a pod that was then lost is sent again only when agentctl's journal in
/// the new pod (`ready_pod`, on the same workspace) proves that the agent never received it
/// (no `prompt_started` with its id after `cursor`).
async fn never_received(
    cluster: &Cluster,
    name: &str,
    ready_pod: &str,
    prompt_id: &str,
    (lost_pod, cursor): (String, u64),
) -> Result<(), PluginError> {
    let what = match delivery(cluster, ready_pod, prompt_id, cursor).await {
        Ok(false) => {
            say!(
                "kubectl-kandev: agentctl's journal shows that the prompt never reached the agent in pod {lost_pod}; sending it once more"
            );
            return Ok(());
        }
        Ok(true) => format!(
            "agentctl's journal shows that the agent received the prompt (prompt_started, id {prompt_id})"
        ),
        Err(reason) => {
            format!("whether the agent received the prompt cannot be told ({reason})")
        }
    };
    Err(PluginError::NotResent {
        name: name.to_string(),
        namespace: cluster.namespace.clone(),
        pod: lost_pod,
        what,
    })
}

/// The exit of a turn that ended with `stop_reason`.
fn turn_done(name: &str, stop_reason: &str) -> Result<ExitCode, PluginError> {
    say!("[stop reason: {stop_reason}]");
    if stop_reason_succeeded(stop_reason) {
        Ok(ExitCode::Ok)
    } else {
        Err(PluginError::PromptFailed {
            name: name.to_string(),
            reason: format!("the turn ended with stop reason {stop_reason}"),
        })
    }
}

/// Waits until the session waits for input with a running pod, requesting a resume when its
/// agent is gone (DESIGN §4: resume and wait for WAITING_FOR_INPUT).
async fn ensure_ready(
    cluster: &Cluster,
    name: &str,
    deadline: Deadline,
) -> Result<Ready, PluginError> {
    let mut requests = Requests::default();
    let mut snapshot = cluster.snapshot(name).await?;
    let mut watch = SessionWatch::start(cluster, &snapshot);
    // A prompt prints text.
    let mut progress = Progress::for_output(&OutputFormat::Text);
    loop {
        let status = snapshot.status();
        requests.report_handled(name, &status)?;
        let waiting_for =
            match prompt_readiness(&status, &snapshot.evaluation(), snapshot.liveness()) {
                Readiness::Ready => match ready_target(&snapshot) {
                    Some(ready) => return Ok(ready),
                    None => "the agent's ACP session id (resume token)".to_string(),
                },
                Readiness::Refuse(why) => {
                    return Err(PluginError::NotResumable {
                        name: name.to_string(),
                        namespace: cluster.namespace.clone(),
                        why,
                    });
                }
                Readiness::Wait(what) => what,
                Readiness::NeedsResume => requests.resume(cluster, &snapshot, deadline).await?,
            };
        let timeout = || PluginError::Timeout {
            what: format!("tasksession {name:?} to be ready for a prompt ({waiting_for})"),
            waited: deadline.total,
            last_seen: snapshot.last_seen(),
        };
        if deadline.passed() {
            return Err(timeout());
        }
        // While a resume it requested goes on, where the session stands.
        let resuming = !requests.made.is_empty();
        if resuming {
            progress.at(&snapshot);
        }
        // Once a prompt attempt listened for Ctrl-C, SIGINT no longer ends the process: listen
        // here too.
        let next = tokio::select! {
            next = watch.changed() => next?,
            () = tokio::time::sleep_until(progress.next_due()), if resuming => {
                match watch.current() {
                    Some(current) => current?,
                    None => snapshot.clone(),
                }
            }
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

/// The resume requests one `prompt` made while getting the session ready.
#[derive(Default)]
struct Requests {
    made: Vec<String>,
    /// The last one whose outcome was printed.
    reported: Option<String>,
}

impl Requests {
    /// Once the latest request is handled: a failure ends here, a success is said once.
    fn report_handled(
        &mut self,
        name: &str,
        status: &TaskSessionStatus,
    ) -> Result<(), PluginError> {
        let Some(token) = self.made.last() else {
            return Ok(());
        };
        if status.last_handled_resume_request.as_deref() != Some(token.as_str())
            || self.reported.as_deref() == Some(token.as_str())
        {
            return Ok(());
        }
        let outcome = interpret_outcome(status, token);
        if !outcome.kind.succeeded() {
            return Err(PluginError::ResumeFailed {
                name: name.to_string(),
                verdict: format!("failed ({}): {}", outcome.reason, outcome.message),
            });
        }
        let message = if outcome.message.is_empty() {
            String::new()
        } else {
            format!(": {}", outcome.message)
        };
        say!(
            "kubectl-kandev: tasksession {name:?} resumed ({}){message}",
            outcome.kind.as_str()
        );
        self.reported = Some(token.clone());
        Ok(())
    }

    /// The session needs a resume: requested once its previous request is handled, at most
    /// [`MAX_REQUESTS`] times. What the wait is for.
    async fn resume(
        &mut self,
        cluster: &Cluster,
        snapshot: &Snapshot,
        deadline: Deadline,
    ) -> Result<String, PluginError> {
        let status = snapshot.status();
        let name = snapshot.name();
        if let Some(pending) = self
            .made
            .last()
            .filter(|t| status.last_handled_resume_request.as_deref() != Some(t.as_str()))
        {
            return Ok(format!("the operator to handle resume request {pending:?}"));
        }
        if self.made.len() >= MAX_REQUESTS {
            return Err(PluginError::ResumeFailed {
                name,
                verdict: format!(
                    "did not bring the agent back after {MAX_REQUESTS} requests ({})",
                    snapshot.last_seen()
                ),
            });
        }
        // The operator's word for a suspended session; otherwise the rules'.
        let reason = status
            .resume_reason
            .filter(|r| *r == ResumeReason::Suspended)
            .unwrap_or(snapshot.evaluation().reason);
        let token = cluster
            .request_resume(snapshot, RequestKind::default())
            .await?;
        say!(
            "kubectl-kandev: tasksession {name:?} needs a resume ({reason}); requested it (request {token}); waiting up to {}",
            super::format_duration(deadline.total)
        );
        let waiting_for = format!("the operator to handle resume request {token:?}");
        self.made.push(token);
        Ok(waiting_for)
    }
}

fn ready_target(snapshot: &Snapshot) -> Option<Ready> {
    let pod = snapshot.running_pod()?;
    Some(Ready {
        pod: pod.metadata.name.clone()?,
        pod_uid: pod.metadata.uid.clone(),
        session_id: snapshot.resume_token()?.to_string(),
        cursor: snapshot.executor_status().journal_cursor.unwrap_or(0),
    })
}

/// How long reading the journal may take.
const JOURNAL_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether prompt `id` reached the agent, from agentctl's journal (on the workspace volume,
/// read through `pod`) after `cursor`; `Err` says why that cannot be told.
async fn delivery(
    cluster: &Cluster,
    pod: &str,
    id: &str,
    cursor: u64,
) -> Result<bool, DeliveryError> {
    let since = cursor.to_string();
    let command = ["agentctl", "events", "--since", since.as_str(), "--once"];
    let read = tokio::time::timeout(JOURNAL_READ_TIMEOUT, exec_read(cluster, pod, &command));
    let pod = pod.to_string();
    match read.await {
        Ok(Ok((stdout, _, true, _))) => Ok(prompt_received(&String::from_utf8_lossy(&stdout), id)),
        Ok(Ok((_, stderr, false, code))) => Err(DeliveryError::Failed {
            pod,
            code: code.map_or("?".to_string(), |c| c.to_string()),
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        }),
        Ok(Err(ReadError::Kube(source))) => Err(DeliveryError::Exec { pod, source }),
        Ok(Err(ReadError::Io(source))) => Err(DeliveryError::Read { pod, source }),
        Err(_) => Err(DeliveryError::Timeout { pod }),
    }
}

/// Why agentctl's journal could not tell whether a prompt was received.
#[derive(Debug, thiserror::Error)]
enum DeliveryError {
    #[error("agentctl events in pod {pod} failed (exit {code}): {stderr}")]
    Failed {
        pod: String,
        code: String,
        stderr: String,
    },
    #[error("exec into pod {pod}: {source}")]
    Exec { pod: String, source: kube::Error },
    #[error("reading agentctl events in pod {pod}: {source}")]
    Read { pod: String, source: std::io::Error },
    #[error("agentctl events in pod {pod} did not finish within {JOURNAL_READ_TIMEOUT:?}")]
    Timeout { pod: String },
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
    prompt_id: &str,
    asks: bool,
    printer: &mut Printer,
) -> Attempt {
    let mut connection =
        match AgentLink::open(&cluster.exec_pods(), &ready.pod, CONTAINER, asks).await {
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
    connection.client.set_prompt_id(prompt_id);
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
    // The agent's permission requests, when this terminal answers them.
    let mut requests = connection.asks.take();
    let answers = connection.answers.clone();
    let mut asker = Asker::default();
    let result = {
        let prompt = connection.client.prompt(&ready.session_id, text);
        tokio::pin!(prompt);
        let note = tokio::time::sleep(NOTE_AFTER);
        tokio::pin!(note);
        loop {
            tokio::select! {
                result = &mut prompt => break Some(result),
                Some(event) = updates.recv() => printer.update(&event, &ready.session_id),
                Some(ask) = next_ask(&mut requests) => {
                    printer.finish();
                    asker.push(ask);
                }
                input = asker.reply(), if asker.is_asking() => {
                    if let (Some(line), Some(answers)) = (asker.answered(input), &answers) {
                        // A closed pump means the connection is going; the prompt says how.
                        let _ = answers.send(line).await;
                    }
                }
                () = &mut note, if !noted => {
                    noted = true;
                    cluster.note_prompt(name).await;
                }
                _ = tokio::signal::ctrl_c() => break None,
            }
        }
    };
    asker.abandon();
    // The pump must not wait on a request nobody will read while the connection closes.
    drop(requests);
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
    !matches!(error.failure(), Some(CallFailure::JsonRpc { .. }))
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
                say!("[tool call: {title}]");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ResumeReason as R;
    use crate::plugin::test_support::{eval, st};
    use PodLiveness as P;
    use SessionState as S;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn prompt_readiness_rules() {
        let running = eval(false, false, R::AlreadyRunning);
        let lost = eval(true, true, R::AgentNotRunning);
        let fresh_start = eval(true, true, R::AgentNotRunningFreshStart);
        let terminal = eval(false, false, R::TerminalState);
        let ready = prompt_readiness(&st(S::WaitingForInput, None), &running, P::Running);
        assert_eq!(ready, Readiness::Ready);
        for (status, eval, pod) in [
            (st(S::WaitingForInput, None), lost, P::Missing),
            (st(S::Running, None), lost, P::Terminating),
            (st(S::WaitingForInput, None), fresh_start, P::Failed),
        ] {
            assert_eq!(
                prompt_readiness(&status, &eval, pod),
                Readiness::NeedsResume
            );
        }
        for (status, eval, pod, says) in [
            (st(S::Running, None), running, P::Running, "state RUNNING"),
            (
                st(S::Starting, None),
                running,
                P::Pending,
                "state STARTING, pod Pending",
            ),
            (
                st(S::Created, None),
                eval(false, false, R::NoExecutor),
                P::Missing,
                "state CREATED",
            ),
            (st(S::Starting, Some("t9")), lost, P::Missing, "\"t9\""),
        ] {
            match prompt_readiness(&status, &eval, pod) {
                Readiness::Wait(what) => assert!(what.contains(says), "{what}"),
                other => panic!("{status:?}: {other:?}"),
            }
        }
        assert!(matches!(
            prompt_readiness(&st(S::Cancelled, None), &terminal, P::Missing),
            Readiness::Refuse(_)
        ));
    }

    #[test]
    fn failure_handling_retries_once() {
        use AfterFailure::*;
        use AttemptStage::*;
        #[rustfmt::skip]
        let rows = [
            // (stage, stream lost, pod lost, retried) → next
            // Lost before anything was sent: resume and send.
            (Connect, true, true, false, ResumeAndRetry),
            // Lost after the prompt was sent: resume, then send only if it never arrived.
            (Prompt, true, true, false, ResumeAndCheck),
            (Prompt, false, true, false, ResumeAndCheck),
            (Connect, true, false, false, RetrySamePod),
            (Connect, false, false, false, RetrySamePod),
            // Delivered to a live agent: never sent twice.
            (Prompt, true, false, false, GiveUp),
            // The agent answered with an error.
            (Prompt, false, false, false, GiveUp),
            // Only one retry.
            (Prompt, true, true, true, GiveUp),
            (Connect, true, false, true, GiveUp),
        ];
        for (stage, stream, pod, retried, expected) in rows {
            assert_eq!(
                after_failure(stage, stream, pod, retried),
                expected,
                "{stage:?} stream_lost={stream} pod_lost={pod} retried={retried}"
            );
        }
    }

    #[test]
    fn a_prompt_counts_as_received_only_with_its_own_journal_entry() {
        let started = |id: Option<&str>| {
            let mut line = json!({"event": "prompt_started", "sessionId": "s1", "seq": 7,
                "launch": "l1", "pod": "p", "timestamp": "T"});
            if let Some(id) = id {
                line["promptId"] = json!(id);
            }
            line.to_string()
        };
        let snapshot = r#"{"event":"snapshot","sessionId":"s1","promptActive":false,"seq":9}"#;
        #[rustfmt::skip]
        let rows: &[(Vec<String>, bool)] = &[
            (vec![started(Some("kandev-1-a")), snapshot.into()], true),
            (vec!["not json".into(), started(Some("kandev-1-a"))], true),
            // Another prompt's, an id-less client's, or none at all.
            (vec![started(Some("kandev-1-b")), snapshot.into()], false),
            (vec![started(None)], false),
            (vec![snapshot.into()], false),
            (vec![], false),
        ];
        for (lines, received) in rows {
            let journal = lines.join("\n");
            assert_eq!(
                prompt_received(&journal, "kandev-1-a"),
                *received,
                "{journal}"
            );
        }
    }

    #[test]
    fn stop_reasons() {
        for (reason, ok) in [
            ("end_turn", true),
            ("max_tokens", true),
            ("max_turn_requests", true),
            ("refusal", false),
            ("cancelled", false),
        ] {
            assert_eq!(stop_reason_succeeded(reason), ok, "{reason}");
        }
    }
}
