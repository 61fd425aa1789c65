//! Shell completion through kubectl's plugin completion protocol (kubectl ≥ 1.26): on
//! `kubectl kandev …<TAB>`, kubectl runs `kubectl_complete-kandev ARGS… WORD` from PATH and
//! passes its answer on, so kubectl's own completion script (`kubectl completion bash|zsh|fish`)
//! completes the plugin too. The answer is Cobra's: one candidate a line (`value<TAB>help`),
//! then `:DIRECTIVE`.
//!
//! `kubectl_complete-kandev` is `kubectl-kandev` under another name (a link), or
//! `kubectl-kandev __complete ARGS… WORD`. Verbs and flags come from the clap definition
//! ([`plan`], pure); TaskSession names, the ids of a session's pending permission requests
//! (`approve`, `deny`), namespaces and contexts from the cluster and the kubeconfig.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Arg, ArgAction, Command as ClapCommand, CommandFactory, Parser};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;

use super::cli::{Cli, GlobalArgs};
use super::cluster::Cluster;
use super::output::OUTPUT_VALUES;
use crate::api::TaskSession;

/// The executable name kubectl looks for (`kubectl_complete-<plugin>`).
pub const COMPLETION_BINARY: &str = "kubectl_complete-kandev";
/// `kubectl-kandev __complete ARGS… WORD` does the same (Cobra's hidden command).
pub const COMPLETE_ARG: &str = "__complete";
/// How long listing TaskSessions or namespaces may take: a slow cluster must not hang a TAB.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Cobra's shell completion directives (a bit set).
pub mod directive {
    /// Complete file names (the shell's default).
    pub const DEFAULT: u32 = 0;
    /// No space after the completion (`-o jsonpath=`).
    pub const NO_SPACE: u32 = 2;
    /// No file names.
    pub const NO_FILE_COMP: u32 = 4;
}

/// What the cluster or the kubeconfig must tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    Sessions,
    /// The ids of the permission requests that wait in this session (`approve`, `deny`).
    PendingRequests(String),
    Namespaces,
    Contexts,
}

/// The answer for one TAB: fixed candidates, or what to fetch, filtered by `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Candidates as `(value, help)`, not yet filtered.
    pub candidates: Vec<(String, String)>,
    pub fetch: Option<Fetch>,
    /// The word being completed; candidates that do not start with it are dropped.
    pub prefix: String,
    /// Put before each candidate (`--namespace=` when completing `--namespace=te`).
    pub insert_before: String,
    pub directive: u32,
    /// The global flags given so far (`-n team`, `--context x`…), for the cluster lookups.
    pub global_args: Vec<String>,
}

/// Decides what to complete from the words kubectl passes: everything after `kubectl kandev`,
/// the last one being the word under the cursor (maybe empty).
pub fn plan(words: &[String]) -> Plan {
    let root = Cli::command();
    let (current, before) = match words.split_last() {
        Some((current, before)) => (current.clone(), before),
        None => (String::new(), &[][..]),
    };
    let Scanned {
        sub,
        positionals,
        pending,
        global_args,
        only_positionals,
    } = scan(&root, before);
    let positional_count = positionals.len();
    let mut plan = Plan {
        candidates: Vec::new(),
        fetch: None,
        prefix: current.clone(),
        insert_before: String::new(),
        directive: directive::NO_FILE_COMP,
        global_args,
    };
    // The value of a flag: `-n <TAB>` or `--namespace=<TAB>`.
    let value_of = match pending {
        Some(arg) => Some(arg),
        None if current.starts_with("--") && current.contains('=') => {
            let (flag, value) = current.split_once('=').unwrap_or_default();
            let arg = find_arg(&root, sub.as_ref(), flag);
            if arg.is_some() {
                plan.insert_before = format!("{flag}=");
                plan.prefix = value.to_string();
            }
            arg
        }
        None => None,
    };
    if let Some(arg) = value_of {
        complete_value(&arg, sub.as_ref(), &mut plan);
        return plan;
    }
    if current.starts_with('-') && !only_positionals {
        let command = sub.as_ref().unwrap_or(&root);
        plan.candidates = flags(&root, command);
        return plan;
    }
    match sub {
        None => {
            plan.candidates = root
                .get_subcommands()
                .filter(|c| !c.is_hide_set() && c.get_name() != "help")
                .map(|c| (c.get_name().to_string(), first_line(c.get_about())))
                .collect();
        }
        Some(_) if positional_count == 0 => plan.fetch = Some(Fetch::Sessions),
        Some(sub) if positional_count == 1 && ANSWER_VERBS.contains(&sub.get_name()) => {
            plan.fetch = positionals.first().cloned().map(Fetch::PendingRequests);
        }
        Some(_) => {}
    }
    plan
}

