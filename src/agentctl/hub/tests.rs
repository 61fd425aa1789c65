//! The hub's tests: every path of the protocol, driven through its inputs and checked on its
//! outputs.

use super::record::push_bounded;
use super::*;
use crate::agentctl::events::{AgentError, PromptOutcome};
use crate::api::{EffectivePolicy, PermissionAction, PermissionOutcome, ToolKind};
use crate::history::TRUNCATION_MARKER;
use pretty_assertions::assert_eq;

fn line(value: Value) -> String {
    value.to_string()
}

fn ready_hub(config: HubConfig) -> Hub {
    let mut hub = Hub::new(config);
    let out = hub.start();
    assert_eq!(out.len(), 1);
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}})));
    assert_eq!(out, vec![]);
    hub
}

fn to_agent(out: &[Output]) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToAgent(v) => Some(v.clone()),
            Output::InjectHistoryThenSend { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn to_client(out: &[Output]) -> Vec<(ConnId, Value)> {
    out.iter()
        .filter_map(|o| match o {
            Output::ToClient(c, v) => Some((*c, v.clone())),
            _ => None,
        })
        .collect()
}

fn events(out: &[Output]) -> Vec<Event> {
    out.iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

fn records(out: &[Output]) -> Vec<(String, HistoryEntry)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Record {
                history_session,
                entry,
            } => Some((history_session.clone(), entry.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn start_sends_initialize_without_client_capabilities() {
    let mut hub = Hub::new(HubConfig::default());
    let sent = to_agent(&hub.start());
    assert_eq!(sent[0]["method"], "initialize");
    assert_eq!(sent[0]["params"]["protocolVersion"], 1);
    assert_eq!(sent[0]["params"]["clientInfo"]["name"], "agentctl");
    assert_eq!(
        sent[0]["params"]["clientCapabilities"]["fs"]["readTextFile"],
        false
    );
    assert!(hub.initializing());
}

#[test]
fn the_worktree_travels_in_the_initialize_meta() {
    let worktree = json!({"branch": "kandev/t-1", "commit": "abc", "cloned": true});
    let mut hub = ready_hub(HubConfig {
        worktree: Some(worktree.clone()),
        ..HubConfig::default()
    });
    hub.attach(3, false).expect("attach");
    let out = hub.client_line(
        3,
        &line(json!({"jsonrpc":"2.0","id":9,"method":"initialize","params":{}})),
    );
    let answers = to_client(&out);
    assert_eq!(
        answers[0].1["result"]["_meta"]["kandev.dev/worktree"],
        worktree
    );
    assert_eq!(
        answers[0].1["result"]["agentCapabilities"]["loadSession"],
        true
    );
}

#[test]
fn initialize_is_answered_from_the_cache_never_resent() {
    let mut hub = Hub::new(HubConfig::default());
    hub.start();
    assert_eq!(hub.attach(7, false), Ok(vec![]));
    // Before the agent answered: queued.
    let out = hub.client_line(
        7,
        &line(json!({"jsonrpc":"2.0","id":"a","method":"initialize","params":{}})),
    );
    assert_eq!(out, vec![]);
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1}}),
    ));
    assert_eq!(
        to_client(&out),
        vec![(
            7,
            json!({"jsonrpc":"2.0","id":"a","result":{"protocolVersion":1}})
        )]
    );
    // After: straight from the cache, as often as asked, nothing reaches the agent.
    for id in [json!(1), json!(1), json!("x")] {
        let out = hub.client_line(
            7,
            &line(json!({"jsonrpc":"2.0","id":id,"method":"initialize"})),
        );
        assert_eq!(to_agent(&out), Vec::<Value>::new());
        assert_eq!(
            to_client(&out),
            vec![(
                7,
                json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":1}})
            )]
        );
    }
    assert!(!hub.initializing());
}

#[test]
fn initialize_error_stops_serve() {
    let mut hub = Hub::new(HubConfig::default());
    hub.start();
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}),
    ));
    assert_eq!(
        out,
        vec![Output::InitializeFailed {
            code: -32603,
            message: "boom".into()
        }]
    );
}

#[test]
fn session_setup_runs_in_the_served_working_directory() {
    let mut hub = ready_hub(HubConfig {
        session_cwd: Some("/srv/ws".into()),
        ..HubConfig::default()
    });
    hub.attach(1, false).expect("attach");
    for method in ["session/new", "session/load", "session/resume"] {
        let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":method,"params":{"sessionId":"s","cwd":"/workspace","mcpServers":[]}})));
        let sent = to_agent(&out);
        assert_eq!(sent[0]["params"]["cwd"], "/srv/ws", "{method}");
    }
    let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","cwd":"/elsewhere","prompt":[]}})));
    assert_eq!(
        to_agent(&out)[0]["params"]["cwd"],
        "/elsewhere",
        "other methods are untouched"
    );
}

