//! The order of the reconciler's writes, without a cluster: a recording fake API server answers
//! every request of real reconcile passes (`Session::load(..).apply()`, the same code the
//! controller runs) and keeps them in order.
//!
//! What the e2e tests can only see from outside is proved here request by request:
//! - `STARTING` (and a latched request) is persisted before the pod of a launch is created; a
//!   launch without its workspace creates none;
//! - a pod is deleted only after the status that explains why was written (a stall, a failure,
//!   a superseded request, an agent that counts as lost), and not at all when that write
//!   failed;
//! - the ExecutorRunning is marked lost (or stopped) before the session's status says so;
//! - every status write carries the resourceVersion the reconcile decided on, and is a
//!   server-side apply of the operator's field manager;
//! - what the agent's journal says is written by the reconcile it wakes, before the session's
//!   status that follows from it, and only for the pod the executor runs in.

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::*;
use crate::acp::AcpLimits;
use crate::acp::budget::MemoryBudget;
use crate::agents::AgentRegistry;
use crate::api::conditions::{self, Want};
use crate::api::{
    AgentActivity, ExecutorRunningSpec, ExecutorRunningStatus, SessionEnd, TaskSessionSpec,
};
use crate::controller::context::OperatorSettings;
use crate::controller::events::{Publisher, Queue as EventQueue};
use crate::controller::expectations::Expectations;
use crate::controller::follower::Followers;
use crate::resume::LaunchEnd;

/// One request the fake API server answered.
#[derive(Clone, Debug)]
struct Call {
    method: String,
    path: String,
    query: String,
    body: Value,
}

impl Call {
    /// `PATCH tasksessions/s/status`, the resource and what follows the namespace.
    fn short(&self) -> String {
        let rest = self
            .path
            .split("/namespaces/ns/")
            .nth(1)
            .unwrap_or(&self.path);
        format!("{} {rest}", self.method)
    }
}

/// The fake API server: records every call; answers writes with the object written (a status
/// patch of the session bumps its resourceVersion), reads with 404. `conflict_on_status` answers
/// the session's status writes with 409; `existing_pod` is there already.
#[derive(Clone, Default)]
struct FakeApi {
    calls: Arc<Mutex<Vec<Call>>>,
    session: Arc<Mutex<Value>>,
    conflict_on_status: bool,
    /// A pod that exists already: creating a pod answers 409, reading one answers this.
    existing_pod: Option<Value>,
    /// Creating a pod answers this code with this message.
    refuse_pods: Option<(u16, &'static str)>,
    /// The ExecutorRunning CRD is older than the operator: an apply of its status is refused
    /// for a field it does not declare.
    older_executor_schema: bool,
}

impl FakeApi {
    fn client(&self) -> Client {
        let api = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body.collect().await?.to_bytes();
                let call = Call {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_string(),
                    query: parts.uri.query().unwrap_or_default().to_string(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                let (status, answer) = api.answer(&call);
                api.calls.lock().expect("calls").push(call);
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(answer.to_string())))?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
            }
        });
        Client::new(service, "ns")
    }

    fn answer(&self, call: &Call) -> (StatusCode, Value) {
        let path = call.path.as_str();
        match call.method.as_str() {
            "PATCH" if path.ends_with("/tasksessions/s/status") => {
                if self.conflict_on_status {
                    return status_error(409, "Conflict");
                }
                let mut session = self.session.lock().expect("session");
                session["status"] = call.body["status"].clone();
                let version = next_version(&session["metadata"]["resourceVersion"]);
                session["metadata"]["resourceVersion"] = version;
                (StatusCode::OK, session.clone())
            }
            "PATCH"
                if path.contains("/executorrunnings/")
                    && self.older_executor_schema
                    && call.query.contains("force=true") =>
            {
                status_error(
                    500,
                    "failed to create typed patch object (/; kandev.dev/v1alpha1, Kind=ExecutorRunning): .status.sessionConfig: field not declared in schema",
                )
            }
            "PATCH" if path.contains("/executorrunnings/") => {
                let mut er =
                    serde_json::to_value(ExecutorRunning::new("s", ExecutorRunningSpec::default()))
                        .expect("executor");
                er["status"] = call.body["status"].clone();
                er["metadata"]["resourceVersion"] =
                    next_version(&call.body["metadata"]["resourceVersion"]);
                (StatusCode::OK, er)
            }
            "POST" if path.ends_with("/pods") && self.refuse_pods.is_some() => {
                let (code, message) = self.refuse_pods.unwrap_or_default();
                status_error(code, message)
            }
            "POST" if path.ends_with("/pods") && self.existing_pod.is_some() => {
                status_error(409, "AlreadyExists")
            }
            "GET" if path.contains("/pods/") && !path.ends_with("/exec") => {
                match &self.existing_pod {
                    Some(pod) => (StatusCode::OK, pod.clone()),
                    None => status_error(404, "NotFound"),
                }
            }
            "POST" | "DELETE" => {
                let mut object = call.body.clone();
                if object.is_null() || call.method == "DELETE" {
                    object =
                        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone"}});
                }
                object["metadata"]["resourceVersion"] = json!("1");
                let created = if call.method == "POST" {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                (created, object)
            }
            _ => status_error(404, "NotFound"),
        }
    }

    /// The writes, Events left out (they are published beside the reconcile, in any order).
    fn writes(&self) -> Vec<Call> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|c| c.method != "GET" && !c.path.contains("/events"))
            .cloned()
            .collect()
    }

    fn write_names(&self) -> Vec<String> {
        self.writes().iter().map(Call::short).collect()
    }

    /// The writes, in order, are exactly `expected` (shown one a line when they are not).
    fn assert_writes<S: AsRef<str>>(&self, expected: &[S]) {
        let writes = self.write_names();
        let expected: Vec<&str> = expected.iter().map(AsRef::as_ref).collect();
        assert_eq!(writes, expected, "{writes:#?}");
    }
}

