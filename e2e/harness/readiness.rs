//! The readiness probe of a played pod, run as a kubelet runs it: the container's
//! `readinessProbe.exec` command, every `periodSeconds`, within `timeoutSeconds`, in the pod's
//! environment and working directory. The pod turns not Ready after `failureThreshold` failures
//! in a row and Ready again after `successThreshold` successes, and the harness patches the
//! pod's `Ready` and `ContainersReady` conditions and the container's `ready` flag, as a
//! kubelet reports them. kwok marks a played pod Ready when it turns it Running; from then on
//! the probe decides.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, info, warn};

/// A container's exec readiness probe, with the API server's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessProbe {
    pub command: Vec<String>,
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

impl ReadinessProbe {
    /// The exec readiness probe of `container`, if it has one (other handlers are not played).
    pub fn of(container: &Container) -> Option<Self> {
        let probe = container.readiness_probe.as_ref()?;
        let command = probe.exec.as_ref()?.command.clone()?;
        let secs = |v: Option<i32>, default: u64| {
            Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
        };
        let count = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        (!command.is_empty()).then(|| Self {
            command,
            period: secs(probe.period_seconds, 10),
            timeout: secs(probe.timeout_seconds, 1),
            failure_threshold: count(probe.failure_threshold, 3),
            success_threshold: count(probe.success_threshold, 1),
        })
    }
}

/// The kubelet's count of probe results in a row: Ready (as kwok left the pod) until
/// `failure_threshold` failures in a row, then Ready again after `success_threshold` successes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdicts {
    pub ready: bool,
    /// Results in a row that disagree with `ready`.
    against: u32,
}

impl Default for Verdicts {
    fn default() -> Self {
        Self {
            ready: true,
            against: 0,
        }
    }
}

impl Verdicts {
    /// Counts one result; returns the new readiness when it changes.
    pub fn record(&mut self, ok: bool, probe: &ReadinessProbe) -> Option<bool> {
        if ok == self.ready {
            self.against = 0;
            return None;
        }
        self.against += 1;
        let threshold = if ok {
            probe.success_threshold
        } else {
            probe.failure_threshold
        };
        if self.against < threshold {
            return None;
        }
        self.ready = ok;
        self.against = 0;
        Some(ok)
    }
}

/// The pod status patch of a change of readiness: a strategic merge, which merges conditions by
/// type but replaces `containerStatuses` whole (the list has no merge key), so the pod's
/// current container statuses go back with only `container`'s `ready` changed.
pub fn ready_patch(pod: &Pod, container: &str, ready: bool, now: Timestamp) -> serde_json::Value {
    let status = if ready { "True" } else { "False" };
    let reason = (!ready).then_some("ContainersNotReady");
    let message = (!ready).then(|| format!("containers with unready status: [{container}]"));
    let condition = |type_: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": Time(now)})
    };
    let mut containers = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    for c in containers.iter_mut().filter(|c| c.name == container) {
        c.ready = ready;
    }
    json!({"status": {
        "conditions": [condition("Ready"), condition("ContainersReady")],
        "containerStatuses": containers,
    }})
}

/// Where and how the probe's command runs: the pod's working directory and exec environment.
pub struct Target {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub workdir: PathBuf,
    pub env: Vec<(String, String)>,
}

