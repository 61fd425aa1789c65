//! `kandev-test-agent`: a scriptable ACP agent for the protocol tests' error paths.
//!
//! Real agents only fail in the ways they happen to fail; the restore rules (DESIGN §3) must be
//! proven against every JSON-RPC code, hangs, crashes and garbage on stdout. This agent is told
//! on its command line how to answer each method, and with `--log` appends every message it
//! receives, so a test can assert which calls were made (above all: that no `session/new` was
//! sent after a failure that must keep the token).
//!
//! Wire: one JSON message per line, flushed; each request is answered as soon as its line
//! arrives (never at stdin EOF, which kwok's exec never delivers). EOF just ends the process.
//!
//! Behaviours (`--on-initialize/-resume/-load/-new/-prompt`):
//! - `ok`: answer properly. resume/load succeed only for `--known-session` ids; other ids get
//!   -32002 "Resource not found", like claude-agent-acp.
//! - `error:<code>[:<message>]`: answer with that JSON-RPC error.
//! - `hang`: never answer (a hanging `session/prompt` is answered `cancelled` on `session/cancel`).
//! - `slow:<seconds>`: answer properly, that many seconds late (an agent slow to boot).
//! - `crash`: exit with status 3 without answering.
//! - `garbage`: print non-JSON lines instead of an answer, and never answer.
//! - `malformed`: answer with a `result` that does not match the schema.
//!
//! Floods (`--flood`, on `session/load` of a known session, instead of its answer), for the
//! memory bounds of the clients: `replay` writes 500 MB of `session/update` notifications and
//! then answers; `long-line` writes one 30 MiB line and then answers; `requests` writes 10^6
//! requests to the client and never reads stdin again. Three floods are one line of tiny JSON
//! values, 7 MiB by default (within the replay line limit), sent as the load's answer itself
//! (`{"jsonrpc":"2.0","id":<id>,"result":{"flood":<payload>}}`), which costs many times its bytes
//! once parsed: `dense` is an array of zeros `[0,0,…]`, `objects` an array of small objects
//! `[{"a":0},…]`, `deep` arrays nested as deep as the size allows `[[[…0…]]]`; after it the agent
//! answers nothing more for that load. `--flood-amount` overrides the size (bytes, or the number
//! of requests; a line's size leaves out its newline). Writing stops when the client is gone.
//!
//! `--message-ids` gives every message chunk an ACP `messageId` (as real agents do), and
//! `--log-prompt-text` logs each prompt's text, so a test can check what reached the agent.
//!
//! `--session-config` advertises modes (`default`, `plan`), models (`small`, `large`) and a
//! select config option `effort` (`low`, `high`) in every session/new, load and resume answer,
//! always at their defaults (so a restored session comes back with defaults, as a restarted
//! agent process may), and accepts `session/set_mode`, `session/set_model` and
//! `session/set_config_option`, logged as `set mode|model|effort <value>`
//! (`--reject-set` answers them -32603). A prompt `set-mode <id>` switches the mode and reports
//! it with a `current_mode_update`.
//!
//! `--hostile <BYTES>` plays an agent that chooses its words to hurt the client: its name
//! (`agentInfo.name`) and every JSON-RPC error message it sends are BYTES long, and with
//! `--session-config` it reports 1,000 config options besides `effort`; with
//! `--hostile-session-id`, `session/new` hands out an id of BYTES too. Keep BYTES under the
//! client's line limit (1 MiB) to reach the client's bounds on the text itself.
//!
//! `--ask-permissions edit,execute` makes each prompt ask for those permissions first, in
//! order (`session/request_permission` with a tool call of that kind and the options
//! `allow_once`, `allow_always`, `reject_once`, `reject_always`), each waiting for its answer
//! (other messages are handled meanwhile), logged as `permission <kind> selected <optionId>` or
//! `permission <kind> cancelled`; then the prompt is answered as usual.
//!
//! Test-only; not shipped in images.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::str::FromStr;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, ContentBlock, ContentChunk, Implementation, InitializeResponse, MessageId,
    NewSessionResponse, PromptResponse, SessionCapabilities, SessionNotification,
    SessionResumeCapabilities, SessionUpdate, StopReason,
};
use clap::Parser;
use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Behavior {
    Ok,
    Error {
        code: i64,
        message: String,
    },
    Hang,
    /// Answer normally, after this many seconds (an agent slow to boot).
    Slow(u64),
    Crash,
    Garbage,
    Malformed,
}

