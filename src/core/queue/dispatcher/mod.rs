//! The dispatcher of one AxQueue (DESIGN §4): which pending task runs next, and what holds the others.
//!
//! Pure and deterministic: time comes in as arguments, no I/O. The controller feeds it the tasks
//! (`upsert`, `remove`, `mark_running` when rebuilding after a restart), asks `next` for the task to
//! dispatch, and reports `finished` outcomes.
//!
//! Layout: each priority bucket is split into lanes, one per (tenant, namespace, task type, first
//! attempt or retry), each a FIFO by (`queued_at`, key). A bucket keeps the heads of its lanes in
//! ordered sets, so its next task is the first head whose lane is not blocked (type or key
//! concurrency, open circuit, no retry token): a blocked lane never holds up the tasks behind it,
//! and choosing costs O(log n) plus one check per blocked lane head, never a scan of the pending
//! tasks. Without `fairness` all heads form one set (oldest first, whoever's); with it, one set per
//! tenant (its key: the namespace, or a label or payload value), and the bucket takes the tenant of
//! the lowest stride-scheduling pass (`bucket`): round robin between tenants, weighted by
//! `fairness.weights`.
//!
//! Circuit breakers are per (namespace, task type): a queue shared by several teams' namespaces
//! must not let one team's failing tasks hold another team's tasks of the same type. Type limits
//! (`typeConcurrency`) stay per type across namespaces: they are the queue owner's limit.
//!
//! Choice between buckets: a bucket whose next task has waited longer than the bucket's max-wait goes
//! first (oldest such task first); otherwise smooth weighted round robin (nginx) over the buckets that
//! have a dispatchable task and a weight above 0. Weights come from the first `weight_schedule` window
//! containing the instant, else from `weights`. An overdue dispatch leaves the round robin state alone,
//! so the weighted shares of the other dispatches are unchanged.
//!
//! Limits: the window in force may override the queue's concurrency, type limits and retry rate;
//! `next` applies a change of window before it chooses. An adaptive limit set from outside
//! (`set_adaptive_limit`, see `adaptive`) caps the concurrency further.
//!
//! Estimates: each bucket measures its dispatch rate (`estimate::DispatchRate`) and counts its
//! dispatches; a pending task keeps its rank as "the bucket's dispatch count when it is expected to
//! go", so its position is one subtraction. `refresh_positions` recomputes every rank in one ordered
//! pass per bucket (k-way merge of its lanes), for the periodic refresh.
//!
//! Parts: the buckets and their lanes (`bucket`), the task types and circuits (`circuits`), the
//! tenants with their weights, `keyConcurrency` limits and `keyRate` buckets (`tenants`), the
//! choice of the next task and what holds the others (`selection`), the limits in force
//! (`limits`), where pending tasks stand and when they should start (`positions`), and which
//! running attempt to stop for a waiting urgent one (`preemption`).

mod bucket;
mod circuits;
mod limits;
mod positions;
mod preemption;
mod selection;
mod tenants;

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;

use jiff::Timestamp;

use super::breaker::{BreakerState, Verdict};
use super::config::QueueConfig;
use super::token_bucket::TokenBucket;
use crate::api::Priority;
use bucket::{Bucket, Lane};
use circuits::{CircuitId, CircuitState, TypeId, TypeState};
pub use tenants::KeyCount;
use tenants::{TenantId, TenantIds, TenantState};

/// A task waiting to be dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTask {
    pub priority: Priority,
    /// Its namespace: the circuit breaker it obeys and feeds is that of (namespace, type).
    pub namespace: String,
    /// Its key when the queue takes keys from elsewhere than the namespace (`status.queueKey`).
    pub key: Option<String>,
    pub task_type: String,
    pub queued_at: Timestamp,
    /// The attempt this dispatch would start (1 = first); above 1 it is a retry and needs a token.
    pub attempt: u32,
    /// Whether its running attempt may be stopped for a waiting task of higher priority.
    pub preemptible: bool,
}

/// A task holding a slot the dispatcher did not grant (dispatched before a restart, or by an earlier
/// leader): what `mark_running` needs to count it and, when preemptible, to choose it as a victim.
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    pub task_type: &'a str,
    /// Its key when not its namespace (`status.queueKey`).
    pub key: Option<&'a str>,
    pub priority: Priority,
    pub preemptible: bool,
    /// When its attempt was dispatched.
    pub since: Timestamp,
}

