//! The AxTask lifecycle on the real cluster (real kubelet), driven through the API server with the
//! operator started by e2e/run-tests.sh.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ax::api::{AxTask, AxTaskStatus, Condition, FailureKind, TaskPhase};
use common::sim::{SimWorker, sim_task_with};
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

/// A fresh namespace for `test` holding the example `file` as task `name`, once that is in phase
/// `want`: (the client, the namespace, the task as it was then).
async fn example_in_phase(
    test: &str,
    file: &str,
    name: &str,
    want: TaskPhase,
) -> (Client, String, AxTask) {
    let client = client().await;
    let ns = namespace(&client, test).await;
    create(&client, &ns, &example(file, name, |_| {})).await;
    let task = wait_phase(&client, &ns, name, want, LONG).await;
    (client, ns, task)
}

/// Waits until the task's callback has an outcome: (its status then, the CallbackDelivered
/// condition).
async fn wait_callback_outcome(client: &Client, ns: &str, name: &str) -> (AxTaskStatus, Condition) {
    let delivered = |s: &AxTaskStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "CallbackDelivered")
            .cloned()
    };
    let t = wait_task(client, ns, name, LONG, |t| {
        t.status.as_ref().and_then(delivered).is_some()
    })
    .await;
    let s = t.status.expect("a status");
    let condition = delivered(&s).expect("the CallbackDelivered condition");
    (s, condition)
}

#[tokio::test]
async fn succeeds_on_the_first_attempt() {
    let (client, ns, t) =
        example_in_phase("hello", "hello.yaml", "hello", TaskPhase::Succeeded).await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.retries), (1, 0));
    assert_eq!(s.worker.as_deref(), Some("hello-1"));
    assert_eq!(s.node.as_deref(), Some("localhost"));
    assert!(s.finished_at.is_some() && s.queued_at.is_some());
    let p = phases(&t);
    assert_eq!(p.first(), Some(&TaskPhase::Pending));
    assert_eq!(p.get(1), Some(&TaskPhase::Scheduled));
    assert_eq!(p.last(), Some(&TaskPhase::Succeeded));
    assert_history_chain(&t);
    let ready = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True");
    wait_events(&client, &ns, "hello", &["Completed"]).await;

    // The worker saw its identity and payload, as env and as a file.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods.get("hello-1").await.unwrap();
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels["ax.dev/task"], "hello");
    assert_eq!(labels["ax.dev/attempt"], "1");
    assert_eq!(labels["ax.dev/type"], "hello");
    assert_eq!(
        pod.metadata.owner_references.unwrap()[0].uid,
        t.metadata.uid.clone().unwrap()
    );
    let logs = pods.logs("hello-1", &LogParams::default()).await.unwrap();
    assert!(logs.contains("task=hello attempt=1"), "{logs}");
    assert!(logs.contains(r#"{"greeting":"hello from ax"}"#), "{logs}");
}

#[tokio::test]
async fn retries_with_growing_backoff_until_success() {
    let (client, ns, t) =
        example_in_phase("retry", "retry.yaml", "flaky", TaskPhase::Succeeded).await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.retries), (3, 2), "{:#?}", s.history);
    assert_history_chain(&t);
    let h = history(&t);
    // Gap between each failure and the next dispatch: at least the backoff (1 s, then 3 s).
    let failed: Vec<_> = h
        .iter()
        .filter(|e| e.to == TaskPhase::Failed)
        .map(|e| e.time)
        .collect();
    let dispatched: Vec<_> = h
        .iter()
        .filter(|e| e.to == TaskPhase::Scheduled)
        .map(|e| e.time)
        .collect();
    assert_eq!((failed.len(), dispatched.len()), (2, 3), "{h:#?}");
    let gap1 = dispatched[1].duration_since(failed[0]);
    let gap2 = dispatched[2].duration_since(failed[1]);
    assert!(gap1.as_secs_f64() >= 1.0, "gap1 {gap1:?}");
    assert!(gap2.as_secs_f64() >= 3.0, "gap2 {gap2:?}");
    assert!(gap2 > gap1, "gaps grow: {gap1:?} then {gap2:?}");
    assert_eq!(s.last_failure.unwrap().kind, FailureKind::Retryable);
    wait_events(&client, &ns, "flaky", &["ExitCode", "Completed"]).await;
    // One pod per attempt, named by attempt.
    let mut pods: Vec<String> = pods_of(&client, &ns, "flaky")
        .await
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    pods.sort();
    assert_eq!(pods, vec!["flaky-1", "flaky-2", "flaky-3"]);
}

