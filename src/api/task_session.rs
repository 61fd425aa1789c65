//! `TaskSession` (short name `ts`): one agent session on one task (DESIGN §2).

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ResumeReason, SessionState, TaskState};

/// Desired state of one AI coding-agent session. The spec is owned by the user (or a frontend);
/// everything the operator learns is in `status`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kandev.dev",
    version = "v1alpha1",
    kind = "TaskSession",
    namespaced,
    status = "TaskSessionStatus",
    shortname = "ts",
    category = "kandev",
    doc = "One AI coding-agent session on one task. Lost agent pods are not relaunched until a resume is requested with the annotation kandev.dev/resume-requested-at.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Lifecycle state of the session"
    ),
    printcolumn(
        name = "Task",
        type_ = "string",
        json_path = ".status.taskState",
        description = "State of the task column"
    ),
    printcolumn(
        name = "NeedsResume",
        type_ = "boolean",
        json_path = ".status.needsResume",
        description = "The agent is gone; annotate to resume"
    ),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".spec.agent",
        description = "Agent profile"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.resumeReason",
        priority = "1",
        description = "Why the session needs (or cannot get) a resume"
    ),
    printcolumn(
        name = "Approval",
        type_ = "string",
        json_path = ".status.pendingPermissions[0].id",
        priority = "1",
        description = "The oldest permission request that waits for an answer"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = Rule::new("!has(oldSelf.spec.end) || (has(self.spec.end) && self.spec.end == oldSelf.spec.end)")
        .message("spec.end is set once: a session that ends cannot be reopened or end another way"),
    validation = Rule::new("!has(self.spec.workspace.template) || self.metadata.name.size() <= 243")
        .message("a TaskSession with workspace.template needs a name of at most 243 characters: its PVC is named <name>-workspace")
)]
#[serde(rename_all = "camelCase")]
pub struct TaskSessionSpec {
    /// Identifier of the task this session works on (e.g. the board's task id), at most 253
    /// characters. Immutable.
    #[schemars(length(max = 253))]
    #[x_kube(
        validation = Rule::new("self.size() > 0").message("taskId must not be empty"),
        validation = Rule::new("self == oldSelf").message("taskId is immutable")
    )]
    pub task_id: String,

    /// Agent profile: claude-code, codex, copilot, auggie, gemini, amp, opencode, or a custom
    /// profile known to the operator. Immutable.
    #[schemars(length(max = 63))]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
            .message("agent must be a profile name: lowercase letters, digits and '-'"),
        validation = Rule::new("self == oldSelf").message("agent is immutable")
    )]
    pub agent: String,

    /// The initial prompt sent to the agent when the session first starts, at most 65536
    /// characters (64 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub task_description: Option<String>,

    /// Container image of the agentctl pod (agentctl plus the agent). Defaults to the operator's
    /// configured agentctl image; when set, it must not be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(
        validation = Rule::new("self.size() > 0")
            .message("image must not be empty: omit it to use the operator's default image"),
        validation = Rule::new("self == self.trim()")
            .message("image must not have leading or trailing whitespace")
    )]
    pub image: Option<String>,

    /// The workspace volume that survives pod loss: an existing PVC or a template for one.
    pub workspace: WorkspaceSpec,

    /// Git repository that agentctl checks out into an empty workspace on first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<RepositorySpec>,

    /// Secrets exposed to the agent as environment variables. Their values are never copied into
    /// status, Events or logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // A list-map keyed by `env`: the API server itself refuses the same variable twice.
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["env".into()]))]
    pub credentials: Vec<CredentialRef>,

    /// Compute resources of the agentctl container: `requests` and `limits` of `cpu`, `memory`
    /// and `ephemeral-storage`, each a non-negative Kubernetes quantity; a request may not exceed
    /// its limit. `claims`, hugepages and extended resources are not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = bound_resources)]
    #[x_kube(
        validation = Rule::new("!has(self.claims) || self.claims.size() == 0")
            .message("resources.claims is not supported: agent pods have no resource claims"),
        validation = Rule::new(RESOURCE_NAMES).message(
            "resources.requests and resources.limits may only name cpu, memory and ephemeral-storage"
        ),
        validation = Rule::new(RESOURCE_QUANTITIES).message(
            "resources.requests and resources.limits must be Kubernetes quantities such as 500m, 2 or 1Gi"
        ),
        validation = Rule::new(RESOURCE_NOT_NEGATIVE)
            .message("resources.requests and resources.limits must not be negative"),
        validation = Rule::new(REQUESTS_WITHIN_LIMITS)
            .message("resources.requests must not exceed resources.limits")
    )]
    pub resources: Option<ResourceRequirements>,

    /// Overrides of the agent profile's capabilities for this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<CapabilityOverrides>,

    /// What happens to the agent while it waits for input: `suspendAfter` stops an idle one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleSpec>,

    /// What agentctl answers when the agent asks for a permission (ACP
    /// `session/request_permission`) and no client that decides is connected: allow, deny, or
    /// ask a person (`status.pendingPermissions`, `kubectl kandev approve|deny`). Fields left
    /// out take the operator's defaults. Read when a pod starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<super::PermissionPolicy>,

    /// The agent session's mode, model and config options, set after every start and every
    /// restore, before the task or a prompt is sent (ACP `session/set_mode`, `session/set_model`,
    /// `session/set_config_option`). A value the agent does not offer is reported
    /// (`SessionConfigured=False`, reason `NotOffered`, and an Event naming what it offers); it
    /// never fails the launch. Read at each launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_config: Option<SessionConfigSpec>,

    /// Ends the session, once: `Completed` lets a running prompt finish (up to the operator's
    /// end grace period), `Cancelled` cancels it. Then the agent is stopped, the session and its
    /// task become COMPLETED or CANCELLED, and resume requests are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<SessionEnd>,
}

