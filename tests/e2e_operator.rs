//! End-to-end: the operator as a local process against the real control plane (kwok + harness),
//! with the real `claude-agent-acp` from npm inside the agentctl pods the harness plays, and the
//! scriptable `kandev-test-agent` for refusals. Run by `bash e2e/test.sh` (see e2e/README.md):
//! `#[ignore]`d for plain `cargo test`, failing (never skipping) without a cluster.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::time::Duration;

use e2e_support::operator::{Operator, OperatorBuilder};
use e2e_support::sessions::{
    Sessions, assert_condition, condition, condition_is, status_where, template_workspace,
};
use e2e_support::{plugin, poll, unique, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::core::v1::Pod;
use kandev_operator::api::conditions;
use kandev_operator::api::names::pod_name;
use kandev_operator::api::{
    CredentialRef, SessionState, TaskSession, TaskSessionStatus, TaskState,
};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// A test operator: the profiles of `tests/data/profiles/operator.yaml` besides the built-in
/// ones, reconciling every [`e2e_support::operator::DEFAULT_RESYNC`], without leader election
/// unless the caller adds it.
fn operator() -> OperatorBuilder {
    Operator::builder().profiles_file("operator")
}

/// A cluster client with the CRDs installed, and a namespace of the test's own: it enforces the
/// restricted Pod Security Standard, so every agent pod these tests launch is also proof that
/// the operator's pods pass it.
async fn setup() -> Sessions {
    Sessions::fresh("kandev-e2e-operator").await
}

async fn started_and_waiting(sessions: &Sessions, name: &str) -> (String, Pod) {
    let ts = sessions.wait_waiting_for_input(name).await;
    let status = ts.status.expect("status");
    assert_eq!(
        status.task_state,
        TaskState::Review,
        "task column after the first prompt"
    );
    let token = sessions
        .token_of(name)
        .await
        .expect("a resume token after session/new");
    (token, sessions.the_pod(name).await)
}

// ---------------------------------------------------------------------------------------------

/// Waits for the session to be FAILED and returns its errorMessage.
async fn failed_with(sessions: &Sessions, name: &str) -> String {
    let ts = sessions
        .wait_state(name, SessionState::Failed)
        .await
        .expect("session");
    ts.status.and_then(|s| s.error_message).unwrap_or_default()
}

/// After a first launch stalled: not FAILED, needsResume, the message names the cause, no pod
/// left, and a `LaunchStalled` Event after the launch's `Starting`.
async fn assert_stalled(sessions: &Sessions, name: &str, reason: &str, says: &str) -> TaskSession {
    let stalled_with = condition_is(conditions::STALLED, "True", reason);
    let ts = sessions.wait(name, reason, stalled_with).await;
    let status = ts.status.clone().expect("status");
    let stalled = condition(&status, conditions::STALLED);
    assert!(stalled.message.contains(says), "{stalled:?}");
    assert_ne!(status.state, SessionState::Failed, "{status:#?}");
    assert!(status.needs_resume, "{status:#?}");
    assert!(status.active_resume_request.is_none(), "{status:#?}");
    sessions
        .wait_no_live_pods(name, "the stalled pod is removed")
        .await;
    sessions
        .assert_events_in_order(name, &["Starting", "LaunchStalled"])
        .await;
    ts
}

/// A launch that cannot start stalls once the launch deadline passes, with the pod's real reason
/// (the scheduler's, or the kubelet's for an image it cannot pull and a missing Secret). A first
/// launch stays resumable like a resume (not FAILED) and a new token starts it; a resume keeps
/// its token; a new token supersedes a latched request (its pod removed before the next one
/// starts); and a new token on a healthy operator resumes.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_launch_that_cannot_start_stalls_with_the_pods_reason() {
    let sessions = setup().await;
    let body = async {
        let nowhere = ["--pod-node-selector", "e2e.kandev.dev/nowhere=true"];
        let short = ["--launch-deadline-seconds", "4"];

        // First launches.
        let unschedulable = unique("stall-sched");
        let unpullable = unique("stall-image");
        let no_secret = unique("stall-secret");
        {
            let _operator = operator().args(&nowhere).args(&short).start();
            sessions.create(&unschedulable, "claude-code").await;
            assert_stalled(
                &sessions,
                &unschedulable,
                "Unschedulable",
                "not scheduled within 4s",
            )
            .await;
        }
        {
            let _operator = operator().args(&short).start();
            let mut ts = sessions.new_session(&unpullable, "claude-code", template_workspace());
            ts.spec.image = Some("registry.invalid/kandev/agentctl:e2e".into());
            sessions.create_session(&ts).await;
            let mut ts = sessions.new_session(&no_secret, "claude-code", template_workspace());
            ts.spec.credentials = vec![CredentialRef {
                env: "ANTHROPIC_API_KEY".into(),
                secret_name: "e2e-no-such-secret".into(),
                key: "api-key".into(),
            }];
            sessions.create_session(&ts).await;
            assert_stalled(
                &sessions,
                &unpullable,
                "ImagePullBackOff",
                "registry.invalid/kandev/agentctl:e2e",
            )
            .await;
            assert_stalled(
                &sessions,
                &no_secret,
                "CreateContainerConfigError",
                "e2e-no-such-secret",
            )
            .await;

            // A claimed workspace PVC that does not exist yet: the first launch waits (Stalled after
            // the deadline, never FAILED) and starts once the PVC is applied.
            let late = unique("late-pvc");
            let claim = format!("{late}-ws");
            let ts = sessions.new_session(&late, "claude-code", json!({"claimName": claim}));
            sessions.create_session(&ts).await;
            let missing = condition_is(conditions::STALLED, "True", "WorkspaceMissing");
            let ts = sessions.wait(&late, "WorkspaceMissing", missing).await;
            let status = ts.status.expect("status");
            assert_eq!(status.state, SessionState::Created, "{status:#?}");
            let stalled = condition(&status, conditions::STALLED);
            assert!(stalled.message.contains(&claim), "{stalled:?}");
            sessions.create_claim(&claim).await;
            started_and_waiting(&sessions, &late).await;
        }

        // A resume: the token is kept.
        let resumed = unique("stall-resume");
        let (token, pod) = {
            let _operator = operator().start();
            // The stalled first launch starts with a new token (and its task description).
            sessions.resume(&unschedulable, "s1").await;
            assert!(sessions.token_of(&unschedulable).await.is_some(), "started");
            sessions.create(&resumed, "claude-code").await;
            started_and_waiting(&sessions, &resumed).await
        };
        sessions.delete_pod(&pod).await;
        {
            let _operator = operator().args(&nowhere).args(&short).start();
            sessions.wait_needs_resume(&resumed).await;
            let ts = sessions.resume(&resumed, "r1").await;
            let status = ts.status.expect("status");
            let stalled = condition(&status, conditions::STALLED);
            assert_eq!(stalled.reason, "Unschedulable", "{stalled:?}");
            assert!(status.needs_resume, "{status:#?}");
            assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
            assert!(
                sessions.live_pods(&resumed).await.is_empty(),
                "the stalled pod is removed"
            );
            assert_eq!(
                sessions.token_of(&resumed).await.as_deref(),
                Some(token.as_str()),
                "token kept"
            );
        }

        // A new token supersedes a latched request whose pod plainly cannot start (here it
        // cannot be scheduled), before that launch's deadline: its pod goes, the new request's
        // pod replaces it. (One that progresses is joined: an_agent_slow_to_boot_….)
        let latched_pod = |token: &'static str| {
            let pods = sessions.pods();
            let name = pod_name(&resumed, token);
            async move {
                wait_for(
                    &pods,
                    &name,
                    "the latched request's pod",
                    |p: Option<&Pod>| p.is_some(),
                )
                .await
                .expect("pod")
            }
        };
        {
            let _operator = operator().args(&nowhere).start();
            sessions.annotate(&resumed, "r2").await;
            latched_pod("r2").await;
            // Once the scheduler said so (and the operator's pod cache had a moment to see it).
            let unschedulable = |p: Option<&Pod>| {
                p.and_then(|p| p.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                    })
            };
            wait_for(
                &sessions.pods(),
                &pod_name(&resumed, "r2"),
                "r2's pod unschedulable",
                unschedulable,
            )
            .await
            .expect("pod");
            tokio::time::sleep(Duration::from_secs(1)).await;
            sessions.annotate(&resumed, "r3").await;
            let superseded = status_where(|s| {
                s.active_resume_request.as_deref() == Some("r3")
                    && s.recent_resume_requests.iter().any(|t| t == "r2")
            });
            let ts = sessions
                .wait(&resumed, "r3 supersedes r2", superseded)
                .await;
            let status = ts.status.expect("status");
            let superseded = condition(&status, conditions::RESUMED);
            assert_eq!(superseded.reason, "Superseded", "{superseded:?}");
            latched_pod("r3").await;
            assert_eq!(
                sessions.live_pod_names(&resumed).await,
                [pod_name(&resumed, "r3")],
                "only the new request's pod"
            );
            // Only a latched request is superseded: its Event comes first.
            sessions
                .assert_events_in_order(&resumed, &["ResumeRequested", "ResumeSuperseded"])
                .await;
        }

        // On a healthy operator, a new token supersedes r3 (its pod still cannot be scheduled)
        // and resumes the same agent session.
        let _operator = operator().start();
        let ts = sessions.resume(&resumed, "r4").await;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert!(!status.needs_resume);
        for old in ["r1", "r2", "r3"] {
            assert!(
                status.recent_resume_requests.iter().any(|t| t == old),
                "{old} remembered"
            );
        }
        assert_eq!(
            sessions.token_of(&resumed).await.as_deref(),
            Some(token.as_str()),
            "same token back"
        );
        assert_eq!(
            sessions.live_pod_names(&resumed).await,
            [pod_name(&resumed, "r4")],
            "one agentctl pod"
        );
    };
    sessions.run_with_operator(operator(), body).await;
}

