//! The AxQueues in the operator: one `Dispatcher` per queue in a registry that also knows which
//! queue every queued task is in; the AxQueue watcher that applies spec edits at once; the periodic
//! writer of `AxQueue.status` and the queue metrics; and the held-reason refresh that tells each
//! waiting task what holds it.
//!
//! A task naming a queue that does not exist (yet) is kept in an inactive entry of the registry and
//! never dispatched; it says `QueueNotFound` until the AxQueue appears.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::task::write_status;
use super::{Ctx, FIELD_MANAGER, TaskKey};
use crate::api::{
    AxQueue, AxQueueSpec, AxQueueStatus, AxTask, Condition, DEFAULT_QUEUE, PendingCounts,
    QueueWeights, TaskPhase,
};
use crate::core::breaker::BreakerConfig;
use crate::core::queue::{
    Dispatcher, HeldReason, MaxWait, Outcome, PendingTask, Priority, QueueConfig,
};
use crate::core::task as core_task;
use crate::core::weights::{WeightWindow, Weights};

/// How often `AxQueue.status` and the queue metrics are brought up to date (written only when
/// changed), and the `default` queue re-created if it went missing.
const STATUS_EVERY: Duration = Duration::from_secs(2);
/// Where Events about (cluster-scoped) queues are written.
const EVENT_NAMESPACE: &str = "default";
/// Held-reason writes in flight at once: they are bookkeeping and must not crowd out dispatch.
const HELD_WRITES_AT_ONCE: usize = 4;

// ---------------------------------------------------------------------------------------------
// Spec → configuration (pure)
// ---------------------------------------------------------------------------------------------

/// The dispatcher configuration of a queue spec, or why the spec cannot be applied (for the checks
/// the OpenAPI schema cannot make: time zones, wall-clock times, a queue that could never dispatch).
pub fn queue_config(spec: &AxQueueSpec) -> Result<QueueConfig, String> {
    let weights = weights_of(&spec.weights, "spec.weights")?;
    let wait = |field: &str, seconds: i64| match seconds {
        0 => Ok(None),
        s if s > 0 => Ok(Some(SignedDuration::from_secs(s))),
        s => Err(format!(
            "spec.maxWaitSeconds.{field} ({s}) must be 0 (no limit) or more"
        )),
    };
    let m = &spec.max_wait_seconds;
    let max_wait = MaxWait {
        critical: wait("critical", m.critical)?,
        high: wait("high", m.high)?,
        normal: wait("normal", m.normal)?,
        low: wait("low", m.low)?,
    };
    let concurrency = non_negative(spec.concurrency, "spec.concurrency")?;
    let type_concurrency = spec
        .type_concurrency
        .iter()
        .map(|(task_type, limit)| {
            non_negative(*limit, &format!("spec.typeConcurrency[{task_type}]"))
                .map(|limit| (task_type.clone(), limit))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    let retry_rate_per_minute =
        non_negative(spec.retry_rate_per_minute, "spec.retryRatePerMinute")?;
    let cb = &spec.circuit_breaker;
    if !(cb.failure_ratio > 0.0 && cb.failure_ratio <= 1.0) {
        return Err(format!(
            "spec.circuitBreaker.failureRatio ({}) must be above 0 and at most 1",
            cb.failure_ratio
        ));
    }
    if cb.open_seconds < 1 {
        return Err(format!(
            "spec.circuitBreaker.openSeconds ({}) must be at least 1",
            cb.open_seconds
        ));
    }
    let circuit_breaker = BreakerConfig {
        window_size: non_negative(cb.window_size, "spec.circuitBreaker.windowSize")?,
        min_requests: non_negative(cb.min_requests, "spec.circuitBreaker.minRequests")?.max(1),
        failure_ratio: cb.failure_ratio,
        open_for: SignedDuration::from_secs(cb.open_seconds),
    };
    let mut weight_schedule = Vec::with_capacity(spec.weight_schedule.len());
    for (i, entry) in spec.weight_schedule.iter().enumerate() {
        let field = format!("spec.weightSchedule[{i}]");
        let window_weights = weights_of(&entry.weights, &format!("{field}.weights"))?;
        let window = WeightWindow::parse(&entry.from, &entry.to, &entry.time_zone, window_weights)
            .map_err(|e| format!("{field}: {e}"))?;
        weight_schedule.push(window);
    }
    let any_max_wait = Priority::ALL
        .iter()
        .any(|priority| max_wait.of(*priority).is_some());
    if !any_max_wait {
        let stalled = std::iter::once(("spec.weights".to_string(), &weights)).chain(
            weight_schedule
                .iter()
                .enumerate()
                .map(|(i, w)| (format!("spec.weightSchedule[{i}].weights"), w.weights())),
        );
        for (field, w) in stalled {
            if Priority::ALL.iter().all(|priority| w.of(*priority) == 0) {
                return Err(format!(
                    "{field} are all 0 and no maxWaitSeconds is set: nothing would ever be dispatched"
                ));
            }
        }
    }
    Ok(QueueConfig {
        weights,
        max_wait,
        concurrency,
        type_concurrency,
        retry_rate_per_minute,
        circuit_breaker,
        weight_schedule,
    })
}

fn weights_of(w: &QueueWeights, field: &str) -> Result<Weights, String> {
    Ok(Weights {
        critical: non_negative(w.critical, &format!("{field}.critical"))?,
        high: non_negative(w.high, &format!("{field}.high"))?,
        normal: non_negative(w.normal, &format!("{field}.normal"))?,
        low: non_negative(w.low, &format!("{field}.low"))?,
    })
}

fn non_negative(value: i32, field: &str) -> Result<u32, String> {
    u32::try_from(value).map_err(|_| format!("{field} ({value}) must not be negative"))
}

/// The dispatcher's priority of an API priority.
pub fn priority(p: crate::api::Priority) -> Priority {
    match p {
        crate::api::Priority::Critical => Priority::Critical,
        crate::api::Priority::High => Priority::High,
        crate::api::Priority::Normal => Priority::Normal,
        crate::api::Priority::Low => Priority::Low,
    }
}

// ---------------------------------------------------------------------------------------------
// The registry (no I/O)
// ---------------------------------------------------------------------------------------------

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
    invalid: Option<String>,
    generation: Option<i64>,
    /// Totals from before this process (read from the status when the queue was first seen),
    /// less what this dispatcher had counted by then.
    dispatched_base: i64,
    dead_base: i64,
    /// Attempts this process dispatched (status written), and tasks it saw go Dead.
    dispatched: i64,
    dead: i64,
    /// Types reported in `ax_circuit_open` as open, to report them closed later.
    reported_open: BTreeSet<String>,
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
        }
    }

    fn is_idle(&self) -> bool {
        self.dispatcher.pending_len() == 0 && self.dispatcher.running_len() == 0
    }
}

