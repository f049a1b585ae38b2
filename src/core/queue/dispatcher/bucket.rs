//! A priority bucket: its lanes (one FIFO per tenant and circuit, first attempts apart from
//! retries), the heads of those lanes grouped by tenant when the queue is fair, and what it counts
//! and measures of its dispatches.
//!
//! Fairness is stride scheduling: each group of lanes (one per tenant when `fair`, else a single
//! group holding every lane) has a pass; the bucket dispatches from the group of the lowest pass
//! whose lanes have an unblocked head, and that group's pass advances by `STRIDE / weight`. A group
//! that starts waiting joins at the bucket's virtual time (the pass last chosen), so a tenant that
//! was idle saves up no credit. Continuously waiting tenants of equal weight therefore differ by at
//! most one dispatch, and choosing costs O(log groups) plus one check per blocked head.

use std::collections::{BTreeSet, HashMap};

use jiff::Timestamp;

use super::circuits::CircuitId;
use super::tenants::TenantId;
use crate::core::queue::estimate::DispatchRate;

/// What one dispatch costs a group of weight 1; a group of weight w pays `STRIDE / w`.
const STRIDE: u64 = 1 << 24;

/// One FIFO inside a bucket: the tasks of one tenant and one (namespace, type) that are either first
/// attempts or retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Lane {
    pub(super) tenant: TenantId,
    pub(super) circuit: CircuitId,
    pub(super) retry: bool,
}

/// The heads of the lanes that share a pass: one tenant's, or all of them when not `fair`.
#[derive(Debug)]
pub(super) struct Group<K> {
    pub(super) heads: BTreeSet<(Timestamp, K, Lane)>,
    pub(super) pass: u64,
}

#[derive(Debug)]
pub(super) struct Bucket<K> {
    pub(super) lanes: HashMap<Lane, BTreeSet<(Timestamp, K)>>,
    /// The groups with a non-empty lane, by id (the tenant's when `fair`, else 0).
    pub(super) groups: HashMap<TenantId, Group<K>>,
    /// The groups by pass, lowest first: the order in which they are offered a dispatch.
    pub(super) order: BTreeSet<(u64, TenantId)>,
    /// Whether lanes are grouped by tenant (the queue has `fairness`).
    fair: bool,
    /// The pass of the group chosen last: where a group that starts waiting joins.
    virtual_time: u64,
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
            groups: HashMap::new(),
            order: BTreeSet::new(),
            fair: false,
            virtual_time: 0,
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

    /// The group `lane` belongs to: its tenant's when fair, else the one group.
    pub(super) fn group_of(&self, lane: Lane) -> TenantId {
        if self.fair { lane.tenant } else { 0 }
    }

    /// What a dispatch costs a group of `weight`: with one group (not fair), nothing to compare.
    pub(super) fn stride_of(&self, weight: u32) -> u64 {
        if self.fair {
            STRIDE / u64::from(weight.max(1))
        } else {
            STRIDE
        }
    }
}

impl<K: Clone + Ord> Bucket<K> {
    pub(super) fn insert(&mut self, lane: Lane, queued_at: Timestamp, key: K) {
        let fifo = self.lanes.entry(lane).or_default();
        let new_head = fifo
            .first()
            .is_none_or(|(head_at, head_key)| (queued_at, &key) < (*head_at, head_key));
        let old_head = if new_head {
            fifo.first().cloned()
        } else {
            None
        };
        if fifo.insert((queued_at, key.clone())) {
            self.len += 1;
        }
        // The new head goes in before the old one leaves, so that the group (and its pass) stays.
        if new_head {
            self.add_head(queued_at, key, lane);
            if let Some((head_at, head_key)) = old_head {
                self.remove_head(head_at, head_key, lane);
            }
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
            let next = fifo.first().cloned();
            if next.is_none() {
                self.lanes.remove(&lane);
            }
            if let Some((next_at, next_key)) = next {
                self.add_head(next_at, next_key, lane);
            }
            self.remove_head(queued_at, entry.1, lane);
        }
    }

    /// Charges a dispatch from `lane` to its group, of the tenant's `weight` (at least 1).
    pub(super) fn charge(&mut self, lane: Lane, weight: u32) {
        let id = self.group_of(lane);
        let stride = self.stride_of(weight);
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        self.order.remove(&(group.pass, id));
        let base = group.pass.max(self.virtual_time);
        self.virtual_time = base;
        group.pass = base + stride;
        self.order.insert((group.pass, id));
    }

    /// Groups the lanes by tenant (`fair`) or all together; passes start again from the virtual time.
    pub(super) fn set_fair(&mut self, fair: bool) {
        if self.fair == fair {
            return;
        }
        self.fair = fair;
        let heads: Vec<(Timestamp, K, Lane)> = self
            .groups
            .drain()
            .flat_map(|(_, group)| group.heads)
            .collect();
        self.order.clear();
        for (at, key, lane) in heads {
            self.add_head(at, key, lane);
        }
    }

    fn add_head(&mut self, queued_at: Timestamp, key: K, lane: Lane) {
        let id = self.group_of(lane);
        let Self {
            groups,
            order,
            virtual_time,
            ..
        } = self;
        let group = groups.entry(id).or_insert_with(|| {
            order.insert((*virtual_time, id));
            Group {
                heads: BTreeSet::new(),
                pass: *virtual_time,
            }
        });
        group.heads.insert((queued_at, key, lane));
    }

    fn remove_head(&mut self, queued_at: Timestamp, key: K, lane: Lane) {
        let id = self.group_of(lane);
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        group.heads.remove(&(queued_at, key, lane));
        if group.heads.is_empty() {
            self.order.remove(&(group.pass, id));
            self.groups.remove(&id);
        }
    }
}
