//! How a launch ends (DESIGN §3 "Resume execution", step 5): the agent runs, the launch is not done
//! (the token kept, `needsResume`, a new token retries), or it failed for good.
//!
//! Pure: [`restore_end`] reads the restore's outcome, [`launch_ended`] turns any end of a
//! launch into the [`Transition`] the reconciler applies (the status, the conditions, the one
//! action, the Event and the metric).

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{self, Want};
use crate::api::{RESUME_ANNOTATION, ResumeReason, SessionState, TaskSessionStatus, TaskState};

use super::classify::RestoreErrorClass;
use super::handshake::remember_handled;
use super::restore::{FreshReason, RestoreOutcome};
use super::transition::{Metric, NextAction, Note, Requeue, ResumeOutcome, Transition, settle};

/// How a launch ended.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchEnd {
    /// The agent runs in `pod`, in `state`. `resumed`: its session came back or started as
    /// asked (`Resumed=True`); `reason` names the outcome in the conditions.
    Running {
        pod: String,
        state: SessionState,
        resumed: bool,
        reason: &'static str,
        message: String,
        event: Note,
        /// The task description of a fresh session: `Ok` sent, `Err` why not; `None` when
        /// none was due.
        task: Option<Result<(), String>>,
    },
    /// Nothing proves the session cannot go on: the token is kept, the session returns to the
    /// state it came from with `needsResume`, and `pod` (if any) is deleted once the status
    /// says why. `reason` names the outcome in the conditions (and in `Stalled` when
    /// `stalled`), `event` is the Warning's reason.
    NotDone {
        pod: Option<String>,
        reason: String,
        event: &'static str,
        stalled: bool,
        message: String,
    },
    /// DESIGN §3 step 5 "Launch failure → FAILED with the reason": `code` in the conditions,
    /// `event` the Warning's reason; `pod` (if any) is deleted after the status.
    Failed {
        pod: Option<String>,
        code: &'static str,
        event: &'static str,
        reason: String,
    },
}

/// What the reconciler knows once the restore over exec is over.
#[derive(Clone, Copy, Debug)]
pub struct RestoreFacts<'a> {
    pub pod: &'a str,
    pub outcome: &'a RestoreOutcome,
    /// agentctl answered `initialize` (else a transport failure or a timeout is agentctl not
    /// listening yet, not the agent failing).
    pub answered: bool,
    /// This launch answers a resume request (else it is the session's first launch).
    pub is_resume: bool,
    /// A fresh start was asked for (`kandev.dev/resume-fresh`).
    pub fresh: bool,
    /// The saved token the launch began with.
    pub token: Option<&'a str>,
    /// The state the session returns to.
    pub returns_to: SessionState,
    /// The task description, due with a fresh session: `Ok` sent, `Err` why not.
    pub task: Option<Result<(), &'a str>>,
}

/// The step after a restore.
#[derive(Clone, Debug, PartialEq)]
pub enum AfterRestore {
    /// agentctl did not answer (the stream closed before `initialize`, or no answer in time):
    /// it may not listen yet, or still clone. The launch waits, within its deadline, and asks
    /// again.
    AwaitAgentctl(String),
    End(LaunchEnd),
}

