//! `kubectl kandev permissions`, `approve` and `deny`: the agent's permission requests that wait
//! for a person (TaskSession `status.pendingPermissions`), and their answer, the annotation
//! [`PERMISSION_ANSWER_ANNOTATION`] = `<id>=<option kind>`, which the operator relays to
//! agentctl once per value.
//!
//! The pure rules first — which request an answer is for ([`choose_request`]), which option kind
//! it chooses ([`option_kind`], [`offered`]), the value it writes ([`answer_value`]), how a
//! waited answer ended ([`answer_outcome`]), the table ([`PermissionsView`]) — then the commands.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde::Serialize;
use tokio::time::Instant;

use super::cli::{AnswerArgs, ListOutput, PermissionsArgs};
use super::cluster::{Cluster, Deadline};
use super::error::{ExitCode, PluginError};
use super::watch::{Progress, SessionWatch};
use super::{print_object, write_stderr, write_stdout};
use crate::api::conditions::{self, AWAITING_APPROVAL};
use crate::api::{PERMISSION_ANSWER_ANNOTATION, PendingPermission, ToolKind};

// ------------------------------------------------------------------------------------------
// the rules (pure)

/// Which of the two commands answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Deny,
}

impl Verdict {
    pub fn verb(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Deny => "deny",
        }
    }
}

/// The option kind an answer chooses: `allow_once`/`allow_always` (approve) or
/// `reject_once`/`reject_always` (deny).
pub fn option_kind(verdict: Verdict, always: bool) -> &'static str {
    match (verdict, always) {
        (Verdict::Approve, false) => "allow_once",
        (Verdict::Approve, true) => "allow_always",
        (Verdict::Deny, false) => "reject_once",
        (Verdict::Deny, true) => "reject_always",
    }
}

/// Why no request could be chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChoiceError {
    /// No id given, and nothing waits.
    NoneWaits,
    /// No id given, and several wait (their ids).
    Several(Vec<String>),
    /// The id given does not wait; what does.
    NotPending { id: String, waiting: Vec<String> },
}

/// The request an answer is for: the one named `id`, or without an id the only one that waits.
pub fn choose_request<'a>(
    pending: &'a [PendingPermission],
    id: Option<&str>,
) -> Result<&'a PendingPermission, ChoiceError> {
    let ids = || pending.iter().map(|p| p.id.clone()).collect::<Vec<_>>();
    match id {
        Some(id) => pending
            .iter()
            .find(|p| p.id == id)
            .ok_or_else(|| ChoiceError::NotPending {
                id: id.to_string(),
                waiting: ids(),
            }),
        None => match pending {
            [] => Err(ChoiceError::NoneWaits),
            [only] => Ok(only),
            _ => Err(ChoiceError::Several(ids())),
        },
    }
}

/// The option kinds `request` offers, in its order.
pub fn offered(request: &PendingPermission) -> Vec<&str> {
    request.options.iter().map(|o| o.kind.as_str()).collect()
}

/// `t3b9qk-2=allow_once`: the annotation's value for an answer (the operator handles each value once;
/// agentctl's request ids are unique per pod, so an earlier value never names a new request).
pub fn answer_value(id: &str, kind: &str) -> String {
    format!("{id}={kind}")
}

/// How an answered request ended, as far as the session's status and Events tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AnswerOutcome {
    /// The agent got an allow option (Event `PermissionApproved`).
    Approved,
    /// The agent got a reject option (Event `PermissionRejected`).
    Rejected,
    /// The operator relayed the answer and the request no longer waits (its Event was not seen).
    Answered,
    /// The operator refused the answer (Event `PermissionAnswerRefused`).
    Refused,
    /// Nobody answered within the askTimeout: rejected before the answer arrived.
    TimedOut,
    /// The agent or its pod went while the request waited.
    Gone,
    /// Too many requests waited; this one was rejected.
    Overflow,
    /// The request no longer waits, and the operator had not relayed this answer.
    Ended,
}

