//! `kubectl-kandev`, the kubectl plugin (DESIGN §4): `status`, `resume`, `prompt`, `history`,
//! `complete`, `cancel`, `permissions`, `approve`, `deny`.
//!
//! - [`cli`]: the command line and its `--help` text;
//! - [`status`]: the status snapshot (the operator's loaded objects, evaluated by its rules) and
//!   its view, the table and `-o json` document of `status` (table-tested);
//! - [`resume`]: what a resume request should do, what a handled request's outcome means, the
//!   report and the request token (table-tested), and the `resume` command;
//! - [`cluster`]: the API server — kubeconfig, reading a session with its executor and pods,
//!   setting the resume annotation (field manager `kandev-plugin`), kubectl's identity flags;
//! - `watch`: waits follow the session, its executor and its pods with watches;
//! - [`output`]: `-o text|json|yaml|jsonpath=…`;
//! - [`completion`]: shell completion (`kubectl_complete-kandev`, kubectl's plugin protocol);
//! - `end`: the `complete` and `cancel` commands (`spec.end`, then a wait for the terminal state);
//! - `prompt` and `history`: exec into the agentctl pod (`agentctl connect` for ACP, `agentctl
//!   history` for the history file); `prompt` starts with its pure rules (when a prompt may be
//!   sent or retried), `history` prints with the renderer of [`crate::history`];
//! - `ask`: `prompt` on a terminal answers the agent's permission requests itself (`agentctl
//!   connect --permissions`): the question, the answer letter and the option it picks;
//! - [`permissions`]: the `permissions`, `approve` and `deny` commands (the requests in
//!   `status.pendingPermissions` and the answer annotation `kandev.dev/permission-answer`).
//!
//! Exit codes ([`ExitCode`]): 0 ok, 1 failed, 2 usage, 3 not found, 4 not resumable, 5 timeout,
//! 6 cluster/API error, 7 prompt not resent.
//!
//! Everything it prints goes through [`escape_controls`]: status fields, history and the
//! agent's own words come from the cluster and the agent, and a terminal must not run their
//! escape sequences (an OSC 52 clipboard write, a cursor move that forges a line).

/// `eprintln!` with the line's control characters escaped ([`escape_controls`]).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::plugin::write_stderr(&format!("{}\n", format_args!($($arg)*)))
    };
}

mod ask;
pub mod cli;
pub mod cluster;
pub mod completion;
mod end;
mod error;
mod history;
pub mod output;
pub mod permissions;
mod prompt;
pub mod resume;
pub mod status;
#[cfg(test)]
mod test_support;
mod watch;

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::EnvFilter;

pub use error::{EXIT_CODES_HELP, ExitCode, PluginError, format_duration, parse_duration};

use crate::api::SessionEnd;
use cli::{Cli, Command};
use cluster::Cluster;
use output::OutputFormat;
use status::StatusView;

/// Parses the command line, runs the command and returns the exit code (the binary exits with
/// it). Errors are printed on stderr as one `error: …` line.
pub fn run_cli() -> i32 {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // kubectl's plugin completion runs `kubectl_complete-kandev ARGS… WORD`: the binary linked
    // under that name, or `kubectl-kandev __complete ARGS… WORD`.
    let invoked_as = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked_as.starts_with(completion::COMPLETION_BINARY) {
        return completion::run(args.split_off(1));
    }
    if args.get(1).is_some_and(|a| a == completion::COMPLETE_ARG) {
        return completion::run(args.split_off(2));
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            // --help and --version exit 0, real usage errors 2.
            let _ = error.print();
            return error.exit_code();
        }
    };
    if let Err(message) = cli.global.validate() {
        say!("error: {message}");
        return ExitCode::Usage.code();
    }
    init_tracing();
    let prompt_text = match &cli.command {
        Command::Prompt(args) => match prompt_text(&args.text) {
            Ok(text) => Some(text),
            Err(message) => {
                say!("error: {message}");
                return ExitCode::Usage.code();
            }
        },
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            say!("error: cannot start the async runtime: {error}");
            return ExitCode::Failed.code();
        }
    };
    let result = runtime.block_on(run(cli, prompt_text));
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(code) => code.code(),
        Err(error) => {
            say!("error: {error}");
            error.exit_code().code()
        }
    }
}

