//! Tests of fair shares between tenants (namespaces), `keyConcurrency` and `keyRate`: equal and
//! weighted shares, a late tenant not waiting behind an early backlog, limits and rates per key that
//! hold up only their key, tenants forgotten once drained, and a property test of shares.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::core::queue::config::{Fairness, KeyConcurrency, KeyRate};

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).expect("valid test timestamp")
}

fn task(namespace: &str, queued_at: Timestamp) -> PendingTask {
    PendingTask {
        priority: Priority::Normal,
        namespace: namespace.to_string(),
        key: None,
        task_type: "work".to_string(),
        queued_at,
        attempt: 1,
        preemptible: true,
    }
}

fn fair(weights: &[(&str, u32)]) -> QueueConfig {
    QueueConfig {
        concurrency: u32::MAX,
        fairness: Some(Fairness {
            weights: weights.iter().map(|(k, w)| (k.to_string(), *w)).collect(),
        }),
        ..QueueConfig::default()
    }
}

/// Submits `counts` tasks per namespace, the first namespace's all before the others' (keys
/// `namespace index * 10_000 + n`), then dispatches (finishing each at once) while every namespace
/// still waits; returns the dispatches per namespace index.
fn shares(config: QueueConfig, counts: &[u32]) -> Vec<u32> {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(config);
    for (index, count) in counts.iter().enumerate() {
        for n in 0..*count {
            let key = index as u32 * 10_000 + n;
            let queued = t(i64::from(key));
            dispatcher.upsert(key, task(&format!("ns-{index}"), queued));
        }
    }
    let mut got = vec![0u32; counts.len()];
    while got.iter().zip(counts).all(|(g, c)| g < c) {
        let key = dispatcher.next(t(100_000)).expect("tasks wait");
        dispatcher.finished(&key, Outcome::Succeeded, t(100_000));
        got[(key / 10_000) as usize] += 1;
    }
    got
}

#[test]
fn backlogged_namespaces_share_dispatches_equally_whoever_came_first() {
    // a queued 300 before b and c queued 30 each: still one in three each while all three wait.
    let got = shares(fair(&[]), &[300, 30, 30]);
    let (max, min) = (got.iter().max().unwrap(), got.iter().min().unwrap());
    assert!(max - min <= 1 && *min >= 29, "{got:?}");
}

#[test]
fn without_fairness_the_oldest_goes_first_whoever_it_belongs_to() {
    let config = QueueConfig {
        concurrency: u32::MAX,
        ..QueueConfig::default()
    };
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(config);
    for n in 0..5 {
        dispatcher.upsert(n, task("a", t(i64::from(n))));
        dispatcher.upsert(100 + n, task("b", t(100 + i64::from(n))));
    }
    let order: Vec<u32> = std::iter::from_fn(|| dispatcher.next(t(1000))).collect();
    assert_eq!(order, [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]);
}

#[test]
fn a_weight_of_two_gets_twice_the_share() {
    let got = shares(fair(&[("ns-0", 2)]), &[300, 300, 300]);
    let total: u32 = got.iter().sum();
    // Half for ns-0, a quarter each for the others, within one dispatch.
    assert!(got[0].abs_diff(total / 2) <= 1, "{got:?}");
    assert!(got[1].abs_diff(got[2]) <= 1, "{got:?}");
}

#[test]
fn a_namespace_that_starts_waiting_late_saves_up_no_credit() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(fair(&[]));
    for n in 0..100 {
        dispatcher.upsert(n, task("a", t(i64::from(n))));
    }
    // a alone for 50 dispatches, then b arrives with 50 tasks: they alternate, b does not get 50
    // in a row to catch up.
    for _ in 0..50 {
        let key = dispatcher.next(t(1000)).expect("a waits");
        dispatcher.finished(&key, Outcome::Succeeded, t(1000));
    }
    for n in 0..50 {
        dispatcher.upsert(1000 + n, task("b", t(2000 + i64::from(n))));
    }
    let next: Vec<bool> = (0..10)
        .map(|_| dispatcher.next(t(3000)).expect("both wait") >= 1000)
        .collect();
    assert_eq!(next.iter().filter(|b| **b).count(), 5, "{next:?}");
}

