//! TaskSessions in one namespace, as the e2e tests create, lose, resume and inspect them, and
//! the namespace of one test: [`Sessions::fresh`] makes it, [`Sessions::run`] tears it down after
//! the test, also when the test panics.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as StatusCondition;
use k8s_openapi::jiff::Timestamp;
use kandev_operator::api::conditions;
use kandev_operator::api::{
    ExecutorRunning, ExecutorRunningStatus, RESUME_ANNOTATION, SessionState, TaskSession,
    TaskSessionStatus,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::Condition;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::operator::OperatorBuilder;
use super::{
    WAIT, client_with_crds, poll_until, restricted_namespace, unique, wait_for_within, with_cleanup,
};

/// The first prompt of the sessions that [`Sessions::create`] makes.
pub const FIRST_PROMPT: &str = "Say hello.";

/// How long [`Sessions::wait_no_live_pods`] waits for a session's pods to go.
const PODS_GONE_WITHIN: Duration = Duration::from_secs(30);

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

    /// Waits (see [`super::wait_for`]) until `cond` holds for session `name`; the session then.
    /// For conditions that hold only on an existing session.
    pub async fn wait(
        &self,
        name: &str,
        what: &str,
        cond: impl Condition<TaskSession>,
    ) -> TaskSession {
        self.wait_within(name, what, WAIT, cond).await
    }

    /// [`Sessions::wait`] with another time limit.
    pub async fn wait_within(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        cond: impl Condition<TaskSession>,
    ) -> TaskSession {
        wait_for_within(&self.sessions(), name, what, within, cond)
            .await
            .unwrap_or_else(|| panic!("TaskSession {name} is gone"))
    }

    /// Waits until the session is WAITING_FOR_INPUT (started, or resumed, and idle).
    pub async fn wait_waiting_for_input(&self, name: &str) -> TaskSession {
        self.wait_state(name, SessionState::WaitingForInput)
            .await
            .expect("session")
    }

    /// Waits until the session needs a resume (see [`needs_resume`]).
    pub async fn wait_needs_resume(&self, name: &str) -> TaskSession {
        self.wait(name, "needsResume", needs_resume()).await
    }

    /// Starts watching `name` for `cond` and returns once the watch's initial list is done, so
    /// no change after this call can be missed (even a state that lasts a moment); the handle
    /// yields whether `cond` held within [`WAIT`].
    pub async fn watch_for(
        &self,
        name: &str,
        cond: impl Condition<TaskSession> + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<bool> {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        use kube::runtime::watcher::{self, Event};
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = Box::pin(watcher::watcher(self.sessions(), config).default_backoff());
        let (ready, listed) = tokio::sync::oneshot::channel();
        let watch = tokio::spawn(async move {
            let mut ready = Some(ready);
            let seen = async {
                while let Some(event) = events.next().await {
                    match event {
                        Ok(Event::InitDone) => {
                            if let Some(ready) = ready.take() {
                                let _ = ready.send(());
                            }
                        }
                        Ok(Event::Apply(ts) | Event::InitApply(ts))
                            if cond.matches_object(Some(&ts)) =>
                        {
                            return true;
                        }
                        _ => {}
                    }
                }
                false
            };
            tokio::time::timeout(WAIT, seen).await.unwrap_or(false)
        });
        // Err: the watch ended (or matched) before its list was done; nothing left to wait for.
        let _ = listed.await;
        watch
    }

    /// Waits until the operator has handled the resume request `token` (see [`handled`]).
    pub async fn wait_handled(&self, name: &str, token: &str) -> TaskSession {
        self.wait_handled_within(name, token, WAIT).await
    }

    /// [`Sessions::wait_handled`] with another time limit.
    pub async fn wait_handled_within(
        &self,
        name: &str,
        token: &str,
        within: Duration,
    ) -> TaskSession {
        self.wait_within(name, &format!("handled {token}"), within, handled(token))
            .await
    }

    /// Requests a resume with `token` (see [`Sessions::annotate`]) and waits until the operator
    /// has handled it; the session then.
    pub async fn resume(&self, name: &str, token: &str) -> TaskSession {
        self.annotate(name, token).await;
        self.wait_handled(name, token).await
    }

    /// Loses the session's agent (see [`Sessions::lose_pods`]) and waits until the session needs
    /// a resume; the session then.
    pub async fn lose(&self, name: &str) -> TaskSession {
        self.lose_pods(name).await;
        self.wait_needs_resume(name).await
    }

    /// The session as it is now; panics when it does not exist.
    pub async fn get(&self, name: &str) -> TaskSession {
        self.sessions()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get TaskSession {name}: {e}"))
    }

    /// The session's status as it is now; panics when it has none.
    pub async fn status(&self, name: &str) -> TaskSessionStatus {
        self.get(name)
            .await
            .status
            .unwrap_or_else(|| panic!("TaskSession {name} has no status"))
    }

    /// The session's ExecutorRunning as it is now; panics when it does not exist.
    pub async fn executor(&self, name: &str) -> ExecutorRunning {
        self.executors().get(name).await.expect("ExecutorRunning")
    }

    /// Waits (see [`super::wait_for`]) until `cond` holds for the ExecutorRunning `name`; the
    /// ExecutorRunning then. For conditions that hold only on an existing one.
    pub async fn wait_executor(
        &self,
        name: &str,
        what: &str,
        cond: impl Condition<ExecutorRunning>,
    ) -> ExecutorRunning {
        super::wait_for(&self.executors(), name, what, cond)
            .await
            .expect("ExecutorRunning")
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

    /// Creates `ts` (made with [`Sessions::new_session`] and changed by the test).
    pub async fn create_session(&self, ts: &TaskSession) -> TaskSession {
        self.sessions()
            .create(&PostParams::default(), ts)
            .await
            .unwrap_or_else(|e| panic!("create TaskSession {}: {e}", ts.name_any()))
    }

    /// A session without a first prompt (it boots idle) on a [`template_workspace`], with
    /// `repository` as its `spec.repository`.
    pub async fn create_with_repository(
        &self,
        name: &str,
        agent: &str,
        repository: serde_json::Value,
    ) -> TaskSession {
        let mut ts = self.new_session_with_task(name, agent, None, template_workspace());
        ts.spec.repository = Some(serde_json::from_value(repository).expect("repository"));
        self.create_session(&ts).await
    }

    /// [`Sessions::create`] with `task` as the first prompt, or none.
    pub async fn create_with_task(
        &self,
        name: &str,
        agent: &str,
        task: Option<&str>,
    ) -> TaskSession {
        let ts = self.new_session_with_task(name, agent, task, template_workspace());
        self.create_session(&ts).await
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
        self.executor(name)
            .await
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

    /// The names of the session's live pods (see [`Sessions::live_pods`]).
    pub async fn live_pod_names(&self, name: &str) -> Vec<String> {
        self.live_pods(name)
            .await
            .iter()
            .map(|p| p.name_any())
            .collect()
    }

    /// The session's one live pod; panics (naming them) unless there is exactly one.
    pub async fn the_pod(&self, name: &str) -> Pod {
        let mut pods = self.live_pods(name).await;
        assert_eq!(
            pods.len(),
            1,
            "exactly one live agentctl pod of {name}: {:?}",
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        pods.remove(0)
    }

    /// Waits up to 30 s until the session has no live pod; `what` (the reason there should be
    /// none) is the failure's message.
    pub async fn wait_no_live_pods(&self, name: &str, what: &str) {
        let none = async || self.live_pods(name).await.is_empty();
        poll_until(PODS_GONE_WITHIN, Duration::from_millis(250), what, none).await;
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

    /// Asserts that the session has an Event with `reason`, waiting up to 15 s for it as
    /// [`Sessions::event_reasons_with`] does; returns the reasons, oldest first.
    pub async fn assert_event(&self, name: &str, reason: &str) -> Vec<String> {
        self.assert_events_in_order(name, &[reason]).await
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
        self.events(name)
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect()
    }

    /// The session's Events, oldest first.
    pub async fn events(&self, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut list = events
            .list(&ListParams::default().fields(&format!(
                "involvedObject.name={name},involvedObject.kind=TaskSession"
            )))
            .await
            .expect("list events")
            .items;
        list.sort_by_key(occurred);
        list
    }

    /// Requests a resume with `token`, as a user would (see [`Sessions::annotate_as_user`]).
    pub async fn annotate(&self, name: &str, token: &str) {
        self.annotate_as_user(name, json!({RESUME_ANNOTATION: token}))
            .await;
    }

    /// Merges `annotations` into the session's, as a user would (a field manager that does not
    /// start with "kubectl": Flux prunes fields owned by those).
    pub async fn annotate_as_user(&self, name: &str, annotations: serde_json::Value) {
        let patch = json!({"metadata": {"annotations": annotations}});
        self.sessions()
            .patch(
                name,
                &PatchParams::apply("kandev-e2e-user"),
                &Patch::Merge(&patch),
            )
            .await
            .expect("annotate");
    }

    /// Merge-patches the session with `patch` (the default field manager); the API server's
    /// answer.
    pub async fn merge(
        &self,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<TaskSession, kube::Error> {
        self.sessions()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
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

/// The workspace of [`Sessions::create`]: a 1Gi PVC made from a template.
pub fn template_workspace() -> serde_json::Value {
    json!({"template": {"size": "1Gi"}})
}

/// The session has a status, and `holds` for it.
pub fn status_where(holds: impl Fn(&TaskSessionStatus) -> bool) -> impl Condition<TaskSession> {
    move |ts: Option<&TaskSession>| ts.and_then(|t| t.status.as_ref()).is_some_and(&holds)
}

/// The ExecutorRunning has a status, and `holds` for it.
pub fn executor_status_where(
    holds: impl Fn(&ExecutorRunningStatus) -> bool,
) -> impl Condition<ExecutorRunning> {
    move |er: Option<&ExecutorRunning>| er.and_then(|e| e.status.as_ref()).is_some_and(&holds)
}

pub fn state_is(state: SessionState) -> impl Condition<TaskSession> {
    status_where(move |s| s.state == state)
}

pub fn handled(token: &str) -> impl Condition<TaskSession> + '_ {
    status_where(move |s| s.last_handled_resume_request.as_deref() == Some(token))
}

pub fn needs_resume() -> impl Condition<TaskSession> {
    status_where(|s| s.needs_resume)
}

/// Whether `status` has condition `type_` with this status ("True", "False") and reason.
pub fn has_condition(status: &TaskSessionStatus, type_: &str, value: &str, reason: &str) -> bool {
    conditions::find(&status.conditions, type_)
        .is_some_and(|c| c.status == value && c.reason == reason)
}

/// The session's condition `type_` has this status ("True", "False") and reason.
pub fn condition_is<'a>(
    type_: &'a str,
    value: &'a str,
    reason: &'a str,
) -> impl Condition<TaskSession> + 'a {
    status_where(move |s| has_condition(s, type_, value, reason))
}

/// Condition `type_` of `status`; panics (with the status) when there is none.
pub fn condition<'a>(status: &'a TaskSessionStatus, type_: &str) -> &'a StatusCondition {
    conditions::find(&status.conditions, type_)
        .unwrap_or_else(|| panic!("no condition {type_} in {status:#?}"))
}

/// Asserts that condition `type_` of `status` has `expected` as its (status, reason); returns
/// the condition.
pub fn assert_condition<'a>(
    status: &'a TaskSessionStatus,
    type_: &str,
    expected: (&str, &str),
) -> &'a StatusCondition {
    let found = condition(status, type_);
    assert_eq!(
        (found.status.as_str(), found.reason.as_str()),
        expected,
        "{type_}: {found:?} in {status:#?}"
    );
    found
}
