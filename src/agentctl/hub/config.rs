//! The session's configuration (mode, model, config options): recorded as the agent reports it
//! (a session setup's answer, a `session/update`) and reported as `session_config` events; after
//! a restore, the saved values the restored session reports differently are set back (the rules
//! are in [`crate::resume`]), and a refused set-back is reported as `config_set_back_failed`.

use serde_json::{Map, Value, json};

use super::{Hub, Output};
use crate::agentctl::events::{AgentError, Event};
use crate::api::SessionConfigState;
use crate::jsonrpc;
use crate::resume::{SetBack, apply_config_update, reported_config, set_back};

impl Hub {
    /// A session setup succeeded: its configuration is recorded, and after a restore the saved
    /// values it reports differently are set back. The set-back requests go to the agent before
    /// the client gets the answer, so they reach the agent before anything the client sends next.
    pub(super) fn session_answered(
        &mut self,
        session_id: &str,
        result: Option<&Value>,
        saved: Option<&SessionConfigState>,
    ) -> Vec<Output> {
        let reported = result.map(reported_config).unwrap_or_default();
        let mut out = Vec::new();
        if reported.state != SessionConfigState::default() {
            out.push(Output::Event(Event::SessionConfig {
                session_id: session_id.to_owned(),
                config: reported.state.clone(),
            }));
        }
        let calls = saved
            .map(|saved| set_back(saved, &reported))
            .unwrap_or_default();
        self.configs.insert(session_id.to_owned(), reported.state);
        for call in calls {
            let agent_id = self.alloc_id();
            tracing::info!(
                session_id,
                method = call.method(),
                "setting a saved value back after the restore"
            );
            out.push(Output::ToAgent(jsonrpc::request_message(
                json!(agent_id),
                call.method(),
                call.params(session_id),
            )));
            self.set_backs
                .insert(agent_id, (session_id.to_owned(), call));
        }
        out
    }

    /// The agent's answer to a set-back: the value is recorded, or the failure reported.
    pub(super) fn set_back_answered(
        &mut self,
        session_id: String,
        call: SetBack,
        raw: &Map<String, Value>,
    ) -> Vec<Output> {
        if raw.get("result").is_some() {
            let config = self.configs.entry(session_id.clone()).or_default();
            call.apply(config);
            return vec![Output::Event(Event::SessionConfig {
                session_id,
                config: config.clone(),
            })];
        }
        let (code, message) = jsonrpc::error_parts(raw.get("error"));
        tracing::warn!(%session_id, method = call.method(), code, %message, "setting a saved value back failed; the restore stands");
        vec![Output::Event(Event::ConfigSetBackFailed {
            session_id,
            method: call.method().to_owned(),
            error: AgentError { code, message },
        })]
    }

    /// A `session/update` that changes the session's configuration is reported.
    pub(super) fn config_updated(&mut self, session_id: &str, update: &Value) -> Option<Output> {
        let config = self.configs.entry(session_id.to_owned()).or_default();
        apply_config_update(config, update).then(|| {
            Output::Event(Event::SessionConfig {
                session_id: session_id.to_owned(),
                config: config.clone(),
            })
        })
    }
}
