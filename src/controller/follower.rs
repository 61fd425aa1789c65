//! Follows `agentctl events` of the running agentctl pods (over exec) and records what the agent
//! does in ExecutorRunning status: the resume token on session-created and prompt-finished,
//! the agent's last message id (`lastMessageUUID`, for agents that send ACP `messageId`s),
//! whether a prompt is in flight, and the journal cursor. The TaskSession reconcile (which
//! watches ExecutorRunning) turns that into RUNNING ↔ WAITING_FOR_INPUT.
//!
//! agentctl journals every event on the workspace volume (DESIGN §3 "Event journal"), so a
//! follower catches up with `agentctl events --since <journalCursor>` and holds its exec stream
//! only while the agent works: once the agent is idle it ends, and an idle session costs the API
//! server nothing. A follower starts when a launch leaves the agent working (a launch that leaves
//! it idle counts as a catch-up: its restore was the contact), when a client nudges it
//! (annotation [`PROMPTED_ANNOTATION`], which `kubectl kandev prompt` sets after it sent a
//! prompt), and, only where `--journal-catch-up-seconds` asks for it, periodically, for prompts
//! from clients that do not nudge. An operator that starts beside running pods reads the journal
//! of those whose agent was working and of those with a nudge not yet handled
//! (`handledPromptedAt`), at the pace of the [`ExecGate`]; an idle, caught-up session costs no
//! exec and no API request. A dropped stream reconnects with backoff.
//!
//! Lines are read as [`EventLine`]s, the type agentctl writes them with
//! ([`crate::api::pod_contract::events`]).
//!
//! Only changes are written: each follower remembers what ExecutorRunning holds, so replayed
//! entries, the snapshot and repeated lines cost no API call. An entry at or below the cursor
//! (an older launch's, or one applied already) changes nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, AttachParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;
use tokio::io::BufReader;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

pub use crate::api::PROMPTED_ANNOTATION;
use crate::api::bounds::{
    AGENT_NAME_MAX, AGENT_TEXT_MAX, NUDGE_MAX, SESSION_ID_MAX, cap, session_id_problem,
};
use crate::api::pod_contract::events::{Event, EventLine};
use crate::api::{
    AgentActivity, ExecutorPhase, ExecutorRunning, ExecutorRunningStatus, SessionConfigState,
};
use crate::controller::gate::{DEFAULT_EXECS_PER_SECOND, ExecGate};
use crate::jsonrpc::codec::{Frame, LINE_LIMIT, LineReader};
use crate::telemetry::WarnLimiter;

/// The field manager of the followers' ExecutorRunning status writes (what the journal says:
/// activity, token, last message, configuration, cursor, the handled nudge).
pub const JOURNAL_MANAGER: &str = "kandev-operator-journal";

/// While a prompt runs, serve sends a heartbeat every 10 s on the open stream: a stream silent
/// for this long is dropped and opened again, which tells a quiet agent from a serve that does
/// not answer.
pub const LIVE_SILENCE_LIMIT: Duration = Duration::from_secs(35);

/// How followers contact agentctl.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// An idle session's journal is read at least this often (`None`: only when nudged).
    pub catch_up_every: Option<Duration>,
    /// agentctl answers a new `agentctl events` stream (its replay and snapshot) within this,
    /// or the stream counts as dropped (and is opened again after the backoff).
    pub answer_within: Duration,
    /// `agentctl events` execs opened per second, at most, working sessions first (0: no
    /// limit); see [`ExecGate`].
    pub execs_per_second: u32,
}

impl Default for Probe {
    fn default() -> Self {
        Self {
            catch_up_every: None,
            answer_within: Duration::from_secs(30),
            execs_per_second: DEFAULT_EXECS_PER_SECOND,
        }
    }
}

/// The ExecutorRunning fields that events set, as last written, and the journal entry last
/// applied (written with the next change).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Known {
    pub resume_token: Option<String>,
    /// `lastMessageUUID`: the last message id of the session `resume_token` names.
    pub last_message_id: Option<String>,
    pub activity: Option<AgentActivity>,
    pub running: bool,
    pub cursor: u64,
    /// `sessionConfig`: the configuration of the session `resume_token` names.
    pub session_config: Option<SessionConfigState>,
}

