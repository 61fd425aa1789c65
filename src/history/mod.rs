//! Recorded session history (`record`), the line format of its entries (`render`: cut for the
//! resume context, whole for `kubectl kandev history`) and the resume context built from it
//! (`context`, DESIGN §3 "History injection").

mod context;
#[cfg(test)]
mod fixtures;
mod record;
mod render;

use std::path::PathBuf;

pub use context::{
    ContextLimits, RESUME_CONTEXT_HEADER, build_resume_context, is_resume_context, wrap_prompt_once,
};
pub use record::{
    HistoryEntry, HistoryStore, MAX_SESSION_ID_LEN, ParsedHistory, parse_history,
    validate_session_id,
};
pub use render::{TRUNCATION_MARKER, render_entry, render_transcript};

/// The exit code of `agentctl history` when the session has no recorded history (no file yet):
/// `kubectl kandev history` tells "nothing recorded" apart from a failure without parsing stderr.
pub const NO_HISTORY_EXIT_CODE: i32 = 3;

/// Why history could not be stored or read. Corrupt content is never an error (it is skipped).
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("invalid session id {session:?}: {reason}")]
    InvalidSessionId {
        session: String,
        reason: &'static str,
    },
    #[error("history I/O failed on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode history entry: {0}")]
    Encode(#[source] serde_json::Error),
}
