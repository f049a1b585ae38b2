//! Tests of the registry: queues that do not exist or are invalid, slots held and released,
//! outcomes fed to the breakers once, totals across leaders, rebuilding after a restart, which
//! namespaces a queue admits and whose circuits open.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;

use super::*;
use crate::api::{
    AxQueueStatus, AxTask, CircuitBreakerSpec, Priority, QueueWeights, TaskPhase,
    WeightScheduleEntry,
};
use crate::core::queue::adaptive::Observation;
use crate::core::queue::dispatcher::HeldReason;
use crate::core::queue::status::queue_status;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_900_000_000 + secs).expect("in range")
}

fn key(name: &str) -> TaskKey {
    TaskKey::new(("ns".to_string(), name.to_string()))
}

fn pending(priority: Priority, task_type: &str, at: i64, attempt: u32) -> PendingTask {
    PendingTask {
        priority,
        namespace: "ns".into(),
        key: None,
        task_type: task_type.into(),
        queued_at: t(at),
        attempt,
        preemptible: true,
    }
}

fn holder(task_type: &str) -> Holder<'_> {
    Holder {
        task_type,
        key: None,
        priority: Priority::Normal,
        preemptible: true,
        since: t(0),
    }
}

fn queue(name: &str, spec: AxQueueSpec, status: Option<AxQueueStatus>) -> AxQueue {
    let mut q = AxQueue::new(name, spec);
    q.metadata.generation = Some(1);
    q.status = status;
    q
}

#[test]
fn tasks_of_a_missing_queue_wait_until_it_exists() {
    let mut registry = Registry::default();
    registry.upsert(&key("a"), "batch", pending(Priority::High, "x", 0, 1));
    assert_eq!(registry.next(t(1)), None);
    let held = registry.held(t(1));
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].reason, HeldReason::QueueNotFound);
    assert_eq!(
        registry.configure(&queue("batch", AxQueueSpec::default(), None), t(2)),
        None
    );
    assert_eq!(registry.next(t(2)), Some((key("a"), "batch".to_string())));
    // Deleted while the task runs: the slot is still counted, and freed when it finishes.
    registry.queue_deleted("batch");
    assert!(registry.is_holding(&key("a")));
    registry.record_outcome(&key("a"), Outcome::Succeeded, t(3));
    assert!(registry.remove(&key("a")));
    assert!(
        registry.reports(t(3)).is_empty(),
        "an unused missing queue is forgotten"
    );
}

#[test]
fn a_held_queue_dispatches_nothing_says_why_and_a_draining_one_names_its_running_tasks() {
    let mut registry = Registry::default();
    let mut spec = AxQueueSpec::default();
    registry.configure(&queue("q", spec.clone(), None), t(0));
    registry.upsert(&key("runs"), "q", pending(Priority::High, "x", 0, 1));
    assert_eq!(registry.next(t(1)), Some((key("runs"), "q".to_string())));
    registry.dispatched(&key("runs"));
    registry.upsert(&key("waits"), "q", pending(Priority::High, "x", 2, 1));
    assert!(!registry.drains("q"));

    spec.stop_policy = StopPolicy::Hold;
    registry.configure(&queue("q", spec.clone(), None), t(3));
    assert_eq!(registry.next(t(4)), None);
    let (reason, message) = registry.held_reason(&key("waits"), t(4)).unwrap();
    assert_eq!(reason, HeldReason::QueueHeld);
    assert!(message.contains("stopPolicy Hold"), "{message}");
    assert!(!registry.drains("q"), "Hold lets running tasks finish");

    spec.stop_policy = StopPolicy::HoldAndDrain;
    registry.configure(&queue("q", spec.clone(), None), t(5));
    assert_eq!(registry.next(t(6)), None);
    assert!(registry.drains("q"));
    assert_eq!(registry.holding_in("q"), vec![key("runs")]);

    spec.stop_policy = StopPolicy::None;
    registry.configure(&queue("q", spec, None), t(7));
    assert!(!registry.drains("q"));
    assert_eq!(registry.next(t(8)), Some((key("waits"), "q".to_string())));
}

#[test]
fn invalid_edit_keeps_the_previous_config_and_reports_once() {
    let mut registry = Registry::default();
    let mut spec = AxQueueSpec {
        concurrency: 1,
        ..AxQueueSpec::default()
    };
    assert_eq!(
        registry.configure(&queue("q", spec.clone(), None), t(0)),
        None
    );
    spec.concurrency = 5;
    spec.weight_schedule = vec![WeightScheduleEntry {
        from: "7:00".into(),
        to: "08:00".into(),
        time_zone: "UTC".into(),
        weights: Some(QueueWeights::default()),
        ..WeightScheduleEntry::default()
    }];
    let problem = registry.configure(&queue("q", spec.clone(), None), t(1));
    assert!(problem.is_some_and(|p| p.to_string().contains("7:00")));
    assert_eq!(
        registry.configure(&queue("q", spec, None), t(2)),
        None,
        "reported once"
    );
    for name in ["a", "b"] {
        registry.upsert(&key(name), "q", pending(Priority::Normal, "x", 0, 1));
    }
    assert!(registry.next(t(3)).is_some());
    assert_eq!(registry.next(t(3)), None, "concurrency 1 still in force");
    let report = &registry.reports(t(3))[0];
    assert!(report.invalid.is_some());
    let status = queue_status(report, &AxQueueStatus::default(), t(3));
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "InvalidSpec")
        .expect("condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "InvalidSpec")
    );
}

