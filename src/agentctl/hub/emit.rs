//! The events the hub emits for `events` subscribers (in the format of [`crate::agentctl::events`]):
//! the snapshot a new subscriber starts from, a session set up, a prompt turn's end. The others
//! are one-liners where they happen (`prompt_started` when a prompt is forwarded,
//! `agent_exited`) or belong to the session's configuration ([`super::config`]).

use serde_json::Value;

use super::{Hub, Output};
use crate::agentctl::events::{AgentError, Event, PromptOutcome};
use crate::jsonrpc::{self, method};

impl Hub {
    /// The state a new events subscriber starts from.
    pub fn snapshot(&self) -> Event {
        Event::Snapshot {
            session_id: self.current_session.clone(),
            prompt_active: self
                .pending
                .values()
                .any(|pending| pending.method == method::SESSION_PROMPT),
            last_message_id: self
                .current_session
                .as_deref()
                .and_then(|session| self.last_message_id(session)),
            pending_permissions: self.held_permissions(),
        }
    }

    /// The `messageId` of the last message chunk the agent sent for `session_id`.
    pub fn last_message_id(&self, session_id: &str) -> Option<String> {
        self.sessions
            .get(session_id)
            .and_then(|recording| recording.last_message_id.clone())
    }

    /// A session setup succeeded: from now on it is the session of the snapshot.
    pub(super) fn session_created(&mut self, session_id: &str, method: &str) -> Output {
        self.current_session = Some(session_id.to_owned());
        Output::Event(Event::SessionCreated {
            session_id: session_id.to_owned(),
            method: method.to_owned(),
        })
    }

    /// The end of a prompt turn, as the agent answered `session/prompt`.
    pub(super) fn prompt_finished(
        &self,
        session_id: &str,
        result: Option<&Value>,
        error: Option<&Value>,
    ) -> Output {
        let outcome = match (result, error) {
            (Some(result), _) => PromptOutcome::Stopped {
                stop_reason: result.get("stopReason").cloned().unwrap_or(Value::Null),
            },
            (None, error) => {
                let (code, message) = jsonrpc::error_parts(error);
                PromptOutcome::Failed {
                    error: AgentError { code, message },
                }
            }
        };
        Output::Event(Event::PromptFinished {
            session_id: session_id.to_owned(),
            outcome,
            last_message_id: self.last_message_id(session_id),
        })
    }
}
