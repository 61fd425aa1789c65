//! The restore orchestration (DESIGN §3 "ACP restore selection"): [`AcpClient::restore`] runs
//! `session/resume` → `session/load` → `session/new` as the pure rules in [`crate::resume`]
//! decide, traced as `acp.session.restore`, and builds the [`RestoreOutcome`].
//!
//! The typed calls it makes live in `client.rs`; what an error means and whether a token
//! survives are decided in `resume/`, never here.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use tracing::Instrument;

use crate::api::bounds::{MESSAGE_MAX, cap};
use crate::resume::{
    NativeSessionResume, NextStep, RestoreErrorClass, RestoreMethod, RestorePlan,
    classify_restore_error, next_step_after_failure, select_restore_method,
};

use super::AcpError;
use super::client::{AcpClient, AcpTimeouts};
use super::outcome::RestoreOutcome;

impl AcpClient {
    /// Restores the saved ACP session (DESIGN §3 "ACP restore selection"), traced as
    /// `acp.session.restore` with one child span per step.
    ///
    /// Runs `initialize` first if it has not succeeded yet. The method comes from
    /// [`select_restore_method`]; after a failure, [`classify_restore_error`] and
    /// [`next_step_after_failure`] decide between `session/load` of the same id, `session/new`
    /// (only when the token is proven useless) and failing with the token kept. A fresh start
    /// requested by the user ignores the token without deleting it.
    pub async fn restore(
        &mut self,
        token: Option<&str>,
        cwd: &Path,
        profile_native_resume: NativeSessionResume,
        fresh_requested: bool,
        timeouts: AcpTimeouts,
    ) -> RestoreOutcome {
        let saved = token.map(str::trim).filter(|token| !token.is_empty());
        let span = tracing::info_span!(
            "acp.session.restore",
            token = saved.unwrap_or(""),
            profile_native_resume = profile_native_resume.as_str(),
            fresh_requested,
            method = tracing::field::Empty,
            outcome = tracing::field::Empty,
            session_id = tracing::field::Empty,
        );
        let outcome = self
            .run_restore(saved, cwd, profile_native_resume, fresh_requested, timeouts)
            .instrument(span.clone())
            .await;
        span.record("method", outcome.method_name());
        span.record("outcome", tracing::field::debug(outcome.kind()));
        span.record("session_id", outcome.session_id().unwrap_or(""));
        match &outcome {
            RestoreOutcome::Failed { reason, .. } => {
                tracing::warn!(parent: &span, %reason, "restore failed")
            }
            other => tracing::info!(parent: &span, reason = %other.reason(), "restore done"),
        }
        outcome
    }

    async fn run_restore(
        &mut self,
        saved: Option<&str>,
        cwd: &Path,
        profile_native_resume: NativeSessionResume,
        fresh_requested: bool,
        timeouts: AcpTimeouts,
    ) -> RestoreOutcome {
        if let Some(failed) = self.initialized(saved, timeouts.initialize).await {
            return failed;
        }
        let capabilities = self.restore_capabilities();
        // One deadline for the whole restore: each step gets what the earlier ones left.
        let deadline = Instant::now() + timeouts.session;
        // The user's explicit fresh start ignores the token; it is not deleted (DESIGN §3).
        let candidate = if fresh_requested { None } else { saved };
        let mut step = select_restore_method(capabilities, profile_native_resume, candidate);
        // What went wrong before the current step, for the final reason.
        let mut history: Vec<String> = Vec::new();
        loop {
            let method = step.method();
            let left = deadline.saturating_duration_since(Instant::now());
            let failure = match self.try_step(&step, cwd, left).await {
                Ok(session_id) => {
                    return match step {
                        RestorePlan::New { why } => RestoreOutcome::Fresh { session_id, why },
                        _ => RestoreOutcome::Restored { method, session_id },
                    };
                }
                Err(error) => error.into_failure(),
            };
            let class = classify_restore_error(&failure);
            let what = format!("{} {}", method.method_name(), failure.describe(Some(left)));
            tracing::warn!(method = method.method_name(), %class, "{what}");
            let next = next_step_after_failure(method, &class, capabilities);
            match fall_back(step, next, saved.is_some()) {
                Ok(next_step) => {
                    history.push(what);
                    step = next_step;
                }
                Err(token_kept) => {
                    return failed(method, class, token_kept, saved, &what, &history);
                }
            }
        }
    }

