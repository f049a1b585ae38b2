//! Worker pods: their deterministic names, how they are built from a task, and what a pod says
//! about the attempt it runs. Pure: no client, plain Kubernetes data in and out.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, ObjectFieldSelector, Pod,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use sha2::{Digest, Sha256};

use crate::api::AxTask;
use crate::core::{hex, output, trace};

pub const LABEL_TASK: &str = "ax.dev/task";
pub const LABEL_ATTEMPT: &str = "ax.dev/attempt";
pub const LABEL_TYPE: &str = "ax.dev/type";
pub const PAYLOAD_ANNOTATION: &str = "ax.dev/payload";
pub const PAYLOAD_DIR: &str = "/var/run/ax";
pub const PAYLOAD_FILE: &str = "payload.json";
/// Pod template annotation naming the main container (default: the first).
pub const MAIN_CONTAINER_ANNOTATION: &str = "ax.dev/main-container";
/// On every worker pod from its creation, taken off once the pod is being deleted and its outcome
/// is in the task's status (or will never be known: its node is gone, the deletion was forced):
/// the kubelet's last status cannot be lost by the pod object disappearing first.
pub const OUTCOME_FINALIZER: &str = "ax.dev/worker-outcome";
/// Largest payload also handed over as env `AX_PAYLOAD`: Linux refuses a single environment string
/// over 128 KiB, and big environments slow every exec. Larger payloads are only in the file.
pub const ENV_PAYLOAD_MAX_BYTES: usize = 32 * 1024;
/// Pod names double as hostnames, which must be DNS labels.
const MAX_NAME: usize = 63;
const HASH_LEN: usize = 10;

/// `<task>-<attempt>`, or a truncated task name plus a hash of the whole name when that is too long.
pub fn pod_name(task: &str, attempt: i32) -> String {
    let suffix = format!("-{attempt}");
    if task.len() + suffix.len() <= MAX_NAME {
        return format!("{task}{suffix}");
    }
    format!("{}{suffix}", shorten(task, MAX_NAME - suffix.len()))
}

/// A task name as a label value (at most 63 characters), hash-shortened like [`pod_name`].
pub fn label_value(name: &str) -> String {
    if name.len() <= MAX_NAME {
        name.to_string()
    } else {
        shorten(name, MAX_NAME)
    }
}

/// `prefix-hash` of at most `max` characters; the hash keeps distinct names distinct.
fn shorten(name: &str, max: usize) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hash = hex(&digest)[..HASH_LEN].to_string();
    let keep = max.saturating_sub(HASH_LEN + 1);
    // Names are ASCII (DNS subdomains); stay on a char boundary anyway and never end on a separator.
    let mut prefix: String = name.chars().take(keep).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// The worker pod for `attempt` of `task`. The task must have a name, namespace and uid (any task
