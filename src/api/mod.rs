//! Custom resources of group `kandev.dev`, version `v1alpha1` (DESIGN §2).
//!
//! The YAML under `crds/` is generated from these types (`kandev-operator crd`);
//! doc comments become `kubectl explain` text.

// kube's KubeSchema derive expands several `validation = …` keys of one `#[x_kube]` into
// repeated schemars attributes, which clippy reads as duplicates.
#![allow(clippy::duplicated_attributes)]

pub mod bounds;
pub mod conditions;
mod executor_running;
pub mod launch_spec;
pub mod names;
mod permissions;
pub mod pod_contract;
mod states;
mod task_session;

pub use executor_running::*;
pub use names::{MANAGED_LABEL, SESSION_LABEL};
pub use permissions::*;
pub use states::*;
pub use task_session::*;

/// API group of every kandev resource.
pub const GROUP: &str = "kandev.dev";
/// Annotation a user or a frontend sets to request a resume; its value is an opaque token.
pub const RESUME_ANNOTATION: &str = "kandev.dev/resume-requested-at";
/// Annotation asking one resume to ignore the saved token and start fresh: its value is the
/// [`RESUME_ANNOTATION`] token of that request (any other value has no effect).
pub const RESUME_FRESH_ANNOTATION: &str = "kandev.dev/resume-fresh";
/// Annotation asking one resume to restart an agent that runs: its value is the
/// [`RESUME_ANNOTATION`] token of that request. The running pod is replaced by a new one, created
/// from the spec as it is now, which restores the same agent session (`kubectl kandev restart`).
/// On a session whose agent does not run, the request is a plain resume.
pub const RESTART_ANNOTATION: &str = "kandev.dev/restart";
/// Annotation a client sets (any new value, e.g. a timestamp) after it sent a prompt to the agent
/// itself: the operator then reads the agent's event journal at once instead of at its next
/// periodic catch-up. `kubectl kandev prompt` sets it.
pub const PROMPTED_ANNOTATION: &str = "kandev.dev/prompted-at";

/// Annotation `kubectl kandev history` sets (a new token each time) to read the transcript of a
/// session whose agent pod does not run: while its token is not handled and no agent pod runs,
/// the operator keeps a history reader pod, which mounts the workspace read-only and starts no
/// agent. Removing the annotation (the plugin does once it has read) removes the pod.
pub const HISTORY_ANNOTATION: &str = "kandev.dev/history-requested-at";

/// The reason of an idle session's suspension: agentctl, idle for `spec.idle.suspendAfter`,
/// stops its agent and exits 0 with the termination message `Suspended: …`; the operator's
/// `Suspended` condition and Normal Event carry the same word.
pub const SUSPENDED: &str = "Suspended";

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD of the project, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![TaskSession::crd(), ExecutorRunning::crd()]
}

/// One generated CRD as checked in under `crds/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdFile {
    /// File name under `crds/`, e.g. `tasksessions.kandev.dev.yaml`.
    pub file_name: String,
    /// The YAML document (without a leading `---`).
    pub yaml: String,
}

/// Renders every CRD as YAML, named `<plural>.<group>.yaml`.
pub fn crd_files() -> Result<Vec<CrdFile>, serde_yaml_ng::Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            Ok(CrdFile {
                file_name: format!("{name}.yaml"),
                yaml: serde_yaml_ng::to_string(&crd)?,
            })
        })
        .collect()
}

/// Where the chart keeps its CRD templates, relative to the repository.
pub const CHART_CRD_DIR: &str = "charts/kandev-operator/templates/crds";

