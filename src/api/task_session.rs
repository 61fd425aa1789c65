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
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TaskSessionSpec {
    /// Identifier of the task this session works on (e.g. the board's task id). Immutable.
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

    /// The initial prompt sent to the agent when the session first starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_description: Option<String>,

    /// Container image of the agentctl pod (agentctl plus the agent). Defaults to the operator's
    /// configured agentctl image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

    /// Compute resources of the agentctl container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Overrides of the agent profile's capabilities for this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<CapabilityOverrides>,
}

/// Where the agent's workspace lives. Exactly one of `claimName` and `template`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.claimName) != has(self.template)").message("workspace needs exactly one of claimName or template"),
    validation = Rule::new("self == oldSelf").message("workspace is immutable")
)]
pub struct WorkspaceSpec {
    /// Name of an existing PersistentVolumeClaim in the session's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,

    /// Template of a PVC the operator creates (named `<session>-workspace`) and owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<WorkspaceTemplate>,

    /// Where the workspace is mounted in the agentctl container.
    #[serde(default = "default_mount_path")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("mountPath must be an absolute path"))]
    pub mount_path: String,
}

fn default_mount_path() -> String {
    "/workspace".to_string()
}

/// Template of the workspace PVC.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplate {
    /// Requested size, a Kubernetes quantity such as `10Gi`.
    pub size: String,
    /// Storage class of the PVC; the cluster default when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Access modes of the PVC; `ReadWriteOnce` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
}

/// A Git repository checked out into an empty workspace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RepositorySpec {
    /// Clone URL (https://, ssh:// or git@host:path).
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('ssh://') || self.startsWith('git@') || self.startsWith('file://')")
        .message("repository.url must start with https://, ssh://, git@ or file://"))]
    pub url: String,
    /// Branch the agent works on; created from `baseBranch` when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Branch to start from; the repository's default branch when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_branch: Option<String>,
}

/// One Secret key exposed to the agent as an environment variable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CredentialRef {
    /// Environment variable name inside the agent, e.g. `ANTHROPIC_API_KEY`.
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("credentials[].env must be a valid environment variable name"))]
    pub env: String,
    /// Name of the Secret in the session's namespace.
    pub secret_name: String,
    /// Key inside the Secret.
    pub key: String,
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
    pub error_message: Option<String>,
    /// The resume-request token (annotation value) being handled now, latched before acting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_resume_request: Option<String>,
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
    /// kstatus-compatible conditions: Ready, Reconciling, Stalled, AgentRunning, NeedsResume, Resumed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
