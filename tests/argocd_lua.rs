//! The Argo CD health check and actions (resume, complete, cancel, approve and deny the oldest
//! permission request) published in docs/gitops.md, run in Lua 5.1 (the
//! language of Argo CD's gopher-lua) against sample TaskSessions. The scripts are read from the
//! page itself, so what users copy is what is tested.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod support;

use mlua::{Lua, LuaSerdeExt, Value as LuaValue};
use serde_json::{Value, json};

const HEALTH_KEY: &str = "resource.customizations.health.kandev.dev_TaskSession";
const ACTIONS_KEY: &str = "resource.customizations.actions.kandev.dev_TaskSession";

/// The `data` of the argocd-cm snippet in docs/gitops.md.
fn argocd_cm_data() -> serde_yaml_ng::Mapping {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/gitops.md"))
        .expect("docs/gitops.md");
    let block = page
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .find(|b| b.contains(HEALTH_KEY))
        .expect("a yaml block with the health check in docs/gitops.md");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(block).expect("the block is YAML");
    doc.get("data")
        .and_then(|d| d.as_mapping())
        .cloned()
        .expect("the block has data")
}

fn script(data: &serde_yaml_ng::Mapping, key: &str) -> String {
    data.get(key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("{key} missing"))
        .to_string()
}

/// The actions document: discovery.lua and the action.lua of each definition.
fn actions() -> (String, Vec<(String, String)>) {
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&script(&argocd_cm_data(), ACTIONS_KEY)).expect("actions YAML");
    let discovery = doc["discovery.lua"]
        .as_str()
        .expect("discovery.lua")
        .to_string();
    let definitions = doc["definitions"]
        .as_sequence()
        .expect("definitions")
        .iter()
        .map(|d| {
            (
                d["name"].as_str().expect("name").to_string(),
                d["action.lua"].as_str().expect("action.lua").to_string(),
            )
        })
        .collect();
    (discovery, definitions)
}

/// The action.lua of the definition `name`.
fn action_code<'a>(definitions: &'a [(String, String)], name: &str) -> &'a str {
    definitions
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, code)| code.as_str())
        .unwrap_or_else(|| panic!("action {name}"))
}

/// Runs `code` with the global `obj` set to `object`, as Argo CD does, and returns its result.
fn run(code: &str, object: &Value) -> Value {
    let lua = Lua::new();
    let obj = lua.to_value(object).expect("object into Lua");
    lua.globals().set("obj", obj).expect("set obj");
    let out: LuaValue = lua
        .load(code)
        .eval()
        .unwrap_or_else(|e| panic!("Lua failed: {e}"));
    lua.from_value(out).expect("result from Lua")
}

fn session(status: Value) -> Value {
    let mut ts = json!({
        "apiVersion": "kandev.dev/v1alpha1",
        "kind": "TaskSession",
        "metadata": {"name": "fix-login", "namespace": "team-a", "generation": 1},
        "spec": {"taskId": "T", "agent": "claude-code", "workspace": {"template": {"size": "1Gi"}}}
    });
    if !status.is_null() {
        ts["status"] = status;
    }
    ts
}

