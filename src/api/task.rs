//! The `AxTask` custom resource: one unit of work and the record of its lifecycle.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use jiff::Timestamp;

use super::{Condition, PodTemplate, date_time, preserve_unknown_object};

/// On an AxTask's exit handler (`spec.onExit`): the task it handles.
pub const LABEL_EXIT_OF: &str = "ax.dev/exit-of";

/// What to run, how urgently, and what to do when it fails.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ax.dev",
    version = "v1alpha1",
    kind = "AxTask",
    doc = "One unit of work: queued by priority, run as a worker Pod, retried with backoff, its every state change recorded.",
    namespaced,
    status = "AxTaskStatus",
    shortname = "axt",
    category = "ax",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Priority","type":"string","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","jsonPath":".status.attempt"}"#,
    printcolumn = r#"{"name":"Worker","type":"string","jsonPath":".status.worker"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason","priority":1}"#,
    // A string, not a date: kubectl renders a future date as `<invalid>`.
    printcolumn = r#"{"name":"Next-Attempt","type":"string","jsonPath":".status.nextAttemptAt","priority":1}"#,
    printcolumn = r#"{"name":"Terminating","type":"string","jsonPath":".status.conditions[?(@.type==\"WorkerTerminating\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
// `type` and `template`, or a template to take them from: the API server refuses a task with
// neither (Kubernetes 1.20 has no CEL rules; `anyOf` of `required` is a structural schema's).
#[schemars(extend("anyOf" = [{"required": ["type", "template"]}, {"required": ["templateRef"]}]))]
pub struct AxTaskSpec {
    /// The task type: circuit breakers and per-type limits key on it. Required, unless
    /// `templateRef` names a template that gives it.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub task_type: String,

    /// An AxTaskTemplate in the task's namespace whose fields this task takes where it sets none
    /// of its own (docs/templates.md). Resolved once, before the first dispatch: the task waits
    /// with condition `TemplateResolved` False while the template does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,

    /// Dispatch priority bucket.
    #[serde(default)]
    pub priority: Priority,

    /// Name of the AxQueue this task waits in.
    #[serde(default = "default_queue")]
    #[schemars(length(min = 1, max = 253))]
    pub queue: String,

    /// Any JSON object, handed to the worker as env `AX_PAYLOAD` and file `/var/run/ax/payload.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub payload: Option<serde_json::Value>,

    /// The worker pod template; `restartPolicy` is forced to `Never`. Checked by the API server
    /// when the worker pod is created, not in this schema: the full PodTemplateSpec schema made
    /// every write of a task cost the API server a third more CPU (and the CRD 500 KB). A
    /// template that is no PodTemplateSpec makes the task Dead with `InvalidSpec`, naming the field.
    #[schemars(schema_with = "preserve_unknown_object")]
    #[serde(default, skip_serializing_if = "PodTemplate::is_absent")]
    pub template: PodTemplate,

    /// How long an attempt may take: a soft timeout checks the worker is alive, a hard one kills it.
    #[serde(default)]
    pub timeout: TimeoutSpec,

    /// How many times, how soon and on which exit codes a failed attempt is retried.
    #[serde(default)]
    pub retry: RetrySpec,

    /// The task is not queued before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_after: Option<Time>,

    /// Setting it true cancels the task and kills its worker.
    #[serde(default)]
    pub cancel: bool,

    /// While true, no attempt of the task is dispatched: it waits Pending with `Queued` False,
    /// reason `Suspended`, and holds no place in its queue (like a Job's `suspend`). An attempt
    /// already dispatched runs on; setting it false queues the task again.
    #[serde(default, skip_serializing_if = "is_false")]
    pub suspend: bool,

    /// Whether a Critical or High task waiting in a queue with `preemption.withinQueue:
    /// LowerPriority` may stop this task's running attempt (default true). A stopped attempt ends
    /// Failed with reason `Preempted`, uses no `maxRetries`, and the task waits in its queue again.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub preemptible: bool,

