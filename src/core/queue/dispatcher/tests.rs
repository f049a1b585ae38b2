//! Tests of the dispatcher: weighted shares and max-wait, FIFO lanes, concurrency and type
//! limits, retry tokens, circuits per namespace, schedule windows, the adaptive limit, positions
//! and estimates, and a property test of limits and reasons.

use std::collections::BTreeMap;

use jiff::SignedDuration;
use proptest::prelude::*;

use super::*;
use crate::core::queue::MaxWait;
use crate::core::queue::breaker::BreakerConfig;
use crate::core::queue::config::{Fairness, KeyConcurrency, KeyRate, Preemption};
use crate::core::queue::weights::{WeightWindow, Weights, WindowLimits};

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).expect("valid test timestamp")
}

fn task(priority: Priority, task_type: &str, queued_at: Timestamp, attempt: u32) -> PendingTask {
    in_namespace("ns", priority, task_type, queued_at, attempt)
}

fn in_namespace(
    namespace: &str,
    priority: Priority,
    task_type: &str,
    queued_at: Timestamp,
    attempt: u32,
) -> PendingTask {
    PendingTask {
        priority,
        namespace: namespace.to_string(),
        key: None,
        task_type: task_type.to_string(),
        queued_at,
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

fn unlimited() -> QueueConfig {
    QueueConfig {
        concurrency: u32::MAX,
        ..QueueConfig::default()
    }
}

/// Dispatches and finishes until nothing more goes; returns the dispatch order.
fn drain(dispatcher: &mut Dispatcher<u32>, now: Timestamp) -> Vec<u32> {
    let mut order = Vec::new();
    while let Some(key) = dispatcher.next(now) {
        dispatcher.finished(&key, Outcome::Succeeded, now);
        order.push(key);
    }
    order
}

#[test]
fn saturated_buckets_share_dispatches_by_weight() {
    let mut dispatcher = Dispatcher::new(unlimited());
    let now = t(0);
    // 50 tasks per bucket, each put back when done: every bucket stays non-empty.
    let mut priority_of = HashMap::new();
    for key in 0..200u32 {
        let priority = Priority::ALL[(key % 4) as usize];
        priority_of.insert(key, priority);
        dispatcher.upsert(key, task(priority, "work", now, 1));
    }
    let mut shares = [0u32; 4];
    for _ in 0..10_000 {
        let key = dispatcher
            .next(now)
            .expect("saturated buckets always dispatch");
        dispatcher.finished(&key, Outcome::Succeeded, now);
        let priority = priority_of[&key];
        shares[priority.index()] += 1;
        dispatcher.upsert(key, task(priority, "work", now, 1));
    }
    for (priority, expected) in Priority::ALL.into_iter().zip([4000i64, 3000, 2000, 1000]) {
        let got = i64::from(shares[priority.index()]);
        assert!(
            (got - expected).abs() * 50 <= expected,
            "{priority:?}: {got} of 10000, expected {expected} ± 2%"
        );
    }
}

#[test]
fn empty_and_zero_weight_buckets_are_skipped() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        weights: Weights {
            critical: 0,
            ..Weights::default()
        },
        ..unlimited()
    });
    dispatcher.upsert(1, task(Priority::Critical, "a", t(0), 1));
    dispatcher.upsert(2, task(Priority::Low, "a", t(1), 1));
    assert_eq!(drain(&mut dispatcher, t(2)), vec![2]);
    assert_eq!(
        dispatcher.held_reason(&1, t(2)).map(|(r, _)| r),
        Some(HeldReason::Waiting)
    );
}

#[test]
fn low_task_waits_at_most_max_wait_plus_one_dispatch_behind_critical() {
    for low_weight in [0, 1] {
        let config = QueueConfig {
            concurrency: 10,
            weights: Weights {
                critical: 1000,
                low: low_weight,
                ..Weights::default()
            },
            ..QueueConfig::default()
        };
        let mut dispatcher = Dispatcher::new(config);
        let start = t(0);
        for key in 0..10_000u32 {
            dispatcher.upsert(key, task(Priority::Critical, "hot", start, 1));
        }
        let low_key = 1_000_000;
        dispatcher.upsert(low_key, task(Priority::Low, "cold", start, 1));
        let mut running = std::collections::VecDeque::new();
        let mut now = start;
        let dispatched_at = loop {
            // One task finishes and one dispatch happens every second.
            if running.len() == 10 {
                let done = running.pop_front().expect("a running task");
                dispatcher.finished(&done, Outcome::Succeeded, now);
            }
            let key = dispatcher
                .next(now)
                .expect("critical tasks are always pending");
            if key == low_key {
                break now;
            }
            running.push_back(key);
            now += SignedDuration::from_secs(1);
            assert!(now < t(1000), "the low task was never dispatched");
        };
        let waited = dispatched_at.duration_since(start);
        assert!(
            waited <= SignedDuration::from_secs(121),
            "weight {low_weight}: waited {waited:?}"
        );
    }
}

