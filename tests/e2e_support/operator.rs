//! The operator binary as a local child process of a test, against the cluster of $KUBECONFIG:
//! its log (stdout and stderr) goes to `target/e2e-logs/<prefix>-<unique>.log`, its HTTP
//! endpoints (`/metrics`) listen on a free loopback port.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{WAIT, free_port, logs_dir, poll, repo_path, spawn_logged, unique};

/// Reconcile period of a test operator unless a test sets another.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(2);

/// The env variable of the operator's fault points (it exits with code 3 after that step).
const FAULT_ENV: &str = "KANDEV_FAULT_EXIT_AFTER";

/// The counter of finished reconciles in the operator's `/metrics` (registered as
/// `kandev_reconciles` in src/controller/metrics.rs, one series per `result`: ok, error).
pub const RECONCILES: &str = "kandev_reconciles_total";

/// A running operator process, killed when dropped.
pub struct Operator {
    child: tokio::process::Child,
    log: PathBuf,
    /// `--http-address`: where `/metrics` is served.
    http: String,
}

/// How to start an [`Operator`]; `Operator::builder()` gives one without agent profiles, with
/// [`DEFAULT_RESYNC`], no fault point and no leader election.
pub struct OperatorBuilder {
    log_prefix: String,
    profiles: Option<Profiles>,
    resync: Duration,
    fault: Option<String>,
    lease: Option<Lease>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    kubeconfig: Option<PathBuf>,
}

/// Where `--agent-profiles` comes from.
enum Profiles {
    /// Written by the test into `target/e2e-logs/<file>`.
    Written { file: String, yaml: String },
    /// A file of the repository, passed as it is.
    Repo(PathBuf),
}

struct Lease {
    name: String,
    namespace: String,
    identity: String,
}

impl Operator {
    pub fn builder() -> OperatorBuilder {
        OperatorBuilder {
            log_prefix: "operator".to_string(),
            profiles: None,
            resync: DEFAULT_RESYNC,
            fault: None,
            lease: None,
            args: Vec::new(),
            env: Vec::new(),
            kubeconfig: None,
        }
    }

    /// The file the operator logs to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Sends SIGTERM (a rollout, a node drain) and waits for the operator to exit, returning its
    /// exit code.
    #[allow(unsafe_code)]
    pub async fn terminate(&mut self, within: Duration) -> Option<i32> {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        self.exited(within).await
    }

    /// The process's peak resident memory so far (`VmHWM`), in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        let pid = self.child.id().expect("the operator runs");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM");
        kib / 1024.0
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the operator to exit on its own (a fault point), returning its exit code.
    pub async fn exited(&mut self, within: Duration) -> Option<i32> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => panic!(
                "operator did not exit within {within:?}; log {}",
                self.log.display()
            ),
        }
    }

    /// How many reconciles this operator has finished: `kandev_reconciles_total` of its
    /// `/metrics`, summed over `result` (ok and error). Waits up to 10 s for the endpoint (it
    /// listens a moment after the start), then fails the test.
    pub async fn reconciles(&self) -> u64 {
        self.metric(RECONCILES).await
    }

    /// The sum of `metric`'s samples in the operator's `/metrics` (waits up to 10 s for it).
    pub async fn metric(&self, metric: &str) -> u64 {
        poll(
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || match self.metrics().await {
                Ok(text) => Ok(sum_of(&text, metric)),
                Err(e) => Err(format!(
                    "no /metrics from the operator at {}: {e}; log {}",
                    self.http,
                    self.log.display()
                )),
            },
        )
        .await
    }

    /// Waits until the operator has finished `more` reconciles since this call; fails the test
    /// after [`WAIT`]. Use it where a test shows that something did NOT happen after a change
    /// (instead of sleeping a few resync periods).
    ///
    /// What the growth proves: the controller never reconciles one object twice at once, and
    /// every reconcile ends in a requeue (a resync period at the latest) while the change's own
    /// watch event triggers one too. So of `more` reconciles counted after the call, at most one
    /// began before it (with the cache as it was before the change): with `more >= 2`, at least
    /// `more - 1` looks at the state the test made. That holds for one object; the counter is the
    /// operator's, over every session it sees, so it proves looks at the test's session when
    /// that session is the only one there is (a fresh namespace per test, one test at a time;
    /// another session only makes the count grow sooner, never later).
    pub async fn await_reconciles(&self, more: u64) {
        let from = self.reconciles().await;
        poll(WAIT, Duration::from_millis(100), async || {
            let now = self.reconciles().await;
            if now >= from + more {
                return Ok(());
            }
            Err(format!(
                "the operator finished {} reconciles in {WAIT:?}, not {more}; log {}",
                now.saturating_sub(from),
                self.log.display()
            ))
        })
        .await
    }

    /// The body of `GET /metrics` (HTTP/1.0: not chunked, ends with the connection).
    async fn metrics(&self) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(&self.http).await?;
        let head = format!("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.http);
        stream.write_all(head.as_bytes()).await?;
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
            .await
            .map_err(|_| std::io::Error::other("no answer within 10s"))??;
        match answer.split_once("\r\n\r\n") {
            Some((head, body))
                if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") =>
            {
                Ok(body.to_string())
            }
            _ => Err(std::io::Error::other(format!("GET /metrics: {answer}"))),
        }
    }
}