#[test]
fn ids_are_rewritten_and_late_responses_dropped() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}})));
    let sent = to_agent(&out);
    assert_eq!(
        sent[0]["id"], 2,
        "agent-side id comes from agentctl's counter"
    );
    assert_eq!(
        sent[0]["params"]["cwd"], "/w",
        "params are forwarded untouched"
    );
    // The client leaves before the answer.
    let out = hub.client_line(
        1,
        &line(json!({"jsonrpc":"2.0","method":"_kandev/disconnect"})),
    );
    assert_eq!(out, vec![Output::CloseClient(1)]);
    assert_eq!(hub.attach(2, false), Ok(vec![]));
    // The new client reuses id 1; the agent gets a different id.
    let out = hub.client_line(2, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"s","cwd":"/w","mcpServers":[]}})));
    assert_eq!(to_agent(&out)[0]["id"], 3);
    // The late answer to client 1 is dropped but still produces the event.
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"s-old"}}),
    ));
    assert_eq!(to_client(&out), vec![]);
    assert_eq!(
        events(&out),
        vec![Event::SessionCreated {
            session_id: "s-old".into(),
            method: "session/new".into()
        }]
    );
    // Client 2's answer comes back under its own id.
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":3,"result":{}})));
    assert_eq!(
        to_client(&out),
        vec![(2, json!({"jsonrpc":"2.0","id":1,"result":{}}))]
    );
    assert_eq!(
        events(&out),
        vec![Event::SessionCreated {
            session_id: "s".into(),
            method: "session/load".into()
        }]
    );
}

#[test]
fn one_client_at_a_time_unless_takeover() {
    let mut hub = ready_hub(HubConfig::default());
    assert_eq!(hub.attach(1, false), Ok(vec![]));
    assert_eq!(hub.attach(2, false), Err(Busy));
    // A stale line from a refused connection is ignored.
    assert_eq!(
        hub.client_line(2, &line(json!({"jsonrpc":"2.0","id":1,"method":"x"}))),
        vec![]
    );
    assert_eq!(hub.attach(3, true), Ok(vec![Output::CloseClient(1)]));
    assert_eq!(hub.client(), Some(3));
    assert_eq!(hub.client_closed(1), vec![]);
    assert_eq!(hub.client_closed(3), vec![Output::CloseClient(3)]);
    assert_eq!(hub.attach(4, false), Ok(vec![]));
}

#[test]
fn invalid_client_lines_get_errors_and_change_nothing() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    let rows = [
        ("garbage", json!(null), code::PARSE_ERROR),
        ("[]", json!(null), code::INVALID_REQUEST),
        (r#"{"id":4,"method":"x"}"#, json!(4), code::INVALID_REQUEST),
    ];
    for (text, id, code) in rows {
        let out = hub.client_line(1, text);
        let replies = to_client(&out);
        assert_eq!(replies.len(), 1, "{text}");
        assert_eq!(replies[0].1["id"], id, "{text}");
        assert_eq!(replies[0].1["error"]["code"], code, "{text}");
        assert_eq!(to_agent(&out), Vec::<Value>::new());
    }
    assert_eq!(hub.client(), Some(1));
}

#[test]
fn agent_requests_go_to_the_client_or_get_safe_defaults() {
    let mut hub = ready_hub(HubConfig {
        permissions: EffectivePolicy {
            default: PermissionAction::Deny,
            rules: vec![],
            ask_timeout_seconds: 0,
        },
        ..HubConfig::default()
    });
    let permission = json!({"jsonrpc":"2.0","id":"p1","method":"session/request_permission","params":{"sessionId":"s"}});
    let read = json!({"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{}});
    // Nobody connected: agentctl answers (the policy denies; no option to pick, so cancelled).
    let out = hub.agent_line(&line(permission.clone()));
    assert_eq!(
        to_agent(&out),
        vec![json!({"jsonrpc":"2.0","id":"p1","result":{"outcome":{"outcome":"cancelled"}}})]
    );
    let out = hub.agent_line(&line(read.clone()));
    assert_eq!(to_agent(&out)[0]["error"]["code"], code::METHOD_NOT_FOUND);
    // Connected, and deciding: forwarded as is, and the client's answer goes back.
    hub.attach(1, false).ok();
    hub.client_decides_permissions(1);
    let out = hub.agent_line(&line(permission.clone()));
    assert_eq!(to_client(&out), vec![(1, permission)]);
    let answer = json!({"jsonrpc":"2.0","id":"p1","result":{"outcome":{"outcome":"selected","optionId":"allow"}}});
    assert_eq!(
        to_agent(&hub.client_line(1, &line(answer.clone()))),
        vec![answer.clone()]
    );
    // A second answer to the same request is dropped.
    assert_eq!(hub.client_line(1, &line(answer)), vec![]);
    // A client leaving with a request open: agentctl answers for it.
    hub.agent_line(&line(read));
    let out = hub.client_closed(1);
    assert_eq!(to_agent(&out)[0]["id"], 9);
    assert_eq!(to_agent(&out)[0]["error"]["code"], code::METHOD_NOT_FOUND);
}

#[test]
fn notifications_flow_both_ways() {
    let mut hub = ready_hub(HubConfig::default());
    let update = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}});
    assert_eq!(to_client(&hub.agent_line(&line(update.clone()))), vec![]);
    hub.attach(1, false).ok();
    assert_eq!(
        to_client(&hub.agent_line(&line(update.clone()))),
        vec![(1, update)]
    );
    let cancel = json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}});
    assert_eq!(
        to_agent(&hub.client_line(1, &line(cancel.clone()))),
        vec![cancel]
    );
    // Junk from the agent is ignored.
    assert_eq!(hub.agent_line("npm WARN something"), vec![]);
}

fn chunk(session: &str, text: &str) -> String {
    line(
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
        "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":text}}}}),
    )
}

fn prompt(id: u64, session: &str, text: &str) -> String {
    line(
        json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":session,
        "prompt":[{"type":"text","text":text}]}}),
    )
}

