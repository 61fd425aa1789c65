//! The `agentctl` command line. stdout is protocol (ACP lines, event lines, the restore
//! report); everything for humans goes to stderr through `tracing` (`RUST_LOG`).
// The doc comments below double as `--help` text, where `<workspace>` reads right and
// backticks would not; rustdoc would take them for HTML tags.
#![allow(rustdoc::invalid_html_tags)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

use super::checkout::{self, GitCredentials, Repository, Worktree, write_termination_message};
use super::hub::HubConfig;
use super::journal::JOURNAL_FILE;
use super::launch::plan_launch;
use super::serve::{ServeOptions, serve};
use super::socket::resolve_socket_path;
use super::{AgentctlError, client, history};
use crate::acp::{AcpTimeouts, RestoreOptions, RestoreReport, SpawnOptions};
use crate::agents::{AgentProfile, AgentRegistry};
use crate::api::EffectivePolicy;
use crate::api::bounds::cap;
use crate::api::pod_contract;
use crate::history::{NO_HISTORY_EXIT_CODE, validate_session_id};
use crate::telemetry::{self, LogSettings};

/// `agentctl answer`'s exit code when serve refused the answer (no such request waits, or no
/// option of that kind).
pub const ANSWER_REFUSED_EXIT_CODE: i32 = 3;

