//! Completing a task's spec from the AxTaskTemplate its `spec.templateRef` names.
//!
//! Resolution happens once, before the task is admitted: the operator writes the completed spec
//! into the task, with [`RESOLVED_ANNOTATION`] naming the template's resourceVersion, so
//! everything after (queueing, dispatch, retries, the worker pod) reads an ordinary task, and a
//! later edit of the template changes no task resolved before it.
//!
//! The merge rules, on the specs as JSON:
//! - a field the template sets and the task does not takes the template's value;
//! - the API server fills in the task's defaults (queue `default`, priority `Normal`, the retry
//!   and timeout defaults) before the operator sees it, so a field equal to its default counts as
//!   not set;
//! - objects (`retry`, `timeout`, `payload`) merge field by field by the same rules; lists (such
//!   as `retry.rules`) and the pod template (`template`) are taken whole.

use std::sync::LazyLock;

use serde_json::{Map, Value};

use crate::api::AxTaskSpec;

/// On a task whose spec was completed from its template: the template's resourceVersion then.
pub const RESOLVED_ANNOTATION: &str = "ax.dev/template-resource-version";

/// An AxTask spec with nothing set, as the API server's defaults and serde's leave it.
static DEFAULTS: LazyLock<Map<String, Value>> = LazyLock::new(|| {
    let spec: AxTaskSpec = serde_json::from_value(Value::Object(Map::new())).unwrap_or_default();
    match serde_json::to_value(spec) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
});

/// `task` (an AxTask's spec as JSON) completed from `template` (an AxTaskTemplate's spec as JSON).
pub fn resolve(task: &Value, template: &Value) -> Value {
    let mut resolved = task.as_object().cloned().unwrap_or_default();
    if let Some(template) = template.as_object() {
        merge(&mut resolved, template, &DEFAULTS);
    }
    Value::Object(resolved)
}

fn merge(
    task: &mut Map<String, Value>,
    template: &Map<String, Value>,
    defaults: &Map<String, Value>,
) {
    let no_defaults = Map::new();
    for (key, from_template) in template {
        let default = defaults.get(key);
        match task.get_mut(key) {
            None => {
                task.insert(key.clone(), from_template.clone());
            }
            Some(Value::Object(own)) if key != "template" && from_template.is_object() => {
                let nested = default.and_then(Value::as_object).unwrap_or(&no_defaults);
                if let Value::Object(from_template) = from_template {
                    merge(own, from_template, nested);
                }
            }
            Some(own) if is_unset(own, default) => *own = from_template.clone(),
            Some(_) => {}
        }
    }
}

