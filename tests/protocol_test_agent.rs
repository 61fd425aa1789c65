//! Protocol tier (DESIGN §6, tier 2) against `kandev-test-agent`, our scriptable ACP agent:
//! the restore error-path matrix of DESIGN §3 "ACP restore selection", run as real processes
//! over stdio. Each test asserts the outcome AND, through the agent's `--log`, which methods
//! were really called — above all that a failure which keeps the token never sent
//! `session/new`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_client_protocol::v1::schema::StopReason;
use agentctl_support::{
    TOKEN, assert_logged, read_lines, restore_saved, spawn_agent, stop_agent, test_agent_command,
};
use kandev_operator::acp::{
    AcpError, AcpTimeouts, LocalAgent, OutcomeKind, RestoreOptions, RestoreOutcome, RestoreReport,
    restore_with_local_agent,
};
use kandev_operator::jsonrpc::CallFailure;
use kandev_operator::resume::{FreshReason, NativeSessionResume, RestoreErrorClass, RestoreMethod};
use pretty_assertions::assert_eq;
use serde_json::json;

// What the agent logs for the calls a restore makes ([`Run::calls`]).
const INITIALIZE: &str = "initialize";
const RESUME: &str = "session/resume saved-session-1";
const LOAD: &str = "session/load saved-session-1";
const NEW: &str = "session/new";

/// Short enough to keep hang tests quick, long enough for a loaded machine to start a process.
fn timeouts() -> AcpTimeouts {
    AcpTimeouts {
        initialize: Duration::from_secs(20),
        session: Duration::from_secs(3),
        prompt: Some(Duration::from_secs(20)),
    }
}

struct Run {
    _dir: tempfile::TempDir,
    log: PathBuf,
    cwd: PathBuf,
}

impl Run {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cwd = dir.path().join("work");
        std::fs::create_dir(&cwd).expect("cwd");
        Self {
            log: dir.path().join("calls.log"),
            cwd,
            _dir: dir,
        }
    }

    /// `kandev-test-agent <args> --log <this run's log>`.
    fn command(&self, args: &[&str]) -> Vec<String> {
        let mut cmd = test_agent_command(args);
        cmd.extend(["--log".to_owned(), self.log.display().to_string()]);
        cmd
    }

    fn spawn(&self, args: &[&str]) -> LocalAgent {
        let mut agent = spawn_agent(&self.command(args));
        agent.client_mut().set_timeouts(timeouts());
        agent
    }

    /// Every line the agent logged.
    fn log_lines(&self) -> Vec<String> {
        read_lines(&self.log)
    }

    /// The ACP methods the agent received, with their session id when there was one.
    fn calls(&self) -> Vec<String> {
        self.log_lines()
            .into_iter()
            .filter(|l| l.starts_with("initialize") || l.starts_with("session/"))
            .collect()
    }

    /// Whether the agent was ever asked for a `session/new`.
    fn asked_for_new(&self) -> bool {
        self.calls().iter().any(|c| c.starts_with(NEW))
    }

    /// Restores the saved [`TOKEN`] on a running agent, as [`Run::restore`] does.
    async fn restore_on(&self, agent: &mut LocalAgent) -> RestoreOutcome {
        restore_saved(agent.client_mut(), Some(TOKEN), &self.cwd, timeouts()).await
    }

    /// Restores `token` with the profile's native resume on and no fresh start requested.
    async fn restore(&self, args: &[&str], token: Option<&str>) -> RestoreOutcome {
        self.restore_with(args, token, NativeSessionResume::Auto, false)
            .await
    }

    async fn restore_with(
        &self,
        args: &[&str],
        token: Option<&str>,
        native: NativeSessionResume,
        fresh: bool,
    ) -> RestoreOutcome {
        let mut agent = self.spawn(args);
        let outcome = agent
            .client_mut()
            .restore(token, &self.cwd, native, fresh, timeouts())
            .await;
        stop(agent).await;
        outcome
    }
}

async fn stop(agent: LocalAgent) {
    stop_agent(agent, Duration::from_secs(2)).await;
}

