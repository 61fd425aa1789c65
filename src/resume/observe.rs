//! The steady state (DESIGN §3 "Status evaluation"): no end requested, no resume request
//! latched, nothing launching. The live pod and what the agent last reported decide the
//! session's state, its conditions and whether its loss is declared now.

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{self, Want};
use crate::api::launch_spec::{LAUNCH_SPEC_ANNOTATION, changed_launch_fields};
use crate::api::{
    AgentActivity, RESUME_ANNOTATION, ResumeReason, SUSPENDED, SessionState, TaskSessionStatus,
    TaskState,
};
use k8s_openapi::api::core::v1::Pod;

use super::reach::{LossCause, Reach, ReachFacts, judge};
use super::status::terminated_containers;
use super::transition::{Metric, NextAction, Note, Requeue, Transition, settle};
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
/// - A running pod is also judged by `reach` (its `Ready` condition, which the kubelet's
///   readiness probe of agentctl decides, and its node, see [`judge`]): one that counts as lost gets `AgentRunning=False`
///   with the cause as reason (`AgentUnreachable`, `NodeLost`) and a Warning Event, written
///   before the pod is deleted. The loss itself is declared once the pod is deleted
///   (terminating or gone), with the same cause as the `NeedsResume` reason (the
///   `AgentRunning` condition carries it).
pub fn observe(objects: &SessionObjects, reach: Option<&ReachFacts>, now: Timestamp) -> Transition {
    let loaded = objects.status();
    let mut status = loaded.clone();
    let pod = objects.current_pod();
    let running = pod_liveness(pod) == PodLiveness::Running;
    let verdict = match reach.filter(|_| running) {
        Some(facts) => judge(facts, now),
        None => Reach::Reachable,
    };
    // A suspension: said by agentctl's termination message while the pod is there, then
    // carried by the Suspended condition until the next launch.
    let suspended_by = pod.and_then(suspension);
    let suspended = !running
        && (suspended_by.is_some()
            || conditions::is_true(&loaded.conditions, conditions::SUSPENDED));
    // The cause of a loss, carried by AgentRunning from the pass that deleted the pod.
    let carried = conditions::find(&loaded.conditions, conditions::AGENT_RUNNING)
        .filter(|c| c.status == "False")
        .and_then(|c| LossCause::from_reason(&c.reason).map(|cause| (cause, c.message.clone())))
        .filter(|_| !running);
    if running
        && matches!(
            status.state,
            SessionState::Running | SessionState::WaitingForInput
        )
    {
        let state = match objects.executor_status().activity {
            Some(AgentActivity::Working) => Some(SessionState::Running),
            Some(AgentActivity::Idle) => Some(SessionState::WaitingForInput),
            None => None,
        };
        if let Some(state) = state {
            status.state = state;
            status.task_state = TaskState::of_agent_in(state);
        }
    }
    // What waits for a person is the running agent's; nothing waits without one.
    status.pending_permissions = if running {
        objects.executor_status().pending_permissions.clone()
    } else {
        Vec::new()
    };
    let eval = evaluate_resume_eligibility(&objects.facts_with(&status, pod));
    let newly_lost = eval.needs_resume && !status.needs_resume;
    let suspended = suspended && eval.needs_resume;
    let suspension_message = conditions::find(&loaded.conditions, conditions::SUSPENDED)
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone())
        .or(suspended_by.clone())
        .unwrap_or_default();
    status.needs_resume = eval.needs_resume;
    status.is_resumable = eval.is_resumable || eval.needs_resume;
    status.resume_reason = Some(if suspended {
        ResumeReason::Suspended
    } else {
        eval.reason
    });
    let lost_running = match &verdict {
        Reach::Lost { cause, message } => Some((*cause, message.clone())),
        Reach::Reachable | Reach::Suspect { .. } => None,
    };
    let seen = Seen {
        pod,
        running,
        verdict: &verdict,
        lost_running: lost_running.as_ref(),
        carried: carried.as_ref(),
        newly_lost,
        suspended,
        suspended_by: suspended_by.is_some(),
        suspension_message: &suspension_message,
        reason: eval.reason,
    };
    let generation = objects.session.metadata.generation;
    let mut wanted = steady_conditions(&seen, eval.needs_resume, status.state, &loaded);
    wanted.extend(awaiting_approval(
        &status,
        &loaded,
        &objects.session.metadata.name,
    ));
    wanted.extend(session_configured(objects, running));
    wanted.push(spec_applied(objects, running));
    settle(&mut status, &wanted, generation, now);
    let write = status != loaded;
    let mut transition = Transition {
        status,
        write,
        action: None,
        event: None,
        metric: None,
        requeue: Requeue::Resync,
    };
    one_action(objects, &loaded, &seen, &mut transition);
    transition
}

