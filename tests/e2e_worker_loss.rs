//! At most one live worker per task when a worker's pod leaves the operator's sight in ways other
//! than finishing: its `ax.dev/task` label removed, a pod of a later attempt than the status knows,
//! its node deleted from under it, a canceled worker that takes its grace period to stop. Each test
//! fails on an operator that takes "not in my cache" for "gone" or "terminal" for "final". On the
//! shared operator; workers on the simulated nodes.

mod common;

use std::time::{Duration, Instant};

use ax::api::{AxDag, AxTask, DagPhase, FailureKind, TaskPhase};
use common::cli::ax_async;
use common::sim::{SimWorker, sim_task_spec, sim_task_with};
use common::sim_pool::SimPool;
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

fn pod_live(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

async fn pod(client: &Client, ns: &str, name: &str) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.get_opt(name).await.expect("read pod")
}

async fn task(client: &Client, ns: &str, name: &str) -> AxTask {
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), ns);
    tasks.get(name).await.expect("read task")
}

fn condition_true(t: &AxTask, type_: &str) -> bool {
    t.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    })
}

/// Watches for `window`: `bad` must never hold. Polls the API server (the pods in question may be
/// invisible to a label-selected watch).
async fn never_during(window: Duration, what: &str, mut bad: impl AsyncFnMut() -> Option<String>) {
    let until = Instant::now() + window;
    while Instant::now() < until {
        if let Some(why) = bad().await {
            panic!("{what}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Someone removes the `ax.dev/task` label from a running worker: the operator's pod cache (which
/// selects on that label) no longer shows it, but it still runs. The task must not take it for
/// gone and start attempt 2 beside it; it ends with that worker's own outcome.
#[tokio::test]
async fn a_worker_whose_task_label_is_removed_is_not_replaced_while_it_runs() {
    let client = client().await;
    let ns = namespace(&client, "label-gone").await;
    let worker = SimWorker::running_for(20_000).start_ms(100);
    create(
        &client,
        &ns,
        &sim_task_with("unlabeled", "loss", &worker, |_| {}),
    )
    .await;
    wait_phase(&client, &ns, "unlabeled", TaskPhase::Running, LONG).await;

    let (ok, _, err) = run_kubectl(
        &["-n", &ns, "label", "pod", "unlabeled-1", "ax.dev/task-"],
        None,
    );
    assert!(ok, "{err}");

    never_during(
        Duration::from_secs(12),
        "a second worker beside the first",
        async || {
            let first = pod(&client, &ns, "unlabeled-1").await;
            let second = pod(&client, &ns, "unlabeled-2").await;
            match (first, second) {
                (Some(first), Some(_)) if pod_live(&first) => Some(format!(
                    "unlabeled-2 exists while unlabeled-1 is {:?}",
                    first.status.and_then(|s| s.phase)
                )),
                _ => None,
            }
        },
    )
    .await;
    let t = task(&client, &ns, "unlabeled").await;
    assert_eq!(
        t.status.as_ref().map(|s| s.attempt),
        Some(1),
        "{:#?}",
        t.status
    );

    // The worker finishes on its own: the task takes its outcome, read from the API server.
    let done = wait_phase(&client, &ns, "unlabeled", TaskPhase::Succeeded, LONG).await;
    assert_eq!(done.status.as_ref().map(|s| s.attempt), Some(1));
    assert!(pod(&client, &ns, "unlabeled-2").await.is_none());
}

/// A pod of attempt 3 exists while the task's status says attempt 1 (the state a new leader whose
/// task cache lags its pod cache sees): when attempt 1 fails the task must not start attempt 2
/// beside the running attempt 3, and goes on once that pod is gone.
#[tokio::test]
async fn a_pod_of_a_later_attempt_than_the_status_knows_holds_the_next_attempt() {
    let client = client().await;
    let ns = namespace(&client, "later-pod").await;
    let worker = SimWorker::running_for(4_000).start_ms(100).exit_code(1);
    let spec = sim_task_with("ahead", "loss", &worker, |v| {
        v["spec"]["retry"] = json!({"maxRetries": 3,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
    });
    create(&client, &ns, &spec).await;
    wait_phase(&client, &ns, "ahead", TaskPhase::Running, LONG).await;

    // Attempt 3's pod, as an operator with a newer view of the task would have created it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut later = pods.get("ahead-1").await.unwrap();
    later.metadata = kube::api::ObjectMeta {
        name: Some("ahead-3".into()),
        labels: later.metadata.labels.take().map(|mut l| {
            l.insert("ax.dev/attempt".into(), "3".into());
            l
        }),
        annotations: later.metadata.annotations.take(),
        owner_references: later.metadata.owner_references.take(),
        ..Default::default()
    };
    later.status = None;
    let spec = later.spec.as_mut().unwrap();
    spec.node_name = None;
    spec.containers[0]
        .env
        .get_or_insert_with(Vec::new)
        .push(serde_json::from_value(json!({"name": "AX_SIM_HANG", "value": "true"})).unwrap());
    pods.create(&PostParams::default(), &later).await.unwrap();

    // Attempt 1 fails after 4 s; attempt 2 must wait for attempt 3's pod.
    never_during(
        Duration::from_secs(15),
        "attempt 2 beside attempt 3",
        async || {
            pod(&client, &ns, "ahead-2")
                .await
                .map(|_| "ahead-2 was created while ahead-3 runs".to_string())
        },
    )
    .await;

    pods.delete("ahead-3", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_pod_gone(&client, &ns, "ahead-3", LONG).await;
    wait_task(&client, &ns, "ahead", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.attempt >= 2)
    })
    .await;
}

/// A simulated node of the test's own (so its simulator can be stopped alone) and a task `name` on
/// it whose worker never finishes, with `hardSeconds` and `maxRetries` as given; returns once the
/// task is Running.
async fn hanging_on_a_node_of_its_own(
    client: &Client,
    ns: &str,
    test: &str,
    name: &str,
    hard_seconds: u32,
    max_retries: u32,
) -> SimPool {
    let pool = SimPool::start(client, test, 1, 10).await;
    let mut template = pool.template(0);
    template["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "AX_SIM_HANG", "value": "true"}));
    let t = sim_task_with(name, "loss", &SimWorker::default(), |v| {
        v["spec"]["template"] = template;
        v["spec"]["timeout"] = json!({"hardSeconds": hard_seconds});
        v["spec"]["retry"] = json!({"maxRetries": max_retries,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
    });
    create(client, ns, &t).await;
    wait_phase(client, ns, name, TaskPhase::Running, LONG).await;
    pool
}

/// The Node object of a running worker is deleted while nothing reports on it (its kubelet died
/// with it) and the attempt's hard timeout has passed: Kubernetes 1.20's pod GC force-deletes the
/// pod without marking it Failed, so it stays "Running" on a node that does not exist. The task
/// must not stay TimedOut holding its slot: the pod goes, and the next attempt starts.
#[tokio::test]
async fn a_timed_out_worker_on_a_deleted_node_is_retried_once_its_pod_is_gone() {
    let client = client().await;
    let ns = namespace(&client, "node-gone").await;
    let mut pool = hanging_on_a_node_of_its_own(&client, &ns, "node-gone", "orphaned", 15, 2).await;

    // Nothing answers for the node any more; the kill at the hard timeout is never confirmed.
    pool.stop_simulator();
    wait_phase(&client, &ns, "orphaned", TaskPhase::TimedOut, LONG).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .delete(&pool.nodes[0], &DeleteParams::default())
        .await
        .unwrap();

    // Pod GC removes pods of a deleted node after about 40 s; then the retry.
    wait_pod_gone(&client, &ns, "orphaned-1", Duration::from_secs(180)).await;
    let retried = wait_task(&client, &ns, "orphaned", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.attempt == 2)
    })
    .await;
    let failure = retried
        .status
        .as_ref()
        .and_then(|s| s.last_failure.clone())
        .expect("attempt 1's failure");
    assert_eq!(failure.attempt, 1);
    assert_eq!(failure.kind, FailureKind::Timeout, "{failure:?}");
}

/// The Node object of a running worker is deleted while nothing reports on it, well inside the
/// attempt's timeout: pod GC force-deletes the pod, still "Running". The task must not stay Running
/// on a worker nobody can see: the attempt ends as an infrastructure failure once the pod is gone,
/// and the next attempt starts.
#[tokio::test]
async fn a_running_worker_on_a_deleted_node_is_retried_as_infrastructure() {
    let client = client().await;
    let ns = namespace(&client, "node-lost").await;
    let mut pool =
        hanging_on_a_node_of_its_own(&client, &ns, "node-lost", "stranded", 3600, 0).await;

    pool.stop_simulator();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .delete(&pool.nodes[0], &DeleteParams::default())
        .await
        .unwrap();
    wait_pod_gone(&client, &ns, "stranded-1", Duration::from_secs(180)).await;
    // maxRetries 0: only an infrastructure failure is retried.
    let retried = wait_task(&client, &ns, "stranded", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.attempt == 2)
    })
    .await;
    let s = retried.status.clone().unwrap();
    let failure = s.last_failure.clone().expect("attempt 1's failure");
    assert_eq!(failure.attempt, 1);
    assert_eq!(failure.kind, FailureKind::Infrastructure, "{failure:?}");
    assert_eq!(s.retries, 0, "{s:#?}");
}

/// A canceled child whose worker ignores SIGTERM for its 10 s grace period: the task is Canceled at
/// once, but it is final — and its DAG finished, and `kubectl ax wait` done — only once the worker
/// is gone.
#[tokio::test]
async fn a_canceled_task_is_final_only_once_its_worker_is_gone() {
    let client = client().await;
    let ns = namespace(&client, "final").await;
    let mut step = json!({
        "type": "loss",
        "template": {"spec": SimWorker::default().hang().ignoring_sigterm().pod_spec()},
    });
    step["template"]["spec"]["terminationGracePeriodSeconds"] = 10.into();
    let dag: AxDag = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxDag",
        "metadata": {"name": "slowstop"},
        "spec": {"tasks": [{"name": "a", "spec": step}]},
    }))
    .unwrap();
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&PostParams::default(), &dag).await.unwrap();
    wait_phase(&client, &ns, "slowstop-a", TaskPhase::Running, LONG).await;

    let wait = {
        let ns = ns.clone();
        tokio::spawn(async move { ax_async(&ns, &["wait", "slowstop-a", "--timeout", "2m"]).await })
    };
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let cancel = Patch::Merge(json!({"spec": {"cancel": true}}));
    tasks
        .patch("slowstop-a", &PatchParams::default(), &cancel)
        .await
        .unwrap();
    let canceled = wait_phase(&client, &ns, "slowstop-a", TaskPhase::Canceled, LONG).await;
    assert!(
        condition_true(&canceled, "WorkerTerminating"),
        "{:#?}",
        canceled.status
    );

    // While the worker lives: the DAG is not finished and `kubectl ax wait` has not returned.
    let mut checked = 0;
    while pod(&client, &ns, "slowstop-a-1")
        .await
        .is_some_and(|p| pod_live(&p))
    {
        let d = dags.get("slowstop").await.unwrap();
        let phase = d.status.as_ref().and_then(|s| s.phase);
        assert!(
            !phase.is_some_and(DagPhase::is_terminal),
            "the DAG ended {phase:?} while its canceled child's worker still runs"
        );
        assert!(
            !wait.is_finished(),
            "kubectl ax wait returned while the worker runs"
        );
        checked += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        checked > 5,
        "the worker stopped at once; the test showed nothing"
    );

    wait_pod_gone(&client, &ns, "slowstop-a-1", LONG).await;
    let waited = wait.await.unwrap();
    assert_eq!(waited.code, 0, "{waited:#?}");
    wait_for(&client, &ns, "slowstop", LONG, |d: &AxDag| {
        d.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(DagPhase::is_terminal)
    })
    .await;
    let t = task(&client, &ns, "slowstop-a").await;
    assert!(!condition_true(&t, "WorkerTerminating"), "{:#?}", t.status);
    assert_eq!(t.name_any(), "slowstop-a");
}

