//! `agentctl serve`: the I/O around the [`Hub`]. It owns the agent process, the unix socket,
//! the client connections, the events fan-out and the history writer; every decision is the
//! hub's.
//!
//! One task ("the driver") owns the hub and processes inputs one at a time from a single
//! queue (agent lines, client lines, connections opening and closing, the agent's exit), so
//! the order of messages on the agent's stdin is the order in which they were decided.
//! Small helper tasks only move bytes: the agent's stdout and stdin, each client's read and
//! write halves, each events subscriber, and the history writer.
//!
//! Memory is bounded: every line is read with [`crate::jsonrpc::codec`] (1 MiB; the replay line limit
//! from the agent while a `session/load` is open), the driver's queue is bounded (readers wait:
//! the agent's stdout and the clients' sockets are backpressured), a client that does not read
//! its lines within [`CLIENT_STALL`] is disconnected, and an agent that writes an over-long line
//! or leaves [`AGENT_INPUT_CAPACITY`] messages unread on its stdin is cut off: its client's open
//! requests are answered with [`crate::jsonrpc::code::AGENT_PROTOCOL_LIMIT`], the agent is killed, and serve
//! exits non-zero like for any agent exit.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::{AbortHandle, JoinSet};

use super::AgentctlError;
use super::events::{Event, EventLine};
use super::hub::{ConnId, Hub, HubConfig, Output, inject_history};
use super::journal::Journal;
use super::launch::LaunchPlan;
use super::socket::{self, Hello, Mode};
use super::time::now_rfc3339;
use crate::api::SUSPENDED;
use crate::history::{HistoryEntry, HistoryStore};
use crate::jsonrpc;
use crate::jsonrpc::AgentLimit;
use crate::jsonrpc::codec::{Frame, LINE_LIMIT, LineReader, write_line};
use crate::telemetry::WarnLimiter;

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
/// Inputs waiting for the driver; the tasks that read the agent and the clients wait when it is
/// full, which backpressures the agent's stdout and the clients' sockets.
const INPUTS_CAPACITY: usize = 256;
/// Lines waiting for the agent to read its stdin. We only write requests a client sent and
/// answers to the agent's own requests, so an agent that fills this is not reading: it is cut
/// off.
pub const AGENT_INPUT_CAPACITY: usize = 1024;
/// Lines waiting for one client's socket.
const CLIENT_QUEUE: usize = 64;
/// A client whose queue stays full this long (it stopped reading) is disconnected; meanwhile
/// the driver waits, which backpressures the agent.
pub const CLIENT_STALL: Duration = Duration::from_secs(30);
/// Longest hello line.
const HELLO_LIMIT: usize = 4096;

/// Everything `serve` needs, resolved by the CLI layer.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub socket: PathBuf,
    pub launch: LaunchPlan,
    /// The agent's working directory.
    pub cwd: PathBuf,
    /// `<workspace>/.kandev/sessions`.
    pub history_dir: PathBuf,
    /// `<workspace>/.kandev/journal.jsonl`.
    pub journal: PathBuf,
    /// The pod serve runs in (for the journal's entries).
    pub pod: Option<String>,
    pub hub: HubConfig,
    pub initialize_timeout: Duration,
    /// Longest line from the agent while a `session/load` is open (`--replay-line-limit-mib`).
    pub replay_line_limit: usize,
    /// An agent idle ([`Hub::idle`]) this long is stopped and serve ends with success: the
    /// session is suspended (`--suspend-idle-after`). `None`: never.
    pub suspend_idle_after: Option<Duration>,
    /// Where the suspension is written for the container's termination message.
    pub termination_log: Option<PathBuf>,
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
    let (inputs_tx, inputs_rx) = mpsc::channel(INPUTS_CAPACITY);
    let stdout_limit = Arc::new(AtomicUsize::new(LINE_LIMIT));
    let agent = spawn_agent(options, inputs_tx.clone(), stdout_limit.clone())?;
    let (events, _) = broadcast::channel(EVENTS_BUFFER);
    let mut driver = Driver {
        hub: Hub::new(options.hub.clone()),
        agent_stdin: Some(agent.stdin),
        kill: Some(agent.kill),
        agent_exited: false,
        cut_off: None,
        stdout_limit,
        replay_line_limit: options.replay_line_limit,
        clients: HashMap::new(),
        leaving: Vec::new(),
        events: Some(events),
        journal: Journal::open(options.journal.clone(), options.pod.clone()),
        history: HistoryWriter::spawn(HistoryStore::new(options.history_dir.clone())),
        inputs_tx,
        inputs_rx,
        tasks: JoinSet::new(),
        next_conn: 0,
    };
    let started = driver.hub.start();
    let result = match driver.apply(started).await {
        Ok(()) => driver.main_loop(&listener, options).await,
        Err(error) => Err(error),
    };
    driver.shutdown().await;
    result
}

