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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;

use super::adaptive::{self, AdaptiveConcurrency, Bounds, Change, Observation};
use super::config::{LimitsInForce, QueueConfig, QueueSpecError, queue_config};
use super::dispatcher::{Dispatcher, HeldReason, OpenCircuit, Outcome, PendingTask};
use super::estimate::{Estimate, NoEstimate};
use crate::api::{AxQueue, AxQueueSpec, AxTask, AxTaskSpec, AxTaskStatus, Priority, TaskPhase};

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
        self.dispatcher.pending_len() == 0
            && self.dispatcher.running_len() == 0
            && self.forbidden == 0
    }

    /// Whether tasks of a namespace with these labels (`None`: not seen yet) may be dispatched
    /// from this queue. Only a spec in force selects: tasks of a missing or never valid queue wait
    /// for that reason. A selector admits no namespace whose labels are unknown, even one that
    /// would select no labels (`NotIn`, `DoesNotExist`): its real labels may exclude it.
    fn admits(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let selector = &self.dispatcher.config().namespace_selector;
        self.availability != Availability::Active
            || selector.selects_everything()
            || labels.is_some_and(|labels| selector.matches(labels))
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
    /// Task types with a circuit not closed (in some namespace), by name.
    pub open_circuits: Vec<String>,
    /// Each breaker not closed: namespace, type, state.
    pub circuits: Vec<OpenCircuit>,
    /// Tasks waiting because the queue's `namespaceSelector` does not select their namespace.
    pub forbidden: usize,
    pub dispatched: i64,
    pub dead: i64,
    pub retry_tokens: u32,
    pub invalid: Option<String>,
    pub generation: Option<i64>,
}

