//! End-to-end: the statuses GitOps tools read. One test drives sessions into every case of the
//! verdict table of docs/gitops.md on the real API server and checks that the operator still
//! writes what `tests/data/gitops/statuses.json` recorded (`KANDEV_RECORD_STATUSES=1` records
//! it anew); another runs the real kstatus library (`kandev-kstatus`, e2e/kstatus, built by
//! e2e/bin.sh from sigs.k8s.io/cli-utils) on the record. `tests/argocd_lua.rs` runs the Argo CD
//! health check on the same record. The Flux example of docs/gitops.md is applied with Flux's own
//! CRDs.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e_support::operator::Operator;
use e2e_support::sessions::{Sessions, has_condition, status_where, template_workspace};
use e2e_support::support::gitops::{RECORD, kstatus_of_argo, recorded, verdicts};
use e2e_support::support::process::our_bin;
use e2e_support::{unique, wait_for};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kandev_operator::api::conditions;
use kandev_operator::api::{IdleSpec, SessionState, TaskSession};
use kube::ResourceExt;
use serde::Deserialize;
use serde_json::{Value, json};

/// A session as a GitOps tool reads it, with what changes from run to run made fixed: its name
/// and namespace, times, and permission request ids.
fn normalized(case: &str, ts: &TaskSession) -> Value {
    let name = ts.name_any();
    let namespace = ts.namespace().unwrap_or_default();
    let mut text = serde_json::to_string(&json!({
        "apiVersion": "kandev.dev/v1alpha1",
        "kind": "TaskSession",
        "metadata": {"name": name, "namespace": namespace, "generation": ts.metadata.generation},
        "spec": ts.spec,
        "status": ts.status,
    }))
    .expect("JSON");
    let ids: Vec<String> = ts
        .status
        .iter()
        .flat_map(|s| s.pending_permissions.iter().map(|p| p.id.clone()))
        .collect();
    for (n, id) in ids.iter().enumerate() {
        text = text.replace(id, &format!("request-{}", n + 1));
    }
    text = text
        .replace(&name, "fix-login")
        .replace(&namespace, "team-a");
    let mut object: Value = serde_json::from_str(&text).expect("JSON");
    // get_mut, not indexing, which would add a missing field as null.
    for (list, time) in [
        ("conditions", "lastTransitionTime"),
        ("pendingPermissions", "requestedAt"),
    ] {
        let entries = object
            .get_mut("status")
            .and_then(|s| s.get_mut(list))
            .and_then(Value::as_array_mut);
        for entry in entries.into_iter().flatten() {
            entry[time] = json!("2026-01-01T00:00:00Z");
        }
    }
    object["metadata"]["labels"] = json!({"case": case});
    object
}

/// What a health check reads, and what the record is compared on: the state, the resume
/// fields, each condition's type, status and reason, and how many requests wait.
fn shape(object: &Value) -> Value {
    let status = &object["status"];
    let mut conditions: Vec<Value> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!([c["type"], c["status"], c["reason"]]))
        .collect();
    conditions.sort_by_key(|c| c.to_string());
    json!({
        "state": status["state"],
        "taskState": status["taskState"],
        "needsResume": status["needsResume"],
        "isResumable": status["isResumable"],
        "resumeReason": status["resumeReason"],
        "conditions": conditions,
        "pendingPermissions": status["pendingPermissions"].as_array().map_or(0, Vec::len),
    })
}

/// Waits until `name`'s status passes `test` (`what` names it), and returns the session.
async fn settled(
    sessions: &Sessions,
    name: &str,
    what: &str,
    test: impl Fn(&kandev_operator::api::TaskSessionStatus) -> bool,
) -> TaskSession {
    sessions
        .wait_within(name, what, Duration::from_secs(90), status_where(test))
        .await
}

fn no_ready(s: &kandev_operator::api::TaskSessionStatus) -> bool {
    s.conditions.iter().all(|c| c.type_ != conditions::READY)
}