/// Reads the restore's outcome (DESIGN §3 "ACP restore selection" and step 5).
///
/// - Restored: the state the session returns to, `Resumed=True`.
/// - Fresh: `RUNNING` when the task description was sent, else `WAITING_FOR_INPUT`. A token
///   the agent rejected is replaced and said so (a Warning `TokenRejected`, or a Normal
///   `StartedFresh` for an agent that offers no restore at all). A profile without native
///   resume starts over by design (`StartedWithoutNativeResume`). A task description that
///   could not be sent is a Warning `TaskNotSent` and `TaskSent=False`.
/// - Failed: a first launch whose agent answered with an error that retrying cannot mend is
///   `FAILED`; anything else keeps the token and is not done.
pub fn restore_end(facts: &RestoreFacts) -> AfterRestore {
    let pod = facts.pod.to_string();
    let end = match facts.outcome {
        RestoreOutcome::Failed {
            class: RestoreErrorClass::Transport | RestoreErrorClass::Timeout,
            reason,
            ..
        } if !facts.answered => return AfterRestore::AwaitAgentctl(reason.clone()),
        RestoreOutcome::Failed { class, reason, .. }
            if !facts.is_resume && !class.is_retryable() =>
        {
            LaunchEnd::Failed {
                pod: Some(pod),
                code: "LaunchFailed",
                event: "LaunchFailed",
                reason: format!("starting the agent failed: {reason}"),
            }
        }
        RestoreOutcome::Failed {
            class,
            token_kept,
            reason,
            ..
        } => {
            let kept = what_is_kept(*token_kept, facts.token.is_some());
            let what = if facts.is_resume {
                "restore"
            } else {
                "starting the agent"
            };
            LaunchEnd::NotDone {
                pod: Some(pod),
                reason: conditions::camel(class.as_str()),
                event: "ResumeFailed",
                stalled: false,
                message: format!(
                    "{what} failed ({class}): {reason}; {kept}. Set a new {RESUME_ANNOTATION} token to retry"
                ),
            }
        }
        RestoreOutcome::Restored { method, session_id } => {
            let message = format!(
                "restored ACP session {session_id} with {}",
                method.method_name()
            );
            LaunchEnd::Running {
                pod,
                state: facts.returns_to,
                resumed: true,
                reason: "Restored",
                event: Note::normal(started_or_resumed(facts), "Restore", &message),
                message,
                task: None,
            }
        }
        RestoreOutcome::Fresh { session_id, why } => fresh_end(facts, pod, session_id, *why),
    };
    AfterRestore::End(end)
}

/// The end of a "not done" message: what survives for the next try. `token_kept`: nothing
/// proved the saved token useless; `has_token`: there is one.
pub fn what_is_kept(token_kept: bool, has_token: bool) -> &'static str {
    match (token_kept, has_token) {
        (true, true) => "the resume token is kept",
        (true, false) => "nothing is lost",
        (false, _) => "no usable token is left",
    }
}

fn started_or_resumed(facts: &RestoreFacts) -> &'static str {
    if facts.is_resume {
        "Resumed"
    } else {
        "Started"
    }
}

fn fresh_end(facts: &RestoreFacts, pod: String, session_id: &str, why: FreshReason) -> LaunchEnd {
    let old = facts.token.filter(|_| !facts.fresh);
    // Why the task description, due now, could not be sent (it is not sent again).
    let not_sent = match facts.task {
        Some(Err(error)) => Some(format!(
            "started ACP session {session_id}, but its task description could not be sent ({error}); waiting for input: send it with `kubectl kandev prompt`"
        )),
        _ => None,
    };
    let task = facts.task.map(|_| not_sent.clone().map_or(Ok(()), Err));
    let (reason, message) = match old {
        Some(old) if why.agent_rejected_token() => {
            // DESIGN §3 step 5: token rejected → WAITING_FOR_INPUT, token replaced, Event and
            // condition with the reason.
            let message = format!(
                "the agent does not know saved session {old} ({}); started fresh session {session_id}",
                why.as_str()
            );
            // An agent that offers no restore at all starts over on every resume by design.
            let event = if why.warns() {
                Note::warning("TokenRejected", "Resume", &message)
            } else {
                Note::normal("StartedFresh", "Resume", &message)
            };
            return LaunchEnd::Running {
                pod,
                state: SessionState::WaitingForInput,
                resumed: false,
                reason: "TokenRejected",
                message,
                event,
                task,
            };
        }
        // A profile without native resume starts over by design; the recorded history travels
        // with the next prompt where the profile injects it.
        Some(old) => (
            "StartedWithoutNativeResume",
            format!(
                "the agent profile does not restore sessions natively ({why}); started ACP session {session_id} in place of {old}"
            ),
        ),
        None => (
            "Started",
            match (&task, &not_sent) {
                (_, Some(not_sent)) => not_sent.clone(),
                (Some(_), None) => {
                    format!("started ACP session {session_id} and sent the task description")
                }
                (None, None) => format!("started ACP session {session_id}; waiting for input"),
            },
        ),
    };
    // The task prompt was sent: the agent works.
    let state = if matches!(task, Some(Ok(()))) {
        SessionState::Running
    } else {
        SessionState::WaitingForInput
    };
    let event = match not_sent {
        Some(not_sent) => Note::warning("TaskNotSent", "Launch", not_sent),
        None => Note::normal(started_or_resumed(facts), "Restore", &message),
    };
    LaunchEnd::Running {
        pod,
        state,
        resumed: true,
        reason,
        message,
        event,
        task,
    }
}

