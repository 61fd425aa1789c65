//! Pure parts of the plugin: what one read of the cluster says about a session (evaluated with
//! the same rules as the operator), how it is shown, what a resume request should do, and what
//! a handled request's outcome means. Nothing here touches the cluster.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;

use crate::api::conditions::{self, READY, RECONCILING, RESUMED};
use crate::api::{ResumeReason, SessionState, TaskSessionStatus, TaskState};
use crate::resume::{PodLiveness, ResumeEvaluation, SessionObjects, launch_stall, pod_liveness};

/// Everything the plugin read about one session at one moment: the operator's own loaded-objects
/// type, evaluated by the same functions.
pub type Snapshot = SessionObjects;

impl SessionObjects {
    /// One line for timeout messages: where the session stood when we gave up.
    pub fn last_seen(&self) -> String {
        let status = self.status();
        let mut out = format!(
            "state {}, pod {}",
            status.state,
            liveness_name(self.liveness())
        );
        match (
            &status.active_resume_request,
            &status.last_handled_resume_request,
        ) {
            (Some(active), _) => out.push_str(&format!(", resume request {active:?} in progress")),
            (None, Some(handled)) => {
                out.push_str(&format!(", last handled resume request {handled:?}"))
            }
            (None, None) => {}
        }
        if let Some(reason) = conditions::find(&status.conditions, RECONCILING)
            .filter(|c| c.status == "True")
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty())
        {
            out.push_str(&format!(" ({reason})"));
        }
        if let Some(error) = status.error_message.filter(|e| !e.is_empty()) {
            out.push_str(&format!("; error: {error}"));
        }
        out
    }
}

/// `Running`, `Pending`, `Missing`, `Terminating`, `Failed`.
pub fn liveness_name(liveness: PodLiveness) -> &'static str {
    match liveness {
        PodLiveness::Running => "Running",
        PodLiveness::Pending => "Pending",
        PodLiveness::Missing => "Missing",
        PodLiveness::Terminating => "Terminating",
        PodLiveness::Failed => "Failed",
    }
}

// ------------------------------------------------------------------------------------------
// status

/// `kubectl kandev status`: the evaluated status, also the `-o json` document.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    pub name: String,
    pub namespace: String,
    pub agent: String,
    pub state: SessionState,
    pub task_state: TaskState,
    /// Evaluated now against the live pod (DESIGN §3 status evaluation).
    pub needs_resume: bool,
    pub resumable: bool,
    pub reason: ResumeReason,
    pub token_present: bool,
    pub resume_token: Option<String>,
    pub pod: PodView,
    pub last_resume: LastResumeView,
    pub error_message: Option<String>,
    /// What the operator last wrote into status, for comparison (it may lag behind the pod).
    pub recorded: RecordedView,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    /// The current pod's name, else the name ExecutorRunning last recorded.
    pub name: Option<String>,
    /// `Running`, `Pending`, `Missing`, `Terminating` or `Failed`.
    pub liveness: &'static str,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastResumeView {
    /// `status.lastHandledResumeRequest`.
    pub handled_request: Option<String>,
    /// `status.activeResumeRequest`: a request the operator is handling now.
    pub in_progress_request: Option<String>,
    /// The `Resumed` condition.
    pub condition: Option<ConditionView>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedView {
    pub needs_resume: bool,
    pub is_resumable: bool,
    pub resume_reason: Option<ResumeReason>,
}

impl StatusView {
    pub fn new(snapshot: &Snapshot) -> Self {
        let status = snapshot.status();
        let eval = snapshot.evaluation();
        let token = snapshot.resume_token().map(String::from);
        let pod_name = snapshot
            .current_pod()
            .and_then(|p| p.metadata.name.clone())
            .or_else(|| snapshot.executor_status().pod_name);
        StatusView {
            name: snapshot.name(),
            namespace: snapshot.namespace.clone(),
            agent: snapshot.session.spec.agent.clone(),
            state: status.state,
            task_state: status.task_state,
            needs_resume: eval.needs_resume,
            resumable: eval.is_resumable,
            reason: eval.reason,
            token_present: token.is_some(),
            resume_token: token,
            pod: PodView {
                name: pod_name,
                liveness: liveness_name(snapshot.liveness()),
            },
            last_resume: LastResumeView {
                handled_request: status.last_handled_resume_request.clone(),
                in_progress_request: status.active_resume_request.clone(),
                condition: conditions::find(&status.conditions, RESUMED).map(|c| ConditionView {
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_transition_time: c.last_transition_time.0.to_string(),
                }),
            },
            error_message: status.error_message.clone().filter(|e| !e.is_empty()),
            recorded: RecordedView {
                needs_resume: status.needs_resume,
                is_resumable: status.is_resumable,
                resume_reason: status.resume_reason,
            },
        }
    }

