//! Status evaluation (DESIGN §3 "Status evaluation"): does a session need a resume, and may it
//! be offered one?
//!
//! Pure: the caller looks at the live Pod (UID, phase, deletion timestamp) and the
//! ExecutorRunning record, condenses them into [`SessionFacts`], and this module decides.
//! `podName` in status is only a hint, so [`PodLiveness`] must come from the live Pod
//! ([`pod_liveness`]); the operator and `kubectl kandev` read pods the same way.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use crate::api::{ResumeReason, SessionState};

/// What the live agentctl Pod looks like right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodLiveness {
    /// Phase Running and reachable (exec/readiness answered): the agent is alive.
    Running,
    /// Created, not yet running (scheduling, image pull, init containers).
    Pending,
    /// No pod with the recorded UID exists any more.
    Missing,
    /// `deletionTimestamp` is set and its containers may still run (drain, eviction,
    /// preemption): lost for status evaluation (it will not come back), but a new launch
    /// waits until it is gone, so that no second agentctl starts on the same workspace during
    /// its grace period (as a StatefulSet waits for its pod).
    Terminating,
    /// Phase Failed/Succeeded, evicted, or its node is gone.
    Failed,
}

impl PodLiveness {
    pub const ALL: [PodLiveness; 5] = [
        Self::Running,
        Self::Pending,
        Self::Missing,
        Self::Terminating,
        Self::Failed,
    ];

    /// "pod missing/dead" in DESIGN §3 rules 2 and 3.
    ///
    /// `Pending` is deliberately *not* lost: a pod that is still being scheduled or pulling its
    /// image is on its way, and declaring it lost would let a resume create a second pod next
    /// to it. A pod stuck in Pending forever is the launch deadline's to handle, not a rule
    /// of this table. `Terminating` is lost: it is on its way out and never comes back.
    pub fn is_lost(self) -> bool {
        matches!(self, Self::Missing | Self::Failed | Self::Terminating)
    }
}

/// What the live pod looks like (DESIGN §3: pointers are hints, the live Pod is the truth).
///
/// No pod → `Missing`; phase Failed/Succeeded → `Failed`; otherwise a deletion timestamp →
/// `Terminating`; phase Running with every container running → `Running`, with a container
/// that stopped → `Failed`; anything else (Pending, unknown) → `Pending`.
/// The terminated states of `pod`'s init containers and containers, where agentctl's
/// termination message (why it ended: a checkout that failed, a suspension) is read.
pub(crate) fn terminated_containers(pod: &Pod) -> impl Iterator<Item = &ContainerStateTerminated> {
    pod.status
        .iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
}

pub fn pod_liveness(pod: Option<&Pod>) -> PodLiveness {
    let Some(pod) = pod else {
        return PodLiveness::Missing;
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed" | "Succeeded")) {
        return PodLiveness::Failed;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodLiveness::Terminating;
    }
    match phase {
        Some("Running") => {
            let ready = status
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
                });
            if ready {
                PodLiveness::Running
            } else {
                PodLiveness::Failed
            }
        }
        _ => PodLiveness::Pending,
    }
}

/// The session's current agentctl pod among its managed pods: the one ExecutorRunning records
/// (same UID, so a recreated pod of the same name is not mistaken for it), else the newest.
pub fn current_pod<'a>(pods: &'a [Pod], recorded_uid: Option<&str>) -> Option<&'a Pod> {
    recorded_uid
        .and_then(|uid| pods.iter().find(|p| p.metadata.uid.as_deref() == Some(uid)))
        .or_else(|| {
            pods.iter()
                .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0))
        })
}

/// Everything status evaluation looks at, already read from the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionFacts {
    /// `TaskSession.status.state`.
    pub state: SessionState,
    /// `ExecutorRunning.status.resumeToken` is present and non-empty.
    pub has_resume_token: bool,
    /// An ExecutorRunning record exists for the session.
    pub executor_exists: bool,
    /// `ExecutorRunning.status.resumable`.
    pub executor_resumable: bool,
    /// The live agentctl Pod.
    pub pod: PodLiveness,
}

