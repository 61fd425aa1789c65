//! Approvals: `spec.permissions` (what agentctl does with an agent's `session/request_permission`
//! when no client decides), the requests that wait for a person (`status.pendingPermissions`),
//! and the answer annotation ([`PERMISSION_ANSWER_ANNOTATION`]).
//!
//! The rules are pure: [`PermissionPolicy::decide`] picks the action of a tool kind,
//! [`PermissionPolicy::over`] lays a session's policy over the operator's defaults, and
//! [`parse_answer`] reads the annotation.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::{AGENT_NAME_MAX, cap};

/// Annotation that answers one pending permission request: `<request id>=<option kind>`, e.g.
/// `t3b9qk-2=allow_once`. Whoever may update the TaskSession may answer; each value is handled once.
pub const PERMISSION_ANSWER_ANNOTATION: &str = "kandev.dev/permission-answer";

/// Requests that wait for an answer at once, at most, per session; past that the oldest is
/// rejected.
pub const PENDING_PERMISSIONS_MAX: usize = 16;
/// A request's title as kept.
pub const PERMISSION_TITLE_MAX: usize = 256;
/// A request's summary of what the tool would do, as kept.
pub const PERMISSION_SUMMARY_MAX: usize = 1024;
/// Options of one request kept.
pub const PERMISSION_OPTIONS_MAX: usize = 8;
/// The longest request id (agentctl's own, `<when serve started>-<n>`).
pub const PERMISSION_ID_MAX: usize = 32;
/// The default `askTimeout`.
pub const DEFAULT_ASK_TIMEOUT_SECONDS: u64 = 15 * 60;

/// What happens to a permission request of some tool kind.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PermissionAction {
    /// Answered with the request's allow-once option at once.
    Allow,
    /// Held until a person answers (`kubectl kandev approve|deny`) or `askTimeout` passes.
    Ask,
    /// Answered with the request's reject-once option at once.
    Deny,
}

impl PermissionAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }
}

/// ACP's tool kinds (`ToolKind`). A request without a kind, or with one this version does not
/// know, counts as `other`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    Read,
    Edit,
    Delete,
    Move,
    Search,
    Execute,
    Think,
    Fetch,
    SwitchMode,
    Other,
}

impl ToolKind {
    /// The kind an agent's `toolCall.kind` names; `other` for anything unknown.
    pub fn of(kind: Option<&str>) -> Self {
        kind.and_then(|k| serde_json::from_value(serde_json::Value::String(k.to_owned())).ok())
            .unwrap_or(Self::Other)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Edit => "edit",
            Self::Delete => "delete",
            Self::Move => "move",
            Self::Search => "search",
            Self::Execute => "execute",
            Self::Think => "think",
            Self::Fetch => "fetch",
            Self::SwitchMode => "switch_mode",
            Self::Other => "other",
        }
    }
}

impl std::fmt::Display for ToolKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule of `spec.permissions.rules`: the action for these tool kinds.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PermissionRule {
    /// ACP tool kinds: read, edit, delete, move, search, execute, think, fetch, switch_mode,
    /// other.
    #[schemars(length(min = 1, max = 10))]
    pub kinds: Vec<ToolKind>,
    pub action: PermissionAction,
}

/// `spec.permissions`: what agentctl answers when the agent asks for a permission and no client
/// that decides is connected. Each field left out takes the operator's default (chart value
/// `permissions`). Read when a pod starts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PermissionPolicy {
    /// The action for a tool kind no rule names: allow, ask or deny.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<PermissionAction>,
    /// Actions by tool kind; the first rule that names a kind decides. Set, they replace the
    /// operator's default rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub rules: Option<Vec<PermissionRule>>,
    /// How long an `ask` request waits for an answer before it is rejected (once, with an
    /// Event): a duration such as `15m` or `1h` (at least 10s), or `off` to wait as long as the
    /// agent does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^(off|([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?)$"),
        length(min = 2, max = 32)
    )]
    #[x_kube(validation = kube::core::Rule::new("self == 'off' || duration(self) >= duration('10s')").message(
        "permissions.askTimeout must be off or a duration of at least 10s, e.g. 15m"
    ))]
    pub ask_timeout: Option<String>,
}