    /// The readable table of `kubectl kandev status`.
    pub fn table(&self) -> String {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let mut rows: Vec<(&str, String)> = vec![
            ("Session", self.name.clone()),
            ("Namespace", self.namespace.clone()),
            ("Agent", self.agent.clone()),
            ("State", self.state.to_string()),
            ("Task state", self.task_state.as_str().to_string()),
            ("Needs resume", yes_no(self.needs_resume).to_string()),
            ("Resumable", yes_no(self.resumable).to_string()),
            ("Reason", self.reason.to_string()),
            (
                "Resume token",
                match &self.resume_token {
                    Some(token) => format!("present ({token})"),
                    None => "none".to_string(),
                },
            ),
            (
                "Pod",
                match &self.pod.name {
                    Some(name) => format!("{name} ({})", self.pod.liveness),
                    None => format!("none ({})", self.pod.liveness),
                },
            ),
            ("Last resume", self.last_resume.describe()),
        ];
        if let Some(error) = &self.error_message {
            rows.push(("Error", error.clone()));
        }
        if self.recorded.needs_resume != self.needs_resume {
            rows.push((
                "Operator",
                format!(
                    "has not caught up yet (its status says needsResume={})",
                    self.recorded.needs_resume
                ),
            ));
        }
        if let Some(next) = self.next_step() {
            rows.push(("Next", next));
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
        let mut out = String::new();
        for (key, value) in rows {
            let label = format!("{key}:");
            out.push_str(&format!("{label:<width$}{value}\n", width = width + 1));
        }
        out
    }

    /// A command that moves the session on, when there is an obvious one.
    pub fn next_step(&self) -> Option<String> {
        let target = format!("{} -n {}", self.name, self.namespace);
        if self.last_resume.in_progress_request.is_some() {
            Some(format!(
                "a resume is in progress; follow it with: kubectl kandev status {target}"
            ))
        } else if self.needs_resume || self.resumable {
            Some(format!("kubectl kandev resume {target} --wait"))
        } else if self.state == SessionState::WaitingForInput && self.pod.liveness == "Running" {
            Some(format!("kubectl kandev prompt {target} \"<text>\""))
        } else {
            None
        }
    }
}

impl LastResumeView {
    /// `r1 (handled): True Restored: restored ACP session … with session/resume`.
    pub fn describe(&self) -> String {
        let condition = self.condition.as_ref().map(|c| {
            let mut text = format!("Resumed={} {}", c.status, c.reason);
            if !c.message.is_empty() {
                text.push_str(&format!(": {}", c.message));
            }
            text
        });
        match (&self.in_progress_request, &self.handled_request, condition) {
            (Some(active), _, _) => format!("request {active} in progress"),
            (None, Some(handled), Some(condition)) => format!("request {handled}: {condition}"),
            (None, Some(handled), None) => format!("request {handled} handled"),
            (None, None, Some(condition)) => condition,
            (None, None, None) => "never requested".to_string(),
        }
    }
}

// ------------------------------------------------------------------------------------------
// resume

/// What `kubectl kandev resume` should do, decided before touching anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResumePlan {
    /// Set a new resume-request token.
    Request,
    /// The operator is already handling this request: wait for it instead of adding one.
    AwaitActive(String),
    /// The agent runs: nothing to resume.
    AlreadyRunning,
    /// The operator is launching the agent (CREATED, STARTING, a Pending pod): nothing to resume.
    Starting,
    /// A resume would be refused (terminal state); the text says why.
    Refuse(String),
}

/// The rules of `resume` (and of `prompt` before it sends): refuse what the operator refuses
/// (terminal and not resumable), never stack a second request on one in progress, request when
/// the evaluation says the session needs (or may get) a resume, when an active session lost its
/// pod, or when a fresh start is asked for; otherwise there is nothing to do.
pub fn plan_resume(
    status: &TaskSessionStatus,
    eval: &ResumeEvaluation,
    pod: PodLiveness,
    fresh: bool,
) -> ResumePlan {
    if let Some(active) = &status.active_resume_request {
        return ResumePlan::AwaitActive(active.clone());
    }
    if status.state.is_terminal() && !eval.is_resumable {
        return ResumePlan::Refuse(format!(
            "it is {} ({}); the operator refuses to resume terminal sessions",
            status.state, eval.reason
        ));
    }
    if fresh || eval.needs_resume || eval.is_resumable {
        return ResumePlan::Request;
    }
    if status.state.is_active() && pod.is_lost() {
        // Active with neither token nor executor (reason no_executor): the operator relaunches.
        return ResumePlan::Request;
    }
    if pod == PodLiveness::Running {
        ResumePlan::AlreadyRunning
    } else {
        ResumePlan::Starting
    }
}