#[derive(Debug, Clone)]
struct TaskEntry {
    queue: String,
    task_type: String,
    /// Counted as dispatched and unfinished.
    running: bool,
    /// While running: the resourceVersion of the task our dispatch wrote (`u64::MAX` while that
    /// write is in flight). An older version seen Pending is a stale copy, not a new attempt.
    dispatched_version: Option<u64>,
}

/// What `AxQueue.status` and the metrics report about one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueReport {
    pub name: String,
    pub exists: bool,
    pub pending: [(Priority, usize); 4],
    pub running: usize,
    /// The concurrency limit in force.
    pub concurrency: u32,
    pub open_circuits: Vec<String>,
    pub dispatched: i64,
    pub dead: i64,
    pub retry_tokens: u32,
    pub invalid: Option<String>,
    pub generation: Option<i64>,
}

/// A task held back and what holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub key: TaskKey,
    /// One of `core::task::HELD_REASONS`.
    pub reason: &'static str,
    pub message: String,
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
    pub fn configure(&mut self, queue: &AxQueue, now: Timestamp) -> Option<String> {
        let entry = self
            .queues
            .entry(queue.name_any())
            .or_insert_with(QueueEntry::new);
        entry.generation = queue.metadata.generation;
        if entry.availability == Availability::NotFound {
            let status = queue.status.clone().unwrap_or_default();
            entry.dispatched_base = status.dispatched.saturating_sub(entry.dispatched);
            entry.dead_base = status.dead.saturating_sub(entry.dead);
        } else if entry.seen_spec.as_ref() == Some(&queue.spec) {
            return None;
        }
        entry.seen_spec = Some(queue.spec.clone());
        match queue_config(&queue.spec) {
            Ok(config) => {
                entry.dispatcher.set_config(config, now);
                entry.availability = Availability::Active;
                entry.invalid = None;
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

    /// Adds or updates a task eligible for dispatch. Ignored for a stale copy of a task whose
    /// dispatch this process is making or has made (`version` older than the one it wrote).
    /// Returns whether the task was taken.
    pub fn upsert(
        &mut self,
        key: &TaskKey,
        queue: &str,
        task: PendingTask,
        version: Option<u64>,
    ) -> bool {
        if let Some(current) = self.tasks.get(key)
            && current.running
            && let Some(dispatched) = current.dispatched_version
            && version.is_none_or(|v| v < dispatched)
        {
            return false;
        }
        self.detach_if_moved(key, queue);
        let task_type = task.task_type.clone();
        self.entry(queue).dispatcher.upsert(key.clone(), task);
        self.tasks.insert(
            key.clone(),
            TaskEntry {
                queue: queue.to_string(),
                task_type,
                running: false,
                dispatched_version: None,
            },
        );
        true
    }

    /// Counts a task with an attempt in flight as running (rebuilding after a restart, or a task
    /// dispatched by an earlier leader). Nothing changes for a task already counted running.
    pub fn mark_running(&mut self, key: &TaskKey, queue: &str, task_type: &str) {
        if self
            .tasks
            .get(key)
            .is_some_and(|t| t.running && t.queue == queue)
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
                task_type: task_type.to_string(),
                running: true,
                dispatched_version: None,
            },
        );
    }

    /// The dispatched attempt of `key` ended with `outcome`. Returns whether a slot was freed.
    pub fn finished(&mut self, key: &TaskKey, outcome: Outcome, now: Timestamp) -> bool {
        let Some(task) = self.tasks.get(key) else {
            return false;
        };
        if !task.running {
            return false;
        }
        let queue = task.queue.clone();
        self.tasks.remove(key);
        let freed = self
            .queues
            .get_mut(&queue)
            .is_some_and(|entry| entry.dispatcher.finished(key, outcome, now));
        self.forget_if_unused(&queue);
        freed
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
        task.running
    }

    pub fn is_running(&self, key: &TaskKey) -> bool {
        self.tasks.get(key).is_some_and(|t| t.running)
    }

    /// Our dispatch of `key` was written as `version`: counted, and recorded so stale copies
    /// are recognised.
    pub fn dispatch_written(&mut self, key: &TaskKey, version: Option<u64>) {
        if let Some(task) = self.tasks.get_mut(key)
            && task.running
        {
            task.dispatched_version = version.or(Some(0));
            if let Some(entry) = self.queues.get_mut(&task.queue) {
                entry.dispatched += 1;
            }
        }
    }

    /// The next task to dispatch at `now` and its queue; the queues take turns. The task now counts
    /// as running.
    pub fn next(&mut self, now: Timestamp) -> Option<(TaskKey, String)> {
        let start = self.last_served.clone();
        let order: Vec<String> = match &start {
            Some(last) => self
                .queues
                .range::<String, _>((Bound::Excluded(last), Bound::Unbounded))
                .chain(
                    self.queues
                        .range::<String, _>((Bound::Unbounded, Bound::Included(last))),
                )
                .filter(|(_, e)| {
                    e.availability == Availability::Active && e.dispatcher.pending_len() > 0
                })
                .map(|(name, _)| name.clone())
                .collect(),
            None => self
                .queues
                .iter()
                .filter(|(_, e)| {
                    e.availability == Availability::Active && e.dispatcher.pending_len() > 0
                })
                .map(|(name, _)| name.clone())
                .collect(),
        };
        for name in order {
            let Some(entry) = self.queues.get_mut(&name) else {
                continue;
            };
            if let Some(key) = entry.dispatcher.next(now) {
                if let Some(task) = self.tasks.get_mut(&key) {
                    task.running = true;
                    task.dispatched_version = Some(u64::MAX);
                }
                self.last_served = Some(name.clone());
                return Some((key, name));
            }
        }
        None
    }

    /// Every task waiting for dispatch and what holds it at `now`.
    pub fn held(&self, now: Timestamp) -> Vec<Held> {
        self.tasks
            .iter()
            .filter(|(_, task)| !task.running)
            .filter_map(|(key, task)| {
                let entry = self.queues.get(&task.queue)?;
                let q = &task.queue;
                let (reason, message) = match entry.availability {
                    Availability::NotFound => {
                        ("QueueNotFound", format!("AxQueue {q} does not exist"))
                    }
                    Availability::Invalid => (
                        "QueueInvalid",
                        format!("AxQueue {q} has no valid spec (see its InvalidSpec condition)"),
                    ),
                    Availability::Active => {
                        let reason = entry.dispatcher.held_reason(key, now)?;
                        let t = &task.task_type;
                        let message = match reason {
                            HeldReason::ConcurrencyLimit => {
                                format!("the concurrency of AxQueue {q} is in use")
                            }
                            HeldReason::TypeConcurrencyLimit => {
                                format!("the typeConcurrency of {t} in AxQueue {q} is in use")
                            }
                            HeldReason::RetryRateLimited => {
                                format!("the retryRatePerMinute of AxQueue {q} is used up")
                            }
                            HeldReason::CircuitOpen => {
                                format!("the circuit of type {t} in AxQueue {q} is open")
                            }
                            HeldReason::Waiting => format!("waiting for its turn in AxQueue {q}"),
                        };
                        (reason.as_str(), message)
                    }
                };
                Some(Held {
                    key: key.clone(),
                    reason,
                    message,
                })
            })
            .collect()
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
                // A deleted queue's breakers decide nothing until it comes back.
                let open_circuits = if exists {
                    stats.open_circuits.into_iter().map(|(t, _)| t).collect()
                } else {
                    Vec::new()
                };
                QueueReport {
                    name: name.clone(),
                    exists,
                    pending: stats.pending,
                    running: stats.running,
                    concurrency: entry.dispatcher.config().concurrency,
                    open_circuits,
                    dispatched: entry.dispatched_base.saturating_add(entry.dispatched),
                    dead: entry.dead_base.saturating_add(entry.dead),
                    retry_tokens: stats.retry_tokens,
                    invalid: entry.invalid.clone(),
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

/// The registry behind a lock, as the reconcilers and the dispatch loop share it.
#[derive(Debug, Default)]
pub struct Queues {
    registry: Mutex<Registry>,
}

impl Queues {
    /// A panic while holding the lock cannot leave the registry half-updated in a way that matters
    /// more than stopping dispatch, so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The resourceVersion of an object as a number (etcd makes it a counter).
pub fn version_of<K: Resource>(object: &K) -> Option<u64> {
    object.meta().resource_version.as_deref()?.parse().ok()
}

/// Puts every cached task where it belongs in the registry: tasks with an attempt in flight count
/// as running (dispatched before a restart, or by an earlier leader), eligible Pending tasks wait
/// for dispatch. Returns how many of each. O(n) over the tasks.
pub fn rebuild(registry: &mut Registry, tasks: &[Arc<AxTask>], now: Timestamp) -> (usize, usize) {
    let (mut running, mut pending) = (0, 0);
    for task in tasks {
        let Some(status) = task.status.as_ref() else {
            continue;
        };
        let key = (task.namespace().unwrap_or_default(), task.name_any());
        match status.phase {
            Some(phase) if phase.has_worker() => {
                registry.mark_running(&key, &task.spec.queue, &task.spec.task_type);
                running += 1;
            }
            Some(TaskPhase::Pending)
                if !task.spec.cancel && status.next_attempt_at.is_none_or(|at| at <= now) =>
            {
                registry.upsert(
                    &key,
                    &task.spec.queue,
                    pending_task(task),
                    version_of(task.as_ref()),
                );
                pending += 1;
            }
            _ => {}
        }
    }
    (running, pending)
}

/// What a task waiting for dispatch looks like to its queue's dispatcher.
pub fn pending_task(task: &AxTask) -> PendingTask {
    let status = task.status.as_ref();
    PendingTask {
        priority: priority(task.spec.priority),
        task_type: task.spec.task_type.clone(),
        queued_at: status
            .and_then(|s| s.queued_at)
            .or_else(|| task.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .unwrap_or(Timestamp::UNIX_EPOCH),
        attempt: status.map_or(1, |s| u32::try_from(s.attempt).unwrap_or(0) + 1),
    }
}

// ---------------------------------------------------------------------------------------------
// Controllers
// ---------------------------------------------------------------------------------------------

/// Applies every AxQueue event to the registry: spec edits take effect at once, a deleted queue
/// holds its tasks. A spec newly found invalid gets a Warning Event (its condition follows with the
/// next status write).
pub async fn watch(
    ctx: Ctx,
    events: impl Stream<Item = Result<watcher::Event<AxQueue>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(queue) | watcher::Event::InitApply(queue)) => {
                configure(&ctx, &queue);
            }
            Ok(watcher::Event::Delete(queue)) => {
                info!(
                    queue = queue.name_any(),
                    "AxQueue deleted; its tasks wait for it"
                );
                ctx.queues.lock().queue_deleted(&queue.name_any());
            }
            Ok(watcher::Event::InitDone) => sync_from_store(&ctx),
            Ok(watcher::Event::Init) => {}
            Err(e) => debug!(error = %e, "AxQueue watch"),
        }
        ctx.dispatch_wanted.notify_one();
    }
}

/// Brings the registry in line with the AxQueue cache: after a re-list, deletions missed while the
/// watch was down show up here.
pub fn sync_from_store(ctx: &Ctx) {
    let queues = ctx.queue_store.state();
    for queue in &queues {
        configure(ctx, queue);
    }
    let present: BTreeSet<String> = queues.iter().map(|q| q.name_any()).collect();
    let mut registry = ctx.queues.lock();
    for name in registry.known_queues() {
        if !present.contains(&name) {
            registry.queue_deleted(&name);
        }
    }
}

fn configure(ctx: &Ctx, queue: &AxQueue) {
    let problem = ctx.queues.lock().configure(queue, Timestamp::now());
    match problem {
        Some(problem) => {
            warn!(queue = queue.name_any(), %problem, "AxQueue spec rejected; the previous configuration stays");
            publish(
                ctx,
                queue,
                "Warning",
                "InvalidSpec",
                &format!("{problem}; the previous configuration stays in force"),
            );
        }
        None => debug!(queue = queue.name_any(), "AxQueue applied"),
    }
}

/// Publishes an Event about a queue. A cluster-scoped object's events.k8s.io Event must live in
/// kube-system (where `kubectl describe` does not look), so this writes a core/v1 Event in
/// `default`, which API servers accept for cluster-scoped objects and describe finds.
fn publish(ctx: &Ctx, queue: &AxQueue, type_: &str, reason: &str, note: &str) {
    let now = Time(Timestamp::now());
    let event = CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", queue.name_any())),
            namespace: Some(EVENT_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        involved_object: queue.object_ref(&()),
        type_: Some(type_.into()),
        reason: Some(reason.into()),
        message: Some(note.chars().take(1000).collect()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource {
            component: Some(FIELD_MANAGER.into()),
            host: None,
        }),
        ..CoreEvent::default()
    };
    let api: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), EVENT_NAMESPACE);
    tokio::spawn(async move {
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            debug!(error = %e, "publishing event failed");
        }
    });
}

