//! The operator's writes for a batch of tasks, as the API server's audit log records them: no
//! status write loses a race to another writer of the operator, no pod create finds its pod
//! already there, and each visible change is one write. A check of the write path, not a timing
//! test. Runs with its own operator (the only one writing), counting the requests in its namespace.

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DeleteParams;
use std::time::Duration;

use ax::api::TaskPhase;
use common::process::Operator;
use common::sim::{SimWorker, sim_task_with};
use common::*;

/// (verb, group/resource[/subresource], code) → requests.
type Requests = BTreeMap<(String, String, String), f64>;

/// The operator's requests in `namespace`, from the API server's audit log (e2e/cluster.sh records
/// every write of the ax-operator ServiceAccount), each once, as the API server completed it.
fn audit_events(namespace: &str) -> Vec<serde_json::Value> {
    let path =
        std::env::var("AX_E2E_AUDIT_LOG").expect("AX_E2E_AUDIT_LOG (eval e2e/cluster.sh env)");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["objectRef"]["namespace"] == namespace)
        .collect()
}

/// The operator's writes in `namespace`: what the API server received, counted by it.
fn operator_writes(namespace: &str) -> Requests {
    let mut out = Requests::new();
    for event in audit_events(namespace) {
        let object = &event["objectRef"];
        let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let mut resource = format!(
            "{}/{}",
            field(&object["apiGroup"]),
            field(&object["resource"])
        );
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let code = event["responseStatus"]["code"].to_string();
        *out.entry((field(&event["verb"]), resource, code))
            .or_default() += 1.0;
    }
    out
}

/// When the API server received each AxTask status write in `namespace` that it accepted, in order.
fn status_write_times(namespace: &str) -> Vec<jiff::Timestamp> {
    let mut times: Vec<jiff::Timestamp> = audit_events(namespace)
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "axtasks"
                && e["objectRef"]["subresource"] == "status"
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
        })
        .map(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .expect("an audit event has its requestReceivedTimestamp")
        })
        .collect();
    times.sort();
    times
}

fn sum(requests: &Requests, resource: &str, code: impl Fn(&str) -> bool) -> f64 {
    requests
        .iter()
        .filter(|((_, r, c), _)| r == resource && code(c))
        .map(|(_, v)| v)
        .sum()
}

/// The operator under test, as `identity`, logging to `target/e2e/operator-<identity>.log`
/// (this run alone).
fn start_operator(identity: &str, args: &[&str]) -> Operator {
    Operator::builder(identity)
        .fresh_log()
        .args(args)
        .env("RUST_LOG", "info")
        .start()
}

#[tokio::test]
async fn a_batch_of_tasks_costs_one_write_per_visible_change_and_no_conflicts() {
    const TASKS: usize = 80;
    let client = client().await;
    let warm_ns = namespace(&client, "writes-warm-up").await;
    let ns = namespace(&client, "writes").await;
    let operator = start_operator("writes", &[]);
    // The operator is up and has listed when it has run a first task (in a namespace of its own,
    // so the count below is the batch's alone).
    let worker = SimWorker::running_for(100).start_ms(100);
    create(
        &client,
        &warm_ns,
        &sim_task_with("warm-up", "writes", &worker, |_| {}),
    )
    .await;
    wait_phase(&client, &warm_ns, "warm-up", TaskPhase::Succeeded, LONG).await;

    for i in 0..TASKS {
        create(
            &client,
            &ns,
            &sim_task_with(&format!("w-{i}"), "writes", &worker, |_| {}),
        )
        .await;
    }
    for i in 0..TASKS {
        let t = wait_task(
            &client,
            &ns,
            &format!("w-{i}"),
            Duration::from_secs(180),
            |t| phase(t).is_some_and(TaskPhase::is_terminal),
        )
        .await;
        assert_eq!(phase(&t), Some(TaskPhase::Succeeded), "{:#?}", history(&t));
    }
    // Events are sent in the background.
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(operator);

    let writes = operator_writes(&ns);
    let table: String = writes
        .iter()
        .map(|((verb, resource, code), n)| format!("  {verb:7} {resource:40} {code} {n}\n"))
        .collect();
    let n = TASKS as f64;
    let status_conflicts = sum(&writes, "ax.dev/axtasks/status", |c| c == "409");
    let pod_conflicts = sum(&writes, "/pods", |c| c == "409");
    let status_writes = sum(&writes, "ax.dev/axtasks/status", |c| c.starts_with('2'));
    let pod_creates = sum(&writes, "/pods", |c| c == "201");
    let events = sum(&writes, "events.k8s.io/events", |_| true) + sum(&writes, "/events", |_| true);
    println!("writes for {TASKS} tasks:\n{table}");
    assert_eq!(status_conflicts, 0.0, "status writes lost a race:\n{table}");
    assert_eq!(
        pod_conflicts, 0.0,
        "pod creates found their pod already there:\n{table}"
    );
    assert_eq!(pod_creates, n, "one pod per task:\n{table}");
    // New → Scheduled, → Running, → Succeeded: at most three visible changes per task.
    assert!(
        status_writes <= 3.0 * n,
        "{status_writes} status writes:\n{table}"
    );
    // One Event per task (its outcome), none for the routine steps.
    assert!(events <= 1.2 * n, "{events} Event writes:\n{table}");
}

/// Progress of attempts that outlast the write delay is written, but paced: a batch whose delay
/// runs out together gets its progress writes spread out at `--progress-writes-per-second`, and
/// every task is still shown Running. (A lower bound on the spread: a slow machine only widens it.)
#[tokio::test]
async fn due_progress_writes_are_paced_and_every_one_is_still_made() {
    const TASKS: usize = 20;
    const PER_SECOND: usize = 2;
    let client = client().await;
    let ns = namespace(&client, "writes-paced").await;
    let rate = PER_SECOND.to_string();
    let operator = start_operator(
        "writes-paced",
        &[
            "--progress-write-delay-seconds",
            "1",
            "--progress-writes-per-second",
            &rate,
        ],
    );
    // Workers that run until deleted: no outcome ever carries the progress.
    let worker = SimWorker::running_for(0).hang();
    for i in 0..TASKS {
        create(
            &client,
            &ns,
            &sim_task_with(&format!("p-{i}"), "writes-paced", &worker, |_| {}),
        )
        .await;
    }
    for i in 0..TASKS {
        let t = wait_task(&client, &ns, &format!("p-{i}"), LONG, |t| {
            phase(t) == Some(TaskPhase::Running)
        })
        .await;
        assert!(
            phases(&t).starts_with(&[TaskPhase::Pending, TaskPhase::Scheduled, TaskPhase::Running]),
            "{:#?}",
            history(&t)
        );
    }
    drop(operator);

    let times = status_write_times(&ns);
    // Each task written Running, maybe Scheduled before: one or two progress writes each.
    assert!(
        (TASKS..=2 * TASKS).contains(&times.len()),
        "{} status writes for {TASKS} tasks",
        times.len()
    );
    // At most a second's worth at once, then PER_SECOND a second: the writes span at least
    // (n - PER_SECOND) / PER_SECOND seconds; one second off for how the API server timed them.
    let spread = times[times.len() - 1].duration_since(times[0]);
    let least = (times.len() - PER_SECOND) / PER_SECOND - 1;
    assert!(
        spread >= jiff::SignedDuration::from_secs(i64::try_from(least).unwrap()),
        "{} status writes within {spread:?}: not paced at {PER_SECOND}/s",
        times.len()
    );
    // The workers never end on their own.
    Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::background())
        .await
        .expect("delete the namespace");
}
