//! The start of a launch (DESIGN §3 "Resume execution", step 3): `STARTING` persisted with its
//! conditions and one Event before any pod exists, or the wait for a claimed workspace that does
//! not exist yet. Pure: each returns the [`Transition`] the reconciler applies.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{self, Want};
use crate::api::{SessionState, TaskSessionStatus};

use super::rest::{RECHECK, at_deadline};
use super::transition::{Note, Requeue, Transition, settle};

/// What the launch that begins is about.
#[derive(Clone, Copy, Debug)]
pub struct Begin<'a> {
    /// The agentctl pod this launch creates.
    pub pod: &'a str,
    /// The launch id: [`INITIAL_LAUNCH`] or the resume request's token.
    pub launch_id: &'a str,
    /// The ExecutorRunning of the session.
    pub executor: &'a str,
}

/// Launch id of a session's first launch (resumes use their request token).
pub const INITIAL_LAUNCH: &str = "initial";

/// `the first launch` or `resume request "<token>"`.
pub fn describe_launch(launch_id: &str) -> String {
    if launch_id == INITIAL_LAUNCH {
        "the first launch".to_string()
    } else {
        format!("resume request {launch_id:?}")
    }
}

/// `STARTING`, with `Reconciling=True/Starting` naming the pod to come. A loss's cause
/// (`AgentRunning`) and a suspension are over. One Event: `ResumeRequested` for a resume (it
/// names the request), `Starting` for the first launch.
pub fn launch_begun(
    current: &TaskSessionStatus,
    begin: &Begin,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let mut status = current.clone();
    status.state = SessionState::Starting;
    status.executor_ref = Some(begin.executor.to_string());
    status.error_message = None;
    let message = format!(
        "launching agentctl pod {} for {}",
        begin.pod,
        describe_launch(begin.launch_id)
    );
    let mut wanted = vec![
        Want::new(conditions::RECONCILING, true, "Starting", &message),
        Want::new(conditions::READY, false, "Starting", &message),
        Want::new(conditions::STALLED, false, "Starting", ""),
        // A new launch: the cause of an earlier loss (AgentUnreachable, NodeLost) is over.
        Want::new(conditions::AGENT_RUNNING, false, "PodNotRunning", ""),
        // And it takes the spec as it is now.
        Want::absent(conditions::SPEC_APPLIED),
    ];
    // And a suspension is over (the condition stays, False, once a session had it).
    if conditions::find(&status.conditions, conditions::SUSPENDED).is_some() {
        wanted.push(Want::new(conditions::SUSPENDED, false, "Resuming", ""));
    }
    settle(&mut status, &wanted, generation, now);
    let event = match status.active_resume_request.as_deref() {
        Some(token) => Note::normal(
            "ResumeRequested",
            "Resume",
            format!(
                "resume request {token:?} accepted; launching agentctl pod {}",
                begin.pod
            ),
        ),
        None => Note::normal("Starting", "Launch", message),
    };
    Transition {
        write: true,
        status,
        action: None,
        event: Some(event),
        metric: None,
        // The launch goes on in the same reconcile (the pod next); this is only its fallback.
        requeue: Requeue::After(RECHECK),
    }
}

/// The workspace PVC as a launch finds it (the claim cache first, a miss confirmed live).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimSeen {
    Present,
    Deleting,
    Absent,
}

/// What a launch knows of its workspace.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceFacts<'a> {
    pub claim: &'a str,
    pub namespace: &'a str,
    pub seen: ClaimSeen,
    /// The session ran on this workspace before (its ExecutorRunning recorded a pod).
    pub ran_before: bool,
    /// The UID of the PVC the session ran on, as its ExecutorRunning recorded it (sessions
    /// that ran before this was recorded have none).
    pub recorded_uid: Option<&'a str>,
    /// The UID of the PVC there now.
    pub uid: Option<&'a str>,
    /// The session names a template for its PVC (the operator creates it).
    pub from_template: bool,
}

/// The workspace step of a launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkspaceStep {
    Ready,
    /// The session's files went with the PVC: `FAILED` (reason `WorkspaceLost`), never a
    /// resume on an empty replacement.
    Lost(String),
    /// Create the PVC of the template.
    Create,
    /// A claimed PVC does not exist (yet) or is being deleted: wait ([`workspace_wait`]).
    Missing(String),
}

