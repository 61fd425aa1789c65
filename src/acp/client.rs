//! The ACP client: [`AcpClient`] and its typed calls (`initialize`, `session/new|load|resume`,
//! `session/prompt`, `session/cancel`) over [`RpcConnection`], and the capability summaries of an
//! `initialize` answer. The restore orchestration built on these calls is in `restore.rs`.

use std::path::Path;
use std::time::Duration;

use super::budget::{Held, connection_need, replay_need};
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, Implementation, InitializeRequest, InitializeResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, ResumeSessionRequest, ResumeSessionResponse, StopReason,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::api::bounds::{AGENT_NAME_MAX, AGENT_TEXT_MAX, cap, session_id_problem};
use crate::api::{NegotiatedCapabilities, SessionConfigState};
use crate::jsonrpc::CallFailure;
use crate::resume::AgentRestoreCapabilities;
use crate::resume::{ReportedConfig, reported_config};

use super::rpc::{Replayed, RpcConnection};
use super::updates::SessionUpdateEvent;
use super::{AcpError, LAUNCH_META, PROMPT_ID_META, SESSION_CONFIG_META};
use crate::jsonrpc::method;

/// Per-call deadlines. Every restore step has one because an agent that never answers must not
/// hold a resume forever (and a timeout keeps the token, so a slow agent loses nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcpTimeouts {
    /// `initialize`: claude-agent-acp needs about a second to boot node and answer.
    pub initialize: Duration,
    /// The whole restore (`session/resume`, then `session/load`, then `session/new`, as far as
    /// it goes): each call gets what the earlier ones left. A load replays the whole transcript
    /// before answering, so this is generous.
    pub session: Duration,
    /// `session/prompt`: `None` = no limit, since a turn may legitimately run for hours.
    pub prompt: Option<Duration>,
}

impl Default for AcpTimeouts {
    fn default() -> Self {
        Self {
            initialize: Duration::from_secs(30),
            session: Duration::from_secs(120),
            prompt: None,
        }
    }
}

impl AcpTimeouts {
    /// The same deadline for every call, prompts included (handy in tests).
    pub fn uniform(limit: Duration) -> Self {
        Self {
            initialize: limit,
            session: limit,
            prompt: Some(limit),
        }
    }
}

/// The memory bounds of one agent connection (see `rpc.rs`). An agent that breaks one is cut
/// off, and the call in flight fails with [`CallFailure::AgentLimit`] (the token is kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcpLimits {
    /// Longest line outside a `session/load` replay.
    pub line: usize,
    /// Longest line while a `session/load` is open (one replayed update may carry a whole tool
    /// result). Operator flag `--acp-replay-line-limit-mib`.
    pub replay_line: usize,
    /// Bytes the agent may write while one `session/load` is open, all lines together.
    /// Operator flag `--acp-replay-budget-mib`.
    pub replay_budget: u64,
}

/// Default of [`AcpLimits::replay_budget`]: far beyond any transcript seen, and streamed, so it
/// bounds how long a runaway agent can keep a restore busy rather than memory.
pub const DEFAULT_REPLAY_BUDGET: u64 = 256 * 1024 * 1024;

impl Default for AcpLimits {
    fn default() -> Self {
        Self {
            line: crate::jsonrpc::codec::LINE_LIMIT,
            replay_line: crate::jsonrpc::codec::DEFAULT_REPLAY_LINE_LIMIT,
            replay_budget: DEFAULT_REPLAY_BUDGET,
        }
    }
}

/// An ACP client over any byte stream: a child's stdio, a unix socket, a Kubernetes exec stream.
///
/// It advertises no client capabilities (no file system, no terminal), because it runs where
/// there is no user and no editor: the agent works on its own workspace directly.
pub struct AcpClient {
    rpc: RpcConnection,
    init: Option<InitializeResponse>,
    timeouts: AcpTimeouts,
    /// The launch whose session setup and prompt this client sends ([`LAUNCH_META`]).
    launch: Option<String>,
    /// The session configuration a restore carries ([`SESSION_CONFIG_META`]).
    saved_config: Option<SessionConfigState>,
    /// The session configuration a `session/new` carries.
    new_config: Option<SessionConfigState>,
    /// What the last successful session setup answer said about the session's configuration.
    reported: std::sync::Mutex<Option<ReportedConfig>>,
    /// The id the next `session/prompt` carries ([`PROMPT_ID_META`]).
    prompt_id: Option<String>,
    /// This connection's share of the process-wide memory budget; a `session/load` grows it.
    memory: Option<Held>,
}

