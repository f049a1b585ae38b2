//! The `AxCron` custom resource: an AxTask or AxDag created on a cron schedule, in a time zone,
//! with overlap (`concurrencyPolicy`) and misfire (`misfirePolicy`) policies.

use jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AxDagSpec, AxTaskSpec, Condition, date_time};

/// Label on every child (AxTask or AxDag): the name of the AxCron that created it.
pub const LABEL_CRON: &str = "ax.dev/cron";
/// Label on every child: its scheduled time, in Unix seconds (also the suffix of its name).
pub const LABEL_SCHEDULED_TIME: &str = "ax.dev/scheduled-time";
/// Annotation on a child created for a scheduled time that was missed (`"true"`).
pub const ANNOTATION_CATCH_UP: &str = "ax.dev/catch-up";

/// Creates one child AxTask or AxDag, `<cron>-<scheduled unix time>`, for each scheduled time.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ax.dev",
    version = "v1alpha1",
    kind = "AxCron",
    doc = "Runs an AxTask or an AxDag on a cron schedule: one child per scheduled time.",
    namespaced,
    status = "AxCronStatus",
    shortname = "axc",
    category = "ax",
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"Timezone","type":"string","jsonPath":".spec.timeZone"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Active","type":"integer","jsonPath":".status.activeCount"}"#,
    // Strings, not dates: kubectl renders a future date as `<invalid>`.
    printcolumn = r#"{"name":"Last","type":"string","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"Next","type":"string","jsonPath":".status.nextScheduleTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Invalid","type":"string","jsonPath":".status.conditions[?(@.type==\"InvalidSpec\")].status","priority":1}"#
)]
#[schemars(extend("oneOf" = [{"required": ["task"]}, {"required": ["dag"]}]))]
#[serde(rename_all = "camelCase")]
pub struct AxCronSpec {
    /// Standard cron: 5 fields `minute hour day-of-month month day-of-week`, or 6 with a
    /// `second` field first; `*`, `?` (day fields), lists `a,b`, ranges `a-b`, steps `*/n` and
    /// `a-b/n`, names `JAN`-`DEC` and `SUN`-`SAT` (0 and 7 are Sunday); or a macro: `@yearly`
    /// (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`), `@hourly`.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^\s*(@[A-Za-z]+|[0-9A-Za-z*?/,-]+(\s+[0-9A-Za-z*?/,-]+){4,5})\s*$")
    )]
    pub schedule: String,

    /// IANA time zone the schedule is read in (`Europe/Berlin`); `UTC` when absent.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_+\-/]+$"))]
    pub time_zone: String,

    /// A scheduled time may still start at most this long after it; later it is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub starting_deadline_seconds: Option<i64>,

    /// What to do when a time comes while an earlier child is still running.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// While true, nothing is created; times passed meanwhile are misfires when it is resumed.
    #[serde(default)]
    pub suspend: bool,

    /// What to do with scheduled times that passed without a firing (operator down, suspended).
    #[serde(default)]
    pub misfire_policy: MisfirePolicy,

    /// With `misfirePolicy: RunAll`, at most this many missed times are run (the latest ones).
    #[serde(default = "default_max_catch_up")]
    #[schemars(range(min = 1, max = 100))]
    pub max_catch_up: i32,

    /// Succeeded children kept; older ones are deleted (with their pods).
    #[serde(default = "default_successful_history")]
    #[schemars(range(min = 0, max = 1000))]
    pub successful_runs_history_limit: i32,

    /// Children that ended otherwise (Dead, Failed, Canceled) kept; older ones are deleted.
    #[serde(default = "default_failed_history")]
    #[schemars(range(min = 0, max = 1000))]
    pub failed_runs_history_limit: i32,

    /// Every firing of this cron starts the same number of seconds, below this, after its
    /// scheduled time (derived from the cron's uid), so many crons on one schedule spread out.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 86400))]
    pub jitter_seconds: i64,

    /// The AxTask to create at each time (exactly one of `task` and `dag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<AxTaskSpec>,

    /// The AxDag to create at each time (exactly one of `task` and `dag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dag: Option<AxDagSpec>,
}

fn default_time_zone() -> String {
    "UTC".into()
}
fn default_max_catch_up() -> i32 {
    10
}
fn default_successful_history() -> i32 {
    3
}
fn default_failed_history() -> i32 {
    1
}
fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The CronJob vocabulary.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Children may run side by side.
    #[default]
    Allow,
    /// A time that comes while a child is active is skipped (Event `SkippedConcurrent`).
    Forbid,
    /// The active children are canceled (`spec.cancel`) and the new one is created.
    Replace,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum MisfirePolicy {
    /// Missed times are skipped; the next regular time runs.
    #[default]
    Skip,
    /// One catch-up run, for the latest missed time, stands for all of them (none when a regular
    /// time runs at that moment anyway).
    RunOnce,
    /// Each missed time runs, at most `maxCatchUp` of them (the latest).
    RunAll,
}

/// A child recorded as fired, not yet known to exist.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingChild {
    /// The child's name, `<cron>-<scheduled unix time>`.
    pub name: String,
    /// The scheduled time it was fired for.
    #[schemars(schema_with = "date_time")]
    pub scheduled_time: Timestamp,
    /// For a missed time (its child is annotated `ax.dev/catch-up`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub catch_up: bool,
}

/// What the cron has fired and when it fires next, as the operator last saw it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AxCronStatus {
    /// The scheduled time of the newest child created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub last_schedule_time: Option<Timestamp>,
    /// Every scheduled time up to this one was handled: a child was created, or it was skipped
    /// (each skip is an Event saying why). The next firing comes after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub last_handled_time: Option<Timestamp>,
    /// When the newest child that succeeded finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub last_successful_time: Option<Timestamp>,
    /// The next scheduled time (the firing itself starts `jitterSeconds`-derived seconds after);
    /// absent while suspended or invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub next_schedule_time: Option<Timestamp>,
    /// Children that have not finished, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
    /// How many children have not finished.
    #[serde(default)]
    pub active_count: i32,
    /// Firings recorded whose children are not known to exist yet. A firing is written here (and
    /// in `lastHandledTime`) before its child is created, and leaves once the create is answered:
    /// a write that fails creates nothing, and a child missing after a restart is created then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_children: Vec<PendingChild>,
    /// `InvalidSpec` (the schedule, time zone or template cannot be used, and why) and
    /// `Suspended`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
