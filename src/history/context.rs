//! The resume context (DESIGN §3 "History injection"): for agents that cannot restore a
//! session themselves, the first prompt after a fresh start carries the recorded history so
//! the new agent can pick up where the old one stopped.

use super::record::HistoryEntry;
use super::render::render_entry;

/// First line of every resume context; also how an already-wrapped prompt is recognised.
pub const RESUME_CONTEXT_HEADER: &str = "RESUME CONTEXT FOR CONTINUING TASK";
const HISTORY_SECTION: &str = "=== EXECUTION HISTORY ===";
const REQUEST_SECTION: &str = "=== CURRENT REQUEST ===";
const INSTRUCTIONS_SECTION: &str = "=== INSTRUCTIONS ===";
const INSTRUCTIONS: &str = "You are continuing a task that was interrupted. The execution history \
above shows what was already said and done; the workspace still holds the results of that work. \
Continue from where the history leaves off to fulfil the current request. Do not redo work that \
is already finished; if you are unsure whether a step completed, check the workspace first.";
const NO_HISTORY: &str = "(no recorded history)";

/// Size limits of the resume context (DESIGN §3: messages 2000 chars, tool results 500, plus a
/// total cap), so a long session cannot blow the agent's context window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextLimits {
    /// Per user/assistant message, in characters (Unicode scalar values).
    pub max_message_chars: usize,
    /// Per tool result, in characters.
    pub max_tool_result_chars: usize,
    /// The rendered history lines together, in bytes; the oldest entries are dropped first.
    pub max_history_bytes: usize,
}

impl Default for ContextLimits {
    fn default() -> Self {
        Self {
            max_message_chars: 2000,
            max_tool_result_chars: 500,
            max_history_bytes: 32 * 1024,
        }
    }
}

/// Renders the resume context:
///
/// ```text
/// RESUME CONTEXT FOR CONTINUING TASK
///
/// === EXECUTION HISTORY ===
/// [USER]: …
/// [ASSISTANT]: …
/// [TOOL CALL: name]
/// [TOOL RESULT: name] …
///
/// === CURRENT REQUEST ===
/// <current_request>
///
/// === INSTRUCTIONS ===
/// <instructions>
/// ```
///
/// When the history is over `max_history_bytes`, the oldest entries are dropped (the recent
/// ones matter most for continuing) and a line says how many were omitted.
pub fn build_resume_context(
    entries: &[HistoryEntry],
    current_request: &str,
    limits: &ContextLimits,
) -> String {
    let lines: Vec<String> = entries
        .iter()
        .map(|e| render_entry(e, Some(limits)))
        .collect();
    let mut kept_bytes = 0;
    let mut first_kept = lines.len();
    for (index, line) in lines.iter().enumerate().rev() {
        let line_bytes = line.len() + 1;
        if kept_bytes + line_bytes > limits.max_history_bytes {
            break;
        }
        kept_bytes += line_bytes;
        first_kept = index;
    }

    let mut out = format!("{RESUME_CONTEXT_HEADER}\n\n{HISTORY_SECTION}\n");
    if lines.is_empty() {
        out.push_str(NO_HISTORY);
        out.push('\n');
    }
    match first_kept {
        0 => {}
        1 => out.push_str("[… 1 earlier entry omitted to fit the size limit …]\n"),
        omitted => out.push_str(&format!(
            "[… {omitted} earlier entries omitted to fit the size limit …]\n"
        )),
    }
    for line in &lines[first_kept..] {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!(
        "\n{REQUEST_SECTION}\n{current_request}\n\n{INSTRUCTIONS_SECTION}\n{INSTRUCTIONS}\n"
    ));
    out
}

/// Whether `prompt` already is a resume context.
pub fn is_resume_context(prompt: &str) -> bool {
    prompt.trim_start().starts_with(RESUME_CONTEXT_HEADER)
}

