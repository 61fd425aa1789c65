//! One reconcile of a TaskSession: a pipeline of steps, each of which persists what it did
//! before the next one acts, so an operator restart at any point resumes where it stopped. The
//! pure rules of `crate::resume` decide; this applies what they return.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::context::Context;
use super::error::{Error, conflict_or, executor_conflict_or};
use super::events::OutgoingEvent;
use super::metrics;
use super::pods;
use crate::agents::AgentProfile;
use crate::api::bounds::{MESSAGE_MAX, cap};
use crate::api::names;
use crate::api::{
    ExecutorPhase, ExecutorRunning, ExecutorRunningStatus, PROMPTED_ANNOTATION, RESUME_ANNOTATION,
    SESSION_LABEL, SessionState, TaskSession, TaskSessionStatus,
};
use crate::resume::{
    INITIAL_LAUNCH, Metric, NextAction, NodeHealth, ReachFacts, RequestAnswer, Requeue,
    ResumeRequest, ResumeRequestFacts, RunningRequest, SessionObjects, Transition, answer_request,
    build_resume_request, ended, ending, is_controlled_by, is_new_resume_request, journal_update,
    launching, leftovers, merge_patch, node_health, not_ready_since, observe,
    request_meets_running_pod, running_request, unknown_to_schema,
};

/// The field manager of the operator's writes: the TaskSession's and the ExecutorRunning's
/// status (server-side apply; the reconciler is the one writer of both), the finalizer, and
/// the objects the operator applies.
pub const MANAGER: &str = "kandev-operator";
/// Finalizer that lets the operator stop its event followers before a session goes away.
pub const FINALIZER: &str = "kandev.dev/cleanup";
/// Annotation asking the next resume to ignore the saved token and start fresh.
pub use crate::api::RESUME_FRESH_ANNOTATION;

mod approval;
mod end;
mod launch;
mod reader;
mod restore;

