//! Ending a session (`spec.end`, "sessions that end"): the operator's next step, from what it
//! sees now. Pure; the reconciler gathers the facts and carries the step out, one per pass,
//! until nothing runs any more and the terminal state is written.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::PodLiveness;
use super::launch_end::finish_request;
use super::transition::{NextAction, Note, Requeue, Transition, settle};
use crate::api::conditions::{self, Want};
use crate::api::{
    ResumeReason, SessionEnd, SessionState, TaskSessionStatus, TaskState, WorkspaceRetention,
};

/// What the reconciler knows while a session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndFacts {
    pub end: SessionEnd,
    /// The session's current agentctl pod.
    pub pod: PodLiveness,
    /// A prompt is running (ExecutorRunning `activity: Working`, read from the journal).
    pub working: bool,
    /// How long the session has been ending.
    pub ending_for: Duration,
    /// How long a `Completed` session lets a running prompt finish.
    pub grace: Duration,
    /// The agent's session is known (a resume token): `session/cancel` can name it. Without
    /// one, a running prompt is stopped with its pod.
    pub has_token: bool,
}

/// The next step of ending a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndStep {
    /// Send ACP `session/cancel` for the running prompt, then look again.
    CancelPrompt,
    /// Let the running prompt finish; look again within this long.
    AwaitPrompt(Duration),
    /// Stop the agent: delete its pod (agentctl closes the agent's stdin, the history and the
    /// journal are on the volume already).
    StopPod,
    /// The pod is going: look again once it is gone.
    AwaitPodGone,
    /// Nothing runs: write COMPLETED or CANCELLED.
    Finish,
}

/// `Cancelled` cancels a running prompt at once; `Completed` lets it finish within the grace
/// period, then cancels it too. An idle or starting agent is stopped; nothing running means
/// the session is finished.
pub fn end_step(facts: &EndFacts) -> EndStep {
    match facts.pod {
        PodLiveness::Missing | PodLiveness::Failed => EndStep::Finish,
        PodLiveness::Terminating => EndStep::AwaitPodGone,
        PodLiveness::Pending => EndStep::StopPod,
        PodLiveness::Running if !facts.working => EndStep::StopPod,
        PodLiveness::Running => match facts.end {
            SessionEnd::Completed if facts.ending_for < facts.grace => {
                EndStep::AwaitPrompt(facts.grace - facts.ending_for)
            }
            SessionEnd::Completed | SessionEnd::Cancelled if facts.has_token => {
                EndStep::CancelPrompt
            }
            SessionEnd::Completed | SessionEnd::Cancelled => EndStep::StopPod,
        },
    }
}

/// Since when the session has been ending: the transition time of `Reconciling=True/Ending`,
/// written by [`ending_begun`]; `None` before that first pass.
pub fn ending_since(status: &TaskSessionStatus) -> Option<Timestamp> {
    conditions::find(&status.conditions, conditions::RECONCILING)
        .filter(|c| c.status == "True" && c.reason == "Ending")
        .map(|c| c.last_transition_time.0)
}

/// An ended session's workspace PVC is deleted only when the operator made it (a template)
/// and `workspace.retention` is `Delete`; a claimed PVC is the user's.
pub fn deletes_workspace(from_template: bool, retention: WorkspaceRetention) -> bool {
    from_template && retention == WorkspaceRetention::Delete
}

/// `Completed` or `Cancelled`, as `spec.end` says it.
pub fn end_word(end: SessionEnd) -> &'static str {
    match end {
        SessionEnd::Completed => "Completed",
        SessionEnd::Cancelled => "Cancelled",
    }
}