    /// Where to POST the final status when the task ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackSpec>,

    /// Delete the task (and its pods) this long after it reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Re-run requests: each increment starts a finished task again as a new attempt, with its
    /// retries and budget reset (`kubectl ax retry`). One increment is one re-run.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub rerun: i64,

    /// An exit handler: a task run once, as the AxTask `<name>-onexit`, when this one reaches
    /// Succeeded, Dead or Canceled, with env `AX_PARENT_TASK` and `AX_PARENT_PHASE` and the
    /// task's summary in its payload. Its outcome is recorded in `status.onExit` and never changes
    /// this task's phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit: Option<ExitHandlerSpec>,
}

/// `spec.onExit` of an AxTask: the spec of the task that runs as its exit handler (an AxTask's
/// spec but for its own lifecycle fields).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("anyOf" = [{"required": ["type", "template"]}, {"required": ["templateRef"]}]))]
pub struct ExitHandlerSpec {
    /// The handler's task type.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub task_type: String,
    /// An AxTaskTemplate to take the handler's spec from (as an AxTask's `spec.templateRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,
    /// The handler's worker pod template.
    #[schemars(schema_with = "preserve_unknown_object")]
    #[serde(default, skip_serializing_if = "PodTemplate::is_absent")]
    pub template: PodTemplate,
    /// Any JSON object; the handler's payload also gets `task`, the summary of the task it
    /// handles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub payload: Option<serde_json::Value>,
    /// Dispatch priority bucket.
    #[serde(default)]
    pub priority: Priority,
    /// Name of the AxQueue the handler waits in.
    #[serde(default = "default_queue")]
    #[schemars(length(min = 1, max = 253))]
    pub queue: String,
    /// The handler's timeouts.
    #[serde(default)]
    pub timeout: TimeoutSpec,
    /// The handler's retries.
    #[serde(default)]
    pub retry: RetrySpec,
}

impl ExitHandlerSpec {
    /// The handler's AxTask spec.
    pub fn task_spec(&self) -> AxTaskSpec {
        // Serde's defaults (`preemptible` is true), not `Default`'s.
        let mut spec: AxTaskSpec =
            serde_json::from_value(serde_json::json!({})).unwrap_or_default();
        spec.task_type = self.task_type.clone();
        spec.template_ref = self.template_ref.clone();
        spec.template = self.template.clone();
        spec.payload = self.payload.clone();
        spec.priority = self.priority;
        spec.queue = self.queue.clone();
        spec.timeout = self.timeout.clone();
        spec.retry = self.retry.clone();
        spec
    }
}

fn default_queue() -> String {
    "default".into()
}

#[derive(
    Deserialize,
    Serialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    JsonSchema,
)]
pub enum Priority {
    Critical,
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// Highest first; also the tie-break order between buckets.
    pub const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
    ];

    /// Position in [`Priority::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "Critical",
            Priority::High => "High",
            Priority::Normal => "Normal",
            Priority::Low => "Low",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeoutSpec {
    /// After this long the operator checks the worker is alive (Running, no restarts, node Ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub soft_seconds: Option<i64>,
    /// After this long the worker is killed and the attempt ends TimedOut.
    #[serde(default = "default_hard_seconds")]
    #[schemars(range(min = 1))]
    pub hard_seconds: i64,
}

impl Default for TimeoutSpec {
    fn default() -> Self {
        Self {
            soft_seconds: None,
            hard_seconds: default_hard_seconds(),
        }
    }
}

