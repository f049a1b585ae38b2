//! No panic on anything the API server accepts (issue 12): property tests that generate arbitrary
//! JSON shaped by the CRDs' own OpenAPI schemas (types, enums, patterns, bounds, lengths, nullable,
//! int-or-string, preserve-unknown-fields; everything optional may be missing), deserialize it as
//! the operator does and run the spec validations on whatever deserializes. A value serde rejects
//! is fine (the operator reports it); a panic is a bug.
//!
//! The schemas come from the types (`CustomResourceExt::crd`), which `crds/` is checked against, so
//! this follows the API as it changes. `PROPTEST_CASES` raises the case count for a longer run.

use std::collections::BTreeMap;

use kube::CustomResourceExt;
use proptest::prelude::*;
use proptest::strategy::Union;
use serde_json::{Map, Value, json};

use crate::api::{AxDag, AxDagSpec, AxDagStatus, AxQueue, AxQueueSpec, AxQueueStatus, AxTask};
use crate::api::{AxTaskSpec, AxTaskStatus};
use crate::core::dag::DagNode;

/// The `openAPIV3Schema` of a CRD's first version.
fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    let crd = serde_json::to_value(crd).expect("CRD as JSON");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Below this depth optional fields are left out and arrays stay short, so the embedded Pod
/// template does not explode.
const DEEP: u32 = 6;

/// Arbitrary JSON (for `x-kubernetes-preserve-unknown-fields` without properties).
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map(".{0,10}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn integer(schema: &Value) -> BoxedStrategy<Value> {
    let (low, high) = match schema["format"].as_str() {
        Some("int32") => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => (i64::MIN, i64::MAX),
    };
    let low = schema["minimum"].as_i64().unwrap_or(low);
    let high = schema["maximum"].as_i64().unwrap_or(high);
    if low > high {
        return Just(Value::from(low)).boxed();
    }
    // The edges are where overflow hides.
    let edges: Vec<i64> = [low, high, 0, 1, -1, 60, 3600]
        .into_iter()
        .filter(|v| (low..=high).contains(v))
        .collect();
    // Mostly small non-negative values (what people write), then edges, then anything.
    let small = (low.max(0)..=high.min(1000).max(low.max(0))).prop_map(Value::from);
    prop_oneof![
        4 => small,
        2 => proptest::sample::select(edges).prop_map(Value::from),
        1 => (low..=high).prop_map(Value::from),
    ]
    .boxed()
}

/// Strings where the schema says only "string" but the operator reads more: time zones, wall
/// clock times and DAG task names that may refer to each other. Plus anything, always.
fn hinted(property: &str) -> Option<BoxedStrategy<Value>> {
    let anything = ".{0,20}".prop_map(Value::from);
    let hint: BoxedStrategy<Value> = match property {
        "timeZone" => proptest::sample::select(vec![
            "UTC",
            "Europe/Berlin",
            "America/New_York",
            "Asia/Kolkata",
            "Australia/Lord_Howe",
        ])
        .prop_map(Value::from)
        .boxed(),
        "from" | "to" => "(([01][0-9]|2[0-3]):[0-5][0-9]|24:00|[0-9]{1,2}:[0-9]{1,2})"
            .prop_map(Value::from)
            .boxed(),
        _ => return None,
    };
    Some(prop_oneof![4 => hint, 1 => anything].boxed())
}

/// DAG task names from a small set, so that dependencies name real tasks (and cycles happen).
fn dag_task_name() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => proptest::sample::select(vec!["a", "b", "c", "d", "e"]).prop_map(Value::from),
        1 => "[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?".prop_map(Value::from),
    ]
    .boxed()
}

fn number(schema: &Value) -> BoxedStrategy<Value> {
    let low = schema["minimum"].as_f64().unwrap_or(-1e12);
    let high = schema["maximum"].as_f64().unwrap_or(1e12);
    if low >= high {
        return Just(json!(low)).boxed();
    }
    let edges = vec![low, high, 0.0, 1.0, 0.5, f64::MIN_POSITIVE, 1e-300];
    prop_oneof![
        proptest::sample::select(edges)
            .prop_filter("in range", move |v| *v >= low && *v <= high)
            .prop_map(|v| json!(v)),
        (low..=high).prop_map(|v| json!(v)),
    ]
    .boxed()
}

fn string(schema: &Value) -> BoxedStrategy<Value> {
    let max = schema["maxLength"].as_u64().map(|m| m as usize);
    let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
    let base: BoxedStrategy<String> = if schema["format"] == "date-time" {
        (0i64..4_102_444_800, 0u32..1_000_000)
            .prop_map(|(secs, micros)| {
                jiff::Timestamp::new(secs, (micros * 1000) as i32)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            })
            .boxed()
    } else if let Some(pattern) = schema["pattern"].as_str() {
        // OpenAPI patterns search; anchors pin an end, otherwise anything may surround the match.
        let core = pattern.trim_start_matches('^').trim_end_matches('$');
        let before = if pattern.starts_with('^') {
            ""
        } else {
            ".{0,8}"
        };
        let after = if pattern.ends_with('$') {
            ""
        } else {
            ".{0,40}"
        };
        proptest::string::string_regex(&format!("{before}(?:{core}){after}"))
            .map(|s| s.boxed())
            .unwrap_or_else(|_| ".{0,40}".boxed())
    } else {
        prop_oneof![
            3 => "[a-z0-9-]{0,20}",
            1 => ".{0,60}",
            1 => Just(String::new()),
        ]
        .boxed()
    };
    base.prop_map(move |s| {
        let mut s: String = match max {
            Some(max) => s.chars().take(max).collect(),
            None => s,
        };
        while s.chars().count() < min {
            s.push('a');
        }
        Value::from(s)
    })
    .boxed()
}

