//! The event journal (DESIGN §3 "Event journal"): every event serve emits gets the next sequence
//! number and the launch it belongs to, and is appended to `<workspace>/.kandev/journal.jsonl`,
//! so that it survives the operator, the exec stream and the pod. `agentctl events --since <seq>`
//! replays what came after a cursor; the operator keeps its cursor in ExecutorRunning status and
//! need not hold a stream open while the agent is idle.
//!
//! Bounded: the last [`KEPT`] entries are kept in memory (what `--since` can replay), the file is
//! compacted to them once it holds [`FILE_MAX_LINES`], and a restarted serve reads at most the
//! last [`READ_AT_START`] bytes of it. Sequence numbers only grow, across pods on the same
//! volume, so a higher number is always a newer event.
//!
//! The file lives where the agent can write too: its content is trusted as far as the agent's
//! own session is concerned, no further (an unparsable line is skipped).

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::events::Event;

/// The journal's file under `<workspace>/.kandev/`.
pub const JOURNAL_FILE: &str = "journal.jsonl";
/// Entries kept in memory: what `events --since` can replay.
pub const KEPT: usize = 1024;
/// Lines the file may hold before it is compacted to the last [`KEPT`].
const FILE_MAX_LINES: usize = 4 * KEPT;
/// A restarted serve reads at most this much of the file's end.
const READ_AT_START: u64 = 1 << 20;

/// The journal of one serve.
pub struct Journal {
    path: PathBuf,
    /// (seq, line) of the last entries, oldest first.
    recent: VecDeque<(u64, String)>,
    last_seq: u64,
    file_lines: usize,
    /// The pod this serve runs in, written into each entry.
    pod: Option<String>,
}

/// What `--since` gets.
#[derive(Debug, PartialEq)]
pub struct Replay {
    /// The entry lines after the cursor, oldest first.
    pub lines: Vec<String>,
    /// Entries after the cursor were compacted away: the caller must rely on the snapshot.
    pub gap: bool,
}

impl Journal {
    /// Opens the journal at `path`, continuing after the last sequence number it holds. A
    /// missing file starts empty; an unreadable one is reported and started over (the sequence
    /// continues from what could be read).
    pub fn open(path: PathBuf, pod: Option<String>) -> Self {
        let mut journal = Journal {
            path,
            recent: VecDeque::new(),
            last_seq: 0,
            file_lines: 0,
            pod,
        };
        match read_tail(&journal.path) {
            Ok(text) => {
                for line in text.lines() {
                    journal.file_lines += 1;
                    let Some(seq) = seq_of(line) else {
                        continue;
                    };
                    if seq > journal.last_seq {
                        journal.last_seq = seq;
                        journal.keep(seq, line.to_string());
                    }
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(%error, path = %journal.path.display(), "cannot read the event journal; starting it over");
            }
        }
        tracing::info!(path = %journal.path.display(), last_seq = journal.last_seq, "event journal opened");
        journal
    }

    /// The sequence number of the newest entry (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Records `event`, stamped with `timestamp`, under the next sequence number and `launch`;
    /// returns the entry's line. A failed write is logged: the live feed goes on without it.
    pub fn append(&mut self, event: &Event, timestamp: &str, launch: Option<&str>) -> String {
        self.last_seq += 1;
        let mut event = event.to_json(timestamp);
        if let Value::Object(map) = &mut event {
            map.insert("seq".into(), json!(self.last_seq));
            map.insert("launch".into(), json!(launch));
            if let Some(pod) = &self.pod {
                map.insert("pod".into(), json!(pod));
            }
        }
        let line = event.to_string();
        self.keep(self.last_seq, line.clone());
        if let Err(error) = self.write(&line) {
            tracing::warn!(%error, path = %self.path.display(), "cannot write the event journal");
        }
        line
    }

    /// The entries after `since`.
    pub fn since(&self, since: u64) -> Replay {
        let oldest_kept = self
            .recent
            .front()
            .map_or(self.last_seq + 1, |(seq, _)| *seq);
        Replay {
            lines: self
                .recent
                .iter()
                .filter(|(seq, _)| *seq > since)
                .map(|(_, line)| line.clone())
                .collect(),
            gap: since + 1 < oldest_kept && since < self.last_seq,
        }
    }

    fn keep(&mut self, seq: u64, line: String) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, line));
    }

    fn write(&mut self, line: &str) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if self.file_lines >= FILE_MAX_LINES {
            // Compact to what is kept in memory (which includes `line`), atomically.
            let tmp = self.path.with_extension("jsonl.tmp");
            let mut text = String::new();
            for (_, kept) in &self.recent {
                text.push_str(kept);
                text.push('\n');
            }
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, &self.path)?;
            self.file_lines = self.recent.len();
            return Ok(());
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(format!("{line}\n").as_bytes())?;
        self.file_lines += 1;
        Ok(())
    }
}

