//! End-to-end on a real node: the images that `make images` built from the Dockerfile, the Helm
//! chart, the operator as the chart's Deployment in real containers with its in-cluster config,
//! and a real claude-agent-acp in an agentctl container, all started by a real kubelet on
//! containerd (`KANDEV_NODE=real e2e/cluster.sh up`). Run by `make e2e-real` (e2e/real.sh);
//! `#[ignore]`d for plain `cargo test`.
//!
//! Environment (set by e2e/real.sh): KUBECONFIG, KANDEV_REAL_NODE (the real node's name),
//! KANDEV_CONTAINERD_ADDRESS (its containerd socket, for `ctr`).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use e2e_support::git::{HttpsGit, Repositories, leak_check, plant_hostile_git_config};
use e2e_support::sessions::{
    FIRST_PROMPT, Sessions, assert_condition, executor_status_where, status_where,
    template_workspace,
};
use e2e_support::support::chart::{self, RELEASE};
use e2e_support::support::process::{kubectl, run, run_with_stdin};
use e2e_support::{client, plugin, pod_sh, poll, unique, wait_for_within, with_cleanup};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kandev_operator::api::SessionState;
use kandev_operator::api::conditions;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const CHART_NS: &str = "kandev-real";
/// The password of the session's repository: only the clone may hold it.
const GIT_PASSWORD: &str = "real-node-git-password-4821";
/// A real pod starts in seconds once its image is in containerd; the operator's first start on
/// a cold node (leader election, caches) takes longer.
const START: Duration = Duration::from_secs(180);

fn env(name: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{name} is not set: run these tests with `make e2e-real`"))
}

/// `ctr ARGS` against the real node's containerd, in the kubelet's namespace; its stdout.
fn ctr(args: &[&str]) -> String {
    let out = run(Command::new("ctr")
        .args([
            "--address",
            &env("KANDEV_CONTAINERD_ADDRESS"),
            "--namespace",
            "k8s.io",
        ])
        .args(args));
    assert!(out.success(), "ctr {args:?}: {out:#?}");
    out.stdout
}

/// The chart installed as a user would (the images `make images` tagged, pulled never: they
/// were imported into the node), operator and agent pods on the real node; waits until the
/// Deployment is Available.
fn install() {
    let node = env("KANDEV_REAL_NODE");
    let chart = chart::chart_arg();
    chart::install_or_upgrade(
        CHART_NS,
        &[
            "install",
            RELEASE,
            &chart,
            "-n",
            CHART_NS,
            "--create-namespace",
            "--take-ownership",
            "--wait",
            "--timeout",
            "5m",
            "--set",
            "image.pullPolicy=Never",
            "--set-string",
            &format!("nodeSelector.kubernetes\\.io/hostname={node}"),
            "--set-string",
            &format!("agentPods.nodeSelector.kubernetes\\.io/hostname={node}"),
        ],
    );
}

fn uninstall() {
    chart::uninstall(CHART_NS, "2m");
    chart::delete_namespaces(&[CHART_NS]);
}

async fn operator_pods(client: &Client) -> Vec<Pod> {
    e2e_support::operator_pods(client, CHART_NS).await
}

/// The containerd id of `pod`'s container `name` (from the status the kubelet reports).
fn container_id(pod: &Pod, name: &str) -> String {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .expect("container statuses");
    let status = statuses
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no container {name} in {}", pod.name_any()));
    let id = status.container_id.as_deref().expect("a container id");
    id.strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("{id}: not a containerd container"))
        .to_string()
}

/// The host pid of a container's first process (`ctr tasks ls`).
fn task_pid(container: &str) -> u32 {
    ctr(&["tasks", "ls"])
        .lines()
        .find_map(|line| {
            let mut columns = line.split_whitespace();
            (columns.next() == Some(container))
                .then(|| columns.next().and_then(|pid| pid.parse().ok()))
                .flatten()
        })
        .unwrap_or_else(|| panic!("no running task of container {container}"))
}

/// Every descendant of `pid` (children first found through /proc/<pid>/task/*/children).
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

fn proc_file(pid: u32, file: &str) -> String {
    std::fs::read_to_string(PathBuf::from(format!("/proc/{pid}/{file}"))).unwrap_or_default()
}