#[test]
fn a_queue_never_valid_holds_its_tasks() {
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        weight_schedule: vec![WeightScheduleEntry {
            from: "22:00".into(),
            to: "06:00".into(),
            time_zone: "Nowhere/Land".into(),
            weights: Some(QueueWeights::default()),
            ..WeightScheduleEntry::default()
        }],
        ..AxQueueSpec::default()
    };
    assert!(registry.configure(&queue("q", spec, None), t(0)).is_some());
    registry.upsert(&key("a"), "q", pending(Priority::Normal, "x", 0, 1));
    assert_eq!(registry.next(t(1)), None);
    assert_eq!(registry.held(t(1))[0].reason, HeldReason::QueueInvalid);
    assert!(
        registry
            .configure(&queue("q", AxQueueSpec::default(), None), t(2))
            .is_none()
    );
    assert!(registry.next(t(2)).is_some());
}

#[test]
fn marking_running_twice_keeps_a_probe() {
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        circuit_breaker: CircuitBreakerSpec {
            window_size: 2,
            min_requests: 2,
            failure_ratio: 0.5,
            open_seconds: 10,
        },
        ..AxQueueSpec::default()
    };
    registry.configure(&queue("q", spec, None), t(0));
    for name in ["a", "b", "c", "d"] {
        registry.upsert(&key(name), "q", pending(Priority::Normal, "x", 0, 1));
    }
    for _ in 0..2 {
        let (k, _) = registry.next(t(0)).expect("dispatch");
        registry.record_outcome(&k, Outcome::Failed, t(0));
        registry.remove(&k);
    }
    assert_eq!(
        registry.reports(t(0))[0].open_circuits,
        vec!["x".to_string()]
    );
    assert_eq!(
        registry
            .held(t(1))
            .iter()
            .filter(|h| h.reason == HeldReason::CircuitOpen)
            .count(),
        2
    );
    let (probe, _) = registry.next(t(10)).expect("the probe");
    // The reconciler sees the probe Scheduled, then Running: it stays the only probe.
    registry.hold(&probe, "q", holder("x"));
    registry.hold(&probe, "q", holder("x"));
    assert_eq!(registry.next(t(10)), None);
    registry.record_outcome(&probe, Outcome::Succeeded, t(11));
    registry.remove(&probe);
    assert!(registry.reports(t(11))[0].open_circuits.is_empty());
    assert!(registry.next(t(11)).is_some());
}

#[test]
fn totals_continue_from_the_status_of_an_earlier_leader() {
    let mut registry = Registry::default();
    let status = AxQueueStatus {
        dispatched: 40,
        dead: 3,
        ..AxQueueStatus::default()
    };
    registry.configure(&queue("q", AxQueueSpec::default(), Some(status)), t(0));
    registry.upsert(&key("a"), "q", pending(Priority::Low, "x", 0, 1));
    registry.next(t(0));
    registry.dispatched(&key("a"));
    registry.count_dead("q");
    let report = &registry.reports(t(0))[0];
    assert_eq!((report.dispatched, report.dead), (41, 4));
    assert_eq!(report.running, 1);
}

#[test]
fn a_task_moved_to_another_queue_leaves_the_old_one() {
    let mut registry = Registry::default();
    registry.configure(&queue("a", AxQueueSpec::default(), None), t(0));
    registry.configure(&queue("b", AxQueueSpec::default(), None), t(0));
    registry.upsert(&key("x"), "a", pending(Priority::Low, "x", 0, 1));
    registry.upsert(&key("x"), "b", pending(Priority::Low, "x", 0, 1));
    let reports = registry.reports(t(0));
    let pending_of = |name: &str| {
        reports
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.pending.iter().map(|(_, n)| n).sum::<usize>())
    };
    assert_eq!((pending_of("a"), pending_of("b")), (Some(0), Some(1)));
}