/// The policy agentctl applies: every field decided (the session's over the operator's).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EffectivePolicy {
    pub default: PermissionAction,
    #[serde(default)]
    pub rules: Vec<PermissionRule>,
    /// Seconds; 0: no timeout.
    #[serde(default)]
    pub ask_timeout_seconds: u64,
}

impl Default for EffectivePolicy {
    /// The built-in defaults (also the chart's): the agent reads, searches, thinks and changes
    /// files in its workspace without asking; running commands, fetching from the network and
    /// anything else waits for a person, for 15 minutes. The workspace is the agent's own volume
    /// in a locked-down pod, so an edit stays inside it; a command or a fetch reaches further
    /// (the network, the repository's remote), which a person should see first.
    fn default() -> Self {
        Self {
            default: PermissionAction::Ask,
            rules: vec![PermissionRule {
                kinds: vec![
                    ToolKind::Read,
                    ToolKind::Search,
                    ToolKind::Think,
                    ToolKind::Edit,
                    ToolKind::Move,
                    ToolKind::Delete,
                    ToolKind::SwitchMode,
                ],
                action: PermissionAction::Allow,
            }],
            ask_timeout_seconds: DEFAULT_ASK_TIMEOUT_SECONDS,
        }
    }
}

impl EffectivePolicy {
    /// The action for `kind`, and the rule that gave it (`None`: the default).
    pub fn decide(&self, kind: ToolKind) -> (PermissionAction, Option<usize>) {
        self.rules
            .iter()
            .position(|rule| rule.kinds.contains(&kind))
            .map_or((self.default, None), |i| (self.rules[i].action, Some(i)))
    }

    /// The operator's `defaults` with what the session's `policy` sets laid over them, field by
    /// field. An `askTimeout` that does not parse (the CRD refuses it) keeps the default.
    pub fn over(defaults: &EffectivePolicy, policy: Option<&PermissionPolicy>) -> EffectivePolicy {
        let Some(policy) = policy else {
            return defaults.clone();
        };
        let ask_timeout_seconds = match policy.ask_timeout.as_deref() {
            Some("off") => 0,
            Some(text) => super::parse_idle_duration(text)
                .ok()
                .flatten()
                .map_or(defaults.ask_timeout_seconds, |d| d.as_secs()),
            None => defaults.ask_timeout_seconds,
        };
        EffectivePolicy {
            default: policy.default.unwrap_or(defaults.default),
            rules: policy
                .rules
                .clone()
                .unwrap_or_else(|| defaults.rules.clone()),
            ask_timeout_seconds,
        }
    }
}

/// One option a permission request offers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    /// The agent's id of the option.
    #[schemars(length(max = AGENT_NAME_MAX))]
    pub id: String,
    /// allow_once, allow_always, reject_once or reject_always.
    #[schemars(length(max = 32))]
    pub kind: String,
}

/// A permission request that waits for a person's answer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PendingPermission {
    /// agentctl's id of the request (what an answer names).
    #[schemars(length(max = PERMISSION_ID_MAX))]
    pub id: String,
    pub tool_kind: ToolKind,
    /// The tool call's title, as the agent gave it.
    #[schemars(length(max = PERMISSION_TITLE_MAX))]
    pub title: String,
    /// What the tool would do (its input), cut to a bound.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = PERMISSION_SUMMARY_MAX))]
    pub summary: String,
    /// The options the agent offers; an answer names one by its kind.
    #[schemars(length(max = PERMISSION_OPTIONS_MAX))]
    pub options: Vec<PermissionOption>,
    /// When the agent asked (RFC 3339).
    #[schemars(length(max = 64))]
    pub requested_at: String,
}

impl PendingPermission {
    /// The same request within its bounds, `None` for an id agentctl would not give (the
    /// journal is on the agent's volume).
    pub fn bounded(self) -> Option<Self> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= PERMISSION_ID_MAX
            && self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-');
        id_ok.then(|| self.capped())
    }

    /// The same request with its text cut to the bounds.
    pub fn capped(mut self) -> Self {
        self.title = cap(&self.title, PERMISSION_TITLE_MAX).into_owned();
        self.summary = cap(&self.summary, PERMISSION_SUMMARY_MAX).into_owned();
        self.requested_at = cap(&self.requested_at, 64).into_owned();
        self.options.truncate(PERMISSION_OPTIONS_MAX);
        for option in &mut self.options {
            option.id = cap(&option.id, AGENT_NAME_MAX).into_owned();
            option.kind = cap(&option.kind, 32).into_owned();
        }
        self
    }
}

