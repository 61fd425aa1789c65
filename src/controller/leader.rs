//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas are safe: only the
//! holder reconciles. It follows client-go's leaderelection semantics:
//!
//! - A follower judges expiry by **its own clock**: a lease is expired once this replica has
//!   seen the same record (its resourceVersion) for a whole lease duration. The holder's
//!   timestamps are never compared with local time, so clock skew cannot make two leaders.
//! - The holder renews every retry period and tolerates failed renewals until the renew
//!   deadline (shorter than the lease duration) has passed since its last successful one; then
//!   it steps down, before any follower can take over. Losing the lease ends the process (the
//!   Deployment restarts it as a follower): acting on stale leadership is never an option.
//! - On shutdown the holder releases the lease (empty holder), so a rollout's next leader takes
//!   over at once instead of after a lease duration.
//!
//! Our own and small rather than a crate: the pure decision is table-tested here, and the
//! leader-election crates for kube-rs lag behind kube's major releases (this tree is on kube 5).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

/// Lease settings (client-go's names).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long followers wait, by their own clocks, for a lease that is not renewed.
    pub duration: Duration,
    /// How long the holder keeps leading without a successful renewal; less than `duration`.
    pub renew_deadline: Duration,
    /// How often the holder renews and a follower tries to acquire.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(namespace: String, name: String, identity: String) -> Self {
        Self {
            namespace,
            name,
            identity,
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a replica should do with a lease it just read (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// We hold it: renew.
    Renew,
    /// Nobody holds it, or it was not renewed for a lease duration as this replica saw it.
    Acquire,
    /// Someone else holds a live lease.
    Follow { holder: String },
}

/// Decides from the lease as read. `unchanged_for` is how long this replica has seen the same
/// record, measured with its own clock.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> LeaseDecision {
    let Some(spec) = spec else {
        return LeaseDecision::Acquire;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == identity {
        return LeaseDecision::Renew;
    }
    if holder.is_empty() {
        return LeaseDecision::Acquire;
    }
    let seconds = spec.lease_duration_seconds.unwrap_or(15).max(1);
    let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(15));
    if unchanged_for >= duration {
        LeaseDecision::Acquire
    } else {
        LeaseDecision::Follow { holder }
    }
}

/// A running election: [`Self::leading`] turns `true` once this replica leads, and `false`
/// (for good) when it lost the lease.
pub struct Election {
    pub leading: watch::Receiver<bool>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    api: Api<Lease>,
    settings: LeaseSettings,
}

/// The last lease record this replica saw, and when it first saw it (its own clock).
struct Observed {
    version: Option<String>,
    since: Instant,
}

/// Starts the election in the background.
pub fn elect(client: Client, settings: LeaseSettings) -> Election {
    let (tx, rx) = watch::channel(false);
    let (stop, mut stopped) = oneshot::channel();
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let task = {
        let (api, settings) = (api.clone(), settings.clone());
        tokio::spawn(async move {
            let mut observed: Option<Observed> = None;
            let mut renewed: Option<Instant> = None;
            loop {
                let leading = *tx.borrow();
                // A holder's attempt may not outlast its renew deadline.
                let limit = match renewed.filter(|_| leading) {
                    Some(at) => {
                        (at + settings.renew_deadline).saturating_duration_since(Instant::now())
                    }
                    None => settings.renew_deadline,
                };
                let attempt = tokio::time::timeout(limit, try_hold(&api, &settings, &mut observed));
                match attempt.await {
                    Ok(Ok(true)) => {
                        renewed = Some(Instant::now());
                        if !leading {
                            info!(lease = %settings.name, identity = %settings.identity, "became the leader");
                            super::metrics::global().set_leader(true);
                            let _ = tx.send(true);
                        }
                    }
                    Ok(Ok(false)) if leading => {
                        warn!(lease = %settings.name, "lost the leader lease to another replica");
                        super::metrics::global().set_leader(false);
                        let _ = tx.send(false);
                        return;
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(err)) => {
                        warn!(%err, lease = %settings.name, "leader election: API call failed")
                    }
                    Err(_) => {
                        warn!(lease = %settings.name, "leader election: API call did not answer in time")
                    }
                }
                let overdue = renewed.is_some_and(|at| at.elapsed() >= settings.renew_deadline);
                if *tx.borrow() && overdue {
                    warn!(lease = %settings.name, deadline_s = settings.renew_deadline.as_secs(),
                        "could not renew the leader lease within the renew deadline; stepping down");
                    super::metrics::global().set_leader(false);
                    let _ = tx.send(false);
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(settings.retry_period) => {}
                    _ = &mut stopped => return,
                }
            }
        })
    };
    Election {
        leading: rx,
        stop,
        task,
        api,
        settings,
    }
}

