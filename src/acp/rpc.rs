//! Our own thin JSON-RPC 2.0 line layer: one JSON message per line, in both directions.
//!
//! Why not the `agent-client-protocol` crate's connection machinery: the restore path must
//! classify every wire problem precisely (DESIGN §3: a timeout, a closed stream and a garbage
//! answer all keep the token, while -32601/-32002 do not), survive agents that print non-JSON
//! on stdout, and run over any byte stream (child stdio, unix socket, Kubernetes exec). A small
//! layer whose every failure maps to [`CallFailure`] is easier to reason about than adapting
//! a general-purpose one. The crate's schema types are still used for every message body.
//!
//! Structure: a reader task parses lines, routes responses by id to the waiting call, forwards
//! `session/update` notifications to subscribers and answers requests from the agent; a writer
//! task owns the write half so callers and the reader can both send without sharing a lock
//! across an `.await`.
//!
//! Memory is bounded per connection: every line by [`crate::jsonrpc::codec`] (1 MiB, or the replay line
//! limit while a `session/load` is open), the queue to the agent by [`OUTGOING_CAPACITY`], each
//! subscriber by [`SUBSCRIBER_CAPACITY`], and a replay is counted as it streams by, against the
//! replay budget (an update nobody subscribed to is counted without being parsed into a
//! [`Value`]). An agent that breaks a bound is cut off: both tasks stop, and every call fails
//! with [`CallFailure::AgentLimit`] naming the bound.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::api::bounds::{AGENT_TEXT_MAX, cap};
use crate::jsonrpc::code::{INTERNAL_ERROR, METHOD_NOT_FOUND};
use crate::jsonrpc::{
    AgentLimit, CallFailure, Frame, LINE_LIMIT, LineReader, cost, encode_line, error_message,
    method, notification_message, request_message, result_message,
};
use crate::telemetry::SharedWarnLimiter;

use super::client::AcpLimits;
use super::updates::SessionUpdateEvent;

/// Messages to the agent that may wait for it to read them. We send a handful of requests of
/// our own; the rest are answers to the agent's requests, so an agent that fills this sends
/// requests without reading the answers and is cut off ([`AgentLimit::Input`]).
pub(crate) const OUTGOING_CAPACITY: usize = 1024;

/// `session/update` notifications queued per subscriber; one that falls further behind is
/// dropped (its stream ends) rather than holding the connection or growing without bound.
pub(crate) const SUBSCRIBER_CAPACITY: usize = 256;

/// An agent-chosen request id longer than this is not echoed back: a real id is a counter or
/// a UUID, and answering a huge one would let the agent size our outgoing queue.
pub(crate) const MAX_ECHOED_ID_BYTES: usize = 256;

/// How much of a bad line goes into a warning: enough to recognise it, not enough to flood logs
/// (or leak much of whatever the agent printed).
const PREVIEW_CHARS: usize = 160;

type CallResult = Result<Value, CallFailure>;

/// What one `session/load` replayed, counted as it streamed by (never buffered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// `session/update` notifications for the loaded session.
    pub updates: u64,
    /// Bytes of every line the agent wrote while the load was open.
    pub bytes: u64,
}

/// The `session/load` being answered, if any.
struct Loading {
    session_id: String,
    replayed: Replayed,
}

/// Mutable connection state; only ever locked briefly and never across an `.await`.
struct State {
    pending: HashMap<u64, oneshot::Sender<CallResult>>,
    /// Requests sent with [`AcpRpc::send_detached`]: their answers are dropped without a warning.
    detached: HashSet<u64>,
    /// Set once the stream closed (EOF, read or write error: `TransportClosed`) or the agent
    /// was cut off (`AgentLimit`). Later calls fail at once with it.
    closed: Option<CallFailure>,
    subscribers: Vec<mpsc::Sender<SessionUpdateEvent>>,
    limits: AcpLimits,
    loading: Option<Loading>,
}

impl State {
    /// Counts a `session/update` of `session_id` for the open load, if it is its session.
    fn count_update(&mut self, session_id: &str) {
        if let Some(loading) = &mut self.loading
            && loading.session_id == session_id
        {
            loading.replayed.updates += 1;
        }
    }
}

/// What the reader task, the writer task and the callers share.
struct Shared {
    state: Mutex<State>,
    garbage_lines: AtomicU64,
    /// Turns true when the connection closes; stops the writer even mid-write (an agent that
    /// does not read its stdin would otherwise hold it forever).
    closing: watch::Sender<bool>,
    /// Rate limit of the warnings about what the agent sends.
    warnings: SharedWarnLimiter,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map half-updated in a way that
        // matters (every operation is a single insert/remove/retain), so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the stream closed for `why` and fails every pending call with it. Dropping the
    /// subscriber senders ends their receivers too, so update streams see the end. The first
    /// reason wins.
    fn close(&self, why: CallFailure) {
        let (pending, subscribers, why) = {
            let mut state = self.lock();
            let why = state.closed.get_or_insert(why).clone();
            (
                std::mem::take(&mut state.pending),
                std::mem::take(&mut state.subscribers),
                why,
            )
        };
        self.closing.send_replace(true);
        for (_, waiter) in pending {
            let _ = waiter.send(Err(why.clone()));
        }
        drop(subscribers);
    }

