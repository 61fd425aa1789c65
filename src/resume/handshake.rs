//! The resume-request handshake of DESIGN §3: which annotation token is a new request, and the
//! bounded memory of handled tokens that makes re-applying an old one a no-op (a GitOps rollback
//! to an earlier manifest never triggers a resume), and the answer to a new request.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::bounds::keep_newest;
use crate::api::conditions::{self, Want};
use crate::api::{
    RESTART_ANNOTATION, RESUME_ANNOTATION, RESUME_FRESH_ANNOTATION, ResumeReason, SessionState,
    TaskSessionStatus,
};

use super::launch_end::answer_latched;
use super::rest::at_rest;
use super::stall::plain_stall;
use super::transition::{Metric, NextAction, Note, Requeue, ResumeOutcome, Transition};
use super::{SessionObjects, evaluate_resume_eligibility};

/// How many handled tokens a session remembers (DESIGN §2: "a bounded list of recently handled
/// tokens"). A rollback further back than this resumes again.
pub const HANDLED_TOKENS_KEPT: usize = 16;

/// The longest annotation token the operator acts on. A longer one is refused without being
/// copied into status or Events (only [`handled_key`] of it is).
pub const MAX_TOKEN_BYTES: usize = 256;

/// Whether the annotation's `token` asks for a resume: it is not the request being handled
/// (`activeResumeRequest`), nor one that joined its launch, nor the last handled one, nor one of
/// the recently handled ones (DESIGN §3). The one place that answers this, for the
/// reconciler, its rest check and the plugin.
pub fn is_new_resume_request(token: &str, status: &TaskSessionStatus) -> bool {
    let key = handled_key(token);
    status.active_resume_request.as_deref() != Some(key.as_str())
        && status.last_handled_resume_request.as_deref() != Some(key.as_str())
        && !status.joined_resume_requests.contains(&key)
        && !status.recent_resume_requests.contains(&key)
}

/// What status remembers of a token: the token itself, or for one longer than
/// [`MAX_TOKEN_BYTES`] a short fingerprint (its first 32 bytes on a character boundary, and its
/// length), so that a huge value is never copied and is refused once.
pub fn handled_key(token: &str) -> String {
    if token.len() <= MAX_TOKEN_BYTES {
        return token.to_string();
    }
    let mut end = 32;
    while !token.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes)", &token[..end], token.len())
}

/// Records `token` as handled: once, newest last, at most [`HANDLED_TOKENS_KEPT`] (the oldest go).
pub fn remember_handled(recently_handled: &mut Vec<String>, token: &str) {
    recently_handled.retain(|t| t != token);
    recently_handled.push(token.to_string());
    keep_newest(recently_handled, HANDLED_TOKENS_KEPT);
}

/// What the operator does with a new resume request token (DESIGN §3 handshake).
#[derive(Clone, Debug, PartialEq)]
pub enum RequestAnswer {
    /// Handled without a launch (refused, or the agent already runs), joining the latched
    /// request's launch, or superseding it: apply the transition, nothing more in this pass.
    Done(Transition),
    /// Latched: the launch goes on in the same pass from this transition's status, written
    /// first (with its Event) when a launch is already starting, so that the latch is
    /// persisted before the pod of this request exists. Otherwise the launch's own first write
    /// persists it together with `STARTING`.
    Latched(Transition),
}

