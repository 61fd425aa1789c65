//! The API floor: only the calls a resume cannot avoid, N times at once — create the agentctl
//! pod (the operator's own pod builder, so the pod is the same: owned by its TaskSession, its
//! bound workspace claim mounted), wait for it Running through one
//! shared watch, one exec with one ACP `initialize` + `session/resume` round trip, one status
//! patch of the session's TaskSession (a custom resource: its status write costs the API server
//! several times a ConfigMap's, and a resume cannot write it anywhere else). Our resume
//! throughput is a ratio to this. No operator runs meanwhile: the TaskSessions stay as written.
//!
//! The floor with the write budget ([`Variant::Budget`]) adds, per session and in the order a
//! resume makes them, every other write the fleet issue's budget allows: the user's resume
//! annotation (written by the bench, as in our phase), the latch (a TaskSession status write),
//! the ExecutorRunning status write and two Events. Nothing waits between them for a watch, a
//! queue or a reconcile: it is what any operator within that budget could reach on this cluster.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kandev_operator::acp::PodConnection;
use kandev_operator::agents::{AgentProfile, AgentRegistry};
use kandev_operator::api::names;
use kandev_operator::api::pod_contract::CheckoutStart;
use kandev_operator::api::{ExecutorRunning, RESUME_ANNOTATION, TaskSession};
use kandev_operator::controller::pods::{self, PodSettings};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::BoxError;
use crate::cluster::{Bench, Watched};
use crate::ours::{AGENT_SESSION, PROFILE_NAME, profiles_yaml, session_names};
use crate::report::{BUDGET, FLOOR, PhaseResult};

const FLOOR_LABEL: &str = "kandev.dev/bench";

/// What the floor does for each session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Only the calls a resume cannot avoid.
    Floor,
    /// Those, plus the other writes of the fleet issue's budget (see the module's text).
    Budget,
}

impl Variant {
    pub const ALL: [Variant; 2] = [Variant::Floor, Variant::Budget];

    /// Its name in `--contenders`, which also names its ServiceAccount and namespace.
    pub fn arg(self) -> &'static str {
        match self {
            Variant::Floor => "floor",
            Variant::Budget => "floor-budget",
        }
    }

    /// Its name in the report.
    fn contender(self) -> &'static str {
        match self {
            Variant::Floor => FLOOR,
            Variant::Budget => BUDGET,
        }
    }
}

/// The clients of one floor run: the contender's own and, for the user's annotation, the
/// bench's.
struct Apis {
    pods: Api<Pod>,
    sessions: Api<TaskSession>,
    executors: Api<ExecutorRunning>,
    events: Api<Event>,
    user: Api<TaskSession>,
    ns: String,
    variant: Variant,
}

impl Apis {
    /// Publishes an Event about the session `name`, as the operator does.
    async fn event(&self, name: &str, reason: &str) -> Result<(), BoxError> {
        let event = budget_event(&self.ns, name, reason)?;
        self.events.create(&PostParams::default(), &event).await?;
        Ok(())
    }
}

pub async fn run(bench: &Bench, n: usize, variant: Variant) -> Result<PhaseResult, BoxError> {
    let ns = format!("bench-{}-{n}", variant.arg());
    bench.ensure_namespace(&ns).await?;
    let identity = bench.identity(variant.arg()).await?;
    let client = identity.client().await?;
    let names = session_names(n);
    let within = Duration::from_secs(120 + 2 * n as u64);
    // Setup, not measured: the sessions whose status the floor writes (with their
    // ExecutorRunnings for the budget), their workspace claims bound (as ours are when a resume
    // starts), and each session's pod as the operator builds it.
    let pods = setup(bench, &ns, &names, variant, within).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let watch = Watched::start(
        api.clone(),
        watcher::Config::default().labels(&format!("{FLOOR_LABEL}=floor")),
    )
    .await?;
    let apis = Apis {
        pods: api,
        sessions: Api::namespaced(client.clone(), &ns),
        executors: Api::namespaced(client.clone(), &ns),
        events: Api::namespaced(client, &ns),
        user: Api::namespaced(bench.client.clone(), &ns),
        ns: ns.clone(),
        variant,
    };

    let mut result = PhaseResult::new(variant.contender(), "resume", n);
    let window = bench.window(None, None).await?;
    let outcomes: Vec<Result<Duration, String>> = stream::iter(names.iter().zip(&pods))
        .map(|(name, pod)| {
            let (apis, watch) = (&apis, &watch);
            async move {
                let started = Instant::now();
                resume_once(apis, watch, pod, name, started + within)
                    .await
                    .map(|()| started.elapsed())
                    .map_err(|e| format!("{name}: {e}"))
            }
        })
        .buffer_unordered(n.max(1))
        .collect()
        .await;
    result.seconds = window.started.elapsed().as_secs_f64();
    let (ok, failed): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
    result.set_latencies(ok.into_iter().filter_map(Result::ok).collect());
    if let Some(Err(first)) = failed.first() {
        result
            .notes
            .push(format!("{} failed (first: {first})", failed.len()));
    }
    bench
        .close(window, &identity.user, None, None, &mut result)
        .await?;
    drop(watch);
    if let Err(e) = bench.delete_namespace(&ns, Duration::from_secs(180)).await {
        eprintln!("[bench] cleanup of {ns}: {e}");
    }
    Ok(result)
}