#[test]
fn rebuild_counts_tasks_in_flight_before_dispatching_more() {
    let task = |name: &str, phase: TaskPhase, next_attempt: Option<i64>| -> Arc<AxTask> {
        let mut task: AxTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1",
            "kind": "AxTask",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"},
            "spec": {"type": "x", "queue": "q", "template": {"spec": {"containers": []}}},
        }))
        .expect("a task");
        task.status = Some(crate::api::AxTaskStatus {
            phase: Some(phase),
            queued_at: Some(t(0)),
            next_attempt_at: next_attempt.map(t),
            ..Default::default()
        });
        Arc::new(task)
    };
    let tasks = [
        task("scheduled", TaskPhase::Scheduled, None),
        task("running", TaskPhase::Running, None),
        // Dispatched, its status not written yet: its pod exists.
        task("dispatched", TaskPhase::Pending, None),
        task("ready", TaskPhase::Pending, None),
        task("backoff", TaskPhase::Pending, Some(100)),
        task("done", TaskPhase::Succeeded, None),
    ];
    fn cached(t: &Arc<AxTask>) -> Cached<'_> {
        let status = t.status.as_ref().expect("a status");
        Cached {
            key: key(t.metadata.name.as_deref().unwrap_or_default()),
            queue_key: None,
            queue: &t.spec.queue,
            task_type: &t.spec.task_type,
            priority: t.spec.priority,
            preemptible: t.spec.preemptible,
            scheduled_at: status.scheduled_at,
            phase: status.phase,
            cancel: t.spec.cancel,
            next_attempt_at: status.next_attempt_at,
            next_pod: t.metadata.name.as_deref() == Some("dispatched"),
            pending: Some(pending_task(t)),
        }
    }
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        concurrency: 4,
        ..AxQueueSpec::default()
    };
    registry.configure(&queue("q", spec, None), t(0));
    assert_eq!(
        rebuild(&mut registry, tasks.iter().map(cached), t(10)),
        (3, 1)
    );
    assert!(registry.is_holding(&key("scheduled")) && registry.is_holding(&key("running")));
    assert!(registry.is_holding(&key("dispatched")));
    // One slot of four is left: the ready task takes it, nothing more goes.
    assert_eq!(registry.next(t(10)), Some((key("ready"), "q".to_string())));
    assert_eq!(registry.next(t(10)), None);
    // Rebuilding again (a re-list) changes nothing.
    rebuild(&mut registry, tasks.iter().map(cached), t(11));
    assert_eq!(registry.reports(t(11))[0].running, 4);
}

#[test]
fn a_deleted_queue_reports_its_circuits_closed_and_is_forgotten() {
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        circuit_breaker: CircuitBreakerSpec {
            window_size: 1,
            min_requests: 1,
            failure_ratio: 1.0,
            open_seconds: 60,
        },
        ..AxQueueSpec::default()
    };
    registry.configure(&queue("q", spec, None), t(0));
    registry.upsert(&key("a"), "q", pending(Priority::Low, "x", 0, 1));
    registry.next(t(0));
    registry.record_outcome(&key("a"), Outcome::Failed, t(0));
    registry.remove(&key("a"));
    let open = registry.reports(t(1))[0].open_circuits.clone();
    assert_eq!(open, vec!["x".to_string()]);
    assert!(registry.circuits_reported("q", &open).is_empty());
    registry.queue_deleted("q");
    let report = registry.reports(t(2))[0].clone();
    assert!(!report.exists && report.open_circuits.is_empty());
    assert_eq!(
        registry.circuits_reported("q", &report.open_circuits),
        vec!["x".to_string()]
    );
    assert!(registry.reports(t(3)).is_empty());
}

#[test]
fn queues_take_turns() {
    let mut registry = Registry::default();
    for name in ["a", "b"] {
        registry.configure(&queue(name, AxQueueSpec::default(), None), t(0));
        for i in 0..2 {
            registry.upsert(
                &key(&format!("{name}{i}")),
                name,
                pending(Priority::Low, "x", i, 1),
            );
        }
    }
    let served: Vec<String> = std::iter::from_fn(|| registry.next(t(1)).map(|(_, q)| q)).collect();
    assert_eq!(served, vec!["a", "b", "a", "b"]);
}

#[test]
fn a_granted_task_holds_its_slot_until_released_and_counts_once_dispatched() {
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        concurrency: 1,
        ..AxQueueSpec::default()
    };
    registry.configure(&queue("q", spec, None), t(0));
    registry.upsert(&key("a"), "q", pending(Priority::Normal, "x", 0, 1));
    registry.upsert(&key("b"), "q", pending(Priority::Normal, "x", 1, 1));
    assert_eq!(registry.next(t(2)), Some((key("a"), "q".to_string())));
    assert!(registry.is_granted(&key("a")) && registry.is_holding(&key("a")));
    assert_eq!(registry.next(t(2)), None, "the slot is taken by the grant");
    assert_eq!(
        registry.held_reason(&key("b"), t(2)).map(|(r, _)| r),
        Some(HeldReason::ConcurrencyLimit)
    );
    registry.dispatched(&key("a"));
    assert!(!registry.is_granted(&key("a")) && registry.is_holding(&key("a")));
    assert_eq!(registry.reports(t(2))[0].dispatched, 1);
    // The attempt ends but its pod is still stopping: the slot stays held.
    registry.record_outcome(&key("a"), Outcome::Succeeded, t(3));
    assert_eq!(registry.next(t(3)), None);
    assert!(registry.remove(&key("a")));
    assert_eq!(registry.next(t(4)), Some((key("b"), "q".to_string())));
}

