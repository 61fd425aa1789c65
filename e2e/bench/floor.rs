//! The API floor: only the calls a resume cannot avoid, N times at once — create the agentctl
//! pod (the operator's own pod builder, so the pod is the same), wait for it Running through one
//! shared watch, one exec with one ACP `initialize` + `session/resume` round trip, one status
//! patch of the session's TaskSession (a custom resource: its status write costs the API server
//! several times a ConfigMap's, and a resume cannot write it anywhere else). Our resume
//! throughput is a ratio to this. No operator runs meanwhile: the TaskSessions stay as written.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kandev_operator::acp::PodConnection;
use kandev_operator::agents::AgentRegistry;
use kandev_operator::api::names;
use kandev_operator::api::{MANAGED_LABEL, TaskSession};
use kandev_operator::controller::pods::{self, PodSettings};
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
    // Setup, not measured: the sessions whose status the floor writes.
    let sessions: Api<TaskSession> = Api::namespaced(bench.client.clone(), &ns);
    for chunk in names.chunks(32) {
        let creates = chunk.iter().map(|name| {
            let sessions = sessions.clone();
            async move {
                sessions
                    .create(&PostParams::default(), &floor_session(name)?)
                    .await?;
                Ok::<_, BoxError>(())
            }
        });
        futures::future::try_join_all(creates).await?;
    }
    let template = floor_pod_template(&ns)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let watch = Watched::start(
        pods.clone(),
        watcher::Config::default().labels(&format!("{FLOOR_LABEL}=floor")),
    )
    .await?;
    let status: Api<TaskSession> = Api::namespaced(client, &ns);

    let mut result = PhaseResult::new(FLOOR, "resume", n);
    let window = bench.window(None, None).await?;
    let within = Duration::from_secs(120 + 2 * n as u64);
    let outcomes: Vec<Result<Duration, String>> = stream::iter(names.iter())
        .map(|name| {
            let (pods, status, watch, template) = (&pods, &status, &watch, &template);
            async move {
                let started = Instant::now();
                resume_once(pods, status, watch, template, name, started + within)
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

/// What a resume cannot avoid, for one session.
async fn resume_once(
    pods: &Api<Pod>,
    status: &Api<TaskSession>,
    watch: &Watched<Pod>,
    template: &Pod,
    name: &str,
    deadline: Instant,
) -> Result<(), BoxError> {
    let mut pod = template.clone();
    pod.metadata.name = Some(name.to_string());
    pods.create(&PostParams::default(), &pod).await?;
    let left = deadline.saturating_duration_since(Instant::now());
    let running = watch
        .until_one(name, left, |p: &Pod| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await;
    if running.is_none() {
        return Err("pod not Running in time".into());
    }
    // agentctl may not listen yet right after the pod turned Running (the operator retries too).
    let mut connection = loop {
        match PodConnection::open(pods, name, names::CONTAINER).await {
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

/// A session of the bench profile that no operator handles (none runs during the floor).
fn floor_session(name: &str) -> Result<TaskSession, BoxError> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
        "metadata": {"name": name},
        "spec": {"taskId": name, "agent": PROFILE_NAME, "workspace": {"claimName": "unused"}},
    }))?)
}

/// The operator's agentctl pod for a session of the bench profile, without the session: no
/// owner, an emptyDir workspace, labels that the operator does not select.
fn floor_pod_template(ns: &str) -> Result<Pod, BoxError> {
    let mut registry = AgentRegistry::builtin()?;
    registry.extend_from_yaml(&profiles_yaml(), "bench")?;
    let profile = registry
        .get(PROFILE_NAME)
        .ok_or("bench profile missing")?
        .clone();
    let mut ts = floor_session("floor")?;
    ts.metadata.namespace = Some(ns.to_string());
    ts.metadata.uid = Some("00000000-0000-0000-0000-000000000000".to_string());
    let settings = PodSettings {
        default_image: "kandev.dev/agentctl:bench".into(),
        tolerations: Vec::new(),
        node_selector: Default::default(),
        run_as_user: 1000,
        replay_line_limit_mib: 8,
        ..Default::default()
    };
    let mut pod = pods::build_agentctl_pod(&ts, "floor", &settings, &profile);
    pod.metadata.owner_references = None;
    pod.metadata.labels = Some(
        [(MANAGED_LABEL, "true"), (FLOOR_LABEL, "floor")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let spec = pod.spec.as_mut().ok_or("pod without spec")?;
    for volume in spec.volumes.iter_mut().flatten() {
        if volume.persistent_volume_claim.is_some() {
            volume.persistent_volume_claim = None;
            volume.empty_dir = Some(Default::default());
        }
    }
    Ok(pod)
}
