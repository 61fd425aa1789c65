//! Follows `agentctl events` of the running agentctl pods (over exec) and keeps what the agent
//! does ([`AgentView`]: the resume token on session-created and prompt-finished, the agent's
//! last message id, whether a prompt is in flight, the journal cursor) until the reconciler
//! writes it: a follower writes nothing itself. Each change is posted as [`JournalNews`] and
//! wakes the session's reconcile, which applies it to ExecutorRunning status
//! ([`crate::resume::journal_update`], the status's one writer) and turns it into RUNNING ↔
//! WAITING_FOR_INPUT. News that piles up while a reconcile runs is written at once.
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
//! Only changes are posted: each follower starts from what ExecutorRunning holds, so replayed
//! entries, the snapshot and repeated lines cost no API call. An entry at or below the cursor
//! (an older launch's, or one applied already) changes nothing ([`view_after`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, AttachParams};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::io::BufReader;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

pub use crate::api::PROMPTED_ANNOTATION;
use crate::api::bounds::{AGENT_NAME_MAX, AGENT_TEXT_MAX, SESSION_ID_MAX, cap, keep_newest};
use crate::api::pod_contract::events::{Event, EventLine};
use crate::api::{AgentActivity, ExecutorRunningStatus, TaskSession};
use crate::controller::gate::{DEFAULT_EXECS_PER_SECOND, ExecGate};
use crate::jsonrpc::codec::{Frame, LINE_LIMIT, LineReader};
use crate::resume::{AgentView, JournalNews, RESOLUTIONS_KEPT, view_after};
use crate::telemetry::WarnLimiter;

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
    /// What the followers read and the reconciler has not written yet.
    board: Board,
}

/// The news of each pod (by UID) with the serial number of its post, and the wake-up of the
/// sessions they belong to.
#[derive(Clone)]
struct Board {
    news: Arc<Mutex<HashMap<String, (JournalNews, u64)>>>,
    posts: Arc<AtomicU64>,
    wake: mpsc::UnboundedSender<ObjectRef<TaskSession>>,
}

impl Board {
    /// Posts what a follower read now (a nudge handled earlier and not written yet stays), and
    /// wakes the session's reconcile.
    fn post(&self, session: &ObjectRef<TaskSession>, mut news: JournalNews) {
        if let Ok(mut board) = self.news.lock() {
            if let Some((before, _)) = board.remove(&news.pod_uid) {
                news.handled_nudge = news.handled_nudge.or(before.handled_nudge);
                // Permission requests that ended and are not published yet stay.
                let mut resolutions = before.view.resolutions;
                resolutions.append(&mut news.view.resolutions);
                keep_newest(&mut resolutions, RESOLUTIONS_KEPT);
                news.view.resolutions = resolutions;
            }
            let serial = self.posts.fetch_add(1, Ordering::Relaxed);
            board.insert(news.pod_uid.clone(), (news, serial));
        }
        // The receiver goes only with the controller.
        let _ = self.wake.unbounded_send(session.clone());
    }
}

/// The news a reconcile writes, and the serial number of its post (see [`Followers::written`]).
pub type Posted = (JournalNews, u64);

impl Followers {
    /// Starts the pacing of the followers' execs (a task for the operator's lifetime). The
    /// stream names the sessions whose followers posted news: the controller reconciles them.
    pub fn new(
        pods: Store<Pod>,
        probe: Probe,
    ) -> (Self, mpsc::UnboundedReceiver<ObjectRef<TaskSession>>) {
        let gate = ExecGate::new(probe.execs_per_second);
        tokio::spawn(gate.clone().run());
        let (wake, woken) = mpsc::unbounded();
        let followers = Self {
            running: Mutex::default(),
            started: Mutex::default(),
            pods,
            probe,
            gate,
            board: Board {
                news: Arc::default(),
                posts: Arc::default(),
                wake,
            },
        };
        (followers, woken)
    }

    /// The news of pod `pod_uid` that no reconcile has written yet.
    /// The pace of execs into agentctl pods, shared with the relay of permission answers.
    pub fn gate(&self) -> Arc<ExecGate> {
        self.gate.clone()
    }

    pub fn news(&self, pod_uid: &str) -> Option<Posted> {
        self.board.news.lock().ok()?.get(pod_uid).cloned()
    }

