//! The adaptive concurrency of queues with `concurrencyPolicy: Adaptive`: the controller started
//! or stopped as the config in force says, fed each period, and its limit given to the dispatcher.

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::{Availability, QueueEntry, Registry};
use crate::core::queue::adaptive::{self, AdaptiveConcurrency, Bounds, Change, Observation};

impl QueueEntry {
    /// The bounds of the adaptive controller at `now`: the policy's min, the concurrency in force.
    fn adaptive_bounds(&self, now: Timestamp) -> Option<Bounds> {
        let config = self.dispatcher.config();
        let min = config.adaptive_min?;
        Some(Bounds {
            min,
            max: config.limits_at(now).concurrency,
        })
    }

    /// Starts, keeps or stops the adaptive controller as the config in force says, and gives the
    /// dispatcher its limit.
    pub(super) fn sync_adaptive(&mut self, now: Timestamp) {
        match self.adaptive_bounds(now) {
            Some(bounds) => {
                let start = self
                    .reported_effective
                    .take()
                    .unwrap_or(self.dispatcher.running_len() as u32);
                let adaptive = self
                    .adaptive
                    .get_or_insert_with(|| AdaptiveConcurrency::new(start, bounds));
                self.dispatcher.set_adaptive_limit(Some(adaptive.current()));
            }
            None => {
                self.adaptive = None;
                self.reported_effective = None;
                self.last_change = None;
                self.evented = None;
                self.dispatcher.set_adaptive_limit(None);
            }
        }
    }
}

impl Registry {
    /// Queues with `concurrencyPolicy: Adaptive` in force, by name.
    pub fn adaptive_queues(&self) -> BTreeSet<String> {
        self.queues
            .iter()
            .filter(|(_, e)| e.availability == Availability::Active && e.adaptive.is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// One period's look at an adaptive queue's pods (`seen`; its own counts are filled in here):
    /// the controller adjusts the queue's effective concurrency. Returns the change, if any, and
    /// whether it is large enough for an Event since the last one.
    pub fn adapt(
        &mut self,
        queue: &str,
        mut seen: Observation,
        now: Timestamp,
    ) -> Option<(Change, bool)> {
        let entry = self.queues.get_mut(queue)?;
        let bounds = entry.adaptive_bounds(now)?;
        seen.held = entry.dispatcher.running_len() as u32;
        seen.waiting = entry.dispatcher.pending_len() as u32;
        let adaptive = entry.adaptive.as_mut()?;
        let change = adaptive.observe(&seen, bounds);
        let current = adaptive.current();
        entry.dispatcher.set_adaptive_limit(Some(current));
        let change = change?;
        let evented = *entry.evented.get_or_insert(change.from);
        let event = adaptive::worth_an_event(evented, change.to);
        if event {
            entry.evented = Some(change.to);
        }
        entry.last_change = Some((now, change.clone()));
        Some((change, event))
    }
}
