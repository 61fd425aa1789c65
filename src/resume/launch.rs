//! The launch in progress (DESIGN §3 "Resume execution", steps 3–5): the one step the reconciler
//! takes next, decided from the session's pods.
//!
//! Pure: the reconciler gathers [`LaunchFacts`] from its caches and performs the
//! [`LaunchStep`] (create the pod, wait, run the restore, or end the launch with a reason).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::stall::{LaunchStall, checkout_stall, launch_stall, previous_pod_stall};
use super::status::{PodLiveness, pod_liveness};

/// What the reconciler knows about the launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchFacts<'a> {
    /// The launch was persisted (`STARTING`); otherwise it begins now.
    pub starting: bool,
    /// The pod of this launch (its deterministic name), as the cache shows it.
    pub launch_pod: Option<&'a Pod>,
    /// The operator created a pod of this session a moment ago (this launch's, or one of a
    /// request that a newer one superseded) and the cache does not show it yet.
    pub created_unseen: bool,
    /// Another pod of the session that may still run (see [`previous_pod_alive`]).
    pub previous_alive: Option<&'a Pod>,
    /// How long ago that pod was deleted (`None` while it is not being deleted).
    pub previous_deleted_ago: Option<Duration>,
    /// How long the launch pod has existed (`None` without a creation timestamp).
    pub age: Option<Duration>,
    /// `--launch-deadline`.
    pub deadline: Duration,
}

