//! The resume-request handshake of DESIGN §3: which annotation token is a new request, and the
//! bounded memory of handled tokens that makes re-applying an old one a no-op (a GitOps rollback
//! to an earlier manifest never triggers a resume), and the answer to a new request.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::bounds::keep_newest;
use crate::api::conditions::{self, Want};
use crate::api::{
    RESTART_ANNOTATION, RESUME_ANNOTATION, ResumeReason, SessionState, TaskSessionStatus,
};

use super::rest::at_rest;
use super::transition::{Metric, NextAction, Note, Requeue, ResumeOutcome, Transition};
use super::{SessionObjects, evaluate_resume_eligibility};

/// How many handled tokens a session remembers (DESIGN §2: "a bounded list of recently handled
/// tokens"). A rollback further back than this resumes again.
pub const HANDLED_TOKENS_KEPT: usize = 16;

/// The longest annotation token the operator acts on. A longer one is refused without being
/// copied into status or Events (only [`handled_key`] of it is).
pub const MAX_TOKEN_BYTES: usize = 256;

/// Whether the annotation's `token` asks for a resume: it is not the request being handled
/// (`active`), nor the last handled one, nor one of the recently handled ones. A new token while
/// another is latched supersedes it (DESIGN §3).
pub fn is_new_resume_request(
    token: &str,
    active: Option<&str>,
    last_handled: Option<&str>,
    recently_handled: &[String],
) -> bool {
    let key = handled_key(token);
    active != Some(key.as_str())
        && last_handled != Some(key.as_str())
        && !recently_handled.contains(&key)
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
    /// Handled without a launch (refused, or the agent already runs), or superseding the
    /// latched request: apply the transition, nothing more in this pass.
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
/// [`handled_key`] is kept); a latched request is superseded (it counts as handled with
/// `Resumed=False/Superseded`, its pod is deleted after the write); a terminal session that the
/// rules do not offer a resume is refused (`TerminalState`); an agent that runs is acknowledged
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

/// A new request while another is latched.
struct Superseding<'a> {
    old: &'a str,
    new: &'a str,
    /// The old request's pod, if it exists.
    latched_pod: Option<&'a str>,
}

/// The old request is handled (`Resumed=False/Superseded`), the new one latched, and the old
/// request's pod deleted after the status; the new launch goes on at once (it waits for the
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
    remember_handled(&mut next.recent_resume_requests, old);
    next.last_handled_resume_request = Some(old.to_string());
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

    use crate::api::AgentActivity;
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

    #[test]
    fn a_new_token_supersedes_the_latched_request_and_deletes_its_pod_after_the_write() {
        let g = given(SessionState::Starting, Some("t"), P::Pending);
        for pod in [Some("s-agent-a"), None] {
            let t = done(answer(&g, Some("a"), "b", pod));
            assert!(t.write);
            assert_eq!(t.status.active_resume_request.as_deref(), Some("b"));
            assert_eq!(t.status.last_handled_resume_request.as_deref(), Some("a"));
            assert!(t.status.recent_resume_requests.contains(&"a".to_string()));
            assert_eq!(resumed(&t), ("False".into(), "Superseded".into()));
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
                is_new_resume_request(token, active, last, &tokens(recent)),
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
        assert!(is_new_resume_request(&huge, None, None, &[]));
        assert!(!is_new_resume_request(&huge, None, Some(&key), &[]));
        assert!(!is_new_resume_request(&huge, None, None, &tokens(&[&key])));
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
        assert!(is_new_resume_request("a", None, Some(&last), &recent));
        assert!(!is_new_resume_request("t3", None, Some(&last), &recent));
    }
}
