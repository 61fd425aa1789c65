//! The bridge between one long-lived agent and a succession of short-lived ACP clients, as a
//! synchronous state machine: every input (a line from the agent, a line from a client, a
//! client arriving or leaving, the agent exiting) returns the [`Output`]s to carry out, in
//! order. [`super::serve`] does the I/O. Keeping the rules here, free of sockets and
//! processes, lets the unit tests cover every path of the protocol.
//!
//! Rules (see `agentctl serve --help` and the module docs of [`super`]):
//! * agentctl sends `initialize` itself when the agent starts and answers every client's
//!   `initialize` from that cached response: a restarted operator re-initializes, but the agent
//!   must never see a second `initialize` on the same connection;
//! * requests from the client get fresh agent-side ids (a counter shared by all clients), so a
//!   new client reusing id 1 cannot collide with an old client's request still in flight, and
//!   the late answer to a departed client is recognised and dropped;
//! * requests from the agent go to the connected client; with none connected agentctl answers
//!   them itself with a safe default (permission → cancelled, anything else → -32601), also for
//!   requests still open when a client leaves, so the agent never waits forever;
//! * events and history are derived from the agent stream, whether or not a client is there;
//! * a session setup or prompt tagged with a launch ([`LAUNCH_META`] in `_meta`) reaches the agent
//!   once per launch: a repeat with the same method and session is answered with the first one's
//!   answer (or takes over its answer while it is still open), so a restore that the operator
//!   runs twice (a reconcile on a lagging cache, a retry after a failed status write) restores
//!   once and sends the task prompt once.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::events::{AgentError, Event, PromptOutcome};
use super::wire::{self, Message};
use crate::acp::{LAUNCH_META, SESSION_CONFIG_META};
use crate::api::SessionConfigState;
use crate::codec::WarnLimiter;
use crate::history::{ContextLimits, HistoryEntry, TRUNCATION_MARKER, wrap_prompt_once};
use crate::resume::AgentLimit;
use crate::resume::{SetBack, apply_config_update, reported_config, set_back};
use crate::telemetry;

/// Identifies one socket connection for its lifetime; never reused.
pub type ConnId = u64;

/// What the hub wants done, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// Write this message to the agent's stdin.
    ToAgent(Value),
    /// Write this message to the client's connection.
    ToClient(ConnId, Value),
    /// Close the client's connection (after writing what was queued for it).
    CloseClient(ConnId),
    /// Publish to every events subscriber.
    Event(Event),
    /// Append to the history of `history_session`.
    Record {
        history_session: String,
        entry: HistoryEntry,
    },
    /// Read the history of `history_session` (after every earlier `Record`), wrap the prompt in
    /// `message` once with [`inject_history`], then send it to the agent.
    InjectHistoryThenSend {
        history_session: String,
        message: Value,
    },
    /// The agent rejected agentctl's `initialize`: it is unusable, serve must stop.
    InitializeFailed { code: i64, message: String },
}

/// A second ACP client tried to attach while one is connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy;

/// Per-serve settings of the hub.
#[derive(Clone, Debug, Default)]
pub struct HubConfig {
    /// File name of the history (`--session-name`); `None` records under the ACP session id.
    pub session_name: Option<String>,
    /// The profile's `historyContextInjection`.
    pub history_injection: bool,
    /// The one working directory this agentctl serves: the `cwd` of every `session/new`,
    /// `session/load` and `session/resume` is replaced by it. A pod serves one workspace, so a
    /// client cannot point the agent elsewhere, and the operator need not know where the
    /// workspace is mounted on this side (the same path in a real pod; a local directory when
    /// the e2e harness plays the pod). `None` forwards the client's cwd unchanged.
    pub session_cwd: Option<String>,
    /// The workspace's checkout ([`super::checkout::Worktree`]), added to the cached
    /// `initialize` answer as `_meta["kandev.dev/worktree"]`: the operator learns it from the
    /// same exchange that restores the session.
    pub worktree: Option<Value>,
}

enum InitState {
    NotStarted,
    Waiting {
        agent_id: u64,
        /// Clients whose `initialize` arrived before the agent answered.
        clients: Vec<(ConnId, Value)>,
    },
    Ready(Value),
    Failed {
        code: i64,
        message: String,
    },
}

/// A client request forwarded to the agent, by agent-side id.
struct Pending {
    conn: ConnId,
    client_id: Value,
    method: String,
    session_id: Option<String>,
    /// Set for a launch-tagged request: its answer is kept for repeats.
    launch: Option<LaunchKey>,
    /// The saved configuration a `session/load|resume` carried ([`SESSION_CONFIG_META`]).
    saved_config: Option<SessionConfigState>,
    /// `agentctl.forward`: open from the request to the agent until its answer.
    span: tracing::Span,
}

/// A launch-tagged request: the launch, the method and the session it names (if any).
type LaunchKey = (String, String, Option<String>);

/// Launch-tagged requests remembered at most (a pod serves one launch, which sends a handful).
const LAUNCH_REQUESTS_KEPT: usize = 64;

/// Agent requests waiting for the client's answer, at most; more are answered with the
/// default at once.
pub const AGENT_REQUESTS_OPEN: usize = 1024;

/// Agent text of one turn kept for the history, at most (bytes); the rest is dropped with
/// [`TRUNCATION_MARKER`] (the resume context keeps 2000 characters of a message anyway).
pub const RECORDED_TURN_TEXT: usize = 1024 * 1024;

/// What became of a launch-tagged request.
enum LaunchRequest {
    /// Forwarded to the agent under this agent-side id, not answered yet.
    Open(u64),
    /// The agent's answer, without its id.
    Answered(Map<String, Value>),
}

/// An agent request forwarded to a client, by the agent's id.
struct AgentRequest {
    conn: ConnId,
    id: Value,
    method: String,
}

#[derive(Default)]
struct SessionRecording {
    /// Agent text of the current turn not yet written.
    agent_text: String,
    /// Open `session/load` requests: their replayed updates are history already.
    loading: u32,
    /// The `messageId` of the last message chunk the agent sent for this session (replayed
    /// ones included: after a `session/load` it is the transcript's last message).
    last_message_id: Option<String>,
    tools: HashMap<String, ToolRecord>,
}

struct ToolRecord {
    name: String,
    result_recorded: bool,
}

/// The bridge state. See the module docs.
pub struct Hub {
    config: HubConfig,
    next_agent_id: u64,
    init: InitState,
    client: Option<ConnId>,
    pending: HashMap<u64, Pending>,
    agent_requests: HashMap<String, AgentRequest>,
    sessions: HashMap<String, SessionRecording>,
    /// The mode, model and config options last reported, by session.
    configs: HashMap<String, SessionConfigState>,
    /// agentctl's own set-back requests to the agent, by agent-side id: the session and call.
    set_backs: HashMap<u64, (String, SetBack)>,
    /// The session whose next prompt gets the resume context (set by a fresh `session/new`).
    inject_next_prompt_of: Option<String>,
    /// The last session set up successfully, for [`Hub::snapshot`].
    current_session: Option<String>,
    /// Launch-tagged requests seen, for their repeats.
    launch_requests: HashMap<LaunchKey, LaunchRequest>,
    /// The launch of the last launch-tagged request, for the event journal.
    last_launch: Option<String>,
    /// Rate limit of the warnings about bad lines (only what is logged depends on the clock,
    /// never an output).
    warnings: WarnLimiter,
    /// The same for the notes about agent requests answered with the default.
    notes: WarnLimiter,
}

impl Hub {
    pub fn new(config: HubConfig) -> Self {
        Self {
            config,
            next_agent_id: 0,
            init: InitState::NotStarted,
            client: None,
            pending: HashMap::new(),
            agent_requests: HashMap::new(),
            sessions: HashMap::new(),
            configs: HashMap::new(),
            set_backs: HashMap::new(),
            inject_next_prompt_of: None,
            current_session: None,
            launch_requests: HashMap::new(),
            last_launch: None,
            warnings: WarnLimiter::default(),
            notes: WarnLimiter::default(),
        }
    }

    /// The launch of the last launch-tagged request (the operator's current launch).
    pub fn last_launch(&self) -> Option<&str> {
        self.last_launch.as_deref()
    }

    /// The state a new events subscriber starts from.
    pub fn snapshot(&self) -> Event {
        Event::Snapshot {
            session_id: self.current_session.clone(),
            prompt_active: self
                .pending
                .values()
                .any(|pending| pending.method == "session/prompt"),
            last_message_id: self
                .current_session
                .as_deref()
                .and_then(|session| self.last_message_id(session)),
        }
    }

    /// The `initialize` agentctl sends when the agent starts.
    pub fn start(&mut self) -> Vec<Output> {
        let agent_id = self.alloc_id();
        let clients = match &mut self.init {
            InitState::Waiting { clients, .. } => std::mem::take(clients),
            _ => Vec::new(),
        };
        self.init = InitState::Waiting { agent_id, clients };
        vec![Output::ToAgent(wire::request_message(
            json!(agent_id),
            "initialize",
            initialize_params(),
        ))]
    }

    /// Whether agentctl is still waiting for the agent's `initialize` response.
    pub fn initializing(&self) -> bool {
        matches!(self.init, InitState::Waiting { .. } | InitState::NotStarted)
    }