/// A value the task did not set: its default, or empty.
fn is_unset(value: &Value, default: Option<&Value>) -> bool {
    Some(value) == default
        || match value {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn template() -> Value {
        json!({
            "type": "resize",
            "template": {"spec": {"containers": [{"name": "w", "image": "resizer:1"}]}},
            "priority": "High",
            "queue": "images",
            "timeout": {"hardSeconds": 600},
            "retry": {"maxRetries": 7, "rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]},
            "payload": {"size": "small", "format": "png"},
        })
    }

    /// A task as the API server stores it: its defaults filled in.
    fn stored(task: Value) -> Value {
        let spec: AxTaskSpec = serde_json::from_value(task).expect("a spec");
        serde_json::to_value(spec).expect("json")
    }

    #[test]
    fn a_task_that_sets_nothing_takes_everything_from_its_template() {
        let task = stored(json!({"templateRef": {"name": "resize"}}));
        let resolved = resolve(&task, &template());
        let spec: AxTaskSpec = serde_json::from_value(resolved.clone()).expect("a spec");
        assert_eq!(spec.task_type, "resize");
        assert_eq!(spec.queue, "images");
        assert_eq!(spec.priority, crate::api::Priority::High);
        assert_eq!(spec.timeout.hard_seconds, 600);
        assert_eq!(spec.retry.max_retries, 7);
        assert_eq!(spec.retry.rules.len(), 1);
        assert_eq!(
            spec.template.containers()[0].image.as_deref(),
            Some("resizer:1")
        );
        assert_eq!(
            spec.payload,
            Some(json!({"size": "small", "format": "png"}))
        );
        assert_eq!(
            resolved["templateRef"],
            json!({"name": "resize"}),
            "the reference stays"
        );
    }

    #[test]
    fn what_the_task_sets_wins_field_by_field() {
        let task = stored(json!({
            "templateRef": {"name": "resize"},
            "priority": "Low",
            "retry": {"maxRetries": 1},
            "timeout": {"softSeconds": 30},
            "payload": {"size": "large", "id": 7},
            "template": {"spec": {"containers": [{"name": "mine", "image": "mine:2"}]}},
        }));
        let spec: AxTaskSpec = serde_json::from_value(resolve(&task, &template())).expect("a spec");
        assert_eq!(spec.priority, crate::api::Priority::Low);
        assert_eq!(spec.retry.max_retries, 1, "the task's own");
        assert_eq!(
            spec.retry.rules.len(),
            1,
            "the template's: the task has none"
        );
        assert_eq!(spec.timeout.soft_seconds, Some(30));
        assert_eq!(
            spec.timeout.hard_seconds, 600,
            "the template's, beside the task's soft"
        );
        assert_eq!(
            spec.payload,
            Some(json!({"size": "large", "id": 7, "format": "png"}))
        );
        assert_eq!(
            spec.template.containers()[0].name,
            "mine",
            "a pod template is taken whole"
        );
        assert_eq!(spec.task_type, "resize");
    }

    #[test]
    fn a_value_equal_to_its_default_counts_as_unset() {
        let task =
            stored(json!({"templateRef": {"name": "t"}, "queue": "default", "priority": "Normal"}));
        let spec: AxTaskSpec = serde_json::from_value(resolve(&task, &template())).expect("a spec");
        assert_eq!(
            (spec.queue.as_str(), spec.priority),
            ("images", crate::api::Priority::High)
        );
    }

    proptest! {
        /// Whatever the two specs, every field the task set (not a default) is kept, every field
        /// only the template set is taken, and a second resolution changes nothing.
        #[test]
        fn the_task_wins_and_resolution_is_idempotent(
            task_priority in proptest::option::of(prop_oneof!["Critical", "High", "Low"]),
            template_priority in proptest::option::of(prop_oneof!["Critical", "High", "Normal", "Low"]),
            task_queue in proptest::option::of("[a-z]{1,8}"),
            template_queue in proptest::option::of("[a-z]{1,8}"),
            task_payload in proptest::collection::btree_map("[a-c]", any::<i32>(), 0..3),
            template_payload in proptest::collection::btree_map("[a-e]", any::<i32>(), 0..4),
        ) {
            let mut task = json!({"templateRef": {"name": "t"}, "payload": task_payload});
            if let Some(p) = &task_priority { task["priority"] = json!(p); }
            if let Some(q) = &task_queue { task["queue"] = json!(q); }
            let mut template = json!({"type": "t", "template": {}, "payload": template_payload});
            if let Some(p) = &template_priority { template["priority"] = json!(p); }
            if let Some(q) = &template_queue { template["queue"] = json!(q); }
            let task = stored(task);
            let once = resolve(&task, &template);
            prop_assert_eq!(&resolve(&once, &template), &once);
            let want_priority = task_priority.clone().or(template_priority).unwrap_or("Normal".into());
            prop_assert_eq!(&once["priority"], &json!(want_priority));
            let own_queue = task_queue.filter(|q| q != "default");
            let want_queue = own_queue.or(template_queue).unwrap_or("default".into());
            prop_assert_eq!(&once["queue"], &json!(want_queue));
            for (key, value) in &template_payload {
                let want = task_payload.get(key).unwrap_or(value);
                prop_assert_eq!(&once["payload"][key], &json!(want));
            }
            for (key, value) in &task_payload {
                prop_assert_eq!(&once["payload"][key], &json!(value));
            }
        }
    }
}
