//! `kandev-e2e-harness`: plays the containers of kandev-managed pods on the kwok e2e cluster.
//!
//! kwok marks pods Running but runs nothing. For every pod labelled `kandev.dev/managed=true`,
//! `run` starts the first container's command as a local process (volumes mapped to local
//! directories) and creates kwok `Exec`/`Logs` objects so that `exec`/`logs` through the real API
//! server reach that process's neighbourhood. It also provisions a local PersistentVolume for
//! every unbound PVC (there is no storage backend on a kwok cluster). See e2e/README.md.
//!
//! Test-only: never shipped in an image.

mod configmaps;
mod echo;
mod identity;
mod kwok;
mod plan;
mod pod_status;
mod preflight;
mod process;
mod provisioner;
mod readiness;
mod supervisor;

use kandev_e2e_support::{annotations, kubeconfig};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "kandev-e2e-harness",
    version,
    about = "Plays the containers of kandev pods on a kwok cluster (e2e tests only)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Watch managed pods and run their first container locally until SIGTERM.
    Run {
        /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// Where local volumes, pod directories, pid and log files live.
        #[arg(long)]
        state_dir: PathBuf,
        /// Which pods to play: an equality-based label selector; repeat it to play pods that
        /// match any of them.
        #[arg(long = "selector", default_value = "kandev.dev/managed=true")]
        selectors: Vec<String>,
        /// Upper bound of the SIGTERM-to-SIGKILL grace period, in seconds.
        #[arg(long, default_value_t = 10)]
        max_grace_seconds: u64,
    },
    /// Echo newline-delimited JSON from stdin to stdout until `{"bye":true}` (no EOF needed).
    NdjsonEcho,
    /// Sleep until killed (a pod's main process in tests).
    Idle,
}

/// The client, and the kubeconfig it came from (none when inferred).
async fn client(
    kubeconfig: Option<PathBuf>,
) -> Result<(Client, Option<Kubeconfig>), supervisor::BoxError> {
    match kubeconfig {
        // $KUBECONFIG may hold a list; the first entry is the one the cluster scripts write.
        Some(path) if !path.as_os_str().is_empty() => {
            let first = std::env::split_paths(&path).next().unwrap_or(path);
            let kc = Kubeconfig::read_from(&first)?;
            let config =
                Config::from_custom_kubeconfig(kc.clone(), &KubeConfigOptions::default()).await?;
            Ok((Client::try_from(config)?, Some(kc)))
        }
        _ => Ok((Client::try_from(Config::infer().await?)?, None)),
    }
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::NdjsonEcho => match echo::run() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ndjson-echo: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Cmd::Idle => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        Cmd::Run {
            kubeconfig,
            state_dir,
            selectors,
            max_grace_seconds,
        } => {
            init_tracing();
            // Current-thread runtime: every child is spawned from this (main) thread, which keeps
            // the children's parent-death signal meaningful (see process::spawn).
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("kandev-e2e-harness: cannot start the runtime: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(async move {
                let (client, kubeconfig) = client(kubeconfig).await?;
                let opts = supervisor::Options {
                    state_dir,
                    selectors,
                    kubeconfig,
                    max_grace: Duration::from_secs(max_grace_seconds),
                    verify_delay: Duration::from_secs(3),
                };
                supervisor::run(client, opts).await
            });
            match result {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "harness failed");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
