//! `kubectl kandev prompt` on a terminal answers the agent's permission requests itself: it
//! connects with `agentctl connect --permissions` (agentctl then passes the agent's
//! `session/request_permission` on instead of applying the session's policy), shows what the
//! agent asks on stderr, reads `y`, `a` or `N` from stdin and answers with the option of that
//! kind.
//!
//! The ACP client ([`AcpClient`]) answers every request of the agent with a default (a permission
//! request: cancelled). So the connection is split in two pumps between the exec stream and the
//! client ([`AgentLink`]): one takes the agent's permission requests out of the stream (they
//! never reach the client) and passes every other line on; the other passes the client's lines
//! to the agent and puts this command's answers between them, at line boundaries.
//!
//! The pure parts first, table-tested: what a request asks ([`agent_ask`]), the reply an
//! answer letter means ([`reply_of`]) and the option it picks ([`chosen_option`],
//! [`answer_line`]).

use std::collections::VecDeque;
use std::io::{BufRead, IsTerminal};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachedProcess};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::acp::{AcpClient, AcpError, exec_stdio};
use crate::api::{PermissionAsk, ToolKind};
use crate::jsonrpc::codec::DEFAULT_REPLAY_LINE_LIMIT;
use crate::jsonrpc::{Frame, LineReader, encode_line, method, result_message};

// ------------------------------------------------------------------------------------------
// the rules (pure)

/// Whether `prompt` asks the person at the terminal: stdin to read the answer from and stderr to
/// show the question on are both a terminal.
pub fn asks_here() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// The longest request id echoed back (agentctl passes the agent's own).
const ID_MAX: usize = 128;
/// The most of a tool's input shown.
const SUMMARY_SHOWN: usize = 600;

/// One `session/request_permission` of the agent.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentAsk {
    /// The request's JSON-RPC id (the answer's).
    pub id: Value,
    pub kind: ToolKind,
    pub title: String,
    /// What the tool would do (its input, as JSON), cut to a bound.
    pub summary: String,
    /// The options offered: `(optionId, kind)`.
    pub options: Vec<(String, String)>,
}

/// The agent's permission request on `line`, when it is one (a request of that method with an
/// id that can be echoed); anything else is passed on to the client.
pub fn agent_ask(line: &[u8]) -> Option<AgentAsk> {
    let needle = method::SESSION_REQUEST_PERMISSION.as_bytes();
    if !line.windows(needle.len()).any(|w| w == needle) {
        return None;
    }
    let Value::Object(mut message) = serde_json::from_slice::<Value>(line).ok()? else {
        return None;
    };
    if message.get("method").and_then(Value::as_str) != Some(method::SESSION_REQUEST_PERMISSION) {
        return None;
    }
    let id = message.remove("id").filter(|id| !id.is_null())?;
    if id.to_string().len() > ID_MAX {
        return None;
    }
    Some(ask_from(id, message.get("params")))
}

/// What a request's `params` ask (ACP `RequestPermissionRequest`).
pub fn ask_from(id: Value, params: Option<&Value>) -> AgentAsk {
    let asked = PermissionAsk::read(params, SUMMARY_SHOWN);
    AgentAsk {
        id,
        kind: asked.kind,
        title: asked.title,
        summary: asked.summary,
        options: asked.offered,
    }
}

/// What the person answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    AllowOnce,
    AllowAlways,
    /// The default (`N`, an empty line, anything not understood, stdin closed).
    Reject,
}

impl Reply {
    /// The option kind the reply chooses.
    pub fn kind(self) -> &'static str {
        match self {
            Self::AllowOnce => "allow_once",
            Self::AllowAlways => "allow_always",
            Self::Reject => "reject_once",
        }
    }
}

/// The reply an answer to `allow once / always / reject? [y/a/N]` means.
pub fn reply_of(input: &str) -> Reply {
    match input.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" | "o" | "once" => Reply::AllowOnce,
        "a" | "always" => Reply::AllowAlways,
        _ => Reply::Reject,
    }
}