/// Wraps the first prompt after a fresh start exactly once (DESIGN §3 "wrapped once"): a
/// prompt that already is a resume context is returned unchanged, so a retried send cannot
/// nest contexts. With no history there is nothing to inject and the prompt is returned as is.
pub fn wrap_prompt_once(prompt: &str, entries: &[HistoryEntry], limits: &ContextLimits) -> String {
    if entries.is_empty() || is_resume_context(prompt) {
        prompt.to_owned()
    } else {
        build_resume_context(entries, prompt, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::fixtures::{agent, tool_result, user};
    use crate::history::render::{TRUNCATION_MARKER, truncate_chars};
    use pretty_assertions::assert_eq;

    #[test]
    fn exact_format() {
        // §3 history injection: header, the three sections, one line per entry kind.
        let entries = [
            user("add a test"),
            agent("Looking at the code."),
            HistoryEntry::ToolCall {
                name: "read_file".into(),
                input: serde_json::json!({"path": "src/lib.rs"}),
                timestamp: None,
            },
            tool_result("read_file", "pub fn f() {}"),
            tool_result("noop", ""),
        ];
        let expected = format!(
            "RESUME CONTEXT FOR CONTINUING TASK\n\
             \n\
             === EXECUTION HISTORY ===\n\
             [USER]: add a test\n\
             [ASSISTANT]: Looking at the code.\n\
             [TOOL CALL: read_file]\n\
             [TOOL RESULT: read_file] pub fn f() {{}}\n\
             [TOOL RESULT: noop]\n\
             \n\
             === CURRENT REQUEST ===\n\
             continue please\n\
             \n\
             === INSTRUCTIONS ===\n\
             {INSTRUCTIONS}\n"
        );
        let got = build_resume_context(&entries, "continue please", &ContextLimits::default());
        assert_eq!(got, expected);
    }

    #[test]
    fn empty_history_still_has_every_section() {
        let got = build_resume_context(&[], "go", &ContextLimits::default());
        let expected = format!(
            "{RESUME_CONTEXT_HEADER}\n\n{HISTORY_SECTION}\n{NO_HISTORY}\n\n\
             {REQUEST_SECTION}\ngo\n\n{INSTRUCTIONS_SECTION}\n{INSTRUCTIONS}\n"
        );
        assert_eq!(got, expected);
    }

    #[test]
    fn messages_2000_and_tool_results_500_chars() {
        // §3: messages truncated to 2000 chars, tool results to 500.
        let limits = ContextLimits::default();
        let m = TRUNCATION_MARKER;
        // The marker counts inside the limit.
        let room = |max: usize| max - m.chars().count();
        let rows = [
            (
                user(&"u".repeat(2000)),
                format!("[USER]: {}", "u".repeat(2000)),
            ),
            (
                user(&"u".repeat(2001)),
                format!("[USER]: {}{m}", "u".repeat(room(2000))),
            ),
            (
                agent(&"é".repeat(2001)),
                format!("[ASSISTANT]: {}{m}", "é".repeat(room(2000))),
            ),
            (
                tool_result("t", &"o".repeat(500)),
                format!("[TOOL RESULT: t] {}", "o".repeat(500)),
            ),
            (
                tool_result("t", &"字".repeat(501)),
                format!("[TOOL RESULT: t] {}{m}", "字".repeat(room(500))),
            ),
        ];
        for (entry, expected) in rows {
            assert_eq!(render_entry(&entry, Some(&limits)), expected);
        }
    }

    #[test]
    fn huge_single_message_is_capped() {
        let huge = "x".repeat(5_000_000);
        let context = build_resume_context(&[user(&huge)], "go", &ContextLimits::default());
        assert!(context.len() < 4_000, "{}", context.len());
        assert!(context.contains(TRUNCATION_MARKER));
    }

    #[test]
    fn total_cap_drops_oldest_first() {
        // Each rendered line "[USER]: N" is 9 bytes + newline = 10 bytes.
        let entries: Vec<HistoryEntry> = (0..5).map(|i| user(&i.to_string())).collect();
        let limits = |bytes| ContextLimits {
            max_history_bytes: bytes,
            ..ContextLimits::default()
        };
        // (cap in bytes, expected history section lines)
        #[rustfmt::skip]
        let rows: [(usize, &[&str]); 5] = [
            (50, &["[USER]: 0", "[USER]: 1", "[USER]: 2", "[USER]: 3", "[USER]: 4"]), // exact fit
            (49, &["[… 1 earlier entry omitted to fit the size limit …]", "[USER]: 1", "[USER]: 2", "[USER]: 3", "[USER]: 4"]),
            (20, &["[… 3 earlier entries omitted to fit the size limit …]", "[USER]: 3", "[USER]: 4"]),
            (10, &["[… 4 earlier entries omitted to fit the size limit …]", "[USER]: 4"]),
            (9, &["[… 5 earlier entries omitted to fit the size limit …]"]),
        ];
        for (cap, expected) in rows {
            let context = build_resume_context(&entries, "go", &limits(cap));
            let history: Vec<&str> = context
                .lines()
                .skip_while(|l| *l != HISTORY_SECTION)
                .skip(1)
                .take_while(|l| !l.is_empty())
                .collect();
            assert_eq!(history, expected, "cap={cap}");
        }
    }

    #[test]
    fn default_cap_keeps_the_newest_within_32_kib() {
        let entries: Vec<HistoryEntry> = (0..100)
            .map(|i| agent(&format!("{i:04}{}", "z".repeat(1996))))
            .collect();
        let context = build_resume_context(&entries, "go", &ContextLimits::default());
        let history_bytes: usize = context
            .lines()
            .filter(|l| l.starts_with("[ASSISTANT]:"))
            .map(|l| l.len() + 1)
            .sum();
        assert!(history_bytes <= 32 * 1024);
        assert!(context.contains("0099"), "the newest entry is kept");
        assert!(!context.contains("0000"), "the oldest entry is dropped");
        assert!(context.contains("earlier entries omitted"));
    }

    #[test]
    fn wraps_exactly_once() {
        let limits = ContextLimits::default();
        let history = [user("earlier")];
        let once = wrap_prompt_once("next step", &history, &limits);
        assert!(is_resume_context(&once));
        assert!(once.contains("=== CURRENT REQUEST ===\nnext step\n"));
        // Wrapping again (a retried send) changes nothing.
        assert_eq!(wrap_prompt_once(&once, &history, &limits), once);
        // No history, nothing to inject.
        assert_eq!(wrap_prompt_once("next step", &[], &limits), "next step");
        // Only the header at the start counts.
        assert!(!is_resume_context(
            "please explain RESUME CONTEXT FOR CONTINUING TASK"
        ));
        assert!(is_resume_context(
            "\n  RESUME CONTEXT FOR CONTINUING TASK\n"
        ));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            "(\\PC|\n|é|漢|😀|👩‍💻){0,40}"
        }

        fn entry() -> impl Strategy<Value = HistoryEntry> {
            prop_oneof![
                text().prop_map(|t| user(&t)),
                text().prop_map(|t| agent(&t)),
                "[a-z_]{1,8}".prop_map(|name| HistoryEntry::ToolCall {
                    name,
                    input: serde_json::Value::Null,
                    timestamp: None,
                }),
                ("[a-z_]{1,8}", text()).prop_map(|(name, output)| tool_result(&name, &output)),
            ]
        }

        fn limits() -> impl Strategy<Value = ContextLimits> {
            (0usize..24, 0usize..24, 0usize..400).prop_map(|(m, t, h)| ContextLimits {
                max_message_chars: m,
                max_tool_result_chars: t,
                max_history_bytes: h,
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// The history section holds the newest entries that fit the byte cap, oldest
            /// dropped first and counted, each message and tool result within its own cap; the
            /// request and the instructions always follow.
            #[test]
            fn the_context_keeps_the_newest_entries_within_the_caps(
                entries in prop::collection::vec(entry(), 0..10),
                request in text(),
                limits in limits(),
            ) {
                let context = build_resume_context(&entries, &request, &limits);
                let head = format!("{RESUME_CONTEXT_HEADER}\n\n{HISTORY_SECTION}\n");
                let tail = format!("\n{REQUEST_SECTION}\n{request}\n\n{INSTRUCTIONS_SECTION}\n{INSTRUCTIONS}\n");
                let history = context
                    .strip_prefix(&head)
                    .and_then(|rest| rest.strip_suffix(&tail))
                    .expect("header, history, request, instructions");

                let rendered: Vec<String> = entries.iter().map(|e| render_entry(e, Some(&limits))).collect();
                // Which suffix of the entries was kept: the one the section is made of.
                let section = |kept: usize| {
                    let omitted = entries.len() - kept;
                    let mut out = String::new();
                    if entries.is_empty() {
                        out.push_str(NO_HISTORY);
                        out.push('\n');
                    }
                    match omitted {
                        0 => {}
                        1 => out.push_str("[… 1 earlier entry omitted to fit the size limit …]\n"),
                        n => out.push_str(&format!("[… {n} earlier entries omitted to fit the size limit …]\n")),
                    }
                    for line in &rendered[omitted..] {
                        out.push_str(line);
                        out.push('\n');
                    }
                    out
                };
                let kept = (0..=entries.len()).rev().find(|k| section(*k) == history);
                let kept = kept.expect("the section is the newest entries after an omission line");
                let bytes = |lines: &[String]| lines.iter().map(|l| l.len() + 1).sum::<usize>();
                let first = entries.len() - kept;
                prop_assert!(bytes(&rendered[first..]) <= limits.max_history_bytes);
                if first > 0 {
                    prop_assert!(bytes(&rendered[first - 1..]) > limits.max_history_bytes, "the next older entry would not fit");
                }
                let marker = TRUNCATION_MARKER.chars().count();
                for (entry, line) in entries.iter().zip(&rendered) {
                    let (body, cap) = match entry {
                        HistoryEntry::UserMessage { text, .. } | HistoryEntry::AgentMessage { text, .. } => (text, limits.max_message_chars),
                        HistoryEntry::ToolResult { output, .. } => (output, limits.max_tool_result_chars),
                        HistoryEntry::ToolCall { .. } => continue,
                    };
                    let shown = truncate_chars(body, cap);
                    prop_assert!(line.ends_with(&shown));
                    prop_assert!(shown.chars().count() <= cap.max(marker));
                }
            }

            /// A prompt is wrapped at most once, however often the send is retried.
            #[test]
            fn wrapping_is_idempotent(
                entries in prop::collection::vec(entry(), 0..4),
                prompt in text(),
                limits in limits(),
            ) {
                let once = wrap_prompt_once(&prompt, &entries, &limits);
                prop_assert_eq!(wrap_prompt_once(&once, &entries, &limits), once.clone());
                prop_assert_eq!(is_resume_context(&once), !entries.is_empty() || is_resume_context(&prompt));
            }
        }
    }
}