/// The first pass of an end: `Reconciling=True/Ending` (its transition time dates the grace
/// period), a latched resume request ended (`Resumed=False/SessionEnded`), and the running
/// pod's journal read so that a running prompt is known.
pub fn ending_begun(
    current: &TaskSessionStatus,
    end: SessionEnd,
    running_pod: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let mut status = current.clone();
    let mut wanted = Vec::new();
    if let Some(token) = status.active_resume_request.clone() {
        let ended = format!("resume request {token:?} ended by spec.end");
        wanted.push(Want::new(conditions::RESUMED, false, "SessionEnded", ended));
        finish_request(&mut status);
    }
    let message = format!("ending the session (spec.end: {})", end_word(end));
    wanted.push(Want::new(conditions::RECONCILING, true, "Ending", &message));
    settle(&mut status, &wanted, generation, now);
    Transition {
        write: true,
        status,
        action: running_pod.map(|pod| NextAction::ReadJournal {
            pod: pod.to_string(),
            nudge: format!("end:{}", end_word(end)),
        }),
        event: None,
        metric: None,
        requeue: Requeue::After(Duration::from_secs(2)),
    }
}

/// Nothing runs any more: `COMPLETED` or `CANCELLED` (the task too), not resumable, the
/// request handled, the followers stopped, one Event that says what became of the workspace
/// (`workspace`).
pub fn session_finished(
    current: &TaskSessionStatus,
    end: SessionEnd,
    workspace: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let (state, task_state) = match end {
        SessionEnd::Completed => (SessionState::Completed, TaskState::Completed),
        SessionEnd::Cancelled => (SessionState::Cancelled, TaskState::Cancelled),
    };
    let word = end_word(end);
    let message =
        format!("the session is {state} (spec.end: {word}); the agent is stopped, {workspace}");
    let mut status = current.clone();
    status.state = state;
    status.task_state = task_state;
    status.needs_resume = false;
    status.is_resumable = false;
    status.resume_reason = Some(ResumeReason::TerminalState);
    status.error_message = None;
    // What waited for a person went with the agent.
    status.pending_permissions.clear();
    finish_request(&mut status);
    let wanted = [
        Want::absent(conditions::READY),
        Want::new(conditions::AGENT_RUNNING, false, "Stopped", &message),
        Want::new(conditions::NEEDS_RESUME, false, "TerminalState", ""),
        Want::new(conditions::RECONCILING, false, word, ""),
        Want::new(conditions::STALLED, false, word, ""),
    ];
    let wanted: Vec<Want> = wanted
        .into_iter()
        .chain(super::observe::none_awaiting_approval(current))
        .collect();
    settle(&mut status, &wanted, generation, now);
    Transition {
        write: true,
        status,
        action: Some(NextAction::StopFollowing),
        event: Some(Note::normal("SessionEnded", "End", message)),
        metric: None,
        requeue: Requeue::AwaitChange,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EndStep as Step;
    use PodLiveness as Pod;
    use SessionEnd as End;

    #[test]
    fn end_steps() {
        let s = Duration::from_secs;
        #[rustfmt::skip]
        let rows = [
            // (end, pod, working, ending for, a token) → step; grace is 60 s.
            (End::Completed, Pod::Running, true, s(0), true, Step::AwaitPrompt(s(60))),
            (End::Completed, Pod::Running, true, s(45), true, Step::AwaitPrompt(s(15))),
            (End::Completed, Pod::Running, true, s(60), true, Step::CancelPrompt),
            (End::Cancelled, Pod::Running, true, s(0), true, Step::CancelPrompt),
            // No session to name in session/cancel: the prompt stops with the pod.
            (End::Cancelled, Pod::Running, true, s(0), false, Step::StopPod),
            (End::Completed, Pod::Running, true, s(60), false, Step::StopPod),
            (End::Completed, Pod::Running, false, s(0), true, Step::StopPod),
            (End::Cancelled, Pod::Running, false, s(0), true, Step::StopPod),
            (End::Cancelled, Pod::Pending, false, s(0), true, Step::StopPod),
            (End::Completed, Pod::Terminating, true, s(0), true, Step::AwaitPodGone),
            (End::Completed, Pod::Missing, true, s(0), true, Step::Finish),
            (End::Cancelled, Pod::Failed, false, s(0), false, Step::Finish),
        ];
        for (end, pod, working, ending_for, has_token, step) in rows {
            let facts = EndFacts {
                end,
                pod,
                working,
                ending_for,
                grace: s(60),
                has_token,
            };
            assert_eq!(end_step(&facts), step, "{facts:?}");
        }
    }

    #[test]
    fn only_a_workspace_the_operator_made_is_deleted_and_only_when_asked() {
        use WorkspaceRetention::{Delete, Retain};
        let rows = [
            (true, Delete, true),
            (true, Retain, false),
            (false, Delete, false),
            (false, Retain, false),
        ];
        for (from_template, retention, deleted) in rows {
            assert_eq!(
                deletes_workspace(from_template, retention),
                deleted,
                "{from_template} {retention:?}"
            );
        }
    }

    #[test]
    fn an_end_begins_by_ending_the_latched_request_and_reading_the_journal() {
        let at = crate::resume::objects::fixtures::at;
        let latched = TaskSessionStatus {
            state: SessionState::Starting,
            active_resume_request: Some("r1".into()),
            previous_state: Some(SessionState::Running),
            ..Default::default()
        };
        let t = ending_begun(&latched, End::Cancelled, Some("p"), Some(1), at(10));
        assert!(t.write);
        assert_eq!(t.status.active_resume_request, None);
        assert_eq!(t.status.last_handled_resume_request.as_deref(), Some("r1"));
        let resumed = conditions::find(&t.status.conditions, conditions::RESUMED).expect("Resumed");
        assert_eq!(
            (resumed.status.as_str(), resumed.reason.as_str()),
            ("False", "SessionEnded")
        );
        let ending =
            conditions::find(&t.status.conditions, conditions::RECONCILING).expect("Reconciling");
        assert_eq!(ending.reason, "Ending");
        assert_eq!(
            t.action,
            Some(NextAction::ReadJournal {
                pod: "p".into(),
                nudge: "end:Cancelled".into()
            })
        );
        let idle = ending_begun(
            &TaskSessionStatus::default(),
            End::Completed,
            None,
            Some(1),
            at(10),
        );
        assert_eq!(idle.action, None);
        assert!(conditions::find(&idle.status.conditions, conditions::RESUMED).is_none());
    }

    #[test]
    fn a_finished_session_is_terminal_and_says_what_became_of_the_workspace() {
        let at = crate::resume::objects::fixtures::at;
        let from = TaskSessionStatus {
            state: SessionState::Running,
            needs_resume: true,
            is_resumable: true,
            error_message: Some("old".into()),
            ..Default::default()
        };
        for (end, state, task) in [
            (
                End::Completed,
                SessionState::Completed,
                TaskState::Completed,
            ),
            (
                End::Cancelled,
                SessionState::Cancelled,
                TaskState::Cancelled,
            ),
        ] {
            let t = session_finished(
                &from,
                end,
                "workspace PVC s-workspace kept",
                Some(1),
                at(10),
            );
            assert_eq!((t.status.state, t.status.task_state), (state, task));
            assert!(!t.status.needs_resume && !t.status.is_resumable);
            assert_eq!(t.status.resume_reason, Some(ResumeReason::TerminalState));
            assert_eq!(t.status.error_message, None);
            assert_eq!(t.action, Some(NextAction::StopFollowing));
            assert_eq!(t.requeue, Requeue::AwaitChange);
            let event = t.event.expect("one Event");
            assert_eq!(event.reason, "SessionEnded");
            assert!(
                event
                    .message
                    .ends_with("the agent is stopped, workspace PVC s-workspace kept")
            );
            assert!(
                conditions::find(&t.status.conditions, conditions::READY).is_none(),
                "no Ready: nothing runs, nothing is in progress"
            );
            let stopped = conditions::find(&t.status.conditions, conditions::AGENT_RUNNING)
                .expect("AgentRunning");
            assert!(stopped.message.ends_with("workspace PVC s-workspace kept"));
        }
    }
}
