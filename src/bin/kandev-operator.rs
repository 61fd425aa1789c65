//! `kandev-operator`: the controller binary (and the CRD generator).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kandev_operator::acp::AcpLimits;
use kandev_operator::acp::budget::{self, MemoryBudget};
use kandev_operator::agents::AgentRegistry;
use kandev_operator::controller::endpoints::{self, HttpState, Routes};
use kandev_operator::controller::leader::{self, LeaseSettings};
use kandev_operator::controller::metrics_access::MetricsAuth;
use kandev_operator::controller::pods::{self, Cidr, NetworkRules, PodSettings, ScratchLimits};
use kandev_operator::controller::{
    self, Clients, OperatorSettings, metrics, metrics_tls, permissions,
};
use kandev_operator::resume::defaults;
use kandev_operator::telemetry::{self, LogSettings};
use tokio::time::Instant;

#[derive(Parser)]
#[command(
    name = "kandev-operator",
    version,
    // A repeated flag takes its last value, so appended arguments (the chart's extraArgs)
    // override earlier ones.
    args_override_self = true,
    about = "Keeps AI coding-agent sessions alive across pod loss: lost agents are marked NeedsResume and restored over ACP when a resume is requested."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against the cluster of the current kubeconfig (or in-cluster config).
    Run(Box<RunArgs>),
    /// Print the TaskSession and ExecutorRunning CRDs as one multi-document YAML stream
    /// (the same content as the files under crds/).
    Crd {
        /// Write one file per CRD (<plural>.kandev.dev.yaml) into this directory instead.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
        /// Also write the Helm chart's CRD templates (the same CRDs with the chart's labels and
        /// helm.sh/resource-policy: keep) into this directory, e.g.
        /// charts/kandev-operator/templates/crds.
        #[arg(long, value_name = "DIR")]
        chart_dir: Option<PathBuf>,
    },
}

/// The agentctl image of this release, as the chart pins it (`agentctlImage.repository`, tag the
/// chart's appVersion, which is the crate version): never `latest`.
const DEFAULT_AGENTCTL_IMAGE: &str = concat!("kandev/agentctl:", env!("CARGO_PKG_VERSION"));

