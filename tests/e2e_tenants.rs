//! Sharing one AxQueue, on the real cluster with the operator started by e2e/run-tests.sh: fair
//! shares between namespaces (`spec.fairness`), limits and rates per namespace
//! (`spec.keyConcurrency`, `spec.keyRate`), and preemption of lower priorities
//! (`spec.preemption`). Workers run on simulated nodes (e2e/sim); each test has its own queue and
//! namespaces.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax::api::{AxTask, FailureKind, Priority, TaskPhase};
use common::queue::{create_queue, patch_queue, wait_pending, wait_queue};
use common::sim::{SimWorker, sim_task_with};
use common::*;
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

fn sim_task(name: &str, queue: &str, millis: u64) -> AxTask {
    sim_task_at(name, queue, Priority::Normal, millis)
}

fn sim_task_at(name: &str, queue: &str, priority: Priority, millis: u64) -> AxTask {
    let worker = SimWorker::running_for(millis).start_ms(50);
    sim_task_with(name, "tenant-work", &worker, |task| {
        task["spec"]["queue"] = queue.into();
        task["spec"]["priority"] = priority.as_str().into();
        task["spec"]["retry"] = json!({
            "maxRetries": 0,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0},
        });
    })
}

/// When each attempt was dispatched and when it ended, by namespace.
fn spans(tasks: &[AxTask]) -> Vec<(Timestamp, Timestamp)> {
    tasks
        .iter()
        .flat_map(|t| {
            t.status
                .as_ref()
                .map(|s| s.attempts.clone())
                .unwrap_or_default()
        })
        .map(|a| {
            let end = a.finished_at.expect("a finished attempt");
            (a.scheduled_at, end)
        })
        .collect()
}

