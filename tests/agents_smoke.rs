//! Agents smoke test (`make agents-smoke`, part of the protocol tier): every built-in agent the
//! npm registry serves, at the version pinned in `e2e/agents.versions`, started with its
//! profile's launch command, offline and without credentials:
//! (a) it answers `initialize`;
//! (b) what it advertises is what docs/agent-profiles.md's "Pinned agents" table says;
//! (c) `session/new` works, or answers auth-required (-32000), classified `auth_required` with the
//!     saved token kept — as the table says;
//! and, for the table's "Unknown saved session" column, how the restore of a session the agent
//! does not know ends (`session/new` after -32002, or the token kept).
//!
//! The table is the one place the expected values live; the untagged test below checks that it
//! matches the versions file, the built-in profiles and the pure restore selection.
//!
//! Run: `make agents-smoke`, or `bash e2e/agents.sh` (prints the bin dir), then
//! `KANDEV_AGENTS_BIN=<bin dir> cargo test --test agents_smoke -- --ignored`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentctl_support::scratch;
use kandev_operator::acp::{AcpTimeouts, AgentStderr, LocalAgent, RestoreOutcome, SpawnOptions};
use kandev_operator::agents::AgentRegistry;
use kandev_operator::jsonrpc::CallFailure;
use kandev_operator::resume::{
    AgentRestoreCapabilities, FreshReason, RestoreErrorClass, RestoreMethod,
    classify_restore_error, select_restore_method,
};
use pretty_assertions::assert_eq;

const IGNORED: &str = "protocol: needs the pinned npm agents (make agents-smoke)";
/// A saved token for the `session/new` check: it must survive an auth-required answer.
const SAVED_TOKEN: &str = "11111111-2222-4333-8444-555555555555";
/// A saved token no agent knows (UUID-shaped: some agents answer a malformed id differently).
const UNKNOWN_SESSION: &str = "99999999-8888-4777-8666-555555555555";
/// Credentials an agent could pick up from our environment; the smoke test runs without any.
const CREDENTIAL_VARIABLES: [&str; 12] = [
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "COPILOT_GITHUB_TOKEN",
    "AUGMENT_API_TOKEN",
    "AUGMENT_SESSION_AUTH",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One row of `e2e/agents.versions`.
#[derive(Debug)]
struct Pin {
    profile: String,
    package: String,
    version: String,
}

fn pins() -> Vec<Pin> {
    read("e2e/agents.versions")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [profile, package, version] => Pin {
                    profile: profile.into(),
                    package: package.into(),
                    version: version.into(),
                },
                _ => panic!("e2e/agents.versions: expected `profile package version`: {line:?}"),
            },
        )
        .collect()
}

/// What `session/new` answers offline, without credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Offline {
    /// A session is opened.
    Works,
    /// JSON-RPC -32000.
    AuthRequired,
    /// The agent does not even answer `initialize` in this sandbox.
    DoesNotStart,
    /// No package to test (amp).
    NotTested,
}

/// How the restore of a saved session the agent does not know ends: the agent's error code, and
/// whether the operator then starts a new session (else the token is kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Unknown {
    code: i64,
    new_session: bool,
}

impl Unknown {
    /// The class the operator gives the code.
    fn class(self) -> RestoreErrorClass {
        classify_restore_error(&CallFailure::JsonRpc {
            code: self.code,
            message: String::new(),
        })
    }
}

/// One row of docs/agent-profiles.md's "Pinned agents" table.
#[derive(Debug)]
struct Documented {
    profile: String,
    package: String,
    version: String,
    /// `None` for `—` (not tested).
    load_session: Option<bool>,
    session_resume: Option<bool>,
    restore: String,
    /// `None` for `—`.
    unknown: Option<Unknown>,
    offline: Offline,
}

const TABLE_HEADER: &str = "| Profile | npm package | Version | `loadSession` | `sessionCapabilities.resume` | Restore of a saved token | Unknown saved session | `session/new` offline |";

