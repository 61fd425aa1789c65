//! Idle fleet mode: K sessions (10,000 by default) in their steady state without any process —
//! TaskSession, ExecutorRunning and a Running pod per session, written by the bench while the
//! operator is stopped (kwok keeps the pods Running; there is no harness in this mode). Then the
//! operator starts: how long until it has reconciled every session, and what the fleet costs
//! the API server and the operator's memory while nothing happens.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kandev_operator::api::conditions;
use kandev_operator::api::{ExecutorRunning, MANAGED_LABEL, SESSION_LABEL, TaskSession};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::BoxError;
use crate::annotations::HARNESS_PID_ANNOTATION;
use crate::cluster::{Bench, Watched, create_retrying, retrying};
use crate::ours::{OperatorProcess, PROFILE_NAME, for_each, overdue_sessions, session_names};
use crate::probe;
use crate::report::{OURS, PhaseResult};

pub async fn run(bench: &Bench, k: usize, idle: Duration) -> Result<Vec<PhaseResult>, BoxError> {
    let ns = "bench-idle";
    bench.ensure_namespace(ns).await?;
    let names = session_names(k);
    let started = Instant::now();
    let sessions: Api<TaskSession> = Api::namespaced(bench.client.clone(), ns);
    let executors: Api<ExecutorRunning> = Api::namespaced(bench.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(bench.client.clone(), ns);
    let done = std::sync::atomic::AtomicUsize::new(0);
    for_each(&names, |name| {
        let (sessions, executors, pods, done) = (&sessions, &executors, &pods, &done);
        async move {
            steady_session(sessions, executors, pods, ns, &name).await?;
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n % 1000 == 0 {
                eprintln!(
                    "[bench] idle fleet: {n}/{k} sessions written ({:.0}s)",
                    started.elapsed().as_secs_f64()
                );
            }
            Ok(())
        }
    })
    .await?;
    eprintln!(
        "[bench] idle fleet: {k} sessions in their steady state in {:.0}s; starting the operator",
        started.elapsed().as_secs_f64()
    );

    let identity = bench.identity("operator").await?;
    let mut startup = PhaseResult::new(OURS, "idle-fleet startup", k);
    let window = bench.window(None, None).await?;
    // The default reachability settings: kwok reports these pods Ready (no readiness probe
    // runs in them), so nothing is unreachable, and an idle, caught-up session is never read.
    let operator = OperatorProcess::start_with(
        bench,
        &format!("operator-idle-{k}"),
        &identity.kubeconfig,
        &[],
    )
    .await?;
    // Every session evaluated once: it carries the operator's AgentRunning condition. The
    // steady window starts only then (or at this cap), so that it measures the steady state.
    // Counted from a watch, not by listing 10,000 sessions every few seconds: a LIST that size
    // every 2 s cost the API server more than the operator did.
    const STARTUP_CAP: Duration = Duration::from_secs(1800);
    let deadline = Instant::now() + STARTUP_CAP;
    let watched = Watched::start(sessions.clone(), watcher::Config::default()).await?;
    loop {
        let evaluated = watched
            .store
            .state()
            .iter()
            .filter(|ts| {
                ts.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == conditions::AGENT_RUNNING)
                })
            })
            .count();
        if evaluated >= k {
            startup.completed = k;
            break;
        }
        if Instant::now() > deadline {
            startup.completed = evaluated;
            startup.notes.push(format!(
                "only {evaluated} of {k} sessions evaluated within {}s",
                STARTUP_CAP.as_secs()
            ));
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    drop(watched);
    startup.seconds = window.started.elapsed().as_secs_f64();
    bench
        .close(
            window,
            &identity.user,
            Some(operator.pid()),
            None,
            &mut startup,
        )
        .await?;
    if let Some(s) = probe::sample(operator.pid()) {
        startup.rss_mib = Some(s.rss_mib);
        startup.peak_rss_mib = Some(s.peak_rss_mib);
    }
    startup.overdue_sessions = Some(overdue_sessions(&operator.metrics).await?);

    let mut steady = PhaseResult::new(OURS, "idle-fleet steady", k);
    let window = bench
        .window(Some(operator.pid()), Some(&operator.metrics))
        .await?;
    tokio::time::sleep(idle).await;
    steady.seconds = idle.as_secs_f64();
    steady.completed = k;
    bench
        .close(
            window,
            &identity.user,
            Some(operator.pid()),
            Some(&operator.metrics),
            &mut steady,
        )
        .await?;
    steady.overdue_sessions = Some(overdue_sessions(&operator.metrics).await?);
    let per_second = steady.requests.total() as f64 / steady.seconds.max(1.0);
    steady.notes.push(format!(
        "operator API requests per second with {k} idle sessions: {per_second:.1}; the cluster is torn down afterwards, not cleaned"
    ));
    drop(operator);
    Ok(vec![startup, steady])
}

/// One session as the operator leaves it after a successful launch: WAITING_FOR_INPUT, its
/// ExecutorRunning with a token and the pod's UID, and a Running pod it owns.
async fn steady_session(
    sessions: &Api<TaskSession>,
    executors: &Api<ExecutorRunning>,
    pods: &Api<Pod>,
    ns: &str,
    name: &str,
) -> Result<(), BoxError> {
    let ts: TaskSession = serde_json::from_value(json!({
        "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"taskId": format!("task-{name}"), "agent": PROFILE_NAME,
                 "workspace": {"claimName": "idle-shared"}},
    }))?;
    let ts = create_retrying(sessions, &ts).await?;
    let owner = ts.controller_owner_ref(&()).ok_or("no owner reference")?;
    // The harness's pid annotation lets our kwok stage mark the pod Running (e2e/cluster.sh):
    // set by the bench itself here, since no harness plays these pods.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-idle"), "namespace": ns,
                     "labels": {MANAGED_LABEL: "true", SESSION_LABEL: name},
                     "annotations": {HARNESS_PID_ANNOTATION: "0"},
                     "ownerReferences": [owner]},
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "agentctl", "image": "kandev.dev/agentctl:bench",
                                 "command": ["agentctl", "serve"]}]},
    }))?;
    let pod = create_retrying(pods, &pod).await?;
    let er: ExecutorRunning = serde_json::from_value(json!({
        "apiVersion": "kandev.dev/v1alpha1", "kind": "ExecutorRunning",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner]},
        "spec": {"sessionName": name},
    }))?;
    create_retrying(executors, &er).await?;
    let er_status = json!({"status": {
        "resumeToken": "bench-session", "podName": pod.name_any(), "podUID": pod.metadata.uid,
        "status": "Running", "activity": "Idle", "resumable": true}});
    retrying("the ExecutorRunning status", || async {
        executors
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&er_status))
            .await
    })
    .await?;
    let ts_status = json!({"status": {
        "state": "WAITING_FOR_INPUT", "taskState": "REVIEW", "executorRef": name,
        "lastHandledResumeRequest": null}});
    retrying("the TaskSession status", || async {
        sessions
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&ts_status))
            .await
    })
    .await?;
    Ok(())
}