enum Input {
    AgentLine(String),
    /// The agent broke a bound; it is to be cut off.
    AgentBrokeLimit(AgentLimit),
    AgentExited(ExitStatus),
    Hello(Greeting),
    ClientLine {
        conn: ConnId,
        line: String,
    },
    ClientClosed {
        conn: ConnId,
    },
    /// `askTimeout` passed for a held permission request.
    PermissionTimeout(String),
}

/// A connection that sent its hello line, with how often it has been rechecked while busy.
struct Greeting {
    conn: ConnId,
    hello: Hello,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    attempt: u8,
}

struct AgentHandles {
    stdin: mpsc::Sender<String>,
    kill: oneshot::Sender<()>,
}

/// Starts the agent and the tasks around it: stdout → `Input::AgentLine`, a stdin writer fed
/// by the returned sender (dropping it closes the agent's stdin), and a waiter that kills the
/// agent on request (or when the sender is dropped) and reports its exit after its last line.
fn spawn_agent(
    options: &ServeOptions,
    inputs: mpsc::Sender<Input>,
    stdout_limit: Arc<AtomicUsize>,
) -> Result<AgentHandles, AgentctlError> {
    let argv = &options.launch.argv;
    let program = argv.first().ok_or(AgentctlError::NoCommand)?;
    let mut command = tokio::process::Command::new(program);
    command.args(&argv[1..]).envs(&options.launch.env);
    // The clone's credentials are agentctl's, not the agent's.
    for name in super::seal::CREDENTIAL_VARIABLES {
        command.env_remove(name);
    }
    let mut child = command
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

    let (stdin_tx, stdin_rx) = mpsc::channel::<String>(AGENT_INPUT_CAPACITY);
    tokio::spawn(write_agent_stdin(stdin, stdin_rx));

    let reader = tokio::spawn(read_agent_stdout(stdout, inputs.clone(), stdout_limit));

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
                let _ = inputs.send(Input::AgentExited(status)).await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot wait for the agent");
                let _ = inputs
                    .send(Input::AgentExited(ExitStatus::from_raw(1 << 8)))
                    .await;
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
    mut lines: mpsc::Receiver<String>,
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

/// Hands every non-empty line of the agent's stdout to the driver (waiting while its queue is
/// full). The limit is read when a line begins: the replay limit while a `session/load` is open.
/// An over-long line is reported as [`Input::AgentBrokeLimit`] and ends the reading.
async fn read_agent_stdout(
    stdout: impl AsyncRead + Unpin,
    inputs: mpsc::Sender<Input>,
    limit: Arc<AtomicUsize>,
) {
    let mut lines = LineReader::new(BufReader::new(stdout), LINE_LIMIT);
    loop {
        match lines.ready().await {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) => {
                tracing::debug!(%error, "cannot read the agent's stdout");
                break;
            }
        }
        lines.set_limit(limit.load(Ordering::Relaxed));
        let input = match lines.next_line().await {
            Ok(Frame::Line) => match text_line(lines.line()) {
                Some(line) => Input::AgentLine(line),
                None => continue,
            },
            Ok(Frame::TooLong { len }) => {
                tracing::warn!(
                    len,
                    limit = lines.limit(),
                    "the agent wrote an over-long line"
                );
                let limit = AgentLimit::Line {
                    limit: lines.limit(),
                };
                let _ = inputs.send(Input::AgentBrokeLimit(limit)).await;
                return;
            }
            Ok(Frame::TooCostly { len, cost }) => {
                let bound = jsonrpc::cost::bound(lines.limit());
                tracing::warn!(
                    len,
                    cost,
                    bound,
                    "the agent wrote a line too dense to parse"
                );
                let limit = AgentLimit::ParseCost { cost, bound };
                let _ = inputs.send(Input::AgentBrokeLimit(limit)).await;
                return;
            }
            Ok(Frame::Eof) => break,
            Err(error) => {
                tracing::debug!(%error, "cannot read the agent's stdout");
                break;
            }
        };
        if inputs.send(input).await.is_err() {
            return;
        }
    }
    tracing::debug!("agent stdout closed");
}