/// What the steady state saw, for its one action.
struct Seen<'a> {
    pod: Option<&'a Pod>,
    running: bool,
    verdict: &'a Reach,
    /// The running pod counts as lost (its cause and message).
    lost_running: Option<&'a (LossCause, String)>,
    /// The cause of a loss that AgentRunning carries from the pass that deleted the pod.
    carried: Option<&'a (LossCause, String)>,
    newly_lost: bool,
    suspended: bool,
    /// agentctl's termination message says the pod was suspended.
    suspended_by: bool,
    suspension_message: &'a str,
    reason: ResumeReason,
}

/// The steady state's conditions: `AgentRunning` (with a loss's cause, or the suspension),
/// `NeedsResume`, `Ready`, `Reconciling`, and `Suspended` once a session was suspended (it stays,
/// False, after its resume).
fn steady_conditions(
    seen: &Seen,
    needs_resume: bool,
    state: SessionState,
    loaded: &TaskSessionStatus,
) -> Vec<Want> {
    let resume_hint = format!("annotate {RESUME_ANNOTATION} to resume");
    let (ready_reason, needs_message) = if seen.suspended {
        (
            conditions::SUSPENDED.to_string(),
            format!("{}; {resume_hint}", seen.suspension_message),
        )
    } else if needs_resume {
        let why = match seen.carried {
            Some((cause, _)) => format!("{}, {}", seen.reason, cause.reason()),
            None => seen.reason.to_string(),
        };
        (
            conditions::NEEDS_RESUME.to_string(),
            format!("agent not running ({why}); {resume_hint}"),
        )
    } else {
        (
            conditions::camel(&state.as_str().to_ascii_lowercase()),
            String::new(),
        )
    };
    let agent_running = match (seen.lost_running, seen.carried) {
        (Some((cause, message)), _) | (None, Some((cause, message))) => {
            Want::new(conditions::AGENT_RUNNING, false, cause.reason(), message)
        }
        (None, None) if seen.running => {
            Want::new(conditions::AGENT_RUNNING, true, "PodRunning", "")
        }
        (None, None) if seen.suspended => Want::new(
            conditions::AGENT_RUNNING,
            false,
            conditions::SUSPENDED,
            seen.suspension_message,
        ),
        (None, None) => Want::new(conditions::AGENT_RUNNING, false, "PodNotRunning", ""),
    };
    let needs_reason = match seen.carried {
        _ if seen.suspended => conditions::SUSPENDED.to_string(),
        Some((cause, _)) if needs_resume => cause.reason().to_string(),
        _ => conditions::camel(seen.reason.as_str()),
    };
    // Ready says whether the agent takes prompts: False while its pod is being given up, absent
    // while no agent runs and nothing is in progress (lost, suspended, ended, failed: the
    // session waits for a person, and kstatus reads it as Current, not in progress).
    let ready = match seen.lost_running {
        Some((cause, message)) => Want::new(conditions::READY, false, cause.reason(), message),
        None if seen.running && !state.is_terminal() => {
            Want::new(conditions::READY, true, ready_reason, &needs_message)
        }
        None => Want::absent(conditions::READY),
    };
    let suspended = if seen.suspended {
        Some(Want::new(
            conditions::SUSPENDED,
            true,
            "Idle",
            seen.suspension_message,
        ))
    } else {
        conditions::find(&loaded.conditions, conditions::SUSPENDED)
            .filter(|c| c.status == "True")
            .map(|_| Want::new(conditions::SUSPENDED, false, "NotSuspended", ""))
    };
    [
        agent_running,
        Want::new(
            conditions::NEEDS_RESUME,
            needs_resume,
            needs_reason,
            &needs_message,
        ),
        ready,
        Want::new(conditions::RECONCILING, false, "Idle", ""),
    ]
    .into_iter()
    .chain(suspended)
    .collect()
}

