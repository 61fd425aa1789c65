//! `kandev-operator`: the controller binary (and the CRD generator).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kandev_operator::agents::AgentRegistry;
use kandev_operator::controller::leader::{self, LeaseSettings};
use kandev_operator::controller::pods::PodSettings;
use kandev_operator::controller::{self, OperatorSettings};

#[derive(Parser)]
#[command(
    name = "kandev-operator",
    version,
    about = "Keeps AI coding-agent sessions alive across pod loss: lost agents are marked NeedsResume and restored over ACP when a resume is requested."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against the cluster of the current kubeconfig (or in-cluster config).
    Run(RunArgs),
    /// Print the TaskSession and ExecutorRunning CRDs as one multi-document YAML stream
    /// (the same content as the files under crds/).
    Crd {
        /// Write one file per CRD (<plural>.kandev.dev.yaml) into this directory instead.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Image of agentctl pods for sessions that do not name one.
    #[arg(
        long,
        env = "KANDEV_AGENTCTL_IMAGE",
        default_value = "kandev/agentctl:latest"
    )]
    agentctl_image: String,
    /// YAML or JSON file of agent profiles that extend or override the built-in ones.
    #[arg(long, env = "KANDEV_AGENT_PROFILES", value_name = "FILE")]
    agent_profiles: Option<PathBuf>,
    /// UID agent pods run as (never root).
    #[arg(long, default_value_t = 1000)]
    run_as_user: i64,
    /// Toleration added to every agent pod, as KEY[=VALUE]:EFFECT (repeatable).
    #[arg(long = "pod-toleration", value_name = "KEY[=VALUE]:EFFECT")]
    pod_tolerations: Vec<String>,
    /// Re-evaluate every session at least this often, in seconds (watches do the rest).
    #[arg(long, default_value_t = 60)]
    resync_seconds: u64,
    /// Timeout of one ACP call made into an agent pod, in seconds.
    #[arg(long, default_value_t = 60)]
    acp_timeout_seconds: u64,
    /// Do not elect a leader (only for a single replica, e.g. local development).
    #[arg(long)]
    no_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "kandev-operator")]
    lease_name: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd { output_dir } => print_crds(output_dir.as_deref()),
        Command::Run(args) => run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn print_crds(output_dir: Option<&std::path::Path>) -> Result<(), String> {
    let files = kandev_operator::api::crd_files()
        .map_err(|e| format!("rendering the CRDs as YAML: {e}"))?;
    for file in files {
        match output_dir {
            Some(dir) => {
                let path = dir.join(&file.file_name);
                std::fs::write(&path, &file.yaml)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            None => print!("---\n{}", file.yaml),
        }
    }
    Ok(())
}

fn parse_toleration(text: &str) -> Result<k8s_openapi::api::core::v1::Toleration, String> {
    let (key_value, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("toleration {text:?}: expected KEY[=VALUE]:EFFECT"))?;
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

fn run(args: RunArgs) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let agents = match &args.agent_profiles {
        Some(path) => AgentRegistry::load_file(path),
        None => AgentRegistry::builtin(),
    }
    .map_err(|e| e.to_string())?;
    let tolerations = args
        .pod_tolerations
        .iter()
        .map(|t| parse_toleration(t))
        .collect::<Result<Vec<_>, _>>()?;
    let settings = OperatorSettings {
        pod: PodSettings {
            default_image: args.agentctl_image.clone(),
            tolerations,
            node_selector: Default::default(),
            run_as_user: args.run_as_user,
        },
        resync: Duration::from_secs(args.resync_seconds),
        acp_timeout: Duration::from_secs(args.acp_timeout_seconds),
    };
    let runtime =
        tokio::runtime::Runtime::new().map_err(|e| format!("starting the async runtime: {e}"))?;
    runtime.block_on(async move {
        let client = kube::Client::try_default().await.map_err(|e| format!("connecting to the cluster: {e}"))?;
        if !args.no_leader_election {
            let identity = std::env::var("POD_NAME")
                .unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
            let mut leading = leader::elect(
                client.clone(),
                LeaseSettings {
                    namespace: args.lease_namespace.clone(),
                    name: args.lease_name.clone(),
                    identity,
                    duration: Duration::from_secs(15),
                    renew_every: Duration::from_secs(5),
                },
            );
            tracing::info!(lease = %args.lease_name, "waiting to become the leader");
            leading.wait_for(|l| *l).await.map_err(|_| "leader election stopped".to_string())?;
            tokio::select! {
                () = controller::run(client, agents, settings) => Ok(()),
                _ = leading.wait_for(|l| !*l) => Err("lost the leader lease; exiting so a new leader takes over".to_string()),
            }
        } else {
            controller::run(client, agents, settings).await;
            Ok(())
        }
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "kandev-operator".into())
}