/// Why the launch of resume request `token` cannot start, when its pod says so plainly (an
/// image that cannot be pulled, a missing Secret or key, an unschedulable pod, an unbound PVC):
/// `kubectl kandev resume --wait` reports it at once instead of waiting out its timeout.
pub fn stalling_launch(
    status: &TaskSessionStatus,
    token: &str,
    pod: Option<&Pod>,
) -> Option<String> {
    if status.active_resume_request.as_deref() != Some(token) {
        return None;
    }
    let pod = pod.filter(|p| pod_liveness(Some(p)) == PodLiveness::Pending)?;
    let stall = launch_stall(pod, Duration::ZERO, Duration::ZERO, None)?;
    let definite = matches!(
        stall.reason,
        "ImagePullBackOff" | "CreateContainerConfigError" | "Unschedulable" | "PVCNotBound"
    );
    // The pure rule words it for its deadline; the part after the first ": " is the pod's.
    let detail = stall
        .message
        .split_once(": ")
        .map_or(stall.message.as_str(), |(_, rest)| rest);
    definite.then(|| format!("{} (pod {}): {detail}", stall.reason, pod.name_any()))
}

/// How a handled resume request ended, read from the TaskSession status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandledAs {
    /// The saved ACP session was restored (same token).
    Restored,
    /// A fresh agent session was started (no token to restore, or `--fresh`).
    Started,
    /// The agent no longer knew the saved session: a fresh one was started, the context is lost.
    StartedFresh,
    /// The agent was running already; nothing was relaunched.
    AlreadyRunning,
    /// The operator refused the request (terminal session).
    Refused,
    /// The resume failed (restore error, launch failure).
    Failed,
    /// A newer resume request replaced it before it ended.
    Superseded,
}

impl HandledAs {
    pub fn succeeded(self) -> bool {
        matches!(
            self,
            Self::Restored | Self::Started | Self::StartedFresh | Self::AlreadyRunning
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restored => "restored",
            Self::Started => "started",
            Self::StartedFresh => "started fresh",
            Self::AlreadyRunning => "already running",
            Self::Refused => "refused",
            Self::Failed => "failed",
            Self::Superseded => "superseded",
        }
    }
}

/// The outcome of one handled resume request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandledRequest {
    pub kind: HandledAs,
    /// The `Resumed` condition's reason (or the failure's), e.g. `Restored`, `TokenRejected`.
    pub reason: String,
    pub message: String,
}

/// Reads how request `token` ended from a status whose `lastHandledResumeRequest` is `token`.
///
/// The operator writes the `Resumed` condition for every handled request except a launch
/// failure, which sets the session FAILED with `errorMessage` (and leaves an older `Resumed`
/// condition in place). A refusal's message names its token, which tells a fresh refusal from
/// a stale one.
pub fn interpret_outcome(status: &TaskSessionStatus, token: &str) -> HandledRequest {
    let resumed = conditions::find(&status.conditions, RESUMED);
    if let Some(c) = resumed
        .filter(|c| c.status == "False" && c.reason == "TerminalState" && c.message.contains(token))
    {
        return HandledRequest {
            kind: HandledAs::Refused,
            reason: c.reason.clone(),
            message: c.message.clone(),
        };
    }
    if status.state == SessionState::Failed {
        let reason = conditions::find(&status.conditions, READY)
            .filter(|c| c.status == "False" && !c.reason.is_empty())
            .map_or_else(|| "Failed".to_string(), |c| c.reason.clone());
        return HandledRequest {
            kind: HandledAs::Failed,
            reason,
            message: status.error_message.clone().unwrap_or_default(),
        };
    }
    let Some(c) = resumed else {
        let kind = if status.state.is_active() {
            HandledAs::Started
        } else {
            HandledAs::Failed
        };
        return HandledRequest {
            kind,
            reason: String::new(),
            message: status.error_message.clone().unwrap_or_default(),
        };
    };
    let kind = match (c.status.as_str(), c.reason.as_str()) {
        ("True", "Restored") => HandledAs::Restored,
        ("True", "AlreadyRunning") => HandledAs::AlreadyRunning,
        ("True", _) => HandledAs::Started,
        (_, "TokenRejected") => HandledAs::StartedFresh,
        (_, "TerminalState") => HandledAs::Refused,
        (_, "Superseded") => HandledAs::Superseded,
        _ => HandledAs::Failed,
    };
    HandledRequest {
        kind,
        reason: c.reason.clone(),
        message: c.message.clone(),
    }
}

