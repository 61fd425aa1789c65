//! The bench's results: one [`PhaseResult`] per contender, phase and fleet size; the markdown
//! report with the targets of the fleet issue (shown, never asserted) and the JSON dump.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::audit::{Kind, Requests};

pub const OURS: &str = "ours";
pub const FLOOR: &str = "API floor";
/// The API floor with every other write of the fleet issue's budget (`floor-budget`).
pub const BUDGET: &str = "API floor + write budget";
pub const SANDBOX: &str = "agent-sandbox";

/// One phase of one contender at one fleet size.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhaseResult {
    pub contender: String,
    pub phase: String,
    pub n: usize,
    /// Sessions (or sandboxes) that reached the phase's end condition.
    pub completed: usize,
    /// From the first API call of the phase to the last observed end condition (for `loss`:
    /// from the last accepted delete).
    pub seconds: f64,
    /// Per-session latencies, seconds, sorted.
    pub latencies: Vec<f64>,
    /// Requests of the contender's own identity, from the audit log.
    pub requests: Requests,
    /// Requests of everyone else in the same window (the bench, the harness, the control plane).
    pub other_requests: u64,
    /// Everything kube-apiserver served in the window (`apiserver_request_total`).
    pub apiserver_requests: u64,
    pub cpu_seconds: Option<f64>,
    pub rss_mib: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub reconciles: Option<u64>,
    /// ACP `initialize`/restore calls beyond one per pod, and prompts beyond one per session
    /// (from the test agent's call log): must be 0.
    pub duplicate_in_pod_ops: Option<u64>,
    /// `kandev_sessions_overdue` of our operator at the phase's end (sessions stuck past the
    /// operator's own deadlines, its watchdog): must be 0.
    pub overdue_sessions: Option<u64>,
    /// What went wrong or is worth knowing (sessions that did not finish, extra pods).
    pub notes: Vec<String>,
}

impl PhaseResult {
    pub fn new(contender: &str, phase: &str, n: usize) -> Self {
        Self {
            contender: contender.to_string(),
            phase: phase.to_string(),
            n,
            ..Default::default()
        }
    }

    pub fn set_latencies(&mut self, mut latencies: Vec<Duration>) {
        latencies.sort();
        self.completed = latencies.len();
        self.latencies = latencies.iter().map(Duration::as_secs_f64).collect();
    }

    /// Latencies of the `names` that got there (`reached`), each from when it `started`; a note
    /// names the others.
    pub fn record(
        &mut self,
        names: &[String],
        started: &HashMap<String, Instant>,
        reached: &HashMap<String, Instant>,
    ) {
        self.set_latencies(
            reached
                .iter()
                .filter_map(|(name, at)| Some(at.saturating_duration_since(*started.get(name)?)))
                .collect(),
        );
        let mut missing: Vec<&String> =
            names.iter().filter(|n| !reached.contains_key(*n)).collect();
        missing.sort();
        if let Some(first) = missing.first() {
            self.notes.push(format!(
                "{} of {} did not get there in time (first: {first})",
                missing.len(),
                names.len()
            ));
        }
    }

    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        Some(self.latencies[rank - 1])
    }

    /// Sessions per second; none for a phase without per-session latencies (idle).
    pub fn throughput(&self) -> Option<f64> {
        (self.seconds > 0.0 && !self.latencies.is_empty())
            .then(|| self.latencies.len() as f64 / self.seconds)
    }

    /// The contender's own API requests per second over the phase.
    pub fn requests_per_second(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.requests.total() as f64 / self.seconds)
    }

    /// Agent pods the contender created per session (`create pods` in the audit log).
    pub fn pods_created_per_session(&self) -> f64 {
        self.requests
            .by_verb_resource
            .get("create pods")
            .copied()
            .unwrap_or(0) as f64
            / self.n.max(1) as f64
    }

    /// Requests of this kind per session.
    pub fn per_session(&self, kind: Kind) -> f64 {
        self.requests.count(kind) as f64 / self.n.max(1) as f64
    }

    pub fn total_per_session(&self) -> f64 {
        self.requests.total() as f64 / self.n.max(1) as f64
    }
}