/// What the words before the one being completed say.
struct Scanned {
    /// The subcommand, once named.
    sub: Option<ClapCommand>,
    /// Positional words after the subcommand.
    positionals: Vec<String>,
    /// A flag whose value is the next word.
    pending: Option<Arg>,
    /// The global flags given, with their values (for the fetch of the session names).
    global_args: Vec<String>,
    /// `--` was given: every word after it is positional.
    only_positionals: bool,
}

fn scan(root: &ClapCommand, before: &[String]) -> Scanned {
    let mut scanned = Scanned {
        sub: None,
        positionals: Vec::new(),
        pending: None,
        global_args: Vec::new(),
        only_positionals: false,
    };
    for word in before {
        if let Some(arg) = scanned.pending.take() {
            if arg.is_global_set() {
                scanned.global_args.push(word.clone());
            }
            continue;
        }
        if scanned.only_positionals || !word.starts_with('-') || word == "-" {
            match &scanned.sub {
                None => scanned.sub = root.find_subcommand(word).cloned(),
                Some(_) => scanned.positionals.push(word.clone()),
            }
            continue;
        }
        if word == "--" {
            scanned.only_positionals = true;
            continue;
        }
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None if !word.starts_with("--") && word.len() > 2 => (&word[..2], Some(&word[2..])),
            None => (word.as_str(), None),
        };
        let Some(arg) = find_arg(root, scanned.sub.as_ref(), flag) else {
            continue;
        };
        if arg.is_global_set() {
            scanned.global_args.push(flag.to_string());
            if let Some(value) = inline {
                scanned.global_args.push(value.to_string());
            }
        }
        if takes_value(&arg) && inline.is_none() {
            scanned.pending = Some(arg);
        }
    }
    scanned
}

/// The verbs whose second positional is a pending permission request's id.
const ANSWER_VERBS: [&str; 2] = ["approve", "deny"];

fn complete_value(arg: &Arg, sub: Option<&ClapCommand>, plan: &mut Plan) {
    match arg.get_id().as_str() {
        "namespace" => plan.fetch = Some(Fetch::Namespaces),
        "context" => plan.fetch = Some(Fetch::Contexts),
        "kubeconfig" => plan.directive = directive::DEFAULT,
        "output" => {
            let history = arg
                .get_possible_values()
                .iter()
                .map(|v| (v.get_name().to_string(), first_line(v.get_help())))
                .collect::<Vec<_>>();
            plan.candidates = if history.is_empty() {
                OUTPUT_VALUES
                    .iter()
                    .map(|(v, h)| (v.to_string(), h.to_string()))
                    .collect()
            } else {
                history
            };
            if sub.is_some_and(|s| s.get_name() == "permissions") {
                plan.candidates
                    .push(("name".into(), "the request ids, one a line".into()));
            }
            if plan.candidates.iter().any(|(v, _)| v.ends_with('=')) {
                plan.directive |= directive::NO_SPACE;
            }
        }
        _ => {}
    }
}

/// A flag of `command` or a global one of the root, by `--long` or `-s`.
fn find_arg(root: &ClapCommand, command: Option<&ClapCommand>, flag: &str) -> Option<Arg> {
    let matches = |arg: &&Arg| match flag.strip_prefix("--") {
        Some(long) => arg.get_long() == Some(long),
        None => flag
            .strip_prefix('-')
            .and_then(|s| s.chars().next())
            .is_some_and(|c| arg.get_short() == Some(c)),
    };
    command
        .and_then(|c| c.get_arguments().find(matches).cloned())
        .or_else(|| root.get_arguments().find(matches).cloned())
}

fn takes_value(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set | ArgAction::Append)
}

/// The flags one may type here: the command's own, then the global ones.
fn flags(root: &ClapCommand, command: &ClapCommand) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let own = command.get_arguments();
    let global = root.get_arguments().filter(|a| a.is_global_set());
    for arg in own.chain(global) {
        if arg.is_hide_set() || arg.is_positional() || !seen.insert(arg.get_id().clone()) {
            continue;
        }
        let help = first_line(arg.get_help());
        if let Some(long) = arg.get_long() {
            out.push((format!("--{long}"), help.clone()));
        }
        if let Some(short) = arg.get_short() {
            out.push((format!("-{short}"), help));
        }
    }
    out.push(("--help".into(), "Print help".into()));
    out
}

fn first_line(text: Option<&clap::builder::StyledStr>) -> String {
    text.map(|t| {
        let t = t.to_string();
        let line = t.lines().next().unwrap_or_default();
        let line = line.split(" [default").next().unwrap_or(line);
        line.split(". ").next().unwrap_or(line).trim().to_string()
    })
    .unwrap_or_default()
}

