//! Where each pending task stands in its bucket and when it is expected to start: the ranks and
//! their periodic refresh, and which dispatches count toward the measured pace.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

use jiff::Timestamp;

use super::Dispatcher;
use crate::core::queue::estimate::{self, Estimate};

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// Where the pending task `key` stands in its bucket and when it is expected to start, from
    /// the bucket's measured rate; `None` if it is not pending. Says nothing about what holds it.
    pub fn estimate(&self, key: &K, now: Timestamp) -> Option<Estimate> {
        let entry = self.pending.get(key)?;
        let bucket = &self.buckets[entry.priority.index()];
        let waiting = bucket.len as u64;
        let position = entry
            .rank
            .saturating_sub(bucket.dispatched)
            .clamp(1, waiting.max(1));
        Some(estimate::estimate(
            entry.priority,
            position,
            waiting,
            &bucket.rate,
            bucket.open_since(),
            now,
        ))
    }

    /// When the pending task `key` has a token of its key's `keyRate` at the earliest: one token
    /// for each of its key's tasks ahead of it and itself. `None` without a key rate, or at rate 0.
    pub fn key_rate_start(&self, key: &K, now: Timestamp) -> Option<Timestamp> {
        let entry = self.pending.get(key)?;
        let tenant = &self.tenants[entry.lane.tenant];
        let place = entry.key_rank.saturating_sub(tenant.dispatched).max(1);
        tenant.rate.as_ref()?.nth_token_at(place, now)
    }

    /// Recomputes the rank of every pending task: one pass per bucket in dispatch order, blocks
    /// aside. Each group's lanes merge by (`queued_at`, key); the groups (tenants, when the queue is
    /// fair) take turns as the dispatcher's stride scheduling would. O(n log lanes). Each task's
    /// rank within its key follows the same order, the buckets taken from Critical down.
    pub fn refresh_positions(&mut self) {
        let Self {
            buckets,
            pending,
            tenants,
            ..
        } = self;
        let mut key_ranks: HashMap<usize, u64> = HashMap::new();
        for bucket in buckets.iter() {
            let mut groups: Vec<Merge<'_, K>> = Vec::new();
            let mut group_index = HashMap::new();
            for (lane, fifo) in &bucket.lanes {
                let group = bucket.group_of(*lane);
                let index = *group_index.entry(group).or_insert_with(|| {
                    groups.push(Merge {
                        lanes: Vec::new(),
                        heads: BinaryHeap::new(),
                        stride: bucket.stride_of(tenants[lane.tenant].weight),
                    });
                    groups.len() - 1
                });
                let merge = &mut groups[index];
                let mut lane_iter = fifo.iter();
                if let Some((at, key)) = lane_iter.next() {
                    merge.heads.push(Reverse((*at, key, merge.lanes.len())));
                }
                merge.lanes.push(lane_iter);
            }
            // Each group's turn comes at its pass, ties to the lower group id, as in `choose`.
            let mut turns: BinaryHeap<Reverse<(u64, usize, usize)>> = group_index
                .iter()
                .map(|(group, index)| {
                    let pass = bucket.groups.get(group).map_or(0, |g| g.pass);
                    Reverse((pass, *group, *index))
                })
                .collect();
            let mut rank = bucket.dispatched;
            while let Some(Reverse((pass, group, index))) = turns.pop() {
                let merge = &mut groups[index];
                let Some(Reverse((_, key, lane))) = merge.heads.pop() else {
                    continue;
                };
                rank += 1;
                if let Some(entry) = pending.get_mut(key) {
                    entry.rank = rank;
                    let tenant = entry.lane.tenant;
                    let key_rank = key_ranks
                        .entry(tenant)
                        .or_insert(tenants[tenant].dispatched);
                    *key_rank += 1;
                    entry.key_rank = *key_rank;
                }
                if let Some((at, key)) = merge.lanes[lane].next() {
                    merge.heads.push(Reverse((*at, key, lane)));
                }
                if !merge.heads.is_empty() {
                    turns.push(Reverse((pass + merge.stride, group, index)));
                }
            }
        }
    }

    /// A dispatch had to wait: from now on the waiting buckets' dispatches follow the pace at which
    /// slots free up (or their tasks are let go), and are measured.
    pub(super) fn mark_waiting_buckets_paced(&mut self) {
        for bucket in &mut self.buckets {
            if bucket.waiting_since.is_some() {
                bucket.paced = true;
            }
        }
    }
}

/// One group's lanes, merged by (`queued_at`, key), and what one of its dispatches costs.
struct Merge<'a, K> {
    lanes: Vec<std::collections::btree_set::Iter<'a, (Timestamp, K)>>,
    heads: BinaryHeap<Reverse<(Timestamp, &'a K, usize)>>,
    stride: u64,
}