#[tokio::test]
async fn exit_code_rule_dead_ends_after_one_attempt() {
    let (client, ns, t) = example_in_phase(
        "deadrule",
        "dead-on-exit-code.yaml",
        "bad-input",
        TaskPhase::Dead,
    )
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.retries), (1, 0));
    let failure = s.last_failure.unwrap();
    assert_eq!(
        (failure.kind, failure.exit_code, failure.reason.as_str()),
        (FailureKind::NonRetryable, Some(42), "ExitCodeRule")
    );
    assert!(s.dead_reason.unwrap().contains("not retryable"));
    assert_eq!(phases(&t).last(), Some(&TaskPhase::Dead));
    assert!(phases(&t).contains(&TaskPhase::Failed));
    wait_events(&client, &ns, "bad-input", &["ExitCodeRule", "NonRetryable"]).await;
}

#[tokio::test]
async fn business_error_is_not_retried() {
    let (_, _, t) =
        example_in_phase("biz", "business-error.yaml", "charge-card", TaskPhase::Dead).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.attempt, 1);
    let failure = s.last_failure.unwrap();
    assert_eq!(
        (failure.kind, failure.reason.as_str()),
        (FailureKind::NonRetryable, "BusinessError")
    );
    assert_eq!(failure.message, "card declined");
    assert_eq!(failure.exit_code, Some(1));
}

#[tokio::test]
async fn always_failing_task_dies_after_max_retries() {
    let (client, ns, t) = example_in_phase(
        "exhaust",
        "always-fails.yaml",
        "always-fails",
        TaskPhase::Dead,
    )
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.retries), (3, 2));
    let dead = s.dead_reason.clone().unwrap();
    assert!(dead.contains("all 2 retries used"), "{dead}");
    assert_eq!(
        t.status.as_ref().unwrap().reason.as_deref(),
        Some("RetriesExhausted")
    );
    assert_history_chain(&t);
    let failures = phases(&t)
        .iter()
        .filter(|p| **p == TaskPhase::Failed)
        .count();
    assert_eq!(failures, 3);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Dead")
    );
    wait_events(&client, &ns, "always-fails", &["RetriesExhausted"]).await;
    // Each failed attempt is told once (an Event each: their notes name the attempt).
    wait_event_occurrences(&client, &ns, "always-fails", "ExitCode", 3).await;
}

/// `kubectl wait --for=condition=TYPE KIND/NAME`, off the async test's thread: whether it ended
/// in time, and what it said.
async fn kubectl_wait(ns: &str, condition: &str, object: &str) -> (bool, String) {
    let args = [
        "wait".to_string(),
        "-n".into(),
        ns.into(),
        format!("--for=condition={condition}"),
        object.into(),
        "--timeout=180s".into(),
    ];
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out, err) = run_kubectl(&args, None);
        (ok, format!("{out}{err}"))
    })
    .await
    .expect("kubectl wait thread")
}

#[tokio::test]
async fn kubectl_wait_ends_on_failed_for_a_dead_task_and_on_ready_for_a_succeeded_one() {
    let client = client().await;
    let ns = namespace(&client, "kubectl-wait").await;
    let doomed = example("always-fails.yaml", "doomed", |t| {
        t["spec"]["retry"]["maxRetries"] = serde_json::json!(0);
    });
    create_all(
        &client,
        &ns,
        vec![doomed, example("hello.yaml", "fine", |_| {})],
    )
    .await;
    // Both started before either condition exists: each wait ends only when its condition does.
    let (failed, ready) = tokio::join!(
        kubectl_wait(&ns, "Failed", "axtask/doomed"),
        kubectl_wait(&ns, "Ready", "axtask/fine"),
    );
    assert!(
        failed.0,
        "kubectl wait --for=condition=Failed: {}",
        failed.1
    );
    assert!(ready.0, "kubectl wait --for=condition=Ready: {}", ready.1);
    let doomed = wait_phase(&client, &ns, "doomed", TaskPhase::Dead, LONG).await;
    let failed = doomed.status.as_ref().unwrap().condition("Failed").unwrap();
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_str()),
        ("True", "Dead")
    );
    let fine = wait_phase(&client, &ns, "fine", TaskPhase::Succeeded, LONG).await;
    assert!(
        fine.status.unwrap().condition("Failed").is_none(),
        "a task that never went Dead has no Failed condition"
    );
}

#[tokio::test]
async fn hard_timeout_kills_the_worker_and_retries() {
    let (client, ns, t) =
        example_in_phase("hard", "hard-timeout.yaml", "hangs", TaskPhase::Dead).await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.retries), (2, 1), "{:#?}", s.history);
    let timed_out: Vec<_> = history(&t)
        .into_iter()
        .filter(|e| e.to == TaskPhase::TimedOut)
        .collect();
    assert_eq!(timed_out.len(), 2);
    assert!(timed_out.iter().all(|e| e.reason == "HardTimeout"));
    assert_eq!(s.last_failure.unwrap().kind, FailureKind::Timeout);
    // The hung workers were killed.
    wait_pod_gone(&client, &ns, "hangs-1", LONG).await;
    wait_pod_gone(&client, &ns, "hangs-2", LONG).await;
    wait_events(&client, &ns, "hangs", &["HardTimeout"]).await;
}