/// A client's prompt id is journaled with `prompt_started`, before the prompt goes to the agent,
/// which never sees it; one that could not be journaled safely is dropped.
#[test]
fn a_prompt_id_is_journaled_before_the_agent_gets_the_prompt() {
    let long = "p".repeat(129);
    for (id, journaled) in [
        (json!("p-1"), Some("p-1")),
        (json!(long), None),
        (json!("a\nb"), None),
        (json!(7), None),
    ] {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        let request = json!({"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{
            "sessionId":"s1","prompt":[{"type":"text","text":"hi"}],
            "_meta":{"kandev.dev/prompt-id": id}}});
        let out = hub.client_line(1, &line(request));
        assert_eq!(
            events(&out),
            vec![Event::PromptStarted {
                session_id: "s1".into(),
                prompt_id: journaled.map(String::from),
            }],
            "{id}"
        );
        let event_at = out.iter().position(|o| matches!(o, Output::Event(_)));
        let sent_at = out
            .iter()
            .position(|o| matches!(o, Output::ToAgent(_) | Output::InjectHistoryThenSend { .. }));
        assert!(event_at < sent_at, "journaled first: {out:?}");
        let sent = to_agent(&out);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["params"].get("_meta"), None, "{id}: {sent:?}");
    }
}

#[test]
fn prompt_turn_events_and_history() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    let out = hub.client_line(1, &prompt(5, "s1", "fix the bug"));
    assert_eq!(
        events(&out),
        vec![Event::PromptStarted {
            session_id: "s1".into(),
            prompt_id: None,
        }]
    );
    assert_eq!(
        records(&out),
        vec![(
            "s1".into(),
            HistoryEntry::UserMessage {
                text: "fix the bug".into(),
                timestamp: None
            }
        )]
    );
    let mut recorded = Vec::new();
    recorded.extend(records(&hub.agent_line(&chunk("s1", "Looking "))));
    recorded.extend(records(&hub.agent_line(&chunk("s1", "at it."))));
    let tool = |update: Value| {
        line(
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":update}}),
        )
    };
    recorded.extend(records(&hub.agent_line(&tool(json!({"sessionUpdate":"tool_call","toolCallId":"t1","title":"Read a.rs","kind":"read","status":"pending","rawInput":{"path":"a.rs"}})))));
    recorded.extend(records(&hub.agent_line(&tool(
        json!({"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"in_progress"}),
    ))));
    recorded.extend(records(&hub.agent_line(&tool(json!({"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"fn a() {}"}}]})))));
    recorded.extend(records(&hub.agent_line(&tool(
        json!({"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed"}),
    ))));
    recorded.extend(records(&hub.agent_line(&tool(json!({"sessionUpdate":"tool_call","toolCallId":"t2","title":"ls","status":"failed","rawOutput":"denied"})))));
    recorded.extend(records(&hub.agent_line(&chunk("s1", "Done."))));
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}),
    ));
    recorded.extend(records(&out));
    assert_eq!(
        events(&out),
        vec![Event::PromptFinished {
            session_id: "s1".into(),
            outcome: PromptOutcome::Stopped {
                stop_reason: json!("end_turn")
            },
            last_message_id: None,
        }]
    );
    assert_eq!(
        to_client(&out),
        vec![(
            1,
            json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}})
        )]
    );
    let entries: Vec<HistoryEntry> = recorded.into_iter().map(|(_, e)| e).collect();
    assert_eq!(
        entries,
        vec![
            HistoryEntry::AgentMessage {
                text: "Looking at it.".into(),
                timestamp: None
            },
            HistoryEntry::ToolCall {
                name: "Read a.rs".into(),
                input: json!({"path":"a.rs"}),
                timestamp: None
            },
            HistoryEntry::ToolResult {
                name: "Read a.rs".into(),
                output: "fn a() {}".into(),
                timestamp: None
            },
            HistoryEntry::ToolCall {
                name: "ls".into(),
                input: Value::Null,
                timestamp: None
            },
            HistoryEntry::ToolResult {
                name: "ls".into(),
                output: "[failed] denied".into(),
                timestamp: None
            },
            HistoryEntry::AgentMessage {
                text: "Done.".into(),
                timestamp: None
            },
        ]
    );
}

#[test]
fn snapshot_tracks_the_session_and_open_prompts() {
    let mut hub = ready_hub(HubConfig::default());
    let snapshot = |hub: &Hub| hub.snapshot().to_json("T");
    assert_eq!(
        snapshot(&hub),
        json!({"event":"snapshot","sessionId":null,"promptActive":false,"timestamp":"T"})
    );
    hub.attach(1, false).ok();
    new_session(&mut hub, 1, 1, "s");
    hub.client_line(1, &prompt(2, "s", "x"));
    hub.client_closed(1);
    // The client left, the agent is still working on its prompt.
    assert_eq!(
        snapshot(&hub),
        json!({"event":"snapshot","sessionId":"s","promptActive":true,"timestamp":"T"})
    );
    let prompt_id = hub.next_agent_id;
    hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":prompt_id,"result":{"stopReason":"end_turn"}}),
    ));
    assert_eq!(snapshot(&hub)["promptActive"], false);
}

/// A chunk of one session/update, with a message id.
fn chunk_with_id(session: &str, kind: &str, text: &str, message_id: &str) -> String {
    line(
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
        "update":{"sessionUpdate":kind,"messageId":message_id,"content":{"type":"text","text":text}}}}),
    )
}

