//! The events format (DESIGN §3 "Event journal"): the lines agentctl sends `events` subscribers
//! and keeps in its journal, and that the operator's follower reads. One type, [`Event`], for
//! the writer and the reader, so the two cannot drift apart.
//!
//! A line is one JSON object: `"event"` names the kind (snake_case), the kind's fields follow
//! (camelCase), then the `"timestamp"` of the moment serve wrote it, then the fields an event
//! carries only sometimes (`lastMessageId`, `signal`). Journal entries add `"seq"`, `"launch"`
//! and `"pod"` (agentctl's `journal.rs`), the snapshot a subscriber starts with adds `"seq"`. This is
//! the order agentctl has always written, kept byte for byte: journals written by an older
//! agentctl are read by this one, and the other way round.
//!
//! Reading is lenient where it has always been: unknown fields are ignored, an unknown kind (a
//! newer agentctl's) is [`Event::Other`], and a line that does not parse is skipped by the
//! reader.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api::{PendingPermission, PermissionOutcome, SessionConfigState, ToolKind};

/// One event. The hub emits it, serve stamps and journals it ([`Event::to_json`]), the follower
/// reads it back ([`EventLine`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "event",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum Event {
    /// The current state, sent first to each new subscriber only, so an operator that
    /// (re)attaches late catches up without a replay of old events.
    Snapshot {
        /// The session of the last successful session/new, load or resume.
        session_id: Option<String>,
        /// A `session/prompt` is in flight (even one whose client has gone).
        #[serde(default)]
        prompt_active: bool,
        /// The `messageId` of the last message the agent streamed in that session, when it
        /// sends message ids.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_message_id: Option<String>,
        /// The permission requests that wait for a person's answer, oldest first.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pending_permissions: Vec<PendingPermission>,
    },
    /// A successful `session/new`, `session/load` or `session/resume`.
    SessionCreated { session_id: String, method: String },
    /// The session's mode, model and config options changed (a session setup answer, a
    /// `session/update`, or a value set back after a restore).
    SessionConfig {
        session_id: String,
        config: SessionConfigState,
    },
    /// Setting a saved value back after a restore failed (best effort: the restore stands).
    ConfigSetBackFailed {
        session_id: String,
        method: String,
        error: AgentError,
    },
    /// The agent asked for a permission that the policy holds for a person's answer (`ask`).
    PermissionRequested {
        session_id: String,
        request: PendingPermission,
    },
    /// A permission request got its answer: from the policy, a person, a client that decides,
    /// the `askTimeout`, or none because the agent went.
    PermissionResolved {
        session_id: String,
        request_id: String,
        tool_kind: ToolKind,
        outcome: PermissionOutcome,
        /// The option chosen (none: the request was cancelled, or went with the agent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        option_id: Option<String>,
        /// Why, in words (the rule, the person's answer, what was missing).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
    /// agentctl stopped its agent after it was idle (no prompt, no client) this long, and ends.
    Suspended { idle_seconds: u64 },
    PromptStarted {
        session_id: String,
        /// The client's id of the prompt ([`crate::acp::PROMPT_ID_META`]), when it gave one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_id: Option<String>,
    },
    PromptFinished {
        session_id: String,
        #[serde(flatten)]
        outcome: PromptOutcome,
        /// The `messageId` of the last message chunk of the session so far (its answer, for an
        /// agent that sends message ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_message_id: Option<String>,
    },
    AgentExited {
        code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// serve is alive: sent every few seconds to live subscribers, never journaled.
    Heartbeat,
    /// The journal no longer holds every entry after the subscriber's cursor `since`: what
    /// follows the replay's snapshot is the state to rely on. Written without a timestamp.
    JournalGap { since: u64 },
    /// A kind this version does not know (from a newer agentctl): read, and ignored.
    #[serde(other, skip_serializing)]
    Other,
}

/// How a prompt turn ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptOutcome {
    /// The agent answered with this `stopReason` (`end_turn`, `cancelled`, …).
    Stopped {
        #[serde(rename = "stopReason")]
        stop_reason: Value,
    },
    /// The agent answered `session/prompt` with a JSON-RPC error.
    Failed { error: AgentError },
}

/// The JSON-RPC error the agent answered with, as an event reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentError {
    pub code: i64,
    pub message: String,
}

/// The keys an event carries only sometimes: written after the timestamp, where agentctl has
/// always written them. (Key order is insertion order because serde_json's `preserve_order` is
/// on, through agent-client-protocol; the round-trip test fails if that ever changes.)
const AFTER_TIMESTAMP: [&str; 2] = ["lastMessageId", "signal"];

impl Event {
    /// The event as its JSON line object (without the newline), stamped with `timestamp`.
    pub fn to_json(&self, timestamp: &str) -> Value {
        let mut object = self.object();
        let later: Vec<(String, Value)> = AFTER_TIMESTAMP
            .iter()
            .filter_map(|key| object.shift_remove_entry(*key))
            .collect();
        object.insert("timestamp".into(), Value::String(timestamp.to_owned()));
        object.extend(later);
        Value::Object(object)
    }

    /// The event as its JSON line object without a timestamp (how `journal_gap` is written).
    pub fn to_json_unstamped(&self) -> Value {
        Value::Object(self.object())
    }

    fn object(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(object)) => object,
            // Only `Other`, which agentctl never writes, has no object.
            _ => Map::new(),
        }
    }
}