/// agentctl — the in-pod supervisor of one AI coding agent (kandev-operator).
///
/// In a TaskSession's pod, `agentctl serve` is the container's main process: it starts the
/// agent in ACP mode and keeps it running for the pod's lifetime. The operator reaches it with
/// `kubectl exec <pod> -- agentctl connect` (one ACP client at a time) and follows it with
/// `agentctl events`. Logs go to stderr (filter with RUST_LOG); stdout is protocol only.
#[derive(Parser, Debug)]
#[command(name = "agentctl", version, propagate_version = true)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, env = pod_contract::ENV_LOG_FORMAT, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start the agent and serve it on a unix socket until the agent exits (the container's
    /// main process).
    ///
    /// The agent is started in ACP mode (the profile's launch command, or the command after
    /// `--`) and initialized once; its stdio is held for the pod's lifetime. Clients connect
    /// to the socket and send one hello line: {"mode":"acp"} for a JSON-RPC bridge to the
    /// agent (one client at a time; a second one gets error -32001 "agentctl busy" and is
    /// closed; `initialize` is answered from the cached response; the client leaves with
    /// {"jsonrpc":"2.0","method":"_kandev/disconnect"} or by closing the socket, and the agent
    /// keeps running), {"mode":"events"} for a stream of event lines (a snapshot of the current
    /// state, then session_created, session_config, prompt_started, prompt_finished,
    /// permission_requested, permission_resolved, agent_exited), or {"mode":"answer"} for one
    /// answer to a held permission request (`agentctl answer`). The agent's permission requests
    /// go to an acp client only if its hello says "permissions":true (`connect --permissions`);
    /// otherwise the policy of --permissions answers them or holds them for `agentctl answer`.
    /// After a session/new, session/load or session/resume whose params carry
    /// "_meta":{"kandev.dev/session-config":{mode,model,configOptions}} (the wanted
    /// configuration), agentctl itself sends session/set_mode, session/set_model and
    /// session/set_config_option for the values the session reports differently and offers,
    /// before the client gets the answer; a refused one is reported as config_set_back_failed
    /// and the session stands. A
    /// session/new|load|resume or session/prompt whose params carry
    /// "_meta":{"kandev.dev/launch":<id>} reaches the agent once per launch id, method and
    /// session: a repeat gets the first one's answer. The conversation is recorded under
    /// <workspace>/.kandev/sessions/<session-name>.jsonl (updates the agent replays during
    /// session/load are history already and not recorded again); for profiles with
    /// historyContextInjection, the first prompt after a fresh session/new is wrapped once in
    /// that history.
    ///
    /// Memory is bounded: every line is at most 1 MiB (--replay-line-limit-mib while a
    /// session/load is open) and is dropped unread past that, queues are bounded, and a client
    /// that stops reading for 30 s is disconnected. An agent that writes a longer line or leaves
    /// 1024 messages unread on its stdin is cut off: the client's open requests fail with error
    /// -32090 naming the bound, the agent is killed and serve exits non-zero.
    ///
    /// Exits non-zero when the agent exits, so the pod ends and the operator sees a lost pod;
    /// on SIGTERM it closes the agent's stdin, waits up to 10 s, and exits 0. Before it exits,
    /// it waits up to 3 s for a connected client to take its last answer and leave.
    Serve(Box<ServeArgs>),
    /// Bridge stdin/stdout to the served agent, one JSON-RPC message per line (what the
    /// operator runs through `kubectl exec`).
    ///
    /// Exits 0 after forwarding a {"jsonrpc":"2.0","method":"_kandev/disconnect"} line from
    /// stdin, or when agentctl closes the connection; stdin reaching EOF also ends the
    /// session, but is not needed (some exec transports never close stdin). Exits 1 with a
    /// message on stderr when nothing serves the socket or another client is connected.
    Connect(ConnectArgs),
    /// Print the served agent's events as JSON lines until the agent exits (for the operator).
    ///
    /// With --since N, first the journal entries after sequence number N (serve keeps every
    /// event in <workspace>/.kandev/journal.jsonl, the last 1024 replayable; a cursor older than
    /// that gets {"event":"journal_gap"} first). Then a
    /// {"event":"snapshot","sessionId":…|null,"promptActive":…,"seq":<newest>} with the current
    /// state, then (unless --once; with --until-idle only while a prompt is active) one object per
    /// line as things happen:
    /// {"event":"session_created","sessionId":…,"method":…},
    /// {"event":"session_config","sessionId":…,"config":{"mode","model","configOptions":[{id,
    /// value}]}} (the mode, model and config options the agent reports, on every change),
    /// {"event":"config_set_back_failed","sessionId":…,"method":…,"error":{code,message}},
    /// {"event":"prompt_started","sessionId":…}, {"event":"prompt_finished","sessionId":…,
    /// "stopReason":…} (or "error":{code,message}),
    /// {"event":"permission_requested","sessionId":…,"request":{id,toolKind,title,summary,
    /// options,requestedAt}} (held for a person),
    /// {"event":"permission_resolved","sessionId":…,"requestId":…,"toolKind":…,"outcome":…,
    /// "optionId":…,"reason":…}, {"event":"agent_exited","code":…}. Each
    /// event has a "timestamp", its "seq", the operator's "launch" it happened in and the "pod";
    /// prompt_finished and the snapshot also carry "lastMessageId", the ACP messageId of the
    /// session's last message, when the agent sends message ids; the snapshot lists the
    /// permission requests held ("pendingPermissions"). While following live, serve
    /// also sends {"event":"heartbeat","timestamp":…} every 10 s (not journaled, no "seq");
    /// events exits 1 when serve sends nothing for 30 s (a serve that does not answer).
    Events(EventsArgs),
    /// Answer a permission request that waits for a person (what the operator runs when the
    /// TaskSession's kandev.dev/permission-answer annotation names one).
    ///
    /// Prints one JSON line: {"request":…,"outcome":"approved|rejected"} when the agent got
    /// the option of that kind (exit 0), or {"request":…,"refused":…} when no such request waits
    /// (answered already, timed out, gone with the agent) or it offers no option of that kind
    /// (exit 3). Exits 1 when nothing serves the socket.
    Answer(AnswerArgs),
    /// Debugging: start an agent locally, restore a session the way the operator would, and
    /// print the outcome as one JSON object.
    ///
    /// Prints {"method":…,"sessionId":…,"outcome":"restored|fresh|failed","reason":…,
    /// "capabilities":{…}}. Exits 0 when restored or started fresh, 1 when failed.
    Restore(RestoreArgs),
    /// Print a session's recorded history: the JSONL file serve writes,
    /// <workspace>/.kandev/sessions/<session-name>.jsonl, byte for byte (one entry per line:
    /// user_message, agent_message, tool_call, tool_result, each with a timestamp).
    ///
    /// In an agentctl pod it needs no flags: the session name comes from KANDEV_SESSION_NAME
    /// and the workspace is the working directory (`kubectl exec <pod> -c agentctl -- agentctl
    /// history`). Exits 0 after printing, 3 when the session has no recorded history yet (the
    /// file does not exist; nothing on stdout), 1 on any other failure.
    History(HistoryArgs),
    /// Prepare the workspace from --repository and exit (the agentctl pod's init container):
    /// clone it into an empty workspace and check out --branch (on the session's first start
    /// only), accept this repository's earlier clone as it is, refuse anything else.
    ///
    /// Only this command gets the repository's credentials (KANDEV_GIT_*): the operator puts
    /// them into the init container's environment alone, so the agent's container, its
    /// processes and everything exec'd into it never hold them. Exits 0 when the workspace is
    /// ready (also without --repository: nothing to do), 1 when it is not, after writing
    /// "<Reason>: <message>" to --termination-log (WorkspaceMismatch, WorkspaceEmpty,
    /// RepositoryAuthFailed, RepositoryUnreachable, RepositoryCheckoutFailed), which the
    /// operator turns into the launch's Stalled reason.
    Checkout(CheckoutArgs),
    /// Do nothing for SECONDS, or until SIGTERM, then exit 0 (the main process of a history
    /// reader pod, which the operator keeps so that `kubectl kandev history` can exec
    /// `agentctl history` in it while no agent pod runs; the image needs no shell).
    Sleep(SleepArgs),
}

