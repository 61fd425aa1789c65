//! Prometheus metrics of the operator (DESIGN §4), served on `/metrics` in the OpenMetrics text
//! format by `prometheus-client`. Histograms carry the trace id of the reconcile that observed
//! them as an exemplar while traces are exported. Every name starts with `kandev_`.
//!
//! The process-wide instance is [`global`]; tests render their own [`Metrics`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::acp::budget::MemoryBudget;
use prometheus_client::registry::Registry;

use crate::api::conditions;
use crate::api::{
    PermissionOutcome, RESUME_ANNOTATION, SessionState, TaskSession, TaskSessionStatus, ToolKind,
};
use crate::resume::{Unrest, unrest};

/// How often the watchdog of `kandev_sessions_overdue` looks at the sessions.
pub const WATCHDOG_EVERY: Duration = Duration::from_secs(5);

/// Content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Buckets (seconds) of the ACP restore duration: `initialize` plus `session/resume` is sub-second,
/// a `session/load` that replays a long transcript can take a minute.
const RESTORE_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Buckets (seconds) of one reconcile; a reconcile that restores a session includes the restore.
const RECONCILE_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

pub use crate::resume::ResumeOutcome;

impl ResumeOutcome {
    pub const ALL: [ResumeOutcome; 7] = [
        Self::Restored,
        Self::Fresh,
        Self::Failed,
        Self::Refused,
        Self::AlreadyRunning,
        Self::Superseded,
        Self::Joined,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restored => "restored",
            Self::Fresh => "fresh",
            Self::Failed => "failed",
            Self::Refused => "refused",
            Self::AlreadyRunning => "already_running",
            Self::Superseded => "superseded",
            Self::Joined => "joined",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PermissionLabel {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The exemplar of a histogram observation: the trace it belongs to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TraceLabel {
    trace_id: String,
}

type Histogram = HistogramWithExemplars<TraceLabel>;

fn observe(histogram: &Histogram, took: Duration) {
    let exemplar = crate::telemetry::current_trace_id().map(|trace_id| TraceLabel { trace_id });
    histogram.observe(took.as_secs_f64(), exemplar, None);
}

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_errors: Family<KindLabel, Counter>,
    reconcile_duration: Histogram,
    resumes: Family<OutcomeLabel, Counter>,
    permissions: Family<PermissionLabel, Counter>,
    agents_lost: Counter,
    restore_duration: Histogram,
    leader: Gauge,
    sessions: SessionGauges,
    acp_memory: AcpMemoryGauges,
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
        let mut registry = Registry::default();
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "kandev_build_info",
            "Build information of the running operator (always 1)",
            build_info,
        );
        let leader = Gauge::default();
        registry.register(
            "kandev_leader",
            "1 while this replica holds the leader lease and runs the controller, else 0",
            leader.clone(),
        );
        // Counters: the exposition adds `_total` to the registered name.
        let reconciles = Family::<ResultLabel, Counter>::default();
        for result in ["ok", "error"] {
            let _ = reconciles.get_or_create(&ResultLabel { result });
        }
        registry.register(
            "kandev_reconciles",
            "TaskSession reconciles by result (ok or error)",
            reconciles.clone(),
        );
        let reconcile_errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "kandev_reconcile_errors",
            "Failed TaskSession reconciles by error kind",
            reconcile_errors.clone(),
        );
        let reconcile_duration = Histogram::new(RECONCILE_BUCKETS.iter().copied());
        registry.register(
            "kandev_reconcile_duration_seconds",
            "Duration of one TaskSession reconcile",
            reconcile_duration.clone(),
        );
        let resumes = Family::<OutcomeLabel, Counter>::default();
        for outcome in ResumeOutcome::ALL {
            let _ = resumes.get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            });
        }
        registry.register(
            "kandev_resume_requests",
            "Handled resume requests (kandev.dev/resume-requested-at tokens) by outcome",
            resumes.clone(),
        );
        let permissions = Family::<PermissionLabel, Counter>::default();
        registry.register(
            "kandev_permission_requests",
            "The agents' permission requests by tool kind and outcome (allowedByPolicy, deniedByPolicy, approved, rejected, timedOut, gone, overflow), as read from agentctl's journal",
            permissions.clone(),
        );
        let agents_lost = Counter::default();
        registry.register(
            "kandev_agents_lost",
            "Agent pods of active sessions found lost (nothing is relaunched until a resume is requested)",
            agents_lost.clone(),
        );
        let restore_duration = Histogram::new(RESTORE_BUCKETS.iter().copied());
        registry.register(
            "kandev_acp_restore_duration_seconds",
            "Duration of one ACP restore over exec (initialize, then session/resume, session/load or session/new)",
            restore_duration.clone(),
        );
        let sessions = SessionGauges::default();
        registry.register_collector(Box::new(sessions.clone()));
        let acp_memory = AcpMemoryGauges::default();
        registry.register_collector(Box::new(acp_memory.clone()));
        Metrics {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            resumes,
            permissions,
            agents_lost,
            restore_duration,
            leader,
            sessions,
            acp_memory,
        }
    }

    /// One reconcile finished: `error` is `Error::metric_label` of a failed one.
    pub fn reconciled(&self, error: Option<&'static str>, took: Duration) {
        let result = match error {
            None => "ok",
            Some(kind) => {
                self.reconcile_errors
                    .get_or_create(&KindLabel { kind })
                    .inc();
                "error"
            }
        };
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        observe(&self.reconcile_duration, took);
    }

    pub fn resume_handled(&self, outcome: ResumeOutcome) {
        self.resumes
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// A permission request of `kind` ended with `outcome`.
    pub fn permission_resolved(&self, kind: ToolKind, outcome: PermissionOutcome) {
        self.permissions
            .get_or_create(&PermissionLabel {
                kind: kind.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// An agent pod of an active session was found lost (counted once per loss).
    pub fn agent_lost(&self) {
        self.agents_lost.inc();
    }

    /// Duration of one ACP restore over exec (`initialize` + resume/load/new), any outcome.
    pub fn restore_took(&self, took: Duration) {
        observe(&self.restore_duration, took);
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Starts the watchdog of `kandev_sessions_overdue` (once per process): every
    /// [`WATCHDOG_EVERY`] it looks at the tracked sessions; one that has not been at rest,
    /// doing the same thing, for longer than its `deadlines` allow counts as overdue.
    pub fn start_watchdog(&'static self, deadlines: Deadlines) {
        {
            let Ok(mut watchdog) = self.sessions.watchdog.lock() else {
                return;
            };
            if watchdog.deadlines.is_some() {
                return;
            }
            watchdog.deadlines = Some(deadlines);
        }
        tokio::spawn(async move {
            let mut every = tokio::time::interval(WATCHDOG_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let sessions = self.sessions.tracked().unwrap_or_default();
                if let Ok(mut watchdog) = self.sessions.watchdog.lock() {
                    watchdog.look(&sessions, Instant::now());
                }
            }
        });
    }

    /// Sessions by state are counted from this cache at scrape time.
    pub fn track_sessions(&self, store: Store<TaskSession>) {
        if let Ok(mut stores) = self.sessions.stores.lock() {
            stores.push(store);
        }
    }

    /// Reports `budget` as `kandev_acp_memory_budget_bytes` and `…_reserved_bytes`.
    pub fn track_acp_memory(&self, budget: MemoryBudget) {
        if let Ok(mut tracked) = self.acp_memory.budget.lock() {
            *tracked = Some(budget);
        }
    }

    /// The whole exposition (OpenMetrics text, ending in `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `kandev_sessions{state}`, `kandev_sessions_needing_resume`,
/// `kandev_sessions_needing_resume_oldest_seconds` and `kandev_sessions_stalled{reason}`, counted
/// from the controller's TaskSession cache at scrape time; absent on a replica that does not run
/// the controller.
#[derive(Clone, Default)]
struct SessionGauges {
    stores: Arc<Mutex<Vec<Store<TaskSession>>>>,
    /// The watchdog of `kandev_sessions_overdue`: which sessions are not at rest and since when.
    watchdog: Arc<Mutex<Watchdog>>,
}

/// Sessions that are not at rest ([`crate::resume::at_rest`]), each with what it is doing (its
/// state, latched and annotated tokens and `spec.end`) and since when this operator has seen
/// it doing that. Kept by a clock of its own ([`Metrics::start_watchdog`]), not by the
/// reconciler: it sees a session the reconciler has stopped looking at.
#[derive(Debug, Default)]
struct Watchdog {
    /// How long a session may go on doing the same thing; `None`: no watchdog runs.
    deadlines: Option<Deadlines>,
    /// By session UID: what it does, and since when.
    unsettled: HashMap<String, (Unrest, String, Instant)>,
}

/// How long a session that is not at rest may go on doing the same thing, by the operator's own
/// deadlines ([`crate::controller::OperatorSettings::deadlines`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    pub requested: Duration,
    pub launching: Duration,
    pub ending: Duration,
}

impl Deadlines {
    fn of(&self, doing: Unrest) -> Duration {
        match doing {
            Unrest::Requested => self.requested,
            Unrest::Launching => self.launching,
            Unrest::Ending => self.ending,
        }
    }
}

impl Watchdog {
    /// Looks at `sessions` at `now`: a session not at rest keeps its clock while it goes on
    /// doing the same thing, and starts a new one when that changes; a session at rest, gone,
    /// or `Stalled=True` (already reported, with its reason) is forgotten.
    fn look(&mut self, sessions: &[Arc<TaskSession>], now: Instant) {
        let mut seen = HashMap::with_capacity(self.unsettled.len());
        let no_status = TaskSessionStatus::default();
        for ts in sessions {
            // Borrowed, not cloned: this runs over every session every few seconds.
            let status = ts.status.as_ref().unwrap_or(&no_status);
            let Some(kind) = unrest(ts, status) else {
                continue;
            };
            if conditions::is_true(&status.conditions, conditions::STALLED) {
                continue;
            }
            let uid = ts.metadata.uid.clone().unwrap_or_default();
            let doing = format!(
                "{}|{:?}|{:?}|{:?}",
                status.state,
                status.active_resume_request,
                ts.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(RESUME_ANNOTATION)),
                ts.spec.end
            );
            let since = match self.unsettled.remove(&uid) {
                Some((_, was, since)) if was == doing => since,
                _ => now,
            };
            seen.insert(uid, (kind, doing, since));
        }
        self.unsettled = seen;
    }

    /// Sessions that have not been at rest, doing the same thing, for longer than allowed.
    fn overdue(&self, now: Instant) -> i64 {
        let Some(deadlines) = self.deadlines else {
            return 0;
        };
        let count = self
            .unsettled
            .values()
            .filter(|(kind, _, since)| now.saturating_duration_since(*since) > deadlines.of(*kind))
            .count();
        i64::try_from(count).unwrap_or(i64::MAX)
    }
}

impl std::fmt::Debug for SessionGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionGauges")
    }
}

/// What the session gauges report, counted from a list of sessions at one instant (pure).
#[derive(Debug, Default, PartialEq)]
struct SessionSummary {
    /// Every [`SessionState`], with 0 for the states no session is in.
    by_state: BTreeMap<&'static str, i64>,
    needing_resume: i64,
    /// Age of the oldest `NeedsResume=True` condition (seconds), 0 when none.
    oldest_needing_resume_seconds: f64,
    /// Sessions not in a terminal state whose launch stalled (`Stalled=True`), by reason.
    stalled: BTreeMap<String, i64>,
    /// Permission requests that wait for a person, over all sessions.
    pending_permissions: i64,
}

fn summarize(sessions: &[Arc<TaskSession>], now: jiff::Timestamp) -> SessionSummary {
    let mut summary = SessionSummary {
        by_state: SessionState::ALL.iter().map(|s| (s.as_str(), 0)).collect(),
        ..SessionSummary::default()
    };
    for ts in sessions {
        let Some(status) = ts.status.as_ref() else {
            *summary
                .by_state
                .entry(SessionState::default().as_str())
                .or_default() += 1;
            continue;
        };
        *summary.by_state.entry(status.state.as_str()).or_default() += 1;
        summary.pending_permissions += status.pending_permissions.len() as i64;
        if status.needs_resume {
            summary.needing_resume += 1;
            if let Some(since) = conditions::find(&status.conditions, conditions::NEEDS_RESUME)
                .filter(|c| c.status == "True")
                .map(|c| c.last_transition_time.0)
            {
                let age = now.duration_since(since).as_secs_f64().max(0.0);
                if age > summary.oldest_needing_resume_seconds {
                    summary.oldest_needing_resume_seconds = age;
                }
            }
        }
        if !status.state.is_terminal()
            && let Some(stall) = conditions::find(&status.conditions, conditions::STALLED)
                .filter(|c| c.status == "True")
        {
            *summary.stalled.entry(stall.reason.clone()).or_default() += 1;
        }
    }
    summary
}

impl SessionGauges {
    /// Every tracked session; `None` on a replica that does not run the controller.
    fn tracked(&self) -> Option<Vec<Arc<TaskSession>>> {
        match self.stores.lock() {
            Ok(stores) if !stores.is_empty() => {
                Some(stores.iter().flat_map(Store::state).collect())
            }
            _ => None,
        }
    }
}

impl prometheus_client::collector::Collector for SessionGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sessions) = self.tracked() else {
            return Ok(());
        };
        let summary = summarize(&sessions, jiff::Timestamp::now());
        let overdue = match self.watchdog.lock() {
            Ok(mut watchdog) => {
                let now = Instant::now();
                watchdog.look(&sessions, now);
                watchdog.overdue(now)
            }
            Err(_) => 0,
        };
        let family = Family::<StateLabel, Gauge>::default();
        for (state, count) in &summary.by_state {
            family.get_or_create(&StateLabel { state }).set(*count);
        }
        encode_gauge(
            &mut encoder,
            "kandev_sessions",
            "TaskSessions by status.state (reported by the replica that runs the controller)",
            &family,
        )?;
        let needing = Gauge::<i64>::default();
        needing.set(summary.needing_resume);
        encode_gauge(
            &mut encoder,
            "kandev_sessions_needing_resume",
            "TaskSessions whose agent is gone and that wait for a resume request",
            &needing,
        )?;
        let oldest = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        oldest.set(summary.oldest_needing_resume_seconds);
        encode_gauge(
            &mut encoder,
            "kandev_sessions_needing_resume_oldest_seconds",
            "How long the session that has needed a resume the longest has waited (NeedsResume's lastTransitionTime), 0 when none does",
            &oldest,
        )?;
        let stalled = Family::<ReasonLabel, Gauge>::default();
        for (reason, count) in summary.stalled {
            stalled.get_or_create(&ReasonLabel { reason }).set(count);
        }
        let pending = Gauge::<i64>::default();
        pending.set(summary.pending_permissions);
        encode_gauge(
            &mut encoder,
            "kandev_permissions_pending",
            "The agents' permission requests that wait for a person's answer (status.pendingPermissions), over all sessions",
            &pending,
        )?;
        let overdue_gauge = Gauge::<i64>::default();
        overdue_gauge.set(overdue);
        encode_gauge(
            &mut encoder,
            "kandev_sessions_overdue",
            "TaskSessions that have not been at rest (launching, a resume request latched or unanswered, spec.end not carried out), doing the same thing, for longer than the operator's own deadlines allow, and that are not Stalled: 0 unless a session is stuck",
            &overdue_gauge,
        )?;
        encode_gauge(
            &mut encoder,
            "kandev_sessions_stalled",
            "Active TaskSessions whose launch stalled (Stalled=True: image pull, scheduling, agentctl unreachable, invalid spec, …), by the condition's reason",
            &stalled,
        )
    }
}