/// A line as text (invalid UTF-8 replaced); `None` for a blank one.
fn text_line(line: &[u8]) -> Option<String> {
    let line = String::from_utf8_lossy(line);
    (!line.trim().is_empty()).then(|| line.into_owned())
}

/// Hands a client's lines to the driver until the client closes, errs or writes an over-long
/// line (it is then disconnected: no line of it is half-forwarded). Once serve has `closed` the
/// connection, lines are read and dropped until the client closes its end, which is how serve
/// knows the client took its last lines.
async fn read_client(
    conn: ConnId,
    reader: BufReader<OwnedReadHalf>,
    inputs: mpsc::Sender<Input>,
    closed: Arc<AtomicBool>,
) {
    let mut lines = LineReader::new(reader, LINE_LIMIT);
    loop {
        match lines.next_line().await {
            Ok(Frame::Line) => {
                let Some(line) = text_line(lines.line()) else {
                    continue;
                };
                if closed.load(Ordering::Relaxed) {
                    continue;
                }
                if inputs.send(Input::ClientLine { conn, line }).await.is_err() {
                    return;
                }
            }
            Ok(Frame::TooLong { len }) => {
                tracing::warn!(
                    conn,
                    len,
                    limit = LINE_LIMIT,
                    "client wrote an over-long line; disconnecting it"
                );
                break;
            }
            Ok(Frame::TooCostly { len, cost }) => {
                tracing::warn!(
                    conn,
                    len,
                    cost,
                    "client wrote a line too dense to parse; disconnecting it"
                );
                break;
            }
            Ok(Frame::Eof) => break,
            Err(error) => {
                tracing::debug!(conn, %error, "client read failed");
                break;
            }
        }
    }
    if !closed.load(Ordering::Relaxed) {
        let _ = inputs.send(Input::ClientClosed { conn }).await;
    }
}

/// How often serve sends a heartbeat line to the live events subscribers.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// How long an events subscriber follows the live feed after its snapshot.
#[derive(Clone, Copy, Debug)]
enum Follow {
    /// Not at all (`--once`).
    No,
    /// While a prompt is active (`--until-idle`): the operator's way, so that an idle agent has
    /// no stream open.
    WhileWorking,
    /// Until the agent exits.
    Always,
}

struct ClientHandle {
    lines: mpsc::Sender<String>,
    reader: AbortHandle,
    /// Set when serve closes the connection: the reader then only waits for the client to leave.
    closed: Arc<AtomicBool>,
    /// Aborted only for a client that stopped reading (its writer would wait forever).
    writer: AbortHandle,
}

