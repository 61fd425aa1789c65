//! The history agentctl records on the workspace volume (DESIGN §3 "History injection"):
//! one JSON object per line in `<volume>/.kandev/sessions/<session>.jsonl`.
//!
//! Reading never fails because of content: a torn write (pod killed mid-line) or a hand-edited
//! file costs only the lines that do not parse, which are counted and logged.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::HistoryError;
use crate::jsonrpc::LINE_LIMIT;
use crate::jsonrpc::cost;

/// Longest accepted session id; far above real ids (Kubernetes names are ≤ 253, ours ≤ 63
/// in practice) and far below file-name limits.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// One recorded event, tagged by `type` on the wire.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HistoryEntry {
    UserMessage {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp: Option<String>,
    },
    AgentMessage {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp: Option<String>,
    },
    ToolCall {
        name: String,
        /// The tool's arguments as the agent sent them.
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        input: serde_json::Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp: Option<String>,
    },
    ToolResult {
        name: String,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp: Option<String>,
    },
}

/// A history file's usable entries, plus how many lines had to be skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedHistory {
    pub entries: Vec<HistoryEntry>,
    pub skipped_corrupt_lines: usize,
}

/// Parses JSONL history. Blank lines are ignored; a line that is not a valid entry (truncated
/// JSON, unknown `type`, missing field) or would cost more to parse than a line of the wire may
/// (`jsonrpc::cost`: a tool call's `input` as a dense array) is skipped with a warning naming
/// its 1-based line number.
pub fn parse_history(text: &str) -> ParsedHistory {
    let mut parsed = ParsedHistory::default();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(cost) = cost::too_costly(line.as_bytes(), LINE_LIMIT) {
            parsed.skipped_corrupt_lines += 1;
            tracing::warn!(
                line = index + 1,
                cost,
                "skipping a history line too dense to parse"
            );
            continue;
        }
        match serde_json::from_str::<HistoryEntry>(line) {
            Ok(entry) => parsed.entries.push(entry),
            Err(error) => {
                parsed.skipped_corrupt_lines += 1;
                tracing::warn!(line = index + 1, %error, "skipping corrupt history line");
            }
        }
    }
    parsed
}

