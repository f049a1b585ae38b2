//! The `AxDag` custom resource: AxTasks with dependencies between them, run as child AxTasks.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AxTaskSpec, Condition, date_time};

/// Label on every child AxTask: the name of the AxDag that created it.
pub const LABEL_DAG: &str = "ax.dev/dag";
/// Label on every child AxTask: the name of its task in the AxDag.
pub const LABEL_DAG_TASK: &str = "ax.dev/dag-task";
/// Label on each child of a `forEach` task: the index of its item.
pub const LABEL_DAG_ITEM: &str = "ax.dev/item";

/// A graph of tasks: each starts once all the tasks it depends on succeeded.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ax.dev",
    version = "v1alpha1",
    kind = "AxDag",
    doc = "Tasks with dependencies: each runs as a child AxTask once the tasks it depends on succeeded.",
    namespaced,
    status = "AxDagStatus",
    shortname = "axd",
    category = "ax",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AxDagSpec {
    /// The tasks, at most 500; each runs as the child AxTask `<dag>-<name>`.
    // The operator's cache keeps each task's name, dependencies and status entry: the count
    // bounds what one DAG costs it there, and what one reconcile reads whole (the API server's
    // ~1.5 MiB object limit is reached near there with specs of a few KiB anyway).
    #[schemars(length(max = 500))]
    pub tasks: Vec<DagTask>,

    /// What happens to the rest of the DAG when a task is Dead or Canceled.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// Most children that exist and are not finished at once; no limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub parallelism: Option<i32>,

    /// Setting it true cancels every running child and starts nothing more.
    #[serde(default)]
    pub cancel: bool,

    /// Re-run requests: each increment re-runs the tasks that did not succeed (Dead, Canceled,
    /// Skipped) and what depends on them; children that Succeeded are kept (`kubectl ax retry`).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub rerun: i64,

    /// An exit handler: a task run once, as the child `<dag>-onexit`, when the DAG reaches a
    /// terminal phase (Succeeded, Failed or Canceled), with env `AX_DAG_PHASE` and the DAG's
    /// summary in its payload. Its own outcome is recorded in `status.onExit` and never changes the
    /// DAG's phase. (No task of the DAG may then be named `onexit`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit: Option<AxTaskSpec>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DagTask {
    /// A DNS-1123 label, unique in the DAG.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Names of the tasks that must succeed before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// The spec of the child AxTask.
    pub spec: AxTaskSpec,
    /// Runs the task once per item, as the children `<dag>-<name>-<index>`, instead of once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEach>,
}

/// A task run once per item: each item is a child AxTask of its own, with its own retries; the
/// task (the node) succeeds or fails by `successPolicy` and `maxFailedItems`. The DAG's status
/// keeps counts and the failed indexes, never one entry per item.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForEach {
    /// A literal list: one child per element, which it gets as its item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_values")]
    pub items: Option<Vec<serde_json::Value>>,
    /// One child per index `0..count`, which it gets as its item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<ItemRange>,
    /// One child per element of a list in the output of a task this one depends on, which it gets
    /// as its item; known once that task has succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_output: Option<FromOutput>,
    /// Items at work (created and not finished) at most; children are created as earlier ones
    /// finish, lowest index first (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub parallelism: Option<i32>,
    /// When the task succeeds; every item (but `maxFailedItems`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_policy: Option<ItemSuccessPolicy>,
    /// Failed (Dead or Canceled) items tolerated; one more fails the task at once, creates no
    /// further child and cancels the items at work. None tolerated when absent and
    /// `successPolicy` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_failed_items: Option<i32>,
    /// The length of `items` in the operator's cache, which drops the list itself.
    #[serde(skip)]
    #[schemars(skip)]
    pub cached_item_count: Option<usize>,
}

impl ForEach {
    /// How many items: the list's length or the range's count.
    /// None when it sets both or neither.
    pub fn item_count(&self) -> Option<usize> {
        let listed = self.items.as_ref().map(Vec::len).or(self.cached_item_count);
        match (listed, &self.range) {
            (Some(count), None) => Some(count),
            (None, Some(range)) => usize::try_from(range.count).ok(),
            _ => None,
        }
    }

    /// Whether it lists its items (rather than a range).
    pub fn lists_items(&self) -> bool {
        self.items.is_some() || self.cached_item_count.is_some()
    }

