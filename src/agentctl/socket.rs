//! The unix socket between `agentctl serve` and its clients: where it lives, how it is bound,
//! and the hello line that opens every connection.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::{UnixListener, UnixStream};

use super::AgentctlError;
use crate::jsonrpc::code::BUSY;
use crate::jsonrpc::error_message;

/// `sockaddr_un.sun_path` is 108 bytes on Linux, including the terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The socket's place inside the workspace when neither `--socket` nor
/// `$KANDEV_AGENTCTL_SOCKET` is given.
pub const WORKSPACE_SOCKET: &str = ".kandev/agentctl.sock";

/// The first line of every connection.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub mode: Mode,
    /// acp only: replace a connected client instead of being refused as busy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub takeover: bool,
    /// events only: first replay the journal entries after this sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// events only: end after the replay and the snapshot instead of following live.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
    /// events only: follow live only while a prompt is active; end once the agent is idle.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_idle: bool,
    /// acp only: this client answers the agent's permission requests itself; without it they
    /// go to the session's policy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permissions: bool,
    /// answer only: the held permission request to answer, and the kind of option to choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<PermissionAnswer>,
}

/// A person's answer to a held permission request (`agentctl answer`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PermissionAnswer {
    pub request: String,
    pub option_kind: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A JSON-RPC bridge to the agent.
    Acp,
    /// A stream of event lines.
    Events,
    /// One answer to a held permission request; serve writes one result line and closes.
    Answer,
}

impl Hello {
    /// A hello of `mode` with nothing else asked for.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            takeover: false,
            since: None,
            once: false,
            until_idle: false,
            permissions: false,
            answer: None,
        }
    }

    pub fn line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|_| match self.mode {
            Mode::Acp => r#"{"mode":"acp"}"#.to_owned(),
            Mode::Events => r#"{"mode":"events"}"#.to_owned(),
            Mode::Answer => r#"{"mode":"answer"}"#.to_owned(),
        });
        line.push('\n');
        line
    }
}

/// The socket path: `--socket` / `$KANDEV_AGENTCTL_SOCKET` if given, else
/// `<workspace>/.kandev/agentctl.sock`; rejected if too long for a unix socket.
pub fn resolve_socket_path(
    socket: Option<&Path>,
    workspace: Option<&Path>,
) -> Result<PathBuf, AgentctlError> {
    let path = match (socket, workspace) {
        (Some(socket), _) => socket.to_owned(),
        (None, Some(workspace)) => workspace.join(WORKSPACE_SOCKET),
        (None, None) => return Err(AgentctlError::NoSocket),
    };
    check_socket_path(&path)?;
    Ok(path)
}

/// Unix socket paths must fit `sun_path`; a longer one would fail with a cryptic EINVAL.
pub fn check_socket_path(path: &Path) -> Result<(), AgentctlError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(AgentctlError::SocketPathTooLong {
            path: path.to_owned(),
            len,
        });
    }
    Ok(())
}

/// Binds the serve socket. A socket file left by a dead agentctl (the pod restarted on the
/// same volume) is replaced; a live one means a second serve, which is refused so two agents
/// never share one workspace. The socket is made owner-only: it controls the agent.
pub async fn bind(path: &Path) -> Result<UnixListener, AgentctlError> {
    check_socket_path(path)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(AgentctlError::io(format!(
            "cannot create the socket directory {}",
            parent.display()
        )))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(AgentctlError::AlreadyServing {
                    path: path.to_owned(),
                });
            }
            tracing::info!(path = %path.display(), "removing a stale socket");
            std::fs::remove_file(path).map_err(AgentctlError::io(format!(
                "cannot remove the stale socket {}",
                path.display()
            )))?;
        }
        Ok(_) => {
            return Err(AgentctlError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| AgentctlError::Bind {
        path: path.to_owned(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(
        AgentctlError::io(format!("cannot restrict the socket {}", path.display())),
    )?;
    Ok(listener)
}

/// Connects a client, turning the usual failures into messages that say what to check.
pub async fn connect(path: &Path) -> Result<UnixStream, AgentctlError> {
    check_socket_path(path)?;
    UnixStream::connect(path)
        .await
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => AgentctlError::SocketMissing {
                path: path.to_owned(),
            },
            std::io::ErrorKind::ConnectionRefused => AgentctlError::SocketRefused {
                path: path.to_owned(),
            },
            _ => AgentctlError::Connect {
                path: path.to_owned(),
                source,
            },
        })
}

/// The message a busy agentctl sends before closing the connection.
pub const BUSY_MESSAGE: &str = "agentctl busy: another client is connected";

/// The busy error line, byte for byte as documented for `agentctl serve` (a literal, so the
/// key order does not depend on serde_json's map features).
pub const BUSY_LINE: &str = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"agentctl busy: another client is connected"}}"#;

