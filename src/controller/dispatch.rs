//! The dispatch loop: asks the queues which waiting tasks get a slot and wakes their reconciles,
//! which start the attempts (the task reconciler is the only writer of a task's status). Woken when
//! a slot may have been freed, and on a short tick, because a held task can become dispatchable by
//! time alone (a circuit half-opens, retry tokens refill, a max-wait runs out).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{debug, info};

use super::cache::CachedTask;
use super::{Ctx, TaskKey, write};
use crate::api::TaskPhase;
use crate::core::queue::estimate::{self, Estimate};
use crate::core::queue::{Cached, Held, HeldReason, pending_task, rebuild};
use crate::core::worker;

/// How often held tasks are looked at again even when nothing woke the loop.
const TICK: Duration = Duration::from_millis(500);
/// How often the reasons of held tasks are compared with their `Queued` conditions.
const HELD_REFRESH_EVERY: Duration = Duration::from_secs(3);
/// At most this many tasks are woken per refresh for a moved estimate alone (a changed reason
/// always is): a long backlog whose estimates all drift costs a bounded write rate, the tasks
/// nearest the front first, the rest at the next refreshes.
const ESTIMATE_WRITES_PER_REFRESH: usize = 20;
/// How often the registry and the tracking are checked against the cache, for deleted tasks.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

pub async fn run(ctx: Ctx) {
    start(&ctx).await;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    let mut last_refresh = Instant::now();
    loop {
        tokio::select! {
            _ = ctx.dispatch_wanted.notified() => {}
            _ = tick.tick() => {}
            _ = sweep.tick() => sweep_deleted(&ctx),
        }
        let now = Timestamp::now();
        let (granted, held, preempted) = {
            let mut queues = ctx.queues.lock();
            let granted: Vec<TaskKey> =
                std::iter::from_fn(|| queues.next(now).map(|(key, _)| key)).collect();
            // Only full queues preempt: after the grants, a queue that still has a free slot
            // needs none.
            let preempted = queues.preemptions(now);
            // After the grants, what holds the rest describes a settled state.
            let refresh = last_refresh.elapsed() >= HELD_REFRESH_EVERY;
            let held = refresh.then(|| {
                queues.held_where(now, |key, reason, estimate| {
                    words_change(&ctx, key, reason, estimate, now).is_some()
                })
            });
            (granted, held, preempted)
        };
        for key in &granted {
            ctx.wake(key);
        }
        for (key, queue) in &preempted {
            info!(namespace = %key.0, name = %key.1, queue = %queue, "preempting a running attempt for a waiting task of higher priority");
            ctx.metrics.preempted(queue);
            ctx.wake(key);
        }
        if let Some(held) = held {
            last_refresh = Instant::now();
            wake_changed_reasons(&ctx, held);
        }
    }
}

/// How the `Queued` condition of waiting task `key` falls behind what holds it now: `Some(true)` when
/// it names another reason (or none), `Some(false)` when only its estimate moved
/// (`estimate::moved`), `None` when it still says it.
fn words_change(
    ctx: &Ctx,
    key: &TaskKey,
    reason: HeldReason,
    estimate: Option<&Estimate>,
    now: Timestamp,
) -> Option<bool> {
    let task = ctx.tasks.get(&ObjectRef::new(&key.1).within(&key.0))?;
    if task.phase() != Some(TaskPhase::Pending) {
        return None;
    }
    match task.queued() {
        None => Some(true),
        Some((written, _)) if written != reason.as_str() => Some(true),
        Some((_, message)) if estimate::moved(message, estimate, now) => Some(false),
        Some(_) => None,
    }
}

