//! Custom resources of group `kandev.dev`, version `v1alpha1` (DESIGN §2).
//!
//! The YAML under `crds/` is generated from these types (`kandev-operator crd`);
//! doc comments become `kubectl explain` text.

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
