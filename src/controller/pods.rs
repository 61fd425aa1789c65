//! Building the agentctl pod, the workspace PVC and the ExecutorRunning of a session. Pure: the
//! reconciler decides *whether* to create them; these functions only say *what* they look like.

use std::collections::BTreeMap;

use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Toleration, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::agents::AgentProfile;
use crate::api::launch_spec::{LAUNCH_SPEC_ANNOTATION, launch_spec_record};
use crate::api::names::{
    MANAGED_LABEL, READER_ROLE, REQUEST_LABEL, ROLE_LABEL, SESSION_LABEL, executor_name,
    network_policy_name, pod_name, reader_pod_name, session_label_value, short_hash,
    workspace_claim_name,
};
use crate::api::pod_contract::{
    CHECKOUT_CONTAINER, CONTAINER, CheckoutStart, ENV_AGENT_PROFILE_DEFINITION,
    ENV_AGENTCTL_SOCKET, ENV_GIT_CA_BUNDLE, ENV_GIT_KNOWN_HOSTS, ENV_GIT_PASSWORD, ENV_GIT_SSH_KEY,
    ENV_GIT_USERNAME, ENV_PERMISSIONS, ENV_POD_NAME, ENV_REPLAY_LINE_LIMIT_MIB,
    ENV_REPOSITORY_BASE_BRANCH, ENV_REPOSITORY_BRANCH, ENV_REPOSITORY_URL, ENV_SESSION_NAME,
    ENV_SUSPEND_IDLE_AFTER, ENV_WORKSPACE, SOCKET_DIR, TERMINATION_LOG,
};
use crate::api::{
    EffectivePolicy, ExecutorRunning, ExecutorRunningSpec, HISTORY_ANNOTATION, RepositorySpec,
    TaskSession, parse_idle_duration,
};

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
    /// Requests and limits of the agentctl container when the session sets none, so that an
    /// agent pod is never BestEffort.
    pub default_resources: Option<ResourceRequirements>,
    /// `runtimeClassName` of every agent pod (e.g. gVisor or Kata); `None`: the cluster default.
    pub runtime_class_name: Option<String>,
    /// `hostUsers: false`: the pod gets its own user namespace (needs cluster support).
    pub user_namespace: bool,
    /// Images a session may run; empty: any. Plain string prefixes, e.g.
    /// `registry.example.com/agents/`.
    pub allowed_image_prefixes: Vec<String>,
    /// The NetworkPolicy applied with every agent pod; `None`: none.
    pub network: Option<NetworkRules>,
    /// The sizes of the pod's `/tmp` and `/run/kandev` emptyDirs.
    pub scratch: ScratchLimits,
    /// The operator's own OTel variables ([`crate::telemetry::POD_ENV`]) that are set: agentctl
    /// exports its spans to the same receiver. Empty while traces are off.
    pub trace_env: Vec<(String, String)>,
    /// How long an agent may stay idle before agentctl suspends the session, where
    /// `spec.idle.suspendAfter` does not say (`--suspend-idle-after`); `None`: never.
    pub suspend_idle_after: Option<Duration>,
    /// The permission policy of sessions whose `spec.permissions` leaves a field out
    /// (`--permissions`).
    pub permissions: EffectivePolicy,
}

/// The session's idle suspension: `spec.idle.suspendAfter`, else the operator's default. A value
/// the CRD's rules let through but that does not parse is the default too.
pub fn suspend_idle_after(ts: &TaskSession, settings: &PodSettings) -> Option<Duration> {
    match ts
        .spec
        .idle
        .as_ref()
        .and_then(|i| i.suspend_after.as_deref())
    {
        Some(text) => parse_idle_duration(text).unwrap_or(settings.suspend_idle_after),
        None => settings.suspend_idle_after,
    }
}

/// The network of agent pods. Egress: DNS to kube-dns, and the `allow` CIDRs minus the `deny`
/// ones (the cloud metadata endpoint, cluster-internal ranges). Ingress: from the `ingress`
/// CIDRs only (none by default). Everything else is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkRules {
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
    pub ingress: Vec<Cidr>,
}

impl Default for NetworkRules {
    /// The internet, without the metadata endpoint, link-local, private and shared ranges; no
    /// ingress.
    fn default() -> Self {
        let parse = |list: &[&str]| list.iter().filter_map(|c| c.parse().ok()).collect();
        Self {
            allow: parse(DEFAULT_EGRESS_ALLOW),
            deny: parse(DEFAULT_EGRESS_DENY),
            ingress: Vec::new(),
        }
    }
}

/// The most an agent pod's `/tmp` and `/run/kandev` (agentctl's socket) emptyDirs may hold:
/// past it the kubelet evicts the pod (a lost session), instead of a runaway agent filling the
/// node's disk.
#[derive(Clone, Debug, PartialEq)]
pub struct ScratchLimits {
    pub tmp: Quantity,
    pub run: Quantity,
}

/// The default sizes (`--tmp-size-limit`, `--run-size-limit`).
pub const TMP_SIZE_LIMIT: &str = "1Gi";
pub const RUN_SIZE_LIMIT: &str = "16Mi";

impl Default for ScratchLimits {
    fn default() -> Self {
        Self {
            tmp: Quantity(TMP_SIZE_LIMIT.into()),
            run: Quantity(RUN_SIZE_LIMIT.into()),
        }
    }
}

/// Default egress of agent pods: every address…
pub const DEFAULT_EGRESS_ALLOW: &[&str] = &["0.0.0.0/0", "::/0"];
/// …except the cloud metadata and identity endpoints and the ranges they sit in: IPv4
/// link-local (169.254.169.254 of AWS, GCP, Azure, OCI and others, AWS's 169.254.170.2 and
/// .23 for containers and pod identity), Azure's host endpoint 168.63.129.16, OCI's legacy
/// 192.0.0.192, and, for IPv6-only clusters behind NAT64, those IPv4 addresses in the
/// well-known prefix 64:ff9b::/96; RFC 1918 private ranges; the carrier-grade NAT range some
/// clusters use for pods (Alibaba's 100.100.100.200 included); IPv6 unique-local (AWS's
/// fd00:ec2::254 and fd00:ec2::23, GCP's fd20:ce::254) and link-local. A node-local DNS cache
/// on 169.254.20.10 is reached by listing that /32 among the allowed ranges.
pub const DEFAULT_EGRESS_DENY: &[&str] = &[
    "169.254.0.0/16",
    "168.63.129.16/32",
    "192.0.0.192/32",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
    "fe80::/10",
    "64:ff9b::a9fe:0/112",
    "64:ff9b::a83f:8110/128",
    "64:ff9b::c000:c0/128",
];

