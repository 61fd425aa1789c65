//! kandev-operator: keeps AI coding-agent sessions alive across pod loss (see docs/design.md,
//! which the "DESIGN §N" of the code cite).
// No unsafe code (Cargo.toml [lints]) but `agentctl::seal`, a prctl flag of the process.

pub mod acp;
pub mod agentctl;
pub mod agents;
pub mod api;
pub mod controller;
pub mod history;
pub mod jsonrpc;
pub mod plugin;
pub mod resume;
pub mod telemetry;