fn object(schema: &Value, depth: u32) -> BoxedStrategy<Value> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields: Vec<BoxedStrategy<Option<(String, Value)>>> = Vec::new();
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            let is_required = required.contains(&name.as_str());
            let dag_task = properties.contains_key("dependsOn");
            let strategy = match (name.as_str(), property["type"].as_str()) {
                ("name", _) if dag_task => dag_task_name(),
                ("dependsOn", _) if dag_task => proptest::collection::vec(dag_task_name(), 0..3)
                    .prop_map(Value::from)
                    .boxed(),
                (field, Some("string")) => {
                    hinted(field).unwrap_or_else(|| shaped(property, depth + 1))
                }
                _ => shaped(property, depth + 1),
            };
            let name = name.clone();
            let pair = strategy.prop_map(move |v| (name.clone(), v));
            let field = if is_required {
                pair.prop_map(Some).boxed()
            } else if depth < DEEP {
                let present = if depth < 3 { 0.6 } else { 0.25 };
                proptest::option::weighted(present, pair).boxed()
            } else {
                Just(None).boxed()
            };
            fields.push(field);
        }
    }
    let extra: BoxedStrategy<BTreeMap<String, Value>> = match &schema["additionalProperties"] {
        additional @ Value::Object(_) if depth < DEEP + 2 => {
            proptest::collection::btree_map("[a-z0-9-]{1,12}", shaped(additional, depth + 1), 0..4)
                .boxed()
        }
        _ => Just(BTreeMap::new()).boxed(),
    };
    (fields, extra)
        .prop_map(|(fields, extra)| {
            let mut map: Map<String, Value> = extra.into_iter().collect();
            map.extend(fields.into_iter().flatten());
            Value::Object(map)
        })
        .boxed()
}

/// Values the schema admits (by the constraints the API server checks).
fn shaped(schema: &Value, depth: u32) -> BoxedStrategy<Value> {
    let strategy = shaped_non_null(schema, depth);
    if schema["nullable"] == true {
        prop_oneof![1 => Just(Value::Null), 4 => strategy].boxed()
    } else {
        strategy
    }
}

fn shaped_non_null(schema: &Value, depth: u32) -> BoxedStrategy<Value> {
    if let Some(values) = schema["enum"].as_array().filter(|v| !v.is_empty()) {
        return proptest::sample::select(values.clone()).boxed();
    }
    if schema["x-kubernetes-int-or-string"] == true {
        return prop_oneof![
            integer(&json!({"format": "int32"})),
            prop_oneof!["[0-9]{1,3}%", "[a-z]{1,8}", ".{0,10}"].prop_map(Value::from),
        ]
        .boxed();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = schema[key].as_array().filter(|b| !b.is_empty()) {
            // Branches that only name required fields (`AxTaskSpec`'s): the object itself, with
            // each branch's fields required in turn.
            if branches
                .iter()
                .all(|b| b["type"].is_null() && b["properties"].is_null())
            {
                let objects = branches.iter().map(|branch| {
                    let mut one = schema.clone();
                    if let Some(one) = one.as_object_mut() {
                        one.remove(key);
                        let mut required =
                            schema["required"].as_array().cloned().unwrap_or_default();
                        required.extend(branch["required"].as_array().cloned().unwrap_or_default());
                        one.insert("required".into(), Value::from(required));
                    }
                    shaped(&one, depth)
                });
                return Union::new(objects).boxed();
            }
            return Union::new(branches.iter().map(|b| shaped(b, depth))).boxed();
        }
    }
    match schema["type"].as_str() {
        Some("object") => {
            if schema["x-kubernetes-preserve-unknown-fields"] == true
                && schema["properties"].is_null()
            {
                any_json()
            } else {
                object(schema, depth)
            }
        }
        Some("array") => {
            let max = if depth < DEEP { 4 } else { 1 };
            let min = schema["minItems"].as_u64().unwrap_or(0) as usize;
            let max = schema["maxItems"]
                .as_u64()
                .map_or(max.max(min), |m| (m as usize).min(max.max(min)));
            proptest::collection::vec(shaped(&schema["items"], depth + 1), min..=max.max(min))
                .prop_map(Value::from)
                .boxed()
        }
        Some("string") => string(schema),
        Some("integer") => integer(schema),
        Some("number") => number(schema),
        Some("boolean") => any::<bool>().prop_map(Value::from).boxed(),
        _ if schema["x-kubernetes-preserve-unknown-fields"] == true => any_json(),
        _ if schema["properties"].is_object() => object(schema, depth),
        _ => any_json(),
    }
}

