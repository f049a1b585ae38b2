//! At most one live worker per task, on the real cluster: workers that ignore SIGTERM, pods held by
//! finalizers, sidecars, probes at the soft timeout, image and quota errors, big payloads, and DAG
//! children deleted as soon as they finish. Every pod of a task is audited from a watch.

mod common;

use std::time::Duration;

use ax::api::{AxDag, AxTask, FailureKind, TaskPhase};
use common::audit::audit;
use common::*;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

fn condition(t: &AxTask, type_: &str) -> Option<(String, String, String)> {
    t.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// A task running `script` on the real kubelet.
fn shell_task(name: &str, script: &str, edit: impl FnOnce(&mut serde_json::Value)) -> AxTask {
    example("hello.yaml", name, |v| {
        v["spec"]["type"] = "fencing".into();
        v["spec"]["template"]["spec"]["containers"][0]["command"] =
            serde_json::json!(["sh", "-c", script]);
        v["spec"]["retry"] = serde_json::json!({
            "maxRetries": 1, "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
        edit(v);
    })
}

fn terminal(t: &AxTask) -> bool {
    phase(t).is_some_and(TaskPhase::is_terminal)
}

/// A worker that ignores SIGTERM and a long grace period: attempt 2 starts only after attempt 1's
/// pod is gone, and the task is Dead only when no pod of it is alive.
#[tokio::test]
async fn a_worker_that_ignores_sigterm_never_overlaps_its_next_attempt() {
    let client = client().await;
    let ns = namespace(&client, "sigterm").await;
    let audit = audit(&client, &ns);
    let task = shell_task("stubborn", "trap '' TERM; sleep 300", |v| {
        v["spec"]["timeout"] = serde_json::json!({"hardSeconds": 8});
        v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 40.into();
    });
    create(&client, &ns, &task).await;
    let t = wait_task(&client, &ns, "stubborn", Duration::from_secs(150), terminal).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Dead), "{:#?}", s.history);
    assert_eq!(s.attempt, 2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.assert_one_live_worker("stubborn");
    assert_eq!(
        audit.pod_lifecycle("stubborn"),
        vec![
            ('+', "1".to_string()),
            ('-', "1".to_string()),
            ('+', "2".to_string()),
            ('-', "2".to_string())
        ],
        "attempt 2 was created only after attempt 1's pod was gone, and the task was Dead only after attempt 2's"
    );
    assert!(
        history(&t).iter().any(|h| h.to == TaskPhase::TimedOut),
        "{:#?}",
        history(&t)
    );
}

/// With `podReplacementPolicy: TerminatingOrFailed` the next attempt starts while the old pod is
/// still terminating, as documented (the Job controller's default).
#[tokio::test]
async fn terminating_or_failed_starts_the_next_attempt_beside_a_terminating_pod() {
    let client = client().await;
    let ns = namespace(&client, "tof").await;
    let audit = audit(&client, &ns);
    let task = shell_task(
        "eager",
        "[ \"$AX_ATTEMPT\" -ge 2 ] && exit 0; trap '' TERM; sleep 300",
        |v| {
            // Attempt 2 must start and exit within it too, beside a terminating pod on a busy node.
            v["spec"]["timeout"] = serde_json::json!({"hardSeconds": 20});
            v["spec"]["retry"]["podReplacementPolicy"] = "TerminatingOrFailed".into();
            v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 40.into();
        },
    );
    create(&client, &ns, &task).await;
    let t = wait_task(&client, &ns, "eager", Duration::from_secs(120), terminal).await;
    assert_eq!(phase(&t), Some(TaskPhase::Succeeded), "{:#?}", history(&t));
    assert_eq!(t.status.as_ref().unwrap().attempt, 2);
    let lifecycle = audit.pod_lifecycle("eager");
    let created_2 = lifecycle.iter().position(|e| *e == ('+', "2".to_string()));
    let gone_1 = lifecycle.iter().position(|e| *e == ('-', "1".to_string()));
    assert!(
        created_2.is_some() && (gone_1.is_none() || created_2 < gone_1),
        "attempt 2 should start while attempt 1 terminates: {lifecycle:?}"
    );
    assert!(audit.overlapped("eager"));
}

/// A worker that finishes its work after its hard timeout, during its grace period, before any
/// next attempt: the task Succeeds after one attempt.
#[tokio::test]
async fn a_worker_that_exits_zero_after_its_hard_timeout_succeeds_once() {
    let client = client().await;
    let ns = namespace(&client, "late").await;
    let task = shell_task(
        "late",
        "trap 'sleep 3; echo finished; exit 0' TERM; echo armed; sleep 300 & wait $!",
        |v| {
            // No timeout until the worker has set its trap: a worker killed before that has not
            // done its work and rightly runs again, and in CI a pod has taken over 40 s to start.
            v["spec"]["timeout"] = serde_json::json!({"hardSeconds": 600});
            v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30.into();
        },
    );
    create(&client, &ns, &task).await;
    wait_log_line(&client, &ns, "late-1", "armed", LONG).await;
    // The hard timeout is read from the spec at each decision, so shortening it times out now.
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let shorten = Patch::Merge(serde_json::json!({"spec": {"timeout": {"hardSeconds": 1}}}));
    tasks
        .patch("late", &PatchParams::default(), &shorten)
        .await
        .unwrap();
    let t = wait_task(&client, &ns, "late", Duration::from_secs(150), terminal).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Succeeded), "{:#?}", s.history);
    assert_eq!(s.attempt, 1, "the work ran once: {:#?}", s.history);
    let reasons: Vec<&str> = s.history.iter().map(|h| h.reason.as_str()).collect();
    assert!(reasons.contains(&"HardTimeout"), "{reasons:?}");
    assert_eq!(
        reasons.last(),
        Some(&"CompletedAfterTimeout"),
        "{reasons:?}"
    );
}

