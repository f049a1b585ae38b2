//! A task that waits in its queue without having run, or has finished, as the operator's cache
//! keeps it: the few facts that say whether a look at it would do anything (no client required).
//!
//! A large backlog is mostly such tasks, and a whole task is kilobytes in memory; these facts are a
//! fraction of that. A reconcile decides from them that nothing is to be done ([`Settled::idle`]:
//! no status change, no action, where the task stands with its queue and when to look again), and
//! reads the whole task only when something is. Only tasks in a canonical state — their status
//! exactly as a decision leaves it — become `Settled` ([`Settled::of`]); anything unusual stays
//! whole. A property test holds this to [`decide`](super::decide): whenever `idle` says nothing
//! happens, `decide` on the whole task agrees.

use jiff::Timestamp;

use super::QueueState;
use super::conditions::{
    CALLBACK_DELIVERED, CIRCUIT_OPEN, FAILED, QUEUED, READY, RERUN_REQUESTED, SUSPENDED,
    WORKER_TERMINATING,
};
use crate::api::{AxTask, AxTaskStatus, Condition, Priority, QueueKey, TaskPhase};
use crate::core::conditions::reason;
use crate::core::queue::key::KeySource;
use crate::core::queue::{HeldReason, PendingTask, estimate};
use crate::core::worker::WorkerState;

/// What a settled task's `Queued` condition says, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueuedAs {
    /// Held (`Queued` True) for this reason, with this message.
    Held(HeldReason, String),
    /// Not queued before `startAfter` (`Queued` False, `Delayed`): the time is `next_attempt_at`.
    Delayed,
    /// Finished (`Queued` False, the phase).
    Finished,
}

/// The facts of a settled task.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    pub queue: String,
    pub task_type: String,
    pub priority: Priority,
    pub preemptible: bool,
    /// Its key in its queue when not its namespace (`status.queueKey`), current with its labels
    /// and payload.
    pub queue_key: Option<Box<QueueKey>>,
    /// Pending (never dispatched) or final.
    pub phase: TaskPhase,
    /// The last attempt (0 for a waiting task): its pods are named up to it.
    pub attempt: i32,
    /// The `metadata.generation` its status observed.
    pub observed_generation: Option<i64>,
    /// When it was created (its place in its bucket when `queuedAt` is missing).
    pub created: Option<Timestamp>,
    pub queued_at: Option<Timestamp>,
    /// Pending: not queued before then (`startAfter`).
    pub next_attempt_at: Option<Timestamp>,
    pub queued: QueuedAs,
    /// Final: when `ttlSecondsAfterFinished` deletes it.
    pub expires: Option<Timestamp>,
    /// A fan-out item that Succeeded: its ended pods are to be deleted (see `decide`).
    pub removes_pods: bool,
}

/// A look at a settled task that changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Idle {
    /// Where it stands with its queue (`Ready`, `Waiting` or `Done`).
    pub queue: QueueState,
    /// When to look again at the latest.
    pub look_again: Option<Timestamp>,
}

