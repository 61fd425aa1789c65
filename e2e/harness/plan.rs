//! Turns a Pod into the local process that plays its first container: program, arguments,
//! environment, working directory and the local directories standing in for its volumes.
//!
//! Pure functions only, so the mapping rules are unit-tested without a cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::readiness::ReadinessProbe;

/// Environment variables the harness adds to every process it starts (and to the pod's `Exec`).
pub use kandev_operator::api::pod_contract::ENV_POD_NAME;
pub const ENV_POD_NAMESPACE: &str = "KANDEV_POD_NAMESPACE";
pub const ENV_POD_UID: &str = "KANDEV_POD_UID";

/// Everything needed to start the local stand-in of a pod's first container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub container: String,
    /// `command[0]`, resolved through `PATH` when it has no slash.
    pub program: String,
    /// The rest of `command` followed by `args`, volume paths mapped to local directories.
    pub args: Vec<String>,
    /// The container's literal `env` values (mapped) plus the `KANDEV_POD_*` variables.
    pub env: Vec<(String, String)>,
    /// Local working directory (the container's `workingDir`, mapped).
    pub workdir: PathBuf,
    /// Directory holding this pod's emptyDirs, root and log file.
    pub pod_dir: PathBuf,
    /// Directories to create before starting (volumes and the working directory).
    pub dirs: Vec<PathBuf>,
    /// Where the process's stdout and stderr go (served by `kubectl logs` through kwok `Logs`).
    pub log_file: PathBuf,
    /// `spec.restartPolicy` (defaults to `Always`, like the API server).
    pub restart_policy: String,
    /// The container's exec readiness probe, played by [`crate::readiness`].
    pub readiness: Option<ReadinessProbe>,
}

/// Why a pod cannot be played by the harness.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("pod has no {0}")]
    Missing(&'static str),
    #[error("container {0:?} has no command: the image entrypoint is unknown to the harness")]
    NoCommand(String),
    #[error("volumeMount {mount:?} refers to unknown volume {volume:?}")]
    UnknownVolume { mount: String, volume: String },
}

/// Local directory of a pod (emptyDirs, default root, log file).
pub fn pod_dir(state_dir: &Path, uid: &str) -> PathBuf {
    state_dir.join("pods").join(uid)
}

/// Local directory of a PersistentVolumeClaim: shared by every pod mounting the same claim and
/// kept after the pods are gone, like a real PVC.
pub fn claim_dir(state_dir: &Path, namespace: &str, claim: &str) -> PathBuf {
    state_dir.join("volumes").join(namespace).join(claim)
}

/// Local file standing in for a pod's termination message file (`terminationMessagePath`).
pub fn termination_log(pod_dir: &Path) -> PathBuf {
    pod_dir.join("termination-log")
}

/// Builds the launch plan of `pod`'s first container.
pub fn plan(pod: &Pod, state_dir: &Path) -> Result<LaunchPlan, PlanError> {
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .ok_or(PlanError::Missing("containers"))?;
    plan_container(pod, container, state_dir, false)
}

/// The launch plans of `pod`'s init containers, in order: each must exit 0 before the next (and
/// at last the first container) starts. Their logs and termination messages are their own.
pub fn init_plans(pod: &Pod, state_dir: &Path) -> Result<Vec<LaunchPlan>, PlanError> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .map(|c| plan_container(pod, c, state_dir, true))
        .collect()
}

/// Local file standing in for an init container's termination message file.
pub fn init_termination_log(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join(format!("termination-log.{container}"))
}