/// An IP range in canonical CIDR form (no host bits set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `inner` lies inside `self` (same family, at least as long a prefix).
    pub fn contains(&self, inner: &Cidr) -> bool {
        inner.prefix >= self.prefix
            && match (self.address, inner.address) {
                (IpAddr::V4(a), IpAddr::V4(b)) => {
                    mask(u128::from(u32::from(b)), 32, self.prefix) == u128::from(u32::from(a))
                }
                (IpAddr::V6(a), IpAddr::V6(b)) => {
                    mask(u128::from(b), 128, self.prefix) == u128::from(a)
                }
                _ => false,
            }
    }
}

/// `bits` (an address of `width` bits) with all but the first `prefix` bits cleared.
fn mask(bits: u128, width: u8, prefix: u8) -> u128 {
    let host = u32::from(width - prefix.min(width));
    if host >= 128 {
        0
    } else {
        (bits >> host) << host
    }
}

/// A value that is not a CIDR (`why`), with the form it should have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a CIDR ({why}), e.g. 10.0.0.0/8 or fc00::/7")]
pub struct CidrError {
    text: String,
    why: &'static str,
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, CidrError> {
        let bad = |why| CidrError {
            text: text.to_string(),
            why,
        };
        let (address, prefix) = text.split_once('/').ok_or_else(|| bad("no /prefix"))?;
        let address: IpAddr = address.parse().map_err(|_| bad("not an IP address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| bad("not a prefix length"))?;
        let (bits, width) = match address {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        if prefix > width {
            return Err(bad("prefix too long"));
        }
        if mask(bits, width, prefix) != bits {
            return Err(bad("host bits set"));
        }
        Ok(Self { address, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Why the session's image may not run, given the allow-list; `None` when it may.
pub fn image_refusal(ts: &TaskSession, settings: &PodSettings) -> Option<String> {
    let image = agent_image(ts, settings);
    let prefixes = &settings.allowed_image_prefixes;
    if prefixes.is_empty() || prefixes.iter().any(|p| image.starts_with(p.as_str())) {
        return None;
    }
    Some(format!(
        "image {image:?} is not allowed: this operator runs only images that start with {} (--allowed-image-prefix, chart value agentPods.allowedImagePrefixes)",
        prefixes
            .iter()
            .map(|p| format!("{p:?}"))
            .collect::<Vec<_>>()
            .join(" or ")
    ))
}

/// The image of the session's agentctl pod: its own, or the operator's default.
fn agent_image(ts: &TaskSession, settings: &PodSettings) -> String {
    ts.spec
        .image
        .clone()
        .unwrap_or_else(|| settings.default_image.clone())
}

/// Whether `pod`'s controller ownerReference is `ts` (by UID: a pod that only carries the
/// session's labels is not its agent).
pub fn controlled_by(pod: &Pod, ts: &TaskSession) -> bool {
    crate::resume::is_controlled_by(pod, ts.metadata.uid.as_deref())
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
    start: CheckoutStart,
) -> Pod {
    let session = ts.name_any();
    let mut labels = session_labels(ts);
    labels.insert(REQUEST_LABEL.to_string(), short_hash(request));
    let container = agentctl_container(ts, settings, profile);
    // Only the clone gets the repository's credentials: an init container that ends before
    // the agent's container starts, so neither the agent, nor serve, nor anything exec'd into
    // the pod ever holds them.
    let init_containers = ts
        .spec
        .repository
        .as_ref()
        .map(|repository| vec![checkout_container(&container, repository, start)]);
    let volumes = pod_volumes(ts, settings);
    let name = pod_name(&session, request);
    let mut pod = session_pod(ts, settings, name, labels, container, volumes);
    if let Some(spec) = pod.spec.as_mut() {
        spec.init_containers = init_containers;
    }
    // What it was created from: the spec's later changes wait for the next launch.
    pod.metadata.annotations = Some(BTreeMap::from([(
        LAUNCH_SPEC_ANNOTATION.to_string(),
        launch_spec_record(&ts.spec),
    )]));
    pod
}

/// A pod of the session (its agent's or its history reader's) with one container: named
/// `name`, owned by the session, `restartPolicy: Never`, no service-account token or service
/// links, non-root with the runtime's default seccomp profile, and the operator's placement,
/// runtime class and user namespace, and `volumes`.
fn session_pod(
    ts: &TaskSession,
    settings: &PodSettings,
    name: String,
    labels: BTreeMap<String, String>,
    container: Container,
    volumes: Vec<Volume>,
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
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
            runtime_class_name: settings.runtime_class_name.clone(),
            host_users: settings.user_namespace.then_some(false),
            security_context: Some(pod_security_context(settings.run_as_user)),
            tolerations: (!settings.tolerations.is_empty()).then(|| settings.tolerations.clone()),
            node_selector: (!settings.node_selector.is_empty())
                .then(|| settings.node_selector.clone()),
            volumes: Some(volumes),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// How long a history reader pod lives at most: `agentctl sleep` ends then, and the operator
/// deletes the ended pod. `kubectl kandev history` reads within seconds and withdraws its
/// request, which deletes the pod at once; this bounds a reader whose client went away.
pub const READER_LIFETIME: Duration = Duration::from_secs(300);

/// The session's history reader pod: the agent's image, user, confinement, placement and
/// network (the session's NetworkPolicy selects it), the workspace mounted read-only, and no
/// agent, credentials, environment from Secrets or init container. Its process only sleeps;
/// `kubectl kandev history` execs `agentctl history` in it, as into an agent pod. It carries
/// the history request's `token` in the same annotation, so an ended reader is known as this
/// request's or an earlier one's.
pub fn build_reader_pod(ts: &TaskSession, settings: &PodSettings, token: &str) -> Pod {
    let session = ts.name_any();
    let mut labels = session_labels(ts);
    labels.insert(ROLE_LABEL.to_string(), READER_ROLE.to_string());
    let mount_path = ts.spec.workspace.mount_path.clone();
    let quantity = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(memory.to_string())),
        ])
    };
    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(agent_image(ts, settings)),
        command: Some(vec!["agentctl".to_string()]),
        args: Some(vec![
            "sleep".to_string(),
            READER_LIFETIME.as_secs().to_string(),
        ]),
        working_dir: Some(mount_path.clone()),
        env: Some(vec![
            env_value(ENV_SESSION_NAME, &session),
            env_value(ENV_WORKSPACE, &mount_path),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(quantity("10m", "32Mi")),
            limits: Some(quantity("500m", "128Mi")),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                read_only: Some(true),
                ..mount("workspace", &mount_path)
            },
            mount("tmp", "/tmp"),
        ]),
        security_context: Some(container_security_context()),
        ..Default::default()
    };
    let volumes = pod_volumes(ts, settings)
        .into_iter()
        .filter(|v| v.name != "run")
        .map(|mut v| {
            if let Some(claim) = v.persistent_volume_claim.as_mut() {
                claim.read_only = Some(true);
            }
            v
        })
        .collect();
    let mut pod = session_pod(
        ts,
        settings,
        reader_pod_name(&session),
        labels,
        container,
        volumes,
    );
    pod.metadata.annotations = Some(BTreeMap::from([(
        HISTORY_ANNOTATION.to_string(),
        token.to_string(),
    )]));
    pod
}

/// The agentctl container: `agentctl serve` on the workspace, with its environment, limits,
/// readiness probe and mounts.
fn agentctl_container(
    ts: &TaskSession,
    settings: &PodSettings,
    profile: &AgentProfile,
) -> Container {
    let mount_path = ts.spec.workspace.mount_path.clone();
    let mut args = serve_args(ts, &mount_path);
    // agentctl says why it ended (a checkout that failed, a suspension) in the container's
    // termination message.
    let suspend = suspend_idle_after(ts, settings);
    let says_why = suspend.is_some();
    if says_why {
        args.extend(["--termination-log".to_string(), TERMINATION_LOG.to_string()]);
    }
    Container {
        name: CONTAINER.to_string(),
        image: Some(agent_image(ts, settings)),
        command: Some(vec!["agentctl".to_string()]),
        args: Some(args),
        termination_message_path: says_why.then(|| TERMINATION_LOG.to_string()),
        working_dir: Some(mount_path.clone()),
        env: Some(container_env(ts, settings, profile, suspend)),
        resources: effective_resources(
            ts.spec.resources.as_ref(),
            settings.default_resources.as_ref(),
        ),
        readiness_probe: Some(readiness_probe()),
        volume_mounts: Some(vec![
            mount("workspace", &mount_path),
            mount("run", SOCKET_DIR),
            mount("tmp", "/tmp"),
        ]),
        security_context: Some(container_security_context()),
        ..Default::default()
    }
}

/// The agentctl container's environment: the base ([`base_env`]), the clone to find, the idle
/// suspension, the trace context and the session's credentials.
fn container_env(
    ts: &TaskSession,
    settings: &PodSettings,
    profile: &AgentProfile,
    suspend: Option<Duration>,
) -> Vec<EnvVar> {
    let mount_path = &ts.spec.workspace.mount_path;
    let mut env = base_env(&ts.name_any(), mount_path, settings, profile);
    if let Some(repository) = &ts.spec.repository {
        // The init container cloned it; serve finds that clone (and reports its branch and
        // commit), without the credentials.
        env.extend(repository_env(repository));
    }
    if let Some(after) = suspend {
        env.push(env_value(
            ENV_SUSPEND_IDLE_AFTER,
            &after.as_secs().to_string(),
        ));
    }
    env.extend(
        settings
            .trace_env
            .iter()
            .map(|(name, value)| env_value(name, value)),
    );
    // agentctl's built-in policy is the default one: only another policy is spelled out.
    let permissions = EffectivePolicy::over(&settings.permissions, ts.spec.permissions.as_ref());
    if permissions != EffectivePolicy::default()
        && let Ok(json) = serde_json::to_string(&permissions)
    {
        env.push(env_value(ENV_PERMISSIONS, &json));
    }
    env.extend(
        ts.spec
            .credentials
            .iter()
            .map(|c| secret_env(&c.env, &c.secret_name, &c.key)),
    );
    env
}

/// What agentctl needs in every pod: the session, its socket, HOME on the workspace volume,
/// git's trust in the workspace, the effective profile, the pod's name and the replay bound.
fn base_env(
    session: &str,
    mount_path: &str,
    settings: &PodSettings,
    profile: &AgentProfile,
) -> Vec<EnvVar> {
    let mut env = vec![
        env_value(ENV_SESSION_NAME, session),
        env_value(ENV_AGENTCTL_SOCKET, &format!("{SOCKET_DIR}/agentctl.sock")),
        // The agent's own session store (e.g. ~/.claude) must survive the pod: it lives on the
        // workspace volume, which is what makes `session/resume` possible after a loss.
        env_value("HOME", &format!("{mount_path}/.kandev/home")),
        // A volume's root belongs to root (fsGroup only gives its group), so git would refuse
        // the workspace's clone as of "dubious ownership": the workspace is declared safe, as
        // command-line configuration (the only kind besides the system's git trusts for this).
        env_value("GIT_CONFIG_COUNT", "1"),
        env_value("GIT_CONFIG_KEY_0", "safe.directory"),
        env_value("GIT_CONFIG_VALUE_0", mount_path),
        // The session's effective profile (custom profiles, per-session overrides) travels with
        // the pod, so agentctl needs no configuration file.
        env_value(ENV_AGENT_PROFILE_DEFINITION, &profile.to_document()),
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
            ENV_REPLAY_LINE_LIMIT_MIB,
            &settings.replay_line_limit_mib.to_string(),
        ));
    }
    env
}