#[derive(Args, Debug)]
pub struct SleepArgs {
    /// How long to wait.
    #[arg(value_name = "SECONDS")]
    pub seconds: u64,
}

/// Where the serve socket is.
#[derive(Args, Debug, Clone)]
pub struct SocketArgs {
    /// The agentctl unix socket [default: <workspace>/.kandev/agentctl.sock]. Must be shorter
    /// than 108 bytes.
    #[arg(long, env = pod_contract::ENV_AGENTCTL_SOCKET, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The workspace volume's mount path, used to find the default socket.
    #[arg(long, env = pod_contract::ENV_WORKSPACE, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

impl SocketArgs {
    fn path(&self) -> Result<PathBuf, AgentctlError> {
        resolve_socket_path(self.socket.as_deref(), self.workspace.as_deref())
    }
}

#[derive(Args, Debug)]
pub struct EventsArgs {
    #[command(flatten)]
    pub socket: SocketArgs,
    /// Replay the journal entries after this sequence number first.
    #[arg(long, value_name = "SEQ")]
    pub since: Option<u64>,
    /// Stop after the replay and the snapshot instead of following live.
    #[arg(long)]
    pub once: bool,
    /// Follow live only while a prompt is active: stop once the agent is idle (at once if it
    /// is idle after the snapshot).
    #[arg(long, conflicts_with = "once")]
    pub until_idle: bool,
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// The session whose history to print (the name serve records under: the TaskSession's
    /// name in agentctl pods).
    #[arg(
        long,
        visible_alias = "session",
        env = pod_contract::ENV_SESSION_NAME,
        value_name = "NAME"
    )]
    pub session_name: Option<String>,
    /// The workspace volume's mount path [default: the working directory].
    #[arg(long, env = pod_contract::ENV_WORKSPACE, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Print this history file instead of the session's (--session-name and --workspace are
    /// then ignored, so it works in a pod, where KANDEV_SESSION_NAME is set).
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The workspace volume's mount path (history goes to <DIR>/.kandev/sessions).
    #[arg(long, env = pod_contract::ENV_WORKSPACE, value_name = "DIR")]
    pub workspace: PathBuf,
    /// The unix socket to serve [default: <workspace>/.kandev/agentctl.sock]. Must be shorter
    /// than 108 bytes.
    #[arg(long, env = pod_contract::ENV_AGENTCTL_SOCKET, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Agent profile (claude-code, codex, copilot, auggie, gemini, amp, opencode, or one from
    /// --profiles-file): launch command, environment, history injection, CLI resume flags.
    #[arg(long, env = pod_contract::ENV_AGENT_PROFILE, value_name = "NAME")]
    pub profile: Option<String>,
    /// YAML/JSON file that extends or overrides the built-in agent profiles.
    #[arg(long, env = pod_contract::ENV_PROFILES_FILE, value_name = "FILE")]
    pub profiles_file: Option<PathBuf>,
    /// A profiles document (YAML/JSON) merged last, over the built-ins and --profiles-file. The
    /// operator passes the session's effective profile here, so custom profiles and per-session
    /// capability overrides reach the pod without a config file.
    #[arg(long, env = pod_contract::ENV_AGENT_PROFILE_DEFINITION, value_name = "YAML")]
    pub profile_definition: Option<String>,
    /// Name of the history file [default: the ACP session id]. Use the TaskSession's name so
    /// the history survives a fresh agent session.
    #[arg(long, env = pod_contract::ENV_SESSION_NAME, value_name = "NAME")]
    pub session_name: Option<String>,
    /// Resume token (ACP session id). Only used to start profiles that restore by command-line
    /// flags (cliResume and `nativeSessionResume: false`); ACP restores are the client's job.
    #[arg(long, env = pod_contract::ENV_RESUME_TOKEN, value_name = "TOKEN")]
    pub resume_token: Option<String>,
    /// The agent's working directory [default: the workspace].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// How long the agent may take to answer agentctl's `initialize`.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub initialize_timeout: u64,
    #[command(flatten)]
    pub repository: RepositoryArgs,
    /// Where to write why the workspace could not be prepared ("<Reason>: <message>"), or that
    /// the session was suspended ("Suspended: …"), for the container's termination message (the
    /// operator passes /dev/termination-log).
    #[arg(long, value_name = "FILE")]
    pub termination_log: Option<PathBuf>,
    /// Seconds the agent may stay idle (initialized, no prompt, no client connected) before
    /// serve stops it and exits 0: the session is suspended, and a resume brings it back. 0:
    /// never.
    #[arg(
        long,
        env = pod_contract::ENV_SUSPEND_IDLE_AFTER,
        value_name = "SECS",
        default_value_t = 0
    )]
    pub suspend_idle_after: u64,
    /// What the agent's permission requests get when no client that decides is connected, as
    /// JSON: {"default":"allow|ask|deny","rules":[{"kinds":["edit",…],"action":…}],
    /// "askTimeoutSeconds":N} (0: no timeout). `ask` holds a request until `agentctl answer`
    /// or the timeout. [default: read, search, think, edit, move, delete and switch_mode
    /// allowed, everything else asked, 900 s]
    #[arg(long, env = pod_contract::ENV_PERMISSIONS, value_name = "JSON")]
    pub permissions: Option<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// The agent command, instead of (or overriding) the profile's launch command.
    #[arg(
        last = true,
        value_name = "AGENT COMMAND",
        required_unless_present = "profile"
    )]
    pub command: Vec<String>,
}