#[test]
fn oldest_overdue_head_goes_first() {
    let mut dispatcher = Dispatcher::new(unlimited());
    dispatcher.upsert(1, task(Priority::Critical, "a", t(0), 1));
    dispatcher.upsert(2, task(Priority::Low, "a", t(10), 1));
    dispatcher.upsert(3, task(Priority::Normal, "a", t(20), 1));
    // At 200 s both Low (190 s > 120 s) and Normal (180 s > 30 s) are overdue; Low is older.
    assert_eq!(drain(&mut dispatcher, t(200)), vec![2, 3, 1]);
}

#[test]
fn fifo_within_a_bucket_by_queued_at_then_key() {
    let mut dispatcher = Dispatcher::new(unlimited());
    for (key, queued) in [(5, 3), (4, 1), (9, 2), (1, 2), (7, 0)] {
        dispatcher.upsert(key, task(Priority::High, "a", t(queued), 1));
    }
    assert_eq!(drain(&mut dispatcher, t(5)), vec![7, 4, 1, 9, 5]);
}

#[test]
fn upsert_moves_a_task() {
    let mut dispatcher = Dispatcher::new(unlimited());
    dispatcher.upsert(1, task(Priority::Low, "a", t(0), 1));
    dispatcher.upsert(2, task(Priority::Low, "a", t(1), 1));
    dispatcher.upsert(1, task(Priority::Low, "a", t(2), 1));
    assert_eq!(dispatcher.pending_len(), 2);
    assert_eq!(drain(&mut dispatcher, t(3)), vec![2, 1]);
}

#[test]
fn removal_works_for_pending_and_running() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    for key in 1..=3 {
        dispatcher.upsert(key, task(Priority::Normal, "a", t(key.into()), 1));
    }
    assert!(dispatcher.remove(&1));
    assert!(!dispatcher.remove(&1));
    assert_eq!(dispatcher.held_reason(&1, t(5)).map(|(r, _)| r), None);
    assert_eq!(dispatcher.next(t(5)), Some(2));
    assert_eq!(dispatcher.next(t(5)), None);
    assert_eq!(
        dispatcher.held_reason(&3, t(5)).map(|(r, _)| r),
        Some(HeldReason::ConcurrencyLimit)
    );
    assert!(dispatcher.remove(&2));
    assert_eq!(dispatcher.next(t(5)), Some(3));
    assert_eq!(dispatcher.stats(t(5)).pending.map(|(_, n)| n), [0; 4]);
}

#[test]
fn queue_concurrency_counts_scheduled_and_running() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 2,
        ..QueueConfig::default()
    });
    dispatcher.mark_running(100, "ns", holder("a"));
    for key in 1..=3 {
        dispatcher.upsert(key, task(Priority::Normal, "a", t(0), 1));
    }
    assert_eq!(dispatcher.next(t(1)), Some(1));
    assert_eq!(dispatcher.next(t(1)), None);
    assert!(dispatcher.finished(&100, Outcome::Succeeded, t(2)));
    assert!(!dispatcher.finished(&100, Outcome::Succeeded, t(2)));
    assert_eq!(dispatcher.next(t(2)), Some(2));
    assert_eq!(dispatcher.stats(t(2)).running, 2);
}

#[test]
fn blocked_types_do_not_block_others() {
    let mut config = unlimited();
    config.type_concurrency.insert("slow".to_string(), 1);
    let mut dispatcher = Dispatcher::new(config);
    for key in 0..5 {
        dispatcher.upsert(key, task(Priority::Normal, "slow", t(key.into()), 1));
    }
    dispatcher.upsert(10, task(Priority::Normal, "fast", t(10), 1));
    dispatcher.upsert(11, task(Priority::Normal, "fast", t(11), 1));
    assert_eq!(dispatcher.next(t(20)), Some(0));
    assert_eq!(
        dispatcher.held_reason(&1, t(20)).map(|(r, _)| r),
        Some(HeldReason::TypeConcurrencyLimit)
    );
    assert_eq!(
        dispatcher.held_reason(&10, t(20)).map(|(r, _)| r),
        Some(HeldReason::Waiting)
    );
    assert_eq!(dispatcher.next(t(20)), Some(10));
    assert_eq!(dispatcher.next(t(20)), Some(11));
    assert_eq!(dispatcher.next(t(20)), None);
    dispatcher.finished(&0, Outcome::Succeeded, t(21));
    assert_eq!(dispatcher.next(t(21)), Some(1));
}

