//! `run`: watches the managed pods and plays their containers with local processes.
//!
//! Life of a pod, as the harness sees it:
//! 1. scheduled (`spec.nodeName` set), not terminal, no process yet: start the process, create the
//!    pod's kwok `Exec` and `Logs`, wait until an exec through the API server reaches the pod's
//!    environment (kwok's informer lags), then annotate the pod with the pid. The kwok stages installed
//!    by `e2e/cluster.sh` only mark a managed pod Running once that annotation exists, so
//!    "Running" means "the process is up and `exec` reaches it" — as with a real kubelet.
//! 2. deleted (or given a deletionTimestamp, or turned terminal by someone else): delete the
//!    `Exec`, SIGTERM the process group and every process exec'd into the pod (found by the pod
//!    UID in its environment), SIGKILL them after the grace period.
//! 3. the process exits on its own: the container died. Delete the `Exec` (exec now fails as it
//!    would into a dead container), kill what is left of its process group and patch the pod
//!    status to `Failed` (`Succeeded` for exit 0 with restartPolicy Never) with a terminated
//!    container state. kwok's stages never move a terminal pod back to Running; the harness
//!    checks that and deletes the pod if the status did not stick.
//!
//! The statuses patched in 3. (and in a crash loop) are built in `pod_status.rs`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::{debug, error, info, warn};

use crate::annotations::HARNESS_PID_ANNOTATION;
use crate::configmaps;
use crate::identity;
use crate::kwok;
use crate::plan::{self, LaunchPlan};
use crate::pod_status::{
    InitEnded, crash_backoff, crash_loop_status, exit_code, init_status, restarted_status,
    restarts_after, terminal_status, terminated_state,
};
use crate::preflight;
use crate::process;
use crate::provisioner;
use crate::readiness;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone)]
pub struct Options {
    pub state_dir: PathBuf,
    /// A pod is played when its labels match any of these selectors.
    pub selectors: Vec<String>,
    /// The harness's own kubeconfig: played pods with a ServiceAccount token get its cluster
    /// with their own token (see `identity`). `None`: played pods get no identity of their own.
    pub kubeconfig: Option<Kubeconfig>,
    /// Upper bound of the SIGTERM→SIGKILL grace period (the pod's own period is used if shorter).
    pub max_grace: Duration,
    /// How long after marking a pod terminal the harness checks that kwok left it terminal.
    pub verify_delay: Duration,
}

struct Exited {
    uid: String,
    pid: u32,
    status: std::io::Result<ExitStatus>,
}

struct Tracked {
    plan: LaunchPlan,
    pid: u32,
    started_at: Timestamp,
    stopping: bool,
    /// The pod's [`announce`], aborted when the pod stops first.
    announcing: AbortHandle,
}

struct Supervisor {
    client: Client,
    opts: Options,
    tracked: HashMap<String, Tracked>,
    /// Pods whose process already ended on its own: never restarted (no kubelet restarts here).
    finished: HashSet<String>,
    /// Uids seen since the last watch (re)start, to stop processes of pods gone meanwhile.
    seen: Option<HashSet<String>>,
    exits: mpsc::UnboundedSender<Exited>,
    /// Pods whose crashed container waits for its restart (CrashLoopBackOff), by uid, with the
    /// number of restarts so far.
    crashed: HashMap<String, (LaunchPlan, u32)>,
    /// Restart counts of the running containers that were restarted.
    restart_counts: HashMap<String, u32>,
    restarts: mpsc::UnboundedSender<String>,
    /// Pods whose process could not be announced (no kwok Exec): stopped by the watch loop.
    unannounced: mpsc::UnboundedSender<String>,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("?")
    )
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed") | Some("Succeeded")
    )
}

fn grace_of(pod: &Pod, max: Duration) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(max)
}

/// How the harness's watches retry after an error: promptly, as a kubelet reconnects when its
/// API server is back. kube-runtime's default backoff grows to 30 s: after a kube-apiserver
/// restart the harness then provisioned a volume and started a pod half a minute late.
struct Reconnect {
    next: Duration,
}

impl Reconnect {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(2);
}

impl Default for Reconnect {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for Reconnect {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(delay)
    }
}