/// What an agent's `session/request_permission` asks, read leniently from its `params` (ACP
/// `RequestPermissionRequest`): agentctl holds it for the policy, `kubectl kandev prompt` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermissionAsk {
    pub session_id: String,
    pub kind: ToolKind,
    /// The tool call's title (else its id), at most [`PERMISSION_TITLE_MAX`] bytes.
    pub title: String,
    /// The tool's input (else its content) as JSON, at most `summary_max` bytes.
    pub summary: String,
    /// The options offered, `(optionId, kind)`, at most 16.
    pub offered: Vec<(String, String)>,
}

impl PermissionAsk {
    pub fn read(params: Option<&serde_json::Value>, summary_max: usize) -> Self {
        use serde_json::Value;
        let text = |value: Option<&Value>| value.and_then(Value::as_str).unwrap_or("").to_owned();
        let tool = params.and_then(|p| p.get("toolCall"));
        let title = Some(text(tool.and_then(|t| t.get("title"))))
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| text(tool.and_then(|t| t.get("toolCallId"))));
        let summary = tool
            .and_then(|t| t.get("rawInput").or_else(|| t.get("content")))
            .filter(|v| !v.is_null())
            .map(|v| cap(&v.to_string(), summary_max).into_owned())
            .unwrap_or_default();
        let offered = params
            .and_then(|p| p.get("options"))
            .and_then(Value::as_array)
            .map(|options| {
                options
                    .iter()
                    .filter_map(|o| {
                        Some((
                            o.get("optionId")?.as_str()?.to_owned(),
                            o.get("kind")?.as_str()?.to_owned(),
                        ))
                    })
                    .take(16)
                    .collect()
            })
            .unwrap_or_default();
        Self {
            session_id: text(params.and_then(|p| p.get("sessionId"))),
            kind: ToolKind::of(tool.and_then(|t| t.get("kind")).and_then(Value::as_str)),
            title: if title.is_empty() {
                "(untitled tool call)".to_owned()
            } else {
                cap(&title, PERMISSION_TITLE_MAX).into_owned()
            },
            summary,
            offered,
        }
    }
}

/// How a permission request ended.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum PermissionOutcome {
    /// The policy allowed it.
    AllowedByPolicy,
    /// The policy denied it.
    DeniedByPolicy,
    /// A person (or a connected client) chose an allow option.
    Approved,
    /// A person (or a connected client) chose a reject option, or cancelled.
    Rejected,
    /// Nobody answered within `askTimeout`.
    TimedOut,
    /// The agent or its pod went while it waited.
    Gone,
    /// Rejected because more requests waited than are kept.
    Overflow,
}

impl PermissionOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllowedByPolicy => "allowedByPolicy",
            Self::DeniedByPolicy => "deniedByPolicy",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::TimedOut => "timedOut",
            Self::Gone => "gone",
            Self::Overflow => "overflow",
        }
    }
}

/// The option kinds an answer may choose.
pub const OPTION_KINDS: [&str; 4] = ["allow_once", "allow_always", "reject_once", "reject_always"];

/// An answer annotation that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error(
        "{value:?} is not <request id>=<option kind> (option kinds: allow_once, allow_always, reject_once, reject_always)"
    )]
    Malformed { value: String },
}