/// Most attempts that ran at the same instant.
fn most_at_once(spans: &[(Timestamp, Timestamp)]) -> usize {
    let mut edges: Vec<(Timestamp, i32)> = spans
        .iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    // An end and a start at the same instant: the end first.
    edges.sort();
    let mut now = 0i32;
    let mut most = 0i32;
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// The share of each namespace among the dispatches made while every namespace still had tasks
/// waiting (read from `scheduledAt`).
fn shares_while_all_wait(by_namespace: &BTreeMap<String, Vec<AxTask>>) -> BTreeMap<String, f64> {
    let mut order: Vec<(Timestamp, &str)> = by_namespace
        .iter()
        .flat_map(|(ns, tasks)| {
            tasks.iter().map(move |t| {
                let at = t.status.as_ref().and_then(|s| s.scheduled_at);
                (at.expect("dispatched"), ns.as_str())
            })
        })
        .collect();
    order.sort();
    let end = by_namespace
        .keys()
        .filter_map(|ns| order.iter().rposition(|(_, n)| *n == ns))
        .min()
        .expect("dispatches");
    let window = &order[..=end];
    by_namespace
        .keys()
        .map(|ns| {
            let n = window.iter().filter(|(_, n)| *n == ns).count();
            (ns.clone(), n as f64 / window.len() as f64)
        })
        .collect()
}

/// Three namespaces on one closed fair queue: `first` submits `big` tasks before the two others
/// submit 30 each; then the queue opens at concurrency 10. Returns the shares while all waited.
async fn three_tenants(test: &str, weights_of_first: Option<i32>, big: usize) -> Vec<f64> {
    let client = client().await;
    let namespaces = [
        namespace(&client, &format!("{test}-a")).await,
        namespace(&client, &format!("{test}-b")).await,
        namespace(&client, &format!("{test}-c")).await,
    ];
    let weights = match weights_of_first {
        Some(w) => json!({ namespaces[0].clone(): w }),
        None => json!({}),
    };
    let queue = create_queue(
        &client,
        test,
        json!({"concurrency": 0, "fairness": {"weights": weights}}),
    )
    .await;
    for (i, ns) in namespaces.iter().enumerate() {
        let count = if i == 0 { big } else { 30 };
        let tasks = (0..count)
            .map(|n| sim_task(&format!("t-{n:03}"), &queue.name, 300))
            .collect();
        create_all(&client, ns, tasks).await;
        // The first namespace's backlog is queued before the others arrive.
        if i == 0 {
            wait_pending(&client, &queue.name, big as i64).await;
        }
    }
    wait_pending(&client, &queue.name, (big + 60) as i64).await;
    patch_queue(&client, &queue.name, json!({"concurrency": 10})).await;
    let mut by_namespace = BTreeMap::new();
    for ns in &namespaces {
        let tasks = wait_all_terminal(&client, ns, Duration::from_secs(300)).await;
        assert!(tasks.iter().all(|t| phase(t) == Some(TaskPhase::Succeeded)));
        by_namespace.insert(ns.clone(), tasks);
    }
    let shares = shares_while_all_wait(&by_namespace);
    println!("shares while all three waited: {shares:?}");
    namespaces.iter().map(|ns| shares[ns]).collect()
}

#[tokio::test]
async fn namespaces_share_a_fair_queue_whatever_their_backlog() {
    let shares = three_tenants("fair-equal", None, 150).await;
    // A third each, though the first namespace's 150 were all queued before the others' 30.
    // `scheduledAt` is written by each task's reconcile after its grant; under load a few land out
    // of grant order, so ±0.1 (FIFO would give the first namespace everything).
    for share in &shares {
        assert!((share - 1.0 / 3.0).abs() <= 0.1, "{shares:?}");
    }
}

#[tokio::test]
async fn a_namespace_of_weight_two_gets_half() {
    let shares = three_tenants("fair-weighted", Some(2), 150).await;
    assert!((shares[0] - 0.5).abs() <= 0.1, "{shares:?}");
    assert!((shares[1] - 0.25).abs() <= 0.1, "{shares:?}");
    assert!((shares[2] - 0.25).abs() <= 0.1, "{shares:?}");
}

#[tokio::test]
async fn key_concurrency_limits_one_namespace_and_not_the_others() {
    let client = client().await;
    let limited = namespace(&client, "key-limit-x").await;
    let other = namespace(&client, "key-limit-y").await;
    let queue = create_queue(
        &client,
        "key-limit",
        json!({
            "concurrency": 10,
            "keyConcurrency": {"overrides": { limited.clone(): 2 }},
        }),
    )
    .await;
    let tasks = |n: usize| {
        (0..n)
            .map(|i| sim_task(&format!("t-{i:02}"), &queue.name, 2000))
            .collect::<Vec<_>>()
    };
    create_all(&client, &limited, tasks(12)).await;
    create_all(&client, &other, tasks(12)).await;
    // While two of its tasks run, the others of the limited namespace say why they wait.
    let held = wait_for_reason(&client, &limited, "KeyConcurrencyLimit").await;
    assert!(
        held.contains(&format!("namespace {limited}")) && held.contains("keyConcurrency"),
        "{held}"
    );
    // The queue's status counts its namespaces' tasks.
    wait_queue(&client, &queue.name, LONG, "keys counted", |q| {
        q.status.as_ref().is_some_and(|s| {
            s.keys
                .iter()
                .any(|k| k.key == limited && k.running <= 2 && k.waiting > 0)
        })
    })
    .await;
    let limited_tasks = wait_all_terminal(&client, &limited, Duration::from_secs(300)).await;
    let other_tasks = wait_all_terminal(&client, &other, Duration::from_secs(300)).await;
    for t in limited_tasks.iter().chain(&other_tasks) {
        assert_eq!(phase(t), Some(TaskPhase::Succeeded), "{}", names(t));
    }
    let limited_most = most_at_once(&spans(&limited_tasks));
    let other_most = most_at_once(&spans(&other_tasks));
    println!("most at once: limited {limited_most}, other {other_most}");
    assert!(
        limited_most <= 2,
        "{limited_most} of the limited namespace ran at once"
    );
    // The other namespace filled the slots the limited one could not use.
    assert!(
        other_most > 2,
        "the other namespace ran at most {other_most} at once"
    );
}

#[tokio::test]
async fn keys_from_a_label_then_a_payload_field_limit_customers_within_one_namespace() {
    let client = client().await;
    let ns = namespace(&client, "key-label").await;
    let queue = create_queue(
        &client,
        "key-label",
        json!({
            "concurrency": 10,
            "fairness": {"key": {"label": "customer"}},
            "keyConcurrency": {"overrides": {"x": 2, "p": 1}},
        }),
    )
    .await;
    let labelled = |customer: &str, i: usize| {
        let mut task = sim_task(&format!("{customer}-{i:02}"), &queue.name, 2000);
        task.metadata.labels = Some(BTreeMap::from([("customer".into(), customer.into())]));
        task
    };
    let by_label: Vec<AxTask> = (0..10)
        .flat_map(|i| [labelled("x", i), labelled("y", i)])
        .collect();
    create_all(&client, &ns, by_label).await;
    let held = wait_for_reason(&client, &ns, "KeyConcurrencyLimit").await;
    assert!(held.contains("key x (label:customer)"), "{held}");
    let done = wait_all_terminal(&client, &ns, Duration::from_secs(300)).await;
    succeeded_under_their_customers(&done, "label:customer");
    let (x_most, y_most) = (
        most_at_once(&spans(&named(&done, "x-"))),
        most_at_once(&spans(&named(&done, "y-"))),
    );
    println!("most at once: x {x_most}, y {y_most}");
    assert!(x_most <= 2, "{x_most} of customer x ran at once");
    assert!(y_most > 2, "customer y ran at most {y_most} at once");

    // The same queue now takes the customer from the payload: p may run one at a time.
    patch_queue(
        &client,
        &queue.name,
        json!({"fairness": {"key": {"label": null, "payload": "customer.id"}}}),
    )
    .await;
    wait_queue(
        &client,
        &queue.name,
        LONG,
        "the payload key in force",
        |q| {
            q.status.as_ref().is_some_and(|s| {
                s.observed_generation == q.metadata.generation
                    && !s
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "InvalidSpec" && c.status == "True")
            })
        },
    )
    .await;
    let by_payload = |customer: &str, i: usize| {
        let mut task = sim_task(&format!("{customer}-{i:02}"), &queue.name, 1500);
        task.spec.payload = Some(json!({"customer": {"id": customer}}));
        task
    };
    let tasks: Vec<AxTask> = (0..6)
        .flat_map(|i| [by_payload("p", i), by_payload("q", i)])
        .collect();
    create_all(&client, &ns, tasks).await;
    let held = wait_for_reason(&client, &ns, "KeyConcurrencyLimit").await;
    assert!(held.contains("key p (payload:customer.id)"), "{held}");
    let done = wait_all_terminal(&client, &ns, Duration::from_secs(300)).await;
    let payload_keyed: Vec<AxTask> = [named(&done, "p-"), named(&done, "q-")].concat();
    succeeded_under_their_customers(&payload_keyed, "payload:customer.id");
    let (p_most, q_most) = (
        most_at_once(&spans(&named(&done, "p-"))),
        most_at_once(&spans(&named(&done, "q-"))),
    );
    println!("most at once: p {p_most}, q {q_most}");
    assert_eq!(p_most, 1, "customer p ran {p_most} at once");
    assert!(q_most > 1, "customer q ran at most {q_most} at once");
}

