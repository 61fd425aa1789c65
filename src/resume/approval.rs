//! Approvals, the operator's half: what an answer annotation asks for ([`answer_step`]), and what
//! the journal's permission news and a lost agent's waiting requests say in Events
//! ([`permission_notes`], [`gone_note`]). agentctl's half (the policy, the held requests) is in
//! `agentctl::hub::permission`.

use crate::api::bounds::cap;
use crate::api::{PendingPermission, PermissionOutcome, parse_answer};

use super::transition::Note;
use super::{AgentView, PermissionResolution};

/// The longest answer annotation value remembered as handled.
pub const HANDLED_ANSWER_MAX: usize = 64;

/// What to do with the answer annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerStep {
    /// Relay the answer to agentctl (one exec of `agentctl answer`).
    Relay { id: String, option_kind: String },
    /// Refuse it with this message (a Warning Event); it is remembered as handled.
    Refuse { message: String },
}

/// The value remembered as handled for `annotation`.
pub fn handled_value(annotation: &str) -> String {
    cap(annotation, HANDLED_ANSWER_MAX).into_owned()
}

/// The step for `annotation` (the answer annotation's value), `None` when there is nothing to
/// do: no annotation, or the one handled last (a re-applied or stale answer is a no-op).
/// `pending` is what waits now; `running` whether the session's agent runs.
pub fn answer_step(
    annotation: Option<&str>,
    handled: Option<&str>,
    pending: &[PendingPermission],
    running: bool,
) -> Option<AnswerStep> {
    let annotation = annotation.filter(|a| !a.trim().is_empty())?;
    if handled == Some(handled_value(annotation).as_str()) {
        return None;
    }
    let refuse = |message: String| Some(AnswerStep::Refuse { message });
    let (id, option_kind) = match parse_answer(annotation) {
        Ok(answer) => answer,
        Err(error) => return refuse(format!("permission answer refused: {error}")),
    };
    let Some(request) = pending.iter().find(|p| p.id == id).filter(|_| running) else {
        return refuse(format!(
            "permission answer {id}={option_kind} refused: no request {id} waits (it was answered already, timed out, or went with the agent); waiting now: {}",
            ids(pending)
        ));
    };
    if !request.options.iter().any(|o| o.kind == option_kind) {
        let offered: Vec<&str> = request.options.iter().map(|o| o.kind.as_str()).collect();
        return refuse(format!(
            "permission answer {id}={option_kind} refused: request {id} offers no {option_kind} option (it offers: {})",
            if offered.is_empty() {
                "nothing".to_string()
            } else {
                offered.join(", ")
            }
        ));
    }
    Some(AnswerStep::Relay { id, option_kind })
}

