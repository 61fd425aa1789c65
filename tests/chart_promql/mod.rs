//! The PromQL of the chart's PrometheusRule and Grafana dashboard against the metrics the
//! operator exports: a small reader that pulls the metric selectors (name and label matchers)
//! and the grouping labels out of an expression, and [`Exported`], every sample name with its
//! labels and label values, read from a render of the operator's own registry.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kandev_operator::api::TaskSession;
use kandev_operator::controller::metrics::{Metrics, ResumeOutcome};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;

/// Labels the scrape adds to every series (Prometheus and the Prometheus Operator's target
/// labels), not the operator.
pub const TARGET_LABELS: &[&str] = &[
    "namespace",
    "job",
    "instance",
    "pod",
    "service",
    "container",
    "endpoint",
];

/// `name{label op "value", …}` in an expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    /// (label, operator, value)
    pub matchers: Vec<(String, String, String)>,
}

/// What an expression refers to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct References {
    pub selectors: Vec<Selector>,
    /// Labels of `by (…)`, `without (…)`, `on (…)`, `ignoring (…)`, `group_left/right (…)`.
    pub grouping: Vec<String>,
}

const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const OPERATORS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];
/// Aggregation operators: keywords, also when `by (…)` stands between them and their `(`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_ident(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn ident(&mut self) -> String {
        let start = self.at;
        while self.peek().is_some_and(is_ident) {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.text[start..self.at]).into_owned()
    }

    /// A quoted string (the quote at `at`), unescaped.
    fn string(&mut self) -> Result<String, String> {
        let quote = self.peek().ok_or("a string expected")?;
        self.at += 1;
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            self.at += 1;
            if c == quote {
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            if c == b'\\' && quote != b'`' {
                if let Some(next) = self.peek() {
                    out.push(next);
                    self.at += 1;
                }
                continue;
            }
            out.push(c);
        }
        Err("an unterminated string".into())
    }

    /// `{label op "value", …}`, the `{` at `at`.
    fn matchers(&mut self) -> Result<Vec<(String, String, String)>, String> {
        self.list(b'}', "a label name in a selector", |reader| {
            let label = reader.ident();
            reader.skip_space();
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| reader.text[reader.at..].starts_with(op.as_bytes()))
                .ok_or_else(|| format!("a matcher operator expected after {label}"))?;
            reader.at += op.len();
            reader.skip_space();
            let value = reader.string()?;
            Ok((label, op.to_string(), value))
        })
    }

    /// `( a, b )` of a grouping clause, the `(` at `at`.
    fn label_list(&mut self) -> Result<Vec<String>, String> {
        self.list(b')', "a label in a grouping list", |reader| {
            Ok(reader.ident())
        })
    }

    /// The comma-separated items up to `close`, the opening bracket at `at`: each starts with a
    /// name and is read by `item`; `what` names an item in the error.
    fn list<T>(
        &mut self,
        close: u8,
        what: &str,
        mut item: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(c) if c == close => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b',') => self.at += 1,
                Some(c) if is_ident_start(c) => out.push(item(self)?),
                other => {
                    return Err(format!(
                        "{what} expected at byte {}, found {:?}",
                        self.at,
                        other.map(char::from)
                    ));
                }
            }
        }
    }
}

/// The metric selectors and grouping labels of a PromQL expression. Grafana's `$variables`
/// may stand in strings and range brackets.
pub fn references(expr: &str) -> Result<References, String> {
    let mut reader = Reader {
        text: expr.as_bytes(),
        at: 0,
    };
    let mut refs = References::default();
    while let Some(c) = reader.peek() {
        match c {
            b'"' | b'\'' | b'`' => {
                reader.string()?;
            }
            b'[' => {
                let close = expr[reader.at..].find(']').ok_or("an unterminated range")?;
                reader.at += close + 1;
            }
            b'{' => {
                // A selector without a name: only {__name__="…"} names its metric.
                let matchers = reader.matchers()?;
                let name = matchers
                    .iter()
                    .find(|(l, op, _)| l == "__name__" && op == "=")
                    .map(|(_, _, v)| v.clone())
                    .ok_or_else(|| format!("a selector without a metric name in {expr:?}"))?;
                refs.selectors.push(Selector {
                    metric: name,
                    matchers,
                });
            }
            b'$' => {
                reader.at += 1;
                reader.ident();
            }
            c if c.is_ascii_digit() || c == b'.' => {
                // Numbers and durations: 0.95, 5m, 1e3.
                while reader
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'.')
                {
                    reader.at += 1;
                }
            }
            c if is_ident_start(c) => {
                let word = reader.ident();
                reader.skip_space();
                let next = reader.peek();
                if GROUPING.contains(&word.as_str()) {
                    if next == Some(b'(') {
                        refs.grouping.extend(reader.label_list()?);
                    }
                } else if OPERATORS.contains(&word.to_ascii_lowercase().as_str())
                    || AGGREGATIONS.contains(&word.as_str())
                    || next == Some(b'(')
                {
                    // A binary operator, a modifier or a function name.
                } else {
                    let matchers = if next == Some(b'{') {
                        reader.matchers()?
                    } else {
                        Vec::new()
                    };
                    refs.selectors.push(Selector {
                        metric: word,
                        matchers,
                    });
                }
            }
            _ => reader.at += 1,
        }
    }
    Ok(refs)
}