/// The resourceVersion a write based on `version` gives (numbers as strings; none counts as 0).
fn next_version(version: &Value) -> Value {
    let version = version
        .as_str()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    json!((version + 1).to_string())
}

fn status_error(code: u16, reason: &str) -> (StatusCode, Value) {
    (
        StatusCode::from_u16(code).expect("code"),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": reason, "reason": reason, "code": code}),
    )
}

/// A cluster of one session as the caches show it.
struct World {
    api: FakeApi,
    ctx: Context,
    pods: Writer<Pod>,
    executors: Writer<ExecutorRunning>,
    claims: Writer<PartialObjectMeta<PersistentVolumeClaim>>,
}

impl World {
    fn new(api: FakeApi) -> Self {
        Self::with_settings(api, |_| {})
    }

    fn with_settings(api: FakeApi, tune: impl FnOnce(&mut OperatorSettings)) -> Self {
        let client = api.client();
        let (pods, pods_writer) = reflector::store();
        let (executors, executors_writer) = reflector::store();
        let (claims, mut claims_writer) =
            reflector::store::<PartialObjectMeta<PersistentVolumeClaim>>();
        claims_writer.apply_watcher_event(&watcher::Event::Apply(workspace_claim()));
        let settings = OperatorSettings {
            pod: pods::PodSettings {
                default_image: "agentctl:test".into(),
                run_as_user: 1000,
                ..Default::default()
            },
            watch_namespaces: vec![],
            resync: Duration::from_secs(300),
            acp_timeout: Duration::from_secs(30),
            restore_timeout: Duration::from_secs(120),
            acp_limits: AcpLimits::default(),
            acp_memory: MemoryBudget::new(1 << 30),
            max_concurrent_reconciles: 1,
            launch_deadline: Duration::from_secs(120),
            end_grace: Duration::from_secs(60),
            agent_unreachable_after: None,
            node_lost_after: None,
            catch_up_execs_per_second: 0,
            journal_catch_up_every: None,
        };
        let mut settings = settings;
        tune(&mut settings);
        let ctx = Context {
            events: EventQueue::start(Publisher::new(client.clone(), MANAGER, None), 1),
            streams: client.clone(),
            client,
            agents: AgentRegistry::builtin().expect("profiles"),
            followers: Followers::new(pods.clone(), settings.probe()).0,
            settings,
            executors,
            pods,
            pod_index: Arc::default(),
            claims,
            nodes: None,
            expectations: Expectations::default(),
        };
        Self {
            api,
            ctx,
            pods: pods_writer,
            executors: executors_writer,
            claims: claims_writer,
        }
    }

    /// The session's workspace PVC is not there (the caches show it by default).
    fn without_workspace(mut self) -> Self {
        let gone = watcher::Event::Delete(workspace_claim());
        self.claims.apply_watcher_event(&gone);
        self
    }

    fn add_pod(&mut self, pod: Pod) {
        let event = watcher::Event::Apply(pod);
        self.ctx.pod_index.apply(&event);
        self.pods.apply_watcher_event(&event);
    }

