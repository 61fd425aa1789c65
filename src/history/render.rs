//! The line format of a history entry (`[USER]: …`, `[ASSISTANT]: …`, `[TOOL CALL: name]`,
//! `[TOOL RESULT: name] …`), rendered once for both readers: cut to the resume context's limits
//! (DESIGN §3 "History injection", [`super::build_resume_context`]), or whole for
//! `kubectl kandev history` ([`render_transcript`]).

use super::context::ContextLimits;
use super::record::HistoryEntry;

/// Appended to a shortened message or tool result.
pub const TRUNCATION_MARKER: &str = "… [truncated]";

/// One entry as one line (a multi-line message keeps its line breaks).
///
/// - `Some(limits)`: the resume context's form — messages and tool results cut to their limits,
///   a tool call by its name only.
/// - `None`: the whole entry, with a tool call's input (compact JSON) when it is not null.
pub fn render_entry(entry: &HistoryEntry, limits: Option<&ContextLimits>) -> String {
    let labelled = |label: String, body: &str| {
        if body.is_empty() {
            label
        } else {
            format!("{label} {body}")
        }
    };
    let cut = |text: &str, max_chars: Option<usize>| match max_chars {
        Some(max_chars) => truncate_chars(text, max_chars),
        None => text.to_owned(),
    };
    match entry {
        HistoryEntry::UserMessage { text, .. } => labelled(
            "[USER]:".into(),
            &cut(text, limits.map(|l| l.max_message_chars)),
        ),
        HistoryEntry::AgentMessage { text, .. } => labelled(
            "[ASSISTANT]:".into(),
            &cut(text, limits.map(|l| l.max_message_chars)),
        ),
        HistoryEntry::ToolCall { name, input, .. } => {
            let label = format!("[TOOL CALL: {name}]");
            if limits.is_some() || input.is_null() {
                label
            } else {
                format!("{label} {input}")
            }
        }
        HistoryEntry::ToolResult { name, output, .. } => labelled(
            format!("[TOOL RESULT: {name}]"),
            &cut(output, limits.map(|l| l.max_tool_result_chars)),
        ),
    }
}

/// The whole recorded history as `kubectl kandev history` prints it: one [`render_entry`] line
/// per entry, untruncated, its trailing whitespace trimmed, optionally prefixed with the entry's
/// timestamp (`-` when it has none).
pub fn render_transcript(entries: &[HistoryEntry], timestamps: bool) -> String {
    let mut out = String::new();
    for entry in entries {
        if timestamps {
            let timestamp = match entry {
                HistoryEntry::UserMessage { timestamp, .. }
                | HistoryEntry::AgentMessage { timestamp, .. }
                | HistoryEntry::ToolCall { timestamp, .. }
                | HistoryEntry::ToolResult { timestamp, .. } => timestamp,
            };
            out.push_str(timestamp.as_deref().unwrap_or("-"));
            out.push(' ');
        }
        out.push_str(render_entry(entry, None).trim_end());
        out.push('\n');
    }
    out
}

/// A text of more than `max_chars` characters cut to `max_chars` characters, the
/// [`TRUNCATION_MARKER`] that ends it included (below the marker's own length, the marker
/// alone). Counting and cutting by `char` never splits a UTF-8 code point (a combined emoji
/// sequence may still be cut between its code points, which is harmless for a model).
pub(super) fn truncate_chars(text: &str, max_chars: usize) -> String {
    if text.char_indices().nth(max_chars).is_none() {
        return text.to_owned();
    }
    let keep = max_chars.saturating_sub(TRUNCATION_MARKER.chars().count());
    let cut = text
        .char_indices()
        .nth(keep)
        .map_or(text.len(), |(at, _)| at);
    format!("{}{TRUNCATION_MARKER}", &text[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn truncation_table_is_utf8_safe() {
        let m = TRUNCATION_MARKER;
        // The marker is 13 characters and counts inside the limit.
        let room = |max: usize| max - m.chars().count();
        let a1999 = "a".repeat(1999);
        // (text, max chars, expected)
        #[rustfmt::skip]
        let rows: Vec<(String, usize, String)> = vec![
            ("".into(), 5, "".into()),
            ("abcde".into(), 5, "abcde".into()),                      // exactly at the limit
            ("a".repeat(21), 20, format!("{}{m}", "a".repeat(room(20)))), // one over
            ("😀".repeat(16), 15, format!("😀😀{m}")),                 // 4-byte chars
            ("漢字".repeat(9), 16, format!("漢字漢{m}")),              // 3-byte chars
            ("ab😀".into(), 3, "ab😀".into()),                        // emoji exactly at the limit
            (format!("{}😀{}", "a".repeat(room(20)), "c".repeat(20)), 20, format!("{}{m}", "a".repeat(room(20)))), // cut right before an emoji
            (format!("{a1999}😀😀"), 2000, format!("{}{m}", &a1999[..room(2000)])),  // §3: 2000-char messages
            (format!("{a1999}漢"), 2000, format!("{a1999}漢")),
            ("abcdef".into(), 5, m.to_string()),                      // below the marker's length
            ("abc".into(), 0, m.to_string()),
        ];
        for (text, max, expected) in rows {
            assert_eq!(truncate_chars(&text, max), expected, "{text:?} max={max}");
        }
    }

    #[test]
    fn history_renders_like_the_resume_context() {
        let entries = vec![
            HistoryEntry::UserMessage {
                text: "Fix the bug.".into(),
                timestamp: Some("2026-01-01T00:00:00Z".into()),
            },
            HistoryEntry::ToolCall {
                name: "read_file".into(),
                input: json!({"path": "src/a.rs"}),
                timestamp: None,
            },
            HistoryEntry::ToolResult {
                name: "read_file".into(),
                output: "fn a() {}\n".into(),
                timestamp: None,
            },
            HistoryEntry::ToolCall {
                name: "ls".into(),
                input: serde_json::Value::Null,
                timestamp: None,
            },
            HistoryEntry::AgentMessage {
                text: "Done:\n- fixed a".into(),
                timestamp: None,
            },
        ];
        assert_eq!(
            render_transcript(&entries, false),
            "\
[USER]: Fix the bug.
[TOOL CALL: read_file] {\"path\":\"src/a.rs\"}
[TOOL RESULT: read_file] fn a() {}
[TOOL CALL: ls]
[ASSISTANT]: Done:
- fixed a
"
        );
        let stamped = render_transcript(&entries[..2], true);
        assert_eq!(
            stamped,
            "2026-01-01T00:00:00Z [USER]: Fix the bug.\n- [TOOL CALL: read_file] {\"path\":\"src/a.rs\"}\n"
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            "(\\PC|\n|é|漢|😀|👩‍💻){0,40}"
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Truncation keeps a prefix of whole characters and marks the cut, within `max`
            /// characters with the marker (the marker alone below its own length); text within
            /// the cap is untouched.
            #[test]
            fn truncation_keeps_a_char_prefix_within_the_cap(text in text(), max in 0usize..48) {
                let out = truncate_chars(&text, max);
                let chars = text.chars().count();
                if chars <= max {
                    prop_assert_eq!(out, text);
                } else {
                    let kept = out.strip_suffix(TRUNCATION_MARKER).expect("the marker ends a cut text");
                    prop_assert!(text.is_char_boundary(kept.len()));
                    prop_assert!(text.starts_with(kept));
                    let marker = TRUNCATION_MARKER.chars().count();
                    prop_assert_eq!(kept.chars().count(), max.saturating_sub(marker));
                    prop_assert!(out.chars().count() <= max.max(marker));
                }
            }

        }
    }
}
