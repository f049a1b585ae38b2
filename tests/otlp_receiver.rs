//! The test OTLP receiver (tests/common/otlp.rs) decodes exactly what the real OpenTelemetry
//! exporter sends, over OTLP/HTTP and over OTLP/gRPC. No cluster needed.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::otlp::{OtlpReceiver, ReceivedSpan};
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const LINK_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const LINK_SPAN_ID: &str = "b7ad6b7169203331";

const START: u64 = 1_700_000_000_123_456_789;
const EVENT_AT: u64 = START + 250_000_000;
const END: u64 = START + 1_500_000_001;

fn at(unix_nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(unix_nanos)
}

/// One finished span, built by hand so every id and time is known.
fn span(span_id: &str, name: &'static str) -> SpanData {
    // Both are non-exhaustive, so they are filled in rather than written as literals.
    let mut events = SpanEvents::default();
    events.events.push(Event::new(
        "dispatched",
        at(EVENT_AT),
        vec![KeyValue::new("ax.node", "node-a")],
        0,
    ));
    let mut links = SpanLinks::default();
    links.links.push(Link::with_context(SpanContext::new(
        TraceId::from_hex(LINK_TRACE_ID).unwrap(),
        SpanId::from_hex(LINK_SPAN_ID).unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    )));
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_hex(TRACE_ID).unwrap(),
            SpanId::from_hex(span_id).unwrap(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::from_hex(PARENT_ID).unwrap(),
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: name.into(),
        start_time: at(START),
        end_time: at(END),
        attributes: vec![
            KeyValue::new("ax.task", "demo/build"),
            KeyValue::new("ax.attempt", 2_i64),
            KeyValue::new("ax.retried", true),
            KeyValue::new("ax.share", 0.25_f64),
        ],
        dropped_attributes_count: 0,
        events,
        links,
        status: Status::error("exit code 3"),
        instrumentation_scope: InstrumentationScope::builder("ax").build(),
    }
}

fn resource(protocol: &'static str) -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "ax-operator"),
            KeyValue::new("test.protocol", protocol),
        ])
        .build()
}

fn assert_span(got: &ReceivedSpan, span_id: &str, name: &str, protocol: &str) {
    assert_eq!(got.trace_id, TRACE_ID);
    assert_eq!(got.span_id, span_id);
    assert_eq!(got.parent_span_id, PARENT_ID);
    assert_eq!(got.name, name);
    assert_eq!(got.start_unix_nanos, START);
    assert_eq!(got.end_unix_nanos, END);
    let attributes: BTreeMap<String, String> = [
        ("ax.task", "demo/build"),
        ("ax.attempt", "2"),
        ("ax.retried", "true"),
        ("ax.share", "0.25"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(got.attributes, attributes);
    assert_eq!(got.events, vec![("dispatched".to_string(), EVENT_AT)]);
    assert_eq!(
        got.event_attributes,
        vec![BTreeMap::from([(
            "ax.node".to_string(),
            "node-a".to_string()
        )])]
    );
    assert_eq!(
        got.links,
        vec![(LINK_TRACE_ID.to_string(), LINK_SPAN_ID.to_string())]
    );
    assert_eq!(
        got.status_code, 2,
        "Status::error is OTLP STATUS_CODE_ERROR"
    );
    assert_eq!(
        got.resource.get("service.name").map(String::as_str),
        Some("ax-operator")
    );
    assert_eq!(
        got.resource.get("test.protocol").map(String::as_str),
        Some(protocol)
    );
}

#[tokio::test]
async fn receiver_decodes_what_the_otlp_exporter_sends() {
    let receiver = OtlpReceiver::start().await;
    assert_eq!(receiver.requests(), 0);

    let mut http = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(receiver.http_endpoint())
        .with_timeout(Duration::from_secs(5))
        .build()
        .expect("build the OTLP/HTTP exporter");
    http.set_resource(&resource("http"));
    http.export(vec![span("1111111111111111", "attempt over http")])
        .await
        .expect("export over OTLP/HTTP");
    assert_eq!(receiver.requests(), 1);

    let mut grpc = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.grpc_endpoint())
        .with_timeout(Duration::from_secs(5))
        .build()
        .expect("build the OTLP/gRPC exporter");
    grpc.set_resource(&resource("grpc"));
    grpc.export(vec![span("2222222222222222", "attempt over grpc")])
        .await
        .expect("export over OTLP/gRPC");
    assert_eq!(receiver.requests(), 2);

    let spans = receiver.spans();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_span(&spans[0], "1111111111111111", "attempt over http", "http");
    assert_span(&spans[1], "2222222222222222", "attempt over grpc", "grpc");

    let trace = receiver.trace(TRACE_ID);
    assert_eq!(
        trace.iter().map(|s| s.span_id.as_str()).collect::<Vec<_>>(),
        ["1111111111111111", "2222222222222222"]
    );
    assert!(receiver.trace(LINK_TRACE_ID).is_empty());

    // Once stopped, the receiver refuses exports, even from an exporter that still holds a
    // keep-alive connection to it.
    receiver.stop();
    let refused = http
        .export(vec![span("3333333333333333", "attempt after stop")])
        .await;
    assert!(
        refused.is_err(),
        "an export to a stopped receiver must fail, got {refused:?}"
    );
}

#[tokio::test]
async fn receiver_rejects_bodies_that_are_not_export_requests() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let receiver = OtlpReceiver::start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let post = |content_type: &'static str, body: &'static [u8]| {
        hyper::Request::post(receiver.http_endpoint())
            .header("content-type", content_type)
            .body(Full::new(bytes::Bytes::from_static(body)))
            .unwrap()
    };

    // 0xff is not a valid protobuf tag.
    let garbage = client
        .request(post("application/x-protobuf", b"\xff\xff\xff"))
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);

    let empty = client
        .request(post("application/x-protobuf", b""))
        .await
        .unwrap();
    assert_eq!(empty.status(), 200, "an empty message is a valid request");
    assert_eq!(
        empty
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/x-protobuf")
    );
    let body = empty.into_body().collect().await.unwrap().to_bytes();
    assert!(
        <opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse as prost::Message>::decode(body).is_ok()
    );

    let text = client.request(post("text/plain", b"hello")).await.unwrap();
    assert_eq!(text.status(), 415);

    assert_eq!(receiver.requests(), 1, "only the decoded request counts");
    assert!(receiver.spans().is_empty());
    receiver.stop();
}
