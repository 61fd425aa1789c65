//! kstatus-compatible conditions (DESIGN §2): `Ready`, `Reconciling`, `Stalled`, plus
//! `AgentRunning`, `NeedsResume` and `Resumed`. Pure helpers; the reconciler decides the values.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::bounds::{MESSAGE_MAX, cap};

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
pub const AGENT_RUNNING: &str = "AgentRunning";
pub const NEEDS_RESUME: &str = "NeedsResume";
pub const RESUMED: &str = "Resumed";
/// Whether the task description of the session's first launch reached the agent: True once
/// sent, False with the reason when it could not be (it is not sent again). Absent while none
/// was due.
pub const TASK_SENT: &str = "TaskSent";
/// True while a permission request of the agent waits for a person's answer
/// (`status.pendingPermissions`); False once none waits. Absent on a session that never had one.
pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
/// Whether the agent runs with `spec.sessionConfig`: True (`Applied`) when the last launch set
/// everything it asks for, False (`NotOffered`) naming what the agent does not offer. Only on
/// sessions with `spec.sessionConfig`.
pub const SESSION_CONFIGURED: &str = "SessionConfigured";
/// False (`PendingRestart`) while the running agent pod was created from other launch-time
/// fields (image, resources, credentials, …) than the spec has now: the change waits for the
/// next launch (`kubectl kandev restart`). Absent otherwise: no agent runs (the next launch takes
/// the spec as it is), or it runs the current spec ([`super::launch_spec`]).
pub const SPEC_APPLIED: &str = "SpecApplied";
/// True while the session is suspended after being idle ([`super::SUSPENDED`]).
pub const SUSPENDED: &str = super::SUSPENDED;

/// One condition the reconciler wants, before timestamps are settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
    /// The condition is not to be there at all ([`Want::absent`]).
    pub absent: bool,
}

impl Want {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            // A message may quote an agent: bounded like everything it chooses.
            message: cap(&message.into(), MESSAGE_MAX).into_owned(),
            absent: false,
        }
    }

    /// No condition of this type: [`merge`] removes it. `Ready` is absent while no agent runs
    /// and nothing is in progress (the session waits for a person, or has ended), so that
    /// kstatus reads the session as Current rather than in progress forever.
    pub fn absent(type_: &'static str) -> Self {
        Self {
            type_,
            status: false,
            reason: String::new(),
            message: String::new(),
            absent: true,
        }
    }
}

/// Merges wanted conditions into the existing list: `lastTransitionTime` only moves when the
/// status flips (kstatus reads it as "since when"), conditions not mentioned are kept, an
/// absent one is removed, and `observedGeneration` is stamped on every wanted one.
pub fn merge(
    existing: &[Condition],
    wanted: &[Want],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing.to_vec();
    for want in wanted {
        if want.absent {
            out.retain(|c| c.type_ != want.type_);
            continue;
        }
        let status = if want.status { "True" } else { "False" }.to_string();
        let reason = if want.reason.is_empty() {
            "Unknown".to_string()
        } else {
            want.reason.clone()
        };
        match out.iter_mut().find(|c| c.type_ == want.type_) {
            Some(current) => {
                if current.status != status {
                    current.last_transition_time = Time(now);
                }
                current.status = status;
                current.reason = reason;
                current.message = want.message.clone();
                current.observed_generation = generation;
            }
            None => out.push(Condition {
                type_: want.type_.to_string(),
                status,
                reason,
                message: want.message.clone(),
                observed_generation: generation,
                last_transition_time: Time(now),
            }),
        }
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// A condition reason from a snake_case word (`agent_not_running` → `AgentNotRunning`).
pub fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The condition of the given type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The condition of the given type, if present and True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid timestamp")
    }

    /// A message may quote an agent: it is kept within MESSAGE_MAX, the cut marked.
    #[test]
    fn messages_are_bounded() {
        let long = "x".repeat(1_000_000);
        let merged = merge(&[], &[Want::new(READY, false, "R", &long)], None, at(1));
        let message = &merged[0].message;
        assert!(message.len() <= MESSAGE_MAX, "{}", message.len());
        assert!(message.ends_with(" bytes]"), "{message}");
    }

    #[test]
    fn transition_time_moves_only_on_a_flip() {
        let first = merge(
            &[],
            &[Want::new(READY, false, "Starting", "pod pending")],
            Some(1),
            at(10),
        );
        assert_eq!(first[0].last_transition_time, Time(at(10)));
        let same = merge(
            &first,
            &[Want::new(READY, false, "Restoring", "acp restore")],
            Some(2),
            at(20),
        );
        assert_eq!(
            same[0].last_transition_time,
            Time(at(10)),
            "no flip, time kept"
        );
        assert_eq!(
            (same[0].reason.as_str(), same[0].observed_generation),
            ("Restoring", Some(2))
        );
        let flipped = merge(
            &same,
            &[Want::new(READY, true, "WaitingForInput", "")],
            Some(2),
            at(30),
        );
        assert_eq!(flipped[0].last_transition_time, Time(at(30)));
        assert!(is_true(&flipped, READY));
    }

    #[test]
    fn unmentioned_conditions_are_kept_and_order_is_stable() {
        let a = merge(
            &[],
            &[Want::new(RESUMED, true, "Restored", "")],
            None,
            at(1),
        );
        let b = merge(
            &a,
            &[Want::new(AGENT_RUNNING, true, "PodRunning", "")],
            None,
            at(2),
        );
        let types: Vec<&str> = b.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [AGENT_RUNNING, RESUMED]);
    }

    #[test]
    fn condition_reasons_are_camel_case() {
        for (snake, camel_case) in [
            ("auth_required", "AuthRequired"),
            ("agent_not_running", "AgentNotRunning"),
            ("waiting_for_input", "WaitingForInput"),
            ("timeout", "Timeout"),
            ("agent_protocol_limit", "AgentProtocolLimit"),
        ] {
            assert_eq!(camel(snake), camel_case);
        }
    }
}
