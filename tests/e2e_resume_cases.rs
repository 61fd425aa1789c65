//! End-to-end: the resume cases of DESIGN §3 at the operator level, against the scriptable
//! `kandev-test-agent` in agentctl pods played by the harness (the agent runs on this machine,
//! so its call log, `--log`, is a local file the test reads):
//!
//! - case C: a session lost while working on its task, resumed fresh: the task description
//!   reaches the new agent exactly once;
//! - history injection: the agent cannot restore its session (it does not know the token), so a
//!   fresh one starts, and the user's next prompt reaches it wrapped once in the recorded history;
//!   `lastMessageUUID` follows the agent's message ids across it; ExecutorRunning status has
//!   the operator's field manager as its one writer, and fields an older operator's field
//!   managers share go when the status no longer holds them;
//! - a repository session resumed with its worktree intact: a commit and an uncommitted change
//!   made in the workspace before the loss are there after the resume, on the same branch and
//!   HEAD (a real `git daemon` on loopback, stopped before the resume);
//! - the session's mode across a resume: the agent switches to `plan` during the task,
//!   ExecutorRunning `status.sessionConfig` says so, the restored agent comes back with its
//!   default mode and agentctl sets `plan` back (and nothing else, the rest being unchanged).
//!
//! Run by `bash e2e/test.sh` (see e2e/README.md): `#[ignore]`d for plain `cargo test`, failing
//! (never skipping) without a cluster.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::path::PathBuf;
use std::time::Duration;

use e2e_support::git::{GitDaemon, Repositories};
use e2e_support::operator::{Operator, OperatorBuilder};
use e2e_support::sessions::{
    Sessions, assert_condition, condition, executor_status_where, status_where, template_workspace,
};
use e2e_support::{plugin, pod_sh as sh, poll, unique};
use k8s_openapi::api::core::v1::PersistentVolume;
use kandev_operator::api::ExecutorRunning;
use kandev_operator::api::conditions;
use kandev_operator::api::{
    AgentActivity, ConfigOptionValue, ExecutorPhase, ExecutorRunningStatus, RESUME_ANNOTATION,
    RESUME_FRESH_ANNOTATION, SessionConfigState, SessionState, WorktreeStatus,
};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Where the scripted agent logs, relative to its working directory (the workspace): under
/// `.kandev/`, which agentctl keeps out of git. (An absolute path would not do: the harness maps
/// paths under the pod's mounts, `/tmp` included, to directories of the pod.)
const AGENT_LOG: &str = ".kandev/test-agent.log";

/// The scripted agent's call log, read from the session's workspace volume on this machine.
struct AgentLog {
    path: PathBuf,
}

