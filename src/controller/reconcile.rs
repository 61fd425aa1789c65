//! One reconcile of a TaskSession: a pipeline of steps, each of which persists what it did
//! before the next one acts, so an operator restart at any point resumes where it stopped.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, PodSpec};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, PartialObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info, warn};

use super::events::{OutgoingEvent, Publisher, Queue as EventQueue};
use super::expectations::Expectations;
use super::follower::{Followers, Probe};
use super::metrics::{self, Deadlines, ResumeOutcome};
use super::pod_index::PodIndex;
use super::pods::{self, PodSettings};
use crate::acp::budget::{self, MemoryBudget};
use crate::acp::{AcpLimits, AcpTimeouts, PodConnection, RestoreOutcome};
use crate::agents::{AgentProfile, AgentRegistry};
use crate::api::bounds::{AGENT_NAME_MAX, AGENT_TEXT_MAX, BRANCH_MAX, MESSAGE_MAX, NUDGE_MAX, cap};
use crate::api::conditions::{self, Want};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::names;
use crate::api::pod_contract::{self, WORKTREE_META, Worktree};
use crate::api::{
    AgentActivity, ExecutorPhase, ExecutorRunning, MANAGED_LABEL, NegotiatedCapabilities,
    PROMPTED_ANNOTATION, RESUME_ANNOTATION, ResumeReason, SESSION_LABEL, SessionEnd, SessionState,
    TaskSession, TaskSessionStatus, TaskState, WorkspaceRetention, WorktreeStatus,
};
use crate::resume::defaults::launch_within;
use crate::resume::{
    EndFacts, EndStep, InitialPrompt, LaunchFacts, LaunchStall, LaunchStep, Metric, NextAction,
    NodeHealth, PodLiveness, RECHECK, ReachFacts, RequestAnswer, Requeue, RestoreErrorClass,
    ResumeRequest, ResumeRequestFacts, RunningRequest, SessionObjects, Transition, answer_request,
    bounded, build_resume_request, end_step, is_controlled_by, is_new_resume_request, launch_stall,
    launch_step, loaded_at_rest, node_health, not_ready_since, observe, pod_liveness as liveness,
    previous_pod_alive, remember_handled, running_request,
};

/// The one field manager of everything this operator writes with server-side apply.
pub const MANAGER: &str = "kandev-operator";
/// Finalizer that lets the operator stop its event followers before a session goes away.
pub const FINALIZER: &str = "kandev.dev/cleanup";
/// Annotation asking the next resume to ignore the saved token and start fresh.
pub use crate::api::RESUME_FRESH_ANNOTATION;
/// Launch id of a session's first launch (resumes use their request token).
const INITIAL_LAUNCH: &str = "initial";
/// Tasks that publish the reconciles' Events (one object's Events all go to one of them).
const EVENT_WORKERS: usize = 4;

/// Errors of one reconcile; each becomes a log line, a metric label and a requeue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API call failed while {action}: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("TaskSession has no namespace")]
    NoNamespace,
    /// The status was decided on an older version of the TaskSession than the API server's:
    /// nothing was written, the next reconcile decides again on the newer one.
    #[error("the TaskSession changed since this reconcile read it; deciding again")]
    Conflict,
    #[error("the ExecutorRunning, pod and PVC caches have not finished their first list")]
    CacheNotReady,
    /// The reconcile's task panicked or was cancelled; the next reconcile decides again.
    #[error("the reconcile task ended without an answer: {0}")]
    TaskFailed(String),
}

impl Error {
    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Kube { .. } => "kube",
            // Every reconcile runs inside the finalizer helper: label what failed inside it.
            Self::Finalizer(e) => match e.as_ref() {
                F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.metric_label(),
                _ => "finalizer",
            },
            Self::NoNamespace => "no_namespace",
            Self::Conflict => "conflict",
            Self::CacheNotReady => "cache_not_ready",
            Self::TaskFailed(_) => "task_failed",
        }
    }
}

fn kube_err(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

/// For a write of the session's TaskSession with the precondition `version`: 409 is
/// [`Error::Conflict`], and `version` counts as stale until the cache shows a newer one (see
/// [`Expectations::outdated`]).
fn conflict_or<'a>(
    action: &'static str,
    expectations: &'a Expectations,
    uid: &'a str,
    version: Option<&'a str>,
) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| match source {
        kube::Error::Api(status) if status.code == 409 => {
            expectations.outdated(uid, version);
            Error::Conflict
        }
        source => Error::Kube { action, source },
    }
}

/// The workspace PVC as a launch finds it.
enum Workspace {
    Ready,
    /// A resume's workspace is gone or being deleted (the reason).
    Lost(String),
    /// The API server refused the PVC of the template (its message).
    Invalid(String),
    /// A first launch's claimed PVC does not exist (yet), or is being deleted.
    Missing(String),
}

/// An API answer that retrying the same object cannot change: 422 Invalid, 400 BadRequest.
fn is_invalid(code: u16) -> bool {
    matches!(code, 400 | 422)
}

/// A 403 that an admission check gave (Pod Security, a ValidatingAdmissionPolicy, a webhook),
/// not RBAC (whose message is `User "…" cannot create resource …`): like 422, retrying the same
/// pod cannot help until the spec or the settings change.
fn refused_by_admission(code: u16, message: &str) -> bool {
    code == 403 && !message.contains("\" cannot ")
}

/// Settings of the running operator.
#[derive(Clone, Debug)]
pub struct OperatorSettings {
    pub pod: PodSettings,
    /// Namespaces whose sessions this operator serves; empty: every namespace.
    pub watch_namespaces: Vec<String>,
    /// How often a steady session is re-evaluated even without a watch event.
    pub resync: Duration,
    /// Timeout of opening the exec into an agent pod and of `initialize`.
    pub acp_timeout: Duration,
    /// Timeout of the whole restore, `session/resume` → `session/load` → `session/new` (a load
    /// replays the whole transcript before it answers).
    pub restore_timeout: Duration,
    /// Memory bounds of each ACP connection (lines, replay budget).
    pub acp_limits: AcpLimits,
    /// The one budget every restore's lines are reserved from ([`crate::acp::budget`]).
    pub acp_memory: MemoryBudget,
    /// Sessions reconciled at the same time, at most.
    pub max_concurrent_reconciles: u16,
    /// From the agentctl pod's creation to agentctl answering exec, at most; then the launch is
    /// stalled.
    pub launch_deadline: Duration,
    /// How long a session that ends `Completed` lets a running prompt finish.
    pub end_grace: Duration,
    /// A running pod that has not been Ready (its readiness probe of agentctl fails) for this
    /// long counts as lost (`AgentUnreachable`); `None`: never.
    pub agent_unreachable_after: Option<Duration>,
    /// A running pod whose node is gone or not Ready for this long counts as lost
    /// (`NodeLost`); `None`: nodes are not watched.
    pub node_lost_after: Option<Duration>,
    /// Journal catch-ups (`agentctl events` execs) opened per second, at most, working
    /// sessions first; 0: no limit.
    pub catch_up_execs_per_second: u32,
    /// An idle session's journal is read at least this often, for prompts from clients that
    /// do not nudge; `None`: only when nudged.
    pub journal_catch_up_every: Option<Duration>,
}

impl OperatorSettings {
    /// How the event followers contact agentctl.
    pub fn probe(&self) -> Probe {
        Probe {
            catch_up_every: self.journal_catch_up_every,
            answer_within: self.acp_timeout,
            execs_per_second: self.catch_up_execs_per_second,
        }
    }

    /// The longest a session may go on doing the same thing without being at rest, by this
    /// operator's own deadlines, each with two rechecks more; past it `kandev_sessions_overdue`
    /// counts the session, which is stuck:
    /// - a new token on a running pod waits for the pod to be Ready again or to count as lost
    ///   (the readiness probe's failures, then the longest reachability limit);
    /// - a launch waits for a previous pod's deletion and for its own pod's start (a launch
    ///   deadline each), then the exec's opening, `initialize` and the restore;
    /// - an end lets a `Completed` prompt finish, cancels it, and waits for the pod to go.
    pub fn deadlines(&self) -> Deadlines {
        let settle = RECHECK * 2;
        let reach = [self.agent_unreachable_after, self.node_lost_after]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or_default();
        Deadlines {
            requested: reach + pods::NOT_READY_WITHIN + settle,
            launching: launch_within(self.launch_deadline, self.acp_timeout, self.restore_timeout)
                + settle,
            ending: self.end_grace + self.acp_timeout + self.launch_deadline + settle,
        }
    }
}

/// The operator's two API clients, built from one configuration.
#[derive(Clone)]
pub struct Clients {
    /// Requests (get, create, patch, delete, Events, the Lease): every answer has a deadline
    /// (the client's read timeout), so a stalled API server never blocks a reconcile for good.
    pub calls: Client,
    /// Long-lived streams: watches and exec into agent pods, idle for hours by design, so
    /// without a read timeout (watches have their own idle timeout, opening an exec its own
    /// deadline).
    pub streams: Client,
}

/// Shared by every reconcile.
pub struct Context {
    /// For requests; see [`Clients::calls`].
    pub client: Client,
    /// For exec into agent pods; see [`Clients::streams`].
    pub streams: Client,
    pub events: EventQueue,
    pub agents: AgentRegistry,
    pub settings: OperatorSettings,
    /// `agentctl events` followers of running pods.
    pub followers: Followers,
    /// Caches of the child objects, filled by the controller's watches: a reconcile reads
    /// ExecutorRunnings and pods from here, never from the API server.
    pub executors: Store<ExecutorRunning>,
    pub pods: Store<Pod>,
    /// The cached pods by session.
    pub pod_index: Arc<PodIndex>,
    /// Which PVCs exist (metadata only), for the workspace check before a launch.
    pub claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    /// The nodes (without their image lists), when lost nodes are looked for.
    pub nodes: Option<Store<Node>>,
    /// Writes not yet seen in the caches, and retry backoff, per session.
    pub expectations: Expectations,
}