/// Waits until the log of `pod`'s worker has a line `line`.
async fn wait_log_line(client: &Client, ns: &str, pod: &str, line: &str, timeout: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        // Not found or not started yet is an error here; either way, look again.
        if let Ok(log) = pods.logs(pod, &Default::default()).await
            && log.lines().any(|l| l == line)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{ns}/{pod} logged no line {line:?} in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A pod kept Terminating by a finalizer: the canceled task shows Canceled at once, keeps its
/// slot (the next task of a concurrency-1 queue does not start) and says why, until it is gone.
#[tokio::test]
async fn a_pod_held_by_a_finalizer_holds_the_slot_until_it_is_gone() {
    let client = client().await;
    let ns = namespace(&client, "finalizer").await;
    let queue = queue::create_queue(&client, "one", serde_json::json!({"concurrency": 1})).await;
    let queue_name = queue.name.clone();
    let in_queue = |v: &mut serde_json::Value| {
        v["spec"]["queue"] = queue_name.clone().into();
        v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2.into();
    };
    create(&client, &ns, &shell_task("holder", "sleep 300", in_queue)).await;
    wait_phase(&client, &ns, "holder", TaskPhase::Running, LONG).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let hold = Patch::Merge(serde_json::json!({"metadata": {"finalizers": ["e2e.ax.dev/hold"]}}));
    pods.patch("holder-1", &PatchParams::default(), &hold)
        .await
        .unwrap();
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let cancel = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    tasks
        .patch("holder", &PatchParams::default(), &cancel)
        .await
        .unwrap();
    let t = wait_task(&client, &ns, "holder", LONG, |t| {
        phase(t) == Some(TaskPhase::Canceled)
            && condition(t, "WorkerTerminating").is_some_and(|c| c.0 == "True")
    })
    .await;
    let (_, reason, message) = condition(&t, "WorkerTerminating").unwrap();
    assert_eq!(reason, "WaitingForPod");
    assert!(message.contains("holder-1"), "{message}");

    create(&client, &ns, &shell_task("next", "exit 0", in_queue)).await;
    // The pod is killed (the kubelet reports it Failed) but still exists: the slot stays held.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let next = wait_task(&client, &ns, "next", LONG, |t| phase(t).is_some()).await;
    assert_eq!(phase(&next), Some(TaskPhase::Pending), "{:#?}", next.status);
    let held = condition(&next, "Queued").expect("Queued");
    assert_eq!(
        (held.0.as_str(), held.1.as_str()),
        ("True", "ConcurrencyLimit")
    );
    assert!(pods.get_opt("holder-1").await.unwrap().is_some());

    let release = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    pods.patch("holder-1", &PatchParams::default(), &release)
        .await
        .unwrap();
    wait_phase(&client, &ns, "next", TaskPhase::Succeeded, LONG).await;
    let t = wait_task(&client, &ns, "holder", LONG, |t| {
        condition(t, "WorkerTerminating").is_some_and(|c| c.0 == "False")
    })
    .await;
    assert_eq!(phase(&t), Some(TaskPhase::Canceled));
}

/// A dispatch creates the worker pod beside its status write; when the write does not land (a
/// conflict, the operator stopped), the task is Pending and its next attempt's pod exists. Such a
/// pod is made by hand here, under a paused queue: the attempt is taken up with it, never with a
/// second pod. Made for a task still in its `startAfter` wait, it is stopped instead.
#[tokio::test]
async fn a_pod_created_beside_a_dispatch_write_that_did_not_land_is_taken_up_not_doubled() {
    let client = client().await;
    let ns = namespace(&client, "beside").await;
    let audit = audit(&client, &ns);
    let queue = queue::create_queue(&client, "paused", serde_json::json!({"concurrency": 0})).await;
    let queue_name = queue.name.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod_of = |task: &AxTask| ax::core::worker::build_pod(task, 1, "{}");

    create(
        &client,
        &ns,
        &shell_task("taken", "exit 0", |v| {
            v["spec"]["queue"] = queue_name.clone().into();
        }),
    )
    .await;
    let waiting = wait_task(&client, &ns, "taken", LONG, |t| {
        condition(t, "Queued").is_some_and(|c| c.0 == "True" && c.1 == "ConcurrencyLimit")
    })
    .await;
    let made = pods
        .create(&PostParams::default(), &pod_of(&waiting))
        .await
        .unwrap();
    let t = wait_phase(&client, &ns, "taken", TaskPhase::Succeeded, LONG).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.attempt, 1, "{:#?}", s.history);
    assert_eq!(s.worker.as_deref(), Some("taken-1"));
    assert!(
        history(&t)
            .iter()
            .any(|h| h.to == TaskPhase::Scheduled && h.message.contains("created at its dispatch")),
        "{:#?}",
        history(&t)
    );
    let pod = pods.get("taken-1").await.unwrap();
    assert_eq!(
        pod.metadata.uid, made.metadata.uid,
        "the pod made is the one that ran"
    );

    let start_after = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    create(
        &client,
        &ns,
        &shell_task("early", "exit 0", |v| {
            v["spec"]["startAfter"] = start_after.to_string().into();
        }),
    )
    .await;
    let delayed = wait_task(&client, &ns, "early", LONG, |t| {
        phase(t) == Some(TaskPhase::Pending)
    })
    .await;
    pods.create(&PostParams::default(), &pod_of(&delayed))
        .await
        .unwrap();
    wait_pod_gone(&client, &ns, "early-1", LONG).await;
    let t = wait_task(&client, &ns, "early", LONG, |t| phase(t).is_some()).await;
    assert_eq!(phase(&t), Some(TaskPhase::Pending));
    assert_eq!(t.status.unwrap().attempt, 0);

    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.assert_one_live_worker("taken");
    assert_eq!(
        audit
            .pod_lifecycle("taken")
            .iter()
            .filter(|(sign, _)| *sign == '+')
            .count(),
        1,
        "one pod for the attempt: {:?}",
        audit.pod_lifecycle("taken")
    );
}

