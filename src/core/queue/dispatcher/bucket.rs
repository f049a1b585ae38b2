//! A priority bucket: its lanes (one FIFO per circuit, first attempts apart from retries), the
//! heads of those lanes in one ordered set, and what it counts and measures of its dispatches.

use std::collections::{BTreeSet, HashMap};

use jiff::Timestamp;

use super::circuits::CircuitId;
use crate::core::queue::estimate::DispatchRate;

/// One FIFO inside a bucket: the tasks of one (namespace, type) that are either first attempts or
/// retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Lane {
    pub(super) circuit: CircuitId,
    pub(super) retry: bool,
}

#[derive(Debug)]
pub(super) struct Bucket<K> {
    pub(super) lanes: HashMap<Lane, BTreeSet<(Timestamp, K)>>,
    /// The first task of every non-empty lane.
    pub(super) heads: BTreeSet<(Timestamp, K, Lane)>,
    pub(super) len: usize,
    /// Dispatches from this bucket, in all: the clock of the pending tasks' ranks.
    pub(super) dispatched: u64,
    pub(super) rate: DispatchRate,
    /// Since when tasks have waited in it (as `next` saw it); `None` while empty or paused.
    pub(super) waiting_since: Option<Timestamp>,
    /// Whether, since it started waiting, a dispatch has had to wait (the queue at its limit, or
    /// its tasks held): until then its dispatches fill slots that were free and say nothing of the
    /// pace at which slots free up, so they are not measured.
    pub(super) paced: bool,
    /// Whether a paced dispatch has happened since: the interval before the first one is how long
    /// the quickest worker took from its grant (the pipeline's latency), not the pace, so
    /// measurement starts at it.
    pub(super) measuring: bool,
}

impl<K> Default for Bucket<K> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            heads: BTreeSet::new(),
            len: 0,
            dispatched: 0,
            rate: DispatchRate::default(),
            waiting_since: None,
            paced: false,
            measuring: false,
        }
    }
}

impl<K> Bucket<K> {
    /// When the interval still open began: the last dispatch or the start of the wait.
    pub(super) fn open_since(&self) -> Option<Timestamp> {
        let since = self.waiting_since?;
        Some(
            self.rate
                .last_dispatch()
                .map_or(since, |last| last.max(since)),
        )
    }
}

impl<K: Clone + Ord> Bucket<K> {
    pub(super) fn insert(&mut self, lane: Lane, queued_at: Timestamp, key: K) {
        let fifo = self.lanes.entry(lane).or_default();
        let new_head = fifo
            .first()
            .is_none_or(|(head_at, head_key)| (queued_at, &key) < (*head_at, head_key));
        if new_head {
            if let Some((head_at, head_key)) = fifo.first() {
                self.heads.remove(&(*head_at, head_key.clone(), lane));
            }
            self.heads.insert((queued_at, key.clone(), lane));
        }
        if fifo.insert((queued_at, key)) {
            self.len += 1;
        }
    }

    pub(super) fn remove(&mut self, lane: Lane, queued_at: Timestamp, key: &K) {
        let Some(fifo) = self.lanes.get_mut(&lane) else {
            return;
        };
        let entry = (queued_at, key.clone());
        let was_head = fifo.first() == Some(&entry);
        if !fifo.remove(&entry) {
            return;
        }
        self.len -= 1;
        if was_head {
            self.heads.remove(&(queued_at, entry.1, lane));
            match fifo.first() {
                Some((next_at, next_key)) => {
                    self.heads.insert((*next_at, next_key.clone(), lane));
                }
                None => {
                    self.lanes.remove(&lane);
                }
            }
        }
    }
}
