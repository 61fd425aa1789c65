//! A kubeconfig that talks to the cluster of an admin kubeconfig as someone else (a
//! ServiceAccount token in a file). Shared by the e2e harness (played pods get their
//! ServiceAccount's identity) and the benchmark (the operator, the API floor and agent-sandbox
//! each get their own, so the API server's audit log tells their requests apart).

use std::path::Path;

use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedContext};

/// `admin` with its user replaced by a token file: same cluster, namespace `namespace`.
pub fn token_kubeconfig(admin: &Kubeconfig, token_file: &Path, namespace: &str) -> Kubeconfig {
    let cluster = admin
        .current_context
        .as_ref()
        .and_then(|name| admin.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .or_else(|| admin.clusters.first().map(|c| c.name.clone()))
        .unwrap_or_default();
    Kubeconfig {
        clusters: admin
            .clusters
            .iter()
            .filter(|c| c.name == cluster)
            .cloned()
            .collect(),
        auth_infos: vec![NamedAuthInfo {
            name: "service-account".into(),
            auth_info: Some(AuthInfo {
                token_file: Some(token_file.display().to_string()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "service-account".into(),
            context: Some(Context {
                cluster,
                user: Some("service-account".into()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("service-account".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_keeps_the_cluster_and_uses_the_token_file() {
        let admin: Kubeconfig = serde_yaml_ng::from_str(
            r#"
apiVersion: v1
kind: Config
clusters:
- name: other
  cluster: {server: "https://10.0.0.1"}
- name: kwok
  cluster: {server: "https://127.0.0.1:32766", certificate-authority: /pki/ca.crt}
users:
- name: admin
  user: {client-certificate: /pki/admin.crt, client-key: /pki/admin.key}
contexts:
- name: kwok
  context: {cluster: kwok, user: admin}
current-context: kwok
"#,
        )
        .expect("kubeconfig");
        let cfg = token_kubeconfig(&admin, Path::new("/pod/token"), "ops");
        assert_eq!(cfg.clusters.len(), 1);
        assert_eq!(cfg.clusters[0].name, "kwok");
        let user = cfg.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(user.token_file.as_deref(), Some("/pod/token"));
        assert!(user.client_certificate.is_none());
        let ctx = cfg.contexts[0].context.as_ref().expect("context");
        assert_eq!(ctx.namespace.as_deref(), Some("ops"));
        let text = serde_yaml_ng::to_string(&cfg).expect("yaml");
        assert!(text.contains("tokenFile: /pod/token"), "{text}");
        let back: Kubeconfig = serde_yaml_ng::from_str(&text).expect("reads back");
        let user = back.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(user.token_file.as_deref(), Some("/pod/token"));
    }
}