fn init_tracing() {
    // kube's client logs every failed request at ERROR; our one error line says it better.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,kube_client=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// The prompt argument, or stdin for `-`; never empty.
fn prompt_text(arg: &str) -> Result<String, error::UsageError> {
    let text = if arg == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(error::UsageError::PromptStdin)?
    } else {
        arg.to_string()
    };
    if text.trim().is_empty() {
        Err(error::UsageError::EmptyPrompt)
    } else {
        Ok(text)
    }
}

async fn run(cli: Cli, prompt_text: Option<String>) -> Result<ExitCode, PluginError> {
    let cluster = Cluster::connect(&cli.global).await?;
    match cli.command {
        Command::Status(args) => {
            let snapshot = cluster.snapshot(&args.session).await?;
            let view = StatusView::new(&snapshot);
            print_object(&view, &args.output, || view.table())?;
            Ok(ExitCode::Ok)
        }
        Command::Resume(args) => resume::resume(&cluster, args, false).await,
        Command::Restart(args) => resume::resume(&cluster, args, true).await,
        Command::Prompt(args) => {
            let text = prompt_text.unwrap_or_else(|| args.text.clone());
            prompt::prompt(
                &cluster,
                &args.session,
                &text,
                args.timeout,
                ask::asks_here(),
            )
            .await
        }
        Command::History(args) => history::history(&cluster, args).await,
        Command::Complete(args) => end::end(&cluster, args, SessionEnd::Completed).await,
        Command::Cancel(args) => end::end(&cluster, args, SessionEnd::Cancelled).await,
        Command::Permissions(args) => permissions::permissions(&cluster, args).await,
        Command::Approve(args) => {
            permissions::answer(&cluster, args, permissions::Verdict::Approve).await
        }
        Command::Deny(args) => {
            permissions::answer(&cluster, args, permissions::Verdict::Deny).await
        }
    }
}

/// `text` with every control character but newline and tab written out as an escape
/// (`\u{1b}`), C1 controls included: what the plugin prints can hold no terminal sequence.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let kept = |c: char| !c.is_control() || c == '\n' || c == '\t';
    if text.chars().all(kept) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if kept(c) {
            escaped.push(c);
        } else {
            escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// Writes to stderr, control characters escaped; a closed stderr is not an error.
pub(crate) fn write_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(escape_controls(text).as_bytes());
}

/// Writes to stdout, control characters escaped; a closed pipe (`| head`) is not an error.
pub(crate) fn write_stdout(text: &str) -> Result<(), PluginError> {
    let mut out = std::io::stdout().lock();
    match out
        .write_all(escape_controls(text).as_bytes())
        .and_then(|()| out.flush())
    {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(PluginError::Io {
            context: "writing to stdout".into(),
            source: error,
        }),
        _ => Ok(()),
    }
}

/// An object as kubectl prints it: without `metadata.managedFields`.
pub(crate) fn shown(mut session: crate::api::TaskSession) -> crate::api::TaskSession {
    session.metadata.managed_fields = None;
    session
}

/// Prints `value` in the `-o` format, or `text()` for the default text output.
pub(crate) fn print_object(
    value: &impl serde::Serialize,
    format: &OutputFormat,
    text: impl FnOnce() -> String,
) -> Result<(), PluginError> {
    let failed = |reason: String| PluginError::Exec {
        action: "printing the output (-o)".into(),
        reason,
    };
    let value = serde_json::to_value(value).map_err(|e| failed(e.to_string()))?;
    match output::render(&value, format).map_err(|e| failed(e.to_string()))? {
        Some(rendered) => write_stdout(&rendered),
        None => write_stdout(&text()),
    }
}

#[cfg(test)]
mod tests {
    use super::escape_controls;

    #[test]
    fn control_characters_are_printed_as_escapes() {
        #[rustfmt::skip]
        let rows: Vec<(&str, &str)> = vec![
            ("plain text, ünïcode ✓", "plain text, ünïcode ✓"),
            ("lines\nand\ttabs stay", "lines\nand\ttabs stay"),
            // An OSC 52 clipboard write and a CSI cursor move.
            ("\u{1b}]52;c;ZXZpbA==\u{7}x", "\\u{1b}]52;c;ZXZpbA==\\u{7}x"),
            ("ok\u{1b}[2K\rforged", "ok\\u{1b}[2K\\u{d}forged"),
            // A C1 control (8-bit CSI) and DEL.
            ("\u{9b}31m\u{7f}", "\\u{9b}31m\\u{7f}"),
        ];
        for (text, expected) in rows {
            assert_eq!(escape_controls(text), expected, "{text:?}");
        }
    }
}