/// Every sample name the operator exports, with the labels and label values seen on it.
#[derive(Debug, Default)]
pub struct Exported {
    /// sample name → label → values
    pub samples: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl Exported {
    /// Renders the operator's registry with every family populated: each counter and histogram
    /// observed, a leader, and a session cache with a stalled session (the `reason` label).
    pub fn from_operator() -> Exported {
        let metrics = Metrics::new();
        metrics.reconciled(None, Duration::from_millis(5));
        metrics.reconciled(Some("kube"), Duration::from_millis(5));
        for outcome in ResumeOutcome::ALL {
            metrics.resume_handled(outcome);
        }
        metrics.agent_lost();
        metrics.restore_took(Duration::from_millis(300));
        metrics.set_leader(true);
        let mut writer: Writer<TaskSession> = Writer::default();
        metrics.track_sessions(writer.as_reader());
        let stalled: TaskSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "kandev.dev/v1alpha1",
            "kind": "TaskSession",
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": {"taskId": "t", "agent": "claude-code", "workspace": {"claimName": "w"}},
            "status": {"state": "STARTING", "needsResume": true, "conditions": [
                {"type": "Stalled", "status": "True", "reason": "ImagePullBackOff", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "NeedsResume", "status": "True", "reason": "LaunchStalled", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .expect("a TaskSession");
        writer.apply_watcher_event(&watcher::Event::Apply(stalled));
        Exported::parse(&metrics.render())
    }

    /// Reads an OpenMetrics text: `# TYPE` lines name the families, samples their labels.
    pub fn parse(text: &str) -> Exported {
        let mut exported = Exported::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                for suffix in suffixes {
                    exported
                        .samples
                        .entry(format!("{name}{suffix}"))
                        .or_default();
                }
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let sample = line.split(" # ").next().unwrap_or(line);
            let (name, labels) = match sample.split_once('{') {
                Some((name, rest)) => (name, rest.rsplit_once('}').map_or("", |(l, _)| l)),
                None => (sample.split(' ').next().unwrap_or(""), ""),
            };
            let entry = exported.samples.entry(name.to_string()).or_default();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                if let Some((label, value)) = pair.split_once('=') {
                    entry
                        .entry(label.to_string())
                        .or_default()
                        .insert(value.trim_matches('"').to_string());
                }
            }
        }
        exported
    }

    /// What in `expr` the operator does not export: unknown metrics, labels a metric does not
    /// have, `=`/`!=` values a label never takes, grouping labels no selected metric has.
    pub fn unknown_in(&self, expr: &str) -> Vec<String> {
        let refs = match references(expr) {
            Ok(refs) => refs,
            Err(err) => return vec![format!("unreadable PromQL {expr:?}: {err}")],
        };
        let mut problems = Vec::new();
        let mut labels_in_scope: BTreeSet<String> =
            TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        if refs.selectors.is_empty() {
            problems.push(format!("no metric in {expr:?}"));
        }
        for selector in &refs.selectors {
            let Some(labels) = self.samples.get(&selector.metric) else {
                problems.push(format!("metric {} is not exported", selector.metric));
                continue;
            };
            labels_in_scope.extend(labels.keys().cloned());
            for (label, op, value) in &selector.matchers {
                if TARGET_LABELS.contains(&label.as_str()) || label == "__name__" {
                    continue;
                }
                let Some(values) = labels.get(label) else {
                    problems.push(format!("{} has no label {label}", selector.metric));
                    continue;
                };
                if (op == "=" || op == "!=") && !values.contains(value) {
                    problems.push(format!(
                        "{}{{{label}{op}{value:?}}}: {label} is never {value:?} (it is one of {values:?})",
                        selector.metric
                    ));
                }
            }
        }
        for label in &refs.grouping {
            if !labels_in_scope.contains(label) {
                problems.push(format!(
                    "grouping by {label}, which no metric of {expr:?} has"
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(metric: &str, matchers: &[(&str, &str, &str)]) -> Selector {
        Selector {
            metric: metric.into(),
            matchers: matchers
                .iter()
                .map(|(l, o, v)| (l.to_string(), o.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn reads_selectors_and_grouping_labels() {
        // (expression, selectors, grouping labels)
        let rows: Vec<(&str, Vec<Selector>, Vec<&str>)> = vec![
            (
                r#"(sum(kandev_leader{namespace="ns"}) or vector(0)) < 1"#,
                vec![selector("kandev_leader", &[("namespace", "=", "ns")])],
                vec![],
            ),
            (
                r#"histogram_quantile(0.95, sum by (le) (rate(kandev_acp_restore_duration_seconds_bucket{namespace=~"$namespace"}[$__rate_interval])))"#,
                vec![selector(
                    "kandev_acp_restore_duration_seconds_bucket",
                    &[("namespace", "=~", "$namespace")],
                )],
                vec!["le"],
            ),
            (
                "sum(rate(a_total{x=\"1\",y!=\"2\"}[5m] offset 1h)) by (x) / on (x) group_left b",
                vec![
                    selector("a_total", &[("x", "=", "1"), ("y", "!=", "2")]),
                    selector("b", &[]),
                ],
                vec!["x", "x"],
            ),
            (
                r#"{__name__="kandev_leader", pod="p"} unless kandev_sessions > bool 2e3"#,
                vec![
                    selector(
                        "kandev_leader",
                        &[("__name__", "=", "kandev_leader"), ("pod", "=", "p")],
                    ),
                    selector("kandev_sessions", &[]),
                ],
                vec![],
            ),
        ];
        for (expr, selectors, grouping) in rows {
            let refs = references(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert_eq!(refs.selectors, selectors, "{expr}");
            assert_eq!(refs.grouping, grouping, "{expr}");
        }
        for bad in [r#"{pod="p"}"#, r#"x{a="1"#, r#"x{a 1}"#, "rate(x[5m"] {
            assert!(references(bad).is_err(), "{bad:?} should not read");
        }
    }

    /// The check catches a wrong name, label or value: it can fail.
    #[test]
    fn the_operator_exports_what_the_check_expects_and_nothing_unknown_passes() {
        let exported = Exported::from_operator();
        for known in [
            r#"sum(rate(kandev_resume_requests_total{outcome="failed"}[5m]))"#,
            r#"sum by (reason) (kandev_sessions_stalled{namespace="x"})"#,
            r#"max(kandev_sessions_needing_resume_oldest_seconds)"#,
            r#"histogram_quantile(0.5, sum by (le) (rate(kandev_reconcile_duration_seconds_bucket[5m])))"#,
            r#"sum by (kind) (rate(kandev_reconcile_errors_total[5m]))"#,
        ] {
            assert_eq!(exported.unknown_in(known), Vec::<String>::new(), "{known}");
        }
        for (unknown, says) in [
            (
                "rate(kandev_resumes_total[5m])",
                "kandev_resumes_total is not exported",
            ),
            ("kandev_leader_total", "kandev_leader_total is not exported"),
            (
                r#"kandev_resume_requests_total{outcome="lost"}"#,
                "never \"lost\"",
            ),
            (
                r#"kandev_leader{lease="x"}"#,
                "kandev_leader has no label lease",
            ),
            ("sum by (state) (kandev_leader)", "grouping by state"),
            ("vector(1)", "no metric"),
        ] {
            let problems = exported.unknown_in(unknown);
            assert!(
                problems.iter().any(|p| p.contains(says)),
                "{unknown}: expected a problem saying {says:?}, got {problems:?}"
            );
        }
    }
}
