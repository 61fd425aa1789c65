//! configMap volumes of a played pod: the kubelet writes the ConfigMap's keys as files; so does
//! the harness, into the pod's local directory of that volume (see `plan`), before the process
//! starts. Snapshots only: later changes of the ConfigMap are not propagated.

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::Api;

use crate::supervisor::BoxError;

/// The files of one configMap volume: (relative path, content) per selected key.
pub fn files(
    volume: &k8s_openapi::api::core::v1::ConfigMapVolumeSource,
    cm: &ConfigMap,
) -> Vec<(String, String)> {
    let data = cm.data.clone().unwrap_or_default();
    match &volume.items {
        Some(items) if !items.is_empty() => items
            .iter()
            .filter_map(|i| data.get(&i.key).map(|v| (i.path.clone(), v.clone())))
            .collect(),
        _ => data.into_iter().collect(),
    }
}

/// Writes every configMap volume of `pod` into `<pod_dir>/volumes/<volume>`.
pub async fn materialize(client: &Client, pod: &Pod, pod_dir: &Path) -> Result<(), BoxError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for volume in volumes.into_iter().flatten() {
        let Some(source) = &volume.config_map else {
            continue;
        };
        let dir = pod_dir.join("volumes").join(&volume.name);
        std::fs::create_dir_all(&dir)?;
        let cm = match api.get_opt(&source.name).await? {
            Some(cm) => cm,
            None if source.optional == Some(true) => continue,
            None => return Err(format!("configmap {namespace}/{} not found", source.name).into()),
        };
        for (rel, content) in files(source, &cm) {
            let path = dir.join(rel.trim_start_matches('/'));
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, content)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_or_selected_items() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"}, "data": {"a.yaml": "A", "b": "B"}
        }))
        .expect("cm");
        let all: k8s_openapi::api::core::v1::ConfigMapVolumeSource =
            serde_json::from_value(serde_json::json!({"name": "c"})).expect("src");
        assert_eq!(
            files(&all, &cm),
            vec![
                ("a.yaml".to_string(), "A".to_string()),
                ("b".to_string(), "B".to_string())
            ]
        );
        let some: k8s_openapi::api::core::v1::ConfigMapVolumeSource = serde_json::from_value(
            serde_json::json!({"name": "c", "items": [{"key": "b", "path": "sub/b.txt"}, {"key": "x", "path": "x"}]}),
        )
        .expect("src");
        assert_eq!(
            files(&some, &cm),
            vec![("sub/b.txt".to_string(), "B".to_string())]
        );
    }
}