/// How a dispatched task ended, as far as the dispatcher cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// Ended for a reason that says nothing about its type's health (canceled, deleted, evicted):
    /// frees its slot without feeding the circuit breaker.
    Aborted,
}

/// Why a pending task is not being dispatched right now: the reason of its `Queued` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldReason {
    /// The queue's `concurrency` is used up.
    ConcurrencyLimit,
    /// `concurrencyPolicy: Adaptive` holds the queue below its `concurrency`, and that is used up.
    AdaptiveLimit,
    /// The `typeConcurrency` of the task's type is used up.
    TypeConcurrencyLimit,
    /// The `keyConcurrency` of the task's key (tenant) is used up.
    KeyConcurrencyLimit,
    /// The `keyRate` of the task's key (tenant) is used up for now.
    KeyRateLimit,
    /// A retry, and the queue's retry token bucket is empty.
    RetryRateLimited,
    /// The circuit of the task's type is open, or half-open with its probe running.
    CircuitOpen,
    /// Nothing holds it but its turn: older or higher-weighted tasks go first.
    Waiting,
    /// No AxQueue of the name the task gives exists (yet).
    QueueNotFound,
    /// The AxQueue exists but none of its specs so far could be applied.
    QueueInvalid,
    /// The AxQueue's `namespaceSelector` does not select the task's namespace.
    QueueForbidden,
    /// The AxQueue's `stopPolicy` is `Hold` or `HoldAndDrain`.
    QueueHeld,
}

impl HeldReason {
    pub const ALL: [HeldReason; 12] = [
        HeldReason::ConcurrencyLimit,
        HeldReason::AdaptiveLimit,
        HeldReason::TypeConcurrencyLimit,
        HeldReason::KeyConcurrencyLimit,
        HeldReason::KeyRateLimit,
        HeldReason::RetryRateLimited,
        HeldReason::CircuitOpen,
        HeldReason::Waiting,
        HeldReason::QueueNotFound,
        HeldReason::QueueInvalid,
        HeldReason::QueueForbidden,
        HeldReason::QueueHeld,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HeldReason::ConcurrencyLimit => "ConcurrencyLimit",
            HeldReason::AdaptiveLimit => "AdaptiveLimit",
            HeldReason::TypeConcurrencyLimit => "TypeConcurrencyLimit",
            HeldReason::KeyConcurrencyLimit => "KeyConcurrencyLimit",
            HeldReason::KeyRateLimit => "KeyRateLimit",
            HeldReason::RetryRateLimited => "RetryRateLimited",
            HeldReason::CircuitOpen => "CircuitOpen",
            HeldReason::Waiting => "Waiting",
            HeldReason::QueueNotFound => "QueueNotFound",
            HeldReason::QueueInvalid => "QueueInvalid",
            HeldReason::QueueForbidden => "QueueForbidden",
            HeldReason::QueueHeld => "QueueHeld",
        }
    }

    pub fn parse(reason: &str) -> Option<HeldReason> {
        HeldReason::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

/// What queue status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// Pending tasks per bucket, highest priority first.
    pub pending: [(Priority, usize); 4],
    /// Tasks dispatched and not yet finished.
    pub running: usize,
    /// Circuits that are not closed, by type, then namespace.
    pub open_circuits: Vec<OpenCircuit>,
    /// Dispatches since this dispatcher was created.
    pub dispatched: u64,
    /// Retry tokens available now.
    pub retry_tokens: u32,
}

/// The breaker of one (namespace, type) that is not closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCircuit {
    pub namespace: String,
    pub task_type: String,
    pub state: BreakerState,
}

#[derive(Debug, Clone)]
struct PendingEntry {
    priority: Priority,
    lane: Lane,
    queued_at: Timestamp,
    /// Its bucket's `dispatched` count once it is dispatched (if the order holds): its position is
    /// `rank - dispatched`.
    rank: u64,
    /// The same among its key's waiting tasks, by its key's dispatch count (`keyRate` estimates).
    key_rank: u64,
    attempt: u32,
    preemptible: bool,
}

#[derive(Debug, Clone, Copy)]
struct RunningEntry {
    circuit: CircuitId,
    tenant: TenantId,
    priority: Priority,
    /// When it was dispatched: of two victims of one priority, the later goes.
    since: Timestamp,
    preemptible: bool,
    /// The half-open probe of its circuit's breaker.
    probe: bool,
    /// Its outcome already fed the breaker; releasing the slot later only frees it.
    recorded: bool,
}

