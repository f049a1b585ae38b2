//! AxQueues on the real cluster, with the operator started by e2e/run-tests.sh: priority shares,
//! circuit breakers, live edits, invalid specs, missing queues and the namespaces a queue admits.
//! Workers run on simulated nodes (e2e/sim), so hundreds of tasks finish in seconds. Every test uses
//! its own AxQueue (they are cluster-scoped), so tests running side by side do not share limits.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ax::api::{AxQueue, AxTask, Priority, TaskPhase};
use common::queue::{TestQueue, create_queue, patch_queue, wait_pending, wait_queue};
use common::sim::{SimWorker, sim_task_with};
use common::*;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const PRIORITIES: [Priority; 4] = [
    Priority::Critical,
    Priority::High,
    Priority::Normal,
    Priority::Low,
];

fn queue_condition(queue: &AxQueue, type_: &str) -> Option<(String, String)> {
    queue
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// A task for a simulated node that "runs" for `millis` and exits with `exit_code`; no retries.
fn sim_task(
    name: &str,
    queue: &str,
    priority: Priority,
    task_type: &str,
    millis: u64,
    exit_code: i32,
) -> AxTask {
    let worker = SimWorker::running_for(millis)
        .start_ms(50)
        .exit_code(exit_code);
    sim_task_with(name, task_type, &worker, |task| {
        task["spec"]["queue"] = queue.into();
        task["spec"]["priority"] = priority.as_str().into();
        task["spec"]["retry"] = json!({"maxRetries": 0});
    })
}

fn scheduled_at(task: &AxTask) -> Timestamp {
    task.status
        .as_ref()
        .and_then(|s| s.scheduled_at)
        .unwrap_or_else(|| panic!("{} was never dispatched", task.name_any()))
}

/// The tasks' priorities in dispatch order.
fn dispatch_order(tasks: &[AxTask]) -> Vec<(Timestamp, Priority)> {
    let mut order: Vec<(Timestamp, Priority)> = tasks
        .iter()
        .map(|t| (scheduled_at(t), t.spec.priority))
        .collect();
    order.sort();
    order
}

/// The dispatches from the start of `order` up to the one that took the last task of some
/// priority: the stretch during which every priority in `order` still had tasks waiting.
fn while_all_waiting(order: &[(Timestamp, Priority)]) -> &[(Timestamp, Priority)] {
    let last_of = |p: Priority| order.iter().rposition(|(_, q)| *q == p);
    let end = PRIORITIES
        .iter()
        .filter_map(|p| last_of(*p))
        .min()
        .expect("some dispatches");
    &order[..=end]
}

fn shares(dispatches: &[(Timestamp, Priority)]) -> BTreeMap<Priority, f64> {
    let mut counts: BTreeMap<Priority, usize> = BTreeMap::new();
    for (_, p) in dispatches {
        *counts.entry(*p).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(p, n)| (p, n as f64 / dispatches.len() as f64))
        .collect()
}

fn queued_reason(task: &AxTask) -> Option<String> {
    task.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Queued")
        .map(|c| c.reason.clone())
}

#[tokio::test]
async fn four_hundred_tasks_are_dispatched_in_weighted_priority_shares() {
    const PER_PRIORITY: usize = 100;
    let client = client().await;
    let ns = namespace(&client, "q-shares").await;
    // Closed (concurrency 0) while the tasks are created, so every priority waits from the start.
    // No max-wait: only the weights decide.
    let queue = create_queue(
        &client,
        "shares",
        json!({
            "concurrency": 0,
            "weights": {"critical": 4, "high": 3, "normal": 2, "low": 1},
            "maxWaitSeconds": {"critical": 0, "high": 0, "normal": 0, "low": 0},
        }),
    )
    .await;
    let tasks: Vec<AxTask> = (0..PER_PRIORITY)
        .flat_map(|i| {
            PRIORITIES.map(|p| {
                let name = format!("{}-{i:03}", p.as_str().to_lowercase());
                sim_task(&name, &queue.name, p, "share", 200, 0)
            })
        })
        .collect();
    create_all(&client, &ns, tasks).await;
    wait_pending(&client, &queue.name, (4 * PER_PRIORITY) as i64).await;
    // A closed queue says why its tasks wait.
    wait_task(&client, &ns, "low-000", LONG, |t| {
        queued_reason(t).as_deref() == Some("ConcurrencyLimit")
    })
    .await;

    patch_queue(&client, &queue.name, json!({"concurrency": 8})).await;
    let tasks = wait_all_terminal(&client, &ns, Duration::from_secs(300)).await;
    assert!(tasks.iter().all(|t| phase(t) == Some(TaskPhase::Succeeded)));
    let order = dispatch_order(&tasks);
    let window = while_all_waiting(&order);
    let observed = shares(window);
    println!(
        "dispatches while all four priorities waited: {}; shares {observed:?}",
        window.len()
    );
    let expected = [
        (Priority::Critical, 0.4),
        (Priority::High, 0.3),
        (Priority::Normal, 0.2),
        (Priority::Low, 0.1),
    ];
    // The order is read from `scheduledAt`, which each task's reconcile writes after its grant;
    // under load those reconciles finish out of grant order by a few dispatches either way, which
    // moves a share by a point or two at the window's edges. Equal shares (0.25 each) or any other
    // weights would still be far outside.
    for (p, want) in expected {
        let got = observed.get(&p).copied().unwrap_or(0.0);
        assert!(
            (got - want).abs() <= 0.03,
            "{p:?}: share {got:.3}, want {want} ± 0.03 (all: {observed:?})"
        );
    }
    let done = wait_queue(&client, &queue.name, LONG, "dispatched 400", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.dispatched == 400 && s.running == 0)
    })
    .await;
    assert_eq!(done.status.unwrap().open_circuits, Vec::<String>::new());
}