fn documented() -> Vec<Documented> {
    let docs = read("docs/agent-profiles.md");
    let mut lines = docs.lines().skip_while(|line| *line != TABLE_HEADER);
    assert_eq!(
        lines.next(),
        Some(TABLE_HEADER),
        "docs/agent-profiles.md has the Pinned agents table"
    );
    lines
        .skip(1) // | --- | …
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().trim_matches('`').to_owned())
                .collect();
            assert_eq!(cells.len(), 8, "{line}");
            let flag = |cell: &str| match cell {
                "yes" => Some(true),
                "no" => Some(false),
                "—" => None,
                other => panic!("expected yes, no or —, not {other:?}: {line}"),
            };
            let unknown = match cells[6].split_once(" → ") {
                _ if cells[6] == "—" => None,
                Some((code, then)) => Some(Unknown {
                    code: code
                        .parse()
                        .unwrap_or_else(|e| panic!("{code:?}: {e}: {line}")),
                    new_session: match then.trim_matches('`') {
                        "session/new" => true,
                        "token kept" => false,
                        other => panic!("expected session/new or token kept, not {other:?}"),
                    },
                }),
                None => panic!("expected `<code> → <what then>`: {line}"),
            };
            let offline = match cells[7].as_str() {
                "works" => Offline::Works,
                "auth required (-32000)" => Offline::AuthRequired,
                "does not start" => Offline::DoesNotStart,
                "not tested" => Offline::NotTested,
                other => panic!("unknown `session/new` offline value {other:?}: {line}"),
            };
            Documented {
                profile: cells[0].clone(),
                package: cells[1].clone(),
                version: cells[2].clone(),
                load_session: flag(&cells[3]),
                session_resume: flag(&cells[4]),
                restore: cells[5].clone(),
                unknown,
                offline,
            }
        })
        .collect()
}

#[test]
fn pinned_agents_table_matches_the_versions_file_and_the_profiles() {
    let registry = AgentRegistry::builtin().expect("built-in profiles");
    let pins = pins();
    let table = documented();
    // Every built-in profile has exactly one row, in the order of the versions file.
    let mut profiles: Vec<&str> = table.iter().map(|row| row.profile.as_str()).collect();
    profiles.sort_unstable();
    let mut builtin: Vec<&str> = registry.names().collect();
    builtin.sort_unstable();
    assert_eq!(profiles, builtin);
    for row in &table {
        let pin = pins.iter().find(|pin| pin.profile == row.profile);
        let Some(pin) = pin else {
            // Not on npm: nothing was run, so nothing may be claimed.
            assert!(row.package.starts_with("none"), "{row:?}");
            assert_eq!(row.offline, Offline::NotTested, "{row:?}");
            assert_eq!(
                (row.load_session, row.session_resume),
                (None, None),
                "{row:?}"
            );
            assert_eq!(row.unknown, None, "{row:?}");
            continue;
        };
        assert_eq!(
            (row.package.as_str(), row.version.as_str()),
            (pin.package.as_str(), pin.version.as_str()),
            "{}: the table shows the pinned package and version",
            row.profile
        );
        assert_ne!(row.offline, Offline::NotTested, "{row:?}");
        // The restore column is what the pure selection makes of the advertised capabilities.
        let (Some(load_session), Some(session_resume)) = (row.load_session, row.session_resume)
        else {
            assert_eq!(row.offline, Offline::DoesNotStart, "{row:?}");
            continue;
        };
        let profile = registry.get(&row.profile).expect("profile");
        let plan = select_restore_method(
            AgentRestoreCapabilities {
                load_session,
                session_resume,
            },
            profile.native_session_resume,
            Some(SAVED_TOKEN),
        );
        assert_eq!(row.restore, plan.method().method_name(), "{row:?}");
        // Only the codes the classification lets give a token up may end in session/new.
        let unknown = row
            .unknown
            .expect("an agent that starts has an unknown-session answer");
        assert_eq!(
            unknown.new_session,
            unknown.class().allows_fresh_start(),
            "{row:?}"
        );
    }
    for pin in &pins {
        assert!(
            registry.get(&pin.profile).is_some(),
            "e2e/agents.versions pins {} for an unknown profile {}",
            pin.package,
            pin.profile
        );
    }
}

