//! What this operator wrote and has not yet seen come back through its watches, per
//! TaskSession UID, plus each session's retry backoff.
//!
//! Reconciles read from reflector caches, and a cache lags behind the operator's own writes: a
//! reconcile that runs right after a status write (a requeue, or an event of a child object)
//! can still see the object as it was before that write, and would decide a second time on
//! what it already did. The rules here keep such a reconcile from acting:
//! * after a TaskSession write that changed the object (its status, its finalizer), the cached
//!   object is stale while it still carries the resourceVersion the write was based on;
//! * after a pod create, the pod is awaited in the cache instead of being created again;
//! * after a pod delete, the pod counts as terminating until the cache shows it so (a stalled
//!   launch's pending pod must not make the next reconcile think the agent is starting);
//! * after an ExecutorRunning write (its creation, a status apply), the reconciles read the
//!   written object while the cache still shows the one the write was based on (or none);
//! * the status write itself carries the resourceVersion it was decided on, so whatever slips
//!   past these rules fails with a conflict instead of overwriting newer status.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::ExecutorRunning;

/// How many versions of an object the writes since its cache last caught up are remembered by.
const VERSIONS_KEPT: usize = 8;
/// How long a created pod is awaited in the cache before the operator tries again.
const POD_WAIT: Duration = Duration::from_secs(30);
/// First and largest retry delay after a failed reconcile.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
struct Expected {
    /// The resourceVersions of the TaskSession our status writes since the cache last caught
    /// up were based on (a reconcile can write more than once).
    stale_versions: Vec<String>,
    /// A pod this operator created and the cache does not show yet.
    created_pod: Option<(String, Instant)>,
    /// Pods (by UID) this operator deleted and the cache still shows without a deletion
    /// timestamp, and when.
    deleted_pods: Vec<(String, Instant)>,
    /// Failed reconciles in a row.
    failures: u32,
    /// The ExecutorRunning as this operator last wrote it, while the cache lags.
    executor: Option<OwnWrite>,
}

/// An object as this operator wrote it, and the versions its writes since the cache last caught
/// up were based on (`None`: it created the object).
#[derive(Debug)]
struct OwnWrite {
    bases: Vec<Option<String>>,
    object: Arc<ExecutorRunning>,
}