#[test]
fn an_outcome_feeds_the_breaker_once_even_if_the_slot_is_released_later() {
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        circuit_breaker: CircuitBreakerSpec {
            window_size: 2,
            min_requests: 2,
            failure_ratio: 0.5,
            open_seconds: 10,
        },
        ..AxQueueSpec::default()
    };
    registry.configure(&queue("q", spec, None), t(0));
    registry.upsert(&key("a"), "q", pending(Priority::Normal, "x", 0, 1));
    registry.next(t(0));
    for _ in 0..3 {
        registry.record_outcome(&key("a"), Outcome::Failed, t(0));
    }
    registry.remove(&key("a"));
    assert!(
        registry.reports(t(0))[0].open_circuits.is_empty(),
        "one failure of two needed"
    );
}

fn adaptive_spec(min: i32, max: i32) -> AxQueueSpec {
    serde_json::from_value(serde_json::json!({
        "concurrency": max,
        "concurrencyPolicy": {"mode": "Adaptive", "min": min},
    }))
    .expect("a spec")
}

#[test]
fn an_adaptive_queue_starts_at_min_grows_when_pods_are_placed_and_shrinks_when_not() {
    let mut registry = Registry::default();
    registry.configure(&queue("q", adaptive_spec(2, 50), None), t(0));
    assert_eq!(registry.adaptive_queues(), ["q".to_string()].into());
    for i in 0..20 {
        registry.upsert(
            &key(&format!("t{i:02}")),
            "q",
            pending(Priority::Normal, "x", i, 1),
        );
    }
    let granted: Vec<_> = std::iter::from_fn(|| registry.next(t(30))).collect();
    assert_eq!(granted.len(), 2);
    let (reason, message) = registry.held_reason(&key("t05"), t(30)).expect("held");
    assert_eq!(reason, HeldReason::AdaptiveLimit);
    assert!(message.contains("(2 of at most 50)"), "{message}");
    assert!(
        message.contains("position 4 of 18 in the Normal bucket"),
        "{message}"
    );
    assert!(message.contains("estimated start unknown"), "{message}");

    let placed = Observation {
        placed: 2,
        ..Observation::default()
    };
    let (change, _) = registry.adapt("q", placed, t(32)).expect("a change");
    assert_eq!((change.from, change.to), (2, 3));
    assert_eq!(registry.queue_of(&key("t00")), Some("q"));
    let report = registry.reports(t(32)).remove(0);
    assert_eq!((report.effective_concurrency, report.concurrency), (3, 50));
    assert!(report.adaptive);
    let status = queue_status(&report, &AxQueueStatus::default(), t(32));
    assert_eq!(status.effective_concurrency, Some(3));
    let last = status.last_concurrency_change.expect("a change");
    assert_eq!(
        (last.from, last.to, last.reason.as_str()),
        (2, 3, "PodsPlaced")
    );
    assert_eq!(status.limits.map(|l| l.concurrency), Some(50));

    assert_eq!(registry.next(t(33)).map(|(k, _)| k), Some(key("t02")));
    let stuck = Observation {
        unschedulable: 2,
        placed: 1,
        ..Observation::default()
    };
    let (change, event) = registry.adapt("q", stuck, t(34)).expect("a change");
    assert_eq!((change.from, change.to), (3, 2));
    assert_eq!(change.reason.as_str(), "PodsUnschedulable");
    assert!(!event, "3 -> 2 is not a large change");
    // Back to Fixed: the spec's concurrency is the limit again.
    registry.configure(
        &queue(
            "q",
            AxQueueSpec {
                concurrency: 50,
                ..AxQueueSpec::default()
            },
            None,
        ),
        t(35),
    );
    assert!(registry.adaptive_queues().is_empty());
    assert_eq!(registry.reports(t(35))[0].effective_concurrency, 50);
}

#[test]
fn a_new_leader_starts_the_adaptive_queue_where_the_old_one_left_it() {
    let mut registry = Registry::default();
    let status = AxQueueStatus {
        effective_concurrency: Some(17),
        ..AxQueueStatus::default()
    };
    registry.configure(&queue("q", adaptive_spec(2, 50), Some(status)), t(0));
    assert_eq!(registry.reports(t(0))[0].effective_concurrency, 17);
}

