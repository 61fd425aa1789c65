//! `agentctl serve`: the I/O around the [`Hub`]. It owns the agent process, the unix socket,
//! the client connections, the events fan-out and the history writer; every decision is the
//! hub's.
//!
//! One task ("the driver") owns the hub and processes inputs one at a time from a single
//! queue (agent lines, client lines, connections opening and closing, the agent's exit), so
//! the order of messages on the agent's stdin is the order in which they were decided.
//! Small helper tasks only move bytes: the agent's stdout and stdin, each client's read and
//! write halves, each events subscriber, and the history writer.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::{AbortHandle, JoinSet};

use super::hub::{ConnId, Hub, HubConfig, Output, inject_history};
use super::launch::LaunchPlan;
use super::socket::{self, Hello, Mode};
use super::time::now_rfc3339;
use super::{AgentctlError, wire};
use crate::history::{HistoryEntry, HistoryStore};

/// How long a new connection may take to send its hello line.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// A client that just closed its socket may not have been noticed yet when the next one says
/// hello (a reconnect right after a disconnect); the newcomer is re-checked this often…
const BUSY_RECHECK: Duration = Duration::from_millis(100);
/// …this many times before it is told agentctl is busy.
const BUSY_RECHECKS: u8 = 10;
/// Events buffered per subscriber; one that falls further behind is disconnected (it would
/// otherwise silently miss events).
const EVENTS_BUFFER: usize = 4096;
/// After SIGTERM the agent gets this long to exit on its own (stdin closed) before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long to let connections and subscribers drain their last lines on the way out.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// Everything `serve` needs, resolved by the CLI layer.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub socket: PathBuf,
    pub launch: LaunchPlan,
    /// The agent's working directory.
    pub cwd: PathBuf,
    /// `<workspace>/.kandev/sessions`.
    pub history_dir: PathBuf,
    pub hub: HubConfig,
    pub initialize_timeout: Duration,
}

/// Runs serve until the agent exits (an error: the pod must die) or SIGTERM/SIGINT stops it
/// (success: the pod is being deleted).
pub async fn serve(options: ServeOptions) -> Result<(), AgentctlError> {
    let listener = socket::bind(&options.socket).await?;
    tracing::info!(socket = %options.socket.display(), "listening for agentctl clients");
    let result = run(&options, listener).await;
    if let Err(error) = std::fs::remove_file(&options.socket) {
        tracing::debug!(%error, "socket already gone");
    }
    result
}

async fn run(options: &ServeOptions, listener: UnixListener) -> Result<(), AgentctlError> {
    let (inputs_tx, inputs_rx) = mpsc::unbounded_channel();
    let agent = spawn_agent(options, inputs_tx.clone())?;
    let (events, _) = broadcast::channel(EVENTS_BUFFER);
    let mut driver = Driver {
        hub: Hub::new(options.hub.clone()),
        agent_stdin: Some(agent.stdin),
        kill: Some(agent.kill),
        agent_exited: false,
        clients: HashMap::new(),
        events: Some(events),
        history: HistoryWriter::spawn(HistoryStore::new(options.history_dir.clone())),
        inputs_tx,
        inputs_rx,
        tasks: JoinSet::new(),
        next_conn: 0,
    };
    let started = driver.hub.start();
    let result = match driver.apply(started).await {
        Ok(()) => {
            driver
                .main_loop(&listener, options.initialize_timeout)
                .await
        }
        Err(error) => Err(error),
    };
    driver.shutdown().await;
    result
}

enum Input {
    AgentLine(String),
    AgentExited(ExitStatus),
    Hello {
        conn: ConnId,
        hello: Hello,
        reader: BufReader<OwnedReadHalf>,
        writer: OwnedWriteHalf,
        attempt: u8,
    },
    ClientLine {
        conn: ConnId,
        line: String,
    },
    ClientClosed {
        conn: ConnId,
    },
}

struct AgentHandles {
    stdin: mpsc::UnboundedSender<String>,
    kill: oneshot::Sender<()>,
}