impl Expected {
    fn is_empty(&self) -> bool {
        self.stale_versions.is_empty()
            && self.created_pod.is_none()
            && self.deleted_pods.is_empty()
            && self.failures == 0
            && self.executor.is_none()
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Expectations {
    by_session: Mutex<HashMap<String, Expected>>,
    /// Sessions whose NetworkPolicy was applied in this run of the operator, so that a
    /// resume does not write it again; an operator restart applies it once more.
    with_policy: Mutex<HashSet<String>>,
    /// Pods (by UID) that carry a session's labels without being its, already reported.
    decoys: Mutex<HashSet<String>>,
}

impl Expectations {
    /// Runs `f` on the session's entry; a session with nothing to remember has none (most
    /// sessions, most of the time: no allocation per reconcile).
    fn with<T>(&self, session: &str, f: impl FnOnce(&mut Expected) -> T) -> T {
        let mut map = self
            .by_session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match map.get_mut(session) {
            Some(entry) => {
                let out = f(entry);
                if entry.is_empty() {
                    map.remove(session);
                }
                out
            }
            None => {
                let mut entry = Expected::default();
                let out = f(&mut entry);
                if !entry.is_empty() {
                    map.insert(session.to_string(), entry);
                }
                out
            }
        }
    }

    /// A write of the TaskSession (its status, its finalizer) turned `base` into `written`. A write that changed nothing keeps the
    /// version, and then there is nothing to wait for.
    pub fn wrote(&self, session: &str, base: Option<&str>, written: Option<&str>) {
        if let Some(base) = base.filter(|base| Some(*base) != written) {
            self.with(session, |e| {
                remember(&mut e.stale_versions, base.to_string())
            });
        }
    }

    /// A write based on `version` of the TaskSession was refused with a conflict: a newer
    /// version exists, and the cache will show it. Until then, deciding again on `version` would
    /// only be refused again (at N = 200, a storm of resume tokens cost 25 refused status writes
    /// per session while the cache lagged), so the cached object counts as stale.
    pub fn outdated(&self, session: &str, version: Option<&str>) {
        self.wrote(session, version, None);
    }

    /// Whether the cached TaskSession (at `version`) predates one of our writes. Any
    /// other version ends the wait, whoever wrote it.
    pub fn is_stale(&self, session: &str, version: Option<&str>) -> bool {
        self.with(session, |e| {
            let stale = version.is_some_and(|v| e.stale_versions.iter().any(|s| s == v));
            if !stale {
                e.stale_versions.clear();
            }
            stale
        })
    }

    /// This operator wrote the session's ExecutorRunning (created it, when `base` is `None`):
    /// `written` is what the API server answered, kept without its managedFields like the
    /// cache's objects.
    pub fn wrote_executor(&self, session: &str, base: Option<&str>, written: &ExecutorRunning) {
        let mut object = written.clone();
        object.managed_fields_mut().clear();
        self.with(session, |e| {
            let mut bases = e.executor.take().map(|w| w.bases).unwrap_or_default();
            remember(&mut bases, base.map(str::to_string));
            e.executor = Some(OwnWrite {
                bases,
                object: Arc::new(object),
            });
        });
    }

    /// The session's ExecutorRunning to decide on: what this operator wrote last while the
    /// cache (`cached`) still shows a version that write was based on, or no object after its
    /// creation; else the cached one, and the written one is forgotten.
    pub fn executor(
        &self,
        session: &str,
        cached: Option<Arc<ExecutorRunning>>,
    ) -> Option<Arc<ExecutorRunning>> {
        self.with(session, |e| {
            let version = cached
                .as_ref()
                .map(|er| er.metadata.resource_version.clone());
            let lags = |w: &OwnWrite| match &version {
                Some(version) => version.is_some() && w.bases.contains(version),
                None => w.bases.contains(&None),
            };
            match e.executor.take() {
                Some(own) if lags(&own) => {
                    let object = own.object.clone();
                    e.executor = Some(own);
                    Some(object)
                }
                _ => cached,
            }
        })
    }

    /// This operator created `pod` for the session.
    pub fn created_pod(&self, session: &str, pod: &str) {
        self.with(session, |e| {
            e.created_pod = Some((pod.to_string(), Instant::now()))
        });
    }

    /// Whether a pod this operator created for the session a moment ago (for this launch, or
    /// for a request that a newer one superseded since) is not in the cache yet, by
    /// `cached(name)`: it is on its way, and must be neither created again nor missed as a
    /// previous pod that still runs. Forgotten once the cache shows it, or after [`POD_WAIT`].
    pub fn awaits_created(&self, session: &str, cached: impl Fn(&str) -> bool) -> bool {
        self.with(session, |e| match &e.created_pod {
            Some((name, at)) if !cached(name) && at.elapsed() < POD_WAIT => true,
            _ => {
                e.created_pod = None;
                false
            }
        })
    }

    /// This operator deleted (or found gone) the session's pod `name`: if it was the pod awaited
    /// in the cache, it is awaited no more (it may have come and gone between two looks).
    pub fn pod_gone(&self, session: &str, name: &str) {
        self.with(session, |e| {
            if e.created_pod
                .as_ref()
                .is_some_and(|(created, _)| created == name)
            {
                e.created_pod = None;
            }
        });
    }

    /// This operator deleted the session's pod `uid` (the API server accepted the delete).
    pub fn deleted_pod(&self, session: &str, uid: &str) {
        self.with(session, |e| {
            if !e.deleted_pods.iter().any(|(u, _)| u == uid) {
                e.deleted_pods.push((uid.to_string(), Instant::now()));
            }
        });
    }

    /// Gives each of `pods` (the session's, from the cache) that this operator deleted a
    /// moment ago the deletion timestamp `now`, as the cache will show it. A deletion is
    /// forgotten once the cache shows it (terminating or gone) or after [`POD_WAIT`].
    pub fn mark_deleted(&self, session: &str, pods: &mut [Pod], now: Timestamp) {
        self.with(session, |e| {
            e.deleted_pods.retain(|(uid, at)| {
                let cached = pods
                    .iter_mut()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                    .filter(|p| p.metadata.deletion_timestamp.is_none());
                match cached {
                    Some(pod) if at.elapsed() < POD_WAIT => {
                        pod.metadata.deletion_timestamp = Some(Time(now));
                        true
                    }
                    _ => false,
                }
            });
        });
    }

    /// A reconcile succeeded: the next failure starts the backoff over.
    pub fn succeeded(&self, session: &str) {
        self.with(session, |e| e.failures = 0);
    }

    /// A reconcile failed: the delay before the next try, doubling per failure in a row from
    /// 0.5 s up to 5 min, with up to 25 % jitter so that sessions failing together (an API
    /// server outage) do not retry in lockstep.
    pub fn failed(&self, session: &str) -> Duration {
        let failures = self.with(session, |e| {
            e.failures = e.failures.saturating_add(1);
            e.failures
        });
        backoff(failures, jitter_seed(session))
    }

    /// Whether the session's egress NetworkPolicy is known to exist.
    pub fn has_policy(&self, session: &str) -> bool {
        self.with_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(session)
    }

    /// The session's egress NetworkPolicy exists.
    pub fn policy_exists(&self, session: &str) {
        self.with_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session.to_string());
    }

    /// Whether decoy pod `uid` is to be reported now (once per pod and operator run).
    pub fn report_decoy(&self, uid: &str) -> bool {
        self.decoys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(uid.to_string())
    }

    /// The session is gone.
    pub fn forget(&self, session: &str) {
        let mut map = self
            .by_session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(session);
        self.with_policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session);
    }
}