/// A task held back and what holds it (in words: [`Registry::held_reason`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub key: TaskKey,
    pub reason: HeldReason,
    /// Its place in its bucket and estimated start.
    pub estimate: Option<Estimate>,
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
                    || (entry.availability != Availability::Active
                        && !selector.selects_everything());
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

    /// The labels of namespace `name` as the Namespace watcher sees them (`None`: deleted). Tasks of
    /// it that wait move into or out of their queue's dispatcher as its selector now says; tasks
    /// holding a slot keep it. Returns how many moved. Costs one range over the namespace's tasks,
    /// and nothing when the labels did not change.
    pub fn namespace_labels(
        &mut self,
        name: &str,
        labels: Option<BTreeMap<String, String>>,
    ) -> usize {
        if self.namespaces.get(name) == labels.as_ref() {
            return 0;
        }
        match labels {
            Some(labels) => self.namespaces.insert(name.to_string(), labels),
            None => self.namespaces.remove(name),
        };
        let start = (name.to_string(), String::new());
        let keys: Vec<TaskKey> = self
            .tasks
            .range(start..)
            .take_while(|(key, _)| key.0 == name)
            .filter(|(_, task)| !task.place.is_holding())
            .map(|(key, _)| key.clone())
            .collect();
        self.resync(keys)
    }

    /// Namespaces whose labels the registry holds, by name.
    pub fn known_namespaces(&self) -> Vec<String> {
        self.namespaces.keys().cloned().collect()
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
    pub fn hold(&mut self, key: &TaskKey, queue: &str, task_type: &str) {
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
            .mark_running(key.clone(), &key.0, task_type);
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
                    HeldReason::RetryRateLimited => {
                        format!("the retryRatePerMinute of AxQueue {q} is used up")
                    }
                    HeldReason::CircuitOpen => format!(
                        "the circuit of type {task_type} for namespace {namespace} in AxQueue {q} is open"
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
                    | HeldReason::RetryRateLimited
                    | HeldReason::CircuitOpen => e.without_start(NoEstimate::HeldApart),
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
        self.tasks.get(key).map(|t| &*t.queue)
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
                // Sorted by type: one entry per type.
                let mut open_circuits: Vec<String> =
                    circuits.iter().map(|c| c.task_type.clone()).collect();
                open_circuits.dedup();
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
                    forbidden: entry.forbidden,
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

    /// Moves each waiting task of `keys` into or out of its queue's dispatcher, as the queue
    /// admits its namespace now. Returns how many moved.
    fn resync(&mut self, keys: Vec<TaskKey>) -> usize {
        let mut moved = 0;
        for key in keys {
            let Some(task) = self.tasks.get(&key) else {
                continue;
            };
            let queue = task.queue.clone();
            let labels = self.namespaces.get(&key.0);
            let Some(entry) = self.queues.get_mut(&*queue) else {
                continue;
            };
            let place = match (&task.place, entry.admits(labels)) {
                (Place::Waiting, false) => match entry.dispatcher.take_pending(&key) {
                    Some(pending) => Place::Forbidden(Box::new(pending)),
                    None => continue,
                },
                (Place::Forbidden(pending), true) => {
                    entry.dispatcher.upsert(key.clone(), (**pending).clone());
                    Place::Waiting
                }
                _ => continue,
            };
            self.place(&key, &queue, place);
            moved += 1;
        }
        moved
    }

    /// Re-applies the selector of `queue` to its waiting tasks: one pass over the tasks, made only
    /// when the selector changed or came into or out of force.
    fn resync_queue(&mut self, queue: &str) -> usize {
        let keys: Vec<TaskKey> = self
            .tasks
            .iter()
            .filter(|(_, task)| *task.queue == *queue && !task.place.is_holding())
            .map(|(key, _)| key.clone())
            .collect();
        self.resync(keys)
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

/// What the rebuild reads of one cached task.
pub struct Cached<'a> {
    pub key: TaskKey,
    pub queue: &'a str,
    pub task_type: &'a str,
    /// As written (`None`: new).
    pub phase: Option<TaskPhase>,
    pub cancel: bool,
    pub next_attempt_at: Option<Timestamp>,
    /// Its next attempt's pod exists: dispatched just before a restart (or by an earlier leader),
    /// its status not saying so yet.
    pub next_pod: bool,
    /// What its queue's dispatcher holds of it, for a Pending task.
    pub pending: Option<PendingTask>,
}

/// Puts every cached task where it belongs before the first dispatch: tasks with an attempt in
/// flight or ending hold their slots (dispatched before a restart, or by an earlier leader), eligible
/// Pending tasks wait for one. Returns how many of each. O(n) over the tasks, once.
pub fn rebuild<'a>(
    registry: &mut Registry,
    tasks: impl IntoIterator<Item = Cached<'a>>,
    now: Timestamp,
) -> (usize, usize) {
    let (mut holding, mut pending) = (0, 0);
    for task in tasks {
        if registry.tasks.contains_key(&task.key) {
            // Already placed by its reconcile, which saw a newer state than a re-list might.
            continue;
        }
        let waiting = matches!(task.phase, None | Some(TaskPhase::Pending));
        if waiting && task.next_pod {
            registry.hold(&task.key, task.queue, task.task_type);
            holding += 1;
            continue;
        }
        match task.phase {
            Some(
                TaskPhase::Scheduled | TaskPhase::Running | TaskPhase::Failed | TaskPhase::TimedOut,
            ) => {
                registry.hold(&task.key, task.queue, task.task_type);
                holding += 1;
            }
            Some(TaskPhase::Pending)
                if !task.cancel && task.next_attempt_at.is_none_or(|at| at <= now) =>
            {
                if let Some(entry) = task.pending {
                    registry.upsert(&task.key, task.queue, entry);
                    pending += 1;
                }
            }
            _ => {}
        }
    }
    (holding, pending)
}

/// What a task waiting for dispatch looks like to its queue's dispatcher.
pub fn pending_task(task: &AxTask) -> PendingTask {
    let created = task.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let namespace = task.namespace().unwrap_or_default();
    match task.status.as_ref() {
        Some(status) => pending_of(&namespace, &task.spec, status, created),
        None => pending_of(&namespace, &task.spec, &AxTaskStatus::default(), created),
    }
}

/// The same from a status that is not written yet (the reconciler's decision).
pub fn pending_of(
    namespace: &str,
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    created: Option<Timestamp>,
) -> PendingTask {
    PendingTask {
        priority: spec.priority,
        namespace: namespace.to_string(),
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
