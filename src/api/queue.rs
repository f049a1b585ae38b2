//! The `AxQueue` custom resource: how the tasks naming it are dispatched (DESIGN §4).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// The queue every task names unless it says otherwise; the operator creates it when missing.
pub const DEFAULT_QUEUE: &str = "default";

/// Priority buckets, fairness between them and overload protection for the tasks naming this queue.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ax.dev",
    version = "v1alpha1",
    kind = "AxQueue",
    doc = "A queue of AxTasks: priority buckets dispatched by weighted round robin under concurrency limits, a retry rate limit and circuit breakers per task type.",
    status = "AxQueueStatus",
    shortname = "axq",
    category = "ax",
    printcolumn = r#"{"name":"Critical","type":"integer","jsonPath":".status.pending.critical"}"#,
    printcolumn = r#"{"name":"High","type":"integer","jsonPath":".status.pending.high"}"#,
    printcolumn = r#"{"name":"Normal","type":"integer","jsonPath":".status.pending.normal"}"#,
    printcolumn = r#"{"name":"Low","type":"integer","jsonPath":".status.pending.low"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.running"}"#,
    printcolumn = r#"{"name":"Open-Circuits","type":"integer","jsonPath":".status.openCircuitCount"}"#,
    printcolumn = r#"{"name":"Stop","type":"string","jsonPath":".spec.stopPolicy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Concurrency","type":"integer","jsonPath":".spec.concurrency","priority":1}"#,
    printcolumn = r#"{"name":"Effective","type":"integer","jsonPath":".status.effectiveConcurrency","priority":1}"#,
    printcolumn = r#"{"name":"Dispatched","type":"integer","jsonPath":".status.dispatched","priority":1}"#,
    printcolumn = r#"{"name":"Dead","type":"integer","jsonPath":".status.dead","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AxQueueSpec {
    /// Relative dispatch shares of the priority buckets (smooth weighted round robin).
    #[serde(default)]
    pub weights: QueueWeights,

    /// How long the next task of a bucket may wait before it goes ahead of the weights.
    #[serde(default)]
    pub max_wait_seconds: MaxWaitSeconds,

    /// Most tasks of this queue Scheduled or Running at once; 0 pauses dispatching.
    #[serde(default = "default_concurrency")]
    #[schemars(range(min = 0, max = 1000000))]
    pub concurrency: i32,

    /// Per task type, most of its tasks Scheduled or Running at once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "type_limits")]
    pub type_concurrency: BTreeMap<String, i32>,

    /// Rate of dispatches of retries (attempts after the first), a token bucket.
    #[serde(default = "default_retry_rate")]
    #[schemars(range(min = 0, max = 1000000))]
    pub retry_rate_per_minute: i32,

    /// One breaker per namespace and task type, with these thresholds (teams sharing the queue do
    /// not open each other's circuits).
    #[serde(default)]
    pub circuit_breaker: CircuitBreakerSpec,

    /// Wall-clock windows that override `weights` and, where they say so, `concurrency`,
    /// `typeConcurrency` and `retryRatePerMinute`; the first window containing the time is in force.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub weight_schedule: Vec<WeightScheduleEntry>,

    /// `Fixed` (default): `concurrency` is the limit. `Adaptive`: the operator lowers the limit
    /// while the queue's pods cannot be placed or their nodes report pressure, between `min` and
    /// `concurrency`, and raises it again as pods are placed.
    #[serde(default, skip_serializing_if = "QueueConcurrencyPolicy::is_default")]
    pub concurrency_policy: QueueConcurrencyPolicy,

    /// Which namespaces may use this queue: a label selector over namespaces; absent or empty, all
    /// of them. A task in a namespace it does not select waits (Pending, `Queued` reason
    /// `QueueForbidden`) and holds no slot until its namespace is labelled to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// `None` (default): the queue dispatches. `Hold`: nothing more is dispatched; running tasks
    /// finish. `HoldAndDrain`: nothing is dispatched and running attempts are stopped and wait in
    /// the queue again (a failure that does not count against `maxRetries`). Kueue's vocabulary.
    #[serde(default, skip_serializing_if = "StopPolicy::is_none")]
    pub stop_policy: StopPolicy,

    /// Fair shares between keys (tenants): within each priority bucket, dispatches go round robin
    /// across the keys with waiting tasks — their namespaces, or a label or payload field (`key`) —
    /// weighted by `weights`, so one key's backlog cannot take every slot from the others. Absent:
    /// a bucket dispatches its oldest task first, whoever's, and the key is the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<FairnessSpec>,

    /// Most tasks of one key (`fairness.key`; by default the namespace) Scheduled or Running at
    /// once in this queue; tasks over it wait (`Queued` reason `KeyConcurrencyLimit`) without
    /// holding up other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_concurrency: Option<KeyConcurrencySpec>,

    /// Most dispatches of one key (`fairness.key`; by default the namespace) per minute, a token
    /// bucket per key; tasks over it wait (`Queued` reason `KeyRateLimit`) without holding up
    /// other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rate: Option<KeyRateSpec>,

    /// Whether urgent tasks may stop lower-priority running ones when the queue is full.
    #[serde(default, skip_serializing_if = "PreemptionSpec::is_default")]
    pub preemption: PreemptionSpec,
}

