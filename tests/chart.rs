//! The Helm chart `charts/kandev-operator` against the code it deploys.
//!
//! - Without helm (run by `make unit`): the chart's CRD copies equal `crds/`, and the chart's
//!   default images, its appVersion and the Dockerfile's targets agree.
//! - With helm (`#[ignore]`d; `make chart` runs them with `--ignored`; `KANDEV_HELM`, else the
//!   one of `e2e/bin.sh`, else PATH's): the rendered ClusterRole (or per-namespace Roles) and
//!   Role grant exactly `REQUIRED_PERMISSIONS` (what the operator checks at startup), in both
//!   install modes, the Deployment's defaults, the agent-pod containment values, the admission
//!   policy, the optional resources, the PrometheusRule and Grafana dashboard (every PromQL
//!   expression names only metrics, labels and label values the operator exports:
//!   `chart_promql`), and the values schema rejecting bad values. A missing helm fails them.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod chart_promql;
mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use kandev_operator::agents::AgentRegistry;
use kandev_operator::controller::permissions::{REQUIRED_PERMISSIONS, Scope};
use serde_json::Value;
use support::chart::{NAMESPACE, RELEASE, chart_dir, render, template};
use support::process::run;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn kinds(docs: &[Value], kind: &str) -> Vec<String> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| {
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().expect("string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// (API group, resource[/subresource], verb) of every rule of an RBAC object.
fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(
            rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
            "{rule}"
        );
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    assert!(
                        group != "*" && resource != "*" && verb != "*",
                        "no wildcards: {rule}"
                    );
                    let fresh = out.insert((group.clone(), resource.clone(), verb));
                    assert!(fresh, "a grant listed twice in {rule}");
                }
            }
        }
    }
    out
}

fn required(scope: Scope) -> BTreeSet<(String, String, String)> {
    REQUIRED_PERMISSIONS
        .iter()
        .filter(|p| p.scope == scope)
        .flat_map(|p| {
            p.verbs
                .iter()
                .map(|v| (p.group.to_string(), p.rbac_resource(), v.to_string()))
        })
        .collect()
}

/// The role grants exactly the permissions of `scope`: names what is extra and what is missing.
fn assert_same_grants(what: &str, role: &Value, scope: Scope) {
    let granted = grants(role);
    let needed = required(scope);
    let extra: Vec<_> = granted.difference(&needed).collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "the chart's {what} must grant exactly REQUIRED_PERMISSIONS ({scope:?}) of \
         src/controller/permissions.rs\n  granted but not required: {extra:?}\n  \
         required but not granted: {missing:?}"
    );
}

fn operator_container(docs: &[Value]) -> &Value {
    let deployment = find(docs, "Deployment", RELEASE);
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn operator_args(docs: &[Value]) -> Vec<String> {
    strings(&operator_container(docs)["args"])
}

/// A YAML file of the chart (`Chart.yaml`, `values.yaml`), as JSON.
fn chart_yaml(file: &str) -> Value {
    let text = std::fs::read_to_string(chart_dir().join(file)).expect(file);
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file} parses: {e}"))
}

// ---- without helm -------------------------------------------------------------------------

#[test]
fn chart_images_and_versions_match_the_dockerfile_and_crate() {
    let chart = chart_yaml("Chart.yaml");
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));

    let values = chart_yaml("values.yaml");
    let operator_repo = values["image"]["repository"].as_str().expect("image");
    let agentctl_repo = values["agentctlImage"]["repository"]
        .as_str()
        .expect("agentctlImage");
    assert_eq!(operator_repo, "kandev/kandev-operator");
    assert_eq!(agentctl_repo, "kandev/agentctl");

    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .filter_map(|l| l.split(" AS ").nth(1))
        .map(str::trim)
        .collect();
    for target in ["operator", "agentctl"] {
        assert!(
            stages.contains(&target),
            "Dockerfile has a target {target}: {stages:?}"
        );
    }
    // The documented build commands produce the chart's default images.
    for (target, image) in [("operator", operator_repo), ("agentctl", agentctl_repo)] {
        let command = format!(
            "docker build --target {target} -t {image}:{} .",
            env!("CARGO_PKG_VERSION")
        );
        assert!(
            dockerfile.contains(&command),
            "Dockerfile documents `{command}`"
        );
    }
    // The operator image runs as the chart's pod user; agentctl as the agent pods' default UID.
    assert!(dockerfile.contains("USER 65532:65532"));
    assert_eq!(values["podSecurityContext"]["runAsUser"], 65532);
    assert!(dockerfile.contains("USER 1000:1000"));
    assert_eq!(values["agentPods"]["runAsUser"], 1000);
    // The default agent of the agentctl image is the one the protocol tests pin.
    let agents =
        std::fs::read_to_string(repo().join("e2e/agents.versions")).expect("agents.versions");
    let claude = agents
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|columns| columns.first() == Some(&"claude-code"))
        .expect("claude-code is pinned");
    let (package, pinned) = (claude[1], claude[2]);
    assert!(
        dockerfile.contains(&format!("ARG AGENT_PACKAGE={package}")),
        "Dockerfile's AGENT_PACKAGE is {package} (e2e/agents.versions)"
    );
    assert!(
        dockerfile.contains(&format!("ARG AGENT_VERSION={pinned}")),
        "Dockerfile's AGENT_VERSION is {pinned} (e2e/agents.versions)"
    );
    // It is installed from a lockfile that pins that version, every package with its integrity
    // hash.
    let lock_dir = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("ARG AGENT_LOCK="))
        .expect("ARG AGENT_LOCK");
    let read = |file: &str| -> serde_json::Value {
        let path = repo().join(lock_dir).join(file);
        serde_json::from_str(&std::fs::read_to_string(&path).expect("lockfile")).expect("json")
    };
    assert_eq!(read("package.json")["dependencies"][package], pinned);
    let lock = read("package-lock.json");
    let packages = lock["packages"].as_object().expect("lockfile v3 packages");
    assert_eq!(
        packages[&format!("node_modules/{package}")]["version"],
        pinned
    );
    for (path, entry) in packages.iter().filter(|(path, _)| !path.is_empty()) {
        assert!(
            entry["integrity"]
                .as_str()
                .is_some_and(|i| i.starts_with("sha512-")),
            "{path} has no integrity hash in {lock_dir}/package-lock.json"
        );
    }
    assert!(
        dockerfile.contains("npm ci --omit=dev"),
        "the agent is installed with npm ci"
    );
}

