//! End-to-end: a workspace from a repository (`spec.repository`). Real git servers on loopback,
//! started by each test and stopped after it (`git daemon`, and `git http-backend` behind an
//! HTTPS server with basic auth), the operator as a local process, agentctl pods played by the
//! harness (their workspace volume is a local directory, so `git` runs on this machine). Run by
//! `bash e2e/test.sh` (see e2e/README.md).

mod e2e_support;

use std::time::Duration;

use e2e_support::git::{GitDaemon, HttpsGit, Repositories};
use e2e_support::operator::Operator;
use e2e_support::sessions::{Sessions, handled, needs_resume};
use e2e_support::{pod_sh as sh, unique, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kandev_operator::api::{SessionState, TaskSession, WorktreeStatus};
use kandev_operator::controller::conditions;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A cluster client with the CRDs installed, and a namespace of the test's own.
async fn setup() -> Sessions {
    Sessions::fresh("kandev-e2e-repository").await
}

/// A claude-code session without a first prompt (it boots idle) on a template workspace, with
/// `repository`.
async fn create_session(sessions: &Sessions, name: &str, repository: serde_json::Value) {
    let mut ts = sessions.new_session_with_task(
        name,
        "claude-code",
        None,
        json!({"template": {"size": "1Gi"}}),
    );
    ts.spec.repository = Some(serde_json::from_value(repository).expect("repository"));
    sessions
        .sessions()
        .create(&PostParams::default(), &ts)
        .await
        .expect("create TaskSession");
}

async fn waiting_for_input(sessions: &Sessions, name: &str) -> TaskSession {
    sessions
        .wait_state(name, SessionState::WaitingForInput)
        .await
        .expect("session")
}

async fn worktree(sessions: &Sessions, name: &str) -> WorktreeStatus {
    let er = sessions
        .executors()
        .get(name)
        .await
        .expect("ExecutorRunning");
    er.status
        .and_then(|s| s.worktree)
        .unwrap_or_else(|| panic!("no worktree in ExecutorRunning {name}"))
}

async fn the_pod(sessions: &Sessions, name: &str) -> Pod {
    let pods = sessions.live_pods(name).await;
    assert_eq!(pods.len(), 1, "one agentctl pod");
    pods.into_iter().next().expect("pod")
}

/// Waits for `Stalled=True` with `reason` and returns its message; the pod is removed and the
/// session stays resumable.
async fn stalled(sessions: &Sessions, name: &str, reason: &str) -> String {
    let ts = wait_for(
        &sessions.sessions(),
        name,
        reason,
        |ts: Option<&TaskSession>| {
            ts.and_then(|t| t.status.as_ref())
                .and_then(|s| conditions::find(&s.conditions, conditions::STALLED))
                .is_some_and(|c| c.status == "True" && c.reason == reason)
        },
    )
    .await
    .expect("session");
    let status = ts.status.expect("status");
    assert_ne!(status.state, SessionState::Failed, "{status:#?}");
    assert!(status.needs_resume, "{status:#?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !sessions.live_pods(name).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the pod is removed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    conditions::find(&status.conditions, conditions::STALLED)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

async fn event_notes(sessions: &Sessions, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("events")
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// First start: the branch is created from baseBranch in the workspace, and the worktree is in
/// ExecutorRunning. The resume (with the git server gone: a re-clone would fail) finds the
/// worktree intact, the file the test wrote included.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_repository_is_cloned_on_first_start_and_kept_across_a_resume() {
    let sessions = setup().await;
    let _operator = Operator::builder().start();
    let body = async {
        let repos = Repositories::new();
        let upstream = repos.create("app");
        let daemon = GitDaemon::start(repos.path()).await;
        let name = unique("repo-clone");
        create_session(
            &sessions,
            &name,
            json!({"url": daemon.url("app"), "branch": "kandev/e2e", "baseBranch": "develop"}),
        )
        .await;

        waiting_for_input(&sessions, &name).await;
        let recorded = worktree(&sessions, &name).await;
        assert_eq!(
            recorded,
            WorktreeStatus {
                id: Some(name.clone()),
                pvc: Some(format!("{name}-workspace")),
                path: Some("/workspace".into()),
                branch: Some("kandev/e2e".into()),
                commit: Some(upstream.develop.clone()),
            }
        );
        let pod = the_pod(&sessions, &name).await;
        let client = sessions.client.clone();
        assert_eq!(
            sh(
                &client,
                &pod,
                "git rev-parse --abbrev-ref HEAD && test -f DEVELOP.md && echo ok"
            )
            .await,
            "kandev/e2e\nok"
        );
        sh(&client, &pod, "echo kept > from-the-test.txt").await;

        // No git server any more: the resume must not need one.
        drop(daemon);
        sessions.delete_pod(&pod).await;
        wait_for(&sessions.sessions(), &name, "needsResume", needs_resume()).await;
        sessions.annotate(&name, "r1").await;
        wait_for(&sessions.sessions(), &name, "handled r1", handled("r1")).await;
        waiting_for_input(&sessions, &name).await;
        let pod = the_pod(&sessions, &name).await;
        assert_eq!(
            sh(
                &client,
                &pod,
                "cat from-the-test.txt && git status --porcelain && git rev-parse HEAD"
            )
            .await,
            format!("kept\n?? from-the-test.txt\n{}", upstream.develop)
        );
        assert_eq!(worktree(&sessions, &name).await, recorded);
    };
    sessions.run(body).await;
}

/// HTTPS with basic auth: a wrong password stalls the launch with a reason that names the
/// repository and never the secret; with the right one a new token clones the default branch.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_wrong_password_stalls_naming_the_repository_not_the_secret() {
    const WRONG: &str = "wrong-password-5678";
    let sessions = setup().await;
    let _operator = Operator::builder().start();
    let body = async {
        let repos = Repositories::new();
        let upstream = repos.create("app");
        let server = HttpsGit::start(repos.path(), "e2e", "right-password-1234").await;
        let name = unique("repo-auth");
        let secrets: Api<Secret> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
        let secret = |password: &str| -> Secret {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "stringData": {"username": "e2e", "password": password, "ca.pem": server.ca_pem},
            }))
            .expect("secret")
        };
        secrets
            .create(&PostParams::default(), &secret(WRONG))
            .await
            .expect("create secret");
        create_session(
            &sessions,
            &name,
            json!({"url": server.url("app"), "credentials": {"secretName": name,
                "usernameKey": "username", "passwordKey": "password", "caBundleKey": "ca.pem"}}),
        )
        .await;

        let message = stalled(&sessions, &name, "RepositoryAuthFailed").await;
        assert!(message.contains(&server.url("app")), "{message}");
        // The Events land beside the status (published by the operator's event queue).
        let _ = sessions
            .event_reasons_with(&name, &["CheckoutFailed"])
            .await;
        let ts = sessions.sessions().get(&name).await.expect("session");
        let everything = format!(
            "{}\n{:?}\n{:?}",
            serde_json::to_string(&ts).expect("json"),
            sessions.executors().get_opt(&name).await.ok().flatten(),
            event_notes(&sessions, &name).await
        );
        assert!(
            !everything.contains(WRONG),
            "the password leaked: {everything}"
        );
        assert!(
            event_notes(&sessions, &name)
                .await
                .iter()
                .any(|e| e.starts_with("CheckoutFailed: ")),
            "a CheckoutFailed Event"
        );

        secrets
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"password": "right-password-1234"}})),
            )
            .await
            .expect("fix the secret");
        sessions.annotate(&name, "fixed").await;
        wait_for(
            &sessions.sessions(),
            &name,
            "handled fixed",
            handled("fixed"),
        )
        .await;
        waiting_for_input(&sessions, &name).await;
        let recorded = worktree(&sessions, &name).await;
        assert_eq!(recorded.branch.as_deref(), Some("main"));
        assert_eq!(recorded.commit.as_deref(), Some(upstream.main.as_str()));
    };
    sessions.run(body).await;
}

