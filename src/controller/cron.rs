//! The AxCron reconciler: read the cron and its children (the AxTasks and AxDags it controls)
//! from the shared caches, decide with `core::cron`, write the status (the firings first,
//! as `pendingChildren`), then cancel (Replace), create the children due
//! (`<cron>-<scheduled unix time>`) and delete those beyond the history limits. Woken by the cron,
//! by its children, and by a timer at the next firing.
//!
//! Idempotent across restarts and failover: a firing is recorded before its child exists, so a
//! failed write creates nothing and a time is never decided twice, even when its child is gone
//! already (a TTL of 0); a child's name is its scheduled time, so a recorded firing created again
//! after a crash meets the existing child (409).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::expected::Sight;
use super::write::{self, ApiError, api_message};
use super::{Ctx, Error, FIELD_MANAGER, Result};
use crate::api::{
    ANNOTATION_CATCH_UP, AxCron, AxCronStatus, AxDag, AxTask, DagPhase, LABEL_CRON,
    LABEL_SCHEDULED_TIME, PendingChild, TaskPhase,
};
use crate::core::conditions;
use crate::core::cron::status::{self, ChildKind, ChildState, Outcome};
use crate::core::cron::{
    self as core, Child, Decision, Finished, Policy, Schedule, Skip, SkipReason,
};
use crate::core::task::is_final;

/// The `controller` label of the reconcile metrics.
const CONTROLLER: &str = "axcron";

/// Longest sleep between two reconciles of a cron, whatever its schedule: the status (active
/// children) is refreshed by child events anyway; this bounds the damage of a lost timer.
const MAX_SLEEP: Duration = Duration::from_secs(600);

/// Runs the AxCron controller until a shutdown signal: `crons` is the informer behind `ctx.crons`,
/// `children_changed` the crons whose children (tasks or DAGs) the informers saw change.
pub async fn run(
    ctx: Ctx,
    crons: impl Stream<Item = Result<AxCron, watcher::Error>> + Send + 'static,
    children_changed: impl Stream<Item = ObjectRef<AxCron>> + Send + 'static,
) {
    let controller = Controller::for_stream(crons, ctx.crons.clone())
        .reconcile_on(children_changed)
        .with_config(super::run::controller_config())
        .shutdown_on_signal();
    info!("AxCron controller running");
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "cron reconcile");
            }
        })
        .await;
}

