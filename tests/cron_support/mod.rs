//! Helpers of the AxCron end-to-end tests (tests/e2e_cron*.rs): cron manifests for simulated
//! nodes, the children of a cron, and a watch that audits them.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax::api::{AxCron, AxDag, AxTask, Condition, TaskPhase};
use futures::StreamExt;
use jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::common::phase;

/// A pod template for a simulated node: "runs" for `millis`, exits with `exit_code`, or never
/// finishes when `hang`.
pub fn sim_template(millis: u64, exit_code: i32, hang: bool) -> serde_json::Value {
    let mut env = vec![
        serde_json::json!({"name": "AX_SIM_START_MS", "value": "50"}),
        serde_json::json!({"name": "AX_SIM_DURATION_MS", "value": millis.to_string()}),
        serde_json::json!({"name": "AX_SIM_EXIT_CODE", "value": exit_code.to_string()}),
    ];
    if hang {
        env.push(serde_json::json!({"name": "AX_SIM_HANG", "value": "true"}));
    }
    serde_json::json!({"spec": {
        "nodeSelector": {"ax.dev/sim-node": "true"},
        "tolerations": [{"key": "ax.dev/sim-node", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "worker", "image": "localhost/ax-busybox:1", "env": env}],
    }})
}

/// An AxTask spec for a simulated node, without retries.
pub fn sim_task(millis: u64, exit_code: i32, hang: bool) -> serde_json::Value {
    serde_json::json!({
        "type": "cron-step",
        "retry": {"maxRetries": 0},
        "template": sim_template(millis, exit_code, hang),
    })
}

/// An AxCron from its spec.
pub fn cron(name: &str, spec: serde_json::Value) -> AxCron {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxCron",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("an AxCron")
}

pub async fn create_cron(client: &Client, ns: &str, cron: &AxCron) -> AxCron {
    let api: Api<AxCron> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), cron)
        .await
        .expect("create cron")
}

pub async fn delete_cron(client: &Client, ns: &str, name: &str) {
    let api: Api<AxCron> = Api::namespaced(client.clone(), ns);
    let _ = api.delete(name, &Default::default()).await;
}

pub fn cron_condition<'a>(cron: &'a AxCron, type_: &str) -> Option<&'a Condition> {
    cron.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// The scheduled time of a child, from its label.
pub fn scheduled<K: kube::Resource>(child: &K) -> i64 {
    child.labels()["ax.dev/scheduled-time"]
        .parse()
        .expect("scheduled-time label")
}

/// The AxTask children of a cron, by name.
pub async fn task_children(client: &Client, ns: &str, cron: &str) -> BTreeMap<String, AxTask> {
    children_of(client, ns, cron).await
}

/// The AxDag children of a cron, by name.
pub async fn dag_children(client: &Client, ns: &str, cron: &str) -> BTreeMap<String, AxDag> {
    children_of(client, ns, cron).await
}

/// The children of kind `K` of a cron, by name.
async fn children_of<K>(client: &Client, ns: &str, cron: &str) -> BTreeMap<String, K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    crate::common::by_label(client, ns, &format!("ax.dev/cron={cron}")).await
}

/// Polls the cron's AxTask children until `done` holds for them, or panics after `timeout`.
pub async fn wait_children(
    client: &Client,
    ns: &str,
    cron: &str,
    timeout: Duration,
    done: impl Fn(&BTreeMap<String, AxTask>) -> bool,
) -> BTreeMap<String, AxTask> {
    let deadline = Instant::now() + timeout;
    loop {
        let children = task_children(client, ns, cron).await;
        if done(&children) {
            return children;
        }
        if Instant::now() > deadline {
            let phases: Vec<(String, Option<TaskPhase>)> = children
                .iter()
                .map(|(name, child)| (name.clone(), phase(child)))
                .collect();
            panic!(
                "children of cron {ns}/{cron}: condition not met within {timeout:?}: {phases:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What a watch on a namespace's cron children saw: every uid per child name, and the most
/// children active (not finished) at one point of the watch's order.
#[derive(Debug, Default)]
pub struct Audit {
    pub uids: BTreeMap<String, BTreeSet<String>>,
    pub phases: BTreeMap<String, Option<TaskPhase>>,
    pub max_active: usize,
}

/// Watches the AxTasks labelled `ax.dev/cron` in `namespace` from now on.
pub fn audit_children(
    client: &Client,
    namespace: &str,
) -> (Arc<Mutex<Audit>>, tokio::task::JoinHandle<()>) {
    let audit: Arc<Mutex<Audit>> = Arc::default();
    let api: Api<AxTask> = Api::namespaced(client.clone(), namespace);
    let recorder = audit.clone();
    let watch = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().labels("ax.dev/cron"))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(task)) = stream.next().await {
            let mut audit = recorder.lock().expect("audit lock");
            audit
                .uids
                .entry(task.name_any())
                .or_default()
                .insert(task.uid().unwrap_or_default());
            audit.phases.insert(task.name_any(), phase(&task));
            let active = audit
                .phases
                .values()
                .filter(|p| !p.is_some_and(TaskPhase::is_terminal))
                .count();
            audit.max_active = audit.max_active.max(active);
        }
    });
    (audit, watch)
}

/// The first whole minute after `t`, in Unix seconds.
pub fn next_minute(t: Timestamp) -> i64 {
    (t.as_second() / 60 + 1) * 60
}