    /// Cuts the agent off for breaking `limit`: its pending calls fail with the limit.
    fn cut_off(&self, limit: AgentLimit) {
        tracing::warn!(%limit, "cutting the agent off");
        self.close(CallFailure::AgentLimit(limit));
    }

    fn closed(&self) -> Option<CallFailure> {
        self.lock().closed.clone()
    }

    fn resolve(&self, id: u64, result: CallResult) {
        let waiter = {
            let mut state = self.lock();
            if state.detached.remove(&id) {
                tracing::debug!(id, "answer for a detached request dropped");
                return;
            }
            state.pending.remove(&id)
        };
        match waiter {
            Some(waiter) => {
                // The caller may have given up (timeout) in the meantime; that is fine.
                let _ = waiter.send(result);
            }
            None => self.warnings.warn(|suppressed| {
                tracing::warn!(
                    id,
                    suppressed,
                    "answer for a request nobody waits for (late after a timeout?)"
                )
            }),
        }
    }

    fn publish(&self, event: SessionUpdateEvent) {
        let mut state = self.lock();
        state.count_update(&event.session_id);
        // Dropped receivers are pruned here rather than tracked: cheap and always correct. A
        // full one is dropped too: it fell behind by a whole queue.
        state
            .subscribers
            .retain(|subscriber| match subscriber.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        capacity = SUBSCRIBER_CAPACITY,
                        "session/update subscriber too slow; dropped"
                    );
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// The limit of the next line: the replay limit while a `session/load` is open; `None`
    /// once the connection is closed (the agent may have been cut off while a line was handled).
    fn next_line_limit(&self) -> Option<usize> {
        let state = self.lock();
        match (&state.closed, &state.loading) {
            (Some(_), _) => None,
            (None, Some(_)) => Some(state.limits.replay_line),
            (None, None) => Some(state.limits.line),
        }
    }

    /// Counts a line of `bytes` against an open load's budget; the budget when it is exceeded.
    fn count_replay(&self, bytes: usize) -> Option<u64> {
        let mut state = self.lock();
        let budget = state.limits.replay_budget;
        let loading = state.loading.as_mut()?;
        loading.replayed.bytes = loading
            .replayed
            .bytes
            .saturating_add(u64::try_from(bytes).unwrap_or(u64::MAX));
        (loading.replayed.bytes > budget).then_some(budget)
    }
}

/// The sending side of the queue to the agent: never blocks, cuts the agent off when full.
#[derive(Clone)]
struct Outgoing {
    queue: mpsc::Sender<Vec<u8>>,
}

impl Outgoing {
    fn send(&self, line: Vec<u8>, shared: &Shared) -> Result<(), CallFailure> {
        match self.queue.try_send(line) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                let limit = AgentLimit::Input {
                    limit: OUTGOING_CAPACITY,
                };
                shared.cut_off(limit);
                Err(CallFailure::AgentLimit(limit))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(shared.closed().unwrap_or(CallFailure::TransportClosed))
            }
        }
    }
}

