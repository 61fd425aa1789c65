//! Building the agentctl pod, the workspace PVC and the ExecutorRunning of a session. Pure: the
//! reconciler decides *whether* to create them; these functions only say *what* they look like.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, SeccompProfile, SecretKeySelector, SecurityContext, Toleration,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::agents::AgentProfile;
use crate::api::{ExecutorRunning, ExecutorRunningSpec, MANAGED_LABEL, SESSION_LABEL, TaskSession};

/// Label carrying a short hash of the resume request a pod was created for, so that a restarted
/// operator adopts that pod instead of creating a second one (DESIGN §3 step 3).
pub const REQUEST_LABEL: &str = "kandev.dev/request";
/// Where agentctl's socket lives inside the pod (an emptyDir shared by `serve` and every exec).
pub const SOCKET_DIR: &str = "/run/kandev";
/// Name of the agentctl container.
pub const CONTAINER: &str = "agentctl";

/// Operator-wide settings that shape every agentctl pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSettings {
    /// Image used when the session does not name one.
    pub default_image: String,
    /// Tolerations added to every agentctl pod (e.g. for dedicated agent nodes).
    pub tolerations: Vec<Toleration>,
    /// Node selector added to every agentctl pod.
    pub node_selector: BTreeMap<String, String>,
    /// UID the agent runs as (never root).
    pub run_as_user: i64,
    /// agentctl's replay line limit in MiB (`KANDEV_REPLAY_LINE_LIMIT_MIB`): the operator's own
    /// `--acp-replay-line-limit-mib`, so both ends of the exec stream agree (0: agentctl's
    /// default).
    pub replay_line_limit_mib: u64,
}

/// The agentctl pod's own name (downward API), for the event journal's entries.
pub const ENV_POD_NAME: &str = "KANDEV_POD_NAME";

/// A stable, short, label-safe hash (FNV-1a 64, hex) — names must not depend on process state.
pub fn short_hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")[..10].to_string()
}

/// A label value (≤ 63 chars) naming the session: the name itself when it fits.
pub fn session_label_value(session: &str) -> String {
    if session.len() <= 63 {
        session.to_string()
    } else {
        format!("{}-{}", &session[..52], short_hash(session))
    }
}

/// Whether `pod`'s controller ownerReference is `ts` (by UID: a pod that only carries the
/// session's labels is not its agent).
pub fn controlled_by(pod: &Pod, ts: &TaskSession) -> bool {
    let uid = ts.metadata.uid.as_deref();
    uid.is_some()
        && pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// The pod name for one launch: deterministic in (session, request), so a create that races
/// with a restart answers AlreadyExists and the existing pod is adopted.
pub fn pod_name(session: &str, request: &str) -> String {
    let suffix = short_hash(request);
    let max_prefix = 253 - suffix.len() - 7;
    let prefix = if session.len() > max_prefix {
        // A cut name may end in '.' or '-', which "<prefix>-agent-…" must not follow.
        session[..max_prefix].trim_end_matches(['.', '-'])
    } else {
        session
    };
    format!("{prefix}-agent-{suffix}")
}

/// The name of the PVC created from `spec.workspace.template`.
pub fn workspace_claim_name(ts: &TaskSession) -> String {
    ts.spec
        .workspace
        .claim_name
        .clone()
        .unwrap_or_else(|| format!("{}-workspace", ts.name_any()))
}

/// The name of a session's ExecutorRunning (one per session, owned by it).
pub fn executor_name(ts: &TaskSession) -> String {
    ts.name_any()
}

/// The PVC built from the session's workspace template, owned by the session. `None` when the
/// session names an existing claim.
pub fn build_workspace_claim(ts: &TaskSession) -> Option<PersistentVolumeClaim> {
    let template = ts.spec.workspace.template.as_ref()?;
    let access_modes = if template.access_modes.is_empty() {
        vec!["ReadWriteOnce".to_string()]
    } else {
        template.access_modes.clone()
    };
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(workspace_claim_name(ts)),
            namespace: ts.namespace(),
            labels: Some(session_labels(ts)),
            owner_references: ts.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes),
            storage_class_name: template.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(template.size.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The session's ExecutorRunning, owned by it (garbage-collected with it).
pub fn build_executor(ts: &TaskSession) -> ExecutorRunning {
    let mut er = ExecutorRunning::new(
        &executor_name(ts),
        ExecutorRunningSpec {
            session_name: ts.name_any(),
        },
    );
    er.metadata.namespace = ts.namespace();
    er.metadata.labels = Some(session_labels(ts));
    er.metadata.owner_references = ts.controller_owner_ref(&()).map(|o| vec![o]);
    er
}

fn session_labels(ts: &TaskSession) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_LABEL.to_string(), "true".to_string()),
        (
            SESSION_LABEL.to_string(),
            session_label_value(&ts.name_any()),
        ),
    ])
}