/// The id of the option of the reply's kind, `None` when the request offers none.
pub fn chosen_option(options: &[(String, String)], reply: Reply) -> Option<&str> {
    options
        .iter()
        .find(|(_, kind)| kind == reply.kind())
        .map(|(id, _)| id.as_str())
}

/// The answer to the agent: the option chosen (`selected`), or `cancelled` when the request
/// offers no option of the reply's kind.
pub fn answer_line(ask: &AgentAsk, reply: Reply) -> Vec<u8> {
    let outcome = match chosen_option(&ask.options, reply) {
        Some(option) => json!({"outcome": "selected", "optionId": option}),
        None => json!({"outcome": "cancelled"}),
    };
    encode_line(&result_message(
        ask.id.clone(),
        json!({ "outcome": outcome }),
    ))
}

/// The question on stderr (without a newline after it: the answer is typed there).
pub fn question(ask: &AgentAsk) -> String {
    let one_line = |text: &str| text.replace(['\n', '\r', '\t'], " ");
    let mut out = format!(
        "[permission] the agent asks to {}: {}\n",
        ask.kind,
        one_line(&ask.title)
    );
    if !ask.summary.is_empty() {
        out.push_str(&format!("  {}\n", one_line(&ask.summary)));
    }
    out.push_str("allow once / always / reject? [y/a/N] ");
    out
}

/// What was answered, for stderr.
pub fn answered(ask: &AgentAsk, reply: Reply) -> String {
    match chosen_option(&ask.options, reply) {
        Some(option) => format!("[permission: {} ({option})]", reply.kind()),
        None => format!(
            "[permission: cancelled: the agent offers no {} option]",
            reply.kind()
        ),
    }
}

/// The hint `prompt` gives once when it cannot ask (no terminal).
pub fn policy_hint(name: &str, namespace: &str) -> String {
    format!(
        "kubectl-kandev: no terminal to ask on: the agent's permission requests go to the session's policy (spec.permissions); held ones show in `kubectl kandev permissions {name} -n {namespace}` and are answered with `kubectl kandev approve|deny {name} ID -n {namespace}`"
    )
}

// ------------------------------------------------------------------------------------------
// the connection

/// The longest line the pump passes on (the client applies its own, lower limit to it).
const PUMP_LINE_LIMIT: usize = DEFAULT_REPLAY_LINE_LIMIT;
/// The pipes between the pumps and the client.
const PIPE_BYTES: usize = 64 * 1024;

/// `agentctl connect` in the agentctl pod, as an ACP client; with `--permissions`, the agent's
/// permission requests come out on [`Self::asks`] and their answers go in with
/// [`Self::answers`].
pub struct AgentLink {
    pub client: AcpClient,
    process: Option<AttachedProcess>,
    pub asks: Option<mpsc::Receiver<AgentAsk>>,
    pub answers: Option<mpsc::Sender<Vec<u8>>>,
    pumps: Vec<JoinHandle<()>>,
}

impl AgentLink {
    /// Execs `agentctl connect` (with `--permissions` when `decides`) in `container` of `pod`.
    pub async fn open(
        pods: &Api<Pod>,
        pod: &str,
        container: &str,
        decides: bool,
    ) -> Result<Self, AcpError> {
        let command: &[&str] = if decides {
            &["agentctl", "connect", "--permissions"]
        } else {
            &["agentctl", "connect"]
        };
        let (process, stdout, stdin) = exec_stdio(pods, pod, container, command).await?;
        if !decides {
            return Ok(Self {
                client: AcpClient::new(stdout, stdin),
                process: Some(process),
                asks: None,
                answers: None,
                pumps: Vec::new(),
            });
        }
        let mut link = Self::deciding(stdout, stdin);
        link.process = Some(process);
        Ok(link)
    }