impl AgentLog {
    /// The log in the session's workspace: the harness provisions each PVC as a hostPath PV
    /// on a local directory.
    async fn of(sessions: &Sessions, name: &str) -> Self {
        let claim = sessions
            .claims()
            .get(&format!("{name}-workspace"))
            .await
            .expect("workspace PVC");
        let volume = claim
            .spec
            .and_then(|s| s.volume_name)
            .expect("a bound workspace PVC");
        let volumes: Api<PersistentVolume> = Api::all(sessions.client.clone());
        let dir = volumes
            .get(&volume)
            .await
            .expect("workspace PV")
            .spec
            .and_then(|s| s.host_path)
            .map(|h| PathBuf::from(h.path))
            .expect("a hostPath PV (the harness's)");
        Self {
            path: dir.join(AGENT_LOG),
        }
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The log split per agent process: each starts with the `initialize` agentctl sends.
    fn per_process(&self) -> Vec<Vec<String>> {
        let mut processes: Vec<Vec<String>> = Vec::new();
        for line in self.lines() {
            if line == "initialize" || processes.is_empty() {
                processes.push(Vec::new());
            }
            if let Some(current) = processes.last_mut() {
                current.push(line);
            }
        }
        processes
    }

    /// Polls the log until `predicate` holds for its per-process split.
    async fn wait(
        &self,
        what: &str,
        predicate: impl Fn(&[Vec<String>]) -> bool,
    ) -> Vec<Vec<String>> {
        poll(
            Duration::from_secs(30),
            Duration::from_millis(100),
            async || {
                let processes = self.per_process();
                if predicate(&processes) {
                    return Ok(processes);
                }
                Err(format!("the agent log never showed {what}: {processes:?}"))
            },
        )
        .await
    }

    /// The texts of the prompts one process received (`prompt-text <JSON string>` lines).
    fn prompts(process: &[String]) -> Vec<String> {
        process
            .iter()
            .filter_map(|l| l.strip_prefix("prompt-text "))
            .map(|json| serde_json::from_str::<String>(json).expect("a JSON string"))
            .collect()
    }
}

/// A test operator whose only extra profile, `name`, runs the scripted agent with `args`, its
/// call log and prompt texts in [`AGENT_LOG`], and message ids on its answers.
fn operator(name: &str, args: &[&str], injection: bool) -> OperatorBuilder {
    let mut launch = vec![
        "kandev-test-agent".to_string(),
        "--log".into(),
        AGENT_LOG.into(),
        "--log-prompt-text".into(),
        "--message-ids".into(),
    ];
    launch.extend(args.iter().map(|a| a.to_string()));
    let profiles = json!({"profiles": {name: {
        "launch": launch,
        "nativeSessionResume": true,
        "historyContextInjection": injection,
    }}});
    Operator::builder()
        .log_prefix("resume-cases-operator")
        .profiles("resume-cases-profiles.yaml", &profiles.to_string())
}

/// A cluster client with the CRDs installed, and a namespace of the test's own.
async fn setup() -> Sessions {
    Sessions::fresh("kandev-e2e-resume-cases").await
}

/// The ExecutorRunning's status now.
async fn executor_status(sessions: &Sessions, name: &str) -> ExecutorRunningStatus {
    sessions.executor(name).await.status.expect("ER status")
}

/// Waits until the ExecutorRunning's status says `what` (`holds` for it).
async fn wait_executor_status(
    sessions: &Sessions,
    name: &str,
    what: &str,
    holds: impl Fn(&ExecutorRunningStatus) -> bool,
) {
    sessions
        .wait_executor(name, what, executor_status_where(holds))
        .await;
}

/// Waits until the ExecutorRunning's `lastMessageUUID` is `expected`.
async fn last_message_is(sessions: &Sessions, name: &str, expected: Option<&str>) {
    let what = format!("lastMessageUUID {expected:?}");
    wait_executor_status(sessions, name, &what, |s| {
        s.last_message_uuid.as_deref() == expected
    })
    .await;
}

/// The field managers of the ExecutorRunning's status, by name.
async fn status_managers(sessions: &Sessions, name: &str) -> Vec<String> {
    let er = sessions.executor(name).await;
    er.managed_fields()
        .iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager.clone())
        .collect()
}

/// Once the session needs a resume (its agent lost by the test), resumes it with `token`; the
/// Resumed condition's status and reason then.
async fn resumed_after_loss(sessions: &Sessions, name: &str, token: &str) -> (String, String) {
    sessions.wait_needs_resume(name).await;
    sessions.resume(name, token).await;
    let status = sessions.status(name).await;
    let resumed = condition(&status, conditions::RESUMED);
    (resumed.status.clone(), resumed.reason.clone())
}