#[tokio::test]
async fn soft_timeout_on_a_healthy_worker_only_warns() {
    let (client, ns, t) =
        example_in_phase("soft", "soft-timeout.yaml", "slow", TaskPhase::Succeeded).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.attempt, 1);
    assert!(!phases(&t).contains(&TaskPhase::TimedOut));
    let events = wait_events(&client, &ns, "slow", &["SoftTimeout"]).await;
    let soft = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("SoftTimeout"))
        .unwrap();
    assert_eq!(soft.type_.as_deref(), Some("Warning"));
}

#[tokio::test]
async fn cancel_while_running_kills_the_worker() {
    let (client, ns, _) = example_in_phase(
        "cancel",
        "long-running.yaml",
        "long-job",
        TaskPhase::Running,
    )
    .await;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let patch = serde_json::json!({"spec": {"cancel": true}});
    api.patch("long-job", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let t = wait_phase(&client, &ns, "long-job", TaskPhase::Canceled, LONG).await;
    let last = history(&t).pop().unwrap();
    assert_eq!(
        (last.from, last.actor.as_str()),
        (Some(TaskPhase::Running), "user")
    );
    wait_pod_gone(&client, &ns, "long-job-1", LONG).await;
    wait_events(&client, &ns, "long-job", &["Canceled"]).await;
}

#[tokio::test]
async fn worker_deleted_by_hand_is_retried_without_using_a_retry() {
    let (client, ns, _) =
        example_in_phase("podgone", "resilient.yaml", "resilient", TaskPhase::Running).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("resilient-1", &DeleteParams::default())
        .await
        .unwrap();
    // maxRetries is 0: only an uncounted (Infrastructure) failure can lead to a second attempt.
    let t = wait_phase(&client, &ns, "resilient", TaskPhase::Succeeded, LONG).await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.retries), (2, 0), "{:#?}", s.history);
    let failure = s.last_failure.unwrap();
    assert_eq!(
        (failure.kind, failure.reason.as_str()),
        (FailureKind::Infrastructure, "WorkerDeleted")
    );
}

#[tokio::test]
async fn start_after_delays_the_first_dispatch() {
    let client = client().await;
    let ns = namespace(&client, "delayed").await;
    // Far enough ahead that a busy operator still sees the task (and says Delayed) before it.
    let start = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(25);
    let start_text = start.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let task = example("delayed.yaml", "nightly", |v| {
        v["spec"]["startAfter"] = start_text.clone().into()
    });
    create(&client, &ns, &task).await;
    let pending = wait_phase(&client, &ns, "nightly", TaskPhase::Pending, LONG).await;
    let queued = pending
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Queued")
        .unwrap()
        .clone();
    assert_eq!(
        (queued.status.as_str(), queued.reason.as_str()),
        ("False", "Delayed")
    );
    let t = wait_phase(&client, &ns, "nightly", TaskPhase::Succeeded, LONG).await;
    let scheduled = t.status.unwrap().scheduled_at.unwrap();
    let start_whole = jiff::Timestamp::from_second(start.as_second()).unwrap();
    assert!(
        scheduled >= start_whole,
        "dispatched at {scheduled}, before startAfter {start_whole}"
    );
}

#[tokio::test]
async fn ttl_deletes_the_finished_task_and_its_pods() {
    let (client, ns, t) =
        example_in_phase("ttl", "ttl.yaml", "short-lived", TaskPhase::Succeeded).await;
    let finished = t.status.unwrap().finished_at.unwrap();
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let deadline = std::time::Instant::now() + LONG;
    while api.get_opt("short-lived").await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "task not deleted after its TTL"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone_after = jiff::Timestamp::now().duration_since(finished);
    assert!(
        gone_after.as_secs_f64() >= 9.0,
        "deleted {gone_after:?} after finishing, TTL is 10 s"
    );
    // The garbage collector removes the worker pod with its owner.
    wait_pod_gone(&client, &ns, "short-lived-1", LONG).await;
}

/// The callback receiver's address: loopback, so the operator only calls it because its allowlist
/// names it (e2e/run-tests.sh starts it with `AX_CALLBACK_ALLOW=127.0.0.2/32`). Not 127.0.0.1,
/// which stays refused for `callbacks_to_the_inside_are_refused_without_a_connection`.
const CALLBACK_RECEIVER_IP: &str = "127.0.0.2";

