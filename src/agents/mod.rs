//! Agent capability registry (DESIGN §3): per-agent launch command, restore capabilities and
//! CLI resume flags, kept as data (`profiles.yaml`) and extensible by configuration.

mod profile;
mod registry;

use std::path::PathBuf;

pub use profile::AgentProfile;
pub use registry::AgentRegistry;

/// Why agent profiles could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AgentRegistryError {
    #[error("cannot read agent profiles file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse agent profiles from {origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("agent profile {profile:?} is invalid: {problem}")]
    InvalidProfile { profile: String, problem: String },
}
