//! `kubectl kandev resume`: the pure rules first — what a resume request should do
//! ([`plan_resume`], [`stalling_launch`]), what a handled request's outcome means
//! ([`interpret_outcome`]) and the report it prints ([`ResumeReport`]) — then the command
//! itself (`resume`), which reads the session, sets the resume annotation and with `--wait`
//! waits for the operator to handle it ([`wait_handled`]).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;

use super::cli::ResumeArgs;
use super::cluster::{Cluster, Deadline, RequestKind};
use super::error::{ExitCode, PluginError};
use super::print_object;
use super::status::{Snapshot, liveness_name};
use super::watch::{Progress, wait_for};
use crate::api::conditions::{self, RESUMED, STALLED};
use crate::api::{SessionState, TaskSessionStatus, TaskState};
use crate::resume::{PodLiveness, ResumeEvaluation, plain_stall};

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
    let answered_by_launch = status.active_resume_request.as_deref() == Some(token)
        || status.joined_resume_requests.iter().any(|t| t == token);
    if !answered_by_launch {
        return None;
    }
    let pod = pod?;
    let stall = plain_stall(pod)?;
    // The pure rule words it for its deadline; the part after the first ": " is the pod's.
    let detail = stall
        .message
        .split_once(": ")
        .map_or(stall.message.as_str(), |(_, rest)| rest);
    Some(format!(
        "{} (pod {}): {detail}",
        stall.reason,
        pod.name_any()
    ))
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
        let reason = conditions::find(&status.conditions, STALLED)
            .filter(|c| c.status == "True" && !c.reason.is_empty())
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
        (_, "TerminalState" | "AgentWorking") => HandledAs::Refused,
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

/// Waits until the operator has handled request `token` (`status.lastHandledResumeRequest`).
pub async fn wait_handled(
    cluster: &Cluster,
    name: &str,
    token: &str,
    deadline: Deadline,
    progress: Progress,
) -> Result<Snapshot, PluginError> {
    let what = format!("the operator to handle resume request {token:?} of tasksession {name:?}");
    wait_for(cluster, name, &what, deadline, progress, |snapshot| {
        let status = snapshot.status();
        let handled = status.active_resume_request.as_deref() != Some(token)
            && (status.last_handled_resume_request.as_deref() == Some(token)
                || status.recent_resume_requests.iter().any(|t| t == token));
        if handled {
            return Ok(Some(snapshot.clone()));
        }
        // A launch pod that cannot start is reported now, not at the operator's deadline.
        match stalling_launch(&status, token, snapshot.current_pod()) {
            Some(why) => Err(PluginError::ResumeFailed {
                name: name.to_string(),
                verdict: format!(
                    "is stalled: {why}. The operator keeps trying until its launch deadline, then keeps the token; fix the cause and resume again"
                ),
            }),
            None => Ok(None),
        }
    })
    .await
    .map_err(|e| match e {
        PluginError::Timeout {
            what,
            waited,
            last_seen,
        } if !last_seen.contains(token) => PluginError::Timeout {
            what,
            waited,
            last_seen: format!(
                "{last_seen} (the operator has not picked the request up: is kandev-operator running?)"
            ),
        },
        other => other,
    })
}

// ------------------------------------------------------------------------------------------
// the command

/// `kubectl kandev resume` (and `restart`, which also replaces an agent that waits for input):
/// plans, requests (or awaits the request in progress) and, with `--wait`, reports how the
/// operator handled it.
pub(super) async fn resume(
    cluster: &Cluster,
    args: ResumeArgs,
    restart: bool,
) -> Result<ExitCode, PluginError> {
    let snapshot = cluster.snapshot(&args.session).await?;
    let name = snapshot.name();
    let status = snapshot.status();
    let token_before = snapshot.resume_token().map(String::from);
    let mut report = ResumeReport {
        name: name.clone(),
        namespace: cluster.namespace.clone(),
        request: None,
        handled: false,
        outcome: None,
        succeeded: None,
        state: status.state,
        task_state: status.task_state,
        token_before: token_before.clone(),
        token_after: token_before,
        reason: None,
        message: None,
    };
    let plan = match resume_plan(&snapshot, args.fresh) {
        ResumePlan::AlreadyRunning if restart => restart_plan(status.state),
        plan => plan,
    };
    let request = match plan {
        ResumePlan::Refuse(why) => {
            return Err(PluginError::NotResumable {
                name,
                namespace: cluster.namespace.clone(),
                why,
            });
        }
        ResumePlan::AlreadyRunning | ResumePlan::Starting => {
            let message = nothing_to_resume(&plan, &snapshot);
            if plan == ResumePlan::AlreadyRunning {
                report.outcome = Some(HandledAs::AlreadyRunning);
                report.succeeded = Some(true);
            }
            report.message = Some(message.clone());
            print_object(&report, &args.output, || {
                format!("tasksession {name:?}: {message}\n")
            })?;
            return Ok(ExitCode::Ok);
        }
        ResumePlan::AwaitActive(token) => {
            let fresh_note = if args.fresh {
                " (--fresh does not apply to it)"
            } else {
                ""
            };
            say!(
                "a resume of tasksession {name:?} is already in progress (request {token}){fresh_note}"
            );
            token
        }
        ResumePlan::Request => {
            let kind = RequestKind {
                fresh: args.fresh,
                restart,
            };
            cluster.request_resume(&snapshot, kind).await?
        }
    };
    report.request = Some(request.clone());
    if !args.wait {
        print_object(&report, &args.output, || {
            // The token alone on stdout (for scripts), the explanation on stderr.
            super::write_stderr(&report.text());
            format!("{request}\n")
        })?;
        return Ok(ExitCode::Ok);
    }
    await_outcome(cluster, &args, report, &request).await
}

