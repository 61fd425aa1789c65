//! The steady state (DESIGN §3 "Status evaluation"): no end requested, no resume request
//! latched, nothing launching. The live pod and what the agent last reported decide the
//! session's state, its conditions and whether its loss is declared now.

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{self, Want};
use crate::api::{AgentActivity, RESUME_ANNOTATION, SessionState, TaskState};

use super::transition::{Metric, NextAction, Note, Requeue, Transition};
use super::{PodLiveness, SessionObjects, evaluate_resume_eligibility, pod_liveness};

/// Decides the steady state of `objects` at `now`.
///
/// - A running pod: its journal is read (and followed while the agent works), and
///   RUNNING ↔ WAITING_FOR_INPUT (task IN_PROGRESS ↔ REVIEW) follow the agent's last reported
///   activity.
/// - The rules of [`evaluate_resume_eligibility`] set `needsResume`, `isResumable`,
///   `resumeReason` and the conditions `AgentRunning`, `NeedsResume`, `Ready`, `Reconciling`.
/// - A loss seen for the first time marks the ExecutorRunning `Lost`, counts it, and says so
///   in a Warning Event; nothing is relaunched (lazy recovery).
pub fn observe(objects: &SessionObjects, now: Timestamp) -> Transition {
    let loaded = objects.status();
    let mut status = loaded.clone();
    let pod = objects.current_pod();
    let running = pod_liveness(pod) == PodLiveness::Running;
    if running
        && matches!(
            status.state,
            SessionState::Running | SessionState::WaitingForInput
        )
    {
        match objects.executor_status().activity {
            Some(AgentActivity::Working) => {
                status.state = SessionState::Running;
                status.task_state = TaskState::InProgress;
            }
            Some(AgentActivity::Idle) => {
                status.state = SessionState::WaitingForInput;
                status.task_state = TaskState::Review;
            }
            None => {}
        }
    }
    let eval = evaluate_resume_eligibility(&objects.facts_with(&status, pod));
    let newly_lost = eval.needs_resume && !status.needs_resume;
    status.needs_resume = eval.needs_resume;
    status.is_resumable = eval.is_resumable || eval.needs_resume;
    status.resume_reason = Some(eval.reason);
    let (ready_reason, needs_message) = if eval.needs_resume {
        (
            "NeedsResume".to_string(),
            format!(
                "agent not running ({}); annotate {RESUME_ANNOTATION} to resume",
                eval.reason
            ),
        )
    } else {
        (
            conditions::camel(&status.state.as_str().to_ascii_lowercase()),
            String::new(),
        )
    };
    let generation = objects.session.metadata.generation;
    status.conditions = conditions::merge(
        &status.conditions,
        &[
            Want::new(
                conditions::AGENT_RUNNING,
                running,
                if running {
                    "PodRunning"
                } else {
                    "PodNotRunning"
                },
                "",
            ),
            Want::new(
                conditions::NEEDS_RESUME,
                eval.needs_resume,
                conditions::camel(eval.reason.as_str()),
                &needs_message,
            ),
            Want::new(
                conditions::READY,
                running && !status.state.is_terminal(),
                ready_reason,
                &needs_message,
            ),
            Want::new(conditions::RECONCILING, false, "Idle", ""),
        ],
        generation,
        now,
    );
    status.observed_generation = generation;
    let write = status != loaded;

    let mut transition = Transition {
        status,
        write,
        action: None,
        event: None,
        metric: None,
        requeue: Requeue::Resync,
    };
    if let Some(pod) = pod.filter(|_| running) {
        transition.action = Some(NextAction::Follow {
            pod: pod.metadata.name.clone().unwrap_or_default(),
        });
    } else if newly_lost {
        let pod_name = pod
            .and_then(|p| p.metadata.name.clone())
            .or(objects.executor_status().pod_name)
            .unwrap_or_default();
        transition.action = Some(NextAction::MarkExecutorLost {
            resumable: objects.resume_token().is_some(),
        });
        transition.metric = Some(Metric::AgentLost);
        transition.event = Some(Note {
            warning: true,
            reason: "AgentLost",
            action: "Observe",
            message: format!(
                "agentctl pod {pod_name} is gone ({}); nothing relaunched until a resume is requested",
                eval.reason
            ),
        });
    }
    transition
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ResumeReason;
    use crate::resume::objects::fixtures::{Given, P, at, objects};

    /// (given, state after, needsResume, reason, action, AgentLost event)
    type Row = (
        Given,
        SessionState,
        bool,
        ResumeReason,
        Option<NextAction>,
        bool,
    );

    #[test]
    fn steady_state_table() {
        use AgentActivity::{Idle, Working};
        use SessionState as S;
        let follow = || {
            Some(NextAction::Follow {
                pod: "s-agent-1".into(),
            })
        };
        let lost = |resumable| Some(NextAction::MarkExecutorLost { resumable });
        #[rustfmt::skip]
        let table: &[Row] = &[
            // A running agent is followed; its reported activity moves the state.
            (Given { state: S::WaitingForInput, needs_resume: false, token: Some("t"), activity: Some(Working), pod: P::Running },
                S::Running, false, ResumeReason::AlreadyRunning, follow(), false),
            (Given { state: S::Running, needs_resume: false, token: Some("t"), activity: Some(Idle), pod: P::Running },
                S::WaitingForInput, false, ResumeReason::AlreadyRunning, follow(), false),
            (Given { state: S::Running, needs_resume: false, token: Some("t"), activity: None, pod: P::Running },
                S::Running, false, ResumeReason::AlreadyRunning, follow(), false),
            // A pod that is going away is neither running nor lost.
            (Given { state: S::WaitingForInput, needs_resume: false, token: Some("t"), activity: Some(Idle), pod: P::Terminating },
                S::WaitingForInput, false, ResumeReason::AgentStopping, None, false),
            // Gone or dead: the loss is declared once, with the executor marked and an Event.
            (Given { state: S::WaitingForInput, needs_resume: false, token: Some("t"), activity: Some(Idle), pod: P::None },
                S::WaitingForInput, true, ResumeReason::AgentNotRunning, lost(true), true),
            (Given { state: S::Running, needs_resume: false, token: None, activity: Some(Working), pod: P::Failed },
                S::Running, true, ResumeReason::AgentNotRunningFreshStart, lost(false), true),
            // Declared before: nothing more is done.
            (Given { state: S::WaitingForInput, needs_resume: true, token: Some("t"), activity: None, pod: P::None },
                S::WaitingForInput, true, ResumeReason::AgentNotRunning, None, false),
            // Pending is on its way, not lost (the launch deadline handles a pod stuck there).
            (Given { state: S::WaitingForInput, needs_resume: false, token: Some("t"), activity: None, pod: P::Pending },
                S::WaitingForInput, false, ResumeReason::AlreadyRunning, None, false),
            // Terminal states are never offered a resume, and the activity does not move them;
            // a FAILED session with a token is offered one without a NeedsResume nag.
            (Given { state: S::Failed, needs_resume: false, token: None, activity: Some(Working), pod: P::None },
                S::Failed, false, ResumeReason::TerminalState, None, false),
            (Given { state: S::Failed, needs_resume: false, token: Some("t"), activity: None, pod: P::None },
                S::Failed, false, ResumeReason::FailedSessionResumable, None, false),
        ];
        for (given, state, needs_resume, reason, action, event) in table {
            let t = observe(&objects(given), at(10));
            let row = format!("{:?}/{:?}/{:?}", given.state, given.pod, given.activity);
            assert_eq!(t.status.state, *state, "{row}");
            assert_eq!(t.status.needs_resume, *needs_resume, "{row}");
            assert_eq!(t.status.resume_reason, Some(*reason), "{row}");
            assert_eq!(&t.action, action, "{row}");
            assert_eq!(t.event.is_some(), *event, "{row}");
            assert_eq!(t.metric.is_some(), *event, "{row}");
            assert_eq!(t.requeue, Requeue::Resync, "{row}");
            assert_eq!(
                conditions::is_true(&t.status.conditions, conditions::NEEDS_RESUME),
                *needs_resume,
                "{row}"
            );
        }
    }

    #[test]
    fn the_lost_event_names_the_recorded_pod_when_the_pod_is_gone() {
        let t = observe(
            &objects(&Given {
                state: SessionState::WaitingForInput,
                needs_resume: false,
                token: None,
                activity: None,
                pod: P::None,
            }),
            at(10),
        );
        let note = t.event.expect("an AgentLost event");
        assert!(note.warning);
        assert!(note.message.contains("s-agent-0"), "{}", note.message);
    }

    #[test]
    fn an_unchanged_steady_state_writes_nothing() {
        let given = Given {
            state: SessionState::WaitingForInput,
            needs_resume: false,
            token: Some("t"),
            activity: Some(AgentActivity::Idle),
            pod: P::Running,
        };
        let first = observe(&objects(&given), at(10));
        assert!(first.write, "the first pass writes the conditions");
        let mut again = objects(&given);
        again.session.status = Some(first.status.clone());
        let second = observe(&again, at(20));
        assert!(!second.write, "{:?}", second.status);
        assert_eq!(
            second.status, first.status,
            "no timestamp moves without a flip"
        );
    }

    #[test]
    fn a_new_generation_is_written_even_when_nothing_else_changed() {
        let given = Given {
            state: SessionState::WaitingForInput,
            needs_resume: true,
            token: Some("t"),
            activity: None,
            pod: P::None,
        };
        let settled = observe(&objects(&given), at(10)).status;
        let mut bumped = objects(&given);
        bumped.session.status = Some(settled);
        bumped.session.metadata.generation = Some(2);
        let t = observe(&bumped, at(20));
        assert!(t.write);
        assert_eq!(t.status.observed_generation, Some(2));
    }
}