/// `spec.preemption`: when a Critical or High task has waited `afterSeconds` in a full queue, the
/// running attempt of the lowest priority (the most recently dispatched of them) is stopped to free
/// its slot (Kueue's `withinClusterQueue: LowerPriority`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionSpec {
    /// `Never` (default) or `LowerPriority`.
    #[serde(default)]
    pub within_queue: PreemptionPolicy,
    /// How long a Critical or High task waits for a slot before one is taken for it.
    #[serde(default = "default_preempt_after")]
    #[schemars(range(min = 0, max = 86400))]
    pub after_seconds: i32,
    /// Most attempts stopped this way in any minute.
    #[serde(default = "default_preempt_per_minute")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_per_minute: i32,
}

/// Whether running tasks of lower priority may be stopped for waiting Critical or High ones.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PreemptionPolicy {
    /// Nothing is stopped: urgent tasks wait for a slot like the others.
    #[default]
    Never,
    /// A running attempt of a lower priority than the waiting task may be stopped.
    LowerPriority,
}

impl Default for PreemptionSpec {
    fn default() -> Self {
        Self {
            within_queue: PreemptionPolicy::Never,
            after_seconds: default_preempt_after(),
            max_per_minute: default_preempt_per_minute(),
        }
    }
}

impl PreemptionSpec {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

fn default_preempt_after() -> i32 {
    60
}

fn default_preempt_per_minute() -> i32 {
    6
}

/// `spec.keyRate`: a token bucket of dispatches per key (tenant).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRateSpec {
    /// Dispatches per minute of each key (60 = one a second); 0 dispatches nothing.
    #[schemars(range(min = 0, max = 1000000))]
    pub per_minute: i32,
    /// Dispatches a key may make at once after waiting; default one second's worth, at
    /// least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub burst: Option<i32>,
}

/// `spec.fairness`: how dispatches are shared between the keys (tenants) of a queue.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FairnessSpec {
    /// Where a task's key comes from, for fair shares, `keyConcurrency` and `keyRate` alike:
    /// absent, its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeySourceSpec>,
    /// Share of a key relative to the others, by key value; unnamed keys weigh 1.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "key_weights")]
    pub weights: BTreeMap<String, i32>,
}

/// `spec.fairness.key`: exactly one of `label` and `payload`. Tasks without that label or field
/// share the key `<none>`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeySourceSpec {
    /// The name of a label of the task (e.g. `customer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// A dotted path to a field of the task's payload (e.g. `customer.id`) whose value is a
    /// string, number or boolean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// `spec.keyConcurrency`: most tasks of one key (tenant) Scheduled or Running at once.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyConcurrencySpec {
    /// The limit of every key not named in `overrides`; absent: no limit for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub limit: Option<i32>,
    /// Limits of some keys, by key value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "type_limits")]
    pub overrides: BTreeMap<String, i32>,
}

