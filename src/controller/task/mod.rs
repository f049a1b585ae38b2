//! The AxTask reconciler (client required): read the task, every pod of it and their nodes from the
//! caches, decide with `core::task`, write the status once, then act on its pods. It is the only
//! writer of a task's status, and it starts attempts itself when the queue grants a slot, so the
//! status write at dispatch never races another writer. Its worker pods' reads and writes are in
//! [`pods`], what it reports of each transition (Events, metrics) in [`report`].

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, GetParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use tracing::{debug, info, warn};

mod exit;
mod pods;
mod report;
mod template;

pub use report::publish_transitions;
pub use template::wake_waiting as wake_tasks_waiting_for_templates;

use super::cache::{CachedTask, SettledTask};
use super::write::{self, ApiError};
use super::{Ctx, Error, Result, TaskKey, cache, task_key, version_of};
use crate::api::{AxTask, AxTaskStatus, TaskPhase, TemplateUse, TraceContext};
use crate::core::queue::key::KeySource;
use crate::core::queue::{holder, pending_of};
use crate::core::task::{self as core, Action, Clock, Decision, Inputs, QueueState, Refusal};
use crate::core::trace;
use crate::core::worker::WorkerState;
use pods::{
    Created, create_pod, kill_pod, observe_pod, pods_named, pods_of, read_pod, remove_finalizer,
    remove_pod,
};
use report::publish;

/// How soon to look again when the worker pod's name is taken by a pod this task does not own (an
/// older task of the same name whose pods the garbage collector has not removed yet).
const NAME_TAKEN_RETRY: Duration = Duration::from_secs(2);
/// How often a task looks again at a worker pod the caches do not show (its label removed).
const HIDDEN_POD_LOOK_AGAIN: Duration = Duration::from_secs(5);

pub fn clock(ctx: &Ctx) -> Clock<'_> {
    Clock {
        now: Timestamp::now(),
        operator: &ctx.operator,
        unit_random: rand::random::<f64>(),
    }
}

#[tracing::instrument(skip_all, fields(namespace = cached.namespace(), name = cached.name_any(),
    attempt = tracing::field::Empty, trace_id = tracing::field::Empty))]