/// New session → pod Running → WAITING_FOR_INPUT with a token; pod lost → needsResume and no new
/// pod; annotate → the same token restored by session/resume, once per token.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn lost_session_is_resumed_lazily_with_the_same_token() {
    let sessions = setup().await;
    let operator = operator().start();
    let name = unique("resume");
    let body = async {
        sessions.create(&name, "claude-code").await;

        let (token, pod) = started_and_waiting(&sessions, &name).await;
        let spec = pod.spec.as_ref().expect("pod spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(
            pod.labels().get("kandev.dev/managed").map(String::as_str),
            Some("true")
        );

        // Lost pod: marked, not relaunched.
        sessions.delete_pod(&pod).await;
        let ts = sessions.wait_needs_resume(&name).await;
        let status = ts.status.expect("status");
        assert_eq!(
            status.resume_reason.map(|r| r.as_str()),
            Some("agent_not_running")
        );
        assert!(conditions::is_true(
            &status.conditions,
            conditions::NEEDS_RESUME
        ));
        // A pod that only carries the session's labels is not its agent: labels prove nothing, the
        // controller ownerReference does.
        let stray: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-stray"), "labels": pod.labels()},
            "spec": {"containers": [{"name": "agentctl", "image": "stray", "securityContext": {
                         "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
                     "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                     "nodeSelector": {"e2e.kandev.dev/nowhere": "true"}},
        }))
        .expect("pod");
        sessions
            .pods()
            .create(&PostParams::default(), &stray)
            .await
            .expect("stray pod");
        // Several looks at the session with the stray pod there.
        operator.await_reconciles(4).await;
        assert!(
            sessions.status(&name).await.needs_resume,
            "a stray pod with the session's labels made the session look running"
        );
        let decoys = sessions
            .event_reasons_with(&name, &["DecoyPod"])
            .await
            .iter()
            .filter(|r| *r == "DecoyPod")
            .count();
        assert_eq!(decoys, 1, "the decoy is reported once");
        sessions.delete_pod(&stray).await;
        assert!(
            sessions.live_pods(&name).await.is_empty(),
            "lazy recovery: nothing relaunched"
        );
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str()),
            "token kept while lost"
        );

        // Resume on annotation.
        let ts = sessions.resume(&name, "r1").await;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_eq!(status.task_state, TaskState::Review);
        assert!(!status.needs_resume);
        let resumed = assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
        assert!(
            resumed.message.contains("session/resume"),
            "{}",
            resumed.message
        );
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str()),
            "same token back"
        );
        let after = sessions.live_pods(&name).await;
        assert_eq!(after.len(), 1, "one pod after the resume");
        // One Event per step the user cares about: the first launch, the loss, the accepted
        // request (which names the pod it launches), the outcome.
        let reasons = sessions
            .assert_events_in_order(
                &name,
                &["Starting", "AgentLost", "ResumeRequested", "Resumed"],
            )
            .await;

        // The same token again: nothing happens.
        let resumed_events = reasons.iter().filter(|r| *r == "Resumed").count();
        sessions.annotate(&name, "r1").await;
        let touch = json!({"metadata": {"annotations": {"e2e.kandev.dev/touch": "1"}}});
        sessions.merge(&name, touch).await.expect("touch");
        operator.await_reconciles(2).await;
        let same = sessions.live_pods(&name).await;
        assert_eq!(
            same.iter().map(|p| p.uid()).collect::<Vec<_>>(),
            after.iter().map(|p| p.uid()).collect::<Vec<_>>()
        );
        let reasons = sessions.event_reasons(&name).await;
        assert_eq!(
            reasons.iter().filter(|r| *r == "Resumed").count(),
            resumed_events,
            "no second resume"
        );

        // A new token after another loss: a new resume.
        sessions.delete_pod(&after[0]).await;
        sessions.wait_needs_resume(&name).await;
        sessions.resume(&name, "r2").await;
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str()),
            "same token again"
        );
        let live = sessions.live_pods(&name).await;
        assert_eq!(live.len(), 1);

        // GitOps rollback: the manifest goes back to r1 while the agent is lost. r1 was handled
        // before, so nothing starts; the session stays lost and resumable (DESIGN §3 handshake).
        sessions.delete_pod(&live[0]).await;
        sessions.wait_needs_resume(&name).await;
        sessions.annotate(&name, "r1").await;
        operator.await_reconciles(3).await;
        assert!(
            sessions.live_pods(&name).await.is_empty(),
            "a re-applied old token started a pod"
        );
        let status = sessions.status(&name).await;
        assert_eq!(status.last_handled_resume_request.as_deref(), Some("r2"));
        assert_eq!(status.recent_resume_requests, ["r1", "r2"]);
        assert_eq!(status.active_resume_request, None);
        assert!(status.needs_resume, "{status:#?}");
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
    };
    sessions.run(body).await;
}