    fn add_executor(&mut self, status: ExecutorRunningStatus) {
        let mut er = ExecutorRunning::new("s", ExecutorRunningSpec::default());
        er.metadata.namespace = Some("ns".into());
        er.metadata.resource_version = Some("3".into());
        er.status = Some(status);
        self.executors
            .apply_watcher_event(&watcher::Event::Apply(er));
    }

    /// `ts`'s event follower posts `news`.
    fn post_news(&self, ts: &TaskSession, news: crate::resume::JournalNews) {
        self.ctx.followers.post(&ObjectRef::from_obj(ts), news);
    }

    /// One reconcile pass over `ts`, as the fake API server holds it now.
    async fn pass(&self, ts: &TaskSession) -> Result<Requeue, Error> {
        self.session(ts).apply().await
    }

    fn session(&self, ts: &TaskSession) -> Session<'_> {
        *self.api.session.lock().expect("session") = serde_json::to_value(ts).expect("session");
        Session::load(Arc::new(ts.clone()), &self.ctx).expect("session")
    }
}

/// The PVC `s-workspace`, as the claim cache holds it.
fn workspace_claim() -> PartialObjectMeta<PersistentVolumeClaim> {
    let mut claim = PartialObjectMeta::<PersistentVolumeClaim>::default();
    claim.metadata.name = Some("s-workspace".into());
    claim.metadata.namespace = Some("ns".into());
    claim
}

fn task_session(status: TaskSessionStatus) -> TaskSession {
    let mut ts = TaskSession::new(
        "s",
        TaskSessionSpec {
            agent: "claude-code".into(),
            task_description: Some("fix it".into()),
            ..Default::default()
        },
    );
    ts.metadata.namespace = Some("ns".into());
    ts.metadata.uid = Some("uid-s".into());
    ts.metadata.generation = Some(1);
    ts.metadata.resource_version = Some("7".into());
    ts.metadata.finalizers = Some(vec![FINALIZER.into()]);
    ts.status = Some(status);
    ts
}

/// A pod of the session that has waited, `Pending`, for an hour.
fn pending_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "creationTimestamp": Time(Timestamp::now() - Duration::from_secs(3600)),
            "ownerReferences": [{"apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
                "name": "s", "uid": "uid-s", "controller": true}]},
        "status": {"phase": "Pending"},
    }))
    .expect("pod")
}

/// A pod of the session whose agentctl runs (Ready).
fn running_pod(name: &str) -> Pod {
    let mut pod = pending_pod(name);
    pod.status = serde_json::from_value(json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {}}}],
    }))
    .expect("status");
    pod
}

/// A world whose session's agent runs (its first launch's pod, Ready) with `activity` and a
/// saved token; the pod's name.
fn agent_running(activity: AgentActivity) -> (World, String) {
    let mut world = World::new(FakeApi::default());
    let name = names::pod_name("s", INITIAL_LAUNCH);
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        activity: Some(activity),
        ..Default::default()
    });
    world.add_pod(running_pod(&name));
    (world, name)
}

/// A session in `WAITING_FOR_INPUT` that has been ending (`end`) for `for_secs`.
fn ending(end: SessionEnd, for_secs: u64) -> TaskSession {
    let since = Timestamp::now() - Duration::from_secs(for_secs);
    let conditions = conditions::merge(
        &[],
        &[Want::new(conditions::RECONCILING, true, "Ending", "ending")],
        Some(1),
        since,
    );
    let mut ts = task_session(TaskSessionStatus {
        state: SessionState::WaitingForInput,
        conditions,
        ..Default::default()
    });
    ts.spec.end = Some(end);
    ts
}

/// A session waiting for input, as after its launch.
fn waiting() -> TaskSessionStatus {
    TaskSessionStatus {
        state: SessionState::WaitingForInput,
        ..Default::default()
    }
}

fn starting(request: &str) -> TaskSessionStatus {
    TaskSessionStatus {
        state: SessionState::Starting,
        previous_state: Some(SessionState::WaitingForInput),
        active_resume_request: Some(request.into()),
        ..Default::default()
    }
}

/// The writes of a first launch up to its pod (the executor, `STARTING`, the pod), then `more`.
fn first_launch(more: &[&str]) -> Vec<String> {
    [
        "POST executorrunnings",
        "PATCH tasksessions/s/status",
        "POST pods",
    ]
    .iter()
    .chain(more)
    .map(|w| w.to_string())
    .collect()
}

/// The condition of `type_` in a written status (null when there is none).
fn written_condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_default()
}

