//! History recording (DESIGN §3): what the hub appends to a session's history as the agent
//! streams it, whether or not a client is connected. The user's prompt is recorded by the
//! routing when it forwards a `session/prompt`; here are the agent's side of a turn (its text,
//! bounded, written as one message when the turn ends or a tool is called) and its tool calls
//! with their results. Updates the agent replays during a `session/load` are history already
//! and are skipped.

use std::collections::HashMap;

use serde_json::Value;

use super::{Hub, Output, str_field};
use crate::history::{HistoryEntry, TRUNCATION_MARKER};

/// Agent text of one turn kept for the history, at most (bytes); the rest is dropped with
/// [`TRUNCATION_MARKER`] (the resume context keeps 2000 characters of a message anyway).
pub const RECORDED_TURN_TEXT: usize = 1024 * 1024;

/// What the hub keeps of one session for its history.
#[derive(Default)]
pub(super) struct SessionRecording {
    /// Agent text of the current turn not yet written.
    agent_text: String,
    /// Open `session/load` requests: their replayed updates are history already.
    pub(super) loading: u32,
    /// The `messageId` of the last message chunk the agent sent for this session (replayed
    /// ones included: after a `session/load` it is the transcript's last message).
    pub(super) last_message_id: Option<String>,
    tools: HashMap<String, ToolRecord>,
}

struct ToolRecord {
    name: String,
    result_recorded: bool,
}

impl Hub {
    pub(super) fn history_session(&self, session_id: &str) -> String {
        self.config
            .session_name
            .clone()
            .unwrap_or_else(|| session_id.to_owned())
    }

    /// What a `session/update` changes: the session's configuration ([`Hub::config_updated`]),
    /// its last message id, and the history. Updates of a session being loaded are the agent
    /// replaying its transcript: already recorded, so skipped (no duplicates).
    pub(super) fn record_update(&mut self, params: &Value) -> Vec<Output> {
        let (Some(session_id), Some(update)) = (
            params.get("sessionId").and_then(Value::as_str),
            params.get("update"),
        ) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        out.extend(self.config_updated(session_id, update));
        let history_session = self.history_session(session_id);
        let kind = update.get("sessionUpdate").and_then(Value::as_str);
        // ACP content chunks (user, agent, thought) carry the id of the message they belong to.
        if let Some(message_id) = update
            .get("messageId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
        {
            self.sessions
                .entry(session_id.to_owned())
                .or_default()
                .last_message_id = Some(message_id.to_owned());
        }
        if self
            .sessions
            .get(session_id)
            .is_some_and(|recording| recording.loading > 0)
        {
            return out;
        }
        match kind {
            Some("agent_message_chunk") => {
                if update.pointer("/content/type").and_then(Value::as_str) == Some("text")
                    && let Some(text) = update.pointer("/content/text").and_then(Value::as_str)
                {
                    let recording = self.sessions.entry(session_id.to_owned()).or_default();
                    push_bounded(&mut recording.agent_text, text, RECORDED_TURN_TEXT);
                }
            }
            Some("tool_call") => {
                // Keep the order the user saw: what the agent said, then the tool it called.
                out.extend(self.flush_agent_text(session_id));
                out.extend(self.record_tool_call(session_id, update, &history_session));
            }
            Some("tool_call_update") => {
                let tool_call_id = str_field(update, "toolCallId").unwrap_or_default();
                let recording = self.sessions.entry(session_id.to_owned()).or_default();
                let tool = recording
                    .tools
                    .entry(tool_call_id.to_owned())
                    .or_insert_with(|| ToolRecord {
                        name: "tool".into(),
                        result_recorded: false,
                    });
                if let Some(title) = str_field(update, "title") {
                    tool.name = title.to_owned();
                }
                out.extend(record_tool_result(
                    recording,
                    tool_call_id,
                    update,
                    &history_session,
                ));
            }
            _ => {}
        }
        out
    }

    /// A `tool_call`: its entry (named by its title, else its kind), and its result when the
    /// call came with one.
    fn record_tool_call(
        &mut self,
        session_id: &str,
        update: &Value,
        history_session: &str,
    ) -> Vec<Output> {
        let tool_call_id = str_field(update, "toolCallId").unwrap_or_default();
        let name = str_field(update, "title")
            .or_else(|| str_field(update, "kind"))
            .unwrap_or("tool")
            .to_owned();
        let mut out = vec![Output::Record {
            history_session: history_session.to_owned(),
            entry: HistoryEntry::ToolCall {
                name: name.clone(),
                input: update.get("rawInput").cloned().unwrap_or(Value::Null),
                timestamp: None,
            },
        }];
        let recording = self.sessions.entry(session_id.to_owned()).or_default();
        recording.tools.insert(
            tool_call_id.to_owned(),
            ToolRecord {
                name,
                result_recorded: false,
            },
        );
        out.extend(record_tool_result(
            recording,
            tool_call_id,
            update,
            history_session,
        ));
        out
    }

    /// Writes the turn's pending agent text, if any, as one `agent_message`.
    pub(super) fn flush_agent_text(&mut self, session_id: &str) -> Option<Output> {
        let text = std::mem::take(&mut self.sessions.get_mut(session_id)?.agent_text);
        if text.trim().is_empty() {
            return None;
        }
        Some(Output::Record {
            history_session: self.history_session(session_id),
            entry: HistoryEntry::AgentMessage {
                text,
                timestamp: None,
            },
        })
    }
}

/// Appends `text` to `buf` up to `limit` bytes (on a char boundary); the first time something is
/// dropped, [`TRUNCATION_MARKER`] is appended instead (so `buf` ends up at most a marker longer).
pub(super) fn push_bounded(buf: &mut String, text: &str, limit: usize) {
    if buf.ends_with(TRUNCATION_MARKER) && buf.len() >= limit {
        return;
    }
    let room = limit.saturating_sub(buf.len());
    if text.len() <= room {
        buf.push_str(text);
        return;
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    buf.push_str(&text[..end]);
    buf.push_str(TRUNCATION_MARKER);
}

/// A `tool_result` once the tool call reached a final status (`completed`, or `failed` marked
/// as such), at most once per tool call.
fn record_tool_result(
    recording: &mut SessionRecording,
    tool_call_id: &str,
    update: &Value,
    history_session: &str,
) -> Option<Output> {
    let status = str_field(update, "status")?;
    if status != "completed" && status != "failed" {
        return None;
    }
    let tool = recording.tools.get_mut(tool_call_id)?;
    if tool.result_recorded {
        return None;
    }
    tool.result_recorded = true;
    let mut output = tool_output(update);
    if status == "failed" {
        output.insert_str(0, "[failed] ");
    }
    Some(Output::Record {
        history_session: history_session.to_owned(),
        entry: HistoryEntry::ToolResult {
            name: tool.name.clone(),
            output,
            timestamp: None,
        },
    })
}

/// The readable result of a tool call: the text of its `content` (what the user saw), else its
/// `rawOutput`.
fn tool_output(update: &Value) -> String {
    let texts: Vec<String> = update
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| match str_field(item, "type") {
                    Some("content") => item
                        .pointer("/content/text")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    Some("diff") => str_field(item, "path").map(|path| format!("diff of {path}")),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if !texts.is_empty() {
        return texts.join("\n");
    }
    match update.get("rawOutput") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}
