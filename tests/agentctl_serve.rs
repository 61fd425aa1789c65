//! `agentctl serve` + `connect` + `events` as real processes over a unix socket, with
//! `kandev-test-agent` as the agent: the bridge survives clients coming and going, one client
//! at a time, initialize from the cache, events, history and history injection, the pod dying
//! with its agent, and repository credentials kept from the agent.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use agentctl_support::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

#[test]
fn clients_come_and_go_while_the_agent_keeps_running() {
    let serve = Serve::start(&[], &["--known-session", "test-session-1"]);
    let cwd = serve.workspace.clone();

    let mut first = serve.connect();
    let init = first.initialize(0);
    assert_eq!(
        init["result"]["agentInfo"]["name"], "kandev-test-agent",
        "{init}"
    );
    let created = first.new_session(1, &cwd);
    assert_eq!(created["result"]["sessionId"], "test-session-1");
    let prompted = first.prompt(2, "test-session-1", "hello");
    assert_eq!(prompted["result"]["stopReason"], "end_turn");
    assert_eq!(agent_chunks(&first.seen), vec!["echo: hello".to_owned()]);
    let agent_before = serve.agent_pids();
    assert_eq!(agent_before.len(), 1, "one agent process");
    // stdin stays open (kwok never closes it): the disconnect notification alone ends connect.
    assert!(first.disconnect().success());

    let mut second = serve.connect();
    // Same ids as the first client: agentctl rewrites them, nothing collides.
    let again = second.initialize(0);
    assert_eq!(again["result"], init["result"], "answered from the cache");
    let resumed = second.resume(1, json!({"sessionId": "test-session-1", "cwd": cwd}));
    assert_eq!(resumed["result"], json!({}), "{resumed}");
    // The agent still counts sessions from before: it is the same process.
    let created = second.new_session(2, &cwd);
    assert_eq!(created["result"]["sessionId"], "test-session-2");
    assert_eq!(
        serve.agent_pids(),
        agent_before,
        "the agent was never restarted"
    );
    assert!(second.disconnect().success());

    let log = serve.agent_log();
    let initializes = log.iter().filter(|l| l.as_str() == "initialize").count();
    assert_eq!(
        initializes, 1,
        "only agentctl's own initialize reached the agent: {log:?}"
    );
    assert_logged(&log, "session/resume test-session-1");
}

