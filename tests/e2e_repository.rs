//! End-to-end: a workspace from a repository (`spec.repository`). Real git servers on loopback,
//! started by each test and stopped after it (`git daemon`, and `git http-backend` behind an
//! HTTPS server with basic auth), the operator as a local process, agentctl pods played by the
//! harness (their workspace volume is a local directory, so `git` runs on this machine). Run by
//! `bash e2e/test.sh` (see e2e/README.md).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use e2e_support::git::{GitDaemon, HttpsGit, Repositories, leak_check, plant_hostile_git_config};
use e2e_support::operator::Operator;
use e2e_support::procs;
use e2e_support::sessions::{Sessions, condition_is};
use e2e_support::{pod_sh as sh, unique};
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kandev_operator::api::conditions;
use kandev_operator::api::{SessionState, WorktreeStatus};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A cluster client with the CRDs installed, and a namespace of the test's own.
async fn setup() -> Sessions {
    Sessions::fresh("kandev-e2e-repository").await
}

/// A claude-code session without a first prompt (it boots idle) on a template workspace, with
/// `repository`.
async fn create_session(sessions: &Sessions, name: &str, repository: serde_json::Value) {
    sessions
        .create_with_repository(name, "claude-code", repository)
        .await;
}

async fn worktree(sessions: &Sessions, name: &str) -> WorktreeStatus {
    let er = sessions.executor(name).await;
    er.status
        .and_then(|s| s.worktree)
        .unwrap_or_else(|| panic!("no worktree in ExecutorRunning {name}"))
}

/// Loses the session's one pod `pod` and waits until the session needs a resume.
async fn lose_pod(sessions: &Sessions, name: &str, pod: &Pod) {
    sessions.delete_pod(pod).await;
    sessions.wait_needs_resume(name).await;
}

/// Resumes the session with `token` and waits until it is WAITING_FOR_INPUT; its one pod then.
async fn resumed_pod(sessions: &Sessions, name: &str, token: &str) -> Pod {
    sessions.resume(name, token).await;
    sessions.wait_waiting_for_input(name).await;
    sessions.the_pod(name).await
}

/// Waits for `Stalled=True` with `reason` and returns its message; the pod is removed and the
/// session stays resumable.
async fn stalled(sessions: &Sessions, name: &str, reason: &str) -> String {
    let stalled_with = condition_is(conditions::STALLED, "True", reason);
    let ts = sessions.wait(name, reason, stalled_with).await;
    let status = ts.status.expect("status");
    assert_ne!(status.state, SessionState::Failed, "{status:#?}");
    assert!(status.needs_resume, "{status:#?}");
    sessions.wait_no_live_pods(name, "the pod is removed").await;
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

        sessions.wait_waiting_for_input(&name).await;
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
        let pod = sessions.the_pod(&name).await;
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
        lose_pod(&sessions, &name, &pod).await;
        let pod = resumed_pod(&sessions, &name, "r1").await;
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
    const RIGHT: &str = "right-password-1234";
    let sessions = setup().await;
    let operator = Operator::builder().start();
    let body = async {
        let repos = Repositories::new();
        let upstream = repos.create("app");
        let server = HttpsGit::start(repos.path(), "e2e", RIGHT).await;
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
        let log = std::fs::read_to_string(operator.log()).expect("the operator's log");
        assert!(
            !log.contains(WRONG),
            "the password is in the operator's log"
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
                &Patch::Merge(json!({"stringData": {"password": RIGHT}})),
            )
            .await
            .expect("fix the secret");
        sessions.resume(&name, "fixed").await;
        sessions.wait_waiting_for_input(&name).await;
        let recorded = worktree(&sessions, &name).await;
        assert_eq!(recorded.branch.as_deref(), Some("main"));
        assert_eq!(recorded.commit.as_deref(), Some(upstream.main.as_str()));

        // The password was the clone's, in the init container that ended: no process of the
        // pod holds it, in its environment or its memory, a client exec'd into it included.
        let pod = sessions.the_pod(&name).await;
        assert_pod_never_held(&sessions, &pod, &name, RIGHT).await;
    };
    sessions.run(body).await;
}

