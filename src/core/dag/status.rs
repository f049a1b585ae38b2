//! The status an AxDag shows (no client required): its nodes, phase, progress and conditions from
//! the graph's evaluation, what the previous status recorded of children that are gone, and how a
//! child's own phase counts for the graph.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;

use super::{Evaluation, Graph};
use crate::api::{
    AxDag, AxDagStatus, AxTask, DagItemsStatus, DagNodePhase, DagNodeStatus, DagPhase, TaskPhase,
};
use crate::core::conditions::{FAILED, INVALID_SPEC, READY, condition, reason};

/// A child the task controller has not seen yet, or whose re-run request it has not acted on yet,
/// is Pending.
pub fn child_phase(child: &AxTask) -> TaskPhase {
    let status = child.status.as_ref();
    let rerun_waiting = !child.spec.cancel
        && child.spec.rerun > status.map_or(0, |s| s.observed_rerun)
        && status
            .and_then(|s| s.phase)
            .is_some_and(TaskPhase::is_terminal);
    if rerun_waiting {
        return TaskPhase::Pending;
    }
    match status {
        // Terminal while its worker still stops (a canceled child): its dependents and the DAG's
        // own end wait for it, as for a running child.
        Some(s)
            if s.phase.is_some_and(TaskPhase::is_terminal) && !crate::core::task::is_final(s) =>
        {
            TaskPhase::Running
        }
        _ => phase_of(status.and_then(|s| s.phase)),
    }
}

pub fn phase_of(phase: Option<TaskPhase>) -> TaskPhase {
    phase.unwrap_or(TaskPhase::Pending)
}

/// Whether the DAG's status records the child as finished the way it did.
pub fn recorded_as(node: &DagNodeStatus, phase: TaskPhase) -> bool {
    node.task.is_some()
        && matches!(
            (node.phase, phase),
            (DagNodePhase::Succeeded, TaskPhase::Succeeded)
                | (DagNodePhase::Dead, TaskPhase::Dead)
                | (DagNodePhase::Canceled, TaskPhase::Canceled)
        )
}

/// A child that finished and was deleted since (e.g. by its `ttlSecondsAfterFinished`) keeps the
/// phase the status recorded, so it is not run again.
pub fn remember_finished_children(before: &AxDagStatus, phases: &mut HashMap<String, TaskPhase>) {
    for (task, node) in &before.nodes {
        let recorded = match node.phase {
            DagNodePhase::Succeeded => TaskPhase::Succeeded,
            DagNodePhase::Dead => TaskPhase::Dead,
            DagNodePhase::Canceled => TaskPhase::Canceled,
            _ => continue,
        };
        if node.task.is_some() {
            phases.entry(task.clone()).or_insert(recorded);
        }
    }
}

/// The status of a DAG evaluated as `evaluation`; `items` holds the items of its `forEach` tasks
/// that started.
pub fn graph_status(
    graph: &Graph,
    dag: &AxDag,
    before: &AxDagStatus,
    evaluation: &Evaluation,
    items: &HashMap<String, DagItemsStatus>,
    now: Timestamp,
) -> AxDagStatus {
    let nodes: BTreeMap<String, DagNodeStatus> = evaluation
        .nodes
        .iter()
        .map(|node| {
            let has_child = !matches!(node.phase, DagNodePhase::NotStarted | DagNodePhase::Skipped);
            let items = items.get(&node.name).cloned();
            let status = DagNodeStatus {
                phase: node.phase,
                task: (has_child && items.is_none()).then(|| graph.child_name(&node.name)),
                items,
            };
            (node.name.clone(), status)
        })
        .collect();
    let phase = evaluation.phase;
    let any_child = nodes
        .values()
        .any(|node| node.task.is_some() || node.items.is_some());
    let generation = dag.metadata.generation;
    let (ready_reason, ready_message) = ready_reason(phase, evaluation);
    let conditions = vec![
        condition(
            &before.conditions,
            READY,
            phase == DagPhase::Succeeded,
            ready_reason,
            &ready_message,
            generation,
            now,
        ),
        condition(
            &before.conditions,
            FAILED,
            phase == DagPhase::Failed,
            ready_reason,
            &ready_message,
            generation,
            now,
        ),
        condition(
            &before.conditions,
            INVALID_SPEC,
            false,
            reason::VALID,
            "",
            generation,
            now,
        ),
    ];
    AxDagStatus {
        phase: Some(phase),
        nodes,
        progress: Some(evaluation.progress()),
        started_at: before.started_at.or(any_child.then_some(now)),
        finished_at: finished_at(phase, before, now),
        trace: before.trace.clone(),
        conditions,
        observed_generation: generation,
        observed_rerun: before.observed_rerun,
        on_exit: before.on_exit.clone(),
    }
}