/// A JSON-RPC connection over one byte stream.
pub(crate) struct RpcConnection {
    shared: Arc<Shared>,
    outgoing: Outgoing,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl RpcConnection {
    /// Starts the reader and writer tasks; needs a tokio runtime.
    pub(crate) fn new<R, W>(reader: R, writer: W) -> Self
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: HashMap::new(),
                detached: HashSet::new(),
                closed: None,
                subscribers: Vec::new(),
                limits: AcpLimits::default(),
                loading: None,
            }),
            garbage_lines: AtomicU64::new(0),
            closing: watch::Sender::new(false),
            warnings: SharedWarnLimiter::default(),
        });
        let (queue, outgoing_rx) = mpsc::channel(OUTGOING_CAPACITY);
        let outgoing = Outgoing { queue };
        let writer = tokio::spawn(write_loop(writer, outgoing_rx, shared.clone()));
        let reader = tokio::spawn(read_loop(
            BufReader::new(reader),
            shared.clone(),
            outgoing.clone(),
        ));
        Self {
            shared,
            outgoing,
            next_id: AtomicU64::new(1),
            reader,
            writer,
        }
    }

    /// Replaces the line limits and the replay budget (from the next line on).
    pub(crate) fn set_limits(&self, limits: AcpLimits) {
        self.shared.lock().limits = limits;
    }

    pub(crate) fn limits(&self) -> AcpLimits {
        self.shared.lock().limits
    }

    /// Sends a request and waits for its answer, at most `timeout` (`None`: no limit, for calls
    /// like `session/prompt` whose turn may legitimately take hours).
    pub(crate) async fn call(
        &self,
        method: &str,
        params: Value,
        timeout: Option<Duration>,
    ) -> CallResult {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            if let Some(why) = &state.closed {
                return Err(why.clone());
            }
            state.pending.insert(id, tx);
        }
        // Removes the waiter however this future ends: answered, timed out or dropped.
        let _guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        let message = request_message(json!(id), method, params);
        self.send(&message)?;
        tracing::debug!(id, method, "request sent");
        let answer = match timeout {
            Some(limit) => match tokio::time::timeout(limit, rx).await {
                Ok(answer) => answer,
                Err(_) => {
                    tracing::warn!(id, method, ?limit, "no answer in time");
                    return Err(CallFailure::Timeout);
                }
            },
            None => rx.await,
        };
        // A dropped sender means the connection went away without resolving us.
        answer.unwrap_or_else(|_| Err(self.shared.closed().unwrap_or(CallFailure::TransportClosed)))
    }

    /// [`Self::call`] for a `session/load` of `session_id`: while it is open, lines may be as
    /// long as the replay line limit, every line counts against the replay budget, and the
    /// replayed updates are counted as they pass.
    pub(crate) async fn call_replaying(
        &self,
        method: &str,
        params: Value,
        timeout: Option<Duration>,
        session_id: &str,
    ) -> (CallResult, Replayed) {
        self.shared.lock().loading = Some(Loading {
            session_id: session_id.to_owned(),
            replayed: Replayed::default(),
        });
        // Ends the replay however this future ends.
        let guard = LoadingGuard {
            shared: &self.shared,
        };
        let result = self.call(method, params, timeout).await;
        (result, guard.finish())
    }

    /// Sends a request whose answer nobody waits for (it is dropped when it arrives), for turns
    /// that are followed by other means (the operator follows `agentctl events`).
    pub(crate) fn send_detached(&self, method: &str, params: Value) -> Result<(), CallFailure> {
        if let Some(why) = self.shared.closed() {
            return Err(why);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.lock().detached.insert(id);
        self.send(&request_message(json!(id), method, params))
    }

    /// Sends a notification (no answer expected).
    pub(crate) fn notify(&self, method: &str, params: Value) -> Result<(), CallFailure> {
        if let Some(why) = self.shared.closed() {
            return Err(why);
        }
        self.send(&notification_message(method, params))
    }

    fn send(&self, message: &Value) -> Result<(), CallFailure> {
        self.outgoing.send(encode_line(message), &self.shared)
    }

    /// A receiver of every `session/update` notification from now on. It ends when the
    /// connection closes, or when it falls [`SUBSCRIBER_CAPACITY`] updates behind; dropping it
    /// unsubscribes.
    pub(crate) fn subscribe(&self) -> mpsc::Receiver<SessionUpdateEvent> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
        let mut state = self.shared.lock();
        // Subscribing to a closed connection yields a receiver that ends at once.
        if state.closed.is_none() {
            state.subscribers.push(tx);
        }
        rx
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some()
    }

    /// Lines that were not JSON-RPC messages and were skipped.
    pub(crate) fn garbage_lines(&self) -> u64 {
        self.shared.garbage_lines.load(Ordering::Relaxed)
    }
}

impl Drop for RpcConnection {
    /// Stops both tasks; dropping the writer closes the agent's stdin (or the exec stream), which
    /// is how a stdio agent learns we are gone.
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
        self.shared.close(CallFailure::TransportClosed);
    }
}

struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.id);
    }
}

struct LoadingGuard<'a> {
    shared: &'a Shared,
}

impl LoadingGuard<'_> {
    fn finish(self) -> Replayed {
        self.shared
            .lock()
            .loading
            .take()
            .map(|loading| loading.replayed)
            .unwrap_or_default()
    }
}

impl Drop for LoadingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().loading = None;
    }
}

async fn write_loop<W>(mut writer: W, mut outgoing: mpsc::Receiver<Vec<u8>>, shared: Arc<Shared>)
where
    W: AsyncWrite + Unpin,
{
    let mut closing = shared.closing.subscribe();
    loop {
        let line = tokio::select! {
            line = outgoing.recv() => line,
            _ = closing.wait_for(|closing| *closing) => return,
        };
        let Some(line) = line else { break };
        // Flush every line: the agent must see a request now, not when a buffer fills.
        let written = async {
            writer.write_all(&line).await?;
            writer.flush().await
        };
        let written = tokio::select! {
            written = written => written,
            // Cut off (or gone): an agent that does not read must not hold this write forever.
            _ = closing.wait_for(|closing| *closing) => return,
        };
        if let Err(error) = written {
            tracing::warn!(%error, "cannot write to the agent; closing the connection");
            shared.close(CallFailure::TransportClosed);
            return;
        }
    }
    let _ = writer.shutdown().await;
}

