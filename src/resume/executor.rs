//! ExecutorRunning status has one writer, the reconciler, and three roads into it, each a pure
//! function that returns the whole status to apply: a launch that left a running agent
//! ([`launched`]), what the event followers read in the agent's journal ([`journal_update`]),
//! and the end of the executor ([`ended`]). The reconciler applies it with server-side apply,
//! which removes what the new status no longer holds ([`leftovers`] for what an older
//! operator's field managers still share; [`merge_patch`] for an API server whose CRD is older
//! than the operator).
//!
//! The agent's session id reaches `resumeToken` only through [`AgentView::with_session`], from
//! a restore's answer and from the journal alike: a new session never keeps the last message id
//! and the configuration of the one before.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::api::bounds::NUDGE_MAX;
use crate::api::{
    AgentActivity, ExecutorPhase, ExecutorRunningStatus, NegotiatedCapabilities,
    SessionConfigState, WorktreeStatus,
};
use crate::api::{PendingPermission, PermissionOutcome, ToolKind};

/// What agentctl last said about the agent: the ExecutorRunning fields that the agent's journal
/// (and a launch's restore) set, and the journal entry last applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentView {
    pub resume_token: Option<String>,
    /// `lastMessageUUID`: the last message id of the session `resume_token` names.
    pub last_message_id: Option<String>,
    pub activity: Option<AgentActivity>,
    /// `journalCursor` (written with the next change of the other fields).
    pub cursor: u64,
    /// `sessionConfig`: the configuration of the session `resume_token` names.
    pub session_config: Option<SessionConfigState>,
    /// `pendingPermissions`: the permission requests that wait for a person, oldest first.
    pub pending_permissions: Vec<PendingPermission>,
    /// Permission requests that ended since the last post (not written: the reconciler turns
    /// them into Events and metrics), oldest first, at most [`RESOLUTIONS_KEPT`].
    pub resolutions: Vec<PermissionResolution>,
}

/// Resolutions a view keeps until they are written; older ones go first.
pub const RESOLUTIONS_KEPT: usize = 64;

/// A permission request's end, as the journal says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermissionResolution {
    pub request_id: String,
    pub tool_kind: ToolKind,
    pub outcome: PermissionOutcome,
    pub reason: String,
}

impl AgentView {
    pub fn from_status(status: &ExecutorRunningStatus) -> Self {
        Self {
            resume_token: status.resume_token.clone().filter(|t| !t.is_empty()),
            last_message_id: status.last_message_uuid.clone().filter(|t| !t.is_empty()),
            activity: status.activity,
            cursor: status.journal_cursor.unwrap_or(0),
            session_config: status.session_config.clone(),
            pending_permissions: status.pending_permissions.clone(),
            resolutions: Vec::new(),
        }
    }

    /// The agent's session is `id`: another session than the one before starts without its
    /// last message id and its configuration (until the agent reports its own).
    pub fn with_session(mut self, id: Option<String>) -> Self {
        if id != self.resume_token {
            self.last_message_id = None;
            self.session_config = None;
        }
        self.resume_token = id;
        self
    }

    /// The same status fields, whatever the cursor (resolutions are not status).
    pub fn same_fields(&self, other: &AgentView) -> bool {
        (
            &self.resume_token,
            &self.last_message_id,
            self.activity,
            &self.session_config,
            &self.pending_permissions,
        ) == (
            &other.resume_token,
            &other.last_message_id,
            other.activity,
            &other.session_config,
            &other.pending_permissions,
        )
    }

    pub(super) fn write_into(self, status: &mut ExecutorRunningStatus) {
        status.resume_token = self.resume_token;
        status.last_message_uuid = self.last_message_id;
        status.activity = self.activity;
        status.journal_cursor = (self.cursor > 0).then_some(self.cursor);
        status.session_config = self.session_config;
        status.pending_permissions = self.pending_permissions;
    }
}

