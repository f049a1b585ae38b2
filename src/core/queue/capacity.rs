//! What a queue's worker pods and their nodes say about the cluster's capacity, as the adaptive
//! concurrency reads it (no client required): a pod is placed, Unschedulable, not yet looked at by
//! the scheduler, or finished; a node may report MemoryPressure, DiskPressure or PIDPressure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

use super::adaptive::Observation;

/// The node conditions that mean "this node is overloaded".
pub const PRESSURE_CONDITIONS: [&str; 3] = ["MemoryPressure", "DiskPressure", "PIDPressure"];

/// Where one worker pod stands with the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement<'a> {
    /// Bound to a node (running, starting, or stopping there).
    Placed(&'a str),
    /// The scheduler found no node for it: `PodScheduled` False, reason `Unschedulable`.
    Unschedulable,
    /// Not bound, and the scheduler has not said why yet.
    Unbound,
    /// Succeeded or Failed, or deleted before it was placed: it holds no capacity.
    Gone,
}

pub fn placement(pod: &Pod) -> Placement<'_> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Placement::Gone;
    }
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        return Placement::Placed(node);
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Placement::Gone;
    }
    let unschedulable = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        });
    if unschedulable {
        Placement::Unschedulable
    } else {
        Placement::Unbound
    }
}

/// The pressure conditions a node reports as True.
pub fn pressure(node: &Node) -> Vec<&'static str> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    PRESSURE_CONDITIONS
        .into_iter()
        .filter(|type_| {
            conditions
                .iter()
                .any(|c| c.type_ == *type_ && c.status == "True")
        })
        .collect()
}

/// Counts each queue's worker pods by placement, in one pass. `pods` yields each live worker pod
/// with its task's queue; `pressure_of` gives a node's pressure conditions (asked once per node).
pub fn tally<'a>(
    pods: impl IntoIterator<Item = (&'a Pod, String)>,
    mut pressure_of: impl FnMut(&str) -> Vec<&'static str>,
) -> BTreeMap<String, Observation> {
    let mut nodes: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut seen: BTreeMap<String, Observation> = BTreeMap::new();
    for (pod, queue) in pods {
        let counts = seen.entry(queue).or_default();
        match placement(pod) {
            Placement::Placed(node) => {
                counts.placed += 1;
                let conditions = nodes
                    .entry(node.to_string())
                    .or_insert_with(|| pressure_of(node));
                if !conditions.is_empty() {
                    counts.on_pressured_nodes += 1;
                    let named = format!("{node} {}", conditions.join("+"));
                    if !counts.pressured_nodes.contains(&named) && counts.pressured_nodes.len() < 5
                    {
                        counts.pressured_nodes.push(named);
                    }
                }
            }
            Placement::Unschedulable => counts.unschedulable += 1,
            Placement::Unbound | Placement::Gone => {}
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    fn pods() -> Vec<(Pod, String)> {
        let unschedulable = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}});
        vec![
            (
                pod(
                    json!({"spec": {"nodeName": "a", "containers": []}, "status": {"phase": "Running"}}),
                ),
                "q".into(),
            ),
            (
                pod(
                    json!({"spec": {"nodeName": "b", "containers": []}, "status": {"phase": "Pending"}}),
                ),
                "q".into(),
            ),
            (
                pod(
                    json!({"spec": {"nodeName": "b", "containers": []}, "status": {"phase": "Succeeded"}}),
                ),
                "q".into(),
            ),
            (pod(unschedulable.clone()), "q".into()),
            (pod(unschedulable), "other".into()),
            (pod(json!({"status": {"phase": "Pending"}})), "q".into()),
        ]
    }

    #[test]
    fn counts_placed_unschedulable_and_pressured_pods_per_queue() {
        let pods = pods();
        let mut asked = Vec::new();
        let seen = tally(pods.iter().map(|(p, q)| (p, q.clone())), |node| {
            asked.push(node.to_string());
            if node == "b" {
                vec!["MemoryPressure"]
            } else {
                vec![]
            }
        });
        let q = &seen["q"];
        assert_eq!((q.placed, q.unschedulable, q.on_pressured_nodes), (2, 1, 1));
        assert_eq!(q.pressured_nodes, ["b MemoryPressure"]);
        assert_eq!(seen["other"].unschedulable, 1);
        assert_eq!(asked, ["a", "b"], "each node is asked once");
    }

    #[test]
    fn a_node_reports_only_true_pressure_conditions() {
        let node: Node = serde_json::from_value(json!({"status": {"conditions": [
            {"type": "MemoryPressure", "status": "True"},
            {"type": "DiskPressure", "status": "False"},
            {"type": "Ready", "status": "True"},
        ]}}))
        .expect("a node");
        assert_eq!(pressure(&node), ["MemoryPressure"]);
        assert!(pressure(&Node::default()).is_empty());
    }
}
