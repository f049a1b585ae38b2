//! The AxQueues in the operator (client required): the watcher that applies spec edits to the
//! registry at once, the loop that keeps `AxQueue.status` and the queue metrics up to date and the
//! `default` queue in existence, the adaptive concurrency's look at the worker pods (one pass over
//! the pod cache per period, only while some queue is adaptive), and Events about queues. The
//! decisions are in `core::queue`.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::write::{self, ApiError};
use super::{Ctx, FIELD_MANAGER};
use crate::api::{AxQueue, AxQueueSpec, DEFAULT_QUEUE};
use crate::core::conditions;
use crate::core::queue::{QueueReport, capacity, queue_status};

/// How often `AxQueue.status` and the queue metrics are brought up to date (written only when
/// changed), and the `default` queue re-created if it went missing.
const STATUS_EVERY: Duration = Duration::from_secs(2);
/// Where Events about (cluster-scoped) queues are written.
const EVENT_NAMESPACE: &str = "default";

/// Applies every AxQueue event to the registry: spec edits take effect at once, a deleted queue
/// holds its tasks. A spec newly found invalid gets a Warning Event (its condition follows with the
/// next status write).
pub async fn watch(
    ctx: Ctx,
    events: impl Stream<Item = Result<watcher::Event<AxQueue>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(queue) | watcher::Event::InitApply(queue)) => {
                configure(&ctx, &queue);
            }
            Ok(watcher::Event::Delete(queue)) => {
                info!(
                    queue = queue.name_any(),
                    "AxQueue deleted; its tasks wait for it"
                );
                ctx.queues.lock().queue_deleted(&queue.name_any());
            }
            Ok(watcher::Event::InitDone) => sync_from_store(&ctx),
            Ok(watcher::Event::Init) => {}
            Err(e) => debug!(error = %e, "AxQueue watch"),
        }
        ctx.dispatch_wanted.notify_one();
    }
}

/// Brings the registry in line with the AxQueue cache: after a re-list, deletions missed while the
/// watch was down show up here.
pub fn sync_from_store(ctx: &Ctx) {
    let queues = ctx.queue_store.state();
    for queue in &queues {
        configure(ctx, queue);
    }
    let present: BTreeSet<String> = queues.iter().map(|q| q.name_any()).collect();
    let mut registry = ctx.queues.lock();
    for name in registry.known_queues() {
        if !present.contains(&name) {
            registry.queue_deleted(&name);
        }
    }
}

fn configure(ctx: &Ctx, queue: &AxQueue) {
    let (problem, look_now) = {
        let mut queues = ctx.queues.lock();
        let name = queue.name_any();
        let keyed_before = queues.key_source(&name).cloned();
        let problem = queues.configure(queue, Timestamp::now());
        let keyed_now = queues.key_source(&name);
        let look_now = if keyed_now.is_some() && keyed_now != keyed_before.as_ref() {
            queues.tasks_in(&name)
        } else if queues.drains(&name) {
            queues.holding_in(&name)
        } else {
            Vec::new()
        };
        (problem, look_now)
    };
    // Each task records a new key, and each dispatched task of a draining queue stops its attempt,
    // at its next look: look now.
    for key in &look_now {
        ctx.wake(key);
    }
    match problem {
        Some(problem) => {
            warn!(queue = queue.name_any(), %problem, "AxQueue spec rejected; the previous configuration stays");
            publish(
                ctx,
                queue,
                "Warning",
                conditions::reason::INVALID_SPEC,
                &format!("{problem}; the previous configuration stays in force"),
            );
        }
        None => debug!(queue = queue.name_any(), "AxQueue applied"),
    }
}

/// Publishes an Event about a queue. A cluster-scoped object's events.k8s.io Event must live in
/// kube-system (where `kubectl describe` does not look), so this writes a core/v1 Event in
/// `default`, which API servers accept for cluster-scoped objects and describe finds.
fn publish(ctx: &Ctx, queue: &AxQueue, type_: &str, reason: &str, note: &str) {
    let now = Time(Timestamp::now());
    let event = CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", queue.name_any())),
            namespace: Some(EVENT_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        involved_object: queue.object_ref(&()),
        type_: Some(type_.into()),
        reason: Some(reason.into()),
        message: Some(note.chars().take(1000).collect()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource {
            component: Some(FIELD_MANAGER.into()),
            host: None,
        }),
        ..CoreEvent::default()
    };
    let api: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), EVENT_NAMESPACE);
    tokio::spawn(async move {
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            debug!(error = %e, "publishing event failed");
        }
    });
}