impl AcpClient {
    /// Starts the connection's reader and writer tasks; must be called inside a tokio runtime.
    /// Nothing is sent until [`Self::initialize`].
    pub fn new(
        reader: impl AsyncRead + Unpin + Send + 'static,
        writer: impl AsyncWrite + Unpin + Send + 'static,
    ) -> Self {
        Self {
            rpc: RpcConnection::new(reader, writer),
            init: None,
            timeouts: AcpTimeouts::default(),
            launch: None,
            saved_config: None,
            new_config: None,
            reported: std::sync::Mutex::new(None),
            prompt_id: None,
            memory: None,
        }
    }

    /// What this connection holds of the process-wide memory budget (see [`super::budget`]),
    /// until the client is dropped; a `session/load` grows it by the replay lines first.
    pub fn set_memory(&mut self, held: Held) {
        self.memory = Some(held);
    }

    /// Replaces the deadlines used by the individual calls.
    pub fn set_timeouts(&mut self, timeouts: AcpTimeouts) {
        self.timeouts = timeouts;
    }

    pub fn timeouts(&self) -> AcpTimeouts {
        self.timeouts
    }

    /// Replaces the connection's memory bounds (they apply from the next line on).
    pub fn with_limits(self, limits: AcpLimits) -> Self {
        self.set_limits(limits);
        self
    }

    pub fn set_limits(&self, limits: AcpLimits) {
        self.rpc.set_limits(limits);
    }

    /// Tags the session setup and prompt requests that follow with `launch` ([`LAUNCH_META`]),
    /// so that agentctl carries out each of them once per launch.
    pub fn set_launch(&mut self, launch: &str) {
        self.launch = Some(launch.to_owned());
    }

    /// Tags the `session/prompt` requests that follow with `id` ([`PROMPT_ID_META`]): agentctl
    /// journals it with `prompt_started` before the agent gets the prompt.
    pub fn set_prompt_id(&mut self, id: &str) {
        self.prompt_id = Some(id.to_owned());
    }

    /// Sends `config` with the `session/load` and `session/resume` that follow
    /// ([`SESSION_CONFIG_META`]): agentctl sets back what the restored session reports
    /// differently.
    pub fn set_saved_config(&mut self, config: Option<SessionConfigState>) {
        self.saved_config = config;
    }

    /// Sends `config` with the `session/new` that follows: agentctl sets what the new session
    /// reports differently.
    pub fn set_new_config(&mut self, config: Option<SessionConfigState>) {
        self.new_config = config;
    }

    /// What the last successful `session/new`, `load` or `resume` answer said about the
    /// session's mode, model and config options, and what the agent offers.
    pub fn reported_config(&self) -> Option<ReportedConfig> {
        self.reported.lock().ok().and_then(|r| r.clone())
    }