/// A running worker that ignores SIGTERM is evicted (the Eviction API, as `kubectl drain` does):
/// the attempt ends as an infrastructure failure, not charged to `maxRetries`, and attempt 2's pod
/// is created only once the evicted pod is gone, its whole 15 s grace period later.
#[tokio::test]
async fn an_evicted_worker_is_retried_as_infrastructure_only_once_its_pod_is_gone() {
    let client = client().await;
    let ns = namespace(&client, "evicted").await;
    let audit = common::audit::audit(&client, &ns);
    let mut spec = sim_task_spec("loss", &SimWorker::default().hang().ignoring_sigterm());
    spec["template"]["spec"]["terminationGracePeriodSeconds"] = 15.into();
    spec["retry"] = json!({
        "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
    let task_json = json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
        "metadata": {"name": "evictee"}, "spec": spec,
    });
    create(&client, &ns, &serde_json::from_value(task_json).unwrap()).await;
    wait_phase(&client, &ns, "evictee", TaskPhase::Running, LONG).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.evict("evictee-1", &EvictParams::default())
        .await
        .expect("evict the worker");
    let evicted = Instant::now();
    let t = wait_task(&client, &ns, "evictee", LONG, |t| {
        history(t).iter().any(|h| h.to == TaskPhase::Failed)
    })
    .await;
    let failed = history(&t)
        .into_iter()
        .find(|h| h.to == TaskPhase::Failed)
        .unwrap();
    assert_eq!(failed.reason, "WorkerDeleted", "{failed:#?}");
    let s = t.status.clone().unwrap();
    let record = s.attempts.iter().find(|a| a.attempt == 1);
    assert_eq!(
        record.and_then(|a| a.failure_kind),
        Some(FailureKind::Infrastructure),
        "{:#?}",
        s.attempts
    );

    wait_for(
        &client,
        &ns,
        "evictee-2",
        Duration::from_secs(120),
        |_: &Pod| true,
    )
    .await;
    let waited = evicted.elapsed();
    assert!(
        waited >= Duration::from_secs(12),
        "attempt 2 started {waited:?} after the eviction, before the evicted worker's 15 s grace ended"
    );
    let t = task(&client, &ns, "evictee").await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.retries, 0, "an eviction is not the task's fault: {s:#?}");
    assert_eq!(s.infrastructure_retries, 1, "{s:#?}");
    assert_eq!(
        audit.pod_lifecycle("evictee")[..3],
        [('+', "1".into()), ('-', "1".into()), ('+', "2".into())]
    );
    audit.assert_one_live_worker("evictee");
    // Stop attempt 2 (it hangs too) so the namespace goes quickly.
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let cancel = Patch::Merge(json!({"spec": {"cancel": true}}));
    tasks
        .patch("evictee", &PatchParams::default(), &cancel)
        .await
        .unwrap();
}