/// Creates the TaskSessions `names` and their workspace claims (and, for the budget, their
/// ExecutorRunnings), waits until every claim is bound, and returns each session's agentctl pod.
async fn setup(
    bench: &Bench,
    ns: &str,
    names: &[String],
    variant: Variant,
    within: Duration,
) -> Result<Vec<Pod>, BoxError> {
    let sessions: Api<TaskSession> = Api::namespaced(bench.client.clone(), ns);
    let executors: Api<ExecutorRunning> = Api::namespaced(bench.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bench.client.clone(), ns);
    let bound = Watched::start(claims.clone(), watcher::Config::default()).await?;
    let profile = bench_profile()?;
    let settings = PodSettings {
        default_image: "kandev.dev/agentctl:bench".into(),
        tolerations: Vec::new(),
        node_selector: Default::default(),
        run_as_user: 1000,
        replay_line_limit_mib: 8,
        ..Default::default()
    };
    let mut pods = Vec::with_capacity(names.len());
    let mut claim_names = Vec::with_capacity(names.len());
    for chunk in names.chunks(32) {
        let creates = chunk.iter().map(|name| {
            let (sessions, claims, executors) =
                (sessions.clone(), claims.clone(), executors.clone());
            let (profile, settings) = (&profile, &settings);
            async move {
                let ts = sessions
                    .create(&PostParams::default(), &floor_session(name)?)
                    .await?;
                let claim = pods::build_workspace_claim(&ts).ok_or("no workspace template")?;
                claims.create(&PostParams::default(), &claim).await?;
                if variant == Variant::Budget {
                    executors
                        .create(&PostParams::default(), &budget_executor(&ts)?)
                        .await?;
                }
                let pod = floor_pod(&ts, profile, settings);
                Ok::<_, BoxError>((names::workspace_claim_name(&ts), pod))
            }
        });
        for (claim, pod) in futures::future::try_join_all(creates).await? {
            claim_names.push(claim);
            pods.push(pod);
        }
    }
    let reached = bound
        .until_all(&claim_names, within, |c: &PersistentVolumeClaim| {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await;
    if reached.len() < claim_names.len() {
        return Err(format!(
            "{} of {} workspace claims not bound within {within:?}",
            claim_names.len() - reached.len(),
            claim_names.len()
        )
        .into());
    }
    Ok(pods)
}

/// What a resume cannot avoid, for one session (with the budget: and the other writes it
/// allows, in the order a resume makes them).
async fn resume_once(
    apis: &Apis,
    watch: &Watched<Pod>,
    pod: &Pod,
    name: &str,
    deadline: Instant,
) -> Result<(), BoxError> {
    let budget = apis.variant == Variant::Budget;
    if budget {
        let token = json!({"metadata": {"annotations": {RESUME_ANNOTATION: "resume-1"}}});
        apis.user
            .patch(name, &PatchParams::default(), &Patch::Merge(&token))
            .await?;
        let latch = json!({"status": {
            "state": "STARTING",
            "activeResumeRequest": "resume-1",
            "conditions": conditions(true),
        }});
        apis.sessions
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&latch))
            .await?;
        apis.event(name, "ResumeStarted").await?;
    }
    let created = apis.pods.create(&PostParams::default(), pod).await?;
    let pod_name = pod.name_any();
    let left = deadline.saturating_duration_since(Instant::now());
    let running = watch
        .until_one(&pod_name, left, |p: &Pod| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await;
    if running.is_none() {
        return Err("pod not Running in time".into());
    }
    // agentctl may not listen yet right after the pod turned Running (the operator retries too).
    let mut connection = loop {
        match PodConnection::open(
            &apis.pods,
            &pod_name,
            kandev_operator::api::pod_contract::CONTAINER,
        )
        .await
        {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    connection.client.initialize().await?;
    connection
        .client
        .resume_session(AGENT_SESSION, &PathBuf::from("/workspace"))
        .await?;
    connection.close(Duration::from_secs(5)).await;
    let mut result = json!({"status": {
        "state": "WAITING_FOR_INPUT",
        "isResumable": true,
        "lastHandledResumeRequest": "resume-1",
    }});
    if budget {
        result["status"]["activeResumeRequest"] = serde_json::Value::Null;
        result["status"]["conditions"] = conditions(false);
    }
    apis.sessions
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&result))
        .await?;
    if budget {
        let uid = created.uid().unwrap_or_default();
        let executor = json!({"status": {
            "status": "Running",
            "podName": pod_name,
            "podUID": uid,
            "agentExecutionId": uid,
            "resumeToken": AGENT_SESSION,
            "resumable": true,
            "lastSeenAt": Timestamp::now().to_string(),
            "journalCursor": 3,
        }});
        apis.executors
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&executor))
            .await?;
        apis.event(name, "Resumed").await?;
    }
    Ok(())
}