/// The plan for the session as it is now ([`plan_resume`]); a request in progress whose pod
/// cannot start is superseded by a new one (the cause may be fixed).
fn resume_plan(snapshot: &Snapshot, fresh: bool) -> ResumePlan {
    let status = snapshot.status();
    match plan_resume(&status, &snapshot.evaluation(), snapshot.liveness(), fresh) {
        ResumePlan::AwaitActive(token) => {
            match stalling_launch(&status, &token, snapshot.current_pod()) {
                Some(why) => {
                    say!("resume request {token} is stalled ({why}); a new request supersedes it");
                    ResumePlan::Request
                }
                None => ResumePlan::AwaitActive(token),
            }
        }
        plan => plan,
    }
}

/// A restart of an agent that runs: requested while it waits for input, refused while a prompt
/// runs (the operator refuses it too, `AgentWorking`).
pub fn restart_plan(state: SessionState) -> ResumePlan {
    if state == SessionState::Running {
        ResumePlan::Refuse(
            "a prompt is running; restart once the agent waits for input, or cancel the prompt first"
                .to_string(),
        )
    } else {
        ResumePlan::Request
    }
}

/// Why `plan` (already running, or starting) needs no resume.
fn nothing_to_resume(plan: &ResumePlan, snapshot: &Snapshot) -> String {
    let state = snapshot.status().state;
    if *plan == ResumePlan::AlreadyRunning {
        format!("the agent is already running (state {state})")
    } else if state == crate::api::SessionState::Created {
        "the session has not started yet (state CREATED): the operator launches it by itself; nothing to resume".to_string()
    } else {
        format!(
            "the operator is launching the agent (state {state}, pod {}); nothing to resume",
            liveness_name(snapshot.liveness())
        )
    }
}

/// `--wait`: until the operator handled `request`, then its outcome as the report and the
/// exit code.
async fn await_outcome(
    cluster: &Cluster,
    args: &ResumeArgs,
    mut report: ResumeReport,
    request: &str,
) -> Result<ExitCode, PluginError> {
    let name = report.name.clone();
    let progress = Progress::for_output(&args.output);
    let deadline = Deadline::after(args.timeout);
    let handled = wait_handled(cluster, &name, request, deadline, progress).await?;
    let status = handled.status();
    let outcome = interpret_outcome(&status, request);
    report.handled = true;
    report.outcome = Some(outcome.kind);
    report.succeeded = Some(outcome.kind.succeeded());
    report.state = status.state;
    report.task_state = status.task_state;
    report.token_after = handled.resume_token().map(String::from);
    report.reason = Some(outcome.reason.clone()).filter(|r| !r.is_empty());
    report.message = Some(outcome.message.clone()).filter(|m| !m.is_empty());
    print_object(&report, &args.output, || report.text())?;
    match outcome.kind {
        kind if kind.succeeded() => Ok(ExitCode::Ok),
        HandledAs::Refused => Err(PluginError::NotResumable {
            name,
            namespace: cluster.namespace.clone(),
            why: outcome.message,
        }),
        _ => Err(PluginError::ResumeFailed {
            name,
            verdict: if outcome.reason.is_empty() {
                "failed".to_string()
            } else {
                format!("failed ({})", outcome.reason)
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ResumeReason as R;
    use crate::plugin::test_support::{cond, eval, st};
    use PodLiveness as P;
    use SessionState as S;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn status_of(value: serde_json::Value) -> TaskSessionStatus {
        serde_json::from_value(value).expect("status")
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

    /// `restart` of an agent that runs: requested while it waits, refused while it works.
    #[test]
    fn restart_plans() {
        assert_eq!(restart_plan(S::WaitingForInput), ResumePlan::Request);
        let ResumePlan::Refuse(why) = restart_plan(S::Running) else {
            panic!("a working agent is not restarted");
        };
        assert!(why.contains("a prompt is running"), "{why}");
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
            (json!({"state": "RUNNING", "conditions": [cond("Resumed", "False", "AgentWorking", "restart request \"tok\" refused: a prompt is running")]}),
                HandledAs::Refused, "AgentWorking"),
            // A launch failure: FAILED with errorMessage; the Resumed condition is an old one.
            (json!({"state": "FAILED", "errorMessage": "workspace PVC \"w\" not found",
                    "conditions": [cond("Resumed", "True", "Restored", "old"), cond("Stalled", "True", "LaunchFailed", "workspace PVC \"w\" not found")]}),
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
}
