//! ACP restore method selection and the fallback after a failed attempt (DESIGN §3 "ACP restore
//! selection"). Pure; the ACP client executes the plan and reports failures back here.

use super::classify::RestoreErrorClass;

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
            Self::Resume => "session/resume",
            Self::Load => "session/load",
            Self::New => "session/new",
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
    /// The agent profile says the agent cannot restore sessions (`nativeSessionResume: false`).
    ProfileHasNoNativeResume,
    /// The profile expects native resume, but this agent advertised neither
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

/// Chooses the first restore step (DESIGN §3):
/// - native resume + token + `sessionCapabilities.resume` → `session/resume` (no replay);
/// - native resume + token, no resume but `loadSession` → `session/load`;
/// - native resume + token, neither advertised → `session/new`, reason
///   [`FreshReason::RestoreUnsupportedByAgent`] (explicitly unsupported);
/// - otherwise → `session/new` with the reason.
///
/// An empty or whitespace-only token counts as no token.
pub fn select_restore_method(
    capabilities: AgentRestoreCapabilities,
    profile_native_session_resume: bool,
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
    if !profile_native_session_resume {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agent_rejects_a_token() {
        for (why, rejected) in [
            (FreshReason::NoResumeToken, false),
            (FreshReason::ProfileHasNoNativeResume, false),
            (FreshReason::RestoreUnsupportedByAgent, true),
            (FreshReason::MethodNotFound, true),
            (FreshReason::UnknownSession, true),
        ] {
            assert_eq!(why.agent_rejected_token(), rejected, "{why}");
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
        let resume = || RestorePlan::Resume("tok".into());
        let load = || RestorePlan::Load("tok".into());
        #[rustfmt::skip]
        let rows = [
            // §3 restore: native resume + token + sessionCapabilities.resume → session/resume.
            (BOTH, true, Some("tok"), resume()),
            (RESUME, true, Some("tok"), resume()),
            // §3 restore: agent does not advertise resume → session/load.
            (LOAD, true, Some("tok"), load()),
            // Advertises neither: explicitly unsupported → session/new saying so.
            (NONE, true, Some("tok"), new(FreshReason::RestoreUnsupportedByAgent)),
            // §3 restore "otherwise → session/new": no native resume in the profile…
            (BOTH, false, Some("tok"), new(FreshReason::ProfileHasNoNativeResume)),
            (NONE, false, Some("tok"), new(FreshReason::ProfileHasNoNativeResume)),
            // …or no token (empty and blank tokens are no token).
            (BOTH, true, None, new(FreshReason::NoResumeToken)),
            (BOTH, true, Some(""), new(FreshReason::NoResumeToken)),
            (BOTH, true, Some("  "), new(FreshReason::NoResumeToken)),
            (NONE, false, None, new(FreshReason::NoResumeToken)),
        ];
        for (caps, native, token, expected) in rows {
            let plan = select_restore_method(caps, native, token);
            assert_eq!(plan, expected, "{caps:?} native={native} token={token:?}");
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