#[tokio::test]
async fn callback_receives_the_final_status() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind((CALLBACK_RECEIVER_IP, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    // Refuse the first connection with a 503 to show the callback is retried.
    let server = tokio::spawn(async move {
        let mut bodies = Vec::new();
        for answer in ["503 Service Unavailable", "200 OK"] {
            let (mut socket, _) = listener.accept().await.unwrap();
            bodies.push(read_request(&mut socket).await);
            let response =
                format!("HTTP/1.1 {answer}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            socket.write_all(response.as_bytes()).await.unwrap();
        }
        bodies
    });

    let client = client().await;
    let ns = namespace(&client, "callback").await;
    let url = format!("http://{CALLBACK_RECEIVER_IP}:{port}/ax-done");
    create(
        &client,
        &ns,
        &example("callback.yaml", "notify-me", |v| {
            v["spec"]["callback"]["url"] = url.clone().into()
        }),
    )
    .await;
    let (s, delivered) = wait_callback_outcome(&client, &ns, "notify-me").await;
    assert_eq!(
        s.phase,
        Some(TaskPhase::Succeeded),
        "the callback never changes the phase"
    );
    assert_eq!(
        (delivered.status.as_str(), delivered.reason.as_str()),
        ("True", "Delivered"),
        "{delivered:?} (is the operator started with AX_CALLBACK_ALLOW={CALLBACK_RECEIVER_IP}/32, \
         as e2e/run-tests.sh does?)"
    );
    let bodies = tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(&bodies[1]).unwrap();
    assert_eq!(body["metadata"]["name"], "notify-me");
    assert_eq!(body["status"]["phase"], "Succeeded");
}

#[tokio::test]
async fn callbacks_to_the_inside_are_refused_without_a_connection() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A listener on 127.0.0.1, where two of the URLs point: it must never see a connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let server = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });

    let client = client().await;
    let ns = namespace(&client, "callback-refused").await;
    let targets = [
        (
            "loopback",
            format!("http://127.0.0.1:{port}/ax-done"),
            "127.0.0.1 is a loopback address",
        ),
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "169.254.169.254 is a link-local address",
        ),
        (
            "localhost",
            format!("http://localhost:{port}/ax-done"),
            "a loopback address",
        ),
    ];
    for (name, url, _) in &targets {
        let task = sim_task_with(name, "callback", &SimWorker::running_for(100), |v| {
            v["spec"]["callback"] = serde_json::json!({"url": url});
        });
        create(&client, &ns, &task).await;
    }
    for (name, url, why) in &targets {
        let (s, c) = wait_callback_outcome(&client, &ns, name).await;
        assert_eq!(
            s.phase,
            Some(TaskPhase::Succeeded),
            "{name}: the phase stays"
        );
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "CallbackRefused"),
            "{name}: {c:?}"
        );
        assert!(
            c.message.contains(url.as_str())
                && c.message.contains(why)
                && !c.message.contains("attempts"),
            "{name}: refused at once, saying why: {}",
            c.message
        );
        wait_events(&client, &ns, name, &["CallbackRefused"]).await;
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a refused callback must not connect"
    );
    server.abort();
}

/// Reads one HTTP request from `socket`: its body (after the headers, `content-length` bytes).
async fn read_request(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(split) = text.find("\r\n\r\n") {
            let len = text[..split]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .and_then(|v| v.trim().parse::<usize>().ok())
                })
                .unwrap_or(0);
            if buf.len() >= split + 4 + len {
                return text[split + 4..].to_string();
            }
        }
        if n == 0 {
            return String::new();
        }
    }
}