/// What a launch that ends with a running agent knows.
#[derive(Clone, Debug)]
pub struct LaunchRecord<'a> {
    pub pod_name: &'a str,
    pub pod_uid: Option<&'a str>,
    /// The agent's session id after the restore: the resume token to save.
    pub token: Option<&'a str>,
    /// The launch started a prompt (the task description of a fresh session).
    pub prompt_started: bool,
    /// The client's nudge (`kandev.dev/prompted-at`), if any.
    pub nudge: Option<&'a str>,
    pub capabilities: Option<NegotiatedCapabilities>,
    /// The checkout agentctl reported (sessions with a repository only).
    pub worktree: Option<WorktreeStatus>,
    /// The session's configuration after agentctl's set calls, and what of the wanted one the
    /// agent does not offer; `None` when the restore's answer said nothing about it.
    pub session_config: Option<super::Configured>,
    /// The UID of the workspace PVC the pod runs on (`None`: not known; the one recorded stays).
    pub workspace_uid: Option<&'a str>,
    pub now: Timestamp,
}

/// The status after a launch that left a running agent: its pod, the token, what agentctl
/// reported, and the activity the event follower's first line will report (so that line
/// changes nothing). A launch that leaves the agent idle is a catch-up: the client's nudge so
/// far is handled, and a restarted operator does not read the journal for it.
pub fn launched(current: &ExecutorRunningStatus, record: LaunchRecord) -> ExecutorRunningStatus {
    let mut next = current.clone();
    let view = AgentView {
        activity: Some(if record.prompt_started {
            AgentActivity::Working
        } else {
            AgentActivity::Idle
        }),
        // A new agent: nothing of the one before waits.
        pending_permissions: Vec::new(),
        ..AgentView::from_status(current)
    }
    .with_session(record.token.map(str::to_string));
    let mut view = view;
    let configured = record.session_config.unwrap_or_default();
    if configured.state != SessionConfigState::default() {
        view.session_config = Some(configured.state.bounded());
    }
    next.session_config_problem = configured.problem;
    view.write_into(&mut next);
    next.resumable = record.token.is_some();
    next.pod_name = Some(record.pod_name.to_string());
    next.pod_uid = record.pod_uid.map(str::to_string);
    next.agent_execution_id = record.pod_uid.map(str::to_string);
    next.status = Some(ExecutorPhase::Running);
    next.capabilities = record.capabilities;
    if record.worktree.is_some() {
        next.worktree = record.worktree;
    }
    if let Some(uid) = record.workspace_uid {
        next.workspace_uid = Some(uid.to_string());
    }
    if let Some(nudge) = record
        .nudge
        .filter(|nudge| !record.prompt_started && nudge.len() <= NUDGE_MAX)
    {
        next.handled_prompted_at = Some(nudge.to_string());
    }
    next.last_seen_at = Some(Time(record.now));
    next
}

/// What the event follower of pod `pod_uid` read in the agent's journal.
#[derive(Clone, Debug, PartialEq)]
pub struct JournalNews {
    pub pod_uid: String,
    /// What the journal says now.
    pub view: AgentView,
    /// When the follower read the last change.
    pub seen_at: Timestamp,
    /// The client's nudge for which the journal was read up to an idle agent.
    pub handled_nudge: Option<String>,
}

/// The status after the journal's news (`None`: it changes nothing). News count only for the
/// pod the executor runs in now: a follower of a pod that is gone, or of an executor marked
/// lost or stopped since, writes nothing.
pub fn journal_update(
    current: &ExecutorRunningStatus,
    news: &JournalNews,
) -> Option<ExecutorRunningStatus> {
    if current.pod_uid.as_deref() != Some(news.pod_uid.as_str())
        || current.status != Some(ExecutorPhase::Running)
    {
        return None;
    }
    let mut next = current.clone();
    let mut changed = false;
    if !news.view.same_fields(&AgentView::from_status(current)) {
        next.resumable |= news.view.resume_token.is_some();
        news.view.clone().write_into(&mut next);
        next.last_seen_at = Some(Time(news.seen_at));
        changed = true;
    }
    if let Some(nudge) = news
        .handled_nudge
        .as_ref()
        .filter(|nudge| nudge.len() <= NUDGE_MAX)
        && current.handled_prompted_at.as_ref() != Some(nudge)
    {
        next.handled_prompted_at = Some(nudge.clone());
        changed = true;
    }
    changed.then_some(next)
}

