//! End-to-end: DESIGN §3 status case 1 is "running **and reachable**". An agentctl that stops
//! answering (its process frozen with SIGSTOP) and a pod whose node is deleted both end
//! NeedsResume, with the cause (`AgentUnreachable`, `NodeLost`) as the reason, only after the
//! operator deleted the pod; then a resume restores the same ACP session. Against the real
//! control plane (kwok + harness) with the scriptable `kandev-test-agent`. Run by
//! `bash e2e/test.sh is_lost_ a_resume_request_on_a_frozen` (see e2e/README.md).

mod e2e_support;

use std::time::Duration;

use e2e_support::operator::{Operator, OperatorBuilder};
use e2e_support::sessions::{Sessions, handled};
use e2e_support::{harness_pid, kubectl, unique, wait_for, wait_for_within};
use k8s_openapi::api::core::v1::{Node, Pod};
use kandev_operator::api::{PROMPTED_ANNOTATION, SessionState, TaskSession};
use kandev_operator::controller::conditions;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The cluster's one node (e2e/cluster.sh).
const NODE: &str = "kwok-node-0";

/// An operator that declares an agent unreachable after 4 s without an answer (each contact
/// waits 10 s for one) and a node lost after 2 s; its agent `reach-agent`
/// (`tests/data/profiles/reach.yaml`) has one known session.
fn operator() -> OperatorBuilder {
    Operator::builder()
        .log_prefix("reach")
        .profiles_file("reach")
        .resync(Duration::from_secs(2))
        .args(&[
            "--acp-timeout-seconds",
            "10",
            "--agent-unreachable-seconds",
            "4",
            "--node-lost-seconds",
            "2",
        ])
}

async fn running_session(sessions: &Sessions, name: &str) -> Pod {
    sessions.create(name, "reach-agent").await;
    sessions
        .wait_state(name, SessionState::WaitingForInput)
        .await
        .expect("session");
    assert_eq!(sessions.token_of(name).await.as_deref(), Some("s-reach"));
    let pods = sessions.live_pods(name).await;
    assert_eq!(pods.len(), 1);
    pods.into_iter().next().expect("pod")
}

/// NeedsResume=True with `reason`.
fn lost_because(reason: &str) -> impl Fn(Option<&TaskSession>) -> bool + '_ {
    move |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .filter(|s| s.needs_resume)
            .and_then(|s| conditions::find(&s.conditions, conditions::NEEDS_RESUME))
            .is_some_and(|c| c.status == "True" && c.reason == reason)
    }
}

/// After the loss: the pod with `uid` is gone, AgentRunning and the Events say why, the token is
/// kept, and a resume restores the same session in a new pod.
async fn assert_lost_then_resumed(sessions: &Sessions, name: &str, uid: &str, reason: &str) {
    let ts = wait_for_within(
        &sessions.sessions(),
        name,
        reason,
        Duration::from_secs(120),
        lost_because(reason),
    )
    .await
    .expect("session");
    let status = ts.status.expect("status");
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
    let agent = conditions::find(&status.conditions, conditions::AGENT_RUNNING).expect("cond");
    assert_eq!(
        (agent.status.as_str(), agent.reason.as_str()),
        ("False", reason)
    );
    assert!(
        sessions
            .live_pods(name)
            .await
            .iter()
            .all(|p| p.uid().as_deref() != Some(uid)),
        "the session is lost only once its pod is gone"
    );
    // The cause (said before the deletion), then AgentLost.
    sessions
        .assert_events_in_order(name, &[reason, "AgentLost"])
        .await;
    assert_eq!(sessions.token_of(name).await.as_deref(), Some("s-reach"));

    let token = format!("r-{}", reason.to_lowercase());
    sessions.annotate(name, &token).await;
    let ts = wait_for_within(
        &sessions.sessions(),
        name,
        "resumed",
        Duration::from_secs(120),
        handled(&token),
    )
    .await
    .expect("session");
    let status = ts.status.expect("status");
    let resumed = conditions::find(&status.conditions, conditions::RESUMED).expect("Resumed");
    assert_eq!(
        (resumed.status.as_str(), resumed.reason.as_str()),
        ("True", "Restored"),
        "{status:#?}"
    );
    assert!(!status.needs_resume);
    let agent = conditions::find(&status.conditions, conditions::AGENT_RUNNING).expect("cond");
    assert_eq!(
        (agent.status.as_str(), agent.reason.as_str()),
        ("True", "PodRunning")
    );
    assert_eq!(sessions.token_of(name).await.as_deref(), Some("s-reach"));
    assert_eq!(sessions.live_pods(name).await.len(), 1);
}

