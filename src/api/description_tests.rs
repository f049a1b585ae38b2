//! `kubectl explain` teaches every field: each property of every CRD's schema, at every depth, has
//! a description of its own (from the doc comments), and no kind says "Auto-generated".

use kube::CustomResourceExt;
use serde_json::Value;

use super::{AxCron, AxDag, AxQueue, AxTask, AxTaskTemplate};

/// Paths (`AxTask.spec.retry.backoff`) of the properties below `schema` without a description.
fn undescribed(path: &str, schema: &Value, out: &mut Vec<String>) {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let path = format!("{path}.{name}");
            let description = property.get("description").and_then(Value::as_str);
            if description.is_none_or(|d| d.trim().is_empty() || d.contains("Auto-generated")) {
                out.push(path.clone());
            }
            undescribed(&path, property, out);
        }
    }
    if let Some(items) = schema.get("items") {
        undescribed(&format!("{path}[]"), items, out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        undescribed(&format!("{path}{{}}"), values, out);
    }
}

#[test]
fn every_field_of_every_crd_has_a_description() {
    let crds = [
        AxTask::crd(),
        AxDag::crd(),
        AxQueue::crd(),
        AxCron::crd(),
        AxTaskTemplate::crd(),
    ];
    let mut missing = Vec::new();
    for crd in crds {
        let kind = crd.spec.names.kind.clone();
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("a schema");
            let schema = serde_json::to_value(schema).expect("JSON");
            let root = schema.get("description").and_then(Value::as_str);
            if root.is_none_or(|d| d.trim().is_empty() || d.contains("Auto-generated")) {
                missing.push(format!("{kind} (the kind itself)"));
            }
            undescribed(&kind, &schema, &mut missing);
        }
    }
    assert!(missing.is_empty(), "no description: {missing:#?}");
}

#[test]
fn a_missing_description_is_found_at_any_depth() {
    let schema = serde_json::json!({"properties": {
        "spec": {"description": "s", "properties": {
            "list": {"description": "l", "items": {"properties": {"x": {"type": "string"}}}},
            "auto": {"description": "Auto-generated derived type"},
        }},
    }});
    let mut missing = Vec::new();
    undescribed("K", &schema, &mut missing);
    missing.sort();
    assert_eq!(missing, ["K.spec.auto", "K.spec.list[].x"]);
}
