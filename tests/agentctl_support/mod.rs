//! Helpers shared by the `agentctl_*` and `protocol_*` tests and the agents smoke test: run
//! `agentctl serve` over a unix socket in a temp dir, drive `agentctl connect` / `agentctl
//! events` as real processes with piped stdio, read what `kandev-test-agent` logged, and drive an
//! ACP agent directly over its stdio (spawn, restore, stop). Plain threads and std processes for
//! agentctl: what is under test is the binaries, not an async client.
#![allow(dead_code)]
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

#[path = "../support/mod.rs"]
pub mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use kandev_operator::acp::{
    AcpClient, AcpTimeouts, AgentStderr, LocalAgent, RestoreOutcome, SpawnOptions,
};
use kandev_operator::resume::NativeSessionResume;
use serde_json::{Value, json};
pub use support::process::{line_reader, wait_exit};

pub const AGENTCTL: &str = env!("CARGO_BIN_EXE_agentctl");
/// `kandev-test-agent`, a binary of its own crate (e2e/test_agent): built beside the test
/// binaries (`make unit` and `make protocol` build it first), so found next to their `deps/`.
pub static TEST_AGENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>/deps");
    let agent = profile_dir.join("kandev-test-agent");
    assert!(
        agent.is_file(),
        "{} is missing: build it with `cargo build -p kandev-test-agent`",
        agent.display()
    );
    agent.display().to_string()
});
/// A saved session token (the test agent knows it with `--known-session`).
pub const TOKEN: &str = "saved-session-1";
/// Generous: the machine is shared with other builds.
pub const WAIT: Duration = Duration::from_secs(30);
/// The workspace of a [`Serve`], below its temp dir.
pub const WORKSPACE: &str = "ws";

/// `agentctl` without what a pod's environment gives it (socket, session name, workspace): a
/// test passes what it means.
pub fn agentctl() -> Command {
    let mut cmd = Command::new(AGENTCTL);
    cmd.env_remove("KANDEV_AGENTCTL_SOCKET")
        .env_remove("KANDEV_SESSION_NAME")
        .env_remove("KANDEV_WORKSPACE");
    cmd
}

/// `agentctl connect --socket <socket>`, as the operator runs it over exec.
pub fn connect_command(socket: &Path) -> Command {
    let mut cmd = agentctl();
    cmd.arg("connect").arg("--socket").arg(socket);
    cmd
}