/// Starts the agent and the tasks around it: stdout → `Input::AgentLine`, a stdin writer fed
/// by the returned sender (dropping it closes the agent's stdin), and a waiter that kills the
/// agent on request (or when the sender is dropped) and reports its exit after its last line.
fn spawn_agent(
    options: &ServeOptions,
    inputs: mpsc::UnboundedSender<Input>,
) -> Result<AgentHandles, AgentctlError> {
    let argv = &options.launch.argv;
    let program = argv.first().ok_or(AgentctlError::NoCommand)?;
    let mut child = tokio::process::Command::new(program)
        .args(&argv[1..])
        .envs(&options.launch.env)
        .current_dir(&options.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // The agent's own diagnostics go to the container log, next to ours.
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| AgentctlError::SpawnAgent {
            program: program.clone(),
            source,
        })?;
    tracing::info!(
        pid = child.id(),
        ?argv,
        cwd = %options.cwd.display(),
        via_cli_resume = options.launch.via_cli_resume,
        "agent started"
    );
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(AgentctlError::Io {
            context: "the agent's stdio is not piped".into(),
            source: std::io::Error::other("missing pipe"),
        });
    };

    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(write_agent_stdin(stdin, stdin_rx));

    let line_inputs = inputs.clone();
    let reader = tokio::spawn(async move {
        read_lines(stdout, |line| {
            line_inputs.send(Input::AgentLine(line)).is_ok()
        })
        .await;
        tracing::debug!("agent stdout closed");
    });

    let (kill_tx, kill_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let status = tokio::select! {
            status = child.wait() => status,
            _ = kill_rx => {
                tracing::info!("killing the agent");
                if let Err(error) = child.start_kill() {
                    tracing::warn!(%error, "cannot kill the agent");
                }
                child.wait().await
            }
        };
        // Let the reader hand over everything the agent wrote before it exited; a grandchild
        // holding stdout open must not stall the exit, hence the timeout.
        if tokio::time::timeout(Duration::from_secs(2), reader)
            .await
            .is_err()
        {
            tracing::warn!("agent stdout still open after the agent exited");
        }
        match status {
            Ok(status) => {
                let _ = inputs.send(Input::AgentExited(status));
            }
            Err(error) => {
                tracing::error!(%error, "cannot wait for the agent");
                let _ = inputs.send(Input::AgentExited(ExitStatus::from_raw(1 << 8)));
            }
        }
    });
    Ok(AgentHandles {
        stdin: stdin_tx,
        kill: kill_tx,
    })
}

async fn write_agent_stdin(
    mut stdin: tokio::process::ChildStdin,
    mut lines: mpsc::UnboundedReceiver<String>,
) {
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        let written = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        if let Err(error) = written.await {
            tracing::warn!(%error, "cannot write to the agent's stdin");
            return;
        }
    }
    tracing::debug!("closing the agent's stdin");
}

/// Calls `on_line` for every non-empty line (newline stripped, invalid UTF-8 replaced) until
/// EOF, an error, or `on_line` returning false.
async fn read_lines(source: impl AsyncRead + Unpin, mut on_line: impl FnMut(String) -> bool) {
    read_buffered_lines(BufReader::new(source), &mut on_line).await;
}

async fn read_buffered_lines(
    mut reader: impl tokio::io::AsyncBufRead + Unpin,
    on_line: &mut impl FnMut(String) -> bool,
) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.trim().is_empty() {
                    continue;
                }
                if !on_line(line.to_owned()) {
                    return;
                }
            }
            Err(error) => {
                tracing::debug!(%error, "read failed");
                return;
            }
        }
    }
}

struct ClientHandle {
    lines: mpsc::UnboundedSender<String>,
    reader: AbortHandle,
}

struct Driver {
    hub: Hub,
    agent_stdin: Option<mpsc::UnboundedSender<String>>,
    kill: Option<oneshot::Sender<()>>,
    agent_exited: bool,
    clients: HashMap<ConnId, ClientHandle>,
    events: Option<broadcast::Sender<String>>,
    history: HistoryWriter,
    inputs_tx: mpsc::UnboundedSender<Input>,
    inputs_rx: mpsc::UnboundedReceiver<Input>,
    /// Connection writers and subscribers, drained on the way out.
    tasks: JoinSet<()>,
    next_conn: ConnId,
}