/// The transition of a launch that ended as `end`, from the session's `current` status. The
/// latched resume request (if any) counts as handled in every case.
pub fn launch_ended(
    current: &TaskSessionStatus,
    generation: Option<i64>,
    has_token: bool,
    end: LaunchEnd,
    now: Timestamp,
) -> Transition {
    let mut status = current.clone();
    let was_resume = status.active_resume_request.is_some();
    let returns_to = status
        .previous_state
        .unwrap_or(SessionState::WaitingForInput);
    finish_request(&mut status);
    let ending = match end {
        LaunchEnd::Running {
            pod,
            state,
            resumed,
            reason,
            message,
            event,
            task,
        } => {
            let resumed = Want::new(conditions::RESUMED, resumed, reason, &message);
            running_end(&mut status, pod, state, resumed, event, task.as_ref())
        }
        LaunchEnd::NotDone {
            pod,
            reason,
            event,
            stalled,
            message,
        } => {
            status.state = returns_to;
            let note = Note::warning(event, "Launch", message);
            not_done_end(&mut status, has_token, pod, &reason, stalled, note)
        }
        LaunchEnd::Failed {
            pod,
            code,
            event,
            reason,
        } => failed_end(
            &mut status,
            pod,
            code,
            Note::warning(event, "Launch", reason),
        ),
    };
    let mut wanted = ending.wanted;
    if was_resume {
        wanted.push(ending.resumed);
    }
    settle(&mut status, &wanted, generation, now);
    let mut event = ending.event;
    if !current.joined_resume_requests.is_empty() {
        event.message = format!(
            "{} (also the answer to the requests that joined: {:?})",
            event.message, current.joined_resume_requests
        );
    }
    Transition {
        write: status != *current,
        status,
        action: ending.action,
        event: Some(event),
        metric: was_resume.then_some(Metric::ResumeHandled(ending.outcome)),
        requeue: ending.requeue,
    }
}

/// What one kind of end of a launch wants besides the status fields it sets.
struct Ending {
    wanted: Vec<Want>,
    /// `Resumed`, when the launch answered a resume request.
    resumed: Want,
    action: Option<NextAction>,
    event: Note,
    outcome: ResumeOutcome,
    requeue: Requeue,
}

/// The agent runs in `pod`, in `state`; `resumed` says how its request went.
fn running_end(
    status: &mut TaskSessionStatus,
    pod: String,
    state: SessionState,
    resumed: Want,
    event: Note,
    task: Option<&Result<(), String>>,
) -> Ending {
    status.state = state;
    status.task_state = TaskState::of_agent_in(state);
    status.needs_resume = false;
    status.is_resumable = false;
    status.resume_reason = Some(ResumeReason::AlreadyRunning);
    status.error_message = None;
    let outcome = if resumed.reason == "Restored" {
        ResumeOutcome::Restored
    } else {
        ResumeOutcome::Fresh
    };
    // The task prompt was sent: follow the agent's work live; an idle agent's journal is
    // caught up with.
    let action = if state == SessionState::Running {
        NextAction::Follow { pod }
    } else {
        NextAction::CaughtUp { pod }
    };
    Ending {
        wanted: running_conditions(state, &resumed.reason, task),
        resumed,
        action: Some(action),
        event,
        outcome,
        requeue: Requeue::Resync,
    }
}

/// Nothing proves the session cannot go on (the state to return to is set): `needsResume`,
/// the token kept, `pod` deleted after the status; `event`'s message says why.
fn not_done_end(
    status: &mut TaskSessionStatus,
    has_token: bool,
    pod: Option<String>,
    reason: &str,
    stalled: bool,
    event: Note,
) -> Ending {
    let message = &event.message;
    status.needs_resume = true;
    status.is_resumable = true;
    status.resume_reason = Some(if has_token {
        ResumeReason::AgentNotRunning
    } else {
        ResumeReason::AgentNotRunningFreshStart
    });
    status.error_message = Some(message.clone());
    Ending {
        wanted: not_done_conditions(reason, stalled, message),
        resumed: Want::new(conditions::RESUMED, false, reason, message),
        action: pod.map(|pod| NextAction::DeletePod { pod }),
        event,
        outcome: ResumeOutcome::Failed,
        requeue: Requeue::Resync,
    }
}