/// `kandev-test-agent <args>` as a command line.
pub fn test_agent_command(args: &[&str]) -> Vec<String> {
    std::iter::once(TEST_AGENT.as_str())
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// A temp dir in /tmp named `<prefix>…`: no `.` in its path (claude-agent-acp's project
/// directories depend on it).
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// The claude-agent-acp that `bash e2e/agents.sh` installed, from `KANDEV_CLAUDE_AGENT_ACP`.
pub fn claude_agent_acp() -> String {
    match std::env::var("KANDEV_CLAUDE_AGENT_ACP") {
        Ok(path) if !path.is_empty() => path,
        _ => panic!(
            "KANDEV_CLAUDE_AGENT_ACP is not set: run `bash e2e/agents.sh` and point it at \
             <printed bin dir>/claude-agent-acp (make protocol)"
        ),
    }
}

/// The lines of the file at `path` (none while it does not exist).
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Kills `child` (if it still runs) and waits for it.
fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Where serve records the history of session `name` in `workspace`.
pub fn history_file(workspace: &Path, name: &str) -> PathBuf {
    workspace
        .join(".kandev/sessions")
        .join(format!("{name}.jsonl"))
}

/// Writes `text` as the recorded history of session `name`, as an earlier pod left it.
pub fn write_history(workspace: &Path, name: &str, text: &str) -> PathBuf {
    let path = history_file(workspace, name);
    std::fs::create_dir_all(path.parent().expect("sessions dir")).expect("sessions dir");
    std::fs::write(&path, text).expect("history");
    path
}

// ---- An ACP agent over its own stdio -------------------------------------------------------

/// Spawns `cmd` as an ACP agent over its stdio, its stderr shared with ours.
pub fn spawn_agent(cmd: &[String]) -> LocalAgent {
    let options = SpawnOptions {
        stderr: AgentStderr::Inherit,
        ..SpawnOptions::default()
    };
    LocalAgent::spawn(cmd, &options).expect("spawn")
}

/// Restores `token` as the operator restores a saved session: native resume as the profile
/// allows it (`auto`), no fresh start requested.
pub async fn restore_saved(
    client: &mut AcpClient,
    token: Option<&str>,
    cwd: &Path,
    timeouts: AcpTimeouts,
) -> RestoreOutcome {
    client
        .restore(token, cwd, NativeSessionResume::Auto, false, timeouts)
        .await
}

/// Stops an agent: its stdin closed, killed if it has not exited within `grace`.
pub async fn stop_agent(agent: LocalAgent, grace: Duration) {
    agent.shutdown(grace).await.expect("shutdown");
}

// ---- agentctl serve, connect and events ----------------------------------------------------

/// One `agentctl serve` with `kandev-test-agent` (or another command) in a temp workspace.
pub struct Serve {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub socket: PathBuf,
    /// `dir/agent.log`, where [`Serve::start`]'s test agent logs (`--log`).
    pub agent_log: PathBuf,
    pub stderr: Receiver<String>,
    /// Every line of serve's log that a wait has read so far, in order.
    pub read: std::cell::RefCell<Vec<String>>,
}

impl Serve {
    /// `agentctl serve --workspace W --socket S <serve_args> -- kandev-test-agent --log L <agent_args>`
    pub fn start(serve_args: &[&str], agent_args: &[&str]) -> Self {
        Self::start_agent_in(
            tempfile::tempdir().expect("tempdir"),
            serve_args,
            agent_args,
        )
    }

    /// Like [`Serve::start`] in `dir`, which the test may have prepared (its workspace is
    /// `dir/`[`WORKSPACE`]).
    pub fn start_agent_in(
        dir: tempfile::TempDir,
        serve_args: &[&str],
        agent_args: &[&str],
    ) -> Self {
        let agent_log = path_str(&dir.path().join("agent.log"));
        let mut command = test_agent_command(&["--log", &agent_log]);
        command.extend(agent_args.iter().map(|a| (*a).to_owned()));
        Self::start_in(dir, serve_args, &command, &[])
    }

    /// Serve in `dir` with an arbitrary agent command (empty: none after `--`) and extra
    /// environment for serve (inherited by the agent).
    pub fn start_in(
        dir: tempfile::TempDir,
        serve_args: &[&str],
        command: &[String],
        env: &[(&str, &Path)],
    ) -> Self {
        let agent_log = dir.path().join("agent.log");
        let workspace = dir.path().join(WORKSPACE);
        std::fs::create_dir_all(&workspace).expect("workspace");
        let socket = dir.path().join("a.sock");
        let mut cmd = agentctl();
        cmd.arg("serve")
            .arg("--workspace")
            .arg(&workspace)
            .arg("--socket")
            .arg(&socket)
            .args(serve_args);
        if !command.is_empty() {
            cmd.arg("--").args(command);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agentctl serve");
        let stderr = line_reader(child.stderr.take().expect("stderr"));
        let serve = Self {
            child,
            dir,
            workspace,
            socket,
            agent_log,
            stderr,
            read: std::cell::RefCell::default(),
        };
        serve.wait_for_socket();
        serve
    }

    /// Waits until serve listens: its log says so once `listen` returned (the socket file exists
    /// a moment earlier, from `bind`, when a client would still be refused).
    fn wait_for_socket(&self) {
        self.wait_stderr("listening for agentctl clients");
    }

    pub fn connect(&self) -> Client {
        Client::spawn(&self.socket, &[])
    }

    /// An `agentctl events` subscriber, returned once serve has registered it (so no event
    /// after this call can be missed).
    pub fn events(&self) -> Events {
        let events = Events::spawn(&self.socket);
        self.wait_stderr("events subscriber connected");
        events
    }

    /// Waits for a line containing `needle` in serve's log (stderr), consuming lines up to it.
    pub fn wait_stderr(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.read.borrow_mut().push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("serve never logged {needle:?}"),
            }
        }
    }

    /// Lines the test agent logged: `<method> [<sessionId>]`, `response <id> …`.
    pub fn agent_log(&self) -> Vec<String> {
        read_lines(&self.agent_log)
    }

    /// Polls the agent log until `predicate` holds.
    pub fn wait_agent_log(&self, what: &str, predicate: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let lines = self.agent_log();
            if predicate(&lines) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "agent log never showed {what}: {lines:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pids of serve's child processes (the agent), from /proc.
    pub fn agent_pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let tasks = format!("/proc/{}/task", self.child.id());
        for task in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        pids.sort_unstable();
        pids
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn history_path(&self, name: &str) -> PathBuf {
        history_file(&self.workspace, name)
    }

    /// The history file's entries (waits for it to hold at least `min` lines).
    pub fn history(&self, name: &str, min: usize) -> Vec<Value> {
        let path = self.history_path(name);
        let deadline = Instant::now() + WAIT;
        loop {
            let entries: Vec<Value> = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            if entries.len() >= min {
                return entries;
            }
            assert!(
                Instant::now() < deadline,
                "history {name} has {entries:?}, want {min}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends serve SIGTERM (through `kill`): the graceful stop a pod gets.
    pub fn sigterm(&self) -> std::io::Result<ExitStatus> {
        Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
    }

    /// Stops serve (SIGKILL takes the agent down with it only through kill_on_drop, so use
    /// SIGTERM).
    pub fn stop(&mut self) {
        if self.is_running() {
            let _ = self.sigterm();
            let deadline = Instant::now() + WAIT;
            while self.is_running() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            reap(&mut self.child);
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn path_str(path: &Path) -> String {
    path.display().to_string()
}

/// A spawned `agentctl connect` whose stdin stays open (like kwok's exec).
pub struct Client {
    pub child: Child,
    stdin: Option<ChildStdin>,
    pub lines: Receiver<String>,
    pub stderr: Receiver<String>,
    /// Messages that arrived while waiting for something else.
    pub seen: Vec<Value>,
}

impl Client {
    pub fn spawn(socket: &Path, extra: &[&str]) -> Self {
        let mut child = connect_command(socket)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agentctl connect");
        let lines = line_reader(child.stdout.take().expect("stdout"));
        let stderr = line_reader(child.stderr.take().expect("stderr"));
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            seen: Vec::new(),
        }
    }

    pub fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to connect");
        stdin.flush().expect("flush");
    }

    pub fn send(&mut self, message: &Value) {
        self.send_raw(&message.to_string());
    }

    /// Sends a request without waiting for its response.
    pub fn send_request(&mut self, id: Value, method: &str, params: Value) {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
    }

    /// The next line from agentctl, as JSON (every line must be JSON).
    pub fn next(&mut self) -> Value {
        match self.lines.recv_timeout(WAIT) {
            Ok(line) => serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("connect printed a non-JSON line {line:?}: {e}")),
            Err(RecvTimeoutError::Timeout) => panic!("no line from connect within {WAIT:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("connect's stdout closed"),
        }
    }

    /// Sends a request and returns its response, keeping everything else in `seen`.
    pub fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send_request(id.clone(), method, params);
        self.response(&id)
    }

    /// `initialize` (after serve's own, answered from its cache).
    pub fn initialize(&mut self, id: u64) -> Value {
        self.request(json!(id), "initialize", initialize_params())
    }

    /// `session/new` in `cwd`.
    pub fn new_session(&mut self, id: u64, cwd: &Path) -> Value {
        self.request(json!(id), "session/new", new_session_params(cwd))
    }

    /// `session/prompt` of `text` to `session`.
    pub fn prompt(&mut self, id: u64, session: &str, text: &str) -> Value {
        self.request(json!(id), "session/prompt", prompt_params(session, text))
    }

    /// `session/resume` with `params`.
    pub fn resume(&mut self, id: u64, params: Value) -> Value {
        self.request(json!(id), "session/resume", params)
    }

    /// `session/load` of `session` in `cwd`.
    pub fn load(&mut self, id: u64, session: &str, cwd: &Path) -> Value {
        let params = json!({"sessionId": session, "cwd": cwd, "mcpServers": []});
        self.request(json!(id), "session/load", params)
    }

    /// Waits for the response with `id`.
    pub fn response(&mut self, id: &Value) -> Value {
        loop {
            let message = self.next();
            if message.get("method").is_none() && message.get("id") == Some(id) {
                return message;
            }
            self.seen.push(message);
        }
    }

    /// Sends `_kandev/disconnect` (stdin stays open) and waits for connect to exit.
    pub fn disconnect(mut self) -> ExitStatus {
        self.send_raw(r#"{"jsonrpc":"2.0","method":"_kandev/disconnect"}"#);
        wait_exit(
            &mut self.child,
            WAIT,
            "agentctl connect after _kandev/disconnect",
        )
    }

    /// Everything connect wrote to stderr; call after it exited (reads to EOF).
    pub fn stderr_text(&self) -> String {
        self.stderr.iter().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

/// A spawned `agentctl events`.
pub struct Events {
    pub child: Child,
    pub lines: Receiver<String>,
}

impl Events {
    pub fn spawn(socket: &Path) -> Self {
        let mut child = agentctl()
            .arg("events")
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn agentctl events");
        let lines = line_reader(child.stdout.take().expect("stdout"));
        Self { child, lines }
    }

    /// The next event (JSON), heartbeats skipped: serve sends one every 10 s whatever happens,
    /// so on a busy machine one may come between any two events.
    pub fn next(&self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(WAIT)
                .unwrap_or_else(|e| panic!("no event within {WAIT:?}: {e}"));
            let event: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("event {line:?} is not JSON: {e}"));
            if event["event"] != "heartbeat" {
                return event;
            }
        }
    }

    /// Reads events until one named `name` arrives; returns it.
    pub fn until(&self, name: &str) -> Value {
        loop {
            let event = self.next();
            if event["event"] == name {
                return event;
            }
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

pub fn initialize_params() -> Value {
    json!({"protocolVersion": 1, "clientCapabilities": {}})
}

pub fn new_session_params(cwd: &Path) -> Value {
    json!({"cwd": cwd, "mcpServers": []})
}

pub fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// Asserts that `log` (an agent's log) has the line `line`.
pub fn assert_logged(log: &[String], line: &str) {
    assert!(log.iter().any(|l| l == line), "{line:?} not in {log:?}");
}

/// The texts of `agent_message_chunk` updates among `messages`.
pub fn agent_chunks(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m["method"] == "session/update")
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .map(str::to_owned)
        .collect()
}
