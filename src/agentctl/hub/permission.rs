//! The agent's `session/request_permission` when no client that decides is connected: the
//! session's policy ([`EffectivePolicy`]) allows it, denies it, or holds it for a person's answer
//! ([`Hub::answer_permission`]) until `askTimeout` ([`Hub::permission_timed_out`]). Every request
//! gets an id of agentctl's (`<when serve started>-<n>`, unique across the session's pods), and what became of it goes into the journal
//! ([`Event::PermissionResolved`]) and the history.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{Hub, Output};
use crate::agentctl::events::Event;
use crate::api::bounds::cap;
use crate::api::{
    PENDING_PERMISSIONS_MAX, PERMISSION_SUMMARY_MAX, PendingPermission, PermissionAction,
    PermissionAsk, PermissionOption, PermissionOutcome, ToolKind,
};
use crate::history::HistoryEntry;
use crate::jsonrpc;

/// A request held for a person's answer.
pub(super) struct Held {
    pub(super) request: PendingPermission,
    /// The agent's JSON-RPC id of the request.
    agent_id: Value,
    session_id: String,
    /// The options as the agent sent them: `(optionId, kind)`.
    offered: Vec<(String, String)>,
}

/// Why an answer was not relayed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerRefusal {
    #[error(
        "no permission request {id} waits: it was answered already, timed out, or went with the agent"
    )]
    NotPending { id: String },
    #[error("permission request {id} offers no {kind} option (it offers: {offered})")]
    NoSuchOption {
        id: String,
        kind: String,
        offered: String,
    },
}

/// The answer selecting `option`, or cancelling the request.
fn answer(id: Value, option: Option<&str>) -> Value {
    let outcome = match option {
        Some(option) => json!({"outcome": "selected", "optionId": option}),
        None => json!({"outcome": "cancelled"}),
    };
    jsonrpc::result_message(id, json!({ "outcome": outcome }))
}

fn option_of<'a>(offered: &'a [(String, String)], kind: &str) -> Option<&'a str> {
    offered
        .iter()
        .find(|(_, k)| k == kind)
        .map(|(id, _)| id.as_str())
}

impl Hub {
    /// An agent's permission request with no client that decides: see the module docs.
    pub(super) fn permission_by_policy(
        &mut self,
        id: Value,
        raw: &Map<String, Value>,
    ) -> Vec<Output> {
        let asked = PermissionAsk::read(raw.get("params"), PERMISSION_SUMMARY_MAX);
        self.next_permission += 1;
        let request_id = match &self.config.permission_prefix {
            Some(prefix) => format!("{prefix}-{}", self.next_permission),
            None => format!("p{}", self.next_permission),
        };
        let (action, rule) = self.config.permissions.decide(asked.kind);
        let by = match rule {
            Some(i) => format!("rule {} ({} → {})", i + 1, asked.kind, action.as_str()),
            None => format!("the default ({})", action.as_str()),
        };
        let resolve = |hub: &mut Hub, wanted: &str, outcome: PermissionOutcome| {
            let option = option_of(&asked.offered, wanted).map(str::to_owned);
            let (outcome, reason) = match &option {
                Some(_) => (outcome, format!("by the policy's {by}")),
                None => (
                    PermissionOutcome::Rejected,
                    format!(
                        "the policy's {by} wants a {wanted} option, and the request offers none"
                    ),
                ),
            };
            let option =
                option.or_else(|| option_of(&asked.offered, "reject_once").map(str::to_owned));
            hub.resolved(
                id.clone(),
                &asked.session_id,
                &request_id,
                asked.kind,
                &asked.title,
                outcome,
                option,
                reason,
            )
        };
        match action {
            PermissionAction::Allow => {
                resolve(self, "allow_once", PermissionOutcome::AllowedByPolicy)
            }
            PermissionAction::Deny => {
                resolve(self, "reject_once", PermissionOutcome::DeniedByPolicy)
            }
            PermissionAction::Ask => self.hold(id, asked, request_id),
        }
    }

    /// Holds the request for a person's answer; the oldest held goes when too many wait.
    fn hold(&mut self, agent_id: Value, asked: PermissionAsk, request_id: String) -> Vec<Output> {
        let mut out = Vec::new();
        if self.held.len() >= PENDING_PERMISSIONS_MAX {
            let oldest = self.held.remove(0);
            let option = option_of(&oldest.offered, "reject_once").map(str::to_owned);
            let reason = format!(
                "more than {PENDING_PERMISSIONS_MAX} requests waited; the oldest was rejected"
            );
            out.extend(self.resolved(
                oldest.agent_id,
                &oldest.session_id,
                &oldest.request.id,
                oldest.request.tool_kind,
                &oldest.request.title,
                PermissionOutcome::Overflow,
                option,
                reason,
            ));
        }
        let request = PendingPermission {
            id: request_id.clone(),
            tool_kind: asked.kind,
            title: asked.title,
            summary: asked.summary,
            options: asked
                .offered
                .iter()
                .map(|(id, kind)| PermissionOption {
                    id: id.clone(),
                    kind: kind.clone(),
                })
                .collect(),
            requested_at: (self.clock)(),
        }
        .capped();
        tracing::info!(request = %request_id, kind = %asked.kind, title = %request.title, "permission request held for a person's answer");
        out.push(Output::Event(Event::PermissionRequested {
            session_id: asked.session_id.clone(),
            request: request.clone(),
        }));
        out.push(self.permission_note(
            &asked.session_id,
            format!(
                "{} \"{}\" ({}): waits for an answer",
                asked.kind, request.title, request_id
            ),
        ));
        let timeout = self.config.permissions.ask_timeout_seconds;
        if timeout > 0 {
            out.push(Output::PermissionTimer {
                request_id,
                after: Duration::from_secs(timeout),
            });
        }
        self.held.push(Held {
            request,
            agent_id,
            session_id: asked.session_id,
            offered: asked.offered,
        });
        out
    }

