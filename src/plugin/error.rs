//! The plugin's one error type and the exit codes scripts rely on.

use std::time::Duration;

/// Exit codes of `kubectl kandev` (also listed in `--help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitCode {
    /// Done: the command did what was asked (a session already running counts as done).
    Ok = 0,
    /// The resume, the prompt or the permission answer failed (the operator or the agent
    /// reported a failure).
    Failed = 1,
    /// Bad command line (clap's own code).
    Usage = 2,
    /// The TaskSession does not exist, or (`approve`, `deny`) the named permission request does
    /// not wait.
    NotFound = 3,
    /// The session cannot be resumed (terminal state), or there is nothing to read the history
    /// from: its workspace PVC is gone (`history`).
    NotResumable = 4,
    /// `--timeout` passed before what was waited for happened.
    Timeout = 5,
    /// The cluster is unreachable, the kubeconfig is unusable, or the API refused a call.
    Cluster = 6,
    /// `prompt`: the agent's pod was lost after the prompt was sent, and the prompt may have
    /// reached the agent: the session was resumed, the prompt not sent again.
    NotResent = 7,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// The `--help` text listing the exit codes.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  ok (for resume/prompt: the session was restored or started; already running counts; for
     approve/deny --wait: the agent got the answer)
  1  the resume or the prompt failed; approve/deny --wait: the answer was refused, or the
     request ended otherwise (timed out, went with the agent)
  2  usage error; approve/deny: no request or several wait and no ID was given, or the request
     does not offer the option asked for
  3  the TaskSession was not found; approve/deny: the permission request ID does not wait
  4  not resumable: a terminal session (COMPLETED, CANCELLED, FAILED without a resumable
     executor), or history: the workspace PVC is gone, nothing to read the transcript from
  5  timed out (--timeout) waiting for the operator or the agent
  6  cluster unreachable, kubeconfig unusable, or an API error (e.g. forbidden by RBAC)
  7  prompt: the agent's pod was lost after the prompt was sent and the agent may have received
     it; the session was resumed and the prompt not sent again (see kubectl kandev history)";

/// Everything that can end a plugin command early. Each variant names what was being done, so
/// the one line printed on stderr is enough to act on.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot load the kubeconfig{}: {reason}", path.as_ref().map(|p| format!(" {p}")).unwrap_or_default())]
    Kubeconfig {
        path: Option<String>,
        reason: String,
    },
    #[error("tasksession {name:?} not found in namespace {namespace:?}")]
    NotFound { name: String, namespace: String },
    #[error("tasksession {name:?} in namespace {namespace:?} cannot be resumed: {why}")]
    NotResumable {
        name: String,
        namespace: String,
        why: String,
    },
    #[error(
        "tasksession {name:?} in namespace {namespace:?} has no workspace to read the history from: {why}"
    )]
    NoWorkspace {
        name: String,
        namespace: String,
        why: String,
    },
    #[error("timed out after {} waiting for {what}; last seen: {last_seen}", format_duration(*waited))]
    Timeout {
        what: String,
        waited: Duration,
        last_seen: String,
    },
    #[error("{action} (API server {server}): {}", error_chain(source.as_ref()))]
    Kube {
        action: String,
        server: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(
        "the TaskSession API is not served by {server} ({message}); is the kandev CRD installed? (kubectl get crd tasksessions.kandev.dev)"
    )]
    CrdMissing { server: String, message: String },
    #[error("resume of tasksession {name:?} {verdict}")]
    ResumeFailed { name: String, verdict: String },
    #[error("prompt to tasksession {name:?} failed: {reason}")]
    PromptFailed { name: String, reason: String },
    #[error("{action}: {reason}")]
    Exec { action: String, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("interrupted; {0}")]
    Interrupted(String),
    /// `approve`/`deny` without an id, and not exactly one request waits; or an answer the
    /// request does not offer.
    #[error("tasksession {name:?}: {why}")]
    PermissionChoice { name: String, why: String },
    #[error(
        "tasksession {name:?} has no permission request {id} waiting (waiting: {waiting}); it was answered already, timed out, or went with the agent: kubectl kandev permissions {name} -n {namespace}"
    )]
    PermissionNotPending {
        name: String,
        namespace: String,
        id: String,
        waiting: String,
    },
    #[error("permission answer {answer} to tasksession {name:?} {verdict}")]
    AnswerFailed {
        name: String,
        answer: String,
        verdict: String,
    },
    #[error(
        "prompt to tasksession {name:?}: the agent's pod {pod} was lost before the turn ended, and {what}; the prompt was not sent again (at most once). The session was resumed: see how far the agent got with kubectl kandev history {name} -n {namespace}"
    )]
    NotResent {
        name: String,
        namespace: String,
        pod: String,
        what: String,
    },
}