impl Election {
    /// Stops the election and, if this replica holds the lease, releases it (empty holder) so
    /// that another replica takes over at once. Best effort, bounded by the renew deadline.
    pub async fn release(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
        let release = async {
            let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(&self.settings.name, &PostParams::default(), &lease)
                .await
                .map(|_| true)
        };
        match tokio::time::timeout(self.settings.renew_deadline, release).await {
            Ok(Ok(true)) => {
                super::metrics::global().set_leader(false);
                info!(lease = %self.settings.name, "released the leader lease");
            }
            Ok(Ok(false)) => {}
            Ok(Err(err)) => {
                warn!(%err, lease = %self.settings.name, "could not release the leader lease")
            }
            Err(_) => {
                warn!(lease = %self.settings.name, "releasing the leader lease did not finish in time")
            }
        }
    }
}

async fn try_hold(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    observed: &mut Option<Observed>,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(&settings.name).await?;
    let version = current
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone());
    let unchanged_for = match observed {
        Some(seen) if seen.version == version => seen.since.elapsed(),
        _ => {
            *observed = Some(Observed {
                version,
                since: Instant::now(),
            });
            Duration::ZERO
        }
    };
    let decision = decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &settings.identity,
        unchanged_for,
    );
    let now = Timestamp::now();
    let seconds = i32::try_from(settings.duration.as_secs()).unwrap_or(15);
    match (decision, current) {
        (LeaseDecision::Follow { holder }, _) => {
            tracing::debug!(%holder, "following the current leader");
            Ok(false)
        }
        (LeaseDecision::Acquire, None) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(settings.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(settings.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        (decision, Some(mut lease)) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            if decision == LeaseDecision::Acquire {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(settings.identity.clone());
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(MicroTime(now));
            // resourceVersion makes this a compare-and-swap: a concurrent winner gets 409 here.
            match api
                .replace(&settings.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        (LeaseDecision::Renew, None) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            // The holder's clock says "renewed far in the future": never trusted.
            renew_time: Some(MicroTime(
                Timestamp::from_second(4_000_000_000).expect("ts"),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn lease_decisions_use_this_replicas_clock() {
        let secs = Duration::from_secs;
        let follow = || LeaseDecision::Follow {
            holder: "other".into(),
        };
        let cases = [
            (None, secs(0), LeaseDecision::Acquire),
            (Some(spec("me", 15)), secs(0), LeaseDecision::Renew),
            (Some(spec("me", 15)), secs(100), LeaseDecision::Renew),
            (Some(spec("other", 15)), secs(0), follow()),
            (Some(spec("other", 15)), secs(14), follow()),
            (Some(spec("other", 15)), secs(15), LeaseDecision::Acquire),
            (Some(spec("other", 0)), secs(0), follow()),
            (Some(spec("", 15)), secs(0), LeaseDecision::Acquire),
        ];
        for (lease, unchanged_for, expected) in cases {
            assert_eq!(
                decide(lease.as_ref(), "me", unchanged_for),
                expected,
                "{lease:?} unchanged for {unchanged_for:?}"
            );
        }
    }

    #[test]
    fn the_holder_steps_down_before_a_follower_may_take_over() {
        let s = LeaseSettings::new("ns".into(), "l".into(), "me".into());
        assert!(s.renew_deadline + s.retry_period < s.duration, "{s:?}");
    }
}
