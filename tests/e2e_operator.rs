//! End-to-end: the operator as a local process against the real control plane (kwok + harness),
//! with the real `claude-agent-acp` from npm inside the agentctl pods the harness plays, and the
//! scriptable `kandev-test-agent` for refusals. Run by `bash e2e/test.sh` (see e2e/README.md):
//! `#[ignore]`d for plain `cargo test`, failing (never skipping) without a cluster.

mod e2e_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use e2e_support::{client, install_crd, repo_path, unique, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kandev_operator::api::{
    ExecutorRunning, RESUME_ANNOTATION, SessionState, TaskSession, TaskState,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::Condition;
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "default";
/// Reconcile period of the operator under test: "no relaunch for several periods" is measured
/// in these.
const RESYNC: Duration = Duration::from_secs(2);

/// Agent profiles of the test operator, besides the built-in ones.
const TEST_PROFILES: &str = r#"
profiles:
  test-inconclusive:
    launch: ["kandev-test-agent", "--advertise", "resume,load", "--on-resume", "error:-32603"]
    nativeSessionResume: true
    historyContextInjection: false
"#;

/// The operator binary as a child process (killed when dropped).
struct Operator {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Operator {
    /// A single operator without leader election, optionally with a crash point.
    fn start(fault: Option<&str>) -> Operator {
        Self::spawn(fault, None)
    }

    /// One replica electing a leader on `lease` as `identity`.
    fn replica(lease: &str, identity: &str) -> Operator {
        Self::spawn(None, Some((lease, identity)))
    }

    fn spawn(fault: Option<&str>, election: Option<(&str, &str)>) -> Operator {
        let dir = repo_path("target/e2e-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let profiles = dir.join("test-profiles.yaml");
        std::fs::write(&profiles, TEST_PROFILES).expect("profiles file");
        let log = dir.join(format!("{}.log", unique("operator")));
        let out = std::fs::File::create(&log).expect("operator log");
        let err = out.try_clone().expect("operator log");
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kandev-operator"));
        cmd.args(["run", "--acp-timeout-seconds", "30"])
            .args(["--resync-seconds", &RESYNC.as_secs().to_string()])
            .args(["--agentctl-image", "kandev.dev/agentctl:e2e"])
            .arg("--agent-profiles")
            .arg(&profiles)
            .env("RUST_LOG", "info,kandev_operator=debug")
            .env_remove("KANDEV_FAULT_EXIT_AFTER")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        if let Some(step) = fault {
            cmd.env("KANDEV_FAULT_EXIT_AFTER", step);
        }
        match election {
            Some((lease, identity)) => {
                cmd.args(["--lease-name", lease, "--lease-namespace", NS])
                    .env("POD_NAME", identity);
            }
            None => {
                cmd.arg("--no-leader-election");
            }
        }
        let child = cmd.spawn().expect("start kandev-operator");
        eprintln!("operator log: {}", log.display());
        Operator { child, log }
    }

    /// Waits for the operator to exit on its own (a fault point), returning its exit code.
    async fn exited(&mut self, within: Duration) -> Option<i32> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => panic!(
                "operator did not exit within {within:?}; log {}",
                self.log.display()
            ),
        }
    }
}

async fn setup() -> Client {
    let client = client().await;
    install_crd(&client, "crds/tasksessions.kandev.dev.yaml").await;
    install_crd(&client, "crds/executorrunnings.kandev.dev.yaml").await;
    client
}

fn sessions(client: &Client) -> Api<TaskSession> {
    Api::namespaced(client.clone(), NS)
}

fn executors(client: &Client) -> Api<ExecutorRunning> {
    Api::namespaced(client.clone(), NS)
}

fn pods(client: &Client) -> Api<Pod> {
    Api::namespaced(client.clone(), NS)
}

fn new_session(name: &str, agent: &str, workspace: serde_json::Value) -> TaskSession {
    serde_json::from_value(json!({
        "apiVersion": "kandev.dev/v1alpha1",
        "kind": "TaskSession",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "taskId": format!("task-{name}"),
            "agent": agent,
            "taskDescription": "Say hello.",
            "workspace": workspace,
        }
    }))
    .expect("valid TaskSession")
}

async fn create_session(client: &Client, name: &str, agent: &str) -> TaskSession {
    let ts = new_session(name, agent, json!({"template": {"size": "1Gi"}}));
    sessions(client)
        .create(&PostParams::default(), &ts)
        .await
        .expect("create TaskSession")
}

fn state_is(state: SessionState) -> impl Condition<TaskSession> {
    move |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.state == state)
    }
}

fn handled(token: &str) -> impl Condition<TaskSession> + '_ {
    move |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.last_handled_resume_request.as_deref() == Some(token))
    }
}

fn needs_resume() -> impl Condition<TaskSession> {
    |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.needs_resume)
    }
}

