//! Helpers shared by the end-to-end test targets (`tests/e2e_*.rs`): a client for the cluster
//! of $KUBECONFIG that fails loudly when there is none, waiting, cleanup, the CRDs, kubectl.
#![allow(dead_code)] // each test target uses a different subset
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

pub mod faults;
pub mod git;
pub mod jaeger;
pub mod operator;
pub mod procs;
pub mod sessions;
#[path = "../support/mod.rs"]
pub mod support;

pub use kandev_e2e_support::annotations::HARNESS_PID_ANNOTATION;
pub use support::process::{free_port, kubectl};

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Client, Config};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How long a test waits for one condition.
pub const WAIT: Duration = Duration::from_secs(60);

/// The (first) file of $KUBECONFIG; panics (fails the test) if it is unset.
pub fn kubeconfig_path() -> PathBuf {
    let path = std::env::var_os("KUBECONFIG")
        .filter(|p| !p.is_empty())
        .expect("KUBECONFIG is not set: run the e2e tests with `bash e2e/test.sh` (or `make e2e`)");
    std::env::split_paths(&path)
        .next()
        .expect("KUBECONFIG has a path")
}

/// The kubeconfig of [`kubeconfig_path`], read.
pub fn read_kubeconfig() -> Kubeconfig {
    let first = kubeconfig_path();
    Kubeconfig::read_from(&first)
        .unwrap_or_else(|e| panic!("cannot read KUBECONFIG {}: {e}", first.display()))
}

/// Writes `kubeconfig` (one a test changed) to `path` as YAML.
pub fn write_kubeconfig(path: &Path, kubeconfig: &Kubeconfig) {
    let yaml = serde_yaml_ng::to_string(kubeconfig).expect("kubeconfig as YAML");
    std::fs::write(path, yaml)
        .unwrap_or_else(|e| panic!("write the kubeconfig {}: {e}", path.display()));
}

/// What a program that `e2e/bin.sh` builds says when it does not start.
pub const BUILT_BY_BIN_SH: &str = "built by e2e/bin.sh; run the tests with e2e/test.sh";

/// Starts `cmd` with no stdin, its stdout and stderr into the new file `log`, killed when
/// dropped; panics (with `hint`: where the program comes from) when it does not start.
pub fn spawn_logged(
    cmd: &mut tokio::process::Command,
    log: &Path,
    hint: &str,
) -> tokio::process::Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("log {}: {e}", log.display()));
    let err = out.try_clone().expect("log");
    cmd.stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            let program = cmd.as_std().get_program().to_string_lossy().into_owned();
            panic!("start {program} ({hint}): {e}")
        })
}

/// `target/e2e-logs`, where the processes the tests start log (created if need be).
pub fn logs_dir() -> PathBuf {
    let dir = repo_path("target/e2e-logs");
    std::fs::create_dir_all(&dir).expect("log dir");
    dir
}

/// A client for $KUBECONFIG; panics (fails the test) if it is unset or the cluster does not answer.
pub async fn client() -> Client {
    let first = kubeconfig_path();
    let kubeconfig = read_kubeconfig();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("invalid kubeconfig");
    let client = Client::try_from(config).expect("cannot build a client");
    let version = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "cluster of KUBECONFIG {} does not answer within 10s",
                first.display()
            )
        })
        .unwrap_or_else(|e| {
            panic!(
                "cluster of KUBECONFIG {} is unreachable: {e}",
                first.display()
            )
        });
    assert_eq!(version.major, "1", "unexpected server version {version:?}");
    client
}

