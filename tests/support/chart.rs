//! The Helm chart `charts/kandev-operator` for the tests that render it (tests/chart.rs) and
//! those that install it on the e2e cluster (tests/e2e_chart.rs, tests/e2e_docs.rs): where it
//! is, the helm that runs it, rendering, installing and tearing down.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::process::{Output, kubectl, our_bin, run, run_within};

/// The release name (the chart's name, as the docs install it).
pub const RELEASE: &str = "kandev-operator";
/// The release namespace of the docs and of offline renders.
pub const NAMESPACE: &str = "kandev-system";
/// The Kubernetes an offline render assumes (Chart.yaml's kubeVersion refuses helm's v1.20
/// fallback); the e2e tier runs v1.36.
pub const KUBE_VERSION: &str = "1.36.0";
/// The chart's CRDs.
pub const CRDS: [&str; 2] = ["tasksessions.kandev.dev", "executorrunnings.kandev.dev"];
/// The time limit of one helm run: helm bounds `--wait` with its own `--timeout`
/// (`KANDEV_HELM_TIMEOUT`), so only a hang reaches it.
const HELM_LIMIT: Duration = Duration::from_secs(30 * 60);

/// The chart under test: `KANDEV_CHART=<dir>` (another copy, e.g. one with a verb removed), else
/// `charts/kandev-operator`.
pub fn chart_dir() -> PathBuf {
    std::env::var_os("KANDEV_CHART")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/kandev-operator"))
}

/// [`chart_dir`] as helm's chart argument.
pub fn chart_arg() -> String {
    chart_dir().to_str().expect("utf-8 chart path").to_owned()
}

/// How long `helm install --wait` may take: `KANDEV_HELM_TIMEOUT` (helm's duration), else 3m.
pub fn helm_timeout() -> String {
    std::env::var("KANDEV_HELM_TIMEOUT").unwrap_or_else(|_| "3m".into())
}

/// helm: `KANDEV_HELM`, else the one `e2e/bin.sh` builds (`make bins`), else helm from PATH.
pub fn helm_program() -> PathBuf {
    std::env::var_os("KANDEV_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| our_bin("helm"))
}

/// `helm ARGS`, run to its end.
pub fn helm(args: &[&str]) -> Output {
    run_within(Command::new(helm_program()).args(args), HELM_LIMIT)
}

/// `helm template` of the chart in [`NAMESPACE`] for [`KUBE_VERSION`], with extra arguments:
/// Ok(documents) or Err(stderr).
pub fn template(args: &[&str]) -> Result<Vec<Value>, String> {
    let chart = chart_arg();
    let out = helm(
        &[
            &["template", RELEASE, &chart][..],
            &["--namespace", NAMESPACE, "--kube-version", KUBE_VERSION],
            args,
        ]
        .concat(),
    );
    if !out.success() {
        return Err(out.stderr);
    }
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&out.stdout) {
        let value = serde_yaml_ng::Value::deserialize(doc).expect("rendered YAML parses");
        if value.is_null() {
            continue;
        }
        let json = serde_json::to_value(value).expect("YAML as JSON");
        assert!(
            json["apiVersion"].is_string()
                && json["kind"].is_string()
                && json["metadata"]["name"].is_string(),
            "every document is an object with apiVersion, kind and name: {json}"
        );
        docs.push(json);
    }
    Ok(docs)
}

/// [`template`] that must succeed.
pub fn render(args: &[&str]) -> Vec<Value> {
    template(args).unwrap_or_else(|e| panic!("helm template {args:?} failed:\n{e}"))
}

/// `helm ARGS`, an install or upgrade of the release in `namespace` (with `--wait`) that must
/// succeed; a failure shows helm's output, the operator pods and their last log lines (where a
/// missing RBAC permission is named).
pub fn install_or_upgrade(namespace: &str, args: &[&str]) {
    let out = helm(args);
    if out.success() {
        return;
    }
    let kubectl_text = |args: &[&str]| run(kubectl().args(args)).stdout;
    panic!(
        "helm {}:\n{}{}\n--- operator pods\n{}\n--- operator logs\n{}",
        args.join(" "),
        out.stdout,
        out.stderr,
        kubectl_text(&["get", "pods", "-n", namespace, "-o", "wide"]),
        kubectl_text(&[
            "logs",
            "-n",
            namespace,
            "-l",
            "app.kubernetes.io/name=kandev-operator",
            "--tail=5",
        ]),
    );
}

/// `helm uninstall` of the release in `namespace`, waiting up to `timeout` (helm's duration) for
/// its resources to be gone.
pub fn uninstall(namespace: &str, timeout: &str) -> Output {
    helm(&[
        "uninstall",
        RELEASE,
        "-n",
        namespace,
        "--wait",
        "--timeout",
        timeout,
    ])
}

/// Deletes `namespaces` (those that exist) and waits up to 120 s until they are gone: a namespace
/// that is still terminating refuses the next install.
pub fn delete_namespaces(namespaces: &[&str]) -> Output {
    run(kubectl()
        .args(["delete", "namespace"])
        .args(namespaces)
        .args(["--ignore-not-found", "--wait=true", "--timeout=120s"]))
}

/// Removes the finalizer of every TaskSession in `namespace` (None: in every namespace), so that
/// deleting them, their namespace or the CRDs does not wait for an operator that is gone.
pub fn lift_finalizers(namespace: Option<&str>) {
    let scope = match namespace {
        Some(namespace) => vec!["-n", namespace],
        None => vec!["-A"],
    };
    let sessions = run(kubectl().args(["get", "ts"]).args(scope).args([
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name}{\"\\n\"}{end}",
    ]))
    .stdout;
    for (namespace, name) in sessions.lines().filter_map(|l| l.split_once(' ')) {
        run(kubectl()
            .args(["patch", "ts", name, "-n", namespace, "--type=merge"])
            .args(["-p", r#"{"metadata":{"finalizers":null}}"#]));
    }
}

/// Removes every TaskSession's finalizer, then deletes the CRDs (waiting until they are gone):
/// the cluster as before the chart's first install. The deletion's output: the caller says
/// whether it must succeed.
pub fn delete_crds() -> Output {
    // Else deleting the CRDs would wait for an operator to remove them.
    lift_finalizers(None);
    run(kubectl()
        .args([
            "delete",
            "crd",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ])
        .args(CRDS))
}