async fn token_of(client: &Client, name: &str) -> Option<String> {
    executors(client)
        .get(name)
        .await
        .expect("ExecutorRunning")
        .status
        .and_then(|s| s.resume_token)
}

/// The session's pods that are not being deleted.
async fn live_pods(client: &Client, name: &str) -> Vec<Pod> {
    pods(client)
        .list(&ListParams::default().labels(&format!("kandev.dev/session={name}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn event_reasons(client: &Client, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let mut list = events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={name},involvedObject.kind=TaskSession"
        )))
        .await
        .expect("list events")
        .items;
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    list.into_iter().filter_map(|e| e.reason).collect()
}

async fn annotate(client: &Client, name: &str, token: &str) {
    // A field manager that does not start with "kubectl" (Flux prunes fields owned by those).
    let patch = json!({"metadata": {"annotations": {RESUME_ANNOTATION: token}}});
    sessions(client)
        .patch(
            name,
            &PatchParams::apply("kandev-e2e-user"),
            &Patch::Merge(&patch),
        )
        .await
        .expect("annotate");
}

async fn delete_session(client: &Client, name: &str) {
    let _ = sessions(client)
        .delete(name, &DeleteParams::default())
        .await;
}

async fn started_and_waiting(client: &Client, name: &str) -> (String, Pod) {
    let ts = wait_for(
        &sessions(client),
        name,
        "WAITING_FOR_INPUT",
        state_is(SessionState::WaitingForInput),
    )
    .await
    .expect("session");
    let status = ts.status.expect("status");
    assert_eq!(
        status.task_state,
        TaskState::Review,
        "task column after the first prompt"
    );
    let token = token_of(client, name)
        .await
        .expect("a resume token after session/new");
    let pods = live_pods(client, name).await;
    assert_eq!(
        pods.len(),
        1,
        "exactly one agentctl pod: {:?}",
        pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    (token, pods.into_iter().next().expect("pod"))
}

// ---------------------------------------------------------------------------------------------

/// New session → pod Running → WAITING_FOR_INPUT with a token; pod lost → needsResume and no new
/// pod; annotate → the same token restored by session/resume, once per token.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn lost_session_is_resumed_lazily_with_the_same_token() {
    let client = setup().await;
    let _operator = Operator::start(None);
    let name = unique("resume");
    create_session(&client, &name, "claude-code").await;

    let (token, pod) = started_and_waiting(&client, &name).await;
    let spec = pod.spec.as_ref().expect("pod spec");
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(
        pod.labels().get("kandev.dev/managed").map(String::as_str),
        Some("true")
    );

    // Lost pod: marked, not relaunched.
    pods(&client)
        .delete(&pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    let ts = wait_for(&sessions(&client), &name, "needsResume", needs_resume())
        .await
        .expect("session");
    let status = ts.status.expect("status");
    assert_eq!(
        status.resume_reason.map(|r| r.as_str()),
        Some("agent_not_running")
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "NeedsResume" && c.status == "True")
    );
    tokio::time::sleep(RESYNC * 4).await;
    assert!(
        live_pods(&client, &name).await.is_empty(),
        "lazy recovery: nothing relaunched"
    );
    assert_eq!(
        token_of(&client, &name).await.as_deref(),
        Some(token.as_str()),
        "token kept while lost"
    );

    // Resume on annotation.
    annotate(&client, &name, "r1").await;
    let ts = wait_for(&sessions(&client), &name, "handled r1", handled("r1"))
        .await
        .expect("session");
    let status = ts.status.expect("status");
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
    assert_eq!(status.task_state, TaskState::Review);
    assert!(!status.needs_resume);
    let resumed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Resumed")
        .expect("Resumed condition");
    assert_eq!(
        (resumed.status.as_str(), resumed.reason.as_str()),
        ("True", "Restored"),
        "{resumed:?}"
    );
    assert!(
        resumed.message.contains("session/resume"),
        "{}",
        resumed.message
    );
    assert_eq!(
        token_of(&client, &name).await.as_deref(),
        Some(token.as_str()),
        "same token back"
    );
    let after = live_pods(&client, &name).await;
    assert_eq!(after.len(), 1, "one pod after the resume");
    let reasons = event_reasons(&client, &name).await;
    for expected in [
        "AgentLost",
        "ResumeRequested",
        "Starting",
        "PodCreated",
        "Resumed",
    ] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "event {expected} missing from {reasons:?}"
        );
    }

    // The same token again: nothing happens.
    let resumed_events = reasons.iter().filter(|r| *r == "Resumed").count();
    annotate(&client, &name, "r1").await;
    let touch = json!({"metadata": {"annotations": {"e2e.kandev.dev/touch": "1"}}});
    sessions(&client)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .expect("touch");
    tokio::time::sleep(RESYNC * 2).await;
    let same = live_pods(&client, &name).await;
    assert_eq!(
        same.iter().map(|p| p.uid()).collect::<Vec<_>>(),
        after.iter().map(|p| p.uid()).collect::<Vec<_>>()
    );
    let reasons = event_reasons(&client, &name).await;
    assert_eq!(
        reasons.iter().filter(|r| *r == "Resumed").count(),
        resumed_events,
        "no second resume"
    );

    // A new token after another loss: a new resume.
    pods(&client)
        .delete(&after[0].name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(&sessions(&client), &name, "needsResume", needs_resume()).await;
    annotate(&client, &name, "r2").await;
    wait_for(&sessions(&client), &name, "handled r2", handled("r2")).await;
    assert_eq!(
        token_of(&client, &name).await.as_deref(),
        Some(token.as_str()),
        "same token again"
    );
    assert_eq!(live_pods(&client, &name).await.len(), 1);
    delete_session(&client, &name).await;
}

