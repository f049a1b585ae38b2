//! AxDag `forEach` tasks on the real cluster, driven through the API server with the operator
//! started by e2e/run-tests.sh: one child AxTask per item on the simulated nodes, created under the
//! task's parallelism, and a DAG status that keeps counts, not one entry per item.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax::api::{AxDag, AxTask, DagItemsStatus, DagNodePhase, DagPhase, TaskPhase};
use common::sim::{SimWorker, sim_task_spec};
use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

fn dag_phase(dag: &AxDag) -> Option<DagPhase> {
    dag.status.as_ref().and_then(|s| s.phase)
}

fn node<'a>(dag: &'a AxDag, task: &str) -> &'a ax::api::DagNodeStatus {
    dag.status
        .as_ref()
        .and_then(|s| s.nodes.get(task))
        .unwrap_or_else(|| panic!("no node {task}: {:#?}", dag.status))
}

fn items<'a>(dag: &'a AxDag, task: &str) -> &'a DagItemsStatus {
    node(dag, task)
        .items
        .as_ref()
        .unwrap_or_else(|| panic!("node {task} has no items: {:#?}", dag.status))
}

/// The DAG's children, by name.
async fn children(client: &Client, ns: &str, dag: &str) -> BTreeMap<String, AxTask> {
    by_label(client, ns, &format!("ax.dev/dag={dag}")).await
}

/// The indexes of a compact list of ranges, `0-2,5`.
fn indexes(ranges: &str) -> Vec<u32> {
    ranges
        .split(',')
        .filter(|r| !r.is_empty())
        .flat_map(|range| {
            let (start, end) = range.split_once('-').unwrap_or((range, range));
            let number = |n: &str| n.parse::<u32>().expect("an index");
            number(start)..=number(end)
        })
        .collect()
}

/// What a watch of the DAG and its children saw: the largest JSON of the DAG, and the most item
/// children of `task` unfinished at once.
#[derive(Default)]
struct Seen {
    largest_dag: usize,
    unfinished: BTreeMap<String, bool>,
    most_unfinished: usize,
}

/// Watches DAG `name` and its children until dropped.
async fn watch(client: &Client, ns: &str, name: &str) -> (Arc<Mutex<Seen>>, impl Drop) {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let dags: Api<AxDag> = Api::namespaced(client.clone(), ns);
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), ns);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut dag_stream = watcher(dags, by_name).default_backoff().boxed();
    let mut task_stream = watcher(
        tasks,
        watcher::Config::default().labels(&format!("ax.dev/dag={name},ax.dev/item")),
    )
    .default_backoff()
    .boxed();
    let recorder = seen.clone();
    let handle = tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let mut listed = 0;
        loop {
            tokio::select! {
                Some(event) = dag_stream.next() => {
                    if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = &event {
                        let size = serde_json::to_vec(d).expect("json").len();
                        let mut seen = recorder.lock().unwrap();
                        seen.largest_dag = seen.largest_dag.max(size);
                    }
                    if let Ok(watcher::Event::InitDone) = event {
                        listed += 1;
                    }
                }
                Some(event) = task_stream.next() => {
                    let mut seen = recorder.lock().unwrap();
                    match event {
                        Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                            let done = phase(&c).is_some_and(TaskPhase::is_terminal);
                            seen.unfinished.insert(c.name_any(), !done);
                        }
                        Ok(watcher::Event::InitDone) => listed += 1,
                        _ => {}
                    }
                    let now = seen.unfinished.values().filter(|u| **u).count();
                    seen.most_unfinished = seen.most_unfinished.max(now);
                }
            }
            if listed == 2
                && let Some(tx) = ready_tx.take()
            {
                let _ = tx.send(());
            }
        }
    });
    ready.await.expect("the watches started");
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    (seen, Abort(handle))
}

fn sim_step(millis: u64) -> serde_json::Value {
    sim_task_spec("sim-step", &SimWorker::running_for(millis).exit_code(0))
}

async fn create_dag(client: &Client, ns: &str, dag: serde_json::Value) {
    let dag: AxDag = serde_json::from_value(dag).expect("an AxDag");
    let api: Api<AxDag> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &dag)
        .await
        .expect("create dag");
}