impl AnswerOutcome {
    /// Whether the agent got the answer asked for (`kind`: the option kind chosen).
    pub fn succeeded(self, kind: &str) -> bool {
        match self {
            Self::Approved => kind.starts_with("allow"),
            Self::Rejected => kind.starts_with("reject"),
            Self::Answered => true,
            _ => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Answered => "answered",
            Self::Refused => "refused",
            Self::TimedOut => "timed out",
            Self::Gone => "gone",
            Self::Overflow => "overflow",
            Self::Ended => "ended",
        }
    }
}

/// An Event about the session, as far as an answer's outcome needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenEvent {
    pub name: String,
    /// How often it occurred (a repeat joins the first one's series).
    pub count: i32,
    pub reason: String,
    pub message: String,
}

/// What each Event had occurred before the answer was set: later occurrences are its news.
pub type Baseline = HashMap<String, i32>;

pub fn baseline(events: &[SeenEvent]) -> Baseline {
    events.iter().map(|e| (e.name.clone(), e.count)).collect()
}

/// The Events new since `baseline`: not there yet, or occurred again since.
pub fn news<'a>(baseline: &Baseline, events: &'a [SeenEvent]) -> Vec<&'a SeenEvent> {
    events
        .iter()
        .filter(|e| baseline.get(&e.name).is_none_or(|count| e.count > *count))
        .collect()
}

/// How the answer `<id>=<kind>` ended, once it did: a refusal naming it or the request's end
/// among the `news` decide; otherwise, once the request no longer waits and the wait `settled`
/// (its Event had time to come), whether the operator relayed the answer (`handled` is the
/// `value` written). `None`: not yet.
pub fn answer_outcome(
    id: &str,
    kind: &str,
    value: &str,
    still_pending: bool,
    handled: Option<&str>,
    news: &[&SeenEvent],
    settled: bool,
) -> Option<(AnswerOutcome, String)> {
    let named = format!(" {id}={kind} ");
    if let Some(refusal) = news.iter().find(|e| {
        e.reason == "PermissionAnswerRefused" && format!("{} ", e.message).contains(&named)
    }) {
        return Some((AnswerOutcome::Refused, refusal.message.clone()));
    }
    let request = format!(" request {id}: ");
    let listed = [format!(": {id} "), format!(", {id} ")];
    let ended = news.iter().find_map(|e| {
        let outcome = match e.reason.as_str() {
            "PermissionApproved" => AnswerOutcome::Approved,
            "PermissionRejected" => AnswerOutcome::Rejected,
            "PermissionTimedOut" => AnswerOutcome::TimedOut,
            "PermissionOverflow" => AnswerOutcome::Overflow,
            "PermissionGone" => AnswerOutcome::Gone,
            _ => return None,
        };
        let names_it = e.message.contains(&request)
            || (outcome == AnswerOutcome::Gone && listed.iter().any(|l| e.message.contains(l)));
        names_it.then(|| (outcome, e.message.clone()))
    });
    if ended.is_some() {
        return ended;
    }
    if still_pending || !settled {
        return None;
    }
    Some(if handled == Some(value) {
        (
            AnswerOutcome::Answered,
            format!("the operator relayed {id}={kind}; request {id} no longer waits"),
        )
    } else {
        (
            AnswerOutcome::Ended,
            format!(
                "request {id} no longer waits, and the operator had not relayed this answer (it timed out, was answered otherwise, or went with the agent)"
            ),
        )
    })
}

/// `35s`, `4m10s`, `2h`, `3d`: how long ago, as kubectl's AGE column says it.
pub fn human_age(secs: i64) -> String {
    let secs = secs.max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => match s % 60 {
            0 => format!("{m}m"),
            rest => format!("{m}m{rest}s"),
        },
        s if s < 3 * 3600 => format!("{m}m"),
        s if s < 8 * 3600 => match m % 60 {
            0 => format!("{h}h"),
            rest => format!("{h}h{rest}m"),
        },
        s if s < 48 * 3600 => format!("{h}h"),
        s if s < 8 * 86_400 => match h % 24 {
            0 => format!("{d}d"),
            rest => format!("{d}d{rest}h"),
        },
        _ => format!("{d}d"),
    }
}