#[test]
fn health_check_maps_every_state() {
    let health = script(&argocd_cm_data(), HEALTH_KEY);
    let needs_msg = json!([{"type": "NeedsResume", "status": "True", "reason": "ResumeFailed",
                            "message": "session/resume timed out; token kept"}]);
    // (status, expected health, substring of the message)
    let cases = [
        (Value::Null, "Progressing", "Waiting for the operator"),
        (
            json!({"state": "WAITING_FOR_INPUT", "observedGeneration": 0}),
            "Progressing",
            "latest spec",
        ),
        (json!({"state": "CREATED"}), "Progressing", "starting"),
        (json!({"state": "STARTING"}), "Progressing", "starting"),
        (json!({"state": "RUNNING"}), "Healthy", "working"),
        (
            json!({"state": "WAITING_FOR_INPUT", "observedGeneration": 1}),
            "Healthy",
            "waiting for input",
        ),
        (
            json!({"state": "WAITING_FOR_INPUT", "needsResume": true,
                   "resumeReason": "agent_not_running"}),
            "Suspended",
            "agent_not_running",
        ),
        (
            json!({"state": "WAITING_FOR_INPUT", "needsResume": true,
                   "resumeReason": "agent_not_running", "conditions": needs_msg}),
            "Suspended",
            "token kept",
        ),
        (
            json!({"state": "FAILED", "errorMessage": "workspace PVC missing"}),
            "Degraded",
            "workspace PVC missing",
        ),
        (
            json!({"state": "FAILED", "isResumable": true,
                   "resumeReason": "failed_session_resumable"}),
            "Degraded",
            "resumable",
        ),
        (json!({"state": "COMPLETED"}), "Healthy", "completed"),
        (json!({"state": "CANCELLED"}), "Healthy", "cancelled"),
        // A change that waits for a restart is named, the session is still healthy.
        (
            json!({"state": "WAITING_FOR_INPUT", "conditions": [{"type": "SpecApplied",
                   "status": "False", "reason": "PendingRestart",
                   "message": "spec.image changed after agent pod p started"}]}),
            "Healthy",
            "waiting for input; spec.image changed",
        ),
    ];
    for (status, want, message) in cases {
        let out = run(&health, &session(status.clone()));
        assert_eq!(out["status"], want, "{status}: {out}");
        let got = out["message"].as_str().unwrap_or_default();
        assert!(got.contains(message), "{status}: message {got:?}");
    }
}

/// The health check gives every status the operator wrote in an e2e run (the record of
/// tests/e2e_gitops.rs) the verdict of docs/gitops.md's table.
#[test]
fn recorded_statuses_get_the_tables_verdict() {
    let health = script(&argocd_cm_data(), HEALTH_KEY);
    let record = support::gitops::recorded();
    let table = support::gitops::verdicts();
    assert_eq!(
        record.len(),
        table.len(),
        "one table row per recorded status"
    );
    for ((case, object), row) in record.iter().zip(&table) {
        assert_eq!(case, &row.case, "the table follows the record's order");
        let out = run(&health, object);
        assert_eq!(out["status"], row.argo.as_str(), "{case}: {out}");
        assert!(
            !out["message"].as_str().unwrap_or_default().is_empty(),
            "{case}: {out}"
        );
    }
}

#[test]
fn each_action_is_offered_only_when_it_applies() {
    let (discovery, _) = actions();
    let lost = json!({"state": "WAITING_FOR_INPUT", "needsResume": true, "isResumable": true});
    let mut ending = session(lost.clone());
    ending["spec"]["end"] = json!("Completed");
    // restart: only while the agent waits for input, not ending.
    for (object, disabled) in [
        (session(json!({"state": "WAITING_FOR_INPUT"})), false),
        (session(json!({"state": "RUNNING"})), true),
        (session(lost.clone()), false),
        (session(json!({"state": "STARTING"})), true),
        (ending.clone(), false),
    ] {
        let ended = object["spec"]["end"].is_string();
        let out = run(&discovery, &object);
        assert_eq!(
            out["restart"]["disabled"],
            disabled || ended,
            "restart for {}",
            object["status"]
        );
    }
    // (session, resume and resume-fresh disabled, complete and cancel disabled)
    let cases = [
        (session(Value::Null), true, false),
        (session(json!({"state": "WAITING_FOR_INPUT"})), true, false),
        (session(lost.clone()), false, false),
        // A FAILED session that offers a resume.
        (
            session(json!({"state": "FAILED", "isResumable": true})),
            false,
            false,
        ),
        // needsResume without isResumable offers nothing to resume.
        (
            session(json!({"state": "WAITING_FOR_INPUT", "needsResume": true})),
            true,
            false,
        ),
        // Ending or ended: nothing to resume, nothing more to end.
        (ending, true, true),
        (session(json!({"state": "COMPLETED"})), true, true),
        (
            session(json!({"state": "CANCELLED", "isResumable": true})),
            true,
            true,
        ),
    ];
    for (object, resume_disabled, end_disabled) in cases {
        let out = run(&discovery, &object);
        let what = json!({"spec": object["spec"], "status": object["status"]});
        for action in ["resume", "resume-fresh"] {
            assert_eq!(
                out[action]["disabled"], resume_disabled,
                "{action} for {what}"
            );
        }
        for action in ["complete", "cancel"] {
            assert_eq!(out[action]["disabled"], end_disabled, "{action} for {what}");
        }
    }
}