fn part(root: &Value, field: &str) -> BoxedStrategy<Value> {
    shaped(&root["properties"][field], 1)
}

/// A DAG's nodes as the AxDag controller hands them to `core::dag::validate`.
fn dag_nodes(spec: &AxDagSpec) -> Vec<DagNode> {
    spec.tasks
        .iter()
        .map(|task| DagNode {
            name: task.name.clone(),
            depends_on: task.depends_on.clone(),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_task_the_schema_admits_deserializes_and_validates_without_panic(
        spec in part(&schema_of(&AxTask::crd()), "spec"),
        status in part(&schema_of(&AxTask::crd()), "status"),
    ) {
        if let Ok(spec) = serde_json::from_value::<AxTaskSpec>(spec) {
            let _ = crate::core::task::validate(&spec);
            serde_json::to_string(&spec).expect("a spec serializes");
        }
        if let Ok(status) = serde_json::from_value::<AxTaskStatus>(status) {
            serde_json::to_string(&status).expect("a status serializes");
        }
    }

    #[test]
    fn any_template_the_schema_admits_completes_any_task_without_panic(
        template in part(&schema_of(&crate::api::AxTaskTemplate::crd()), "spec"),
        task in part(&schema_of(&AxTask::crd()), "spec"),
    ) {
        let resolved = crate::core::template::resolve(&task, &template);
        if let Ok(spec) = serde_json::from_value::<AxTaskSpec>(resolved) {
            let _ = crate::core::task::validate(&spec);
        }
    }

    #[test]
    fn any_queue_the_schema_admits_deserializes_and_validates_without_panic(
        spec in part(&schema_of(&AxQueue::crd()), "spec"),
        status in part(&schema_of(&AxQueue::crd()), "status"),
    ) {
        if let Ok(spec) = serde_json::from_value::<AxQueueSpec>(spec) {
            let _ = crate::core::queue::queue_config(&spec);
            serde_json::to_string(&spec).expect("a spec serializes");
        }
        if let Ok(status) = serde_json::from_value::<AxQueueStatus>(status) {
            serde_json::to_string(&status).expect("a status serializes");
        }
    }

    #[test]
    fn any_dag_the_schema_admits_deserializes_and_validates_without_panic(
        spec in part(&schema_of(&AxDag::crd()), "spec"),
        status in part(&schema_of(&AxDag::crd()), "status"),
        name in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
    ) {
        if let Ok(spec) = serde_json::from_value::<AxDagSpec>(spec) {
            let _ = crate::core::dag::validate(&name, &dag_nodes(&spec));
            for task in &spec.tasks {
                let _ = crate::core::task::validate(&task.spec);
            }
            serde_json::to_string(&spec).expect("a spec serializes");
        }
        if let Ok(status) = serde_json::from_value::<AxDagStatus>(status) {
            serde_json::to_string(&status).expect("a status serializes");
        }
    }
}

#[test]
fn most_generated_specs_deserialize_and_many_pass_validation() {
    // A generator that only made garbage would test nothing: serde must accept most of what it
    // makes, and validation must accept a fair share, so every check of it runs.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let tasks = part(&schema_of(&AxTask::crd()), "spec");
    let queues = part(&schema_of(&AxQueue::crd()), "spec");
    let dags = part(&schema_of(&AxDag::crd()), "spec");
    // (deserialized, valid) per kind.
    let mut counts = [(0, 0); 3];
    for _ in 0..400 {
        let mut t = tasks.new_tree(&mut runner).expect("a task").current();
        // The template's schema admits any object (it is checked at pod creation), so a generated
        // one is garbage; a real one lets validation's other checks run.
        t["template"] = serde_json::json!({"spec": {"containers": [{"name": "w", "image": "i"}]}});
        if let Ok(spec) = serde_json::from_value::<AxTaskSpec>(t) {
            counts[0].0 += 1;
            counts[0].1 += usize::from(crate::core::task::validate(&spec).is_ok());
        }
        let q = queues.new_tree(&mut runner).expect("a queue").current();
        if let Ok(spec) = serde_json::from_value::<AxQueueSpec>(q) {
            counts[1].0 += 1;
            counts[1].1 += usize::from(crate::core::queue::queue_config(&spec).is_ok());
        }
        let d = dags.new_tree(&mut runner).expect("a dag").current();
        if let Ok(spec) = serde_json::from_value::<AxDagSpec>(d) {
            counts[2].0 += 1;
            counts[2].1 += usize::from(crate::core::dag::validate("d", &dag_nodes(&spec)).is_ok());
        }
    }
    eprintln!("(deserialized, valid) of 400: tasks, queues, DAGs: {counts:?}");
    for (deserialized, valid) in counts {
        assert!(deserialized >= 200 && valid >= 20, "{counts:?}");
    }
}
