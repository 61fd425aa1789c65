//! Logs and OpenTelemetry traces of the operator and of agentctl (DESIGN §4).
//!
//! Traces are off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set. Then every `tracing` span is also an OpenTelemetry span, exported over OTLP
//! HTTP/protobuf (port 4318 of a collector or Jaeger) by a batch processor on the tokio runtime.
//! The standard variables apply: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_BSP_*`.
//!
//! A trace crosses into the agent pod as a W3C `traceparent` in the ACP request's `_meta`
//! ([`inject`] on the operator's side, [`extract`] in agentctl).

mod warn_limit;

pub use warn_limit::{SharedWarnLimiter, WarnLimiter};

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The variables that switch the OTLP exporter on; either one is enough.
pub const ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// The OTel variables the operator hands on to agentctl pods. Headers are left out: they often
/// carry credentials, which must never land in a pod spec.
pub const POD_ENV: [&str; 7] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_RESOURCE_ATTRIBUTES",
];

/// How long [`Telemetry::shutdown`] waits for the last spans to reach the receiver.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("the OTLP trace exporter ({endpoint}): {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("installing the log subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Where the logs go and how they look.
pub struct LogSettings {
    pub filter: EnvFilter,
    pub json: bool,
    /// `service.name` when `OTEL_SERVICE_NAME` does not set one.
    pub service: &'static str,
    /// Export traces when an OTLP endpoint is set (short-lived helper commands do not).
    pub export: bool,
}

/// The installed tracer; [`Telemetry::shutdown`] flushes it.
#[must_use = "shut it down to flush the last spans"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// The value of the first set [`ENDPOINT_ENV`] variable.
pub fn otlp_endpoint() -> Option<String> {
    ENDPOINT_ENV
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty())
}

/// The [`POD_ENV`] variables set in this process, for the agentctl pods.
pub fn pod_env() -> Vec<(String, String)> {
    if otlp_endpoint().is_none() {
        return Vec::new();
    }
    POD_ENV
        .iter()
        .filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?)))
        .filter(|(_, value)| !value.trim().is_empty())
        .collect()
}

/// Installs the log subscriber, with the OTLP layer when an endpoint is set. Must run inside a
/// tokio runtime (the batch processor is a task on it). An exporter that cannot be built (a bad
/// endpoint URL) is logged, and the process goes on without traces: they are never worth a
/// crash loop.
pub fn init(settings: LogSettings) -> Result<Telemetry, TelemetryError> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never in a container's log.
        .with_ansi(ansi);
    let fmt = if settings.json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let (provider, failed) = match otlp_endpoint().filter(|_| settings.export) {
        Some(endpoint) => match provider(settings.service, &endpoint) {
            Ok(provider) => (Some(provider), None),
            Err(error) => (None, Some(error)),
        },
        None => (None, None),
    };
    let otel = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer(settings.service))
    });
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .with(settings.filter)
        .try_init()?;
    match (&provider, failed) {
        (Some(_), _) => tracing::info!(
            endpoint = otlp_endpoint().unwrap_or_default(),
            "exporting traces over OTLP"
        ),
        (None, Some(error)) => tracing::error!(%error, "traces are off"),
        (None, None) => {}
    }
    Ok(Telemetry { provider })
}

fn provider(service: &'static str, endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    // The resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; our name is the default.
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service);
    }
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build())
}

impl Telemetry {
    /// Exports the spans still queued and stops the exporter (a few seconds at most).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // The SDK blocks its caller until the batch task on this runtime answers.
        let flush = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(FLUSH_TIMEOUT, flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(%error, "flushing the last spans failed"),
            Ok(Err(error)) => tracing::warn!(%error, "flushing the last spans failed"),
            Err(_) => tracing::warn!("flushing the last spans took too long; some are lost"),
        }
    }
}

/// The W3C trace context (`traceparent`, `tracestate`) of `span`; empty when it is not
/// exported.
pub fn inject(span: &tracing::Span) -> HashMap<String, String> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier
}

/// Makes the trace context in `carrier` (a `traceparent` from another process) the parent of
/// `span`. Nothing happens without a valid `traceparent` or without an exporter.
pub fn set_remote_parent(span: &tracing::Span, carrier: &HashMap<String, String>) {
    let context = TraceContextPropagator::new().extract(carrier);
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The trace id of the current span, when it is sampled and exported (for exemplars).
pub fn current_trace_id() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    (span_context.is_valid() && span_context.is_sampled())
        .then(|| span_context.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_nothing_is_propagated() {
        let span = tracing::info_span!("x");
        assert!(inject(&span).is_empty());
        assert_eq!(current_trace_id(), None);
        // A foreign traceparent on a span without an exporter is ignored without error.
        let carrier = HashMap::from([(
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]);
        set_remote_parent(&span, &carrier);
    }
    // With an exporter: tests/trace_context.rs.
}
