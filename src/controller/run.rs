//! Wiring: one informer (reflector) per kind — tasks, their pods, nodes, queues, namespaces
//! (metadata only), DAGs and crons — and the controllers of tasks, DAGs and crons, the dispatcher
//! and the AxQueue watcher and status writer, running side by side on one [`Context`]. A child's
//! change reaches its DAG's or cron's reconcile from the one task (or DAG) informer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tracing::info;

use super::callback::Callbacks;
use super::context::OwnerWake;
use super::events::Events;
use super::expected::Expected;
use super::owner_index::OwnerIndex;
use super::{
    Context, Queues, Tracking, cache, cron, dag, dispatch, namespace, queue, readable, task,
};
use crate::api::{AxCron, AxDag, AxQueue, AxTaskTemplate};
use crate::core::worker::LABEL_TASK;
use crate::ops::metrics::Metrics;

/// Reconciles of one controller in flight at once. The client speaks HTTP/1.1, so every request
/// in flight holds a TLS connection to the API server: unbounded, a backlog of 100,000 new tasks
/// opened ~700 connections and queued thousands of writes the API server could not serve (504s).
/// A few dozen keep a 2-core API server busy; the rest wait in the controller's queue, deduplicated.
pub fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(32)
}

pub struct Settings {
    /// `spec.concurrency` of the `default` AxQueue when the operator creates it.
    pub default_queue_concurrency: u32,
    /// Who we are, for history entries and Events (`ax-operator/<pod>`).
    pub identity: String,
    pub metrics: Arc<Metrics>,
    /// Callback destinations admitted beyond public addresses (`--callback-allow`).
    pub callback_allow: crate::core::egress::Allowlist,
    /// Set to true once every informer cache has completed its first list (`/readyz`).
    pub caches_synced: tokio::sync::watch::Sender<bool>,
    /// See `core::task::Inputs::progress_write_delay`.
    pub progress_write_delay: Duration,
    /// Due progress writes made at most this many a second (`core::task::ProgressLine`).
    pub progress_writes_per_second: u32,
    /// Where task spans go (off when no endpoint is configured).
    pub traces: crate::ops::traces::Traces,
}

pub async fn run(
    client: Client,
    settings: Settings,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let pods_api: Api<Pod> = Api::all(client.clone());
    let nodes_api: Api<Node> = Api::all(client.clone());
    let events = Events::new(client.clone(), "ax-operator", &settings.identity);
    // Our own kinds are read through the readable guard: one the API server accepts but this
    // operator cannot read is left out with a Warning Event, never stalls its informer.
    let reporter = readable::Reporter::new(events.clone());
    // An Api of PartialObjectMeta lists and watches metadata only.
    let namespaces_api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());

    // Small collections, and the pods of tasks (at most about the queues' concurrency): kube's
    // watcher. The tasks come through `list_watch`, which reads their list from the watch cache.
    let (tasks, tasks_writer) = reflector::store();
    let (pods, pods_writer) = reflector::store();
    let (unowned_tasks, unowned_client) = (tasks.clone(), client.clone());
    let pods_by_task = Arc::new(OwnerIndex::default());
    let indexed = pods_by_task.clone();
    let pod_events = reflector::reflector(
        pods_writer,
        watcher(
            pods_api,
            watcher::Config::default().labels(LABEL_TASK).any_semantic(),
        )
        .default_backoff()
        .modify(cache::pod)
        .inspect_ok(move |event| indexed.apply(event)),
    )
    .touched_objects()
    // A deleted task's pods are never reconciled: their finalizers come off as they are deleted.
    .inspect_ok(move |pod| dispatch::free_if_unowned(pod, &unowned_tasks, &unowned_client));

    let (nodes, nodes_writer) = reflector::store();
    let node_watch = reflector::reflector(
        nodes_writer,
        watcher(nodes_api, watcher::Config::default().any_semantic()).default_backoff(),
    )
    .for_each(|_| async {});

    let (templates, templates_writer) = reflector::store();
    let template_events = reflector::reflector(
        templates_writer,
        readable::watch::<AxTaskTemplate>(client.clone(), None, Some(reporter.clone())),
    )
    .touched_objects();

    let (queue_store, queues_writer) = reflector::store();
    let queue_events = reflector::reflector(
        queues_writer,
        readable::watch::<AxQueue>(client.clone(), None, Some(reporter.clone())),
    );

    // Labels are all a queue's namespaceSelector reads.
    let (namespaces, namespaces_writer) = reflector::store();
    let namespace_events = reflector::reflector(
        namespaces_writer,
        watcher(namespaces_api, watcher::Config::default().any_semantic()).default_backoff(),
    );

    let (dags, dags_writer) = reflector::store();
    let dags_by_owner = Arc::new(OwnerIndex::default());
    let indexed = dags_by_owner.clone();
    let dag_events = reflector::reflector(
        dags_writer,
        // Each task's name and dependencies only: the specs are read whole when children are
        // created (`cache::dag`).
        readable::watch_reduced(client.clone(), None, Some(reporter.clone()), cache::dag)
            .inspect_ok(move |event| indexed.apply(event)),
    )
    .touched_objects();
    let (crons, crons_writer) = reflector::store();
    let cron_events = reflector::reflector(
        crons_writer,
        readable::watch::<AxCron>(client.clone(), None, Some(reporter.clone())),
    )
    .touched_objects();

    // Reconciles asked for by the dispatcher (a slot granted), the held-reason refresh and callbacks.
    let (wake, woken) = futures::channel::mpsc::unbounded();
    // Reconciles of the DAGs and crons whose children changed.
    let (dags_wake, dags_woken) =
        futures::channel::mpsc::unbounded::<reflector::ObjectRef<AxDag>>();
    let (crons_wake, crons_woken) = futures::channel::mpsc::unbounded();
    let fresh = Arc::new(cache::FreshTemplates::default());
    let tasks_by_owner = Arc::new(OwnerIndex::default());
    let ctx = Arc::new(Context {
        client: client.clone(),
        events: events.clone(),
        tasks: tasks.clone(),
        tasks_by_owner: tasks_by_owner.clone(),
        dags,
        dags_by_owner,
        crons,
        dag_children: Expected::default(),
        cron_children: Expected::default(),
        owner_wake: OwnerWake {
            dags: dags_wake,
            crons: crons_wake,
            tasks: wake.clone(),
        },
        fresh: fresh.clone(),
        pods: pods.clone(),
        pods_by_task,
        nodes: nodes.clone(),
        queue_store,
        templates,
        namespaces,
        queues: Queues::default(),
        dispatch_wanted: Notify::new(),
        wake,
        tracking: Tracking::new(settings.progress_writes_per_second),
        operator: format!("ax-operator/{}", settings.identity),
        callbacks: Callbacks::new(settings.callback_allow.clone())?,
        metrics: settings.metrics.clone(),
        progress_write_delay: settings.progress_write_delay,
        progress_due: Notify::new(),
        traces: settings.traces.clone(),
    });
    let looking = ctx.clone();
    let owners = ctx.clone();
    let task_events = reflector::reflector(
        tasks_writer,
        cache::task_watch(client.clone(), reporter, fresh)
            .inspect_ok(move |event| tasks_by_owner.apply(event)),
    )
    .touched_objects()
    .inspect_ok(move |task| owners.owner_wake.child_changed(task))
    // A settled task that a look leaves as it is queues no reconcile (`task::seen_in_passing`).
    .try_filter(move |task| std::future::ready(!task::seen_in_passing(task, &looking)));
    // A cron's DAG changed: its cron looks again.
    let owners = ctx.clone();
    let dag_events = dag_events.inspect_ok(move |dag| owners.owner_wake.child_changed(dag));
    let controller = Controller::for_stream(task_events, tasks)
        .owns_stream(pod_events)
        .reconcile_on(woken)
        .with_config(controller_config());

    let node_task = tokio::spawn(node_watch);
    tokio::spawn(report_caches_synced(ctx.clone(), settings.caches_synced));
    let controller = controller.shutdown_on_signal();
    let wait_ctx = ctx.clone();
    let controller_run = async move {
        controller
            .run(task::reconcile, task::error_policy, wait_ctx.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile");
                }
            })
            .await
    };
    info!("ax-operator running");
    tokio::select! {
        _ = controller_run => {}
        _ = dispatch::run(ctx.clone()) => {}
        _ = task::pace_progress_writes(ctx.clone(), settings.progress_writes_per_second) => {}
        _ = queue::watch(ctx.clone(), queue_events) => {}
        _ = namespace::watch(ctx.clone(), namespace_events) => {}
        _ = queue::maintain(ctx.clone(), settings.default_queue_concurrency) => {}
        _ = count_tasks(ctx.clone()) => {}
        _ = dag::run(ctx.clone(), dag_events, dags_woken) => {}
        _ = cron::run(ctx.clone(), cron_events, crons_woken) => {}
        _ = task::wake_tasks_waiting_for_templates(ctx.clone(), template_events) => {}
    }
    node_task.abort();
    Ok(())
}