pub fn invalid_status(
    dag: &AxDag,
    before: &AxDagStatus,
    message: &str,
    now: Timestamp,
) -> AxDagStatus {
    let generation = dag.metadata.generation;
    AxDagStatus {
        phase: Some(DagPhase::Failed),
        nodes: BTreeMap::new(),
        progress: Some(format!("0/{}", dag.spec.tasks.len())),
        started_at: before.started_at,
        finished_at: finished_at(DagPhase::Failed, before, now),
        trace: before.trace.clone(),
        conditions: vec![
            condition(
                &before.conditions,
                READY,
                false,
                reason::INVALID_SPEC,
                "the DAG cannot run",
                generation,
                now,
            ),
            condition(
                &before.conditions,
                FAILED,
                true,
                reason::INVALID_SPEC,
                message,
                generation,
                now,
            ),
            condition(
                &before.conditions,
                INVALID_SPEC,
                true,
                reason::INVALID_SPEC,
                message,
                generation,
                now,
            ),
        ],
        observed_generation: generation,
        observed_rerun: before.observed_rerun,
        on_exit: before.on_exit.clone(),
    }
}

/// Set once when the phase becomes terminal; cleared if it leaves it (a child retried by hand).
pub fn finished_at(phase: DagPhase, before: &AxDagStatus, now: Timestamp) -> Option<Timestamp> {
    let was_terminal = before.phase.is_some_and(DagPhase::is_terminal);
    match (phase.is_terminal(), was_terminal) {
        (true, true) => before.finished_at.or(Some(now)),
        (true, false) => Some(now),
        (false, _) => None,
    }
}

/// Why the DAG is (not) Ready, naming the tasks that failed it (a few of them).
fn ready_reason(phase: DagPhase, evaluation: &Evaluation) -> (&'static str, String) {
    let named = |wanted: DagNodePhase| -> Vec<&str> {
        evaluation
            .nodes
            .iter()
            .filter(|node| node.phase == wanted)
            .map(|node| node.name.as_str())
            .collect()
    };
    let message = match phase {
        DagPhase::Succeeded => format!("all {} tasks succeeded", evaluation.total),
        DagPhase::Pending | DagPhase::Running => {
            format!(
                "{} of {} tasks finished",
                evaluation.finished, evaluation.total
            )
        }
        DagPhase::Failed | DagPhase::Canceled => {
            let parts: Vec<String> = [
                ("dead", DagNodePhase::Dead),
                ("canceled", DagNodePhase::Canceled),
                ("skipped", DagNodePhase::Skipped),
            ]
            .into_iter()
            .filter_map(|(label, wanted)| {
                let tasks = named(wanted);
                (!tasks.is_empty()).then(|| format!("{label}: {}", short_list(&tasks)))
            })
            .collect();
            parts.join("; ")
        }
    };
    (phase.as_str(), message)
}

