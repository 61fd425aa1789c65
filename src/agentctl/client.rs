//! The client subcommands: `agentctl connect` (the exec entrypoint bridging stdin/stdout to the
//! served agent) and `agentctl events` (the operator's event feed).
//!
//! Neither relies on stdin reaching EOF: kwok (and some exec transports) never close an exec'd
//! process's stdin, so `connect` ends on the `_kandev/disconnect` notification or when serve
//! closes the socket, and `events` never reads stdin at all.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedReadHalf;

use super::socket::{self, Hello, Mode};
use super::{AgentctlError, wire};

/// After the client said goodbye (disconnect or stdin EOF), how long to wait for serve to close
/// the connection. Waiting matters: once connect exits, serve has already released the client
/// slot, so an immediate reconnect is not refused as busy.
const GOODBYE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the client side of `connect` ended.
enum StdinEnd {
    /// `_kandev/disconnect` was forwarded.
    Disconnect,
    /// stdin closed (EOF): treated as a disconnect too.
    Eof,
    /// The socket cannot be written any more (serve went away).
    SocketClosed,
}

/// `agentctl connect`: bridges stdin/stdout to the served agent, line by line.
pub async fn connect(socket_path: &Path, takeover: bool) -> Result<(), AgentctlError> {
    let stream = socket::connect(socket_path).await?;
    let (read, mut write) = stream.into_split();
    let hello = Hello {
        mode: Mode::Acp,
        takeover,
    };
    write
        .write_all(hello.line().as_bytes())
        .await
        .map_err(AgentctlError::io("cannot send the hello line"))?;

    let mut stdin_task = tokio::spawn(async move {
        let mut stdin = BufReader::new(tokio::io::stdin());
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match stdin.read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = write.shutdown().await;
                    return StdinEnd::Eof;
                }
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']);
                    if line.trim().is_empty() {
                        continue;
                    }
                    let mut bytes = line.as_bytes().to_vec();
                    bytes.push(b'\n');
                    if write.write_all(&bytes).await.is_err() || write.flush().await.is_err() {
                        return StdinEnd::SocketClosed;
                    }
                    if wire::is_disconnect(line) {
                        return StdinEnd::Disconnect;
                    }
                }
            }
        }
    });

    let pump = pump_socket_to_stdout(read, tokio::io::stdout(), true);
    tokio::pin!(pump);
    tokio::select! {
        pumped = &mut pump => {
            stdin_task.abort();
            pumped.map_err(|busy| busy.into_error(socket_path))
        }
        end = &mut stdin_task => {
            match end {
                Ok(StdinEnd::Disconnect) => tracing::debug!("disconnect forwarded; waiting for agentctl to close"),
                Ok(StdinEnd::Eof) => tracing::debug!("stdin closed; waiting for agentctl to close"),
                Ok(StdinEnd::SocketClosed) | Err(_) => {}
            }
            match tokio::time::timeout(GOODBYE_TIMEOUT, &mut pump).await {
                Ok(pumped) => pumped.map_err(|busy| busy.into_error(socket_path)),
                Err(_) => {
                    tracing::warn!("agentctl did not close the connection after the disconnect");
                    Ok(())
                }
            }
        }
    }
}

/// `agentctl events`: copies event lines to stdout until serve closes the socket.
pub async fn events(socket_path: &Path) -> Result<(), AgentctlError> {
    let stream = socket::connect(socket_path).await?;
    let (read, mut write) = stream.into_split();
    let hello = Hello {
        mode: Mode::Events,
        takeover: false,
    };
    write
        .write_all(hello.line().as_bytes())
        .await
        .map_err(AgentctlError::io("cannot send the hello line"))?;
    let pumped = pump_socket_to_stdout(read, tokio::io::stdout(), false).await;
    drop(write);
    pumped.map_err(|busy| busy.into_error(socket_path))
}

/// serve refused the acp connection.
struct BusyRefusal;

impl BusyRefusal {
    fn into_error(self, path: &Path) -> AgentctlError {
        AgentctlError::Busy {
            path: path.to_owned(),
        }
    }
}

/// Copies lines from serve to `out` (flushed per line) until the socket closes. With
/// `detect_busy`, a first line that is agentctl's busy error is still copied (a JSON-RPC
/// client sees a protocol error) and then reported as [`BusyRefusal`].
async fn pump_socket_to_stdout(
    read: OwnedReadHalf,
    mut out: impl AsyncWrite + Unpin,
    detect_busy: bool,
) -> Result<(), BusyRefusal> {
    let mut reader = BufReader::new(read);
    let mut buf = Vec::new();
    let mut first = true;
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {
                if !buf.ends_with(b"\n") {
                    buf.push(b'\n');
                }
                if out.write_all(&buf).await.is_err() || out.flush().await.is_err() {
                    // Nobody reads our stdout any more: nothing left to bridge.
                    return Ok(());
                }
                if first && detect_busy {
                    let busy = serde_json::from_slice::<Value>(&buf)
                        .is_ok_and(|value| wire::is_busy_error(&value));
                    if busy {
                        return Err(BusyRefusal);
                    }
                }
                first = false;
            }
        }
    }
}