/// Whether a queue dispatches (`spec.stopPolicy`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum StopPolicy {
    /// The queue dispatches.
    #[default]
    None,
    /// Nothing more is dispatched; running tasks finish.
    Hold,
    /// Nothing is dispatched and running attempts are stopped, to run again once it is `None`.
    HoldAndDrain,
}

impl StopPolicy {
    pub fn is_none(&self) -> bool {
        *self == StopPolicy::None
    }

    /// Whether the queue dispatches nothing.
    pub fn holds(self) -> bool {
        self != StopPolicy::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StopPolicy::None => "None",
            StopPolicy::Hold => "Hold",
            StopPolicy::HoldAndDrain => "HoldAndDrain",
        }
    }
}

impl Default for AxQueueSpec {
    fn default() -> Self {
        Self {
            weights: QueueWeights::default(),
            max_wait_seconds: MaxWaitSeconds::default(),
            concurrency: default_concurrency(),
            type_concurrency: BTreeMap::new(),
            retry_rate_per_minute: default_retry_rate(),
            circuit_breaker: CircuitBreakerSpec::default(),
            weight_schedule: Vec::new(),
            concurrency_policy: QueueConcurrencyPolicy::default(),
            namespace_selector: None,
            stop_policy: StopPolicy::None,
            fairness: None,
            key_concurrency: None,
            key_rate: None,
            preemption: PreemptionSpec::default(),
        }
    }
}

fn default_concurrency() -> i32 {
    100
}
fn default_retry_rate() -> i32 {
    1000
}

/// A map of task type to a limit of at least 0.
fn type_limits(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "integer", "format": "int32", "minimum": 0},
    })
}

fn key_weights(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 1000},
    })
}

/// Weight of each priority bucket; 0 = the bucket goes only when its max-wait is exceeded.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueWeights {
    /// Share of dispatches of the Critical bucket (default 4).
    #[serde(default = "weight_critical")]
    #[schemars(range(min = 0, max = 1000))]
    pub critical: i32,
    /// Share of dispatches of the High bucket (default 3).
    #[serde(default = "weight_high")]
    #[schemars(range(min = 0, max = 1000))]
    pub high: i32,
    /// Share of dispatches of the Normal bucket (default 2).
    #[serde(default = "weight_normal")]
    #[schemars(range(min = 0, max = 1000))]
    pub normal: i32,
    /// Share of dispatches of the Low bucket (default 1).
    #[serde(default = "weight_low")]
    #[schemars(range(min = 0, max = 1000))]
    pub low: i32,
}

impl Default for QueueWeights {
    fn default() -> Self {
        Self {
            critical: weight_critical(),
            high: weight_high(),
            normal: weight_normal(),
            low: weight_low(),
        }
    }
}

fn weight_critical() -> i32 {
    4
}
fn weight_high() -> i32 {
    3
}
fn weight_normal() -> i32 {
    2
}
fn weight_low() -> i32 {
    1
}

/// Per bucket, the longest its next task waits before it is dispatched ahead of the weights;
/// 0 = no limit.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaxWaitSeconds {
    /// Longest wait of the next Critical task, in seconds (default 0: no limit).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub critical: i64,
    /// Longest wait of the next High task, in seconds (default 0: no limit).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub high: i64,
    /// Longest wait of the next Normal task, in seconds (default 30).
    #[serde(default = "max_wait_normal")]
    #[schemars(range(min = 0))]
    pub normal: i64,
    /// Longest wait of the next Low task, in seconds (default 120): low priorities never starve.
    #[serde(default = "max_wait_low")]
    #[schemars(range(min = 0))]
    pub low: i64,
}

impl Default for MaxWaitSeconds {
    fn default() -> Self {
        Self {
            critical: 0,
            high: 0,
            normal: max_wait_normal(),
            low: max_wait_low(),
        }
    }
}

fn max_wait_normal() -> i64 {
    30
}
fn max_wait_low() -> i64 {
    120
}