/// One line as read (`agentctl events`, a journal entry): its journal sequence number (none on
/// lines from an agentctl without a journal, and on heartbeats) and the event. The timestamp,
/// launch and pod are not read.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct EventLine {
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(flatten)]
    pub event: Event,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ConfigOptionValue;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// Every kind, as agentctl has always written it (timestamp `T`), and what it reads as.
    #[test]
    fn every_event_round_trips_byte_for_byte() {
        let config = SessionConfigState {
            mode: Some("plan".into()),
            model: None,
            config_options: vec![ConfigOptionValue {
                id: "effort".into(),
                value: "high".into(),
            }],
        };
        #[rustfmt::skip]
        let rows = [
            (
                r#"{"event":"snapshot","sessionId":null,"promptActive":false,"timestamp":"T"}"#,
                Event::Snapshot { session_id: None, prompt_active: false, last_message_id: None, pending_permissions: vec![] },
            ),
            (
                r#"{"event":"snapshot","sessionId":"s","promptActive":true,"timestamp":"T","lastMessageId":"m-2"}"#,
                Event::Snapshot { session_id: Some("s".into()), prompt_active: true, last_message_id: Some("m-2".into()), pending_permissions: vec![] },
            ),
            (
                r#"{"event":"session_created","sessionId":"s1","method":"session/new","timestamp":"T"}"#,
                Event::SessionCreated { session_id: "s1".into(), method: "session/new".into() },
            ),
            (
                r#"{"event":"session_config","sessionId":"s1","config":{"mode":"plan","configOptions":[{"id":"effort","value":"high"}]},"timestamp":"T"}"#,
                Event::SessionConfig { session_id: "s1".into(), config },
            ),
            (
                r#"{"event":"config_set_back_failed","sessionId":"s1","method":"session/set_mode","error":{"code":-32603,"message":"no"},"timestamp":"T"}"#,
                Event::ConfigSetBackFailed {
                    session_id: "s1".into(),
                    method: "session/set_mode".into(),
                    error: AgentError { code: -32603, message: "no".into() },
                },
            ),
            (
                r#"{"event":"prompt_started","sessionId":"s1","timestamp":"T"}"#,
                Event::PromptStarted { session_id: "s1".into(), prompt_id: None },
            ),
            (
                r#"{"event":"prompt_finished","sessionId":"s","stopReason":"end_turn","timestamp":"T","lastMessageId":"m-4"}"#,
                Event::PromptFinished {
                    session_id: "s".into(),
                    outcome: PromptOutcome::Stopped { stop_reason: json!("end_turn") },
                    last_message_id: Some("m-4".into()),
                },
            ),
            // An answer without a stopReason.
            (
                r#"{"event":"prompt_finished","sessionId":"s","stopReason":null,"timestamp":"T"}"#,
                Event::PromptFinished {
                    session_id: "s".into(),
                    outcome: PromptOutcome::Stopped { stop_reason: Value::Null },
                    last_message_id: None,
                },
            ),
            (
                r#"{"event":"prompt_finished","sessionId":"s","error":{"code":-32000,"message":"auth required"},"timestamp":"T"}"#,
                Event::PromptFinished {
                    session_id: "s".into(),
                    outcome: PromptOutcome::Failed { error: AgentError { code: -32000, message: "auth required".into() } },
                    last_message_id: None,
                },
            ),
            (
                r#"{"event":"agent_exited","code":1,"timestamp":"T"}"#,
                Event::AgentExited { code: Some(1), signal: None },
            ),
            (
                r#"{"event":"agent_exited","code":null,"timestamp":"T","signal":9}"#,
                Event::AgentExited { code: None, signal: Some(9) },
            ),
            (r#"{"event":"heartbeat","timestamp":"T"}"#, Event::Heartbeat),
        ];
        for (text, event) in rows {
            assert_eq!(event.to_json("T").to_string(), text);
            let read: EventLine = serde_json::from_str(text).expect(text);
            assert_eq!(read, EventLine { seq: None, event }, "{text}");
        }
        let gap = r#"{"event":"journal_gap","since":5}"#;
        assert_eq!(
            Event::JournalGap { since: 5 }
                .to_json_unstamped()
                .to_string(),
            gap
        );
        assert_eq!(
            serde_json::from_str::<EventLine>(gap).expect("gap").event,
            Event::JournalGap { since: 5 }
        );
    }

    #[test]
    fn unknown_fields_are_ignored_and_unknown_kinds_are_other() {
        #[rustfmt::skip]
        let rows = [
            // A journal entry: its seq is read, launch and pod are not.
            (
                r#"{"event":"prompt_started","sessionId":"s1","timestamp":"T","seq":6,"launch":"r1","pod":"p-1"}"#,
                Some(EventLine { seq: Some(6), event: Event::PromptStarted { session_id: "s1".into(), prompt_id: None } }),
            ),
            (
                r#"{"event":"session_created","sessionId":"s1","method":"session/load","somethingNew":{"a":1}}"#,
                Some(EventLine { seq: None, event: Event::SessionCreated { session_id: "s1".into(), method: "session/load".into() } }),
            ),
            (
                r#"{"event":"snapshot","sessionId":"s1","seq":3}"#,
                Some(EventLine { seq: Some(3), event: Event::Snapshot { session_id: Some("s1".into()), prompt_active: false, last_message_id: None, pending_permissions: vec![] } }),
            ),
            (
                r#"{"event":"something_new","sessionId":"s1","seq":7}"#,
                Some(EventLine { seq: Some(7), event: Event::Other }),
            ),
            (r#"{"event":"something_new"}"#, Some(EventLine { seq: None, event: Event::Other })),
            // Not an event line: the reader skips it.
            (r#"{"seq":7}"#, None),
            (r#"{"event":"prompt_started","seq":7}"#, None),
            ("not json", None),
        ];
        for (text, expected) in rows {
            assert_eq!(
                serde_json::from_str::<EventLine>(text).ok(),
                expected,
                "{text}"
            );
        }
    }
}
