//! The limits in force: the queue's spec, the `weight_schedule` window that may override its
//! concurrency, type limits and retry rate, and the adaptive policy's cap.

use std::hash::Hash;

use jiff::Timestamp;

use super::Dispatcher;
use crate::core::queue::config::QueueConfig;
use crate::core::queue::weights::window_in_force;

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// Applies an edited queue spec at once; pending and running tasks are kept.
    pub fn set_config(&mut self, config: QueueConfig, now: Timestamp) {
        for state in &mut self.circuits {
            state.breaker.reconfigure(now, &config.circuit_breaker);
        }
        self.configure_tenants(&config, now);
        self.config = config;
        self.apply_limits(window_in_force(&self.config.weight_schedule, now), now);
    }

    /// Applies the limits of the window in force at `now`, when the window changed.
    pub(super) fn apply_schedule(&mut self, now: Timestamp) {
        if self.config.weight_schedule.is_empty() && self.window.is_none() {
            return;
        }
        let window = window_in_force(&self.config.weight_schedule, now);
        if window != self.window {
            self.apply_limits(window, now);
        }
    }

    fn apply_limits(&mut self, window: Option<usize>, now: Timestamp) {
        self.window = window;
        self.retry_tokens
            .set_rate(self.config.retry_rate_in(window), now);
        for state in &mut self.types {
            state.limit = self.config.type_limit_in(window, &state.name);
        }
    }

    /// Caps the concurrency below the limit in force (`concurrencyPolicy: Adaptive`); `None` lifts it.
    pub fn set_adaptive_limit(&mut self, limit: Option<u32>) {
        self.adaptive_limit = limit;
    }

    /// The concurrency limit of the window in force (as last applied), or the queue's own.
    pub fn concurrency_in_force(&self) -> u32 {
        self.config.concurrency_in(self.window)
    }

    /// Most tasks dispatched at once right now: the limit in force, capped by the adaptive limit.
    pub fn effective_concurrency(&self) -> u32 {
        if self.config.stop_policy.holds() {
            return 0;
        }
        let limit = self.concurrency_in_force();
        self.adaptive_limit
            .map_or(limit, |adaptive| adaptive.min(limit))
    }

    /// The adaptive limit, if the policy set one.
    pub fn adaptive_limit(&self) -> Option<u32> {
        self.adaptive_limit
    }

    /// The `weight_schedule` window whose limits are applied (as of the last `next`).
    pub fn window(&self) -> Option<usize> {
        self.window
    }
}