impl Backoff for Reconnect {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Runs the harness until SIGTERM/SIGINT; then stops every process it started.
pub async fn run(client: Client, opts: Options) -> Result<(), BoxError> {
    std::fs::create_dir_all(&opts.state_dir)?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (restart_tx, mut restart_rx) = mpsc::unbounded_channel();
    let (unannounced_tx, mut unannounced_rx) = mpsc::unbounded_channel();
    let pods: Api<Pod> = Api::all(client.clone());
    // Every pod: the selectors are ORed, which one server-side selector cannot express.
    let mut events = watcher::watcher(pods, watcher::Config::default())
        .backoff(Reconnect::default())
        .boxed();
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let mut claim_events = watcher::watcher(claims, watcher::Config::default())
        .backoff(Reconnect::default())
        .boxed();
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    info!(state_dir = %opts.state_dir.display(), selectors = ?opts.selectors, "harness watching pods");
    let mut sup = Supervisor {
        client,
        opts,
        tracked: HashMap::new(),
        finished: HashSet::new(),
        seen: None,
        exits: tx,
        crashed: HashMap::new(),
        restart_counts: HashMap::new(),
        restarts: restart_tx,
        unannounced: unannounced_tx,
    };
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => sup.on_event(event).await,
                Some(Err(e)) => warn!(error = %e, "pod watch error (retrying with backoff)"),
                None => {
                    error!("pod watch ended");
                    break;
                }
            },
            event = claim_events.next() => match event {
                Some(Ok(event)) => provisioner::on_event(&sup.client, &sup.opts.state_dir, event).await,
                Some(Err(e)) => warn!(error = %e, "PVC watch error (retrying with backoff)"),
                None => {
                    error!("PVC watch ended");
                    break;
                }
            },
            Some(exited) = rx.recv() => sup.on_exit(exited).await,
            Some(uid) = restart_rx.recv() => sup.restart(&uid).await,
            Some(uid) = unannounced_rx.recv() => sup.stop(&uid, Duration::ZERO),
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }
    sup.shutdown(&mut rx).await;
    Ok(())
}

