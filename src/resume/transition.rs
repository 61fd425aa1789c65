//! What one reconcile decided, before anything is done: the status to write, the one next
//! action, the Event, the metric and when to look again. The pure `decide` functions return it;
//! the reconciler only applies it.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::TaskSessionStatus;
use crate::api::conditions::{self, Want};

/// Merges `wanted` into the conditions of `status` at `now` and stamps `observedGeneration`:
/// the last step of a decision before it returns its [`Transition`].
pub fn settle(
    status: &mut TaskSessionStatus,
    wanted: &[Want],
    generation: Option<i64>,
    now: Timestamp,
) {
    status.conditions = conditions::merge(&status.conditions, wanted, generation, now);
    status.observed_generation = generation;
}

/// The outcome of a pure decision over [`super::SessionObjects`].
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The whole status as it should be, conditions merged and `observedGeneration` stamped.
    pub status: TaskSessionStatus,
    /// Whether `status` differs from what was loaded (else nothing is written).
    pub write: bool,
    /// The one effect besides the status write.
    pub action: Option<NextAction>,
    pub event: Option<Note>,
    pub metric: Option<Metric>,
    pub requeue: Requeue,
}

/// The one effect of a transition besides its status write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextAction {
    /// Read (and, while the agent works, follow) the event journal of this running pod.
    Follow { pod: String },
    /// The agent of this running pod is idle after its launch: the journal so far counts as
    /// read (and the client's prompt nudge as handled), so that the next pass reads nothing.
    CaughtUp { pod: String },
    /// Read this running pod's journal once, with this nudge (a session that ends: whether a
    /// prompt runs).
    ReadJournal { pod: String, nudge: String },
    /// The session is over: stop following its pods.
    StopFollowing,
    /// ExecutorRunning becomes `Lost`; `resumable` when it holds a token. Written before the
    /// session's status, so that the status never claims more than the executor says.
    MarkExecutorLost { resumable: bool },
    /// Delete this pod (an attempt that a newer request replaced), after the status that
    /// explains it is written.
    DeletePod { pod: String },
    /// Delete this running pod that counts as lost ([`super::LossCause`]), after the status
    /// that explains it is written; `force`: with grace period 0.
    DeleteLostPod { pod: String, force: bool },
}

/// A Kubernetes Event about the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

impl Note {
    pub fn normal(reason: &'static str, action: &'static str, message: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason,
            action,
            message: message.into(),
        }
    }

    pub fn warning(reason: &'static str, action: &'static str, message: impl Into<String>) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, action, message)
        }
    }
}

/// A counter the transition moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// An agent pod was found lost.
    AgentLost,
    /// A resume request was handled, with this outcome.
    ResumeHandled(ResumeOutcome),
}

/// How a resume request (the `kandev.dev/resume-requested-at` annotation) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeOutcome {
    /// The agent's own session came back (`session/resume` or `session/load`).
    Restored,
    /// The agent runs again in a new session (no token, a fresh start was asked for, or the
    /// agent rejected the token).
    Fresh,
    /// The restore or the launch failed.
    Failed,
    /// The rules refused the request (terminal state).
    Refused,
    /// The agent was already running: handled without a launch.
    AlreadyRunning,
    /// A newer request replaced it while it was being handled.
    Superseded,
    /// It arrived while a launch for the same kind of start was progressing, and is answered
    /// with that launch's outcome.
    Joined,
}

/// When the session is reconciled again, besides watch events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// After the operator's periodic resync.
    Resync,
    After(Duration),
    /// Only when something changes.
    AwaitChange,
}
