//! API requests per client, from kube-apiserver's own audit log.
//!
//! `apiserver_request_total` counts every client together; the audit log names the user of each
//! request, so the operator, the API floor and agent-sandbox (each with a ServiceAccount of its
//! own) are counted apart from the bench, the harness and the control plane. The policy
//! (`e2e/bench/audit-policy.yaml`) logs metadata only and skips `RequestReceived`; a long-running
//! request (watch, exec) is logged at `ResponseStarted` and again at `ResponseComplete`, so every
//! audit id is counted once, when first seen.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Requests of one client, by `verb resource[/subresource]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    pub by_verb_resource: BTreeMap<String, u64>,
}

/// How a request counts in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// get and list: what a cache-driven reconciler should not need in steady state.
    Read,
    /// watch: long-lived, opened once per informer.
    Watch,
    /// create, update, patch, delete.
    Write,
    /// a connection into a pod (`pods/exec`, `pods/attach`).
    Exec,
}

impl Requests {
    pub fn add(&mut self, verb: &str, resource: &str, n: u64) {
        *self
            .by_verb_resource
            .entry(format!("{verb} {resource}"))
            .or_default() += n;
    }

    pub fn total(&self) -> u64 {
        self.by_verb_resource.values().sum()
    }

    pub fn count(&self, kind: Kind) -> u64 {
        self.by_verb_resource
            .iter()
            .filter(|(key, _)| classify(key) == Some(kind))
            .map(|(_, n)| n)
            .sum()
    }
}

/// The kind of a `verb resource` key; `None` for non-resource requests (`/metrics`, discovery).
pub fn classify(key: &str) -> Option<Kind> {
    let (verb, resource) = key.split_once(' ')?;
    if resource.ends_with("/exec") || resource.ends_with("/attach") {
        return Some(Kind::Exec);
    }
    if resource.starts_with('/') {
        return None;
    }
    match verb {
        "get" | "list" => Some(Kind::Read),
        "watch" => Some(Kind::Watch),
        "create" | "update" | "patch" | "delete" | "deletecollection" => Some(Kind::Write),
        _ => None,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    #[serde(default)]
    verb: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default)]
    user: User,
    object_ref: Option<ObjectRef>,
}

#[derive(Default, Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    subresource: Option<String>,
}

/// Reads the audit log incrementally: [`AuditLog::take`] returns what was logged since the last
/// call, per user name.
pub struct AuditLog {
    path: PathBuf,
    offset: u64,
    seen: HashSet<String>,
}

impl AuditLog {
    /// Starts at the current end of the log: earlier requests are not counted.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let offset = std::fs::metadata(path).map(|m| m.len())?;
        Ok(Self {
            path: path.to_path_buf(),
            offset,
            seen: HashSet::new(),
        })
    }

    /// Requests logged since the last call (whole lines only), by user name. A log shorter than
    /// what was already read has been rotated: an error, never a silent zero.
    pub fn take(&mut self) -> std::io::Result<BTreeMap<String, Requests>> {
        let mut file = std::fs::File::open(&self.path)?;
        let len = file.metadata()?.len();
        if len < self.offset {
            return Err(std::io::Error::other(format!(
                "{} shrank from {} to {len} bytes: it was rotated, so requests would go uncounted",
                self.path.display(),
                self.offset
            )));
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut reader = BufReader::new(file);
        let mut out: BTreeMap<String, Requests> = BTreeMap::new();
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            if n == 0 || !line.ends_with('\n') {
                break; // a line still being written is read next time
            }
            self.offset += n as u64;
            if let Some((user, verb, resource)) = self.parse(&line) {
                out.entry(user).or_default().add(&verb, &resource, 1);
            }
        }
        Ok(out)
    }

    /// The user, verb and resource of a request logged for the first time.
    fn parse(&mut self, line: &str) -> Option<(String, String, String)> {
        let event: Event = serde_json::from_str(line).ok()?;
        if !self.seen.insert(event.audit_id) {
            return None;
        }
        let resource = match event.object_ref {
            Some(o) if !o.resource.is_empty() => match o.subresource {
                Some(sub) => format!("{}/{sub}", o.resource),
                None => o.resource,
            },
            // Non-resource URLs: the path without its query.
            _ => event
                .request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        Some((event.user.username, event.verb, resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, stage: &str, user: &str, verb: &str, obj: &str) -> String {
        format!(
            r#"{{"kind":"Event","auditID":"{id}","stage":"{stage}","verb":"{verb}","requestURI":"/api/v1/x?watch=1","user":{{"username":"{user}"}}{obj}}}"#
        )
    }

    #[test]
    fn counts_each_request_once_per_user_from_where_it_left_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let before = event("0", "ResponseComplete", "old", "get", "") + "\n";
        std::fs::write(&path, &before).expect("write");
        let mut log = AuditLog::open(&path).expect("open");
        let pods = r#","objectRef":{"resource":"pods","namespace":"n"}"#;
        let exec = r#","objectRef":{"resource":"pods","subresource":"exec"}"#;
        let lines = [
            event("1", "ResponseStarted", "op", "watch", pods),
            event("1", "ResponseComplete", "op", "watch", pods),
            event("2", "ResponseComplete", "op", "create", pods),
            event("3", "ResponseStarted", "op", "get", exec),
            event("4", "ResponseComplete", "bench", "list", pods),
            event("5", "ResponseComplete", "op", "get", ""),
            "not json".to_string(),
        ];
        let mut text = lines.join("\n") + "\n";
        text.push_str(&event("6", "ResponseComplete", "op", "delete", pods)); // no newline yet
        std::fs::write(&path, format!("{before}{text}")).expect("write");
        let first = log.take().expect("take");
        let op = &first["op"];
        assert_eq!(op.by_verb_resource["watch pods"], 1);
        assert_eq!(op.by_verb_resource["create pods"], 1);
        assert_eq!(op.by_verb_resource["get pods/exec"], 1);
        assert_eq!(op.by_verb_resource["get /api/v1/x"], 1);
        assert_eq!(op.total(), 4);
        assert_eq!(op.count(Kind::Read), 0);
        assert_eq!(op.count(Kind::Watch), 1);
        assert_eq!(op.count(Kind::Write), 1);
        assert_eq!(op.count(Kind::Exec), 1);
        assert_eq!(first["bench"].count(Kind::Read), 1);
        assert!(!first.contains_key("old"), "{first:?}");
        // The unfinished line is read once it ends.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("append");
        std::io::Write::write_all(&mut file, b"\n").expect("newline");
        let second = log.take().expect("take");
        assert_eq!(second["op"].by_verb_resource["delete pods"], 1);
        assert_eq!(second["op"].total(), 1);
        // Rotated under our feet: an error, not zero requests.
        std::fs::write(&path, "").expect("truncate");
        let err = log.take().expect_err("rotation");
        assert!(err.to_string().contains("rotated"), "{err}");
    }

    #[test]
    fn request_kinds() {
        let cases = [
            ("get tasksessions", Some(Kind::Read)),
            ("list pods", Some(Kind::Read)),
            ("watch pods", Some(Kind::Watch)),
            ("patch tasksessions/status", Some(Kind::Write)),
            ("create events", Some(Kind::Write)),
            ("create pods/exec", Some(Kind::Exec)),
            ("get pods/exec", Some(Kind::Exec)),
            ("get /metrics", None),
            ("get /apis", None),
        ];
        for (key, want) in cases {
            assert_eq!(classify(key), want, "{key}");
        }
    }
}
