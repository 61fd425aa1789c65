//! Steps 1–3 of DESIGN §3 "Resume execution" (the initial launch takes the same path): the
//! launch's step ([`launch_step`]), the ExecutorRunning, the workspace and the pod. The rules of
//! `crate::resume` decide; this carries their answer out.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use super::{MANAGER, Session, fault_point};
use crate::agents::AgentProfile;
use crate::api::conditions::{self, Want};
use crate::api::pod_contract::CheckoutStart;
use crate::api::{ExecutorRunning, SessionState, names};
use crate::controller::error::{Error, kube_err, sort_refusal};
use crate::controller::pods;
use crate::resume::{
    Begin, ClaimSeen, LaunchEnd, LaunchFacts, LaunchStall, LaunchStep, LaunchStop, RECHECK,
    Refusal, Requeue, WorkspaceFacts, WorkspaceStep, at_deadline, launch_begun, launch_stall,
    launch_step, launch_stopped, previous_pod_alive, profile_wait, refusal, workspace_step,
    workspace_wait,
};

/// The workspace PVC once a launch has looked at it (and made it from the template).
enum Workspace {
    Ready,
    /// The launch ends here (a lost workspace, a PVC the API server refused).
    Stop(LaunchEnd),
    /// A claimed PVC does not exist (yet), or is being deleted: what is missing.
    Missing(String),
}

impl<'a> Session<'a> {
    /// The next step of the launch, from the pods the caches show ([`launch_step`]).
    pub(super) async fn launch(self) -> Result<Requeue, Error> {
        let starting = self.status.state == SessionState::Starting;
        let launch_name = self.launch_pod_name();
        let launch_pod = self.launch_pod().cloned();
        let previous = previous_pod_alive(&self.objects.pods, &launch_name).cloned();
        let now = Timestamp::now();
        let facts = LaunchFacts {
            starting,
            launch_pod: launch_pod.as_ref(),
            created_unseen: starting
                && self
                    .ctx
                    .expectations
                    .awaits_created(&self.uid, |name| self.pod_named(name).is_some()),
            previous_alive: previous.as_ref(),
            previous_deleted_ago: previous
                .as_ref()
                .and_then(|p| p.metadata.deletion_timestamp.as_ref())
                .map(|at| now.duration_since(at.0).unsigned_abs()),
            age: launch_pod
                .as_ref()
                .filter(|p| p.metadata.creation_timestamp.is_some())
                .map(pod_age),
            deadline: self.ctx.settings.launch_deadline,
        };
        let stop = match launch_step(&facts) {
            LaunchStep::Begin => return self.start_launch().await,
            LaunchStep::AwaitCreated => return Ok(Requeue::After(RECHECK)),
            LaunchStep::DeletePrevious(previous) => {
                return self.delete_previous_pod(previous).await;
            }
            LaunchStep::WaitForPrevious {
                pod,
                until_deadline,
            } => return self.wait_for_previous_pod(pod, until_deadline).await,
            LaunchStep::CreatePod => return self.create_pod().await,
            LaunchStep::AwaitRunning { until_deadline } => {
                return Ok(at_deadline(until_deadline));
            }
            LaunchStep::Restore(pod) => return self.restore(pod).await,
            LaunchStep::Stalled(pod, stall) => self.stall_end(pod, &stall),
            LaunchStep::CheckoutFailed(pod, stall) => self.stopped(LaunchStop::CheckoutFailed {
                pod: &pod.name_any(),
                stall: &stall,
            }),
            LaunchStep::LostWhileStarting(pod, lost) => {
                self.stopped(LaunchStop::LostWhileStarting {
                    pod: &pod.name_any(),
                    lost,
                })
            }
        };
        self.end_launch(stop).await
    }

    /// The end of a launch that stopped for `stop` ([`launch_stopped`]).
    pub(super) fn stopped(&self, stop: LaunchStop) -> LaunchEnd {
        launch_stopped(stop, self.objects.resume_token().is_some())
    }

    /// The end of a launch whose `pod` did not reach a running agentctl within the deadline.
    pub(super) fn stall_end(&self, pod: &Pod, stall: &LaunchStall) -> LaunchEnd {
        self.stopped(LaunchStop::Stalled {
            pod: &pod.name_any(),
            stall,
        })
    }

    /// The launch's stall, once the launch deadline has passed since `pod` was created.
    pub(super) fn stall(&self, pod: &Pod, agentctl_error: Option<&str>) -> Option<LaunchStall> {
        pod.metadata.creation_timestamp.as_ref()?;
        let deadline = self.ctx.settings.launch_deadline;
        launch_stall(pod, pod_age(pod), deadline, agentctl_error)
    }

