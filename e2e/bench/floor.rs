//! The API floor: only the calls a resume cannot avoid, N times at once — create the agentctl
//! pod (the operator's own pod builder, so the pod is the same: owned by its TaskSession, its
//! bound workspace claim mounted), wait for it Running through one
//! shared watch, one exec with one ACP `initialize` + `session/resume` round trip, one status
//! patch of the session's TaskSession (a custom resource: its status write costs the API server
//! several times a ConfigMap's, and a resume cannot write it anywhere else). Our resume
//! throughput is a ratio to this. No operator runs meanwhile: the TaskSessions stay as written.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kandev_operator::acp::PodConnection;
use kandev_operator::agents::{AgentProfile, AgentRegistry};
use kandev_operator::api::TaskSession;
use kandev_operator::api::names;
use kandev_operator::controller::pods::{self, PodSettings};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::BoxError;
use crate::cluster::{Bench, Watched};
use crate::ours::{AGENT_SESSION, PROFILE_NAME, profiles_yaml, session_names};
use crate::report::{FLOOR, PhaseResult};

const FLOOR_LABEL: &str = "kandev.dev/bench";

pub async fn run(bench: &Bench, n: usize) -> Result<PhaseResult, BoxError> {
    let ns = format!("bench-floor-{n}");
    bench.ensure_namespace(&ns).await?;
    let identity = bench.identity("floor").await?;
    let client = identity.client().await?;
    let names = session_names(n);
    let within = Duration::from_secs(120 + 2 * n as u64);
    // Setup, not measured: the sessions whose status the floor writes, their workspace claims
    // bound (as ours are when a resume starts), and each session's pod as the operator builds it.
    let pods = setup(bench, &ns, &names, within).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let watch = Watched::start(
        api.clone(),
        watcher::Config::default().labels(&format!("{FLOOR_LABEL}=floor")),
    )
    .await?;
    let status: Api<TaskSession> = Api::namespaced(client, &ns);

    let mut result = PhaseResult::new(FLOOR, "resume", n);
    let window = bench.window(None, None).await?;
    let outcomes: Vec<Result<Duration, String>> = stream::iter(names.iter().zip(&pods))
        .map(|(name, pod)| {
            let (api, status, watch) = (&api, &status, &watch);
            async move {
                let started = Instant::now();
                resume_once(api, status, watch, pod, name, started + within)
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

/// Creates the TaskSessions `names` and their workspace claims, waits until every claim is
/// bound, and returns each session's agentctl pod.
async fn setup(
    bench: &Bench,
    ns: &str,
    names: &[String],
    within: Duration,
) -> Result<Vec<Pod>, BoxError> {
    let sessions: Api<TaskSession> = Api::namespaced(bench.client.clone(), ns);
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
            let (sessions, claims) = (sessions.clone(), claims.clone());
            let (profile, settings) = (&profile, &settings);
            async move {
                let ts = sessions
                    .create(&PostParams::default(), &floor_session(name)?)
                    .await?;
                let claim = pods::build_workspace_claim(&ts).ok_or("no workspace template")?;
                claims.create(&PostParams::default(), &claim).await?;
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

/// What a resume cannot avoid, for one session.
async fn resume_once(
    pods: &Api<Pod>,
    status: &Api<TaskSession>,
    watch: &Watched<Pod>,
    pod: &Pod,
    name: &str,
    deadline: Instant,
) -> Result<(), BoxError> {
    pods.create(&PostParams::default(), pod).await?;
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
        match PodConnection::open(pods, &pod_name, names::CONTAINER).await {
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
    let patch = json!({"status": {
        "state": "WAITING_FOR_INPUT",
        "isResumable": true,
        "lastHandledResumeRequest": "resume-1",
    }});
    status
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
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
    let mut pod = pods::build_agentctl_pod(ts, "resume-1", settings, profile);
    pod.labels_mut()
        .insert(FLOOR_LABEL.to_string(), "floor".to_string());
    pod
}