/// How a session ends (`spec.end`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The work is done: a running prompt may finish first.
    Completed,
    /// The work is abandoned: a running prompt is cancelled.
    Cancelled,
}

/// What becomes of a workspace PVC created from `workspace.template` when the session ends.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkspaceRetention {
    /// Kept until the TaskSession is deleted (it is owned by it).
    #[default]
    Retain,
    /// Deleted once the agent has stopped.
    Delete,
}

/// CEL: every key of `requests` and `limits` is a container resource the pod accepts without
/// further rules (hugepages and extended resources need requests equal to limits, and more).
const RESOURCE_NAMES: &str = "[has(self.requests) ? self.requests : {}, has(self.limits) ? self.limits : {}].all(m, m.all(k, k in ['cpu', 'memory', 'ephemeral-storage']))";
/// CEL: every value of `requests` and `limits` (int or string) is a quantity.
const RESOURCE_QUANTITIES: &str = "[has(self.requests) ? self.requests : {}, has(self.limits) ? self.limits : {}].all(m, m.all(k, isQuantity(string(m[k]))))";
/// CEL: no negative quantity (a malformed one is reported by [`RESOURCE_QUANTITIES`]).
const RESOURCE_NOT_NEGATIVE: &str = "[has(self.requests) ? self.requests : {}, has(self.limits) ? self.limits : {}].all(m, m.all(k, !isQuantity(string(m[k])) || !quantity(string(m[k])).isLessThan(quantity('0'))))";
/// CEL: a request is at most the limit of the same resource.
const REQUESTS_WITHIN_LIMITS: &str = "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || !isQuantity(string(self.requests[k])) || !isQuantity(string(self.limits[k])) || quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)";

/// Bounds the schema of `resources` (a Kubernetes type) so that the CEL rules above have a
/// bounded cost: at most 8 `requests` and 8 `limits`, values of at most 64 characters.
fn bound_resources(schema: &mut schemars::Schema) {
    for map in ["requests", "limits"] {
        if let Some(prop) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut(map))
            .and_then(|m| m.as_object_mut())
        {
            prop.insert("maxProperties".into(), 8.into());
            if let Some(values) = prop
                .get_mut("additionalProperties")
                .and_then(|v| v.as_object_mut())
            {
                values.insert("maxLength".into(), 64.into());
            }
        }
    }
    if let Some(claims) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("claims"))
        .and_then(|c| c.as_object_mut())
    {
        claims.insert("maxItems".into(), 8.into());
    }
}

/// CEL: a DNS-1123 subdomain (the names of PVCs, Secrets and StorageClasses); the length is
/// checked by `maxLength`.
const DNS_SUBDOMAIN: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";

/// CEL: [`DNS_SUBDOMAIN`], or `""` (a PVC without a storage class).
const STORAGE_CLASS: &str = "self == '' || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";