#[test]
fn key_concurrency_holds_only_its_namespace() {
    let config = QueueConfig {
        concurrency: 10,
        key_concurrency: Some(KeyConcurrency {
            limit: Some(5),
            overrides: BTreeMap::from([("x".to_string(), 2)]),
        }),
        ..QueueConfig::default()
    };
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(config);
    // x's tasks are all older than y's.
    for n in 0..20 {
        dispatcher.upsert(n, task("x", t(i64::from(n))));
        dispatcher.upsert(100 + n, task("y", t(100 + i64::from(n))));
    }
    let dispatched: Vec<u32> = std::iter::from_fn(|| dispatcher.next(t(1000))).collect();
    let of_x = dispatched.iter().filter(|k| **k < 100).count();
    let of_y = dispatched.len() - of_x;
    assert_eq!((of_x, of_y), (2, 5), "{dispatched:?}");
    assert_eq!(
        dispatcher.held_reason(&2, t(1000)).map(|(r, _)| r),
        Some(HeldReason::KeyConcurrencyLimit)
    );
    // One of x's finishes: the next x goes, though the queue has room for more of y but not y's.
    dispatcher.finished(&0, Outcome::Succeeded, t(1000));
    assert_eq!(dispatcher.next(t(1000)), Some(2));
    assert_eq!(dispatcher.next(t(1000)), None);
}

#[test]
fn tenants_are_forgotten_once_drained_and_ids_reused() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(fair(&[]));
    for round in 0..50u32 {
        for n in 0..4 {
            dispatcher.upsert(round * 10 + n, task(&format!("ns-{round}-{n}"), t(0)));
        }
        while let Some(key) = dispatcher.next(t(1)) {
            dispatcher.finished(&key, Outcome::Succeeded, t(1));
        }
    }
    assert!(dispatcher.tenant_ids.by_name.is_empty());
    assert!(
        dispatcher.tenants.len() <= 4,
        "{}",
        dispatcher.tenants.len()
    );
    assert!(
        dispatcher
            .buckets
            .iter()
            .all(|b| b.groups.is_empty() && b.order.is_empty())
    );
}

#[test]
fn turning_fairness_on_and_off_keeps_every_task() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(QueueConfig {
        concurrency: u32::MAX,
        ..QueueConfig::default()
    });
    for n in 0..30 {
        dispatcher.upsert(n, task(&format!("ns-{}", n % 3), t(i64::from(n))));
    }
    dispatcher.set_config(fair(&[]), t(0));
    let first: Vec<u32> = (0..10).filter_map(|_| dispatcher.next(t(100))).collect();
    dispatcher.set_config(
        QueueConfig {
            concurrency: u32::MAX,
            ..QueueConfig::default()
        },
        t(0),
    );
    let rest: Vec<u32> = std::iter::from_fn(|| dispatcher.next(t(100))).collect();
    assert_eq!(first.len() + rest.len(), 30);
    assert_eq!(dispatcher.pending_len(), 0);
}

#[test]
fn positions_follow_the_turns_of_a_fair_queue() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(fair(&[]));
    for n in 0..10 {
        dispatcher.upsert(n, task("a", t(i64::from(n))));
    }
    dispatcher.upsert(100, task("b", t(100)));
    dispatcher.upsert(101, task("b", t(101)));
    dispatcher.refresh_positions();
    let position = |d: &Dispatcher<u32>, key| d.estimate(&key, t(200)).expect("pending").position;
    // Turns: a0 b0 a1 b1 a2 … a9 (or b first): b's tasks are 2nd and 4th at the latest, not 11th.
    assert!(position(&dispatcher, 100) <= 2);
    assert!(position(&dispatcher, 101) <= 4);
    assert_eq!(position(&dispatcher, 9), 12);
    // And they hold: the order they promise is the order of the dispatches.
    let promised: Vec<u64> = [0, 100, 1, 101]
        .iter()
        .map(|k| position(&dispatcher, *k))
        .collect();
    let mut order: Vec<u32> = Vec::new();
    while let Some(key) = dispatcher.next(t(200)) {
        order.push(key);
    }
    for (key, at) in [0u32, 100, 1, 101].iter().zip(promised) {
        assert_eq!(order[at as usize - 1], *key, "{order:?}");
    }
}

fn rated(per_minute: u32, burst: u32) -> QueueConfig {
    QueueConfig {
        concurrency: u32::MAX,
        key_rate: Some(KeyRate { per_minute, burst }),
        ..QueueConfig::default()
    }
}

fn millis(ms: i64) -> Timestamp {
    t(0) + jiff::SignedDuration::from_millis(ms)
}

