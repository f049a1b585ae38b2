//! AxDag on the real cluster, driven through the API server with the operator started by
//! e2e/run-tests.sh: the children are real AxTasks on the real kubelet (or on simulated nodes for
//! the large DAG).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax::api::{AxDag, AxTask, DagNodePhase, DagPhase, TaskPhase};
use common::sim::{SimWorker, sim_task_spec, sim_task_with};
use common::*;
use futures::StreamExt;
use jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

async fn create_dag(client: &Client, ns: &str, dag: &AxDag) {
    let api: Api<AxDag> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), dag)
        .await
        .expect("create dag");
}

/// A fresh namespace for `test` holding the example DAG `file` as `name` (adjusted by `edit`),
/// once that is in phase `want`: (the client, the namespace, the DAG as it was then).
async fn dag_example_in_phase(
    test: &str,
    file: &str,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    want: DagPhase,
) -> (Client, String, AxDag) {
    let client = client().await;
    let ns = namespace(&client, test).await;
    create_dag(&client, &ns, &example_of(file, name, edit)).await;
    let dag = wait_dag_phase(&client, &ns, name, want, LONG).await;
    (client, ns, dag)
}

fn dag_phase(dag: &AxDag) -> Option<DagPhase> {
    dag.status.as_ref().and_then(|s| s.phase)
}

async fn wait_dag_phase(
    client: &Client,
    ns: &str,
    name: &str,
    want: DagPhase,
    timeout: Duration,
) -> AxDag {
    wait_for(client, ns, name, timeout, |d: &AxDag| {
        dag_phase(d) == Some(want)
    })
    .await
}

/// The DAG's children by task name (from the `ax.dev/dag-task` label).
async fn children(client: &Client, ns: &str, dag: &str) -> BTreeMap<String, AxTask> {
    let api: Api<AxTask> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("ax.dev/dag={dag}")))
        .await
        .expect("list children")
        .items
        .into_iter()
        .map(|child| {
            let task = child.labels()["ax.dev/dag-task"].clone();
            (task, child)
        })
        .collect()
}

fn node_phases(dag: &AxDag) -> BTreeMap<String, DagNodePhase> {
    dag.status
        .as_ref()
        .map(|s| {
            s.nodes
                .iter()
                .map(|(task, node)| (task.clone(), node.phase))
                .collect()
        })
        .unwrap_or_default()
}

fn condition<'a>(dag: &'a AxDag, type_: &str) -> &'a ax::api::Condition {
    dag.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {:#?}", dag.status))
}

/// When the child's worker started: `startedAt`, or its dispatch when the operator never saw the
/// container running (a worker that exits at once).
fn started(child: &AxTask) -> Timestamp {
    let status = child.status.as_ref().expect("child status");
    status.started_at.unwrap_or_else(|| {
        history(child)
            .iter()
            .find(|h| h.to == TaskPhase::Scheduled)
            .map(|h| h.time)
            .unwrap_or_else(|| panic!("{} never dispatched: {:#?}", names(child), status))
    })
}

fn finished(child: &AxTask) -> Timestamp {
    let status = child.status.as_ref().expect("child status");
    status
        .finished_at
        .unwrap_or_else(|| panic!("{} not finished: {status:#?}", names(child)))
}

/// Asserts the DAG's node phases, all of them as `task:Phase`, by task name, and its progress.
fn assert_nodes(dag: &AxDag, want: &str, progress: &str) {
    let nodes: Vec<String> = node_phases(dag)
        .iter()
        .map(|(task, phase)| format!("{task}:{phase:?}"))
        .collect();
    assert_eq!(nodes.join(" "), want);
    let status = dag.status.as_ref().expect("a status");
    assert_eq!(status.progress.as_deref(), Some(progress));
}

/// When the child entered the queue: its first history entry.
fn queued(child: &AxTask) -> Timestamp {
    history(child)
        .first()
        .map(|h| h.time)
        .unwrap_or_else(|| panic!("{} has no history", names(child)))
}