/// What the runtime says about the agentctl container of `pod`, and about the agent process in
/// it: a read-only root, UID 1000, no service-account token anywhere in its mounts.
fn assert_agent_confined(pod: &Pod) {
    let container = container_id(pod, "agentctl");
    let info: serde_json::Value =
        serde_json::from_str(&ctr(&["containers", "info", &container])).expect("ctr info JSON");
    let spec = &info["Spec"];
    assert_eq!(
        spec["root"]["readonly"], true,
        "read-only root: {}",
        spec["root"]
    );
    assert_eq!(
        spec["process"]["user"]["uid"], 1000,
        "{}",
        spec["process"]["user"]
    );
    let mounts = spec["mounts"].as_array().expect("mounts");
    assert!(
        mounts.iter().all(|m| !m["destination"]
            .as_str()
            .unwrap_or_default()
            .contains("serviceaccount")),
        "no service-account token is mounted: {mounts:#?}"
    );
    // The agent itself, as the kernel sees it.
    let pid = task_pid(&container);
    let agent = descendants(pid)
        .into_iter()
        .find(|p| proc_file(*p, "cmdline").contains("claude-agent-acp"))
        .unwrap_or_else(|| panic!("no claude-agent-acp process under agentctl (pid {pid})"));
    let status = proc_file(agent, "status");
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    assert!(
        uids.split_whitespace().all(|u| u == "1000"),
        "the agent runs as 1000 (real, effective, saved, fs): {uids}"
    );
    eprintln!(
        "agent of pod {}: container {container}, claude-agent-acp pid {agent}, Uid {uids}",
        pod.name_any()
    );
    let mountinfo = proc_file(agent, "mountinfo");
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("the root mount");
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|o| o.split(',').any(|o| o == "ro")),
        "the agent's root is mounted read-only: {root}"
    );
    assert!(
        !mountinfo.contains("serviceaccount"),
        "no service-account token in the agent's mounts:\n{mountinfo}"
    );
}

/// The real node's address (its InternalIP), which its pods reach.
async fn node_ip(client: &Client) -> std::net::IpAddr {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .get(&env("KANDEV_REAL_NODE"))
        .await
        .expect("the real node");
    node.status
        .and_then(|s| s.addresses)
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse().ok())
        .expect("the real node's InternalIP")
}

/// Inside `pod`'s agentctl container, as its user (the agent's, 1000), while an `agentctl
/// events` client is exec'd into it: `tests/data/proc_scan.js` reads `/proc/*/environ` and
/// `/proc/*/mem` of every process it can see, and none holds `secret`. The session's name,
/// which serve holds, is found in serve's environment and memory the same way: the reading
/// itself works.
fn assert_no_process_holds(pod: &Pod, secret: &str, session: &str) {
    let namespace = pod.namespace().expect("namespace");
    let name = pod.name_any();
    let exec = |flags: &[&str]| {
        let mut cmd = kubectl();
        cmd.arg("exec")
            .args(flags)
            .args(["-n", &namespace, &name, "-c", "agentctl", "--"]);
        cmd
    };
    let mut client = exec(&[])
        .args(["agentctl", "events"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("exec agentctl events");
    std::thread::sleep(Duration::from_secs(2));
    let script = include_str!("data/proc_scan.js");
    let needles = json!({"secret": secret, "session": session}).to_string();
    let out = run_with_stdin(exec(&["-i"]).args(["node", "-e", script]), &needles);
    let _ = client.kill();
    let _ = client.wait();
    let report: Vec<serde_json::Value> =
        serde_json::from_str(&out.expect_success()).expect("the scan's JSON");
    let line = |e: &serde_json::Value| {
        format!(
            "pid {} {:?}: environ {}, memory {} ({} bytes), found {}",
            e["pid"], e["cmdline"], e["environ"], e["memory"], e["memoryRead"], e["found"]
        )
    };
    eprintln!(
        "processes in {} as the agent's user:\n{}",
        pod.name_any(),
        report.iter().map(line).collect::<Vec<_>>().join("\n")
    );
    let cmdline = |e: &serde_json::Value| e["cmdline"].as_str().unwrap_or_default().to_string();
    for part in ["agentctl serve", "agentctl events", "claude-agent-acp"] {
        assert!(
            report.iter().any(|e| cmdline(e).contains(part)),
            "no {part:?} process in the container"
        );
    }
    let serve = report
        .iter()
        .find(|e| cmdline(e).contains("agentctl serve"))
        .expect("serve");
    assert_eq!(
        serve["found"],
        json!(["session in environ", "session in memory"]),
        "the reading works: {}",
        line(serve)
    );
    let unread: Vec<String> = report
        .iter()
        .filter(|e| e["environ"] != "read" || e["memory"] != "read" || e["memoryRead"] == 0)
        .map(line)
        .collect();
    assert!(
        unread.is_empty(),
        "processes the agent's user could not read (so the check says nothing of them): {unread:#?}"
    );
    let holders: Vec<String> = report
        .iter()
        .filter(|e| {
            e["found"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f.as_str().is_some_and(|f| f.starts_with("secret")))
            })
        })
        .map(line)
        .collect();
    assert!(
        holders.is_empty(),
        "the repository's password is held by {holders:#?}"
    );
}