/// The session's repository (`spec.repository`), for `checkout` and `serve`.
#[derive(Args, Debug, Clone)]
pub struct RepositoryArgs {
    /// Git repository for the workspace: cloned into it when it is empty and this is the
    /// session's first start (see --started-before; then --branch is
    /// checked out, created from --base-branch or the remote's default branch when the remote
    /// does not have it), left alone when it is already this repository's clone, refused when
    /// it holds anything else. Credentials come from KANDEV_GIT_PASSWORD (and
    /// KANDEV_GIT_USERNAME), KANDEV_GIT_SSH_KEY with KANDEV_GIT_KNOWN_HOSTS, and
    /// KANDEV_GIT_CA_BUNDLE; nothing started later inherits them, and the clone keeps none of
    /// them (its remote URL is the one given, so a later fetch needs its own credentials).
    #[arg(long, env = pod_contract::ENV_REPOSITORY_URL, value_name = "URL")]
    pub repository: Option<String>,
    /// The branch the agent works on (see --repository).
    #[arg(long, env = pod_contract::ENV_REPOSITORY_BRANCH, value_name = "BRANCH")]
    pub branch: Option<String>,
    /// The branch a new --branch starts from [default: the remote's default branch].
    #[arg(long, env = pod_contract::ENV_REPOSITORY_BASE_BRANCH, value_name = "BRANCH")]
    pub base_branch: Option<String>,
    /// How long the clone may take before it is killed.
    #[arg(long, value_name = "SECS", default_value_t = 90)]
    pub clone_timeout: u64,
    /// The session's checkout was recorded on an earlier start (the operator passes it): an
    /// empty workspace is then refused (WorkspaceEmpty) instead of cloned into, since a new
    /// clone would pass as the session's lost one.
    #[arg(long)]
    pub started_before: bool,
}

