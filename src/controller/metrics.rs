//! Prometheus metrics of the operator (DESIGN §4), rendered in the text exposition format 0.0.4
//! for `/metrics`. Hand-rolled on atomics: a handful of counters, two histograms and gauges do not
//! need a metrics framework. Every name starts with `kandev_`.
//!
//! The process-wide instance is [`global`]; tests render their own [`Metrics`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use kube::runtime::reflector::Store;

use crate::api::{SessionState, TaskSession};

/// Content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets (seconds) of the ACP restore duration: `initialize` plus `session/resume` is sub-second,
/// a `session/load` that replays a long transcript can take a minute.
const RESTORE_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Buckets (seconds) of one reconcile; a reconcile that restores a session includes the restore.
const RECONCILE_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

/// How a resume request (the `kandev.dev/resume-requested-at` annotation) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeOutcome {
    /// The agent's own session came back (`session/resume` or `session/load`).
    Restored,
    /// The agent runs again in a new session (no token, a fresh start was asked for, or the
    /// agent rejected the token).
    Fresh,
    /// The restore or the launch failed.
    Failed,
    /// The rules refused the request (terminal state).
    Refused,
    /// The agent was already running: handled without a launch.
    AlreadyRunning,
    /// A newer request replaced it while it was being handled.
    Superseded,
}

impl ResumeOutcome {
    pub const ALL: [ResumeOutcome; 6] = [
        Self::Restored,
        Self::Fresh,
        Self::Failed,
        Self::Refused,
        Self::AlreadyRunning,
        Self::Superseded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restored => "restored",
            Self::Fresh => "fresh",
            Self::Failed => "failed",
            Self::Refused => "refused",
            Self::AlreadyRunning => "already_running",
            Self::Superseded => "superseded",
        }
    }
}

