//! The dispatch loop: asks the queues' dispatchers for the next tasks and starts their next attempt
//! (Pending → Scheduled, then the worker pod). Woken by the reconcilers and the AxQueue watcher,
//! and on a short tick, because a held task can become dispatchable by time alone (a circuit
//! half-opens, retry tokens refill, a max-wait runs out).

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use super::queue::{self, Held};
use super::task::{clock, create_pod, publish_transitions, write_status};
use super::{Ctx, Error, TaskKey};
use crate::api::AxTask;
use crate::core::queue::Outcome;
use crate::core::task as core;

/// How often held tasks are looked at again even when nothing woke the loop.
const TICK: Duration = Duration::from_millis(500);
/// How often the reasons of held tasks are refreshed (written only where they changed).
const HELD_REFRESH_EVERY: Duration = Duration::from_secs(3);
/// How often the registry is checked against the cache, to drop tasks deleted meanwhile.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Conflicting writes retried with a fresh copy before giving the task back to the reconciler.
const CONFLICT_RETRIES: usize = 3;

pub async fn run(ctx: Ctx) {
    rebuild(&ctx).await;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    let mut last_refresh = Instant::now();
    let mut refreshing: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = ctx.dispatch_wanted.notified() => {}
            _ = tick.tick() => {}
            _ = sweep.tick() => sweep_deleted(&ctx),
        }
        let now = Timestamp::now();
        let (picked, held) = {
            let mut queues = ctx.queues.lock();
            let picked: Vec<(TaskKey, String)> = std::iter::from_fn(|| queues.next(now)).collect();
            // Right after a drain nothing waits only for a free slot that is about to be filled,
            // so the reasons describe a settled state.
            let refresh = last_refresh.elapsed() >= HELD_REFRESH_EVERY
                && refreshing.as_ref().is_none_or(|job| job.is_finished());
            let held: Option<Vec<Held>> = refresh.then(|| queues.held(now));
            (picked, held)
        };
        for (key, queue_name) in picked {
            let ctx = ctx.clone();
            tokio::spawn(async move { dispatch_or_give_back(key, queue_name, ctx).await });
        }
        if let Some(held) = held {
            last_refresh = Instant::now();
            refreshing = Some(tokio::spawn(queue::write_held_reasons(ctx.clone(), held)));
        }
    }
}

/// Before the first dispatch: wait for the caches, apply every AxQueue, and count the tasks already
/// dispatched (by this process before a restart, or by an earlier leader) as running, so no queue
/// starts above its limits. O(n) over the cached tasks, once.
async fn rebuild(ctx: &Ctx) {
    super::cache_synced(&ctx.tasks).await;
    super::cache_synced(&ctx.queue_store).await;
    queue::sync_from_store(ctx);
    let (running, pending) =
        queue::rebuild(&mut ctx.queues.lock(), &ctx.tasks.state(), Timestamp::now());
    info!(running, pending, "queues rebuilt from the cache");
}

/// Drops tasks the registry holds that were deleted from the cluster (a deleted task is never
/// reconciled again), freeing their slots.
fn sweep_deleted(ctx: &Ctx) {
    let mut queues = ctx.queues.lock();
    let mut freed = false;
    for key in queues.task_keys() {
        if ctx
            .tasks
            .get(&ObjectRef::new(&key.1).within(&key.0))
            .is_none()
        {
            freed |= queues.remove(&key);
        }
    }
    drop(queues);
    if freed {
        ctx.dispatch_wanted.notify_one();
    }
}

async fn dispatch_or_give_back(key: TaskKey, queue_name: String, ctx: Ctx) {
    let dispatched = match dispatch(&key, &queue_name, &ctx).await {
        Ok(dispatched) => dispatched,
        Err(e) => {
            warn!(namespace = key.0, name = key.1, error = %e, "dispatch failed; task requeued");
            false
        }
    };
    if dispatched {
        return;
    }
    // Not started: free the slot without blaming the type, and let the reconciler decide again
    // from the newest copy (it queues the task again if it is still Pending).
    if ctx
        .queues
        .lock()
        .finished(&key, Outcome::Aborted, Timestamp::now())
    {
        ctx.dispatch_wanted.notify_one();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    if let Some(task) = ctx.tasks.get(&ObjectRef::new(&key.1).within(&key.0)) {
        let _ = super::task::reconcile(task, ctx.clone()).await;
    }
}

/// Writes the dispatch decision and creates the worker pod. `Ok(false)`: the task was not
/// dispatchable any more (canceled, deleted, dispatched already) or kept conflicting.
async fn dispatch(key: &TaskKey, queue_name: &str, ctx: &Ctx) -> Result<bool, Error> {
    let Some(mut task) = ctx.freshest_task(key) else {
        return Ok(false);
    };
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &key.0);
    for _ in 0..CONFLICT_RETRIES {
        let status = task.status.clone().unwrap_or_default();
        let clock = clock(ctx);
        let Some(decision) = core::dispatch(&task.name_any(), &task.spec, &status, &clock) else {
            return Ok(false);
        };
        match write_status(&task, &decision.status, ctx).await {
            Ok(written) => {
                let written = Arc::new(written);
                ctx.queues
                    .lock()
                    .dispatch_written(key, queue::version_of(written.as_ref()));
                if let Some(queued_at) = status.queued_at {
                    let waited = clock.now.duration_since(queued_at);
                    ctx.metrics.queue_waited(
                        queue_name,
                        task.spec.priority.as_str(),
                        Duration::try_from(waited).unwrap_or_default(),
                    );
                }
                publish_transitions(&written, &decision.transitions, ctx);
                if let Err(e) = create_pod(&written, ctx).await {
                    // The task is Scheduled: its reconcile creates the missing pod.
                    warn!(namespace = key.0, name = key.1, error = %e, "creating the worker pod failed; the reconciler retries");
                    return Ok(true);
                }
                // Dispatch latency: from eligible (queuedAt) to the worker pod created.
                if let Some(queued_at) = status.queued_at {
                    let latency = Timestamp::now().duration_since(queued_at);
                    let latency = Duration::try_from(latency).unwrap_or_default();
                    ctx.metrics.dispatched(queue_name, latency);
                    debug!(
                        namespace = key.0,
                        name = key.1,
                        queue = queue_name,
                        latency_ms = latency.as_millis(),
                        "dispatched"
                    );
                }
                return Ok(true);
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
                // Our cached copy was stale: dispatch from the current one.
                match api.get_opt(&key.1).await? {
                    Some(latest) => task = Arc::new(latest),
                    None => return Ok(false),
                }
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}
