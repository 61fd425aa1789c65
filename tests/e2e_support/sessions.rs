//! TaskSessions in one namespace, as the e2e tests create, lose, resume and inspect them, and
//! the namespace of one test: [`Sessions::fresh`] makes it, [`Sessions::run`] tears it down after
//! the test, also when the test panics.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kandev_operator::api::{ExecutorRunning, RESUME_ANNOTATION, SessionState, TaskSession};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::Condition;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::operator::OperatorBuilder;
use super::{WAIT, client_with_crds, restricted_namespace, unique, wait_for_within, with_cleanup};

/// The first prompt of the sessions that [`Sessions::create`] makes.
pub const FIRST_PROMPT: &str = "Say hello.";

/// How long a teardown waits for a running operator to lift the finalizers of the deleted
/// sessions before it removes them itself.
const LIFT_WITHIN: Duration = Duration::from_secs(30);

/// How long [`Sessions::event_reasons_with`] and [`Sessions::assert_events_in_order`] wait for
/// the Events (published beside the reconciles, so one may land a moment after its status).
const EVENTS_WITHIN: Duration = Duration::from_secs(15);

/// The kandev objects of one namespace.
#[derive(Clone)]
pub struct Sessions {
    pub client: Client,
    pub namespace: String,
}

impl Sessions {
    pub fn new(client: &Client, namespace: &str) -> Self {
        Self {
            client: client.clone(),
            namespace: namespace.to_string(),
        }
    }

    /// A test's own namespace: the CRDs installed (see [`client_with_crds`]), and a new
    /// namespace `<prefix>-<unique>` that enforces the restricted Pod Security Standard. Run the
    /// test in [`Sessions::run`] so that it goes afterwards.
    pub async fn fresh(prefix: &str) -> Self {
        Self::fresh_on(&client_with_crds().await, prefix).await
    }

    /// [`Sessions::fresh`] with `client`, without installing the CRDs (the tests of the cluster
    /// itself, and of the CRDs' installation).
    pub async fn fresh_on(client: &Client, prefix: &str) -> Self {
        let sessions = Self::new(client, &unique(prefix));
        sessions.ensure_namespace().await;
        sessions
    }

    /// Runs `body`, then [`Sessions::teardown`], also when `body` panics (the panic goes on
    /// afterwards). An operator the test started before `run` (so that it outlives `body`)
    /// lifts the finalizers as it would for a user.
    pub async fn run(&self, body: impl Future<Output = ()>) {
        with_cleanup(body, self.teardown()).await;
    }

    /// [`Sessions::run`] for a test whose operators do not outlive `body` (restarted, crashed,
    /// stopped by the test): an operator of `operator` runs during the teardown, to lift the
    /// finalizers.
    pub async fn run_with_operator(
        &self,
        operator: OperatorBuilder,
        body: impl Future<Output = ()>,
    ) {
        let teardown = async {
            let _operator = operator.start();
            self.teardown().await;
        };
        with_cleanup(body, teardown).await;
    }