/// Where the agent's workspace lives. Exactly one of `claimName` and `template`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.claimName) != has(self.template)").message("workspace needs exactly one of claimName or template"),
    validation = Rule::new("self == oldSelf").message("workspace is immutable")
)]
pub struct WorkspaceSpec {
    /// Name of an existing PersistentVolumeClaim in the session's namespace (a DNS-1123
    /// subdomain, at most 253 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message(
        "workspace.claimName must be a PVC name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    ))]
    pub claim_name: Option<String>,

    /// Template of a PVC the operator creates (named `<session>-workspace`) and owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<WorkspaceTemplate>,

    /// What becomes of the template's PVC when the session ends (`spec.end`): `Retain` (the
    /// default; it goes with the TaskSession) or `Delete`. A `claimName` PVC is never deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<WorkspaceRetention>,

    /// Where the workspace is mounted in the agentctl container: an absolute, normalised path
    /// (no `//`, `.` or `..` segments, no trailing `/`, not `/`) of at most 1024 characters,
    /// outside `/tmp` and `/run/kandev`, where the operator mounts its own volumes.
    #[serde(default = "default_mount_path")]
    #[schemars(length(max = 1024))]
    #[x_kube(
        validation = Rule::new("self.startsWith('/')").message("mountPath must be an absolute path"),
        validation = Rule::new("self != '/' && !self.endsWith('/')")
            .message("mountPath must not be / and must not end with /"),
        validation = Rule::new("!self.contains('//') && !self.matches('/[.][.]?(/|$)')")
            .message("mountPath must be normalised: no //, /./ or /../ in it"),
        validation = Rule::new("!['/tmp', '/run/kandev'].exists(p, self == p || self.startsWith(p + '/'))")
            .message("mountPath must not be /tmp, /run/kandev or below them: the operator mounts its own volumes there")
    )]
    pub mount_path: String,
}

fn default_mount_path() -> String {
    "/workspace".to_string()
}

/// Template of the workspace PVC.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplate {
    /// Requested size, a Kubernetes quantity greater than zero such as `10Gi`.
    #[schemars(length(max = 64))]
    #[x_kube(
        validation = Rule::new("isQuantity(self)")
            .message("workspace.template.size must be a Kubernetes quantity such as 10Gi"),
        validation = Rule::new("!isQuantity(self) || quantity(self).isGreaterThan(quantity('0'))")
            .message("workspace.template.size must be greater than zero")
    )]
    pub size: String,
    /// Storage class of the PVC (a DNS-1123 subdomain); the cluster default when omitted, no
    /// class (a pre-provisioned volume) when `""`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(STORAGE_CLASS).message(
        "workspace.template.storageClassName must be a StorageClass name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    ))]
    pub storage_class_name: Option<String>,
    /// Access modes of the PVC, each one of `ReadWriteOnce`, `ReadOnlyMany`, `ReadWriteMany`,
    /// `ReadWriteOncePod` (which excludes the others); `ReadWriteOnce` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), inner(length(max = 32)))]
    #[x_kube(
        validation = Rule::new("self.all(m, m in ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'])")
            .message("workspace.template.accessModes must be ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod"),
        validation = Rule::new("!('ReadWriteOncePod' in self) || self.size() == 1")
            .message("workspace.template.accessModes: ReadWriteOncePod cannot be combined with other access modes")
    )]
    pub access_modes: Vec<String>,
}

/// CEL: a remote Git URL (no whitespace, a host, a path).
const REPOSITORY_URL: &str =
    r"self.matches('^(https|ssh|git)://[^\\s/]+/\\S+$') || self.matches('^git@[^\\s/:]+:\\S+$')";
/// CEL: a usable branch name (a subset of `git check-ref-format`: no option-like name).
const BRANCH: &str = r"self.size() > 0 && !self.startsWith('-') && !self.contains('..') && !self.matches('[\\s~^:?*\\[\\\\]')";
const BRANCH_MESSAGE: &str = r"repository.branch and repository.baseBranch must be Git branch names: not empty, not starting with '-', without '..', whitespace or any of ~ ^ : ? * [ \";

/// CEL: no password in the URL (credentials come from `repository.credentials`).
const URL_WITHOUT_PASSWORD: &str = r"!self.matches('^[a-z]+://[^/@]*:[^/@]*@')";