/// Waits until the worker pods in `ns` whose names start with `prefix` are `want`.
async fn wait_pods(client: &Client, ns: &str, prefix: &str, want: &BTreeSet<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left: BTreeSet<String> = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=worker"))
            .await
            .expect("pods")
            .into_iter()
            .map(|p| p.name_any())
            .filter(|name| name.starts_with(prefix))
            .collect();
        if left == *want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the worker pods {prefix}* left are {left:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn wait_dag(client: &Client, ns: &str, name: &str, want: DagPhase) -> AxDag {
    wait_for(client, ns, name, Duration::from_secs(600), |d: &AxDag| {
        dag_phase(d) == Some(want)
    })
    .await
}

/// `split -> map (range 2,000, parallelism 200) -> join`: every item runs once as
/// `<dag>-map-<index>` with its index, never more than 200 at once, join starts after the last,
/// and the DAG object stays small throughout.
#[tokio::test]
async fn a_range_of_two_thousand_items_runs_under_its_parallelism_and_the_dag_stays_small() {
    const ITEMS: usize = 2000;
    const PARALLELISM: usize = 200;
    let client = client().await;
    let ns = namespace(&client, "fanout-range").await;
    let (seen, _watch) = watch(&client, &ns, "orders").await;
    create_dag(
        &client,
        &ns,
        serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "orders"},
            "spec": {"tasks": [
                {"name": "split", "spec": sim_step(100)},
                {"name": "map", "dependsOn": ["split"],
                    "spec": sim_task_spec("sim-step", &SimWorker::running_for(200).message("{\"ok\": true}")),
                    "forEach": {"range": {"count": ITEMS}, "parallelism": PARALLELISM}},
                {"name": "join", "dependsOn": ["map"], "spec": sim_step(100)},
            ]},
        }),
    )
    .await;
    let dag = wait_dag(&client, &ns, "orders", DagPhase::Succeeded).await;

    let status = dag.status.as_ref().expect("status");
    assert_eq!(status.progress.as_deref(), Some("3/3"));
    let map = node(&dag, "map");
    assert_eq!(map.phase, DagNodePhase::Succeeded);
    assert_eq!(map.task, None, "a forEach task has no one child");
    assert_eq!(
        items(&dag, "map"),
        &DagItemsStatus {
            total: ITEMS as u32,
            succeeded: ITEMS as u32,
            ..DagItemsStatus::default()
        }
    );
    let kids = children(&client, &ns, "orders").await;
    let items_run: Vec<&AxTask> = kids
        .values()
        .filter(|c| c.labels().contains_key("ax.dev/item"))
        .collect();
    assert_eq!(items_run.len(), ITEMS, "one child per item");
    for child in &items_run {
        let index = &child.labels()["ax.dev/item"];
        assert_eq!(child.name_any(), format!("orders-map-{index}"));
        assert_eq!(child.labels()["ax.dev/dag-task"], "map");
        assert_eq!(phase(child), Some(TaskPhase::Succeeded), "{}", names(child));
        let status = child.status.as_ref().expect("status");
        assert_eq!(status.attempt, 1, "{} ran once", names(child));
        let payload = child.spec.payload.as_ref().expect("payload");
        assert_eq!(payload["itemIndex"].to_string(), *index);
        assert_eq!(
            payload["item"].to_string(),
            *index,
            "a range's item is its index"
        );
    }
    let last_item = items_run
        .iter()
        .filter_map(|c| c.status.as_ref()?.finished_at)
        .max()
        .expect("finished items");
    let join = &kids["orders-join"];
    let inputs = &join.spec.payload.as_ref().expect("join's payload")["inputs"];
    assert_eq!(
        (&inputs["map"]["outputs"], &inputs["map"]["succeeded"]),
        (&serde_json::json!(ITEMS), &serde_json::json!(ITEMS)),
        "join gets the count of the items' outputs: {inputs}"
    );
    assert_eq!(
        items_run[0].status.as_ref().and_then(|s| s.output.clone()),
        Some(serde_json::json!({"ok": true}))
    );
    let join_queued = join
        .status
        .as_ref()
        .and_then(|s| s.queued_at)
        .expect("join queued");
    assert!(
        join_queued >= last_item,
        "join queued before the last item ended"
    );
    // Queued, not created: creationTimestamp has whole seconds only.
    let first_item = items_run
        .iter()
        .filter_map(|c| c.status.as_ref()?.queued_at)
        .min()
        .expect("queued items");
    let split_end = kids["orders-split"]
        .status
        .as_ref()
        .and_then(|s| s.finished_at)
        .expect("split finished");
    assert!(
        first_item >= split_end,
        "an item was queued before split ended"
    );

    // Succeeded items keep no pod.
    wait_pods(&client, &ns, "orders-map-", &BTreeSet::new()).await;

    let seen = seen.lock().unwrap();
    eprintln!(
        "largest AxDag: {} bytes; most items at work at once: {}",
        seen.largest_dag, seen.most_unfinished
    );
    assert!(
        seen.largest_dag < 64 * 1024,
        "the AxDag grew to {} bytes",
        seen.largest_dag
    );
    assert!(
        seen.most_unfinished <= PARALLELISM,
        "{} items at work at once, parallelism {PARALLELISM}",
        seen.most_unfinished
    );
    assert!(
        seen.most_unfinished >= PARALLELISM / 2,
        "the parallelism was not used: at most {} at once",
        seen.most_unfinished
    );
}

