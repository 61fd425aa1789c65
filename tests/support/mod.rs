//! Helpers shared by test targets of every tier: running processes ([`process`]), the Helm
//! chart ([`chart`]) and the recorded statuses GitOps tools read ([`gitops`]). A target takes
//! them with `mod support;`; the support modules of the e2e and agentctl tiers include them as
//! their `support` module (`#[path]`).
#![allow(dead_code)] // each test target uses a different subset
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

pub mod chart;
pub mod gitops;
pub mod process;
