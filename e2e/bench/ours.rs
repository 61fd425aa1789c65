//! Our operator through the fleet phases: launch, loss, resume, storm, idle, suspend.
//!
//! The operator runs as a local process under a ServiceAccount of its own (so the audit log
//! tells its requests apart), with the built-in profiles plus `bench-agent`: `kandev-test-agent`,
//! which answers at once and logs every call into the session's workspace — the ground truth for
//! repeated in-pod operations.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kandev_operator::api::{
    MANAGED_LABEL, RESUME_ANNOTATION, ResumeReason, SESSION_LABEL, SessionState, TaskSession,
};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::watcher;
use serde_json::json;

use crate::BoxError;
use crate::cluster::{Bench, Watched, create_retrying, http_get, retrying};
use crate::process::{dies_with_us, free_port, sibling, stop_child};
use crate::report::{OURS, PhaseResult};

/// The test agent's profile: instant answers, one known session, a call log in the workspace.
pub const PROFILE_NAME: &str = "bench-agent";
pub const AGENT_SESSION: &str = "bench-session";
pub const CALL_LOG: &str = "bench-agent-calls.log";

pub fn profiles_yaml() -> String {
    format!(
        "profiles:\n  {PROFILE_NAME}:\n    launch: [\"kandev-test-agent\", \"--new-session-id\", \"{AGENT_SESSION}\", \"--known-session\", \"{AGENT_SESSION}\", \"--log\", \"{CALL_LOG}\"]\n    nativeSessionResume: true\n    historyContextInjection: false\n"
    )
}

/// Requests in flight at once from the bench itself (creates, deletes; resume tokens go at once).
const BENCH_CONCURRENCY: usize = 32;

pub const PHASES: [&str; 6] = ["launch", "loss", "resume", "storm", "idle", "suspend"];

/// The operator as a child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct OperatorProcess {
    child: std::process::Child,
    pub metrics: String,
    pub log: PathBuf,
}

impl OperatorProcess {
    pub async fn start(bench: &Bench, name: &str, kubeconfig: &Path) -> Result<Self, BoxError> {
        Self::start_with(bench, name, kubeconfig, &[]).await
    }