/// `split` outputs a list of 500 order numbers; `map` runs once per element (`fromOutput`), 3 of
/// which fail for good, and `after` depends on it: tolerated by `maxFailedItems: 5`, the DAG
/// Succeeds and names the 3; with `maxFailedItems: 2` it Fails at the third failure, creates no
/// further item, and `after` is Skipped.
#[tokio::test]
async fn failed_items_are_tolerated_up_to_max_failed_items_and_then_fail_the_dag_at_once() {
    const FAILING: [u32; 3] = [3, 17, 18];
    const ITEMS: u32 = 500;
    let client = client().await;
    let ns = namespace(&client, "fanout-fail").await;
    let orders: Vec<u32> = (1000..1000 + ITEMS).collect();
    let output = serde_json::json!({"orders": orders}).to_string();
    assert!(output.len() < 4095, "an output fits a termination message");
    let dag = |name: &str, max_failed: u32, parallelism: u32| {
        let split = SimWorker::running_for(100).message(output.clone());
        let worker = SimWorker::running_for(300)
            .exit_code(3)
            .failing_items(&FAILING);
        let mut spec = sim_task_spec("sim-item", &worker);
        spec["retry"] = serde_json::json!({"maxRetries": 0});
        serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": name},
            "spec": {"tasks": [
                {"name": "split", "spec": sim_task_spec("sim-split", &split)},
                {"name": "map", "dependsOn": ["split"], "spec": spec, "forEach": {
                    "fromOutput": {"task": "split", "path": "orders"},
                    "parallelism": parallelism, "maxFailedItems": max_failed}},
                {"name": "after", "dependsOn": ["map"], "spec": sim_step(100)},
            ]},
        })
    };
    create_dag(&client, &ns, dag("tolerant", 5, 50)).await;
    // One at a time: the third failure comes with items 19..40 still to create.
    create_dag(&client, &ns, dag("strict", 2, 1)).await;

    let tolerant = wait_dag(&client, &ns, "tolerant", DagPhase::Succeeded).await;
    let counts = items(&tolerant, "map");
    assert_eq!(
        (
            counts.total,
            counts.succeeded,
            counts.failed,
            counts.at_work
        ),
        (ITEMS, ITEMS - 3, 3, 0)
    );
    assert_eq!(counts.failed_indexes, "3,17-18");
    assert_eq!(node(&tolerant, "after").phase, DagNodePhase::Succeeded);
    let kids = children(&client, &ns, "tolerant").await;
    let split = kids["tolerant-split"].status.as_ref().expect("status");
    assert_eq!(
        split.output.as_ref(),
        Some(&serde_json::from_str(&output).unwrap())
    );
    let child = &kids["tolerant-map-17"];
    assert_eq!(phase(child), Some(TaskPhase::Dead));
    assert_eq!(
        child.spec.payload.as_ref().expect("payload")["item"],
        serde_json::json!(1017),
        "an item is its element of the parent's list"
    );
    let after = kids["tolerant-after"]
        .spec
        .payload
        .as_ref()
        .expect("payload");
    assert_eq!(
        after["inputs"]["map"],
        serde_json::json!({"total": ITEMS, "succeeded": ITEMS - 3, "failed": 3,
            "failedIndexes": "3,17-18", "outputs": 0}),
        "a fan-out gives its dependents its counts"
    );
    // A succeeded item's worker pod goes once its success is recorded; a failed item's stays, for
    // its logs, and so does the pod of a task that is no item.
    let want: BTreeSet<String> = ["tolerant-map-3-1", "tolerant-map-17-1", "tolerant-map-18-1"]
        .map(String::from)
        .into();
    wait_pods(&client, &ns, "tolerant-map-", &want).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let split_pod = pods.get_opt("tolerant-split-1").await.expect("read");
    assert!(
        split_pod.is_some(),
        "the pod of a task that is no item stays"
    );

    let strict = wait_dag(&client, &ns, "strict", DagPhase::Failed).await;
    let counts = items(&strict, "map");
    assert_eq!(node(&strict, "map").phase, DagNodePhase::Dead);
    assert_eq!(
        (counts.failed, counts.failed_indexes.as_str()),
        (3, "3,17-18")
    );
    assert!(
        counts.message.contains("more than maxFailedItems 2"),
        "{counts:?}"
    );
    assert_eq!(node(&strict, "after").phase, DagNodePhase::Skipped);
    // Give a wrong operator time to create more, then count.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kids = children(&client, &ns, "strict").await;
    let highest = kids
        .values()
        .filter_map(|c| c.labels().get("ax.dev/item")?.parse::<u32>().ok())
        .max();
    assert_eq!(
        highest,
        Some(18),
        "an item was created after the third failure"
    );
    assert_eq!(kids.len(), 20, "split and 19 items");
}