/// A process frozen by the test; SIGKILLed when the guard goes (also on panic), so that nothing
/// stopped outlives the test.
struct Frozen(i32);

impl Frozen {
    fn new(pid: i32) -> Self {
        // SAFETY: kill(2) with a pid the harness started for this test's pod.
        let rc = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(rc, 0, "SIGSTOP {pid}");
        Self(pid)
    }

    fn gone(&self) -> bool {
        // A reaped process has no /proc entry; a zombie's state is Z.
        std::fs::read_to_string(format!("/proc/{}/stat", self.0))
            .map_or(true, |stat| stat.split_whitespace().nth(2) == Some("Z"))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.gone() {
            // SAFETY: as above.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
            }
        }
    }
}

/// AgentRunning=False with `reason`.
fn agent_running_false(reason: &str) -> impl Fn(Option<&TaskSession>) -> bool + '_ {
    move |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .and_then(|s| conditions::find(&s.conditions, conditions::AGENT_RUNNING))
            .is_some_and(|c| c.status == "False" && c.reason == reason)
    }
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn an_agentctl_that_stops_answering_is_lost_after_its_pod_is_deleted() {
    let sessions = Sessions::fresh("kandev-e2e-reach").await;
    let _operator = operator().start();
    let body = async {
        let name = unique("frozen");
        let pod = running_session(&sessions, &name).await;
        let uid = pod.uid().expect("uid");
        let pid = harness_pid(&pod).expect("the harness's pid annotation") as i32;

        // agentctl serve stops answering; a client's nudge makes the operator read its journal.
        let frozen = Frozen::new(pid);
        let nudge = json!({"metadata": {"annotations": {PROMPTED_ANNOTATION: "after-freeze"}}});
        sessions
            .sessions()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&nudge))
            .await
            .expect("nudge");
        // Not declared before the limit: the pod still runs and the session is not lost yet.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let status = sessions
            .sessions()
            .get(&name)
            .await
            .expect("session")
            .status
            .expect("status");
        assert!(!status.needs_resume, "{status:#?}");

        // kwok removes a deleted pod's object at once, while the harness stops its process within
        // its grace period (a frozen serve needs the SIGKILL): a real kubelet keeps the pod until
        // the container is dead. Wait for the process too, so that the next serve finds the
        // workspace's socket free.
        wait_for_within(
            &sessions.sessions(),
            &name,
            "AgentUnreachable",
            Duration::from_secs(120),
            lost_because("AgentUnreachable"),
        )
        .await
        .expect("session");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !frozen.gone() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the frozen agentctl was not stopped with its pod"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_lost_then_resumed(&sessions, &name, &uid, "AgentUnreachable").await;
    };
    sessions.run(body).await;
}

