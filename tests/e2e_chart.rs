//! End-to-end: the Helm chart on the real control plane. `helm install` puts the operator's
//! Deployment (two replicas), ServiceAccount and RBAC in place; the e2e harness plays the two
//! operator pods as local processes that authenticate with a token of the chart's ServiceAccount
//! (TokenRequest, bound to the pod), so the operator gets exactly the chart's permissions: a verb
//! missing from the chart fails this test. Then the lose-and-resume scenario with the real
//! claude-agent-acp. Run by `bash e2e/test.sh`; `#[ignore]`d for plain `cargo test`.
//!
//! The upgrade test installs the previous chart (0.1.0, CRDs under `crds/`, packaged from git)
//! and upgrades it to this one (CRDs as templates), then to a copy with a changed CRD.
//!
//! `KANDEV_CHART=<dir>` tests another copy of the chart (e.g. one with a verb removed), and
//! `KANDEV_HELM_TIMEOUT` (default 3m) bounds `helm install --wait`.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use e2e_support::sessions::{
    Sessions, assert_condition, condition, condition_is, status_where, template_workspace,
};
use e2e_support::support::chart::{self, CRDS, RELEASE, chart_dir};
use e2e_support::support::process::{Output, run, run_with_stdin};
use e2e_support::{
    client, harness_pid, kubectl, read_crd, repo_path, restricted_namespace, unique,
    wait_for_within, with_cleanup,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kandev_operator::api::conditions;
use kandev_operator::api::{SessionState, TaskSession};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio_rustls::rustls;

/// The release namespace (the docs use kandev-system; a different one keeps the two apart).
const CHART_NS: &str = "kandev-chart-e2e";
const OPERATOR_ACCOUNT: &str = "system:serviceaccount:kandev-chart-e2e:kandev-operator";

/// `helm ARGS` (an install or upgrade with `--wait`) of the release in [`CHART_NS`] that must
/// succeed, see [`chart::install_or_upgrade`].
fn helm_install(args: &[&str]) {
    chart::install_or_upgrade(CHART_NS, args);
}

/// `helm install` of the chart under test into [`CHART_NS`] with `--take-ownership` (the CRDs
/// may exist already, applied by other e2e tests) and `--wait` up to [`chart::helm_timeout`],
/// then `extra`; must succeed.
fn install(extra: &[&str]) {
    let chart = chart::chart_arg();
    let timeout = chart::helm_timeout();
    let install = [
        "install",
        RELEASE,
        &chart,
        "-n",
        CHART_NS,
        "--take-ownership",
        "--wait",
        "--timeout",
        &timeout,
    ];
    helm_install(&[&install[..], extra].concat());
}

/// `kubectl auth can-i VERB RESOURCE -n NAMESPACE` as the operator's ServiceAccount: "yes" or
/// "no".
fn operator_can(verb: &str, resource: &str, namespace: &str) -> String {
    run(kubectl()
        .args(["auth", "can-i", verb, resource, "-n", namespace])
        .args(["--as", OPERATOR_ACCOUNT]))
    .stdout
    .trim()
    .to_string()
}

/// `kubectl create --dry-run=server` of `manifest` (JSON) in `namespace` as `user`: admission
/// runs, nothing is stored.
fn dry_run_create_as(namespace: &str, user: &str, manifest: &str) -> Output {
    run_with_stdin(
        kubectl()
            .args(["create", "--dry-run=server", "-n", namespace, "-f", "-"])
            .args(["--as", user]),
        manifest,
    )
}

/// [`dry_run_create_as`] of `pod` as the operator's ServiceAccount: Ok, or Err(kubectl's
/// stderr).
fn create_pod_as_operator(namespace: &str, pod: &serde_json::Value) -> Result<(), String> {
    let out = dry_run_create_as(namespace, OPERATOR_ACCOUNT, &pod.to_string());
    if out.success() {
        Ok(())
    } else {
        Err(out.stderr)
    }
}

/// A change to a pod manifest.
type PodEdit = Box<dyn FnOnce(&mut serde_json::Value)>;

/// A pod as the operator would make it (restricted Pod Security, managed label, no token),
/// changed by `edit`.
fn operator_like_pod(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vap-probe", "labels": {"kandev.dev/managed": "true"}},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "agentctl",
                "image": "kandev/agentctl:probe",
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
            "volumes": [
                {"name": "workspace", "persistentVolumeClaim": {"claimName": "probe"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    });
    edit(&mut pod);
    pod
}

/// Creates session `name` and waits until its agent waits for input (up to 120 s: the chart's
/// operator may still be starting).
async fn started(sessions: &Sessions, name: &str) {
    sessions.create(name, "claude-code").await;
    sessions
        .wait_state_within(
            name,
            SessionState::WaitingForInput,
            Duration::from_secs(120),
        )
        .await;
}

/// Removes the release and its namespace, waiting until both are gone (a namespace that is
/// still terminating refuses the next install).
fn uninstall() {
    chart::uninstall(CHART_NS, "2m");
    chart::delete_namespaces(&[CHART_NS]);
}

/// The start of every test here: a client for the cluster, and no release left over from an
/// interrupted run.
async fn client_without_release() -> Client {
    let client = client().await;
    uninstall(); // leftovers of an interrupted run
    client
}

/// The cleanup of every test here: deletes the test's `namespaces` without waiting, then
/// [`uninstall`]s.
fn delete_namespaces_and_uninstall(namespaces: &[&str]) {
    for namespace in namespaces {
        run(kubectl().args(["delete", "namespace", namespace, "--wait=false"]));
    }
    uninstall();
}

/// Deletes session `name` and waits up to 60 s until it is gone: the operator stopped its pod
/// and lifted its finalizer.
async fn delete_session(sessions: &Sessions, name: &str) {
    sessions.delete(name).await;
    wait_for_within(
        &sessions.sessions(),
        name,
        "deleted",
        Duration::from_secs(60),
        |ts: Option<&TaskSession>| ts.is_none(),
    )
    .await;
}

/// The played operator pods of the release.
async fn operator_pods(client: &Client) -> Vec<Pod> {
    e2e_support::operator_pods(client, CHART_NS).await
}

/// `kubectl logs` of a pod (served by kwok from the harness's log of the played process).
fn logs(pod: &str) -> String {
    run(kubectl().args(["logs", "-n", CHART_NS, pod])).stdout
}

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn chart_operator_resumes_a_lost_session_with_the_charts_rbac() {
    let client = client_without_release().await;
    let sessions = Sessions::new(&client, &unique("chart"));
    let body = async {
        // The operator's pods pass the restricted Pod Security Standard, or they are refused.
        restricted_namespace(&client, CHART_NS).await;
        install(&[]);

        // Two replicas, both played, one leader.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), CHART_NS);
        let deployment = deployments.get(RELEASE).await.expect("Deployment");
        let spec = deployment.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(2), "two replicas by default");
        let pods = operator_pods(&client).await;
        assert_eq!(pods.len(), 2, "two operator pods");
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        for pod in &pods {
            assert!(
                harness_pid(pod).is_some(),
                "pod {} is played by the harness",
                pod.name_any()
            );
            assert_eq!(
                pod.spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.as_deref()),
                Some(RELEASE)
            );
        }
        let leases: Api<Lease> = Api::namespaced(client.clone(), CHART_NS);
        wait_for_within(
            &leases,
            "kandev-operator",
            "held by an operator pod",
            Duration::from_secs(60),
            |l: Option<&Lease>| {
                l.and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.as_deref())
                    .is_some_and(|h| names.iter().any(|n| n == h))
            },
        )
        .await;
        // The operator says who it is: the chart's ServiceAccount, not the harness's admin.
        for name in &names {
            let log = logs(name);
            assert!(
                log.contains(OPERATOR_ACCOUNT),
                "operator pod {name} does not report running as {OPERATOR_ACCOUNT}:\n{log}"
            );
        }

        // Lose and resume, with the chart's permissions only.
        sessions.ensure_namespace().await;
        let name = "chart-session";
        started(&sessions, name).await;
        let token = sessions
            .token_of(name)
            .await
            .expect("a resume token after session/new");
        sessions.lose(name).await;
        sessions.annotate(name, "chart-r1").await;
        sessions
            .wait_handled_within(name, "chart-r1", Duration::from_secs(120))
            .await;
        let status = sessions.status(name).await;
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_condition(&status, conditions::RESUMED, ("True", "Restored"));
        assert_eq!(
            sessions.token_of(name).await.as_deref(),
            Some(token.as_str()),
            "same token back"
        );
        assert_eq!(sessions.live_pods(name).await.len(), 1);
        sessions
            .assert_events_in_order(name, &["AgentLost", "ResumeRequested", "Resumed"])
            .await;

        secrets_are_named_only_by_who_may_get_or_use_them(&sessions, name);

        // Deleting the session: the operator stops the pod and lifts its finalizer.
        delete_session(&sessions, name).await;
    };
    let cleanup = async { delete_namespaces_and_uninstall(&[&sessions.namespace]) };
    with_cleanup(body, cleanup).await;
}