#[tokio::test]
async fn patching_the_weights_mid_run_changes_the_shares() {
    const PER_PRIORITY: usize = 100;
    let client = client().await;
    let ns = namespace(&client, "q-reweigh").await;
    let queue = create_queue(
        &client,
        "reweigh",
        json!({
            "concurrency": 0,
            "weights": {"critical": 1, "high": 1, "normal": 1, "low": 1},
            "maxWaitSeconds": {"critical": 0, "high": 0, "normal": 0, "low": 0},
        }),
    )
    .await;
    let tasks: Vec<AxTask> = (0..PER_PRIORITY)
        .flat_map(|i| {
            [Priority::High, Priority::Low].map(|p| {
                let name = format!("{}-{i:03}", p.as_str().to_lowercase());
                sim_task(&name, &queue.name, p, "reweigh", 200, 0)
            })
        })
        .collect();
    create_all(&client, &ns, tasks).await;
    wait_pending(&client, &queue.name, (2 * PER_PRIORITY) as i64).await;
    patch_queue(&client, &queue.name, json!({"concurrency": 6})).await;

    // Re-weigh once about a quarter of the tasks went.
    let deadline = Instant::now() + LONG;
    loop {
        let tasks = tasks_in(&client, &ns).await;
        let started = tasks
            .iter()
            .filter(|t| t.status.as_ref().is_some_and(|s| s.scheduled_at.is_some()))
            .count();
        if started >= 50 {
            break;
        }
        assert!(Instant::now() < deadline, "only {started} dispatched");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let patched_at = Timestamp::now();
    patch_queue(
        &client,
        &queue.name,
        json!({"weights": {"critical": 1, "high": 4, "normal": 1, "low": 1}}),
    )
    .await;
    // The operator reports the generation in force once it applied it.
    wait_queue(&client, &queue.name, LONG, "new weights applied", |q| {
        q.status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .is_some_and(|g| Some(g) == q.metadata.generation)
    })
    .await;
    let settled = Timestamp::now();

    let tasks = wait_all_terminal(&client, &ns, Duration::from_secs(300)).await;
    let order = dispatch_order(&tasks);
    let before: Vec<_> = order
        .iter()
        .copied()
        .filter(|(at, _)| *at < patched_at)
        .collect();
    let after: Vec<_> = order
        .iter()
        .copied()
        .filter(|(at, _)| *at > settled)
        .collect();
    let after = while_all_waiting(&after);
    let high_before = shares(&before).get(&Priority::High).copied().unwrap_or(0.0);
    let high_after = shares(after).get(&Priority::High).copied().unwrap_or(0.0);
    println!(
        "High share: {high_before:.3} over {} dispatches at 1:1, {high_after:.3} over {} at 4:1",
        before.len(),
        after.len()
    );
    assert!(
        before.len() >= 40 && after.len() >= 40,
        "enough dispatches on each side"
    );
    assert!(
        (0.4..=0.6).contains(&high_before),
        "at 1:1 High had {high_before:.3}"
    );
    assert!(
        (0.72..=0.88).contains(&high_after),
        "at 4:1 High had {high_after:.3}"
    );
}

#[tokio::test]
async fn a_failing_type_opens_its_circuit_while_others_flow_and_closes_when_it_recovers() {
    const FLAKY: usize = 14;
    const STEADY: usize = 40;
    let client = client().await;
    let ns = namespace(&client, "q-circuit").await;
    let queue = create_queue(
        &client,
        "circuit",
        json!({
            "concurrency": 4,
            "typeConcurrency": {"flaky": 2},
            "circuitBreaker": {"windowSize": 10, "minRequests": 4, "failureRatio": 0.5, "openSeconds": 10},
            "maxWaitSeconds": {"critical": 0, "high": 0, "normal": 0, "low": 0},
        }),
    )
    .await;
    let mut tasks: Vec<AxTask> = (0..FLAKY)
        .map(|i| {
            sim_task(
                &format!("flaky-{i:02}"),
                &queue.name,
                Priority::High,
                "flaky",
                200,
                1,
            )
        })
        .collect();
    tasks.extend((0..STEADY).map(|i| {
        sim_task(
            &format!("steady-{i:02}"),
            &queue.name,
            Priority::Normal,
            "steady",
            500,
            0,
        )
    }));
    create_all(&client, &ns, tasks).await;

    let opened = wait_queue(&client, &queue.name, LONG, "circuit of flaky open", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.open_circuits == ["flaky"] && s.open_circuit_count == 1)
    })
    .await;
    let opened_at = Timestamp::now();
    println!("circuit open: {:?}", opened.status);

    // The held flaky tasks say so.
    let deadline = Instant::now() + LONG;
    let held = loop {
        let tasks = tasks_in(&client, &ns).await;
        let held: Vec<AxTask> = tasks
            .into_iter()
            .filter(|t| {
                t.spec.task_type == "flaky"
                    && phase(t) == Some(TaskPhase::Pending)
                    && queued_reason(t).as_deref() == Some("CircuitOpen")
                    && t.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "CircuitOpen" && c.status == "True")
                    })
            })
            .collect();
        if !held.is_empty() {
            break held;
        }
        assert!(
            Instant::now() < deadline,
            "no flaky task held with reason CircuitOpen"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // Meanwhile the steady type keeps being dispatched.
    let deadline = Instant::now() + LONG;
    loop {
        let tasks = tasks_in(&client, &ns).await;
        let steady_after = tasks
            .iter()
            .filter(|t| t.spec.task_type == "steady")
            .filter(|t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.scheduled_at)
                    .is_some_and(|at| at > opened_at)
            })
            .count();
        if steady_after >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "steady tasks stopped flowing while flaky's circuit was open"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The type recovers: the flaky tasks still waiting now succeed. The next probe closes the
    // circuit and the rest follow.
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    let waiting: Vec<String> = tasks_in(&client, &ns)
        .await
        .into_iter()
        .filter(|t| t.spec.task_type == "flaky" && phase(t) == Some(TaskPhase::Pending))
        .map(|t| t.name_any())
        .collect();
    // A held task may have gone out as a half-open probe (and died) while steady tasks flowed,
    // so only some of the held ones are sure to be waiting still.
    let released = held
        .iter()
        .map(|t| t.name_any())
        .find(|name| waiting.contains(name))
        .expect("a task held by the open circuit still waits");
    for name in &waiting {
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": SimWorker::running_for(200).start_ms(50).pod_spec()}}})),
        )
        .await
        .expect("patch flaky task");
    }
    let tasks = wait_all_terminal(&client, &ns, Duration::from_secs(180)).await;
    // Half-open probes may have gone out while the patches were being sent (one by one, on a busy
    // API server), from tasks as they were before their patch: those die. No attempt built from a
    // patched template may: a patched task that died ran the failing worker.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    for t in &tasks {
        let patched = waiting.contains(&t.name_any());
        match (t.spec.task_type.as_str(), patched, phase(t)) {
            ("steady", _, Some(TaskPhase::Succeeded))
            | ("flaky", true, Some(TaskPhase::Succeeded))
            | ("flaky", false, Some(TaskPhase::Dead)) => {}
            ("flaky", true, Some(TaskPhase::Dead)) => {
                let attempt = t.status.as_ref().map_or(0, |s| s.attempt);
                let pod = pods
                    .get(&ax::core::worker::pod_name(&t.name_any(), attempt))
                    .await
                    .expect("the worker pod of a Dead task is kept");
                let exit_code =
                    pod.spec
                        .and_then(|s| s.containers[0].env.clone())
                        .and_then(|env| {
                            env.into_iter()
                                .find(|e| e.name == "AX_SIM_EXIT_CODE")
                                .and_then(|e| e.value)
                        });
                assert_eq!(
                    exit_code.as_deref(),
                    Some("1"),
                    "{} died from a worker of its patched template",
                    t.name_any()
                );
            }
            (_, _, p) => panic!("{} ended {p:?}", t.name_any()),
        }
    }
    let dead = tasks
        .iter()
        .filter(|t| phase(t) == Some(TaskPhase::Dead))
        .count();
    assert!(dead >= 4, "the circuit opened after {dead} failures");
    let closed = wait_queue(&client, &queue.name, LONG, "circuit closed", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.open_circuits.is_empty() && s.running == 0)
    })
    .await;
    let status = closed.status.unwrap();
    assert_eq!(status.dead, dead as i64);
    // Each task ran once, unless an attempt was lost to the infrastructure (retried without
    // using `maxRetries`): the queue counts attempts.
    let attempts: i64 = tasks
        .iter()
        .map(|t| t.status.as_ref().map_or(0, |s| i64::from(s.attempt)))
        .sum();
    let retried: Vec<String> = tasks
        .iter()
        .filter(|t| t.status.as_ref().is_some_and(|s| s.attempt != 1))
        .map(|t| {
            format!(
                "{} {:?}",
                t.name_any(),
                t.status.as_ref().map(|s| &s.history)
            )
        })
        .collect();
    assert!(
        attempts >= (FLAKY + STEADY) as i64,
        "a task never ran: {retried:#?}"
    );
    assert_eq!(status.dispatched, attempts, "{retried:#?}");
    // A released task's CircuitOpen condition ends false.
    let released = api.get(&released).await.expect("get task");
    let condition = released
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "CircuitOpen")
        .expect("CircuitOpen condition");
    assert_eq!(condition.status, "False");
}

