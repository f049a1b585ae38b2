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

mod actions;
mod children;
mod events;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use tracing::{debug, info, warn};

use super::write;
use super::{Ctx, Error, Result};
use crate::api::{AxCron, AxCronStatus, PendingChild};
use crate::core::conditions;
use crate::core::cron::status::{self, ChildKind, ChildState, Outcome};
use crate::core::cron::{self as core, Child};

use actions::{Created, cancel_replaced, create_child, delete_beyond_history};
use children::{add_expected, owned_children};
use events::{count_fired, count_skip, publish, publish_fired, publish_skip};

/// The `controller` label of the reconcile metrics.
pub(super) const CONTROLLER: &str = "axcron";

/// Longest sleep between two reconciles of a cron, whatever its schedule: the status (active
/// children) is refreshed by child events anyway; this bounds the damage of a lost timer.
pub(super) const MAX_SLEEP: Duration = Duration::from_secs(600);

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
                count_fired(&cron, firing, &ctx);
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
        count_skip(skip, &ctx);
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

pub fn error_policy(cron: Arc<AxCron>, error: &Error, ctx: Ctx) -> Requeue {
    let category = error.category();
    ctx.metrics
        .reconcile_error(CONTROLLER, error.step(), category.as_str());
    warn!(namespace = cron.namespace(), name = cron.name_any(), %error, category = category.as_str(), "cron reconcile failed");
    Requeue::requeue(category.retry_after())
}