/// `agentctl serve` on the workspace, in the session's profile.
fn serve_args(ts: &TaskSession, mount_path: &str) -> Vec<String> {
    vec![
        "serve".to_string(),
        "--workspace".to_string(),
        mount_path.to_string(),
        "--cwd".to_string(),
        mount_path.to_string(),
        "--profile".to_string(),
        ts.spec.agent.clone(),
    ]
}

/// Non-root as `uid` (its group and the volumes' group too), with the runtime's default
/// seccomp profile.
fn pod_security_context(uid: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        fs_group: Some(uid),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The agentctl container's resources: the session's own, with a default limit for each
/// resource it sets no limit of (so requests alone never escape the operator's limits; a request
/// above the default limit is its own limit), or the defaults whole when it sets none.
pub fn effective_resources(
    own: Option<&ResourceRequirements>,
    defaults: Option<&ResourceRequirements>,
) -> Option<ResourceRequirements> {
    let own = own.filter(|r| r.requests.is_some() || r.limits.is_some());
    let Some(own) = own else {
        return defaults.cloned();
    };
    let mut merged = own.clone();
    let default_limits = defaults.and_then(|d| d.limits.as_ref());
    for (name, default) in default_limits.into_iter().flatten() {
        let limits = merged.limits.get_or_insert_with(BTreeMap::new);
        if limits.contains_key(name) {
            continue;
        }
        let requested = own.requests.as_ref().and_then(|r| r.get(name));
        let limit = match requested {
            Some(request) if quantity_value(request) > quantity_value(default) => request,
            _ => default,
        };
        limits.insert(name.clone(), limit.clone());
    }
    Some(merged)
}

/// A Kubernetes quantity as a number, to compare two of them (`500m`, `2`, `1Gi`, `1e3`, `5k`);
/// `None` when it is not one (the CRD refuses those).
fn quantity_value(quantity: &Quantity) -> Option<f64> {
    let text = quantity.0.trim();
    const SUFFIXES: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("Ei", 1_152_921_504_606_846_976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    text.parse::<f64>().ok()
}

/// The workspace PVC and the two sized scratch directories (`/run/kandev`, `/tmp`).
fn pod_volumes(ts: &TaskSession, settings: &PodSettings) -> Vec<Volume> {
    vec![
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
            empty_dir: Some(sized_empty_dir(&settings.scratch.run)),
            ..Default::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(sized_empty_dir(&settings.scratch.tmp)),
            ..Default::default()
        },
    ]
}

/// The environment naming the session's repository (no credentials).
fn repository_env(repository: &RepositorySpec) -> Vec<EnvVar> {
    let mut env = vec![env_value(ENV_REPOSITORY_URL, &repository.url)];
    if let Some(branch) = &repository.branch {
        env.push(env_value(ENV_REPOSITORY_BRANCH, branch));
    }
    if let Some(base) = &repository.base_branch {
        env.push(env_value(ENV_REPOSITORY_BASE_BRANCH, base));
    }
    env
}

/// The init container that prepares the workspace (`agentctl checkout`): it clones the
/// repository into an empty workspace on the first start (`start`; a later one refuses an empty
/// workspace), and only it gets the credentials from the repository's Secret. Why it could not becomes its termination message, which the operator
/// turns into the launch's Stalled reason. Same image, user, limits and confinement as `main`.
fn checkout_container(
    main: &Container,
    repository: &RepositorySpec,
    start: CheckoutStart,
) -> Container {
    let workspace = main.working_dir.clone().unwrap_or_default();
    // No HOME and no git configuration: agentctl runs git with a private HOME and its own
    // command-line configuration only, never the agent's (`agentctl::checkout`).
    let mut env = repository_env(repository);
    if let Some(creds) = &repository.credentials {
        for (name, key) in [
            (ENV_GIT_USERNAME, &creds.username_key),
            (ENV_GIT_PASSWORD, &creds.password_key),
            (ENV_GIT_SSH_KEY, &creds.ssh_key_key),
            (ENV_GIT_KNOWN_HOSTS, &creds.known_hosts_key),
            (ENV_GIT_CA_BUNDLE, &creds.ca_bundle_key),
        ] {
            if let Some(key) = key {
                env.push(secret_env(name, &creds.secret_name, key));
            }
        }
    }
    Container {
        name: CHECKOUT_CONTAINER.to_string(),
        image: main.image.clone(),
        command: Some(vec!["agentctl".to_string()]),
        args: Some(
            [
                "checkout",
                "--workspace",
                &workspace,
                "--termination-log",
                TERMINATION_LOG,
            ]
            .into_iter()
            .chain((start == CheckoutStart::Later).then_some("--started-before"))
            .map(String::from)
            .collect(),
        ),
        termination_message_path: Some(TERMINATION_LOG.to_string()),
        // A clone that dies without its word (killed, out of memory) still says something.
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        working_dir: Some(workspace.clone()),
        env: Some(env),
        resources: main.resources.clone(),
        volume_mounts: Some(vec![mount("workspace", &workspace), mount("tmp", "/tmp")]),
        security_context: Some(container_security_context()),
        ..Default::default()
    }
}

fn mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// The restricted Pod Security Standard, at container level too (so a pod-level setting is
/// never the only line of defence).
fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The session's NetworkPolicy, owned by it: its agent pods may reach kube-dns (UDP and TCP 53)
/// and `rules.allow` minus `rules.deny`, nothing else, and only `rules.ingress` may reach them
/// (nothing by default: the operator reaches agentctl through exec, the kubelet's probes run
/// inside the container).
pub fn build_network_policy(ts: &TaskSession, rules: &NetworkRules) -> NetworkPolicy {
    let mut egress = vec![dns_egress()];
    let blocks = allowed_blocks(rules);
    if !blocks.is_empty() {
        egress.push(NetworkPolicyEgressRule {
            to: Some(blocks),
            ports: None,
        });
    }
    // No rule: no ingress at all; one rule: from the listed peers.
    let peers: Vec<NetworkPolicyPeer> = rules
        .ingress
        .iter()
        .map(|cidr| NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: cidr.to_string(),
                except: None,
            }),
            ..Default::default()
        })
        .collect();
    let ingress = if peers.is_empty() {
        Vec::new()
    } else {
        vec![NetworkPolicyIngressRule {
            from: Some(peers),
            ports: None,
        }]
    };
    let mut selector = session_labels(ts);
    selector.retain(|k, _| k == MANAGED_LABEL || k == SESSION_LABEL);
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(network_policy_name(&ts.name_any())),
            namespace: ts.namespace(),
            labels: Some(session_labels(ts)),
            owner_references: ts.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".to_string(), "Egress".to_string()]),
            egress: Some(egress),
            ingress: Some(ingress),
        }),
    }
}

