//! Fan-out nodes (issue 27: a DAG node with `forEach`) as pure functions: which items to create
//! next, and the node's outcome from the phases of the items that exist — counts and a compact list
//! of failed indexes, never one entry per child, so a node of 100,000 items stays small.
//!
//! Like the rest of the DAG core it keeps no memory between calls: every step is derived again from
//! the children that exist (found by label, named `<dag>-<node>-<index>`), so a restarted operator
//! creates no item twice. Items are created lowest index first, at most `parallelism` at work at
//! once, and none once the node's outcome is decided. The rules follow the Job API's
//! `backoffLimitPerIndex` / `maxFailedIndexes` / `successPolicy`:
//! - an item's own retries are its child's; an item that ends Dead or Canceled has failed;
//! - more failed items than `max_failed_items` fails the node at once: nothing more is created and
//!   the items at work are canceled; so does a failure that puts the success policy out of reach
//!   (under `All`, any failure beyond `max_failed_items`, none tolerated when it is absent);
//! - otherwise the node succeeds once every item has ended.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::MAX_CHILD_NAME_LEN;
use crate::api::{AxTaskSpec, DagItemsStatus, ForEach, FromOutput, TaskPhase};
use crate::core::output;

/// Items at work at once when `forEach.parallelism` is absent.
pub const DEFAULT_PARALLELISM: u32 = 100;
/// Most items one `forEach` task may have.
pub const MAX_ITEMS: usize = 1_000_000;

/// Failed indexes listed in the status at most; the rest are counted.
pub const FAILED_INDEXES_LISTED: usize = 100;

/// When a fan-out node succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuccessPolicy {
    /// Every item succeeded but for at most `max_failed_items` (none when absent).
    All,
    /// At least this many items succeeded.
    MinSucceeded(u32),
    /// At least this percentage of the items (rounded up).
    MinSucceededPercent(u32),
}

/// A fan-out node as its spec says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FanOut {
    /// How many items: a literal list's length, a range's count, or a parent's output list's.
    pub items: u32,
    /// Items at work (created and not ended) at most; at least 1.
    pub parallelism: u32,
    pub success: SuccessPolicy,
    /// Failed items tolerated; one more fails the node at once. None: no early failure.
    pub max_failed_items: Option<u32>,
}

impl FanOut {
    /// Items that must succeed.
    pub fn required(&self) -> u32 {
        match self.success {
            SuccessPolicy::All => self
                .items
                .saturating_sub(self.max_failed_items.unwrap_or(0)),
            SuccessPolicy::MinSucceeded(n) => n.min(self.items),
            SuccessPolicy::MinSucceededPercent(p) => {
                let p = u64::from(p.min(100));
                u32::try_from((u64::from(self.items) * p).div_ceil(100)).unwrap_or(self.items)
            }
        }
    }
}

/// What the items of a node are doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub not_created: u32,
    /// Created and not ended (Pending, Scheduled, Running, and Failed/TimedOut between retries).
    pub at_work: u32,
    pub succeeded: u32,
    /// Dead or Canceled.
    pub failed: u32,
}

/// The node's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOutcome {
    Running,
    Succeeded,
    /// With why, for the node's status message.
    Failed(String),
}

/// One step of a fan-out node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Item indexes to create now, ascending.
    pub create: Vec<u32>,
    /// Items at work to cancel (the node has failed).
    pub cancel: Vec<u32>,
    pub counts: Counts,
    pub outcome: NodeOutcome,
    /// The failed indexes as ranges, `3,7-9`, at most [`FAILED_INDEXES_LISTED`] of them listed.
    pub failed_indexes: String,
}

fn has_failed(phase: TaskPhase) -> bool {
    matches!(phase, TaskPhase::Dead | TaskPhase::Canceled)
}