impl Driver {
    async fn main_loop(
        &mut self,
        listener: &UnixListener,
        initialize_timeout: Duration,
    ) -> Result<(), AgentctlError> {
        let mut sigterm =
            signal(SignalKind::terminate()).map_err(AgentctlError::io("cannot handle SIGTERM"))?;
        let mut sigint =
            signal(SignalKind::interrupt()).map_err(AgentctlError::io("cannot handle SIGINT"))?;
        let initialize_deadline = tokio::time::sleep(initialize_timeout);
        tokio::pin!(initialize_deadline);
        // Armed by SIGTERM/SIGINT; until then far in the future.
        let stop_deadline = tokio::time::sleep(Duration::from_secs(100 * 365 * 86_400));
        tokio::pin!(stop_deadline);
        let mut stopping = false;
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => self.accept(stream),
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(input) = self.inputs_rx.recv() => {
                    if let Input::AgentExited(status) = input {
                        self.on_agent_exited(status).await?;
                        return if stopping {
                            Ok(())
                        } else {
                            Err(AgentctlError::AgentExited { status: status.to_string() })
                        };
                    }
                    self.handle(input).await?;
                }
                _ = &mut initialize_deadline, if self.hub.initializing() => {
                    return Err(AgentctlError::InitializeTimeout {
                        seconds: initialize_timeout.as_secs(),
                    });
                }
                _ = sigterm.recv(), if !stopping => {
                    stopping = true;
                    self.begin_stop(stop_deadline.as_mut(), "SIGTERM");
                }
                _ = sigint.recv(), if !stopping => {
                    stopping = true;
                    self.begin_stop(stop_deadline.as_mut(), "SIGINT");
                }
                _ = &mut stop_deadline, if stopping => {
                    tracing::warn!("the agent did not exit after its stdin closed");
                    if let Some(kill) = self.kill.take() {
                        let _ = kill.send(());
                    }
                }
            }
        }
    }

    /// The pod is being deleted: close the agent's stdin (ACP agents exit on EOF) and give it
    /// a grace period before SIGKILL.
    fn begin_stop(&mut self, deadline: std::pin::Pin<&mut tokio::time::Sleep>, signal: &str) {
        tracing::info!(signal, "stopping: closing the agent's stdin");
        self.agent_stdin = None;
        deadline.reset(tokio::time::Instant::now() + STOP_GRACE);
    }

    fn accept(&mut self, stream: tokio::net::UnixStream) {
        self.next_conn += 1;
        let conn = self.next_conn;
        let inputs = self.inputs_tx.clone();
        tokio::spawn(async move {
            let (read, mut writer) = stream.into_split();
            let mut reader = BufReader::new(read);
            let mut first = Vec::new();
            let read = tokio::time::timeout(HELLO_TIMEOUT, reader.read_until(b'\n', &mut first));
            let hello = match read.await {
                Ok(Ok(n)) if n > 0 => serde_json::from_slice::<Hello>(&first).ok(),
                _ => None,
            };
            match hello {
                Some(hello) => {
                    let _ = inputs.send(Input::Hello {
                        conn,
                        hello,
                        reader,
                        writer,
                        attempt: 0,
                    });
                }
                None => {
                    tracing::warn!(conn, "connection without a valid hello line; closed");
                    let error = wire::error_message(
                        Value::Null,
                        wire::INVALID_REQUEST,
                        r#"agentctl: the first line must be {"mode":"acp"} or {"mode":"events"}"#,
                    );
                    let _ = write_line(&mut writer, &error.to_string()).await;
                    let _ = writer.shutdown().await;
                }
            }
        });
    }

    async fn handle(&mut self, input: Input) -> Result<(), AgentctlError> {
        let out = match input {
            Input::AgentLine(line) => self.hub.agent_line(&line),
            Input::ClientLine { conn, line } => self.hub.client_line(conn, &line),
            Input::ClientClosed { conn } => {
                tracing::info!(conn, "client connection closed; the agent keeps running");
                self.hub.client_closed(conn)
            }
            Input::Hello {
                conn,
                hello,
                reader,
                writer,
                attempt,
            } => match hello.mode {
                Mode::Events => {
                    self.subscribe(conn, reader, writer);
                    Vec::new()
                }
                Mode::Acp => match self.hub.attach(conn, hello.takeover) {
                    Ok(out) => {
                        tracing::info!(conn, "ACP client connected");
                        self.register_client(conn, reader, writer);
                        out
                    }
                    Err(_busy) if attempt < BUSY_RECHECKS => {
                        let inputs = self.inputs_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(BUSY_RECHECK).await;
                            let _ = inputs.send(Input::Hello {
                                conn,
                                hello,
                                reader,
                                writer,
                                attempt: attempt + 1,
                            });
                        });
                        Vec::new()
                    }
                    Err(_busy) => {
                        tracing::warn!(conn, "second ACP client refused: busy");
                        let mut writer = writer;
                        self.tasks.spawn(async move {
                            let _ = write_line(&mut writer, wire::BUSY_LINE).await;
                            let _ = writer.shutdown().await;
                            drop(reader);
                        });
                        Vec::new()
                    }
                },
            },
            Input::AgentExited(_) => Vec::new(),
        };
        self.apply(out).await
    }

    fn register_client(
        &mut self,
        conn: ConnId,
        reader: BufReader<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
    ) {
        let (lines_tx, mut lines_rx) = mpsc::unbounded_channel::<String>();
        self.tasks.spawn(async move {
            while let Some(line) = lines_rx.recv().await {
                if let Err(error) = write_line(&mut writer, &line).await {
                    tracing::debug!(conn, %error, "client write failed");
                    break;
                }
            }
            let _ = writer.shutdown().await;
        });
        let inputs = self.inputs_tx.clone();
        let reader = tokio::spawn(async move {
            let mut reader = reader;
            read_buffered_lines(&mut reader, &mut |line| {
                inputs.send(Input::ClientLine { conn, line }).is_ok()
            })
            .await;
            let _ = inputs.send(Input::ClientClosed { conn });
        });
        self.clients.insert(
            conn,
            ClientHandle {
                lines: lines_tx,
                reader: reader.abort_handle(),
            },
        );
    }

    fn subscribe(
        &mut self,
        conn: ConnId,
        reader: BufReader<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
    ) {
        let Some(events) = &self.events else {
            return;
        };
        // Subscribed and snapshotted in the same driver step: no event falls in between.
        let mut receiver = events.subscribe();
        let snapshot = self.hub.snapshot().to_json(&now_rfc3339()).to_string();
        tracing::info!(conn, "events subscriber connected");
        self.tasks.spawn(async move {
            let mut reader = reader;
            let mut ignored = Vec::new();
            if write_line(&mut writer, &snapshot).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    event = receiver.recv() => match event {
                        Ok(line) => {
                            if write_line(&mut writer, &line).await.is_err() {
                                break;
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(missed)) => {
                            tracing::warn!(conn, missed, "events subscriber too slow; disconnected");
                            break;
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                    // Subscribers have nothing to say; reading only notices when they leave.
                    read = reader.read_until(b'\n', &mut ignored) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(_) => ignored.clear(),
                    },
                }
            }
            let _ = writer.shutdown().await;
            tracing::info!(conn, "events subscriber disconnected");
        });
    }

    /// Carries out the hub's outputs in order.
    async fn apply(&mut self, outputs: Vec<Output>) -> Result<(), AgentctlError> {
        for output in outputs {
            match output {
                Output::ToAgent(message) => self.send_agent(&message),
                Output::ToClient(conn, message) => {
                    if let Some(client) = self.clients.get(&conn) {
                        let _ = client.lines.send(message.to_string());
                    }
                }
                Output::CloseClient(conn) => {
                    if let Some(client) = self.clients.remove(&conn) {
                        client.reader.abort();
                        // Dropping the sender lets the writer flush what is queued, then close.
                    }
                }
                Output::Event(event) => {
                    let line = event.to_json(&now_rfc3339()).to_string();
                    tracing::info!(event = %line, "event");
                    if let Some(events) = &self.events {
                        // No subscriber is fine: events are a live feed, not a log.
                        let _ = events.send(line);
                    }
                }
                Output::Record {
                    history_session,
                    entry,
                } => self.history.append(history_session, stamped(entry)),
                Output::InjectHistoryThenSend {
                    history_session,
                    mut message,
                } => {
                    match self.history.read(history_session.clone()).await {
                        Ok(entries) => {
                            if inject_history(&mut message, &entries) {
                                tracing::info!(
                                    history_session,
                                    entries = entries.len(),
                                    "first prompt after a fresh start wrapped in the resume context"
                                );
                            } else {
                                tracing::info!(history_session, "no recorded history to inject");
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "cannot read history; prompt sent without resume context");
                        }
                    }
                    self.send_agent(&message);
                }
                Output::InitializeFailed { code, message } => {
                    return Err(AgentctlError::InitializeFailed { code, message });
                }
            }
        }
        Ok(())
    }

    fn send_agent(&self, message: &Value) {
        match &self.agent_stdin {
            Some(stdin) => {
                if stdin.send(message.to_string()).is_err() {
                    tracing::warn!("the agent's stdin is closed; message dropped");
                }
            }
            None => tracing::debug!("stopping: message to the agent dropped"),
        }
    }

    async fn on_agent_exited(&mut self, status: ExitStatus) -> Result<(), AgentctlError> {
        self.agent_exited = true;
        tracing::warn!(%status, "the agent exited");
        let out = self.hub.agent_exited(status.code(), status.signal());
        self.apply(out).await
    }

    /// Makes sure the agent is gone, then lets connections, subscribers and the history writer
    /// finish their last lines.
    async fn shutdown(&mut self) {
        if !self.agent_exited {
            if let Some(kill) = self.kill.take() {
                let _ = kill.send(());
            }
            let exited = tokio::time::timeout(DRAIN_TIMEOUT, async {
                while let Some(input) = self.inputs_rx.recv().await {
                    if let Input::AgentExited(status) = input {
                        return Some(status);
                    }
                }
                None
            })
            .await;
            if let Ok(Some(status)) = exited {
                let _ = self.on_agent_exited(status).await;
            }
        }
        self.agent_stdin = None;
        self.clients.clear();
        self.events = None;
        self.history.flush().await;
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::debug!("some connections did not drain in time");
            self.tasks.abort_all();
        }
    }
}

