//! What a launch that ends with a running agent records in its ExecutorRunning status, besides
//! the pod and what agentctl reported: the activity the event follower's first line will
//! report (so that line changes nothing), and what belongs to the session the token names.

use crate::api::AgentActivity;
use crate::api::bounds::NUDGE_MAX;

/// What the reconciler knows when the launch ended with a running agent.
#[derive(Clone, Copy, Debug)]
pub struct RecordFacts<'a> {
    /// The agent's session id after the restore: the resume token to save.
    pub token: Option<&'a str>,
    /// The token saved before the launch.
    pub saved: Option<&'a str>,
    /// The launch started a prompt (the task description of a fresh session).
    pub prompt_started: bool,
    /// The client's nudge (`kandev.dev/prompted-at`), if any.
    pub nudge: Option<&'a str>,
}

/// The fields a launch's record sets from its facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorRecord {
    pub activity: AgentActivity,
    pub resumable: bool,
    /// `lastMessageUUID` belongs to the session the token names: a new session (a fresh start)
    /// has none until agentctl reports one.
    pub forget_last_message: bool,
    /// A launch that leaves the agent idle is a catch-up: the client's nudge so far is handled,
    /// and a restarted operator does not read the journal for it.
    pub handled_nudge: Option<String>,
}

pub fn executor_record(facts: &RecordFacts) -> ExecutorRecord {
    ExecutorRecord {
        activity: if facts.prompt_started {
            AgentActivity::Working
        } else {
            AgentActivity::Idle
        },
        resumable: facts.token.is_some(),
        forget_last_message: facts.token != facts.saved,
        handled_nudge: facts
            .nudge
            .filter(|nudge| !facts.prompt_started && nudge.len() <= NUDGE_MAX)
            .map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AgentActivity::{Idle, Working};

    #[test]
    fn records() {
        let long = "n".repeat(NUDGE_MAX + 1);
        #[rustfmt::skip]
        let rows = [
            // (name, token, saved, prompt started, nudge) → (activity, resumable, forget the last message, handled nudge)
            ("restored, idle", Some("s1"), Some("s1"), false, None::<&str>, (Idle, true, false, None::<&str>)),
            ("restored, a nudge caught up", Some("s1"), Some("s1"), false, Some("n1"), (Idle, true, false, Some("n1"))),
            ("fresh with the task: working, the nudge is the follower's", Some("s2"), Some("s1"), true, Some("n1"), (Working, true, true, None)),
            ("fresh, first launch", Some("s1"), None, false, None, (Idle, true, true, None)),
            ("no session id", None, Some("s1"), false, None, (Idle, false, true, None)),
            ("a nudge over its bound is not recorded", Some("s1"), Some("s1"), false, Some(long.as_str()), (Idle, true, false, None)),
        ];
        for (name, token, saved, prompt_started, nudge, (activity, resumable, forget, handled)) in
            rows
        {
            let facts = RecordFacts {
                token,
                saved,
                prompt_started,
                nudge,
            };
            let want = ExecutorRecord {
                activity,
                resumable,
                forget_last_message: forget,
                handled_nudge: handled.map(str::to_string),
            };
            assert_eq!(executor_record(&facts), want, "{name}");
        }
    }
}