#[test]
fn retries_wait_for_tokens_without_blocking_first_attempts() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        retry_rate_per_minute: 60,
        ..unlimited()
    });
    dispatcher.upsert(1, task(Priority::Normal, "a", t(0), 2));
    dispatcher.upsert(2, task(Priority::Normal, "a", t(1), 3));
    dispatcher.upsert(3, task(Priority::Normal, "a", t(2), 1));
    assert_eq!(dispatcher.next(t(10)), Some(1));
    assert_eq!(
        dispatcher.held_reason(&2, t(10)).map(|(r, _)| r),
        Some(HeldReason::RetryRateLimited)
    );
    assert_eq!(dispatcher.next(t(10)), Some(3));
    assert_eq!(dispatcher.next(t(10)), None);
    assert_eq!(dispatcher.next(t(11)), Some(2));
}

#[test]
fn open_circuit_holds_its_type_and_lets_one_probe_through() {
    let mut dispatcher = Dispatcher::new(unlimited());
    let failing = "flaky";
    for key in 0..10 {
        dispatcher.upsert(key, task(Priority::High, failing, t(0), 1));
    }
    let started = drain_without_finishing(&mut dispatcher, t(0));
    for key in &started {
        dispatcher.finished(key, Outcome::Failed, t(1));
    }
    let stats = dispatcher.stats(t(1));
    assert_eq!(
        stats.open_circuits,
        vec![OpenCircuit {
            namespace: "ns".to_string(),
            task_type: failing.to_string(),
            state: BreakerState::Open { until: t(31) }
        }]
    );
    // Older tasks of the open type do not hold up a healthy type in the same bucket.
    for key in 20..23 {
        dispatcher.upsert(key, task(Priority::High, failing, t(2), 1));
    }
    dispatcher.upsert(30, task(Priority::High, "healthy", t(3), 1));
    assert_eq!(
        dispatcher.held_reason(&20, t(4)).map(|(r, _)| r),
        Some(HeldReason::CircuitOpen)
    );
    assert_eq!(drain_without_finishing(&mut dispatcher, t(4)), vec![30]);
    // Half-open after 30 s: exactly one probe.
    assert_eq!(
        drain_without_finishing(&mut dispatcher, t(30)),
        Vec::<u32>::new()
    );
    assert_eq!(drain_without_finishing(&mut dispatcher, t(31)), vec![20]);
    assert_eq!(
        drain_without_finishing(&mut dispatcher, t(100)),
        Vec::<u32>::new()
    );
    assert_eq!(
        dispatcher.held_reason(&21, t(100)).map(|(r, _)| r),
        Some(HeldReason::CircuitOpen)
    );
    // Probe fails: open again for 30 s.
    dispatcher.finished(&20, Outcome::Failed, t(101));
    assert_eq!(
        drain_without_finishing(&mut dispatcher, t(130)),
        Vec::<u32>::new()
    );
    assert_eq!(drain_without_finishing(&mut dispatcher, t(131)), vec![21]);
    // Probe succeeds: closed, the rest goes.
    dispatcher.finished(&21, Outcome::Succeeded, t(132));
    assert_eq!(dispatcher.stats(t(132)).open_circuits, vec![]);
    assert_eq!(drain_without_finishing(&mut dispatcher, t(132)), vec![22]);
}

#[test]
fn aborted_probe_lets_another_probe_through() {
    let mut dispatcher = Dispatcher::new(unlimited());
    for key in 0..10 {
        dispatcher.upsert(key, task(Priority::High, "flaky", t(0), 1));
    }
    for key in drain_without_finishing(&mut dispatcher, t(0)) {
        dispatcher.finished(&key, Outcome::Failed, t(0));
    }
    dispatcher.upsert(1, task(Priority::High, "flaky", t(1), 1));
    dispatcher.upsert(2, task(Priority::High, "flaky", t(1), 1));
    assert_eq!(drain_without_finishing(&mut dispatcher, t(30)), vec![1]);
    assert!(dispatcher.remove(&1));
    assert_eq!(drain_without_finishing(&mut dispatcher, t(30)), vec![2]);
}

#[test]
fn one_namespace_failing_does_not_open_the_circuit_of_another() {
    let mut dispatcher = Dispatcher::new(unlimited());
    // Ten failures of team a: its breaker (minRequests 10) opens.
    for key in 0..10 {
        dispatcher.upsert(key, in_namespace("team-a", Priority::High, "x", t(0), 1));
    }
    for key in drain_without_finishing(&mut dispatcher, t(0)) {
        dispatcher.finished(&key, Outcome::Failed, t(1));
    }
    let open = dispatcher.stats(t(2)).open_circuits;
    assert_eq!(
        open.iter()
            .map(|c| (c.namespace.as_str(), c.task_type.as_str()))
            .collect::<Vec<_>>(),
        [("team-a", "x")]
    );
    // Team a's next task of type x is held; team b's, queued later, goes.
    dispatcher.upsert(20, in_namespace("team-a", Priority::High, "x", t(2), 1));
    dispatcher.upsert(21, in_namespace("team-b", Priority::High, "x", t(3), 1));
    assert_eq!(
        dispatcher.held_reason(&20, t(4)).map(|(r, _)| r),
        Some(HeldReason::CircuitOpen)
    );
    assert_eq!(
        dispatcher.held_reason(&21, t(4)).map(|(r, _)| r),
        Some(HeldReason::Waiting)
    );
    assert_eq!(drain_without_finishing(&mut dispatcher, t(4)), vec![21]);
}