/// Every case of the verdict table, as the operator writes it now, against the record.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn the_recorded_statuses_are_what_the_operator_writes() {
    let sessions = Sessions::fresh("gitops").await;
    let _operator = Operator::builder()
        .log_prefix("gitops-operator")
        .profiles_file("plugin")
        .args(&["--allowed-image-prefix", "kandev.dev/"])
        .start();
    let body = async {
        let mut got: Vec<(String, Value)> = Vec::new();
        let mut keep = |case: &str, ts: &TaskSession| got.push((case.into(), normalized(case, ts)));

        let unknown = unique("unknown");
        sessions.create(&unknown, "not-installed").await;
        let ts = settled(&sessions, &unknown, "UnknownProfile", |s| {
            has_condition(s, conditions::STALLED, "True", "UnknownProfile")
        })
        .await;
        keep("unknown-profile", &ts);

        let waiting = unique("waiting");
        sessions
            .create_with_task(&waiting, "plugin-echo", None)
            .await;
        let ts = settled(&sessions, &waiting, "waiting for input", |s| {
            s.state == SessionState::WaitingForInput
                && has_condition(s, conditions::READY, "True", "WaitingForInput")
        })
        .await;
        keep("waiting", &ts);

        // A changed image waits for the agent's next launch.
        let pending = unique("pending");
        sessions
            .create_with_task(&pending, "plugin-echo", None)
            .await;
        sessions.wait_waiting_for_input(&pending).await;
        sessions
            .merge(
                &pending,
                json!({"spec": {"image": "kandev.dev/agentctl:next"}}),
            )
            .await
            .expect("change the image");
        let ts = settled(&sessions, &pending, "PendingRestart", |s| {
            s.state == SessionState::WaitingForInput
                && has_condition(s, conditions::SPEC_APPLIED, "False", "PendingRestart")
        })
        .await;
        keep("pending-restart", &ts);

        let asks = unique("asks");
        sessions
            .create_with_task(&asks, "plugin-asks", Some("Fix the build."))
            .await;
        let ts = settled(&sessions, &asks, "AwaitingApproval", |s| {
            has_condition(
                s,
                conditions::AWAITING_APPROVAL,
                "True",
                "PermissionRequested",
            )
        })
        .await;
        keep("awaiting-approval", &ts);

        let lost = unique("lost");
        sessions.create_with_task(&lost, "plugin-echo", None).await;
        sessions.wait_waiting_for_input(&lost).await;
        sessions.delete_pod(&sessions.the_pod(&lost).await).await;
        let ts = settled(&sessions, &lost, "lost", |s| {
            s.needs_resume
                && conditions::is_true(&s.conditions, conditions::NEEDS_RESUME)
                && no_ready(s)
        })
        .await;
        keep("lost", &ts);

        let idle = unique("idle");
        let mut ts =
            sessions.new_session_with_task(&idle, "plugin-echo", None, template_workspace());
        ts.spec.idle = Some(IdleSpec {
            suspend_after: Some("10s".into()),
        });
        sessions.create_session(&ts).await;
        let ts = settled(&sessions, &idle, "Suspended", |s| {
            s.needs_resume && has_condition(s, conditions::SUSPENDED, "True", "Idle") && no_ready(s)
        })
        .await;
        keep("suspended", &ts);

        // An image outside the operator's allow-list: refused before any pod exists.
        let stalled = unique("stalled");
        let mut ts =
            sessions.new_session_with_task(&stalled, "plugin-echo", None, template_workspace());
        ts.spec.image = Some("elsewhere.example/agent:1".into());
        sessions.create_session(&ts).await;
        let ts = settled(&sessions, &stalled, "InvalidSpec", |s| {
            has_condition(s, conditions::STALLED, "True", "InvalidSpec")
        })
        .await;
        keep("stalled", &ts);

        // A resume that finds the template's PVC gone.
        let failed = unique("failed");
        sessions
            .create_with_task(&failed, "plugin-echo", None)
            .await;
        sessions.wait_waiting_for_input(&failed).await;
        sessions.delete_pod(&sessions.the_pod(&failed).await).await;
        sessions.wait_needs_resume(&failed).await;
        let claims = sessions.claims();
        let claim = format!("{failed}-workspace");
        claims
            .delete(&claim, &Default::default())
            .await
            .expect("delete the workspace PVC");
        wait_for(
            &claims,
            &claim,
            "the workspace PVC gone",
            |p: Option<&PersistentVolumeClaim>| p.is_none(),
        )
        .await;
        sessions.annotate(&failed, "gitops-r1").await;
        let ts = settled(&sessions, &failed, "FAILED", |s| {
            s.state == SessionState::Failed
                && has_condition(s, conditions::STALLED, "True", "WorkspaceLost")
        })
        .await;
        keep("failed", &ts);

        for (name, end, state, case) in [
            (&waiting, "Completed", SessionState::Completed, "completed"),
            (&lost, "Cancelled", SessionState::Cancelled, "cancelled"),
        ] {
            sessions
                .merge(name, json!({"spec": {"end": end}}))
                .await
                .expect("set spec.end");
            let ts = settled(&sessions, name, case, |s| s.state == state && no_ready(s)).await;
            keep(case, &ts);
        }

        let got: Vec<(String, Value)> = got;
        if std::env::var("KANDEV_RECORD_STATUSES").is_ok_and(|v| v == "1") {
            let record: Vec<Value> = got
                .iter()
                .map(|(case, object)| json!({"case": case, "object": object}))
                .collect();
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORD);
            std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
            let text = serde_json::to_string_pretty(&record).expect("JSON") + "\n";
            std::fs::write(&path, text).expect("write the record");
            eprintln!("recorded {} statuses in {RECORD}", record.len());
            return;
        }
        let record = recorded();
        let cases =
            |list: &[(String, Value)]| list.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>();
        assert_eq!(cases(&got), cases(&record), "the cases of {RECORD}");
        for ((case, now), (_, then)) in got.iter().zip(&record) {
            assert_eq!(
                shape(now),
                shape(then),
                "{case}: the operator writes another status than {RECORD} holds; if that is \
                 meant, record it again (KANDEV_RECORD_STATUSES=1 bash e2e/test.sh \
                 the_recorded_statuses) and check the verdict table of docs/gitops.md"
            );
        }
    };
    sessions.run(body).await;
}