/// -32002 from the real agent (the token is unknown to it) → fresh session, WAITING_FOR_INPUT,
/// token replaced; -32603 from the scriptable agent → token kept, condition explains; an agent
/// that offers no restore → fresh session with a Normal StartedFresh Event.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn rejected_and_inconclusive_restores() {
    let sessions = setup().await;
    let _operator = operator().start();
    let body = async {
        // Unknown session: claude-agent-acp answers -32002 for a UUID it has never seen.
        let name = unique("unknown");
        sessions.create(&name, "claude-code").await;
        let (_, pod) = started_and_waiting(&sessions, &name).await;
        let unknown = "0badc0de-0000-4000-8000-000000000000";
        let patch = json!({"status": {"resumeToken": unknown}});
        sessions
            .executors()
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("set token");
        sessions.delete_pod(&pod).await;
        sessions.wait_needs_resume(&name).await;
        let ts = sessions.resume(&name, "u1").await;
        let status = ts.status.expect("status");
        assert_eq!(
            status.state,
            SessionState::WaitingForInput,
            "token rejected is not FAILED: {status:#?}"
        );
        assert_condition(&status, conditions::RESUMED, ("False", "TokenRejected"));
        let token = sessions.token_of(&name).await.expect("a new token");
        assert_ne!(token, unknown, "the rejected token is replaced");
        // The rejection is the outcome of the resume the request started; an agent that turns
        // down a restore it offers is worth a Warning.
        sessions
            .assert_events_in_order(&name, &["ResumeRequested", "TokenRejected"])
            .await;
        let rejected = sessions.events(&name).await;
        let rejected = rejected
            .iter()
            .find(|e| e.reason.as_deref() == Some("TokenRejected"))
            .expect("the TokenRejected Event");
        assert_eq!(rejected.type_.as_deref(), Some("Warning"), "{rejected:?}");

        // Inconclusive: -32603 on resume keeps the token and says why.
        let name = unique("inconclusive");
        sessions.create(&name, "test-inconclusive").await;
        let (token, pod) = started_and_waiting(&sessions, &name).await;
        sessions.delete_pod(&pod).await;
        sessions.wait_needs_resume(&name).await;
        let ts = sessions.resume(&name, "i1").await;
        let status = ts.status.expect("status");
        let resumed = condition(&status, conditions::RESUMED);
        assert_eq!(resumed.status, "False");
        assert!(
            resumed.message.contains("token is kept"),
            "{}",
            resumed.message
        );
        assert!(status.needs_resume, "still needs a resume");
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str()),
            "token kept"
        );
        assert!(
            sessions.live_pods(&name).await.is_empty(),
            "the failed attempt's pod is removed"
        );

        // An agent that offers no restore method (profile `auto`) starts over on every resume
        // by design: a new session, and a Normal StartedFresh Event rather than a Warning.
        let name = unique("no-restore");
        sessions.create(&name, "test-no-restore").await;
        let (_, pod) = started_and_waiting(&sessions, &name).await;
        sessions.delete_pod(&pod).await;
        sessions.wait_needs_resume(&name).await;
        let ts = sessions.resume(&name, "n1").await;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_condition(&status, conditions::RESUMED, ("False", "TokenRejected"));
        // (The test agent numbers its sessions per process, so the new id may read the same.)
        assert!(sessions.token_of(&name).await.is_some(), "a token");
        let events = sessions.events(&name).await;
        let fresh = events
            .iter()
            .find(|e| e.reason.as_deref() == Some("StartedFresh"))
            .expect("the StartedFresh Event");
        assert_eq!(fresh.type_.as_deref(), Some("Normal"), "{fresh:?}");
        assert!(
            !events
                .iter()
                .any(|e| e.reason.as_deref() == Some("TokenRejected")),
            "no Warning for an expected fresh start: {events:?}"
        );
    };
    sessions.run(body).await;
}

