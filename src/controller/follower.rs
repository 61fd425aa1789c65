//! Follows `agentctl events` in every running agentctl pod (over exec) and records what the agent
//! does in ExecutorRunning status: the resume token on session-created and prompt-finished, and
//! whether a prompt is in flight. The TaskSession reconcile (which watches ExecutorRunning)
//! turns that into RUNNING ↔ WAITING_FOR_INPUT. A dropped stream reconnects with backoff.
//!
//! Only changes are written: each follower remembers what ExecutorRunning holds, so the snapshot
//! that opens every stream, and repeated lines, cost no API call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, AttachParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;
use serde_json::json;
use tokio::io::BufReader;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::api::{AgentActivity, ExecutorPhase, ExecutorRunning, ExecutorRunningStatus};
use crate::codec::{Frame, LINE_LIMIT, LineReader, WarnLimiter};

/// One line of `agentctl events`.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AgentctlEvent {
    /// Current state, sent first on every subscription (so a re-attached operator catches up).
    Snapshot {
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
        #[serde(rename = "promptActive", default)]
        prompt_active: bool,
    },
    SessionCreated {
        #[serde(rename = "sessionId")]
        session_id: String,
    },
    PromptStarted {
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
    },
    PromptFinished {
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
    },
    AgentExited,
    #[serde(other)]
    Other,
}

/// The ExecutorRunning fields that events set, as last written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Known {
    pub resume_token: Option<String>,
    pub activity: Option<AgentActivity>,
    pub running: bool,
}

impl Known {
    pub fn from_status(status: &ExecutorRunningStatus) -> Self {
        Self {
            resume_token: status.resume_token.clone().filter(|t| !t.is_empty()),
            activity: status.activity,
            running: status.status == Some(ExecutorPhase::Running),
        }
    }
}

/// What an event changes in ExecutorRunning status, given what it holds (`known`): a JSON merge
/// patch of the changed fields and what the status holds after it; `None` when nothing changes.
pub fn status_patch_for(
    event: &AgentctlEvent,
    known: &Known,
    now: Timestamp,
) -> Option<(serde_json::Value, Known)> {
    let mut next = known.clone();
    match event {
        AgentctlEvent::Snapshot {
            session_id,
            prompt_active,
        } => {
            next.running = true;
            next.activity = Some(if *prompt_active {
                AgentActivity::Working
            } else {
                AgentActivity::Idle
            });
            if let Some(id) = session_id {
                next.resume_token = Some(id.clone());
            }
        }
        AgentctlEvent::SessionCreated { session_id } => {
            next.running = true;
            next.resume_token = Some(session_id.clone());
        }
        AgentctlEvent::PromptStarted { .. } => next.activity = Some(AgentActivity::Working),
        AgentctlEvent::PromptFinished { session_id } => {
            next.activity = Some(AgentActivity::Idle);
            if let Some(id) = session_id {
                next.resume_token = Some(id.clone());
            }
        }
        AgentctlEvent::AgentExited | AgentctlEvent::Other => return None,
    }
    if next == *known {
        return None;
    }
    let mut status = json!({ "lastSeenAt": Time(now) });
    if next.running != known.running {
        status["status"] = json!(ExecutorPhase::Running);
    }
    if next.activity != known.activity {
        status["activity"] = json!(next.activity);
    }
    if next.resume_token != known.resume_token {
        status["resumeToken"] = json!(next.resume_token);
        status["resumable"] = json!(true);
    }
    Some((json!({ "status": status }), next))
}

/// The followers currently running, by pod UID.
pub struct Followers {
    running: Mutex<HashMap<String, JoinHandle<()>>>,
    /// The operator's pod cache: a follower stops when its pod is gone from it.
    pods: Store<Pod>,
}

impl Followers {
    pub fn new(pods: Store<Pod>) -> Self {
        Self {
            running: Mutex::default(),
            pods,
        }
    }

    /// Starts following the pod unless a live follower already does; `status` is what its
    /// ExecutorRunning holds now.
    pub fn ensure(
        &self,
        client: &Client,
        pod: &Pod,
        executor: &str,
        status: &ExecutorRunningStatus,
    ) {
        let (Some(uid), Some(name), Some(ns)) = (
            pod.metadata.uid.clone(),
            pod.metadata.name.clone(),
            pod.metadata.namespace.clone(),
        ) else {
            return;
        };
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        running.retain(|_, handle| !handle.is_finished());
        if running.contains_key(&uid) {
            return;
        }
        let span = info_span!("agentctl.events", pod = %name, namespace = %ns);
        let task = follow(
            client.clone(),
            self.pods.clone(),
            ObjectRef::from_obj(pod),
            executor.to_string(),
            Known::from_status(status),
        )
        .instrument(span);
        running.insert(uid, tokio::spawn(task));
    }

