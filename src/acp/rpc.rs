//! Our own thin JSON-RPC 2.0 line layer: one JSON message per line, in both directions.
//!
//! Why not the `agent-client-protocol` crate's connection machinery: the restore path must
//! classify every wire problem precisely (DESIGN §3: a timeout, a closed stream and a garbage
//! answer all keep the token, while -32601/-32002 do not), survive agents that print non-JSON
//! on stdout, and run over any byte stream (child stdio, unix socket, Kubernetes exec). A small
//! layer whose every failure maps to [`RestoreFailure`] is easier to reason about than adapting
//! a general-purpose one. The crate's schema types are still used for every message body.
//!
//! Structure: a reader task parses lines, routes responses by id to the waiting call, forwards
//! `session/update` notifications to subscribers and answers requests from the agent; a writer
//! task owns the write half so callers and the reader can both send without sharing a lock
//! across an `.await`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::resume::{INTERNAL_ERROR, METHOD_NOT_FOUND, RestoreFailure};

use super::updates::SessionUpdateEvent;

/// Longest line we buffer. Session replays and tool results can be large, but an agent that
/// streams megabytes without a newline is broken and must not make us allocate without bound.
pub(crate) const MAX_LINE_BYTES: usize = 32 * 1024 * 1024;

/// How much of a bad line goes into a warning: enough to recognise it, not enough to flood logs
/// (or leak much of whatever the agent printed).
const PREVIEW_CHARS: usize = 160;

/// The ACP method an agent uses to ask the user for permission. We never have a user at hand
/// during a restore, so we answer "cancelled" instead of method-not-found: the ACP spec lets a
/// client cancel a permission request, and the agent then aborts only the tool call.
const REQUEST_PERMISSION: &str = "session/request_permission";
const SESSION_UPDATE: &str = "session/update";

type CallResult = Result<Value, RestoreFailure>;

/// Mutable connection state; only ever locked briefly and never across an `.await`.
#[derive(Default)]
struct State {
    pending: HashMap<u64, oneshot::Sender<CallResult>>,
    /// Set once the stream closed (EOF, read or write error). Later calls fail at once.
    closed: bool,
    subscribers: Vec<mpsc::UnboundedSender<SessionUpdateEvent>>,
}

/// What the reader task, the writer task and the callers share.
struct Shared {
    state: Mutex<State>,
    garbage_lines: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map half-updated in a way that
        // matters (every operation is a single insert/remove/retain), so poisoning is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the stream closed and fails every pending call with `TransportClosed`. Dropping
    /// the subscriber senders ends their receivers too, so update streams see the end.
    fn close(&self) {
        let (pending, subscribers) = {
            let mut state = self.lock();
            state.closed = true;
            (
                std::mem::take(&mut state.pending),
                std::mem::take(&mut state.subscribers),
            )
        };
        for (_, waiter) in pending {
            let _ = waiter.send(Err(RestoreFailure::TransportClosed));
        }
        drop(subscribers);
    }

    fn resolve(&self, id: u64, result: CallResult) {
        let waiter = self.lock().pending.remove(&id);
        match waiter {
            Some(waiter) => {
                // The caller may have given up (timeout) in the meantime; that is fine.
                let _ = waiter.send(result);
            }
            None => tracing::warn!(
                id,
                "answer for a request nobody waits for (late after a timeout?)"
            ),
        }
    }

    fn publish(&self, event: SessionUpdateEvent) {
        let mut state = self.lock();
        // Dropped receivers are pruned here rather than tracked: cheap and always correct.
        state
            .subscribers
            .retain(|subscriber| subscriber.send(event.clone()).is_ok());
    }
}

