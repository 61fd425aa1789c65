//! Liveness (docs/status.md "Liveness"): which sessions are at rest, and how soon a session that
//! is not is looked at again, whatever watch events arrive or fail to arrive.
//!
//! A session is at rest when nothing that the operator started on it, or was asked for, is
//! unfinished. Every other session has a reconcile scheduled within [`RECHECK`]: a watch event
//! moves it on sooner, but a lost or late one never leaves it waiting for good.

use std::time::Duration;

use crate::api::{RESUME_ANNOTATION, SessionState, TaskSession, TaskSessionStatus};

use super::handshake::is_new_resume_request;
use super::transition::Requeue;

/// The longest a session that is not at rest goes without a reconcile.
pub const RECHECK: Duration = Duration::from_secs(10);

/// What a session that is not at rest is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unrest {
    /// `spec.end` is not carried out yet.
    Ending,
    /// CREATED, STARTING, or a resume request latched.
    Launching,
    /// A new token in the resume annotation is not answered yet (on a running pod, it waits
    /// for agentctl to answer, or for the pod to count as lost).
    Requested,
}

/// Whether `session`, with `status`, is at rest: not CREATED or STARTING, no resume request
/// latched, no new resume token in its annotation, and no `spec.end` still to carry out.
pub fn at_rest(session: &TaskSession, status: &TaskSessionStatus) -> bool {
    unrest(session, status).is_none()
}

/// What `session`, with `status`, is doing while it is not at rest (`None`: at rest), in the
/// order the reconciler takes it up.
pub fn unrest(session: &TaskSession, status: &TaskSessionStatus) -> Option<Unrest> {
    if session.spec.end.is_some()
        && !matches!(
            status.state,
            SessionState::Completed | SessionState::Cancelled
        )
    {
        return Some(Unrest::Ending);
    }
    let requested = session
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESUME_ANNOTATION))
        .filter(|token| !token.is_empty())
        .is_some_and(|token| is_new_resume_request(token, status));
    if requested {
        Some(Unrest::Requested)
    } else if matches!(status.state, SessionState::Created | SessionState::Starting)
        || status.active_resume_request.is_some()
    {
        Some(Unrest::Launching)
    } else {
        None
    }
}

/// [`at_rest`] of a session as the cache holds it (no status yet: CREATED).
pub fn loaded_at_rest(session: &TaskSession) -> bool {
    match &session.status {
        Some(status) => at_rest(session, status),
        None => at_rest(session, &TaskSessionStatus::default()),
    }
}

/// A launch that waits for its deadline looks again when `until_deadline` has passed, but
/// within [`RECHECK`], and not sooner than half a second.
pub fn at_deadline(until_deadline: Duration) -> Requeue {
    Requeue::After(until_deadline.clamp(Duration::from_millis(500), RECHECK))
}