#[tokio::test]
async fn diamond_runs_b_and_c_together_and_d_after_both() {
    let (client, ns, dag) = dag_example_in_phase(
        "dag-diamond",
        "dag-diamond.yaml",
        "diamond",
        |_| {},
        DagPhase::Succeeded,
    )
    .await;

    let kids = children(&client, &ns, "diamond").await;
    assert_eq!(
        kids.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "b", "c", "d"]
    );
    for (task, child) in &kids {
        assert_eq!(phase(child), Some(TaskPhase::Succeeded), "{task}");
        assert_eq!(child.name_any(), format!("diamond-{task}"));
        let owner = &child.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("AxDag", dag.uid().unwrap().as_str(), Some(true))
        );
        assert_eq!(child.labels()["ax.dev/dag"], "diamond");
    }
    let (a, b, c, d) = (&kids["a"], &kids["b"], &kids["c"], &kids["d"]);
    assert!(queued(b) >= finished(a) && queued(c) >= finished(a));
    // d entered the queue only once both b and c had finished.
    assert!(
        queued(d) >= finished(b) && queued(d) >= finished(c),
        "d queued at {} before b finished at {} or c at {}",
        queued(d),
        finished(b),
        finished(c)
    );
    // b and c ran at the same time.
    assert!(
        started(b) < finished(c) && started(c) < finished(b),
        "b ran {}..{}, c ran {}..{}: no overlap",
        started(b),
        finished(b),
        started(c),
        finished(c)
    );

    let status = dag.status.clone().unwrap();
    assert_eq!(status.progress.as_deref(), Some("4/4"));
    assert!(
        status
            .nodes
            .iter()
            .all(|(task, node)| node.phase == DagNodePhase::Succeeded
                && node.task.as_deref() == Some(format!("diamond-{task}").as_str())),
        "{:#?}",
        status.nodes
    );
    let (started_at, finished_at) = (status.started_at.unwrap(), status.finished_at.unwrap());
    assert!(started_at <= queued(a) && finished_at >= finished(d));
    assert_eq!(condition(&dag, "Ready").status, "True");
    assert_eq!(condition(&dag, "InvalidSpec").status, "False");
    assert_eq!(status.observed_generation, dag.metadata.generation);
    wait_events_of(&client, &ns, "AxDag", "diamond", &["Running", "Succeeded"]).await;
}

