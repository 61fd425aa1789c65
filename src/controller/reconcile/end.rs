//! `spec.end`: one step per pass ([`end_step`]) until nothing runs, then the session and its
//! task are `COMPLETED` or `CANCELLED` ([`session_finished`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use tracing::{info, warn};

use super::{ExecError, Session};
use crate::acp::{AcpTimeouts, PodConnection};
use crate::api::pod_contract;
use crate::api::{AgentActivity, ExecutorPhase, SessionEnd, names};
use crate::controller::error::{Error, kube_err};
use crate::resume::{
    EndFacts, EndStep, PodLiveness, RECHECK, Requeue, deletes_workspace, end_step, ending_begun,
    ending_since, pod_liveness as liveness, session_finished,
};

impl<'a> Session<'a> {
    /// `spec.end`: one step per pass (the pure [`end_step`]) until nothing runs, then the
    /// session and its task are COMPLETED or CANCELLED. The first pass says so
    /// (`Reconciling=True`, reason `Ending`, which also dates the grace period), ends a latched
    /// resume request, and reads the agent's journal so that a running prompt is known.
    pub(super) async fn end_session(self, end: SessionEnd) -> Result<Requeue, Error> {
        let Some(since) = ending_since(&self.status) else {
            let running_pod = self
                .objects
                .current_pod()
                .filter(|p| liveness(Some(p)) == PodLiveness::Running)
                .and_then(|p| p.metadata.name.clone());
            let transition = ending_begun(
                &self.status,
                end,
                running_pod.as_deref(),
                self.ts.metadata.generation,
                Timestamp::now(),
            );
            return self.apply_transition(transition).await;
        };
        let pod = self.objects.current_pod().cloned();
        let facts = EndFacts {
            end,
            pod: liveness(pod.as_ref()),
            working: self.objects.executor_status().activity == Some(AgentActivity::Working),
            ending_for: Timestamp::now().duration_since(since).unsigned_abs(),
            grace: self.ctx.settings.end_grace,
            has_token: self.objects.resume_token().is_some(),
        };
        let recheck = Duration::from_secs(2);
        match (end_step(&facts), pod) {
            (EndStep::Finish, _) => self.finish_session(end).await,
            (EndStep::AwaitPrompt(left), _) => Ok(Requeue::After(left.min(RECHECK))),
            (EndStep::AwaitPodGone, _) => Ok(Requeue::After(recheck)),
            (EndStep::CancelPrompt, Some(pod)) => {
                if let Err(err) = self.cancel_prompt(&pod).await {
                    warn!(%err, pod = %pod.name_any(), "could not cancel the running prompt; stopping the agent");
                    self.stop_pods().await;
                }
                Ok(Requeue::After(recheck))
            }
            (EndStep::CancelPrompt | EndStep::StopPod, _) => {
                self.stop_pods().await;
                Ok(Requeue::After(recheck))
            }
        }
    }

    /// ACP `session/cancel` for the agent's session, over exec into `pod`.
    async fn cancel_prompt(&self, pod: &Pod) -> Result<(), ExecError> {
        let session = self.objects.resume_token().unwrap_or_default().to_string();
        let pods_api: Api<Pod> = Api::namespaced(self.ctx.streams.clone(), &self.ns);
        let limit = self.ctx.settings.acp_timeout;
        let cancel = async {
            let mut connection =
                PodConnection::open(&pods_api, &pod.name_any(), pod_contract::CONTAINER).await?;
            let client = &mut connection.client;
            client.set_timeouts(AcpTimeouts::uniform(limit));
            let sent = match client.initialize().await {
                Ok(_) => client.cancel(&session).await.map_err(ExecError::from),
                Err(e) => Err(e.into()),
            };
            connection.close(Duration::from_secs(3)).await;
            sent
        };
        match tokio::time::timeout(limit, cancel).await {
            Ok(sent) => {
                info!(pod = %pod.name_any(), %session, "cancelled the running prompt");
                sent
            }
            Err(_) => Err(ExecError::Timeout(limit)),
        }
    }

    /// Deletes every pod of the session that may still run.
    async fn stop_pods(&self) {
        for pod in self.objects.pods.iter().filter(|p| {
            p.metadata.deletion_timestamp.is_none() && liveness(Some(p)) != PodLiveness::Failed
        }) {
            info!(pod = %pod.name_any(), "stopping the agent: the session ends");
            self.pod_deletion(pod).await;
        }
    }

    /// Nothing runs any more: COMPLETED or CANCELLED, the executor `Stopped` and not resumable,
    /// the template's PVC deleted when `workspace.retention` says so, one Event.
    async fn finish_session(mut self, end: SessionEnd) -> Result<Requeue, Error> {
        self.executor_ended(
            ExecutorPhase::Stopped,
            false,
            "marking the executor stopped",
        )
        .await?;
        let claim = names::workspace_claim_name(&self.ts);
        let workspace = &self.ts.spec.workspace;
        let workspace = if deletes_workspace(
            workspace.template.is_some(),
            workspace.retention.unwrap_or_default(),
        ) {
            let pvcs: Api<PersistentVolumeClaim> =
                Api::namespaced(self.ctx.client.clone(), &self.ns);
            match pvcs.delete(&claim, &Default::default()).await {
                Ok(_) => format!("workspace PVC {claim} deleted (retention: Delete)"),
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    format!("workspace PVC {claim} already gone")
                }
                Err(e) => return Err(kube_err("deleting the workspace PVC")(e)),
            }
        } else {
            format!("workspace PVC {claim} kept")
        };
        let transition = session_finished(
            &self.status,
            end,
            &workspace,
            self.ts.metadata.generation,
            Timestamp::now(),
        );
        self.apply_transition(transition).await
    }
}