/// A workspace that already holds something else than this repository is never cloned over:
/// the launch stalls with `WorkspaceMismatch`, and the files stay.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_workspace_holding_something_else_stalls_with_workspace_mismatch() {
    let sessions = setup().await;
    let _operator = Operator::builder().start();
    let body = async {
        let repos = Repositories::new();
        repos.create("app");
        let daemon = GitDaemon::start(repos.path()).await;
        let name = unique("repo-mismatch");
        // A session without a repository writes into its workspace…
        let ts = sessions.new_session_with_task(
            &name,
            "claude-code",
            None,
            json!({"template": {"size": "1Gi"}}),
        );
        sessions
            .sessions()
            .create(&PostParams::default(), &ts)
            .await
            .expect("create");
        waiting_for_input(&sessions, &name).await;
        let client = sessions.client.clone();
        let pod = the_pod(&sessions, &name).await;
        sh(&client, &pod, "echo mine > notes.txt").await;
        sessions.delete_pod(&pod).await;
        wait_for(&sessions.sessions(), &name, "needsResume", needs_resume()).await;
        // …then gets one, and is resumed.
        sessions
            .sessions()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"repository": {"url": daemon.url("app")}}})),
            )
            .await
            .expect("add the repository");
        sessions.annotate(&name, "m1").await;
        let message = stalled(&sessions, &name, "WorkspaceMismatch").await;
        assert!(
            message.contains("is not empty") && message.contains(&daemon.url("app")),
            "{message}"
        );
        // Nothing was cloned over it: without the repository, the next start finds the workspace
        // as it was.
        sessions
            .sessions()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"repository": null}})),
            )
            .await
            .expect("remove the repository");
        sessions.annotate(&name, "m2").await;
        wait_for(&sessions.sessions(), &name, "handled m2", handled("m2")).await;
        waiting_for_input(&sessions, &name).await;
        let pod = the_pod(&sessions, &name).await;
        assert_eq!(
            sh(
                &client,
                &pod,
                "cat notes.txt && ls -a | grep -c '^.git$' || true"
            )
            .await,
            "mine\n0"
        );
    };
    sessions.run(body).await;
}