    /// Posts news as a follower would (the write-order tests).
    #[cfg(test)]
    pub fn post(&self, session: &ObjectRef<TaskSession>, news: JournalNews) {
        self.board.post(session, news);
    }

    /// A reconcile wrote (or judged) post `serial` of the pod's news: it goes, unless a newer
    /// one came meanwhile.
    pub fn written(&self, pod_uid: &str, serial: u64) {
        if let Ok(mut board) = self.board.news.lock()
            && board.get(pod_uid).is_some_and(|(_, n)| *n == serial)
        {
            board.remove(pod_uid);
        }
    }

    /// Reads the pod's journal, and follows it while the agent works, unless a follower runs
    /// already, or one started for the same `nudge` (the session's [`PROMPTED_ANNOTATION`])
    /// and the periodic catch-up is off or not due, or this operator run has not read it yet
    /// and need not ([`reads_at_first_sight`]). `status` is what the session's ExecutorRunning
    /// holds now.
    pub fn ensure(
        &self,
        client: &Client,
        pod: &Pod,
        session: ObjectRef<TaskSession>,
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
        let task = follow(
            client.clone(),
            self.pods.clone(),
            Reader {
                pod: ObjectRef::from_obj(pod),
                uid: uid.clone(),
                session,
                board: self.board.clone(),
                nudge: nudge.map(str::to_string),
            },
            AgentView::from_status(status),
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
        if let Ok(mut board) = self.board.news.lock() {
            board.retain(|uid, _| keep(uid));
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

/// One follower's pod, the session it posts news for, and the client's nudge it started for
/// (handled once the journal is read up to an idle agent).
struct Reader {
    pod: ObjectRef<Pod>,
    uid: String,
    session: ObjectRef<TaskSession>,
    board: Board,
    nudge: Option<String>,
}

impl Reader {
    fn post(&self, view: &AgentView, handled_nudge: Option<String>) {
        let news = JournalNews {
            pod_uid: self.uid.clone(),
            view: view.clone(),
            seen_at: Timestamp::now(),
            handled_nudge,
        };
        self.board.post(&self.session, news);
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
/// journal is read up to an idle agent, the nudge it started for is posted as handled.
async fn follow(
    client: Client,
    cache: Store<Pod>,
    reader: Reader,
    mut view: AgentView,
    answer_within: Duration,
    gate: Arc<ExecGate>,
) {
    let ns = reader.pod.namespace.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let mut backoff = Duration::from_secs(1);
    loop {
        let running = cache.get(&reader.pod).is_some_and(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        if !running {
            info!("pod is gone or not running; stopping the event follower");
            return;
        }
        gate.enter(view.activity == Some(AgentActivity::Working))
            .await;
        let mut answered = false;
        let streamed =
            stream_events(&pods, &reader, &mut view, (answer_within, &mut answered)).await;
        match streamed {
            Ok(StreamEnd::Idle) => {
                debug!(cursor = view.cursor, "agent idle; journal caught up");
                if reader.nudge.is_some() {
                    reader.post(&view, reader.nudge.clone());
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
    pods: &Api<Pod>,
    reader: &Reader,
    view: &mut AgentView,
    (answer_within, answered): (Duration, &mut bool),
) -> Result<StreamEnd, kube::Error> {
    // The container named, as the admission policy on exec requires.
    let params = AttachParams::default()
        .container(crate::api::pod_contract::CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let since = view.cursor.to_string();
    // agentctl ends the stream itself once the agent is idle: no process lingers in the pod.
    let command = [
        "agentctl",
        "events",
        "--since",
        since.as_str(),
        "--until-idle",
    ];
    let mut process = pods.exec(&reader.pod.name, command, &params).await?;
    let Some(stdout) = process.stdout() else {
        return Ok(StreamEnd::Dropped);
    };
    // Event lines are small; a longer one means the stream is not what we think it is: it is
    // dropped (never buffered) and the stream is followed again after the backoff.
    let mut lines = LineReader::new(BufReader::new(stdout), LINE_LIMIT);
    let mut warnings = WarnLimiter::default();
    let mut caught_up = false;
    debug!(since = view.cursor, "reading agentctl events");
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
            Ok(Frame::TooCostly { len, cost }) => {
                // Read whole and dropped unparsed: the stream goes on with the next line.
                *answered = true;
                if let Some(suppressed) = warnings.allow() {
                    warn!(
                        len,
                        cost, suppressed, "agentctl event line too dense to parse; skipped"
                    );
                }
                continue;
            }
            Ok(Frame::Eof) if caught_up && view.activity != Some(AgentActivity::Working) => {
                return Ok(StreamEnd::Idle);
            }
            Ok(Frame::Eof) | Err(_) => return Ok(StreamEnd::Dropped),
        }
        let Some(line) = parse_line(lines.line(), &mut warnings) else {
            continue;
        };
        if read_line(&line, view, &reader.session.name) {
            reader.post(view, None);
            // Posted: the board keeps them until a reconcile publishes them.
            view.resolutions.clear();
        }
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

/// What `line` says, into `view` (its cursor at least); whether a field other than the cursor
/// changed (the news to post).
fn read_line(line: &EventLine, view: &mut AgentView, session: &str) -> bool {
    if let Event::ConfigSetBackFailed {
        session_id,
        method,
        error,
    } = &line.event
    {
        warn!(%session, session_id = %cap(session_id, SESSION_ID_MAX), method = %cap(method, AGENT_NAME_MAX), code = error.code, message = %cap(&error.message, AGENT_TEXT_MAX), "agentctl could not set the session's saved configuration back after the restore; the restore stands");
    }
    match view_after(line, view) {
        Some(next) if !next.same_fields(view) || next.resolutions != view.resolutions => {
            *view = next;
            true
        }
        _ => {
            if let Some(seq) = line.seq {
                view.cursor = view.cursor.max(seq);
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use serde_json::json;

    use super::*;

    fn session() -> ObjectRef<TaskSession> {
        ObjectRef::new("s").within("ns")
    }

    /// Followers with the default probe and a client of an API server that is not there (a
    /// follower that starts fails its exec and stops with its empty pod cache).
    fn offline_followers() -> (
        Followers,
        Client,
        kube::runtime::reflector::store::Writer<Pod>,
    ) {
        let (store, writer) = kube::runtime::reflector::store::<Pod>();
        let (followers, _woken) = Followers::new(store, Probe::default());
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
        followers.ensure(&client, &pod, session(), &status, Some("n1"));
        let running = |uid: &str| followers.running.lock().expect("lock").contains_key(uid);
        assert!(!running("u1"), "no exec for the nudge the launch saw");
        followers.ensure(&client, &pod, session(), &status, Some("n2"));
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
        followers.ensure(&client, &pod("idle"), session(), &idle, Some("n1"));
        followers.ensure(&client, &pod("idle"), session(), &idle, Some("n1"));
        assert!(!running("idle"));
        let working = ExecutorRunningStatus {
            activity: Some(AgentActivity::Working),
            ..Default::default()
        };
        followers.ensure(&client, &pod("working"), session(), &working, None);
        assert!(running("working"));
        followers.ensure(&client, &pod("idle"), session(), &idle, Some("n2"));
        assert!(running("idle"), "a new nudge reads the journal");
        followers.retain(|_| false);
    }

    /// News waits on the board until a reconcile wrote the post it read: a newer post stays,
    /// a handled nudge not written yet is kept by the next post, and every post wakes the
    /// session.
    #[tokio::test]
    async fn news_waits_until_written() {
        let (store, _writer) = kube::runtime::reflector::store::<Pod>();
        let (followers, mut woken) = Followers::new(store, Probe::default());
        let reader = Reader {
            pod: ObjectRef::new("p").within("ns"),
            uid: "u1".into(),
            session: session(),
            board: followers.board.clone(),
            nudge: Some("n1".into()),
        };
        let working = AgentView {
            activity: Some(AgentActivity::Working),
            ..AgentView::default()
        };
        reader.post(&AgentView::default(), Some("n1".into()));
        reader.post(&working, None);
        assert_eq!(woken.next().await, Some(session()));
        assert_eq!(woken.next().await, Some(session()));
        let (news, posts) = followers.news("u1").expect("news");
        assert_eq!(
            (&news.view, news.handled_nudge.as_deref(), posts),
            (&working, Some("n1"), 1)
        );
        followers.written("u1", 0);
        assert!(followers.news("u1").is_some(), "a newer post stays");
        followers.written("u1", 1);
        assert_eq!(followers.news("u1"), None);
        reader.post(&working, None);
        followers.retain(|_| false);
        assert_eq!(followers.news("u1"), None, "a gone pod's news goes");
    }
}