async fn write_line(writer: &mut OwnedWriteHalf, line: &str) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    writer.write_all(&bytes).await?;
    writer.flush().await
}

/// The entry with the current time, since the hub is clock-free.
fn stamped(entry: HistoryEntry) -> HistoryEntry {
    let now = Some(now_rfc3339());
    match entry {
        HistoryEntry::UserMessage { text, .. } => HistoryEntry::UserMessage {
            text,
            timestamp: now,
        },
        HistoryEntry::AgentMessage { text, .. } => HistoryEntry::AgentMessage {
            text,
            timestamp: now,
        },
        HistoryEntry::ToolCall { name, input, .. } => HistoryEntry::ToolCall {
            name,
            input,
            timestamp: now,
        },
        HistoryEntry::ToolResult { name, output, .. } => HistoryEntry::ToolResult {
            name,
            output,
            timestamp: now,
        },
    }
}

enum HistoryCommand {
    Append {
        session: String,
        entry: HistoryEntry,
    },
    Read {
        session: String,
        reply: oneshot::Sender<Result<Vec<HistoryEntry>, String>>,
    },
    Flush(oneshot::Sender<()>),
}

/// One task does all history I/O, in order, off the driver (the store is blocking). Reads go
/// through the same queue so they see every earlier append. A failing volume costs history,
/// never the agent: errors are logged.
struct HistoryWriter {
    commands: mpsc::UnboundedSender<HistoryCommand>,
}