    /// A person's answer to held request `request_id`: the option of `option_kind` goes to the
    /// agent.
    pub fn answer_permission(
        &mut self,
        request_id: &str,
        option_kind: &str,
    ) -> (Result<PermissionOutcome, AnswerRefusal>, Vec<Output>) {
        let Some(index) = self.held.iter().position(|h| h.request.id == request_id) else {
            let refusal = AnswerRefusal::NotPending {
                id: cap(request_id, 64).into_owned(),
            };
            return (Err(refusal), Vec::new());
        };
        let Some(option) = option_of(&self.held[index].offered, option_kind).map(str::to_owned)
        else {
            let offered = self.held[index]
                .offered
                .iter()
                .map(|(_, kind)| kind.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let refusal = AnswerRefusal::NoSuchOption {
                id: request_id.to_owned(),
                kind: cap(option_kind, 32).into_owned(),
                offered: if offered.is_empty() {
                    "nothing".into()
                } else {
                    offered
                },
            };
            return (Err(refusal), Vec::new());
        };
        let held = self.held.remove(index);
        let outcome = if option_kind.starts_with("allow") {
            PermissionOutcome::Approved
        } else {
            PermissionOutcome::Rejected
        };
        let out = self.resolved(
            held.agent_id,
            &held.session_id,
            &held.request.id,
            held.request.tool_kind,
            &held.request.title,
            outcome,
            Some(option),
            format!("answered {option_kind} through the API server"),
        );
        (Ok(outcome), out)
    }

    /// `askTimeout` passed for `request_id`: rejected once, if it still waits.
    pub fn permission_timed_out(&mut self, request_id: &str) -> Vec<Output> {
        let Some(index) = self.held.iter().position(|h| h.request.id == request_id) else {
            return Vec::new();
        };
        let held = self.held.remove(index);
        let option = option_of(&held.offered, "reject_once").map(str::to_owned);
        let reason = format!(
            "nobody answered within askTimeout ({}s)",
            self.config.permissions.ask_timeout_seconds
        );
        self.resolved(
            held.agent_id,
            &held.session_id,
            &held.request.id,
            held.request.tool_kind,
            &held.request.title,
            PermissionOutcome::TimedOut,
            option,
            reason,
        )
    }

    /// The agent went: what it waited for is gone with it (journaled, nothing to answer).
    pub(super) fn permissions_gone(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.held)
            .into_iter()
            .map(|held| {
                Output::Event(Event::PermissionResolved {
                    session_id: held.session_id,
                    request_id: held.request.id,
                    tool_kind: held.request.tool_kind,
                    outcome: PermissionOutcome::Gone,
                    option_id: None,
                    reason: "the agent exited while the request waited".into(),
                })
            })
            .collect()
    }

    /// The requests that wait, oldest first.
    pub fn held_permissions(&self) -> Vec<PendingPermission> {
        self.held.iter().map(|h| h.request.clone()).collect()
    }

    /// The answer to the agent, the journal entry and the history line of a request's end.
    #[allow(clippy::too_many_arguments)]
    fn resolved(
        &mut self,
        agent_id: Value,
        session_id: &str,
        request_id: &str,
        kind: ToolKind,
        title: &str,
        outcome: PermissionOutcome,
        option: Option<String>,
        reason: String,
    ) -> Vec<Output> {
        tracing::info!(request = %request_id, %kind, outcome = outcome.as_str(), %reason, "permission request answered");
        let note = format!(
            "{kind} \"{}\" ({request_id}): {}, {reason}",
            cap(title, 256),
            outcome.as_str()
        );
        vec![
            Output::ToAgent(answer(agent_id, option.as_deref())),
            Output::Event(Event::PermissionResolved {
                session_id: session_id.to_owned(),
                request_id: request_id.to_owned(),
                tool_kind: kind,
                outcome,
                option_id: option,
                reason,
            }),
            self.permission_note(session_id, note),
        ]
    }

    /// A history line about a permission request (a tool result named `permission`, so that
    /// the history a fresh agent gets says what it was allowed).
    fn permission_note(&self, session_id: &str, text: String) -> Output {
        let session = if session_id.is_empty() {
            self.current_session.clone().unwrap_or_default()
        } else {
            session_id.to_owned()
        };
        Output::Record {
            history_session: self.history_session(&session),
            entry: HistoryEntry::ToolResult {
                name: "permission".into(),
                output: text,
                timestamp: None,
            },
        }
    }
}