#[test]
fn key_rate_spaces_each_namespaces_dispatches_on_its_own() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(rated(60, 1));
    for n in 0..5 {
        dispatcher.upsert(n, task("x", t(i64::from(n))));
        dispatcher.upsert(100 + n, task("y", t(i64::from(n))));
    }
    // One each at once (burst 1), then one each per second.
    let at =
        |d: &mut Dispatcher<u32>, ms| std::iter::from_fn(|| d.next(millis(ms))).collect::<Vec<_>>();
    assert_eq!(at(&mut dispatcher, 0), [0, 100]);
    assert_eq!(
        dispatcher.held_reason(&1, millis(0)).map(|(r, _)| r),
        Some(HeldReason::KeyRateLimit)
    );
    assert_eq!(at(&mut dispatcher, 999), Vec::<u32>::new());
    assert_eq!(at(&mut dispatcher, 1000), [1, 101]);
}

#[test]
fn a_key_rate_says_when_each_of_its_waiting_tasks_gets_a_token() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(rated(60, 1));
    for n in 0..4 {
        dispatcher.upsert(n, task("x", t(i64::from(n))));
    }
    dispatcher.upsert(10, task("y", t(10)));
    assert_eq!(dispatcher.next(millis(0)), Some(0));
    // x's next three wait one second each for a token, as they arrived; y's has one now.
    let starts = |d: &Dispatcher<u32>, now| -> Vec<Option<Timestamp>> {
        (1..4).map(|n| d.key_rate_start(&n, now)).collect()
    };
    let expected = vec![Some(millis(1000)), Some(millis(2000)), Some(millis(3000))];
    assert_eq!(
        starts(&dispatcher, millis(0)),
        expected,
        "from the ranks at upsert"
    );
    dispatcher.refresh_positions();
    assert_eq!(
        starts(&dispatcher, millis(0)),
        expected,
        "and after a refresh"
    );
    assert_eq!(dispatcher.key_rate_start(&10, millis(0)), Some(millis(0)));
    // A dispatch moves every later one up, without a refresh.
    assert_eq!(dispatcher.next(millis(1000)), Some(1));
    assert_eq!(dispatcher.next(millis(1000)), Some(10));
    assert_eq!(
        dispatcher.key_rate_start(&2, millis(1000)),
        Some(millis(2000))
    );
    assert_eq!(
        dispatcher.key_rate_start(&3, millis(1000)),
        Some(millis(3000))
    );
    // No keyRate, no such bound.
    let mut free: Dispatcher<u32> = Dispatcher::new(fair(&[]));
    free.upsert(0, task("x", t(0)));
    assert_eq!(free.key_rate_start(&0, millis(0)), None);
}

#[test]
fn a_namespace_that_drains_between_tasks_keeps_its_rate() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(rated(60, 1));
    dispatcher.upsert(0, task("x", t(0)));
    assert_eq!(dispatcher.next(millis(0)), Some(0));
    dispatcher.finished(&0, Outcome::Succeeded, millis(100));
    // x has nothing left: released. Its next task still waits for the rate.
    assert!(dispatcher.tenant_ids.by_name.is_empty());
    dispatcher.upsert(1, task("x", t(0)));
    assert_eq!(dispatcher.next(millis(200)), None);
    assert_eq!(dispatcher.next(millis(1000)), Some(1));
}