    /// A session setup `request` whose answer's mode, model and config options are kept
    /// ([`Self::reported_config`]) when it succeeds. Read from the answer as the agent sent it:
    /// the protocol's types leave out what is unstable in ACP (`models`).
    async fn setup_request<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: &'static str,
        request: &Req,
        limit: Option<Duration>,
    ) -> Result<Resp, AcpError> {
        let answer = self.call(method, request, limit).await?;
        self.decode_setup(method, answer)
    }

    fn decode_setup<Resp: DeserializeOwned>(
        &self,
        method: &'static str,
        answer: Result<serde_json::Value, CallFailure>,
    ) -> Result<Resp, AcpError> {
        let reported = answer.as_ref().ok().map(reported_config);
        let response = decode(method, answer)?;
        if let Ok(mut kept) = self.reported.lock() {
            *kept = reported;
        }
        Ok(response)
    }

    /// `params` of `method`, with the launch and the trace context in `_meta` for the methods
    /// agentctl deduplicates and traces.
    fn params<T: Serialize>(
        &self,
        method: &'static str,
        request: &T,
    ) -> Result<serde_json::Value, AcpError> {
        let mut params = encode(method, request)?;
        let tagged = matches!(
            method,
            method::SESSION_NEW
                | method::SESSION_LOAD
                | method::SESSION_RESUME
                | method::SESSION_PROMPT
        );
        if !tagged {
            return Ok(params);
        }
        // The W3C trace context of the current span (`acp.session.*`): agentctl continues the
        // trace inside the pod. Empty when traces are off.
        let mut meta: serde_json::Map<String, serde_json::Value> =
            crate::telemetry::inject(&tracing::Span::current())
                .into_iter()
                .map(|(key, value)| (key, serde_json::Value::String(value)))
                .collect();
        if let Some(launch) = &self.launch {
            meta.insert(LAUNCH_META.to_owned(), serde_json::json!(launch));
        }
        let config = match method {
            method::SESSION_LOAD | method::SESSION_RESUME => self.saved_config.as_ref(),
            method::SESSION_NEW => self.new_config.as_ref(),
            _ => None,
        };
        if let Some(config) = config {
            meta.insert(SESSION_CONFIG_META.to_owned(), serde_json::json!(config));
        }
        if let (Some(id), method::SESSION_PROMPT) = (&self.prompt_id, method) {
            meta.insert(PROMPT_ID_META.to_owned(), serde_json::json!(id));
        }
        if let (false, Some(object)) = (meta.is_empty(), params.as_object_mut())
            && let Some(existing) = object
                .entry("_meta")
                .or_insert_with(|| serde_json::json!({}))
                .as_object_mut()
        {
            existing.extend(meta);
        }
        Ok(params)
    }

    /// Sends `initialize` (protocol v1), records the agent's answer and returns its summary.
    pub async fn initialize(&mut self) -> Result<NegotiatedCapabilities, AcpError> {
        self.initialize_within(self.timeouts.initialize).await
    }

    pub(super) async fn initialize_within(
        &mut self,
        limit: Duration,
    ) -> Result<NegotiatedCapabilities, AcpError> {
        let request = InitializeRequest::new(ProtocolVersion::V1).client_info(Implementation::new(
            "kandev-operator",
            env!("CARGO_PKG_VERSION"),
        ));
        let response: InitializeResponse = self
            .request(method::INITIALIZE, &request, Some(limit))
            .instrument(tracing::info_span!("acp.initialize"))
            .await?;
        // ACP: the agent answers with the version we asked for or its latest; a client that
        // does not speak that version must disconnect rather than guess.
        if response.protocol_version != ProtocolVersion::V1 {
            return Err(AcpError::Call {
                method: method::INITIALIZE,
                failure: CallFailure::MalformedResponse(format!(
                    "agent speaks ACP protocol version {}, we speak {}",
                    response.protocol_version.as_u16(),
                    ProtocolVersion::V1.as_u16()
                )),
            });
        }
        let summary = negotiated_capabilities(&response);
        tracing::info!(
            load_session = summary.load_session,
            session_resume = summary.session_resume,
            agent = summary.agent_name.as_deref().unwrap_or("?"),
            "agent initialized"
        );
        self.init = Some(response);
        Ok(summary)
    }

    /// The agent's `initialize` answer, once [`Self::initialize`] succeeded.
    pub fn initialize_response(&self) -> Option<&InitializeResponse> {
        self.init.as_ref()
    }

    /// The restore-relevant capabilities (all false before a successful `initialize`).
    pub fn restore_capabilities(&self) -> AgentRestoreCapabilities {
        self.init
            .as_ref()
            .map(restore_capabilities)
            .unwrap_or_default()
    }

    /// The summary stored in `ExecutorRunning.status.capabilities`.
    pub fn negotiated_capabilities(&self) -> Option<NegotiatedCapabilities> {
        self.init.as_ref().map(negotiated_capabilities)
    }

    /// `session/new` in `cwd` (absolute, per ACP); returns the new session id.
    pub async fn new_session(&self, cwd: &Path) -> Result<String, AcpError> {
        self.new_session_within(cwd, self.timeouts.session).await
    }

    pub(super) async fn new_session_within(
        &self,
        cwd: &Path,
        limit: Duration,
    ) -> Result<String, AcpError> {
        let response: NewSessionResponse = self
            .setup_request(
                method::SESSION_NEW,
                &NewSessionRequest::new(cwd),
                Some(limit),
            )
            .await?;
        let id = response.session_id.0.to_string();
        if let Some(problem) = session_id_problem(&id) {
            return Err(AcpError::Call {
                method: method::SESSION_NEW,
                failure: CallFailure::MalformedResponse(problem),
            });
        }
        Ok(id)
    }

    /// `session/load`: returns how much the agent replayed before answering (ACP: the replay
    /// precedes the response), counted as it streamed by. The updates themselves go to every
    /// [`Self::subscribe_updates`] receiver.
    pub async fn load_session(&self, session_id: &str, cwd: &Path) -> Result<Replayed, AcpError> {
        self.load_session_within(session_id, cwd, self.timeouts.session)
            .await
    }

    pub(super) async fn load_session_within(
        &self,
        session_id: &str,
        cwd: &Path,
        limit: Duration,
    ) -> Result<Replayed, AcpError> {
        let method = method::SESSION_LOAD;
        let request = LoadSessionRequest::new(session_id.to_owned(), cwd);
        let params = self.params(method, &request)?;
        // Before the deadline starts: a wait for memory is ours, not the agent's.
        if let Some(held) = &self.memory {
            let limits = self.rpc.limits();
            held.grow_to(connection_need(&limits) + replay_need(&limits))
                .await;
        }
        let (answer, replayed) = self
            .rpc
            .call_replaying(method, params, Some(limit), session_id)
            .await;
        let _: LoadSessionResponse = self.decode_setup(method, answer)?;
        Ok(replayed)
    }

    /// `session/resume`: reattaches to the session without a history replay.
    pub async fn resume_session(&self, session_id: &str, cwd: &Path) -> Result<(), AcpError> {
        self.resume_session_within(session_id, cwd, self.timeouts.session)
            .await
    }

    pub(super) async fn resume_session_within(
        &self,
        session_id: &str,
        cwd: &Path,
        limit: Duration,
    ) -> Result<(), AcpError> {
        let request = ResumeSessionRequest::new(session_id.to_owned(), cwd);
        let _: ResumeSessionResponse = self
            .setup_request(method::SESSION_RESUME, &request, Some(limit))
            .await?;
        Ok(())
    }

    /// `session/prompt` with one text block; returns when the turn ends. The turn's updates go
    /// to [`Self::subscribe_updates`] receivers (subscribe before prompting).
    pub async fn prompt(&self, session_id: &str, text: &str) -> Result<StopReason, AcpError> {
        let request = PromptRequest::new(
            session_id.to_owned(),
            vec![ContentBlock::from(text.to_owned())],
        );
        let response: PromptResponse = self
            .request(method::SESSION_PROMPT, &request, self.timeouts.prompt)
            .instrument(tracing::info_span!("acp.session.prompt", session_id))
            .await?;
        Ok(response.stop_reason)
    }

    /// Starts a `session/prompt` turn without waiting for it to end: the request is queued and
    /// its answer will be dropped. Used by the operator, which follows the turn through
    /// `agentctl events` rather than holding an exec stream open for hours.
    pub fn start_prompt(&self, session_id: &str, text: &str) -> Result<(), AcpError> {
        let request = PromptRequest::new(
            session_id.to_owned(),
            vec![ContentBlock::from(text.to_owned())],
        );
        let params = self.params(method::SESSION_PROMPT, &request)?;
        self.rpc
            .send_detached(method::SESSION_PROMPT, params)
            .map_err(|failure| AcpError::Call {
                method: method::SESSION_PROMPT,
                failure,
            })
    }

    /// Tells `agentctl connect` to end this client's connection (`_kandev/disconnect`), then
    /// waits up to `grace` for the stream to close, so everything queued before it reached the
    /// agent. The agent keeps running. Stdin EOF never arrives through kwok, hence the message.
    pub async fn disconnect(&self, grace: Duration) {
        if self
            .rpc
            .notify(method::DISCONNECT, serde_json::json!({}))
            .is_err()
        {
            return;
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.rpc.is_closed() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `session/cancel` (a notification): asks the agent to end the current turn, which then
    /// answers the pending prompt with `cancelled`.
    pub async fn cancel(&self, session_id: &str) -> Result<(), AcpError> {
        let params = encode(
            method::SESSION_CANCEL,
            &CancelNotification::new(session_id.to_owned()),
        )?;
        self.rpc
            .notify(method::SESSION_CANCEL, params)
            .map_err(|failure| AcpError::Call {
                method: method::SESSION_CANCEL,
                failure,
            })
    }

    /// Every `session/update` from now on, for any session; ends when the connection closes,
    /// or when the receiver falls a whole queue behind (it is dropped rather than let grow):
    /// read it while the call runs, and drop it when done with it.
    pub fn subscribe_updates(&self) -> mpsc::Receiver<SessionUpdateEvent> {
        self.rpc.subscribe()
    }

    /// Lines from the agent that were not JSON-RPC and were skipped.
    pub fn garbage_lines(&self) -> u64 {
        self.rpc.garbage_lines()
    }

    /// The stream closed (EOF or I/O error); every further call fails with `TransportClosed`.
    pub fn is_closed(&self) -> bool {
        self.rpc.is_closed()
    }

    async fn request<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: &'static str,
        request: &Req,
        limit: Option<Duration>,
    ) -> Result<Resp, AcpError> {
        decode(method, self.call(method, request, limit).await?)
    }

    /// The agent's answer to `request`, undecoded.
    async fn call<Req: Serialize>(
        &self,
        method: &'static str,
        request: &Req,
        limit: Option<Duration>,
    ) -> Result<Result<serde_json::Value, CallFailure>, AcpError> {
        let params = self.params(method, request)?;
        Ok(self.rpc.call(method, params, limit).await)
    }
}