#[derive(clap::Args)]
struct RunArgs {
    /// Image of agentctl pods for sessions that do not name one (default: this release's
    /// agentctl image, the one the chart pins).
    #[arg(
        long,
        env = "KANDEV_AGENTCTL_IMAGE",
        default_value = DEFAULT_AGENTCTL_IMAGE
    )]
    agentctl_image: String,
    /// YAML or JSON file of agent profiles that extend or override the built-in ones.
    #[arg(long, env = "KANDEV_AGENT_PROFILES", value_name = "FILE")]
    agent_profiles: Option<PathBuf>,
    /// UID (and GID, fsGroup) agent pods run as; never root (0 is refused).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    run_as_user: i64,
    /// Serve only the sessions of this namespace (repeatable, or comma-separated in
    /// KANDEV_WATCH_NAMESPACES): only these namespaces are watched, cached and checked for RBAC.
    /// None: every namespace.
    #[arg(
        long = "watch-namespace",
        value_name = "NAMESPACE",
        env = "KANDEV_WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    watch_namespaces: Vec<String>,
    /// Resource request of the agentctl container when the session sets no resources, as
    /// NAME=QUANTITY (repeatable; giving one replaces all defaults).
    #[arg(
        long = "default-resource-request",
        value_name = "NAME=QUANTITY",
        default_values = ["cpu=250m", "memory=512Mi", "ephemeral-storage=256Mi"]
    )]
    default_resource_requests: Vec<String>,
    /// Resource limit of the agentctl container when the session sets no resources, as
    /// NAME=QUANTITY (repeatable; giving one replaces all defaults).
    #[arg(
        long = "default-resource-limit",
        value_name = "NAME=QUANTITY",
        default_values = ["memory=2Gi", "ephemeral-storage=4Gi"]
    )]
    default_resource_limits: Vec<String>,
    /// runtimeClassName of every agent pod (e.g. gvisor or kata); none by default.
    #[arg(long, value_name = "NAME")]
    runtime_class_name: Option<String>,
    /// hostUsers of every agent pod: false gives each pod its own user namespace (the cluster
    /// must support it); true (the default) leaves the field unset.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    host_users: bool,
    /// Only images starting with this prefix may run as agent pods (repeatable); a session with
    /// another spec.image is refused (Stalled, reason InvalidSpec). None: any image. A prefix
    /// ends in '/' (a registry or repository path) or ':' (a repository's tags), so that
    /// registry.example.com/ never matches registry.example.com.evil/.
    #[arg(long = "allowed-image-prefix", value_name = "PREFIX", value_parser = image_prefix)]
    allowed_image_prefixes: Vec<String>,
    /// Apply a NetworkPolicy with every session's agent pod: egress to DNS (kube-dns) and the
    /// --egress-allow-cidr ranges minus the --egress-deny-cidr ones, ingress from the
    /// --ingress-allow-cidr ranges only (none by default).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    agent_network_policy: bool,
    /// Egress that agent pods may reach (repeatable; giving one replaces the defaults).
    #[arg(
        long = "egress-allow-cidr",
        value_name = "CIDR",
        default_values = pods::DEFAULT_EGRESS_ALLOW
    )]
    egress_allow_cidrs: Vec<Cidr>,
    /// Egress that agent pods may not reach, cut out of the allowed ranges (repeatable; giving
    /// one replaces the defaults: link-local and the cloud metadata and identity endpoints,
    /// private ranges).
    #[arg(
        long = "egress-deny-cidr",
        value_name = "CIDR",
        default_values = pods::DEFAULT_EGRESS_DENY
    )]
    egress_deny_cidrs: Vec<Cidr>,
    /// Peers that may reach agent pods over the network (repeatable; none by default: the
    /// operator uses exec, not the network).
    #[arg(long = "ingress-allow-cidr", value_name = "CIDR")]
    ingress_allow_cidrs: Vec<Cidr>,
    /// Size limit of every agent pod's /tmp emptyDir (a Kubernetes quantity); past it the
    /// kubelet evicts the pod.
    #[arg(long, value_name = "QUANTITY", default_value = pods::TMP_SIZE_LIMIT, value_parser = size_quantity)]
    tmp_size_limit: Quantity,
    /// Size limit of every agent pod's /run/kandev emptyDir (agentctl's socket).
    #[arg(long, value_name = "QUANTITY", default_value = pods::RUN_SIZE_LIMIT, value_parser = size_quantity)]
    run_size_limit: Quantity,
    /// Toleration added to every agent pod, as KEY[=VALUE]:EFFECT (repeatable).
    #[arg(long = "pod-toleration", value_name = "KEY[=VALUE]:EFFECT")]
    pod_tolerations: Vec<String>,
    /// Node selector entry of every agent pod, as KEY=VALUE (repeatable).
    #[arg(long = "pod-node-selector", value_name = "KEY=VALUE")]
    pod_node_selectors: Vec<String>,
    /// Re-evaluate every session at least this often, in seconds (watches do the rest).
    #[arg(long, default_value_t = 60)]
    resync_seconds: u64,
    /// Timeout of opening the exec into an agent pod and of the ACP `initialize` call, in seconds.
    #[arg(long, default_value_t = defaults::ACP_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    acp_timeout_seconds: u64,
    /// Timeout of the whole ACP restore, in seconds: `session/resume`, then `session/load`
    /// (which replays the whole transcript before it answers), then `session/new`, as far as the
    /// rules go; each call gets what the earlier ones left.
    #[arg(long, default_value_t = defaults::RESTORE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    acp_restore_timeout_seconds: u64,
    /// Longest line an agent may write while a session/load replays its transcript, in MiB
    /// (every other line: 1 MiB). An agent that writes a longer line is cut off and the restore
    /// fails with reason AgentProtocolLimit, keeping the token. Agent pods get the same value
    /// (KANDEV_REPLAY_LINE_LIMIT_MIB, for agentctl).
    #[arg(long, default_value_t = 8, value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..=kandev_operator::jsonrpc::codec::MAX_REPLAY_LINE_LIMIT_MIB))]
    acp_replay_line_limit_mib: u64,
    /// Bytes an agent may write during one session/load, all lines together, in MiB. The replay
    /// is counted as it streams (never held in memory); an agent that writes more is cut off and
    /// the restore fails with reason AgentProtocolLimit, keeping the token.
    #[arg(long, default_value_t = 256, value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..))]
    acp_replay_budget_mib: u64,
    /// Memory all restores together may hold for the agents' lines, in MiB; 0 (the default):
    /// half of the container's memory limit (its cgroup), or 1024 where there is none. Each
    /// restore reserves three times the 1 MiB line limit, and a session/load three times
    /// --acp-replay-line-limit-mib in all (a line, its text and what it is parsed into; a line
    /// that would cost more to parse cuts the agent off); once the budget is spent, the next
    /// restore waits (before any ACP deadline) and finishes later instead of failing. The start
    /// is refused when one restore could never fit.
    #[arg(long, default_value_t = 0, value_name = "MIB")]
    acp_memory_budget_mib: u64,
    /// Sessions reconciled at the same time, at most (each holds at most one exec into its pod).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_reconciles: u16,
    /// Seconds from creating an agent pod to agentctl answering in it, at most; then the launch
    /// is stalled with the pod's reason (image pull, missing Secret, unschedulable, …), the pod
    /// is removed and a resume keeps its token.
    #[arg(long, default_value_t = defaults::LAUNCH_DEADLINE.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    launch_deadline_seconds: u64,
    /// Seconds a session that ends Completed (spec.end) lets a running prompt finish before the
    /// prompt is cancelled and the agent stopped.
    #[arg(long, default_value_t = 600)]
    end_grace_seconds: u64,
    /// Seconds a Running agent pod may stay not Ready (its readiness probe, agentctl events
    /// --once, run by the kubelet, gets no answer) before the pod counts as lost: its status
    /// says AgentUnreachable, then the pod is deleted, and once it is gone the session needs a
    /// resume. Costs no exec and no API request (the pod watch shows Ready). 0: never.
    #[arg(long, default_value_t = 300)]
    agent_unreachable_seconds: u64,
    /// Seconds a Running agent pod's node may be gone or not Ready before the pod counts as
    /// lost: its status says NodeLost, then the pod is force-deleted (grace period 0: the node
    /// cannot confirm anything), and the session needs a resume. Needs list and watch on nodes
    /// (cluster-scoped). 0: nodes are not watched.
    #[arg(long, default_value_t = 300)]
    node_lost_seconds: u64,
    /// Journal catch-ups (an `agentctl events` exec into a running agent pod) opened per
    /// second, at most, across all sessions, those whose agent was working first: an operator
    /// that starts beside thousands of running sessions catches up with them at this pace
    /// instead of opening one exec each at once. Restores never wait for it. 0: no limit.
    #[arg(long, default_value_t = kandev_operator::controller::gate::DEFAULT_EXECS_PER_SECOND)]
    catch_up_execs_per_second: u32,
    /// How long an agent may stay idle (waiting for input, no prompt, no client connected)
    /// before agentctl stops it and the session is Suspended (needsResume, token and workspace
    /// kept; any resume brings it back), for sessions whose spec.idle.suspendAfter does not
    /// say: a duration such as 30m or 1h30m (at least 10s), or off.
    #[arg(long, value_name = "DURATION", default_value = "off",
        value_parser = kandev_operator::api::parse_idle_duration)]
    // Spelled out: clap would take a plain `Option` for "the flag may be missing".
    suspend_idle_after: std::option::Option<Duration>,
    /// The permission policy of sessions whose spec.permissions leaves a field out, as JSON in
    /// the shape of spec.permissions: {"default":"allow|ask|deny","rules":[{"kinds":[…],
    /// "action":…}],"askTimeout":"15m"}. Fields left out keep the built-in defaults: read,
    /// search, think, edit, move, delete and switch_mode allowed, everything else (execute,
    /// fetch, other) asked, askTimeout 15m.
    #[arg(long, value_name = "JSON", default_value = "{}",
        value_parser = parse_permissions)]
    permissions: kandev_operator::api::EffectivePolicy,
    /// Seconds between reads of an idle agent's event journal (an exec each), for prompts sent
    /// by clients that do not set the kandev.dev/prompted-at annotation afterwards (kubectl
    /// kandev prompt does). 0 (the default): only when that annotation changes, so that an
    /// idle session costs no exec and no API request.
    #[arg(long, default_value_t = 0)]
    journal_catch_up_seconds: u64,
    /// Do not elect a leader (only for a single replica, e.g. local development).
    #[arg(long)]
    no_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "kandev-operator")]
    lease_name: String,
    /// Address of the HTTP endpoints /metrics, /healthz and /readyz, e.g. 0.0.0.0:8080 (port 0
    /// picks a free port). "off" (the default of the binary) serves none; the Helm chart serves
    /// them on 0.0.0.0:8080.
    #[arg(
        long,
        env = "KANDEV_HTTP_ADDRESS",
        value_name = "ADDR",
        default_value = "off"
    )]
    http_address: String,
    /// Serve /metrics on this address instead of --http-address, e.g. 127.0.0.1:8081 so that
    /// only containers of the pod (a sidecar) can scrape it. "off" (the default): with the
    /// other endpoints.
    #[arg(
        long,
        env = "KANDEV_METRICS_ADDRESS",
        value_name = "ADDR",
        default_value = "off"
    )]
    metrics_address: String,
    /// Who may read /metrics. "kubernetes": only requests with a bearer token that the API
    /// server authenticates (TokenReview) and authorizes for get on the non-resource URL
    /// /metrics (SubjectAccessReview), as kube-rbac-proxy does; 401 without a valid token, 403
    /// without the permission. Needs create on tokenreviews and subjectaccessreviews (checked
    /// at startup). /healthz and /readyz stay open either way.
    #[arg(long, value_enum, default_value_t = MetricsAuthFlag::None)]
    metrics_auth: MetricsAuthFlag,
    /// Serve /metrics over TLS (rustls): with the certificate of --metrics-tls-cert-file and
    /// --metrics-tls-key-file, else a self-signed one made at each start for localhost and the
    /// host's name. Applies to the listener that serves /metrics: --metrics-address when set
    /// (the chart's way: the probes stay plain HTTP on --http-address), else --http-address
    /// and with it the probes.
    #[arg(long)]
    metrics_tls: bool,
    /// PEM certificate (chain) of /metrics' TLS, e.g. tls.crt of a kubernetes.io/tls Secret.
    /// Read once at start: restart the operator after the certificate is renewed.
    #[arg(
        long,
        value_name = "FILE",
        requires_all = ["metrics_tls", "metrics_tls_key_file"]
    )]
    metrics_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --metrics-tls-cert-file (e.g. tls.key).
    #[arg(long, value_name = "FILE", requires = "metrics_tls_cert_file")]
    metrics_tls_key_file: Option<PathBuf>,
    /// Start without the RBAC self-check (one SelfSubjectAccessReview per permission the
    /// operator uses; a missing permission otherwise stops the start with a list of them).
    #[arg(long)]
    skip_permission_check: bool,
    /// How long the start may wait for the API server, and then for the RBAC self-check, before
    /// the operator gives up and exits (seconds).
    #[arg(long, default_value_t = 30)]
    startup_timeout_seconds: u64,
    /// Log format on stderr (the level comes from RUST_LOG, default "info,kube=warn").
    #[arg(long, env = "KANDEV_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum MetricsAuthFlag {
    /// Anyone who reaches the address may read /metrics.
    None,
    /// A bearer token authorized for get /metrics by the API server (TokenReview +
    /// SubjectAccessReview).
    Kubernetes,
}