/// An error and its causes, `a: b: c`, each said once: a client error alone ("client error
/// (SendRequest)") does not tell that the connection timed out or was refused.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

impl PluginError {
    /// The exit code a script sees for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::NotFound { .. } | Self::PermissionNotPending { .. } => ExitCode::NotFound,
            Self::PermissionChoice { .. } => ExitCode::Usage,
            Self::NotResumable { .. } | Self::NoWorkspace { .. } => ExitCode::NotResumable,
            Self::Timeout { .. } => ExitCode::Timeout,
            Self::NotResent { .. } => ExitCode::NotResent,
            Self::Kubeconfig { .. } | Self::Kube { .. } | Self::CrdMissing { .. } => {
                ExitCode::Cluster
            }
            Self::ResumeFailed { .. }
            | Self::PromptFailed { .. }
            | Self::AnswerFailed { .. }
            | Self::Exec { .. }
            | Self::Io { .. }
            | Self::Interrupted(_) => ExitCode::Failed,
        }
    }
}

/// `90s`, `2m`, `1m30s`, `500ms`, `1h`: how durations read in messages (and in `--timeout`).
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis == 0 {
        return "0s".into();
    }
    if !millis.is_multiple_of(1000) {
        return format!("{millis}ms");
    }
    let secs = duration.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// A command line that cannot run: exit code 2, its words after `error: `.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("empty duration")]
    EmptyDuration,
    #[error("invalid duration {text:?}: expected e.g. 90s, 2m, 1m30s, 500ms ({reason})")]
    InvalidDuration { text: String, reason: String },
    #[error("invalid duration {0:?}: must not be negative")]
    NegativeDuration(String),
    #[error("duration {0:?} must be greater than zero")]
    ZeroDuration(String),
    #[error("--as-group needs --as (the user to impersonate)")]
    GroupWithoutUser,
    #[error("--token is empty")]
    EmptyToken,
    #[error("cannot read the prompt from stdin: {0}")]
    PromptStdin(#[source] std::io::Error),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "unknown output format {0:?}; allowed: text, json, yaml, name (the request ids), jsonpath=TEMPLATE"
    )]
    UnknownListOutput(String),
    #[error(transparent)]
    Output(#[from] super::output::FormatError),
}

/// Parses `--timeout` with jiff's duration syntax: its "friendly" format (`90s`, `2m`, `1m30s`,
/// `1h 30m`, `500ms`, `1.5s`, `2 minutes`) or ISO 8601 (`PT1M30S`), plus a bare integer of
/// seconds. Negative and zero durations are refused: they could never be met.
pub fn parse_duration(text: &str) -> Result<Duration, UsageError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(UsageError::EmptyDuration);
    }
    if let Ok(secs) = text.parse::<u64>() {
        return nonzero(Duration::from_secs(secs), text);
    }
    let signed: jiff::SignedDuration =
        text.parse()
            .map_err(|err: jiff::Error| UsageError::InvalidDuration {
                text: text.to_string(),
                reason: err.to_string(),
            })?;
    let duration =
        Duration::try_from(signed).map_err(|_| UsageError::NegativeDuration(text.to_string()))?;
    nonzero(duration, text)
}

/// Parses `--request-timeout` like kubectl: a duration, or `0` for no limit.
pub fn parse_request_timeout(text: &str) -> Result<Duration, UsageError> {
    match text.trim() {
        "0" | "0s" => Ok(Duration::ZERO),
        _ => parse_duration(text),
    }
}