    /// `initialize`, unless it was answered already; the restore's failure when it fails (the
    /// saved token kept: nothing was learned about it).
    async fn initialized(
        &mut self,
        saved: Option<&str>,
        within: Duration,
    ) -> Option<RestoreOutcome> {
        if self.initialize_response().is_some() {
            return None;
        }
        let error = self.initialize_within(within).await.err()?;
        let failure = error.into_failure();
        let class = classify_restore_error(&failure);
        Some(RestoreOutcome::Failed {
            method: None,
            class,
            token_kept: saved.is_some(),
            session_id: saved.map(str::to_owned),
            reason: format!("{class}: initialize {}", failure.describe(Some(within))),
        })
    }

    /// One step of the restore within `left`; the session id it leaves the agent in.
    async fn try_step(
        &mut self,
        step: &RestorePlan,
        cwd: &Path,
        left: Duration,
    ) -> Result<String, AcpError> {
        match step {
            RestorePlan::Resume(id) => self
                .resume_session_within(id, cwd, left)
                .instrument(tracing::info_span!("acp.session.resume", session_id = %id))
                .await
                .map(|()| id.clone()),
            RestorePlan::Load(id) => self
                .load_session_within(id, cwd, left)
                .instrument(tracing::info_span!("acp.session.load", session_id = %id))
                .await
                .map(|replayed| {
                    tracing::info!(
                        replayed = replayed.updates,
                        bytes = replayed.bytes,
                        "session loaded"
                    );
                    id.clone()
                }),
            RestorePlan::New { why } => {
                self.new_session_within(cwd, left)
                    .instrument(tracing::info_span!("acp.session.new", why = why.as_str()))
                    .await
            }
        }
    }
}

/// The step after `step` failed and the rules said `next`; `Err(token_kept)` when nothing is
/// left to try. The saved token (`has_saved`) survives unless an earlier step (or the agent's
/// capabilities) proved it useless.
fn fall_back(step: RestorePlan, next: NextStep, has_saved: bool) -> Result<RestorePlan, bool> {
    match (step, next) {
        (RestorePlan::Resume(id), NextStep::TryLoad) => Ok(RestorePlan::Load(id)),
        (RestorePlan::Resume(_) | RestorePlan::Load(_), NextStep::FallBackToNew { why }) => {
            Ok(RestorePlan::New { why })
        }
        (RestorePlan::New { why }, _) => Err(has_saved && !why.agent_rejected_token()),
        // KeepTokenAndFail, or a combination the rules never produce (TryLoad after
        // session/load): fail safe, keeping the token.
        (RestorePlan::Resume(_) | RestorePlan::Load(_), _) => Err(has_saved),
    }
}

