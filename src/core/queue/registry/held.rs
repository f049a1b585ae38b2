//! What holds each waiting task: the reason, where it stands and when it should start, and the
//! words of its `Queued` condition.

use jiff::Timestamp;

use super::{Availability, Registry, TaskKey};
use crate::core::queue::dispatcher::HeldReason;
use crate::core::queue::estimate::{Estimate, NoEstimate};

/// A task held back and what holds it (in words: [`Registry::held_reason`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub key: TaskKey,
    pub reason: HeldReason,
    /// Its place in its bucket and estimated start.
    pub estimate: Option<Estimate>,
}

impl Registry {
    /// What holds the waiting task `key` at `now`, with where it stands in its bucket and its
    /// estimated start; `None` if it is not waiting for a slot.
    pub fn held_reason(&self, key: &TaskKey, now: Timestamp) -> Option<(HeldReason, String)> {
        self.held_detail(key, now, true)
            .map(|(reason, message, _)| (reason, message))
    }

    /// What holds `key`, its estimate and, if `say`, the message saying both (else empty).
    fn held_detail(
        &self,
        key: &TaskKey,
        now: Timestamp,
        say: bool,
    ) -> Option<(HeldReason, String, Option<Estimate>)> {
        let task = self.tasks.get(key).filter(|t| !t.place.is_holding())?;
        let entry = self.queues.get(&*task.queue)?;
        let q = &task.queue;
        let namespace = &key.0;
        let words = |say_it: &dyn Fn() -> String| if say { say_it() } else { String::new() };
        Some(match entry.availability {
            Availability::NotFound => (
                HeldReason::QueueNotFound,
                words(&|| format!("AxQueue {q} does not exist")),
                None,
            ),
            Availability::Invalid => (
                HeldReason::QueueInvalid,
                words(&|| format!("AxQueue {q} has no valid spec (see its InvalidSpec condition)")),
                None,
            ),
            Availability::Active if task.place.is_forbidden() => (
                HeldReason::QueueForbidden,
                if !say {
                    String::new()
                } else if self.namespaces.contains_key(namespace) {
                    format!(
                        "namespace {namespace} is not selected by the namespaceSelector of AxQueue {q}"
                    )
                } else {
                    format!(
                        "the labels of namespace {namespace} are not known yet; the namespaceSelector of AxQueue {q} admits it only once they match"
                    )
                },
                None,
            ),
            Availability::Active => {
                let dispatcher = &entry.dispatcher;
                let (reason, task_type) = dispatcher.held_reason(key, now)?;
                let tenant = dispatcher.tenant_of(key).unwrap_or(namespace);
                let whose = || match dispatcher.config().key.from() {
                    None => format!("namespace {tenant}"),
                    Some(from) => format!("key {tenant} ({from})"),
                };
                let stem = || match reason {
                    HeldReason::ConcurrencyLimit => {
                        format!("the concurrency of AxQueue {q} is in use")
                    }
                    HeldReason::AdaptiveLimit => format!(
                        "the adaptive concurrency of AxQueue {q} ({} of at most {}) is in use",
                        dispatcher.effective_concurrency(),
                        dispatcher.concurrency_in_force()
                    ),
                    HeldReason::TypeConcurrencyLimit => {
                        format!("the typeConcurrency of {task_type} in AxQueue {q} is in use")
                    }
                    HeldReason::KeyConcurrencyLimit => format!(
                        "the keyConcurrency of {} in AxQueue {q} ({}) is in use",
                        whose(),
                        dispatcher.config().tenant_limit(tenant).unwrap_or(0)
                    ),
                    HeldReason::KeyRateLimit => {
                        let rate = dispatcher.config().key_rate.unwrap_or_default();
                        format!(
                            "the keyRate of {} in AxQueue {q} ({}/min, burst {}) is used up",
                            whose(),
                            rate.per_minute,
                            rate.burst
                        )
                    }
                    HeldReason::RetryRateLimited => {
                        format!("the retryRatePerMinute of AxQueue {q} is used up")
                    }
                    HeldReason::CircuitOpen => format!(
                        "the circuit of type {task_type} for namespace {namespace} in AxQueue {q} is open"
                    ),
                    HeldReason::QueueHeld => format!(
                        "AxQueue {q} is held (stopPolicy {}): nothing is dispatched until it is None",
                        dispatcher.config().stop_policy.as_str()
                    ),
                    HeldReason::Waiting
                    | HeldReason::QueueNotFound
                    | HeldReason::QueueInvalid
                    | HeldReason::QueueForbidden => {
                        format!("waiting for its turn in AxQueue {q}")
                    }
                };
                let estimate = dispatcher.estimate(key, now).map(|e| match reason {
                    _ if dispatcher.effective_concurrency() == 0 => {
                        e.without_start(NoEstimate::Paused)
                    }
                    HeldReason::TypeConcurrencyLimit
                    | HeldReason::KeyConcurrencyLimit
                    | HeldReason::RetryRateLimited
                    | HeldReason::CircuitOpen => e.without_start(NoEstimate::HeldApart),
                    // The key's tokens come at a known pace: one for each of its tasks ahead.
                    HeldReason::KeyRateLimit => match dispatcher.key_rate_start(key, now) {
                        Some(at) => e.not_before(at),
                        None => e.without_start(NoEstimate::HeldApart),
                    },
                    _ => e,
                });
                let message = match &estimate {
                    _ if !say => String::new(),
                    Some(e) => format!("{}; {}", stem(), e.describe()),
                    None => stem(),
                };
                (reason, message, estimate)
            }
        })
    }

    /// Every task waiting for a slot and what holds it at `now`. Recomputes every waiting task's
    /// position first (one ordered pass per bucket): this is the periodic refresh.
    pub fn held(&mut self, now: Timestamp) -> Vec<Held> {
        self.held_where(now, |_, _, _| true)
    }

    /// [`Registry::held`], keeping only the tasks `keep` picks: a backlog of 100,000 is looked at
    /// without a word or a copy made for each.
    pub fn held_where(
        &mut self,
        now: Timestamp,
        mut keep: impl FnMut(&TaskKey, HeldReason, Option<&Estimate>) -> bool,
    ) -> Vec<Held> {
        for entry in self.queues.values_mut() {
            if entry.dispatcher.pending_len() > 0 {
                entry.dispatcher.refresh_positions();
            }
        }
        self.tasks
            .keys()
            .filter_map(|key| {
                let (reason, _, estimate) = self.held_detail(key, now, false)?;
                keep(key, reason, estimate.as_ref()).then(|| Held {
                    key: key.clone(),
                    reason,
                    estimate,
                })
            })
            .collect()
    }
}