/// Thresholds of the circuit breakers (one per namespace and task type).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreakerSpec {
    /// How many of the most recent outcomes of a type are judged; 0 disables the breakers.
    #[serde(default = "breaker_window")]
    #[schemars(range(min = 0, max = 10000))]
    pub window_size: i32,
    /// Fewer outcomes than this in the window never open the breaker.
    #[serde(default = "breaker_min_requests")]
    #[schemars(range(min = 1, max = 10000))]
    pub min_requests: i32,
    /// Failures / outcomes at or above which the breaker opens (above 0, at most 1).
    #[serde(default = "breaker_failure_ratio")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub failure_ratio: f64,
    /// How long an open breaker holds its tasks before one probe is let through.
    #[serde(default = "breaker_open_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub open_seconds: i64,
}

impl Default for CircuitBreakerSpec {
    fn default() -> Self {
        Self {
            window_size: breaker_window(),
            min_requests: breaker_min_requests(),
            failure_ratio: breaker_failure_ratio(),
            open_seconds: breaker_open_seconds(),
        }
    }
}

fn breaker_window() -> i32 {
    20
}
fn breaker_min_requests() -> i32 {
    10
}
fn breaker_failure_ratio() -> f64 {
    0.5
}
fn breaker_open_seconds() -> i64 {
    30
}

/// A wall-clock window, `from` inclusive and `to` exclusive ("HH:MM", 24-hour) in `timeZone`;
/// `from` later than `to` wraps midnight, equal covers the whole day. Inside it, each field it sets
/// replaces the queue's own; fields it leaves out keep the queue's values.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightScheduleEntry {
    /// Start of the window, `HH:MM` (24-hour), inclusive.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub from: String,
    /// End of the window, `HH:MM` (24-hour), exclusive.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub to: String,
    /// An IANA time zone such as `Europe/Berlin`.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
    /// The bucket weights inside the window; absent: `spec.weights`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<QueueWeights>,
    /// `spec.concurrency` inside the window (0 pauses the queue); absent: `spec.concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub concurrency: Option<i32>,
    /// Per task type, the limit inside the window; types it does not name keep
    /// `spec.typeConcurrency`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "type_limits")]
    pub type_concurrency: BTreeMap<String, i32>,
    /// `spec.retryRatePerMinute` inside the window; absent: `spec.retryRatePerMinute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub retry_rate_per_minute: Option<i32>,
}

impl Default for WeightScheduleEntry {
    fn default() -> Self {
        Self {
            from: "00:00".into(),
            to: "00:00".into(),
            time_zone: default_time_zone(),
            weights: None,
            concurrency: None,
            type_concurrency: BTreeMap::new(),
            retry_rate_per_minute: None,
        }
    }
}

/// How the queue's concurrency limit is set.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueConcurrencyPolicy {
    /// `Fixed` (default): `concurrency` as written; `Adaptive`: lowered while worker pods cannot be
    /// placed or nodes are under pressure, raised again as they are placed.
    #[serde(default)]
    pub mode: ConcurrencyMode,
    /// `Adaptive` never goes below this (unless the limit in force is lower: a window's
    /// `concurrency`, or 0 to pause, always caps it).
    #[serde(default = "default_adaptive_min")]
    #[schemars(range(min = 1, max = 1000000))]
    pub min: i32,
}

impl Default for QueueConcurrencyPolicy {
    fn default() -> Self {
        Self {
            mode: ConcurrencyMode::Fixed,
            min: default_adaptive_min(),
        }
    }
}

impl QueueConcurrencyPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