#[test]
fn the_last_message_id_is_reported_with_the_prompts_end_and_in_the_snapshot() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    // A replayed transcript (session/load) sets it, though it is not recorded again.
    hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"s","cwd":"/","mcpServers":[]}})));
    hub.agent_line(&chunk_with_id(
        "s",
        "user_message_chunk",
        "old question",
        "m-1",
    ));
    hub.agent_line(&chunk_with_id(
        "s",
        "agent_message_chunk",
        "old answer",
        "m-2",
    ));
    hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{}})));
    assert_eq!(hub.last_message_id("s").as_deref(), Some("m-2"));
    assert_eq!(
        hub.snapshot().to_json("T"),
        json!({"event":"snapshot","sessionId":"s","promptActive":false,"lastMessageId":"m-2","timestamp":"T"})
    );
    hub.client_line(1, &prompt(2, "s", "next"));
    hub.agent_line(&chunk_with_id("s", "agent_thought_chunk", "hm", "m-3"));
    hub.agent_line(&chunk_with_id("s", "agent_message_chunk", "Do", "m-4"));
    hub.agent_line(&chunk_with_id("s", "agent_message_chunk", "ne.", "m-4"));
    // Updates without one (a plan, a tool call) or with an empty one change nothing; other
    // sessions keep their own.
    hub.agent_line(&line(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}})));
    hub.agent_line(&chunk_with_id("s", "agent_message_chunk", "", ""));
    hub.agent_line(&chunk_with_id("other", "agent_message_chunk", "x", "o-1"));
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}),
    ));
    assert_eq!(
        events(&out),
        vec![Event::PromptFinished {
            session_id: "s".into(),
            outcome: PromptOutcome::Stopped {
                stop_reason: json!("end_turn")
            },
            last_message_id: Some("m-4".into()),
        }]
    );
    assert_eq!(
        events(&out)[0].to_json("T"),
        json!({"event":"prompt_finished","sessionId":"s","stopReason":"end_turn","lastMessageId":"m-4","timestamp":"T"})
    );
    assert_eq!(hub.last_message_id("other").as_deref(), Some("o-1"));
}

#[test]
fn failed_prompt_reports_the_error() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    hub.client_line(1, &prompt(1, "s", "x"));
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"auth required"}}),
    ));
    assert_eq!(
        events(&out),
        vec![Event::PromptFinished {
            session_id: "s".into(),
            outcome: PromptOutcome::Failed {
                error: AgentError {
                    code: -32000,
                    message: "auth required".into()
                }
            },
            last_message_id: None,
        }]
    );
    let json = events(&out)[0].to_json("T");
    assert_eq!(
        json,
        json!({"event":"prompt_finished","sessionId":"s","error":{"code":-32000,"message":"auth required"},"timestamp":"T"})
    );
}

fn config(mode: &str, effort: &str) -> SessionConfigState {
    SessionConfigState {
        mode: Some(mode.into()),
        model: None,
        config_options: vec![crate::api::ConfigOptionValue {
            id: "effort".into(),
            value: effort.into(),
        }],
    }
}

#[test]
fn a_restore_sets_the_saved_configuration_back_before_answering() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":7,"method":"session/resume","params":{"sessionId":"s","cwd":"/","_meta":{SESSION_CONFIG_META: config("plan", "high")}}})));
    assert_eq!(
        to_agent(&out)[0]["params"].get("_meta"),
        None,
        "the saved configuration is agentctl's, not the agent's"
    );
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{
        "modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"D"},{"id":"plan","name":"P"}]},
        "configOptions":[{"id":"effort","name":"E","type":"select","currentValue":"low","options":[{"value":"low","name":"L"},{"value":"high","name":"H"}]}]}})));
    assert_eq!(
        events(&out),
        vec![
            Event::SessionCreated {
                session_id: "s".into(),
                method: "session/resume".into()
            },
            Event::SessionConfig {
                session_id: "s".into(),
                config: config("default", "low")
            },
        ]
    );
    assert_eq!(
        to_agent(&out),
        vec![
            json!({"jsonrpc":"2.0","id":3,"method":"session/set_mode","params":{"sessionId":"s","modeId":"plan"}}),
            json!({"jsonrpc":"2.0","id":4,"method":"session/set_config_option","params":{"sessionId":"s","configId":"effort","value":"high"}}),
        ]
    );
    assert!(
        matches!(out.last(), Some(Output::ToClient(1, answer)) if answer["id"] == 7),
        "the set-backs go out before the client's answer: {out:?}"
    );
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":3,"result":{}})));
    assert_eq!(
        out,
        vec![Output::Event(Event::SessionConfig {
            session_id: "s".into(),
            config: config("plan", "low")
        })],
        "a set-back's answer is agentctl's own: the client never sees it"
    );
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"no"}}),
    ));
    assert_eq!(
        out,
        vec![Output::Event(Event::ConfigSetBackFailed {
            session_id: "s".into(),
            method: "session/set_config_option".into(),
            error: AgentError {
                code: -32602,
                message: "no".into()
            }
        })]
    );
    // Changes the agent reports later are followed too.
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"current_mode_update","currentModeId":"default"}}})));
    assert_eq!(
        events(&out),
        vec![Event::SessionConfig {
            session_id: "s".into(),
            config: config("default", "low")
        }]
    );
}