impl FromStr for Behavior {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "ok" => Ok(Self::Ok),
            "hang" => Ok(Self::Hang),
            "crash" => Ok(Self::Crash),
            "garbage" => Ok(Self::Garbage),
            "malformed" => Ok(Self::Malformed),
            _ if text.starts_with("slow:") => text["slow:".len()..]
                .parse()
                .map(Self::Slow)
                .map_err(|_| format!("bad seconds in {text:?}")),
            _ => {
                let rest = text
                    .strip_prefix("error:")
                    .ok_or_else(|| format!("unknown behaviour {text:?}"))?;
                let (code, message) = match rest.split_once(':') {
                    Some((code, message)) => (code, Some(message.to_owned())),
                    None => (rest, None),
                };
                let code: i64 = code
                    .parse()
                    .map_err(|_| format!("bad JSON-RPC code in {text:?}"))?;
                let message = message.unwrap_or_else(|| default_message(code).to_owned());
                Ok(Self::Error { code, message })
            }
        }
    }
}

/// The usual wording for each code, so a test's `error:-32000` reads like the real thing.
fn default_message(code: i64) -> &'static str {
    match code {
        -32601 => "Method not found",
        -32602 => "Invalid params",
        -32603 => "Internal error",
        -32002 => "Resource not found",
        -32000 => "Authentication required",
        -32800 => "Request cancelled",
        _ => "Test agent error",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Capability {
    /// `agentCapabilities.sessionCapabilities.resume`
    Resume,
    /// `agentCapabilities.loadSession`
    Load,
    /// Advertise nothing.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Flood {
    /// 500 MB of `session/update` notifications before the answer.
    Replay,
    /// One line of 30 MiB before the answer.
    LongLine,
    /// 10^6 requests to the client, and stdin is never read again.
    Requests,
    /// The answer is one 7 MiB line: an array of zeros.
    Dense,
    /// The answer is one 7 MiB line: an array of small objects.
    Objects,
    /// The answer is one 7 MiB line: arrays nested as deep as the size allows.
    Deep,
}

impl Flood {
    fn default_amount(self) -> u64 {
        match self {
            Self::Replay => 500_000_000,
            Self::LongLine => 30 * 1024 * 1024,
            Self::Requests => 1_000_000,
            Self::Dense | Self::Objects | Self::Deep => 7 * 1024 * 1024,
        }
    }
}

/// Writes `unit` `count` times through blocks of about 64 KiB, never holding the whole run.
fn write_repeated(out: &mut impl Write, unit: &[u8], count: u64) -> std::io::Result<()> {
    let per_block = ((1usize << 16) / unit.len().max(1)).max(1);
    let block = unit.repeat(per_block);
    let mut left = count;
    while left > 0 {
        let n = left.min(per_block as u64) as usize;
        out.write_all(&block[..n * unit.len()])?;
        left -= n as u64;
    }
    Ok(())
}

#[derive(Parser, Debug)]
#[command(
    name = "kandev-test-agent",
    about = "Scriptable ACP agent for protocol tests"
)]
struct Args {
    /// Capabilities announced in `initialize`.
    #[arg(long, value_delimiter = ',', default_value = "resume,load")]
    advertise: Vec<Capability>,
    #[arg(long, default_value = "ok")]
    on_initialize: Behavior,
    #[arg(long, default_value = "ok")]
    on_resume: Behavior,
    #[arg(long, default_value = "ok")]
    on_load: Behavior,
    #[arg(long, default_value = "ok")]
    on_new: Behavior,
    #[arg(long, default_value = "ok")]
    on_prompt: Behavior,
    /// Session ids that resume/load know (repeatable); all others get -32002.
    #[arg(long)]
    known_session: Vec<String>,
    /// `session/load` replays this many `session/update` messages before answering.
    #[arg(long, default_value_t = 0)]
    replay: usize,
    /// The id `session/new` hands out (default: `test-session-<n>`).
    #[arg(long)]
    new_session_id: Option<String>,
    /// `session/new` hands out `test-session-<pid>-<n>`: unique across agent processes, so a
    /// fresh session of a new pod never has the id of the one before.
    #[arg(long, conflicts_with = "new_session_id")]
    unique_session_ids: bool,
    /// ACP protocol version to answer `initialize` with.
    #[arg(long, default_value_t = 1)]
    protocol_version: u16,
    /// Before each answer, also send what real agents send and a client must cope with: an
    /// unknown notification, a garbage line, a permission request and a file-system request.
    #[arg(long)]
    chatter: bool,
    /// Flood the client on `session/load` (see the module docs).
    #[arg(long, value_enum)]
    flood: Option<Flood>,
    /// The flood's size: bytes for `replay`, `long-line`, `dense`, `objects` and `deep`,
    /// requests for `requests`.
    #[arg(long)]
    flood_amount: Option<u64>,
    /// Append one line per received message: `<method> [<sessionId>]`, or
    /// `response <id> ok|error <detail>` for answers to our own requests.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Also log each prompt's text, as `prompt-text <JSON string>` right after its
    /// `session/prompt` line.
    #[arg(long, requires = "log")]
    log_prompt_text: bool,
    /// Give every message chunk an ACP `messageId`: `<session>/m-<n>` for answers (n counts
    /// across the process), `<session>/replay-<n>` for the replayed transcript.
    #[arg(long)]
    message_ids: bool,
    /// Advertise modes, models and config options (see the module docs).
    #[arg(long)]
    session_config: bool,
    /// Answer every set call -32603.
    #[arg(long, requires = "session_config")]
    reject_set: bool,
    /// A hostile agent's text, this many bytes (see the module docs).
    #[arg(long, value_name = "BYTES")]
    hostile: Option<usize>,
    /// With `--hostile`, `session/new` hands out an id of that size.
    #[arg(long, requires = "hostile")]
    hostile_session_id: bool,
    /// Each prompt first asks for a permission of each of these tool kinds (see the module
    /// docs).
    #[arg(long, value_delimiter = ',')]
    ask_permissions: Vec<String>,
}

