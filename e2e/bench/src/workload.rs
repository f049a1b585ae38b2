//! What the benchmark creates: one pod template for the simulated nodes, wrapped as a bare Pod, a
//! `batch/v1` Job or an AxTask, and how to read back from each object which unit it belongs to and
//! whether it has finished. Pure JSON in, JSON out.
//!
//! The template reproduces the shape of `ax_sim::worker::SimWorker::pod_spec` (node selector,
//! toleration, env read by the simulator) without depending on either crate.

use kube::core::{ApiResource, GroupVersionKind};
use serde::Serialize;
use serde_json::{Value, json};

/// Label and taint key of the simulated nodes (value `"true"`).
pub const SIM_NODE_KEY: &str = "ax.dev/sim-node";
/// Never pulled nor run on a simulated node, but the API server wants an image.
pub const SIM_IMAGE: &str = "localhost/ax-busybox:1";
/// Label on every object the benchmark creates.
pub const BENCH_LABEL: &str = "app.kubernetes.io/part-of";
pub const BENCH_LABEL_VALUE: &str = "ax-bench";

/// One way of running a unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A bare Pod: the floor, nothing but the API server, the scheduler and the node.
    Pods,
    /// One `batch/v1` Job per unit (backoffLimit 0), run by kube-controller-manager.
    Jobs,
    /// One AxTask per unit, in a queue of its own that is never the limit.
    Ax,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::Jobs => "jobs",
            Kind::Ax => "ax",
        }
    }

    /// The resource the benchmark creates for this kind.
    pub fn resource(self) -> ApiResource {
        match self {
            Kind::Pods => pod_resource(),
            Kind::Jobs => ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("batch", "v1", "Job"),
                "jobs",
            ),
            Kind::Ax => axtask_resource(),
        }
    }

    /// The object for unit `name`.
    pub fn object(self, name: &str, worker: &SimWorker, queue: &str) -> Value {
        let metadata = json!({"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}});
        match self {
            Kind::Pods => json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": worker.pod_spec(),
            }),
            Kind::Jobs => json!({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": metadata,
                "spec": {"backoffLimit": 0, "template": worker.pod_template()},
            }),
            Kind::Ax => axtask(name, "bench", "Normal", queue, worker),
        }
    }

    /// The unit a pod belongs to: its own name for a bare pod, else the name of its controlling
    /// owner of this kind (the Job or the AxTask).
    pub fn unit_of_pod(self, pod: &Value) -> Option<String> {
        let metadata = &pod["metadata"];
        let owner_kind = match self {
            Kind::Pods => return metadata["name"].as_str().map(str::to_owned),
            Kind::Jobs => "Job",
            Kind::Ax => "AxTask",
        };
        metadata["ownerReferences"]
            .as_array()?
            .iter()
            .find(|o| o["kind"] == owner_kind && o["controller"] != false)
            .and_then(|o| o["name"].as_str())
            .map(str::to_owned)
    }

    /// Whether the unit's own object (the Pod, Job or AxTask) has finished: `Some(true)` when it
    /// succeeded, `Some(false)` when it ended otherwise, `None` while it runs.
    pub fn finished(self, object: &Value) -> Option<bool> {
        let status = &object["status"];
        match self {
            Kind::Pods => match status["phase"].as_str()? {
                "Succeeded" => Some(true),
                "Failed" => Some(false),
                _ => None,
            },
            Kind::Jobs => {
                let conditions = status["conditions"].as_array()?;
                let holds = |t: &str| {
                    conditions
                        .iter()
                        .any(|c| c["type"] == t && c["status"] == "True")
                };
                if holds("Complete") {
                    Some(true)
                } else if holds("Failed") {
                    Some(false)
                } else {
                    None
                }
            }
            Kind::Ax => match status["phase"].as_str()? {
                "Succeeded" => Some(true),
                "Dead" | "Canceled" => Some(false),
                _ => None,
            },
        }
    }
}

pub fn pod_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

pub fn axtask_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ax.dev", "v1alpha1", "AxTask"),
        "axtasks",
    )
}

pub fn axqueue_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ax.dev", "v1alpha1", "AxQueue"),
        "axqueues",
    )
}

/// An AxTask running `worker` in `queue`.
pub fn axtask(
    name: &str,
    task_type: &str,
    priority: &str,
    queue: &str,
    worker: &SimWorker,
) -> Value {
    json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {
            "type": task_type,
            "priority": priority,
            "queue": queue,
            "template": worker.pod_template(),
        },
    })
}

/// A cluster-scoped AxQueue admitting `concurrency` tasks at once (0 holds every task).
pub fn axqueue(name: &str, concurrency: u32) -> Value {
    json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxQueue",
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {"concurrency": concurrency},
    })
}

/// What the simulated node does with the pod: bound, it starts after `start_ms` and succeeds
/// `work_ms` later (env `AX_SIM_START_MS`, `AX_SIM_DURATION_MS`, read by e2e/sim).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SimWorker {
    pub start_ms: u64,
    pub work_ms: u64,
}