    /// The item of child `index`: the list's element, or the index itself.
    pub fn item(&self, index: u32) -> Option<serde_json::Value> {
        match &self.items {
            Some(items) => items.get(usize::try_from(index).ok()?).cloned(),
            None => Some(serde_json::Value::from(index)),
        }
    }
}

/// Where a `forEach` finds its items in a parent's output.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FromOutput {
    /// The task, one of `dependsOn`, whose `status.output` holds the list.
    #[schemars(length(min = 1, max = 63))]
    pub task: String,
    /// Field names joined by `.` that lead to the list in that output (`orders`,
    /// `result.ids`); the output itself is the list when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemRange {
    /// How many items: indexes `0..count`.
    #[schemars(range(min = 0, max = 1000000))]
    pub count: i64,
}

/// At least this many (or this percentage, rounded up) of the items must succeed; set one.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemSuccessPolicy {
    /// Items that must succeed (at most all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_succeeded: Option<i64>,
    /// Percentage of the items that must succeed, rounded up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub min_succeeded_percent: Option<i64>,
}

/// Schema for a list of any JSON values.
fn any_values(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"x-kubernetes-preserve-unknown-fields": true},
    })
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum FailurePolicy {
    /// No new task starts after one is Dead or Canceled; running ones finish.
    #[default]
    FailFast,
    /// Tasks whose dependencies all succeeded keep starting; only dependents of the failure are
    /// Skipped.
    ContinueIndependent,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum DagPhase {
    /// No child exists yet.
    #[default]
    Pending,
    Running,
    /// Every task succeeded.
    Succeeded,
    /// Every task finished and some did not succeed, or the spec is invalid.
    Failed,
    /// `cancel` was set and every task finished.
    Canceled,
}

impl DagPhase {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            DagPhase::Succeeded | DagPhase::Failed | DagPhase::Canceled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DagPhase::Pending => "Pending",
            DagPhase::Running => "Running",
            DagPhase::Succeeded => "Succeeded",
            DagPhase::Failed => "Failed",
            DagPhase::Canceled => "Canceled",
        }
    }
}

impl std::fmt::Display for DagPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The phase of one task of the DAG: its child's phase, or why it has no child.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum DagNodePhase {
    /// No child yet; one may still be created.
    NotStarted,
    Pending,
    Scheduled,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Dead,
    Canceled,
    /// No child, and none will be created.
    Skipped,
}

impl DagNodePhase {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            DagNodePhase::Succeeded
                | DagNodePhase::Dead
                | DagNodePhase::Canceled
                | DagNodePhase::Skipped
        )
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DagNodeStatus {
    pub phase: DagNodePhase,
    /// Name of the child AxTask, once it was created (none for a `forEach` task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The items of a `forEach` task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<DagItemsStatus>,
}

/// How the items of a `forEach` task stand: counts, never one entry per item.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DagItemsStatus {
    /// Items of the task.
    pub total: u32,
    /// Children created and not finished.
    pub at_work: u32,
    /// Children Succeeded.
    pub succeeded: u32,
    /// Children Dead or Canceled.
    pub failed: u32,
    /// The failed items' indexes as ranges (`3,7-9`), the first 100 ranges listed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failed_indexes: String,
    /// Why the task failed, once it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Where the DAG and each of its tasks stand, as the operator last saw them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AxDagStatus {
    /// Absent until the operator has seen the DAG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_dag_phase")]
    pub phase: Option<DagPhase>,
    /// Every task by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<String, DagNodeStatus>,
    /// "finished/total": tasks that will not change any more (Succeeded, Dead, Canceled, Skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// When the first child was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub started_at: Option<Timestamp>,
    /// When the DAG reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub finished_at: Option<Timestamp>,
    /// The DAG's OpenTelemetry trace (see the AxTask's `status.trace`); its tasks' traces are
    /// children of its span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::api::TraceContext>,
    /// `Ready` (true once Succeeded), `Failed` (true once Failed) and `InvalidSpec` (true when the graph
    /// cannot run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last `spec.rerun` acted on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_rerun: i64,
    /// The exit handler (`spec.onExit`), once the DAG has finished: its child and phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit: Option<DagNodeStatus>,
}

/// An optional phase: the enum without the `null` schemars would add, which structural schemas reject.
fn optional_dag_phase(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    DagPhase::json_schema(generator)
}