    /// Deletes the namespace's sessions and waits up to [`LIFT_WITHIN`] for them to go (a
    /// running operator lifts its finalizer); removes the finalizers of those left (no operator
    /// is left to do it), then deletes the namespace without waiting for it to go.
    pub async fn teardown(&self) {
        let api = self.sessions();
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        let deadline = tokio::time::Instant::now() + LIFT_WITHIN;
        loop {
            match api.list(&ListParams::default()).await {
                // Gone, or no CRD to list.
                Ok(list) if list.items.is_empty() => break,
                Err(_) => break,
                Ok(list) if tokio::time::Instant::now() >= deadline => {
                    let lift = json!({"metadata": {"finalizers": null}});
                    for ts in list.items {
                        let name = ts.name_any();
                        eprintln!(
                            "teardown of {}: removing the finalizers of {name}",
                            self.namespace
                        );
                        let _ = api
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&lift))
                            .await;
                    }
                    break;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }

    /// Creates the namespace if it does not exist, enforcing the restricted Pod Security
    /// Standard (see [`restricted_namespace`]).
    pub async fn ensure_namespace(&self) {
        restricted_namespace(&self.client, &self.namespace).await;
    }

    pub fn sessions(&self) -> Api<TaskSession> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn executors(&self) -> Api<ExecutorRunning> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Waits (see [`super::wait_for`]) until session `name` is in `state`; the session then.
    pub async fn wait_state(&self, name: &str, state: SessionState) -> Option<TaskSession> {
        self.wait_state_within(name, state, WAIT).await
    }

    /// [`Self::wait_state`] with another time limit.
    pub async fn wait_state_within(
        &self,
        name: &str,
        state: SessionState,
        within: Duration,
    ) -> Option<TaskSession> {
        let what = serde_json::to_value(state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{state:?}"));
        wait_for_within(&self.sessions(), name, &what, within, state_is(state)).await
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a 1 GiB ReadWriteOnce claim `name` in the namespace (the harness provisions it).
    pub async fn create_claim(&self, name: &str) {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("a valid claim");
        self.claims()
            .create(&PostParams::default(), &pvc)
            .await
            .unwrap_or_else(|e| panic!("create the claim {name}: {e}"));
    }

    /// A TaskSession (not created) whose first prompt is [`FIRST_PROMPT`].
    pub fn new_session(
        &self,
        name: &str,
        agent: &str,
        workspace: serde_json::Value,
    ) -> TaskSession {
        self.new_session_with_task(name, agent, Some(FIRST_PROMPT), workspace)
    }

    /// A TaskSession (not created) with `task` as its first prompt, or none.
    pub fn new_session_with_task(
        &self,
        name: &str,
        agent: &str,
        task: Option<&str>,
        workspace: serde_json::Value,
    ) -> TaskSession {
        serde_json::from_value(json!({
            "apiVersion": "kandev.dev/v1alpha1",
            "kind": "TaskSession",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "taskId": format!("task-{name}"),
                "agent": agent,
                "taskDescription": task,
                "workspace": workspace,
            }
        }))
        .expect("valid TaskSession")
    }

    /// A session with a 1Gi workspace created from a template, first prompt [`FIRST_PROMPT`].
    pub async fn create(&self, name: &str, agent: &str) -> TaskSession {
        self.create_with_task(name, agent, Some(FIRST_PROMPT)).await
    }

    /// [`Sessions::create`] with `task` as the first prompt, or none.
    pub async fn create_with_task(
        &self,
        name: &str,
        agent: &str,
        task: Option<&str>,
    ) -> TaskSession {
        let ts =
            self.new_session_with_task(name, agent, task, json!({"template": {"size": "1Gi"}}));
        self.sessions()
            .create(&PostParams::default(), &ts)
            .await
            .expect("create TaskSession")
    }

    pub async fn delete(&self, name: &str) {
        let _ = self.sessions().delete(name, &DeleteParams::default()).await;
    }

    /// Merges `status` into the session's status (as if the operator had written it).
    pub async fn set_status(&self, name: &str, status: serde_json::Value) {
        self.sessions()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
            .expect("patch status");
    }

    pub async fn token_of(&self, name: &str) -> Option<String> {
        self.executors()
            .get(name)
            .await
            .expect("ExecutorRunning")
            .status
            .and_then(|s| s.resume_token)
    }

    /// The session's pods that are not being deleted.
    pub async fn live_pods(&self, name: &str) -> Vec<Pod> {
        self.pods()
            .list(&ListParams::default().labels(&format!("kandev.dev/session={name}")))
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// Deletes `pod` (a node drain, an eviction).
    pub async fn delete_pod(&self, pod: &Pod) {
        self.pods()
            .delete(&pod.name_any(), &DeleteParams::default())
            .await
            .expect("delete pod");
    }

    /// Deletes every live pod of the session.
    pub async fn lose_pods(&self, name: &str) {
        for pod in self.live_pods(name).await {
            self.delete_pod(&pod).await;
        }
    }

    /// Reasons of the session's Events, oldest first, once each of `expected` is among them
    /// (the operator publishes its Events beside its reconciles, so one may land a moment after
    /// the status it goes with); as they are after 15 s otherwise.
    pub async fn event_reasons_with(&self, name: &str, expected: &[&str]) -> Vec<String> {
        self.event_reasons_until(name, |reasons| {
            expected.iter().all(|e| reasons.iter().any(|r| r == e))
        })
        .await
    }

    /// Asserts that the session's Events have `expected` among them in this order (others may
    /// come between), waiting up to 15 s for them as [`Sessions::event_reasons_with`] does;
    /// returns the reasons, oldest first.
    pub async fn assert_events_in_order(&self, name: &str, expected: &[&str]) -> Vec<String> {
        let reasons = self
            .event_reasons_until(name, |reasons| in_order(reasons, expected))
            .await;
        assert!(
            in_order(&reasons, expected),
            "Events of {name}: {expected:?} not in this order among {reasons:?}"
        );
        reasons
    }

    /// The session's Event reasons once `done` holds for them, or as they are after
    /// [`EVENTS_WITHIN`].
    async fn event_reasons_until(
        &self,
        name: &str,
        done: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + EVENTS_WITHIN;
        loop {
            let reasons = self.event_reasons(name).await;
            if done(&reasons) || tokio::time::Instant::now() > deadline {
                return reasons;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Reasons of the session's Events, oldest first: by the time of the first occurrence, the
    /// operator's `eventTime` (microseconds), else `creationTimestamp` (whole seconds). A repeat
    /// folded into an Event's series (its count and `lastObservedTime`) keeps the Event's place.
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut list = events
            .list(&ListParams::default().fields(&format!(
                "involvedObject.name={name},involvedObject.kind=TaskSession"
            )))
            .await
            .expect("list events")
            .items;
        list.sort_by_key(occurred);
        list.into_iter().filter_map(|e| e.reason).collect()
    }

    /// Requests a resume with `token`, as a user would (a field manager that does not start with
    /// "kubectl": Flux prunes fields owned by those).
    pub async fn annotate(&self, name: &str, token: &str) {
        let patch = json!({"metadata": {"annotations": {RESUME_ANNOTATION: token}}});
        self.sessions()
            .patch(
                name,
                &PatchParams::apply("kandev-e2e-user"),
                &Patch::Merge(&patch),
            )
            .await
            .expect("annotate");
    }
}

/// When `event` first occurred: `eventTime` (set by an `events.k8s.io/v1` writer such as the
/// operator), else the core/v1 `firstTimestamp`, else when the object was created.
pub fn occurred(event: &Event) -> Option<Timestamp> {
    event
        .event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Whether `expected` is a subsequence of `reasons`.
pub fn in_order(reasons: &[String], expected: &[&str]) -> bool {
    let mut reasons = reasons.iter();
    expected.iter().all(|wanted| reasons.any(|r| r == wanted))
}

pub fn state_is(state: SessionState) -> impl Condition<TaskSession> {
    move |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.state == state)
    }
}

pub fn handled(token: &str) -> impl Condition<TaskSession> + '_ {
    move |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.last_handled_resume_request.as_deref() == Some(token))
    }
}

pub fn needs_resume() -> impl Condition<TaskSession> {
    |ts: Option<&TaskSession>| {
        ts.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.needs_resume)
    }
}