/// Config options a `--hostile` agent reports besides `effort`: far more than a client keeps (64),
/// in a line still within the parse-cost bound of a 1 MiB line (3 MiB once parsed; 10,000 such
/// options would cost some 24 MiB, and the client would cut the agent off for that instead).
const HOSTILE_OPTIONS: usize = 1_000;

const MODES: [&str; 2] = ["default", "plan"];
const MODELS: [&str; 2] = ["small", "large"];
const EFFORTS: [&str; 2] = ["low", "high"];

struct Agent {
    args: Args,
    out: std::io::Stdout,
    sessions_created: usize,
    agent_request_ids: usize,
    /// A prompt left hanging, answered `cancelled` on `session/cancel`.
    hanging_prompt: Option<(Value, String)>,
    /// Messages answered so far (for `--message-ids`).
    messages_sent: usize,
    input: std::io::Lines<std::io::StdinLock<'static>>,
}

impl Agent {
    fn send(&mut self, message: &Value) {
        let mut out = self.out.lock();
        // If the client is gone there is no one to tell; the read loop ends at EOF.
        let _ = writeln!(out, "{message}");
        let _ = out.flush();
    }

    fn send_raw(&mut self, line: &str) {
        let mut out = self.out.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    fn log(&self, line: &str) {
        let Some(path) = &self.args.log else { return };
        // Opened per line and closed again, so a test reading the log while we run sees it all.
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(mut file) => {
                let _ = writeln!(file, "{line}");
            }
            Err(error) => eprintln!("kandev-test-agent: cannot write log {path:?}: {error}"),
        }
    }

    fn result(&mut self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn error(&mut self, id: &Value, code: i64, message: &str) {
        let message = match self.args.hostile {
            Some(bytes) => format!("{message} {}", "E".repeat(bytes)),
            None => message.to_owned(),
        };
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        );
    }

