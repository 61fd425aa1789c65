//! The client subcommands: `agentctl connect` (the exec entrypoint bridging stdin/stdout to the
//! served agent) and `agentctl events` (the operator's event feed).
//!
//! Neither relies on stdin reaching EOF: kwok (and some exec transports) never close an exec'd
//! process's stdin, so `connect` ends on the `_kandev/disconnect` notification or when serve
//! closes the socket, and `events` never reads stdin at all.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedReadHalf;

use crate::jsonrpc::codec::{Frame, LINE_LIMIT, LineReader, write_line};
use crate::jsonrpc::cost;

use super::AgentctlError;
use super::socket::{self, Hello, Mode};
use crate::jsonrpc;

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
    /// stdin sent a line over the limit, or too dense to parse: the connection is closed
    /// without it.
    Refused(AgentctlError),
}

/// How long serve may take to answer `agentctl answer`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// `agentctl answer`: one answer to a held permission request; prints serve's result line.
pub async fn answer(
    socket_path: &Path,
    request: &str,
    option_kind: &str,
) -> Result<(), AgentctlError> {
    let stream = socket::connect(socket_path).await?;
    let (read, mut write) = stream.into_split();
    let hello = Hello {
        answer: Some(socket::PermissionAnswer {
            request: request.to_owned(),
            option_kind: option_kind.to_owned(),
        }),
        ..Hello::new(Mode::Answer)
    };
    write
        .write_all(hello.line().as_bytes())
        .await
        .map_err(AgentctlError::io("cannot send the hello line"))?;
    let mut reader = LineReader::new(BufReader::new(read), LINE_LIMIT);
    let line = match tokio::time::timeout(ANSWER_TIMEOUT, reader.next_line()).await {
        Ok(Ok(Frame::Line)) => String::from_utf8_lossy(reader.line()).into_owned(),
        Ok(_) => {
            return Err(AgentctlError::io("agentctl closed without answering")(
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        Err(_) => {
            return Err(AgentctlError::Silent {
                path: socket_path.to_owned(),
                seconds: ANSWER_TIMEOUT.as_secs(),
            });
        }
    };
    println!("{line}");
    let result: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    match result.get("refused").and_then(Value::as_str) {
        Some(why) => Err(AgentctlError::AnswerRefused(why.to_owned())),
        None => Ok(()),
    }
}

/// `agentctl connect`: bridges stdin/stdout to the served agent, line by line. Lines from
/// stdin may be 1 MiB long, lines from serve `replay_line_limit` (serve enforces the limits on
/// the agent; a longer line here means the two disagree).
pub async fn connect(
    socket_path: &Path,
    takeover: bool,
    permissions: bool,
    replay_line_limit: usize,
) -> Result<(), AgentctlError> {
    let stream = socket::connect(socket_path).await?;
    let (read, mut write) = stream.into_split();
    let hello = Hello {
        takeover,
        permissions,
        ..Hello::new(Mode::Acp)
    };
    write
        .write_all(hello.line().as_bytes())
        .await
        .map_err(AgentctlError::io("cannot send the hello line"))?;

    let mut stdin_task = tokio::spawn(async move {
        let mut stdin = LineReader::new(BufReader::new(tokio::io::stdin()), LINE_LIMIT);
        loop {
            match stdin.next_line().await {
                Ok(Frame::Eof) | Err(_) => {
                    let _ = write.shutdown().await;
                    return StdinEnd::Eof;
                }
                Ok(Frame::TooLong { len }) => {
                    tracing::error!(
                        len,
                        limit = LINE_LIMIT,
                        "over-long line on stdin; closing the connection"
                    );
                    let _ = write.shutdown().await;
                    return StdinEnd::Refused(AgentctlError::LineTooLong {
                        what: "stdin",
                        limit: LINE_LIMIT,
                    });
                }
                Ok(Frame::TooCostly { len, cost }) => {
                    tracing::error!(
                        len,
                        cost,
                        "line too dense to parse on stdin; closing the connection"
                    );
                    let _ = write.shutdown().await;
                    return StdinEnd::Refused(AgentctlError::LineTooDense {
                        what: "stdin",
                        cost,
                        bound: cost::bound(LINE_LIMIT),
                    });
                }
                Ok(Frame::Line) => {
                    let line = String::from_utf8_lossy(stdin.line());
                    let line = line.as_ref();
                    if line.trim().is_empty() {
                        continue;
                    }
                    if write_line(&mut write, line).await.is_err() {
                        return StdinEnd::SocketClosed;
                    }
                    if jsonrpc::is_disconnect(line) {
                        return StdinEnd::Disconnect;
                    }
                }
            }
        }
    });

    let pump = pump_socket_to_stdout(read, tokio::io::stdout(), true, replay_line_limit, None);
    tokio::pin!(pump);
    tokio::select! {
        pumped = &mut pump => {
            stdin_task.abort();
            pumped.map_err(|end| end.into_error(socket_path))
        }
        end = &mut stdin_task => {
            let refused = match end {
                Ok(StdinEnd::Disconnect) => {
                    tracing::debug!("disconnect forwarded; waiting for agentctl to close");
                    None
                }
                Ok(StdinEnd::Eof) => {
                    tracing::debug!("stdin closed; waiting for agentctl to close");
                    None
                }
                Ok(StdinEnd::Refused(error)) => {
                    tracing::debug!("stdin closed; waiting for agentctl to close");
                    Some(error)
                }
                Ok(StdinEnd::SocketClosed) | Err(_) => None,
            };
            let pumped = match tokio::time::timeout(GOODBYE_TIMEOUT, &mut pump).await {
                Ok(pumped) => pumped.map_err(|end| end.into_error(socket_path)),
                Err(_) => {
                    tracing::warn!("agentctl did not close the connection after the disconnect");
                    Ok(())
                }
            };
            match (pumped, refused) {
                (Ok(()), Some(error)) => Err(error),
                (pumped, _) => pumped,
            }
        }
    }
}

/// `agentctl events` gives up when serve sends nothing for this long: serve answers the hello
/// at once and sends a heartbeat every [`super::serve::HEARTBEAT`] while the stream is open.
pub const EVENTS_SILENCE_LIMIT: Duration = Duration::from_secs(30);

/// `agentctl events`: copies event lines to stdout until serve closes the socket; fails when
/// serve sends nothing for [`EVENTS_SILENCE_LIMIT`] (a serve that stopped answering).
pub async fn events(
    socket_path: &Path,
    since: Option<u64>,
    once: bool,
    until_idle: bool,
) -> Result<(), AgentctlError> {
    let stream = socket::connect(socket_path).await?;
    let (read, mut write) = stream.into_split();
    let hello = Hello {
        since,
        once,
        until_idle,
        ..Hello::new(Mode::Events)
    };
    write
        .write_all(hello.line().as_bytes())
        .await
        .map_err(AgentctlError::io("cannot send the hello line"))?;
    let pumped = pump_socket_to_stdout(
        read,
        tokio::io::stdout(),
        false,
        LINE_LIMIT,
        Some(EVENTS_SILENCE_LIMIT),
    )
    .await;
    drop(write);
    pumped.map_err(|end| end.into_error(socket_path))
}

/// Why copying from serve stopped, other than the socket closing.
enum PumpEnd {
    /// serve refused the acp connection.
    Busy,
    /// serve sent a line longer than the limit (dropped, never buffered).
    TooLong { limit: usize },
    /// serve sent a line too dense to parse (dropped unparsed).
    TooDense { cost: usize, bound: usize },
    /// serve sent nothing for this long.
    Silent(Duration),
}

impl PumpEnd {
    fn into_error(self, path: &Path) -> AgentctlError {
        match self {
            Self::Busy => AgentctlError::Busy {
                path: path.to_owned(),
            },
            Self::TooLong { limit } => AgentctlError::LineTooLong {
                what: "agentctl serve",
                limit,
            },
            Self::TooDense { cost, bound } => AgentctlError::LineTooDense {
                what: "agentctl serve",
                cost,
                bound,
            },
            Self::Silent(limit) => AgentctlError::Silent {
                path: path.to_owned(),
                seconds: limit.as_secs(),
            },
        }
    }
}

/// Copies lines of at most `limit` bytes from serve to `out` (flushed per line) until the
/// socket closes. With `detect_busy`, a first line that is agentctl's busy error is still
/// copied (a JSON-RPC client sees a protocol error) and then reported as [`PumpEnd::Busy`].
/// With `silence`, serve sending nothing for that long is [`PumpEnd::Silent`].
async fn pump_socket_to_stdout(
    read: OwnedReadHalf,
    mut out: impl AsyncWrite + Unpin,
    detect_busy: bool,
    limit: usize,
    silence: Option<Duration>,
) -> Result<(), PumpEnd> {
    let mut reader = LineReader::new(BufReader::new(read), limit);
    let mut first = true;
    loop {
        let next = match silence {
            Some(silence) => match tokio::time::timeout(silence, reader.next_line()).await {
                Ok(next) => next,
                Err(_) => {
                    tracing::error!(?silence, "agentctl serve sent nothing; giving up");
                    return Err(PumpEnd::Silent(silence));
                }
            },
            None => reader.next_line().await,
        };
        match next {
            Ok(Frame::Eof) | Err(_) => return Ok(()),
            Ok(Frame::TooLong { len }) => {
                tracing::error!(len, limit, "over-long line from agentctl serve; closing");
                return Err(PumpEnd::TooLong { limit });
            }
            Ok(Frame::TooCostly { len, cost }) => {
                tracing::error!(
                    len,
                    cost,
                    "line too dense to parse from agentctl serve; closing"
                );
                return Err(PumpEnd::TooDense {
                    cost,
                    bound: cost::bound(limit),
                });
            }
            Ok(Frame::Line) => {
                let line = reader.line();
                if write_line(&mut out, line).await.is_err() {
                    // Nobody reads our stdout any more: nothing left to bridge.
                    return Ok(());
                }
                if first && detect_busy {
                    let busy = serde_json::from_slice::<Value>(line)
                        .is_ok_and(|value| socket::is_busy_error(&value));
                    if busy {
                        return Err(PumpEnd::Busy);
                    }
                }
                first = false;
            }
        }
    }
}