#[tokio::test]
async fn fail_fast_skips_the_rest_after_a_dead_task() {
    let client = client().await;
    let ns = namespace(&client, "dag-failfast").await;
    // c runs until the test lets it go, so b is Dead while c still runs however slowly b's pod
    // starts (a fixed `sleep` in c raced b's pod start on a loaded machine).
    create_dag(
        &client,
        &ns,
        &example_of::<AxDag>("dag-branch-fails.yaml", "ff", |dag| {
            let c = &mut dag["spec"]["tasks"][2];
            assert_eq!(c["name"], "c");
            c["spec"]["template"]["spec"]["containers"][0]["command"] =
                serde_json::json!(["sh", "-c", "until [ -e /tmp/go ]; do sleep 0.2; done"]);
        }),
    )
    .await;
    let running = wait_for(&client, &ns, "ff", LONG, |d: &AxDag| {
        let nodes = node_phases(d);
        nodes.get("b") == Some(&DagNodePhase::Dead)
            && nodes.get("c") == Some(&DagNodePhase::Running)
    })
    .await;
    // With b Dead and c still at work the DAG has not failed yet, and d and e never start.
    assert_eq!(dag_phase(&running), Some(DagPhase::Running));
    let pods = pods_of(&client, &ns, "ff-c").await;
    let [pod] = pods.as_slice() else {
        panic!("c should have one worker pod, has {}", pods.len());
    };
    assert_eq!(condition(&running, "Failed").status, "False");
    kubectl_ok(&["exec", "-n", &ns, &pod.name_any(), "--", "touch", "/tmp/go"]);
    // `kubectl wait --for=condition=Failed` ends when the DAG fails.
    let ns_wait = ns.clone();
    let waited = tokio::task::spawn_blocking(move || {
        let args = [
            "wait",
            "-n",
            &ns_wait,
            "--for=condition=Failed",
            "axdag/ff",
            "--timeout=180s",
        ];
        run_kubectl(&args, None)
    });
    let dag = wait_dag_phase(&client, &ns, "ff", DagPhase::Failed, LONG).await;
    let (ok, out, err) = waited.await.expect("kubectl wait thread");
    assert!(
        ok,
        "kubectl wait --for=condition=Failed axdag/ff: {out}{err}"
    );
    let kids = children(&client, &ns, "ff").await;

    // b died; c was running then and finished; nothing else started.
    assert_eq!(
        kids.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert_eq!(phase(&kids["b"]), Some(TaskPhase::Dead));
    assert_eq!(phase(&kids["c"]), Some(TaskPhase::Succeeded));
    assert_nodes(
        &dag,
        "a:Succeeded b:Dead c:Succeeded d:Skipped e:Skipped",
        "5/5",
    );
    let status = dag.status.clone().unwrap();
    assert_eq!(status.nodes["d"].task, None);
    // The DAG failed only once the running child had finished.
    assert!(status.finished_at.unwrap() >= finished(&kids["c"]));
    let ready = condition(&dag, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Failed")
    );
    assert!(ready.message.contains("dead: b"), "{}", ready.message);
    assert!(ready.message.contains("skipped: d, e"), "{}", ready.message);
    wait_events_of(&client, &ns, "AxDag", "ff", &["Running", "Failed"]).await;
}

#[tokio::test]
async fn continue_independent_finishes_the_branch_that_does_not_need_the_dead_task() {
    let client = client().await;
    let ns = namespace(&client, "dag-continue").await;
    // c runs until the test lets it go, so e can only start after b is Dead (as in the FailFast
    // test: a fixed `sleep` in c raced b's attempts on a loaded machine).
    create_dag(
        &client,
        &ns,
        &example_of::<AxDag>("dag-branch-fails.yaml", "ci", |dag| {
            dag["spec"]["failurePolicy"] = "ContinueIndependent".into();
            let c = &mut dag["spec"]["tasks"][2];
            assert_eq!(c["name"], "c");
            c["spec"]["template"]["spec"]["containers"][0]["command"] =
                serde_json::json!(["sh", "-c", "until [ -e /tmp/go ]; do sleep 0.2; done"]);
        }),
    )
    .await;
    let running = wait_for(&client, &ns, "ci", LONG, |d: &AxDag| {
        let nodes = node_phases(d);
        nodes.get("b") == Some(&DagNodePhase::Dead)
            && nodes.get("c") == Some(&DagNodePhase::Running)
    })
    .await;
    assert_eq!(dag_phase(&running), Some(DagPhase::Running));
    let pods = pods_of(&client, &ns, "ci-c").await;
    let [pod] = pods.as_slice() else {
        panic!("c should have one worker pod, has {}", pods.len());
    };
    kubectl_ok(&["exec", "-n", &ns, &pod.name_any(), "--", "touch", "/tmp/go"]);
    let dag = wait_dag_phase(&client, &ns, "ci", DagPhase::Failed, LONG).await;
    let kids = children(&client, &ns, "ci").await;
    assert_eq!(
        kids.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "b", "c", "e"]
    );
    assert_eq!(phase(&kids["b"]), Some(TaskPhase::Dead));
    assert_eq!(phase(&kids["e"]), Some(TaskPhase::Succeeded));
    // e started after b was already Dead: the failure did not stop the independent branch.
    assert!(queued(&kids["e"]) > finished(&kids["b"]));
    assert_nodes(
        &dag,
        "a:Succeeded b:Dead c:Succeeded d:Skipped e:Succeeded",
        "5/5",
    );
}

#[tokio::test]
async fn a_cycle_fails_the_dag_naming_the_cycle_and_creates_nothing() {
    let (client, ns, dag) = dag_example_in_phase(
        "dag-cycle",
        "dag-cycle.yaml",
        "cycle",
        |_| {},
        DagPhase::Failed,
    )
    .await;
    let invalid = condition(&dag, "InvalidSpec");
    assert_eq!(invalid.status, "True");
    assert_eq!(invalid.message, "dependency cycle: a -> b -> c -> a");
    assert_eq!(condition(&dag, "Ready").status, "False");
    let status = dag.status.clone().unwrap();
    assert!(status.nodes.is_empty());
    assert_eq!(status.progress.as_deref(), Some("0/3"));
    let events = wait_events_of(&client, &ns, "AxDag", "cycle", &["InvalidSpec"]).await;
    assert!(
        events.iter().any(|e| e
            .message
            .as_deref()
            .unwrap_or("")
            .contains("a -> b -> c -> a")),
        "{events:#?}"
    );
    // The operator has been through this DAG (its status is written): still no AxTask at all.
    assert!(tasks_in(&client, &ns).await.is_empty());
}