    /// The agent profile with the session's capability overrides applied; `None` when the
    /// operator does not know the profile ([`Self::unknown_profile`]).
    pub(super) fn profile(&self) -> Option<AgentProfile> {
        let mut profile = self.ctx.agents.get(&self.ts.spec.agent)?.clone();
        if let Some(overrides) = &self.ts.spec.capabilities {
            if let Some(native) = overrides.native_session_resume {
                profile.native_session_resume = native.into();
            }
            if let Some(injection) = overrides.history_context_injection {
                profile.history_context_injection = injection;
            }
        }
        Some(profile)
    }

    /// The end of a launch whose agent profile the operator does not know.
    pub(super) fn unknown_profile(&self) -> LaunchEnd {
        let known: Vec<&str> = self.ctx.agents.names().collect();
        self.stopped(LaunchStop::UnknownProfile {
            agent: &self.ts.spec.agent,
            known: &known,
        })
    }

    /// A pod of an earlier launch that nothing deletes (a superseded request's, created before
    /// the cache showed it) would keep this launch waiting for good: the status says so, then
    /// the pod is deleted (by UID: only the pod that was judged), and its deletion's watch
    /// event moves the launch on.
    async fn delete_previous_pod(mut self, previous: &Pod) -> Result<Requeue, Error> {
        let message = format!(
            "deleting pod {} of an earlier launch before starting agentctl pod {}",
            previous.name_any(),
            self.launch_pod_name()
        );
        self.keep_waiting("ReplacingPreviousPod", &message).await?;
        if self.delete_pod_by_uid(previous, false).await {
            info!(pod = %previous.name_any(), "deleted the pod of an earlier launch");
        }
        Ok(Requeue::After(Duration::from_secs(2)))
    }

    /// The launch waits until `previous` is gone (its deletion reconciles again), at most
    /// `until_deadline` before it looks again.
    async fn wait_for_previous_pod(
        mut self,
        previous: &Pod,
        until_deadline: Duration,
    ) -> Result<Requeue, Error> {
        let message = format!(
            "waiting for pod {} of an earlier launch to be gone before starting agentctl pod {}",
            previous.name_any(),
            self.launch_pod_name()
        );
        self.keep_waiting("WaitingForPreviousPod", &message).await?;
        Ok(at_deadline(until_deadline))
    }

    /// The launch waits: `Reconciling=True` with `reason`, written once, not on every pass.
    pub(super) async fn keep_waiting(&mut self, reason: &str, message: &str) -> Result<(), Error> {
        let before = self.status.clone();
        self.status.conditions = conditions::merge(
            &self.status.conditions,
            &[Want::new(conditions::RECONCILING, true, reason, message)],
            self.ts.metadata.generation,
            Timestamp::now(),
        );
        if self.status != before {
            self.write_status().await?;
        }
        Ok(())
    }

    /// Builds the request, makes sure the ExecutorRunning and the workspace exist, and persists
    /// `STARTING` with the state to return to — before any pod exists.
    async fn start_launch(mut self) -> Result<Requeue, Error> {
        let Some(profile) = self.profile() else {
            // A first launch waits for its profile; a resume request ends stalled.
            if self.status.state == SessionState::Created
                && self.status.active_resume_request.is_none()
            {
                let known: Vec<&str> = self.ctx.agents.names().collect();
                let transition = profile_wait(
                    &self.status,
                    &self.ts.spec.agent,
                    &known,
                    self.ts.metadata.generation,
                    Timestamp::now(),
                );
                return self.apply_transition(transition).await;
            }
            let end = self.unknown_profile();
            return self.end_launch(end).await;
        };
        let request = self.resume_request(&profile, self.status.state);
        self.status.previous_state = Some(request.previous_state);
        if let Some(end) = self.ensure_executor().await? {
            return self.end_launch(end).await;
        }
        match self.ensure_workspace().await? {
            Workspace::Ready => {}
            Workspace::Stop(end) => return self.end_launch(end).await,
            Workspace::Missing(what) => return self.wait_for_workspace(&what).await,
        }
        let pod = self.launch_pod_name();
        let begin = Begin {
            pod: &pod,
            launch_id: self.launch_id(),
            executor: &names::executor_name(&self.ts),
        };
        let transition = launch_begun(
            &self.status,
            &begin,
            self.ts.metadata.generation,
            Timestamp::now(),
        );
        self.apply_effects(&transition).await?;
        fault_point("starting");
        // STARTING is persisted and this reconcile holds the newest status: the next step (the
        // pod, normally) needs no round trip through the cache. The pod's name is fixed by the
        // request, so a step repeated by a later reconcile adopts it instead of doubling it.
        Box::pin(self.launch()).await
    }