/// A call's answer as `Resp`.
fn decode<Resp: DeserializeOwned>(
    method: &'static str,
    answer: Result<serde_json::Value, CallFailure>,
) -> Result<Resp, AcpError> {
    let value = answer.map_err(|failure| AcpError::Call { method, failure })?;
    // serde's words quote what the agent sent.
    serde_json::from_value(value).map_err(|error| AcpError::Call {
        method,
        failure: CallFailure::MalformedResponse(cap(&error.to_string(), AGENT_TEXT_MAX).into()),
    })
}

fn encode<T: Serialize>(method: &'static str, value: &T) -> Result<serde_json::Value, AcpError> {
    serde_json::to_value(value).map_err(|source| AcpError::Encode { method, source })
}

/// `agentCapabilities.loadSession` and `agentCapabilities.sessionCapabilities.resume`.
pub fn restore_capabilities(response: &InitializeResponse) -> AgentRestoreCapabilities {
    let agent = &response.agent_capabilities;
    AgentRestoreCapabilities {
        load_session: agent.load_session,
        session_resume: agent.session_capabilities.resume.is_some(),
    }
}

/// The summary of an `initialize` answer kept in `ExecutorRunning.status.capabilities`.
pub fn negotiated_capabilities(response: &InitializeResponse) -> NegotiatedCapabilities {
    let restore = restore_capabilities(response);
    NegotiatedCapabilities {
        protocol_version: Some(i64::from(response.protocol_version.as_u16())),
        load_session: restore.load_session,
        session_resume: restore.session_resume,
        agent_name: response
            .agent_info
            .as_ref()
            .map(|info| cap(&info.name, AGENT_NAME_MAX).into()),
        agent_version: response
            .agent_info
            .as_ref()
            .map(|info| cap(&info.version, AGENT_NAME_MAX).into()),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, duplex};

    #[test]
    fn capabilities_from_a_claude_like_answer() {
        let answer = json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true,
            "sessionCapabilities": {"resume": {}, "close": {}}, "promptCapabilities": {"image": true}},
            "agentInfo": {"name": "@agentclientprotocol/claude-agent-acp", "version": "0.101.0"}});
        let response: InitializeResponse = serde_json::from_value(answer).expect("parse");
        assert_eq!(
            restore_capabilities(&response),
            AgentRestoreCapabilities {
                load_session: true,
                session_resume: true
            }
        );
        let summary = negotiated_capabilities(&response);
        assert_eq!(summary.protocol_version, Some(1));
        assert_eq!(summary.agent_version.as_deref(), Some("0.101.0"));
        let bare: InitializeResponse =
            serde_json::from_value(json!({"protocolVersion": 1})).expect("parse");
        assert_eq!(
            restore_capabilities(&bare),
            AgentRestoreCapabilities::default()
        );
    }

    /// A scripted agent on the other end of a duplex pipe: answers each request with
    /// `script(method, params)`, a list of raw lines to send (notifications first, answer last).
    pub(crate) fn scripted_agent(
        script: impl Fn(&str, &Value, &Value) -> Vec<String> + Send + 'static,
    ) -> AcpClient {
        slow_scripted_agent(move |method, id, params| {
            (std::time::Duration::ZERO, script(method, id, params))
        })
    }

    /// [`scripted_agent`] whose script also says how long the agent thinks before it answers.
    pub(crate) fn slow_scripted_agent(
        script: impl Fn(&str, &Value, &Value) -> (std::time::Duration, Vec<String>) + Send + 'static,
    ) -> AcpClient {
        let (client_read, mut agent_write) = duplex(64 * 1024);
        let (agent_read, client_write) = duplex(64 * 1024);
        tokio::spawn(async move {
            let mut lines = BufReader::new(agent_read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).expect("client sends JSON");
                let method = message["method"].as_str().unwrap_or_default().to_owned();
                let (delay, answer) = script(&method, &message["id"], &message["params"]);
                tokio::time::sleep(delay).await;
                for out in answer {
                    agent_write.write_all(out.as_bytes()).await.expect("write");
                    agent_write.write_all(b"\n").await.expect("write");
                }
            }
        });
        AcpClient::new(client_read, client_write)
    }

    pub(crate) fn ok(id: &Value, result: Value) -> String {
        json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
    }

    /// Answers `session/load` with a replay of two updates of the session, one of another
    /// session and a garbage line.
    fn replaying_agent() -> AcpClient {
        scripted_agent(|method, id, params| match method {
            "initialize" => vec![ok(
                id,
                json!({"protocolVersion": 1,
                "agentCapabilities": {"loadSession": true}}),
            )],
            "session/load" => {
                let sid = params["sessionId"].clone();
                let chunk = |kind: &str, text: &str, sid: &Value| {
                    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid,
                        "update": {"sessionUpdate": kind, "content": {"type": "text", "text": text}}}})
                    .to_string()
                };
                vec![
                    chunk("user_message_chunk", "What's the capital of France?", &sid),
                    chunk(
                        "agent_message_chunk",
                        "other session",
                        &json!("someone-else"),
                    ),
                    "garbage in between".to_owned(),
                    chunk("agent_message_chunk", "Paris.", &sid),
                    ok(id, Value::Null),
                ]
            }
            _ => vec![],
        })
    }

    #[tokio::test]
    async fn load_counts_the_replay_that_precedes_the_answer() {
        // With a subscriber (every update is built and handed out) and without one (updates
        // are only counted, never built): the same counts.
        for subscribed in [true, false] {
            let mut client = replaying_agent();
            let summary = client.initialize().await.expect("initialize");
            assert!(summary.load_session && !summary.session_resume);
            let mut updates = subscribed.then(|| client.subscribe_updates());
            let replay = client
                .load_session("s-1", Path::new("/work"))
                .await
                .expect("load");
            // Counted for the loaded session only; every line while the load was open is bytes.
            assert_eq!(replay.updates, 2, "subscribed: {subscribed}");
            assert!(replay.bytes > 300, "{replay:?}");
            assert_eq!(client.garbage_lines(), 1);
            let Some(updates) = &mut updates else {
                continue;
            };
            let mut texts = Vec::new();
            while let Ok(event) = updates.try_recv() {
                if event.session_id == "s-1" {
                    texts.extend(event.text().map(str::to_owned));
                }
            }
            assert_eq!(texts, ["What's the capital of France?", "Paris."]);
        }
    }

    #[tokio::test]
    async fn unsupported_protocol_version_fails_initialize() {
        let mut client = scripted_agent(|_, id, _| vec![ok(id, json!({"protocolVersion": 2}))]);
        let error = client.initialize().await.expect_err("v2 is not ours");
        assert!(matches!(
            error.failure(),
            Some(CallFailure::MalformedResponse(_))
        ));
        assert!(client.initialize_response().is_none());
    }

    #[tokio::test]
    async fn prompt_returns_the_stop_reason_and_streams_updates() {
        let client = scripted_agent(|method, id, params| {
            match method {
            "session/prompt" => vec![
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": params["sessionId"],
                    "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "done"}}}})
                .to_string(),
                ok(id, json!({"stopReason": "end_turn"})),
            ],
            _ => vec![],
        }
        });
        let mut updates = client.subscribe_updates();
        let stop = client.prompt("s", "do it").await.expect("prompt");
        assert_eq!(stop, StopReason::EndTurn);
        assert_eq!(updates.recv().await.expect("update").text(), Some("done"));
        client.cancel("s").await.expect("cancel is a notification");
    }
}