fn assert_failed_keeping_token(
    outcome: &RestoreOutcome,
    method: RestoreMethod,
    class: RestoreErrorClass,
) {
    match outcome {
        RestoreOutcome::Failed {
            method: tried,
            class: got,
            token_kept,
            session_id,
            reason,
        } => {
            assert_eq!(*tried, Some(method), "{outcome:?}");
            assert_eq!(*got, class, "{outcome:?}");
            assert!(*token_kept, "{outcome:?}");
            assert_eq!(session_id.as_deref(), Some(TOKEN), "{outcome:?}");
            assert!(reason.starts_with(class.as_str()), "{reason}");
        }
        other => panic!("expected a failure keeping the token, got {other:?}"),
    }
}

/// The saved [`TOKEN`] restored by `method`.
fn restored(method: RestoreMethod) -> RestoreOutcome {
    RestoreOutcome::Restored {
        method,
        session_id: TOKEN.into(),
    }
}

/// A fresh start in the test agent's first new session.
fn fresh(why: FreshReason) -> RestoreOutcome {
    RestoreOutcome::Fresh {
        session_id: "test-session-1".to_owned(),
        why,
    }
}

// ---- Fallbacks that DESIGN §3 allows ----------------------------------------------------

#[tokio::test]
async fn resume_ok_restores_the_same_id_without_load_or_new() {
    let run = Run::new();
    let outcome = run.restore(&["--known-session", TOKEN], Some(TOKEN)).await;
    assert_eq!(outcome, restored(RestoreMethod::Resume));
    assert_eq!(run.calls(), [INITIALIZE, RESUME]);
}

#[tokio::test]
async fn method_not_found_on_resume_with_load_advertised_loads_the_same_id() {
    let run = Run::new();
    let args = ["--on-resume", "error:-32601", "--known-session", TOKEN];
    let outcome = run.restore(&args, Some(TOKEN)).await;
    assert_eq!(outcome, restored(RestoreMethod::Load));
    assert_eq!(run.calls(), [INITIALIZE, RESUME, LOAD]);
}

#[tokio::test]
async fn method_not_found_on_resume_and_load_falls_back_to_new_dropping_the_token() {
    let run = Run::new();
    let args = ["--on-resume", "error:-32601", "--on-load", "error:-32601"];
    let outcome = run.restore(&args, Some(TOKEN)).await;
    assert_eq!(outcome, fresh(FreshReason::MethodNotFound));
    assert_eq!(run.calls(), [INITIALIZE, RESUME, LOAD, NEW]);
}

#[tokio::test]
async fn method_not_found_on_resume_without_load_falls_back_to_new() {
    let run = Run::new();
    let args = ["--advertise", "resume", "--on-resume", "error:-32601"];
    let outcome = run.restore(&args, Some(TOKEN)).await;
    assert_eq!(outcome, fresh(FreshReason::MethodNotFound));
    assert_eq!(run.calls(), [INITIALIZE, RESUME, NEW]);
}

#[tokio::test]
async fn unknown_session_on_resume_falls_back_to_new_without_trying_load() {
    let run = Run::new();
    // No --known-session: resume answers -32002 "Resource not found", like claude-agent-acp.
    let outcome = run.restore(&[], Some(TOKEN)).await;
    assert_eq!(outcome, fresh(FreshReason::UnknownSession));
    assert_eq!(run.calls(), [INITIALIZE, RESUME, NEW]);
}

#[tokio::test]
async fn unknown_session_on_load_falls_back_to_new() {
    let run = Run::new();
    let outcome = run.restore(&["--advertise", "load"], Some(TOKEN)).await;
    assert_eq!(outcome, fresh(FreshReason::UnknownSession));
    assert_eq!(run.calls(), [INITIALIZE, LOAD, NEW]);
}

