//! Building the resume request (DESIGN §3 "Resume execution", step 2). Pure.
//!
//! The request is built before the agentctl pod exists, so it cannot know yet whether history
//! exists on the workspace volume; the initial-prompt decision that needs it is deferred to
//! [`ResumeRequest::initial_prompt_for_fresh_agent`].

use super::prompt::{InitialPrompt, dispatch_initial_prompt};
use crate::api::{SessionState, TaskState};

/// Inputs of [`build_resume_request`], read from TaskSession, ExecutorRunning and the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeRequestFacts<'a> {
    /// The session state when the agent was lost (before the resume persists `STARTING`).
    pub state_at_loss: SessionState,
    /// `ExecutorRunning.status.resumeToken`; empty or blank counts as absent.
    pub resume_token: Option<&'a str>,
    /// `TaskSession.spec.taskDescription`.
    pub task_description: &'a str,
    /// The user explicitly asked for a fresh start (`kubectl kandev resume --fresh`): the saved
    /// token is ignored (not deleted) and the agent boots fresh.
    pub fresh: bool,
    /// The agent profile's `historyContextInjection`.
    pub profile_history_injection: bool,
}

/// The three ways back (DESIGN §3, cases A, B, C).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResumeAction {
    /// A: restore that ACP session; no auto-prompt (the agent already has the conversation).
    RestoreSession { resume_token: String },
    /// B: no token and the session was waiting for the user: boot idle, no auto-prompt.
    BootIdle,
    /// C: boot fresh and send the task description (through the initial prompt dispatch).
    SendTaskDescription { task_description: String },
}

/// What a resume will do, and where the session goes when it succeeds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeRequest {
    pub action: ResumeAction,
    /// The state to return to after success (DESIGN §3 step 5 "back to the previous state"),
    /// persisted while the session is `STARTING`:
    /// - `RUNNING` only when a prompt is re-sent (case C with a non-empty description): the
    ///   agent is then really working on a turn;
    /// - `WAITING_FOR_INPUT` otherwise. This covers a session that was `RUNNING` or `STARTING`
    ///   at the time of loss and is restored (A) or booted idle: the in-flight turn or boot
    ///   died with the pod and the new agent idles until prompted, so claiming `RUNNING` (or
    ///   returning to `STARTING`, which nothing would ever leave) would be false.
    pub previous_state: SessionState,
    /// The user asked for a fresh start.
    pub fresh: bool,
    /// If this resume ends with a fresh agent (B, C, or A whose token was rejected), wrap its
    /// first prompt once in the resume context. True only where the profile has
    /// `historyContextInjection`; a restored session (A succeeding) never needs it.
    pub history_injection: bool,
}

impl ResumeRequest {
    /// The task column that goes with [`Self::previous_state`] (`WAITING_FOR_INPUT` → `REVIEW`).
    pub fn previous_task_state(&self) -> TaskState {
        TaskState::of_agent_in(self.previous_state)
    }

    /// The initial prompt dispatch once a fresh agent is up (`session/new`) and the caller
    /// knows whether history exists. Case A only reaches this when its token was rejected and
    /// the restore fell back to `session/new`; DESIGN §3 step 5 then lands the session in
    /// `WAITING_FOR_INPUT` without an auto-prompt, so it dispatches like case B.
    pub fn initial_prompt_for_fresh_agent(&self, history_exists: bool) -> InitialPrompt {
        let description = match &self.action {
            ResumeAction::SendTaskDescription { task_description } => task_description.as_str(),
            ResumeAction::RestoreSession { .. } | ResumeAction::BootIdle => "",
        };
        dispatch_initial_prompt(description, self.history_injection, history_exists)
    }
}

