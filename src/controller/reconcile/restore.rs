//! Steps 4–5 of DESIGN §3 "Resume execution": ACP over exec into the running pod, the restore
//! chosen by the pure rules, what the launch learned recorded in ExecutorRunning, and the end
//! of the launch ([`launch_ended`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::{ExecError, Session};
use crate::acp::budget;
use crate::acp::{AcpTimeouts, PodConnection, RestoreOutcome};
use crate::api::bounds::{AGENT_NAME_MAX, AGENT_TEXT_MAX, BRANCH_MAX, MESSAGE_MAX, cap};
use crate::api::names;
use crate::api::pod_contract::{self, WORKTREE_META, Worktree};
use crate::api::{
    NegotiatedCapabilities, PROMPTED_ANNOTATION, SessionConfigState, SessionState, WorktreeStatus,
};
use crate::controller::error::Error;
use crate::controller::metrics;
use crate::resume::{
    AfterRestore, Configured, InitialPrompt, LaunchEnd, LaunchRecord, ReportedConfig, Requeue,
    RestoreFacts, configured, launch_ended, launched, not_offered, restore_end, set_back,
    wanted_config,
};

impl<'a> Session<'a> {
    /// DESIGN §3 steps 4–5: ACP over exec into the running pod (`initialize`, then the restore
    /// chosen by the pure rules), then the token and the state go back into status.
    pub(super) async fn restore(mut self, pod: &Pod) -> Result<Requeue, Error> {
        let pod_name = pod.name_any();
        let Some(profile) = self.profile() else {
            let end = self.unknown_profile();
            return self.end_launch(end).await;
        };
        let is_resume = self.status.active_resume_request.is_some();
        let fresh = self.fresh_requested();
        let token = self.objects.resume_token().map(str::to_string);
        // STARTING was persisted with the state to return to; rebuilding from it gives the
        // same case (A/B/C) as when the launch began, also after an operator restart.
        let state_at_start = self
            .status
            .previous_state
            .unwrap_or(SessionState::WaitingForInput);
        let request = self.resume_request(&profile, state_at_start);

        let mut connection = match self.open_exec(&pod_name).await {
            Ok(connection) => connection,
            Err(err) => return self.wait_for_agentctl(pod, &err.to_string()).await,
        };
        let client = &mut connection.client;
        let timeouts = AcpTimeouts {
            initialize: self.ctx.settings.acp_timeout,
            session: self.ctx.settings.restore_timeout,
            prompt: Some(self.ctx.settings.acp_timeout),
        };
        let cwd = std::path::PathBuf::from(&self.ts.spec.workspace.mount_path);
        let restore_started = std::time::Instant::now();
        let outcome = client
            .restore(
                token.as_deref(),
                &cwd,
                profile.native_session_resume,
                fresh,
                timeouts,
            )
            .await;
        metrics::global().restore_took(restore_started.elapsed());
        let capabilities = client.negotiated_capabilities();
        let client_unanswered = client.initialize_response().is_none();
        let worktree = reported_worktree(client);
        let config = self.session_configured(&outcome, client.reported_config());
        // The task description, due with a fresh session, is sent once (never again).
        let mut task = None;
        if let RestoreOutcome::Fresh { session_id, .. } = &outcome
            && let InitialPrompt::Send(text) = request.initial_prompt_for_fresh_agent(false)
        {
            task = Some(
                client
                    .start_prompt(session_id, &text)
                    .map_err(|e| cap(&e.to_string(), AGENT_TEXT_MAX).into_owned()),
            );
        }
        connection.close(Duration::from_secs(5)).await;
        let facts = RestoreFacts {
            pod: &pod_name,
            outcome: &outcome,
            answered: !client_unanswered,
            is_resume,
            fresh,
            token: token.as_deref(),
            returns_to: request.previous_state,
            task: task
                .as_ref()
                .map(|sent| sent.as_ref().map(|_| ()).map_err(String::as_str)),
        };
        let end = match restore_end(&facts) {
            AfterRestore::AwaitAgentctl(reason) => {
                return self.wait_for_agentctl(pod, &reason).await;
            }
            AfterRestore::End(end) => end,
        };
        if let LaunchEnd::Running { .. } = &end {
            let prompt_started = matches!(task, Some(Ok(())));
            let session_id = outcome.session_id();
            self.record_executor(
                pod,
                session_id,
                capabilities,
                worktree,
                prompt_started,
                config,
            )
            .await?;
        }
        self.end_launch(end).await
    }

