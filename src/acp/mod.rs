//! The ACP client (Agent Client Protocol: JSON-RPC 2.0, one JSON message per line).
//!
//! - [`AcpClient`] speaks ACP over any byte stream (a child's stdio, a unix socket, a
//!   Kubernetes exec stream), so the operator, agentctl and the tests share one client.
//! - [`AcpClient::restore`] (`restore.rs`) executes DESIGN §3 "ACP restore selection" by calling
//!   the pure rules in [`crate::resume`]; it never decides on its own what an error means or
//!   whether a token survives.
//! - [`restore_with_local_agent`] is the core of `agentctl restore`: spawn the agent, restore,
//!   report.
//!
//! Message bodies use the `agent-client-protocol` crate's v1 schema types; the line framing and
//! request routing are ours (see `rpc.rs` for why).

pub mod budget;
mod client;
mod exec;
mod local;
mod outcome;
mod restore;
mod rpc;
mod updates;

use std::path::PathBuf;

pub use client::{
    AcpClient, AcpLimits, AcpTimeouts, DEFAULT_REPLAY_BUDGET, negotiated_capabilities,
    restore_capabilities,
};
pub use exec::{PodConnection, exec_stdio};
pub use local::{AgentStderr, LocalAgent, RestoreOptions, SpawnOptions, restore_with_local_agent};
pub use outcome::{OutcomeKind, RestoreOutcome, RestoreReport};
pub use rpc::{Replayed, default_answer_to_agent_request};
pub use updates::SessionUpdateEvent;

use crate::jsonrpc::CallFailure;

/// Key in the `_meta` of `session/new|load|resume` and `session/prompt` requests that names the
/// launch they belong to. agentctl answers a repeat of such a request (a reconcile that acted on
/// a lagging cache, or a retry after a failed status write) from what the first one got, and
/// sends at most one prompt per launch: the agent sees each launch's restore once.
pub const LAUNCH_META: &str = "kandev.dev/launch";

/// Key in the `_meta` of a `session/prompt` request with the client's id of that prompt:
/// agentctl journals it with `prompt_started` (before the agent gets the prompt) and drops the
/// key, so that a client whose connection broke can tell whether the agent received it.
/// `kubectl kandev prompt` sets it.
pub const PROMPT_ID_META: &str = "kandev.dev/prompt-id";

/// Key in the `_meta` of `session/load|resume` requests with the session's saved mode, model
/// and config options (ExecutorRunning `status.sessionConfig`): agentctl sets back what the
/// restored session reports differently, then drops the key (the agent never sees it).
pub const SESSION_CONFIG_META: &str = "kandev.dev/session-config";

/// Everything that can go wrong in this layer.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    /// A call reached the wire and failed there; `failure` is what the restore rules classify.
    #[error("{method} {}", failure.describe(None))]
    Call {
        method: &'static str,
        failure: CallFailure,
    },
    /// Our own request could not be encoded (a bug, not an agent problem).
    #[error("cannot encode {method} request: {source}")]
    Encode {
        method: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot exec `agentctl connect` in pod {pod}: {source}")]
    Exec {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("exec into pod {pod} gave no stdin/stdout stream")]
    ExecStreams { pod: String },
    #[error("no agent command given")]
    EmptyCommand,
    #[error("cannot start agent {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid working directory {path:?}: {source}")]
    WorkingDirectory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AcpError {
    /// The wire failure, when this error is one.
    pub fn failure(&self) -> Option<&CallFailure> {
        match self {
            Self::Call { failure, .. } => Some(failure),
            _ => None,
        }
    }

    /// This error as something the restore rules can classify. Errors that never reached the
    /// agent count as inconclusive (malformed), so they keep the token.
    pub fn into_failure(self) -> CallFailure {
        match self {
            Self::Call { failure, .. } => failure,
            other => CallFailure::MalformedResponse(other.to_string()),
        }
    }
}