impl Supervisor {
    async fn on_event(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.seen = Some(HashSet::new()),
            Event::InitApply(pod) => {
                if let (Some(seen), Some(uid)) = (self.seen.as_mut(), pod.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                self.on_pod(pod).await;
            }
            Event::InitDone => {
                let seen = self.seen.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .tracked
                    .keys()
                    .filter(|u| !seen.contains(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    info!(%uid, "pod disappeared while the watch was down");
                    self.stop(&uid, self.opts.max_grace);
                }
            }
            Event::Apply(pod) => self.on_pod(pod).await,
            Event::Delete(pod) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    return;
                };
                info!(pod = %pod_key(&pod), %uid, "pod deleted");
                self.finished.remove(&uid);
                self.crashed.remove(&uid);
                self.restart_counts.remove(&uid);
                if self.tracked.contains_key(&uid) {
                    self.stop(&uid, grace_of(&pod, self.opts.max_grace));
                }
            }
        }
    }

    async fn on_pod(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let key = pod_key(&pod);
        if pod.metadata.deletion_timestamp.is_some() || is_terminal(&pod) {
            if self.tracked.get(&uid).is_some_and(|t| !t.stopping) {
                info!(pod = %key, %uid, terminating = pod.metadata.deletion_timestamp.is_some(), "pod is going away");
                self.stop(&uid, grace_of(&pod, self.opts.max_grace));
            }
            return;
        }
        let scheduled = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if !scheduled
            || self.tracked.contains_key(&uid)
            || self.finished.contains(&uid)
            || self.crashed.contains_key(&uid)
        {
            return;
        }
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        if !self
            .opts
            .selectors
            .iter()
            .any(|s| plan::selector_matches(s, &labels))
        {
            return;
        }
        self.start(pod, None).await;
    }

    /// Starts the pod's process and hands the rest of its start to [`announce`], beside the
    /// watch loop: a kubelet per node would start many pods at once, and the wait until exec
    /// reaches a pod must not hold up the next. `restarted`: the status to patch once the
    /// process of a restarted container is reachable.
    async fn start(&mut self, pod: Pod, restarted: Option<serde_json::Value>) {
        let key = pod_key(&pod);
        let mut plan = match plan::plan(&pod, &self.opts.state_dir) {
            Ok(plan) => plan,
            Err(e) => {
                error!(pod = %key, error = %e, "cannot play this pod");
                return;
            }
        };
        if self.waits_for_kubelet(&pod).await {
            return;
        }
        if let Err(e) = configmaps::materialize(&self.client, &pod, &plan.pod_dir).await {
            // Like a kubelet that cannot mount a volume: the container never starts.
            error!(pod = %key, error = %e, "cannot write the configMap volumes");
            self.finished.insert(plan.uid.clone());
            let msg = format!("kandev-e2e-harness: {e}");
            self.mark_terminal(&plan, Timestamp::now(), 128, "VolumeError", &msg)
                .await;
            return;
        }
        if let Some(admin) = &self.opts.kubeconfig {
            match identity::provide(&self.client, admin, &pod, &plan.pod_dir).await {
                Ok(Some(path)) => {
                    debug!(pod = %key, kubeconfig = %path.display(), "service account token provided");
                    plan.env
                        .push(("KUBECONFIG".to_string(), path.display().to_string()));
                }
                Ok(None) => {}
                Err(e) => {
                    // Like a kubelet that cannot mount the token: the container never starts.
                    error!(pod = %key, error = %e, "cannot provide the service account token");
                    self.finished.insert(plan.uid.clone());
                    let msg = format!("kandev-e2e-harness: {e}");
                    self.mark_terminal(&plan, Timestamp::now(), 128, "TokenError", &msg)
                        .await;
                    return;
                }
            }
        }
        // Init containers run to their end before the container starts (only on the pod's
        // start: a restarted container does not run them again).
        if restarted.is_none() && !self.run_init_containers(&pod, &plan).await {
            return;
        }
        // The environment of `exec` is kwok-controller's plus these; give it the harness's PATH
        // so exec'd commands see the same PATH as the pod's process.
        let mut exec_env = Vec::new();
        if let Ok(path) = std::env::var("PATH") {
            exec_env.push(("PATH".to_string(), path));
        }
        exec_env.extend(plan.env.iter().cloned());
        // Secret values reach the process only, not the kwok Exec object (an API object).
        match preflight::secret_env(&self.client, &pod, &plan.container).await {
            Ok(secret_env) => plan.env.extend(secret_env),
            Err(e) => {
                warn!(pod = %key, error = %e, "cannot read the Secrets of the pod's environment")
            }
        }

        let child = match process::spawn(&plan) {
            Ok(child) => child,
            Err(e) => {
                // Like a runtime that cannot start the container: the pod fails.
                error!(pod = %key, program = %plan.program, error = %e, "cannot start the local process");
                self.finished.insert(plan.uid.clone());
                let msg = format!("kandev-e2e-harness: cannot start {:?}: {e}", plan.program);
                self.mark_terminal(&plan, Timestamp::now(), 128, "StartError", &msg)
                    .await;
                return;
            }
        };
        let Some(pid) = child.id() else {
            error!(pod = %key, "started process has no pid");
            return;
        };
        info!(pod = %key, uid = %plan.uid, pid, program = %plan.program, args = ?plan.args,
              workdir = %plan.workdir.display(), "started local process");
        if let Err(e) = std::fs::write(plan.pod_dir.join("pid"), pid.to_string()) {
            warn!(pod = %key, error = %e, "cannot write pid file");
        }
        let tx = self.exits.clone();
        let uid = plan.uid.clone();
        tokio::spawn(async move {
            let mut child = child;
            let status = child.wait().await;
            let _ = tx.send(Exited { uid, pid, status });
        });
        let announcing = tokio::spawn(announce(
            self.client.clone(),
            plan.clone(),
            exec_env,
            pid,
            restarted,
            self.unannounced.clone(),
        ))
        .abort_handle();
        self.tracked.insert(
            plan.uid.clone(),
            Tracked {
                plan,
                pid,
                started_at: Timestamp::now(),
                stopping: false,
                announcing,
            },
        );
    }

    /// Plays `pod`'s init containers one after the other, as a kubelet does: each gets its own
    /// environment (its Secrets included) and must exit 0. Their end goes into the pod's
    /// `initContainerStatuses`; after a failure the pod has failed (the restart policy of
    /// agentctl pods is Never) and `false` says the container is not started.
    async fn run_init_containers(&mut self, pod: &Pod, main: &LaunchPlan) -> bool {
        let key = pod_key(pod);
        let inits = match plan::init_plans(pod, &self.opts.state_dir) {
            Ok(inits) => inits,
            Err(e) => {
                error!(pod = %key, error = %e, "cannot play this pod's init containers");
                return false;
            }
        };
        if inits.is_empty() {
            return true;
        }
        let mut ended = Vec::new();
        for mut init in inits {
            match preflight::secret_env(&self.client, pod, &init.container).await {
                Ok(secret_env) => init.env.extend(secret_env),
                Err(e) => {
                    warn!(pod = %key, error = %e, "cannot read the Secrets of the init container's environment")
                }
            }
            let started_at = Timestamp::now();
            let (code, message) = match process::spawn(&init) {
                Ok(mut child) => {
                    info!(pod = %key, container = %init.container, pid = ?child.id(), args = ?init.args, "started init container");
                    match child.wait().await {
                        Ok(status) => (exit_code(&status), format!("exited ({status})")),
                        Err(e) => (128, format!("cannot wait for it: {e}")),
                    }
                }
                Err(e) => (128, format!("cannot start {:?}: {e}", init.program)),
            };
            let written =
                std::fs::read_to_string(plan::init_termination_log(&init.pod_dir, &init.container))
                    .ok()
                    .filter(|m| !m.trim().is_empty());
            // Like a kubelet: no message of its own for a container that succeeded.
            let message = written.unwrap_or_else(|| {
                if code == 0 {
                    String::new()
                } else {
                    format!("kandev-e2e-harness: {message}")
                }
            });
            info!(pod = %key, container = %init.container, exit_code = code, "init container ended");
            ended.push(InitEnded {
                container: init.container,
                started_at,
                code,
                message,
            });
            if code != 0 {
                break;
            }
        }
        let failed = ended.last().is_some_and(|e| e.code != 0);
        if failed {
            self.finished.insert(main.uid.clone());
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &main.namespace);
        let patch = Patch::Merge(json!({ "status": init_status(pod, &ended) }));
        if let Err(e) = pods
            .patch_status(&main.name, &PatchParams::default(), &patch)
            .await
        {
            warn!(pod = %key, error = %e, "cannot patch the init containers' status");
            if failed {
                delete_pod(&pods, &main.name, &main.uid).await;
            }
        }
        !failed
    }

    /// A kubelet would not start this pod's container (an image it cannot pull, a missing
    /// Secret or key): the pod stays Pending, its container waiting with the kubelet's reason.
    /// Checked again on the pod's next event, as a kubelet retries.
    async fn waits_for_kubelet(&self, pod: &Pod) -> bool {
        let key = pod_key(pod);
        let waiting = match preflight::unpullable_image(pod) {
            Some(waiting) => Some(waiting),
            None => match preflight::missing_secret(&self.client, pod).await {
                Ok(waiting) => waiting,
                Err(e) => {
                    warn!(pod = %key, error = %e, "cannot read the Secrets the pod references");
                    None
                }
            },
        };
        let Some(waiting) = waiting else {
            return false;
        };
        let already = pod
            .status
            .as_ref()
            .into_iter()
            .flat_map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
            })
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
            .any(|r| r == waiting.reason);
        if !already {
            info!(pod = %key, reason = waiting.reason, message = %waiting.message, "container not started");
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            let patch = Patch::Merge(preflight::waiting_status(&waiting));
            if let Err(e) = pods
                .patch_status(
                    &pod.metadata.name.clone().unwrap_or_default(),
                    &PatchParams::default(),
                    &patch,
                )
                .await
            {
                warn!(pod = %key, error = %e, "cannot patch the waiting container status");
            }
        }
        true
    }

    /// Stops the process of pod `uid`: Exec and Logs first, then SIGTERM, SIGKILL after `grace`.
    /// Beside the watch loop: its API calls and /proc scans must not hold up other pods' events
    /// (a fleet losing its pods at once stops hundreds).
    fn stop(&mut self, uid: &str, grace: Duration) {
        let Some(t) = self.tracked.get_mut(uid) else {
            return;
        };
        if t.stopping {
            return;
        }
        t.stopping = true;
        t.announcing.abort();
        let (pid, plan) = (t.pid, t.plan.clone());
        let client = self.client.clone();
        let uid = uid.to_string();
        tokio::spawn(async move {
            let key = format!("{}/{}", plan.namespace, plan.name);
            // exec fails at once, as into a stopping container; its logs stay readable until
            // the pod is gone (the garbage collector deletes `Logs` with it).
            delete_exec(&client, &plan).await;
            info!(pod = %key, %uid, pid, grace_s = grace.as_secs(), "stopping local process (SIGTERM)");
            if !process::signal_group(pid, libc::SIGTERM) {
                debug!(pod = %key, pid, "process group already gone");
            }
            for p in execd_into(&uid).await {
                info!(pod = %key, pid = p, "stopping a process exec'd into the pod (SIGTERM)");
                process::signal_pid(p, libc::SIGTERM);
            }
            tokio::time::sleep(grace).await;
            if process::group_alive(pid) {
                warn!(pod = %key, pid, "still alive after the grace period: SIGKILL");
                process::signal_group(pid, libc::SIGKILL);
            }
            for p in execd_into(&uid).await {
                warn!(pod = %key, pid = p, "exec'd process still alive after the grace period: SIGKILL");
                process::signal_pid(p, libc::SIGKILL);
            }
        });
    }

    async fn on_exit(&mut self, exited: Exited) {
        let Some(t) = self.tracked.remove(&exited.uid) else {
            return;
        };
        // Its readiness probe goes with it.
        t.announcing.abort();
        let key = format!("{}/{}", t.plan.namespace, t.plan.name);
        // Whatever the leader left behind in its container goes with it, exec'd processes included.
        process::signal_group(exited.pid, libc::SIGKILL);
        let (dead, uid) = (key.clone(), exited.uid.clone());
        tokio::spawn(async move {
            for p in execd_into(&uid).await {
                info!(pod = %dead, pid = p, "killing a process left in the dead container (SIGKILL)");
                process::signal_pid(p, libc::SIGKILL);
            }
        });
        let status = match exited.status {
            Ok(status) => status,
            Err(e) => {
                error!(pod = %key, error = %e, "waiting for the process failed");
                return;
            }
        };
        if t.stopping {
            info!(pod = %key, pid = exited.pid, %status, "local process stopped");
            return;
        }
        let code = exit_code(&status);
        if restarts_after(&t.plan.restart_policy, code) {
            self.crash_loop(t, code, &status.to_string()).await;
            return;
        }
        warn!(pod = %key, pid = exited.pid, %status, "local process exited on its own: the pod is lost");
        self.finished.insert(exited.uid.clone());
        // As a kubelet: exec into the dead container fails, `kubectl logs` still shows why.
        delete_exec(&self.client, &t.plan).await;
        let reason = if code == 0 { "Completed" } else { "Error" };
        // Like a kubelet: the termination message file's content when the container wrote one.
        let msg = std::fs::read_to_string(plan::termination_log(&t.plan.pod_dir))
            .ok()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| {
                format!(
                    "kandev-e2e-harness: local process {} exited ({status})",
                    exited.pid
                )
            });
        self.mark_terminal(&t.plan, t.started_at, code, reason, &msg)
            .await;
    }

    /// A container that a kubelet restarts (restartPolicy Always, or OnFailure after a failure)
    /// crashed: the pod stays Running but not Ready, the container waits in CrashLoopBackOff, and
    /// the process is started again after the back-off (unless the pod goes away meanwhile).
    async fn crash_loop(&mut self, t: Tracked, code: i32, status: &str) {
        let uid = t.plan.uid.clone();
        let key = format!("{}/{}", t.plan.namespace, t.plan.name);
        let restarts = self.restart_counts.remove(&uid).unwrap_or(0) + 1;
        let backoff = crash_backoff(restarts);
        warn!(pod = %key, %status, restarts, backoff_s = backoff.as_secs(),
              "local process exited on its own: restarting it after a back-off (CrashLoopBackOff)");
        // exec fails while the container is down; its logs stay readable (kubectl logs). The
        // dead process's start is not announced any more (its pid would outlive the restart).
        t.announcing.abort();
        delete_exec(&self.client, &t.plan).await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &t.plan.namespace);
        if let Ok(Some(pod)) = pods.get_opt(&t.plan.name).await
            && pod.metadata.uid.as_deref() == Some(uid.as_str())
        {
            let reason = if code == 0 { "Completed" } else { "Error" };
            let msg = format!("kandev-e2e-harness: local process exited ({status})");
            let last = terminated_state(t.started_at, code, reason, &msg);
            let patch = Patch::Merge(json!({
                "status": crash_loop_status(&pod, &t.plan, last, restarts, backoff)
            }));
            if let Err(e) = pods
                .patch_status(&t.plan.name, &PatchParams::default(), &patch)
                .await
            {
                warn!(pod = %key, error = %e, "cannot mark the container as crashed");
            }
        }
        self.crashed.insert(uid.clone(), (t.plan, restarts));
        let tx = self.restarts.clone();
        tokio::spawn(async move {
            tokio::time::sleep(backoff).await;
            let _ = tx.send(uid);
        });
    }

    /// The back-off of a crashed container is over: start it again if its pod is still there.
    async fn restart(&mut self, uid: &str) {
        let Some((plan, restarts)) = self.crashed.remove(uid) else {
            return; // the pod went away meanwhile
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &plan.namespace);
        let pod = match pods.get_opt(&plan.name).await {
            Ok(Some(pod))
                if pod.metadata.uid.as_deref() == Some(uid)
                    && pod.metadata.deletion_timestamp.is_none()
                    && !is_terminal(&pod) =>
            {
                pod
            }
            _ => return,
        };
        info!(pod = %pod_key(&pod), restarts, "restarting the crashed container");
        self.restart_counts.insert(uid.to_string(), restarts);
        let status = restarted_status(&pod, &plan);
        self.start(pod, Some(status)).await;
    }

    /// Makes the pod look like one whose container died: phase Failed (Succeeded for exit 0 with
    /// restartPolicy Never), the container terminated, Ready false. Deletes the pod if that fails
    /// or does not stick.
    async fn mark_terminal(
        &self,
        plan: &LaunchPlan,
        started_at: Timestamp,
        code: i32,
        reason: &str,
        msg: &str,
    ) {
        let key = format!("{}/{}", plan.namespace, plan.name);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &plan.namespace);
        let pod = match pods.get_opt(&plan.name).await {
            Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(plan.uid.as_str()) => pod,
            Ok(_) => return, // already gone (or replaced by a pod of the same name)
            Err(e) => {
                error!(pod = %key, error = %e, "cannot read the pod to mark it terminal");
                return;
            }
        };
        let phase = if code == 0 && plan.restart_policy == "Never" {
            "Succeeded"
        } else {
            "Failed"
        };
        let status = terminal_status(&pod, plan, phase, started_at, code, reason, msg);
        let patch = Patch::Merge(json!({ "status": status }));
        match pods
            .patch_status(&plan.name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => info!(pod = %key, phase, exit_code = code, "marked the pod terminal"),
            Err(e) => {
                warn!(pod = %key, error = %e, "cannot patch the pod status; deleting the pod instead");
                delete_pod(&pods, &plan.name, &plan.uid).await;
                return;
            }
        }
        let (name, uid, delay) = (plan.name.clone(), plan.uid.clone(), self.opts.verify_delay);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Ok(Some(pod)) = pods.get_opt(&name).await
                && pod.metadata.uid.as_deref() == Some(uid.as_str())
                && !is_terminal(&pod)
            {
                warn!(pod = %key, "the terminal status did not stick; deleting the pod instead");
                delete_pod(&pods, &name, &uid).await;
            }
        });
    }

    async fn shutdown(&mut self, rx: &mut mpsc::UnboundedReceiver<Exited>) {
        let pids: Vec<(String, u32)> = self
            .tracked
            .iter()
            .map(|(u, t)| (u.clone(), t.pid))
            .collect();
        if pids.is_empty() {
            return;
        }
        info!(count = pids.len(), "stopping all local processes");
        for (_, pid) in &pids {
            process::signal_group(*pid, libc::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.tracked.is_empty() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(exited)) => {
                    self.tracked.remove(&exited.uid);
                }
                Ok(None) | Err(_) => break,
            }
        }
        for (_, pid) in &pids {
            if process::group_alive(*pid) {
                process::signal_group(*pid, libc::SIGKILL);
            }
        }
    }
}

