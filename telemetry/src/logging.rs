//! Logs to stdout, as text or JSON lines, and traces over OTLP when an endpoint is given.
//!
//! Traces are off by default. With an endpoint (`--otlp-endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), every span goes to that OpenTelemetry collector over
//! OTLP/gRPC, and the W3C trace context crosses the hop from a dispatcher to a controller
//! replica: [`traceparent`] reads a span's context as a `traceparent` value for a
//! `ReconcileRequest`, and [`set_parent`] makes the replica's reconcile span its child.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicBool, Ordering},
};

use opentelemetry::{
    propagation::TextMapPropagator as _,
    trace::{TraceContextExt as _, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};

/// Set once traces are exported: spans worth propagating are made only then.
static TRACING: AtomicBool = AtomicBool::new(false);

/// Logs to stdout, as text or JSON lines, at the level RUST_LOG sets (default info).
pub fn init(json: bool) {
    // Without an endpoint nothing can fail.
    let _ = init_with_traces(json, None, "");
}

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {source}")]
pub struct TracesError {
    endpoint: String,
    #[source]
    source: opentelemetry_otlp::ExporterBuildError,
}

/// Exports traces while it lives; dropping it sends the spans still batched.
#[derive(Debug, Default)]
pub struct Traces(Option<SdkTracerProvider>);

impl Drop for Traces {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Logs as [`init`] does and, given an OTLP/gRPC `endpoint` (for example
/// `http://otel-collector:4317`), exports every span there as `service`. Keep the returned
/// [`Traces`] until the process ends.
pub fn init_with_traces(
    json: bool,
    endpoint: Option<&str>,
    service: &str,
) -> Result<Traces, TracesError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi);
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let (otel, traces) = match endpoint {
        None => (None, Traces::default()),
        Some(endpoint) => {
            let (layer, traces) = otlp_layer(endpoint, service)?;
            (Some(layer), traces)
        }
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .init();
    if let Some(endpoint) = endpoint {
        tracing::info!(%endpoint, %service, "exporting traces over OTLP");
    }
    Ok(traces)
}

/// A layer that exports spans to the OTLP/gRPC `endpoint` as `service`, for a subscriber of
/// your own (a controller's `main`): add it beside your fmt layer and keep the [`Traces`].
/// Reconcile spans then continue the dispatcher's traces ([`set_parent`]).
pub fn otlp_layer<S>(endpoint: &str, service: &str) -> Result<(OtlpLayer<S>, Traces), TracesError>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| TracesError {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("kube-dispatch"));
    TRACING.store(true, Ordering::Release);
    Ok((layer, Traces(Some(provider))))
}

/// The layer [`otlp_layer`] makes.
pub type OtlpLayer<S> =
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>;

/// Whether traces are exported, so spans made to be propagated are worth making.
pub fn traces_enabled() -> bool {
    TRACING.load(Ordering::Acquire)
}

/// `span`'s W3C trace context as a `traceparent` value; `None` when it is not traced.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the span `traceparent` names; an empty or malformed value leaves
/// it a root. It takes wherever the span is recorded by a tracing-opentelemetry layer: the one
/// [`otlp_layer`] makes, or one the program installed itself (of the same tracing-opentelemetry
/// release), so a controller's own OpenTelemetry pipeline links its reconcile spans to the
/// dispatcher's trace too.
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || span.is_disabled() {
        return;
    }
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceId;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[test]
    fn a_span_recorded_by_the_programs_own_opentelemetry_layer_gets_its_parent() {
        // The program's own pipeline: its tracer provider and layer, not `otlp_layer`'s.
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("controller"));
        let subscriber = tracing_subscriber::registry().with(layer);
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace_id = tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile");
            set_parent(&span, traceparent);
            span.context().span().span_context().trace_id()
        });
        assert_eq!(
            trace_id,
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736")
                .ok()
                .unwrap_or(TraceId::INVALID)
        );
    }
}