#[tokio::test]
async fn an_invalid_queue_spec_is_reported_and_the_previous_one_stays() {
    let client = client().await;
    let ns = namespace(&client, "q-invalid").await;
    let queue = create_queue(
        &client,
        "invalid",
        json!({"weightSchedule": [{"from": "22:00", "to": "06:00", "timeZone": "Mars/Olympus", "weights": {"low": 9}}]}),
    )
    .await;
    let invalid = wait_queue(&client, &queue.name, LONG, "InvalidSpec", |q| {
        queue_condition(q, "InvalidSpec") == Some(("True".into(), "InvalidSpec".into()))
    })
    .await;
    let message = invalid.status.unwrap().conditions[0].message.clone();
    assert!(message.contains("Mars/Olympus"), "{message}");
    let events = wait_queue_events(&client, &queue.name, "InvalidSpec").await;
    assert!(events.iter().any(|e| e.type_.as_deref() == Some("Warning")));

    // Never valid: its tasks wait and say why.
    create_all(
        &client,
        &ns,
        vec![sim_task(
            "first",
            &queue.name,
            Priority::Normal,
            "edit",
            100,
            0,
        )],
    )
    .await;
    wait_task(&client, &ns, "first", LONG, |t| {
        queued_reason(t).as_deref() == Some("QueueInvalid")
    })
    .await;

    // Fixed: the task runs.
    patch_queue(
        &client,
        &queue.name,
        json!({"concurrency": 1, "weightSchedule": [{"from": "22:00", "to": "06:00", "timeZone": "Europe/Berlin", "weights": {"low": 9}}]}),
    )
    .await;
    wait_phase(&client, &ns, "first", TaskPhase::Succeeded, LONG).await;
    wait_queue(&client, &queue.name, LONG, "valid again", |q| {
        queue_condition(q, "InvalidSpec") == Some(("False".into(), "Valid".into()))
    })
    .await;

    // Broken again (a time zone that does not exist; a time like "25:00" the API server refuses
    // itself): reported, and concurrency 1 stays in force for new tasks.
    patch_queue(
        &client,
        &queue.name,
        json!({"concurrency": 5, "weightSchedule": [{"from": "22:00", "to": "06:00", "timeZone": "Atlantis/Nowhere", "weights": {"low": 9}}]}),
    )
    .await;
    wait_queue(&client, &queue.name, LONG, "InvalidSpec again", |q| {
        queue_condition(q, "InvalidSpec") == Some(("True".into(), "InvalidSpec".into()))
    })
    .await;
    create_all(
        &client,
        &ns,
        (0..3)
            .map(|i| {
                sim_task(
                    &format!("next-{i}"),
                    &queue.name,
                    Priority::Normal,
                    "edit",
                    1500,
                    0,
                )
            })
            .collect(),
    )
    .await;
    let tasks = wait_all_terminal(&client, &ns, LONG).await;
    let mut runs: Vec<(Timestamp, Timestamp)> = tasks
        .iter()
        .filter(|t| t.name_any().starts_with("next-"))
        .map(|t| {
            let s = t.status.as_ref().expect("status");
            (
                s.scheduled_at.expect("dispatched"),
                s.finished_at.expect("finished"),
            )
        })
        .collect();
    runs.sort();
    for pair in runs.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "with concurrency 1 in force the tasks ran one after another: {runs:?}"
        );
    }
}