/// Keeps `AxQueue.status` and the queue metrics up to date, and the `default` queue in existence.
pub async fn maintain(ctx: Ctx, default_concurrency: u32) {
    super::cache_synced(&ctx.queue_store).await;
    let mut tick = tokio::time::interval(STATUS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if ctx
            .queue_store
            .get(&ObjectRef::new(DEFAULT_QUEUE))
            .is_none()
        {
            create_default_queue(&ctx, default_concurrency).await;
        }
        let now = Timestamp::now();
        let reports = ctx.queues.lock().reports(now);
        report_metrics(&ctx, &reports);
        for report in reports.iter().filter(|r| r.exists) {
            let Some(queue) = ctx.queue_store.get(&ObjectRef::new(&report.name)) else {
                continue;
            };
            let before = queue.status.clone().unwrap_or_default();
            let status = queue_status(report, &before, now);
            if status != before
                && let Err(e) = write_queue_status(&ctx, &report.name, &status).await
            {
                debug!(queue = report.name, error = %e, "writing AxQueue status failed");
            }
        }
    }
}

async fn create_default_queue(ctx: &Ctx, concurrency: u32) {
    let api: Api<AxQueue> = Api::all(ctx.client.clone());
    let queue = AxQueue::new(
        DEFAULT_QUEUE,
        AxQueueSpec {
            concurrency: i32::try_from(concurrency).unwrap_or(i32::MAX),
            ..AxQueueSpec::default()
        },
    );
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, &queue).await {
        Ok(_) => info!(concurrency, "created the default AxQueue"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => warn!(error = %e, "creating the default AxQueue failed"),
    }
}