/// Keeps `AxQueue.status` and the queue metrics up to date, and the `default` queue in existence.
pub async fn maintain(ctx: Ctx, default_concurrency: u32) {
    super::cache_synced(&ctx.queue_store).await;
    let mut tick = tokio::time::interval(STATUS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if ctx
            .queue_store
            .get(&ObjectRef::new(DEFAULT_QUEUE))
            .is_none()
        {
            create_default_queue(&ctx, default_concurrency).await;
        }
        let now = Timestamp::now();
        adapt(&ctx, now);
        let reports = ctx.queues.lock().reports(now);
        report_metrics(&ctx, &reports);
        for report in reports.iter().filter(|r| r.exists) {
            let Some(queue) = ctx.queue_store.get(&ObjectRef::new(&report.name)) else {
                continue;
            };
            let before = queue.status.clone().unwrap_or_default();
            let status = queue_status(report, &before, now);
            if status != before
                && let Err(e) = write::queue_status(&ctx.client, &report.name, &status).await
            {
                debug!(queue = report.name, error = %e, "writing AxQueue status failed");
            }
        }
    }
}

/// One look of the adaptive concurrency: each adaptive queue's worker pods counted from the pod
/// cache (placed, Unschedulable, on nodes under pressure) in one pass, then handed to its
/// controller. A large change gets an Event.
fn adapt(ctx: &Ctx, now: Timestamp) {
    let adaptive = ctx.queues.lock().adaptive_queues();
    if adaptive.is_empty() {
        return;
    }
    let pods = ctx.pods.state();
    // The owner reference names the task in full (the label may be a shortened name).
    let queue_of = |pod: &k8s_openapi::api::core::v1::Pod| {
        let owner = pod.owner_references().iter().find(|o| o.kind == "AxTask")?;
        let namespace = pod.namespace()?;
        let task = ctx
            .tasks
            .get(&ObjectRef::new(&owner.name).within(&namespace))?;
        adaptive
            .contains(task.queue())
            .then(|| task.queue().to_string())
    };
    let mut seen = capacity::tally(
        pods.iter()
            .filter_map(|pod| Some((pod.as_ref(), queue_of(pod)?))),
        |node| {
            ctx.nodes
                .get(&ObjectRef::<Node>::new(node))
                .map_or_else(Vec::new, |n| capacity::pressure(&n))
        },
    );
    for name in adaptive {
        let observation = seen.remove(&name).unwrap_or_default();
        let Some((change, event)) = ctx.queues.lock().adapt(&name, observation, now) else {
            continue;
        };
        info!(
            queue = name,
            from = change.from,
            to = change.to,
            reason = change.reason.as_str(),
            "{}",
            change.message
        );
        if event && let Some(queue) = ctx.queue_store.get(&ObjectRef::new(&name)) {
            let (type_, reason) = if change.to < change.from {
                ("Warning", "ConcurrencyLowered")
            } else {
                ("Normal", "ConcurrencyRaised")
            };
            publish(ctx, &queue, type_, reason, &change.to_string());
        }
    }
}

async fn create_default_queue(ctx: &Ctx, concurrency: u32) {
    let api: Api<AxQueue> = Api::all(ctx.client.clone());
    let queue = AxQueue::new(
        DEFAULT_QUEUE,
        AxQueueSpec {
            concurrency: i32::try_from(concurrency).unwrap_or(i32::MAX),
            ..AxQueueSpec::default()
        },
    );
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, &queue).await {
        Ok(_) => info!(concurrency, "created the default AxQueue"),
        Err(e) if ApiError::of(&e) == ApiError::AlreadyExists => {}
        Err(e) => warn!(error = %e, "creating the default AxQueue failed"),
    }
}

fn report_metrics(ctx: &Ctx, reports: &[QueueReport]) {
    ctx.metrics.set_queue_pending(reports.iter().flat_map(|r| {
        r.pending
            .iter()
            .map(move |(priority, n)| ((r.name.clone(), priority.as_str()), *n))
    }));
    ctx.metrics.set_queue_slots(
        reports
            .iter()
            .filter(|r| r.exists)
            .map(|r| (r.name.as_str(), r.running, r.concurrency)),
    );
    ctx.metrics.set_queue_effective_concurrency(
        reports
            .iter()
            .filter(|r| r.exists)
            .map(|r| (r.name.as_str(), r.effective_concurrency)),
    );
    ctx.metrics.set_queue_keys(reports.iter().flat_map(|r| {
        let other = (r.other_keys.running + r.other_keys.waiting > 0).then_some((
            r.name.as_str(),
            "other",
            r.other_keys.running,
            r.other_keys.waiting,
        ));
        r.keys
            .iter()
            .map(|k| (r.name.as_str(), k.key.as_str(), k.running, k.waiting))
            .chain(other)
    }));
    for report in reports {
        for task_type in &report.open_circuits {
            ctx.metrics.set_circuit_open(&report.name, task_type, true);
        }
        let closed = ctx
            .queues
            .lock()
            .circuits_reported(&report.name, &report.open_circuits);
        for task_type in closed {
            ctx.metrics
                .set_circuit_open(&report.name, &task_type, false);
        }
    }
}
