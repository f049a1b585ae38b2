//! The AxTask reconciler: read the task, its worker pod and node from the caches, decide with
//! `core::task`, write the status once, then perform the side effects.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::{Ctx, Error, FIELD_MANAGER, Result, TaskKey, queue};
use crate::api::{AxTask, AxTaskStatus, HistoryEntry, TaskPhase};
use crate::core::queue::Outcome;
use crate::core::task::{self as core, Action, Clock, Decision, QueueState};
use crate::core::worker;

pub fn key(task: &AxTask) -> TaskKey {
    (task.namespace().unwrap_or_default(), task.name_any())
}

pub fn clock(ctx: &Ctx) -> Clock<'_> {
    Clock {
        now: jiff::Timestamp::now(),
        operator: &ctx.operator,
        unit_random: rand::random::<f64>(),
    }
}

#[tracing::instrument(skip_all, fields(namespace = task.namespace(), name = task.name_any(),
    attempt = task.status.as_ref().map(|s| s.attempt)))]
pub async fn reconcile(task: Arc<AxTask>, ctx: Ctx) -> Result<Requeue> {
    let _timer = ctx.metrics.reconcile_timer("axtask");
    // A pod missing from an incomplete cache would look deleted: decide only on complete caches.
    if !super::cache_listed(&ctx.pods) || !super::cache_listed(&ctx.nodes) {
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let status = task.status.clone().unwrap_or_default();
    let observed = status
        .worker
        .as_ref()
        .and_then(|name| observe_worker(&task, name, &ctx));
    let spec_error = core::validate(&task.spec).err();
    let clock = clock(&ctx);
    let decision = core::reconcile(
        &task.spec,
        &status,
        task.metadata.generation,
        observed.as_ref(),
        spec_error.as_deref(),
        &clock,
    );
    apply(&task, decision, &ctx).await
}

/// The worker pod of this task named `name`, if the cache has it. A pod with that name owned by
/// another object (e.g. an older task of the same name) is not ours and counts as missing.
fn observe_worker(task: &AxTask, name: &str, ctx: &Ctx) -> Option<worker::WorkerState> {
    let namespace = task.namespace()?;
    let pod = ctx
        .pods
        .get(&ObjectRef::<Pod>::new(name).within(&namespace))?;
    let uid = task.uid()?;
    if !pod.owner_references().iter().any(|o| o.uid == uid) {
        return None;
    }
    let node_ready = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(|node| {
            let node = ctx.nodes.get(&ObjectRef::new(node))?;
            let conditions = node.status.as_ref()?.conditions.as_ref()?;
            Some(
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"),
            )
        });
    Some(worker::observe(&pod, node_ready))
}

/// Writes the decision's status (if it changed), publishes its transitions, performs its actions
/// and tells the dispatcher where the task stands.
pub async fn apply(task: &AxTask, decision: Decision, ctx: &Ctx) -> Result<Requeue> {
    let key = key(task);
    let mut written = Arc::new(task.clone());
    if task.status.as_ref() != Some(&decision.status) {
        match write_status(task, &decision.status, ctx).await {
            Ok(updated) => written = Arc::new(updated),
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
                // Someone (often our own earlier write) changed the task: its newer version is on
                // its way through the watch and will be reconciled then.
                debug!("status write conflicted; waiting for the newer version");
                return Ok(Requeue::await_change());
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {
                return Ok(Requeue::await_change());
            }
            Err(e) => return Err(e),
        }
    }
    publish_transitions(&written, &decision.transitions, ctx);
    update_queue(
        &key,
        decision.queue,
        core::attempt_outcome(&decision),
        &written,
        ctx,
    );

    for action in &decision.actions {
        match action {
            Action::CreatePod => create_pod(&written, ctx).await?,
            Action::DeletePod {
                name,
                grace_seconds,
            } => delete_pod(task, name, *grace_seconds, ctx).await?,
            Action::Warn { reason, message } => {
                publish(&written, EventType::Warning, reason, message, ctx)
            }
            Action::SendCallback => ctx.callbacks.send(written.clone(), ctx.clone()),
            Action::DeleteTask => {
                let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &key.0);
                info!("deleting task: ttlSecondsAfterFinished passed");
                match api.delete(&key.1, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(match decision.requeue_after {
        // A little slack so the deadline has certainly passed when we look again.
        Some(after) => Requeue::requeue(after + Duration::from_millis(50)),
        None => Requeue::await_change(),
    })
}

/// Writes the whole status with server-side apply. The resourceVersion makes it conditional: a
/// decision taken on a stale copy fails with a conflict instead of overwriting newer state.
pub async fn write_status(task: &AxTask, status: &AxTaskStatus, ctx: &Ctx) -> Result<AxTask> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": AxTask::api_version(&()),
        "kind": AxTask::kind(&()),
        "metadata": { "name": task.name_any(), "resourceVersion": task.resource_version() },
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Ok(api
        .patch_status(&task.name_any(), &params, &Patch::Apply(&patch))
        .await?)
}

/// Tells the task's queue where the task stands: the outcome of an attempt that just ended first
/// (it frees the slot and feeds the circuit breaker), then whether it waits for dispatch.
fn update_queue(
    key: &TaskKey,
    state: QueueState,
    outcome: Option<Outcome>,
    task: &Arc<AxTask>,
    ctx: &Ctx,
) {
    let mut queues = ctx.queues.lock();
    let mut wake = outcome.is_some_and(|o| queues.finished(key, o, jiff::Timestamp::now()));
    match state {
        QueueState::Ready => {
            let taken = queues.upsert(
                key,
                &task.spec.queue,
                queue::pending_task(task),
                queue::version_of(task.as_ref()),
            );
            drop(queues);
            if taken {
                ctx.queued_copies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), task.clone());
                wake = true;
            }
        }
        QueueState::Running => {
            queues.mark_running(key, &task.spec.queue, &task.spec.task_type);
        }
        QueueState::Waiting | QueueState::Done => {
            wake |= queues.remove(key);
            drop(queues);
            ctx.queued_copies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
        }
    }
    if wake {
        ctx.dispatch_wanted.notify_one();
    }
}

/// Creates the worker pod of the current attempt. It already existing is success: the name is
/// deterministic, so this is how a restart or a second replica is kept from making a duplicate.
pub async fn create_pod(task: &Arc<AxTask>, ctx: &Ctx) -> Result<()> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let status = task.status.clone().unwrap_or_default();
    let payload = task
        .spec
        .payload
        .as_ref()
        .map(core::payload_json)
        .unwrap_or_else(|| "{}".into());
    let pod = worker::build_pod(task, status.attempt, &payload);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &pod,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 400 => {
            // The template is invalid: no retry can fix that.
            warn!(error = %e.message, "worker pod rejected");
            let decision = core::pod_rejected(&task.spec, &status, &e.message, &clock(ctx));
            Box::pin(apply(task, decision, ctx)).await.map(|_| ())
        }
        Err(e) => Err(e.into()),
    }
}