/// The live (not terminating) pods of the Helm chart's operator in `namespace`.
pub async fn operator_pods(client: &Client, namespace: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=kandev-operator"))
        .await
        .expect("list operator pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 100_000_000)
        .unwrap_or(0);
    format!("{prefix}-{millis}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Calls `probe` every `every` until it answers Ok, and returns its value; fails the test with
/// its last Err (what is still missing) once `within` has passed.
pub async fn poll<T>(
    within: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(missing) => assert!(tokio::time::Instant::now() < deadline, "{missing}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// [`poll`] for a yes-or-no `probe`: fails the test with `missing` (what did not come) once
/// `within` has passed without a yes.
pub async fn poll_until(
    within: Duration,
    every: Duration,
    missing: &str,
    mut probe: impl AsyncFnMut() -> bool,
) {
    poll(within, every, async || {
        if probe().await {
            Ok(())
        } else {
            Err(missing.to_string())
        }
    })
    .await;
}

/// Runs `body`, then `cleanup` even if `body` panicked, then re-raises the panic.
pub async fn with_cleanup<B, C>(body: B, cleanup: C)
where
    B: Future<Output = ()>,
    C: Future<Output = ()>,
{
    let result = AssertUnwindSafe(body).catch_unwind().await;
    cleanup.await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A client for $KUBECONFIG (see [`client`]) with the kandev CRDs installed and established.
pub async fn client_with_crds() -> Client {
    let client = client().await;
    install_crd(&client, "crds/tasksessions.kandev.dev.yaml").await;
    install_crd(&client, "crds/executorrunnings.kandev.dev.yaml").await;
    client
}

/// Waits up to [`WAIT`] for `cond` on the object `name`; panics (with the object as it is now)
/// when it does not hold by then.
pub async fn wait_for<K, C>(api: &Api<K>, name: &str, what: &str, cond: C) -> Option<K>
where
    K: Clone + std::fmt::Debug + Send + Serialize + DeserializeOwned + kube::Resource + 'static,
    C: Condition<K>,
{
    wait_for_within(api, name, what, WAIT, cond).await
}

/// [`wait_for`] with another time limit.
pub async fn wait_for_within<K, C>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    cond: C,
) -> Option<K>
where
    K: Clone + std::fmt::Debug + Send + Serialize + DeserializeOwned + kube::Resource + 'static,
    C: Condition<K>,
{
    match tokio::time::timeout(within, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(obj)) => obj,
        Ok(Err(e)) => panic!("watching {name} for {what}: {e}"),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            let namespace = now.as_ref().and_then(|o| o.meta().namespace.clone());
            panic!(
                "timed out after {within:?} waiting for {name} to be {what}; now:\n{}{}",
                compact_yaml(now),
                namespace.map(|ns| around(&ns)).unwrap_or_default()
            )
        }
    }
}

/// `obj` as YAML without its managedFields (the part a reader of a failure needs, short enough
/// to survive a truncated CI log).
fn compact_yaml<K: Serialize + kube::Resource>(obj: Option<K>) -> String {
    let Some(mut obj) = obj else {
        return "(gone)\n".into();
    };
    obj.meta_mut().managed_fields = None;
    serde_yaml_ng::to_string(&obj).unwrap_or_else(|e| format!("(not serializable: {e})\n"))
}

/// What else a failed wait needs to be understood: the namespace's pods and its latest Events.
fn around(namespace: &str) -> String {
    let run = |args: &[&str]| {
        let out = support::process::run(kubectl().args(["-n", namespace]).args(args));
        format!("{}{}", out.stdout, out.stderr)
    };
    // The harness logs beside the kubeconfig of the cluster (e2e/cluster.sh).
    let harness = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .and_then(|k| std::fs::read_to_string(k.with_file_name("harness.log")).ok())
        .map(|log| {
            let ours = log.lines().filter(|l| l.contains(namespace));
            lines_tail(ours, 10)
        })
        .unwrap_or_default();
    format!(
        "pods in {namespace}:\n{}events in {namespace} (last 15):\n{}harness on {namespace} (last 10):\n{harness}",
        run(&["get", "pods", "-o", "wide"]),
        lines_tail(
            run(&["get", "events", "--sort-by=.lastTimestamp"]).lines(),
            15
        )
    )
}

/// The last `n` of `lines`, each ended by a newline.
fn lines_tail<'a>(lines: impl Iterator<Item = &'a str>, n: usize) -> String {
    let lines: Vec<&str> = lines.collect();
    let from = lines.len().saturating_sub(n);
    lines[from..].iter().map(|l| format!("{l}\n")).collect()
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub fn read_crd(file: &str) -> CustomResourceDefinition {
    let path = repo_path(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a CRD: {e}", path.display()))
}

pub async fn install_crd(client: &Client, file: &str) -> CustomResourceDefinition {
    let crd = read_crd(file);
    let name = crd.metadata.name.clone().expect("crd name");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("kandev-e2e-tests").force();
    api.patch(&name, &params, &Patch::Apply(&crd))
        .await
        .unwrap_or_else(|e| panic!("apply {file}: {e}"));
    wait_for(&api, &name, "Established", conditions::is_crd_established()).await;
    crd
}

/// The Pod Security Standard that every namespace of our pods enforces in the e2e tier: the API
/// server itself then proves that agent and operator pods pass `restricted`.
pub const PSS_ENFORCE: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");

/// Creates namespace `name` (or takes the existing one), labels it with [`PSS_ENFORCE`], and
/// waits for its default ServiceAccount (pods are refused before it exists).
pub async fn restricted_namespace(client: &Client, name: &str) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {PSS_ENFORCE.0: PSS_ENFORCE.1}},
    });
    api.patch(
        name,
        &PatchParams::apply("kandev-e2e-tests"),
        &Patch::Apply(&ns),
    )
    .await
    .unwrap_or_else(|e| panic!("namespace {name} with restricted Pod Security: {e}"));
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait_for(
        &accounts,
        "default",
        "created",
        |sa: Option<&ServiceAccount>| sa.is_some(),
    )
    .await;
}

/// The pid of the local process that the e2e harness plays `pod` with; None until it runs.
pub fn harness_pid(pod: &Pod) -> Option<u32> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HARNESS_PID_ANNOTATION))
        .and_then(|p| p.parse().ok())
}