/// Every status write of the session names the resourceVersion its reconcile read: the
/// loaded one first, then the one its own previous write returned.
fn assert_preconditions(api: &FakeApi, first: u64) {
    let versions: Vec<Value> = api
        .writes()
        .iter()
        .filter(|c| c.path.ends_with("/tasksessions/s/status"))
        .map(|c| c.body["metadata"]["resourceVersion"].clone())
        .collect();
    assert!(!versions.is_empty(), "no status write");
    for (i, version) in versions.iter().enumerate() {
        assert_eq!(
            *version,
            json!((first + i as u64).to_string()),
            "{versions:?}"
        );
    }
    for call in api.writes().iter().filter(|c| c.path.ends_with("/status")) {
        assert!(
            call.query.contains(&format!("fieldManager={MANAGER}&"))
                || call.query.ends_with(&format!("fieldManager={MANAGER}")),
            "{} without the field manager: {}",
            call.short(),
            call.query
        );
        assert!(
            call.query.contains("force=true"),
            "{}: not an apply",
            call.short()
        );
        if call.path.contains("/executorrunnings/") {
            assert!(
                call.body["metadata"]["resourceVersion"].is_string(),
                "{} without a precondition: {}",
                call.short(),
                call.body
            );
        }
    }
}

#[tokio::test]
async fn a_launch_persists_starting_before_it_creates_the_pod() {
    let world = World::new(FakeApi::default());
    let ts = task_session(TaskSessionStatus::default());
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&first_launch(&[]));
    let calls = world.api.writes();
    assert_eq!(calls[1].body["status"]["state"], "STARTING");
    assert_eq!(
        calls[2].body["metadata"]["name"],
        names::pod_name("s", INITIAL_LAUNCH)
    );
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_stalled_launch_says_why_before_its_pod_is_deleted() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(starting("r1"));
    world.add_pod(pending_pod(&names::pod_name("s", "r1")));
    world.pass(&ts).await.expect("pass");
    let pod = format!("DELETE pods/{}", names::pod_name("s", "r1"));
    world
        .api
        .assert_writes(&["PATCH tasksessions/s/status", pod.as_str()]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(status["needsResume"], true);
    assert_eq!(status["lastHandledResumeRequest"], "r1");
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_pod_is_not_deleted_when_the_status_that_explains_it_is_refused() {
    let mut world = World::new(FakeApi {
        conflict_on_status: true,
        ..Default::default()
    });
    let ts = task_session(starting("r1"));
    world.add_pod(pending_pod(&names::pod_name("s", "r1")));
    let err = world.pass(&ts).await.expect_err("a conflict");
    assert_eq!(err.metric_label(), "conflict");
    world.api.assert_writes(&["PATCH tasksessions/s/status"]);
}

#[tokio::test]
async fn a_launch_that_failed_says_so_before_its_pod_is_deleted() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(starting("r1"));
    let name = names::pod_name("s", "r1");
    world.add_pod(pending_pod(&name));
    let end = LaunchEnd::Failed {
        pod: Some(name.clone()),
        code: "LaunchFailed",
        event: "LaunchFailed",
        reason: "starting the agent failed: internal_error".into(),
    };
    world.session(&ts).end_launch(end).await.expect("applied");
    let pod = format!("DELETE pods/{name}");
    world
        .api
        .assert_writes(&["PATCH tasksessions/s/status", pod.as_str()]);
    assert_eq!(world.api.writes()[0].body["status"]["state"], "FAILED");
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_loss_marks_the_executor_lost_before_the_session_says_so() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(waiting());
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        resumable: true,
        pod_name: Some("s-agent-gone".into()),
        ..Default::default()
    });
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[
        "PATCH executorrunnings/s/status",
        "PATCH tasksessions/s/status",
    ]);
    let calls = world.api.writes();
    assert_eq!(calls[0].body["status"]["status"], "Lost");
    assert_eq!(calls[1].body["status"]["needsResume"], true);
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_resume_request_is_latched_before_its_pod_is_created() {
    let mut world = World::new(FakeApi::default());
    let mut ts = task_session(TaskSessionStatus {
        state: SessionState::WaitingForInput,
        needs_resume: true,
        ..Default::default()
    });
    ts.metadata.annotations = Some([(RESUME_ANNOTATION.to_string(), "r1".to_string())].into());
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        resumable: true,
        pod_uid: Some("uid-old".into()),
        ..Default::default()
    });
    world.pass(&ts).await.expect("pass");
    world
        .api
        .assert_writes(&["PATCH tasksessions/s/status", "POST pods"]);
    let calls = world.api.writes();
    assert_eq!(calls[0].body["status"]["activeResumeRequest"], "r1");
    assert_eq!(calls[0].body["status"]["state"], "STARTING");
    assert_eq!(
        calls[1].body["metadata"]["name"],
        names::pod_name("s", "r1")
    );
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_launch_that_ends_with_a_running_agent_writes_only_the_status() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(starting("r1"));
    let name = names::pod_name("s", "r1");
    world.add_pod(pending_pod(&name));
    let end = LaunchEnd::Running {
        pod: name,
        state: SessionState::WaitingForInput,
        resumed: true,
        reason: "Restored",
        message: "restored ACP session tok with session/load".into(),
        event: crate::resume::Note::normal("Resumed", "Restore", "restored"),
        task: None,
    };
    world.session(&ts).end_launch(end).await.expect("applied");
    world.api.assert_writes(&["PATCH tasksessions/s/status"]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(status["state"], "WAITING_FOR_INPUT");
    assert_eq!(status["lastHandledResumeRequest"], "r1");
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn an_ended_session_stops_its_executor_before_it_says_so() {
    let mut world = World::new(FakeApi::default());
    let ending = conditions::merge(
        &[],
        &[Want::new(conditions::RECONCILING, true, "Ending", "ending")],
        Some(1),
        Timestamp::now(),
    );
    let mut ts = task_session(TaskSessionStatus {
        state: SessionState::WaitingForInput,
        conditions: ending,
        ..Default::default()
    });
    ts.spec.end = Some(SessionEnd::Cancelled);
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        ..Default::default()
    });
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[
        "PATCH executorrunnings/s/status",
        "PATCH tasksessions/s/status",
    ]);
    let calls = world.api.writes();
    assert_eq!(calls[0].body["status"]["status"], "Stopped");
    assert_eq!(calls[1].body["status"]["state"], "CANCELLED");
    assert_preconditions(&world.api, 7);
}

