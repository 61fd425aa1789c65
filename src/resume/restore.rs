//! ACP restore method selection and the fallback after a failed attempt (DESIGN §3 "ACP restore
//! selection"). Pure; the ACP client executes the plan and reports failures back here.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::classify::RestoreErrorClass;
use crate::jsonrpc::method;

/// A profile's `nativeSessionResume`: whether a saved token is restored over ACP.
///
/// Written `auto`, `true` or `false` in profiles. `auto` (the built-ins' default) and `true`
/// both restore with what the agent advertises in `initialize`: an agent is never sent a restore
/// method it did not advertise, so one that advertises neither gets `session/new`. `false` never
/// restores natively (every resume starts a new session, and agentctl may start the profile's
/// `cliResume` command instead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NativeSessionResume {
    /// Trust `initialize` (`auto`).
    #[default]
    Auto,
    /// Restore natively (`true`), as far as the agent advertises a restore method.
    Always,
    /// Never restore natively (`false`).
    Never,
}

impl NativeSessionResume {
    /// Whether a saved token may be restored over ACP at all (`auto` and `true`).
    pub fn restores_natively(self) -> bool {
        !matches!(self, Self::Never)
    }

    /// The profile-file spelling: `auto`, `true` or `false`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Always => "true",
            Self::Never => "false",
        }
    }
}

impl From<bool> for NativeSessionResume {
    fn from(native: bool) -> Self {
        if native { Self::Always } else { Self::Never }
    }
}

impl std::fmt::Display for NativeSessionResume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `auto` as a string, `true`/`false` as booleans (so existing profiles stay valid).
impl Serialize for NativeSessionResume {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => serializer.serialize_str("auto"),
            Self::Always => serializer.serialize_bool(true),
            Self::Never => serializer.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for NativeSessionResume {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bool(bool),
            Word(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Bool(native) => Ok(native.into()),
            Written::Word(word) if word == "auto" => Ok(Self::Auto),
            Written::Word(word) => Err(serde::de::Error::custom(format!(
                "nativeSessionResume must be auto, true or false, not {word:?}"
            ))),
        }
    }
}

/// The restore-relevant part of the capabilities an agent advertised in `initialize`.
///
/// Our own plain struct so these rules do not depend on the ACP crate's types; the ACP client
/// fills it from `agentCapabilities.loadSession` and
/// `agentCapabilities.sessionCapabilities.resume`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentRestoreCapabilities {
    pub load_session: bool,
    pub session_resume: bool,
}

/// The ACP method a restore step calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestoreMethod {
    /// `session/resume`: reattach without replaying history.
    Resume,
    /// `session/load`: reattach and replay the transcript as updates.
    Load,
    /// `session/new`: start over; the old ACP session is not used.
    New,
}

impl RestoreMethod {
    /// The JSON-RPC method name.
    pub fn method_name(self) -> &'static str {
        match self {
            Self::Resume => method::SESSION_RESUME,
            Self::Load => method::SESSION_LOAD,
            Self::New => method::SESSION_NEW,
        }
    }

    /// The tracing span for this step (child of `acp.session.restore`).
    pub fn span_name(self) -> &'static str {
        match self {
            Self::Resume => "acp.session.resume",
            Self::Load => "acp.session.load",
            Self::New => "acp.session.new",
        }
    }
}

/// Why a restore ends in `session/new` instead of reattaching the saved session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FreshReason {
    /// There is no saved resume token (or the user asked for a fresh start, which drops it).
    NoResumeToken,
    /// The profile says never to restore natively (`nativeSessionResume: false`).
    ProfileHasNoNativeResume,
    /// The profile allows native resume (`auto` or `true`), but this agent advertised neither
    /// `sessionCapabilities.resume` nor `loadSession`: restore is explicitly unsupported, and
    /// ACP forbids calling `session/load` unadvertised.
    RestoreUnsupportedByAgent,
    /// The restore method answered -32601 and no other restore method is left.
    MethodNotFound,
    /// The agent answered -32002: it explicitly does not know the saved session.
    UnknownSession,
}

impl FreshReason {
    /// Whether the agent itself turned the saved session down (an unknown session, or restore
    /// unsupported), as opposed to a fresh start nobody tried to avoid (no token, or a profile
    /// that never restores natively and relies on history injection instead).
    pub fn agent_rejected_token(self) -> bool {
        match self {
            Self::NoResumeToken | Self::ProfileHasNoNativeResume => false,
            Self::RestoreUnsupportedByAgent | Self::MethodNotFound | Self::UnknownSession => true,
        }
    }