/// The session-secrets policy, as users of the namespace: `maker` may create and patch
/// TaskSessions but not read Secrets; `reader` may also get them (as the built-in edit role
/// may). A Secret becomes usable for `maker` when a namespace admin (the built-in admin role,
/// which the chart gives the verb `use` on secrets) grants `use` on it by name. `session` is a
/// running session of the namespace, created without credentials.
fn secrets_are_named_only_by_who_may_get_or_use_them(sessions: &Sessions, session: &str) {
    let ns = sessions.namespace.as_str();
    let apply = |manifest: &str| {
        run_with_stdin(kubectl().args(["apply", "-n", ns, "-f", "-"]), manifest).expect_success();
    };
    apply(
        "apiVersion: v1
kind: Secret
metadata: {name: model-key}
stringData: {key: not-for-maker}
---
apiVersion: v1
kind: Secret
metadata: {name: git-token}
stringData: {token: not-for-maker}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: session-maker}
rules:
  - {apiGroups: [kandev.dev], resources: [tasksessions], verbs: [get, create, update, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: secret-reader}
rules:
  - {apiGroups: [''], resources: [secrets], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: session-makers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: session-maker}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: maker}
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: reader}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: secret-readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: secret-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: reader}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: namespace-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: ns-admin}]
",
    );
    let mut ts = sessions.new_session("tenant", "claude-code", template_workspace());
    ts.spec.credentials = serde_json::from_value(serde_json::json!([
        {"env": "MODEL_KEY", "secretName": "model-key", "key": "key"},
    ]))
    .expect("credentials");
    ts.spec.repository = Some(
        serde_json::from_value(serde_json::json!({
            "url": "https://git.example/team/app.git",
            "credentials": {"secretName": "git-token", "passwordKey": "token"},
        }))
        .expect("repository"),
    );
    let manifest = serde_json::to_string(&ts).expect("session json");
    let create_as = |user: &str| dry_run_create_as(ns, user, &manifest);
    let refused = |out: &Output, secret: &str| {
        assert!(
            !out.success()
                && out.stderr.contains("session-secrets")
                && out.stderr.contains(&format!(
                    "names Secret {secret}, which you may neither get nor use in namespace {ns}"
                )),
            "{out:#?}"
        );
    };

    // Creating: refused naming the first Secret, then the one not granted; a reader may.
    refused(&create_as("maker"), "model-key");
    create_as("reader").expect_success();
    apply_as(
        ns,
        "ns-admin",
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: agent-secrets}
rules:
  - {apiGroups: [''], resources: [secrets], resourceNames: [model-key], verbs: [use]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: agent-secrets}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent-secrets}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: maker}]
