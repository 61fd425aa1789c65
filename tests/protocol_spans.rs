//! The restore is traced as DESIGN §3 says: span `acp.session.restore` with one child per step,
//! named by `RestoreMethod::span_name` (`acp.session.resume` / `.load` / `.new`).
//!
//! Alone in its own test binary on purpose: it installs a global subscriber before any span
//! callsite is hit. With a thread-local subscriber, a concurrent test registering the same
//! callsites without one can cache them as disabled (a known tracing-core race), which would
//! make this test flaky.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod agentctl_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentctl_support::{restore_saved, spawn_agent, stop_agent, test_agent_command};
use kandev_operator::acp::{AcpTimeouts, RestoreOutcome};
use kandev_operator::resume::{FreshReason, RestoreMethod};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// (span name, parent span name)
type SpanRecord = (String, Option<String>);

/// Records every new span's name and its parent's name.
#[derive(Clone, Default)]
struct SpanNames(Arc<Mutex<Vec<SpanRecord>>>);

impl<S> tracing_subscriber::Layer<S> for SpanNames
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent().map(|parent| parent.name().to_owned()));
        let mut names = self.0.lock().expect("lock");
        names.push((attrs.metadata().name().to_owned(), parent));
    }
}

#[tokio::test]
async fn restore_steps_are_child_spans_named_by_the_rules() {
    let names = SpanNames::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(names.clone()))
        .expect("first and only subscriber in this binary");

    // resume → -32601 → load of the same id → -32002 → session/new: all three steps run.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut agent = spawn_agent(&test_agent_command(&["--on-resume", "error:-32601"]));
    let timeouts = AcpTimeouts::uniform(Duration::from_secs(20));
    let outcome = restore_saved(agent.client_mut(), Some("tok"), dir.path(), timeouts).await;
    stop_agent(agent, Duration::from_secs(2)).await;
    assert_eq!(
        outcome,
        RestoreOutcome::Fresh {
            session_id: "test-session-1".into(),
            why: FreshReason::UnknownSession
        }
    );

    let names = names.0.lock().expect("lock").clone();
    let restore = "acp.session.restore".to_owned();
    assert!(names.contains(&(restore.clone(), None)), "{names:?}");
    for method in [
        RestoreMethod::Resume,
        RestoreMethod::Load,
        RestoreMethod::New,
    ] {
        let child = (method.span_name().to_owned(), Some(restore.clone()));
        assert!(names.contains(&child), "{child:?} not in {names:?}");
    }
}
