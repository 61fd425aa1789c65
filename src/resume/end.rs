//! Ending a session (`spec.end`, "sessions that end"): the operator's next step, from what it
//! sees now. Pure; the reconciler gathers the facts and carries the step out, one per pass,
//! until nothing runs any more and the terminal state is written.

use std::time::Duration;

use super::PodLiveness;
use crate::api::SessionEnd;

/// What the reconciler knows while a session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndFacts {
    pub end: SessionEnd,
    /// The session's current agentctl pod.
    pub pod: PodLiveness,
    /// A prompt is running (ExecutorRunning `activity: Working`, read from the journal).
    pub working: bool,
    /// How long the session has been ending.
    pub ending_for: Duration,
    /// How long a `Completed` session lets a running prompt finish.
    pub grace: Duration,
}

/// The next step of ending a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndStep {
    /// Send ACP `session/cancel` for the running prompt, then look again.
    CancelPrompt,
    /// Let the running prompt finish; look again within this long.
    AwaitPrompt(Duration),
    /// Stop the agent: delete its pod (agentctl closes the agent's stdin, the history and the
    /// journal are on the volume already).
    StopPod,
    /// The pod is going: look again once it is gone.
    AwaitPodGone,
    /// Nothing runs: write COMPLETED or CANCELLED.
    Finish,
}

/// `Cancelled` cancels a running prompt at once; `Completed` lets it finish within the grace
/// period, then cancels it too. An idle or starting agent is stopped; nothing running means
/// the session is finished.
pub fn end_step(facts: &EndFacts) -> EndStep {
    match facts.pod {
        PodLiveness::Missing | PodLiveness::Failed => EndStep::Finish,
        PodLiveness::Terminating => EndStep::AwaitPodGone,
        PodLiveness::Pending => EndStep::StopPod,
        PodLiveness::Running if !facts.working => EndStep::StopPod,
        PodLiveness::Running => match facts.end {
            SessionEnd::Completed if facts.ending_for < facts.grace => {
                EndStep::AwaitPrompt(facts.grace - facts.ending_for)
            }
            SessionEnd::Completed | SessionEnd::Cancelled => EndStep::CancelPrompt,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EndStep as Step;
    use PodLiveness as Pod;
    use SessionEnd as End;

    #[test]
    fn end_steps() {
        let s = Duration::from_secs;
        #[rustfmt::skip]
        let rows = [
            // (end, pod, working, ending for) → step; grace is 60 s.
            (End::Completed, Pod::Running, true, s(0), Step::AwaitPrompt(s(60))),
            (End::Completed, Pod::Running, true, s(45), Step::AwaitPrompt(s(15))),
            (End::Completed, Pod::Running, true, s(60), Step::CancelPrompt),
            (End::Cancelled, Pod::Running, true, s(0), Step::CancelPrompt),
            (End::Completed, Pod::Running, false, s(0), Step::StopPod),
            (End::Cancelled, Pod::Running, false, s(0), Step::StopPod),
            (End::Cancelled, Pod::Pending, false, s(0), Step::StopPod),
            (End::Completed, Pod::Terminating, true, s(0), Step::AwaitPodGone),
            (End::Completed, Pod::Missing, true, s(0), Step::Finish),
            (End::Cancelled, Pod::Failed, false, s(0), Step::Finish),
        ];
        for (end, pod, working, ending_for, step) in rows {
            let facts = EndFacts {
                end,
                pod,
                working,
                ending_for,
                grace: s(60),
            };
            assert_eq!(end_step(&facts), step, "{facts:?}");
        }
    }
}