/// The agentctl pod for one launch of a session (DESIGN §3 step 3): managed labels, owned by the
/// session, no service-account token, non-root, the workspace PVC mounted, `restartPolicy: Never`
/// (a crashed agent is a lost pod, recovered lazily like any other).
pub fn build_agentctl_pod(
    ts: &TaskSession,
    request: &str,
    settings: &PodSettings,
    profile: &AgentProfile,
) -> Pod {
    let session = ts.name_any();
    let mount_path = ts.spec.workspace.mount_path.clone();
    let mut labels = session_labels(ts);
    labels.insert(REQUEST_LABEL.to_string(), short_hash(request));

    let mut env = vec![
        env_value("KANDEV_SESSION_NAME", &session),
        env_value(
            "KANDEV_AGENTCTL_SOCKET",
            &format!("{SOCKET_DIR}/agentctl.sock"),
        ),
        // The agent's own session store (e.g. ~/.claude) must survive the pod: it lives on the
        // workspace volume, which is what makes `session/resume` possible after a loss.
        env_value("HOME", &format!("{mount_path}/.kandev/home")),
        // The session's effective profile (custom profiles, per-session overrides) travels with
        // the pod, so agentctl needs no configuration file.
        env_value("KANDEV_AGENT_PROFILE_DEFINITION", &profile.to_document()),
        // Which pod wrote an entry of the event journal.
        EnvVar {
            name: ENV_POD_NAME.to_string(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    if settings.replay_line_limit_mib > 0 {
        env.push(env_value(
            "KANDEV_REPLAY_LINE_LIMIT_MIB",
            &settings.replay_line_limit_mib.to_string(),
        ));
    }
    env.extend(ts.spec.credentials.iter().map(|c| EnvVar {
        name: c.env.clone(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: c.secret_name.clone(),
                key: c.key.clone(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }));

    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(
            ts.spec
                .image
                .clone()
                .unwrap_or_else(|| settings.default_image.clone()),
        ),
        command: Some(vec!["agentctl".to_string()]),
        args: Some(vec![
            "serve".to_string(),
            "--workspace".to_string(),
            mount_path.clone(),
            "--cwd".to_string(),
            mount_path.clone(),
            "--profile".to_string(),
            ts.spec.agent.clone(),
        ]),
        working_dir: Some(mount_path.clone()),
        env: Some(env),
        resources: ts.spec.resources.clone(),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "workspace".into(),
                mount_path: mount_path.clone(),
                ..Default::default()
            },
            VolumeMount {
                name: "run".into(),
                mount_path: SOCKET_DIR.into(),
                ..Default::default()
            },
            VolumeMount {
                name: "tmp".into(),
                mount_path: "/tmp".into(),
                ..Default::default()
            },
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };

    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&session, request)),
            namespace: ts.namespace(),
            labels: Some(labels),
            owner_references: ts.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(settings.run_as_user),
                run_as_group: Some(settings.run_as_user),
                fs_group: Some(settings.run_as_user),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            tolerations: (!settings.tolerations.is_empty()).then(|| settings.tolerations.clone()),
            node_selector: (!settings.node_selector.is_empty())
                .then(|| settings.node_selector.clone()),
            volumes: Some(vec![
                Volume {
                    name: "workspace".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: workspace_claim_name(ts),
                        read_only: Some(false),
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "run".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
                Volume {
                    name: "tmp".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env_value(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CredentialRef, TaskSessionSpec, WorkspaceSpec, WorkspaceTemplate};

    fn session(workspace: WorkspaceSpec) -> TaskSession {
        let mut ts = TaskSession::new(
            "demo",
            TaskSessionSpec {
                task_id: "T-1".into(),
                agent: "claude-code".into(),
                workspace,
                credentials: vec![CredentialRef {
                    env: "ANTHROPIC_API_KEY".into(),
                    secret_name: "keys".into(),
                    key: "anthropic".into(),
                }],
                ..Default::default()
            },
        );
        ts.metadata.namespace = Some("team-a".into());
        ts.metadata.uid = Some("uid-1".into());
        ts
    }

    fn claim(name: &str) -> WorkspaceSpec {
        WorkspaceSpec {
            claim_name: Some(name.into()),
            mount_path: "/workspace".into(),
            ..Default::default()
        }
    }

    #[test]
    fn pod_names_are_deterministic_per_request_and_valid() {
        assert_eq!(pod_name("demo", "t1"), pod_name("demo", "t1"));
        assert_ne!(pod_name("demo", "t1"), pod_name("demo", "t2"));
        let long = "a".repeat(253);
        assert!(pod_name(&long, "t1").len() <= 253);
        // Cut where the name has a '.': the pod name is still a DNS-1123 subdomain.
        let dotted = format!("{}.{}", "a".repeat(235), "b".repeat(17));
        let name = pod_name(&dotted, "t1");
        assert!(!name.contains(".-") && !name.contains("-."), "{name}");
        assert_eq!(session_label_value("demo"), "demo");
        assert_eq!(session_label_value(&long).len(), 63);
    }

    #[test]
    fn only_the_controller_reference_makes_a_pod_the_sessions() {
        let ts = session(claim("ws"));
        let registry = crate::agents::AgentRegistry::builtin().expect("built-ins");
        let profile = registry.get("claude-code").expect("claude-code");
        let ours = build_agentctl_pod(&ts, "tok-1", &PodSettings::default(), profile);
        assert!(controlled_by(&ours, &ts));
        let mut labels_only = ours.clone();
        labels_only.metadata.owner_references = None;
        assert!(!controlled_by(&labels_only, &ts), "labels prove nothing");
        let mut not_controller = ours.clone();
        if let Some(refs) = not_controller.metadata.owner_references.as_mut() {
            refs[0].controller = Some(false);
        }
        assert!(!controlled_by(&not_controller, &ts));
        let mut recreated = ts.clone();
        recreated.metadata.uid = Some("uid-2".into());
        assert!(
            !controlled_by(&ours, &recreated),
            "same name, another session"
        );
    }

    #[test]
    fn agentctl_pod_is_locked_down_and_mounts_the_workspace() {
        let settings = PodSettings {
            default_image: "agentctl:dev".into(),
            run_as_user: 1000,
            ..Default::default()
        };
        let registry = crate::agents::AgentRegistry::builtin().expect("built-ins");
        let profile = registry.get("claude-code").expect("claude-code");
        let pod = build_agentctl_pod(&session(claim("ws")), "tok-1", &settings, profile);
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(MANAGED_LABEL).map(String::as_str), Some("true"));
        assert_eq!(labels.get(SESSION_LABEL).map(String::as_str), Some("demo"));
        assert_eq!(labels.get(REQUEST_LABEL), Some(&short_hash("tok-1")));
        let owner = &pod.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("TaskSession", Some(true))
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.security_context
                .as_ref()
                .and_then(|s| s.run_as_non_root),
            Some(true)
        );
        let volumes = spec.volumes.expect("volumes");
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("ws")
        );
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("agentctl:dev"));
        let env = c.env.clone().unwrap_or_default();
        let key = env
            .iter()
            .find(|e| e.name == "ANTHROPIC_API_KEY")
            .expect("credential env");
        assert!(key.value.is_none(), "secrets are referenced, never copied");
        assert!(
            env.iter()
                .any(|e| e.name == "HOME" && e.value.as_deref() == Some("/workspace/.kandev/home"))
        );
        assert_eq!(
            c.security_context
                .as_ref()
                .and_then(|s| s.read_only_root_filesystem),
            Some(true)
        );
    }

    #[test]
    fn workspace_claim_only_from_a_template() {
        assert!(build_workspace_claim(&session(claim("ws"))).is_none());
        let templated = session(WorkspaceSpec {
            template: Some(WorkspaceTemplate {
                size: "1Gi".into(),
                ..Default::default()
            }),
            mount_path: "/workspace".into(),
            ..Default::default()
        });
        let pvc = build_workspace_claim(&templated).expect("pvc from template");
        assert_eq!(pvc.metadata.name.as_deref(), Some("demo-workspace"));
        assert!(pod_name("demo", "x").starts_with("demo-agent-"));
        let spec = pvc.spec.expect("spec");
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    }
}
