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
//!   them itself with a safe default (-32601), also for requests still open when a client
//!   leaves, so the agent never waits forever;
//! * a permission request (`session/request_permission`) goes to the connected client only if
//!   its hello said it decides; otherwise, and when such a client leaves it open, the session's
//!   policy answers it or holds it for a person (`permission.rs`);
//! * events and history are derived from the agent stream, whether or not a client is there;
//! * a session setup or prompt tagged with a launch ([`LAUNCH_META`] in `_meta`) reaches the agent
//!   once per launch: a repeat with the same method and session is answered with the first one's
//!   answer (or takes over its answer while it is still open), so a restore that the operator
//!   runs twice (a reconcile on a lagging cache, a retry after a failed status write) restores
//!   once and sends the task prompt once.
//!
//! This module routes: the init state, client and agent lines, ids, launch repeats, trace
//! context. What the routing derives lives beside it: `record.rs` (the history), `inject.rs`
//! (the resume context in the first prompt after a fresh start), `emit.rs` (the events
//! subscribers get, in the format of [`super::events`]), `config.rs` (the session's
//! configuration and what is set after a session setup), `permission.rs` (the permission policy
//! and the requests held for a person). The tests are in `tests.rs`.

mod config;
mod emit;
mod inject;
mod permission;
mod record;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::events::Event;
use crate::acp::{LAUNCH_META, PROMPT_ID_META, SESSION_CONFIG_META};
use crate::api::SessionConfigState;
use crate::api::bounds::session_id_problem;
use crate::history::HistoryEntry;
use crate::jsonrpc::AgentLimit;
use crate::jsonrpc::{self, Message, code, method};
use crate::resume::SetBack;
use crate::telemetry;
use crate::telemetry::WarnLimiter;

