//! A DAG's exit handler (`spec.onExit`): a task run once, as the child `<dag>-onexit`, when the DAG
//! reaches a terminal phase. Pure: what the status says of it, whether to create it now, and its
//! spec.
//!
//! Exactly once, across restarts, without memory: the child's name is fixed, so a second create
//! finds the first; and it carries the DAG's child finalizer until `status.onExit` records how it
//! ended, so a recorded phase that is not terminal with no child means it was never created (a
//! created one cannot be gone before its end is recorded).

use super::{DagNodePhase, DagPhase, TaskPhase, child_name, node_phase};
use crate::api::{AxDagStatus, AxTaskSpec, DagNodeStatus};

/// The task name of the exit handler's child, `<dag>-onexit`; no task of a DAG with an exit
/// handler may have it.
pub const ON_EXIT_TASK: &str = "onexit";

/// What the DAG's status says of its exit handler, and whether to create its child now.
#[derive(Debug, Clone, PartialEq)]
pub struct OnExit {
    pub status: Option<DagNodeStatus>,
    pub create: bool,
}

/// Decides on the exit handler of DAG `dag_name` now in `phase`, from what the status recorded
/// before and the phase of its child if it exists (or was just created).
pub fn decide(
    dag_name: &str,
    phase: DagPhase,
    recorded: Option<&DagNodeStatus>,
    child: Option<TaskPhase>,
) -> OnExit {
    let child_name = child_name(dag_name, ON_EXIT_TASK);
    decide_for(&child_name, phase.is_terminal(), recorded, child)
}

/// Decides on an exit handler run as the child `child_name` — a DAG's, or an AxTask's
/// (`spec.onExit`) — once its owner has ended (`ended`), from what the owner's status recorded
/// before and the phase of the child if it exists (or was just created).
pub fn decide_for(
    child_name: &str,
    ended: bool,
    recorded: Option<&DagNodeStatus>,
    child: Option<TaskPhase>,
) -> OnExit {
    let finished = |node: &DagNodeStatus| {
        matches!(
            node.phase,
            DagNodePhase::Succeeded | DagNodePhase::Dead | DagNodePhase::Canceled
        )
    };
    if let Some(node) = recorded.filter(|node| finished(node)) {
        return OnExit {
            status: Some(node.clone()),
            create: false,
        };
    }
    if recorded.is_none() && !ended {
        return OnExit {
            status: None,
            create: false,
        };
    }
    let status = |phase| {
        Some(DagNodeStatus {
            phase,
            task: Some(child_name.to_owned()),
            items: None,
        })
    };
    match child {
        Some(child) => OnExit {
            status: status(node_phase(child)),
            create: false,
        },
        None => OnExit {
            status: status(DagNodePhase::Pending),
            create: true,
        },
    }
}

/// Why a DAG with an exit handler cannot have `task`.
pub fn check_task_name(task: &str) -> Result<(), String> {
    match task == ON_EXIT_TASK {
        true => Err(format!(
            "task `{ON_EXIT_TASK}`: the name is the exit handler's (spec.onExit); rename the task"
        )),
        false => Ok(()),
    }
}

/// The exit handler's child spec: `spec` whose payload gets `dag` (the DAG's name, phase, progress
/// and each task's phase) and whose containers get env `AX_DAG` and `AX_DAG_PHASE`.
pub fn spec(spec: &AxTaskSpec, dag_name: &str, status: &AxDagStatus) -> AxTaskSpec {
    let phase = status.phase.unwrap_or_default();
    let nodes: serde_json::Map<String, serde_json::Value> = status
        .nodes
        .iter()
        .map(|(task, node)| {
            let phase = serde_json::to_value(node.phase).unwrap_or_default();
            (task.clone(), phase)
        })
        .collect();
    let summary = serde_json::json!({
        "name": dag_name,
        "phase": phase.as_str(),
        "progress": status.progress,
        "nodes": nodes,
    });
    let vars = super::dag_vars(dag_name.to_owned(), phase.as_str().to_owned());
    super::child_spec(spec, vec![("dag", summary)], &vars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskPhase::{Dead, Running, Succeeded};

    fn node(phase: DagNodePhase) -> DagNodeStatus {
        DagNodeStatus {
            phase,
            task: Some("d-onexit".into()),
            items: None,
        }
    }

    #[test]
    fn nothing_happens_before_the_dag_finishes() {
        let running = decide("d", DagPhase::Running, None, None);
        assert_eq!(
            running,
            OnExit {
                status: None,
                create: false
            }
        );
    }

    #[test]
    fn a_finished_dag_creates_its_handler_once_and_tracks_it_to_its_end() {
        for phase in [DagPhase::Succeeded, DagPhase::Failed, DagPhase::Canceled] {
            let first = decide("d", phase, None, None);
            assert!(first.create, "{phase}");
            assert_eq!(first.status, Some(node(DagNodePhase::Pending)));
            // Recorded, then created: tracked, not created again.
            let seen = decide("d", phase, first.status.as_ref(), Some(Running));
            assert_eq!(
                (seen.status, seen.create),
                (Some(node(DagNodePhase::Running)), false)
            );
            // Killed between the record and the create: created now.
            let again = decide("d", phase, first.status.as_ref(), None);
            assert!(again.create);
        }
    }

    #[test]
    fn a_recorded_end_is_final_whatever_the_dag_or_the_child_does_since() {
        for end in [DagNodePhase::Succeeded, DagNodePhase::Dead] {
            let recorded = node(end);
            for child in [None, Some(Succeeded), Some(Dead), Some(Running)] {
                for phase in [DagPhase::Running, DagPhase::Failed] {
                    let decided = decide("d", phase, Some(&recorded), child);
                    assert_eq!(decided.status, Some(recorded.clone()));
                    assert!(!decided.create, "a finished handler is never created again");
                }
            }
        }
    }

    #[test]
    fn its_spec_carries_the_dags_phase_and_summary() {
        let handler: AxTaskSpec = serde_json::from_value(serde_json::json!({
            "type": "notify", "payload": {"channel": "ops"},
            "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}},
        }))
        .expect("spec");
        let status: AxDagStatus = serde_json::from_value(serde_json::json!({
            "phase": "Failed", "progress": "2/2",
            "nodes": {"a": {"phase": "Succeeded", "task": "d-a"}, "b": {"phase": "Dead", "task": "d-b"}},
        }))
        .expect("status");
        let child = spec(&handler, "d", &status);
        assert_eq!(
            child.payload,
            Some(serde_json::json!({"channel": "ops", "dag": {
                "name": "d", "phase": "Failed", "progress": "2/2",
                "nodes": {"a": "Succeeded", "b": "Dead"}}}))
        );
        let env: Vec<(String, Option<String>)> = child.template.containers()[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        assert_eq!(
            env,
            [
                ("AX_DAG".to_owned(), Some("d".to_owned())),
                ("AX_DAG_PHASE".to_owned(), Some("Failed".to_owned()))
            ]
        );
        assert!(check_task_name("onexit").is_err() && check_task_name("exit").is_ok());
    }
}