fn report_metrics(ctx: &Ctx, reports: &[QueueReport]) {
    ctx.metrics.set_queue_pending(reports.iter().flat_map(|r| {
        r.pending
            .iter()
            .map(move |(priority, n)| ((r.name.clone(), priority.as_str()), *n))
    }));
    ctx.metrics.set_queue_slots(
        reports
            .iter()
            .filter(|r| r.exists)
            .map(|r| (r.name.as_str(), r.running, r.concurrency)),
    );
    for report in reports {
        for task_type in &report.open_circuits {
            ctx.metrics.set_circuit_open(&report.name, task_type, true);
        }
        let closed = ctx
            .queues
            .lock()
            .circuits_reported(&report.name, &report.open_circuits);
        for task_type in closed {
            ctx.metrics
                .set_circuit_open(&report.name, &task_type, false);
        }
    }
}

/// The status a queue should show: the report's counts, and the `InvalidSpec` condition, whose
/// transition time moves only when its value does.
pub fn queue_status(report: &QueueReport, before: &AxQueueStatus, now: Timestamp) -> AxQueueStatus {
    let count = |priority: Priority| {
        report
            .pending
            .iter()
            .find(|(p, _)| *p == priority)
            .map_or(0, |(_, n)| i64::try_from(*n).unwrap_or(i64::MAX))
    };
    let (value, reason, message) = match &report.invalid {
        Some(problem) => (
            "True",
            "InvalidSpec",
            format!("{problem}; the previous configuration stays in force"),
        ),
        None => ("False", "Valid", String::new()),
    };
    let previous = before.conditions.iter().find(|c| c.type_ == "InvalidSpec");
    let last_transition_time = previous
        .filter(|c| c.status == value)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    let mut conditions: Vec<Condition> = before
        .conditions
        .iter()
        .filter(|c| c.type_ != "InvalidSpec")
        .cloned()
        .collect();
    conditions.push(Condition {
        type_: "InvalidSpec".into(),
        status: value.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: report.generation,
    });
    AxQueueStatus {
        pending: PendingCounts {
            critical: count(Priority::Critical),
            high: count(Priority::High),
            normal: count(Priority::Normal),
            low: count(Priority::Low),
        },
        running: i64::try_from(report.running).unwrap_or(i64::MAX),
        open_circuit_count: i64::try_from(report.open_circuits.len()).unwrap_or(i64::MAX),
        open_circuits: report.open_circuits.clone(),
        dispatched: report.dispatched,
        dead: report.dead,
        retry_tokens: i64::from(report.retry_tokens),
        conditions,
        observed_generation: report.generation,
    }
}