/// A session that ran before needs the workspace it ran on; before that, a launch creates the
/// PVC of a template and waits for a claimed one.
pub fn workspace_step(facts: &WorkspaceFacts) -> WorkspaceStep {
    let claim = facts.claim;
    match facts.seen {
        ClaimSeen::Present => match (facts.recorded_uid, facts.uid) {
            (Some(recorded), Some(uid)) if facts.ran_before && recorded != uid => {
                WorkspaceStep::Lost(format!(
                    "workspace PVC {claim:?} was deleted and created again (UID {uid}; the session ran on {recorded}): the session's files are not on it, so it is not resumed on an empty one"
                ))
            }
            _ => WorkspaceStep::Ready,
        },
        seen if facts.ran_before => {
            let gone = if seen == ClaimSeen::Deleting {
                "is being deleted"
            } else {
                "no longer exists"
            };
            WorkspaceStep::Lost(format!(
                "workspace PVC {claim:?} {gone}: the session's files went with it, so it is not resumed on an empty one"
            ))
        }
        ClaimSeen::Absent if facts.from_template => WorkspaceStep::Create,
        ClaimSeen::Deleting => {
            WorkspaceStep::Missing(format!("workspace PVC {claim:?} is being deleted"))
        }
        ClaimSeen::Absent => WorkspaceStep::Missing(format!(
            "workspace PVC {claim:?} not found in namespace {}",
            facts.namespace
        )),
    }
}

/// A first launch waits for its claimed workspace PVC (`what` says what is missing):
/// `Reconciling` says so, and `Stalled` (reason `WorkspaceMissing`, one Warning) once the
/// launch deadline has passed since the session was created (`age`). Nothing is persisted as
/// `STARTING`; the wait never ends the session, the PVC's appearance starts it. Written once,
/// not on every pass; looked at again by the deadline.
pub fn workspace_wait(
    current: &TaskSessionStatus,
    what: &str,
    age: Duration,
    deadline: Duration,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let mut status = current.clone();
    let stalled = age >= deadline;
    let message = if stalled {
        format!(
            "{what} {}s after the session was created; create it and the session starts",
            deadline.as_secs()
        )
    } else {
        format!("{what}; waiting for it")
    };
    let wanted = [
        Want::new(
            conditions::RECONCILING,
            true,
            "WaitingForWorkspace",
            &message,
        ),
        Want::new(
            conditions::STALLED,
            stalled,
            "WorkspaceMissing",
            if stalled { message.as_str() } else { "" },
        ),
    ];
    settle(&mut status, &wanted, generation, now);
    let write = status != *current;
    Transition {
        event: (write && stalled).then(|| Note::warning("WorkspaceMissing", "Launch", message)),
        write,
        status,
        action: None,
        metric: None,
        requeue: if stalled || !write {
            Requeue::After(RECHECK)
        } else {
            at_deadline(deadline.saturating_sub(age))
        },
    }
}

/// A first launch whose agent profile the operator does not know waits for it (`known`: the
/// profiles it has): `Stalled=True` and `Ready=False` with reason `UnknownProfile`, one Warning,
/// and the session stays `CREATED`. The operator's profiles change with its restart (the chart
/// rolls it when `agentProfiles` changes), whose first pass starts the session; until then it
/// is looked at again at [`RECHECK`], which costs no request. Written once, not on every pass.
pub fn profile_wait(
    current: &TaskSessionStatus,
    agent: &str,
    known: &[&str],
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let mut status = current.clone();
    let message = format!(
        "unknown agent profile {agent:?} (known: {}): the session starts once the operator has it (chart value agentProfiles, --agent-profiles)",
        known.join(", ")
    );
    let wanted = [
        Want::new(conditions::RECONCILING, false, UNKNOWN_PROFILE, ""),
        Want::new(conditions::STALLED, true, UNKNOWN_PROFILE, &message),
        Want::absent(conditions::READY),
    ];
    settle(&mut status, &wanted, generation, now);
    let write = status != *current;
    Transition {
        event: write.then(|| Note::warning(UNKNOWN_PROFILE, "Launch", message)),
        write,
        status,
        action: None,
        metric: None,
        requeue: Requeue::After(RECHECK),
    }
}