#[tokio::test]
async fn a_task_naming_a_missing_queue_waits_until_the_queue_exists() {
    let client = client().await;
    let ns = namespace(&client, "q-missing").await;
    // The operator keeps the default queue; its columns show in kubectl.
    let (ok, out, err) = run_kubectl(&["get", "axqueue", "default"], None);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap_or_default().to_string();
    for column in [
        "NAME",
        "CRITICAL",
        "HIGH",
        "NORMAL",
        "LOW",
        "RUNNING",
        "OPEN-CIRCUITS",
        "AGE",
    ] {
        assert!(header.contains(column), "{column} missing in {header:?}");
    }

    let name = format!("e2e-later-{:04x}", rand::random::<u16>());
    create_all(
        &client,
        &ns,
        vec![sim_task("orphan", &name, Priority::High, "orphan", 100, 0)],
    )
    .await;
    let waiting = wait_task(&client, &ns, "orphan", LONG, |t| {
        queued_reason(t).as_deref() == Some("QueueNotFound")
    })
    .await;
    assert_eq!(phase(&waiting), Some(TaskPhase::Pending));
    let _queue = {
        let api: Api<AxQueue> = Api::all(client.clone());
        let queue: AxQueue = serde_json::from_value(json!({
            "apiVersion": "ax.dev/v1alpha1",
            "kind": "AxQueue",
            "metadata": {"name": name},
            "spec": {},
        }))
        .expect("an AxQueue");
        api.create(&PostParams::default(), &queue)
            .await
            .expect("create queue");
        TestQueue { name: name.clone() }
    };
    wait_phase(&client, &ns, "orphan", TaskPhase::Succeeded, LONG).await;
    wait_queue(&client, &name, LONG, "one dispatched", |q| {
        q.status.as_ref().is_some_and(|s| s.dispatched == 1)
    })
    .await;
}

