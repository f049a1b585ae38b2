//! Which pending task goes next: the first unblocked lane head of each bucket, an overdue bucket
//! first, else smooth weighted round robin between the buckets; and what holds a task that does
//! not go.

use std::hash::Hash;

use jiff::Timestamp;

use super::bucket::Lane;
use super::{Dispatcher, HeldReason};
use crate::api::Priority;
use crate::core::queue::weights::{Weights, effective_weights};

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// The key (tenant) the pending task `key` waits under.
    pub fn tenant_of(&self, key: &K) -> Option<&str> {
        let entry = self.pending.get(key)?;
        Some(self.tenants[entry.lane.tenant].name.as_str())
    }

    /// Why the pending task `key` is not dispatched at `now`; `None` if it is not pending.
    /// A task held for several reasons reports the one most specific to it, in the order
    /// circuit, type concurrency, key concurrency, key rate, retry rate, queue concurrency.
    /// The task's type is returned with the reason, for messages.
    pub fn held_reason(&self, key: &K, now: Timestamp) -> Option<(HeldReason, &str)> {
        let entry = self.pending.get(key)?;
        if self.config.stop_policy.holds() {
            let type_id = self.circuits[entry.lane.circuit].type_id;
            return Some((HeldReason::QueueHeld, self.types[type_id].name.as_str()));
        }
        let retry_token = self.retry_tokens.has_token(now);
        let in_force = self.concurrency_in_force();
        let reason = self.lane_blocked(entry.lane, now, retry_token).unwrap_or(
            if self.running.len() >= self.effective_concurrency() as usize {
                if self
                    .adaptive_limit
                    .is_some_and(|adaptive| adaptive < in_force)
                {
                    HeldReason::AdaptiveLimit
                } else {
                    HeldReason::ConcurrencyLimit
                }
            } else {
                HeldReason::Waiting
            },
        );
        let type_id = self.circuits[entry.lane.circuit].type_id;
        Some((reason, self.types[type_id].name.as_str()))
    }

    /// The bucket and task to dispatch at `now`, if any, ignoring queue concurrency.
    pub(super) fn choose(&mut self, now: Timestamp) -> Option<(Priority, Timestamp, K, Lane)> {
        let retry_token = self.retry_tokens.has_token(now);
        let candidates: [Option<(Timestamp, K, Lane)>; 4] =
            Priority::ALL.map(|priority| self.next_in(priority, now, retry_token));
        let Self {
            config,
            round_robin,
            ..
        } = self;

        let overdue = Priority::ALL
            .into_iter()
            .filter_map(|priority| {
                let (queued_at, _, _) = candidates[priority.index()].as_ref()?;
                let max_wait = config.max_wait.of(priority)?;
                (now.duration_since(*queued_at) > max_wait).then_some((*queued_at, priority))
            })
            .min();
        let chosen = match overdue {
            Some((_, priority)) => priority,
            None => {
                let weights = effective_weights(&config.weights, &config.weight_schedule, now);
                let eligible = Priority::ALL.map(|priority| {
                    candidates[priority.index()].is_some() && weights.of(priority) > 0
                });
                smooth_weighted_round_robin(round_robin, weights, eligible)?
            }
        };
        let (queued_at, key, lane) = candidates.into_iter().nth(chosen.index())??;
        Some((chosen, queued_at, key, lane))
    }
}

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// The task bucket `priority` would dispatch next at `now`, queue concurrency aside: the first
    /// unblocked head of the group of the lowest pass (one tenant's when fair).
    pub(super) fn next_in(
        &self,
        priority: Priority,
        now: Timestamp,
        retry_token: bool,
    ) -> Option<(Timestamp, K, Lane)> {
        let bucket = &self.buckets[priority.index()];
        bucket.order.iter().find_map(|(_, group)| {
            bucket.groups[group]
                .heads
                .iter()
                .find(|(_, _, lane)| self.lane_blocked(*lane, now, retry_token).is_none())
                .cloned()
        })
    }

    /// What holds the tasks of `lane` at `now`, queue concurrency aside.
    pub(super) fn lane_blocked(
        &self,
        lane: Lane,
        now: Timestamp,
        retry_token: bool,
    ) -> Option<HeldReason> {
        let circuit = &self.circuits[lane.circuit];
        let state = &self.types[circuit.type_id];
        if !circuit.breaker.allows(now) {
            Some(HeldReason::CircuitOpen)
        } else if state.limit.is_some_and(|limit| state.running >= limit) {
            Some(HeldReason::TypeConcurrencyLimit)
        } else if self.tenants[lane.tenant].at_limit() {
            Some(HeldReason::KeyConcurrencyLimit)
        } else if self.tenants[lane.tenant].out_of_tokens(now) {
            Some(HeldReason::KeyRateLimit)
        } else if lane.retry && !retry_token {
            Some(HeldReason::RetryRateLimited)
        } else {
            None
        }
    }
}

/// nginx's smooth weighted round robin: every eligible bucket gains its weight, the richest (ties to
/// the higher priority) is chosen and pays the total. Buckets sitting out start again from zero, so
/// an idle bucket does not save up credit for a burst later.
fn smooth_weighted_round_robin(
    current: &mut [i64; 4],
    weights: &Weights,
    eligible: [bool; 4],
) -> Option<Priority> {
    let mut total = 0i64;
    let mut chosen: Option<Priority> = None;
    for priority in Priority::ALL {
        let index = priority.index();
        if !eligible[index] {
            current[index] = 0;
            continue;
        }
        let weight = i64::from(weights.of(priority));
        current[index] += weight;
        total += weight;
        if chosen.is_none_or(|best| current[index] > current[best.index()]) {
            chosen = Some(priority);
        }
    }
    let chosen = chosen?;
    current[chosen.index()] -= total;
    Some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_is_smooth() {
        let mut current = [0; 4];
        let weights = Weights::default();
        let order: Vec<Priority> = (0..10)
            .map(|_| {
                smooth_weighted_round_robin(&mut current, &weights, [true; 4])
                    .expect("eligible buckets")
            })
            .collect();
        use Priority::*;
        assert_eq!(
            order,
            [
                Critical, High, Normal, Critical, High, Low, Critical, Normal, High, Critical
            ]
        );
    }
}
