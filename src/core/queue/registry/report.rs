//! What each queue reports, to its `AxQueue.status` and the metrics: counts, limits in force,
//! the adaptive policy, the circuits not closed, and the totals across leaders.

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::{Availability, Registry};
use crate::api::Priority;
use crate::core::queue::adaptive::Change;
use crate::core::queue::config::LimitsInForce;
use crate::core::queue::dispatcher::{KeyCount, OpenCircuit};

/// What `AxQueue.status` and the metrics report about one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueReport {
    pub name: String,
    pub exists: bool,
    pub pending: [(Priority, usize); 4],
    pub running: usize,
    /// The concurrency limit in force (the spec's or the window's).
    pub concurrency: u32,
    /// Every limit in force, and the window that set them.
    pub limits: LimitsInForce,
    /// The window in force: index, `from`, `to`, time zone.
    pub window: Option<(usize, String, String, String)>,
    /// What the dispatcher applies: `concurrency`, or less under the adaptive policy.
    pub effective_concurrency: u32,
    /// Whether the adaptive policy is on.
    pub adaptive: bool,
    /// The adaptive policy's last change.
    pub last_change: Option<(Timestamp, Change)>,
    /// Task types with a circuit not closed (in some namespace), by name.
    pub open_circuits: Vec<String>,
    /// Each breaker not closed: namespace, type, state.
    pub circuits: Vec<OpenCircuit>,
    /// Tasks waiting because the queue's `namespaceSelector` does not select their namespace.
    pub forbidden: usize,
    pub dispatched: i64,
    pub dead: i64,
    pub retry_tokens: u32,
    pub invalid: Option<String>,
    pub generation: Option<i64>,
    /// For a queue with keys (`QueueConfig::has_keys`): its top `TOP_KEYS` tenants, and the
    /// others summed up; empty and zero otherwise.
    pub keys: Vec<KeyCount>,
    pub other_keys: KeyCount,
}

/// How many tenants a queue's status and metrics name; the others are summed up as `other`.
pub const TOP_KEYS: usize = 10;

impl Registry {
    /// What each queue the registry knows reports at `now`.
    pub fn reports(&self, now: Timestamp) -> Vec<QueueReport> {
        self.queues
            .iter()
            .map(|(name, entry)| {
                let stats = entry.dispatcher.stats(now);
                let (keys, other_keys) = if entry.dispatcher.config().has_keys() {
                    entry.dispatcher.key_counts(TOP_KEYS)
                } else {
                    (Vec::new(), KeyCount::default())
                };
                let exists = entry.availability != Availability::NotFound;
                let config = entry.dispatcher.config();
                let limits = config.limits_at(now);
                let window = limits.window.and_then(|index| {
                    let (from, to, zone) = config.weight_schedule.get(index)?.describe();
                    Some((index, from, to, zone.to_string()))
                });
                let effective_concurrency = entry
                    .dispatcher
                    .adaptive_limit()
                    .map_or(limits.concurrency, |a| a.min(limits.concurrency));
                // A deleted queue's breakers decide nothing until it comes back.
                let circuits = if exists {
                    stats.open_circuits
                } else {
                    Vec::new()
                };
                // Sorted by type: one entry per type.
                let mut open_circuits: Vec<String> =
                    circuits.iter().map(|c| c.task_type.clone()).collect();
                open_circuits.dedup();
                QueueReport {
                    name: name.clone(),
                    exists,
                    pending: stats.pending,
                    running: stats.running,
                    concurrency: limits.concurrency,
                    effective_concurrency,
                    window,
                    limits,
                    adaptive: entry.adaptive.is_some(),
                    last_change: entry.last_change.clone(),
                    open_circuits,
                    circuits,
                    forbidden: entry.forbidden,
                    dispatched: entry.dispatched_base.saturating_add(entry.dispatched),
                    dead: entry.dead_base.saturating_add(entry.dead),
                    retry_tokens: stats.retry_tokens,
                    invalid: entry.invalid.as_ref().map(|e| e.to_string()),
                    generation: entry.generation,
                    keys,
                    other_keys,
                }
            })
            .collect()
    }

    /// Records which circuits of `queue` were reported open; returns those that closed since.
    pub fn circuits_reported(&mut self, queue: &str, open: &[String]) -> Vec<String> {
        let Some(entry) = self.queues.get_mut(queue) else {
            return Vec::new();
        };
        let now_open: BTreeSet<String> = open.iter().cloned().collect();
        let closed = entry.reported_open.difference(&now_open).cloned().collect();
        entry.reported_open = now_open;
        self.forget_if_unused(queue);
        closed
    }
}