/// A Git repository checked out into an empty workspace on the first start (never again on a
/// resume, never over a non-empty workspace). Immutable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("repository is immutable"))]
pub struct RepositorySpec {
    /// Clone URL: `https://host/path`, `ssh://host/path`, `git://host/path` or scp-style
    /// `git@host:path`, at most 2048 characters. Local paths and `file://` are refused, and so
    /// is a password in the URL (use `credentials`).
    #[schemars(length(max = 2048))]
    #[x_kube(
        validation = Rule::new(REPOSITORY_URL).message(
            "repository.url must be https://host/path, ssh://host/path, git://host/path or git@host:path (file:// and local paths are not allowed)"
        ),
        validation = Rule::new(URL_WITHOUT_PASSWORD).message(
            "repository.url must not carry a password: put it in a Secret and name it in repository.credentials"
        )
    )]
    pub url: String,
    /// Branch the agent works on; created from `baseBranch` when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    #[x_kube(validation = Rule::new(BRANCH).message(BRANCH_MESSAGE))]
    pub branch: Option<String>,
    /// Branch to start from; the repository's default branch when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    #[x_kube(validation = Rule::new(BRANCH).message(BRANCH_MESSAGE))]
    pub base_branch: Option<String>,
    /// A Secret holding what git needs to reach the repository: an HTTPS user name and token,
    /// or an SSH private key and `known_hosts`. Only agentctl's clone sees them; they are never
    /// copied into status, Events or logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<RepositoryCredentials>,
}

/// Keys of one Secret that authenticate the clone. HTTPS: `passwordKey` (a token), optionally
/// `usernameKey` and `caBundleKey`; SSH: `sshKeyKey` and `knownHostsKey` (host keys are always
/// checked).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.passwordKey) || has(self.sshKeyKey) || has(self.caBundleKey)")
        .message("repository.credentials needs passwordKey (HTTPS), sshKeyKey (SSH) or caBundleKey"),
    validation = Rule::new("has(self.sshKeyKey) == has(self.knownHostsKey)")
        .message("repository.credentials: sshKeyKey and knownHostsKey go together (host keys are always checked)"),
    validation = Rule::new("!has(self.usernameKey) || has(self.passwordKey)")
        .message("repository.credentials: usernameKey needs passwordKey")
)]
pub struct RepositoryCredentials {
    /// Name of the Secret in the session's namespace (a DNS-1123 subdomain, at most 253
    /// characters).
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message(
        "repository.credentials.secretName must be a Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    ))]
    pub secret_name: String,
    /// Key of the HTTPS user name [default: `x-access-token`, what most forges accept with a
    /// token].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(SECRET_KEY).message(SECRET_KEY_MESSAGE))]
    pub username_key: Option<String>,
    /// Key of the HTTPS password or token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(SECRET_KEY).message(SECRET_KEY_MESSAGE))]
    pub password_key: Option<String>,
    /// Key of the SSH private key (OpenSSH format, without a passphrase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(SECRET_KEY).message(SECRET_KEY_MESSAGE))]
    pub ssh_key_key: Option<String>,
    /// Key of the `known_hosts` lines of the SSH server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(SECRET_KEY).message(SECRET_KEY_MESSAGE))]
    pub known_hosts_key: Option<String>,
    /// Key of PEM CA certificates that sign the HTTPS server's certificate (a forge with a
    /// private CA); the image's trust store otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(SECRET_KEY).message(SECRET_KEY_MESSAGE))]
    pub ca_bundle_key: Option<String>,
}

const SECRET_KEY_MESSAGE: &str = "repository.credentials keys must be Secret data keys: letters, digits, '-', '_' and '.', not '.' or '..' and not starting with '..'";

/// CEL: a key of a Secret's `data` (what the kubelet accepts in `secretKeyRef.key`).
const SECRET_KEY: &str =
    "self.matches('^[-._a-zA-Z0-9]+$') && !self.startsWith('..') && self != '.'";

/// One Secret key exposed to the agent as an environment variable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CredentialRef {
    /// Environment variable name inside the agent, e.g. `ANTHROPIC_API_KEY`, at most 128
    /// characters. `HOME`, `PATH` and names starting with `KANDEV_` or `GIT_CONFIG_` are reserved.
    #[schemars(length(max = 128))]
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("credentials[].env must be a valid environment variable name"),
        validation = Rule::new("!(self in ['HOME', 'PATH']) && !self.startsWith('KANDEV_') && !self.startsWith('GIT_CONFIG_')")
            .message("credentials[].env must not be HOME, PATH or start with KANDEV_ or GIT_CONFIG_: the operator sets those")
    )]
    pub env: String,
    /// Name of the Secret in the session's namespace (a DNS-1123 subdomain, at most 253
    /// characters).
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message(
        "credentials[].secretName must be a Secret name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    ))]
    pub secret_name: String,
    /// Key inside the Secret: letters, digits, `-`, `_` and `.`, at most 253 characters.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new(SECRET_KEY).message(
        "credentials[].key must be a Secret data key: letters, digits, '-', '_' and '.', not '.' or '..' and not starting with '..'"
    ))]
    pub key: String,
}

