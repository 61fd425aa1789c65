//! How a JSON-RPC call can fail, and the bounds an agent connection can break.

use std::time::Duration;

/// A bound of an agent connection that the agent broke. The agent is cut off; nothing about the
/// session is learned, so the token is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentLimit {
    /// It wrote a line longer than `limit` bytes.
    Line { limit: usize },
    /// It wrote more than `limit` bytes while one `session/load` replayed.
    Replay { limit: u64 },
    /// It left `limit` messages to it unread: it does not read its input.
    Input { limit: usize },
    /// It wrote a line that would cost about `cost` bytes to parse, more than `bound` (dense
    /// JSON: many tiny values or deep nesting; see `jsonrpc::cost`).
    ParseCost { cost: usize, bound: usize },
}

impl std::fmt::Display for AgentLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Line { limit } => write!(f, "agent exceeded the line limit ({limit} bytes)"),
            Self::Replay { limit } => {
                write!(f, "agent exceeded the replay budget ({limit} bytes)")
            }
            Self::Input { limit } => write!(
                f,
                "agent does not read its input ({limit} messages to it queued)"
            ),
            Self::ParseCost { cost, bound } => write!(
                f,
                "agent wrote a line too dense to parse (about {} once parsed, bound {}: three times the line limit)",
                super::cost::in_mib(*cost),
                super::cost::in_mib(*bound)
            ),
        }
    }
}

/// How a JSON-RPC call to an agent failed, as the caller saw it (the ACP client's calls over
/// stdio, agentctl's socket or an exec stream). What a failure *means* for a saved token is
/// decided in `resume::classify`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallFailure {
    /// The agent answered with a JSON-RPC error.
    JsonRpc { code: i64, message: String },
    /// The stdio / exec stream closed before an answer arrived.
    TransportClosed,
    /// No answer within the deadline.
    Timeout,
    /// An answer arrived but could not be understood.
    MalformedResponse(String),
    /// The agent broke a bound of the connection and was cut off.
    AgentLimit(AgentLimit),
}

impl CallFailure {
    /// One line about the failure, after the name of the call, worded for Events and `agentctl
    /// restore` output; `limit` is the deadline a timeout missed, when known.
    pub fn describe(&self, limit: Option<Duration>) -> String {
        match self {
            Self::JsonRpc { code, message } => format!("answered JSON-RPC error {code}: {message}"),
            Self::TransportClosed => "failed: the agent's stream closed".to_owned(),
            Self::Timeout => match limit {
                Some(limit) => format!("got no answer within {limit:?}"),
                None => "got no answer in time".to_owned(),
            },
            Self::MalformedResponse(detail) => format!("gave a malformed answer: {detail}"),
            Self::AgentLimit(limit) => format!("was cut off: {limit}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn agent_limits_name_the_bound() {
        #[rustfmt::skip]
        let rows = [
            (AgentLimit::Line { limit: 1_048_576 }, "agent exceeded the line limit (1048576 bytes)"),
            (AgentLimit::Replay { limit: 268_435_456 }, "agent exceeded the replay budget (268435456 bytes)"),
            (AgentLimit::Input { limit: 1024 }, "agent does not read its input (1024 messages to it queued)"),
        ];
        for (limit, text) in rows {
            assert_eq!(limit.to_string(), text);
        }
    }
}
