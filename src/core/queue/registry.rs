//! Every AxQueue's dispatcher and where each task is: waiting for a slot, holding one (granted, in
//! flight, or its pod still stopping), or nowhere. Pure: the controller feeds it what the task
//! reconciler decided and asks it which task goes next.
//!
//! A task naming a queue that does not exist (yet) is kept in an inactive entry and never
//! dispatched; it says `QueueNotFound` until the AxQueue appears.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use jiff::Timestamp;
use kube::ResourceExt;

use super::adaptive::{self, AdaptiveConcurrency, Bounds, Change, Observation};
use super::breaker::BreakerState;
use super::config::{LimitsInForce, QueueConfig, QueueSpecError, queue_config};
use super::dispatcher::{Dispatcher, HeldReason, Outcome, PendingTask};
use super::estimate::{Estimate, NoEstimate};
use crate::api::{AxQueue, AxQueueSpec, AxTask, AxTaskSpec, AxTaskStatus, Priority};

/// Namespace and name of a task.
pub type TaskKey = (String, String);

/// Whether a queue's tasks may be dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Availability {
    /// The AxQueue exists and a valid spec of it is in force.
    Active,
    /// No AxQueue of that name (yet): tasks naming it wait.
    NotFound,
    /// The AxQueue exists but none of its specs so far was valid.
    Invalid,
}

#[derive(Debug)]
struct QueueEntry {
    dispatcher: Dispatcher<TaskKey>,
    availability: Availability,
    /// The spec last applied or rejected, to tell spec edits from status updates.
    seen_spec: Option<AxQueueSpec>,
    /// Why the current spec is not in force.
    invalid: Option<QueueSpecError>,
    generation: Option<i64>,
    /// Totals from before this process (read from the status when the queue was first seen),
    /// less what this process had counted by then.
    dispatched_base: i64,
    dead_base: i64,
    /// Attempts this process dispatched, and tasks it saw go Dead.
    dispatched: i64,
    dead: i64,
    /// Types reported in `ax_circuit_open` as open, to report them closed later.
    reported_open: BTreeSet<String>,
    /// `concurrencyPolicy: Adaptive`: the controller, its last change, and the value at its last
    /// Event.
    adaptive: Option<AdaptiveConcurrency>,
    last_change: Option<(Timestamp, Change)>,
    evented: Option<u32>,
    /// The effective concurrency an earlier leader reported, to start the controller from.
    reported_effective: Option<u32>,
}

impl QueueEntry {
    fn new() -> Self {
        Self {
            dispatcher: Dispatcher::new(QueueConfig::default()),
            availability: Availability::NotFound,
            seen_spec: None,
            invalid: None,
            generation: None,
            dispatched_base: 0,
            dead_base: 0,
            dispatched: 0,
            dead: 0,
            reported_open: BTreeSet::new(),
            adaptive: None,
            last_change: None,
            evented: None,
            reported_effective: None,
        }
    }

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
    fn sync_adaptive(&mut self, now: Timestamp) {
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

    fn is_idle(&self) -> bool {
        self.dispatcher.pending_len() == 0 && self.dispatcher.running_len() == 0
    }
}

#[derive(Debug, Clone)]
struct TaskEntry {
    queue: String,
    /// Holds a concurrency slot.
    holding: bool,
    /// The slot was granted by [`Registry::next`] and the dispatch is not written yet.
    granted: bool,
}

/// What `AxQueue.status` and the metrics report about one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueReport {
    pub name: String,
    pub exists: bool,
    pub pending: [(Priority, usize); 4],
    pub running: usize,
    /// The concurrency limit in force (the spec's or the window's).
    pub concurrency: u32,
    /// Every limit in force, and the window that set them.
    pub limits: LimitsInForce,
    /// The window in force: index, `from`, `to`, time zone.
    pub window: Option<(usize, String, String, String)>,
    /// What the dispatcher applies: `concurrency`, or less under the adaptive policy.
    pub effective_concurrency: u32,
    /// Whether the adaptive policy is on.
    pub adaptive: bool,
    /// The adaptive policy's last change.
    pub last_change: Option<(Timestamp, Change)>,
    pub open_circuits: Vec<String>,
    /// The state of each breaker in `open_circuits`.
    pub circuits: Vec<(String, BreakerState)>,
    pub dispatched: i64,
    pub dead: i64,
    pub retry_tokens: u32,
    pub invalid: Option<String>,
    pub generation: Option<i64>,
}

