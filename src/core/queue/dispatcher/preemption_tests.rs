//! Tests of preemption within a queue: the victim (lowest priority, latest dispatched, preemptible
//! only), the wait before it, one at a time, the rate, and the freed slot going to the task it was
//! freed for.

use jiff::SignedDuration;

use super::*;
use crate::core::queue::config::Preemption;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).expect("valid test timestamp")
}

fn task(priority: Priority, queued_at: Timestamp, preemptible: bool) -> PendingTask {
    PendingTask {
        priority,
        namespace: "ns".to_string(),
        key: None,
        task_type: "work".to_string(),
        queued_at,
        attempt: 1,
        preemptible,
    }
}

fn preempting(concurrency: u32, max_per_minute: u32) -> QueueConfig {
    QueueConfig {
        concurrency,
        preemption: Some(Preemption {
            after: SignedDuration::from_secs(10),
            max_per_minute,
        }),
        ..QueueConfig::default()
    }
}

/// A queue of `concurrency` 3 filled with Low tasks 1, 2, 3 dispatched at t(0), t(1), t(2), and
/// Low task 4 waiting.
fn full_of_low(config: QueueConfig) -> Dispatcher<u32> {
    let mut dispatcher = Dispatcher::new(config);
    for key in 1..=4u32 {
        dispatcher.upsert(key, task(Priority::Low, t(0), true));
    }
    for (key, at) in [(1, 0), (2, 1), (3, 2)] {
        assert_eq!(dispatcher.next(t(at)), Some(key));
    }
    dispatcher
}

#[test]
fn a_waiting_critical_task_stops_the_latest_low_attempt_and_takes_its_slot() {
    let mut dispatcher = full_of_low(preempting(3, 6));
    dispatcher.upsert(10, task(Priority::Critical, t(5), true));
    // It waits `afterSeconds` first.
    assert_eq!(dispatcher.preempt(t(14)), None);
    assert_eq!(dispatcher.preempt(t(15)), Some(3));
    assert!(dispatcher.is_preempted(&3));
    // One at a time: nothing more until that slot is free.
    dispatcher.upsert(11, task(Priority::Critical, t(5), true));
    assert_eq!(dispatcher.preempt(t(20)), None);
    // The victim's pod is gone: the slot goes to the task it was freed for, not to the Low task
    // that waited longer or to the round robin.
    dispatcher.finished(&3, Outcome::Aborted, t(21));
    assert!(!dispatcher.is_preempted(&3));
    assert_eq!(dispatcher.next(t(21)), Some(10));
    // The victim waits in the queue again as it was.
    dispatcher.upsert(3, task(Priority::Low, t(2), true));
    assert_eq!(dispatcher.pending_len(), 3);
    // The second Critical task gets the next victim: 2, dispatched after 1.
    assert_eq!(dispatcher.preempt(t(22)), Some(2));
}

#[test]
fn only_lower_priorities_and_preemptible_attempts_are_stopped() {
    // High waiting, the queue full of High and Critical: nothing lower to stop.
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(preempting(2, 6));
    dispatcher.upsert(1, task(Priority::Critical, t(0), true));
    dispatcher.upsert(2, task(Priority::High, t(0), true));
    assert!(dispatcher.next(t(0)).is_some() && dispatcher.next(t(0)).is_some());
    dispatcher.upsert(3, task(Priority::High, t(0), true));
    assert_eq!(dispatcher.preempt(t(100)), None);
    // A Normal task waiting long preempts nobody: only Critical and High do.
    let mut dispatcher = full_of_low(preempting(3, 6));
    dispatcher.upsert(10, task(Priority::Normal, t(0), true));
    assert_eq!(dispatcher.preempt(t(100)), None);
    // Attempts that opted out are never chosen.
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(preempting(2, 6));
    dispatcher.upsert(1, task(Priority::Low, t(0), false));
    dispatcher.upsert(2, task(Priority::Normal, t(0), true));
    assert!(dispatcher.next(t(0)).is_some() && dispatcher.next(t(0)).is_some());
    dispatcher.upsert(3, task(Priority::Critical, t(0), true));
    assert_eq!(dispatcher.preempt(t(100)), Some(2));
}

#[test]
fn no_preemption_with_a_free_slot_the_policy_off_or_the_rate_used_up() {
    let mut dispatcher = full_of_low(preempting(4, 6));
    dispatcher.upsert(10, task(Priority::Critical, t(0), true));
    assert_eq!(dispatcher.next(t(3)), Some(10), "a free slot: it just goes");
    assert_eq!(dispatcher.preempt(t(100)), None);

    let mut dispatcher = full_of_low(QueueConfig {
        concurrency: 3,
        ..QueueConfig::default()
    });
    dispatcher.upsert(10, task(Priority::Critical, t(0), true));
    assert_eq!(dispatcher.preempt(t(100)), None, "preemption: Never");

    let mut dispatcher = full_of_low(preempting(3, 1));
    dispatcher.upsert(10, task(Priority::Critical, t(0), true));
    dispatcher.upsert(11, task(Priority::Critical, t(0), true));
    assert_eq!(dispatcher.preempt(t(20)), Some(3));
    dispatcher.finished(&3, Outcome::Aborted, t(21));
    assert_eq!(dispatcher.next(t(21)), Some(10));
    // One a minute: the second waits until a minute after the first.
    assert_eq!(dispatcher.preempt(t(79)), None);
    assert_eq!(dispatcher.preempt(t(80)), Some(2));
}

#[test]
fn tasks_held_after_a_restart_can_be_victims() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(preempting(1, 6));
    dispatcher.mark_running(
        1,
        "ns",
        Holder {
            task_type: "work",
            key: None,
            priority: Priority::Low,
            preemptible: true,
            since: t(0),
        },
    );
    dispatcher.upsert(10, task(Priority::High, t(0), true));
    assert_eq!(dispatcher.preempt(t(10)), Some(1));
}