/// One source of truth for the default agentctl image: the operator binary's `--agentctl-image`
/// default is the chart's `agentctlImage.repository` at the chart's appVersion, never `latest`.
#[test]
fn the_binarys_default_agentctl_image_is_the_charts_pinned_one() {
    let chart = chart_yaml("Chart.yaml");
    let values = chart_yaml("values.yaml");
    let pinned = format!(
        "{}:{}",
        values["agentctlImage"]["repository"]
            .as_str()
            .expect("repository"),
        chart["appVersion"].as_str().expect("appVersion")
    );
    assert_eq!(
        values["agentctlImage"]["tag"], "",
        "the tag follows appVersion"
    );
    let help = run(Command::new(env!("CARGO_BIN_EXE_kandev-operator"))
        .args(["run", "--help"])
        .env_remove("KANDEV_AGENTCTL_IMAGE"))
    .stdout;
    let default = help
        .split("--agentctl-image")
        .nth(1)
        .and_then(|rest| rest.split("[default: ").nth(1))
        .and_then(|rest| rest.split(']').next())
        .unwrap_or_else(|| panic!("no default of --agentctl-image in\n{help}"));
    assert_eq!(default, pinned);
    assert!(!default.ends_with(":latest"));
}

/// The Dockerfile's base images are pinned: by digest (`@sha256:…`), else by a full version
/// (`x.y.z` in the tag); distroless, which has no version tags, by its Debian release.
#[test]
fn dockerfile_base_images_are_pinned() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let images: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(images.len() >= 3, "{images:?}");
    for image in images {
        if let Some((_, digest)) = image.split_once("@sha256:") {
            assert!(
                digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
                "{image}: a sha256 digest has 64 hex digits"
            );
            continue;
        }
        if image.starts_with("gcr.io/distroless/") {
            assert!(
                image.contains("-debian12:"),
                "{image}: distroless of a Debian release"
            );
            continue;
        }
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        let version = tag.split('-').next().unwrap_or("");
        assert!(
            version.split('.').count() == 3
                && version
                    .split('.')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())),
            "{image}: pin a full version (x.y.z) or a digest, not a floating tag"
        );
    }
}

/// Chart.yaml declares the Kubernetes versions it supports.
#[test]
fn chart_declares_its_kube_version() {
    let chart = chart_yaml("Chart.yaml");
    assert_eq!(chart["kubeVersion"], ">=1.30.0-0");
}