/// Case C (DESIGN §3): a session lost while its agent works on the task description, resumed
/// with a fresh start (`kandev.dev/resume-fresh`: the saved token is ignored, as if there were
/// none). The new agent gets `session/new` and the task description exactly once, and nothing
/// asks it to restore anything; the session is RUNNING again, on a new token.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn case_c_sends_the_task_description_again_exactly_once() {
    const TASK: &str = "Fix the flaky login test.\nKeep the fix small.";
    let sessions = setup().await;
    let operator = operator(
        "case-c",
        &["--on-prompt", "hang", "--unique-session-ids"],
        false,
    )
    .start();
    let body = async {
        let name = unique("case-c");
        sessions.create_with_task(&name, "case-c", Some(TASK)).await;
        sessions.wait_state(&name, SessionState::Running).await;
        let first_token = sessions.token_of(&name).await.expect("a token");
        let log = AgentLog::of(&sessions, &name).await;
        let processes = log
            .wait("the first prompt", |p| {
                p.len() == 1 && !AgentLog::prompts(&p[0]).is_empty()
            })
            .await;
        assert_eq!(AgentLog::prompts(&processes[0]), [TASK]);

        sessions.lose(&name).await;
        // While the launch runs, the session is STARTING and remembers where it goes back to: a
        // prompt is re-sent, so RUNNING. (A watch sees every state the operator persists.)
        let restarting = status_where(|s| {
            s.state == SessionState::Starting
                && s.previous_state == Some(SessionState::Running)
                && s.active_resume_request.as_deref() == Some("c1")
        });
        let starting = sessions.watch_for(&name, restarting).await;
        // A fresh resume requested.
        let fresh = json!({RESUME_ANNOTATION: "c1", RESUME_FRESH_ANNOTATION: "c1"});
        sessions.annotate_as_user(&name, fresh).await;
        let ts = sessions.wait_handled(&name, "c1").await;
        assert!(
            starting.await.expect("the STARTING watch"),
            "never STARTING"
        );
        let generation = ts.metadata.generation;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::Running, "{status:#?}");
        assert!(!status.needs_resume, "{status:#?}");
        assert_eq!(
            status.previous_state, None,
            "cleared once the launch is done"
        );
        assert_eq!(status.executor_ref.as_deref(), Some(name.as_str()));
        assert_eq!(status.observed_generation, generation);
        let now = sessions.status(&name).await;
        let resumed = assert_condition(&now, conditions::RESUMED, ("True", "Started"));
        assert!(
            resumed.message.contains("sent the task description"),
            "{}",
            resumed.message
        );
        let token = sessions.token_of(&name).await.expect("a token");
        assert_ne!(token, first_token, "a fresh session has a new token");
        // The executor record of the new launch.
        let pod = sessions.the_pod(&name).await;
        let er = executor_status(&sessions, &name).await;
        assert_eq!(er.status, Some(ExecutorPhase::Running));
        assert_eq!(
            er.activity,
            Some(AgentActivity::Working),
            "the prompt hangs"
        );
        assert!(er.resumable);
        assert_eq!(er.pod_name.as_deref(), Some(pod.name_any().as_str()));
        assert_eq!(er.pod_uid, pod.metadata.uid);
        assert_eq!(er.agent_execution_id, pod.metadata.uid);
        assert!(er.last_seen_at.is_some());
        assert_eq!(
            er.last_message_uuid, None,
            "no message of the new session yet"
        );
        let capabilities = er.capabilities.expect("capabilities");
        assert_eq!(
            capabilities.agent_name.as_deref(),
            Some("kandev-test-agent")
        );
        assert_eq!(
            capabilities.agent_version.as_deref(),
            Some(env!("CARGO_PKG_VERSION")),
            "the test agent reports this crate's version"
        );
        assert!(capabilities.load_session && capabilities.session_resume);
        assert_eq!(capabilities.protocol_version, Some(1));

        // Several looks at the session later: still exactly once (no retry, no second dispatch).
        operator.await_reconciles(4).await;
        let processes = log.per_process();
        assert_eq!(processes.len(), 2, "one new agent process: {processes:?}");
        let resumed = &processes[1];
        assert_eq!(
            AgentLog::prompts(resumed),
            [TASK],
            "the description, once and unwrapped: {resumed:?}"
        );
        let calls: Vec<&str> = resumed
            .iter()
            .filter(|l| !l.starts_with("prompt-text "))
            .map(|l| l.split(' ').next().unwrap_or_default())
            .collect();
        assert_eq!(
            calls,
            ["initialize", "session/new", "session/prompt"],
            "a fresh start restores nothing: {resumed:?}"
        );
        assert!(
            resumed.contains(&format!("session/prompt {token}")),
            "{resumed:?}"
        );
        assert_eq!(sessions.live_pods(&name).await.len(), 1);
    };
    sessions.run(body).await;
}