    /// Keeps following only the pods for which `keep(uid)` holds (and whose follower lives).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        if let Ok(mut running) = self.running.lock() {
            running.retain(|uid, handle| {
                let alive = keep(uid) && !handle.is_finished();
                if !alive {
                    handle.abort();
                }
                alive
            });
        }
    }
}

/// Follows one pod until it is gone from the cache or stops running; reconnects with
/// exponential backoff (1 s … 30 s).
async fn follow(
    client: Client,
    cache: Store<Pod>,
    pod: ObjectRef<Pod>,
    executor: String,
    mut known: Known,
) {
    let ns = pod.namespace.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let executors: Api<ExecutorRunning> = Api::namespaced(client, &ns);
    let mut backoff = Duration::from_secs(1);
    loop {
        let running = cache.get(&pod).is_some_and(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        if !running {
            info!("pod is gone or not running; stopping the event follower");
            return;
        }
        match stream_events(&pods, &pod.name, &executors, &executor, &mut known).await {
            Ok(()) => debug!("event stream ended"),
            Err(err) => warn!(error = %err, "event stream failed"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn stream_events(
    pods: &Api<Pod>,
    pod: &str,
    executors: &Api<ExecutorRunning>,
    executor: &str,
    known: &mut Known,
) -> Result<(), kube::Error> {
    let params = AttachParams::default()
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let mut process = pods.exec(pod, ["agentctl", "events"], &params).await?;
    let Some(stdout) = process.stdout() else {
        return Ok(());
    };
    // Event lines are small; a longer one means the stream is not what we think it is: it is
    // dropped (never buffered) and the stream is followed again after the backoff.
    let mut lines = LineReader::new(BufReader::new(stdout), LINE_LIMIT);
    let mut warnings = WarnLimiter::default();
    info!("following agentctl events");
    loop {
        match lines.next_line().await {
            Ok(Frame::Line) => {}
            Ok(Frame::TooLong { len }) => {
                warn!(
                    len,
                    limit = LINE_LIMIT,
                    "over-long agentctl event line; reconnecting"
                );
                return Ok(());
            }
            Ok(Frame::Eof) | Err(_) => return Ok(()),
        }
        let event: AgentctlEvent = match serde_json::from_slice(lines.line()) {
            Ok(event) => event,
            Err(err) => {
                if let Some(suppressed) = warnings.allow() {
                    let line = String::from_utf8_lossy(lines.line());
                    warn!(%err, suppressed, line = %line.chars().take(200).collect::<String>(), "unreadable agentctl event");
                }
                continue;
            }
        };
        debug!(?event, "agentctl event");
        if let Some((patch, next)) = status_patch_for(&event, known, Timestamp::now()) {
            executors
                .patch_status(executor, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            *known = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> AgentctlEvent {
        serde_json::from_str(line).expect("event parses")
    }

    #[test]
    fn events_map_to_executor_status_changes() {
        let now = Timestamp::from_second(0).expect("ts");
        let running_idle = Known {
            resume_token: Some("s1".into()),
            activity: Some(AgentActivity::Idle),
            running: true,
        };
        let cases = [
            (
                Known::default(),
                r#"{"event":"session_created","sessionId":"s1","method":"session/new"}"#,
                Some(json!({"resumeToken":"s1","resumable":true,"status":"Running"})),
            ),
            (
                running_idle.clone(),
                r#"{"event":"prompt_started","sessionId":"s1"}"#,
                Some(json!({"activity":"Working"})),
            ),
            (
                Known {
                    activity: Some(AgentActivity::Working),
                    ..running_idle.clone()
                },
                r#"{"event":"prompt_finished","sessionId":"s2","stopReason":"end_turn"}"#,
                Some(json!({"activity":"Idle","resumeToken":"s2"})),
            ),
            (
                Known::default(),
                r#"{"event":"snapshot","sessionId":null,"promptActive":true}"#,
                Some(json!({"status":"Running","activity":"Working"})),
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
            (running_idle, r#"{"event":"something_new"}"#, None),
        ];
        for (known, line, expected) in cases {
            let patch = status_patch_for(&parse(line), &known, now);
            match (patch, expected) {
                (None, None) => {}
                (Some((patch, next)), Some(expected)) => {
                    let written = patch["status"].as_object().expect("object");
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
}