impl Known {
    pub fn from_status(status: &ExecutorRunningStatus) -> Self {
        Self {
            resume_token: status.resume_token.clone().filter(|t| !t.is_empty()),
            last_message_id: status.last_message_uuid.clone().filter(|t| !t.is_empty()),
            activity: status.activity,
            running: status.status == Some(ExecutorPhase::Running),
            cursor: status.journal_cursor.unwrap_or(0),
            session_config: status.session_config.clone(),
        }
    }

    fn same_fields(&self, other: &Known) -> bool {
        (
            &self.resume_token,
            &self.last_message_id,
            self.activity,
            self.running,
            &self.session_config,
        ) == (
            &other.resume_token,
            &other.last_message_id,
            other.activity,
            other.running,
            &other.session_config,
        )
    }
}

/// What an event line changes in ExecutorRunning status, given what it holds (`known`): a JSON
/// merge patch of the changed fields (with the journal cursor) and what the status holds after
/// it; `None` when nothing changes. A journal entry at or below the cursor changes nothing; the
/// snapshot (the current state) always counts.
pub fn status_patch_for(
    line: &EventLine,
    known: &Known,
    now: Timestamp,
) -> Option<(serde_json::Value, Known)> {
    let next = known_after(line, known)?;
    if next.same_fields(known) {
        return None;
    }
    Some((json!({ "status": changed_fields(known, &next, now) }), next))
}

/// The journal is on the workspace volume, which the agent can write: a session or message id
/// the operator would not keep (too long, control characters) is not applied.
fn keeps(id: &str) -> bool {
    session_id_problem(id).is_none()
}

/// What is known after `line`; `None` when the line changes nothing (an entry already read,
/// one that says nothing about the executor, an id not kept).
fn known_after(line: &EventLine, known: &Known) -> Option<Known> {
    let event = &line.event;
    let is_snapshot = matches!(event, Event::Snapshot { .. });
    if !is_snapshot && line.seq.is_some_and(|seq| seq <= known.cursor) {
        return None;
    }
    let mut next = known.clone();
    match line.seq {
        // The snapshot is the state as of the newest entry (lower than the cursor only if the
        // journal was started over).
        Some(seq) if is_snapshot => next.cursor = seq,
        Some(seq) => next.cursor = next.cursor.max(seq),
        None => {}
    }
    apply_event(event, &mut next)?;
    // A new session starts with its own configuration (its `session_config` event follows).
    if next.resume_token != known.resume_token {
        next.session_config = None;
    }
    // The last message id belongs to the session the token names: a new session starts without
    // one, until the agent reports one.
    match event {
        Event::Snapshot {
            last_message_id: Some(id),
            ..
        }
        | Event::PromptFinished {
            last_message_id: Some(id),
            ..
        } if keeps(id) => next.last_message_id = Some(id.clone()),
        _ if next.resume_token != known.resume_token => next.last_message_id = None,
        _ => {}
    }
    Some(next)
}

/// What `event` says about the executor, into `next`; `None` when it says nothing.
fn apply_event(event: &Event, next: &mut Known) -> Option<()> {
    match event {
        Event::SessionCreated { session_id, .. } | Event::PromptFinished { session_id, .. }
            if !keeps(session_id) =>
        {
            return None;
        }
        Event::Snapshot {
            session_id,
            prompt_active,
            ..
        } => {
            next.running = true;
            next.activity = Some(if *prompt_active {
                AgentActivity::Working
            } else {
                AgentActivity::Idle
            });
            if let Some(id) = session_id.as_ref().filter(|id| keeps(id)) {
                next.resume_token = Some(id.clone());
            }
        }
        Event::SessionCreated { session_id, .. } => {
            next.running = true;
            next.resume_token = Some(session_id.clone());
        }
        Event::PromptStarted { .. } => next.activity = Some(AgentActivity::Working),
        Event::PromptFinished { session_id, .. } => {
            next.activity = Some(AgentActivity::Idle);
            next.resume_token = Some(session_id.clone());
        }
        Event::SessionConfig { session_id, config } => {
            // Only the configuration of the session the token names is kept.
            if next.resume_token.as_ref() != Some(session_id) {
                return None;
            }
            next.session_config = Some(config.clone().bounded());
        }
        Event::ConfigSetBackFailed { .. }
        | Event::Suspended { .. }
        | Event::AgentExited { .. }
        | Event::Heartbeat
        | Event::JournalGap { .. }
        | Event::Other => return None,
    }
    Some(())
}

