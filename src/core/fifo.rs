//! First-in-first-out dispatch with one global concurrency limit: the stand-in for the AxQueue
//! dispatcher (priority buckets, fairness, breakers), behind the same operations.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;

use jiff::Timestamp;

#[derive(Debug)]
pub struct FifoQueue<K> {
    /// Ordered by the time each task became eligible, then by key for a stable order.
    pending: BTreeSet<(Timestamp, K)>,
    queued_at: HashMap<K, Timestamp>,
    running: HashSet<K>,
    concurrency: usize,
}

impl<K: Clone + Eq + Hash + Ord> FifoQueue<K> {
    pub fn new(concurrency: usize) -> Self {
        FifoQueue {
            pending: BTreeSet::new(),
            queued_at: HashMap::new(),
            running: HashSet::new(),
            concurrency,
        }
    }

    /// Queues `key` (again) as eligible since `queued_at`; it no longer holds a running slot.
    pub fn upsert(&mut self, key: K, queued_at: Timestamp) {
        self.running.remove(&key);
        if let Some(old) = self.queued_at.insert(key.clone(), queued_at) {
            self.pending.remove(&(old, key.clone()));
        }
        self.pending.insert((queued_at, key));
    }

    /// Forgets `key` entirely: it is terminal, waiting for backoff, or gone.
    pub fn finished(&mut self, key: &K) {
        self.running.remove(key);
        if let Some(old) = self.queued_at.remove(key) {
            self.pending.remove(&(old, key.clone()));
        }
    }

    /// `key` has an attempt in flight (e.g. seen again after a restart): it holds a slot.
    pub fn mark_running(&mut self, key: K) {
        if let Some(old) = self.queued_at.remove(&key) {
            self.pending.remove(&(old, key.clone()));
        }
        self.running.insert(key);
    }

    /// The oldest pending task, if a slot is free; it now holds that slot.
    pub fn take_next(&mut self) -> Option<K> {
        if self.running.len() >= self.concurrency {
            return None;
        }
        let (_, key) = self.pending.pop_first()?;
        self.queued_at.remove(&key);
        self.running.insert(key.clone());
        Some(key)
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn running(&self) -> impl Iterator<Item = &K> {
        self.running.iter()
    }

    pub fn running_count(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn dispatches_oldest_first_up_to_the_limit() {
        let mut q = FifoQueue::new(2);
        q.upsert("b", t(2));
        q.upsert("a", t(1));
        q.upsert("c", t(3));
        assert_eq!(q.take_next(), Some("a"));
        assert_eq!(q.take_next(), Some("b"));
        assert_eq!(q.take_next(), None, "limit reached");
        q.finished(&"a");
        assert_eq!(q.take_next(), Some("c"));
    }

    #[test]
    fn requeue_moves_a_task_and_frees_its_slot() {
        let mut q = FifoQueue::new(1);
        q.upsert("a", t(1));
        assert_eq!(q.take_next(), Some("a"));
        q.upsert("a", t(5));
        q.upsert("b", t(2));
        assert_eq!(q.take_next(), Some("b"));
    }

    proptest! {
        #[test]
        fn never_exceeds_the_limit(ops in proptest::collection::vec((0u8..4, 0u8..8, 0i64..100), 0..200),
                                   limit in 1usize..5) {
            let mut q = FifoQueue::new(limit);
            for (op, key, time) in ops {
                match op {
                    0 => q.upsert(key, t(time)),
                    1 => q.finished(&key),
                    2 => q.mark_running(key),
                    _ => {
                        // mark_running may exceed the limit (repair after a restart); next() never does.
                        let before = q.running_count();
                        if q.take_next().is_some() {
                            prop_assert!(before < limit);
                            prop_assert_eq!(q.running_count(), before + 1);
                        }
                    }
                }
                prop_assert_eq!(q.pending.len(), q.queued_at.len());
                for (_, k) in &q.pending {
                    prop_assert!(!q.running.contains(k));
                }
            }
        }

        #[test]
        fn next_respects_the_limit(keys in proptest::collection::vec(0u16..1000, 0..100), limit in 1usize..10) {
            let mut q = FifoQueue::new(limit);
            for (i, k) in keys.iter().enumerate() {
                q.upsert(*k, t(i as i64));
            }
            let mut taken = 0;
            while q.take_next().is_some() {
                taken += 1;
            }
            let distinct: HashSet<_> = keys.iter().collect();
            prop_assert_eq!(taken, distinct.len().min(limit));
        }
    }
}