/// Why an exec into agentctl got no answer.
#[derive(Debug, thiserror::Error)]
enum ExecError {
    #[error(transparent)]
    Acp(#[from] crate::acp::AcpError),
    #[error("opening the exec did not finish within {0:?}")]
    OpenTimeout(Duration),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Everything one reconcile knows about a session.
pub(super) struct Session<'a> {
    ctx: &'a Context,
    ts: Arc<TaskSession>,
    name: String,
    ns: String,
    uid: String,
    /// The version every status write is based on: the cached one, then each write's result.
    resource_version: Option<String>,
    /// The status this reconcile works on (written by [`Self::write_status`]).
    status: TaskSessionStatus,
    /// The session, its ExecutorRunning and the pods it controls, from the caches.
    objects: SessionObjects,
}

impl<'a> Session<'a> {
    /// Reads the session's ExecutorRunning and pods (those whose controller is this session, by
    /// UID: labels alone prove nothing) from the caches; a pod this operator just deleted counts
    /// as terminating even while the cache lags ([`Expectations::mark_deleted`]), and the
    /// ExecutorRunning it just wrote is read as written ([`Expectations::executor`]).
    pub(super) fn load(ts: Arc<TaskSession>, ctx: &'a Context) -> Result<Session<'a>, Error> {
        let ns = ts.namespace().ok_or(Error::NoNamespace)?;
        let name = ts.name_any();
        let uid = ts.uid().unwrap_or_default();
        let cached = ctx
            .executors
            .get(&ObjectRef::new(&names::executor_name(&ts)).within(&ns));
        let executor = ctx
            .expectations
            .executor(&uid, cached)
            .map(Arc::unwrap_or_clone);
        // Found through the index, not by going through every pod of the cache.
        let mut candidates = ctx
            .pod_index
            .controlled_by(&uid)
            .iter()
            .filter_map(|pod| ctx.pods.get(pod))
            .filter(|pod| {
                pod.metadata.namespace.as_deref() == Some(ns.as_str())
                    && is_controlled_by(pod, Some(uid.as_str()))
            })
            .map(Arc::unwrap_or_clone)
            .collect::<Vec<Pod>>();
        ctx.expectations
            .mark_deleted(&uid, &mut candidates, Timestamp::now());
        let objects = SessionObjects::new(&ns, (*ts).clone(), executor, candidates);
        let status = ts.status.clone().unwrap_or_default();
        Ok(Session {
            ctx,
            resource_version: ts.metadata.resource_version.clone(),
            ts,
            name,
            ns,
            uid,
            status,
            objects,
        })
    }

    /// DESIGN §3 step 2, from what the session holds now.
    fn resume_request(&self, profile: &AgentProfile, state_at_loss: SessionState) -> ResumeRequest {
        build_resume_request(&ResumeRequestFacts {
            state_at_loss,
            resume_token: self.objects.resume_token(),
            task_description: self.ts.spec.task_description.as_deref().unwrap_or_default(),
            fresh: self.fresh_requested(),
            profile_history_injection: profile.history_context_injection,
        })
    }

    /// The user asked this resume to ignore the saved token: `kandev.dev/resume-fresh` carries
    /// the token of the request being handled (per request, so a leftover flag never makes a
    /// later resume fresh).
    fn fresh_requested(&self) -> bool {
        self.status
            .active_resume_request
            .as_deref()
            .is_some_and(|active| self.objects.annotation(RESUME_FRESH_ANNOTATION) == Some(active))
    }

    /// The launch in progress: the latched resume token, or the initial launch.
    fn launch_id(&self) -> &str {
        self.status
            .active_resume_request
            .as_deref()
            .unwrap_or(INITIAL_LAUNCH)
    }

    /// The deterministic name of the current launch's pod.
    fn launch_pod_name(&self) -> String {
        names::pod_name(&self.name, self.launch_id())
    }

    /// The pod of the current launch, looked up by its deterministic name (hints such as
    /// `podName` are not trusted).
    fn launch_pod(&self) -> Option<&Pod> {
        self.pod_named(&self.launch_pod_name())
    }

    /// This session's pod of that name.
    fn pod_named(&self, name: &str) -> Option<&Pod> {
        self.objects
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    }

    /// Pods that carry this session's labels but are not controlled by it are ignored (labels
    /// prove nothing); each is reported once, as a Warning Event.
    fn report_decoys(&self) {
        let label = names::session_label_value(&self.name);
        let decoys = self
            .ctx
            .pod_index
            .labelled(&self.ns, &label)
            .iter()
            .filter_map(|pod| self.ctx.pods.get(pod))
            .filter(|pod| {
                pod.labels().get(SESSION_LABEL) == Some(&label)
                    && !pods::controlled_by(pod, &self.ts)
            })
            .collect::<Vec<_>>();
        for pod in decoys {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if self.ctx.expectations.report_decoy(&uid) {
                let note = format!(
                    "pod {} carries this session's labels but is not controlled by it: ignored",
                    pod.name_any()
                );
                warn!(pod = %pod.name_any(), "decoy pod ignored");
                self.event(EventType::Warning, "DecoyPod", "Observe", &note);
            }
        }
    }

    /// Reads `pod`'s event journal (and follows it while the agent works), unless that was done
    /// recently for the same `nudge` ([`Followers::ensure`]).
    fn follow(&self, pod: &Pod, nudge: Option<&str>) {
        self.ctx.followers.ensure(
            &self.ctx.streams,
            pod,
            ObjectRef::from_obj(&*self.ts),
            &self.objects.executor_status(),
            nudge,
        );
    }

    /// Stops following the events of this session's pods; returns how many pods it has.
    fn unfollow(&self) -> usize {
        let uids: Vec<&str> = self
            .objects
            .pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.ctx.followers.retain(|uid| !uids.contains(&uid));
        uids.len()
    }

    /// The session is being deleted: stop following its pods' events (the pods, PVC from the
    /// template and ExecutorRunning go with it through their ownerReferences).
    pub(super) fn cleanup(self) -> Requeue {
        let pods = self.unfollow();
        self.ctx.expectations.forget(&self.uid);
        info!(pods, "session deleted; stopped following its agentctl pods");
        Requeue::AwaitChange
    }

    pub(super) async fn apply(mut self) -> Result<Requeue, Error> {
        self.report_decoys();
        self.write_journal_news().await?;
        self.relay_permission_answer().await?;
        // Boxed: its future is large and rarely needed, and a reconcile's stack is not.
        Box::pin(self.serve_history_request()).await?;
        if let Some(end) = ending(self.ts.spec.end, &self.status) {
            return self.end_session(end).await;
        }
        if let Some(token) = self.new_resume_request() {
            if self.request_on_running_pod() == Some(RunningRequest::Wait) {
                return self.observe().await;
            }
            let latched_pod = self.launch_pod().map(ResourceExt::name_any);
            match answer_request(
                &self.objects,
                &self.status,
                &token,
                latched_pod.as_deref(),
                Timestamp::now(),
            ) {
                RequestAnswer::Done(transition) => return self.apply_transition(transition).await,
                RequestAnswer::Latched(transition) => self.apply_effects(&transition).await?,
            }
        }
        if launching(&self.status) {
            return self.launch().await;
        }
        self.observe().await
    }

    /// A new resume request while the session's pod runs and no request is latched: "already
    /// running" only while the pod is Ready and its node not in doubt ([`running_request`]).
    /// Otherwise the request stays unhandled and the steady state goes on (it deletes a pod
    /// that counts as lost) until the pod is Ready again or gone, and the request resumes it.
    fn request_on_running_pod(&self) -> Option<RunningRequest> {
        let facts = self
            .reach_facts()
            .filter(|_| request_meets_running_pod(&self.status))?;
        Some(running_request(&facts, Timestamp::now()))
    }

    /// The annotation's token when it has not been handled and is not being handled.
    fn new_resume_request(&self) -> Option<String> {
        let token = self.objects.annotation(RESUME_ANNOTATION)?;
        is_new_resume_request(token, &self.status).then(|| token.to_string())
    }

    /// Deletes `pod`, on the condition that it is still the pod of that UID (only the pod that
    /// was judged goes); `force`: with grace period 0, for a lost node whose kubelet never
    /// confirms. Whether the API server accepted the deletion (a pod already gone, or replaced
    /// by another of the same name, is left alone).
    async fn delete_pod_by_uid(&self, pod: &Pod, force: bool) -> bool {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let params = DeleteParams {
            grace_period_seconds: force.then_some(0),
            preconditions: pod.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match pods.delete(&pod.name_any(), &params).await {
            Ok(_) => {
                self.ctx.expectations.pod_gone(&self.uid, &pod.name_any());
                if let Some(uid) = &pod.metadata.uid {
                    self.ctx.expectations.deleted_pod(&self.uid, uid);
                }
                true
            }
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => false,
            Err(err) => {
                warn!(%err, pod = %pod.name_any(), "could not delete an agentctl pod");
                false
            }
        }
    }

    /// What the operator knows about the reachability of the session's running pod: its Ready
    /// condition (the kubelet's readiness probe of agentctl) and its node, from the caches.
    fn reach_facts(&self) -> Option<ReachFacts> {
        let pod = self.objects.running_pod()?;
        let settings = &self.ctx.settings;
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let node = match &self.ctx.nodes {
            Some(nodes) if !node_name.is_empty() => {
                let listed = nodes
                    .wait_until_ready()
                    .now_or_never()
                    .is_some_and(|r| r.is_ok());
                let cached = nodes.get(&ObjectRef::new(&node_name));
                node_health(pod, cached.as_deref(), listed)
            }
            _ => NodeHealth::Unknown,
        };
        // The launch's restore answered at the executor's lastSeenAt (of this pod only).
        let executor = self.objects.executor_status();
        let seen_alive = executor
            .last_seen_at
            .filter(|_| executor.pod_uid.is_some() && executor.pod_uid == pod.metadata.uid)
            .map(|t| t.0);
        Some(ReachFacts {
            pod: pod.name_any(),
            node_name,
            not_ready_since: not_ready_since(pod, seen_alive),
            unreachable_after: settings.agent_unreachable_after,
            node,
            node_lost_after: settings.node_lost_after,
        })
    }

    /// Deletes `pod` when awaited: after the status that explains why is written.
    fn pod_deletion(&self, pod: &Pod) -> impl Future<Output = ()> + use<'a> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let pod_name = pod.name_any();
        let pod_uid = pod.metadata.uid.clone();
        let (expectations, session) = (&self.ctx.expectations, self.uid.clone());
        async move {
            match pods.delete(&pod_name, &Default::default()).await {
                Ok(_) => {
                    expectations.pod_gone(&session, &pod_name);
                    if let Some(uid) = &pod_uid {
                        expectations.deleted_pod(&session, uid);
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    expectations.pod_gone(&session, &pod_name)
                }
                Err(err) => {
                    warn!(%err, pod = %pod_name, "could not delete the agentctl pod of a launch that did not finish")
                }
            }
        }
    }

    /// The steady state: the pure [`observe`] decides, this applies its transition.
    async fn observe(self) -> Result<Requeue, Error> {
        let reach = self.reach_facts();
        let transition = observe(&self.objects, reach.as_ref(), Timestamp::now());
        self.apply_transition(transition).await
    }

    /// Applies a transition: the executor marked lost first (the session's status never claims
    /// more than its executor), then the status when it changed, then the pod deletion it
    /// explains, the metric and the Event.
    async fn apply_transition(mut self, transition: Transition) -> Result<Requeue, Error> {
        self.apply_effects(&transition).await?;
        Ok(transition.requeue)
    }

    async fn apply_effects(&mut self, transition: &Transition) -> Result<(), Error> {
        if let Some(NextAction::MarkExecutorLost { resumable }) = &transition.action {
            self.executor_ended(ExecutorPhase::Lost, *resumable, "marking the executor lost")
                .await?;
        }
        self.status = transition.status.clone();
        if transition.write {
            self.write_status().await?;
        }
        match &transition.action {
            Some(NextAction::Follow { pod }) => {
                if let Some(pod) = self.pod_named(pod) {
                    self.follow(pod, self.objects.annotation(PROMPTED_ANNOTATION));
                }
            }
            Some(NextAction::ReadJournal { pod, nudge }) => {
                if let Some(pod) = self.pod_named(pod) {
                    self.follow(pod, Some(nudge));
                }
            }
            Some(NextAction::StopFollowing) => {
                self.unfollow();
            }
            Some(NextAction::CaughtUp { pod }) => {
                if let Some(pod) = self.pod_named(pod) {
                    let nudge = self.objects.annotation(PROMPTED_ANNOTATION);
                    self.ctx.followers.caught_up(pod, nudge);
                }
            }
            Some(NextAction::DeletePod { pod }) => {
                if let Some(pod) = self.pod_named(pod).cloned() {
                    self.pod_deletion(&pod).await;
                }
            }
            Some(NextAction::DeleteLostPod { pod, force }) => {
                if let Some(pod) = self.pod_named(pod).cloned()
                    && self.delete_pod_by_uid(&pod, *force).await
                {
                    info!(pod = %pod.name_any(), force, "deleted an agentctl pod that counts as lost");
                }
            }
            Some(NextAction::MarkExecutorLost { .. }) | None => {}
        }
        match transition.metric {
            Some(Metric::AgentLost) => metrics::global().agent_lost(),
            Some(Metric::ResumeHandled(outcome)) => metrics::global().resume_handled(outcome),
            None => {}
        }
        if let Some(note) = &transition.event {
            self.note(note);
        }
        Ok(())
    }

    /// Writes what the event follower of the executor's pod read and no reconcile wrote yet
    /// ([`journal_update`]); the rest of the pass decides on the status written.
    async fn write_journal_news(&mut self) -> Result<(), Error> {
        let Some(pod_uid) = self
            .objects
            .executor
            .as_ref()
            .and_then(|er| er.status.as_ref()?.pod_uid.clone())
        else {
            return Ok(());
        };
        let Some((news, serial)) = self.ctx.followers.news(&pod_uid) else {
            return Ok(());
        };
        let before = self.objects.executor_status().pending_permissions;
        if let Some(desired) = journal_update(&self.objects.executor_status(), &news) {
            self.write_executor(&desired, "writing what the agent's journal says")
                .await?;
        }
        self.publish_permission_news(&before, &news.view);
        self.ctx.followers.written(&pod_uid, serial);
        Ok(())
    }

    /// The executor's agent no longer runs: `phase` (`Lost`, `Stopped`), no activity, and
    /// `resumable` as given (`doing` names the write in an error). Nothing without an
    /// ExecutorRunning.
    async fn executor_ended(
        &mut self,
        phase: ExecutorPhase,
        resumable: bool,
        doing: &'static str,
    ) -> Result<(), Error> {
        if self.objects.executor.is_none() {
            return Ok(());
        }
        let current = self.objects.executor_status();
        let desired = ended(&current, phase, resumable);
        self.write_executor(&desired, doing).await?;
        let why = match phase {
            ExecutorPhase::Lost => "its pod was lost",
            _ => "the session ended",
        };
        self.publish_permissions_gone(&current.pending_permissions, why);
        Ok(())
    }

    /// Applies `desired` as the ExecutorRunning's status (server-side apply under [`MANAGER`]:
    /// the reconciler is its one writer), on the condition that the ExecutorRunning is still the
    /// version this reconcile decided on: a decision on a lagging cache fails with
    /// [`Error::ExecutorConflict`]. Without an ExecutorRunning in the caches (one created by an
    /// earlier pass that they do not show yet), it applies without that condition. What the
    /// apply could not remove (fields an older operator's field managers share) goes with one
    /// merge patch ([`leftovers`]): once per executor, after an upgrade.
    async fn write_executor(
        &mut self,
        desired: &ExecutorRunningStatus,
        doing: &'static str,
    ) -> Result<(), Error> {
        let base = self
            .objects
            .executor
            .as_ref()
            .and_then(|er| er.metadata.resource_version.clone());
        let mut written = self
            .send_executor_status(desired, base.as_deref())
            .await
            .map_err(executor_conflict_or(doing))?;
        if let Some(mut removal) = leftovers(&written.status.clone().unwrap_or_default(), desired) {
            info!(executor = %written.name_any(), removed = %removal["status"], "removing status fields that an older operator's field managers share");
            removal["metadata"] = json!({"resourceVersion": written.metadata.resource_version});
            let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            written = api
                .patch_status(
                    &written.name_any(),
                    &merge_params(),
                    &Patch::Merge(&removal),
                )
                .await
                .map_err(executor_conflict_or(doing))?;
        }
        self.ctx
            .expectations
            .wrote_executor(&self.uid, base.as_deref(), &written);
        self.objects.executor = Some(written);
        Ok(())
    }

    /// The apply of [`Self::write_executor`] (based on version `base`). An API server whose
    /// ExecutorRunning schema is older than this operator (its CRD not upgraded yet) refuses an
    /// apply that names a field it does not declare: then the status goes as a merge patch,
    /// which it takes without those fields ([`merge_patch`]).
    async fn send_executor_status(
        &self,
        desired: &ExecutorRunningStatus,
        base: Option<&str>,
    ) -> Result<ExecutorRunning, kube::Error> {
        let api: Api<ExecutorRunning> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let name = names::executor_name(&self.ts);
        let precondition = base.map(|base| json!({"resourceVersion": base}));
        let mut patch = json!({
            "apiVersion": ExecutorRunning::api_version(&()),
            "kind": ExecutorRunning::kind(&()),
            "status": desired,
        });
        if let Some(precondition) = &precondition {
            patch["metadata"] = precondition.clone();
        }
        let params = PatchParams::apply(MANAGER).force();
        match api
            .patch_status(&name, &params, &Patch::Apply(&patch))
            .await
        {
            Err(kube::Error::Api(status)) if unknown_to_schema(status.code, &status.message) => {
                older_schema(&status.message);
                let mut merge = merge_patch(&self.objects.executor_status(), desired);
                if let Some(precondition) = precondition {
                    merge["metadata"] = precondition;
                }
                api.patch_status(&name, &merge_params(), &Patch::Merge(&merge))
                    .await
            }
            applied => applied,
        }
    }

    /// Writes the whole status with server-side apply under one field manager, on the condition
    /// that the TaskSession is still the version this reconcile decided on: a decision made on
    /// a lagging cache fails with [`Error::Conflict`] instead of overwriting newer status.
    async fn write_status(&mut self) -> Result<(), Error> {
        self.status.observed_generation = self.ts.metadata.generation;
        if let Some(message) = &mut self.status.error_message {
            *message = cap(message, MESSAGE_MAX).into_owned();
        }
        let api: Api<TaskSession> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let patch = json!({
            "apiVersion": TaskSession::api_version(&()),
            "kind": TaskSession::kind(&()),
            "metadata": {"resourceVersion": self.resource_version},
            "status": self.status,
        });
        let written = api
            .patch_status(
                &self.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(conflict_or(
                "writing the TaskSession status",
                &self.ctx.expectations,
                &self.uid,
                self.resource_version.as_deref(),
            ))?;
        let version = written.metadata.resource_version;
        self.ctx.expectations.wrote(
            &self.uid,
            self.resource_version.as_deref(),
            version.as_deref(),
        );
        self.resource_version = version;
        Ok(())
    }

    fn event(&self, type_: EventType, reason: &str, action: &str, note: &str) {
        // Events with the same (type, reason, action) fold into one series that keeps the
        // first note: a second resume would show as "x2" of the first one in `kubectl
        // describe`. A hash of the note in the action keeps distinct events apart while true
        // repeats still fold.
        let action = format!("{action}:{}", names::short_hash(note));
        let event = OutgoingEvent {
            type_,
            reason,
            action: &action,
            note,
        };
        self.ctx.events.send(self.ts.object_ref(&()), &event);
    }
}

/// The field manager of a merge patch of ExecutorRunning status.
fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Says once per operator run that the ExecutorRunning CRD is older than this operator (the
/// API server's `message` names the field it does not know).
fn older_schema(message: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        warn!(message = %cap(message, MESSAGE_MAX), "the ExecutorRunning CRD is older than this operator: its status is written with merge patches, without the fields the CRD does not declare, until the CRDs are upgraded");
    }
}

/// Crash-consistency tests: `KANDEV_FAULT_EXIT_AFTER=<step>` makes the operator exit right
/// after that step persisted (`starting`, `pod-created`), as a crash there would. Unset in any
/// real deployment, where it costs one environment lookup per step.
fn fault_point(step: &str) {
    if std::env::var("KANDEV_FAULT_EXIT_AFTER").is_ok_and(|v| v == step) {
        warn!(
            step,
            "KANDEV_FAULT_EXIT_AFTER: exiting as if the operator crashed here"
        );
        std::process::exit(3);
    }
}

#[cfg(test)]
mod write_order;
