//! The cluster's tasks as the registry takes them: what a waiting task looks like to its queue's
//! dispatcher, and the rebuild that puts every cached task in its place after a restart.

use jiff::Timestamp;
use kube::ResourceExt;

use super::{Registry, TaskKey};
use crate::api::{AxTask, AxTaskSpec, AxTaskStatus, Priority, TaskPhase};
use crate::core::queue::dispatcher::{Holder, PendingTask};

/// What the rebuild reads of one cached task.
pub struct Cached<'a> {
    pub key: TaskKey,
    pub queue: &'a str,
    pub task_type: &'a str,
    pub priority: Priority,
    pub preemptible: bool,
    /// Its key when not its namespace (`status.queueKey`).
    pub queue_key: Option<&'a str>,
    /// When its attempt in flight was dispatched, if its status says.
    pub scheduled_at: Option<Timestamp>,
    /// As written (`None`: new).
    pub phase: Option<TaskPhase>,
    pub cancel: bool,
    pub next_attempt_at: Option<Timestamp>,
    /// Its next attempt's pod exists: dispatched just before a restart (or by an earlier leader),
    /// its status not saying so yet.
    pub next_pod: bool,
    /// What its queue's dispatcher holds of it, for a Pending task.
    pub pending: Option<PendingTask>,
}

/// Puts every cached task where it belongs before the first dispatch: tasks with an attempt in
/// flight or ending hold their slots (dispatched before a restart, or by an earlier leader), eligible
/// Pending tasks wait for one. Returns how many of each. O(n) over the tasks, once.
pub fn rebuild<'a>(
    registry: &mut Registry,
    tasks: impl IntoIterator<Item = Cached<'a>>,
    now: Timestamp,
) -> (usize, usize) {
    let (mut holding, mut pending) = (0, 0);
    for task in tasks {
        if registry.tasks.contains_key(&task.key) {
            // Already placed by its reconcile, which saw a newer state than a re-list might.
            continue;
        }
        let waiting = matches!(task.phase, None | Some(TaskPhase::Pending));
        if waiting && task.next_pod {
            registry.hold(&task.key, task.queue, task.holder());
            holding += 1;
            continue;
        }
        match task.phase {
            Some(
                TaskPhase::Scheduled | TaskPhase::Running | TaskPhase::Failed | TaskPhase::TimedOut,
            ) => {
                registry.hold(&task.key, task.queue, task.holder());
                holding += 1;
            }
            Some(TaskPhase::Pending)
                if !task.cancel && task.next_attempt_at.is_none_or(|at| at <= now) =>
            {
                if let Some(entry) = task.pending {
                    registry.upsert(&task.key, task.queue, entry);
                    pending += 1;
                }
            }
            _ => {}
        }
    }
    (holding, pending)
}

/// What a task waiting for dispatch looks like to its queue's dispatcher.
pub fn pending_task(task: &AxTask) -> PendingTask {
    let created = task.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let namespace = task.namespace().unwrap_or_default();
    match task.status.as_ref() {
        Some(status) => pending_of(&namespace, &task.spec, status, created),
        None => pending_of(&namespace, &task.spec, &AxTaskStatus::default(), created),
    }
}

/// The same from a status that is not written yet (the reconciler's decision).
pub fn pending_of(
    namespace: &str,
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    created: Option<Timestamp>,
) -> PendingTask {
    PendingTask {
        priority: spec.priority,
        namespace: namespace.to_string(),
        key: status.queue_key.as_ref().map(|k| k.value.clone()),
        task_type: spec.task_type.clone(),
        queued_at: status
            .queued_at
            .or(created)
            .unwrap_or(Timestamp::UNIX_EPOCH),
        attempt: u32::try_from(status.attempt).unwrap_or(0) + 1,
        preemptible: spec.preemptible,
    }
}

/// What the dispatcher counts of a task holding a slot.
pub fn holder<'a>(spec: &'a AxTaskSpec, status: Option<&'a AxTaskStatus>) -> Holder<'a> {
    Holder {
        task_type: &spec.task_type,
        key: status
            .and_then(|s| s.queue_key.as_ref())
            .map(|k| k.value.as_str()),
        priority: spec.priority,
        preemptible: spec.preemptible,
        since: status
            .and_then(|s| s.scheduled_at)
            .unwrap_or(Timestamp::UNIX_EPOCH),
    }
}

impl<'a> Cached<'a> {
    fn holder(&self) -> Holder<'a> {
        Holder {
            task_type: self.task_type,
            key: self.queue_key,
            priority: self.priority,
            preemptible: self.preemptible,
            since: self.scheduled_at.unwrap_or(Timestamp::UNIX_EPOCH),
        }
    }
}