/// The status fields that differ between `known` and `next`, as a merge patch's `status`.
fn changed_fields(known: &Known, next: &Known, now: Timestamp) -> serde_json::Value {
    let mut status = json!({ "lastSeenAt": Time(now) });
    if next.running != known.running {
        status["status"] = json!(ExecutorPhase::Running);
    }
    if next.activity != known.activity {
        status["activity"] = json!(next.activity);
    }
    if next.resume_token != known.resume_token {
        status["resumeToken"] = json!(next.resume_token);
        status["resumable"] = json!(true);
    }
    if next.last_message_id != known.last_message_id {
        // null removes it (a merge patch).
        status["lastMessageUUID"] = json!(next.last_message_id);
    }
    if next.session_config != known.session_config {
        // Explicit nulls: a merge patch would otherwise keep a mode or model no longer reported.
        status["sessionConfig"] = match &next.session_config {
            Some(config) => json!({
                "mode": config.mode, "model": config.model,
                "configOptions": config.config_options,
            }),
            None => serde_json::Value::Null,
        };
    }
    if next.cursor != known.cursor {
        status["journalCursor"] = json!(next.cursor);
    }
    status
}

/// The followers, by pod UID: the running ones, and when each pod's journal was last read.
pub struct Followers {
    running: Mutex<HashMap<String, JoinHandle<()>>>,
    /// When a follower last started for the pod, and the nudge it started for.
    started: Mutex<HashMap<String, (Instant, Option<String>)>>,
    /// The operator's pod cache: a follower stops when its pod is gone from it.
    pods: Store<Pod>,
    probe: Probe,
    /// Paces the execs of every follower.
    gate: Arc<ExecGate>,
}

impl Followers {
    /// Starts the pacing of the followers' execs (a task for the operator's lifetime).
    pub fn new(pods: Store<Pod>, probe: Probe) -> Self {
        let gate = ExecGate::new(probe.execs_per_second);
        tokio::spawn(gate.clone().run());
        Self {
            running: Mutex::default(),
            started: Mutex::default(),
            pods,
            probe,
            gate,
        }
    }

    /// Reads the pod's journal, and follows it while the agent works, unless a follower runs
    /// already, or one started for the same `nudge` (the session's [`PROMPTED_ANNOTATION`])
    /// and the periodic catch-up is off or not due, or this operator run has not read it yet
    /// and need not ([`reads_at_first_sight`]). `status` is what its ExecutorRunning holds now.
    pub fn ensure(
        &self,
        client: &Client,
        pod: &Pod,
        executor: &str,
        status: &ExecutorRunningStatus,
        nudge: Option<&str>,
    ) {
        let (Some(uid), Some(name), Some(ns)) = (
            pod.metadata.uid.clone(),
            pod.metadata.name.clone(),
            pod.metadata.namespace.clone(),
        ) else {
            return;
        };
        let (Ok(mut running), Ok(mut started)) = (self.running.lock(), self.started.lock()) else {
            return;
        };
        running.retain(|_, handle| !handle.is_finished());
        if running.contains_key(&uid) {
            return;
        }
        let seen = started.get(&uid);
        let first_sight = seen.is_none();
        let skip = match seen {
            Some((at, seen)) => {
                seen.as_deref() == nudge
                    && self
                        .probe
                        .catch_up_every
                        .is_none_or(|every| at.elapsed() < every)
            }
            None => !reads_at_first_sight(status, nudge),
        };
        // The clock of the periodic catch-up (if on) runs from a read, or from the first sight
        // of a pod that needed none; a skip does not restart it.
        if !skip || first_sight {
            started.insert(uid.clone(), (Instant::now(), nudge.map(str::to_string)));
        }
        if skip {
            return;
        }
        // A root of its own, linked to the reconcile that started it: the follower outlives the
        // reconcile, and a child would keep the reconcile's span (and its trace) open.
        let span = info_span!(parent: None, "agentctl.events", pod = %name, namespace = %ns);
        span.follows_from(tracing::Span::current());
        let nudges = Nudges {
            handled: status.handled_prompted_at.clone(),
            current: nudge.map(str::to_string),
        };
        let task = follow(
            client.clone(),
            self.pods.clone(),
            ObjectRef::from_obj(pod),
            executor.to_string(),
            (Known::from_status(status), nudges),
            self.probe.answer_within,
            self.gate.clone(),
        )
        .instrument(span);
        running.insert(uid, tokio::spawn(task));
    }

