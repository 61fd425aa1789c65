//! kandev-operator: keeps AI coding-agent sessions alive across pod loss (see DESIGN.md).
// One exception, `agentctl::seal` (a prctl flag of the process); everything else is safe code.
#![deny(unsafe_code)]

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