/// `AwaitingApproval`: True while a permission request waits (naming the oldest), False once
/// none does; not set on a session that never had one.
fn awaiting_approval(
    status: &TaskSessionStatus,
    loaded: &TaskSessionStatus,
    name: &Option<String>,
) -> Option<Want> {
    let name = name.as_deref().unwrap_or("SESSION");
    match status.pending_permissions.first() {
        Some(oldest) => Some(Want::new(
            conditions::AWAITING_APPROVAL,
            true,
            "PermissionRequested",
            format!(
                "{} request(s) wait; the oldest, {}, asks to {} \"{}\": kubectl kandev approve {name} {} or kubectl kandev deny {name} {}",
                status.pending_permissions.len(),
                oldest.id,
                oldest.tool_kind,
                oldest.title,
                oldest.id,
                oldest.id
            ),
        )),
        None => none_awaiting_approval(loaded),
    }
}

/// `AwaitingApproval=False` where `loaded` says one waits: nothing waits any more.
pub(super) fn none_awaiting_approval(loaded: &TaskSessionStatus) -> Option<Want> {
    conditions::find(&loaded.conditions, conditions::AWAITING_APPROVAL)
        .filter(|c| c.status == "True")
        .map(|_| Want::new(conditions::AWAITING_APPROVAL, false, "NoneWaiting", ""))
}

/// `SessionConfigured` of a session with `spec.sessionConfig` whose agent runs: what its last
/// launch could not set, or that it set everything.
fn session_configured(objects: &SessionObjects, running: bool) -> Option<Want> {
    objects.session.spec.session_config.as_ref()?;
    if !running {
        return None;
    }
    Some(match objects.executor_status().session_config_problem {
        Some(problem) => Want::new(conditions::SESSION_CONFIGURED, false, "NotOffered", problem),
        None => Want::new(conditions::SESSION_CONFIGURED, true, "Applied", ""),
    })
}

/// `SpecApplied=False/PendingRestart` naming the launch-time fields that changed since the
/// running agent pod was created; absent while none did, or no agent runs.
fn spec_applied(objects: &SessionObjects, running: bool) -> Want {
    let pod = objects.current_pod().filter(|_| running);
    let changed = pod
        .and_then(|pod| {
            pod.metadata
                .annotations
                .as_ref()?
                .get(LAUNCH_SPEC_ANNOTATION)
        })
        .map(|recorded| changed_launch_fields(recorded, &objects.session.spec))
        .unwrap_or_default();
    match (
        pod.and_then(|p| p.metadata.name.as_deref()),
        changed.as_slice(),
    ) {
        (Some(pod), [_, ..]) => {
            let fields: Vec<String> = changed.iter().map(|f| format!("spec.{f}")).collect();
            let name = objects.session.metadata.name.as_deref().unwrap_or_default();
            Want::new(
                conditions::SPEC_APPLIED,
                false,
                "PendingRestart",
                format!(
                    "{} changed after agent pod {pod} started: applied at the next launch (kubectl kandev restart {name})",
                    fields.join(", ")
                ),
            )
        }
        _ => Want::absent(conditions::SPEC_APPLIED),
    }
}

