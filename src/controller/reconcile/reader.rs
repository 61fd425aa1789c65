//! The history reader pod in the reconcile: gathers the facts of [`reader_step`] (the history
//! request annotation, the session's agent pods, its workspace PVC, its reader pod) and applies
//! the step. Costs nothing while no request is set.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use tracing::info;

use super::Session;
use crate::api::{HISTORY_ANNOTATION, HistoryOutcome, HistoryRequestStatus, names};
use crate::controller::error::{Error, kube_err};
use crate::controller::pods;
use crate::resume::{
    PodLiveness, ReaderFacts, ReaderPod, ReaderStep, ReaderWorkspace, WorkspaceStep, launching,
    pod_liveness, reader_open, reader_step,
};

impl<'a> Session<'a> {
    /// Keeps, deletes or answers for the history reader pod ([`reader_step`]).
    pub(super) async fn serve_history_request(&mut self) -> Result<(), Error> {
        let request = self
            .objects
            .annotation(HISTORY_ANNOTATION)
            .map(String::from);
        let reader = self.objects.reader.clone();
        if request.is_none() && reader.is_none() {
            return Ok(());
        }
        let answered = self
            .status
            .history_request
            .as_ref()
            .map(|h| h.token.clone());
        let open = reader_open(request.as_deref(), answered.as_deref());
        let agent = launching(&self.status)
            || self.objects.pods.iter().any(|pod| {
                matches!(
                    pod_liveness(Some(pod)),
                    PodLiveness::Running | PodLiveness::Pending
                )
            });
        // The PVC is only looked up for a request that may need it.
        let workspace = if open && !agent {
            self.reader_workspace().await?
        } else {
            ReaderWorkspace::Present
        };
        let step = reader_step(&ReaderFacts {
            request: request.as_deref(),
            answered: answered.as_deref(),
            agent,
            workspace,
            reader: reader.as_ref().map(|pod| match pod_liveness(Some(pod)) {
                PodLiveness::Terminating => ReaderPod::Leaving,
                PodLiveness::Failed => ReaderPod::Ended,
                _ => ReaderPod::Live,
            }),
            reader_token: reader.as_ref().and_then(|pod| {
                pod.annotations()
                    .get(HISTORY_ANNOTATION)
                    .map(String::as_str)
            }),
        });
        match step {
            ReaderStep::Nothing => {}
            ReaderStep::Create => {
                let token = request.unwrap_or_default();
                self.create_reader(&token).await?;
            }
            ReaderStep::Delete => {
                if let Some(pod) = &reader {
                    self.delete_reader(pod).await;
                }
            }
            ReaderStep::Answer {
                outcome,
                message,
                delete,
            } => {
                let token = request.unwrap_or_default();
                self.answer_history_request(&token, outcome, &message)
                    .await?;
                if let Some(pod) = reader.as_ref().filter(|_| delete) {
                    self.delete_reader(pod).await;
                }
            }
        }
        Ok(())
    }

    /// Whether the workspace the session ran on is there to be mounted: the launch's own
    /// judgement ([`Self::workspace_now`]); a PVC a launch would create or wait for holds no
    /// transcript either.
    async fn reader_workspace(&self) -> Result<ReaderWorkspace, Error> {
        Ok(match self.workspace_now().await? {
            WorkspaceStep::Ready => ReaderWorkspace::Present,
            WorkspaceStep::Lost(why) | WorkspaceStep::Missing(why) => ReaderWorkspace::Gone(why),
            WorkspaceStep::Create => ReaderWorkspace::Gone(format!(
                "workspace PVC {:?} does not exist yet: no agent has run on it",
                names::workspace_claim_name(&self.ts)
            )),
        })
    }

    async fn create_reader(&mut self, token: &str) -> Result<(), Error> {
        let pod = pods::build_reader_pod(&self.ts, &self.ctx.settings.pod, token);
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                info!(pod = %name, "created a history reader pod");
                let note =
                    format!("created history reader pod {name} (workspace read-only, no agent)");
                self.event(
                    EventType::Normal,
                    "HistoryReaderStarted",
                    "ReadHistory",
                    &note,
                );
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                let message = format!(
                    "the API server refused history reader pod {name}: {}",
                    e.message
                );
                self.answer_history_request(token, HistoryOutcome::Refused, &message)
                    .await
            }
            Err(source) => Err(kube_err("creating the history reader pod")(source)),
        }
    }

    /// Deletes the reader pod of that UID ([`Self::delete_pod_by_uid`]: a 404 or a changed pod
    /// is left alone, and the next pass sees it terminating even while the cache lags).
    async fn delete_reader(&self, pod: &Pod) {
        if self.delete_pod_by_uid(pod, false).await {
            info!(pod = %pod.name_any(), "deleted the history reader pod");
        }
    }

    /// Records the answer in `status.historyRequest` (the rest of the pass builds on the status
    /// written) and says it in an Event when it is a problem.
    async fn answer_history_request(
        &mut self,
        token: &str,
        outcome: HistoryOutcome,
        message: &str,
    ) -> Result<(), Error> {
        self.status.history_request = Some(HistoryRequestStatus {
            token: token.to_string(),
            outcome,
            message: message.to_string(),
        });
        self.write_status().await?;
        self.objects.session.status = Some(self.status.clone());
        if matches!(
            outcome,
            HistoryOutcome::WorkspaceGone | HistoryOutcome::Refused
        ) {
            self.event(
                EventType::Warning,
                "HistoryUnavailable",
                "ReadHistory",
                message,
            );
        }
        Ok(())
    }
}
