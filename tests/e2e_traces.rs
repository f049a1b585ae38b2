//! Task traces through a real OTLP receiver (tests/common/otlp.rs decodes what the operator's
//! exporter sends): a retried task is one trace under its submitter's span, its worker knows its
//! attempt's span, the trace survives an operator SIGKILL, a DAG's tasks are children of the DAG's
//! span, and an endpoint that is down costs dropped spans, never a task. This test starts its own
//! operators (e2e/run-tests.sh stops the shared one first).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ax::api::{AxDag, AxTask, DagPhase, TaskPhase};
use ax::core::trace::{SpanOf, span_id};
use common::otlp::{OtlpReceiver, ReceivedSpan};
use common::process::Operator;
use common::sim::{SimWorker, sim_task_spec, sim_task_with};
use common::*;
use kube::api::{Api, PostParams};
use serde_json::json;

const SUBMITTER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SUBMITTER_SPAN: &str = "00f067aa0ba902b7";

/// The callback receiver's address: loopback, which the operator calls only because its allowlist
/// names it.
const CALLBACK_RECEIVER_IP: &str = "127.0.0.2";

fn operator(identity: &str, endpoint: &str) -> Operator {
    operator_over(identity, endpoint, "http")
}

fn operator_over(identity: &str, endpoint: &str, protocol: &str) -> Operator {
    Operator::builder(identity)
        .log("operator-traces.log")
        .env("AX_TRACE_ENDPOINT", endpoint)
        .env("AX_TRACE_PROTOCOL", protocol)
        .env("AX_TRACE_SAMPLER", "parentbased")
        .env("AX_CALLBACK_ALLOW", &format!("{CALLBACK_RECEIVER_IP}/32"))
        .http_port()
        .start()
}

/// A task on the real kubelet whose worker fails until attempt `succeeds_at`, leaving the
/// `TRACEPARENT` it was given as its termination message.
fn retried(name: &str, succeeds_at: i32, backoff_seconds: i64) -> AxTask {
    example("hello.yaml", name, |v| {
        v["spec"]["retry"] = json!({
            "maxRetries": 3,
            "backoff": {"baseSeconds": backoff_seconds, "factor": 1.0, "jitterMillis": 0},
        });
        v["spec"]["template"]["spec"]["containers"][0]["command"] = json!([
            "sh",
            "-c",
            format!(
                "echo \"$TRACEPARENT\" > /dev/termination-log; [ \"$AX_ATTEMPT\" -ge {succeeds_at} ]"
            )
        ]);
    })
}