#[tokio::test]
async fn load_only_agent_is_loaded_and_replays_to_subscribers() {
    let run = Run::new();
    let args = [
        "--advertise",
        "load",
        "--known-session",
        TOKEN,
        "--replay",
        "3",
    ];
    let mut agent = run.spawn(&args);
    let mut updates = agent.client().subscribe_updates();
    let outcome = run.restore_on(&mut agent).await;
    assert_eq!(outcome, restored(RestoreMethod::Load));
    let mut texts = Vec::new();
    while let Ok(update) = updates.try_recv() {
        assert_eq!(update.session_id, TOKEN);
        texts.push(update.text().expect("text chunk").to_owned());
    }
    assert_eq!(
        texts,
        [
            "replayed message 0",
            "replayed message 1",
            "replayed message 2"
        ]
    );
    stop(agent).await;
}

#[tokio::test]
async fn neither_resume_nor_load_advertised_is_explicitly_unsupported_so_new() {
    let run = Run::new();
    let outcome = run.restore(&["--advertise", "none"], Some(TOKEN)).await;
    assert_eq!(outcome, fresh(FreshReason::RestoreUnsupportedByAgent));
    assert_eq!(run.calls(), [INITIALIZE, NEW]);
}

#[tokio::test]
async fn no_token_fresh_request_and_profile_without_native_resume_go_straight_to_new() {
    use NativeSessionResume::{Always, Auto, Never};
    let rows: [(Option<&str>, NativeSessionResume, bool, FreshReason); 5] = [
        (None, Auto, false, FreshReason::NoResumeToken),
        (Some("   "), Always, false, FreshReason::NoResumeToken),
        (
            Some(TOKEN),
            Never,
            false,
            FreshReason::ProfileHasNoNativeResume,
        ),
        (None, Never, false, FreshReason::NoResumeToken),
        // An explicit fresh start ignores a perfectly good token.
        (Some(TOKEN), Auto, true, FreshReason::NoResumeToken),
    ];
    for (token, native, fresh_requested, why) in rows {
        let run = Run::new();
        let outcome = run
            .restore_with(&["--known-session", TOKEN], token, native, fresh_requested)
            .await;
        assert_eq!(outcome, fresh(why), "{token:?} {native} {fresh_requested}");
        assert_eq!(run.calls(), [INITIALIZE, NEW]);
    }
}

// ---- Failures that keep the token (never a session/new) ---------------------------------

#[tokio::test]
async fn json_rpc_errors_that_are_not_conclusive_keep_the_token() {
    let rows = [
        ("error:-32000", RestoreErrorClass::AuthRequired),
        ("error:-32603", RestoreErrorClass::Internal),
        ("error:-32602", RestoreErrorClass::InvalidParams),
        ("error:-32800", RestoreErrorClass::Cancelled),
        ("error:-32099:custom", RestoreErrorClass::Other(-32099)),
    ];
    for (behavior, class) in rows {
        let run = Run::new();
        let args = ["--on-resume", behavior, "--known-session", TOKEN];
        let outcome = run.restore(&args, Some(TOKEN)).await;
        assert_failed_keeping_token(&outcome, RestoreMethod::Resume, class);
        // Neither session/load nor session/new: only -32601 may move on to load.
        assert_eq!(run.calls(), [INITIALIZE, RESUME], "{behavior}");
    }
}

#[tokio::test]
async fn auth_required_on_load_after_method_not_found_keeps_the_token() {
    let run = Run::new();
    let args = ["--on-resume", "error:-32601", "--on-load", "error:-32000"];
    let outcome = run.restore(&args, Some(TOKEN)).await;
    assert_failed_keeping_token(
        &outcome,
        RestoreMethod::Load,
        RestoreErrorClass::AuthRequired,
    );
    let RestoreOutcome::Failed { reason, .. } = &outcome else {
        unreachable!()
    };
    assert!(reason.contains("after: session/resume"), "{reason}");
    assert!(!run.asked_for_new());
}

#[tokio::test]
async fn a_hang_past_the_timeout_keeps_the_token() {
    let run = Run::new();
    let outcome = run.restore(&["--on-resume", "hang"], Some(TOKEN)).await;
    assert_failed_keeping_token(&outcome, RestoreMethod::Resume, RestoreErrorClass::Timeout);
    assert_eq!(run.calls(), [INITIALIZE, RESUME]);
}

