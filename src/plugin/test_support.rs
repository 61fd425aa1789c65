//! Test helpers shared by the plugin's test modules (`status`, `resume`, `prompt`): a condition
//! as JSON, a status with a request in flight, an evaluation.

use serde_json::json;

use crate::api::{ResumeReason, SessionState, TaskSessionStatus};
use crate::resume::ResumeEvaluation;

/// A status condition as the API server returns it.
pub fn cond(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// A status in `state`, with `active` as the request in flight.
pub fn st(state: SessionState, active: Option<&str>) -> TaskSessionStatus {
    TaskSessionStatus {
        state,
        active_resume_request: active.map(str::to_string),
        ..Default::default()
    }
}

pub fn eval(needs: bool, resumable: bool, reason: ResumeReason) -> ResumeEvaluation {
    ResumeEvaluation {
        needs_resume: needs,
        is_resumable: resumable,
        reason,
    }
}