/// History injection after a fresh-start resume: the agent does not know the saved session
/// (-32002), so the resume starts a fresh one (TokenRejected) and the user's next prompt reaches
/// the agent wrapped once in the recorded history; the prompt after it is not wrapped again.
/// `lastMessageUUID` is the id of the agent's last answer, dropped with the old session and
/// filled again by the new one's answers. The operator's field manager is the status's one
/// writer; a `lastMessageUUID` that the field manager of an older operator wrote (and that the
/// operator's applies then share) still goes with the old session.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn history_is_injected_once_after_a_fresh_start_resume() {
    const TASK: &str = "Say hello.";
    let sessions = setup().await;
    let _operator = operator("inject", &["--unique-session-ids"], true).start();
    let body = async {
        let name = unique("inject");
        sessions.create_with_task(&name, "inject", Some(TASK)).await;
        sessions.wait_waiting_for_input(&name).await;
        let old_token = sessions.token_of(&name).await.expect("a token");
        let log = AgentLog::of(&sessions, &name).await;
        last_message_is(&sessions, &name, Some(&format!("{old_token}/m-1"))).await;
        assert_eq!(status_managers(&sessions, &name).await, ["kandev-operator"]);
        // An older operator's event follower writes the last message id.
        let executors: Api<ExecutorRunning> =
            Api::namespaced(sessions.client.clone(), &sessions.namespace);
        let older = PatchParams {
            field_manager: Some("kandev-operator-journal".into()),
            ..Default::default()
        };
        let earlier = format!("{old_token}/m-0");
        let written = json!({"status": {"lastMessageUUID": earlier}});
        executors
            .patch_status(&name, &older, &Patch::Merge(&written))
            .await
            .expect("an older operator's write");
        assert!(
            status_managers(&sessions, &name)
                .await
                .contains(&"kandev-operator-journal".to_string())
        );

        sessions.lose_pods(&name).await;
        sessions.wait_needs_resume(&name).await;
        let lost = executor_status(&sessions, &name).await;
        assert_eq!(
            (
                lost.status,
                lost.activity,
                lost.last_message_uuid.as_deref()
            ),
            (Some(ExecutorPhase::Lost), None, Some(earlier.as_str())),
        );
        let (ok, reason) = resumed_after_loss(&sessions, &name, "h1").await;
        assert_eq!((ok.as_str(), reason.as_str()), ("False", "TokenRejected"));
        let token = sessions.token_of(&name).await.expect("a token");
        assert_ne!(token, old_token, "the rejected token is replaced");
        let er = sessions.executor(&name).await;
        assert_eq!(
            er.status.and_then(|s| s.last_message_uuid),
            None,
            "the old session's message id went with its token"
        );
        let processes = log.per_process();
        assert_eq!(processes.len(), 2, "{processes:?}");
        assert_eq!(
            AgentLog::prompts(&processes[1]),
            Vec::<String>::new(),
            "a rejected token boots idle: nothing sent on its own"
        );
        assert!(
            processes[1].contains(&format!("session/resume {old_token}")),
            "{processes:?}"
        );

        for prompt in ["What did you do so far?", "And then?"] {
            let run = plugin(&["prompt", &name, prompt, "-n", &sessions.namespace]).await;
            assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
        }
        let processes = log.per_process();
        let prompts = AgentLog::prompts(&processes[1]);
        assert_eq!(prompts.len(), 2, "{prompts:?}");
        let wrapped = &prompts[0];
        assert!(
            wrapped.starts_with("RESUME CONTEXT FOR CONTINUING TASK"),
            "{wrapped}"
        );
        let history = format!("[USER]: {TASK}\n[ASSISTANT]: echo: {TASK}");
        let mut at = 0;
        for part in [
            "=== EXECUTION HISTORY ===",
            history.as_str(),
            "=== CURRENT REQUEST ===",
            "What did you do so far?",
            "=== INSTRUCTIONS ===",
        ] {
            let found = wrapped[at..].find(part).unwrap_or_else(|| {
                panic!("{part:?} (in this order) in the wrapped prompt:\n{wrapped}")
            });
            at += found + part.len();
        }
        assert_eq!(prompts[1], "And then?", "wrapped once, not twice");
        // The new session's answers carry their ids (m-1, m-2 of the new agent process).
        last_message_is(&sessions, &name, Some(&format!("{token}/m-2"))).await;
        let er = executor_status(&sessions, &name).await;
        assert_eq!(er.activity, Some(AgentActivity::Idle));
        assert!(
            er.journal_cursor.is_some_and(|c| c >= 4),
            "the journal's entries were applied: {:?}",
            er.journal_cursor
        );
        assert_eq!(
            status_managers(&sessions, &name).await,
            ["kandev-operator"],
            "one writer, the older one's share gone"
        );
    };
    sessions.run(body).await;
}