fn ids(pending: &[PendingPermission]) -> String {
    if pending.is_empty() {
        return "none".into();
    }
    pending
        .iter()
        .map(|p| p.id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Events of the journal's news: one for each request that now waits and was not waiting
/// `before`, one for each request that ended. `session` names the TaskSession (for the answer
/// the note suggests).
pub fn permission_notes(
    before: &[PendingPermission],
    after: &AgentView,
    session: &str,
) -> Vec<Note> {
    let mut notes: Vec<Note> = after
        .pending_permissions
        .iter()
        .filter(|p| !before.iter().any(|b| b.id == p.id))
        .map(|p| Note {
            warning: false,
            reason: "PermissionRequested",
            action: "Approve",
            message: format!(
                "the agent asks to {} \"{}\" (request {}); answer with kubectl kandev approve {session} {} or kubectl kandev deny {session} {}",
                p.tool_kind,
                cap(&p.title, 200),
                p.id,
                p.id,
                p.id
            ),
        })
        .collect();
    notes.extend(after.resolutions.iter().map(resolution_note));
    notes
}

fn resolution_note(r: &PermissionResolution) -> Note {
    let (warning, reason) = match r.outcome {
        PermissionOutcome::AllowedByPolicy => (false, "PermissionAllowed"),
        PermissionOutcome::DeniedByPolicy => (false, "PermissionDenied"),
        PermissionOutcome::Approved => (false, "PermissionApproved"),
        PermissionOutcome::Rejected => (false, "PermissionRejected"),
        PermissionOutcome::TimedOut => (true, "PermissionTimedOut"),
        PermissionOutcome::Gone => (true, "PermissionGone"),
        PermissionOutcome::Overflow => (true, "PermissionOverflow"),
    };
    Note {
        warning,
        reason,
        action: "Approve",
        message: format!(
            "{} request {}: {} ({})",
            r.tool_kind,
            r.request_id,
            r.outcome.as_str(),
            r.reason
        ),
    }
}

/// The Event for requests that waited when the agent's pod went (`None`: none waited).
pub fn gone_note(pending: &[PendingPermission], why: &str) -> Option<Note> {
    (!pending.is_empty()).then(|| Note {
        warning: true,
        reason: "PermissionGone",
        action: "Approve",
        message: format!(
            "{} permission request(s) went with the agent ({why}): {}; the agent asks again after a resume if it still needs them",
            pending.len(),
            pending
                .iter()
                .map(|p| format!("{} {} \"{}\"", p.id, p.tool_kind, cap(&p.title, 80)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PermissionOption, ToolKind};

    fn request(id: &str) -> PendingPermission {
        PendingPermission {
            id: id.into(),
            tool_kind: ToolKind::Execute,
            title: "cargo test".into(),
            summary: String::new(),
            options: ["allow_once", "reject_once"]
                .map(|kind| PermissionOption {
                    id: kind.replace('_', "-"),
                    kind: kind.into(),
                })
                .to_vec(),
            requested_at: "T".into(),
        }
    }

    #[test]
    fn an_answer_is_relayed_once_and_only_for_what_waits() {
        let pending = vec![request("p1"), request("p2")];
        let relay = |id: &str, kind: &str| {
            Some(AnswerStep::Relay {
                id: id.into(),
                option_kind: kind.into(),
            })
        };
        let refused = |step: Option<AnswerStep>, words: &str| match step {
            Some(AnswerStep::Refuse { message }) => assert!(message.contains(words), "{message}"),
            other => panic!("expected a refusal with {words:?}, got {other:?}"),
        };
        assert_eq!(answer_step(None, None, &pending, true), None);
        assert_eq!(answer_step(Some(""), None, &pending, true), None);
        assert_eq!(
            answer_step(Some("p1=allow_once"), None, &pending, true),
            relay("p1", "allow_once")
        );
        assert_eq!(
            answer_step(
                Some("p2=reject_once"),
                Some("p1=allow_once"),
                &pending,
                true
            ),
            relay("p2", "reject_once")
        );
        // Handled already: a re-applied answer is a no-op, even once the request is gone.
        assert_eq!(
            answer_step(Some("p1=allow_once"), Some("p1=allow_once"), &[], true),
            None
        );
        refused(
            answer_step(Some("p9=allow_once"), None, &pending, true),
            "no request p9 waits",
        );
        refused(
            answer_step(Some("p1=allow_once"), None, &pending, false),
            "no request p1 waits",
        );
        refused(
            answer_step(Some("p1=allow_always"), None, &pending, true),
            "offers no allow_always option (it offers: allow_once, reject_once)",
        );
        refused(
            answer_step(Some("yes please"), None, &pending, true),
            "<request id>=<option kind>",
        );
        // A long hostile value is remembered capped, and then it is handled.
        let long = format!("p1={}", "x".repeat(500));
        refused(answer_step(Some(&long), None, &pending, true), "refused");
        assert_eq!(
            answer_step(Some(&long), Some(&handled_value(&long)), &pending, true),
            None
        );
    }

    #[test]
    fn news_becomes_one_event_per_new_request_and_per_end() {
        let before = vec![request("p1")];
        let after = AgentView {
            pending_permissions: vec![request("p1"), request("p2")],
            resolutions: vec![PermissionResolution {
                request_id: "p0".into(),
                tool_kind: ToolKind::Edit,
                outcome: PermissionOutcome::TimedOut,
                reason: "nobody answered within askTimeout (10s)".into(),
            }],
            ..AgentView::default()
        };
        let notes = permission_notes(&before, &after, "demo");
        let said: Vec<(bool, &str)> = notes.iter().map(|n| (n.warning, n.reason)).collect();
        assert_eq!(
            said,
            [(false, "PermissionRequested"), (true, "PermissionTimedOut")]
        );
        assert!(
            notes[0].message.contains("kubectl kandev approve demo p2"),
            "{}",
            notes[0].message
        );
        assert!(
            notes[1].message.contains("edit request p0: timedOut"),
            "{}",
            notes[1].message
        );
        assert_eq!(gone_note(&[], "pod lost"), None);
        let gone = gone_note(&before, "the pod was lost").expect("a note");
        assert!(
            gone.warning && gone.message.contains("p1 execute \"cargo test\""),
            "{}",
            gone.message
        );
    }
}