#[tokio::test]
async fn an_unknown_dependency_fails_the_dag_naming_it() {
    let (client, ns, dag) = dag_example_in_phase(
        "dag-unknown",
        "dag-diamond.yaml",
        "typo",
        |v| {
            v["spec"]["tasks"][3]["dependsOn"] = serde_json::json!(["b", "cc"]);
        },
        DagPhase::Failed,
    )
    .await;
    assert_eq!(
        condition(&dag, "InvalidSpec").message,
        "task `d` depends on `cc`, which is not a task of this DAG"
    );
    assert!(tasks_in(&client, &ns).await.is_empty());
}

#[tokio::test]
async fn cancel_mid_run_cancels_the_running_children() {
    let client = client().await;
    let ns = namespace(&client, "dag-cancel").await;
    create_dag(
        &client,
        &ns,
        &example_of::<AxDag>("dag-long.yaml", "long", |_| {}),
    )
    .await;
    for task in ["long-first", "long-second"] {
        wait_phase(&client, &ns, task, TaskPhase::Running, LONG).await;
    }
    let running = wait_dag_phase(&client, &ns, "long", DagPhase::Running, LONG).await;
    assert_eq!(
        running.status.as_ref().unwrap().progress.as_deref(),
        Some("0/3")
    );

    let api: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    let patch = serde_json::json!({"spec": {"cancel": true}});
    api.patch("long", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("cancel the dag");
    let dag = wait_dag_phase(&client, &ns, "long", DagPhase::Canceled, LONG).await;

    let kids = children(&client, &ns, "long").await;
    assert_eq!(
        kids.keys().map(String::as_str).collect::<Vec<_>>(),
        ["first", "second"]
    );
    for child in kids.values() {
        assert!(child.spec.cancel, "{} not asked to cancel", names(child));
        assert_eq!(phase(child), Some(TaskPhase::Canceled), "{}", names(child));
        // Canceled straight from Running: the worker was killed, not left to finish.
        assert!(
            phases(child).contains(&TaskPhase::Running),
            "{}",
            names(child)
        );
    }
    assert_nodes(&dag, "after:Skipped first:Canceled second:Canceled", "3/3");
    wait_events_of(&client, &ns, "AxDag", "long", &["Running", "Canceled"]).await;
}

/// A task spec for a simulated node: no real container, it "runs" for `millis` and exits 0.
fn sim_step(millis: u64) -> serde_json::Value {
    sim_task_spec("sim-step", &SimWorker::running_for(millis).exit_code(0))
}

/// 200 tasks in four blocks of a hub and 49 tasks fanning out of it; each hub waits for all 49
/// of the block before it (fan-in).
fn layered_dag(name: &str, parallelism: u32) -> AxDag {
    const BLOCKS: usize = 4;
    const FAN: usize = 49;
    let mut tasks = Vec::new();
    for block in 0..BLOCKS {
        let hub = format!("h{block}");
        let hub_deps: Vec<String> = if block == 0 {
            Vec::new()
        } else {
            (0..FAN).map(|i| format!("f{}-{i:02}", block - 1)).collect()
        };
        tasks.push(serde_json::json!({"name": hub, "dependsOn": hub_deps, "spec": sim_step(1000)}));
        for i in 0..FAN {
            tasks.push(serde_json::json!({
                "name": format!("f{block}-{i:02}"),
                "dependsOn": [hub],
                "spec": sim_step(1000),
            }));
        }
    }
    assert_eq!(tasks.len(), 200);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxDag",
        "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "tasks": tasks},
    }))
    .expect("an AxDag")
}