impl Settled {
    /// The facts of `task` if it is settled: Pending and never dispatched, or final; its spec valid
    /// (`spec_valid`, as [`validate`](super::validate) says) and seen (`observedGeneration`), no
    /// re-run waiting, no callback outstanding, and every condition as a decision in that state
    /// writes it. `None` otherwise: it stays whole.
    pub fn of(task: &AxTask, spec_valid: bool) -> Option<Settled> {
        let spec = &task.spec;
        let status = task.status.as_ref()?;
        let phase = status.phase?;
        let generation = task.metadata.generation;
        if task.metadata.deletion_timestamp.is_some()
            || status.observed_generation != generation
            || spec.rerun != status.observed_rerun
            || !spec_valid
        {
            return None;
        }
        let queued = match phase {
            // A suspended task is rare and waits outside its queue: it stays whole.
            TaskPhase::Pending if status.attempt == 0 && !spec.cancel && !spec.suspend => {
                pending_queued(status)?
            }
            p if p.is_terminal() => {
                let delivered = has(status, CALLBACK_DELIVERED);
                if spec.callback.is_some() && !delivered {
                    return None;
                }
                // Its exit handler's end is still to be recorded.
                if spec.on_exit.is_some() && !super::exit::finished(status.on_exit.as_ref()) {
                    return None;
                }
                QueuedAs::Finished
            }
            _ => return None,
        };
        if !canonical_conditions(status, phase, &queued, generation) {
            return None;
        }
        // A label edited since the key was recorded: a decision records the new one.
        if phase == TaskPhase::Pending
            && let Some(key) = &status.queue_key
            && !key_is_current(key, task)
        {
            return None;
        }
        let expires = match (phase.is_terminal(), spec.ttl_seconds_after_finished) {
            (true, Some(ttl)) => Some(super::observe::add_seconds(status.finished_at?, ttl)),
            _ => None,
        };
        Some(Settled {
            queue: spec.queue.clone(),
            task_type: spec.task_type.clone(),
            priority: spec.priority,
            preemptible: spec.preemptible,
            queue_key: status.queue_key.clone().map(Box::new),
            phase,
            attempt: status.attempt,
            observed_generation: status.observed_generation,
            created: task.metadata.creation_timestamp.as_ref().map(|t| t.0),
            queued_at: status.queued_at,
            next_attempt_at: status.next_attempt_at,
            queued,
            expires,
            removes_pods: phase == TaskPhase::Succeeded && super::is_fan_out_item(task),
        })
    }

    /// What a look at the task with metadata.generation `generation` and these `pods` does, if it
    /// does nothing: its spec unchanged, no slot granted, what holds it (`held`, as the queue says
    /// now) already written, no `startAfter` or TTL come due, no pod that may run or needs anything
    /// done (a waiting task has none at all), its key recorded from its queue's `key_source` (if
    /// the queue is known). `None`: the whole task must be decided on.
    pub fn idle(
        &self,
        generation: Option<i64>,
        granted: bool,
        held: Option<(HeldReason, &str)>,
        key_source: Option<&KeySource>,
        pods: &[WorkerState],
        now: Timestamp,
    ) -> Option<Idle> {
        let pods_inert = if self.phase.is_terminal() {
            pods.iter().all(WorkerState::is_inert)
        } else {
            pods.is_empty()
        };
        if generation != self.observed_generation || !pods_inert {
            return None;
        }
        if self.removes_pods && !pods.is_empty() {
            return None;
        }
        if self.phase.is_terminal() {
            return match self.expires {
                Some(at) if now >= at => None,
                at => Some(Idle {
                    queue: QueueState::Done,
                    look_again: at,
                }),
            };
        }
        if key_source.is_some_and(|source| !source.recorded(self.queue_key.as_deref())) {
            return None;
        }
        if let Some(at) = self.next_attempt_at.filter(|at| *at > now) {
            return (self.queued == QueuedAs::Delayed).then_some(Idle {
                queue: QueueState::Waiting,
                look_again: Some(at),
            });
        }
        if granted {
            return None;
        }
        let QueuedAs::Held(reason, message) = &self.queued else {
            return None;
        };
        let unchanged = match held {
            Some((now_reason, now_message)) => {
                now_reason == *reason && !estimate::message_moved(message, now_message, now)
            }
            // What holds a queued task is the queue's to say: its last word stays.
            None => true,
        };
        unchanged.then_some(Idle {
            queue: QueueState::Ready,
            look_again: None,
        })
    }

    /// What the queue's dispatcher holds of it while it waits (`core::queue::pending_of`).
    pub fn pending(&self, namespace: &str) -> PendingTask {
        PendingTask {
            priority: self.priority,
            namespace: namespace.to_string(),
            key: self.queue_key.as_ref().map(|k| k.value.clone()),
            task_type: self.task_type.clone(),
            queued_at: self
                .queued_at
                .or(self.created)
                .unwrap_or(Timestamp::UNIX_EPOCH),
            attempt: 1,
            preemptible: self.preemptible,
        }
    }