#[test]
fn type_concurrency_is_shared_by_the_namespaces() {
    let mut config = unlimited();
    config.type_concurrency.insert("x".to_string(), 2);
    let mut dispatcher = Dispatcher::new(config);
    dispatcher.mark_running(0, "team-a", holder("x"));
    dispatcher.upsert(1, in_namespace("team-a", Priority::Normal, "x", t(0), 1));
    dispatcher.upsert(2, in_namespace("team-b", Priority::Normal, "x", t(1), 1));
    dispatcher.upsert(3, in_namespace("team-c", Priority::Normal, "x", t(2), 1));
    assert_eq!(drain_without_finishing(&mut dispatcher, t(3)), vec![1]);
    for key in [2, 3] {
        assert_eq!(
            dispatcher.held_reason(&key, t(3)),
            Some((HeldReason::TypeConcurrencyLimit, "x"))
        );
    }
    dispatcher.finished(&0, Outcome::Succeeded, t(4));
    assert_eq!(drain_without_finishing(&mut dispatcher, t(4)), vec![2]);
}

#[test]
fn a_task_taken_out_comes_back_as_it_was() {
    let mut dispatcher = Dispatcher::new(unlimited());
    let retry = in_namespace("team-a", Priority::Low, "x", t(5), 3);
    dispatcher.upsert(1, retry.clone());
    dispatcher.upsert(2, task(Priority::Low, "x", t(6), 1));
    assert_eq!(dispatcher.take_pending(&1), Some(retry.clone()));
    assert_eq!(dispatcher.take_pending(&1), None);
    assert_eq!(dispatcher.pending_len(), 1);
    dispatcher.upsert(1, retry);
    assert_eq!(drain(&mut dispatcher, t(7)), vec![1, 2]);
}

proptest! {
    /// Whatever happens to the tasks of type x in namespace a, the tasks of type x in namespace
    /// b (which always succeed) are never held by a circuit, and no circuit of b opens.
    #[test]
    fn circuits_are_isolated_per_namespace(
        steps in proptest::collection::vec((any::<bool>(), 0u8..4, any::<bool>()), 1..200),
    ) {
        let mut dispatcher: Dispatcher<u32> = Dispatcher::new(QueueConfig {
            concurrency: 4,
            circuit_breaker: BreakerConfig {
                window_size: 4,
                min_requests: 2,
                ..BreakerConfig::default()
            },
            ..QueueConfig::default()
        });
        let mut now = t(0);
        // Key -> whether it is in namespace b.
        let mut in_b_of: Vec<bool> = Vec::new();
        let mut running: Vec<u32> = Vec::new();
        for (in_b, action, a_fails) in steps {
            match action {
                0 | 1 => {
                    let key = in_b_of.len() as u32;
                    let namespace = if in_b { "b" } else { "a" };
                    dispatcher.upsert(key, in_namespace(namespace, Priority::Normal, "x", now, 1));
                    in_b_of.push(in_b);
                }
                2 => running.extend(dispatcher.next(now)),
                _ => {
                    if let Some(key) = running.pop() {
                        let fails = a_fails && !in_b_of[key as usize];
                        let outcome = if fails { Outcome::Failed } else { Outcome::Succeeded };
                        dispatcher.finished(&key, outcome, now);
                    }
                    now += SignedDuration::from_secs(7);
                }
            }
            let stats = dispatcher.stats(now);
            prop_assert!(stats.open_circuits.iter().all(|c| c.namespace == "a"), "{:?}", stats.open_circuits);
            for (key, in_b) in in_b_of.iter().enumerate() {
                if *in_b {
                    let reason = dispatcher.held_reason(&(key as u32), now).map(|(r, _)| r);
                    prop_assert_ne!(reason, Some(HeldReason::CircuitOpen));
                }
            }
        }
    }
}

fn drain_without_finishing(dispatcher: &mut Dispatcher<u32>, now: Timestamp) -> Vec<u32> {
    std::iter::from_fn(|| dispatcher.next(now)).collect()
}