#[tokio::test]
async fn two_hundred_tasks_on_sim_nodes_never_exceed_parallelism() {
    const PARALLELISM: usize = 20;
    let client = client().await;
    let ns = namespace(&client, "dag-wide").await;

    // Every child ever seen and whether it is finished; the most unfinished at once.
    #[derive(Default)]
    struct Tally {
        unfinished: HashMap<String, bool>,
        max_at_once: usize,
        events: usize,
    }
    let tally: Arc<Mutex<Tally>> = Arc::default();
    let (listening, watch_ready) = tokio::sync::oneshot::channel();
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let recorder = tally.clone();
    let watch = tokio::spawn(async move {
        let mut listening = Some(listening);
        let mut stream = watcher(tasks, watcher::Config::default().labels("ax.dev/dag=wide"))
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            let mut tally = recorder.lock().unwrap();
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listening.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Apply(child) | watcher::Event::InitApply(child)) => {
                    let done = phase(&child).is_some_and(TaskPhase::is_terminal);
                    tally.unfinished.insert(child.name_any(), !done);
                    tally.events += 1;
                }
                Ok(watcher::Event::Delete(child)) => {
                    tally.unfinished.remove(&child.name_any());
                }
                Ok(watcher::Event::Init) | Err(_) => {}
            }
            let now = tally.unfinished.values().filter(|&&u| u).count();
            tally.max_at_once = tally.max_at_once.max(now);
        }
    });
    watch_ready.await.expect("the watch started");

    create_dag(&client, &ns, &layered_dag("wide", PARALLELISM as u32)).await;
    let dag = wait_dag_phase(
        &client,
        &ns,
        "wide",
        DagPhase::Succeeded,
        Duration::from_secs(600),
    )
    .await;
    watch.abort();

    let status = dag.status.clone().unwrap();
    assert_eq!(status.progress.as_deref(), Some("200/200"));
    let kids = children(&client, &ns, "wide").await;
    assert_eq!(kids.len(), 200);
    assert!(
        kids.values()
            .all(|child| phase(child) == Some(TaskPhase::Succeeded))
    );
    // Each hub entered the queue after every task of the block before it finished.
    for block in 1..4 {
        let hub = queued(&kids[&format!("h{block}")]);
        for i in 0..49 {
            let fan = &kids[&format!("f{}-{i:02}", block - 1)];
            assert!(hub >= finished(fan), "h{block} before {}", names(fan));
        }
    }
    let tally = tally.lock().unwrap();
    eprintln!(
        "most children unfinished at once: {} ({} watch events)",
        tally.max_at_once, tally.events
    );
    assert_eq!(tally.unfinished.len(), 200, "the watch saw every child");
    assert!(
        tally.max_at_once <= PARALLELISM,
        "{} children unfinished at once, parallelism {PARALLELISM}",
        tally.max_at_once
    );
    // The limit was used, not just respected: 49 ready tasks ran 20 at a time.
    assert!(
        tally.max_at_once >= PARALLELISM / 2,
        "at most {} children at once",
        tally.max_at_once
    );
}

/// The operator keeps every AxDag whole in its cache: the API server refuses one of more than
/// 500 tasks (naming the field), and takes one of exactly 500.
#[tokio::test]
async fn a_dag_of_more_than_five_hundred_tasks_is_refused() {
    let client = client().await;
    let ns = namespace(&client, "dag-max").await;
    let api: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    let dag = |name: &str, count: usize| -> AxDag {
        let tasks: Vec<serde_json::Value> = (0..count)
            .map(|i| serde_json::json!({"name": format!("t{i:03}"), "spec": sim_step(100)}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1",
            "kind": "AxDag",
            // Canceled from the start: none of the 500 needs to run.
            "metadata": {"name": name},
            "spec": {"cancel": true, "tasks": tasks},
        }))
        .expect("an AxDag")
    };
    let err = api
        .create(&PostParams::default(), &dag("too-many", 501))
        .await
        .expect_err("a DAG of 501 tasks was accepted");
    let message = err.to_string();
    assert!(
        message.contains("spec.tasks") && message.contains("500"),
        "{message}"
    );
    api.create(&PostParams::default(), &dag("five-hundred", 500))
        .await
        .expect("a DAG of 500 tasks refused");
}