/// Cobra's output: `value<TAB>help` lines (help without tabs or newlines), then `:directive`.
pub fn render(candidates: &[(String, String)], directive: u32) -> String {
    let mut out = String::new();
    for (value, help) in candidates {
        out.push_str(value);
        let help = help.replace(['\t', '\n'], " ");
        if !help.is_empty() {
            out.push('\t');
            out.push_str(&help);
        }
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

/// Only the global flags, to read the `-n`/`--context`/`--kubeconfig`… typed so far.
#[derive(Parser)]
#[command(no_binary_name = true)]
struct GlobalOnly {
    #[command(flatten)]
    global: GlobalArgs,
}

/// Answers one completion request on stdout; always exits 0 (a failed lookup completes
/// nothing rather than printing an error into the command line).
pub fn run(args: Vec<OsString>) -> i32 {
    let words: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut plan = plan(&words);
    if let Some(fetch) = plan.fetch.clone() {
        let global = GlobalOnly::try_parse_from(&plan.global_args)
            .map(|g| g.global)
            .unwrap_or_default();
        let fetched = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|runtime| {
                runtime.block_on(async {
                    tokio::time::timeout(FETCH_TIMEOUT, fetch_candidates(&fetch, &global))
                        .await
                        .unwrap_or_default()
                })
            })
            .unwrap_or_default();
        plan.candidates.extend(fetched);
    }
    let candidates: Vec<(String, String)> = plan
        .candidates
        .into_iter()
        .filter(|(value, _)| value.starts_with(&plan.prefix))
        .map(|(value, help)| (format!("{}{value}", plan.insert_before), help))
        .collect();
    let _ = super::write_stdout(&render(&candidates, plan.directive));
    0
}

async fn fetch_candidates(fetch: &Fetch, global: &GlobalArgs) -> Vec<(String, String)> {
    if *fetch == Fetch::Contexts {
        let kubeconfig = match &global.kubeconfig {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        };
        return kubeconfig
            .map(|k| {
                k.contexts
                    .into_iter()
                    .map(|c| (c.name, String::new()))
                    .collect()
            })
            .unwrap_or_default();
    }
    let Ok(cluster) = Cluster::connect(global).await else {
        return Vec::new();
    };
    match fetch {
        Fetch::Sessions => cluster
            .sessions()
            .list(&ListParams::default())
            .await
            .map(|list| {
                list.items
                    .iter()
                    .filter_map(|s| Some((s.metadata.name.clone()?, session_help(s))))
                    .collect()
            })
            .unwrap_or_default(),
        Fetch::PendingRequests(name) => cluster
            .sessions()
            .get(name)
            .await
            .map(|session| {
                session
                    .status
                    .map(|s| s.pending_permissions)
                    .unwrap_or_default()
                    .iter()
                    .map(|p| (p.id.clone(), format!("{}: {}", p.tool_kind, p.title)))
                    .collect()
            })
            .unwrap_or_default(),
        Fetch::Namespaces => Api::<Namespace>::all(cluster.client.clone())
            .list_metadata(&ListParams::default())
            .await
            .map(|list| {
                list.items
                    .into_iter()
                    .filter_map(|n| Some((n.metadata.name?, String::new())))
                    .collect()
            })
            .unwrap_or_default(),
        Fetch::Contexts => Vec::new(),
    }
}

fn session_help(session: &TaskSession) -> String {
    match &session.status {
        Some(status) if status.needs_resume => format!("{}, needs resume", status.state),
        Some(status) => status.state.to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn words(line: &str) -> Vec<String> {
        // A trailing space means an empty word under the cursor.
        let mut words: Vec<String> = line.split_whitespace().map(String::from).collect();
        if line.is_empty() || line.ends_with(' ') {
            words.push(String::new());
        }
        words
    }

    fn values(plan: &Plan) -> Vec<&str> {
        plan.candidates
            .iter()
            .map(|(v, _)| v.as_str())
            .filter(|v| v.starts_with(&plan.prefix))
            .collect()
    }

    #[test]
    fn verbs_first() {
        let plan = plan(&words(""));
        assert_eq!(
            values(&plan),
            [
                "status",
                "resume",
                "restart",
                "prompt",
                "history",
                "complete",
                "cancel",
                "permissions",
                "approve",
                "deny"
            ]
        );
        assert_eq!(plan.directive, directive::NO_FILE_COMP);
        assert!(plan.candidates[0].1.starts_with("Show whether"), "{plan:?}");
        let plan = super::plan(&words("-n team res"));
        assert_eq!(values(&plan), ["resume", "restart"]);
        assert_eq!(plan.global_args, ["-n", "team"]);
    }

    #[test]
    fn the_session_comes_from_the_cluster() {
        for line in [
            "status ",
            "resume de",
            "resume --wait ",
            "-n team history ",
            "status --namespace=team ",
            "prompt -o",
        ] {
            let plan = plan(&words(line));
            if line.ends_with("-o") {
                // prompt has no -o: a flag is being typed, not a session.
                assert_eq!(plan.fetch, None, "{line}");
                continue;
            }
            assert_eq!(plan.fetch, Some(Fetch::Sessions), "{line}");
        }
        let plan = plan(&words(
            "-n team status --context dev --as alice --as-group g --token t --timeout 3s ",
        ));
        assert_eq!(
            plan.global_args,
            [
                "-n",
                "team",
                "--context",
                "dev",
                "--as",
                "alice",
                "--as-group",
                "g",
                "--token",
                "t"
            ]
        );
        // After the session: nothing more to complete (a prompt's text is free).
        assert_eq!(super::plan(&words("prompt demo ")).fetch, None);
    }

    #[test]
    fn flags_of_the_verb_and_the_global_ones() {
        let plan = plan(&words("resume demo --"));
        let got = values(&plan);
        for flag in [
            "--wait",
            "--timeout",
            "--fresh",
            "--output",
            "--namespace",
            "--as",
            "--as-group",
            "--token",
            "--request-timeout",
            "--help",
        ] {
            assert!(got.contains(&flag), "{flag} missing from {got:?}");
        }
        assert!(!got.contains(&"--timestamps"), "{got:?}");
        let plan = super::plan(&words("history demo --t"));
        assert_eq!(values(&plan), ["--timestamps", "--timeout", "--token"]);
    }

    #[test]
    fn flag_values() {
        let plan = plan(&words("status demo -o "));
        assert_eq!(values(&plan), ["text", "json", "yaml", "jsonpath="]);
        assert_eq!(
            plan.directive,
            directive::NO_FILE_COMP | directive::NO_SPACE
        );
        let plan = super::plan(&words("history demo -o "));
        assert_eq!(values(&plan), ["text", "jsonl"]);
        assert_eq!(plan.directive, directive::NO_FILE_COMP);
        let plan = super::plan(&words("status -n "));
        assert_eq!(plan.fetch, Some(Fetch::Namespaces));
        let plan = super::plan(&words("status --namespace=te"));
        assert_eq!(
            (plan.fetch.clone(), plan.prefix.as_str()),
            (Some(Fetch::Namespaces), "te")
        );
        assert_eq!(plan.insert_before, "--namespace=");
        assert_eq!(
            super::plan(&words("--context ")).fetch,
            Some(Fetch::Contexts)
        );
        assert_eq!(
            super::plan(&words("--kubeconfig ")).directive,
            directive::DEFAULT
        );
        let plan = super::plan(&words("resume demo --timeout "));
        assert_eq!((plan.fetch.clone(), plan.candidates.len()), (None, 0));
    }

    #[test]
    fn permission_verbs_complete_sessions_then_pending_ids() {
        for line in [
            "permissions ",
            "approve ",
            "deny de",
            "-n team approve --always ",
        ] {
            assert_eq!(plan(&words(line)).fetch, Some(Fetch::Sessions), "{line}");
        }
        for line in [
            "approve demo ",
            "deny demo p",
            "approve --always demo ",
            "-n team deny demo --wait ",
            "approve demo --timeout 30s ",
        ] {
            assert_eq!(
                plan(&words(line)).fetch,
                Some(Fetch::PendingRequests("demo".into())),
                "{line}"
            );
        }
        let plan = super::plan(&words("-n team approve demo p"));
        assert_eq!(plan.prefix, "p");
        assert_eq!(plan.global_args, ["-n", "team"]);
        // Only one id; `permissions` takes none.
        for line in ["approve demo p3 ", "permissions demo ", "status demo "] {
            assert_eq!(super::plan(&words(line)).fetch, None, "{line}");
        }
        let got = super::plan(&words("approve demo --"));
        for flag in ["--always", "--wait", "--timeout", "--output", "--namespace"] {
            assert!(values(&got).contains(&flag), "{flag}: {got:?}");
        }
    }

    #[test]
    fn permissions_lists_also_by_name() {
        let plan = plan(&words("permissions demo -o "));
        assert_eq!(values(&plan), ["text", "json", "yaml", "jsonpath=", "name"]);
        let plan = super::plan(&words("approve demo -o "));
        assert_eq!(values(&plan), ["text", "json", "yaml", "jsonpath="]);
    }

    #[test]
    fn cobra_output() {
        assert_eq!(
            render(
                &[
                    ("demo".into(), "WAITING_FOR_INPUT".into()),
                    ("x".into(), String::new()),
                    ("y".into(), "a\tb\nc".into())
                ],
                4
            ),
            "demo\tWAITING_FOR_INPUT\nx\ny\ta b c\n:4\n"
        );
        assert_eq!(render(&[], 4), ":4\n");
    }
}