/// More callbacks than the operator delivers at once (64), to a receiver that holds each POST
/// 3 s and answers the first two of every task 503: each delivery takes ~10 s, so without a bound
/// nearly all of them are open at once. All arrive, never more than the bound at a time.
#[tokio::test]
async fn callbacks_beyond_the_delivery_limit_wait_their_turn_and_all_arrive() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    const TASKS: usize = 120;
    const LIMIT: usize = 64;
    let listener = tokio::net::TcpListener::bind((CALLBACK_RECEIVER_IP, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let open = Arc::new(AtomicUsize::new(0));
    let most_open = Arc::new(AtomicUsize::new(0));
    // Task name -> POSTs received.
    let posts: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let (o, m, p) = (open.clone(), most_open.clone(), posts.clone());
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (o, m, p) = (o.clone(), m.clone(), p.clone());
            tokio::spawn(async move {
                let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                let body = read_request(&mut socket).await;
                let name = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|b| b["metadata"]["name"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let seen = {
                    let mut posts = p.lock().unwrap();
                    let n = posts.entry(name).or_default();
                    *n += 1;
                    *n
                };
                // Within the operator's 5 s request timeout.
                tokio::time::sleep(Duration::from_secs(3)).await;
                let answer = if seen <= 2 {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                o.fetch_sub(1, Ordering::SeqCst);
                let response =
                    format!("HTTP/1.1 {answer}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });

    let client = client().await;
    let ns = namespace(&client, "callback-many").await;
    let queue = common::queue::create_queue(
        &client,
        "callback-many",
        serde_json::json!({"concurrency": TASKS}),
    )
    .await;
    let url = format!("http://{CALLBACK_RECEIVER_IP}:{port}/ax-done");
    let names: Vec<String> = (0..TASKS).map(|i| format!("cb-{i:03}")).collect();
    for name in &names {
        let task = sim_task_with(name, "callback", &SimWorker::running_for(200), |v| {
            v["spec"]["queue"] = queue.name.clone().into();
            v["spec"]["callback"] = serde_json::json!({"url": url});
        });
        create(&client, &ns, &task).await;
    }
    for name in &names {
        let (_, c) = wait_callback_outcome(&client, &ns, name).await;
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Delivered"),
            "{name}: {c:?}"
        );
        assert!(c.message.contains("(attempt 3)"), "{name}: {}", c.message);
    }
    let posts = posts.lock().unwrap().clone();
    for name in &names {
        assert_eq!(posts.get(name), Some(&3), "{name}: POSTs received");
    }
    let most = most_open.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT,
        "{most} callbacks under way at once, the operator's limit is {LIMIT}"
    );
    server.abort();
}

#[tokio::test]
async fn invalid_manifests_are_rejected_with_the_field_named() {
    let ns = namespace(&client().await, "invalid").await;
    let path = repo_root().join("examples/invalid-priority.yaml");
    let (ok, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", path.to_str().unwrap()], None);
    assert!(!ok, "kubectl apply accepted an invalid priority");
    assert!(
        err.contains("spec.priority") && err.contains("Urgent"),
        "{err}"
    );

    let missing_type = r#"{"apiVersion":"ax.dev/v1alpha1","kind":"AxTask","metadata":{"name":"no-type"},
        "spec":{"template":{"spec":{"containers":[{"name":"w","image":"x"}]}}}}"#;
    let (ok, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", "-"], Some(missing_type));
    // Required unless `templateRef` names a template that gives it (the schema's `anyOf`).
    assert!(!ok && err.contains("spec.type: Required value"), "{err}");

    let bad_numbers = r#"{"apiVersion":"ax.dev/v1alpha1","kind":"AxTask","metadata":{"name":"bad-numbers"},
        "spec":{"type":"Not_A_Label","timeout":{"hardSeconds":0},"retry":{"maxRetries":-1},
        "template":{"spec":{"containers":[{"name":"w","image":"x"}]}}}}"#;
    let (ok, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", "-"], Some(bad_numbers));
    assert!(!ok, "accepted");
    for field in [
        "spec.type",
        "spec.timeout.hardSeconds",
        "spec.retry.maxRetries",
    ] {
        assert!(err.contains(field), "{field} not named in: {err}");
    }

    // Values with a grammar: a DAG's task names, a queue window's times.
    let bad_dag = r#"{"apiVersion":"ax.dev/v1alpha1","kind":"AxDag","metadata":{"name":"bad-names"},
        "spec":{"tasks":[{"name":"Build_It","spec":{"type":"t",
        "template":{"spec":{"containers":[{"name":"w","image":"x"}]}}}}]}}"#;
    let (ok, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", "-"], Some(bad_dag));
    // The API server names a list item's field without its index.
    assert!(
        !ok && err.contains("spec.tasks.name") && err.contains("Build_It"),
        "{err}"
    );
    let bad_window = r#"{"apiVersion":"ax.dev/v1alpha1","kind":"AxQueue","metadata":{"name":"e2e-bad-window"},
        "spec":{"weightSchedule":[{"from":"25:00","to":"6:00","weights":{"low":9}}]}}"#;
    let (ok, _, err) = run_kubectl(&["apply", "-f", "-"], Some(bad_window));
    assert!(
        !ok && err.contains(r#"spec.weightSchedule.from: Invalid value: "25:00""#)
            && err.contains(r#"spec.weightSchedule.to: Invalid value: "6:00""#),
        "{err}"
    );
}

#[tokio::test]
async fn accepted_but_invalid_spec_goes_dead_without_running() {
    let (client, ns, t) = example_in_phase(
        "invalidspec",
        "invalid-timeouts.yaml",
        "contradictory",
        TaskPhase::Dead,
    )
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.reason.as_deref(), Some("InvalidSpec"));
    assert_eq!(s.attempt, 0, "nothing ran");
    assert!(s.dead_reason.unwrap().contains("softSeconds"));
    let events = wait_events(&client, &ns, "contradictory", &["InvalidSpec"]).await;
    assert!(events.iter().any(
        |e| e.reason.as_deref() == Some("InvalidSpec") && e.type_.as_deref() == Some("Warning")
    ));
    assert!(pods_of(&client, &ns, "contradictory").await.is_empty());

    // A payload over 256 KiB is caught the same way.
    let big = "x".repeat(300 * 1024);
    let task = example("hello.yaml", "huge-payload", |v| {
        v["spec"]["payload"] = serde_json::json!({"blob": big})
    });
    create(&client, &ns, &task).await;
    let t = wait_phase(&client, &ns, "huge-payload", TaskPhase::Dead, LONG).await;
    assert!(
        t.status
            .unwrap()
            .dead_reason
            .unwrap()
            .contains("spec.payload")
    );
}

#[tokio::test]
async fn kubectl_shows_columns_and_explains_fields() {
    let (_, ns, _) = example_in_phase("kubectl", "hello.yaml", "shown", TaskPhase::Succeeded).await;
    let (ok, out, err) = run_kubectl(&["get", "axtasks", "-n", &ns], None);
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "PHASE", "TYPE", "PRIORITY", "ATTEMPT", "WORKER", "AGE"
        ]
    );
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..6],
        ["shown", "Succeeded", "hello", "Normal", "1", "shown-1"]
    );
    let (ok, out, _) = run_kubectl(&["get", "axt", "-n", &ns, "-o", "wide"], None);
    assert!(
        ok && out.lines().next().unwrap().contains("REASON") && out.contains("NEXT-ATTEMPT"),
        "{out}"
    );
    let (ok, out, _) = run_kubectl(&["get", "ax", "-n", &ns], None);
    assert!(
        ok && out.contains("shown"),
        "category ax lists tasks: {out}"
    );
    let (ok, out, err) = run_kubectl(&["explain", "axtask.spec.retry"], None);
    assert!(ok, "{err}");
    for field in ["maxRetries", "backoff", "budgetSeconds", "rules"] {
        assert!(out.contains(field), "explain lacks {field}: {out}");
    }
}

/// Twenty short tasks of `task_type` on the sim nodes, beside a bad object; returns their names.
async fn create_good_tasks(client: &kube::Client, ns: &str, task_type: &str) -> Vec<String> {
    let worker = SimWorker::running_for(200);
    let names: Vec<String> = (0..20).map(|i| format!("good-{i:02}")).collect();
    for name in &names {
        create(client, ns, &sim_task_with(name, task_type, &worker, |_| {})).await;
    }
    names
}

#[tokio::test]
async fn a_malformed_template_is_dead_naming_the_field_and_stalls_no_other_task() {
    let client = client().await;
    let ns = namespace(&client, "malformed").await;
    // The schema leaves the template to the operator, so the API server stores this one; the
    // operator's watch of every task must go on reading.
    let bad = r#"{"apiVersion":"ax.dev/v1alpha1","kind":"AxTask","metadata":{"name":"bad-template"},
        "spec":{"type":"malformed","template":{"spec":{"containers":[{"name":"w","image":"x","ports":"80"}]}}}}"#;
    let (ok, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", "-"], Some(bad));
    assert!(ok, "{err}");
    let good = create_good_tasks(&client, &ns, "malformed").await;
    let t = wait_phase(&client, &ns, "bad-template", TaskPhase::Dead, LONG).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.reason.as_deref(), Some("InvalidSpec"));
    let why = s.dead_reason.unwrap_or_default();
    assert!(
        why.contains("spec.template.spec.containers[0].ports"),
        "{why}"
    );
    wait_events(&client, &ns, "bad-template", &["InvalidSpec"]).await;
    for name in &good {
        wait_phase(&client, &ns, name, TaskPhase::Succeeded, LONG).await;
    }
}