/// A fresh start asked for while a restore launches: a launch of another kind supersedes it.
#[tokio::test]
async fn a_superseded_request_is_handled_before_its_pod_is_deleted() {
    let mut world = World::new(FakeApi::default());
    let mut ts = task_session(starting("r1"));
    ts.metadata.annotations = Some(
        [
            (RESUME_ANNOTATION.to_string(), "r2".to_string()),
            (RESUME_FRESH_ANNOTATION.to_string(), "r2".to_string()),
        ]
        .into(),
    );
    let old = names::pod_name("s", "r1");
    world.add_pod(pending_pod(&old));
    world.pass(&ts).await.expect("pass");
    let pod = format!("DELETE pods/{old}");
    world
        .api
        .assert_writes(&["PATCH tasksessions/s/status", pod.as_str()]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(status["activeResumeRequest"], "r2");
    assert_eq!(status["lastHandledResumeRequest"], "r1");
    assert_preconditions(&world.api, 7);
}

/// The same request again while its launch progresses: one status write records that it
/// joined; the launch's pod stays.
#[tokio::test]
async fn a_joined_request_costs_one_status_write_and_keeps_the_launchs_pod() {
    let mut world = World::new(FakeApi::default());
    let mut ts = task_session(starting("r1"));
    ts.metadata.annotations = Some([(RESUME_ANNOTATION.to_string(), "r2".to_string())].into());
    world.add_pod(pending_pod(&names::pod_name("s", "r1")));
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&["PATCH tasksessions/s/status"]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(status["activeResumeRequest"], "r1");
    assert_eq!(status["joinedResumeRequests"], json!(["r2"]));
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_suspension_marks_the_executor_lost_before_the_session_says_so() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(waiting());
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        resumable: true,
        ..Default::default()
    });
    let mut pod = pending_pod(&names::pod_name("s", INITIAL_LAUNCH));
    pod.status = serde_json::from_value(json!({
        "phase": "Succeeded",
        "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0,
            "message": "Suspended: idle for 600s (no prompt, no client)"}}}],
    }))
    .expect("status");
    world.add_pod(pod);
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[
        "PATCH executorrunnings/s/status",
        "PATCH tasksessions/s/status",
    ]);
    let calls = world.api.writes();
    assert_eq!(calls[0].body["status"]["status"], "Lost");
    assert_eq!(calls[1].body["status"]["resumeReason"], "suspended");
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_first_launch_without_its_workspace_creates_no_pod() {
    let world = World::new(FakeApi::default());
    let mut ts = task_session(TaskSessionStatus::default());
    ts.spec.workspace.claim_name = Some("not-there".into());
    world.pass(&ts).await.expect("pass");
    world
        .api
        .assert_writes(&["POST executorrunnings", "PATCH tasksessions/s/status"]);
    let status = &world.api.writes()[1].body["status"];
    assert_ne!(status["state"], "STARTING");
    assert_eq!(
        written_condition(status, "Reconciling")["reason"],
        "WaitingForWorkspace"
    );
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn an_end_says_so_before_anything_stops() {
    let world = World::new(FakeApi::default());
    let mut ts = task_session(starting("r1"));
    ts.spec.end = Some(SessionEnd::Completed);
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&["PATCH tasksessions/s/status"]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(status["lastHandledResumeRequest"], "r1");
    assert_eq!(status["activeResumeRequest"], Value::Null);
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn an_unreachable_agent_is_said_lost_before_its_pod_is_deleted() {
    let mut world = World::with_settings(FakeApi::default(), |settings| {
        settings.agent_unreachable_after = Some(Duration::from_secs(60));
    });
    let ts = task_session(waiting());
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        resumable: true,
        ..Default::default()
    });
    let name = names::pod_name("s", INITIAL_LAUNCH);
    let mut pod = pending_pod(&name);
    pod.status = serde_json::from_value(json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False",
            "lastTransitionTime": Time(Timestamp::now() - Duration::from_secs(600))}],
        "containerStatuses": [{"name": "agentctl", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"running": {}}}],
    }))
    .expect("status");
    world.add_pod(pod);
    world.pass(&ts).await.expect("pass");
    let pod = format!("DELETE pods/{name}");
    world
        .api
        .assert_writes(&["PATCH tasksessions/s/status", pod.as_str()]);
    let calls = world.api.writes();
    let running = written_condition(&calls[0].body["status"], "AgentRunning");
    assert_eq!(running["reason"], "AgentUnreachable");
    // Only the pod that was judged: the deletion names its UID.
    assert_eq!(calls[1].body["preconditions"]["uid"], format!("uid-{name}"));
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_launch_adopts_the_pod_an_earlier_pass_created() {
    let name = names::pod_name("s", INITIAL_LAUNCH);
    let world = World::new(FakeApi {
        existing_pod: Some(serde_json::to_value(pending_pod(&name)).expect("pod")),
        ..Default::default()
    });
    let ts = task_session(TaskSessionStatus::default());
    let requeue = world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&first_launch(&[]));
    let read = world
        .api
        .calls
        .lock()
        .expect("calls")
        .iter()
        .any(|c| c.method == "GET" && c.path.ends_with(&format!("/pods/{name}")));
    assert!(read, "the existing pod was not read");
    // Adopted: judged like any pod of this launch once the cache has it.
    assert_eq!(requeue, Requeue::After(crate::resume::RECHECK));
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_pod_name_taken_by_another_ends_the_launch_and_leaves_that_pod_alone() {
    let name = names::pod_name("s", INITIAL_LAUNCH);
    let mut other = serde_json::to_value(pending_pod(&name)).expect("pod");
    other["metadata"]["ownerReferences"][0]["uid"] = json!("uid-someone-else");
    let world = World::new(FakeApi {
        existing_pod: Some(other),
        ..Default::default()
    });
    let ts = task_session(TaskSessionStatus::default());
    world.pass(&ts).await.expect("pass");
    world
        .api
        .assert_writes(&first_launch(&["PATCH tasksessions/s/status"]));
    let status = &world.api.writes()[3].body["status"];
    assert_eq!(status["needsResume"], true);
    assert_eq!(
        written_condition(status, "Stalled")["reason"],
        "PodNameTaken"
    );
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn an_end_stops_an_idle_agent_and_writes_nothing_before_it_is_gone() {
    let (world, name) = agent_running(AgentActivity::Idle);
    world
        .pass(&ending(SessionEnd::Completed, 0))
        .await
        .expect("pass");
    let pod = format!("DELETE pods/{name}");
    world.api.assert_writes(&[pod.as_str()]);
}

#[tokio::test]
async fn an_end_whose_cancel_gets_no_answer_stops_the_agent() {
    let (world, name) = agent_running(AgentActivity::Working);
    world
        .pass(&ending(SessionEnd::Cancelled, 0))
        .await
        .expect("pass");
    let exec = world
        .api
        .calls
        .lock()
        .expect("calls")
        .iter()
        .any(|c| c.path.ends_with(&format!("/pods/{name}/exec")));
    assert!(exec, "no session/cancel was tried");
    let pod = format!("DELETE pods/{name}");
    world.api.assert_writes(&[pod.as_str()]);
}

#[tokio::test]
async fn a_completed_end_lets_a_running_prompt_finish_within_the_grace() {
    let (world, _) = agent_running(AgentActivity::Working);
    let requeue = world
        .pass(&ending(SessionEnd::Completed, 10))
        .await
        .expect("pass");
    assert!(
        world.api.write_names().is_empty(),
        "{:?}",
        world.api.write_names()
    );
    assert!(matches!(requeue, Requeue::After(left) if left <= crate::resume::RECHECK));
}

#[tokio::test]
async fn a_pod_the_api_server_refuses_ends_the_launch_with_its_words() {
    let world = World::new(FakeApi {
        refuse_pods: Some((422, "spec.containers[0].image: Invalid value")),
        ..Default::default()
    });
    let ts = task_session(TaskSessionStatus::default());
    world.pass(&ts).await.expect("pass");
    world
        .api
        .assert_writes(&first_launch(&["PATCH tasksessions/s/status"]));
    let status = &world.api.writes()[3].body["status"];
    let stalled = written_condition(status, "Stalled");
    assert_eq!(stalled["reason"], "InvalidSpec");
    let message = stalled["message"].as_str().unwrap_or_default();
    assert!(message.contains("Invalid value"), "{message}");
    assert_eq!(status["needsResume"], true);
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_workspace_from_its_template_is_created_before_the_launch_starts() {
    let world = World::new(FakeApi::default()).without_workspace();
    let mut ts = task_session(TaskSessionStatus::default());
    ts.spec.workspace.template = Some(crate::api::WorkspaceTemplate {
        size: "1Gi".into(),
        ..Default::default()
    });
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[
        "POST executorrunnings",
        "POST persistentvolumeclaims",
        "PATCH tasksessions/s/status",
        "POST pods",
    ]);
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_resumed_session_whose_workspace_is_gone_fails_without_a_pod() {
    let mut world = World::new(FakeApi::default()).without_workspace();
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        pod_uid: Some("uid-old".into()),
        ..Default::default()
    });
    let mut ts = task_session(waiting());
    ts.metadata.annotations = Some([(RESUME_ANNOTATION.to_string(), "r1".to_string())].into());
    world.pass(&ts).await.expect("pass");
    // The executor no longer offers a resume, then the status says FAILED, not resumable.
    world.api.assert_writes(&[
        "PATCH executorrunnings/s/status",
        "PATCH tasksessions/s/status",
    ]);
    let writes = world.api.writes();
    assert_eq!(writes[0].body["status"]["resumable"], false);
    let status = &writes[1].body["status"];
    assert_eq!(status["state"], "FAILED");
    assert_eq!(
        written_condition(status, "Stalled")["reason"],
        "WorkspaceLost"
    );
    assert_eq!(
        (&status["needsResume"], &status["isResumable"]),
        (&json!(false), &json!(false))
    );
    assert_eq!(status["lastHandledResumeRequest"], "r1");
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_pod_of_an_earlier_launch_is_deleted_after_the_status_says_so() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(starting("r2"));
    let old = names::pod_name("s", "r1");
    world.add_pod(pending_pod(&old));
    world.pass(&ts).await.expect("pass");
    let pod = format!("DELETE pods/{old}");
    world
        .api
        .assert_writes(&["PATCH tasksessions/s/status", pod.as_str()]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(
        written_condition(status, "Reconciling")["reason"],
        "ReplacingPreviousPod"
    );
    assert_preconditions(&world.api, 7);
}

#[tokio::test]
async fn a_launch_whose_agentctl_does_not_answer_yet_says_so_once_and_deletes_nothing() {
    let mut world = World::new(FakeApi::default());
    let ts = task_session(starting("r1"));
    let name = names::pod_name("s", "r1");
    let mut pod = running_pod(&name);
    // Created a moment ago: well inside the launch deadline.
    pod.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    world.add_pod(pod);
    world.pass(&ts).await.expect("pass");
    let exec = world
        .api
        .calls
        .lock()
        .expect("calls")
        .iter()
        .any(|c| c.path.ends_with(&format!("/pods/{name}/exec")));
    assert!(exec, "no exec into agentctl was tried");
    world.api.assert_writes(&["PATCH tasksessions/s/status"]);
    let status = &world.api.writes()[0].body["status"];
    assert_eq!(status["state"], "STARTING");
    assert_eq!(
        written_condition(status, "Reconciling")["reason"],
        "WaitingForAgentctl"
    );
    assert_preconditions(&world.api, 7);
}

/// The session as the fake API server holds it after the writes so far, which are forgotten.
fn as_written(world: &World) -> TaskSession {
    world.api.calls.lock().expect("calls").clear();
    serde_json::from_value(world.api.session.lock().expect("session").clone()).expect("session")
}

/// A session in `RUNNING` whose agent runs in its first launch's pod, as that launch recorded
/// it and a pass settled it; the pod's UID.
async fn recorded_working(api: FakeApi) -> (World, TaskSession, String) {
    let mut world = World::new(api);
    let name = names::pod_name("s", INITIAL_LAUNCH);
    let pod = running_pod(&name);
    let uid = pod.metadata.uid.clone().expect("uid");
    world.add_executor(ExecutorRunningStatus {
        resume_token: Some("tok".into()),
        resumable: true,
        activity: Some(AgentActivity::Working),
        pod_name: Some(name),
        pod_uid: Some(uid.clone()),
        status: Some(ExecutorPhase::Running),
        ..Default::default()
    });
    world.add_pod(pod);
    let ts = task_session(TaskSessionStatus {
        state: SessionState::Running,
        ..Default::default()
    });
    world.pass(&ts).await.expect("pass");
    let ts = as_written(&world);
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[] as &[&str]);
    (world, ts, uid)
}