    fn chatter(&mut self, session_id: Option<&str>) {
        if !self.args.chatter {
            return;
        }
        self.send(&json!({"jsonrpc": "2.0", "method": "_auth/status_update",
            "params": {"authStatus": {"kind": "none", "label": "Not logged in"}}}));
        self.send_raw("kandev-test-agent: this line is not JSON {");
        let session = session_id.unwrap_or("none");
        self.agent_request_ids += 1;
        let permission = format!("agent-{}", self.agent_request_ids);
        self.send(
            &json!({"jsonrpc": "2.0", "id": permission, "method": "session/request_permission",
            "params": {"sessionId": session, "toolCall": {"toolCallId": "t1", "kind": "read"}, "options": []}}),
        );
        self.agent_request_ids += 1;
        let read = format!("agent-{}", self.agent_request_ids);
        self.send(
            &json!({"jsonrpc": "2.0", "id": read, "method": "fs/read_text_file",
            "params": {"sessionId": session, "path": "/etc/hostname"}}),
        );
    }

    /// Applies a non-`ok` behaviour; returns false when the caller should answer normally.
    fn misbehave(&mut self, behavior: &Behavior, id: &Value) -> bool {
        match behavior {
            Behavior::Ok => return false,
            Behavior::Slow(seconds) => {
                std::thread::sleep(std::time::Duration::from_secs(*seconds));
                return false;
            }
            Behavior::Error { code, message } => {
                let message = message.clone();
                self.error(id, *code, &message);
            }
            Behavior::Hang => {}
            Behavior::Crash => {
                self.log("crash");
                std::process::exit(3);
            }
            Behavior::Garbage => {
                self.send_raw("Traceback (most recent call last):");
                self.send_raw("  this is not JSON-RPC {{{");
                self.send_raw("[\"an\", \"array\"]");
            }
            Behavior::Malformed => self.result(id, json!("definitely not an object")),
        }
        true
    }

    fn advertises(&self, capability: Capability) -> bool {
        self.args.advertise.contains(&capability)
    }

    fn handle(&mut self, message: &Value) {
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id").filter(|id| !id.is_null()).cloned();
        let session_id = message
            .pointer("/params/sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (method, id) {
            (Some(method), id) => {
                match &session_id {
                    Some(session) => self.log(&format!("{method} {session}")),
                    None => self.log(method),
                }
                if method == "session/prompt" && self.args.log_prompt_text {
                    let text = message
                        .pointer("/params/prompt/0/text")
                        .cloned()
                        .unwrap_or(Value::Null);
                    self.log(&format!("prompt-text {text}"));
                }
                match id {
                    Some(id) => self.request(method, &id, session_id.as_deref(), message),
                    None => self.notification(method, session_id.as_deref()),
                }
            }
            (None, Some(id)) => {
                let detail = match (message.get("result"), message.get("error")) {
                    (Some(result), _) => format!("ok {result}"),
                    (_, Some(error)) => format!("error {}", error["code"]),
                    _ => "invalid".to_owned(),
                };
                self.log(&format!("response {} {detail}", id.as_str().unwrap_or("?")));
            }
            (None, None) => self.log("invalid"),
        }
    }

    fn notification(&mut self, method: &str, session_id: Option<&str>) {
        if method == "session/cancel"
            && let Some((id, session)) = self.hanging_prompt.take()
        {
            if Some(session.as_str()) == session_id {
                self.result(&id, json!({"stopReason": "cancelled"}));
            } else {
                self.hanging_prompt = Some((id, session));
            }
        }
    }

    fn request(&mut self, method: &str, id: &Value, session_id: Option<&str>, message: &Value) {
        self.chatter(session_id);
        match method {
            "initialize" => self.initialize(id),
            "session/new" => self.new_session(id),
            "session/resume" => self.restore(id, session_id, false),
            "session/load" => self.restore(id, session_id, true),
            "session/prompt" => self.prompt(id, session_id, message),
            "session/set_mode" | "session/set_model" | "session/set_config_option"
                if self.args.session_config =>
            {
                self.set(id, method, message)
            }
            _ => self.error(id, -32601, &format!("Method not found: {method}")),
        }
    }