#[derive(Args, Debug)]
pub struct CheckoutArgs {
    /// The workspace volume's mount path: where the repository is cloned.
    #[arg(long, env = pod_contract::ENV_WORKSPACE, value_name = "DIR")]
    pub workspace: PathBuf,
    #[command(flatten)]
    pub repository: RepositoryArgs,
    /// Where to write why the workspace could not be prepared ("<Reason>: <message>"), for the
    /// container's termination message (the operator passes /dev/termination-log).
    #[arg(long, value_name = "FILE")]
    pub termination_log: Option<PathBuf>,
}

/// The line limits of the ACP stream.
#[derive(Args, Debug, Clone, Copy)]
pub struct LimitArgs {
    /// Longest line while a session/load replays the transcript, in MiB (every other line:
    /// 1 MiB). serve cuts off an agent that writes a longer line; connect passes lines up to
    /// this long. The operator sets it in agent pods from its --acp-replay-line-limit-mib.
    #[arg(
        long,
        env = pod_contract::ENV_REPLAY_LINE_LIMIT_MIB,
        value_name = "MIB",
        default_value_t = 8,
        value_parser = clap::value_parser!(u64).range(1..=crate::jsonrpc::codec::MAX_REPLAY_LINE_LIMIT_MIB)
    )]
    pub replay_line_limit_mib: u64,
}

impl LimitArgs {
    fn replay_line_limit(self) -> usize {
        crate::jsonrpc::codec::mib(self.replay_line_limit_mib)
    }
}

#[derive(Args, Debug)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Replace a connected ACP client instead of failing as busy (for a client whose exec
    /// stream died without closing its connection).
    #[arg(long)]
    pub takeover: bool,
    /// This client answers the agent's permission requests itself (an interactive prompt);
    /// without it they go to the session's policy.
    #[arg(long)]
    pub permissions: bool,
}

#[derive(Args, Debug)]
pub struct AnswerArgs {
    #[command(flatten)]
    pub socket: SocketArgs,
    /// The held request's id (as in the events and status.pendingPermissions, e.g. `t3b9qk-2`).
    #[arg(value_name = "REQUEST")]
    pub request: String,
    /// The kind of option to choose.
    #[arg(value_name = "OPTION_KIND", value_parser = ["allow_once", "allow_always", "reject_once", "reject_always"])]
    pub option_kind: String,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The ACP session id to restore, or `-` for none (start fresh).
    #[arg(long, value_name = "ID|-")]
    pub token: String,
    /// The session's working directory (sent to the agent; also the agent's cwd).
    #[arg(long, value_name = "DIR")]
    pub cwd: PathBuf,
    /// Deadline for each ACP call, in seconds [default: 30 for initialize, 120 for the
    /// restore].
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Agent profile: supplies nativeSessionResume, the environment, and the command when none
    /// is given after `--`.
    #[arg(long, env = pod_contract::ENV_AGENT_PROFILE, value_name = "NAME")]
    pub profile: Option<String>,
    /// YAML/JSON file that extends or overrides the built-in agent profiles.
    #[arg(long, env = pod_contract::ENV_PROFILES_FILE, value_name = "FILE")]
    pub profiles_file: Option<PathBuf>,
    /// Ignore the token and start a fresh session (the token is kept, not deleted).
    #[arg(long)]
    pub fresh: bool,
    /// The agent command.
    #[arg(
        last = true,
        value_name = "AGENT COMMAND",
        required_unless_present = "profile"
    )]
    pub command: Vec<String>,
}