/// DNS, to the cluster's resolver only (kube-dns in kube-system), over UDP and TCP.
fn dns_egress() -> NetworkPolicyEgressRule {
    let ports = ["UDP", "TCP"]
        .iter()
        .map(|protocol| NetworkPolicyPort {
            port: Some(IntOrString::Int(53)),
            protocol: Some(protocol.to_string()),
            ..Default::default()
        })
        .collect();
    let labels = |key: &str, value: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..Default::default()
    };
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(labels("kubernetes.io/metadata.name", "kube-system")),
            pod_selector: Some(labels("k8s-app", "kube-dns")),
            ..Default::default()
        }]),
        ports: Some(ports),
    }
}

/// One IP block per allowed CIDR, with the denied CIDRs inside it as exceptions.
fn allowed_blocks(rules: &NetworkRules) -> Vec<NetworkPolicyPeer> {
    rules
        .allow
        .iter()
        .map(|allow| {
            let except: Vec<String> = rules
                .deny
                .iter()
                .filter(|deny| allow.contains(deny) && *deny != allow)
                .map(Cidr::to_string)
                .collect();
            NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: allow.to_string(),
                    except: (!except.is_empty()).then_some(except),
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// The kubelet's check of agentctl, inside the container: `agentctl events --once` asks serve
/// for a snapshot of its state over its socket and exits 0 once it got one. The pod is Ready
/// once serve answers (its agent started and initialized), and not Ready while it does not
/// (frozen, or its agent gone): what `kubectl get pods` shows, checked every 10 s by the
/// kubelet, at no cost to the API server.
fn readiness_probe() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(["agentctl", "events", "--once"].map(String::from).to_vec()),
        }),
        period_seconds: Some(PROBE_PERIOD_SECONDS),
        timeout_seconds: Some(PROBE_TIMEOUT_SECONDS),
        failure_threshold: Some(PROBE_FAILURES),
        ..Default::default()
    }
}