#[tokio::test]
async fn unreadable_objects_are_skipped_with_a_warning_naming_the_field_and_stall_no_other_task() {
    let client = client().await;
    let ns = namespace(&client, "unreadable").await;
    // The API server's date-time format admits more fractional digits than a timestamp holds, so
    // it stores objects the operator cannot read; one of them must not stop its watch of the rest.
    let start = "2026-12-01T10:00:00.123456789123Z";
    let task = format!(
        r#"{{"apiVersion":"ax.dev/v1alpha1","kind":"AxTask","metadata":{{"name":"bad-start"}},
        "spec":{{"type":"unreadable","startAfter":"{start}","template":{{"spec":{{"containers":[{{"name":"w","image":"x"}}]}}}}}}}}"#
    );
    let dag = format!(
        r#"{{"apiVersion":"ax.dev/v1alpha1","kind":"AxDag","metadata":{{"name":"bad-dag"}},
        "spec":{{"tasks":[{{"name":"a","spec":{{"type":"unreadable","startAfter":"{start}",
        "template":{{"spec":{{"containers":[{{"name":"w","image":"x"}}]}}}}}}}}]}}}}"#
    );
    let cron = format!(
        r#"{{"apiVersion":"ax.dev/v1alpha1","kind":"AxCron","metadata":{{"name":"bad-cron"}},
        "spec":{{"schedule":"@yearly","task":{{"type":"unreadable","startAfter":"{start}",
        "template":{{"spec":{{"containers":[{{"name":"w","image":"x"}}]}}}}}}}}}}"#
    );
    for object in [&task, &dag, &cron] {
        let (ok, _, err) = run_kubectl(&["apply", "-n", &ns, "-f", "-"], Some(object));
        assert!(ok, "{err}");
    }
    let good = create_good_tasks(&client, &ns, "unreadable").await;
    for (kind, name, field) in [
        ("AxTask", "bad-start", "spec.startAfter"),
        ("AxDag", "bad-dag", "spec.tasks[0].spec.startAfter"),
        ("AxCron", "bad-cron", "spec.task.startAfter"),
    ] {
        let events = wait_events_of(&client, &ns, kind, name, &["Unreadable"]).await;
        let warning = events
            .iter()
            .find(|e| e.reason.as_deref() == Some("Unreadable"))
            .expect("the Unreadable event");
        assert_eq!(warning.type_.as_deref(), Some("Warning"));
        let note = warning.message.clone().unwrap_or_default();
        assert!(
            note.contains(&format!("{field}: ")),
            "{kind} {name}: {note}"
        );
    }
    for name in &good {
        wait_phase(&client, &ns, name, TaskPhase::Succeeded, LONG).await;
    }
    // Skipped, not acted on: no status, no worker.
    let (ok, out, err) = run_kubectl(
        &[
            "get",
            "axtask",
            "bad-start",
            "-n",
            &ns,
            "-o",
            "jsonpath={.status}",
        ],
        None,
    );
    assert!(ok && out.trim().is_empty(), "status {out:?} {err}");
    assert!(pods_of(&client, &ns, "bad-start").await.is_empty());
    // Gone at once (the operator never put a finalizer on them); left behind, they would be the
    // one task kubectl counts and the operator's metrics do not (e2e_helm compares the two).
    let (ok, _, err) = run_kubectl(
        &[
            "delete",
            "-n",
            &ns,
            "axtask/bad-start",
            "axdag/bad-dag",
            "axcron/bad-cron",
        ],
        None,
    );
    assert!(ok, "{err}");
}