/// Answers the annotation's new `token` on a session whose working status is `status`.
/// `latched_pod` is the pod of the request being handled, if it exists.
///
/// In order: a token longer than [`MAX_TOKEN_BYTES`] is refused (`InvalidToken`, only its
/// [`handled_key`] is kept); while a request is latched, the new one joins its launch when that
/// launch is progressing (not `Stalled`, its pod not plainly stuck) and both ask for the same
/// kind of start (a restore, or a fresh one by [`RESUME_FRESH_ANNOTATION`]), and otherwise
/// supersedes it (the old one counts as handled with `Resumed=False/Superseded`, its pod is
/// deleted after the write); a terminal session that the rules do not offer a resume is
/// refused (`TerminalState`); an agent that runs is acknowledged
/// (`Resumed=True/AlreadyRunning`), unless the request restarts it ([`RESTART_ANNOTATION`]
/// carries its token): then it is latched while the agent waits for input (the launch replaces
/// the running pod), and refused while a prompt runs (`AgentWorking`); anything else is
/// latched.
pub fn answer_request(
    objects: &SessionObjects,
    status: &TaskSessionStatus,
    token: &str,
    latched_pod: Option<&str>,
    now: Timestamp,
) -> RequestAnswer {
    let handled = |key: &str, resumed: bool, reason: &'static str, event: Note| {
        RequestAnswer::Done(request_handled(
            objects,
            status,
            key,
            (resumed, reason),
            event,
            now,
        ))
    };
    if token.len() > MAX_TOKEN_BYTES {
        let message = format!(
            "resume request refused: the {RESUME_ANNOTATION} value is {} bytes long, at most {MAX_TOKEN_BYTES} are accepted",
            token.len()
        );
        let event = Note::warning("ResumeRefused", "Resume", message);
        return handled(&handled_key(token), false, "InvalidToken", event);
    }
    let generation = objects.session.metadata.generation;
    if let Some(old) = status.active_resume_request.as_deref() {
        if joins(objects, status, latched_pod, (old, token)) {
            return RequestAnswer::Done(request_joined(status, old, token, generation, now));
        }
        let superseded = Superseding {
            old,
            new: token,
            latched_pod,
        };
        return RequestAnswer::Done(request_superseded(status, &superseded, generation, now));
    }
    let eval = evaluate_resume_eligibility(&objects.facts_with(status, objects.current_pod()));
    if status.state.is_terminal() && !eval.is_resumable {
        let message = format!(
            "resume request {token:?} refused: the session is {}",
            status.state
        );
        let event = Note::warning("ResumeRefused", "Resume", message);
        return handled(token, false, "TerminalState", event);
    }
    if eval.reason == ResumeReason::AlreadyRunning && status.state.is_active() {
        if objects.annotation(RESTART_ANNOTATION) != Some(token) {
            let message = format!("resume request {token:?}: the agent is already running");
            let event = Note::normal("AlreadyRunning", "Resume", message);
            return handled(token, true, "AlreadyRunning", event);
        }
        if status.state == SessionState::Running {
            let message = format!(
                "restart request {token:?} refused: a prompt is running; restart once the agent waits for input, or cancel the prompt first"
            );
            let event = Note::warning("ResumeRefused", "Resume", message);
            return handled(token, false, "AgentWorking", event);
        }
    }
    RequestAnswer::Latched(request_latched(status, token, generation, now))
}

/// A request answered without a launch under `key`: `Resumed` with `(resumed, reason)` and
/// the Event's message; a refusal during a launch (or before the first) lets it go on at once.
fn request_handled(
    objects: &SessionObjects,
    status: &TaskSessionStatus,
    key: &str,
    (resumed, reason): (bool, &'static str),
    event: Note,
    now: Timestamp,
) -> Transition {
    let mut next = status.clone();
    next.last_handled_resume_request = Some(key.to_string());
    remember_handled(&mut next.recent_resume_requests, key);
    let requeue = if at_rest(&objects.session, &next) {
        Requeue::AwaitChange
    } else {
        Requeue::After(Duration::from_millis(100))
    };
    let wanted = [Want::new(
        conditions::RESUMED,
        resumed,
        reason,
        &event.message,
    )];
    let generation = objects.session.metadata.generation;
    next.conditions = conditions::merge(&next.conditions, &wanted, generation, now);
    let outcome = if resumed {
        ResumeOutcome::AlreadyRunning
    } else {
        ResumeOutcome::Refused
    };
    Transition {
        status: next,
        write: true,
        action: None,
        event: Some(event),
        metric: Some(Metric::ResumeHandled(outcome)),
        requeue,
    }
}

/// Whether request `new` joins the launch of the latched request `old`: that launch is
/// progressing (not `Stalled`, and its pod, `latched_pod`, does not plainly fail to start: a
/// failed or ended launch is no longer latched), and both ask for the same kind of start. The
/// fresh flag names the request it belongs to, so `old` was fresh when it still carries `old`'s
/// token. A restart is a restore from a pod of the current spec, which the latched launch
/// makes too.
fn joins(
    objects: &SessionObjects,
    status: &TaskSessionStatus,
    latched_pod: Option<&str>,
    (old, new): (&str, &str),
) -> bool {
    let fresh = objects.annotation(RESUME_FRESH_ANNOTATION);
    let stuck = latched_pod
        .and_then(|name| {
            objects
                .pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
        })
        .is_some_and(|pod| plain_stall(pod).is_some());
    !stuck
        && !conditions::is_true(&status.conditions, conditions::STALLED)
        && (fresh == Some(old)) == (fresh == Some(new))
}

/// `new` joins the launch of the latched request `old`: remembered in
/// `joinedResumeRequests` (so that it is not new again) and answered with that launch's outcome
/// when it ends ([`super::finish_request`]). One write, with the Event that says so.
fn request_joined(
    status: &TaskSessionStatus,
    old: &str,
    new: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let mut next = status.clone();
    remember_handled(&mut next.joined_resume_requests, new);
    let message = format!("resume request {new:?} joins the launch of {old:?}, which answers both");
    let wanted = [Want::new(
        conditions::RECONCILING,
        true,
        "ResumeRequested",
        &message,
    )];
    next.conditions = conditions::merge(&next.conditions, &wanted, generation, now);
    Transition {
        status: next,
        write: true,
        action: None,
        event: Some(Note::normal("ResumeJoined", "Resume", message)),
        metric: Some(Metric::ResumeHandled(ResumeOutcome::Joined)),
        requeue: Requeue::After(Duration::from_millis(100)),
    }
}

/// A new request while another is latched.
struct Superseding<'a> {
    old: &'a str,
    new: &'a str,
    /// The old request's pod, if it exists.
    latched_pod: Option<&'a str>,
}

