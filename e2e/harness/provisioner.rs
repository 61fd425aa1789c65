//! A volume provisioner for the kwok cluster: without it a pod mounting a PVC never schedules
//! (no storage backend here). For every unbound PVC the harness creates a PersistentVolume
//! pre-bound to it (`claimRef`) whose hostPath is the claim's local directory — the same
//! directory `plan` mounts for pods of that claim — and kube-controller-manager binds the pair.
//! When the PVC is deleted, the PV and the directory go too (reclaim policy Delete, done here:
//! the in-tree hostPath deleter is not enabled).

use std::path::Path;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::Event;
use serde_json::json;
use tracing::{info, warn};

use crate::kwok::FIELD_MANAGER;
use crate::plan::claim_dir;

/// Provisioner name of the e2e StorageClass (`e2e/cluster.sh` installs it as the default class).
pub const PROVISIONER: &str = "e2e.kandev.dev/harness";

pub fn pv_name(pvc_uid: &str) -> String {
    format!("pvc-{pvc_uid}")
}

/// The PV to create for `pvc`, or `None` when it is bound, being deleted or incomplete.
pub fn pv_for(pvc: &PersistentVolumeClaim, state_dir: &Path) -> Option<PersistentVolume> {
    let meta = &pvc.metadata;
    let (name, uid) = (meta.name.as_deref()?, meta.uid.as_deref()?);
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pvc.spec.as_ref()?;
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".to_string());
    let access_modes = spec
        .access_modes
        .clone()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["ReadWriteOnce".into()]);
    let dir = claim_dir(state_dir, namespace, name);
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name(uid),
            "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": access_modes,
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "storageClassName": spec.storage_class_name.clone().unwrap_or_default(),
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": dir.to_string_lossy(), "type": "DirectoryOrCreate"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": name, "uid": uid},
        },
    }))
    .ok()
}

pub async fn on_event(client: &Client, state_dir: &Path, event: Event<PersistentVolumeClaim>) {
    match event {
        Event::Apply(pvc) | Event::InitApply(pvc) => provision(client, state_dir, &pvc).await,
        Event::Delete(pvc) => reclaim(client, state_dir, &pvc).await,
        Event::Init | Event::InitDone => {}
    }
}

async fn provision(client: &Client, state_dir: &Path, pvc: &PersistentVolumeClaim) {
    let Some(pv) = pv_for(pvc, state_dir) else {
        return;
    };
    let key = format!(
        "{}/{}",
        pvc.metadata.namespace.as_deref().unwrap_or("default"),
        pvc.metadata.name.as_deref().unwrap_or("?")
    );
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    if let Some(path) = pv
        .spec
        .as_ref()
        .and_then(|s| s.host_path.as_ref())
        .map(|h| h.path.clone())
        && let Err(e) = std::fs::create_dir_all(&path)
    {
        warn!(pvc = %key, %path, error = %e, "cannot create the claim directory");
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => info!(pvc = %key, pv = %pv_name, "provisioned a local PersistentVolume"),
        Err(kube::Error::Api(e)) if e.code == 409 => {} // already provisioned, binding in progress
        Err(e) => warn!(pvc = %key, error = %e, "cannot create the PersistentVolume"),
    }
}

async fn reclaim(client: &Client, state_dir: &Path, pvc: &PersistentVolumeClaim) {
    let (Some(name), Some(uid)) = (pvc.metadata.name.as_deref(), pvc.metadata.uid.as_deref())
    else {
        return;
    };
    let namespace = pvc.metadata.namespace.as_deref().unwrap_or("default");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv_name = pv_name(uid);
    match pvs.get_opt(&pv_name).await {
        Ok(Some(pv))
            if pv
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .map(String::as_str)
                == Some(FIELD_MANAGER) =>
        {
            if let Err(e) = pvs.delete(&pv_name, &DeleteParams::default()).await {
                warn!(pv = %pv_name, error = %e, "cannot delete the PersistentVolume");
            }
            let dir = claim_dir(state_dir, namespace, name);
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(dir = %dir.display(), error = %e, "cannot remove the claim directory");
            }
            info!(pvc = %format!("{namespace}/{name}"), pv = %pv_name, "claim deleted: removed its PersistentVolume and directory");
        }
        Ok(_) => {}
        Err(e) => warn!(pv = %pv_name, error = %e, "cannot read the PersistentVolume"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pv_is_prebound_to_the_claim_directory() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "ws", "namespace": "n", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}, "storageClassName": "kandev-e2e"}
        }))
        .expect("pvc");
        let pv = pv_for(&pvc, Path::new("/s")).expect("pv");
        let spec = pv.spec.expect("spec");
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u1"));
        assert_eq!(spec.host_path.expect("hostPath").path, "/s/volumes/n/ws");
        assert_eq!(spec.claim_ref.expect("claimRef").uid.as_deref(), Some("u1"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("kandev-e2e"));
        assert_eq!(spec.capacity.expect("capacity")["storage"].0, "5Gi");

        let mut bound = pvc.clone();
        bound.spec.as_mut().expect("spec").volume_name = Some("pv".into());
        assert!(pv_for(&bound, Path::new("/s")).is_none());
    }
}