/// -32002 from the real agent (the token is unknown to it) → fresh session, WAITING_FOR_INPUT,
/// token replaced; -32603 from the scriptable agent → token kept, condition explains.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn rejected_and_inconclusive_restores() {
    let client = setup().await;
    let _operator = Operator::start(None);

    // Unknown session: claude-agent-acp answers -32002 for a UUID it has never seen.
    let name = unique("unknown");
    create_session(&client, &name, "claude-code").await;
    let (_, pod) = started_and_waiting(&client, &name).await;
    let unknown = "0badc0de-0000-4000-8000-000000000000";
    let patch = json!({"status": {"resumeToken": unknown}});
    executors(&client)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set token");
    pods(&client)
        .delete(&pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(&sessions(&client), &name, "needsResume", needs_resume()).await;
    annotate(&client, &name, "u1").await;
    let ts = wait_for(&sessions(&client), &name, "handled u1", handled("u1"))
        .await
        .expect("session");
    let status = ts.status.expect("status");
    assert_eq!(
        status.state,
        SessionState::WaitingForInput,
        "token rejected is not FAILED: {status:#?}"
    );
    let resumed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Resumed")
        .expect("Resumed");
    assert_eq!(
        (resumed.status.as_str(), resumed.reason.as_str()),
        ("False", "TokenRejected")
    );
    let token = token_of(&client, &name).await.expect("a new token");
    assert_ne!(token, unknown, "the rejected token is replaced");
    assert!(
        event_reasons(&client, &name)
            .await
            .iter()
            .any(|r| r == "TokenRejected")
    );
    delete_session(&client, &name).await;

    // Inconclusive: -32603 on resume keeps the token and says why.
    let name = unique("inconclusive");
    create_session(&client, &name, "test-inconclusive").await;
    let (token, pod) = started_and_waiting(&client, &name).await;
    pods(&client)
        .delete(&pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(&sessions(&client), &name, "needsResume", needs_resume()).await;
    annotate(&client, &name, "i1").await;
    let ts = wait_for(&sessions(&client), &name, "handled i1", handled("i1"))
        .await
        .expect("session");
    let status = ts.status.expect("status");
    let resumed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Resumed")
        .expect("Resumed");
    assert_eq!(resumed.status, "False");
    assert!(
        resumed.message.contains("token is kept"),
        "{}",
        resumed.message
    );
    assert!(status.needs_resume, "still needs a resume");
    assert_eq!(
        token_of(&client, &name).await.as_deref(),
        Some(token.as_str()),
        "token kept"
    );
    assert!(
        live_pods(&client, &name).await.is_empty(),
        "the failed attempt's pod is removed"
    );
    delete_session(&client, &name).await;
}

/// Terminal sessions refuse a resume; a missing PVC fails the session with the reason; an
/// invalid TaskSession is refused by the API server and the operator keeps working.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn refusals_and_bad_input() {
    let client = setup().await;
    let _operator = Operator::start(None);

    let invalid = new_session(
        &unique("invalid"),
        "Not A Profile!",
        json!({"template": {"size": "1Gi"}}),
    );
    let err = sessions(&client)
        .create(&PostParams::default(), &invalid)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("agent must be a profile name"),
        "{err}"
    );

    let name = unique("nopvc");
    let ts = new_session(&name, "claude-code", json!({"claimName": "does-not-exist"}));
    sessions(&client)
        .create(&PostParams::default(), &ts)
        .await
        .expect("create");
    let ts = wait_for(
        &sessions(&client),
        &name,
        "FAILED",
        state_is(SessionState::Failed),
    )
    .await
    .expect("session");
    let message = ts.status.and_then(|s| s.error_message).unwrap_or_default();
    assert!(message.contains("does-not-exist"), "{message}");
    delete_session(&client, &name).await;

    for terminal in ["COMPLETED", "CANCELLED"] {
        let name = unique("terminal");
        create_session(&client, &name, "claude-code").await;
        started_and_waiting(&client, &name).await;
        let patch = json!({"status": {"state": terminal}});
        sessions(&client)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("set state");
        annotate(&client, &name, "t1").await;
        let ts = wait_for(&sessions(&client), &name, "handled t1", handled("t1"))
            .await
            .expect("session");
        let status = ts.status.expect("status");
        assert_eq!(status.state.as_str(), terminal);
        let resumed = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Resumed")
            .expect("Resumed");
        assert_eq!(
            (resumed.status.as_str(), resumed.reason.as_str()),
            ("False", "TerminalState")
        );
        assert!(
            event_reasons(&client, &name)
                .await
                .iter()
                .any(|r| r == "ResumeRefused")
        );
        delete_session(&client, &name).await;
    }
}

