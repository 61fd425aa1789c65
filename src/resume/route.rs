//! Which part of the pipeline a pass runs, from the session's spec and status: its end, the
//! resume-request handshake, the launch, or the steady state.

use crate::api::{SessionEnd, SessionState, TaskSessionStatus};

/// `spec.end`, while the session has not ended yet (a `FAILED` session still ends: its
/// executor is stopped and its workspace handled as `workspace.retention` says).
pub fn ending(end: Option<SessionEnd>, status: &TaskSessionStatus) -> Option<SessionEnd> {
    end.filter(|_| {
        !matches!(
            status.state,
            SessionState::Completed | SessionState::Cancelled
        )
    })
}

/// A latched request, a session never launched, or a launch that an operator restart
/// interrupted (`STARTING` is persisted before the pod is created).
pub fn launching(status: &TaskSessionStatus) -> bool {
    status.active_resume_request.is_some()
        || matches!(status.state, SessionState::Created | SessionState::Starting)
}

/// A new resume request may find the agent already running only while no request is latched
/// and the session has not ended: then the running pod's reachability decides
/// ([`super::running_request`]).
pub fn request_meets_running_pod(status: &TaskSessionStatus) -> bool {
    status.active_resume_request.is_none() && !status.state.is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionState as S;

    #[test]
    fn routes() {
        #[rustfmt::skip]
        let rows = [
            // (state, a latched request) → (ending with spec.end, launching, request meets running pod)
            (S::Created, false, (true, true, true)),
            (S::Starting, false, (true, true, true)),
            (S::Starting, true, (true, true, false)),
            (S::WaitingForInput, false, (true, false, true)),
            (S::WaitingForInput, true, (true, true, false)),
            (S::Running, false, (true, false, true)),
            (S::Failed, false, (true, false, false)),
            (S::Failed, true, (true, true, false)),
            (S::Completed, false, (false, false, false)),
            (S::Cancelled, false, (false, false, false)),
        ];
        for (state, latched, (ends, launches, meets)) in rows {
            let status = TaskSessionStatus {
                state,
                active_resume_request: latched.then(|| "r1".to_string()),
                ..Default::default()
            };
            let what = format!("{state:?} latched={latched}");
            assert_eq!(
                ending(Some(SessionEnd::Completed), &status).is_some(),
                ends,
                "{what}"
            );
            assert_eq!(ending(None, &status), None, "{what}");
            assert_eq!(launching(&status), launches, "{what}");
            assert_eq!(request_meets_running_pod(&status), meets, "{what}");
        }
    }
}