/// A session whose agent profile the operator does not know yet (synced before the release
/// that adds it) waits, `Stalled=True/UnknownProfile` and `CREATED`, not FAILED; an operator
/// restarted with the profile starts it.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn an_unknown_profile_waits_until_the_operator_has_it() {
    let sessions = setup().await;
    let mut without = operator().start();
    let name = unique("later");
    let body = async {
        sessions.create(&name, "later-agent").await;
        let ts = sessions
            .wait_within(
                &name,
                "Stalled=True/UnknownProfile",
                Duration::from_secs(60),
                condition_is(conditions::STALLED, "True", "UnknownProfile"),
            )
            .await;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::Created, "{status:#?}");
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.type_ != conditions::READY),
            "no Ready while nothing runs: {status:#?}"
        );
        assert_condition(
            &status,
            conditions::RECONCILING,
            ("False", "UnknownProfile"),
        );
        let message = &condition(&status, conditions::STALLED).message;
        assert!(message.contains("\"later-agent\""), "{message}");
        sessions.assert_event(&name, "UnknownProfile").await;
        assert!(sessions.live_pods(&name).await.is_empty(), "no pod");
        // Nothing ran: no history, and no reader pod to find that out.
        let run = plugin(&["history", &name, "-n", &sessions.namespace]).await;
        assert_eq!(run.code(), 0, "{run:#?}");
        assert!(run.stderr.contains("no recorded history yet"), "{run:#?}");
        assert!(sessions.live_pods(&name).await.is_empty(), "no reader pod");

        assert_eq!(without.terminate(Duration::from_secs(30)).await, Some(0));
        let _with = operator()
            .profiles(
                "later-profiles.yaml",
                "profiles:\n  later-agent:\n    launch: [\"kandev-test-agent\"]\n    nativeSessionResume: true\n    historyContextInjection: false\n",
            )
            .start();
        sessions
            .wait_state_within(
                &name,
                SessionState::WaitingForInput,
                Duration::from_secs(90),
            )
            .await;
        let status = sessions.status(&name).await;
        assert_condition(&status, conditions::STALLED, ("False", "Started"));
        assert!(sessions.token_of(&name).await.is_some());
    };
    sessions.run(body).await;
}

/// Terminal sessions refuse a resume; a missing PVC fails the session with the reason; an
/// invalid TaskSession is refused by the API server and the operator keeps working.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn refusals_and_bad_input() {
    let sessions = setup().await;
    let _operator = operator().start();
    let body = async {
        let invalid = sessions.new_session(
            &unique("invalid"),
            "Not A Profile!",
            json!({"template": {"size": "1Gi"}}),
        );
        let err = sessions
            .sessions()
            .create(&PostParams::default(), &invalid)
            .await
            .expect_err("refused");
        assert!(
            err.to_string().contains("agent must be a profile name"),
            "{err}"
        );

        // The agent cannot start a session: FAILED, and no agent pod left idling.
        let name = unique("newfails");
        sessions.create(&name, "test-new-fails").await;
        let message = failed_with(&sessions, &name).await;
        assert!(message.contains("starting the agent failed"), "{message}");
        // The launch failed after it started.
        sessions
            .assert_events_in_order(&name, &["Starting", "LaunchFailed"])
            .await;
        sessions
            .wait_no_live_pods(&name, "the pod of a failed first launch is deleted")
            .await;
        let agent_not_running =
            status_where(|s| !conditions::is_true(&s.conditions, conditions::AGENT_RUNNING));
        sessions
            .wait(&name, "AgentRunning not True", agent_not_running)
            .await;

        // The user's workspace PVC (claimName) vanished while the session was lost: the resume ends
        // FAILED with reason WorkspaceLost (never on an empty replacement), and Resumed reports this
        // request's outcome.
        let name = unique("pvcgone");
        let claim = format!("{name}-ws");
        sessions.create_claim(&claim).await;
        let ts = sessions.new_session(&name, "claude-code", json!({"claimName": claim}));
        sessions.create_session(&ts).await;
        let status = resumed_without_workspace(&sessions, &name, &claim).await;
        assert_eq!(status.state, SessionState::Failed, "{status:#?}");
        assert_condition(&status, conditions::RESUMED, ("False", "WorkspaceLost"));
        assert!(
            sessions.live_pods(&name).await.is_empty(),
            "no pod on a lost workspace"
        );

        // The same when a PVC of the same name was created again, empty (issue 44): the
        // workspace is known by its UID; the token is kept, and nothing is cloned or started.
        let name = unique("pvcnew");
        let claim = format!("{name}-ws");
        sessions.create_claim(&claim).await;
        let ts = sessions.new_session(&name, "claude-code", json!({"claimName": claim}));
        sessions.create_session(&ts).await;
        let token = {
            started_and_waiting(&sessions, &name).await;
            sessions.token_of(&name).await.expect("a token")
        };
        let status = resumed_on_another_workspace(&sessions, &name, &claim, true).await;
        assert_eq!(status.state, SessionState::Failed, "{status:#?}");
        let stalled = condition(&status, conditions::STALLED);
        assert_eq!(stalled.reason, "WorkspaceLost", "{stalled:?}");
        assert!(
            status
                .error_message
                .as_deref()
                .is_some_and(|m| m.contains("deleted and created again")),
            "{status:#?}"
        );
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str())
        );
        assert!(
            sessions.live_pods(&name).await.is_empty(),
            "no pod on another workspace"
        );

        // The same for a workspace from a template: it is not recreated empty.
        let name = unique("tplgone");
        let claim = format!("{name}-workspace");
        sessions.create(&name, "claude-code").await;
        let status = resumed_without_workspace(&sessions, &name, &claim).await;
        assert_eq!(status.state, SessionState::Failed, "{status:#?}");
        let stalled = condition(&status, conditions::STALLED);
        assert_eq!(stalled.reason, "WorkspaceLost", "{stalled:?}");
        assert!(
            sessions
                .claims()
                .get_opt(&claim)
                .await
                .expect("get")
                .is_none(),
            "the template's PVC is not recreated"
        );

        for terminal in ["COMPLETED", "CANCELLED"] {
            let name = unique("terminal");
            sessions.create(&name, "claude-code").await;
            started_and_waiting(&sessions, &name).await;
            sessions.set_status(&name, json!({"state": terminal})).await;
            let ts = sessions.resume(&name, "t1").await;
            let status = ts.status.expect("status");
            assert_eq!(status.state.as_str(), terminal);
            assert_condition(&status, conditions::RESUMED, ("False", "TerminalState"));
            sessions.assert_event(&name, "ResumeRefused").await;
        }
    };
    sessions.run(body).await;
}