fn short_list(tasks: &[&str]) -> String {
    const SHOWN: usize = 10;
    let mut list = tasks
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if tasks.len() > SHOWN {
        list.push_str(&format!(" and {} more", tasks.len() - SHOWN));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(phase: DagNodePhase, task: Option<&str>) -> DagNodeStatus {
        DagNodeStatus {
            phase,
            task: task.map(str::to_owned),
            items: None,
        }
    }

    #[test]
    fn finished_children_deleted_since_keep_their_recorded_phase() {
        let before = AxDagStatus {
            nodes: BTreeMap::from([
                ("a".to_owned(), node(DagNodePhase::Succeeded, Some("d-a"))),
                ("b".to_owned(), node(DagNodePhase::Running, Some("d-b"))),
                ("c".to_owned(), node(DagNodePhase::Skipped, None)),
                ("e".to_owned(), node(DagNodePhase::Dead, Some("d-e"))),
            ]),
            ..Default::default()
        };
        let mut phases = HashMap::from([("e".to_owned(), TaskPhase::Pending)]);
        remember_finished_children(&before, &mut phases);
        // a finished and is gone: remembered. b was running and is gone: created again.
        // c never had a child. e exists again (retried by hand): its real phase wins.
        assert_eq!(
            phases,
            HashMap::from([
                ("a".to_owned(), TaskPhase::Succeeded),
                ("e".to_owned(), TaskPhase::Pending),
            ])
        );
    }

    fn condition_of(status: &AxDagStatus, type_: &str) -> (String, String) {
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions));
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn failed_is_true_exactly_when_the_dag_failed_so_kubectl_wait_ends() {
        use super::super::{DagNode, FailurePolicy, evaluate, validate};
        let graph = validate("d", &[DagNode::new("a", &[]), DagNode::new("b", &["a"])]).unwrap();
        let dag = AxDag::new("d", Default::default());
        let now = Timestamp::UNIX_EPOCH;
        let status_with = |children: &[(&str, TaskPhase)]| {
            let children = children
                .iter()
                .map(|(name, phase)| (name.to_string(), *phase))
                .collect();
            let evaluation = evaluate(&graph, &children, FailurePolicy::FailFast, None, false);
            graph_status(
                &graph,
                &dag,
                &AxDagStatus::default(),
                &evaluation,
                &HashMap::new(),
                now,
            )
        };
        let false_ = |reason: &str| ("False".to_string(), reason.to_string());
        let running = status_with(&[("a", TaskPhase::Running)]);
        assert_eq!(condition_of(&running, FAILED), false_("Running"));
        let failed = status_with(&[("a", TaskPhase::Dead)]);
        assert_eq!(failed.phase, Some(DagPhase::Failed));
        assert_eq!(condition_of(&failed, FAILED).0, "True");
        assert_eq!(condition_of(&failed, READY).0, "False");
        let done = status_with(&[("a", TaskPhase::Succeeded), ("b", TaskPhase::Succeeded)]);
        assert_eq!(condition_of(&done, READY).0, "True");
        assert_eq!(condition_of(&done, FAILED).0, "False");
        let invalid = invalid_status(&dag, &AxDagStatus::default(), "a -> a", now);
        assert_eq!(
            condition_of(&invalid, FAILED),
            ("True".to_string(), reason::INVALID_SPEC.to_string())
        );
    }

    #[test]
    fn finished_at_is_set_once_and_cleared_when_the_dag_runs_again() {
        let t0 = Timestamp::UNIX_EPOCH;
        let t1 = t0 + jiff::SignedDuration::from_secs(5);
        let running = AxDagStatus {
            phase: Some(DagPhase::Running),
            ..Default::default()
        };
        assert_eq!(finished_at(DagPhase::Failed, &running, t0), Some(t0));
        let failed = AxDagStatus {
            phase: Some(DagPhase::Failed),
            finished_at: Some(t0),
            ..Default::default()
        };
        assert_eq!(finished_at(DagPhase::Failed, &failed, t1), Some(t0));
        assert_eq!(finished_at(DagPhase::Running, &failed, t1), None);
    }

    #[test]
    fn a_child_not_seen_by_the_task_controller_is_pending() {
        assert_eq!(phase_of(None), TaskPhase::Pending);
        assert_eq!(phase_of(Some(TaskPhase::Dead)), TaskPhase::Dead);
        let mut child: AxTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask", "metadata": {"name": "d-a"},
            "spec": {"type": "x", "template": {"spec": {"containers": []}}},
            "status": {"phase": "Dead"},
        }))
        .expect("a task");
        assert_eq!(child_phase(&child), TaskPhase::Dead);
        child.spec.rerun = 1;
        assert_eq!(
            child_phase(&child),
            TaskPhase::Pending,
            "its re-run is on its way"
        );
    }

    #[test]
    fn long_lists_are_shortened() {
        let tasks: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = tasks.iter().map(String::as_str).collect();
        assert_eq!(
            short_list(&refs),
            "t0, t1, t2, t3, t4, t5, t6, t7, t8, t9 and 2 more"
        );
        assert_eq!(short_list(&refs[..2]), "t0, t1");
    }
}