impl HistoryWriter {
    fn spawn(store: HistoryStore) -> Self {
        let (commands, mut rx) = mpsc::unbounded_channel::<HistoryCommand>();
        tokio::spawn(async move {
            while let Some(command) = rx.recv().await {
                match command {
                    HistoryCommand::Append { session, entry } => {
                        let store = store.clone();
                        let appended =
                            tokio::task::spawn_blocking(move || store.append(&session, &entry))
                                .await;
                        match appended {
                            Ok(Ok(())) => {}
                            Ok(Err(error)) => tracing::warn!(%error, "cannot record history"),
                            Err(error) => tracing::warn!(%error, "history writer failed"),
                        }
                    }
                    HistoryCommand::Read { session, reply } => {
                        let store = store.clone();
                        let read = tokio::task::spawn_blocking(move || store.read(&session)).await;
                        let result = match read {
                            Ok(Ok(parsed)) => Ok(parsed.entries),
                            Ok(Err(error)) => Err(error.to_string()),
                            Err(error) => Err(error.to_string()),
                        };
                        let _ = reply.send(result);
                    }
                    HistoryCommand::Flush(reply) => {
                        let _ = reply.send(());
                    }
                }
            }
        });
        Self { commands }
    }

    fn append(&self, session: String, entry: HistoryEntry) {
        let _ = self
            .commands
            .send(HistoryCommand::Append { session, entry });
    }

    async fn read(&self, session: String) -> Result<Vec<HistoryEntry>, String> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(HistoryCommand::Read { session, reply })
            .map_err(|_| "history writer stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "history writer stopped".to_owned())?
    }

    /// Waits until every earlier command is done.
    async fn flush(&self) {
        let (reply, done) = oneshot::channel();
        if self.commands.send(HistoryCommand::Flush(reply)).is_ok() {
            let _ = done.await;
        }
    }
}
