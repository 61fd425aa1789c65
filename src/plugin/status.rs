//! The status snapshot and its view: what one read of the cluster says about a session
//! (evaluated with the same rules as the operator, [`Snapshot`]), and how `kubectl kandev status`
//! shows it ([`StatusView`]: the table and the `-o json` document). Nothing here touches the
//! cluster.

use serde::Serialize;

use crate::agents::AgentRegistry;
use crate::api::conditions::{self, RECONCILING, RESUMED};
use crate::api::{ResumeReason, SessionState, TaskState};
use crate::resume::{PodLiveness, SessionObjects};

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
    /// Why the task description never reached the agent (`TaskSent=False`), if it did not.
    pub task_not_sent: Option<String>,
    /// Which spec changes wait for the agent's next launch (`SpecApplied=False`), if any.
    pub pending_restart: Option<String>,
    /// The command that reopens the session in the agent's own CLI: the profile's `cliResume`
    /// with the token. Only for built-in profiles (custom ones live in the operator's
    /// configuration, which the plugin does not read) and with a token.
    pub cli_resume: Option<Vec<String>>,
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
            task_not_sent: conditions::find(&status.conditions, conditions::TASK_SENT)
                .filter(|c| c.status == "False")
                .map(|c| c.message.clone()),
            pending_restart: conditions::find(&status.conditions, conditions::SPEC_APPLIED)
                .filter(|c| c.status == "False")
                .map(|c| c.message.clone()),
            cli_resume: cli_resume(&snapshot.session.spec.agent, snapshot.resume_token()),
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
        if let Some(why) = &self.task_not_sent {
            rows.push(("Task", format!("never sent: {why}")));
        }
        if let Some(what) = &self.pending_restart {
            rows.push(("Spec", format!("not applied yet: {what}")));
        }
        if let Some(command) = &self.cli_resume {
            rows.push(("Agent CLI", shell_words(command)));
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
        } else if self.pending_restart.is_some() && self.state == SessionState::WaitingForInput {
            Some(format!("kubectl kandev restart {target} --wait"))
        } else if self.state == SessionState::WaitingForInput && self.pod.liveness == "Running" {
            Some(format!("kubectl kandev prompt {target} \"<text>\""))
        } else {
            None
        }
    }
}

/// The built-in profile `agent`'s `cliResume` command for `token`.
fn cli_resume(agent: &str, token: Option<&str>) -> Option<Vec<String>> {
    let registry = AgentRegistry::builtin().ok()?;
    registry.get(agent)?.cli_resume_command(token?)
}

/// `argv` as one shell command line: words with anything but `[A-Za-z0-9_./:=@%+-]` in single
/// quotes.
fn shell_words(argv: &[String]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=@%+-".contains(c);
    argv.iter()
        .map(|word| {
            if !word.is_empty() && word.chars().all(plain) {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExecutorRunning, TaskSession};
    use crate::plugin::test_support::cond;
    use ResumeReason as R;
    use k8s_openapi::api::core::v1::Pod;
    use pretty_assertions::assert_eq;
    use serde_json::json;

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
            reader: None,
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
Agent CLI:     claude --resume tok-1
Next:          kubectl kandev prompt demo -n team \"<text>\"
"
        );
    }

    /// `cliResume` is shown for the built-in profiles that have one, with the token quoted
    /// for a shell; never without a token, nor for a profile the plugin does not know.
    #[test]
    fn the_agents_own_cli_command_for_the_token() {
        assert_eq!(
            cli_resume("claude-code", Some("tok-1")),
            Some(vec!["claude".into(), "--resume".into(), "tok-1".into()])
        );
        assert_eq!(cli_resume("claude-code", None), None);
        assert_eq!(cli_resume("my-custom-agent", Some("tok-1")), None);
        let words = |w: &[&str]| shell_words(&w.iter().map(|w| w.to_string()).collect::<Vec<_>>());
        assert_eq!(
            words(&["claude", "--resume", "a-b_c.1"]),
            "claude --resume a-b_c.1"
        );
        assert_eq!(words(&["x", "it's $HOME", ""]), r"x 'it'\''s $HOME' ''");
        let json = serde_json::to_value(StatusView::new(&running_snapshot())).expect("json");
        assert_eq!(json["cliResume"], json!(["claude", "--resume", "tok-1"]));
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

    /// `TaskSent=False` (the launch could not send the task description) is shown with why;
    /// `TaskSent=True` is not worth a line.
    #[test]
    fn a_task_description_that_never_reached_the_agent_is_shown() {
        let with = |status: &str| {
            let mut snap = running_snapshot();
            let s = snap.session.status.as_mut().expect("status");
            s.conditions = vec![
                serde_json::from_value(cond("TaskSent", status, "TaskNotSent", "eof"))
                    .expect("condition"),
            ];
            StatusView::new(&snap)
        };
        let view = with("False");
        assert_eq!(view.task_not_sent.as_deref(), Some("eof"));
        assert!(view.table().contains("Task:          never sent: eof\n"));
        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["taskNotSent"], "eof");
        assert_eq!(with("True").task_not_sent, None);
        assert!(!with("True").table().contains("Task:"));
    }

    /// A spec change that waits for the next launch is shown, and `restart` is the next step.
    #[test]
    fn a_change_waiting_for_a_restart_is_shown() {
        let mut snap = running_snapshot();
        let s = snap.session.status.as_mut().expect("status");
        s.state = SessionState::WaitingForInput;
        s.conditions = vec![
            serde_json::from_value(cond(
                "SpecApplied",
                "False",
                "PendingRestart",
                "spec.image changed",
            ))
            .expect("condition"),
        ];
        let view = StatusView::new(&snap);
        assert_eq!(view.pending_restart.as_deref(), Some("spec.image changed"));
        let table = view.table();
        assert!(
            table.contains("Spec:          not applied yet: spec.image changed\n"),
            "{table}"
        );
        assert!(
            table.contains("Next:          kubectl kandev restart "),
            "{table}"
        );
        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["pendingRestart"], "spec.image changed");
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