/// Runs `probe` against the pod until the task is aborted (the pod stops).
pub async fn play(client: Client, target: Target, probe: ReadinessProbe) {
    let key = format!("{}/{}", target.namespace, target.pod);
    let pods: Api<Pod> = Api::namespaced(client, &target.namespace);
    let mut verdicts = Verdicts::default();
    loop {
        tokio::time::sleep(probe.period).await;
        let ok = run_once(&target, &probe).await;
        debug!(pod = %key, ok, "readiness probe");
        let Some(ready) = verdicts.record(ok, &probe) else {
            continue;
        };
        info!(pod = %key, ready, "readiness changed");
        let pod = match pods.get(&target.pod).await {
            Ok(pod) => pod,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => {
                warn!(pod = %key, error = %e, "cannot read the pod to report its readiness");
                verdicts.ready = !ready;
                continue;
            }
        };
        let patch = Patch::Strategic(ready_patch(
            &pod,
            &target.container,
            ready,
            Timestamp::now(),
        ));
        match pods
            .patch_status(&target.pod, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => {
                warn!(pod = %key, error = %e, "cannot report the pod's readiness");
                // Reported with the next change or the next result.
                verdicts.ready = !ready;
            }
        }
    }
}

/// One run of the probe's command: success is exit 0 within the timeout.
async fn run_once(target: &Target, probe: &ReadinessProbe) -> bool {
    let mut command = tokio::process::Command::new(&probe.command[0]);
    command
        .args(&probe.command[1..])
        .current_dir(&target.workdir)
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let Ok(mut child) = command.spawn() else {
        return false;
    };
    match tokio::time::timeout(probe.timeout, child.wait()).await {
        Ok(Ok(status)) => status.success(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe() -> ReadinessProbe {
        ReadinessProbe {
            command: vec!["agentctl".into()],
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            failure_threshold: 3,
            success_threshold: 1,
        }
    }

    #[test]
    fn readiness_follows_the_thresholds() {
        let probe = probe();
        let mut v = Verdicts::default();
        // (result, change reported)
        let steps = [
            (true, None),
            (false, None),
            (false, None),
            (true, None),
            (false, None),
            (false, None),
            (false, Some(false)),
            (false, None),
            (true, Some(true)),
        ];
        for (n, (ok, change)) in steps.into_iter().enumerate() {
            assert_eq!(v.record(ok, &probe), change, "step {n}");
        }
        assert!(v.ready);
    }

    #[test]
    fn probe_defaults_as_the_api_server_fills_them() {
        let container: Container = serde_json::from_value(json!({
            "name": "agentctl",
            "readinessProbe": {"exec": {"command": ["agentctl", "events", "--once"]},
                               "periodSeconds": 10, "timeoutSeconds": 5}
        }))
        .expect("container");
        let got = ReadinessProbe::of(&container).expect("a probe");
        assert_eq!(got.command, ["agentctl", "events", "--once"]);
        assert_eq!(
            (got.period, got.timeout),
            (Duration::from_secs(10), Duration::from_secs(5))
        );
        assert_eq!((got.failure_threshold, got.success_threshold), (3, 1));
        let http: Container = serde_json::from_value(json!({
            "name": "c", "readinessProbe": {"httpGet": {"port": 80}}
        }))
        .expect("container");
        assert_eq!(ReadinessProbe::of(&http), None);
    }

    #[test]
    fn the_patch_says_what_a_kubelet_says() {
        let now = Timestamp::from_second(0).expect("ts");
        let pod: Pod = serde_json::from_value(json!({"status": {"phase": "Running",
            "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}))
        .expect("pod");
        let patch = ready_patch(&pod, "agentctl", false, now);
        let conditions = &patch["status"]["conditions"];
        assert_eq!(conditions[0]["type"], "Ready");
        assert_eq!(conditions[0]["status"], "False");
        assert_eq!(conditions[0]["reason"], "ContainersNotReady");
        assert_eq!(conditions[1]["type"], "ContainersReady");
        let container = &patch["status"]["containerStatuses"][0];
        assert_eq!(container["ready"], false);
        // The list is replaced whole: the container's state must go back with it.
        assert_eq!(
            container["state"]["running"]["startedAt"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(container["started"], true);
        let patch = ready_patch(&pod, "agentctl", true, now);
        assert_eq!(patch["status"]["conditions"][0]["status"], "True");
        assert_eq!(
            patch["status"]["conditions"][0]["reason"],
            serde_json::Value::Null
        );
    }
}
