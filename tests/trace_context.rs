//! W3C trace context across processes, with an exporter: the operator's `traceparent` reaches
//! agentctl, agentctl's own span goes on to the agent, and metrics carry the trace id as exemplar.
//! (Without an exporter nothing is propagated: unit tests next to the code.)
//!
//! Alone in its own test binary with a global subscriber, installed before any callsite is hit,
//! for the reason `protocol_spans.rs` gives: with a thread-local subscriber, a concurrent test
//! registering the same callsites without one can cache them as disabled (a tracing-core race;
//! it failed a CI run of the hub's test).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

use std::sync::Once;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use serde_json::{Value, json};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use kandev_operator::agentctl::hub::{Hub, HubConfig, Output};
use kandev_operator::controller::metrics::Metrics;
use kandev_operator::telemetry::{current_trace_id, inject, set_remote_parent};

const OPERATOR_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The process-wide subscriber: an OpenTelemetry layer without an exporter.
fn traced() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    });
}

fn trace_id(span: &tracing::Span) -> String {
    span.context().span().span_context().trace_id().to_string()
}

#[test]
fn a_trace_crosses_processes_through_traceparent() {
    traced();
    let parent = tracing::info_span!("operator");
    let carrier = inject(&parent);
    let traceparent = carrier.get("traceparent").expect("traceparent");
    let trace = trace_id(&parent);
    assert!(
        traceparent.starts_with(&format!("00-{trace}-")),
        "{traceparent}"
    );
    let entered = parent.enter();
    assert_eq!(current_trace_id(), Some(trace.clone()));
    drop(entered);

    let child = tracing::info_span!(parent: None, "agentctl");
    set_remote_parent(&child, &carrier);
    assert_eq!(trace_id(&child), trace);
}

#[test]
fn the_operators_trace_context_is_taken_and_the_agent_gets_agentctls() {
    traced();
    let mut hub = Hub::new(HubConfig::default());
    assert_eq!(hub.start().len(), 1, "agentctl's initialize");
    let ready = json!({"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true}}});
    assert_eq!(hub.agent_line(&ready.to_string()), vec![]);
    hub.attach(1, false).expect("attach");
    let request = json!({"jsonrpc":"2.0","id":2,"method":"session/resume","params":{"sessionId":"s1","cwd":"/w",
        "_meta":{"kandev.dev/launch":"r1","traceparent":format!("00-{OPERATOR_TRACE}-00f067aa0ba902b7-01")}}});
    let sent: Vec<Value> = hub
        .client_line(1, &request.to_string())
        .into_iter()
        .filter_map(|o| match o {
            Output::ToAgent(v) => Some(v),
            _ => None,
        })
        .collect();
    // The agent gets agentctl.forward's context, in the operator's trace.
    let meta = &sent[0]["params"]["_meta"];
    let traceparent = meta["traceparent"].as_str().expect("traceparent");
    assert!(
        traceparent.starts_with(&format!("00-{OPERATOR_TRACE}-"))
            && !traceparent.contains("00f067aa0ba902b7"),
        "{traceparent}"
    );
    assert!(meta.get("kandev.dev/launch").is_none(), "{meta}");
}

#[test]
fn histograms_carry_the_trace_id_as_exemplar() {
    traced();
    let metrics = Metrics::new();
    let span = tracing::info_span!("reconcile");
    let entered = span.enter();
    metrics.reconciled(None, Duration::from_millis(40));
    drop(entered);
    let bucket = format!(
        "kandev_reconcile_duration_seconds_bucket{{le=\"0.05\"}} 1 # {{trace_id=\"{}\"}} 0.04",
        trace_id(&span)
    );
    let text = metrics.render();
    assert!(
        text.lines().any(|l| l == bucket),
        "missing {bucket} in\n{text}"
    );
}
