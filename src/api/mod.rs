//! Custom resource types: the contract users see. No logic beyond defaults lives here.

pub mod cron;
pub mod dag;
pub mod queue;
pub mod task;
pub mod task_template;
pub mod template;

#[cfg(test)]
mod description_tests;

pub use cron::*;
pub use dag::*;
pub use queue::*;
pub use task::*;
pub use task_template::*;
pub use template::{INVALID_TEMPLATE_ANNOTATION, PodTemplate};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Kubernetes-style condition (`type/status/reason/message/lastTransitionTime`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type in CamelCase (`Ready`, `Queued`, `InvalidSpec`, …).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why it is so, in one CamelCase word.
    pub reason: String,
    /// Details for people.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: Time,
    /// The `metadata.generation` it was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Schema for an arbitrary JSON object whose fields the API server must keep.
pub(crate) fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema for any JSON value (an object, a list, a string, a number, a boolean).
pub(crate) fn preserve_unknown_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema for a `jiff::Timestamp`: RFC 3339 with sub-second precision, which `metav1.Time` lacks and
/// dispatch latency and backoff need.
pub(crate) fn date_time(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "format": "date-time",
    })
}