/// `FAILED` with `code` in the conditions and `event`'s message as the reason; `pod` deleted
/// after the status.
fn failed_end(
    status: &mut TaskSessionStatus,
    pod: Option<String>,
    code: &str,
    event: Note,
) -> Ending {
    let reason = &event.message;
    status.state = SessionState::Failed;
    status.task_state = TaskState::Failed;
    status.error_message = Some(reason.clone());
    // Nothing a resume could mend: not offered one (the executor is marked so too, when no pod
    // is left to delete, so that a later evaluation agrees).
    status.needs_resume = false;
    status.is_resumable = false;
    status.resume_reason = Some(ResumeReason::TerminalState);
    Ending {
        wanted: vec![
            Want::absent(conditions::READY),
            Want::new(conditions::STALLED, true, code, reason),
            Want::new(conditions::RECONCILING, false, code, ""),
            Want::new(conditions::NEEDS_RESUME, false, "TerminalState", ""),
        ],
        // The outcome of this request, not a leftover of the previous one.
        resumed: Want::new(conditions::RESUMED, false, code, reason),
        action: Some(match pod {
            Some(pod) => NextAction::DeletePod { pod },
            None => NextAction::MarkExecutorLost { resumable: false },
        }),
        event,
        outcome: ResumeOutcome::Failed,
        requeue: Requeue::AwaitChange,
    }
}

/// A running agent: Ready and Reconciling as the steady-state evaluation words them, so that it
/// finds nothing to write after this (the outcome is in `Resumed` and the Event), and
/// `TaskSent` when a task description was due.
fn running_conditions(
    state: SessionState,
    reason: &str,
    task: Option<&Result<(), String>>,
) -> Vec<Want> {
    let steady = conditions::camel(&state.as_str().to_ascii_lowercase());
    let mut wanted = vec![
        Want::new(conditions::READY, true, steady, ""),
        Want::new(conditions::AGENT_RUNNING, true, "PodRunning", ""),
        Want::new(conditions::NEEDS_RESUME, false, "AlreadyRunning", ""),
        Want::new(conditions::RECONCILING, false, "Idle", ""),
        Want::new(conditions::STALLED, false, reason, ""),
    ];
    match task {
        Some(Ok(())) => wanted.push(Want::new(conditions::TASK_SENT, true, "Sent", "")),
        Some(Err(why)) => wanted.push(Want::new(conditions::TASK_SENT, false, "TaskNotSent", why)),
        None => {}
    }
    wanted
}

/// A launch that is not done: `needsResume` with the reason; `Stalled` only when it stalled.
fn not_done_conditions(reason: &str, stalled: bool, message: &str) -> Vec<Want> {
    let (ready_reason, stall_message) = if stalled {
        (reason, message)
    } else {
        ("ResumeFailed", "")
    };
    vec![
        Want::new(conditions::STALLED, stalled, reason, stall_message),
        Want::absent(conditions::READY),
        Want::new(conditions::NEEDS_RESUME, true, ready_reason, message),
        Want::new(conditions::RECONCILING, false, ready_reason, ""),
    ]
}

/// Ends the handling of the latched request: it and the requests that joined its launch are
/// answered ([`answer_latched`]); nothing to return to.
pub fn finish_request(status: &mut TaskSessionStatus) {
    answer_latched(status);
    status.previous_state = None;
}