/// All results of one run, and how it was run.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub settings: BTreeMap<String, String>,
    pub results: Vec<PhaseResult>,
}

impl Report {
    fn find(&self, contender: &str, phase: &str, n: usize) -> Option<&PhaseResult> {
        self.results
            .iter()
            .find(|r| r.contender == contender && r.phase == phase && r.n == n)
    }

    fn sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.results.iter().map(|r| r.n).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// What keeps this run from being a complete measurement: phases not finished by every
    /// session, in-pod operations not counted, contenders whose requests the audit log lacks.
    pub fn incomplete(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.results.is_empty() {
            problems.push("no results".to_string());
        }
        for r in &self.results {
            let what = format!("{} {} N={}", r.contender, r.phase, r.n);
            if r.completed < r.n {
                problems.push(format!("{what}: {} of {} finished", r.completed, r.n));
            }
            // Counted, whatever the count: that it is 0 is a target of the operator (shown in the
            // report), not a condition of a complete measurement.
            if r.contender == OURS && r.duplicate_in_pod_ops.is_none() {
                problems.push(format!("{what}: repeated in-pod operations not counted"));
            }
            // A stuck session is as unfinished as one that missed the phase's end.
            match (r.contender == OURS, r.overdue_sessions) {
                (true, None) => problems.push(format!("{what}: kandev_sessions_overdue not read")),
                (true, Some(stuck)) if stuck > 0 => problems.push(format!(
                    "{what}: kandev_sessions_overdue is {stuck} (sessions stuck past the operator's deadlines)"
                )),
                _ => {}
            }
            // Idle, a contender's target is no request at all.
            if r.requests.total() == 0 && !r.phase.starts_with("idle") {
                problems.push(format!(
                    "{what}: no request of its identity in the audit log"
                ));
            }
            problems.extend(r.notes.iter().map(|n| format!("{what}: {n}")));
        }
        problems
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# kandev-operator fleet benchmark\n\n{} · commit `{}` · {}\n",
            self.date, self.commit, self.machine
        );
        let settings: Vec<String> = self
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(out, "Settings: {}\n", settings.join(", "));
        let _ = writeln!(out, "## Every phase\n");
        let _ = writeln!(
            out,
            "| contender | phase | N | done | time s | per s | p50 s | p95 s | max s | reads/sess | watches/sess | writes/sess | execs/sess | req/s | other clients | apiserver total | CPU s | RSS MiB | peak RSS MiB | reconciles | dup in-pod ops | overdue |"
        );
        let _ = writeln!(out, "|{}", "---|".repeat(22));
        for r in &self.results {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.contender,
                r.phase,
                r.n,
                r.completed,
                r.seconds,
                opt(r.throughput(), 2),
                opt(r.quantile(0.5), 2),
                opt(r.quantile(0.95), 2),
                opt(r.quantile(1.0), 2),
                r.per_session(Kind::Read),
                r.per_session(Kind::Watch),
                r.per_session(Kind::Write),
                r.per_session(Kind::Exec),
                opt(r.requests_per_second(), 1),
                r.other_requests,
                r.apiserver_requests,
                opt(r.cpu_seconds, 1),
                opt(r.rss_mib, 1),
                opt(r.peak_rss_mib, 1),
                r.reconciles.map_or("–".into(), |v| v.to_string()),
                r.duplicate_in_pod_ops.map_or("–".into(), |v| v.to_string()),
                r.overdue_sessions.map_or("–".into(), |v| v.to_string()),
            );
        }
        for n in self.sizes() {
            self.side_by_side(&mut out, n);
        }
        let notes: Vec<String> = self
            .results
            .iter()
            .flat_map(|r| {
                r.notes
                    .iter()
                    .map(move |note| format!("- {} {} N={}: {note}", r.contender, r.phase, r.n))
            })
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(out, "\n## Notes\n\n{}", notes.join("\n"));
        }
        out
    }

    /// Resume (ours) beside the API floor and agent-sandbox's relaunch, with the targets of the
    /// fleet issue.
    fn side_by_side(&self, out: &mut String, n: usize) {
        let ours = self.find(OURS, "resume", n);
        let floor = self.find(FLOOR, "resume", n);
        let sandbox = self.find(SANDBOX, "relaunch", n);
        if ours.is_none() && floor.is_none() && sandbox.is_none() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## N = {n}: resume beside the API floor and agent-sandbox's relaunch\n"
        );
        let _ = writeln!(
            out,
            "| | {OURS} | {FLOOR} | {SANDBOX} | ours / floor | ours / agent-sandbox |\n|---|---|---|---|---|---|"
        );
        type Metric = fn(&PhaseResult) -> Option<f64>;
        let rows: [(&str, Metric, usize); 8] = [
            ("throughput (per s)", |r| r.throughput(), 2),
            ("p50 latency (s)", |r| r.quantile(0.5), 2),
            ("p95 latency (s)", |r| r.quantile(0.95), 2),
            (
                "API reads per session",
                |r| Some(r.per_session(Kind::Read)),
                2,
            ),
            (
                "API writes per session",
                |r| Some(r.per_session(Kind::Write)),
                2,
            ),
            (
                "API requests per session",
                |r| Some(r.total_per_session()),
                2,
            ),
            ("execs per session", |r| Some(r.per_session(Kind::Exec)), 2),
            ("controller RSS (MiB)", |r| r.rss_mib, 1),
        ];
        for (name, metric, digits) in rows {
            let o = ours.and_then(metric);
            let f = floor.and_then(metric);
            let s = sandbox.and_then(metric);
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} |",
                opt(o, digits),
                opt(f, digits),
                opt(s, digits),
                opt(ratio(o, f), 2),
                opt(ratio(o, s), 2),
            );
        }
        let budget = self.find(BUDGET, "resume", n);
        if let Some(b) = budget {
            let _ = writeln!(
                out,
                "\nThe API floor with every other write of the fleet issue's budget (the user's \
                 annotation, the latch, the ExecutorRunning status, two Events), nothing waiting \
                 between them: what any operator within that budget could reach here.\n\n\
                 | | {BUDGET} | budget / floor | ours / budget |\n|---|---|---|---|"
            );
            let rows: [(&str, Metric, usize); 4] = [
                ("throughput (per s)", |r| r.throughput(), 2),
                ("p50 latency (s)", |r| r.quantile(0.5), 2),
                (
                    "API writes per session",
                    |r| Some(r.per_session(Kind::Write)),
                    2,
                ),
                ("execs per session", |r| Some(r.per_session(Kind::Exec)), 2),
            ];
            for (name, metric, digits) in rows {
                let v = metric(b);
                let _ = writeln!(
                    out,
                    "| {name} | {} | {} | {} |",
                    opt(v, digits),
                    opt(ratio(v, floor.and_then(metric)), 2),
                    opt(ratio(ours.and_then(metric), v), 2),
                );
            }
        }
        requests_by_verb(
            out,
            &[
                (OURS, ours),
                (FLOOR, floor),
                (BUDGET, budget),
                (SANDBOX, sandbox),
            ],
            n,
        );
        if let Some(storm) = self.find(OURS, "storm", n) {
            let resume = self.find(OURS, "resume", n);
            let _ = writeln!(
                out,
                "\nStorm (five request tokens in a row on every lost session): {:.2} pods created, \
                 {:.2} writes and {:.2} execs per session; {:.1} s, {} × the resume phase of this run.",
                storm.pods_created_per_session(),
                storm.per_session(Kind::Write),
                storm.per_session(Kind::Exec),
                storm.seconds,
                opt(
                    resume.and_then(|r| ratio(Some(storm.seconds), Some(r.seconds))),
                    2
                ),
            );
        }
        let _ = writeln!(out, "\nTargets (fleet issue; shown, not asserted):\n");
        for (what, met) in self.targets(n) {
            let mark = match met {
                Some(true) => "✅",
                Some(false) => "❌",
                None => "–",
            };
            let _ = writeln!(out, "- {mark} {what}");
        }
    }

    fn targets(&self, n: usize) -> Vec<(String, Option<bool>)> {
        let get = |c, p| self.find(c, p, n);
        let ours_resume = get(OURS, "resume");
        let dups: Option<u64> = self
            .results
            .iter()
            .filter(|r| r.contender == OURS && r.n == n)
            .map(|r| r.duplicate_in_pod_ops)
            .sum();
        let throughput_ratio = ratio(
            ours_resume.and_then(PhaseResult::throughput),
            get(FLOOR, "resume").and_then(PhaseResult::throughput),
        );
        let mut targets = vec![
            (
                format!(
                    "0 repeated in-pod operations in every phase (measured: {})",
                    dups.map_or("–".into(), |d| d.to_string())
                ),
                dups.map(|d| d == 0),
            ),
            (
                format!(
                    "live API reads per resume ≤ 2 (measured: {})",
                    opt(ours_resume.map(|r| r.per_session(Kind::Read)), 2)
                ),
                ours_resume.map(|r| r.per_session(Kind::Read) <= 2.0),
            ),
            (
                format!(
                    "API writes per resume ≤ 6 (measured: {})",
                    opt(ours_resume.map(|r| r.per_session(Kind::Write)), 2)
                ),
                ours_resume.map(|r| r.per_session(Kind::Write) <= 6.0),
            ),
            (
                format!(
                    "resume throughput ≥ 0.8 × the API floor (measured: {})",
                    opt(throughput_ratio, 2)
                ),
                throughput_ratio.map(|r| r >= 0.8),
            ),
            (
                format!(
                    "all sessions NeedsResume ≤ 2 s after the last pod delete (measured: {} s)",
                    opt(get(OURS, "loss").map(|r| r.seconds), 2)
                ),
                get(OURS, "loss").map(|r| r.completed == n && r.seconds <= 2.0),
            ),
        ];
        if let Some(storm) = get(OURS, "storm") {
            let time = ours_resume.and_then(|r| ratio(Some(storm.seconds), Some(r.seconds)));
            targets.extend([
                (
                    format!(
                        "storm: 1.00 pod created per session (measured: {:.2})",
                        storm.pods_created_per_session()
                    ),
                    Some(storm.pods_created_per_session() <= 1.0),
                ),
                (
                    format!(
                        "storm: execs per session ≤ 1.00 (measured: {:.2})",
                        storm.per_session(Kind::Exec)
                    ),
                    Some(storm.per_session(Kind::Exec) <= 1.0),
                ),
                (
                    format!(
                        "storm: writes per session ≤ 8 (measured: {:.2})",
                        storm.per_session(Kind::Write)
                    ),
                    Some(storm.per_session(Kind::Write) <= 8.0),
                ),
                (
                    format!(
                        "storm: time ≤ 1.3 × the resume phase (measured: {})",
                        opt(time, 2)
                    ),
                    time.map(|t| t <= 1.3),
                ),
            ]);
        }
        if let (Some(ours), Some(sandbox)) = (ours_resume, get(SANDBOX, "relaunch")) {
            let (o, s) = (
                ours.per_session(Kind::Read),
                sandbox.per_session(Kind::Read),
            );
            targets.push((
                format!("API reads per resume ≤ agent-sandbox's per relaunch (measured: {o:.2} vs {s:.2})"),
                Some(o <= s),
            ));
        }
        if n >= 400 {
            let peak = self
                .results
                .iter()
                .filter(|r| r.contender == OURS && r.n == n)
                .filter_map(|r| r.peak_rss_mib)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            targets.push((
                format!(
                    "operator RSS ≤ 64 MiB at N=400 (measured peak: {} MiB)",
                    opt(peak, 1)
                ),
                peak.map(|p| p <= 64.0),
            ));
        }
        targets
    }
}

