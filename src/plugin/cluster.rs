//! Talking to the API server: loading the kubeconfig (with kubectl's `--as`, `--as-group`,
//! `--token` and `--request-timeout`), reading a session with its executor and pods, setting the
//! resume-request and permission-answer annotations. Waiting until something happened is
//! `watch.rs`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::cli::GlobalArgs;
use super::error::PluginError;
use super::status::Snapshot;
use crate::api::names;
use crate::api::{
    ExecutorRunning, HISTORY_ANNOTATION, MANAGED_LABEL, PERMISSION_ANSWER_ANNOTATION,
    RESTART_ANNOTATION, RESUME_ANNOTATION, RESUME_FRESH_ANNOTATION, SESSION_LABEL, TaskSession,
};

/// The field manager of every write the plugin makes. It must not start with `kubectl`: Flux
/// removes fields owned by `kubectl*` managers.
pub const FIELD_MANAGER: &str = "kandev-plugin";
/// How long connecting to the API server may take (kubectl's default is 30 s; an unreachable
/// server should say so sooner).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client plus the namespace every command works in.
#[derive(Clone)]
pub struct Cluster {
    /// For requests: `--request-timeout` applies.
    pub client: Client,
    /// For watches and exec streams, which stay open for as long as a wait or a prompt lasts:
    /// `--request-timeout` does not cut them.
    pub stream_client: Client,
    pub namespace: String,
    /// The API server URL, for error messages.
    pub server: String,
}

impl Cluster {
    /// Loads the configuration like kubectl: `--kubeconfig`, else `$KUBECONFIG` (merged when it
    /// lists several files), else `~/.kube/config`, else the in-cluster service account;
    /// `--context` picks a context; `-n` overrides the context's namespace.
    pub async fn connect(global: &GlobalArgs) -> Result<Self, PluginError> {
        let options = KubeConfigOptions {
            context: global.context.clone(),
            ..Default::default()
        };
        let mut config =
            match (&global.kubeconfig, &global.context) {
                (Some(path), _) => {
                    let shown = Some(path.display().to_string());
                    let kubeconfig =
                        Kubeconfig::read_from(path).map_err(|e| PluginError::Kubeconfig {
                            path: shown.clone(),
                            reason: e.to_string(),
                        })?;
                    Config::from_custom_kubeconfig(kubeconfig, &options)
                        .await
                        .map_err(|e| PluginError::Kubeconfig {
                            path: shown,
                            reason: e.to_string(),
                        })?
                }
                (None, Some(_)) => Config::from_kubeconfig(&options).await.map_err(|e| {
                    PluginError::Kubeconfig {
                        path: None,
                        reason: e.to_string(),
                    }
                })?,
                (None, None) => Config::infer().await.map_err(|e| PluginError::Kubeconfig {
                    path: None,
                    reason: e.to_string(),
                })?,
            };
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        apply_identity(&mut config, global);
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let server = config.cluster_url.to_string();
        let build = |config: Config| {
            Client::try_from(config).map_err(|e| PluginError::Kubeconfig {
                path: None,
                reason: format!("cannot build a client: {e}"),
            })
        };
        let stream_client = build(config.clone())?;
        apply_request_timeout(&mut config, global.request_timeout);
        let client = build(config)?;
        Ok(Self {
            client,
            stream_client,
            namespace,
            server,
        })
    }

    pub fn sessions(&self) -> Api<TaskSession> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Pods for `exec` (a stream: `--request-timeout` does not apply).
    pub fn exec_pods(&self) -> Api<Pod> {
        Api::namespaced(self.stream_client.clone(), &self.namespace)
    }

    /// Wraps a kube error with what was being done.
    pub fn kube_error(&self, action: impl Into<String>, source: kube::Error) -> PluginError {
        let action = action.into();
        let action = match &source {
            kube::Error::Api(_) => action,
            _ => format!("cannot reach the cluster while {action}"),
        };
        PluginError::Kube {
            action,
            server: self.server.clone(),
            source: Box::new(source),
        }
    }

    fn not_found(&self, name: &str) -> PluginError {
        PluginError::NotFound {
            name: name.to_string(),
            namespace: self.namespace.clone(),
        }
    }