/// The age of a request asked at `requested_at` (RFC 3339); `?` when it does not parse.
pub fn age(requested_at: &str, now: jiff::Timestamp) -> String {
    requested_at.parse::<jiff::Timestamp>().map_or_else(
        |_| "?".to_string(),
        |at| human_age(now.duration_since(at).as_secs()),
    )
}

/// Longest title shown in the table (`-o yaml` has it whole).
const TITLE_COLUMN_MAX: usize = 60;

/// One table cell: on one line, at most `max` characters.
fn cell(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.chars().count() <= max {
        line
    } else {
        let kept: String = line.chars().take(max.saturating_sub(1)).collect();
        format!("{kept}…")
    }
}

/// What `permissions` prints (and `-o json|yaml` emits).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionsView {
    pub name: String,
    pub namespace: String,
    /// The AwaitingApproval condition is True.
    pub awaiting_approval: bool,
    /// The requests that wait, oldest first (status.pendingPermissions).
    pub pending_permissions: Vec<PendingPermission>,
}

impl PermissionsView {
    /// The table: ID, KIND, TITLE, OPTIONS, AGE; a sentence when nothing waits.
    pub fn table(&self, now: jiff::Timestamp) -> String {
        if self.pending_permissions.is_empty() {
            return format!("tasksession {:?}: no permission requests wait\n", self.name);
        }
        let mut rows = vec![["ID", "KIND", "TITLE", "OPTIONS", "AGE"].map(String::from)];
        for p in &self.pending_permissions {
            rows.push([
                cell(&p.id, 32),
                p.tool_kind.to_string(),
                cell(&p.title, TITLE_COLUMN_MAX),
                cell(&offered(p).join(","), 80),
                age(&p.requested_at, now),
            ]);
        }
        let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..4).map(width).collect();
        let mut out = String::new();
        for row in &rows {
            for (i, value) in row.iter().enumerate() {
                if i < 4 {
                    let pad = widths[i] - value.chars().count();
                    out.push_str(value);
                    out.push_str(&" ".repeat(pad + 3));
                } else {
                    out.push_str(value);
                }
            }
            out.push('\n');
        }
        out
    }

    /// `-o name`: the ids, one a line.
    pub fn names(&self) -> String {
        self.pending_permissions
            .iter()
            .map(|p| format!("{}\n", p.id))
            .collect()
    }
}

/// What `approve`/`deny` prints (and `-o json` emits).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnswerReport {
    pub name: String,
    pub namespace: String,
    /// The request's id.
    pub request: String,
    pub tool_kind: ToolKind,
    pub title: String,
    /// The option kind chosen.
    pub option_kind: String,
    /// The annotation's value set.
    pub annotation: String,
    /// Whether the request ended (always false without `--wait`).
    pub handled: bool,
    /// `approved`, `rejected`, `answered`, `refused`, `timedOut`, `gone`, `overflow`, `ended`;
    /// `null` while not handled.
    pub outcome: Option<AnswerOutcome>,
    pub succeeded: Option<bool>,
    pub message: Option<String>,
}

impl AnswerReport {
    pub fn text(&self) -> String {
        let name = &self.name;
        let what = format!(
            "permission request {} ({} \"{}\")",
            self.request,
            self.tool_kind,
            cell(&self.title, TITLE_COLUMN_MAX)
        );
        let Some(outcome) = self.outcome else {
            return format!(
                "tasksession {name:?}: {what} answered {}: {PERMISSION_ANSWER_ANNOTATION}={}; the operator relays it to the agent\n",
                self.option_kind, self.annotation
            );
        };
        let headline = match outcome {
            AnswerOutcome::Approved | AnswerOutcome::Rejected | AnswerOutcome::Answered
                if outcome.succeeded(&self.option_kind) =>
            {
                format!("the agent got {}", self.option_kind)
            }
            AnswerOutcome::Approved => "the agent got an allow option, not this answer".into(),
            AnswerOutcome::Rejected => "the agent got a reject option, not this answer".into(),
            AnswerOutcome::Refused => "the answer was REFUSED".into(),
            AnswerOutcome::TimedOut => "it TIMED OUT before the answer arrived".into(),
            AnswerOutcome::Gone => "it went with the agent before the answer arrived".into(),
            AnswerOutcome::Overflow => "it was rejected: too many requests waited".into(),
            _ => "it ended without this answer".into(),
        };
        let mut out = format!("tasksession {name:?}: {what}: {headline}\n");
        let mut rows = vec![
            (
                "answer",
                format!("{PERMISSION_ANSWER_ANNOTATION}={}", self.annotation),
            ),
            ("outcome", outcome.as_str().to_string()),
        ];
        if let Some(message) = self.message.as_ref().filter(|m| !m.is_empty()) {
            rows.push(("message", message.clone()));
        }
        for (key, value) in rows {
            out.push_str(&format!("  {:<9}{value}\n", format!("{key}:")));
        }
        out
    }
}