// ---- with helm ----------------------------------------------------------------------------

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn rbac_grants_exactly_the_required_permissions() {
    let docs = render(&[]);
    let cluster_role = find(&docs, "ClusterRole", RELEASE);
    assert_same_grants("ClusterRole", cluster_role, Scope::Watched);
    let role = find(&docs, "Role", RELEASE);
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_same_grants("Role", role, Scope::LeaseNamespace);
    assert_eq!(kinds(&docs, "Role"), [RELEASE]);

    let service_account = find(&docs, "ServiceAccount", RELEASE);
    assert_eq!(service_account["metadata"]["namespace"], NAMESPACE);
    for (kind, role_kind) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let binding = find(&docs, kind, RELEASE);
        assert_eq!(binding["roleRef"]["kind"], role_kind);
        assert_eq!(binding["roleRef"]["name"], RELEASE);
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}])
        );
    }
    let nodes = format!("{RELEASE}-nodes");
    // metrics.access=authenticated (the default) adds the two reviews (metrics_access_modes).
    let metrics_auth = format!("{RELEASE}-metrics-auth");
    let mut bindings = kinds(&docs, "ClusterRoleBinding");
    bindings.sort();
    assert_eq!(
        bindings,
        [RELEASE.to_string(), metrics_auth.clone(), nodes.clone()]
    );
    assert_eq!(kinds(&docs, "RoleBinding"), [RELEASE]);

    // The aggregated user roles touch only kandev.dev resources; view reads, edit writes sessions.
    let mut cluster_roles = kinds(&docs, "ClusterRole");
    cluster_roles.sort();
    assert_eq!(
        cluster_roles,
        [
            RELEASE.to_string(),
            format!("{RELEASE}-admin"),
            format!("{RELEASE}-edit"),
            metrics_auth,
            format!("{RELEASE}-metrics-reader"),
            nodes.clone(),
            format!("{RELEASE}-view")
        ]
    );
    let view = find(&docs, "ClusterRole", &format!("{RELEASE}-view"));
    let edit = find(&docs, "ClusterRole", &format!("{RELEASE}-edit"));
    for (role, labels) in [
        (view, &["view", "edit", "admin"][..]),
        (edit, &["edit", "admin"][..]),
    ] {
        for label in labels {
            assert_eq!(
                role["metadata"]["labels"]
                    [format!("rbac.authorization.k8s.io/aggregate-to-{label}")],
                "true"
            );
        }
        assert!(
            grants(role)
                .iter()
                .all(|(group, _, _)| group == "kandev.dev")
        );
    }
    assert!(
        grants(view)
            .iter()
            .all(|(_, _, verb)| ["get", "list", "watch"].contains(&verb.as_str()))
    );
    assert!(
        grants(edit)
            .iter()
            .all(|(_, resource, _)| resource == "tasksessions")
    );
    assert!(grants(edit).contains(&("kandev.dev".into(), "tasksessions".into(), "patch".into())));
    // admin alone may mark Secrets for agent use, and that is all it gets from the chart.
    let admin = find(&docs, "ClusterRole", &format!("{RELEASE}-admin"));
    assert_eq!(
        admin["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    assert!(admin["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"].is_null());
    assert_eq!(
        grants(admin),
        BTreeSet::from([(String::new(), "secrets".into(), "use".into())])
    );

    // Toggles.
    let docs = render(&[
        "--set",
        "rbac.aggregateToDefaultRoles=false",
        "--set",
        "metrics.access=open",
    ]);
    let mut cluster_roles = kinds(&docs, "ClusterRole");
    cluster_roles.sort();
    assert_eq!(cluster_roles, [RELEASE.to_string(), nodes.clone()]);
    let docs = render(&[
        "--set",
        "rbac.aggregateToDefaultRoles=false",
        "--set",
        "controller.nodeLostSeconds=0",
        "--set",
        "metrics.access=open",
    ]);
    assert_eq!(kinds(&docs, "ClusterRole"), [RELEASE]);
    assert_eq!(kinds(&docs, "ClusterRoleBinding"), [RELEASE]);
    assert!(operator_args(&docs).contains(&"--node-lost-seconds=0".to_string()));
    let docs = render(&["--set", "rbac.create=false"]);
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(
            kinds(&docs, kind).is_empty(),
            "rbac.create=false: no {kind}"
        );
    }
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn namespaced_mode_grants_the_same_in_each_watched_namespace_only() {
    let docs = render(&["--set", "watchNamespaces={team-a,team-b}"]);
    let nodes = format!("{RELEASE}-nodes");
    let metrics_auth = format!("{RELEASE}-metrics-auth");
    let mut cluster_roles = kinds(&docs, "ClusterRole");
    cluster_roles.sort();
    assert_eq!(
        cluster_roles,
        [
            format!("{RELEASE}-admin"),
            format!("{RELEASE}-edit"),
            metrics_auth.clone(),
            format!("{RELEASE}-metrics-reader"),
            nodes.clone(),
            format!("{RELEASE}-view")
        ],
        "no ClusterRole of the operator's own, besides the cluster-scoped nodes and reviews"
    );
    let mut bindings = kinds(&docs, "ClusterRoleBinding");
    bindings.sort();
    assert_eq!(bindings, [metrics_auth.as_str(), nodes.as_str()]);
    // Nodes are cluster-scoped: list and watch them, exactly Scope::Nodes, in either mode.
    for docs in [&docs, &render(&[])] {
        assert_same_grants(
            "ClusterRole -nodes",
            find(docs, "ClusterRole", &nodes),
            Scope::Nodes,
        );
        let binding = find(docs, "ClusterRoleBinding", &nodes);
        assert_eq!(binding["roleRef"]["name"], nodes.as_str());
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}])
        );
    }
    let sessions = format!("{RELEASE}-sessions");
    for ns in ["team-a", "team-b"] {
        let in_ns = |kind: &str| {
            docs.iter()
                .find(|d| {
                    d["kind"] == kind
                        && d["metadata"]["name"] == sessions.as_str()
                        && d["metadata"]["namespace"] == ns
                })
                .unwrap_or_else(|| panic!("{kind} {sessions} in {ns}"))
        };
        assert_same_grants(&format!("Role in {ns}"), in_ns("Role"), Scope::Watched);
        let binding = in_ns("RoleBinding");
        assert_eq!(binding["roleRef"]["kind"], "Role");
        assert_eq!(binding["roleRef"]["name"], sessions.as_str());
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}])
        );
    }
    // The Lease Role stays in the release namespace.
    let lease = find(&docs, "Role", RELEASE);
    assert_eq!(lease["metadata"]["namespace"], NAMESPACE);
    assert_same_grants("Role", lease, Scope::LeaseNamespace);
    let mut roles = kinds(&docs, "Role");
    roles.sort();
    assert_eq!(roles, [RELEASE, sessions.as_str(), sessions.as_str()]);

    let args = operator_args(&docs);
    for expected in ["--watch-namespace=team-a", "--watch-namespace=team-b"] {
        assert!(
            args.contains(&expected.to_string()),
            "{expected} in {args:?}"
        );
    }
    assert!(
        !operator_args(&render(&[]))
            .iter()
            .any(|a| a.starts_with("--watch-namespace")),
        "cluster-wide by default"
    );
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn agent_pod_containment_values_reach_the_operator() {
    let args = operator_args(&render(&[]));
    for expected in [
        "--default-resource-request=cpu=250m",
        "--default-resource-request=memory=512Mi",
        "--default-resource-limit=memory=2Gi",
        "--default-resource-request=ephemeral-storage=256Mi",
        "--default-resource-limit=ephemeral-storage=4Gi",
        "--tmp-size-limit=1Gi",
        "--run-size-limit=16Mi",
        "--host-users=true",
        "--agent-network-policy=true",
        "--egress-allow-cidr=0.0.0.0/0",
        "--egress-allow-cidr=::/0",
        "--egress-deny-cidr=169.254.0.0/16",
        "--egress-deny-cidr=168.63.129.16/32",
        "--egress-deny-cidr=10.0.0.0/8",
        "--egress-deny-cidr=64:ff9b::a9fe:0/112",
    ] {
        assert!(
            args.contains(&expected.to_string()),
            "{expected} in {args:?}"
        );
    }
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--runtime-class-name")
                || a.starts_with("--allowed-image-prefix"))
    );
    // The chart's defaults are the binary's.
    let values = chart_yaml("values.yaml");
    let denied: Vec<String> = strings(&values["agentPods"]["networkPolicy"]["deniedEgressCIDRs"]);
    assert_eq!(
        denied,
        kandev_operator::controller::pods::DEFAULT_EGRESS_DENY
    );
    let allowed = strings(&values["agentPods"]["networkPolicy"]["allowedEgressCIDRs"]);
    assert_eq!(
        allowed,
        kandev_operator::controller::pods::DEFAULT_EGRESS_ALLOW
    );

    let args = operator_args(&render(&[
        "--set",
        "agentPods.runtimeClassName=gvisor",
        "--set",
        "agentPods.hostUsers=false",
        "--set",
        "agentPods.allowedImagePrefixes={kandev/,registry.example/agents/}",
        "--set",
        "agentPods.networkPolicy.enabled=false",
        "--set-json",
        r#"agentPods.resources={"requests":{"cpu":"1"},"limits":{"memory":"4Gi","cpu":"2"}}"#,
    ]));
    for expected in [
        "--runtime-class-name=gvisor",
        "--host-users=false",
        "--allowed-image-prefix=kandev/",
        "--allowed-image-prefix=registry.example/agents/",
        "--agent-network-policy=false",
        "--default-resource-request=cpu=1",
        "--default-resource-limit=cpu=2",
        "--default-resource-limit=memory=4Gi",
    ] {
        assert!(
            args.contains(&expected.to_string()),
            "{expected} in {args:?}"
        );
    }
    assert!(!args.iter().any(|a| a.starts_with("--egress-")));
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn admission_policy_binds_the_operator_to_its_pods() {
    let docs = render(&[]);
    let name = format!("{RELEASE}-{NAMESPACE}-agent-pods");
    let policy = find(&docs, "ValidatingAdmissionPolicy", &name);
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(
        spec["matchConditions"][0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{RELEASE}'")
    );
    assert_eq!(
        spec["matchConstraints"]["resourceRules"][0]["resources"],
        serde_json::json!(["pods"])
    );
    let validations = spec["validations"].as_array().expect("validations");
    let expressions: Vec<&str> = validations
        .iter()
        .map(|v| v["expression"].as_str().expect("expression"))
        .collect();
    assert_eq!(
        spec["matchConstraints"]["resourceRules"][0]["operations"],
        serde_json::json!(["CREATE", "UPDATE", "DELETE"])
    );
    for needle in [
        "kandev.dev/managed",
        "runAsNonRoot",
        "automountServiceAccountToken",
        "serviceAccountName",
        "persistentVolumeClaim",
        "privileged",
        "allowPrivilegeEscalation",
        "'ALL' in c.securityContext.capabilities.drop",
        "hostNetwork",
        "hostPort",
        "seccompProfile",
    ] {
        assert!(
            expressions.iter().any(|e| e.contains(needle)),
            "{needle} in {expressions:?}"
        );
    }
    assert!(
        !expressions.iter().any(|e| e.contains("c.image.startsWith")),
        "no image list by default"
    );
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", &name);
    assert_eq!(binding["spec"]["policyName"], name.as_str());
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );

    let docs = render(&["--set", "agentPods.allowedImagePrefixes={kandev/}"]);
    let policy = find(&docs, "ValidatingAdmissionPolicy", &name);
    let last = policy["spec"]["validations"]
        .as_array()
        .and_then(|v| v.last())
        .expect("validations");
    assert_eq!(
        last["expression"],
        r#"variables.deleting || variables.containers.all(c, ["kandev/"].exists(p, c.image.startsWith(p)))"#
    );

    // The placement and runtime the chart gives agent pods are the only ones admitted.
    let docs = render(&[
        "--set",
        "agentPods.nodeSelector.pool=agents",
        "--set",
        "agentPods.tolerations[0].key=dedicated",
        "--set",
        "agentPods.tolerations[0].value=agents",
        "--set",
        "agentPods.tolerations[0].effect=NoSchedule",
        "--set",
        "agentPods.tolerations[1].key=gpu",
        "--set",
        "agentPods.tolerations[1].effect=NoExecute",
        "--set",
        "agentPods.runtimeClassName=gvisor",
        "--set",
        "agentPods.hostUsers=false",
    ]);
    let policy = find(&docs, "ValidatingAdmissionPolicy", &name);
    let rendered: Vec<&str> = policy["spec"]["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .map(|v| v["expression"].as_str().expect("expression"))
        .collect();
    let rendered = rendered.join("\n");
    for needle in [
        r#"in ["pool=agents"]"#,
        r#""dedicated|Equal|agents|NoSchedule","gpu|Exists||NoExecute""#,
        r#""node.kubernetes.io/not-ready|Exists||NoExecute""#,
        "object.spec.runtimeClassName : '') == 'gvisor'",
        "object.spec.hostUsers : true) == false",
    ] {
        assert!(rendered.contains(needle), "{needle} in {rendered}");
    }
    // PVCs and NetworkPolicies, and exec, each have a policy of their own, bound.
    for (suffix, resources) in [
        (
            "agent-objects",
            vec!["persistentvolumeclaims", "networkpolicies"],
        ),
        ("agent-exec", vec!["pods/exec"]),
    ] {
        let name = format!("{RELEASE}-{NAMESPACE}-{suffix}");
        let policy = find(&docs, "ValidatingAdmissionPolicy", &name);
        let rules = policy["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .expect("rules");
        let matched: Vec<&str> = rules
            .iter()
            .flat_map(|r| r["resources"].as_array().expect("resources"))
            .map(|r| r.as_str().expect("resource"))
            .collect();
        assert_eq!(matched, resources, "{name}");
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            format!("request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{RELEASE}'")
        );
        let binding = find(&docs, "ValidatingAdmissionPolicyBinding", &name);
        assert_eq!(binding["spec"]["policyName"], name.as_str());
    }
    // Sessions' Secrets: every user's TaskSessions, checked with the API server's authorizer.
    let name = format!("{RELEASE}-{NAMESPACE}-session-secrets");
    let policy = find(&docs, "ValidatingAdmissionPolicy", &name);
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"],
        serde_json::json!(["tasksessions"])
    );
    assert!(policy["spec"]["matchConditions"].is_null(), "{policy}");
    let rendered = policy.to_string();
    for needle in [
        "!(s in variables.before)",
        "variables.secrets.check('use').allowed() || variables.secrets.check('get').allowed()",
        "variables.secrets.name(variables.added[11]).check('use').allowed()",
        "variables.secrets.name(variables.added[11]).check('get').allowed()",
    ] {
        assert!(rendered.contains(needle), "{needle} in {rendered}");
    }
    // At most two authorization checks per expression (the API server's price: 350,000 of
    // 1,000,000), 26 in all (of 10,000,000): the bound, then one expression per added name.
    let validations = policy["spec"]["validations"]
        .as_array()
        .expect("validations");
    assert_eq!(validations.len(), 13);
    for v in validations {
        let expression = v["expression"].as_str().expect("expression");
        assert!(expression.matches(".check(").count() <= 2, "{expression}");
    }
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", &name);
    assert_eq!(binding["spec"]["policyName"], name.as_str());

    let docs = render(&["--set", "admissionPolicy.enabled=false"]);
    assert!(kinds(&docs, "ValidatingAdmissionPolicy").is_empty());
    assert!(kinds(&docs, "ValidatingAdmissionPolicyBinding").is_empty());
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn without_leader_election_there_is_no_lease_role() {
    let docs = render(&[
        "--set",
        "replicaCount=1",
        "--set",
        "leaderElection.enabled=false",
    ]);
    assert!(kinds(&docs, "Role").is_empty());
    assert!(kinds(&docs, "RoleBinding").is_empty());
    assert!(
        kinds(&docs, "PodDisruptionBudget").is_empty(),
        "no PDB for one replica"
    );
    assert!(operator_args(&docs).contains(&"--no-leader-election".to_string()));
    assert!(
        !operator_args(&docs)
            .iter()
            .any(|a| a.starts_with("--lease-name"))
    );
}

/// The operator's own pod gets an ingress NetworkPolicy of its ports, from the peers the values
/// name (anyone by default), and none when turned off.
#[test]
#[ignore = "chart: needs helm (make chart)"]
fn the_operators_pod_has_an_ingress_network_policy() {
    let docs = render(&[]);
    let policy = find(&docs, "NetworkPolicy", RELEASE);
    let spec = &policy["spec"];
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(
        spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "kandev-operator"
    );
    let ports: Vec<&str> = spec["ingress"]
        .as_array()
        .expect("ingress")
        .iter()
        .map(|rule| rule["ports"][0]["port"].as_str().expect("port"))
        .collect();
    assert_eq!(ports, ["http", "https-metrics"]);
    assert!(spec["ingress"][1]["from"].is_null(), "anyone by default");

    let monitoring =
        r#"[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#;
    let docs = render(&[
        "--set-json",
        &format!("networkPolicy.metricsFrom={monitoring}"),
        "--set",
        "metrics.access=authenticated",
    ]);
    let policy = find(&docs, "NetworkPolicy", RELEASE);
    assert_eq!(
        policy["spec"]["ingress"][1]["from"],
        serde_json::from_str::<Value>(monitoring).expect("json")
    );
    let docs = render(&["--set", "metrics.access=open"]);
    let policy = find(&docs, "NetworkPolicy", RELEASE);
    assert_eq!(policy["spec"]["ingress"].as_array().map(Vec::len), Some(1));
    let docs = render(&["--set", "networkPolicy.enabled=false"]);
    assert!(kinds(&docs, "NetworkPolicy").is_empty());
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn deployment_defaults() {
    let docs = render(&[]);
    let version = env!("CARGO_PKG_VERSION");
    let deployment = find(&docs, "Deployment", RELEASE);
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    assert_eq!(deployment["spec"]["replicas"], 2, "two replicas by default");
    let pod = &deployment["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"], "kandev-operator",
        "the e2e harness plays pods with this label"
    );
    let spec = &pod["spec"];
    assert_eq!(spec["serviceAccountName"], RELEASE);
    assert_eq!(spec["automountServiceAccountToken"], true);
    assert_eq!(
        spec["securityContext"],
        serde_json::json!({
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    assert_eq!(
        spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"],
        "kubernetes.io/hostname",
        "replicas prefer different nodes"
    );

    let container = operator_container(&docs);
    assert_eq!(
        container["image"],
        format!("kandev/kandev-operator:{version}")
    );
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    // An explicit command: the image's ENTRYPOINT is not needed (and the e2e harness runs it).
    assert_eq!(container["command"], serde_json::json!(["kandev-operator"]));
    let args = operator_args(&docs);
    assert_eq!(args[0], "run");
    for expected in [
        format!("--agentctl-image=kandev/agentctl:{version}"),
        "--http-address=0.0.0.0:8080".to_string(),
        "--resync-seconds=60".to_string(),
        "--acp-timeout-seconds=30".to_string(),
        "--acp-restore-timeout-seconds=120".to_string(),
        "--acp-replay-line-limit-mib=8".to_string(),
        "--acp-replay-budget-mib=256".to_string(),
        "--run-as-user=1000".to_string(),
        "--lease-name=kandev-operator".to_string(),
    ] {
        assert!(args.contains(&expected), "{expected} in {args:?}");
    }
    assert!(!args.contains(&"--skip-permission-check".to_string()));
    assert!(!args.iter().any(|a| a.starts_with("--agent-profiles")));
    // The restores' memory budget: half of the memory limit, found by the operator itself.
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--acp-memory-budget-mib"))
    );
    let budget = operator_args(&render(&["--set", "controller.acpMemoryBudgetMiB=96"]));
    assert!(budget.contains(&"--acp-memory-budget-mib=96".to_string()));

    let env = container["env"].as_array().expect("env");
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let var = env
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("env {name}"));
        assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], field);
    }

    assert_eq!(
        container["ports"],
        serde_json::json!([
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "https-metrics", "containerPort": 8443, "protocol": "TCP"},
        ])
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path);
        assert_eq!(container[probe]["httpGet"]["port"], "http");
    }
    assert_eq!(
        container["securityContext"],
        serde_json::json!({
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]},
        })
    );
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());

    let service = find(&docs, "Service", &format!("{RELEASE}-metrics"));
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(service["spec"]["ports"][0]["name"], "https-metrics");
    assert_eq!(service["spec"]["ports"][0]["port"], 8443);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https-metrics");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let pdb = find(&docs, "PodDisruptionBudget", RELEASE);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(kinds(&docs, "ServiceMonitor").is_empty());
    assert!(kinds(&docs, "ConfigMap").is_empty());

    // Tags and repositories come from values.
    let docs = render(&[
        "--set",
        "image.repository=registry.example/op",
        "--set",
        "image.tag=v9",
        "--set",
        "agentctlImage.repository=registry.example/agentctl",
        "--set",
        "agentctlImage.tag=v8",
    ]);
    assert_eq!(operator_container(&docs)["image"], "registry.example/op:v9");
    assert!(
        operator_args(&docs).contains(&"--agentctl-image=registry.example/agentctl:v8".to_string())
    );
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn optional_resources() {
    let docs = render(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
        "--set-json",
        r#"agentProfiles={"my-agent":{"launch":["my-agent","--acp"],"nativeSessionResume":true}}"#,
        "--set-json",
        r#"agentPods.tolerations=[{"key":"dedicated","value":"agents","effect":"NoSchedule"},{"key":"gpu","effect":"NoExecute"}]"#,
        "--set",
        "agentPods.nodeSelector.pool=agents",
    ]);
    let monitor = find(&docs, "ServiceMonitor", RELEASE);
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "https-metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let service = find(&docs, "Service", &format!("{RELEASE}-metrics"));
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
    {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the ServiceMonitor selects the metrics Service"
        );
    }

    // The profiles ConfigMap is a file the operator loads.
    let config = find(&docs, "ConfigMap", &format!("{RELEASE}-agent-profiles"));
    let file = config["data"]["profiles.yaml"]
        .as_str()
        .expect("profiles.yaml");
    let registry = AgentRegistry::from_yaml_str(file).expect("the operator accepts the file");
    assert!(registry.get("my-agent").is_some());
    assert!(
        registry.get("claude-code").is_some(),
        "built-ins stay available"
    );

    let args = operator_args(&docs);
    for expected in [
        "--agent-profiles=/etc/kandev/profiles/profiles.yaml",
        "--pod-toleration=dedicated=agents:NoSchedule",
        "--pod-toleration=gpu:NoExecute",
        "--pod-node-selector=pool=agents",
    ] {
        assert!(
            args.contains(&expected.to_string()),
            "{expected} in {args:?}"
        );
    }
    let deployment = find(&docs, "Deployment", RELEASE);
    let pod = &deployment["spec"]["template"];
    let checksum = pod["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .expect("checksum/config annotation");
    assert_eq!(checksum.len(), 64);
    assert_eq!(
        pod["spec"]["volumes"][0]["configMap"]["name"],
        format!("{RELEASE}-agent-profiles")
    );
    assert_eq!(
        operator_container(&docs)["volumeMounts"][0]["mountPath"],
        "/etc/kandev/profiles"
    );

    // Another profile, another checksum: the pods roll when the profiles change.
    let other = render(&[
        "--set-json",
        r#"agentProfiles={"my-agent":{"launch":["my-agent"]}}"#,
    ]);
    let other_checksum = find(&other, "Deployment", RELEASE)["spec"]["template"]["metadata"]
        ["annotations"]["checksum/config"]
        .clone();
    assert_ne!(other_checksum, checksum);
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn metrics_access_modes() {
    let metrics_args = |docs: &[Value]| -> Vec<String> {
        operator_args(docs)
            .into_iter()
            .filter(|a| a.starts_with("--metrics-"))
            .collect()
    };
    let monitor_endpoint =
        |docs: &[Value]| find(docs, "ServiceMonitor", RELEASE)["spec"]["endpoints"][0].clone();
    let auth = format!("{RELEASE}-metrics-auth");
    let reader = format!("{RELEASE}-metrics-reader");

    // open: served with the probes to anyone, plain HTTP, nothing more.
    let docs = render(&[
        "--set",
        "metrics.access=open",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    ]);
    assert!(metrics_args(&docs).is_empty());
    assert!(!kinds(&docs, "ClusterRole").contains(&auth));
    let endpoint = monitor_endpoint(&docs);
    assert_eq!(endpoint["port"], "http-metrics");
    assert!(endpoint.get("scheme").is_none() && endpoint.get("tlsConfig").is_none());
    assert!(endpoint.get("bearerTokenFile").is_none() && endpoint.get("authorization").is_none());
    let service = find(&docs, "Service", &format!("{RELEASE}-metrics"));
    assert_eq!(
        (
            &service["spec"]["ports"][0]["name"],
            &service["spec"]["ports"][0]["port"]
        ),
        (&"http-metrics".into(), &8080.into())
    );
    assert_eq!(
        operator_container(&docs)["ports"].as_array().map(Vec::len),
        Some(1)
    );

    // authenticated (the default): the operator checks tokens over TLS on its own port (a
    // self-signed certificate), may create the two reviews (exactly Scope::MetricsAuth,
    // cluster-wide in either install mode), and scrapers get a role to bind.
    for extra in [&[][..], &["--set", "watchNamespaces={team-a}"][..]] {
        let mut args = vec!["--set", "metrics.serviceMonitor.enabled=true"];
        args.extend_from_slice(extra);
        let docs = render(&args);
        assert_eq!(
            metrics_args(&docs),
            [
                "--metrics-auth=kubernetes",
                "--metrics-address=0.0.0.0:8443",
                "--metrics-tls"
            ]
        );
        let endpoint = monitor_endpoint(&docs);
        assert_eq!(
            (&endpoint["port"], &endpoint["scheme"]),
            (&"https-metrics".into(), &"https".into())
        );
        assert_eq!(
            endpoint["tlsConfig"],
            serde_json::json!({"insecureSkipVerify": true})
        );
        assert_same_grants(
            "ClusterRole -metrics-auth",
            find(&docs, "ClusterRole", &auth),
            Scope::MetricsAuth,
        );
        let binding = find(&docs, "ClusterRoleBinding", &auth);
        assert_eq!(binding["roleRef"]["name"], auth.as_str());
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}])
        );
        assert_eq!(
            find(&docs, "ClusterRole", &reader)["rules"],
            serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
        );
        assert!(
            !kinds(&docs, "ClusterRoleBinding").contains(&reader),
            "bound only to metrics.readers"
        );
        find(&docs, "Service", &format!("{RELEASE}-metrics"));
        assert_eq!(
            monitor_endpoint(&docs)["bearerTokenFile"],
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        );
    }
    let docs = render(&[
        "--set",
        "metrics.access=authenticated",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set-json",
        r#"metrics.serviceMonitor.authorization={"type":"Bearer","credentials":{"name":"scraper","key":"token"}}"#,
        "--set-json",
        r#"metrics.readers=[{"kind":"ServiceAccount","name":"prometheus","namespace":"monitoring"},{"kind":"Group","name":"scrapers"}]"#,
    ]);
    let endpoint = monitor_endpoint(&docs);
    assert_eq!(endpoint["authorization"]["credentials"]["name"], "scraper");
    assert!(endpoint.get("bearerTokenFile").is_none());
    assert_eq!(
        find(&docs, "ClusterRoleBinding", &reader)["subjects"],
        serde_json::json!([
            {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"},
            {"kind": "Group", "name": "scrapers", "apiGroup": "rbac.authorization.k8s.io"},
        ])
    );

    // A certificate from a Secret (cert-manager's, say), verified by the scraper.
    let docs = render(&[
        "--set",
        "metrics.tls.secretName=metrics-cert",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set-json",
        r#"metrics.serviceMonitor.tlsConfig={"ca":{"secret":{"name":"metrics-cert","key":"ca.crt"}},"serverName":"kandev-operator-metrics.kandev-system.svc"}"#,
    ]);
    assert_eq!(
        metrics_args(&docs)[3..],
        [
            "--metrics-tls-cert-file=/etc/kandev/metrics-tls/tls.crt",
            "--metrics-tls-key-file=/etc/kandev/metrics-tls/tls.key"
        ]
    );
    let deployment = find(&docs, "Deployment", RELEASE);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"],
        serde_json::json!([{"name": "metrics-tls", "secret": {"secretName": "metrics-cert"}}])
    );
    assert_eq!(
        operator_container(&docs)["volumeMounts"],
        serde_json::json!([{"name": "metrics-tls", "mountPath": "/etc/kandev/metrics-tls", "readOnly": true}])
    );
    let tls = &monitor_endpoint(&docs)["tlsConfig"];
    assert_eq!(tls["ca"]["secret"]["name"], "metrics-cert");
    assert!(tls.get("insecureSkipVerify").is_none());
    let docs = render(&[
        "--set",
        "metrics.access=authenticated",
        "--set",
        "rbac.create=false",
    ]);
    assert!(
        kinds(&docs, "ClusterRole").is_empty() && kinds(&docs, "ClusterRoleBinding").is_empty()
    );

    // localhost: /metrics on 127.0.0.1 only, so no Service to reach it.
    let docs = render(&[
        "--set",
        "metrics.access=localhost",
        "--set",
        "metrics.localhostPort=9100",
    ]);
    assert_eq!(metrics_args(&docs), ["--metrics-address=127.0.0.1:9100"]);
    assert!(
        operator_args(&docs).contains(&"--http-address=0.0.0.0:8080".to_string()),
        "the probes stay on the pod IP"
    );
    assert!(!kinds(&docs, "Service").contains(&format!("{RELEASE}-metrics")));
    assert!(!kinds(&docs, "ClusterRole").contains(&auth));
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn tracing_values_become_the_standard_otel_variables() {
    let otel = |docs: &[Value]| -> Vec<(String, String)> {
        operator_container(docs)["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter(|v| v["name"].as_str().unwrap_or("").starts_with("OTEL_"))
            .map(|v| {
                (
                    v["name"].as_str().unwrap_or("").to_string(),
                    v["value"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    assert!(otel(&render(&[])).is_empty(), "traces are off by default");
    let docs = render(&[
        "--set",
        "tracing.otlpEndpoint=http://otel-collector.observability:4318",
        "--set",
        "tracing.sampler=parentbased_traceidratio",
        "--set",
        "tracing.samplerArg=0.25",
    ]);
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        otel(&docs),
        vec![
            pair(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-collector.observability:4318"
            ),
            pair("OTEL_SERVICE_NAME", "kandev-operator"),
            pair("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            pair("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ]
    );
}

/// The operator started with the arguments a render gives it: it gets past every flag and
/// setting check, as far as loading the cluster configuration (none here). Its ports are moved
/// to ephemeral local ones so nothing on this machine is in the way.
fn assert_operator_starts(args: &[String], what: &str) {
    let args: Vec<String> = args
        .iter()
        .map(|arg| match arg.split_once('=') {
            Some((flag @ ("--http-address" | "--metrics-address"), _)) => {
                format!("{flag}=127.0.0.1:0")
            }
            _ => arg.clone(),
        })
        .collect();
    let out = run(Command::new(env!("CARGO_BIN_EXE_kandev-operator"))
        .args(&args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT"));
    assert!(
        out.stderr.contains("loading the cluster configuration"),
        "{what}: the operator refused the rendered arguments {args:?}:\n{}",
        out.stderr
    );
}

/// The values schema holds each value to the operator's own limits: at each boundary, a value
/// the schema accepts starts the operator, and one the operator would refuse at start is
/// refused by `helm install|upgrade` (instead of new pods crash-looping after an upgrade).
#[test]
#[ignore = "chart: needs helm (make chart)"]
fn boundary_values_the_schema_accepts_start_the_operator() {
    #[rustfmt::skip]
    let rows: &[(&str, bool)] = &[
        ("controller.suspendIdleAfter=off", true),
        ("controller.suspendIdleAfter=10s", true),
        ("controller.suspendIdleAfter=0h0m10s", true),
        ("controller.suspendIdleAfter=1m", true),
        ("controller.suspendIdleAfter=1h", true),
        ("controller.suspendIdleAfter=9s", false),
        ("controller.suspendIdleAfter=0m9s", false),
        ("controller.suspendIdleAfter=0h", false),
        ("controller.suspendIdleAfter=30", false),
        ("permissions.askTimeout=10s", true),
        ("permissions.askTimeout=off", true),
        ("permissions.askTimeout=9s", false),
        ("controller.acpReplayLineLimitMiB=1", true),
        ("controller.acpReplayLineLimitMiB=64,controller.acpMemoryBudgetMiB=192", true),
        ("controller.acpReplayLineLimitMiB=65", false),
        ("controller.acpReplayLineLimitMiB=0", false),
        ("controller.maxConcurrentReconciles=1", true),
        ("controller.maxConcurrentReconciles=65535", true),
        ("controller.maxConcurrentReconciles=65536", false),
        ("controller.resyncSeconds=1", true),
        ("controller.resyncSeconds=0", false),
        ("controller.acpTimeoutSeconds=1", true),
        ("controller.acpTimeoutSeconds=0", false),
        ("controller.launchDeadlineSeconds=1", true),
        ("controller.launchDeadlineSeconds=0", false),
        ("controller.agentUnreachableSeconds=0", true),
        ("controller.nodeLostSeconds=0", true),
        ("controller.journalCatchUpSeconds=0", true),
        ("controller.catchUpExecsPerSecond=0", true),
        ("controller.acpMemoryBudgetMiB=0", true),
        ("agentPods.runAsUser=1", true),
        ("agentPods.runAsUser=0", false),
        ("agentPods.tmpSizeLimit=1Mi", true),
        ("agentPods.tmpSizeLimit=lots", false),
    ];
    for (set, accepted) in rows {
        match (template(&["--set", set]), accepted) {
            (Ok(docs), true) => assert_operator_starts(&operator_args(&docs), set),
            (Err(_), false) => {}
            (Ok(_), false) => panic!("the schema accepts {set}, which the operator refuses"),
            (Err(stderr), true) => panic!("the schema refuses {set}:\n{stderr}"),
        }
    }
    assert_operator_starts(&operator_args(&render(&[])), "the defaults");
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn invalid_values_fail_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "replicaCount=two"], "replicaCount"),
        (&["--set", "replicaCount=0"], "replicaCount"),
        (&["--set", "replicasCount=2"], "replicasCount"),
        (&["--set", "image.tags=v1"], "tags"),
        (&["--set", "image.digest=sha256:abc"], "digest"),
        (&["--set", "agentctlImage.digest=latest"], "digest"),
        (&["--set", "crds.enabled=yes"], "enabled"),
        (
            &["--set", "metrics.prometheusRule.failedResumeRatio=2"],
            "failedResumeRatio",
        ),
        (
            &["--set", "metrics.prometheusRule.noLeaderFor=soon"],
            "noLeaderFor",
        ),
        (&["--kube-version", "1.29.0"], "kubeVersion"),
        (&["--set", "logFormat=xml"], "logFormat"),
        (&["--set", "tracing.otlpEndpoint=otel:4318"], "otlpEndpoint"),
        (&["--set", "tracing.sampler=sometimes"], "sampler"),
        (&["--set", "agentPods.runAsUser=0"], "runAsUser"),
        (&["--set", "watchNamespaces={Team_A}"], "watchNamespaces"),
        (
            &[
                "--set",
                "agentPods.networkPolicy.deniedEgressCIDRs={not-a-cidr}",
            ],
            "deniedEgressCIDRs",
        ),
        (
            &["--set", "agentPods.resources.limits.memory=lots"],
            "memory",
        ),
        (
            &[
                "--set",
                "agentPods.allowedImagePrefixes={registry.example/}",
            ],
            "does not allow the default agentctl image",
        ),
        // A prefix that does not end in '/' or ':' also matches other registries.
        (
            &["--set", "agentPods.allowedImagePrefixes={registry.example}"],
            "allowedImagePrefixes",
        ),
        (
            &["--set-json", r#"agentPods.tolerations=[{"key":"k"}]"#],
            "effect",
        ),
        (
            &["--set-json", r#"agentProfiles={"x":{"lanuch":["x"]}}"#],
            "lanuch",
        ),
        (
            &[
                "--set",
                "replicaCount=2",
                "--set",
                "leaderElection.enabled=false",
            ],
            "leaderElection.enabled",
        ),
        (
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
            ],
            "metrics.service.enabled",
        ),
        (&["--set", "metrics.access=tls"], "access"),
        (
            &[
                "--set",
                "metrics.access=localhost",
                "--set",
                "metrics.serviceMonitor.enabled=true",
            ],
            "only containers of the operator pod can reach /metrics",
        ),
        (
            &[
                "--set",
                "metrics.access=authenticated",
                "--set-json",
                r#"metrics.readers=[{"kind":"ServiceAccount","name":"prometheus"}]"#,
            ],
            "a ServiceAccount needs a namespace",
        ),
        // The restores' memory budget cannot hold one session/load (3 × the replay line).
        (
            &["--set", "controller.acpMemoryBudgetMiB=20"],
            "budget of 20 MiB (0: half of resources.limits.memory) cannot hold one session/load, which needs 24 MiB",
        ),
        (
            &[
                "--set",
                "resources.limits.memory=100Mi",
                "--set",
                "controller.acpReplayLineLimitMiB=32",
            ],
            "budget of 50 MiB",
        ),
        (
            &[
                "--set",
                "resources.limits.memory=0.06Gi",
                "--set",
                "controller.acpReplayLineLimitMiB=32",
            ],
            "budget of 30 MiB",
        ),
    ];
    for (args, mentions) in cases {
        match template(args) {
            Ok(_) => panic!("helm template {args:?} must fail"),
            Err(stderr) => assert!(
                stderr.contains(mentions),
                "helm template {args:?}: the error names {mentions:?}:\n{stderr}"
            ),
        }
    }
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn alerts_and_dashboard_use_only_what_the_operator_exports() {
    let off = render(&[]);
    assert!(kinds(&off, "PrometheusRule").is_empty(), "opt-in");
    assert!(
        !kinds(&off, "ConfigMap").contains(&format!("{RELEASE}-dashboard")),
        "opt-in"
    );
    let docs = render(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=prometheus",
        "--set",
        "metrics.prometheusRule.runbookBaseURL=https://docs.example/troubleshooting.md",
        "--set",
        "metrics.dashboard.enabled=true",
    ]);
    let exported = chart_promql::Exported::from_operator();
    let mut problems = Vec::new();

    // The alerts: each one of the list, with a runbook section that exists.
    let rule = find(&docs, "PrometheusRule", RELEASE);
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let troubleshooting =
        std::fs::read_to_string(repo().join("docs/troubleshooting.md")).expect("troubleshooting");
    let anchors: BTreeSet<String> = troubleshooting
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for alert in group["rules"].as_array().expect("rules") {
            let name = alert["alert"].as_str().expect("an alert").to_string();
            let expr = alert["expr"].as_str().expect("expr");
            for problem in exported.unknown_in(expr) {
                problems.push(format!("alert {name}: {problem}"));
            }
            assert!(
                expr.contains(&format!("namespace=\"{NAMESPACE}\"")),
                "{name} reads the release's series only: {expr}"
            );
            let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
            assert!(
                ["critical", "warning", "info"].contains(&severity),
                "{name}: severity {severity:?}"
            );
            assert!(alert["annotations"]["summary"].is_string(), "{name}");
            assert!(alert["annotations"]["description"].is_string(), "{name}");
            let runbook = alert["annotations"]["runbook_url"]
                .as_str()
                .expect("runbook_url");
            let section = runbook
                .strip_prefix("https://docs.example/troubleshooting.md#")
                .unwrap_or_else(|| panic!("{name}: runbook_url {runbook}"));
            assert!(
                anchors.contains(section),
                "{name}: docs/troubleshooting.md has no section #{section}"
            );
            alerts.push(name);
        }
    }
    alerts.sort();
    assert_eq!(
        alerts,
        [
            "KandevLaunchesStalled",
            "KandevNoLeader",
            "KandevReconcileErrors",
            "KandevResumesFailing",
            "KandevSessionsNeedResume",
            "KandevSessionsOverdue",
        ]
    );

    // The dashboard: a ConfigMap for Grafana's sidecar with the panels of the list.
    let config = find(&docs, "ConfigMap", &format!("{RELEASE}-dashboard"));
    assert_eq!(config["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(
        config["data"]["kandev-operator.json"]
            .as_str()
            .expect("the dashboard JSON"),
    )
    .expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "kandev-operator");
    let mut titles = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("title").to_string();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has a query");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            for problem in exported.unknown_in(expr) {
                problems.push(format!("panel {title}: {problem}"));
            }
        }
        titles.push(title);
    }
    for wanted in [
        "Sessions by state",
        "Resume outcomes",
        "ACP restore latency",
        "Reconcile latency",
        "API and reconcile errors",
    ] {
        assert!(
            titles.iter().any(|t| t == wanted),
            "panel {wanted} in {titles:?}"
        );
    }
    let restore = dashboard["panels"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["title"] == "ACP restore latency"))
        .expect("restore panel");
    let quantiles: Vec<&str> = restore["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(
        quantiles
            .iter()
            .any(|e| e.starts_with("histogram_quantile(0.5,"))
            && quantiles
                .iter()
                .any(|e| e.starts_with("histogram_quantile(0.95,")),
        "p50 and p95: {quantiles:?}"
    );
    // The namespace variable: label_values(<metric>, namespace) of an exported metric.
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            let metric = query
                .strip_prefix("label_values(")
                .and_then(|q| q.split(',').next())
                .unwrap_or_else(|| panic!("variable query {query}"));
            problems.extend(exported.unknown_in(metric.trim()));
        }
    }
    assert!(
        problems.is_empty(),
        "the chart's PromQL refers to what the operator does not export:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn crds_are_templates_that_helm_upgrades_and_keeps() {
    let crd_docs = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .cloned()
            .collect()
    };
    let docs = render(&[]);
    let crds = crd_docs(&docs);
    assert_eq!(crds.len(), 2, "both CRDs are rendered by default");
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().expect("name");
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}: helm uninstall keeps it"
        );
        assert_eq!(crd["metadata"]["labels"]["app.kubernetes.io/name"], RELEASE);
        // The same CRD as crds/, apart from the chart's labels and annotations.
        let file = std::fs::read_to_string(repo().join(format!("crds/{name}.yaml")))
            .expect("crds/ has it");
        let mut expected: Value = serde_yaml_ng::from_str(&file).expect("CRD YAML");
        let mut rendered = crd.clone();
        for doc in [&mut expected, &mut rendered] {
            let metadata = doc["metadata"].as_object_mut().expect("metadata");
            metadata.remove("labels");
            metadata.remove("annotations");
        }
        assert!(rendered == expected, "{name} differs from crds/{name}.yaml");
    }
    let unkept = crd_docs(&render(&["--set", "crds.keep=false"]));
    assert_eq!(unkept.len(), 2);
    assert!(
        unkept
            .iter()
            .all(|c| c["metadata"].get("annotations").is_none())
    );
    assert!(crd_docs(&render(&["--set", "crds.enabled=false"])).is_empty());
}

