//! Why a launch is stuck: once the launch deadline has passed since the agentctl pod was created
//! and agentctl still does not answer, the pod's own status names the cause.

use k8s_openapi::api::core::v1::Pod;

use super::status::{PodLiveness, pod_liveness, terminated_containers};
use crate::api::pod_contract::CheckoutReason;

/// A launch that did not reach a running agentctl within the deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchStall {
    /// CamelCase condition reason: `ImagePullBackOff`, `CreateContainerConfigError`,
    /// `Unschedulable`, `PVCNotBound`, `PodPending`, `AgentctlUnreachable` or
    /// `PreviousPodNotGone`.
    pub reason: &'static str,
    /// What the pod says, for the condition and the Event.
    pub message: String,
}

/// The stall of a launch whose `pod` plainly cannot start, whatever its deadline: its image
/// cannot be pulled, a Secret or key it needs is missing, it cannot be scheduled, or its PVC is
/// not bound. `kubectl kandev resume --wait` reports it at once, and a new request supersedes
/// such a launch instead of joining it.
pub fn plain_stall(pod: &Pod) -> Option<LaunchStall> {
    if pod_liveness(Some(pod)) != PodLiveness::Pending {
        return None;
    }
    let zero = std::time::Duration::ZERO;
    launch_stall(pod, zero, zero, None).filter(|stall| {
        matches!(
            stall.reason,
            "ImagePullBackOff" | "CreateContainerConfigError" | "Unschedulable" | "PVCNotBound"
        )
    })
}

/// The stall of the launch whose pod is `pod`, `age` after the pod was created; `None` while
/// the deadline has not passed. `agentctl_error` is the last error of opening the exec into a
/// running pod, if any.
pub fn launch_stall(
    pod: &Pod,
    age: std::time::Duration,
    deadline: std::time::Duration,
    agentctl_error: Option<&str>,
) -> Option<LaunchStall> {
    if age < deadline {
        return None;
    }
    let status = pod.status.as_ref();
    // The init container (the checkout) first: while it waits, the agent's container only
    // says PodInitializing.
    let waiting = status
        .into_iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .filter_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            Some((
                c.name.as_str(),
                waiting.reason.as_deref().unwrap_or(""),
                waiting.message.as_deref().unwrap_or(""),
            ))
        })
        .find(|(_, reason, _)| !matches!(*reason, "" | "ContainerCreating" | "PodInitializing"));
    let within = format!("within {}s", deadline.as_secs());
    if let Some((container, reason, message)) = waiting {
        let reason = match reason {
            "ImagePullBackOff" | "ErrImagePull" | "InvalidImageName" | "ErrImageNeverPull" => {
                "ImagePullBackOff"
            }
            "CreateContainerConfigError" => "CreateContainerConfigError",
            _ => "PodPending",
        };
        return Some(LaunchStall {
            reason,
            message: format!(
                "agentctl did not start {within}: container {container}: {}",
                describe(reason, message)
            ),
        });
    }
    let unscheduled = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(condition) = unscheduled {
        let message = condition.message.as_deref().unwrap_or("");
        let reason = if message.contains("PersistentVolumeClaim") {
            "PVCNotBound"
        } else {
            "Unschedulable"
        };
        return Some(LaunchStall {
            reason,
            message: format!(
                "agentctl pod not scheduled {within}: {}",
                describe(reason, message)
            ),
        });
    }
    if status.and_then(|s| s.phase.as_deref()) == Some("Running") {
        return Some(LaunchStall {
            reason: "AgentctlUnreachable",
            message: format!(
                "agentctl does not answer exec {within}: {}",
                agentctl_error.unwrap_or("no answer")
            ),
        });
    }
    Some(LaunchStall {
        reason: "PodPending",
        message: format!("agentctl pod still Pending {within}"),
    })
}

/// A launch whose agentctl could not prepare the workspace from `spec.repository`: its
/// container ended with a termination message `"<Reason>: <message>"` for one of the
/// [`CheckoutReason`]s (`WorkspaceMismatch`, `WorkspaceEmpty`, `RepositoryAuthFailed`,
/// `RepositoryUnreachable`, `RepositoryCheckoutFailed`). Anything else (an agent that wrote its
/// own message, a crash) is not a checkout failure.
pub fn checkout_stall(pod: &Pod) -> Option<LaunchStall> {
    let (reason, text) = terminated_containers(pod)
        .find_map(|t| CheckoutReason::from_termination_message(t.message.as_deref()?))?;
    Some(LaunchStall {
        reason: reason.as_str(),
        message: format!("agentctl could not prepare the workspace: {text}"),
    })
}