/// kstatus's verdict on each recorded status is the one docs/gitops.md gives it, and it agrees
/// with Argo CD's there.
#[test]
#[ignore = "e2e: needs e2e/bin.sh's kandev-kstatus (make e2e)"]
fn kstatus_gives_each_recorded_status_the_tables_verdict() {
    let record = recorded();
    let table = verdicts();
    let cases: Vec<&str> = record.iter().map(|(c, _)| c.as_str()).collect();
    let rows: Vec<&str> = table.iter().map(|v| v.case.as_str()).collect();
    assert_eq!(
        cases, rows,
        "one table row per recorded status, in the same order"
    );
    let objects: Vec<&Value> = record.iter().map(|(_, o)| o).collect();
    let mut child = Command::new(our_bin("kandev-kstatus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kandev-kstatus runs (built by e2e/bin.sh)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&serde_json::to_vec(&objects).expect("JSON"))
        .expect("write the objects");
    let out = child.wait_with_output().expect("kandev-kstatus ends");
    assert!(out.status.success(), "kandev-kstatus: {out:?}");
    let verdicts: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(verdicts.len(), table.len(), "{verdicts:?}");
    for (row, verdict) in table.iter().zip(&verdicts) {
        assert_eq!(
            verdict["status"],
            row.kstatus.as_str(),
            "{}: {verdict}",
            row.case
        );
        assert_eq!(
            kstatus_of_argo(&row.argo),
            row.kstatus,
            "{}: the table's Argo CD and kstatus verdicts disagree",
            row.case
        );
    }
}

/// The Flux manifests of docs/gitops.md ("Flux: sessions after the operator") are what Flux's own
/// CRDs accept: each is applied to the API server with strict field validation (an unknown or
/// misspelt field fails), after the Kustomization and HelmRelease CRDs of the versions e2e/bin.sh
/// fetched from Flux's Go modules.
#[tokio::test]
#[ignore = "e2e: needs the cluster and e2e/bin.sh's Flux CRDs (make e2e)"]
async fn the_flux_example_is_what_fluxs_crds_accept() {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    use kube::runtime::conditions::is_crd_established;

    let sessions = Sessions::fresh("flux").await;
    let client = sessions.client.clone();
    let page = std::fs::read_to_string(e2e_support::repo_path("docs/gitops.md")).expect("docs");
    let section = page
        .split("### Flux: sessions after the operator")
        .nth(1)
        .expect("the Flux example's section");
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a yaml block in the section");
    let documents: Vec<Value> = serde_yaml_ng::Deserializer::from_str(block)
        .map(|d| {
            let yaml = serde_yaml_ng::Value::deserialize(d).expect("YAML");
            serde_json::to_value(yaml).expect("JSON")
        })
        .collect();
    let kinds: Vec<&str> = documents
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["Kustomization", "Kustomization", "HelmRelease"]);

    // Flux's CRDs, as e2e/bin.sh fetched them.
    let dir = e2e_support::support::process::our_data("flux-crds");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut plurals = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("CRD file");
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("a CRD");
        let name = crd.metadata.name.clone().expect("name");
        plurals.insert(crd.spec.names.kind.clone(), crd.spec.names.plural.clone());
        crds.patch(
            &name,
            &PatchParams::apply("kandev-e2e-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
        wait_for(&crds, &name, "Established", is_crd_established()).await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["flux-system", "kandev-system"] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        namespaces
            .patch(
                ns,
                &PatchParams::apply("kandev-e2e-tests"),
                &Patch::Apply(&namespace),
            )
            .await
            .unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
    }
    let strict = PatchParams::apply("kandev-e2e-tests").validation_strict();
    for document in &documents {
        let object: DynamicObject = serde_json::from_value(document.clone()).expect("an object");
        let types = object.types.clone().expect("apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&types).expect("group/version");
        let plural = plurals
            .get(&gvk.kind)
            .unwrap_or_else(|| panic!("no Flux CRD for {}", gvk.kind));
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let namespace = object.metadata.namespace.clone().expect("namespace");
        let name = object.metadata.name.clone().expect("name");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        let applied = api
            .patch(&name, &strict, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{} {namespace}/{name} is refused: {e}", gvk.kind));
        assert!(
            holds(&applied.data["spec"], &document["spec"]),
            "{name}: the API server dropped or changed a field: {}",
            applied.data["spec"]
        );
    }
    // The validation is real: a misspelt field is refused.
    let mut misspelt = documents[0].clone();
    misspelt["spec"]["healthCheck"] = json!([]);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kustomize.toolkit.fluxcd.io", "v1", "Kustomization"),
        &plurals["Kustomization"],
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "flux-system", &resource);
    let refused = api
        .patch("kandev-operator", &strict, &Patch::Apply(&misspelt))
        .await
        .expect_err("an unknown field is refused");
    assert!(refused.to_string().contains("healthCheck"), "{refused}");
}

/// Whether `got` has every field of `wanted` with the same value (and maybe defaults more).
fn holds(got: &Value, wanted: &Value) -> bool {
    match (got, wanted) {
        (Value::Object(got), Value::Object(wanted)) => wanted
            .iter()
            .all(|(k, v)| got.get(k).is_some_and(|g| holds(g, v))),
        (Value::Array(got), Value::Array(wanted)) => {
            got.len() == wanted.len() && got.iter().zip(wanted).all(|(g, w)| holds(g, w))
        }
        _ => got == wanted,
    }
}