#[tracing::instrument(skip_all, fields(namespace = cron.namespace(), name = cron.name_any()))]
pub async fn reconcile(cron: Arc<AxCron>, ctx: Ctx) -> Result<Requeue> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    // A child missing from an incomplete cache would be created again: decide on complete ones.
    if !super::cache_listed(&ctx.tasks) || !super::cache_listed(&ctx.dags) {
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    if cron.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references.
        return Ok(Requeue::await_change());
    }
    let uid = cron.uid().ok_or(Error::Incomplete("uid"))?;
    let now = Timestamp::now();
    let before = cron.status.clone().unwrap_or_default();
    let kind = if cron.spec.dag.is_some() {
        ChildKind::Dag
    } else {
        ChildKind::Task
    };
    let recorded: Vec<core::Firing> = before
        .pending_children
        .iter()
        .map(status::firing_of)
        .collect();
    let mut children = owned_children(&cron, &uid, &ctx);
    add_expected(&uid, kind, &recorded, &mut children, &ctx);

    let (schedule, policy) = match core::validate(&cron, &uid) {
        Ok(valid) => valid,
        Err(invalid) => {
            let message = invalid.to_string();
            let status = core::cron_status(
                &cron,
                &before,
                &children,
                None,
                Some(&message),
                &recorded,
                now,
            );
            if status::newly_invalid(&before, &message) {
                let reason = conditions::reason::INVALID_SPEC;
                publish(&cron, EventType::Warning, reason, &message, &ctx);
            }
            write_status(&cron, &before, &status, false, &ctx).await?;
            return Ok(Requeue::await_change());
        }
    };

    let handled_until = before
        .last_handled_time
        .or(before.last_schedule_time)
        .or_else(|| cron.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let present: HashSet<String> = children.iter().map(|c| c.name.clone()).collect();
    let is_present = |name: &str| present.contains(name);
    // A recorded firing whose child was never created counts as its (active) child: it is
    // created below, after the status write, and no later decision fires its time again.
    let mut core_children: Vec<Child> = children
        .iter()
        .map(|c| Child {
            name: c.name.clone(),
            scheduled: c.scheduled,
            active: c.outcome == Outcome::Active,
        })
        .collect();
    core_children.extend(
        core::recorded_missing(&recorded, is_present)
            .into_iter()
            .map(|f| Child {
                name: f.name.clone(),
                scheduled: f.scheduled,
                active: true,
            }),
    );
    let decision = core::decide(&core::Input {
        cron: &cron.name_any(),
        schedule: &schedule,
        policy: &policy,
        handled_until,
        now,
        children: &core_children,
    });
    let create = core::to_create(&recorded, is_present, &decision);
    for firing in &create {
        children.push(ChildState {
            name: firing.name.clone(),
            scheduled: firing.scheduled,
            kind,
            outcome: Outcome::Active,
            canceling: false,
        });
    }
    children.sort_by(|a, b| a.scheduled.cmp(&b.scheduled).then(a.name.cmp(&b.name)));

    // Status before children: the firings (lastHandledTime, and the children as pending) are
    // written first, conditional on the resourceVersion this decision read (even when the status
    // is unchanged, as when only re-creating a recorded child), and children are created only once
    // that lands. A decision on a stale copy (behind the cron's own last write, whose child may be
    // deleted by now: its TTL, the history limit) then conflicts instead of firing a time twice,
    // and a write that fails leaves nothing created.
    let status = core::cron_status(
        &cron,
        &before,
        &children,
        Some(&decision),
        None,
        &create,
        now,
    );
    if !write_status(&cron, &before, &status, !create.is_empty(), &ctx).await? {
        // A newer version of the cron is on its way; decide again on it.
        return Ok(Requeue::requeue(Duration::from_secs(1)));
    }
    cancel_replaced(&cron, &decision, &children, &ctx).await?;
    let mut answered: HashSet<String> = HashSet::new();
    for firing in &create {
        match create_child(&cron, &uid, firing, &ctx).await? {
            Created::Yes => {
                let now = Instant::now();
                ctx.cron_children
                    .created(&uid, &firing.name, firing.scheduled, now);
                publish_fired(&cron, &schedule, firing, &ctx);
            }
            Created::Existed => {}
            Created::NameTaken(message) | Created::Rejected(message) => {
                publish(&cron, EventType::Warning, "CreateFailed", &message, &ctx);
            }
        }
        answered.insert(firing.name.clone());
    }
    for skip in &decision.skipped {
        publish_skip(&cron, &schedule, &policy, skip, &ctx);
    }
    // Answered: off the pending list (the next write would drop them too, but it may conflict).
    confirm_pending(&cron, &status.pending_children, &answered, &ctx).await;
    delete_beyond_history(&cron, &mut children, &ctx).await?;

    Ok(match decision.wake_at {
        Some(wake_at) => {
            let wait = wake_at.duration_since(Timestamp::now());
            // A little after the firing time, never a busy loop just before it.
            let wait = Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(20);
            Requeue::requeue(wait.min(MAX_SLEEP))
        }
        None => Requeue::await_change(),
    })
}

