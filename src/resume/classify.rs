//! Classification of a failed ACP restore (DESIGN §3 "ACP restore selection").
//!
//! Real agents disagree on the error for an unknown session (-32002, -32603, -32602 and even
//! success are all seen), so this is the single place that decides what a failure *means*.
//! Only two classes are conclusive enough to give up on the saved token: an explicit
//! method-not-found and an explicit resource-not-found. Everything else keeps the token.

use crate::jsonrpc::CallFailure;
use crate::jsonrpc::code::{
    AGENT_PROTOCOL_LIMIT, AUTH_REQUIRED, INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND,
    REQUEST_CANCELLED, RESOURCE_NOT_FOUND,
};

/// What a [`CallFailure`] means for the saved resume token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestoreErrorClass {
    /// -32601: the agent explicitly does not support the method.
    MethodNotFound,
    /// -32002: the agent explicitly does not know the session.
    UnknownSession,
    /// -32000: the agent needs credentials; the session may well be fine.
    AuthRequired,
    /// -32800: the request was cancelled.
    Cancelled,
    /// -32602: inconclusive; some agents use it for an unknown session, others for a real
    /// parameter problem.
    InvalidParams,
    /// -32603: inconclusive; e.g. claude-agent-acp answers it for an id it cannot parse.
    Internal,
    /// The stream closed.
    Transport,
    /// No answer in time.
    Timeout,
    /// The answer could not be parsed.
    Malformed,
    /// The agent broke a bound of the connection (a line, the replay budget, an unread input
    /// queue), here or in agentctl ([`AGENT_PROTOCOL_LIMIT`]), and was cut off.
    AgentProtocolLimit,
    /// Any other JSON-RPC code.
    Other(i64),
}

impl RestoreErrorClass {
    /// Whether this failure proves the token is useless, so falling back to `session/new` loses
    /// nothing (DESIGN §3: "only an explicitly unsupported method or an explicitly unknown
    /// session may fall back to `session/new`").
    pub fn allows_fresh_start(self) -> bool {
        matches!(self, Self::MethodNotFound | Self::UnknownSession)
    }

    /// Whether the same launch may well succeed later (no answer, a closed stream, missing
    /// credentials, a cancellation): a first launch that fails this way stays resumable instead
    /// of ending FAILED. An agent that answered with an error would answer the same again.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::Timeout | Self::Transport | Self::AuthRequired | Self::Cancelled
        )
    }

    /// Stable, low-cardinality name for condition reasons, Events and metric labels.
    /// `Other` deliberately drops the code so labels stay bounded.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MethodNotFound => "method_not_found",
            Self::UnknownSession => "unknown_session",
            Self::AuthRequired => "auth_required",
            Self::Cancelled => "cancelled",
            Self::InvalidParams => "invalid_params",
            Self::Internal => "internal_error",
            Self::Transport => "transport_closed",
            Self::Timeout => "timeout",
            Self::Malformed => "malformed_response",
            Self::AgentProtocolLimit => "agent_protocol_limit",
            Self::Other(_) => "other",
        }
    }
}

impl std::fmt::Display for RestoreErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(code) => write!(f, "other (JSON-RPC code {code})"),
            class => f.write_str(class.as_str()),
        }
    }
}

