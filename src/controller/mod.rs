//! The reconciler (DESIGN §3): lost-pod detection, lazy resume on annotation, ACP restore over
//! exec, tokens back into status. It gathers facts, calls the pure rules in `crate::resume`, and
//! applies the result. Beside it: the HTTP endpoints, metrics and the RBAC self-check (§4).

mod context;
mod error;
pub mod events;
mod expectations;
mod pod_index;
pub mod pods;
mod reconcile;
mod run;

pub use context::{Clients, Context, OperatorSettings};
pub use error::Error;
pub use run::run;
pub mod endpoints;
pub mod follower;
pub mod gate;
pub mod leader;
pub mod metrics;
pub mod metrics_access;
pub mod metrics_tls;
pub mod permissions;