/// Issue 40, part 1: the agent owns its HOME and its clone on the workspace volume, and the
/// checkout that runs on every start holds the repository's password. The agent plants git
/// configuration that would run programs, trace the environment or rewrite the URL, in both;
/// the session is lost and resumed (the clone kept, no byte of the password on the volume,
/// where every planted program writes its environment). Then the agent wipes the clone and it is
/// lost and resumed again: a later start never clones, so it stalls with `WorkspaceEmpty`, and
/// with the repository removed from the spec the next start shows nothing was cloned and still
/// no password on the volume. The password is never in the operator's log. (The real agent's own git reads what it planted,
/// without credentials; that the checkout runs nothing planted is the CLI tier's test.)
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn git_configuration_the_agent_wrote_never_meets_the_credentials() {
    const PASSWORD: &str = "hostile-git-password-3319";
    let sessions = setup().await;
    let operator = Operator::builder().start();
    let body = async {
        let repos = Repositories::new();
        let upstream = repos.create("app");
        let server = HttpsGit::start(repos.path(), "e2e", PASSWORD).await;
        let name = unique("repo-hostile");
        let secrets: Api<Secret> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "stringData": {"username": "e2e", "password": PASSWORD, "ca.pem": server.ca_pem},
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
        create_session(
            &sessions,
            &name,
            json!({"url": server.url("app"), "credentials": {"secretName": name,
                "usernameKey": "username", "passwordKey": "password", "caBundleKey": "ca.pem"}}),
        )
        .await;
        sessions.wait_waiting_for_input(&name).await;
        let client = sessions.client.clone();
        let pod = sessions.the_pod(&name).await;
        let plant = plant_hostile_git_config(&server.url("app"));
        assert_eq!(sh(&client, &pod, &plant).await, "planted");

        // Kept: the clone of the first start, with its hostile configuration.
        lose_pod(&sessions, &name, &pod).await;
        let pod = resumed_pod(&sessions, &name, "h1").await;
        assert_eq!(sh(&client, &pod, &leak_check(PASSWORD)).await, "clean");
        let kept = worktree(&sessions, &name).await;
        assert_eq!(kept.commit.as_deref(), Some(upstream.main.as_str()));

        // The agent wiped the clone (its hostile HOME stays): the later start refuses the empty
        // workspace, and clones nothing.
        sh(
            &client,
            &pod,
            "find . -mindepth 1 -maxdepth 1 ! -name .kandev -exec rm -rf {} + && echo wiped",
        )
        .await;
        let token = sessions.token_of(&name).await;
        assert!(token.is_some());
        lose_pod(&sessions, &name, &pod).await;
        sessions.annotate(&name, "h2").await;
        let message = stalled(&sessions, &name, "WorkspaceEmpty").await;
        assert!(
            message.contains("empty") && message.contains("never made in their place"),
            "{message}"
        );
        assert_eq!(sessions.token_of(&name).await, token, "the token is kept");
        sessions
            .merge(&name, json!({"spec": {"repository": null}}))
            .await
            .expect("remove the repository");
        let pod = resumed_pod(&sessions, &name, "h3").await;
        assert_eq!(sh(&client, &pod, &leak_check(PASSWORD)).await, "clean");
        assert_eq!(
            sh(
                &client,
                &pod,
                "test -e README.md || test -e .git || echo nothing"
            )
            .await,
            "nothing",
            "nothing was cloned into the emptied workspace"
        );
        let log = std::fs::read_to_string(operator.log()).expect("the operator's log");
        assert!(
            !log.contains(PASSWORD),
            "the password is in the operator's log"
        );
    };
    sessions.run(body).await;
}

/// Reads the environment and the whole memory of every process of `pod` (as root, who may read
/// them all: what root does not find, the agent's user cannot find either), while an
/// `agentctl events` client is exec'd into it: none holds `secret`. The session's name, which
/// serve does hold, is found the same way, so the reading itself is proven to work.
async fn assert_pod_never_held(sessions: &Sessions, pod: &Pod, session: &str, secret: &str) {
    use kube::ResourceExt;
    let pods: Api<Pod> = Api::namespaced(sessions.client.clone(), &sessions.namespace);
    let params = kube::api::AttachParams::default()
        .stdout(true)
        .stderr(false);
    let mut client = pods
        .exec(&pod.name_any(), ["agentctl", "events"], &params)
        .await
        .expect("exec agentctl events");
    let mut stdout = client.stdout().expect("stdout");
    let mut first = [0u8; 1];
    tokio::io::AsyncReadExt::read_exact(&mut stdout, &mut first)
        .await
        .expect("the exec'd client answers");
    let uid = pod.uid().expect("pod uid");
    let pids = procs::pod_processes(&uid);
    let held: Vec<procs::Held> = pids
        .iter()
        .map(|pid| procs::holds(*pid, secret.as_bytes()))
        .collect();
    let control: Vec<procs::Held> = pids
        .iter()
        .map(|pid| procs::holds(*pid, session.as_bytes()))
        .collect();
    eprintln!("the pod's processes: {held:#?}");
    let cmdlines: Vec<&str> = held.iter().map(|h| h.cmdline.as_str()).collect();
    for part in ["agentctl serve", "agentctl events", "claude-agent-acp"] {
        assert!(
            cmdlines.iter().any(|c| c.contains(part)),
            "no {part:?} among the pod's processes: {cmdlines:?}"
        );
    }
    let serve = control
        .iter()
        .find(|h| h.cmdline.contains("agentctl serve"))
        .expect("serve");
    assert!(
        serve.in_environ && serve.in_memory && serve.memory_read > 0,
        "the reading works: serve's environment and memory name the session: {serve:?}"
    );
    // A process that ended during the scan (a readiness probe's exec) could not be read.
    let unread: Vec<&procs::Held> = held
        .iter()
        .filter(|h| {
            h.memory_read == 0 && std::path::Path::new(&format!("/proc/{}", h.pid)).exists()
        })
        .collect();
    assert!(unread.is_empty(), "memory not read: {unread:#?}");
    let found: Vec<&procs::Held> = held
        .iter()
        .filter(|h| h.in_environ || h.in_memory)
        .collect();
    assert!(
        found.is_empty(),
        "the repository's password is held by {found:#?}"
    );
    drop(stdout);
    drop(client);
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
        sessions.create_with_task(&name, "claude-code", None).await;
        sessions.wait_waiting_for_input(&name).await;
        let client = sessions.client.clone();
        let pod = sessions.the_pod(&name).await;
        sh(&client, &pod, "echo mine > notes.txt").await;
        lose_pod(&sessions, &name, &pod).await;
        // …then gets one, and is resumed.
        let repository = json!({"spec": {"repository": {"url": daemon.url("app")}}});
        sessions
            .merge(&name, repository)
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
            .merge(&name, json!({"spec": {"repository": null}}))
            .await
            .expect("remove the repository");
        let pod = resumed_pod(&sessions, &name, "m2").await;
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
