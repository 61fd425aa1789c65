//! The bench's view of the cluster: its admin client, an identity of their own for each
//! contender, measurement windows, and waiting for many objects at once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::BoxError;
use crate::audit::{AuditLog, Requests};
use crate::kubeconfig::token_kubeconfig;
use crate::probe::{self, ProcSample};
use crate::report::PhaseResult;

/// Namespace of the contenders' ServiceAccounts.
pub const IDENTITY_NAMESPACE: &str = "kandev-bench";

pub struct Bench {
    pub client: Client,
    admin: Kubeconfig,
    /// Scratch files: kubeconfigs, tokens, logs (`target/bench/work`).
    pub work: PathBuf,
    /// The harness's state dir (its `volumes/<ns>/<claim>` are the workspaces).
    pub harness_state: PathBuf,
    audit: Mutex<AuditLog>,
}

/// An identity of its own: the user name the audit log shows, and a kubeconfig for it.
pub struct Identity {
    pub user: String,
    pub kubeconfig: PathBuf,
}

impl Identity {
    pub async fn client(&self) -> Result<Client, BoxError> {
        client_for(&self.kubeconfig).await
    }
}

pub async fn client_for(path: &Path) -> Result<Client, BoxError> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let mut config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    // kube sets no read timeout: bound every call, so a stuck API server fails the bench
    // instead of hanging it. Longer than a watch's server-side timeout (290 s), so a quiet
    // watch is never cut.
    config.read_timeout = Some(Duration::from_secs(300));
    Ok(Client::try_from(config)?)
}

/// Whether an error of an API call is one a busy or restarting API server gives and a retry
/// can get past: no answer (connection refused or reset, a timeout, a body cut off), 429 or a
/// 5xx.
fn transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// `call`, retried past transient errors ([`transient`]) with backoff (0.5 s doubling to 8 s)
/// for up to two minutes, as the operator's own calls are: the bench writes and reads thousands
/// of objects while the operator under test starts beside them, and one reset connection must
/// not end the run. Other errors, and the last transient one, are returned with `what`.
pub async fn retrying<T, F, Fut>(what: &str, call: F) -> Result<T, BoxError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut backoff = Duration::from_millis(500);
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(err) if transient(&err) && Instant::now() + backoff < deadline => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(8));
            }
            Err(err) => return Err(format!("{what}: {err}").into()),
        }
    }
}

/// Creates `object`, retrying ([`retrying`]); an object that exists already (a create whose
/// answer was lost, retried) is read back instead.
pub async fn create_retrying<K>(api: &Api<K>, object: &K) -> Result<K, BoxError>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let created = retrying(&format!("create {name}"), || async {
        match api.create(&PostParams::default(), object).await {
            Err(kube::Error::Api(status)) if status.code == 409 => api.get(&name).await,
            other => other,
        }
    })
    .await?;
    Ok(created)
}

impl Bench {
    pub async fn connect(
        kubeconfig: &Path,
        audit_log: &Path,
        work: PathBuf,
        harness_state: PathBuf,
    ) -> Result<Self, BoxError> {
        let admin = Kubeconfig::read_from(kubeconfig)?;
        let client = client_for(kubeconfig).await?;
        client.apiserver_version().await?;
        std::fs::create_dir_all(&work)?;
        let audit = AuditLog::open(audit_log).map_err(|e| {
            format!(
                "audit log {}: {e} (is the cluster started with KANDEV_AUDIT_POLICY?)",
                audit_log.display()
            )
        })?;
        let bench = Self {
            client,
            admin,
            work,
            harness_state,
            audit: Mutex::new(audit),
        };
        bench.ensure_namespace(IDENTITY_NAMESPACE).await?;
        for crd in kandev_operator::api::crds() {
            bench.install_crd(&crd).await?;
        }
        Ok(bench)
    }