const PROBE_PERIOD_SECONDS: i32 = 10;
const PROBE_TIMEOUT_SECONDS: i32 = 5;
const PROBE_FAILURES: i32 = 3;

/// How long after agentctl stops answering its pod is not Ready, at most: the readiness probe's
/// failures in a row, each a period apart, the last one after its timeout.
pub const NOT_READY_WITHIN: Duration =
    Duration::from_secs((PROBE_PERIOD_SECONDS * PROBE_FAILURES + PROBE_TIMEOUT_SECONDS) as u64);

fn sized_empty_dir(limit: &Quantity) -> EmptyDirVolumeSource {
    EmptyDirVolumeSource {
        size_limit: Some(limit.clone()),
        ..Default::default()
    }
}

/// An environment variable from a Secret's key (required: a missing key keeps the pod in
/// `CreateContainerConfigError`, which the launch deadline reports).
fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional: Some(false),
            }),
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
    fn only_the_controller_reference_makes_a_pod_the_sessions() {
        let ts = session(claim("ws"));
        let registry = crate::agents::AgentRegistry::builtin().expect("built-ins");
        let profile = registry.get("claude-code").expect("claude-code");
        let ours = build_agentctl_pod(
            &ts,
            "tok-1",
            &PodSettings::default(),
            profile,
            CheckoutStart::First,
        );
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
        let pod = build_agentctl_pod(
            &session(claim("ws")),
            "tok-1",
            &settings,
            profile,
            CheckoutStart::First,
        );
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
    fn the_repository_is_cloned_by_an_init_container_that_alone_gets_its_secret() {
        use crate::api::{RepositoryCredentials, RepositorySpec};
        let mut ts = session(claim("ws"));
        let plain = build_agentctl_pod(
            &ts,
            "tok-1",
            &PodSettings::default(),
            &profile(),
            CheckoutStart::First,
        );
        let spec = plain.spec.expect("spec");
        assert!(spec.init_containers.is_none(), "no repository, no checkout");
        let c = &spec.containers[0];
        assert!(
            !c.args
                .clone()
                .unwrap_or_default()
                .contains(&"--termination-log".to_string())
        );
        assert!(
            !c.env
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|e| e.name.starts_with("KANDEV_REPOSITORY"))
        );

        ts.spec.repository = Some(RepositorySpec {
            url: "https://git.example/app.git".into(),
            branch: Some("kandev/t-1".into()),
            base_branch: None,
            credentials: Some(RepositoryCredentials {
                secret_name: "git".into(),
                password_key: Some("token".into()),
                ..Default::default()
            }),
        });
        let pod = build_agentctl_pod(
            &ts,
            "tok-1",
            &PodSettings::default(),
            &profile(),
            CheckoutStart::First,
        );
        let spec = pod.spec.expect("spec");
        let value =
            |c: &Container, name: &str| c.env.iter().flatten().find(|e| e.name == name).cloned();
        let literal = |c: &Container, name: &str| value(c, name).and_then(|e| e.value);
        // The agent's container: where the repository is, never a credential.
        let main = &spec.containers[0];
        assert_eq!(
            literal(main, "KANDEV_REPOSITORY_URL").as_deref(),
            Some("https://git.example/app.git")
        );
        let secrets: Vec<&str> = main
            .env
            .iter()
            .flatten()
            .filter(|e| {
                // The agent's own keys (spec.credentials) are its to hold; the repository's not.
                e.name.starts_with("KANDEV_GIT_")
                    || e.value_from
                        .as_ref()
                        .and_then(|v| v.secret_key_ref.as_ref())
                        .is_some_and(|r| r.name == "git")
            })
            .map(|e| e.name.as_str())
            .collect();
        assert!(
            secrets.is_empty(),
            "credentials in the agent's container: {secrets:?}"
        );
        assert!(main.termination_message_path.is_none());

        // The init container: the clone, with the credentials by reference.
        let [checkout] = spec.init_containers.as_deref().expect("init containers") else {
            panic!("one init container: {:?}", spec.init_containers);
        };
        assert_eq!(checkout.name, CHECKOUT_CONTAINER);
        assert_eq!(
            (&checkout.image, &checkout.resources),
            (&main.image, &main.resources)
        );
        assert_eq!(checkout.security_context, main.security_context);
        assert_eq!(
            checkout.args.clone().unwrap_or_default(),
            [
                "checkout",
                "--workspace",
                "/workspace",
                "--termination-log",
                TERMINATION_LOG
            ]
        );
        assert_eq!(
            checkout.termination_message_path.as_deref(),
            Some(TERMINATION_LOG)
        );
        // A later start (the session's checkout recorded) never clones into an empty workspace.
        let later = build_agentctl_pod(
            &ts,
            "tok-2",
            &PodSettings::default(),
            &profile(),
            CheckoutStart::Later,
        );
        let later_args = later
            .spec
            .and_then(|s| s.init_containers)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.args)
            .unwrap_or_default();
        assert_eq!(
            later_args.last().map(String::as_str),
            Some("--started-before"),
            "{later_args:?}"
        );
        assert_eq!(
            literal(checkout, "KANDEV_REPOSITORY_BRANCH").as_deref(),
            Some("kandev/t-1")
        );
        assert!(value(checkout, "KANDEV_REPOSITORY_BASE_BRANCH").is_none());
        assert!(
            checkout
                .env
                .iter()
                .flatten()
                .all(|e| e.name != "HOME" && !e.name.starts_with("GIT_CONFIG_")),
            "the checkout takes no HOME or git configuration from the agent's side"
        );
        assert_eq!(
            (
                literal(main, "GIT_CONFIG_COUNT"),
                literal(main, "GIT_CONFIG_KEY_0"),
                literal(main, "GIT_CONFIG_VALUE_0")
            ),
            (
                Some("1".into()),
                Some("safe.directory".into()),
                Some("/workspace".into())
            ),
            "the agent's git trusts the workspace"
        );
        let password = value(checkout, "KANDEV_GIT_PASSWORD").expect("password env");
        assert!(password.value.is_none(), "referenced, never copied");
        let selector = password
            .value_from
            .and_then(|v| v.secret_key_ref)
            .expect("secretKeyRef");
        assert_eq!(
            (selector.name.as_str(), selector.key.as_str()),
            ("git", "token")
        );
        assert!(value(checkout, "KANDEV_GIT_SSH_KEY").is_none());
        let mounts: Vec<&str> = checkout
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(mounts, ["workspace", "tmp"], "not the socket's directory");
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

    fn profile() -> AgentProfile {
        let registry = crate::agents::AgentRegistry::builtin().expect("built-ins");
        registry.get("claude-code").expect("claude-code").clone()
    }

    fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    }

    /// The reader mounts the workspace read-only, holds nothing from Secrets, starts no agent,
    /// and is confined and placed like the agent pod it stands in for.
    #[test]
    fn reader_pod_reads_the_workspace_and_nothing_more() {
        let mut ts = session(claim("ws"));
        ts.spec.repository = Some(RepositorySpec {
            url: "https://example.com/r.git".into(),
            credentials: Some(
                serde_json::from_value(
                    serde_json::json!({"secretName": "git", "passwordKey": "p"}),
                )
                .expect("credentials"),
            ),
            ..Default::default()
        });
        let settings = PodSettings {
            default_image: "img:1".into(),
            run_as_user: 1234,
            node_selector: BTreeMap::from([("pool".to_string(), "agents".to_string())]),
            ..Default::default()
        };
        let agent = build_agentctl_pod(&ts, "tok-1", &settings, &profile(), CheckoutStart::First);
        let reader = build_reader_pod(&ts, &settings, "read-1");
        assert_eq!(
            reader
                .annotations()
                .get(HISTORY_ANNOTATION)
                .map(String::as_str),
            Some("read-1")
        );
        assert_eq!(reader.metadata.name.as_deref(), Some("demo-history"));
        let labels = reader.metadata.labels.clone().unwrap_or_default();
        assert!(crate::api::names::is_reader(Some(&labels)));
        assert_eq!(
            labels.get(SESSION_LABEL),
            agent
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SESSION_LABEL))
        );
        assert_eq!(
            reader.metadata.owner_references,
            agent.metadata.owner_references
        );
        let (spec, agent_spec) = (reader.spec.expect("spec"), agent.spec.expect("spec"));
        assert!(
            spec.init_containers.is_none(),
            "no checkout, no credentials"
        );
        assert_eq!(spec.security_context, agent_spec.security_context);
        assert_eq!(spec.node_selector, agent_spec.node_selector);
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = &spec.containers[0];
        assert_eq!(c.name, CONTAINER);
        assert_eq!(c.image.as_deref(), Some("img:1"));
        assert_eq!(c.args.clone().unwrap_or_default(), ["sleep", "300"]);
        assert_eq!(
            c.security_context,
            agent_spec.containers[0].security_context
        );
        assert!(c.env.iter().flatten().all(|e| e.value_from.is_none()));
        assert!(
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some()
        );
        let workspace = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "workspace")
            .expect("workspace");
        assert_eq!(workspace.read_only, Some(true));
        for v in spec.volumes.iter().flatten() {
            assert!(
                v.persistent_volume_claim.is_some() || v.empty_dir.is_some(),
                "{v:?}"
            );
            if let Some(claim) = &v.persistent_volume_claim {
                assert_eq!(
                    (claim.claim_name.as_str(), claim.read_only),
                    ("ws", Some(true))
                );
            }
        }
    }

    #[test]
    fn agentctl_pod_passes_the_restricted_pod_security_standard() {
        let pod = build_agentctl_pod(
            &session(claim("ws")),
            "tok-1",
            &PodSettings::default(),
            &profile(),
            CheckoutStart::First,
        );
        let spec = pod.spec.expect("spec");
        let pod_ctx = spec.security_context.expect("pod securityContext");
        assert_eq!(pod_ctx.run_as_non_root, Some(true));
        assert_eq!(
            pod_ctx.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
        assert!(spec.host_network.is_none() && spec.host_pid.is_none() && spec.host_ipc.is_none());
        for c in &spec.containers {
            let ctx = c
                .security_context
                .clone()
                .expect("container securityContext");
            assert_eq!(ctx.allow_privilege_escalation, Some(false));
            assert_eq!(ctx.run_as_non_root, Some(true));
            assert_eq!(ctx.privileged, None);
            assert_eq!(
                ctx.capabilities.and_then(|c| c.drop),
                Some(vec!["ALL".to_string()])
            );
            assert_eq!(
                ctx.seccomp_profile.map(|p| p.type_).as_deref(),
                Some("RuntimeDefault")
            );
        }
        // The kubelet asks agentctl itself whether it answers.
        let probe = spec.containers[0]
            .readiness_probe
            .clone()
            .expect("readiness probe");
        assert_eq!(
            probe.exec.and_then(|e| e.command),
            Some(vec!["agentctl".into(), "events".into(), "--once".into()])
        );
        // Only volume types the restricted profile allows; every emptyDir bounded.
        for v in spec.volumes.unwrap_or_default() {
            assert!(
                v.persistent_volume_claim.is_some() || v.empty_dir.is_some(),
                "{v:?}"
            );
            if let Some(dir) = v.empty_dir {
                assert!(dir.size_limit.is_some(), "{} has a sizeLimit", v.name);
            }
        }
        // Defaults: no runtime class, host user namespace, no resources unless configured.
        assert_eq!(spec.runtime_class_name, None);
        assert_eq!(spec.host_users, None);
    }

    #[test]
    fn quantities_compare_by_value() {
        #[rustfmt::skip]
        let rows: Vec<(&str, Option<f64>)> = vec![
            ("2", Some(2.0)), ("500m", Some(0.5)), ("1Gi", Some(1_073_741_824.0)),
            ("1G", Some(1e9)), ("5k", Some(5000.0)), ("1e3", Some(1000.0)),
            ("1.5Mi", Some(1_572_864.0)), ("256Mi", Some(268_435_456.0)), ("x", None), ("", None),
        ];
        for (text, expected) in rows {
            assert_eq!(quantity_value(&Quantity(text.into())), expected, "{text}");
        }
        assert!(quantity_value(&Quantity("3Gi".into())) > quantity_value(&Quantity("2Gi".into())));
        assert!(
            quantity_value(&Quantity("2100M".into())) < quantity_value(&Quantity("2Gi".into()))
        );
    }

    #[test]
    fn a_session_that_sets_only_some_resources_gets_the_default_limits_of_the_rest() {
        let defaults = ResourceRequirements {
            requests: quantities(&[("cpu", "250m"), ("memory", "512Mi")]),
            limits: quantities(&[("memory", "2Gi"), ("ephemeral-storage", "4Gi")]),
            ..Default::default()
        };
        let own = |requests: &[(&str, &str)], limits: &[(&str, &str)]| ResourceRequirements {
            requests: (!requests.is_empty())
                .then(|| quantities(requests))
                .flatten(),
            limits: (!limits.is_empty()).then(|| quantities(limits)).flatten(),
            ..Default::default()
        };
        #[rustfmt::skip]
        let rows: Vec<(&str, Option<ResourceRequirements>, Option<ResourceRequirements>)> = vec![
            ("none: the defaults", None, Some(defaults.clone())),
            ("requests only: default limits",
                Some(own(&[("memory", "1Gi")], &[])),
                Some(own(&[("memory", "1Gi")], &[("memory", "2Gi"), ("ephemeral-storage", "4Gi")]))),
            ("a request above a default limit is its own limit",
                Some(own(&[("memory", "8Gi")], &[])),
                Some(own(&[("memory", "8Gi")], &[("memory", "8Gi"), ("ephemeral-storage", "4Gi")]))),
            ("its own limits win",
                Some(own(&[], &[("memory", "16Gi"), ("cpu", "4")])),
                Some(own(&[], &[("memory", "16Gi"), ("cpu", "4"), ("ephemeral-storage", "4Gi")]))),
        ];
        for (what, session, expected) in rows {
            assert_eq!(
                effective_resources(session.as_ref(), Some(&defaults)),
                expected,
                "{what}"
            );
        }
        assert_eq!(effective_resources(None, None), None);
    }

    #[test]
    fn containment_settings_shape_the_pod() {
        let defaults = ResourceRequirements {
            requests: quantities(&[("cpu", "250m"), ("memory", "512Mi")]),
            limits: quantities(&[("memory", "2Gi")]),
            ..Default::default()
        };
        let settings = PodSettings {
            default_resources: Some(defaults.clone()),
            runtime_class_name: Some("gvisor".into()),
            user_namespace: true,
            ..Default::default()
        };
        let pod = build_agentctl_pod(
            &session(claim("ws")),
            "tok-1",
            &settings,
            &profile(),
            CheckoutStart::First,
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(spec.host_users, Some(false));
        assert_eq!(
            spec.containers[0].resources.as_ref(),
            Some(&defaults),
            "a session without resources gets the defaults: never BestEffort"
        );

        // The session's own limits win.
        let mut ts = session(claim("ws"));
        let own = ResourceRequirements {
            limits: quantities(&[("cpu", "4"), ("memory", "8Gi")]),
            ..Default::default()
        };
        ts.spec.resources = Some(own.clone());
        let pod = build_agentctl_pod(&ts, "tok-1", &settings, &profile(), CheckoutStart::First);
        assert_eq!(pod.spec.expect("spec").containers[0].resources, Some(own));
        // Requests alone still get the default limits; one above a default limit is its own.
        ts.spec.resources = Some(ResourceRequirements {
            requests: quantities(&[("cpu", "1"), ("memory", "4Gi")]),
            ..Default::default()
        });
        let pod = build_agentctl_pod(&ts, "tok-1", &settings, &profile(), CheckoutStart::First);
        assert_eq!(
            pod.spec.expect("spec").containers[0].resources,
            Some(ResourceRequirements {
                requests: quantities(&[("cpu", "1"), ("memory", "4Gi")]),
                limits: quantities(&[("memory", "4Gi")]),
                ..Default::default()
            })
        );
        // An empty resources object counts as none.
        ts.spec.resources = Some(ResourceRequirements::default());
        let pod = build_agentctl_pod(&ts, "tok-1", &settings, &profile(), CheckoutStart::First);
        assert_eq!(
            pod.spec.expect("spec").containers[0].resources,
            Some(defaults)
        );
    }

    #[test]
    fn agentctl_gets_the_operators_trace_settings() {
        let registry = crate::agents::AgentRegistry::builtin().expect("built-ins");
        let profile = registry.get("claude-code").expect("claude-code");
        let env_of = |settings: &PodSettings| -> Vec<(String, Option<String>)> {
            let pod = build_agentctl_pod(
                &session(claim("ws")),
                "tok-1",
                settings,
                profile,
                CheckoutStart::First,
            );
            let spec = pod.spec.expect("spec");
            spec.containers[0]
                .env
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|e| e.name.starts_with("OTEL_"))
                .map(|e| (e.name, e.value))
                .collect()
        };
        assert!(env_of(&PodSettings::default()).is_empty(), "traces off");
        let settings = PodSettings {
            trace_env: vec![(
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                "http://collector:4318".into(),
            )],
            ..Default::default()
        };
        assert_eq!(
            env_of(&settings),
            vec![(
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
                Some("http://collector:4318".to_string())
            )]
        );
    }

    #[test]
    fn the_image_allow_list_refuses_other_images() {
        let mut settings = PodSettings {
            default_image: "registry.example/agents/agentctl:1".into(),
            ..Default::default()
        };
        let mut ts = session(claim("ws"));
        assert_eq!(image_refusal(&ts, &settings), None, "no list: any image");
        settings.allowed_image_prefixes = vec!["registry.example/agents/".into()];
        assert_eq!(image_refusal(&ts, &settings), None, "the default image");
        ts.spec.image = Some("registry.example/agents/custom:2".into());
        assert_eq!(image_refusal(&ts, &settings), None);
        ts.spec.image = Some("evil.example/registry.example/agents/x".into());
        let refusal = image_refusal(&ts, &settings).expect("refused");
        assert!(
            refusal.contains("\"evil.example/registry.example/agents/x\" is not allowed")
                && refusal.contains("\"registry.example/agents/\""),
            "{refusal}"
        );
    }

    #[test]
    fn cidrs_parse_canonically_and_nest() {
        let cidr = |s: &str| s.parse::<Cidr>().expect(s);
        assert_eq!(cidr("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("fc00::/7").to_string(), "fc00::/7");
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0",
            "10.0.0.0/33",
            "::/129",
            "x/8",
            "10.0.0.0/x",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!(cidr("0.0.0.0/0").contains(&cidr("169.254.169.254/32")));
        assert!(cidr("10.0.0.0/8").contains(&cidr("10.1.0.0/16")));
        assert!(!cidr("10.0.0.0/8").contains(&cidr("11.0.0.0/8")));
        assert!(!cidr("10.1.0.0/16").contains(&cidr("10.0.0.0/8")));
        assert!(
            !cidr("0.0.0.0/0").contains(&cidr("fc00::/7")),
            "families never nest"
        );
        assert!(cidr("::/0").contains(&cidr("fd00:ec2::254/128")));
    }

    #[test]
    fn network_policy_allows_dns_and_the_internet_only_and_no_ingress() {
        let ts = session(claim("ws"));
        let np = build_network_policy(&ts, &NetworkRules::default());
        assert_eq!(np.metadata.name.as_deref(), Some("demo-agent-egress"));
        let owner = &np.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("TaskSession", Some(true))
        );
        let json = serde_json::to_value(np.spec.expect("spec")).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "podSelector": {"matchLabels": {"kandev.dev/managed": "true", "kandev.dev/session": "demo"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": [
                    {
                        "to": [{
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }],
                        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                    },
                    {"to": [
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                            "169.254.0.0/16", "168.63.129.16/32", "192.0.0.192/32", "10.0.0.0/8",
                            "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                        ]}},
                        {"ipBlock": {"cidr": "::/0", "except": [
                            "fc00::/7", "fe80::/10", "64:ff9b::a9fe:0/112", "64:ff9b::a83f:8110/128",
                            "64:ff9b::c000:c0/128",
                        ]}},
                    ]},
                ],
            })
        );
        // A narrower allowed range inside a denied one is a hole in it (a node-local DNS cache).
        let cache = NetworkRules {
            allow: ["0.0.0.0/0", "169.254.20.10/32"]
                .iter()
                .map(|c| c.parse().expect("cidr"))
                .collect(),
            ..NetworkRules::default()
        };
        let spec = serde_json::to_value(build_network_policy(&ts, &cache).spec).expect("json");
        assert_eq!(
            spec["egress"][1]["to"][1],
            serde_json::json!({"ipBlock": {"cidr": "169.254.20.10/32"}})
        );
        // Only DNS when nothing is allowed.
        let closed = NetworkRules {
            allow: vec![],
            deny: vec![],
            ingress: vec![],
        };
        let np = build_network_policy(&ts, &closed);
        assert_eq!(np.spec.expect("spec").egress.map(|e| e.len()), Some(1));
        // Ingress opened to the listed peers only.
        let open = NetworkRules {
            ingress: vec!["10.1.0.0/16".parse().expect("cidr")],
            ..NetworkRules::default()
        };
        let spec = serde_json::to_value(build_network_policy(&ts, &open).spec).expect("json");
        assert_eq!(
            spec["ingress"],
            serde_json::json!([{"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}])
        );
        let long = "a".repeat(253);
        assert!(network_policy_name(&long).len() <= 253);
    }
}