#[test]
#[ignore = "chart: needs helm (make chart)"]
fn kube_version_and_image_digests() {
    // Below the chart's kubeVersion, helm refuses (offline, helm's own fallback is v1.20).
    let err = template(&["--kube-version", "1.29.0"]).expect_err("1.29 is refused");
    assert!(
        err.contains("kubeVersion") && err.contains(">=1.30.0-0"),
        "{err}"
    );
    render(&["--kube-version", "1.30.0"]);

    let docs = render(&[]);
    assert_eq!(
        operator_container(&docs)["image"],
        format!("kandev/kandev-operator:{}", env!("CARGO_PKG_VERSION"))
    );
    assert!(operator_args(&docs).contains(&format!(
        "--agentctl-image=kandev/agentctl:{}",
        env!("CARGO_PKG_VERSION")
    )));
    let digest = format!("sha256:{}", "ab".repeat(32));
    let other = format!("sha256:{}", "cd".repeat(32));
    let docs = render(&[
        "--set",
        &format!("image.digest={digest}"),
        "--set",
        "image.tag=ignored",
        "--set",
        &format!("agentctlImage.digest={other}"),
    ]);
    assert_eq!(
        operator_container(&docs)["image"],
        format!("kandev/kandev-operator@{digest}")
    );
    assert!(
        operator_args(&docs).contains(&format!("--agentctl-image=kandev/agentctl@{other}")),
        "{:?}",
        operator_args(&docs)
    );
}