",
    );
    refused(&create_as("maker"), "git-token");
    // More than 12 new names at once is refused for whoever may not use every Secret (the API
    // server's price of an authorization check bounds how many one request may make).
    let mut many = ts.clone();
    many.spec.repository = None;
    many.spec.credentials = serde_json::from_value(serde_json::Value::Array(
        (0..13)
            .map(|i| serde_json::json!({"env": format!("K{i}"), "secretName": "model-key", "key": "key"}))
            .collect(),
    ))
    .expect("credentials");
    let out = dry_run_create_as(
        ns,
        "maker",
        &serde_json::to_string(&many).expect("session json"),
    );
    assert!(
        !out.success() && out.stderr.contains("adds 13 Secret names at once"),
        "{out:#?}"
    );
    // `use` does not let maker read the Secret it may hand to an agent.
    let read = run(kubectl().args(["get", "secret", "model-key", "-n", ns, "--as", "maker"]));
    assert!(
        !read.success() && read.stderr.contains("forbidden"),
        "{read:#?}"
    );

    // Changing: a name added is checked; what the session already names stays usable.
    let set = |user: &str, secrets: &[&str]| {
        let credentials: Vec<_> = secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| serde_json::json!({"env": format!("K{i}"), "secretName": secret, "key": "key"}))
            .collect();
        let patch = serde_json::json!({"spec": {"credentials": credentials}}).to_string();
        run(kubectl()
            .args(["patch", "tasksession", session, "-n", ns, "--as", user])
            .args(["--type", "merge", "-p", &patch]))
    };
    refused(&set("maker", &["git-token"]), "git-token");
    set("reader", &["git-token"]).expect_success();
    set("maker", &["git-token", "model-key"]).expect_success();
    run(kubectl().args([
        "annotate",
        "tasksession",
        session,
        "-n",
        ns,
        "team=a",
        "--as",
        "maker",
    ]))
    .expect_success();
}

/// `kubectl apply` of `manifest` in `namespace` as `user`; must succeed.
fn apply_as(namespace: &str, user: &str, manifest: &str) {
    run_with_stdin(
        kubectl().args(["apply", "-n", namespace, "-f", "-", "--as", user]),
        manifest,
    )
    .expect_success();
}