pub async fn reconcile(cached: Arc<CachedTask>, ctx: Ctx) -> Result<Requeue> {
    let _timer = ctx.metrics.reconcile_timer("axtask");
    // A pod missing from an incomplete cache would look deleted: decide only on complete caches.
    if !super::cache_listed(&ctx.pods) || !super::cache_listed(&ctx.nodes) {
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let key = task_key(cached.as_ref());
    if kube::Resource::meta(cached.as_ref())
        .deletion_timestamp
        .is_some()
    {
        // Its pods go with it (owner references); it holds nothing any more.
        release(&key, &ctx);
        return Ok(Requeue::await_change());
    }
    if ctx.tracking.is_stale(&key, version_of(cached.as_ref())) {
        // Our own newer write is on its way through the watch and triggers the next reconcile.
        return Ok(Requeue::await_change());
    }
    let task = match cached.as_ref() {
        CachedTask::Whole(task) => task.clone(),
        CachedTask::Settled(settled) => {
            if let Some(requeue) = look_at_settled(&key, settled, &ctx) {
                return Ok(requeue);
            }
            match read_whole(&key, settled, &ctx).await? {
                Some(task) => task,
                None => {
                    release(&key, &ctx);
                    return Ok(Requeue::await_change());
                }
            }
        }
    };
    let attempt = task.status.as_ref().map_or(0, |s| s.attempt);
    let span = tracing::Span::current();
    span.record("attempt", attempt);
    if let Some(trace) = task.status.as_ref().and_then(|s| s.trace.as_ref()) {
        span.record("trace_id", trace.trace_id.as_str());
    }
    let template = match template::resolve_template(&task, &ctx).await? {
        template::Resolution::Ready(used) => used,
        template::Resolution::Done(requeue) => return Ok(requeue),
    };
    decide_on(task, key, template, ctx).await
}

/// A look at a settled task from its cached facts (see `cache::CachedTask`): `Some` when it changes
/// nothing — the queue learns where the task stands — and `None` when the whole task must be
/// decided on: a slot granted, something new to say, a spec edit, a pod, a TTL come due, or what
/// this process still has to do for it.
fn look_at_settled(key: &TaskKey, settled: &SettledTask, ctx: &Ctx) -> Option<Requeue> {
    if ctx.tracking.has_work(key) {
        return None;
    }
    let meta = &settled.metadata;
    let facts = &settled.facts;
    let uid = meta.uid.as_deref()?;
    let pods = pods_named(key, uid, ctx);
    let now = Timestamp::now();
    let (idle, freed) = {
        // One hold of the lock: a slot granted between the look and the upsert would be taken back.
        let mut queues = ctx.queues.lock();
        let held = queues.held_reason(key, now);
        let held = held
            .as_ref()
            .map(|(reason, message)| (*reason, message.as_str()));
        let key_source = queues.key_source(&facts.queue);
        let idle = facts.idle(
            meta.generation,
            queues.is_granted(key),
            held,
            key_source,
            &pods,
            now,
        )?;
        let freed = match idle.queue {
            QueueState::Ready => {
                queues.upsert(key, &facts.queue, facts.pending(&key.0));
                true
            }
            _ => queues.remove(key),
        };
        (idle, freed)
    };
    if freed {
        ctx.dispatch_wanted.notify_one();
    }
    Some(match idle.look_again {
        Some(at) => {
            let wait = Duration::try_from(at.duration_since(now)).unwrap_or_default();
            Requeue::requeue(wait + Duration::from_millis(50))
        }
        None => Requeue::await_change(),
    })
}

/// Whether the watch event of `cached` is taken care of where it arrives, queueing no reconcile:
/// a settled task that a look leaves as it is, with nothing to look at again later (its place in
/// the queue is kept here). A restart lists every task, and 100,000 waiting ones would otherwise
/// queue 100,000 reconciles ahead of the first dispatch's (two minutes, measured). A reconcile
/// still comes when the dispatcher grants a slot or what holds the task changes (`Context::wake`).
pub fn seen_in_passing(cached: &CachedTask, ctx: &Ctx) -> bool {
    let CachedTask::Settled(settled) = cached else {
        return false;
    };
    // As in `reconcile`: a pod missing from an incomplete cache would look absent.
    if !super::cache_listed(&ctx.pods) || !super::cache_listed(&ctx.nodes) {
        return false;
    }
    let key = task_key(cached);
    if ctx.tracking.is_stale(&key, version_of(cached)) {
        return true;
    }
    look_at_settled(&key, settled, ctx) == Some(Requeue::await_change())
}

/// The whole task of a settled one, as of (at least) the version the cache holds; `None` when it
/// is gone. A read of the API server's watch cache.
async fn read_whole(
    key: &TaskKey,
    settled: &SettledTask,
    ctx: &Ctx,
) -> Result<Option<Arc<AxTask>>> {
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &key.0);
    let params = settled
        .metadata
        .resource_version
        .as_deref()
        .map_or_else(GetParams::default, GetParams::at);
    match api.get_with(&key.1, &params).await {
        Ok(task) if task.metadata.uid == settled.metadata.uid => Ok(Some(Arc::new(task))),
        Ok(_) => Ok(None),
        Err(e) if ApiError::of(&e) == ApiError::NotFound => Ok(None),
        Err(e) => Err(Error::Read("the task", e)),
    }
}

/// The task with its payload when its queue takes keys from the payload and its key is to be
/// worked out: not recorded from that source yet, or its spec edited since. The cache keeps no
/// payloads: the one it arrived with if still at hand (`fresh`), else a read.
async fn with_payload_if_keyed(task: Arc<AxTask>, key: &TaskKey, ctx: &Ctx) -> Result<Arc<AxTask>> {
    let status = task.status.as_ref();
    let from_payload = {
        let queues = ctx.queues.lock();
        match queues.key_source(&task.spec.queue) {
            Some(source @ KeySource::Payload { .. }) => {
                !source.recorded(status.and_then(|s| s.queue_key.as_ref()))
                    || status.and_then(|s| s.observed_generation) != task.metadata.generation
            }
            _ => false,
        }
    };
    if !from_payload || !cache::is_stripped(&task) {
        return Ok(task);
    }
    if let Some(full) = ctx.fresh.take(key, &task) {
        return Ok(Arc::new(full));
    }
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &key.0);
    match api.get_opt(&key.1).await {
        Ok(Some(full)) if full.metadata.uid == task.metadata.uid => Ok(Arc::new(full)),
        Ok(_) => Ok(task),
        Err(e) => Err(Error::Read("the task", e)),
    }
}