/// Before the first dispatch: wait for the caches, apply every AxQueue and every namespace's labels
/// (so no task is let in by a selector before its namespace is known), and count the tasks with an
/// attempt in flight as holding their slots, so no queue starts above its limits.
async fn start(ctx: &Ctx) {
    super::cache_synced(&ctx.tasks).await;
    super::cache_synced(&ctx.pods).await;
    super::cache_synced(&ctx.queue_store).await;
    super::cache_synced(&ctx.namespaces).await;
    super::queue::sync_from_store(ctx);
    super::namespace::sync_from_store(ctx);
    // A task dispatched just before a restart may have its pod and not yet a status saying so.
    let next_pod_exists = |task: &CachedTask, attempt: i32| {
        let name = worker::pod_name(&task.name_any(), attempt.saturating_add(1));
        let namespace = task.namespace().unwrap_or_default();
        ctx.pods
            .get(&ObjectRef::<Pod>::new(&name).within(&namespace))
            .is_some_and(|pod| {
                pod.metadata.deletion_timestamp.is_none()
                    && pod
                        .owner_references()
                        .iter()
                        .any(|o| Some(&o.uid) == task.uid().as_ref())
            })
    };
    let tasks = ctx.tasks.state();
    let cached = tasks.iter().map(|task| {
        let namespace = task.namespace().unwrap_or_default();
        let pending = task.phase() == Some(TaskPhase::Pending);
        let (cancel, next_attempt_at, attempt, entry) = match task.as_ref() {
            CachedTask::Whole(whole) => {
                let status = whole.status.as_ref();
                (
                    whole.spec.cancel,
                    status.and_then(|s| s.next_attempt_at),
                    status.map_or(0, |s| s.attempt),
                    pending.then(|| pending_task(whole)),
                )
            }
            CachedTask::Settled(settled) => (
                false,
                settled.facts.next_attempt_at,
                settled.facts.attempt,
                pending.then(|| settled.facts.pending(&namespace)),
            ),
        };
        let (priority, preemptible, scheduled_at, queue_key) = match task.as_ref() {
            CachedTask::Whole(whole) => {
                let status = whole.status.as_ref();
                (
                    whole.spec.priority,
                    whole.spec.preemptible,
                    status.and_then(|s| s.scheduled_at),
                    status.and_then(|s| s.queue_key.as_ref()),
                )
            }
            CachedTask::Settled(settled) => (
                settled.facts.priority,
                settled.facts.preemptible,
                None,
                settled.facts.queue_key.as_deref(),
            ),
        };
        Cached {
            key: TaskKey::new((namespace, task.name_any())),
            queue: task.queue(),
            task_type: task.task_type(),
            priority,
            preemptible,
            queue_key: queue_key.map(|k| k.value.as_str()),
            scheduled_at,
            phase: task.phase(),
            cancel,
            next_attempt_at,
            next_pod: next_pod_exists(task, attempt),
            pending: entry,
        }
    });
    let now = Timestamp::now();
    let mut queues = ctx.queues.lock();
    // Most settled tasks are already placed, as their watch events went by (`seen_in_passing`):
    // the log says what the queues hold, and how much of it this pass placed.
    let (placed_holding, placed_pending) = rebuild(&mut queues, cached, now);
    let reports = queues.reports(now);
    let holding: usize = reports.iter().map(|r| r.running).sum();
    let pending: usize = reports
        .iter()
        .map(|r| r.pending.iter().map(|(_, n)| n).sum::<usize>() + r.forbidden)
        .sum();
    info!(
        holding,
        pending, placed_holding, placed_pending, "queues rebuilt from the cache"
    );
}

/// Wakes the reconcile of every waiting task whose `Queued` condition does not say what holds it
/// now, or whose estimated start moved meaningfully (`estimate::moved`); the reconcile writes the
/// new condition. `held` are those tasks ([`words_change`]). One write per task whose reason or
/// estimate changed, never per tick, and at most [`ESTIMATE_WRITES_PER_REFRESH`] for estimates
/// alone.
fn wake_changed_reasons(ctx: &Ctx, mut held: Vec<Held>) {
    let now = Timestamp::now();
    // Nearest the front first: theirs are the estimates a person is waiting on.
    held.sort_by_key(|h| h.estimate.as_ref().map_or(u64::MAX, |e| e.position));
    let mut estimate_budget = ESTIMATE_WRITES_PER_REFRESH;
    for h in held {
        let wake = match words_change(ctx, &h.key, h.reason, h.estimate.as_ref(), now) {
            Some(true) => true,
            Some(false) if estimate_budget > 0 => {
                estimate_budget -= 1;
                true
            }
            _ => false,
        };
        if wake {
            ctx.wake(&h.key);
        }
    }
}

/// Drops tasks the registry holds that were deleted from the cluster (a deleted task is never
/// reconciled again), freeing their slots, and what is tracked for them.
fn sweep_deleted(ctx: &Ctx) {
    let gone = |key: &TaskKey| {
        ctx.tasks
            .get(&ObjectRef::new(&key.1).within(&key.0))
            .is_none()
    };
    let mut freed = false;
    {
        let mut queues = ctx.queues.lock();
        for key in queues.task_keys() {
            if gone(&key) {
                freed |= queues.remove(&key);
            }
        }
    }
    let tracked: BTreeSet<TaskKey> = ctx.tracking.keys().into_iter().collect();
    for key in tracked.iter().filter(|k| gone(k)) {
        ctx.tracking.forget(key);
    }
    if freed {
        ctx.dispatch_wanted.notify_one();
    }
    // A task deleted while its worker was stopping never looks at that pod again.
    for pod in ctx.pods.state() {
        free_if_unowned(&pod, &ctx.tasks, &ctx.client);
    }
}

/// Takes the outcome finalizer off a pod whose task is gone, replaced (another uid) or being
/// deleted: nobody will read its outcome, and a foreground deletion of the task waits for it.
/// Called for every pod event and by the sweep; the tasks' cache must be complete, or every pod
/// would look unowned.
pub fn free_if_unowned(pod: &Pod, tasks: &Store<CachedTask>, client: &kube::Client) {
    let held = pod
        .finalizers()
        .iter()
        .any(|f| f == worker::OUTCOME_FINALIZER);
    if !held || !super::cache_listed(tasks) {
        return;
    }
    let owner = pod.owner_references().iter().find(|o| o.kind == "AxTask");
    let unowned = owner.is_none_or(|o| {
        let key = (pod.namespace().unwrap_or_default(), o.name.clone());
        tasks
            .get(&ObjectRef::new(&key.1).within(&key.0))
            .is_none_or(|t| {
                t.uid().as_deref() != Some(o.uid.as_str())
                    || kube::Resource::meta(t.as_ref())
                        .deletion_timestamp
                        .is_some()
            })
    });
    if !unowned {
        return;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let pod = pod.clone();
    tokio::spawn(async move {
        if let Err(e) = write::remove_finalizer(&api, &pod, worker::OUTCOME_FINALIZER).await {
            debug!(pod = pod.name_any(), error = %e, "freeing an orphaned worker pod failed");
        }
    });
}