/// Starts the session `name`, loses its agent, and deletes its workspace PVC `claim` (the user's
/// or the template's) while it is lost; then requests a resume. The status once it is handled.
async fn resumed_without_workspace(
    sessions: &Sessions,
    name: &str,
    claim: &str,
) -> TaskSessionStatus {
    resumed_on_another_workspace(sessions, name, claim, false).await
}

/// [`resumed_without_workspace`], and with `recreate` a new, empty PVC of the same name is
/// created before the resume (a GitOps sync after someone deleted it).
async fn resumed_on_another_workspace(
    sessions: &Sessions,
    name: &str,
    claim: &str,
    recreate: bool,
) -> TaskSessionStatus {
    started_and_waiting(sessions, name).await;
    sessions.lose(name).await;
    let claims = sessions.claims();
    claims
        .delete(claim, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("delete the workspace PVC {claim}: {e}"));
    let gone = |pvc: Option<&PersistentVolumeClaim>| pvc.is_none();
    wait_for(&claims, claim, "deleted", gone).await;
    if recreate {
        sessions.create_claim(claim).await;
    }
    let ts = sessions.resume(name, "p1").await;
    ts.status.expect("status")
}

/// The operator dies right after persisting STARTING, then right after creating the pod; each
/// restarted operator finishes the resume with exactly one agentctl pod.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn operator_restarts_mid_resume_leave_exactly_one_pod() {
    let sessions = setup().await;
    let name = unique("restart");
    let body = async {
        let first_pod = {
            let _operator = operator().start();
            sessions.create(&name, "claude-code").await;
            started_and_waiting(&sessions, &name).await.1
        };
        let token = sessions.token_of(&name).await.expect("token");
        {
            // A restarted operator re-attaches to the running pod instead of relaunching it.
            let restarted = operator().start();
            restarted.await_reconciles(3).await;
            let live = sessions.live_pods(&name).await;
            assert_eq!(
                live.iter().map(|p| p.uid()).collect::<Vec<_>>(),
                vec![first_pod.uid()]
            );
            assert_eq!(
                sessions.status(&name).await.state,
                SessionState::WaitingForInput
            );
        }
        for (step, request) in [("starting", "s1"), ("pod-created", "s2")] {
            let pod = sessions.live_pods(&name).await.into_iter().next();
            if let Some(pod) = pod {
                sessions.delete_pod(&pod).await;
            }
            {
                let _operator = operator().start();
                sessions.wait_needs_resume(&name).await;
            }
            sessions.annotate(&name, request).await;
            let mut crashing = operator().fault(step).start();
            assert_eq!(
                crashing.exited(Duration::from_secs(60)).await,
                Some(3),
                "fault point {step}"
            );
            let _operator = operator().start();
            sessions.wait_handled(&name, request).await;
            let live = sessions.live_pod_names(&name).await;
            assert_eq!(live.len(), 1, "after a crash at {step}: {live:?}");
            assert_eq!(
                sessions.token_of(&name).await.as_deref(),
                Some(token.as_str())
            );
        }
    };
    sessions.run_with_operator(operator(), body).await;
}