/// A new session records its configuration, and gets what its `session/new` asks for
/// (spec.sessionConfig) where the agent offers it, before the client gets the answer; without
/// such a request nothing is set.
#[test]
fn a_new_session_records_its_configuration_and_gets_what_it_asks_for() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}})));
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"m",
        "modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"D"},{"id":"plan","name":"P"}]}}})));
    assert!(to_agent(&out).is_empty(), "nothing asked, nothing set");
    hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/","mcpServers":[],"_meta":{SESSION_CONFIG_META: config("plan", "high")}}})));
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":3,"result":{"sessionId":"n",
        "modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"D"},{"id":"plan","name":"P"}]}}})));
    let sent = to_agent(&out);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["method"], "session/set_mode");
    assert_eq!(
        sent[0]["params"],
        json!({"sessionId": "n", "modeId": "plan"})
    );
    assert!(
        out.iter().position(|o| matches!(o, Output::ToAgent(_)))
            < out.iter().position(|o| matches!(o, Output::ToClient(..))),
        "set before the client gets the answer: {out:?}"
    );
    assert!(events(&out).contains(&Event::SessionConfig {
        session_id: "n".into(),
        config: SessionConfigState {
            mode: Some("default".into()),
            ..SessionConfigState::default()
        }
    }));
}

#[test]
fn load_replay_is_not_recorded_again() {
    let mut hub = ready_hub(HubConfig {
        session_cwd: None,
        session_name: Some("ts-1".into()),
        history_injection: false,
        worktree: None,
        ..HubConfig::default()
    });
    hub.attach(1, false).ok();
    hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"s","cwd":"/","mcpServers":[]}})));
    let out = hub.agent_line(&chunk("s", "replayed answer"));
    assert_eq!(
        to_client(&out).len(),
        1,
        "the replay still reaches the client"
    );
    hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{}})));
    hub.client_line(1, &prompt(2, "s", "new question"));
    hub.agent_line(&chunk("s", "new answer"));
    let out = hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}),
    ));
    assert_eq!(
        records(&out),
        vec![(
            "ts-1".into(),
            HistoryEntry::AgentMessage {
                text: "new answer".into(),
                timestamp: None
            }
        )]
    );
}

/// The stale-cache double restore, as agentctl sees it: the operator runs the same launch's
/// restore again (new connection, same ids), and the task prompt again.
#[test]
fn a_launch_reaches_the_agent_once_however_often_the_operator_repeats_it() {
    let mut hub = ready_hub(HubConfig::default());
    let meta = json!({"kandev.dev/launch": "r1", "trace": "t"});
    let resume = |id: u64| {
        line(
            json!({"jsonrpc":"2.0","id":id,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w","_meta":meta}}),
        )
    };
    hub.attach(1, false).expect("attach");
    let first = hub.client_line(1, &resume(2));
    let sent = to_agent(&first);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0]["params"]["_meta"],
        json!({"trace": "t"}),
        "the launch tag stays with agentctl"
    );
    let agent_id = sent[0]["id"].clone();

    // The first client is gone before the answer; the repeat takes the answer over.
    hub.client_closed(1);
    hub.attach(2, false).expect("attach");
    assert_eq!(
        hub.client_line(2, &resume(2)),
        vec![],
        "waits, nothing to the agent"
    );
    let answered = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":agent_id,"result":{}})));
    assert_eq!(
        to_client(&answered),
        vec![(2, json!({"jsonrpc":"2.0","id":2,"result":{}}))]
    );
    assert_eq!(events(&answered).len(), 1, "one session_created");

    // Answered already: a third try gets the same answer at once.
    hub.client_closed(2);
    hub.attach(3, false).expect("attach");
    let third = hub.client_line(3, &resume(7));
    assert_eq!(to_agent(&third), Vec::<Value>::new());
    assert_eq!(
        to_client(&third),
        vec![(3, json!({"jsonrpc":"2.0","id":7,"result":{}}))]
    );
    assert_eq!(events(&third), vec![]);

    // The task prompt of the launch goes once; an untagged prompt (a user's) always goes.
    let prompt = |id: u64, meta: Value| {
        line(
            json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"do it"}],"_meta":meta}}),
        )
    };
    assert_eq!(
        to_agent(&hub.client_line(3, &prompt(8, meta.clone()))).len(),
        1
    );
    assert_eq!(
        to_agent(&hub.client_line(3, &prompt(9, meta.clone()))).len(),
        0
    );
    assert_eq!(
        to_agent(&hub.client_line(3, &prompt(10, json!({})))).len(),
        1
    );

    // Another launch, another method or another session is a new request.
    let other = line(
        json!({"jsonrpc":"2.0","id":11,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w","_meta":{"kandev.dev/launch":"r2"}}}),
    );
    assert_eq!(to_agent(&hub.client_line(3, &other)).len(), 1);
    let load = line(
        json!({"jsonrpc":"2.0","id":12,"method":"session/load","params":{"sessionId":"s1","cwd":"/w","_meta":{"kandev.dev/launch":"r1"}}}),
    );
    let sent = to_agent(&hub.client_line(3, &load));
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0]["params"].get("_meta").is_none(),
        "empty _meta removed"
    );
}