/// The main container decides: when it exits 0 the task Succeeds and a sidecar that would sleep
/// forever is stopped.
#[tokio::test]
async fn a_sidecar_that_sleeps_forever_does_not_keep_the_task_running() {
    let client = client().await;
    let ns = namespace(&client, "sidecar").await;
    let task = shell_task("with-sidecar", "sleep 1; exit 0", |v| {
        let spec = &mut v["spec"]["template"]["spec"];
        spec["terminationGracePeriodSeconds"] = 3.into();
        let sidecar = serde_json::json!({"name": "sidecar", "image": "localhost/ax-busybox:1",
            "imagePullPolicy": "Never", "command": ["sleep", "3600"]});
        spec["containers"].as_array_mut().unwrap().push(sidecar);
    });
    create(&client, &ns, &task).await;
    let t = wait_task(&client, &ns, "with-sidecar", LONG, terminal).await;
    assert_eq!(phase(&t), Some(TaskPhase::Succeeded), "{:#?}", history(&t));
    wait_pod_gone(&client, &ns, "with-sidecar-1", LONG).await;
    wait_task(&client, &ns, "with-sidecar", LONG, |t| {
        condition(t, "WorkerTerminating").is_none_or(|c| c.0 == "False")
    })
    .await;
}

/// An image from a registry that does not exist is retried as Infrastructure up to
/// `maxInfrastructureRetries`; an image that may never be pulled is Dead at once.
#[tokio::test]
async fn image_errors_retry_as_infrastructure_up_to_the_bound_or_stop_at_once() {
    let client = client().await;
    let ns = namespace(&client, "image").await;
    let missing_registry = shell_task("no-registry", "exit 0", |v| {
        let c = &mut v["spec"]["template"]["spec"]["containers"][0];
        c["image"] = "registry.invalid/ax/none:1".into();
        c["imagePullPolicy"] = "Always".into();
        v["spec"]["retry"]["maxInfrastructureRetries"] = 2.into();
    });
    let never = shell_task("never-pull", "exit 0", |v| {
        let c = &mut v["spec"]["template"]["spec"]["containers"][0];
        c["image"] = "localhost/ax-absent:1".into();
        // The example's IfNotPresent would try a pull (ErrImagePull, an infrastructure retry).
        c["imagePullPolicy"] = "Never".into();
    });
    create(&client, &ns, &missing_registry).await;
    create(&client, &ns, &never).await;

    let t = wait_task(&client, &ns, "never-pull", LONG, terminal).await;
    let s = t.status.clone().unwrap();
    assert_eq!(
        (s.phase, s.attempt),
        (Some(TaskPhase::Dead), 1),
        "{:#?}",
        s.history
    );
    let failure = s.last_failure.unwrap();
    assert_eq!(
        (failure.kind, failure.reason.as_str()),
        (FailureKind::NonRetryable, "ErrImageNeverPull")
    );

    let t = wait_task(
        &client,
        &ns,
        "no-registry",
        Duration::from_secs(180),
        terminal,
    )
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Dead), "{:#?}", s.history);
    assert_eq!(s.attempt, 3, "the first attempt and two that do not count");
    assert_eq!((s.retries, s.infrastructure_retries), (0, 2));
    assert_eq!(
        s.history.last().map(|h| h.reason.as_str()),
        Some("InfrastructureRetriesExhausted")
    );
    assert!(s.dead_reason.unwrap().contains("maxInfrastructureRetries"));
    assert_eq!(s.last_failure.unwrap().kind, FailureKind::Infrastructure);
}

