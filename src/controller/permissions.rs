//! The RBAC self-check at startup: every permission the operator uses, in one declarative list,
//! checked with SelfSubjectAccessReviews before the controller starts. A missing permission
//! fails the start with one message that names all of them, instead of a reconcile failing
//! hours later on the first resume that needs `pods/exec`.
//!
//! [`REQUIRED_PERMISSIONS`] is also the contract of the Helm chart: `tests/chart.rs` renders the
//! chart and requires its ClusterRole (or, with `watchNamespaces`, the Role of each watched
//! namespace) and the Lease Role to grant exactly this list, no more, no less.
//! Change the code's API calls, this list and `charts/kandev-operator/templates/rbac.yaml`
//! together.

use futures::future::join_all;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// Where a permission is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Where sessions live: in every namespace (a ClusterRole), or, when the operator watches
    /// only some namespaces (`--watch-namespace`), in each of them (a Role per namespace).
    Watched,
    /// Only in the namespace of the leader-election Lease (the release namespace): a Role.
    /// Not needed without leader election.
    LeaseNamespace,
    /// Cluster-scoped reviews, only when `/metrics` is served to authenticated scrapers
    /// (`--metrics-auth=kubernetes`): a ClusterRole in either install mode.
    MetricsAuth,
    /// Nodes (cluster-scoped), only when lost nodes are looked for (`--node-lost-seconds`
    /// above 0): a ClusterRole in either install mode.
    Nodes,
}

/// One resource (or subresource) and the verbs the operator uses on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// API group; `""` is the core group.
    pub group: &'static str,
    pub resource: &'static str,
    /// `""` when this is the resource itself.
    pub subresource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    /// Which code needs it.
    pub why: &'static str,
}

impl Permission {
    /// The RBAC resource name: `pods/exec`, `tasksessions/status`.
    pub fn rbac_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// Everything the operator does to the API (audit: every `Api::<…>` call in `src/controller/`,
/// kube-runtime's controller and finalizer, and the Events publisher). Keep it exact.
pub const REQUIRED_PERMISSIONS: &[Permission] = &[
    Permission {
        group: "kandev.dev",
        resource: "tasksessions",
        subresource: "",
        verbs: &["list", "watch", "patch"],
        scope: Scope::Watched,
        why: "the controller watches every TaskSession; the kandev.dev/cleanup finalizer is added and removed with a JSON patch",
    },
    Permission {
        group: "kandev.dev",
        resource: "tasksessions",
        subresource: "status",
        verbs: &["patch"],
        scope: Scope::Watched,
        why: "status is written with server-side apply",
    },
    Permission {
        group: "kandev.dev",
        resource: "executorrunnings",
        subresource: "",
        verbs: &["get", "list", "watch", "create"],
        scope: Scope::Watched,
        why: "the controller watches the ExecutorRunnings it owns, reads and creates a session's record",
    },
    Permission {
        group: "kandev.dev",
        resource: "executorrunnings",
        subresource: "status",
        verbs: &["patch"],
        scope: Scope::Watched,
        why: "resume token, pod and agent activity are merge-patched into ExecutorRunning status",
    },
    Permission {
        group: "",
        resource: "pods",
        subresource: "",
        verbs: &["get", "list", "watch", "create", "delete"],
        scope: Scope::Watched,
        why: "agentctl pods: watched, listed per session, created on launch, deleted after a failed restore; the event follower reads its pod",
    },
    Permission {
        group: "",
        resource: "pods",
        subresource: "exec",
        // kube-rs execs over WebSocket: the upgrade is a GET (verb `get`), and since Kubernetes
        // 1.35 the API server also requires `create` on it (AuthorizePodWebsocketUpgradeCreatePermission).
        verbs: &["get", "create"],
        scope: Scope::Watched,
        why: "ACP (agentctl connect) and agentctl events over exec into agentctl pods",
    },
    Permission {
        group: "",
        resource: "persistentvolumeclaims",
        subresource: "",
        verbs: &["get", "list", "watch", "create"],
        scope: Scope::Watched,
        why: "the workspace PVC is checked before a launch (from a metadata cache) and created from the session's template",
    },
    Permission {
        group: "networking.k8s.io",
        resource: "networkpolicies",
        subresource: "",
        verbs: &["create", "patch"],
        scope: Scope::Watched,
        why: "the NetworkPolicy of a session is applied (server-side apply: created, or a stale or foreign one of its name set right) with its agentctl pod (owned by the session, garbage-collected with it)",
    },
    Permission {
        group: "events.k8s.io",
        resource: "events",
        subresource: "",
        verbs: &["create", "patch"],
        scope: Scope::Watched,
        why: "Events on TaskSessions (a repeat within 6 minutes is patched into the first one's series)",
    },
    Permission {
        group: "coordination.k8s.io",
        resource: "leases",
        subresource: "",
        verbs: &["get", "create", "update"],
        scope: Scope::LeaseNamespace,
        why: "leader election on the Lease (read, created once, renewed with a compare-and-swap update)",
    },
    Permission {
        group: "",
        resource: "nodes",
        subresource: "",
        verbs: &["list", "watch"],
        scope: Scope::Nodes,
        why: "--node-lost-seconds: a cache of the nodes (without their image lists) tells a Running agent pod on a node that is gone or not Ready",
    },
    Permission {
        group: "authentication.k8s.io",
        resource: "tokenreviews",
        subresource: "",
        verbs: &["create"],
        scope: Scope::MetricsAuth,
        why: "--metrics-auth=kubernetes: the bearer token of a /metrics request is authenticated with a TokenReview",
    },
    Permission {
        group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        subresource: "",
        verbs: &["create"],
        scope: Scope::MetricsAuth,
        why: "--metrics-auth=kubernetes: whether the token's user may get the non-resource URL /metrics, with a SubjectAccessReview",
    },
];

/// One verb on one resource in one place: one SelfSubjectAccessReview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessCheck {
    pub verb: &'static str,
    pub permission: Permission,
    /// `None`: all namespaces.
    pub namespace: Option<String>,
}