/// `spec.onExit` runs once when the DAG ends, whatever its phase, with the phase in its env and
/// payload; a failing exit handler is recorded and leaves the DAG's phase alone.
#[tokio::test]
async fn the_exit_handler_runs_once_for_a_succeeded_a_failed_and_a_canceled_dag() {
    let client = client().await;
    let ns = namespace(&client, "dag-onexit").await;
    let failing = {
        let mut spec = sim_task_spec("sim-step", &SimWorker::running_for(100).exit_code(3));
        spec["retry"] = serde_json::json!({"maxRetries": 0});
        spec
    };
    let hanging = sim_task_spec("sim-step", &SimWorker::running_for(100).hang());
    let dag = |name: &str, step: serde_json::Value, handler: serde_json::Value| -> AxDag {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": name},
            "spec": {"tasks": [{"name": "step", "spec": step}], "onExit": handler},
        }))
        .expect("an AxDag")
    };
    let mut handler = sim_step(100);
    handler["payload"] = serde_json::json!({"channel": "ops"});
    create_dag(&client, &ns, &dag("ok", sim_step(100), handler.clone())).await;
    create_dag(&client, &ns, &dag("bad", failing.clone(), handler.clone())).await;
    create_dag(&client, &ns, &dag("stop", hanging, handler.clone())).await;
    create_dag(&client, &ns, &dag("sad-handler", sim_step(100), failing)).await;
    wait_for(&client, &ns, "stop-step", LONG, |t: &AxTask| {
        phase(t) == Some(TaskPhase::Running)
    })
    .await;
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.patch(
        "stop",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"cancel": true}})),
    )
    .await
    .expect("cancel");

    let handled = |want: DagNodePhase| {
        move |d: &AxDag| {
            d.status
                .as_ref()
                .and_then(|s| s.on_exit.as_ref())
                .is_some_and(|n| n.phase == want)
        }
    };
    for (name, want) in [
        ("ok", DagPhase::Succeeded),
        ("bad", DagPhase::Failed),
        ("stop", DagPhase::Canceled),
    ] {
        let dag = wait_for(&client, &ns, name, LONG, handled(DagNodePhase::Succeeded)).await;
        let status = dag.status.clone().expect("status");
        assert_eq!(status.phase, Some(want), "{name}");
        let on_exit = status.on_exit.clone().expect("onExit");
        assert_eq!(
            on_exit.task.as_deref(),
            Some(format!("{name}-onexit").as_str())
        );
        let kids = children(&client, &ns, name).await;
        let handler = &kids["onexit"];
        let payload = handler.spec.payload.as_ref().expect("payload");
        assert_eq!(payload["channel"], "ops", "the handler's own payload stays");
        assert_eq!(payload["dag"]["phase"], want.as_str(), "{name}");
        assert_eq!(payload["dag"]["name"], name);
        let env = &handler.spec.template.containers()[0].env;
        let phase_var = env
            .iter()
            .flatten()
            .find(|e| e.name == "AX_DAG_PHASE")
            .and_then(|e| e.value.clone());
        assert_eq!(phase_var.as_deref(), Some(want.as_str()));
        let handler_status = handler.status.as_ref().expect("handler status");
        assert_eq!(handler_status.attempt, 1, "{name}: the handler ran once");
        let queued = handler_status.queued_at.expect("queued");
        assert!(
            queued >= status.finished_at.expect("finishedAt"),
            "{name}: the handler was queued before the DAG finished"
        );
        assert_eq!(kids.len(), 2, "{name}: one step and one handler");
    }
    let sad = wait_for(
        &client,
        &ns,
        "sad-handler",
        LONG,
        handled(DagNodePhase::Dead),
    )
    .await;
    assert_eq!(
        dag_phase(&sad),
        Some(DagPhase::Succeeded),
        "the DAG's phase stands"
    );
    wait_events_of(&client, &ns, "AxDag", "sad-handler", &["OnExitFailed"]).await;

    // A task named like the handler's child is refused while there is a handler.
    let mut clash = dag("clash", sim_step(100), sim_step(100));
    clash.spec.tasks[0].name = "onexit".into();
    create_dag(&client, &ns, &clash).await;
    let clash = wait_dag_phase(&client, &ns, "clash", DagPhase::Failed, LONG).await;
    assert!(
        condition(&clash, "InvalidSpec")
            .message
            .contains("exit handler"),
        "{:#?}",
        clash.status
    );
}