/// `kubectl ax retry` of a DAG whose fan-out failed re-runs only the failed items: the ones that
/// Succeeded keep their one attempt.
#[tokio::test]
async fn a_rerun_of_a_failed_fan_out_runs_only_its_failed_items_again() {
    let client = client().await;
    let ns = namespace(&client, "fanout-rerun").await;
    let worker = SimWorker::running_for(200)
        .exit_code(3)
        .failing_items(&[2, 5]);
    let mut spec = sim_task_spec("sim-item", &worker);
    spec["retry"] = serde_json::json!({"maxRetries": 0});
    create_dag(
        &client,
        &ns,
        serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "again"},
            "spec": {"failurePolicy": "ContinueIndependent", "tasks": [
                {"name": "map", "spec": spec, "forEach": {"range": {"count": 8}}},
            ]},
        }),
    )
    .await;
    // Item 2's failure puts "all succeed" out of reach: the node fails at once and cancels the
    // items still at work, so which items failed (Dead or Canceled) depends on timing.
    let failed = wait_dag(&client, &ns, "again", DagPhase::Failed).await;
    let failed_items = indexes(&items(&failed, "map").failed_indexes);
    assert!(failed_items.contains(&2), "{failed_items:?}");
    let attempts_before: BTreeMap<String, i32> = children(&client, &ns, "again")
        .await
        .into_iter()
        .map(|(name, child)| (name, child.status.map_or(0, |s| s.attempt)))
        .collect();

    // The failing items now succeed: their template no longer sets the exit code.
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for index in [2, 5] {
        let name = format!("again-map-{index}");
        let child = api.get(&name).await.expect("child");
        let mut template = serde_json::to_value(&child.spec.template).expect("template");
        template["spec"]["containers"][0]["env"]
            .as_array_mut()
            .expect("env")
            .retain(|e| e["name"] != "AX_SIM_EXIT_CODE");
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"template": template}})),
        )
        .await
        .expect("patch the child");
    }
    common::cli::ax_async(&ns, &["retry", "dag/again"])
        .await
        .ok();
    let again = wait_dag(&client, &ns, "again", DagPhase::Succeeded).await;
    assert_eq!(items(&again, "map").succeeded, 8);
    for (name, child) in children(&client, &ns, "again").await {
        let index: u32 = child.labels()["ax.dev/item"].parse().expect("index");
        let attempts = child.status.as_ref().expect("status").attempt;
        let before = attempts_before[&name];
        let want = if failed_items.contains(&index) {
            before + 1
        } else {
            before
        };
        assert_eq!(attempts, want, "{name}: failed items {failed_items:?}");
    }
}