/// `spec.idle`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdleSpec {
    /// How long the agent may stay idle (waiting for input, no prompt running, no client
    /// connected) before it is stopped and its pod ends: the session is then `Suspended`,
    /// `needsResume` with its token and workspace kept, and any resume brings it back. A
    /// duration such as `30m`, `1h30m` or `90s` (at least 10s), or `off`. Unset: the operator's
    /// default (`--suspend-idle-after`). Read when a pod starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^(off|([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?)$"),
        length(min = 2, max = 32)
    )]
    #[x_kube(validation = Rule::new("self == 'off' || duration(self) >= duration('10s')").message(
        "idle.suspendAfter must be off or a duration of at least 10s, e.g. 30m or 1h30m"
    ))]
    pub suspend_after: Option<String>,
}

/// An idle duration that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdleDurationError {
    #[error("{text:?}: unknown unit {unit:?} (use h, m, s, or off)")]
    UnknownUnit { text: String, unit: char },
    #[error("{0:?}: expected e.g. 30m, 1h30m, 90s or off")]
    Malformed(String),
    #[error("{0:?}: a number too large")]
    TooLarge(String),
    #[error("{0:?}: at least 10s")]
    TooShort(String),
}

/// `off`, or a duration of hours, minutes and seconds (`1h30m`, `90s`): `Ok(None)` for off.
/// At least 10 s: a shorter one would stop an agent between a client's two calls.
pub fn parse_idle_duration(text: &str) -> Result<Option<std::time::Duration>, IdleDurationError> {
    if text == "off" {
        return Ok(None);
    }
    let malformed = || IdleDurationError::Malformed(text.to_string());
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut units = Vec::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => {
                return Err(IdleDurationError::UnknownUnit {
                    text: text.to_string(),
                    unit: c,
                });
            }
        };
        if digits.is_empty() || units.last().is_some_and(|last| *last <= unit) {
            return Err(malformed());
        }
        units.push(unit);
        let n: u64 = digits
            .parse()
            .map_err(|_| IdleDurationError::TooLarge(text.to_string()))?;
        total = total.saturating_add(n.saturating_mul(unit));
        digits.clear();
    }
    if !digits.is_empty() || units.is_empty() {
        return Err(malformed());
    }
    if total < 10 {
        return Err(IdleDurationError::TooShort(text.to_string()));
    }
    Ok(Some(std::time::Duration::from_secs(total)))
}

/// `spec.sessionConfig`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionConfigSpec {
    /// A session mode id the agent offers (e.g. claude-agent-acp's `acceptEdits` or `plan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub mode: Option<String>,
    /// A model id the agent offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub model: Option<String>,
    /// Values of the agent's select config options, by option id.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.size() <= 16 && self.all(k, k.size() <= 128 && self[k].size() <= 128)").message(
        "sessionConfig.options holds at most 16 options, ids and values of at most 128 characters"
    ))]
    pub options: std::collections::BTreeMap<String, String>,
}