    /// A launch's restore has just been answered over exec and left the agent idle: the pod's
    /// journal holds nothing the restore's answer did not tell, but the restore's own entries
    /// (the next catch-up applies them, changing nothing but the cursor). So no second exec
    /// now: it is as if a follower had just read the journal for `nudge`.
    pub fn caught_up(&self, pod: &Pod, nudge: Option<&str>) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if let Ok(mut started) = self.started.lock() {
            started.insert(uid, (Instant::now(), nudge.map(str::to_string)));
        }
    }

    /// Keeps only the pods for which `keep(uid)` holds (and whose follower lives).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        if let Ok(mut running) = self.running.lock() {
            running.retain(|uid, handle| {
                let alive = keep(uid) && !handle.is_finished();
                if !alive {
                    handle.abort();
                }
                alive
            });
        }
        if let Ok(mut started) = self.started.lock() {
            started.retain(|uid, _| keep(uid));
        }
    }
}

/// Whether an operator run that has not read a running pod's journal yet reads it now: when its
/// agent was working (its prompt may have finished meanwhile), or when a client nudged it after
/// the last catch-up that reached an idle agent (`handledPromptedAt`). An idle session whose
/// nudges were all handled is not read: an operator that restarts beside thousands of them
/// opens no exec.
pub fn reads_at_first_sight(status: &ExecutorRunningStatus, nudge: Option<&str>) -> bool {
    status.activity == Some(AgentActivity::Working)
        || nudge.is_some_and(|n| status.handled_prompted_at.as_deref() != Some(n))
}

/// The session's nudge ([`PROMPTED_ANNOTATION`]) a follower started for, and the one its
/// ExecutorRunning records as handled.
struct Nudges {
    handled: Option<String>,
    current: Option<String>,
}

impl Nudges {
    /// The patch that records the current nudge as handled, once the journal was read up to an
    /// idle agent (`None`: it is recorded already, or too long to record).
    fn handled_patch(&self) -> Option<serde_json::Value> {
        let current = self.current.as_ref().filter(|n| n.len() <= NUDGE_MAX)?;
        (self.handled.as_ref() != Some(current))
            .then(|| json!({"status": {"handledPromptedAt": current}}))
    }
}

/// How one event stream ended.
enum StreamEnd {
    /// The agent is idle: the journal is caught up and nothing needs following.
    Idle,
    /// The stream ended or broke while the agent worked (or before the snapshot): reconnect.
    Dropped,
}