#[test]
fn weight_schedule_switches_weights_at_its_boundaries() {
    let only_low = Weights {
        critical: 0,
        high: 0,
        normal: 0,
        low: 1,
    };
    let config = QueueConfig {
        weights: Weights {
            low: 0,
            ..Weights::default()
        },
        weight_schedule: vec![
            WeightWindow::parse("22:00", "06:00", "Europe/Berlin", only_low).expect("valid window"),
        ],
        max_wait: MaxWait {
            low: None,
            ..MaxWait::default()
        },
        ..unlimited()
    };
    let mut dispatcher = Dispatcher::new(config);
    let queued: Timestamp = "2026-03-28T12:00:00Z".parse().expect("valid timestamp");
    dispatcher.upsert(1, task(Priority::Critical, "a", queued, 1));
    dispatcher.upsert(2, task(Priority::Low, "a", queued, 1));
    // 22:00 CET on the night the clocks go forward.
    let evening: Timestamp = "2026-03-28T21:00:00Z".parse().expect("valid timestamp");
    let before = evening - SignedDuration::from_secs(1);
    assert_eq!(drain_without_finishing(&mut dispatcher, before), vec![1]);
    dispatcher.upsert(3, task(Priority::Critical, "a", queued, 1));
    assert_eq!(drain_without_finishing(&mut dispatcher, evening), vec![2]);
    dispatcher.upsert(4, task(Priority::Low, "a", queued, 1));
    // 06:00 CEST is 04:00Z.
    let morning: Timestamp = "2026-03-29T04:00:00Z".parse().expect("valid timestamp");
    let still_night = morning - SignedDuration::from_secs(1);
    assert_eq!(
        drain_without_finishing(&mut dispatcher, still_night),
        vec![4]
    );
    dispatcher.upsert(5, task(Priority::Low, "a", queued, 1));
    assert_eq!(drain_without_finishing(&mut dispatcher, morning), vec![3]);
}

#[test]
fn a_window_overrides_concurrency_and_type_limits_between_its_boundaries() {
    let limits = WindowLimits {
        concurrency: Some(2),
        type_concurrency: [("report".to_string(), 1)].into(),
        retry_rate_per_minute: None,
    };
    // 09:00-10:00 in Asia/Kolkata (+05:30): 03:30Z-04:30Z.
    let config = QueueConfig {
        concurrency: 5,
        weight_schedule: vec![
            WeightWindow::parse_with("09:00", "10:00", "Asia/Kolkata", None, limits)
                .expect("valid window"),
        ],
        ..QueueConfig::default()
    };
    let mut dispatcher = Dispatcher::new(config);
    let at = |utc: &str| -> Timestamp { utc.parse().expect("valid timestamp") };
    for key in 0..10 {
        dispatcher.upsert(
            key,
            task(Priority::Normal, "work", at("2026-01-05T00:00:00Z"), 1),
        );
    }
    for key in 10..13 {
        dispatcher.upsert(
            key,
            task(Priority::Normal, "report", at("2026-01-05T00:00:01Z"), 1),
        );
    }
    let inside = at("2026-01-05T03:30:00Z");
    assert_eq!(drain_without_finishing(&mut dispatcher, inside).len(), 2);
    assert_eq!(dispatcher.window(), Some(0));
    assert_eq!(dispatcher.effective_concurrency(), 2);
    assert_eq!(
        dispatcher.held_reason(&5, inside).map(|(r, _)| r),
        Some(HeldReason::ConcurrencyLimit)
    );
    // The window ends at 10:00 local time: the queue's 5 apply again, "report" keeps 1.
    let before_end = at("2026-01-05T04:29:59Z");
    assert_eq!(
        drain_without_finishing(&mut dispatcher, before_end),
        Vec::<u32>::new()
    );
    let after = at("2026-01-05T04:30:00Z");
    assert_eq!(drain_without_finishing(&mut dispatcher, after).len(), 3);
    assert_eq!(dispatcher.window(), None);
    assert_eq!(dispatcher.effective_concurrency(), 5);
}

#[test]
fn an_adaptive_limit_below_the_concurrency_holds_with_its_own_reason() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 10,
        ..QueueConfig::default()
    });
    dispatcher.set_adaptive_limit(Some(2));
    for key in 0..5 {
        dispatcher.upsert(key, task(Priority::Normal, "a", t(0), 1));
    }
    assert_eq!(drain_without_finishing(&mut dispatcher, t(1)), vec![0, 1]);
    assert_eq!(
        dispatcher.held_reason(&2, t(1)).map(|(r, _)| r),
        Some(HeldReason::AdaptiveLimit)
    );
    // At the queue's own limit it is the concurrency that holds.
    dispatcher.set_adaptive_limit(Some(10));
    assert_eq!(
        drain_without_finishing(&mut dispatcher, t(2)),
        vec![2, 3, 4]
    );
    dispatcher.set_adaptive_limit(Some(5));
    dispatcher.upsert(9, task(Priority::Normal, "a", t(3), 1));
    assert_eq!(
        dispatcher.held_reason(&9, t(3)).map(|(r, _)| r),
        Some(HeldReason::AdaptiveLimit)
    );
    dispatcher.set_adaptive_limit(None);
    assert_eq!(
        dispatcher.held_reason(&9, t(3)).map(|(r, _)| r),
        Some(HeldReason::Waiting)
    );
}

