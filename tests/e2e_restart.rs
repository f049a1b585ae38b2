//! The operator killed with SIGKILL while tasks are Scheduled and Running, then restarted: every
//! task still finishes, and no attempt ever has two pods; a DAG's fan-out creates no item twice. This test starts its own operators
//! (e2e/run-tests.sh stops the shared one first).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax::api::{AxDag, AxTask, TaskPhase};
use common::process::Operator;
use common::sim::{SimWorker, sim_task_with};
use common::*;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};

/// An operator of this test, logging to target/e2e/operator-restart.log.
fn start_operator(identity: &str) -> Operator {
    Operator::builder(identity)
        .log("operator-restart.log")
        .start()
}

/// A task of `seconds` on the real kubelet, or on a simulated node.
fn task(name: &str, sim: bool, seconds: u64) -> AxTask {
    if sim {
        let worker = SimWorker::running_for(seconds * 1000).start_ms(300);
        return sim_task_with(name, "hello", &worker, |_| {});
    }
    example("hello.yaml", name, |v| {
        v["spec"]["template"]["spec"]["containers"][0]["command"] =
            serde_json::json!(["sh", "-c", format!("sleep {seconds}")]);
    })
}

#[tokio::test]
async fn operator_killed_mid_flight_loses_nothing_and_duplicates_nothing() {
    let client = client().await;
    let ns = namespace(&client, "restart").await;

    let (seen, watch) = record_worker_pods(&client, &ns);

    let mut operator = start_operator("restart-a");
    let mut names = Vec::new();
    for i in 0..6 {
        let name = format!("real-{i}");
        create(&client, &ns, &task(&name, false, 6)).await;
        names.push(name);
    }
    for i in 0..40 {
        let name = format!("sim-{i}");
        create(&client, &ns, &task(&name, true, 4 + (i % 4))).await;
        names.push(name);
    }

    // Kill it as soon as tasks are in flight, twice, restarting in between.
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for round in 0..2 {
        let deadline = Instant::now() + LONG;
        loop {
            let tasks = api.list(&ListParams::default()).await.unwrap().items;
            let in_flight = tasks
                .iter()
                .filter(|t| matches!(phase(t), Some(TaskPhase::Scheduled | TaskPhase::Running)))
                .count();
            if in_flight >= 5 {
                break;
            }
            assert!(Instant::now() < deadline, "tasks never got in flight");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        operator.sigkill();
        tokio::time::sleep(Duration::from_secs(2)).await;
        operator = start_operator(&format!("restart-{round}"));
    }

    for name in &names {
        let t = wait_task(&client, &ns, name, Duration::from_secs(180), |t| {
            phase(t).is_some_and(TaskPhase::is_terminal)
        })
        .await;
        let s = t.status.clone().unwrap();
        assert_eq!(
            s.phase,
            Some(TaskPhase::Succeeded),
            "{name}: {:#?}",
            s.history
        );
        assert_eq!(
            (s.attempt, s.retries),
            (1, 0),
            "{name}: a restart must not cost an attempt: {:#?}",
            s.history
        );
        assert_history_chain(&t);
    }
    operator.sigkill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();

    let seen = seen.lock().unwrap();
    for name in &names {
        let uids = seen
            .get(&(name.clone(), "1".into()))
            .unwrap_or_else(|| panic!("no pod seen for {name}"));
        assert_eq!(uids.len(), 1, "{name} attempt 1 had {} pods", uids.len());
    }
    assert!(
        seen.keys().all(|(_, attempt)| attempt == "1"),
        "only first attempts ran: {:?}",
        seen.keys()
    );
}

type UidsByName = BTreeMap<String, BTreeSet<String>>;

/// Every uid each AxTask name that `selector` selects ever had, as a watch (running until the
/// handle is aborted) saw them.
fn record_task_uids(
    client: &kube::Client,
    ns: &str,
    selector: &str,
) -> (Arc<Mutex<UidsByName>>, tokio::task::JoinHandle<()>) {
    let uids: Arc<Mutex<UidsByName>> = Arc::default();
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), ns);
    let recorder = uids.clone();
    let mut stream = watcher(tasks, watcher::Config::default().labels(selector))
        .default_backoff()
        .boxed();
    let watch = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t)) = event {
                let mut uids = recorder.lock().unwrap();
                let entry = uids.entry(t.name_any()).or_default();
                entry.insert(t.uid().unwrap_or_default());
            }
        }
    });
    (uids, watch)
}