/// Parses the command line, runs the command, and returns the process exit code: 0 success,
/// 1 failure (2 for usage errors, from clap). The caller exits with it: `std::process::exit`
/// rather than returning from `main`, because the runtime would otherwise wait forever for the
/// blocking stdin read of `connect` (kwok never closes stdin).
pub fn run_cli() -> i32 {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("agentctl: cannot start the async runtime: {error}");
            return 1;
        }
    };
    // The OTLP exporter's batch task runs on the runtime.
    let telemetry = {
        let _runtime = runtime.enter();
        match telemetry::init(log_settings(&cli)) {
            Ok(telemetry) => Some(telemetry),
            Err(error) => {
                eprintln!("agentctl: {error}");
                None
            }
        }
    };
    let sealed = super::seal::seal_if_holding_credentials();
    if matches!(cli.command, Command::Serve(_) | Command::Checkout(_)) {
        match sealed {
            Some(true) => tracing::info!(
                "repository credentials in the environment: agentctl is not dumpable, so only a privileged process can read its environment"
            ),
            Some(false) => tracing::warn!(
                "repository credentials in the environment, but agentctl could not make itself non-dumpable: a process of the same user may read them"
            ),
            None => {}
        }
    }
    let code = runtime.block_on(async {
        let code = run(cli.command).await;
        if let Some(telemetry) = telemetry {
            telemetry.shutdown().await;
        }
        code
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

fn log_settings(cli: &Cli) -> LogSettings {
    // serve's and checkout's logs are container logs; the clients' stderr is someone's terminal
    // or the operator's exec stream, so they only speak up when something is wrong.
    let serve = matches!(cli.command, Command::Serve(_));
    let container = serve || matches!(cli.command, Command::Checkout(_));
    let default = if container { "info" } else { "warn" };
    LogSettings {
        filter: EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
        json: matches!(cli.log_format, LogFormat::Json),
        service: "kandev-agentctl",
        // Only serve, the pod's long-lived process, exports spans: the agent's work is there.
        export: serve,
    }
}

async fn run(command: Command) -> i32 {
    let result = match command {
        Command::Serve(args) => run_serve(*args).await,
        Command::Connect(args) => match args.socket.path() {
            Ok(path) => {
                client::connect(
                    &path,
                    args.takeover,
                    args.permissions,
                    args.limits.replay_line_limit(),
                )
                .await
            }
            Err(error) => Err(error),
        },
        Command::Events(args) => match args.socket.path() {
            Ok(path) => client::events(&path, args.since, args.once, args.until_idle).await,
            Err(error) => Err(error),
        },
        Command::Answer(args) => match args.socket.path() {
            Ok(path) => client::answer(&path, &args.request, &args.option_kind).await,
            Err(error) => Err(error),
        },
        Command::Restore(args) => return run_restore(args).await,
        Command::Checkout(args) => run_checkout(&args).await,
        Command::Sleep(args) => sleep(args.seconds).await,
        Command::History(args) => {
            let workspace = args.workspace.unwrap_or_else(|| PathBuf::from("."));
            let source = match &args.file {
                Some(file) => history::HistorySource::File(file),
                None => history::HistorySource::Session {
                    workspace: &workspace,
                    session: args.session_name.as_deref().filter(|s| !s.is_empty()),
                },
            };
            history::print_history(&source).await
        }
    };
    match result {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("agentctl: {error}");
            match error {
                AgentctlError::NoHistory { .. } => NO_HISTORY_EXIT_CODE,
                AgentctlError::AnswerRefused { .. } => ANSWER_REFUSED_EXIT_CODE,
                _ => 1,
            }
        }
    }
}

/// `agentctl sleep`: the time passes, or SIGTERM comes (a pod deletion), whichever is first.
async fn sleep(seconds: u64) -> Result<(), AgentctlError> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(AgentctlError::io("cannot wait for SIGTERM"))?;
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        _ = term.recv() => {}
    }
    Ok(())
}

fn load_profile(
    name: Option<&str>,
    profiles_file: Option<&Path>,
    definition: Option<&str>,
) -> Result<Option<AgentProfile>, AgentctlError> {
    let Some(name) = name else {
        return Ok(None);
    };
    let mut registry = match profiles_file {
        Some(file) => AgentRegistry::load_file(file)?,
        None => AgentRegistry::builtin()?,
    };
    if let Some(definition) = definition {
        registry.extend_from_yaml(definition, "--profile-definition")?;
    }
    registry
        .get(name)
        .cloned()
        .map(Some)
        .ok_or_else(|| AgentctlError::UnknownProfile {
            name: name.to_owned(),
            known: registry.names().collect::<Vec<_>>().join(", "),
        })
}