struct Driver {
    hub: Hub,
    agent_stdin: Option<mpsc::Sender<String>>,
    kill: Option<oneshot::Sender<()>>,
    agent_exited: bool,
    /// Why the agent was cut off, once it was.
    cut_off: Option<AgentLimit>,
    /// The limit of the agent's next stdout line, set from the hub after every step.
    stdout_limit: Arc<AtomicUsize>,
    replay_line_limit: usize,
    clients: HashMap<ConnId, ClientHandle>,
    /// Readers of connections serve closed, until their client closes its end.
    leaving: Vec<AbortHandle>,
    events: Option<broadcast::Sender<String>>,
    journal: Journal,
    history: HistoryWriter,
    inputs_tx: mpsc::Sender<Input>,
    inputs_rx: mpsc::Receiver<Input>,
    /// Connection writers and subscribers, drained on the way out.
    tasks: JoinSet<()>,
    next_conn: ConnId,
}

impl Driver {
    async fn main_loop(
        &mut self,
        listener: &UnixListener,
        options: &ServeOptions,
    ) -> Result<(), AgentctlError> {
        let initialize_timeout = options.initialize_timeout;
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
        // Heartbeats come from this loop, so they stop when serve stops serving.
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Armed while the agent is idle, for `suspend_idle_after`; moved on by any activity.
        let mut idle_since: Option<tokio::time::Instant> = None;
        let suspend_at = tokio::time::sleep(Duration::from_secs(100 * 365 * 86_400));
        tokio::pin!(suspend_at);
        loop {
            if let Some(after) = options.suspend_idle_after {
                match (self.hub.idle() && !stopping, idle_since) {
                    (true, None) => {
                        let now = tokio::time::Instant::now();
                        idle_since = Some(now);
                        suspend_at.as_mut().reset(now + after);
                    }
                    (false, Some(_)) => idle_since = None,
                    _ => {}
                }
            }
            tokio::select! {
                _ = &mut suspend_at, if idle_since.is_some() && !stopping => {
                    stopping = true;
                    let idle = idle_since.map_or(Duration::ZERO, |since| since.elapsed());
                    self.suspend(idle, options.termination_log.as_deref()).await?;
                    self.begin_stop(stop_deadline.as_mut(), "idle");
                }
                _ = heartbeat.tick() => self.heartbeat(),
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
                        return self.exit_after_agent(stopping, status);
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
                _ = &mut stop_deadline, if stopping && self.kill.is_some() => {
                    // Once: a completed deadline stays ready, and the exit takes a moment.
                    tracing::warn!("the agent did not exit after its stdin closed");
                    if let Some(kill) = self.kill.take() {
                        let _ = kill.send(());
                    }
                }
            }
        }
    }

    /// How serve ends once the agent exited with `status`: cleanly only when it was asked to
    /// stop (and agentctl did not cut it off for breaking a bound).
    fn exit_after_agent(&self, stopping: bool, status: ExitStatus) -> Result<(), AgentctlError> {
        match (stopping, self.cut_off) {
            (_, Some(limit)) => Err(AgentctlError::AgentCutOff { limit }),
            (true, None) => Ok(()),
            (false, None) => Err(AgentctlError::AgentExited {
                status: status.to_string(),
            }),
        }
    }

    /// The agent was idle for `idle`: the journal and the termination message say the session
    /// is suspended (the operator tells it from a loss by them), then the agent is stopped.
    async fn suspend(&mut self, idle: Duration, log: Option<&Path>) -> Result<(), AgentctlError> {
        let idle_seconds = idle.as_secs();
        tracing::info!(idle_seconds, "the agent was idle; suspending the session");
        if let Some(path) = log {
            let message = format!(
                "{SUSPENDED}: idle for {idle_seconds}s (no prompt, no client); the agent was stopped and the session can be resumed"
            );
            if let Err(error) = std::fs::write(path, message) {
                tracing::warn!(%error, path = %path.display(), "cannot write the termination message");
            }
        }
        self.apply(vec![Output::Event(Event::Suspended { idle_seconds })])
            .await
    }

