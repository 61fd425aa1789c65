//! `kandev-bench`: the fleet benchmark behind `make bench` (see docs/performance.md).
//!
//! For each fleet size it drives our operator through the phases (launch, loss, resume, storm,
//! idle), then the API floor (alone, and with the fleet issue's write budget when asked) and
//! agent-sandbox through the same work, on the same cluster, and writes a markdown report, the
//! raw JSON and (for a sweep) SVG plots. API requests come from kube-apiserver's audit log, per
//! client identity. Run it through `e2e/bench/run.sh`, which starts a cluster with auditing and
//! the harness, and tears it down.
//!
//! Test-only; not shipped in images. It exits non-zero only on an error of its own: targets the
//! operator misses are shown as ❌ in the report, not asserted.

mod audit;
mod cluster;
mod floor;
mod idle;
mod ours;
mod plot;
mod probe;
mod process;
mod report;
mod sandbox;

use kandev_e2e_support::{annotations, kubeconfig};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cluster::Bench;
use crate::report::Report;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(
    name = "kandev-bench",
    about = "Fleet benchmark: our operator beside the API floor and agent-sandbox (run it with `make bench`)"
)]
struct Args {
    /// Kubeconfig of the cluster (an admin: the bench creates identities for each contender).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// kube-apiserver's audit log (the cluster must run with e2e/bench/audit-policy.yaml).
    #[arg(long, env = "KANDEV_BENCH_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
    /// The harness's state directory (workspaces live in its volumes/).
    #[arg(long, env = "KANDEV_BENCH_HARNESS_STATE")]
    harness_state: Option<PathBuf>,
    /// Fleet size.
    #[arg(long, env = "BENCH_N", default_value_t = 200)]
    n: usize,
    /// Fleet sizes to sweep, comma-separated (e.g. 50,100,200,400); overrides --n and draws plots.
    #[arg(long, env = "BENCH_SWEEP", value_delimiter = ',')]
    sweep: Vec<usize>,
    /// Phases of our operator: launch, loss, resume, storm, idle, suspend (earlier ones run when
    /// a later one needs them; idle only when asked for). suspend: the fleet with
    /// spec.idle.suspendAfter 10s, relaunched, then left idle until every session is suspended.
    #[arg(
        long,
        env = "BENCH_PHASES",
        value_delimiter = ',',
        default_value = "launch,loss,resume,storm,idle"
    )]
    phases: Vec<String>,
    /// Contenders: ours, floor, floor-budget (the floor with every other write of the fleet
    /// issue's budget), agent-sandbox.
    #[arg(
        long,
        env = "BENCH_CONTENDERS",
        value_delimiter = ',',
        default_value = "ours,floor,agent-sandbox"
    )]
    contenders: Vec<String>,
    /// Length of the idle phase, seconds.
    #[arg(long, env = "BENCH_IDLE_SECONDS", default_value_t = 60)]
    idle_seconds: u64,
    /// Idle-fleet mode: this many sessions in their steady state without processes (needs a
    /// cluster without the harness); nothing else runs.
    #[arg(long, env = "BENCH_IDLE_FLEET")]
    idle_fleet: Option<usize>,
    /// The agent-sandbox controller binary (e2e/bin.sh builds it).
    #[arg(long, env = "KANDEV_BENCH_SANDBOX_BIN")]
    sandbox_bin: Option<PathBuf>,
    /// agent-sandbox's CRD directory (from its Go module).
    #[arg(long, env = "KANDEV_BENCH_SANDBOX_CRDS")]
    sandbox_crds: Option<PathBuf>,
    /// Where the report, JSON and plots go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Fail (exit 1) unless the run measured everything: every phase finished for every
    /// session, repeated in-pod operations were counted, and every contender's requests were
    /// found in the audit log (the smoke in `make test`: proves the bench still measures).
    #[arg(long, env = "BENCH_REQUIRE_COMPLETE")]
    require_complete: bool,
    /// Measure nothing: render the report and plots of an earlier run's results.json into --out.
    #[arg(long, value_name = "RESULTS_JSON")]
    from_results: Option<PathBuf>,
    /// Commit of the code under test, for the report.
    #[arg(long, env = "BENCH_COMMIT", default_value = "unknown")]
    commit: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kandev-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SIGTERM/SIGINT drop the run, so every child process is stopped and the sessions of the
    // fleet in progress are left to the cluster's teardown.
    let interrupted = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok::<_, std::io::Error>(())
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            result = run(args) => result,
            signal = interrupted => match signal {
                Ok(()) => Err("interrupted".into()),
                Err(e) => Err(format!("cannot listen for signals: {e}").into()),
            },
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kandev-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut args: Args) -> Result<(), BoxError> {
    // Absolute: kubeconfigs written there name their token files by path.
    std::fs::create_dir_all(&args.out)?;
    args.out = std::fs::canonicalize(&args.out)?;
    for phase in &args.phases {
        if !ours::PHASES.contains(&phase.as_str()) {
            return Err(format!(
                "unknown phase {phase:?} (known: {})",
                ours::PHASES.join(", ")
            )
            .into());
        }
    }
    let known: Vec<&str> = std::iter::once("ours")
        .chain(floor::Variant::ALL.map(floor::Variant::arg))
        .chain(["agent-sandbox"])
        .collect();
    for c in &args.contenders {
        if !known.contains(&c.as_str()) {
            return Err(format!("unknown contender {c:?} (known: {})", known.join(", ")).into());
        }
    }
    if let Some(path) = &args.from_results {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let report: Report =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        return write(&report, &args.out);
    }
    let needed = |value: &Option<PathBuf>, what: &str| {
        value
            .clone()
            .ok_or_else(|| format!("{what} is not set (run the bench with `make bench`)"))
    };
    let bench = Bench::connect(
        &needed(&args.kubeconfig, "--kubeconfig / KUBECONFIG")?,
        &needed(&args.audit_log, "--audit-log / KANDEV_BENCH_AUDIT_LOG")?,
        args.out.join("work"),
        needed(
            &args.harness_state,
            "--harness-state / KANDEV_BENCH_HARNESS_STATE",
        )?,
    )
    .await?;
    let idle = Duration::from_secs(args.idle_seconds);
    let mut report = Report {
        date: now(),
        commit: args.commit.clone(),
        machine: machine(),
        ..Default::default()
    };
    let mut settings = BTreeMap::new();
    settings.insert("phases".to_string(), args.phases.join(","));
    settings.insert("idle_seconds".to_string(), args.idle_seconds.to_string());

    if let Some(k) = args.idle_fleet {
        settings.insert("idle_fleet".to_string(), k.to_string());
        report.settings = settings;
        report.results = idle::run(&bench, k, idle).await?;
        return write(&report, &args.out);
    }
    let sizes = if args.sweep.is_empty() {
        vec![args.n]
    } else {
        args.sweep.clone()
    };
    settings.insert(
        "N".to_string(),
        sizes
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
    );
    settings.insert("contenders".to_string(), args.contenders.join(","));
    report.settings = settings;
    let wants = |c: &str| args.contenders.iter().any(|x| x == c);
    let sandbox = if wants("agent-sandbox") {
        let bin = args
            .sandbox_bin
            .clone()
            .ok_or("agent-sandbox needs --sandbox-bin (e2e/bin.sh builds it)")?;
        let crds = args
            .sandbox_crds
            .clone()
            .ok_or("agent-sandbox needs --sandbox-crds")?;
        Some(sandbox::Contender::install(&bench, bin, &crds).await?)
    } else {
        None
    };
    for n in sizes {
        if wants("ours") {
            eprintln!("[bench] ours, N={n}: phases {}", args.phases.join(","));
            report
                .results
                .extend(ours::run(&bench, n, &args.phases, idle).await?);
        }
        for variant in floor::Variant::ALL {
            if wants(variant.arg()) {
                eprintln!("[bench] {}, N={n}", variant.arg());
                let r = floor::run(&bench, n, variant).await?;
                eprintln!(
                    "[bench] {} N={n}: {}/{n} in {:.1}s",
                    r.contender, r.completed, r.seconds
                );
                report.results.push(r);
            }
        }
        if let Some(sandbox) = &sandbox {
            eprintln!("[bench] agent-sandbox, N={n}");
            report.results.extend(sandbox.run(&bench, n).await?);
        }
        // Every size's results are on disk as soon as they exist.
        write_files(&report, &args.out)?;
    }
    write(&report, &args.out)?;
    if args.require_complete {
        let problems = report.incomplete();
        if !problems.is_empty() {
            return Err(format!("--require-complete: {}", problems.join("; ")).into());
        }
    }
    Ok(())
}

/// Writes the report files and prints the markdown.
fn write(report: &Report, out: &std::path::Path) -> Result<(), BoxError> {
    let plots = write_files(report, out)?;
    println!("{}", report.markdown());
    for p in plots {
        println!("plot: {}", out.join(p).display());
    }
    println!("report: {}", out.join("report.md").display());
    println!("results: {}", out.join("results.json").display());
    Ok(())
}

fn write_files(report: &Report, out: &std::path::Path) -> Result<Vec<String>, BoxError> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    let plots = plot::write(report, out)?;
    let mut md = report.markdown();
    for p in &plots {
        md.push_str(&format!("\n![{p}]({p})\n"));
    }
    std::fs::write(out.join("report.md"), md)?;
    Ok(plots)
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d %H:%M UTC")
        .to_string()
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    // Set by e2e/bench/run.sh; a bench started by hand reports how it was compiled itself.
    let build = match std::env::var("BENCH_PROFILE").as_deref() {
        Ok("release") => "release build",
        Ok("dev") => "debug build",
        _ if cfg!(debug_assertions) => "debug build",
        _ => "release build",
    };
    format!("{cores} cores, {mem_gib:.0} GiB, {build}")
}