#[test]
fn without_an_exporter_the_operators_trace_context_is_dropped() {
    let request = line(
        json!({"jsonrpc":"2.0","id":2,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w",
            "_meta":{"kandev.dev/launch":"r1","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}),
    );
    // Nothing replaces it. With an exporter: tests/trace_context.rs.
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).expect("attach");
    let sent = to_agent(&hub.client_line(1, &request));
    assert!(sent[0]["params"].get("_meta").is_none(), "{sent:?}");
}

#[test]
fn a_failed_setup_is_answered_the_same_way_again() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).expect("attach");
    let resume = line(
        json!({"jsonrpc":"2.0","id":2,"method":"session/resume","params":{"sessionId":"gone","cwd":"/w","_meta":{"kandev.dev/launch":"r1"}}}),
    );
    let agent_id = to_agent(&hub.client_line(1, &resume))[0]["id"].clone();
    let error = json!({"code":-32002,"message":"Resource not found"});
    hub.agent_line(&line(json!({"jsonrpc":"2.0","id":agent_id,"error":error})));
    let again = hub.client_line(1, &resume);
    assert_eq!(to_agent(&again), Vec::<Value>::new());
    assert_eq!(to_client(&again)[0].1["error"], error);
}

fn new_session(hub: &mut Hub, conn: ConnId, client_id: u64, session: &str) {
    let out = hub.client_line(conn, &line(json!({"jsonrpc":"2.0","id":client_id,"method":"session/new","params":{"cwd":"/","mcpServers":[]}})));
    let agent_id = to_agent(&out)[0]["id"].clone();
    hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":agent_id,"result":{"sessionId":session}}),
    ));
}

fn is_injection(out: &[Output]) -> bool {
    out.iter()
        .any(|o| matches!(o, Output::InjectHistoryThenSend { .. }))
}

#[test]
fn history_injection_only_for_the_first_prompt_after_a_fresh_new() {
    let config = HubConfig {
        session_cwd: None,
        session_name: Some("ts-1".into()),
        history_injection: true,
        worktree: None,
        ..HubConfig::default()
    };
    let mut hub = ready_hub(config.clone());
    hub.attach(1, false).ok();
    new_session(&mut hub, 1, 1, "s");
    let out = hub.client_line(1, &prompt(2, "s", "continue"));
    assert!(is_injection(&out));
    // The injection read comes before the current prompt is recorded.
    let inject_at = out
        .iter()
        .position(|o| matches!(o, Output::InjectHistoryThenSend { .. }));
    let record_at = out.iter().position(|o| matches!(o, Output::Record { .. }));
    assert!(inject_at < record_at);
    assert!(!is_injection(&hub.client_line(1, &prompt(3, "s", "more"))));
    // After a resume there is nothing to inject.
    new_session(&mut hub, 1, 4, "s2");
    hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":5,"method":"session/resume","params":{"sessionId":"s2","cwd":"/"}})));
    let resume_agent_id = hub.next_agent_id;
    hub.agent_line(&line(
        json!({"jsonrpc":"2.0","id":resume_agent_id,"result":{}}),
    ));
    assert!(!is_injection(&hub.client_line(1, &prompt(6, "s2", "go"))));
    // Profiles without injection never inject.
    let mut plain = ready_hub(HubConfig {
        session_cwd: None,
        history_injection: false,
        ..config
    });
    plain.attach(1, false).ok();
    new_session(&mut plain, 1, 1, "s");
    assert!(!is_injection(&plain.client_line(1, &prompt(2, "s", "x"))));
}

#[test]
fn inject_history_wraps_text_once_and_keeps_other_blocks() {
    let history = [HistoryEntry::UserMessage {
        text: "earlier".into(),
        timestamp: None,
    }];
    let mut message = json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s",
        "prompt":[{"type":"text","text":"next"},{"type":"image","data":"AA==","mimeType":"image/png"}]}});
    assert!(inject_history(&mut message, &history));
    let blocks = message["params"]["prompt"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(blocks.len(), 2);
    let text = blocks[0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with(crate::history::RESUME_CONTEXT_HEADER));
    assert!(text.contains("[USER]: earlier"));
    assert!(text.contains("=== CURRENT REQUEST ===\nnext\n"));
    assert_eq!(blocks[1]["type"], "image");
    // Never twice.
    let before = message.clone();
    assert!(!inject_history(&mut message, &history));
    assert_eq!(message, before);
    // No history: untouched.
    let mut plain = json!({"params":{"prompt":[{"type":"text","text":"x"}]}});
    assert!(!inject_history(&mut plain, &[]));
}

#[test]
fn agent_exit_fails_open_requests_and_closes_the_client() {
    let mut hub = ready_hub(HubConfig::default());
    hub.attach(1, false).ok();
    hub.client_line(1, &prompt(42, "s", "x"));
    hub.agent_line(&chunk("s", "partial"));
    let out = hub.agent_exited(Some(3), None);
    assert_eq!(
        events(&out),
        vec![Event::AgentExited {
            code: Some(3),
            signal: None
        }]
    );
    assert_eq!(records(&out).len(), 1, "partial turn text is kept");
    let replies = to_client(&out);
    assert_eq!(replies[0].1["id"], 42);
    assert_eq!(replies[0].1["error"]["code"], code::INTERNAL_ERROR);
    assert_eq!(out.last(), Some(&Output::CloseClient(1)));
    assert_eq!(
        Event::AgentExited {
            code: None,
            signal: Some(9)
        }
        .to_json("T"),
        json!({"event":"agent_exited","code":null,"signal":9,"timestamp":"T"})
    );
}

