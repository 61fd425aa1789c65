//! End-to-end tests against the real control plane + kwok + `kandev-e2e-harness` (e2e/README.md).
//!
//! Every test is `#[ignore]`d so plain `cargo test` skips them; `bash e2e/test.sh` (or `make e2e`)
//! runs them with `-- --ignored --test-threads=1` and KUBECONFIG set. Run that way without a
//! reachable cluster they FAIL: they never skip silently.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e_support::sessions::Sessions;
use e2e_support::support::process::run;
use e2e_support::{
    client, exec_output, harness_pid, install_crd, is_played, kubectl, unique, wait_for,
    wait_for_within,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use kube::api::{Api, AttachParams, AttachedProcess, DeleteParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::wait::{Condition, conditions};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, Lines};

const NODE: &str = "kwok-node-0";
const HARNESS: &str = "kandev-e2e-harness";

// ---------------------------------------------------------------------------------------------
// helpers

/// A pod the harness plays: its container runs `kandev-e2e-harness <args>` locally, with an
/// emptyDir mounted at /run/kandev as working directory.
/// A pod the harness plays, shaped like the operator's agentctl pods (`restartPolicy: Never`: a
/// dead agent is a lost pod, not a restart), and like them admitted by the restricted Pod
/// Security Standard of the tests' namespaces.
fn managed_pod(name: &str, args: &[&str]) -> Pod {
    with_restart_policy(name, args, "Never")
}

fn with_restart_policy(name: &str, args: &[&str], policy: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"kandev.dev/managed": "true", "app.kubernetes.io/part-of": "kandev-e2e"}},
        "spec": {
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main",
                "image": "kandev.dev/e2e-not-pulled:0",
                "command": [HARNESS],
                "args": args,
                "workingDir": "/run/kandev",
                "env": [{"name": "E2E_MARKER", "value": name}],
                "volumeMounts": [{"name": "run", "mountPath": "/run/kandev"}],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
            "volumes": [{"name": "run", "emptyDir": {}}],
        }
    }))
    .expect("valid pod")
}

/// A fresh namespace for one test (the CRDs are not needed: see [`Sessions::fresh_on`]); run the
/// test in [`Sessions::run`].
async fn fresh() -> Sessions {
    Sessions::fresh_on(&client().await, "kandev-e2e-cluster").await
}

fn is_lost() -> impl Condition<Pod> {
    |pod: Option<&Pod>| {
        pod.is_none_or(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
    }
}

/// Creates a managed pod and waits until the harness plays it; returns the pod and the local pid.
async fn start_played_pod(sessions: &Sessions, name: &str, args: &[&str]) -> (Pod, u32) {
    start(sessions, managed_pod(name, args)).await
}

/// Creates `pod` and waits until the harness plays it; returns the pod and the local pid.
async fn start(sessions: &Sessions, pod: Pod) -> (Pod, u32) {
    let api = sessions.pods();
    let name = pod.metadata.name.clone().expect("name");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let pod = wait_for(
        &api,
        &name,
        "Running and played by the harness",
        is_played(),
    )
    .await
    .expect("pod exists");
    let pid = harness_pid(&pod).expect("numeric pid annotation");
    (pod, pid)
}

/// Deletes `pod` and waits until it is gone.
async fn delete_and_wait(sessions: &Sessions, pod: &Pod) {
    let api = sessions.pods();
    let name = pod.metadata.name.as_deref().expect("name");
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(&api, name, "deleted", conditions::is_deleted(&uid_of(pod))).await;
}

/// Sends SIGKILL to the local process `pid`; `kill` must succeed.
fn sigkill(pid: u32) {
    run(Command::new("kill").args(["-KILL", &pid.to_string()])).expect_success();
}

fn proc_path(pid: u32, what: &str) -> PathBuf {
    Path::new("/proc").join(pid.to_string()).join(what)
}

/// True while `pid` is a live (not zombie) process on this machine.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(proc_path(pid, "stat")) {
        // Field 3, after the parenthesised command name, is the state.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn wait_dead(pid: u32, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    !alive(pid)
}

fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(proc_path(pid, "environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn cwd(pid: u32) -> PathBuf {
    std::fs::read_link(proc_path(pid, "cwd")).unwrap_or_else(|e| panic!("cwd of pid {pid}: {e}"))
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("pod uid")
}

// ---------------------------------------------------------------------------------------------
// (a) a managed pod runs on the kwok node, played by a local process

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn managed_pod_runs_on_the_kwok_node_as_a_local_process() {
    let sessions = fresh().await;
    let name = unique("e2e-run");
    sessions
        .run(async {
            let (pod, pid) = start_played_pod(&sessions, &name, &["idle"]).await;
            let spec = pod.spec.as_ref().expect("spec");
            assert_eq!(spec.node_name.as_deref(), Some(NODE));
            let status = pod.status.as_ref().expect("status");
            let container = &status
                .container_statuses
                .as_ref()
                .expect("container statuses")[0];
            assert!(container.ready, "container not ready: {container:?}");
            assert!(
                container
                    .state
                    .as_ref()
                    .and_then(|s| s.running.as_ref())
                    .is_some()
            );

            assert!(alive(pid), "local process {pid} is not running");
            let cmdline = std::fs::read(proc_path(pid, "cmdline")).expect("cmdline");
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into())
                .collect();
            assert!(args[0].ends_with(HARNESS), "unexpected argv {args:?}");
            assert_eq!(args[1..].to_vec(), vec!["idle".to_string()]);
            let env = environ(pid);
            assert_eq!(env.get("KANDEV_POD_NAME"), Some(&name));
            assert_eq!(env.get("KANDEV_POD_NAMESPACE"), Some(&sessions.namespace));
            assert_eq!(env.get("KANDEV_POD_UID"), Some(&uid_of(&pod)));
            assert_eq!(env.get("E2E_MARKER"), Some(&name));
            // workingDir /run/kandev is the emptyDir volume, mapped to a per-pod local directory.
            let wd = cwd(pid);
            assert!(
                wd.ends_with(Path::new(&uid_of(&pod)).join("volumes/run")),
                "cwd {}",
                wd.display()
            );
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// (b) exec through the API server reaches a local process next to the pod's process

/// `kandev-e2e-harness ndjson-echo` exec'd in pod `name` through the API server: the exec, its
/// stdin, and the lines of its stdout.
async fn exec_echo(
    sessions: &Sessions,
    name: &str,
) -> (
    AttachedProcess,
    impl AsyncWrite + Unpin,
    Lines<BufReader<impl AsyncRead + Unpin>>,
) {
    let ap = AttachParams::default()
        .stdin(true)
        .stdout(true)
        .stderr(false);
    let mut attached = sessions
        .pods()
        .exec(name, [HARNESS, "ndjson-echo"], &ap)
        .await
        .expect("exec through the API server");
    let stdin = attached.stdin().expect("stdin");
    let lines = BufReader::new(attached.stdout().expect("stdout")).lines();
    (attached, stdin, lines)
}

/// Writes `message` as one line and flushes it.
async fn send(stdin: &mut (impl AsyncWrite + Unpin), message: &Value) {
    stdin
        .write_all(format!("{message}\n").as_bytes())
        .await
        .expect("write");
    stdin.flush().await.expect("flush");
}

/// The `pid` of an answer of the echo: the process that answered.
fn pid_in(answer: &Value) -> u32 {
    u32::try_from(answer["pid"].as_u64().expect("pid")).expect("pid fits u32")
}

/// Reads one line with a deadline, as JSON.
async fn read_json<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut tokio::io::Lines<R>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("no answer within 20s")
        .expect("reading exec stdout")
        .expect("exec stdout closed early");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer {line:?} is not JSON: {e}"))
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn exec_ndjson_round_trip_reaches_a_local_process_of_the_pod() {
    let sessions = fresh().await;
    let name = unique("e2e-exec");
    sessions
        .run(async {
            let (pod, idle_pid) = start_played_pod(&sessions, &name, &["idle"]).await;
            let uid = uid_of(&pod);
            let (mut attached, mut stdin, mut lines) = exec_echo(&sessions, &name).await;
            let status = attached.take_status().expect("status channel");

            let mut echo_pid = None;
            for i in 1..=5u64 {
                let msg =
                    json!({"i": i, "text": format!("hello {i}"), "nested": {"list": [i, i * 2]}});
                send(&mut stdin, &msg).await;
                let answer = read_json(&mut lines).await;
                assert_eq!(answer["echo"], msg);
                assert_eq!(answer["seq"], json!(i));
                assert_eq!(answer["pod"], json!(name));
                // Only the harness's Exec object puts the pod UID into the exec'd process's env.
                assert_eq!(answer["podUid"], json!(uid));
                let pid = pid_in(&answer);
                assert_ne!(
                    pid,
                    std::process::id(),
                    "the echo ran in the test process?!"
                );
                assert_ne!(pid, idle_pid, "the echo is the pod's main process?!");
                assert_eq!(
                    *echo_pid.get_or_insert(pid),
                    pid,
                    "one process answers the whole conversation"
                );
            }
            let echo_pid = echo_pid.expect("echo pid");

            // The exec'd process runs on this machine next to the pod's process: same working
            // directory (the pod's emptyDir) and the pod's environment.
            assert!(
                alive(echo_pid),
                "exec'd process {echo_pid} not found on this machine"
            );
            assert_eq!(cwd(echo_pid), cwd(idle_pid));
            let env = environ(echo_pid);
            assert_eq!(env.get("KANDEV_POD_UID"), Some(&uid));
            assert_eq!(env.get("E2E_MARKER"), Some(&name));

            // End the conversation explicitly: kwok never closes the exec'd process's stdin.
            send(&mut stdin, &json!({"bye": true})).await;
            assert_eq!(read_json(&mut lines).await, json!({"bye": true}));
            let status = tokio::time::timeout(Duration::from_secs(20), status)
                .await
                .expect("exec status within 20s");
            assert_eq!(status.and_then(|s| s.status).as_deref(), Some("Success"));
            assert!(
                wait_dead(echo_pid, Duration::from_secs(10)).await,
                "exec'd process {echo_pid} still running"
            );
            drop(stdin);
            let _ = attached.join().await;
            assert!(
                alive(idle_pid),
                "the pod's own process must be untouched by the exec"
            );
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// (c) deleting the pod kills its local process

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn deleting_the_pod_kills_its_local_process() {
    let sessions = fresh().await;
    let name = unique("e2e-del");
    sessions
        .run(async {
            let (pod, pid) = start_played_pod(&sessions, &name, &["idle"]).await;
            assert!(alive(pid));
            // An exec session abandoned without {"bye":true}: kwok never closes the exec'd
            // process's stdin, so only the pod's death may end it (as in a real container).
            let (attached, mut stdin, mut lines) = exec_echo(&sessions, &name).await;
            send(&mut stdin, &json!({"hello": 1})).await;
            let echo_pid = pid_in(&read_json(&mut lines).await);
            attached.abort();
            drop((stdin, lines, attached));
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(
                alive(echo_pid),
                "the abandoned exec'd process {echo_pid} should linger until the pod dies"
            );

            delete_and_wait(&sessions, &pod).await;
            assert!(
                wait_dead(pid, Duration::from_secs(15)).await,
                "local process {pid} survived its pod"
            );
            assert!(
                wait_dead(echo_pid, Duration::from_secs(15)).await,
                "exec'd process {echo_pid} survived its pod"
            );
            // Its kwok Exec went with it: nothing keeps serving exec for a pod that is gone.
            let execs: Api<DynamicObject> = Api::namespaced_with(
                sessions.client.clone(),
                &sessions.namespace,
                &ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Exec"),
                    "execs",
                ),
            );
            wait_for_within(
                &execs,
                &name,
                "gone (no Exec for a deleted pod)",
                Duration::from_secs(10),
                |exec: Option<&DynamicObject>| exec.is_none(),
            )
            .await;
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// (d) the local process dying makes the pod look lost

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn killing_the_local_process_makes_the_pod_look_lost() {
    let sessions = fresh().await;
    let name = unique("e2e-lost");
    sessions
        .run(async {
            let (_pod, pid) = start_played_pod(&sessions, &name, &["idle"]).await;
            sigkill(pid);
            assert!(wait_dead(pid, Duration::from_secs(10)).await);
            let api = sessions.pods();
            let pod = wait_for(&api, &name, "lost (Failed or gone)", is_lost()).await;
            if let Some(pod) = pod {
                let status = pod.status.as_ref().expect("status");
                let state = status
                    .container_statuses
                    .as_ref()
                    .expect("container statuses")[0]
                    .state
                    .clone()
                    .expect("container state");
                let terminated = state.terminated.expect("container terminated");
                assert_eq!(
                    terminated.exit_code,
                    128 + 9,
                    "SIGKILL shows as exit code 137"
                );
                assert!(state.running.is_none());
                // kwok must not bring it back to Running.
                tokio::time::sleep(Duration::from_secs(5)).await;
                let later = api.get_opt(&name).await.expect("get pod");
                let phase = later
                    .as_ref()
                    .and_then(|p| p.status.as_ref())
                    .and_then(|s| s.phase.clone());
                assert!(
                    later.is_none() || phase.as_deref() == Some("Failed"),
                    "pod came back: {phase:?}"
                );
            }
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// (g) `kubectl logs` / the log API show what the pod's process printed

/// A container the kubelet would restart (restartPolicy Always, like the operator's Deployment)
/// is restarted after a back-off: CrashLoopBackOff with a restart count, then a new process,
/// Ready again; the pod is never Failed.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_crashed_container_with_restart_policy_always_is_restarted() {
    let sessions = fresh().await;
    let name = unique("e2e-crash");
    sessions
        .run(async {
            let (_pod, pid) =
                start(&sessions, with_restart_policy(&name, &["idle"], "Always")).await;
            sigkill(pid);
            let api = sessions.pods();
            let waiting = |pod: Option<&Pod>| {
                pod.and_then(|p| p.status.as_ref())
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|cs| cs.first())
                    .and_then(|c| c.state.as_ref())
                    .and_then(|st| st.waiting.as_ref())
                    .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
            };
            let pod = wait_for(&api, &name, "in CrashLoopBackOff", waiting)
                .await
                .expect("pod");
            let status = pod.status.as_ref().expect("status");
            assert_eq!(status.phase.as_deref(), Some("Running"));
            let container = &status.container_statuses.as_ref().expect("statuses")[0];
            assert_eq!(container.restart_count, 1);
            assert!(!container.ready);
            let last = container
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref());
            assert_eq!(last.map(|t| t.exit_code), Some(128 + 9), "{container:?}");

            let restarted = move |pod: Option<&Pod>| {
                pod.is_some_and(|p| {
                    harness_pid(p).is_some_and(|new| new != pid)
                        && p.status
                            .as_ref()
                            .and_then(|s| s.container_statuses.as_ref())
                            .and_then(|cs| cs.first())
                            .is_some_and(|c| {
                                c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some())
                            })
                })
            };
            let pod = wait_for(&api, &name, "restarted and ready", restarted)
                .await
                .expect("pod");
            let new_pid = harness_pid(&pod).expect("pid");
            assert!(alive(new_pid), "the restarted process runs");
        })
        .await;
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn pod_logs_show_the_local_process_output() {
    let sessions = fresh().await;
    let name = unique("e2e-logs");
    sessions
        .run(async {
            let mut pod = managed_pod(&name, &[]);
            let container = &mut pod.spec.as_mut().expect("spec").containers[0];
            container.command = Some(vec!["sh".into(), "-c".into()]);
            container.args = Some(vec![
                "echo \"hello from $KANDEV_POD_NAME\"; echo oops >&2; exec kandev-e2e-harness idle"
                    .into(),
            ]);
            start(&sessions, pod).await;
            let api = sessions.pods();
            let mut logs = String::new();
            for _ in 0..50 {
                logs = api
                    .logs(&name, &Default::default())
                    .await
                    .expect("pod logs");
                if logs.contains("oops") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                logs.contains(&format!("hello from {name}\n")),
                "logs: {logs:?}"
            );
            assert!(
                logs.contains("oops\n"),
                "stderr missing from logs: {logs:?}"
            );
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// (f) a PVC is provisioned by the harness and its content outlives the pod, like a real PVC

fn pod_with_claim(name: &str, claim: &str) -> Pod {
    let mut pod = managed_pod(name, &["idle"]);
    let spec = pod.spec.as_mut().expect("spec");
    spec.containers[0].working_dir = Some("/workspace".into());
    spec.containers[0]
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(
            serde_json::from_value(json!({"name": "ws", "mountPath": "/workspace"}))
                .expect("mount"),
        );
    spec.volumes.get_or_insert_with(Vec::new).push(
        serde_json::from_value(
            json!({"name": "ws", "persistentVolumeClaim": {"claimName": claim}}),
        )
        .expect("volume"),
    );
    pod
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn pvc_is_provisioned_and_its_content_survives_the_pod() {
    let sessions = fresh().await;
    let (client, ns) = (&sessions.client, &sessions.namespace);
    let claim = unique("e2e-claim");
    let (first, second) = (unique("e2e-pvc-a"), unique("e2e-pvc-b"));
    let claims = sessions.claims();
    sessions
        .run(async {
            sessions.create_claim(&claim).await;
            wait_for(
                &claims,
                &claim,
                "Bound",
                |c: Option<&k8s_openapi::api::core::v1::PersistentVolumeClaim>| {
                    c.and_then(|c| c.status.as_ref())
                        .and_then(|s| s.phase.as_deref())
                        == Some("Bound")
                },
            )
            .await;

            let (pod_a, _) = start(&sessions, pod_with_claim(&first, &claim)).await;
            let wrote = exec_output(
                client,
                ns,
                &first,
                &[
                    "sh",
                    "-c",
                    "echo \"written by $KANDEV_POD_NAME\" > marker && pwd",
                ],
            )
            .await;
            assert!(
                wrote.trim_end().ends_with(&format!("volumes/{ns}/{claim}")),
                "workdir {wrote:?}"
            );
            delete_and_wait(&sessions, &pod_a).await;

            start(&sessions, pod_with_claim(&second, &claim)).await;
            let read = exec_output(client, ns, &second, &["cat", "marker"]).await;
            assert_eq!(read.trim_end(), format!("written by {first}"));
        })
        .await;
}

// ---------------------------------------------------------------------------------------------
// (e) the CRDs: installable, printer columns, CEL validation messages

/// `kubectl get ARGS` against the cluster of $KUBECONFIG, which must succeed: its stdout.
fn kubectl_get(args: &[&str]) -> String {
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    run(kubectl()
        .args(["--kubeconfig", &kubeconfig])
        .arg("get")
        .args(args))
    .expect_success()
}

fn storage_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)
        .expect("a storage version")
}

fn dynamic_api(sessions: &Sessions, crd: &CustomResourceDefinition) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(
        &crd.spec.group,
        &storage_version(crd).name,
        &crd.spec.names.kind,
    );
    Api::namespaced_with(
        sessions.client.clone(),
        &sessions.namespace,
        &ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural),
    )
}

fn valid_task_session(name: &str) -> Value {
    json!({
        "apiVersion": "kandev.dev/v1alpha1",
        "kind": "TaskSession",
        "metadata": {"name": name},
        "spec": {
            "taskId": format!("task-{name}"),
            "agent": "claude-code",
            "taskDescription": "e2e: printer columns and validation",
            "workspace": {"template": {"size": "1Gi"}},
        }
    })
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn task_session_crd_installs_prints_columns_and_validates() {
    let sessions = fresh().await;
    let crd = install_crd(&sessions.client, "crds/tasksessions.kandev.dev.yaml").await;
    let api = dynamic_api(&sessions, &crd);
    let name = unique("e2e-ts");
    let bad = unique("e2e-ts-bad");
    sessions
        .run(async {
            let obj: DynamicObject = serde_json::from_value(valid_task_session(&name)).expect("ts");
            api.create(&PostParams::default(), &obj)
                .await
                .expect("a valid TaskSession is accepted");

            // `kubectl get ts` shows the CRD's printer columns (priority 0) after NAME.
            let version = storage_version(&crd);
            let columns: Vec<String> = version
                .additional_printer_columns
                .iter()
                .flatten()
                .filter(|c| c.priority.unwrap_or(0) == 0)
                .map(|c| c.name.to_uppercase())
                .collect();
            for want in ["STATE", "TASK", "NEEDSRESUME", "AGENT", "AGE"] {
                assert!(
                    columns.iter().any(|c| c == want),
                    "CRD lacks printer column {want}: {columns:?}"
                );
            }
            let stdout = kubectl_get(&["ts", &name, "-n", &sessions.namespace]);
            let mut rows = stdout.lines();
            let header: Vec<&str> = rows.next().expect("header").split_whitespace().collect();
            let mut want = vec!["NAME".to_string()];
            want.extend(columns.iter().cloned());
            assert_eq!(header, want.iter().map(String::as_str).collect::<Vec<_>>());
            let row = rows.next().expect("one row");
            assert!(row.starts_with(&name), "row {row:?}");
            assert!(
                row.contains("claude-code"),
                "AGENT column missing from {row:?}"
            );

            // An agent name breaking the CEL rule is refused with that rule's message.
            let rule = spec_field_rules(&crd, "agent")
                .into_iter()
                .find(|r| r["rule"].as_str().is_some_and(|r| !r.contains("oldSelf")))
                .expect("spec.agent has a non-transition x-kubernetes-validations rule");
            let message = rule["message"].as_str().expect("rule message").to_string();
            let mut invalid = valid_task_session(&bad);
            invalid["spec"]["agent"] = json!("Not_A_Profile!");
            let obj: DynamicObject = serde_json::from_value(invalid).expect("ts");
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => panic!("an invalid agent name was accepted"),
                Err(kube::Error::Api(e)) => {
                    assert_eq!(e.code, 422, "{e:?}");
                    assert!(
                        e.message.contains(&message),
                        "error {:?} lacks the rule's message {message:?}",
                        e.message
                    );
                }
                Err(e) => panic!("unexpected error: {e}"),
            }
            // The workspace rule (exactly one of claimName / template) as well.
            let ws_rule = crd_rules_mentioning(&crd, "claimName")
                .into_iter()
                .find(|r| {
                    r["rule"]
                        .as_str()
                        .is_some_and(|r| r.contains("template") && !r.contains("oldSelf"))
                })
                .expect("a workspace rule on claimName/template");
            let ws_message = ws_rule["message"].as_str().expect("message").to_string();
            let mut invalid = valid_task_session(&bad);
            invalid["spec"]["workspace"] = json!({"claimName": "x", "template": {"size": "1Gi"}});
            let obj: DynamicObject = serde_json::from_value(invalid).expect("ts");
            let err = api
                .create(&PostParams::default(), &obj)
                .await
                .expect_err("both claimName and template");
            assert!(
                err.to_string().contains(&ws_message),
                "error {err} lacks {ws_message:?}"
            );
        })
        .await;
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn executor_running_crd_installs_and_is_served() {
    let sessions = fresh().await;
    let crd = install_crd(&sessions.client, "crds/executorrunnings.kandev.dev.yaml").await;
    let api = dynamic_api(&sessions, &crd);
    let body = async {
        // Served and listable; `kubectl get` knows it by its plural and every short name.
        api.list(&Default::default())
            .await
            .expect("list ExecutorRunnings");
        let mut names = vec![crd.spec.names.plural.clone()];
        names.extend(crd.spec.names.short_names.clone().unwrap_or_default());
        for n in names {
            kubectl_get(&[&n, "-n", &sessions.namespace]);
        }
    };
    sessions.run(body).await;
}

/// The `x-kubernetes-validations` rules of `spec.<field>` in the storage version's schema.
fn spec_field_rules(crd: &CustomResourceDefinition, field: &str) -> Vec<Value> {
    let schema = serde_json::to_value(&storage_version(crd).schema).expect("schema json");
    schema["openAPIV3Schema"]["properties"]["spec"]["properties"][field]["x-kubernetes-validations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Every `x-kubernetes-validations` rule in the CRD whose rule text mentions `needle`.
fn crd_rules_mentioning(crd: &CustomResourceDefinition, needle: &str) -> Vec<Value> {
    fn walk(v: &Value, needle: &str, out: &mut Vec<Value>) {
        match v {
            Value::Object(map) => {
                if let Some(Value::Array(rules)) = map.get("x-kubernetes-validations") {
                    out.extend(
                        rules
                            .iter()
                            .filter(|r| r["rule"].as_str().is_some_and(|t| t.contains(needle)))
                            .cloned(),
                    );
                }
                map.values().for_each(|c| walk(c, needle, out));
            }
            Value::Array(items) => items.iter().for_each(|c| walk(c, needle, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(
        &serde_json::to_value(&storage_version(crd).schema).expect("schema json"),
        needle,
        &mut out,
    );
    out
}