    /// An ACP client over `from`/`to` (the agent's side) with the two pumps between them.
    fn deciding(
        from: impl AsyncRead + Unpin + Send + 'static,
        to: impl AsyncWrite + Unpin + Send + 'static,
    ) -> Self {
        let (client_reads, agent_lines) = tokio::io::duplex(PIPE_BYTES);
        let (client_writes, client_lines) = tokio::io::duplex(PIPE_BYTES);
        let (asks_tx, asks) = mpsc::channel(16);
        let (answers, answers_rx) = mpsc::channel(16);
        let pumps = vec![
            tokio::spawn(agent_to_client(from, agent_lines, asks_tx)),
            tokio::spawn(client_to_agent(client_lines, to, answers_rx)),
        ];
        Self {
            client: AcpClient::new(client_reads, client_writes),
            process: None,
            asks: Some(asks),
            answers: Some(answers),
            pumps,
        }
    }

    /// Ends the connection, leaving the agent running: `_kandev/disconnect`, then wait up to
    /// `grace` for `agentctl connect` to exit (as [`crate::acp::PodConnection::close`]).
    pub async fn close(mut self, grace: Duration) {
        self.client.disconnect(grace).await;
        if let Some(process) = self.process.take()
            && tokio::time::timeout(grace, process.join()).await.is_err()
        {
            tracing::debug!("agentctl connect did not exit in time; dropping the exec stream");
        }
    }
}

impl Drop for AgentLink {
    fn drop(&mut self) {
        for pump in &self.pumps {
            pump.abort();
        }
    }
}

/// The agent's lines to the client, but for its permission requests, which go to `asks`. A line
/// too long to pass on ends the connection (the client would cut the agent off for it too).
async fn agent_to_client(
    from: impl AsyncRead + Unpin,
    mut to: DuplexStream,
    asks: mpsc::Sender<AgentAsk>,
) {
    let mut reader = LineReader::new(BufReader::new(from), PUMP_LINE_LIMIT);
    loop {
        match reader.next_line().await {
            Ok(Frame::Line) => {}
            Ok(Frame::TooLong { len } | Frame::TooCostly { len, .. }) => {
                tracing::warn!(
                    len,
                    "agentctl sent a line too long to pass on; disconnecting"
                );
                break;
            }
            Ok(Frame::Eof) | Err(_) => break,
        }
        let line = reader.line();
        if let Some(ask) = agent_ask(line) {
            if asks.send(ask).await.is_err() {
                break;
            }
            continue;
        }
        if to.write_all(line).await.is_err() || to.write_all(b"\n").await.is_err() {
            break;
        }
    }
    // Dropping `to` ends the client's stream.
}