/// The ExecutorRunning says the agent's session runs in `mode`, and the session says its
/// configuration was applied.
async fn assert_mode(sessions: &Sessions, name: &str, mode: &str) {
    sessions
        .wait_executor(
            name,
            &format!("the agent's session in mode {mode}"),
            executor_status_where(|s| {
                s.session_config.as_ref().and_then(|c| c.mode.as_deref()) == Some(mode)
            }),
        )
        .await;
    let ts = sessions
        .wait(
            name,
            "SessionConfigured=True",
            status_where(|s| {
                kandev_operator::api::conditions::find(
                    &s.conditions,
                    kandev_operator::api::conditions::SESSION_CONFIGURED,
                )
                .is_some_and(|c| c.status == "True")
            }),
        )
        .await;
    assert!(ts.status.is_some());
}

async fn leader(client: &Client) -> String {
    let leases: Api<Lease> = Api::namespaced(client.clone(), CHART_NS);
    let names: Vec<String> = operator_pods(client)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    wait_for_within(
        &leases,
        "kandev-operator",
        "held by an operator pod",
        START,
        |l: Option<&Lease>| {
            l.and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| names.iter().any(|n| n == h))
        },
    )
    .await
    .and_then(|l| l.spec)
    .and_then(|s| s.holder_identity)
    .expect("a leader")
}