/// DESIGN §3 step 2: **A** token present → restore it, no auto-prompt; **B** no token and the
/// state was `WAITING_FOR_INPUT` → boot idle; **C** otherwise → send `taskDescription`.
/// An explicit fresh start behaves as if there were no token.
///
/// Terminal states are not refused here: step 1 of the flow rejects them before building, and
/// the one terminal session that may be offered a resume (FAILED, resumable, with a token)
/// takes case A.
pub fn build_resume_request(facts: &ResumeRequestFacts<'_>) -> ResumeRequest {
    let usable_token = facts
        .resume_token
        .map(str::trim)
        .filter(|token| !token.is_empty() && !facts.fresh);
    let action = match usable_token {
        Some(token) => ResumeAction::RestoreSession {
            resume_token: token.to_owned(),
        },
        None if facts.state_at_loss == SessionState::WaitingForInput => ResumeAction::BootIdle,
        None => ResumeAction::SendTaskDescription {
            task_description: facts.task_description.to_owned(),
        },
    };
    let sends_prompt = match &action {
        ResumeAction::SendTaskDescription { task_description } => {
            !task_description.trim().is_empty()
        }
        ResumeAction::RestoreSession { .. } | ResumeAction::BootIdle => false,
    };
    ResumeRequest {
        action,
        previous_state: if sends_prompt {
            SessionState::Running
        } else {
            SessionState::WaitingForInput
        },
        fresh: facts.fresh,
        history_injection: facts.profile_history_injection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionState as S;
    use pretty_assertions::assert_eq;

    fn restore(token: &str) -> ResumeAction {
        ResumeAction::RestoreSession {
            resume_token: token.to_owned(),
        }
    }

    fn send(text: &str) -> ResumeAction {
        ResumeAction::SendTaskDescription {
            task_description: text.to_owned(),
        }
    }

    #[test]
    fn cases_a_b_c() {
        const TASK: &str = "fix the bug";
        // (state at loss, token, description, fresh) → (action, previous_state)
        #[rustfmt::skip]
        let rows = [
            // §3 case A: token present → restore that session, no auto-prompt.
            (S::WaitingForInput, Some("tok"), TASK, false, restore("tok"), S::WaitingForInput),
            (S::Running, Some("tok"), TASK, false, restore("tok"), S::WaitingForInput),
            (S::Starting, Some("tok"), TASK, false, restore("tok"), S::WaitingForInput),
            (S::Failed, Some("tok"), TASK, false, restore("tok"), S::WaitingForInput),
            (S::Running, Some(" tok\n"), TASK, false, restore("tok"), S::WaitingForInput),
            // §3 case B: no token and the state was WAITING_FOR_INPUT → boot idle.
            (S::WaitingForInput, None, TASK, false, ResumeAction::BootIdle, S::WaitingForInput),
            (S::WaitingForInput, Some(""), TASK, false, ResumeAction::BootIdle, S::WaitingForInput),
            // §3 case C: otherwise → send taskDescription.
            (S::Running, None, TASK, false, send(TASK), S::Running),
            (S::Starting, None, TASK, false, send(TASK), S::Running),
            (S::Running, Some("   "), TASK, false, send(TASK), S::Running),
            // Case C with an empty description boots idle through the dispatch: not RUNNING.
            (S::Running, None, "", false, send(""), S::WaitingForInput),
            (S::Starting, None, " \n", false, send(" \n"), S::WaitingForInput),
            // Explicit fresh start ignores the token: B or C as if there were none.
            (S::WaitingForInput, Some("tok"), TASK, true, ResumeAction::BootIdle, S::WaitingForInput),
            (S::Running, Some("tok"), TASK, true, send(TASK), S::Running),
            (S::Starting, Some("tok"), TASK, true, send(TASK), S::Running),
        ];
        for (state_at_loss, resume_token, task_description, fresh, action, previous) in rows {
            let facts = ResumeRequestFacts {
                state_at_loss,
                resume_token,
                task_description,
                fresh,
                profile_history_injection: true,
            };
            let request = build_resume_request(&facts);
            assert_eq!(request.action, action, "{facts:?}");
            assert_eq!(request.previous_state, previous, "{facts:?}");
            assert_eq!(request.fresh, fresh, "{facts:?}");
        }
    }

    #[test]
    fn previous_task_state_follows_previous_state() {
        // §3 step 5: back to WAITING_FOR_INPUT with task REVIEW; a re-sent prompt is IN_PROGRESS.
        let facts = |token| ResumeRequestFacts {
            state_at_loss: S::Running,
            resume_token: token,
            task_description: "task",
            fresh: false,
            profile_history_injection: false,
        };
        assert_eq!(
            build_resume_request(&facts(Some("t"))).previous_task_state(),
            TaskState::Review
        );
        assert_eq!(
            build_resume_request(&facts(None)).previous_task_state(),
            TaskState::InProgress
        );
    }

    #[test]
    fn fresh_agent_prompt_goes_through_the_dispatch() {
        use InitialPrompt::*;
        // (token, state, description, profile injection, history exists) → prompt
        #[rustfmt::skip]
        let rows = [
            // Case C: §3 dispatch 1 sends the description.
            (None, S::Running, "task", true, true, Send("task".into())),
            // Case C, empty description: §3 dispatch 2 / 3.
            (None, S::Running, "", true, true, BootIdleNeedsResumeContext),
            (None, S::Running, "", true, false, BootIdle),
            (None, S::Running, "", false, true, BootIdle),
            // Case B never auto-prompts, but marks the resume context where the profile allows.
            (None, S::WaitingForInput, "task", true, true, BootIdleNeedsResumeContext),
            (None, S::WaitingForInput, "task", false, true, BootIdle),
            // Case A whose token was rejected (§3 step 5): idle, no auto-prompt, context if allowed.
            (Some("tok"), S::Running, "task", true, true, BootIdleNeedsResumeContext),
            (Some("tok"), S::Running, "task", false, true, BootIdle),
        ];
        for (resume_token, state_at_loss, task_description, injection, history, expected) in rows {
            let facts = ResumeRequestFacts {
                state_at_loss,
                resume_token,
                task_description,
                fresh: false,
                profile_history_injection: injection,
            };
            let request = build_resume_request(&facts);
            assert_eq!(request.history_injection, injection, "{facts:?}");
            assert_eq!(
                request.initial_prompt_for_fresh_agent(history),
                expected,
                "{facts:?}"
            );
        }
    }
}
