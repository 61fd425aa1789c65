//! The history JSONL reader and the resume context on arbitrary file content: no panic, every
//! non-blank line counted, and the context within its caps whatever the entries hold.
#![no_main]

use kandev_operator::history::{ContextLimits, build_resume_context, parse_history};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = parse_history(&text);
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(parsed.entries.len() + parsed.skipped_corrupt_lines, lines);
    let limits = ContextLimits {
        max_message_chars: 16,
        max_tool_result_chars: 8,
        max_history_bytes: 512,
    };
    let context = build_resume_context(&parsed.entries, "go on", &limits);
    // Header, sections, instructions and an omission line are under 1 KiB; the history <= 512 B.
    assert!(context.len() <= 2048, "{}", context.len());
});