#[test]
fn positions_count_down_with_dispatches_and_estimates_follow_the_rate() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    // Two lanes (types) interleaved by time, plus a retry lane.
    for key in 0..30u32 {
        let task_type = if key % 2 == 0 { "a" } else { "b" };
        let attempt = if key % 5 == 4 { 2 } else { 1 };
        dispatcher.upsert(
            key,
            task(Priority::Low, task_type, t(i64::from(key)), attempt),
        );
    }
    dispatcher.refresh_positions();
    let position =
        |d: &Dispatcher<u32>, key: u32, now| d.estimate(&key, now).expect("pending").position;
    for key in 0..30 {
        assert_eq!(position(&dispatcher, key, t(100)), u64::from(key) + 1);
    }
    // One dispatch every 2 s, each finishing at once.
    let mut now = t(100);
    for _ in 0..10 {
        let key = dispatcher.next(now).expect("a task");
        dispatcher.finished(&key, Outcome::Succeeded, now);
        now += SignedDuration::from_secs(2);
    }
    let last = now - SignedDuration::from_secs(2);
    // No refresh needed for positions to count down.
    assert_eq!(position(&dispatcher, 29, now), 20);
    let estimate = dispatcher.estimate(&29, now).expect("pending");
    assert_eq!(estimate.start, Ok(last + SignedDuration::from_secs(40)));
    assert_eq!(estimate.waiting, 20);
    // A task re-offered in the same place keeps its position; a newcomer goes last.
    dispatcher.upsert(29, task(Priority::Low, "b", t(29), 1));
    assert_eq!(position(&dispatcher, 29, now), 20);
    dispatcher.upsert(100, task(Priority::Low, "a", t(5), 1));
    assert_eq!(position(&dispatcher, 100, now), 21);
    // Until the refresh puts it where its queuedAt says.
    dispatcher.refresh_positions();
    assert_eq!(position(&dispatcher, 100, now), 1);
    assert_eq!(position(&dispatcher, 29, now), 21);
}

#[test]
fn a_paused_queue_restarts_its_measurement() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    for key in 0..10u32 {
        dispatcher.upsert(key, task(Priority::High, "a", t(0), 1));
    }
    let mut now = t(0);
    for _ in 0..3 {
        let key = dispatcher.next(now).expect("a task");
        dispatcher.finished(&key, Outcome::Succeeded, now);
        now += SignedDuration::from_secs(1);
    }
    let mut paused = dispatcher.config().clone();
    paused.concurrency = 0;
    dispatcher.set_config(paused.clone(), now);
    assert_eq!(dispatcher.next(now), None);
    // An hour paused, then open again: the hour is not a dispatch interval.
    now += SignedDuration::from_secs(3600);
    paused.concurrency = 1;
    dispatcher.set_config(paused, now);
    for _ in 0..3 {
        let key = dispatcher.next(now).expect("a task");
        dispatcher.finished(&key, Outcome::Succeeded, now);
        now += SignedDuration::from_secs(1);
    }
    let per_minute = dispatcher
        .estimate(&9, now - SignedDuration::from_secs(1))
        .and_then(|e| e.per_minute)
        .expect("a rate");
    assert!((per_minute - 60.0).abs() < 1.0, "{per_minute}");
}

#[test]
fn grants_that_fill_free_slots_are_not_a_rate() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 0,
        ..QueueConfig::default()
    });
    for key in 0..300u32 {
        dispatcher.upsert(key, task(Priority::Low, "a", t(0), 1));
    }
    let mut now = t(10);
    assert_eq!(dispatcher.next(now), None);
    let mut open = dispatcher.config().clone();
    open.concurrency = 30;
    dispatcher.set_config(open, now);
    // The 30 free slots are filled a millisecond apart, as a caller asking with the clock of
    // each call does...
    let mut running = std::collections::VecDeque::new();
    for _ in 0..30 {
        running.push_back(dispatcher.next(now).expect("a free slot"));
        now += SignedDuration::from_millis(1);
    }
    assert_eq!(dispatcher.next(now), None);
    // ... the quickest worker takes 8 s from its grant to its end (its start-up included)...
    now += SignedDuration::from_millis(7500);
    // ... then a slot frees every 500 ms and is granted at once.
    for _ in 0..10 {
        now += SignedDuration::from_millis(500);
        let done = running.pop_front().expect("running");
        dispatcher.finished(&done, Outcome::Succeeded, now);
        running.push_back(dispatcher.next(now).expect("the freed slot"));
        assert_eq!(dispatcher.next(now), None);
    }
    // Neither the fill-up nor the wait for the first worker to end is the pace.
    let estimate = dispatcher.estimate(&299, now).expect("pending");
    assert_eq!(estimate.position, 260);
    let per_minute = estimate.per_minute.expect("a rate");
    assert!((per_minute - 120.0).abs() < 1.0, "{per_minute}");
    let start = estimate.start.expect("a start");
    let expected = now + SignedDuration::from_secs(130);
    assert!(
        start.duration_since(expected).abs() < SignedDuration::from_secs(1),
        "{start} vs {expected}"
    );
}