async fn lease_holder(sessions: &Sessions, lease: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
    leases
        .get_opt(lease)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

async fn wait_lease_holder(sessions: &Sessions, lease: &str, identity: &str, within: Duration) {
    poll(
        within,
        Duration::from_millis(500),
        async || match lease_holder(sessions, lease).await {
            Some(holder) if holder == identity => Ok(()),
            holder => Err(format!(
                "{identity} did not hold lease {lease} within {within:?} (holder: {holder:?})"
            )),
        },
    )
    .await;
}

/// Two replicas: one leads (holds the Lease) and acts, the other waits; when the leader dies the
/// other takes over and handles the next resume.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn two_replicas_elect_one_leader_and_fail_over() {
    let sessions = setup().await;
    let ns = sessions.namespace.clone();
    let body = async {
        let lease = unique("lease");
        let leader = operator().leader_election(&lease, &ns, "replica-a").start();
        wait_lease_holder(&sessions, &lease, "replica-a", Duration::from_secs(30)).await;
        let follower = operator().leader_election(&lease, &ns, "replica-b").start();

        let name = unique("ha");
        sessions.create(&name, "claude-code").await;
        let (token, pod) = started_and_waiting(&sessions, &name).await;
        assert_eq!(
            lease_holder(&sessions, &lease).await.as_deref(),
            Some("replica-a")
        );
        let follower_log = std::fs::read_to_string(follower.log()).unwrap_or_default();
        assert!(
            !follower_log.contains("became the leader"),
            "only one leader: {follower_log}"
        );

        drop(leader);
        // The lease lasts 15 s without renewal.
        wait_lease_holder(&sessions, &lease, "replica-b", Duration::from_secs(45)).await;
        sessions.delete_pod(&pod).await;
        sessions.wait_needs_resume(&name).await;
        sessions.resume(&name, "ha1").await;
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str())
        );

        // A leader that is shut down (SIGTERM) releases the lease on its way out: the next replica
        // need not wait out a lease duration.
        let mut follower = follower;
        let _third = operator().leader_election(&lease, &ns, "replica-c").start();
        assert_eq!(
            follower.terminate(Duration::from_secs(30)).await,
            Some(0),
            "a clean exit; log {}",
            follower.log().display()
        );
        let holder = lease_holder(&sessions, &lease).await;
        assert!(
            holder.as_deref() != Some("replica-b"),
            "released on shutdown: holder {holder:?}"
        );
        wait_lease_holder(&sessions, &lease, "replica-c", Duration::from_secs(30)).await;
    };
    sessions.run_with_operator(operator(), body).await;
}

/// A hostile agent (issue 30): a 1,000,000-byte name, 1,000,000-byte error messages, 1,001
/// config options (10,001 would be a line too dense to parse, issue 40: cut off, as
/// `agents_answering_with_dense_json_are_cut_off_and_the_operator_stays_in_its_memory` shows)
/// and, for a second session, a 1,000,000-byte session id. Every session still
/// reaches a clear state; what status keeps is within the CRD's bounds (the API server would
/// refuse more); every Event is published (the API server refuses a note over 1 KiB); the
/// operator's memory stays bounded.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_hostile_agent_gets_a_clear_state_and_every_event() {
    use kandev_operator::api::bounds::{AGENT_NAME_MAX, CONFIG_ITEMS_MAX, MESSAGE_MAX};
    let sessions = setup().await;
    let operator = operator().start();
    let body = async {
        // Its words are cut, its configuration bounded, and it runs.
        let name = unique("hostile");
        sessions.create(&name, "test-hostile").await;
        let (token, _) = started_and_waiting(&sessions, &name).await;
        let bounded = |er: Option<&kandev_operator::api::ExecutorRunning>| {
            er.and_then(|er| er.status.as_ref()).is_some_and(|s| {
                s.session_config
                    .as_ref()
                    .is_some_and(|c| c.config_options.len() == CONFIG_ITEMS_MAX)
            })
        };
        let er = sessions
            .wait_executor(&name, "the bounded session configuration", bounded)
            .await;
        let status = er.status.expect("status");
        let agent = status.capabilities.and_then(|c| c.agent_name);
        assert!(
            agent.as_ref().is_some_and(|a| a.len() <= AGENT_NAME_MAX),
            "{agent:?}"
        );
        // 1,000,000-byte errors on the resume (resume, then load): the token kept, the message
        // bounded, the failure's Event published (its note, two quoted errors long, is cut to
        // the API server's 1 KiB).
        sessions.lose(&name).await;
        let ts = sessions.resume(&name, "h1").await;
        let status = ts.status.expect("status");
        let resumed = condition(&status, conditions::RESUMED);
        assert_eq!(resumed.status, "False", "{resumed:?}");
        assert!(
            resumed.message.len() <= MESSAGE_MAX,
            "{}",
            resumed.message.len()
        );
        assert!(
            resumed.message.contains("Internal error EEE"),
            "{resumed:?}"
        );
        assert!(status.needs_resume);
        assert_eq!(
            sessions.token_of(&name).await.as_deref(),
            Some(token.as_str())
        );
        sessions
            .assert_events_in_order(
                &name,
                &[
                    "Starting",
                    "Started",
                    "AgentLost",
                    "ResumeRequested",
                    "ResumeFailed",
                ],
            )
            .await;

        // A 1,000,000-byte session id is refused, never cut into a token.
        let name = unique("hostileid");
        sessions.create(&name, "test-hostile-id").await;
        let message = failed_with(&sessions, &name).await;
        assert!(message.contains("sessionId of 1000000 bytes"), "{message}");
        assert!(message.len() <= MESSAGE_MAX);
        assert_eq!(sessions.token_of(&name).await, None);
        sessions
            .assert_events_in_order(&name, &["Starting", "LaunchFailed"])
            .await;
    };
    sessions.run(body).await;
    let log = std::fs::read_to_string(operator.log()).expect("the operator's log");
    assert!(
        !log.contains("could not publish an Event") && !log.contains("dropped an Event"),
        "an Event was refused or dropped; log {}",
        operator.log().display()
    );
    let peak = operator.peak_rss_mib();
    assert!(peak < 256.0, "the operator's peak RSS is {peak:.0} MiB");
}