impl Context {
    /// The controller's action for a reconcile's requeue.
    fn action(&self, requeue: Requeue) -> Action {
        match requeue {
            Requeue::Resync => Action::requeue(self.settings.resync),
            Requeue::After(delay) => Action::requeue(delay),
            Requeue::AwaitChange => Action::await_change(),
        }
    }
}

/// Runs the controller until a shutdown signal. Watches TaskSessions (every change, annotation
/// changes included: the resume trigger is an annotation), their ExecutorRunnings and their pods:
/// in all namespaces, or, with [`OperatorSettings::watch_namespaces`], one controller per watched
/// namespace (each with its own caches, so nothing outside those namespaces is listed or cached).
pub async fn run(clients: Clients, agents: AgentRegistry, settings: OperatorSettings) {
    let scopes: Vec<Option<String>> = if settings.watch_namespaces.is_empty() {
        vec![None]
    } else {
        settings
            .watch_namespaces
            .iter()
            .cloned()
            .map(Some)
            .collect()
    };
    // The bound on concurrent reconciles is the operator's, shared by its controllers.
    let per_scope = settings
        .max_concurrent_reconciles
        .div_ceil(u16::try_from(scopes.len()).unwrap_or(u16::MAX))
        .max(1);
    let controllers = scopes.into_iter().map(|namespace| {
        run_scope(
            clients.clone(),
            agents.clone(),
            settings.clone(),
            namespace,
            per_scope,
        )
    });
    futures::future::join_all(controllers).await;
}

/// What the operator keeps of a pod in its cache: no managedFields, and of the spec only the
/// node (liveness, reachability and stalls read the status; the containers, env and volumes
/// that make up most of a pod are never read back).
fn slim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    if let Some(spec) = pod.spec.as_mut() {
        *spec = PodSpec {
            node_name: spec.node_name.take(),
            ..PodSpec::default()
        };
    }
}

/// An API of `K` in `namespace`, or in all namespaces.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One controller over the sessions of `namespace` (all namespaces when `None`).
async fn run_scope(
    clients: Clients,
    agents: AgentRegistry,
    settings: OperatorSettings,
    namespace: Option<String>,
    concurrency: u16,
) {
    let client = clients.streams.clone();
    let ns = namespace.as_deref();
    match ns {
        Some(ns) => info!(namespace = ns, "watching one namespace"),
        None => info!("watching all namespaces"),
    }
    // One watch per kind; each child watch fills a cache and triggers the owner's reconcile.
    // managedFields are dropped before caching: nothing reads them and they are most of a
    // small object.
    let (executors, executors_writer) = reflector::store();
    let executor_events = watcher(scoped::<ExecutorRunning>(&client, ns), Default::default())
        .default_backoff()
        .modify(|er| er.managed_fields_mut().clear())
        .reflect(executors_writer)
        .applied_objects();
    let (pods, pods_writer) = reflector::store();
    let managed = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    // Deletions count too: a relaunch waits until the previous pod is gone.
    let pod_index = Arc::new(PodIndex::default());
    let pod_events = watcher(scoped::<Pod>(&client, ns), managed)
        .default_backoff()
        .modify(slim_pod)
        .map_ok({
            let index = pod_index.clone();
            move |event| {
                index.apply(&event);
                event
            }
        })
        .reflect(pods_writer)
        .touched_objects();
    // Only whether a claim exists matters: metadata, without labels and annotations.
    let (claims, claims_writer) = reflector::store();
    let claim_events = watcher(
        scoped::<PartialObjectMeta<PersistentVolumeClaim>>(&client, ns),
        Default::default(),
    )
    .default_backoff()
    .modify(|pvc| {
        pvc.metadata.managed_fields = None;
        pvc.metadata.annotations = None;
        pvc.metadata.labels = None;
    })
    .reflect(claims_writer)
    .applied_objects();
    // Nodes only fill their cache (a lost node is found on the sessions' own passes); their
    // image lists, the bulk of a Node, are dropped before caching.
    let (nodes, node_events) = if settings.node_lost_after.is_some() {
        let (nodes, nodes_writer) = reflector::store();
        let events = watcher(Api::<Node>::all(client.clone()), Default::default())
            .default_backoff()
            .modify(|node| {
                node.managed_fields_mut().clear();
                if let Some(status) = node.status.as_mut() {
                    status.images = None;
                }
            })
            .reflect(nodes_writer)
            .applied_objects()
            .boxed();
        (Some(nodes), events)
    } else {
        (None, futures::stream::empty().boxed())
    };
    let (sessions, sessions_writer) = reflector::store();
    let session_events = watcher(scoped::<TaskSession>(&client, ns), Default::default())
        .default_backoff()
        .modify(|ts| ts.managed_fields_mut().clear())
        .reflect(sessions_writer)
        .applied_objects();
    let probe = settings.probe();
    let ctx = Arc::new(Context {
        events: EventQueue::start(
            Publisher::new(
                clients.calls.clone(),
                MANAGER,
                std::env::var("POD_NAME").ok(),
            ),
            EVENT_WORKERS,
        ),
        client: clients.calls,
        streams: clients.streams,
        agents,
        settings,
        followers: Followers::new(pods.clone(), probe),
        executors,
        pods,
        pod_index,
        claims,
        nodes,
        expectations: Expectations::default(),
    });
    metrics::global().track_sessions(sessions.clone());
    metrics::global().start_watchdog(ctx.settings.deadlines());
    Controller::for_stream(session_events, sessions)
        .owns_stream(executor_events)
        .owns_stream(pod_events)
        // Claims only fill their cache; they trigger nothing.
        .watches_stream(claim_events, |_| std::iter::empty())
        .watches_stream(node_events, |_| std::iter::empty())
        .with_config(controller::Config::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, action)) => tracing::debug!(session = %obj.name, ?action, "reconciled"),
                Err(err) => tracing::debug!(%err, "reconcile did not finish"),
            }
        })
        .await;
}

/// Adds [`FINALIZER`] on the condition that the session is still the cached version (kube's
/// finalizer helper would do it with a JSON patch test that fails on a lagging cache, and retry
/// without end); the next reconcile, on the written version, does the work.
async fn add_finalizer(
    api: &Api<TaskSession>,
    ts: &TaskSession,
    expectations: &Expectations,
) -> Result<(), Error> {
    let mut finalizers = ts.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    let patch = json!({"metadata": {
        "resourceVersion": ts.metadata.resource_version,
        "finalizers": finalizers,
    }});
    let uid = ts.uid().unwrap_or_default();
    let base = ts.metadata.resource_version.as_deref();
    let written = api
        .patch(
            &ts.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(conflict_or(
            "adding the finalizer",
            expectations,
            &uid,
            base,
        ))?;
    expectations.wrote(&uid, base, written.metadata.resource_version.as_deref());
    Ok(())
}

/// Per-session exponential backoff with jitter. A conflict is the normal end of a decision made
/// on a cache that lagged: the watch event that follows reconciles again, the requeue is only
/// the fallback.
fn error_policy(ts: Arc<TaskSession>, err: &Error, ctx: Arc<Context>) -> Action {
    if err.metric_label() == "conflict" {
        tracing::debug!(session = %ts.name_any(), "the session changed meanwhile; deciding again");
        return Action::requeue(Duration::from_secs(1));
    }
    let delay = ctx.expectations.failed(&ts.uid().unwrap_or_default());
    warn!(session = %ts.name_any(), error = %err, kind = err.metric_label(), retry_in = ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// kube-runtime polls every reconcile inside the controller's own task, the one that also reads
/// every watch stream into the caches: one thread for all of it. Each reconcile runs as a task
/// of its own instead, so reconciles use every core and the caches keep up with the watch
/// events while hundreds of sessions launch at once (at N = 400 our own status write reached
/// the cache up to 7 s late).
#[tracing::instrument(name = "reconcile", skip_all, fields(session = %ts.name_any(), namespace = ts.namespace().unwrap_or_default()))]
async fn reconcile(ts: Arc<TaskSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    let task = reconcile_session(ts, ctx).instrument(tracing::Span::current());
    tokio::spawn(task)
        .await
        .map_err(|e| Error::TaskFailed(e.to_string()))?
}

async fn reconcile_session(ts: Arc<TaskSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let uid = ts.uid().unwrap_or_default();
    tracing::debug!(version = ?ts.metadata.resource_version, "reconciling");
    let result = async {
        let ns = ts.namespace().ok_or(Error::NoNamespace)?;
        // Before the first list of the child caches, a session would look as if it had no pod.
        let ready = async {
            ctx.executors.wait_until_ready().await?;
            ctx.pods.wait_until_ready().await?;
            ctx.claims.wait_until_ready().await
        };
        if !matches!(
            tokio::time::timeout(Duration::from_secs(30), ready).await,
            Ok(Ok(()))
        ) {
            return Err(Error::CacheNotReady);
        }
        if ctx
            .expectations
            .is_stale(&uid, ts.metadata.resource_version.as_deref())
        {
            // Our last write has not reached the cache: deciding now would repeat what
            // was just done. The write's watch event reconciles again; this is the fallback
            // for an event that a watch restart lost (a relist's reconciles still read the
            // previous cache). Not sooner: with 10,000 sessions, a 2 s fallback kept hundreds
            // of reconciles a second busy while the cache caught up, and slowed it further.
            tracing::debug!("cached TaskSession predates our last write; waiting for it");
            return Ok(Action::requeue(RECHECK));
        }
        let api: Api<TaskSession> = Api::namespaced(ctx.client.clone(), &ns);
        // Liveness: a session that is not at rest is looked at again within the recheck,
        // whatever this reconcile asked for and whatever watch events come.
        let at_rest = loaded_at_rest(&ts);
        if ts.metadata.deletion_timestamp.is_none()
            && !ts.finalizers().iter().any(|f| f == FINALIZER)
        {
            add_finalizer(&api, &ts, &ctx.expectations).await?;
            // The session is not evaluated yet, at rest or not: if the watch event of this
            // write is lost, the fallback still evaluates it.
            return Ok(Action::requeue(RECHECK));
        }
        finalizer(&api, FINALIZER, ts, |event| async {
            let requeue = match event {
                Finalizer::Apply(ts) => bounded(Session::load(ts, &ctx)?.apply().await?, at_rest),
                Finalizer::Cleanup(ts) => Session::load(ts, &ctx)?.cleanup(),
            };
            Ok(ctx.action(requeue))
        })
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)))
    }
    .await;
    metrics::global().reconciled(
        result.as_ref().err().map(Error::metric_label),
        started.elapsed(),
    );
    if result.is_ok() {
        ctx.expectations.succeeded(&uid);
    }
    result
}