#[test]
fn a_second_client_is_refused_busy_without_hanging() {
    let serve = Serve::start(&[], &[]);
    let mut first = serve.connect();
    first.initialize(1);

    let mut second = serve.connect();
    let refusal = second.next();
    assert_eq!(
        refusal,
        json!({"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"agentctl busy: another client is connected"}})
    );
    let status = wait_exit(&mut second.child, WAIT, "a refused connect");
    assert!(!status.success());
    let stderr = second.stderr_text();
    assert!(stderr.contains("is busy"), "{stderr}");

    // The first client is unaffected.
    let created = first.new_session(2, &serve.workspace);
    assert_eq!(created["result"]["sessionId"], "test-session-1");

    // --takeover replaces a client whose exec stream died without closing its socket.
    let mut third = Client::spawn(&serve.socket, &["--takeover"]);
    let init = third.initialize(1);
    assert!(init.get("result").is_some(), "{init}");
    let status = wait_exit(&mut first.child, WAIT, "the replaced connect");
    assert!(status.success());
}

#[test]
fn invalid_lines_get_json_rpc_errors_and_everything_stays_up() {
    let mut serve = Serve::start(&[], &[]);
    let mut client = serve.connect();
    client.send_raw("this is not json");
    let error = client.next();
    assert_eq!(error["id"], Value::Null);
    assert_eq!(error["error"]["code"], -32700);
    client.send_raw(r#"{"hello":"world"}"#);
    assert_eq!(client.next()["error"]["code"], -32600);
    client.send_raw(r#"{"jsonrpc":"2.0","id":"x","method":7}"#);
    let error = client.next();
    assert_eq!(
        (error["id"].clone(), error["error"]["code"].clone()),
        (json!("x"), json!(-32600))
    );

    let init = client.initialize(1);
    assert!(init.get("result").is_some());
    let created = client.new_session(2, &serve.workspace);
    assert_eq!(created["result"]["sessionId"], "test-session-1");
    assert!(serve.is_running());
    let log = serve.agent_log();
    assert!(
        !log.iter().any(|l| l == "unparseable" || l == "invalid"),
        "garbage never reaches the agent: {log:?}"
    );
}

#[test]
fn events_follow_sessions_and_prompts() {
    let serve = Serve::start(&[], &["--known-session", "test-session-1"]);
    let events = serve.events();
    let mut client = serve.connect();
    client.initialize(1);
    client.new_session(2, &serve.workspace);
    client.prompt(3, "test-session-1", "hi");
    client.load(4, "test-session-1", &serve.workspace);

    let snapshot = events.next();
    assert_eq!(snapshot["event"], "snapshot", "{snapshot}");
    assert_eq!(
        (
            snapshot["sessionId"].clone(),
            snapshot["promptActive"].clone()
        ),
        (Value::Null, json!(false))
    );
    let created = events.next();
    assert_eq!(created["event"], "session_created");
    assert_eq!(created["sessionId"], "test-session-1");
    assert_eq!(created["method"], "session/new");
    assert!(
        created["timestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{created}"
    );
    let started = events.next();
    assert_eq!(
        (started["event"].clone(), started["sessionId"].clone()),
        (json!("prompt_started"), json!("test-session-1"))
    );
    let finished = events.next();
    assert_eq!(finished["event"], "prompt_finished");
    assert_eq!(finished["stopReason"], "end_turn");
    let loaded = events.next();
    assert_eq!(
        (loaded["event"].clone(), loaded["method"].clone()),
        (json!("session_created"), json!("session/load"))
    );

    // A subscriber arriving late starts from the current state.
    let late = serve.events();
    let snapshot = late.next();
    assert_eq!(snapshot["event"], "snapshot");
    assert_eq!(snapshot["sessionId"], "test-session-1");
    assert_eq!(snapshot["promptActive"], false);
}

/// An agent that sends ACP message ids: prompt_finished carries the id of the session's last
/// message (`lastMessageId`), in the live stream and in the journal; after a `session/load`
/// replay, the snapshot has the transcript's last one.
#[test]
fn the_last_message_id_travels_with_the_events() {
    let serve = Serve::start(
        &[],
        &[
            "--message-ids",
            "--known-session",
            "test-session-1",
            "--replay",
            "3",
        ],
    );
    let events = serve.events();
    let mut client = serve.connect();
    client.initialize(1);
    client.new_session(2, &serve.workspace);
    client.prompt(3, "test-session-1", "hi");
    let finished = events.until("prompt_finished");
    assert_eq!(
        finished["lastMessageId"], "test-session-1/m-1",
        "{finished}"
    );
    client.prompt(4, "test-session-1", "again");
    let finished = events.until("prompt_finished");
    assert_eq!(
        finished["lastMessageId"], "test-session-1/m-2",
        "{finished}"
    );
    let journal =
        std::fs::read_to_string(serve.workspace.join(".kandev/journal.jsonl")).expect("journal");
    let journaled: Vec<Value> = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "prompt_finished")
        .map(|e| e["lastMessageId"].clone())
        .collect();
    assert_eq!(
        journaled,
        [json!("test-session-1/m-1"), json!("test-session-1/m-2")]
    );

    // The replayed transcript ends with replay-2; a late subscriber's snapshot says so.
    client.load(5, "test-session-1", &serve.workspace);
    let snapshot = serve.events().next();
    assert_eq!(snapshot["event"], "snapshot");
    assert_eq!(
        snapshot["lastMessageId"], "test-session-1/replay-2",
        "{snapshot}"
    );
}

#[test]
fn a_failed_prompt_is_reported_with_its_error() {
    let serve = Serve::start(
        &[],
        &["--on-prompt", "error:-32000:Authentication required"],
    );
    let events = serve.events();
    let mut client = serve.connect();
    client.new_session(1, &serve.workspace);
    let answer = client.prompt(2, "test-session-1", "x");
    assert_eq!(answer["error"]["code"], -32000);
    let finished = events.until("prompt_finished");
    assert_eq!(
        finished["error"],
        json!({"code": -32000, "message": "Authentication required"})
    );
    assert!(finished.get("stopReason").is_none());
}

#[test]
fn late_answers_for_a_departed_client_are_dropped() {
    let serve = Serve::start(
        &[],
        &["--on-prompt", "hang", "--known-session", "test-session-1"],
    );
    let mut first = serve.connect();
    first.new_session(1, &serve.workspace);
    first.send_request(
        json!(2),
        "session/prompt",
        prompt_params("test-session-1", "long job"),
    );
    serve.wait_agent_log("the prompt", |l| {
        l.iter().any(|l| l == "session/prompt test-session-1")
    });
    let snapshot = serve.events().next();
    assert_eq!(snapshot["promptActive"], true, "{snapshot}");
    assert!(first.disconnect().success());

    let mut second = serve.connect();
    // The cancel makes the agent answer the first client's prompt now…
    second.send(
        &json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"test-session-1"}}),
    );
    // …and that late answer must not reach the second client under the id 2 it reuses.
    let resumed = second.resume(
        2,
        json!({"sessionId":"test-session-1","cwd":serve.workspace}),
    );
    assert_eq!(
        resumed["result"],
        json!({}),
        "got someone else's answer: {resumed}"
    );
    assert!(
        second.seen.iter().all(|m| m.get("method").is_some()),
        "{:?}",
        second.seen
    );
}

#[test]
fn agent_requests_go_to_the_client_or_get_safe_defaults() {
    // --chatter: before each answer the agent also sends a garbage line, an unknown
    // notification, a permission request and an fs request.
    let serve = Serve::start(&[], &["--chatter"]);
    // agentctl's own initialize triggers chatter while (most likely) nobody is connected; in
    // any case both requests end up answered by agentctl with the defaults.
    let log = serve.wait_agent_log("answers to agent-1 and agent-2", |l| {
        l.iter().any(|l| l.starts_with("response agent-1"))
            && l.iter().any(|l| l.starts_with("response agent-2"))
    });
    assert_logged(
        &log,
        r#"response agent-1 ok {"outcome":{"outcome":"cancelled"}}"#,
    );
    assert_logged(&log, "response agent-2 error -32601");

    // A client that says it decides permissions gets them (others leave them to the policy).
    let mut client = Client::spawn(&serve.socket, &["--permissions"]);
    client.send_request(
        json!(1),
        "session/new",
        new_session_params(&serve.workspace),
    );
    let mut permission = None;
    let mut read = None;
    while permission.is_none() || read.is_none() {
        let message = client.next();
        match message["method"].as_str() {
            Some("session/request_permission") => permission = Some(message),
            Some("fs/read_text_file") => read = Some(message),
            _ => client.seen.push(message),
        }
    }
    let (permission, read) = (permission.unwrap_or_default(), read.unwrap_or_default());
    assert_eq!(permission["id"], "agent-3");
    client.send(&json!({"jsonrpc":"2.0","id":permission["id"],"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}));
    serve.wait_agent_log("the client's answer", |l| {
        l.iter()
            .any(|l| l.starts_with("response agent-3 ok") && l.contains("selected"))
    });
    // The client leaves with the fs request unanswered: agentctl answers it.
    assert_eq!(read["id"], "agent-4");
    assert!(client.disconnect().success());
    serve.wait_agent_log("the default for agent-4", |l| {
        l.contains(&"response agent-4 error -32601".to_owned())
    });
}

#[test]
fn history_is_recorded_under_the_session_name() {
    let serve = Serve::start(&["--session-name", "ts-1"], &[]);
    let mut client = serve.connect();
    client.new_session(1, &serve.workspace);
    client.prompt(2, "test-session-1", "fix the bug");
    let history = serve.history("ts-1", 2);
    let kinds: Vec<(Value, Value)> = history
        .iter()
        .map(|e| (e["type"].clone(), e["text"].clone()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (json!("user_message"), json!("fix the bug")),
            (json!("agent_message"), json!("echo: fix the bug")),
        ]
    );
    assert!(history.iter().all(|e| e["timestamp"].as_str().is_some()));
}

#[test]
fn history_is_injected_into_the_first_prompt_after_a_fresh_start_only() {
    // A previous pod recorded this history; the new agent starts fresh.
    let dir = tempfile::tempdir().expect("tempdir");
    write_history(
        &dir.path().join(WORKSPACE),
        "ts-1",
        concat!(
            r#"{"type":"user_message","text":"earlier question"}"#,
            "\n",
            r#"{"type":"agent_message","text":"earlier answer"}"#,
            "\n",
        ),
    );
    // The auggie profile has historyContextInjection; the command after `--` replaces its launch.
    let serve = Serve::start_agent_in(dir, &["--profile", "auggie", "--session-name", "ts-1"], &[]);

    let mut client = serve.connect();
    client.new_session(1, &serve.workspace);
    client.prompt(2, "test-session-1", "next step");
    // The test agent echoes the prompt text it received.
    let echoed = agent_chunks(&client.seen);
    assert_eq!(echoed.len(), 1);
    let received = echoed[0].strip_prefix("echo: ").unwrap_or_default();
    assert!(
        received.starts_with("RESUME CONTEXT FOR CONTINUING TASK"),
        "{received}"
    );
    assert!(
        received.contains("[USER]: earlier question\n[ASSISTANT]: earlier answer"),
        "{received}"
    );
    assert!(
        received.contains("=== CURRENT REQUEST ===\nnext step\n"),
        "{received}"
    );
    assert_eq!(
        received
            .matches("RESUME CONTEXT FOR CONTINUING TASK")
            .count(),
        1,
        "wrapped once"
    );

    client.seen.clear();
    client.prompt(3, "test-session-1", "and then");
    assert_eq!(
        agent_chunks(&client.seen),
        vec!["echo: and then".to_owned()],
        "only the first prompt"
    );

    // The history keeps what the user typed, not the wrapped context.
    let history = serve.history("ts-1", 6);
    let users: Vec<&str> = history
        .iter()
        .filter(|e| e["type"] == "user_message")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert_eq!(users, vec!["earlier question", "next step", "and then"]);
}

#[test]
fn the_pod_dies_with_its_agent() {
    let mut serve = Serve::start(&[], &["--on-prompt", "crash"]);
    let mut events = serve.events();
    let mut client = serve.connect();
    client.new_session(1, &serve.workspace);
    let answer = client.prompt(2, "test-session-1", "boom");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let exited = events.until("agent_exited");
    assert_eq!(exited["code"], 3);
    assert!(exited["timestamp"].is_string());
    let status = wait_exit(&mut serve.child, WAIT, "serve after the agent exited");
    assert!(!status.success());
    // Clients see the socket close and exit on their own.
    assert!(wait_exit(&mut client.child, WAIT, "connect").success());
    assert!(wait_exit(&mut events.child, WAIT, "events").success());
    assert!(!serve.socket.exists(), "the socket is removed");
}

/// serve's last answer reaches a client that is slow to read it: after the agent exits, serve
/// waits until its ACP client closes the connection before it exits itself. In a pod, serve's
/// exit ends the container and kills the `agentctl connect` exec'd into it, which may not have
/// forwarded that answer yet (the operator then saw a closed stream instead of the error).
#[test]
fn serve_waits_for_its_client_to_take_the_last_answer() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::time::Duration;
    let mut serve = Serve::start(&[], &["--on-prompt", "crash"]);
    let stream = UnixStream::connect(&serve.socket).expect("connect to serve's socket");
    let mut writer = stream.try_clone().expect("clone the stream");
    let mut reader = BufReader::new(stream);
    writeln!(writer, r#"{{"mode":"acp"}}"#).expect("hello");
    let mut request = |id: u64, method: &str, params: Value| {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(writer, "{line}").expect("write to serve");
    };
    request(1, "session/new", new_session_params(&serve.workspace));
    request(2, "session/prompt", prompt_params("test-session-1", "boom"));
    let mut line = String::new();
    let answer = loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).expect("read from serve") > 0,
            "serve closed first"
        );
        let message: Value = serde_json::from_str(&line).expect("JSON");
        if message["id"] == 2 {
            break message;
        }
    };
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    // The agent is gone and its answer sent; serve stays while this client holds the socket.
    std::thread::sleep(Duration::from_millis(500));
    assert!(serve.is_running(), "serve exited before its client left");
    drop(reader);
    drop(writer);
    let status = wait_exit(&mut serve.child, WAIT, "serve after its client left");
    assert!(!status.success());
}

/// Repository credentials are the clone's: the agent's environment lacks them, and agentctl, which
/// holds them, is not dumpable, so the agent (the same user) cannot read them in
/// `/proc/<agentctl>/environ` either. (The tests run as root, who may read it anyway: agentctl's
/// log reports what the kernel says after the change.)
#[test]
fn repository_credentials_stay_out_of_the_agents_reach() {
    const PASSWORD: &str = "s3cr3t-for-the-clone";
    let command = test_agent_command(&[]);
    let env = [
        ("KANDEV_GIT_USERNAME", std::path::Path::new("git")),
        ("KANDEV_GIT_PASSWORD", std::path::Path::new(PASSWORD)),
    ];
    let with = Serve::start_in(scratch("kandev-agentctl-"), &[], &command, &env);
    let without = Serve::start(&[], &[]);
    let sealed = |serve: &Serve| {
        serve
            .read
            .borrow()
            .iter()
            .any(|line| line.contains("agentctl is not dumpable"))
    };
    assert!(sealed(&with), "not sealed: {:?}", with.read.borrow());
    assert!(!sealed(&without), "sealed without credentials");
    let agents = with.agent_pids();
    assert_eq!(agents.len(), 1, "one agent process");
    let environ = std::fs::read(format!("/proc/{}/environ", agents[0])).expect("agent environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains(PASSWORD), "the agent has the password");
    assert!(
        !environ.contains("KANDEV_GIT_"),
        "the agent has a KANDEV_GIT_ variable"
    );
}

/// An idle agent (no prompt, no client) is stopped after `--suspend-idle-after`: serve journals
/// `suspended`, writes `Suspended: …` as the termination message and exits 0. A connected
/// client and a running prompt (even one whose client left) hold the suspension off.
#[test]
fn an_idle_agent_is_suspended_and_activity_holds_it_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("termination-log");
    let log_arg = path_str(&log);
    let mut serve = Serve::start_agent_in(
        dir,
        &["--suspend-idle-after", "2", "--termination-log", &log_arg],
        &["--on-prompt", "hang"],
    );
    let events = serve.events();
    // A connected client: not idle, however long it stays.
    let mut client = serve.connect();
    client.new_session(1, &serve.workspace);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(serve.is_running(), "suspended while a client was connected");
    // A prompt that goes on after its client left: not idle either.
    client.send_raw(
        &json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{
            "sessionId":"test-session-1","prompt":[{"type":"text","text":"work"}]}})
        .to_string(),
    );
    events.until("prompt_started");
    assert!(client.disconnect().success());
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(serve.is_running(), "suspended while a prompt ran");
    // The prompt ends (cancelled): idle from then on, suspended 2 s later.
    let mut canceller = serve.connect();
    canceller.initialize(1);
    canceller.send_raw(
        &json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"test-session-1"}})
            .to_string(),
    );
    events.until("prompt_finished");
    assert!(canceller.disconnect().success());
    let suspended = events.until("suspended");
    assert!(
        suspended["idleSeconds"].as_u64().is_some_and(|s| s >= 2),
        "{suspended}"
    );
    let status = wait_exit(&mut serve.child, WAIT, "serve after the suspension");
    assert!(
        status.success(),
        "a suspension ends serve with success: {status}"
    );
    let message = std::fs::read_to_string(&log).expect("the termination message");
    assert!(message.starts_with("Suspended: idle for "), "{message}");
    assert!(!serve.socket.exists(), "the socket is removed");
}