/// A repository session is resumed with its worktree intact: before the loss the workspace
/// gets a commit of its own (HEAD moves off upstream) and an uncommitted change to a tracked
/// file; the git server is stopped, so a clone could not even be tried. After the resume (the
/// agent restores its session), the same branch and HEAD, the commit, the change, and a
/// worktree status whose commit is that HEAD.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_repository_session_is_resumed_with_its_worktree_intact() {
    let sessions = setup().await;
    let _operator = operator(
        "repo-agent",
        &[
            "--new-session-id",
            "repo-session",
            "--known-session",
            "repo-session",
        ],
        false,
    )
    .start();
    let body = async {
        let repos = Repositories::new();
        let upstream = repos.create("app");
        let daemon = GitDaemon::start(repos.path()).await;
        let name = unique("repo-resume");
        let repository =
            json!({"url": daemon.url("app"), "branch": "kandev/resume", "baseBranch": "develop"});
        sessions
            .create_with_repository(&name, "repo-agent", repository)
            .await;
        sessions.wait_waiting_for_input(&name).await;
        let first = executor_status(&sessions, &name)
            .await
            .worktree
            .expect("worktree");
        assert_eq!(first.branch.as_deref(), Some("kandev/resume"));
        assert_eq!(first.commit.as_deref(), Some(upstream.develop.as_str()));
        let log = AgentLog::of(&sessions, &name).await;
        // Nothing prompted yet: `kubectl kandev history` runs `agentctl history` in the pod, which
        // exits 3 saying there is no recorded history (kwok's exec status carries no exit code, so
        // the plugin goes by agentctl's words here); the plugin says so and succeeds.
        let run = plugin(&["history", &name, "-n", &sessions.namespace]).await;
        let stderr = &run.stderr;
        assert_eq!(run.status.code(), Some(0), "{stderr}");
        assert_eq!(run.stdout, "");
        assert!(stderr.contains("has no recorded history yet"), "{stderr}");

        let client = sessions.client.clone();
        let pod = sessions.the_pod(&name).await;
        let head = sh(
            &client,
            &pod,
            "git -c user.name=agent -c user.email=agent@e2e.invalid commit -q --allow-empty \
             -m 'work of the agent' && echo local > LOCAL.md && git add LOCAL.md && \
             git -c user.name=agent -c user.email=agent@e2e.invalid commit -q -m 'add LOCAL.md' && \
             echo changed >> DEVELOP.md && git rev-parse HEAD",
        )
        .await;
        assert_ne!(
            head, upstream.develop,
            "the workspace has commits of its own"
        );
        let before = sh(
            &client,
            &pod,
            "git rev-parse --abbrev-ref HEAD && git status --porcelain && cat LOCAL.md",
        )
        .await;
        assert_eq!(before, "kandev/resume\n M DEVELOP.md\nlocal");

        drop(daemon);
        sessions.delete_pod(&pod).await;
        let (ok, reason) = resumed_after_loss(&sessions, &name, "w1").await;
        assert_eq!((ok.as_str(), reason.as_str()), ("True", "Restored"));
        let pod = sessions.the_pod(&name).await;
        let after = sh(
            &client,
            &pod,
            "git rev-parse --abbrev-ref HEAD && git status --porcelain && cat LOCAL.md && \
             tail -n 1 DEVELOP.md && git rev-parse HEAD",
        )
        .await;
        assert_eq!(after, format!("{before}\nchanged\n{head}"));
        let worktree = executor_status(&sessions, &name)
            .await
            .worktree
            .expect("worktree");
        assert_eq!(
            worktree,
            WorktreeStatus {
                commit: Some(head),
                ..first
            },
            "the worktree as agentctl found it at the new start"
        );
        let processes = log.per_process();
        assert_eq!(processes.len(), 2, "{processes:?}");
        assert!(
            processes[1].contains(&"session/resume repo-session".to_string()),
            "{processes:?}"
        );
    };
    sessions.run(body).await;
}

/// Waits until the ExecutorRunning's `sessionConfig` is `expected`.
async fn session_config_is(sessions: &Sessions, name: &str, expected: SessionConfigState) {
    let what = format!("sessionConfig {expected:?}");
    wait_executor_status(sessions, name, &what, |s| {
        s.session_config.as_ref() == Some(&expected)
    })
    .await;
}

/// Restore keeps config and model state: the mode the agent switched to before the loss is set
/// back on the restored session, whose agent came back with its default.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_resume_sets_the_sessions_mode_back() {
    let sessions = setup().await;
    let _operator = operator(
        "config-agent",
        &[
            "--session-config",
            "--new-session-id",
            "config-session",
            "--known-session",
            "config-session",
        ],
        false,
    )
    .start();
    let body = async {
        let name = unique("config");
        // The scripted agent switches its mode on this prompt (a current_mode_update).
        sessions
            .create_with_task(&name, "config-agent", Some("set-mode plan"))
            .await;
        sessions.wait_waiting_for_input(&name).await;
        let planned = SessionConfigState {
            mode: Some("plan".into()),
            model: Some("small".into()),
            config_options: vec![ConfigOptionValue {
                id: "effort".into(),
                value: "low".into(),
            }],
        };
        session_config_is(&sessions, &name, planned.clone()).await;
        let log = AgentLog::of(&sessions, &name).await;

        sessions.lose_pods(&name).await;
        let (ok, reason) = resumed_after_loss(&sessions, &name, "m1").await;
        assert_eq!((ok.as_str(), reason.as_str()), ("True", "Restored"));
        let processes = log
            .wait("the mode set back", |processes| {
                processes.len() == 2 && processes[1].iter().any(|l| l.starts_with("set "))
            })
            .await;
        let restored = &processes[1];
        let resume_at = restored
            .iter()
            .position(|l| l == "session/resume config-session")
            .unwrap_or_else(|| panic!("no resume: {restored:?}"));
        let set_backs: Vec<&String> = restored.iter().filter(|l| l.starts_with("set ")).collect();
        assert_eq!(set_backs, vec!["set mode plan"], "{restored:?}");
        let set_at = restored
            .iter()
            .position(|l| l == "set mode plan")
            .expect("set mode");
        assert!(set_at > resume_at, "{restored:?}");
        assert!(
            AgentLog::prompts(restored).is_empty(),
            "a restore sends no prompt: {restored:?}"
        );
        session_config_is(&sessions, &name, planned).await;
    };
    sessions.run(body).await;
}

