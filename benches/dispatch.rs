//! Cost of one dispatch cycle of an AxQueue: `next()`, `finished()`, and the `upsert()` that puts the
//! task back so the number of pending tasks stays at 1k, 10k or 100k.
//!
//! Run: `cargo bench --bench dispatch`.

use std::hint::black_box;
use std::time::Duration;

use ax::api::Priority;
use ax::core::queue::config::Fairness;
use ax::core::queue::{Dispatcher, Outcome, PendingTask, QueueConfig};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jiff::{SignedDuration, Timestamp};

const TYPES: u64 = 50;

/// Task `key`, in one of `namespaces` namespaces.
fn task_of(key: u64, namespaces: u64, queued_at: Timestamp) -> PendingTask {
    PendingTask {
        priority: Priority::ALL[(key % 4) as usize],
        namespace: format!("ns-{}", key % namespaces),
        key: None,
        task_type: format!("type-{}", key % TYPES),
        queued_at,
        // Every tenth task is a retry and takes a token.
        attempt: if key.is_multiple_of(10) { 2 } else { 1 },
        preemptible: true,
    }
}

fn filled(pending: u64, namespaces: u64, config: QueueConfig, start: Timestamp) -> Dispatcher<u64> {
    let mut dispatcher = Dispatcher::new(config);
    for key in 0..pending {
        dispatcher.upsert(key, task_of(key, namespaces, start));
    }
    dispatcher
}

fn cycle(dispatcher: &mut Dispatcher<u64>, namespaces: u64, now: &mut Timestamp) {
    *now += SignedDuration::from_micros(1);
    if let Some(key) = dispatcher.next(*now) {
        dispatcher.finished(&key, Outcome::Succeeded, *now);
        dispatcher.upsert(key, task_of(key, namespaces, *now));
    }
}

fn bench_dispatch(c: &mut Criterion) {
    let start: Timestamp = "2026-01-01T00:00:00Z".parse().expect("valid timestamp");
    let open = QueueConfig {
        concurrency: 1_000,
        retry_rate_per_minute: u32::MAX,
        ..QueueConfig::default()
    };
    // A fifth of the types may not run at all: their lane heads are skipped on every dispatch.
    let mut blocked = open.clone();
    for type_index in 0..TYPES / 5 {
        blocked
            .type_concurrency
            .insert(format!("type-{type_index}"), 0);
    }

    // Fair shares between 10,000 namespaces: the stride order keeps each dispatch O(log n).
    let fair = QueueConfig {
        fairness: Some(Fairness::default()),
        ..open.clone()
    };

    let mut group = c.benchmark_group("next_finished_upsert");
    for pending in [1_000u64, 10_000, 100_000] {
        for (name, config, namespaces) in [
            ("all_types_open", &open, 1),
            ("fifth_of_types_blocked", &blocked, 1),
            ("fair_10000_namespaces", &fair, 10_000),
        ] {
            let mut dispatcher = filled(pending, namespaces, config.clone(), start);
            let mut now = start;
            group.bench_with_input(BenchmarkId::new(name, pending), &pending, |b, _| {
                b.iter(|| cycle(black_box(&mut dispatcher), namespaces, &mut now));
            });
            assert_eq!(dispatcher.pending_len() as u64, pending);
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_dispatch
}
criterion_main!(benches);
