//! `agentctl history`: prints a session's recorded history (the JSONL file serve writes under
//! `<workspace>/.kandev/sessions/`) byte for byte, so a client (`kubectl kandev history`) needs
//! nothing in the container but agentctl itself.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

use super::AgentctlError;
use crate::history::HistoryStore;

/// Where the history to print is: an explicit file, or the session's file in the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistorySource<'a> {
    File(&'a Path),
    Session {
        workspace: &'a Path,
        session: Option<&'a str>,
    },
}

/// The history file `source` names (pure: no file is touched). A session name is validated,
/// so it cannot point outside `<workspace>/.kandev/sessions`.
pub fn history_file(source: &HistorySource<'_>) -> Result<PathBuf, AgentctlError> {
    match source {
        HistorySource::File(path) => Ok(path.to_path_buf()),
        HistorySource::Session { session: None, .. } => Err(AgentctlError::NoSessionName),
        HistorySource::Session {
            workspace,
            session: Some(session),
        } => HistoryStore::new(workspace.join(".kandev").join("sessions"))
            .path_for(session)
            .map_err(AgentctlError::InvalidSessionName),
    }
}

/// Copies the history file to stdout. A missing file is [`AgentctlError::NoHistory`].
pub async fn print_history(source: &HistorySource<'_>) -> Result<(), AgentctlError> {
    let path = history_file(source)?;
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let session = match source {
                HistorySource::Session {
                    session: Some(session),
                    ..
                } => Some((*session).to_owned()),
                _ => None,
            };
            return Err(AgentctlError::NoHistory { session, path });
        }
        Err(source) => {
            return Err(AgentctlError::Io {
                context: format!("cannot open the history {}", path.display()),
                source,
            });
        }
    };
    let mut stdout = tokio::io::stdout();
    tokio::io::copy(&mut file, &mut stdout)
        .await
        .map_err(AgentctlError::io(format!(
            "cannot print the history {}",
            path.display()
        )))?;
    stdout
        .flush()
        .await
        .map_err(AgentctlError::io("cannot flush stdout"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_file_is_printed() {
        let workspace = Path::new("/workspace");
        let file = Path::new("/tmp/h.jsonl");
        #[rustfmt::skip]
        let rows: Vec<(HistorySource<'_>, Result<&str, &str>)> = vec![
            (HistorySource::Session { workspace, session: Some("fix-login") },
             Ok("/workspace/.kandev/sessions/fix-login.jsonl")),
            (HistorySource::Session { workspace: Path::new("."), session: Some("a") },
             Ok("./.kandev/sessions/a.jsonl")),
            (HistorySource::File(file), Ok("/tmp/h.jsonl")),
            (HistorySource::Session { workspace, session: None }, Err("no session name")),
            (HistorySource::Session { workspace, session: Some("../etc/passwd") },
             Err("invalid --session-name")),
            (HistorySource::Session { workspace, session: Some("") },
             Err("invalid --session-name")),
        ];
        for (source, expected) in rows {
            let got = history_file(&source);
            match (got, expected) {
                (Ok(path), Ok(want)) => assert_eq!(path, PathBuf::from(want), "{source:?}"),
                (Err(error), Err(want)) => {
                    assert!(error.to_string().contains(want), "{source:?}: {error}")
                }
                (got, want) => panic!("{source:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