#[test]
fn config_edits_apply_at_once() {
    let mut dispatcher = Dispatcher::new(QueueConfig {
        concurrency: 1,
        ..QueueConfig::default()
    });
    for key in 0..3 {
        dispatcher.upsert(key, task(Priority::Normal, "a", t(0), 1));
    }
    assert_eq!(drain_without_finishing(&mut dispatcher, t(1)), vec![0]);
    let mut wider = dispatcher.config().clone();
    wider.concurrency = 5;
    wider.type_concurrency.insert("a".to_string(), 2);
    dispatcher.set_config(wider, t(2));
    assert_eq!(drain_without_finishing(&mut dispatcher, t(2)), vec![1]);
    assert_eq!(
        dispatcher.held_reason(&2, t(2)).map(|(r, _)| r),
        Some(HeldReason::TypeConcurrencyLimit)
    );
}

#[test]
fn unused_types_are_forgotten_and_ids_reused() {
    let mut dispatcher = Dispatcher::new(unlimited());
    for round in 0..100u32 {
        let name = format!("type-{round}");
        dispatcher.upsert(round, task(Priority::Low, &name, t(0), 1));
        assert_eq!(drain(&mut dispatcher, t(1)), vec![round]);
    }
    assert_eq!(dispatcher.types.len(), 1);
    assert!(dispatcher.type_ids.is_empty());
    // The same for (namespace, type) circuits.
    for round in 0..100u32 {
        let namespace = format!("ns-{round}");
        dispatcher.upsert(round, in_namespace(&namespace, Priority::Low, "t", t(0), 1));
        assert_eq!(drain(&mut dispatcher, t(1)), vec![round]);
    }
    assert_eq!(dispatcher.circuits.len(), 1);
    assert!(dispatcher.type_ids.is_empty());
}

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        key: u8,
        priority: usize,
        namespace: u8,
        task_type: u8,
        attempt: u32,
        queued_back: i64,
    },
    Remove(u8),
    Next,
    Preempt,
    Finish {
        pick: usize,
        outcome: Outcome,
    },
    MarkRunning {
        key: u8,
        namespace: u8,
        task_type: u8,
    },
    Advance(i64),
    Limits {
        concurrency: u32,
        type_limit: u32,
        retry_rate: u32,
        key_limit: Option<u32>,
        key_rate: Option<u32>,
        fair: bool,
        preempt: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..40, 0usize..4, 0u8..2, 0u8..4, 1u32..4, 0i64..200).prop_map(
            |(key, priority, namespace, task_type, attempt, queued_back)| Op::Upsert {
                key,
                priority,
                namespace,
                task_type,
                attempt,
                queued_back,
            }
        ),
        1 => (0u8..40).prop_map(Op::Remove),
        5 => Just(Op::Next),
        1 => Just(Op::Preempt),
        3 => (0usize..64, prop_oneof![
            Just(Outcome::Succeeded),
            Just(Outcome::Failed),
            Just(Outcome::Aborted)
        ])
            .prop_map(|(pick, outcome)| Op::Finish { pick, outcome }),
        1 => (0u8..40, 0u8..2, 0u8..4).prop_map(|(key, namespace, task_type)| {
            Op::MarkRunning { key, namespace, task_type }
        }),
        2 => (0i64..40).prop_map(Op::Advance),
        1 => (
            (0u32..8, 0u32..4, 0u32..240),
            (
                proptest::option::of(0u32..3),
                proptest::option::of(0u32..120),
                any::<bool>(),
                any::<bool>(),
            ),
        )
            .prop_map(
                |((concurrency, type_limit, retry_rate), (key_limit, key_rate, fair, preempt))| {
                    Op::Limits {
                        concurrency,
                        type_limit,
                        retry_rate,
                        key_limit,
                        key_rate,
                        fair,
                        preempt,
                    }
                }
            ),
    ]
}

fn type_name(task_type: u8) -> String {
    format!("type-{task_type}")
}