#[tokio::test]
#[ignore = "real: needs a real node (make e2e-real)"]
async fn a_real_agent_in_a_real_container_is_lost_and_resumed_and_the_operator_survives_a_kill() {
    let client = client().await;
    uninstall(); // leftovers of an interrupted run
    let sessions = Sessions::new(&client, &unique("real"));
    let body = async {
        install();
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), CHART_NS);
        let deployment = deployments.get(RELEASE).await.expect("Deployment");
        let available = deployment
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Available" && c.status == "True")
            });
        assert!(
            available,
            "the operator's Deployment is Available: {deployment:#?}"
        );
        for pod in operator_pods(&client).await {
            // The restores' memory budget: half of the chart's 256 Mi limit, read by the
            // operator from its container's cgroup.
            let log =
                run(kubectl().args(["logs", "-n", CHART_NS, &pod.name_any(), "-c", "operator"]))
                    .expect_success();
            let budget = log
                .lines()
                .find(|l| l.contains("ACP memory budget"))
                .unwrap_or_else(|| {
                    panic!("no memory budget in the log of {}:\n{log}", pod.name_any())
                });
            assert!(
                budget.contains("budget_mib=128") && budget.contains("container_limit_mib=256"),
                "{budget}"
            );
            // A real container of our image, as the chart's non-root user, with a read-only root.
            let container = container_id(&pod, "operator");
            let info: serde_json::Value =
                serde_json::from_str(&ctr(&["containers", "info", &container])).expect("JSON");
            assert_eq!(info["Spec"]["process"]["user"]["uid"], 65532);
            assert_eq!(info["Spec"]["root"]["readonly"], true);
            let image = info["Image"].as_str().unwrap_or_default();
            assert!(image.contains("kandev/kandev-operator:"), "{image}");
        }

        // A session on the default agentctl image: a real claude-agent-acp, in a workspace
        // cloned from a private repository (HTTPS, basic auth, on this node's address).
        sessions.ensure_namespace().await;
        let name = "real-session";
        let repos = Repositories::new();
        let upstream = repos.create("app");
        let git =
            HttpsGit::start_on(repos.path(), "e2e", GIT_PASSWORD, node_ip(&client).await).await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &sessions.namespace);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "app-git"},
            "stringData": {"username": "e2e", "password": GIT_PASSWORD, "ca.pem": git.ca_pem},
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the repository's secret");
        let mut ts = sessions.new_session_with_task(
            name,
            "claude-code",
            Some(FIRST_PROMPT),
            template_workspace(),
        );
        ts.spec.repository = Some(
            serde_json::from_value(json!({"url": git.url("app"), "credentials": {
                "secretName": "app-git", "usernameKey": "username", "passwordKey": "password",
                "caBundleKey": "ca.pem"}}))
            .expect("repository"),
        );
        // A mode the real agent offers, set after its start and after its resume (issue 45).
        ts.spec.session_config =
            Some(serde_json::from_value(json!({"mode": "acceptEdits"})).expect("sessionConfig"));
        sessions.create_session(&ts).await;
        sessions
            .wait_state_within(name, SessionState::WaitingForInput, START)
            .await;
        assert_mode(&sessions, name, "acceptEdits").await;
        let token = sessions
            .token_of(name)
            .await
            .expect("a resume token after session/new");
        let first = sessions.the_pod(name).await;
        assert_agent_confined(&first);
        let worktree = sessions
            .executor(name)
            .await
            .status
            .and_then(|s| s.worktree)
            .expect("a worktree");
        assert_eq!(worktree.commit.as_deref(), Some(upstream.main.as_str()));
        assert_no_process_holds(&first, GIT_PASSWORD, name);
        // Ready from the kubelet's own check: its readiness probe (`agentctl events --once`)
        // got an answer from agentctl inside the container.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &sessions.namespace);
        wait_for_within(
            &pods,
            &first.name_any(),
            "Ready by its readiness probe",
            START,
            |p: Option<&Pod>| {
                p.and_then(|p| p.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            },
        )
        .await;
        let claim = claim_of(&first);
        // The agent plants git configuration in its HOME and its clone that would hand the
        // checkout's credentials to it on the next start (issue 40, part 1).
        assert_eq!(
            pod_sh(&client, &first, &plant_hostile_git_config(&git.url("app"))).await,
            "planted"
        );

        // Lost: needsResume, and nothing is relaunched (lazy recovery).
        sessions.delete_pod(&first).await;
        sessions.wait_needs_resume(name).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            sessions.live_pods(name).await.is_empty(),
            "nothing is relaunched before a resume request"
        );

        // `kubectl kandev resume --wait`: a new container on the same claim, the same token.
        let out = plugin(&[
            "resume",
            name,
            "-n",
            &sessions.namespace,
            "--wait",
            "--timeout",
            "180s",
        ])
        .await;
        assert_eq!(out.code(), 0, "{out:#?}");
        let status = sessions.status(name).await;
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
        assert_eq!(
            sessions.token_of(name).await.as_deref(),
            Some(token.as_str())
        );
        let second = sessions.the_pod(name).await;
        assert_ne!(second.uid(), first.uid(), "a new pod");
        assert_eq!(claim_of(&second), claim, "on the same workspace claim");
        assert_agent_confined(&second);
        assert_mode(&sessions, name, "acceptEdits").await;
        // The clone was kept and no file holds the password.
        assert_eq!(
            pod_sh(&client, &second, &leak_check(GIT_PASSWORD)).await,
            "clean"
        );

        // The operator's container is killed mid-resume (its pod stays; the kubelet restarts
        // it, or the other replica takes over): exactly one agent pod, the same token.
        sessions.delete_pod(&second).await;
        sessions.wait_needs_resume(name).await;
        let leader_pod = leader(&client).await;
        sessions.annotate(name, "real-r2").await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), CHART_NS);
        let operator = pods.get(&leader_pod).await.expect("the leader's pod");
        // Mid-resume: the new agent pod exists, the restore has not been written back.
        poll(START, Duration::from_millis(100), || async {
            let state = sessions.status(name).await.state;
            let pods = sessions.live_pods(name).await.len();
            (state == SessionState::Starting && pods == 1)
                .then_some(())
                .ok_or(format!("not yet relaunching: {state:?}, {pods} pods"))
        })
        .await;
        let killed = container_id(&operator, "operator");
        eprintln!("killing the leader's container {killed} (pod {leader_pod}) mid-resume");
        ctr(&["tasks", "kill", "--signal", "SIGKILL", &killed]);
        sessions.wait_handled_within(name, "real-r2", START).await;
        let status = sessions.status(name).await;
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_eq!(
            sessions.token_of(name).await.as_deref(),
            Some(token.as_str())
        );
        assert_eq!(
            sessions.live_pods(name).await.len(),
            1,
            "exactly one agent pod"
        );
        let restarted = pods
            .get(&leader_pod)
            .await
            .expect("the killed operator's pod");
        let restarts = restarted
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|s| s.into_iter().next())
            .map(|s| s.restart_count)
            .unwrap_or_default();
        assert!(restarts >= 1, "the kubelet restarted the killed container");
        let third = sessions.the_pod(name).await;
        assert_eq!(
            pod_sh(&client, &third, &leak_check(GIT_PASSWORD)).await,
            "clean"
        );
        assert_eq!(
            pod_sh(&client, &third, "test -f README.md && echo kept").await,
            "kept",
            "the first start's clone, kept across the operator's kill"
        );

        // Completed (its workspace kept): the transcript is read through a reader pod that
        // the kubelet runs from the same image, with no agent started.
        let out = plugin(&["complete", name, "-n", &sessions.namespace, "--wait"]).await;
        assert_eq!(out.code(), 0, "{out:#?}");
        let out = plugin(&["history", name, "-n", &sessions.namespace]).await;
        assert_eq!(out.code(), 0, "{out:#?}");
        assert!(
            out.stdout.contains(&format!("[USER]: {FIRST_PROMPT}")),
            "{}",
            out.stdout
        );
        sessions.assert_event(name, "HistoryReaderStarted").await;
        poll(START, Duration::from_millis(500), || async {
            let left = sessions.live_pod_names(name).await;
            left.is_empty()
                .then_some(())
                .ok_or(format!("pods left after the read: {left:?}"))
        })
        .await;
        assert_eq!(sessions.status(name).await.state, SessionState::Completed);
    };
    let cleanup = async {
        sessions.teardown().await;
        uninstall();
    };
    with_cleanup(body, cleanup).await;
}

