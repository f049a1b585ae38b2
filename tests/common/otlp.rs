//! A real OTLP trace receiver for tests: it listens on OTLP/HTTP (protobuf, `POST /v1/traces`)
//! and on OTLP/gRPC (`TraceService/Export`), decodes every export request with the generated
//! OpenTelemetry protobuf types and keeps the spans, so a test can assert on exactly what an
//! exporter put on the wire.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One span as the receiver decoded it; ids are lowercase hex, attribute values are text.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// Lowercase hex, 32 characters.
    pub trace_id: String,
    /// Lowercase hex, 16 characters.
    pub span_id: String,
    /// Lowercase hex, `""` when the span has no parent.
    pub parent_span_id: String,
    pub name: String,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    /// Every `AnyValue` rendered as text: strings as-is, ints, doubles and bools via `to_string`.
    pub attributes: BTreeMap<String, String>,
    /// `(name, time_unix_nanos)` of each event, in the order sent.
    pub events: Vec<(String, u64)>,
    /// The attributes of each event, one map per entry of `events`, same order.
    pub event_attributes: Vec<BTreeMap<String, String>>,
    /// `(trace_id, span_id)` of each link, lowercase hex.
    pub links: Vec<(String, String)>,
    /// The OTLP status code: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    /// The resource attributes of the batch the span came in.
    pub resource: BTreeMap<String, String>,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    requests: usize,
}

#[derive(Clone, Default)]
struct Store(Arc<Mutex<Received>>);

impl Store {
    fn lock(&self) -> MutexGuard<'_, Received> {
        // A test that panicked while holding the lock must not hide what was received.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, request: ExportTraceServiceRequest) {
        let mut spans = Vec::new();
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|resource| attributes(&resource.attributes))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    spans.push(ReceivedSpan {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name,
                        start_unix_nanos: span.start_time_unix_nano,
                        end_unix_nanos: span.end_time_unix_nano,
                        attributes: attributes(&span.attributes),
                        events: span
                            .events
                            .iter()
                            .map(|event| (event.name.clone(), event.time_unix_nano))
                            .collect(),
                        event_attributes: span
                            .events
                            .iter()
                            .map(|event| attributes(&event.attributes))
                            .collect(),
                        links: span
                            .links
                            .iter()
                            .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                            .collect(),
                        status_code: span.status.map_or(0, |status| status.code),
                        resource: resource.clone(),
                    });
                }
            }
        }
        let mut received = self.lock();
        received.requests += 1;
        received.spans.extend(spans);
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), any_value(kv.value.as_ref())))
        .collect()
}

fn any_value(value: Option<&AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        // A string-table index only means something in the profiling signal: treat as absent.
        None | Some(Value::StringValueStrindex(_)) => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(bytes)) => hex(bytes),
        Some(Value::ArrayValue(array)) => {
            let items: Vec<String> = array.values.iter().map(|v| any_value(Some(v))).collect();
            format!("[{}]", items.join(", "))
        }
        Some(Value::KvlistValue(list)) => {
            let items: Vec<String> = list
                .values
                .iter()
                .map(|kv| format!("{}={}", kv.key, any_value(kv.value.as_ref())))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// `POST /v1/traces`: a protobuf `ExportTraceServiceRequest` in, an `ExportTraceServiceResponse`
/// out (OTLP/HTTP binary encoding).
async fn http_export(store: Store, headers: HeaderMap, body: Bytes) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/x-protobuf") {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("this receiver takes application/x-protobuf, not {content_type:?}"),
        )
            .into_response();
    }
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            store.record(request);
            (
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
                .into_response()
        }
        Err(err) => (
            StatusCode::BAD_REQUEST,
            format!("not an ExportTraceServiceRequest: {err}"),
        )
            .into_response(),
    }
}

struct GrpcTraceService(Store);

#[tonic::async_trait]
impl TraceService for GrpcTraceService {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP trace receiver on two loopback ports, serving in background tokio tasks.
pub struct OtlpReceiver {
    store: Store,
    http_port: u16,
    grpc_port: u16,
    http_task: JoinHandle<()>,
    grpc_task: JoinHandle<()>,
}

impl OtlpReceiver {
    /// Binds 127.0.0.1:0 twice: one OTLP/HTTP (protobuf, `POST /v1/traces`) and one OTLP/gRPC
    /// (`TraceService/Export`) listener, serving in background tokio tasks.
    pub async fn start() -> OtlpReceiver {
        let store = Store::default();

        let http_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP/HTTP listener");
        let http_port = http_listener.local_addr().unwrap().port();
        let http_store = store.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |headers: HeaderMap, body: Bytes| http_export(http_store, headers, body)),
        );
        // Aborting this task drops the listener and `axum::serve`'s shutdown watch, which makes
        // every open connection shut down gracefully (idle keep-alive connections close at once).
        let http_task = tokio::spawn(async move {
            axum::serve(http_listener, app)
                .await
                .expect("serve OTLP/HTTP");
        });

        let grpc_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP/gRPC listener");
        let grpc_port = grpc_listener.local_addr().unwrap().port();
        let service = TraceServiceServer::new(GrpcTraceService(store.clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(grpc_listener);
        // The shutdown signal never fires, but its presence puts tonic in graceful mode: aborting
        // this task drops the listener and the connections' shutdown watch, so every open HTTP/2
        // connection is sent GOAWAY and closes instead of outliving the receiver.
        let grpc_task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, std::future::pending())
                .await
                .expect("serve OTLP/gRPC");
        });

        OtlpReceiver {
            store,
            http_port,
            grpc_port,
            http_task,
            grpc_task,
        }
    }

    /// The full OTLP/HTTP traces URL, e.g. `http://127.0.0.1:PORT/v1/traces`.
    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.http_port)
    }

    /// The OTLP/gRPC endpoint, e.g. `http://127.0.0.1:PORT`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store.lock().spans.clone()
    }

    /// The spans of one trace (`trace_id` in hex, either case), in arrival order.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.store
            .lock()
            .spans
            .iter()
            .filter(|span| span.trace_id.eq_ignore_ascii_case(trace_id))
            .cloned()
            .collect()
    }

    /// Export requests received and decoded so far, over both protocols.
    pub fn requests(&self) -> usize {
        self.store.lock().requests
    }

    /// Aborts the server tasks, which closes both listeners and shuts their connections down.
    pub fn stop(self) {
        self.http_task.abort();
        self.grpc_task.abort();
    }
}