/// API requests per session by verb and resource, one column per contender that ran.
fn requests_by_verb(out: &mut String, results: &[(&str, Option<&PhaseResult>)], n: usize) {
    let ran: Vec<(&str, &PhaseResult)> = results
        .iter()
        .filter_map(|(name, r)| Some((*name, (*r)?)))
        .collect();
    let keys: std::collections::BTreeSet<&String> = ran
        .iter()
        .flat_map(|(_, r)| r.requests.by_verb_resource.keys())
        .collect();
    if keys.is_empty() {
        return;
    }
    let header: Vec<String> = ran
        .iter()
        .map(|(name, r)| format!("{name} {}", r.phase))
        .collect();
    let _ = writeln!(
        out,
        "\nAPI requests per session by verb and resource (audit log, N = {n}):\n\n| verb resource | {} |\n|---{}|",
        header.join(" | "),
        "|---".repeat(ran.len())
    );
    for key in keys {
        let cells: Vec<String> = ran
            .iter()
            .map(|(_, r)| {
                r.requests.by_verb_resource.get(key).map_or_else(
                    || "–".to_string(),
                    |count| format!("{:.2}", *count as f64 / r.n.max(1) as f64),
                )
            })
            .collect();
        let _ = writeln!(out, "| {key} | {} |", cells.join(" | "));
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(contender: &str, phase: &str, n: usize, seconds: f64, lat: &[u64]) -> PhaseResult {
        let mut r = PhaseResult::new(contender, phase, n);
        r.seconds = seconds;
        r.set_latencies(lat.iter().map(|ms| Duration::from_millis(*ms)).collect());
        r
    }

    #[test]
    fn records_latencies_from_each_start_and_names_the_missing() {
        let t0 = Instant::now();
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let started: HashMap<String, Instant> = names.iter().map(|n| (n.clone(), t0)).collect();
        let reached = HashMap::from([
            ("a".to_string(), t0 + Duration::from_secs(2)),
            ("c".to_string(), t0 + Duration::from_secs(1)),
        ]);
        let mut r = PhaseResult::new(OURS, "resume", 3);
        r.record(&names, &started, &reached);
        assert_eq!(r.latencies, vec![1.0, 2.0]);
        assert_eq!(r.completed, 2);
        assert_eq!(
            r.notes,
            vec!["1 of 3 did not get there in time (first: b)".to_string()]
        );
    }

    #[test]
    fn a_complete_measurement_counts_everything_but_judges_nothing() {
        let mut ours = result(OURS, "launch", 2, 1.0, &[100, 200]);
        ours.requests.add("create", "pods", 2);
        ours.duplicate_in_pod_ops = Some(3); // an operator defect, shown as ❌, not a bench error
        ours.overdue_sessions = Some(0);
        let report = Report {
            results: vec![ours.clone()],
            ..Default::default()
        };
        assert!(report.incomplete().is_empty(), "{:?}", report.incomplete());
        let mut short = ours.clone();
        short.set_latencies(vec![Duration::from_millis(100)]);
        short.duplicate_in_pod_ops = None;
        short.overdue_sessions = Some(2);
        short.requests = Requests::default();
        let report = Report {
            results: vec![short],
            ..Default::default()
        };
        assert_eq!(
            report.incomplete(),
            [
                "ours launch N=2: 1 of 2 finished",
                "ours launch N=2: repeated in-pod operations not counted",
                "ours launch N=2: kandev_sessions_overdue is 2 (sessions stuck past the operator's deadlines)",
                "ours launch N=2: no request of its identity in the audit log",
            ]
        );
        assert_eq!(Report::default().incomplete(), ["no results"]);
        // Idle, no request is the target, not a gap in the count.
        let mut idle = result(OURS, "idle", 2, 60.0, &[0, 0]);
        idle.duplicate_in_pod_ops = Some(0);
        idle.overdue_sessions = Some(0);
        let report = Report {
            results: vec![idle],
            ..Default::default()
        };
        assert!(report.incomplete().is_empty(), "{:?}", report.incomplete());
    }

    #[test]
    fn quantiles_and_throughput() {
        let r = result(OURS, "resume", 4, 2.0, &[400, 100, 300, 200]);
        assert_eq!(r.quantile(0.5), Some(0.2));
        assert_eq!(r.quantile(0.95), Some(0.4));
        assert_eq!(r.quantile(1.0), Some(0.4));
        assert_eq!(r.throughput(), Some(2.0));
        assert_eq!(PhaseResult::new(OURS, "x", 3).quantile(0.5), None);
        assert_eq!(PhaseResult::new(OURS, "x", 3).throughput(), None);
    }

    #[test]
    fn side_by_side_has_ratios_and_marks_targets() {
        let mut ours = result(OURS, "resume", 2, 4.0, &[1000, 2000]);
        ours.requests.add("get", "executorrunnings", 6);
        ours.requests.add("patch", "tasksessions/status", 4);
        ours.duplicate_in_pod_ops = Some(1);
        let floor = result(FLOOR, "resume", 2, 2.0, &[500, 600]);
        let mut sandbox = result(SANDBOX, "relaunch", 2, 1.0, &[100, 200]);
        sandbox.requests.add("get", "sandboxes", 2);
        let report = Report {
            results: vec![ours, floor, sandbox],
            ..Default::default()
        };
        let md = report.markdown();
        assert!(
            md.contains("| throughput (per s) | 0.50 | 1.00 | 2.00 | 0.50 | 0.25 |"),
            "{md}"
        );
        assert!(
            md.contains("| API reads per session | 3.00 | 0.00 | 1.00 | – | 3.00 |"),
            "{md}"
        );
        assert!(
            md.contains("❌ 0 repeated in-pod operations in every phase (measured: 1)"),
            "{md}"
        );
        assert!(
            md.contains("❌ live API reads per resume ≤ 2 (measured: 3.00)"),
            "{md}"
        );
        assert!(
            md.contains("✅ API writes per resume ≤ 6 (measured: 2.00)"),
            "{md}"
        );
        assert!(
            md.contains("❌ resume throughput ≥ 0.8 × the API floor (measured: 0.50)"),
            "{md}"
        );
        assert!(md.contains("– all sessions NeedsResume"), "{md}");
        assert!(
            md.contains("| get executorrunnings | 3.00 | – | – |"),
            "{md}"
        );
        assert!(md.contains("| get sandboxes | – | – | 1.00 |"), "{md}");
    }

    #[test]
    fn the_floor_with_the_write_budget_is_put_beside_the_floor_and_ours() {
        let mut ours = result(OURS, "resume", 2, 4.0, &[1000, 2000]);
        ours.requests.add("create", "events", 4);
        let floor = result(FLOOR, "resume", 2, 2.0, &[500, 600]);
        let mut budget = result(BUDGET, "resume", 2, 2.5, &[700, 800]);
        budget.requests.add("create", "events", 4);
        budget.requests.add("patch", "executorrunnings/status", 2);
        let report = Report {
            results: vec![ours, floor, budget],
            ..Default::default()
        };
        let md = report.markdown();
        // 0.8 per s: 0.8 of the floor's 1.0, and ours (0.5) is 0.62 of it.
        assert!(
            md.contains("| throughput (per s) | 0.80 | 0.80 | 0.62 |"),
            "{md}"
        );
        assert!(
            md.contains(&format!(
                "| verb resource | {OURS} resume | {FLOOR} resume | {BUDGET} resume |"
            )),
            "{md}"
        );
        assert!(md.contains("| create events | 2.00 | – | 2.00 |"), "{md}");
        assert!(
            md.contains("| patch executorrunnings/status | – | – | 1.00 |"),
            "{md}"
        );
    }
}