impl From<MetricsAuthFlag> for MetricsAuth {
    fn from(flag: MetricsAuthFlag) -> Self {
        match flag {
            MetricsAuthFlag::None => MetricsAuth::Open,
            MetricsAuthFlag::Kubernetes => MetricsAuth::Kubernetes,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Why `kandev-operator` could not do what it was asked (or stopped): the binary's one error.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("rendering the CRDs as YAML: {0}")]
    RenderCrds(#[from] serde_yaml_ng::Error),
    #[error(transparent)]
    ChartCrds(#[from] kandev_operator::api::CrdTemplateError),
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    #[error(transparent)]
    Profiles(#[from] kandev_operator::agents::AgentRegistryError),
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error(transparent)]
    MemoryBudget(#[from] budget::BudgetError),
    #[error(transparent)]
    MetricsTls(#[from] metrics_tls::TlsError),
    #[error(transparent)]
    Bind(#[from] endpoints::BindError),
    #[error("HTTP endpoints: {0}")]
    LocalAddress(#[source] std::io::Error),
    #[error(transparent)]
    Connect(Box<ConnectError>),
    #[error(transparent)]
    Permissions(#[from] permissions::PermissionError),
    #[error(
        "RBAC self-check: the API server did not answer within {0}s (--startup-timeout-seconds)"
    )]
    PermissionsTimeout(u64),
    #[error("lost the leader lease; exiting so a new leader takes over")]
    LostLease,
}

impl From<ConnectError> for StartError {
    fn from(error: ConnectError) -> Self {
        Self::Connect(Box::new(error))
    }
}

/// Why the API server could not be reached at start.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("loading the cluster configuration (kubeconfig or in-cluster): {0}")]
    Config(#[source] kube::config::InferConfigError),
    #[error("creating the Kubernetes client for {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("the Kubernetes API server at {url} answered GET /version with an error: {source}")]
    Refused {
        url: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("the Kubernetes API server at {url} did not answer within {}s{} (--startup-timeout-seconds)", within.as_secs(), last.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NoAnswer {
        url: String,
        within: Duration,
        /// The last transport error, if any.
        last: Option<Box<kube::Error>>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd {
            output_dir,
            chart_dir,
        } => print_crds(output_dir.as_deref()).and_then(|()| match chart_dir {
            Some(dir) => write_chart_crds(&dir),
            None => Ok(()),
        }),
        Command::Run(args) => run(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn print_crds(output_dir: Option<&std::path::Path>) -> Result<(), StartError> {
    let files = kandev_operator::api::crd_files()?;
    for file in files {
        match output_dir {
            Some(dir) => {
                let path = dir.join(&file.file_name);
                std::fs::write(&path, &file.yaml).map_err(|source| StartError::File {
                    what: "writing",
                    path: path.clone(),
                    source,
                })?;
                eprintln!("wrote {}", path.display());
            }
            None => print!("---\n{}", file.yaml),
        }
    }
    Ok(())
}

fn write_chart_crds(dir: &std::path::Path) -> Result<(), StartError> {
    let files = kandev_operator::api::chart_crd_templates()?;
    std::fs::create_dir_all(dir).map_err(|source| StartError::File {
        what: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    for file in files {
        let path = dir.join(&file.file_name);
        std::fs::write(&path, &file.yaml).map_err(|source| StartError::File {
            what: "writing",
            path: path.clone(),
            source,
        })?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// A flag's value that does not parse: its words name the value and the form it should have.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum FlagError {
    #[error("toleration {0:?}: expected KEY[=VALUE]:EFFECT")]
    Toleration(String),
    #[error("resource {0:?}: expected NAME=QUANTITY, e.g. memory=2Gi")]
    Resource(String),
    #[error("{0:?} is not a size such as 512Mi or 1Gi")]
    Size(String),
    #[error(
        "image prefix {0:?} must end in '/' or ':' (e.g. registry.example.com/agents/ or registry.example.com/agentctl:): without it, it also matches other registries and repositories"
    )]
    ImagePrefix(String),
    #[error("node selector {0:?}: expected KEY=VALUE")]
    NodeSelector(String),
}

fn parse_toleration(text: &str) -> Result<k8s_openapi::api::core::v1::Toleration, FlagError> {
    let (key_value, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| FlagError::Toleration(text.to_string()))?;
    let (key, value) = match key_value.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (key_value, None),
    };
    Ok(k8s_openapi::api::core::v1::Toleration {
        key: Some(key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_string()),
        value,
        effect: Some(effect.to_string()),
        ..Default::default()
    })
}

/// `NAME=QUANTITY` pairs as a resource list (`None` when empty).
fn parse_resources(list: &[String]) -> Result<Option<BTreeMap<String, Quantity>>, FlagError> {
    let mut out = BTreeMap::new();
    for text in list {
        match text.split_once('=') {
            Some((name, quantity)) if !name.is_empty() && !quantity.is_empty() => {
                out.insert(name.to_string(), Quantity(quantity.to_string()));
            }
            _ => return Err(FlagError::Resource(text.to_string())),
        }
    }
    Ok((!out.is_empty()).then_some(out))
}

/// A size as Kubernetes writes it: digits, an optional fraction, an optional binary or decimal
/// suffix (`512Mi`, `1Gi`, `1.5G`, `1000000`).
fn size_quantity(text: &str) -> Result<Quantity, FlagError> {
    let number = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &text[number.len()..];
    let suffixes = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E",
    ];
    let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if digits(whole) && digits(fraction) && suffixes.contains(&suffix) {
        Ok(Quantity(text.to_string()))
    } else {
        Err(FlagError::Size(text.to_string()))
    }
}

/// An image prefix: ends in '/' or ':', so it names whole path segments or a repository's tags.
fn image_prefix(text: &str) -> Result<String, FlagError> {
    if text.is_empty() || text.ends_with('/') || text.ends_with(':') {
        Ok(text.to_string())
    } else {
        Err(FlagError::ImagePrefix(text.to_string()))
    }
}

fn parse_node_selector(text: &str) -> Result<(String, String), FlagError> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(FlagError::NodeSelector(text.to_string())),
    }
}

/// The default requests and limits of the agentctl container (`None` when both are empty).
/// `--permissions`: a spec.permissions-shaped JSON laid over the built-in defaults.
fn parse_permissions(json: &str) -> Result<kandev_operator::api::EffectivePolicy, String> {
    use kandev_operator::api::{EffectivePolicy, PermissionPolicy, parse_idle_duration};
    let policy: PermissionPolicy = serde_json::from_str(json).map_err(|error| {
        format!("{error}; expected e.g. {{\"default\":\"ask\",\"rules\":[{{\"kinds\":[\"read\",\"edit\"],\"action\":\"allow\"}}],\"askTimeout\":\"15m\"}}")
    })?;
    if let Some(timeout) = policy.ask_timeout.as_deref() {
        parse_idle_duration(timeout).map_err(|error| format!("askTimeout {error}"))?;
    }
    Ok(EffectivePolicy::over(
        &EffectivePolicy::default(),
        Some(&policy),
    ))
}

fn default_resources(
    args: &RunArgs,
) -> Result<Option<k8s_openapi::api::core::v1::ResourceRequirements>, FlagError> {
    let requests = parse_resources(&args.default_resource_requests)?;
    let limits = parse_resources(&args.default_resource_limits)?;
    Ok((requests.is_some() || limits.is_some()).then(|| {
        k8s_openapi::api::core::v1::ResourceRequirements {
            requests,
            limits,
            ..Default::default()
        }
    }))
}

/// The watched namespaces, trimmed, without empty entries and duplicates, in order.
fn watch_namespaces(list: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for ns in list.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if !out.iter().any(|o| o == ns) {
            out.push(ns.to_string());
        }
    }
    out
}

/// The restores' memory budget (`--acp-memory-budget-mib`, else half of the cgroup's limit);
/// refused when one restore with a `session/load` could never fit in it.
fn acp_memory_budget(flag_mib: u64, limits: &AcpLimits) -> Result<MemoryBudget, StartError> {
    let cgroup = budget::cgroup_memory_limit();
    let memory = MemoryBudget::new(budget::budget_size(flag_mib, cgroup));
    memory.check(budget::connection_need(limits) + budget::replay_need(limits))?;
    let mib = |bytes: u64| bytes / (1024 * 1024);
    tracing::info!(
        budget_mib = mib(memory.total()),
        container_limit_mib = cgroup.map(mib),
        restore_mib = mib(budget::connection_need(limits)),
        load_mib = mib(budget::connection_need(limits) + budget::replay_need(limits)),
        "ACP memory budget"
    );
    metrics::global().track_acp_memory(memory.clone());
    Ok(memory)
}

/// Where /metrics' TLS certificate comes from; `None` without `--metrics-tls`.
fn metrics_tls_source(args: &RunArgs) -> Option<metrics_tls::CertificateSource> {
    if !args.metrics_tls {
        return None;
    }
    Some(
        match (&args.metrics_tls_cert_file, &args.metrics_tls_key_file) {
            (Some(cert), Some(key)) => metrics_tls::CertificateSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => metrics_tls::CertificateSource::self_signed_for_this_host(),
        },
    )
}

/// `--http-address` or `--metrics-address`: `None` when off.
fn http_address(text: &str) -> Option<&str> {
    let text = text.trim();
    (!text.is_empty() && !text.eq_ignore_ascii_case("off")).then_some(text)
}

/// The listeners to open: (address, what it serves, what it is called in the log).
fn listeners<'a>(
    http: Option<&'a str>,
    metrics: Option<&'a str>,
) -> Vec<(&'a str, Routes, &'static str)> {
    match (http, metrics) {
        (Some(http), None) => vec![(http, Routes::ALL, "/metrics, /healthz and /readyz")],
        (http, Some(metrics)) => http
            .map(|http| (http, Routes::HEALTH, "/healthz and /readyz"))
            .into_iter()
            .chain([(metrics, Routes::METRICS, "/metrics")])
            .collect(),
        (None, None) => Vec::new(),
    }
}

fn log_settings(format: LogFormat) -> LogSettings {
    LogSettings {
        filter: tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn")),
        json: matches!(format, LogFormat::Json),
        service: "kandev-operator",
        export: true,
    }
}

/// Deadline of one API request's answer (not of watches and exec streams).
const API_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Clients whose API server answered, within `timeout`. Transport errors (server not up yet)
/// are retried until then; an answer that is an error (e.g. 401) is final.
async fn connect(timeout: Duration) -> Result<Clients, ConnectError> {
    let config = kube::Config::infer().await.map_err(ConnectError::Config)?;
    let url = config.cluster_url.clone();
    let mut calls = config.clone();
    calls.read_timeout = Some(API_CALL_TIMEOUT);
    // The deadline counts from the request, not from when a pooled connection went idle.
    calls.reset_reader_on_write = true;
    let make = |config| {
        kube::Client::try_from(config).map_err(|source| ConnectError::Client {
            url: url.to_string(),
            source: Box::new(source),
        })
    };
    let clients = Clients {
        calls: make(calls)?,
        streams: make(config)?,
    };
    let client = &clients.calls;
    let deadline = Instant::now() + timeout;
    let gave_up = |last: Option<kube::Error>| ConnectError::NoAnswer {
        url: url.to_string(),
        within: timeout,
        last: last.map(Box::new),
    };
    loop {
        match tokio::time::timeout_at(deadline, client.apiserver_version()).await {
            Ok(Ok(version)) => {
                tracing::info!(server = %url, version = %version.git_version, "connected to the API server");
                return Ok(clients);
            }
            Ok(Err(source @ kube::Error::Api(_))) => {
                return Err(ConnectError::Refused {
                    url: url.to_string(),
                    source: Box::new(source),
                });
            }
            Ok(Err(err)) => {
                let retry = Duration::from_secs(2);
                if Instant::now() + retry >= deadline {
                    return Err(gave_up(Some(err)));
                }
                tracing::warn!(server = %url, %err, "API server not reachable yet; retrying");
                tokio::time::sleep(retry).await;
            }
            Err(_) => return Err(gave_up(None)),
        }
    }
}

/// glibc gives a thread that allocates under contention a malloc arena of its own (up to eight
/// per core), and a freed block returns to the arena it came from: with reconciles on every
/// tokio worker, a fleet's launch left the operator's RSS about 5 MiB higher (N = 400: peak
/// 66.9–68.1 MiB, 62.2 with two arenas; docs/performance.md). Two arenas serve the two busy
/// threads; `MALLOC_ARENA_MAX`, when set, decides instead. The image's build is glibc too (the
/// Dockerfile's gnu target), so this holds in the image as well.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn cap_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no other thread runs yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn cap_malloc_arenas() {}

fn run(args: RunArgs) -> Result<(), StartError> {
    cap_malloc_arenas();
    let runtime = tokio::runtime::Runtime::new().map_err(StartError::Runtime)?;
    // The OTLP exporter's batch task runs on the runtime.
    let telemetry = {
        let _runtime = runtime.enter();
        telemetry::init(log_settings(args.log_format))?
    };
    let result = run_controller(&runtime, args);
    runtime.block_on(telemetry.shutdown());
    result
}

fn run_controller(runtime: &tokio::runtime::Runtime, args: RunArgs) -> Result<(), StartError> {
    let agents = match &args.agent_profiles {
        Some(path) => AgentRegistry::load_file(path),
        None => AgentRegistry::builtin(),
    }?;
    let settings = operator_settings(&args)?;
    runtime.block_on(async move {
        // The endpoints come first: liveness holds while the startup checks and the wait for the
        // lease run, and readiness says when the checks passed.
        let metrics_auth = MetricsAuth::from(args.metrics_auth);
        let http_state = HttpState::with_auth(metrics_auth);
        serve_endpoints(&args, &http_state).await?;
        let clients = startup_checks(&args, &settings, &http_state).await?;
        http_state.set_ready();
        if args.no_leader_election {
            metrics::global().set_leader(true);
            controller::run(clients, agents, settings).await;
            return Ok(());
        }
        let identity = std::env::var("POD_NAME")
            .unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
        let lease = LeaseSettings::new(
            args.lease_namespace.clone(),
            args.lease_name.clone(),
            identity,
        );
        let election = leader::elect(clients.calls.clone(), lease);
        tracing::info!(lease = %args.lease_name, "waiting to become the leader");
        let mut leading = election.leading.clone();
        let led = tokio::select! {
            led = leading.wait_for(|l| *l) => led.is_ok(),
            () = shutdown_signal() => false,
        };
        if !led {
            election.release().await;
            return Ok(());
        }
        tokio::select! {
            // A shutdown signal ends the controller; the lease goes to the next leader at once.
            () = controller::run(clients, agents, settings) => {
                election.release().await;
                Ok(())
            }
            _ = leading.wait_for(|l| !*l) => Err(StartError::LostLease),
        }
    })
}

/// What every reconcile shares, from the flags.
fn operator_settings(args: &RunArgs) -> Result<OperatorSettings, StartError> {
    let acp_limits = AcpLimits {
        replay_line: kandev_operator::jsonrpc::codec::mib(args.acp_replay_line_limit_mib),
        replay_budget: args.acp_replay_budget_mib.saturating_mul(1024 * 1024),
        ..AcpLimits::default()
    };
    let acp_memory = acp_memory_budget(args.acp_memory_budget_mib, &acp_limits)?;
    let seconds_if_set = |seconds: u64| (seconds > 0).then(|| Duration::from_secs(seconds));
    Ok(OperatorSettings {
        pod: pod_settings(args)?,
        watch_namespaces: watch_namespaces(&args.watch_namespaces),
        resync: Duration::from_secs(args.resync_seconds),
        acp_timeout: Duration::from_secs(args.acp_timeout_seconds),
        restore_timeout: Duration::from_secs(args.acp_restore_timeout_seconds),
        acp_limits,
        acp_memory,
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        launch_deadline: Duration::from_secs(args.launch_deadline_seconds),
        end_grace: Duration::from_secs(args.end_grace_seconds),
        agent_unreachable_after: seconds_if_set(args.agent_unreachable_seconds),
        node_lost_after: seconds_if_set(args.node_lost_seconds),
        catch_up_execs_per_second: args.catch_up_execs_per_second,
        journal_catch_up_every: seconds_if_set(args.journal_catch_up_seconds),
    })
}

/// What the agentctl pods get, from the flags.
fn pod_settings(args: &RunArgs) -> Result<PodSettings, StartError> {
    let tolerations = args
        .pod_tolerations
        .iter()
        .map(|t| parse_toleration(t))
        .collect::<Result<Vec<_>, _>>()?;
    let node_selector = args
        .pod_node_selectors
        .iter()
        .map(|s| parse_node_selector(s))
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    Ok(PodSettings {
        default_image: args.agentctl_image.clone(),
        tolerations,
        node_selector,
        run_as_user: args.run_as_user,
        replay_line_limit_mib: args.acp_replay_line_limit_mib,
        default_resources: default_resources(args)?,
        suspend_idle_after: args.suspend_idle_after,
        permissions: args.permissions.clone(),
        runtime_class_name: args.runtime_class_name.clone().filter(|n| !n.is_empty()),
        user_namespace: !args.host_users,
        allowed_image_prefixes: args
            .allowed_image_prefixes
            .iter()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect(),
        network: args.agent_network_policy.then(|| NetworkRules {
            allow: args.egress_allow_cidrs.clone(),
            deny: args.egress_deny_cidrs.clone(),
            ingress: args.ingress_allow_cidrs.clone(),
        }),
        scratch: ScratchLimits {
            tmp: args.tmp_size_limit.clone(),
            run: args.run_size_limit.clone(),
        },
        trace_env: telemetry::pod_env(),
    })
}

/// Binds and serves `/healthz`, `/readyz` and `/metrics` (with TLS where asked).
async fn serve_endpoints(args: &RunArgs, http_state: &Arc<HttpState>) -> Result<(), StartError> {
    let listeners = listeners(
        http_address(&args.http_address),
        http_address(&args.metrics_address),
    );
    if listeners.is_empty() {
        tracing::info!("HTTP endpoints are off (--http-address)");
    }
    let tls = metrics_tls_source(args)
        .map(|source| metrics_tls::acceptor(&source).map(|acceptor| (acceptor, source)))
        .transpose()?;
    for (address, routes, what) in listeners {
        let listener = endpoints::bind(address).await?;
        let local = listener.local_addr().map_err(StartError::LocalAddress)?;
        let tls = tls.as_ref().filter(|_| routes.metrics);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let certificate = tls.map(|(_, source)| match source {
            metrics_tls::CertificateSource::Files { cert, .. } => cert.display().to_string(),
            metrics_tls::CertificateSource::SelfSigned { names } => {
                format!("self-signed for {}", names.join(", "))
            }
        });
        let metrics_auth = http_state.auth();
        tracing::info!(address = %local, scheme, certificate, metrics_auth = ?metrics_auth, "serving {what}");
        let acceptor = tls.map(|(acceptor, _)| acceptor.clone());
        tokio::spawn(endpoints::serve(
            listener,
            http_state.clone(),
            routes,
            acceptor,
        ));
    }
    Ok(())
}

/// Connects to the API server, says who the operator is, and checks its RBAC permissions
/// (unless `--skip-permission-check`), each within `--startup-timeout-seconds`.
async fn startup_checks(
    args: &RunArgs,
    settings: &OperatorSettings,
    http_state: &HttpState,
) -> Result<Clients, StartError> {
    let timeout = Duration::from_secs(args.startup_timeout_seconds);
    let clients = connect(timeout).await?;
    let client = &clients.calls;
    http_state.set_reviewer(client.clone());
    let user = tokio::time::timeout(timeout, permissions::whoami(client))
        .await
        .ok()
        .flatten();
    tracing::info!(
        user = user.as_deref().unwrap_or("unknown"),
        "authenticated to the API server"
    );
    if args.skip_permission_check {
        tracing::warn!("--skip-permission-check: not checking RBAC permissions at startup");
        return Ok(clients);
    }
    let lease_namespace = (!args.no_leader_election).then_some(args.lease_namespace.as_str());
    let optional = (
        http_state.auth() == MetricsAuth::Kubernetes,
        settings.node_lost_after.is_some(),
    );
    let verify = permissions::verify(
        client,
        lease_namespace,
        &settings.watch_namespaces,
        optional,
        user.as_deref(),
    );
    tokio::time::timeout(timeout, verify)
        .await
        .map_err(|_| StartError::PermissionsTimeout(timeout.as_secs()))??;
    tracing::info!("RBAC self-check passed");
    Ok(clients)
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "kandev-operator".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = ["kandev-operator", "run"].iter().chain(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Run(args) => Ok(*args),
            Command::Crd { .. } => panic!("not run"),
        }
    }

    #[test]
    fn root_is_refused() {
        let err = run_args(&["--run-as-user", "0"]).err().expect("refused");
        assert!(err.to_string().contains("--run-as-user"), "{err}");
        assert!(run_args(&["--run-as-user=-1"]).is_err());
        assert_eq!(run_args(&[]).expect("defaults").run_as_user, 1000);
    }

    #[test]
    fn containment_defaults_and_flags() {
        let args = run_args(&[]).expect("defaults");
        assert!(args.watch_namespaces.is_empty());
        let resources = default_resources(&args).expect("valid").expect("some");
        let json = serde_json::to_value(resources).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "requests": {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "256Mi"},
                "limits": {"memory": "2Gi", "ephemeral-storage": "4Gi"},
            })
        );
        assert_eq!(
            (
                args.tmp_size_limit.0.as_str(),
                args.run_size_limit.0.as_str()
            ),
            ("1Gi", "16Mi")
        );
        assert!(args.ingress_allow_cidrs.is_empty(), "no ingress by default");
        for good in ["1Gi", "512Mi", "1.5G", "1000000", "64k"] {
            assert_eq!(size_quantity(good).map(|q| q.0).as_deref(), Ok(good));
        }
        for bad in ["", "Gi", "1 Gi", "-1Gi", "1gb", "1.Gi", "1e3"] {
            assert!(size_quantity(bad).is_err(), "{bad:?}");
        }
        assert!(run_args(&["--tmp-size-limit=lots"]).is_err());
        for good in ["registry.example/agents/", "ghcr.io/kandev/agentctl:", ""] {
            assert_eq!(image_prefix(good).as_deref(), Ok(good), "{good:?}");
        }
        for bad in [
            "registry.example",
            "ghcr.io/kandev",
            "ghcr.io/kandev/agentctl",
        ] {
            let refused = image_prefix(bad).expect_err(bad).to_string();
            assert!(refused.contains("must end in '/' or ':'"), "{refused}");
        }
        assert!(run_args(&["--allowed-image-prefix=registry.example"]).is_err());
        assert!(args.host_users && args.agent_network_policy);
        assert!(args.allowed_image_prefixes.is_empty() && args.runtime_class_name.is_none());
        assert_eq!(
            args.egress_deny_cidrs.len(),
            pods::DEFAULT_EGRESS_DENY.len()
        );

        let args = run_args(&[
            "--watch-namespace=team-a",
            "--watch-namespace=team-b,team-a",
            "--host-users=false",
            "--agent-network-policy=false",
            "--runtime-class-name=gvisor",
            "--allowed-image-prefix=registry.example/agents/",
            "--allowed-image-prefix=ghcr.io/kandev/",
            "--default-resource-limit=memory=4Gi",
            "--default-resource-limit=cpu=2",
            "--egress-deny-cidr=169.254.169.254/32",
        ])
        .expect("valid");
        assert_eq!(
            watch_namespaces(&args.watch_namespaces),
            ["team-a", "team-b"]
        );
        assert!(!args.host_users && !args.agent_network_policy);
        assert_eq!(args.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(
            args.allowed_image_prefixes.len(),
            2,
            "repeated flags add up"
        );
        assert_eq!(args.default_resource_limits, ["memory=4Gi", "cpu=2"]);
        assert_eq!(
            args.egress_deny_cidrs.len(),
            1,
            "given values replace the defaults"
        );

        assert!(run_args(&["--egress-allow-cidr=10.0.0.1/8"]).is_err());
        let args = run_args(&["--default-resource-request=cpu"]).expect("parsed later");
        assert!(default_resources(&args).is_err());
    }

    #[test]
    fn metrics_listeners_and_auth() {
        let args = run_args(&[]).expect("defaults");
        assert_eq!(args.metrics_auth, MetricsAuthFlag::None);
        assert_eq!(http_address(&args.metrics_address), None);
        let args = run_args(&[
            "--metrics-auth=kubernetes",
            "--metrics-address=127.0.0.1:8081",
        ])
        .expect("valid");
        assert_eq!(
            MetricsAuth::from(args.metrics_auth),
            MetricsAuth::Kubernetes
        );
        assert!(run_args(&["--metrics-auth=basic"]).is_err());
        // TLS: self-signed by default, else both files (and only with --metrics-tls).
        assert_eq!(metrics_tls_source(&run_args(&[]).expect("valid")), None);
        let self_signed = run_args(&["--metrics-tls"]).expect("valid");
        assert!(matches!(
            metrics_tls_source(&self_signed),
            Some(metrics_tls::CertificateSource::SelfSigned { names }) if names.contains(&"localhost".to_string())
        ));
        let files = run_args(&[
            "--metrics-tls",
            "--metrics-tls-cert-file=/tls/tls.crt",
            "--metrics-tls-key-file=/tls/tls.key",
        ])
        .expect("valid");
        assert_eq!(
            metrics_tls_source(&files),
            Some(metrics_tls::CertificateSource::Files {
                cert: "/tls/tls.crt".into(),
                key: "/tls/tls.key".into()
            })
        );
        assert!(run_args(&["--metrics-tls", "--metrics-tls-cert-file=/c"]).is_err());
        assert!(run_args(&["--metrics-tls", "--metrics-tls-key-file=/k"]).is_err());
        assert!(run_args(&["--metrics-tls-cert-file=/c", "--metrics-tls-key-file=/k"]).is_err());
        type Listeners = Vec<(&'static str, Routes)>;
        #[rustfmt::skip]
        let rows: [(Option<&str>, Option<&str>, Listeners); 4] = [
            (Some("0.0.0.0:8080"), None, vec![("0.0.0.0:8080", Routes::ALL)]),
            (Some("0.0.0.0:8080"), Some("127.0.0.1:8081"), vec![("0.0.0.0:8080", Routes::HEALTH), ("127.0.0.1:8081", Routes::METRICS)]),
            (None, Some("127.0.0.1:8081"), vec![("127.0.0.1:8081", Routes::METRICS)]),
            (None, None, vec![]),
        ];
        for (http, metrics, expected) in rows {
            let got: Vec<(&str, Routes)> = listeners(http, metrics)
                .into_iter()
                .map(|(address, routes, _)| (address, routes))
                .collect();
            assert_eq!(got, expected, "{http:?} {metrics:?}");
        }
    }
}