/// What `resume` prints (and `-o json` emits).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeReport {
    pub name: String,
    pub namespace: String,
    /// The resume-request token set (or awaited); `null` when nothing was requested.
    pub request: Option<String>,
    /// Whether the operator has handled `request` (always false without `--wait`).
    pub handled: bool,
    /// `restored`, `started`, `started_fresh`, `already_running`, `refused`, `failed`; `null`
    /// while not handled.
    pub outcome: Option<HandledAs>,
    pub succeeded: Option<bool>,
    pub state: SessionState,
    pub task_state: TaskState,
    pub token_before: Option<String>,
    pub token_after: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

impl ResumeReport {
    /// The text form: a headline and indented details.
    pub fn text(&self) -> String {
        let name = &self.name;
        let mut out = match (&self.outcome, &self.request) {
            (Some(kind), _) => {
                format!("tasksession {name:?}: {}\n", headline(*kind))
            }
            (None, Some(request)) => format!(
                "tasksession {name:?}: resume requested (request {request}); follow it with: kubectl kandev status {name} -n {}\n",
                self.namespace
            ),
            (None, None) => format!("tasksession {name:?}: nothing requested\n"),
        };
        if self.outcome.is_none() {
            return out;
        }
        let mut rows: Vec<(&str, String)> = Vec::new();
        if let Some(request) = &self.request {
            rows.push(("request", request.clone()));
        }
        rows.push((
            "state",
            format!("{} (task {})", self.state, self.task_state.as_str()),
        ));
        rows.push((
            "token",
            describe_token_change(self.token_before.as_deref(), self.token_after.as_deref()),
        ));
        if let Some(reason) = self.reason.as_ref().filter(|r| !r.is_empty()) {
            rows.push(("reason", reason.clone()));
        }
        if let Some(message) = self.message.as_ref().filter(|m| !m.is_empty()) {
            rows.push(("message", message.clone()));
        }
        for (key, value) in rows {
            out.push_str(&format!("  {:<9}{value}\n", format!("{key}:")));
        }
        out
    }
}

fn headline(kind: HandledAs) -> &'static str {
    match kind {
        HandledAs::Restored => "resumed: the saved agent session was restored",
        HandledAs::Started => "resumed: a new agent session was started",
        HandledAs::StartedFresh => {
            "resumed with a NEW agent session: the agent no longer knew the saved one"
        }
        HandledAs::AlreadyRunning => "already running; nothing to resume",
        HandledAs::Refused => "resume refused",
        HandledAs::Failed => "resume FAILED",
        HandledAs::Superseded => "superseded by a newer resume request",
    }
}

/// `a → a (same session)`, `a → b (new session)`, `none → b`.
pub fn describe_token_change(before: Option<&str>, after: Option<&str>) -> String {
    let show = |t: Option<&str>| t.unwrap_or("none").to_string();
    let note = match (before, after) {
        (Some(a), Some(b)) if a == b => " (same session)",
        (Some(_), Some(_)) => " (new session)",
        (None, Some(_)) => " (new session)",
        (Some(_), None) => " (token cleared)",
        (None, None) => "",
    };
    format!("{} → {}{note}", show(before), show(after))
}

/// A new resume-request token: `kandev-<unix milliseconds>-<6 hex digits>`. Unique per request
/// (the time plus per-process randomness), sortable by time, and obviously from this plugin
/// when someone reads the annotation.
pub fn request_token(unix_millis: u128, entropy: u64) -> String {
    format!("kandev-{unix_millis}-{:06x}", entropy & 0xff_ffff)
}

// ------------------------------------------------------------------------------------------
// prompt

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
    /// The executor vanished: request a resume, wait for the agent, send again.
    ResumeAndRetry,
    /// The pod still runs and nothing was sent: connect again.
    RetrySamePod,
    /// Stop and report.
    GiveUp,
}

/// DESIGN §4 "retries once if the executor vanished": one retry per command. A prompt already
/// delivered to a still-running agent is never sent twice (the agent keeps working on it and
/// the answer lands in the history); an error answer from the agent is final.
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
        (_, _, true) => AfterFailure::ResumeAndRetry,
        (AttemptStage::Connect, _, false) => AfterFailure::RetrySamePod,
        (AttemptStage::Prompt, _, false) => AfterFailure::GiveUp,
    }
}

/// The exit code of a finished turn, from its ACP `stopReason`: the turn ran to its end
/// (`end_turn`, or a limit: `max_tokens`, `max_turn_requests`) → 0; the agent refused or the turn
/// was cancelled → 1.
pub fn stop_reason_succeeded(stop_reason: &str) -> bool {
    !matches!(stop_reason, "refusal" | "cancelled")
}

// ------------------------------------------------------------------------------------------
// history