    /// The session's ExecutorRunning, created once (one made by an earlier pass is fine); the
    /// end of the launch when the API server refuses it.
    async fn ensure_executor(&mut self) -> Result<Option<LaunchEnd>, Error> {
        if self.objects.executor.is_some() {
            return Ok(None);
        }
        let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match api
            .create(&PostParams::default(), &pods::build_executor(&self.ts))
            .await
        {
            Ok(er) => {
                self.ctx.expectations.wrote_executor(&self.uid, None, &er);
                self.objects.executor = Some(er);
            }
            Err(err) => match sort_refusal("creating the ExecutorRunning")(err)? {
                (Refusal::Exists, _) => {}
                (Refusal::Final | Refusal::Retry, message) => {
                    let refusal = format!("the API server refused the ExecutorRunning: {message}");
                    return Ok(Some(
                        self.stopped(LaunchStop::InvalidSpec { refusal: &refusal }),
                    ));
                }
            },
        }
        Ok(None)
    }

    /// The session's workspace PVC as it is now, judged by [`workspace_step`]: the claim cache
    /// answers, only a miss is confirmed live (it may be a moment old). For a launch, and for a
    /// history reader, which mounts the same workspace or none.
    pub(super) async fn workspace_now(&self) -> Result<WorkspaceStep, Error> {
        let claim = names::workspace_claim_name(&self.ts);
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let seen = |meta: &kube::api::ObjectMeta| {
            let seen = match meta.deletion_timestamp {
                Some(_) => ClaimSeen::Deleting,
                None => ClaimSeen::Present,
            };
            (seen, meta.uid.clone())
        };
        let cached = self
            .ctx
            .claims
            .get(&ObjectRef::new(&claim).within(&self.ns));
        let (seen, uid) = match cached {
            Some(pvc) => seen(&pvc.metadata),
            None => pvcs
                .get_metadata_opt(&claim)
                .await
                .map_err(kube_err("reading the workspace PVC"))?
                .map_or((ClaimSeen::Absent, None), |pvc| seen(&pvc.metadata)),
        };
        let executor = self.objects.executor_status();
        Ok(workspace_step(&WorkspaceFacts {
            claim: &claim,
            namespace: &self.ns,
            seen,
            ran_before: executor.pod_uid.is_some(),
            recorded_uid: executor.workspace_uid.as_deref(),
            uid: uid.as_deref(),
            from_template: self.ts.spec.workspace.template.is_some(),
        }))
    }

    /// The workspace PVC before a launch ([`Self::workspace_now`]); the PVC of a template is
    /// created here.
    async fn ensure_workspace(&self) -> Result<Workspace, Error> {
        let claim = names::workspace_claim_name(&self.ts);
        let template = pods::build_workspace_claim(&self.ts);
        let pvc = match (self.workspace_now().await?, template) {
            (WorkspaceStep::Ready, _) => return Ok(Workspace::Ready),
            (WorkspaceStep::Missing(what), _) => return Ok(Workspace::Missing(what)),
            (WorkspaceStep::Lost(reason), _) => {
                let lost = LaunchStop::WorkspaceLost { reason: &reason };
                return Ok(Workspace::Stop(self.stopped(lost)));
            }
            (WorkspaceStep::Create, Some(pvc)) => pvc,
            (WorkspaceStep::Create, None) => return Ok(Workspace::Ready),
        };
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match pvcs.create(&PostParams::default(), &pvc).await {
            Ok(_) => {
                let note = format!("created PVC {claim}");
                self.event(EventType::Normal, "WorkspaceCreated", "Launch", &note);
                Ok(Workspace::Ready)
            }
            Err(err) => match sort_refusal("creating the workspace PVC")(err)? {
                (Refusal::Exists, _) => Ok(Workspace::Ready),
                (Refusal::Final | Refusal::Retry, message) => {
                    let refusal =
                        format!("the API server refused workspace PVC {claim}: {message}");
                    let stop = LaunchStop::InvalidSpec { refusal: &refusal };
                    Ok(Workspace::Stop(self.stopped(stop)))
                }
            },
        }
    }