    /// Reads the TaskSession, its ExecutorRunning and its managed pods.
    pub async fn snapshot(&self, name: &str) -> Result<Snapshot, PluginError> {
        let session = match self.sessions().get(name).await {
            Ok(session) => session,
            // A 404 naming the object: it does not exist. A 404 without a name: no such API.
            Err(kube::Error::Api(status))
                if status.code == 404
                    && status.details.as_ref().is_some_and(|d| !d.name.is_empty()) =>
            {
                return Err(self.not_found(name));
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(PluginError::CrdMissing {
                    server: self.server.clone(),
                    message: status.message.clone(),
                });
            }
            Err(e) => return Err(self.kube_error(format!("reading tasksession {name:?}"), e)),
        };
        let executor = Api::<ExecutorRunning>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(&names::executor_name(&session))
            .await
            .map_err(|e| self.kube_error(format!("reading the executorrunning of {name:?}"), e))?;
        let selector = format!(
            "{MANAGED_LABEL}=true,{SESSION_LABEL}={}",
            names::session_label_value(name)
        );
        let candidates = self
            .pods()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| self.kube_error(format!("listing the agentctl pods of {name:?}"), e))?
            .items;
        // What the operator counts: the labels select, the controller reference decides.
        Ok(Snapshot::new(
            self.namespace.clone(),
            session,
            executor,
            candidates,
        ))
    }

    /// Sets `spec.end` (merge patch, field manager [`FIELD_MANAGER`]).
    pub async fn set_end(
        &self,
        name: &str,
        end: crate::api::SessionEnd,
    ) -> Result<TaskSession, PluginError> {
        self.merge_session(
            name,
            json!({"spec": {"end": end}}),
            format!("setting spec.end of tasksession {name:?}"),
        )
        .await
    }

    /// `patch` merged into tasksession `name` (field manager [`FIELD_MANAGER`]); `doing` names
    /// the change in an error.
    async fn merge_session(
        &self,
        name: &str,
        patch: serde_json::Value,
        doing: String,
    ) -> Result<TaskSession, PluginError> {
        match self.merge_patch(name, &patch).await {
            Ok(session) => Ok(session),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(self.not_found(name)),
            Err(source) => Err(self.kube_error(doing, source)),
        }
    }

    /// `patch` merged into tasksession `name`, field manager [`FIELD_MANAGER`].
    async fn merge_patch(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<TaskSession, kube::Error> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..Default::default()
        };
        self.sessions()
            .patch(name, &params, &Patch::Merge(patch))
            .await
    }

    /// Tells the operator that a prompt was sent to the agent (annotation
    /// [`crate::api::PROMPTED_ANNOTATION`], a new token), so it reads the agent's event journal
    /// now. Best effort: without it the operator still catches up, later.
    pub async fn note_prompt(&self, name: &str) {
        let patch =
            json!({"metadata": {"annotations": {crate::api::PROMPTED_ANNOTATION: new_token()}}});
        if let Err(error) = self.merge_patch(name, &patch).await {
            tracing::debug!(%error, "could not note the prompt on the TaskSession");
        }
    }

    /// Sets `kandev.dev/resume-requested-at` to a new token in one merge patch (field manager
    /// [`FIELD_MANAGER`]), together with `kandev.dev/resume-fresh: <the same token>` for a fresh
    /// start (the operator honours the flag only for the request whose token it carries), or the
    /// removal of a leftover resume-fresh flag otherwise. Returns the token.
    pub async fn request_resume(
        &self,
        snapshot: &Snapshot,
        kind: RequestKind,
    ) -> Result<String, PluginError> {
        let name = snapshot.name();
        let status = snapshot.status();
        let mut token = new_token();
        // Unique against what the operator has seen; a clash is all but impossible.
        while Some(token.as_str()) == snapshot.annotation(RESUME_ANNOTATION)
            || !crate::resume::is_new_resume_request(&token, &status)
        {
            token = new_token();
        }
        let patch = resume_patch(&token, kind, |key| snapshot.annotation(key).is_some());
        self.merge_session(
            &name,
            patch,
            format!("setting {RESUME_ANNOTATION} on tasksession {name:?}"),
        )
        .await?;
        Ok(token)
    }
}

impl Cluster {
    /// Sets [`HISTORY_ANNOTATION`] to a new token (merge patch, field manager
    /// [`FIELD_MANAGER`]): the operator keeps a history reader pod while it is set and no agent
    /// pod runs. Returns the token.
    pub async fn request_history(&self, name: &str) -> Result<String, PluginError> {
        let token = new_token();
        self.merge_session(
            name,
            json!({"metadata": {"annotations": {HISTORY_ANNOTATION: token}}}),
            format!("setting {HISTORY_ANNOTATION} on tasksession {name:?}"),
        )
        .await?;
        Ok(token)
    }