/// The session's NetworkPolicy is applied, not only created: one of its name that is stale (here
/// allowing everything) is set back to the operator's (no ingress, egress as configured, owned by
/// the session); one controlled by another owner is refused, and the launch stalls as
/// InvalidSpec without a pod.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_stale_network_policy_is_set_back_and_a_foreign_one_refused() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kandev_operator::api::names::network_policy_name;

    let sessions = setup().await;
    let body = async {
        let _operator = operator().start();
        let policies: Api<NetworkPolicy> =
            Api::namespaced(sessions.client.clone(), &sessions.namespace);
        let policy = |name: &str, owners: serde_json::Value| -> NetworkPolicy {
            serde_json::from_value(json!({
                "metadata": {"name": network_policy_name(name), "ownerReferences": owners},
                "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]},
            }))
            .expect("NetworkPolicy")
        };

        let stale = unique("np-stale");
        policies
            .create(&PostParams::default(), &policy(&stale, json!([])))
            .await
            .expect("create the stale policy");
        sessions.create(&stale, "claude-code").await;
        let ts = sessions.wait_waiting_for_input(&stale).await;
        let applied = policies
            .get(&network_policy_name(&stale))
            .await
            .expect("the policy");
        let spec = serde_json::to_value(applied.spec.clone()).expect("json");
        assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]), "{spec}");
        assert!(
            spec["ingress"]
                .as_array()
                .is_none_or(|rules| rules.is_empty()),
            "no ingress: {spec}"
        );
        assert_eq!(
            spec["egress"][0]["ports"][0]["port"], 53,
            "egress: DNS first, not everything: {spec}"
        );
        assert!(
            applied
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == ts.metadata.uid.as_ref()),
            "owned by the session: {applied:?}"
        );

        let foreign = unique("np-foreign");
        let owners: Api<ConfigMap> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
        let owner = owners
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("{foreign}-owner")}}))
                    .expect("ConfigMap"),
            )
            .await
            .expect("create the owner");
        let owned_by_it = json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(),
            "uid": owner.uid().expect("uid"), "controller": true,
        }]);
        policies
            .create(&PostParams::default(), &policy(&foreign, owned_by_it))
            .await
            .expect("create the foreign policy");
        sessions.create(&foreign, "claude-code").await;
        let ts = sessions
            .wait(
                &foreign,
                "Stalled InvalidSpec",
                condition_is(conditions::STALLED, "True", "InvalidSpec"),
            )
            .await;
        let status = ts.status.expect("status");
        let stalled = condition(&status, conditions::STALLED);
        assert!(
            stalled.message.contains("refused NetworkPolicy"),
            "{stalled:?}"
        );
        assert!(sessions.live_pods(&foreign).await.is_empty(), "no pod");
    };
    sessions.run(body).await;
}

/// An agent that takes longer to boot than the ACP timeout (here `initialize` answered after
/// 6 s, with `--acp-timeout-seconds 2`) is waited for within the launch deadline and asked again,
/// not failed: the first launch reaches WAITING_FOR_INPUT on its one pod, with no loss and no
/// failed resume, and a resume on it restores the saved session. (Issue 28's 45 s boot against
/// the default 30 s ACP timeout, scaled down: the same ratio, without 45 s in every run.)
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn an_agent_slow_to_boot_is_waited_for_within_the_launch_deadline() {
    let sessions = setup().await;
    let profiles = json!({"profiles": {"slow-boot": {
        "launch": ["kandev-test-agent", "--on-initialize", "slow:6",
                   "--new-session-id", "slow-session", "--known-session", "slow-session"],
        "nativeSessionResume": true,
    }}});
    let _operator = Operator::builder()
        .log_prefix("slow-boot-operator")
        .profiles("slow-boot-profiles.yaml", &profiles.to_string())
        .args(&["--acp-timeout-seconds", "2"])
        .start();
    let body = async {
        let name = unique("slow-boot");
        sessions.create_with_task(&name, "slow-boot", None).await;
        let first = poll(
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                sessions
                    .live_pods(&name)
                    .await
                    .into_iter()
                    .next()
                    .ok_or_else(|| "no pod yet".to_string())
            },
        )
        .await;
        sessions
            .wait_state_within(
                &name,
                SessionState::WaitingForInput,
                Duration::from_secs(90),
            )
            .await;
        let status = sessions.status(&name).await;
        assert!(sessions.token_of(&name).await.is_some(), "{status:#?}");
        assert!(!status.needs_resume, "{status:#?}");
        let pods = sessions.live_pods(&name).await;
        assert_eq!(pods.len(), 1, "one pod");
        assert_eq!(pods[0].uid(), first.uid(), "the pod it started with");
        let reasons = sessions.event_reasons(&name).await;
        assert!(
            !reasons
                .iter()
                .any(|r| r == "AgentLost" || r == "ResumeFailed" || r == "LaunchStalled"),
            "{reasons:?}"
        );

        // A resume on the same slow agent restores the saved session, not a failure.
        let token = sessions.token_of(&name).await.expect("a token");
        sessions.delete_pod(&first).await;
        sessions.wait_needs_resume(&name).await;
        let ts = sessions.resume(&name, "slow-1").await;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
        assert_eq!(
            sessions.token_of(&name).await,
            Some(token.clone()),
            "same token"
        );
        assert_eq!(sessions.live_pods(&name).await.len(), 1, "one pod");

        // Pressed again while that launch boots: the second request joins it (issue 41). No
        // second pod; both tokens answered by the one restore, the second one last.
        let pod = sessions.live_pods(&name).await.remove(0);
        sessions.delete_pod(&pod).await;
        sessions.wait_needs_resume(&name).await;
        sessions.annotate(&name, "slow-2").await;
        let latched = status_where(|s| s.active_resume_request.as_deref() == Some("slow-2"));
        sessions.wait(&name, "slow-2 latched", latched).await;
        sessions.annotate(&name, "slow-3").await;
        sessions
            .wait_handled_within(&name, "slow-3", Duration::from_secs(90))
            .await;
        let status = sessions.status(&name).await;
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
        assert!(
            status
                .recent_resume_requests
                .ends_with(&["slow-2".to_string(), "slow-3".to_string()]),
            "{status:#?}"
        );
        assert_eq!(
            sessions.live_pod_names(&name).await,
            [pod_name(&name, "slow-2")],
            "the first request's pod answered both"
        );
        assert_eq!(sessions.token_of(&name).await, Some(token), "same token");
        sessions
            .assert_events_in_order(&name, &["ResumeRequested", "ResumeJoined", "Resumed"])
            .await;
    };
    sessions.run(body).await;
}