/// The latched request and those that joined its launch are remembered as handled, in the
/// order they came, the newest one last.
pub fn answer_latched(status: &mut TaskSessionStatus) {
    if let Some(token) = status.active_resume_request.take() {
        let joined = std::mem::take(&mut status.joined_resume_requests);
        for token in std::iter::once(token).chain(joined) {
            remember_handled(&mut status.recent_resume_requests, &token);
            status.last_handled_resume_request = Some(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resume::RestoreMethod;
    use RestoreErrorClass as C;
    use SessionState as S;

    fn failed(class: RestoreErrorClass, token_kept: bool) -> RestoreOutcome {
        RestoreOutcome::Failed {
            method: Some(RestoreMethod::Resume),
            class,
            token_kept,
            session_id: None,
            reason: format!("{class}: boom"),
        }
    }

    fn fresh(why: FreshReason) -> RestoreOutcome {
        RestoreOutcome::Fresh {
            session_id: "new".into(),
            why,
        }
    }

    fn facts<'a>(outcome: &'a RestoreOutcome) -> RestoreFacts<'a> {
        RestoreFacts {
            pod: "s-agent-1",
            outcome,
            answered: true,
            is_resume: true,
            fresh: false,
            token: Some("old"),
            returns_to: S::Running,
            task: None,
        }
    }

    /// What a [`LaunchEnd`] says, in one line: the variant, the state or the conditions'
    /// reason, and the Event.
    fn summary(after: &AfterRestore) -> String {
        match after {
            AfterRestore::AwaitAgentctl(reason) => format!("await agentctl: {reason}"),
            AfterRestore::End(LaunchEnd::Running {
                state,
                resumed,
                reason,
                event,
                task,
                ..
            }) => format!(
                "running {} resumed={resumed} {reason} {}{} task={task:?}",
                state.as_str(),
                if event.warning { "Warning " } else { "" },
                event.reason
            ),
            AfterRestore::End(LaunchEnd::NotDone { reason, event, .. }) => {
                format!("not done {reason} Warning {event}")
            }
            AfterRestore::End(LaunchEnd::Failed { code, event, .. }) => {
                format!("failed {code} Warning {event}")
            }
        }
    }

    #[test]
    fn restore_outcomes() {
        let restored = RestoreOutcome::Restored {
            method: RestoreMethod::Load,
            session_id: "old".into(),
        };
        let transport = failed(C::Transport, true);
        let internal = failed(C::Internal, true);
        let rejected_then_failed = failed(C::Internal, false);
        let unknown = fresh(FreshReason::UnknownSession);
        let unsupported = fresh(FreshReason::RestoreUnsupportedByAgent);
        let by_profile = fresh(FreshReason::ProfileHasNoNativeResume);
        let no_token = fresh(FreshReason::NoResumeToken);
        let first = |f: RestoreFacts<'static>| RestoreFacts {
            is_resume: false,
            token: None,
            returns_to: S::WaitingForInput,
            ..f
        };
        let leak = |o: RestoreOutcome| -> &'static RestoreOutcome { Box::leak(Box::new(o)) };
        #[rustfmt::skip]
        let rows: Vec<(&str, RestoreFacts<'static>, &str)> = vec![
            ("restored on a resume", facts(leak(restored.clone())),
                "running RUNNING resumed=true Restored Resumed task=None"),
            ("restored on a first launch", first(facts(leak(restored))),
                "running WAITING_FOR_INPUT resumed=true Restored Started task=None"),
            ("agentctl never answered", RestoreFacts { answered: false, ..facts(leak(transport.clone())) },
                "await agentctl: transport_closed: boom"),
            ("the agent answered, then the stream closed", facts(leak(transport.clone())),
                "not done TransportClosed Warning ResumeFailed"),
            ("a first launch that may work next time", first(facts(leak(transport))),
                "not done TransportClosed Warning ResumeFailed"),
            ("a first launch the agent refused", first(facts(leak(internal.clone()))),
                "failed LaunchFailed Warning LaunchFailed"),
            ("a resume the agent refused keeps the token", facts(leak(internal)),
                "not done InternalError Warning ResumeFailed"),
            ("the token proved useless, then session/new failed", facts(leak(rejected_then_failed)),
                "not done InternalError Warning ResumeFailed"),
            ("the agent does not know the token", facts(leak(unknown.clone())),
                "running WAITING_FOR_INPUT resumed=false TokenRejected Warning TokenRejected task=None"),
            ("an agent without restore starts over by design", facts(leak(unsupported)),
                "running WAITING_FOR_INPUT resumed=false TokenRejected StartedFresh task=None"),
            ("a profile without native resume", facts(leak(by_profile.clone())),
                "running WAITING_FOR_INPUT resumed=true StartedWithoutNativeResume Resumed task=None"),
            ("a profile without native resume, history sent", RestoreFacts { task: Some(Ok(())), ..facts(leak(by_profile)) },
                "running RUNNING resumed=true StartedWithoutNativeResume Resumed task=Some(Ok(()))"),
            ("a fresh start was asked for", RestoreFacts { fresh: true, ..facts(leak(unknown)) },
                "running WAITING_FOR_INPUT resumed=true Started Resumed task=None"),
            ("the task description was sent", RestoreFacts { task: Some(Ok(())), ..first(facts(leak(no_token.clone()))) },
                "running RUNNING resumed=true Started Started task=Some(Ok(()))"),
            ("no task description", first(facts(leak(no_token.clone()))),
                "running WAITING_FOR_INPUT resumed=true Started Started task=None"),
            ("the task description could not be sent", RestoreFacts { task: Some(Err("stream closed")), ..first(facts(leak(no_token))) },
                "running WAITING_FOR_INPUT resumed=true Started Warning TaskNotSent task=Some(Err(\"started ACP session new, but its task description could not be sent (stream closed); waiting for input: send it with `kubectl kandev prompt`\"))"),
        ];
        for (what, facts, want) in rows {
            assert_eq!(summary(&restore_end(&facts)), want, "{what}");
        }
    }

    #[test]
    fn messages_say_what_is_kept() {
        let kept = failed(C::Timeout, true);
        let lost = failed(C::Internal, false);
        let message = |f: &RestoreFacts| match restore_end(f) {
            AfterRestore::End(LaunchEnd::NotDone { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(&facts(&kept)),
            "restore failed (timeout): timeout: boom; the resume token is kept. Set a new kandev.dev/resume-requested-at token to retry"
        );
        let first = RestoreFacts {
            is_resume: false,
            token: None,
            ..facts(&kept)
        };
        assert!(message(&first).starts_with("starting the agent failed (timeout)"));
        assert!(message(&first).contains("; nothing is lost."));
        assert!(message(&facts(&lost)).contains("; no usable token is left."));
    }

    fn latched(state: SessionState) -> TaskSessionStatus {
        TaskSessionStatus {
            state: SessionState::Starting,
            previous_state: Some(state),
            active_resume_request: Some("t2".into()),
            recent_resume_requests: vec!["t1".into()],
            ..Default::default()
        }
    }

    fn condition<'a>(t: &'a Transition, type_: &str) -> (&'a str, &'a str) {
        let c = conditions::find(&t.status.conditions, type_)
            .unwrap_or_else(|| panic!("no {type_} in {:?}", t.status.conditions));
        (c.status.as_str(), c.reason.as_str())
    }

    fn running(state: SessionState, task: Option<Result<(), String>>) -> LaunchEnd {
        LaunchEnd::Running {
            pod: "p".into(),
            state,
            resumed: true,
            reason: "Restored",
            message: "restored".into(),
            event: Note::normal("Resumed", "Restore", "restored"),
            task,
        }
    }

    #[test]
    fn launch_ends() {
        let now = crate::resume::objects::fixtures::at(10);
        let not_done = |pod: Option<&str>, stalled| LaunchEnd::NotDone {
            pod: pod.map(String::from),
            reason: "ImagePullBackOff".into(),
            event: "LaunchStalled",
            stalled,
            message: "cannot pull".into(),
        };
        let failed = LaunchEnd::Failed {
            pod: Some("p".into()),
            code: "LaunchFailed",
            event: "LaunchFailed",
            reason: "starting the agent failed".into(),
        };
        let resume = latched(S::Running);
        let first_launch = TaskSessionStatus {
            active_resume_request: None,
            ..latched(S::WaitingForInput)
        };
        #[rustfmt::skip]
        let rows = [
            // (what, from, end, state, needsResume, Ready, Resumed, action, metric, requeue)
            ("restored while working", &resume, running(S::Running, None),
                S::Running, false, Some(("True", "Running")), Some(("True", "Restored")),
                Some(NextAction::Follow { pod: "p".into() }),
                Some(Metric::ResumeHandled(ResumeOutcome::Restored)), Requeue::Resync),
            ("restored idle", &resume, running(S::WaitingForInput, None),
                S::WaitingForInput, false, Some(("True", "WaitingForInput")), Some(("True", "Restored")),
                Some(NextAction::CaughtUp { pod: "p".into() }),
                Some(Metric::ResumeHandled(ResumeOutcome::Restored)), Requeue::Resync),
            ("a first launch counts no resume", &first_launch, running(S::Running, Some(Ok(()))),
                S::Running, false, Some(("True", "Running")), None,
                Some(NextAction::Follow { pod: "p".into() }), None, Requeue::Resync),
            ("stalled: the pod goes after the status", &resume, not_done(Some("p"), true),
                S::Running, true, None, Some(("False", "ImagePullBackOff")),
                Some(NextAction::DeletePod { pod: "p".into() }),
                Some(Metric::ResumeHandled(ResumeOutcome::Failed)), Requeue::Resync),
            ("refused before a pod existed", &first_launch, not_done(None, false),
                S::WaitingForInput, true, None, None,
                None, None, Requeue::Resync),
            ("failed", &resume, failed,
                S::Failed, false, None, Some(("False", "LaunchFailed")),
                Some(NextAction::DeletePod { pod: "p".into() }),
                Some(Metric::ResumeHandled(ResumeOutcome::Failed)), Requeue::AwaitChange),
        ];
        for (what, from, end, state, needs, ready, resumed, action, metric, requeue) in rows {
            let t = launch_ended(from, Some(3), true, end, now);
            assert!(t.write, "{what}");
            assert_eq!(t.status.state, state, "{what}");
            assert_eq!(t.status.needs_resume, needs, "{what}");
            assert_eq!(
                conditions::find(&t.status.conditions, conditions::READY)
                    .map(|c| (c.status.as_str(), c.reason.as_str())),
                ready,
                "{what}"
            );
            assert_eq!(
                conditions::find(&t.status.conditions, conditions::RESUMED)
                    .map(|c| (c.status.as_str(), c.reason.as_str())),
                resumed,
                "{what}"
            );
            assert_eq!(t.action, action, "{what}");
            assert_eq!(t.metric, metric, "{what}");
            assert_eq!(t.requeue, requeue, "{what}");
            assert!(t.event.is_some(), "{what}: every end says so in an Event");
            // The request is handled whatever the end; nothing is left to return to.
            assert_eq!(t.status.active_resume_request, None, "{what}");
            assert_eq!(t.status.previous_state, None, "{what}");
            assert_eq!(t.status.observed_generation, Some(3), "{what}");
            if from.active_resume_request.is_some() {
                assert_eq!(t.status.last_handled_resume_request.as_deref(), Some("t2"));
                assert_eq!(t.status.recent_resume_requests, ["t1", "t2"], "{what}");
            }
        }
    }

    #[test]
    fn a_task_that_was_not_sent_is_said_in_the_session() {
        let now = crate::resume::objects::fixtures::at(10);
        let from = TaskSessionStatus::default();
        let sent = launch_ended(&from, None, false, running(S::Running, Some(Ok(()))), now);
        assert_eq!(condition(&sent, conditions::TASK_SENT), ("True", "Sent"));
        let end = running(
            S::WaitingForInput,
            Some(Err("could not be sent (eof)".into())),
        );
        let not_sent = launch_ended(&from, None, false, end, now);
        assert_eq!(
            condition(&not_sent, conditions::TASK_SENT),
            ("False", "TaskNotSent")
        );
        let message = &conditions::find(&not_sent.status.conditions, conditions::TASK_SENT)
            .map(|c| c.message.clone());
        assert_eq!(message.as_deref(), Some("could not be sent (eof)"));
        let none = launch_ended(&from, None, false, running(S::Running, None), now);
        assert!(conditions::find(&none.status.conditions, conditions::TASK_SENT).is_none());
    }

    #[test]
    fn without_a_token_a_failed_launch_says_fresh_start() {
        let now = crate::resume::objects::fixtures::at(10);
        let end = LaunchEnd::NotDone {
            pod: None,
            reason: "InvalidSpec".into(),
            event: "InvalidSpec",
            stalled: true,
            message: "refused".into(),
        };
        let t = launch_ended(&latched(S::Running), None, false, end.clone(), now);
        assert_eq!(
            t.status.resume_reason,
            Some(ResumeReason::AgentNotRunningFreshStart)
        );
        assert_eq!(condition(&t, conditions::STALLED), ("True", "InvalidSpec"));
        let t = launch_ended(&latched(S::Running), None, true, end, now);
        assert_eq!(t.status.resume_reason, Some(ResumeReason::AgentNotRunning));
    }
}