    /// The connected ACP client, if any.
    pub fn client(&self) -> Option<ConnId> {
        self.client
    }

    /// A client sent the acp hello. Only one client at a time: with `takeover` the current one
    /// is closed (for a client whose exec stream died without closing its socket), otherwise
    /// the newcomer is refused.
    pub fn attach(&mut self, conn: ConnId, takeover: bool) -> Result<Vec<Output>, Busy> {
        let mut out = Vec::new();
        match self.client {
            Some(current) if current != conn => {
                if !takeover {
                    return Err(Busy);
                }
                tracing::warn!(
                    replaced = current,
                    by = conn,
                    "ACP client taken over by a new connection"
                );
                out.extend(self.detach(current));
                out.push(Output::CloseClient(current));
            }
            _ => {}
        }
        self.client = Some(conn);
        Ok(out)
    }

    /// The client's socket closed.
    pub fn client_closed(&mut self, conn: ConnId) -> Vec<Output> {
        if self.client != Some(conn) {
            return Vec::new();
        }
        let mut out = self.detach(conn);
        out.push(Output::CloseClient(conn));
        out
    }

    /// One line from the client.
    pub fn client_line(&mut self, conn: ConnId, line: &str) -> Vec<Output> {
        if self.client != Some(conn) {
            // A reader that has not noticed its connection was closed.
            return Vec::new();
        }
        match wire::parse_line(line) {
            Err(invalid) => {
                if let Some(suppressed) = self.warnings.allow() {
                    tracing::warn!(
                        code = invalid.code,
                        suppressed,
                        "client sent an invalid line: {}",
                        invalid.message
                    );
                }
                vec![Output::ToClient(conn, invalid.to_error_message())]
            }
            Ok(Message::Request { id, method, raw }) => self.client_request(conn, id, method, raw),
            Ok(Message::Notification { method, raw }) => {
                if method == wire::DISCONNECT_METHOD {
                    tracing::info!(conn, "client disconnected; the agent keeps running");
                    let mut out = self.detach(conn);
                    out.push(Output::CloseClient(conn));
                    out
                } else {
                    vec![Output::ToAgent(Value::Object(raw))]
                }
            }
            Ok(Message::Response { id, raw }) => {
                let key = wire::id_key(&id);
                match self.agent_requests.get(&key) {
                    Some(request) if request.conn == conn => {
                        self.agent_requests.remove(&key);
                        vec![Output::ToAgent(Value::Object(raw))]
                    }
                    _ => {
                        if let Some(suppressed) = self.warnings.allow() {
                            tracing::warn!(%id, suppressed, "client answered a request the agent did not send it; dropped");
                        }
                        Vec::new()
                    }
                }
            }
        }
    }

    /// One line from the agent's stdout.
    pub fn agent_line(&mut self, line: &str) -> Vec<Output> {
        if line.trim().is_empty() {
            return Vec::new();
        }
        match wire::parse_line(line) {
            Err(invalid) => {
                if let Some(suppressed) = self.warnings.allow() {
                    tracing::warn!(
                        suppressed,
                        "agent wrote a line that is not JSON-RPC ({}); ignored",
                        invalid.message
                    );
                }
                Vec::new()
            }
            Ok(Message::Response { id, raw }) => self.agent_response(id, raw),
            Ok(Message::Request { id, method, raw }) => self.agent_request(id, method, raw),
            Ok(Message::Notification { method, raw }) => self.agent_notification(method, raw),
        }
    }

    /// Whether a `session/load` is open: the agent may be replaying, and its lines may be as
    /// long as the replay line limit.
    pub fn replaying(&self) -> bool {
        self.pending
            .values()
            .any(|pending| pending.method == "session/load")
    }

    /// serve cut the agent off for breaking `limit` (it is being killed): the connected
    /// client's open requests are answered with [`wire::AGENT_PROTOCOL_LIMIT`] naming the
    /// bound, so a restore fails with that reason rather than a closed stream.
    pub fn agent_cut_off(&mut self, limit: AgentLimit) -> Vec<Output> {
        let message = format!("agentctl cut off the agent: {limit}");
        let mut out = Vec::new();
        if let InitState::Waiting { clients, .. } = &mut self.init {
            for (conn, id) in std::mem::take(clients) {
                out.push(Output::ToClient(
                    conn,
                    wire::error_message(id, wire::AGENT_PROTOCOL_LIMIT, &message),
                ));
            }
        }
        for (_, pending) in self.pending.drain() {
            if Some(pending.conn) == self.client {
                out.push(Output::ToClient(
                    pending.conn,
                    wire::error_message(pending.client_id, wire::AGENT_PROTOCOL_LIMIT, &message),
                ));
            }
        }
        out
    }

    /// The agent process is gone: tell subscribers, fail what is still open, keep the turn
    /// text recorded so far.
    pub fn agent_exited(&mut self, code: Option<i32>, signal: Option<i32>) -> Vec<Output> {
        let mut out = vec![Output::Event(Event::AgentExited { code, signal })];
        let session_ids: Vec<String> = self.sessions.keys().cloned().collect();
        for session_id in session_ids {
            out.extend(self.flush_agent_text(&session_id));
        }
        let message = "agentctl: the agent exited before answering";
        if let InitState::Waiting { clients, .. } = &mut self.init {
            for (conn, id) in std::mem::take(clients) {
                out.push(Output::ToClient(
                    conn,
                    wire::error_message(id, wire::INTERNAL_ERROR, message),
                ));
            }
        }
        for (_, pending) in self.pending.drain() {
            if Some(pending.conn) == self.client {
                out.push(Output::ToClient(
                    pending.conn,
                    wire::error_message(pending.client_id, wire::INTERNAL_ERROR, message),
                ));
            }
        }
        self.agent_requests.clear();
        if let Some(conn) = self.client.take() {
            out.push(Output::CloseClient(conn));
        }
        out
    }

    /// The `messageId` of the last message chunk the agent sent for `session_id`.
    pub fn last_message_id(&self, session_id: &str) -> Option<String> {
        self.sessions
            .get(session_id)
            .and_then(|recording| recording.last_message_id.clone())
    }

    fn alloc_id(&mut self) -> u64 {
        self.next_agent_id += 1;
        self.next_agent_id
    }

    fn history_session(&self, session_id: &str) -> String {
        self.config
            .session_name
            .clone()
            .unwrap_or_else(|| session_id.to_owned())
    }

    /// Forgets `conn` as the client; answers the agent's requests it left open.
    fn detach(&mut self, conn: ConnId) -> Vec<Output> {
        if self.client == Some(conn) {
            self.client = None;
        }
        if let InitState::Waiting { clients, .. } = &mut self.init {
            clients.retain(|(waiting, _)| *waiting != conn);
        }
        let orphaned: Vec<String> = self
            .agent_requests
            .iter()
            .filter(|(_, request)| request.conn == conn)
            .map(|(key, _)| key.clone())
            .collect();
        orphaned
            .into_iter()
            .filter_map(|key| self.agent_requests.remove(&key))
            .map(|request| {
                if let Some(suppressed) = self.notes.allow() {
                    tracing::info!(method = %request.method, suppressed, "client left with an agent request open; answering with the default");
                }
                Output::ToAgent(default_answer(request.id, &request.method))
            })
            .collect()
    }

