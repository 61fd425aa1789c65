//! The command line of `kubectl kandev` (clap). The doc comments are the `--help` text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::error::{EXIT_CODES_HELP, UsageError, parse_duration, parse_request_timeout};
use super::output::OutputFormat;

/// kubectl kandev — inspect, resume and talk to kandev TaskSessions (AI coding-agent sessions).
///
/// When an agent's pod is lost, the kandev operator marks its TaskSession "needs resume" and
/// relaunches nothing until someone asks. This plugin asks: `resume` sets the resume-request
/// annotation (a new token each time) and can wait until the operator has handled it;
/// `prompt` makes sure the agent runs (resuming it when needed) and streams its answer;
/// `status` and `history` show where a session stands and what was said; `permissions` lists
/// the agent's permission requests that wait for a person, `approve` and `deny` answer them.
///
/// Install: `kubectl krew install --manifest=kandev.yaml --archive=…` (see docs/install.md), or
/// put the `kubectl-kandev` binary on your PATH; kubectl finds it as `kubectl kandev`. Shell
/// completion: link `kubectl-kandev` as `kubectl_complete-kandev` on your PATH, then kubectl's
/// own completion (`source <(kubectl completion bash)`) completes verbs, flags and TaskSession
/// names.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl-kandev",
    bin_name = "kubectl kandev",
    version,
    propagate_version = true,
    after_help = EXIT_CODES_HELP,
    after_long_help = EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the cluster and the session are (the usual kubectl flags).
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Cluster options (kubectl's)")]
pub struct GlobalArgs {
    /// Namespace of the TaskSession [default: the kubeconfig context's namespace, else
    /// "default"].
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Path to the kubeconfig file [default: $KUBECONFIG, else ~/.kube/config; in a pod, the
    /// in-cluster service account].
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: the current context].
    #[arg(long, global = true, value_name = "CONTEXT")]
    pub context: Option<String>,
    /// Username to impersonate for the operation (a user or a service account, e.g.
    /// system:serviceaccount:team-a:ci).
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Group to impersonate for the operation; repeat it for several groups. Needs --as.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_groups: Vec<String>,
    /// Bearer token for authentication to the API server; it replaces the kubeconfig user's
    /// credentials (client certificate, token, exec plugin).
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// How long a single API request may take before giving up (e.g. 1s, 2m; 0 = no limit).
    /// Watches and exec streams (waits, prompts) are not cut by it; --timeout bounds a wait.
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        default_value = "0",
        value_parser = parse_request_timeout
    )]
    pub request_timeout: Duration,
}