#[test]
fn a_cut_off_agent_fails_the_open_requests_with_the_limit() {
    let mut hub = ready_hub(HubConfig::default());
    assert_eq!(hub.attach(3, false), Ok(vec![]));
    assert!(!hub.replaying());
    hub.client_line(
        3,
        &line(
            json!({"jsonrpc":"2.0","id":"load-1","method":"session/load",
            "params":{"sessionId":"s1","cwd":"/w","mcpServers":[]}}),
        ),
    );
    assert!(hub.replaying(), "a load is open");
    let limit = AgentLimit::Line { limit: 1024 };
    let out = hub.agent_cut_off(limit);
    assert_eq!(
        to_client(&out),
        vec![(
            3,
            json!({"jsonrpc":"2.0","id":"load-1","error":{"code":code::AGENT_PROTOCOL_LIMIT,
                "message":"agentctl cut off the agent: agent exceeded the line limit (1024 bytes)"}})
        )]
    );
    assert!(!hub.replaying());
    // The exit that follows has nothing left to fail.
    let exited = hub.agent_exited(None, Some(9));
    assert_eq!(to_client(&exited), vec![]);
    assert!(exited.contains(&Output::CloseClient(3)));
}

#[test]
fn recorded_turn_text_is_bounded_utf8_safe() {
    #[rustfmt::skip]
    let rows = [
        // (already kept, new text, limit, kept after)
        ("", "abc", 8, "abc".to_owned()),
        ("abc", "defgh", 8, "abcdefgh".to_owned()),
        ("abc", "defghij", 8, format!("abcdefgh{TRUNCATION_MARKER}")),
        // A multi-byte char that does not fit is dropped whole.
        ("abcdefg", "é", 8, format!("abcdefg{TRUNCATION_MARKER}")),
    ];
    for (kept, text, limit, expected) in rows {
        let mut buf = kept.to_owned();
        push_bounded(&mut buf, text, limit);
        assert_eq!(buf, expected, "{kept:?} + {text:?}");
        // Once truncated, nothing more is kept.
        let before = buf.clone();
        push_bounded(&mut buf, "more", limit);
        if before.ends_with(TRUNCATION_MARKER) {
            assert_eq!(buf, before);
        }
    }
}

#[test]
fn agent_requests_beyond_the_open_bound_are_answered_here() {
    let mut hub = ready_hub(HubConfig::default());
    assert_eq!(hub.attach(3, false), Ok(vec![]));
    for n in 0..AGENT_REQUESTS_OPEN {
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":format!("a-{n}"),
            "method":"fs/read_text_file","params":{"sessionId":"s","path":"/x"}})));
        assert_eq!(to_client(&out).len(), 1, "forwarded to the client");
    }
    let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":"one-too-many",
        "method":"fs/read_text_file","params":{"sessionId":"s","path":"/x"}})));
    assert_eq!(to_client(&out), vec![]);
    let answered = to_agent(&out);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0]["id"], "one-too-many");
    assert_eq!(answered[0]["error"]["code"], code::METHOD_NOT_FOUND);
}

/// A permission request of `kind` from the agent, offering the four usual options.
fn ask(id: &str, kind: &str, title: &str) -> String {
    line(
        json!({"jsonrpc":"2.0","id":id,"method":"session/request_permission","params":{
        "sessionId":"s",
        "toolCall":{"toolCallId":format!("tc-{id}"),"title":title,"kind":kind,"rawInput":{"command":title}},
        "options":[
            {"optionId":"yes","name":"Allow","kind":"allow_once"},
            {"optionId":"always","name":"Always","kind":"allow_always"},
            {"optionId":"no","name":"Reject","kind":"reject_once"}
        ]}}),
    )
}

fn selected(id: &str, option: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"result":{"outcome":{"outcome":"selected","optionId":option}}})
}

fn resolutions(out: &[Output]) -> Vec<(String, PermissionOutcome)> {
    events(out)
        .into_iter()
        .filter_map(|e| match e {
            Event::PermissionResolved {
                request_id,
                outcome,
                ..
            } => Some((request_id, outcome)),
            _ => None,
        })
        .collect()
}

fn policy_hub() -> Hub {
    let mut hub = ready_hub(HubConfig {
        session_name: Some("ts-1".into()),
        ..HubConfig::default()
    });
    hub.set_clock(|| "T".into());
    hub
}