/// The operator dies right after persisting STARTING, then right after creating the pod; each
/// restarted operator finishes the resume with exactly one agentctl pod.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn operator_restarts_mid_resume_leave_exactly_one_pod() {
    let client = setup().await;
    let name = unique("restart");
    let first_pod = {
        let _operator = Operator::start(None);
        create_session(&client, &name, "claude-code").await;
        started_and_waiting(&client, &name).await.1
    };
    let token = token_of(&client, &name).await.expect("token");
    {
        // A restarted operator re-attaches to the running pod instead of relaunching it.
        let _operator = Operator::start(None);
        tokio::time::sleep(RESYNC * 3).await;
        let live = live_pods(&client, &name).await;
        assert_eq!(
            live.iter().map(|p| p.uid()).collect::<Vec<_>>(),
            vec![first_pod.uid()]
        );
        let ts = sessions(&client).get(&name).await.expect("session");
        assert_eq!(
            ts.status.map(|s| s.state),
            Some(SessionState::WaitingForInput)
        );
    }
    for (step, request) in [("starting", "s1"), ("pod-created", "s2")] {
        let pod = live_pods(&client, &name).await.into_iter().next();
        if let Some(pod) = pod {
            pods(&client)
                .delete(&pod.name_any(), &DeleteParams::default())
                .await
                .expect("delete pod");
        }
        {
            let _operator = Operator::start(None);
            wait_for(&sessions(&client), &name, "needsResume", needs_resume()).await;
        }
        annotate(&client, &name, request).await;
        let mut crashing = Operator::start(Some(step));
        assert_eq!(
            crashing.exited(Duration::from_secs(60)).await,
            Some(3),
            "fault point {step}"
        );
        let _operator = Operator::start(None);
        wait_for(
            &sessions(&client),
            &name,
            &format!("handled {request}"),
            handled(request),
        )
        .await;
        let live = live_pods(&client, &name).await;
        assert_eq!(
            live.len(),
            1,
            "after a crash at {step}: {:?}",
            live.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        assert_eq!(
            token_of(&client, &name).await.as_deref(),
            Some(token.as_str())
        );
    }
    delete_session(&client, &name).await;
}

async fn lease_holder(client: &Client, lease: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .get_opt(lease)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

async fn wait_lease_holder(client: &Client, lease: &str, identity: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while lease_holder(client, lease).await.as_deref() != Some(identity) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{identity} did not hold lease {lease} within {within:?} (holder: {:?})",
            lease_holder(client, lease).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Two replicas: one leads (holds the Lease) and acts, the other waits; when the leader dies the
/// other takes over and handles the next resume.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn two_replicas_elect_one_leader_and_fail_over() {
    let client = setup().await;
    let lease = unique("lease");
    let leader = Operator::replica(&lease, "replica-a");
    wait_lease_holder(&client, &lease, "replica-a", Duration::from_secs(30)).await;
    let follower = Operator::replica(&lease, "replica-b");

    let name = unique("ha");
    create_session(&client, &name, "claude-code").await;
    let (token, pod) = started_and_waiting(&client, &name).await;
    assert_eq!(
        lease_holder(&client, &lease).await.as_deref(),
        Some("replica-a")
    );
    let follower_log = std::fs::read_to_string(&follower.log).unwrap_or_default();
    assert!(
        !follower_log.contains("became the leader"),
        "only one leader: {follower_log}"
    );

    drop(leader);
    // The lease lasts 15 s without renewal.
    wait_lease_holder(&client, &lease, "replica-b", Duration::from_secs(45)).await;
    pods(&client)
        .delete(&pod.name_any(), &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(&sessions(&client), &name, "needsResume", needs_resume()).await;
    annotate(&client, &name, "ha1").await;
    wait_for(&sessions(&client), &name, "handled ha1", handled("ha1")).await;
    assert_eq!(
        token_of(&client, &name).await.as_deref(),
        Some(token.as_str())
    );
    drop(follower);
    delete_session(&client, &name).await;
}