/// The ACP connections' memory budget ([`crate::acp::budget`]): its size and what restores hold
/// of it now, read at scrape time.
#[derive(Clone, Debug, Default)]
struct AcpMemoryGauges {
    budget: Arc<Mutex<Option<MemoryBudget>>>,
}

impl prometheus_client::collector::Collector for AcpMemoryGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(budget) = self.budget.lock().ok().and_then(|b| b.clone()) else {
            return Ok(());
        };
        let gauge = |bytes: u64| {
            let gauge = Gauge::<i64>::default();
            gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
            gauge
        };
        encode_gauge(
            &mut encoder,
            "kandev_acp_memory_budget_bytes",
            "Memory all ACP restores together may hold for their lines (--acp-memory-budget-mib, or half of the container's limit)",
            &gauge(budget.total()),
        )?;
        encode_gauge(
            &mut encoder,
            "kandev_acp_memory_reserved_bytes",
            "Memory of the budget that running restores hold now; at the budget, the next restore waits",
            &gauge(budget.reserved()),
        )?;
        let waits = Counter::<u64>::default();
        waits.inc_by(budget.waits());
        waits.encode(encoder.encode_descriptor(
            "kandev_acp_memory_waits",
            "Restores (or their session/load) that waited for room in the memory budget",
            None,
            MetricType::Counter,
        )?)
    }
}