fn default_hard_seconds() -> i64 {
    600
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    /// Attempts after the first that may count against the task.
    #[serde(default = "default_max_retries")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_retries: i32,
    /// The delay before each retry: exponential, capped, with random jitter.
    #[serde(default)]
    pub backoff: BackoffSpec,
    /// No new attempt starts later than this long after the first dispatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub budget_seconds: Option<i64>,
    /// Evaluated in order; the first rule whose exit codes match decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub rules: Vec<RetryRule>,
    /// Failures that do not count against maxRetries (evictions, lost nodes, image pulls, `Ignore`
    /// rules) allowed before the task is Dead.
    #[serde(default = "default_max_infrastructure_retries")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_infrastructure_retries: i32,
    /// When the next attempt may start while the previous attempt's pod is still terminating.
    #[serde(default)]
    pub pod_replacement_policy: PodReplacementPolicy,
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self {
            max_retries: default_max_retries(),
            backoff: BackoffSpec::default(),
            budget_seconds: None,
            rules: Vec::new(),
            max_infrastructure_retries: default_max_infrastructure_retries(),
            pod_replacement_policy: PodReplacementPolicy::default(),
        }
    }
}

fn default_max_retries() -> i32 {
    3
}

fn default_max_infrastructure_retries() -> i32 {
    10
}

/// The Job API's names: when the pod of an earlier attempt no longer blocks the next one.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PodReplacementPolicy {
    /// Only once the earlier pod is gone or in phase Succeeded/Failed: never two live workers.
    #[default]
    Failed,
    /// As soon as the earlier pod is terminating (has a deletionTimestamp), like the Job
    /// controller's default: faster on lost nodes, but the old worker may still be running.
    TerminatingOrFailed,
}

/// Delay before retry n: `min(baseSeconds * factor^(n-1), maxSeconds) + uniform(0, jitterMillis)`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackoffSpec {
    /// Delay before the first retry, in seconds (default 1).
    #[serde(default = "default_base_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub base_seconds: i64,
    /// Each retry waits this many times longer than the one before (default 2).
    #[serde(default = "default_factor")]
    #[schemars(range(min = 1.0, max = 10.0))]
    pub factor: f64,
    /// Longest delay before a retry, in seconds, before jitter (default 300).
    #[serde(default = "default_max_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub max_seconds: i64,
    /// Up to this many milliseconds, at random, added to each delay so retries spread out
    /// (default 500).
    #[serde(default = "default_jitter_millis")]
    #[schemars(range(min = 0, max = 600000))]
    pub jitter_millis: i64,
}

impl Default for BackoffSpec {
    fn default() -> Self {
        Self {
            base_seconds: default_base_seconds(),
            factor: default_factor(),
            max_seconds: default_max_seconds(),
            jitter_millis: default_jitter_millis(),
        }
    }
}