fn plan_container(
    pod: &Pod,
    container: &Container,
    state_dir: &Path,
    init: bool,
) -> Result<LaunchPlan, PlanError> {
    let meta = &pod.metadata;
    let name = meta
        .name
        .clone()
        .ok_or(PlanError::Missing("metadata.name"))?;
    let namespace = meta
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let uid = meta.uid.clone().ok_or(PlanError::Missing("metadata.uid"))?;
    let spec = pod.spec.as_ref().ok_or(PlanError::Missing("spec"))?;

    let pod_dir = pod_dir(state_dir, &uid);
    let mut dirs = Vec::new();

    // Local directory of each volume by name.
    let mut volume_dirs: BTreeMap<&str, PathBuf> = BTreeMap::new();
    for volume in spec.volumes.iter().flatten() {
        let dir = if let Some(pvc) = &volume.persistent_volume_claim {
            claim_dir(state_dir, &namespace, &pvc.claim_name)
        } else if let Some(host) = &volume.host_path {
            PathBuf::from(&host.path)
        } else {
            // emptyDir, and everything the harness does not materialise (projected service
            // account tokens, configMaps, secrets): an empty per-pod directory.
            pod_dir.join("volumes").join(&volume.name)
        };
        volume_dirs.insert(volume.name.as_str(), dir);
    }

    // mountPath -> local directory, for every volumeMount of the container.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let base =
            volume_dirs
                .get(mount.name.as_str())
                .ok_or_else(|| PlanError::UnknownVolume {
                    mount: mount.mount_path.clone(),
                    volume: mount.name.clone(),
                })?;
        let local = match mount.sub_path.as_deref() {
            Some(sub) if !sub.is_empty() => base.join(sub.trim_start_matches('/')),
            _ => base.clone(),
        };
        dirs.push(local.clone());
        mounts.push((normalize_mount(&mount.mount_path), local));
    }

    // The termination message file a kubelet mounts into the container.
    mounts.push((
        normalize_mount(
            container
                .termination_message_path
                .as_deref()
                .unwrap_or("/dev/termination-log"),
        ),
        if init {
            init_termination_log(&pod_dir, &container.name)
        } else {
            termination_log(&pod_dir)
        },
    ));

    let mut command = container.command.clone().unwrap_or_default();
    command.extend(container.args.clone().unwrap_or_default());
    if command.is_empty() {
        return Err(PlanError::NoCommand(container.name.clone()));
    }
    let program = map_paths(&command[0], &mounts);
    let args = command[1..].iter().map(|a| map_paths(a, &mounts)).collect();

    let root = pod_dir.join("root");
    let workdir = match container.working_dir.as_deref() {
        Some(wd) if !wd.is_empty() => {
            let mapped = map_paths(wd, &mounts);
            if mapped != wd {
                PathBuf::from(mapped)
            } else {
                // Not inside a volume: it lives in the pod's own (ephemeral) root.
                root.join(wd.trim_start_matches('/'))
            }
        }
        _ => root.clone(),
    };
    dirs.push(workdir.clone());

    let mut env: Vec<(String, String)> = Vec::new();
    for var in container.env.iter().flatten() {
        // Literal values and the downward API's pod fields; other valueFrom sources (secrets,
        // configMaps, resources) are not resolved by the harness.
        if let Some(value) = &var.value {
            env.push((var.name.clone(), map_paths(value, &mounts)));
        } else if let Some(path) = var
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str())
            && let Some(value) = pod_field(pod, path)
        {
            env.push((var.name.clone(), value));
        }
    }
    env.retain(|(k, _)| k != ENV_POD_NAME && k != ENV_POD_NAMESPACE && k != ENV_POD_UID);
    env.push((ENV_POD_NAME.to_string(), name.clone()));
    env.push((ENV_POD_NAMESPACE.to_string(), namespace.clone()));
    env.push((ENV_POD_UID.to_string(), uid.clone()));

    let restart_policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".to_string());
    Ok(LaunchPlan {
        log_file: if init {
            pod_dir.join(format!("init-{}.log", container.name))
        } else {
            pod_dir.join("container.log")
        },
        namespace,
        name,
        uid,
        container: container.name.clone(),
        program,
        args,
        env,
        workdir,
        pod_dir,
        dirs,
        restart_policy,
        readiness: ReadinessProbe::of(container),
    })
}