/// `agentctl answer` runs `serve` with its path to the socket.
fn answer(serve: &Serve, request: &str, kind: &str) -> (i32, Value) {
    let output = agentctl()
        .args(["answer", "--socket"])
        .arg(&serve.socket)
        .args([request, kind])
        .output()
        .expect("run agentctl answer");
    let line = String::from_utf8_lossy(&output.stdout);
    let result = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), result)
}

/// With no client that decides, the policy answers: an edit allowed by a rule at once, a command
/// held (journaled, in the snapshot) until `agentctl answer` gives it the person's option; a
/// second answer to it is refused with exit code 3; the prompt finishes having received exactly
/// those answers.
#[test]
fn permission_requests_follow_the_policy_and_wait_for_an_answer() {
    let policy =
        r#"{"default":"ask","rules":[{"kinds":["edit"],"action":"allow"}],"askTimeoutSeconds":0}"#;
    let serve = Serve::start(
        &["--permissions", policy],
        &["--ask-permissions", "edit,execute"],
    );
    let events = serve.events();
    let mut client = serve.connect();
    client.initialize(1);
    client.new_session(2, &serve.workspace);
    client.send_request(
        json!(3),
        "session/prompt",
        prompt_params("test-session-1", "go"),
    );
    let requested = loop {
        let event = events.next();
        if event["event"] == "permission_requested" {
            break event;
        }
    };
    // Ids are unique across the session's pods: `<when serve started, base 36>-<n>`.
    let id = requested["request"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    assert!(id.ends_with("-2"), "{requested}");
    assert_eq!(requested["request"]["toolKind"], "execute");
    assert_eq!(requested["request"]["title"], "Run make test");
    let log = serve.wait_agent_log("the edit allowed", |l| {
        l.iter().any(|l| l.starts_with("permission edit"))
    });
    assert_logged(&log, "permission edit selected opt-allow_once");
    assert!(
        !log.iter().any(|l| l.starts_with("permission execute")),
        "{log:?}"
    );
    let late = serve.events();
    let snapshot = late.next();
    assert_eq!(
        snapshot["pendingPermissions"][0]["id"],
        id.as_str(),
        "{snapshot}"
    );
    let (code, refused) = answer(&serve, &id, "reject_always");
    assert_eq!(code, 0, "reject_always is offered: {refused}");
    assert_eq!(refused["outcome"], "rejected");
    let log = serve.wait_agent_log("the execute answered", |l| {
        l.iter().any(|l| l.starts_with("permission execute"))
    });
    assert_logged(&log, "permission execute selected opt-reject_always");
    let finished = client.response(&json!(3));
    assert_eq!(finished["result"]["stopReason"], "end_turn", "{finished}");
    let (code, again) = answer(&serve, &id, "allow_once");
    assert_eq!(code, 3, "{again}");
    assert!(
        again["refused"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("no permission request {id} waits"))),
        "{again}"
    );
}

/// askTimeout passes: the request is rejected once, with its reason in the journal.
#[test]
fn an_unanswered_permission_request_is_rejected_at_its_timeout() {
    let policy = r#"{"default":"ask","rules":[],"askTimeoutSeconds":1}"#;
    let serve = Serve::start(&["--permissions", policy], &["--ask-permissions", "fetch"]);
    let events = serve.events();
    let mut client = serve.connect();
    client.initialize(1);
    client.new_session(2, &serve.workspace);
    let finished = client.prompt(3, "test-session-1", "go");
    assert_eq!(finished["result"]["stopReason"], "end_turn", "{finished}");
    let log = serve.wait_agent_log("the fetch answered", |l| {
        l.iter().any(|l| l.starts_with("permission fetch"))
    });
    assert_logged(&log, "permission fetch selected opt-reject_once");
    let resolved = loop {
        let event = events.next();
        if event["event"] == "permission_resolved" {
            break event;
        }
    };
    assert_eq!(resolved["outcome"], "timedOut", "{resolved}");
    assert!(
        resolved["reason"]
            .as_str()
            .is_some_and(|r| r.contains("askTimeout (1s)")),
        "{resolved}"
    );
}
