//! What the operator keeps of each object in its informer caches (no client required): what its
//! decisions read, not the whole object. With 100,000 tasks waiting, a full AxTask — its pod
//! template, payload, managedFields, last-applied annotation — is most of the operator's memory and
//! none of what a waiting task's decisions need.
//!
//! A cached AxTask keeps its metadata (without managedFields and annotations), the spec's scalar
//! fields and the whole status. The facts the reconciler reads from the template and payload are
//! worked out once, when the object arrives, and kept as annotations that exist only in this cache
//! (the status subresource ignores everything but `status`, so they are never written back). The
//! template itself is read again, with the task, when a worker pod has to be built from a cached
//! copy — which the dispatch path never needs: its status write returns the whole task.
//!
//! A cached worker pod keeps what `core::worker::observe` reads: names, labels, owners, deletion,
//! finalizers, the main-container annotation, node, container names and statuses.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodSpec, PodStatus, PodTemplateSpec,
};

use futures::Stream;
use kube::Client;
use kube::runtime::{WatchStreamExt, watcher};

use super::readable;
use crate::api::AxTask;
use crate::core::task as core;
use crate::core::worker::MAIN_CONTAINER_ANNOTATION;

/// On a cached AxTask whose template and payload were dropped.
pub const STRIPPED: &str = "ax.dev/cache.stripped";
/// The validation error of the dropped spec, if any.
pub const SPEC_ERROR: &str = "ax.dev/cache.spec-error";
/// The dropped template's main container has a readiness or liveness probe.
pub const MAIN_PROBE: &str = "ax.dev/cache.main-probe";

/// Reduces an AxTask to what the operator's caches keep.
pub fn task(t: &mut AxTask) {
    let mut cached = BTreeMap::new();
    cached.insert(STRIPPED.to_string(), "true".to_string());
    if let Err(e) = core::validate(&t.spec) {
        cached.insert(SPEC_ERROR.to_string(), e.to_string());
    }
    if core::main_has_probe(&t.spec) {
        cached.insert(MAIN_PROBE.to_string(), "true".to_string());
    }
    t.metadata.managed_fields = None;
    t.metadata.annotations = Some(cached);
    t.spec.template = PodTemplateSpec::default();
    t.spec.payload = None;
}

/// The AxTasks `config` selects, as every task cache of the operator holds them: readable ones only
/// (see [`readable`]), reduced by [`task`].
pub fn task_watch(
    client: Client,
    config: watcher::Config,
    reporter: Option<readable::Reporter>,
) -> impl Stream<Item = Result<watcher::Event<AxTask>, watcher::Error>> + Send {
    readable::watch(client, config, reporter).modify(task)
}

pub fn is_stripped(t: &AxTask) -> bool {
    annotation(t, STRIPPED).is_some()
}

/// The spec's validation error: from the cache's note when the spec was dropped, else worked out.
pub fn spec_error(t: &AxTask) -> Option<String> {
    if is_stripped(t) {
        annotation(t, SPEC_ERROR).map(str::to_string)
    } else {
        core::validate(&t.spec).err().map(|e| e.to_string())
    }
}

/// Whether the main container has a probe, from the cache's note when the spec was dropped.
pub fn main_has_probe(t: &AxTask) -> bool {
    if is_stripped(t) {
        annotation(t, MAIN_PROBE).is_some()
    } else {
        core::main_has_probe(&t.spec)
    }
}

fn annotation<'a>(t: &'a AxTask, key: &str) -> Option<&'a str> {
    t.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Reduces a worker pod to what the operator reads of it.