/// `<id>=<optionKind>` read from [`PERMISSION_ANSWER_ANNOTATION`].
pub fn parse_answer(value: &str) -> Result<(String, String), AnswerError> {
    let malformed = || AnswerError::Malformed {
        value: cap(value, 80).into_owned(),
    };
    let (id, kind) = value.trim().split_once('=').ok_or_else(malformed)?;
    let (id, kind) = (id.trim(), kind.trim());
    if id.is_empty() || id.len() > PERMISSION_ID_MAX || !OPTION_KINDS.contains(&kind) {
        return Err(malformed());
    }
    Ok((id.to_owned(), kind.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use PermissionAction::*;
    use ToolKind::*;

    #[test]
    fn the_first_rule_that_names_a_kind_decides() {
        let policy = EffectivePolicy {
            default: Deny,
            rules: vec![
                PermissionRule {
                    kinds: vec![Execute],
                    action: Ask,
                },
                PermissionRule {
                    kinds: vec![Execute, Edit],
                    action: Allow,
                },
            ],
            ask_timeout_seconds: 0,
        };
        for (kind, want) in [
            (Execute, (Ask, Some(0))),
            (Edit, (Allow, Some(1))),
            (Read, (Deny, None)),
            (Other, (Deny, None)),
        ] {
            assert_eq!(policy.decide(kind), want, "{kind}");
        }
    }

    #[test]
    fn the_defaults_let_a_task_edit_and_ask_before_commands() {
        let policy = EffectivePolicy::default();
        for (kind, want) in [
            (Read, Allow),
            (Edit, Allow),
            (Delete, Allow),
            (Search, Allow),
            (Execute, Ask),
            (Fetch, Ask),
            (Other, Ask),
        ] {
            assert_eq!(policy.decide(kind).0, want, "{kind}");
        }
        assert_eq!(policy.ask_timeout_seconds, 900);
    }

    #[test]
    fn a_session_policy_overrides_field_by_field() {
        let defaults = EffectivePolicy::default();
        let only_default = PermissionPolicy {
            default: Some(Deny),
            ..Default::default()
        };
        let merged = EffectivePolicy::over(&defaults, Some(&only_default));
        assert_eq!(merged.default, Deny);
        assert_eq!(merged.rules, defaults.rules);
        let rules = PermissionPolicy {
            rules: Some(vec![]),
            ask_timeout: Some("off".into()),
            ..Default::default()
        };
        let merged = EffectivePolicy::over(&defaults, Some(&rules));
        assert_eq!(
            (
                merged.default,
                merged.rules.len(),
                merged.ask_timeout_seconds
            ),
            (Ask, 0, 0)
        );
        let timeout = PermissionPolicy {
            ask_timeout: Some("1h30m".into()),
            ..Default::default()
        };
        assert_eq!(
            EffectivePolicy::over(&defaults, Some(&timeout)).ask_timeout_seconds,
            5400
        );
        assert_eq!(EffectivePolicy::over(&defaults, None), defaults);
    }

    #[test]
    fn unknown_tool_kinds_count_as_other() {
        assert_eq!(ToolKind::of(Some("execute")), Execute);
        assert_eq!(ToolKind::of(Some("switch_mode")), SwitchMode);
        assert_eq!(ToolKind::of(Some("teleport")), Other);
        assert_eq!(ToolKind::of(None), Other);
    }

    #[test]
    fn answers_parse_or_say_what_is_expected() {
        assert_eq!(
            parse_answer("p3=allow_once"),
            Ok(("p3".into(), "allow_once".into()))
        );
        assert_eq!(
            parse_answer(" p3 = reject_always "),
            Ok(("p3".into(), "reject_always".into()))
        );
        for bad in [
            "p3",
            "=allow_once",
            "p3=yes",
            "p3=allow",
            &format!("{}=allow_once", "p".repeat(40)),
        ] {
            let error = parse_answer(bad).expect_err(bad).to_string();
            assert!(error.contains("<request id>=<option kind>"), "{error}");
        }
    }

    #[test]
    fn pending_requests_are_kept_within_bounds() {
        let request = PendingPermission {
            id: "p1".into(),
            tool_kind: Execute,
            title: "t".repeat(10_000),
            summary: "s".repeat(10_000),
            options: vec![
                PermissionOption {
                    id: "o".repeat(1000),
                    kind: "allow_once".into()
                };
                20
            ],
            requested_at: "T".into(),
        };
        let bounded = request.clone().bounded().expect("kept");
        assert!(bounded.title.len() <= PERMISSION_TITLE_MAX);
        assert!(bounded.summary.len() <= PERMISSION_SUMMARY_MAX);
        assert_eq!(bounded.options.len(), PERMISSION_OPTIONS_MAX);
        assert!(bounded.options[0].id.len() <= AGENT_NAME_MAX);
        for id in ["", "a\nb", "p 1", &"p".repeat(33)] {
            let forged = PendingPermission {
                id: id.into(),
                ..request.clone()
            };
            assert_eq!(forged.bounded(), None, "{id:?}");
        }
    }
}
