//! `agentctl serve` holding the real `@agentclientprotocol/claude-agent-acp` (offline, no API
//! key): a client initializes and creates a session, disconnects, and a second client resumes
//! that session from the same, still running agent.
//!
//! Run: `bash e2e/agents.sh` (prints the bin dir), then
//! `KANDEV_CLAUDE_AGENT_ACP=<bin>/claude-agent-acp cargo test --test agentctl_claude -- --ignored`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use std::path::Path;

use agentctl_support::*;
use pretty_assertions::assert_eq;
use serde_json::json;

#[test]
#[ignore = "protocol: needs npm agents (make protocol)"]
fn claude_session_survives_a_client_reconnect() {
    let agent = claude_agent_acp();
    let dir = scratch("kandev-agentctl-");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    // IS_SANDBOX=1: claude-agent-acp refuses to run as root otherwise (DESIGN §6 quirks).
    let env: [(&str, &Path); 2] = [("HOME", &home), ("IS_SANDBOX", Path::new("1"))];
    let serve = Serve::start_in(dir, &[], &[agent], &env);
    let cwd = serve.workspace.clone();

    let mut first = serve.connect();
    let init = first.initialize(0);
    assert!(init["result"]["agentCapabilities"].is_object(), "{init}");
    let created = first.new_session(1, &cwd);
    let session = created["result"]["sessionId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!session.is_empty(), "{created}");
    let agent_pids = serve.agent_pids();
    assert!(first.disconnect().success());

    let mut second = serve.connect();
    let again = second.initialize(0);
    assert_eq!(again["result"], init["result"], "answered from the cache");
    let resumed = second.resume(
        1,
        json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
    );
    assert!(resumed.get("error").is_none(), "{resumed}");
    let resumed_id = resumed["result"]["sessionId"].as_str().unwrap_or(&session);
    assert_eq!(resumed_id, session);
    assert_eq!(serve.agent_pids(), agent_pids, "the same agent process");
    assert!(second.disconnect().success());
}