/// A dispatch's pod was evicted or force-deleted before the dispatch's status write landed (the
/// operator died in between): the next look finds the task Pending and that attempt's pod being
/// deleted. It takes the attempt up with it — recorded, failed as infrastructure — instead of
/// waiting for the name to be free and creating a second pod named for the same attempt (what the
/// chaos soak found: the first run left no record). The pod is made by hand under a paused queue,
/// hidden from the operator (no `ax.dev/task` label) until it is being deleted.
#[tokio::test]
async fn a_dispatch_pod_deleted_before_its_status_landed_is_recorded_as_its_attempt() {
    let client = client().await;
    let ns = namespace(&client, "deleted-dispatch").await;
    let audit = common::audit::audit(&client, &ns);
    let queue = queue::create_queue(&client, "deleted-dispatch", json!({"concurrency": 0})).await;
    let t = example("hello.yaml", "unrecorded", |v| {
        v["spec"]["type"] = "loss".into();
        v["spec"]["queue"] = queue.name.clone().into();
    });
    create(&client, &ns, &t).await;
    let waiting = wait_task(&client, &ns, "unrecorded", LONG, |t| {
        phase(t) == Some(TaskPhase::Pending)
    })
    .await;

    const HOLD: &str = "e2e.ax.dev/hold";
    let mut made = ax::core::worker::build_pod(&waiting, 1, "{}");
    let labels = made.metadata.labels.as_mut().unwrap();
    let task_label = labels.remove(ax::core::worker::LABEL_TASK).unwrap();
    made.metadata.finalizers.as_mut().unwrap().push(HOLD.into());
    // Never scheduled: its delete is immediate, held only by the finalizers.
    made.spec.as_mut().unwrap().node_selector =
        Some([("e2e.ax.dev/nowhere".to_string(), "true".to_string())].into());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &made).await.unwrap();
    pods.delete("unrecorded-1", &DeleteParams::default())
        .await
        .unwrap();
    let label = Patch::Merge(json!({"metadata": {"labels": {
        ax::core::worker::LABEL_TASK: task_label}}}));
    pods.patch("unrecorded-1", &PatchParams::default(), &label)
        .await
        .unwrap();

    let t = wait_task(&client, &ns, "unrecorded", LONG, |t| {
        t.status.as_ref().is_some_and(|s| {
            s.attempts
                .iter()
                .any(|a| a.attempt == 1 && a.failure_kind.is_some())
        })
    })
    .await;
    let s = t.status.clone().unwrap();
    let record = s.attempts.iter().find(|a| a.attempt == 1).unwrap();
    assert_eq!(
        record.failure_kind,
        Some(FailureKind::Infrastructure),
        "{s:#?}"
    );
    assert_eq!(s.retries, 0, "{s:#?}");

    let unhold = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    pods.patch("unrecorded-1", &PatchParams::default(), &unhold)
        .await
        .unwrap();
    wait_pod_gone(&client, &ns, "unrecorded-1", LONG).await;
    // The retry is attempt 2, held by the paused queue; attempt 1's name is never created again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = task(&client, &ns, "unrecorded").await;
    assert_eq!(t.status.as_ref().unwrap().attempt, 1, "{:#?}", t.status);
    assert_eq!(
        audit.pod_lifecycle("unrecorded"),
        [('+', "1".into()), ('-', "1".into())]
    );
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    tasks
        .delete("unrecorded", &DeleteParams::default())
        .await
        .unwrap();
}