/// Adds `version` to `versions`, forgetting the oldest beyond [`VERSIONS_KEPT`].
fn remember<T>(versions: &mut Vec<T>, version: T) {
    if versions.len() >= VERSIONS_KEPT {
        versions.remove(0);
    }
    versions.push(version);
}

/// The delay after `failures` failures in a row; `seed` picks the jitter (0–25 %).
pub fn backoff(failures: u32, seed: u64) -> Duration {
    let exponent = failures.saturating_sub(1).min(20);
    let base = BACKOFF_MIN
        .saturating_mul(1u32 << exponent)
        .min(BACKOFF_MAX);
    let jitter = base.mul_f64((seed % 1000) as f64 / 4000.0);
    (base + jitter).min(BACKOFF_MAX)
}

/// Differs between sessions and between calls, without a random-number crate.
fn jitter_seed(session: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write(session.as_bytes());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stale-cache double restore: our write moved the object from "1" to "2"; a reconcile
    /// that still sees "1" (the watch event of the write has not arrived) must not act.
    #[test]
    fn a_cache_that_predates_our_write_is_stale_until_it_moves() {
        let e = Expectations::default();
        assert!(!e.is_stale("s", Some("1")), "nothing written yet");
        e.wrote("s", Some("1"), Some("2"));
        assert!(e.is_stale("s", Some("1")), "delayed watch event");
        assert!(e.is_stale("s", Some("1")), "still delayed");
        assert!(!e.is_stale("s", Some("2")), "our write arrived");
        assert!(
            !e.is_stale("s", Some("1")),
            "the wait ended: a relist that goes back is not ours to judge"
        );
        e.wrote("s", Some("2"), Some("5"));
        assert!(!e.is_stale("s", Some("4")), "someone else wrote after us");
        assert!(!e.is_stale("other", Some("2")), "per session");
        // Two writes in one reconcile: both versions before the last one are stale.
        e.wrote("s", Some("6"), Some("7"));
        e.wrote("s", Some("7"), Some("8"));
        assert!(e.is_stale("s", Some("6")));
        assert!(e.is_stale("s", Some("7")));
        assert!(!e.is_stale("s", Some("8")));
    }

    /// Read your own ExecutorRunning writes: its creation and two status applies, while the
    /// cache shows no object, then the versions the writes were based on; the cache's own
    /// version once it moves on.
    #[test]
    fn the_written_executor_stands_in_for_a_lagging_cache() {
        let at = |version: &str| {
            let mut er = ExecutorRunning::new("s", Default::default());
            er.metadata.resource_version = Some(version.into());
            er
        };
        let version = |er: Option<Arc<ExecutorRunning>>| {
            er.and_then(|er| er.metadata.resource_version.clone())
        };
        let e = Expectations::default();
        assert_eq!(version(e.executor("s", None)), None, "nothing written");
        e.wrote_executor("s", None, &at("1"));
        assert_eq!(
            version(e.executor("s", None)).as_deref(),
            Some("1"),
            "created"
        );
        e.wrote_executor("s", Some("1"), &at("2"));
        e.wrote_executor("s", Some("2"), &at("3"));
        for cached in [None, Some("1"), Some("2")] {
            let cached = cached.map(|v| Arc::new(at(v)));
            assert_eq!(version(e.executor("s", cached)).as_deref(), Some("3"));
        }
        assert_eq!(
            version(e.executor("s", Some(Arc::new(at("3"))))).as_deref(),
            Some("3")
        );
        assert_eq!(
            version(e.executor("s", Some(Arc::new(at("2"))))).as_deref(),
            Some("2"),
            "the wait ended with the cache's catching up"
        );
        assert!(
            e.by_session.lock().expect("lock").is_empty(),
            "nothing kept"
        );
    }

    /// A storm of resume tokens: our status write based on "3" was refused, the cache still
    /// shows "3"; deciding again would be refused again, so the reconcile waits for the cache.
    #[test]
    fn a_refused_write_makes_its_version_stale_until_the_cache_moves() {
        let e = Expectations::default();
        e.outdated("s", Some("3"));
        assert!(e.is_stale("s", Some("3")));
        assert!(!e.is_stale("s", Some("9")), "the newer version arrived");
        e.outdated("s", None);
        assert!(!e.is_stale("s", None), "no version, nothing to wait for");
    }

    #[test]
    fn a_write_that_changed_nothing_waits_for_nothing() {
        let e = Expectations::default();
        e.wrote("s", Some("3"), Some("3"));
        assert!(!e.is_stale("s", Some("3")));
        e.wrote("s", None, Some("3"));
        assert!(!e.is_stale("s", None));
    }

    #[test]
    fn a_created_pod_is_awaited_not_created_twice() {
        let e = Expectations::default();
        let nothing_cached = |_: &str| false;
        assert!(!e.awaits_created("s", nothing_cached));
        e.created_pod("s", "p1");
        assert!(e.awaits_created("s", nothing_cached));
        // A newer request's launch (pod p2) waits for p1 too: a superseded request's pod that
        // the cache does not show yet would otherwise be missed as a previous pod.
        assert!(e.awaits_created("s", |name| name == "p2"));
        assert!(
            !e.awaits_created("s", |name| name == "p1"),
            "the cache shows it"
        );
        assert!(
            !e.awaits_created("s", nothing_cached),
            "forgotten once seen"
        );
        // A superseded request's pod that the cache showed and this operator deleted before
        // the next launch pass looked: awaited no more (issue 31: the storm waited 30 s).
        e.created_pod("s", "p3");
        e.pod_gone("s", "p2");
        assert!(
            e.awaits_created("s", nothing_cached),
            "another pod's deletion"
        );
        e.pod_gone("s", "p3");
        assert!(
            !e.awaits_created("s", nothing_cached),
            "deleted: not awaited"
        );
    }

    /// A stalled launch's pod, deleted after the status that says so: the next reconcile can
    /// still find it pending in the cache, and must see it terminating, not starting.
    #[test]
    fn a_deleted_pod_counts_as_terminating_until_the_cache_shows_it() {
        let pod = |uid: &str| {
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.into());
            p
        };
        let now = Timestamp::now();
        let e = Expectations::default();
        let mut pods = [pod("a"), pod("b")];
        e.mark_deleted("s", &mut pods, now);
        assert!(
            pods.iter().all(|p| p.metadata.deletion_timestamp.is_none()),
            "nothing deleted"
        );

        e.deleted_pod("s", "a");
        e.deleted_pod("s", "a");
        let mut pods = [pod("a"), pod("b")];
        e.mark_deleted("s", &mut pods, now);
        assert_eq!(
            pods[0].metadata.deletion_timestamp,
            Some(Time(now)),
            "cache lags the delete"
        );
        assert_eq!(pods[1].metadata.deletion_timestamp, None, "another pod");
        let mut other = [pod("a")];
        e.mark_deleted("t", &mut other, now);
        assert_eq!(other[0].metadata.deletion_timestamp, None, "per session");

        // The cache shows the deletion: the expectation ends, and so does the entry.
        let mut pods = [pod("a")];
        pods[0].metadata.deletion_timestamp = Some(Time(now));
        e.mark_deleted("s", &mut pods, now);
        assert!(e.by_session.lock().expect("lock").is_empty());

        // Gone from the cache ends it as well.
        e.deleted_pod("s", "b");
        e.mark_deleted("s", &mut [], now);
        assert!(e.by_session.lock().expect("lock").is_empty());
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        for (failures, low_ms, high_ms) in [
            (1, 500, 625),
            (2, 1000, 1250),
            (3, 2000, 2500),
            (10, 256_000, 300_000),
            (40, 300_000, 300_000),
        ] {
            for seed in [0, 999, 12_345] {
                let delay = backoff(failures, seed).as_millis();
                assert!(
                    (low_ms..=high_ms).contains(&delay),
                    "{failures} failures, seed {seed}: {delay} ms"
                );
            }
        }
        let e = Expectations::default();
        assert!(e.failed("s") < Duration::from_millis(700));
        assert!(e.failed("s") >= Duration::from_millis(1000));
        e.succeeded("s");
        assert!(e.failed("s") < Duration::from_millis(700), "starts over");
        e.forget("s");
        assert!(e.by_session.lock().expect("lock").is_empty());
    }
}