/// A 250 KiB payload (over Linux's 128 KiB limit for one environment string) reaches the worker
/// whole through its file; the env carries only small payloads.
#[tokio::test]
async fn a_250_kib_payload_is_read_whole_from_the_file() {
    let client = client().await;
    let ns = namespace(&client, "payload").await;
    let blob = "x".repeat(250 * 1024);
    let task = shell_task(
        "big",
        "n=$(wc -c < \"$AX_PAYLOAD_FILE\"); echo \"payload $n bytes\"; [ -z \"$AX_PAYLOAD\" ] && [ \"$n\" -ge 256000 ]",
        |v| v["spec"]["payload"] = serde_json::json!({"blob": blob}),
    );
    create(&client, &ns, &task).await;
    let t = wait_task(&client, &ns, "big", LONG, terminal).await;
    assert_eq!(phase(&t), Some(TaskPhase::Succeeded), "{:#?}", history(&t));
    assert_eq!(t.status.unwrap().attempt, 1);
}

/// A ResourceQuota of 0 pods: the task says why it waits, uses no retry, and runs once the quota
/// is gone.
#[tokio::test]
async fn a_pod_refused_by_a_quota_waits_without_using_retries() {
    let client = client().await;
    let ns = namespace(&client, "quota").await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // The quota controller fills in the usage before the admission plugin enforces it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    create(&client, &ns, &shell_task("quota", "exit 0", |_| {})).await;
    let t = wait_task(&client, &ns, "quota", LONG, |t| {
        t.status
            .as_ref()
            .and_then(|s| s.last_failure.as_ref())
            .is_some_and(|f| f.reason == "PodForbidden")
    })
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.retries, s.infrastructure_retries), (0, 0));
    assert!(
        s.last_failure.unwrap().message.contains("exceeded quota"),
        "{:#?}",
        s.history
    );
    let events = wait_events(&client, &ns, "quota", &["PodForbidden"]).await;
    assert!(events.iter().any(|e| e.type_.as_deref() == Some("Warning")));
    quotas
        .delete("no-pods", &DeleteParams::default())
        .await
        .unwrap();
    let t = wait_task(&client, &ns, "quota", Duration::from_secs(150), terminal).await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Succeeded), "{:#?}", s.history);
    assert_eq!(s.retries, 0);
}