/// Decides on the whole task and carries the decision out.
async fn decide_on(
    task: Arc<AxTask>,
    key: TaskKey,
    template: Option<TemplateUse>,
    ctx: Ctx,
) -> Result<Requeue> {
    let callback = ctx.tracking.take_callback(&key);
    let spec_error = cache::spec_error(&task);
    let main_has_probe = cache::main_has_probe(&task);
    let mut current = with_payload_if_keyed(task, &key, &ctx).await?;
    let mut refused: Option<Refusal> = None;
    // Pods the caches do not show and the API server has (see `read_pod`), and the attempts asked.
    let mut hidden: Vec<WorkerState> = Vec::new();
    let mut asked: Vec<i32> = Vec::new();
    // A pod the API server refuses is recorded in a second decision; a pod found by asking, in one
    // more.
    for _ in 0..4 {
        let written = current.status.clone().unwrap_or_default();
        // A status decided and put off is where this look starts from, as if it were written.
        let unwritten = ctx
            .tracking
            .unwritten(&key, current.uid().as_deref(), &written);
        let status = unwritten.clone().unwrap_or_else(|| written.clone());
        let mut pods = pods_of(&current, &key, &ctx);
        pods.extend(
            hidden
                .iter()
                .filter(|h| !pods.iter().any(|p| p.name == h.name))
                .cloned()
                .collect::<Vec<_>>(),
        );
        let clock = clock(&ctx);
        let (granted, held, draining, preempted, queue_key) = {
            let queues = ctx.queues.lock();
            // A queue not known yet leaves the key recorded as it is, and so does a task without
            // its payload: its key from the payload is recorded and current (see
            // `with_payload_if_keyed`).
            let queue_key = match queues.key_source(&current.spec.queue) {
                Some(KeySource::Payload { .. }) if cache::is_stripped(&current) => {
                    status.queue_key.clone()
                }
                Some(source) => source.key_of(
                    current.metadata.labels.as_ref(),
                    current.spec.payload.as_ref(),
                ),
                None => status.queue_key.clone(),
            };
            (
                queues.is_granted(&key),
                queues.held_reason(&key, clock.now),
                queues.drains(&current.spec.queue),
                queues.is_preempted(&key),
                queue_key,
            )
        };
        let name = current.name_any();
        let trace = trace_of(&current, &status, &ctx);
        let mut inputs = Inputs {
            task_name: &name,
            spec: &current.spec,
            status: &status,
            written: unwritten.is_some().then_some(&written),
            generation: current.metadata.generation,
            spec_error: spec_error.as_deref(),
            main_has_probe,
            pods: &pods,
            granted,
            held: held
                .as_ref()
                .map(|(reason, message)| (*reason, message.as_str())),
            queue_key: queue_key.as_ref(),
            trace: trace.as_ref(),
            draining,
            preempted,
            refused: refused.as_ref(),
            callback: callback.as_ref().map(|(r, m)| (*r, m.as_str())),
            template: template.as_ref(),
            exit_handler: exit::handler_phase(&current, &ctx),
            fan_out_item: core::is_fan_out_item(&current),
            progress_write_delay: ctx.progress_write_delay,
        };
        let mut decision = core::decide(&inputs, &clock);
        if decision.behind {
            debug!(
                "a pod of a later attempt than this status knows exists; waiting for the task's newer version"
            );
            ctx.queues.lock().hold(
                &key,
                &current.spec.queue,
                holder(&current.spec, current.status.as_ref()),
            );
            return Ok(Requeue::requeue(core::BEHIND_RETRY));
        }
        if let Some(attempt) = decision.assumes_gone.filter(|a| !asked.contains(a)) {
            asked.push(attempt);
            if let Some(pod) = read_pod(&current, attempt, &ctx).await? {
                warn!(
                    pod = pod.name_any(),
                    "a worker pod missing from the cache still exists; deciding on it"
                );
                hidden.push(observe_pod(&pod, &ctx));
                continue;
            }
        }
        let mut held_now = None;
        if decision.queue == QueueState::Ready && !granted {
            if offer(&key, &current, &decision, &ctx) {
                // The queue had a free slot for it now: new (or due) → Scheduled in one write.
                inputs.granted = true;
                decision = core::decide(&inputs, &clock);
            } else {
                // It waits: its first write says what holds it, so the refresh has nothing to add.
                held_now = ctx.queues.lock().held_reason(&key, clock.now);
            }
        }
        if let Some(now_held) = held_now.as_ref().filter(|h| Some(*h) != held.as_ref()) {
            inputs.held = Some((now_held.0, now_held.1.as_str()));
            decision = core::decide(&inputs, &clock);
        }
        match apply(&current, &key, decision, &ctx).await? {
            // No event of a pod the cache does not show comes: look at it again soon.
            Applied::Done(_) if !hidden.is_empty() => {
                return Ok(Requeue::requeue(HIDDEN_POD_LOOK_AGAIN));
            }
            Applied::Done(requeue) => return Ok(requeue),
            Applied::Refused(written, refusal) => {
                current = written;
                refused = Some(refusal);
            }
        }
    }
    Ok(Requeue::requeue(Duration::from_secs(1)))
}