impl AccessCheck {
    /// The review that asks the API server whether we may do this.
    pub fn review(&self) -> SelfSubjectAccessReview {
        let p = &self.permission;
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(p.group.to_string()),
                    resource: Some(p.resource.to_string()),
                    subresource: non_empty(p.subresource),
                    verb: Some(self.verb.to_string()),
                    namespace: self.namespace.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// kubectl-style: `create pods/exec (all namespaces)`,
    /// `update leases.coordination.k8s.io (namespace kandev-system)`.
    pub fn describe(&self) -> String {
        format!("{} {}", self.verb, self.target())
    }

    /// What the check is about, without the verb: `pods/exec (all namespaces)`.
    fn target(&self) -> String {
        let p = &self.permission;
        let resource = if p.group.is_empty() {
            p.resource.to_string()
        } else {
            format!("{}.{}", p.resource, p.group)
        };
        let resource = if p.subresource.is_empty() {
            resource
        } else {
            format!("{resource}/{}", p.subresource)
        };
        let place = match (&self.namespace, p.scope) {
            (_, Scope::MetricsAuth | Scope::Nodes) => "cluster-scoped".to_string(),
            (None, _) => "all namespaces".to_string(),
            (Some(ns), _) => format!("namespace {ns}"),
        };
        format!("{resource} ({place})")
    }
}

/// The checks to run: every verb of [`REQUIRED_PERMISSIONS`], in all namespaces or (when
/// `watch_namespaces` is not empty) in each watched namespace; the Lease ones only with leader
/// election (`lease_namespace`), the metrics reviews only with `metrics_auth`, nodes only with
/// `nodes`.
pub fn access_checks(
    lease_namespace: Option<&str>,
    watch_namespaces: &[String],
    metrics_auth: bool,
    nodes: bool,
) -> Vec<AccessCheck> {
    let all = [None];
    let watched: Vec<Option<String>> = watch_namespaces.iter().cloned().map(Some).collect();
    let lease = [lease_namespace.map(str::to_string)];
    let mut checks = Vec::new();
    for permission in REQUIRED_PERMISSIONS {
        let namespaces: &[Option<String>] = match permission.scope {
            Scope::Watched if watched.is_empty() => &all,
            Scope::Watched => &watched,
            Scope::LeaseNamespace if lease_namespace.is_none() => continue,
            Scope::LeaseNamespace => &lease,
            Scope::MetricsAuth if !metrics_auth => continue,
            Scope::MetricsAuth => &all,
            Scope::Nodes if !nodes => continue,
            Scope::Nodes => &all,
        };
        for namespace in namespaces {
            for verb in permission.verbs {
                checks.push(AccessCheck {
                    verb,
                    permission: *permission,
                    namespace: namespace.clone(),
                });
            }
        }
    }
    checks
}

/// The one error of a failed check; the verbs of one resource are listed together
/// (`get, create pods/exec (all namespaces)`).
pub fn missing_permissions_message(missing: &[AccessCheck], user: Option<&str>) -> String {
    let mut grouped: Vec<(String, Vec<&str>)> = Vec::new();
    for check in missing {
        let target = check.target();
        match grouped.iter_mut().find(|(t, _)| *t == target) {
            Some((_, verbs)) => verbs.push(check.verb),
            None => grouped.push((target, vec![check.verb])),
        }
    }
    let list: Vec<String> = grouped
        .iter()
        .map(|(target, verbs)| format!("{} {target}", verbs.join(", ")))
        .collect();
    let who = user.map(|u| format!(" for {u}")).unwrap_or_default();
    let noun = if missing.len() == 1 {
        "permission"
    } else {
        "permissions"
    };
    format!(
        "missing RBAC {noun}{who}: {}. The Helm chart charts/kandev-operator grants exactly what the operator needs (rbac.create=true); for another setup grant these, or pass --skip-permission-check",
        list.join("; ")
    )
}

/// Asks the API server about every check; `Err` names every missing permission (and `user`, the
/// identity the operator runs as, when known), or says why the reviews could not be made.
pub async fn verify(
    client: &Client,
    lease_namespace: Option<&str>,
    watch_namespaces: &[String],
    (metrics_auth, nodes): (bool, bool),
    user: Option<&str>,
) -> Result<(), PermissionError> {
    let checks = access_checks(lease_namespace, watch_namespaces, metrics_auth, nodes);
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answers = join_all(checks.iter().map(|check| {
        let api = api.clone();
        async move { api.create(&PostParams::default(), &check.review()).await }
    }))
    .await;
    let mut missing = Vec::new();
    for (check, answer) in checks.iter().zip(answers) {
        let review = answer.map_err(|source| PermissionError::Review {
            check: check.describe(),
            source,
        })?;
        let allowed = review.status.as_ref().is_some_and(|s| s.allowed);
        if !allowed {
            if let Some(error) = review.status.and_then(|s| s.evaluation_error) {
                tracing::warn!(check = %check.describe(), %error, "RBAC self-check: evaluation error");
            }
            missing.push(check.clone());
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(PermissionError::Missing(missing_permissions_message(
        &missing, user,
    )))
}

/// Why the RBAC self-check did not pass.
#[derive(Debug, thiserror::Error)]
pub enum PermissionError {
    #[error("RBAC self-check: the SelfSubjectAccessReview for {check} failed: {source}")]
    Review {
        check: String,
        #[source]
        source: kube::Error,
    },
    /// Every missing permission, and what to do (see [`missing_permissions_message`]).
    #[error("{0}")]
    Missing(String),
}

/// The authenticated user name (best effort: for logs and error messages).
pub async fn whoami(client: &Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    api.create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?
        .status?
        .user_info?
        .username
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verb_becomes_one_review() {
        let checks = access_checks(Some("kandev-system"), &[], true, true);
        let verbs: usize = REQUIRED_PERMISSIONS.iter().map(|p| p.verbs.len()).sum();
        assert_eq!(checks.len(), verbs);

        let exec = checks
            .iter()
            .find(|c| c.permission.subresource == "exec" && c.verb == "create")
            .expect("create pods/exec");
        let review = serde_json::to_value(exec.review()).expect("json");
        assert_eq!(
            review,
            serde_json::json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "metadata": {},
                "spec": {"resourceAttributes": {
                    "group": "", "resource": "pods", "subresource": "exec", "verb": "create",
                }},
            })
        );

        let lease = checks
            .iter()
            .find(|c| c.permission.resource == "leases" && c.verb == "update")
            .expect("update leases");
        let review = serde_json::to_value(lease.review()).expect("json");
        assert_eq!(
            review["spec"]["resourceAttributes"],
            serde_json::json!({
                "group": "coordination.k8s.io", "resource": "leases", "verb": "update",
                "namespace": "kandev-system",
            })
        );
    }

    #[test]
    fn no_leader_election_needs_no_lease_permissions() {
        let checks = access_checks(None, &[], false, false);
        assert!(checks.iter().all(|c| c.permission.resource != "leases"));
        assert!(checks.iter().all(|c| c.namespace.is_none()));
    }

    #[test]
    fn watched_namespaces_are_checked_one_by_one() {
        let watched = ["team-a".to_string(), "team-b".to_string()];
        let checks = access_checks(Some("kandev-system"), &watched, false, false);
        let per_namespace: usize = REQUIRED_PERMISSIONS
            .iter()
            .filter(|p| p.scope == Scope::Watched)
            .map(|p| p.verbs.len())
            .sum();
        for ns in &watched {
            let here: Vec<_> = checks
                .iter()
                .filter(|c| c.namespace.as_deref() == Some(ns.as_str()))
                .collect();
            assert_eq!(here.len(), per_namespace, "{ns}");
            assert!(here.iter().all(|c| c.permission.scope == Scope::Watched));
        }
        assert!(
            checks.iter().all(|c| c.namespace.is_some()),
            "nothing cluster-wide in namespaced mode"
        );
        let exec = checks
            .iter()
            .find(|c| {
                c.permission.subresource == "exec" && c.namespace.as_deref() == Some("team-b")
            })
            .expect("pods/exec in team-b");
        assert_eq!(exec.describe(), "get pods/exec (namespace team-b)");
        assert!(
            checks
                .iter()
                .filter(|c| c.permission.resource == "leases")
                .all(|c| c.namespace.as_deref() == Some("kandev-system"))
        );
    }

    /// The checks in `with` that `without` does not make, described.
    fn added(without: &[AccessCheck], with: &[AccessCheck]) -> Vec<String> {
        with.iter()
            .filter(|c| !without.contains(c))
            .map(AccessCheck::describe)
            .collect()
    }

    #[test]
    fn metrics_auth_adds_the_two_reviews_cluster_wide_in_either_mode() {
        let watched = ["team-a".to_string()];
        for namespaces in [&[][..], &watched[..]] {
            let without = access_checks(Some("kandev-system"), namespaces, false, false);
            let with = access_checks(Some("kandev-system"), namespaces, true, false);
            assert!(
                without
                    .iter()
                    .all(|c| c.permission.scope != Scope::MetricsAuth)
            );
            assert_eq!(
                added(&without, &with),
                [
                    "create tokenreviews.authentication.k8s.io (cluster-scoped)",
                    "create subjectaccessreviews.authorization.k8s.io (cluster-scoped)",
                ]
            );
        }
    }

    #[test]
    fn lost_nodes_add_list_and_watch_on_nodes_cluster_wide_in_either_mode() {
        let watched = ["team-a".to_string()];
        for namespaces in [&[][..], &watched[..]] {
            let without = access_checks(None, namespaces, false, false);
            let with = access_checks(None, namespaces, false, true);
            assert_eq!(
                added(&without, &with),
                [
                    "list nodes (cluster-scoped)",
                    "watch nodes (cluster-scoped)"
                ]
            );
        }
    }

    #[test]
    fn the_list_is_exact() {
        let mut seen = std::collections::HashSet::new();
        for p in REQUIRED_PERMISSIONS {
            assert!(
                seen.insert((p.group, p.rbac_resource())),
                "{} listed twice",
                p.rbac_resource()
            );
            let mut verbs = p.verbs.to_vec();
            verbs.sort_unstable();
            verbs.dedup();
            assert_eq!(verbs.len(), p.verbs.len(), "duplicate verb on {p:?}");
            for verb in p.verbs {
                assert!(
                    [
                        "get", "list", "watch", "create", "update", "patch", "delete"
                    ]
                    .contains(verb),
                    "{verb}"
                );
            }
            // Least privilege: nothing broad, and only leases are namespace-bound; the reviews
            // of the metrics scrapers are only ever created.
            assert!(!p.verbs.contains(&"deletecollection"));
            if p.scope == Scope::MetricsAuth {
                assert_eq!(p.verbs, ["create"], "{p:?}");
            }
            if p.scope == Scope::Nodes {
                assert_eq!(p.verbs, ["list", "watch"], "{p:?}");
            }
            assert_eq!(
                p.scope == Scope::LeaseNamespace,
                p.resource == "leases",
                "{p:?}"
            );
        }
    }

    #[test]
    fn missing_permissions_are_listed_in_one_message() {
        let checks = access_checks(Some("kandev-system"), &[], false, false);
        let pick = |verb: &str, resource: &str| {
            checks
                .iter()
                .find(|c| c.verb == verb && c.permission.rbac_resource() == resource)
                .cloned()
                .expect("check")
        };
        let missing = [
            pick("delete", "pods"),
            pick("get", "pods/exec"),
            pick("create", "pods/exec"),
            pick("patch", "tasksessions/status"),
            pick("create", "events"),
            pick("update", "leases"),
        ];
        assert_eq!(missing[1].describe(), "get pods/exec (all namespaces)");
        assert_eq!(
            missing_permissions_message(
                &missing,
                Some("system:serviceaccount:kandev-system:kandev-operator")
            ),
            "missing RBAC permissions for system:serviceaccount:kandev-system:kandev-operator: \
             delete pods (all namespaces); get, create pods/exec (all namespaces); \
             patch tasksessions.kandev.dev/status (all namespaces); \
             create events.events.k8s.io (all namespaces); \
             update leases.coordination.k8s.io (namespace kandev-system). \
             The Helm chart charts/kandev-operator grants exactly what the operator needs \
             (rbac.create=true); for another setup grant these, or pass --skip-permission-check"
        );
        assert!(
            missing_permissions_message(&missing[..1], None)
                .starts_with("missing RBAC permission: delete pods (all namespaces). ")
        );
    }
}
