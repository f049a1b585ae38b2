//! Exports the spans `core::trace` builds to an OTLP endpoint (gRPC or HTTP/protobuf).
//!
//! Controllers hand spans over with [`Traces::record`], which never waits: spans go into a bounded
//! queue, and one background task sends them in batches. A full queue, an endpoint that refuses or
//! one that cannot be reached drops spans and counts them (`ax_trace_spans_dropped_total`); a
//! reconcile is never slowed by tracing. The SDK's tracer is not used: its span ids are its own,
//! and ours must be known before a span ends (see `core::trace`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::core::trace::{Sampler, Span, SpanStatus, Value};
use crate::ops::metrics::Metrics;

/// Spans waiting to be sent; more are dropped (and counted) until the exporter catches up.
const QUEUE_CAPACITY: usize = 8192;
/// Spans sent in one request at most.
const BATCH_MAX: usize = 512;
/// How long a span may wait for its batch to fill.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// How long one export may take before its spans are dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// A failing endpoint is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceProtocol {
    /// OTLP/gRPC (a Collector's port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    Http,
}

/// Where and what to export.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    pub endpoint: String,
    pub protocol: TraceProtocol,
    pub sampler: Sampler,
}

/// The operator's span export; off when no endpoint is configured.
#[derive(Clone, Default)]
pub struct Traces {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    sampler: Sampler,
    queue: mpsc::Sender<Span>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {message}")]
pub struct TraceError {
    endpoint: String,
    message: String,
}

impl Traces {
    /// Tracing off: nothing is recorded and tasks get no trace.
    pub fn off() -> Self {
        Self::default()
    }

    /// Starts the export task (inside a tokio runtime).
    pub fn start(config: &TraceConfig, metrics: Arc<Metrics>) -> Result<Self, TraceError> {
        let error = |message: String| TraceError {
            endpoint: config.endpoint.clone(),
            message,
        };
        let mut exporter = match config.protocol {
            TraceProtocol::Http => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(http_traces_url(&config.endpoint))
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
            TraceProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
        }
        .map_err(|e| error(e.to_string()))?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_attributes([
                    KeyValue::new("service.name", "ax-operator"),
                    KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                ])
                .build(),
        );
        let (queue, spans) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(export_loop(exporter, spans, metrics.clone()));
        info!(endpoint = %config.endpoint, protocol = ?config.protocol, sampler = ?config.sampler,
            "exporting task traces");
        Ok(Self {
            inner: Some(Arc::new(Inner {
                sampler: config.sampler,
                queue,
                metrics,
            })),
        })
    }

    /// The sampler when traces are exported; `None` when tracing is off.
    pub fn sampler(&self) -> Option<Sampler> {
        self.inner.as_ref().map(|i| i.sampler)
    }

    /// Queues ended spans for export; never waits.
    pub fn record(&self, spans: Vec<Span>) {
        let Some(inner) = &self.inner else {
            return;
        };
        for span in spans {
            if inner.queue.try_send(span).is_err() {
                inner.metrics.trace_spans_dropped(1);
            }
        }
    }
}

/// The OTLP/HTTP traces URL of an endpoint given as a base (`http://collector:4318`), as the
/// `OTEL_EXPORTER_OTLP_ENDPOINT` convention has it; a URL with a path is taken as it is.
fn http_traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let has_path = trimmed
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    if has_path {
        endpoint.to_string()
    } else {
        format!("{trimmed}/v1/traces")
    }
}

