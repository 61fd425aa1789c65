//! Approvals in the reconcile: the journal's permission news as Events and metrics, the requests
//! that went with a lost agent, and the answer annotation relayed to agentctl (one exec of
//! `agentctl answer`, paced with the followers' execs). The rules are
//! [`crate::resume::answer_step`] and its siblings.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, AttachParams};
use kube::runtime::events::EventType;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tracing::{info, warn};

use super::Session;
use crate::api::bounds::{AGENT_TEXT_MAX, cap};
use crate::api::{PERMISSION_ANSWER_ANNOTATION, PendingPermission, pod_contract};
use crate::controller::error::Error;
use crate::controller::metrics;
use crate::resume::{
    AgentView, AnswerStep, Note, answer_step, gone_note, handled_value, permission_notes,
};

/// How long `agentctl answer` may take, exec included.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// The most of its output read.
const ANSWER_OUTPUT_MAX: u64 = 8 * 1024;

impl<'a> Session<'a> {
    /// Publishes `note` as an Event on the session.
    pub(super) fn note(&self, note: &Note) {
        let type_ = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.event(type_, note.reason, note.action, &note.message);
    }

    /// The Events and metrics of the journal's permission news (`before`: what waited).
    pub(super) fn publish_permission_news(&self, before: &[PendingPermission], view: &AgentView) {
        for resolution in &view.resolutions {
            metrics::global().permission_resolved(resolution.tool_kind, resolution.outcome);
        }
        for note in permission_notes(before, view, &self.ts.name_any()) {
            self.note(&note);
        }
    }

    /// The requests that waited when the agent's pod went: counted and said in an Event.
    pub(super) fn publish_permissions_gone(&self, pending: &[PendingPermission], why: &str) {
        for request in pending {
            metrics::global()
                .permission_resolved(request.tool_kind, crate::api::PermissionOutcome::Gone);
        }
        if let Some(note) = gone_note(pending, why) {
            self.note(&note);
        }
    }

    /// The answer annotation, when it is new: relayed to agentctl, or refused with a Warning
    /// Event; either way remembered as handled (`handledPermissionAnswer`), so each value is
    /// handled once. An exec that fails is an error: the value stays unhandled and the next
    /// reconcile tries again.
    pub(super) async fn relay_permission_answer(&mut self) -> Result<(), Error> {
        let status = self.objects.executor_status();
        let annotation = self.objects.annotation(PERMISSION_ANSWER_ANNOTATION);
        let pod = self.objects.running_pod().map(ResourceExt::name_any);
        let Some(step) = answer_step(
            annotation,
            status.handled_permission_answer.as_deref(),
            &status.pending_permissions,
            pod.is_some(),
        ) else {
            return Ok(());
        };
        let annotation = annotation.unwrap_or_default().to_owned();
        match step {
            AnswerStep::Relay { id, option_kind } => {
                // Relayed only to a running agent.
                let Some(pod) = pod else { return Ok(()) };
                let result = self
                    .run_answer(&pod, &id, &option_kind)
                    .await
                    .map_err(|message| Error::PermissionRelay {
                        pod: pod.clone(),
                        message,
                    })?;
                match result.get("refused").and_then(Value::as_str) {
                    Some(why) => self.answer_refused(&format!(
                        "permission answer {id}={option_kind} refused by agentctl: {}",
                        cap(why, AGENT_TEXT_MAX)
                    )),
                    None => {
                        info!(request = %id, %option_kind, "permission answer relayed to agentctl")
                    }
                }
            }
            AnswerStep::Refuse { message } => self.answer_refused(&message),
        }
        if self.objects.executor.is_some() {
            let mut desired = self.objects.executor_status();
            desired.handled_permission_answer = Some(handled_value(&annotation));
            self.write_executor(&desired, "remembering the permission answer handled")
                .await?;
        }
        Ok(())
    }

    fn answer_refused(&self, message: &str) {
        warn!(%message, "permission answer refused");
        self.event(
            EventType::Warning,
            "PermissionAnswerRefused",
            "Approve",
            message,
        );
    }

    /// Execs `agentctl answer ID KIND` in the pod; its one result line, parsed.
    async fn run_answer(&self, pod: &str, id: &str, option_kind: &str) -> Result<Value, String> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let params = AttachParams::default()
            .container(pod_contract::CONTAINER)
            .stdin(false)
            .stdout(true)
            .stderr(false);
        let run = async {
            // Within the execs' pace, ahead of idle sessions' catch-ups: a person waits.
            self.ctx.followers.gate().enter(true).await;
            let mut process = pods
                .exec(pod, ["agentctl", "answer", id, option_kind], &params)
                .await
                .map_err(|error| format!("cannot exec agentctl answer in pod {pod}: {error}"))?;
            let stdout = process
                .stdout()
                .ok_or_else(|| format!("the exec of agentctl answer in pod {pod} has no stdout"))?;
            let mut output = String::new();
            stdout
                .take(ANSWER_OUTPUT_MAX)
                .read_to_string(&mut output)
                .await
                .map_err(|error| format!("reading agentctl answer in pod {pod}: {error}"))?;
            Ok::<_, String>(output)
        };
        let output = tokio::time::timeout(ANSWER_WITHIN, run)
            .await
            .map_err(|_| {
                format!("agentctl answer in pod {pod} did not finish within {ANSWER_WITHIN:?}")
            })??;
        let line = output.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        serde_json::from_str(line).map_err(|_| {
            format!(
                "agentctl answer in pod {pod} printed no result line: {}",
                cap(output.trim(), 200)
            )
        })
    }
}