/// Catches up with the pod's journal and follows it while the agent works; ends when the agent
/// is idle, or when the pod is gone from the cache or stops running. A dropped stream reconnects
/// with exponential backoff (1 s … 30 s), from the cursor: a stream that sends nothing within
/// `answer_within` counts as dropped. Each exec waits for its turn at the `gate`. Once the
/// journal is read up to an idle agent, the nudge it started for is recorded as handled.
async fn follow(
    client: Client,
    cache: Store<Pod>,
    pod: ObjectRef<Pod>,
    executor: String,
    (mut known, nudges): (Known, Nudges),
    answer_within: Duration,
    gate: Arc<ExecGate>,
) {
    let ns = pod.namespace.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let executors: Api<ExecutorRunning> = Api::namespaced(client, &ns);
    let mut backoff = Duration::from_secs(1);
    loop {
        let running = cache.get(&pod).is_some_and(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        if !running {
            info!("pod is gone or not running; stopping the event follower");
            return;
        }
        gate.enter(known.activity == Some(AgentActivity::Working))
            .await;
        let mut answered = false;
        let streamed = stream_events(
            (&pods, &pod.name),
            (&executors, &executor),
            &mut known,
            (answer_within, &mut answered),
        )
        .await;
        match streamed {
            Ok(StreamEnd::Idle) => {
                debug!(cursor = known.cursor, "agent idle; journal caught up");
                if let Some(patch) = nudges.handled_patch()
                    && let Err(err) = executors
                        .patch_status(
                            &executor,
                            &PatchParams::apply(JOURNAL_MANAGER),
                            &Patch::Merge(&patch),
                        )
                        .await
                {
                    warn!(error = %err, "could not record the handled nudge; a restarted operator reads this journal again");
                }
                return;
            }
            Ok(StreamEnd::Dropped) => debug!(answered, "event stream ended"),
            Err(err) => warn!(error = %err, "event stream failed"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn stream_events(
    (pods, pod): (&Api<Pod>, &str),
    (executors, executor): (&Api<ExecutorRunning>, &str),
    known: &mut Known,
    (answer_within, answered): (Duration, &mut bool),
) -> Result<StreamEnd, kube::Error> {
    let params = AttachParams::default()
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let since = known.cursor.to_string();
    // agentctl ends the stream itself once the agent is idle: no process lingers in the pod.
    let command = [
        "agentctl",
        "events",
        "--since",
        since.as_str(),
        "--until-idle",
    ];
    let mut process = pods.exec(pod, command, &params).await?;
    let Some(stdout) = process.stdout() else {
        return Ok(StreamEnd::Dropped);
    };
    // Event lines are small; a longer one means the stream is not what we think it is: it is
    // dropped (never buffered) and the stream is followed again after the backoff.
    let mut lines = LineReader::new(BufReader::new(stdout), LINE_LIMIT);
    let mut warnings = WarnLimiter::default();
    let mut caught_up = false;
    debug!(since = known.cursor, "reading agentctl events");
    loop {
        // The replay and snapshot come at once; then lines, or at least heartbeats, while the
        // agent works.
        let limit = if *answered {
            LIVE_SILENCE_LIMIT
        } else {
            answer_within
        };
        let Ok(next) = tokio::time::timeout(limit, lines.next_line()).await else {
            warn!(?limit, "agentctl sent nothing; dropping the event stream");
            return Ok(StreamEnd::Dropped);
        };
        match next {
            Ok(Frame::Line) => *answered = true,
            Ok(Frame::TooLong { len }) => {
                warn!(
                    len,
                    limit = LINE_LIMIT,
                    "over-long agentctl event line; reconnecting"
                );
                return Ok(StreamEnd::Dropped);
            }
            Ok(Frame::Eof) if caught_up && known.activity != Some(AgentActivity::Working) => {
                return Ok(StreamEnd::Idle);
            }
            Ok(Frame::Eof) | Err(_) => return Ok(StreamEnd::Dropped),
        }
        let Some(line) = parse_line(lines.line(), &mut warnings) else {
            continue;
        };
        apply_line(&line, (executors, executor), known).await?;
        // The snapshot ends the replay; agentctl closes the stream once the agent is idle.
        caught_up |= matches!(line.event, Event::Snapshot { .. });
    }
}

/// One event line; an unreadable one is warned about (rate-limited) and skipped.
fn parse_line(bytes: &[u8], warnings: &mut WarnLimiter) -> Option<EventLine> {
    match serde_json::from_slice::<EventLine>(bytes) {
        Ok(line) => {
            debug!(line = %cap(&format!("{line:?}"), AGENT_TEXT_MAX), "agentctl event");
            Some(line)
        }
        Err(err) => {
            if let Some(suppressed) = warnings.allow() {
                let line = String::from_utf8_lossy(bytes);
                warn!(err = %cap(&err.to_string(), AGENT_TEXT_MAX), suppressed, line = %cap(&line, 200), "unreadable agentctl event");
            }
            None
        }
    }
}

/// What `line` changes in the executor's status, written under [`JOURNAL_MANAGER`]; `known`
/// moves on with it (its cursor at least).
async fn apply_line(
    line: &EventLine,
    (executors, executor): (&Api<ExecutorRunning>, &str),
    known: &mut Known,
) -> Result<(), kube::Error> {
    if let Event::ConfigSetBackFailed {
        session_id,
        method,
        error,
    } = &line.event
    {
        warn!(%executor, session_id = %cap(session_id, SESSION_ID_MAX), method = %cap(method, AGENT_NAME_MAX), code = error.code, message = %cap(&error.message, AGENT_TEXT_MAX), "agentctl could not set the session's saved configuration back after the restore; the restore stands");
    }
    if let Some((patch, next)) = status_patch_for(line, known, Timestamp::now()) {
        executors
            .patch_status(
                executor,
                &PatchParams::apply(JOURNAL_MANAGER),
                &Patch::Merge(&patch),
            )
            .await?;
        *known = next;
    } else if let Some(seq) = line.seq {
        known.cursor = known.cursor.max(seq);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Followers with the default probe and a client of an API server that is not there (a
    /// follower that starts fails its exec and stops with its empty pod cache).
    fn offline_followers() -> (
        Followers,
        Client,
        kube::runtime::reflector::store::Writer<Pod>,
    ) {
        let (store, writer) = kube::runtime::reflector::store::<Pod>();
        let followers = Followers::new(store, Probe::default());
        let url = "http://127.0.0.1:9".parse().expect("url");
        let client = Client::try_from(kube::Config::new(url)).expect("client");
        (followers, client, writer)
    }

    /// A launch that left the agent idle starts no follower; a new nudge still reads the
    /// journal.
    #[tokio::test]
    async fn an_idle_launch_is_a_catch_up_without_an_exec() {
        let (followers, client, _writer) = offline_followers();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"}
        }))
        .expect("pod");
        followers.caught_up(&pod, Some("n1"));
        let status = ExecutorRunningStatus::default();
        followers.ensure(&client, &pod, "er", &status, Some("n1"));
        let running = |uid: &str| followers.running.lock().expect("lock").contains_key(uid);
        assert!(!running("u1"), "no exec for the nudge the launch saw");
        followers.ensure(&client, &pod, "er", &status, Some("n2"));
        assert!(running("u1"), "a new nudge reads the journal");
        followers.retain(|_| false);
    }

    /// (agent working, nudge, handled nudge) → read at first sight
    #[test]
    fn first_sight_reads_only_working_agents_and_unhandled_nudges() {
        #[rustfmt::skip]
        let table: &[(bool, Option<&str>, Option<&str>, bool)] = &[
            (false, None, None, false),
            (false, Some("n1"), Some("n1"), false),
            (false, Some("n2"), Some("n1"), true),
            (false, Some("n1"), None, true),
            (true, None, None, true),
            (true, Some("n1"), Some("n1"), true),
        ];
        for (working, nudge, handled, expected) in table {
            let status = ExecutorRunningStatus {
                activity: Some(if *working {
                    AgentActivity::Working
                } else {
                    AgentActivity::Idle
                }),
                handled_prompted_at: handled.map(String::from),
                ..Default::default()
            };
            assert_eq!(
                reads_at_first_sight(&status, *nudge),
                *expected,
                "{working} {nudge:?} {handled:?}"
            );
        }
        let nudges = |handled: Option<&str>, current: Option<String>| Nudges {
            handled: handled.map(String::from),
            current,
        };
        assert_eq!(
            nudges(Some("n1"), Some("n2".into())).handled_patch(),
            Some(json!({"status": {"handledPromptedAt": "n2"}}))
        );
        assert_eq!(nudges(Some("n1"), Some("n1".into())).handled_patch(), None);
        assert_eq!(nudges(None, None).handled_patch(), None);
        assert_eq!(
            nudges(None, Some("n".repeat(NUDGE_MAX + 1))).handled_patch(),
            None,
            "too long to record: read again after a restart"
        );
    }

    /// An operator that starts beside an idle, caught-up session opens no exec into its pod,
    /// and none later (periodic catch-ups are off by default); a working one is read at once.
    #[tokio::test]
    async fn a_restart_reads_only_the_journals_that_may_hold_news() {
        let (followers, client, _writer) = offline_followers();
        let pod = |uid: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid}
            }))
            .expect("pod")
        };
        let running = |uid: &str| followers.running.lock().expect("lock").contains_key(uid);
        let idle = ExecutorRunningStatus {
            activity: Some(AgentActivity::Idle),
            handled_prompted_at: Some("n1".into()),
            ..Default::default()
        };
        followers.ensure(&client, &pod("idle"), "er", &idle, Some("n1"));
        followers.ensure(&client, &pod("idle"), "er", &idle, Some("n1"));
        assert!(!running("idle"));
        let working = ExecutorRunningStatus {
            activity: Some(AgentActivity::Working),
            ..Default::default()
        };
        followers.ensure(&client, &pod("working"), "er", &working, None);
        assert!(running("working"));
        followers.ensure(&client, &pod("idle"), "er", &idle, Some("n2"));
        assert!(running("idle"), "a new nudge reads the journal");
        followers.retain(|_| false);
    }

    /// What the follower knows of a running, idle agent in session `s1`.
    fn running_idle() -> Known {
        Known {
            resume_token: Some("s1".into()),
            last_message_id: None,
            activity: Some(AgentActivity::Idle),
            running: true,
            cursor: 0,
            session_config: None,
        }
    }

    fn parse(line: &str) -> EventLine {
        serde_json::from_str(line).expect("event parses")
    }

    /// The journal is on the workspace volume, which the agent can write (issue 30): an id the
    /// operator would not keep is not applied, and a configuration keeps its bounds.
    #[test]
    fn hostile_journal_lines_stay_within_bounds() {
        use crate::api::bounds::{CONFIG_ITEMS_MAX, SESSION_ID_MAX};
        let now = Timestamp::from_second(0).expect("ts");
        let known = running_idle();
        let long = "x".repeat(SESSION_ID_MAX + 1);
        for line in [
            format!(r#"{{"event":"session_created","sessionId":"{long}","method":"session/new"}}"#),
            format!(
                r#"{{"event":"prompt_finished","sessionId":"{long}","stopReason":"end_turn"}}"#
            ),
            r#"{"event":"session_created","sessionId":"a\nb","method":"session/new"}"#.to_string(),
            format!(
                r#"{{"event":"snapshot","sessionId":"{long}","promptActive":false,"lastMessageId":"{long}"}}"#
            ),
        ] {
            assert_eq!(status_patch_for(&parse(&line), &known, now), None, "{line}");
        }
        let options: Vec<_> = (0..10_000)
            .map(|n| json!({"id": format!("o{n}"), "value": "true"}))
            .chain([json!({"id": "x", "value": "v".repeat(10_000)})])
            .collect();
        let line = json!({"event": "session_config", "sessionId": "s1",
            "config": {"mode": long, "model": "m", "configOptions": options}});
        let (patch, next) =
            status_patch_for(&parse(&line.to_string()), &known, now).expect("a change");
        let config = next.session_config.expect("a configuration");
        assert_eq!(
            config.mode, None,
            "a mode over the bound is dropped, not cut"
        );
        assert_eq!(config.model.as_deref(), Some("m"));
        assert_eq!(config.config_options.len(), CONFIG_ITEMS_MAX);
        assert_eq!(
            patch["status"]["sessionConfig"]["configOptions"]
                .as_array()
                .map(Vec::len),
            Some(CONFIG_ITEMS_MAX)
        );
    }

    #[test]
    fn events_map_to_executor_status_changes() {
        let now = Timestamp::from_second(0).expect("ts");
        let running_idle = running_idle();
        let at_5 = Known {
            cursor: 5,
            ..running_idle.clone()
        };
        let planning = Known {
            session_config: Some(SessionConfigState {
                mode: Some("plan".into()),
                ..SessionConfigState::default()
            }),
            ..running_idle.clone()
        };
        let cases = [
            (
                Known::default(),
                r#"{"event":"session_created","sessionId":"s1","method":"session/new"}"#,
                Some(json!({"resumeToken":"s1","resumable":true,"status":"Running"})),
            ),
            (
                running_idle.clone(),
                r#"{"event":"prompt_started","sessionId":"s1"}"#,
                Some(json!({"activity":"Working"})),
            ),
            (
                Known {
                    activity: Some(AgentActivity::Working),
                    ..running_idle.clone()
                },
                r#"{"event":"prompt_finished","sessionId":"s2","stopReason":"end_turn"}"#,
                Some(json!({"activity":"Idle","resumeToken":"s2"})),
            ),
            (
                Known::default(),
                r#"{"event":"snapshot","sessionId":null,"promptActive":true}"#,
                Some(json!({"status":"Running","activity":"Working"})),
            ),
            // What the launch already recorded: the opening snapshot writes nothing.
            (
                running_idle.clone(),
                r#"{"event":"snapshot","sessionId":"s1","promptActive":false}"#,
                None,
            ),
            (
                running_idle.clone(),
                r#"{"event":"prompt_finished","sessionId":"s1","stopReason":"end_turn"}"#,
                None,
            ),
            (
                running_idle.clone(),
                r#"{"event":"agent_exited","code":1}"#,
                None,
            ),
            (running_idle.clone(), r#"{"event":"something_new"}"#, None),
            // The agent's message ids: the last one of a prompt, or of the snapshot…
            (
                running_idle.clone(),
                r#"{"event":"prompt_finished","sessionId":"s1","stopReason":"end_turn","lastMessageId":"m-2"}"#,
                Some(json!({"lastMessageUUID":"m-2"})),
            ),
            (
                Known::default(),
                r#"{"event":"snapshot","sessionId":"s1","promptActive":false,"lastMessageId":"m-2"}"#,
                Some(
                    json!({"status":"Running","activity":"Idle","resumeToken":"s1","lastMessageUUID":"m-2"}),
                ),
            ),
            (
                Known {
                    last_message_id: Some("m-2".into()),
                    ..running_idle.clone()
                },
                r#"{"event":"snapshot","sessionId":"s1","promptActive":false,"lastMessageId":"m-2"}"#,
                None,
            ),
            // …and a new session's token drops the old session's id.
            (
                Known {
                    last_message_id: Some("m-2".into()),
                    ..running_idle.clone()
                },
                r#"{"event":"session_created","sessionId":"s9","method":"session/new"}"#,
                Some(json!({"resumeToken":"s9","lastMessageUUID":null})),
            ),
            (
                Known {
                    last_message_id: Some("m-2".into()),
                    ..running_idle.clone()
                },
                r#"{"event":"prompt_finished","sessionId":"s9","stopReason":"end_turn","lastMessageId":"n-1"}"#,
                Some(json!({"resumeToken":"s9","lastMessageUUID":"n-1"})),
            ),
            // The session's configuration, for the session the token names only…
            (
                running_idle.clone(),
                r#"{"event":"session_config","sessionId":"s1","config":{"mode":"plan","configOptions":[{"id":"effort","value":"high"}]}}"#,
                Some(
                    json!({"sessionConfig":{"mode":"plan","model":null,"configOptions":[{"id":"effort","value":"high"}]}}),
                ),
            ),
            (
                running_idle.clone(),
                r#"{"event":"session_config","sessionId":"other","config":{"mode":"plan"}}"#,
                None,
            ),
            (
                planning.clone(),
                r#"{"event":"session_config","sessionId":"s1","config":{"mode":"plan"}}"#,
                None,
            ),
            // …and a new session's token drops the old session's configuration.
            (
                planning.clone(),
                r#"{"event":"session_created","sessionId":"s9","method":"session/new"}"#,
                Some(json!({"resumeToken":"s9","sessionConfig":null})),
            ),
            (
                running_idle.clone(),
                r#"{"event":"config_set_back_failed","sessionId":"s1","method":"session/set_mode","error":{"code":-32603,"message":"no"}}"#,
                None,
            ),
            (running_idle.clone(), r#"{"event":"something_new"}"#, None),
            // serve's own lines: a heartbeat, and the gap before a replay.
            (
                running_idle.clone(),
                r#"{"event":"heartbeat","timestamp":"T"}"#,
                None,
            ),
            (running_idle, r#"{"event":"journal_gap","since":3}"#, None),
            // The journal: an entry applied already (or an older launch's) changes nothing…
            (
                at_5.clone(),
                r#"{"seq":5,"event":"prompt_started","sessionId":"s1","launch":"r1"}"#,
                None,
            ),
            (
                at_5.clone(),
                r#"{"seq":2,"event":"session_created","sessionId":"old","method":"session/new","launch":"initial"}"#,
                None,
            ),
            // …a newer one is applied with its cursor…
            (
                at_5.clone(),
                r#"{"seq":6,"event":"prompt_started","sessionId":"s1","launch":"r1"}"#,
                Some(json!({"activity":"Working","journalCursor":6})),
            ),
            // …and a snapshot below the cursor (the journal started over) resets it.
            (
                Known { cursor: 9, ..at_5 },
                r#"{"seq":3,"event":"snapshot","sessionId":"s1","promptActive":true}"#,
                Some(json!({"activity":"Working","journalCursor":3})),
            ),
        ];
        for (known, line, expected) in cases {
            let patch = status_patch_for(&parse(line), &known, now);
            match (patch, expected) {
                (None, None) => {}
                (Some((patch, next)), Some(expected)) => {
                    let written = patch["status"].as_object().expect("object");
                    for (key, value) in expected.as_object().expect("object") {
                        assert_eq!(&written[key], value, "{line}: {key}");
                    }
                    let unchanged = written
                        .keys()
                        .filter(|k| !expected.as_object().expect("object").contains_key(*k))
                        .filter(|k| *k != "lastSeenAt" && *k != "resumable")
                        .collect::<Vec<_>>();
                    assert!(unchanged.is_empty(), "{line}: wrote {unchanged:?} too");
                    assert_ne!(next, known, "{line}");
                }
                (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
            }
        }
    }
}