/// Announces one gauge (or family of gauges) and encodes its samples.
fn encode_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    gauge: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;

    /// OpenMetrics: every sample belongs to the family announced by the last `# TYPE` line,
    /// every family has one HELP and one TYPE line, and the text ends in `# EOF`.
    fn assert_well_formed(text: &str) {
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut current: Option<(String, String)> = None;
        let mut seen = std::collections::HashSet::new();
        for line in text.lines().filter(|l| *l != "# EOF") {
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
                current = Some((name, kind));
                continue;
            }
            let (family, kind) = current.clone().expect("a sample after a TYPE line");
            let sample = line.split(['{', ' ']).next().expect("sample name");
            let suffixes: &[&str] = match kind.as_str() {
                "histogram" => &["_bucket", "_sum", "_count"],
                "counter" => &["_total"],
                _ => &[""],
            };
            assert!(
                suffixes.iter().any(|s| sample == format!("{family}{s}")),
                "sample {sample} outside its family {family}"
            );
            let sample = line.split(" # ").next().expect("sample");
            let value = sample.rsplit(' ').next().expect("value");
            assert!(value.parse::<f64>().is_ok(), "{line}: value {value}");
        }
    }

    fn has_line(text: &str, expected: &str) -> bool {
        text.lines()
            .any(|l| l == expected || l.starts_with(&format!("{expected} # ")))
    }

    #[tokio::test]
    async fn the_acp_memory_budget_is_reported() {
        let metrics = Metrics::new();
        assert!(
            !metrics.render().contains("kandev_acp_memory"),
            "absent until tracked"
        );
        let budget = MemoryBudget::new(64 << 20);
        metrics.track_acp_memory(budget.clone());
        let _held = budget.reserve(16 << 20).await;
        let text = metrics.render();
        assert_well_formed(&text);
        assert!(
            text.contains("\nkandev_acp_memory_budget_bytes 67108864\n"),
            "{text}"
        );
        assert!(
            text.contains("\nkandev_acp_memory_reserved_bytes 16777216\n"),
            "{text}"
        );
        assert!(
            text.contains("\nkandev_acp_memory_waits_total 0\n"),
            "{text}"
        );
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
        metrics.permission_resolved(ToolKind::Execute, PermissionOutcome::Approved);
        metrics.permission_resolved(ToolKind::Execute, PermissionOutcome::Approved);
        metrics.permission_resolved(ToolKind::Edit, PermissionOutcome::AllowedByPolicy);
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
            "# TYPE kandev_permission_requests counter",
            "kandev_permission_requests_total{kind=\"execute\",outcome=\"approved\"} 2",
            "kandev_permission_requests_total{kind=\"edit\",outcome=\"allowedByPolicy\"} 1",
            "# TYPE kandev_reconciles counter",
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
            "kandev_resume_requests_total{outcome=\"superseded\"} 0",
            "kandev_agents_lost_total 1",
            "# TYPE kandev_acp_restore_duration_seconds histogram",
            "kandev_acp_restore_duration_seconds_bucket{le=\"0.25\"} 0",
            "kandev_acp_restore_duration_seconds_bucket{le=\"0.5\"} 1",
            "kandev_acp_restore_duration_seconds_bucket{le=\"120.0\"} 1",
            "kandev_acp_restore_duration_seconds_bucket{le=\"+Inf\"} 2",
            "kandev_acp_restore_duration_seconds_sum 500.3",
            "kandev_acp_restore_duration_seconds_count 2",
        ] {
            assert!(has_line(&text, expected), "missing {expected:?} in\n{text}");
        }
        // No trace: no exemplar. No controller on this replica: no session gauges.
        assert!(!text.contains("trace_id"), "{text}");
        assert!(!text.contains("kandev_sessions"), "{text}");
    }

    // Exemplars with a trace: tests/trace_context.rs.

    /// A session in `state`, with `(type, status, reason, lastTransitionTime)` conditions.
    /// A session whose only condition is `Stalled`, set at the same time for every one.
    fn stalled(
        name: &str,
        state: &str,
        needs_resume: bool,
        status: &str,
        reason: &str,
    ) -> Arc<TaskSession> {
        let condition = ("Stalled", status, reason, "2026-01-01T11:00:00Z");
        session_with(name, state, needs_resume, &[condition])
    }

    fn session_with(
        name: &str,
        state: &str,
        needs_resume: bool,
        conditions: &[(&str, &str, &str, &str)],
    ) -> Arc<TaskSession> {
        let conditions: Vec<serde_json::Value> = conditions
            .iter()
            .map(|(type_, status, reason, at)| {
                serde_json::json!({"type": type_, "status": status, "reason": reason,
                                   "message": "", "lastTransitionTime": at})
            })
            .collect();
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kandev.dev/v1alpha1",
                "kind": "TaskSession",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"taskId": "t", "agent": "claude-code", "workspace": {"claimName": "w"}},
                "status": {"state": state, "needsResume": needs_resume, "conditions": conditions},
            }))
            .expect("session"),
        )
    }

    /// `kandev_permissions_pending` counts what waits over all sessions.
    #[test]
    fn pending_permissions_are_summed_over_the_sessions() {
        let pending = |ids: &[&str]| -> Vec<serde_json::Value> {
            ids.iter()
                .map(|id| {
                    serde_json::json!({"id": id, "toolKind": "execute", "title": "make",
                    "options": [], "requestedAt": "T"})
                })
                .collect()
        };
        let sessions: Vec<Arc<TaskSession>> = [vec!["a-1", "a-2"], vec![], vec!["c-1"]]
            .iter()
            .enumerate()
            .map(|(i, ids)| {
                let mut ts = (*session_with(&format!("s{i}"), "RUNNING", false, &[])).clone();
                if let Some(status) = ts.status.as_mut() {
                    status.pending_permissions =
                        serde_json::from_value(serde_json::Value::Array(pending(ids)))
                            .expect("pending");
                }
                Arc::new(ts)
            })
            .collect();
        let now: jiff::Timestamp = "2026-01-01T12:00:00Z".parse().expect("time");
        assert_eq!(summarize(&sessions, now).pending_permissions, 3);
    }

    #[test]
    fn summary_of_needing_resume_and_stalled_sessions() {
        let now: jiff::Timestamp = "2026-01-01T12:00:00Z".parse().expect("time");
        // (what, sessions, needing resume, oldest seconds, stalled by reason)
        type Row = (
            &'static str,
            Vec<Arc<TaskSession>>,
            i64,
            f64,
            Vec<(&'static str, i64)>,
        );
        let rows: Vec<Row> = vec![
            ("none", vec![], 0, 0.0, vec![]),
            (
                "the oldest NeedsResume=True counts, not a False one",
                vec![
                    session_with(
                        "a",
                        "WAITING_FOR_INPUT",
                        true,
                        &[("NeedsResume", "True", "AgentLost", "2026-01-01T11:00:00Z")],
                    ),
                    session_with(
                        "b",
                        "WAITING_FOR_INPUT",
                        true,
                        &[("NeedsResume", "True", "AgentLost", "2026-01-01T09:00:00Z")],
                    ),
                    session_with(
                        "c",
                        "RUNNING",
                        false,
                        &[(
                            "NeedsResume",
                            "False",
                            "AgentRunning",
                            "2025-01-01T00:00:00Z",
                        )],
                    ),
                ],
                2,
                3.0 * 3600.0,
                vec![],
            ),
            (
                "a condition from the future (clock skew) is age 0",
                vec![session_with(
                    "a",
                    "WAITING_FOR_INPUT",
                    true,
                    &[("NeedsResume", "True", "AgentLost", "2026-01-01T12:05:00Z")],
                )],
                1,
                0.0,
                vec![],
            ),
            (
                "stalled launches by reason; a FAILED session is not a stalled launch",
                vec![
                    stalled("a", "STARTING", true, "True", "ImagePullBackOff"),
                    stalled("b", "CREATED", false, "True", "ImagePullBackOff"),
                    stalled("c", "CREATED", false, "True", "WorkspaceMissing"),
                    stalled("d", "FAILED", false, "True", "LaunchFailed"),
                    stalled("e", "RUNNING", false, "False", "Running"),
                ],
                1,
                0.0,
                vec![("ImagePullBackOff", 2), ("WorkspaceMissing", 1)],
            ),
        ];
        for (what, sessions, needing, oldest, stalled) in rows {
            let summary = summarize(&sessions, now);
            assert_eq!(summary.needing_resume, needing, "{what}");
            assert_eq!(summary.oldest_needing_resume_seconds, oldest, "{what}");
            let stalled: BTreeMap<String, i64> = stalled
                .into_iter()
                .map(|(r, n)| (r.to_string(), n))
                .collect();
            assert_eq!(summary.stalled, stalled, "{what}");
            assert_eq!(
                summary.by_state.values().sum::<i64>(),
                sessions.len() as i64,
                "{what}: every session has one state"
            );
        }
    }

    /// The watchdog of `kandev_sessions_overdue` (issue 31): a session that stays launching,
    /// doing the same thing, past the allowed time is overdue; one that moves on starts a new
    /// clock; sessions at rest, Stalled or gone are not counted.
    #[test]
    fn the_watchdog_counts_sessions_stuck_past_their_deadline() {
        let session = |uid: &str, status: serde_json::Value| -> Arc<TaskSession> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "kandev.dev/v1alpha1",
                    "kind": "TaskSession",
                    "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                    "spec": {"taskId": "t", "agent": "claude-code", "workspace": {"claimName": "w"}},
                    "status": status,
                }))
                .expect("session"),
            )
        };
        let launching = |token: &str| {
            session(
                "a",
                serde_json::json!({"state": "STARTING", "activeResumeRequest": token}),
            )
        };
        let at_rest = session("b", serde_json::json!({"state": "WAITING_FOR_INPUT"}));
        let stalled = session(
            "c",
            serde_json::json!({"state": "CREATED", "conditions": [{"type": "Stalled",
                "status": "True", "reason": "WorkspaceMissing", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        );
        let after = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut watchdog = Watchdog::default();
        watchdog.look(&[launching("r1"), at_rest.clone(), stalled.clone()], t0);
        assert_eq!(watchdog.overdue(t0 + after * 2), 0, "no watchdog runs");
        watchdog.deadlines = Some(Deadlines {
            requested: Duration::from_secs(1),
            launching: after,
            ending: Duration::from_secs(1),
        });
        assert_eq!(watchdog.overdue(t0 + after), 0, "within the deadline");
        let late = t0 + after + Duration::from_secs(1);
        watchdog.look(&[launching("r1"), at_rest.clone(), stalled.clone()], late);
        assert_eq!(watchdog.overdue(late), 1, "launching r1 for too long");
        watchdog.look(&[launching("r2"), at_rest.clone(), stalled.clone()], late);
        assert_eq!(
            watchdog.overdue(late),
            0,
            "a newer request starts a new clock"
        );
        let later = late + after + Duration::from_secs(1);
        assert_eq!(watchdog.overdue(later), 1);
        watchdog.look(&[at_rest, stalled], later);
        assert_eq!(
            watchdog.overdue(later),
            0,
            "gone from the cache, or at rest"
        );
        assert!(watchdog.unsettled.is_empty());
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
            "# TYPE kandev_sessions gauge",
            "kandev_sessions{state=\"RUNNING\"} 1",
            "kandev_sessions{state=\"WAITING_FOR_INPUT\"} 2",
            "kandev_sessions{state=\"FAILED\"} 0",
            "kandev_sessions_needing_resume 1",
            "# TYPE kandev_sessions_needing_resume_oldest_seconds gauge",
            "# TYPE kandev_sessions_stalled gauge",
        ] {
            assert!(has_line(&text, expected), "missing {expected:?} in\n{text}");
        }
    }
}