#[test]
fn the_status_names_the_window_in_force_and_its_limits() {
    let mut registry = Registry::default();
    let spec: AxQueueSpec = serde_json::from_value(serde_json::json!({
        "concurrency": 8,
        "weightSchedule": [{"from": "00:00", "to": "00:00", "timeZone": "Europe/Berlin",
                            "concurrency": 2, "typeConcurrency": {"x": 1}}],
    }))
    .expect("a spec");
    registry.configure(&queue("q", spec, None), t(0));
    let report = registry.reports(t(0)).remove(0);
    let status = queue_status(&report, &AxQueueStatus::default(), t(0));
    let window = status.active_window.expect("a window");
    assert_eq!(
        (
            window.index,
            window.from.as_str(),
            window.time_zone.as_str()
        ),
        (0, "00:00", "Europe/Berlin")
    );
    let limits = status.limits.expect("limits");
    assert_eq!(limits.concurrency, 2);
    assert_eq!(limits.type_concurrency.get("x"), Some(&1));
    assert_eq!(status.effective_concurrency, Some(2));
}

#[test]
fn the_refresh_reports_estimates_once_the_bucket_moves() {
    let mut registry = Registry::default();
    registry.configure(
        &queue(
            "q",
            AxQueueSpec {
                concurrency: 1,
                ..AxQueueSpec::default()
            },
            None,
        ),
        t(0),
    );
    for i in 0..10 {
        registry.upsert(
            &key(&format!("t{i}")),
            "q",
            pending(Priority::Low, "x", i, 1),
        );
    }
    let mut now = t(10);
    for _ in 0..4 {
        let (done, _) = registry.next(now).expect("a grant");
        registry.dispatched(&done);
        registry.remove(&done);
        now += jiff::SignedDuration::from_secs(3);
    }
    let held = registry.held(now);
    let last = held.iter().find(|h| h.key == key("t9")).expect("t9 waits");
    let estimate = last.estimate.as_ref().expect("an estimate");
    assert_eq!(estimate.position, 6);
    // Dispatches every 3 s: the 6th from the last one (at now - 3 s).
    assert_eq!(
        estimate.start,
        Ok(now + jiff::SignedDuration::from_secs(15))
    );
    let (_, message) = registry.held_reason(&key("t9"), now).expect("held");
    assert!(message.contains("estimated start"), "{message}");
    assert!(!crate::core::queue::estimate::moved(
        &message,
        Some(estimate),
        now
    ));
    // Paused: honestly unknown.
    registry.configure(
        &queue(
            "q",
            AxQueueSpec {
                concurrency: 0,
                ..AxQueueSpec::default()
            },
            None,
        ),
        now,
    );
    registry.held(now);
    let (_, paused) = registry.held_reason(&key("t9"), now).expect("t9 waits");
    assert!(
        paused.contains("estimated start unknown (the queue is paused"),
        "{paused}"
    );
}

fn in_ns(namespace: &str, name: &str) -> TaskKey {
    TaskKey::new((namespace.to_string(), name.to_string()))
}

fn pending_in(namespace: &str, task_type: &str, at: i64) -> PendingTask {
    PendingTask {
        namespace: namespace.into(),
        key: None,
        ..pending(Priority::Normal, task_type, at, 1)
    }
}

fn team(name: &str) -> Option<BTreeMap<String, String>> {
    Some([("team".to_string(), name.to_string())].into())
}

fn selecting(team: &str, concurrency: i32) -> AxQueueSpec {
    serde_json::from_value(serde_json::json!({
        "concurrency": concurrency,
        "namespaceSelector": {"matchLabels": {"team": team}},
    }))
    .expect("a spec")
}

#[test]
fn a_task_of_a_namespace_the_queue_does_not_select_waits_apart_and_blocks_nothing() {
    let mut registry = Registry::default();
    registry.namespace_labels("a", team("a"));
    registry.namespace_labels("b", team("b"));
    registry.configure(&queue("shared", selecting("a", 1), None), t(0));
    // b's task is older, but not selected: a's goes, and b's holds no slot.
    registry.upsert(&in_ns("b", "early"), "shared", pending_in("b", "x", 0));
    registry.upsert(&in_ns("a", "late"), "shared", pending_in("a", "x", 5));
    let (reason, message) = registry
        .held_reason(&in_ns("b", "early"), t(6))
        .expect("held");
    assert_eq!(reason, HeldReason::QueueForbidden);
    assert_eq!(
        message,
        "namespace b is not selected by the namespaceSelector of AxQueue shared"
    );
    assert_eq!(
        registry.next(t(6)),
        Some((in_ns("a", "late"), "shared".to_string()))
    );
    assert_eq!(registry.next(t(6)), None);
    let report = registry.reports(t(6)).remove(0);
    assert_eq!(report.forbidden, 1);
    assert_eq!(report.pending.iter().map(|(_, n)| n).sum::<usize>(), 0);
    assert_eq!(
        queue_status(&report, &AxQueueStatus::default(), t(6)).forbidden,
        1
    );
    // Its slot freed, a's next task goes; b's still waits.
    registry.remove(&in_ns("a", "late"));
    registry.upsert(&in_ns("a", "next"), "shared", pending_in("a", "x", 7));
    assert_eq!(
        registry.next(t(8)).map(|(k, _)| k),
        Some(in_ns("a", "next"))
    );
    assert!(
        registry
            .held(t(8))
            .iter()
            .any(|h| h.key == in_ns("b", "early") && h.reason == HeldReason::QueueForbidden)
    );
    // Deleted while forbidden: nothing is left of it.
    assert!(!registry.remove(&in_ns("b", "early")));
    assert_eq!(registry.reports(t(9))[0].forbidden, 0);
}