/// The status once the executor's agent no longer runs: `phase` (`Lost`, `Stopped`), no
/// activity, `resumable` as given.
pub fn ended(
    current: &ExecutorRunningStatus,
    phase: ExecutorPhase,
    resumable: bool,
) -> ExecutorRunningStatus {
    ExecutorRunningStatus {
        status: Some(phase),
        resumable,
        activity: None,
        // What waited went with the agent (the reconciler says so in an Event).
        pending_permissions: Vec::new(),
        ..current.clone()
    }
}

/// What a server-side apply of `desired` left in the status it answered (`written`) that
/// `desired` does not hold, as the merge patch that removes it (`None`: nothing left). An apply
/// removes the fields its field manager leaves out only where no other manager shares them: an
/// executor written by an older operator (other field managers) keeps them until this patch.
pub fn leftovers(
    written: &ExecutorRunningStatus,
    desired: &ExecutorRunningStatus,
) -> Option<Value> {
    let written = serde_json::to_value(written).ok()?;
    let desired = serde_json::to_value(desired).ok()?;
    let removal = removal(&written, &desired)?;
    Some(serde_json::json!({ "status": removal }))
}

/// The JSON merge patch that turns `current` into `desired` (what `desired` lacks sent as
/// `null`), for an API server whose ExecutorRunning schema is older than this operator's: it
/// refuses an apply that names a field it does not declare ([`unknown_to_schema`]), and drops
/// such a field from a merge patch.
pub fn merge_patch(current: &ExecutorRunningStatus, desired: &ExecutorRunningStatus) -> Value {
    let mut body = serde_json::to_value(desired).unwrap_or(Value::Null);
    if let Some(removal) = serde_json::to_value(current)
        .ok()
        .and_then(|current| removal(&current, &body))
    {
        overlay(&mut body, removal);
    }
    serde_json::json!({ "status": body })
}

/// Whether an API server refused an apply because it names a field its schema does not declare
/// (a CRD older than this operator, during an upgrade).
pub fn unknown_to_schema(code: u16, message: &str) -> bool {
    code == 500 && message.contains("field not declared in schema")
}

/// `removal` (nulls, and objects of them) laid over `body`.
fn overlay(body: &mut Value, removal: Value) {
    let (Value::Object(body), Value::Object(removal)) = (body, removal) else {
        return;
    };
    for (key, value) in removal {
        match (body.get_mut(&key), value) {
            (Some(inner), value @ Value::Object(_)) => overlay(inner, value),
            (_, value) => {
                body.insert(key, value);
            }
        }
    }
}