/// The old request (and those that joined it) is handled (`Resumed=False/Superseded`), the new
/// one latched, and the old request's pod deleted after the status; the new launch goes on at once (it waits for the
/// old pod to go).
fn request_superseded(
    status: &TaskSessionStatus,
    superseding: &Superseding,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let Superseding {
        old,
        new,
        latched_pod,
    } = *superseding;
    let mut next = status.clone();
    // The old request and those that joined it are answered: superseded.
    answer_latched(&mut next);
    next.active_resume_request = Some(new.to_string());
    let deleting = latched_pod
        .map(|pod| format!("; deleting its pod {pod}"))
        .unwrap_or_default();
    let message = format!("resume request {new:?} supersedes {old:?}{deleting}");
    let wanted = [
        Want::new(conditions::RESUMED, false, "Superseded", &message),
        Want::new(conditions::RECONCILING, true, "ResumeRequested", &message),
        Want::new(conditions::STALLED, false, "Superseded", ""),
    ];
    next.conditions = conditions::merge(&next.conditions, &wanted, generation, now);
    Transition {
        status: next,
        write: true,
        action: latched_pod.map(|pod| NextAction::DeletePod {
            pod: pod.to_string(),
        }),
        event: Some(Note::normal("ResumeSuperseded", "Resume", message)),
        metric: Some(Metric::ResumeHandled(ResumeOutcome::Superseded)),
        requeue: Requeue::After(Duration::from_millis(100)),
    }
}