/// The one action of the steady state, its Event, metric and recheck: a running pod that
/// counts as lost is said so once and deleted; a running pod is followed; a suspension marks
/// the executor lost without a Warning, then its pod goes; a loss seen for the first time marks
/// the executor lost, counts it and says so.
fn one_action(
    objects: &SessionObjects,
    loaded: &TaskSessionStatus,
    seen: &Seen,
    transition: &mut Transition,
) {
    let pod = seen.pod;
    if let (Some((cause, message)), Some(pod)) = (seen.lost_running, pod) {
        let pod = pod.metadata.name.clone().unwrap_or_default();
        // Once per pod: the pass that first says so (a later pass only deletes again).
        let said = conditions::find(&loaded.conditions, conditions::AGENT_RUNNING)
            .is_some_and(|c| c.reason == cause.reason() && c.message == *message);
        if !said {
            transition.event = Some(Note::warning(
                cause.reason(),
                "Observe",
                format!("{message}; the session can be resumed once the pod is gone"),
            ));
        }
        transition.action = Some(NextAction::DeleteLostPod {
            pod,
            force: cause.force_delete(),
        });
    } else if let Some(pod) = pod.filter(|_| seen.running) {
        transition.action = Some(NextAction::Follow {
            pod: pod.metadata.name.clone().unwrap_or_default(),
        });
        if let Reach::Suspect { recheck } = seen.verdict {
            transition.requeue = Requeue::After(*recheck);
        }
    } else if seen.newly_lost && seen.suspended {
        // Not a loss: what was asked for. The pod goes at the next pass.
        transition.action = Some(NextAction::MarkExecutorLost {
            resumable: objects.resume_token().is_some(),
        });
        transition.event = Some(Note {
            warning: false,
            reason: conditions::SUSPENDED,
            action: "Observe",
            message: format!(
                "{}; pod {} ends, the token and the workspace are kept",
                seen.suspension_message,
                pod.and_then(|p| p.metadata.name.clone())
                    .unwrap_or_default()
            ),
        });
    } else if let Some(pod) = pod.filter(|_| seen.suspended && seen.suspended_by) {
        transition.action = Some(NextAction::DeletePod {
            pod: pod.metadata.name.clone().unwrap_or_default(),
        });
    } else if seen.newly_lost {
        let pod_name = pod
            .and_then(|p| p.metadata.name.clone())
            .or(objects.executor_status().pod_name)
            .unwrap_or_default();
        transition.action = Some(NextAction::MarkExecutorLost {
            resumable: objects.resume_token().is_some(),
        });
        transition.metric = Some(Metric::AgentLost);
        let how = match pod_liveness(pod) {
            PodLiveness::Terminating => "is being deleted",
            PodLiveness::Failed => "has failed",
            _ => "is gone",
        };
        let why = match seen.carried {
            Some((cause, _)) => format!("{}, {}", seen.reason, cause.reason()),
            None => seen.reason.to_string(),
        };
        transition.event = Some(Note::warning(
            "AgentLost",
            "Observe",
            format!(
                "agentctl pod {pod_name} {how} ({why}); nothing relaunched until a resume is requested"
            ),
        ));
    }
}