fn default_base_seconds() -> i64 {
    1
}
fn default_factor() -> f64 {
    2.0
}
fn default_max_seconds() -> i64 {
    300
}
fn default_jitter_millis() -> i64 {
    500
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryRule {
    /// The main container's exit codes this rule applies to.
    pub on_exit_codes: ExitCodeMatch,
    /// What a matching failure does: `Retry`, `Dead` or `Ignore`.
    pub action: RuleAction,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitCodeMatch {
    /// `In`: the rule matches the listed codes; `NotIn`: every other code.
    pub operator: ExitCodeOperator,
    /// Container exit codes to match.
    // 64-bit so any integer the API server accepts still deserializes (and simply never matches).
    #[schemars(length(min = 1, max = 255))]
    pub values: Vec<i64>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExitCodeOperator {
    In,
    NotIn,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RuleAction {
    /// Retry, counting against maxRetries.
    Retry,
    /// Stop: the task is Dead.
    Dead,
    /// Retry without counting it (treat like an infrastructure failure).
    Ignore,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallbackSpec {
    /// `http://` or `https://` URL the final status is POSTed to (JSON); private and loopback
    /// addresses are refused unless the operator's `--callback-allow` admits them.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub url: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum TaskPhase {
    #[default]
    Pending,
    Scheduled,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Dead,
    Canceled,
}

impl TaskPhase {
    /// Terminal phases are never left.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskPhase::Succeeded | TaskPhase::Dead | TaskPhase::Canceled
        )
    }

    /// An attempt is in flight: a worker pod exists or is about to.
    pub fn has_worker(self) -> bool {
        matches!(self, TaskPhase::Scheduled | TaskPhase::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskPhase::Pending => "Pending",
            TaskPhase::Scheduled => "Scheduled",
            TaskPhase::Running => "Running",
            TaskPhase::Succeeded => "Succeeded",
            TaskPhase::Failed => "Failed",
            TaskPhase::TimedOut => "TimedOut",
            TaskPhase::Dead => "Dead",
            TaskPhase::Canceled => "Canceled",
        }
    }
}

impl std::fmt::Display for TaskPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task's key in its queue (`status.queueKey`): where it came from and its value.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueKey {
    /// `label:<name>` or `payload:<dotted.path>`, as the queue's `spec.fairness.key` says.
    pub from: String,
    /// The label's value or the payload field's (a string, number or boolean, at most 128
    /// bytes); `<none>` when the task has no such label or field.
    pub value: String,
}

/// The trace a task's (or DAG's) spans belong to (W3C trace context, lowercase hex).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceContext {
    /// 32 hex digits: the submitter's trace when the object carried `ax.dev/traceparent`, else one
    /// of its own.
    #[schemars(regex(pattern = r"^[0-9a-f]{32}$"))]
    pub trace_id: String,
    /// 16 hex digits: the span of the submitter (or the DAG) that the object's span is a child of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{16}$"))]
    pub parent_span_id: Option<String>,
    /// Whether the trace is sampled: its spans are exported, and workers are told so.
    #[serde(default)]
    pub sampled: bool,
    /// A span the object's run is linked to without being its child: the AxCron firing that
    /// created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<SpanLink>,
}

/// A span in another trace (W3C ids, lowercase hex).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpanLink {
    /// 32 hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{32}$"))]
    pub trace_id: String,
    /// 16 hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{16}$"))]
    pub span_id: String,
}

/// Where the task stands, its attempts and every transition, as the operator records them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AxTaskStatus {
    /// Absent until the operator has seen the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_phase")]
    pub phase: Option<TaskPhase>,
    /// Number of the current attempt: 0 before the first dispatch.
    #[serde(default)]
    pub attempt: i32,
    /// Attempts that counted against maxRetries.
    #[serde(default)]
    pub retries: i32,
    /// Failures that did not count against maxRetries (bounded by maxInfrastructureRetries).
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub infrastructure_retries: i32,
    /// Pod name of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Node the current attempt's pod runs (or ran) on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Reason of the latest transition (shown by `kubectl get -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the task (or its latest retry) joined its queue: its place in its priority bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub queued_at: Option<Timestamp>,
    /// The key the task counts under in its queue's fair shares and per-key limits, when the
    /// queue takes keys from a label or the payload (`AxQueue.spec.fairness.key`); absent: its
    /// namespace is its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_key: Option<QueueKey>,
    /// The task's OpenTelemetry trace, fixed at its first status write while the operator exports
    /// traces; it continues the `ax.dev/traceparent` annotation when the task has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// Pending after a failure: the next attempt is not dispatched before this time (backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub next_attempt_at: Option<Timestamp>,
    /// When the current attempt was dispatched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub scheduled_at: Option<Timestamp>,
    /// When the current attempt's main container started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub started_at: Option<Timestamp>,
    /// When the task reached its terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub finished_at: Option<Timestamp>,
    /// Computed once at the first dispatch: no attempt starts after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub budget_deadline: Option<Timestamp>,
    /// A SoftTimeout warning was already published for this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_timeout_attempt: Option<i32>,
    /// The most recent failed attempt: its kind, exit code and reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Failure>,
    /// Why the task is Dead, in words (retries exhausted, a non-retryable error, the budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<String>,
    /// Every phase transition, appended, never rewritten (oldest dropped beyond the cap).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// Oldest history entries dropped to keep the list at its cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_dropped: i64,
    /// The most recent attempts, oldest first (at most `ATTEMPTS_CAP`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRecord>,
    /// `Ready`, `Failed` (once Dead), `Queued`, `WorkerTerminating` and the other conditions of the task,
    /// one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last `spec.rerun` acted on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_rerun: i64,
    /// The AxTaskTemplate the spec was completed from (`spec.templateRef`), at the
    /// resourceVersion it had then: a later edit of the template changes no task resolved before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateUse>,
    /// The exit handler (`spec.onExit`): its task, once created, and how it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit: Option<super::DagNodeStatus>,
    /// What the succeeded attempt's worker wrote to `$AX_OUTPUT_FILE` (its main container's
    /// termination-message file): JSON, or the text as a string; at most 4095 bytes
    /// (docs/outputs.md). A DAG passes it to the task's dependents as `inputs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::preserve_unknown_value")]
    pub output: Option<serde_json::Value>,
}