/// The requeue of a reconcile that found its session at rest or not (`was_at_rest`): a session
/// that was not is looked at again within [`RECHECK`], whatever the reconcile asked for.
pub fn bounded(requeue: Requeue, was_at_rest: bool) -> Requeue {
    if was_at_rest {
        return requeue;
    }
    match requeue {
        Requeue::After(delay) => Requeue::After(delay.min(RECHECK)),
        Requeue::Resync | Requeue::AwaitChange => Requeue::After(RECHECK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// time left until the deadline → when to look again
    #[test]
    fn a_launch_looks_again_at_its_deadline_within_bounds() {
        for (left, want) in [
            (0, 500),
            (300, 500),
            (500, 500),
            (4_000, 4_000),
            (10_000, 10_000),
            (60_000, 10_000),
        ] {
            assert_eq!(
                at_deadline(Duration::from_millis(left)),
                Requeue::After(Duration::from_millis(want)),
                "{left} ms"
            );
        }
    }
    use crate::api::{SessionEnd, TaskSessionSpec};
    use std::collections::BTreeMap;

    fn session(end: Option<SessionEnd>, annotation: Option<&str>) -> TaskSession {
        let mut ts = TaskSession::new(
            "s",
            TaskSessionSpec {
                end,
                ..TaskSessionSpec::default()
            },
        );
        ts.metadata.annotations = annotation
            .map(|token| BTreeMap::from([(RESUME_ANNOTATION.to_string(), token.to_string())]));
        ts
    }

    fn status(
        state: SessionState,
        active: Option<&str>,
        handled: Option<&str>,
    ) -> TaskSessionStatus {
        TaskSessionStatus {
            state,
            active_resume_request: active.map(str::to_string),
            last_handled_resume_request: handled.map(str::to_string),
            ..TaskSessionStatus::default()
        }
    }

    /// (what, end, annotation, state, latched, last handled, what it does: `None` at rest)
    type Row<'a> = (
        &'a str,
        Option<SessionEnd>,
        Option<&'a str>,
        SessionState,
        Option<&'a str>,
        Option<&'a str>,
        Option<Unrest>,
    );

    #[test]
    fn which_sessions_are_at_rest() {
        use SessionState as S;
        use Unrest::{Ending, Launching, Requested};
        #[rustfmt::skip]
        let rows: &[Row] = &[
            ("waiting for input", None, None, S::WaitingForInput, None, None, None),
            ("running a prompt", None, None, S::Running, None, None, None),
            ("lost, no request (lazy recovery)", None, Some("t1"), S::WaitingForInput, None, Some("t1"), None),
            ("failed", None, None, S::Failed, None, None, None),
            ("never launched", None, None, S::Created, None, None, Some(Launching)),
            ("launching", None, None, S::Starting, None, None, Some(Launching)),
            ("a latched request", None, Some("t2"), S::WaitingForInput, Some("t2"), Some("t1"), Some(Launching)),
            ("a new token not yet latched", None, Some("t2"), S::WaitingForInput, None, Some("t1"), Some(Requested)),
            ("a new token during a launch supersedes it first", None, Some("t3"), S::Starting, Some("t2"), Some("t1"), Some(Requested)),
            ("an empty annotation asks nothing", None, Some(""), S::WaitingForInput, None, None, None),
            ("a token on a terminal session until it is refused", None, Some("t2"), S::Failed, None, Some("t1"), Some(Requested)),
            ("spec.end not carried out", Some(SessionEnd::Completed), None, S::WaitingForInput, None, None, Some(Ending)),
            ("spec.end during a launch comes first", Some(SessionEnd::Cancelled), Some("t2"), S::Starting, Some("t2"), None, Some(Ending)),
            ("spec.end on a failed session", Some(SessionEnd::Cancelled), None, S::Failed, None, None, Some(Ending)),
            ("ended", Some(SessionEnd::Completed), None, S::Completed, None, None, None),
            ("ended, cancelled", Some(SessionEnd::Cancelled), None, S::Cancelled, None, None, None),
        ];
        for (what, end, annotation, state, latched, handled, doing) in rows {
            let ts = session(*end, *annotation);
            let status = status(*state, *latched, *handled);
            assert_eq!(unrest(&ts, &status), *doing, "{what}");
            assert_eq!(at_rest(&ts, &status), doing.is_none(), "{what}");
        }
        let fresh = session(None, None);
        assert!(
            !loaded_at_rest(&fresh),
            "a session without status is CREATED"
        );
    }

    #[test]
    fn a_session_not_at_rest_is_looked_at_again_within_the_recheck() {
        let second = Duration::from_secs(1);
        let long = Duration::from_secs(600);
        #[rustfmt::skip]
        let rows = [
            (Requeue::AwaitChange, true, Requeue::AwaitChange),
            (Requeue::Resync, true, Requeue::Resync),
            (Requeue::After(long), true, Requeue::After(long)),
            (Requeue::AwaitChange, false, Requeue::After(RECHECK)),
            (Requeue::Resync, false, Requeue::After(RECHECK)),
            (Requeue::After(long), false, Requeue::After(RECHECK)),
            (Requeue::After(second), false, Requeue::After(second)),
        ];
        for (asked, rest, expected) in rows {
            assert_eq!(bounded(asked, rest), expected, "{asked:?}, at rest: {rest}");
        }
    }

    /// No pure transition leaves a session that is not at rest waiting for a watch event: the
    /// steady state and the resume-request handshake, over every state, token, latch, pod and
    /// annotation (issue 31). Together with [`bounded`], which the reconciler applies to every
    /// outcome, no reconcile out of or into a state that is not at rest asks for no requeue.
    mod property {
        use super::*;
        use crate::api::AgentActivity;
        use crate::resume::objects::fixtures::{Given, P, at, objects};
        use crate::resume::{RequestAnswer, answer_request, observe};
        use proptest::prelude::*;

        const STATES: [SessionState; 7] = [
            SessionState::Created,
            SessionState::Starting,
            SessionState::Running,
            SessionState::WaitingForInput,
            SessionState::Completed,
            SessionState::Failed,
            SessionState::Cancelled,
        ];
        const PODS: [P; 5] = [P::None, P::Running, P::Pending, P::Terminating, P::Failed];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            #[test]
            fn no_transition_into_a_state_not_at_rest_awaits_a_change(
                state in 0usize..7,
                pod in 0usize..5,
                needs_resume: bool,
                token: bool,
                working: bool,
                end in 0usize..3,
                latched in 0usize..3,
                handled in 0usize..3,
                annotation in 0usize..4,
            ) {
                let tokens = [None, Some("t1"), Some("t2")];
                let long = "x".repeat(300);
                let annotations = [None, Some("t1"), Some("t2"), Some(long.as_str())];
                let ends = [None, Some(SessionEnd::Completed), Some(SessionEnd::Cancelled)];
                let given = Given {
                    state: STATES[state],
                    needs_resume,
                    token: token.then_some("acp-1"),
                    activity: Some(if working { AgentActivity::Working } else { AgentActivity::Idle }),
                    pod: PODS[pod],
                };
                let mut objects = objects(&given);
                let mut loaded = objects.status();
                loaded.active_resume_request = tokens[latched].map(str::to_string);
                loaded.last_handled_resume_request = tokens[handled].map(str::to_string);
                objects.session.status = Some(loaded.clone());
                objects.session.spec.end = ends[end];
                if let Some(value) = annotations[annotation] {
                    objects.session.metadata.annotations = Some(BTreeMap::from([(
                        RESUME_ANNOTATION.to_string(),
                        value.to_string(),
                    )]));
                }
                let mut transitions = vec![observe(&objects, None, at(10))];
                if let Some(value) = annotations[annotation] {
                    let latched_pod = objects.pods.first().and_then(|p| p.metadata.name.clone());
                    transitions.push(match answer_request(&objects, &loaded, value, latched_pod.as_deref(), at(10)) {
                        RequestAnswer::Done(t) | RequestAnswer::Latched(t) => t,
                    });
                }
                for t in transitions {
                    if !at_rest(&objects.session, &t.status) {
                        prop_assert_ne!(t.requeue, Requeue::AwaitChange, "{:?}", t.status);
                    }
                }
                prop_assert_ne!(
                    bounded(Requeue::AwaitChange, loaded_at_rest(&objects.session)) == Requeue::AwaitChange,
                    !loaded_at_rest(&objects.session)
                );
            }
        }
    }
}