/// Namespaces of one test, deleted when it ends (also when it fails).
struct TestNamespaces(Vec<String>);

impl Drop for TestNamespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            run_kubectl(&["delete", "namespace", ns, "--wait=false"], None);
        }
    }
}

async fn label_namespace(client: &Client, ns: &str, key: &str, value: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.patch(
        ns,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
    )
    .await
    .expect("label namespace");
}

#[tokio::test]
async fn a_queue_selects_the_namespaces_that_may_use_it() {
    const TEAM_LABEL: &str = "ax-e2e-team";
    let client = client().await;
    let team = format!("a-{:04x}", rand::random::<u16>());
    let queue = create_queue(
        &client,
        "teams",
        json!({"namespaceSelector": {"matchLabels": {TEAM_LABEL: team}}}),
    )
    .await;
    let selected = namespace(&client, "q-team-a").await;
    let other = namespace(&client, "q-team-b").await;
    let _namespaces = TestNamespaces(vec![selected.clone(), other.clone()]);
    label_namespace(&client, &selected, TEAM_LABEL, &team).await;

    let task = |name: &str| sim_task(name, &queue.name, Priority::Normal, "team-work", 100, 0);
    create_all(&client, &other, vec![task("theirs")]).await;
    create_all(&client, &selected, vec![task("mine")]).await;
    wait_phase(&client, &selected, "mine", TaskPhase::Succeeded, LONG).await;

    // The other namespace's task waits, says why, and was never dispatched.
    let waiting = wait_task(&client, &other, "theirs", LONG, |t| {
        queued_reason(t).as_deref() == Some("QueueForbidden")
    })
    .await;
    assert_eq!(phase(&waiting), Some(TaskPhase::Pending));
    let status = waiting.status.clone().expect("status");
    assert_eq!(status.attempt, 0, "dispatched though forbidden: {status:?}");
    let message = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Queued")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&queue.name) && message.contains(&other),
        "the Queued message names the queue and the namespace: {message}"
    );
    wait_queue(&client, &queue.name, LONG, "one forbidden task", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.forbidden == 1 && s.dispatched == 1)
    })
    .await;

    // Labelled to match: it runs, without a restart.
    label_namespace(&client, &other, TEAM_LABEL, &team).await;
    wait_phase(&client, &other, "theirs", TaskPhase::Succeeded, LONG).await;
    wait_queue(&client, &queue.name, LONG, "nothing forbidden", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.forbidden == 0 && s.dispatched == 2)
    })
    .await;
}