    /// The `Queued` condition's reason and message, as written.
    pub fn queued_condition(&self) -> (&str, &str) {
        match &self.queued {
            QueuedAs::Held(reason, message) => (reason.as_str(), message),
            QueuedAs::Delayed => ("Delayed", ""),
            QueuedAs::Finished => (self.phase.as_str(), ""),
        }
    }
}

/// Whether `key` is what its source gives for `task` now. A label may change without a new
/// generation; the payload is spec, so a key from it is current while the status has observed the
/// spec (checked before) — and the cache keeps no payload to look at.
fn key_is_current(key: &QueueKey, task: &AxTask) -> bool {
    match KeySource::recorded_as(&key.from) {
        Some(label @ KeySource::Label { .. }) => {
            label.key_of(task.metadata.labels.as_ref(), None).as_ref() == Some(key)
        }
        Some(KeySource::Payload { .. }) => true,
        _ => false,
    }
}

/// The `Queued` condition of a Pending task that never ran, when it is one a decision writes.
fn pending_queued(status: &AxTaskStatus) -> Option<QueuedAs> {
    let queued = status.condition(QUEUED)?;
    match (queued.status.as_str(), status.next_attempt_at) {
        ("False", Some(at))
            if queued.reason == "Delayed" && queued.message == format!("waiting until {at}") =>
        {
            Some(QueuedAs::Delayed)
        }
        ("True", _) => Some(QueuedAs::Held(
            HeldReason::parse(&queued.reason)?,
            queued.message.clone(),
        )),
        _ => None,
    }
}

/// Every condition is what `conditions::update` writes for a task settled in `phase`, so a look
/// that changes nothing else leaves them as they are.
fn canonical_conditions(
    status: &AxTaskStatus,
    phase: TaskPhase,
    queued: &QueuedAs,
    generation: Option<i64>,
) -> bool {
    let is = |c: &Condition, value: &str, reason: &str, message: &str| {
        c.status == value
            && c.reason == reason
            && c.message == message
            && c.observed_generation == generation
    };
    let ready_message = status.reason.as_deref().unwrap_or_default();
    let (ready_value, ready_reason) = match phase {
        TaskPhase::Succeeded => ("True", TaskPhase::Succeeded.as_str()),
        p => ("False", p.as_str()),
    };
    status.conditions.iter().all(|c| match c.type_.as_str() {
        READY => is(c, ready_value, ready_reason, ready_message),
        FAILED if phase == TaskPhase::Dead => is(c, "True", phase.as_str(), ready_message),
        FAILED => is(c, "False", phase.as_str(), ""),
        QUEUED => match queued {
            QueuedAs::Held(reason, message) => {
                *reason != HeldReason::CircuitOpen && is(c, "True", reason.as_str(), message)
            }
            QueuedAs::Delayed => c.observed_generation == generation,
            QueuedAs::Finished => is(c, "False", phase.as_str(), ""),
        },
        CIRCUIT_OPEN => is(
            c,
            "False",
            reason::NOT_HELD,
            "no longer held by an open circuit",
        ),
        WORKER_TERMINATING => is(c, "False", reason::PODS_STOPPED, ""),
        RERUN_REQUESTED => is(c, "False", reason::RERUN_STARTED, ""),
        SUSPENDED => is(c, "False", reason::ACTIVE, ""),
        CALLBACK_DELIVERED => phase.is_terminal(),
        _ => false,
    }) && has(status, READY)
        && has(status, QUEUED)
        && (phase != TaskPhase::Dead || has(status, FAILED))
}

fn has(status: &AxTaskStatus, type_: &str) -> bool {
    status.condition(type_).is_some()
}