fn namespace_name(namespace: u8) -> String {
    format!("ns-{namespace}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Limits hold at every dispatch (type limits across the namespaces, key limits per namespace),
    /// the chosen task is the oldest dispatchable one of its bucket (of its namespace, when the
    /// queue is fair), `held_reason` agrees with `next`, and counts match a plain model.
    #[test]
    fn dispatch_respects_limits_and_reasons(ops in proptest::collection::vec(op(), 1..300)) {
        let mut config = QueueConfig {
            concurrency: 4,
            retry_rate_per_minute: 30,
            circuit_breaker: BreakerConfig {
                window_size: 4,
                min_requests: 2,
                ..BreakerConfig::default()
            },
            ..QueueConfig::default()
        };
        config.type_concurrency.insert(type_name(0), 1);
        config.type_concurrency.insert(type_name(1), 2);
        let mut dispatcher: Dispatcher<u8> = Dispatcher::new(config.clone());
        let mut now = t(1000);
        let mut pending: HashMap<u8, PendingTask> = HashMap::new();
        // Running tasks: their type and namespace.
        let mut running: BTreeMap<u8, (String, String)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Upsert { key, priority, namespace, task_type, attempt, queued_back } => {
                    let pending_task = in_namespace(
                        &namespace_name(namespace),
                        Priority::ALL[priority],
                        &type_name(task_type),
                        now - SignedDuration::from_secs(queued_back),
                        attempt,
                    );
                    running.remove(&key);
                    pending.insert(key, pending_task.clone());
                    dispatcher.upsert(key, pending_task);
                }
                Op::Remove(key) => {
                    let known = pending.remove(&key).is_some() | running.remove(&key).is_some();
                    prop_assert_eq!(dispatcher.remove(&key), known);
                }
                Op::MarkRunning { key, namespace, task_type } => {
                    pending.remove(&key);
                    running.insert(key, (type_name(task_type), namespace_name(namespace)));
                    dispatcher.mark_running(key, &namespace_name(namespace), holder(&type_name(task_type)));
                }
                Op::Finish { pick, outcome } => {
                    if let Some(key) = running.keys().nth(pick % running.len().max(1)).copied() {
                        running.remove(&key);
                        prop_assert!(dispatcher.finished(&key, outcome, now));
                    }
                }
                Op::Advance(secs) => now += SignedDuration::from_secs(secs),
                Op::Preempt => {
                    let in_flight = running.keys().any(|key| dispatcher.is_preempted(key));
                    if let Some(victim) = dispatcher.preempt(now) {
                        prop_assert!(config.preemption.is_some());
                        prop_assert!(!in_flight, "a second preemption while one was in flight");
                        prop_assert!(running.contains_key(&victim), "{victim} is not running");
                        prop_assert!(dispatcher.is_preempted(&victim));
                        prop_assert!(running.len() >= config.concurrency as usize, "a slot was free");
                    }
                }
                Op::Limits { concurrency, type_limit, retry_rate, key_limit, key_rate, fair, preempt } => {
                    config.concurrency = concurrency;
                    config.type_concurrency.insert(type_name(2), type_limit);
                    config.retry_rate_per_minute = retry_rate;
                    config.key_concurrency = key_limit.map(|limit| KeyConcurrency {
                        limit: None,
                        overrides: [(namespace_name(1), limit)].into(),
                    });
                    config.fairness = fair.then(Fairness::default);
                    config.key_rate = key_rate.map(|per_minute| KeyRate { per_minute, burst: 2 });
                    config.preemption = preempt.then_some(Preemption {
                        after: SignedDuration::from_secs(5),
                        max_per_minute: 3,
                    });
                    dispatcher.set_config(config.clone(), now);
                }
                Op::Next => {
                    let waiting: Vec<u8> = pending
                        .keys()
                        .copied()
                        .filter(|key| dispatcher.held_reason(key, now).map(|(r, _)| r) == Some(HeldReason::Waiting))
                        .collect();
                    match dispatcher.next(now) {
                        Some(key) => {
                            prop_assert!(waiting.contains(&key), "{key} was not dispatchable");
                            let chosen = pending.remove(&key).expect("dispatched a pending task");
                            let ahead = waiting.iter().filter(|other| **other != key).filter(|other| {
                                let other_task = &pending[other];
                                other_task.priority == chosen.priority
                                    && (config.fairness.is_none() || other_task.namespace == chosen.namespace)
                                    && (other_task.queued_at, **other) < (chosen.queued_at, key)
                            });
                            prop_assert_eq!(ahead.count(), 0, "FIFO within the bucket");
                            running.insert(key, (chosen.task_type.clone(), chosen.namespace.clone()));
                            prop_assert!(running.len() <= config.concurrency as usize);
                            let of_type = running.values().filter(|(name, _)| *name == chosen.task_type).count();
                            if let Some(limit) = config.type_concurrency.get(&chosen.task_type) {
                                prop_assert!(of_type <= *limit as usize, "type limit exceeded");
                            }
                            if let Some(limit) = config.tenant_limit(&chosen.namespace) {
                                let of_namespace = running.values().filter(|(_, ns)| *ns == chosen.namespace).count();
                                prop_assert!(of_namespace <= limit as usize, "key limit exceeded");
                            }
                        }
                        None => prop_assert!(
                            waiting.is_empty(),
                            "nothing dispatched though {:?} were only waiting",
                            waiting
                        ),
                    }
                }
            }
            prop_assert_eq!(dispatcher.running_len(), running.len());
            prop_assert_eq!(dispatcher.pending_len(), pending.len());
            let stats = dispatcher.stats(now);
            for (priority, count) in stats.pending {
                prop_assert_eq!(count, pending.values().filter(|task| task.priority == priority).count());
            }
            for key in pending.keys() {
                prop_assert!(dispatcher.held_reason(key, now).is_some());
            }
            for key in running.keys() {
                prop_assert!(dispatcher.is_running(key));
            }
        }
    }
}