pub fn pod(p: &mut Pod) {
    let meta = &mut p.metadata;
    meta.managed_fields = None;
    let main = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MAIN_CONTAINER_ANNOTATION))
        .cloned();
    meta.annotations = main.map(|m| BTreeMap::from([(MAIN_CONTAINER_ANNOTATION.to_string(), m)]));
    if let Some(spec) = p.spec.take() {
        let names = |containers: &[Container]| -> Vec<Container> {
            containers
                .iter()
                .map(|c| Container {
                    name: c.name.clone(),
                    ..Container::default()
                })
                .collect()
        };
        p.spec = Some(PodSpec {
            node_name: spec.node_name,
            containers: names(&spec.containers),
            init_containers: spec.init_containers.as_deref().map(names),
            ..PodSpec::default()
        });
    }
    if let Some(status) = p.status.take() {
        let keep = |statuses: Option<Vec<ContainerStatus>>| {
            statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        ready: c.ready,
                        restart_count: c.restart_count,
                        state: c.state,
                        ..ContainerStatus::default()
                    })
                    .collect()
            })
        };
        p.status = Some(PodStatus {
            phase: status.phase,
            reason: status.reason,
            message: status.message,
            conditions: status.conditions,
            container_statuses: keep(status.container_statuses),
            init_container_statuses: keep(status.init_container_statuses),
            ..PodStatus::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::worker;

    fn task_json(extra: serde_json::Value) -> AxTask {
        let mut v = serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "x", "payload": {"big": "x".repeat(1000)},
                "template": {"spec": {"containers": [{"name": "w", "image": "i",
                    "readinessProbe": {"exec": {"command": ["true"]}}}]}}},
        });
        if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(v).expect("a task")
    }

    #[test]
    fn a_cached_task_keeps_what_decisions_read_and_the_facts_of_what_it_drops() {
        let mut t = task_json(serde_json::json!({}));
        assert!(!is_stripped(&t));
        assert!(main_has_probe(&t));
        task(&mut t);
        assert!(is_stripped(&t));
        assert_eq!(t.spec.payload, None);
        assert_eq!(t.spec.template, PodTemplateSpec::default());
        assert_eq!(t.metadata.managed_fields, None);
        assert_eq!(t.metadata.annotations.as_ref().map(|a| a.len()), Some(2));
        assert!(main_has_probe(&t));
        assert_eq!(spec_error(&t), None);
        assert_eq!(t.spec.task_type, "x");
    }

    #[test]
    fn a_cached_task_remembers_why_its_spec_is_invalid() {
        let mut t =
            task_json(serde_json::json!({"timeout": {"softSeconds": 10, "hardSeconds": 5}}));
        let before = spec_error(&t);
        assert!(before.is_some());
        task(&mut t);
        assert_eq!(spec_error(&t), before);
    }

    #[test]
    fn a_cached_pod_is_still_observed_the_same() {
        let raw: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t-1", "uid": "p", "labels": {"ax.dev/task": "t", "ax.dev/attempt": "1"},
                "annotations": {"ax.dev/payload": "x".repeat(10000), "ax.dev/main-container": "w"},
                "finalizers": ["f"], "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 10},
            "spec": {"nodeName": "n", "containers": [{"name": "side", "image": "i"}, {"name": "w", "image": "i",
                "env": [{"name": "AX_PAYLOAD", "value": "x"}]}]},
            "status": {"phase": "Running", "reason": "Evicted", "podIP": "10.0.0.1",
                "conditions": [{"type": "DisruptionTarget", "status": "True"}],
                "containerStatuses": [
                    {"name": "w", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
                     "state": {"terminated": {"exitCode": 3, "message": "m"}}},
                    {"name": "side", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                     "state": {"running": {}}}]}
        }))
        .unwrap();
        let mut stripped = raw.clone();
        pod(&mut stripped);
        assert_eq!(
            worker::observe(&stripped, Some(true)),
            worker::observe(&raw, Some(true))
        );
        let size = |p: &Pod| serde_json::to_string(p).unwrap().len();
        assert!(
            size(&stripped) * 10 < size(&raw),
            "{} vs {}",
            size(&stripped),
            size(&raw)
        );
    }
}