#[derive(Debug)]
pub struct Dispatcher<K> {
    config: QueueConfig,
    types: Vec<TypeState>,
    type_ids: HashMap<String, TypeId>,
    /// Ids of `types` entries no longer used, for reuse.
    free_type_ids: Vec<TypeId>,
    circuits: Vec<CircuitState>,
    /// Ids of `circuits` entries no longer used, for reuse.
    free_circuit_ids: Vec<CircuitId>,
    tenants: Vec<TenantState>,
    tenant_ids: TenantIds,
    buckets: [Bucket<K>; 4],
    pending: HashMap<K, PendingEntry>,
    running: HashMap<K, RunningEntry>,
    retry_tokens: TokenBucket,
    /// Smooth weighted round robin "current weight" per bucket.
    round_robin: [i64; 4],
    dispatched: u64,
    /// The `weight_schedule` window whose limits are applied to the types and the token bucket.
    window: Option<usize>,
    /// A lower concurrency limit set by the adaptive policy, if any.
    adaptive_limit: Option<u32>,
    /// Running preemptible tasks, the first victim first: lowest priority, then latest dispatched.
    victims: BTreeSet<(Reverse<usize>, Reverse<Timestamp>, K)>,
    /// Running tasks chosen as victims whose slots are not free yet.
    preempting: HashSet<K>,
    /// When the preemptions of the last minute were decided, oldest first.
    preempted_at: VecDeque<Timestamp>,
    /// The bucket a preemption freed a slot for: its next task takes the next free slot.
    reserved: Option<Priority>,
}

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    pub fn new(config: QueueConfig) -> Self {
        // A bucket last refilled at the dawn of time is full whenever it is first asked.
        let retry_tokens = TokenBucket::new(config.retry_rate_per_minute, Timestamp::MIN);
        let fair = config.fairness.is_some();
        let mut dispatcher = Self {
            config,
            types: Vec::new(),
            type_ids: HashMap::new(),
            free_type_ids: Vec::new(),
            circuits: Vec::new(),
            free_circuit_ids: Vec::new(),
            tenants: Vec::new(),
            tenant_ids: TenantIds::default(),
            buckets: Default::default(),
            pending: HashMap::new(),
            running: HashMap::new(),
            retry_tokens,
            round_robin: [0; 4],
            dispatched: 0,
            window: None,
            adaptive_limit: None,
            victims: BTreeSet::new(),
            preempting: HashSet::new(),
            preempted_at: VecDeque::new(),
            reserved: None,
        };
        for bucket in &mut dispatcher.buckets {
            bucket.set_fair(fair);
        }
        dispatcher
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Adds a pending task, or replaces it (its priority, type, attempt or time may have changed).
    /// A task that was counted as running is pending again: its slot is freed as `Aborted`.
    pub fn upsert(&mut self, key: K, task: PendingTask) {
        self.release_running(&key, Outcome::Aborted, None);
        // A task offered again in the same place keeps its rank; a new one goes last until the
        // next refresh of the positions says otherwise.
        let kept_ranks = self
            .pending
            .get(&key)
            .filter(|e| e.priority == task.priority && e.queued_at == task.queued_at)
            .map(|e| (e.rank, e.key_rank));
        self.remove_pending(&key);
        let circuit = self.intern(&task.namespace, &task.task_type);
        self.circuits[circuit].pending += 1;
        let tenant = self.intern_tenant(task.key.as_deref().unwrap_or(&task.namespace));
        let tenant_state = &mut self.tenants[tenant];
        tenant_state.pending += 1;
        let last_of_key = tenant_state.dispatched + tenant_state.pending as u64;
        let lane = Lane {
            tenant,
            circuit,
            retry: task.attempt > 1,
        };
        let bucket = &mut self.buckets[task.priority.index()];
        bucket.insert(lane, task.queued_at, key.clone());
        let (rank, key_rank) =
            kept_ranks.unwrap_or((bucket.dispatched + bucket.len as u64, last_of_key));
        self.pending.insert(
            key,
            PendingEntry {
                priority: task.priority,
                lane,
                queued_at: task.queued_at,
                rank,
                key_rank,
                attempt: task.attempt,
                preemptible: task.preemptible,
            },
        );
    }

    /// Takes a pending task out, returning what it waited as (to be offered again later).
    pub fn take_pending(&mut self, key: &K) -> Option<PendingTask> {
        let entry = self.pending.get(key)?;
        let circuit = &self.circuits[entry.lane.circuit];
        let tenant = &self.tenants[entry.lane.tenant].name;
        let task = PendingTask {
            priority: entry.priority,
            namespace: circuit.namespace.clone(),
            key: (*tenant != circuit.namespace).then(|| tenant.clone()),
            task_type: self.types[circuit.type_id].name.clone(),
            queued_at: entry.queued_at,
            attempt: entry.attempt,
            preemptible: entry.preemptible,
        };
        self.remove_pending(key);
        Some(task)
    }

    /// Forgets a task, pending or running (deleted, canceled). Returns whether it was known.
    pub fn remove(&mut self, key: &K) -> bool {
        self.remove_pending(key) || self.release_running(key, Outcome::Aborted, None)
    }

    /// Counts a task as dispatched and unfinished without dispatching it: used when rebuilding after
    /// a restart from tasks that are Scheduled or Running. Limits are not checked (it already runs).
    pub fn mark_running(&mut self, key: K, namespace: &str, holder: Holder<'_>) {
        self.remove_pending(&key);
        self.release_running(&key, Outcome::Aborted, None);
        let circuit = self.intern(namespace, holder.task_type);
        let state = &mut self.circuits[circuit];
        state.running += 1;
        self.types[state.type_id].running += 1;
        let tenant = self.intern_tenant(holder.key.unwrap_or(namespace));
        self.tenants[tenant].running += 1;
        if holder.preemptible {
            self.victims
                .insert(victim_order(holder.priority, holder.since, key.clone()));
        }
        self.running.insert(
            key,
            RunningEntry {
                circuit,
                tenant,
                priority: holder.priority,
                since: holder.since,
                preemptible: holder.preemptible,
                probe: false,
                recorded: false,
            },
        );
    }

    /// Frees the slot of a dispatched task and feeds its outcome to its circuit's breaker. Returns
    /// whether the task was counted as running (repeated calls are harmless).
    pub fn finished(&mut self, key: &K, outcome: Outcome, now: Timestamp) -> bool {
        self.release_running(key, outcome, Some(now))
    }

    /// Feeds the outcome of a dispatched task to its circuit's breaker once, keeping its slot: its pod
    /// may still be stopping. Returns whether the outcome was recorded now.
    pub fn record_outcome(&mut self, key: &K, outcome: Outcome, now: Timestamp) -> bool {
        let Some(entry) = self.running.get_mut(key) else {
            return false;
        };
        if entry.recorded {
            return false;
        }
        entry.recorded = true;
        let probe = std::mem::take(&mut entry.probe);
        let state = &mut self.circuits[entry.circuit];
        match outcome {
            Outcome::Succeeded => {
                state
                    .breaker
                    .record(Verdict::Success, probe, now, &self.config.circuit_breaker)
            }
            Outcome::Failed => {
                state
                    .breaker
                    .record(Verdict::Failure, probe, now, &self.config.circuit_breaker)
            }
            Outcome::Aborted if probe => state.breaker.probe_abandoned(),
            Outcome::Aborted => {}
        }
        true
    }

    /// Picks the task to dispatch at `now` and counts it as running, or `None` when nothing may go.
    pub fn next(&mut self, now: Timestamp) -> Option<K> {
        self.apply_schedule(now);
        let limit = self.effective_concurrency();
        for bucket in &mut self.buckets {
            if bucket.len == 0 || limit == 0 {
                // Empty or paused: the next dispatch starts a new measurement.
                bucket.waiting_since = None;
                bucket.paced = false;
                bucket.measuring = false;
            } else if bucket.waiting_since.is_none() {
                bucket.waiting_since = Some(now);
            }
        }
        if self.running.len() >= limit as usize {
            self.mark_waiting_buckets_paced();
            return None;
        }
        let Some((priority, queued_at, key, lane)) =
            self.take_reserved(now).or_else(|| self.choose(now))
        else {
            self.mark_waiting_buckets_paced();
            return None;
        };
        let bucket = &mut self.buckets[priority.index()];
        bucket.charge(lane, self.tenants[lane.tenant].weight);
        bucket.remove(lane, queued_at, &key);
        let interval = bucket
            .open_since()
            .filter(|_| bucket.measuring)
            .map(|since| now.duration_since(since));
        bucket.rate.record(now, interval);
        bucket.measuring = bucket.paced;
        bucket.dispatched += 1;
        self.tenants[lane.tenant].dispatched += 1;
        if bucket.len == 0 {
            bucket.waiting_since = None;
            bucket.paced = false;
            bucket.measuring = false;
        }
        let preemptible = self.pending.remove(&key).is_some_and(|e| e.preemptible);
        if preemptible {
            self.victims
                .insert(victim_order(priority, now, key.clone()));
        }
        let state = &mut self.circuits[lane.circuit];
        state.pending -= 1;
        state.running += 1;
        self.types[state.type_id].running += 1;
        let probe = state.breaker.on_dispatch(now);
        let tenant = &mut self.tenants[lane.tenant];
        tenant.pending -= 1;
        tenant.running += 1;
        if let Some(bucket) = &mut tenant.rate {
            // `choose` saw a token, so this cannot fail.
            bucket.try_take(now);
        }
        if lane.retry {
            // `choose` saw a token, so this cannot fail.
            self.retry_tokens.try_take(now);
        }
        self.running.insert(
            key.clone(),
            RunningEntry {
                circuit: lane.circuit,
                tenant: lane.tenant,
                priority,
                since: now,
                preemptible,
                probe,
                recorded: false,
            },
        );
        self.dispatched += 1;
        Some(key)
    }

    pub fn stats(&self, now: Timestamp) -> QueueStats {
        let mut open_circuits: Vec<OpenCircuit> = self
            .type_ids
            .iter()
            .flat_map(|(name, id)| {
                self.types[*id]
                    .circuits
                    .iter()
                    .map(move |(namespace, circuit)| {
                        (name, namespace, self.circuits[*circuit].breaker.state(now))
                    })
            })
            .filter(|(_, _, state)| *state != BreakerState::Closed)
            .map(|(name, namespace, state)| OpenCircuit {
                namespace: namespace.clone(),
                task_type: name.clone(),
                state,
            })
            .collect();
        open_circuits
            .sort_by(|a, b| (&a.task_type, &a.namespace).cmp(&(&b.task_type, &b.namespace)));
        QueueStats {
            pending: Priority::ALL.map(|priority| (priority, self.buckets[priority.index()].len)),
            running: self.running.len(),
            open_circuits,
            dispatched: self.dispatched,
            retry_tokens: self.retry_tokens.tokens(now),
        }
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn is_running(&self, key: &K) -> bool {
        self.running.contains_key(key)
    }

    fn remove_pending(&mut self, key: &K) -> bool {
        let Some(entry) = self.pending.remove(key) else {
            return false;
        };
        self.buckets[entry.priority.index()].remove(entry.lane, entry.queued_at, key);
        self.circuits[entry.lane.circuit].pending -= 1;
        self.release_circuit_if_unused(entry.lane.circuit);
        self.tenants[entry.lane.tenant].pending -= 1;
        self.release_tenant_if_unused(entry.lane.tenant);
        true
    }

    /// `now` is only needed when the outcome feeds the breaker.
    fn release_running(&mut self, key: &K, outcome: Outcome, now: Option<Timestamp>) -> bool {
        if self.running.len() >= self.effective_concurrency() as usize
            && self.running.contains_key(key)
        {
            // A slot frees in a full queue: a caller that asks `next` only after slots free never
            // sees it full, yet the dispatch that follows waited for this slot.
            self.mark_waiting_buckets_paced();
        }
        let Some(entry) = self.running.remove(key) else {
            return false;
        };
        if entry.preemptible {
            self.victims
                .remove(&victim_order(entry.priority, entry.since, key.clone()));
        }
        self.preempting.remove(key);
        let state = &mut self.circuits[entry.circuit];
        state.running -= 1;
        self.types[state.type_id].running -= 1;
        let outcome = if entry.recorded {
            Outcome::Aborted
        } else {
            outcome
        };
        let verdict = match outcome {
            Outcome::Succeeded => Some(Verdict::Success),
            Outcome::Failed => Some(Verdict::Failure),
            Outcome::Aborted => None,
        };
        match (verdict, now) {
            (Some(verdict), Some(now)) => {
                state
                    .breaker
                    .record(verdict, entry.probe, now, &self.config.circuit_breaker);
            }
            _ if entry.probe => state.breaker.probe_abandoned(),
            _ => {}
        }
        self.release_circuit_if_unused(entry.circuit);
        self.tenants[entry.tenant].running -= 1;
        self.release_tenant_if_unused(entry.tenant);
        true
    }
}

/// The place of a running task in `Dispatcher::victims`.
fn victim_order<K>(
    priority: Priority,
    since: Timestamp,
    key: K,
) -> (Reverse<usize>, Reverse<Timestamp>, K) {
    (Reverse(priority.index()), Reverse(since), key)
}

#[cfg(test)]
mod fairness_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod tests;