// ------------------------------------------------------------------------------------------
// the commands

/// `kubectl kandev permissions`.
pub(super) async fn permissions(
    cluster: &Cluster,
    args: PermissionsArgs,
) -> Result<ExitCode, PluginError> {
    let snapshot = cluster.snapshot(&args.session).await?;
    let status = snapshot.status();
    let view = PermissionsView {
        name: snapshot.name(),
        namespace: cluster.namespace.clone(),
        awaiting_approval: conditions::is_true(&status.conditions, AWAITING_APPROVAL),
        pending_permissions: status.pending_permissions,
    };
    match &args.output {
        ListOutput::Name => write_stdout(&view.names())?,
        ListOutput::Format(format) => print_object(&view, format, || {
            if !view.pending_permissions.is_empty() {
                let ns = &view.namespace;
                let name = &view.name;
                write_stderr(&format!(
                    "answer with: kubectl kandev approve {name} ID -n {ns} (or deny); -o yaml shows what each tool would do\n"
                ));
            }
            view.table(jiff::Timestamp::now())
        })?,
    }
    Ok(ExitCode::Ok)
}

/// How often the Events are read while an answer is awaited.
const EVENTS_EVERY: Duration = Duration::from_secs(2);
/// Once the request no longer waits: how long its Event may take to show, read how often.
const SETTLE: Duration = Duration::from_secs(3);
const SETTLE_EVERY: Duration = Duration::from_millis(500);

/// `kubectl kandev approve` and `deny`: checks the request and the option, sets the annotation
/// and with `--wait` reports how the request ended.
pub(super) async fn answer(
    cluster: &Cluster,
    args: AnswerArgs,
    verdict: Verdict,
) -> Result<ExitCode, PluginError> {
    let snapshot = cluster.snapshot(&args.session).await?;
    let name = snapshot.name();
    let namespace = cluster.namespace.clone();
    let status = snapshot.status();
    let request = choose_request(&status.pending_permissions, args.id.as_deref())
        .map_err(|error| choice_error(error, &name, &namespace, verdict))?
        .clone();
    let kind = option_kind(verdict, args.always);
    let kinds = offered(&request);
    if !kinds.contains(&kind) {
        let offers = if kinds.is_empty() {
            "nothing".to_string()
        } else {
            kinds.join(", ")
        };
        let instead = if args.always {
            " (try without --always)"
        } else {
            ""
        };
        return Err(PluginError::PermissionChoice {
            name,
            why: format!(
                "permission request {} offers no {kind} option (it offers: {offers}){instead}; nothing was set",
                request.id
            ),
        });
    }
    let value = answer_value(&request.id, kind);
    let baseline = if args.wait {
        match session_events(cluster, &snapshot).await {
            Ok(events) => Some(baseline(&events)),
            Err(error) => {
                say!(
                    "kubectl-kandev: cannot read the Events of tasksession {name:?} ({}); a refused answer will show as a timeout",
                    cluster.kube_error("listing events", error)
                );
                None
            }
        }
    } else {
        None
    };
    cluster.set_permission_answer(&name, &value).await?;
    let mut report = AnswerReport {
        name: name.clone(),
        namespace,
        request: request.id.clone(),
        tool_kind: request.tool_kind,
        title: request.title.clone(),
        option_kind: kind.to_string(),
        annotation: value.clone(),
        handled: false,
        outcome: None,
        succeeded: None,
        message: None,
    };
    if !args.wait {
        print_object(&report, &args.output, || report.text())?;
        return Ok(ExitCode::Ok);
    }
    let progress = Progress::for_output(&args.output);
    let deadline = Deadline::after(args.timeout);
    let (outcome, message) = await_answer(
        cluster,
        &snapshot,
        (&request.id, kind, &value),
        baseline,
        deadline,
        progress,
    )
    .await?;
    let succeeded = outcome.succeeded(kind);
    report.handled = true;
    report.outcome = Some(outcome);
    report.succeeded = Some(succeeded);
    report.message = Some(message.clone());
    print_object(&report, &args.output, || report.text())?;
    if succeeded {
        return Ok(ExitCode::Ok);
    }
    Err(PluginError::AnswerFailed {
        name,
        answer: value.trim_end().to_string(),
        verdict: match outcome {
            AnswerOutcome::Refused => format!("was refused: {message}"),
            _ => format!("did not reach the agent ({}): {message}", outcome.as_str()),
        },
    })
}