/// A TaskSession's conditions as the operator writes them while a resume is under way
/// (`launching`) or after it.
fn conditions(launching: bool) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let rows = [
        ("AgentRunning", !launching, "AgentRunning", "PodNotRunning"),
        ("NeedsResume", false, "", "Resumed"),
        ("Ready", !launching, "Ready", "Starting"),
        ("Reconciling", launching, "Resuming", "Idle"),
        ("Stalled", false, "", "Started"),
    ];
    rows.iter()
        .map(|(type_, on, reason_on, reason_off)| {
            json!({"type": type_, "status": if *on { "True" } else { "False" },
                   "reason": if *on { reason_on } else { reason_off }, "message": "",
                   "lastTransitionTime": now, "observedGeneration": 1})
        })
        .collect()
}

/// The ExecutorRunning of `ts`, as the operator creates it at the first launch.
fn budget_executor(ts: &TaskSession) -> Result<ExecutorRunning, BoxError> {
    let name = ts.name_any();
    Ok(serde_json::from_value(json!({
        "apiVersion": "kandev.dev/v1alpha1", "kind": "ExecutorRunning",
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession", "name": name,
            "uid": ts.uid().unwrap_or_default(), "controller": true}]},
        "spec": {"sessionName": name},
    }))?)
}

/// An Event about the session `name` in `ns`, as the operator publishes one.
fn budget_event(ns: &str, name: &str, reason: &str) -> Result<Event, BoxError> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("{name}.{}", reason.to_lowercase())},
        "eventTime": Timestamp::now().to_string(),
        "reportingController": "kandev.dev/bench",
        "reportingInstance": "bench",
        "action": "Resume",
        "reason": reason,
        "type": "Normal",
        "note": format!("{reason} (bench)"),
        "regarding": {"apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
                      "namespace": ns, "name": name},
    }))?)
}

/// A session of the bench profile that no operator handles (none runs during the floor), with
/// the workspace template of ours.
fn floor_session(name: &str) -> Result<TaskSession, BoxError> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
        "metadata": {"name": name},
        "spec": {"taskId": name, "agent": PROFILE_NAME,
                 "workspace": {"template": {"size": "1Gi"}}},
    }))?)
}

/// The bench's agent profile, as the operator reads it from `--agent-profiles`.
fn bench_profile() -> Result<AgentProfile, BoxError> {
    let mut registry = AgentRegistry::builtin()?;
    registry.extend_from_yaml(&profiles_yaml(), "bench")?;
    Ok(registry
        .get(PROFILE_NAME)
        .ok_or("bench profile missing")?
        .clone())
}

/// The operator's agentctl pod for a resume of `ts` (owned by it, its workspace claim mounted),
/// with one more label, which the floor's watch selects.
fn floor_pod(ts: &TaskSession, profile: &AgentProfile, settings: &PodSettings) -> Pod {
    let mut pod = pods::build_agentctl_pod(ts, "resume-1", settings, profile, CheckoutStart::First);
    pod.labels_mut()
        .insert(FLOOR_LABEL.to_string(), "floor".to_string());
    pod
}
