//! Events (`events.k8s.io/v1`) about TaskSessions.
//!
//! As kube-runtime's `Recorder` does, a repeat of the same event (same object, type, reason and
//! action) within [`SERIES_WINDOW`] is folded into the first one's series (a patch of its count
//! and last observed time) instead of a new Event. Unlike it, what is remembered of a published
//! Event is a 64-bit key, its name and its count, not the whole Event and its reference (about
//! 2 KiB each, and a fleet publishes several per session within the window), and the expired
//! entries are pruned at most once per [`PRUNE_EVERY`] rather than on every publish.
//!
//! A reconcile does not wait for its Events: it hands them to a [`Queue`] (as client-go's event
//! broadcaster does), whose workers publish them in order per object, so that a series still
//! folds and a launch's API calls are not held up by its Events.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::warn;

use crate::api::bounds::{EVENT_NOTE_MAX, cap};

/// How long a published Event takes repeats into its series (kube-runtime's and client-go's
/// choice).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How often expired entries are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// One Event to publish about `regarding`.
pub struct OutgoingEvent<'a> {
    pub type_: EventType,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: &'a str,
}

/// What is remembered of a published Event.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Whether `note` starts an Event or repeats a published one.
#[derive(Debug, PartialEq, Eq)]
enum Publish {
    New,
    Repeat { name: String, count: i32 },
}

#[derive(Default)]
struct Recent {
    published: HashMap<u64, Published>,
    pruned: Option<Timestamp>,
}

impl Recent {
    /// Drops what left the window, at most once per [`PRUNE_EVERY`].
    fn prune(&mut self, now: Timestamp) {
        let due = self
            .pruned
            .is_none_or(|at| now.duration_since(at).unsigned_abs() >= PRUNE_EVERY);
        if due {
            self.published.retain(|_, p| within(p.last, now));
            self.pruned = Some(now);
        }
    }

    fn decide(&self, key: u64, now: Timestamp) -> Publish {
        match self.published.get(&key) {
            Some(p) if within(p.last, now) => Publish::Repeat {
                name: p.name.clone(),
                count: p.count + 1,
            },
            _ => Publish::New,
        }
    }
}

fn within(last: Timestamp, now: Timestamp) -> bool {
    now.duration_since(last).unsigned_abs() < SERIES_WINDOW
}

/// Publishes Events for one controller instance.
pub struct Publisher {
    client: kube::Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

impl Publisher {
    pub fn new(client: kube::Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            recent: Mutex::default(),
        }
    }

    fn key(regarding: &ObjectReference, note: &OutgoingEvent<'_>) -> u64 {
        let mut hasher = DefaultHasher::new();
        (
            &regarding.uid,
            &regarding.namespace,
            &regarding.name,
            matches!(note.type_, EventType::Warning),
            note.reason,
            note.action,
        )
            .hash(&mut hasher);
        hasher.finish()
    }

    /// Creates the Event, or adds a repeat to its series.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        note: &OutgoingEvent<'_>,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Self::key(regarding, note);
        let namespace = regarding.namespace.as_deref().unwrap_or_default();
        let decision = {
            let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
            recent.prune(now);
            recent.decide(key, now)
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let (name, count) = match decision {
            Publish::Repeat { name, count } => {
                let series =
                    json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                    .await?;
                (name, count)
            }
            Publish::New => {
                let event = self.event(regarding, note, now);
                let created = api.create(&PostParams::default(), &event).await?;
                (created.metadata.name.unwrap_or_default(), 1)
            }
        };
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.published.insert(
            key,
            Published {
                name,
                count,
                last: now,
            },
        );
        Ok(())
    }