    /// Applies a CRD and waits until it is served.
    pub async fn install_crd(&self, crd: &CustomResourceDefinition) -> Result<(), BoxError> {
        let name = crd.name_any();
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        api.patch(
            &name,
            &PatchParams::apply("kandev-bench").force(),
            &Patch::Apply(crd),
        )
        .await?;
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api, &name, conditions::is_crd_established()),
        )
        .await
        .map_err(|_| format!("CRD {name} not established within 30s"))??;
        Ok(())
    }

    pub async fn ensure_namespace(&self, name: &str) -> Result<(), BoxError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        ignore_conflict(api.create(&PostParams::default(), &ns).await)
    }

    /// Deletes a namespace and waits until it is gone, and the volumes of its claims too (at
    /// most `within`): the next contender does not share the API server with their cleanup.
    pub async fn delete_namespace(&self, name: &str, within: Duration) -> Result<(), BoxError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(name, &DeleteParams::background()).await;
        let deadline = Instant::now() + within;
        while api.get_opt(name).await?.is_some() {
            if Instant::now() > deadline {
                return Err(format!("namespace {name} still there after {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        loop {
            let left = volumes
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .and_then(|c| c.namespace.as_deref())
                        == Some(name)
                })
                .count();
            if left == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{left} volumes of namespace {name} still there after {within:?}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A ServiceAccount `name` bound to cluster-admin, with a kubeconfig using its token: the
    /// contender gets all rights (what it is allowed is not what is measured) under a user name
    /// of its own.
    pub async fn identity(&self, name: &str) -> Result<Identity, BoxError> {
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.client.clone(), IDENTITY_NAMESPACE);
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        ignore_conflict(accounts.create(&PostParams::default(), &sa).await)?;
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("kandev-bench-{name}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": IDENTITY_NAMESPACE}],
        }))?;
        ignore_conflict(bindings.create(&PostParams::default(), &binding).await)?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: None,
                expiration_seconds: Some(12 * 3600),
                bound_object_ref: None,
            }),
            ..Default::default()
        };
        let token = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await?
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| format!("empty token for serviceaccount {name}"))?;
        let token_file = self.work.join(format!("{name}.token"));
        std::fs::write(&token_file, token)?;
        let kubeconfig = self.work.join(format!("{name}.kubeconfig"));
        let config = token_kubeconfig(&self.admin, &token_file, IDENTITY_NAMESPACE);
        std::fs::write(&kubeconfig, serde_yaml_ng::to_string(&config)?)?;
        Ok(Identity {
            user: format!("system:serviceaccount:{IDENTITY_NAMESPACE}:{name}"),
            kubeconfig,
        })
    }

    /// kube-apiserver's `apiserver_request_total`, summed over everything.
    async fn apiserver_requests(&self) -> Result<f64, BoxError> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = self.client.request_text(request).await?;
        Ok(probe::sum_by(&text, "apiserver_request_total", &[])
            .values()
            .sum())
    }

    /// Starts measuring: what happened before is not counted.
    pub async fn window(
        &self,
        pid: Option<u32>,
        metrics: Option<&str>,
    ) -> Result<Window, BoxError> {
        self.take_audit()?;
        Ok(Window {
            started: Instant::now(),
            apiserver: self.apiserver_requests().await?,
            proc: pid.and_then(probe::sample),
            reconciles: match metrics {
                Some(url) => Some(reconciles(url).await?),
                None => None,
            },
        })
    }

    fn take_audit(&self) -> Result<BTreeMap<String, Requests>, BoxError> {
        let mut audit = self.audit.lock().map_err(|_| "audit log lock poisoned")?;
        Ok(audit.take()?)
    }

    /// Ends a window: fills the API, CPU, memory and reconcile figures of `result`.
    pub async fn close(
        &self,
        window: Window,
        user: &str,
        pid: Option<u32>,
        metrics: Option<&str>,
        result: &mut PhaseResult,
    ) -> Result<(), BoxError> {
        // The audit log is written before the response is sent (blocking mode), but give the
        // last request of the window a moment to land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let by_user = self.take_audit()?;
        result.requests = by_user.get(user).cloned().unwrap_or_default();
        result.other_requests = by_user
            .iter()
            .filter(|(u, _)| u.as_str() != user)
            .map(|(_, r)| r.total())
            .sum();
        result.apiserver_requests =
            (self.apiserver_requests().await? - window.apiserver).max(0.0) as u64;
        if let (Some(before), Some(after)) = (window.proc, pid.and_then(probe::sample)) {
            result.cpu_seconds = Some(after.cpu_seconds - before.cpu_seconds);
            result.rss_mib = Some(after.rss_mib);
            result.peak_rss_mib = Some(after.peak_rss_mib);
        }
        if let (Some(before), Some(url)) = (window.reconciles, metrics) {
            result.reconciles = Some((reconciles(url).await? - before).max(0.0) as u64);
        }
        if result.seconds == 0.0 {
            result.seconds = window.started.elapsed().as_secs_f64();
        }
        Ok(())
    }
}