/// read from the API server has them).
pub fn build_pod(task: &AxTask, attempt: i32, payload_json: &str) -> Pod {
    let name = task.metadata.name.clone().unwrap_or_default();
    let namespace = task.metadata.namespace.clone().unwrap_or_default();
    let uid = task.metadata.uid.clone().unwrap_or_default();
    let spec = &task.spec;
    let mut template = spec.template.clone();
    let mut metadata = template.metadata.take().unwrap_or_default();
    let mut pod_spec = template.spec.take().unwrap_or_default();

    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LABEL_TASK.into(), label_value(&name));
    labels.insert(LABEL_ATTEMPT.into(), attempt.to_string());
    labels.insert(LABEL_TYPE.into(), spec.task_type.clone());
    labels.insert("app.kubernetes.io/managed-by".into(), "ax-operator".into());
    labels.insert("app.kubernetes.io/component".into(), "worker".into());
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(PAYLOAD_ANNOTATION.into(), payload_json.to_string());
    metadata.name = Some(pod_name(&name, attempt));
    metadata.namespace = Some(namespace.clone());
    metadata.generate_name = None;
    // Every worker carries the outcome finalizer from its creation (the Job controller's
    // job-tracking pattern): a pod deleted by anyone — pod GC, a script, an eviction — stays
    // readable until its outcome is in the task's status, so a finished worker is never taken for
    // a lost one.
    let finalizers = metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == OUTCOME_FINALIZER) {
        finalizers.push(OUTCOME_FINALIZER.into());
    }
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: "ax.dev/v1alpha1".into(),
        kind: "AxTask".into(),
        name: name.clone(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);

    pod_spec.restart_policy = Some("Never".into());
    if pod_spec.automount_service_account_token.is_none() {
        pod_spec.automount_service_account_token = Some(false);
    }
    let volume_name = "ax-payload".to_string();
    pod_spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: volume_name.clone(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: PAYLOAD_FILE.into(),
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.annotations['{PAYLOAD_ANNOTATION}']"),
                    api_version: None,
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let payload_file = format!("{PAYLOAD_DIR}/{PAYLOAD_FILE}");
    let attempt_text = attempt.to_string();
    let mut vars = vec![
        ("AX_TASK", name.as_str()),
        ("AX_NAMESPACE", namespace.as_str()),
        ("AX_ATTEMPT", attempt_text.as_str()),
        ("AX_TYPE", spec.task_type.as_str()),
        ("AX_IDEMPOTENCY_KEY", uid.as_str()),
        ("AX_PAYLOAD_FILE", payload_file.as_str()),
    ];
    if payload_json.len() <= ENV_PAYLOAD_MAX_BYTES {
        vars.push(("AX_PAYLOAD", payload_json));
    }
    // An instrumented worker's spans are children of its attempt's span (`core::trace`).
    let traced = task
        .status
        .as_ref()
        .and_then(|s| s.trace.as_ref())
        .map(|trace| {
            (
                trace::worker_traceparent(trace, &uid, attempt),
                format!(
                    "ax.task={name},ax.namespace={namespace},ax.attempt={attempt},ax.queue={}",
                    spec.queue
                ),
            )
        });
    if let Some((traceparent, resource)) = &traced {
        vars.push(("TRACEPARENT", traceparent.as_str()));
        vars.push(("OTEL_RESOURCE_ATTRIBUTES", resource.as_str()));
    }
    let env: Vec<EnvVar> = vars
        .into_iter()
        .map(|(k, v)| EnvVar {
            name: k.into(),
            value: Some(v.to_string()),
            value_from: None,
        })
        .collect();
    let main =
        main_container_name(metadata.annotations.as_ref(), &pod_spec.containers).map(str::to_owned);
    for container in &mut pod_spec.containers {
        add_worker_env(container, &env);
        if Some(&container.name) == main.as_ref() {
            // The output is the main container's termination message (`core::output`).
            let path = container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| output::DEFAULT_TERMINATION_MESSAGE_PATH.to_owned());
            let var = EnvVar {
                name: output::OUTPUT_FILE_ENV.into(),
                value: Some(path),
                value_from: None,
            };
            add_worker_env(container, &[var]);
        }
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: volume_name.clone(),
                mount_path: PAYLOAD_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
    }
    Pod {
        metadata,
        spec: Some(pod_spec),
        status: None,
    }
}

/// The ax variables come first so a template that sets one of them explicitly wins.
fn add_worker_env(container: &mut Container, env: &[EnvVar]) {
    let mut all = env.to_vec();
    all.extend(container.env.take().unwrap_or_default());
    container.env = Some(all);
}