async fn wait_queue_events(
    client: &Client,
    queue: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::core::v1::Event> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lp = ListParams::default().fields(&format!(
            "involvedObject.name={queue},involvedObject.kind=AxQueue"
        ));
        let events = api.list(&lp).await.expect("list events").items;
        if events.iter().any(|e| e.reason.as_deref() == Some(reason)) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} event for AxQueue {queue}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `stopPolicy: Hold` dispatches nothing (tasks say `QueueHeld`); `HoldAndDrain` also stops the
/// running attempt, which waits in the queue again without using a retry; `None` runs it again.
#[tokio::test]
async fn a_held_queue_dispatches_nothing_and_a_drained_one_stops_its_running_attempts() {
    let client = client().await;
    let ns = namespace(&client, "q-stop").await;
    let queue = create_queue(&client, "stop", json!({"concurrency": 5})).await;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    // A task that runs until it is stopped, and with it a short one.
    let long = sim_task_with("long", "stop", &SimWorker::running_for(0).hang(), |t| {
        t["spec"]["queue"] = queue.name.clone().into();
        t["spec"]["retry"] = json!({"maxRetries": 0,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
    });
    create(&client, &ns, &long).await;
    wait_phase(&client, &ns, "long", TaskPhase::Running, LONG).await;

    patch_queue(&client, &queue.name, json!({"stopPolicy": "Hold"})).await;
    let short = sim_task("short", &queue.name, Priority::High, "stop", 100, 0);
    create(&client, &ns, &short).await;
    wait_task(&client, &ns, "short", LONG, |t| {
        queued_reason(t).as_deref() == Some("QueueHeld")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let long_now = api.get("long").await.unwrap();
    assert_eq!(
        phase(&long_now),
        Some(TaskPhase::Running),
        "Hold lets it run"
    );
    assert_eq!(
        phase(&api.get("short").await.unwrap()),
        Some(TaskPhase::Pending)
    );

    patch_queue(&client, &queue.name, json!({"stopPolicy": "HoldAndDrain"})).await;
    let drained = wait_task(&client, &ns, "long", LONG, |t| {
        phase(t) == Some(TaskPhase::Pending) && t.status.as_ref().is_some_and(|s| s.attempt == 1)
    })
    .await;
    let s = drained.status.clone().unwrap();
    assert_eq!(
        s.last_failure.as_ref().map(|f| f.reason.as_str()),
        Some("QueueDrained")
    );
    assert_eq!((s.retries, s.infrastructure_retries), (0, 1));
    // Pending only once its worker is gone.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.get_opt("long-1").await.unwrap().is_none_or(|p| {
            p.status
                .and_then(|s| s.phase)
                .is_some_and(|p| p == "Succeeded" || p == "Failed")
        }),
        "the drained attempt's pod still runs"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = api.get("long").await.unwrap();
    assert_eq!(
        phase(&held),
        Some(TaskPhase::Pending),
        "no dispatch while held"
    );

    patch_queue(&client, &queue.name, json!({"stopPolicy": "None"})).await;
    wait_phase(&client, &ns, "short", TaskPhase::Succeeded, LONG).await;
    let again = wait_task(&client, &ns, "long", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.attempt == 2) && phase(t) == Some(TaskPhase::Running)
    })
    .await;
    assert_eq!(again.status.unwrap().retries, 0, "maxRetries untouched");
    api.patch(
        "long",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"cancel": true}})),
    )
    .await
    .unwrap();
}