/// Everything one reconcile knows about a session.
struct Session<'a> {
    ctx: &'a Context,
    ts: Arc<TaskSession>,
    name: String,
    ns: String,
    uid: String,
    /// The version every status write is based on: the cached one, then each write's result.
    resource_version: Option<String>,
    /// The status this reconcile works on (written by [`Self::write_status`]).
    status: TaskSessionStatus,
    /// The session, its ExecutorRunning and the pods it controls, from the caches.
    objects: SessionObjects,
}

impl<'a> Session<'a> {
    /// Reads the session's ExecutorRunning and pods (those whose controller is this session, by
    /// UID: labels alone prove nothing) from the caches; a pod this operator just deleted counts
    /// as terminating even while the cache lags ([`Expectations::mark_deleted`]).
    fn load(ts: Arc<TaskSession>, ctx: &'a Context) -> Result<Session<'a>, Error> {
        let ns = ts.namespace().ok_or(Error::NoNamespace)?;
        let name = ts.name_any();
        let uid = ts.uid().unwrap_or_default();
        let executor = ctx
            .executors
            .get(&ObjectRef::new(&names::executor_name(&ts)).within(&ns))
            .map(Arc::unwrap_or_clone);
        // Found through the index, not by going through every pod of the cache.
        let mut candidates = ctx
            .pod_index
            .controlled_by(&uid)
            .iter()
            .filter_map(|pod| ctx.pods.get(pod))
            .filter(|pod| {
                pod.metadata.namespace.as_deref() == Some(ns.as_str())
                    && is_controlled_by(pod, Some(uid.as_str()))
            })
            .map(Arc::unwrap_or_clone)
            .collect::<Vec<Pod>>();
        ctx.expectations
            .mark_deleted(&uid, &mut candidates, Timestamp::now());
        let objects = SessionObjects::new(&ns, (*ts).clone(), executor, candidates);
        let status = ts.status.clone().unwrap_or_default();
        Ok(Session {
            ctx,
            resource_version: ts.metadata.resource_version.clone(),
            ts,
            name,
            ns,
            uid,
            status,
            objects,
        })
    }

    /// The agent profile with the session's capability overrides applied; `None` when the
    /// operator does not know the profile.
    fn effective_profile(&self) -> Option<AgentProfile> {
        let mut profile = self.ctx.agents.get(&self.ts.spec.agent)?.clone();
        if let Some(overrides) = &self.ts.spec.capabilities {
            if let Some(native) = overrides.native_session_resume {
                profile.native_session_resume = native.into();
            }
            if let Some(injection) = overrides.history_context_injection {
                profile.history_context_injection = injection;
            }
        }
        Some(profile)
    }

    /// DESIGN §3 step 2, from what the session holds now.
    fn resume_request(&self, profile: &AgentProfile, state_at_loss: SessionState) -> ResumeRequest {
        build_resume_request(&ResumeRequestFacts {
            state_at_loss,
            resume_token: self.objects.resume_token(),
            task_description: self.ts.spec.task_description.as_deref().unwrap_or_default(),
            fresh: self.fresh_requested(),
            profile_history_injection: profile.history_context_injection,
        })
    }

    /// The user asked this resume to ignore the saved token: `kandev.dev/resume-fresh` carries
    /// the token of the request being handled (per request, so a leftover flag never makes a
    /// later resume fresh).
    fn fresh_requested(&self) -> bool {
        self.status
            .active_resume_request
            .as_deref()
            .is_some_and(|active| self.objects.annotation(RESUME_FRESH_ANNOTATION) == Some(active))
    }

    fn unknown_profile_reason(&self) -> String {
        let known: Vec<&str> = self.ctx.agents.names().collect();
        format!(
            "unknown agent profile {:?} (known: {}); add it with --agent-profiles",
            self.ts.spec.agent,
            known.join(", ")
        )
    }

    /// The launch in progress: the latched resume token, or the initial launch.
    fn launch_id(&self) -> &str {
        self.status
            .active_resume_request
            .as_deref()
            .unwrap_or(INITIAL_LAUNCH)
    }

    /// The deterministic name of the current launch's pod.
    fn launch_pod_name(&self) -> String {
        names::pod_name(&self.name, self.launch_id())
    }

    /// The pod of the current launch, looked up by its deterministic name (hints such as
    /// `podName` are not trusted).
    fn launch_pod(&self) -> Option<&Pod> {
        self.pod_named(&self.launch_pod_name())
    }

    /// This session's pod of that name.
    fn pod_named(&self, name: &str) -> Option<&Pod> {
        self.objects
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    }

    /// Pods that carry this session's labels but are not controlled by it are ignored (labels
    /// prove nothing); each is reported once, as a Warning Event.
    fn report_decoys(&self) {
        let label = names::session_label_value(&self.name);
        let decoys = self
            .ctx
            .pod_index
            .labelled(&self.ns, &label)
            .iter()
            .filter_map(|pod| self.ctx.pods.get(pod))
            .filter(|pod| {
                pod.labels().get(SESSION_LABEL) == Some(&label)
                    && !pods::controlled_by(pod, &self.ts)
            })
            .collect::<Vec<_>>();
        for pod in decoys {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.ctx.expectations.report_decoy(&uid) {
                let note = format!(
                    "pod {} carries this session's labels but is not controlled by it: ignored",
                    pod.name_any()
                );
                warn!(pod = %pod.name_any(), "decoy pod ignored");
                self.event(EventType::Warning, "DecoyPod", "Observe", &note);
            }
        }
    }

    /// Reads `pod`'s event journal (and follows it while the agent works), unless that was done
    /// recently for the same `nudge` ([`Followers::ensure`]).
    fn follow(&self, pod: &Pod, nudge: Option<&str>) {
        self.ctx.followers.ensure(
            &self.ctx.streams,
            pod,
            &names::executor_name(&self.ts),
            &self.objects.executor_status(),
            nudge,
        );
    }

    /// Stops following the events of this session's pods; returns how many pods it has.
    fn unfollow(&self) -> usize {
        let uids: Vec<&str> = self
            .objects
            .pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.ctx.followers.retain(|uid| !uids.contains(&uid));
        uids.len()
    }

    /// The session is being deleted: stop following its pods' events (the pods, PVC from the
    /// template and ExecutorRunning go with it through their ownerReferences).
    fn cleanup(self) -> Requeue {
        let pods = self.unfollow();
        self.ctx.expectations.forget(&self.uid);
        info!(pods, "session deleted; stopped following its agentctl pods");
        Requeue::AwaitChange
    }

    async fn apply(mut self) -> Result<Requeue, Error> {
        self.report_decoys();
        if let Some(end) = self.ts.spec.end
            && !matches!(
                self.status.state,
                SessionState::Completed | SessionState::Cancelled
            )
        {
            return self.end_session(end).await;
        }
        if let Some(token) = self.new_resume_request() {
            if self.request_on_running_pod() == Some(RunningRequest::Wait) {
                return self.observe().await;
            }
            let latched_pod = self.launch_pod().map(ResourceExt::name_any);
            match answer_request(
                &self.objects,
                &self.status,
                &token,
                latched_pod.as_deref(),
                Timestamp::now(),
            ) {
                RequestAnswer::Done(transition) => return self.apply_transition(transition).await,
                RequestAnswer::Latched(transition) => self.apply_effects(&transition).await?,
            }
        }
        // A latched request, a session never launched, or a launch that an operator restart
        // interrupted (STARTING is persisted before the pod is created).
        let launching = self.status.active_resume_request.is_some()
            || matches!(
                self.status.state,
                SessionState::Created | SessionState::Starting
            );
        if launching {
            return self.launch().await;
        }
        self.observe().await
    }

    /// A new resume request while the session's pod runs and no request is latched: "already
    /// running" only while the pod is Ready and its node not in doubt ([`running_request`]).
    /// Otherwise the request stays unhandled and the steady state goes on (it deletes a pod
    /// that counts as lost) until the pod is Ready again or gone, and the request resumes it.
    fn request_on_running_pod(&self) -> Option<RunningRequest> {
        let on_running_pod =
            self.status.active_resume_request.is_none() && !self.status.state.is_terminal();
        let facts = self.reach_facts().filter(|_| on_running_pod)?;
        Some(running_request(&facts, Timestamp::now()))
    }

    /// `spec.end`: one step per pass (the pure [`end_step`]) until nothing runs, then the
    /// session and its task are COMPLETED or CANCELLED. The first pass says so
    /// (`Reconciling=True`, reason `Ending`, which also dates the grace period), ends a latched
    /// resume request, and reads the agent's journal so that a running prompt is known.
    async fn end_session(mut self, end: SessionEnd) -> Result<Requeue, Error> {
        let ending_since = conditions::find(&self.status.conditions, conditions::RECONCILING)
            .filter(|c| c.status == "True" && c.reason == "Ending")
            .map(|c| c.last_transition_time.0);
        let Some(since) = ending_since else {
            let message = format!("ending the session (spec.end: {})", end_word(end));
            if let Some(token) = self.status.active_resume_request.clone() {
                let ended = format!("resume request {token:?} ended by spec.end");
                self.set_conditions(&[Want::new(
                    conditions::RESUMED,
                    false,
                    "SessionEnded",
                    ended,
                )]);
                self.finish_request();
            }
            self.set_conditions(&[Want::new(conditions::RECONCILING, true, "Ending", &message)]);
            self.write_status().await?;
            if let Some(pod) = self
                .objects
                .current_pod()
                .filter(|p| liveness(Some(p)) == PodLiveness::Running)
            {
                self.follow(pod, Some(&format!("end:{}", end_word(end))));
            }
            return Ok(Requeue::After(Duration::from_secs(2)));
        };
        let pod = self.objects.current_pod().cloned();
        let facts = EndFacts {
            end,
            pod: liveness(pod.as_ref()),
            working: self.objects.executor_status().activity == Some(AgentActivity::Working),
            ending_for: Timestamp::now().duration_since(since).unsigned_abs(),
            grace: self.ctx.settings.end_grace,
        };
        let recheck = Duration::from_secs(2);
        match (end_step(&facts), pod) {
            (EndStep::Finish, _) => self.finish_session(end).await,
            (EndStep::AwaitPrompt(left), _) => Ok(Requeue::After(left.min(RECHECK))),
            (EndStep::AwaitPodGone, _) => Ok(Requeue::After(recheck)),
            (EndStep::CancelPrompt, Some(pod)) if self.objects.resume_token().is_some() => {
                if let Err(err) = self.cancel_prompt(&pod).await {
                    warn!(%err, pod = %pod.name_any(), "could not cancel the running prompt; stopping the agent");
                    self.stop_pods().await;
                }
                Ok(Requeue::After(recheck))
            }
            (EndStep::CancelPrompt | EndStep::StopPod, _) => {
                self.stop_pods().await;
                Ok(Requeue::After(recheck))
            }
        }
    }

    /// ACP `session/cancel` for the agent's session, over exec into `pod`.
    async fn cancel_prompt(&self, pod: &Pod) -> Result<(), String> {
        let session = self.objects.resume_token().unwrap_or_default().to_string();
        let pods_api: Api<Pod> = Api::namespaced(self.ctx.streams.clone(), &self.ns);
        let limit = self.ctx.settings.acp_timeout;
        let cancel = async {
            let mut connection =
                PodConnection::open(&pods_api, &pod.name_any(), pod_contract::CONTAINER)
                    .await
                    .map_err(|e| e.to_string())?;
            let client = &mut connection.client;
            client.set_timeouts(AcpTimeouts::uniform(limit));
            let sent = match client.initialize().await {
                Ok(_) => client.cancel(&session).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            connection.close(Duration::from_secs(3)).await;
            sent
        };
        match tokio::time::timeout(limit, cancel).await {
            Ok(sent) => {
                info!(pod = %pod.name_any(), %session, "cancelled the running prompt");
                sent
            }
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }

    /// Deletes every pod of the session that may still run.
    async fn stop_pods(&self) {
        for pod in self.objects.pods.iter().filter(|p| {
            p.metadata.deletion_timestamp.is_none() && liveness(Some(p)) != PodLiveness::Failed
        }) {
            info!(pod = %pod.name_any(), "stopping the agent: the session ends");
            self.pod_deletion(pod).await;
        }
    }

    /// Nothing runs any more: COMPLETED or CANCELLED, the executor `Stopped` and not resumable,
    /// the template's PVC deleted when `workspace.retention` says so, one Event.
    async fn finish_session(mut self, end: SessionEnd) -> Result<Requeue, Error> {
        let (state, task_state) = match end {
            SessionEnd::Completed => (SessionState::Completed, TaskState::Completed),
            SessionEnd::Cancelled => (SessionState::Cancelled, TaskState::Cancelled),
        };
        if let Some(er) = &self.objects.executor {
            let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            let patch = json!({"status": {"status": ExecutorPhase::Stopped, "resumable": false, "activity": null}});
            api.patch_status(
                &er.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(kube_err("marking the executor stopped"))?;
        }
        let workspace = match (
            &self.ts.spec.workspace.template,
            self.ts.spec.workspace.retention.unwrap_or_default(),
        ) {
            (Some(_), WorkspaceRetention::Delete) => {
                let claim = names::workspace_claim_name(&self.ts);
                let pvcs: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.ctx.client.clone(), &self.ns);
                match pvcs.delete(&claim, &Default::default()).await {
                    Ok(_) => format!("workspace PVC {claim} deleted (retention: Delete)"),
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        format!("workspace PVC {claim} already gone")
                    }
                    Err(e) => return Err(kube_err("deleting the workspace PVC")(e)),
                }
            }
            _ => format!(
                "workspace PVC {} kept",
                names::workspace_claim_name(&self.ts)
            ),
        };
        let word = end_word(end);
        let message =
            format!("the session is {state} (spec.end: {word}); the agent is stopped, {workspace}");
        self.status.state = state;
        self.status.task_state = task_state;
        self.status.needs_resume = false;
        self.status.is_resumable = false;
        self.status.resume_reason = Some(ResumeReason::TerminalState);
        self.status.error_message = None;
        self.finish_request();
        self.set_conditions(&[
            Want::new(conditions::READY, false, word, &message),
            Want::new(conditions::AGENT_RUNNING, false, "Stopped", ""),
            Want::new(conditions::NEEDS_RESUME, false, "TerminalState", ""),
            Want::new(conditions::RECONCILING, false, word, ""),
            Want::new(conditions::STALLED, false, word, ""),
        ]);
        self.write_status().await?;
        self.unfollow();
        self.event(EventType::Normal, "SessionEnded", "End", &message);
        Ok(Requeue::AwaitChange)
    }

    /// The annotation's token when it has not been handled and is not being handled.
    fn new_resume_request(&self) -> Option<String> {
        let token = self.objects.annotation(RESUME_ANNOTATION)?;
        is_new_resume_request(
            token,
            self.status.active_resume_request.as_deref(),
            self.status.last_handled_resume_request.as_deref(),
            &self.status.recent_resume_requests,
        )
        .then(|| token.to_string())
    }

    /// Steps 1–5 of DESIGN §3 "Resume execution" (the initial launch takes the same path).
    async fn launch(self) -> Result<Requeue, Error> {
        let starting = self.status.state == SessionState::Starting;
        let launch_name = self.launch_pod_name();
        let launch_pod = self.launch_pod().cloned();
        let previous = previous_pod_alive(&self.objects.pods, &launch_name).cloned();
        let now = Timestamp::now();
        let facts = LaunchFacts {
            starting,
            launch_pod: launch_pod.as_ref(),
            created_unseen: starting
                && self
                    .ctx
                    .expectations
                    .awaits_created(&self.uid, |name| self.pod_named(name).is_some()),
            previous_alive: previous.as_ref(),
            previous_deleted_ago: previous
                .as_ref()
                .and_then(|p| p.metadata.deletion_timestamp.as_ref())
                .map(|at| now.duration_since(at.0).unsigned_abs()),
            age: launch_pod
                .as_ref()
                .filter(|p| p.metadata.creation_timestamp.is_some())
                .map(pod_age),
            deadline: self.ctx.settings.launch_deadline,
        };
        match launch_step(&facts) {
            LaunchStep::Begin => self.start_launch().await,
            LaunchStep::AwaitCreated => Ok(Requeue::After(RECHECK)),
            LaunchStep::DeletePrevious(previous) => self.delete_previous_pod(previous).await,
            LaunchStep::WaitForPrevious {
                pod,
                until_deadline,
            } => self.wait_for_previous_pod(pod, until_deadline).await,
            LaunchStep::CreatePod => self.create_pod().await,
            LaunchStep::AwaitRunning { until_deadline } => Ok(Requeue::After(
                until_deadline.clamp(Duration::from_millis(500), RECHECK),
            )),
            LaunchStep::Stalled(pod, stall) => self.stall_launch(pod, stall).await,
            LaunchStep::Restore(pod) => self.restore(pod).await,
            LaunchStep::CheckoutFailed(pod, stall) => {
                let message = format!(
                    "{}; {}. Set a new {RESUME_ANNOTATION} token to retry",
                    stall.message,
                    self.what_is_kept()
                );
                self.launch_not_done(Some(pod), stall.reason, "CheckoutFailed", true, &message)
                    .await
            }
            LaunchStep::LostWhileStarting(pod, lost) => {
                let message = format!(
                    "agentctl pod {} was lost while starting ({lost:?}); {}",
                    pod.name_any(),
                    self.what_is_kept()
                );
                self.launch_not_done(Some(pod), "PodLost", "LaunchFailed", false, &message)
                    .await
            }
        }
    }

    /// A pod of an earlier launch that nothing deletes (a superseded request's, created before
    /// the cache showed it) would keep this launch waiting for good: the status says so, then
    /// the pod is deleted (by UID: only the pod that was judged), and its deletion's watch
    /// event moves the launch on.
    async fn delete_previous_pod(mut self, previous: &Pod) -> Result<Requeue, Error> {
        let message = format!(
            "deleting pod {} of an earlier launch before starting agentctl pod {}",
            previous.name_any(),
            self.launch_pod_name()
        );
        self.keep_waiting("ReplacingPreviousPod", &message).await?;
        if self.delete_pod_by_uid(previous, false).await {
            info!(pod = %previous.name_any(), "deleted the pod of an earlier launch");
        }
        Ok(Requeue::After(Duration::from_secs(2)))
    }

    /// The launch waits until `previous` is gone (its deletion reconciles again), at most
    /// `until_deadline` before it looks again.
    async fn wait_for_previous_pod(
        mut self,
        previous: &Pod,
        until_deadline: Duration,
    ) -> Result<Requeue, Error> {
        let message = format!(
            "waiting for pod {} of an earlier launch to be gone before starting agentctl pod {}",
            previous.name_any(),
            self.launch_pod_name()
        );
        self.keep_waiting("WaitingForPreviousPod", &message).await?;
        Ok(Requeue::After(
            until_deadline.clamp(Duration::from_millis(500), RECHECK),
        ))
    }

    /// The launch waits: `Reconciling=True` with `reason`, written once, not on every pass.
    async fn keep_waiting(&mut self, reason: &str, message: &str) -> Result<(), Error> {
        let before = self.status.clone();
        self.set_conditions(&[Want::new(conditions::RECONCILING, true, reason, message)]);
        if self.status != before {
            self.write_status().await?;
        }
        Ok(())
    }

    /// Builds the request, makes sure the ExecutorRunning and the workspace exist, and persists
    /// `STARTING` with the state to return to — before any pod exists.
    async fn start_launch(mut self) -> Result<Requeue, Error> {
        let Some(profile) = self.effective_profile() else {
            let reason = self.unknown_profile_reason();
            return self.fail_launch(&reason).await;
        };
        let request = self.resume_request(&profile, self.status.state);
        self.status.previous_state = Some(request.previous_state);
        if self.objects.executor.is_none() {
            let er = pods::build_executor(&self.ts);
            let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            match api.create(&PostParams::default(), &er).await {
                Ok(er) => self.objects.executor = Some(er),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(kube::Error::Api(e)) if is_invalid(e.code) => {
                    let message =
                        format!("the API server refused the ExecutorRunning: {}", e.message);
                    return self.invalid_spec(&message).await;
                }
                Err(e) => return Err(kube_err("creating the ExecutorRunning")(e)),
            }
        }
        match self.ensure_workspace().await? {
            Workspace::Ready => {}
            Workspace::Lost(reason) => {
                return self
                    .fail_launch_as("WorkspaceLost", "WorkspaceLost", &reason)
                    .await;
            }
            Workspace::Invalid(message) => return self.invalid_spec(&message).await,
            Workspace::Missing(what) => return self.wait_for_workspace(&what).await,
        }
        self.status.state = SessionState::Starting;
        self.status.executor_ref = Some(names::executor_name(&self.ts));
        self.status.error_message = None;
        let pod = self.launch_pod_name();
        let message = format!(
            "launching agentctl pod {pod} for {}",
            describe_launch(self.launch_id())
        );
        let mut wanted = vec![
            Want::new(conditions::RECONCILING, true, "Starting", &message),
            Want::new(conditions::READY, false, "Starting", &message),
            Want::new(conditions::STALLED, false, "Starting", ""),
            // A new launch: the cause of an earlier loss (AgentUnreachable, NodeLost) is over.
            Want::new(conditions::AGENT_RUNNING, false, "PodNotRunning", ""),
        ];
        // And a suspension is over (the condition stays, False, once a session had it).
        if conditions::find(&self.status.conditions, conditions::SUSPENDED).is_some() {
            wanted.push(Want::new(conditions::SUSPENDED, false, "Resuming", ""));
        }
        self.set_conditions(&wanted);
        self.write_status().await?;
        // One Event per launch start: a resume's says which request it handles.
        match self.status.active_resume_request.as_deref() {
            Some(token) => {
                let note =
                    format!("resume request {token:?} accepted; launching agentctl pod {pod}");
                self.event(EventType::Normal, "ResumeRequested", "Resume", &note)
            }
            None => self.event(EventType::Normal, "Starting", "Launch", &message),
        }
        fault_point("starting");
        // STARTING is persisted and this reconcile holds the newest status: the next step (the
        // pod, normally) needs no round trip through the cache. The pod's name is fixed by the
        // request, so a step repeated by a later reconcile adopts it instead of doubling it.
        Box::pin(self.launch()).await
    }

    /// The workspace PVC before a launch. A session that ran before (ExecutorRunning recorded a
    /// pod) needs the workspace it ran on: gone (or being deleted) is `FAILED` with reason
    /// `WorkspaceLost`, never an empty replacement. Before that, a launch creates the PVC of a
    /// template, and waits for a claimed one (`Stalled`, reason
    /// `WorkspaceMissing`, once the launch deadline has passed since the session was created;
    /// it starts whenever the PVC appears).
    async fn ensure_workspace(&self) -> Result<Workspace, Error> {
        let claim = names::workspace_claim_name(&self.ts);
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        // The claim cache answers; only a miss is confirmed live (it may be a moment old).
        let deleting = |meta: &kube::api::ObjectMeta| meta.deletion_timestamp.is_some();
        let cached = self
            .ctx
            .claims
            .get(&ObjectRef::new(&claim).within(&self.ns))
            .map(|pvc| deleting(&pvc.metadata));
        let found = match cached {
            Some(deleting) => Some(deleting),
            None => pvcs
                .get_metadata_opt(&claim)
                .await
                .map_err(kube_err("reading the workspace PVC"))?
                .map(|pvc| deleting(&pvc.metadata)),
        };
        if found == Some(false) {
            return Ok(Workspace::Ready);
        }
        let gone = if found.is_some() {
            "is being deleted"
        } else {
            "no longer exists"
        };
        // The session ran on this workspace before (a pod was recorded): its files are gone.
        if self.objects.executor_status().pod_uid.is_some() {
            return Ok(Workspace::Lost(format!(
                "workspace PVC {claim:?} {gone}: the session's files went with it, so it is not resumed on an empty one"
            )));
        }
        match pods::build_workspace_claim(&self.ts) {
            Some(pvc) if found.is_none() => match pvcs.create(&PostParams::default(), &pvc).await {
                Ok(_) => {
                    self.event(
                        EventType::Normal,
                        "WorkspaceCreated",
                        "Launch",
                        &format!("created PVC {claim}"),
                    );
                    Ok(Workspace::Ready)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Workspace::Ready),
                Err(kube::Error::Api(e)) if is_invalid(e.code) => Ok(Workspace::Invalid(format!(
                    "the API server refused workspace PVC {claim}: {}",
                    e.message
                ))),
                Err(e) => Err(kube_err("creating the workspace PVC")(e)),
            },
            _ => Ok(Workspace::Missing(if found.is_some() {
                format!("workspace PVC {claim:?} is being deleted")
            } else {
                format!("workspace PVC {claim:?} not found in namespace {}", self.ns)
            })),
        }
    }

    /// A first launch waits for its claimed workspace PVC: `Reconciling` says so, and `Stalled`
    /// (reason `WorkspaceMissing`, one Event) once the launch deadline has passed since the
    /// session was created. Nothing is persisted as `STARTING` yet; the wait never ends the
    /// session, the PVC's appearance starts it.
    async fn wait_for_workspace(mut self, what: &str) -> Result<Requeue, Error> {
        // Nothing is launching yet: the state to return to is not persisted.
        self.status.previous_state = self.ts.status.as_ref().and_then(|s| s.previous_state);
        let before = self.status.clone();
        let age = self
            .ts
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
            .unwrap_or_default();
        let deadline = self.ctx.settings.launch_deadline;
        let stalled = age >= deadline;
        let message = if stalled {
            format!(
                "{what} {}s after the session was created; create it and the session starts",
                deadline.as_secs()
            )
        } else {
            format!("{what}; waiting for it")
        };
        self.set_conditions(&[
            Want::new(
                conditions::RECONCILING,
                true,
                "WaitingForWorkspace",
                &message,
            ),
            Want::new(
                conditions::STALLED,
                stalled,
                "WorkspaceMissing",
                if stalled { message.as_str() } else { "" },
            ),
        ]);
        if self.status == before {
            return Ok(Requeue::After(RECHECK));
        }
        self.write_status().await?;
        if stalled {
            self.event(EventType::Warning, "WorkspaceMissing", "Launch", &message);
        }
        let left = deadline.saturating_sub(age);
        Ok(Requeue::After(if stalled {
            RECHECK
        } else {
            left.clamp(Duration::from_millis(500), RECHECK)
        }))
    }

    async fn create_pod(self) -> Result<Requeue, Error> {
        let Some(profile) = self.effective_profile() else {
            let reason = self.unknown_profile_reason();
            return self.fail_launch(&reason).await;
        };
        if let Some(refusal) = pods::image_refusal(&self.ts, &self.ctx.settings.pod) {
            return self.invalid_spec(&refusal).await;
        }
        // The network policy first, so the agent never runs without it (once per session and
        // operator run: a resume does not write it again). Applied, not created: a policy of
        // that name left by an older operator, or changed by hand, is set back to this one.
        if let Some(rules) = &self.ctx.settings.pod.network
            && !self.ctx.expectations.has_policy(&self.uid)
        {
            let policy = pods::build_network_policy(&self.ts, rules);
            let api: Api<NetworkPolicy> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            let name = policy.name_any();
            match api
                .patch(
                    &name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&policy),
                )
                .await
            {
                Ok(_) => {
                    info!(policy = %name, "applied the NetworkPolicy");
                    self.ctx.expectations.policy_exists(&self.uid);
                }
                // Among them: a policy of that name controlled by another owner.
                Err(kube::Error::Api(e)) if is_invalid(e.code) => {
                    let message =
                        format!("the API server refused NetworkPolicy {name}: {}", e.message);
                    return self.invalid_spec(&message).await;
                }
                Err(e) => return Err(kube_err("applying the NetworkPolicy")(e)),
            }
        }
        let pod =
            pods::build_agentctl_pod(&self.ts, self.launch_id(), &self.ctx.settings.pod, &profile);
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                self.ctx.expectations.created_pod(&self.uid, &name);
                info!(pod = %name, "created the agentctl pod");
                fault_point("pod-created");
            }
            // Created by an earlier run of this step: adopt it, if it is ours. Its phase is
            // judged like any pod of this launch once the cache has it.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = api
                    .get_opt(&name)
                    .await
                    .map_err(kube_err("reading the existing agentctl pod"))?;
                match existing {
                    Some(pod) if !pods::controlled_by(&pod, &self.ts) => {
                        let message = format!(
                            "pod {name} exists but is not controlled by this TaskSession; delete it, or set a new {RESUME_ANNOTATION} token. {}",
                            self.what_is_kept()
                        );
                        return self
                            .launch_not_done(None, "PodNameTaken", "PodNameTaken", true, &message)
                            .await;
                    }
                    _ => info!(pod = %name, "adopting existing agentctl pod"),
                }
            }
            Err(kube::Error::Api(e))
                if is_invalid(e.code) || refused_by_admission(e.code, &e.message) =>
            {
                let message = format!("the API server refused agentctl pod {name}: {}", e.message);
                return self.invalid_spec(&message).await;
            }
            Err(e) => return Err(kube_err("creating the agentctl pod")(e)),
        }
        Ok(Requeue::After(RECHECK))
    }

    /// DESIGN §3 steps 4–5: ACP over exec into the running pod (`initialize`, then the restore
    /// chosen by the pure rules), then the token and the state go back into status.
    async fn restore(mut self, pod: &Pod) -> Result<Requeue, Error> {
        let pod_name = pod.name_any();
        let Some(profile) = self.effective_profile() else {
            let reason = self.unknown_profile_reason();
            return self.fail_launch(&reason).await;
        };
        let is_resume = self.status.active_resume_request.is_some();
        let fresh = self.fresh_requested();
        let token = self.objects.resume_token().map(str::to_string);
        // STARTING was persisted with the state to return to; rebuilding from it gives the
        // same case (A/B/C) as when the launch began, also after an operator restart.
        let state_at_start = self
            .status
            .previous_state
            .unwrap_or(SessionState::WaitingForInput);
        let request = self.resume_request(&profile, state_at_start);

        let pods_api: Api<Pod> = Api::namespaced(self.ctx.streams.clone(), &self.ns);
        // This restore's lines, from the operator's one memory budget: when many restores
        // hold it, this one waits here, before any deadline, and finishes later.
        let memory = budget::Held::new(
            self.ctx.settings.acp_memory.clone(),
            budget::connection_need(&self.ctx.settings.acp_limits),
        )
        .await;
        tracing::debug!(pod = %pod_name, "opening the exec for the restore");
        let open_started = std::time::Instant::now();
        let open = PodConnection::open(&pods_api, &pod_name, pod_contract::CONTAINER);
        let opened = match tokio::time::timeout(self.ctx.settings.acp_timeout, open).await {
            Ok(opened) => opened.map_err(|err| err.to_string()),
            Err(_) => Err(format!(
                "opening the exec did not finish within {:?}",
                self.ctx.settings.acp_timeout
            )),
        };
        let mut connection = match opened {
            Ok(connection) => connection,
            Err(err) => return self.wait_for_agentctl(pod, &err).await,
        };
        tracing::debug!(pod = %pod_name, took_ms = open_started.elapsed().as_millis(), "exec open");
        let client = &mut connection.client;
        // Repeated setup requests and the initial prompt of the same launch are answered by
        // agentctl from what it did the first time, without reaching the agent again.
        client.set_launch(self.launch_id());
        // The saved mode, model and config options: agentctl sets them back after a restore.
        client.set_saved_config(self.objects.executor_status().session_config.clone());
        client.set_limits(self.ctx.settings.acp_limits);
        client.set_memory(memory);
        let timeouts = AcpTimeouts {
            initialize: self.ctx.settings.acp_timeout,
            session: self.ctx.settings.restore_timeout,
            prompt: Some(self.ctx.settings.acp_timeout),
        };
        let cwd = std::path::PathBuf::from(&self.ts.spec.workspace.mount_path);
        let restore_started = std::time::Instant::now();
        let outcome = client
            .restore(
                token.as_deref(),
                &cwd,
                profile.native_session_resume,
                fresh,
                timeouts,
            )
            .await;
        metrics::global().restore_took(restore_started.elapsed());
        let capabilities = client.negotiated_capabilities();
        let client_unanswered = client.initialize_response().is_none();
        let worktree = client
            .initialize_response()
            .and_then(|init| init.meta.as_ref()?.get(WORKTREE_META).cloned())
            .and_then(|w| serde_json::from_value::<Worktree>(w).ok())
            // Without spec.repository, the agent's own `_meta` passes through agentctl.
            .map(|w| Worktree {
                branch: w.branch.map(|b| cap(&b, BRANCH_MAX).into_owned()),
                commit: w.commit.map(|c| cap(&c, AGENT_NAME_MAX).into_owned()),
                ..w
            });
        let mut started_prompt = false;
        // Why the task description, due now, could not be sent (it is not sent again).
        let mut prompt_not_sent: Option<String> = None;
        if let RestoreOutcome::Fresh { session_id, .. } = &outcome
            && let InitialPrompt::Send(text) = request.initial_prompt_for_fresh_agent(false)
        {
            match client.start_prompt(session_id, &text) {
                Ok(()) => started_prompt = true,
                Err(e) => prompt_not_sent = Some(cap(&e.to_string(), AGENT_TEXT_MAX).into_owned()),
            }
        }
        connection.close(Duration::from_secs(5)).await;
        // The stream closed before agentctl answered `initialize`: `agentctl connect` found no
        // serve yet (it may still be cloning the repository) or serve just exited (the pod's
        // status will say why). Or `initialize` got no answer in time: agentctl answers it once
        // its agent has booted, which may take longer than the ACP timeout. agentctl has not
        // answered, so this is not a restore failure: the launch waits, within its deadline,
        // like for an exec that cannot open, and asks again.
        if let RestoreOutcome::Failed {
            class: RestoreErrorClass::Transport | RestoreErrorClass::Timeout,
            reason,
            ..
        } = &outcome
            && client_unanswered
        {
            return self.wait_for_agentctl(pod, reason).await;
        }

        match outcome {
            RestoreOutcome::Failed {
                class,
                token_kept,
                reason,
                ..
            } => {
                self.restore_failed(pod, &reason, class, token_kept, is_resume)
                    .await
            }
            RestoreOutcome::Restored { method, session_id } => {
                self.record_executor(pod, Some(&session_id), capabilities, worktree, false)
                    .await?;
                let message = format!(
                    "restored ACP session {session_id} with {}",
                    method.method_name()
                );
                self.restore_succeeded(pod, request.previous_state, true, "Restored", &message)
                    .await
            }
            RestoreOutcome::Fresh { session_id, why } => {
                self.record_executor(
                    pod,
                    Some(&session_id),
                    capabilities,
                    worktree,
                    started_prompt,
                )
                .await?;
                let (state, reason, message) = if started_prompt {
                    (
                        SessionState::Running,
                        "Started",
                        format!("started ACP session {session_id} and sent the task description"),
                    )
                } else if let Some(error) = &prompt_not_sent {
                    let message = format!(
                        "started ACP session {session_id}, but its task description could not be sent ({error}); waiting for input: send it with `kubectl kandev prompt`"
                    );
                    self.event(EventType::Warning, "TaskNotSent", "Launch", &message);
                    (SessionState::WaitingForInput, "Started", message)
                } else {
                    (
                        SessionState::WaitingForInput,
                        "Started",
                        format!("started ACP session {session_id}; waiting for input"),
                    )
                };
                let rejected = token
                    .as_deref()
                    .filter(|_| !fresh && why.agent_rejected_token());
                let (reason, message) = match token.as_deref().filter(|_| !fresh) {
                    // A profile without native resume starts over by design; the recorded
                    // history travels with the next prompt where the profile injects it.
                    Some(old) if !why.agent_rejected_token() => (
                        "StartedWithoutNativeResume",
                        format!(
                            "the agent profile does not restore sessions natively ({why}); started ACP session {session_id} in place of {old}"
                        ),
                    ),
                    _ => (reason, message),
                };
                match rejected {
                    Some(old) => {
                        // DESIGN §3 step 5: token rejected → WAITING_FOR_INPUT, token replaced,
                        // Event and condition with the reason.
                        let message = format!(
                            "the agent does not know saved session {old} ({}); started fresh session {session_id}",
                            why.as_str()
                        );
                        // An agent that offers no restore at all starts over on every resume
                        // by design: a Normal StartedFresh, not a Warning.
                        let (kind, event) = if why.warns() {
                            (EventType::Warning, "TokenRejected")
                        } else {
                            (EventType::Normal, "StartedFresh")
                        };
                        self.event(kind, event, "Resume", &message);
                        self.restore_succeeded(
                            pod,
                            SessionState::WaitingForInput,
                            false,
                            "TokenRejected",
                            &message,
                        )
                        .await
                    }
                    None => {
                        self.restore_succeeded(pod, state, true, reason, &message)
                            .await
                    }
                }
            }
        }
    }

    /// agentctl does not answer exec yet (`err`): right after the pod turned Running it may not
    /// listen yet (or still clone the repository). The pod's own liveness decides on the next
    /// pass whether this is a launch failure, the launch deadline whether it is stalled. The
    /// condition is written once, not on every try.
    async fn wait_for_agentctl(mut self, pod: &Pod, err: &str) -> Result<Requeue, Error> {
        if let Some(stall) = self.stall(pod, Some(err)) {
            return self.stall_launch(pod, stall).await;
        }
        let message = format!("waiting for agentctl in pod {}: {err}", pod.name_any());
        self.keep_waiting("WaitingForAgentctl", &message).await?;
        Ok(Requeue::After(Duration::from_secs(2)))
    }

    /// Writes what the launch learned into ExecutorRunning status (a merge patch: the event
    /// follower writes other fields of the same record). The activity is what the event
    /// follower's first line will report, so that line changes nothing.
    async fn record_executor(
        &mut self,
        pod: &Pod,
        token: Option<&str>,
        capabilities: Option<NegotiatedCapabilities>,
        worktree: Option<Worktree>,
        prompt_started: bool,
    ) -> Result<(), Error> {
        let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        // The checkout agentctl reported (sessions with a repository only); the path is where
        // the agent sees it, the PVC what holds it.
        let worktree = worktree.map(|w| WorktreeStatus {
            id: Some(self.ts.name_any()),
            pvc: Some(names::workspace_claim_name(&self.ts)),
            path: Some(self.ts.spec.workspace.mount_path.clone()),
            branch: w.branch,
            commit: w.commit,
        });
        let activity = if prompt_started {
            AgentActivity::Working
        } else {
            AgentActivity::Idle
        };
        let patch = json!({"status": {
            "resumeToken": token,
            "resumable": token.is_some(),
            "podName": pod.name_any(),
            "podUID": pod.metadata.uid,
            "agentExecutionId": pod.metadata.uid,
            "status": ExecutorPhase::Running,
            "activity": activity,
            "capabilities": capabilities,
            "lastSeenAt": Time(Timestamp::now()),
        }});
        let mut patch = patch;
        if let Some(worktree) = worktree {
            patch["status"]["worktree"] = json!(worktree);
        }
        // lastMessageUUID belongs to the session the token names: a new session (a fresh start)
        // has none until agentctl reports one.
        if token != self.objects.resume_token() {
            patch["status"]["lastMessageUUID"] = serde_json::Value::Null;
        }
        // A launch that leaves the agent idle is a catch-up ([`Followers::caught_up`]): the
        // client's nudge so far is handled, and a restarted operator does not read the journal
        // for it.
        if let Some(nudge) = self
            .objects
            .annotation(PROMPTED_ANNOTATION)
            .filter(|n| !prompt_started && n.len() <= NUDGE_MAX)
        {
            patch["status"]["handledPromptedAt"] = json!(nudge);
        }
        let recorded = api
            .patch_status(
                &names::executor_name(&self.ts),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(kube_err("recording the executor"))?;
        self.objects.executor = Some(recorded);
        Ok(())
    }

    async fn restore_succeeded(
        mut self,
        pod: &Pod,
        state: SessionState,
        resumed: bool,
        reason: &str,
        message: &str,
    ) -> Result<Requeue, Error> {
        self.status.state = state;
        self.status.task_state = TaskState::of_agent_in(state);
        self.status.needs_resume = false;
        self.status.is_resumable = false;
        self.status.resume_reason = Some(ResumeReason::AlreadyRunning);
        self.status.error_message = None;
        let was_resume = self.status.active_resume_request.is_some();
        self.finish_request();
        // Ready and Reconciling as the steady-state evaluation words them, so that it finds
        // nothing to write after this; the outcome is in `Resumed` and the Event.
        let steady = conditions::camel(&state.as_str().to_ascii_lowercase());
        let mut wanted = vec![
            Want::new(conditions::READY, true, steady, ""),
            Want::new(conditions::AGENT_RUNNING, true, "PodRunning", ""),
            Want::new(conditions::NEEDS_RESUME, false, "AlreadyRunning", ""),
            Want::new(conditions::RECONCILING, false, "Idle", ""),
            Want::new(conditions::STALLED, false, reason, ""),
        ];
        if was_resume {
            wanted.push(Want::new(conditions::RESUMED, resumed, reason, message));
        }
        self.set_conditions(&wanted);
        self.write_status().await?;
        if was_resume {
            metrics::global().resume_handled(if reason == "Restored" {
                ResumeOutcome::Restored
            } else {
                ResumeOutcome::Fresh
            });
        }
        let nudge = self.objects.annotation(PROMPTED_ANNOTATION);
        if state == SessionState::Running {
            // The task prompt was sent: follow the agent's work live.
            self.follow(pod, nudge);
        } else {
            self.ctx.followers.caught_up(pod, nudge);
        }
        if resumed {
            let event_reason = if was_resume { "Resumed" } else { "Started" };
            self.event(EventType::Normal, event_reason, "Restore", message);
        }
        Ok(Requeue::Resync)
    }

    /// A restore that failed without proving the token useless keeps it (DESIGN §3): the request
    /// counts as handled, a new token retries, and the pod is removed (nothing idles,
    /// AgentRunning tells the truth) once the status that explains it is written. A first
    /// launch whose agent answered with an error is `FAILED`; one that may work next time (no
    /// answer, a closed stream, missing credentials) stays resumable like a resume.
    async fn restore_failed(
        self,
        pod: &Pod,
        reason: &str,
        class: RestoreErrorClass,
        token_kept: bool,
        is_resume: bool,
    ) -> Result<Requeue, Error> {
        if !is_resume && !class.is_retryable() {
            let delete_pod = self.pod_deletion(pod);
            let action = self
                .fail_launch(&format!("starting the agent failed: {reason}"))
                .await?;
            delete_pod.await;
            return Ok(action);
        }
        let kept = match (token_kept, self.objects.resume_token().is_some()) {
            (true, true) => "the resume token is kept",
            (true, false) => "nothing is lost",
            (false, _) => "no usable token is left",
        };
        let what = if is_resume {
            "restore"
        } else {
            "starting the agent"
        };
        let message = format!(
            "{what} failed ({class}): {reason}; {kept}. Set a new {RESUME_ANNOTATION} token to retry"
        );
        self.launch_not_done(
            Some(pod),
            &conditions::camel(class.as_str()),
            "ResumeFailed",
            false,
            &message,
        )
        .await
    }

    /// The launch ended without a running agent, and nothing proves the session cannot go on:
    /// the request is handled, the token kept, the session back to the state it returns to with
    /// `needsResume` (a new token retries; after a first launch too, which then sends the task
    /// description again). `reason` names the outcome in the conditions (and `Stalled` when
    /// `stalled`), `event` is the Warning's reason. `pod`, if any, is deleted once the status
    /// that explains why is written.
    async fn launch_not_done(
        mut self,
        pod: Option<&Pod>,
        reason: &str,
        event: &str,
        stalled: bool,
        message: &str,
    ) -> Result<Requeue, Error> {
        let delete_pod = pod.map(|p| self.pod_deletion(p));
        let was_resume = self.status.active_resume_request.is_some();
        self.status.state = self
            .status
            .previous_state
            .unwrap_or(SessionState::WaitingForInput);
        self.status.needs_resume = true;
        self.status.is_resumable = true;
        self.status.resume_reason = Some(if self.objects.resume_token().is_some() {
            ResumeReason::AgentNotRunning
        } else {
            ResumeReason::AgentNotRunningFreshStart
        });
        self.status.error_message = Some(message.to_string());
        self.finish_request();
        let (ready_reason, stall_message) = if stalled {
            (reason, message)
        } else {
            ("ResumeFailed", "")
        };
        let mut wanted = vec![
            Want::new(conditions::STALLED, stalled, reason, stall_message),
            Want::new(conditions::READY, false, ready_reason, message),
            Want::new(conditions::NEEDS_RESUME, true, ready_reason, message),
            Want::new(conditions::RECONCILING, false, ready_reason, ""),
        ];
        if was_resume {
            wanted.push(Want::new(conditions::RESUMED, false, reason, message));
        }
        self.set_conditions(&wanted);
        self.write_status().await?;
        if let Some(delete_pod) = delete_pod {
            delete_pod.await;
        }
        if was_resume {
            metrics::global().resume_handled(ResumeOutcome::Failed);
        }
        self.event(EventType::Warning, event, "Launch", message);
        Ok(Requeue::Resync)
    }

    /// The API server refused an object of this launch (422/400): retrying cannot help until
    /// the spec changes, so the launch ends `Stalled` with reason `InvalidSpec` and the API
    /// server's words, instead of a hot loop.
    async fn invalid_spec(self, refusal: &str) -> Result<Requeue, Error> {
        let message = format!(
            "{refusal}. Fix the TaskSession spec (or the operator's pod settings), then set a new {RESUME_ANNOTATION} token; {}",
            self.what_is_kept()
        );
        self.launch_not_done(None, "InvalidSpec", "InvalidSpec", true, &message)
            .await
    }

    /// The end of a "not done" message: what survives for the next try.
    fn what_is_kept(&self) -> &'static str {
        if self.objects.resume_token().is_some() {
            "the resume token is kept"
        } else {
            "nothing is lost"
        }
    }

    /// Deletes `pod`, on the condition that it is still the pod of that UID (only the pod that
    /// was judged goes); `force`: with grace period 0, for a lost node whose kubelet never
    /// confirms. Whether the API server accepted the deletion (a pod already gone, or replaced
    /// by another of the same name, is left alone).
    async fn delete_pod_by_uid(&self, pod: &Pod, force: bool) -> bool {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let params = DeleteParams {
            grace_period_seconds: force.then_some(0),
            preconditions: pod.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match pods.delete(&pod.name_any(), &params).await {
            Ok(_) => {
                self.ctx.expectations.pod_gone(&self.uid, &pod.name_any());
                if let Some(uid) = &pod.metadata.uid {
                    self.ctx.expectations.deleted_pod(&self.uid, uid);
                }
                true
            }
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => false,
            Err(err) => {
                warn!(%err, pod = %pod.name_any(), "could not delete an agentctl pod");
                false
            }
        }
    }

    /// What the operator knows about the reachability of the session's running pod: its Ready
    /// condition (the kubelet's readiness probe of agentctl) and its node, from the caches.
    fn reach_facts(&self) -> Option<ReachFacts> {
        let pod = self.objects.running_pod()?;
        let settings = &self.ctx.settings;
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let node = match &self.ctx.nodes {
            Some(nodes) if !node_name.is_empty() => {
                let listed = nodes
                    .wait_until_ready()
                    .now_or_never()
                    .is_some_and(|r| r.is_ok());
                let cached = nodes.get(&ObjectRef::new(&node_name));
                node_health(pod, cached.as_deref(), listed)
            }
            _ => NodeHealth::Unknown,
        };
        // The launch's restore answered at the executor's lastSeenAt (of this pod only).
        let executor = self.objects.executor_status();
        let seen_alive = executor
            .last_seen_at
            .filter(|_| executor.pod_uid.is_some() && executor.pod_uid == pod.metadata.uid)
            .map(|t| t.0);
        Some(ReachFacts {
            pod: pod.name_any(),
            node_name,
            not_ready_since: not_ready_since(pod, seen_alive),
            unreachable_after: settings.agent_unreachable_after,
            node,
            node_lost_after: settings.node_lost_after,
        })
    }

    /// Deletes `pod` when awaited: after the status that explains why is written.
    fn pod_deletion(&self, pod: &Pod) -> impl Future<Output = ()> + use<'a> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let pod_name = pod.name_any();
        let pod_uid = pod.metadata.uid.clone();
        let (expectations, session) = (&self.ctx.expectations, self.uid.clone());
        async move {
            match pods.delete(&pod_name, &Default::default()).await {
                Ok(_) => {
                    expectations.pod_gone(&session, &pod_name);
                    if let Some(uid) = &pod_uid {
                        expectations.deleted_pod(&session, uid);
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    expectations.pod_gone(&session, &pod_name)
                }
                Err(err) => {
                    warn!(%err, pod = %pod_name, "could not delete the agentctl pod of a launch that did not finish")
                }
            }
        }
    }

    /// The launch's stall, once the launch deadline has passed since `pod` was created.
    fn stall(&self, pod: &Pod, agentctl_error: Option<&str>) -> Option<LaunchStall> {
        pod.metadata.creation_timestamp.as_ref()?;
        let deadline = self.ctx.settings.launch_deadline;
        launch_stall(pod, pod_age(pod), deadline, agentctl_error)
    }

    /// The launch did not reach a running agentctl within the deadline: `Stalled` with the
    /// pod's reason, the pod removed once the status says why, the request handled, the token
    /// kept, and the session `needsResume` (a new token retries) — a first launch as well.
    async fn stall_launch(self, pod: &Pod, stall: LaunchStall) -> Result<Requeue, Error> {
        let message = format!(
            "{}; {}. Set a new {RESUME_ANNOTATION} token to retry",
            stall.message,
            self.what_is_kept()
        );
        self.launch_not_done(Some(pod), stall.reason, "LaunchStalled", true, &message)
            .await
    }

    /// DESIGN §3 step 5 "Launch failure → FAILED with the reason"; the request is handled.
    async fn fail_launch(self, reason: &str) -> Result<Requeue, Error> {
        self.fail_launch_as("LaunchFailed", "LaunchFailed", reason)
            .await
    }

    /// [`Self::fail_launch`] with `code` as the conditions' reason and `event` as the Event's.
    async fn fail_launch_as(
        mut self,
        code: &str,
        event: &str,
        reason: &str,
    ) -> Result<Requeue, Error> {
        let was_resume = self.status.active_resume_request.is_some();
        self.status.state = SessionState::Failed;
        self.status.task_state = TaskState::Failed;
        self.status.error_message = Some(reason.to_string());
        self.finish_request();
        let mut wanted = vec![
            Want::new(conditions::READY, false, code, reason),
            Want::new(conditions::STALLED, true, code, reason),
            Want::new(conditions::RECONCILING, false, code, ""),
        ];
        if was_resume {
            // The outcome of this request, not a leftover of the previous one.
            wanted.push(Want::new(conditions::RESUMED, false, code, reason));
        }
        self.set_conditions(&wanted);
        self.write_status().await?;
        if was_resume {
            metrics::global().resume_handled(ResumeOutcome::Failed);
        }
        self.event(EventType::Warning, event, "Launch", reason);
        Ok(Requeue::AwaitChange)
    }

    /// Ends the handling of the latched request (success or terminal failure).
    fn finish_request(&mut self) {
        if let Some(token) = self.status.active_resume_request.take() {
            remember_handled(&mut self.status.recent_resume_requests, &token);
            self.status.last_handled_resume_request = Some(token);
        }
        self.status.previous_state = None;
    }

    /// The steady state: the pure [`observe`] decides, this applies its transition.
    async fn observe(self) -> Result<Requeue, Error> {
        let reach = self.reach_facts();
        let transition = observe(&self.objects, reach.as_ref(), Timestamp::now());
        self.apply_transition(transition).await
    }

    /// Applies a transition: the executor marked lost first (the session's status never claims
    /// more than its executor), then the status when it changed, then the pod deletion it
    /// explains, the metric and the Event.
    async fn apply_transition(mut self, transition: Transition) -> Result<Requeue, Error> {
        self.apply_effects(&transition).await?;
        Ok(transition.requeue)
    }

    async fn apply_effects(&mut self, transition: &Transition) -> Result<(), Error> {
        if let Some(NextAction::MarkExecutorLost { resumable }) = &transition.action {
            self.mark_executor_lost(*resumable).await?;
        }
        self.status = transition.status.clone();
        if transition.write {
            self.write_status().await?;
        }
        match &transition.action {
            Some(NextAction::Follow { pod }) => {
                if let Some(pod) = self.pod_named(pod) {
                    self.follow(pod, self.objects.annotation(PROMPTED_ANNOTATION));
                }
            }
            Some(NextAction::DeletePod { pod }) => {
                if let Some(pod) = self.pod_named(pod).cloned() {
                    self.pod_deletion(&pod).await;
                }
            }
            Some(NextAction::DeleteLostPod { pod, force }) => {
                if let Some(pod) = self.pod_named(pod).cloned()
                    && self.delete_pod_by_uid(&pod, *force).await
                {
                    info!(pod = %pod.name_any(), force, "deleted an agentctl pod that counts as lost");
                }
            }
            Some(NextAction::MarkExecutorLost { .. }) | None => {}
        }
        match transition.metric {
            Some(Metric::AgentLost) => metrics::global().agent_lost(),
            Some(Metric::ResumeHandled(outcome)) => metrics::global().resume_handled(outcome),
            None => {}
        }
        if let Some(note) = &transition.event {
            let type_ = if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.event(type_, note.reason, note.action, &note.message);
        }
        Ok(())
    }

    async fn mark_executor_lost(&self, resumable: bool) -> Result<(), Error> {
        let Some(er) = &self.objects.executor else {
            return Ok(());
        };
        let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let patch = json!({"status": {"status": ExecutorPhase::Lost, "resumable": resumable, "activity": null}});
        api.patch_status(
            &er.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(kube_err("marking the executor lost"))?;
        Ok(())
    }

    fn set_conditions(&mut self, wanted: &[Want]) {
        self.status.conditions = conditions::merge(
            &self.status.conditions,
            wanted,
            self.ts.metadata.generation,
            Timestamp::now(),
        );
    }

    /// Writes the whole status with server-side apply under one field manager, on the condition
    /// that the TaskSession is still the version this reconcile decided on: a decision made on
    /// a lagging cache fails with [`Error::Conflict`] instead of overwriting newer status.
    async fn write_status(&mut self) -> Result<(), Error> {
        self.status.observed_generation = self.ts.metadata.generation;
        if let Some(message) = &mut self.status.error_message {
            *message = cap(message, MESSAGE_MAX).into_owned();
        }
        let api: Api<TaskSession> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let patch = json!({
            "apiVersion": TaskSession::api_version(&()),
            "kind": TaskSession::kind(&()),
            "metadata": {"resourceVersion": self.resource_version},
            "status": self.status,
        });
        let written = api
            .patch_status(
                &self.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(conflict_or(
                "writing the TaskSession status",
                &self.ctx.expectations,
                &self.uid,
                self.resource_version.as_deref(),
            ))?;
        let version = written.metadata.resource_version;
        self.ctx.expectations.wrote(
            &self.uid,
            self.resource_version.as_deref(),
            version.as_deref(),
        );
        self.resource_version = version;
        Ok(())
    }

    fn event(&self, type_: EventType, reason: &str, action: &str, note: &str) {
        // Events with the same (type, reason, action) fold into one series that keeps the
        // first note: a second resume would show as "x2" of the first one in `kubectl
        // describe`. A hash of the note in the action keeps distinct events apart while true
        // repeats still fold.
        let action = format!("{action}:{}", names::short_hash(note));
        let event = OutgoingEvent {
            type_,
            reason,
            action: &action,
            note,
        };
        self.ctx.events.send(self.ts.object_ref(&()), &event);
    }
}

/// Crash-consistency tests: `KANDEV_FAULT_EXIT_AFTER=<step>` makes the operator exit right
/// after that step persisted (`starting`, `pod-created`), as a crash there would. Unset in any
/// real deployment, where it costs one environment lookup per step.
fn fault_point(step: &str) {
    if std::env::var("KANDEV_FAULT_EXIT_AFTER").is_ok_and(|v| v == step) {
        warn!(
            step,
            "KANDEV_FAULT_EXIT_AFTER: exiting as if the operator crashed here"
        );
        std::process::exit(3);
    }
}

/// How long ago `pod` was created (zero when it does not say).
fn pod_age(pod: &Pod) -> Duration {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|created| Duration::try_from(Timestamp::now().duration_since(created.0)).ok())
        .unwrap_or_default()
}

/// `auth_required` → `AuthRequired` (condition reasons are CamelCase).
/// `spec.end` as a condition reason.
fn end_word(end: SessionEnd) -> &'static str {
    match end {
        SessionEnd::Completed => "Completed",
        SessionEnd::Cancelled => "Cancelled",
    }
}

fn describe_launch(launch_id: &str) -> String {
    if launch_id == INITIAL_LAUNCH {
        "the first launch".to_string()
    } else {
        format!("resume request {launch_id:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_refusals_are_final_rbac_refusals_are_not() {
        assert!(refused_by_admission(
            403,
            "pods \"a\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true"
        ));
        assert!(refused_by_admission(
            403,
            "pods \"a\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'p' denied request: the kandev operator may only create pods labelled kandev.dev/managed=true"
        ));
        assert!(!refused_by_admission(
            403,
            "pods is forbidden: User \"system:serviceaccount:k:k\" cannot create resource \"pods\" in API group \"\" in the namespace \"x\""
        ));
        assert!(!refused_by_admission(409, "already exists"));
    }
}