/// Namespaced mode (`watchNamespaces`): the operator's RBAC reaches only the watched namespace,
/// it serves sessions there and ignores the others, and the chart's ValidatingAdmissionPolicy
/// holds its ServiceAccount to managed, non-root, token-less pods of allowed images.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn chart_namespaced_mode_confines_the_operator_and_admission_holds_it_to_its_pods() {
    let client = client_without_release().await;
    let watched = Sessions::new(&client, &unique("watched"));
    let other = Sessions::new(&client, &unique("unwatched"));
    // Watched too, without Pod Security: there the admission policy is the only guard.
    let lax = unique("lax");
    let body = async {
        restricted_namespace(&client, CHART_NS).await;
        watched.ensure_namespace().await;
        other.ensure_namespace().await;
        run(kubectl().args(["create", "namespace", &lax]));
        // --wait: the pod is ready only after its RBAC self-check passed, here per namespace.
        install(&[
            "--set",
            "replicaCount=1",
            "--set",
            &format!("watchNamespaces={{{},{lax}}}", watched.namespace),
            "--set",
            "agentPods.allowedImagePrefixes={kandev/}",
        ]);

        // RBAC: yes in the watched namespace, no anywhere else.
        for (verb, resource) in [
            ("create", "pods/exec"),
            ("create", "pods"),
            ("delete", "pods"),
            ("list", "tasksessions.kandev.dev"),
        ] {
            assert_eq!(
                operator_can(verb, resource, &watched.namespace),
                "yes",
                "{verb} {resource} in the watched namespace"
            );
            for ns in [other.namespace.as_str(), "kube-system"] {
                assert_eq!(
                    operator_can(verb, resource, ns),
                    "no",
                    "{verb} {resource} in {ns}"
                );
            }
        }
        let all = run(kubectl().args([
            "auth",
            "can-i",
            "list",
            "pods",
            "--all-namespaces",
            "--as",
            OPERATOR_ACCOUNT,
        ]))
        .stdout;
        assert_eq!(all.trim(), "no");

        // The admission policy: the operator's kind of pod is admitted (in a namespace that
        // enforces restricted Pod Security too), anything else refused, even where RBAC lets the
        // ServiceAccount create pods and no Pod Security level is enforced.
        create_pod_as_operator(&watched.namespace, &operator_like_pod(|_| {}))
            .expect("a pod shaped like the operator's is admitted");
        let ns = lax.as_str();
        // Another ServiceAccount to name (a missing one would be refused before the policy).
        run(kubectl().args(["create", "serviceaccount", "other", "-n", ns]));
        fn container(p: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut p["spec"]["containers"][0]["securityContext"]
        }
        let refusals: Vec<(&str, PodEdit, &str)> = vec![
            (
                "without the managed label",
                Box::new(|p| p["metadata"]["labels"] = serde_json::json!({"app": "x"})),
                "labelled kandev.dev/managed=true",
            ),
            (
                "with a service-account token",
                Box::new(|p| p["spec"]["automountServiceAccountToken"] = true.into()),
                "automountServiceAccountToken: false",
            ),
            (
                "of another service account",
                Box::new(|p| p["spec"]["serviceAccountName"] = "other".into()),
                "default service account",
            ),
            (
                "with a projected service-account token volume",
                Box::new(|p| {
                    p["spec"]["volumes"][1] = serde_json::json!({"name": "token", "projected":
                        {"sources": [{"serviceAccountToken": {"path": "token"}}]}})
                }),
                "persistentVolumeClaim or emptyDir",
            ),
            (
                "with a hostPath volume",
                Box::new(|p| {
                    p["spec"]["volumes"][1] =
                        serde_json::json!({"name": "host", "hostPath": {"path": "/"}})
                }),
                "persistentVolumeClaim or emptyDir",
            ),
            (
                "with a container that may run as root",
                Box::new(|p| container(p)["runAsNonRoot"] = false.into()),
                "non-root",
            ),
            (
                "with a privileged container",
                // (The API server itself refuses privileged with allowPrivilegeEscalation: false.)
                Box::new(|p| {
                    container(p)["privileged"] = true.into();
                    container(p)["allowPrivilegeEscalation"] = serde_json::Value::Null;
                }),
                "without privileged containers",
            ),
            (
                "with privilege escalation",
                Box::new(|p| container(p)["allowPrivilegeEscalation"] = true.into()),
                "allowPrivilegeEscalation: false",
            ),
            (
                "with an added capability",
                Box::new(move |p| {
                    container(p)["capabilities"]["add"] = serde_json::json!(["NET_ADMIN"])
                }),
                "drop ALL capabilities and add none",
            ),
            (
                "with a container that keeps its capabilities",
                Box::new(|p| container(p)["capabilities"] = serde_json::json!({})),
                "drop ALL capabilities and add none",
            ),
            (
                "with the host's network",
                Box::new(|p| p["spec"]["hostNetwork"] = true.into()),
                "without host namespaces",
            ),
            (
                "with the host's PID namespace",
                Box::new(|p| p["spec"]["hostPID"] = true.into()),
                "without host namespaces",
            ),
            (
                "with the host's IPC namespace",
                Box::new(|p| p["spec"]["hostIPC"] = true.into()),
                "without host namespaces",
            ),
            (
                "with a hostPort",
                Box::new(|p| {
                    p["spec"]["containers"][0]["ports"] =
                        serde_json::json!([{"containerPort": 8080, "hostPort": 8080}])
                }),
                "without hostPort",
            ),
            (
                "with an unconfined seccomp profile",
                Box::new(|p| {
                    container(p)["seccompProfile"] = serde_json::json!({"type": "Unconfined"})
                }),
                "seccomp profile RuntimeDefault or Localhost",
            ),
            (
                "with a privileged init container",
                Box::new(|p| {
                    let mut init = p["spec"]["containers"][0].clone();
                    init["name"] = "init".into();
                    init["securityContext"]["privileged"] = true.into();
                    init["securityContext"]["allowPrivilegeEscalation"] = serde_json::Value::Null;
                    p["spec"]["initContainers"] = serde_json::json!([init]);
                }),
                "without privileged containers",
            ),
            (
                "with a secret volume",
                Box::new(|p| {
                    p["spec"]["volumes"][1] =
                        serde_json::json!({"name": "s", "secret": {"secretName": "any"}})
                }),
                "persistentVolumeClaim or emptyDir",
            ),
            (
                "with a configMap volume",
                Box::new(|p| {
                    p["spec"]["volumes"][1] =
                        serde_json::json!({"name": "c", "configMap": {"name": "any"}})
                }),
                "persistentVolumeClaim or emptyDir",
            ),
            (
                "taking a Secret by envFrom",
                Box::new(|p| {
                    p["spec"]["containers"][0]["envFrom"] =
                        serde_json::json!([{"secretRef": {"name": "any"}}])
                }),
                "no envFrom",
            ),
            (
                "taking a ConfigMap key by valueFrom",
                Box::new(|p| {
                    p["spec"]["containers"][0]["env"] = serde_json::json!([{"name": "X",
                        "valueFrom": {"configMapKeyRef": {"name": "any", "key": "k"}}}])
                }),
                "no envFrom",
            ),
            (
                "on a node named by nodeName",
                Box::new(|p| p["spec"]["nodeName"] = "any-node".into()),
                "without nodeName or affinity",
            ),
            (
                "with a node affinity",
                Box::new(|p| {
                    p["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In",
                                              "values": ["any-node"]}]}]}}})
                }),
                "without nodeName or affinity",
            ),
            (
                "with a nodeSelector of its own",
                Box::new(|p| {
                    p["spec"]["nodeSelector"] =
                        serde_json::json!({"kubernetes.io/hostname": "any-node"})
                }),
                "nodeSelector is agentPods.nodeSelector",
            ),
            (
                "tolerating every taint",
                Box::new(|p| {
                    p["spec"]["tolerations"] = serde_json::json!([{"operator": "Exists"}])
                }),
                "tolerations are agentPods.tolerations",
            ),
            (
                "with a system priority class",
                Box::new(|p| p["spec"]["priorityClassName"] = "system-cluster-critical".into()),
                "without a system priority class",
            ),
            (
                "with its own user namespace (the chart leaves hostUsers unset)",
                Box::new(|p| p["spec"]["hostUsers"] = false.into()),
                "hostUsers is agentPods.hostUsers",
            ),
            (
                "with an Unconfined AppArmor profile",
                Box::new(|p| {
                    container(p)["appArmorProfile"] = serde_json::json!({"type": "Unconfined"})
                }),
                "Unconfined AppArmor profile",
            ),
            (
                "with the SELinux type spc_t",
                Box::new(|p| {
                    p["spec"]["securityContext"]["seLinuxOptions"] =
                        serde_json::json!({"type": "spc_t"})
                }),
                "SELinux options",
            ),
            (
                "with an unmasked /proc",
                Box::new(|p| {
                    // The API server takes Unmasked only in a pod of its own user namespace.
                    p["spec"]["hostUsers"] = false.into();
                    container(p)["procMount"] = "Unmasked".into();
                }),
                "default procMount",
            ),
            (
                "with an unsafe sysctl",
                Box::new(|p| {
                    p["spec"]["securityContext"]["sysctls"] =
                        serde_json::json!([{"name": "kernel.msgmax", "value": "65536"}])
                }),
                "without sysctls",
            ),
            (
                "with an image outside agentPods.allowedImagePrefixes",
                Box::new(|p| p["spec"]["containers"][0]["image"] = "evil.example/x:1".into()),
                "agentPods.allowedImagePrefixes",
            ),
        ];
        for (what, edit, message) in refusals {
            let err = create_pod_as_operator(ns, &operator_like_pod(edit))
                .err()
                .unwrap_or_else(|| panic!("a pod {what} was admitted"));
            assert!(
                err.contains("ValidatingAdmissionPolicy") && err.contains(message),
                "a pod {what} is refused by the chart's policy, saying {message:?}:\n{err}"
            );
        }
        // DELETE: only of managed pods (the policy reads the pod being deleted).
        for (pod, labels) in [
            ("unmanaged", serde_json::json!({"app": "x"})),
            ("managed", serde_json::json!({"kandev.dev/managed": "true"})),
        ] {
            let mut manifest = operator_like_pod(|p| p["metadata"]["labels"] = labels);
            manifest["metadata"]["name"] = pod.into();
            let created = run_with_stdin(
                kubectl().args(["create", "-n", ns, "-f", "-"]),
                &manifest.to_string(),
            );
            assert!(created.success(), "{created:#?}");
        }
        let delete_as_operator = |pod: &str| {
            run(kubectl()
                .args(["delete", "pod", pod, "-n", ns, "--dry-run=server"])
                .args(["--as", OPERATOR_ACCOUNT]))
        };
        let refused = delete_as_operator("unmanaged");
        assert!(
            !refused.success()
                && refused.stderr.contains("ValidatingAdmissionPolicy")
                && refused
                    .stderr
                    .contains("delete pods labelled kandev.dev/managed=true"),
            "deleting an unmanaged pod is refused: {refused:#?}"
        );
        let allowed = delete_as_operator("managed");
        assert!(
            allowed.success(),
            "deleting a managed pod is allowed: {allowed:#?}"
        );

        // Its other objects: only labelled PVCs and NetworkPolicies, in the shapes it makes.
        let managed = serde_json::json!({"kandev.dev/managed": "true"});
        let claim = |labels: &serde_json::Value, source: Option<serde_json::Value>| {
            let mut claim = serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "vap-claim", "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
            });
            if let Some(source) = source {
                claim["spec"]["dataSource"] = source;
            }
            claim
        };
        let policy = |name: &str, labels: &serde_json::Value, selects: serde_json::Value| {
            serde_json::json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "labels": labels},
                "spec": {"podSelector": {"matchLabels": selects}, "policyTypes": ["Ingress"]},
            })
        };
        let unlabelled = serde_json::json!({"app": "x"});
        let clone = serde_json::json!({"kind": "PersistentVolumeClaim", "name": "someone-elses"});
        let objects: Vec<(&str, serde_json::Value, Option<&str>)> = vec![
            ("a labelled claim", claim(&managed, None), None),
            (
                "an unlabelled claim",
                claim(&unlabelled, None),
                Some("PersistentVolumeClaims and NetworkPolicies labelled kandev.dev/managed=true"),
            ),
            (
                "a claim cloned from another",
                claim(&managed, Some(clone)),
                Some("without a dataSource or dataSourceRef"),
            ),
            (
                "a labelled policy of agent pods",
                policy("vap-policy", &managed, managed.clone()),
                None,
            ),
            (
                "an unlabelled policy",
                policy("vap-policy", &unlabelled, managed.clone()),
                Some("PersistentVolumeClaims and NetworkPolicies labelled kandev.dev/managed=true"),
            ),
            (
                "a policy of every pod",
                policy("vap-policy", &managed, serde_json::json!({})),
                Some("select pods labelled kandev.dev/managed=true"),
            ),
        ];
        for (what, manifest, refusal) in objects {
            let out = run_with_stdin(
                kubectl()
                    .args(["create", "--dry-run=server", "-n", ns, "-f", "-"])
                    .args(["--as", OPERATOR_ACCOUNT]),
                &manifest.to_string(),
            );
            match refusal {
                None => assert!(out.success(), "{what} is admitted: {out:#?}"),
                Some(message) => assert!(
                    !out.success()
                        && out.stderr.contains("ValidatingAdmissionPolicy")
                        && out.stderr.contains(message),
                    "{what} is refused by the chart's policy, saying {message:?}: {out:#?}"
                ),
            }
        }
        // A policy of someone else's may not be taken over by a patch that labels it.
        let theirs = run_with_stdin(
            kubectl().args(["create", "-n", ns, "-f", "-"]),
            &policy("theirs", &unlabelled, managed.clone()).to_string(),
        );
        assert!(theirs.success(), "{theirs:#?}");
        // (A server-side apply, as the operator writes its policies: it needs no get.)
        let patched = run_with_stdin(
            kubectl()
                .args([
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "-n",
                    ns,
                    "-f",
                    "-",
                ])
                .args(["--field-manager", "kandev-operator"])
                .args(["--dry-run=server", "--as", OPERATOR_ACCOUNT]),
            &policy("theirs", &managed, managed.clone()).to_string(),
        );
        assert!(
            !patched.success() && patched.stderr.contains("ValidatingAdmissionPolicy"),
            "patching someone else's NetworkPolicy is refused: {patched:#?}"
        );

        // The policy matches only the operator: an admin's unlabelled pod is none of its business
        // (restricted Pod Security still applies).
        let admin_pod = operator_like_pod(|p| p["metadata"]["labels"] = serde_json::json!({}));
        let admin_pod: Pod = serde_json::from_value(admin_pod).expect("pod");
        watched
            .pods()
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &admin_pod,
            )
            .await
            .expect("the policy leaves other users alone");

        // The operator serves the watched namespace: its real pod passed the policy and the
        // restricted Pod Security Standard.
        let name = "watched-session";
        started(&watched, name).await;
        // Its pod got the default resources (never BestEffort), and the session its egress
        // NetworkPolicy, owned by the session, as the API server stored it.
        let pods = watched.live_pods(name).await;
        let pod = pods.first().expect("the session's pod");
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.qos_class.as_deref()),
            Some("Burstable"),
            "{:?}",
            pod.spec.as_ref().map(|s| &s.containers[0].resources)
        );
        // exec: agentctl's own commands only (the operator's exec of `agentctl connect` and
        // `agentctl events` just ran for this session).
        let pod_name = pod.name_any();
        let exec_as_operator = |command: &[&str]| {
            run(kubectl()
                .args([
                    "exec",
                    "-n",
                    &watched.namespace,
                    &pod_name,
                    "-c",
                    "agentctl",
                ])
                .args(["--as", OPERATOR_ACCOUNT, "--"])
                .args(command))
        };
        let refused = exec_as_operator(&["sh", "-c", "id"]);
        assert!(
            !refused.success()
                && refused.stderr.contains("ValidatingAdmissionPolicy")
                && refused.stderr.contains(
                    "may only exec agentctl connect, agentctl events and agentctl answer"
                ),
            "a shell exec is refused: {refused:#?}"
        );
        let allowed = exec_as_operator(&["agentctl", "events", "--once"]);
        assert!(
            allowed.success(),
            "agentctl events is allowed: {allowed:#?}"
        );
        let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &watched.namespace);
        let policy = policies
            .get(&format!("{name}-agent-egress"))
            .await
            .expect("the session's egress NetworkPolicy");
        let ts = watched.get(name).await;
        assert!(
            policy
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == ts.metadata.uid.as_ref()),
            "owned by the session: {policy:?}"
        );
        let spec = serde_json::to_value(policy.spec).expect("json");
        assert_eq!(
            spec["policyTypes"],
            serde_json::json!(["Ingress", "Egress"])
        );
        assert!(
            spec["ingress"]
                .as_array()
                .is_none_or(|rules| rules.is_empty()),
            "no ingress rule, so none allowed: {spec}"
        );
        assert!(
            spec["egress"][1]["to"][0]["ipBlock"]["except"]
                .as_array()
                .is_some_and(|e| e.contains(&"169.254.0.0/16".into())
                    && e.contains(&"168.63.129.16/32".into())),
            "link-local and Azure's host endpoint are denied: {spec}"
        );
        // An image outside the allow-list never gets a pod: the launch stalls as InvalidSpec.
        let refused = "refused-image";
        let mut ts = watched.new_session(refused, "claude-code", template_workspace());
        ts.spec.image = Some("evil.example/agentctl:1".into());
        watched.create_session(&ts).await;
        let stalled = watched
            .wait(
                refused,
                "Stalled InvalidSpec",
                condition_is(conditions::STALLED, "True", "InvalidSpec"),
            )
            .await;
        let status = stalled.status.expect("status");
        let stall = condition(&status, conditions::STALLED);
        assert!(
            stall
                .message
                .contains("\"evil.example/agentctl:1\" is not allowed"),
            "{stall:?}"
        );
        assert!(watched.live_pods(refused).await.is_empty());

        // A session in a namespace the operator does not watch is never touched: not by the
        // time the operator has reconciled a session created after it in a watched namespace.
        let ignored = "unwatched-session";
        other.create(ignored, "claude-code").await;
        let later = "watched-after-it";
        watched.create(later, "claude-code").await;
        watched
            .wait(later, "reconciled", status_where(|_| true))
            .await;
        let ts = other.get(ignored).await;
        assert!(
            ts.status.is_none() && ts.finalizers().is_empty(),
            "the operator reached into an unwatched namespace: {ts:?}"
        );

        for name in [name, refused, later] {
            delete_session(&watched, name).await;
        }
    };
    let cleanup = async {
        delete_namespaces_and_uninstall(&[&watched.namespace, &other.namespace, &lax]);
    };
    with_cleanup(body, cleanup).await;
}