/// The spans of `trace_id` once `done` holds for them, or a panic showing what came.
async fn wait_spans(
    receiver: &OtlpReceiver,
    trace_id: &str,
    done: impl Fn(&[ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    let deadline = Instant::now() + LONG;
    loop {
        let spans = receiver.trace(trace_id);
        if done(&spans) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "trace {trace_id} incomplete; got {} spans: {spans:#?}\nall: {} spans in {} requests",
            spans.len(),
            receiver.spans().len(),
            receiver.requests()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn trace_of(task: &AxTask) -> ax::api::TraceContext {
    task.status
        .as_ref()
        .and_then(|s| s.trace.clone())
        .expect("status.trace")
}

/// Attempt spans in order of attempt, checked to be children of `run` with attempt numbers 1..
fn attempts<'a>(spans: &'a [ReceivedSpan], run: &str) -> Vec<&'a ReceivedSpan> {
    let mut attempts = named(spans, "attempt");
    attempts.sort_by_key(|s| s.attributes["ax.attempt"].parse::<i32>().unwrap());
    for (i, span) in attempts.iter().enumerate() {
        assert_eq!(
            span.attributes["ax.attempt"],
            (i + 1).to_string(),
            "{span:#?}"
        );
        assert_eq!(span.parent_span_id, run, "{span:#?}");
        assert!(span.start_unix_nanos <= span.end_unix_nanos);
    }
    attempts
}

#[tokio::test]
async fn a_retried_task_is_one_trace_under_its_submitter_and_its_worker_knows_its_attempt() {
    let client = client().await;
    let ns = namespace(&client, "traces").await;
    let receiver = OtlpReceiver::start().await;
    let _operator = operator("traces-a", &receiver.http_endpoint());

    let mut task = retried("retried", 3, 1);
    task.metadata.annotations = Some(BTreeMap::from([(
        "ax.dev/traceparent".to_string(),
        format!("00-{SUBMITTER_TRACE}-{SUBMITTER_SPAN}-01"),
    )]));
    create(&client, &ns, &task).await;
    let done = wait_phase(&client, &ns, "retried", TaskPhase::Succeeded, LONG).await;
    let trace = trace_of(&done);
    assert_eq!(trace.trace_id, SUBMITTER_TRACE);
    assert_eq!(trace.parent_span_id.as_deref(), Some(SUBMITTER_SPAN));
    assert!(trace.sampled);

    let spans = wait_spans(&receiver, SUBMITTER_TRACE, |s| !named(s, "task").is_empty()).await;
    let uid = done.metadata.uid.clone().unwrap();
    let run = span_id(SUBMITTER_TRACE, &uid, SpanOf::Run(0));
    let tasks = named(&spans, "task");
    assert_eq!(tasks.len(), 1, "{spans:#?}");
    let task_span = tasks[0];
    assert_eq!(task_span.span_id, run);
    assert_eq!(
        task_span.parent_span_id, SUBMITTER_SPAN,
        "the submitter's span is the parent"
    );
    assert_eq!(task_span.attributes["ax.phase"], "Succeeded");
    assert_eq!(task_span.status_code, 1, "Ok");
    assert_eq!(task_span.resource["service.name"], "ax-operator");

    let queued = named(&spans, "queued");
    assert_eq!(queued.len(), 1, "{spans:#?}");
    assert_eq!(queued[0].parent_span_id, run);
    assert_eq!(named(&spans, "backoff").len(), 2, "{spans:#?}");

    let attempts = attempts(&spans, &run);
    assert_eq!(attempts.len(), 3, "{spans:#?}");
    for failed in &attempts[..2] {
        assert_eq!(failed.attributes["ax.outcome"], "Failed");
        assert_eq!(failed.attributes["ax.exit_code"], "1");
        assert_eq!(failed.status_code, 2, "Error");
    }
    assert_eq!(attempts[2].attributes["ax.outcome"], "Succeeded");
    assert_eq!(attempts[2].status_code, 1);
    assert_eq!(
        attempts[2].attributes["k8s.pod.name"],
        ax::core::worker::pod_name("retried", 3)
    );
    // In order: queued, then each attempt after the one before.
    assert!(queued[0].end_unix_nanos <= attempts[0].start_unix_nanos);
    assert!(attempts[0].end_unix_nanos <= attempts[1].start_unix_nanos);
    assert!(attempts[1].end_unix_nanos <= attempts[2].start_unix_nanos);
    assert_eq!(
        spans.len(),
        7,
        "queued, 2 backoffs, 3 attempts, the task: {spans:#?}"
    );

    // Each worker was told its attempt's span: the failed ones said so in their termination
    // message, and attempt 3's pod carries it.
    let history = history(&done);
    for attempt in [&attempts[0], &attempts[1]] {
        let told = format!("00-{SUBMITTER_TRACE}-{}-01", attempt.span_id);
        assert!(
            history.iter().any(|h| h.message.contains(&told)),
            "no history entry carries {told}: {history:#?}"
        );
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods
        .get(&ax::core::worker::pod_name("retried", 3))
        .await
        .unwrap();
    let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
    let traceparent = env.iter().find(|e| e.name == "TRACEPARENT").unwrap();
    assert_eq!(
        traceparent.value.as_deref(),
        Some(format!("00-{SUBMITTER_TRACE}-{}-01", attempts[2].span_id).as_str())
    );

    // kubectl ax describe names the trace.
    let described = common::cli::ax(&ns, &["describe", "retried"]).ok();
    assert!(
        described.stdout.contains(SUBMITTER_TRACE),
        "{}",
        described.stdout
    );
}

#[tokio::test]
async fn the_trace_survives_an_operator_sigkill_between_attempts() {
    let client = client().await;
    let ns = namespace(&client, "traces-kill").await;
    let receiver = OtlpReceiver::start().await;
    let mut first = operator("traces-b", &receiver.http_endpoint());

    // Its own trace (no traceparent): derived from its uid, the same in every operator.
    create(&client, &ns, &retried("killed", 2, 15)).await;
    let failed_once = wait_task(&client, &ns, "killed", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.retries == 1)
    })
    .await;
    let trace = trace_of(&failed_once);
    wait_spans(&receiver, &trace.trace_id, |s| {
        !named(s, "attempt").is_empty()
    })
    .await;
    first.sigkill();

    let _second = operator("traces-c", &receiver.http_endpoint());
    let done = wait_phase(&client, &ns, "killed", TaskPhase::Succeeded, LONG).await;
    assert_eq!(trace_of(&done), trace, "the trace is kept in the status");
    let spans = wait_spans(&receiver, &trace.trace_id, |s| !named(s, "task").is_empty()).await;
    let run = span_id(&trace.trace_id, &done.metadata.uid.unwrap(), SpanOf::Run(0));
    let attempts = attempts(&spans, &run);
    assert_eq!(
        attempts.len(),
        2,
        "attempt 1 before the kill, 2 after: {spans:#?}"
    );
    assert_eq!(named(&spans, "backoff").len(), 1, "{spans:#?}");
    assert_eq!(named(&spans, "task")[0].parent_span_id, "", "a root span");
    assert_eq!(named(&spans, "task")[0].span_id, run);
}

#[tokio::test]
async fn a_dags_tasks_are_children_of_its_span_over_grpc() {
    let client = client().await;
    let ns = namespace(&client, "traces-dag").await;
    let receiver = OtlpReceiver::start().await;
    // This one exports over gRPC.
    let _operator = operator_over("traces-d", &receiver.grpc_endpoint(), "grpc");

    let worker = SimWorker::running_for(300).start_ms(100);
    let dag: AxDag = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxDag",
        "metadata": {"name": "flow"},
        "spec": {"tasks": [
            {"name": "a", "spec": sim_task_spec("trace-a", &worker)},
            {"name": "b", "dependsOn": ["a"], "spec": sim_task_spec("trace-b", &worker)},
        ]},
    }))
    .unwrap();
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&PostParams::default(), &dag).await.unwrap();
    let done = wait_for(&client, &ns, "flow", LONG, |d: &AxDag| {
        d.status.as_ref().and_then(|s| s.phase) == Some(DagPhase::Succeeded)
    })
    .await;
    let trace = done.status.unwrap().trace.expect("the DAG's status.trace");
    let spans = wait_spans(&receiver, &trace.trace_id, |s| {
        named(s, "dag").len() == 1 && named(s, "task").len() == 2
    })
    .await;
    let dag_span = named(&spans, "dag")[0];
    assert_eq!(dag_span.parent_span_id, "");
    assert_eq!(dag_span.attributes["ax.phase"], "Succeeded");
    for task in named(&spans, "task") {
        assert_eq!(task.parent_span_id, dag_span.span_id, "{task:#?}");
    }
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let child = tasks.get("flow-a").await.unwrap();
    assert_eq!(trace_of(&child).trace_id, trace.trace_id);
}