/// A Prometheus histogram with fixed buckets.
struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last entry is the `+Inf` overflow.
    buckets: Vec<AtomicU64>,
    /// Sum of the observations, as `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn observe(&self, seconds: f64) {
        let index = self
            .bounds
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(self.bounds.len());
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + seconds).to_bits())
            });
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// The operator's metrics.
pub struct Metrics {
    version: &'static str,
    reconciles_ok: AtomicU64,
    reconcile_errors: Mutex<BTreeMap<&'static str, u64>>,
    reconcile_duration: Histogram,
    resumes: [AtomicU64; ResumeOutcome::ALL.len()],
    agents_lost: AtomicU64,
    restore_duration: Histogram,
    leader: AtomicBool,
    /// The controller's TaskSession cache; set on the replica that runs the controller.
    sessions: Mutex<Vec<Store<TaskSession>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics that `/metrics` serves.
pub fn global() -> &'static Metrics {
    &GLOBAL
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            version: env!("CARGO_PKG_VERSION"),
            reconciles_ok: AtomicU64::new(0),
            reconcile_errors: Mutex::new(BTreeMap::new()),
            reconcile_duration: Histogram::new(RECONCILE_BUCKETS),
            resumes: std::array::from_fn(|_| AtomicU64::new(0)),
            agents_lost: AtomicU64::new(0),
            restore_duration: Histogram::new(RESTORE_BUCKETS),
            leader: AtomicBool::new(false),
            sessions: Mutex::new(Vec::new()),
        }
    }

    /// One reconcile finished: `error` is `Error::metric_label` of a failed one.
    pub fn reconciled(&self, error: Option<&'static str>, took: Duration) {
        match error {
            None => {
                self.reconciles_ok.fetch_add(1, Ordering::Relaxed);
            }
            Some(kind) => {
                if let Ok(mut errors) = self.reconcile_errors.lock() {
                    *errors.entry(kind).or_default() += 1;
                }
            }
        }
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    pub fn resume_handled(&self, outcome: ResumeOutcome) {
        let index = ResumeOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or_default();
        self.resumes[index].fetch_add(1, Ordering::Relaxed);
    }

    /// An agent pod of an active session was found lost (counted once per loss).
    pub fn agent_lost(&self) {
        self.agents_lost.fetch_add(1, Ordering::Relaxed);
    }

    /// Duration of one ACP restore over exec (`initialize` + resume/load/new), any outcome.
    pub fn restore_took(&self, took: Duration) {
        self.restore_duration.observe(took.as_secs_f64());
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.store(leading, Ordering::Relaxed);
    }

    /// Sessions by state are counted from this cache at scrape time.
    pub fn track_sessions(&self, store: Store<TaskSession>) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.push(store);
        }
    }

    /// The whole exposition, `# HELP` and `# TYPE` before each family.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        family(
            &mut out,
            "kandev_build_info",
            "gauge",
            "Build information of the running operator (always 1).",
        );
        let _ = writeln!(
            out,
            "kandev_build_info{{version=\"{}\"}} 1",
            escape(self.version)
        );

        family(
            &mut out,
            "kandev_leader",
            "gauge",
            "1 while this replica holds the leader lease and runs the controller, else 0.",
        );
        let _ = writeln!(
            out,
            "kandev_leader {}",
            u8::from(self.leader.load(Ordering::Relaxed))
        );

        family(
            &mut out,
            "kandev_reconciles_total",
            "counter",
            "TaskSession reconciles by result (ok or error).",
        );
        let errors: BTreeMap<&str, u64> = self
            .reconcile_errors
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "kandev_reconciles_total{{result=\"ok\"}} {}",
            self.reconciles_ok.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "kandev_reconciles_total{{result=\"error\"}} {}",
            errors.values().sum::<u64>()
        );

        family(
            &mut out,
            "kandev_reconcile_errors_total",
            "counter",
            "Failed TaskSession reconciles by error kind.",
        );
        for (kind, count) in &errors {
            let _ = writeln!(
                out,
                "kandev_reconcile_errors_total{{kind=\"{}\"}} {count}",
                escape(kind)
            );
        }

        family(
            &mut out,
            "kandev_reconcile_duration_seconds",
            "histogram",
            "Duration of one TaskSession reconcile.",
        );
        self.reconcile_duration
            .render(&mut out, "kandev_reconcile_duration_seconds");

        family(
            &mut out,
            "kandev_resume_requests_total",
            "counter",
            "Handled resume requests (kandev.dev/resume-requested-at tokens) by outcome.",
        );
        for (outcome, count) in ResumeOutcome::ALL.iter().zip(&self.resumes) {
            let _ = writeln!(
                out,
                "kandev_resume_requests_total{{outcome=\"{}\"}} {}",
                outcome.as_str(),
                count.load(Ordering::Relaxed)
            );
        }

        family(
            &mut out,
            "kandev_agents_lost_total",
            "counter",
            "Agent pods of active sessions found lost (nothing is relaunched until a resume is requested).",
        );
        let _ = writeln!(
            out,
            "kandev_agents_lost_total {}",
            self.agents_lost.load(Ordering::Relaxed)
        );

        family(
            &mut out,
            "kandev_acp_restore_duration_seconds",
            "histogram",
            "Duration of one ACP restore over exec (initialize, then session/resume, session/load or session/new).",
        );
        self.restore_duration
            .render(&mut out, "kandev_acp_restore_duration_seconds");

        let sessions = self
            .sessions
            .lock()
            .ok()
            .filter(|stores| !stores.is_empty())
            .map(|stores| stores.iter().flat_map(Store::state).collect::<Vec<_>>());
        if let Some(sessions) = sessions {
            let mut by_state: BTreeMap<&str, u64> =
                SessionState::ALL.iter().map(|s| (s.as_str(), 0)).collect();
            let mut needing_resume = 0;
            for ts in &sessions {
                let status = ts.status.clone().unwrap_or_default();
                *by_state.entry(status.state.as_str()).or_default() += 1;
                needing_resume += u64::from(status.needs_resume);
            }
            family(
                &mut out,
                "kandev_sessions",
                "gauge",
                "TaskSessions by status.state (reported by the replica that runs the controller).",
            );
            for state in SessionState::ALL {
                let _ = writeln!(
                    out,
                    "kandev_sessions{{state=\"{}\"}} {}",
                    state.as_str(),
                    by_state[state.as_str()]
                );
            }
            family(
                &mut out,
                "kandev_sessions_needing_resume",
                "gauge",
                "TaskSessions whose agent is gone and that wait for a resume request.",
            );
            let _ = writeln!(out, "kandev_sessions_needing_resume {needing_resume}");
        }
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Label value escaping of the text format: backslash, double quote, newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;

    /// Every sample line belongs to the family announced by the last `# TYPE` line, and every
    /// family has exactly one HELP and one TYPE line.
    fn assert_well_formed(text: &str) {
        let mut current: Option<(String, String)> = None;
        let mut seen = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().expect("name");
                assert!(seen.insert(name.to_string()), "HELP twice for {name}");
                assert!(name.starts_with("kandev_"), "{name}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let name = parts.next().expect("name").to_string();
                let kind = parts.next().expect("kind").to_string();
                assert!(
                    ["counter", "gauge", "histogram"].contains(&kind.as_str()),
                    "{line}"
                );
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "counter {name} ends in _total");
                }
                current = Some((name, kind));
                continue;
            }
            let (family, kind) = current.clone().expect("a sample after a TYPE line");
            let sample = line.split(['{', ' ']).next().expect("sample name");
            let ok = match kind.as_str() {
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| sample == format!("{family}{suffix}")),
                _ => sample == family,
            };
            assert!(ok, "sample {sample} outside its family {family}");
            let value = line.rsplit(' ').next().expect("value");
            assert!(value.parse::<f64>().is_ok(), "{line}: value {value}");
        }
    }

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let metrics = Metrics::new();
        metrics.reconciled(None, Duration::from_millis(3));
        metrics.reconciled(None, Duration::from_millis(70));
        metrics.reconciled(Some("kube"), Duration::from_millis(2));
        metrics.resume_handled(ResumeOutcome::Restored);
        metrics.resume_handled(ResumeOutcome::Restored);
        metrics.resume_handled(ResumeOutcome::Refused);
        metrics.agent_lost();
        metrics.restore_took(Duration::from_millis(300));
        metrics.restore_took(Duration::from_secs(500));
        metrics.set_leader(true);
        let text = metrics.render();
        assert_well_formed(&text);
        for expected in [
            "# TYPE kandev_build_info gauge",
            &format!(
                "kandev_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
            "kandev_leader 1",
            "kandev_reconciles_total{result=\"ok\"} 2",
            "kandev_reconciles_total{result=\"error\"} 1",
            "kandev_reconcile_errors_total{kind=\"kube\"} 1",
            "kandev_reconcile_duration_seconds_bucket{le=\"0.005\"} 2",
            "kandev_reconcile_duration_seconds_bucket{le=\"0.1\"} 3",
            "kandev_reconcile_duration_seconds_count 3",
            "kandev_resume_requests_total{outcome=\"restored\"} 2",
            "kandev_resume_requests_total{outcome=\"fresh\"} 0",
            "kandev_resume_requests_total{outcome=\"failed\"} 0",
            "kandev_resume_requests_total{outcome=\"refused\"} 1",
            "kandev_resume_requests_total{outcome=\"already_running\"} 0",
            "kandev_agents_lost_total 1",
            "# TYPE kandev_acp_restore_duration_seconds histogram",
            "kandev_acp_restore_duration_seconds_bucket{le=\"0.25\"} 0",
            "kandev_acp_restore_duration_seconds_bucket{le=\"0.5\"} 1",
            "kandev_acp_restore_duration_seconds_bucket{le=\"120\"} 1",
            "kandev_acp_restore_duration_seconds_bucket{le=\"+Inf\"} 2",
            "kandev_acp_restore_duration_seconds_sum 500.3",
            "kandev_acp_restore_duration_seconds_count 2",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "missing {expected:?} in\n{text}"
            );
        }
        // No controller on this replica: no session gauges.
        assert!(!text.contains("kandev_sessions"), "{text}");
    }

    #[test]
    fn counts_sessions_by_state_from_the_cache() {
        let metrics = Metrics::new();
        let mut writer: Writer<TaskSession> = Writer::default();
        metrics.track_sessions(writer.as_reader());
        let session = |name: &str, state: &str, needs_resume: bool| -> TaskSession {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kandev.dev/v1alpha1",
                "kind": "TaskSession",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"taskId": "t", "agent": "claude-code", "workspace": {"claimName": "w"}},
                "status": {"state": state, "needsResume": needs_resume},
            }))
            .expect("session")
        };
        for ts in [
            session("a", "RUNNING", false),
            session("b", "WAITING_FOR_INPUT", true),
            session("c", "WAITING_FOR_INPUT", false),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(ts));
        }
        let text = metrics.render();
        assert_well_formed(&text);
        for expected in [
            "kandev_sessions{state=\"RUNNING\"} 1",
            "kandev_sessions{state=\"WAITING_FOR_INPUT\"} 2",
            "kandev_sessions{state=\"FAILED\"} 0",
            "kandev_sessions_needing_resume 1",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "missing {expected:?} in\n{text}"
            );
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