/// The children of this cron in the caches: AxTasks and AxDags in its namespace whose controller
/// is this cron (by uid, so the children of an older cron of the same name do not count). Looked
/// up through the owner indexes: a reconcile reads its own children, not every cron's.
fn owned_children(cron: &AxCron, uid: &str, ctx: &Ctx) -> Vec<ChildState> {
    let namespace = cron.namespace();
    let prefix = format!("{}-", cron.name_any());
    let mut children = Vec::new();
    let tasks = ctx.tasks_by_owner.children_of(uid);
    for task in tasks
        .iter()
        .filter_map(|key| ctx.tasks.get(&key.object_ref())?.child().cloned())
    {
        if task.namespace() != namespace || !is_controlled_by(task.as_ref(), uid) {
            continue;
        }
        let Some(scheduled) = scheduled_time(task.as_ref(), &prefix) else {
            continue;
        };
        let phase = task.status.as_ref().and_then(|s| s.phase);
        // Terminal while its worker still stops (a canceled or replaced child): active, so
        // `Forbid` does not start the next child beside that worker.
        let stopping = task
            .status
            .as_ref()
            .is_some_and(|s| phase.is_some_and(TaskPhase::is_terminal) && !is_final(s));
        let outcome = match phase {
            _ if stopping => Outcome::Active,
            Some(TaskPhase::Succeeded) => {
                Outcome::Succeeded(task.status.as_ref().and_then(|s| s.finished_at))
            }
            Some(TaskPhase::Dead | TaskPhase::Canceled) => Outcome::Failed,
            _ => Outcome::Active,
        };
        children.push(ChildState {
            name: task.name_any(),
            scheduled,
            kind: ChildKind::Task,
            outcome,
            canceling: task.spec.cancel,
        });
    }
    let dags = ctx.dags_by_owner.children_of(uid);
    for dag in dags
        .iter()
        .filter_map(|key| ctx.dags.get(&key.object_ref()))
    {
        if dag.namespace() != namespace || !is_controlled_by(dag.as_ref(), uid) {
            continue;
        }
        let Some(scheduled) = scheduled_time(dag.as_ref(), &prefix) else {
            continue;
        };
        let phase = dag.status.as_ref().and_then(|s| s.phase);
        let outcome = match phase {
            Some(DagPhase::Succeeded) => {
                Outcome::Succeeded(dag.status.as_ref().and_then(|s| s.finished_at))
            }
            Some(DagPhase::Failed | DagPhase::Canceled) => Outcome::Failed,
            _ => Outcome::Active,
        };
        children.push(ChildState {
            name: dag.name_any(),
            scheduled,
            kind: ChildKind::Dag,
            outcome,
            canceling: dag.spec.cancel,
        });
    }
    children.sort_by(|a, b| a.scheduled.cmp(&b.scheduled).then(a.name.cmp(&b.name)));
    children
}

/// Adds the children created by this process that the caches have not shown yet (as active),
/// forgetting those the caches now show and those too old (of every cron). One still `recorded`
/// as pending is kept (and added when the cache shows it) until the pending list drops it: had it
/// vanished meanwhile (a TTL of 0), it would look never created, and be created again.
fn add_expected(
    uid: &str,
    kind: ChildKind,
    recorded: &[core::Firing],
    children: &mut Vec<ChildState>,
    ctx: &Ctx,
) {
    let now = Instant::now();
    // Seen while pending (after a restart, created by the process before): kept the same way.
    for firing in recorded {
        if children.iter().any(|c| c.name == firing.name) {
            ctx.cron_children
                .keep(&uid.to_owned(), &firing.name, firing.scheduled, now);
        }
    }
    let sight = |name: &str, _: &Timestamp| {
        if recorded.iter().any(|f| f.name == name) {
            Sight::Held
        } else if children.iter().any(|c| c.name == name) {
            Sight::Seen
        } else {
            Sight::NotSeen
        }
    };
    let pending = ctx.cron_children.pending(&uid.to_owned(), now, sight);
    if !pending.is_empty() {
        for (name, scheduled) in pending {
            if children.iter().any(|c| c.name == name) {
                continue;
            }
            children.push(ChildState {
                name,
                scheduled,
                kind,
                outcome: Outcome::Active,
                canceling: false,
            });
        }
        children.sort_by(|a, b| a.scheduled.cmp(&b.scheduled).then(a.name.cmp(&b.name)));
    }
}

fn is_controlled_by<K: Resource>(child: &K, uid: &str) -> bool {
    child
        .owner_references()
        .iter()
        .any(|owner| owner.uid == uid && owner.controller == Some(true))
}

/// From the `ax.dev/scheduled-time` label, else from the name's suffix.
fn scheduled_time<K: Resource>(child: &K, prefix: &str) -> Option<Timestamp> {
    let seconds = child
        .labels()
        .get(LABEL_SCHEDULED_TIME)
        .cloned()
        .or_else(|| child.name_any().strip_prefix(prefix).map(str::to_owned))?;
    Timestamp::from_second(seconds.parse().ok()?).ok()
}

enum Created {
    Yes,
    /// Created before (by an earlier run of the operator, or on a lagging cache).
    Existed,
    /// An object this cron does not control has the child's name.
    NameTaken(String),
    /// The API server refused the child (its template is invalid as an AxTask/AxDag).
    Rejected(String),
}