/// The operator's Event publisher against the real events API: an exact repeat counts up the first
/// Event's series (a merge patch the API server accepts), another note is an Event of its own.
#[tokio::test]
async fn a_repeated_event_counts_up_its_series_and_another_note_is_its_own_event() {
    use ax::controller::events::Events;
    use k8s_openapi::api::core::v1::{ConfigMap, Event};
    use kube::runtime::events::EventType;

    let client = client().await;
    let ns = namespace(&client, "event-series").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut map = ConfigMap::default();
    map.metadata.name = Some("subject".into());
    let map = maps.create(&Default::default(), &map).await.unwrap();

    let events = Events::new(client.clone(), "ax-e2e", "e2e");
    events.publish(&map, EventType::Warning, "Flapping", "the same note");
    // One at a time: the repeat patches the Event the first one created.
    wait_events_of(&client, &ns, "ConfigMap", "subject", &["Flapping"]).await;
    events.publish(&map, EventType::Warning, "Flapping", "the same note");
    events.publish(&map, EventType::Warning, "Flapping", "another note");

    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = api.list(&Default::default()).await.unwrap().items;
        let mut seen: Vec<(String, i32)> = list
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Flapping"))
            .map(|e| {
                let count = e.series.as_ref().and_then(|s| s.count).unwrap_or(1);
                (e.message.clone().unwrap_or_default(), count)
            })
            .collect();
        seen.sort();
        let want = vec![
            ("another note".to_string(), 1),
            ("the same note".to_string(), 2),
        ];
        if seen == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Flapping Events: want {want:?}, have {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `kubectl explain` reads the descriptions the API server publishes for the CRDs: the kinds,
/// fields deep in their specs, and their statuses teach what they are. (Fields inside a status are
/// covered by the unit test over the schemas: this kubectl explains a status as a whole.)
#[tokio::test]
async fn kubectl_explain_teaches_the_kinds_and_their_fields() {
    let cases = [
        ("axtask", "One unit of work"),
        (
            "axtask.spec.retry.backoff.jitterMillis",
            "retries spread out",
        ),
        ("axtask.spec.timeout.hardSeconds", "the worker is killed"),
        ("axqueue.spec.weights.low", "Low bucket"),
        ("axdag.status", "Where the DAG"),
        ("axcron.status", "What the cron has fired"),
    ];
    for (path, words) in cases {
        // The API server publishes a CRD's OpenAPI a moment after it is applied.
        let deadline = Instant::now() + LONG;
        loop {
            let (ok, out, err) = run_kubectl(&["explain", path], None);
            let text = out.split_whitespace().collect::<Vec<_>>().join(" ");
            if ok && text.contains(words) {
                break;
            }
            assert!(Instant::now() < deadline, "{path}: {text} {err}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

fn condition_of(task: &AxTask, type_: &str) -> Option<(String, String)> {
    task.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// `spec.suspend: true`, like a Job's: the task waits Pending without a pod, says why, and runs
/// once it is set false.
#[tokio::test]
async fn a_suspended_task_waits_without_a_pod_and_runs_once_resumed() {
    let client = client().await;
    let ns = namespace(&client, "suspend").await;
    let worker = SimWorker::running_for(300).start_ms(50);
    let task = sim_task_with("held", "suspend", &worker, |t| {
        t["spec"]["suspend"] = true.into();
    });
    create(&client, &ns, &task).await;
    let held = wait_task(&client, &ns, "held", LONG, |t| {
        condition_of(t, "Suspended") == Some(("True".into(), "Suspended".into()))
    })
    .await;
    assert_eq!(phase(&held), Some(TaskPhase::Pending));
    assert_eq!(
        condition_of(&held, "Queued"),
        Some(("False".into(), "Suspended".into()))
    );
    // Long enough for a dispatch to have happened had it been allowed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a suspended task has no pod"
    );
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"suspend": false}})),
    )
    .await
    .unwrap();
    let done = wait_phase(&client, &ns, "held", TaskPhase::Succeeded, LONG).await;
    assert_eq!(done.status.as_ref().unwrap().attempt, 1);
    assert_eq!(
        condition_of(&done, "Suspended"),
        Some(("False".into(), "Active".into()))
    );
}

/// `spec.onExit` runs once for a Succeeded, a Dead and a Canceled task, with the task's end in
/// its env and payload; a failing handler leaves its task's phase and says so; a task with
/// `ttlSecondsAfterFinished: 0` goes only once its handler's end is recorded.
#[tokio::test]
async fn the_exit_handler_of_a_task_runs_once_whatever_its_end() {
    let client = client().await;
    let ns = namespace(&client, "task-onexit").await;
    let handler = |exit_code: i32| {
        serde_json::json!({
            "type": "sim-notify",
            "payload": {"channel": "ops"},
            "retry": {"maxRetries": 0},
            "template": {"spec": SimWorker::running_for(100).exit_code(exit_code).pod_spec()},
        })
    };
    let task = |name: &str, worker: SimWorker, on_exit: serde_json::Value| {
        sim_task_with(name, "sim-step", &worker, |t| {
            t["spec"]["retry"] = serde_json::json!({"maxRetries": 0});
            t["spec"]["onExit"] = on_exit;
        })
    };
    create(
        &client,
        &ns,
        &task("ok", SimWorker::running_for(100), handler(0)),
    )
    .await;
    let failing = SimWorker::running_for(100).exit_code(3);
    create(&client, &ns, &task("bad", failing, handler(0))).await;
    create(
        &client,
        &ns,
        &task("stop", SimWorker::running_for(100).hang(), handler(0)),
    )
    .await;
    create(
        &client,
        &ns,
        &task("sad", SimWorker::running_for(100), handler(3)),
    )
    .await;
    let mut gone = task("gone", SimWorker::running_for(100), handler(0));
    gone.spec.ttl_seconds_after_finished = Some(0);
    create(&client, &ns, &gone).await;
    wait_phase(&client, &ns, "stop", TaskPhase::Running, LONG).await;
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    tasks
        .patch(
            "stop",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"cancel": true}})),
        )
        .await
        .expect("cancel");

    let handled = |want: &'static str| {
        move |t: &AxTask| {
            t.status
                .as_ref()
                .and_then(|s| s.on_exit.as_ref())
                .is_some_and(|n| serde_json::to_value(n.phase).ok() == Some(want.into()))
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, phase) in [("ok", "Succeeded"), ("bad", "Dead"), ("stop", "Canceled")] {
        let parent = wait_task(&client, &ns, name, LONG, handled("Succeeded")).await;
        let status = parent.status.as_ref().expect("status");
        assert_eq!(status.phase.map(|p| p.as_str()), Some(phase));
        let recorded = status.on_exit.as_ref().expect("onExit");
        assert_eq!(
            recorded.task.as_deref(),
            Some(format!("{name}-onexit").as_str())
        );
        let child = tasks
            .get(&format!("{name}-onexit"))
            .await
            .expect("the handler");
        assert_eq!(child.labels()["ax.dev/exit-of"], name);
        let payload = child.spec.payload.as_ref().expect("payload");
        assert_eq!(payload["channel"], "ops");
        assert_eq!(payload["task"]["name"], name);
        assert_eq!(payload["task"]["phase"], phase);
        let child_status = child.status.as_ref().expect("status");
        assert_eq!(child_status.attempt, 1, "{name}'s handler ran once");
        assert!(
            child_status.queued_at >= status.finished_at,
            "{name}'s handler was queued before its task ended"
        );
        let pod = pods
            .get(&format!("{name}-onexit-1"))
            .await
            .expect("its pod");
        let env = pod.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        let value = |key: &str| {
            env.iter()
                .find(|e| e.name == key)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("AX_PARENT_TASK").as_deref(), Some(name));
        assert_eq!(value("AX_PARENT_PHASE").as_deref(), Some(phase));
    }

    let sad = wait_task(&client, &ns, "sad", LONG, handled("Dead")).await;
    assert_eq!(
        phase(&sad),
        Some(TaskPhase::Succeeded),
        "the task's phase stands"
    );
    wait_events(&client, &ns, "sad", &["OnExitFailed"]).await;

    // `gone` waits for its handler, then goes, and its handler with it.
    let deadline = Instant::now() + LONG;
    while tasks.get_opt("gone").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "gone was never deleted");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Owned by `gone`: the garbage collector takes the handler; it must have run to its end.
    let events = wait_events(&client, &ns, "gone-onexit", &["Completed"]).await;
    assert!(!events.is_empty());
}