    /// The session configuration every session setup answer carries, at its defaults.
    fn config_fields(&self, result: &mut Value) {
        if !self.args.session_config {
            return;
        }
        let list = |ids: &[&str], key: &str| -> Vec<Value> {
            ids.iter().map(|id| json!({key: id, "name": id})).collect()
        };
        result["modes"] = json!({"currentModeId": MODES[0], "availableModes": list(&MODES, "id")});
        result["models"] =
            json!({"currentModelId": MODELS[0], "availableModels": list(&MODELS, "modelId")});
        let mut options = vec![json!({"id": "effort", "name": "Effort", "type": "select",
            "currentValue": EFFORTS[0], "options": list(&EFFORTS, "value")})];
        if self.args.hostile.is_some() {
            options.extend((0..HOSTILE_OPTIONS).map(|n| {
                json!({"id": format!("o{n}"), "name": "o", "type": "boolean", "currentValue": true})
            }));
        }
        result["configOptions"] = json!(options);
    }

    fn set(&mut self, id: &Value, method: &str, message: &Value) {
        let (what, field, allowed): (&str, &str, &[&str]) = match method {
            "session/set_mode" => ("mode", "modeId", &MODES),
            "session/set_model" => ("model", "modelId", &MODELS),
            _ => ("effort", "value", &EFFORTS),
        };
        let value = message
            .pointer(&format!("/params/{field}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.log(&format!("set {what} {value}"));
        if self.args.reject_set {
            return self.error(id, -32603, "Internal error");
        }
        if !allowed.contains(&value.as_str())
            || (what == "effort" && message.pointer("/params/configId") != Some(&json!("effort")))
        {
            return self.error(id, -32602, "Invalid params");
        }
        if what == "effort" {
            return self.result(
                id,
                json!({"configOptions": [{"id": "effort", "name": "Effort", "type": "select",
                "currentValue": value, "options": EFFORTS.iter().map(|v| json!({"value": v, "name": v})).collect::<Vec<_>>()}]}),
            );
        }
        self.result(id, json!({}));
    }

    fn initialize(&mut self, id: &Value) {
        let behavior = self.args.on_initialize.clone();
        if self.misbehave(&behavior, id) {
            return;
        }
        let mut session = SessionCapabilities::new();
        if self.advertises(Capability::Resume) {
            session = session.resume(SessionResumeCapabilities::new());
        }
        let capabilities = AgentCapabilities::new()
            .load_session(self.advertises(Capability::Load))
            .session_capabilities(session);
        let response = InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(capabilities)
            .agent_info(Implementation::new(
                match self.args.hostile {
                    Some(bytes) => "N".repeat(bytes),
                    None => "kandev-test-agent".to_owned(),
                },
                env!("CARGO_PKG_VERSION"),
            ));
        let mut response = to_value(&response);
        // Versions other than 1 exist only behind unstable schema features; write the number.
        response["protocolVersion"] = json!(self.args.protocol_version);
        self.result(id, response);
    }

    fn new_session(&mut self, id: &Value) {
        let behavior = self.args.on_new.clone();
        if self.misbehave(&behavior, id) {
            return;
        }
        self.sessions_created += 1;
        let hostile = self
            .args
            .hostile
            .filter(|_| self.args.hostile_session_id)
            .map(|bytes| "S".repeat(bytes));
        let session = hostile
            .or_else(|| self.args.new_session_id.clone())
            .unwrap_or_else(|| {
                if self.args.unique_session_ids {
                    format!(
                        "test-session-{}-{}",
                        std::process::id(),
                        self.sessions_created
                    )
                } else {
                    format!("test-session-{}", self.sessions_created)
                }
            });
        let mut result = to_value(&NewSessionResponse::new(session));
        self.config_fields(&mut result);
        self.result(id, result);
    }

    fn restore(&mut self, id: &Value, session_id: Option<&str>, load: bool) {
        let behavior = if load {
            self.args.on_load.clone()
        } else {
            self.args.on_resume.clone()
        };
        if self.misbehave(&behavior, id) {
            return;
        }
        let Some(session) = session_id.filter(|s| self.args.known_session.iter().any(|k| k == s))
        else {
            return self.error(id, -32002, "Resource not found");
        };
        let session = session.to_owned();
        if let (true, Some(flood)) = (load, self.args.flood) {
            let amount = self.args.flood_amount.unwrap_or(flood.default_amount());
            self.log(&format!("flood {flood:?} {amount}"));
            if self.flood(flood, amount, id, &session).is_err() {
                self.log("flood stopped: the client is gone");
                std::process::exit(0);
            }
            return match flood {
                Flood::Requests => {
                    // Never read stdin again; the client must cut us off.
                    loop {
                        std::thread::sleep(std::time::Duration::from_secs(3600));
                    }
                }
                // The flood was the answer.
                Flood::Dense | Flood::Objects | Flood::Deep => {}
                Flood::Replay | Flood::LongLine => self.result(id, json!({})),
            };
        }
        if load {
            for n in 0..self.args.replay {
                let mut chunk =
                    ContentChunk::new(ContentBlock::from(format!("replayed message {n}")));
                if self.args.message_ids {
                    chunk = chunk.message_id(MessageId::new(format!("{session}/replay-{n}")));
                }
                let update = if n % 2 == 0 {
                    SessionUpdate::UserMessageChunk(chunk)
                } else {
                    SessionUpdate::AgentMessageChunk(chunk)
                };
                let params = to_value(&SessionNotification::new(session.clone(), update));
                self.send(&json!({"jsonrpc": "2.0", "method": "session/update", "params": params}));
            }
        }
        let mut result = json!({});
        self.config_fields(&mut result);
        self.result(id, result);
    }

    /// Writes the flood through one buffer; an error means the client stopped reading.
    fn flood(
        &mut self,
        flood: Flood,
        amount: u64,
        id: &Value,
        session: &str,
    ) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 16, self.out.lock());
        match flood {
            Flood::Replay => {
                let chunk = ContentChunk::new(ContentBlock::from("r".repeat(1000)));
                let params = to_value(&SessionNotification::new(
                    session.to_owned(),
                    SessionUpdate::AgentMessageChunk(chunk),
                ));
                let line = json!({"jsonrpc": "2.0", "method": "session/update", "params": params})
                    .to_string();
                let mut written = 0u64;
                while written < amount {
                    writeln!(out, "{line}")?;
                    written += line.len() as u64 + 1;
                }
            }
            Flood::LongLine => {
                let head = format!(
                    r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":""#
                );
                out.write_all(head.as_bytes())?;
                let block = [b'x'; 1 << 16];
                let mut left = amount.saturating_sub(head.len() as u64 + 5);
                while left > 0 {
                    let n = left.min(block.len() as u64) as usize;
                    out.write_all(&block[..n])?;
                    left -= n as u64;
                }
                out.write_all(b"\"}}}}\n")?;
            }
            Flood::Requests => {
                for n in 0..amount {
                    writeln!(
                        out,
                        r#"{{"jsonrpc":"2.0","id":"flood-{n}","method":"fs/read_text_file","params":{{"sessionId":"{session}","path":"/etc/hostname"}}}}"#
                    )?;
                }
            }
            Flood::Dense | Flood::Objects | Flood::Deep => {
                let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"flood":"#);
                let tail = "}}\n";
                out.write_all(head.as_bytes())?;
                // The payload fills the line to `amount` bytes (without its newline); what its
                // pattern cannot fill exactly is padded with spaces, which JSON allows.
                let room = amount.saturating_sub((head.len() + tail.len() - 1) as u64);
                let written = match flood {
                    Flood::Deep => {
                        let depth = room.saturating_sub(1) / 2;
                        write_repeated(&mut out, b"[", depth)?;
                        out.write_all(b"0")?;
                        write_repeated(&mut out, b"]", depth)?;
                        2 * depth + 1
                    }
                    _ => {
                        let unit: &[u8] = if flood == Flood::Dense {
                            b"0,"
                        } else {
                            br#"{"a":0},"#
                        };
                        // `[`, then units whose last comma gives way to `]`.
                        let count = room.saturating_sub(1) / unit.len() as u64;
                        out.write_all(b"[")?;
                        if count > 0 {
                            write_repeated(&mut out, unit, count - 1)?;
                            out.write_all(&unit[..unit.len() - 1])?;
                        }
                        out.write_all(b"]")?;
                        (count * unit.len() as u64 + 1).max(2)
                    }
                };
                write_repeated(&mut out, b" ", room.saturating_sub(written))?;
                out.write_all(tail.as_bytes())?;
            }
        }
        out.flush()
    }

