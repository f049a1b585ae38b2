//! The tenants whose tasks wait in or hold slots of the queue (today: their namespaces): interned as
//! ids when first seen and released with their last task, so a tenant never seen again costs
//! nothing once it drains. Each has its fair-share weight, its `keyConcurrency` limit and its
//! `keyRate` token bucket.
//!
//! A released tenant's token bucket is kept a while (`RETIRED_BUCKETS`, least recently released
//! forgotten first): a tenant that submits one task at a time and drains between them would
//! otherwise come back to a full bucket each time and outrun its rate.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use jiff::Timestamp;

use super::Dispatcher;
use crate::core::queue::config::QueueConfig;
use crate::core::queue::token_bucket::TokenBucket;

/// Most token buckets of released tenants kept at once.
pub const RETIRED_BUCKETS: usize = 10_000;

/// Index into `Dispatcher::tenants`.
pub(super) type TenantId = usize;

#[derive(Debug)]
pub(super) struct TenantState {
    pub(super) name: String,
    pub(super) pending: usize,
    pub(super) running: u32,
    /// Its share of dispatches within a bucket, relative to the other tenants' (`fairness.weights`).
    pub(super) weight: u32,
    /// Most of its tasks dispatched and not yet finished at once (`keyConcurrency`).
    pub(super) limit: Option<u32>,
    /// Its dispatches (`keyRate`).
    pub(super) rate: Option<TokenBucket>,
    /// Its dispatches so far: the clock of its waiting tasks' `key_rank`s.
    pub(super) dispatched: u64,
}

impl TenantState {
    pub(super) fn at_limit(&self) -> bool {
        self.limit.is_some_and(|limit| self.running >= limit)
    }

    pub(super) fn out_of_tokens(&self, now: Timestamp) -> bool {
        self.rate
            .as_ref()
            .is_some_and(|bucket| !bucket.has_token(now))
    }
}

/// One tenant's tasks: dispatched and not finished, and waiting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyCount {
    pub key: String,
    pub running: usize,
    pub waiting: usize,
}

/// Tenant ids by name, the ids free for reuse, and the token buckets of released tenants.
#[derive(Debug, Default)]
pub(super) struct TenantIds {
    pub(super) by_name: HashMap<String, TenantId>,
    pub(super) free: Vec<TenantId>,
    /// Released tenants' buckets by name, with their release number.
    retired: HashMap<String, (u64, TokenBucket)>,
    /// Release numbers, oldest first, to forget the least recently released.
    retired_order: BTreeMap<u64, String>,
    releases: u64,
}

impl TenantIds {
    fn retire(&mut self, name: &str, bucket: TokenBucket) {
        self.releases += 1;
        self.retired
            .insert(name.to_string(), (self.releases, bucket));
        self.retired_order.insert(self.releases, name.to_string());
        while self.retired.len() > RETIRED_BUCKETS {
            let Some((_, oldest)) = self.retired_order.pop_first() else {
                break;
            };
            self.retired.remove(&oldest);
        }
    }

    fn take_retired(&mut self, name: &str) -> Option<TokenBucket> {
        let (release, bucket) = self.retired.remove(name)?;
        self.retired_order.remove(&release);
        Some(bucket)
    }

    #[cfg(test)]
    pub(super) fn retired_len(&self) -> usize {
        self.retired.len()
    }
}

/// A full bucket of `config`'s `keyRate`, if it has one.
fn new_bucket(config: &QueueConfig) -> Option<TokenBucket> {
    // Last refilled at the dawn of time: full whenever it is first asked.
    config
        .key_rate
        .map(|r| TokenBucket::with_burst(r.per_minute, r.burst, Timestamp::MIN))
}

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// The tenant of that name, created when new.
    pub(super) fn intern_tenant(&mut self, name: &str) -> TenantId {
        if let Some(id) = self.tenant_ids.by_name.get(name) {
            return *id;
        }
        let rate = match self.tenant_ids.take_retired(name) {
            Some(bucket) if self.config.key_rate.is_some() => Some(bucket),
            _ => new_bucket(&self.config),
        };
        let state = TenantState {
            name: name.to_string(),
            pending: 0,
            running: 0,
            weight: self.config.tenant_weight(name),
            limit: self.config.tenant_limit(name),
            rate,
            dispatched: 0,
        };
        let id = match self.tenant_ids.free.pop() {
            Some(id) => {
                self.tenants[id] = state;
                id
            }
            None => {
                self.tenants.push(state);
                self.tenants.len() - 1
            }
        };
        self.tenant_ids.by_name.insert(name.to_string(), id);
        id
    }

    /// The `top` tenants by running + waiting tasks (ties by name), and the others summed up
    /// (`key` empty). O(tenants), for the periodic report.
    pub fn key_counts(&self, top: usize) -> (Vec<KeyCount>, KeyCount) {
        let mut counts: Vec<KeyCount> = self
            .tenant_ids
            .by_name
            .values()
            .map(|id| {
                let state = &self.tenants[*id];
                KeyCount {
                    key: state.name.clone(),
                    running: state.running as usize,
                    waiting: state.pending,
                }
            })
            .collect();
        counts.sort_by(|a, b| {
            (b.running + b.waiting)
                .cmp(&(a.running + a.waiting))
                .then_with(|| a.key.cmp(&b.key))
        });
        let rest = counts.split_off(top.min(counts.len()));
        let other = rest
            .into_iter()
            .fold(KeyCount::default(), |sum, c| KeyCount {
                key: String::new(),
                running: sum.running + c.running,
                waiting: sum.waiting + c.waiting,
            });
        (counts, other)
    }

    /// Forgets a tenant with no pending or running task.
    pub(super) fn release_tenant_if_unused(&mut self, id: TenantId) {
        let state = &self.tenants[id];
        if state.pending > 0 || state.running > 0 {
            return;
        }
        let name = std::mem::take(&mut self.tenants[id].name);
        self.tenant_ids.by_name.remove(&name);
        self.tenant_ids.free.push(id);
        if let Some(bucket) = self.tenants[id].rate.take() {
            self.tenant_ids.retire(&name, bucket);
        }
    }

    /// Applies the weights and limits of `config` to the known tenants at `now`.
    pub(super) fn configure_tenants(&mut self, config: &QueueConfig, now: Timestamp) {
        for id in self.tenant_ids.by_name.values() {
            let state = &mut self.tenants[*id];
            state.weight = config.tenant_weight(&state.name);
            state.limit = config.tenant_limit(&state.name);
            state.rate = match (state.rate.take(), config.key_rate) {
                (Some(mut bucket), Some(rate)) => {
                    bucket.set_rate_and_burst(rate.per_minute, rate.burst, now);
                    Some(bucket)
                }
                (None, Some(_)) => new_bucket(config),
                (_, None) => None,
            };
        }
        if config.key_rate != self.config.key_rate {
            // Buckets of another rate: a tenant that comes back starts full at the new one.
            self.tenant_ids.retired.clear();
            self.tenant_ids.retired_order.clear();
        }
        let fair = config.fairness.is_some();
        for bucket in &mut self.buckets {
            bucket.set_fair(fair);
        }
    }
}