impl AxTaskStatus {
    /// The condition of type `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_true(b: &bool) -> bool {
    *b
}

fn yes() -> bool {
    true
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_zero_i32(n: &i32) -> bool {
    *n == 0
}

/// How many attempts `status.attempts` keeps.
pub const ATTEMPTS_CAP: usize = 20;

/// One attempt: its pod, where and when it ran, and how it ended.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// The attempt's number, from 1.
    pub attempt: i32,
    /// Name of the worker pod.
    pub pod: String,
    /// Node the pod ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When the attempt was dispatched.
    #[schemars(schema_with = "date_time")]
    pub scheduled_at: Timestamp,
    /// When its main container started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub started_at: Option<Timestamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub finished_at: Option<Timestamp>,
    /// The phase the attempt ended in (Succeeded, Failed, TimedOut, Canceled); absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_phase")]
    pub outcome: Option<TaskPhase>,
    /// The main container's exit code, if it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How a failure was classified: `Retryable`, `NonRetryable`, `Infrastructure` or `Timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kind: Option<FailureKind>,
    /// Why it ended (`Completed`, `ExitCode`, `HardTimeout`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The attempt that failed.
    pub attempt: i32,
    /// How it was classified: `Retryable`, `NonRetryable`, `Infrastructure` or `Timeout`.
    pub kind: FailureKind,
    /// The main container's exit code, if it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why, in one CamelCase word (`ExitCode`, `Evicted`, `HardTimeout`, …).
    pub reason: String,
    /// Details: the termination message or what the operator saw.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum FailureKind {
    /// Retried, counts against maxRetries.
    Retryable,
    /// Never retried: the task is Dead.
    NonRetryable,
    /// Not the worker's fault (eviction, node loss, pod deleted): retried without counting.
    Infrastructure,
    /// The attempt ran out of time: retried, counts against maxRetries.
    Timeout,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Retryable => "Retryable",
            FailureKind::NonRetryable => "NonRetryable",
            FailureKind::Infrastructure => "Infrastructure",
            FailureKind::Timeout => "Timeout",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// When the transition happened.
    #[schemars(schema_with = "date_time")]
    pub time: Timestamp,
    /// Absent for the first entry of a new task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_phase")]
    pub from: Option<TaskPhase>,
    /// The phase entered.
    pub to: TaskPhase,
    /// The attempt it belongs to (0 before the first dispatch).
    pub attempt: i32,
    /// Why, in one CamelCase word (`Dispatched`, `Completed`, `RetryScheduled`, …).
    pub reason: String,
    /// Details, when there are any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `ax-operator/<pod>`, `user` or `worker`.
    pub actor: String,
}

/// An optional phase: the enum without the `null` schemars would add, which structural schemas reject.
fn optional_phase(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    TaskPhase::json_schema(generator)
}

/// `spec.templateRef`: an AxTaskTemplate by name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// The AxTaskTemplate's name, in the task's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// `status.template`: the AxTaskTemplate a task's spec was completed from.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateUse {
    /// The AxTaskTemplate's name.
    pub name: String,
    /// Its `metadata.resourceVersion` when the task was resolved from it.
    pub resource_version: String,
}