async fn read_loop<R>(reader: R, shared: Arc<Shared>, outgoing: Outgoing)
where
    R: AsyncBufRead + Unpin,
{
    let mut lines = LineReader::new(reader, LINE_LIMIT);
    loop {
        // The limit is chosen once the line has begun: a replay line that arrives after a
        // `session/load` was sent is always read under the replay limit.
        let ready = lines.ready().await;
        let Some(limit) = shared.next_line_limit() else {
            return;
        };
        lines.set_limit(limit);
        let frame = match ready {
            Ok(true) => lines.next_line().await,
            Ok(false) => Ok(Frame::Eof),
            Err(error) => Err(error),
        };
        match frame {
            Ok(Frame::Line) => {
                if let Some(budget) = shared.count_replay(lines.line().len() + 1) {
                    shared.cut_off(AgentLimit::Replay { limit: budget });
                    return;
                }
                handle_line(lines.line(), &shared, &outgoing);
            }
            Ok(Frame::TooLong { len }) => {
                tracing::warn!(
                    len,
                    limit = lines.limit(),
                    "the agent wrote an over-long line"
                );
                shared.cut_off(AgentLimit::Line {
                    limit: lines.limit(),
                });
                return;
            }
            Ok(Frame::TooCostly { len, cost }) => {
                let bound = cost::bound(lines.limit());
                tracing::warn!(
                    len,
                    cost,
                    bound,
                    "the agent wrote a line too dense to parse"
                );
                shared.cut_off(AgentLimit::ParseCost { cost, bound });
                return;
            }
            Ok(Frame::Eof) => {
                tracing::debug!("agent stream closed");
                break;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read from the agent");
                break;
            }
        }
    }
    shared.close(CallFailure::TransportClosed);
}

fn preview(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut out: String = text.chars().take(PREVIEW_CHARS).collect();
    if text.chars().nth(PREVIEW_CHARS).is_some() {
        out.push('…');
    }
    out
}

fn skip_garbage(shared: &Shared, line: &[u8], why: &str) {
    let count = shared.garbage_lines.fetch_add(1, Ordering::Relaxed) + 1;
    shared.warnings.warn(|suppressed| {
        tracing::warn!(line = %preview(line), why, skipped_so_far = count, suppressed, "skipped a line from the agent that is not a JSON-RPC message")
    });
}