/// Reports readiness once every cache has completed its first list.
async fn report_caches_synced(ctx: super::Ctx, synced: tokio::sync::watch::Sender<bool>) {
    super::cache_synced(&ctx.tasks).await;
    super::cache_synced(&ctx.dags).await;
    super::cache_synced(&ctx.crons).await;
    super::cache_synced(&ctx.pods).await;
    super::cache_synced(&ctx.nodes).await;
    super::cache_synced(&ctx.queue_store).await;
    super::cache_synced(&ctx.templates).await;
    super::cache_synced(&ctx.namespaces).await;
    synced.send_replace(true);
}

/// How often `ax_tasks` is recomputed from the cache.
const COUNT_EVERY: Duration = Duration::from_secs(2);

/// Keeps the per-phase task gauges in step with the cache: one pass over it every couple of
/// seconds, far from any dispatch path. A task whose new phase is decided and not written yet
/// (`core::task::Decision::write_by`) counts in that phase: a short attempt is never written
/// Running, yet it ran.
async fn count_tasks(ctx: super::Ctx) {
    let mut tick = tokio::time::interval(COUNT_EVERY);
    loop {
        tick.tick().await;
        let tasks = ctx.tasks.state();
        let mut by_phase: HashMap<(&str, &str, &'static str), usize> = HashMap::new();
        for task in &tasks {
            let phase = task.phase().map_or("New", |p| p.as_str());
            *by_phase
                .entry((task.queue(), task.task_type(), phase))
                .or_default() += 1;
        }
        let mut counts: HashMap<(String, String, &'static str), usize> = by_phase
            .into_iter()
            .map(|((queue, task_type, phase), n)| ((queue.into(), task_type.into(), phase), n))
            .collect();
        for (key, decided) in ctx.tracking.unwritten_phases() {
            let Some(task) = ctx.tasks.get(&ObjectRef::new(&key.1).within(&key.0)) else {
                continue;
            };
            let written = task.phase().map_or("New", |p| p.as_str());
            let (queue, task_type) = (task.queue().to_string(), task.task_type().to_string());
            if let Some(n) = counts.get_mut(&(queue.clone(), task_type.clone(), written)) {
                *n = n.saturating_sub(1);
            }
            *counts
                .entry((queue, task_type, decided.as_str()))
                .or_default() += 1;
        }
        ctx.metrics.set_task_counts(counts);
    }
}