/// The trace a task without one records while traces are exported (`core::trace::context_of`):
/// the submitter's, from its `ax.dev/traceparent`, or one of its own. A traceparent that does not
/// parse is reported and a trace of its own started.
fn trace_of(task: &AxTask, status: &AxTaskStatus, ctx: &Ctx) -> Option<TraceContext> {
    let sampler = ctx.traces.sampler()?;
    if status.trace.is_some() || status.phase.is_some_and(TaskPhase::is_terminal) {
        return None;
    }
    let uid = task.uid()?;
    let (trace, invalid) = trace::context_of(
        &uid,
        cache::traceparent(task),
        cache::tracelink(task),
        sampler,
    );
    if let Some(invalid) = invalid {
        publish(
            task,
            EventType::Warning,
            "InvalidTraceparent",
            &invalid.to_string(),
            ctx,
        );
    }
    Some(trace)
}

/// Offers a task that waits for a slot to its queue: one dispatch step runs now. Returns whether it
/// was this task that got the slot; another task that got it is woken.
fn offer(key: &TaskKey, task: &AxTask, decision: &Decision, ctx: &Ctx) -> bool {
    let created = task.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let pending = pending_of(&key.0, &task.spec, &decision.status, created);
    let mut queues = ctx.queues.lock();
    queues.upsert(key, &task.spec.queue, pending);
    match queues.next(Timestamp::now()) {
        Some((picked, _)) if picked == *key => true,
        Some((other, _)) => {
            drop(queues);
            ctx.wake(&other);
            false
        }
        None => false,
    }
}

enum Applied {
    Done(Requeue),
    /// The API server refused the worker pod: decide again on the task as written.
    Refused(Arc<AxTask>, Refusal),
}

