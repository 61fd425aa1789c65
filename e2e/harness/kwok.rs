//! kwok's per-pod `Exec` and `Logs` objects (`kwok.x-k8s.io/v1alpha1`, CRDs enabled by
//! `e2e/cluster.sh` with `--enable-crds`): they make `exec` into the pod run the command locally,
//! with the pod's environment and working directory, and `logs` read the local process's log file.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, AttachParams, DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::plan::{ENV_POD_UID, LaunchPlan};

pub const FIELD_MANAGER: &str = "kandev-e2e-harness";
/// Set on a pod's `Exec` to make kwok list `Exec`s again (see [`wait_exec_ready`]).
const NUDGE_ANNOTATION: &str = "e2e.kandev.dev/exec-nudge";

fn resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "Logs" => "logs".to_string(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", kind),
        &plural,
    )
}

fn api(client: &Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource(kind))
}

fn owner_reference(plan: &LaunchPlan) -> serde_json::Value {
    // Not a controller reference: the garbage collector deletes the object with its pod.
    json!([{"apiVersion": "v1", "kind": "Pod", "name": plan.name, "uid": plan.uid}])
}

/// The `Exec` object of a pod: same name and namespace as the pod.
pub fn exec_object(plan: &LaunchPlan, env: &[(String, String)]) -> serde_json::Value {
    let envs: Vec<serde_json::Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Exec",
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
            "ownerReferences": owner_reference(plan),
        },
        "spec": {"execs": [{"local": {"workDir": plan.workdir.to_string_lossy(), "envs": envs}}]},
    })
}

/// The `Logs` object of a pod: `kubectl logs` follows the local process's log file.
pub fn logs_object(plan: &LaunchPlan) -> serde_json::Value {
    json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
            "ownerReferences": owner_reference(plan),
        },
        "spec": {"logs": [{"logsFile": plan.log_file.to_string_lossy(), "follow": true}]},
    })
}

async fn apply(
    client: &Client,
    kind: &str,
    namespace: &str,
    name: &str,
    obj: serde_json::Value,
) -> kube::Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api(client, namespace, kind)
        .patch(name, &params, &Patch::Apply(obj))
        .await?;
    Ok(())
}

pub async fn apply_exec(
    client: &Client,
    plan: &LaunchPlan,
    env: &[(String, String)],
) -> kube::Result<()> {
    apply(
        client,
        "Exec",
        &plan.namespace,
        &plan.name,
        exec_object(plan, env),
    )
    .await
}

pub async fn apply_logs(client: &Client, plan: &LaunchPlan) -> kube::Result<()> {
    apply(
        client,
        "Logs",
        &plan.namespace,
        &plan.name,
        logs_object(plan),
    )
    .await
}

/// Failed exec attempts after which the pod's `Exec` is touched again (see [`wait_exec_ready`]).
const NUDGE_EVERY: u32 = 10;

/// Execs `env` into the pod through the API server until the output shows the pod's UID, i.e.
/// until kwok-controller has picked up the pod's `Exec`. Returns the number of attempts.
///
/// kwok 0.8 caches its list of `Exec`s under the informer's last resource version, which the
/// reflector advances before the informer's store holds the new object: an exec that lands in
/// between caches a list without this pod's `Exec`, and kwok keeps answering from it until some
/// `Exec` changes again. So every [`NUDGE_EVERY`] failed attempts the `Exec` is touched (an
/// annotation), which gives kwok a new version to list again under.
pub async fn wait_exec_ready(
    client: &Client,
    plan: &LaunchPlan,
    within: Duration,
) -> Result<u32, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &plan.namespace);
    let want = format!("{}={}", ENV_POD_UID, plan.uid);
    let deadline = tokio::time::Instant::now() + within;
    let mut tries = 0;
    loop {
        tries += 1;
        let last = match exec_output(&pods, &plan.name, &["env"]).await {
            Ok(out) if out.lines().any(|l| l == want) => return Ok(tries),
            Ok(_) => "exec ran without the pod's environment".to_string(),
            Err(e) => e,
        };
        // A pod deleted meanwhile (a superseded launch) is not waited for: a kubelet would not
        // hold up its other pods for it either.
        let gone = match pods.get_opt(&plan.name).await {
            Ok(Some(pod)) => {
                pod.metadata.uid.as_deref() != Some(plan.uid.as_str())
                    || pod.metadata.deletion_timestamp.is_some()
            }
            Ok(None) => true,
            Err(_) => false,
        };
        if gone {
            return Err(format!("the pod went away after {tries} attempts: {last}"));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("after {tries} attempts: {last}"));
        }
        if tries % NUDGE_EVERY == 0 {
            let touch = json!({"metadata": {"annotations": {NUDGE_ANNOTATION: tries.to_string()}}});
            if let Err(e) = api(client, &plan.namespace, "Exec")
                .patch(&plan.name, &PatchParams::default(), &Patch::Merge(touch))
                .await
            {
                tracing::debug!(pod = %plan.name, error = %e, "cannot touch the pod's Exec");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn exec_output(pods: &Api<Pod>, name: &str, command: &[&str]) -> Result<String, String> {
    let ap = AttachParams::default().stdout(true).stderr(false);
    let mut attached = pods
        .exec(name, command.to_vec(), &ap)
        .await
        .map_err(|e| e.to_string())?;
    let mut stdout = attached.stdout().ok_or("no stdout")?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), stdout.read_to_string(&mut out))
        .await
        .map_err(|_| "exec output timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = attached.join().await;
    Ok(out)
}

/// Deletes the pod's `kind` object; a missing object is not an error.
pub async fn delete(client: &Client, kind: &str, namespace: &str, name: &str) -> kube::Result<()> {
    match api(client, namespace, kind)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn exec_object_points_at_the_pod() {
        let plan = LaunchPlan {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            container: "c".into(),
            program: "x".into(),
            args: vec![],
            env: vec![],
            workdir: PathBuf::from("/w"),
            pod_dir: PathBuf::from("/s/pods/u"),
            dirs: vec![],
            log_file: PathBuf::from("/s/pods/u/container.log"),
            restart_policy: "Always".into(),
            readiness: None,
        };
        let obj = exec_object(&plan, &[("A".into(), "1".into())]);
        assert_eq!(obj["metadata"]["ownerReferences"][0]["uid"], "u");
        assert_eq!(obj["spec"]["execs"][0]["local"]["workDir"], "/w");
        assert_eq!(
            obj["spec"]["execs"][0]["local"]["envs"][0],
            json!({"name": "A", "value": "1"})
        );
        let logs = logs_object(&plan);
        assert_eq!(
            logs["spec"]["logs"][0]["logsFile"],
            "/s/pods/u/container.log"
        );
        // Both must deserialize as DynamicObjects (what Patch::Apply sends).
        serde_json::from_value::<DynamicObject>(obj).expect("exec is a DynamicObject");
        serde_json::from_value::<DynamicObject>(logs).expect("logs is a DynamicObject");
    }
}
