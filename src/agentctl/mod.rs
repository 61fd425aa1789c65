//! `agentctl`, the in-pod supervisor (DESIGN §4): the container's main process.
//!
//! `agentctl serve` starts the coding agent in ACP mode and holds its stdio for the pod's
//! lifetime, so the agent outlives any single client: the operator's `kubectl exec` stream
//! (`agentctl connect`) can drop and come back, the operator itself can restart, and the agent
//! keeps its in-memory session. Clients reach the agent through a unix socket:
//!
//! * every connection starts with one hello line, `{"mode":"acp"}`, `{"mode":"events"}` or
//!   `{"mode":"answer",…}`;
//! * **acp** connections are a JSON-RPC 2.0 bridge to the agent, **one client at a time**
//!   (a second one gets a `-32001` "busy" error line and is closed); `initialize` is answered
//!   from the response cached when serve started, request ids are rewritten so they never
//!   collide across clients, and `{"jsonrpc":"2.0","method":"_kandev/disconnect"}` (or closing
//!   the socket) ends the connection while the agent keeps running;
//! * **events** connections receive one JSON object per line ([`events::Event`]): first a `snapshot` of the
//!   current state, then `session_created`, `prompt_started`, `prompt_finished`,
//!   `agent_exited` (and the permission events) as they happen, each with a `timestamp`;
//! * **answer** connections carry one person's answer to a permission request the session's
//!   policy holds (`agentctl answer`), get one result line and are closed.
//!
//! serve also records the session history for resume-context injection (DESIGN §3) and exits
//! non-zero when the agent exits, so the pod dies and the operator sees a lost pod.
//!
//! Layout (JSON-RPC framing and messages are [`crate::jsonrpc`]'s): [`hub`] (the synchronous bridge state
//! machine: id rewriting, caching, events, what to record), [`events`] (the events format, shared
//! with the operator's follower), [`journal`] (the event journal), [`serve`] (processes, sockets,
//! history I/O around the hub), [`client`] (`connect`, `events` and `answer`), [`launch`] (which argv
//! to start), [`socket`] (socket paths and the hello line), [`seal`] (the repository credentials kept from the
//! agent), [`time`] (timestamps), [`history`]
//! (`agentctl history`: the recorded history file, printed), [`cli`] (the command line).

pub mod checkout;
pub mod cli;
pub mod client;
pub mod gitfiles;
/// The event journal's line format, part of the pod contract.
pub use crate::api::pod_contract::events;
pub mod history;
pub mod hub;
pub mod journal;
pub mod launch;
pub mod seal;
pub mod serve;
pub mod socket;
pub mod time;

use std::path::PathBuf;

pub use cli::{Cli, run_cli};

/// Why an agentctl command failed. Every variant's message is written for the person reading
/// `kubectl logs` or the stderr of `kubectl exec … agentctl connect`.
#[derive(Debug, thiserror::Error)]
pub enum AgentctlError {
    #[error(
        "socket path {path} is {len} bytes long; unix socket paths must be shorter than 108 \
         bytes. Pass a shorter --socket (or set KANDEV_AGENTCTL_SOCKET), e.g. /tmp/agentctl.sock"
    )]
    SocketPathTooLong { path: PathBuf, len: usize },
    #[error(
        "no agentctl socket given: pass --socket, set KANDEV_AGENTCTL_SOCKET, or pass \
         --workspace (KANDEV_WORKSPACE) to use <workspace>/.kandev/agentctl.sock"
    )]
    NoSocket,
    #[error("another agentctl is already serving on {path}; refusing to start a second agent")]
    AlreadyServing { path: PathBuf },
    #[error("{path} exists and is not a unix socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no agentctl is serving on {path} (the socket does not exist): is `agentctl serve` \
         running in this pod?"
    )]
    SocketMissing { path: PathBuf },
    #[error(
        "agentctl on {path} refused the connection (stale socket: `agentctl serve` is not \
         running)"
    )]
    SocketRefused { path: PathBuf },
    #[error("cannot connect to agentctl on {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "agentctl on {path} is busy: another ACP client is connected (only one at a time; \
         retry later, or use --takeover to replace it)"
    )]
    Busy { path: PathBuf },
    #[error(
        "agentctl on {path} sent nothing for {seconds} s (not even a heartbeat): `agentctl \
         serve` does not answer"
    )]
    Silent { path: PathBuf, seconds: u64 },
    #[error(transparent)]
    Profiles(#[from] crate::agents::AgentRegistryError),
    #[error("unknown agent profile {name:?}; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
    #[error("invalid --session-name: {0}")]
    InvalidSessionName(#[source] crate::history::HistoryError),
    #[error(
        "no session name: pass --session-name NAME (or set KANDEV_SESSION_NAME, as agentctl \
         pods do), or --file PATH"
    )]
    NoSessionName,
    #[error(
        "no recorded history{} at {}: the agent has not been prompted yet (or the workspace is \
         another one)",
        session.as_ref().map(|s| format!(" for session {s:?}")).unwrap_or_default(),
        path.display()
    )]
    NoHistory {
        session: Option<String>,
        path: PathBuf,
    },
    #[error("--permissions is not a permission policy: {0}")]
    InvalidPermissions(String),
    #[error("permission answer refused: {0}")]
    AnswerRefused(String),
    #[error("no agent command: pass --profile NAME or the command after `--`")]
    NoCommand,
    #[error("cannot start the agent `{program}`: {source}")]
    SpawnAgent {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent rejected `initialize` (code {code}): {message}")]
    InitializeFailed { code: i64, message: String },
    #[error("the agent did not answer `initialize` within {seconds} s")]
    InitializeTimeout { seconds: u64 },
    #[error("the agent exited ({status}); agentctl exits too so the pod is seen as lost")]
    AgentExited { status: String },
    #[error(
        "the agent was cut off: {limit}; agentctl exits too so the pod is seen as lost \
         (a session/load may use --replay-line-limit-mib)"
    )]
    AgentCutOff { limit: crate::jsonrpc::AgentLimit },
    #[error("{what} sent a line longer than {limit} bytes; connection closed")]
    LineTooLong { what: &'static str, limit: usize },
    #[error(
        "{what} sent a line too dense to parse (about {} once parsed, bound {}); connection closed",
        crate::jsonrpc::cost::in_mib(*.cost),
        crate::jsonrpc::cost::in_mib(*.bound)
    )]
    LineTooDense {
        what: &'static str,
        cost: usize,
        bound: usize,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Restore(String),
    /// The workspace could not be prepared from the repository (the message is scrubbed of
    /// credentials).
    #[error("{reason}: {message}")]
    Checkout {
        reason: checkout::CheckoutReason,
        message: String,
    },
}

impl AgentctlError {
    /// Wraps an I/O error with what agentctl was doing at the time.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}