pub struct Window {
    pub started: Instant,
    apiserver: f64,
    proc: Option<ProcSample>,
    reconciles: Option<f64>,
}

fn ignore_conflict<T>(result: Result<T, kube::Error>) -> Result<(), BoxError> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `kandev_reconciles_total` (all results) from the operator's `/metrics` at `url`
/// (`host:port`).
async fn reconciles(url: &str) -> Result<f64, BoxError> {
    let text = http_get(url, "/metrics").await?;
    Ok(probe::sum_by(&text, "kandev_reconciles_total", &[])
        .values()
        .sum())
}

/// A plain HTTP/1.0 GET on loopback; the body, or an error for any status but 200.
pub async fn http_get(address: &str, path: &str) -> Result<String, BoxError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| format!("GET http://{address}{path}: no answer within 10s"))??;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "GET http://{address}{path}: {}",
            head.lines().next().unwrap_or("")
        )
        .into());
    }
    Ok(body.to_string())
}

/// A cache of every object of kind `K` in `namespace`, kept by a watch for as long as it lives.
pub struct Watched<K: Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    pub store: Store<K>,
    namespace: String,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    pub async fn start(api: Api<K>, config: watcher::Config) -> Result<Self, BoxError> {
        Self::start_with(api, config, |_| {}).await
    }

    /// [`Watched::start`], calling `seen` with every version of every object the watch brings.
    pub async fn start_with(
        api: Api<K>,
        config: watcher::Config,
        seen: impl Fn(&K) + Send + 'static,
    ) -> Result<Self, BoxError> {
        let namespace = api.namespace().unwrap_or_default().to_string();
        let (store, writer) = reflector::store();
        let stream =
            reflector::reflector(writer, watcher(api, config).default_backoff()).applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(object) => seen(&object),
                    Err(e) => eprintln!("[bench] watch error (retrying): {e}"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready())
            .await
            .map_err(|_| "the watch did not sync within 30s")?
            .map_err(|e| format!("watch never synced: {e}"))?;
        Ok(Self {
            store,
            namespace,
            task,
        })
    }

    /// Waits until `done` holds for every name in `names`, at most `within`; returns when each
    /// first held (polled every 20 ms). Names that never got there are missing from the map.
    pub async fn until_all(
        &self,
        names: &[String],
        within: Duration,
        done: impl Fn(&K) -> bool,
    ) -> HashMap<String, Instant> {
        let deadline = Instant::now() + within;
        let mut reached = HashMap::new();
        while reached.len() < names.len() && Instant::now() < deadline {
            for name in names {
                if !reached.contains_key(name)
                    && self.store.get(&self.key(name)).is_some_and(|o| done(&o))
                {
                    reached.insert(name.clone(), Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        reached
    }

    fn key(&self, name: &str) -> ObjectRef<K> {
        ObjectRef::new(name).within(&self.namespace)
    }

    /// [`Watched::until_all`] for one object of the watched namespace.
    pub async fn until_one(
        &self,
        name: &str,
        within: Duration,
        done: impl Fn(&K) -> bool,
    ) -> Option<Instant> {
        let deadline = Instant::now() + within;
        let key = self.key(name);
        while Instant::now() < deadline {
            if self.store.get(&key).is_some_and(|o| done(&o)) {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl<K: Resource + Clone + 'static> Drop for Watched<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}