/// The client's bytes to the agent, with the answers put in where a line has ended.
async fn client_to_agent(
    mut from: DuplexStream,
    mut to: impl AsyncWrite + Unpin,
    mut answers: mpsc::Receiver<Vec<u8>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut at_line_start = true;
    loop {
        tokio::select! {
            read = from.read(&mut buf) => {
                let chunk = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => &buf[..n],
                };
                if to.write_all(chunk).await.is_err() || to.flush().await.is_err() {
                    return;
                }
                at_line_start = chunk.last() == Some(&b'\n');
            }
            Some(answer) = answers.recv(), if at_line_start => {
                if to.write_all(&answer).await.is_err() || to.flush().await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

// ------------------------------------------------------------------------------------------
// asking

/// The permission requests of one connection: asked one at a time, the others queued.
#[derive(Default)]
pub struct Asker {
    queued: VecDeque<AgentAsk>,
    asking: Option<(AgentAsk, JoinHandle<std::io::Result<String>>)>,
}

impl Asker {
    /// A new request: asked now, or after those before it.
    pub fn push(&mut self, ask: AgentAsk) {
        self.queued.push_back(ask);
        self.next();
    }

    pub fn is_asking(&self) -> bool {
        self.asking.is_some()
    }

    fn next(&mut self) {
        if self.asking.is_some() {
            return;
        }
        let Some(ask) = self.queued.pop_front() else {
            return;
        };
        super::write_stderr(&question(&ask));
        let read = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).map(|_| line)
        });
        self.asking = Some((ask, read));
    }

    /// Waits for the answer to the request asked (forever when none is); cancel-safe.
    pub async fn reply(&mut self) -> std::io::Result<String> {
        match &mut self.asking {
            Some((_, read)) => read
                .await
                .unwrap_or_else(|error| Err(std::io::Error::other(error))),
            None => std::future::pending().await,
        }
    }

    /// The answer to the request asked, read as `input` (a failed read rejects); asks the next.
    pub fn answered(&mut self, input: std::io::Result<String>) -> Option<Vec<u8>> {
        let (ask, _) = self.asking.take()?;
        let reply = input.map_or(Reply::Reject, |line| reply_of(&line));
        say!("{}", answered(&ask, reply));
        let line = answer_line(&ask, reply);
        self.next();
        Some(line)
    }

    /// The turn ended (or was left) with a question open: the line is ended, and the request
    /// left to agentctl (the session's policy decides it once this client is gone).
    pub fn abandon(&mut self) {
        if let Some((ask, _)) = self.asking.take() {
            super::write_stderr("\n");
            say!(
                "[permission request \"{}\" left unanswered: the session's policy decides it]",
                ask.title.replace(['\n', '\r', '\t'], " ")
            );
        }
        self.queued.clear();
    }
}

