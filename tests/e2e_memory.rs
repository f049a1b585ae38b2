//! Tenants cannot run the operator out of memory with large payloads: 150 tasks with payloads near
//! the 256 KiB limit, made of small numbers (the JSON that grows most once parsed), waiting forever
//! in a queue that does not exist. Before the fresh-template cache was bounded in bytes and kept
//! JSON text, the operator held every one of those payloads parsed and passed 700 MiB, and again
//! after every restart; and while the watch reduced objects only once the caches took them, a
//! restart held those waiting whole (240 MiB). Nor with large DAGs: 30 DAGs of 500 tasks with
//! payloads, near the API server's object limit, each waiting on its first task; while the DAG
//! cache kept every AxDag whole, they took 480 MiB parsed. Starts its own operator
//! (e2e/run-tests.sh stops the shared one first).

mod common;

use std::time::{Duration, Instant};

use ax::api::{AxDag, AxTask};
use common::process::Operator;
use common::*;
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};

const TASKS: usize = 150;
const DAGS: usize = 30;
const DAG_TASKS: usize = 500;
/// Per task of those DAGs: a DAG is about 1 MB of JSON and 16 MB parsed.
const DAG_NUMBERS: usize = 900;
/// As [`RUNNING_GROWTH_KIB`], for the DAGs: each reconcile in flight reads the DAG as text (1 MB)
/// and each watch event is parsed whole (16 MB) before it is reduced; 30 DAGs kept whole are
/// 480 MiB.
const DAG_GROWTH_KIB: u64 = 160 * 1024;
/// Digits and commas: 2 bytes of JSON each, 32 bytes each as a parsed `serde_json::Value`.
const NUMBERS: usize = 125 * 1024;
/// How far the operator's peak resident memory may rise above what it took to list the cluster as
/// it was (other tests' objects make that anywhere from 40 to 100 MiB) while the tasks are created
/// and held: each reconcile in flight (32 at most) holds a whole task, ~4 MiB parsed; 150 payloads
/// kept parsed are 600 MiB and more (about 70 MiB with the byte budget).
const RUNNING_GROWTH_KIB: u64 = 192 * 1024;
/// The same after a restart, which only lists the held tasks: one is read at a time, and nothing
/// else holds a whole one (about 45 MiB). Objects waiting whole for the caches to take them added
/// more than 200 MiB.
const RESTARTED_GROWTH_KIB: u64 = 128 * 1024;

/// An operator of this test, its /readyz on a port of its own, logging to
/// target/e2e/operator-memory.log; SIGKILLed when dropped, as the OOM killer would.
fn start_operator(identity: &str) -> Operator {
    Operator::builder(identity)
        .log("operator-memory.log")
        .http_port()
        .start()
}

