//! Every AxQueue's dispatcher and where each task is: waiting for a slot, holding one (granted, in
//! flight, or its pod still stopping), or nowhere. Pure: the controller feeds it what the task
//! reconciler decided and asks it which task goes next.
//!
//! A task naming a queue that does not exist (yet) is kept in an inactive entry and never
//! dispatched; it says `QueueNotFound` until the AxQueue appears.
//!
//! A task whose namespace the queue's `namespaceSelector` does not select is kept out of the
//! dispatcher altogether (`QueueForbidden`): it holds no slot, sits in no bucket and costs a
//! dispatch nothing. The registry knows every namespace's labels (fed by the Namespace watcher) and
//! moves a namespace's tasks in or out when its labels change — one range of the tasks, which are
//! ordered by namespace — and a queue's tasks when its selector changes (one pass, on that edit).
//!
//! Parts: what holds a waiting task and the words for it (`held`), the namespaces a queue admits
//! (`namespaces`), the adaptive concurrency (`adaptive_limit`), what a queue reports (`report`),
//! and the cluster's tasks as the registry takes them, rebuild included (`rebuild`).

mod adaptive_limit;
mod held;
mod namespaces;
mod rebuild;
mod report;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;

use super::adaptive::{AdaptiveConcurrency, Change};
use super::config::{QueueConfig, QueueSpecError, queue_config};
use super::dispatcher::{Dispatcher, Holder, Outcome, PendingTask};
use super::key::KeySource;
use crate::api::{AxQueue, AxQueueSpec, StopPolicy};
pub use held::Held;
pub use rebuild::{Cached, holder, pending_of, pending_task, rebuild};
pub use report::QueueReport;

/// Namespace and name of a task. Shared, not copied: the registry keeps each waiting task's key in
/// three places (its entry, the dispatcher's index and its bucket), and with 100,000 waiting those
/// copies were a tenth of the operator's memory.
pub type TaskKey = Arc<(String, String)>;

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
    /// The queue's name, shared by the entries of its tasks.
    name: Arc<str>,
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
    /// Tasks of this queue waiting outside its dispatcher: their namespace is not selected.
    forbidden: usize,
}

impl QueueEntry {
    fn new(name: &str) -> Self {
        Self {
            name: Arc::from(name),
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
            forbidden: 0,
        }
    }

    fn is_idle(&self) -> bool {
        self.dispatcher.pending_len() == 0
            && self.dispatcher.running_len() == 0
            && self.forbidden == 0
    }
}

#[derive(Debug, Clone)]
struct TaskEntry {
    queue: Arc<str>,
    place: Place,
}

/// Where a task the registry knows is.
#[derive(Debug, Clone)]
enum Place {
    /// In its queue's dispatcher, waiting for a slot.
    Waiting,
    /// Waiting outside the dispatcher, kept as it would wait there: the queue's
    /// `namespaceSelector` does not select its namespace.
    Forbidden(Box<PendingTask>),
    /// Holds a concurrency slot; `granted`: given by [`Registry::next`] and the dispatch not
    /// written yet.
    Holding { granted: bool },
}

impl Place {
    fn is_holding(&self) -> bool {
        matches!(self, Place::Holding { .. })
    }

    fn is_forbidden(&self) -> bool {
        matches!(self, Place::Forbidden(_))
    }
}

/// Every queue's dispatcher and where each queued or dispatched task is.
#[derive(Debug, Default)]
pub struct Registry {
    queues: BTreeMap<String, QueueEntry>,
    /// Ordered by namespace, so the tasks of one namespace are one range.
    tasks: BTreeMap<TaskKey, TaskEntry>,
    /// The labels of each namespace, as the Namespace watcher last reported them.
    namespaces: HashMap<String, BTreeMap<String, String>>,
    /// The queue `next` served last, so queues take turns.
    last_served: Option<String>,
}