    /// `{"event":"heartbeat","timestamp":…}` to the live subscribers (not
    /// journaled): a follower holding a stream while a prompt runs tells a quiet agent from a
    /// serve that stopped answering.
    fn heartbeat(&self) {
        if let Some(events) = &self.events
            && events.receiver_count() > 0
        {
            let line = Event::Heartbeat.to_json(&now_rfc3339());
            let _ = events.send(line.to_string());
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
            let mut first = LineReader::new(BufReader::new(read), HELLO_LIMIT);
            let read = tokio::time::timeout(HELLO_TIMEOUT, first.next_line());
            let hello = match read.await {
                Ok(Ok(Frame::Line)) => serde_json::from_slice::<Hello>(first.line()).ok(),
                _ => None,
            };
            let reader = first.into_inner();
            match hello {
                Some(hello) => {
                    let greeting = Greeting {
                        conn,
                        hello,
                        reader,
                        writer,
                        attempt: 0,
                    };
                    let _ = inputs.send(Input::Hello(greeting)).await;
                }
                None => {
                    tracing::warn!(conn, "connection without a valid hello line; closed");
                    let error = jsonrpc::error_message(
                        Value::Null,
                        jsonrpc::code::INVALID_REQUEST,
                        r#"agentctl: the first line must be {"mode":"acp"}, {"mode":"events"} or {"mode":"answer",…}"#,
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
            Input::AgentBrokeLimit(limit) => self.cut_off_agent(limit),
            Input::ClientLine { conn, line } => self.hub.client_line(conn, &line),
            Input::ClientClosed { conn } => {
                tracing::info!(conn, "client connection closed; the agent keeps running");
                self.hub.client_closed(conn)
            }
            Input::Hello(greeting) => match greeting.hello.mode {
                Mode::Events => {
                    let Greeting {
                        conn,
                        hello,
                        reader,
                        writer,
                        ..
                    } = greeting;
                    let follow = match (hello.once, hello.until_idle) {
                        (true, _) => Follow::No,
                        (false, true) => Follow::WhileWorking,
                        (false, false) => Follow::Always,
                    };
                    self.subscribe(conn, reader, writer, hello.since, follow);
                    Vec::new()
                }
                Mode::Answer => self.answer(greeting),
                Mode::Acp => match self.hub.attach(greeting.conn, greeting.hello.takeover) {
                    Ok(out) => {
                        tracing::info!(
                            conn = greeting.conn,
                            decides_permissions = greeting.hello.permissions,
                            "ACP client connected"
                        );
                        if greeting.hello.permissions {
                            self.hub.client_decides_permissions(greeting.conn);
                        }
                        self.register_client(greeting.conn, greeting.reader, greeting.writer);
                        out
                    }
                    Err(_busy) if greeting.attempt < BUSY_RECHECKS => {
                        let inputs = self.inputs_tx.clone();
                        let again = Greeting {
                            attempt: greeting.attempt + 1,
                            ..greeting
                        };
                        tokio::spawn(async move {
                            tokio::time::sleep(BUSY_RECHECK).await;
                            let _ = inputs.send(Input::Hello(again)).await;
                        });
                        Vec::new()
                    }
                    Err(_busy) => {
                        tracing::warn!(conn = greeting.conn, "second ACP client refused: busy");
                        let Greeting {
                            reader, mut writer, ..
                        } = greeting;
                        self.tasks.spawn(async move {
                            let _ = write_line(&mut writer, socket::BUSY_LINE).await;
                            let _ = writer.shutdown().await;
                            drop(reader);
                        });
                        Vec::new()
                    }
                },
            },
            Input::PermissionTimeout(request_id) => self.hub.permission_timed_out(&request_id),
            Input::AgentExited(_) => Vec::new(),
        };
        self.apply(out).await
    }

    /// An `agentctl answer` connection: the answer goes to the hub, one result line goes back
    /// (`{"outcome":…}` or `{"refused":…}`), and the connection closes.
    fn answer(&mut self, greeting: Greeting) -> Vec<Output> {
        let Greeting {
            conn,
            hello,
            reader,
            mut writer,
            ..
        } = greeting;
        let (line, out) = match &hello.answer {
            Some(answer) => {
                let (result, out) = self
                    .hub
                    .answer_permission(&answer.request, &answer.option_kind);
                let line = match result {
                    Ok(outcome) => json!({"request": answer.request, "outcome": outcome}),
                    Err(refusal) => {
                        json!({"request": answer.request, "refused": refusal.to_string()})
                    }
                };
                (line, out)
            }
            None => (
                json!({"refused": "the answer hello names no request"}),
                Vec::new(),
            ),
        };
        tracing::info!(conn, result = %line, "permission answer");
        self.tasks.spawn(async move {
            let _ = write_line(&mut writer, &line.to_string()).await;
            let _ = writer.shutdown().await;
            drop(reader);
        });
        out
    }

    fn register_client(
        &mut self,
        conn: ConnId,
        reader: BufReader<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
    ) {
        let (lines_tx, mut lines_rx) = mpsc::channel::<String>(CLIENT_QUEUE);
        let writer = self.tasks.spawn(async move {
            while let Some(line) = lines_rx.recv().await {
                if let Err(error) = write_line(&mut writer, &line).await {
                    tracing::debug!(conn, %error, "client write failed");
                    break;
                }
            }
            let _ = writer.shutdown().await;
        });
        let closed = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(read_client(
            conn,
            reader,
            self.inputs_tx.clone(),
            closed.clone(),
        ));
        self.clients.insert(
            conn,
            ClientHandle {
                lines: lines_tx,
                reader: reader.abort_handle(),
                closed,
                writer,
            },
        );
    }

    /// An events subscriber: the journal after `since`, a snapshot, then the live feed as
    /// `follow` says.
    fn subscribe(
        &mut self,
        conn: ConnId,
        reader: BufReader<OwnedReadHalf>,
        mut writer: OwnedWriteHalf,
        since: Option<u64>,
        follow: Follow,
    ) {
        let Some(events) = &self.events else {
            return;
        };
        // Replayed, subscribed and snapshotted in the same driver step: no event falls in
        // between or comes twice.
        let mut receiver = events.subscribe();
        let mut first = Vec::new();
        if let Some(since) = since {
            let replay = self.journal.since(since);
            if replay.gap {
                first.push(Event::JournalGap { since }.to_json_unstamped().to_string());
            }
            first.extend(replay.lines);
        }
        let snapshot = self.hub.snapshot();
        let mut working = matches!(
            snapshot,
            Event::Snapshot {
                prompt_active: true,
                ..
            }
        );
        let mut snapshot = snapshot.to_json(&now_rfc3339());
        snapshot["seq"] = json!(self.journal.last_seq());
        first.push(snapshot.to_string());
        tracing::info!(conn, ?since, ?follow, "events subscriber connected");
        self.tasks.spawn(async move {
            let mut reader = LineReader::new(reader, LINE_LIMIT);
            for line in &first {
                if write_line(&mut writer, line).await.is_err() {
                    return;
                }
            }
            let done = |working: bool| match follow {
                Follow::No => true,
                Follow::WhileWorking => !working,
                Follow::Always => false,
            };
            if done(working) {
                let _ = writer.shutdown().await;
                return;
            }
            loop {
                tokio::select! {
                    event = receiver.recv() => match event {
                        Ok(line) => {
                            if write_line(&mut writer, &line).await.is_err() {
                                break;
                            }
                            match serde_json::from_str::<EventLine>(&line).map(|line| line.event) {
                                Ok(Event::PromptStarted { .. }) => working = true,
                                Ok(Event::PromptFinished { .. } | Event::AgentExited { .. }) => {
                                    working = false;
                                }
                                _ => {}
                            }
                            if done(working) {
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
                    read = reader.next_line() => match read {
                        Ok(Frame::Line) => {}
                        Ok(Frame::TooLong { .. } | Frame::TooCostly { .. } | Frame::Eof) | Err(_) => break,
                    },
                }
            }
            let _ = writer.shutdown().await;
            tracing::info!(conn, "events subscriber disconnected");
        });
    }

    /// Carries out the hub's outputs in order (and what the hub answers to a client or an agent
    /// being cut off on the way, before the rest).
    async fn apply(&mut self, outputs: Vec<Output>) -> Result<(), AgentctlError> {
        self.update_stdout_limit();
        let mut queue = VecDeque::from(outputs);
        while let Some(output) = queue.pop_front() {
            let more = self.apply_one(output).await?;
            for output in more.into_iter().rev() {
                queue.push_front(output);
            }
        }
        self.update_stdout_limit();
        Ok(())
    }

    /// The agent's next line may be as long as the replay limit while a load is open.
    fn update_stdout_limit(&self) {
        let limit = if self.hub.replaying() {
            self.replay_line_limit
        } else {
            LINE_LIMIT
        };
        self.stdout_limit.store(limit, Ordering::Relaxed);
    }

    /// Queues a line for a client, waiting at most [`CLIENT_STALL`] while its queue is full;
    /// a client that stays full is disconnected (what the hub then wants done is returned).
    async fn send_client(&mut self, conn: ConnId, message: Value) -> Vec<Output> {
        let Some(client) = self.clients.get(&conn) else {
            return Vec::new();
        };
        let line = message.to_string();
        let sent = match client.lines.try_send(line) {
            Ok(()) => return Vec::new(),
            Err(mpsc::error::TrySendError::Closed(_)) => return Vec::new(),
            Err(mpsc::error::TrySendError::Full(line)) => {
                let lines = client.lines.clone();
                tokio::time::timeout(CLIENT_STALL, lines.send(line)).await
            }
        };
        match sent {
            Ok(_) => Vec::new(),
            Err(_) => {
                tracing::warn!(conn, stall = ?CLIENT_STALL, "client stopped reading; disconnecting it");
                if let Some(client) = self.clients.get(&conn) {
                    client.reader.abort();
                    client.writer.abort();
                }
                self.hub.client_closed(conn)
            }
        }
    }

    /// Cuts the agent off for breaking `limit`: no more lines to it, it is killed, and the
    /// client's open requests are answered with the limit (returned for the caller to apply).
    fn cut_off_agent(&mut self, limit: AgentLimit) -> Vec<Output> {
        if self.cut_off.is_some() {
            return Vec::new();
        }
        tracing::error!(%limit, "cutting the agent off");
        self.cut_off = Some(limit);
        self.agent_stdin = None;
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        self.hub.agent_cut_off(limit)
    }

    /// Carries out one output; returns what the hub wants done after a client or the agent was
    /// cut off on the way.
    async fn apply_one(&mut self, output: Output) -> Result<Vec<Output>, AgentctlError> {
        match output {
            Output::ToAgent(message) => return Ok(self.send_agent(&message)),
            Output::ToClient(conn, message) => return Ok(self.send_client(conn, message).await),
            Output::CloseClient(conn) => {
                if let Some(client) = self.clients.remove(&conn) {
                    // Dropping the sender lets the writer flush what is queued, then close; the
                    // reader stays until the client leaves (see `await_clients_leaving`).
                    client.closed.store(true, Ordering::Relaxed);
                    self.leaving.retain(|reader| !reader.is_finished());
                    self.leaving.push(client.reader);
                }
            }
            Output::Event(event) => {
                let line = self
                    .journal
                    .append(&event, &now_rfc3339(), self.hub.last_launch());
                tracing::info!(event = %line, "event");
                if let Some(events) = &self.events {
                    // No subscriber is fine: the journal keeps the event.
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
                return Ok(self.send_agent(&message));
            }
            Output::PermissionTimer { request_id, after } => {
                let inputs = self.inputs_tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = inputs.send(Input::PermissionTimeout(request_id)).await;
                });
            }
            Output::InitializeFailed { code, message } => {
                return Err(AgentctlError::InitializeFailed { code, message });
            }
        }
        Ok(Vec::new())
    }

    /// Queues a line for the agent's stdin; a full queue cuts the agent off (what the hub then
    /// wants done is returned).
    fn send_agent(&mut self, message: &Value) -> Vec<Output> {
        let Some(stdin) = &self.agent_stdin else {
            tracing::debug!("stopping: message to the agent dropped");
            return Vec::new();
        };
        match stdin.try_send(message.to_string()) {
            Ok(()) => Vec::new(),
            Err(mpsc::error::TrySendError::Full(_)) => self.cut_off_agent(AgentLimit::Input {
                limit: AGENT_INPUT_CAPACITY,
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::warn!("the agent's stdin is closed; message dropped");
                Vec::new()
            }
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
        let mut readers: Vec<AbortHandle> = self
            .clients
            .drain()
            .map(|(_, client)| client.reader)
            .collect();
        readers.append(&mut self.leaving);
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
        self.await_clients_leaving(readers).await;
    }

    /// Waits (at most [`DRAIN_TIMEOUT`]) until every ACP client closed its end, after its last
    /// lines were written (their writers are done). In a pod, serve's exit ends the container,
    /// and that kills the `agentctl connect` exec'd into it: a last answer (the agent cut off or
    /// gone) would be lost between the socket and the exec stream if serve did not wait for
    /// connect to leave.
    async fn await_clients_leaving(&mut self, readers: Vec<AbortHandle>) {
        let left = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while readers.iter().any(|reader| !reader.is_finished()) {
                // A leaving reader reports its close; nobody else reads the inputs now.
                tokio::select! {
                    _ = self.inputs_rx.recv() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        })
        .await;
        if left.is_err() {
            tracing::debug!("a client kept its connection open after serve's last line");
        }
        for reader in readers {
            reader.abort();
        }
    }
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
        reply: oneshot::Sender<Result<Vec<HistoryEntry>, HistoryReadError>>,
    },
    Flush(oneshot::Sender<()>),
}

/// Why the recorded history could not be read.
#[derive(Debug, thiserror::Error)]
enum HistoryReadError {
    #[error(transparent)]
    Store(#[from] crate::history::HistoryError),
    #[error("the history reader failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("history writer stopped")]
    Stopped,
}

/// History entries waiting for the volume; when it falls this far behind, entries are dropped.
const HISTORY_QUEUE: usize = 1024;

/// One task does all history I/O, in order, off the driver (the store is blocking). Reads go
/// through the same queue so they see every earlier append. A failing (or slow) volume costs
/// history, never the agent: errors are logged, and entries that do not fit the queue are
/// dropped.
struct HistoryWriter {
    commands: mpsc::Sender<HistoryCommand>,
    warnings: WarnLimiter,
}

impl HistoryWriter {
    fn spawn(store: HistoryStore) -> Self {
        let (commands, mut rx) = mpsc::channel::<HistoryCommand>(HISTORY_QUEUE);
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
                            Ok(Err(error)) => Err(HistoryReadError::Store(error)),
                            Err(error) => Err(HistoryReadError::Task(error)),
                        };
                        let _ = reply.send(result);
                    }
                    HistoryCommand::Flush(reply) => {
                        let _ = reply.send(());
                    }
                }
            }
        });
        Self {
            commands,
            warnings: WarnLimiter::default(),
        }
    }

    fn append(&mut self, session: String, entry: HistoryEntry) {
        let appended = self
            .commands
            .try_send(HistoryCommand::Append { session, entry });
        if let Err(mpsc::error::TrySendError::Full(_)) = appended
            && let Some(suppressed) = self.warnings.allow()
        {
            tracing::warn!(
                suppressed,
                queue = HISTORY_QUEUE,
                "the history volume is behind; entry not recorded"
            );
        }
    }

    async fn read(&self, session: String) -> Result<Vec<HistoryEntry>, HistoryReadError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(HistoryCommand::Read { session, reply })
            .await
            .map_err(|_| HistoryReadError::Stopped)?;
        answer.await.map_err(|_| HistoryReadError::Stopped)?
    }

    /// Waits until every earlier command is done.
    async fn flush(&self) {
        let (reply, done) = oneshot::channel();
        if self
            .commands
            .send(HistoryCommand::Flush(reply))
            .await
            .is_ok()
        {
            let _ = done.await;
        }
    }
}
