//! What the bench reads besides the audit log: a process's CPU and memory from `/proc`, and
//! counters from Prometheus text (kube-apiserver's `apiserver_request_total`, the operator's
//! `kandev_reconciles_total`).

use std::collections::BTreeMap;

/// CPU time and memory of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcSample {
    /// user + system CPU seconds since the process started.
    pub cpu_seconds: f64,
    /// Resident set size now, MiB.
    pub rss_mib: f64,
    /// Peak resident set size, MiB.
    pub peak_rss_mib: f64,
}

#[allow(unsafe_code)]
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (utime, stime) = cpu_ticks(&stat)?;
    Some(ProcSample {
        cpu_seconds: (utime + stime) as f64 / ticks,
        rss_mib: status_kib(&status, "VmRSS:")? as f64 / 1024.0,
        peak_rss_mib: status_kib(&status, "VmHWM:")? as f64 / 1024.0,
    })
}

/// utime and stime (fields 14 and 15) of `/proc/<pid>/stat`; the command name (field 2) may
/// hold spaces and parentheses, so fields are counted after its last `)`.
fn cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): field k is fields[k - 3].
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Sums the samples of metric `name` in Prometheus text, grouped by the values of `labels`
/// (joined with a space; labels a sample lacks count as empty).
pub fn sum_by(text: &str, name: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_text, value) = match rest.strip_prefix('{') {
            Some(r) => match r.rsplit_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue, // another metric with this prefix
        };
        let Some(value) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let parsed = parse_labels(label_text);
        let key = labels
            .iter()
            .map(|l| parsed.get(*l).map(String::as_str).unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        value.push(if e == 'n' { '\n' } else { e });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_survive_odd_command_names() {
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 1 2 3";
        assert_eq!(cpu_ticks(stat), Some((250, 75)));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn memory_from_status() {
        let status = "Name:\tx\nVmHWM:\t  20480 kB\nVmRSS:\t  10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(10240));
        assert_eq!(status_kib(status, "VmHWM:"), Some(20480));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn sums_prometheus_samples_by_labels() {
        let text = r#"# HELP apiserver_request_total x
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",resource="pods",verb="LIST"} 3
apiserver_request_total{code="404",resource="pods",verb="LIST"} 2
apiserver_request_total{code="201",resource="pods",subresource="exec",verb="CONNECT"} 1
apiserver_request_total_other{resource="pods",verb="LIST"} 100
apiserver_request_total{code="200",resource="a\"b",verb="GET"} 1e0
kandev_reconciles_total 7
"#;
        let by = sum_by(text, "apiserver_request_total", &["verb", "resource"]);
        assert_eq!(by["LIST pods"], 5.0);
        assert_eq!(by["CONNECT pods"], 1.0);
        assert_eq!(by["GET a\"b"], 1.0);
        assert_eq!(by.len(), 3);
        assert_eq!(sum_by(text, "kandev_reconciles_total", &[])[""], 7.0);
    }
}