/// DESIGN §3 case 1 is "running and reachable": a resume request on a running pod whose
/// agentctl does not answer is not "already running". agentctl is contacted first; the request
/// stays unhandled while it does not answer, and once the pod counts as lost and is gone the
/// same request resumes the session.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_resume_request_on_a_frozen_agentctl_resumes_it_once_its_pod_is_gone() {
    let sessions = Sessions::fresh("kandev-e2e-reach").await;
    let operator = operator().start();
    let body = async {
        let name = unique("frozen-request");
        let pod = running_session(&sessions, &name).await;
        let pid = harness_pid(&pod).expect("the harness's pid annotation") as i32;

        // Healthy: a request is acknowledged as already running, after agentctl answered.
        sessions.annotate(&name, "r-healthy").await;
        let ts = wait_for(&sessions.sessions(), &name, "handled", handled("r-healthy"))
            .await
            .expect("session");
        let resumed = ts
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, conditions::RESUMED))
            .expect("Resumed")
            .clone();
        assert_eq!(resumed.reason, "AlreadyRunning", "{resumed:?}");

        let frozen = Frozen::new(pid);
        sessions.annotate(&name, "r-frozen").await;
        // The request seen (agentctl contacted) and looked at again: still no answer.
        operator.await_reconciles(3).await;
        let status = sessions
            .sessions()
            .get(&name)
            .await
            .expect("session")
            .status
            .expect("status");
        assert_eq!(
            status.last_handled_resume_request.as_deref(),
            Some("r-healthy"),
            "a frozen agentctl is not 'already running': {status:#?}"
        );
        // The operator writes why before it deletes the pod. Stop the frozen process at once, as
        // the kubelet would at the end of the grace period (kwok removes the pod's object at once,
        // a kubelet only once the container is dead), so that the next serve finds the socket free.
        wait_for_within(
            &sessions.sessions(),
            &name,
            "AgentUnreachable",
            Duration::from_secs(120),
            agent_running_false("AgentUnreachable"),
        )
        .await
        .expect("session");
        drop(frozen);
        let ts = wait_for_within(
            &sessions.sessions(),
            &name,
            "handled r-frozen",
            Duration::from_secs(120),
            handled("r-frozen"),
        )
        .await
        .expect("session");
        let status = ts.status.expect("status");
        let resumed = conditions::find(&status.conditions, conditions::RESUMED).expect("Resumed");
        assert_eq!(
            (resumed.status.as_str(), resumed.reason.as_str()),
            ("True", "Restored"),
            "{status:#?}"
        );
        assert_eq!(sessions.token_of(&name).await.as_deref(), Some("s-reach"));
        // The waiting request is latched as soon as the pod is gone, usually before a steady
        // pass could declare the loss (AgentLost), so only the order of these is fixed.
        sessions
            .assert_events_in_order(&name, &["AgentUnreachable", "ResumeRequested", "Resumed"])
            .await;
    };
    sessions.run(body).await;
}

/// The cluster's node, deleted by the test and created again from its labels and annotations
/// when the guard goes (also on panic); kwok then makes it Ready again.
struct NodeGone {
    manifest: String,
}

impl NodeGone {
    async fn delete(client: &Client) -> Self {
        let nodes: Api<Node> = Api::all(client.clone());
        let node = nodes.get(NODE).await.expect("node");
        let manifest = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": node.labels(), "annotations": node.annotations()},
        })
        .to_string();
        nodes
            .delete(NODE, &DeleteParams::default())
            .await
            .expect("delete the node");
        Self { manifest }
    }

    fn restore(&self) {
        use std::io::Write;
        let mut child = kubectl()
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("kubectl");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(self.manifest.as_bytes());
        }
        let _ = child.wait();
    }
}

impl Drop for NodeGone {
    fn drop(&mut self) {
        self.restore();
    }
}

async fn node_ready(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let ready = |node: Option<&Node>| {
        node.and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    wait_for(&nodes, NODE, "node Ready", ready)
        .await
        .expect("the node is back");
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_pod_on_a_deleted_node_is_lost_and_resumed_once_the_node_is_back() {
    let sessions = Sessions::fresh("kandev-e2e-reach").await;
    let client = sessions.client.clone();
    let _operator = operator().start();
    let body = async {
        let name = unique("nodeless");
        let pod = running_session(&sessions, &name).await;
        let uid = pod.uid().expect("uid");
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(NODE)
        );

        let gone = NodeGone::delete(&client).await;
        wait_for_within(
            &sessions.sessions(),
            &name,
            "NodeLost",
            Duration::from_secs(60),
            lost_because("NodeLost"),
        )
        .await
        .expect("session");
        // The pod was force-deleted by the operator (not by the pod garbage collector, 40 s later):
        // the session said why before it went.
        drop(gone);
        node_ready(&client).await;
        assert_lost_then_resumed(&sessions, &name, &uid, "NodeLost").await;
    };
    sessions.run(body).await;
}