#[test]
fn labelling_the_namespace_lets_its_tasks_in_and_unlabelling_holds_those_not_dispatched() {
    let mut registry = Registry::default();
    registry.configure(&queue("shared", selecting("a", 10), None), t(0));
    registry.namespace_labels("b", Some(BTreeMap::new()));
    for i in 0..3 {
        registry.upsert(
            &in_ns("b", &format!("t{i}")),
            "shared",
            pending_in("b", "x", i),
        );
    }
    assert_eq!(registry.next(t(5)), None);
    // Same labels again (a re-list): nothing to do.
    assert_eq!(registry.namespace_labels("b", Some(BTreeMap::new())), 0);
    assert_eq!(registry.namespace_labels("b", team("a")), 3);
    assert_eq!(registry.reports(t(5))[0].forbidden, 0);
    assert_eq!(registry.next(t(5)).map(|(k, _)| k), Some(in_ns("b", "t0")));
    registry.dispatched(&in_ns("b", "t0"));
    // Unlabelled: the running task keeps its slot, the others wait again, in their order.
    assert_eq!(registry.namespace_labels("b", Some(BTreeMap::new())), 2);
    assert!(registry.is_holding(&in_ns("b", "t0")));
    assert_eq!(registry.next(t(6)), None);
    assert_eq!(
        registry
            .held_reason(&in_ns("b", "t1"), t(6))
            .map(|(r, _)| r),
        Some(HeldReason::QueueForbidden)
    );
    // A task that was forbidden and is offered again stays forbidden.
    registry.upsert(&in_ns("b", "t1"), "shared", pending_in("b", "x", 1));
    assert_eq!(registry.reports(t(6))[0].forbidden, 2);
    // Namespace deleted: no labels, so nothing is selected (its tasks are going anyway).
    assert_eq!(registry.namespace_labels("b", team("a")), 2);
    assert_eq!(registry.namespace_labels("b", None), 2);
    assert!(registry.known_namespaces().is_empty());
    // Back: t1 goes before t2 (queued earlier).
    registry.namespace_labels("b", team("a"));
    assert_eq!(registry.next(t(7)).map(|(k, _)| k), Some(in_ns("b", "t1")));
}

#[test]
fn editing_the_selector_applies_at_once() {
    let mut registry = Registry::default();
    registry.namespace_labels("a", team("a"));
    registry.namespace_labels("b", team("b"));
    registry.configure(&queue("q", AxQueueSpec::default(), None), t(0));
    registry.upsert(&in_ns("a", "x"), "q", pending_in("a", "x", 0));
    registry.upsert(&in_ns("b", "y"), "q", pending_in("b", "x", 1));
    registry.configure(&queue("q", selecting("b", 10), None), t(1));
    assert_eq!(registry.reports(t(1))[0].forbidden, 1);
    assert_eq!(registry.next(t(1)).map(|(k, _)| k), Some(in_ns("b", "y")));
    assert_eq!(registry.next(t(1)), None);
    // A namespace whose labels are not known yet is not admitted, even by a selector that selects
    // no labels: its real ones may exclude it.
    let mut spec = selecting("b", 10);
    spec.namespace_selector = Some(
        serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}],
        }))
        .expect("a selector"),
    );
    registry.configure(&queue("q", spec, None), t(2));
    registry.upsert(&in_ns("new", "z"), "q", pending_in("new", "x", 2));
    assert_eq!(registry.next(t(2)).map(|(k, _)| k), Some(in_ns("a", "x")));
    assert_eq!(registry.next(t(2)), None);
    let (reason, message) = registry
        .held_reason(&in_ns("new", "z"), t(2))
        .expect("held");
    assert_eq!(reason, HeldReason::QueueForbidden);
    assert!(message.contains("not known yet"), "{message}");
    // Seen, without labels: NotIn selects it.
    assert_eq!(registry.namespace_labels("new", Some(BTreeMap::new())), 1);
    assert_eq!(registry.next(t(2)).map(|(k, _)| k), Some(in_ns("new", "z")));
    registry.upsert(&in_ns("new", "later"), "q", pending_in("new", "x", 3));
    registry.namespace_labels("new", team("b"));
    assert_eq!(registry.next(t(3)), None);
    // Back to no selector: everyone is in.
    registry.configure(&queue("q", AxQueueSpec::default(), None), t(3));
    assert_eq!(registry.reports(t(3))[0].forbidden, 0);
    assert_eq!(
        registry.next(t(3)).map(|(k, _)| k),
        Some(in_ns("new", "later"))
    );
}

