//! The operator's Prometheus metrics (DESIGN §6), encoded in the OpenMetrics text format for `/metrics`.
//!
//! Label values are short categories (phase names, failure kinds, reason codes), never free text:
//! every distinct value is a new time series. The one free-form label, a task's `type`, is capped:
//! the first `max_types` distinct types keep their name, later ones are reported as `other`.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::process::ProcessCollector;

/// `--metrics-max-types` when not given.
pub const DEFAULT_MAX_TYPES: usize = 100;

/// `Content-Type` of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// 1 ms … 10 s: dispatch latency and reconcile duration.
const FAST_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// 10 ms … 1 h: how long a task waited in its queue bucket.
const WAIT_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// 100 ms … 1 day: how long a task ran.
const TASK_DURATION_BUCKETS: [f64; 13] = [
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskCountLabels {
    pub queue: String,
    pub r#type: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub from: String,
    pub to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub r#type: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub r#type: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeadLabels {
    pub r#type: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub queue: String,
}

/// A queue's tenant: a namespace, or `other` for the tenants beyond the top ones.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueKeyLabels {
    pub queue: String,
    pub key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueuePriorityLabels {
    pub queue: String,
    pub priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CircuitLabels {
    pub queue: String,
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    pub controller: String,
    /// The step that failed (`write_status`, `create_pod`, ...).
    pub step: String,
    /// `invalid_object`, `throttled`, `stale`, `forbidden` or `transient`.
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfoLabels {
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CronFiringLabels {
    /// The kind of child created: `AxTask` or `AxDag`.
    pub kind: String,
    /// `true` for a catch-up run of a missed time, `false` for the regular one.
    pub catch_up: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeOnlyLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` (see `ops::api_requests`).
    pub verb: String,
    /// The HTTP status code, or `error` when no response came.
    pub code: String,
}

/// The value reported for task types beyond the cap.
pub const OTHER_TYPE: &str = "other";

/// The values the free-form `type` label may take: the first `max` distinct types seen keep their
/// name for the life of the process, every later one is `other`. First-seen rather than most
/// frequent, so a series never changes its meaning (a counter never moves between labels).
#[derive(Debug)]
pub struct TypeCap {
    max: usize,
    admitted: HashSet<String>,
}

impl TypeCap {
    pub fn new(max: usize) -> Self {
        TypeCap {
            max,
            admitted: HashSet::new(),
        }
    }

    /// The label value for `task_type`, admitting it while there is room.
    pub fn label<'a>(&mut self, task_type: &'a str) -> &'a str {
        if self.admitted.contains(task_type) {
            return task_type;
        }
        if self.admitted.len() < self.max {
            self.admitted.insert(task_type.to_owned());
            return task_type;
        }
        OTHER_TYPE
    }
}

/// A gauge family whose whole content is recomputed from a snapshot: series missing from the
/// latest snapshot are removed, so a phase that emptied disappears instead of keeping its old count.
#[derive(Debug)]
struct SnapshotGauges<L: Clone + Hash + Eq> {
    family: Family<L, Gauge>,
    present: Mutex<HashSet<L>>,
}

impl<L> SnapshotGauges<L>
where
    L: Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    fn new() -> Self {
        SnapshotGauges {
            family: Family::default(),
            present: Mutex::new(HashSet::new()),
        }
    }

    /// Repeated label sets are summed.
    fn replace(&self, snapshot: impl IntoIterator<Item = (L, usize)>) {
        let mut totals: HashMap<L, i64> = HashMap::new();
        for (labels, count) in snapshot {
            let total = totals.entry(labels).or_default();
            *total = total.saturating_add(i64::try_from(count).unwrap_or(i64::MAX));
        }
        // One writer at a time; a concurrent scrape sees old or new values, never an empty family.
        let mut present = self.present.lock().unwrap_or_else(PoisonError::into_inner);
        for (labels, total) in &totals {
            self.family.get_or_create(labels).set(*total);
        }
        for stale in present
            .iter()
            .filter(|labels| !totals.contains_key(*labels))
        {
            self.family.remove(stale);
        }
        *present = totals.into_keys().collect();
    }
}

/// Every metric of the operator, registered once. Share it as `Arc<Metrics>`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tasks: SnapshotGauges<TaskCountLabels>,
    transitions: Family<TransitionLabels, Counter>,
    dispatch_latency: Family<QueueLabels, Histogram>,
    task_duration: Family<OutcomeLabels, Histogram>,
    retries: Family<RetryLabels, Counter>,
    dead_tasks: Family<DeadLabels, Counter>,
    queue_pending: SnapshotGauges<QueuePriorityLabels>,
    queue_wait: Family<QueuePriorityLabels, Histogram>,
    queue_running: SnapshotGauges<QueueLabels>,
    queue_concurrency: SnapshotGauges<QueueLabels>,
    queue_effective_concurrency: SnapshotGauges<QueueLabels>,
    queue_key_running: SnapshotGauges<QueueKeyLabels>,
    preemptions: Family<QueueLabels, Counter>,
    queue_key_waiting: SnapshotGauges<QueueKeyLabels>,
    circuit_open: Family<CircuitLabels, Gauge>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    leader: Gauge,
    build_info: Family<BuildInfoLabels, Gauge>,
    cron_firings: Family<CronFiringLabels, Counter>,
    cron_missed: Family<ReasonLabels, Counter>,
    cron_concurrency_skips: Family<PolicyLabels, Counter>,
    callbacks: Family<OutcomeOnlyLabels, Counter>,
    callback_failures: Family<ClassLabels, Counter>,
    kubernetes_requests: Family<RequestLabels, Counter>,
    trace_spans_exported: Counter,
    trace_spans_dropped: Counter,
    task_types: Mutex<TypeCap>,
    /// Per queue, the capped (`other`) types whose circuit is open: their one `other` series shows
    /// 1 while any of them is open, so one type closing does not hide another still open.
    open_other_circuits: Mutex<HashMap<String, HashSet<String>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn fast_histogram() -> Histogram {
    Histogram::new(FAST_BUCKETS)
}

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

fn task_duration_histogram() -> Histogram {
    Histogram::new(TASK_DURATION_BUCKETS)
}

impl Metrics {
    /// With at most [`DEFAULT_MAX_TYPES`] distinct task types.
    pub fn new() -> Self {
        Self::with_max_types(DEFAULT_MAX_TYPES)
    }

    /// With at most `max_types` distinct values of the `type` label (later types are `other`).
    pub fn with_max_types(max_types: usize) -> Self {
        let metrics = Metrics {
            registry: Registry::default(),
            tasks: SnapshotGauges::new(),
            transitions: Family::default(),
            dispatch_latency: Family::new_with_constructor(fast_histogram),
            task_duration: Family::new_with_constructor(task_duration_histogram),
            retries: Family::default(),
            dead_tasks: Family::default(),
            queue_pending: SnapshotGauges::new(),
            queue_wait: Family::new_with_constructor(wait_histogram),
            queue_running: SnapshotGauges::new(),
            queue_key_running: SnapshotGauges::new(),
            preemptions: Family::default(),
            queue_key_waiting: SnapshotGauges::new(),
            queue_concurrency: SnapshotGauges::new(),
            queue_effective_concurrency: SnapshotGauges::new(),
            circuit_open: Family::default(),
            reconcile_duration: Family::new_with_constructor(fast_histogram),
            reconcile_errors: Family::default(),
            leader: Gauge::default(),
            build_info: Family::default(),
            cron_firings: Family::default(),
            cron_missed: Family::default(),
            cron_concurrency_skips: Family::default(),
            callbacks: Family::default(),
            callback_failures: Family::default(),
            kubernetes_requests: Family::default(),
            trace_spans_exported: Counter::default(),
            trace_spans_dropped: Counter::default(),
            task_types: Mutex::new(TypeCap::new(max_types)),
            open_other_circuits: Mutex::new(HashMap::new()),
        };
        metrics
            .build_info
            .get_or_create(&BuildInfoLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        metrics.register()
    }

    /// The `type` label value of `task_type`, capped.
    fn type_label(&self, task_type: &str) -> String {
        lock(&self.task_types).label(task_type).to_owned()
    }

    fn register(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "ax_tasks",
            "AxTasks by queue, type and phase, from the informer cache",
            self.tasks.family.clone(),
        );
        r.register(
            "ax_task_transitions",
            "Phase transitions written by the operator",
            self.transitions.clone(),
        );
        r.register(
            "ax_dispatch_latency_seconds",
            "Time from queuedAt to the worker pod being created, by queue",
            self.dispatch_latency.clone(),
        );
        r.register(
            "ax_task_duration_seconds",
            "Run time of finished attempts by type and outcome phase",
            self.task_duration.clone(),
        );
        r.register(
            "ax_retries",
            "Attempts re-queued after a failure, by type and failure kind",
            self.retries.clone(),
        );
        r.register(
            "ax_dead_tasks",
            "Tasks that went Dead, by type and reason",
            self.dead_tasks.clone(),
        );
        r.register(
            "ax_queue_pending",
            "Tasks waiting in each queue bucket",
            self.queue_pending.family.clone(),
        );
        r.register(
            "ax_queue_wait_seconds",
            "Time a task waited in its queue bucket before dispatch",
            self.queue_wait.clone(),
        );
        r.register(
            "ax_queue_running",
            "Tasks of each queue holding a concurrency slot (Scheduled or Running)",
            self.queue_running.family.clone(),
        );
        r.register(
            "ax_queue_concurrency",
            "Concurrency limit in force for each queue (0 pauses it)",
            self.queue_concurrency.family.clone(),
        );
        r.register(
            "ax_queue_effective_concurrency",
            "Concurrency the dispatcher applies now: ax_queue_concurrency, or less while concurrencyPolicy Adaptive holds the queue lower",
            self.queue_effective_concurrency.family.clone(),
        );
        r.register(
            "ax_preemptions",
            "Running attempts a queue stopped for waiting tasks of higher priority (preemption LowerPriority)",
            self.preemptions.clone(),
        );
        r.register(
            "ax_queue_key_running",
            "Tasks of each queue's top namespaces holding a slot (queues with fairness, keyConcurrency or keyRate; the rest as key=\"other\")",
            self.queue_key_running.family.clone(),
        );
        r.register(
            "ax_queue_key_waiting",
            "Tasks of each queue's top namespaces waiting for dispatch (the rest as key=\"other\")",
            self.queue_key_waiting.family.clone(),
        );
        r.register(
            "ax_circuit_open",
            "1 while the circuit breaker of a queue and task type is open (or half-open)",
            self.circuit_open.clone(),
        );
        r.register(
            "ax_reconcile_duration_seconds",
            "Duration of one reconcile, by controller",
            self.reconcile_duration.clone(),
        );
        r.register(
            "ax_reconcile_errors",
            "Reconciles that returned an error, by controller, failed step and error category",
            self.reconcile_errors.clone(),
        );
        r.register(
            "ax_leader",
            "1 while this replica holds the ax-operator lease",
            self.leader.clone(),
        );
        r.register(
            "ax_build_info",
            "Always 1; the labels say which build of the operator runs",
            self.build_info.clone(),
        );
        r.register(
            "ax_cron_firings",
            "Children created by AxCrons at their scheduled times, by child kind and whether the run catches up a missed time",
            self.cron_firings.clone(),
        );
        r.register(
            "ax_cron_missed_times",
            "Scheduled times of AxCrons that did not run because they were missed (operator down, cron suspended, too late), by reason",
            self.cron_missed.clone(),
        );
        r.register(
            "ax_cron_concurrency_skips",
            "Scheduled times of AxCrons skipped by their concurrencyPolicy (Forbid: a child still active; Replace: superseded)",
            self.cron_concurrency_skips.clone(),
        );
        r.register(
            "ax_callbacks",
            "Finished callback deliveries by outcome: delivered, refused (destination not admitted, nothing sent) or failed",
            self.callbacks.clone(),
        );
        r.register(
            "ax_callback_failures",
            "Callback deliveries that failed after every attempt, by the class of the last attempt's failure",
            self.callback_failures.clone(),
        );
        r.register(
            "ax_kubernetes_requests",
            "Requests of the operator to the Kubernetes API, by verb and HTTP status code",
            self.kubernetes_requests.clone(),
        );
        r.register(
            "ax_trace_spans_exported",
            "Task spans the OTLP endpoint accepted",
            self.trace_spans_exported.clone(),
        );
        r.register(
            "ax_trace_spans_dropped",
            "Task spans dropped: the export queue was full, or the OTLP endpoint refused or could not be reached",
            self.trace_spans_dropped.clone(),
        );
        r.register_collector(Box::new(ProcessCollector));
        self
    }

    /// Replaces all of `ax_tasks` with `counts` of `((queue, type, phase), n)`: label sets absent from
    /// `counts` disappear.
    pub fn set_task_counts<Q, T, P>(&self, counts: impl IntoIterator<Item = ((Q, T, P), usize)>)
    where
        Q: AsRef<str>,
        T: AsRef<str>,
        P: AsRef<str>,
    {
        self.tasks
            .replace(counts.into_iter().map(|((queue, task_type, phase), n)| {
                let labels = TaskCountLabels {
                    queue: queue.as_ref().to_owned(),
                    r#type: self.type_label(task_type.as_ref()),
                    phase: phase.as_ref().to_owned(),
                };
                (labels, n)
            }));
    }

    /// A task moved from phase `from` to phase `to` (`from` is `New` for a task's first phase).
    pub fn transition(&self, from: &str, to: &str) {
        self.transitions
            .get_or_create(&TransitionLabels {
                from: from.to_owned(),
                to: to.to_owned(),
            })
            .inc();
    }

    /// A worker pod of a task in `queue` was created `latency` after the task was queued.
    pub fn dispatched(&self, queue: &str, latency: Duration) {
        self.dispatch_latency
            .get_or_create(&QueueLabels {
                queue: queue.to_owned(),
            })
            .observe(latency.as_secs_f64());
    }

    /// An attempt of a task of `task_type` ended in phase `outcome` after running for `duration`.
    /// `queue` chose a running attempt to stop for a waiting task of higher priority.
    pub fn preempted(&self, queue: &str) {
        self.preemptions
            .get_or_create(&QueueLabels {
                queue: queue.to_owned(),
            })
            .inc();
    }

    pub fn task_finished(&self, task_type: &str, outcome: &str, duration: Duration) {
        self.task_duration
            .get_or_create(&OutcomeLabels {
                r#type: self.type_label(task_type),
                outcome: outcome.to_owned(),
            })
            .observe(duration.as_secs_f64());
    }

    /// A failed attempt was re-queued; `kind` is the failure kind (`Retryable`, `Infrastructure`, `Timeout`).
    pub fn retried(&self, task_type: &str, kind: &str) {
        self.retries
            .get_or_create(&RetryLabels {
                r#type: self.type_label(task_type),
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// A task went Dead; `reason` is a short code (e.g. `RetriesExhausted`, `NonRetryable`,
    /// `BudgetExceeded`, `InvalidSpec`), not the human-readable message.
    pub fn dead(&self, task_type: &str, reason: &str) {
        self.dead_tasks
            .get_or_create(&DeadLabels {
                r#type: self.type_label(task_type),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Replaces all of `ax_queue_pending` with `pending` of `((queue, priority), n)`.
    pub fn set_queue_pending<Q, P>(&self, pending: impl IntoIterator<Item = ((Q, P), usize)>)
    where
        Q: AsRef<str>,
        P: AsRef<str>,
    {
        self.queue_pending
            .replace(pending.into_iter().map(|((queue, priority), n)| {
                let labels = QueuePriorityLabels {
                    queue: queue.as_ref().to_owned(),
                    priority: priority.as_ref().to_owned(),
                };
                (labels, n)
            }));
    }

    /// Replaces all of `ax_queue_running` and `ax_queue_concurrency` with `slots` of
    /// `(queue, running, concurrency)`: queues absent from `slots` disappear from both.
    pub fn set_queue_slots<Q>(&self, slots: impl IntoIterator<Item = (Q, usize, u32)>)
    where
        Q: AsRef<str>,
    {
        let (running, concurrency): (Vec<_>, Vec<_>) = slots
            .into_iter()
            .map(|(queue, running, concurrency)| {
                let labels = QueueLabels {
                    queue: queue.as_ref().to_owned(),
                };
                let concurrency = usize::try_from(concurrency).unwrap_or(usize::MAX);
                ((labels.clone(), running), (labels, concurrency))
            })
            .unzip();
        self.queue_running.replace(running);
        self.queue_concurrency.replace(concurrency);
    }

    /// Replaces all of `ax_queue_effective_concurrency` with `(queue, effective concurrency)`.
    pub fn set_queue_effective_concurrency<Q>(&self, values: impl IntoIterator<Item = (Q, u32)>)
    where
        Q: AsRef<str>,
    {
        self.queue_effective_concurrency
            .replace(values.into_iter().map(|(queue, value)| {
                let labels = QueueLabels {
                    queue: queue.as_ref().to_owned(),
                };
                (labels, usize::try_from(value).unwrap_or(usize::MAX))
            }));
    }

    /// Replaces all of `ax_queue_key_running` and `ax_queue_key_waiting` with
    /// `(queue, key, running, waiting)`.
    pub fn set_queue_keys<'a>(
        &self,
        keys: impl IntoIterator<Item = (&'a str, &'a str, usize, usize)>,
    ) {
        let (running, waiting): (Vec<_>, Vec<_>) = keys
            .into_iter()
            .map(|(queue, key, running, waiting)| {
                let labels = QueueKeyLabels {
                    queue: queue.to_owned(),
                    key: key.to_owned(),
                };
                ((labels.clone(), running), (labels, waiting))
            })
            .unzip();
        self.queue_key_running.replace(running);
        self.queue_key_waiting.replace(waiting);
    }

    /// A task left its queue bucket after waiting `wait`.
    pub fn queue_waited(&self, queue: &str, priority: &str, wait: Duration) {
        self.queue_wait
            .get_or_create(&QueuePriorityLabels {
                queue: queue.to_owned(),
                priority: priority.to_owned(),
            })
            .observe(wait.as_secs_f64());
    }

    /// Records whether the circuit of (`queue`, `task_type`) is open; a closed circuit shows 0.
    pub fn set_circuit_open(&self, queue: &str, task_type: &str, open: bool) {
        let label = self.type_label(task_type);
        let shown = if label == OTHER_TYPE && task_type != OTHER_TYPE {
            let mut open_other = lock(&self.open_other_circuits);
            let types = open_other.entry(queue.to_owned()).or_default();
            if open {
                types.insert(task_type.to_owned());
            } else {
                types.remove(task_type);
            }
            !types.is_empty()
        } else {
            open
        };
        self.circuit_open
            .get_or_create(&CircuitLabels {
                queue: queue.to_owned(),
                r#type: label,
            })
            .set(i64::from(shown));
    }

    /// Starts timing one reconcile of `controller`; the duration is recorded when the guard drops,
    /// so every exit path (including `?` and panics) is counted.
    #[must_use = "the reconcile is timed until this guard is dropped"]
    pub fn reconcile_timer(&self, controller: &str) -> ReconcileTimer {
        ReconcileTimer {
            started: Instant::now(),
            labels: ControllerLabels {
                controller: controller.to_owned(),
            },
            durations: self.reconcile_duration.clone(),
        }
    }

    /// A reconcile of `controller` failed at `step` with an error of `category`.
    pub fn reconcile_error(&self, controller: &str, step: &str, category: &str) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                controller: controller.to_owned(),
                step: step.to_owned(),
                category: category.to_owned(),
            })
            .inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// An AxCron created a child of `kind` (`AxTask`, `AxDag`) for a scheduled time; `catch_up`
    /// for a missed time run late.
    pub fn cron_fired(&self, kind: &str, catch_up: bool) {
        self.cron_firings
            .get_or_create(&CronFiringLabels {
                kind: kind.to_owned(),
                catch_up: catch_up.to_string(),
            })
            .inc();
    }

    /// `count` scheduled times of an AxCron were missed and will not run, for `reason`.
    pub fn cron_missed(&self, reason: &str, count: u64) {
        self.cron_missed
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc_by(count);
    }

    /// `count` scheduled times of an AxCron were skipped by its concurrencyPolicy `policy`.
    pub fn cron_concurrency_skipped(&self, policy: &str, count: u64) {
        self.cron_concurrency_skips
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .inc_by(count);
    }

    /// A callback delivery finished with `outcome` (`delivered`, `refused`, `failed`); a failed one
    /// also counts under the `failure_class` of its last attempt.
    pub fn callback_finished(&self, outcome: &str, failure_class: Option<&str>) {
        self.callbacks
            .get_or_create(&OutcomeOnlyLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
        if let Some(class) = failure_class {
            self.callback_failures
                .get_or_create(&ClassLabels {
                    class: class.to_owned(),
                })
                .inc();
        }
    }

    /// `count` spans reached the OTLP endpoint.
    pub fn trace_spans_exported(&self, count: u64) {
        self.trace_spans_exported.inc_by(count);
    }

    /// `count` spans were dropped (queue full, endpoint down or refusing).
    pub fn trace_spans_dropped(&self, count: u64) {
        self.trace_spans_dropped.inc_by(count);
    }

    /// The operator sent a `verb` request to the Kubernetes API and got `code`.
    pub fn kubernetes_request(&self, verb: &str, code: &str) {
        self.kubernetes_requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                code: code.to_owned(),
            })
            .inc();
    }

    /// All metrics in the OpenMetrics text format (serve with [`OPENMETRICS_CONTENT_TYPE`]).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Observes the time since [`Metrics::reconcile_timer`] into `ax_reconcile_duration_seconds` on drop.
#[derive(Debug)]
pub struct ReconcileTimer {
    started: Instant,
    labels: ControllerLabels,
    durations: Family<ControllerLabels, Histogram>,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.durations
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line that starts with `series` followed by a space.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            value.split(' ').next()?.parse().ok()
        })
    }

    #[test]
    fn encode_contains_every_metric_of_the_design() {
        let metrics = Metrics::new();
        metrics.set_task_counts([(("default", "resize", "Pending"), 2)]);
        metrics.transition("Pending", "Scheduled");
        metrics.dispatched("default", Duration::from_millis(20));
        metrics.task_finished("resize", "Succeeded", Duration::from_secs(3));
        metrics.retried("resize", "Retryable");
        metrics.dead("resize", "RetriesExhausted");
        metrics.set_queue_pending([(("default", "Normal"), 1)]);
        metrics.queue_waited("default", "Normal", Duration::from_millis(5));
        metrics.set_queue_slots([("default", 3, 10)]);
        metrics.set_queue_effective_concurrency([("default", 4)]);
        metrics.set_circuit_open("default", "resize", true);
        metrics.preempted("default");
        metrics.set_queue_keys([("default", "team-a", 2, 40), ("default", "other", 1, 3)]);
        drop(metrics.reconcile_timer("axtask"));
        metrics.reconcile_error("axtask", "write_status", "stale");
        metrics.set_leader(true);
        metrics.cron_fired("AxTask", false);
        metrics.cron_missed("MisfireSkip", 3);
        metrics.cron_concurrency_skipped("Forbid", 1);
        metrics.callback_finished("failed", Some("status_5xx"));
        metrics.kubernetes_request("patch", "409");
        let text = metrics.encode().expect("encode");

        for (kind, name) in [
            ("gauge", "ax_tasks"),
            ("counter", "ax_task_transitions"),
            ("histogram", "ax_dispatch_latency_seconds"),
            ("histogram", "ax_task_duration_seconds"),
            ("counter", "ax_retries"),
            ("counter", "ax_dead_tasks"),
            ("gauge", "ax_queue_pending"),
            ("histogram", "ax_queue_wait_seconds"),
            ("gauge", "ax_queue_running"),
            ("gauge", "ax_queue_concurrency"),
            ("gauge", "ax_queue_effective_concurrency"),
            ("gauge", "ax_circuit_open"),
            ("counter", "ax_preemptions"),
            ("gauge", "ax_queue_key_running"),
            ("gauge", "ax_queue_key_waiting"),
            ("histogram", "ax_reconcile_duration_seconds"),
            ("counter", "ax_reconcile_errors"),
            ("gauge", "ax_leader"),
            ("gauge", "ax_build_info"),
            ("counter", "ax_cron_firings"),
            ("counter", "ax_cron_missed_times"),
            ("counter", "ax_cron_concurrency_skips"),
            ("counter", "ax_callbacks"),
            ("counter", "ax_callback_failures"),
            ("counter", "ax_kubernetes_requests"),
            ("counter", "ax_trace_spans_exported"),
            ("counter", "ax_trace_spans_dropped"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} ({kind}) missing from:\n{text}"
            );
        }
        for series in [
            r#"ax_tasks{queue="default",type="resize",phase="Pending"}"#,
            r#"ax_task_transitions_total{from="Pending",to="Scheduled"}"#,
            r#"ax_dispatch_latency_seconds_count{queue="default"}"#,
            r#"ax_task_duration_seconds_count{type="resize",outcome="Succeeded"}"#,
            r#"ax_retries_total{type="resize",kind="Retryable"}"#,
            r#"ax_dead_tasks_total{type="resize",reason="RetriesExhausted"}"#,
            r#"ax_queue_pending{queue="default",priority="Normal"}"#,
            r#"ax_queue_wait_seconds_count{queue="default",priority="Normal"}"#,
            r#"ax_queue_running{queue="default"}"#,
            r#"ax_queue_concurrency{queue="default"}"#,
            r#"ax_queue_effective_concurrency{queue="default"}"#,
            r#"ax_circuit_open{queue="default",type="resize"}"#,
            r#"ax_preemptions_total{queue="default"}"#,
            r#"ax_queue_key_running{queue="default",key="team-a"}"#,
            r#"ax_queue_key_waiting{queue="default",key="other"}"#,
            r#"ax_reconcile_duration_seconds_count{controller="axtask"}"#,
            r#"ax_reconcile_errors_total{controller="axtask",step="write_status",category="stale"}"#,
            "ax_leader",
            r#"ax_cron_firings_total{kind="AxTask",catch_up="false"}"#,
            r#"ax_cron_missed_times_total{reason="MisfireSkip"}"#,
            r#"ax_cron_concurrency_skips_total{policy="Forbid"}"#,
            r#"ax_callbacks_total{outcome="failed"}"#,
            r#"ax_callback_failures_total{class="status_5xx"}"#,
            r#"ax_kubernetes_requests_total{verb="patch",code="409"}"#,
        ] {
            assert!(
                sample(&text, series).is_some(),
                "{series} missing from:\n{text}"
            );
        }
        assert_eq!(sample(&text, "ax_leader"), Some(1.0));
        assert_eq!(
            sample(
                &text,
                r#"ax_queue_key_waiting{queue="default",key="team-a"}"#
            ),
            Some(40.0)
        );
        assert_eq!(
            sample(&text, r#"ax_cron_missed_times_total{reason="MisfireSkip"}"#),
            Some(3.0)
        );
        let build = format!(
            r#"ax_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(&text, &build), Some(1.0), "{text}");
        assert!(text.ends_with("# EOF\n"), "not OpenMetrics:\n{text}");
    }

    #[test]
    fn histogram_counts_equal_observations() {
        let metrics = Metrics::new();
        for millis in [1, 7, 300, 12_000] {
            metrics.dispatched("q", Duration::from_millis(millis));
        }
        metrics.dispatched("other", Duration::from_millis(1));
        metrics.queue_waited("q", "High", Duration::from_secs(1));
        metrics.queue_waited("q", "High", Duration::from_secs(2));
        metrics.queue_waited("q", "Low", Duration::from_secs(3));
        for _ in 0..3 {
            let _timer = metrics.reconcile_timer("axqueue");
        }
        let text = metrics.encode().expect("encode");

        assert_eq!(
            sample(&text, r#"ax_dispatch_latency_seconds_count{queue="q"}"#),
            Some(4.0)
        );
        assert_eq!(
            sample(&text, r#"ax_dispatch_latency_seconds_count{queue="other"}"#),
            Some(1.0)
        );
        let sum = sample(&text, r#"ax_dispatch_latency_seconds_sum{queue="q"}"#).expect("sum");
        assert!((sum - 12.308).abs() < 1e-9, "sum {sum}");
        // Buckets are cumulative: 1 ms and 7 ms are under 10 ms; 12 s only lands in +Inf.
        assert_eq!(
            sample(
                &text,
                r#"ax_dispatch_latency_seconds_bucket{le="0.01",queue="q"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_dispatch_latency_seconds_bucket{le="10.0",queue="q"}"#
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_dispatch_latency_seconds_bucket{le="+Inf",queue="q"}"#
            ),
            Some(4.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_queue_wait_seconds_count{queue="q",priority="High"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_queue_wait_seconds_count{queue="q",priority="Low"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_reconcile_duration_seconds_count{controller="axqueue"}"#
            ),
            Some(3.0)
        );
    }

    #[test]
    fn set_task_counts_replaces_the_whole_family() {
        let metrics = Metrics::new();
        metrics.set_task_counts([
            (("default", "resize", "Pending"), 3),
            (("default", "resize", "Running"), 2),
            (("batch", "etl", "Running"), 1),
        ]);
        metrics.set_task_counts([
            (("default", "resize", "Running"), 4),
            (("default", "resize", "Succeeded"), 1),
            (("default", "resize", "Succeeded"), 2),
        ]);
        let text = metrics.encode().expect("encode");

        assert_eq!(
            sample(
                &text,
                r#"ax_tasks{queue="default",type="resize",phase="Running"}"#
            ),
            Some(4.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_tasks{queue="default",type="resize",phase="Succeeded"}"#
            ),
            Some(3.0),
            "repeated label sets are summed"
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_tasks{queue="default",type="resize",phase="Pending"}"#
            ),
            None,
            "an emptied phase disappears:\n{text}"
        );
        assert!(
            !text.contains(r#"queue="batch""#),
            "stale queue kept:\n{text}"
        );

        metrics.set_task_counts(std::iter::empty::<((&str, &str, &str), usize)>());
        let text = metrics.encode().expect("encode");
        assert!(
            !text.contains("ax_tasks{"),
            "empty snapshot kept series:\n{text}"
        );
    }

    #[test]
    fn set_queue_pending_replaces_and_circuits_close_to_zero() {
        let metrics = Metrics::new();
        metrics.set_queue_pending([(("default", "High"), 5), (("default", "Low"), 1)]);
        metrics.set_queue_pending([(("default", "Low"), 2)]);
        metrics.set_circuit_open("default", "resize", true);
        metrics.set_circuit_open("default", "resize", false);
        let text = metrics.encode().expect("encode");

        assert_eq!(
            sample(
                &text,
                r#"ax_queue_pending{queue="default",priority="High"}"#
            ),
            None
        );
        assert_eq!(
            sample(&text, r#"ax_queue_pending{queue="default",priority="Low"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"ax_circuit_open{queue="default",type="resize"}"#),
            Some(0.0)
        );
    }

    #[test]
    fn set_queue_slots_replaces_running_and_concurrency_together() {
        let metrics = Metrics::new();
        metrics.set_queue_slots([("default", 7, 100), ("batch", 2, 2)]);
        metrics.set_queue_slots([("default", 0, 0)]);
        let text = metrics.encode().expect("encode");

        assert_eq!(
            sample(&text, r#"ax_queue_running{queue="default"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"ax_queue_concurrency{queue="default"}"#),
            Some(0.0),
            "a paused queue shows concurrency 0"
        );
        assert!(
            !text.contains(r#"queue="batch""#),
            "a queue gone from the snapshot kept its series:\n{text}"
        );
    }

    #[test]
    fn counters_count_and_leader_flips() {
        let metrics = Metrics::new();
        metrics.transition("Pending", "Scheduled");
        metrics.transition("Pending", "Scheduled");
        metrics.transition("Scheduled", "Running");
        metrics.reconcile_error("axtask", "write_status", "stale");
        metrics.set_leader(true);
        metrics.set_leader(false);
        let text = metrics.encode().expect("encode");

        assert_eq!(
            sample(
                &text,
                r#"ax_task_transitions_total{from="Pending",to="Scheduled"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_task_transitions_total{from="Scheduled",to="Running"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_reconcile_errors_total{controller="axtask",step="write_status",category="stale"}"#
            ),
            Some(1.0)
        );
        assert_eq!(sample(&text, "ax_leader"), Some(0.0));
    }

    #[test]
    fn the_type_cap_admits_the_first_types_seen_and_calls_the_rest_other() {
        let mut cap = TypeCap::new(2);
        assert_eq!(cap.label("resize"), "resize");
        assert_eq!(cap.label("report"), "report");
        assert_eq!(cap.label("etl"), OTHER_TYPE);
        assert_eq!(
            cap.label("resize"),
            "resize",
            "admitted types stay admitted"
        );
        assert_eq!(cap.label("etl"), OTHER_TYPE, "a capped type stays capped");
        assert_eq!(TypeCap::new(0).label("resize"), OTHER_TYPE);
    }

    #[test]
    fn capped_types_share_the_other_series_of_every_metric_with_a_type() {
        let metrics = Metrics::with_max_types(1);
        metrics.set_task_counts([
            (("default", "resize", "Pending"), 1),
            (("default", "etl", "Pending"), 2),
            (("default", "report", "Pending"), 3),
        ]);
        metrics.dead("etl", "RetriesExhausted");
        metrics.dead("report", "RetriesExhausted");
        metrics.retried("etl", "Retryable");
        metrics.task_finished("etl", "Succeeded", Duration::from_secs(1));
        let text = metrics.encode().expect("encode");

        assert_eq!(
            sample(
                &text,
                r#"ax_tasks{queue="default",type="resize",phase="Pending"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_tasks{queue="default",type="other",phase="Pending"}"#
            ),
            Some(5.0),
            "capped types are summed"
        );
        assert_eq!(
            sample(
                &text,
                r#"ax_dead_tasks_total{type="other",reason="RetriesExhausted"}"#
            ),
            Some(2.0)
        );
        assert!(sample(&text, r#"ax_retries_total{type="other",kind="Retryable"}"#).is_some());
        assert!(
            sample(
                &text,
                r#"ax_task_duration_seconds_count{type="other",outcome="Succeeded"}"#
            )
            .is_some()
        );
        assert!(!text.contains(r#"type="etl""#), "{text}");
    }

    #[test]
    fn the_other_circuit_stays_open_while_any_capped_type_is_open() {
        let metrics = Metrics::with_max_types(1);
        let circuit = r#"ax_circuit_open{queue="q",type="other"}"#;
        metrics.set_circuit_open("q", "resize", false);
        metrics.set_circuit_open("q", "etl", true);
        metrics.set_circuit_open("q", "report", true);
        metrics.set_circuit_open("q", "etl", false);
        assert_eq!(sample(&metrics.encode().unwrap(), circuit), Some(1.0));
        metrics.set_circuit_open("q", "report", false);
        assert_eq!(sample(&metrics.encode().unwrap(), circuit), Some(0.0));
    }

    #[test]
    fn process_metrics_are_scraped_on_linux() {
        let text = Metrics::new().encode().expect("encode");
        if cfg!(target_os = "linux") {
            for name in [
                "process_resident_memory_bytes",
                "process_cpu_seconds_total",
                "process_open_fds",
                "process_start_time_seconds",
            ] {
                let value = sample(&text, name).unwrap_or_else(|| panic!("{name}:\n{text}"));
                assert!(value >= 0.0, "{name} {value}");
            }
        }
    }
}
