//! The dispatcher of one AxQueue (DESIGN §4): which pending task runs next, and what holds the others.
//!
//! Pure and deterministic: time comes in as arguments, no I/O. The controller feeds it the tasks
//! (`upsert`, `remove`, `mark_running` when rebuilding after a restart), asks `next` for the task to
//! dispatch, and reports `finished` outcomes.
//!
//! Layout: each priority bucket is split into lanes, one per (namespace, task type, first attempt or
//! retry), each a FIFO by (`queued_at`, key). A bucket keeps the heads of its lanes in one ordered
//! set, so its next task is the first head whose lane is not blocked (type concurrency, open circuit,
//! no retry token): a blocked type never holds up the tasks behind it, and choosing costs O(log n)
//! plus one check per blocked lane head, never a scan of the pending tasks.
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

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hash::Hash;

use jiff::Timestamp;

use super::breaker::{Breaker, BreakerState, Verdict};
use super::config::QueueConfig;
use super::estimate::{self, DispatchRate, Estimate};
use super::token_bucket::TokenBucket;
use super::weights::{Weights, effective_weights, window_in_force};
use crate::api::Priority;

/// A task waiting to be dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTask {
    pub priority: Priority,
    /// Its namespace: the circuit breaker it obeys and feeds is that of (namespace, type).
    pub namespace: String,
    pub task_type: String,
    pub queued_at: Timestamp,
    /// The attempt this dispatch would start (1 = first); above 1 it is a retry and needs a token.
    pub attempt: u32,
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
}

impl HeldReason {
    pub const ALL: [HeldReason; 9] = [
        HeldReason::ConcurrencyLimit,
        HeldReason::AdaptiveLimit,
        HeldReason::TypeConcurrencyLimit,
        HeldReason::RetryRateLimited,
        HeldReason::CircuitOpen,
        HeldReason::Waiting,
        HeldReason::QueueNotFound,
        HeldReason::QueueInvalid,
        HeldReason::QueueForbidden,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HeldReason::ConcurrencyLimit => "ConcurrencyLimit",
            HeldReason::AdaptiveLimit => "AdaptiveLimit",
            HeldReason::TypeConcurrencyLimit => "TypeConcurrencyLimit",
            HeldReason::RetryRateLimited => "RetryRateLimited",
            HeldReason::CircuitOpen => "CircuitOpen",
            HeldReason::Waiting => "Waiting",
            HeldReason::QueueNotFound => "QueueNotFound",
            HeldReason::QueueInvalid => "QueueInvalid",
            HeldReason::QueueForbidden => "QueueForbidden",
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

/// Index into `Dispatcher::types`.
type TypeId = usize;
/// Index into `Dispatcher::circuits`.
type CircuitId = usize;

/// One FIFO inside a bucket: the tasks of one (namespace, type) that are either first attempts or
/// retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Lane {
    circuit: CircuitId,
    retry: bool,
}

/// A task type, across namespaces: its limit and how many of its tasks hold a slot.
#[derive(Debug)]
struct TypeState {
    name: String,
    limit: Option<u32>,
    running: u32,
    /// Its circuits by namespace; the type is forgotten with the last of them.
    circuits: HashMap<String, CircuitId>,
}

/// The tasks of one type in one namespace, and their breaker.
#[derive(Debug)]
struct CircuitState {
    namespace: String,
    type_id: TypeId,
    pending: usize,
    running: u32,
    breaker: Breaker,
}

#[derive(Debug)]
struct Bucket<K> {
    lanes: HashMap<Lane, BTreeSet<(Timestamp, K)>>,
    /// The first task of every non-empty lane.
    heads: BTreeSet<(Timestamp, K, Lane)>,
    len: usize,
    /// Dispatches from this bucket, in all: the clock of the pending tasks' ranks.
    dispatched: u64,
    rate: DispatchRate,
    /// Since when tasks have waited in it (as `next` saw it); `None` while empty or paused.
    waiting_since: Option<Timestamp>,
    /// Whether, since it started waiting, a dispatch has had to wait (the queue at its limit, or
    /// its tasks held): until then its dispatches fill slots that were free and say nothing of the
    /// pace at which slots free up, so they are not measured.
    paced: bool,
    /// Whether a paced dispatch has happened since: the interval before the first one is how long
    /// the quickest worker took from its grant (the pipeline's latency), not the pace, so
    /// measurement starts at it.
    measuring: bool,
}

impl<K> Default for Bucket<K> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            heads: BTreeSet::new(),
            len: 0,
            dispatched: 0,
            rate: DispatchRate::default(),
            waiting_since: None,
            paced: false,
            measuring: false,
        }
    }
}

impl<K> Bucket<K> {
    /// When the interval still open began: the last dispatch or the start of the wait.
    fn open_since(&self) -> Option<Timestamp> {
        let since = self.waiting_since?;
        Some(
            self.rate
                .last_dispatch()
                .map_or(since, |last| last.max(since)),
        )
    }
}

impl<K: Clone + Ord> Bucket<K> {
    fn insert(&mut self, lane: Lane, queued_at: Timestamp, key: K) {
        let fifo = self.lanes.entry(lane).or_default();
        let new_head = fifo
            .first()
            .is_none_or(|(head_at, head_key)| (queued_at, &key) < (*head_at, head_key));
        if new_head {
            if let Some((head_at, head_key)) = fifo.first() {
                self.heads.remove(&(*head_at, head_key.clone(), lane));
            }
            self.heads.insert((queued_at, key.clone(), lane));
        }
        if fifo.insert((queued_at, key)) {
            self.len += 1;
        }
    }