/// Our request ids are numbers; tolerate an agent that echoes them back as strings.
fn our_id(id: &Value) -> Option<u64> {
    match id {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The little of a line needed to count a `session/update`, read without building the message.
#[derive(serde::Deserialize)]
struct UpdatePeek {
    method: Option<String>,
    id: Option<serde::de::IgnoredAny>,
    params: Option<UpdatePeekParams>,
}

#[derive(serde::Deserialize)]
struct UpdatePeekParams {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
    update: Option<serde::de::IgnoredAny>,
}

/// Counts a `session/update` that nobody subscribed to without building it as a [`Value`]
/// (a replayed update may carry megabytes; its parsed form would be several times that). False
/// for anything else, or when someone subscribed: the line then takes the full path.
fn count_unobserved_update(line: &[u8], shared: &Shared) -> bool {
    if !shared.lock().subscribers.is_empty() {
        return false;
    }
    let Ok(peek) = serde_json::from_slice::<UpdatePeek>(line) else {
        return false;
    };
    match (peek.method.as_deref(), peek.id, peek.params) {
        (
            Some(method::SESSION_UPDATE),
            None,
            Some(UpdatePeekParams {
                session_id: Some(session_id),
                update: Some(_),
            }),
        ) => {
            shared.lock().count_update(&session_id);
            true
        }
        _ => false,
    }
}

/// What one line from the agent is, decided without touching the connection (the parsed
/// message is taken apart, not cloned: a replayed update may be megabytes).
#[derive(Debug, PartialEq)]
enum Incoming {
    /// Empty or only whitespace: ignored without a warning.
    Blank,
    /// Not a JSON-RPC message; skipped with a (rate-limited) warning saying why.
    Garbage(&'static str),
    /// A request of the agent (a method and a non-null id): answered with a default answer.
    Request { method: String, id: Value },
    /// A notification (a method, no id or a null one).
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// The answer to our request `id` (ours are numbers; echoed as a string is tolerated).
    Answer { id: u64, result: CallResult },
    /// An answer with an id we never use.
    ForeignAnswer { id: Value },
    /// An error without a request id: the agent could not parse what we sent.
    ErrorWithoutId,
}

fn classify_line(line: &[u8]) -> Incoming {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Incoming::Blank;
    }
    let message: Value = match serde_json::from_slice(line) {
        Ok(message) => message,
        Err(_) => return Incoming::Garbage("not JSON"),
    };
    let Value::Object(mut object) = message else {
        return Incoming::Garbage("not a JSON object");
    };
    let id = object.remove("id").filter(|id| !id.is_null());
    let method = match object.remove("method") {
        Some(Value::String(method)) => Some(method),
        _ => None,
    };
    match (method, id) {
        (Some(method), Some(id)) => Incoming::Request { method, id },
        (Some(method), None) => Incoming::Notification {
            method,
            params: object.remove("params"),
        },
        (None, Some(id)) => match our_id(&id) {
            Some(id) => Incoming::Answer {
                id,
                result: parse_answer(object),
            },
            None => Incoming::ForeignAnswer { id },
        },
        (None, None) if object.contains_key("error") => Incoming::ErrorWithoutId,
        (None, None) => Incoming::Garbage("neither a request, a notification nor an answer"),
    }
}

fn handle_line(line: &[u8], shared: &Shared, outgoing: &Outgoing) {
    if count_unobserved_update(line, shared) {
        return;
    }
    match classify_line(line) {
        Incoming::Blank => {}
        Incoming::Garbage(why) => skip_garbage(shared, line, why),
        Incoming::Request { method, id } => answer_agent_request(&method, &id, shared, outgoing),
        Incoming::Notification { method, params } => {
            handle_notification(&method, params.as_ref(), shared)
        }
        Incoming::Answer { id, result } => shared.resolve(id, result),
        Incoming::ForeignAnswer { id } => shared.warnings.warn(|suppressed| {
            tracing::warn!(id = %preview(id.to_string().as_bytes()), suppressed, "answer with an id we never used")
        }),
        // JSON-RPC: id null means the agent could not even parse what we sent.
        Incoming::ErrorWithoutId => shared.warnings.warn(|suppressed| {
            tracing::warn!(error = %preview(line), suppressed, "agent reported an error without a request id")
        }),
    }
}

/// A response's `result`, or its `error` as [`CallFailure::JsonRpc`]; anything else is a
/// malformed answer (it cannot be classified, so it keeps the token).
fn parse_answer(mut object: serde_json::Map<String, Value>) -> CallResult {
    if let Some(error) = object.get("error") {
        let code = error.get("code").and_then(Value::as_i64);
        return match code {
            Some(code) => Err(CallFailure::JsonRpc {
                code,
                message: cap(
                    error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    AGENT_TEXT_MAX,
                )
                .into(),
            }),
            None => Err(CallFailure::MalformedResponse(
                cap(
                    &format!("error without an integer code: {error}"),
                    AGENT_TEXT_MAX,
                )
                .into(),
            )),
        };
    }
    match object.remove("result") {
        Some(result) => Ok(result),
        None => Err(CallFailure::MalformedResponse(
            "answer has neither result nor error".to_owned(),
        )),
    }
}

fn handle_notification(method: &str, params: Option<&Value>, shared: &Shared) {
    if method != method::SESSION_UPDATE {
        // e.g. claude-agent-acp's `_auth/status_update`: extension notifications are optional
        // to understand (ACP "_" prefix), and nothing else is addressed to a client.
        tracing::debug!(method, "ignored notification");
        return;
    }
    match params.and_then(SessionUpdateEvent::from_params) {
        Some(event) => shared.publish(event),
        None => shared.warnings.warn(|suppressed| {
            tracing::warn!(
                params = %preview(params.map(ToString::to_string).unwrap_or_default().as_bytes()),
                suppressed,
                "session/update without a sessionId and an update"
            )
        }),
    }
}

/// The answer to an agent→client request nobody serves: a permission request is cancelled
/// (the safe choice: nothing runs unattended that the agent asked a human about), anything
/// else gets -32601 saying `why`. Shared by our client and by agentctl without a client.
pub fn default_answer_to_agent_request(id: Value, method: &str, why: &str) -> Value {
    if method == method::SESSION_REQUEST_PERMISSION {
        use agent_client_protocol::v1::schema::{
            RequestPermissionOutcome, RequestPermissionResponse,
        };
        let result = RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled);
        match serde_json::to_value(result) {
            Ok(result) => result_message(id, result),
            Err(error) => error_message(
                id,
                INTERNAL_ERROR,
                &format!("cannot encode answer: {error}"),
            ),
        }
    } else {
        // The method is the agent's: only a bounded part of it goes back.
        let method: String = method.chars().take(PREVIEW_CHARS).collect();
        error_message(
            id,
            METHOD_NOT_FOUND,
            &format!("method not found: {method} ({why})"),
        )
    }
}

/// We serve no client capabilities (no file system, no terminal: `initialize` advertises none),
/// so every agent→client request gets -32601, except a permission request, which is cancelled.
fn answer_agent_request(method: &str, id: &Value, shared: &Shared, outgoing: &Outgoing) {
    if id.to_string().len() > MAX_ECHOED_ID_BYTES {
        skip_garbage(shared, method.as_bytes(), "a request id too long to echo");
        return;
    }
    tracing::debug!(method, "answering an agent request we do not serve");
    let answer =
        default_answer_to_agent_request(id.clone(), method, "this client does not serve it");
    // A full queue cuts the agent off (the reader stops at the next line); a closed one means
    // the connection is closing anyway.
    let _ = outgoing.send(encode_line(&answer), shared);
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, DuplexStream, duplex};

    /// A connection plus the agent's ends of the two pipes.
    fn connect() -> (
        RpcConnection,
        tokio::io::Lines<BufReader<DuplexStream>>,
        DuplexStream,
    ) {
        let (client_read, agent_write) = duplex(64 * 1024);
        let (agent_read, client_write) = duplex(64 * 1024);
        let rpc = RpcConnection::new(client_read, client_write);
        (rpc, BufReader::new(agent_read).lines(), agent_write)
    }

    async fn next_json(lines: &mut tokio::io::Lines<BufReader<DuplexStream>>) -> Value {
        let line = lines.next_line().await.expect("read").expect("a line");
        serde_json::from_str(&line).expect("json")
    }

    async fn say(agent: &mut DuplexStream, text: &str) {
        agent.write_all(text.as_bytes()).await.expect("write");
        agent.write_all(b"\n").await.expect("write");
    }

    /// The agent answers `request` with an empty result.
    async fn answer_empty(agent: &mut DuplexStream, request: &Value) {
        let id = &request["id"];
        say(
            agent,
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
        )
        .await;
    }

    #[tokio::test]
    async fn routes_answers_by_id_even_out_of_order() {
        let (rpc, mut from_client, mut agent) = connect();
        let rpc = Arc::new(rpc);
        let first = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call("a", json!({}), Some(Duration::from_secs(5))).await }
        });
        let first_req = next_json(&mut from_client).await;
        let second = tokio::spawn({
            let rpc = rpc.clone();
            async move {
                rpc.call("b", json!({"x": 1}), Some(Duration::from_secs(5)))
                    .await
            }
        });
        let second_req = next_json(&mut from_client).await;
        assert_eq!(first_req["method"], "a");
        assert_eq!(second_req["params"], json!({"x": 1}));
        assert_eq!(second_req["jsonrpc"], "2.0");
        // Answer the second first, one with a string id, one with an error.
        say(
            &mut agent,
            &format!(
                r#"{{"jsonrpc":"2.0","id":"{}","result":{{"n":2}}}}"#,
                second_req["id"]
            ),
        )
        .await;
        say(&mut agent, &format!(r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32002,"message":"Resource not found"}}}}"#, first_req["id"])).await;
        assert_eq!(second.await.expect("join"), Ok(json!({"n": 2})));
        assert_eq!(
            first.await.expect("join"),
            Err(CallFailure::JsonRpc {
                code: -32002,
                message: "Resource not found".into()
            })
        );
        assert_eq!(rpc.garbage_lines(), 0);
    }

    #[tokio::test]
    async fn forwards_session_updates_and_ignores_other_notifications() {
        let (rpc, _from_client, mut agent) = connect();
        let mut updates = rpc.subscribe();
        say(&mut agent, r#"{"jsonrpc":"2.0","method":"_auth/status_update","params":{"authStatus":{"kind":"none"}}}"#).await;
        say(&mut agent, r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}"#).await;
        let event = updates.recv().await.expect("an update");
        assert_eq!(event.session_id, "s1");
        assert_eq!(event.kind, "agent_message_chunk");
        assert_eq!(event.text(), Some("hi"));
        assert_eq!(rpc.garbage_lines(), 0);
    }

    #[tokio::test]
    async fn skips_and_counts_garbage_lines() {
        let (rpc, mut from_client, mut agent) = connect();
        let rpc = Arc::new(rpc);
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call("a", json!({}), Some(Duration::from_secs(5))).await }
        });
        let request = next_json(&mut from_client).await;
        say(&mut agent, "Starting agent v1.2.3 …").await;
        say(&mut agent, "[1, 2]").await;
        say(&mut agent, "{\"jsonrpc\":\"2.0\"}").await;
        say(&mut agent, "").await; // blank lines are not garbage
        agent.write_all(&[0xff, 0xfe, b'\n']).await.expect("write");
        say(
            &mut agent,
            &format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":null}}"#,
                request["id"]
            ),
        )
        .await;
        assert_eq!(call.await.expect("join"), Ok(Value::Null));
        assert_eq!(rpc.garbage_lines(), 4);
    }

    #[tokio::test]
    async fn answer_without_result_or_error_code_is_malformed() {
        let (rpc, mut from_client, mut agent) = connect();
        let rpc = Arc::new(rpc);
        for answer in [
            r#""result_missing":true"#,
            r#""error":{"message":"no code"}"#,
        ] {
            let call = tokio::spawn({
                let rpc = rpc.clone();
                async move { rpc.call("a", json!({}), Some(Duration::from_secs(5))).await }
            });
            let request = next_json(&mut from_client).await;
            say(
                &mut agent,
                &format!(r#"{{"jsonrpc":"2.0","id":{},{answer}}}"#, request["id"]),
            )
            .await;
            assert!(matches!(
                call.await.expect("join"),
                Err(CallFailure::MalformedResponse(_))
            ));
        }
    }

    #[tokio::test]
    async fn times_out_and_forgets_the_waiter() {
        let (rpc, mut from_client, mut agent) = connect();
        let result = rpc
            .call("slow", json!({}), Some(Duration::from_millis(200)))
            .await;
        assert_eq!(result, Err(CallFailure::Timeout));
        assert!(rpc.shared.lock().pending.is_empty());
        // A late answer is dropped without harm and the connection keeps working.
        let request = next_json(&mut from_client).await;
        answer_empty(&mut agent, &request).await;
        assert!(!rpc.is_closed());
    }

    #[tokio::test]
    async fn a_detached_requests_answer_is_expected_and_forgotten() {
        let (rpc, mut from_client, mut agent) = connect();
        rpc.send_detached("session/prompt", json!({}))
            .expect("send");
        let request = next_json(&mut from_client).await;
        assert_eq!(rpc.shared.lock().detached.len(), 1);
        answer_empty(&mut agent, &request).await;
        // The answer is taken off the list once read; the connection keeps working.
        let answer = rpc.call("next", json!({}), Some(Duration::from_secs(5)));
        let (result, ()) = tokio::join!(answer, async {
            let request = next_json(&mut from_client).await;
            answer_empty(&mut agent, &request).await;
        });
        assert_eq!(result, Ok(json!({})));
        assert!(rpc.shared.lock().detached.is_empty());
    }

    #[tokio::test]
    async fn closed_stream_fails_pending_and_later_calls() {
        let (rpc, mut from_client, agent) = connect();
        let rpc = Arc::new(rpc);
        let mut updates = rpc.subscribe();
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call("a", json!({}), None).await }
        });
        let _request = next_json(&mut from_client).await;
        drop(agent); // EOF on the client's read side
        assert_eq!(call.await.expect("join"), Err(CallFailure::TransportClosed));
        assert!(rpc.is_closed());
        assert_eq!(
            rpc.call("b", json!({}), None).await,
            Err(CallFailure::TransportClosed)
        );
        assert_eq!(
            rpc.notify("n", json!({})),
            Err(CallFailure::TransportClosed)
        );
        assert!(
            updates.recv().await.is_none(),
            "update streams end with the connection"
        );
    }

    #[tokio::test]
    async fn answers_agent_requests_it_does_not_serve() {
        let (_rpc, mut from_client, mut agent) = connect();
        say(&mut agent, r#"{"jsonrpc":"2.0","id":7,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/etc/passwd"}}"#).await;
        let answer = next_json(&mut from_client).await;
        assert_eq!(answer["id"], 7);
        assert_eq!(answer["error"]["code"], METHOD_NOT_FOUND);
        say(
            &mut agent,
            r#"{"jsonrpc":"2.0","id":"p-1","method":"session/request_permission","params":{}}"#,
        )
        .await;
        let answer = next_json(&mut from_client).await;
        assert_eq!(answer["id"], "p-1");
        assert_eq!(
            answer["result"],
            json!({"outcome": {"outcome": "cancelled"}})
        );
    }

    #[tokio::test]
    async fn an_over_long_line_cuts_the_agent_off() {
        let (rpc, mut from_client, mut agent) = connect();
        let rpc = Arc::new(rpc);
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call("a", json!({}), Some(Duration::from_secs(5))).await }
        });
        let _request = next_json(&mut from_client).await;
        // Written in the background: the pipe is smaller than the line, and the client stops
        // reading once it has seen the limit pass.
        tokio::spawn(async move {
            let _ = agent.write_all(&vec![b'x'; 2 * 1024 * 1024]).await;
            let _ = agent.write_all(b"\n").await;
        });
        let limit = AgentLimit::Line { limit: LINE_LIMIT };
        assert_eq!(
            call.await.expect("join"),
            Err(CallFailure::AgentLimit(limit))
        );
        assert!(rpc.is_closed());
        assert_eq!(
            rpc.call("b", json!({}), None).await,
            Err(CallFailure::AgentLimit(limit)),
            "later calls name the reason too"
        );
        // The agent's stdin was closed: it sees EOF.
        assert!(from_client.next_line().await.expect("read").is_none());
    }

    /// An answer within the line limit that would cost far more to parse (a dense array of
    /// zeros) is never parsed: the agent is cut off, naming what the line would have cost.
    #[tokio::test]
    async fn a_line_too_dense_to_parse_cuts_the_agent_off() {
        let (rpc, mut from_client, mut agent) = connect();
        let rpc = Arc::new(rpc);
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call("a", json!({}), Some(Duration::from_secs(5))).await }
        });
        let request = next_json(&mut from_client).await;
        let zeros = "0,".repeat(400_000);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":[{zeros}0]}}\n",
            request["id"]
        );
        assert!(line.len() < LINE_LIMIT);
        tokio::spawn(async move {
            let _ = agent.write_all(line.as_bytes()).await;
        });
        let result = call.await.expect("join");
        let Err(CallFailure::AgentLimit(AgentLimit::ParseCost { cost, bound })) = result else {
            panic!("not cut off for its parse cost: {result:?}");
        };
        assert_eq!(bound, 3 * LINE_LIMIT);
        assert!(cost > bound, "{cost} > {bound}");
        assert!(rpc.is_closed());
    }

    #[tokio::test]
    async fn an_agent_that_does_not_read_its_input_is_cut_off() {
        let (rpc, from_client, mut agent) = connect();
        let rpc = Arc::new(rpc);
        let call = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call("a", json!({}), None).await }
        });
        // Requests the client answers, while nobody reads the client's output.
        let mut requests = String::new();
        for n in 0..OUTGOING_CAPACITY * 2 {
            requests.push_str(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{n},\"method\":\"fs/read_text_file\"}}\n"
            ));
        }
        tokio::spawn(async move {
            let _ = agent.write_all(requests.as_bytes()).await;
            // Hold the pipe open: only the limit may end this.
            std::future::pending::<()>().await;
        });
        assert_eq!(
            call.await.expect("join"),
            Err(CallFailure::AgentLimit(AgentLimit::Input {
                limit: OUTGOING_CAPACITY
            }))
        );
        drop(from_client);
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_dropped() {
        let (rpc, _from_client, mut agent) = connect();
        let mut lagging = rpc.subscribe();
        let mut reading = rpc.subscribe();
        let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk"}}}"#;
        let total = SUBSCRIBER_CAPACITY + 10;
        let writer = tokio::spawn(async move {
            for _ in 0..total {
                say(&mut agent, update).await;
            }
            agent
        });
        for _ in 0..total {
            reading.recv().await.expect("the reader keeps up");
        }
        let _agent = writer.await.expect("join");
        let mut queued = 0;
        while lagging.recv().await.is_some() {
            queued += 1;
        }
        assert_eq!(queued, SUBSCRIBER_CAPACITY, "then its stream ended");
        assert!(!rpc.is_closed(), "the connection itself is fine");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn runtime() -> tokio::runtime::Runtime {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
        }

        /// A line an agent could print: no newline inside, often not JSON at all.
        fn line(max: usize) -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(
                    any::<u8>().prop_filter("no newline", |b| *b != b'\n'),
                    0..max
                ),
                "[\\[\\]{}\":,0-9a-z \\\\]{0,64}".prop_map(String::into_bytes),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<i64>().prop_map(Value::from),
                "\\PC{0,12}".prop_map(Value::from),
                prop::collection::btree_map("[a-z]{1,4}", any::<u32>(), 0..3)
                    .prop_map(|m| json!(m)),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any bytes: no panic; only a JSON object can be more than blank or garbage.
            #[test]
            fn any_line_is_classified(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
                let incoming = classify_line(&bytes);
                let object = serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| v.is_object());
                if !object {
                    prop_assert!(matches!(incoming, Incoming::Blank | Incoming::Garbage(_)), "{:?}", incoming);
                }
            }

            /// An answer to one of our ids (a number, or echoed back as a string) resolves that
            /// call: with its result, its integer error code, or as malformed.
            #[test]
            fn answers_resolve_our_calls(
                id in any::<u64>(),
                as_string in any::<bool>(),
                outcome in prop_oneof![
                    value().prop_map(|v| ("result", v)),
                    (any::<i64>(), "\\PC{0,12}").prop_map(|(c, m)| ("error", json!({"code": c, "message": m}))),
                    value().prop_map(|v| ("error", json!({"code": v}))),
                ],
            ) {
                let wire_id = if as_string { json!(id.to_string()) } else { json!(id) };
                let (key, body) = outcome;
                let line = json!({"jsonrpc": "2.0", "id": wire_id, key: body.clone()}).to_string();
                let result = match classify_line(line.as_bytes()) {
                    Incoming::Answer { id: answered, result } => {
                        prop_assert_eq!(answered, id);
                        result
                    }
                    other => return Err(TestCaseError::fail(format!("{other:?}"))),
                };
                match (key, body.pointer("/code").and_then(Value::as_i64)) {
                    ("result", _) => prop_assert_eq!(result, Ok(body)),
                    (_, Some(code)) => {
                        let got = match result {
                            Err(CallFailure::JsonRpc { code, .. }) => Some(code),
                            _ => None,
                        };
                        prop_assert_eq!(got, Some(code));
                    }
                    (_, None) => {
                        let malformed = matches!(result, Err(CallFailure::MalformedResponse(_)));
                        prop_assert!(malformed);
                    }
                }
            }
        }

        proptest! {
            // Each case runs a connection on its own runtime.
            #![proptest_config(ProptestConfig::with_cases(48))]

            /// Lines within the limit never break the connection, whatever they hold: the
            /// answer after them still resolves the call. One line over the limit, whatever it
            /// holds, cuts the agent off and the call fails with the line limit (a classified
            /// failure that keeps the token), never with a parse error or a hang.
            #[test]
            fn garbage_is_skipped_and_an_over_long_line_is_the_limit_error(
                garbage in prop::collection::vec(line(64), 0..6),
                over_by in prop::option::of(1usize..300),
                filler in any::<u8>().prop_filter("no newline", |b| *b != b'\n'),
            ) {
                const LIMIT: usize = 64;
                let result = runtime().block_on(async {
                    let (rpc, mut from_client, mut agent) = connect();
                    rpc.set_limits(AcpLimits { line: LIMIT, replay_line: LIMIT, replay_budget: 1 << 20 });
                    let rpc = Arc::new(rpc);
                    let call = tokio::spawn({
                        let rpc = rpc.clone();
                        async move { rpc.call("m", json!({}), None).await }
                    });
                    let request = next_json(&mut from_client).await;
                    let mut data = Vec::new();
                    for line in &garbage {
                        data.extend_from_slice(line);
                        data.push(b'\n');
                    }
                    if let Some(over_by) = over_by {
                        data.extend(std::iter::repeat_n(filler, LIMIT + over_by));
                        data.push(b'\n');
                    }
                    data.extend_from_slice(json!({"jsonrpc": "2.0", "id": request["id"], "result": "done"}).to_string().as_bytes());
                    data.push(b'\n');
                    // The agent's side stays open: only the answer or the limit may end the call.
                    let writer = tokio::spawn(async move {
                        let _ = agent.write_all(&data).await;
                        std::future::pending::<()>().await;
                    });
                    let result = call.await.expect("join");
                    writer.abort();
                    (result, rpc.is_closed())
                });
                match over_by {
                    None => prop_assert_eq!(result, (Ok(json!("done")), false)),
                    Some(_) => prop_assert_eq!(
                        result,
                        (Err(CallFailure::AgentLimit(AgentLimit::Line { limit: LIMIT })), true)
                    ),
                }
            }
        }
    }
}