/// Outputs on simulated nodes (the real kubelet's are in examples/dag-outputs.yaml): `a` writes
/// JSON and `b` plain text to `$AX_OUTPUT_FILE`; `both` gets them as `inputs`. A task whose output
/// is over the limit still Succeeds, with reason `OutputTooLarge` and no output. A `fromOutput`
/// over an output that is no list fails its DAG saying so, and creates no item.
#[tokio::test]
async fn outputs_reach_the_dependents_and_an_output_over_the_limit_is_named() {
    let client = client().await;
    let ns = namespace(&client, "dag-outputs").await;
    let writing = |message: &str| {
        sim_task_spec(
            "sim-step",
            &SimWorker::running_for(100).message(message.to_owned()),
        )
    };
    let dag: AxDag = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": "pass"},
        "spec": {"tasks": [
            {"name": "a", "spec": writing("{\"n\": 42, \"ids\": [7, 8]}\n")},
            {"name": "b", "spec": writing("done\n")},
            {"name": "quiet", "spec": sim_step(100)},
            {"name": "both", "dependsOn": ["a", "b", "quiet"], "spec": sim_step(100)},
        ]},
    }))
    .expect("an AxDag");
    create_dag(&client, &ns, &dag).await;
    let no_list: AxDag = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": "no-list"},
        "spec": {"tasks": [
            {"name": "b", "spec": writing("done")},
            {"name": "map", "dependsOn": ["b"], "spec": sim_step(100),
                "forEach": {"fromOutput": {"task": "b"}}},
        ]},
    }))
    .expect("an AxDag");
    create_dag(&client, &ns, &no_list).await;
    let big = "x".repeat(5000);
    let large = sim_task_with(
        "large",
        "sim-step",
        &SimWorker::running_for(100).message(big),
        |_| {},
    );
    create(&client, &ns, &large).await;

    wait_dag_phase(&client, &ns, "pass", DagPhase::Succeeded, LONG).await;
    let kids = children(&client, &ns, "pass").await;
    let output = |name: &str| kids[name].status.as_ref().and_then(|s| s.output.clone());
    assert_eq!(
        output("a"),
        Some(serde_json::json!({"n": 42, "ids": [7, 8]}))
    );
    assert_eq!(output("b"), Some(serde_json::json!("done")));
    assert_eq!(output("quiet"), None);
    let payload = kids["both"].spec.payload.clone().expect("payload");
    assert_eq!(
        payload["inputs"],
        serde_json::json!({"a": {"n": 42, "ids": [7, 8]}, "b": "done", "quiet": null})
    );
    assert_eq!(
        kids["a"].spec.payload, None,
        "a task without parents gets no inputs"
    );

    let failed = wait_dag_phase(&client, &ns, "no-list", DagPhase::Failed, LONG).await;
    let map = &failed.status.as_ref().expect("status").nodes["map"];
    assert_eq!(map.phase, DagNodePhase::Dead);
    let message = &map.items.as_ref().expect("items").message;
    assert!(
        message.contains(
            "task `map`: forEach.fromOutput: the output of task `b` is a string, not a list"
        ),
        "{message}"
    );
    let items = children(&client, &ns, "no-list").await;
    assert_eq!(items.len(), 1, "no item was created: {:?}", items.keys());

    let large = wait_phase(&client, &ns, "large", TaskPhase::Succeeded, LONG).await;
    let status = large.status.as_ref().expect("status");
    assert_eq!(status.reason.as_deref(), Some("OutputTooLarge"));
    assert_eq!(status.output, None);
    let last = status.history.last().expect("history");
    assert!(last.message.contains("over 4095 bytes"), "{}", last.message);
    wait_events(&client, &ns, "large", &["OutputTooLarge"]).await;
}
