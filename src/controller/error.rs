//! The errors of one reconcile, and how a failed API call becomes one.

use super::expectations::Expectations;
use crate::resume::{Refusal, refusal};

/// Errors of one reconcile; each becomes a log line, a metric label and a requeue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API call failed while {action}: {source}")]
    Kube {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("TaskSession has no namespace")]
    NoNamespace,
    /// The status was decided on an older version of the TaskSession than the API server's:
    /// nothing was written, the next reconcile decides again on the newer one.
    #[error("the TaskSession changed since this reconcile read it; deciding again")]
    Conflict,
    /// The same for a write of the session's ExecutorRunning status.
    #[error("the ExecutorRunning changed since this reconcile read it; deciding again")]
    ExecutorConflict,
    #[error("the ExecutorRunning, pod and PVC caches have not finished their first list")]
    CacheNotReady,
    /// `agentctl answer` could not be run in the session's pod; the answer stays unhandled and
    /// the next reconcile relays it again.
    #[error("relaying the permission answer to pod {pod} failed: {message}")]
    PermissionRelay { pod: String, message: String },
    /// The reconcile's task panicked or was cancelled; the next reconcile decides again.
    #[error("the reconcile task ended without an answer: {0}")]
    TaskFailed(String),
}

impl Error {
    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Kube { .. } => "kube",
            // Every reconcile runs inside the finalizer helper: label what failed inside it.
            Self::Finalizer(e) => match e.as_ref() {
                F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.metric_label(),
                _ => "finalizer",
            },
            Self::NoNamespace => "no_namespace",
            Self::Conflict | Self::ExecutorConflict => "conflict",
            Self::CacheNotReady => "cache_not_ready",
            Self::TaskFailed(_) => "task_failed",
            Self::PermissionRelay { .. } => "permission_relay",
        }
    }
}

pub(super) fn kube_err(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

/// For a write of the session's TaskSession with the precondition `version`: 409 is
/// [`Error::Conflict`], and `version` counts as stale until the cache shows a newer one (see
/// [`Expectations::outdated`]).
pub(super) fn conflict_or<'a>(
    action: &'static str,
    expectations: &'a Expectations,
    uid: &'a str,
    version: Option<&'a str>,
) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| match source {
        kube::Error::Api(status) if status.code == 409 => {
            expectations.outdated(uid, version);
            Error::Conflict
        }
        source => Error::Kube { action, source },
    }
}

/// For a write of the session's ExecutorRunning status with a precondition: 409 is
/// [`Error::ExecutorConflict`].
pub(super) fn executor_conflict_or(action: &'static str) -> impl Fn(kube::Error) -> Error {
    move |source| match source {
        kube::Error::Api(status) if status.code == 409 => Error::ExecutorConflict,
        source => Error::Kube { action, source },
    }
}

/// A failed create or apply of an object of the launch, sorted by [`refusal`]: `Ok` with what
/// the refusal means ([`Refusal::Exists`], [`Refusal::Final`]) and the API server's words, `Err`
/// for everything that a retry may change.
pub(super) fn sort_refusal(
    action: &'static str,
) -> impl FnOnce(kube::Error) -> Result<(Refusal, String), Error> {
    move |source| {
        let kind = match &source {
            kube::Error::Api(status) => refusal(status.code, &status.message),
            _ => Refusal::Retry,
        };
        match source {
            kube::Error::Api(status) if kind != Refusal::Retry => Ok((kind, status.message)),
            source => Err(Error::Kube { action, source }),
        }
    }
}
