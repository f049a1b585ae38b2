//! AxTaskTemplate and `spec.templateRef` on the real cluster with the operator started by
//! e2e/run-tests.sh: a task, a DAG task and a cron's tasks completed from one template, an edit
//! of the template that changes no attempt already running, and a task that waits for its
//! template to appear.

mod common;
mod cron_support;

use std::time::Duration;

use ax::api::{AxDag, AxTask, AxTaskTemplate, DagPhase, Priority, TaskPhase};
use common::*;
use cron_support::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// Pod `name` in `ns` as a watch started now first sees it (`None` if the watch ends first).
fn seen_pod(client: &Client, ns: &str, name: &str) -> tokio::task::JoinHandle<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let stream = watcher(pods, config).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        stream.next().await.and_then(Result::ok)
    })
}

/// An AxTaskTemplate of type `sim-templated` whose worker runs `millis` on a simulated node.
fn template(name: &str, millis: u64) -> AxTaskTemplate {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxTaskTemplate",
        "metadata": {"name": name},
        "spec": {
            "type": "sim-templated",
            "priority": "High",
            "retry": {"maxRetries": 1},
            "payload": {"from": "template", "size": "small"},
            "template": sim_template(millis, 0, false),
        },
    }))
    .expect("an AxTaskTemplate")
}

async fn create_template(client: &Client, ns: &str, template: &AxTaskTemplate) -> AxTaskTemplate {
    let api: Api<AxTaskTemplate> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), template)
        .await
        .expect("create template")
}

/// An AxTask that references template `name`, with `own` beside the reference.
fn referencing(task: &str, name: &str, own: serde_json::Value) -> AxTask {
    let mut spec = serde_json::json!({"templateRef": {"name": name}});
    if let (Some(spec), Some(own)) = (spec.as_object_mut(), own.as_object()) {
        spec.extend(own.clone());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
        "metadata": {"name": task},
        "spec": spec,
    }))
    .expect("an AxTask")
}

fn env_of(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

/// A task, a DAG task (once and per item) and a cron's task all run from one template, with what
/// they set beside the reference winning; each records the template's resourceVersion.
#[tokio::test]
async fn a_task_a_dag_task_and_a_crons_task_run_from_one_template() {
    let client = client().await;
    let ns = namespace(&client, "templates-use").await;
    let created = create_template(&client, &ns, &template("step", 200)).await;
    let version = created.resource_version().expect("a resourceVersion");

    let task = referencing(
        "plain",
        "step",
        serde_json::json!({"priority": "Low", "payload": {"size": "large"}}),
    );
    create(&client, &ns, &task).await;
    let dag: AxDag = serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": "flow"},
        "spec": {"tasks": [
            {"name": "first", "spec": {"templateRef": {"name": "step"}}},
            {"name": "each", "dependsOn": ["first"], "spec": {"templateRef": {"name": "step"}},
                "forEach": {"items": ["a", "b", "c"]}},
        ]},
    }))
    .expect("an AxDag");
    // A succeeded item's pod is deleted at once: its first sight is kept.
    let item_pod = seen_pod(&client, &ns, "flow-each-1-1");
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&PostParams::default(), &dag)
        .await
        .expect("create dag");
    let cron = cron(
        "every-4s",
        serde_json::json!({"schedule": "*/4 * * * * *", "task": {"templateRef": {"name": "step"}}}),
    );
    create_cron(&client, &ns, &cron).await;

    let plain = wait_phase(&client, &ns, "plain", TaskPhase::Succeeded, LONG).await;
    assert_eq!(plain.spec.task_type, "sim-templated", "the template's type");
    assert_eq!(
        plain.spec.priority,
        Priority::Low,
        "the task's own priority"
    );
    assert_eq!(plain.spec.retry.max_retries, 1, "the template's retries");
    assert_eq!(
        plain.spec.payload,
        Some(serde_json::json!({"from": "template", "size": "large"})),
        "payloads merge field by field, the task's winning"
    );
    let used = plain
        .status
        .as_ref()
        .and_then(|s| s.template.clone())
        .expect("status.template");
    assert_eq!(
        (used.name.as_str(), used.resource_version.as_str()),
        ("step", version.as_str())
    );

    let dag = wait_for(&client, &ns, "flow", LONG, |d: &AxDag| {
        d.status.as_ref().and_then(|s| s.phase) == Some(DagPhase::Succeeded)
    })
    .await;
    assert_eq!(
        dag.status.as_ref().map(|s| s.progress.clone()),
        Some(Some("2/2".into()))
    );
    let item = tokio::time::timeout(LONG, item_pod)
        .await
        .expect("item 1's pod never seen")
        .expect("the watch")
        .expect("item 1's pod");
    assert_eq!(
        env_of(&item, "AX_ITEM").as_deref(),
        Some("\"b\""),
        "an item completed from a template gets its item in its env"
    );
    let first: AxTask = Api::namespaced(client.clone(), &ns)
        .get("flow-first")
        .await
        .expect("flow-first");
    assert_eq!(first.spec.task_type, "sim-templated");

    let children = wait_children(&client, &ns, "every-4s", LONG, |children| {
        children
            .values()
            .any(|c| phase(c) == Some(TaskPhase::Succeeded))
    })
    .await;
    delete_cron(&client, &ns, "every-4s").await;
    let fired = children
        .values()
        .find(|c| phase(c) == Some(TaskPhase::Succeeded))
        .expect("a succeeded child");
    assert_eq!(fired.spec.task_type, "sim-templated");
    assert_eq!(
        fired.spec.priority,
        Priority::High,
        "the template's priority"
    );
}