/// The verdict that backs `status.needsResume`, `status.isResumable` and `status.resumeReason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeEvaluation {
    /// The session lost its agent and should be resumed (drives the `NeedsResume` condition).
    pub needs_resume: bool,
    /// A resume request would be accepted and would launch an agent.
    pub is_resumable: bool,
    pub reason: ResumeReason,
}

impl ResumeEvaluation {
    fn needs_resume(reason: ResumeReason) -> Self {
        Self {
            needs_resume: true,
            is_resumable: true,
            reason,
        }
    }

    fn no_resume(reason: ResumeReason) -> Self {
        Self {
            needs_resume: false,
            is_resumable: false,
            reason,
        }
    }
}

/// Applies DESIGN §3 status evaluation rules 1–4, first match wins:
///
/// 1. Pod running and reachable → nothing to resume (`already_running`), whatever the state:
///    a live agent is never relaunched. A `Pending` pod on an active session is treated the
///    same way (see [`PodLiveness::is_lost`]); the reason stays `already_running` because the
///    pod is on its way and a resume would only duplicate it.
/// - A `Terminating` pod counts as lost at once (it never comes back): `NeedsResume` shows
///   within a pass of the deletion, and a resume request's launch waits for the pod to be gone
///   (`WaitingForPreviousPod`), so two agentctl never share the workspace.
/// 4. Terminal states block resume. The one offer is a FAILED session with a token and an
///    executor marked resumable: `is_resumable=true`, reason `failed_session_resumable`, but
///    `needs_resume=false` — the failure was reported, not a silent loss, so the user decides
///    (and no `NeedsResume` condition nags about it).
/// - CREATED never got an executor → `no_executor`.
/// 2. Token + active state + pod lost → `agent_not_running` (restore that ACP session).
/// 3. No token + ExecutorRunning exists + active state + pod lost →
///    `agent_not_running_fresh_start`.
/// - Active, pod lost, but neither token nor executor → `no_executor`: there is nothing to
///   resume from (the launch never got far enough to record an executor).
pub fn evaluate_resume_eligibility(facts: &SessionFacts) -> ResumeEvaluation {
    // Rule 1.
    if facts.pod == PodLiveness::Running {
        return ResumeEvaluation::no_resume(ResumeReason::AlreadyRunning);
    }
    // Rule 4.
    if facts.state.is_terminal() {
        let failed_but_resumable = facts.state == SessionState::Failed
            && facts.has_resume_token
            && facts.executor_exists
            && facts.executor_resumable;
        return if failed_but_resumable {
            ResumeEvaluation {
                needs_resume: false,
                is_resumable: true,
                reason: ResumeReason::FailedSessionResumable,
            }
        } else {
            ResumeEvaluation::no_resume(ResumeReason::TerminalState)
        };
    }
    if !facts.state.is_active() {
        // CREATED: the session never started, so there is no executor to resume.
        return ResumeEvaluation::no_resume(ResumeReason::NoExecutor);
    }
    match facts.pod {
        // The agent is on its way.
        PodLiveness::Pending => return ResumeEvaluation::no_resume(ResumeReason::AlreadyRunning),
        PodLiveness::Running
        | PodLiveness::Missing
        | PodLiveness::Failed
        | PodLiveness::Terminating => {}
    }
    if facts.has_resume_token {
        // Rule 2.
        ResumeEvaluation::needs_resume(ResumeReason::AgentNotRunning)
    } else if facts.executor_exists {
        // Rule 3.
        ResumeEvaluation::needs_resume(ResumeReason::AgentNotRunningFreshStart)
    } else {
        ResumeEvaluation::no_resume(ResumeReason::NoExecutor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PodLiveness as Pod;
    use ResumeReason as R;
    use SessionState as S;
    use pretty_assertions::assert_eq;

    /// (state, token, executor, executor_resumable, pod) → (needs_resume, is_resumable, reason)
    type Row = (S, bool, bool, bool, Pod, bool, bool, R);

    #[test]
    fn named_cases() {
        #[rustfmt::skip]
        let rows: &[Row] = &[
            // §3 evaluation rule 1: pod running and reachable → already running, any state.
            (S::Running, true, true, true, Pod::Running, false, false, R::AlreadyRunning),
            (S::WaitingForInput, false, true, false, Pod::Running, false, false, R::AlreadyRunning),
            (S::Starting, false, false, false, Pod::Running, false, false, R::AlreadyRunning),
            (S::Failed, true, true, true, Pod::Running, false, false, R::AlreadyRunning),
            (S::Completed, true, true, false, Pod::Running, false, false, R::AlreadyRunning),
            // Decision: a Pending pod on an active session is on its way, not lost.
            (S::Running, true, true, true, Pod::Pending, false, false, R::AlreadyRunning),
            (S::Starting, false, true, false, Pod::Pending, false, false, R::AlreadyRunning),
            // §3 evaluation rule 2: token + active state + pod missing/dead → agent_not_running.
            (S::WaitingForInput, true, true, true, Pod::Missing, true, true, R::AgentNotRunning),
            (S::Running, true, true, false, Pod::Failed, true, true, R::AgentNotRunning),
            (S::Starting, true, true, true, Pod::Failed, true, true, R::AgentNotRunning),
            // §3 evaluation rule 3: no token + executor + active + pod dead → fresh start.
            (S::WaitingForInput, false, true, false, Pod::Missing, true, true, R::AgentNotRunningFreshStart),
            (S::Running, false, true, true, Pod::Failed, true, true, R::AgentNotRunningFreshStart),
            (S::Starting, false, true, false, Pod::Missing, true, true, R::AgentNotRunningFreshStart),
            // Decision: a Terminating pod is lost at once (its relaunch waits for it to go).
            (S::Running, true, true, false, Pod::Terminating, true, true, R::AgentNotRunning),
            (S::WaitingForInput, false, true, false, Pod::Terminating, true, true, R::AgentNotRunningFreshStart),
            // Decision: active, pod dead, neither token nor executor → nothing to resume from.
            (S::Running, false, false, false, Pod::Missing, false, false, R::NoExecutor),
            // CREATED never got an executor.
            (S::Created, false, false, false, Pod::Missing, false, false, R::NoExecutor),
            (S::Created, true, true, true, Pod::Failed, false, false, R::NoExecutor),
            // §3 evaluation rule 4: terminal states block resume…
            (S::Completed, true, true, true, Pod::Missing, false, false, R::TerminalState),
            (S::Cancelled, true, true, true, Pod::Missing, false, false, R::TerminalState),
            (S::Failed, false, true, true, Pod::Missing, false, false, R::TerminalState),
            (S::Failed, true, true, false, Pod::Missing, false, false, R::TerminalState),
            (S::Failed, true, false, true, Pod::Missing, false, false, R::TerminalState),
            // …except a FAILED session with a token and a resumable executor is offered.
            (S::Failed, true, true, true, Pod::Missing, false, true, R::FailedSessionResumable),
            (S::Failed, true, true, true, Pod::Failed, false, true, R::FailedSessionResumable),
            (S::Failed, true, true, true, Pod::Pending, false, true, R::FailedSessionResumable),
        ];
        for &(state, token, executor, resumable, pod, needs, is_resumable, reason) in rows {
            let facts = SessionFacts {
                state,
                has_resume_token: token,
                executor_exists: executor,
                executor_resumable: resumable,
                pod,
            };
            let expected = ResumeEvaluation {
                needs_resume: needs,
                is_resumable,
                reason,
            };
            assert_eq!(evaluate_resume_eligibility(&facts), expected, "{facts:?}");
        }
    }

    fn pod(phase: &str, running: bool, deleting: bool) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p",
                "deletionTimestamp": if deleting { Some("2026-01-01T00:00:00Z") } else { None },
            },
            "status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": "agentctl", "image": "i", "imageID": "", "ready": running, "restartCount": 0,
                    "state": if running { serde_json::json!({"running": {}}) } else { serde_json::json!({"terminated": {"exitCode": 137}}) },
                }],
            },
        }))
        .expect("pod")
    }

    #[test]
    fn live_pod_decides_liveness() {
        let cases = [
            (None, Pod::Missing),
            (Some(pod("Running", true, false)), Pod::Running),
            (Some(pod("Running", true, true)), Pod::Terminating),
            (Some(pod("Pending", false, true)), Pod::Terminating),
            (Some(pod("Failed", false, true)), Pod::Failed),
            (Some(pod("Running", false, false)), Pod::Failed),
            (Some(pod("Failed", false, false)), Pod::Failed),
            (Some(pod("Succeeded", false, false)), Pod::Failed),
            (Some(pod("Pending", false, false)), Pod::Pending),
            (Some(pod("Unknown", false, false)), Pod::Pending),
        ];
        for (pod, expected) in cases {
            assert_eq!(pod_liveness(pod.as_ref()), expected, "{pod:?}");
        }
    }

    #[test]
    fn current_pod_prefers_the_recorded_uid_then_the_newest() {
        let make = |name: &str, uid: &str, created: &str| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "uid": uid, "creationTimestamp": created},
            }))
            .expect("pod")
        };
        let pods = [
            make("old", "u1", "2026-01-01T00:00:00Z"),
            make("new", "u2", "2026-01-02T00:00:00Z"),
        ];
        let name =
            |p: Option<&k8s_openapi::api::core::v1::Pod>| p.and_then(|p| p.metadata.name.clone());
        assert_eq!(name(current_pod(&pods, Some("u1"))).as_deref(), Some("old"));
        assert_eq!(
            name(current_pod(&pods, Some("gone"))).as_deref(),
            Some("new")
        );
        assert_eq!(name(current_pod(&pods, None)).as_deref(), Some("new"));
        assert_eq!(name(current_pod(&[], Some("u1"))), None);
    }

    fn all_facts() -> Vec<SessionFacts> {
        let mut all = Vec::new();
        for state in S::ALL {
            for has_resume_token in [false, true] {
                for executor_exists in [false, true] {
                    for executor_resumable in [false, true] {
                        for pod in Pod::ALL {
                            all.push(SessionFacts {
                                state,
                                has_resume_token,
                                executor_exists,
                                executor_resumable,
                                pod,
                            });
                        }
                    }
                }
            }
        }
        all
    }

    #[test]
    fn invariants_hold_over_every_combination() {
        let all = all_facts();
        assert_eq!(all.len(), 7 * 2 * 2 * 2 * 5);
        for facts in all {
            let eval = evaluate_resume_eligibility(&facts);
            let ctx = format!("{facts:?} → {eval:?}");
            // §3 evaluation rule 1: a running pod never needs a resume.
            if facts.pod == Pod::Running {
                assert_eq!(eval.reason, R::AlreadyRunning, "{ctx}");
            }
            // Rules 2/3: a resume is only needed for an active session whose pod is lost.
            if eval.needs_resume {
                assert!(facts.state.is_active() && facts.pod.is_lost(), "{ctx}");
                assert!(eval.is_resumable, "{ctx}");
            }
            // Rule 2 exactly.
            if facts.state.is_active() && facts.pod.is_lost() && facts.has_resume_token {
                assert_eq!(
                    (eval.needs_resume, eval.reason),
                    (true, R::AgentNotRunning),
                    "{ctx}"
                );
            }
            // Rule 3 exactly.
            if facts.state.is_active()
                && facts.pod.is_lost()
                && !facts.has_resume_token
                && facts.executor_exists
            {
                let expected = (true, R::AgentNotRunningFreshStart);
                assert_eq!((eval.needs_resume, eval.reason), expected, "{ctx}");
            }
            // Rule 4: terminal states never need a resume; only FAILED may be offered one.
            if facts.state.is_terminal() {
                assert!(!eval.needs_resume, "{ctx}");
            }
            let offered = facts.pod != Pod::Running
                && facts.state == S::Failed
                && facts.has_resume_token
                && facts.executor_exists
                && facts.executor_resumable;
            assert_eq!(eval.reason == R::FailedSessionResumable, offered, "{ctx}");
            // Resumable without needing a resume happens only for that offer.
            if eval.is_resumable && !eval.needs_resume {
                assert_eq!(eval.reason, R::FailedSessionResumable, "{ctx}");
            }
            // A pod that is being started is never treated as lost.
            if facts.pod == Pod::Pending {
                assert!(!eval.needs_resume, "{ctx}");
            }
        }
    }
}