    fn prompt(&mut self, id: &Value, session_id: Option<&str>, message: &Value) {
        let behavior = self.args.on_prompt.clone();
        if behavior == Behavior::Hang {
            self.hanging_prompt = Some((id.clone(), session_id.unwrap_or_default().to_owned()));
            return;
        }
        if self.misbehave(&behavior, id) {
            return;
        }
        let session = session_id.unwrap_or_default().to_owned();
        for kind in self.args.ask_permissions.clone() {
            self.ask_permission(&session, &kind);
        }
        let text = message
            .pointer("/params/prompt/0/text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let (true, Some(mode)) = (self.args.session_config, text.strip_prefix("set-mode ")) {
            self.send(
                &json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": session, "update": {"sessionUpdate": "current_mode_update",
                "currentModeId": mode}}}),
            );
        }
        let mut chunk = ContentChunk::new(ContentBlock::from(format!("echo: {text}")));
        if self.args.message_ids {
            self.messages_sent += 1;
            chunk = chunk.message_id(MessageId::new(format!(
                "{session}/m-{}",
                self.messages_sent
            )));
        }
        let params = to_value(&SessionNotification::new(
            session,
            SessionUpdate::AgentMessageChunk(chunk),
        ));
        self.send(&json!({"jsonrpc": "2.0", "method": "session/update", "params": params}));
        self.result(id, to_value(&PromptResponse::new(StopReason::EndTurn)));
    }
}

