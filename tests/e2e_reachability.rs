//! End-to-end: DESIGN §3 status case 1 is "running **and reachable**". An agentctl that stops
//! answering (its process frozen with SIGSTOP: the pod's readiness probe, which the harness runs
//! as a kubelet would, fails and the pod turns not Ready) and a pod whose node is deleted both end
//! NeedsResume, with the cause (`AgentUnreachable`, `NodeLost`) as the reason, only after the
//! operator deleted the pod; then a resume restores the same ACP session. Against the real
//! control plane (kwok + harness) with the scriptable `kandev-test-agent`. Run by
//! `bash e2e/test.sh is_lost_ a_resume_request_on_a_frozen` (see e2e/README.md).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::time::Duration;

use e2e_support::operator::{Operator, OperatorBuilder};
use e2e_support::sessions::{Sessions, assert_condition, condition, has_condition, status_where};
use e2e_support::support::process::run_with_stdin;
use e2e_support::{Frozen, kubectl, poll_until, unique, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kandev_operator::api::conditions;
use kandev_operator::api::{SessionState, TaskSession};
use kube::api::{Api, DeleteParams};
use kube::runtime::wait::Condition;
use kube::{Client, ResourceExt};
use serde_json::json;

/// The cluster's one node (e2e/cluster.sh).
const NODE: &str = "kwok-node-0";

/// How long a loss (the limits of [`operator`], then the pod's deletion) and the resume after it
/// may take.
const LOSS_WITHIN: Duration = Duration::from_secs(120);

/// An operator that declares a pod unreachable after 4 s not Ready (the probe turns it not Ready
/// after 3 failures 10 s apart) and a node lost after 2 s; its agent `reach-agent`
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

/// A cluster client with the CRDs installed, and a namespace of the test's own.
async fn setup() -> Sessions {
    Sessions::fresh("kandev-e2e-reach").await
}

async fn running_session(sessions: &Sessions, name: &str) -> Pod {
    sessions.create(name, "reach-agent").await;
    sessions.wait_waiting_for_input(name).await;
    assert_eq!(sessions.token_of(name).await.as_deref(), Some("s-reach"));
    sessions.the_pod(name).await
}

/// needsResume, and NeedsResume=True with `reason`.
fn lost_because(reason: &str) -> impl Condition<TaskSession> + '_ {
    status_where(move |s| {
        s.needs_resume && has_condition(s, conditions::NEEDS_RESUME, "True", reason)
    })
}

/// Waits up to [`LOSS_WITHIN`] until the session is lost with `reason`.
async fn wait_lost(sessions: &Sessions, name: &str, reason: &str) -> TaskSession {
    sessions
        .wait_within(name, reason, LOSS_WITHIN, lost_because(reason))
        .await
}

/// After the loss: the pod with `uid` is gone, AgentRunning and the Events say why, the token is
/// kept, and a resume restores the same session in a new pod.
async fn assert_lost_then_resumed(sessions: &Sessions, name: &str, uid: &str, reason: &str) {
    let ts = wait_lost(sessions, name, reason).await;
    let status = ts.status.expect("status");
    assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
    assert_condition(&status, conditions::AGENT_RUNNING, ("False", reason));
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
    let ts = sessions
        .wait_handled_within(name, &token, LOSS_WITHIN)
        .await;
    let status = ts.status.expect("status");
    assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
    assert!(!status.needs_resume);
    assert_condition(&status, conditions::AGENT_RUNNING, ("True", "PodRunning"));
    assert_eq!(sessions.token_of(name).await.as_deref(), Some("s-reach"));
    assert_eq!(sessions.live_pods(name).await.len(), 1);
}