fn nonzero(duration: Duration, text: &str) -> Result<Duration, UsageError> {
    if duration.is_zero() {
        Err(UsageError::ZeroDuration(text.to_string()))
    } else {
        Ok(duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn durations_parse() {
        let ok = [
            ("90s", 90_000),
            ("90", 90_000),
            ("2m", 120_000),
            ("1m30s", 90_000),
            ("500ms", 500),
            ("1h", 3_600_000),
            ("1h2m3s", 3_723_000),
            (" 5s ", 5_000),
            ("1h 30m", 5_400_000),
            ("1.5s", 1_500),
            ("2 minutes", 120_000),
            ("PT1M30S", 90_000),
        ];
        for (text, millis) in ok {
            assert_eq!(
                parse_duration(text).ok(),
                Some(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for bad in ["", "0", "0s", "s", "5x", "-3s", "3s ago", "m5", "1d", "P1D"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn durations_format_like_they_parse() {
        let cases = [
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(3600), "1h"),
            (Duration::ZERO, "0s"),
        ];
        for (duration, text) in cases {
            assert_eq!(format_duration(duration), text);
            if !duration.is_zero() {
                assert_eq!(
                    parse_duration(text).ok(),
                    Some(duration),
                    "round trip {text}"
                );
            }
        }
    }

    #[test]
    fn every_error_has_its_documented_exit_code() {
        let io = || std::io::Error::other("x");
        let cases: Vec<(PluginError, i32)> = vec![
            (
                PluginError::NotFound {
                    name: "x".into(),
                    namespace: "y".into(),
                },
                3,
            ),
            (
                PluginError::NotResumable {
                    name: "x".into(),
                    namespace: "y".into(),
                    why: "COMPLETED".into(),
                },
                4,
            ),
            (
                PluginError::NoWorkspace {
                    name: "x".into(),
                    namespace: "y".into(),
                    why: "w".into(),
                },
                4,
            ),
            (
                PluginError::Timeout {
                    what: "w".into(),
                    waited: Duration::from_secs(1),
                    last_seen: "s".into(),
                },
                5,
            ),
            (
                PluginError::Kubeconfig {
                    path: None,
                    reason: "r".into(),
                },
                6,
            ),
            (
                PluginError::CrdMissing {
                    server: "s".into(),
                    message: "m".into(),
                },
                6,
            ),
            (
                PluginError::ResumeFailed {
                    name: "x".into(),
                    verdict: "v".into(),
                },
                1,
            ),
            (
                PluginError::PromptFailed {
                    name: "x".into(),
                    reason: "r".into(),
                },
                1,
            ),
            (
                PluginError::Exec {
                    action: "a".into(),
                    reason: "r".into(),
                },
                1,
            ),
            (
                PluginError::Io {
                    context: "c".into(),
                    source: io(),
                },
                1,
            ),
            (PluginError::Interrupted("i".into()), 1),
            (
                PluginError::PermissionChoice {
                    name: "x".into(),
                    why: "w".into(),
                },
                2,
            ),
            (
                PluginError::PermissionNotPending {
                    name: "x".into(),
                    namespace: "y".into(),
                    id: "p9".into(),
                    waiting: "p3".into(),
                },
                3,
            ),
            (
                PluginError::AnswerFailed {
                    name: "x".into(),
                    answer: "p3=allow_once".into(),
                    verdict: "was refused".into(),
                },
                1,
            ),
            (
                PluginError::NotResent {
                    name: "x".into(),
                    namespace: "y".into(),
                    pod: "p".into(),
                    what: "w".into(),
                },
                7,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.exit_code().code(), code, "{error}");
            let line = error.to_string();
            assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
            assert!(
                EXIT_CODES_HELP.contains(&format!("  {code}  ")),
                "exit code {code} documented"
            );
        }
        assert_eq!(ExitCode::Usage.code(), 2);
    }

    #[test]
    fn messages_say_what_and_where() {
        let missing = PluginError::NotFound {
            name: "x".into(),
            namespace: "y".into(),
        };
        assert_eq!(
            missing.to_string(),
            r#"tasksession "x" not found in namespace "y""#
        );
        let timeout = PluginError::Timeout {
            what: "the operator to handle resume request \"t\"".into(),
            waited: Duration::from_secs(90),
            last_seen: "state WAITING_FOR_INPUT".into(),
        };
        assert_eq!(
            timeout.to_string(),
            "timed out after 1m30s waiting for the operator to handle resume request \"t\"; last seen: state WAITING_FOR_INPUT"
        );
    }
}