async fn run_serve(args: ServeArgs) -> Result<(), AgentctlError> {
    let socket = resolve_socket_path(args.socket.as_deref(), Some(&args.workspace))?;
    if let Some(name) = &args.session_name {
        validate_session_id(name).map_err(AgentctlError::InvalidSessionName)?;
    }
    let profile = load_profile(
        args.profile.as_deref(),
        args.profiles_file.as_deref(),
        args.profile_definition.as_deref(),
    )?;
    let launch = plan_launch(
        profile.as_ref(),
        &args.command,
        args.resume_token.as_deref().filter(|t| !t.is_empty()),
    )?;
    let permissions = match args.permissions.as_deref().filter(|p| !p.trim().is_empty()) {
        Some(json) => serde_json::from_str(json).map_err(|error| {
            AgentctlError::InvalidPermissions(format!("{error} (in {})", cap(json, 200)))
        })?,
        None => EffectivePolicy::default(),
    };
    let cwd = args.cwd.clone().unwrap_or_else(|| args.workspace.clone());
    // Checked here: a missing cwd would otherwise surface as a misleading "cannot start the
    // agent: No such file or directory".
    if !cwd.is_dir() {
        return Err(AgentctlError::Io {
            context: format!(
                "the agent's working directory {} is not usable",
                cwd.display()
            ),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let worktree = prepare_workspace(
        &args.workspace,
        &args.repository,
        args.termination_log.as_deref(),
    )
    .await?;
    let session_cwd = std::path::absolute(&cwd)
        .unwrap_or_else(|_| cwd.clone())
        .to_string_lossy()
        .into_owned();
    let options = ServeOptions {
        socket,
        launch,
        cwd,
        history_dir: args.workspace.join(".kandev").join("sessions"),
        journal: args.workspace.join(".kandev").join(JOURNAL_FILE),
        pod: std::env::var(pod_contract::ENV_POD_NAME)
            .ok()
            .filter(|p| !p.is_empty()),
        hub: HubConfig {
            session_name: args.session_name.clone(),
            session_cwd: Some(session_cwd),
            history_injection: profile
                .as_ref()
                .is_some_and(|p| p.history_context_injection),
            worktree: worktree.and_then(|w| serde_json::to_value(w).ok()),
            permissions,
            permission_prefix: Some(permission_prefix(std::time::SystemTime::now())),
        },
        initialize_timeout: Duration::from_secs(args.initialize_timeout),
        replay_line_limit: args.limits.replay_line_limit(),
        suspend_idle_after: (args.suspend_idle_after > 0)
            .then(|| Duration::from_secs(args.suspend_idle_after)),
        termination_log: args.termination_log.clone(),
    };
    serve(options).await
}

/// The prefix of permission request ids of a serve started at `now`: the second it started, in
/// base 36 (six letters and digits), so that the ids of a pod's requests differ from those of
/// the session's earlier pods (an answer meant for one of them never reaches a later one).
fn permission_prefix(now: std::time::SystemTime) -> String {
    let mut seconds = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit((seconds % 36) as u32, 36).unwrap_or('0'));
        seconds /= 36;
        if seconds == 0 {
            break;
        }
    }
    digits.iter().rev().collect()
}

/// `agentctl checkout`: prepares the workspace, as serve would, and ends.
async fn run_checkout(args: &CheckoutArgs) -> Result<(), AgentctlError> {
    let worktree = prepare_workspace(
        &args.workspace,
        &args.repository,
        args.termination_log.as_deref(),
    )
    .await?;
    if let Some(worktree) = &worktree {
        tracing::info!(branch = ?worktree.branch, commit = ?worktree.commit, cloned = worktree.cloned, "workspace ready");
    }
    Ok(())
}

/// Clones `--repository` into the workspace on the first start (see [`super::checkout`]); why
/// it could not goes to `termination_log` too.
async fn prepare_workspace(
    workspace: &Path,
    args: &RepositoryArgs,
    termination_log: Option<&Path>,
) -> Result<Option<Worktree>, AgentctlError> {
    let nonempty = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    let Some(url) = nonempty(&args.repository) else {
        return Ok(None);
    };
    let repository = Repository {
        url,
        branch: nonempty(&args.branch),
        base_branch: nonempty(&args.base_branch),
    };
    let credentials = GitCredentials::from_env();
    let prepared = checkout::prepare(
        workspace,
        &repository,
        &credentials,
        Duration::from_secs(args.clone_timeout),
        if args.started_before {
            checkout::CheckoutStart::Later
        } else {
            checkout::CheckoutStart::First
        },
    )
    .await;
    if let (Err(AgentctlError::Checkout { reason, message }), Some(path)) =
        (&prepared, termination_log)
    {
        write_termination_message(path, *reason, message);
    }
    prepared.map(Some)
}

/// Prints exactly one JSON object and returns 0 (restored/fresh) or 1 (failed), even when the
/// agent could not be started at all.
async fn run_restore(args: RestoreArgs) -> i32 {
    let token = Some(args.token.as_str()).filter(|t| *t != "-" && !t.is_empty());
    let report = match restore(&args, token).await {
        Ok(report) => report,
        Err(error) => RestoreReport {
            method: crate::jsonrpc::method::INITIALIZE.into(),
            session_id: token.map(str::to_owned),
            outcome: crate::acp::OutcomeKind::Failed,
            reason: error.to_string(),
            capabilities: Default::default(),
        },
    };
    match serde_json::to_string(&report) {
        Ok(line) => println!("{line}"),
        Err(error) => {
            eprintln!("agentctl: cannot encode the restore report: {error}");
            return 1;
        }
    }
    match report.outcome {
        crate::acp::OutcomeKind::Failed => 1,
        _ => 0,
    }
}

async fn restore(args: &RestoreArgs, token: Option<&str>) -> Result<RestoreReport, AgentctlError> {
    let profile = load_profile(args.profile.as_deref(), args.profiles_file.as_deref(), None)?;
    let launch = plan_launch(profile.as_ref(), &args.command, None)?;
    let defaults = RestoreOptions::default();
    let options = RestoreOptions {
        profile_native_resume: profile
            .as_ref()
            .map_or(defaults.profile_native_resume, |p| p.native_session_resume),
        fresh_requested: args.fresh,
        timeouts: args.timeout.map_or(defaults.timeouts, |secs| {
            AcpTimeouts::uniform(Duration::from_secs(secs))
        }),
        spawn: SpawnOptions {
            env: launch
                .env
                .iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            ..defaults.spawn.clone()
        },
        ..defaults
    };
    crate::acp::restore_with_local_agent(&launch.argv, token, &args.cwd, options)
        .await
        .map_err(|error| AgentctlError::Restore(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Permission request ids start with when serve started, in base 36: short, and different
    /// in a pod started a second later.
    #[test]
    fn permission_ids_differ_between_pods() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |secs: u64| permission_prefix(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "0");
        assert_eq!(at(35), "z");
        assert_eq!(at(36), "10");
        assert_eq!(at(1_796_000_000).len(), 6);
        assert_ne!(at(1_796_000_000), at(1_796_000_001));
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_needs_a_profile_or_a_command() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|cli| cli.command);
        assert!(parse(&["agentctl", "serve", "--workspace", "/w"]).is_err());
        match parse(&[
            "agentctl",
            "serve",
            "--workspace",
            "/w",
            "--",
            "agent",
            "--acp",
        ]) {
            Ok(Command::Serve(args)) => assert_eq!(args.command, vec!["agent", "--acp"]),
            other => panic!("{other:?}"),
        }
        assert!(
            parse(&[
                "agentctl",
                "serve",
                "--workspace",
                "/w",
                "--profile",
                "codex"
            ])
            .is_ok()
        );
        assert!(
            parse(&[
                "agentctl", "restore", "--token", "-", "--cwd", "/w", "--", "a"
            ])
            .is_ok()
        );
    }
}