/// agentctl's word that it suspended the session: the pod ended, its container exited 0 with
/// the termination message `Suspended: …` (which is returned).
fn suspension(pod: &Pod) -> Option<String> {
    let phase = pod.status.as_ref()?.phase.as_deref();
    if !matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    // The agent's container's word, not the checkout's (an init container that ended 0 first).
    terminated_containers(pod)
        .filter(|t| t.exit_code == 0)
        .find_map(|t| {
            t.message
                .as_deref()
                .filter(|m| m.starts_with(&format!("{SUSPENDED}:")))
        })
        .map(|m| m.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ResumeReason;
    use std::time::Duration;

    use crate::resume::NodeHealth;
    use crate::resume::objects::fixtures::{Given, P, at, objects};

    /// A suspended pod of a repository session: its checkout (init) container ended 0 with no
    /// message before the agent's container wrote `Suspended: …`.
    #[test]
    fn a_suspension_is_read_past_the_checkout() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Succeeded",
                "initContainerStatuses": [{"name": "checkout", "image": "i", "imageID": "",
                    "ready": true, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": ""}}}],
                "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                        "message": "Suspended: idle for 600s\n"}}}]}
        }))
        .expect("pod");
        assert_eq!(
            suspension(&pod).as_deref(),
            Some("Suspended: idle for 600s")
        );
    }

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
            // A pod that is going away is lost at once (a relaunch waits for it to be gone).
            (Given { state: S::WaitingForInput, needs_resume: false, token: Some("t"), activity: Some(Idle), pod: P::Terminating },
                S::WaitingForInput, true, ResumeReason::AgentNotRunning, lost(true), true),
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
            let t = observe(&objects(given), None, at(10));
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

    /// The session's pod as agentctl leaves it after a suspension (exit 0, `Suspended: …`), or
    /// after another exit 0 without that word.
    fn ended_pod(message: Option<&str>) -> (Given, Option<String>) {
        let given = Given {
            state: SessionState::WaitingForInput,
            needs_resume: false,
            token: Some("tok"),
            activity: Some(AgentActivity::Idle),
            pod: P::Failed,
        };
        (given, message.map(String::from))
    }

    fn with_ended_pod((given, message): &(Given, Option<String>)) -> SessionObjects {
        let mut o = objects(given);
        for pod in &mut o.pods {
            let status = pod.status.get_or_insert_with(Default::default);
            status.phase = Some("Succeeded".into());
            status.container_statuses = Some(vec![
                serde_json::from_value(serde_json::json!({
                    "name": "agentctl", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                             "message": message}}
                }))
                .expect("container status"),
            ]);
        }
        o
    }

    /// An idle session's agentctl suspended it: not a loss. The first pass says so (Normal
    /// Event, Suspended, resumeReason suspended, the executor marked lost and resumable), the
    /// next deletes the ended pod, and once it is gone the suspension is still what the status
    /// says; a relaunched pod turns Suspended False.
    #[test]
    fn a_suspension_is_told_apart_from_a_loss() {
        let message = "Suspended: idle for 600s (no prompt, no client)";
        let given = ended_pod(Some(message));
        let t = observe(&with_ended_pod(&given), None, at(100));
        let status = &t.status;
        assert!(status.needs_resume && t.write);
        assert_eq!(status.resume_reason, Some(ResumeReason::Suspended));
        let suspended =
            conditions::find(&status.conditions, conditions::SUSPENDED).expect("Suspended");
        assert_eq!(
            (suspended.status.as_str(), suspended.reason.as_str()),
            ("True", "Idle")
        );
        assert_eq!(suspended.message, message);
        let needs =
            conditions::find(&status.conditions, conditions::NEEDS_RESUME).expect("NeedsResume");
        assert_eq!(
            (needs.status.as_str(), needs.reason.as_str()),
            ("True", "Suspended")
        );
        let running =
            conditions::find(&status.conditions, conditions::AGENT_RUNNING).expect("AgentRunning");
        assert_eq!(
            (running.status.as_str(), running.reason.as_str()),
            ("False", "Suspended")
        );
        assert_eq!(
            t.action,
            Some(NextAction::MarkExecutorLost { resumable: true })
        );
        assert_eq!(t.metric, None, "not counted as a loss");
        let event = t.event.as_ref().expect("an Event");
        assert!(!event.warning && event.reason == "Suspended", "{event:?}");
        assert!(event.message.starts_with(message), "{event:?}");

        // The next pass: the ended pod is deleted; nothing else changes.
        let mut next = with_ended_pod(&given);
        next.session.status = Some(t.status.clone());
        let t2 = observe(&next, None, at(101));
        assert_eq!(
            t2.action,
            Some(NextAction::DeletePod {
                pod: "s-agent-1".into()
            })
        );
        assert!(t2.event.is_none() && !t2.write, "{t2:?}");

        // The pod is gone: still suspended.
        let mut gone = objects(&Given {
            pod: P::None,
            ..given.0
        });
        gone.session.status = Some(t.status.clone());
        let t3 = observe(&gone, None, at(102));
        assert_eq!(t3.status.resume_reason, Some(ResumeReason::Suspended));
        assert!(conditions::is_true(
            &t3.status.conditions,
            conditions::SUSPENDED
        ));
        assert!(
            t3.event.is_none() && t3.action.is_none() && !t3.write,
            "{t3:?}"
        );

        // Relaunched and running: Suspended False, the rest as for any running session.
        let mut back = objects(&Given {
            pod: P::Running,
            needs_resume: false,
            ..given.0
        });
        let mut status = t.status.clone();
        status.needs_resume = false;
        back.session.status = Some(status);
        let t4 = observe(&back, None, at(103));
        let suspended =
            conditions::find(&t4.status.conditions, conditions::SUSPENDED).expect("Suspended");
        assert_eq!(
            (suspended.status.as_str(), suspended.reason.as_str()),
            ("False", "NotSuspended")
        );
        assert_eq!(t4.status.resume_reason, Some(ResumeReason::AlreadyRunning));
    }

    /// An exit 0 without agentctl's word is a loss like any other.
    #[test]
    fn an_ended_pod_without_the_word_is_lost() {
        for message in [None, Some("Completed"), Some("Suspended but not quite")] {
            let t = observe(&with_ended_pod(&ended_pod(message)), None, at(100));
            assert_eq!(
                t.status.resume_reason,
                Some(ResumeReason::AgentNotRunning),
                "{message:?}"
            );
            assert!(conditions::find(&t.status.conditions, conditions::SUSPENDED).is_none());
            assert_eq!(
                t.event.as_ref().map(|e| (e.warning, e.reason)),
                Some((true, "AgentLost"))
            );
        }
    }

    fn reach(not_ready_since: Option<i64>, node: NodeHealth) -> ReachFacts {
        ReachFacts {
            pod: "s-agent-1".into(),
            node_name: "n1".into(),
            not_ready_since: not_ready_since.map(at),
            unreachable_after: Some(Duration::from_secs(60)),
            node,
            node_lost_after: Some(Duration::from_secs(30)),
        }
    }

    /// (reach, action, AgentRunning reason, event reason, requeue)
    type ReachRow = (
        ReachFacts,
        Option<NextAction>,
        &'static str,
        Option<&'static str>,
        Requeue,
    );

    /// A running pod that counts as lost: the status says why, then the pod is deleted; the
    /// loss is declared once it terminates, with that cause as the NeedsResume reason.
    #[test]
    fn unreachable_agents_and_lost_nodes_table() {
        use SessionState as S;
        let running = Given {
            state: S::WaitingForInput,
            needs_resume: false,
            token: Some("t"),
            activity: Some(AgentActivity::Idle),
            pod: P::Running,
        };
        let missing_node = NodeHealth::Missing {
            scheduled: Some(at(0)),
        };
        // (reach at 100, action, AgentRunning reason, event reason, requeue)
        #[rustfmt::skip]
        let table: &[ReachRow] = &[
            (reach(None, NodeHealth::Ready),
                Some(NextAction::Follow { pod: "s-agent-1".into() }), "PodRunning", None, Requeue::Resync),
            (reach(Some(90), NodeHealth::Ready),
                Some(NextAction::Follow { pod: "s-agent-1".into() }), "PodRunning", None,
                Requeue::After(Duration::from_secs(50))),
            (reach(Some(10), NodeHealth::Ready),
                Some(NextAction::DeleteLostPod { pod: "s-agent-1".into(), force: false }),
                "AgentUnreachable", Some("AgentUnreachable"), Requeue::Resync),
            (reach(None, missing_node),
                Some(NextAction::DeleteLostPod { pod: "s-agent-1".into(), force: true }),
                "NodeLost", Some("NodeLost"), Requeue::Resync),
        ];
        for (facts, action, reason, event, requeue) in table {
            let t = observe(&objects(&running), Some(facts), at(100));
            let row = format!("{facts:?}");
            assert_eq!(&t.action, action, "{row}");
            let agent = conditions::find(&t.status.conditions, conditions::AGENT_RUNNING)
                .expect("AgentRunning");
            assert_eq!(agent.reason, *reason, "{row}");
            assert_eq!(t.event.as_ref().map(|e| e.reason), *event, "{row}");
            assert_eq!(t.requeue, *requeue, "{row}");
            assert!(
                !t.status.needs_resume,
                "not lost while the pod exists: {row}"
            );
            if event.is_some() {
                assert!(!conditions::is_true(
                    &t.status.conditions,
                    conditions::READY
                ));
                // The same pass again (the deletion not seen yet): deleted again, said once.
                let mut again = objects(&running);
                again.session.status = Some(t.status.clone());
                let t2 = observe(&again, Some(facts), at(101));
                assert_eq!(&t2.action, action, "{row}");
                assert!(t2.event.is_none(), "{row}: {:?}", t2.event);
                assert!(!t2.write, "{row}");

                // Terminating: lost, with the cause as the NeedsResume reason, once.
                let mut stopping = objects(&Given {
                    pod: P::Terminating,
                    ..running
                });
                stopping.session.status = Some(t.status.clone());
                let t4 = observe(&stopping, Some(facts), at(102));
                assert_eq!(
                    conditions::find(&t4.status.conditions, conditions::AGENT_RUNNING)
                        .map(|c| c.reason.as_str()),
                    Some(*reason)
                );
                assert!(t4.status.needs_resume, "{row}");
                let needs = conditions::find(&t4.status.conditions, conditions::NEEDS_RESUME)
                    .expect("NeedsResume");
                assert_eq!(
                    (needs.status.as_str(), needs.reason.as_str()),
                    ("True", *reason)
                );
                assert_eq!(
                    t4.action,
                    Some(NextAction::MarkExecutorLost { resumable: true })
                );
                let note = t4.event.expect("AgentLost");
                assert_eq!(note.reason, "AgentLost");
                assert!(note.message.contains(reason), "{}", note.message);
                let mut settled = objects(&Given {
                    pod: P::None,
                    needs_resume: true,
                    ..running
                });
                settled.session.status = Some(t4.status.clone());
                let t5 = observe(&settled, None, at(104));
                assert!(!t5.write, "{row}: {:?}", t5.status);
            }
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
            None,
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
        let first = observe(&objects(&given), None, at(10));
        assert!(first.write, "the first pass writes the conditions");
        let mut again = objects(&given);
        again.session.status = Some(first.status.clone());
        let second = observe(&again, None, at(20));
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
        let settled = observe(&objects(&given), None, at(10)).status;
        let mut bumped = objects(&given);
        bumped.session.status = Some(settled);
        bumped.session.metadata.generation = Some(2);
        let t = observe(&bumped, None, at(20));
        assert!(t.write);
        assert_eq!(t.status.observed_generation, Some(2));
    }

    /// A launch-time field changed after the running pod started: `SpecApplied=False` naming
    /// it, written with the new generation; absent again once it runs the spec, and while no
    /// agent runs.
    #[test]
    fn a_change_that_waits_for_the_next_launch_says_so() {
        use crate::api::launch_spec::{LAUNCH_SPEC_ANNOTATION, launch_spec_record};
        let given = |pod| Given {
            state: SessionState::WaitingForInput,
            needs_resume: false,
            token: Some("t"),
            activity: Some(AgentActivity::Idle),
            pod,
        };
        let with_record = |pod| {
            let mut objects = objects(&given(pod));
            let record = launch_spec_record(&objects.session.spec);
            if let Some(pod) = objects.pods.first_mut() {
                pod.metadata.annotations =
                    Some([(LAUNCH_SPEC_ANNOTATION.to_string(), record)].into());
            }
            objects
        };
        let spec_applied = |t: &Transition| {
            conditions::find(&t.status.conditions, conditions::SPEC_APPLIED)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        let same = observe(&with_record(P::Running), None, at(10));
        assert_eq!(spec_applied(&same), None);
        let mut changed = with_record(P::Running);
        changed.session.spec.image = Some("agent:2".into());
        changed.session.metadata.generation = Some(2);
        let t = observe(&changed, None, at(10));
        let (status, reason, message) = spec_applied(&t).expect("SpecApplied");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "PendingRestart")
        );
        assert!(
            message.starts_with("spec.image changed after agent pod s-agent-1 started")
                && message.ends_with("(kubectl kandev restart s)"),
            "{message}"
        );
        assert!(t.write);
        let mut lost = with_record(P::None);
        lost.session.spec.image = Some("agent:2".into());
        lost.session.status = Some(t.status.clone());
        assert_eq!(spec_applied(&observe(&lost, None, at(20))), None);
    }

    /// What waits for a person is the running agent's: mirrored with AwaitingApproval while the
    /// pod runs, gone (the condition False) once it does not; the configuration condition only
    /// on a session that asks for one.
    #[test]
    fn pending_permissions_and_the_configuration_follow_the_running_agent() {
        use crate::api::{PendingPermission, SessionConfigSpec, ToolKind};
        let given = |pod| Given {
            state: SessionState::Running,
            needs_resume: false,
            token: Some("t"),
            activity: Some(AgentActivity::Working),
            pod,
        };
        let waiting = |pod| {
            let mut objects = objects(&given(pod));
            if let Some(status) = objects.executor.as_mut().and_then(|er| er.status.as_mut()) {
                status.pending_permissions = vec![PendingPermission {
                    id: "k1-2".into(),
                    tool_kind: ToolKind::Execute,
                    title: "make".into(),
                    summary: String::new(),
                    options: vec![],
                    requested_at: "T".into(),
                }];
                status.session_config_problem = Some("mode \"x\" (offered: a)".into());
            }
            objects
        };
        let running = observe(&waiting(P::Running), None, at(10));
        assert_eq!(running.status.pending_permissions.len(), 1);
        let condition = conditions::find(&running.status.conditions, conditions::AWAITING_APPROVAL)
            .expect("AwaitingApproval");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "PermissionRequested")
        );
        assert!(
            condition.message.contains("kubectl kandev approve s k1-2"),
            "{}",
            condition.message
        );
        assert!(
            conditions::find(&running.status.conditions, conditions::SESSION_CONFIGURED).is_none(),
            "no sessionConfig asked, no condition"
        );
        let mut lost = waiting(P::None);
        lost.session.status = Some(running.status.clone());
        lost.session.spec.session_config = Some(SessionConfigSpec {
            mode: Some("x".into()),
            ..Default::default()
        });
        let gone = observe(&lost, None, at(20));
        assert!(gone.status.pending_permissions.is_empty());
        let condition = conditions::find(&gone.status.conditions, conditions::AWAITING_APPROVAL)
            .expect("AwaitingApproval");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "NoneWaiting")
        );
        let mut configured = waiting(P::Running);
        configured.session.spec.session_config = lost.session.spec.session_config.clone();
        let t = observe(&configured, None, at(30));
        let condition = conditions::find(&t.status.conditions, conditions::SESSION_CONFIGURED)
            .expect("SessionConfigured");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "NotOffered")
        );
    }
}
