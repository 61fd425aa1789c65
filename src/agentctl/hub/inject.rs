//! Resume-context injection (DESIGN §3): for a profile with `historyContextInjection`, the first
//! prompt after a fresh `session/new` (set by the routing when the agent answers it; a
//! `session/load` or `session/resume` clears it, since the agent remembers that session itself)
//! is wrapped once in the recorded history. The hub only decides; serve reads the history and
//! calls [`inject_history`] ([`super::Output::InjectHistoryThenSend`]).

use serde_json::{Value, json};

use super::{Hub, str_field};
use crate::history::{ContextLimits, HistoryEntry, wrap_prompt_once};

impl Hub {
    /// Whether this prompt of `session_id` gets the resume context: the first one after a fresh
    /// `session/new`, for a profile with history injection. Asking consumes it.
    pub(super) fn take_injection(&mut self, session_id: &str) -> bool {
        let inject = self.config.history_injection
            && self.inject_next_prompt_of.as_deref() == Some(session_id);
        if inject {
            self.inject_next_prompt_of = None;
        }
        inject
    }
}

/// The text blocks of a `session/prompt`'s `prompt`, joined by newlines.
pub fn prompt_text(params: Option<&Value>) -> String {
    params
        .and_then(|p| p.get("prompt"))
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|block| str_field(block, "type") == Some("text"))
                .filter_map(|block| str_field(block, "text"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Wraps the prompt of a `session/prompt` message in the resume context, once (DESIGN §3).
/// The text blocks become one text block holding the context; other blocks (images,
/// resources) follow unchanged. Returns whether the message changed: with no history, or an
/// already wrapped prompt, it is left alone.
pub fn inject_history(message: &mut Value, entries: &[HistoryEntry]) -> bool {
    let text = prompt_text(message.get("params"));
    let wrapped = wrap_prompt_once(&text, entries, &ContextLimits::default());
    if wrapped == text {
        return false;
    }
    let Some(blocks) = message
        .pointer_mut("/params/prompt")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let mut rebuilt = vec![json!({"type": "text", "text": wrapped})];
    rebuilt.extend(
        blocks
            .drain(..)
            .filter(|block| str_field(block, "type") != Some("text")),
    );
    *blocks = rebuilt;
    true
}