/// Waits until `count` tasks in `ns` have been seen by the operator: held, with the `Queued`
/// reason `QueueNotFound`.
async fn wait_all_held(client: &Client, ns: &str, count: usize, operator: &mut Operator) {
    let api: Api<AxTask> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + LONG;
    loop {
        operator.assert_running();
        // Metadata and status only would be kinder, but a list of 37 MB is quick on a local cluster.
        let tasks = api.list(&ListParams::default()).await.expect("list tasks");
        let held = tasks
            .items
            .iter()
            .filter(|t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.condition("Queued"))
                    .is_some_and(|c| c.reason == "QueueNotFound")
            })
            .count();
        if held == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{held} of {count} tasks held as QueueNotFound within {LONG:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Deletes the namespace however the test ends: a failed run must not leave 37 MB of tasks for
/// every later test's list (tasks carry no finalizer, so no operator is needed for it).
struct NamespaceDeletedOnDrop(String);

impl Drop for NamespaceDeletedOnDrop {
    fn drop(&mut self) {
        let ns = self.0.as_str();
        let _ = run_kubectl(
            &[
                "delete",
                "namespace",
                ns,
                "--wait=false",
                "--ignore-not-found",
            ],
            None,
        );
    }
}

/// Samples the operator's memory for `period`, failing as soon as its peak passes `baseline_kib`
/// by more than `growth_kib`.
async fn assert_memory_bounded(
    operator: &mut Operator,
    when: &str,
    baseline_kib: u64,
    growth_kib: u64,
    period: Duration,
) -> u64 {
    let until = Instant::now() + period;
    loop {
        operator.assert_running();
        let (rss, peak) = operator.memory_kib();
        println!(
            "{when}: VmRSS {} MiB, VmHWM {} MiB",
            rss / 1024,
            peak / 1024
        );
        assert!(
            peak < baseline_kib + growth_kib,
            "{when}: the operator's resident memory peaked at {} MiB, {} MiB above the {} MiB it took \
             before the tasks (bound {} MiB above)",
            peak / 1024,
            peak.saturating_sub(baseline_kib) / 1024,
            baseline_kib / 1024,
            growth_kib / 1024
        );
        if Instant::now() >= until {
            return peak;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A test's operator, leading and ready, and what it took to list the cluster as it was; the
/// namespace of the objects it is to hold, deleted when this drops.
struct Measured {
    client: Client,
    ns: String,
    operator: Operator,
    /// Its peak resident memory (VmHWM) then, in KiB.
    baseline: u64,
    _cleanup: NamespaceDeletedOnDrop,
}

/// Starts the operator `identity` for `test`, alone in the cluster, with a fresh namespace for the
/// `objects` it is to hold, and waits until it leads and is ready.
async fn start_measured(test: &str, identity: &str, objects: &str) -> Measured {
    let client = client().await;
    operator::assert_no_leader(&client).await;
    let ns = namespace(&client, test).await;
    let cleanup = NamespaceDeletedOnDrop(ns.clone());
    let mut operator = start_operator(identity);
    operator.wait_leading_and_ready(&client).await;
    let (_, baseline) = operator.memory_kib();
    println!("before the {objects}: VmHWM {} MiB", baseline / 1024);
    Measured {
        client,
        ns,
        operator,
        baseline,
        _cleanup: cleanup,
    }
}

impl Measured {
    /// Once the operator holds all `count` objects, bounds its peak memory above the baseline by
    /// `running_kib` for 5 s; then SIGKILLs it and bounds a new one, `restarted`, by
    /// `restarted_kib` for 10 s.
    async fn assert_bounded_through_a_restart(
        &mut self,
        count: usize,
        (running_kib, restarted_kib): (u64, u64),
        restarted: &str,
    ) {
        wait_all_held(&self.client, &self.ns, count, &mut self.operator).await;
        let first = assert_memory_bounded(
            &mut self.operator,
            "running",
            self.baseline,
            running_kib,
            Duration::from_secs(5),
        )
        .await;
        // SIGKILLed as the OOM killer would, before the new one starts.
        self.operator.sigkill();
        self.operator = start_operator(restarted);
        self.operator.wait_leading_and_ready(&self.client).await;
        let after = assert_memory_bounded(
            &mut self.operator,
            "restarted",
            self.baseline,
            restarted_kib,
            Duration::from_secs(10),
        )
        .await;
        println!(
            "peak resident memory: {} MiB, after the restart {} MiB",
            first / 1024,
            after / 1024
        );
    }
}

#[tokio::test]
async fn large_payloads_waiting_forever_do_not_run_the_operator_out_of_memory() {
    let mut measured = start_measured("memory", "memory-a", "tasks").await;
    let (client, ns) = (measured.client.clone(), measured.ns.clone());

    let numbers: Vec<u8> = (0..NUMBERS).map(|i| (i % 10) as u8).collect();
    let task = |i: usize| {
        example("hello.yaml", &format!("big-{i}"), |v| {
            v["spec"]["queue"] = "nope".into();
            v["spec"]["payload"] = serde_json::json!({"numbers": numbers});
        })
    };
    let payload = serde_json::to_string(&task(0).spec.payload).unwrap().len();
    assert!(
        (200 * 1024..ax::core::task::MAX_PAYLOAD_BYTES).contains(&payload),
        "{payload}: near the limit, and valid (else the task is Dead, not waiting)"
    );
    futures::stream::iter(0..TASKS)
        .map(|i| {
            let (client, ns, task) = (client.clone(), ns.clone(), task(i));
            async move { create(&client, &ns, &task).await }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    // A restart lists every task at once, faster than the caches take them in; nothing is written.
    measured
        .assert_bounded_through_a_restart(
            TASKS,
            (RUNNING_GROWTH_KIB, RESTARTED_GROWTH_KIB),
            "memory-b",
        )
        .await;

    // Leave no 37 MB of tasks for the next operator to list.
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete the tasks");
    let deadline = Instant::now() + LONG;
    while !api
        .list_metadata(&ListParams::default())
        .await
        .expect("list tasks")
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "tasks not gone within {LONG:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    measured.operator.sigkill();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
}

#[tokio::test]
async fn large_dags_cost_the_operator_their_graph_not_their_specs() {
    let mut measured = start_measured("memory-dags", "memory-dags-a", "DAGs").await;
    let (client, ns) = (measured.client.clone(), measured.ns.clone());

    // `t0` waits forever in a queue that does not exist; every other task waits on it.
    let numbers: Vec<u8> = (0..DAG_NUMBERS).map(|i| (i % 10) as u8).collect();
    let mut spec = serde_json::to_value(example("hello.yaml", "x", |_| {}).spec).unwrap();
    spec["payload"] = serde_json::json!({"numbers": numbers});
    let tasks: Vec<serde_json::Value> = (0..DAG_TASKS)
        .map(|i| {
            let mut spec = spec.clone();
            let mut task = serde_json::json!({"name": format!("t{i}"), "spec": spec});
            if i == 0 {
                spec["queue"] = "nope".into();
                task["spec"] = spec;
            } else {
                task["dependsOn"] = serde_json::json!(["t0"]);
            }
            task
        })
        .collect();
    let dag = |i: usize| -> AxDag {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": format!("big-{i}")},
            "spec": {"tasks": tasks},
        }))
        .expect("an AxDag")
    };
    let size = serde_json::to_string(&dag(0)).unwrap().len();
    assert!(
        (800_000..1_400_000).contains(&size),
        "{size}: near the object limit, and under it"
    );
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    futures::stream::iter(0..DAGS)
        .map(|i| {
            let (dags, dag) = (dags.clone(), dag(i));
            async move {
                dags.create(&Default::default(), &dag)
                    .await
                    .expect("create a DAG")
            }
        })
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    // Each DAG's first child, created from the DAG's spec as the API server has it.
    measured
        .assert_bounded_through_a_restart(DAGS, (DAG_GROWTH_KIB, DAG_GROWTH_KIB), "memory-dags-b")
        .await;
    let children = tasks_in(&client, &ns).await;
    assert_eq!(children.len(), DAGS, "one child each, never two");
    assert!(
        children
            .iter()
            .all(|c| c.spec.payload == Some(serde_json::json!({"numbers": numbers}))),
        "each child has its spec from the DAG"
    );

    // The children's finalizer comes off through this operator: delete before it stops.
    dags.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete the DAGs");
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + LONG;
    loop {
        let left = dags
            .list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            + tasks
                .list_metadata(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} DAGs and tasks not gone within {LONG:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
