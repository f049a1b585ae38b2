//! `spec.template`: the worker's PodTemplateSpec, behind a shared pointer.
//!
//! A PodTemplateSpec is 1.8 KB inline even when empty, and the operator's caches hold every task
//! without its template (100,000 waiting tasks are the design load): inline, the empty templates
//! alone were more memory than the rest of each cached task. Behind an `Arc`, a task without its
//! template points at one shared empty one, and a copy of a task shares its template.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// On a template that is no PodTemplateSpec: why (set by the operator when it reads the task, never
/// written to the API server).
pub const INVALID_TEMPLATE_ANNOTATION: &str = "ax.dev/invalid-template";

static ABSENT: LazyLock<Arc<PodTemplateSpec>> = LazyLock::new(Arc::default);

/// A PodTemplateSpec, shared on copy; dereferences to it (a write copies it first if shared).
#[derive(Clone, Debug, PartialEq)]
pub struct PodTemplate(Arc<PodTemplateSpec>);

impl PodTemplate {
    /// The template a cached task keeps: none, shared by all of them (see `controller::cache`).
    pub fn absent() -> Self {
        PodTemplate(ABSENT.clone())
    }

    /// Whether this is [`PodTemplate::absent`] — dropped, as opposed to an empty `{}` that was
    /// written (which is a template, an invalid one).
    pub fn is_absent(&self) -> bool {
        Arc::ptr_eq(&self.0, &ABSENT)
    }

    /// The pod's containers; none when it has no pod spec.
    pub fn containers(&self) -> &[Container] {
        self.0
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
    }
}

impl Default for PodTemplate {
    fn default() -> Self {
        Self::absent()
    }
}

impl From<PodTemplateSpec> for PodTemplate {
    fn from(template: PodTemplateSpec) -> Self {
        PodTemplate(Arc::new(template))
    }
}

impl Deref for PodTemplate {
    type Target = PodTemplateSpec;

    fn deref(&self) -> &PodTemplateSpec {
        &self.0
    }
}

impl DerefMut for PodTemplate {
    fn deref_mut(&mut self) -> &mut PodTemplateSpec {
        Arc::make_mut(&mut self.0)
    }
}

impl Serialize for PodTemplate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// Reads `spec.template` without ever failing. Its schema leaves it to the operator (see
/// `AxTaskSpec::template`), so the API server stores any object there; one malformed template must
/// not stop the watch of every task. A template that is no PodTemplateSpec reads as an empty one
/// that carries the reason, with its path, in [`INVALID_TEMPLATE_ANNOTATION`]; validation reports it
/// as `InvalidSpec`.
impl<'de> Deserialize<'de> for PodTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let template = serde_path_to_error::deserialize(value).unwrap_or_else(|e| {
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
        });
        Ok(PodTemplate::from(template))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_empty_template_that_was_written_is_not_the_absent_one() {
        let written: PodTemplate = serde_json::from_value(json!({})).expect("reads");
        assert!(!written.is_absent());
        assert_eq!(*written, PodTemplateSpec::default());
        assert!(PodTemplate::default().is_absent());
    }

    #[test]
    fn a_write_to_a_shared_template_leaves_the_other_copy_alone() {
        let mut one = PodTemplate::absent();
        one.metadata = Some(ObjectMeta::default());
        assert!(!one.is_absent());
        assert!(PodTemplate::absent().metadata.is_none());
        let two = one.clone();
        assert_eq!(one, two);
    }

    #[test]
    fn it_serializes_as_the_template_itself() {
        let value = json!({"spec": {"containers": [{"name": "w", "image": "i"}]}});
        let template: PodTemplate = serde_json::from_value(value.clone()).expect("reads");
        assert_eq!(serde_json::to_value(&template).expect("writes"), value);
    }
}