/// Writes the decision's status (if it changed), publishes its transitions, tells the queue where
/// the task stands, and performs its actions. A status the decision lets wait (`write_by`) is not
/// written yet.
async fn apply(
    task: &Arc<AxTask>,
    key: &TaskKey,
    decision: Decision,
    ctx: &Ctx,
) -> Result<Applied> {
    let create = decision.actions.contains(&Action::CreatePod);
    // The whole task, for a pod created before or beside the status write: the one the watch just
    // delivered, if it is still at hand, or the one just read (a task that waited without being
    // settled gets its pod from the whole task its status write returns).
    let whole = if create && (decision.dispatched || decision.write_by.is_some()) {
        let full = if cache::is_stripped(task) {
            ctx.fresh.take(key, task)
        } else {
            // Read whole a moment ago (a settled task that was granted its slot).
            Some(task.as_ref().clone())
        };
        full.map(|mut full| {
            full.status = Some(decision.status.clone());
            full
        })
    } else {
        None
    };
    if let Some(by) = decision.write_by
        && (!create || whole.is_some())
    {
        return put_off(task, key, decision, whole, Some(by), ctx).await;
    }
    // Progress whose delay ran out waits its turn behind other due progress writes: an outcome
    // may yet carry it (see `core::task::ProgressLine`).
    if decision.write_by.is_none()
        && decision.progress_only
        && decision.actions.is_empty()
        && !ctx.tracking.progress_may_go(key)
    {
        return put_off(task, key, decision, None, None, ctx).await;
    }
    // A dispatch whose task arrived whole a moment ago creates its pod beside the status write. If
    // the write then does not land, the pod is of an attempt the status does not have yet: the next
    // decision sees it (see `pods_of`) and takes the attempt up with it. A spec edit that caused
    // the conflict then applies from the next attempt on, as if it had come just after dispatch.
    let beside = whole.filter(|_| decision.dispatched);
    let mut created_beside = None;
    let mut written = task.clone();
    if task.status.as_ref() != Some(&decision.status) {
        let write = write::task_status(&ctx.client, task, &decision.status);
        let result = match &beside {
            Some(full) => {
                let (result, created) = tokio::join!(write, create_pod(full, key, ctx));
                created_beside = Some(created);
                result
            }
            None => write.await,
        };
        match landed(result, key, ctx)? {
            Some(updated) => written = updated,
            None => return Ok(Applied::Done(Requeue::await_change())),
        }
    }
    publish_transitions(task.status.as_ref(), &written, &decision.transitions, ctx);
    update_queue(key, &written, &decision, ctx);

    let mut requeue = decision.requeue_after;
    for action in &decision.actions {
        match action {
            Action::CreatePod => match match created_beside.take() {
                Some(created) => created?,
                None => create_pod(&written, key, ctx).await?,
            } {
                Created::Yes => {}
                Created::NameTaken => {
                    requeue = Some(requeue.map_or(NAME_TAKEN_RETRY, |r| r.min(NAME_TAKEN_RETRY)));
                }
                Created::Refused(refusal) => return Ok(Applied::Refused(written, refusal)),
            },
            Action::KillPod {
                name,
                uid,
                grace_seconds,
                keep_outcome,
            } => kill_pod(&written, name, uid, *grace_seconds, *keep_outcome, ctx).await?,
            Action::RemoveFinalizer { name, uid } => {
                remove_finalizer(&written, name, uid, ctx).await?
            }
            Action::RemovePod { name, uid } => remove_pod(&written, key, name, uid, ctx).await?,
            Action::Warn { reason, message } => {
                publish(&written, EventType::Warning, reason.as_str(), message, ctx)
            }
            Action::SendCallback => ctx.callbacks.send(written.clone(), ctx.clone()),
            Action::CreateExitHandler => exit::create_handler(&written, ctx).await?,
            Action::DeleteTask if ctx.tracking.deletion_sent(key) => {}
            Action::DeleteTask => {
                let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &key.0);
                info!("deleting task: ttlSecondsAfterFinished passed");
                if let Err(e) = api.delete(&key.1, &DeleteParams::background()).await
                    && ApiError::of(&e) != ApiError::NotFound
                {
                    return Err(Error::DeleteTask(e));
                }
            }
        }
    }
    Ok(Applied::Done(match requeue {
        // A little slack so the deadline has certainly passed when we look again.
        Some(after) => Requeue::requeue(after + Duration::from_millis(50)),
        None => Requeue::await_change(),
    }))
}

/// A decision whose status may wait (`Decision::write_by`): the queue learns where the task
/// stands and the current attempt's pod is created now; the status is decided again, from the pods,
/// at the next look — when the worker changes, or at `by` — and written then. Without `by` it is
/// due progress waiting its turn: the next look is when the worker changes or the turn comes
/// (`pace_progress_writes`). Nothing is published until it is written, so transitions are counted
/// once.
async fn put_off(
    task: &Arc<AxTask>,
    key: &TaskKey,
    decision: Decision,
    whole: Option<AxTask>,
    by: Option<Timestamp>,
    ctx: &Ctx,
) -> Result<Applied> {
    update_queue(key, task, &decision, ctx);
    let written = task.status.clone().unwrap_or_default();
    ctx.tracking
        .put_off(key, task.uid(), written, decision.status.clone());
    if let Some(whole) = whole {
        match create_pod(&whole, key, ctx).await? {
            Created::Yes => {}
            Created::NameTaken => return Ok(Applied::Done(Requeue::requeue(NAME_TAKEN_RETRY))),
            // A refusal is decided on the dispatch as written: write it now.
            Created::Refused(refusal) => {
                let result = write::task_status(&ctx.client, task, &decision.status).await;
                return Ok(match landed(result, key, ctx)? {
                    Some(written) => {
                        publish_transitions(
                            task.status.as_ref(),
                            &written,
                            &decision.transitions,
                            ctx,
                        );
                        Applied::Refused(written, refusal)
                    }
                    None => Applied::Done(Requeue::await_change()),
                });
            }
        }
    }
    let Some(by) = by else {
        ctx.tracking.wait_for_turn(key);
        ctx.progress_due.notify_one();
        return Ok(Applied::Done(Requeue::await_change()));
    };
    let wait = Duration::try_from(by.duration_since(Timestamp::now())).unwrap_or_default();
    // A little slack so the deadline has certainly passed when we look again.
    Ok(Applied::Done(Requeue::requeue(
        wait + Duration::from_millis(50),
    )))
}