    /// [`Self::start`] with `extra` operator flags.
    pub async fn start_with(
        bench: &Bench,
        name: &str,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> Result<Self, BoxError> {
        let profiles = bench.work.join("bench-profiles.yaml");
        std::fs::write(&profiles, profiles_yaml())?;
        let port = free_port()?;
        let metrics = format!("127.0.0.1:{port}");
        let log = bench.work.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = dies_with_us(&mut std::process::Command::new(sibling("kandev-operator")?))
            .args(["run", "--no-leader-election", "--http-address", &metrics])
            .args(["--agentctl-image", "kandev.dev/agentctl:bench"])
            .arg("--agent-profiles")
            .arg(&profiles)
            .args(extra)
            // More flags for every operator the bench starts, e.g. to compare settings.
            .args(
                std::env::var("BENCH_OPERATOR_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KANDEV_FAULT_EXIT_AFTER")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        let mut operator = Self {
            child,
            metrics,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = operator.child.try_wait()? {
                return Err(format!(
                    "operator exited at start ({status}); log {}",
                    operator.log.display()
                )
                .into());
            }
            if http_get(&operator.metrics, "/readyz").await.is_ok() {
                return Ok(operator);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "operator not ready within 60s; log {}",
                    operator.log.display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// `kandev_sessions_overdue` from the operator's `/metrics` at `url` (`host:port`): its
/// watchdog's count of sessions stuck past the operator's own deadlines.
pub async fn overdue_sessions(url: &str) -> Result<u64, BoxError> {
    let text = http_get(url, "/metrics").await?;
    let overdue = crate::probe::sum_by(&text, "kandev_sessions_overdue", &[]);
    match overdue.values().next() {
        Some(value) => Ok(value.max(0.0) as u64),
        None => Err(format!("no kandev_sessions_overdue in the metrics of {url}").into()),
    }
}

pub fn session_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("s-{i:05}")).collect()
}

/// One fleet of N sessions in its own namespace, driven through `phases`.
pub async fn run(
    bench: &Bench,
    n: usize,
    phases: &[String],
    idle: Duration,
) -> Result<Vec<PhaseResult>, BoxError> {
    let ns = format!("bench-ours-{n}");
    bench.ensure_namespace(&ns).await?;
    let identity = bench.identity("operator").await?;
    let operator =
        OperatorProcess::start(bench, &format!("operator-{n}"), &identity.kubeconfig).await?;
    eprintln!(
        "[bench] ours N={n}: operator pid {} (log {})",
        operator.pid(),
        operator.log.display()
    );
    let fleet = Fleet::new(bench, &ns, n, operator, identity.user).await?;
    let wants = |p: &str| phases.iter().any(|x| x == p);
    let last = PHASES.iter().rposition(|p| wants(p)).unwrap_or(0);
    let mut results = Vec::new();
    let outcome = async {
        for (i, phase) in PHASES.iter().enumerate().take(last + 1) {
            // Earlier phases run when a later one needs their state (idle leaves none); only
            // selected ones count.
            let result = match *phase {
                "launch" => fleet.launch().await?,
                "loss" => fleet.loss().await?,
                "resume" => fleet.resume().await?,
                "storm" => fleet.storm().await?,
                "idle" if wants(phase) => fleet.idle(idle).await?,
                "idle" => continue,
                _ => fleet.suspend().await?,
            };
            eprintln!(
                "[bench] ours N={n} {phase}: {}/{} in {:.1}s{}",
                result.completed,
                n,
                result.seconds,
                if result.notes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", result.notes.join("; "))
                }
            );
            if wants(phase) || i == last {
                results.push(result);
            }
        }
        Ok::<_, BoxError>(())
    }
    .await;
    fleet.teardown().await;
    outcome?;
    Ok(results)
}

struct Fleet<'a> {
    bench: &'a Bench,
    ns: String,
    names: Vec<String>,
    operator: OperatorProcess,
    user: String,
    sessions: Watched<TaskSession>,
    pods: Watched<Pod>,
    /// Every pod UID ever seen per session: one `initialize` and one restore each is expected.
    pod_uids: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    /// Repeated in-pod operations counted so far (each phase reports its increase).
    duplicates: AtomicU64,
    /// Whether the sessions' pods are live (a phase that needs them lost deletes them first).
    running: AtomicBool,
    within: Duration,
}

impl<'a> Fleet<'a> {
    async fn new(
        bench: &'a Bench,
        ns: &str,
        n: usize,
        operator: OperatorProcess,
        user: String,
    ) -> Result<Self, BoxError> {
        let client = bench.client.clone();
        let sessions = Watched::start(
            Api::namespaced(client.clone(), ns),
            watcher::Config::default(),
        )
        .await?;
        let pod_uids: Arc<Mutex<HashMap<String, HashSet<String>>>> = Arc::default();
        let record = pod_uids.clone();
        let pods = Watched::start_with(
            Api::namespaced(client, ns),
            watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true")),
            move |pod: &Pod| {
                if let (Some(session), Some(uid)) =
                    (pod.labels().get(SESSION_LABEL), pod.metadata.uid.as_ref())
                    && let Ok(mut map) = record.lock()
                {
                    map.entry(session.clone()).or_default().insert(uid.clone());
                }
            },
        )
        .await?;
        Ok(Self {
            bench,
            ns: ns.to_string(),
            names: session_names(n),
            operator,
            user,
            sessions,
            pods,
            pod_uids,
            duplicates: AtomicU64::new(0),
            running: AtomicBool::new(false),
            // Generous: a phase that does not finish is a result (reported), not a hang.
            within: Duration::from_secs(120 + 2 * n as u64),
        })
    }

    fn api(&self) -> Api<TaskSession> {
        Api::namespaced(self.bench.client.clone(), &self.ns)
    }

    async fn window(&self) -> Result<crate::cluster::Window, BoxError> {
        self.bench
            .window(Some(self.operator.pid()), Some(&self.operator.metrics))
            .await
    }

    async fn close(
        &self,
        window: crate::cluster::Window,
        result: &mut PhaseResult,
    ) -> Result<(), BoxError> {
        self.bench
            .close(
                window,
                &self.user,
                Some(self.operator.pid()),
                Some(&self.operator.metrics),
                result,
            )
            .await?;
        let total = self.count_duplicates()?;
        let seen = self.duplicates.fetch_max(total, Ordering::Relaxed);
        result.duplicate_in_pod_ops = Some(total.saturating_sub(seen));
        result.overdue_sessions = Some(overdue_sessions(&self.operator.metrics).await?);
        Ok(())
    }

    async fn launch(&self) -> Result<PhaseResult, BoxError> {
        let result = PhaseResult::new(OURS, "launch", self.names.len());
        let window = self.window().await?;
        let api = self.api();
        let started = for_each(&self.names, |name| {
            let api = api.clone();
            let ns = self.ns.clone();
            async move {
                let ts: TaskSession = serde_json::from_value(json!({
                    "apiVersion": "kandev.dev/v1alpha1", "kind": "TaskSession",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"taskId": format!("task-{name}"), "agent": PROFILE_NAME,
                             "taskDescription": "bench: answer at once",
                             "workspace": {"template": {"size": "1Gi"}}},
                }))?;
                create_retrying(&api, &ts).await?;
                Ok(())
            }
        })
        .await?;
        let reached = self
            .sessions
            .until_all(&self.names, self.within, |ts| {
                state(ts) == Some(SessionState::WaitingForInput)
            })
            .await;
        self.conclude(window, result, &started, &reached).await
    }

    /// Ends a phase whose sessions end up running: timed from the window's start to the last
    /// session that got there.
    async fn conclude(
        &self,
        window: crate::cluster::Window,
        mut result: PhaseResult,
        started: &HashMap<String, Instant>,
        reached: &HashMap<String, Instant>,
    ) -> Result<PhaseResult, BoxError> {
        result.seconds =
            last(reached).map_or(0.0, |t| t.duration_since(window.started).as_secs_f64());
        result.record(&self.names, started, reached);
        self.close(window, &mut result).await?;
        self.running.store(true, Ordering::Relaxed);
        Ok(result)
    }

    /// Deletes every live agent pod; returns when each delete was accepted, per session.
    async fn delete_pods(&self) -> Result<HashMap<String, Instant>, BoxError> {
        let live: Vec<Pod> = self
            .pods
            .store
            .state()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| (**p).clone())
            .collect();
        let pods_api: Api<Pod> = Api::namespaced(self.bench.client.clone(), &self.ns);
        let by_name: HashMap<String, String> = live
            .iter()
            .filter_map(|p| Some((p.name_any(), p.labels().get(SESSION_LABEL)?.clone())))
            .collect();
        let names: Vec<String> = by_name.keys().cloned().collect();
        let accepted = for_each(&names, |pod| {
            let api = pods_api.clone();
            async move {
                // A delete retried after its answer was lost finds the pod gone: done.
                retrying(&format!("delete pod {pod}"), || async {
                    match api.delete(&pod, &DeleteParams::default()).await {
                        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                        other => other.map(|_| ()),
                    }
                })
                .await?;
                Ok(())
            }
        })
        .await?;
        self.running.store(false, Ordering::Relaxed);
        Ok(accepted
            .into_iter()
            .filter_map(|(pod, at)| Some((by_name.get(&pod)?.clone(), at)))
            .collect())
    }

