//! What a DAG child gets from the tasks it depends on: `inputs` in its payload, one entry per
//! parent — the parent's output (`status.output`, null when it wrote none), or for a `forEach`
//! parent its counts (its items' outputs stay in their own status: there may be 100,000 of them,
//! and a payload is at most a few hundred kilobytes).

use serde_json::{Map, Value, json};

use crate::api::{AxTaskSpec, DagItemsStatus};

/// What one parent gives its dependents.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParentResult<'a> {
    /// A task run once: its output, if it wrote one (or its child is gone).
    Task(Option<&'a Value>),
    /// A `forEach` task: its items' counts, and how many of its succeeded items wrote an output.
    Items {
        status: &'a DagItemsStatus,
        outputs: u32,
    },
}

/// The `inputs` object of a child whose parents gave `parents`.
pub fn inputs<'a>(parents: impl IntoIterator<Item = (&'a str, ParentResult<'a>)>) -> Value {
    let entries = parents.into_iter().map(|(name, result)| {
        let value = match result {
            ParentResult::Task(output) => output.cloned().unwrap_or(Value::Null),
            ParentResult::Items { status, outputs } => json!({
                "total": status.total,
                "succeeded": status.succeeded,
                "failed": status.failed,
                "failedIndexes": status.failed_indexes,
                "outputs": outputs,
            }),
        };
        (name.to_owned(), value)
    });
    Value::Object(entries.collect::<Map<_, _>>())
}

/// The spec of a child whose task has parents: `spec` with `inputs` in its payload (a payload that
/// is no object is kept under `payload`).
pub fn child_spec(spec: &AxTaskSpec, inputs: Value) -> AxTaskSpec {
    super::child_spec(spec, vec![("inputs", inputs)], &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_child_gets_each_parents_output_or_counts() {
        let output = json!({"orders": [1, 2]});
        let items = DagItemsStatus {
            total: 2000,
            succeeded: 1998,
            failed: 2,
            failed_indexes: "3,17".into(),
            ..DagItemsStatus::default()
        };
        let got = inputs([
            ("split", ParentResult::Task(Some(&output))),
            ("quiet", ParentResult::Task(None)),
            (
                "map",
                ParentResult::Items {
                    status: &items,
                    outputs: 1990,
                },
            ),
        ]);
        assert_eq!(
            got,
            json!({
                "split": {"orders": [1, 2]},
                "quiet": null,
                "map": {"total": 2000, "succeeded": 1998, "failed": 2, "failedIndexes": "3,17", "outputs": 1990},
            })
        );
        let spec: AxTaskSpec =
            serde_json::from_value(json!({"type": "t", "payload": {"order": 7}, "template": {}}))
                .expect("spec");
        let child = child_spec(&spec, got.clone());
        assert_eq!(
            child.payload,
            Some(json!({"order": 7, "inputs": got})),
            "the task's own payload stays"
        );
    }

    proptest! {
        /// Every parent appears once, under its name, with exactly its output.
        #[test]
        fn every_parent_is_one_entry_with_its_output(
            outputs in proptest::collection::btree_map("[a-z]{1,8}", proptest::option::of(any::<i64>()), 0..12)
        ) {
            let values: Vec<(String, Option<Value>)> =
                outputs.iter().map(|(k, v)| (k.clone(), v.map(Value::from))).collect();
            let got = inputs(values.iter().map(|(k, v)| (k.as_str(), ParentResult::Task(v.as_ref()))));
            let object = got.as_object().expect("an object");
            prop_assert_eq!(object.len(), outputs.len());
            for (name, output) in &outputs {
                let want = output.map(Value::from).unwrap_or(Value::Null);
                prop_assert_eq!(object.get(name), Some(&want));
            }
        }
    }
}
