//! What the caches show of a cron's children: the AxTasks and AxDags it controls, by scheduled
//! time, and those this process created that the caches do not show yet.

use std::time::Instant;

use jiff::Timestamp;
use kube::{Resource, ResourceExt};

use crate::api::{AxCron, DagPhase, LABEL_SCHEDULED_TIME, TaskPhase};
use crate::controller::Ctx;
use crate::controller::expected::Sight;
use crate::controller::owner_index::is_controlled_by;
use crate::core::cron as core;
use crate::core::cron::status::{ChildKind, ChildState, Outcome};
use crate::core::task::is_final;

/// The children of this cron in the caches: AxTasks and AxDags in its namespace whose controller
/// is this cron (by uid, so the children of an older cron of the same name do not count). Looked
/// up through the owner indexes: a reconcile reads its own children, not every cron's.
pub(super) fn owned_children(cron: &AxCron, uid: &str, ctx: &Ctx) -> Vec<ChildState> {
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
pub(super) fn add_expected(
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

/// From the `ax.dev/scheduled-time` label, else from the name's suffix.
pub(super) fn scheduled_time<K: Resource>(child: &K, prefix: &str) -> Option<Timestamp> {
    let seconds = child
        .labels()
        .get(LABEL_SCHEDULED_TIME)
        .cloned()
        .or_else(|| child.name_any().strip_prefix(prefix).map(str::to_owned))?;
    Timestamp::from_second(seconds.parse().ok()?).ok()
}