    fn remove(&mut self, lane: Lane, queued_at: Timestamp, key: &K) {
        let Some(fifo) = self.lanes.get_mut(&lane) else {
            return;
        };
        let entry = (queued_at, key.clone());
        let was_head = fifo.first() == Some(&entry);
        if !fifo.remove(&entry) {
            return;
        }
        self.len -= 1;
        if was_head {
            self.heads.remove(&(queued_at, entry.1, lane));
            match fifo.first() {
                Some((next_at, next_key)) => {
                    self.heads.insert((*next_at, next_key.clone(), lane));
                }
                None => {
                    self.lanes.remove(&lane);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
struct PendingEntry {
    priority: Priority,
    lane: Lane,
    queued_at: Timestamp,
    /// Its bucket's `dispatched` count once it is dispatched (if the order holds): its position is
    /// `rank - dispatched`.
    rank: u64,
    attempt: u32,
}

#[derive(Debug, Clone, Copy)]
struct RunningEntry {
    circuit: CircuitId,
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
}

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    pub fn new(config: QueueConfig) -> Self {
        // A bucket last refilled at the dawn of time is full whenever it is first asked.
        let retry_tokens = TokenBucket::new(config.retry_rate_per_minute, Timestamp::MIN);
        Self {
            config,
            types: Vec::new(),
            type_ids: HashMap::new(),
            free_type_ids: Vec::new(),
            circuits: Vec::new(),
            free_circuit_ids: Vec::new(),
            buckets: Default::default(),
            pending: HashMap::new(),
            running: HashMap::new(),
            retry_tokens,
            round_robin: [0; 4],
            dispatched: 0,
            window: None,
            adaptive_limit: None,
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Applies an edited queue spec at once; pending and running tasks are kept.
    pub fn set_config(&mut self, config: QueueConfig, now: Timestamp) {
        for state in &mut self.circuits {
            state.breaker.reconfigure(now, &config.circuit_breaker);
        }
        self.config = config;
        self.apply_limits(window_in_force(&self.config.weight_schedule, now), now);
    }

    /// Applies the limits of the window in force at `now`, when the window changed.
    fn apply_schedule(&mut self, now: Timestamp) {
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
        let limit = self.concurrency_in_force();
        self.adaptive_limit
            .map_or(limit, |adaptive| adaptive.min(limit))
    }

    /// Adds a pending task, or replaces it (its priority, type, attempt or time may have changed).
    /// A task that was counted as running is pending again: its slot is freed as `Aborted`.
    pub fn upsert(&mut self, key: K, task: PendingTask) {
        self.release_running(&key, Outcome::Aborted, None);
        // A task offered again in the same place keeps its rank; a new one goes last until the
        // next refresh of the positions says otherwise.
        let kept_rank = self
            .pending
            .get(&key)
            .filter(|e| e.priority == task.priority && e.queued_at == task.queued_at)
            .map(|e| e.rank);
        self.remove_pending(&key);
        let circuit = self.intern(&task.namespace, &task.task_type);
        self.circuits[circuit].pending += 1;
        let lane = Lane {
            circuit,
            retry: task.attempt > 1,
        };
        let bucket = &mut self.buckets[task.priority.index()];
        bucket.insert(lane, task.queued_at, key.clone());
        let rank = kept_rank.unwrap_or(bucket.dispatched + bucket.len as u64);
        self.pending.insert(
            key,
            PendingEntry {
                priority: task.priority,
                lane,
                queued_at: task.queued_at,
                rank,
                attempt: task.attempt,
            },
        );
    }

    /// Takes a pending task out, returning what it waited as (to be offered again later).
    pub fn take_pending(&mut self, key: &K) -> Option<PendingTask> {
        let entry = self.pending.get(key)?;
        let circuit = &self.circuits[entry.lane.circuit];
        let task = PendingTask {
            priority: entry.priority,
            namespace: circuit.namespace.clone(),
            task_type: self.types[circuit.type_id].name.clone(),
            queued_at: entry.queued_at,
            attempt: entry.attempt,
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
    pub fn mark_running(&mut self, key: K, namespace: &str, task_type: &str) {
        self.remove_pending(&key);
        self.release_running(&key, Outcome::Aborted, None);
        let circuit = self.intern(namespace, task_type);
        let state = &mut self.circuits[circuit];
        state.running += 1;
        self.types[state.type_id].running += 1;
        self.running.insert(
            key,
            RunningEntry {
                circuit,
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
        let Some((priority, queued_at, key, lane)) = self.choose(now) else {
            self.mark_waiting_buckets_paced();
            return None;
        };
        let bucket = &mut self.buckets[priority.index()];
        bucket.remove(lane, queued_at, &key);
        let interval = bucket
            .open_since()
            .filter(|_| bucket.measuring)
            .map(|since| now.duration_since(since));
        bucket.rate.record(now, interval);
        bucket.measuring = bucket.paced;
        bucket.dispatched += 1;
        if bucket.len == 0 {
            bucket.waiting_since = None;
            bucket.paced = false;
            bucket.measuring = false;
        }
        self.pending.remove(&key);
        let state = &mut self.circuits[lane.circuit];
        state.pending -= 1;
        state.running += 1;
        self.types[state.type_id].running += 1;
        let probe = state.breaker.on_dispatch(now);
        if lane.retry {
            // `choose` saw a token, so this cannot fail.
            self.retry_tokens.try_take(now);
        }
        self.running.insert(
            key.clone(),
            RunningEntry {
                circuit: lane.circuit,
                probe,
                recorded: false,
            },
        );
        self.dispatched += 1;
        Some(key)
    }

    /// Why the pending task `key` is not dispatched at `now`; `None` if it is not pending.
    /// A task held for several reasons reports the one most specific to it, in the order
    /// circuit, type concurrency, retry rate, queue concurrency.
    /// The task's type is returned with the reason, for messages.
    pub fn held_reason(&self, key: &K, now: Timestamp) -> Option<(HeldReason, &str)> {
        let entry = self.pending.get(key)?;
        let retry_token = self.retry_tokens.has_token(now);
        let in_force = self.concurrency_in_force();
        let reason = lane_blocked(&self.types, &self.circuits, entry.lane, now, retry_token)
            .unwrap_or(
                if self.running.len() >= self.effective_concurrency() as usize {
                    if self
                        .adaptive_limit
                        .is_some_and(|adaptive| adaptive < in_force)
                    {
                        HeldReason::AdaptiveLimit
                    } else {
                        HeldReason::ConcurrencyLimit
                    }
                } else {
                    HeldReason::Waiting
                },
            );
        let type_id = self.circuits[entry.lane.circuit].type_id;
        Some((reason, self.types[type_id].name.as_str()))
    }

    /// Where the pending task `key` stands in its bucket and when it is expected to start, from
    /// the bucket's measured rate; `None` if it is not pending. Says nothing about what holds it.
    pub fn estimate(&self, key: &K, now: Timestamp) -> Option<Estimate> {
        let entry = self.pending.get(key)?;
        let bucket = &self.buckets[entry.priority.index()];
        let waiting = bucket.len as u64;
        let position = entry
            .rank
            .saturating_sub(bucket.dispatched)
            .clamp(1, waiting.max(1));
        Some(estimate::estimate(
            entry.priority,
            position,
            waiting,
            &bucket.rate,
            bucket.open_since(),
            now,
        ))
    }

    /// Recomputes the rank of every pending task: one pass per bucket in dispatch order (by
    /// `queued_at`, then key, as the lanes hold them), O(n log lanes).
    pub fn refresh_positions(&mut self) {
        let Self {
            buckets, pending, ..
        } = self;
        for bucket in buckets.iter() {
            let mut lanes: Vec<_> = bucket.lanes.values().map(|fifo| fifo.iter()).collect();
            let mut heads = BinaryHeap::with_capacity(lanes.len());
            for (index, lane) in lanes.iter_mut().enumerate() {
                if let Some((at, key)) = lane.next() {
                    heads.push(Reverse((at, key, index)));
                }
            }
            let mut rank = bucket.dispatched;
            while let Some(Reverse((_, key, index))) = heads.pop() {
                rank += 1;
                if let Some(entry) = pending.get_mut(key) {
                    entry.rank = rank;
                }
                if let Some((at, key)) = lanes[index].next() {
                    heads.push(Reverse((at, key, index)));
                }
            }
        }
    }

    /// The adaptive limit, if the policy set one.
    pub fn adaptive_limit(&self) -> Option<u32> {
        self.adaptive_limit
    }

    /// The `weight_schedule` window whose limits are applied (as of the last `next`).
    pub fn window(&self) -> Option<usize> {
        self.window
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

    /// The bucket and task to dispatch at `now`, if any, ignoring queue concurrency.
    fn choose(&mut self, now: Timestamp) -> Option<(Priority, Timestamp, K, Lane)> {
        let Self {
            config,
            types,
            circuits,
            buckets,
            retry_tokens,
            round_robin,
            ..
        } = self;
        let retry_token = retry_tokens.has_token(now);
        let candidates: [Option<&(Timestamp, K, Lane)>; 4] = Priority::ALL.map(|priority| {
            buckets[priority.index()].heads.iter().find(|(_, _, lane)| {
                lane_blocked(types, circuits, *lane, now, retry_token).is_none()
            })
        });

        let overdue = Priority::ALL
            .into_iter()
            .filter_map(|priority| {
                let (queued_at, _, _) = candidates[priority.index()]?;
                let max_wait = config.max_wait.of(priority)?;
                (now.duration_since(*queued_at) > max_wait).then_some((*queued_at, priority))
            })
            .min();
        let chosen = match overdue {
            Some((_, priority)) => priority,
            None => {
                let weights = effective_weights(&config.weights, &config.weight_schedule, now);
                let eligible = Priority::ALL.map(|priority| {
                    candidates[priority.index()].is_some() && weights.of(priority) > 0
                });
                smooth_weighted_round_robin(round_robin, weights, eligible)?
            }
        };
        let (queued_at, key, lane) = candidates[chosen.index()]?;
        Some((chosen, *queued_at, key.clone(), *lane))
    }

    /// A dispatch had to wait: from now on the waiting buckets' dispatches follow the pace at which
    /// slots free up (or their tasks are let go), and are measured.
    fn mark_waiting_buckets_paced(&mut self) {
        for bucket in &mut self.buckets {
            if bucket.waiting_since.is_some() {
                bucket.paced = true;
            }
        }
    }

    /// The circuit of (namespace, type), created (with its type) when new.
    fn intern(&mut self, namespace: &str, task_type: &str) -> CircuitId {
        let type_id = self.intern_type(task_type);
        if let Some(id) = self.types[type_id].circuits.get(namespace) {
            return *id;
        }
        let state = CircuitState {
            namespace: namespace.to_string(),
            type_id,
            pending: 0,
            running: 0,
            breaker: Breaker::new(),
        };
        let id = match self.free_circuit_ids.pop() {
            Some(id) => {
                self.circuits[id] = state;
                id
            }
            None => {
                self.circuits.push(state);
                self.circuits.len() - 1
            }
        };
        self.types[type_id]
            .circuits
            .insert(namespace.to_string(), id);
        id
    }

    fn intern_type(&mut self, task_type: &str) -> TypeId {
        if let Some(id) = self.type_ids.get(task_type) {
            return *id;
        }
        let state = TypeState {
            name: task_type.to_string(),
            limit: self.config.type_limit_in(self.window, task_type),
            running: 0,
            circuits: HashMap::new(),
        };
        let id = match self.free_type_ids.pop() {
            Some(id) => {
                self.types[id] = state;
                id
            }
            None => {
                self.types.push(state);
                self.types.len() - 1
            }
        };
        self.type_ids.insert(task_type.to_string(), id);
        id
    }

    /// Drops a circuit that has no pending or running task and nothing in its breaker worth
    /// keeping, and its type with its last circuit, so that memory follows the live (namespace,
    /// type) pairs rather than every one ever seen.
    fn release_circuit_if_unused(&mut self, circuit: CircuitId) {
        let state = &self.circuits[circuit];
        if state.pending > 0 || state.running > 0 || !state.breaker.is_forgettable() {
            return;
        }
        let type_id = state.type_id;
        let task_type = &mut self.types[type_id];
        task_type.circuits.remove(&state.namespace);
        self.free_circuit_ids.push(circuit);
        if task_type.circuits.is_empty() {
            self.type_ids.remove(&task_type.name);
            self.free_type_ids.push(type_id);
        }
    }

    fn remove_pending(&mut self, key: &K) -> bool {
        let Some(entry) = self.pending.remove(key) else {
            return false;
        };
        self.buckets[entry.priority.index()].remove(entry.lane, entry.queued_at, key);
        self.circuits[entry.lane.circuit].pending -= 1;
        self.release_circuit_if_unused(entry.lane.circuit);
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
        true
    }
}

/// What holds the tasks of `lane` at `now`, queue concurrency aside.
fn lane_blocked(
    types: &[TypeState],
    circuits: &[CircuitState],
    lane: Lane,
    now: Timestamp,
    retry_token: bool,
) -> Option<HeldReason> {
    let circuit = &circuits[lane.circuit];
    let state = &types[circuit.type_id];
    if !circuit.breaker.allows(now) {
        Some(HeldReason::CircuitOpen)
    } else if state.limit.is_some_and(|limit| state.running >= limit) {
        Some(HeldReason::TypeConcurrencyLimit)
    } else if lane.retry && !retry_token {
        Some(HeldReason::RetryRateLimited)
    } else {
        None
    }
}

/// nginx's smooth weighted round robin: every eligible bucket gains its weight, the richest (ties to
/// the higher priority) is chosen and pays the total. Buckets sitting out start again from zero, so
/// an idle bucket does not save up credit for a burst later.
fn smooth_weighted_round_robin(
    current: &mut [i64; 4],
    weights: &Weights,
    eligible: [bool; 4],
) -> Option<Priority> {
    let mut total = 0i64;
    let mut chosen: Option<Priority> = None;
    for priority in Priority::ALL {
        let index = priority.index();
        if !eligible[index] {
            current[index] = 0;
            continue;
        }
        let weight = i64::from(weights.of(priority));
        current[index] += weight;
        total += weight;
        if chosen.is_none_or(|best| current[index] > current[best.index()]) {
            chosen = Some(priority);
        }
    }
    let chosen = chosen?;
    current[chosen.index()] -= total;
    Some(chosen)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::SignedDuration;
    use proptest::prelude::*;

    use super::*;
    use crate::core::queue::MaxWait;
    use crate::core::queue::breaker::BreakerConfig;
    use crate::core::queue::weights::{WeightWindow, WindowLimits};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid test timestamp")
    }

    fn task(
        priority: Priority,
        task_type: &str,
        queued_at: Timestamp,
        attempt: u32,
    ) -> PendingTask {
        in_namespace("ns", priority, task_type, queued_at, attempt)
    }

    fn in_namespace(
        namespace: &str,
        priority: Priority,
        task_type: &str,
        queued_at: Timestamp,
        attempt: u32,
    ) -> PendingTask {
        PendingTask {
            priority,
            namespace: namespace.to_string(),
            task_type: task_type.to_string(),
            queued_at,
            attempt,
        }
    }

    fn unlimited() -> QueueConfig {
        QueueConfig {
            concurrency: u32::MAX,
            ..QueueConfig::default()
        }
    }

    /// Dispatches and finishes until nothing more goes; returns the dispatch order.
    fn drain(dispatcher: &mut Dispatcher<u32>, now: Timestamp) -> Vec<u32> {
        let mut order = Vec::new();
        while let Some(key) = dispatcher.next(now) {
            dispatcher.finished(&key, Outcome::Succeeded, now);
            order.push(key);
        }
        order
    }

    #[test]
    fn saturated_buckets_share_dispatches_by_weight() {
        let mut dispatcher = Dispatcher::new(unlimited());
        let now = t(0);
        // 50 tasks per bucket, each put back when done: every bucket stays non-empty.
        let mut priority_of = HashMap::new();
        for key in 0..200u32 {
            let priority = Priority::ALL[(key % 4) as usize];
            priority_of.insert(key, priority);
            dispatcher.upsert(key, task(priority, "work", now, 1));
        }
        let mut shares = [0u32; 4];
        for _ in 0..10_000 {
            let key = dispatcher
                .next(now)
                .expect("saturated buckets always dispatch");
            dispatcher.finished(&key, Outcome::Succeeded, now);
            let priority = priority_of[&key];
            shares[priority.index()] += 1;
            dispatcher.upsert(key, task(priority, "work", now, 1));
        }
        for (priority, expected) in Priority::ALL.into_iter().zip([4000i64, 3000, 2000, 1000]) {
            let got = i64::from(shares[priority.index()]);
            assert!(
                (got - expected).abs() * 50 <= expected,
                "{priority:?}: {got} of 10000, expected {expected} ± 2%"
            );
        }
    }

    #[test]
    fn round_robin_is_smooth() {
        let mut current = [0; 4];
        let weights = Weights::default();
        let order: Vec<Priority> = (0..10)
            .map(|_| {
                smooth_weighted_round_robin(&mut current, &weights, [true; 4])
                    .expect("eligible buckets")
            })
            .collect();
        use Priority::*;
        assert_eq!(
            order,
            [
                Critical, High, Normal, Critical, High, Low, Critical, Normal, High, Critical
            ]
        );
    }

    #[test]
    fn empty_and_zero_weight_buckets_are_skipped() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            weights: Weights {
                critical: 0,
                ..Weights::default()
            },
            ..unlimited()
        });
        dispatcher.upsert(1, task(Priority::Critical, "a", t(0), 1));
        dispatcher.upsert(2, task(Priority::Low, "a", t(1), 1));
        assert_eq!(drain(&mut dispatcher, t(2)), vec![2]);
        assert_eq!(
            dispatcher.held_reason(&1, t(2)).map(|(r, _)| r),
            Some(HeldReason::Waiting)
        );
    }

    #[test]
    fn low_task_waits_at_most_max_wait_plus_one_dispatch_behind_critical() {
        for low_weight in [0, 1] {
            let config = QueueConfig {
                concurrency: 10,
                weights: Weights {
                    critical: 1000,
                    low: low_weight,
                    ..Weights::default()
                },
                ..QueueConfig::default()
            };
            let mut dispatcher = Dispatcher::new(config);
            let start = t(0);
            for key in 0..10_000u32 {
                dispatcher.upsert(key, task(Priority::Critical, "hot", start, 1));
            }
            let low_key = 1_000_000;
            dispatcher.upsert(low_key, task(Priority::Low, "cold", start, 1));
            let mut running = std::collections::VecDeque::new();
            let mut now = start;
            let dispatched_at = loop {
                // One task finishes and one dispatch happens every second.
                if running.len() == 10 {
                    let done = running.pop_front().expect("a running task");
                    dispatcher.finished(&done, Outcome::Succeeded, now);
                }
                let key = dispatcher
                    .next(now)
                    .expect("critical tasks are always pending");
                if key == low_key {
                    break now;
                }
                running.push_back(key);
                now += SignedDuration::from_secs(1);
                assert!(now < t(1000), "the low task was never dispatched");
            };
            let waited = dispatched_at.duration_since(start);
            assert!(
                waited <= SignedDuration::from_secs(121),
                "weight {low_weight}: waited {waited:?}"
            );
        }
    }

    #[test]
    fn oldest_overdue_head_goes_first() {
        let mut dispatcher = Dispatcher::new(unlimited());
        dispatcher.upsert(1, task(Priority::Critical, "a", t(0), 1));
        dispatcher.upsert(2, task(Priority::Low, "a", t(10), 1));
        dispatcher.upsert(3, task(Priority::Normal, "a", t(20), 1));
        // At 200 s both Low (190 s > 120 s) and Normal (180 s > 30 s) are overdue; Low is older.
        assert_eq!(drain(&mut dispatcher, t(200)), vec![2, 3, 1]);
    }

    #[test]
    fn fifo_within_a_bucket_by_queued_at_then_key() {
        let mut dispatcher = Dispatcher::new(unlimited());
        for (key, queued) in [(5, 3), (4, 1), (9, 2), (1, 2), (7, 0)] {
            dispatcher.upsert(key, task(Priority::High, "a", t(queued), 1));
        }
        assert_eq!(drain(&mut dispatcher, t(5)), vec![7, 4, 1, 9, 5]);
    }

    #[test]
    fn upsert_moves_a_task() {
        let mut dispatcher = Dispatcher::new(unlimited());
        dispatcher.upsert(1, task(Priority::Low, "a", t(0), 1));
        dispatcher.upsert(2, task(Priority::Low, "a", t(1), 1));
        dispatcher.upsert(1, task(Priority::Low, "a", t(2), 1));
        assert_eq!(dispatcher.pending_len(), 2);
        assert_eq!(drain(&mut dispatcher, t(3)), vec![2, 1]);
    }

    #[test]
    fn removal_works_for_pending_and_running() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 1,
            ..QueueConfig::default()
        });
        for key in 1..=3 {
            dispatcher.upsert(key, task(Priority::Normal, "a", t(key.into()), 1));
        }
        assert!(dispatcher.remove(&1));
        assert!(!dispatcher.remove(&1));
        assert_eq!(dispatcher.held_reason(&1, t(5)).map(|(r, _)| r), None);
        assert_eq!(dispatcher.next(t(5)), Some(2));
        assert_eq!(dispatcher.next(t(5)), None);
        assert_eq!(
            dispatcher.held_reason(&3, t(5)).map(|(r, _)| r),
            Some(HeldReason::ConcurrencyLimit)
        );
        assert!(dispatcher.remove(&2));
        assert_eq!(dispatcher.next(t(5)), Some(3));
        assert_eq!(dispatcher.stats(t(5)).pending.map(|(_, n)| n), [0; 4]);
    }

    #[test]
    fn queue_concurrency_counts_scheduled_and_running() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 2,
            ..QueueConfig::default()
        });
        dispatcher.mark_running(100, "ns", "a");
        for key in 1..=3 {
            dispatcher.upsert(key, task(Priority::Normal, "a", t(0), 1));
        }
        assert_eq!(dispatcher.next(t(1)), Some(1));
        assert_eq!(dispatcher.next(t(1)), None);
        assert!(dispatcher.finished(&100, Outcome::Succeeded, t(2)));
        assert!(!dispatcher.finished(&100, Outcome::Succeeded, t(2)));
        assert_eq!(dispatcher.next(t(2)), Some(2));
        assert_eq!(dispatcher.stats(t(2)).running, 2);
    }

    #[test]
    fn blocked_types_do_not_block_others() {
        let mut config = unlimited();
        config.type_concurrency.insert("slow".to_string(), 1);
        let mut dispatcher = Dispatcher::new(config);
        for key in 0..5 {
            dispatcher.upsert(key, task(Priority::Normal, "slow", t(key.into()), 1));
        }
        dispatcher.upsert(10, task(Priority::Normal, "fast", t(10), 1));
        dispatcher.upsert(11, task(Priority::Normal, "fast", t(11), 1));
        assert_eq!(dispatcher.next(t(20)), Some(0));
        assert_eq!(
            dispatcher.held_reason(&1, t(20)).map(|(r, _)| r),
            Some(HeldReason::TypeConcurrencyLimit)
        );
        assert_eq!(
            dispatcher.held_reason(&10, t(20)).map(|(r, _)| r),
            Some(HeldReason::Waiting)
        );
        assert_eq!(dispatcher.next(t(20)), Some(10));
        assert_eq!(dispatcher.next(t(20)), Some(11));
        assert_eq!(dispatcher.next(t(20)), None);
        dispatcher.finished(&0, Outcome::Succeeded, t(21));
        assert_eq!(dispatcher.next(t(21)), Some(1));
    }

    #[test]
    fn retries_wait_for_tokens_without_blocking_first_attempts() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            retry_rate_per_minute: 60,
            ..unlimited()
        });
        dispatcher.upsert(1, task(Priority::Normal, "a", t(0), 2));
        dispatcher.upsert(2, task(Priority::Normal, "a", t(1), 3));
        dispatcher.upsert(3, task(Priority::Normal, "a", t(2), 1));
        assert_eq!(dispatcher.next(t(10)), Some(1));
        assert_eq!(
            dispatcher.held_reason(&2, t(10)).map(|(r, _)| r),
            Some(HeldReason::RetryRateLimited)
        );
        assert_eq!(dispatcher.next(t(10)), Some(3));
        assert_eq!(dispatcher.next(t(10)), None);
        assert_eq!(dispatcher.next(t(11)), Some(2));
    }

    #[test]
    fn open_circuit_holds_its_type_and_lets_one_probe_through() {
        let mut dispatcher = Dispatcher::new(unlimited());
        let failing = "flaky";
        for key in 0..10 {
            dispatcher.upsert(key, task(Priority::High, failing, t(0), 1));
        }
        let started = drain_without_finishing(&mut dispatcher, t(0));
        for key in &started {
            dispatcher.finished(key, Outcome::Failed, t(1));
        }
        let stats = dispatcher.stats(t(1));
        assert_eq!(
            stats.open_circuits,
            vec![OpenCircuit {
                namespace: "ns".to_string(),
                task_type: failing.to_string(),
                state: BreakerState::Open { until: t(31) }
            }]
        );
        // Older tasks of the open type do not hold up a healthy type in the same bucket.
        for key in 20..23 {
            dispatcher.upsert(key, task(Priority::High, failing, t(2), 1));
        }
        dispatcher.upsert(30, task(Priority::High, "healthy", t(3), 1));
        assert_eq!(
            dispatcher.held_reason(&20, t(4)).map(|(r, _)| r),
            Some(HeldReason::CircuitOpen)
        );
        assert_eq!(drain_without_finishing(&mut dispatcher, t(4)), vec![30]);
        // Half-open after 30 s: exactly one probe.
        assert_eq!(
            drain_without_finishing(&mut dispatcher, t(30)),
            Vec::<u32>::new()
        );
        assert_eq!(drain_without_finishing(&mut dispatcher, t(31)), vec![20]);
        assert_eq!(
            drain_without_finishing(&mut dispatcher, t(100)),
            Vec::<u32>::new()
        );
        assert_eq!(
            dispatcher.held_reason(&21, t(100)).map(|(r, _)| r),
            Some(HeldReason::CircuitOpen)
        );
        // Probe fails: open again for 30 s.
        dispatcher.finished(&20, Outcome::Failed, t(101));
        assert_eq!(
            drain_without_finishing(&mut dispatcher, t(130)),
            Vec::<u32>::new()
        );
        assert_eq!(drain_without_finishing(&mut dispatcher, t(131)), vec![21]);
        // Probe succeeds: closed, the rest goes.
        dispatcher.finished(&21, Outcome::Succeeded, t(132));
        assert_eq!(dispatcher.stats(t(132)).open_circuits, vec![]);
        assert_eq!(drain_without_finishing(&mut dispatcher, t(132)), vec![22]);
    }

    #[test]
    fn aborted_probe_lets_another_probe_through() {
        let mut dispatcher = Dispatcher::new(unlimited());
        for key in 0..10 {
            dispatcher.upsert(key, task(Priority::High, "flaky", t(0), 1));
        }
        for key in drain_without_finishing(&mut dispatcher, t(0)) {
            dispatcher.finished(&key, Outcome::Failed, t(0));
        }
        dispatcher.upsert(1, task(Priority::High, "flaky", t(1), 1));
        dispatcher.upsert(2, task(Priority::High, "flaky", t(1), 1));
        assert_eq!(drain_without_finishing(&mut dispatcher, t(30)), vec![1]);
        assert!(dispatcher.remove(&1));
        assert_eq!(drain_without_finishing(&mut dispatcher, t(30)), vec![2]);
    }

    #[test]
    fn one_namespace_failing_does_not_open_the_circuit_of_another() {
        let mut dispatcher = Dispatcher::new(unlimited());
        // Ten failures of team a: its breaker (minRequests 10) opens.
        for key in 0..10 {
            dispatcher.upsert(key, in_namespace("team-a", Priority::High, "x", t(0), 1));
        }
        for key in drain_without_finishing(&mut dispatcher, t(0)) {
            dispatcher.finished(&key, Outcome::Failed, t(1));
        }
        let open = dispatcher.stats(t(2)).open_circuits;
        assert_eq!(
            open.iter()
                .map(|c| (c.namespace.as_str(), c.task_type.as_str()))
                .collect::<Vec<_>>(),
            [("team-a", "x")]
        );
        // Team a's next task of type x is held; team b's, queued later, goes.
        dispatcher.upsert(20, in_namespace("team-a", Priority::High, "x", t(2), 1));
        dispatcher.upsert(21, in_namespace("team-b", Priority::High, "x", t(3), 1));
        assert_eq!(
            dispatcher.held_reason(&20, t(4)).map(|(r, _)| r),
            Some(HeldReason::CircuitOpen)
        );
        assert_eq!(
            dispatcher.held_reason(&21, t(4)).map(|(r, _)| r),
            Some(HeldReason::Waiting)
        );
        assert_eq!(drain_without_finishing(&mut dispatcher, t(4)), vec![21]);
    }

    #[test]
    fn type_concurrency_is_shared_by_the_namespaces() {
        let mut config = unlimited();
        config.type_concurrency.insert("x".to_string(), 2);
        let mut dispatcher = Dispatcher::new(config);
        dispatcher.mark_running(0, "team-a", "x");
        dispatcher.upsert(1, in_namespace("team-a", Priority::Normal, "x", t(0), 1));
        dispatcher.upsert(2, in_namespace("team-b", Priority::Normal, "x", t(1), 1));
        dispatcher.upsert(3, in_namespace("team-c", Priority::Normal, "x", t(2), 1));
        assert_eq!(drain_without_finishing(&mut dispatcher, t(3)), vec![1]);
        for key in [2, 3] {
            assert_eq!(
                dispatcher.held_reason(&key, t(3)),
                Some((HeldReason::TypeConcurrencyLimit, "x"))
            );
        }
        dispatcher.finished(&0, Outcome::Succeeded, t(4));
        assert_eq!(drain_without_finishing(&mut dispatcher, t(4)), vec![2]);
    }

    #[test]
    fn a_task_taken_out_comes_back_as_it_was() {
        let mut dispatcher = Dispatcher::new(unlimited());
        let retry = in_namespace("team-a", Priority::Low, "x", t(5), 3);
        dispatcher.upsert(1, retry.clone());
        dispatcher.upsert(2, task(Priority::Low, "x", t(6), 1));
        assert_eq!(dispatcher.take_pending(&1), Some(retry.clone()));
        assert_eq!(dispatcher.take_pending(&1), None);
        assert_eq!(dispatcher.pending_len(), 1);
        dispatcher.upsert(1, retry);
        assert_eq!(drain(&mut dispatcher, t(7)), vec![1, 2]);
    }

    proptest! {
        /// Whatever happens to the tasks of type x in namespace a, the tasks of type x in namespace
        /// b (which always succeed) are never held by a circuit, and no circuit of b opens.
        #[test]
        fn circuits_are_isolated_per_namespace(
            steps in proptest::collection::vec((any::<bool>(), 0u8..4, any::<bool>()), 1..200),
        ) {
            let mut dispatcher: Dispatcher<u32> = Dispatcher::new(QueueConfig {
                concurrency: 4,
                circuit_breaker: BreakerConfig {
                    window_size: 4,
                    min_requests: 2,
                    ..BreakerConfig::default()
                },
                ..QueueConfig::default()
            });
            let mut now = t(0);
            // Key -> whether it is in namespace b.
            let mut in_b_of: Vec<bool> = Vec::new();
            let mut running: Vec<u32> = Vec::new();
            for (in_b, action, a_fails) in steps {
                match action {
                    0 | 1 => {
                        let key = in_b_of.len() as u32;
                        let namespace = if in_b { "b" } else { "a" };
                        dispatcher.upsert(key, in_namespace(namespace, Priority::Normal, "x", now, 1));
                        in_b_of.push(in_b);
                    }
                    2 => running.extend(dispatcher.next(now)),
                    _ => {
                        if let Some(key) = running.pop() {
                            let fails = a_fails && !in_b_of[key as usize];
                            let outcome = if fails { Outcome::Failed } else { Outcome::Succeeded };
                            dispatcher.finished(&key, outcome, now);
                        }
                        now += SignedDuration::from_secs(7);
                    }
                }
                let stats = dispatcher.stats(now);
                prop_assert!(stats.open_circuits.iter().all(|c| c.namespace == "a"), "{:?}", stats.open_circuits);
                for (key, in_b) in in_b_of.iter().enumerate() {
                    if *in_b {
                        let reason = dispatcher.held_reason(&(key as u32), now).map(|(r, _)| r);
                        prop_assert_ne!(reason, Some(HeldReason::CircuitOpen));
                    }
                }
            }
        }
    }

    fn drain_without_finishing(dispatcher: &mut Dispatcher<u32>, now: Timestamp) -> Vec<u32> {
        std::iter::from_fn(|| dispatcher.next(now)).collect()
    }

    #[test]
    fn weight_schedule_switches_weights_at_its_boundaries() {
        let only_low = Weights {
            critical: 0,
            high: 0,
            normal: 0,
            low: 1,
        };
        let config = QueueConfig {
            weights: Weights {
                low: 0,
                ..Weights::default()
            },
            weight_schedule: vec![
                WeightWindow::parse("22:00", "06:00", "Europe/Berlin", only_low)
                    .expect("valid window"),
            ],
            max_wait: MaxWait {
                low: None,
                ..MaxWait::default()
            },
            ..unlimited()
        };
        let mut dispatcher = Dispatcher::new(config);
        let queued: Timestamp = "2026-03-28T12:00:00Z".parse().expect("valid timestamp");
        dispatcher.upsert(1, task(Priority::Critical, "a", queued, 1));
        dispatcher.upsert(2, task(Priority::Low, "a", queued, 1));
        // 22:00 CET on the night the clocks go forward.
        let evening: Timestamp = "2026-03-28T21:00:00Z".parse().expect("valid timestamp");
        let before = evening - SignedDuration::from_secs(1);
        assert_eq!(drain_without_finishing(&mut dispatcher, before), vec![1]);
        dispatcher.upsert(3, task(Priority::Critical, "a", queued, 1));
        assert_eq!(drain_without_finishing(&mut dispatcher, evening), vec![2]);
        dispatcher.upsert(4, task(Priority::Low, "a", queued, 1));
        // 06:00 CEST is 04:00Z.
        let morning: Timestamp = "2026-03-29T04:00:00Z".parse().expect("valid timestamp");
        let still_night = morning - SignedDuration::from_secs(1);
        assert_eq!(
            drain_without_finishing(&mut dispatcher, still_night),
            vec![4]
        );
        dispatcher.upsert(5, task(Priority::Low, "a", queued, 1));
        assert_eq!(drain_without_finishing(&mut dispatcher, morning), vec![3]);
    }

    #[test]
    fn a_window_overrides_concurrency_and_type_limits_between_its_boundaries() {
        let limits = WindowLimits {
            concurrency: Some(2),
            type_concurrency: [("report".to_string(), 1)].into(),
            retry_rate_per_minute: None,
        };
        // 09:00-10:00 in Asia/Kolkata (+05:30): 03:30Z-04:30Z.
        let config = QueueConfig {
            concurrency: 5,
            weight_schedule: vec![
                WeightWindow::parse_with("09:00", "10:00", "Asia/Kolkata", None, limits)
                    .expect("valid window"),
            ],
            ..QueueConfig::default()
        };
        let mut dispatcher = Dispatcher::new(config);
        let at = |utc: &str| -> Timestamp { utc.parse().expect("valid timestamp") };
        for key in 0..10 {
            dispatcher.upsert(
                key,
                task(Priority::Normal, "work", at("2026-01-05T00:00:00Z"), 1),
            );
        }
        for key in 10..13 {
            dispatcher.upsert(
                key,
                task(Priority::Normal, "report", at("2026-01-05T00:00:01Z"), 1),
            );
        }
        let inside = at("2026-01-05T03:30:00Z");
        assert_eq!(drain_without_finishing(&mut dispatcher, inside).len(), 2);
        assert_eq!(dispatcher.window(), Some(0));
        assert_eq!(dispatcher.effective_concurrency(), 2);
        assert_eq!(
            dispatcher.held_reason(&5, inside).map(|(r, _)| r),
            Some(HeldReason::ConcurrencyLimit)
        );
        // The window ends at 10:00 local time: the queue's 5 apply again, "report" keeps 1.
        let before_end = at("2026-01-05T04:29:59Z");
        assert_eq!(
            drain_without_finishing(&mut dispatcher, before_end),
            Vec::<u32>::new()
        );
        let after = at("2026-01-05T04:30:00Z");
        assert_eq!(drain_without_finishing(&mut dispatcher, after).len(), 3);
        assert_eq!(dispatcher.window(), None);
        assert_eq!(dispatcher.effective_concurrency(), 5);
    }

    #[test]
    fn an_adaptive_limit_below_the_concurrency_holds_with_its_own_reason() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 10,
            ..QueueConfig::default()
        });
        dispatcher.set_adaptive_limit(Some(2));
        for key in 0..5 {
            dispatcher.upsert(key, task(Priority::Normal, "a", t(0), 1));
        }
        assert_eq!(drain_without_finishing(&mut dispatcher, t(1)), vec![0, 1]);
        assert_eq!(
            dispatcher.held_reason(&2, t(1)).map(|(r, _)| r),
            Some(HeldReason::AdaptiveLimit)
        );
        // At the queue's own limit it is the concurrency that holds.
        dispatcher.set_adaptive_limit(Some(10));
        assert_eq!(
            drain_without_finishing(&mut dispatcher, t(2)),
            vec![2, 3, 4]
        );
        dispatcher.set_adaptive_limit(Some(5));
        dispatcher.upsert(9, task(Priority::Normal, "a", t(3), 1));
        assert_eq!(
            dispatcher.held_reason(&9, t(3)).map(|(r, _)| r),
            Some(HeldReason::AdaptiveLimit)
        );
        dispatcher.set_adaptive_limit(None);
        assert_eq!(
            dispatcher.held_reason(&9, t(3)).map(|(r, _)| r),
            Some(HeldReason::Waiting)
        );
    }

    #[test]
    fn positions_count_down_with_dispatches_and_estimates_follow_the_rate() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 1,
            ..QueueConfig::default()
        });
        // Two lanes (types) interleaved by time, plus a retry lane.
        for key in 0..30u32 {
            let task_type = if key % 2 == 0 { "a" } else { "b" };
            let attempt = if key % 5 == 4 { 2 } else { 1 };
            dispatcher.upsert(
                key,
                task(Priority::Low, task_type, t(i64::from(key)), attempt),
            );
        }
        dispatcher.refresh_positions();
        let position =
            |d: &Dispatcher<u32>, key: u32, now| d.estimate(&key, now).expect("pending").position;
        for key in 0..30 {
            assert_eq!(position(&dispatcher, key, t(100)), u64::from(key) + 1);
        }
        // One dispatch every 2 s, each finishing at once.
        let mut now = t(100);
        for _ in 0..10 {
            let key = dispatcher.next(now).expect("a task");
            dispatcher.finished(&key, Outcome::Succeeded, now);
            now += SignedDuration::from_secs(2);
        }
        let last = now - SignedDuration::from_secs(2);
        // No refresh needed for positions to count down.
        assert_eq!(position(&dispatcher, 29, now), 20);
        let estimate = dispatcher.estimate(&29, now).expect("pending");
        assert_eq!(estimate.start, Ok(last + SignedDuration::from_secs(40)));
        assert_eq!(estimate.waiting, 20);
        // A task re-offered in the same place keeps its position; a newcomer goes last.
        dispatcher.upsert(29, task(Priority::Low, "b", t(29), 1));
        assert_eq!(position(&dispatcher, 29, now), 20);
        dispatcher.upsert(100, task(Priority::Low, "a", t(5), 1));
        assert_eq!(position(&dispatcher, 100, now), 21);
        // Until the refresh puts it where its queuedAt says.
        dispatcher.refresh_positions();
        assert_eq!(position(&dispatcher, 100, now), 1);
        assert_eq!(position(&dispatcher, 29, now), 21);
    }

    #[test]
    fn a_paused_queue_restarts_its_measurement() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 1,
            ..QueueConfig::default()
        });
        for key in 0..10u32 {
            dispatcher.upsert(key, task(Priority::High, "a", t(0), 1));
        }
        let mut now = t(0);
        for _ in 0..3 {
            let key = dispatcher.next(now).expect("a task");
            dispatcher.finished(&key, Outcome::Succeeded, now);
            now += SignedDuration::from_secs(1);
        }
        let mut paused = dispatcher.config().clone();
        paused.concurrency = 0;
        dispatcher.set_config(paused.clone(), now);
        assert_eq!(dispatcher.next(now), None);
        // An hour paused, then open again: the hour is not a dispatch interval.
        now += SignedDuration::from_secs(3600);
        paused.concurrency = 1;
        dispatcher.set_config(paused, now);
        for _ in 0..3 {
            let key = dispatcher.next(now).expect("a task");
            dispatcher.finished(&key, Outcome::Succeeded, now);
            now += SignedDuration::from_secs(1);
        }
        let per_minute = dispatcher
            .estimate(&9, now - SignedDuration::from_secs(1))
            .and_then(|e| e.per_minute)
            .expect("a rate");
        assert!((per_minute - 60.0).abs() < 1.0, "{per_minute}");
    }

    #[test]
    fn grants_that_fill_free_slots_are_not_a_rate() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 0,
            ..QueueConfig::default()
        });
        for key in 0..300u32 {
            dispatcher.upsert(key, task(Priority::Low, "a", t(0), 1));
        }
        let mut now = t(10);
        assert_eq!(dispatcher.next(now), None);
        let mut open = dispatcher.config().clone();
        open.concurrency = 30;
        dispatcher.set_config(open, now);
        // The 30 free slots are filled a millisecond apart, as a caller asking with the clock of
        // each call does...
        let mut running = std::collections::VecDeque::new();
        for _ in 0..30 {
            running.push_back(dispatcher.next(now).expect("a free slot"));
            now += SignedDuration::from_millis(1);
        }
        assert_eq!(dispatcher.next(now), None);
        // ... the quickest worker takes 8 s from its grant to its end (its start-up included)...
        now += SignedDuration::from_millis(7500);
        // ... then a slot frees every 500 ms and is granted at once.
        for _ in 0..10 {
            now += SignedDuration::from_millis(500);
            let done = running.pop_front().expect("running");
            dispatcher.finished(&done, Outcome::Succeeded, now);
            running.push_back(dispatcher.next(now).expect("the freed slot"));
            assert_eq!(dispatcher.next(now), None);
        }
        // Neither the fill-up nor the wait for the first worker to end is the pace.
        let estimate = dispatcher.estimate(&299, now).expect("pending");
        assert_eq!(estimate.position, 260);
        let per_minute = estimate.per_minute.expect("a rate");
        assert!((per_minute - 120.0).abs() < 1.0, "{per_minute}");
        let start = estimate.start.expect("a start");
        let expected = now + SignedDuration::from_secs(130);
        assert!(
            start.duration_since(expected).abs() < SignedDuration::from_secs(1),
            "{start} vs {expected}"
        );
    }

    #[test]
    fn config_edits_apply_at_once() {
        let mut dispatcher = Dispatcher::new(QueueConfig {
            concurrency: 1,
            ..QueueConfig::default()
        });
        for key in 0..3 {
            dispatcher.upsert(key, task(Priority::Normal, "a", t(0), 1));
        }
        assert_eq!(drain_without_finishing(&mut dispatcher, t(1)), vec![0]);
        let mut wider = dispatcher.config().clone();
        wider.concurrency = 5;
        wider.type_concurrency.insert("a".to_string(), 2);
        dispatcher.set_config(wider, t(2));
        assert_eq!(drain_without_finishing(&mut dispatcher, t(2)), vec![1]);
        assert_eq!(
            dispatcher.held_reason(&2, t(2)).map(|(r, _)| r),
            Some(HeldReason::TypeConcurrencyLimit)
        );
    }

    #[test]
    fn unused_types_are_forgotten_and_ids_reused() {
        let mut dispatcher = Dispatcher::new(unlimited());
        for round in 0..100u32 {
            let name = format!("type-{round}");
            dispatcher.upsert(round, task(Priority::Low, &name, t(0), 1));
            assert_eq!(drain(&mut dispatcher, t(1)), vec![round]);
        }
        assert_eq!(dispatcher.types.len(), 1);
        assert!(dispatcher.type_ids.is_empty());
        // The same for (namespace, type) circuits.
        for round in 0..100u32 {
            let namespace = format!("ns-{round}");
            dispatcher.upsert(round, in_namespace(&namespace, Priority::Low, "t", t(0), 1));
            assert_eq!(drain(&mut dispatcher, t(1)), vec![round]);
        }
        assert_eq!(dispatcher.circuits.len(), 1);
        assert!(dispatcher.type_ids.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upsert {
            key: u8,
            priority: usize,
            namespace: u8,
            task_type: u8,
            attempt: u32,
            queued_back: i64,
        },
        Remove(u8),
        Next,
        Finish {
            pick: usize,
            outcome: Outcome,
        },
        MarkRunning {
            key: u8,
            namespace: u8,
            task_type: u8,
        },
        Advance(i64),
        Limits {
            concurrency: u32,
            type_limit: u32,
            retry_rate: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..40, 0usize..4, 0u8..2, 0u8..4, 1u32..4, 0i64..200).prop_map(
                |(key, priority, namespace, task_type, attempt, queued_back)| Op::Upsert {
                    key,
                    priority,
                    namespace,
                    task_type,
                    attempt,
                    queued_back,
                }
            ),
            1 => (0u8..40).prop_map(Op::Remove),
            5 => Just(Op::Next),
            3 => (0usize..64, prop_oneof![
                Just(Outcome::Succeeded),
                Just(Outcome::Failed),
                Just(Outcome::Aborted)
            ])
                .prop_map(|(pick, outcome)| Op::Finish { pick, outcome }),
            1 => (0u8..40, 0u8..2, 0u8..4).prop_map(|(key, namespace, task_type)| {
                Op::MarkRunning { key, namespace, task_type }
            }),
            2 => (0i64..40).prop_map(Op::Advance),
            1 => (0u32..8, 0u32..4, 0u32..240).prop_map(|(concurrency, type_limit, retry_rate)| {
                Op::Limits {
                    concurrency,
                    type_limit,
                    retry_rate,
                }
            }),
        ]
    }

    fn type_name(task_type: u8) -> String {
        format!("type-{task_type}")
    }

    fn namespace_name(namespace: u8) -> String {
        format!("ns-{namespace}")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Limits hold at every dispatch (type limits across the namespaces), the chosen task is the
        /// oldest dispatchable one of its bucket, `held_reason` agrees with `next`, and counts match a
        /// plain model.
        #[test]
        fn dispatch_respects_limits_and_reasons(ops in proptest::collection::vec(op(), 1..300)) {
            let mut config = QueueConfig {
                concurrency: 4,
                retry_rate_per_minute: 30,
                circuit_breaker: BreakerConfig {
                    window_size: 4,
                    min_requests: 2,
                    ..BreakerConfig::default()
                },
                ..QueueConfig::default()
            };
            config.type_concurrency.insert(type_name(0), 1);
            config.type_concurrency.insert(type_name(1), 2);
            let mut dispatcher: Dispatcher<u8> = Dispatcher::new(config.clone());
            let mut now = t(1000);
            let mut pending: HashMap<u8, PendingTask> = HashMap::new();
            let mut running: BTreeMap<u8, String> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Upsert { key, priority, namespace, task_type, attempt, queued_back } => {
                        let pending_task = in_namespace(
                            &namespace_name(namespace),
                            Priority::ALL[priority],
                            &type_name(task_type),
                            now - SignedDuration::from_secs(queued_back),
                            attempt,
                        );
                        running.remove(&key);
                        pending.insert(key, pending_task.clone());
                        dispatcher.upsert(key, pending_task);
                    }
                    Op::Remove(key) => {
                        let known = pending.remove(&key).is_some() | running.remove(&key).is_some();
                        prop_assert_eq!(dispatcher.remove(&key), known);
                    }
                    Op::MarkRunning { key, namespace, task_type } => {
                        pending.remove(&key);
                        running.insert(key, type_name(task_type));
                        dispatcher.mark_running(key, &namespace_name(namespace), &type_name(task_type));
                    }
                    Op::Finish { pick, outcome } => {
                        if let Some(key) = running.keys().nth(pick % running.len().max(1)).copied() {
                            running.remove(&key);
                            prop_assert!(dispatcher.finished(&key, outcome, now));
                        }
                    }
                    Op::Advance(secs) => now += SignedDuration::from_secs(secs),
                    Op::Limits { concurrency, type_limit, retry_rate } => {
                        config.concurrency = concurrency;
                        config.type_concurrency.insert(type_name(2), type_limit);
                        config.retry_rate_per_minute = retry_rate;
                        dispatcher.set_config(config.clone(), now);
                    }
                    Op::Next => {
                        let waiting: Vec<u8> = pending
                            .keys()
                            .copied()
                            .filter(|key| dispatcher.held_reason(key, now).map(|(r, _)| r) == Some(HeldReason::Waiting))
                            .collect();
                        match dispatcher.next(now) {
                            Some(key) => {
                                prop_assert!(waiting.contains(&key), "{key} was not dispatchable");
                                let chosen = pending.remove(&key).expect("dispatched a pending task");
                                let ahead = waiting.iter().filter(|other| **other != key).filter(|other| {
                                    let other_task = &pending[other];
                                    other_task.priority == chosen.priority
                                        && (other_task.queued_at, **other) < (chosen.queued_at, key)
                                });
                                prop_assert_eq!(ahead.count(), 0, "FIFO within the bucket");
                                running.insert(key, chosen.task_type.clone());
                                prop_assert!(running.len() <= config.concurrency as usize);
                                let of_type = running.values().filter(|name| **name == chosen.task_type).count();
                                if let Some(limit) = config.type_concurrency.get(&chosen.task_type) {
                                    prop_assert!(of_type <= *limit as usize, "type limit exceeded");
                                }
                            }
                            None => prop_assert!(
                                waiting.is_empty(),
                                "nothing dispatched though {:?} were only waiting",
                                waiting
                            ),
                        }
                    }
                }
                prop_assert_eq!(dispatcher.running_len(), running.len());
                prop_assert_eq!(dispatcher.pending_len(), pending.len());
                let stats = dispatcher.stats(now);
                for (priority, count) in stats.pending {
                    prop_assert_eq!(count, pending.values().filter(|task| task.priority == priority).count());
                }
                for key in pending.keys() {
                    prop_assert!(dispatcher.held_reason(key, now).is_some());
                }
                for key in running.keys() {
                    prop_assert!(dispatcher.is_running(key));
                }
            }
        }
    }
}