/// What the operator needs to know about one worker pod, extracted from its metadata and status.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct WorkerState {
    pub name: String,
    /// `None` for a pod this process created that the cache has not shown yet.
    pub uid: Option<String>,
    /// The attempt it runs (label `ax.dev/attempt`; 0 when the label is missing or not a number).
    pub attempt: i32,
    pub phase: PodPhase,
    /// The pod is being deleted (it has a deletionTimestamp).
    pub deleting: bool,
    /// The grace period of the deletion in progress.
    pub deletion_grace_seconds: Option<i64>,
    /// When the deletion in progress is due (its `deletionTimestamp`: asked for + grace period).
    pub deletion_due: Option<Timestamp>,
    /// The pod carries [`OUTCOME_FINALIZER`].
    pub outcome_finalizer: bool,
    /// All its finalizers, in order (to patch the list by index).
    pub finalizers: Vec<String>,
    pub node: Option<String>,
    /// `Some(false)` when the pod's node is known and not Ready.
    pub node_ready: Option<bool>,
    /// The pod is bound to a node that no longer exists (the node cache, complete, lacks it): no
    /// kubelet will report on it again.
    pub node_gone: bool,
    /// The main container, which alone decides success and failure.
    pub main: MainContainer,
    /// Restarts of the main container.
    pub restarts: i32,
    /// How the attempt ended: the main container's exit, or that of an init container that failed.
    pub exit: Option<ContainerExit>,
    /// A container waiting reason that means it does not start by itself (e.g. `ErrImagePull`),
    /// with its message.
    pub stuck_reason: Option<(String, String)>,
    /// The pod was evicted, lost its node or is a disruption target.
    pub disrupted: Option<(String, String)>,
    /// When the pod was created: its creationTimestamp (whole seconds), or the moment this process
    /// created it.
    pub created_at: Option<Timestamp>,
    /// When the main container started, as its status says (running or terminated).
    pub started_at: Option<Timestamp>,
}

impl WorkerState {
    /// A pod that may still run a worker: not in phase Succeeded/Failed.
    pub fn is_running_phase(&self) -> bool {
        !matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }

    /// A pod that is done and asks nothing more: terminal and not being deleted. Decisions leave
    /// such a pod as it is (it goes with its task; a succeeded fan-out item's goes at once); its
    /// outcome finalizer comes off when it is deleted.
    pub fn is_inert(&self) -> bool {
        !self.is_running_phase() && !self.deleting && self.uid.is_some()
    }

    /// Whether the main container has finished (an exit is known, or the pod is terminal).
    pub fn main_finished(&self) -> bool {
        self.main == MainContainer::Terminated || !self.is_running_phase()
    }
}

/// The state of the main container as the kubelet reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MainContainer {
    /// No status reported yet.
    #[default]
    Unknown,
    Waiting,
    Running {
        /// The kubelet's readiness of the container (its readiness probe, if any).
        ready: bool,
    },
    Terminated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PodPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerExit {
    pub exit_code: i32,
    pub reason: String,
    /// The termination message (`/dev/termination-log`).
    pub message: String,
}

/// The name of the main container of a pod template or pod: the one named by annotation
/// [`MAIN_CONTAINER_ANNOTATION`], else the first.
pub fn main_container_name<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    containers: &'a [Container],
) -> Option<&'a str> {
    match annotations.and_then(|a| a.get(MAIN_CONTAINER_ANNOTATION)) {
        Some(name) => Some(name.as_str()),
        None => containers.first().map(|c| c.name.as_str()),
    }
}

/// Waiting reasons after which a container does not start by itself.
const STUCK_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
];

