//! The result of a restore ([`RestoreOutcome`], defined with the rules), serialized for
//! `agentctl restore`.

use serde::{Deserialize, Serialize};

use crate::api::NegotiatedCapabilities;
use crate::resume::RestoreMethod;
pub use crate::resume::RestoreOutcome;
#[cfg(test)]
use crate::resume::{FreshReason, RestoreErrorClass};

impl RestoreOutcome {
    /// `restored`, `fresh` or `failed`.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Restored { .. } => OutcomeKind::Restored,
            Self::Fresh { .. } => OutcomeKind::Fresh,
            Self::Failed { .. } => OutcomeKind::Failed,
        }
    }

    /// The ACP method that produced this outcome (for `Failed`, the last one tried).
    pub fn method(&self) -> Option<RestoreMethod> {
        match self {
            Self::Restored { method, .. } => Some(*method),
            Self::Fresh { .. } => Some(RestoreMethod::New),
            Self::Failed { method, .. } => *method,
        }
    }

    /// The wire name of [`Self::method`]; `initialize` when the handshake itself failed.
    pub fn method_name(&self) -> &'static str {
        self.method().map_or(
            crate::jsonrpc::method::INITIALIZE,
            RestoreMethod::method_name,
        )
    }

    /// The session id the caller should hold as its resume token afterwards (for `Failed`, the
    /// kept token, if any).
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Self::Restored { session_id, .. } | Self::Fresh { session_id, .. } => Some(session_id),
            Self::Failed { session_id, .. } => session_id.as_deref(),
        }
    }

    /// A stable machine-readable word first: `restored`, the [`FreshReason`], or the
    /// [`RestoreErrorClass`] followed by details.
    pub fn reason(&self) -> String {
        match self {
            Self::Restored { .. } => "restored".to_owned(),
            Self::Fresh { why, .. } => why.as_str().to_owned(),
            Self::Failed { reason, .. } => reason.clone(),
        }
    }

    /// Whether the agent now has a usable session (restored or fresh).
    pub fn succeeded(&self) -> bool {
        !matches!(self, Self::Failed { .. })
    }

    fn wire(&self) -> OutcomeWire {
        OutcomeWire {
            method: self.method_name().to_owned(),
            session_id: self.session_id().map(str::to_owned),
            outcome: self.kind(),
            reason: self.reason(),
        }
    }
}

/// The three ends of a restore, as they appear on the wire.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeKind {
    Restored,
    Fresh,
    Failed,
}

/// `{"method", "sessionId", "outcome", "reason"}`: shared by [`RestoreOutcome`]'s serialization
/// and [`RestoreReport`], so the two can never disagree.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct OutcomeWire {
    method: String,
    session_id: Option<String>,
    outcome: OutcomeKind,
    reason: String,
}

impl Serialize for RestoreOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.wire().serialize(serializer)
    }
}

/// What `agentctl restore` prints (one JSON object) and the operator reads back:
/// `{"method":"session/resume|session/load|session/new","sessionId":"…"|null,
///   "outcome":"restored|fresh|failed","reason":"…","capabilities":{…}}`.
///
/// On failure `method` is the last method tried (`initialize` if the handshake failed) and
/// `sessionId` is the kept token, or null when there is none to keep.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    pub method: String,
    pub session_id: Option<String>,
    pub outcome: OutcomeKind,
    pub reason: String,
    /// What the agent advertised in `initialize` (all false when it never answered).
    pub capabilities: NegotiatedCapabilities,
}

impl RestoreReport {
    pub fn new(outcome: &RestoreOutcome, capabilities: NegotiatedCapabilities) -> Self {
        let OutcomeWire {
            method,
            session_id,
            outcome,
            reason,
        } = outcome.wire();
        Self {
            method,
            session_id,
            outcome,
            reason,
            capabilities,
        }
    }

    /// Restored or fresh: `agentctl restore` exits 0 exactly then.
    pub fn succeeded(&self) -> bool {
        self.outcome != OutcomeKind::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn wire_shapes() {
        let caps = NegotiatedCapabilities {
            protocol_version: Some(1),
            load_session: true,
            session_resume: true,
            agent_name: Some("a".into()),
            agent_version: None,
        };
        let rows = [
            (
                RestoreOutcome::Restored {
                    method: RestoreMethod::Resume,
                    session_id: "s1".into(),
                },
                json!({"method": "session/resume", "sessionId": "s1", "outcome": "restored", "reason": "restored"}),
            ),
            (
                RestoreOutcome::Fresh {
                    session_id: "s2".into(),
                    why: FreshReason::UnknownSession,
                },
                json!({"method": "session/new", "sessionId": "s2", "outcome": "fresh", "reason": "unknown_session"}),
            ),
            (
                RestoreOutcome::Failed {
                    method: Some(RestoreMethod::Load),
                    class: RestoreErrorClass::AuthRequired,
                    token_kept: true,
                    session_id: Some("s1".into()),
                    reason: "auth_required: …".into(),
                },
                json!({"method": "session/load", "sessionId": "s1", "outcome": "failed", "reason": "auth_required: …"}),
            ),
            (
                RestoreOutcome::Failed {
                    method: None,
                    class: RestoreErrorClass::Transport,
                    token_kept: false,
                    session_id: None,
                    reason: "transport_closed: …".into(),
                },
                json!({"method": "initialize", "sessionId": null, "outcome": "failed", "reason": "transport_closed: …"}),
            ),
        ];
        for (outcome, expected) in rows {
            assert_eq!(serde_json::to_value(&outcome).expect("json"), expected);
            let report = RestoreReport::new(&outcome, caps.clone());
            let mut with_caps = expected.clone();
            with_caps["capabilities"] = json!({"protocolVersion": 1, "loadSession": true,
                "sessionResume": true, "agentName": "a"});
            let value = serde_json::to_value(&report).expect("json");
            assert_eq!(value, with_caps);
            let back: RestoreReport = serde_json::from_value(value).expect("parse back");
            assert_eq!(back, report);
            assert_eq!(report.succeeded(), outcome.succeeded());
        }
    }
}