async fn write_queue_status(ctx: &Ctx, name: &str, status: &AxQueueStatus) -> super::Result<()> {
    let api: Api<AxQueue> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "apiVersion": AxQueue::api_version(&()),
        "kind": AxQueue::kind(&()),
        "metadata": { "name": name },
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Writes the held reason of every waiting task whose `Queued` condition says otherwise. Runs after
/// the dispatch loop found nothing more to dispatch, so a reason describes a settled state, not a
/// slot that is about to be filled. One write per task whose reason changed, never per tick.
pub async fn write_held_reasons(ctx: Ctx, held: Vec<Held>) {
    let now = Timestamp::now();
    let writes: Vec<(Arc<AxTask>, crate::api::AxTaskStatus)> = held
        .into_iter()
        .filter_map(|h| {
            let task = ctx.tasks.get(&ObjectRef::new(&h.key.1).within(&h.key.0))?;
            let status = task.status.as_ref()?;
            if status.phase != Some(TaskPhase::Pending) {
                return None;
            }
            let updated = core_task::held(status, h.reason, &h.message, now)?;
            Some((task, updated))
        })
        .collect();
    if writes.is_empty() {
        return;
    }
    debug!(tasks = writes.len(), "writing held reasons");
    futures::stream::iter(writes)
        .for_each_concurrent(HELD_WRITES_AT_ONCE, |(task, status)| {
            let ctx = ctx.clone();
            async move {
                // Conditional on the cached resourceVersion: a task that moved on meanwhile is
                // left alone, and its next refresh looks again.
                match write_status(&task, &status, &ctx).await {
                    Ok(_) => {}
                    Err(super::Error::Kube(kube::Error::Api(e)))
                        if e.code == 409 || e.code == 404 => {}
                    Err(e) => debug!(error = %e, "writing held reason failed"),
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CircuitBreakerSpec, MaxWaitSeconds, WeightScheduleEntry};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_900_000_000 + secs).expect("in range")
    }

    fn key(name: &str) -> TaskKey {
        ("ns".to_string(), name.to_string())
    }

    fn pending(priority: Priority, task_type: &str, at: i64, attempt: u32) -> PendingTask {
        PendingTask {
            priority,
            task_type: task_type.into(),
            queued_at: t(at),
            attempt,
        }
    }

    fn queue(name: &str, spec: AxQueueSpec, status: Option<AxQueueStatus>) -> AxQueue {
        let mut q = AxQueue::new(name, spec);
        q.metadata.generation = Some(1);
        q.status = status;
        q
    }

    #[test]
    fn spec_defaults_match_the_design() {
        let spec: AxQueueSpec = serde_json::from_value(serde_json::json!({})).expect("empty spec");
        let config = queue_config(&spec).expect("defaults are valid");
        assert_eq!(config, QueueConfig::default());
        let partial: AxQueueSpec = serde_json::from_value(
            serde_json::json!({"weights": {"low": 5}, "maxWaitSeconds": {"low": 0}}),
        )
        .expect("partial spec");
        let config = queue_config(&partial).expect("valid");
        assert_eq!(
            config.weights,
            Weights {
                critical: 4,
                high: 3,
                normal: 2,
                low: 5
            }
        );
        assert_eq!(config.max_wait.low, None);
        assert_eq!(config.max_wait.normal, Some(SignedDuration::from_secs(30)));
    }

    #[test]
    fn specs_the_schema_cannot_check_are_rejected_with_the_field() {
        let window = |from: &str, to: &str, tz: &str| WeightScheduleEntry {
            from: from.into(),
            to: to.into(),
            time_zone: tz.into(),
            weights: QueueWeights::default(),
        };
        let cases = [
            (
                AxQueueSpec {
                    weight_schedule: vec![window("22:00", "06:00", "Mars/Olympus")],
                    ..AxQueueSpec::default()
                },
                "spec.weightSchedule[0]",
            ),
            (
                AxQueueSpec {
                    weight_schedule: vec![
                        window("22:00", "06:00", "Europe/Berlin"),
                        window("25:00", "06:00", "UTC"),
                    ],
                    ..AxQueueSpec::default()
                },
                "spec.weightSchedule[1]",
            ),
            (
                AxQueueSpec {
                    weights: QueueWeights {
                        critical: 0,
                        high: 0,
                        normal: 0,
                        low: 0,
                    },
                    max_wait_seconds: MaxWaitSeconds {
                        critical: 0,
                        high: 0,
                        normal: 0,
                        low: 0,
                    },
                    ..AxQueueSpec::default()
                },
                "spec.weights are all 0",
            ),
            (
                AxQueueSpec {
                    circuit_breaker: CircuitBreakerSpec {
                        failure_ratio: 0.0,
                        ..CircuitBreakerSpec::default()
                    },
                    ..AxQueueSpec::default()
                },
                "failureRatio",
            ),
            (
                AxQueueSpec {
                    type_concurrency: [("resize".to_string(), -1)].into(),
                    ..AxQueueSpec::default()
                },
                "spec.typeConcurrency[resize]",
            ),
        ];
        for (spec, field) in cases {
            let problem = queue_config(&spec).expect_err("invalid");
            assert!(problem.contains(field), "{problem:?} should name {field}");
        }
        // All weights 0 is fine while a max-wait still lets tasks through.
        let only_max_wait = AxQueueSpec {
            weights: QueueWeights {
                critical: 0,
                high: 0,
                normal: 0,
                low: 0,
            },
            ..AxQueueSpec::default()
        };
        assert!(queue_config(&only_max_wait).is_ok());
    }

    #[test]
    fn tasks_of_a_missing_queue_wait_until_it_exists() {
        let mut registry = Registry::default();
        registry.upsert(
            &key("a"),
            "batch",
            pending(Priority::High, "x", 0, 1),
            Some(1),
        );
        assert_eq!(registry.next(t(1)), None);
        let held = registry.held(t(1));
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].reason, "QueueNotFound");
        assert_eq!(
            registry.configure(&queue("batch", AxQueueSpec::default(), None), t(2)),
            None
        );
        assert_eq!(registry.next(t(2)), Some((key("a"), "batch".to_string())));
        // Deleted while the task runs: the slot is still counted, and freed when it finishes.
        registry.queue_deleted("batch");
        assert!(registry.is_running(&key("a")));
        assert!(registry.finished(&key("a"), Outcome::Succeeded, t(3)));
        assert!(
            registry.reports(t(3)).is_empty(),
            "an unused missing queue is forgotten"
        );
    }

    #[test]
    fn invalid_edit_keeps_the_previous_config_and_reports_once() {
        let mut registry = Registry::default();
        let mut spec = AxQueueSpec {
            concurrency: 1,
            ..AxQueueSpec::default()
        };
        assert_eq!(
            registry.configure(&queue("q", spec.clone(), None), t(0)),
            None
        );
        spec.concurrency = 5;
        spec.weight_schedule = vec![WeightScheduleEntry {
            from: "7:00".into(),
            to: "08:00".into(),
            time_zone: "UTC".into(),
            weights: QueueWeights::default(),
        }];
        let problem = registry.configure(&queue("q", spec.clone(), None), t(1));
        assert!(problem.is_some_and(|p| p.contains("7:00")));
        assert_eq!(
            registry.configure(&queue("q", spec, None), t(2)),
            None,
            "reported once"
        );
        for name in ["a", "b"] {
            registry.upsert(
                &key(name),
                "q",
                pending(Priority::Normal, "x", 0, 1),
                Some(1),
            );
        }
        assert!(registry.next(t(3)).is_some());
        assert_eq!(registry.next(t(3)), None, "concurrency 1 still in force");
        let report = &registry.reports(t(3))[0];
        assert!(report.invalid.is_some());
        let status = queue_status(report, &AxQueueStatus::default(), t(3));
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == "InvalidSpec")
            .expect("condition");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "InvalidSpec")
        );
    }

    #[test]
    fn a_queue_never_valid_holds_its_tasks() {
        let mut registry = Registry::default();
        let spec = AxQueueSpec {
            weight_schedule: vec![WeightScheduleEntry {
                from: "22:00".into(),
                to: "06:00".into(),
                time_zone: "Nowhere/Land".into(),
                weights: QueueWeights::default(),
            }],
            ..AxQueueSpec::default()
        };
        assert!(registry.configure(&queue("q", spec, None), t(0)).is_some());
        registry.upsert(
            &key("a"),
            "q",
            pending(Priority::Normal, "x", 0, 1),
            Some(1),
        );
        assert_eq!(registry.next(t(1)), None);
        assert_eq!(registry.held(t(1))[0].reason, "QueueInvalid");
        assert!(
            registry
                .configure(&queue("q", AxQueueSpec::default(), None), t(2))
                .is_none()
        );
        assert!(registry.next(t(2)).is_some());
    }

    #[test]
    fn stale_pending_copies_do_not_undo_a_dispatch() {
        let mut registry = Registry::default();
        registry.configure(&queue("q", AxQueueSpec::default(), None), t(0));
        registry.upsert(
            &key("a"),
            "q",
            pending(Priority::Normal, "x", 0, 1),
            Some(10),
        );
        assert!(registry.next(t(1)).is_some());
        // While the dispatch is being written, and after it wrote version 12.
        assert!(!registry.upsert(
            &key("a"),
            "q",
            pending(Priority::Normal, "x", 0, 1),
            Some(10)
        ));
        registry.dispatch_written(&key("a"), Some(12));
        assert!(!registry.upsert(
            &key("a"),
            "q",
            pending(Priority::Normal, "x", 0, 1),
            Some(11)
        ));
        assert!(registry.is_running(&key("a")));
        // A newer Pending version is a new attempt (the dispatch was undone by someone else).
        assert!(registry.upsert(
            &key("a"),
            "q",
            pending(Priority::Normal, "x", 0, 2),
            Some(13)
        ));
        assert!(!registry.is_running(&key("a")));
    }

    #[test]
    fn marking_running_twice_keeps_a_probe() {
        let mut registry = Registry::default();
        let spec = AxQueueSpec {
            circuit_breaker: CircuitBreakerSpec {
                window_size: 2,
                min_requests: 2,
                failure_ratio: 0.5,
                open_seconds: 10,
            },
            ..AxQueueSpec::default()
        };
        registry.configure(&queue("q", spec, None), t(0));
        for name in ["a", "b", "c", "d"] {
            registry.upsert(
                &key(name),
                "q",
                pending(Priority::Normal, "x", 0, 1),
                Some(1),
            );
        }
        for _ in 0..2 {
            let (k, _) = registry.next(t(0)).expect("dispatch");
            registry.finished(&k, Outcome::Failed, t(0));
        }
        assert_eq!(
            registry.reports(t(0))[0].open_circuits,
            vec!["x".to_string()]
        );
        assert_eq!(
            registry
                .held(t(1))
                .iter()
                .filter(|h| h.reason == "CircuitOpen")
                .count(),
            2
        );
        let (probe, _) = registry.next(t(10)).expect("the probe");
        // The reconciler sees the probe Scheduled, then Running: it stays the only probe.
        registry.mark_running(&probe, "q", "x");
        registry.mark_running(&probe, "q", "x");
        assert_eq!(registry.next(t(10)), None);
        registry.finished(&probe, Outcome::Succeeded, t(11));
        assert!(registry.reports(t(11))[0].open_circuits.is_empty());
        assert!(registry.next(t(11)).is_some());
    }

    #[test]
    fn totals_continue_from_the_status_of_an_earlier_leader() {
        let mut registry = Registry::default();
        let status = AxQueueStatus {
            dispatched: 40,
            dead: 3,
            ..AxQueueStatus::default()
        };
        registry.configure(&queue("q", AxQueueSpec::default(), Some(status)), t(0));
        registry.upsert(&key("a"), "q", pending(Priority::Low, "x", 0, 1), Some(1));
        registry.next(t(0));
        registry.dispatch_written(&key("a"), Some(2));
        registry.count_dead("q");
        let report = &registry.reports(t(0))[0];
        assert_eq!((report.dispatched, report.dead), (41, 4));
        assert_eq!(report.running, 1);
    }

    #[test]
    fn a_task_moved_to_another_queue_leaves_the_old_one() {
        let mut registry = Registry::default();
        registry.configure(&queue("a", AxQueueSpec::default(), None), t(0));
        registry.configure(&queue("b", AxQueueSpec::default(), None), t(0));
        registry.upsert(&key("x"), "a", pending(Priority::Low, "x", 0, 1), Some(1));
        registry.upsert(&key("x"), "b", pending(Priority::Low, "x", 0, 1), Some(2));
        let reports = registry.reports(t(0));
        let pending_of = |name: &str| {
            reports
                .iter()
                .find(|r| r.name == name)
                .map(|r| r.pending.iter().map(|(_, n)| n).sum::<usize>())
        };
        assert_eq!((pending_of("a"), pending_of("b")), (Some(0), Some(1)));
    }

    #[test]
    fn rebuild_counts_tasks_in_flight_before_dispatching_more() {
        let task = |name: &str, phase: TaskPhase, next_attempt: Option<i64>| -> Arc<AxTask> {
            let mut task: AxTask = serde_json::from_value(serde_json::json!({
                "apiVersion": "ax.dev/v1alpha1",
                "kind": "AxTask",
                "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"},
                "spec": {"type": "x", "queue": "q", "template": {"spec": {"containers": []}}},
            }))
            .expect("a task");
            task.status = Some(crate::api::AxTaskStatus {
                phase: Some(phase),
                queued_at: Some(t(0)),
                next_attempt_at: next_attempt.map(t),
                ..Default::default()
            });
            Arc::new(task)
        };
        let tasks = [
            task("scheduled", TaskPhase::Scheduled, None),
            task("running", TaskPhase::Running, None),
            task("ready", TaskPhase::Pending, None),
            task("backoff", TaskPhase::Pending, Some(100)),
            task("done", TaskPhase::Succeeded, None),
        ];
        let mut registry = Registry::default();
        let spec = AxQueueSpec {
            concurrency: 3,
            ..AxQueueSpec::default()
        };
        registry.configure(&queue("q", spec, None), t(0));
        assert_eq!(rebuild(&mut registry, &tasks, t(10)), (2, 1));
        assert!(registry.is_running(&key("scheduled")) && registry.is_running(&key("running")));
        // One slot of three is left: the ready task takes it, nothing more goes.
        assert_eq!(registry.next(t(10)), Some((key("ready"), "q".to_string())));
        assert_eq!(registry.next(t(10)), None);
        // Rebuilding again (a re-list) changes nothing.
        rebuild(&mut registry, &tasks, t(11));
        assert_eq!(registry.reports(t(11))[0].running, 3);
    }

    #[test]
    fn a_deleted_queue_reports_its_circuits_closed_and_is_forgotten() {
        let mut registry = Registry::default();
        let spec = AxQueueSpec {
            circuit_breaker: CircuitBreakerSpec {
                window_size: 1,
                min_requests: 1,
                failure_ratio: 1.0,
                open_seconds: 60,
            },
            ..AxQueueSpec::default()
        };
        registry.configure(&queue("q", spec, None), t(0));
        registry.upsert(&key("a"), "q", pending(Priority::Low, "x", 0, 1), Some(1));
        registry.next(t(0));
        registry.finished(&key("a"), Outcome::Failed, t(0));
        let open = registry.reports(t(1))[0].open_circuits.clone();
        assert_eq!(open, vec!["x".to_string()]);
        assert!(registry.circuits_reported("q", &open).is_empty());
        registry.queue_deleted("q");
        let report = registry.reports(t(2))[0].clone();
        assert!(!report.exists && report.open_circuits.is_empty());
        assert_eq!(
            registry.circuits_reported("q", &report.open_circuits),
            vec!["x".to_string()]
        );
        assert!(registry.reports(t(3)).is_empty());
    }

    #[test]
    fn queues_take_turns() {
        let mut registry = Registry::default();
        for name in ["a", "b"] {
            registry.configure(&queue(name, AxQueueSpec::default(), None), t(0));
            for i in 0..2 {
                registry.upsert(
                    &key(&format!("{name}{i}")),
                    name,
                    pending(Priority::Low, "x", i, 1),
                    Some(1),
                );
            }
        }
        let served: Vec<String> =
            std::iter::from_fn(|| registry.next(t(1)).map(|(_, q)| q)).collect();
        assert_eq!(served, vec!["a", "b", "a", "b"]);
    }
}
