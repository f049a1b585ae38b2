//! What the benchmark creates: one pod template for the simulated nodes, wrapped as a bare Pod, a
//! `batch/v1` Job or an AxTask, or copied from a worker pod the operator built; and how to read
//! back from each object which unit it belongs to and whether it has finished. Pure JSON in, JSON
//! out.
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

/// Type and priority of the `ax` kind's tasks (and of the one `worker-pods` copies its pod from).
pub const AX_TASK_TYPE: &str = "bench";
pub const AX_PRIORITY: &str = "Normal";

/// One way of running a unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A bare Pod: the floor, nothing but the API server, the scheduler and the node.
    Pods,
    /// One `batch/v1` Job per unit (backoffLimit 0), run by kube-controller-manager.
    Jobs,
    /// One AxTask per unit, in a queue of its own that is never the limit.
    Ax,
    /// The same, in a queue with fair shares between keys from a label (`fairness.key`), the
    /// units spread over `--keys` keys: what many tenants cost the dispatch.
    AxKeys,
    /// A bare Pod shaped like the operator's worker pod (labels, payload annotation and volume,
    /// env, a controller owner reference), copied from one it built: the worker contract's floor.
    WorkerPods,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::Jobs => "jobs",
            Kind::Ax => "ax",
            Kind::AxKeys => "ax-keys",
            Kind::WorkerPods => "worker-pods",
        }
    }

    /// Whether the benchmark creates the unit's pod itself, so the pod is the unit.
    pub fn is_bare_pod(self) -> bool {
        matches!(self, Kind::Pods | Kind::WorkerPods)
    }

    /// Whether the kind needs an AxQueue of its own: `ax` for its tasks, `worker-pods` for the
    /// one task whose pod it copies.
    pub fn needs_queue(self) -> bool {
        matches!(self, Kind::Ax | Kind::AxKeys | Kind::WorkerPods)
    }

    /// The resource the benchmark creates for this kind.
    pub fn resource(self) -> ApiResource {
        match self {
            Kind::Pods | Kind::WorkerPods => pod_resource(),
            Kind::Jobs => ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("batch", "v1", "Job"),
                "jobs",
            ),
            Kind::Ax | Kind::AxKeys => axtask_resource(),
        }
    }

    /// The object for unit `name`, made from the run's `worker`; `None` for `worker-pods`, whose
    /// pods are copies of one the operator built ([`WorkerPodTemplate::pod`]).
    pub fn object(self, name: &str, worker: &SimWorker, queue: &str) -> Option<Value> {
        let metadata = json!({"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}});
        Some(match self {
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
            Kind::Ax | Kind::AxKeys => axtask(name, AX_TASK_TYPE, AX_PRIORITY, queue, worker),
            Kind::WorkerPods => return None,
        })
    }

    /// The unit a pod belongs to: its own name for a bare pod, else the name of its controlling
    /// owner of this kind (the Job or the AxTask).
    pub fn unit_of_pod(self, pod: &Value) -> Option<String> {
        let metadata = &pod["metadata"];
        let owner_kind = match self {
            Kind::Pods | Kind::WorkerPods => return metadata["name"].as_str().map(str::to_owned),
            Kind::Jobs => "Job",
            Kind::Ax | Kind::AxKeys => "AxTask",
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
            Kind::Pods | Kind::WorkerPods => match status["phase"].as_str()? {
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
            Kind::Ax | Kind::AxKeys => match status["phase"].as_str()? {
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

/// The label that gives an `ax-keys` unit its key.
pub const KEY_LABEL: &str = "ax.dev/bench-key";

/// The same queue sharing its dispatches fairly between the keys of [`KEY_LABEL`].
pub fn axqueue_keyed(name: &str, concurrency: u32) -> Value {
    let mut queue = axqueue(name, concurrency);
    queue["spec"]["fairness"] = json!({"key": {"label": KEY_LABEL}});
    queue
}

/// Gives unit number `index` of an `ax-keys` run its key, one of `keys`.
pub fn set_key(object: &mut Value, index: usize, keys: usize) {
    object["metadata"]["labels"][KEY_LABEL] = format!("k-{}", index % keys.max(1)).into();
}

/// The AxTask whose worker pod `worker-pods` copies: what the pod says about it (its name,
/// namespace and uid) is replaced on every copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleTask {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// The worker pod's label and env var for its attempt: every copy runs attempt 1.
const ATTEMPT_LABEL: &str = "ax.dev/attempt";
const ATTEMPT_ENV: &str = "AX_ATTEMPT";

/// Metadata the API server sets, or that belongs to the sample alone. `finalizers`: the operator
/// puts one on a worker pod it stops, and on a bare pod nothing would take it off (the namespace's
/// deletion would hang). `ownerReferences`: every copy gets its own (see [`config_map_owner`]).
const SAMPLE_ONLY_METADATA: [&str; 11] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "generateName",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "finalizers",
    "ownerReferences",
];

/// A worker pod the operator built, as a template for bare pods of the same shape: what the
/// cluster filled in or that was the sample's alone is taken out, the rest kept as it was stored
/// (the API server's defaults included, which it would fill in anyway).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerPodTemplate {
    pod: Value,
    sample: SampleTask,
    owner: Value,
}

impl WorkerPodTemplate {
    /// From `sample`, the worker pod of `task` as read from the API server; every copy is owned
    /// by `owner` (an owner reference).
    pub fn from_sample(sample: &Value, task: SampleTask, owner: Value) -> WorkerPodTemplate {
        let mut pod = sample.clone();
        if let Some(object) = pod.as_object_mut() {
            object.remove("status");
        }
        if let Some(metadata) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in SAMPLE_ONLY_METADATA {
                metadata.remove(field);
            }
        }
        if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
            // The scheduler binds each copy itself, as it did the sample.
            spec.remove("nodeName");
        }
        WorkerPodTemplate {
            pod,
            sample: task,
            owner,
        }
    }

    /// The pod of unit `name` in `namespace`: every label, annotation and env value that is the
    /// sample task's name, namespace or uid becomes the unit's name, `namespace` or `task_uid`
    /// (in place of the uid of a task the unit does not have: a fresh one per unit, as each task
    /// has its own), the attempt is 1, and the pod carries the bench label and the template's
    /// owner reference.
    pub fn pod(&self, name: &str, namespace: &str, task_uid: &str) -> Value {
        let substitute = |value: &mut Value| {
            let Some(text) = value.as_str() else { return };
            let unit_value = if text == self.sample.name {
                name
            } else if text == self.sample.namespace {
                namespace
            } else if text == self.sample.uid {
                task_uid
            } else {
                return;
            };
            *value = Value::from(unit_value);
        };
        let mut pod = self.pod.clone();
        let metadata = &mut pod["metadata"];
        metadata["name"] = name.into();
        metadata["namespace"] = namespace.into();
        metadata["ownerReferences"] = json!([self.owner]);
        for map in ["labels", "annotations"] {
            if let Some(entries) = metadata.get_mut(map).and_then(Value::as_object_mut) {
                entries.values_mut().for_each(&substitute);
            }
        }
        metadata["labels"][ATTEMPT_LABEL] = "1".into();
        // The sample has it from the AxTask's template; set anyway: it marks what the bench made.
        metadata["labels"][BENCH_LABEL] = BENCH_LABEL_VALUE.into();
        for list in ["initContainers", "containers"] {
            let containers = pod
                .pointer_mut(&format!("/spec/{list}"))
                .and_then(Value::as_array_mut);
            for container in containers.into_iter().flatten() {
                let env = container.get_mut("env").and_then(Value::as_array_mut);
                for var in env.into_iter().flatten() {
                    let is_attempt = var["name"] == ATTEMPT_ENV;
                    if let Some(value) = var.get_mut("value") {
                        if is_attempt {
                            *value = "1".into();
                        } else {
                            substitute(value);
                        }
                    }
                }
            }
        }
        pod
    }
}

/// A controller owner reference to the ConfigMap `name` (uid `uid`), for the `worker-pods` copies.
/// The worker contract puts a controller owner reference (to the AxTask) on every worker pod,
/// which the garbage collector tracks, so the floor keeps one. A ConfigMap, since these pods have
/// no AxTask; one for all of them, since the cost in question is the reference each pod carries.
/// `blockOwnerDeletion` as the operator sets it: the API server then checks that the creator may
/// set finalizers on the owner (the bench runs as cluster admin).
pub fn config_map_owner(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// A random string shaped like a Kubernetes uid (a version 4 UUID), for a `worker-pods` copy's
/// idempotency key.
pub fn random_uid() -> String {
    let bits: u128 = rand::random();
    // Version 4 in bits 76–79, variant 0b10 in bits 62–63, as uuid.NewRandom() sets them.
    let bits = (bits & !(0xf << 76)) | (0x4 << 76);
    let bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
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
    fn ax_keys_units_spread_over_the_keys_of_a_fair_queue() {
        let mut task = Kind::AxKeys.object("u-1", &WORKER, "q").unwrap();
        assert_eq!(task, Kind::Ax.object("u-1", &WORKER, "q").unwrap());
        set_key(&mut task, 10_007, 10_000);
        assert_eq!(task["metadata"]["labels"][KEY_LABEL], "k-7");
        assert_eq!(task["metadata"]["labels"][BENCH_LABEL], BENCH_LABEL_VALUE);
        let queue = axqueue_keyed("q", 1000);
        assert_eq!(queue["spec"]["fairness"]["key"]["label"], KEY_LABEL);
        assert_eq!(queue["spec"]["concurrency"], 1000);
        assert!(Kind::AxKeys.needs_queue());
        assert_eq!(Kind::AxKeys.as_str(), "ax-keys");
    }

    #[test]
    fn every_kind_runs_the_same_pod_spec() {
        let pod = Kind::Pods.object("u-1", &WORKER, "q").unwrap();
        let job = Kind::Jobs.object("u-1", &WORKER, "q").unwrap();
        let task = Kind::Ax.object("u-1", &WORKER, "q").unwrap();
        assert_eq!(pod["spec"], WORKER.pod_spec());
        assert_eq!(job["spec"]["template"]["spec"], WORKER.pod_spec());
        assert_eq!(job["spec"]["backoffLimit"], 0);
        assert_eq!(task["spec"]["template"]["spec"], WORKER.pod_spec());
        assert_eq!(task["spec"]["queue"], "q");
        assert_eq!(Kind::WorkerPods.object("u-1", &WORKER, "q"), None);
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
        assert_eq!(
            Kind::WorkerPods.unit_of_pod(&owned("ConfigMap")).as_deref(),
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
        for phase in ["Pending", "Running", "Succeeded", "Failed"] {
            let pod = json!({"status": {"phase": phase}});
            assert_eq!(Kind::WorkerPods.finished(&pod), Kind::Pods.finished(&pod));
        }
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

    #[test]
    fn kind_names_read_as_written_on_the_command_line() {
        use clap::ValueEnum;
        for kind in Kind::value_variants() {
            let name = kind.to_possible_value().unwrap().get_name().to_owned();
            assert_eq!(name, kind.as_str());
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert_eq!(Kind::from_str("worker-pods", false), Ok(Kind::WorkerPods));
        assert!(Kind::WorkerPods.is_bare_pod() && Kind::WorkerPods.needs_queue());
        assert_eq!(Kind::WorkerPods.resource().plural, "pods");
    }

    /// A worker pod as the API server returns it: built by the operator for AxTask
    /// `ax-bench-sample` (attempt 1), bound, run, with the outcome finalizer the operator puts on
    /// a pod it stops.
    const SAMPLE_POD: &str = r#"{
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "ax-bench-sample-1",
            "namespace": "ax-bench-worker-pods-1a2b",
            "uid": "0b7f4c1e-aaaa-4bbb-8ccc-111111111111",
            "resourceVersion": "48213",
            "generation": 1,
            "creationTimestamp": "2026-12-02T14:00:00Z",
            "deletionTimestamp": "2026-12-02T14:00:05Z",
            "deletionGracePeriodSeconds": 30,
            "finalizers": ["ax.dev/worker-outcome"],
            "labels": {
                "app.kubernetes.io/component": "worker",
                "app.kubernetes.io/managed-by": "ax-operator",
                "app.kubernetes.io/part-of": "ax-bench",
                "ax.dev/attempt": "1",
                "ax.dev/task": "ax-bench-sample",
                "ax.dev/type": "bench"
            },
            "annotations": {"ax.dev/payload": "{}"},
            "ownerReferences": [{
                "apiVersion": "ax.dev/v1alpha1",
                "kind": "AxTask",
                "name": "ax-bench-sample",
                "uid": "5d2e9a70-1234-4abc-9def-222222222222",
                "controller": true,
                "blockOwnerDeletion": true
            }],
            "managedFields": [{"manager": "ax-operator", "operation": "Update"}]
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "nodeSelector": {"ax.dev/sim-node": "true"},
            "tolerations": [
                {"key": "ax.dev/sim-node", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "nodeName": "sim-node-0",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "volumes": [{
                "name": "ax-payload",
                "downwardAPI": {
                    "defaultMode": 420,
                    "items": [{
                        "path": "payload.json",
                        "fieldRef": {
                            "apiVersion": "v1",
                            "fieldPath": "metadata.annotations['ax.dev/payload']"
                        }
                    }]
                }
            }],
            "containers": [{
                "name": "worker",
                "image": "localhost/ax-busybox:1",
                "imagePullPolicy": "Never",
                "env": [
                    {"name": "AX_TASK", "value": "ax-bench-sample"},
                    {"name": "AX_NAMESPACE", "value": "ax-bench-worker-pods-1a2b"},
                    {"name": "AX_ATTEMPT", "value": "1"},
                    {"name": "AX_TYPE", "value": "bench"},
                    {"name": "AX_IDEMPOTENCY_KEY", "value": "5d2e9a70-1234-4abc-9def-222222222222"},
                    {"name": "AX_PAYLOAD_FILE", "value": "/var/run/ax/payload.json"},
                    {"name": "AX_PAYLOAD", "value": "{}"},
                    {"name": "AX_SIM_START_MS", "value": "20"},
                    {"name": "AX_SIM_DURATION_MS", "value": "100"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "volumeMounts": [
                    {"name": "ax-payload", "mountPath": "/var/run/ax", "readOnly": true}
                ]
            }]
        },
        "status": {"phase": "Succeeded", "hostIP": "10.0.0.1"}
    }"#;

    fn sample_task() -> SampleTask {
        SampleTask {
            name: "ax-bench-sample".into(),
            namespace: "ax-bench-worker-pods-1a2b".into(),
            uid: "5d2e9a70-1234-4abc-9def-222222222222".into(),
        }
    }

    fn sample_template() -> WorkerPodTemplate {
        let sample: Value = serde_json::from_str(SAMPLE_POD).unwrap();
        WorkerPodTemplate::from_sample(
            &sample,
            sample_task(),
            config_map_owner("worker-pods-owner", "c0ffee00-0000-4000-8000-000000000000"),
        )
    }

    fn env_value<'a>(pod: &'a Value, name: &str) -> &'a Value {
        pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| &v["value"])
            .unwrap()
    }

    #[test]
    fn a_worker_pod_copy_leaves_out_what_the_cluster_filled_in() {
        let pod = sample_template().pod("u-00001", "ns-2", "unit-uid");
        assert_eq!(pod.get("status"), None);
        let metadata = pod["metadata"].as_object().unwrap();
        for field in SAMPLE_ONLY_METADATA
            .iter()
            .filter(|f| **f != "ownerReferences")
        {
            assert!(!metadata.contains_key(*field), "{field}");
        }
        assert_eq!(pod["spec"].get("nodeName"), None);
        // The rest of the spec is the operator's pod as stored, defaults included.
        let mut spec = serde_json::from_str::<Value>(SAMPLE_POD).unwrap()["spec"].clone();
        spec.as_object_mut().unwrap().remove("nodeName");
        let mounts = |spec: &Value| spec["containers"][0]["volumeMounts"].clone();
        assert_eq!(mounts(&pod["spec"]), mounts(&spec));
        assert_eq!(pod["spec"]["volumes"], spec["volumes"]);
        assert_eq!(pod["spec"]["schedulerName"], "default-scheduler");
        assert_eq!(pod["apiVersion"], "v1");
        assert_eq!(pod["kind"], "Pod");
    }

    #[test]
    fn a_worker_pod_copy_is_the_units_at_attempt_1_owned_by_the_config_map() {
        let pod = sample_template().pod("u-00001", "ns-2", "unit-uid");
        let metadata = &pod["metadata"];
        assert_eq!(metadata["name"], "u-00001");
        assert_eq!(metadata["namespace"], "ns-2");
        assert_eq!(
            metadata["labels"],
            json!({
                "app.kubernetes.io/component": "worker",
                "app.kubernetes.io/managed-by": "ax-operator",
                BENCH_LABEL: BENCH_LABEL_VALUE,
                "ax.dev/attempt": "1",
                "ax.dev/task": "u-00001",
                "ax.dev/type": "bench",
            })
        );
        assert_eq!(metadata["annotations"], json!({"ax.dev/payload": "{}"}));
        assert_eq!(
            metadata["ownerReferences"],
            json!([{
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "worker-pods-owner",
                "uid": "c0ffee00-0000-4000-8000-000000000000",
                "controller": true,
                "blockOwnerDeletion": true,
            }])
        );
        assert_eq!(env_value(&pod, "AX_TASK"), "u-00001");
        assert_eq!(env_value(&pod, "AX_NAMESPACE"), "ns-2");
        assert_eq!(env_value(&pod, "AX_ATTEMPT"), "1");
        assert_eq!(env_value(&pod, "AX_TYPE"), "bench");
        assert_eq!(env_value(&pod, "AX_IDEMPOTENCY_KEY"), "unit-uid");
        assert_eq!(
            env_value(&pod, "AX_PAYLOAD_FILE"),
            "/var/run/ax/payload.json"
        );
        assert_eq!(env_value(&pod, "AX_SIM_DURATION_MS"), "100");
        // An env var read from elsewhere stays as it is, with no value added.
        let by_field = &pod["spec"]["containers"][0]["env"][9];
        assert_eq!(by_field["name"], "POD_NAME");
        assert_eq!(by_field.get("value"), None);
        assert_eq!(pod["spec"].get("initContainers"), None);
        // Nothing of the sample task is left anywhere in the copy.
        let text = pod.to_string();
        assert!(!text.contains("ax-bench-sample"), "{text}");
        assert!(!text.contains("5d2e9a70"), "{text}");
        assert!(!text.contains("ax-bench-worker-pods-1a2b"), "{text}");
        assert_eq!(
            Kind::WorkerPods.unit_of_pod(&pod).as_deref(),
            Some("u-00001")
        );
        // What the bench sends: a Pod to the API server's types, and a DynamicObject.
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(pod.clone()).unwrap();
        serde_json::from_value::<kube::core::DynamicObject>(pod).unwrap();
    }

    #[test]
    fn the_attempt_of_a_copy_is_1_whatever_the_samples_was() {
        let mut sample: Value = serde_json::from_str(SAMPLE_POD).unwrap();
        sample["metadata"]["labels"]["ax.dev/attempt"] = "2".into();
        sample["spec"]["containers"][0]["env"][2]["value"] = "2".into();
        let template = WorkerPodTemplate::from_sample(&sample, sample_task(), json!({}));
        let pod = template.pod("u-00002", "ns", "uid");
        assert_eq!(pod["metadata"]["labels"]["ax.dev/attempt"], "1");
        assert_eq!(env_value(&pod, "AX_ATTEMPT"), "1");
    }

    #[test]
    fn random_uids_are_shaped_like_kubernetes_uids() {
        let a = random_uid();
        let b = random_uid();
        assert_ne!(a, b);
        let groups: Vec<&str> = a.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(
            a.chars()
                .all(|c| c == '-' || (c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
        );
        assert!(groups[2].starts_with('4'), "{a}");
        assert!(groups[3].starts_with(['8', '9', 'a', 'b']), "{a}");
    }
}