/// The next permission request of `asks` (never, without them).
pub async fn next_ask(asks: &mut Option<mpsc::Receiver<AgentAsk>>) -> Option<AgentAsk> {
    match asks {
        Some(asks) => asks.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn request(id: Value, options: &[&str]) -> String {
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "session/request_permission",
            "params": {
                "sessionId": "s1",
                "toolCall": {"toolCallId": "call-1", "title": "Run make test", "kind": "execute",
                             "rawInput": {"command": "make test"}},
                "options": options.iter().map(|k| json!({"optionId": format!("opt-{k}"), "name": k, "kind": k})).collect::<Vec<_>>()
            }
        })
        .to_string()
    }

    const ALL: &[&str] = &["allow_once", "allow_always", "reject_once", "reject_always"];

    #[test]
    fn only_permission_requests_are_taken_out_of_the_stream() {
        let ask = agent_ask(request(json!(7), ALL).as_bytes()).expect("a request");
        assert_eq!(ask.id, json!(7));
        assert_eq!(ask.kind, ToolKind::Execute);
        assert_eq!(ask.title, "Run make test");
        assert_eq!(ask.summary, r#"{"command":"make test"}"#);
        assert_eq!(ask.options.len(), 4);
        assert_eq!(
            ask.options[0],
            ("opt-allow_once".to_string(), "allow_once".to_string())
        );
        let passed_on = [
            // A notification that mentions the method, an answer, a request of another method.
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"update": {"text": "session/request_permission"}}}).to_string(),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"method": "session/request_permission"}}).to_string(),
            json!({"jsonrpc": "2.0", "id": 2, "method": "fs/read_text_file", "params": {"path": "session/request_permission"}}).to_string(),
            // Without an id (a notification), or an id too long to echo.
            json!({"jsonrpc": "2.0", "method": "session/request_permission", "params": {}}).to_string(),
            request(json!("x".repeat(200)), ALL),
            "session/request_permission but not JSON".to_string(),
        ];
        for line in passed_on {
            assert_eq!(agent_ask(line.as_bytes()), None, "{line}");
        }
        // A request without a title or options still asks.
        let bare = ask_from(
            json!("p-1"),
            Some(&json!({"toolCall": {"toolCallId": "c9"}})),
        );
        assert_eq!(
            (bare.kind, bare.title.as_str(), bare.options.len()),
            (ToolKind::Other, "c9", 0)
        );
        assert_eq!(ask_from(json!(1), None).title, "(untitled tool call)");
    }

    #[test]
    fn answer_letters() {
        #[rustfmt::skip]
        let rows = [
            ("y\n", Reply::AllowOnce), ("Y", Reply::AllowOnce), (" yes \n", Reply::AllowOnce),
            ("a\n", Reply::AllowAlways), ("always", Reply::AllowAlways),
            ("n\n", Reply::Reject), ("N", Reply::Reject), ("\n", Reply::Reject), ("", Reply::Reject),
            ("maybe", Reply::Reject), ("ya", Reply::Reject),
        ];
        for (input, reply) in rows {
            assert_eq!(reply_of(input), reply, "{input:?}");
        }
    }

    #[test]
    fn the_option_of_the_replys_kind_or_cancelled() {
        let answer = |options: &[&str], reply: Reply| {
            let ask = agent_ask(request(json!(5), options).as_bytes()).expect("a request");
            let line = answer_line(&ask, reply);
            assert_eq!(line.last(), Some(&b'\n'), "one line");
            serde_json::from_slice::<Value>(&line).expect("json")
        };
        let selected = |option: &str| json!({"jsonrpc": "2.0", "id": 5, "result": {"outcome": {"outcome": "selected", "optionId": option}}});
        let cancelled =
            json!({"jsonrpc": "2.0", "id": 5, "result": {"outcome": {"outcome": "cancelled"}}});
        #[rustfmt::skip]
        let rows: Vec<(&[&str], Reply, Value)> = vec![
            (ALL, Reply::AllowOnce, selected("opt-allow_once")),
            (ALL, Reply::AllowAlways, selected("opt-allow_always")),
            (ALL, Reply::Reject, selected("opt-reject_once")),
            // Not offered: cancelled (an agent treats it as a rejection).
            (&["allow_once", "reject_once"], Reply::AllowAlways, cancelled.clone()),
            (&["allow_once", "allow_always"], Reply::Reject, cancelled.clone()),
            (&[], Reply::AllowOnce, cancelled),
        ];
        for (options, reply, expected) in rows {
            assert_eq!(answer(options, reply), expected, "{options:?} {reply:?}");
        }
    }

    #[test]
    fn the_question_and_what_was_answered() {
        let mut ask = agent_ask(request(json!(5), &["allow_once", "reject_once"]).as_bytes())
            .expect("a request");
        assert_eq!(
            question(&ask),
            "[permission] the agent asks to execute: Run make test\n  {\"command\":\"make test\"}\nallow once / always / reject? [y/a/N] "
        );
        assert_eq!(
            answered(&ask, Reply::AllowOnce),
            "[permission: allow_once (opt-allow_once)]"
        );
        assert_eq!(
            answered(&ask, Reply::AllowAlways),
            "[permission: cancelled: the agent offers no allow_always option]"
        );
        // A title cannot forge a line of its own.
        ask.title = "ok\nallow once / always / reject? [y/a/N] y".into();
        ask.summary = String::new();
        assert_eq!(question(&ask).lines().count(), 2, "{}", question(&ask));
    }

    /// Through the pumps, an ACP client prompts; the agent asks for a permission in the middle
    /// of the turn; the request comes out on `asks` (the client never sees it), the answer goes
    /// in and reaches the agent, which then ends the turn.
    #[tokio::test]
    async fn a_turn_with_a_permission_request_answered_here() {
        use tokio::io::AsyncBufReadExt;
        let (agent_reads, link_writes) = tokio::io::duplex(64 * 1024);
        let (link_reads, mut agent_writes) = tokio::io::duplex(64 * 1024);
        let agent = tokio::spawn(async move {
            let mut lines = BufReader::new(agent_reads).lines();
            let mut prompt_id = Value::Null;
            let mut seen = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).expect("the client sends JSON");
                seen.push(message.clone());
                let out = match message["method"].as_str() {
                    Some("session/prompt") => {
                        prompt_id = message["id"].clone();
                        request(json!("perm-1"), ALL)
                    }
                    None if message["id"] == json!("perm-1") => {
                        let option = &message["result"]["outcome"]["optionId"];
                        let chunk = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1",
                            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": option}}}});
                        let done = json!({"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "end_turn"}});
                        format!("{chunk}\n{done}")
                    }
                    _ => continue,
                };
                agent_writes
                    .write_all(format!("{out}\n").as_bytes())
                    .await
                    .expect("write");
            }
            seen
        });
        let mut link = AgentLink::deciding(link_reads, link_writes);
        let mut asks = link.asks.take().expect("asks");
        let answers = link.answers.clone().expect("answers");
        let mut updates = link.client.subscribe_updates();
        let stop = {
            let prompt = link.client.prompt("s1", "run the tests");
            tokio::pin!(prompt);
            let ask = tokio::select! {
                ask = asks.recv() => ask.expect("the request"),
                result = &mut prompt => panic!("the turn ended first: {result:?}"),
            };
            assert_eq!(
                (ask.kind, ask.title.as_str()),
                (ToolKind::Execute, "Run make test")
            );
            answers
                .send(answer_line(&ask, reply_of("a")))
                .await
                .expect("send");
            prompt.await.expect("the turn")
        };
        assert_eq!(format!("{stop:?}"), "EndTurn");
        assert_eq!(
            updates.recv().await.expect("update").text(),
            Some("opt-allow_always")
        );
        drop(link);
        let seen = agent.await.expect("agent");
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[1]["result"]["outcome"]["outcome"], "selected");
    }

    /// The pumps: the client's lines reach the agent with the answers between them, the
    /// agent's permission requests come out on `asks`, and everything else reaches the client.
    #[tokio::test]
    async fn the_pumps_take_requests_out_and_put_answers_in() {
        use tokio::io::AsyncBufReadExt;
        // agent → client
        let (mut agent_out, pump_in) = tokio::io::duplex(4096);
        let (client_in, pump_out) = tokio::io::duplex(4096);
        let (asks_tx, mut asks) = mpsc::channel(4);
        let reader = tokio::spawn(agent_to_client(pump_in, pump_out, asks_tx));
        let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#;
        agent_out
            .write_all(format!("{update}\n{}\n{update}\r\n", request(json!(9), ALL)).as_bytes())
            .await
            .expect("write");
        drop(agent_out);
        let ask = asks.recv().await.expect("the request");
        assert_eq!(ask.id, json!(9));
        let mut lines = BufReader::new(client_in).lines();
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().await.expect("read") {
            got.push(line);
        }
        assert_eq!(got, [update, update]);
        reader.await.expect("pump");

        // client → agent
        let (mut client_out, pump_in) = tokio::io::duplex(4096);
        let (agent_in, pump_out) = tokio::io::duplex(4096);
        let (answers_tx, answers_rx) = mpsc::channel(4);
        let writer = tokio::spawn(client_to_agent(pump_in, pump_out, answers_rx));
        // Half a line: the answer waits until it ends.
        client_out.write_all(b"{\"a\":").await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        answers_tx
            .send(answer_line(&ask, Reply::AllowOnce))
            .await
            .expect("send");
        tokio::time::sleep(Duration::from_millis(50)).await;
        client_out
            .write_all(b"1}\n{\"b\":2}\n")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(client_out);
        let mut lines = BufReader::new(agent_in).lines();
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().await.expect("read") {
            got.push(serde_json::from_str::<Value>(&line).expect("each line is JSON"));
        }
        writer.await.expect("pump");
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], json!({"a": 1}));
        assert!(got.contains(&json!({"b": 2})), "{got:?}");
        assert!(
            got.iter()
                .any(|v| v["id"] == json!(9)
                    && v["result"]["outcome"]["optionId"] == "opt-allow_once"),
            "{got:?}"
        );
    }
}