    /// Opens the exec into agentctl for a restore, once this restore's lines are reserved from
    /// the operator's one memory budget (when many restores hold it, this one waits here,
    /// before any deadline, and finishes later). `Err`: why agentctl cannot be reached yet.
    async fn open_exec(&self, pod_name: &str) -> Result<PodConnection, ExecError> {
        let settings = &self.ctx.settings;
        let memory = budget::Held::new(
            settings.acp_memory.clone(),
            budget::connection_need(&settings.acp_limits),
        )
        .await;
        tracing::debug!(pod = %pod_name, "opening the exec for the restore");
        let open_started = std::time::Instant::now();
        let pods_api: Api<Pod> = Api::namespaced(self.ctx.streams.clone(), &self.ns);
        let open = PodConnection::open(&pods_api, pod_name, pod_contract::CONTAINER);
        let mut connection = tokio::time::timeout(settings.acp_timeout, open)
            .await
            .map_err(|_| ExecError::OpenTimeout(settings.acp_timeout))??;
        tracing::debug!(pod = %pod_name, took_ms = open_started.elapsed().as_millis(), "exec open");
        let client = &mut connection.client;
        // Repeated setup requests and the initial prompt of the same launch are answered by
        // agentctl from what it did the first time, without reaching the agent again.
        client.set_launch(self.launch_id());
        // The mode, model and config options wanted (the saved ones, spec.sessionConfig over
        // them): agentctl sets them after the restore, or after a new session.
        let (restored, new) = self.wanted_configs();
        client.set_saved_config(restored);
        client.set_new_config(new);
        client.set_limits(settings.acp_limits);
        client.set_memory(memory);
        Ok(connection)
    }

    /// agentctl does not answer exec yet (`err`): right after the pod turned Running it may not
    /// listen yet (or still clone the repository). The pod's own liveness decides on the next
    /// pass whether this is a launch failure, the launch deadline whether it is stalled. The
    /// condition is written once, not on every try.
    async fn wait_for_agentctl(mut self, pod: &Pod, err: &str) -> Result<Requeue, Error> {
        if let Some(stall) = self.stall(pod, Some(err)) {
            let end = self.stall_end(pod, &stall);
            return self.end_launch(end).await;
        }
        let message = format!("waiting for agentctl in pod {}: {err}", pod.name_any());
        self.keep_waiting("WaitingForAgentctl", &message).await?;
        Ok(Requeue::After(Duration::from_secs(2)))
    }

    /// Writes what the launch learned into ExecutorRunning status ([`launched`]).
    async fn record_executor(
        &mut self,
        pod: &Pod,
        token: Option<&str>,
        capabilities: Option<NegotiatedCapabilities>,
        worktree: Option<Worktree>,
        prompt_started: bool,
        config: Option<Configured>,
    ) -> Result<(), Error> {
        // The checkout agentctl reported (sessions with a repository only); the path is where
        // the agent sees it, the PVC what holds it.
        let worktree = worktree.map(|w| WorktreeStatus {
            id: Some(self.ts.name_any()),
            pvc: Some(names::workspace_claim_name(&self.ts)),
            path: Some(self.ts.spec.workspace.mount_path.clone()),
            branch: w.branch,
            commit: w.commit,
        });
        let pod_name = pod.name_any();
        // The workspace's identity, from the claim cache (the pod needed the PVC to start).
        let claim = self
            .ctx
            .claims
            .get(&ObjectRef::new(&names::workspace_claim_name(&self.ts)).within(&self.ns));
        let workspace_uid = claim.as_ref().and_then(|pvc| pvc.metadata.uid.as_deref());
        let desired = launched(
            &self.objects.executor_status(),
            LaunchRecord {
                pod_name: &pod_name,
                pod_uid: pod.metadata.uid.as_deref(),
                token,
                prompt_started,
                nudge: self.objects.annotation(PROMPTED_ANNOTATION),
                capabilities,
                worktree,
                session_config: config,
                workspace_uid,
                now: Timestamp::now(),
            },
        );
        self.write_executor(&desired, "recording the executor")
            .await
    }