#[tokio::test]
async fn an_endpoint_that_is_down_drops_spans_and_tasks_run_as_usual() {
    let client = client().await;
    let ns = namespace(&client, "traces-down").await;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let operator = operator("traces-e", &endpoint);

    let worker = SimWorker::running_for(200).start_ms(100);
    let names: Vec<String> = (0..20).map(|i| format!("down-{i}")).collect();
    create_all(
        &client,
        &ns,
        names
            .iter()
            .map(|n| sim_task_with(n, "trace-down", &worker, |_| {}))
            .collect(),
    )
    .await;
    for name in &names {
        let done = wait_phase(&client, &ns, name, TaskPhase::Succeeded, LONG).await;
        assert!(trace_of(&done).sampled);
    }
    // Each task ended 3 spans (queued, attempt, task); every one is dropped and counted.
    let deadline = Instant::now() + LONG;
    loop {
        let text = operator.metrics().await.unwrap_or_default();
        let samples = common::metrics::parse_metrics(&text);
        let dropped = common::metrics::metric_value(&samples, "ax_trace_spans_dropped_total", &[])
            .unwrap_or(0.0);
        let exported =
            common::metrics::metric_value(&samples, "ax_trace_spans_exported_total", &[])
                .unwrap_or(0.0);
        assert_eq!(exported, 0.0);
        if dropped >= 60.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{dropped} spans dropped, not 60:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_crons_child_links_to_its_firing_and_a_callback_joins_the_trace() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let client = client().await;
    let ns = namespace(&client, "traces-cron").await;
    let receiver = OtlpReceiver::start().await;
    let _operator = operator("traces-f", &receiver.http_endpoint());

    // The callback receiver answers every POST and keeps their heads (a second firing may come
    // before the cron is suspended).
    let listener = tokio::net::TcpListener::bind((CALLBACK_RECEIVER_IP, 0))
        .await
        .unwrap();
    let url = format!(
        "http://{CALLBACK_RECEIVER_IP}:{}/done",
        listener.local_addr().unwrap().port()
    );
    let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let received = requests.clone();
    let server = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !String::from_utf8_lossy(&request).contains("\r\n\r\n") {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
            received
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&request).to_lowercase());
        }
    });

    let worker = SimWorker::running_for(200).start_ms(100);
    let cron: ax::api::AxCron = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxCron",
        "metadata": {"name": "tick"},
        "spec": {
            "schedule": "*/3 * * * * *",
            "task": {
                "type": "trace-cron",
                "template": {"spec": worker.pod_spec()},
                "callback": {"url": url},
            },
        },
    }))
    .unwrap();
    let crons: Api<ax::api::AxCron> = Api::namespaced(client.clone(), &ns);
    crons.create(&PostParams::default(), &cron).await.unwrap();
    // The first child; then no more.
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + LONG;
    let child = loop {
        let list = tasks.list(&Default::default()).await.unwrap().items;
        if let Some(child) = list.into_iter().next() {
            break child.metadata.name.unwrap();
        }
        assert!(Instant::now() < deadline, "the cron never fired");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    crons
        .patch(
            "tick",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();

    let done = wait_task(&client, &ns, &child, LONG, |t| {
        t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "CallbackDelivered" && c.status == "True")
        })
    })
    .await;
    let trace = trace_of(&done);
    let link = trace
        .link
        .clone()
        .expect("status.trace.link names the firing");
    assert_eq!(trace.parent_span_id, None);

    // The firing is a trace of its own, whose span the child's run links to.
    let firing = wait_spans(&receiver, &link.trace_id, |s| !s.is_empty()).await;
    assert_eq!(firing.len(), 1, "{firing:#?}");
    assert_eq!(firing[0].name, "cron");
    assert_eq!(firing[0].span_id, link.span_id);
    assert_eq!(firing[0].attributes["ax.cron"], "tick");
    assert_eq!(firing[0].attributes["ax.child"], child);

    let spans = wait_spans(&receiver, &trace.trace_id, |s| {
        !named(s, "task").is_empty() && !named(s, "callback").is_empty()
    })
    .await;
    let uid = done.metadata.uid.clone().unwrap();
    let run = span_id(&trace.trace_id, &uid, SpanOf::Run(0));
    let task_span = named(&spans, "task")[0];
    assert_eq!(
        task_span.links,
        [(link.trace_id.clone(), link.span_id.clone())]
    );
    let callback = named(&spans, "callback")[0];
    assert_eq!(callback.parent_span_id, run);
    assert_eq!(callback.attributes["ax.outcome"], "delivered");
    server.abort();
    let requests = requests.lock().unwrap().clone();
    let told = format!("traceparent: 00-{}-{}-01", trace.trace_id, callback.span_id);
    assert!(
        requests.iter().any(|r| r.contains(&told)),
        "{told} in none of:\n{requests:#?}"
    );
}
