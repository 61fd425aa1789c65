//! `agentctl serve` holding the real `@agentclientprotocol/claude-agent-acp` (offline, no API
//! key): a client initializes and creates a session, disconnects, and a second client resumes
//! that session from the same, still running agent.
//!
//! Run: `bash e2e/agents.sh` (prints the bin dir), then
//! `KANDEV_CLAUDE_AGENT_ACP=<bin>/claude-agent-acp cargo test --test agentctl_claude -- --ignored`.

mod agentctl_support;

use std::path::Path;

use agentctl_support::*;
use pretty_assertions::assert_eq;
use serde_json::json;

#[test]
#[ignore = "protocol: needs npm agents (make protocol)"]
fn claude_session_survives_a_client_reconnect() {
    let agent = match std::env::var("KANDEV_CLAUDE_AGENT_ACP") {
        Ok(path) if !path.is_empty() => path,
        _ => panic!("KANDEV_CLAUDE_AGENT_ACP is not set: run `bash e2e/agents.sh` first"),
    };
    let dir = tempfile::Builder::new()
        .prefix("kandev-agentctl-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    // IS_SANDBOX=1: claude-agent-acp refuses to run as root otherwise (DESIGN §6 quirks).
    let env: [(&str, &Path); 2] = [("HOME", &home), ("IS_SANDBOX", Path::new("1"))];
    let agent_log = dir.path().join("unused.log");
    let serve = Serve::start_with_env(dir, &[], &[agent], agent_log, &env);
    let cwd = serve.workspace.clone();

    let mut first = serve.connect();
    let init = first.request(json!(0), "initialize", initialize_params());
    assert!(init["result"]["agentCapabilities"].is_object(), "{init}");
    let created = first.request(json!(1), "session/new", new_session_params(&cwd));
    let session = created["result"]["sessionId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!session.is_empty(), "{created}");
    let agent_pids = serve.agent_pids();
    assert!(first.disconnect().success());

    let mut second = serve.connect();
    let again = second.request(json!(0), "initialize", initialize_params());
    assert_eq!(again["result"], init["result"], "answered from the cache");
    let resumed = second.request(
        json!(1),
        "session/resume",
        json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
    );
    assert!(resumed.get("error").is_none(), "{resumed}");
    let resumed_id = resumed["result"]["sessionId"].as_str().unwrap_or(&session);
    assert_eq!(resumed_id, session);
    assert_eq!(serve.agent_pids(), agent_pids, "the same agent process");
    assert!(second.disconnect().success());
}
