//! The one process runner of the tests: a program run to its end with a time limit (killed on a
//! hang, which fails the test), with or without stdin text, sync or async; the programs that
//! `e2e/bin.sh` builds (kubectl, helm); reading a long-running child's lines; a loopback port.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The time limit of [`run`]: longer than any `--timeout` the tests give kubectl or helm, so
/// only a hang reaches it.
pub const LIMIT: Duration = Duration::from_secs(300);

/// How long the output of a killed (or finished) child is still read: a grandchild may hold its
/// pipes open.
const DRAIN: Duration = Duration::from_secs(2);

/// What a finished process left: its exit status and its output as text.
#[derive(Debug)]
pub struct Output {
    /// The command line, for messages.
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The exit code; -1 when a signal ended the process.
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    /// Ok(stdout) on success, else Err(stdout then stderr).
    pub fn result(self) -> Result<String, String> {
        if self.success() {
            Ok(self.stdout)
        } else {
            Err(format!("{}{}", self.stdout, self.stderr))
        }
    }

    /// stdout; panics with the command's output unless it succeeded.
    pub fn expect_success(self) -> String {
        assert!(
            self.success(),
            "{} failed ({}):\n--- stdout\n{}--- stderr\n{}",
            self.command,
            self.status,
            self.stdout,
            self.stderr
        );
        self.stdout
    }
}

/// `cmd` as a command line, for messages.
fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` to its end with no stdin, within [`LIMIT`].
pub fn run(cmd: &mut Command) -> Output {
    run_within(cmd, LIMIT)
}

/// Runs `cmd` to its end with no stdin; past `limit` it is killed and the test fails.
pub fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    finish(cmd, None, limit)
}

/// Runs `cmd` to its end with `stdin` as its input (then end of file), within [`LIMIT`].
pub fn run_with_stdin(cmd: &mut Command, stdin: &str) -> Output {
    finish(cmd, Some(stdin), LIMIT)
}

fn finish(cmd: &mut Command, stdin: Option<&str>, limit: Duration) -> Output {
    let command = command_line(cmd);
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A thread: a child that stops reading must not block us; dropping the pipe is the EOF.
        let text = text.to_owned();
        std::thread::spawn(move || {
            let _ = pipe.write_all(text.as_bytes());
        });
    }
    let stdout = Collected::start(child.stdout.take().expect("stdout piped"));
    let stderr = Collected::start(child.stderr.take().expect("stderr piped"));
    let status = wait_until(&mut child, Instant::now() + limit);
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{command} still ran after {limit:?} (killed):\n--- stdout\n{}--- stderr\n{}",
            stdout.text(),
            stderr.text()
        )
    });
    Output {
        command,
        status,
        stdout: stdout.text(),
        stderr: stderr.text(),
    }
}

/// A pipe read to its end by a thread, into a buffer that can be taken before the end (a killed
/// child's grandchildren may keep the pipe open).
struct Collected {
    bytes: Arc<Mutex<Vec<u8>>>,
    done: Receiver<()>,
}

impl Collected {
    fn start(mut source: impl Read + Send + 'static) -> Self {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let (tx, done) = channel();
        let sink = bytes.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = source.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("output buffer")
                    .extend_from_slice(&chunk[..n]);
            }
            let _ = tx.send(());
        });
        Self { bytes, done }
    }

    /// What was read, once the pipe ended or [`DRAIN`] passed.
    fn text(&self) -> String {
        let _ = self.done.recv_timeout(DRAIN);
        String::from_utf8_lossy(&self.bytes.lock().expect("output buffer")).into_owned()
    }
}

/// Runs `cmd` to its end with no stdin, within `limit`: Ok(output), or Err(what it printed) when
/// it was killed at the limit (the caller says what a hang means).
pub async fn run_async(
    cmd: &mut tokio::process::Command,
    limit: Duration,
) -> Result<Output, Output> {
    let command = command_line(cmd.as_std());
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    finish_async(child, &command, limit).await
}

/// Waits for `child` (spawned with stdout and stderr piped, e.g. to write its stdin or to act
/// while it runs) to end within `limit`, as [`run_async`] does; `command` names it in messages.
pub async fn finish_async(
    mut child: tokio::process::Child,
    command: &str,
    limit: Duration,
) -> Result<Output, Output> {
    use tokio::io::AsyncReadExt;
    let command = command.to_owned();
    let mut stdout = child.stdout.take().expect("stdout piped");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let io = async {
        let (a, b) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        a.and(b)
            .unwrap_or_else(|e| panic!("reading the output of {command}: {e}"));
        child.wait().await
    };
    let finished = tokio::time::timeout(limit, io).await;
    let status = match finished {
        Ok(status) => Ok(status),
        Err(_) => {
            let _ = child.kill().await;
            Err(child.wait().await)
        }
    };
    let output = |status: std::io::Result<ExitStatus>| Output {
        status: status.unwrap_or_else(|e| panic!("waiting for {command}: {e}")),
        command: command.clone(),
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    };
    match status {
        Ok(status) => Ok(output(status)),
        Err(status) => Err(output(status)),
    }
}

/// Waits for `child` to exit until `deadline`; None if it still runs then.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait().expect("wait for a child") {
            Some(status) => return Some(status),
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => return None,
        }
    }
}

/// Waits for a long-running child to exit, killing it (and failing) after `timeout`.
pub fn wait_exit(child: &mut Child, timeout: Duration, what: &str) -> ExitStatus {
    wait_until(child, Instant::now() + timeout).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{what} did not exit within {timeout:?}");
    })
}

/// Lines of a long-running child's stdout (or stderr), read by a thread.
pub fn line_reader(source: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The directory of the programs `e2e/bin.sh` builds (`--print`: nothing is built here).
fn bin_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/bin.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg("--print")
            .output()
            .ok()?;
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .as_deref()
}

/// `name` as `e2e/bin.sh` built it (the versions the e2e cluster runs), else `name` from PATH.
pub fn our_bin(name: &str) -> PathBuf {
    bin_dir()
        .map(|dir| dir.join(name))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// What `e2e/bin.sh` keeps beside its bin directory under `name` (CRDs of peer tools).
pub fn our_data(name: &str) -> PathBuf {
    let dir = bin_dir().and_then(Path::parent).unwrap_or(Path::new("."));
    dir.join(name)
}

/// The kubectl built for the e2e cluster (e2e/bin.sh), not whatever is first on PATH.
pub fn kubectl() -> Command {
    Command::new(our_bin("kubectl"))
}

/// A free port on loopback (bound and released: a small race, fine for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