/// Waits until `pod` is not Ready (its readiness probe failed 3 times, 10 s apart).
async fn wait_not_ready(sessions: &Sessions, pod: &Pod) {
    let pods: Api<Pod> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
    let name = pod.name_any();
    poll_until(
        Duration::from_secs(60),
        Duration::from_millis(500),
        "the pod of a frozen agentctl did not turn not Ready",
        async || {
            pods.get(&name).await.is_ok_and(|p| {
                p.status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "False")
            })
        },
    )
    .await;
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn an_agentctl_that_stops_answering_is_lost_after_its_pod_is_deleted() {
    let sessions = setup().await;
    let _operator = operator().start();
    let body = async {
        let name = unique("frozen");
        let pod = running_session(&sessions, &name).await;
        let uid = pod.uid().expect("uid");

        // agentctl serve stops answering; nothing else tells the operator: the readiness probe
        // fails, and the pod turns not Ready after 3 failures.
        let frozen = Frozen::agentctl_of(&pod);
        wait_not_ready(&sessions, &pod).await;
        // Not declared before the limit: the pod still runs and the session is not lost yet.
        let status = sessions.status(&name).await;
        assert!(!status.needs_resume, "{status:#?}");
        assert_eq!(
            sessions.live_pods(&name).await.len(),
            1,
            "the pod is deleted only after --agent-unreachable-seconds"
        );

        // kwok removes a deleted pod's object at once, while the harness stops its process within
        // its grace period (a frozen serve needs the SIGKILL): a real kubelet keeps the pod until
        // the container is dead. Wait for the process too, so that the next serve finds the
        // workspace's socket free.
        wait_lost(&sessions, &name, "AgentUnreachable").await;
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(200),
            "the frozen agentctl was not stopped with its pod",
            async || frozen.gone(),
        )
        .await;
        assert_lost_then_resumed(&sessions, &name, &uid, "AgentUnreachable").await;
    };
    sessions.run(body).await;
}

/// DESIGN §3 case 1 is "running and reachable": a resume request on a running pod that is not
/// Ready is not "already running". The request stays unhandled, and once the pod counts as lost
/// and is gone the same request resumes the session.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_resume_request_on_a_frozen_agentctl_resumes_it_once_its_pod_is_gone() {
    let sessions = setup().await;
    let operator = operator().start();
    let body = async {
        let name = unique("frozen-request");
        let pod = running_session(&sessions, &name).await;

        // Healthy (Ready): a request is acknowledged as already running.
        let ts = sessions.resume(&name, "r-healthy").await;
        let status = ts.status.expect("status");
        let resumed = condition(&status, conditions::RESUMED);
        assert_eq!(resumed.reason, "AlreadyRunning", "{resumed:?}");

        let frozen = Frozen::agentctl_of(&pod);
        wait_not_ready(&sessions, &pod).await;
        sessions.annotate(&name, "r-frozen").await;
        // The request seen and looked at again: the pod is still not Ready.
        operator.await_reconciles(3).await;
        let status = sessions.status(&name).await;
        assert_eq!(
            status.last_handled_resume_request.as_deref(),
            Some("r-healthy"),
            "a frozen agentctl is not 'already running': {status:#?}"
        );
        // The operator writes why (AgentUnreachable, checked in the Events below), deletes the
        // pod, and the waiting request resumes the session at once. Stop the frozen process as
        // soon as its pod is gone, as the kubelet would at the end of the grace period (kwok
        // removes the pod's object at once, a kubelet only once the container is dead).
        let old = pod.uid();
        poll_until(
            LOSS_WITHIN,
            Duration::from_millis(100),
            "the frozen agentctl's pod was not deleted",
            async || {
                sessions
                    .live_pods(&name)
                    .await
                    .iter()
                    .all(|p| p.uid() != old)
            },
        )
        .await;
        drop(frozen);
        let ts = sessions
            .wait_handled_within(&name, "r-frozen", LOSS_WITHIN)
            .await;
        let status = ts.status.expect("status");
        assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
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
        let applied = run_with_stdin(kubectl().args(["apply", "-f", "-"]), &self.manifest);
        if !applied.success() {
            eprintln!("could not restore the node: {}", applied.stderr);
        }
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
    let sessions = setup().await;
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
        sessions
            .wait_within(
                &name,
                "NodeLost",
                Duration::from_secs(60),
                lost_because("NodeLost"),
            )
            .await;
        // The pod was force-deleted by the operator (not by the pod garbage collector, 40 s later):
        // the session said why before it went.
        drop(gone);
        node_ready(&client).await;
        assert_lost_then_resumed(&sessions, &name, &uid, "NodeLost").await;
    };
    sessions.run(body).await;
}
