//! The service account identity of a played pod: what a kubelet mounts as the projected token,
//! the harness hands to the local process as a kubeconfig of its own, so that a played
//! controller (the operator of the Helm chart) talks to the API server as its ServiceAccount and
//! meets the chart's RBAC, not the harness's admin rights.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;

use crate::kubeconfig::token_kubeconfig;
use crate::supervisor::BoxError;

/// Lifetime of the token; a played pod lives for one test run.
const TOKEN_SECONDS: i64 = 6 * 3600;

/// The ServiceAccount whose token the pod gets, or `None` when it opts out of the token
/// (`automountServiceAccountToken: false`, as agentctl pods do).
pub fn service_account(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if spec.automount_service_account_token == Some(false) {
        return None;
    }
    Some(
        spec.service_account_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string()),
    )
}

/// Requests a token for the pod's ServiceAccount, bound to the pod (it dies with the pod, like a
/// projected token), writes it and a kubeconfig using it into `pod_dir`, and returns the
/// kubeconfig's path. `Ok(None)` when the pod opts out of a token.
pub async fn provide(
    client: &Client,
    admin: &Kubeconfig,
    pod: &Pod,
    pod_dir: &Path,
) -> Result<Option<PathBuf>, BoxError> {
    let Some(account) = service_account(pod) else {
        return Ok(None);
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(TOKEN_SECONDS),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        }),
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let issued = accounts
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("token for serviceaccount {namespace}/{account}: {e}"))?;
    let token = issued
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| format!("token for serviceaccount {namespace}/{account}: empty answer"))?;
    std::fs::create_dir_all(pod_dir)?;
    let token_file = pod_dir.join("serviceaccount-token");
    std::fs::write(&token_file, token)?;
    let path = pod_dir.join("kubeconfig");
    let config = token_kubeconfig(admin, &token_file, namespace);
    std::fs::write(&path, serde_yaml_ng::to_string(&config)?)?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("pod")
    }

    #[test]
    fn which_account() {
        let cases = [
            (serde_json::json!({"containers": []}), Some("default")),
            (
                serde_json::json!({"containers": [], "serviceAccountName": "op"}),
                Some("op"),
            ),
            (
                serde_json::json!({"containers": [], "serviceAccountName": "op",
                                   "automountServiceAccountToken": false}),
                None,
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(service_account(&pod(spec)).as_deref(), want);
        }
    }
}