/// Maps a failure to its class by code only. The message is deliberately ignored: its wording
/// is not a contract and differs between agents and versions, and guessing "session not found"
/// from prose would risk discarding a good token.
pub fn classify_restore_error(failure: &CallFailure) -> RestoreErrorClass {
    match failure {
        CallFailure::JsonRpc { code, .. } => match *code {
            METHOD_NOT_FOUND => RestoreErrorClass::MethodNotFound,
            RESOURCE_NOT_FOUND => RestoreErrorClass::UnknownSession,
            AUTH_REQUIRED => RestoreErrorClass::AuthRequired,
            REQUEST_CANCELLED => RestoreErrorClass::Cancelled,
            INVALID_PARAMS => RestoreErrorClass::InvalidParams,
            INTERNAL_ERROR => RestoreErrorClass::Internal,
            AGENT_PROTOCOL_LIMIT => RestoreErrorClass::AgentProtocolLimit,
            other => RestoreErrorClass::Other(other),
        },
        CallFailure::TransportClosed => RestoreErrorClass::Transport,
        CallFailure::Timeout => RestoreErrorClass::Timeout,
        CallFailure::MalformedResponse(_) => RestoreErrorClass::Malformed,
        CallFailure::AgentLimit(_) => RestoreErrorClass::AgentProtocolLimit,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn which_failures_a_later_launch_may_overcome() {
        use RestoreErrorClass as C;
        let rows = [
            (C::Timeout, true),
            (C::Transport, true),
            (C::AuthRequired, true),
            (C::Cancelled, true),
            (C::MethodNotFound, false),
            (C::UnknownSession, false),
            (C::InvalidParams, false),
            (C::Internal, false),
            (C::Malformed, false),
            (C::Other(-1), false),
            // An agent that broke a memory bound would break it again.
            (C::AgentProtocolLimit, false),
        ];
        for (class, retryable) in rows {
            assert_eq!(class.is_retryable(), retryable, "{class}");
        }
    }

    use super::*;
    use crate::jsonrpc::AgentLimit;
    use RestoreErrorClass as C;
    use pretty_assertions::assert_eq;

    fn rpc(code: i64, message: &str) -> CallFailure {
        CallFailure::JsonRpc {
            code,
            message: message.to_owned(),
        }
    }

    #[test]
    fn every_code_and_transport_class() {
        // (failure, class, allows_fresh_start, as_str)
        #[rustfmt::skip]
        let rows = [
            // §3 restore selection: an explicitly unsupported method may fall back to session/new.
            (rpc(-32601, "Method not found"), C::MethodNotFound, true, "method_not_found"),
            // §3 restore selection: an explicitly unknown session (-32002) may fall back.
            (rpc(-32002, "Resource not found"), C::UnknownSession, true, "unknown_session"),
            // §3 restore selection: authentication keeps the token.
            (rpc(-32000, "Authentication required"), C::AuthRequired, false, "auth_required"),
            // §3 restore selection: cancellation keeps the token.
            (rpc(-32800, "Request cancelled"), C::Cancelled, false, "cancelled"),
            // §6 agent quirks: -32602 and -32603 are inconclusive; keep the token.
            (rpc(-32602, "Invalid params"), C::InvalidParams, false, "invalid_params"),
            (rpc(-32603, "Internal error"), C::Internal, false, "internal_error"),
            // The message never decides: a bare -32603 saying "session not found" stays inconclusive.
            (rpc(-32603, "Session not found"), C::Internal, false, "internal_error"),
            // Any other code is inconclusive.
            (rpc(-32700, "Parse error"), C::Other(-32700), false, "other"),
            (rpc(-32600, "Invalid request"), C::Other(-32600), false, "other"),
            (rpc(1, "custom"), C::Other(1), false, "other"),
            // §3 restore selection: transport and timeouts keep the token.
            (CallFailure::TransportClosed, C::Transport, false, "transport_closed"),
            (CallFailure::Timeout, C::Timeout, false, "timeout"),
            (CallFailure::MalformedResponse("not json".into()), C::Malformed, false, "malformed_response"),
            // A bound broken by the agent keeps the token, whichever side cut it off.
            (CallFailure::AgentLimit(AgentLimit::Line { limit: 1 << 20 }), C::AgentProtocolLimit, false, "agent_protocol_limit"),
            (CallFailure::AgentLimit(AgentLimit::Replay { limit: 1 << 28 }), C::AgentProtocolLimit, false, "agent_protocol_limit"),
            (CallFailure::AgentLimit(AgentLimit::Input { limit: 1024 }), C::AgentProtocolLimit, false, "agent_protocol_limit"),
            (CallFailure::AgentLimit(AgentLimit::ParseCost { cost: 1 << 30, bound: 3 << 20 }), C::AgentProtocolLimit, false, "agent_protocol_limit"),
            (rpc(-32090, "agentctl cut off the agent: agent exceeded the line limit (1048576 bytes)"), C::AgentProtocolLimit, false, "agent_protocol_limit"),
        ];
        for (failure, class, fresh, name) in rows {
            let got = classify_restore_error(&failure);
            assert_eq!(got, class, "{failure:?}");
            assert_eq!(got.allows_fresh_start(), fresh, "{failure:?}");
            assert_eq!(got.as_str(), name, "{failure:?}");
        }
    }

    #[test]
    fn display_keeps_the_code_of_other() {
        assert_eq!(C::Other(-32099).to_string(), "other (JSON-RPC code -32099)");
        assert_eq!(C::UnknownSession.to_string(), "unknown_session");
    }
}
