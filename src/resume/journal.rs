//! What a line of agentctl's event journal says about the agent ([`view_after`]): the event
//! followers keep the [`AgentView`] it gives, and the reconciler writes it
//! ([`super::journal_update`]).
//!
//! The journal is on the workspace volume, which the agent can write: a session or message id
//! the operator would not keep (too long, control characters) is not applied, and a
//! configuration keeps its bounds.

use crate::api::AgentActivity;
use crate::api::bounds::session_id_problem;
use crate::api::pod_contract::events::{Event, EventLine};

use super::{AgentView, PermissionResolution, RESOLUTIONS_KEPT};
use crate::api::bounds::{AGENT_TEXT_MAX, cap, keep_newest};
use crate::api::{PENDING_PERMISSIONS_MAX, PERMISSION_ID_MAX};

fn keeps(id: &str) -> bool {
    session_id_problem(id).is_none()
}

/// What is known after `line`; `None` when the line changes nothing (an entry already read,
/// one that says nothing about the agent, an id not kept). An entry at or below the cursor (an
/// older launch's, or one applied already) changes nothing; the snapshot (the current state)
/// always counts.
pub fn view_after(line: &EventLine, view: &AgentView) -> Option<AgentView> {
    let event = &line.event;
    let is_snapshot = matches!(event, Event::Snapshot { .. });
    if !is_snapshot && line.seq.is_some_and(|seq| seq <= view.cursor) {
        return None;
    }
    let mut next = view.clone();
    match line.seq {
        // The snapshot is the state as of the newest entry (lower than the cursor only if the
        // journal was started over).
        Some(seq) if is_snapshot => next.cursor = seq,
        Some(seq) => next.cursor = next.cursor.max(seq),
        None => {}
    }
    let next = apply_event(event, next)?;
    // The last message id of the session the token names.
    match event {
        Event::Snapshot {
            last_message_id: Some(id),
            ..
        }
        | Event::PromptFinished {
            last_message_id: Some(id),
            ..
        } if keeps(id) => Some(AgentView {
            last_message_id: Some(id.clone()),
            ..next
        }),
        _ => Some(next),
    }
}

