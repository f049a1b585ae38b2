//! Tasks whose workers run on the simulated nodes (e2e/sim): fast enough for hundreds of tasks.
//! The pod itself comes from ax-sim's own builder, [`SimWorker`], which the simulator's parser is
//! tested against.

use ax::api::AxTask;
pub use ax_sim::worker::SimWorker;

/// An AxTask spec (as JSON) of `task_type` whose worker does what `worker` says.
pub fn sim_task_spec(task_type: &str, worker: &SimWorker) -> serde_json::Value {
    serde_json::json!({
        "type": task_type,
        "template": {"spec": worker.pod_spec()},
    })
}

/// An AxTask named `name` whose worker does what `worker` says; `edit` adjusts its JSON.
pub fn sim_task_with(
    name: &str,
    task_type: &str,
    worker: &SimWorker,
    edit: impl FnOnce(&mut serde_json::Value),
) -> AxTask {
    let mut value = serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name},
        "spec": sim_task_spec(task_type, worker),
    });
    edit(&mut value);
    serde_json::from_value(value).expect("a valid AxTask")
}

/// A task of `millis` on a simulated node, started 200 ms after it is bound; an `exit_code` other
/// than 0 makes its worker fail.
pub fn sim_task(name: &str, task_type: &str, millis: u64, exit_code: i32) -> AxTask {
    let worker = SimWorker::running_for(millis)
        .start_ms(200)
        .exit_code(exit_code);
    sim_task_with(name, task_type, &worker, |_| {})
}