    /// Removes [`HISTORY_ANNOTATION`] if it still holds `token` (a merge patch on the
    /// resourceVersion it was read at, so a newer request of another client stays), which has
    /// the operator delete the reader pod. Best effort: the pod ends by itself within its
    /// lifetime anyway.
    pub async fn withdraw_history(&self, name: &str, token: &str) {
        for _ in 0..3 {
            let session = match self.sessions().get_opt(name).await {
                Ok(Some(session)) => session,
                Ok(None) => return,
                Err(error) => {
                    tracing::debug!(%error, "could not read the session to withdraw the history request");
                    return;
                }
            };
            if session
                .annotations()
                .get(HISTORY_ANNOTATION)
                .map(String::as_str)
                != Some(token)
            {
                return;
            }
            let patch = json!({"metadata": {
                "resourceVersion": session.metadata.resource_version,
                "annotations": {HISTORY_ANNOTATION: null},
            }});
            match self.merge_patch(name, &patch).await {
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => {
                    tracing::debug!(%error, "could not withdraw the history request");
                    return;
                }
                Ok(_) => return,
            }
        }
    }

    /// Sets [`PERMISSION_ANSWER_ANNOTATION`] to `value` (`<id>=<option kind>`) in one merge
    /// patch, field manager [`FIELD_MANAGER`]: the operator relays it to agentctl once.
    pub async fn set_permission_answer(&self, name: &str, value: &str) -> Result<(), PluginError> {
        self.merge_session(
            name,
            json!({"metadata": {"annotations": {PERMISSION_ANSWER_ANNOTATION: value}}}),
            format!("setting {PERMISSION_ANSWER_ANNOTATION} on tasksession {name:?}"),
        )
        .await
        .map(|_| ())
    }
}

/// A point in time a command must not wait beyond (`--timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    pub at: Instant,
    pub total: Duration,
}

impl Deadline {
    pub fn after(total: Duration) -> Self {
        Self {
            at: Instant::now() + total,
            total,
        }
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }
}

/// kubectl's identity flags: `--token` replaces whatever the kubeconfig authenticates with
/// (client certificate, basic auth, exec or auth-provider plugins, token file), `--as` and
/// `--as-group` impersonate.
pub fn apply_identity(config: &mut Config, global: &GlobalArgs) {
    let auth = &mut config.auth_info;
    if let Some(token) = &global.token {
        auth.token = Some(token.clone().into());
        auth.token_file = None;
        auth.client_certificate = None;
        auth.client_certificate_data = None;
        auth.client_key = None;
        auth.client_key_data = None;
        auth.username = None;
        auth.password = None;
        auth.exec = None;
        auth.auth_provider = None;
    }
    if let Some(user) = &global.as_user {
        auth.impersonate = Some(user.clone());
    }
    if !global.as_groups.is_empty() {
        auth.impersonate_groups = Some(global.as_groups.clone());
    }
}

/// `--request-timeout`: how long one request may wait for the API server's answer (zero: no
/// limit). The timeout counts from the request, not from when its pooled connection went idle.
pub fn apply_request_timeout(config: &mut Config, timeout: Duration) {
    if timeout.is_zero() {
        return;
    }
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
    config.connect_timeout = Some(timeout.min(CONNECT_TIMEOUT));
}

/// What a resume request asks for besides a resume: its flags, each an annotation that carries
/// the request's token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestKind {
    /// Ignore the saved token ([`RESUME_FRESH_ANNOTATION`]).
    pub fresh: bool,
    /// Replace an agent that runs ([`RESTART_ANNOTATION`]).
    pub restart: bool,
}

/// The merge patch of a resume request: the token, each flag asked for set to it, and a
/// leftover flag of an earlier request (`present`) removed.
pub fn resume_patch(token: &str, kind: RequestKind, present: impl Fn(&str) -> bool) -> Value {
    let mut annotations = BTreeMap::new();
    annotations.insert(RESUME_ANNOTATION, json!(token));
    for (flag, wanted) in [
        (RESUME_FRESH_ANNOTATION, kind.fresh),
        (RESTART_ANNOTATION, kind.restart),
    ] {
        if wanted {
            annotations.insert(flag, json!(token));
        } else if present(flag) {
            annotations.insert(flag, Value::Null);
        }
    }
    json!({"metadata": {"annotations": annotations}})
}

/// A new resume-request token: `kandev-<unix milliseconds>-<6 hex digits>`. Unique per request
/// (the time plus per-process randomness), sortable by time, and obviously from this plugin
/// when someone reads the annotation.
pub fn request_token(unix_millis: u128, entropy: u64) -> String {
    format!("kandev-{unix_millis}-{:06x}", entropy & 0xff_ffff)
}