pub fn observe(pod: &Pod, node_ready: Option<bool>) -> WorkerState {
    let status = pod.status.clone().unwrap_or_default();
    let phase = match status.phase.as_deref() {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some("Unknown") => PodPhase::Unknown,
        _ => PodPhase::Pending,
    };
    let containers = status.container_statuses.unwrap_or_default();
    let init_containers = status.init_container_statuses.unwrap_or_default();
    let spec_containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let main_name = main_container_name(pod.metadata.annotations.as_ref(), spec_containers)
        .map(str::to_owned)
        .or_else(|| containers.first().map(|c| c.name.clone()));
    let main_status = containers
        .iter()
        .find(|c| Some(&c.name) == main_name.as_ref());
    let main_state = main_status.and_then(|c| c.state.as_ref());
    let main = match main_state {
        Some(s) if s.terminated.is_some() => MainContainer::Terminated,
        Some(s) if s.running.is_some() => MainContainer::Running {
            ready: main_status.is_some_and(|c| c.ready),
        },
        Some(s) if s.waiting.is_some() => MainContainer::Waiting,
        _ => MainContainer::Unknown,
    };
    let exit_of =
        |t: &k8s_openapi::api::core::v1::ContainerStateTerminated, prefix: &str| ContainerExit {
            exit_code: t.exit_code,
            reason: format!("{prefix}{}", t.reason.clone().unwrap_or_default()),
            message: t.message.clone().unwrap_or_default(),
        };
    // An init container that failed ends the attempt before the main container ever runs.
    let init_failure = init_containers.iter().find_map(|c| {
        let t = c.state.as_ref()?.terminated.as_ref()?;
        (t.exit_code != 0).then(|| exit_of(t, &format!("init container {}: ", c.name)))
    });
    let main_exit = main_state
        .and_then(|s| s.terminated.as_ref())
        .map(|t| exit_of(t, ""));
    let started_at = main_state.and_then(|s| {
        let running = s.running.as_ref().and_then(|r| r.started_at.as_ref());
        let terminated = s.terminated.as_ref().and_then(|t| t.started_at.as_ref());
        running.or(terminated).map(|t| t.0)
    });
    let exit = main_exit.or(init_failure);
    let stuck_reason = init_containers.iter().chain(&containers).find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        STUCK_REASONS.contains(&reason).then(|| {
            (
                reason.to_string(),
                waiting.message.clone().unwrap_or_default(),
            )
        })
    });
    let disruption_condition = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True");
    let disrupted = match status.reason.as_deref() {
        Some(reason @ ("Evicted" | "NodeLost" | "Shutdown" | "Terminated" | "NodeShutdown")) => {
            Some((
                reason.to_string(),
                status.message.clone().unwrap_or_default(),
            ))
        }
        _ => disruption_condition.map(|c| {
            (
                c.reason.unwrap_or_else(|| "DisruptionTarget".into()),
                c.message.unwrap_or_default(),
            )
        }),
    };
    let meta = &pod.metadata;
    WorkerState {
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone(),
        attempt: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_ATTEMPT))
            .and_then(|a| a.parse().ok())
            .unwrap_or(0),
        phase,
        deleting: meta.deletion_timestamp.is_some(),
        deletion_grace_seconds: meta.deletion_grace_period_seconds,
        deletion_due: meta.deletion_timestamp.as_ref().map(|t| t.0),
        outcome_finalizer: meta
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == OUTCOME_FINALIZER)),
        finalizers: meta.finalizers.clone().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        node_ready,
        node_gone: false,
        main,
        restarts: main_status.map_or(0, |c| c.restart_count),
        exit,
        stuck_reason,
        disrupted,
        created_at: meta.creation_timestamp.as_ref().map(|t| t.0),
        started_at,
    }
}

