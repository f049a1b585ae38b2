//! Where each pending task stands in its bucket and when it is expected to start: the ranks and
//! their periodic refresh, and which dispatches count toward the measured pace.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
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

    /// Recomputes the rank of every pending task: one pass per bucket in dispatch order (by
    /// `queued_at`, then key, as the lanes hold them), O(n log lanes).
    pub fn refresh_positions(&mut self) {
        let Self {
            buckets, pending, ..
        } = self;
        for bucket in buckets.iter() {
            let mut lanes: Vec<_> = bucket.lanes.values().map(|fifo| fifo.iter()).collect();
            let mut heads = BinaryHeap::with_capacity(lanes.len());
            for (index, lane) in lanes.iter_mut().enumerate() {
                if let Some((at, key)) = lane.next() {
                    heads.push(Reverse((at, key, index)));
                }
            }
            let mut rank = bucket.dispatched;
            while let Some(Reverse((_, key, index))) = heads.pop() {
                rank += 1;
                if let Some(entry) = pending.get_mut(key) {
                    entry.rank = rank;
                }
                if let Some((at, key)) = lanes[index].next() {
                    heads.push(Reverse((at, key, index)));
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