/// A JSON-RPC connection over one byte stream.
pub(crate) struct RpcConnection {
    shared: Arc<Shared>,
    outgoing: mpsc::UnboundedSender<Vec<u8>>,
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
            state: Mutex::new(State::default()),
            garbage_lines: AtomicU64::new(0),
        });
        let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
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
            if state.closed {
                return Err(RestoreFailure::TransportClosed);
            }
            state.pending.insert(id, tx);
        }
        // Removes the waiter however this future ends: answered, timed out or dropped.
        let _guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&message)?;
        tracing::debug!(id, method, "request sent");
        let answer = match timeout {
            Some(limit) => match tokio::time::timeout(limit, rx).await {
                Ok(answer) => answer,
                Err(_) => {
                    tracing::warn!(id, method, ?limit, "no answer in time");
                    return Err(RestoreFailure::Timeout);
                }
            },
            None => rx.await,
        };
        // A dropped sender means the connection went away without resolving us.
        answer.unwrap_or(Err(RestoreFailure::TransportClosed))
    }

    /// Sends a request whose answer nobody waits for (it is dropped when it arrives), for turns
    /// that are followed by other means (the operator follows `agentctl events`).
    pub(crate) fn send_detached(&self, method: &str, params: Value) -> Result<(), RestoreFailure> {
        if self.is_closed() {
            return Err(RestoreFailure::TransportClosed);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }

    /// Sends a notification (no answer expected).
    pub(crate) fn notify(&self, method: &str, params: Value) -> Result<(), RestoreFailure> {
        if self.is_closed() {
            return Err(RestoreFailure::TransportClosed);
        }
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    fn send(&self, message: &Value) -> Result<(), RestoreFailure> {
        self.outgoing
            .send(encode_line(message))
            .map_err(|_| RestoreFailure::TransportClosed)
    }

    /// A receiver of every `session/update` notification from now on. It ends when the
    /// connection closes; dropping it unsubscribes.
    pub(crate) fn subscribe(&self) -> mpsc::UnboundedReceiver<SessionUpdateEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.shared.lock();
        // Subscribing to a closed connection yields a receiver that ends at once.
        if !state.closed {
            state.subscribers.push(tx);
        }
        rx
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed
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
        self.shared.close();
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

fn encode_line(message: &Value) -> Vec<u8> {
    // Serializing a `Value` cannot fail, and compact JSON never contains a raw newline, so one
    // message is exactly one line.
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

async fn write_loop<W>(
    mut writer: W,
    mut outgoing: mpsc::UnboundedReceiver<Vec<u8>>,
    shared: Arc<Shared>,
) where
    W: AsyncWrite + Unpin,
{
    while let Some(line) = outgoing.recv().await {
        // Flush every line: the agent must see a request now, not when a buffer fills.
        let written = async {
            writer.write_all(&line).await?;
            writer.flush().await
        }
        .await;
        if let Err(error) = written {
            tracing::warn!(%error, "cannot write to the agent; closing the connection");
            shared.close();
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Outcome of reading one line with a size cap.
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    Line,
    TooLong,
    Eof,
}

/// Reads one `\n`-terminated line into `buf` (without the newline), refusing to buffer more than
/// `max` bytes: the rest of an over-long line is consumed and dropped. A final line without a
/// newline before EOF still counts as a line.
async fn read_line_bounded<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead>
where
    R: AsyncBufRead + Unpin,
{
    buf.clear();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (too_long, buf.is_empty()) {
                (true, _) => LineRead::TooLong,
                (false, true) => LineRead::Eof,
                (false, false) => LineRead::Line,
            });
        }
        let (chunk_len, consumed, done) = match available.iter().position(|b| *b == b'\n') {
            Some(newline) => (newline, newline + 1, true),
            None => (available.len(), available.len(), false),
        };
        if !too_long {
            if buf.len() + chunk_len > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&available[..chunk_len]);
            }
        }
        reader.consume(consumed);
        if done {
            return Ok(if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

async fn read_loop<R>(mut reader: R, shared: Arc<Shared>, outgoing: mpsc::UnboundedSender<Vec<u8>>)
where
    R: AsyncBufRead + Unpin,
{
    let mut buf = Vec::new();
    loop {
        match read_line_bounded(&mut reader, &mut buf, MAX_LINE_BYTES).await {
            Ok(LineRead::Line) => handle_line(&buf, &shared, &outgoing),
            Ok(LineRead::TooLong) => {
                shared.garbage_lines.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    max = MAX_LINE_BYTES,
                    "skipped an over-long line from the agent"
                );
            }
            Ok(LineRead::Eof) => {
                tracing::debug!("agent stream closed");
                break;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read from the agent");
                break;
            }
        }
    }
    shared.close();
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
    tracing::warn!(line = %preview(line), why, skipped_so_far = count, "skipped a line from the agent that is not a JSON-RPC message");
}

/// Our request ids are numbers; tolerate an agent that echoes them back as strings.
fn our_id(id: &Value) -> Option<u64> {
    match id {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn handle_line(line: &[u8], shared: &Shared, outgoing: &mpsc::UnboundedSender<Vec<u8>>) {
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let message: Value = match serde_json::from_slice(line) {
        Ok(message) => message,
        Err(_) => return skip_garbage(shared, line, "not JSON"),
    };
    let Value::Object(object) = &message else {
        return skip_garbage(shared, line, "not a JSON object");
    };
    let id = object.get("id").filter(|id| !id.is_null());
    match (object.get("method").and_then(Value::as_str), id) {
        (Some(method), Some(id)) => answer_agent_request(method, id, outgoing),
        (Some(method), None) => handle_notification(method, object.get("params"), shared),
        (None, Some(id)) => match our_id(id) {
            Some(id) => shared.resolve(id, parse_answer(object)),
            None => tracing::warn!(?id, "answer with an id we never used"),
        },
        (None, None) => {
            if object.contains_key("error") {
                // JSON-RPC: id null means the agent could not even parse what we sent.
                tracing::warn!(error = ?object.get("error"), "agent reported an error without a request id");
            } else {
                skip_garbage(
                    shared,
                    line,
                    "neither a request, a notification nor an answer",
                );
            }
        }
    }
}

/// A response's `result`, or its `error` as [`RestoreFailure::JsonRpc`]; anything else is a
/// malformed answer (it cannot be classified, so it keeps the token).
fn parse_answer(object: &serde_json::Map<String, Value>) -> CallResult {
    if let Some(error) = object.get("error") {
        let code = error.get("code").and_then(Value::as_i64);
        return match code {
            Some(code) => Err(RestoreFailure::JsonRpc {
                code,
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            }),
            None => Err(RestoreFailure::MalformedResponse(format!(
                "error without an integer code: {error}"
            ))),
        };
    }
    match object.get("result") {
        Some(result) => Ok(result.clone()),
        None => Err(RestoreFailure::MalformedResponse(
            "answer has neither result nor error".to_owned(),
        )),
    }
}

fn handle_notification(method: &str, params: Option<&Value>, shared: &Shared) {
    if method != SESSION_UPDATE {
        // e.g. claude-agent-acp's `_auth/status_update`: extension notifications are optional
        // to understand (ACP "_" prefix), and nothing else is addressed to a client.
        tracing::debug!(method, "ignored notification");
        return;
    }
    match params.and_then(SessionUpdateEvent::from_params) {
        Some(event) => shared.publish(event),
        None => tracing::warn!(?params, "session/update without a sessionId and an update"),
    }
}

/// The answer to an agent→client request nobody serves: a permission request is cancelled
/// (the safe choice: nothing runs unattended that the agent asked a human about), anything
/// else gets -32601 saying `why`. Shared by our client and by agentctl without a client.
pub fn default_answer_to_agent_request(id: Value, method: &str, why: &str) -> Value {
    if method == REQUEST_PERMISSION {
        use agent_client_protocol::v1::schema::{
            RequestPermissionOutcome, RequestPermissionResponse,
        };
        let result = RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled);
        match serde_json::to_value(result) {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(error) => json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": INTERNAL_ERROR, "message": format!("cannot encode answer: {error}")}}),
        }
    } else {
        json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": METHOD_NOT_FOUND, "message": format!("method not found: {method} ({why})")}})
    }
}

/// We serve no client capabilities (no file system, no terminal: `initialize` advertises none),
/// so every agent→client request gets -32601, except a permission request, which is cancelled.
fn answer_agent_request(method: &str, id: &Value, outgoing: &mpsc::UnboundedSender<Vec<u8>>) {
    tracing::debug!(method, "answering an agent request we do not serve");
    let answer =
        default_answer_to_agent_request(id.clone(), method, "this client does not serve it");
    // If the writer is gone the connection is closing anyway.
    let _ = outgoing.send(encode_line(&answer));
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
            Err(RestoreFailure::JsonRpc {
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
                Err(RestoreFailure::MalformedResponse(_))
            ));
        }
    }

    #[tokio::test]
    async fn times_out_and_forgets_the_waiter() {
        let (rpc, mut from_client, mut agent) = connect();
        let result = rpc
            .call("slow", json!({}), Some(Duration::from_millis(200)))
            .await;
        assert_eq!(result, Err(RestoreFailure::Timeout));
        assert!(rpc.shared.lock().pending.is_empty());
        // A late answer is dropped without harm and the connection keeps working.
        let request = next_json(&mut from_client).await;
        say(
            &mut agent,
            &format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
                request["id"]
            ),
        )
        .await;
        assert!(!rpc.is_closed());
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
        assert_eq!(
            call.await.expect("join"),
            Err(RestoreFailure::TransportClosed)
        );
        assert!(rpc.is_closed());
        assert_eq!(
            rpc.call("b", json!({}), None).await,
            Err(RestoreFailure::TransportClosed)
        );
        assert_eq!(
            rpc.notify("n", json!({})),
            Err(RestoreFailure::TransportClosed)
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
    async fn bounded_reader_drops_over_long_lines() {
        let data: &[u8] = b"short\n0123456789abcdef\nok\ntail";
        let mut reader = BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        loop {
            let read = read_line_bounded(&mut reader, &mut buf, 8)
                .await
                .expect("read");
            if read == LineRead::Eof {
                break;
            }
            got.push((read, String::from_utf8_lossy(&buf).into_owned()));
        }
        assert_eq!(
            got,
            vec![
                (LineRead::Line, "short".to_owned()),
                (LineRead::TooLong, String::new()),
                (LineRead::Line, "ok".to_owned()),
                (LineRead::Line, "tail".to_owned()),
            ]
        );
    }
}