/// A task held back and what holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub key: TaskKey,
    pub reason: HeldReason,
    pub message: String,
    /// Its place in its bucket and estimated start (what the message says about them).
    pub estimate: Option<Estimate>,
}

/// Every queue's dispatcher and where each queued or dispatched task is.
#[derive(Debug, Default)]
pub struct Registry {
    queues: BTreeMap<String, QueueEntry>,
    tasks: HashMap<TaskKey, TaskEntry>,
    /// The queue `next` served last, so queues take turns.
    last_served: Option<String>,
}

impl Registry {
    /// Applies an AxQueue as seen by the watcher: its spec (when it changed) and, the first time the
    /// queue is seen, the totals in its status. Returns the spec's problem when it is newly invalid.
    pub fn configure(&mut self, queue: &AxQueue, now: Timestamp) -> Option<QueueSpecError> {
        let entry = self
            .queues
            .entry(queue.name_any())
            .or_insert_with(QueueEntry::new);
        entry.generation = queue.metadata.generation;
        if entry.availability == Availability::NotFound {
            let status = queue.status.clone().unwrap_or_default();
            entry.dispatched_base = status.dispatched.saturating_sub(entry.dispatched);
            entry.dead_base = status.dead.saturating_sub(entry.dead);
            entry.reported_effective = status
                .effective_concurrency
                .and_then(|e| u32::try_from(e).ok());
        } else if entry.seen_spec.as_ref() == Some(&queue.spec) {
            return None;
        }
        entry.seen_spec = Some(queue.spec.clone());
        match queue_config(&queue.spec) {
            Ok(config) => {
                entry.dispatcher.set_config(config, now);
                entry.availability = Availability::Active;
                entry.invalid = None;
                entry.sync_adaptive(now);
                None
            }
            Err(problem) => {
                if entry.availability == Availability::NotFound {
                    entry.availability = Availability::Invalid;
                }
                let new = entry.invalid.as_ref() != Some(&problem);
                entry.invalid = Some(problem.clone());
                new.then_some(problem)
            }
        }
    }

    /// The AxQueue is gone: its tasks stay, held with `QueueNotFound`, until it comes back.
    pub fn queue_deleted(&mut self, name: &str) {
        if let Some(entry) = self.queues.get_mut(name) {
            entry.availability = Availability::NotFound;
            entry.seen_spec = None;
            entry.invalid = None;
        }
        self.forget_if_unused(name);
    }