pub(super) fn new_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // RandomState is seeded randomly per process: enough entropy for a request token.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(now.as_nanos());
    hasher.write_u32(std::process::id());
    request_token(now.as_millis(), hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn resume_patches_set_or_clear_their_flags() {
        let none = |_: &str| false;
        let all = |_: &str| true;
        let fresh = RequestKind {
            fresh: true,
            ..Default::default()
        };
        let restart = RequestKind {
            restart: true,
            ..Default::default()
        };
        assert_eq!(
            resume_patch("t1", RequestKind::default(), none),
            json!({"metadata": {"annotations": {RESUME_ANNOTATION: "t1"}}})
        );
        assert_eq!(
            resume_patch("t1", fresh, none),
            json!({"metadata": {"annotations": {RESUME_ANNOTATION: "t1", RESUME_FRESH_ANNOTATION: "t1"}}})
        );
        assert_eq!(
            resume_patch("t1", restart, none),
            json!({"metadata": {"annotations": {RESUME_ANNOTATION: "t1", RESTART_ANNOTATION: "t1"}}})
        );
        // Leftover flags of an earlier request are removed in the same patch.
        assert_eq!(
            resume_patch("t2", RequestKind::default(), all),
            json!({"metadata": {"annotations": {RESUME_ANNOTATION: "t2", RESUME_FRESH_ANNOTATION: null, RESTART_ANNOTATION: null}}})
        );
        assert_eq!(
            resume_patch("t2", fresh, all),
            json!({"metadata": {"annotations": {RESUME_ANNOTATION: "t2", RESUME_FRESH_ANNOTATION: "t2", RESTART_ANNOTATION: null}}})
        );
    }

    #[test]
    fn request_tokens_are_sortable_and_label_safe() {
        let token = request_token(1_767_225_600_123, 0x1234_5678_9abc_def0);
        assert_eq!(token, "kandev-1767225600123-bcdef0");
        assert_eq!(request_token(5, 1), "kandev-5-000001");
        assert_ne!(request_token(5, 1), request_token(5, 2));
        assert!(token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[test]
    fn tokens_differ_between_calls() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert!(a.starts_with("kandev-"), "{a}");
    }

    fn config_with_certificate() -> Config {
        let mut config = Config::new("https://127.0.0.1:6443".parse().expect("url"));
        config.auth_info.client_certificate_data = Some("cert".into());
        config.auth_info.client_key_data = Some("key".to_string().into());
        config.auth_info.token_file = Some("/token".into());
        config
    }

    #[test]
    fn identity_flags_apply_to_the_client_config() {
        use secrecy::ExposeSecret;
        let mut config = config_with_certificate();
        apply_identity(&mut config, &GlobalArgs::default());
        assert!(config.auth_info.client_certificate_data.is_some());
        assert_eq!(config.auth_info.impersonate, None);

        let mut config = config_with_certificate();
        let global = GlobalArgs {
            token: Some("t0ken".into()),
            as_user: Some("alice".into()),
            as_groups: vec!["team-a".into(), "readers".into()],
            ..GlobalArgs::default()
        };
        apply_identity(&mut config, &global);
        let auth = &config.auth_info;
        assert_eq!(
            auth.token.as_ref().map(|t| t.expose_secret().to_string()),
            Some("t0ken".to_string())
        );
        // The token is the identity: nothing else from the kubeconfig is presented.
        assert!(auth.client_certificate_data.is_none() && auth.client_key_data.is_none());
        assert!(auth.token_file.is_none());
        assert_eq!(auth.impersonate.as_deref(), Some("alice"));
        assert_eq!(
            auth.impersonate_groups,
            Some(vec!["team-a".to_string(), "readers".to_string()])
        );
    }

    #[test]
    fn request_timeout_bounds_each_request_and_zero_means_none() {
        let mut config = config_with_certificate();
        let before = (config.read_timeout, config.write_timeout);
        apply_request_timeout(&mut config, Duration::ZERO);
        assert_eq!((config.read_timeout, config.write_timeout), before);
        assert_eq!(config.read_timeout, None);
        let mut config = config_with_certificate();
        apply_request_timeout(&mut config, Duration::from_secs(3));
        assert_eq!(config.read_timeout, Some(Duration::from_secs(3)));
        assert_eq!(config.write_timeout, Some(Duration::from_secs(3)));
        assert_eq!(config.connect_timeout, Some(Duration::from_secs(3)));
        assert!(config.reset_reader_on_write);
        let mut config = config_with_certificate();
        apply_request_timeout(&mut config, Duration::from_secs(60));
        assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT));
    }

    #[test]
    fn the_field_manager_is_not_pruned_by_flux() {
        assert!(!FIELD_MANAGER.starts_with("kubectl"));
    }
}