fn child_metadata(cron: &AxCron, uid: &str, firing: &core::Firing) -> ObjectMeta {
    let mut annotations = BTreeMap::new();
    if firing.catch_up {
        annotations.insert(ANNOTATION_CATCH_UP.to_owned(), "true".to_owned());
    }
    ObjectMeta {
        name: Some(firing.name.clone()),
        namespace: cron.namespace(),
        labels: Some(BTreeMap::from([
            (LABEL_CRON.to_owned(), cron.name_any()),
            (
                LABEL_SCHEDULED_TIME.to_owned(),
                firing.scheduled.as_second().to_string(),
            ),
        ])),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: Some(vec![OwnerReference {
            api_version: AxCron::api_version(&()).into_owned(),
            kind: AxCron::kind(&()).into_owned(),
            name: cron.name_any(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        ..ObjectMeta::default()
    }
}

async fn create_child(
    cron: &AxCron,
    uid: &str,
    firing: &core::Firing,
    ctx: &Ctx,
) -> Result<Created> {
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    let metadata = child_metadata(cron, uid, firing);
    match (&cron.spec.task, &cron.spec.dag) {
        (Some(task), _) => {
            let child = AxTask {
                metadata,
                spec: task.clone(),
                status: None,
            };
            create_owned(
                Api::namespaced(ctx.client.clone(), &namespace),
                &child,
                uid,
                firing,
            )
            .await
        }
        (None, Some(dag)) => {
            let child = AxDag {
                metadata,
                spec: dag.clone(),
                status: None,
            };
            create_owned(
                Api::namespaced(ctx.client.clone(), &namespace),
                &child,
                uid,
                firing,
            )
            .await
        }
        (None, None) => Err(Error::Incomplete("task or dag")),
    }
}

async fn create_owned<K>(
    api: Api<K>,
    child: &K,
    uid: &str,
    firing: &core::Firing,
) -> Result<Created>
where
    K: Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, child).await {
        Ok(_) => {
            debug!(child = firing.name, "child created");
            Ok(Created::Yes)
        }
        Err(e) if ApiError::of(&e) == ApiError::AlreadyExists => match api
            .get_opt(&firing.name)
            .await
            .map_err(|e| Error::Read("the existing child", e))?
        {
            // Deleted in between (history limit): it was there, the time was handled.
            None => Ok(Created::Existed),
            Some(existing) if is_controlled_by(&existing, uid) => Ok(Created::Existed),
            Some(_) => Ok(Created::NameTaken(format!(
                "{} exists and does not belong to this cron: scheduled time {} skipped",
                firing.name, firing.scheduled
            ))),
        },
        Err(e) if ApiError::of(&e) == ApiError::Invalid => Ok(Created::Rejected(format!(
            "the API server refused child {} for {}: {}",
            firing.name,
            firing.scheduled,
            api_message(&e)
        ))),
        Err(e) => Err(Error::CreateChild(e)),
    }
}

/// `concurrencyPolicy: Replace`: cancels the active children the normal way (`spec.cancel`).
async fn cancel_replaced(
    cron: &AxCron,
    decision: &Decision,
    children: &[ChildState],
    ctx: &Ctx,
) -> Result<()> {
    if decision.cancel.is_empty() {
        return Ok(());
    }
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    let patch = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for name in &decision.cancel {
        let Some(child) = children.iter().find(|c| &c.name == name) else {
            continue;
        };
        if child.canceling {
            continue;
        }
        let result = match child.kind {
            ChildKind::Task => Api::<AxTask>::namespaced(ctx.client.clone(), &namespace)
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
            ChildKind::Dag => Api::<AxDag>::namespaced(ctx.client.clone(), &namespace)
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {
                let replacement = decision.create.last().map_or("", |f| f.name.as_str());
                publish(
                    cron,
                    EventType::Normal,
                    "Replaced",
                    &format!(
                        "canceled {name}: {replacement} replaces it (concurrencyPolicy Replace)"
                    ),
                    ctx,
                );
            }
            Err(e) if ApiError::of(&e) == ApiError::NotFound => {}
            Err(e) => return Err(Error::UpdateChild(e)),
        }
    }
    Ok(())
}

/// Deletes the finished children beyond `successfulRunsHistoryLimit` / `failedRunsHistoryLimit`
/// (in the background: the garbage collector removes their pods and tasks through ownership).
async fn delete_beyond_history(
    cron: &AxCron,
    children: &mut Vec<ChildState>,
    ctx: &Ctx,
) -> Result<()> {
    let finished: Vec<Finished> = children
        .iter()
        .filter_map(|c| match c.outcome {
            Outcome::Active => None,
            Outcome::Succeeded(_) => Some(Finished {
                name: c.name.clone(),
                scheduled: c.scheduled,
                succeeded: true,
            }),
            Outcome::Failed => Some(Finished {
                name: c.name.clone(),
                scheduled: c.scheduled,
                succeeded: false,
            }),
        })
        .collect();
    let keep = |limit: i32| usize::try_from(limit).unwrap_or(0);
    let delete = core::history_to_delete(
        &finished,
        keep(cron.spec.successful_runs_history_limit),
        keep(cron.spec.failed_runs_history_limit),
    );
    if delete.is_empty() {
        return Ok(());
    }
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    for name in &delete {
        let Some(child) = children.iter().find(|c| &c.name == name) else {
            continue;
        };
        let result = match child.kind {
            ChildKind::Task => Api::<AxTask>::namespaced(ctx.client.clone(), &namespace)
                .delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
            ChildKind::Dag => Api::<AxDag>::namespaced(ctx.client.clone(), &namespace)
                .delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {
                let kind = if child.outcome == Outcome::Failed {
                    "failedRunsHistoryLimit"
                } else {
                    "successfulRunsHistoryLimit"
                };
                publish(
                    cron,
                    EventType::Normal,
                    "DeletedHistory",
                    &format!("deleted finished child {name} (beyond {kind})"),
                    ctx,
                );
            }
            Err(e) if ApiError::of(&e) == ApiError::NotFound => {}
            Err(e) => return Err(Error::DeleteChild(e)),
        }
    }
    children.retain(|c| !delete.contains(&c.name));
    Ok(())
}

/// Writes the status if it changed (or `always`; see `write::cron_status`). Returns false when it
/// conflicted (or the cron is gone).
async fn write_status(
    cron: &AxCron,
    before: &AxCronStatus,
    status: &AxCronStatus,
    always: bool,
    ctx: &Ctx,
) -> Result<bool> {
    if before == status && !always {
        return Ok(true);
    }
    let written = write::cron_status(&ctx.client, cron, status).await?;
    if !written {
        debug!("cron status write conflicted; deciding again on the newer version");
    }
    Ok(written)
}

/// Clears `status.pendingChildren`, as `written` just before, once every one of them was
/// `answered` (created, found, or refused for good). A failure (or a create not answered) leaves
/// the list to the next status write, which drops the children it sees.
async fn confirm_pending(
    cron: &AxCron,
    written: &[PendingChild],
    answered: &HashSet<String>,
    ctx: &Ctx,
) {
    if written.is_empty() || !written.iter().all(|p| answered.contains(&p.name)) {
        return;
    }
    if let Err(e) = write::cron_pending_created(&ctx.client, cron, written).await {
        debug!(error = %e, "pending children left for the next status write");
    }
}

/// A scheduled time as people read it: UTC, and the wall clock of the cron's zone.
fn when(schedule: &Schedule, time: Timestamp) -> String {
    let zone: &TimeZone = schedule.time_zone();
    let local = time.to_zoned(zone.clone());
    match zone.iana_name() {
        Some("UTC") | None => time.to_string(),
        Some(name) => format!("{time} ({} {name})", local.strftime("%Y-%m-%d %H:%M:%S")),
    }
}

fn publish_fired(cron: &AxCron, schedule: &Schedule, firing: &core::Firing, ctx: &Ctx) {
    let kind = if cron.spec.task.is_some() {
        "AxTask"
    } else {
        "AxDag"
    };
    let catch_up = if firing.catch_up {
        format!(
            " (catch-up for a missed time, misfirePolicy {:?})",
            cron.spec.misfire_policy
        )
    } else {
        String::new()
    };
    let note = format!(
        "created {kind} {} for {}{catch_up}",
        firing.name,
        when(schedule, firing.scheduled)
    );
    publish(cron, EventType::Normal, "Fired", &note, ctx);
}

fn publish_skip(cron: &AxCron, schedule: &Schedule, policy: &Policy, skip: &Skip, ctx: &Ctx) {
    let times = if skip.count == 1 && !skip.at_least {
        format!("scheduled time {}", when(schedule, skip.first))
    } else {
        format!(
            "{}{} scheduled times from {} to {}",
            if skip.at_least { "at least " } else { "" },
            skip.count,
            when(schedule, skip.first),
            when(schedule, skip.last)
        )
    };
    let (type_, reason, why) = match &skip.reason {
        SkipReason::Missed => (
            EventType::Warning,
            "MissedSchedule",
            "missed (the operator was not running or the cron was suspended) and skipped: misfirePolicy Skip".to_owned(),
        ),
        SkipReason::CoveredBy(by) => (
            EventType::Warning,
            "MissedSchedule",
            format!(
                "missed; the run for {} stands for them (misfirePolicy RunOnce)",
                when(schedule, *by)
            ),
        ),
        SkipReason::TooManyMissed => (
            EventType::Warning,
            "MissedSchedule",
            format!(
                "missed and skipped: only the latest {} missed times run (misfirePolicy RunAll, maxCatchUp)",
                policy.max_catch_up
            ),
        ),
        SkipReason::DeadlineExceeded => (
            EventType::Warning,
            "MissedSchedule",
            format!(
                "skipped: more than startingDeadlineSeconds ({}) late",
                policy.starting_deadline.map_or(0, |d| d.as_secs())
            ),
        ),
        SkipReason::ConcurrentChild(child) => (
            EventType::Normal,
            "SkippedConcurrent",
            format!("skipped: {child} is still active (concurrencyPolicy Forbid)"),
        ),
        SkipReason::Superseded(by) => (
            EventType::Normal,
            "Superseded",
            format!(
                "skipped: the run for {} replaces it (concurrencyPolicy Replace)",
                when(schedule, *by)
            ),
        ),
    };
    publish(cron, type_, reason, &format!("{times}: {why}"), ctx);
}

fn publish(cron: &AxCron, type_: EventType, reason: &str, note: &str, ctx: &Ctx) {
    ctx.events.publish(cron, type_, reason, note);
}

pub fn error_policy(cron: Arc<AxCron>, error: &Error, ctx: Ctx) -> Requeue {
    let category = error.category();
    ctx.metrics
        .reconcile_error(CONTROLLER, error.step(), category.as_str());
    warn!(namespace = cron.namespace(), name = cron.name_any(), %error, category = category.as_str(), "cron reconcile failed");
    Requeue::requeue(category.retry_after())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(name: &str, spec: serde_json::Value) -> AxCron {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1",
            "kind": "AxCron",
            "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 1},
            "spec": spec,
        }))
        .expect("an AxCron")
    }

    fn task() -> serde_json::Value {
        serde_json::json!({"type": "t", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}})
    }

    #[test]
    fn children_are_named_labelled_and_owned_for_their_time() {
        let c = cron(
            "nightly",
            serde_json::json!({"schedule": "@daily", "task": task()}),
        );
        let scheduled = Timestamp::from_second(1_767_225_600).unwrap();
        let firing = core::Firing {
            scheduled,
            name: core::child_name("nightly", scheduled),
            catch_up: true,
        };
        let meta = child_metadata(&c, "u-1", &firing);
        assert_eq!(meta.name.as_deref(), Some("nightly-1767225600"));
        let labels = meta.labels.clone().unwrap();
        assert_eq!(labels[LABEL_CRON], "nightly");
        assert_eq!(labels[LABEL_SCHEDULED_TIME], "1767225600");
        assert_eq!(meta.annotations.unwrap()[ANNOTATION_CATCH_UP], "true");
        let owner = &meta.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("AxCron", "u-1", Some(true))
        );

        let child = AxTask {
            metadata: ObjectMeta {
                labels: None,
                ..child_metadata(&c, "u-1", &firing)
            },
            spec: serde_json::from_value(task()).unwrap(),
            status: None,
        };
        // Without the label the name's suffix still gives the time.
        assert_eq!(scheduled_time(&child, "nightly-"), Some(scheduled));
    }

    #[test]
    fn times_in_events_show_the_zone_wall_clock() {
        let berlin = Schedule::parse("@daily", "Europe/Berlin").unwrap();
        let t: Timestamp = "2025-03-30T01:00:00Z".parse().unwrap();
        assert_eq!(
            when(&berlin, t),
            "2025-03-30T01:00:00Z (2025-03-30 03:00:00 Europe/Berlin)"
        );
        let utc = Schedule::parse("@daily", "UTC").unwrap();
        assert_eq!(when(&utc, t), "2025-03-30T01:00:00Z");
    }
}