/// Parsing bounded by cost (issue 40, part 2): 18 sessions whose agents answer `session/load`
/// with one 7 MiB line of tiny values (a dense array of zeros, many small objects, deep
/// nesting; six of each) are resumed at once under the chart's budget of 128 MiB. Each line is
/// within the 8 MiB replay line limit but would cost some 400 MiB once parsed: every agent is
/// cut off before its line is parsed, every session ends in a clear state (`Resumed=False`
/// naming the density, the token kept, a resume still possible), and the operator's peak RSS
/// stays under the chart's 256 Mi limit.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn agents_answering_with_dense_json_are_cut_off_and_the_operator_stays_in_its_memory() {
    const PER_SHAPE: usize = 6;
    let sessions = setup().await;
    let operator = operator().args(&["--acp-memory-budget-mib", "128"]).start();
    let body = async {
        let mut names = Vec::new();
        for profile in ["test-dense", "test-objects", "test-deep"] {
            for _ in 0..PER_SHAPE {
                let name = unique(profile.trim_start_matches("test-"));
                sessions.create(&name, profile).await;
                names.push(name);
            }
        }
        for name in &names {
            sessions.wait_waiting_for_input(name).await;
            sessions.lose(name).await;
        }
        for name in &names {
            sessions.annotate(name, "dense-1").await;
        }
        for name in &names {
            let ts = sessions.wait_handled(name, "dense-1").await;
            let status = ts.status.expect("status");
            let resumed = condition(&status, conditions::RESUMED);
            assert_eq!(resumed.status, "False", "{name}: {resumed:?}");
            assert!(
                resumed.message.contains("too dense to parse"),
                "{name}: {resumed:?}"
            );
            assert!(status.needs_resume, "{name}: {status:#?}");
            assert_eq!(
                sessions.token_of(name).await.as_deref(),
                Some("test-session-1"),
                "{name}: the token is kept"
            );
        }
        assert_eq!(operator.metric("kandev_acp_memory_reserved_bytes").await, 0);
    };
    sessions.run(body).await;
    let peak = operator.peak_rss_mib();
    eprintln!(
        "the operator's peak RSS after {} dense answers: {peak:.0} MiB",
        3 * PER_SHAPE
    );
    assert!(peak < 256.0, "the operator's peak RSS is {peak:.0} MiB");
}

/// One memory budget (issue 30, part 4): 40 sessions whose agents each replay a 30 MiB line on
/// `session/load` (under a replay line limit of 32 MiB) are resumed at once, under a budget of
/// 128 MiB (a restore with a load reserves 96 MiB in all, three times the replay line: one load
/// at a time). Every one is restored by its load, some after waiting for room
/// (`kandev_acp_memory_waits_total`), none fails, and the operator's peak RSS stays under the
/// chart's 256 Mi limit. (Without the budget, the same run peaked at 351 MiB with 32 sessions.
/// With the budget at twice the line, as it was then, restores that held their 2 MiB while
/// waiting for a load's 62 could fill the budget, 40 × 2 + 62 > 128, and wait for one another
/// forever; a load gives back what it holds before it waits, as the unit test
/// `connections_that_grow_together_never_wait_for_each_other` shows.)
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn replaying_agents_wait_for_the_memory_budget_and_all_resume() {
    const N: usize = 40;
    let sessions = setup().await;
    let operator = operator()
        .args(&["--acp-memory-budget-mib", "128"])
        .args(&["--acp-replay-line-limit-mib", "32"])
        .start();
    let body = async {
        let names: Vec<String> = (0..N).map(|_| unique("replay")).collect();
        for name in &names {
            sessions.create(name, "test-replay").await;
        }
        for name in &names {
            sessions.wait_waiting_for_input(name).await;
            sessions.lose(name).await;
        }
        assert_eq!(operator.metric("kandev_acp_memory_waits_total").await, 0);
        for name in &names {
            sessions.annotate(name, "budget-1").await;
        }
        // One load at a time, in no set order: the last of 40 may wait for the other 39 (a CI
        // run saw one restored 98 s after its request, past the default 60 s).
        for name in &names {
            let ts = sessions
                .wait_handled_within(name, "budget-1", Duration::from_secs(300))
                .await;
            let status = ts.status.expect("status");
            assert_eq!(
                status.state,
                SessionState::WaitingForInput,
                "{name}: {status:#?}"
            );
            assert!(!status.needs_resume, "{name}: {status:#?}");
            let resumed = condition(&status, conditions::RESUMED);
            assert_eq!(
                (resumed.status.as_str(), resumed.reason.as_str()),
                ("True", "Restored"),
                "{name}: {resumed:?}"
            );
            assert_eq!(
                sessions.token_of(name).await.as_deref(),
                Some("test-session-1"),
                "{name}: the loaded session"
            );
        }
        let waits = operator.metric("kandev_acp_memory_waits_total").await;
        assert!(waits > 0, "no restore waited for the budget");
        assert_eq!(operator.metric("kandev_acp_memory_reserved_bytes").await, 0);
        eprintln!("{N} replaying resumes: {waits} waited for the memory budget");
    };
    sessions.run(body).await;
    let peak = operator.peak_rss_mib();
    eprintln!("the operator's peak RSS: {peak:.0} MiB");
    assert!(peak < 256.0, "the operator's peak RSS is {peak:.0} MiB");
}