#[tokio::test]
async fn garbage_instead_of_an_answer_keeps_the_token() {
    let run = Run::new();
    let mut agent = run.spawn(&["--on-resume", "garbage"]);
    let outcome = run.restore_on(&mut agent).await;
    // Garbage lines are skipped, so no answer ever comes: a timeout.
    assert_failed_keeping_token(&outcome, RestoreMethod::Resume, RestoreErrorClass::Timeout);
    assert_eq!(agent.client().garbage_lines(), 3);
    stop(agent).await;
    assert_eq!(run.calls(), [INITIALIZE, RESUME]);
}

#[tokio::test]
async fn a_malformed_answer_keeps_the_token() {
    let run = Run::new();
    let outcome = run
        .restore(&["--on-resume", "malformed"], Some(TOKEN))
        .await;
    assert_failed_keeping_token(
        &outcome,
        RestoreMethod::Resume,
        RestoreErrorClass::Malformed,
    );
    assert_eq!(run.calls(), [INITIALIZE, RESUME]);
}

#[tokio::test]
async fn a_crash_mid_restore_keeps_the_token() {
    let rows = [
        (&["--on-resume", "crash"][..], RestoreMethod::Resume),
        (
            &["--on-resume", "error:-32601", "--on-load", "crash"][..],
            RestoreMethod::Load,
        ),
    ];
    for (args, tried) in rows {
        let run = Run::new();
        let outcome = run.restore(args, Some(TOKEN)).await;
        assert_failed_keeping_token(&outcome, tried, RestoreErrorClass::Transport);
        assert_logged(&run.log_lines(), "crash");
        assert!(!run.asked_for_new());
    }
}