impl Agent {
    /// Asks for a permission of `kind` and waits for its answer, handling what else arrives.
    fn ask_permission(&mut self, session: &str, kind: &str) {
        self.agent_request_ids += 1;
        let id = format!("perm-{}", self.agent_request_ids);
        let title = match kind {
            "edit" => "Write notes.txt".to_owned(),
            "execute" => "Run make test".to_owned(),
            other => format!("A {other} tool call"),
        };
        let options: Vec<Value> = ["allow_once", "allow_always", "reject_once", "reject_always"]
            .iter()
            .map(|k| json!({"optionId": format!("opt-{k}"), "name": k, "kind": k}))
            .collect();
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "session/request_permission",
            "params": {"sessionId": session, "toolCall": {"toolCallId": format!("tool-{id}"),
            "title": title, "kind": kind, "rawInput": {"command": title}}, "options": options}}),
        );
        while let Some(line) = self.next_line() {
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message.get("method").is_none() && message.get("id") == Some(&json!(id)) {
                let outcome = &message["result"]["outcome"];
                match outcome["outcome"].as_str() {
                    Some("selected") => self.log(&format!(
                        "permission {kind} selected {}",
                        outcome["optionId"].as_str().unwrap_or("?")
                    )),
                    _ => self.log(&format!("permission {kind} cancelled")),
                }
                return;
            }
            self.handle(&message);
        }
    }

    fn next_line(&mut self) -> Option<String> {
        loop {
            let line = self.input.next()?.ok()?;
            if !line.trim().is_empty() {
                return Some(line);
            }
        }
    }
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    // The schema types always serialize; a failure would be a bug in this test agent.
    serde_json::to_value(value).unwrap_or_else(|error| json!({"encodeError": error.to_string()}))
}

fn main() {
    let args = Args::parse();
    let mut agent = Agent {
        args,
        out: std::io::stdout(),
        sessions_created: 0,
        agent_request_ids: 0,
        hanging_prompt: None,
        messages_sent: 0,
        input: std::io::stdin().lines(),
    };
    while let Some(line) = agent.next_line() {
        match serde_json::from_str::<Value>(&line) {
            Ok(message) => agent.handle(&message),
            Err(_) => {
                agent.log("unparseable");
                agent.send(&json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": -32700, "message": "Parse error"}}));
            }
        }
    }
}