/// Whether `labels` match an equality-based label selector (`k=v,k2==v2,k3!=v3,k4,!k5`), the
/// subset the harness's `--selector` accepts. An empty selector matches everything.
pub fn selector_matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .all(|requirement| {
            if let Some((key, value)) = requirement.split_once("!=") {
                labels.get(key.trim()).map(String::as_str) != Some(value.trim())
            } else if let Some((key, value)) = requirement
                .split_once("==")
                .or_else(|| requirement.split_once('='))
            {
                labels.get(key.trim()).map(String::as_str) == Some(value.trim())
            } else if let Some(key) = requirement.strip_prefix('!') {
                !labels.contains_key(key.trim())
            } else {
                labels.contains_key(requirement)
            }
        })
}

/// The value of a downward-API `fieldRef` the harness can answer.
fn pod_field(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => Some(
            spec.and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
        ),
        // Every played process shares the host's network: its pod IP is loopback.
        "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
        _ => None,
    }
}

/// `/a/b/` and `/a/b` are the same mount point.
fn normalize_mount(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_string()
    } else {
        trimmed.to_string()
    }
}

/// Characters that may continue a path component; a mount path only matches where the text
/// around it cannot be part of a longer path component.
fn is_path_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '~' | '+' | '@')
}

/// Replaces every occurrence of a mount path in `text` by its local directory, in one left-to-right
/// pass (so a replacement is never rewritten again) and preferring the longest mount path.
/// A mount path matches only as a whole path prefix: `/data` matches `/data`, `/data/x` and
/// `--dir=/data`, but not `/database` or `/x/data`.
pub fn map_paths(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut sorted: Vec<&(String, PathBuf)> = mounts.iter().filter(|(m, _)| m != "/").collect();
    sorted.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));

    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    'outer: while i < text.len() {
        let rest = &text[i..];
        let prev = text[..i].chars().next_back();
        let starts_component = prev.is_none_or(|c| !is_path_char(c) && c != '/');
        if starts_component && rest.starts_with('/') {
            for (mount, local) in &sorted {
                if let Some(after) = rest.strip_prefix(mount.as_str()) {
                    let boundary = after
                        .chars()
                        .next()
                        .is_none_or(|c| c == '/' || !is_path_char(c));
                    if boundary {
                        out.push_str(&local.to_string_lossy());
                        i += mount.len();
                        continue 'outer;
                    }
                }
            }
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        i += c.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("valid pod json")
    }

    fn sample() -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "p1", "namespace": "ns1", "uid": "u-1"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "agentctl",
                    "image": "x",
                    "command": ["agentctl", "serve"],
                    "args": ["--socket=/run/kandev/agent.sock", "--workspace", "/workspace/repo"],
                    "workingDir": "/workspace",
                    "env": [
                        {"name": "HOME", "value": "/workspace/.home"},
                        {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_LABELS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}},
                        {"name": "KANDEV_POD_NAME", "value": "spoofed"}
                    ],
                    "volumeMounts": [
                        {"name": "ws", "mountPath": "/workspace"},
                        {"name": "run", "mountPath": "/run/kandev/"},
                        {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
                    ]
                }],
                "volumes": [
                    {"name": "ws", "persistentVolumeClaim": {"claimName": "claim-a"}},
                    {"name": "run", "emptyDir": {}},
                    {"name": "token", "projected": {"sources": []}}
                ]
            }
        }))
    }

    #[test]
    fn maps_volumes_args_env_and_workdir() {
        let state = Path::new("/state");
        let plan = plan(&sample(), state).expect("plan");
        assert_eq!(plan.program, "agentctl");
        assert_eq!(
            plan.args,
            vec![
                "serve".to_string(),
                "--socket=/state/pods/u-1/volumes/run/agent.sock".to_string(),
                "--workspace".to_string(),
                "/state/volumes/ns1/claim-a/repo".to_string(),
            ]
        );
        assert_eq!(plan.workdir, PathBuf::from("/state/volumes/ns1/claim-a"));
        assert_eq!(
            plan.env,
            vec![
                (
                    "HOME".to_string(),
                    "/state/volumes/ns1/claim-a/.home".to_string()
                ),
                ("POD_NAME".to_string(), "p1".to_string()),
                ("POD_NAMESPACE".to_string(), "ns1".to_string()),
                (ENV_POD_NAME.to_string(), "p1".to_string()),
                (ENV_POD_NAMESPACE.to_string(), "ns1".to_string()),
                (ENV_POD_UID.to_string(), "u-1".to_string()),
            ]
        );
        assert_eq!(plan.restart_policy, "Never");
        assert_eq!(
            plan.log_file,
            PathBuf::from("/state/pods/u-1/container.log")
        );
        assert!(
            plan.dirs
                .contains(&PathBuf::from("/state/pods/u-1/volumes/token"))
        );
    }

    #[test]
    fn claim_dir_is_shared_between_pods_of_the_same_claim() {
        let mut other = sample();
        other.metadata.uid = Some("u-2".into());
        other.metadata.name = Some("p2".into());
        let a = plan(&sample(), Path::new("/s")).expect("plan a");
        let b = plan(&other, Path::new("/s")).expect("plan b");
        assert_eq!(a.workdir, b.workdir);
        assert!(a.pod_dir != b.pod_dir);
    }

    #[test]
    fn default_workdir_is_the_pod_root_and_unmounted_workdir_lives_in_it() {
        let mut p = sample();
        let c = &mut p.spec.as_mut().expect("spec").containers[0];
        c.working_dir = None;
        assert_eq!(
            plan(&p, Path::new("/s")).expect("plan").workdir,
            PathBuf::from("/s/pods/u-1/root")
        );
        let c = &mut p.spec.as_mut().expect("spec").containers[0];
        c.working_dir = Some("/opt/app".into());
        assert_eq!(
            plan(&p, Path::new("/s")).expect("plan").workdir,
            PathBuf::from("/s/pods/u-1/root/opt/app")
        );
    }

    #[test]
    fn path_mapping_respects_component_boundaries_and_never_rewrites_twice() {
        // The state dir itself contains a mount path ("/root"): it must not be rewritten again.
        let mounts = vec![
            ("/root".to_string(), PathBuf::from("/root/.cache/x/root")),
            ("/data".to_string(), PathBuf::from("/L/data")),
            ("/data/deep".to_string(), PathBuf::from("/L/deep")),
        ];
        assert_eq!(map_paths("/root/a", &mounts), "/root/.cache/x/root/a");
        assert_eq!(map_paths("/database", &mounts), "/database");
        assert_eq!(map_paths("/x/data", &mounts), "/x/data");
        assert_eq!(map_paths("/data/deeper", &mounts), "/L/data/deeper");
        assert_eq!(map_paths("/data/deep/f", &mounts), "/L/deep/f");
        assert_eq!(
            map_paths("a=/data:/root", &mounts),
            "a=/L/data:/root/.cache/x/root"
        );
        assert_eq!(map_paths("ünï/data", &mounts), "ünï/data");
        assert_eq!(map_paths("", &mounts), "");
    }

    #[test]
    fn selectors() {
        let labels: BTreeMap<String, String> = [("a", "1"), ("b", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (selector, want) in [
            ("", true),
            ("a=1", true),
            ("a==1", true),
            ("a=2", false),
            ("a=1,b=2", true),
            ("a=1,b=3", false),
            ("a!=2", true),
            ("c!=2", true),
            ("a!=1", false),
            ("b", true),
            ("c", false),
            ("!c", true),
            ("!a", false),
        ] {
            assert_eq!(selector_matches(selector, &labels), want, "{selector}");
        }
    }

    #[test]
    fn errors() {
        let mut p = sample();
        p.spec.as_mut().expect("spec").containers[0].command = None;
        p.spec.as_mut().expect("spec").containers[0].args = None;
        assert_eq!(
            plan(&p, Path::new("/s")),
            Err(PlanError::NoCommand("agentctl".into()))
        );
        let mut p = sample();
        p.spec.as_mut().expect("spec").volumes = None;
        assert!(matches!(
            plan(&p, Path::new("/s")),
            Err(PlanError::UnknownVolume { .. })
        ));
    }
}