#[tokio::test]
async fn a_crash_during_initialize_keeps_the_token() {
    let run = Run::new();
    let outcome = run
        .restore(&["--on-initialize", "crash"], Some(TOKEN))
        .await;
    match &outcome {
        RestoreOutcome::Failed {
            method: None,
            class: RestoreErrorClass::Transport,
            token_kept: true,
            session_id: Some(id),
            ..
        } if id == TOKEN => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(outcome.method_name(), "initialize");
    assert_eq!(run.calls(), [INITIALIZE]);
}

#[tokio::test]
async fn an_unsupported_protocol_version_keeps_the_token() {
    let run = Run::new();
    let outcome = run.restore(&["--protocol-version", "2"], Some(TOKEN)).await;
    assert!(
        matches!(
            outcome,
            RestoreOutcome::Failed {
                method: None,
                class: RestoreErrorClass::Malformed,
                token_kept: true,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(run.calls(), [INITIALIZE]);
}

#[tokio::test]
async fn a_failing_fallback_new_reports_the_token_as_dropped() {
    let run = Run::new();
    // resume: -32002 proves the token useless; then session/new fails too.
    let outcome = run
        .restore(&["--on-new", "error:-32603"], Some(TOKEN))
        .await;
    match &outcome {
        RestoreOutcome::Failed {
            method: Some(RestoreMethod::New),
            class: RestoreErrorClass::Internal,
            token_kept: false,
            session_id: None,
            reason,
        } => assert!(reason.contains("after: session/resume"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(run.calls(), [INITIALIZE, RESUME, NEW]);
    // A failing session/new on an explicit fresh start keeps the (ignored) token.
    let run = Run::new();
    let outcome = run
        .restore_with(
            &["--on-new", "hang"],
            Some(TOKEN),
            NativeSessionResume::Auto,
            true,
        )
        .await;
    assert_failed_keeping_token(&outcome, RestoreMethod::New, RestoreErrorClass::Timeout);
}

// ---- The client copes with what real agents send ----------------------------------------

#[tokio::test]
async fn chatter_from_the_agent_is_answered_or_ignored() {
    let run = Run::new();
    let mut agent = run.spawn(&["--chatter", "--known-session", TOKEN]);
    let outcome = run.restore_on(&mut agent).await;
    assert!(
        matches!(outcome, RestoreOutcome::Restored { .. }),
        "{outcome:?}"
    );
    // One garbage line per request (initialize, resume).
    assert_eq!(agent.client().garbage_lines(), 2);
    stop(agent).await;
    let log = run.log_lines();
    // The permission request is cancelled, the fs request refused with -32601.
    assert_logged(
        &log,
        r#"response agent-1 ok {"outcome":{"outcome":"cancelled"}}"#,
    );
    assert_logged(&log, "response agent-2 error -32601");
    assert_logged(&log, "response agent-4 error -32601");
}

/// A running agent with a new session (`test-session-1`).
async fn with_session(run: &Run, args: &[&str]) -> (LocalAgent, String) {
    let mut agent = run.spawn(args);
    agent.client_mut().initialize().await.expect("initialize");
    let session = agent.client().new_session(&run.cwd).await.expect("new");
    (agent, session)
}

#[tokio::test]
async fn prompt_streams_updates_and_cancel_ends_a_hanging_turn() {
    let run = Run::new();
    let (agent, session) = with_session(&run, &[]).await;
    let mut updates = agent.client().subscribe_updates();
    let stop_reason = agent
        .client()
        .prompt(&session, "hello")
        .await
        .expect("prompt");
    assert_eq!(stop_reason, StopReason::EndTurn);
    let update = updates.recv().await.expect("update");
    assert_eq!(update.text(), Some("echo: hello"));
    stop(agent).await;

    let run = Run::new();
    let (agent, session) = with_session(&run, &["--on-prompt", "hang"]).await;
    let (stop_reason, ()) = tokio::join!(agent.client().prompt(&session, "long task"), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        agent.client().cancel(&session).await.expect("cancel");
    });
    assert_eq!(stop_reason.expect("prompt"), StopReason::Cancelled);
    stop(agent).await;
    assert_eq!(
        run.calls(),
        [
            INITIALIZE,
            NEW,
            "session/prompt test-session-1",
            "session/cancel test-session-1"
        ]
    );
}

#[tokio::test]
async fn calls_after_the_agent_exits_fail_as_transport_closed() {
    let run = Run::new();
    let mut agent = run.spawn(&["--on-new", "crash"]);
    agent.client_mut().initialize().await.expect("initialize");
    let error = agent
        .client()
        .new_session(&run.cwd)
        .await
        .expect_err("crashed");
    assert_eq!(error.failure(), Some(&CallFailure::TransportClosed));
    let error = agent
        .client()
        .resume_session(TOKEN, &run.cwd)
        .await
        .expect_err("closed");
    assert_eq!(error.failure(), Some(&CallFailure::TransportClosed));
    assert!(agent.client().is_closed());
}

// ---- restore_with_local_agent (the core of `agentctl restore`) ---------------------------

/// `restore_with_local_agent` with this file's timeouts.
async fn local_restore(
    cmd: &[String],
    token: Option<&str>,
    cwd: &Path,
) -> Result<RestoreReport, AcpError> {
    let options = RestoreOptions {
        timeouts: timeouts(),
        ..RestoreOptions::default()
    };
    restore_with_local_agent(cmd, token, cwd, options).await
}

/// A report's method, session id and outcome.
fn summary(report: &RestoreReport) -> (&str, Option<&str>, OutcomeKind) {
    (
        report.method.as_str(),
        report.session_id.as_deref(),
        report.outcome,
    )
}

#[tokio::test]
async fn local_restore_reports_restored_fresh_and_failed() {
    let run = Run::new();
    let cmd = run.command(&["--known-session", TOKEN]);
    let report = local_restore(&cmd, Some(TOKEN), &run.cwd)
        .await
        .expect("report");
    assert!(report.succeeded());
    assert_eq!(
        serde_json::to_value(&report).expect("json"),
        json!({"method": "session/resume", "sessionId": TOKEN, "outcome": "restored",
            "reason": "restored", "capabilities": {"protocolVersion": 1, "loadSession": true,
            "sessionResume": true, "agentName": "kandev-test-agent",
            "agentVersion": env!("CARGO_PKG_VERSION")}})
    );

    let cmd = run.command(&["--new-session-id", "brand-new"]);
    let report = local_restore(&cmd, Some("unknown"), &run.cwd)
        .await
        .expect("report");
    assert_eq!(
        summary(&report),
        ("session/new", Some("brand-new"), OutcomeKind::Fresh)
    );
    assert_eq!(report.reason, "unknown_session");

    let cmd = run.command(&["--on-resume", "error:-32000"]);
    let report = local_restore(&cmd, Some(TOKEN), &run.cwd)
        .await
        .expect("report");
    assert!(!report.succeeded());
    assert_eq!(
        summary(&report),
        ("session/resume", Some(TOKEN), OutcomeKind::Failed)
    );
    assert!(
        report
            .reason
            .starts_with("auth_required: session/resume answered JSON-RPC error -32000"),
        "{}",
        report.reason
    );
}

#[tokio::test]
async fn local_restore_accepts_a_relative_cwd() {
    let run = Run::new();
    let cmd = run.command(&[]);
    let report = local_restore(&cmd, None, Path::new("."))
        .await
        .expect("report");
    assert_eq!(report.outcome, OutcomeKind::Fresh);
    assert_eq!(report.reason, "no_resume_token");
}

#[tokio::test]
async fn local_restore_errors_only_when_it_cannot_start() {
    let run = Run::new();
    let error = local_restore(&[], Some(TOKEN), &run.cwd)
        .await
        .expect_err("empty");
    assert!(matches!(error, AcpError::EmptyCommand));
    let missing = vec!["/nonexistent/kandev-agent".to_owned()];
    let error = local_restore(&missing, Some(TOKEN), &run.cwd)
        .await
        .expect_err("missing");
    assert!(matches!(error, AcpError::Spawn { .. }), "{error}");
}

/// A hostile agent (issue 30): a 1,000,000-byte name in `initialize`, 1,000,000-byte error
/// messages and a 1,000,000-byte session id, each under the line limit so that the client's
/// bounds on the text itself are what holds. The name is cut, the error kept to its bound (the
/// token kept: -32603 is inconclusive), and the session id refused, never cut.
#[tokio::test]
async fn a_hostile_agents_words_are_bounded_where_they_enter() {
    use kandev_operator::api::bounds::{AGENT_NAME_MAX, MESSAGE_MAX, SESSION_ID_MAX};
    const BYTES: &str = "1000000";
    let run = Run::new();
    let mut agent = run.spawn(&["--hostile", BYTES, "--on-resume", "error:-32603"]);
    let capabilities = agent.client_mut().initialize().await.expect("initialize");
    let name = capabilities.agent_name.expect("a name");
    assert!(name.len() <= AGENT_NAME_MAX, "{} bytes", name.len());
    assert!(name.starts_with("NNN") && name.contains("… [+"), "{name}");
    let outcome = run.restore_on(&mut agent).await;
    stop(agent).await;
    assert_failed_keeping_token(&outcome, RestoreMethod::Resume, RestoreErrorClass::Internal);
    let RestoreOutcome::Failed { reason, .. } = &outcome else {
        unreachable!("checked above")
    };
    assert!(reason.len() <= MESSAGE_MAX, "{} bytes", reason.len());
    assert!(reason.contains("Internal error EEE"), "{reason}");

    let run = Run::new();
    let outcome = run
        .restore(&["--hostile", BYTES, "--hostile-session-id"], None)
        .await;
    let RestoreOutcome::Failed { class, reason, .. } = &outcome else {
        panic!("a 1,000,000-byte session id is refused: {outcome:?}")
    };
    assert_eq!(*class, RestoreErrorClass::Malformed, "{reason}");
    assert!(
        reason.contains(&format!(
            "sessionId of {BYTES} bytes, longer than the {SESSION_ID_MAX} kept"
        )),
        "{reason}"
    );
    assert!(reason.len() <= MESSAGE_MAX);
}