impl SimWorker {
    /// The pod spec: lands only on a simulated node, never restarts (a Job's and an AxTask's
    /// worker must not), mounts no ServiceAccount token (ax sets that on its workers anyway): the
    /// bare pod and the Job's pod get the same spec, so all three kinds run the same pod.
    pub fn pod_spec(&self) -> Value {
        json!({
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "nodeSelector": {SIM_NODE_KEY: "true"},
            "tolerations": [{"key": SIM_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "worker",
                "image": SIM_IMAGE,
                "imagePullPolicy": "Never",
                "env": [
                    {"name": "AX_SIM_START_MS", "value": self.start_ms.to_string()},
                    {"name": "AX_SIM_DURATION_MS", "value": self.work_ms.to_string()},
                ],
            }],
        })
    }

    /// A PodTemplateSpec of [`Self::pod_spec`], for a Job or an AxTask.
    pub fn pod_template(&self) -> Value {
        json!({
            "metadata": {"labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
            "spec": self.pod_spec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKER: SimWorker = SimWorker {
        start_ms: 20,
        work_ms: 100,
    };

    #[test]
    fn every_kind_runs_the_same_pod_spec() {
        let pod = Kind::Pods.object("u-1", &WORKER, "q");
        let job = Kind::Jobs.object("u-1", &WORKER, "q");
        let task = Kind::Ax.object("u-1", &WORKER, "q");
        assert_eq!(pod["spec"], WORKER.pod_spec());
        assert_eq!(job["spec"]["template"]["spec"], WORKER.pod_spec());
        assert_eq!(job["spec"]["backoffLimit"], 0);
        assert_eq!(task["spec"]["template"]["spec"], WORKER.pod_spec());
        assert_eq!(task["spec"]["queue"], "q");
    }

    #[test]
    fn the_pod_selects_and_tolerates_the_sim_nodes_with_the_sims_env() {
        let spec = WORKER.pod_spec();
        assert_eq!(spec["nodeSelector"][SIM_NODE_KEY], "true");
        assert_eq!(spec["tolerations"][0]["key"], SIM_NODE_KEY);
        assert_eq!(spec["tolerations"][0]["effect"], "NoSchedule");
        let env = &spec["containers"][0]["env"];
        assert_eq!(env[0], json!({"name": "AX_SIM_START_MS", "value": "20"}));
        assert_eq!(
            env[1],
            json!({"name": "AX_SIM_DURATION_MS", "value": "100"})
        );
    }

    #[test]
    fn a_pod_belongs_to_its_controlling_owner_of_the_kind() {
        let owned = |kind: &str| {
            json!({"metadata": {"name": "u-1-abcde", "ownerReferences": [
                {"kind": "Other", "name": "x", "controller": false},
                {"kind": kind, "name": "u-1", "controller": true},
            ]}})
        };
        assert_eq!(
            Kind::Jobs.unit_of_pod(&owned("Job")).as_deref(),
            Some("u-1")
        );
        assert_eq!(
            Kind::Ax.unit_of_pod(&owned("AxTask")).as_deref(),
            Some("u-1")
        );
        assert_eq!(Kind::Ax.unit_of_pod(&owned("Job")), None);
        assert_eq!(
            Kind::Pods.unit_of_pod(&owned("Job")).as_deref(),
            Some("u-1-abcde")
        );
    }

    #[test]
    fn finished_reads_each_kinds_status() {
        assert_eq!(
            Kind::Pods.finished(&json!({"status": {"phase": "Running"}})),
            None
        );
        assert_eq!(
            Kind::Pods.finished(&json!({"status": {"phase": "Succeeded"}})),
            Some(true)
        );
        assert_eq!(
            Kind::Pods.finished(&json!({"status": {"phase": "Failed"}})),
            Some(false)
        );
        assert_eq!(Kind::Pods.finished(&json!({})), None);
        let job = |t: &str, s: &str| json!({"status": {"conditions": [{"type": t, "status": s}]}});
        assert_eq!(Kind::Jobs.finished(&job("Complete", "True")), Some(true));
        assert_eq!(Kind::Jobs.finished(&job("Failed", "True")), Some(false));
        assert_eq!(Kind::Jobs.finished(&job("Complete", "False")), None);
        assert_eq!(Kind::Jobs.finished(&json!({"status": {}})), None);
        for (phase, done) in [
            ("Pending", None),
            ("Scheduled", None),
            ("Running", None),
            ("Failed", None),
            ("TimedOut", None),
            ("Succeeded", Some(true)),
            ("Dead", Some(false)),
            ("Canceled", Some(false)),
        ] {
            assert_eq!(
                Kind::Ax.finished(&json!({"status": {"phase": phase}})),
                done,
                "{phase}"
            );
        }
    }
}