fn default_adaptive_min() -> i32 {
    1
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConcurrencyMode {
    /// The limit is `concurrency` (or the window's).
    #[default]
    Fixed,
    /// The limit follows what the cluster can place, up to `concurrency`.
    Adaptive,
}

fn default_time_zone() -> String {
    "UTC".into()
}

/// What the queue holds and the limits in force, as the operator last saw them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AxQueueStatus {
    /// Tasks waiting for dispatch, per priority bucket.
    #[serde(default)]
    pub pending: PendingCounts,
    /// Tasks Scheduled or Running.
    #[serde(default)]
    pub running: i64,
    /// Task types whose circuit is open or half-open, in at least one namespace (breakers are per
    /// namespace and type; `circuits` says which).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_circuits: Vec<String>,
    /// Each breaker not closed, per namespace and type: open until when, or half-open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub circuits: Vec<CircuitStatus>,
    /// Length of `openCircuits`, for `kubectl get`.
    #[serde(default)]
    pub open_circuit_count: i64,
    /// Attempts dispatched from this queue, in all.
    #[serde(default)]
    pub dispatched: i64,
    /// Tasks of this queue that went Dead, in all.
    #[serde(default)]
    pub dead: i64,
    /// Tasks waiting because `namespaceSelector` does not select their namespace (`QueueForbidden`;
    /// not counted in `pending`).
    #[serde(default)]
    pub forbidden: i64,
    /// Retry tokens available (`retryRatePerMinute`'s bucket) when the status was written.
    #[serde(default)]
    pub retry_tokens: i64,
    /// `InvalidSpec`: true while the spec cannot be applied (the previous configuration stays).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The last generation the operator has seen (`InvalidSpec` says whether it is in force).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The limits in force now: the spec's, or those of the `weightSchedule` window in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<QueueLimits>,
    /// The `weightSchedule` window in force now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_window: Option<ActiveWindow>,
    /// Most tasks dispatched at once right now: `limits.concurrency`, or less while
    /// `concurrencyPolicy: Adaptive` holds it lower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_concurrency: Option<i64>,
    /// For a queue with `fairness`, `keyConcurrency` or `keyRate`: its 10 namespaces with the most
    /// tasks Scheduled, Running or waiting, most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<QueueKeyStatus>,
    /// The last change of `effectiveConcurrency` made by the adaptive policy, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_concurrency_change: Option<ConcurrencyChange>,
}

/// One key (tenant) of a queue.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueKeyStatus {
    /// The key: a namespace, or a label or payload value (`spec.fairness.key`).
    pub key: String,
    /// Its tasks Scheduled or Running.
    pub running: i64,
    /// Its tasks waiting for dispatch.
    pub waiting: i64,
}

/// The limits a queue applies now.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueLimits {
    /// Most tasks Scheduled or Running at once.
    pub concurrency: i64,
    /// Per task type, most of its tasks Scheduled or Running at once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub type_concurrency: BTreeMap<String, i64>,
    /// Most retries dispatched per minute.
    pub retry_rate_per_minute: i64,
}

/// Which `weightSchedule` entry is in force.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveWindow {
    /// Its index in `spec.weightSchedule`.
    pub index: i64,
    /// Its start, `HH:MM`.
    pub from: String,
    /// Its end, `HH:MM`.
    pub to: String,
    /// The IANA time zone it is read in.
    pub time_zone: String,
}

/// One change of the adaptive concurrency.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencyChange {
    /// When it changed.
    #[schemars(schema_with = "super::date_time")]
    pub time: jiff::Timestamp,
    /// The concurrency before.
    pub from: i64,
    /// The concurrency after.
    pub to: i64,
    /// `PodsUnschedulable`, `NodePressure` (lowered) or `PodsPlaced` (raised).
    pub reason: String,
    /// What the policy saw, in words.
    #[serde(default)]
    pub message: String,
}

/// One circuit breaker that is not closed: that of the tasks of one type in one namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitStatus {
    /// The namespace whose tasks it holds.
    #[serde(default)]
    pub namespace: String,
    /// The task type.
    #[serde(rename = "type")]
    pub task_type: String,
    /// `Open` (nothing of the type is dispatched) or `HalfOpen` (one probe may run).
    pub state: String,
    /// When an open breaker lets one probe through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::date_time")]
    pub reopens_at: Option<Timestamp>,
}

/// Waiting tasks per priority bucket.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingCounts {
    /// Critical tasks waiting.
    #[serde(default)]
    pub critical: i64,
    /// High tasks waiting.
    #[serde(default)]
    pub high: i64,
    /// Normal tasks waiting.
    #[serde(default)]
    pub normal: i64,
    /// Low tasks waiting.
    #[serde(default)]
    pub low: i64,
}
