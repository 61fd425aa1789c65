//! The state machines of DESIGN §2, shared by the CRD schema and the pure rules.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Lifecycle of one agent session.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SessionState {
    #[default]
    Created,
    Starting,
    Running,
    WaitingForInput,
    Completed,
    Failed,
    Cancelled,
}

impl SessionState {
    pub const ALL: [SessionState; 7] = [
        Self::Created,
        Self::Starting,
        Self::Running,
        Self::WaitingForInput,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// `FAILED | COMPLETED | CANCELLED`: these block a resume (DESIGN §3, evaluation rule 4).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// `WAITING_FOR_INPUT | STARTING | RUNNING`: a session that should have a live agent.
    pub fn is_active(self) -> bool {
        matches!(self, Self::WaitingForInput | Self::Starting | Self::Running)
    }

    /// The wire name, as in the CRD (`WAITING_FOR_INPUT`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "CREATED",
            Self::Starting => "STARTING",
            Self::Running => "RUNNING",
            Self::WaitingForInput => "WAITING_FOR_INPUT",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Mirror of the task's column on the board.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    #[default]
    Todo,
    InProgress,
    Review,
    Completed,
    Failed,
    Cancelled,
}

impl TaskState {
    /// The task column of a session whose agent is up (DESIGN §3 step 5): IN_PROGRESS while it
    /// works (`RUNNING`), REVIEW while it waits for input (any other state it returns to).
    pub fn of_agent_in(state: SessionState) -> Self {
        match state {
            SessionState::Running => Self::InProgress,
            _ => Self::Review,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Todo => "TODO",
            Self::InProgress => "IN_PROGRESS",
            Self::Review => "REVIEW",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a session needs (or cannot get) a resume; stored in `status.resumeReason`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ResumeReason {
    /// The agentctl pod is running and reachable: nothing to resume.
    AlreadyRunning,
    /// Active session with a resume token whose pod is missing or dead: restore that ACP session.
    AgentNotRunning,
    /// Active session without a token whose executor is gone: boot a fresh agent.
    AgentNotRunningFreshStart,
    /// FAILED session with a token and a resumable executor: may be offered a resume.
    FailedSessionResumable,
    /// COMPLETED, CANCELLED or FAILED (not resumable): resume is refused.
    TerminalState,
    /// The session never got an executor (CREATED, or no ExecutorRunning yet).
    NoExecutor,
    /// No longer written: a terminating pod now counts as lost (`agent_not_running`). Kept so
    /// that a status written by an earlier version still reads.
    AgentStopping,
    /// The agent was idle for `spec.idle.suspendAfter` and was stopped; its token and workspace
    /// are kept, and a resume restores the session like after a loss.
    Suspended,
}

impl ResumeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlreadyRunning => "already_running",
            Self::AgentNotRunning => "agent_not_running",
            Self::AgentNotRunningFreshStart => "agent_not_running_fresh_start",
            Self::FailedSessionResumable => "failed_session_resumable",
            Self::TerminalState => "terminal_state",
            Self::NoExecutor => "no_executor",
            Self::AgentStopping => "agent_stopping",
            Self::Suspended => "suspended",
        }
    }
}

impl std::fmt::Display for ResumeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_column_follows_the_agent() {
        for state in SessionState::ALL {
            let expected = if state == SessionState::Running {
                TaskState::InProgress
            } else {
                TaskState::Review
            };
            assert_eq!(TaskState::of_agent_in(state), expected, "{state:?}");
        }
    }
}