/// The reason of a launch whose agent profile the operator does not know.
pub const UNKNOWN_PROFILE: &str = "UnknownProfile";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resume::objects::fixtures::at;

    fn condition(t: &Transition, type_: &str) -> Option<(String, String, String)> {
        conditions::find(&t.status.conditions, type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    #[test]
    fn a_launch_begins_starting_with_one_event() {
        let begin = Begin {
            pod: "s-agent-1",
            launch_id: "r1",
            executor: "s",
        };
        let first = Begin {
            launch_id: INITIAL_LAUNCH,
            ..begin
        };
        let resume = TaskSessionStatus {
            active_resume_request: Some("r1".into()),
            error_message: Some("an old failure".into()),
            ..Default::default()
        };
        #[rustfmt::skip]
        let rows = [
            (&resume, begin, "ResumeRequested", "resume request \"r1\" accepted; launching agentctl pod s-agent-1"),
            (&TaskSessionStatus::default(), first, "Starting", "launching agentctl pod s-agent-1 for the first launch"),
        ];
        for (from, begin, reason, note) in rows {
            let t = launch_begun(from, &begin, Some(2), at(10));
            assert!(t.write);
            assert_eq!(t.status.state, SessionState::Starting);
            assert_eq!(t.status.executor_ref.as_deref(), Some("s"));
            assert_eq!(t.status.error_message, None);
            assert_eq!(t.status.observed_generation, Some(2));
            let event = t.event.clone().expect("one Event");
            assert_eq!((event.reason, event.message.as_str()), (reason, note));
            assert!(!event.warning);
            let (status, why, _) = condition(&t, conditions::RECONCILING).expect("Reconciling");
            assert_eq!((status.as_str(), why.as_str()), ("True", "Starting"));
            assert_eq!(condition(&t, conditions::SUSPENDED), None);
        }
        // A suspended session that launches again is no longer suspended.
        let suspended = TaskSessionStatus {
            conditions: conditions::merge(
                &[],
                &[Want::new(conditions::SUSPENDED, true, "Idle", "idle")],
                Some(1),
                at(1),
            ),
            ..Default::default()
        };
        let t = launch_begun(&suspended, &first, Some(1), at(10));
        let (status, why, _) = condition(&t, conditions::SUSPENDED).expect("Suspended");
        assert_eq!((status.as_str(), why.as_str()), ("False", "Resuming"));
    }

    #[test]
    fn a_missing_workspace_waits_then_stalls_once() {
        let s = Duration::from_secs;
        let what = "workspace PVC \"ws\" not found in namespace ns";
        let from = TaskSessionStatus::default();
        // (age) → stalled, requeue
        #[rustfmt::skip]
        let rows = [
            (s(0), false, Requeue::After(s(120).min(RECHECK))),
            (s(119), false, Requeue::After(s(1))),
            (s(120), true, Requeue::After(RECHECK)),
        ];
        for (age, stalled, requeue) in rows {
            let t = workspace_wait(&from, what, age, s(120), Some(1), at(10));
            assert!(t.write, "{age:?}");
            assert_eq!(t.requeue, requeue, "{age:?}");
            let (status, reason, message) = condition(&t, conditions::STALLED).expect("Stalled");
            assert_eq!(status == "True", stalled, "{age:?}");
            assert_eq!(reason, "WorkspaceMissing");
            assert_eq!(
                t.event.is_some(),
                stalled,
                "{age:?}: one Warning when it stalls"
            );
            if stalled {
                assert!(
                    message.contains("120s after the session was created"),
                    "{message}"
                );
            }
            assert_eq!(t.status.state, from.state, "nothing is launching yet");
            // The next pass finds nothing to write and says nothing again.
            let again = workspace_wait(&t.status, what, age, s(120), Some(1), at(20));
            assert!(!again.write, "{age:?}");
            assert_eq!(again.event, None, "{age:?}");
            assert_eq!(again.requeue, Requeue::After(RECHECK));
        }
    }

    #[test]
    fn an_unknown_profile_waits_and_stalls_once() {
        let from = TaskSessionStatus::default();
        let t = profile_wait(&from, "amp2", &["claude-code", "codex"], Some(1), at(10));
        assert!(t.write);
        assert_eq!(t.status.state, SessionState::Created, "not FAILED");
        let (status, reason, message) = condition(&t, conditions::STALLED).expect("Stalled");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "UnknownProfile")
        );
        assert!(
            message.contains("\"amp2\" (known: claude-code, codex)"),
            "{message}"
        );
        assert!(
            condition(&t, conditions::READY).is_none(),
            "no Ready: nothing runs"
        );
        let (status, _, _) = condition(&t, conditions::RECONCILING).expect("Reconciling");
        assert_eq!(status, "False", "kstatus: Failed, not InProgress");
        assert_eq!(t.event.as_ref().map(|e| e.reason), Some("UnknownProfile"));
        assert_eq!(t.requeue, Requeue::After(RECHECK));
        let again = profile_wait(
            &t.status,
            "amp2",
            &["claude-code", "codex"],
            Some(1),
            at(20),
        );
        assert!(
            !again.write && again.event.is_none(),
            "written and said once"
        );
    }

    #[test]
    fn workspace_steps() {
        use ClaimSeen::{Absent, Deleting, Present};
        let lost = |gone: &str| {
            WorkspaceStep::Lost(format!(
                "workspace PVC \"w\" {gone}: the session's files went with it, so it is not resumed on an empty one"
            ))
        };
        let cases = [
            // (name, seen, ran before, from a template, step)
            ("there", Present, false, false, WorkspaceStep::Ready),
            (
                "there, ran before",
                Present,
                true,
                true,
                WorkspaceStep::Ready,
            ),
            (
                "gone after a run",
                Absent,
                true,
                false,
                lost("no longer exists"),
            ),
            (
                "gone after a run, template: never an empty one",
                Absent,
                true,
                true,
                lost("no longer exists"),
            ),
            (
                "being deleted after a run",
                Deleting,
                true,
                true,
                lost("is being deleted"),
            ),
            (
                "template, first launch",
                Absent,
                false,
                true,
                WorkspaceStep::Create,
            ),
            (
                "template's PVC being deleted: wait, do not create",
                Deleting,
                false,
                true,
                WorkspaceStep::Missing("workspace PVC \"w\" is being deleted".into()),
            ),
            (
                "claimed, not there yet",
                Absent,
                false,
                false,
                WorkspaceStep::Missing("workspace PVC \"w\" not found in namespace ns".into()),
            ),
        ];
        for (name, seen, ran_before, from_template, want) in cases {
            let facts = WorkspaceFacts {
                claim: "w",
                namespace: "ns",
                seen,
                ran_before,
                recorded_uid: None,
                uid: Some("u1"),
                from_template,
            };
            assert_eq!(workspace_step(&facts), want, "{name}");
        }
    }

    /// A PVC of the same name is not the same workspace: one created again after the session ran
    /// is lost; the one it ran on, or one of a session that ran before UIDs were recorded, is
    /// ready; before the first launch nothing is compared.
    #[test]
    fn a_workspace_is_known_by_its_uid() {
        let step = |ran_before, recorded_uid, uid| {
            workspace_step(&WorkspaceFacts {
                claim: "w",
                namespace: "ns",
                seen: ClaimSeen::Present,
                ran_before,
                recorded_uid,
                uid,
                from_template: false,
            })
        };
        assert_eq!(step(true, Some("u1"), Some("u1")), WorkspaceStep::Ready);
        assert_eq!(step(true, None, Some("u2")), WorkspaceStep::Ready);
        assert_eq!(step(false, Some("u1"), Some("u2")), WorkspaceStep::Ready);
        assert_eq!(step(true, Some("u1"), None), WorkspaceStep::Ready);
        assert_eq!(
            step(true, Some("u1"), Some("u2")),
            WorkspaceStep::Lost(
                "workspace PVC \"w\" was deleted and created again (UID u2; the session ran on u1): the session's files are not on it, so it is not resumed on an empty one".into()
            )
        );
    }
}
