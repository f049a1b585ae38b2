//! Preemption within a queue (`preemption.withinQueue: LowerPriority`): when the queue is full and a
//! Critical or High task has waited `afterSeconds` with nothing else holding it, the running attempt
//! of the lowest priority below it (the latest dispatched of those) is chosen as the victim. The
//! caller stops that attempt through the fencing path; its slot frees once its pod is gone, and goes
//! to the urgent task's bucket (`reserved`: its next task, in the bucket's own order, not the round
//! robin's choice). One preemption at a time per queue, at most `maxPerMinute` in any minute; tasks
//! with `preemptible: false` are never chosen.

use std::hash::Hash;

use jiff::{SignedDuration, Timestamp};

use super::Dispatcher;
use super::bucket::Lane;
use crate::api::Priority;

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// The running task to stop at `now` so that a waiting urgent task can go, if any; counted as a
    /// preemption at once.
    pub fn preempt(&mut self, now: Timestamp) -> Option<K> {
        let policy = self.config.preemption?;
        if self.config.stop_policy.holds()
            || self.running.len() < self.effective_concurrency() as usize
            || !self.preempting.is_empty()
        {
            return None;
        }
        while self
            .preempted_at
            .front()
            .is_some_and(|at| now.duration_since(*at) >= SignedDuration::from_mins(1))
        {
            self.preempted_at.pop_front();
        }
        if self.preempted_at.len() >= policy.max_per_minute as usize {
            return None;
        }
        let retry_token = self.retry_tokens.has_token(now);
        let priority = [Priority::Critical, Priority::High]
            .into_iter()
            .find(|priority| {
                self.next_in(*priority, now, retry_token)
                    .is_some_and(|(queued_at, _, _)| now.duration_since(queued_at) >= policy.after)
            })?;
        let (_, _, victim) = self
            .victims
            .first()
            .filter(|(lowest, _, _)| lowest.0 > priority.index())?;
        let victim = victim.clone();
        self.preempting.insert(victim.clone());
        self.preempted_at.push_back(now);
        self.reserved = Some(priority);
        Some(victim)
    }

    /// Whether `key`'s running attempt was chosen to be stopped for a waiting task.
    pub fn is_preempted(&self, key: &K) -> bool {
        self.preempting.contains(key)
    }

    /// The next task of the reserved bucket, if one may go now: the slot a preemption freed is
    /// its. A bucket with nothing dispatchable left (its task canceled, or held by another limit)
    /// gives the reservation up.
    pub(super) fn take_reserved(
        &mut self,
        now: Timestamp,
    ) -> Option<(Priority, Timestamp, K, Lane)> {
        let priority = self.reserved.take()?;
        let retry_token = self.retry_tokens.has_token(now);
        let (queued_at, key, lane) = self.next_in(priority, now, retry_token)?;
        Some((priority, queued_at, key, lane))
    }
}
