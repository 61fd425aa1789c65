//! The pod status a kubelet would report, imitated for the pods the harness plays: the
//! container terminated for good (`terminal_status`), waiting in CrashLoopBackOff
//! (`crash_loop_status`) or running again after a restart (`restarted_status`), and the kubelet's
//! rules behind them (which exits a restart policy restarts, the crash back-off, the exit code a
//! runtime reports).
//!
//! Pure functions only (apart from reading the clock for timestamps): the supervisor decides when
//! to patch a pod and with which of these.

use std::process::ExitStatus;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::plan::LaunchPlan;

/// Exit code as a container runtime reports it: 128+signal for a killed process.
pub fn exit_code(status: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

/// The pod status after its container ended for good: phase `phase`, the container terminated,
/// Ready false.
pub fn terminal_status(
    pod: &Pod,
    plan: &LaunchPlan,
    phase: &str,
    started_at: Timestamp,
    code: i32,
    reason: &str,
    msg: &str,
) -> serde_json::Value {
    let cond_reason = if phase == "Failed" {
        "PodFailed"
    } else {
        "PodCompleted"
    };
    let terminated = terminated_state(started_at, code, reason, msg);
    let mut status = container_status(pod, plan, phase, false, cond_reason, terminated, None);
    status.message = Some(msg.to_string());
    serde_json::to_value(status).unwrap_or_else(|_| json!({ "phase": phase }))
}

/// The pod status while a kubelet waits to restart a crashed container (CrashLoopBackOff).
pub fn crash_loop_status(
    pod: &Pod,
    plan: &LaunchPlan,
    last: ContainerState,
    restarts: u32,
    backoff: Duration,
) -> serde_json::Value {
    let waiting = ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some("CrashLoopBackOff".into()),
            message: Some(format!(
                "back-off {}s restarting failed container={} pod={}",
                backoff.as_secs(),
                plan.container,
                plan.name
            )),
        }),
        ..ContainerState::default()
    };
    let mut status = container_status(
        pod,
        plan,
        "Running",
        false,
        "ContainersNotReady",
        waiting,
        None,
    );
    if let Some(c) = status
        .container_statuses
        .as_mut()
        .and_then(|cs| cs.iter_mut().find(|c| c.name == plan.container))
    {
        c.last_state = Some(last);
        c.restart_count = i32::try_from(restarts).unwrap_or(i32::MAX);
    }
    serde_json::to_value(status).unwrap_or_else(|_| json!({ "phase": "Running" }))
}

/// The pod status once a restarted container runs again: Running and Ready.
pub fn restarted_status(pod: &Pod, plan: &LaunchPlan) -> serde_json::Value {
    let running = ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(Time(Timestamp::now())),
        }),
        ..ContainerState::default()
    };
    let status = container_status(pod, plan, "Running", true, "", running, Some(true));
    serde_json::to_value(status).unwrap_or_else(|_| json!({ "phase": "Running" }))
}

pub fn terminated_state(
    started_at: Timestamp,
    code: i32,
    reason: &str,
    msg: &str,
) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            reason: Some(reason.into()),
            message: Some(msg.into()),
            started_at: Some(Time(started_at)),
            finished_at: Some(Time(Timestamp::now())),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}

/// `pod`'s status with phase `phase`, the Ready and ContainersReady conditions set to `ready`
/// (with `cond_reason` when false), and the played container in `state`.
fn container_status(
    pod: &Pod,
    plan: &LaunchPlan,
    phase: &str,
    ready: bool,
    cond_reason: &str,
    state: ContainerState,
    started: Option<bool>,
) -> PodStatus {
    let now = Time(Timestamp::now());
    let mut status = pod.status.clone().unwrap_or_default();
    status.phase = Some(phase.to_string());
    let value = if ready { "True" } else { "False" };
    let reason = (!ready).then(|| cond_reason.to_string());
    let mut conditions = status.conditions.take().unwrap_or_default();
    for t in ["Ready", "ContainersReady"] {
        match conditions.iter_mut().find(|c| c.type_ == t) {
            Some(c) => {
                if c.status != value {
                    c.last_transition_time = Some(now.clone());
                }
                c.status = value.into();
                c.reason = reason.clone();
            }
            None => conditions.push(PodCondition {
                type_: t.into(),
                status: value.into(),
                reason: reason.clone(),
                last_transition_time: Some(now.clone()),
                ..PodCondition::default()
            }),
        }
    }
    status.conditions = Some(conditions);
    let mut statuses = status.container_statuses.take().unwrap_or_default();
    match statuses.iter_mut().find(|c| c.name == plan.container) {
        Some(c) => {
            c.state = Some(state);
            c.ready = ready;
            c.started = Some(started.unwrap_or(false));
        }
        None => {
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            statuses.push(ContainerStatus {
                name: plan.container.clone(),
                image,
                state: Some(state),
                ready,
                started,
                ..ContainerStatus::default()
            })
        }
    }
    status.container_statuses = Some(statuses);
    status
}