    fn event(
        &self,
        regarding: &ObjectReference,
        note: &OutgoingEvent<'_>,
        now: Timestamp,
    ) -> Event {
        let base = regarding.name.as_deref().unwrap_or(&self.controller);
        Event {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!("{base}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            action: Some(note.action.to_string()),
            reason: Some(note.reason.to_string()),
            note: Some(note.note.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match note.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            ..Event::default()
        }
    }
}

/// Events waiting per worker at most; beyond that one is dropped (with a warning), as
/// client-go's broadcaster drops them, rather than holding memory while the API server is away.
pub const QUEUE_DEPTH: usize = 1000;

/// An Event handed to the [`Queue`].
struct Queued {
    regarding: ObjectReference,
    type_: EventType,
    reason: String,
    action: String,
    note: String,
}

/// Publishes Events beside the reconciles: [`Queue::send`] returns at once, and `workers`
/// tasks publish. Events about one object go to one worker, in the order they were sent.
pub struct Queue {
    workers: Vec<mpsc::Sender<Queued>>,
}

impl Queue {
    /// Starts the workers (on the current tokio runtime).
    pub fn start(publisher: Publisher, workers: usize) -> Self {
        let publisher = Arc::new(publisher);
        let workers = (0..workers.max(1))
            .map(|_| {
                let (tx, mut rx) = mpsc::channel::<Queued>(QUEUE_DEPTH);
                let publisher = publisher.clone();
                tokio::spawn(async move {
                    while let Some(q) = rx.recv().await {
                        let note = OutgoingEvent {
                            type_: q.type_,
                            reason: &q.reason,
                            action: &q.action,
                            note: &q.note,
                        };
                        if let Err(err) = publisher.publish(&q.regarding, &note).await {
                            warn!(%err, reason = q.reason, "could not publish an Event");
                        }
                    }
                });
                tx
            })
            .collect();
        Self { workers }
    }

    /// Queues `note` about `regarding`; drops it (with a warning) when its worker is
    /// [`QUEUE_DEPTH`] Events behind.
    pub fn send(&self, regarding: ObjectReference, note: &OutgoingEvent<'_>) {
        let mut hasher = DefaultHasher::new();
        (&regarding.uid, &regarding.namespace, &regarding.name).hash(&mut hasher);
        let index = usize::try_from(hasher.finish() % self.workers.len() as u64).unwrap_or(0);
        let queued = Queued {
            regarding,
            type_: note.type_,
            reason: note.reason.to_string(),
            action: note.action.to_string(),
            // The API server refuses a note over 1 KiB, and the Event with it.
            note: cap(note.note, EVENT_NOTE_MAX).into_owned(),
        };
        if let Some(worker) = self.workers.get(index)
            && let Err(err) = worker.try_send(queued)
        {
            warn!(reason = note.reason, "dropped an Event: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("a timestamp")
    }

    fn published(name: &str, count: i32, last: Timestamp) -> Published {
        Published {
            name: name.into(),
            count,
            last,
        }
    }

    fn repeat_of_ts_1(count: i32) -> Publish {
        Publish::Repeat {
            name: "ts.1".into(),
            count,
        }
    }

    #[test]
    fn a_repeat_within_the_window_joins_the_series() {
        let mut recent = Recent::default();
        assert_eq!(recent.decide(1, at(0)), Publish::New);
        recent.published.insert(1, published("ts.1", 1, at(0)));
        assert_eq!(recent.decide(1, at(359)), repeat_of_ts_1(2));
        recent.published.insert(1, published("ts.1", 2, at(359)));
        // The window counts from the last repeat.
        assert_eq!(recent.decide(1, at(700)), repeat_of_ts_1(3));
        // Past the window, and for another key: a new Event.
        assert_eq!(recent.decide(1, at(359 + 360)), Publish::New);
        assert_eq!(recent.decide(2, at(360)), Publish::New);
    }

    #[test]
    fn expired_entries_are_pruned_at_most_once_a_minute() {
        let mut recent = Recent::default();
        recent.published.insert(1, published("old", 1, at(0)));
        recent.published.insert(2, published("new", 1, at(300)));
        recent.prune(at(370));
        assert_eq!(
            recent.published.len(),
            1,
            "the one that left the window is gone"
        );
        assert!(recent.published.contains_key(&2));
        recent.published.insert(3, published("older", 1, at(0)));
        recent.prune(at(400));
        assert_eq!(recent.published.len(), 2, "pruned 30 s ago: not due yet");
        recent.prune(at(430));
        assert_eq!(recent.published.len(), 1);
    }

    #[test]
    fn the_key_tells_objects_reasons_and_actions_apart() {
        let reference = |uid: &str| ObjectReference {
            uid: Some(uid.into()),
            namespace: Some("ns".into()),
            name: Some("s".into()),
            ..ObjectReference::default()
        };
        let note = |reason, action| OutgoingEvent {
            type_: EventType::Normal,
            reason,
            action,
            note: "text is not part of the key",
        };
        let base = Publisher::key(&reference("u1"), &note("Resumed", "Restore:1"));
        assert_eq!(
            base,
            Publisher::key(&reference("u1"), &note("Resumed", "Restore:1"))
        );
        for other in [
            Publisher::key(&reference("u2"), &note("Resumed", "Restore:1")),
            Publisher::key(&reference("u1"), &note("Started", "Restore:1")),
            Publisher::key(&reference("u1"), &note("Resumed", "Restore:2")),
        ] {
            assert_ne!(base, other);
        }
    }
}