/// The workspace claim `pod` mounts.
fn claim_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.iter().find_map(|v| v.persistent_volume_claim.as_ref()))
        .map(|c| c.claim_name.clone())
        .expect("a workspace claim")
}

/// `tar -xOf ARCHIVE MEMBER`: one file of an image archive.
fn archive_member(archive: &str, member: &str) -> String {
    let out = run(Command::new("tar").args(["-xOf", archive, member]));
    assert!(out.success(), "tar -xOf {archive} {member}: {out:#?}");
    out.stdout
}

/// The image config (user, labels, entrypoint) of a docker-archive that `make images` wrote.
fn image_config(archive: &str) -> serde_json::Value {
    let manifest: serde_json::Value =
        serde_json::from_str(&archive_member(archive, "manifest.json")).expect("manifest.json");
    let config = manifest[0]["Config"].as_str().expect("a config");
    serde_json::from_str(&archive_member(archive, config)).expect("config JSON")
}

/// What `make images` wrote, read from its archives and SBOMs: the chart's users, the OCI labels,
/// the pinned agent (e2e/agents.versions) inside the agentctl image, and an SBOM of each image
/// that names its Debian, npm and Rust packages.
#[test]
#[ignore = "real: reads target/images (make e2e-real)"]
fn the_images_carry_their_users_labels_pinned_agent_and_sbom() {
    let dir = e2e_support::repo_path("target/images");
    let agents = std::fs::read_to_string(e2e_support::repo_path("e2e/agents.versions"))
        .expect("agents.versions");
    let claude: Vec<&str> = agents
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&"claude-code"))
        .expect("claude-code is pinned");
    for (name, user, entrypoint) in [
        (
            "kandev-operator",
            "65532:65532",
            "/usr/local/bin/kandev-operator",
        ),
        ("agentctl", "1000:1000", "agentctl"),
    ] {
        let archive = dir.join(format!("{name}.tar"));
        let archive = archive.to_str().expect("UTF-8 path");
        let config = image_config(archive);
        let c = &config["config"];
        assert_eq!(c["User"], user, "{name}: {c:#}");
        assert_eq!(c["Entrypoint"][0], entrypoint, "{name}: {c:#}");
        let labels = &c["Labels"];
        assert_eq!(
            labels["org.opencontainers.image.version"],
            env!("CARGO_PKG_VERSION")
        );
        for label in [
            "org.opencontainers.image.source",
            "org.opencontainers.image.revision",
        ] {
            assert!(
                labels[label]
                    .as_str()
                    .is_some_and(|v| !v.is_empty() && v != "unknown"),
                "{name}: label {label}: {labels:#}"
            );
        }
        let sbom: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}.spdx.json"))).expect("the SBOM"),
        )
        .expect("SBOM JSON");
        assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
        let packages = sbom["packages"].as_array().expect("packages");
        let has = |purl_prefix: &str| {
            packages.iter().any(|p| {
                p["externalRefs"][0]["referenceLocator"]
                    .as_str()
                    .is_some_and(|l| l.starts_with(purl_prefix))
            })
        };
        assert!(has("pkg:deb/debian/libc6@"), "{name}: glibc in the SBOM");
        assert!(
            has("pkg:cargo/kube@"),
            "{name}: the Rust crates in the SBOM"
        );
        if name == "agentctl" {
            let (package, version) = (claude[1], claude[2]);
            let pinned = packages
                .iter()
                .any(|p| p["name"] == package && p["versionInfo"] == version);
            assert!(
                pinned,
                "agentctl carries {package}@{version} (e2e/agents.versions)"
            );
            assert_eq!(labels["dev.kandev.agent.version"], version);
        }
    }
}