async fn delete_pod(
    task: &AxTask,
    name: &str,
    grace_seconds: Option<i64>,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = DeleteParams {
        grace_period_seconds: grace_seconds.map(|g| g as u32),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// One Event per transition, with the transition's CamelCase reason. Sent in the background:
/// Events are a record for people, never on the path that moves a task.
pub fn publish_transitions(task: &AxTask, transitions: &[HistoryEntry], ctx: &Ctx) {
    for t in transitions {
        record_metrics(task, t, ctx);
        let warning = matches!(
            t.to,
            TaskPhase::Failed | TaskPhase::TimedOut | TaskPhase::Dead
        );
        let kind = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let note = format!(
            "{} -> {} (attempt {}): {}",
            t.from.map_or("New", |p| p.as_str()),
            t.to,
            t.attempt,
            t.message
        );
        publish(task, kind, &t.reason, &note, ctx);
    }
}

fn record_metrics(task: &AxTask, t: &HistoryEntry, ctx: &Ctx) {
    let metrics = &ctx.metrics;
    let task_type = task.spec.task_type.as_str();
    metrics.transition(t.from.map_or("New", |p| p.as_str()), t.to.as_str());
    let status = task.status.as_ref();
    match t.to {
        TaskPhase::Pending if t.from.is_some() => {
            let kind = status
                .and_then(|s| s.last_failure.as_ref())
                .map_or("Unknown", |f| f.kind.as_str());
            metrics.retried(task_type, kind);
        }
        TaskPhase::Dead => {
            metrics.dead(task_type, &t.reason);
            ctx.queues.lock().count_dead(&task.spec.queue);
        }
        _ => {}
    }
    if t.to.is_terminal() {
        let since = status
            .and_then(|s| s.history.first())
            .map_or(t.time, |h| h.time);
        let took = std::time::Duration::try_from(t.time.duration_since(since)).unwrap_or_default();
        metrics.task_finished(task_type, t.to.as_str(), took);
    }
}

fn publish(task: &AxTask, type_: EventType, reason: &str, note: &str, ctx: &Ctx) {
    super::publish_event(&ctx.recorder, task, type_, reason, note);
}

pub fn error_policy(task: Arc<AxTask>, error: &Error, ctx: Ctx) -> Requeue {
    ctx.metrics.reconcile_error("axtask");
    warn!(namespace = task.namespace(), name = task.name_any(), %error, "reconcile failed");
    Requeue::requeue(Duration::from_secs(2))
}