/// Rejects session ids that could escape the history directory or make odd file names:
/// only `[A-Za-z0-9._-]`, no leading `.`, no `..`, 1 to [`MAX_SESSION_ID_LEN`] bytes.
/// (`/`, `\` and NUL are excluded by the character set.)
pub fn validate_session_id(session: &str) -> Result<(), HistoryError> {
    let reason = if session.is_empty() {
        Some("it is empty")
    } else if session.len() > MAX_SESSION_ID_LEN {
        Some("it is longer than 128 bytes")
    } else if session.starts_with('.') {
        Some("it starts with '.'")
    } else if session.contains("..") {
        Some("it contains '..'")
    } else if !session
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        Some("only letters, digits, '.', '_' and '-' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(HistoryError::InvalidSessionId {
            session: session.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// History files of all sessions in one directory (the caller passes
/// `<volume>/.kandev/sessions`). Blocking I/O: async callers use `spawn_blocking`.
#[derive(Clone, Debug)]
pub struct HistoryStore {
    dir: PathBuf,
}

impl HistoryStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `<dir>/<session>.jsonl`, after validating the session id.
    pub fn path_for(&self, session: &str) -> Result<PathBuf, HistoryError> {
        validate_session_id(session)?;
        Ok(self.dir.join(format!("{session}.jsonl")))
    }

    /// Appends one entry as one line, creating the directory and file if needed.
    ///
    /// If the file ends in a torn line (the previous writer died mid-write), a newline is
    /// written first so the torn line stays the only casualty. The data is synced because
    /// node loss is one of the failures this history exists for.
    pub fn append(&self, session: &str, entry: &HistoryEntry) -> Result<(), HistoryError> {
        let path = self.path_for(session)?;
        let io_error = |source| HistoryError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(|source| HistoryError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut line = serde_json::to_string(entry).map_err(HistoryError::Encode)?;
        line.push('\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)
            .map_err(io_error)?;
        if ends_with_torn_line(&mut file).map_err(io_error)? {
            tracing::warn!(
                path = %path.display(),
                "history file ends in a torn line; starting a new line"
            );
            line.insert(0, '\n');
        }
        file.write_all(line.as_bytes()).map_err(io_error)?;
        file.flush().map_err(io_error)?;
        file.sync_data().map_err(io_error)
    }

    /// Reads a session's history. A missing file is an empty history; corrupt lines are
    /// skipped (see [`parse_history`]); invalid UTF-8 is replaced rather than fatal. Only real
    /// I/O failures (permissions, unreadable volume) are errors.
    pub fn read(&self, session: &str) -> Result<ParsedHistory, HistoryError> {
        let path = self.path_for(session)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                return Ok(ParsedHistory::default());
            }
            Err(source) => return Err(HistoryError::Io { path, source }),
        };
        let _span = tracing::warn_span!("history_read", path = %path.display()).entered();
        let text = String::from_utf8_lossy(&bytes);
        if matches!(text, std::borrow::Cow::Owned(_)) {
            tracing::warn!("history file contains invalid UTF-8; replaced with U+FFFD");
        }
        Ok(parse_history(&text))
    }
}

/// Whether a non-empty file's last byte is not a newline.
fn ends_with_torn_line(file: &mut File) -> std::io::Result<bool> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::fixtures::user;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn wire_format_of_every_kind() {
        // §3 history injection: entries user_message, agent_message, tool_call, tool_result.
        let rows = [
            (
                r#"{"type":"user_message","text":"hi","timestamp":"2025-01-01T00:00:00Z"}"#,
                HistoryEntry::UserMessage {
                    text: "hi".into(),
                    timestamp: Some("2025-01-01T00:00:00Z".into()),
                },
            ),
            (
                r#"{"type":"agent_message","text":"hello"}"#,
                HistoryEntry::AgentMessage {
                    text: "hello".into(),
                    timestamp: None,
                },
            ),
            (
                r#"{"type":"tool_call","name":"read_file","input":{"path":"a.rs"}}"#,
                HistoryEntry::ToolCall {
                    name: "read_file".into(),
                    input: json!({"path": "a.rs"}),
                    timestamp: None,
                },
            ),
            (
                r#"{"type":"tool_result","name":"read_file","output":"fn main() {}"}"#,
                HistoryEntry::ToolResult {
                    name: "read_file".into(),
                    output: "fn main() {}".into(),
                    timestamp: None,
                },
            ),
        ];
        for (line, entry) in rows {
            assert_eq!(
                serde_json::from_str::<HistoryEntry>(line).ok(),
                Some(entry.clone())
            );
            assert_eq!(serde_json::to_string(&entry).ok().as_deref(), Some(line));
        }
    }

    #[test]
    fn parse_skips_corrupt_lines_never_fatal() {
        let good = r#"{"type":"user_message","text":"a"}"#;
        // (text, entries parsed, corrupt lines skipped)
        #[rustfmt::skip]
        let rows = [
            ("", 0, 0),                                             // empty history
            ("\n\n  \n", 0, 0),                                     // blank lines are not corrupt
            ("{\"type\":\"user_mes", 0, 1),                          // only a torn line
            ("not json\n[1,2]\n{}\n", 0, 3),                         // only corrupt lines
            (r#"{"type":"mystery","text":"a"}"#, 0, 1),              // unknown type
            (r#"{"type":"tool_result","name":"x"}"#, 0, 1),          // missing field
            ("{\"type\":\"user_message\",\"text\":\"a\"}\r\n", 1, 0), // CRLF tolerated
        ];
        for (text, entries, skipped) in rows {
            let parsed = parse_history(text);
            assert_eq!(
                (parsed.entries.len(), parsed.skipped_corrupt_lines),
                (entries, skipped),
                "{text:?}"
            );
        }
        let mixed = format!("{good}\ngarbage\n{good}\n{{\"type\":\n");
        let parsed = parse_history(&mixed);
        assert_eq!(parsed.entries, vec![user("a"), user("a")]);
        assert_eq!(parsed.skipped_corrupt_lines, 2);
        // A tool call whose input is a dense array is skipped unparsed; its neighbours stay.
        let dense = format!(
            "{{\"type\":\"tool_call\",\"name\":\"x\",\"input\":[{}0]}}",
            "0,".repeat(400_000)
        );
        let parsed = parse_history(&format!("{good}\n{dense}\n{good}\n"));
        assert_eq!(parsed.entries, vec![user("a"), user("a")]);
        assert_eq!(parsed.skipped_corrupt_lines, 1);
    }

    #[test]
    fn session_id_validation() {
        let long_ok = "a".repeat(MAX_SESSION_ID_LEN);
        let too_long = "a".repeat(MAX_SESSION_ID_LEN + 1);
        #[rustfmt::skip]
        let rows: [(&str, bool); 16] = [
            ("ts-1", true),
            ("Session_2.v1", true),
            ("a.b", true),
            (&long_ok, true),
            ("", false),
            (&too_long, false),
            (".", false),
            ("..", false),
            (".hidden", false),
            ("a..b", false),
            ("../etc/passwd", false),
            ("a/b", false),
            ("a\\b", false),
            ("a\0b", false),
            ("a b", false),
            ("é", false),
        ];
        for (session, ok) in rows {
            let result = validate_session_id(session);
            assert_eq!(result.is_ok(), ok, "{session:?}: {result:?}");
            if let Err(error) = result {
                let message = error.to_string();
                assert!(message.contains("session id"), "{message}");
            }
        }
    }

    #[test]
    fn append_then_read_round_trip() -> Result<(), Box<dyn std::error::Error>> {
        let volume = tempfile::tempdir()?;
        let store = HistoryStore::new(volume.path().join(".kandev/sessions"));
        // Missing file → empty history.
        assert_eq!(store.read("ts-1")?, ParsedHistory::default());
        let entries = [
            user("do it"),
            HistoryEntry::ToolCall {
                name: "bash".into(),
                input: json!({"cmd": "ls"}),
                timestamp: Some("t".into()),
            },
        ];
        for entry in &entries {
            store.append("ts-1", entry)?;
        }
        assert_eq!(store.read("ts-1")?.entries, entries.to_vec());
        assert_eq!(
            store.path_for("ts-1")?,
            volume.path().join(".kandev/sessions/ts-1.jsonl")
        );
        Ok(())
    }

    #[test]
    fn append_after_torn_line_loses_only_the_torn_line() -> Result<(), Box<dyn std::error::Error>> {
        let volume = tempfile::tempdir()?;
        let store = HistoryStore::new(volume.path());
        let path = store.path_for("s")?;
        std::fs::write(
            &path,
            "{\"type\":\"user_message\",\"text\":\"a\"}\n{\"type\":\"agent_mes",
        )?;
        store.append("s", &user("b"))?;
        let parsed = store.read("s")?;
        assert_eq!(parsed.entries, vec![user("a"), user("b")]);
        assert_eq!(parsed.skipped_corrupt_lines, 1);
        Ok(())
    }

    #[test]
    fn invalid_utf8_is_not_fatal() -> Result<(), Box<dyn std::error::Error>> {
        let volume = tempfile::tempdir()?;
        let store = HistoryStore::new(volume.path());
        let mut bytes = b"{\"type\":\"user_message\",\"text\":\"a\"}\n".to_vec();
        bytes.extend_from_slice(b"\xff\xfe garbage\n");
        std::fs::write(store.path_for("s")?, bytes)?;
        let parsed = store.read("s")?;
        assert_eq!(
            (parsed.entries, parsed.skipped_corrupt_lines),
            (vec![user("a")], 1)
        );
        Ok(())
    }

    #[test]
    fn store_rejects_escaping_session_ids() -> Result<(), Box<dyn std::error::Error>> {
        let volume = tempfile::tempdir()?;
        let store = HistoryStore::new(volume.path().join("sessions"));
        for session in ["../x", "/etc/passwd", ".."] {
            assert!(store.append(session, &user("x")).is_err(), "{session}");
            assert!(store.read(session).is_err(), "{session}");
        }
        // Nothing was created outside (or inside) the directory.
        assert!(!volume.path().join("sessions").exists());
        assert!(!volume.path().join("x.jsonl").exists());
        Ok(())
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Text as agents produce it: any printable characters, newlines, quotes, multi-byte.
        fn text() -> impl Strategy<Value = String> {
            "(\\PC|\n|\r|\t|\"|\\\\|漢|😀){0,24}"
        }

        fn timestamp() -> impl Strategy<Value = Option<String>> {
            prop::option::of("20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]Z")
        }

        fn input() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(serde_json::Value::from),
                text().prop_map(serde_json::Value::from),
            ];
            leaf.prop_recursive(2, 12, 4, |inner| {
                prop::collection::btree_map("[a-z]{1,5}", inner, 0..4).prop_map(|m| json!(m))
            })
        }

        pub(super) fn entry() -> impl Strategy<Value = HistoryEntry> {
            prop_oneof![
                (text(), timestamp())
                    .prop_map(|(text, timestamp)| HistoryEntry::UserMessage { text, timestamp }),
                (text(), timestamp())
                    .prop_map(|(text, timestamp)| HistoryEntry::AgentMessage { text, timestamp }),
                (text(), input(), timestamp()).prop_map(|(name, input, timestamp)| {
                    HistoryEntry::ToolCall {
                        name,
                        input,
                        timestamp,
                    }
                }),
                (text(), text(), timestamp()).prop_map(|(name, output, timestamp)| {
                    HistoryEntry::ToolResult {
                        name,
                        output,
                        timestamp,
                    }
                }),
            ]
        }

        fn jsonl(entries: &[HistoryEntry]) -> String {
            entries
                .iter()
                .map(|e| serde_json::to_string(e).expect("an entry encodes") + "\n")
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any text: no panic, and every non-blank line is either an entry or counted as
            /// skipped.
            #[test]
            fn any_text_parses_without_loss_of_count(text in "(\\PC|\n|\r|\\{|\\}|\"|:|type|user_message){0,200}") {
                let parsed = parse_history(&text);
                let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
                prop_assert_eq!(parsed.entries.len() + parsed.skipped_corrupt_lines, lines);
            }

            /// What is written is read back, whatever the text holds (newlines and quotes are
            /// escaped, so one entry stays one line).
            #[test]
            fn entries_round_trip(entries in prop::collection::vec(entry(), 0..8)) {
                let text = jsonl(&entries);
                prop_assert_eq!(text.lines().count(), entries.len());
                let parsed = parse_history(&text);
                prop_assert_eq!(parsed.skipped_corrupt_lines, 0);
                prop_assert_eq!(parsed.entries, entries);
            }

            /// A file cut at any byte (a pod killed mid-write, even inside a UTF-8 character)
            /// loses at most the entry being written: the rest is read, in order.
            #[test]
            fn a_torn_write_costs_at_most_the_last_entry(
                entries in prop::collection::vec(entry(), 1..6),
                cut in any::<prop::sample::Index>(),
            ) {
                let bytes = jsonl(&entries).into_bytes();
                let cut = cut.index(bytes.len() + 1);
                let torn = String::from_utf8_lossy(&bytes[..cut]);
                let complete = bytes[..cut].iter().filter(|b| **b == b'\n').count();
                let parsed = parse_history(&torn);
                prop_assert!(parsed.skipped_corrupt_lines <= 1);
                prop_assert!(parsed.entries.len() >= complete);
                prop_assert!(parsed.entries.len() <= complete + 1);
                prop_assert_eq!(&parsed.entries[..], &entries[..parsed.entries.len()]);
            }
        }

        proptest! {
            // Each case writes files.
            #![proptest_config(ProptestConfig::with_cases(32))]

            /// Appending after a torn line keeps every complete entry and the new one.
            #[test]
            fn append_after_any_tear_keeps_the_rest(
                entries in prop::collection::vec(entry(), 1..5),
                cut in any::<prop::sample::Index>(),
                next in entry(),
            ) {
                let volume = tempfile::tempdir().expect("a temporary directory");
                let store = HistoryStore::new(volume.path());
                let bytes = jsonl(&entries).into_bytes();
                let cut = cut.index(bytes.len() + 1);
                std::fs::write(store.path_for("s").expect("a valid id"), &bytes[..cut]).expect("write");
                store.append("s", &next).expect("append");
                let parsed = store.read("s").expect("read");
                let (last, before) = parsed.entries.split_last().expect("the appended entry");
                prop_assert_eq!(last, &next);
                let complete = bytes[..cut].iter().filter(|b| **b == b'\n').count();
                prop_assert!(before.len() >= complete && before.len() <= complete + 1);
                prop_assert_eq!(before, &entries[..before.len()]);
                prop_assert!(parsed.skipped_corrupt_lines <= 1);
            }
        }
    }
}
