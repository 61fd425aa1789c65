//! JSON-RPC 2.0 as the crate speaks it: one JSON message per line, in both directions.
//!
//! One home for the wire, shared by the ACP client (`acp`), agentctl (`agentctl`) and the
//! operator's event follower (`controller::follower`), so none of them depends on another just
//! for framing:
//! - [`codec`]: the bounded line reader (no peer makes us buffer more than one limited line);
//! - [`Message`] / [`parse_line`]: a line classified as request, notification or response, or
//!   the error answer the spec prescribes; builders of the messages we write, and [`encode_line`];
//! - [`code`]: every error code we send or interpret; [`method`]: every method name;
//! - [`CallFailure`]: how a call can fail, and [`AgentLimit`], the bounds an agent can break.

pub mod codec;
pub mod cost;
mod failure;
mod message;

pub use codec::{Frame, LINE_LIMIT, LineReader};
pub use failure::{AgentLimit, CallFailure};
pub use message::{
    Invalid, Message, encode_line, error_message, error_parts, id_key, is_disconnect,
    notification_message, parse_line, request_message, result_message,
};

pub const JSONRPC_VERSION: &str = "2.0";

/// Error codes: JSON-RPC 2.0's, ACP's and our own (in the server-error range).
pub mod code {
    /// JSON-RPC 2.0: invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON-RPC 2.0: the JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// JSON-RPC 2.0: the method does not exist / is not available.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// JSON-RPC 2.0: invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// JSON-RPC 2.0: internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// ACP: authentication required.
    pub const AUTH_REQUIRED: i64 = -32000;
    /// ACP: resource (here: the session) not found.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// ACP / LSP convention: request cancelled.
    pub const REQUEST_CANCELLED: i64 = -32800;
    /// agentctl: another ACP client is connected.
    pub const BUSY: i64 = -32001;
    /// agentctl: it cut the agent off for breaking a bound of the connection
    /// ([`super::AgentLimit`]); the message names the bound.
    pub const AGENT_PROTOCOL_LIMIT: i64 = -32090;
}

/// Method names: the ACP methods we call, serve or watch, and our own extension.
pub mod method {
    pub const INITIALIZE: &str = "initialize";
    pub const SESSION_NEW: &str = "session/new";
    pub const SESSION_LOAD: &str = "session/load";
    pub const SESSION_RESUME: &str = "session/resume";
    pub const SESSION_PROMPT: &str = "session/prompt";
    pub const SESSION_CANCEL: &str = "session/cancel";
    pub const SESSION_UPDATE: &str = "session/update";
    pub const SESSION_SET_MODE: &str = "session/set_mode";
    pub const SESSION_SET_MODEL: &str = "session/set_model";
    pub const SESSION_SET_CONFIG_OPTION: &str = "session/set_config_option";
    /// The agent asks the user for permission.
    pub const SESSION_REQUEST_PERMISSION: &str = "session/request_permission";
    /// Our extension notification that ends one client's connection through `agentctl
    /// connect` while the agent keeps running (kwok never delivers stdin EOF to an exec'd
    /// process).
    pub const DISCONNECT: &str = "_kandev/disconnect";
}
