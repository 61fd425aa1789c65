//! The controller: its watches and caches, and each reconcile run as a task of its own through
//! kube's finalizer helper into [`super::reconcile`].

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, PodSpec};
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{Instrument, info, warn};

use super::context::{Clients, Context, OperatorSettings};
use super::error::{Error, conflict_or};
use super::events::{Publisher, Queue as EventQueue};
use super::expectations::Expectations;
use super::follower::Followers;
use super::metrics;
use super::pod_index::PodIndex;
use super::reconcile::{FINALIZER, MANAGER, Session};
use crate::agents::AgentRegistry;
use crate::api::{ExecutorRunning, MANAGED_LABEL, TaskSession};
use crate::resume::{RECHECK, bounded, loaded_at_rest};

/// Tasks that publish the reconciles' Events (one object's Events all go to one of them).
const EVENT_WORKERS: usize = 4;

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

/// A kind's cache and the stream of its changes; managedFields are dropped before caching:
/// nothing reads them and they are most of a small object.
fn slim_watch<K>(
    api: Api<K>,
) -> (
    reflector::Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + use<K>,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects();
    (store, events)
}

/// The pods the operator manages (by label), slimmed ([`slim_pod`]), their index by owner and
/// label, and the stream of their changes: deletions count too, a relaunch waits until the
/// previous pod is gone.
fn pod_watch(
    client: &Client,
    ns: Option<&str>,
) -> (
    reflector::Store<Pod>,
    Arc<PodIndex>,
    impl Stream<Item = Result<Pod, watcher::Error>> + Send + use<>,
) {
    let (pods, writer) = reflector::store();
    let managed = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    let pod_index = Arc::new(PodIndex::default());
    let index = pod_index.clone();
    let events = watcher(scoped::<Pod>(client, ns), managed)
        .default_backoff()
        .modify(slim_pod)
        .map_ok(move |event| {
            index.apply(&event);
            event
        })
        .reflect(writer)
        .touched_objects();
    (pods, pod_index, events)
}

/// Only whether a workspace claim exists matters: metadata, without labels and annotations.
fn claim_watch(
    client: &Client,
    ns: Option<&str>,
) -> (
    reflector::Store<PartialObjectMeta<PersistentVolumeClaim>>,
    impl Stream<Item = Result<PartialObjectMeta<PersistentVolumeClaim>, watcher::Error>> + Send + use<>,
) {
    let (claims, writer) = reflector::store();
    let api = scoped::<PartialObjectMeta<PersistentVolumeClaim>>(client, ns);
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|pvc| {
            pvc.metadata.managed_fields = None;
            pvc.metadata.annotations = None;
            pvc.metadata.labels = None;
        })
        .reflect(writer)
        .applied_objects();
    (claims, events)
}

/// Nodes only fill their cache, when lost nodes are looked for (`--node-lost-seconds`; a lost
/// node is found on the sessions' own passes); their image lists, the bulk of a Node, are
/// dropped before caching.
fn node_watch(
    client: &Client,
    enabled: bool,
) -> (
    Option<reflector::Store<Node>>,
    BoxStream<'static, Result<Node, watcher::Error>>,
) {
    if !enabled {
        return (None, futures::stream::empty().boxed());
    }
    let (nodes, writer) = reflector::store();
    let events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(|node| {
            node.managed_fields_mut().clear();
            if let Some(status) = node.status.as_mut() {
                status.images = None;
            }
        })
        .reflect(writer)
        .applied_objects()
        .boxed();
    (Some(nodes), events)
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
    let (executors, executor_events) = slim_watch(scoped::<ExecutorRunning>(&client, ns));
    let (pods, pod_index, pod_events) = pod_watch(&client, ns);
    let (claims, claim_events) = claim_watch(&client, ns);
    let (nodes, node_events) = node_watch(&client, settings.node_lost_after.is_some());
    let (sessions, session_events) = slim_watch(scoped::<TaskSession>(&client, ns));
    // The followers post what they read and wake the session; its reconcile writes it.
    let (followers, woken) = Followers::new(pods.clone(), settings.probe());
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
        followers,
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
        .reconcile_on(woken)
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
            &PatchParams::apply(MANAGER),
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