/// A DAG fanning out over 600 items, its operator SIGKILLed twice while items are at work: the
/// DAG still Succeeds, and every item's child was created once and ran once.
#[tokio::test]
async fn operator_killed_mid_fan_out_creates_no_item_twice() {
    const ITEMS: usize = 600;
    let client = client().await;
    let ns = namespace(&client, "restart-fanout").await;

    let (uids, watch) = record_task_uids(&client, &ns, "ax.dev/item");

    let mut operator = start_operator("fanout-a");
    let worker = SimWorker::running_for(1500).start_ms(200);
    let dag: AxDag = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": "wide"},
        "spec": {"tasks": [{
            "name": "map",
            "spec": common::sim::sim_task_spec("fan", &worker),
            "forEach": {"range": {"count": ITEMS}, "parallelism": 100},
        }]},
    }))
    .expect("an AxDag");
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&Default::default(), &dag)
        .await
        .expect("create");

    for (round, after) in [(0, 150), (1, 350)] {
        // Killed once this many items were created, at work.
        let deadline = Instant::now() + Duration::from_secs(300);
        while uids.lock().unwrap().len() < after {
            assert!(Instant::now() < deadline, "items never got to {after}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        operator.sigkill();
        tokio::time::sleep(Duration::from_secs(2)).await;
        operator = start_operator(&format!("fanout-{round}"));
    }
    let done = wait_for(
        &client,
        &ns,
        "wide",
        Duration::from_secs(600),
        |d: &AxDag| {
            d.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(|p| p.is_terminal())
        },
    )
    .await;
    operator.sigkill();
    watch.abort();
    let status = done.status.expect("status");
    assert_eq!(
        status.phase,
        Some(ax::api::DagPhase::Succeeded),
        "{status:#?}"
    );
    let items = status.nodes["map"].items.clone().expect("items");
    assert_eq!(items.succeeded as usize, ITEMS);

    let uids = uids.lock().unwrap().clone();
    assert_eq!(uids.len(), ITEMS, "one child per item");
    let twice: Vec<&String> = uids
        .iter()
        .filter(|(_, u)| u.len() > 1)
        .map(|(n, _)| n)
        .collect();
    assert!(twice.is_empty(), "created more than once: {twice:?}");
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for child in api.list(&ListParams::default()).await.expect("list").items {
        let attempt = child.status.as_ref().map_or(0, |s| s.attempt);
        assert_eq!(attempt, 1, "{} ran {attempt} times", child.name_any());
    }
}

/// The operator SIGKILLed the moment a DAG's and a task's terminal phase are written: their exit
/// handlers still run, exactly once each.
#[tokio::test]
async fn operator_killed_right_after_a_dags_end_runs_its_exit_handler_once() {
    let client = client().await;
    let ns = namespace(&client, "restart-onexit").await;
    let (handlers, watch) = record_task_uids(&client, &ns, "ax.dev/dag-task=onexit");
    let (task_handlers, task_watch) = record_task_uids(&client, &ns, "ax.dev/exit-of=single");

    let mut operator = start_operator("onexit-a");
    let step = common::sim::sim_task_spec("fan", &SimWorker::running_for(500));
    // An AxTask's own exit handler (spec.onExit), beside the DAG's.
    let mut single = step.clone();
    single["onExit"] = step.clone();
    let single: AxTask = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
        "metadata": {"name": "single"}, "spec": single,
    }))
    .expect("an AxTask");
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    tasks
        .create(&Default::default(), &single)
        .await
        .expect("create");
    let dag: AxDag = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": "ending"},
        "spec": {"tasks": [{"name": "step", "spec": step}], "onExit": step},
    }))
    .expect("an AxDag");
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&Default::default(), &dag)
        .await
        .expect("create");
    let terminal = |d: &AxDag| {
        d.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_terminal())
    };
    wait_for(&client, &ns, "ending", LONG, terminal).await;
    wait_for(&client, &ns, "single", LONG, |t: &AxTask| {
        t.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_terminal())
    })
    .await;
    operator.sigkill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut operator = start_operator("onexit-b");
    let done = wait_for(&client, &ns, "ending", LONG, |d: &AxDag| {
        d.status
            .as_ref()
            .and_then(|s| s.on_exit.as_ref())
            .is_some_and(|n| n.phase == ax::api::DagNodePhase::Succeeded)
    })
    .await;
    wait_for(&client, &ns, "single", LONG, |t: &AxTask| {
        t.status
            .as_ref()
            .and_then(|s| s.on_exit.as_ref())
            .is_some_and(|n| n.phase == ax::api::DagNodePhase::Succeeded)
    })
    .await;
    // Another restart after the handler ended: nothing runs again.
    operator.sigkill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let operator = start_operator("onexit-c");
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(operator);
    watch.abort();
    task_watch.abort();
    let task_handlers = task_handlers.lock().unwrap().clone();
    assert_eq!(
        task_handlers.values().flatten().count(),
        1,
        "the task's exit handlers: {task_handlers:?}"
    );
    let handler = tasks
        .get("single-onexit")
        .await
        .expect("the task's handler");
    assert_eq!(handler.status.map(|s| s.attempt), Some(1));
    assert_eq!(
        done.status.and_then(|s| s.phase),
        Some(ax::api::DagPhase::Succeeded)
    );
    let handlers = handlers.lock().unwrap().clone();
    let uids: Vec<&String> = handlers.values().flatten().collect();
    assert_eq!(uids.len(), 1, "exit handler children: {handlers:?}");
    let handler = Api::<AxTask>::namespaced(client.clone(), &ns)
        .get("ending-onexit")
        .await
        .expect("the handler");
    assert_eq!(handler.status.map(|s| s.attempt), Some(1));
}