/// The tasks of `done` whose names start with `prefix`: one customer's.
fn named(done: &[AxTask], prefix: &str) -> Vec<AxTask> {
    done.iter()
        .filter(|t| t.name_any().starts_with(prefix))
        .cloned()
        .collect()
}

/// Every task Succeeded, counted under the key `from` gives: the customer its name starts with.
fn succeeded_under_their_customers(tasks: &[AxTask], from: &str) {
    for t in tasks {
        assert_eq!(phase(t), Some(TaskPhase::Succeeded), "{}", names(t));
        let key = t.status.as_ref().and_then(|s| s.queue_key.clone());
        let customer = &t.name_any()[..1];
        assert_eq!(
            key.map(|k| (k.from, k.value)),
            Some((from.to_string(), customer.to_string())),
            "{}",
            names(t)
        );
    }
}

/// The message of a `Queued` condition of some task in `ns` with that reason.
async fn wait_for_reason(client: &Client, ns: &str, reason: &str) -> String {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        for t in tasks_in(client, ns).await {
            let held = t.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "Queued" && c.reason == reason)
                    .map(|c| c.message.clone())
            });
            if let Some(message) = held {
                return message;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no task of {ns} was held with reason {reason}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn key_rate_spaces_one_namespaces_dispatches_and_not_the_others() {
    let client = client().await;
    let limited = namespace(&client, "key-rate-x").await;
    let other = namespace(&client, "key-rate-y").await;
    // One a second per namespace after a burst of 2.
    let queue = create_queue(
        &client,
        "key-rate",
        json!({"concurrency": 20, "keyRate": {"perMinute": 60, "burst": 2}}),
    )
    .await;
    let tasks = |n: usize| {
        (0..n)
            .map(|i| sim_task(&format!("t-{i:02}"), &queue.name, 100))
            .collect::<Vec<_>>()
    };
    create_all(&client, &limited, tasks(8)).await;
    let held = wait_for_reason(&client, &limited, "KeyRateLimit").await;
    assert!(
        held.contains("keyRate") && held.contains("60/min"),
        "{held}"
    );
    // Another namespace, arriving once the first is out of tokens, has a bucket of its own: its
    // tasks go before the first namespace's backlog is through (a shared bucket would put them
    // behind all of it, oldest first).
    create_all(&client, &other, tasks(2)).await;
    let scheduled = |tasks: &[AxTask]| {
        let mut at: Vec<Timestamp> = tasks
            .iter()
            .map(|t| {
                assert_eq!(phase(t), Some(TaskPhase::Succeeded), "{}", names(t));
                t.status
                    .as_ref()
                    .and_then(|s| s.scheduled_at)
                    .expect("dispatched")
            })
            .collect();
        at.sort();
        at
    };
    let limited_at =
        scheduled(&wait_all_terminal(&client, &limited, Duration::from_secs(300)).await);
    let other_at = scheduled(&wait_all_terminal(&client, &other, Duration::from_secs(300)).await);
    println!("limited: {limited_at:?}\nother: {other_at:?}");
    assert!(
        other_at[1] < limited_at[7],
        "the other namespace waited behind the first"
    );
    // The burst of 2 goes at once; after it each dispatch waits for the next token: the k-th
    // (from 0) is granted at least k - 1 seconds after the first. `scheduledAt` is written by each
    // task's reconcile after its grant, up to a few hundred ms late, so allow 500 ms; without the
    // rate all 8 would go within a second.
    for (k, at) in limited_at.iter().enumerate().skip(2) {
        let earliest =
            limited_at[0] + jiff::SignedDuration::from_millis(1000 * (k as i64 - 1) - 500);
        assert!(
            *at >= earliest,
            "dispatch {k} at {at}, before {earliest}: {limited_at:?}"
        );
    }
}

/// What a watch of a namespace's worker pods saw, in order: `(pod, true)` when a pod was first seen,
/// `(pod, false)` when it was deleted.
type PodEvents = Arc<Mutex<Vec<(String, bool)>>>;

fn watch_pods(client: &Client, ns: &str) -> (PodEvents, tokio::task::JoinHandle<()>) {
    let seen: PodEvents = Arc::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let record = seen.clone();
    let watch = tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default().labels("ax.dev/task"))
            .default_backoff()
            .boxed();
        while let Some(Ok(event)) = stream.next().await {
            let mut seen = record.lock().expect("pod events");
            match event {
                watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                    let name = pod.name_any();
                    if !seen.iter().any(|(n, first)| *n == name && *first) {
                        seen.push((name, true));
                    }
                }
                watcher::Event::Delete(pod) => seen.push((pod.name_any(), false)),
                _ => {}
            }
        }
    });
    (seen, watch)
}