impl Registry {
    /// Applies an AxQueue as seen by the watcher: its spec (when it changed) and, the first time the
    /// queue is seen, the totals in its status. Returns the spec's problem when it is newly invalid.
    pub fn configure(&mut self, queue: &AxQueue, now: Timestamp) -> Option<QueueSpecError> {
        let name = queue.name_any();
        let entry = self
            .queues
            .entry(name.clone())
            .or_insert_with(|| QueueEntry::new(&name));
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
                let selector = &config.namespace_selector;
                // Only a selector that changed or comes into force moves tasks in or out.
                let moves = *selector != entry.dispatcher.config().namespace_selector
                    || (entry.availability != Availability::Active && !selector.selects_all());
                entry.dispatcher.set_config(config, now);
                entry.availability = Availability::Active;
                entry.invalid = None;
                entry.sync_adaptive(now);
                if moves {
                    self.resync_queue(&name);
                }
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
            if entry.forbidden > 0 {
                // Without a spec in force nothing is forbidden: they wait for the queue instead.
                self.resync_queue(name);
            }
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

    /// A task eligible for dispatch waits for a slot (a slot it held is given back): in the
    /// queue's dispatcher, or outside it when the queue does not admit its namespace.
    pub fn upsert(&mut self, key: &TaskKey, queue: &str, task: PendingTask) {
        self.detach_if_moved(key, queue);
        let key = &self.shared(key);
        let labels = self.namespaces.get(&key.0);
        let entry = self
            .queues
            .entry(queue.to_string())
            .or_insert_with(|| QueueEntry::new(queue));
        let place = if entry.admits(labels) {
            entry.dispatcher.upsert(key.clone(), task);
            Place::Waiting
        } else {
            entry.dispatcher.remove(key);
            Place::Forbidden(Box::new(task))
        };
        self.place(key, queue, place);
    }

    /// A task holds a slot: an attempt in flight (dispatched before a restart, or by an earlier
    /// leader) or a pod of it still stopping. Limits are not checked: the pod exists. Nothing
    /// changes for a task already holding one in this queue.
    pub fn hold(&mut self, key: &TaskKey, queue: &str, holder: Holder<'_>) {
        if self
            .tasks
            .get(key)
            .is_some_and(|t| t.place.is_holding() && *t.queue == *queue)
        {
            return;
        }
        self.detach_if_moved(key, queue);
        let key = &self.shared(key);
        self.entry(queue)
            .dispatcher
            .mark_running(key.clone(), &key.0, holder);
        self.place(key, queue, Place::Holding { granted: false });
    }

    /// The attempt of `key` ended with `outcome`: it feeds the breaker of its (namespace, type)
    /// (once); the slot stays held until the task is released.
    pub fn record_outcome(&mut self, key: &TaskKey, outcome: Outcome, now: Timestamp) {
        let Some(task) = self.tasks.get(key).filter(|t| t.place.is_holding()) else {
            return;
        };
        if let Some(entry) = self.queues.get_mut(&*task.queue) {
            entry.dispatcher.record_outcome(key, outcome, now);
        }
    }

    /// The granted dispatch of `key` was written: the attempt is in flight and counted.
    pub fn dispatched(&mut self, key: &TaskKey) {
        if let Some(task) = self.tasks.get_mut(key)
            && let Place::Holding { granted } = &mut task.place
        {
            *granted = false;
            if let Some(entry) = self.queues.get_mut(&*task.queue) {
                entry.dispatched += 1;
            }
        }
    }

    /// Forgets a task (waiting for its backoff, terminal, deleted). Returns whether a slot was freed.
    pub fn remove(&mut self, key: &TaskKey) -> bool {
        let Some(task) = self.tasks.remove(key) else {
            return false;
        };
        if let Some(entry) = self.queues.get_mut(&*task.queue) {
            entry.dispatcher.remove(key);
            if task.place.is_forbidden() {
                entry.forbidden = entry.forbidden.saturating_sub(1);
            }
        }
        self.forget_if_unused(&task.queue);
        task.place.is_holding()
    }

    /// Whether `key` was given a slot it has not used yet.
    pub fn is_granted(&self, key: &TaskKey) -> bool {
        self.tasks
            .get(key)
            .is_some_and(|t| matches!(t.place, Place::Holding { granted: true }))
    }

    pub fn is_holding(&self, key: &TaskKey) -> bool {
        self.tasks.get(key).is_some_and(|t| t.place.is_holding())
    }

    /// Whether `queue` is in force with `stopPolicy: HoldAndDrain`: its dispatched attempts stop.
    pub fn drains(&self, queue: &str) -> bool {
        self.queues.get(queue).is_some_and(|e| {
            e.availability == Availability::Active
                && e.dispatcher.config().stop_policy == StopPolicy::HoldAndDrain
        })
    }

    /// The running tasks to stop at `now` so that waiting urgent tasks can go, with their queues
    /// (`preemption.withinQueue: LowerPriority`; at most one in flight per queue).
    pub fn preemptions(&mut self, now: Timestamp) -> Vec<(TaskKey, String)> {
        self.queues
            .iter_mut()
            .filter(|(_, e)| e.availability == Availability::Active)
            .filter_map(|(name, e)| Some((e.dispatcher.preempt(now)?, name.clone())))
            .collect()
    }

    /// Whether the attempt of `key` was chosen to be stopped for a waiting urgent task.
    pub fn is_preempted(&self, key: &TaskKey) -> bool {
        self.tasks
            .get(key)
            .and_then(|t| self.queues.get(&*t.queue))
            .is_some_and(|e| e.dispatcher.is_preempted(key))
    }

    /// Where the tasks of `queue` take their keys from, if a spec of it is in force.
    pub fn key_source(&self, queue: &str) -> Option<&KeySource> {
        self.queues
            .get(queue)
            .filter(|e| e.availability == Availability::Active)
            .map(|e| &e.dispatcher.config().key)
    }

    /// Every task the registry places in `queue`, waiting or holding a slot.
    pub fn tasks_in(&self, queue: &str) -> Vec<TaskKey> {
        self.tasks
            .iter()
            .filter(|(_, t)| *t.queue == *queue)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// The tasks holding a slot of `queue`: those a drain stops.
    pub fn holding_in(&self, queue: &str) -> Vec<TaskKey> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.place.is_holding() && *t.queue == *queue)
            .map(|(key, _)| key.clone())
            .collect()
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
                    task.place = Place::Holding { granted: true };
                }
                self.last_served = Some(name.clone());
                return Some((key, name));
            }
        }
        None
    }

    /// The queue a task waits in or holds a slot of.
    pub fn queue_of(&self, key: &TaskKey) -> Option<&str> {
        self.tasks.get(key).map(|t| &*t.queue)
    }

    /// Counts a task of `queue` that went Dead.
    pub fn count_dead(&mut self, queue: &str) {
        if let Some(entry) = self.queues.get_mut(queue) {
            entry.dead += 1;
        }
    }

    /// Tasks the registry holds, for sweeping out those deleted from the cluster.
    pub fn task_keys(&self) -> Vec<TaskKey> {
        self.tasks.keys().cloned().collect()
    }

    /// The registry's own copy of `key` if it knows the task: every place that keeps the key shares
    /// one allocation.
    fn shared(&self, key: &TaskKey) -> TaskKey {
        self.tasks
            .get_key_value(key)
            .map_or_else(|| key.clone(), |(shared, _)| shared.clone())
    }

    fn entry(&mut self, queue: &str) -> &mut QueueEntry {
        self.queues
            .entry(queue.to_string())
            .or_insert_with(|| QueueEntry::new(queue))
    }

    /// Records where a task is now, keeping the count of forbidden tasks of its queue (the task was
    /// detached from any other queue first).
    fn place(&mut self, key: &TaskKey, queue: &str, place: Place) {
        let forbidden = place.is_forbidden();
        let entry = self.entry(queue);
        let task = TaskEntry {
            queue: entry.name.clone(),
            place,
        };
        let previous = self.tasks.insert(key.clone(), task);
        let was_forbidden = previous.is_some_and(|t| t.place.is_forbidden());
        let entry = self.entry(queue);
        if forbidden && !was_forbidden {
            entry.forbidden += 1;
        } else if was_forbidden && !forbidden {
            entry.forbidden = entry.forbidden.saturating_sub(1);
        }
    }

    /// A task that moved to another queue (its `spec.queue` was edited) leaves the old one.
    fn detach_if_moved(&mut self, key: &TaskKey, queue: &str) {
        if self.tasks.get(key).is_some_and(|t| *t.queue != *queue) {
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

#[cfg(test)]
mod tests;
