//! The operator's Events publisher against a real API server, through the queue the reconciles
//! hand their Events to: a repeat sent right after the first joins its series (one object's
//! Events are published in order by one worker), a different action is an Event of its own
//! (e2e/README.md).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use e2e_support::sessions::Sessions;
use e2e_support::{client, unique};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kandev_operator::controller::events::{OutgoingEvent, Publisher, Queue};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::events::EventType;
use pretty_assertions::assert_eq;

#[tokio::test]
#[ignore = "e2e: needs the cluster (make e2e)"]
async fn a_repeated_event_joins_the_first_ones_series() {
    let sessions = Sessions::fresh_on(&client().await, "kandev-e2e-events").await;
    let client = &sessions.client;
    let name = unique("e2e-events");
    let events: Api<Event> = Api::namespaced(client.clone(), &sessions.namespace);
    let regarding = ObjectReference {
        api_version: Some("kandev.dev/v1alpha1".into()),
        kind: Some("TaskSession".into()),
        namespace: Some(sessions.namespace.clone()),
        name: Some(name.clone()),
        uid: Some(format!("uid-{name}")),
        ..ObjectReference::default()
    };
    let selector = ListParams::default().fields(&format!("regarding.name={name}"));
    sessions
        .run(async {
            let publisher = Publisher::new(client.clone(), "kandev-operator", None);
            let queue = Queue::start(publisher, 4);
            let note = |action, text| OutgoingEvent {
                type_: EventType::Warning,
                reason: "AgentUnreachable",
                action,
                note: text,
            };
            // Sent back to back: the reconcile does not wait for its Events.
            for text in ["first", "second"] {
                queue.send(regarding.clone(), &note("Observe:1", text));
            }
            queue.send(regarding.clone(), &note("Observe:2", "other"));
            let folded = |listed: &[Event]| {
                listed.len() == 2
                    && listed
                        .iter()
                        .any(|e| e.series.as_ref().is_some_and(|s| s.count == 2))
            };
            for _ in 0..300 {
                let listed = events.list(&selector).await.expect("list").items;
                if folded(&listed) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }

            let mut listed = events.list(&selector).await.expect("list").items;
            listed.sort_by_key(|e| e.action.clone());
            let seen: Vec<(Option<&str>, Option<&str>, Option<i32>)> = listed
                .iter()
                .map(|e| {
                    (
                        e.action.as_deref(),
                        e.note.as_deref(),
                        e.series.as_ref().map(|s| s.count),
                    )
                })
                .collect();
            assert_eq!(
                seen,
                [
                    (Some("Observe:1"), Some("first"), Some(2)),
                    (Some("Observe:2"), Some("other"), None),
                ]
            );
            let first = &listed[0];
            assert_eq!(first.type_.as_deref(), Some("Warning"));
            assert_eq!(
                first.reporting_controller.as_deref(),
                Some("kandev-operator")
            );
            assert_eq!(first.regarding.as_ref(), Some(&regarding));
        })
        .await;
}
