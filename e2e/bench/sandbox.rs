//! agent-sandbox (kubernetes-sigs, Go, controller-runtime) through the same loss, as the
//! reference: its controller runs as a local process under its own ServiceAccount, gets N
//! `Sandbox` objects, and must recreate every pod after all are deleted. It does less work than
//! a resume (no exec, no restore), so its throughput is a reference, not a bar; its API reads per
//! relaunch are the bar for ours.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::BoxError;
use crate::cluster::{Bench, Watched, http_get};
use crate::ours::{for_each, session_names};
use crate::process::{dies_with_us, free_port, stop_child};
use crate::report::{PhaseResult, SANDBOX};

/// The part of agent-sandbox's `Sandbox` the bench reads and writes.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    namespaced,
    status = "SandboxStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    pub pod_template: serde_json::Value,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SandboxStatus {
    #[serde(default)]
    pub conditions: Vec<serde_json::Value>,
}

fn ready(sandbox: &Sandbox) -> bool {
    sandbox.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The agent-sandbox contender: its controller binary, with its CRD installed.
pub struct Contender {
    bin: PathBuf,
}

impl Contender {
    /// Installs agent-sandbox's Sandbox CRD (from its Go module, copied by e2e/bin.sh).
    pub async fn install(bench: &Bench, bin: PathBuf, crds: &Path) -> Result<Self, BoxError> {
        if !bin.is_file() {
            return Err(format!("{} is missing: run e2e/bin.sh", bin.display()).into());
        }
        let file = crds.join("agents.x-k8s.io_sandboxes.yaml");
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text)?;
        bench.install_crd(&crd).await?;
        Ok(Self { bin })
    }

    /// Launch N sandboxes, delete every pod, wait for all to be recreated and Ready.
    pub async fn run(&self, bench: &Bench, n: usize) -> Result<Vec<PhaseResult>, BoxError> {
        let ns = format!("bench-sandbox-{n}");
        bench.ensure_namespace(&ns).await?;
        let identity = bench.identity("agent-sandbox").await?;
        let health = format!("127.0.0.1:{}", free_port()?);
        let log = bench.work.join(format!("agent-sandbox-{n}.log"));
        let out = std::fs::File::create(&log)?;
        let mut child = dies_with_us(&mut std::process::Command::new(&self.bin))
            .arg(format!("--kubeconfig={}", identity.kubeconfig.display()))
            .args(["--leader-elect=false", "--metrics-bind-address=0"])
            .arg(format!("--health-probe-bind-address={health}"))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        let pid = child.id();
        let result = async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while http_get(&health, "/readyz").await.is_err() {
                if let Some(status) = child.try_wait()? {
                    return Err(format!(
                        "agent-sandbox-controller exited ({status}); log {}",
                        log.display()
                    )
                    .into());
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "agent-sandbox-controller not ready in 60s; log {}",
                        log.display()
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            eprintln!(
                "[bench] agent-sandbox N={n}: controller pid {pid} (log {})",
                log.display()
            );
            self.phases(bench, &ns, n, pid, &identity.user).await
        }
        .await;
        let sandboxes: Api<Sandbox> = Api::namespaced(bench.client.clone(), &ns);
        let _ = sandboxes
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        stop_child(&mut child);
        if let Err(e) = bench.delete_namespace(&ns, Duration::from_secs(180)).await {
            eprintln!("[bench] cleanup of {ns}: {e}");
        }
        result
    }

    async fn phases(
        &self,
        bench: &Bench,
        ns: &str,
        n: usize,
        pid: u32,
        user: &str,
    ) -> Result<Vec<PhaseResult>, BoxError> {
        let names = session_names(n);
        let within = Duration::from_secs(120 + 2 * n as u64);
        let sandboxes: Api<Sandbox> = Api::namespaced(bench.client.clone(), ns);
        let pods_api: Api<Pod> = Api::namespaced(bench.client.clone(), ns);
        let watched = Watched::start(sandboxes.clone(), watcher::Config::default()).await?;
        let pods = Watched::start(pods_api.clone(), watcher::Config::default()).await?;

        let mut launch = PhaseResult::new(SANDBOX, "launch", n);
        let window = bench.window(Some(pid), None).await?;
        let started = for_each(&names, |name| {
            let api = sandboxes.clone();
            async move {
                let sandbox = Sandbox::new(
                    &name,
                    SandboxSpec {
                        pod_template: json!({"spec": {
                            "automountServiceAccountToken": false,
                            "containers": [{"name": "main", "image": "kandev.dev/idle:bench",
                                            "command": ["sleep", "infinity"]}]}}),
                    },
                );
                api.create(&PostParams::default(), &sandbox).await?;
                Ok(())
            }
        })
        .await?;
        let reached = watched.until_all(&names, within, ready).await;
        launch.seconds = window.started.elapsed().as_secs_f64();
        launch.record(&names, &started, &reached);
        bench
            .close(window, user, Some(pid), None, &mut launch)
            .await?;
        eprintln!(
            "[bench] agent-sandbox N={n} launch: {}/{n} in {:.1}s",
            launch.completed, launch.seconds
        );

        let mut relaunch = PhaseResult::new(SANDBOX, "relaunch", n);
        let old: HashMap<String, String> = pods
            .store
            .state()
            .iter()
            .filter_map(|p| Some((p.name_any(), p.metadata.uid.clone()?)))
            .collect();
        let window = bench.window(Some(pid), None).await?;
        let deleted = for_each(&names, |name| {
            let api = pods_api.clone();
            async move {
                api.delete(&name, &DeleteParams::default().grace_period(0))
                    .await?;
                Ok(())
            }
        })
        .await?;
        // A new pod (another UID) Running, and the Sandbox Ready on it.
        let recreated = pods
            .until_all(&names, within, |p: &Pod| {
                p.metadata.uid.as_ref() != old.get(&p.name_any())
                    && p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .await;
        let reached = watched.until_all(&names, within, ready).await;
        let both: HashMap<String, Instant> = recreated
            .into_iter()
            .filter_map(|(name, at)| Some((name.clone(), at.max(*reached.get(&name)?))))
            .collect();
        relaunch.seconds = window.started.elapsed().as_secs_f64();
        relaunch.record(&names, &deleted, &both);
        bench
            .close(window, user, Some(pid), None, &mut relaunch)
            .await?;
        eprintln!(
            "[bench] agent-sandbox N={n} relaunch: {}/{n} in {:.1}s",
            relaunch.completed, relaunch.seconds
        );
        Ok(vec![launch, relaunch])
    }
}