/// The end of the file, from the first whole line within [`READ_AT_START`] bytes.
fn read_tail(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(READ_AT_START);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(READ_AT_START).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Ok(match (start, text.find('\n')) {
        (0, _) => text,
        (_, Some(newline)) => text[newline + 1..].to_string(),
        (_, None) => String::new(),
    })
}

/// The sequence number of a journal line, if it is one. Only `seq` is read: every other field
/// is skipped without being built, so a dense line the agent wrote into the journal costs
/// nothing to read.
fn seq_of(line: &str) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Seq {
        seq: Option<u64>,
    }
    serde_json::from_str::<Seq>(line).ok()?.seq
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agentctl::events::PromptOutcome;

    fn started() -> Event {
        Event::PromptStarted {
            session_id: "s1".into(),
            prompt_id: None,
        }
    }

    fn finished() -> Event {
        Event::PromptFinished {
            session_id: "s1".into(),
            outcome: PromptOutcome::Stopped {
                stop_reason: json!("end_turn"),
            },
            last_message_id: Some("m-1".into()),
        }
    }

    #[test]
    fn entries_are_numbered_and_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(".kandev").join(JOURNAL_FILE);
        let mut journal = Journal::open(path.clone(), Some("pod-a".into()));
        let created = Event::SessionCreated {
            session_id: "s1".into(),
            method: "session/new".into(),
        };
        let first = journal.append(&created, "T", Some("initial"));
        // The entry as agentctl has always written it.
        assert_eq!(
            first,
            r#"{"event":"session_created","sessionId":"s1","method":"session/new","timestamp":"T","seq":1,"launch":"initial","pod":"pod-a"}"#
        );
        journal.append(&started(), "T", Some("initial"));

        // A new pod on the same volume continues the sequence and can replay the old entries.
        let mut again = Journal::open(path, Some("pod-b".into()));
        assert_eq!(again.last_seq(), 2);
        let third = again.append(&finished(), "T", Some("r1"));
        assert_eq!(
            third,
            r#"{"event":"prompt_finished","sessionId":"s1","stopReason":"end_turn","timestamp":"T","lastMessageId":"m-1","seq":3,"launch":"r1","pod":"pod-b"}"#
        );
        let replay = again.since(1);
        assert_eq!(replay.lines.len(), 2);
        assert!(replay.lines[0].contains("prompt_started"), "{replay:?}");
        assert!(!replay.gap);
        assert_eq!(again.since(3).lines.len(), 0);
    }

    #[test]
    fn memory_and_file_are_bounded_and_a_compacted_cursor_is_a_gap() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(JOURNAL_FILE);
        let mut journal = Journal::open(path.clone(), None);
        // Without a launch or a pod: `launch` is there all the same, `pod` is not.
        assert_eq!(
            journal.append(&started(), "T", None),
            r#"{"event":"prompt_started","sessionId":"s1","timestamp":"T","seq":1,"launch":null}"#
        );
        for _ in 1..FILE_MAX_LINES + 10 {
            journal.append(&started(), "T", None);
        }
        let lines = std::fs::read_to_string(&path)
            .expect("file")
            .lines()
            .count();
        assert!(lines <= FILE_MAX_LINES, "{lines}");
        let replay = journal.since(5);
        assert_eq!(replay.lines.len(), KEPT);
        assert!(replay.gap);
        assert!(!journal.since(journal.last_seq() - 1).gap);
        let reopened = Journal::open(path, None);
        assert_eq!(reopened.last_seq(), journal.last_seq());
    }

    #[test]
    fn garbage_in_the_file_is_skipped() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(JOURNAL_FILE);
        std::fs::write(
            &path,
            "not json\n{\"seq\":7,\"event\":\"x\"}\n{\"seq\":\"8\"}\n",
        )
        .expect("write");
        let journal = Journal::open(path, None);
        assert_eq!(journal.last_seq(), 7);
    }
}
