//! History entries without timestamps, for the tests of this module.

use super::HistoryEntry;

pub fn user(text: &str) -> HistoryEntry {
    HistoryEntry::UserMessage {
        text: text.into(),
        timestamp: None,
    }
}

pub fn agent(text: &str) -> HistoryEntry {
    HistoryEntry::AgentMessage {
        text: text.into(),
        timestamp: None,
    }
}

pub fn tool_result(name: &str, output: &str) -> HistoryEntry {
    HistoryEntry::ToolResult {
        name: name.into(),
        output: output.into(),
        timestamp: None,
    }
}