impl GlobalArgs {
    /// What clap cannot check across global flags: `--as-group` needs `--as` (as in kubectl).
    pub fn validate(&self) -> Result<(), UsageError> {
        if !self.as_groups.is_empty() && self.as_user.is_none() {
            return Err(UsageError::GroupWithoutUser);
        }
        if self.token.as_deref() == Some("") {
            return Err(UsageError::EmptyToken);
        }
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show whether a session needs a resume, and why.
    ///
    /// Evaluates the session against its live agentctl pod with the operator's own rules
    /// (the TaskSession status may lag behind a pod that just died) and shows: state, task
    /// state, needs resume, resumable, reason, whether a resume token (the agent's ACP session
    /// id) is saved, the current pod, and how the last resume request ended (the Resumed
    /// condition and status.lastHandledResumeRequest).
    #[command(after_help = EXIT_CODES_HELP)]
    Status(StatusArgs),
    /// Ask the operator to resume a session whose agent is gone.
    ///
    /// Sets the annotation kandev.dev/resume-requested-at to a new token (field manager
    /// "kandev-plugin", so GitOps tools that prune kubectl-owned fields leave it alone) and
    /// prints the token. The operator restores the agent's saved session in a new pod on the
    /// same workspace. With --wait, waits until the operator has handled that token and prints
    /// the outcome: state, resume token before → after, and the Resumed condition.
    ///
    /// Nothing is requested for a session whose agent is already running ("already running",
    /// exit 0) or that the operator is still launching; a terminal session (COMPLETED,
    /// CANCELLED, FAILED without a resumable executor) is refused with exit code 4. When a
    /// resume is already in progress, it is awaited instead of adding a second one, unless its
    /// pod plainly cannot start (an image that cannot be pulled, a missing Secret, an
    /// unschedulable pod): then a new request supersedes it. --wait reports such a pod at once
    /// (exit code 1) instead of waiting out its timeout.
    #[command(after_help = EXIT_CODES_HELP)]
    Resume(ResumeArgs),
    /// Restart a session's agent so that it runs the spec as it is now.
    ///
    /// Changes to launch-time fields (image, repository, credentials, resources, capabilities,
    /// idle, permissions, sessionConfig) apply at the agent's next launch; until then the
    /// TaskSession's condition SpecApplied=False/PendingRestart names them. restart is a resume
    /// request that also sets kandev.dev/restart to its token: the operator replaces the running
    /// pod with one created from the current spec, on the same workspace, and restores the same
    /// agent session (the same resume token). On a session whose agent does not run, it is a
    /// plain resume. Like every resume request it is handled once (re-applying its token, e.g.
    /// by a GitOps rollback, does nothing). Refused (exit code 4) while a prompt runs. With
    /// --wait, waits until the operator has handled it and prints the outcome.
    #[command(after_help = EXIT_CODES_HELP)]
    Restart(ResumeArgs),
    /// Send a prompt to a session's agent and stream its answer.
    ///
    /// Makes sure the session runs first: if its agent is gone, requests a resume and waits
    /// (up to --timeout) until the session is WAITING_FOR_INPUT. Then connects to the agent
    /// through `kubectl exec <pod> -- agentctl connect`, sends the prompt to the agent's saved
    /// session, and prints the agent's answer on stdout as it arrives (tool calls go to stderr).
    /// The stop reason (end_turn, max_tokens, refusal, cancelled…) is printed on stderr at the
    /// end. A prompt reaches the agent at most once: if the pod vanishes while it runs, the
    /// session is resumed once, and the prompt is sent again only when agentctl's journal in
    /// the new pod shows that it never reached the agent; otherwise exit code 7 (see kubectl
    /// kandev history for how far the agent got). agentctl serves one client at a time:
    /// another client connected to the same session is refused as busy. Leaving (also with
    /// Ctrl-C) disconnects without stopping the agent.
    ///
    /// Permission requests: when stdin and stderr are a terminal, the agent's requests to run a
    /// tool are asked here (its kind, title and what it would do, then `allow once / always /
    /// reject? [y/a/N]`) and answered with the chosen option. Otherwise they go to the session's
    /// policy (spec.permissions): allowed, denied, or held for a person, shown by `kubectl kandev
    /// permissions SESSION` and answered with `kubectl kandev approve|deny SESSION ID`.
    ///
    /// Exit code 0 when the turn ended normally (end_turn, max_tokens, max_turn_requests), 1
    /// when the agent refused, the turn was cancelled, or the prompt failed.
    #[command(after_help = EXIT_CODES_HELP)]
    Prompt(PromptArgs),
    /// Print the session's recorded conversation.
    ///
    /// agentctl records the conversation on the workspace volume
    /// (<workspace>/.kandev/sessions/<session>.jsonl); it is read through the running agentctl
    /// pod with `kubectl exec … agentctl history` (nothing else is needed in the container).
    /// Without a running agent pod (lost, suspended, failed, completed or cancelled with its
    /// workspace kept), the operator starts a history reader pod on request (annotation
    /// kandev.dev/history-requested-at): the workspace mounted read-only, no agent, no
    /// credentials. It is read the same way and removed afterwards, also when the command is
    /// interrupted (at the latest 5 minutes later). Exit code 4 when the workspace PVC is gone.
    #[command(after_help = EXIT_CODES_HELP)]
    History(HistoryArgs),
    /// End a session as done: sets spec.end to Completed (once; it cannot be undone).
    ///
    /// The operator lets a running prompt finish (up to its end grace period, 10 minutes by
    /// default), stops the agent, and the session and its task become COMPLETED; resume requests
    /// are refused from then on. With --wait, waits until the session is COMPLETED.
    #[command(after_help = EXIT_CODES_HELP)]
    Complete(EndArgs),
    /// End a session as abandoned: sets spec.end to Cancelled (once; it cannot be undone).
    ///
    /// The operator cancels a running prompt (ACP session/cancel), stops the agent, and the
    /// session and its task become CANCELLED; resume requests are refused from then on. With
    /// --wait, waits until the session is CANCELLED.
    #[command(after_help = EXIT_CODES_HELP)]
    Cancel(EndArgs),
    /// List the agent's permission requests that wait for a person's answer.
    ///
    /// When the agent asks to run a tool and the session's policy (spec.permissions) says
    /// "ask", agentctl holds the request until someone answers it or its askTimeout passes; the
    /// operator shows it in status.pendingPermissions (and the AwaitingApproval condition). This
    /// lists them: ID, tool KIND, TITLE, the OPTIONS the agent offers, and AGE. -o yaml shows
    /// each request's summary (what the tool would do). Answer one with
    /// `kubectl kandev approve|deny SESSION ID`. Prints "no permission requests wait" when none
    /// does (exit 0).
    #[command(after_help = EXIT_CODES_HELP)]
    Permissions(PermissionsArgs),
    /// Allow a permission request the agent waits on (allow_once; --always: allow_always).
    ///
    /// Sets the annotation kandev.dev/permission-answer to `<ID>=allow_once` (or
    /// `<ID>=allow_always`) with a merge patch (field manager "kandev-plugin"); the operator
    /// relays the answer to the agent through agentctl. Anyone who may patch the TaskSession may
    /// answer; a GitOps tool can set the same annotation. Each value is handled once.
    ///
    /// Without ID, answers the only request that waits; when none or several wait it refuses
    /// (exit code 2) and lists them. A request that does not offer the option is refused before
    /// anything is set (exit code 2), naming what it offers. With --wait, waits until the
    /// request no longer waits and prints how it ended; an answer the operator refused (a
    /// PermissionAnswerRefused Event) exits 1.
    #[command(after_help = EXIT_CODES_HELP)]
    Approve(AnswerArgs),
    /// Reject a permission request the agent waits on (reject_once; --always: reject_always).
    ///
    /// Sets the annotation kandev.dev/permission-answer to `<ID>=reject_once` (or
    /// `<ID>=reject_always`) with a merge patch (field manager "kandev-plugin"); the operator
    /// relays the answer to the agent through agentctl. Anyone who may patch the TaskSession may
    /// answer; a GitOps tool can set the same annotation. Each value is handled once.
    ///
    /// Without ID, answers the only request that waits; when none or several wait it refuses
    /// (exit code 2) and lists them. A request that does not offer the option is refused before
    /// anything is set (exit code 2), naming what it offers. With --wait, waits until the
    /// request no longer waits and prints how it ended; an answer the operator refused (a
    /// PermissionAnswerRefused Event) exits 1.
    #[command(after_help = EXIT_CODES_HELP)]
    Deny(AnswerArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HistoryOutput {
    /// `[USER]: …`, `[ASSISTANT]: …`, `[TOOL CALL: name]`, `[TOOL RESULT: name] …`.
    Text,
    /// The recorded JSON lines, unchanged.
    Jsonl,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// Output format: text, json, yaml or jsonpath=TEMPLATE (kubectl's template syntax, e.g.
    /// -o jsonpath='{.state}{"\n"}').
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text", value_parser = parse_output)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// Wait until the operator has handled the request, then print the outcome; exit 0 if the
    /// session was restored or started, 1 if the resume failed.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits: 90s, 2m, 1m30s, 1h 30m, 500ms, 2 minutes, PT1M30S (ISO 8601) or
    /// a bare number of seconds. The default outlasts what the operator allows a resume with
    /// its default settings (a 120 s launch deadline for an earlier pod to go and one for the
    /// new pod to start, 30 s each for the exec and `initialize`, 120 s for the restore). While
    /// waiting on a terminal, where the session stands is printed on stderr at each change and
    /// every 30 s (nothing extra to a pipe or with -o json|yaml|jsonpath).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Start a fresh agent session instead of restoring the saved one: also sets
    /// kandev.dev/resume-fresh to the request's token. The saved resume token is not tried; once
    /// the fresh session runs, its id replaces it. Without --fresh, a leftover resume-fresh
    /// annotation is removed in the same patch.
    #[arg(long)]
    pub fresh: bool,
    /// Output format: text, json, yaml or jsonpath=TEMPLATE (kubectl's template syntax, e.g.
    /// -o jsonpath='{.state}{"\n"}').
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text", value_parser = parse_output)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct PromptArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// The prompt; `-` reads it from stdin.
    pub text: String,
    /// How long to wait for the session to be ready (resume included): 90s, 2m, 1m30s, 1h 30m,
    /// 500ms, 2 minutes, PT1M30S (ISO 8601) or a bare number of seconds; the default outlasts
    /// what the operator allows a resume. The turn itself has no time limit.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct EndArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// Wait until the session has ended.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits (90s, 15m, 1h 30m, PT15M or a bare number of seconds); a Completed
    /// session may wait for its running prompt.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Output format of the TaskSession (after --wait: as it ended): text (one line), json,
    /// yaml or jsonpath=TEMPLATE.
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text", value_parser = parse_output)]
    pub output: OutputFormat,
}

fn parse_output(text: &str) -> Result<OutputFormat, super::output::FormatError> {
    text.parse()
}

/// `-o` of `permissions`: the usual formats, or `name` (the request ids, one a line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListOutput {
    Name,
    Format(OutputFormat),
}

fn parse_list_output(text: &str) -> Result<ListOutput, UsageError> {
    if text == "name" {
        return Ok(ListOutput::Name);
    }
    match text.parse() {
        Ok(format) => Ok(ListOutput::Format(format)),
        Err(super::output::FormatError::Unknown(text)) => Err(UsageError::UnknownListOutput(text)),
        Err(error) => Err(UsageError::Output(error)),
    }
}

#[derive(Args, Debug)]
pub struct PermissionsArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// Output format: text (a table), json, yaml, name (the request ids, one a line) or
    /// jsonpath=TEMPLATE (e.g. -o jsonpath='{.pendingPermissions[*].id}').
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text", value_parser = parse_list_output)]
    pub output: ListOutput,
}

#[derive(Args, Debug)]
pub struct AnswerArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// The permission request's id (e.g. p3, as `kubectl kandev permissions` lists it)
    /// [default: the only request that waits].
    #[arg(value_name = "ID")]
    pub id: Option<String>,
    /// Answer with the request's "always" option (allow_always, reject_always) instead of the
    /// "once" one (allow_once, reject_once): the agent may remember the choice for tool calls
    /// like this one.
    #[arg(long)]
    pub always: bool,
    /// Wait until the request no longer waits, then print how it ended; exit 1 if the operator
    /// refused the answer or the request ended otherwise (timed out, went with the agent).
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits (90s, 2m, 1m30s, PT2M or a bare number of seconds).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Output format: text, json, yaml or jsonpath=TEMPLATE (e.g. -o jsonpath='{.outcome}').
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "text", value_parser = parse_output)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// Name of the TaskSession.
    pub session: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = HistoryOutput::Text)]
    pub output: HistoryOutput,
    /// Prefix each entry with its timestamp (text output).
    #[arg(long)]
    pub timestamps: bool,
    /// How long to wait for the history reader pod when no agent pod runs (same formats as
    /// resume's --timeout).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-kandev").chain(args.iter().copied()))
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = parse(&["-n", "team", "status", "demo", "-o", "json"]).expect("parse");
        assert_eq!(cli.global.namespace.as_deref(), Some("team"));
        let cli = parse(&[
            "status",
            "demo",
            "--namespace",
            "team",
            "--context",
            "dev",
            "--kubeconfig",
            "/k",
        ])
        .expect("parse");
        assert_eq!(cli.global.namespace.as_deref(), Some("team"));
        assert_eq!(cli.global.context.as_deref(), Some("dev"));
        assert_eq!(cli.global.kubeconfig, Some(PathBuf::from("/k")));
        match cli.command {
            Command::Status(args) => {
                assert_eq!(
                    (args.session.as_str(), args.output),
                    ("demo", OutputFormat::Text)
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn kubectl_identity_and_timeout_flags() {
        let cli = parse(&["status", "demo"]).expect("parse");
        assert_eq!(cli.global.as_user, None);
        assert!(cli.global.as_groups.is_empty());
        assert_eq!(cli.global.request_timeout, Duration::ZERO);
        let cli = parse(&[
            "--as",
            "alice",
            "status",
            "demo",
            "--as-group",
            "team-a",
            "--as-group=readers",
            "--token",
            "t0ken",
            "--request-timeout",
            "5s",
        ])
        .expect("parse");
        assert_eq!(cli.global.as_user.as_deref(), Some("alice"));
        assert_eq!(cli.global.as_groups, ["team-a", "readers"]);
        assert_eq!(cli.global.token.as_deref(), Some("t0ken"));
        assert_eq!(cli.global.request_timeout, Duration::from_secs(5));
        assert!(cli.global.validate().is_ok());
        let err = parse(&["status", "demo", "--request-timeout", "soon"]).expect_err("refused");
        assert_eq!(err.exit_code(), 2);
        let cli = parse(&["status", "demo", "--as-group", "g"]).expect("parse");
        assert_eq!(
            cli.global.validate().map_err(|e| e.to_string()),
            Err("--as-group needs --as (the user to impersonate)".into())
        );
    }

    #[test]
    fn output_formats_on_every_verb_that_prints_an_object() {
        for verb in ["status", "resume", "restart", "complete", "cancel"] {
            for (flag, json) in [
                ("json", true),
                ("yaml", false),
                ("jsonpath={.state}", false),
            ] {
                let cli = parse(&[verb, "demo", "-o", flag]).expect(verb);
                let output = match cli.command {
                    Command::Status(a) => a.output,
                    Command::Resume(a) | Command::Restart(a) => a.output,
                    Command::Complete(a) | Command::Cancel(a) => a.output,
                    other => panic!("{other:?}"),
                };
                assert_eq!(output == OutputFormat::Json, json, "{verb} -o {flag}");
                assert_ne!(output, OutputFormat::Text, "{verb} -o {flag}");
            }
            let err = parse(&[verb, "demo", "-o", "jsonpath={.state"]).expect_err("bad");
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains("unclosed"), "{err}");
        }
    }

    /// The plugin's default waits outlast what the operator allows a resume with its default
    /// settings ([`crate::resume::defaults`]), with a minute to spare for the watch and the
    /// status write.
    #[test]
    fn default_waits_outlast_the_operators_own_deadlines() {
        use crate::resume::defaults::{
            ACP_TIMEOUT, LAUNCH_DEADLINE, RESTORE_TIMEOUT, launch_within,
        };
        let operator = launch_within(LAUNCH_DEADLINE, ACP_TIMEOUT, RESTORE_TIMEOUT);
        let spare = Duration::from_secs(60);
        for argv in [&["resume", "demo"][..], &["prompt", "demo", "hi"][..]] {
            let timeout = match parse(argv).expect("parse").command {
                Command::Resume(args) => args.timeout,
                Command::Prompt(args) => args.timeout,
                other => panic!("{other:?}"),
            };
            assert!(
                timeout >= operator + spare,
                "{argv:?}: {timeout:?} < {operator:?}"
            );
        }
    }

    #[test]
    fn resume_defaults_and_flags() {
        match parse(&["resume", "demo"]).expect("parse").command {
            Command::Resume(args) => {
                assert!(!args.wait && !args.fresh);
                assert_eq!(
                    args.timeout,
                    Duration::from_secs(600),
                    "outlasts the operator"
                );
            }
            other => panic!("{other:?}"),
        }
        match parse(&["resume", "demo", "--wait", "--timeout", "2m", "--fresh"])
            .expect("parse")
            .command
        {
            Command::Resume(args) => {
                assert!(args.wait && args.fresh);
                assert_eq!(args.timeout, Duration::from_secs(120));
            }
            other => panic!("{other:?}"),
        }
        let err = parse(&["resume", "demo", "--timeout", "soon"]).expect_err("bad timeout");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn end_arguments() {
        match parse(&["cancel", "demo", "--wait"]).expect("parse").command {
            Command::Cancel(args) => {
                assert!(args.wait);
                assert_eq!(args.timeout, Duration::from_secs(900));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["complete", "demo"]).expect("parse").command,
            Command::Complete(_)
        ));
    }

    #[test]
    fn prompt_and_history_arguments() {
        match parse(&["prompt", "demo", "fix it", "--timeout", "10s"])
            .expect("parse")
            .command
        {
            Command::Prompt(args) => {
                assert_eq!(
                    (args.session.as_str(), args.text.as_str()),
                    ("demo", "fix it")
                );
                assert_eq!(args.timeout, Duration::from_secs(10));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(&["prompt", "demo"]).expect_err("no text").exit_code(),
            2
        );
        match parse(&["history", "demo", "-o", "jsonl"])
            .expect("parse")
            .command
        {
            Command::History(args) => assert_eq!(args.output, HistoryOutput::Jsonl),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn permission_verbs() {
        match parse(&["approve", "demo"]).expect("parse").command {
            Command::Approve(args) => {
                assert_eq!((args.session.as_str(), args.id), ("demo", None));
                assert!(!args.always && !args.wait);
                assert_eq!(args.timeout, Duration::from_secs(120));
                assert_eq!(args.output, OutputFormat::Text);
            }
            other => panic!("{other:?}"),
        }
        match parse(&[
            "deny",
            "demo",
            "p3",
            "--always",
            "--wait",
            "--timeout",
            "30s",
            "-o",
            "json",
        ])
        .expect("parse")
        .command
        {
            Command::Deny(args) => {
                assert_eq!(args.id.as_deref(), Some("p3"));
                assert!(args.always && args.wait);
                assert_eq!(args.timeout, Duration::from_secs(30));
                assert_eq!(args.output, OutputFormat::Json);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse(&["approve"]).expect_err("no session").exit_code(), 2);
        assert_eq!(
            parse(&["approve", "demo", "p3", "p4"])
                .expect_err("one id")
                .exit_code(),
            2
        );
        for (flag, expected) in [
            ("text", ListOutput::Format(OutputFormat::Text)),
            ("json", ListOutput::Format(OutputFormat::Json)),
            ("yaml", ListOutput::Format(OutputFormat::Yaml)),
            ("name", ListOutput::Name),
        ] {
            match parse(&["permissions", "demo", "-o", flag])
                .expect("parse")
                .command
            {
                Command::Permissions(args) => assert_eq!(args.output, expected, "{flag}"),
                other => panic!("{other:?}"),
            }
        }
        let err = parse(&["permissions", "demo", "-o", "wide"]).expect_err("wide");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("name (the request ids)"), "{err}");
        let err = parse(&["permissions", "demo", "-o", "jsonpath={.x"]).expect_err("bad");
        assert!(err.to_string().contains("unclosed"), "{err}");
    }

    #[test]
    fn answer_help_names_the_annotation_and_its_values() {
        let mut cmd = Cli::command();
        for (sub, kinds) in [
            ("approve", ["allow_once", "allow_always"]),
            ("deny", ["reject_once", "reject_always"]),
        ] {
            let help = cmd
                .find_subcommand_mut(sub)
                .expect("subcommand")
                .render_long_help()
                .to_string();
            assert!(help.contains("kandev.dev/permission-answer"), "{help}");
            assert!(help.contains("kandev-plugin"), "{help}");
            for kind in kinds {
                assert!(help.contains(kind), "{sub}: {kind}: {help}");
            }
            for flag in ["--always", "--wait", "--timeout", "--output"] {
                assert!(help.contains(flag), "{sub}: {flag}");
            }
        }
        let help = cmd
            .find_subcommand_mut("prompt")
            .expect("prompt")
            .render_long_help()
            .to_string();
        assert!(help.contains("[y/a/N]"), "{help}");
        assert!(help.contains("kubectl kandev approve|deny"), "{help}");
    }

    #[test]
    fn help_documents_exit_codes_and_reads_as_kubectl_kandev() {
        let mut cmd = Cli::command();
        let help = cmd.render_long_help().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains("kubectl kandev"), "{help}");
        for sub in [
            "status",
            "resume",
            "prompt",
            "history",
            "complete",
            "cancel",
            "permissions",
            "approve",
            "deny",
        ] {
            let sub_help = cmd
                .find_subcommand_mut(sub)
                .expect("subcommand")
                .render_long_help()
                .to_string();
            assert!(sub_help.contains("Exit codes:"), "{sub}: {sub_help}");
            assert!(sub_help.contains("--namespace"), "{sub}: {sub_help}");
        }
    }
}