#[test]
fn released_buckets_are_kept_within_their_cap() {
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(rated(60, 1));
    let total = tenants::RETIRED_BUCKETS as u32 + 500;
    for n in 0..total {
        dispatcher.upsert(n, task(&format!("ns-{n}"), t(0)));
        assert_eq!(dispatcher.next(t(0)), Some(n));
        dispatcher.finished(&n, Outcome::Succeeded, t(0));
    }
    assert_eq!(
        dispatcher.tenant_ids.retired_len(),
        tenants::RETIRED_BUCKETS
    );
    // The most recently released still wait for their rate; the oldest were forgotten (full again).
    dispatcher.upsert(total, task(&format!("ns-{}", total - 1), t(0)));
    assert_eq!(dispatcher.next(t(0)), None);
    dispatcher.upsert(total + 1, task("ns-0", t(0)));
    assert_eq!(dispatcher.next(t(0)), Some(total + 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For any arrival times, namespaces and weights, while every namespace still waits: two
    /// namespaces' dispatches, each divided by its weight, differ by at most 1/w_i + 1/w_j (start-time
    /// fair queuing's bound), and with equal weights the counts differ by at most one.
    #[test]
    fn backlogged_namespaces_keep_their_weighted_shares(
        tasks in proptest::collection::vec((0usize..4, 0i64..1000), 40..400),
        weights in proptest::collection::vec(1u32..4, 4),
        equal in any::<bool>(),
    ) {
        let weights: Vec<u32> = if equal { vec![1; 4] } else { weights };
        let config = fair(&[
            ("ns-0", weights[0]), ("ns-1", weights[1]), ("ns-2", weights[2]), ("ns-3", weights[3]),
        ]);
        let mut dispatcher: Dispatcher<u32> = Dispatcher::new(config);
        let mut left: HashMap<usize, u32> = HashMap::new();
        let mut namespace_of = HashMap::new();
        for (key, (namespace, queued)) in tasks.iter().enumerate() {
            let key = key as u32;
            dispatcher.upsert(key, task(&format!("ns-{namespace}"), t(*queued)));
            namespace_of.insert(key, *namespace);
            *left.entry(*namespace).or_default() += 1;
        }
        let present: Vec<usize> = left.keys().copied().collect();
        let mut got = [0u32; 4];
        while present.iter().all(|ns| left[ns] > 0) {
            let key = dispatcher.next(t(2000)).expect("tasks wait");
            dispatcher.finished(&key, Outcome::Succeeded, t(2000));
            let ns = namespace_of[&key];
            *left.get_mut(&ns).unwrap() -= 1;
            got[ns] += 1;
            for i in &present {
                for j in &present {
                    let (wi, wj) = (f64::from(weights[*i]), f64::from(weights[*j]));
                    let gap = f64::from(got[*i]) / wi - f64::from(got[*j]) / wj;
                    prop_assert!(gap <= 1.0 / wi + 1.0 / wj + 1e-9,
                        "ns-{} {:?} ahead of ns-{} (weights {:?})", i, got, j, weights);
                    if equal {
                        prop_assert!(got[*i] <= got[*j] + 1, "{:?}", got);
                    }
                }
            }
        }
    }
}

#[test]
fn keys_from_a_label_or_payload_share_within_one_namespace_and_across_namespaces() {
    // Customers x and y, x with a backlog, both from one namespace; y's tasks also come from a
    // second namespace and count as one key: x and y take turns, and y's limit covers both.
    let mut dispatcher: Dispatcher<u32> = Dispatcher::new(QueueConfig {
        key_concurrency: Some(KeyConcurrency {
            limit: None,
            overrides: BTreeMap::from([("y".to_string(), 1)]),
        }),
        ..fair(&[])
    });
    let keyed = |namespace: &str, key: &str, at: i64| PendingTask {
        key: Some(key.to_string()),
        ..task(namespace, t(at))
    };
    for n in 0..10 {
        dispatcher.upsert(n, keyed("shop", "x", i64::from(n)));
    }
    dispatcher.upsert(100, keyed("shop", "y", 100));
    dispatcher.upsert(200, keyed("billing", "y", 200));
    let first = dispatcher.next(t(1000)).expect("one goes");
    let second = dispatcher.next(t(1000)).expect("another goes");
    assert_eq!((first, second), (0, 100), "x, then y (its turn)");
    // y's keyConcurrency of 1 counts its tasks of both namespaces: the billing task waits.
    assert_eq!(
        dispatcher.held_reason(&200, t(1000)).map(|(r, _)| r),
        Some(HeldReason::KeyConcurrencyLimit)
    );
    assert_eq!(dispatcher.tenant_of(&200), Some("y"));
    assert_eq!(dispatcher.tenant_of(&5), Some("x"));
    // Taken out and offered again, a task keeps its key.
    let taken = dispatcher.take_pending(&200).expect("pending");
    assert_eq!(taken.key.as_deref(), Some("y"));
    assert_eq!(taken.namespace, "billing");
    // A running task's key comes from its holder.
    dispatcher.mark_running(
        300,
        "billing",
        Holder {
            task_type: "work",
            key: Some("z"),
            priority: Priority::Normal,
            preemptible: true,
            since: t(0),
        },
    );
    let (counts, _) = dispatcher.key_counts(10);
    assert!(
        counts.iter().any(|c| c.key == "z" && c.running == 1),
        "{counts:?}"
    );
}