/// The agent went idle in pod `uid`, as its event follower read it.
fn idle_news(uid: &str) -> crate::resume::JournalNews {
    crate::resume::JournalNews {
        pod_uid: uid.into(),
        view: crate::resume::AgentView {
            resume_token: Some("tok".into()),
            activity: Some(AgentActivity::Idle),
            cursor: 12,
            ..Default::default()
        },
        seen_at: Timestamp::now(),
        handled_nudge: Some("n1".into()),
    }
}

#[tokio::test]
async fn the_journal_is_written_by_the_reconcile_it_wakes_before_the_status_it_changes() {
    let (world, ts, uid) = recorded_working(FakeApi::default()).await;
    world.post_news(&ts, idle_news(&uid));
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[
        "PATCH executorrunnings/s/status",
        "PATCH tasksessions/s/status",
    ]);
    let writes = world.api.writes();
    let executor = &writes[0].body;
    assert_eq!(executor["metadata"]["resourceVersion"], "3");
    assert_eq!(executor["status"]["activity"], "Idle");
    assert_eq!(executor["status"]["journalCursor"], 12);
    assert_eq!(executor["status"]["handledPromptedAt"], "n1");
    assert_eq!(
        executor["status"]["resumeToken"], "tok",
        "the whole status is applied"
    );
    assert_eq!(writes[1].body["status"]["state"], "WAITING_FOR_INPUT");
    assert_preconditions(&world.api, 8);
    assert_eq!(world.ctx.followers.news(&uid), None, "written once");
    // The next pass, while the cache still shows the executor before the write, decides on
    // the written one: nothing to write.
    let ts = as_written(&world);
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[] as &[&str]);
}