fn choice_error(error: ChoiceError, name: &str, namespace: &str, verdict: Verdict) -> PluginError {
    let verb = verdict.verb();
    match error {
        ChoiceError::NoneWaits => PluginError::PermissionChoice {
            name: name.to_string(),
            why: "no permission requests wait (status.pendingPermissions is empty); nothing to answer"
                .to_string(),
        },
        ChoiceError::Several(ids) => PluginError::PermissionChoice {
            name: name.to_string(),
            why: format!(
                "{} permission requests wait ({}); name one: kubectl kandev {verb} {name} ID -n {namespace}",
                ids.len(),
                ids.join(", ")
            ),
        },
        ChoiceError::NotPending { id, waiting } => PluginError::PermissionNotPending {
            name: name.to_string(),
            namespace: namespace.to_string(),
            id,
            waiting: if waiting.is_empty() {
                "none".to_string()
            } else {
                waiting.join(", ")
            },
        },
    }
}

/// The Events about the session (the operator writes them with `events.k8s.io/v1`; the core
/// API serves the same objects, with a field selector on the object they regard).
async fn session_events(
    cluster: &Cluster,
    snapshot: &super::status::Snapshot,
) -> Result<Vec<SeenEvent>, kube::Error> {
    let name = snapshot.name();
    let uid = snapshot.session.metadata.uid.clone();
    let api: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let selector = format!("involvedObject.name={name},involvedObject.kind=TaskSession");
    let list = api.list(&ListParams::default().fields(&selector)).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| {
            uid.is_none() || e.involved_object.uid.is_none() || e.involved_object.uid == uid
        })
        .map(|e| SeenEvent {
            count: e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1),
            name: e.metadata.name.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
        })
        .collect())
}

