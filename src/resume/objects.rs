//! What one look at the cluster says about one session: the TaskSession, its ExecutorRunning
//! and the pods it controls. The operator loads it from its caches, `kubectl kandev` from one
//! read of the API server; both evaluate it with the same functions, so `kubectl kandev status`
//! says what the operator decides.

use k8s_openapi::api::core::v1::Pod;

use crate::api::names;
use crate::api::{ExecutorRunning, ExecutorRunningStatus, TaskSession, TaskSessionStatus};

use super::{
    PodLiveness, ResumeEvaluation, SessionFacts, current_pod, evaluate_resume_eligibility,
    pod_liveness,
};

/// A session and the objects that belong to it, as read at one moment.
#[derive(Clone, Debug)]
pub struct SessionObjects {
    pub namespace: String,
    pub session: TaskSession,
    pub executor: Option<ExecutorRunning>,
    /// The agent pods whose controller ownerReference is this session (by UID): labels select,
    /// the controller reference decides.
    pub pods: Vec<Pod>,
    /// The session's history reader pod ([`crate::api::names::ROLE_LABEL`]), controlled by it
    /// too but never one of its agent pods. Boxed: a pod is large, and every step of a
    /// reconcile carries this struct.
    pub reader: Option<Box<Pod>>,
}

/// Whether `pod`'s controller ownerReference is the object with `uid`.
pub fn is_controlled_by(pod: &Pod, uid: Option<&str>) -> bool {
    uid.is_some()
        && pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

impl SessionObjects {
    /// Keeps only the `candidates` that this session controls, its history reader apart.
    pub fn new(
        namespace: impl Into<String>,
        session: TaskSession,
        executor: Option<ExecutorRunning>,
        candidates: impl IntoIterator<Item = Pod>,
    ) -> Self {
        let uid = session.metadata.uid.clone();
        let reader_name = names::reader_pod_name(session.metadata.name.as_deref().unwrap_or(""));
        let (readers, pods): (Vec<Pod>, Vec<Pod>) = candidates
            .into_iter()
            .filter(|pod| is_controlled_by(pod, uid.as_deref()))
            .partition(|pod| names::is_reader(pod.metadata.labels.as_ref()));
        let reader = readers
            .into_iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(reader_name.as_str()))
            .map(Box::new);
        Self {
            namespace: namespace.into(),
            session,
            executor,
            pods,
            reader,
        }
    }

    pub fn name(&self) -> String {
        self.session.metadata.name.clone().unwrap_or_default()
    }

    pub fn status(&self) -> TaskSessionStatus {
        self.session.status.clone().unwrap_or_default()
    }

    pub fn executor_status(&self) -> ExecutorRunningStatus {
        self.executor
            .as_ref()
            .and_then(|er| er.status.clone())
            .unwrap_or_default()
    }

    /// `ExecutorRunning.status.resumeToken` (the agent's ACP session id), when non-blank.
    pub fn resume_token(&self) -> Option<&str> {
        self.executor
            .as_ref()
            .and_then(|er| er.status.as_ref())
            .and_then(|s| s.resume_token.as_deref())
            .filter(|t| !t.trim().is_empty())
    }

    /// The live pod recorded in ExecutorRunning (same UID), else the newest controlled pod.
    pub fn current_pod(&self) -> Option<&Pod> {
        let recorded = self
            .executor
            .as_ref()
            .and_then(|er| er.status.as_ref())
            .and_then(|s| s.pod_uid.as_deref());
        current_pod(&self.pods, recorded)
    }

    pub fn liveness(&self) -> PodLiveness {
        pod_liveness(self.current_pod())
    }

    /// The current pod when it runs (the one to exec into).
    pub fn running_pod(&self) -> Option<&Pod> {
        self.current_pod()
            .filter(|p| pod_liveness(Some(p)) == PodLiveness::Running)
    }

    /// The facts of DESIGN §3 status evaluation, with `status` standing for the session's
    /// status (the operator passes the one it is about to write) and `pod` for its agent pod.
    pub fn facts_with(&self, status: &TaskSessionStatus, pod: Option<&Pod>) -> SessionFacts {
        SessionFacts {
            state: status.state,
            has_resume_token: self.resume_token().is_some(),
            executor_exists: self.executor.is_some(),
            executor_resumable: self
                .executor
                .as_ref()
                .and_then(|er| er.status.as_ref())
                .is_some_and(|s| s.resumable),
            pod: pod_liveness(pod),
        }
    }

    pub fn facts(&self) -> SessionFacts {
        self.facts_with(&self.status(), self.current_pod())
    }

    /// DESIGN §3 status evaluation against the live pod (the written status may lag).
    pub fn evaluation(&self) -> ResumeEvaluation {
        evaluate_resume_eligibility(&self.facts())
    }

    /// The value of an annotation, when set and non-empty.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.session
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Sessions in a given situation, for the tables of the pure decisions.
#[cfg(test)]
pub(crate) mod fixtures {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::SessionObjects;
    use crate::api::{
        AgentActivity, ExecutorRunning, ExecutorRunningSpec, ExecutorRunningStatus, SessionState,
        TaskSession, TaskSessionSpec, TaskSessionStatus,
    };

    const UID: &str = "uid-1";

    pub fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid timestamp")
    }

    #[derive(Clone, Copy, Debug)]
    pub enum P {
        None,
        Running,
        Pending,
        Terminating,
        Failed,
    }

    pub fn pod(kind: P) -> Option<Pod> {
        let (phase, deleting) = match kind {
            P::None => return None,
            P::Running => ("Running", false),
            P::Pending => ("Pending", false),
            P::Terminating => ("Running", true),
            P::Failed => ("Failed", false),
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some("s-agent-1".into());
        pod.metadata.uid = Some("pod-uid".into());
        pod.metadata.owner_references = Some(vec![OwnerReference {
            uid: UID.into(),
            controller: Some(true),
            ..Default::default()
        }]);
        if deleting {
            pod.metadata.deletion_timestamp = Some(Time(at(5)));
        }
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: (phase == "Running").then(|| {
                vec![ContainerStatus {
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        Some(pod)
    }

    #[derive(Clone, Copy)]
    pub struct Given {
        pub state: SessionState,
        pub needs_resume: bool,
        pub token: Option<&'static str>,
        pub activity: Option<AgentActivity>,
        pub pod: P,
    }

    pub fn objects(g: &Given) -> SessionObjects {
        let mut ts = TaskSession::new("s", TaskSessionSpec::default());
        ts.metadata.uid = Some(UID.into());
        ts.metadata.generation = Some(1);
        ts.status = Some(TaskSessionStatus {
            state: g.state,
            needs_resume: g.needs_resume,
            ..Default::default()
        });
        let mut er = ExecutorRunning::new("s", ExecutorRunningSpec::default());
        er.status = Some(ExecutorRunningStatus {
            resume_token: g.token.map(String::from),
            resumable: g.token.is_some(),
            activity: g.activity,
            pod_name: Some("s-agent-0".into()),
            ..Default::default()
        });
        SessionObjects::new("ns", ts, Some(er), pod(g.pod))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;
    use crate::api::TaskSessionSpec;

    fn session(uid: &str) -> TaskSession {
        let mut ts = TaskSession::new("s", TaskSessionSpec::default());
        ts.metadata.uid = Some(uid.to_string());
        ts
    }

    fn pod(name: &str, owner: Option<(&str, bool)>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.to_string());
        pod.metadata.owner_references = owner.map(|(uid, controller)| {
            vec![OwnerReference {
                uid: uid.to_string(),
                controller: Some(controller),
                ..Default::default()
            }]
        });
        pod
    }

    #[test]
    fn only_pods_the_session_controls_belong_to_it() {
        let objects = SessionObjects::new(
            "ns",
            session("u1"),
            None,
            [
                pod("ours", Some(("u1", true))),
                pod("owned-not-controlled", Some(("u1", false))),
                pod("another-session", Some(("u2", true))),
                pod("decoy", None),
            ],
        );
        let names: Vec<_> = objects
            .pods
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        assert_eq!(names, ["ours"]);
    }

    #[test]
    fn a_session_without_uid_controls_nothing() {
        let mut ts = session("u1");
        ts.metadata.uid = None;
        let objects = SessionObjects::new("ns", ts, None, [pod("p", Some(("", true)))]);
        assert!(objects.pods.is_empty());
    }
}
