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
    /// Name of the child AxTask, once it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
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
}

/// An optional phase: the enum without the `null` schemars would add, which structural schemas reject.
fn optional_dag_phase(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    DagPhase::json_schema(generator)
}
