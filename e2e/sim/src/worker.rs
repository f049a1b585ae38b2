//! Building a pod for a simulated node: the node selector, the toleration and the env that
//! [`PodScript::from_pod`](crate::script::PodScript::from_pod) reads. The one builder every test of
//! ax and of ax-sim uses, so the contract lives in one place.

use serde_json::{Value, json};

use crate::script::{
    DURATION_MS_ENV, EXIT_CODE_ENV, FAILING_ITEMS_ENV, HANG_ENV, IGNORE_SIGTERM_ENV, MESSAGE_ENV,
    START_MS_ENV,
};

/// Label of the simulated nodes (value `"true"`); a pod lands there only if it selects it.
pub const SIM_NODE_LABEL: &str = "ax.dev/sim-node";
/// Key of the NoSchedule taint of the simulated nodes (value `"true"`).
pub const SIM_NODE_TAINT_KEY: &str = "ax.dev/sim-node";
/// The image of a simulated worker: never run, but the API server wants one.
pub const SIM_IMAGE: &str = "localhost/ax-busybox:1";

/// What a simulated worker does. Unset values are left out of the env, so the simulator's defaults
/// apply (start after 50 ms, run 100 ms, exit 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimWorker {
    start_ms: Option<u64>,
    duration_ms: Option<u64>,
    exit_code: Option<i32>,
    message: Option<String>,
    hang: bool,
    ignores_sigterm: bool,
    failing_items: Option<Vec<u32>>,
}

impl SimWorker {
    /// A worker that runs for `duration_ms` and exits 0.
    pub fn running_for(duration_ms: u64) -> Self {
        SimWorker::default().duration_ms(duration_ms)
    }

    /// Delay between the pod being bound and it running.
    pub fn start_ms(mut self, ms: u64) -> Self {
        self.start_ms = Some(ms);
        self
    }

    pub fn duration_ms(mut self, ms: u64) -> Self {
        self.duration_ms = Some(ms);
        self
    }

    pub fn exit_code(mut self, code: i32) -> Self {
        self.exit_code = Some(code);
        self
    }

    /// The termination message the container leaves.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Runs until deleted.
    pub fn hang(mut self) -> Self {
        self.hang = true;
        self
    }

    /// Keeps running through its whole deletion grace period, like a worker that ignores SIGTERM.
    pub fn ignoring_sigterm(mut self) -> Self {
        self.ignores_sigterm = true;
        self
    }

    /// As an AxDag `forEach` child: only these items exit with the exit code, the others exit 0.
    pub fn failing_items(mut self, items: &[u32]) -> Self {
        self.failing_items = Some(items.to_vec());
        self
    }

    /// The env of the first container (a list of EnvVar).
    pub fn env(&self) -> Value {
        let mut env = Vec::new();
        let mut var = |name: &str, value: String| env.push(json!({"name": name, "value": value}));
        if let Some(ms) = self.start_ms {
            var(START_MS_ENV, ms.to_string());
        }
        if let Some(ms) = self.duration_ms {
            var(DURATION_MS_ENV, ms.to_string());
        }
        if let Some(code) = self.exit_code {
            var(EXIT_CODE_ENV, code.to_string());
        }
        if let Some(message) = &self.message {
            var(MESSAGE_ENV, message.clone());
        }
        if self.hang {
            var(HANG_ENV, "true".into());
        }
        if self.ignores_sigterm {
            var(IGNORE_SIGTERM_ENV, "true".into());
        }
        if let Some(items) = &self.failing_items {
            let list: Vec<String> = items.iter().map(u32::to_string).collect();
            var(FAILING_ITEMS_ENV, list.join(","));
        }
        Value::Array(env)
    }

    /// A PodSpec (as JSON) that lands on a simulated node and runs this script in container
    /// `worker`. Callers add what their object needs (restartPolicy, command, …).
    pub fn pod_spec(&self) -> Value {
        json!({
            "nodeSelector": {SIM_NODE_LABEL: "true"},
            "tolerations": [{"key": SIM_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "worker",
                "image": SIM_IMAGE,
                "imagePullPolicy": "Never",
                "env": self.env(),
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::{PodScript, RunLength};
    use k8s_openapi::api::core::v1::Pod;
    use std::time::Duration;

    fn script_of(worker: &SimWorker) -> crate::script::ParsedScript {
        let mut spec = worker.pod_spec();
        spec["restartPolicy"] = "Never".into();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("a valid pod");
        PodScript::from_pod(&pod)
    }

    #[test]
    fn the_simulator_reads_what_the_builder_writes() {
        let worker = SimWorker::running_for(300)
            .start_ms(7)
            .exit_code(42)
            .message("{\"error\":\"biz\"}");
        let parsed = script_of(&worker);
        assert!(parsed.ignored.is_empty(), "{:?}", parsed.ignored);
        assert_eq!(
            parsed.script,
            PodScript {
                start_delay: Duration::from_millis(7),
                run: RunLength::For(Duration::from_millis(300)),
                exit_code: 42,
                message: "{\"error\":\"biz\"}".into(),
                ignores_sigterm: false,
            }
        );
        assert_eq!(
            script_of(&SimWorker::default().hang()).script.run,
            RunLength::Forever
        );
    }

    #[test]
    fn unset_values_keep_the_simulator_defaults() {
        assert_eq!(SimWorker::default().env(), json!([]));
        let parsed = script_of(&SimWorker::default());
        assert_eq!(
            parsed.script.run,
            RunLength::For(Duration::from_millis(100))
        );
        assert_eq!(parsed.script.exit_code, 0);
    }

    #[test]
    fn the_pod_selects_and_tolerates_the_sim_nodes() {
        let spec = SimWorker::default().pod_spec();
        assert_eq!(spec["nodeSelector"][SIM_NODE_LABEL], "true");
        assert_eq!(spec["tolerations"][0]["key"], SIM_NODE_TAINT_KEY);
        assert_eq!(spec["tolerations"][0]["effect"], "NoSchedule");
    }
}
