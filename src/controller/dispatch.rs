//! The dispatcher: takes eligible tasks from the queue and starts their next attempt
//! (Pending → Scheduled, then the worker pod). Woken by the reconciler, never polls per task.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, warn};

use super::task::{clock, create_pod, publish_transitions, write_status};
use super::{Ctx, Error, TaskKey};
use crate::api::AxTask;
use crate::core::task as core;

/// How often running slots are checked against the cache, to free those of deleted tasks.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Conflicting writes retried with a fresh copy before giving the task back to the reconciler.
const CONFLICT_RETRIES: usize = 3;

pub async fn run(ctx: Ctx) {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            _ = ctx.dispatch_wanted.notified() => {}
            _ = sweep.tick() => sweep_deleted(&ctx),
        }
        while let Some(key) = ctx.queue().take_next() {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                if let Err(e) = dispatch(&key, &ctx).await {
                    warn!(namespace = key.0, name = key.1, error = %e, "dispatch failed; task requeued");
                    ctx.queue().finished(&key);
                    // Give it back to the reconciler, which queues it again if it is still Pending.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if let Some(task) = ctx.tasks.get(&ObjectRef::new(&key.1).within(&key.0)) {
                        let _ = super::task::reconcile(task, ctx.clone()).await;
                    }
                }
            });
        }
    }
}

/// Frees the slots of tasks that were deleted while running.
fn sweep_deleted(ctx: &Ctx) {
    let mut queue = ctx.queue();
    let gone: Vec<TaskKey> = queue
        .running()
        .filter(|(ns, name)| ctx.tasks.get(&ObjectRef::new(name).within(ns)).is_none())
        .cloned()
        .collect();
    for key in &gone {
        queue.finished(key);
    }
    if !gone.is_empty() {
        drop(queue);
        ctx.dispatch_wanted.notify_one();
    }
}

async fn dispatch(key: &TaskKey, ctx: &Ctx) -> Result<(), Error> {
    let Some(mut task) = ctx.freshest_task(key) else {
        ctx.queue().finished(key);
        return Ok(());
    };
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &key.0);
    for _ in 0..CONFLICT_RETRIES {
        let status = task.status.clone().unwrap_or_default();
        let clock = clock(ctx);
        let Some(decision) = core::dispatch(&task.name_any(), &task.spec, &status, &clock) else {
            // Not dispatchable any more (canceled, already dispatched, …): the reconciler owns it.
            ctx.queue().finished(key);
            return Ok(());
        };
        match write_status(&task, &decision.status, ctx).await {
            Ok(written) => {
                let written = Arc::new(written);
                publish_transitions(&written, &decision.transitions, ctx);
                create_pod(&written, ctx).await?;
                // Dispatch latency: from eligible (queuedAt) to the worker pod created.
                if let Some(queued_at) = status.queued_at {
                    let latency = jiff::Timestamp::now().duration_since(queued_at);
                    let latency = std::time::Duration::try_from(latency).unwrap_or_default();
                    ctx.metrics.dispatched(latency);
                    debug!(namespace = key.0, name = key.1, latency_ms = latency.as_millis(), "dispatched");
                }
                return Ok(());
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
                // Our cached copy was stale: dispatch from the current one.
                match api.get_opt(&key.1).await? {
                    Some(latest) => task = Arc::new(latest),
                    None => {
                        ctx.queue().finished(key);
                        return Ok(());
                    }
                }
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {
                ctx.queue().finished(key);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
    ctx.queue().finished(key);
    Ok(())
}