    async fn await_lost(&self) -> HashMap<String, Instant> {
        self.sessions
            .until_all(&self.names, self.within, |ts| {
                ts.status.as_ref().is_some_and(|s| s.needs_resume)
            })
            .await
    }

    /// Waits (untimed) until the deleted pods are gone: the operator declares a loss when the
    /// deletion begins, and a resume's launch would wait for the old pod, which the API floor's
    /// resume never does. Then until the garbage collector has deleted their kwok `Logs` (the
    /// harness's stand-in for a kubelet's log files, owned by the pod), so that the next phase
    /// does not share the API server with ~700 requests of the last one's aftermath.
    async fn await_pods_gone(&self) {
        let deadline = Instant::now() + self.within;
        while !self.pods.store.state().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let logs = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Logs"),
            "logs",
        );
        let logs: Api<DynamicObject> =
            Api::namespaced_with(self.bench.client.clone(), &self.ns, &logs);
        while Instant::now() < deadline {
            match logs.list_metadata(&ListParams::default().limit(1)).await {
                Ok(list) if list.items.is_empty() => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                Err(e) => {
                    eprintln!("[bench] cannot list kwok Logs in {}: {e}", self.ns);
                    break;
                }
            }
        }
    }

    async fn loss(&self) -> Result<PhaseResult, BoxError> {
        let mut result = PhaseResult::new(OURS, "loss", self.names.len());
        let window = self.window().await?;
        let deleted = self.delete_pods().await?;
        let reached = self.await_lost().await;
        // From the last accepted delete to the last session marked (0 if all were marked by then).
        if let (Some(last_delete), Some(last_seen)) = (last(&deleted), last(&reached)) {
            result.seconds = last_seen
                .saturating_duration_since(last_delete)
                .as_secs_f64();
        }
        result.record(&self.names, &deleted, &reached);
        self.close(window, &mut result).await?;
        self.await_pods_gone().await;
        Ok(result)
    }

    /// Sets the resume annotation to each of `tokens` in turn on every session, all sessions at
    /// once: the floor creates its N pods at once too, so neither phase is paced by the bench.
    async fn annotate(&self, tokens: &[String]) -> Result<HashMap<String, Instant>, BoxError> {
        let api = self.api();
        for_each_at(&self.names, self.names.len(), |name| {
            let api = api.clone();
            async move {
                for token in tokens {
                    let patch = json!({"metadata": {"annotations": {RESUME_ANNOTATION: token}}});
                    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
                    retrying(&format!("annotate {name}"), || {
                        api.patch(&name, &params, &patch)
                    })
                    .await?;
                }
                Ok(())
            }
        })
        .await
    }

    async fn await_handled(&self, token: &str) -> HashMap<String, Instant> {
        self.sessions
            .until_all(&self.names, self.within, |ts| {
                ts.status.as_ref().is_some_and(|s| {
                    s.last_handled_resume_request.as_deref() == Some(token)
                        && s.state == SessionState::WaitingForInput
                })
            })
            .await
    }

    async fn ensure_lost(&self) -> Result<(), BoxError> {
        if self.running.load(Ordering::Relaxed) {
            self.delete_pods().await?;
            self.await_lost().await;
            self.await_pods_gone().await;
        }
        Ok(())
    }

    async fn resume(&self) -> Result<PhaseResult, BoxError> {
        self.ensure_lost().await?;
        let result = PhaseResult::new(OURS, "resume", self.names.len());
        let window = self.window().await?;
        let token = "resume-1".to_string();
        let started = self.annotate(std::slice::from_ref(&token)).await?;
        let reached = self.await_handled(&token).await;
        self.conclude(window, result, &started, &reached).await
    }

    /// Lost sessions get five resume tokens in a row: each must end on its last token with
    /// exactly one pod.
    async fn storm(&self) -> Result<PhaseResult, BoxError> {
        self.ensure_lost().await?;
        let mut result = PhaseResult::new(OURS, "storm", self.names.len());
        let window = self.window().await?;
        let tokens: Vec<String> = (1..=5).map(|i| format!("storm-{i}")).collect();
        let started = self.annotate(&tokens).await?;
        let reached = self.await_handled(&tokens[4]).await;
        // Let stray launches (if any) show up before counting pods.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut live: HashMap<String, usize> = HashMap::new();
        for pod in self.pods.store.state() {
            if pod.metadata.deletion_timestamp.is_none()
                && let Some(session) = pod.labels().get(SESSION_LABEL)
            {
                *live.entry(session.clone()).or_default() += 1;
            }
        }
        let wrong: Vec<String> = self
            .names
            .iter()
            .filter_map(|n| {
                let count = live.get(n).copied().unwrap_or(0);
                (count != 1).then(|| format!("{n}: {count}"))
            })
            .collect();
        if !wrong.is_empty() {
            result.notes.push(format!(
                "{} sessions do not have exactly one live pod (e.g. {})",
                wrong.len(),
                wrong[..wrong.len().min(3)].join(", ")
            ));
        }
        let mut result = self.conclude(window, result, &started, &reached).await?;
        // Repeated requests join the launch in flight: one pod per session, not one per token
        // (a note fails `--require-complete`, so `make bench-smoke` fails on more).
        let created = result.pods_created_per_session();
        if created > 1.0 {
            result.notes.push(format!(
                "the storm created {created:.2} pods per session (one launch per session expected)"
            ));
        }
        Ok(result)
    }

    async fn idle(&self, period: Duration) -> Result<PhaseResult, BoxError> {
        let mut result = PhaseResult::new(OURS, "idle", self.names.len());
        let window = self.window().await?;
        tokio::time::sleep(period).await;
        result.seconds = period.as_secs_f64();
        result.completed = self.names.len();
        self.close(window, &mut result).await?;
        Ok(result)
    }

    /// Idle suspension. Setup (untimed): the sessions get `spec.idle.suspendAfter: 10s`, lose
    /// their pods and are resumed (the setting is read when a pod starts). Then nothing is asked
    /// of them: timed from the last resumed session until every one is suspended (needsResume,
    /// resumeReason suspended) and its pod gone; pods and operator RSS before and after are
    /// noted. Then one session is resumed again (what `kubectl kandev prompt` does first), timed.
    async fn suspend(&self) -> Result<PhaseResult, BoxError> {
        const AFTER: &str = "10s";
        self.ensure_lost().await?;
        let api = self.api();
        for_each(&self.names, |name| {
            let api = api.clone();
            async move {
                let patch = json!({"spec": {"idle": {"suspendAfter": AFTER}}});
                let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
                retrying(&format!("spec.idle of {name}"), || {
                    api.patch(&name, &params, &patch)
                })
                .await?;
                Ok(())
            }
        })
        .await?;
        let setup = "suspend-setup".to_string();
        self.annotate(std::slice::from_ref(&setup)).await?;
        let resumed = self.await_handled(&setup).await;
        let pods_before = self.live_pods();
        let rss_before = crate::probe::sample(self.operator.pid()).map(|s| s.rss_mib);
        let mut result = PhaseResult::new(OURS, "suspend", self.names.len());
        let window = self.window().await?;
        let reached = self
            .sessions
            .until_all(&self.names, self.within, |ts| {
                ts.status.as_ref().is_some_and(|s| {
                    s.needs_resume && s.resume_reason == Some(ResumeReason::Suspended)
                })
            })
            .await;
        let deadline = Instant::now() + self.within;
        while self.live_pods() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let pods_after = self.live_pods();
        // From the last session resumed (idle from then on) to the last suspended.
        if let (Some(idle_from), Some(suspended)) = (last(&resumed), last(&reached)) {
            result.seconds = suspended.saturating_duration_since(idle_from).as_secs_f64();
        }
        result.record(&self.names, &resumed, &reached);
        self.close(window, &mut result).await?;
        self.running.store(false, Ordering::Relaxed);
        let rss_after = crate::probe::sample(self.operator.pid()).map(|s| s.rss_mib);
        let mib = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1} MiB"));
        // Figures, not problems (a note fails --require-complete).
        eprintln!(
            "[bench] ours N={} suspend: suspendAfter {AFTER}: live agent pods {pods_before} -> {pods_after}, operator RSS {} -> {}",
            self.names.len(),
            mib(rss_before),
            mib(rss_after)
        );
        if pods_after > 0 {
            result
                .notes
                .push(format!("{pods_after} pods still live after the suspension"));
        }
        // One session back, as a prompt would bring it.
        if let Some(one) = self.names.first() {
            let token = "wake-1";
            let patch = json!({"metadata": {"annotations": {RESUME_ANNOTATION: token}}});
            let started = Instant::now();
            api.patch(one, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let back = self
                .sessions
                .until_all(std::slice::from_ref(one), self.within, |ts| {
                    ts.status.as_ref().is_some_and(|s| {
                        s.last_handled_resume_request.as_deref() == Some(token)
                            && s.state == SessionState::WaitingForInput
                            && !s.needs_resume
                    })
                })
                .await;
            match back.get(one) {
                Some(at) => eprintln!(
                    "[bench] ours N={} suspend: one suspended session resumed in {:.2}s",
                    self.names.len(),
                    at.saturating_duration_since(started).as_secs_f64()
                ),
                None => result
                    .notes
                    .push(format!("the suspended session {one} did not come back")),
            }
        }
        Ok(result)
    }

    /// Live (not deleting) agent pods of the fleet.
    fn live_pods(&self) -> usize {
        self.pods
            .store
            .state()
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count()
    }

    /// ACP calls beyond one `initialize` and one restore per pod, and prompts beyond one per
    /// session, summed over the fleet (the test agent's call logs in the workspaces). A session
    /// that had a pod but has no call log is an error of the bench (a wrong path would otherwise
    /// count 0 forever).
    fn count_duplicates(&self) -> Result<u64, BoxError> {
        let uids = self.pod_uids.lock().map(|m| m.clone()).unwrap_or_default();
        let mut total = 0;
        for name in &self.names {
            let pods = uids.get(name).map_or(0, HashSet::len);
            let path = self
                .bench
                .harness_state
                .join("volumes")
                .join(&self.ns)
                .join(format!("{name}-workspace"))
                .join(CALL_LOG);
            match std::fs::read_to_string(&path) {
                Ok(text) => total += duplicates(&text, pods),
                Err(_) if pods == 0 => {}
                Err(e) => {
                    return Err(format!(
                        "{name} had {pods} pods but its call log {}: {e}",
                        path.display()
                    )
                    .into());
                }
            }
        }
        Ok(total)
    }

    /// Deletes the sessions while the operator still runs (it lifts their finalizers), then the
    /// namespace. Errors are printed: the next round starts clean either way.
    async fn teardown(self) {
        let api = self.api();
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        let deadline = Instant::now() + Duration::from_secs(180);
        while Instant::now() < deadline {
            match api.list_metadata(&ListParams::default().limit(1)).await {
                Ok(list) if list.items.is_empty() => break,
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        drop(self.sessions);
        drop(self.pods);
        drop(self.operator);
        if let Err(e) = self
            .bench
            .delete_namespace(&self.ns, Duration::from_secs(180))
            .await
        {
            eprintln!("[bench] cleanup of {}: {e}", self.ns);
        }
    }
}

/// Repeated in-pod operations in one session's call log, for `pods` pods seen.
fn duplicates(log: &str, pods: usize) -> u64 {
    let count = |pred: &dyn Fn(&str) -> bool| log.lines().filter(|l| pred(l)).count();
    let initialize = count(&|l| l == "initialize");
    let restores = count(&|l| {
        ["session/new", "session/load", "session/resume"]
            .iter()
            .any(|m| l == *m || l.starts_with(&format!("{m} ")))
    });
    let prompts = count(&|l| l.starts_with("session/prompt"));
    (initialize.saturating_sub(pods) + restores.saturating_sub(pods) + prompts.saturating_sub(1))
        as u64
}

fn state(ts: &TaskSession) -> Option<SessionState> {
    ts.status.as_ref().map(|s| s.state)
}

fn last(times: &HashMap<String, Instant>) -> Option<Instant> {
    times.values().max().copied()
}

/// Runs `action` for every name, [`BENCH_CONCURRENCY`] at a time; returns when each started.
pub async fn for_each<F, Fut>(
    names: &[String],
    action: F,
) -> Result<HashMap<String, Instant>, BoxError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    for_each_at(names, BENCH_CONCURRENCY, action).await
}