impl SessionConfigSpec {
    /// The same values as a session configuration.
    pub fn state(&self) -> super::SessionConfigState {
        super::SessionConfigState {
            mode: self.mode.clone(),
            model: self.model.clone(),
            config_options: self
                .options
                .iter()
                .map(|(id, value)| super::ConfigOptionValue {
                    id: id.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

/// Per-session overrides of the agent profile (see the agent capability registry).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityOverrides {
    /// Restore the agent's own session (ACP `session/resume` / `session/load`) from the resume token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_session_resume: Option<bool>,
    /// Wrap the first prompt after a fresh start in the recorded history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_context_injection: Option<bool>,
}

/// What the operator observed and decided about the session.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TaskSessionStatus {
    /// Lifecycle state: CREATED, STARTING, RUNNING, WAITING_FOR_INPUT, COMPLETED, FAILED, CANCELLED.
    #[serde(default)]
    pub state: SessionState,
    /// Mirror of the task column: TODO, IN_PROGRESS, REVIEW, COMPLETED, FAILED, CANCELLED.
    #[serde(default)]
    pub task_state: TaskState,
    /// True when the agent is gone and the session can be resumed by annotation.
    #[serde(default)]
    pub needs_resume: bool,
    /// True when a resume request would be honoured.
    #[serde(default)]
    pub is_resumable: bool,
    /// Why the session needs (or cannot get) a resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_reason: Option<ResumeReason>,
    /// Human-readable reason of the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MESSAGE_MAX))]
    pub error_message: Option<String>,
    /// The resume-request token (annotation value) being handled now, latched before acting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_resume_request: Option<String>,
    /// Request tokens that arrived while the active request's launch was progressing and asked
    /// for the same kind of start (a restore, or a fresh one): they joined that launch and are
    /// answered with its outcome when it ends (then they move to recentResumeRequests, the
    /// newest becoming lastHandledResumeRequest). Oldest first, at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub joined_resume_requests: Vec<String>,
    /// The last resume-request token whose handling ended (success or terminal failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_resume_request: Option<String>,
    /// The most recently handled resume-request tokens, oldest first, at most 16 (the last one
    /// is lastHandledResumeRequest). Re-applying any of them is a no-op, so a GitOps rollback
    /// to an earlier manifest never triggers a resume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_resume_requests: Vec<String>,
    /// State to return to after a successful resume (remembered when entering STARTING).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_state: Option<SessionState>,
    /// Name of this session's ExecutorRunning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_ref: Option<String>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The agent's permission requests that wait for a person's answer, oldest first (answer
    /// one with the annotation kandev.dev/permission-answer=<id>=<optionKind>, or
    /// `kubectl kandev approve|deny`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = super::PENDING_PERMISSIONS_MAX))]
    pub pending_permissions: Vec<super::PendingPermission>,
    /// The last history request (annotation kandev.dev/history-requested-at) that the operator
    /// answered without a read: no reader pod is kept for this token any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_request: Option<HistoryRequestStatus>,
    /// kstatus-compatible conditions: Ready, Reconciling, Stalled, AgentRunning, NeedsResume,
    /// Resumed, Suspended, TaskSent, AwaitingApproval, SessionConfigured, SpecApplied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// How the operator answered a history request ([`super::HISTORY_ANNOTATION`]) without a read
/// through its reader pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRequestStatus {
    /// The annotation's token.
    pub token: String,
    /// `AgentRunning`: an agent pod runs or starts, read through it; `WorkspaceGone`: the
    /// session's workspace PVC is gone (deleted, or re-created as another volume); `Expired`: the
    /// reader pod ended (after 5 minutes) while the annotation was still set; `Refused`: the
    /// API server refused the reader pod (an admission check, a quota).
    pub outcome: HistoryOutcome,
    /// What the operator found, for a person.
    #[schemars(length(max = super::bounds::MESSAGE_MAX))]
    pub message: String,
}

/// See [`HistoryRequestStatus::outcome`].
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryOutcome {
    AgentRunning,
    WorkspaceGone,
    Expired,
    Refused,
}

impl HistoryOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentRunning => "AgentRunning",
            Self::WorkspaceGone => "WorkspaceGone",
            Self::Expired => "Expired",
            Self::Refused => "Refused",
        }
    }
}

#[cfg(test)]
mod idle_tests {
    use std::time::Duration;

    use super::parse_idle_duration;

    #[test]
    fn idle_durations_parse_like_the_crd_accepts_them() {
        let secs = |s| Ok(Some(Duration::from_secs(s)));
        #[rustfmt::skip]
        let rows: &[(&str, Result<Option<Duration>, ()>)] = &[
            ("off", Ok(None)),
            ("30m", secs(1800)),
            ("1h30m", secs(5400)),
            ("90s", secs(90)),
            ("2h0m10s", secs(7210)),
            ("10s", secs(10)),
            ("9s", Err(())),
            ("0s", Err(())),
            ("30", Err(())),
            ("m", Err(())),
            ("30m1h", Err(())),
            ("1d", Err(())),
            ("", Err(())),
        ];
        for (text, expected) in rows {
            let got = parse_idle_duration(text).map_err(|_| ());
            assert_eq!(&got, expected, "{text:?}");
        }
    }
}