/// A pod this process created at `created_at` and the cache has not shown yet: it exists, nothing
/// else is known of it.
pub fn expected(name: &str, attempt: i32, created_at: Timestamp) -> WorkerState {
    WorkerState {
        name: name.to_string(),
        attempt,
        created_at: Some(created_at),
        ..WorkerState::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AxTaskSpec;
    use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};

    fn task(name: &str) -> AxTask {
        let spec: AxTaskSpec = serde_json::from_value(serde_json::json!({
            "type": "report",
            "template": {"spec": {"containers": [{"name": "w", "image": "busybox",
                "env": [{"name": "AX_ATTEMPT", "value": "override"}, {"name": "MINE", "value": "1"}]}]}}
        }))
        .unwrap();
        let mut t = AxTask::new(name, spec);
        t.metadata.namespace = Some("ns".into());
        t.metadata.uid = Some("uid-1".into());
        t
    }

    #[test]
    fn short_names_are_task_dash_attempt() {
        assert_eq!(pod_name("report", 3), "report-3");
    }

    #[test]
    fn long_names_are_shortened_to_a_dns_label_and_stay_distinct() {
        let a = "a".repeat(100);
        let b = format!("{}b", "a".repeat(99));
        let (pa, pb) = (pod_name(&a, 12), pod_name(&b, 12));
        assert!(pa.len() <= 63 && pb.len() <= 63, "{pa} {pb}");
        assert_ne!(pa, pb);
        assert!(pa.ends_with("-12"));
        assert_eq!(pa, pod_name(&a, 12), "deterministic");
        assert!(label_value(&a).len() <= 63);
        let dashed = format!("{}-{}", "x".repeat(51), "y".repeat(40));
        assert!(!pod_name(&dashed, 1).contains("--"));
    }

    #[test]
    fn worker_pod_carries_identity_env_payload_and_owner() {
        let pod = build_pod(&task("t1"), 2, r#"{"k":1}"#);
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("t1-2"));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_TASK], "t1");
        assert_eq!(labels[LABEL_ATTEMPT], "2");
        assert_eq!(labels[LABEL_TYPE], "report");
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let env = spec.containers[0].env.clone().unwrap();
        let value = |n: &str| {
            env.iter()
                .rev()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("AX_TASK").as_deref(), Some("t1"));
        assert_eq!(value("AX_IDEMPOTENCY_KEY").as_deref(), Some("uid-1"));
        assert_eq!(value("AX_PAYLOAD").as_deref(), Some(r#"{"k":1}"#));
        assert_eq!(
            value("AX_ATTEMPT").as_deref(),
            Some("override"),
            "the template wins"
        );
        assert_eq!(value("MINE").as_deref(), Some("1"));
        assert_eq!(
            meta.annotations.as_ref().unwrap()[PAYLOAD_ANNOTATION],
            r#"{"k":1}"#
        );
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path,
            PAYLOAD_DIR
        );
    }

    #[test]
    fn template_restart_policy_and_token_mount() {
        let mut t = task("t1");
        t.spec.template = PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                restart_policy: Some("Always".into()),
                automount_service_account_token: Some(true),
                containers: vec![Container {
                    name: "w".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
        .into();
        let spec = build_pod(&t, 1, "{}").spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(true));
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
            .unwrap()
    }

    #[test]
    fn observes_exit_code_and_termination_message() {
        let p = pod(
            serde_json::json!({"phase": "Failed", "containerStatuses": [{
            "name": "w", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": "{\"error\":\"biz\"}"}}}]}),
        );
        let w = observe(&p, Some(true));
        assert_eq!(w.phase, PodPhase::Failed);
        let exit = w.exit.unwrap();
        assert_eq!(
            (exit.exit_code, exit.message.as_str()),
            (3, r#"{"error":"biz"}"#)
        );
    }

    #[test]
    fn observes_image_pull_errors_and_evictions() {
        let p = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "w", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}}}]}),
        );
        assert_eq!(
            observe(&p, None).stuck_reason.unwrap().0,
            "ErrImageNeverPull"
        );
        let p = pod(
            serde_json::json!({"phase": "Failed", "reason": "Evicted", "message": "low memory"}),
        );
        assert_eq!(observe(&p, None).disrupted.unwrap().0, "Evicted");
        let p = pod(serde_json::json!({"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}));
        assert_eq!(
            observe(&p, None).disrupted.unwrap().0,
            "PreemptionByScheduler"
        );
    }

    #[test]
    fn observes_nothing_odd_on_an_empty_pod() {
        let w = observe(&Pod::default(), None);
        assert_eq!(w, WorkerState::default());
    }
}