/// Renders recorded history like the resume context does (`[USER]: …`, `[ASSISTANT]: …`,
/// `[TOOL CALL: name] {input}`, `[TOOL RESULT: name] …`), untruncated, one entry per line
/// (multi-line messages keep their line breaks), optionally prefixed with the timestamp.
pub fn render_history(entries: &[crate::history::HistoryEntry], timestamps: bool) -> String {
    use crate::history::HistoryEntry as E;
    let mut out = String::new();
    for entry in entries {
        let (timestamp, line) = match entry {
            E::UserMessage { text, timestamp } => (timestamp, format!("[USER]: {text}")),
            E::AgentMessage { text, timestamp } => (timestamp, format!("[ASSISTANT]: {text}")),
            E::ToolCall {
                name,
                input,
                timestamp,
            } => {
                let line = if input.is_null() {
                    format!("[TOOL CALL: {name}]")
                } else {
                    format!("[TOOL CALL: {name}] {input}")
                };
                (timestamp, line)
            }
            E::ToolResult {
                name,
                output,
                timestamp,
            } => (timestamp, format!("[TOOL RESULT: {name}] {output}")),
        };
        if timestamps {
            out.push_str(timestamp.as_deref().unwrap_or("-"));
            out.push(' ');
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExecutorRunning, TaskSession};
    use crate::history::HistoryEntry;
    use PodLiveness as P;
    use ResumeReason as R;
    use SessionState as S;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn status_of(value: serde_json::Value) -> TaskSessionStatus {
        serde_json::from_value(value).expect("status")
    }

    fn session(status: serde_json::Value) -> TaskSession {
        serde_json::from_value(json!({
            "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
            "metadata": {"name": "demo", "namespace": "team"},
            "spec": {"taskId": "t", "agent": "claude-code", "workspace": {"claimName": "w"}},
            "status": status,
        }))
        .expect("session")
    }

    fn executor(token: Option<&str>, pod_uid: &str) -> ExecutorRunning {
        serde_json::from_value(json!({
            "apiVersion": "kandev.dev/v1alpha1", "kind": "ExecutorRunning",
            "metadata": {"name": "demo", "namespace": "team"},
            "spec": {"sessionName": "demo"},
            "status": {"resumeToken": token, "podName": "demo-agent-old", "podUID": pod_uid,
                       "resumable": token.is_some()},
        }))
        .expect("executor")
    }

    fn pod(name: &str, uid: &str, running: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {
                "phase": if running { "Running" } else { "Failed" },
                "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "",
                    "ready": running, "restartCount": 0,
                    "state": if running { json!({"running": {}}) } else { json!({"terminated": {"exitCode": 1}}) }}],
            },
        }))
        .expect("pod")
    }

    fn snapshot(
        status: serde_json::Value,
        er: Option<ExecutorRunning>,
        pods: Vec<Pod>,
    ) -> Snapshot {
        Snapshot {
            namespace: "team".into(),
            session: session(status),
            executor: er,
            pods,
        }
    }

    fn running_snapshot() -> Snapshot {
        snapshot(
            json!({"state": "WAITING_FOR_INPUT", "taskState": "REVIEW",
                   "resumeReason": "already_running", "lastHandledResumeRequest": "r1",
                   "conditions": [cond("Resumed", "True", "Restored", "restored ACP session tok-1 with session/resume")]}),
            Some(executor(Some("tok-1"), "u1")),
            vec![pod("demo-agent-abc", "u1", true)],
        )
    }

    fn lost_snapshot() -> Snapshot {
        snapshot(
            json!({"state": "WAITING_FOR_INPUT", "taskState": "REVIEW", "needsResume": true,
                   "isResumable": true, "resumeReason": "agent_not_running"}),
            Some(executor(Some("tok-1"), "u1")),
            vec![],
        )
    }

    #[test]
    fn status_of_a_running_session() {
        let view = StatusView::new(&running_snapshot());
        assert_eq!(
            (view.needs_resume, view.resumable, view.reason),
            (false, false, R::AlreadyRunning)
        );
        assert_eq!(view.pod.name.as_deref(), Some("demo-agent-abc"));
        assert_eq!(view.pod.liveness, "Running");
        assert_eq!(
            view.table(),
            "\
Session:       demo
Namespace:     team
Agent:         claude-code
State:         WAITING_FOR_INPUT
Task state:    REVIEW
Needs resume:  no
Resumable:     no
Reason:        already_running
Resume token:  present (tok-1)
Pod:           demo-agent-abc (Running)
Last resume:   request r1: Resumed=True Restored: restored ACP session tok-1 with session/resume
Next:          kubectl kandev prompt demo -n team \"<text>\"
"
        );
    }

    #[test]
    fn status_of_a_lost_session_before_and_after_the_operator_noticed() {
        let view = StatusView::new(&lost_snapshot());
        assert_eq!(
            (view.needs_resume, view.resumable, view.reason),
            (true, true, R::AgentNotRunning)
        );
        // The pod is gone; the name recorded in ExecutorRunning is shown.
        assert_eq!(view.pod.name.as_deref(), Some("demo-agent-old"));
        assert_eq!(view.pod.liveness, "Missing");
        let table = view.table();
        assert!(table.contains("Needs resume:  yes\n"), "{table}");
        assert!(
            table.contains("Pod:           demo-agent-old (Missing)\n"),
            "{table}"
        );
        assert!(
            table.contains("Last resume:   never requested\n"),
            "{table}"
        );
        assert!(
            table.contains("Next:          kubectl kandev resume demo -n team --wait\n"),
            "{table}"
        );
        assert!(!table.contains("Operator:"), "{table}");

        // The pod died a moment ago; the operator's status still says all is well.
        let mut stale = lost_snapshot();
        stale.session.status.as_mut().expect("status").needs_resume = false;
        let table = StatusView::new(&stale).table();
        assert!(
            table.contains(
                "Operator:      has not caught up yet (its status says needsResume=false)"
            ),
            "{table}"
        );
    }

    #[test]
    fn status_json_has_the_documented_fields() {
        let json = serde_json::to_value(StatusView::new(&lost_snapshot())).expect("json");
        assert_eq!(json["needsResume"], true);
        assert_eq!(json["resumable"], true);
        assert_eq!(json["reason"], "agent_not_running");
        assert_eq!(json["state"], "WAITING_FOR_INPUT");
        assert_eq!(json["taskState"], "REVIEW");
        assert_eq!(json["tokenPresent"], true);
        assert_eq!(json["resumeToken"], "tok-1");
        assert_eq!(
            json["pod"],
            json!({"name": "demo-agent-old", "liveness": "Missing"})
        );
        assert_eq!(
            json["lastResume"],
            json!({"handledRequest": null, "inProgressRequest": null, "condition": null})
        );
        assert_eq!(json["recorded"]["resumeReason"], "agent_not_running");
        let running = serde_json::to_value(StatusView::new(&running_snapshot())).expect("json");
        assert_eq!(running["lastResume"]["condition"]["reason"], "Restored");
        assert_eq!(running["lastResume"]["handledRequest"], "r1");
    }

    #[test]
    fn last_resume_descriptions() {
        let c = |status: &str, reason: &str, message: &str| {
            Some(ConditionView {
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: String::new(),
            })
        };
        let rows = [
            (None, None, None, "never requested"),
            (Some("a"), Some("h"), None, "request a in progress"),
            (None, Some("h"), None, "request h handled"),
            (
                None,
                Some("h"),
                c("False", "TerminalState", "refused"),
                "request h: Resumed=False TerminalState: refused",
            ),
            (None, None, c("True", "Started", ""), "Resumed=True Started"),
        ];
        for (active, handled, condition, expected) in rows {
            let view = LastResumeView {
                handled_request: handled.map(str::to_string),
                in_progress_request: active.map(str::to_string),
                condition,
            };
            assert_eq!(view.describe(), expected);
        }
    }

    /// A status in `state`, with `active` as the request in flight.
    fn st(state: S, active: Option<&str>) -> TaskSessionStatus {
        TaskSessionStatus {
            state,
            active_resume_request: active.map(str::to_string),
            ..Default::default()
        }
    }

    fn eval(needs: bool, resumable: bool, reason: R) -> ResumeEvaluation {
        ResumeEvaluation {
            needs_resume: needs,
            is_resumable: resumable,
            reason,
        }
    }

    #[test]
    fn resume_plans() {
        let running = eval(false, false, R::AlreadyRunning);
        let lost = eval(true, true, R::AgentNotRunning);
        let terminal = eval(false, false, R::TerminalState);
        let failed_resumable = eval(false, true, R::FailedSessionResumable);
        let no_executor = eval(false, false, R::NoExecutor);
        #[rustfmt::skip]
        let rows: Vec<(TaskSessionStatus, ResumeEvaluation, P, bool, ResumePlan)> = vec![
            // A request in flight is awaited, never doubled (fresh or not).
            (st(S::Starting, Some("t0")), lost, P::Pending, false, ResumePlan::AwaitActive("t0".into())),
            (st(S::WaitingForInput, Some("t0")), lost, P::Missing, true, ResumePlan::AwaitActive("t0".into())),
            // Terminal and not resumable: refused, also with --fresh.
            (st(S::Completed, None), terminal, P::Missing, false, ResumePlan::Refuse(String::new())),
            (st(S::Cancelled, None), terminal, P::Missing, true, ResumePlan::Refuse(String::new())),
            (st(S::Failed, None), terminal, P::Missing, false, ResumePlan::Refuse(String::new())),
            (st(S::Completed, None), running, P::Running, false, ResumePlan::Refuse(String::new())),
            // Needs a resume, or may get one.
            (st(S::WaitingForInput, None), lost, P::Missing, false, ResumePlan::Request),
            (st(S::Failed, None), failed_resumable, P::Missing, false, ResumePlan::Request),
            // Active, pod lost, nothing recorded: the operator relaunches.
            (st(S::Running, None), no_executor, P::Missing, false, ResumePlan::Request),
            // --fresh asks even when the agent runs (the operator answers AlreadyRunning).
            (st(S::WaitingForInput, None), running, P::Running, true, ResumePlan::Request),
            // Nothing to do.
            (st(S::WaitingForInput, None), running, P::Running, false, ResumePlan::AlreadyRunning),
            (st(S::Running, None), running, P::Running, false, ResumePlan::AlreadyRunning),
            (st(S::Created, None), no_executor, P::Missing, false, ResumePlan::Starting),
            (st(S::Starting, None), running, P::Pending, false, ResumePlan::Starting),
        ];
        for (status, eval, pod, fresh, expected) in rows {
            let plan = plan_resume(&status, &eval, pod, fresh);
            let ctx = format!("{:?} {eval:?} {pod:?} fresh={fresh}", status.state);
            match (&plan, &expected) {
                (ResumePlan::Refuse(why), ResumePlan::Refuse(_)) => {
                    assert!(why.contains(status.state.as_str()), "{ctx}: {why}")
                }
                _ => assert_eq!(plan, expected, "{ctx}"),
            }
        }
    }

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
    fn outcomes_of_handled_requests() {
        #[rustfmt::skip]
        let rows: Vec<(serde_json::Value, HandledAs, &str)> = vec![
            (json!({"state": "WAITING_FOR_INPUT", "conditions": [cond("Resumed", "True", "Restored", "restored ACP session s with session/resume")]}),
                HandledAs::Restored, "Restored"),
            (json!({"state": "WAITING_FOR_INPUT", "conditions": [cond("Resumed", "True", "Started", "started ACP session s2; waiting for input")]}),
                HandledAs::Started, "Started"),
            (json!({"state": "RUNNING", "conditions": [cond("Resumed", "True", "Started", "started ACP session s2 and sent the task description")]}),
                HandledAs::Started, "Started"),
            (json!({"state": "WAITING_FOR_INPUT", "conditions": [cond("Resumed", "True", "AlreadyRunning", "resume request \"tok\": the agent is already running")]}),
                HandledAs::AlreadyRunning, "AlreadyRunning"),
            (json!({"state": "WAITING_FOR_INPUT", "conditions": [cond("Resumed", "False", "TokenRejected", "the agent does not know saved session s")]}),
                HandledAs::StartedFresh, "TokenRejected"),
            (json!({"state": "WAITING_FOR_INPUT", "needsResume": true, "conditions": [cond("Resumed", "False", "Internal", "restore failed (internal): …; the resume token is kept")]}),
                HandledAs::Failed, "Internal"),
            (json!({"state": "COMPLETED", "conditions": [cond("Resumed", "False", "TerminalState", "resume request \"tok\" refused: the session is COMPLETED")]}),
                HandledAs::Refused, "TerminalState"),
            // A launch failure: FAILED with errorMessage; the Resumed condition is an old one.
            (json!({"state": "FAILED", "errorMessage": "workspace PVC \"w\" not found",
                    "conditions": [cond("Resumed", "True", "Restored", "old"), cond("Ready", "False", "LaunchFailed", "workspace PVC \"w\" not found")]}),
                HandledAs::Failed, "LaunchFailed"),
            // …even when the old condition is a refusal of another request.
            (json!({"state": "FAILED", "errorMessage": "boom",
                    "conditions": [cond("Resumed", "False", "TerminalState", "resume request \"old\" refused: the session is FAILED")]}),
                HandledAs::Failed, "Failed"),
            // No Resumed condition at all.
            (json!({"state": "WAITING_FOR_INPUT"}), HandledAs::Started, ""),
            (json!({"state": "CANCELLED"}), HandledAs::Failed, ""),
        ];
        for (status, kind, reason) in rows {
            let outcome = interpret_outcome(&status_of(status.clone()), "tok");
            assert_eq!(
                (outcome.kind, outcome.reason.as_str()),
                (kind, reason),
                "{status}"
            );
        }
        let succeeded: Vec<bool> = [
            HandledAs::Restored,
            HandledAs::Started,
            HandledAs::StartedFresh,
            HandledAs::AlreadyRunning,
            HandledAs::Refused,
            HandledAs::Failed,
        ]
        .iter()
        .map(|k| k.succeeded())
        .collect();
        assert_eq!(succeeded, [true, true, true, true, false, false]);
    }

    #[test]
    fn resume_report_text() {
        let report = ResumeReport {
            name: "demo".into(),
            namespace: "team".into(),
            request: Some("kandev-1-abcdef".into()),
            handled: true,
            outcome: Some(HandledAs::Restored),
            succeeded: Some(true),
            state: S::WaitingForInput,
            task_state: TaskState::Review,
            token_before: Some("tok-1".into()),
            token_after: Some("tok-1".into()),
            reason: Some("Restored".into()),
            message: Some("restored ACP session tok-1 with session/resume".into()),
        };
        assert_eq!(
            report.text(),
            "\
tasksession \"demo\": resumed: the saved agent session was restored
  request: kandev-1-abcdef
  state:   WAITING_FOR_INPUT (task REVIEW)
  token:   tok-1 → tok-1 (same session)
  reason:  Restored
  message: restored ACP session tok-1 with session/resume
"
        );
        let pending = ResumeReport {
            handled: false,
            outcome: None,
            succeeded: None,
            ..report.clone()
        };
        assert_eq!(
            pending.text(),
            "tasksession \"demo\": resume requested (request kandev-1-abcdef); follow it with: kubectl kandev status demo -n team\n"
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["outcome"], "restored");
        assert_eq!(json["tokenBefore"], "tok-1");
    }

    #[test]
    fn token_changes() {
        assert_eq!(
            describe_token_change(Some("a"), Some("a")),
            "a → a (same session)"
        );
        assert_eq!(
            describe_token_change(Some("a"), Some("b")),
            "a → b (new session)"
        );
        assert_eq!(
            describe_token_change(None, Some("b")),
            "none → b (new session)"
        );
        assert_eq!(
            describe_token_change(Some("a"), None),
            "a → none (token cleared)"
        );
        assert_eq!(describe_token_change(None, None), "none → none");
    }

    #[test]
    fn request_tokens_are_sortable_and_label_safe() {
        let token = request_token(1_767_225_600_123, 0x1234_5678_9abc_def0);
        assert_eq!(token, "kandev-1767225600123-bcdef0");
        assert_eq!(request_token(5, 1), "kandev-5-000001");
        assert_ne!(request_token(5, 1), request_token(5, 2));
        assert!(token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[test]
    fn failure_handling_retries_once() {
        use AfterFailure::*;
        use AttemptStage::*;
        #[rustfmt::skip]
        let rows = [
            // (stage, stream lost, pod lost, retried) → next
            (Connect, true, true, false, ResumeAndRetry),
            (Prompt, true, true, false, ResumeAndRetry),
            (Prompt, false, true, false, ResumeAndRetry),
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

    #[test]
    fn history_renders_like_the_resume_context() {
        let entries = vec![
            HistoryEntry::UserMessage {
                text: "Fix the bug.".into(),
                timestamp: Some("2026-01-01T00:00:00Z".into()),
            },
            HistoryEntry::ToolCall {
                name: "read_file".into(),
                input: json!({"path": "src/a.rs"}),
                timestamp: None,
            },
            HistoryEntry::ToolResult {
                name: "read_file".into(),
                output: "fn a() {}\n".into(),
                timestamp: None,
            },
            HistoryEntry::ToolCall {
                name: "ls".into(),
                input: serde_json::Value::Null,
                timestamp: None,
            },
            HistoryEntry::AgentMessage {
                text: "Done:\n- fixed a".into(),
                timestamp: None,
            },
        ];
        assert_eq!(
            render_history(&entries, false),
            "\
[USER]: Fix the bug.
[TOOL CALL: read_file] {\"path\":\"src/a.rs\"}
[TOOL RESULT: read_file] fn a() {}
[TOOL CALL: ls]
[ASSISTANT]: Done:
- fixed a
"
        );
        let stamped = render_history(&entries[..2], true);
        assert_eq!(
            stamped,
            "2026-01-01T00:00:00Z [USER]: Fix the bug.\n- [TOOL CALL: read_file] {\"path\":\"src/a.rs\"}\n"
        );
    }

    #[test]
    fn last_seen_summarises_for_timeouts() {
        let mut snap = lost_snapshot();
        snap.session
            .status
            .as_mut()
            .expect("status")
            .active_resume_request = Some("t1".into());
        assert_eq!(
            snap.last_seen(),
            "state WAITING_FOR_INPUT, pod Missing, resume request \"t1\" in progress"
        );
        assert_eq!(
            running_snapshot().last_seen(),
            "state WAITING_FOR_INPUT, pod Running, last handled resume request \"r1\""
        );
    }
}
