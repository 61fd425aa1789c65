//! Protocol tier (DESIGN §6, tier 2) against the real `@agentclientprotocol/claude-agent-acp`,
//! offline (no API key): initialize, session/new, session/resume, session/load of a recorded
//! transcript, and the unknown-session fallback.
//!
//! Run: `bash e2e/agents.sh` (prints the bin dir), then
//! `KANDEV_CLAUDE_AGENT_ACP=<bin>/claude-agent-acp cargo test --test 'protocol_*' -- --ignored`.
//!
//! Each test gives the agent its own `HOME` (its session store lives in
//! `$HOME/.claude/projects/`) and `IS_SANDBOX=1` (it refuses to run as root otherwise; our tests
//! run as root, real pods do not).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentctl_support::{claude_agent_acp, restore_saved, scratch, stop_agent};
use kandev_operator::acp::{
    AcpError, AcpTimeouts, AgentStderr, LocalAgent, OutcomeKind, RestoreOptions, RestoreOutcome,
    SpawnOptions, restore_with_local_agent,
};
use kandev_operator::jsonrpc::CallFailure;
use kandev_operator::resume::{FreshReason, RestoreMethod};
use pretty_assertions::assert_eq;
use serde_json::Value;

/// The session recorded in `tests/data/claude-transcript.jsonl`.
const FIXTURE_SESSION: &str = "11111111-2222-4333-8444-555555555555";
const FIXTURE: &str = include_str!("data/claude-transcript.jsonl");
/// UUID-shaped but unknown: claude-agent-acp answers -32002 for it (a non-UUID gets -32603).
const UNKNOWN_SESSION: &str = "99999999-8888-4777-8666-555555555555";

/// A private HOME and working directory for one agent.
struct Sandbox {
    home: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let dir = |prefix: &str| {
            let dir = scratch(prefix);
            // Claude Code names a project directory after the cwd with every character other
            // than [A-Za-z0-9] replaced by '-', while claude-agent-acp's replay only replaces
            // '/'. They agree only on paths of letters, digits, '-' and '/'; with a '.' in the
            // cwd (tempfile's default `.tmp` prefix) load replays but then answers -32002.
            let plain = dir
                .path()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '/' || c == '-');
            assert!(plain, "{:?} must not need sanitizing", dir.path());
            dir
        };
        Self {
            home: dir("kandev-home-"),
            work: dir("kandev-work-"),
        }
    }

    fn cwd(&self) -> &Path {
        self.work.path()
    }

    fn spawn_options(&self) -> SpawnOptions {
        SpawnOptions {
            env: vec![
                (
                    OsString::from("HOME"),
                    self.home.path().as_os_str().to_owned(),
                ),
                (OsString::from("IS_SANDBOX"), OsString::from("1")),
            ],
            // Offline by construction: a key in the developer's environment must not turn a
            // test prompt into a paid API call.
            env_remove: vec![
                OsString::from("ANTHROPIC_API_KEY"),
                OsString::from("CLAUDE_CODE_OAUTH_TOKEN"),
            ],
            current_dir: Some(self.cwd().to_owned()),
            stderr: AgentStderr::Log,
        }
    }

    fn spawn(&self) -> LocalAgent {
        let mut agent =
            LocalAgent::spawn(&[claude_agent_acp()], &self.spawn_options()).expect("spawn");
        agent.client_mut().set_timeouts(timeouts());
        agent
    }

    /// The agent, initialized.
    async fn initialized(&self) -> LocalAgent {
        let mut agent = self.spawn();
        agent.client_mut().initialize().await.expect("initialize");
        agent
    }

    /// A new session on `agent`, in our cwd.
    async fn new_session(&self, agent: &LocalAgent) -> String {
        agent.client().new_session(self.cwd()).await.expect("new")
    }

    /// Restores `token` on `agent` as the operator restores a saved session.
    async fn restore(&self, agent: &mut LocalAgent, token: &str) -> RestoreOutcome {
        restore_saved(agent.client_mut(), Some(token), self.cwd(), timeouts()).await
    }

    /// Places the fixture transcript where the agent looks for it (see tests/data and
    /// /work/shared/fixtures/README.md), with its `cwd` fields rewritten to our cwd.
    fn place_fixture(&self) -> PathBuf {
        let cwd = self.cwd().to_string_lossy().into_owned();
        let project = self
            .home
            .path()
            .join(".claude/projects")
            .join(cwd.replace('/', "-"));
        std::fs::create_dir_all(&project).expect("project dir");
        let mut out = String::new();
        for line in FIXTURE.lines().filter(|l| !l.trim().is_empty()) {
            let mut entry: Value = serde_json::from_str(line).expect("fixture line");
            if let Some(field) = entry.get_mut("cwd") {
                *field = Value::String(cwd.clone());
            }
            out.push_str(&entry.to_string());
            out.push('\n');
        }
        let path = project.join(format!("{FIXTURE_SESSION}.jsonl"));
        std::fs::write(&path, out).expect("write fixture");
        path
    }
}

impl Drop for Sandbox {
    /// The Claude Code CLI that claude-agent-acp starts outlives the agent for a moment and
    /// still writes under `$HOME` when it exits (`.claude.json`, telemetry), re-creating what a
    /// single `remove_dir_all` just deleted. Remove until the directory stays gone for a second.
    fn drop(&mut self) {
        let home = self.home.path().to_owned();
        for _ in 0..10 {
            let _ = std::fs::remove_dir_all(&home);
            std::thread::sleep(Duration::from_secs(1));
            if !home.exists() {
                return;
            }
        }
    }
}

fn timeouts() -> AcpTimeouts {
    AcpTimeouts {
        initialize: Duration::from_secs(60),
        session: Duration::from_secs(60),
        prompt: Some(Duration::from_secs(60)),
    }
}