    /// Whether the fresh start deserves a Warning: the agent turned down a restore it offers (an
    /// unknown session, a method it advertised but does not have). An agent that offers no
    /// restore at all starts over on every resume by design: a Normal Event says so.
    pub fn warns(self) -> bool {
        matches!(self, Self::MethodNotFound | Self::UnknownSession)
    }

    /// Stable name for conditions, Events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoResumeToken => "no_resume_token",
            Self::ProfileHasNoNativeResume => "profile_has_no_native_resume",
            Self::RestoreUnsupportedByAgent => "restore_unsupported_by_agent",
            Self::MethodNotFound => "method_not_found",
            Self::UnknownSession => "unknown_session",
        }
    }
}

impl std::fmt::Display for FreshReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first restore step to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestorePlan {
    /// `session/resume` with the saved token.
    Resume(String),
    /// `session/load` with the saved token.
    Load(String),
    /// `session/new`.
    New { why: FreshReason },
}

impl RestorePlan {
    pub fn method(&self) -> RestoreMethod {
        match self {
            Self::Resume(_) => RestoreMethod::Resume,
            Self::Load(_) => RestoreMethod::Load,
            Self::New { .. } => RestoreMethod::New,
        }
    }
}

/// Chooses the first restore step (DESIGN §3); "native resume" is `auto` or `true`:
/// - native resume + token + `sessionCapabilities.resume` → `session/resume` (no replay);
/// - native resume + token, no resume but `loadSession` → `session/load`;
/// - native resume + token, neither advertised → `session/new`, reason
///   [`FreshReason::RestoreUnsupportedByAgent`] (explicitly unsupported);
/// - otherwise (`false`, or no token) → `session/new` with the reason.
///
/// An empty or whitespace-only token counts as no token.
pub fn select_restore_method(
    capabilities: AgentRestoreCapabilities,
    native_session_resume: NativeSessionResume,
    resume_token: Option<&str>,
) -> RestorePlan {
    let token = match resume_token.map(str::trim) {
        Some(token) if !token.is_empty() => token,
        _ => {
            return RestorePlan::New {
                why: FreshReason::NoResumeToken,
            };
        }
    };
    if !native_session_resume.restores_natively() {
        return RestorePlan::New {
            why: FreshReason::ProfileHasNoNativeResume,
        };
    }
    if capabilities.session_resume {
        RestorePlan::Resume(token.to_owned())
    } else if capabilities.load_session {
        RestorePlan::Load(token.to_owned())
    } else {
        RestorePlan::New {
            why: FreshReason::RestoreUnsupportedByAgent,
        }
    }
}

/// What to do after a restore step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// `session/load` of the same id.
    TryLoad,
    /// The token is proven useless: clear it and call `session/new`.
    FallBackToNew { why: FreshReason },
    /// Inconclusive: keep the saved token, fail the resume loudly (condition + Event) so the
    /// user can retry or explicitly ask for a fresh start.
    KeepTokenAndFail { why: RestoreErrorClass },
}

/// The fallback step (DESIGN §3):
/// - `session/resume` answered -32601 and `loadSession` is advertised → load the same id;
/// - -32601 otherwise → `session/new`;
/// - -32002 resource-not-found → `session/new` (no point loading an id the agent just said it
///   does not know);
/// - anything else (transport, auth, cancellation, timeout, -32602, -32603, …) keeps the token.
///
/// A failed `session/new` has nothing left to fall back to, so it always fails (and keeps
/// whatever token is saved; the launch failure is the caller's to report).
pub fn next_step_after_failure(
    method_tried: RestoreMethod,
    class: &RestoreErrorClass,
    capabilities: AgentRestoreCapabilities,
) -> NextStep {
    let class = *class;
    match (method_tried, class) {
        (RestoreMethod::New, why) => NextStep::KeepTokenAndFail { why },
        (RestoreMethod::Resume, RestoreErrorClass::MethodNotFound) if capabilities.load_session => {
            NextStep::TryLoad
        }
        (_, RestoreErrorClass::MethodNotFound) => NextStep::FallBackToNew {
            why: FreshReason::MethodNotFound,
        },
        (_, RestoreErrorClass::UnknownSession) => NextStep::FallBackToNew {
            why: FreshReason::UnknownSession,
        },
        (_, why) => NextStep::KeepTokenAndFail { why },
    }
}