/// The next step of `node` given the phase of each item's child that exists (by index; indexes
/// outside the node's items are ignored).
pub fn step(node: &FanOut, phases: &BTreeMap<u32, TaskPhase>) -> Step {
    let children = || phases.range(..node.items);
    let mut counts = Counts::default();
    for (_, phase) in children() {
        match phase {
            TaskPhase::Succeeded => counts.succeeded += 1,
            p if has_failed(*p) => counts.failed += 1,
            _ => counts.at_work += 1,
        }
    }
    let created = counts.succeeded + counts.failed + counts.at_work;
    counts.not_created = node.items - created;
    let required = node.required();
    let too_many_failed = node.max_failed_items.is_some_and(|max| counts.failed > max);
    let out_of_reach = counts.failed > node.items - required;
    let failed_indexes = compact(children().filter(|(_, p)| has_failed(**p)).map(|(i, _)| *i));

    let outcome = if too_many_failed {
        NodeOutcome::Failed(format!(
            "{} items failed, more than maxFailedItems {}",
            counts.failed,
            node.max_failed_items.unwrap_or_default()
        ))
    } else if out_of_reach {
        NodeOutcome::Failed(format!(
            "{} of {} items failed: {required} cannot succeed any more",
            counts.failed, node.items
        ))
    } else if counts.not_created == 0 && counts.at_work == 0 {
        // Every item ended and at least `required` succeeded (else it was out of reach).
        NodeOutcome::Succeeded
    } else {
        NodeOutcome::Running
    };

    let (create, cancel) = match outcome {
        NodeOutcome::Running => {
            let room = node.parallelism.max(1).saturating_sub(counts.at_work);
            // Lowest indexes first: the gaps among the children, then past the last one.
            let create = (0..node.items)
                .filter(|i| !phases.contains_key(i))
                .take(room as usize)
                .collect();
            (create, Vec::new())
        }
        NodeOutcome::Failed(_) => {
            let at_work = children()
                .filter(|(_, p)| **p != TaskPhase::Succeeded && !has_failed(**p))
                .map(|(i, _)| *i)
                .collect();
            (Vec::new(), at_work)
        }
        NodeOutcome::Succeeded => (Vec::new(), Vec::new()),
    };
    Step {
        create,
        cancel,
        counts,
        outcome,
        failed_indexes,
    }
}

/// The node a `forEach` spec describes, or why it cannot run (for the DAG's `InvalidSpec`).
/// `depends_on` is the task's; `output_items` the length of the list a `fromOutput` names, once
/// known (none before: the node has no items yet).
pub fn of_spec(
    dag_name: &str,
    task: &str,
    depends_on: &[String],
    for_each: &ForEach,
    output_items: Option<usize>,
) -> Result<FanOut, String> {
    let sources = [
        for_each.lists_items(),
        for_each.range.is_some(),
        for_each.from_output.is_some(),
    ];
    if sources.into_iter().filter(|set| *set).count() != 1 {
        return Err(format!(
            "task `{task}`: forEach needs exactly one of items, range and fromOutput"
        ));
    }
    let items = match &for_each.from_output {
        Some(from) => {
            if !depends_on.contains(&from.task) {
                return Err(format!(
                    "task `{task}`: forEach.fromOutput.task `{}` is not one of its dependsOn",
                    from.task
                ));
            }
            output_items.unwrap_or(0)
        }
        None => for_each
            .item_count()
            .ok_or_else(|| format!("task `{task}`: forEach.range.count is negative"))?,
    };
    if items > MAX_ITEMS {
        return Err(format!(
            "task `{task}`: forEach has {items} items, more than {MAX_ITEMS}"
        ));
    }
    let items = u32::try_from(items).unwrap_or(u32::MAX);
    let last = item_child_name(dag_name, task, items.saturating_sub(1));
    if last.len() > MAX_CHILD_NAME_LEN {
        return Err(format!(
            "task `{task}`: child name `{last}` is {} characters, more than {MAX_CHILD_NAME_LEN}",
            last.len()
        ));
    }
    let non_negative = |value: i64, field: &str| {
        u32::try_from(value).map_err(|_| format!("task `{task}`: forEach.{field} is {value}"))
    };
    let success = match &for_each.success_policy {
        None => SuccessPolicy::All,
        Some(policy) => match (policy.min_succeeded, policy.min_succeeded_percent) {
            (Some(n), None) => {
                SuccessPolicy::MinSucceeded(non_negative(n, "successPolicy.minSucceeded")?)
            }
            (None, Some(p)) if (0..=100).contains(&p) => SuccessPolicy::MinSucceededPercent(
                non_negative(p, "successPolicy.minSucceededPercent")?,
            ),
            (None, Some(p)) => {
                return Err(format!(
                    "task `{task}`: forEach.successPolicy.minSucceededPercent is {p}, not 0-100"
                ));
            }
            _ => {
                return Err(format!(
                    "task `{task}`: forEach.successPolicy needs exactly one of minSucceeded and minSucceededPercent"
                ));
            }
        },
    };
    let parallelism = match for_each.parallelism {
        Some(p) if p < 1 => {
            return Err(format!(
                "task `{task}`: forEach.parallelism is {p}, less than 1"
            ));
        }
        Some(p) => p.unsigned_abs(),
        None => DEFAULT_PARALLELISM,
    };
    let max_failed_items = for_each
        .max_failed_items
        .map(|m| non_negative(m.into(), "maxFailedItems"))
        .transpose()?;
    Ok(FanOut {
        items,
        parallelism,
        success,
        max_failed_items,
    })
}