/// `GET path` on `host`:`port` (the harness plays the operator pod on this host), with an
/// optional bearer token, over TLS with `tls` (trusting any certificate: the operator's is
/// self-signed): (status code, body). `None` while nothing answers HTTP there.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    token: Option<&str>,
    tls: bool,
) -> Option<(u16, String)> {
    let stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    if !tls {
        return http_request(stream, path, token).await;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .ok()?;
    http_request(stream, path, token).await
}

async fn http_request<S>(mut stream: S, path: &str, token: Option<&str>) -> Option<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: operator\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    // A TLS peer may end without close_notify; what arrived counts.
    let _ = stream.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    let status = response
        .strip_prefix("HTTP/1.1 ")?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Accepts the server's certificate whatever it is (signatures are still checked).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Polls `http_get` until `done` holds (RBAC and rollouts take effect within seconds).
async fn http_until(
    host: &str,
    port: u16,
    path: &str,
    token: Option<&str>,
    tls: bool,
    done: impl Fn(u16) -> bool,
) -> (u16, String) {
    let mut last = None;
    for _ in 0..60 {
        last = http_get(host, port, path, token, tls).await;
        if let Some((status, body)) = &last
            && done(*status)
        {
            return (*status, body.clone());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("GET {host}:{port}{path}: last answer {last:?}");
}

fn service_account_token(name: &str) -> String {
    run(kubectl().args(["create", "serviceaccount", name, "-n", CHART_NS])).expect_success();
    run(kubectl().args(["create", "token", name, "-n", CHART_NS]))
        .expect_success()
        .trim()
        .to_string()
}

/// `metrics.access=authenticated` (the default) against the real API server: the operator serves
/// /metrics over TLS on its own port (a self-signed certificate), only to a bearer token that a
/// TokenReview authenticates and a SubjectAccessReview authorizes for get /metrics (no token
/// 401, a ServiceAccount without the grant 403, one bound through `metrics.readers` 200); plain
/// HTTP on that port gets no answer, the probes stay plain HTTP on the http port, which does not
/// serve /metrics, and the RBAC self-check passed with the chart's metrics-auth ClusterRole (the
/// pod is Ready). Then `metrics.access=localhost`: /metrics leaves the pod's ports and answers
/// on 127.0.0.1 only, plain HTTP.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn chart_metrics_are_served_only_to_authorized_scrapers() {
    const PORT: u16 = 18481;
    const LOCAL_PORT: u16 = 18482;
    const SECURE_PORT: u16 = 18483;
    let client = client_without_release().await;
    let body = async {
        restricted_namespace(&client, CHART_NS).await;
        let readers = format!(
            r#"metrics.readers=[{{"kind":"ServiceAccount","name":"scraper","namespace":"{CHART_NS}"}}]"#
        );
        // --wait: Ready only after the RBAC self-check, which now asks for the two reviews.
        install(&[
            "--set",
            "replicaCount=1",
            "--set",
            &format!("http.port={PORT}"),
            "--set",
            &format!("metrics.securePort={SECURE_PORT}"),
            "--set-json",
            &readers,
        ]);
        let host = "127.0.0.1";
        let (status, _) = http_until(host, PORT, "/healthz", None, false, |s| s == 200).await;
        assert_eq!(status, 200, "the probes need no token");
        assert_eq!(
            http_until(host, PORT, "/readyz", None, false, |_| true)
                .await
                .0,
            200
        );
        assert_eq!(
            http_get(host, PORT, "/metrics", None, false)
                .await
                .map(|a| a.0),
            Some(404),
            "/metrics is not on the probes' port"
        );

        let (status, body) = http_until(host, SECURE_PORT, "/metrics", None, true, |_| true).await;
        assert_eq!(status, 401, "no token: {body}");
        assert!(body.contains("bearer token"), "{body}");
        assert_eq!(
            http_get(host, SECURE_PORT, "/metrics", None, false).await,
            None,
            "no plain HTTP on the TLS port"
        );
        let (status, body) = http_until(
            host,
            SECURE_PORT,
            "/metrics",
            Some("not-a-token"),
            true,
            |_| true,
        )
        .await;
        assert_eq!(status, 401, "a token the API server does not know: {body}");

        let outsider = service_account_token("outsider");
        let (status, body) =
            http_until(host, SECURE_PORT, "/metrics", Some(&outsider), true, |_| {
                true
            })
            .await;
        assert_eq!(status, 403, "authenticated, not authorized: {body}");
        assert!(
            body.contains(&format!("system:serviceaccount:{CHART_NS}:outsider")),
            "{body}"
        );

        let scraper = service_account_token("scraper");
        let (status, body) = http_until(host, SECURE_PORT, "/metrics", Some(&scraper), true, |s| {
            s == 200
        })
        .await;
        assert_eq!(status, 200);
        assert!(
            body.contains("kandev_leader") && body.ends_with("# EOF\n"),
            "{body}"
        );
        // Still refused for the outsider: the grant is per identity.
        assert_eq!(
            http_get(host, SECURE_PORT, "/metrics", Some(&outsider), true)
                .await
                .map(|a| a.0),
            Some(403)
        );

        // localhost: /metrics moves to 127.0.0.1 only; the pod's port keeps the probes.
        helm_install(&[
            "upgrade",
            RELEASE,
            &chart::chart_arg(),
            "-n",
            CHART_NS,
            "--wait",
            "--timeout",
            &chart::helm_timeout(),
            "--reuse-values",
            "--set",
            "metrics.access=localhost",
            "--set",
            &format!("metrics.localhostPort={LOCAL_PORT}"),
        ]);
        let (status, body) = http_until(host, PORT, "/metrics", None, false, |s| s == 404).await;
        assert!(body.contains("--metrics-address"), "{status} {body}");
        let (status, body) =
            http_until(host, LOCAL_PORT, "/metrics", None, false, |s| s == 200).await;
        assert!(status == 200 && body.contains("kandev_leader"), "{body}");
        assert_eq!(
            http_get("127.0.0.2", LOCAL_PORT, "/metrics", None, false).await,
            None,
            "not reachable on another address of the host"
        );
        assert_eq!(
            http_get(host, PORT, "/healthz", None, false)
                .await
                .map(|a| a.0),
            Some(200)
        );
    };
    with_cleanup(body, async { uninstall() }).await;
}

/// The chart before its CRDs became templates: 0.1.0 as on main at this commit, with the CRDs
/// under `crds/` (which Helm installs once and never upgrades or owns).
const PREVIOUS_CHART_COMMIT: &str = "3e119744b612ff934eddc2bd6198eb809f266b1a";

/// The same JSON with every number as a float: the API server writes `minimum: 0` where the
/// generated YAML has `0.0`.
fn numbers_as_floats(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n.as_f64().map_or(Value::Null, Value::from),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), numbers_as_floats(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `git archive` of the chart at `commit`, packaged by `helm package` into `dir`: the .tgz.
fn package_chart_at(commit: &str, dir: &std::path::Path) -> PathBuf {
    let tar = dir.join("chart.tar");
    run(Command::new("git")
        .args(["-C", repo_path(".").to_str().expect("utf-8 repo path")])
        .args([
            "archive",
            "--format=tar",
            "-o",
            tar.to_str().expect("utf-8"),
        ])
        .args([commit, "charts/kandev-operator"]))
    .expect_success();
    run(Command::new("tar").args([
        "-xf",
        tar.to_str().expect("utf-8"),
        "-C",
        dir.to_str().expect("utf-8"),
    ]))
    .expect_success();
    let source = dir.join("charts/kandev-operator");
    chart::helm(&[
        "package",
        source.to_str().expect("utf-8"),
        "-d",
        dir.to_str().expect("utf-8"),
    ])
    .expect_success();
    dir.join("kandev-operator-0.1.0.tgz")
}

/// A copy of this chart as the next version (0.1.1) whose TaskSession CRD has one more printer
/// column: a changed CRD that `helm upgrade` must bring to the API server.
fn next_chart_with_a_changed_crd(dir: &std::path::Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("next")).expect("mkdir");
    let next = dir.join("next/kandev-operator");
    run(Command::new("cp").arg("-r").arg(chart_dir()).arg(&next)).expect_success();
    let chart_yaml = next.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).expect("Chart.yaml");
    std::fs::write(
        &chart_yaml,
        text.replace("\nversion: 0.1.0\n", "\nversion: 0.1.1\n"),
    )
    .expect("write Chart.yaml");
    let crd = next.join("templates/crds/tasksessions.kandev.dev.yaml");
    let text = std::fs::read_to_string(&crd).expect("the TaskSession CRD template");
    let column = "  - additionalPrinterColumns:\n    - description: The agent's session id (added by the e2e upgrade test)\n      jsonPath: .status.agentSessionId\n      name: Upgraded\n      priority: 1\n      type: string\n";
    assert!(
        text.contains("  - additionalPrinterColumns:\n"),
        "printer columns in {crd:?}"
    );
    std::fs::write(
        &crd,
        text.replacen("  - additionalPrinterColumns:\n", column, 1),
    )
    .expect("write the CRD");
    next
}

/// The printer column names of the TaskSession CRD on the API server.
fn live_printer_columns() -> Vec<String> {
    run(kubectl().args([
        "get",
        "crd",
        CRDS[0],
        "-o",
        "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
    ]))
    .stdout
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

fn crd_annotation(crd: &str, key: &str) -> String {
    let out = run(kubectl().args(["get", "crd", crd, "-o", "json"]));
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    json["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `helm upgrade` from the previous chart (CRDs under `crds/`, never upgraded by Helm) to this
/// one (CRDs as templates): refused without `--take-ownership` with Helm's ownership message and
/// nothing changed, then done with it; the CRDs become the release's, `keep` annotated, equal to
/// `crds/`; a session and its resume token survive. Then an upgrade to a next version with a
/// changed CRD reaches the API server, and `helm uninstall` leaves the CRDs.
#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn chart_upgrade_from_the_previous_chart_upgrades_the_crds_and_keeps_sessions() {
    let client = client_without_release().await;
    let chart = chart::chart_arg();
    let work = tempfile::tempdir().expect("tempdir");
    let previous = package_chart_at(PREVIOUS_CHART_COMMIT, work.path());
    let next = next_chart_with_a_changed_crd(work.path());
    let sessions = Sessions::new(&client, &unique("upgrade"));
    let timeout = chart::helm_timeout();
    let body = async {
        // The previous chart installs the CRDs as it did on a new cluster.
        chart::delete_crds().expect_success();
        restricted_namespace(&client, CHART_NS).await;
        let common = ["-n", CHART_NS, "--wait", "--timeout", &timeout];
        helm_install(
            &[
                &["install", RELEASE, previous.to_str().expect("utf-8")][..],
                &common,
                // The harness plays every release with this build's binary, which checks at
                // start that it may watch nodes (NodeLost) and apply NetworkPolicies (create
                // and patch); the previous chart grants neither, so that release runs with
                // NodeLost and the policies off, and without the check of the rest.
                &["--set", "replicaCount=1"],
                &["--set", "agentPods.networkPolicy.enabled=false"],
                &["--set", "controller.permissionCheck=false"],
                &["--set-json", r#"extraArgs=["--node-lost-seconds=0"]"#],
            ]
            .concat(),
        );
        assert_eq!(
            crd_annotation(CRDS[0], "meta.helm.sh/release-name"),
            "",
            "the previous chart's CRDs are not the release's"
        );

        // A session with a resume token, served by the previous release.
        sessions.ensure_namespace().await;
        let name = "upgraded-session";
        started(&sessions, name).await;
        let token = sessions.token_of(name).await.expect("a resume token");
        let columns_before = live_printer_columns();

        // Without --take-ownership Helm refuses to adopt the CRDs, and changes nothing.
        let upgrade = [
            &["upgrade", RELEASE, &chart][..],
            &common,
            &["--reset-then-reuse-values"],
        ]
        .concat();
        let refused = chart::helm(&upgrade)
            .result()
            .expect_err("an upgrade that adopts unowned CRDs is refused");
        assert!(
            refused.contains("invalid ownership metadata") && refused.contains(CRDS[0])
                || refused.contains("cannot be imported into the current release"),
            "{refused}"
        );
        assert_eq!(crd_annotation(CRDS[0], "helm.sh/resource-policy"), "");

        // With it, the CRDs become the release's, kept on uninstall, equal to crds/.
        helm_install(&[&upgrade[..], &["--take-ownership"]].concat());
        for crd in CRDS {
            assert_eq!(
                crd_annotation(crd, "helm.sh/resource-policy"),
                "keep",
                "{crd}"
            );
            assert_eq!(
                crd_annotation(crd, "meta.helm.sh/release-name"),
                RELEASE,
                "{crd}"
            );
            let live = run(kubectl().args(["get", "crd", crd, "-o", "json"])).stdout;
            let live: serde_json::Value = serde_json::from_str(&live).expect("CRD JSON");
            let file = read_crd(&format!("crds/{crd}.yaml"));
            let expected = serde_json::to_value(&file.spec).expect("spec");
            // (The API server adds names.listKind.)
            for key in ["group", "scope"] {
                assert_eq!(live["spec"][key], expected[key], "{crd}: spec.{key}");
            }
            for key in ["kind", "plural", "shortNames", "categories"] {
                assert_eq!(
                    live["spec"]["names"][key], expected["names"][key],
                    "{crd}: spec.names.{key}"
                );
            }
            assert_eq!(
                numbers_as_floats(&live["spec"]["versions"][0]["schema"]),
                numbers_as_floats(&expected["versions"][0]["schema"]),
                "{crd}: the schema of this chart"
            );
        }
        // The columns of this chart's CRD, and none of the previous chart's lost.
        let expected_columns: Vec<String> =
            read_crd(&format!("crds/{}.yaml", CRDS[0])).spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect();
        let live_columns = live_printer_columns();
        assert_eq!(live_columns, expected_columns);
        assert!(
            columns_before.iter().all(|c| live_columns.contains(c)),
            "{columns_before:?} within {live_columns:?}"
        );
        assert_eq!(
            sessions.token_of(name).await.as_deref(),
            Some(token.as_str())
        );

        // The next version changes the CRD: helm upgrade brings the change.
        helm_install(
            &[
                &["upgrade", RELEASE, next.to_str().expect("utf-8")][..],
                &common,
                &["--reset-then-reuse-values"],
            ]
            .concat(),
        );
        let columns = live_printer_columns();
        assert!(columns.iter().any(|c| c == "Upgraded"), "{columns:?}");
        // The session survives.
        let status = sessions.status(name).await;
        assert_eq!(status.state, SessionState::WaitingForInput, "{status:#?}");
        assert_eq!(
            sessions.token_of(name).await.as_deref(),
            Some(token.as_str())
        );

        // The operator ends the session; helm uninstall leaves the CRDs.
        delete_session(&sessions, name).await;
        chart::uninstall(CHART_NS, "2m").expect_success();
        for crd in CRDS {
            let out = run(kubectl().args(["get", "crd", crd]));
            assert!(out.success(), "{crd} is kept after helm uninstall");
        }
    };
    let cleanup = async {
        delete_namespaces_and_uninstall(&[&sessions.namespace]);
        // Later tests expect the CRDs of crds/, not the changed copy's.
        for crd in CRDS {
            run(kubectl()
                .args(["replace", "-f"])
                .arg(repo_path(&format!("crds/{crd}.yaml"))));
        }
    };
    with_cleanup(body, cleanup).await;
}