/// What the 3,000-task soak found: pod GC deleted the previous attempt's pod and, a moment later,
/// the next attempt's pod of a dispatch whose status write did not land. While the first one was
/// still being deleted it fenced the task, so the second was not taken up yet — and its outcome
/// finalizer came off at once: its run left no record and the attempt ran again under the same
/// name. Here attempt 1's pod is held in deletion by a finalizer of the test's past the retry's
/// backoff, and attempt 2's pod is made by hand (hidden from the operator until it is being
/// deleted, as in the test above).
#[tokio::test]
async fn a_next_attempts_pod_keeps_its_outcome_while_the_previous_pod_is_still_being_deleted() {
    let client = client().await;
    let ns = namespace(&client, "fenced-next").await;
    let audit = common::audit::audit(&client, &ns);
    let worker = SimWorker::running_for(1500).start_ms(200).exit_code(1);
    let t = sim_task_with("fenced", "loss", &worker, |v| {
        v["spec"]["retry"] = json!({"maxRetries": 3, "backoff": {"baseSeconds": 5}});
    });
    create(&client, &ns, &t).await;
    const HOLD: &str = "e2e.ax.dev/hold";
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let hold = Patch::Json::<()>(
        serde_json::from_value(
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}]),
        )
        .unwrap(),
    );
    let deadline = Instant::now() + LONG;
    while pods
        .patch("fenced-1", &PatchParams::default(), &hold)
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "no pod fenced-1 within {LONG:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = wait_task(&client, &ns, "fenced", LONG, |t| {
        phase(t) == Some(TaskPhase::Pending) && t.status.as_ref().is_some_and(|s| s.attempt == 1)
    })
    .await;
    // Attempt 1's pod stays being deleted: it fences the task, past its backoff.
    pods.delete("fenced-1", &DeleteParams::default())
        .await
        .unwrap();
    let retry_at = waiting
        .status
        .as_ref()
        .and_then(|s| s.next_attempt_at)
        .unwrap();
    let wait = retry_at.duration_since(jiff::Timestamp::now());
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default() + Duration::from_secs(1)).await;

    let mut made = ax::core::worker::build_pod(&waiting, 2, "{}");
    let labels = made.metadata.labels.as_mut().unwrap();
    let task_label = labels.remove(ax::core::worker::LABEL_TASK).unwrap();
    made.spec.as_mut().unwrap().node_selector =
        Some([("e2e.ax.dev/nowhere".to_string(), "true".to_string())].into());
    pods.create(&PostParams::default(), &made).await.unwrap();
    pods.delete("fenced-2", &DeleteParams::default())
        .await
        .unwrap();
    let label = Patch::Merge(json!({"metadata": {"labels": {
        ax::core::worker::LABEL_TASK: task_label}}}));
    pods.patch("fenced-2", &PatchParams::default(), &label)
        .await
        .unwrap();
    never_during(
        Duration::from_secs(5),
        "attempt 2's pod while attempt 1's fences the task",
        async || {
            let present = pod(&client, &ns, "fenced-2").await.is_some();
            (!present).then(|| "gone, its run unrecorded".to_string())
        },
    )
    .await;

    let unhold = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    pods.patch("fenced-1", &PatchParams::default(), &unhold)
        .await
        .unwrap();
    let t = wait_task(&client, &ns, "fenced", LONG, |t| {
        t.status.as_ref().is_some_and(|s| {
            s.attempts
                .iter()
                .any(|a| a.attempt == 2 && a.failure_kind.is_some())
        })
    })
    .await;
    let s = t.status.clone().unwrap();
    let record = s.attempts.iter().find(|a| a.attempt == 2).unwrap();
    assert_eq!(
        record.failure_kind,
        Some(FailureKind::Infrastructure),
        "{s:#?}"
    );
    assert_eq!(s.retries, 1, "attempt 1's failure only: {s:#?}");
    wait_pod_gone(&client, &ns, "fenced-2", LONG).await;
    let created_2 = audit
        .pod_lifecycle("fenced")
        .iter()
        .filter(|(op, attempt)| *op == '+' && attempt == "2")
        .count();
    assert_eq!(created_2, 1, "{:?}", audit.pod_lifecycle("fenced"));
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    tasks
        .delete("fenced", &DeleteParams::default())
        .await
        .unwrap();
}