    /// Queues the registry treats as existing, by name.
    pub fn known_queues(&self) -> Vec<String> {
        self.queues
            .iter()
            .filter(|(_, entry)| entry.availability != Availability::NotFound)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// A task eligible for dispatch waits for a slot (a slot it held is given back).
    pub fn upsert(&mut self, key: &TaskKey, queue: &str, task: PendingTask) {
        self.detach_if_moved(key, queue);
        self.entry(queue).dispatcher.upsert(key.clone(), task);
        self.tasks.insert(
            key.clone(),
            TaskEntry {
                queue: queue.to_string(),
                holding: false,
                granted: false,
            },
        );
    }

    /// A task holds a slot: an attempt in flight (dispatched before a restart, or by an earlier
    /// leader) or a pod of it still stopping. Limits are not checked: the pod exists. Nothing
    /// changes for a task already holding one in this queue.
    pub fn hold(&mut self, key: &TaskKey, queue: &str, task_type: &str) {
        if self
            .tasks
            .get(key)
            .is_some_and(|t| t.holding && t.queue == queue)
        {
            return;
        }
        self.detach_if_moved(key, queue);
        self.entry(queue)
            .dispatcher
            .mark_running(key.clone(), task_type);
        self.tasks.insert(
            key.clone(),
            TaskEntry {
                queue: queue.to_string(),
                holding: true,
                granted: false,
            },
        );
    }

    /// The attempt of `key` ended with `outcome`: it feeds the type's breaker (once); the slot
    /// stays held until the task is released.
    pub fn record_outcome(&mut self, key: &TaskKey, outcome: Outcome, now: Timestamp) {
        let Some(task) = self.tasks.get(key).filter(|t| t.holding) else {
            return;
        };
        if let Some(entry) = self.queues.get_mut(&task.queue) {
            entry.dispatcher.record_outcome(key, outcome, now);
        }
    }

    /// The granted dispatch of `key` was written: the attempt is in flight and counted.
    pub fn dispatched(&mut self, key: &TaskKey) {
        if let Some(task) = self.tasks.get_mut(key)
            && task.holding
        {
            task.granted = false;
            if let Some(entry) = self.queues.get_mut(&task.queue) {
                entry.dispatched += 1;
            }
        }
    }

    /// Forgets a task (waiting for its backoff, terminal, deleted). Returns whether a slot was freed.
    pub fn remove(&mut self, key: &TaskKey) -> bool {
        let Some(task) = self.tasks.remove(key) else {
            return false;
        };
        if let Some(entry) = self.queues.get_mut(&task.queue) {
            entry.dispatcher.remove(key);
        }
        self.forget_if_unused(&task.queue);
        task.holding
    }

    /// Whether `key` was given a slot it has not used yet.
    pub fn is_granted(&self, key: &TaskKey) -> bool {
        self.tasks.get(key).is_some_and(|t| t.granted)
    }

    pub fn is_holding(&self, key: &TaskKey) -> bool {
        self.tasks.get(key).is_some_and(|t| t.holding)
    }

    /// The next task to dispatch at `now` and its queue; the queues take turns. It now holds a slot,
    /// granted until its dispatch is written.
    pub fn next(&mut self, now: Timestamp) -> Option<(TaskKey, String)> {
        let active = |(_, e): &(&String, &QueueEntry)| {
            e.availability == Availability::Active && e.dispatcher.pending_len() > 0
        };
        let order: Vec<String> = match &self.last_served {
            Some(last) => self
                .queues
                .range::<String, _>((Bound::Excluded(last), Bound::Unbounded))
                .chain(
                    self.queues
                        .range::<String, _>((Bound::Unbounded, Bound::Included(last))),
                )
                .filter(active)
                .map(|(name, _)| name.clone())
                .collect(),
            None => self
                .queues
                .iter()
                .filter(active)
                .map(|(name, _)| name.clone())
                .collect(),
        };
        for name in order {
            let Some(entry) = self.queues.get_mut(&name) else {
                continue;
            };
            if let Some(key) = entry.dispatcher.next(now) {
                if let Some(task) = self.tasks.get_mut(&key) {
                    task.holding = true;
                    task.granted = true;
                }
                self.last_served = Some(name.clone());
                return Some((key, name));
            }
        }
        None
    }

    /// What holds the waiting task `key` at `now`, with where it stands in its bucket and its
    /// estimated start; `None` if it is not waiting for a slot.
    pub fn held_reason(&self, key: &TaskKey, now: Timestamp) -> Option<(HeldReason, String)> {
        self.held_detail(key, now)
            .map(|(reason, message, _)| (reason, message))
    }

    fn held_detail(
        &self,
        key: &TaskKey,
        now: Timestamp,
    ) -> Option<(HeldReason, String, Option<Estimate>)> {
        let task = self.tasks.get(key).filter(|t| !t.holding)?;
        let entry = self.queues.get(&task.queue)?;
        let q = &task.queue;
        Some(match entry.availability {
            Availability::NotFound => (
                HeldReason::QueueNotFound,
                format!("AxQueue {q} does not exist"),
                None,
            ),
            Availability::Invalid => (
                HeldReason::QueueInvalid,
                format!("AxQueue {q} has no valid spec (see its InvalidSpec condition)"),
                None,
            ),
            Availability::Active => {
                let dispatcher = &entry.dispatcher;
                let (reason, task_type) = dispatcher.held_reason(key, now)?;
                let stem = match reason {
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
                    HeldReason::RetryRateLimited => {
                        format!("the retryRatePerMinute of AxQueue {q} is used up")
                    }
                    HeldReason::CircuitOpen => {
                        format!("the circuit of type {task_type} in AxQueue {q} is open")
                    }
                    HeldReason::Waiting | HeldReason::QueueNotFound | HeldReason::QueueInvalid => {
                        format!("waiting for its turn in AxQueue {q}")
                    }
                };
                let estimate = dispatcher.estimate(key, now).map(|e| match reason {
                    _ if dispatcher.effective_concurrency() == 0 => {
                        e.without_start(NoEstimate::Paused)
                    }
                    HeldReason::TypeConcurrencyLimit
                    | HeldReason::RetryRateLimited
                    | HeldReason::CircuitOpen => e.without_start(NoEstimate::HeldApart),
                    _ => e,
                });
                let message = match &estimate {
                    Some(e) => format!("{stem}; {}", e.describe()),
                    None => stem,
                };
                (reason, message, estimate)
            }
        })
    }

    /// Every task waiting for a slot and what holds it at `now`. Recomputes every waiting task's
    /// position first (one ordered pass per bucket): this is the periodic refresh.
    pub fn held(&mut self, now: Timestamp) -> Vec<Held> {
        for entry in self.queues.values_mut() {
            if entry.dispatcher.pending_len() > 0 {
                entry.dispatcher.refresh_positions();
            }
        }
        self.tasks
            .keys()
            .filter_map(|key| {
                let (reason, message, estimate) = self.held_detail(key, now)?;
                Some(Held {
                    key: key.clone(),
                    reason,
                    message,
                    estimate,
                })
            })
            .collect()
    }

    /// Queues with `concurrencyPolicy: Adaptive` in force, by name.
    pub fn adaptive_queues(&self) -> BTreeSet<String> {
        self.queues
            .iter()
            .filter(|(_, e)| e.availability == Availability::Active && e.adaptive.is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The queue a task waits in or holds a slot of.
    pub fn queue_of(&self, key: &TaskKey) -> Option<&str> {
        self.tasks.get(key).map(|t| t.queue.as_str())
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

    /// Counts a task of `queue` that went Dead.
    pub fn count_dead(&mut self, queue: &str) {
        if let Some(entry) = self.queues.get_mut(queue) {
            entry.dead += 1;
        }
    }

    /// What each queue the registry knows reports at `now`.
    pub fn reports(&self, now: Timestamp) -> Vec<QueueReport> {
        self.queues
            .iter()
            .map(|(name, entry)| {
                let stats = entry.dispatcher.stats(now);
                let exists = entry.availability != Availability::NotFound;
                let config = entry.dispatcher.config();
                let limits = config.limits_at(now);
                let window = limits.window.and_then(|index| {
                    let (from, to, zone) = config.weight_schedule.get(index)?.describe();
                    Some((index, from, to, zone.to_string()))
                });
                let effective_concurrency = entry
                    .dispatcher
                    .adaptive_limit()
                    .map_or(limits.concurrency, |a| a.min(limits.concurrency));
                // A deleted queue's breakers decide nothing until it comes back.
                let circuits = if exists {
                    stats.open_circuits
                } else {
                    Vec::new()
                };
                let open_circuits = circuits.iter().map(|(t, _)| t.clone()).collect();
                QueueReport {
                    name: name.clone(),
                    exists,
                    pending: stats.pending,
                    running: stats.running,
                    concurrency: limits.concurrency,
                    effective_concurrency,
                    window,
                    limits,
                    adaptive: entry.adaptive.is_some(),
                    last_change: entry.last_change.clone(),
                    open_circuits,
                    circuits,
                    dispatched: entry.dispatched_base.saturating_add(entry.dispatched),
                    dead: entry.dead_base.saturating_add(entry.dead),
                    retry_tokens: stats.retry_tokens,
                    invalid: entry.invalid.as_ref().map(|e| e.to_string()),
                    generation: entry.generation,
                }
            })
            .collect()
    }

    /// Records which circuits of `queue` were reported open; returns those that closed since.
    pub fn circuits_reported(&mut self, queue: &str, open: &[String]) -> Vec<String> {
        let Some(entry) = self.queues.get_mut(queue) else {
            return Vec::new();
        };
        let now_open: BTreeSet<String> = open.iter().cloned().collect();
        let closed = entry.reported_open.difference(&now_open).cloned().collect();
        entry.reported_open = now_open;
        self.forget_if_unused(queue);
        closed
    }

    /// Tasks the registry holds, for sweeping out those deleted from the cluster.
    pub fn task_keys(&self) -> Vec<TaskKey> {
        self.tasks.keys().cloned().collect()
    }

    fn entry(&mut self, queue: &str) -> &mut QueueEntry {
        self.queues
            .entry(queue.to_string())
            .or_insert_with(QueueEntry::new)
    }

    /// A task that moved to another queue (its `spec.queue` was edited) leaves the old one.
    fn detach_if_moved(&mut self, key: &TaskKey, queue: &str) {
        if self.tasks.get(key).is_some_and(|t| t.queue != queue) {
            self.remove(key);
        }
    }

    /// Drops the entry of a queue that does not exist and holds nothing, so names of queues that
    /// tasks once named do not pile up.
    fn forget_if_unused(&mut self, queue: &str) {
        let unused = self.queues.get(queue).is_some_and(|entry| {
            entry.availability == Availability::NotFound
                && entry.is_idle()
                && entry.reported_open.is_empty()
        });
        if unused {
            self.queues.remove(queue);
        }
    }
}

/// Puts every cached task where it belongs before the first dispatch: tasks with an attempt in
/// flight or ending hold their slots (dispatched before a restart, or by an earlier leader),
/// eligible Pending tasks wait for one. Returns how many of each. O(n) over the tasks, once.
pub fn rebuild(
    registry: &mut Registry,
    tasks: &[std::sync::Arc<AxTask>],
    now: Timestamp,
) -> (usize, usize) {
    use crate::api::TaskPhase;
    let (mut holding, mut pending) = (0, 0);
    for task in tasks {
        let Some(status) = task.status.as_ref() else {
            continue;
        };
        let key = (task.namespace().unwrap_or_default(), task.name_any());
        if registry.tasks.contains_key(&key) {
            // Already placed by its reconcile, which saw a newer state than a re-list might.
            continue;
        }
        match status.phase {
            Some(
                TaskPhase::Scheduled | TaskPhase::Running | TaskPhase::Failed | TaskPhase::TimedOut,
            ) => {
                registry.hold(&key, &task.spec.queue, &task.spec.task_type);
                holding += 1;
            }
            Some(TaskPhase::Pending)
                if !task.spec.cancel && status.next_attempt_at.is_none_or(|at| at <= now) =>
            {
                registry.upsert(&key, &task.spec.queue, pending_task(task));
                pending += 1;
            }
            _ => {}
        }
    }
    (holding, pending)
}

/// What a task waiting for dispatch looks like to its queue's dispatcher.
pub fn pending_task(task: &AxTask) -> PendingTask {
    let created = task.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let status = task.status.clone().unwrap_or_default();
    pending_of(&task.spec, &status, created)
}

/// The same from a status that is not written yet (the reconciler's decision).
pub fn pending_of(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    created: Option<Timestamp>,
) -> PendingTask {
    PendingTask {
        priority: spec.priority,
        task_type: spec.task_type.clone(),
        queued_at: status
            .queued_at
            .or(created)
            .unwrap_or(Timestamp::UNIX_EPOCH),
        attempt: u32::try_from(status.attempt).unwrap_or(0) + 1,
    }
}

#[cfg(test)]
mod tests;