/// The merge patch that turns object `written` into one without what `desired` lacks.
fn removal(written: &Value, desired: &Value) -> Option<Value> {
    let (Value::Object(written), Value::Object(desired)) = (written, desired) else {
        return None;
    };
    let patch: serde_json::Map<String, Value> = written
        .iter()
        .filter_map(|(key, value)| match desired.get(key) {
            None => Some((key.clone(), Value::Null)),
            Some(want) => removal(value, want).map(|inner| (key.clone(), inner)),
        })
        .collect();
    (!patch.is_empty()).then_some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ConfigOptionValue;
    use AgentActivity::{Idle, Working};
    use serde_json::json;

    fn now() -> Timestamp {
        Timestamp::from_second(100).expect("ts")
    }

    fn config(mode: &str) -> Option<SessionConfigState> {
        Some(SessionConfigState {
            mode: Some(mode.into()),
            ..SessionConfigState::default()
        })
    }

    /// An executor running in pod `p1`, idle, in session `s1`.
    fn running() -> ExecutorRunningStatus {
        ExecutorRunningStatus {
            resume_token: Some("s1".into()),
            last_message_uuid: Some("m1".into()),
            pod_uid: Some("p1".into()),
            status: Some(ExecutorPhase::Running),
            activity: Some(Idle),
            resumable: true,
            journal_cursor: Some(4),
            session_config: config("plan"),
            ..Default::default()
        }
    }

    #[test]
    fn launches() {
        let long = "n".repeat(NUDGE_MAX + 1);
        #[rustfmt::skip]
        let rows = [
            // (name, token, prompt started, nudge) → (activity, resumable, keeps the last message and config, handled nudge)
            ("restored, idle", Some("s1"), false, None::<&str>, (Idle, true, true, None::<&str>)),
            ("restored, a nudge caught up", Some("s1"), false, Some("n1"), (Idle, true, true, Some("n1"))),
            ("fresh with the task: working, the nudge is the follower's", Some("s2"), true, Some("n1"), (Working, true, false, None)),
            ("fresh, idle", Some("s2"), false, None, (Idle, true, false, None)),
            ("no session id", None, false, None, (Idle, false, false, None)),
            ("a nudge over its bound is not recorded", Some("s1"), false, Some(long.as_str()), (Idle, true, true, None)),
        ];
        for (name, token, prompt_started, nudge, (activity, resumable, keeps, handled)) in rows {
            let record = LaunchRecord {
                pod_name: "pod-2",
                pod_uid: Some("p2"),
                token,
                prompt_started,
                nudge,
                capabilities: None,
                worktree: None,
                session_config: None,
                workspace_uid: Some("pvc-1"),
                now: now(),
            };
            let next = launched(&running(), record);
            assert_eq!(next.activity, Some(activity), "{name}");
            assert_eq!(next.workspace_uid.as_deref(), Some("pvc-1"), "{name}");
            assert_eq!(next.resumable, resumable, "{name}");
            assert_eq!(next.resume_token.as_deref(), token, "{name}");
            assert_eq!(
                next.last_message_uuid.is_some(),
                keeps,
                "{name}: last message"
            );
            assert_eq!(
                next.session_config.is_some(),
                keeps,
                "{name}: configuration"
            );
            assert_eq!(next.handled_prompted_at.as_deref(), handled, "{name}");
            assert_eq!(next.pod_uid.as_deref(), Some("p2"), "{name}");
            assert_eq!(next.agent_execution_id.as_deref(), Some("p2"), "{name}");
            assert_eq!(next.status, Some(ExecutorPhase::Running), "{name}");
            assert_eq!(
                next.journal_cursor,
                Some(4),
                "{name}: the cursor is the journal's"
            );
            assert_eq!(next.last_seen_at, Some(Time(now())), "{name}");
        }
    }

    #[test]
    fn journal_news() {
        let view = |f: &dyn Fn(&mut AgentView)| {
            let mut view = AgentView::from_status(&running());
            f(&mut view);
            view
        };
        let news = |pod: &str, view: AgentView, nudge: Option<&str>| JournalNews {
            pod_uid: pod.into(),
            view,
            seen_at: now(),
            handled_nudge: nudge.map(str::to_string),
        };
        let lost = ExecutorRunningStatus {
            status: Some(ExecutorPhase::Lost),
            ..running()
        };
        let working = view(&|v| v.activity = Some(Working));
        #[rustfmt::skip]
        let rows: Vec<(&str, ExecutorRunningStatus, JournalNews, Option<Value>)> = vec![
            ("a prompt runs", running(), news("p1", working.clone(), None),
                Some(json!({"activity": "Working", "lastSeenAt": "1970-01-01T00:01:40Z"}))),
            ("the cursor alone is written with the next change", running(), news("p1", view(&|v| v.cursor = 9), None), None),
            ("the cursor goes with a change", running(), news("p1", view(&|v| { v.cursor = 9; v.activity = Some(Working) }), None),
                Some(json!({"activity": "Working", "journalCursor": 9}))),
            ("an older pod's follower", running(), news("p0", working.clone(), None), None),
            ("an executor marked lost meanwhile", lost, news("p1", working, None), None),
            ("a nudge read up to an idle agent", running(), news("p1", view(&|_| {}), Some("n1")),
                Some(json!({"handledPromptedAt": "n1"}))),
            ("a nudge handled already", ExecutorRunningStatus { handled_prompted_at: Some("n1".into()), ..running() },
                news("p1", view(&|_| {}), Some("n1")), None),
            ("a nudge over its bound", running(), news("p1", view(&|_| {}), Some(&"n".repeat(NUDGE_MAX + 1))), None),
            ("a new session drops the old one's message and configuration",
                ExecutorRunningStatus { resumable: false, ..running() },
                news("p1", view(&|v| *v = v.clone().with_session(Some("s2".into()))), None),
                Some(json!({"resumeToken": "s2", "resumable": true, "lastMessageUUID": null, "sessionConfig": null}))),
        ];
        for (name, current, news, want) in rows {
            let got = journal_update(&current, &news);
            match (got, want) {
                (None, None) => {}
                (Some(next), Some(want)) => {
                    let body = serde_json::to_value(&next).expect("json");
                    for (key, value) in want.as_object().expect("object") {
                        assert_eq!(
                            body.get(key).unwrap_or(&Value::Null),
                            value,
                            "{name}: {key}"
                        );
                    }
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn an_ended_executor_has_no_activity() {
        let next = ended(&running(), ExecutorPhase::Stopped, false);
        assert_eq!(
            (next.status, next.resumable, next.activity),
            (Some(ExecutorPhase::Stopped), false, None)
        );
        assert_eq!(
            next.resume_token.as_deref(),
            Some("s1"),
            "the token is kept"
        );
    }

    /// What an apply left that the desired status lacks is removed by a merge patch of nulls,
    /// at any depth; nothing is sent when nothing is left.
    #[test]
    fn leftovers_of_an_apply_are_removed() {
        let written = ExecutorRunningStatus {
            session_config: Some(SessionConfigState {
                mode: Some("plan".into()),
                model: Some("m".into()),
                config_options: vec![ConfigOptionValue {
                    id: "effort".into(),
                    value: "high".into(),
                }],
            }),
            ..running()
        };
        let desired = ExecutorRunningStatus {
            session_config: config("plan"),
            last_message_uuid: None,
            activity: None,
            ..running()
        };
        assert_eq!(
            leftovers(&written, &desired),
            Some(json!({"status": {
                "activity": null,
                "lastMessageUUID": null,
                "sessionConfig": {"model": null, "configOptions": null},
            }}))
        );
        assert_eq!(leftovers(&desired, &desired), None);
        assert_eq!(
            merge_patch(&written, &desired)["status"]["sessionConfig"],
            json!({"mode": "plan", "model": null, "configOptions": null})
        );
        assert_eq!(
            merge_patch(&written, &desired)["status"]["activity"],
            Value::Null
        );
        assert_eq!(
            merge_patch(&written, &desired)["status"]["resumeToken"],
            "s1"
        );
        assert_eq!(
            leftovers(
                &running(),
                &ExecutorRunningStatus {
                    worktree: Some(Default::default()),
                    ..running()
                }
            ),
            None,
            "more is not a leftover"
        );
    }

    #[test]
    fn an_older_schema_is_told_apart_from_other_refusals() {
        let unknown = "failed to create typed patch object (/; kandev.dev/v1alpha1, Kind=ExecutorRunning): .status.sessionConfig: field not declared in schema";
        #[rustfmt::skip]
        let rows = [
            (500, unknown, true),
            (500, "etcdserver: request timed out", false),
            (422, unknown, false),
            (409, "the object has been modified", false),
        ];
        for (code, message, want) in rows {
            assert_eq!(unknown_to_schema(code, message), want, "{code} {message}");
        }
    }
}
