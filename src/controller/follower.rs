//! Follows `agentctl events` in every running agentctl pod (over exec) and records what the agent
//! does in ExecutorRunning status: the resume token on session-created and prompt-finished, and
//! whether a prompt is in flight. The TaskSession reconcile (which watches ExecutorRunning)
//! turns that into RUNNING ↔ WAITING_FOR_INPUT. A dropped stream reconnects with backoff.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, AttachParams, Patch, PatchParams};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::api::{AgentActivity, ExecutorPhase, ExecutorRunning};

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

/// What an event changes in ExecutorRunning status (a JSON merge patch), if anything.
pub fn status_patch_for(event: &AgentctlEvent, now: Timestamp) -> Option<serde_json::Value> {
    let seen = Time(now);
    let patch = match event {
        AgentctlEvent::Snapshot {
            session_id,
            prompt_active,
        } => {
            let mut status = json!({
                "status": ExecutorPhase::Running,
                "activity": if *prompt_active { AgentActivity::Working } else { AgentActivity::Idle },
                "lastSeenAt": seen,
            });
            if let Some(id) = session_id {
                status["resumeToken"] = json!(id);
                status["resumable"] = json!(true);
            }
            status
        }
        AgentctlEvent::SessionCreated { session_id } => {
            json!({"resumeToken": session_id, "resumable": true, "status": ExecutorPhase::Running, "lastSeenAt": seen})
        }
        AgentctlEvent::PromptStarted { .. } => {
            json!({"activity": AgentActivity::Working, "lastSeenAt": seen})
        }
        AgentctlEvent::PromptFinished { session_id } => {
            let mut status = json!({"activity": AgentActivity::Idle, "lastSeenAt": seen});
            if let Some(id) = session_id {
                status["resumeToken"] = json!(id);
            }
            status
        }
        AgentctlEvent::AgentExited | AgentctlEvent::Other => return None,
    };
    Some(json!({ "status": patch }))
}

/// The followers currently running, by pod UID.
#[derive(Default)]
pub struct Followers {
    running: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl Followers {
    /// Starts following the pod unless a live follower already does.
    pub fn ensure(&self, client: &Client, pod: &Pod, executor: &str) {
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
        let task = follow(client.clone(), ns, name, executor.to_string()).instrument(span);
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

/// Follows one pod until it is gone; reconnects with exponential backoff (1 s … 30 s).
async fn follow(client: Client, ns: String, pod: String, executor: String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let executors: Api<ExecutorRunning> = Api::namespaced(client, &ns);
    let mut backoff = Duration::from_secs(1);
    loop {
        match pods.get_opt(&pod).await {
            Ok(Some(p))
                if p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") => {}
            Ok(_) => {
                info!("pod is gone or not running; stopping the event follower");
                return;
            }
            Err(err) => warn!(%err, "reading the pod"),
        }
        match stream_events(&pods, &pod, &executors, &executor).await {
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
) -> Result<(), kube::Error> {
    let params = AttachParams::default()
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let mut process = pods.exec(pod, ["agentctl", "events"], &params).await?;
    let Some(stdout) = process.stdout() else {
        return Ok(());
    };
    let mut lines = BufReader::new(stdout).lines();
    info!("following agentctl events");
    while let Ok(Some(line)) = lines.next_line().await {
        let event: AgentctlEvent = match serde_json::from_str(&line) {
            Ok(event) => event,
            Err(err) => {
                warn!(%err, line = %line.chars().take(200).collect::<String>(), "unreadable agentctl event");
                continue;
            }
        };
        debug!(?event, "agentctl event");
        if let Some(patch) = status_patch_for(&event, Timestamp::now()) {
            executors
                .patch_status(executor, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> AgentctlEvent {
        serde_json::from_str(line).expect("event parses")
    }

    #[test]
    fn events_map_to_executor_status() {
        let now = Timestamp::from_second(0).expect("ts");
        let cases = [
            (
                r#"{"event":"session_created","sessionId":"s1","method":"session/new"}"#,
                Some(json!({"resumeToken":"s1","resumable":true,"status":"Running"})),
            ),
            (
                r#"{"event":"prompt_started","sessionId":"s1"}"#,
                Some(json!({"activity":"Working"})),
            ),
            (
                r#"{"event":"prompt_finished","sessionId":"s1","stopReason":"end_turn"}"#,
                Some(json!({"activity":"Idle","resumeToken":"s1"})),
            ),
            (
                r#"{"event":"snapshot","sessionId":null,"promptActive":true}"#,
                Some(json!({"status":"Running","activity":"Working"})),
            ),
            (r#"{"event":"agent_exited","code":1}"#, None),
            (r#"{"event":"something_new"}"#, None),
        ];
        for (line, expected) in cases {
            let patch = status_patch_for(&parse(line), now);
            match (patch, expected) {
                (None, None) => {}
                (Some(patch), Some(expected)) => {
                    for (key, value) in expected.as_object().expect("object") {
                        assert_eq!(&patch["status"][key], value, "{line}: {key}");
                    }
                }
                (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
            }
        }
    }
}