fn failed(
    method: RestoreMethod,
    class: RestoreErrorClass,
    token_kept: bool,
    saved: Option<&str>,
    what: &str,
    history: &[String],
) -> RestoreOutcome {
    let mut reason = format!("{class}: {what}");
    if !history.is_empty() {
        reason.push_str(&format!(" (after: {})", history.join("; ")));
    }
    // Each step's words hold at most AGENT_TEXT_MAX of the agent's; the whole chain too.
    let reason = cap(&reason, MESSAGE_MAX).into_owned();
    RestoreOutcome::Failed {
        method: Some(method),
        class,
        token_kept,
        session_id: if token_kept {
            saved.map(str::to_owned)
        } else {
            None
        },
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::acp::AcpLimits;
    use crate::acp::client::tests::{ok, scripted_agent, slow_scripted_agent};
    use crate::jsonrpc::AgentLimit;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// The restore of saved session `token` in `/w`, the profile leaving it to the agent, every
    /// call within `limit`.
    async fn restore_saved(client: &mut AcpClient, token: &str, limit: Duration) -> RestoreOutcome {
        client
            .restore(
                Some(token),
                Path::new("/w"),
                NativeSessionResume::Auto,
                false,
                AcpTimeouts::uniform(limit),
            )
            .await
    }

    #[tokio::test]
    async fn a_replay_over_budget_or_line_limit_cuts_the_agent_off_keeping_the_token() {
        for (limits, expected) in [
            (
                AcpLimits {
                    replay_budget: 4096,
                    ..AcpLimits::default()
                },
                AgentLimit::Replay { limit: 4096 },
            ),
            (
                AcpLimits {
                    line: 200,
                    replay_line: 1024,
                    ..AcpLimits::default()
                },
                AgentLimit::Line { limit: 1024 },
            ),
        ] {
            let mut client = scripted_agent(|method, id, params| match method {
                "initialize" => vec![ok(
                    id,
                    json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true}}),
                )],
                "session/load" => {
                    // Lines under 1 KiB (above the normal limit), 8 KiB in all.
                    let update = json!({"jsonrpc": "2.0", "method": "session/update",
                        "params": {"sessionId": params["sessionId"], "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": "x".repeat(800)}}}})
                    .to_string();
                    let mut lines = vec![update; 10];
                    lines.push(format!("{{\"big\": \"{}\"}}", "y".repeat(2000)));
                    lines.push(ok(id, json!({})));
                    lines
                }
                _ => vec![],
            })
            .with_limits(limits);
            let outcome = restore_saved(&mut client, "tok", Duration::from_secs(5)).await;
            let RestoreOutcome::Failed {
                class,
                token_kept,
                session_id,
                reason,
                ..
            } = &outcome
            else {
                panic!("{outcome:?}");
            };
            assert_eq!(*class, RestoreErrorClass::AgentProtocolLimit);
            assert!(*token_kept);
            assert_eq!(session_id.as_deref(), Some("tok"));
            assert_eq!(
                reason,
                &format!("agent_protocol_limit: session/load was cut off: {expected}")
            );
            assert!(client.is_closed());
        }
    }

    /// The restore has one deadline: a `session/resume` that takes 1.5 s of a 2 s restore to
    /// say it is not supported leaves 0.5 s to `session/load`, not another 2 s.
    #[tokio::test(start_paused = true)]
    async fn each_step_gets_what_the_earlier_ones_left_of_one_deadline() {
        let mut client = slow_scripted_agent(|method, id, _| match method {
            "initialize" => (
                Duration::ZERO,
                vec![ok(
                    id,
                    json!({"protocolVersion": 1, "agentCapabilities": {
                        "loadSession": true, "sessionCapabilities": {"resume": {}}}}),
                )],
            ),
            "session/resume" => (
                Duration::from_millis(1500),
                vec![
                    json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32601, "message": "Method not found"}})
                    .to_string(),
                ],
            ),
            // session/load: thinks for longer than anyone waits.
            _ => (Duration::from_secs(3600), vec![]),
        });
        let started = tokio::time::Instant::now();
        let outcome = restore_saved(&mut client, "tok", Duration::from_secs(2)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2), "{outcome:?}");
        let RestoreOutcome::Failed {
            class,
            token_kept,
            reason,
            ..
        } = &outcome
        else {
            panic!("{outcome:?}");
        };
        assert_eq!(*class, RestoreErrorClass::Timeout);
        assert!(*token_kept);
        assert!(reason.contains("session/load"), "{reason}");
        assert!(reason.contains("500ms"), "{reason}");
    }

    #[tokio::test]
    async fn restore_without_initialize_runs_it_and_resumes() {
        let mut client = scripted_agent(|method, id, _| match method {
            "initialize" => vec![ok(
                id,
                json!({"protocolVersion": 1,
                "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"resume": {}}}}),
            )],
            "session/resume" => vec![ok(id, json!({}))],
            _ => vec![],
        });
        let outcome = restore_saved(&mut client, " tok ", Duration::from_secs(5)).await;
        assert_eq!(
            outcome,
            RestoreOutcome::Restored {
                method: RestoreMethod::Resume,
                session_id: "tok".into()
            }
        );
    }
}