/// Lets due progress writes through at `per_second`, in the order they fell due: each task let
/// through is reconciled, and its status written then. One timer for the whole line, ticking only
/// while someone waits.
pub async fn pace_progress_writes(ctx: Ctx, per_second: u32) {
    let tick = Duration::from_secs(1) / per_second.max(1);
    loop {
        let (through, more) = ctx.tracking.progress_turns(Timestamp::now());
        for key in &through {
            ctx.wake(key);
        }
        if more {
            tokio::time::sleep(tick).await;
        } else {
            ctx.progress_due.notified().await;
        }
    }
}

/// The task as a status write left it, or `None` when the write did not land for a reason the
/// next event repairs: someone else changed the task (its newer version is on its way through the
/// watch), or it is gone.
fn landed(result: Result<AxTask>, key: &TaskKey, ctx: &Ctx) -> Result<Option<Arc<AxTask>>> {
    match result {
        Ok(updated) => {
            ctx.tracking.wrote(key, version_of(&updated));
            ctx.tracking.status_written(key);
            Ok(Some(Arc::new(updated)))
        }
        Err(e) => match ApiError::of_result(&e) {
            ApiError::Conflict => {
                debug!("status write conflicted; waiting for the newer version");
                Ok(None)
            }
            ApiError::NotFound => {
                release(key, ctx);
                Ok(None)
            }
            _ => Err(e),
        },
    }
}

/// Tells the task's queue where it stands: the outcome of an attempt that just ended first (it
/// feeds the circuit breaker), then whether it holds a slot, waits for one, or neither.
fn update_queue(key: &TaskKey, task: &AxTask, decision: &Decision, ctx: &Ctx) {
    let now = Timestamp::now();
    let spec = &task.spec;
    let mut queues = ctx.queues.lock();
    if let Some(outcome) = decision.outcome {
        queues.record_outcome(key, outcome, now);
    }
    if decision.dispatched {
        queues.dispatched(key);
    }
    let freed = match decision.queue {
        QueueState::Ready => {
            let created = task.metadata.creation_timestamp.as_ref().map(|t| t.0);
            queues.upsert(
                key,
                &spec.queue,
                pending_of(&key.0, spec, &decision.status, created),
            );
            true
        }
        QueueState::Holding => {
            queues.hold(key, &spec.queue, holder(spec, Some(&decision.status)));
            false
        }
        QueueState::Waiting | QueueState::Done => queues.remove(key),
    };
    drop(queues);
    if freed || decision.outcome.is_some() {
        ctx.dispatch_wanted.notify_one();
    }
}

/// The task is gone or going: it holds nothing, and nothing is tracked for it.
fn release(key: &TaskKey, ctx: &Ctx) {
    if ctx.queues.lock().remove(key) {
        ctx.dispatch_wanted.notify_one();
    }
    ctx.tracking.forget(key);
    ctx.fresh.forget(key);
}

pub fn error_policy(task: Arc<CachedTask>, error: &Error, ctx: Ctx) -> Requeue {
    let category = error.category();
    ctx.metrics
        .reconcile_error("axtask", error.step(), category.as_str());
    warn!(namespace = task.namespace(), name = task.name_any(), %error, category = category.as_str(), "reconcile failed");
    Requeue::requeue(category.retry_after())
}