/// What `event` says about the agent, applied to `next`; `None` when it says nothing.
fn apply_event(event: &Event, next: AgentView) -> Option<AgentView> {
    let session = |next: AgentView, id: &String| next.with_session(Some(id.clone()));
    match event {
        Event::SessionCreated { session_id, .. } | Event::PromptFinished { session_id, .. }
            if !keeps(session_id) =>
        {
            None
        }
        Event::Snapshot {
            session_id,
            prompt_active,
            pending_permissions,
            ..
        } => {
            let next = match session_id.as_ref().filter(|id| keeps(id)) {
                Some(id) => session(next, id),
                None => next,
            };
            // What waits now, as agentctl holds it (a restarted operator rebuilds the list).
            let pending_permissions = pending_permissions
                .iter()
                .take(PENDING_PERMISSIONS_MAX)
                .filter_map(|p| p.clone().bounded())
                .collect();
            Some(AgentView {
                pending_permissions,
                activity: Some(if *prompt_active {
                    AgentActivity::Working
                } else {
                    AgentActivity::Idle
                }),
                ..next
            })
        }
        Event::SessionCreated { session_id, .. } => Some(session(next, session_id)),
        Event::PromptStarted { .. } => Some(AgentView {
            activity: Some(AgentActivity::Working),
            ..next
        }),
        Event::PromptFinished { session_id, .. } => Some(AgentView {
            activity: Some(AgentActivity::Idle),
            ..session(next, session_id)
        }),
        // Only the configuration of the session the token names is kept.
        Event::SessionConfig { session_id, config } => {
            (next.resume_token.as_ref() == Some(session_id)).then(|| AgentView {
                session_config: Some(config.clone().bounded()),
                ..next
            })
        }
        Event::PermissionRequested { request, .. } => {
            let request = request.clone().bounded()?;
            if next.pending_permissions.iter().any(|p| p.id == request.id) {
                return None;
            }
            let mut next = next;
            next.pending_permissions.push(request);
            keep_newest(&mut next.pending_permissions, PENDING_PERMISSIONS_MAX);
            Some(next)
        }
        Event::PermissionResolved {
            request_id,
            tool_kind,
            outcome,
            reason,
            ..
        } => {
            let mut next = next;
            next.pending_permissions.retain(|p| &p.id != request_id);
            next.resolutions.push(PermissionResolution {
                request_id: cap(request_id, PERMISSION_ID_MAX).into_owned(),
                tool_kind: *tool_kind,
                outcome: *outcome,
                reason: cap(reason, AGENT_TEXT_MAX).into_owned(),
            });
            keep_newest(&mut next.resolutions, RESOLUTIONS_KEPT);
            Some(next)
        }
        Event::ConfigSetBackFailed { .. }
        | Event::Suspended { .. }
        | Event::AgentExited { .. }
        | Event::Heartbeat
        | Event::JournalGap { .. }
        | Event::Other => None,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use serde_json::{Value, json};

    use super::*;
    use crate::api::{ExecutorPhase, ExecutorRunningStatus, SessionConfigState};
    use crate::resume::{JournalNews, journal_update};

    /// What the journal knows of a running, idle agent in session `s1`.
    fn running_idle() -> AgentView {
        AgentView {
            resume_token: Some("s1".into()),
            activity: Some(AgentActivity::Idle),
            ..AgentView::default()
        }
    }

    fn parse(line: &str) -> EventLine {
        serde_json::from_str(line).expect("event parses")
    }

    /// The status fields `line` changes in an executor that holds `view` (what the reconciler
    /// would apply), `None` when it changes none.
    fn changes(line: &EventLine, view: &AgentView) -> Option<(Value, AgentView)> {
        let mut current = ExecutorRunningStatus {
            pod_uid: Some("p".into()),
            status: Some(ExecutorPhase::Running),
            resumable: view.resume_token.is_some(),
            ..Default::default()
        };
        view.clone().write_into(&mut current);
        let next = view_after(line, view)?;
        let news = JournalNews {
            pod_uid: "p".into(),
            view: next.clone(),
            seen_at: Timestamp::from_second(0).expect("ts"),
            handled_nudge: None,
        };
        let desired = journal_update(&current, &news)?;
        let before = serde_json::to_value(&current).expect("json");
        let after = serde_json::to_value(&desired).expect("json");
        let (before, after) = (
            before.as_object().expect("object"),
            after.as_object().expect("object"),
        );
        let changed = before
            .keys()
            .chain(after.keys())
            .filter(|key| before.get(*key) != after.get(*key))
            .map(|key| (key.clone(), after.get(key).cloned().unwrap_or(Value::Null)))
            .collect::<serde_json::Map<_, _>>();
        Some((Value::Object(changed), next))
    }

    /// The journal is on the workspace volume, which the agent can write (issue 30): an id the
    /// operator would not keep is not applied, and a configuration keeps its bounds.
    #[test]
    fn hostile_journal_lines_stay_within_bounds() {
        use crate::api::bounds::{CONFIG_ITEMS_MAX, SESSION_ID_MAX};
        let known = running_idle();
        let long = "x".repeat(SESSION_ID_MAX + 1);
        for line in [
            format!(r#"{{"event":"session_created","sessionId":"{long}","method":"session/new"}}"#),
            format!(
                r#"{{"event":"prompt_finished","sessionId":"{long}","stopReason":"end_turn"}}"#
            ),
            r#"{"event":"session_created","sessionId":"a\nb","method":"session/new"}"#.to_string(),
            format!(
                r#"{{"event":"snapshot","sessionId":"{long}","promptActive":false,"lastMessageId":"{long}"}}"#
            ),
        ] {
            assert_eq!(changes(&parse(&line), &known), None, "{line}");
        }
        let options: Vec<_> = (0..10_000)
            .map(|n| json!({"id": format!("o{n}"), "value": "true"}))
            .chain([json!({"id": "x", "value": "v".repeat(10_000)})])
            .collect();
        let line = json!({"event": "session_config", "sessionId": "s1",
            "config": {"mode": long, "model": "m", "configOptions": options}});
        let (patch, next) = changes(&parse(&line.to_string()), &known).expect("a change");
        let config = next.session_config.expect("a configuration");
        assert_eq!(
            config.mode, None,
            "a mode over the bound is dropped, not cut"
        );
        assert_eq!(config.model.as_deref(), Some("m"));
        assert_eq!(config.config_options.len(), CONFIG_ITEMS_MAX);
        assert_eq!(
            patch["sessionConfig"]["configOptions"]
                .as_array()
                .map(Vec::len),
            Some(CONFIG_ITEMS_MAX)
        );
    }

    #[test]
    fn events_map_to_executor_status_changes() {
        let running_idle = running_idle();
        let at_5 = AgentView {
            cursor: 5,
            ..running_idle.clone()
        };
        let planning = AgentView {
            session_config: Some(SessionConfigState {
                mode: Some("plan".into()),
                ..SessionConfigState::default()
            }),
            ..running_idle.clone()
        };
        let cases = [
            (
                AgentView::default(),
                r#"{"event":"session_created","sessionId":"s1","method":"session/new"}"#,
                Some(json!({"resumeToken":"s1","resumable":true})),
            ),
            (
                running_idle.clone(),
                r#"{"event":"prompt_started","sessionId":"s1"}"#,
                Some(json!({"activity":"Working"})),
            ),
            (
                AgentView {
                    activity: Some(AgentActivity::Working),
                    ..running_idle.clone()
                },
                r#"{"event":"prompt_finished","sessionId":"s2","stopReason":"end_turn"}"#,
                Some(json!({"activity":"Idle","resumeToken":"s2"})),
            ),
            (
                AgentView::default(),
                r#"{"event":"snapshot","sessionId":null,"promptActive":true}"#,
                Some(json!({"activity":"Working"})),
            ),
            // What the launch already recorded: the opening snapshot writes nothing.
            (
                running_idle.clone(),
                r#"{"event":"snapshot","sessionId":"s1","promptActive":false}"#,
                None,
            ),
            (
                running_idle.clone(),
                r#"{"event":"prompt_finished","sessionId":"s1","stopReason":"end_turn"}"#,
                None,
            ),
            (
                running_idle.clone(),
                r#"{"event":"agent_exited","code":1}"#,
                None,
            ),
            (running_idle.clone(), r#"{"event":"something_new"}"#, None),
            // The agent's message ids: the last one of a prompt, or of the snapshot…
            (
                running_idle.clone(),
                r#"{"event":"prompt_finished","sessionId":"s1","stopReason":"end_turn","lastMessageId":"m-2"}"#,
                Some(json!({"lastMessageUUID":"m-2"})),
            ),
            (
                AgentView::default(),
                r#"{"event":"snapshot","sessionId":"s1","promptActive":false,"lastMessageId":"m-2"}"#,
                Some(json!({"activity":"Idle","resumeToken":"s1","lastMessageUUID":"m-2"})),
            ),
            (
                AgentView {
                    last_message_id: Some("m-2".into()),
                    ..running_idle.clone()
                },
                r#"{"event":"snapshot","sessionId":"s1","promptActive":false,"lastMessageId":"m-2"}"#,
                None,
            ),
            // …and a new session's token drops the old session's id.
            (
                AgentView {
                    last_message_id: Some("m-2".into()),
                    ..running_idle.clone()
                },
                r#"{"event":"session_created","sessionId":"s9","method":"session/new"}"#,
                Some(json!({"resumeToken":"s9","lastMessageUUID":null})),
            ),
            (
                AgentView {
                    last_message_id: Some("m-2".into()),
                    ..running_idle.clone()
                },
                r#"{"event":"prompt_finished","sessionId":"s9","stopReason":"end_turn","lastMessageId":"n-1"}"#,
                Some(json!({"resumeToken":"s9","lastMessageUUID":"n-1"})),
            ),
            // The session's configuration, for the session the token names only…
            (
                running_idle.clone(),
                r#"{"event":"session_config","sessionId":"s1","config":{"mode":"plan","configOptions":[{"id":"effort","value":"high"}]}}"#,
                Some(
                    json!({"sessionConfig":{"mode":"plan","configOptions":[{"id":"effort","value":"high"}]}}),
                ),
            ),
            (
                running_idle.clone(),
                r#"{"event":"session_config","sessionId":"other","config":{"mode":"plan"}}"#,
                None,
            ),
            (
                planning.clone(),
                r#"{"event":"session_config","sessionId":"s1","config":{"mode":"plan"}}"#,
                None,
            ),
            // …and a new session's token drops the old session's configuration.
            (
                planning.clone(),
                r#"{"event":"session_created","sessionId":"s9","method":"session/new"}"#,
                Some(json!({"resumeToken":"s9","sessionConfig":null})),
            ),
            (
                running_idle.clone(),
                r#"{"event":"config_set_back_failed","sessionId":"s1","method":"session/set_mode","error":{"code":-32603,"message":"no"}}"#,
                None,
            ),
            (running_idle.clone(), r#"{"event":"something_new"}"#, None),
            // serve's own lines: a heartbeat, and the gap before a replay.
            (
                running_idle.clone(),
                r#"{"event":"heartbeat","timestamp":"T"}"#,
                None,
            ),
            (running_idle, r#"{"event":"journal_gap","since":3}"#, None),
            // The journal: an entry applied already (or an older launch's) changes nothing…
            (
                at_5.clone(),
                r#"{"seq":5,"event":"prompt_started","sessionId":"s1","launch":"r1"}"#,
                None,
            ),
            (
                at_5.clone(),
                r#"{"seq":2,"event":"session_created","sessionId":"old","method":"session/new","launch":"initial"}"#,
                None,
            ),
            // …a newer one is applied with its cursor…
            (
                at_5.clone(),
                r#"{"seq":6,"event":"prompt_started","sessionId":"s1","launch":"r1"}"#,
                Some(json!({"activity":"Working","journalCursor":6})),
            ),
            // …and a snapshot below the cursor (the journal started over) resets it.
            (
                AgentView { cursor: 9, ..at_5 },
                r#"{"seq":3,"event":"snapshot","sessionId":"s1","promptActive":true}"#,
                Some(json!({"activity":"Working","journalCursor":3})),
            ),
        ];
        for (known, line, expected) in cases {
            let patch = changes(&parse(line), &known);
            match (patch, expected) {
                (None, None) => {}
                (Some((patch, next)), Some(expected)) => {
                    let written = patch.as_object().expect("object");
                    for (key, value) in expected.as_object().expect("object") {
                        assert_eq!(&written[key], value, "{line}: {key}");
                    }
                    let unchanged = written
                        .keys()
                        .filter(|k| !expected.as_object().expect("object").contains_key(*k))
                        .filter(|k| *k != "lastSeenAt" && *k != "resumable")
                        .collect::<Vec<_>>();
                    assert!(unchanged.is_empty(), "{line}: wrote {unchanged:?} too");
                    assert_ne!(next, known, "{line}");
                }
                (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Permission requests: a request adds to what waits (once), its end removes it and is
    /// kept for the Events, the snapshot says what waits now (a restarted operator), and forged
    /// entries (the journal is the agent's to write) stay within bounds.
    #[test]
    fn permission_requests_come_and_go_with_the_journal() {
        use crate::api::{PENDING_PERMISSIONS_MAX, PermissionOutcome, ToolKind};
        let requested = |seq: u64, id: &str| {
            parse(&format!(
                r#"{{"event":"permission_requested","sessionId":"s1","request":{{"id":"{id}","toolKind":"execute","title":"make","options":[{{"id":"yes","kind":"allow_once"}}],"requestedAt":"T"}},"seq":{seq}}}"#
            ))
        };
        let known = running_idle();
        let one = view_after(&requested(1, "p1"), &known).expect("a change");
        assert_eq!(one.pending_permissions.len(), 1);
        assert_eq!(
            view_after(&requested(2, "p1"), &one).map(|v| v.pending_permissions.len()),
            None
        );
        let resolved = parse(
            r#"{"event":"permission_resolved","sessionId":"s1","requestId":"p1","toolKind":"execute","outcome":"timedOut","reason":"nobody answered","seq":3}"#,
        );
        let done = view_after(&resolved, &one).expect("a change");
        assert!(done.pending_permissions.is_empty());
        assert_eq!(
            done.resolutions,
            [PermissionResolution {
                request_id: "p1".into(),
                tool_kind: ToolKind::Execute,
                outcome: PermissionOutcome::TimedOut,
                reason: "nobody answered".into(),
            }]
        );
        let snapshot = parse(
            r#"{"event":"snapshot","sessionId":"s1","promptActive":true,"pendingPermissions":[{"id":"p7","toolKind":"fetch","title":"curl","options":[],"requestedAt":"T"}],"seq":9}"#,
        );
        let rebuilt = view_after(&snapshot, &one).expect("a change");
        assert_eq!(
            rebuilt
                .pending_permissions
                .iter()
                .map(|p| p.id.as_str())
                .collect::<Vec<_>>(),
            ["p7"]
        );
        // Forged: an id agentctl never gives is not applied; a flood keeps the bound.
        assert_eq!(view_after(&requested(4, "p\\n1"), &known), None);
        let mut flooded = known.clone();
        for seq in 1..=40 {
            flooded = view_after(&requested(seq, &format!("p{seq}")), &flooded).expect("a change");
        }
        assert_eq!(flooded.pending_permissions.len(), PENDING_PERMISSIONS_MAX);
        assert_eq!(flooded.pending_permissions[0].id, "p25");
    }
}