/// The busy error as a value.
pub fn busy_message() -> Value {
    error_message(Value::Null, BUSY, BUSY_MESSAGE)
}

/// Whether `value` is agentctl's busy error (how `agentctl connect` recognises it).
pub fn is_busy_error(value: &Value) -> bool {
    value.get("id") == Some(&Value::Null)
        && value.pointer("/error/code").and_then(Value::as_i64) == Some(BUSY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn busy_line_is_exact_and_recognised() {
        let parsed: Value = serde_json::from_str(BUSY_LINE).unwrap_or_default();
        assert_eq!(parsed, busy_message());
        assert!(is_busy_error(&busy_message()));
        assert!(!is_busy_error(&error_message(json!(1), BUSY, "x")));
    }

    #[test]
    fn socket_path_resolution() {
        let ws = Path::new("/workspace");
        assert_eq!(
            resolve_socket_path(None, Some(ws)).ok(),
            Some(PathBuf::from("/workspace/.kandev/agentctl.sock"))
        );
        assert_eq!(
            resolve_socket_path(Some(Path::new("/tmp/a.sock")), Some(ws)).ok(),
            Some(PathBuf::from("/tmp/a.sock"))
        );
        assert!(matches!(
            resolve_socket_path(None, None),
            Err(AgentctlError::NoSocket)
        ));
        let exact = format!("/{}", "a".repeat(MAX_SOCKET_PATH_BYTES - 1));
        assert!(check_socket_path(Path::new(&exact)).is_ok());
        let long = format!("/{}", "a".repeat(MAX_SOCKET_PATH_BYTES));
        let message = check_socket_path(Path::new(&long))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("108 bytes"), "{message}");
        assert!(message.contains("--socket"), "{message}");
    }

    #[test]
    fn hello_lines() {
        let acp = Hello::new(Mode::Acp);
        assert_eq!(acp.line(), "{\"mode\":\"acp\"}\n");
        let parsed: Result<Hello, _> = serde_json::from_str(r#"{"mode":"events"}"#);
        assert_eq!(parsed.ok(), Some(Hello::new(Mode::Events)));
        let since: Result<Hello, _> =
            serde_json::from_str(r#"{"mode":"events","since":41,"once":true}"#);
        assert_eq!(
            since.map(|h| (h.since, h.once)).ok(),
            Some((Some(41), true))
        );
        let takeover: Result<Hello, _> = serde_json::from_str(r#"{"mode":"acp","takeover":true}"#);
        assert_eq!(takeover.map(|h| h.takeover).ok(), Some(true));
        assert!(serde_json::from_str::<Hello>(r#"{"mode":"http"}"#).is_err());
    }

    #[tokio::test]
    async fn bind_replaces_stale_sockets_and_refuses_live_ones()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sub/agentctl.sock");
        let listener = bind(&path).await?;
        assert!(matches!(
            bind(&path).await,
            Err(AgentctlError::AlreadyServing { .. })
        ));
        drop(listener);
        // The file stays behind, stale: a new serve takes it over.
        assert!(path.exists());
        let _listener = bind(&path).await?;
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let file = dir.path().join("file");
        std::fs::write(&file, "x")?;
        assert!(matches!(
            bind(&file).await,
            Err(AgentctlError::NotASocket { .. })
        ));
        let missing = dir.path().join("missing.sock");
        assert!(matches!(
            connect(&missing).await,
            Err(AgentctlError::SocketMissing { .. })
        ));
        Ok(())
    }
}
