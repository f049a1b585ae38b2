//! Custom resource types: the contract users see. No logic beyond defaults lives here.

pub mod cron;
pub mod dag;
pub mod queue;
pub mod task;

pub use cron::*;
pub use dag::*;
pub use queue::*;
pub use task::*;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Kubernetes-style condition (`type/status/reason/message/lastTransitionTime`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub last_transition_time: Time,
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

/// On a template that is no PodTemplateSpec: why (set by the operator when it reads the task, never
/// written to the API server).
pub const INVALID_TEMPLATE_ANNOTATION: &str = "ax.dev/invalid-template";

/// Reads `spec.template` without ever failing. Its schema leaves it to the operator (see
/// `AxTaskSpec::template`), so the API server stores any object there; one malformed template must
/// not stop the watch of every task. A template that is no PodTemplateSpec reads as an empty one
/// that carries the reason, with its path, in [`INVALID_TEMPLATE_ANNOTATION`]; validation reports it
/// as `InvalidSpec`.
pub(crate) fn lenient_template<'de, D>(deserializer: D) -> Result<PodTemplateSpec, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_path_to_error::deserialize(value).unwrap_or_else(|e| {
        let path = e.path().to_string();
        let reason = if path == "." {
            e.inner().to_string()
        } else {
            format!("spec.template.{path}: {}", e.inner())
        };
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    INVALID_TEMPLATE_ANNOTATION.to_string(),
                    reason,
                )])),
                ..ObjectMeta::default()
            }),
            spec: None,
        }
    }))
}

/// Schema for a `jiff::Timestamp`: RFC 3339 with sub-second precision, which `metav1.Time` lacks and
/// dispatch latency and backoff need.
pub(crate) fn date_time(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "format": "date-time",
    })
}