/// `--wait`: until the request no longer waits or the answer is refused ([`answer_outcome`]),
/// following the session with watches and reading its Events (when `baseline` could be read).
async fn await_answer(
    cluster: &Cluster,
    first: &super::status::Snapshot,
    (id, kind, value): (&str, &str, &str),
    baseline: Option<Baseline>,
    deadline: Deadline,
    mut progress: Progress,
) -> Result<(AnswerOutcome, String), PluginError> {
    let name = first.name();
    let what = format!("tasksession {name:?} to take the answer {id}={kind}");
    let mut snapshot = first.clone();
    let mut watch = SessionWatch::start(cluster, &snapshot);
    let mut settle_at: Option<Instant> = None;
    let mut baseline = baseline;
    loop {
        let events = match &baseline {
            Some(_) => match session_events(cluster, &snapshot).await {
                Ok(events) => events,
                Err(error) => {
                    tracing::debug!(%error, "reading the session's Events failed; going on without them");
                    baseline = None;
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        let news = baseline
            .as_ref()
            .map(|b| news(b, &events))
            .unwrap_or_default();
        let status = snapshot.status();
        let still_pending = status.pending_permissions.iter().any(|p| p.id == id);
        let handled = snapshot.executor_status().handled_permission_answer;
        if !still_pending && settle_at.is_none() {
            settle_at = Some(Instant::now() + SETTLE);
        }
        let settled = settle_at.is_some_and(|at| Instant::now() >= at)
            || (baseline.is_none() && handled.as_deref() == Some(value));
        if let Some(outcome) = answer_outcome(
            id,
            kind,
            value,
            still_pending,
            handled.as_deref(),
            &news,
            settled,
        ) {
            return Ok(outcome);
        }
        progress.begin(&what, deadline.total);
        progress.at(&snapshot);
        let poll = Instant::now()
            + match settle_at {
                Some(_) => SETTLE_EVERY,
                None => EVENTS_EVERY,
            };
        tokio::select! {
            next = watch.changed() => snapshot = next?,
            () = tokio::time::sleep_until(poll) => {
                if let Some(current) = watch.current() {
                    snapshot = current?;
                }
            }
            () = tokio::time::sleep_until(deadline.at) => {
                let request = if still_pending { "still waits" } else { "no longer waits" };
                let operator = if handled.as_deref() == Some(value) {
                    "the operator relayed the answer"
                } else {
                    "the operator has not handled the answer: is kandev-operator running?"
                };
                return Err(PluginError::Timeout {
                    what,
                    waited: deadline.total,
                    last_seen: format!("{}; request {id} {request}; {operator}", snapshot.last_seen()),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PermissionOption;
    use pretty_assertions::assert_eq;

    fn request(id: &str, kinds: &[&str]) -> PendingPermission {
        PendingPermission {
            id: id.into(),
            tool_kind: ToolKind::Execute,
            title: "Run make test".into(),
            summary: r#"{"command":"make test"}"#.into(),
            options: kinds
                .iter()
                .map(|k| PermissionOption {
                    id: format!("opt-{k}"),
                    kind: (*k).into(),
                })
                .collect(),
            requested_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    const ALL: &[&str] = &["allow_once", "allow_always", "reject_once", "reject_always"];

    #[test]
    fn the_request_an_answer_is_for() {
        let one = vec![request("p2", ALL)];
        let two = vec![request("p2", ALL), request("p3", ALL)];
        let chosen = |pending: &[PendingPermission], id: Option<&str>| {
            choose_request(pending, id).map(|p| p.id.clone())
        };
        type Row<'a> = (
            &'a [PendingPermission],
            Option<&'a str>,
            Result<String, ChoiceError>,
        );
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            (&one, None, Ok("p2".into())),
            (&one, Some("p2"), Ok("p2".into())),
            (&two, Some("p3"), Ok("p3".into())),
            (&[], None, Err(ChoiceError::NoneWaits)),
            (&two, None, Err(ChoiceError::Several(vec!["p2".into(), "p3".into()]))),
            (&one, Some("p9"), Err(ChoiceError::NotPending { id: "p9".into(), waiting: vec!["p2".into()] })),
            (&[], Some("p1"), Err(ChoiceError::NotPending { id: "p1".into(), waiting: vec![] })),
        ];
        for (pending, id, expected) in rows {
            assert_eq!(chosen(pending, id), expected, "{id:?}");
        }
    }

    #[test]
    fn option_kinds_of_the_verbs() {
        assert_eq!(option_kind(Verdict::Approve, false), "allow_once");
        assert_eq!(option_kind(Verdict::Approve, true), "allow_always");
        assert_eq!(option_kind(Verdict::Deny, false), "reject_once");
        assert_eq!(option_kind(Verdict::Deny, true), "reject_always");
        for (verdict, always) in [(Verdict::Approve, false), (Verdict::Deny, true)] {
            assert!(crate::api::OPTION_KINDS.contains(&option_kind(verdict, always)));
        }
        let partial = request("p2", &["allow_once", "reject_once"]);
        assert_eq!(offered(&partial), ["allow_once", "reject_once"]);
        assert!(!offered(&partial).contains(&option_kind(Verdict::Approve, true)));
    }

    #[test]
    fn answer_values_parse() {
        for (id, kind) in [("p3", "allow_once"), ("7f5f002d32-1", "reject_always")] {
            let value = answer_value(id, kind);
            assert_eq!(
                crate::api::parse_answer(&value),
                Ok((id.to_string(), kind.to_string()))
            );
        }
    }

    fn event(name: &str, count: i32, reason: &str, message: &str) -> SeenEvent {
        SeenEvent {
            name: name.into(),
            count,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn only_events_since_the_answer_count() {
        let before = vec![
            event("a", 1, "PermissionRequested", "x"),
            event("b", 2, "PermissionAnswerRefused", "y"),
        ];
        let base = baseline(&before);
        let after = vec![
            event("a", 1, "PermissionRequested", "x"),
            event("b", 3, "PermissionAnswerRefused", "y"),
            event("c", 1, "PermissionApproved", "z"),
        ];
        let names: Vec<&str> = news(&base, &after)
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(names, ["b", "c"]);
    }

    #[test]
    fn how_an_answer_ended() {
        use AnswerOutcome as O;
        let refused = event(
            "r",
            1,
            "PermissionAnswerRefused",
            "permission answer p2=allow_once refused: no request p2 waits (it was answered already, timed out, or went with the agent); waiting now: none",
        );
        let refused_other = event(
            "r2",
            1,
            "PermissionAnswerRefused",
            "permission answer p12=allow_once refused: no request p12 waits",
        );
        let by_agentctl = event(
            "r3",
            1,
            "PermissionAnswerRefused",
            "permission answer p2=allow_once refused by agentctl: no permission request p2 waits",
        );
        let approved = event(
            "e",
            1,
            "PermissionApproved",
            "execute request p2: approved (answered allow_once through the API server)",
        );
        let timed_out = event(
            "t",
            1,
            "PermissionTimedOut",
            "execute request p2: timedOut (nobody answered within askTimeout (900s))",
        );
        let gone = event(
            "g",
            1,
            "PermissionGone",
            "2 permission request(s) went with the agent (pod lost): p1 execute \"a\", p2 execute \"b\"",
        );
        let other_request = event(
            "o",
            1,
            "PermissionApproved",
            "execute request p22: approved (answered allow_once through the API server)",
        );
        let value = "p2=allow_once";
        let handled = Some(value);
        // (still pending, handled, news, settled) → outcome
        type Row<'a> = (bool, Option<&'a str>, Vec<&'a SeenEvent>, bool, Option<O>);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            // Waiting, nothing new: not yet.
            (true, None, vec![], false, None),
            (true, handled, vec![], true, None),
            // A refusal naming the answer decides, also while the request still waits.
            (true, handled, vec![&refused], false, Some(O::Refused)),
            (true, handled, vec![&by_agentctl], false, Some(O::Refused)),
            // Another request's refusal or end does not.
            (true, handled, vec![&refused_other, &other_request], false, None),
            // The request's end.
            (false, handled, vec![&approved], false, Some(O::Approved)),
            (false, Some("p1=reject_once"), vec![&timed_out], false, Some(O::TimedOut)),
            (false, None, vec![&gone], false, Some(O::Gone)),
            // No Event (yet): once settled, whether the operator relayed it.
            (false, handled, vec![], false, None),
            (false, handled, vec![], true, Some(O::Answered)),
            (false, Some("p1=allow_once"), vec![], true, Some(O::Ended)),
        ];
        for (pending, handled, news, settled, expected) in rows {
            let got = answer_outcome("p2", "allow_once", value, pending, handled, &news, settled)
                .map(|(o, _)| o);
            assert_eq!(
                got, expected,
                "pending={pending} handled={handled:?} settled={settled} {news:?}"
            );
        }
        assert!(O::Approved.succeeded("allow_once"));
        assert!(!O::Approved.succeeded("reject_once"));
        assert!(O::Rejected.succeeded("reject_always"));
        assert!(O::Answered.succeeded("reject_once"));
        for failed in [O::Refused, O::TimedOut, O::Gone, O::Overflow, O::Ended] {
            assert!(!failed.succeeded("allow_once"), "{failed:?}");
        }
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (secs, text) in [
            (-5, "0s"),
            (0, "0s"),
            (35, "35s"),
            (119, "119s"),
            (120, "2m"),
            (250, "4m10s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 5, "3h5m"),
            (30 * 3600, "30h"),
            (50 * 3600, "2d2h"),
            (9 * 86_400, "9d"),
        ] {
            assert_eq!(human_age(secs), text, "{secs}");
        }
        let now: jiff::Timestamp = "2026-01-01T00:01:30Z".parse().expect("now");
        assert_eq!(age("2026-01-01T00:00:00Z", now), "90s");
        assert_eq!(age("yesterday", now), "?");
    }

    #[test]
    fn the_table_and_its_other_forms() {
        let now: jiff::Timestamp = "2026-01-01T00:00:35Z".parse().expect("now");
        let mut long = request("p3", &["allow_once", "reject_once"]);
        long.tool_kind = ToolKind::Fetch;
        long.title = format!("Fetch\n{}", "x".repeat(100));
        let view = PermissionsView {
            name: "demo".into(),
            namespace: "team".into(),
            awaiting_approval: true,
            pending_permissions: vec![request("p2", ALL), long],
        };
        let xs = "x".repeat(53);
        assert_eq!(
            view.table(now),
            format!(
                "\
ID   KIND      TITLE                                                          OPTIONS                                             AGE
p2   execute   Run make test                                                  allow_once,allow_always,reject_once,reject_always   35s
p3   fetch     Fetch {xs}…   allow_once,reject_once                              35s
"
            )
        );
        assert_eq!(view.names(), "p2\np3\n");
        let ids: crate::plugin::output::OutputFormat = "jsonpath={.pendingPermissions[*].id}"
            .parse()
            .expect("template");
        let value = serde_json::to_value(&view).expect("json");
        assert_eq!(
            crate::plugin::output::render(&value, &ids).expect("render"),
            Some("p2 p3".to_string()),
            "the example of -o's help"
        );
        let json = serde_json::to_value(&view).expect("json");
        assert_eq!(json["awaitingApproval"], true);
        assert_eq!(json["pendingPermissions"][0]["id"], "p2");
        assert_eq!(json["pendingPermissions"][0]["toolKind"], "execute");
        assert_eq!(
            json["pendingPermissions"][0]["options"][0],
            serde_json::json!({"id": "opt-allow_once", "kind": "allow_once"})
        );
        let empty = PermissionsView {
            pending_permissions: vec![],
            awaiting_approval: false,
            ..view
        };
        assert_eq!(
            empty.table(now),
            "tasksession \"demo\": no permission requests wait\n"
        );
        assert_eq!(empty.names(), "");
    }

    #[test]
    fn answer_reports() {
        let mut report = AnswerReport {
            name: "demo".into(),
            namespace: "team".into(),
            request: "p2".into(),
            tool_kind: ToolKind::Execute,
            title: "Run make test".into(),
            option_kind: "allow_once".into(),
            annotation: "p2=allow_once".into(),
            handled: false,
            outcome: None,
            succeeded: None,
            message: None,
        };
        assert_eq!(
            report.text(),
            "tasksession \"demo\": permission request p2 (execute \"Run make test\") answered allow_once: kandev.dev/permission-answer=p2=allow_once; the operator relays it to the agent\n"
        );
        report.handled = true;
        report.outcome = Some(AnswerOutcome::Approved);
        report.succeeded = Some(true);
        report.message = Some(
            "execute request p2: approved (answered allow_once through the API server)".into(),
        );
        assert_eq!(
            report.text(),
            "\
tasksession \"demo\": permission request p2 (execute \"Run make test\"): the agent got allow_once
  answer:  kandev.dev/permission-answer=p2=allow_once
  outcome: approved
  message: execute request p2: approved (answered allow_once through the API server)
"
        );
        report.outcome = Some(AnswerOutcome::Refused);
        assert!(
            report.text().contains("the answer was REFUSED"),
            "{}",
            report.text()
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["outcome"], "refused");
        assert_eq!(json["optionKind"], "allow_once");
        assert_eq!(json["annotation"], "p2=allow_once");
    }
}