fn agents_bin() -> PathBuf {
    match std::env::var_os("KANDEV_AGENTS_BIN") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => panic!(
            "KANDEV_AGENTS_BIN is not set: run `bash e2e/agents.sh` and point it at the printed \
             bin dir ({IGNORED})"
        ),
    }
}

/// The processes below `pid`, children first (read before the agent is stopped, so a wrapper's
/// native child can be killed too if it outlives the wrapper).
fn descendants(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    let children: Vec<u32> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .collect();
    children
        .iter()
        .flat_map(|child| {
            let mut below = descendants(*child);
            below.insert(0, *child);
            below
        })
        .collect()
}

/// `tree` with the processes now below `agent` in front.
fn with_descendants(agent: &LocalAgent, tree: Vec<u32>) -> Vec<u32> {
    let mut now = agent.id().map(descendants).unwrap_or_default();
    now.extend(tree);
    now
}

/// Kills what is left of an agent's process tree; returns the pids that were still running.
fn kill_leftovers(pids: &[u32]) -> Vec<u32> {
    let unique: std::collections::BTreeSet<u32> = pids.iter().copied().collect();
    unique
        .into_iter()
        .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
        .inspect(|pid| {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        })
        .collect()
}

/// Runs one pinned agent; returns what differs from its documented row.
async fn smoke(row: &Documented, pin: &Pin, bin: &Path) -> Vec<String> {
    let registry = AgentRegistry::builtin().expect("built-in profiles");
    let profile = registry.get(&row.profile).expect("profile");
    let home = scratch("kandev-smoke-home-");
    let work = scratch("kandev-smoke-work-");
    let mut path = OsString::from(bin);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let options = SpawnOptions {
        env: vec![
            (OsString::from("HOME"), home.path().into()),
            (OsString::from("PATH"), path),
            // claude-agent-acp refuses to run as root otherwise (our tests run as root).
            (OsString::from("IS_SANDBOX"), OsString::from("1")),
        ],
        env_remove: CREDENTIAL_VARIABLES.iter().map(OsString::from).collect(),
        current_dir: Some(work.path().to_owned()),
        stderr: AgentStderr::Discard,
    };
    let name = format!("{} ({} {})", row.profile, pin.package, pin.version);
    let mut problems = Vec::new();
    let mut agent = match LocalAgent::spawn(&profile.launch, &options) {
        Ok(agent) => agent,
        Err(error) => {
            if row.offline != Offline::DoesNotStart {
                problems.push(format!(
                    "{name}: {:?} does not start: {error}",
                    profile.launch
                ));
            }
            return problems;
        }
    };
    let tree = agent.id().map(descendants).unwrap_or_default();
    let timeouts = AcpTimeouts::uniform(Duration::from_secs(90));
    agent.client_mut().set_timeouts(timeouts);
    let initialized = agent.client_mut().initialize().await;
    // Anything the wrapper started by now (npm launchers start a native binary).
    let tree = with_descendants(&agent, tree);
    match (&initialized, row.offline) {
        (Err(_), Offline::DoesNotStart) => {}
        (Err(error), _) => problems.push(format!("{name}: initialize failed: {error}")),
        (Ok(_), Offline::DoesNotStart) => problems.push(format!(
            "{name}: answers initialize, but the docs say it does not start"
        )),
        (Ok(capabilities), _) => {
            let version = capabilities.agent_version.as_deref().unwrap_or("");
            if !version.starts_with(&pin.version) {
                problems.push(format!(
                    "{name}: agentInfo.version is {version:?}, not the pinned {}",
                    pin.version
                ));
            }
            let advertised = (
                Some(capabilities.load_session),
                Some(capabilities.session_resume),
            );
            if advertised != (row.load_session, row.session_resume) {
                problems.push(format!(
                    "{name}: advertises (loadSession, sessionCapabilities.resume) = {advertised:?}, \
                     the docs say {:?}",
                    (row.load_session, row.session_resume)
                ));
            }
            // The restore of a saved session the agent does not know, as a resume would do it.
            let lost = agent
                .client_mut()
                .restore(
                    Some(UNKNOWN_SESSION),
                    work.path(),
                    profile.native_session_resume,
                    false,
                    timeouts,
                )
                .await;
            if let Some(unknown) = row.unknown {
                let class = unknown.class();
                let expected = match &lost {
                    RestoreOutcome::Fresh { why, .. } => {
                        unknown.new_session
                            && matches!(
                                (class, why),
                                (
                                    RestoreErrorClass::UnknownSession,
                                    FreshReason::UnknownSession
                                ) | (
                                    RestoreErrorClass::MethodNotFound,
                                    FreshReason::MethodNotFound
                                )
                            )
                    }
                    RestoreOutcome::Failed {
                        class: got,
                        token_kept: true,
                        session_id: Some(kept),
                        ..
                    } => !unknown.new_session && *got == class && kept == UNKNOWN_SESSION,
                    _ => false,
                };
                if !expected {
                    problems.push(format!(
                        "{name}: an unknown saved session should end {unknown:?} ({class}), \
                         got {lost:?}"
                    ));
                }
            }
            // session/new through the restore path (a fresh start with a saved token).
            let outcome = agent
                .client_mut()
                .restore(
                    Some(SAVED_TOKEN),
                    work.path(),
                    profile.native_session_resume,
                    true,
                    timeouts,
                )
                .await;
            let expected = match (row.offline, &outcome) {
                (
                    Offline::Works,
                    RestoreOutcome::Fresh {
                        session_id,
                        why: FreshReason::NoResumeToken,
                    },
                ) => !session_id.is_empty() && session_id != SAVED_TOKEN,
                (
                    Offline::AuthRequired,
                    RestoreOutcome::Failed {
                        method: Some(RestoreMethod::New),
                        class: RestoreErrorClass::AuthRequired,
                        token_kept: true,
                        session_id: Some(kept),
                        ..
                    },
                ) => kept == SAVED_TOKEN,
                _ => false,
            };
            if !expected {
                problems.push(format!(
                    "{name}: session/new offline should be {:?}, got {outcome:?}",
                    row.offline
                ));
            }
        }
    }
    // Again: some agents start their native process only for session/new.
    let tree = with_descendants(&agent, tree);
    if let Err(error) = agent.shutdown(Duration::from_secs(3)).await {
        problems.push(format!("{name}: could not stop the agent: {error}"));
    }
    // A wrapper's child that outlived it would be a leftover process: kill it, and say so.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leftovers = kill_leftovers(&tree);
    if !leftovers.is_empty() {
        eprintln!("{name}: killed processes that outlived the agent: {leftovers:?}");
    }
    problems
}

#[tokio::test]
#[ignore = "protocol: needs the pinned npm agents (make agents-smoke)"]
async fn every_pinned_agent_answers_as_documented() {
    let bin = agents_bin();
    let table = documented();
    let mut problems = Vec::new();
    for pin in pins() {
        let row = table
            .iter()
            .find(|row| row.profile == pin.profile)
            .unwrap_or_else(|| panic!("{} is pinned but not in the docs table", pin.profile));
        let found = smoke(row, &pin, &bin).await;
        eprintln!(
            "{} {}@{}: {}",
            pin.profile,
            pin.package,
            pin.version,
            if found.is_empty() {
                "as documented"
            } else {
                "DIFFERS"
            }
        );
        problems.extend(found);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