#[test]
fn an_invalid_selector_is_reported_and_the_previous_one_stays() {
    let mut registry = Registry::default();
    registry.namespace_labels("b", team("b"));
    registry.configure(&queue("q", selecting("a", 10), None), t(0));
    let mut spec = selecting("a", 10);
    spec.namespace_selector = Some(
        serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "team", "operator": "in", "values": ["b"]}],
        }))
        .expect("a selector"),
    );
    let problem = registry
        .configure(&queue("q", spec, None), t(1))
        .expect("refused");
    assert!(
        problem
            .to_string()
            .starts_with("spec.namespaceSelector.matchExpressions[0].operator"),
        "{problem}"
    );
    registry.upsert(&in_ns("b", "t"), "q", pending_in("b", "x", 0));
    assert_eq!(
        registry.held_reason(&in_ns("b", "t"), t(1)).map(|(r, _)| r),
        Some(HeldReason::QueueForbidden)
    );
}

#[test]
fn a_deleted_queue_holds_its_forbidden_tasks_as_missing_and_selects_again_when_back() {
    let mut registry = Registry::default();
    registry.configure(&queue("q", selecting("a", 10), None), t(0));
    registry.upsert(&in_ns("b", "t"), "q", pending_in("b", "x", 0));
    registry.queue_deleted("q");
    assert_eq!(
        registry.held_reason(&in_ns("b", "t"), t(1)).map(|(r, _)| r),
        Some(HeldReason::QueueNotFound)
    );
    assert_eq!(registry.next(t(1)), None);
    registry.configure(&queue("q", selecting("a", 10), None), t(2));
    assert_eq!(
        registry.held_reason(&in_ns("b", "t"), t(2)).map(|(r, _)| r),
        Some(HeldReason::QueueForbidden)
    );
    registry.queue_deleted("q");
    registry.configure(&queue("q", AxQueueSpec::default(), None), t(3));
    assert_eq!(registry.next(t(3)).map(|(k, _)| k), Some(in_ns("b", "t")));
}

#[test]
fn a_shared_queue_opens_the_circuit_of_the_failing_namespace_only() {
    let mut registry = Registry::default();
    let spec = AxQueueSpec {
        circuit_breaker: CircuitBreakerSpec {
            window_size: 2,
            min_requests: 2,
            failure_ratio: 0.5,
            open_seconds: 30,
        },
        ..AxQueueSpec::default()
    };
    registry.configure(&queue("shared", spec, None), t(0));
    for i in 0..2 {
        let key = in_ns("team-a", &format!("fail{i}"));
        registry.upsert(&key, "shared", pending_in("team-a", "x", i));
        registry.next(t(1));
        registry.record_outcome(&key, Outcome::Failed, t(1));
        registry.remove(&key);
    }
    registry.upsert(
        &in_ns("team-a", "held"),
        "shared",
        pending_in("team-a", "x", 2),
    );
    registry.upsert(
        &in_ns("team-b", "goes"),
        "shared",
        pending_in("team-b", "x", 3),
    );
    let (reason, message) = registry
        .held_reason(&in_ns("team-a", "held"), t(2))
        .expect("held");
    assert_eq!(reason, HeldReason::CircuitOpen);
    assert!(message.contains("for namespace team-a"), "{message}");
    assert_eq!(
        registry.next(t(2)).map(|(k, _)| k),
        Some(in_ns("team-b", "goes"))
    );
    let report = registry.reports(t(2)).remove(0);
    assert_eq!(report.open_circuits, ["x".to_string()]);
    let status = queue_status(&report, &AxQueueStatus::default(), t(2));
    assert_eq!(
        status
            .circuits
            .iter()
            .map(|c| (c.namespace.as_str(), c.task_type.as_str(), c.state.as_str()))
            .collect::<Vec<_>>(),
        [("team-a", "x", "Open")]
    );
}

