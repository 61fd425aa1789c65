//! Custom resources of group `kandev.dev`, version `v1alpha1` (DESIGN §2).
//!
//! The YAML under `crds/` is generated from these types (`kandev-operator crd`);
//! doc comments become `kubectl explain` text.

// kube's KubeSchema derive expands several `validation = …` keys of one `#[x_kube]` into
// repeated schemars attributes, which clippy reads as duplicates.
#![allow(clippy::duplicated_attributes)]

pub mod conditions;
mod executor_running;
mod states;
mod task_session;

pub use executor_running::*;
pub use states::*;
pub use task_session::*;

/// API group of every kandev resource.
pub const GROUP: &str = "kandev.dev";
/// Annotation a user or a frontend sets to request a resume; its value is an opaque token.
pub const RESUME_ANNOTATION: &str = "kandev.dev/resume-requested-at";
/// Annotation asking one resume to ignore the saved token and start fresh: its value is the
/// [`RESUME_ANNOTATION`] token of that request (any other value has no effect).
pub const RESUME_FRESH_ANNOTATION: &str = "kandev.dev/resume-fresh";
/// Annotation a client sets (any new value, e.g. a timestamp) after it sent a prompt to the agent
/// itself: the operator then reads the agent's event journal at once instead of at its next
/// periodic catch-up. `kubectl kandev prompt` sets it.
pub const PROMPTED_ANNOTATION: &str = "kandev.dev/prompted-at";
/// Label on every pod the operator manages.
pub const MANAGED_LABEL: &str = "kandev.dev/managed";
/// Label naming the TaskSession a managed pod belongs to.
pub const SESSION_LABEL: &str = "kandev.dev/session";

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
pub fn crd_files() -> Result<Vec<CrdFile>, serde_yaml::Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            Ok(CrdFile {
                file_name: format!("{name}.yaml"),
                yaml: serde_yaml::to_string(&crd)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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