/// The items of a `forEach` over `from`'s output (`output`, absent when the task has none): the
/// list at its path. Why not, when there is no such list, for the node's failure.
pub fn output_items<'a>(
    task: &str,
    from: &FromOutput,
    output: Option<&'a Value>,
) -> Result<&'a [Value], String> {
    let path = from.path.as_deref().unwrap_or_default();
    let parent = &from.task;
    let Some(output) = output else {
        return Err(format!(
            "task `{task}`: forEach.fromOutput: task `{parent}` succeeded without an output"
        ));
    };
    let named = match path {
        "" => format!("the output of task `{parent}`"),
        path => format!("`{path}` in the output of task `{parent}`"),
    };
    match output::at_path(output, path) {
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!(
            "task `{task}`: forEach.fromOutput: {named} is {}, not a list",
            kind_of(other)
        )),
        None => Err(format!(
            "task `{task}`: forEach.fromOutput: the output of task `{parent}` has no `{path}`"
        )),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The step of a node whose items cannot be known (`why`): it fails at once, creating nothing.
pub fn unusable(why: String) -> Step {
    Step {
        create: Vec::new(),
        cancel: Vec::new(),
        counts: Counts::default(),
        outcome: NodeOutcome::Failed(why),
        failed_indexes: String::new(),
    }
}

/// The name of the child AxTask that runs item `index` of `task`.
pub fn item_child_name(dag_name: &str, task: &str, index: u32) -> String {
    format!("{dag_name}-{task}-{index}")
}

/// The spec of item `index`'s child: the task's spec, whose payload gets `item` and `itemIndex`
/// (a payload that is no object is kept under `payload`), and whose containers get env `AX_ITEM`
/// (the item as JSON) and `AX_ITEM_INDEX`. A variable the template sets itself wins.
pub fn item_spec(spec: &AxTaskSpec, index: u32, item: serde_json::Value) -> AxTaskSpec {
    let vars = super::item_vars(&item, index);
    let fields = vec![("item", item), ("itemIndex", index.into())];
    super::child_spec(spec, fields, &vars)
}

impl Step {
    /// The items to create, now counted at work: the step is then what [`step`] gives once they
    /// exist (as Pending), without walking the items again.
    pub fn take_create(&mut self) -> Vec<u32> {
        let create = std::mem::take(&mut self.create);
        let created = u32::try_from(create.len()).unwrap_or(u32::MAX);
        self.counts.at_work += created;
        self.counts.not_created -= created;
        create
    }

    /// The node's items as the DAG's status reports them.
    pub fn status(&self, node: &FanOut) -> DagItemsStatus {
        DagItemsStatus {
            total: node.items,
            at_work: self.counts.at_work,
            succeeded: self.counts.succeeded,
            failed: self.counts.failed,
            failed_indexes: self.failed_indexes.clone(),
            message: match &self.outcome {
                NodeOutcome::Failed(why) => why.clone(),
                _ => String::new(),
            },
        }
    }

    /// The phase the node's items give it in the graph: Running while any is at work (also while a
    /// failed node's items stop), then Succeeded or Dead.
    pub fn phase(&self) -> TaskPhase {
        match self.outcome {
            _ if self.counts.at_work > 0 => TaskPhase::Running,
            NodeOutcome::Running => TaskPhase::Running,
            NodeOutcome::Succeeded => TaskPhase::Succeeded,
            NodeOutcome::Failed(_) => TaskPhase::Dead,
        }
    }
}

/// Ascending indexes as ranges (`0,3-5,9`), the first [`FAILED_INDEXES_LISTED`] ranges listed and
/// the rest counted.
pub fn compact(indexes: impl IntoIterator<Item = u32>) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for i in indexes {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == i => *end = i,
            _ => ranges.push((i, i)),
        }
    }
    let mut out = String::new();
    for (n, (start, end)) in ranges.iter().enumerate() {
        if n == FAILED_INDEXES_LISTED {
            let rest: u32 = ranges[n..].iter().map(|(s, e)| e - s + 1).sum();
            let _ = write!(out, ",… {rest} more");
            break;
        }
        if n > 0 {
            out.push(',');
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
    }
    out
}

#[cfg(test)]
mod tests;