    fn client_request(
        &mut self,
        conn: ConnId,
        id: Value,
        method: String,
        mut raw: Map<String, Value>,
    ) -> Vec<Output> {
        if method == "initialize" {
            return match &mut self.init {
                InitState::Ready(result) => vec![Output::ToClient(
                    conn,
                    wire::result_message(id, result.clone()),
                )],
                InitState::Failed { code, message } => vec![Output::ToClient(
                    conn,
                    wire::error_message(id, *code, message),
                )],
                InitState::Waiting { clients, .. } => {
                    clients.push((conn, id));
                    Vec::new()
                }
                InitState::NotStarted => {
                    self.init = InitState::Waiting {
                        agent_id: 0,
                        clients: vec![(conn, id)],
                    };
                    Vec::new()
                }
            };
        }
        let session_id = raw
            .get("params")
            .and_then(|p| p.get("sessionId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let (launch, trace, saved_config) = take_meta(&mut raw);
        let launch = launch.map(|launch| (launch, method.clone(), session_id.clone()));
        if let Some(key) = &launch
            && let Some(out) = self.repeated_launch_request(conn, &id, key)
        {
            return out;
        }
        let agent_id = self.alloc_id();
        raw.insert("id".into(), json!(agent_id));
        if let Some(key) = &launch {
            self.last_launch = Some(key.0.clone());
            if self.launch_requests.len() >= LAUNCH_REQUESTS_KEPT {
                self.launch_requests
                    .retain(|_, request| matches!(request, LaunchRequest::Open(_)));
            }
            self.launch_requests
                .insert(key.clone(), LaunchRequest::Open(agent_id));
        }
        if let (Some(cwd), "session/new" | "session/load" | "session/resume") =
            (&self.config.session_cwd, method.as_str())
            && let Some(params) = raw.get_mut("params").and_then(Value::as_object_mut)
        {
            params.insert("cwd".into(), json!(cwd));
        }
        // The operator's trace (a `traceparent` in `_meta`) goes on here; the agent gets ours.
        let span = tracing::info_span!(
            parent: None,
            "agentctl.forward",
            method = %method,
            session_id = session_id.as_deref().unwrap_or(""),
            launch = launch.as_ref().map(|l| l.0.as_str()).unwrap_or(""),
            outcome = tracing::field::Empty,
            error_code = tracing::field::Empty,
        );
        telemetry::set_remote_parent(&span, &trace);
        put_trace_context(&mut raw, telemetry::inject(&span));
        tracing::debug!(%method, %id, agent_id, "client request forwarded");
        let mut out = Vec::new();
        match (method.as_str(), &session_id) {
            ("session/prompt", Some(session_id)) => {
                out.push(Output::Event(Event::PromptStarted {
                    session_id: session_id.clone(),
                }));
                let history_session = self.history_session(session_id);
                let text = prompt_text(raw.get("params"));
                // Text left over from outside a turn belongs before this prompt.
                out.extend(self.flush_agent_text(session_id));
                let inject = self.config.history_injection
                    && self.inject_next_prompt_of.as_deref() == Some(session_id.as_str());
                if inject {
                    self.inject_next_prompt_of = None;
                    out.push(Output::InjectHistoryThenSend {
                        history_session: history_session.clone(),
                        message: Value::Object(raw),
                    });
                } else {
                    out.push(Output::ToAgent(Value::Object(raw)));
                }
                // Recorded after the injection read: the current request is not history yet.
                if !text.is_empty() {
                    out.push(Output::Record {
                        history_session,
                        entry: HistoryEntry::UserMessage {
                            text,
                            timestamp: None,
                        },
                    });
                }
            }
            ("session/load", Some(session_id)) => {
                self.sessions.entry(session_id.clone()).or_default().loading += 1;
                out.push(Output::ToAgent(Value::Object(raw)));
            }
            _ => out.push(Output::ToAgent(Value::Object(raw))),
        }
        self.pending.insert(
            agent_id,
            Pending {
                conn,
                client_id: id,
                method,
                session_id,
                launch,
                saved_config,
                span,
            },
        );
        out
    }

    /// The answer to a repeat of a launch-tagged request, without involving the agent: the
    /// first answer, or the first request's answer once it comes (the repeat takes it over).
    /// `None` for a request seen the first time.
    fn repeated_launch_request(
        &mut self,
        conn: ConnId,
        id: &Value,
        key: &LaunchKey,
    ) -> Option<Vec<Output>> {
        let (launch, method, _) = key;
        match self.launch_requests.get(key)? {
            LaunchRequest::Answered(answer) => {
                tracing::info!(%launch, %method, "repeated request of this launch answered from its first answer");
                let mut answer = answer.clone();
                answer.insert("id".into(), id.clone());
                Some(vec![Output::ToClient(conn, Value::Object(answer))])
            }
            LaunchRequest::Open(agent_id) => {
                let pending = self.pending.get_mut(agent_id)?;
                tracing::info!(%launch, %method, "repeated request of this launch waits for the first one's answer");
                pending.conn = conn;
                pending.client_id = id.clone();
                Some(Vec::new())
            }
        }
    }

    fn agent_response(&mut self, id: Value, mut raw: Map<String, Value>) -> Vec<Output> {
        let Some(agent_id) = id.as_u64() else {
            if let Some(suppressed) = self.warnings.allow() {
                tracing::warn!(%id, suppressed, "agent answered an id agentctl never sent; dropped");
            }
            return Vec::new();
        };
        if let InitState::Waiting {
            agent_id: init_id,
            clients,
        } = &mut self.init
            && *init_id == agent_id
        {
            let clients = std::mem::take(clients);
            return self.initialize_answered(&raw, clients);
        }
        if let Some((session_id, call)) = self.set_backs.remove(&agent_id) {
            return self.set_back_answered(session_id, call, &raw);
        }
        let Some(pending) = self.pending.remove(&agent_id) else {
            if let Some(suppressed) = self.warnings.allow() {
                tracing::warn!(
                    agent_id,
                    suppressed,
                    "agent answered an unknown request id; dropped"
                );
            }
            return Vec::new();
        };
        if let Some(key) = &pending.launch {
            let mut answer = raw.clone();
            answer.remove("id");
            self.launch_requests
                .insert(key.clone(), LaunchRequest::Answered(answer));
        }
        let result = raw.get("result");
        let error = raw.get("error");
        pending
            .span
            .record("outcome", if result.is_some() { "result" } else { "error" });
        if let Some(code) = error.and_then(|e| e.get("code")).and_then(Value::as_i64) {
            pending.span.record("error_code", code);
        }
        let mut out = Vec::new();
        match pending.method.as_str() {
            "session/new" => {
                if let Some(session_id) = result
                    .and_then(|r| r.get("sessionId"))
                    .and_then(Value::as_str)
                {
                    self.current_session = Some(session_id.to_owned());
                    out.push(Output::Event(Event::SessionCreated {
                        session_id: session_id.to_owned(),
                        method: pending.method.clone(),
                    }));
                    out.extend(self.session_answered(session_id, result, None));
                    // A fresh agent session: the next prompt carries the recorded history.
                    self.inject_next_prompt_of =
                        self.config.history_injection.then(|| session_id.to_owned());
                }
            }
            "session/load" | "session/resume" => {
                if pending.method == "session/load"
                    && let Some(recording) = pending
                        .session_id
                        .as_ref()
                        .and_then(|s| self.sessions.get_mut(s))
                {
                    recording.loading = recording.loading.saturating_sub(1);
                }
                if let (Some(result), Some(session_id)) = (result, &pending.session_id) {
                    self.current_session = Some(session_id.clone());
                    out.push(Output::Event(Event::SessionCreated {
                        session_id: session_id.clone(),
                        method: pending.method.clone(),
                    }));
                    out.extend(self.session_answered(
                        session_id,
                        Some(result),
                        pending.saved_config.as_ref(),
                    ));
                    // The agent remembers this session itself: nothing to inject.
                    self.inject_next_prompt_of = None;
                }
            }
            "session/prompt" => {
                if let Some(session_id) = &pending.session_id {
                    out.extend(self.flush_agent_text(session_id));
                    let outcome = match (result, error) {
                        (Some(result), _) => PromptOutcome::Stopped {
                            stop_reason: result.get("stopReason").cloned().unwrap_or(Value::Null),
                        },
                        (None, error) => {
                            let (code, message) = wire::error_parts(error);
                            PromptOutcome::Failed {
                                error: AgentError { code, message },
                            }
                        }
                    };
                    out.push(Output::Event(Event::PromptFinished {
                        session_id: session_id.clone(),
                        outcome,
                        last_message_id: self.last_message_id(session_id),
                    }));
                }
            }
            _ => {}
        }
        if self.client == Some(pending.conn) {
            raw.insert("id".into(), pending.client_id);
            out.push(Output::ToClient(pending.conn, Value::Object(raw)));
        } else {
            tracing::debug!(method = %pending.method, "response for a departed client dropped");
        }
        out
    }

    /// A session setup succeeded: its configuration is recorded, and after a restore the saved
    /// values it reports differently are set back. The set-back requests go to the agent before
    /// the client gets the answer, so they reach the agent before anything the client sends next.
    fn session_answered(
        &mut self,
        session_id: &str,
        result: Option<&Value>,
        saved: Option<&SessionConfigState>,
    ) -> Vec<Output> {
        let reported = result.map(reported_config).unwrap_or_default();
        let mut out = Vec::new();
        if reported.state != SessionConfigState::default() {
            out.push(Output::Event(Event::SessionConfig {
                session_id: session_id.to_owned(),
                config: reported.state.clone(),
            }));
        }
        let calls = saved
            .map(|saved| set_back(saved, &reported))
            .unwrap_or_default();
        self.configs.insert(session_id.to_owned(), reported.state);
        for call in calls {
            let agent_id = self.alloc_id();
            tracing::info!(
                session_id,
                method = call.method(),
                "setting a saved value back after the restore"
            );
            out.push(Output::ToAgent(json!({
                "jsonrpc": "2.0", "id": agent_id, "method": call.method(),
                "params": call.params(session_id),
            })));
            self.set_backs
                .insert(agent_id, (session_id.to_owned(), call));
        }
        out
    }

    /// The agent's answer to a set-back: the value is recorded, or the failure reported.
    fn set_back_answered(
        &mut self,
        session_id: String,
        call: SetBack,
        raw: &Map<String, Value>,
    ) -> Vec<Output> {
        if raw.get("result").is_some() {
            let config = self.configs.entry(session_id.clone()).or_default();
            call.apply(config);
            return vec![Output::Event(Event::SessionConfig {
                session_id,
                config: config.clone(),
            })];
        }
        let (code, message) = wire::error_parts(raw.get("error"));
        tracing::warn!(%session_id, method = call.method(), code, %message, "setting a saved value back failed; the restore stands");
        vec![Output::Event(Event::ConfigSetBackFailed {
            session_id,
            method: call.method().to_owned(),
            error: AgentError { code, message },
        })]
    }

    fn initialize_answered(
        &mut self,
        raw: &Map<String, Value>,
        clients: Vec<(ConnId, Value)>,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        if let Some(result) = raw.get("result") {
            tracing::info!("agent initialized; its response is cached for every client");
            let mut result = result.clone();
            if let (Some(worktree), Some(object)) = (&self.config.worktree, result.as_object_mut())
            {
                let meta = object
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(super::checkout::WORKTREE_META.to_string(), worktree.clone());
                }
            }
            self.init = InitState::Ready(result.clone());
            for (conn, id) in clients {
                out.push(Output::ToClient(
                    conn,
                    wire::result_message(id, result.clone()),
                ));
            }
        } else {
            let (code, message) = wire::error_parts(raw.get("error"));
            for (conn, id) in clients {
                out.push(Output::ToClient(
                    conn,
                    wire::error_message(id, code, &message),
                ));
            }
            self.init = InitState::Failed {
                code,
                message: message.clone(),
            };
            out.push(Output::InitializeFailed { code, message });
        }
        out
    }

    fn agent_request(&mut self, id: Value, method: String, raw: Map<String, Value>) -> Vec<Output> {
        match self.client {
            Some(_) if self.agent_requests.len() >= AGENT_REQUESTS_OPEN => {
                // The client is not keeping up with the agent's requests: answered here, like
                // with no client, rather than remembered without bound.
                if let Some(suppressed) = self.warnings.allow() {
                    tracing::warn!(%method, suppressed, open = AGENT_REQUESTS_OPEN, "too many agent requests open; answering with the default");
                }
                vec![Output::ToAgent(default_answer(id, &method))]
            }
            Some(conn) => {
                self.agent_requests
                    .insert(wire::id_key(&id), AgentRequest { conn, id, method });
                vec![Output::ToClient(conn, Value::Object(raw))]
            }
            None => {
                if let Some(suppressed) = self.notes.allow() {
                    tracing::info!(%method, suppressed, "agent request with no client connected; answering with the default");
                }
                vec![Output::ToAgent(default_answer(id, &method))]
            }
        }
    }

    fn agent_notification(&mut self, method: String, raw: Map<String, Value>) -> Vec<Output> {
        let mut out = Vec::new();
        if method == "session/update"
            && let Some(params) = raw.get("params")
        {
            out.extend(self.record_update(params));
        }
        if let Some(conn) = self.client {
            out.push(Output::ToClient(conn, Value::Object(raw)));
        }
        out
    }

    /// What a `session/update` adds to the history. Updates of a session being loaded are the
    /// agent replaying its transcript: already recorded, so skipped (no duplicates).
    fn record_update(&mut self, params: &Value) -> Vec<Output> {
        let (Some(session_id), Some(update)) = (
            params.get("sessionId").and_then(Value::as_str),
            params.get("update"),
        ) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let config = self.configs.entry(session_id.to_owned()).or_default();
        if apply_config_update(config, update) {
            out.push(Output::Event(Event::SessionConfig {
                session_id: session_id.to_owned(),
                config: config.clone(),
            }));
        }
        let history_session = self.history_session(session_id);
        let kind = update.get("sessionUpdate").and_then(Value::as_str);
        // ACP content chunks (user, agent, thought) carry the id of the message they belong to.
        if let Some(message_id) = update
            .get("messageId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
        {
            self.sessions
                .entry(session_id.to_owned())
                .or_default()
                .last_message_id = Some(message_id.to_owned());
        }
        if self
            .sessions
            .get(session_id)
            .is_some_and(|recording| recording.loading > 0)
        {
            return out;
        }
        match kind {
            Some("agent_message_chunk") => {
                if update.pointer("/content/type").and_then(Value::as_str) == Some("text")
                    && let Some(text) = update.pointer("/content/text").and_then(Value::as_str)
                {
                    let recording = self.sessions.entry(session_id.to_owned()).or_default();
                    push_bounded(&mut recording.agent_text, text, RECORDED_TURN_TEXT);
                }
            }
            Some("tool_call") => {
                // Keep the order the user saw: what the agent said, then the tool it called.
                out.extend(self.flush_agent_text(session_id));
                let tool_call_id = str_field(update, "toolCallId").unwrap_or_default();
                let name = str_field(update, "title")
                    .or_else(|| str_field(update, "kind"))
                    .unwrap_or("tool")
                    .to_owned();
                out.push(Output::Record {
                    history_session: history_session.clone(),
                    entry: HistoryEntry::ToolCall {
                        name: name.clone(),
                        input: update.get("rawInput").cloned().unwrap_or(Value::Null),
                        timestamp: None,
                    },
                });
                let recording = self.sessions.entry(session_id.to_owned()).or_default();
                recording.tools.insert(
                    tool_call_id.to_owned(),
                    ToolRecord {
                        name,
                        result_recorded: false,
                    },
                );
                out.extend(record_tool_result(
                    recording,
                    tool_call_id,
                    update,
                    &history_session,
                ));
            }
            Some("tool_call_update") => {
                let tool_call_id = str_field(update, "toolCallId").unwrap_or_default();
                let recording = self.sessions.entry(session_id.to_owned()).or_default();
                let tool = recording
                    .tools
                    .entry(tool_call_id.to_owned())
                    .or_insert_with(|| ToolRecord {
                        name: "tool".into(),
                        result_recorded: false,
                    });
                if let Some(title) = str_field(update, "title") {
                    tool.name = title.to_owned();
                }
                out.extend(record_tool_result(
                    recording,
                    tool_call_id,
                    update,
                    &history_session,
                ));
            }
            _ => {}
        }
        out
    }

    /// Writes the turn's pending agent text, if any, as one `agent_message`.
    fn flush_agent_text(&mut self, session_id: &str) -> Option<Output> {
        let text = std::mem::take(&mut self.sessions.get_mut(session_id)?.agent_text);
        if text.trim().is_empty() {
            return None;
        }
        Some(Output::Record {
            history_session: self.history_session(session_id),
            entry: HistoryEntry::AgentMessage {
                text,
                timestamp: None,
            },
        })
    }
}

/// Appends `text` to `buf` up to `limit` bytes (on a char boundary); the first time something is
/// dropped, [`TRUNCATION_MARKER`] is appended instead (so `buf` ends up at most a marker longer).
fn push_bounded(buf: &mut String, text: &str, limit: usize) {
    if buf.ends_with(TRUNCATION_MARKER) && buf.len() >= limit {
        return;
    }
    let room = limit.saturating_sub(buf.len());
    if text.len() <= room {
        buf.push_str(text);
        return;
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    buf.push_str(&text[..end]);
    buf.push_str(TRUNCATION_MARKER);
}

/// A `tool_result` once the tool call reached a final status (`completed`, or `failed` marked
/// as such), at most once per tool call.
fn record_tool_result(
    recording: &mut SessionRecording,
    tool_call_id: &str,
    update: &Value,
    history_session: &str,
) -> Option<Output> {
    let status = str_field(update, "status")?;
    if status != "completed" && status != "failed" {
        return None;
    }
    let tool = recording.tools.get_mut(tool_call_id)?;
    if tool.result_recorded {
        return None;
    }
    tool.result_recorded = true;
    let mut output = tool_output(update);
    if status == "failed" {
        output.insert_str(0, "[failed] ");
    }
    Some(Output::Record {
        history_session: history_session.to_owned(),
        entry: HistoryEntry::ToolResult {
            name: tool.name.clone(),
            output,
            timestamp: None,
        },
    })
}

/// The readable result of a tool call: the text of its `content` (what the user saw), else its
/// `rawOutput`.
fn tool_output(update: &Value) -> String {
    let texts: Vec<String> = update
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| match str_field(item, "type") {
                    Some("content") => item
                        .pointer("/content/text")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    Some("diff") => str_field(item, "path").map(|path| format!("diff of {path}")),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if !texts.is_empty() {
        return texts.join("\n");
    }
    match update.get("rawOutput") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

fn str_field<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

/// The text blocks of a `session/prompt`'s `prompt`, joined by newlines.
pub fn prompt_text(params: Option<&Value>) -> String {
    params
        .and_then(|p| p.get("prompt"))
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|block| str_field(block, "type") == Some("text"))
                .filter_map(|block| str_field(block, "text"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Wraps the prompt of a `session/prompt` message in the resume context, once (DESIGN §3).
/// The text blocks become one text block holding the context; other blocks (images,
/// resources) follow unchanged. Returns whether the message changed: with no history, or an
/// already wrapped prompt, it is left alone.
pub fn inject_history(message: &mut Value, entries: &[HistoryEntry]) -> bool {
    let text = prompt_text(message.get("params"));
    let wrapped = wrap_prompt_once(&text, entries, &ContextLimits::default());
    if wrapped == text {
        return false;
    }
    let Some(blocks) = message
        .pointer_mut("/params/prompt")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let mut rebuilt = vec![json!({"type": "text", "text": wrapped})];
    rebuilt.extend(
        blocks
            .drain(..)
            .filter(|block| str_field(block, "type") != Some("text")),
    );
    *blocks = rebuilt;
    true
}

/// The W3C trace context keys of `_meta` (ACP reserves them for exactly this).
const TRACE_META: [&str; 2] = ["traceparent", "tracestate"];

/// Removes [`LAUNCH_META`] and the trace context from the request's `_meta` (the agent has no
/// use for the launch, and gets agentctl's own trace context; `_meta` goes when nothing else is
/// in it) and returns them.
fn take_meta(
    raw: &mut Map<String, Value>,
) -> (
    Option<String>,
    HashMap<String, String>,
    Option<SessionConfigState>,
) {
    let mut trace = HashMap::new();
    let Some(params) = raw.get_mut("params").and_then(Value::as_object_mut) else {
        return (None, trace, None);
    };
    let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) else {
        return (None, trace, None);
    };
    let launch = meta
        .remove(LAUNCH_META)
        .and_then(|launch| launch.as_str().map(str::to_owned));
    let saved_config = meta
        .remove(SESSION_CONFIG_META)
        .and_then(|config| serde_json::from_value(config).ok());
    for key in TRACE_META {
        if let Some(Value::String(value)) = meta.remove(key) {
            trace.insert(key.to_owned(), value);
        }
    }
    if meta.is_empty() {
        params.remove("_meta");
    }
    (launch, trace, saved_config)
}

/// Puts `context` (from [`telemetry::inject`]; empty without an exporter) into `_meta`.
fn put_trace_context(raw: &mut Map<String, Value>, context: HashMap<String, String>) {
    if context.is_empty() {
        return;
    }
    let Some(params) = raw.get_mut("params").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(meta) = params
        .entry("_meta")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        for (key, value) in context {
            meta.insert(key, json!(value));
        }
    }
}

/// agentctl's answer to an agent request no client can take.
pub fn default_answer(id: Value, method: &str) -> Value {
    crate::acp::default_answer_to_agent_request(
        id,
        method,
        "no ACP client is connected to agentctl",
    )
}

/// The `initialize` params agentctl sends: protocol v1, and no client capabilities, since no
/// client may be connected to serve `fs/*` or `terminal/*` when the agent asks.
fn initialize_params() -> Value {
    use agent_client_protocol::schema::ProtocolVersion;
    use agent_client_protocol::v1::schema::{Implementation, InitializeRequest};
    let request = InitializeRequest::new(ProtocolVersion::V1)
        .client_info(Implementation::new("agentctl", env!("CARGO_PKG_VERSION")));
    serde_json::to_value(request).unwrap_or_else(|error| {
        tracing::error!(%error, "cannot encode initialize params; sending the minimum");
        json!({"protocolVersion": 1})
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn line(value: Value) -> String {
        value.to_string()
    }

    fn ready_hub(config: HubConfig) -> Hub {
        let mut hub = Hub::new(config);
        let out = hub.start();
        assert_eq!(out.len(), 1);
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}})));
        assert_eq!(out, vec![]);
        hub
    }

    fn to_agent(out: &[Output]) -> Vec<Value> {
        out.iter()
            .filter_map(|o| match o {
                Output::ToAgent(v) => Some(v.clone()),
                Output::InjectHistoryThenSend { message, .. } => Some(message.clone()),
                _ => None,
            })
            .collect()
    }

    fn to_client(out: &[Output]) -> Vec<(ConnId, Value)> {
        out.iter()
            .filter_map(|o| match o {
                Output::ToClient(c, v) => Some((*c, v.clone())),
                _ => None,
            })
            .collect()
    }

    fn events(out: &[Output]) -> Vec<Event> {
        out.iter()
            .filter_map(|o| match o {
                Output::Event(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    fn records(out: &[Output]) -> Vec<(String, HistoryEntry)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Record {
                    history_session,
                    entry,
                } => Some((history_session.clone(), entry.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn start_sends_initialize_without_client_capabilities() {
        let mut hub = Hub::new(HubConfig::default());
        let sent = to_agent(&hub.start());
        assert_eq!(sent[0]["method"], "initialize");
        assert_eq!(sent[0]["params"]["protocolVersion"], 1);
        assert_eq!(sent[0]["params"]["clientInfo"]["name"], "agentctl");
        assert_eq!(
            sent[0]["params"]["clientCapabilities"]["fs"]["readTextFile"],
            false
        );
        assert!(hub.initializing());
    }

    #[test]
    fn the_worktree_travels_in_the_initialize_meta() {
        let worktree = json!({"branch": "kandev/t-1", "commit": "abc", "cloned": true});
        let mut hub = ready_hub(HubConfig {
            worktree: Some(worktree.clone()),
            ..HubConfig::default()
        });
        hub.attach(3, false).expect("attach");
        let out = hub.client_line(
            3,
            &line(json!({"jsonrpc":"2.0","id":9,"method":"initialize","params":{}})),
        );
        let answers = to_client(&out);
        assert_eq!(
            answers[0].1["result"]["_meta"]["kandev.dev/worktree"],
            worktree
        );
        assert_eq!(
            answers[0].1["result"]["agentCapabilities"]["loadSession"],
            true
        );
    }

    #[test]
    fn initialize_is_answered_from_the_cache_never_resent() {
        let mut hub = Hub::new(HubConfig::default());
        hub.start();
        assert_eq!(hub.attach(7, false), Ok(vec![]));
        // Before the agent answered: queued.
        let out = hub.client_line(
            7,
            &line(json!({"jsonrpc":"2.0","id":"a","method":"initialize","params":{}})),
        );
        assert_eq!(out, vec![]);
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1}}),
        ));
        assert_eq!(
            to_client(&out),
            vec![(
                7,
                json!({"jsonrpc":"2.0","id":"a","result":{"protocolVersion":1}})
            )]
        );
        // After: straight from the cache, as often as asked, nothing reaches the agent.
        for id in [json!(1), json!(1), json!("x")] {
            let out = hub.client_line(
                7,
                &line(json!({"jsonrpc":"2.0","id":id,"method":"initialize"})),
            );
            assert_eq!(to_agent(&out), Vec::<Value>::new());
            assert_eq!(
                to_client(&out),
                vec![(
                    7,
                    json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":1}})
                )]
            );
        }
        assert!(!hub.initializing());
    }

    #[test]
    fn initialize_error_stops_serve() {
        let mut hub = Hub::new(HubConfig::default());
        hub.start();
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}),
        ));
        assert_eq!(
            out,
            vec![Output::InitializeFailed {
                code: -32603,
                message: "boom".into()
            }]
        );
    }

    #[test]
    fn session_setup_runs_in_the_served_working_directory() {
        let mut hub = ready_hub(HubConfig {
            session_cwd: Some("/srv/ws".into()),
            ..HubConfig::default()
        });
        hub.attach(1, false).expect("attach");
        for method in ["session/new", "session/load", "session/resume"] {
            let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":method,"params":{"sessionId":"s","cwd":"/workspace","mcpServers":[]}})));
            let sent = to_agent(&out);
            assert_eq!(sent[0]["params"]["cwd"], "/srv/ws", "{method}");
        }
        let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","cwd":"/elsewhere","prompt":[]}})));
        assert_eq!(
            to_agent(&out)[0]["params"]["cwd"],
            "/elsewhere",
            "other methods are untouched"
        );
    }

    #[test]
    fn ids_are_rewritten_and_late_responses_dropped() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}})));
        let sent = to_agent(&out);
        assert_eq!(
            sent[0]["id"], 2,
            "agent-side id comes from agentctl's counter"
        );
        assert_eq!(
            sent[0]["params"]["cwd"], "/w",
            "params are forwarded untouched"
        );
        // The client leaves before the answer.
        let out = hub.client_line(
            1,
            &line(json!({"jsonrpc":"2.0","method":"_kandev/disconnect"})),
        );
        assert_eq!(out, vec![Output::CloseClient(1)]);
        assert_eq!(hub.attach(2, false), Ok(vec![]));
        // The new client reuses id 1; the agent gets a different id.
        let out = hub.client_line(2, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"s","cwd":"/w","mcpServers":[]}})));
        assert_eq!(to_agent(&out)[0]["id"], 3);
        // The late answer to client 1 is dropped but still produces the event.
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"s-old"}}),
        ));
        assert_eq!(to_client(&out), vec![]);
        assert_eq!(
            events(&out),
            vec![Event::SessionCreated {
                session_id: "s-old".into(),
                method: "session/new".into()
            }]
        );
        // Client 2's answer comes back under its own id.
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":3,"result":{}})));
        assert_eq!(
            to_client(&out),
            vec![(2, json!({"jsonrpc":"2.0","id":1,"result":{}}))]
        );
        assert_eq!(
            events(&out),
            vec![Event::SessionCreated {
                session_id: "s".into(),
                method: "session/load".into()
            }]
        );
    }

    #[test]
    fn one_client_at_a_time_unless_takeover() {
        let mut hub = ready_hub(HubConfig::default());
        assert_eq!(hub.attach(1, false), Ok(vec![]));
        assert_eq!(hub.attach(2, false), Err(Busy));
        // A stale line from a refused connection is ignored.
        assert_eq!(
            hub.client_line(2, &line(json!({"jsonrpc":"2.0","id":1,"method":"x"}))),
            vec![]
        );
        assert_eq!(hub.attach(3, true), Ok(vec![Output::CloseClient(1)]));
        assert_eq!(hub.client(), Some(3));
        assert_eq!(hub.client_closed(1), vec![]);
        assert_eq!(hub.client_closed(3), vec![Output::CloseClient(3)]);
        assert_eq!(hub.attach(4, false), Ok(vec![]));
    }

    #[test]
    fn invalid_client_lines_get_errors_and_change_nothing() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        let rows = [
            ("garbage", json!(null), wire::PARSE_ERROR),
            ("[]", json!(null), wire::INVALID_REQUEST),
            (r#"{"id":4,"method":"x"}"#, json!(4), wire::INVALID_REQUEST),
        ];
        for (text, id, code) in rows {
            let out = hub.client_line(1, text);
            let replies = to_client(&out);
            assert_eq!(replies.len(), 1, "{text}");
            assert_eq!(replies[0].1["id"], id, "{text}");
            assert_eq!(replies[0].1["error"]["code"], code, "{text}");
            assert_eq!(to_agent(&out), Vec::<Value>::new());
        }
        assert_eq!(hub.client(), Some(1));
    }

    #[test]
    fn agent_requests_go_to_the_client_or_get_safe_defaults() {
        let mut hub = ready_hub(HubConfig::default());
        let permission = json!({"jsonrpc":"2.0","id":"p1","method":"session/request_permission","params":{"sessionId":"s"}});
        let read = json!({"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{}});
        // Nobody connected: agentctl answers.
        let out = hub.agent_line(&line(permission.clone()));
        assert_eq!(
            to_agent(&out),
            vec![json!({"jsonrpc":"2.0","id":"p1","result":{"outcome":{"outcome":"cancelled"}}})]
        );
        let out = hub.agent_line(&line(read.clone()));
        assert_eq!(to_agent(&out)[0]["error"]["code"], wire::METHOD_NOT_FOUND);
        // Connected: forwarded as is, and the client's answer goes back.
        hub.attach(1, false).ok();
        let out = hub.agent_line(&line(permission.clone()));
        assert_eq!(to_client(&out), vec![(1, permission)]);
        let answer = json!({"jsonrpc":"2.0","id":"p1","result":{"outcome":{"outcome":"selected","optionId":"allow"}}});
        assert_eq!(
            to_agent(&hub.client_line(1, &line(answer.clone()))),
            vec![answer.clone()]
        );
        // A second answer to the same request is dropped.
        assert_eq!(hub.client_line(1, &line(answer)), vec![]);
        // A client leaving with a request open: agentctl answers for it.
        hub.agent_line(&line(read));
        let out = hub.client_closed(1);
        assert_eq!(to_agent(&out)[0]["id"], 9);
        assert_eq!(to_agent(&out)[0]["error"]["code"], wire::METHOD_NOT_FOUND);
    }

    #[test]
    fn notifications_flow_both_ways() {
        let mut hub = ready_hub(HubConfig::default());
        let update = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}});
        assert_eq!(to_client(&hub.agent_line(&line(update.clone()))), vec![]);
        hub.attach(1, false).ok();
        assert_eq!(
            to_client(&hub.agent_line(&line(update.clone()))),
            vec![(1, update)]
        );
        let cancel = json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}});
        assert_eq!(
            to_agent(&hub.client_line(1, &line(cancel.clone()))),
            vec![cancel]
        );
        // Junk from the agent is ignored.
        assert_eq!(hub.agent_line("npm WARN something"), vec![]);
    }

    fn chunk(session: &str, text: &str) -> String {
        line(
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
            "update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":text}}}}),
        )
    }

    fn prompt(id: u64, session: &str, text: &str) -> String {
        line(
            json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":session,
            "prompt":[{"type":"text","text":text}]}}),
        )
    }

    #[test]
    fn prompt_turn_events_and_history() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        let out = hub.client_line(1, &prompt(5, "s1", "fix the bug"));
        assert_eq!(
            events(&out),
            vec![Event::PromptStarted {
                session_id: "s1".into()
            }]
        );
        assert_eq!(
            records(&out),
            vec![(
                "s1".into(),
                HistoryEntry::UserMessage {
                    text: "fix the bug".into(),
                    timestamp: None
                }
            )]
        );
        let mut recorded = Vec::new();
        recorded.extend(records(&hub.agent_line(&chunk("s1", "Looking "))));
        recorded.extend(records(&hub.agent_line(&chunk("s1", "at it."))));
        let tool = |update: Value| {
            line(
                json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":update}}),
            )
        };
        recorded.extend(records(&hub.agent_line(&tool(json!({"sessionUpdate":"tool_call","toolCallId":"t1","title":"Read a.rs","kind":"read","status":"pending","rawInput":{"path":"a.rs"}})))));
        recorded.extend(records(&hub.agent_line(&tool(
            json!({"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"in_progress"}),
        ))));
        recorded.extend(records(&hub.agent_line(&tool(json!({"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"fn a() {}"}}]})))));
        recorded.extend(records(&hub.agent_line(&tool(
            json!({"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed"}),
        ))));
        recorded.extend(records(&hub.agent_line(&tool(json!({"sessionUpdate":"tool_call","toolCallId":"t2","title":"ls","status":"failed","rawOutput":"denied"})))));
        recorded.extend(records(&hub.agent_line(&chunk("s1", "Done."))));
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}),
        ));
        recorded.extend(records(&out));
        assert_eq!(
            events(&out),
            vec![Event::PromptFinished {
                session_id: "s1".into(),
                outcome: PromptOutcome::Stopped {
                    stop_reason: json!("end_turn")
                },
                last_message_id: None,
            }]
        );
        assert_eq!(
            to_client(&out),
            vec![(
                1,
                json!({"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}})
            )]
        );
        let entries: Vec<HistoryEntry> = recorded.into_iter().map(|(_, e)| e).collect();
        assert_eq!(
            entries,
            vec![
                HistoryEntry::AgentMessage {
                    text: "Looking at it.".into(),
                    timestamp: None
                },
                HistoryEntry::ToolCall {
                    name: "Read a.rs".into(),
                    input: json!({"path":"a.rs"}),
                    timestamp: None
                },
                HistoryEntry::ToolResult {
                    name: "Read a.rs".into(),
                    output: "fn a() {}".into(),
                    timestamp: None
                },
                HistoryEntry::ToolCall {
                    name: "ls".into(),
                    input: Value::Null,
                    timestamp: None
                },
                HistoryEntry::ToolResult {
                    name: "ls".into(),
                    output: "[failed] denied".into(),
                    timestamp: None
                },
                HistoryEntry::AgentMessage {
                    text: "Done.".into(),
                    timestamp: None
                },
            ]
        );
    }

    #[test]
    fn snapshot_tracks_the_session_and_open_prompts() {
        let mut hub = ready_hub(HubConfig::default());
        let snapshot = |hub: &Hub| hub.snapshot().to_json("T");
        assert_eq!(
            snapshot(&hub),
            json!({"event":"snapshot","sessionId":null,"promptActive":false,"timestamp":"T"})
        );
        hub.attach(1, false).ok();
        new_session(&mut hub, 1, 1, "s");
        hub.client_line(1, &prompt(2, "s", "x"));
        hub.client_closed(1);
        // The client left, the agent is still working on its prompt.
        assert_eq!(
            snapshot(&hub),
            json!({"event":"snapshot","sessionId":"s","promptActive":true,"timestamp":"T"})
        );
        let prompt_id = hub.next_agent_id;
        hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":prompt_id,"result":{"stopReason":"end_turn"}}),
        ));
        assert_eq!(snapshot(&hub)["promptActive"], false);
    }

    /// A chunk of one session/update, with a message id.
    fn chunk_with_id(session: &str, kind: &str, text: &str, message_id: &str) -> String {
        line(
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
            "update":{"sessionUpdate":kind,"messageId":message_id,"content":{"type":"text","text":text}}}}),
        )
    }

    #[test]
    fn the_last_message_id_is_reported_with_the_prompts_end_and_in_the_snapshot() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        // A replayed transcript (session/load) sets it, though it is not recorded again.
        hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"s","cwd":"/","mcpServers":[]}})));
        hub.agent_line(&chunk_with_id(
            "s",
            "user_message_chunk",
            "old question",
            "m-1",
        ));
        hub.agent_line(&chunk_with_id(
            "s",
            "agent_message_chunk",
            "old answer",
            "m-2",
        ));
        hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{}})));
        assert_eq!(hub.last_message_id("s").as_deref(), Some("m-2"));
        assert_eq!(
            hub.snapshot().to_json("T"),
            json!({"event":"snapshot","sessionId":"s","promptActive":false,"lastMessageId":"m-2","timestamp":"T"})
        );
        hub.client_line(1, &prompt(2, "s", "next"));
        hub.agent_line(&chunk_with_id("s", "agent_thought_chunk", "hm", "m-3"));
        hub.agent_line(&chunk_with_id("s", "agent_message_chunk", "Do", "m-4"));
        hub.agent_line(&chunk_with_id("s", "agent_message_chunk", "ne.", "m-4"));
        // Updates without one (a plan, a tool call) or with an empty one change nothing; other
        // sessions keep their own.
        hub.agent_line(&line(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}})));
        hub.agent_line(&chunk_with_id("s", "agent_message_chunk", "", ""));
        hub.agent_line(&chunk_with_id("other", "agent_message_chunk", "x", "o-1"));
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}),
        ));
        assert_eq!(
            events(&out),
            vec![Event::PromptFinished {
                session_id: "s".into(),
                outcome: PromptOutcome::Stopped {
                    stop_reason: json!("end_turn")
                },
                last_message_id: Some("m-4".into()),
            }]
        );
        assert_eq!(
            events(&out)[0].to_json("T"),
            json!({"event":"prompt_finished","sessionId":"s","stopReason":"end_turn","lastMessageId":"m-4","timestamp":"T"})
        );
        assert_eq!(hub.last_message_id("other").as_deref(), Some("o-1"));
    }

    #[test]
    fn failed_prompt_reports_the_error() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        hub.client_line(1, &prompt(1, "s", "x"));
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"auth required"}}),
        ));
        assert_eq!(
            events(&out),
            vec![Event::PromptFinished {
                session_id: "s".into(),
                outcome: PromptOutcome::Failed {
                    error: AgentError {
                        code: -32000,
                        message: "auth required".into()
                    }
                },
                last_message_id: None,
            }]
        );
        let json = events(&out)[0].to_json("T");
        assert_eq!(
            json,
            json!({"event":"prompt_finished","sessionId":"s","error":{"code":-32000,"message":"auth required"},"timestamp":"T"})
        );
    }

    fn config(mode: &str, effort: &str) -> SessionConfigState {
        SessionConfigState {
            mode: Some(mode.into()),
            model: None,
            config_options: vec![crate::api::ConfigOptionValue {
                id: "effort".into(),
                value: effort.into(),
            }],
        }
    }

    #[test]
    fn a_restore_sets_the_saved_configuration_back_before_answering() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        let out = hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":7,"method":"session/resume","params":{"sessionId":"s","cwd":"/","_meta":{SESSION_CONFIG_META: config("plan", "high")}}})));
        assert_eq!(
            to_agent(&out)[0]["params"].get("_meta"),
            None,
            "the saved configuration is agentctl's, not the agent's"
        );
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{
            "modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"D"},{"id":"plan","name":"P"}]},
            "configOptions":[{"id":"effort","name":"E","type":"select","currentValue":"low","options":[{"value":"low","name":"L"},{"value":"high","name":"H"}]}]}})));
        assert_eq!(
            events(&out),
            vec![
                Event::SessionCreated {
                    session_id: "s".into(),
                    method: "session/resume".into()
                },
                Event::SessionConfig {
                    session_id: "s".into(),
                    config: config("default", "low")
                },
            ]
        );
        assert_eq!(
            to_agent(&out),
            vec![
                json!({"jsonrpc":"2.0","id":3,"method":"session/set_mode","params":{"sessionId":"s","modeId":"plan"}}),
                json!({"jsonrpc":"2.0","id":4,"method":"session/set_config_option","params":{"sessionId":"s","configId":"effort","value":"high"}}),
            ]
        );
        assert!(
            matches!(out.last(), Some(Output::ToClient(1, answer)) if answer["id"] == 7),
            "the set-backs go out before the client's answer: {out:?}"
        );
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":3,"result":{}})));
        assert_eq!(
            out,
            vec![Output::Event(Event::SessionConfig {
                session_id: "s".into(),
                config: config("plan", "low")
            })],
            "a set-back's answer is agentctl's own: the client never sees it"
        );
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"no"}}),
        ));
        assert_eq!(
            out,
            vec![Output::Event(Event::ConfigSetBackFailed {
                session_id: "s".into(),
                method: "session/set_config_option".into(),
                error: AgentError {
                    code: -32602,
                    message: "no".into()
                }
            })]
        );
        // Changes the agent reports later are followed too.
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"current_mode_update","currentModeId":"default"}}})));
        assert_eq!(
            events(&out),
            vec![Event::SessionConfig {
                session_id: "s".into(),
                config: config("default", "low")
            }]
        );
    }

    #[test]
    fn a_new_session_records_its_configuration_and_sets_nothing() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[],"_meta":{SESSION_CONFIG_META: config("plan", "high")}}})));
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{"sessionId":"n",
            "modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"D"},{"id":"plan","name":"P"}]}}})));
        assert!(to_agent(&out).is_empty());
        assert!(events(&out).contains(&Event::SessionConfig {
            session_id: "n".into(),
            config: SessionConfigState {
                mode: Some("default".into()),
                ..SessionConfigState::default()
            }
        }));
    }

    #[test]
    fn load_replay_is_not_recorded_again() {
        let mut hub = ready_hub(HubConfig {
            session_cwd: None,
            session_name: Some("ts-1".into()),
            history_injection: false,
            worktree: None,
        });
        hub.attach(1, false).ok();
        hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"s","cwd":"/","mcpServers":[]}})));
        let out = hub.agent_line(&chunk("s", "replayed answer"));
        assert_eq!(
            to_client(&out).len(),
            1,
            "the replay still reaches the client"
        );
        hub.agent_line(&line(json!({"jsonrpc":"2.0","id":2,"result":{}})));
        hub.client_line(1, &prompt(2, "s", "new question"));
        hub.agent_line(&chunk("s", "new answer"));
        let out = hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}),
        ));
        assert_eq!(
            records(&out),
            vec![(
                "ts-1".into(),
                HistoryEntry::AgentMessage {
                    text: "new answer".into(),
                    timestamp: None
                }
            )]
        );
    }

    /// The stale-cache double restore, as agentctl sees it: the operator runs the same launch's
    /// restore again (new connection, same ids), and the task prompt again.
    #[test]
    fn a_launch_reaches_the_agent_once_however_often_the_operator_repeats_it() {
        let mut hub = ready_hub(HubConfig::default());
        let meta = json!({"kandev.dev/launch": "r1", "trace": "t"});
        let resume = |id: u64| {
            line(
                json!({"jsonrpc":"2.0","id":id,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w","_meta":meta}}),
            )
        };
        hub.attach(1, false).expect("attach");
        let first = hub.client_line(1, &resume(2));
        let sent = to_agent(&first);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            sent[0]["params"]["_meta"],
            json!({"trace": "t"}),
            "the launch tag stays with agentctl"
        );
        let agent_id = sent[0]["id"].clone();

        // The first client is gone before the answer; the repeat takes the answer over.
        hub.client_closed(1);
        hub.attach(2, false).expect("attach");
        assert_eq!(
            hub.client_line(2, &resume(2)),
            vec![],
            "waits, nothing to the agent"
        );
        let answered = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":agent_id,"result":{}})));
        assert_eq!(
            to_client(&answered),
            vec![(2, json!({"jsonrpc":"2.0","id":2,"result":{}}))]
        );
        assert_eq!(events(&answered).len(), 1, "one session_created");

        // Answered already: a third try gets the same answer at once.
        hub.client_closed(2);
        hub.attach(3, false).expect("attach");
        let third = hub.client_line(3, &resume(7));
        assert_eq!(to_agent(&third), Vec::<Value>::new());
        assert_eq!(
            to_client(&third),
            vec![(3, json!({"jsonrpc":"2.0","id":7,"result":{}}))]
        );
        assert_eq!(events(&third), vec![]);

        // The task prompt of the launch goes once; an untagged prompt (a user's) always goes.
        let prompt = |id: u64, meta: Value| {
            line(
                json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"do it"}],"_meta":meta}}),
            )
        };
        assert_eq!(
            to_agent(&hub.client_line(3, &prompt(8, meta.clone()))).len(),
            1
        );
        assert_eq!(
            to_agent(&hub.client_line(3, &prompt(9, meta.clone()))).len(),
            0
        );
        assert_eq!(
            to_agent(&hub.client_line(3, &prompt(10, json!({})))).len(),
            1
        );

        // Another launch, another method or another session is a new request.
        let other = line(
            json!({"jsonrpc":"2.0","id":11,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w","_meta":{"kandev.dev/launch":"r2"}}}),
        );
        assert_eq!(to_agent(&hub.client_line(3, &other)).len(), 1);
        let load = line(
            json!({"jsonrpc":"2.0","id":12,"method":"session/load","params":{"sessionId":"s1","cwd":"/w","_meta":{"kandev.dev/launch":"r1"}}}),
        );
        let sent = to_agent(&hub.client_line(3, &load));
        assert_eq!(sent.len(), 1);
        assert!(
            sent[0]["params"].get("_meta").is_none(),
            "empty _meta removed"
        );
    }

    #[test]
    fn the_operators_trace_context_is_taken_and_the_agent_gets_agentctls() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;
        let operator_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let request = line(
            json!({"jsonrpc":"2.0","id":2,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w",
                "_meta":{"kandev.dev/launch":"r1","traceparent":format!("00-{operator_trace}-00f067aa0ba902b7-01")}}}),
        );
        // Without an exporter: the operator's context is dropped, nothing replaces it.
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).expect("attach");
        let sent = to_agent(&hub.client_line(1, &request));
        assert!(sent[0]["params"].get("_meta").is_none(), "{sent:?}");

        // With one: the agent gets agentctl.forward's context, in the operator's trace.
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let sent = tracing::subscriber::with_default(subscriber, || {
            // Callsites another test thread hit first may be cached as disabled.
            tracing::callsite::rebuild_interest_cache();
            let mut hub = ready_hub(HubConfig::default());
            hub.attach(1, false).expect("attach");
            to_agent(&hub.client_line(1, &request))
        });
        let meta = &sent[0]["params"]["_meta"];
        let traceparent = meta["traceparent"].as_str().expect("traceparent");
        assert!(
            traceparent.starts_with(&format!("00-{operator_trace}-"))
                && !traceparent.contains("00f067aa0ba902b7"),
            "{traceparent}"
        );
        assert!(meta.get("kandev.dev/launch").is_none(), "{meta}");
    }

    #[test]
    fn a_failed_setup_is_answered_the_same_way_again() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).expect("attach");
        let resume = line(
            json!({"jsonrpc":"2.0","id":2,"method":"session/resume","params":{"sessionId":"gone","cwd":"/w","_meta":{"kandev.dev/launch":"r1"}}}),
        );
        let agent_id = to_agent(&hub.client_line(1, &resume))[0]["id"].clone();
        let error = json!({"code":-32002,"message":"Resource not found"});
        hub.agent_line(&line(json!({"jsonrpc":"2.0","id":agent_id,"error":error})));
        let again = hub.client_line(1, &resume);
        assert_eq!(to_agent(&again), Vec::<Value>::new());
        assert_eq!(to_client(&again)[0].1["error"], error);
    }

    fn new_session(hub: &mut Hub, conn: ConnId, client_id: u64, session: &str) {
        let out = hub.client_line(conn, &line(json!({"jsonrpc":"2.0","id":client_id,"method":"session/new","params":{"cwd":"/","mcpServers":[]}})));
        let agent_id = to_agent(&out)[0]["id"].clone();
        hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":agent_id,"result":{"sessionId":session}}),
        ));
    }

    fn is_injection(out: &[Output]) -> bool {
        out.iter()
            .any(|o| matches!(o, Output::InjectHistoryThenSend { .. }))
    }

    #[test]
    fn history_injection_only_for_the_first_prompt_after_a_fresh_new() {
        let config = HubConfig {
            session_cwd: None,
            session_name: Some("ts-1".into()),
            history_injection: true,
            worktree: None,
        };
        let mut hub = ready_hub(config.clone());
        hub.attach(1, false).ok();
        new_session(&mut hub, 1, 1, "s");
        let out = hub.client_line(1, &prompt(2, "s", "continue"));
        assert!(is_injection(&out));
        // The injection read comes before the current prompt is recorded.
        let inject_at = out
            .iter()
            .position(|o| matches!(o, Output::InjectHistoryThenSend { .. }));
        let record_at = out.iter().position(|o| matches!(o, Output::Record { .. }));
        assert!(inject_at < record_at);
        assert!(!is_injection(&hub.client_line(1, &prompt(3, "s", "more"))));
        // After a resume there is nothing to inject.
        new_session(&mut hub, 1, 4, "s2");
        hub.client_line(1, &line(json!({"jsonrpc":"2.0","id":5,"method":"session/resume","params":{"sessionId":"s2","cwd":"/"}})));
        let resume_agent_id = hub.next_agent_id;
        hub.agent_line(&line(
            json!({"jsonrpc":"2.0","id":resume_agent_id,"result":{}}),
        ));
        assert!(!is_injection(&hub.client_line(1, &prompt(6, "s2", "go"))));
        // Profiles without injection never inject.
        let mut plain = ready_hub(HubConfig {
            session_cwd: None,
            history_injection: false,
            ..config
        });
        plain.attach(1, false).ok();
        new_session(&mut plain, 1, 1, "s");
        assert!(!is_injection(&plain.client_line(1, &prompt(2, "s", "x"))));
    }

    #[test]
    fn inject_history_wraps_text_once_and_keeps_other_blocks() {
        let history = [HistoryEntry::UserMessage {
            text: "earlier".into(),
            timestamp: None,
        }];
        let mut message = json!({"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s",
            "prompt":[{"type":"text","text":"next"},{"type":"image","data":"AA==","mimeType":"image/png"}]}});
        assert!(inject_history(&mut message, &history));
        let blocks = message["params"]["prompt"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(blocks.len(), 2);
        let text = blocks[0]["text"].as_str().unwrap_or_default();
        assert!(text.starts_with(crate::history::RESUME_CONTEXT_HEADER));
        assert!(text.contains("[USER]: earlier"));
        assert!(text.contains("=== CURRENT REQUEST ===\nnext\n"));
        assert_eq!(blocks[1]["type"], "image");
        // Never twice.
        let before = message.clone();
        assert!(!inject_history(&mut message, &history));
        assert_eq!(message, before);
        // No history: untouched.
        let mut plain = json!({"params":{"prompt":[{"type":"text","text":"x"}]}});
        assert!(!inject_history(&mut plain, &[]));
    }

    #[test]
    fn agent_exit_fails_open_requests_and_closes_the_client() {
        let mut hub = ready_hub(HubConfig::default());
        hub.attach(1, false).ok();
        hub.client_line(1, &prompt(42, "s", "x"));
        hub.agent_line(&chunk("s", "partial"));
        let out = hub.agent_exited(Some(3), None);
        assert_eq!(
            events(&out),
            vec![Event::AgentExited {
                code: Some(3),
                signal: None
            }]
        );
        assert_eq!(records(&out).len(), 1, "partial turn text is kept");
        let replies = to_client(&out);
        assert_eq!(replies[0].1["id"], 42);
        assert_eq!(replies[0].1["error"]["code"], wire::INTERNAL_ERROR);
        assert_eq!(out.last(), Some(&Output::CloseClient(1)));
        assert_eq!(
            Event::AgentExited {
                code: None,
                signal: Some(9)
            }
            .to_json("T"),
            json!({"event":"agent_exited","code":null,"signal":9,"timestamp":"T"})
        );
    }

    #[test]
    fn a_cut_off_agent_fails_the_open_requests_with_the_limit() {
        let mut hub = ready_hub(HubConfig::default());
        assert_eq!(hub.attach(3, false), Ok(vec![]));
        assert!(!hub.replaying());
        hub.client_line(
            3,
            &line(
                json!({"jsonrpc":"2.0","id":"load-1","method":"session/load",
                "params":{"sessionId":"s1","cwd":"/w","mcpServers":[]}}),
            ),
        );
        assert!(hub.replaying(), "a load is open");
        let limit = AgentLimit::Line { limit: 1024 };
        let out = hub.agent_cut_off(limit);
        assert_eq!(
            to_client(&out),
            vec![(
                3,
                json!({"jsonrpc":"2.0","id":"load-1","error":{"code":wire::AGENT_PROTOCOL_LIMIT,
                    "message":"agentctl cut off the agent: agent exceeded the line limit (1024 bytes)"}})
            )]
        );
        assert!(!hub.replaying());
        // The exit that follows has nothing left to fail.
        let exited = hub.agent_exited(None, Some(9));
        assert_eq!(to_client(&exited), vec![]);
        assert!(exited.contains(&Output::CloseClient(3)));
    }

    #[test]
    fn recorded_turn_text_is_bounded_utf8_safe() {
        #[rustfmt::skip]
        let rows = [
            // (already kept, new text, limit, kept after)
            ("", "abc", 8, "abc".to_owned()),
            ("abc", "defgh", 8, "abcdefgh".to_owned()),
            ("abc", "defghij", 8, format!("abcdefgh{TRUNCATION_MARKER}")),
            // A multi-byte char that does not fit is dropped whole.
            ("abcdefg", "é", 8, format!("abcdefg{TRUNCATION_MARKER}")),
        ];
        for (kept, text, limit, expected) in rows {
            let mut buf = kept.to_owned();
            push_bounded(&mut buf, text, limit);
            assert_eq!(buf, expected, "{kept:?} + {text:?}");
            // Once truncated, nothing more is kept.
            let before = buf.clone();
            push_bounded(&mut buf, "more", limit);
            if before.ends_with(TRUNCATION_MARKER) {
                assert_eq!(buf, before);
            }
        }
    }

    #[test]
    fn agent_requests_beyond_the_open_bound_are_answered_here() {
        let mut hub = ready_hub(HubConfig::default());
        assert_eq!(hub.attach(3, false), Ok(vec![]));
        for n in 0..AGENT_REQUESTS_OPEN {
            let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":format!("a-{n}"),
                "method":"fs/read_text_file","params":{"sessionId":"s","path":"/x"}})));
            assert_eq!(to_client(&out).len(), 1, "forwarded to the client");
        }
        let out = hub.agent_line(&line(json!({"jsonrpc":"2.0","id":"one-too-many",
            "method":"fs/read_text_file","params":{"sessionId":"s","path":"/x"}})));
        assert_eq!(to_client(&out), vec![]);
        let answered = to_agent(&out);
        assert_eq!(answered.len(), 1);
        assert_eq!(answered[0]["id"], "one-too-many");
        assert_eq!(answered[0]["error"]["code"], wire::METHOD_NOT_FOUND);
    }
}