mod selection_model {
    //! The registry against a plain model of which namespaces a queue selects.

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Namespace `ns` gets team label `team` (None: no label).
        Label {
            ns: u8,
            team: Option<u8>,
        },
        /// The queue selects team `team` (None: everything).
        Select(Option<u8>),
        Upsert {
            ns: u8,
            task: u8,
        },
        Next,
        Remove {
            ns: u8,
            task: u8,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0u8..3, proptest::option::of(0u8..2)).prop_map(|(ns, team)| Op::Label { ns, team }),
            1 => proptest::option::of(0u8..2).prop_map(Op::Select),
            4 => (0u8..3, 0u8..6).prop_map(|(ns, task)| Op::Upsert { ns, task }),
            3 => Just(Op::Next),
            1 => (0u8..3, 0u8..6).prop_map(|(ns, task)| Op::Remove { ns, task }),
        ]
    }

    fn spec_for(team: Option<u8>) -> AxQueueSpec {
        match team {
            Some(team) => selecting(&team.to_string(), 1000),
            None => AxQueueSpec::default(),
        }
    }

    proptest! {
        /// Nothing of a namespace the selector does not select is ever dispatched; every waiting
        /// task is held as `QueueForbidden` exactly when its namespace is not selected; the
        /// forbidden count matches.
        #[test]
        fn only_selected_namespaces_are_dispatched(ops in proptest::collection::vec(op(), 1..150)) {
            let mut registry = Registry::default();
            let mut labels: BTreeMap<String, Option<u8>> = BTreeMap::new();
            let mut selected_team: Option<u8> = None;
            let mut waiting: BTreeSet<TaskKey> = BTreeSet::new();
            registry.configure(&queue("q", spec_for(None), None), t(0));
            let selects = |labels: &BTreeMap<String, Option<u8>>, team: Option<u8>, ns: &str| {
                team.is_none_or(|team| labels.get(ns).copied().flatten() == Some(team))
            };
            for (step, op) in ops.into_iter().enumerate() {
                let now = t(step as i64);
                match op {
                    Op::Label { ns, team } => {
                        let ns = format!("ns{ns}");
                        let value = team.map(|team| [("team".to_string(), team.to_string())].into());
                        registry.namespace_labels(&ns, Some(value.unwrap_or_default()));
                        labels.insert(ns, team);
                    }
                    Op::Select(team) => {
                        registry.configure(&queue("q", spec_for(team), None), now);
                        selected_team = team;
                    }
                    Op::Upsert { ns, task } => {
                        let namespace = format!("ns{ns}");
                        let key = in_ns(&namespace, &format!("t{task}"));
                        if !registry.is_holding(&key) {
                            registry.upsert(&key, "q", pending_in(&namespace, "x", step as i64));
                            waiting.insert(key);
                        }
                    }
                    Op::Next => {
                        if let Some((key, _)) = registry.next(now) {
                            prop_assert!(selects(&labels, selected_team, &key.0), "{key:?} dispatched");
                            prop_assert!(waiting.remove(&key));
                        }
                    }
                    Op::Remove { ns, task } => {
                        let key = in_ns(&format!("ns{ns}"), &format!("t{task}"));
                        registry.remove(&key);
                        waiting.remove(&key);
                    }
                }
                let mut forbidden = 0;
                for key in &waiting {
                    let (reason, _) = registry.held_reason(key, now).expect("a waiting task is held");
                    let selected = selects(&labels, selected_team, &key.0);
                    prop_assert_eq!(reason == HeldReason::QueueForbidden, !selected, "{:?}", key);
                    forbidden += usize::from(!selected);
                }
                prop_assert_eq!(registry.reports(now)[0].forbidden, forbidden);
            }
        }
    }
}

#[test]
fn a_task_held_by_its_key_names_the_key_and_when_its_token_comes() {
    let mut registry = Registry::default();
    let spec: AxQueueSpec = serde_json::from_value(serde_json::json!({
        "fairness": {"key": {"label": "customer"}},
        "keyRate": {"perMinute": 60, "burst": 1},
        "keyConcurrency": {"overrides": {"y": 0}},
    }))
    .expect("a spec");
    registry.configure(&queue("keyed", spec, None), t(0));
    let keyed = |customer: &str, at: i64| PendingTask {
        key: Some(customer.into()),
        ..pending(Priority::Normal, "x", at, 1)
    };
    for (n, at) in [("x1", 1), ("x2", 2), ("x3", 3)] {
        registry.upsert(&key(n), "keyed", keyed("x", at));
    }
    registry.upsert(&key("y1"), "keyed", keyed("y", 4));
    assert_eq!(registry.next(t(5)).map(|(k, _)| k), Some(key("x1")));
    let (reason, message) = registry.held_reason(&key("x3"), t(5)).expect("held");
    assert_eq!(reason, HeldReason::KeyRateLimit);
    assert!(
        message.starts_with(
            "the keyRate of key x (label:customer) in AxQueue keyed (60/min, burst 1) is used up"
        ),
        "{message}"
    );
    // x3 needs the second token from now: two seconds on.
    assert!(
        message.contains("estimated start 2030-03-17T17:46:47Z"),
        "{message}"
    );
    let (reason, message) = registry.held_reason(&key("y1"), t(5)).expect("held");
    assert_eq!(reason, HeldReason::KeyConcurrencyLimit);
    assert!(
        message.contains("the keyConcurrency of key y (label:customer) in AxQueue keyed (0)")
            && message.contains("estimated start unknown"),
        "{message}"
    );
}
