//! The `AxTaskTemplate` custom resource: a named, reusable task spec that AxTasks, AxDag tasks and
//! AxCrons reference by `spec.templateRef` instead of inlining it.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{PodTemplate, Priority, RetrySpec, TimeoutSpec, preserve_unknown_object};

/// The fields a referencing task takes where it sets none of its own (docs/templates.md).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ax.dev",
    version = "v1alpha1",
    kind = "AxTaskTemplate",
    doc = "A reusable task spec: type, worker pod template, retries, timeouts, queue, priority and payload, referenced by AxTasks, AxDag tasks and AxCrons through spec.templateRef.",
    namespaced,
    shortname = "axtt",
    category = "ax",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".spec.queue"}"#,
    printcolumn = r#"{"name":"Priority","type":"string","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AxTaskTemplateSpec {
    /// The task type of the tasks that use it.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[serde(rename = "type")]
    pub task_type: String,

    /// The worker pod template (as an AxTask's `spec.template`).
    #[schemars(schema_with = "preserve_unknown_object")]
    pub template: PodTemplate,

    /// Dispatch priority bucket; the task's own, or Normal, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_priority")]
    pub priority: Option<Priority>,

    /// Name of the AxQueue the tasks wait in; the task's own, or `default`, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub queue: Option<String>,

    /// Timeouts (as an AxTask's `spec.timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeoutSpec>,

    /// Retries (as an AxTask's `spec.retry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,

    /// A payload the task's own payload is merged over, field by field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub payload: Option<serde_json::Value>,
}

/// An absent priority is no value of its own: the schema is Priority's (no `null` in its enum).
fn optional_priority(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    Priority::json_schema(generator)
}