/// spec.sessionConfig is set after a new session, before its task: a mode, a model and an
/// option the agent offers (SessionConfigured=True/Applied, and the ExecutorRunning shows them);
/// a mode it does not offer is reported (SessionConfigured=False/NotOffered naming what it
/// offers, a Warning Event) while the session runs on with what it has.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn the_spec_sets_the_sessions_mode_model_and_options() {
    let sessions = setup().await;
    let _operator = operator(
        "config-agent",
        &["--session-config", "--unique-session-ids"],
        false,
    )
    .start();
    let body = async {
        let configured = unique("configured");
        let mut ts = sessions.new_session_with_task(
            &configured,
            "config-agent",
            Some("hello"),
            template_workspace(),
        );
        ts.spec.session_config = Some(
            serde_json::from_value(
                json!({"mode": "plan", "model": "large", "options": {"effort": "high"}}),
            )
            .expect("sessionConfig"),
        );
        sessions.create_session(&ts).await;
        let unoffered = unique("unoffered");
        let mut ts =
            sessions.new_session_with_task(&unoffered, "config-agent", None, template_workspace());
        ts.spec.session_config =
            Some(serde_json::from_value(json!({"mode": "turbo"})).expect("sessionConfig"));
        sessions.create_session(&ts).await;

        sessions.wait_waiting_for_input(&configured).await;
        let wanted = SessionConfigState {
            mode: Some("plan".into()),
            model: Some("large".into()),
            config_options: vec![ConfigOptionValue {
                id: "effort".into(),
                value: "high".into(),
            }],
        };
        session_config_is(&sessions, &configured, wanted).await;
        let ts = sessions
            .wait(
                &configured,
                "SessionConfigured=True",
                status_where(|s| {
                    conditions::find(&s.conditions, conditions::SESSION_CONFIGURED)
                        .is_some_and(|c| c.status == "True" && c.reason == "Applied")
                }),
            )
            .await;
        assert_eq!(
            ts.status.expect("status").state,
            SessionState::WaitingForInput
        );
        let log = AgentLog::of(&sessions, &configured).await;
        let processes = log
            .wait("the sets and the task", |p| {
                p.len() == 1 && p[0].iter().any(|l| l.starts_with("session/prompt"))
            })
            .await;
        let lines = &processes[0];
        let at = |line: &str| lines.iter().position(|l| l == line);
        let prompt = lines
            .iter()
            .position(|l| l.starts_with("session/prompt"))
            .expect("the task");
        for set in ["set mode plan", "set model large", "set effort high"] {
            assert!(
                at(set).is_some_and(|i| i < prompt),
                "{set} before the task: {lines:?}"
            );
        }

        let ts = sessions
            .wait(
                &unoffered,
                "SessionConfigured=False",
                status_where(|s| {
                    conditions::find(&s.conditions, conditions::SESSION_CONFIGURED)
                        .is_some_and(|c| c.status == "False" && c.reason == "NotOffered")
                }),
            )
            .await;
        let status = ts.status.expect("status");
        assert_eq!(status.state, SessionState::WaitingForInput, "it runs on");
        let message = &condition(&status, conditions::SESSION_CONFIGURED).message;
        assert!(
            message.contains(r#"mode "turbo" (offered: default, plan)"#),
            "{message}"
        );
        sessions
            .assert_event(&unoffered, "SessionConfigNotOffered")
            .await;
    };
    sessions.run(body).await;
}
