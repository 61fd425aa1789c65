//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas are safe: only the
//! holder reconciles. Losing the lease ends the process (the Deployment restarts it as a
//! follower) — acting on stale leadership is never an option.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

/// Lease settings.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a lease stays valid without renewal.
    pub duration: Duration,
    /// How often the holder renews (and a follower retries).
    pub renew_every: Duration,
}

/// What a replica should do with a lease it just read (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// We hold it: renew.
    Renew,
    /// Nobody holds it or the holder stopped renewing: take it.
    Acquire,
    /// Someone else holds a live lease.
    Follow { holder: String },
}

/// Decides from the lease as read; `now` and the lease's renew time decide expiry.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> LeaseDecision {
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
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match renewed {
        Some(at) if at + duration > now => LeaseDecision::Follow { holder },
        _ => LeaseDecision::Acquire,
    }
}

/// Runs the election forever; the receiver turns `true` once this replica leads. Returns
/// (through the receiver turning `false`) when leadership is lost.
pub fn elect(client: Client, settings: LeaseSettings) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        loop {
            match try_hold(&api, &settings).await {
                Ok(true) => {
                    if !*tx.borrow() {
                        info!(lease = %settings.name, identity = %settings.identity, "became the leader");
                    }
                    super::metrics::global().set_leader(true);
                    let _ = tx.send(true);
                }
                Ok(false) => {
                    if *tx.borrow() {
                        warn!("lost the leader lease");
                        super::metrics::global().set_leader(false);
                        let _ = tx.send(false);
                        return;
                    }
                }
                Err(err) => {
                    warn!(%err, "leader election: API call failed");
                    if *tx.borrow() {
                        // Could not renew; give up before the lease can expire under us.
                        super::metrics::global().set_leader(false);
                        let _ = tx.send(false);
                        return;
                    }
                }
            }
            tokio::time::sleep(settings.renew_every).await;
        }
    });
    rx
}

async fn try_hold(api: &Api<Lease>, settings: &LeaseSettings) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = api.get_opt(&settings.name).await?;
    let decision = decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &settings.identity,
        now,
    );
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

    fn spec(holder: &str, renewed_at: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).expect("ts"))),
            ..Default::default()
        }
    }

    #[test]
    fn lease_decisions() {
        let now = Timestamp::from_second(100).expect("ts");
        let cases = [
            (None, LeaseDecision::Acquire),
            (Some(spec("me", 99, 15)), LeaseDecision::Renew),
            (Some(spec("me", 1, 15)), LeaseDecision::Renew),
            (
                Some(spec("other", 95, 15)),
                LeaseDecision::Follow {
                    holder: "other".into(),
                },
            ),
            (Some(spec("other", 80, 15)), LeaseDecision::Acquire),
            (Some(spec("", 99, 15)), LeaseDecision::Acquire),
        ];
        for (lease, expected) in cases {
            assert_eq!(decide(lease.as_ref(), "me", now), expected, "{lease:?}");
        }
    }
}