    /// A first launch waits for its claimed workspace PVC ([`workspace_wait`]).
    async fn wait_for_workspace(mut self, what: &str) -> Result<Requeue, Error> {
        // Nothing is launching yet: the state to return to is not persisted.
        self.status.previous_state = self.ts.status.as_ref().and_then(|s| s.previous_state);
        let age = self
            .ts
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
            .unwrap_or_default();
        let transition = workspace_wait(
            &self.status,
            what,
            age,
            self.ctx.settings.launch_deadline,
            self.ts.metadata.generation,
            Timestamp::now(),
        );
        self.apply_transition(transition).await
    }

    /// The pod of the launch, after its network policy; one that an earlier run of this step
    /// created is adopted, if it is ours.
    async fn create_pod(self) -> Result<Requeue, Error> {
        let Some(profile) = self.profile() else {
            let end = self.unknown_profile();
            return self.end_launch(end).await;
        };
        if let Some(refusal) = pods::image_refusal(&self.ts, &self.ctx.settings.pod) {
            let end = self.stopped(LaunchStop::InvalidSpec { refusal: &refusal });
            return self.end_launch(end).await;
        }
        if let Some(end) = self.apply_network_policy().await? {
            return self.end_launch(end).await;
        }
        // A session whose checkout was recorded started before: its workspace must hold it.
        let start = if self.objects.executor_status().worktree.is_some() {
            CheckoutStart::Later
        } else {
            CheckoutStart::First
        };
        let pod = pods::build_agentctl_pod(
            &self.ts,
            self.launch_id(),
            &self.ctx.settings.pod,
            &profile,
            start,
        );
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let refused = match api.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                self.ctx.expectations.created_pod(&self.uid, &name);
                info!(pod = %name, "created the agentctl pod");
                fault_point("pod-created");
                None
            }
            Err(err) => match sort_refusal("creating the agentctl pod")(err)? {
                (Refusal::Exists, _) => self.adopt_pod(&api, &name).await?,
                (Refusal::Final | Refusal::Retry, message) => {
                    let refusal = format!("the API server refused agentctl pod {name}: {message}");
                    Some(self.stopped(LaunchStop::InvalidSpec { refusal: &refusal }))
                }
            },
        };
        match refused {
            Some(end) => self.end_launch(end).await,
            None => Ok(Requeue::After(RECHECK)),
        }
    }

    /// A pod of the launch's name exists: created by an earlier run of this step, it is adopted
    /// (its phase is judged like any pod of this launch once the cache has it); another's ends
    /// the launch (`PodNameTaken`).
    async fn adopt_pod(&self, api: &Api<Pod>, name: &str) -> Result<Option<LaunchEnd>, Error> {
        let existing = api
            .get_opt(name)
            .await
            .map_err(kube_err("reading the existing agentctl pod"))?;
        match existing {
            Some(pod) if !pods::controlled_by(&pod, &self.ts) => {
                Ok(Some(self.stopped(LaunchStop::PodNameTaken { pod: name })))
            }
            _ => {
                info!(pod = %name, "adopting existing agentctl pod");
                Ok(None)
            }
        }
    }

    /// The network policy before the pod, so the agent never runs without it (once per session
    /// and operator run: a resume does not write it again). Applied, not created: a policy of
    /// that name left by an older operator, or changed by hand, is set back to this one. The
    /// end of the launch when the API server refuses it (among others: a policy of that name
    /// controlled by another owner).
    async fn apply_network_policy(&self) -> Result<Option<LaunchEnd>, Error> {
        let Some(rules) = &self.ctx.settings.pod.network else {
            return Ok(None);
        };
        if self.ctx.expectations.has_policy(&self.uid) {
            return Ok(None);
        }
        let policy = pods::build_network_policy(&self.ts, rules);
        let api: Api<NetworkPolicy> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let name = policy.name_any();
        let params = PatchParams::apply(MANAGER).force();
        match api.patch(&name, &params, &Patch::Apply(&policy)).await {
            Ok(_) => {
                info!(policy = %name, "applied the NetworkPolicy");
                self.ctx.expectations.policy_exists(&self.uid);
                Ok(None)
            }
            Err(kube::Error::Api(e)) if refusal(e.code, &e.message) == Refusal::Final => {
                let refusal = format!("the API server refused NetworkPolicy {name}: {}", e.message);
                Ok(Some(
                    self.stopped(LaunchStop::InvalidSpec { refusal: &refusal }),
                ))
            }
            Err(e) => Err(kube_err("applying the NetworkPolicy")(e)),
        }
    }
}

/// How long ago `pod` was created (zero when it does not say).
fn pod_age(pod: &Pod) -> Duration {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|created| Duration::try_from(Timestamp::now().duration_since(created.0)).ok())
        .unwrap_or_default()
}