/// With no client, the default policy allows an edit at once (its allow-once option), and holds
/// a command for a person: journaled, in the snapshot, with its timer; the agent counts as busy.
#[test]
fn the_policy_allows_by_rule_and_holds_what_it_asks() {
    let mut hub = policy_hub();
    let out = hub.agent_line(&ask("a1", "edit", "Write src/lib.rs"));
    assert_eq!(to_agent(&out), vec![selected("a1", "yes")]);
    assert_eq!(
        resolutions(&out),
        vec![("p1".to_string(), PermissionOutcome::AllowedByPolicy)]
    );
    let history: Vec<&HistoryEntry> = out
        .iter()
        .filter_map(|o| match o {
            Output::Record {
                history_session,
                entry,
            } if history_session == "ts-1" => Some(entry),
            _ => None,
        })
        .collect();
    assert!(
        matches!(history[..], [HistoryEntry::ToolResult { name, output, .. }] if name == "permission" && output.contains("allowedByPolicy")),
        "{history:?}"
    );
    assert!(hub.idle());
    let out = hub.agent_line(&ask("a2", "execute", "cargo test"));
    assert_eq!(to_agent(&out), Vec::<Value>::new(), "held, not answered");
    let requested = events(&out);
    let [Event::PermissionRequested { request, .. }] = &requested[..] else {
        panic!("{requested:?}");
    };
    assert_eq!(
        (
            request.id.as_str(),
            request.tool_kind,
            request.title.as_str()
        ),
        ("p2", ToolKind::Execute, "cargo test")
    );
    assert_eq!(request.requested_at, "T");
    assert_eq!(request.summary, r#"{"command":"cargo test"}"#);
    assert_eq!(
        request
            .options
            .iter()
            .map(|o| o.kind.as_str())
            .collect::<Vec<_>>(),
        ["allow_once", "allow_always", "reject_once"]
    );
    assert!(out.contains(&Output::PermissionTimer {
        request_id: "p2".into(),
        after: std::time::Duration::from_secs(900)
    }));
    assert!(
        !hub.idle(),
        "a request that waits keeps the agent from being suspended"
    );
    assert_eq!(
        hub.snapshot().to_json("T")["pendingPermissions"][0]["id"],
        "p2"
    );
    // Answered: the option of that kind goes to the agent, once.
    let (result, out) = hub.answer_permission("p2", "allow_once");
    assert_eq!(result, Ok(PermissionOutcome::Approved));
    assert_eq!(to_agent(&out), vec![selected("a2", "yes")]);
    assert_eq!(
        resolutions(&out),
        vec![("p2".to_string(), PermissionOutcome::Approved)]
    );
    let (again, out) = hub.answer_permission("p2", "allow_once");
    assert!(
        matches!(again, Err(AnswerRefusal::NotPending { .. })),
        "{again:?}"
    );
    assert_eq!(out, vec![]);
    assert!(hub.idle());
}

/// Two requests wait; each answer reaches its own; an option the request does not offer is
/// refused and the request keeps waiting; the timeout rejects what is left, once.
#[test]
fn answers_timeouts_and_refusals() {
    let mut hub = policy_hub();
    hub.agent_line(&ask("a1", "execute", "make"));
    hub.agent_line(&ask("a2", "fetch", "curl example.com"));
    let (refused, out) = hub.answer_permission("p1", "reject_always");
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err("permission request p1 offers no reject_always option (it offers: allow_once, allow_always, reject_once)".into())
    );
    assert_eq!(out, vec![]);
    let (_, out) = hub.answer_permission("p2", "reject_once");
    assert_eq!(to_agent(&out), vec![selected("a2", "no")]);
    assert_eq!(
        resolutions(&out),
        vec![("p2".to_string(), PermissionOutcome::Rejected)]
    );
    let (_, out) = hub.answer_permission("p1", "allow_always");
    assert_eq!(to_agent(&out), vec![selected("a1", "always")]);
    hub.agent_line(&ask("a3", "execute", "rm -rf target"));
    let out = hub.permission_timed_out("p3");
    assert_eq!(to_agent(&out), vec![selected("a3", "no")]);
    assert_eq!(
        resolutions(&out),
        vec![("p3".to_string(), PermissionOutcome::TimedOut)]
    );
    assert_eq!(hub.permission_timed_out("p3"), vec![], "rejected once");
    assert_eq!(
        hub.permission_timed_out("p1"),
        vec![],
        "an answered request has no timeout"
    );
}

/// More than the bound wait: the oldest is rejected; the agent exiting takes the rest with it.
#[test]
fn held_requests_are_bounded_and_go_with_the_agent() {
    let mut hub = policy_hub();
    for i in 0..crate::api::PENDING_PERMISSIONS_MAX {
        hub.agent_line(&ask(&format!("a{i}"), "execute", "x"));
    }
    let out = hub.agent_line(&ask("late", "execute", "x"));
    assert_eq!(to_agent(&out), vec![selected("a0", "no")]);
    assert_eq!(
        resolutions(&out),
        vec![("p1".to_string(), PermissionOutcome::Overflow)]
    );
    assert_eq!(
        hub.held_permissions().len(),
        crate::api::PENDING_PERMISSIONS_MAX
    );
    let out = hub.agent_exited(Some(1), None);
    let gone = resolutions(&out);
    assert_eq!(gone.len(), crate::api::PENDING_PERMISSIONS_MAX);
    assert!(gone.iter().all(|(_, o)| *o == PermissionOutcome::Gone));
    assert_eq!(to_agent(&out), Vec::<Value>::new(), "nobody to answer");
    assert!(hub.held_permissions().is_empty());
}

/// A client that does not decide (the operator's launch, a prompt without a terminal) leaves
/// requests to the policy; one that decides gets them, and a request it leaves open when it goes
/// goes to the policy.
#[test]
fn only_a_client_that_decides_gets_permission_requests() {
    let mut hub = policy_hub();
    hub.attach(1, false).ok();
    let out = hub.agent_line(&ask("a1", "edit", "Write x"));
    assert_eq!(to_client(&out), vec![], "not for this client");
    assert_eq!(to_agent(&out), vec![selected("a1", "yes")]);
    hub.client_closed(1);
    hub.attach(2, false).ok();
    hub.client_decides_permissions(2);
    let out = hub.agent_line(&ask("a2", "execute", "make"));
    assert_eq!(to_client(&out).len(), 1);
    let out = hub.client_closed(2);
    assert_eq!(to_agent(&out), Vec::<Value>::new(), "held for a person now");
    assert_eq!(hub.held_permissions()[0].title, "make");
    // The next client does not decide unless it says so.
    hub.attach(3, false).ok();
    let out = hub.agent_line(&ask("a3", "execute", "make again"));
    assert_eq!(to_client(&out), vec![]);
    assert_eq!(hub.held_permissions().len(), 2);
}