/// Runs `action` for every name, `concurrency` at a time; returns when each started.
pub async fn for_each_at<F, Fut>(
    names: &[String],
    concurrency: usize,
    action: F,
) -> Result<HashMap<String, Instant>, BoxError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    let results: Vec<Result<(String, Instant), BoxError>> = stream::iter(names.iter().cloned())
        .map(|name| {
            let started = Instant::now();
            let fut = action(name.clone());
            async move { fut.await.map(|()| (name, started)) }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_in_pod_operations_beyond_one_per_pod() {
        let one_launch = "initialize\nsession/new\nsession/prompt bench-session\n";
        assert_eq!(duplicates(one_launch, 1), 0);
        let resumed = format!("{one_launch}initialize\nsession/resume bench-session\n");
        assert_eq!(duplicates(&resumed, 2), 0);
        // The same request run twice on one pod: a second restore (and no second initialize,
        // which agentctl answers from its cache).
        let twice = format!(
            "{one_launch}initialize\nsession/resume bench-session\nsession/resume bench-session\n"
        );
        assert_eq!(duplicates(&twice, 2), 1);
        let prompt_twice =
            "initialize\nsession/new\nsession/new\nsession/prompt s\nsession/prompt s\n";
        assert_eq!(duplicates(prompt_twice, 1), 2);
        assert_eq!(duplicates("", 0), 0);
        assert_eq!(duplicates("session/cancel s\nresponse x ok\n", 1), 0);
    }
}