/// A process frozen by the test; SIGKILLed when the guard goes (also on panic), so that nothing
/// stopped outlives the test.
pub struct Frozen(i32);

impl Frozen {
    /// Freezes the process the harness plays `pod` with (agentctl serve).
    #[allow(unsafe_code)]
    pub fn agentctl_of(pod: &Pod) -> Self {
        let pid = harness_pid(pod).expect("the harness's pid annotation") as i32;
        // SAFETY: kill(2) with a pid the harness started for this test's pod.
        let rc = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(rc, 0, "SIGSTOP {pid}");
        Self(pid)
    }

    pub fn gone(&self) -> bool {
        // A reaped process has no /proc entry; a zombie's state is Z.
        std::fs::read_to_string(format!("/proc/{}/stat", self.0))
            .map_or(true, |stat| stat.split_whitespace().nth(2) == Some("Z"))
    }
}

impl Drop for Frozen {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if !self.gone() {
            // SAFETY: as above.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
            }
        }
    }
}

/// Running, and played by the e2e harness (its pid annotation is there).
pub fn is_played() -> impl Condition<Pod> {
    |pod: Option<&Pod>| {
        pod.is_some_and(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && harness_pid(p).is_some()
        })
    }
}

/// `kubectl exec` of `command` in the agentctl container of `pod` (the e2e kubectl, to its end
/// within the runner's limit); its stdout. Panics unless it succeeds.
pub fn agentctl_exec(namespace: &str, pod: &str, command: &[&str]) -> String {
    support::process::run(
        kubectl()
            .args(["exec", "-n", namespace, pod, "-c", "agentctl", "--"])
            .args(command),
    )
    .expect_success()
}

/// The kubectl plugin binary of this build.
pub const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-kandev");

/// Longest a single plugin run may take before the test fails.
pub const PLUGIN_LIMIT: Duration = Duration::from_secs(180);

/// Waits for a plugin process the test started (with stdout and stderr piped; it may have fed
/// its stdin or acted beside it) within [`PLUGIN_LIMIT`], through the tests' one runner; logs
/// what it printed. `what` names it.
pub async fn finish_plugin(child: tokio::process::Child, what: &str) -> support::process::Output {
    plugin_ran(
        what,
        support::process::finish_async(child, what, PLUGIN_LIMIT).await,
    )
}

/// Sends SIGINT (Ctrl-C) to a running plugin, then [`finish_plugin`].
pub async fn interrupt_plugin(
    child: tokio::process::Child,
    what: &str,
) -> support::process::Output {
    if let Some(pid) = child.id() {
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .expect("kill -INT");
        assert!(sent.success(), "kill -INT {pid}");
    }
    finish_plugin(child, what).await
}

/// `kubectl-kandev <args>` (KUBECONFIG from the environment), run to its end as
/// [`finish_plugin`] does.
pub async fn plugin(args: &[&str]) -> support::process::Output {
    let mut cmd = tokio::process::Command::new(PLUGIN);
    let ran = support::process::run_async(cmd.args(args), PLUGIN_LIMIT).await;
    plugin_ran(&format!("kubectl-kandev {}", args.join(" ")), ran)
}

/// A plugin run within the limit, logged; fails the test when it ran longer.
fn plugin_ran(
    what: &str,
    ran: Result<support::process::Output, support::process::Output>,
) -> support::process::Output {
    let run = ran.unwrap_or_else(|run| panic!("{what} ran longer than {PLUGIN_LIMIT:?}: {run:#?}"));
    eprintln!("$ {what} → {}\n{}{}", run.code(), run.stdout, run.stderr);
    run
}

/// `sh -c <script>` in the pod's working directory (the workspace), through the API server's
/// exec; its stdout, trimmed. Panics unless the script succeeds within 20 s.
pub async fn pod_sh(
    client: &Client,
    pod: &k8s_openapi::api::core::v1::Pod,
    script: &str,
) -> String {
    use kube::ResourceExt;
    let namespace = pod.namespace().expect("a namespaced pod");
    exec_output(client, &namespace, &pod.name_any(), &["sh", "-c", script])
        .await
        .trim()
        .to_string()
}

/// Runs `command` in `pod` through the API server (no stdin) and returns its stdout. Panics
/// unless it succeeds within 20 s.
pub async fn exec_output(client: &Client, namespace: &str, pod: &str, command: &[&str]) -> String {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let ap = kube::api::AttachParams::default()
        .stdout(true)
        .stderr(false);
    let mut attached = pods.exec(pod, command.to_vec(), &ap).await.expect("exec");
    let mut out = String::new();
    let mut stdout = attached.stdout().expect("stdout");
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out),
    )
    .await
    .expect("exec output within 20s")
    .expect("read exec output");
    let status = attached.take_status().expect("status").await;
    assert_eq!(
        status.and_then(|s| s.status).as_deref(),
        Some("Success"),
        "exec {command:?}: {out}"
    );
    out
}
