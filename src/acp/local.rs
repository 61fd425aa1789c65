//! An agent run as a local child process, and the core of `agentctl restore`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::AcpError;
use super::client::{AcpClient, AcpTimeouts};
use super::outcome::RestoreReport;
use crate::resume::NativeSessionResume;

/// Where the agent's stderr goes. Its stdout is always the ACP stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentStderr {
    /// Shared with ours: simplest to debug, and agentctl's own stderr is already collected.
    #[default]
    Inherit,
    /// Each line as a `debug` event (target `kandev_operator::acp::agent_stderr`), for callers
    /// whose stderr must stay clean.
    Log,
    /// Dropped.
    Discard,
}

/// How to start the agent process.
#[derive(Clone, Debug, Default)]
pub struct SpawnOptions {
    /// Added to (or overriding) our environment, e.g. `IS_SANDBOX=1` or a test's `HOME`.
    pub env: Vec<(OsString, OsString)>,
    /// Removed from the inherited environment, e.g. credentials a test must not pass on.
    pub env_remove: Vec<OsString>,
    /// The process's working directory; [`restore_with_local_agent`] defaults it to the session
    /// cwd.
    pub current_dir: Option<PathBuf>,
    pub stderr: AgentStderr,
}

/// What [`restore_with_local_agent`] does besides the token and cwd.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// The agent profile's `nativeSessionResume` (`auto` for every built-in profile).
    pub profile_native_resume: NativeSessionResume,
    /// The user asked for a fresh start: the token is ignored (not deleted).
    pub fresh_requested: bool,
    pub timeouts: AcpTimeouts,
    pub spawn: SpawnOptions,
    /// How long the agent may take to exit after its stdin closes before it is killed; lets it
    /// flush its session store.
    pub shutdown_grace: Duration,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        Self {
            profile_native_resume: NativeSessionResume::Auto,
            fresh_requested: false,
            timeouts: AcpTimeouts::default(),
            spawn: SpawnOptions::default(),
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

/// An agent child process with an [`AcpClient`] on its stdio. Killed when dropped, so a failed
/// or abandoned restore never leaves an agent behind.
pub struct LocalAgent {
    // Field order matters on drop: the client (and with it the agent's stdin) goes first.
    client: AcpClient,
    child: Child,
    stderr_task: Option<JoinHandle<()>>,
}

impl LocalAgent {
    /// Starts `cmd[0]` with arguments `cmd[1..]`, stdin/stdout piped for ACP.
    pub fn spawn(cmd: &[String], options: &SpawnOptions) -> Result<Self, AcpError> {
        let (program, args) = cmd.split_first().ok_or(AcpError::EmptyCommand)?;
        let mut command = Command::new(program);
        for key in &options.env_remove {
            command.env_remove(key);
        }
        command
            .args(args)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(match options.stderr {
                AgentStderr::Inherit => Stdio::inherit(),
                AgentStderr::Log => Stdio::piped(),
                AgentStderr::Discard => Stdio::null(),
            })
            .kill_on_drop(true);
        if let Some(dir) = &options.current_dir {
            command.current_dir(dir);
        }
        let spawn_error = |source| AcpError::Spawn {
            program: program.clone(),
            source,
        };
        let mut child = command.spawn().map_err(spawn_error)?;
        let missing = |what: &str| {
            spawn_error(std::io::Error::other(format!(
                "the agent's {what} is not piped"
            )))
        };
        let stdin = child.stdin.take().ok_or_else(|| missing("stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| missing("stdout"))?;
        let stderr_task = child.stderr.take().map(|stderr| {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "kandev_operator::acp::agent_stderr", "{line}");
                }
            })
        });
        tracing::debug!(program = %program, pid = child.id(), "agent started");
        Ok(Self {
            client: AcpClient::new(stdout, stdin),
            child,
            stderr_task,
        })
    }

    pub fn client(&self) -> &AcpClient {
        &self.client
    }

    pub fn client_mut(&mut self) -> &mut AcpClient {
        &mut self.client
    }

    /// The OS process id, while the process runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Closes the agent's stdin, gives it `grace` to exit on its own, then kills it.
    pub async fn shutdown(self, grace: Duration) -> std::io::Result<ExitStatus> {
        let Self {
            client,
            mut child,
            stderr_task,
        } = self;
        drop(client);
        let status = match tokio::time::timeout(grace, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::debug!("agent did not exit after its stdin closed; killing it");
                child.kill().await?;
                child.wait().await
            }
        };
        if let Some(task) = stderr_task {
            task.abort();
        }
        status
    }
}

/// The core of `agentctl restore --token <ID|-> --cwd DIR -- <agent command…>`: starts the
/// agent, runs `initialize` and the restore, stops the agent and reports.
///
/// `Err` only when the restore could not even begin (empty command, the program cannot be
/// started, a cwd that cannot be made absolute). Everything that happens on the wire, including
/// an agent that dies during `initialize`, is a report with `outcome: failed` (the CLI exits
/// non-zero for it); see [`RestoreReport`] for the shape.
pub async fn restore_with_local_agent(
    cmd: &[String],
    token: Option<&str>,
    cwd: &Path,
    options: RestoreOptions,
) -> Result<RestoreReport, AcpError> {
    // ACP requires an absolute cwd; resolving it here keeps a relative `--cwd` usable.
    let cwd = std::path::absolute(cwd).map_err(|source| AcpError::WorkingDirectory {
        path: cwd.to_owned(),
        source,
    })?;
    let mut spawn = options.spawn.clone();
    spawn.current_dir.get_or_insert_with(|| cwd.clone());
    let mut agent = LocalAgent::spawn(cmd, &spawn)?;
    let client = agent.client_mut();
    let outcome = client
        .restore(
            token,
            &cwd,
            options.profile_native_resume,
            options.fresh_requested,
            options.timeouts,
        )
        .await;
    let capabilities = client.negotiated_capabilities().unwrap_or_default();
    if let Err(error) = agent.shutdown(options.shutdown_grace).await {
        tracing::warn!(%error, "could not stop the agent cleanly");
    }
    Ok(RestoreReport::new(&outcome, capabilities))
}