/// The stall of a launch whose `previous` pod (of an earlier launch, on the same workspace) was
/// deleted `deadline` ago or longer and is still there: its node does not confirm the deletion
/// (lost, or its kubelet stopped), and a second agentctl must not start beside it.
pub fn previous_pod_stall(previous: &Pod, deadline: std::time::Duration) -> LaunchStall {
    let name = previous.metadata.name.as_deref().unwrap_or_default();
    let node = previous
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .map(|n| format!(" on node {n}"))
        .unwrap_or_default();
    LaunchStall {
        reason: "PreviousPodNotGone",
        message: format!(
            "pod {name}{node} of an earlier launch is still there {}s after its deletion, so agentctl was not started beside it on the same workspace",
            deadline.as_secs()
        ),
    }
}

fn describe(reason: &str, message: &str) -> String {
    if message.is_empty() {
        reason.to_string()
    } else {
        format!("{reason}: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).expect("pod")
    }

    fn waiting(reason: &str, message: &str) -> serde_json::Value {
        json!({"phase": "Pending", "containerStatuses": [{"name": "agentctl", "image": "i",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}}]})
    }

    #[test]
    fn checkout_failures_come_from_the_termination_message() {
        // The checkout's init container ended with the message; the agent's never started.
        let ended = |message: &str| {
            pod(json!({"phase": "Failed",
                "initContainerStatuses": [{"name": "checkout", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "message": message}}}],
                "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}}}]}))
        };
        let cases = [
            (
                "WorkspaceMismatch: the workspace is not empty",
                Some("WorkspaceMismatch"),
            ),
            (
                "RepositoryAuthFailed: cloning https://h/a.git failed: Authentication failed",
                Some("RepositoryAuthFailed"),
            ),
            ("RepositoryUnreachable: x", Some("RepositoryUnreachable")),
            (
                "RepositoryCheckoutFailed: x",
                Some("RepositoryCheckoutFailed"),
            ),
            ("Error: the agent crashed", None),
            ("", None),
        ];
        for (message, want) in cases {
            let got = checkout_stall(&ended(message));
            assert_eq!(got.as_ref().map(|s| s.reason), want, "{message}");
            if let Some(stall) = got {
                assert!(
                    stall
                        .message
                        .starts_with("agentctl could not prepare the workspace: "),
                    "{stall:?}"
                );
            }
        }
        assert_eq!(checkout_stall(&pod(json!({"phase": "Running"}))), None);
    }

    #[test]
    fn the_pod_names_the_cause_once_the_deadline_passed() {
        let deadline = Duration::from_secs(120);
        let late = Duration::from_secs(121);
        let cases = [
            (
                waiting("ImagePullBackOff", "Back-off pulling image \"nope:1\""),
                "ImagePullBackOff",
                "Back-off pulling image \"nope:1\"",
            ),
            (
                waiting("ErrImagePull", "not found"),
                "ImagePullBackOff",
                "not found",
            ),
            (
                waiting("CreateContainerConfigError", "secret \"creds\" not found"),
                "CreateContainerConfigError",
                "secret \"creds\" not found",
            ),
            (
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}]}),
                "Unschedulable",
                "didn't match Pod's node affinity/selector",
            ),
            (
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."}]}),
                "PVCNotBound",
                "unbound immediate PersistentVolumeClaims",
            ),
            (
                waiting("ContainerCreating", ""),
                "PodPending",
                "still Pending within 120s",
            ),
            (
                waiting("PodInitializing", ""),
                "PodPending",
                "still Pending within 120s",
            ),
            (
                // The checkout's (init) container cannot start: it names the cause, not the
                // agent's container behind it.
                json!({"phase": "Pending",
                    "initContainerStatuses": [{"name": "checkout", "image": "i", "imageID": "",
                        "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "CreateContainerConfigError",
                            "message": "secret \"git\" not found"}}}],
                    "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "",
                        "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "PodInitializing"}}}]}),
                "CreateContainerConfigError",
                "container checkout: CreateContainerConfigError: secret \"git\" not found",
            ),
            (
                json!({"phase": "Running"}),
                "AgentctlUnreachable",
                "connection refused",
            ),
        ];
        for (status, reason, message) in cases {
            let stall = launch_stall(&pod(status), late, deadline, Some("connection refused"))
                .expect("stalled");
            assert_eq!(stall.reason, reason, "{stall:?}");
            assert!(stall.message.contains(message), "{stall:?}");
            assert!(stall.message.contains("120s"), "{stall:?}");
        }
        assert_eq!(
            launch_stall(
                &pod(waiting("ImagePullBackOff", "")),
                Duration::from_secs(119),
                deadline,
                None
            ),
            None,
            "not before the deadline"
        );
    }
}