async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<Span>,
    metrics: Arc<Metrics>,
) {
    let scope = InstrumentationScope::builder("ax")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let mut last_warning: Option<tokio::time::Instant> = None;
    let mut batch = Vec::with_capacity(BATCH_MAX);
    loop {
        let Some(first) = spans.recv().await else {
            return;
        };
        batch.push(span_data(first, &scope));
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < BATCH_MAX {
            match tokio::time::timeout_at(deadline, spans.recv()).await {
                Ok(Some(span)) => batch.push(span_data(span, &scope)),
                Ok(None) | Err(_) => break,
            }
        }
        let count = batch.len() as u64;
        let sent =
            tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(std::mem::take(&mut batch)));
        let failure = match sent.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {EXPORT_TIMEOUT:?}")),
        };
        match failure {
            None => metrics.trace_spans_exported(count),
            Some(message) => {
                metrics.trace_spans_dropped(count);
                if last_warning.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    last_warning = Some(tokio::time::Instant::now());
                    warn!(spans = count, error = %message,
                        "the OTLP endpoint did not take task spans; they are dropped (ax_trace_spans_dropped_total)");
                }
            }
        }
    }
}

fn span_data(span: Span, scope: &InstrumentationScope) -> SpanData {
    let trace_id = TraceId::from_hex(&span.trace_id).unwrap_or(TraceId::INVALID);
    let span_id = SpanId::from_hex(&span.span_id).unwrap_or(SpanId::INVALID);
    let parent = span
        .parent_span_id
        .as_deref()
        .and_then(|p| SpanId::from_hex(p).ok())
        .unwrap_or(SpanId::INVALID);
    // Non-exhaustive, with public fields.
    let mut events = SpanEvents::default();
    events.events = span
        .events
        .into_iter()
        .map(|e| Event::new(e.name, system_time(e.time), attributes(e.attributes), 0))
        .collect();
    let mut links = SpanLinks::default();
    links.links = span
        .links
        .iter()
        .filter_map(|l| {
            let context = SpanContext::new(
                TraceId::from_hex(&l.trace_id).ok()?,
                SpanId::from_hex(&l.span_id).ok()?,
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            );
            Some(opentelemetry::trace::Link::new(context, Vec::new(), 0))
        })
        .collect();
    SpanData {
        span_context: SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: parent,
        parent_span_is_remote: span.parent_is_remote,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(span.name),
        start_time: system_time(span.start),
        end_time: system_time(span.end),
        attributes: attributes(span.attributes),
        dropped_attributes_count: 0,
        events,
        links,
        status: match span.status {
            SpanStatus::Unset => Status::Unset,
            SpanStatus::Ok => Status::Ok,
            SpanStatus::Error(message) => Status::error(message),
        },
        instrumentation_scope: scope.clone(),
    }
}

fn attributes(attributes: Vec<(&'static str, Value)>) -> Vec<KeyValue> {
    attributes
        .into_iter()
        .map(|(key, value)| match value {
            Value::Text(text) => KeyValue::new(key, text),
            Value::Int(n) => KeyValue::new(key, n),
        })
        .collect()
}

fn system_time(t: jiff::Timestamp) -> SystemTime {
    SystemTime::from(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_endpoint_without_a_path_gets_the_traces_path() {
        assert_eq!(
            http_traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://gw/otlp/v1/traces"),
            "http://gw/otlp/v1/traces"
        );
    }

    #[test]
    fn spans_keep_their_ids_times_and_status() {
        let start = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let span = Span {
            name: "attempt",
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            span_id: "b7ad6b7169203331".into(),
            parent_span_id: Some("00f067aa0ba902b7".into()),
            parent_is_remote: false,
            start,
            end: start + jiff::SignedDuration::from_secs(3),
            attributes: vec![("ax.attempt", Value::Int(2))],
            events: Vec::new(),
            links: Vec::new(),
            status: SpanStatus::Error("Failed: exit 1".into()),
        };
        let data = span_data(span, &InstrumentationScope::builder("ax").build());
        assert_eq!(
            data.span_context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(data.span_context.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(data.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert_eq!(
            data.end_time.duration_since(data.start_time).unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(data.status, Status::error("Failed: exit 1"));
        assert_eq!(data.attributes, vec![KeyValue::new("ax.attempt", 2i64)]);
    }
}