/// A CRD that cannot be made into a chart template.
#[derive(Debug, thiserror::Error)]
pub enum CrdTemplateError {
    #[error("rendering the CRDs as YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("CRD {file}: {problem}")]
    Shape { file: String, problem: &'static str },
}

/// Every CRD as a template of the Helm chart (under [`CHART_CRD_DIR`]): the YAML of
/// [`crd_files`] with the chart's labels, the `helm.sh/resource-policy: keep` annotation (values
/// `crds.keep`), rendered only with `crds.enabled`. As templates, CRDs are upgraded by
/// `helm upgrade` (Helm never upgrades files under a chart's `crds/`), and kept by
/// `helm uninstall`.
pub fn chart_crd_templates() -> Result<Vec<CrdFile>, CrdTemplateError> {
    crd_files()?
        .into_iter()
        .map(|file| {
            let shape = |problem| CrdTemplateError::Shape {
                file: file.file_name.clone(),
                problem,
            };
            if file.yaml.contains("{{") || file.yaml.contains("}}") {
                return Err(shape("contains {{ or }}, which Helm would read as a template"));
            }
            // serde_yaml_ng writes `metadata:` with only `name:` below it, then `spec:`.
            let (head, rest) = file
                .yaml
                .split_once("\nmetadata:\n  name: ")
                .ok_or(shape("no metadata.name after the kind"))?;
            let (name, spec) = rest
                .split_once("\nspec:\n")
                .ok_or(shape("metadata has more than a name"))?;
            let yaml = format!(
                "{{{{- if .Values.crds.enabled }}}}\n\
                 # Generated by `make crds` from src/api/ (kandev-operator crd --chart-dir); do not edit.\n\
                 {head}\n\
                 metadata:\n  name: {name}\n  labels:\n    \
                 {{{{- include \"kandev-operator.labels\" . | nindent 4 }}}}\n  \
                 {{{{- if .Values.crds.keep }}}}\n  annotations:\n    \
                 # helm uninstall leaves the CRD, and with it every TaskSession.\n    \
                 helm.sh/resource-policy: keep\n  {{{{- end }}}}\n\
                 spec:\n{spec}{{{{- end }}}}\n"
            );
            Ok(CrdFile {
                file_name: file.file_name,
                yaml,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn chart_templates_are_the_crds_with_labels_and_keep() {
        let plain = crd_files().expect("crds");
        let templates = chart_crd_templates().expect("templates");
        assert_eq!(plain.len(), templates.len());
        for (plain, template) in plain.iter().zip(&templates) {
            assert_eq!(plain.file_name, template.file_name);
            assert!(
                template
                    .yaml
                    .starts_with("{{- if .Values.crds.enabled }}\n")
            );
            assert!(template.yaml.ends_with("{{- end }}\n"));
            assert!(
                template
                    .yaml
                    .contains("    helm.sh/resource-policy: keep\n")
            );
            // Without the template lines, the same object as crds/.
            let stripped: String = template
                .yaml
                .lines()
                .filter(|l| {
                    !l.contains("{{")
                        && !l.trim_start().starts_with('#')
                        && ![
                            "  labels:",
                            "  annotations:",
                            "    helm.sh/resource-policy: keep",
                        ]
                        .contains(l)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            assert_eq!(stripped, plain.yaml, "{}", plain.file_name);
        }
    }

    fn schema_of(crd: &CustomResourceDefinition) -> Value {
        let version = &crd.spec.versions[0];
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref());
        serde_json::to_value(schema).expect("schema serializes")
    }

    /// Every property below `spec` and `status` has a description (it is `kubectl explain` text).
    fn assert_described(path: &str, node: &Value, missing: &mut Vec<String>) {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let here = format!("{path}.{name}");
                if prop
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    missing.push(here.clone());
                }
                assert_described(&here, prop, missing);
            }
        }
        if let Some(items) = node.get("items") {
            assert_described(&format!("{path}[]"), items, missing);
        }
    }

    #[test]
    fn crds_have_names_columns_rules_and_descriptions() {
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let names = &crd.spec.names;
            assert_eq!(
                names.categories.as_deref(),
                Some(&["kandev".to_string()][..]),
                "{name}"
            );
            assert_eq!(
                names.short_names.as_ref().map(Vec::len),
                Some(1),
                "{name} has a short name"
            );
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, "v1alpha1");
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{name} status subresource"
            );
            let columns: Vec<&str> = version
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            assert!(
                columns.len() >= 4 && columns.contains(&"Age"),
                "{name} columns: {columns:?}"
            );

            let schema = schema_of(&crd);
            let text = schema.to_string();
            assert!(
                text.contains("x-kubernetes-validations"),
                "{name} has CEL rules"
            );
            assert!(
                text.contains("self == oldSelf"),
                "{name} has an immutability rule"
            );
            let mut missing = Vec::new();
            for part in ["spec", "status"] {
                assert_described(part, &schema["properties"][part], &mut missing);
            }
            assert!(
                missing.is_empty(),
                "{name}: fields without description: {missing:?}"
            );
        }
    }

    #[test]
    fn task_session_columns_are_the_design_ones() {
        let crd = TaskSession::crd();
        let columns: Vec<(String, String)> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .filter(|c| c.priority.unwrap_or(0) == 0)
            .map(|c| (c.name.clone(), c.json_path.clone()))
            .collect();
        let expected = [
            ("State", ".status.state"),
            ("Task", ".status.taskState"),
            ("NeedsResume", ".status.needsResume"),
            ("Agent", ".spec.agent"),
            ("Age", ".metadata.creationTimestamp"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(columns, expected);
    }
}
