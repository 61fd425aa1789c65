//! Annotations of the e2e tier's pods, one definition for the harness that writes them and the
//! tests and benchmark that read them (e2e/cluster.sh's kwok stage has its own copy: shell).

/// The pid of the local process that plays the pod, put on it by the harness once that process
/// runs and its `Exec` exists. Our kwok stage marks a managed pod Running only with it.
pub const HARNESS_PID_ANNOTATION: &str = "e2e.kandev.dev/harness-pid";