/// How a restore ended (DESIGN §3 "ACP restore selection").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreOutcome {
    /// The saved ACP session is back, through `method` (`session/resume` or `session/load`).
    Restored {
        method: RestoreMethod,
        session_id: String,
    },
    /// A new session was started with `session/new`; `session_id` is the new resume token.
    Fresh {
        session_id: String,
        why: FreshReason,
    },
    /// Nothing usable came out of it.
    Failed {
        /// The last restore method tried; `None` when `initialize` itself failed.
        method: Option<RestoreMethod>,
        class: RestoreErrorClass,
        /// The caller must keep the saved token (DESIGN §3: transport, auth, cancellation,
        /// timeouts and anything inconclusive keep it). False only when an earlier step proved
        /// the token useless (-32601 / -32002 / restore unsupported) and the fallback
        /// `session/new` then failed too, or when there was no token at all.
        token_kept: bool,
        /// The kept token, so a report can say which session is still waiting to be restored.
        session_id: Option<String>,
        /// Human-readable and starting with `class` (e.g. `auth_required: …`).
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agent_rejects_a_token_and_only_a_refused_offer_warns() {
        for (why, rejected, warns) in [
            (FreshReason::NoResumeToken, false, false),
            (FreshReason::ProfileHasNoNativeResume, false, false),
            (FreshReason::RestoreUnsupportedByAgent, true, false),
            (FreshReason::MethodNotFound, true, true),
            (FreshReason::UnknownSession, true, true),
        ] {
            assert_eq!(why.agent_rejected_token(), rejected, "{why}");
            assert_eq!(why.warns(), warns, "{why}");
        }
    }
    use RestoreErrorClass as C;
    use pretty_assertions::assert_eq;

    const NONE: AgentRestoreCapabilities = AgentRestoreCapabilities {
        load_session: false,
        session_resume: false,
    };
    const LOAD: AgentRestoreCapabilities = AgentRestoreCapabilities {
        load_session: true,
        session_resume: false,
    };
    const RESUME: AgentRestoreCapabilities = AgentRestoreCapabilities {
        load_session: false,
        session_resume: true,
    };
    const BOTH: AgentRestoreCapabilities = AgentRestoreCapabilities {
        load_session: true,
        session_resume: true,
    };

    fn new(why: FreshReason) -> RestorePlan {
        RestorePlan::New { why }
    }

    #[test]
    fn selection_table() {
        use NativeSessionResume::{Always, Auto, Never};
        let resume = || RestorePlan::Resume("tok".into());
        let load = || RestorePlan::Load("tok".into());
        #[rustfmt::skip]
        let rows = [
            // §3 restore: native resume + token + sessionCapabilities.resume → session/resume.
            (BOTH, Always, Some("tok"), resume()),
            (RESUME, Always, Some("tok"), resume()),
            // §3 restore: agent does not advertise resume → session/load.
            (LOAD, Always, Some("tok"), load()),
            // Advertises neither: explicitly unsupported → session/new saying so.
            (NONE, Always, Some("tok"), new(FreshReason::RestoreUnsupportedByAgent)),
            // `auto` trusts what initialize advertised, exactly like the rows above.
            (BOTH, Auto, Some("tok"), resume()),
            (RESUME, Auto, Some("tok"), resume()),
            (LOAD, Auto, Some("tok"), load()),
            (NONE, Auto, Some("tok"), new(FreshReason::RestoreUnsupportedByAgent)),
            // §3 restore "otherwise → session/new": `false` in the profile, whatever is advertised…
            (BOTH, Never, Some("tok"), new(FreshReason::ProfileHasNoNativeResume)),
            (LOAD, Never, Some("tok"), new(FreshReason::ProfileHasNoNativeResume)),
            (NONE, Never, Some("tok"), new(FreshReason::ProfileHasNoNativeResume)),
            // …or no token (empty and blank tokens are no token).
            (BOTH, Always, None, new(FreshReason::NoResumeToken)),
            (BOTH, Auto, None, new(FreshReason::NoResumeToken)),
            (BOTH, Always, Some(""), new(FreshReason::NoResumeToken)),
            (BOTH, Auto, Some("  "), new(FreshReason::NoResumeToken)),
            (NONE, Never, None, new(FreshReason::NoResumeToken)),
        ];
        for (caps, native, token, expected) in rows {
            let plan = select_restore_method(caps, native, token);
            assert_eq!(plan, expected, "{caps:?} native={native} token={token:?}");
        }
    }

    #[test]
    fn native_session_resume_is_written_auto_true_or_false() {
        use NativeSessionResume::{Always, Auto, Never};
        for (yaml, expected) in [("auto", Auto), ("true", Always), ("false", Never)] {
            let parsed: NativeSessionResume = serde_yaml_ng::from_str(yaml).expect(yaml);
            assert_eq!(parsed, expected, "{yaml}");
            let json = serde_json::to_string(&parsed).expect("serializes");
            let back: NativeSessionResume = serde_json::from_str(&json).expect("round trip");
            assert_eq!(back, expected, "{json}");
            assert_eq!(parsed.as_str(), yaml);
        }
        assert_eq!(NativeSessionResume::default(), Auto);
        for bad in ["maybe", "\"yes\"", "1", "[true]"] {
            let result: Result<NativeSessionResume, _> = serde_yaml_ng::from_str(bad);
            assert!(result.is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn fallback_table() {
        use NextStep::*;
        use RestoreMethod::*;
        let keep = |why| KeepTokenAndFail { why };
        let to_new = |why| FallBackToNew { why };
        #[rustfmt::skip]
        let rows = [
            // §3 restore: resume answers -32601 and loadSession advertised → load same id.
            (Resume, C::MethodNotFound, BOTH, TryLoad),
            // -32601 otherwise → session/new.
            (Resume, C::MethodNotFound, RESUME, to_new(FreshReason::MethodNotFound)),
            (Load, C::MethodNotFound, BOTH, to_new(FreshReason::MethodNotFound)),
            (Load, C::MethodNotFound, LOAD, to_new(FreshReason::MethodNotFound)),
            // -32002 resource-not-found → session/new, from either method.
            (Resume, C::UnknownSession, BOTH, to_new(FreshReason::UnknownSession)),
            (Load, C::UnknownSession, LOAD, to_new(FreshReason::UnknownSession)),
            // Transport, auth, cancellation, timeouts, inconclusive → keep the token, fail loudly.
            (Resume, C::AuthRequired, BOTH, keep(C::AuthRequired)),
            (Resume, C::Cancelled, BOTH, keep(C::Cancelled)),
            (Resume, C::InvalidParams, BOTH, keep(C::InvalidParams)),
            (Resume, C::Internal, BOTH, keep(C::Internal)),
            (Resume, C::Transport, BOTH, keep(C::Transport)),
            (Resume, C::Timeout, BOTH, keep(C::Timeout)),
            (Resume, C::Malformed, BOTH, keep(C::Malformed)),
            (Resume, C::Other(-32099), BOTH, keep(C::Other(-32099))),
            // An agent cut off for breaking a bound proved nothing about the session.
            (Load, C::AgentProtocolLimit, LOAD, keep(C::AgentProtocolLimit)),
            (Resume, C::AgentProtocolLimit, BOTH, keep(C::AgentProtocolLimit)),
            (Load, C::Internal, LOAD, keep(C::Internal)),
            (Load, C::Transport, LOAD, keep(C::Transport)),
            // A failed session/new has nothing to fall back to.
            (New, C::MethodNotFound, BOTH, keep(C::MethodNotFound)),
            (New, C::UnknownSession, NONE, keep(C::UnknownSession)),
            (New, C::Timeout, NONE, keep(C::Timeout)),
        ];
        for (tried, class, caps, expected) in rows {
            let step = next_step_after_failure(tried, &class, caps);
            assert_eq!(step, expected, "{tried:?} {class:?} {caps:?}");
        }
    }

    #[test]
    fn only_conclusive_classes_ever_reach_session_new() {
        // §3 restore: "only an explicitly unsupported method or an explicitly unknown session
        // may fall back to session/new" — checked over every class, method and capability set.
        let classes = [
            C::MethodNotFound,
            C::UnknownSession,
            C::AuthRequired,
            C::Cancelled,
            C::InvalidParams,
            C::Internal,
            C::Transport,
            C::Timeout,
            C::Malformed,
            C::AgentProtocolLimit,
            C::Other(7),
        ];
        for tried in [
            RestoreMethod::Resume,
            RestoreMethod::Load,
            RestoreMethod::New,
        ] {
            for class in classes {
                for caps in [NONE, LOAD, RESUME, BOTH] {
                    let step = next_step_after_failure(tried, &class, caps);
                    if matches!(step, NextStep::FallBackToNew { .. } | NextStep::TryLoad) {
                        assert!(class.allows_fresh_start(), "{tried:?} {class:?} {caps:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn method_and_span_names() {
        let rows = [
            (
                RestoreMethod::Resume,
                "session/resume",
                "acp.session.resume",
            ),
            (RestoreMethod::Load, "session/load", "acp.session.load"),
            (RestoreMethod::New, "session/new", "acp.session.new"),
        ];
        for (method, name, span) in rows {
            assert_eq!((method.method_name(), method.span_name()), (name, span));
        }
        assert_eq!(RestorePlan::Load("x".into()).method(), RestoreMethod::Load);
    }
}
