//! What the e2e tier's tools and tests share: the pods' annotations (written by the harness,
//! read by the tests and the bench) and a kubeconfig for another identity (the harness and the
//! bench).

pub mod annotations;
pub mod kubeconfig;
