//! `agentctl serve` with `kandev-test-agent --session-config` as real processes: the session's
//! mode, model and config options travel in the events (and so into ExecutorRunning status), and
//! after a restore agentctl sets back the saved values the restored session reports differently,
//! before the client gets the restore's answer; a set-back the agent refuses is reported and the
//! restore stands.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use agentctl_support::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

fn saved() -> Value {
    json!({"mode": "plan", "model": "large", "configOptions": [{"id": "effort", "value": "high"}]})
}

fn resume_params(serve: &Serve) -> Value {
    json!({"sessionId": "test-session-1", "cwd": serve.workspace,
        "_meta": {"kandev.dev/session-config": saved()}})
}

/// serve with a test agent that reports a session configuration (`--session-config`, plus
/// `extra`) and knows `test-session-1`; an events subscriber; a client that initialized.
fn start(extra: &[&str]) -> (Serve, Events, Client) {
    let mut agent_args = vec!["--session-config", "--known-session", "test-session-1"];
    agent_args.extend(extra);
    let serve = Serve::start(&[], &agent_args);
    let events = serve.events();
    let mut client = serve.connect();
    client.initialize(1);
    (serve, events, client)
}

#[test]
fn a_resume_sets_the_saved_configuration_back() {
    let (serve, events, mut client) = start(&[]);
    client.new_session(2, &serve.workspace);
    let config = events.until("session_config");
    assert_eq!(config["sessionId"], "test-session-1");
    assert_eq!(
        config["config"],
        json!({"mode": "default", "model": "small", "configOptions": [{"id": "effort", "value": "low"}]})
    );
    // The agent reports a change of mode in a session/update: followed.
    client.prompt(3, "test-session-1", "set-mode plan");
    assert_eq!(events.until("session_config")["config"]["mode"], "plan");
    assert!(client.disconnect().success());

    let mut client = serve.connect();
    client.initialize(1);
    let resumed = client.resume(2, resume_params(&serve));
    assert_eq!(
        resumed["result"]["modes"]["currentModeId"], "default",
        "{resumed}"
    );
    let log = serve.wait_agent_log("three set-backs", |log| {
        log.iter().filter(|l| l.starts_with("set ")).count() >= 3
    });
    let tail: Vec<&str> = log
        .iter()
        .skip_while(|l| !l.starts_with("session/resume"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail.iter()
            .filter(|l| l.starts_with("set "))
            .collect::<Vec<_>>(),
        vec![&"set mode plan", &"set model large", &"set effort high"],
        "{log:?}"
    );
    assert!(
        !log.iter().any(|l| l.contains("kandev.dev")),
        "the saved configuration never reaches the agent"
    );
    assert_eq!(events.until("session_created")["method"], "session/resume");
    let mut last = Value::Null;
    for _ in 0..4 {
        last = events.until("session_config");
    }
    assert_eq!(
        last["config"],
        saved(),
        "the set-back values are what the events report"
    );
    assert!(client.disconnect().success());
}

#[test]
fn a_refused_set_back_is_reported_and_the_restore_stands() {
    let (serve, events, mut client) = start(&["--reject-set"]);
    let resumed = client.resume(2, resume_params(&serve));
    assert!(resumed.get("result").is_some(), "{resumed}");
    let failed = events.until("config_set_back_failed");
    assert_eq!(failed["sessionId"], "test-session-1");
    assert_eq!(failed["method"], "session/set_mode");
    assert_eq!(failed["error"]["code"], -32603);
    // The session still works.
    let prompted = client.prompt(3, "test-session-1", "hello");
    assert_eq!(prompted["result"]["stopReason"], "end_turn");
    assert!(client.disconnect().success());
}