#[test]
fn resume_actions_set_a_new_token_and_ask_for_fresh_per_request() {
    let (_, definitions) = actions();
    let names: Vec<&str> = definitions.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "resume",
            "resume-fresh",
            "restart",
            "complete",
            "cancel",
            "approve-oldest",
            "deny-oldest"
        ]
    );
    let definitions: Vec<_> = definitions
        .into_iter()
        .filter(|(name, _)| name.starts_with("resume") || name == "restart")
        .collect();
    let lost = json!({"state": "WAITING_FOR_INPUT", "needsResume": true});

    let mut with_annotations = session(lost.clone());
    with_annotations["metadata"]["annotations"] = json!({
        "team": "a",
        "kandev.dev/resume-requested-at": "old",
        "kandev.dev/resume-fresh": "old",
        "kandev.dev/restart": "old"
    });
    for object in [session(lost), with_annotations] {
        for (name, code) in &definitions {
            let out = run(code, &object);
            let annotations = &out["metadata"]["annotations"];
            let token = annotations["kandev.dev/resume-requested-at"]
                .as_str()
                .expect("token set");
            assert!(token.starts_with("argocd-") && token != "old", "{token}");
            let fresh = annotations["kandev.dev/resume-fresh"].as_str();
            if name == "resume-fresh" {
                assert_eq!(fresh, Some(token), "fresh start asked for this token");
            } else {
                assert_ne!(fresh, Some(token), "a plain resume is not fresh");
            }
            let restart = annotations["kandev.dev/restart"].as_str();
            assert_eq!(
                restart == Some(token),
                name == "restart",
                "{name}: {annotations}"
            );
            if object["metadata"]["annotations"]["team"] == "a" {
                assert_eq!(annotations["team"], "a", "other annotations kept");
            }
            assert_eq!(out["spec"], object["spec"], "spec untouched");
        }
    }
}

#[test]
fn end_actions_set_spec_end_and_nothing_else() {
    let (_, definitions) = actions();
    let waiting = session(json!({"state": "WAITING_FOR_INPUT"}));
    for (name, end) in [("complete", "Completed"), ("cancel", "Cancelled")] {
        let code = action_code(&definitions, name);
        let out = run(code, &waiting);
        let mut expected = waiting.clone();
        expected["spec"]["end"] = json!(end);
        assert_eq!(out, expected, "{name}");
    }
}

/// The approval actions are offered while a request waits, answer the oldest one once (allow or
/// reject once), and change nothing else.
#[test]
fn approval_actions_answer_the_oldest_request() {
    let (discovery, definitions) = actions();
    let waiting = session(json!({"state": "RUNNING", "pendingPermissions": [
        {"id": "p2", "toolKind": "execute", "title": "make", "options": [], "requestedAt": "T"},
        {"id": "p5", "toolKind": "fetch", "title": "curl", "options": [], "requestedAt": "T"}
    ]}));
    for (object, disabled) in [
        (session(json!({"state": "RUNNING"})), true),
        (
            session(json!({"state": "RUNNING", "pendingPermissions": []})),
            true,
        ),
        (waiting.clone(), false),
    ] {
        let out = run(&discovery, &object);
        for action in ["approve-oldest", "deny-oldest"] {
            assert_eq!(out[action]["disabled"], disabled, "{action} for {object}");
        }
    }
    for (name, answer) in [
        ("approve-oldest", "p2=allow_once"),
        ("deny-oldest", "p2=reject_once"),
    ] {
        let code = action_code(&definitions, name);
        let out = run(code, &waiting);
        let mut expected = waiting.clone();
        expected["metadata"]["annotations"] = json!({"kandev.dev/permission-answer": answer});
        assert_eq!(out, expected, "{name}");
        let idle = session(json!({"state": "WAITING_FOR_INPUT"}));
        assert_eq!(
            run(code, &idle),
            idle,
            "{name} with nothing waiting changes nothing"
        );
    }
}