#[tokio::test]
async fn the_journal_of_a_pod_the_executor_no_longer_runs_in_is_not_written() {
    let (world, ts, _) = recorded_working(FakeApi::default()).await;
    world.post_news(&ts, idle_news("uid-of-an-older-pod"));
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[] as &[&str]);
}

#[tokio::test]
async fn an_older_executor_schema_gets_the_status_as_a_merge_patch() {
    let api = FakeApi {
        older_executor_schema: true,
        ..FakeApi::default()
    };
    let (world, ts, uid) = recorded_working(api).await;
    world.post_news(&ts, idle_news(&uid));
    world.pass(&ts).await.expect("pass");
    world.api.assert_writes(&[
        "PATCH executorrunnings/s/status",
        "PATCH executorrunnings/s/status",
        "PATCH tasksessions/s/status",
    ]);
    let merge = &world.api.writes()[1];
    assert!(!merge.query.contains("force=true"), "{}", merge.query);
    assert!(
        merge.query.contains(&format!("fieldManager={MANAGER}")),
        "{}",
        merge.query
    );
    assert_eq!(
        merge.body["metadata"]["resourceVersion"], "3",
        "the same precondition"
    );
    assert_eq!(merge.body["status"]["activity"], "Idle");
    assert_eq!(
        world.api.writes()[2].body["status"]["state"],
        "WAITING_FOR_INPUT"
    );
}
