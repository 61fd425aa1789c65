//! `ExecutorRunning` (short name `er`): the persisted runtime record of a session's executor.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::{AGENT_NAME_MAX, BRANCH_MAX, CONFIG_ITEMS_MAX, NUDGE_MAX, SESSION_ID_MAX};

/// Runtime record of a TaskSession's executor (owned by the session through an ownerReference).
/// It holds what must survive an operator restart, above all the ACP resume token.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kandev.dev",
    version = "v1alpha1",
    kind = "ExecutorRunning",
    namespaced,
    status = "ExecutorRunningStatus",
    shortname = "er",
    category = "kandev",
    doc = "Runtime record of a TaskSession's executor: pod, resume token (ACP session id), worktree and negotiated agent capabilities.",
    printcolumn(
        name = "Session",
        type_ = "string",
        json_path = ".spec.sessionName",
        description = "The TaskSession this executor belongs to"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.status",
        description = "Executor status"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".status.podName",
        description = "Current agentctl pod"
    ),
    printcolumn(
        name = "Resumable",
        type_ = "boolean",
        json_path = ".status.resumable",
        description = "The saved session can be restored"
    ),
    printcolumn(
        name = "Token",
        type_ = "string",
        json_path = ".status.resumeToken",
        priority = "1",
        description = "ACP session id used to resume"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorRunningSpec {
    /// Name of the TaskSession (same namespace) this executor belongs to. Immutable.
    #[x_kube(
        validation = Rule::new("self.size() > 0").message("sessionName must not be empty"),
        validation = Rule::new("self == oldSelf").message("sessionName is immutable")
    )]
    pub session_name: String,
}

// No `Pending`: while a launch runs the TaskSession is `STARTING`, and the executor keeps its
// value until the launch succeeds (earlier schemas listed `Pending`; it was never written).
/// Status of an executor: Running, Lost or Stopped (absent before the first launch succeeds).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorPhase {
    /// The agentctl pod is running and agentctl answers.
    Running,
    /// The pod is gone or dead; the session waits for a resume.
    Lost,
    /// The executor was stopped on purpose.
    Stopped,
}

/// What the agent is doing.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentActivity {
    /// Waiting for the next prompt.
    Idle,
    /// A prompt is in flight.
    Working,
}

/// What the operator knows about the executor; persisted so a restarted operator loses nothing.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorRunningStatus {
    /// ACP session id of the agent: the resume token. Never cleared by a failed resume unless the
    /// agent explicitly said the session is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = SESSION_ID_MAX))]
    pub resume_token: Option<String>,
    /// ACP `messageId` of the last message the agent streamed in the session `resumeToken`
    /// names (from agentctl's event journal; absent for agents that send no message ids, and
    /// after a fresh session until its first message).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "lastMessageUUID"
    )]
    #[schemars(length(max = SESSION_ID_MAX))]
    pub last_message_uuid: Option<String>,
    /// Name of the current agentctl pod (a hint: the live Pod is always checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// UID of the current agentctl pod, to tell a recreated pod of the same name apart.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "podUID")]
    pub pod_uid: Option<String>,
    /// The git worktree the agent works in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<WorktreeStatus>,
    /// Identifier of the current agent execution (changes on every launch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_execution_id: Option<String>,
    /// Executor status: Running, Lost, Stopped (absent before the first launch succeeds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ExecutorPhase>,
    /// Whether the agent is working on a prompt (Working) or waiting for input (Idle), as last
    /// reported by `agentctl events`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<AgentActivity>,
    /// Whether the saved agent session can be restored.
    #[serde(default)]
    pub resumable: bool,
    /// When agentctl was last seen alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<Time>,
    /// The sequence number of the last agentctl event journal entry applied here: the operator
    /// catches up with `agentctl events --since <journalCursor>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_cursor: Option<u64>,
    /// The value of the TaskSession's `kandev.dev/prompted-at` annotation for which the journal
    /// was last read up to an idle agent: a restarted operator reads the journal of an idle
    /// agent again only for a new value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = NUDGE_MAX))]
    pub handled_prompted_at: Option<String>,
    /// ACP capabilities negotiated at the last `initialize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<NegotiatedCapabilities>,
    /// The agent session's mode, model and config options as the agent last reported them (in
    /// the `session/new`, `session/load` or `session/resume` answer and its `session/update`s).
    /// A resume sets them back where the restored session reports something else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_config: Option<SessionConfigState>,
    /// The agent's permission requests that wait for a person's answer, as agentctl's journal
    /// reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = super::PENDING_PERMISSIONS_MAX))]
    pub pending_permissions: Vec<super::PendingPermission>,
    /// The UID of the workspace PVC the session's agent ran on (written by each launch): a PVC
    /// of the same name with another UID is another volume, and the session is not resumed on
    /// it (`WorkspaceLost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub workspace_uid: Option<String>,
    /// What of the wanted session configuration (the saved one and spec.sessionConfig) the
    /// agent did not offer at the last launch; empty when everything was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MESSAGE_MAX))]
    pub session_config_problem: Option<String>,
    /// The last `kandev.dev/permission-answer` value handled (relayed, or refused with an
    /// Event): the same value again is a no-op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub handled_permission_answer: Option<String>,
}

/// The mode, model and config options of an agent session (ACP `modes.currentModeId`,
/// `models.currentModelId`, `configOptions[].currentValue`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionConfigState {
    /// The current session mode id (e.g. `plan`, `code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub mode: Option<String>,
    /// The current model id (ACP `models`, unstable in the protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub model: Option<String>,
    /// The current value of each config option, by option id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = CONFIG_ITEMS_MAX))]
    pub config_options: Vec<ConfigOptionValue>,
}

impl SessionConfigState {
    /// Within the bounds of [`super::bounds`]: a mode, a model, an option id or value longer
    /// than [`AGENT_NAME_MAX`] is dropped (a cut id names nothing to set back), and at most
    /// [`CONFIG_ITEMS_MAX`] options are kept.
    pub fn bounded(mut self) -> Self {
        let fits = |s: &String| s.len() <= AGENT_NAME_MAX;
        self.mode = self.mode.filter(fits);
        self.model = self.model.filter(fits);
        self.config_options
            .retain(|option| fits(&option.id) && fits(&option.value));
        self.config_options.truncate(CONFIG_ITEMS_MAX);
        self
    }
}

/// One config option's current value.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigOptionValue {
    /// The option's id (`configId`).
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub id: String,
    /// Its current value id.
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub value: String,
}

/// The git worktree of an executor.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeStatus {
    /// Worktree identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// PVC holding the worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<String>,
    /// Path of the worktree inside the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Branch checked out in the worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = BRANCH_MAX))]
    pub branch: Option<String>,
    /// The commit checked out (HEAD) when agentctl last started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub commit: Option<String>,
}

/// Summary of the agent's ACP `initialize` answer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NegotiatedCapabilities {
    /// Negotiated ACP protocol version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<i64>,
    /// `agentCapabilities.loadSession`: the agent replays a saved session with `session/load`.
    #[serde(default)]
    pub load_session: bool,
    /// `agentCapabilities.sessionCapabilities.resume`: the agent restores with `session/resume`.
    #[serde(default)]
    pub session_resume: bool,
    /// Agent name reported in `agentInfo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub agent_name: Option<String>,
    /// Agent version reported in `agentInfo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub agent_version: Option<String>,
}