/// The sum of the samples of `metric` (every label set) in an OpenMetrics text.
pub fn sum_of(text: &str, metric: &str) -> u64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(metric)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once('}')?.1,
                None => rest,
            };
            // "<value>" or "<value> <timestamp>"; a counter's value may be written as a float.
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .map(|v| v as u64)
        .sum()
}

impl OperatorBuilder {
    /// The log file's name starts with `prefix` ("operator" unless set).
    pub fn log_prefix(mut self, prefix: &str) -> Self {
        self.log_prefix = prefix.to_string();
        self
    }

    /// Agent profiles besides the built-in ones: `yaml` is written to `target/e2e-logs/<file>`
    /// and passed with `--agent-profiles` (for profiles a test generates).
    pub fn profiles(mut self, file: &str, yaml: &str) -> Self {
        self.profiles = Some(Profiles::Written {
            file: file.to_string(),
            yaml: yaml.to_string(),
        });
        self
    }

    /// Agent profiles besides the built-in ones from `tests/data/profiles/<name>.yaml`, passed
    /// with `--agent-profiles` as it is (tests/data/README.md says which test uses which).
    pub fn profiles_file(mut self, name: &str) -> Self {
        let path = repo_path(&format!("tests/data/profiles/{name}.yaml"));
        assert!(path.is_file(), "no profiles file {}", path.display());
        self.profiles = Some(Profiles::Repo(path));
        self
    }

    /// `--resync-seconds` (whole seconds).
    pub fn resync(mut self, period: Duration) -> Self {
        self.resync = period;
        self
    }

    /// More command-line arguments of `kandev-operator run`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// An environment variable of the operator process (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Talks to the API server through `kubeconfig` instead of $KUBECONFIG (a fault proxy).
    pub fn kubeconfig(mut self, kubeconfig: &Path) -> Self {
        self.kubeconfig = Some(kubeconfig.to_path_buf());
        self
    }

    /// Sets the fault point: the operator exits with code 3 right after `step`.
    pub fn fault(mut self, step: &str) -> Self {
        self.fault = Some(step.to_string());
        self
    }

    /// One replica electing a leader on Lease `lease` in `namespace` as `identity` (its
    /// POD_NAME); without this the operator runs with `--no-leader-election`.
    pub fn leader_election(mut self, lease: &str, namespace: &str, identity: &str) -> Self {
        self.lease = Some(Lease {
            name: lease.to_string(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
        });
        self
    }

    pub fn start(self) -> Operator {
        let dir = logs_dir();
        let profiles = self.profiles.as_ref().map(|profiles| match profiles {
            Profiles::Written { file, yaml } => {
                // Replaced atomically: another operator may be reading the same file right now.
                let path = dir.join(file);
                let tmp = dir.join(format!("{}.tmp", unique(file)));
                std::fs::write(&tmp, yaml).expect("profiles file");
                std::fs::rename(&tmp, &path).expect("profiles file");
                path
            }
            Profiles::Repo(path) => path.clone(),
        });
        let log = dir.join(format!("{}.log", unique(&self.log_prefix)));
        let http = format!("127.0.0.1:{}", free_port());
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kandev-operator"));
        cmd.args(["run", "--acp-timeout-seconds", "30"])
            .args(["--resync-seconds", &self.resync.as_secs().to_string()])
            .args(["--agentctl-image", "kandev.dev/agentctl:e2e"])
            .args(["--http-address", &http]);
        if let Some(profiles) = &profiles {
            cmd.arg("--agent-profiles").arg(profiles);
        }
        cmd.args(&self.args);
        cmd.env("RUST_LOG", "info,kandev_operator=debug")
            .env_remove(FAULT_ENV);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(step) = &self.fault {
            cmd.env(FAULT_ENV, step);
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        match &self.lease {
            Some(lease) => {
                cmd.args(["--lease-name", &lease.name])
                    .args(["--lease-namespace", &lease.namespace])
                    .env("POD_NAME", &lease.identity);
            }
            None => {
                cmd.arg("--no-leader-election");
            }
        }
        let child = spawn_logged(&mut cmd, &log, "this crate's binary");
        eprintln!("operator log: {}", log.display());
        Operator { child, log, http }
    }
}