/// `token` is latched; the launch writes it with `STARTING` (one write), except while a
/// launch is persisted as `STARTING` already (an interrupted one), where it is written now.
fn request_latched(
    status: &TaskSessionStatus,
    token: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Transition {
    let mut next = status.clone();
    next.active_resume_request = Some(token.to_string());
    let wanted = [Want::new(
        conditions::RECONCILING,
        true,
        "ResumeRequested",
        format!("handling resume request {token:?}"),
    )];
    next.conditions = conditions::merge(&next.conditions, &wanted, generation, now);
    let starting = status.state == SessionState::Starting;
    Transition {
        status: next,
        write: starting,
        action: None,
        event: starting.then(|| {
            Note::normal(
                "ResumeRequested",
                "Resume",
                format!("resume request {token:?} accepted"),
            )
        }),
        metric: None,
        requeue: Requeue::After(Duration::from_millis(100)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    use crate::api::{AgentActivity, names};
    use crate::resume::finish_request;
    use crate::resume::objects::fixtures::{Given, P, at, objects};

    fn given(state: SessionState, token: Option<&'static str>, pod: P) -> Given {
        Given {
            state,
            needs_resume: false,
            token,
            activity: Some(AgentActivity::Idle),
            pod,
        }
    }

    /// Answers `token` for a session in `given`, with `active` latched.
    fn answer(
        given: &Given,
        active: Option<&str>,
        token: &str,
        pod: Option<&str>,
    ) -> RequestAnswer {
        let mut objects = objects(given);
        if let Some(status) = objects.session.status.as_mut() {
            status.active_resume_request = active.map(String::from);
        }
        answer_request(&objects, &objects.status(), token, pod, at(10))
    }

    /// The launch of `status` stalled (its pod cannot pull its image).
    fn stall(status: &mut TaskSessionStatus) {
        let stalled = [Want::new(
            conditions::STALLED,
            true,
            "ImagePullBackOff",
            "x",
        )];
        status.conditions = conditions::merge(&status.conditions, &stalled, Some(1), at(5));
    }

    /// [`is_new_resume_request`] on a status with these request fields.
    fn is_new(token: &str, active: Option<&str>, last: Option<&str>, recent: &[String]) -> bool {
        let status = TaskSessionStatus {
            active_resume_request: active.map(String::from),
            last_handled_resume_request: last.map(String::from),
            recent_resume_requests: recent.to_vec(),
            ..Default::default()
        };
        is_new_resume_request(token, &status)
    }

    fn done(answer: RequestAnswer) -> Transition {
        match answer {
            RequestAnswer::Done(t) => t,
            RequestAnswer::Latched(t) => panic!("latched, expected handled: {t:?}"),
        }
    }

    fn resumed(t: &Transition) -> (String, String) {
        let c = conditions::find(&t.status.conditions, conditions::RESUMED).expect("Resumed");
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn requests_that_are_handled_without_a_launch() {
        use SessionState as S;
        /// (session, token, handled key, Resumed, reason, Event reason, warning, outcome)
        type Row = (
            Given,
            String,
            String,
            &'static str,
            &'static str,
            &'static str,
            bool,
            ResumeOutcome,
        );
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            (given(S::WaitingForInput, Some("t"), P::None), long.clone(), handled_key(&long),
                "False", "InvalidToken", "ResumeRefused", true, ResumeOutcome::Refused),
            (given(S::Completed, Some("t"), P::None), "r1".into(), "r1".into(),
                "False", "TerminalState", "ResumeRefused", true, ResumeOutcome::Refused),
            (given(S::Failed, None, P::None), "r1".into(), "r1".into(),
                "False", "TerminalState", "ResumeRefused", true, ResumeOutcome::Refused),
            (given(S::WaitingForInput, Some("t"), P::Running), "r1".into(), "r1".into(),
                "True", "AlreadyRunning", "AlreadyRunning", false, ResumeOutcome::AlreadyRunning),
        ];
        for (g, token, key, status, reason, event, warning, outcome) in rows {
            let t = done(answer(&g, None, &token, None));
            let row = format!("{:?}/{:?}", g.state, g.pod);
            assert!(t.write, "{row}");
            assert_eq!(
                t.status.last_handled_resume_request.as_deref(),
                Some(key.as_str()),
                "{row}"
            );
            assert!(t.status.recent_resume_requests.contains(&key), "{row}");
            assert_eq!(t.status.active_resume_request, None, "{row}");
            assert_eq!(
                resumed(&t),
                (status.to_string(), reason.to_string()),
                "{row}"
            );
            let note = t.event.expect("an Event");
            assert_eq!((note.reason, note.warning), (event, warning), "{row}");
            assert!(
                !note.message.contains(&long),
                "a huge token is never copied: {row}"
            );
            assert_eq!(t.metric, Some(Metric::ResumeHandled(outcome)), "{row}");
            assert_eq!(t.action, None, "{row}");
            assert_eq!(t.requeue, Requeue::AwaitChange, "{row}");
        }
    }

    /// A new token on a stalled launch: the old request is handled as superseded, together
    /// with the requests that had joined it, and its pod is deleted after the write.
    #[test]
    fn a_new_token_supersedes_a_stalled_launch_and_deletes_its_pod_after_the_write() {
        let g = given(SessionState::Starting, Some("t"), P::Pending);
        for pod in [Some("s-agent-a"), None] {
            let objects = objects(&g);
            let mut status = objects.status();
            status.active_resume_request = Some("a".into());
            status.joined_resume_requests = vec!["j".into()];
            stall(&mut status);
            let t = done(answer_request(&objects, &status, "b", pod, at(10)));
            assert!(t.write);
            assert_eq!(t.status.active_resume_request.as_deref(), Some("b"));
            assert_eq!(t.status.recent_resume_requests, ["a", "j"]);
            assert_eq!(t.status.last_handled_resume_request.as_deref(), Some("j"));
            assert!(t.status.joined_resume_requests.is_empty());
            assert_eq!(resumed(&t), ("False".into(), "Superseded".into()));
            assert!(!conditions::is_true(
                &t.status.conditions,
                conditions::STALLED
            ));
            assert_eq!(
                t.action,
                pod.map(|p| NextAction::DeletePod { pod: p.into() })
            );
            let note = t.event.expect("ResumeSuperseded");
            assert_eq!(note.reason, "ResumeSuperseded");
            assert_eq!(note.message.contains("deleting its pod"), pod.is_some());
            assert_eq!(
                t.metric,
                Some(Metric::ResumeHandled(ResumeOutcome::Superseded))
            );
        }
    }

    /// How the launch in flight fares in [`answer_while_launching`].
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Launch {
        Progressing,
        /// `Stalled=True`.
        Stalled,
        /// Its pod cannot be scheduled (before the launch deadline: not `Stalled` yet).
        Unschedulable,
    }

    /// Answers `new` with `old` latched, on a starting session whose launch's pod (s-agent-1) is
    /// pending as `launch` says, with `kandev.dev/resume-fresh` set to `fresh`.
    fn answer_while_launching(launch: Launch, fresh: Option<&str>) -> Transition {
        let g = given(SessionState::Starting, Some("t"), P::Pending);
        let mut objects = objects(&g);
        if launch == Launch::Unschedulable {
            let status = objects.pods[0].status.as_mut().expect("pod status");
            status.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/1 nodes are available".into()),
                ..Default::default()
            }]);
        }
        if let Some(flag) = fresh {
            objects.session.metadata.annotations =
                Some([(RESUME_FRESH_ANNOTATION.to_string(), flag.to_string())].into());
        }
        let mut status = objects.status();
        status.active_resume_request = Some("a".into());
        if launch == Launch::Stalled {
            stall(&mut status);
        }
        done(answer_request(
            &objects,
            &status,
            "b",
            Some("s-agent-1"),
            at(10),
        ))
    }

    /// A new token joins the launch in flight when that launch progresses and both ask for the
    /// same kind of start; a stalled launch, one whose pod plainly cannot start, or a fresh
    /// start against a restore (either way), is superseded.
    #[test]
    fn a_new_token_joins_a_progressing_launch_of_the_same_kind_and_supersedes_the_others() {
        #[rustfmt::skip]
        let rows: [(Launch, Option<&str>, ResumeOutcome); 7] = [
            (Launch::Progressing, None, ResumeOutcome::Joined),
            // A leftover flag of an older request is neither's.
            (Launch::Progressing, Some("z"), ResumeOutcome::Joined),
            (Launch::Progressing, Some("a"), ResumeOutcome::Superseded),
            (Launch::Progressing, Some("b"), ResumeOutcome::Superseded),
            (Launch::Stalled, None, ResumeOutcome::Superseded),
            (Launch::Stalled, Some("b"), ResumeOutcome::Superseded),
            (Launch::Unschedulable, None, ResumeOutcome::Superseded),
        ];
        for (launch, fresh, outcome) in rows {
            let row = format!("{launch:?}, fresh flag {fresh:?}");
            let t = answer_while_launching(launch, fresh);
            assert!(t.write, "{row}");
            assert_eq!(t.metric, Some(Metric::ResumeHandled(outcome)), "{row}");
            let note = t.event.expect("an Event");
            if outcome == ResumeOutcome::Joined {
                assert_eq!(
                    t.status.active_resume_request.as_deref(),
                    Some("a"),
                    "{row}"
                );
                assert_eq!(t.status.joined_resume_requests, ["b"], "{row}");
                assert_eq!(t.status.last_handled_resume_request, None, "{row}");
                assert!(t.status.recent_resume_requests.is_empty(), "{row}");
                assert_eq!(t.action, None, "the launch's pod stays: {row}");
                assert_eq!(note.reason, "ResumeJoined", "{row}");
                assert!(!is_new_resume_request("b", &t.status), "{row}");
                // Answered with the launch's outcome when it ends, the newest token last.
                let mut ended = t.status.clone();
                finish_request(&mut ended);
                assert_eq!(ended.recent_resume_requests, ["a", "b"], "{row}");
                assert_eq!(
                    ended.last_handled_resume_request.as_deref(),
                    Some("b"),
                    "{row}"
                );
                assert!(ended.joined_resume_requests.is_empty(), "{row}");
            } else {
                assert_eq!(
                    t.status.active_resume_request.as_deref(),
                    Some("b"),
                    "{row}"
                );
                assert_eq!(
                    t.status.last_handled_resume_request.as_deref(),
                    Some("a"),
                    "{row}"
                );
                assert_eq!(
                    t.action,
                    Some(NextAction::DeletePod {
                        pod: "s-agent-1".into()
                    }),
                    "{row}"
                );
                assert_eq!(note.reason, "ResumeSuperseded", "{row}");
            }
        }
    }

    /// One step of the storm model below.
    #[derive(Clone, Debug)]
    enum Step {
        /// A client writes a new token; `fresh`: with the fresh flag naming it (as `kubectl
        /// kandev resume --fresh` does), else clearing the flag (as a plain resume does).
        Token { fresh: bool },
        /// The operator reconciles once.
        Reconcile,
        /// The launch in flight stalls (its pod cannot start).
        Stall,
    }

    /// A lost session, the annotations and pods the operator sees, and what its passes did.
    struct Storm {
        status: TaskSessionStatus,
        annotation: Option<String>,
        fresh_flag: Option<String>,
        /// Live pods: (name, running).
        pods: Vec<(String, bool)>,
        /// Passes the launch in flight has made; it ends after three.
        progress: u32,
        observed: Vec<String>,
        answered: std::collections::BTreeMap<String, u32>,
        pods_created: u32,
        issued: u32,
        /// Launches the rule allows: the first, and one per request that arrived when the
        /// launch in flight had stalled or was of the other kind. (The old rule, a launch per
        /// request, makes more pods than this.)
        launches_expected: u32,
    }

    impl Storm {
        fn new() -> Self {
            Self {
                status: TaskSessionStatus {
                    state: SessionState::WaitingForInput,
                    needs_resume: true,
                    ..Default::default()
                },
                annotation: None,
                fresh_flag: None,
                pods: Vec::new(),
                progress: 0,
                observed: Vec::new(),
                answered: Default::default(),
                pods_created: 0,
                issued: 0,
                launches_expected: 0,
            }
        }

        fn objects(&self) -> SessionObjects {
            let running = self.pods.iter().any(|(_, running)| *running);
            let g = given(
                self.status.state,
                Some("acp-1"),
                if running { P::Running } else { P::None },
            );
            let mut objects = objects(&g);
            let mut annotations = std::collections::BTreeMap::new();
            if let Some(token) = &self.annotation {
                annotations.insert(RESUME_ANNOTATION.to_string(), token.clone());
            }
            if let Some(flag) = &self.fresh_flag {
                annotations.insert(RESUME_FRESH_ANNOTATION.to_string(), flag.clone());
            }
            objects.session.metadata.annotations = Some(annotations);
            objects.session.status = Some(self.status.clone());
            objects
        }

        fn handled(status: &TaskSessionStatus) -> std::collections::BTreeSet<String> {
            status
                .recent_resume_requests
                .iter()
                .chain(&status.last_handled_resume_request)
                .cloned()
                .collect()
        }

        /// Applies `next` as the operator's write, counting the tokens it answers.
        fn write(&mut self, next: TaskSessionStatus) {
            let before = Self::handled(&self.status);
            for token in Self::handled(&next) {
                if !before.contains(&token) {
                    *self.answered.entry(token).or_default() += 1;
                }
            }
            self.status = next;
        }

        fn step(&mut self, step: &Step) {
            match step {
                Step::Token { fresh } => {
                    self.issued += 1;
                    let token = format!("t{}", self.issued);
                    self.fresh_flag = fresh.then(|| token.clone());
                    self.annotation = Some(token);
                }
                Step::Stall => {
                    let launching = self.status.active_resume_request.as_deref();
                    let pod = launching.map(|active| names::pod_name("s", active));
                    if pod.is_some_and(|pod| self.pods.iter().any(|(name, _)| *name == pod)) {
                        stall(&mut self.status);
                    }
                }
                Step::Reconcile => self.reconcile(),
            }
        }

        fn reconcile(&mut self) {
            if let Some(token) = self.annotation.clone()
                && is_new_resume_request(&token, &self.status)
            {
                self.observed.push(token.clone());
                if let Some(active) = self.status.active_resume_request.clone() {
                    let fresh = |t: &str| self.fresh_flag.as_deref() == Some(t);
                    let stalled = conditions::is_true(&self.status.conditions, conditions::STALLED);
                    if stalled || fresh(&active) != fresh(&token) {
                        self.launches_expected += 1;
                    }
                } else if self.status.needs_resume {
                    self.launches_expected += 1;
                }
                let objects = self.objects();
                let latched_pod = self
                    .status
                    .active_resume_request
                    .as_deref()
                    .map(|active| names::pod_name("s", active))
                    .filter(|pod| self.pods.iter().any(|(name, _)| name == pod));
                match answer_request(
                    &objects,
                    &self.status,
                    &token,
                    latched_pod.as_deref(),
                    at(10),
                ) {
                    RequestAnswer::Done(t) => {
                        if let Some(NextAction::DeletePod { pod }) = &t.action {
                            self.pods.retain(|(name, _)| name != pod);
                        }
                        self.write(t.status);
                        return;
                    }
                    RequestAnswer::Latched(t) => {
                        let mut next = t.status;
                        next.state = SessionState::Starting;
                        self.progress = 0;
                        self.write(next);
                    }
                }
            }
            let Some(active) = self.status.active_resume_request.clone() else {
                return;
            };
            // The launch: an earlier pod goes first, then this request's pod, then the restore.
            let pod = names::pod_name("s", &active);
            if self.pods.iter().any(|(name, _)| *name != pod) {
                self.pods.retain(|(name, _)| *name == pod);
                return;
            }
            if self.pods.is_empty() {
                self.pods.push((pod, false));
                self.pods_created += 1;
                return;
            }
            if conditions::is_true(&self.status.conditions, conditions::STALLED) {
                return;
            }
            self.progress += 1;
            if self.progress >= 3 {
                let mut next = self.status.clone();
                finish_request(&mut next);
                next.state = SessionState::WaitingForInput;
                next.needs_resume = false;
                self.pods[0].1 = true;
                self.write(next);
            }
        }
    }

    fn storm_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Token { fresh: false }),
            1 => Just(Step::Token { fresh: true }),
            6 => Just(Step::Reconcile),
            1 => Just(Step::Stall),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any interleaving of tokens with the operator's passes and stalls ends with the
        /// session handled on its last token, one pod, every token the operator saw answered
        /// exactly once, and a new launch only where the rule allows one.
        #[test]
        fn any_storm_ends_on_its_last_token_with_one_pod_and_every_token_answered_once(
            steps in proptest::collection::vec(storm_step(), 1..40),
        ) {
            let mut storm = Storm::new();
            storm.step(&Step::Token { fresh: false });
            for step in &steps {
                storm.step(step);
            }
            // The launch stalled on a pod that cannot start: a user asks once more.
            if conditions::is_true(&storm.status.conditions, conditions::STALLED) {
                storm.step(&Step::Token { fresh: false });
            }
            for _ in 0..20 {
                storm.step(&Step::Reconcile);
            }
            let last = storm.annotation.clone().expect("a token");
            prop_assert_eq!(storm.status.last_handled_resume_request.as_deref(), Some(last.as_str()));
            prop_assert_eq!(storm.status.active_resume_request.as_deref(), None);
            prop_assert!(storm.status.joined_resume_requests.is_empty());
            prop_assert_eq!(storm.pods.len(), 1, "{:?}", storm.pods);
            for token in &storm.observed {
                prop_assert_eq!(storm.answered.get(token).copied(), Some(1), "{} of {:?}", token, storm.answered);
            }
            prop_assert_eq!(storm.answered.len(), storm.observed.len());
            // A launch superseded before its pod existed made none.
            prop_assert!(storm.pods_created <= storm.launches_expected, "{} pods for {} launches", storm.pods_created, storm.launches_expected);
        }
    }

    #[test]
    fn a_request_to_launch_is_latched_and_persisted_at_once_only_while_starting() {
        use SessionState as S;
        for (g, write) in [
            // Lost: the launch's own first write persists the latch with STARTING.
            (given(S::WaitingForInput, Some("t"), P::None), false),
            // FAILED with a token and a resumable executor is offered a resume.
            (given(S::Failed, Some("t"), P::None), false),
            // A launch is already starting: its next pod is this request's, so the latch first.
            (given(S::Starting, Some("t"), P::None), true),
        ] {
            let RequestAnswer::Latched(t) = answer(&g, None, "r1", None) else {
                panic!("{:?}: expected a latch", g.state);
            };
            assert_eq!(t.status.active_resume_request.as_deref(), Some("r1"));
            assert_eq!(t.status.last_handled_resume_request, None);
            assert_eq!(t.write, write, "{:?}", g.state);
            assert_eq!(t.event.is_some(), write, "{:?}", g.state);
            assert!(conditions::is_true(
                &t.status.conditions,
                conditions::RECONCILING
            ));
        }
    }

    /// A restart request ([`RESTART_ANNOTATION`] carries its token) on an agent that waits for
    /// input is latched (the launch replaces the pod); one while a prompt runs is refused; a
    /// flag of another request, or on a lost agent, changes nothing.
    #[test]
    fn a_restart_replaces_a_waiting_agent_and_never_a_working_one() {
        use SessionState as S;
        let restart = |g: &Given, flag: &str, token: &str| {
            let mut objects = objects(g);
            objects.session.metadata.annotations =
                Some([(RESTART_ANNOTATION.to_string(), flag.to_string())].into());
            answer_request(&objects, &objects.status(), token, None, at(10))
        };
        let waiting = given(S::WaitingForInput, Some("t"), P::Running);
        let RequestAnswer::Latched(t) = restart(&waiting, "r1", "r1") else {
            panic!("a restart of a waiting agent is latched");
        };
        assert_eq!(t.status.active_resume_request.as_deref(), Some("r1"));
        let working = given(S::Running, Some("t"), P::Running);
        let t = done(restart(&working, "r1", "r1"));
        assert_eq!(resumed(&t), ("False".into(), "AgentWorking".into()));
        assert_eq!(t.status.last_handled_resume_request.as_deref(), Some("r1"));
        let note = t.event.expect("an Event");
        assert!(note.warning && note.message.contains("a prompt is running"));
        // The flag of an earlier request: a plain request on a running agent.
        let t = done(restart(&waiting, "r0", "r1"));
        assert_eq!(resumed(&t), ("True".into(), "AlreadyRunning".into()));
        // A lost agent: a plain resume.
        let lost = given(S::WaitingForInput, Some("t"), P::None);
        assert!(matches!(
            restart(&lost, "r1", "r1"),
            RequestAnswer::Latched(_)
        ));
    }

    fn tokens(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn which_token_is_a_new_request() {
        /// (token, active, last handled, recently handled, new?)
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            &'a [&'a str],
            bool,
        );
        let cases: [Case; 8] = [
            ("a", None, None, &[], true),
            ("b", None, Some("a"), &["a"], true),
            // The same token again: handled once (DESIGN §3).
            ("a", None, Some("a"), &["a"], false),
            // GitOps rollback: apply A, apply B, re-apply A.
            ("a", None, Some("b"), &["a", "b"], false),
            // Status written before the list existed: the last handled token still counts.
            ("a", None, Some("a"), &[], false),
            // A request is latched: a new token supersedes it, the same one is no news.
            ("c", Some("b"), Some("a"), &["a"], true),
            ("b", Some("b"), Some("a"), &["a"], false),
            // …and the superseded one, once remembered, is a no-op when re-applied.
            ("b", Some("c"), Some("b"), &["a", "b"], false),
        ];
        for (token, active, last, recent, want) in cases {
            assert_eq!(
                is_new(token, active, last, &tokens(recent)),
                want,
                "token {token:?}, active {active:?}, last {last:?}, recent {recent:?}"
            );
        }
    }

    #[test]
    fn an_oversized_token_is_remembered_by_a_short_key() {
        let exact = "x".repeat(MAX_TOKEN_BYTES);
        assert_eq!(handled_key(&exact), exact);
        let huge = format!("{}{}", "é".repeat(20), "y".repeat(1 << 20));
        let key = handled_key(&huge);
        assert!(key.len() < 64, "{key}");
        assert!(key.starts_with(&"é".repeat(16)), "{key}");
        assert!(key.ends_with(&format!("({} bytes)", huge.len())), "{key}");
        // Refused once: the remembered key makes the same value no news.
        assert!(is_new(&huge, None, None, &[]));
        assert!(!is_new(&huge, None, Some(&key), &[]));
        assert!(!is_new(&huge, None, None, &tokens(&[&key])));
    }

    #[test]
    fn handled_tokens_are_kept_once_newest_last_and_bounded() {
        let mut recent = Vec::new();
        remember_handled(&mut recent, "a");
        remember_handled(&mut recent, "b");
        remember_handled(&mut recent, "a");
        assert_eq!(recent, tokens(&["b", "a"]));
        for i in 0..HANDLED_TOKENS_KEPT + 3 {
            remember_handled(&mut recent, &format!("t{i}"));
        }
        assert_eq!(recent.len(), HANDLED_TOKENS_KEPT);
        assert_eq!(recent.first().map(String::as_str), Some("t3"));
        let last = format!("t{}", HANDLED_TOKENS_KEPT + 2);
        assert_eq!(recent.last(), Some(&last));
        // The oldest fell out of memory: re-applying it is a request again.
        assert!(is_new("a", None, Some(&last), &recent));
        assert!(!is_new("t3", None, Some(&last), &recent));
    }
}