pub use inject::{inject_history, prompt_text};
pub use permission::AnswerRefusal;
pub use record::RECORDED_TURN_TEXT;
use record::SessionRecording;

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
    /// Call [`Hub::permission_timed_out`] with `request_id` after `after`.
    PermissionTimer {
        request_id: String,
        after: std::time::Duration,
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
    /// What the agent's permission requests get when no client that decides is connected.
    pub permissions: crate::api::EffectivePolicy,
    /// What the ids of permission requests start with (`<prefix>-<n>`), different in each
    /// pod, so that an id names a request of one pod only (an answer for an earlier pod's
    /// request never reaches a later one); `None`: `p<n>` (tests).
    pub permission_prefix: Option<String>,
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
    /// The configuration a `session/new|load|resume` carried ([`SESSION_CONFIG_META`]), to set
    /// once the agent answers.
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
    /// A permission request as the agent sent it (for the policy, should the client leave
    /// without answering); empty for other requests.
    raw: Map<String, Value>,
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
    /// The connected client answers the agent's permission requests itself (its hello said so).
    client_decides: bool,
    /// Permission requests held for a person's answer, oldest first.
    held: Vec<permission::Held>,
    /// The number of the last permission request id given.
    next_permission: u64,
    /// The time a held request was asked at (RFC 3339); a fixed one in tests.
    clock: fn() -> String,
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
            client_decides: false,
            held: Vec::new(),
            next_permission: 0,
            clock: super::time::now_rfc3339,
        }
    }

    /// The clock of held requests' `requestedAt` (tests fix it).
    #[cfg(test)]
    pub fn set_clock(&mut self, clock: fn() -> String) {
        self.clock = clock;
    }

    /// The connected client `conn` answers the agent's permission requests itself (an
    /// interactive `kubectl kandev prompt`); other clients leave them to the policy.
    pub fn client_decides_permissions(&mut self, conn: ConnId) {
        if self.client == Some(conn) {
            self.client_decides = true;
        }
    }

    /// The launch of the last launch-tagged request (the operator's current launch).
    pub fn last_launch(&self) -> Option<&str> {
        self.last_launch.as_deref()
    }

    /// The `initialize` agentctl sends when the agent starts.
    pub fn start(&mut self) -> Vec<Output> {
        let agent_id = self.alloc_id();
        let clients = match &mut self.init {
            InitState::Waiting { clients, .. } => std::mem::take(clients),
            _ => Vec::new(),
        };
        self.init = InitState::Waiting { agent_id, clients };
        vec![Output::ToAgent(jsonrpc::request_message(
            json!(agent_id),
            method::INITIALIZE,
            initialize_params(),
        ))]
    }

    /// Whether the agent is idle: initialized, no client connected, and nothing asked of it
    /// that it has not answered (a prompt whose client left included).
    pub fn idle(&self) -> bool {
        !self.initializing()
            && self.client.is_none()
            && self.pending.is_empty()
            && self.held.is_empty()
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
        match jsonrpc::parse_line(line) {
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
                if method == method::DISCONNECT {
                    tracing::info!(conn, "client disconnected; the agent keeps running");
                    let mut out = self.detach(conn);
                    out.push(Output::CloseClient(conn));
                    out
                } else {
                    vec![Output::ToAgent(Value::Object(raw))]
                }
            }
            Ok(Message::Response { id, raw }) => {
                let key = jsonrpc::id_key(&id);
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
        match jsonrpc::parse_line(line) {
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
            .any(|pending| pending.method == method::SESSION_LOAD)
    }

    /// serve cut the agent off for breaking `limit` (it is being killed): the connected
    /// client's open requests are answered with [`code::AGENT_PROTOCOL_LIMIT`] naming the
    /// bound, so a restore fails with that reason rather than a closed stream.
    pub fn agent_cut_off(&mut self, limit: AgentLimit) -> Vec<Output> {
        let message = format!("agentctl cut off the agent: {limit}");
        let mut out = Vec::new();
        if let InitState::Waiting { clients, .. } = &mut self.init {
            for (conn, id) in std::mem::take(clients) {
                out.push(Output::ToClient(
                    conn,
                    jsonrpc::error_message(id, code::AGENT_PROTOCOL_LIMIT, &message),
                ));
            }
        }
        for (_, pending) in self.pending.drain() {
            if Some(pending.conn) == self.client {
                out.push(Output::ToClient(
                    pending.conn,
                    jsonrpc::error_message(pending.client_id, code::AGENT_PROTOCOL_LIMIT, &message),
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
                    jsonrpc::error_message(id, code::INTERNAL_ERROR, message),
                ));
            }
        }
        for (_, pending) in self.pending.drain() {
            if Some(pending.conn) == self.client {
                out.push(Output::ToClient(
                    pending.conn,
                    jsonrpc::error_message(pending.client_id, code::INTERNAL_ERROR, message),
                ));
            }
        }
        self.agent_requests.clear();
        out.extend(self.permissions_gone());
        if let Some(conn) = self.client.take() {
            out.push(Output::CloseClient(conn));
        }
        out
    }

    fn alloc_id(&mut self) -> u64 {
        self.next_agent_id += 1;
        self.next_agent_id
    }

    /// Forgets `conn` as the client; answers the agent's requests it left open.
    fn detach(&mut self, conn: ConnId) -> Vec<Output> {
        if self.client == Some(conn) {
            self.client = None;
            self.client_decides = false;
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
        let orphaned: Vec<AgentRequest> = orphaned
            .into_iter()
            .filter_map(|key| self.agent_requests.remove(&key))
            .collect();
        let mut out = Vec::new();
        for request in orphaned {
            if request.method == method::SESSION_REQUEST_PERMISSION {
                // The client that would have decided left: the policy decides.
                out.extend(self.permission_by_policy(request.id, &request.raw));
                continue;
            }
            if let Some(suppressed) = self.notes.allow() {
                tracing::info!(method = %request.method, suppressed, "client left with an agent request open; answering with the default");
            }
            out.push(Output::ToAgent(default_answer(request.id, &request.method)));
        }
        out
    }

    fn client_request(
        &mut self,
        conn: ConnId,
        id: Value,
        method: String,
        mut raw: Map<String, Value>,
    ) -> Vec<Output> {
        if method == method::INITIALIZE {
            return self.client_initialize(conn, id);
        }
        let session_id = raw
            .get("params")
            .and_then(|p| p.get("sessionId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let OwnMeta {
            launch,
            trace,
            saved_config,
            prompt_id,
        } = take_meta(&mut raw);
        let launch = launch.map(|launch| (launch, method.clone(), session_id.clone()));
        if let Some(key) = &launch
            && let Some(out) = self.repeated_launch_request(conn, &id, key)
        {
            return out;
        }
        let agent_id = self.alloc_id();
        raw.insert("id".into(), json!(agent_id));
        if let Some(key) = &launch {
            self.open_launch_request(key, agent_id);
        }
        if let (Some(cwd), method::SESSION_NEW | method::SESSION_LOAD | method::SESSION_RESUME) =
            (&self.config.session_cwd, method.as_str())
            && let Some(params) = raw.get_mut("params").and_then(Value::as_object_mut)
        {
            params.insert("cwd".into(), json!(cwd));
        }
        let span = forward_span(&method, session_id.as_deref(), launch.as_ref(), &trace);
        put_trace_context(&mut raw, telemetry::inject(&span));
        tracing::debug!(%method, %id, agent_id, "client request forwarded");
        let out = self.forward_to_agent(&method, session_id.as_deref(), prompt_id, raw);
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

    /// A client's `initialize`: the agent's answer once it has one (or its failure); until
    /// then the client waits, and the first such client starts the agent's own `initialize`.
    fn client_initialize(&mut self, conn: ConnId, id: Value) -> Vec<Output> {
        match &mut self.init {
            InitState::Ready(result) => vec![Output::ToClient(
                conn,
                jsonrpc::result_message(id, result.clone()),
            )],
            InitState::Failed { code, message } => vec![Output::ToClient(
                conn,
                jsonrpc::error_message(id, *code, message),
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
        }
    }

    /// Remembers a launch-tagged request sent to the agent as `agent_id`, so that a repeat of
    /// it gets this one's answer; only the open ones are kept once the map is full.
    fn open_launch_request(&mut self, key: &LaunchKey, agent_id: u64) {
        self.last_launch = Some(key.0.clone());
        if self.launch_requests.len() >= LAUNCH_REQUESTS_KEPT {
            self.launch_requests
                .retain(|_, request| matches!(request, LaunchRequest::Open(_)));
        }
        self.launch_requests
            .insert(key.clone(), LaunchRequest::Open(agent_id));
    }

    /// What goes to the agent for a client's request (with what it journals and records): a
    /// prompt is journaled before the agent gets it, carries the history when it is due, and
    /// its text is recorded; a load is counted while it replays.
    fn forward_to_agent(
        &mut self,
        method: &str,
        session_id: Option<&str>,
        prompt_id: Option<String>,
        raw: Map<String, Value>,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        match (method, session_id) {
            (method::SESSION_PROMPT, Some(session_id)) => {
                // Journaled before the agent gets the prompt: an entry with the client's id is
                // the proof that the prompt may have reached it.
                out.push(Output::Event(Event::PromptStarted {
                    session_id: session_id.to_owned(),
                    prompt_id,
                }));
                let history_session = self.history_session(session_id);
                let text = prompt_text(raw.get("params"));
                // Text left over from outside a turn belongs before this prompt.
                out.extend(self.flush_agent_text(session_id));
                if self.take_injection(session_id) {
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
            (method::SESSION_LOAD, Some(session_id)) => {
                self.sessions
                    .entry(session_id.to_owned())
                    .or_default()
                    .loading += 1;
                out.push(Output::ToAgent(Value::Object(raw)));
            }
            _ => out.push(Output::ToAgent(Value::Object(raw))),
        }
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
        let mut out = self.request_answered(&pending, result, error);
        if self.client == Some(pending.conn) {
            raw.insert("id".into(), pending.client_id);
            out.push(Output::ToClient(pending.conn, Value::Object(raw)));
        } else {
            tracing::debug!(method = %pending.method, "response for a departed client dropped");
        }
        out
    }

    /// What the agent's answer to a forwarded request means for the sessions: a created or
    /// restored session is journaled and its configuration read (a fresh one gets the history
    /// with its next prompt, a restored one does not), a finished prompt is journaled.
    fn request_answered(
        &mut self,
        pending: &Pending,
        result: Option<&Value>,
        error: Option<&Value>,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        match pending.method.as_str() {
            method::SESSION_NEW => {
                if let Some(session_id) = result
                    .and_then(|r| r.get("sessionId"))
                    .and_then(Value::as_str)
                {
                    out.push(self.session_created(session_id, &pending.method));
                    out.extend(self.session_answered(
                        session_id,
                        result,
                        pending.saved_config.as_ref(),
                    ));
                    // A fresh agent session: the next prompt carries the recorded history.
                    self.inject_next_prompt_of =
                        self.config.history_injection.then(|| session_id.to_owned());
                }
            }
            method::SESSION_LOAD | method::SESSION_RESUME => {
                if pending.method == method::SESSION_LOAD
                    && let Some(recording) = pending
                        .session_id
                        .as_ref()
                        .and_then(|s| self.sessions.get_mut(s))
                {
                    recording.loading = recording.loading.saturating_sub(1);
                }
                if let (Some(result), Some(session_id)) = (result, &pending.session_id) {
                    out.push(self.session_created(session_id, &pending.method));
                    out.extend(self.session_answered(
                        session_id,
                        Some(result),
                        pending.saved_config.as_ref(),
                    ));
                    // The agent remembers this session itself: nothing to inject.
                    self.inject_next_prompt_of = None;
                }
            }
            method::SESSION_PROMPT => {
                if let Some(session_id) = &pending.session_id {
                    out.extend(self.flush_agent_text(session_id));
                    out.push(self.prompt_finished(session_id, result, error));
                }
            }
            _ => {}
        }
        out
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
                    jsonrpc::result_message(id, result.clone()),
                ));
            }
        } else {
            let (code, message) = jsonrpc::error_parts(raw.get("error"));
            for (conn, id) in clients {
                out.push(Output::ToClient(
                    conn,
                    jsonrpc::error_message(id, code, &message),
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
        if method == method::SESSION_REQUEST_PERMISSION
            && !(self.client.is_some() && self.client_decides)
        {
            return self.permission_by_policy(id, &raw);
        }
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
                let kept = if method == method::SESSION_REQUEST_PERMISSION {
                    raw.clone()
                } else {
                    Map::new()
                };
                self.agent_requests.insert(
                    jsonrpc::id_key(&id),
                    AgentRequest {
                        conn,
                        id,
                        method,
                        raw: kept,
                    },
                );
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
        if method == method::SESSION_UPDATE
            && let Some(params) = raw.get("params")
        {
            out.extend(self.record_update(params));
        }
        if let Some(conn) = self.client {
            out.push(Output::ToClient(conn, Value::Object(raw)));
        }
        out
    }
}

fn str_field<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

/// The W3C trace context keys of `_meta` (ACP reserves them for exactly this).
const TRACE_META: [&str; 2] = ["traceparent", "tracestate"];

/// The span of one request forwarded to the agent: a root of agentctl's own, with the
/// operator's trace (a `traceparent` in the request's `_meta`) as its remote parent; the agent
/// gets this span's context instead.
fn forward_span(
    method: &str,
    session_id: Option<&str>,
    launch: Option<&LaunchKey>,
    trace: &HashMap<String, String>,
) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "agentctl.forward",
        method = %method,
        session_id = session_id.unwrap_or(""),
        launch = launch.map(|l| l.0.as_str()).unwrap_or(""),
        outcome = tracing::field::Empty,
        error_code = tracing::field::Empty,
    );
    telemetry::set_remote_parent(&span, trace);
    span
}

/// What a client's request carries in `_meta` for agentctl alone.
#[derive(Default)]
struct OwnMeta {
    launch: Option<String>,
    trace: HashMap<String, String>,
    saved_config: Option<SessionConfigState>,
    /// [`PROMPT_ID_META`], when it is a short id (at most 128 bytes, no control
    /// characters): it goes into the journal.
    prompt_id: Option<String>,
}

/// Removes [`LAUNCH_META`], [`SESSION_CONFIG_META`], [`PROMPT_ID_META`] and the trace context
/// from the request's `_meta` (the agent has no use for them, and gets agentctl's own trace
/// context; `_meta` goes when nothing else is in it) and returns them.
fn take_meta(raw: &mut Map<String, Value>) -> OwnMeta {
    let mut own = OwnMeta::default();
    let Some(params) = raw.get_mut("params").and_then(Value::as_object_mut) else {
        return own;
    };
    let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) else {
        return own;
    };
    let text = |value: Value| value.as_str().map(str::to_owned);
    own.launch = meta.remove(LAUNCH_META).and_then(text);
    own.saved_config = meta
        .remove(SESSION_CONFIG_META)
        .and_then(|config| serde_json::from_value(config).ok());
    own.prompt_id = meta
        .remove(PROMPT_ID_META)
        .and_then(text)
        .filter(|id| session_id_problem(id).is_none());
    for key in TRACE_META {
        if let Some(Value::String(value)) = meta.remove(key) {
            own.trace.insert(key.to_owned(), value);
        }
    }
    if meta.is_empty() {
        params.remove("_meta");
    }
    own
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