/// Editing a template changes no running attempt (its pod is the one dispatched, and the task
/// keeps the version it was resolved from); a task created after the edit runs the new version.
#[tokio::test]
async fn editing_a_template_changes_no_running_attempt() {
    let client = client().await;
    let ns = namespace(&client, "templates-edit").await;
    let created = create_template(&client, &ns, &template("slow", 4000)).await;
    let before = created.resource_version().expect("a resourceVersion");
    create(
        &client,
        &ns,
        &referencing("running", "slow", serde_json::json!({})),
    )
    .await;
    wait_phase(&client, &ns, "running", TaskPhase::Running, LONG).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod_before = pods.get("running-1").await.expect("the worker");

    let templates: Api<AxTaskTemplate> = Api::namespaced(client.clone(), &ns);
    let edited = templates
        .patch(
            "slow",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "priority": "Critical",
                "template": sim_template(100, 0, false),
            }})),
        )
        .await
        .expect("edit the template");
    let after = edited.resource_version().expect("a resourceVersion");
    assert_ne!(before, after);
    create(
        &client,
        &ns,
        &referencing("later", "slow", serde_json::json!({})),
    )
    .await;

    let done = wait_phase(&client, &ns, "running", TaskPhase::Succeeded, LONG).await;
    let pod_after = pods.get("running-1").await.expect("the worker");
    assert_eq!(
        pod_after.metadata.uid, pod_before.metadata.uid,
        "the same pod"
    );
    assert_eq!(
        env_of(&pod_after, "AX_SIM_DURATION_MS").as_deref(),
        Some("4000"),
        "the pod dispatched before the edit"
    );
    assert_eq!(done.status.as_ref().expect("status").attempt, 1);
    let status = done.status.as_ref().expect("status");
    assert_eq!(
        status.template.as_ref().map(|t| t.resource_version.clone()),
        Some(before)
    );
    assert_eq!(
        done.spec.priority,
        Priority::High,
        "resolved once, before the edit"
    );

    let later = wait_phase(&client, &ns, "later", TaskPhase::Succeeded, LONG).await;
    assert_eq!(later.spec.priority, Priority::Critical);
    let later_pod = pods.get("later-1").await.expect("the worker");
    assert_eq!(
        env_of(&later_pod, "AX_SIM_DURATION_MS").as_deref(),
        Some("100")
    );
    assert_eq!(
        later
            .status
            .as_ref()
            .and_then(|s| s.template.clone())
            .map(|t| t.resource_version),
        Some(after)
    );
}

/// A task whose template does not exist waits, unadmitted and without a pod, with condition
/// `TemplateResolved` False naming it; it runs once the template is created.
#[tokio::test]
async fn a_missing_template_holds_the_task_until_it_is_created() {
    let client = client().await;
    let ns = namespace(&client, "templates-missing").await;
    create(
        &client,
        &ns,
        &referencing("early", "later", serde_json::json!({})),
    )
    .await;
    let held = wait_task(&client, &ns, "early", LONG, |t| {
        t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "TemplateResolved" && c.status == "False")
        })
    })
    .await;
    let status = held.status.as_ref().expect("status");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "TemplateResolved")
        .expect("the condition");
    assert_eq!(condition.reason, "TemplateNotFound");
    assert!(
        condition.message.contains("AxTaskTemplate later"),
        "{}",
        condition.message
    );
    assert_eq!(status.phase, None, "not admitted, not Dead");
    wait_events(&client, &ns, "early", &["TemplateNotFound"]).await;
    // Give a wrong operator time to run it anyway.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        pods_of(&client, &ns, "early").await.is_empty(),
        "no pod without a template"
    );

    create_template(&client, &ns, &template("later", 100)).await;
    let done = wait_phase(&client, &ns, "early", TaskPhase::Succeeded, LONG).await;
    let status = done.status.as_ref().expect("status");
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.type_ != "TemplateResolved"),
        "the condition goes once resolved: {:?}",
        status.conditions
    );
    assert_eq!(
        status.template.as_ref().map(|t| t.name.as_str()),
        Some("later")
    );
}