/// Makes a started process reachable as kwok's kubelet would: its Exec and Logs objects, a wait
/// until an exec through the API server really reaches it (kwok reads Exec objects through an
/// informer), then the pid annotation on which kwok marks the pod Running, so that "Running"
/// implies "exec works"; after a restart, the container is marked running again. Without an
/// Exec the process is of no use: its uid goes to `unannounced` to be stopped. Then it plays
/// the container's readiness probe for as long as the pod runs.
async fn announce(
    client: Client,
    plan: LaunchPlan,
    exec_env: Vec<(String, String)>,
    pid: u32,
    restarted: Option<serde_json::Value>,
    unannounced: mpsc::UnboundedSender<String>,
) {
    let key = format!("{}/{}", plan.namespace, plan.name);
    if let Err(e) = kwok::apply_exec(&client, &plan, &exec_env).await {
        error!(pod = %key, error = %e, "cannot create the kwok Exec; stopping the process");
        let _ = unannounced.send(plan.uid.clone());
        return;
    }
    if let Err(e) = kwok::apply_logs(&client, &plan).await {
        warn!(pod = %key, error = %e, "cannot create the kwok Logs (kubectl logs will not work)");
    }
    match kwok::wait_exec_ready(&client, &plan, Duration::from_secs(20)).await {
        Ok(tries) => debug!(pod = %key, tries, "exec reaches the pod"),
        Err(e) => {
            warn!(pod = %key, error = %e, "exec does not reach the pod yet; marking it Running anyway")
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &plan.namespace);
    let patch = json!({"metadata": {"annotations": {HARNESS_PID_ANNOTATION: pid.to_string()}}});
    match pods
        .patch(&plan.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => info!(pod = %key, pid, "created Exec and Logs, annotated pod"),
        Err(e) => {
            warn!(pod = %key, error = %e, "cannot annotate the pod (kwok will not mark it Running)")
        }
    }
    if let Some(status) = restarted {
        let patch = Patch::Merge(json!({ "status": status }));
        if let Err(e) = pods
            .patch_status(&plan.name, &PatchParams::default(), &patch)
            .await
        {
            warn!(pod = %key, error = %e, "cannot mark the restarted container running");
        }
    }
    // From here on, the pod's readiness is its probe's (until this task is aborted).
    if let Some(probe) = plan.readiness.clone() {
        let target = readiness::Target {
            namespace: plan.namespace,
            pod: plan.name,
            container: plan.container,
            workdir: plan.workdir,
            env: exec_env,
        };
        readiness::play(client, target, probe).await;
    }
}

/// Makes exec into the pod fail (its `Exec` gone), as into a container that is not running.
async fn delete_exec(client: &Client, plan: &LaunchPlan) {
    if let Err(e) = kwok::delete(client, "Exec", &plan.namespace, &plan.name).await {
        warn!(pod = %format!("{}/{}", plan.namespace, plan.name), error = %e, "cannot delete the kwok Exec");
    }
}

/// The last scan of /proc for processes of pods, and when it ran.
type Scan = Option<(tokio::time::Instant, Arc<HashMap<String, Vec<u32>>>)>;

/// One scan serves every pod stopping within [`SCAN_REUSE`] of it: a fleet that loses its pods
/// at once would otherwise read every process's environment once per pod.
static LAST_SCAN: tokio::sync::Mutex<Scan> = tokio::sync::Mutex::const_new(None);
const SCAN_REUSE: Duration = Duration::from_millis(500);

/// The processes exec'd into pod `uid` (found by their environment, on a blocking thread). A
/// process exec'd within [`SCAN_REUSE`] may be missed; the scan after the grace period is later.
async fn execd_into(uid: &str) -> Vec<u32> {
    let mut last = LAST_SCAN.lock().await;
    let scan = match last.as_ref() {
        Some((at, scan)) if at.elapsed() < SCAN_REUSE => scan.clone(),
        _ => {
            let scan = tokio::task::spawn_blocking(|| process::pids_by_env(plan::ENV_POD_UID))
                .await
                .unwrap_or_default();
            let scan = Arc::new(scan);
            *last = Some((tokio::time::Instant::now(), scan.clone()));
            scan
        }
    };
    scan.get(uid).cloned().unwrap_or_default()
}

async fn delete_pod(pods: &Api<Pod>, name: &str, uid: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(e) = pods.delete(name, &dp).await {
        warn!(pod = name, error = %e, "cannot delete the pod");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_reconnect_within_two_seconds() {
        let mut backoff = Reconnect::default();
        let delays: Vec<u128> = backoff.by_ref().take(6).map(|d| d.as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(250)));
    }
}