/// One init container that ran to its end.
pub struct InitEnded {
    pub container: String,
    pub started_at: Timestamp,
    pub code: i32,
    /// Its termination message (or the harness's word when it wrote none).
    pub message: String,
}

/// The pod status after its init containers ran, as a kubelet reports it: each terminated
/// (`Completed`, or `Error` with its message). When the last one failed, the pod has failed
/// (restartPolicy Never: agentctl pods) and its container waits, never started, in
/// `PodInitializing`.
pub fn init_status(pod: &Pod, ended: &[InitEnded]) -> serde_json::Value {
    let spec = pod.spec.as_ref();
    let image_of = |name: &str| {
        spec.into_iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
            .unwrap_or_default()
    };
    let mut status = pod.status.clone().unwrap_or_default();
    status.init_container_statuses = Some(
        ended
            .iter()
            .map(|e| {
                let reason = if e.code == 0 { "Completed" } else { "Error" };
                ContainerStatus {
                    name: e.container.clone(),
                    image: image_of(&e.container),
                    state: Some(terminated_state(e.started_at, e.code, reason, &e.message)),
                    ready: e.code == 0,
                    started: Some(false),
                    ..ContainerStatus::default()
                }
            })
            .collect(),
    );
    if let Some(failed) = ended.last().filter(|e| e.code != 0) {
        status.phase = Some("Failed".into());
        status.message = Some(format!(
            "init container {} failed: {}",
            failed.container, failed.message
        ));
        status.container_statuses = Some(
            spec.into_iter()
                .flat_map(|s| &s.containers)
                .map(|c| ContainerStatus {
                    name: c.name.clone(),
                    image: image_of(&c.name),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some("PodInitializing".into()),
                            message: None,
                        }),
                        ..ContainerState::default()
                    }),
                    started: Some(false),
                    ..ContainerStatus::default()
                })
                .collect(),
        );
    }
    serde_json::to_value(status).unwrap_or_else(|_| json!({}))
}

/// Whether a kubelet restarts a container that exited with `code` under `policy`.
pub fn restarts_after(policy: &str, code: i32) -> bool {
    policy == "Always" || (policy == "OnFailure" && code != 0)
}