/// The next step of a launch.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchStep<'a> {
    /// Build the request, the ExecutorRunning and the workspace, and persist `STARTING`.
    Begin,
    /// A pod was created a moment ago: its watch event reconciles again.
    AwaitCreated,
    /// A pod of an earlier launch (a superseded request's, one the cache showed late) runs or
    /// waits to run on the workspace, and nothing deletes it: delete it, then wait for it.
    DeletePrevious(&'a Pod),
    /// A pod of an earlier launch is being deleted: wait until it is gone, look again by the
    /// deadline.
    WaitForPrevious {
        pod: &'a Pod,
        until_deadline: Duration,
    },
    /// Create this launch's pod.
    CreatePod,
    /// The pod is on its way: its watch events drive the launch; look again by the deadline.
    AwaitRunning { until_deadline: Duration },
    /// The pod did not run within the deadline.
    Stalled(&'a Pod, LaunchStall),
    /// agentctl runs in the pod: open the exec and restore the agent session.
    Restore(&'a Pod),
    /// agentctl could not prepare the workspace from the repository.
    CheckoutFailed(&'a Pod, LaunchStall),
    /// The pod was deleted or died before the restore ran.
    LostWhileStarting(&'a Pod, PodLiveness),
}

/// Decides the next step of the launch described by `facts`.
///
/// Every wait is bounded: a created pod is awaited in the cache for a moment at most (then
/// `created_unseen` is false), a pending pod and a previous pod being deleted until the
/// deadline, after which the launch is stalled with the reason. A previous pod that nothing
/// deletes is deleted, so that no launch waits for what never comes.
pub fn launch_step<'a>(facts: &LaunchFacts<'a>) -> LaunchStep<'a> {
    if !facts.starting {
        return LaunchStep::Begin;
    }
    if facts.created_unseen {
        return LaunchStep::AwaitCreated;
    }
    if let Some(previous) = facts.previous_alive {
        return match facts.previous_deleted_ago {
            None => LaunchStep::DeletePrevious(previous),
            Some(ago) if ago >= facts.deadline => {
                LaunchStep::Stalled(previous, previous_pod_stall(previous, facts.deadline))
            }
            Some(ago) => LaunchStep::WaitForPrevious {
                pod: previous,
                until_deadline: facts.deadline.saturating_sub(ago),
            },
        };
    }
    let Some(pod) = facts.launch_pod else {
        return LaunchStep::CreatePod;
    };
    match pod_liveness(Some(pod)) {
        PodLiveness::Pending => {
            let stall = facts
                .age
                .and_then(|age| launch_stall(pod, age, facts.deadline, None));
            match stall {
                Some(stall) => LaunchStep::Stalled(pod, stall),
                None => LaunchStep::AwaitRunning {
                    until_deadline: facts.deadline.saturating_sub(facts.age.unwrap_or_default()),
                },
            }
        }
        PodLiveness::Running => LaunchStep::Restore(pod),
        PodLiveness::Failed => match checkout_stall(pod) {
            Some(stall) => LaunchStep::CheckoutFailed(pod, stall),
            None => LaunchStep::LostWhileStarting(pod, PodLiveness::Failed),
        },
        lost @ (PodLiveness::Terminating | PodLiveness::Missing) => {
            LaunchStep::LostWhileStarting(pod, lost)
        }
    }
}

/// Another pod of the session than `launch_pod_name` that may still run (an earlier launch, a
/// superseded attempt, one in its termination grace period): a new agentctl must not start
/// beside it on the same workspace.
pub fn previous_pod_alive<'a>(pods: &'a [Pod], launch_pod_name: &str) -> Option<&'a Pod> {
    pods.iter().find(|p| {
        p.metadata.name.as_deref() != Some(launch_pod_name)
            && matches!(
                pod_liveness(Some(p)),
                PodLiveness::Running | PodLiveness::Pending | PodLiveness::Terminating
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    const DEADLINE: Duration = Duration::from_secs(300);

    fn pod(name: &str, phase: &str, extra: serde_json::Value) -> Pod {
        let mut value = json!({
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": phase},
        });
        if let (Some(target), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            for (key, v) in extra {
                match (target.get_mut(key), v) {
                    (Some(serde_json::Value::Object(t)), serde_json::Value::Object(v)) => {
                        t.extend(v.clone());
                    }
                    _ => {
                        target.insert(key.clone(), v.clone());
                    }
                }
            }
        }
        serde_json::from_value(value).expect("a pod")
    }

    fn running(name: &str) -> Pod {
        pod(
            name,
            "Running",
            json!({"status": {"containerStatuses": [{
                "name": "agentctl", "image": "i", "ready": true, "restartCount": 0, "imageID": "",
                "containerID": "", "state": {"running": {}}
            }]}}),
        )
    }

    fn pending_pulling(name: &str) -> Pod {
        pod(
            name,
            "Pending",
            json!({"status": {"containerStatuses": [{
                "name": "agentctl", "image": "i", "ready": false, "restartCount": 0, "imageID": "",
                "containerID": "", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}
            }]}}),
        )
    }

    fn terminating(name: &str) -> Pod {
        pod(
            name,
            "Running",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:01:00Z"}}),
        )
    }

    fn failed(name: &str, message: Option<&str>) -> Pod {
        pod(
            name,
            "Failed",
            json!({"status": {"containerStatuses": [{
                "name": "agentctl", "image": "i", "ready": false, "restartCount": 0, "imageID": "",
                "containerID": "", "state": {"terminated": {"exitCode": 1, "message": message}}
            }]}}),
        )
    }

    fn facts<'a>(launch_pod: Option<&'a Pod>, age: u64) -> LaunchFacts<'a> {
        LaunchFacts {
            starting: true,
            launch_pod,
            created_unseen: false,
            previous_alive: None,
            previous_deleted_ago: None,
            age: Some(Duration::from_secs(age)),
            deadline: DEADLINE,
        }
    }

    /// One row per branch of the launch: (what, facts, expected step).
    #[test]
    fn launch_steps() {
        let run = running("s-agent-new");
        let old = running("s-agent-old");
        let old_going = terminating("s-agent-old");
        let pulling = pending_pulling("s-agent-new");
        let going = terminating("s-agent-new");
        let died = failed("s-agent-new", None);
        let checkout = failed(
            "s-agent-new",
            Some("RepositoryAuthFailed: cloning https://h/a.git failed: Authentication failed"),
        );
        let rows: Vec<(&str, LaunchFacts, LaunchStep)> = vec![
            (
                "not STARTING yet: the launch begins",
                LaunchFacts {
                    starting: false,
                    ..facts(Some(&run), 0)
                },
                LaunchStep::Begin,
            ),
            (
                "created a moment ago, not in the cache yet",
                LaunchFacts {
                    created_unseen: true,
                    previous_alive: Some(&old),
                    ..facts(None, 0)
                },
                LaunchStep::AwaitCreated,
            ),
            (
                // The storm of resume tokens (issue 31): a superseded request's pod, created
                // before the cache showed it, was deleted by nobody, and the launch of the
                // newer request waited for it for good.
                "an earlier launch's pod runs and nothing deletes it: delete it",
                LaunchFacts {
                    previous_alive: Some(&old),
                    ..facts(None, 0)
                },
                LaunchStep::DeletePrevious(&old),
            ),
            (
                "an earlier launch's pod beside this launch's own: deleted first",
                LaunchFacts {
                    previous_alive: Some(&old),
                    ..facts(Some(&run), 5)
                },
                LaunchStep::DeletePrevious(&old),
            ),
            (
                "an earlier launch's pod is being deleted: wait, look again by the deadline",
                LaunchFacts {
                    previous_alive: Some(&old_going),
                    previous_deleted_ago: Some(Duration::from_secs(20)),
                    ..facts(None, 0)
                },
                LaunchStep::WaitForPrevious {
                    pod: &old_going,
                    until_deadline: Duration::from_secs(280),
                },
            ),
            (
                "an earlier launch's pod is still there a deadline after its deletion: stalled",
                LaunchFacts {
                    previous_alive: Some(&old_going),
                    previous_deleted_ago: Some(DEADLINE),
                    ..facts(None, 0)
                },
                LaunchStep::Stalled(&old_going, previous_pod_stall(&old_going, DEADLINE)),
            ),
            (
                "nothing runs: create the pod",
                facts(None, 0),
                LaunchStep::CreatePod,
            ),
            (
                "pending within the deadline",
                facts(Some(&pulling), 100),
                LaunchStep::AwaitRunning {
                    until_deadline: Duration::from_secs(200),
                },
            ),
            (
                "pending without a creation timestamp: never stalled by age",
                LaunchFacts {
                    age: None,
                    ..facts(Some(&pulling), 0)
                },
                LaunchStep::AwaitRunning {
                    until_deadline: DEADLINE,
                },
            ),
            (
                "pending past the deadline",
                facts(Some(&pulling), 301),
                LaunchStep::Stalled(
                    &pulling,
                    LaunchStall {
                        reason: "ImagePullBackOff",
                        message: launch_stall(&pulling, Duration::from_secs(301), DEADLINE, None)
                            .expect("a stall")
                            .message,
                    },
                ),
            ),
            (
                "agentctl runs: restore",
                facts(Some(&run), 5),
                LaunchStep::Restore(&run),
            ),
            (
                "deleted while starting",
                facts(Some(&going), 5),
                LaunchStep::LostWhileStarting(&going, PodLiveness::Terminating),
            ),
            (
                "died while starting",
                facts(Some(&died), 5),
                LaunchStep::LostWhileStarting(&died, PodLiveness::Failed),
            ),
        ];
        for (what, facts, expected) in rows {
            assert_eq!(launch_step(&facts), expected, "{what}");
        }
        // The checkout's own termination message ends the launch with its reason.
        match launch_step(&facts(Some(&checkout), 5)) {
            LaunchStep::CheckoutFailed(_, stall) => {
                assert_eq!(Some(&stall), checkout_stall(&checkout).as_ref());
            }
            other => panic!("a failed checkout: {other:?}"),
        }
    }

    mod liveness {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Every wait of a launch ends (issue 31): each looks again by the deadline, and
            /// once every clock the launch waits on has passed it (the launch pod's age, the
            /// previous pod's deletion; a created pod is awaited in the cache for a moment
            /// only), the step is never a wait. A previous pod is deleted only while nothing
            /// deletes it, so the deletion is not repeated.
            #[test]
            fn no_launch_waits_past_its_deadline(
                launch in 0usize..6,
                previous in 0usize..4,
                starting: bool,
                created_unseen: bool,
                age in 0u64..600,
                deleted_ago in 0u64..600,
                deadline in 1u64..400,
            ) {
                let launch_pods = [
                    None,
                    Some(running("s-agent-new")),
                    Some(pending_pulling("s-agent-new")),
                    Some(pod("s-agent-new", "Pending", json!({}))),
                    Some(terminating("s-agent-new")),
                    Some(failed("s-agent-new", None)),
                ];
                let previous_pods = [
                    None,
                    Some(running("s-agent-old")),
                    Some(pending_pulling("s-agent-old")),
                    Some(terminating("s-agent-old")),
                ];
                let previous = previous_pods[previous].as_ref();
                let deleting = previous.is_some_and(|p| p.metadata.deletion_timestamp.is_some());
                let deadline = Duration::from_secs(deadline);
                let facts = LaunchFacts {
                    starting,
                    launch_pod: launch_pods[launch].as_ref(),
                    created_unseen,
                    previous_alive: previous,
                    previous_deleted_ago: deleting.then(|| Duration::from_secs(deleted_ago)),
                    age: Some(Duration::from_secs(age)),
                    deadline,
                };
                let step = launch_step(&facts);
                match &step {
                    LaunchStep::AwaitRunning { until_deadline }
                    | LaunchStep::WaitForPrevious { until_deadline, .. } => {
                        prop_assert!(*until_deadline <= deadline, "{step:?}");
                    }
                    LaunchStep::DeletePrevious(_) => prop_assert!(!deleting, "{step:?}"),
                    _ => {}
                }
                let all_clocks_past = !created_unseen
                    && Duration::from_secs(age) >= deadline
                    && (!deleting || Duration::from_secs(deleted_ago) >= deadline);
                if all_clocks_past {
                    prop_assert!(
                        !matches!(
                            step,
                            LaunchStep::AwaitCreated
                                | LaunchStep::AwaitRunning { .. }
                                | LaunchStep::WaitForPrevious { .. }
                        ),
                        "a wait past the deadline: {step:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_previous_pod_counts_while_it_may_run() {
        let new = running("s-agent-new");
        let cases = [
            (running("s-agent-old"), true),
            (pending_pulling("s-agent-old"), true),
            (terminating("s-agent-old"), true),
            (failed("s-agent-old", None), false),
        ];
        for (old, alive) in cases {
            let pods = [new.clone(), old.clone()];
            assert_eq!(
                previous_pod_alive(&pods, "s-agent-new").is_some(),
                alive,
                "{:?}",
                old.status
            );
        }
        // The launch's own pod is never its previous one.
        assert!(previous_pod_alive(&[new], "s-agent-new").is_none());
    }
}
