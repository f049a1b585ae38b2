//! An AxTask's exit handler (`spec.onExit`): a task run once, as the AxTask `<task>-onexit`, when
//! the task has ended (Succeeded, Dead or Canceled, every worker stopped). Pure: what the status
//! records of it, whether to create it, and its spec.
//!
//! Exactly once across restarts, like a DAG's (`core::dag::exit`): the status records the handler
//! (Pending) before it is created, its name is fixed so a second create finds the first, and it
//! lives until its task goes (no TTL of its own; the task's TTL waits for the handler's end).

use super::reason::Reason;
use super::{Action, Decision, Inputs};
use crate::api::{AxTaskSpec, AxTaskStatus, DagNodePhase, DagNodeStatus, ExitHandlerSpec};
use crate::core::dag::exit::{ON_EXIT_TASK, decide_for};

/// The name of `task`'s exit handler.
pub fn handler_name(task: &str) -> String {
    crate::core::dag::child_name(task, ON_EXIT_TASK)
}

/// Whether the handler recorded in `recorded` has ended.
pub fn finished(recorded: Option<&DagNodeStatus>) -> bool {
    recorded.is_some_and(|node| {
        matches!(
            node.phase,
            DagNodePhase::Succeeded | DagNodePhase::Dead | DagNodePhase::Canceled
        )
    })
}

/// The exit handler of a task that is terminal; `stopped`: none of its workers runs any more.
/// Returns whether nothing of the handler remains to wait for (none, or its end recorded).
pub(super) fn decide(d: &mut Decision, inputs: &Inputs, stopped: bool) -> bool {
    if inputs.spec.on_exit.is_none() {
        return true;
    }
    let name = handler_name(inputs.task_name);
    let was_dead = dead(d.status.on_exit.as_ref());
    let decided = decide_for(
        &name,
        stopped,
        d.status.on_exit.as_ref(),
        inputs.exit_handler,
    );
    d.status.on_exit = decided.status;
    if decided.create {
        d.actions.push(Action::CreateExitHandler);
    }
    if dead(d.status.on_exit.as_ref()) && !was_dead {
        d.actions.push(Action::Warn {
            reason: Reason::OnExitFailed,
            message: format!(
                "the exit handler {name} (spec.onExit) is Dead; the task's phase stands"
            ),
        });
    }
    finished(d.status.on_exit.as_ref())
}

fn dead(recorded: Option<&DagNodeStatus>) -> bool {
    recorded.is_some_and(|node| node.phase == DagNodePhase::Dead)
}

/// The handler's spec: `handler`'s, whose payload gets `task` (the task's name, phase, reason,
/// attempt and output) and whose containers get env `AX_PARENT_TASK` and `AX_PARENT_PHASE`.
pub fn handler_spec(handler: &ExitHandlerSpec, task: &str, status: &AxTaskStatus) -> AxTaskSpec {
    let phase = status.phase.map(|p| p.as_str()).unwrap_or_default();
    let mut summary = serde_json::json!({
        "name": task,
        "phase": phase,
        "reason": status.reason,
        "attempt": status.attempt,
    });
    if let Some(output) = &status.output {
        summary["output"] = output.clone();
    }
    let vars = crate::core::dag::parent_vars(task.to_owned(), phase.to_owned());
    crate::core::dag::child_spec(&handler.task_spec(), vec![("task", summary)], &vars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TaskPhase;
    use crate::core::task::{Clock, Inputs, decide as decide_task};
    use jiff::Timestamp;

    /// A task that Succeeded at `finished`, with an exit handler and `ttlSecondsAfterFinished: 0`.
    fn ended(finished: Timestamp) -> (crate::api::AxTaskSpec, AxTaskStatus) {
        let spec: crate::api::AxTaskSpec = serde_json::from_value(serde_json::json!({
            "type": "t", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}},
            "ttlSecondsAfterFinished": 0,
            "onExit": {"type": "notify", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}},
        }))
        .expect("a spec");
        let status = AxTaskStatus {
            phase: Some(TaskPhase::Succeeded),
            attempt: 1,
            finished_at: Some(finished),
            ..AxTaskStatus::default()
        };
        (spec, status)
    }

    #[test]
    fn an_ended_task_records_its_handler_then_creates_it_and_goes_only_after_its_end() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let clock = Clock {
            now,
            operator: "op",
            unit_random: 0.5,
        };
        let (spec, status) = ended(now);
        let look = |status: &AxTaskStatus, handler: Option<TaskPhase>| {
            let mut inputs = Inputs::new("etl", &spec, status, &[]);
            inputs.exit_handler = handler;
            decide_task(&inputs, &clock)
        };

        let first = look(&status, None);
        let recorded = first.status.on_exit.clone().expect("recorded");
        assert_eq!(
            (recorded.phase, recorded.task.as_deref()),
            (DagNodePhase::Pending, Some("etl-onexit"))
        );
        assert!(first.actions.contains(&Action::CreateExitHandler));
        assert!(
            !first.actions.contains(&Action::DeleteTask),
            "the TTL waits for the handler"
        );

        let running = look(&first.status, Some(TaskPhase::Running));
        assert_eq!(
            running.status.on_exit.as_ref().map(|n| n.phase),
            Some(DagNodePhase::Running)
        );
        assert!(
            !running.actions.contains(&Action::CreateExitHandler),
            "created once"
        );
        assert!(!running.actions.contains(&Action::DeleteTask));

        let dead = look(&running.status, Some(TaskPhase::Dead));
        assert_eq!(
            dead.status.phase,
            Some(TaskPhase::Succeeded),
            "the task's phase stands"
        );
        assert!(dead.actions.iter().any(|a| matches!(
            a,
            Action::Warn {
                reason: Reason::OnExitFailed,
                ..
            }
        )));
        assert!(
            dead.actions.contains(&Action::DeleteTask),
            "its end is recorded: the TTL runs"
        );

        // The handler gone with a recorded end: nothing more, never created again.
        let after = look(&dead.status, None);
        assert!(!after.actions.contains(&Action::CreateExitHandler));
        assert!(
            !after
                .actions
                .iter()
                .any(|a| matches!(a, Action::Warn { .. }))
        );
    }

    #[test]
    fn the_handler_gets_the_tasks_summary_in_its_payload_and_env() {
        let handler: ExitHandlerSpec = serde_json::from_value(serde_json::json!({
            "type": "notify", "payload": {"channel": "ops"},
            "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}},
        }))
        .expect("a handler");
        let status = AxTaskStatus {
            phase: Some(TaskPhase::Dead),
            reason: Some("RetriesExhausted".into()),
            attempt: 3,
            ..AxTaskStatus::default()
        };
        let spec = handler_spec(&handler, "etl", &status);
        assert_eq!(spec.task_type, "notify");
        assert!(spec.preemptible, "serde's default");
        assert_eq!(spec.queue, "default");
        assert_eq!(
            spec.payload,
            Some(serde_json::json!({"channel": "ops", "task": {
                "name": "etl", "phase": "Dead", "reason": "RetriesExhausted", "attempt": 3}}))
        );
        let env = spec.template.containers()[0]
            .env
            .clone()
            .unwrap_or_default();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["AX_PARENT_TASK", "AX_PARENT_PHASE"]);
        assert_eq!(env[1].value.as_deref(), Some("Dead"));
        assert_eq!(handler_name("etl"), "etl-onexit");
    }
}