    /// Applies the end of the launch ([`launch_ended`]).
    pub(super) async fn end_launch(self, end: LaunchEnd) -> Result<Requeue, Error> {
        let has_token = self.objects.resume_token().is_some();
        let generation = self.ts.metadata.generation;
        let transition = launch_ended(&self.status, generation, has_token, end, Timestamp::now());
        // Boxed: the reconcile's future embeds this one at every end of a launch; inline, the
        // debug build's poll frames overflowed a worker thread's stack.
        Box::pin(self.apply_transition(transition)).await
    }
}

impl Session<'_> {
    /// The configurations a launch asks agentctl to set: after a restore (the saved one with
    /// spec.sessionConfig laid over it) and after a new session (spec.sessionConfig alone).
    fn wanted_configs(&self) -> (Option<SessionConfigState>, Option<SessionConfigState>) {
        let spec = self.ts.spec.session_config.as_ref();
        let saved = self.objects.executor_status().session_config;
        (
            wanted_config(saved.as_ref(), spec),
            wanted_config(None, spec),
        )
    }

    /// After a restore that left a running agent: the session's configuration once agentctl's
    /// set calls are accepted, and what of the wanted one the agent does not offer (said in a
    /// Warning Event). `None` when the agent's answer said nothing about it.
    fn session_configured(
        &self,
        outcome: &RestoreOutcome,
        reported: Option<ReportedConfig>,
    ) -> Option<Configured> {
        let reported = reported?;
        let (restored, new) = self.wanted_configs();
        let wanted = match outcome {
            RestoreOutcome::Fresh { .. } => new,
            _ => restored,
        };
        let Some(wanted) = wanted else {
            return Some(Configured {
                state: reported.state,
                problem: None,
            });
        };
        let state = configured(&reported, &set_back(&wanted, &reported));
        let missing = not_offered(&wanted, &reported);
        let problem = (!missing.is_empty()).then(|| {
            cap(
                &format!(
                    "the agent does not offer {}; the session runs with what it has",
                    missing.join(", ")
                ),
                MESSAGE_MAX,
            )
            .into_owned()
        });
        if let Some(problem) = &problem {
            tracing::warn!(%problem, "session configuration not applied in full");
            self.event(
                kube::runtime::events::EventType::Warning,
                "SessionConfigNotOffered",
                "Launch",
                problem,
            );
        }
        Some(Configured { state, problem })
    }
}

/// The checkout agentctl reported in `initialize` (`_meta`), bounded like all agent text:
/// without spec.repository, the agent's own `_meta` passes through agentctl.
fn reported_worktree(client: &crate::acp::AcpClient) -> Option<Worktree> {
    client
        .initialize_response()
        .and_then(|init| init.meta.as_ref()?.get(WORKTREE_META).cloned())
        .and_then(|w| serde_json::from_value::<Worktree>(w).ok())
        .map(|w| Worktree {
            branch: w.branch.map(|b| cap(&b, BRANCH_MAX).into_owned()),
            commit: w.commit.map(|c| cap(&c, AGENT_NAME_MAX).into_owned()),
            ..w
        })
}