/// The kubelet's crash back-off before restart number `n` (1-based): 10 s, doubling, at most
/// 5 minutes.
pub fn crash_backoff(n: u32) -> Duration {
    let secs = 10u64.saturating_mul(1u64 << n.saturating_sub(1).min(5));
    Duration::from_secs(secs.min(300))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan;
    use pretty_assertions::assert_eq;
    use serde_json::Value;
    use std::path::Path;

    /// A pod of one container `agentctl`, with `status` as the kubelet last reported it.
    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
            "spec": {"containers": [{"name": "agentctl", "image": "img", "command": ["/bin/true"]}]},
            "status": status,
        }))
        .expect("pod")
    }

    /// The status of a pod whose container runs and is ready.
    fn running() -> Value {
        json!({
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "containerStatuses": [{"name": "agentctl", "image": "img", "imageID": "", "ready": true,
                "started": true, "restartCount": 2, "state": {"running": {}}}],
        })
    }

    fn plan_of(pod: &Pod) -> LaunchPlan {
        plan::plan(pod, Path::new("/state")).expect("plan")
    }

    /// `[status, reason]` of the condition `type_`.
    fn condition(status: &Value, type_: &str) -> Value {
        let found = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_));
        match found {
            Some(c) => json!([c["status"], c["reason"]]),
            None => Value::Null,
        }
    }

    /// The only container status, after checking there is exactly one.
    fn only_container(status: &Value) -> &Value {
        let statuses = status["containerStatuses"]
            .as_array()
            .expect("containerStatuses");
        assert_eq!(statuses.len(), 1, "{status:#}");
        &statuses[0]
    }

    #[test]
    fn terminal_status_shape() {
        let started = Timestamp::from_second(1_700_000_000).expect("timestamp");
        // (last status, phase, exit code, reason, message, condition reason, restartCount)
        for (last, phase, code, reason, msg, cond_reason, restart_count) in [
            (
                json!({}),
                "Succeeded",
                0,
                "Completed",
                "done",
                "PodCompleted",
                0,
            ),
            (json!({}), "Failed", 1, "Error", "boom", "PodFailed", 0),
            (running(), "Failed", 137, "Error", "killed", "PodFailed", 2),
            (
                json!({}),
                "Failed",
                128,
                "StartError",
                "cannot start",
                "PodFailed",
                0,
            ),
        ] {
            let pod = pod(last.clone());
            let status = terminal_status(&pod, &plan_of(&pod), phase, started, code, reason, msg);
            let case = format!("{phase} {code} from {last}");
            assert_eq!(status["phase"], phase, "{case}");
            assert_eq!(status["message"], msg, "{case}");
            for type_ in ["Ready", "ContainersReady"] {
                assert_eq!(
                    condition(&status, type_),
                    json!(["False", cond_reason]),
                    "{case}"
                );
            }
            let container = only_container(&status);
            assert_eq!(container["name"], "agentctl", "{case}");
            assert_eq!(container["image"], "img", "{case}");
            assert_eq!(container["ready"], false, "{case}");
            assert_eq!(container["restartCount"], restart_count, "{case}");
            let state = container["state"].as_object().expect("state");
            assert_eq!(state.keys().collect::<Vec<_>>(), ["terminated"], "{case}");
            let terminated = &state["terminated"];
            assert_eq!(terminated["exitCode"], code, "{case}");
            assert_eq!(terminated["reason"], reason, "{case}");
            assert_eq!(terminated["message"], msg, "{case}");
            assert_eq!(terminated["startedAt"], "2023-11-14T22:13:20Z", "{case}");
            assert!(terminated["finishedAt"].is_string(), "{case}");
        }
        // Conditions other than Ready and ContainersReady are left alone.
        let pod = pod(running());
        let status = terminal_status(&pod, &plan_of(&pod), "Failed", started, 1, "Error", "x");
        assert_eq!(condition(&status, "PodScheduled"), json!(["True", null]));
    }

    #[test]
    fn crash_loop_status_shape() {
        let started = Timestamp::from_second(1_700_000_000).expect("timestamp");
        // (last status, exit code, restarts, back-off, restartCount reported)
        for (last, code, restarts, backoff, restart_count) in [
            (json!({}), 1, 1, 10, 1),
            (running(), 0, 3, 40, 3),
            (running(), 2, u32::MAX, 300, i64::from(i32::MAX)),
        ] {
            let pod = pod(last.clone());
            let plan = plan_of(&pod);
            let reason = if code == 0 { "Completed" } else { "Error" };
            let previous = terminated_state(started, code, reason, "exited");
            let backoff = Duration::from_secs(backoff);
            let status = crash_loop_status(&pod, &plan, previous, restarts, backoff);
            let case = format!("{restarts} restarts from {last}");
            // The pod stays Running, not ready; the container waits for its restart.
            assert_eq!(status["phase"], "Running", "{case}");
            for type_ in ["Ready", "ContainersReady"] {
                let expected = json!(["False", "ContainersNotReady"]);
                assert_eq!(condition(&status, type_), expected, "{case}");
            }
            let container = only_container(&status);
            assert_eq!(container["ready"], false, "{case}");
            assert_eq!(container["restartCount"], restart_count, "{case}");
            let waiting = &container["state"]["waiting"];
            assert_eq!(waiting["reason"], "CrashLoopBackOff", "{case}");
            let message = format!(
                "back-off {}s restarting failed container=agentctl pod=p",
                backoff.as_secs()
            );
            assert_eq!(waiting["message"], message, "{case}");
            let last_state = &container["lastState"]["terminated"];
            assert_eq!(last_state["exitCode"], code, "{case}");
            assert_eq!(last_state["reason"], reason, "{case}");
        }
    }

    #[test]
    fn init_status_shape() {
        let p = pod(json!({"phase": "Pending"}));
        let ended = |code: i32, message: &str| InitEnded {
            container: "checkout".into(),
            started_at: Timestamp::now(),
            code,
            message: message.into(),
        };
        let done = init_status(&p, &[ended(0, "")]);
        assert_eq!(done["phase"], "Pending", "the container starts next");
        assert_eq!(
            done["initContainerStatuses"][0]["state"]["terminated"]["reason"],
            "Completed"
        );
        let failed = init_status(&p, &[ended(1, "RepositoryAuthFailed: no")]);
        assert_eq!(failed["phase"], "Failed");
        let init = &failed["initContainerStatuses"][0];
        assert_eq!(init["name"], "checkout");
        assert_eq!(init["state"]["terminated"]["exitCode"], 1);
        assert_eq!(
            init["state"]["terminated"]["message"],
            "RepositoryAuthFailed: no"
        );
        assert_eq!(
            only_container(&failed)["state"]["waiting"]["reason"],
            "PodInitializing"
        );
    }

    #[test]
    fn restarted_status_shape() {
        let pod = pod(json!({}));
        let status = restarted_status(&pod, &plan_of(&pod));
        assert_eq!(status["phase"], "Running");
        for type_ in ["Ready", "ContainersReady"] {
            assert_eq!(condition(&status, type_), json!(["True", null]));
        }
        let container = only_container(&status);
        assert_eq!(container["ready"], true);
        assert_eq!(container["started"], true);
        assert!(container["state"]["running"]["startedAt"].is_string());
    }

    #[test]
    fn exit_code_as_a_runtime_reports_it() {
        use std::os::unix::process::ExitStatusExt;
        // Raw wait statuses: an exit code in the high byte, a terminating signal in the low.
        for (raw, code) in [
            (0, 0),
            (3 << 8, 3),
            (libc::SIGKILL, 137),
            (libc::SIGTERM, 143),
        ] {
            assert_eq!(exit_code(&ExitStatus::from_raw(raw)), code, "raw {raw}");
        }
    }

    #[test]
    fn restart_policy_and_back_off() {
        for (policy, code, restarts) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
        ] {
            assert_eq!(restarts_after(policy, code), restarts, "{policy} {code}");
        }
        let secs: Vec<u64> = (1..=7).map(|n| crash_backoff(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300]);
    }
}