/// At the soft timeout a worker with a readiness probe is asked through it: one whose probe starts
/// failing times out; one whose probe keeps passing only gets the warning.
#[tokio::test]
async fn the_soft_timeout_asks_the_workers_probe() {
    let client = client().await;
    let ns = namespace(&client, "probe").await;
    let probed = |name: &str, script: &str, soft: i64| {
        shell_task(name, script, |v| {
            v["spec"]["timeout"] = serde_json::json!({"softSeconds": soft, "hardSeconds": 120});
            v["spec"]["retry"]["maxRetries"] = 0.into();
            v["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 2.into();
            v["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = serde_json::json!({
                "exec": {"command": ["cat", "/tmp/alive"]}, "periodSeconds": 1, "failureThreshold": 1});
        })
    };
    create(
        &client,
        &ns,
        &probed(
            "stops-answering",
            "touch /tmp/alive; sleep 3; rm /tmp/alive; sleep 300",
            10,
        ),
    )
    .await;
    create(
        &client,
        &ns,
        &probed("answers", "touch /tmp/alive; sleep 16; exit 0", 8),
    )
    .await;
    let t = wait_task(
        &client,
        &ns,
        "stops-answering",
        Duration::from_secs(90),
        terminal,
    )
    .await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.phase, Some(TaskPhase::Dead), "{:#?}", s.history);
    let failure = s.last_failure.unwrap();
    assert_eq!(
        (failure.kind, failure.reason.as_str()),
        (FailureKind::Timeout, "SoftTimeout")
    );
    assert!(failure.message.contains("probe"), "{}", failure.message);

    let t = wait_task(&client, &ns, "answers", Duration::from_secs(90), terminal).await;
    assert_eq!(phase(&t), Some(TaskPhase::Succeeded), "{:#?}", history(&t));
    wait_events(&client, &ns, "answers", &["SoftTimeout"]).await;
}

/// 200 children deleted as soon as they finish (`ttlSecondsAfterFinished: 0`): every child is
/// created exactly once, and the DAG Succeeds.
#[tokio::test]
async fn a_dag_of_two_hundred_children_deleted_at_once_creates_each_exactly_once() {
    let client = client().await;
    let ns = namespace(&client, "dagttl").await;
    let audit = audit(&client, &ns);
    let child = serde_json::json!({
        "type": "ttl-child",
        "ttlSecondsAfterFinished": 0,
        "template": {"spec": {
            "nodeSelector": {"ax.dev/sim-node": "true"},
            "tolerations": [{"key": "ax.dev/sim-node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "w", "image": "localhost/ax-busybox:1",
                "env": [{"name": "AX_SIM_START_MS", "value": "50"}, {"name": "AX_SIM_DURATION_MS", "value": "100"}]}]}}
    });
    let tasks: Vec<serde_json::Value> = (0..200)
        .map(|i| {
            let mut task = serde_json::json!({"name": format!("t{i}"), "spec": child});
            if i >= 10 {
                task["dependsOn"] = serde_json::json!([format!("t{}", i % 10)]);
            }
            task
        })
        .collect();
    let dag: AxDag = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": "ttl"}, "spec": {"parallelism": 50, "tasks": tasks}}))
    .unwrap();
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&PostParams::default(), &dag).await.unwrap();
    let done = wait_for::<AxDag>(&client, &ns, "ttl", Duration::from_secs(300), |d| {
        d.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_terminal())
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!(
        status.phase,
        Some(ax::api::DagPhase::Succeeded),
        "{:?}",
        status.conditions
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let created = audit.task_uids("ttl-");
    assert_eq!(created.len(), 200, "each child exactly once");
}