async fn stop(agent: LocalAgent) {
    stop_agent(agent, Duration::from_secs(5)).await;
}

/// Asserts that a call failed with the JSON-RPC error `code`.
fn assert_json_rpc_error(error: &AcpError, code: i64) {
    assert!(
        matches!(error.failure(), Some(CallFailure::JsonRpc { code: got, .. }) if *got == code),
        "{error}"
    );
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_initialize_advertises_load_and_resume() {
    let sandbox = Sandbox::new();
    let mut agent = sandbox.spawn();
    let caps = agent.client_mut().initialize().await.expect("initialize");
    assert_eq!(caps.protocol_version, Some(1));
    assert!(caps.load_session, "{caps:?}");
    assert!(caps.session_resume, "{caps:?}");
    assert_eq!(
        caps.agent_name.as_deref(),
        Some("@agentclientprotocol/claude-agent-acp")
    );
    stop(agent).await;
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_session_new_and_resume_of_the_live_session() {
    let sandbox = Sandbox::new();
    let agent = sandbox.initialized().await;
    let session = sandbox.new_session(&agent).await;
    assert!(!session.is_empty());
    // Within the same process the live session resumes (and loads) fine…
    agent
        .client()
        .resume_session(&session, sandbox.cwd())
        .await
        .expect("resume live session");
    stop(agent).await;

    // …but a session that never got a prompt is not persisted: a new process does not know it.
    let agent = sandbox.initialized().await;
    let error = agent
        .client()
        .resume_session(&session, sandbox.cwd())
        .await
        .expect_err("never-prompted session is gone");
    assert_json_rpc_error(&error, -32002);
    stop(agent).await;
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_resume_of_a_known_session_returns_that_id() {
    let sandbox = Sandbox::new();
    sandbox.place_fixture();
    let mut agent = sandbox.spawn();
    let mut updates = agent.client().subscribe_updates();
    let outcome = sandbox.restore(&mut agent, FIXTURE_SESSION).await;
    assert_eq!(
        outcome,
        RestoreOutcome::Restored {
            method: RestoreMethod::Resume,
            session_id: FIXTURE_SESSION.into()
        }
    );
    // session/resume restores silently: no transcript replay.
    let mut replayed = Vec::new();
    while let Ok(update) = updates.try_recv() {
        if update.kind.ends_with("message_chunk") {
            replayed.push(update);
        }
    }
    assert!(replayed.is_empty(), "{replayed:?}");
    stop(agent).await;
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_load_replays_the_fixture_transcript() {
    let sandbox = Sandbox::new();
    sandbox.place_fixture();
    let agent = sandbox.initialized().await;
    let mut updates = agent.client().subscribe_updates();
    let replayed = agent
        .client()
        .load_session(FIXTURE_SESSION, sandbox.cwd())
        .await
        .expect("load");
    let mut replay = Vec::new();
    while let Ok(update) = updates.try_recv() {
        if update.session_id == FIXTURE_SESSION {
            replay.push(update);
        }
    }
    assert_eq!(replayed.updates, replay.len() as u64, "{replayed:?}");
    let messages: Vec<(&str, &str)> = replay
        .iter()
        .filter_map(|u| Some((u.kind.as_str(), u.text()?)))
        .collect();
    assert_eq!(
        messages,
        [
            ("user_message_chunk", "What's the capital of France?"),
            ("agent_message_chunk", "Paris.")
        ]
    );
    assert!(
        replay.iter().all(|u| u.notification().is_ok()),
        "typed view parses"
    );
    stop(agent).await;
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_unknown_session_is_32002_and_restore_starts_fresh() {
    let sandbox = Sandbox::new();
    let mut agent = sandbox.initialized().await;
    let error = agent
        .client()
        .resume_session(UNKNOWN_SESSION, sandbox.cwd())
        .await
        .expect_err("unknown");
    assert_json_rpc_error(&error, -32002);
    let outcome = sandbox.restore(&mut agent, UNKNOWN_SESSION).await;
    match &outcome {
        RestoreOutcome::Fresh {
            session_id,
            why: FreshReason::UnknownSession,
        } => assert_ne!(session_id, UNKNOWN_SESSION),
        other => panic!("expected a fresh start, got {other:?}"),
    }
    stop(agent).await;
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_prompt_without_credentials_is_auth_required() {
    let sandbox = Sandbox::new();
    let agent = sandbox.initialized().await;
    let session = sandbox.new_session(&agent).await;
    let error = agent
        .client()
        .prompt(&session, "hello")
        .await
        .expect_err("no API key");
    assert_json_rpc_error(&error, -32000);
    stop(agent).await;
}

#[tokio::test]
#[ignore = "protocol: needs npm agents (make protocol)"]
async fn claude_restore_with_local_agent_resumes_the_known_session() {
    let sandbox = Sandbox::new();
    sandbox.place_fixture();
    let options = RestoreOptions {
        timeouts: timeouts(),
        spawn: sandbox.spawn_options(),
        ..RestoreOptions::default()
    };
    let report = restore_with_local_agent(
        &[claude_agent_acp()],
        Some(FIXTURE_SESSION),
        sandbox.cwd(),
        options,
    )
    .await
    .expect("report");
    assert_eq!(report.method, "session/resume");
    assert_eq!(report.outcome, OutcomeKind::Restored);
    assert_eq!(report.session_id.as_deref(), Some(FIXTURE_SESSION));
    assert!(report.capabilities.load_session && report.capabilities.session_resume);
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(json["outcome"], "restored");
    assert_eq!(json["sessionId"], FIXTURE_SESSION);
}