#[tokio::test]
async fn a_critical_task_preempts_the_latest_low_attempt_which_runs_again_later() {
    let client = client().await;
    let ns = namespace(&client, "preempt").await;
    let (pod_events, watch) = watch_pods(&client, &ns);
    let queue = create_queue(
        &client,
        "preempt",
        json!({
            "concurrency": 2,
            "preemption": {"withinQueue": "LowerPriority", "afterSeconds": 2, "maxPerMinute": 6},
        }),
    )
    .await;
    // Two long Low tasks fill the queue; `low-b` is dispatched second. Long enough that neither
    // ends before `urgent` arrives however slowly a busy cluster lets the test see them run:
    // low-a never needs to end, and low-b's second attempt must end within LONG.
    create(
        &client,
        &ns,
        &sim_task_at("low-a", &queue.name, Priority::Low, 600_000),
    )
    .await;
    wait_phase(&client, &ns, "low-a", TaskPhase::Running, LONG).await;
    create(
        &client,
        &ns,
        &sim_task_at("low-b", &queue.name, Priority::Low, 45_000),
    )
    .await;
    wait_phase(&client, &ns, "low-b", TaskPhase::Running, LONG).await;
    let mut urgent = sim_task_at("urgent", &queue.name, Priority::Critical, 1_000);
    urgent.spec.task_type = "urgent-work".into();
    create(&client, &ns, &urgent).await;

    // low-b's attempt is stopped (the latest dispatched of the lowest priority), urgent runs.
    let urgent = wait_phase(&client, &ns, "urgent", TaskPhase::Succeeded, LONG).await;
    let low_b = wait_task(&client, &ns, "low-b", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.attempt >= 2)
    })
    .await;
    let status = low_b.status.clone().unwrap();
    let preempted = &status.attempts[0];
    assert_eq!(
        preempted.reason.as_deref(),
        Some("Preempted"),
        "{:#?}",
        status.attempts
    );
    assert_eq!(preempted.failure_kind, Some(FailureKind::Infrastructure));
    assert_eq!(
        (status.retries, status.infrastructure_retries),
        (0, 1),
        "maxRetries untouched"
    );
    // urgent was dispatched only after low-b's first attempt ended, into its slot.
    let urgent_at = urgent.status.as_ref().and_then(|s| s.scheduled_at).unwrap();
    assert!(urgent_at >= preempted.finished_at.unwrap());
    // low-a was left alone.
    let low_a = wait_task(&client, &ns, "low-a", LONG, |_| true).await;
    assert_eq!(low_a.status.as_ref().map(|s| s.attempt), Some(1));
    assert!(
        history(&low_a).iter().all(|h| h.reason != "Preempted"),
        "{:#?}",
        history(&low_a)
    );
    // low-b runs again and finishes, its first pod gone before its second was created.
    let low_b = wait_phase(&client, &ns, "low-b", TaskPhase::Succeeded, LONG).await;
    assert_eq!(low_b.status.as_ref().map(|s| s.retries), Some(0));
    wait_events(&client, &ns, "low-b", &["Preempted"]).await;
    watch.abort();
    let events = pod_events.lock().unwrap().clone();
    let first_gone = events
        .iter()
        .position(|(n, first)| n == "low-b-1" && !first);
    let second_seen = events
        .iter()
        .position(|(n, first)| n == "low-b-2" && *first);
    match (first_gone, second_seen) {
        (Some(gone), Some(seen)) => assert!(
            gone < seen,
            "low-b-2 appeared before low-b-1 was gone: {events:?}"
        ),
        _ => panic!("low-b's pods were not both seen: {events:?}"),
    }
}
