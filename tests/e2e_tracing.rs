//! End-to-end: one resume is one trace, from the operator into the agent pod, in a real OTLP
//! receiver (Jaeger v1 all-in-one, built by e2e/bin.sh). The operator exports over OTLP/HTTP;
//! the agentctl pod gets the same endpoint from the operator (the harness plays the pod with
//! its env) and continues the trace from the `traceparent` in the ACP request's `_meta`.
//! Run by `bash e2e/test.sh` (see e2e/README.md).
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

mod e2e_support;

use std::time::Duration;

use e2e_support::jaeger::{Jaeger, Span};
use e2e_support::operator::Operator;
use e2e_support::sessions::Sessions;
use e2e_support::{poll, unique};

/// The spans of `trace` named `name`.
fn named<'a>(trace: &'a [Span], name: &str) -> Vec<&'a Span> {
    trace.iter().filter(|s| s.name == name).collect()
}

fn parent_of<'a>(trace: &'a [Span], span: &Span) -> Option<&'a Span> {
    let parent = span.parent.as_deref()?;
    trace.iter().find(|s| s.span_id == parent)
}

/// The trace of the resume: `acp.session.resume` or `acp.session.load` under
/// `acp.session.restore` (not the first launch's `acp.session.new`).
fn resume_trace(traces: &[Vec<Span>]) -> Option<&Vec<Span>> {
    traces.iter().find(|trace| {
        trace
            .iter()
            .any(|s| s.name == "acp.session.resume" || s.name == "acp.session.load")
            && trace.iter().any(|s| s.name == "agentctl.forward")
    })
}

#[tokio::test]
#[ignore = "e2e: needs the cluster and jaeger-all-in-one (make e2e)"]
async fn a_resume_is_one_trace_from_the_operator_into_the_pod() {
    let jaeger = Jaeger::start().await;
    let sessions = Sessions::fresh("kandev-e2e-tracing").await;
    let body = async {
        let mut operator = Operator::builder()
            .log_prefix("operator-tracing")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &jaeger.otlp_endpoint)
            // Small batches, so that agentctl's spans arrive while the test waits.
            .env("OTEL_BSP_SCHEDULE_DELAY", "200")
            .start();
        let name = unique("traced");
        sessions.create(&name, "claude-code").await;
        sessions.wait_waiting_for_input(&name).await;

        sessions.lose(&name).await;
        sessions.resume(&name, "trace-1").await;
        // SIGTERM: the operator flushes its last spans before it exits.
        assert_eq!(operator.terminate(Duration::from_secs(30)).await, Some(0));

        let trace = poll(Duration::from_secs(60), Duration::from_millis(500), async || {
            let traces = jaeger
                .traces("kandev-operator", "acp.session.restore")
                .await;
            resume_trace(&traces).cloned().ok_or_else(|| {
                format!("no trace with the resume and agentctl's span in jaeger; traces: {traces:#?}")
            })
        })
        .await;

        // reconcile → acp.session.restore → acp.session.resume|load → agentctl.forward
        let restore = named(&trace, "acp.session.restore");
        assert_eq!(restore.len(), 1, "{trace:#?}");
        let restore = restore[0];
        assert_eq!(restore.service, "kandev-operator");
        let reconcile = parent_of(&trace, restore)
            .unwrap_or_else(|| panic!("the restore's parent is not in the trace: {trace:#?}"));
        assert_eq!(reconcile.name, "reconcile", "{trace:#?}");
        // The root, or under kube-runtime's own span when the log filter lets kube's spans in.
        if let Some(above) = parent_of(&trace, reconcile) {
            assert_eq!(above.name, "reconciling object", "{trace:#?}");
        }
        let step = trace
            .iter()
            .find(|s| {
                (s.name == "acp.session.resume" || s.name == "acp.session.load")
                    && s.parent.as_deref() == Some(restore.span_id.as_str())
            })
            .unwrap_or_else(|| panic!("no resume or load under the restore: {trace:#?}"));
        let forwarded = trace
            .iter()
            .find(|s| {
                s.name == "agentctl.forward" && s.parent.as_deref() == Some(step.span_id.as_str())
            })
            .unwrap_or_else(|| panic!("no agentctl.forward under {}: {trace:#?}", step.name));
        assert_eq!(forwarded.service, "kandev-agentctl", "{trace:#?}");
    };
    // The operator under test is stopped in the test: another lifts the finalizer.
    sessions.run_with_operator(Operator::builder(), body).await;
}
