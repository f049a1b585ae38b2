//! The AxTask lifecycle (DESIGN §3) as pure functions: from the task, every pod of it, what the
//! queue says and the clock, to the new status and the side effects to perform.
//!
//! `decide` observes one event at a time (`observe.rs`, where precedence is written down), applies
//! it with the transition table (`machine.rs`), and repeats until nothing moves; then it works out,
//! from where the task ended up, what must happen to its pods (create the current one, stop every
//! one that should not run, as a level, whatever happened before), what the queue holds for it, its
//! conditions, and when to look again. Every transition is appended to `status.history`.

mod classify;
mod conditions;
pub mod exit;
mod machine;
mod observe;
mod pace;
mod reason;
mod settled;
mod validate;

#[cfg(test)]
mod tests;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

pub use classify::classify;
pub use conditions::{CallbackResult, callback_outcome};
pub use machine::{LEGAL, is_legal};
pub use observe::{
    Event, Refusal, blocks, current_pod, fence, hard_deadline, main_has_probe, next_attempt_pod,
    observe, should_run, soft_deadline, soft_timeout_not_alive,
};
pub use pace::ProgressLine;
pub use reason::Reason;
pub use settled::{Idle, QueuedAs, Settled};
pub use validate::{
    MAX_PAYLOAD_BYTES, POD_ANNOTATIONS_MAX_BYTES, TaskSpecError, payload_json, validate,
};

use crate::api::{
    ATTEMPTS_CAP, AttemptRecord, AxTaskSpec, AxTaskStatus, Failure, FailureKind, HistoryEntry,
    QueueKey, TaskPhase, TemplateUse, TraceContext,
};
use crate::core::conditions::CALLBACK_DELIVERED;
use crate::core::queue::{HeldReason, Outcome};
use crate::core::worker::WorkerState;

/// The status keeps at most this many history entries; older ones are dropped and counted.
pub const HISTORY_CAP: usize = 100;
/// Grace period for a worker killed by a timeout.
pub const TIMEOUT_KILL_GRACE_SECONDS: i64 = 10;
pub const ACTOR_USER: &str = "user";
pub const ACTOR_WORKER: &str = "worker";

/// Inputs that are not part of the task: time, who acts, and randomness (for jitter).
#[derive(Clone, Debug)]
pub struct Clock<'a> {
    pub now: Timestamp,
    /// `ax-operator/<pod>`: recorded as the actor of the operator's own transitions.
    pub operator: &'a str,
    /// A uniform sample from `[0, 1)`.
    pub unit_random: f64,
}

/// Everything a decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub task_name: &'a str,
    pub spec: &'a AxTaskSpec,
    /// The status to decide from: the one written, or one this process decided and has not written
    /// yet (see [`Decision::write_by`]).
    pub status: &'a AxTaskStatus,
    /// The status as written, when `status` is one not written yet.
    pub written: Option<&'a AxTaskStatus>,
    pub generation: Option<i64>,
    /// The message of [`validate`]'s error, if the spec is invalid.
    pub spec_error: Option<&'a str>,
    /// Whether the main container has a readiness or liveness probe ([`main_has_probe`]).
    pub main_has_probe: bool,
    /// Every pod of this task (owned by it), of any attempt, including those created but not yet
    /// seen (see `worker::expected`).
    pub pods: &'a [WorkerState],
    /// The queue's dispatcher holds a slot for this task: it may start its next attempt.
    pub granted: bool,
    /// What holds an eligible Pending task, as the queue says it now.
    pub held: Option<(HeldReason, &'a str)>,
    /// The task's key in its queue when the queue takes it from a label or the payload
    /// (`core::queue::key`), recorded in the status while the task is not finished.
    pub queue_key: Option<&'a QueueKey>,
    /// The task's trace (`core::trace::context_of`) while the operator exports traces: recorded
    /// with the first status write that has none, and kept from then on.
    pub trace: Option<&'a TraceContext>,
    /// The task's queue is draining (`stopPolicy: HoldAndDrain`): a dispatched attempt is stopped.
    pub draining: bool,
    /// The queue chose the task's running attempt to stop for a waiting task of higher priority.
    pub preempted: bool,
    /// The API server refused the current attempt's worker pod.
    pub refused: Option<&'a Refusal>,
    /// The outcome of a callback delivery to record.
    pub callback: Option<(CallbackResult, &'a str)>,
    /// The AxTaskTemplate the spec was completed from (`core::template`), recorded with the first
    /// status write.
    pub template: Option<&'a TemplateUse>,
    /// The phase of the task's exit handler (`spec.onExit`), if it exists.
    pub exit_handler: Option<TaskPhase>,
    /// The task is an item of a DAG's `forEach` ([`is_fan_out_item`]): its pods go once its
    /// success is recorded.
    pub fan_out_item: bool,
    /// How long after its dispatch a status that records only progress (dispatched, running) may
    /// wait to be written, so a short attempt costs one status write instead of three (see
    /// [`Decision::write_by`]). Zero writes every change at once.
    pub progress_write_delay: Duration,
}

impl<'a> Inputs<'a> {
    /// The inputs of a plain reconcile: no slot, no queue word, no refusal, no callback.
    pub fn new(
        task_name: &'a str,
        spec: &'a AxTaskSpec,
        status: &'a AxTaskStatus,
        pods: &'a [WorkerState],
    ) -> Self {
        Self {
            task_name,
            spec,
            status,
            written: None,
            generation: None,
            spec_error: None,
            main_has_probe: main_has_probe(spec),
            pods,
            granted: false,
            held: None,
            queue_key: status.queue_key.as_ref(),
            trace: None,
            draining: false,
            preempted: false,
            refused: None,
            callback: None,
            template: None,
            exit_handler: None,
            fan_out_item: false,
            progress_write_delay: Duration::ZERO,
        }
    }
}

/// Whether `task` is an item of a DAG's `forEach`: labeled with its index and controlled by its
/// DAG.
pub fn is_fan_out_item(task: &crate::api::AxTask) -> bool {
    let labels = task.metadata.labels.as_ref();
    labels.is_some_and(|l| l.contains_key(crate::api::LABEL_DAG_ITEM)) && has_controller(task)
}

/// Whether `task` is some object's child (a DAG's or a cron's): it has an owner reference with
/// `controller: true`.
pub fn has_controller(task: &crate::api::AxTask) -> bool {
    let mut owners = task.metadata.owner_references.iter().flatten();
    owners.any(|owner| owner.controller == Some(true))
}

/// A side effect for the controller to perform after the status is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the worker pod of `status.attempt` (its name is deterministic).
    CreatePod,
    /// Delete a pod that should not run, preconditioned on its uid. `keep_outcome`: put
    /// `worker::OUTCOME_FINALIZER` on it first, so its last status can be read.
    KillPod {
        name: String,
        uid: String,
        grace_seconds: Option<i64>,
        keep_outcome: bool,
    },
    /// Take `worker::OUTCOME_FINALIZER` off a pod whose outcome is known.
    RemoveFinalizer {
        name: String,
        uid: String,
    },
    /// Remove an ended pod whose outcome is recorded and that nothing reads again (a succeeded
    /// fan-out item's): its outcome finalizer off, then deleted, which for a terminal pod is at
    /// once. Two writes, and no look at it while it is being deleted.
    RemovePod {
        name: String,
        uid: String,
    },
    /// A Warning Event that is not a transition.
    Warn {
        reason: Reason,
        message: String,
    },
    SendCallback,
    DeleteTask,
    /// Create the exit handler (`spec.onExit`), recorded Pending by the status just written.
    CreateExitHandler,
}

/// Where the task stands with its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueState {
    /// Pending and eligible now: wait for a slot.
    Ready,
    /// Pending, not before `nextAttemptAt` (startAfter, backoff): holds nothing.
    Waiting,
    /// Holds a concurrency slot: an attempt in flight, or a pod of it still stopping.
    Holding,
    /// Holds nothing, for good (terminal, every pod stopped).
    Done,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: AxTaskStatus,
    /// The history entries the status write adds, oldest first: this decision's, after those of an
    /// unwritten status it started from ([`Inputs::written`]).
    pub transitions: Vec<HistoryEntry>,
    pub actions: Vec<Action>,
    pub queue: QueueState,
    /// How the attempt in flight ended in this decision, for the queue's circuit breaker.
    pub outcome: Option<Outcome>,
    /// Whether this decision used the slot it was granted.
    pub dispatched: bool,
    /// Reconcile again after this long at the latest (timeouts, backoff, TTL).
    pub requeue_after: Option<Duration>,
    /// The new status may stay unwritten until then: it records only that the attempt was
    /// dispatched and its worker started. The next look — at this time at the latest, or when the
    /// worker changes — decides from it (kept in memory; after a restart, taken up again from the
    /// pod: `NextPodFound`) and writes it with whatever came since. Only the pod's create may
    /// happen before it is written. `None`: write it now.
    pub write_by: Option<Timestamp>,
    /// The new status records only progress, as for `write_by`, whether or not its delay has run
    /// out: once it has, the controller may still pace the write behind other progress writes
    /// (`--progress-writes-per-second`), since an outcome carries it anyway. False when the
    /// progress write delay is zero: then every change is written at once.
    pub progress_only: bool,
    /// The attempt whose pod this decision takes as gone because no cache shows it (the worker
    /// gone, never created, or stopped): a label removed or a stale relist hides a pod that still
    /// runs, so the controller asks the API server (`Inputs::pods` gets the pod if it exists) before
    /// acting on it.
    pub assumes_gone: Option<i32>,
    /// A pod of a later attempt than the status knows beyond the next one exists: this status is
    /// behind the task's (a cache that lags): nothing is decided until a newer version arrives.
    pub behind: bool,
}

impl Decision {
    fn new(status: &AxTaskStatus) -> Self {
        Decision {
            status: status.clone(),
            transitions: Vec::new(),
            actions: Vec::new(),
            queue: QueueState::Done,
            outcome: None,
            dispatched: false,
            requeue_after: None,
            write_by: None,
            progress_only: false,
            assumes_gone: None,
            behind: false,
        }
    }

    fn transition(
        &mut self,
        to: TaskPhase,
        reason: Reason,
        message: String,
        actor: &str,
        now: Timestamp,
    ) {
        let entry = HistoryEntry {
            time: now,
            from: self.status.phase,
            to,
            attempt: self.status.attempt,
            reason: reason.as_str().to_string(),
            message,
            actor: actor.to_string(),
        };
        self.status.phase = Some(to);
        self.status.reason = Some(entry.reason.clone());
        self.status.history.push(entry.clone());
        let excess = self.status.history.len().saturating_sub(HISTORY_CAP);
        if excess > 0 {
            self.status.history.drain(..excess);
            self.status.history_dropped += excess as i64;
        }
        self.transitions.push(entry);
        if to.is_terminal() {
            self.status.finished_at = Some(now);
            self.status.next_attempt_at = None;
        }
    }

    fn push_record(&mut self, record: AttemptRecord) {
        self.status.attempts.push(record);
        let excess = self.status.attempts.len().saturating_sub(ATTEMPTS_CAP);
        self.status.attempts.drain(..excess);
    }

    fn current_record(&mut self) -> Option<&mut AttemptRecord> {
        let attempt = self.status.attempt;
        self.status
            .attempts
            .iter_mut()
            .rev()
            .find(|r| r.attempt == attempt)
    }

    /// Records how the current attempt ended.
    fn end_attempt(
        &mut self,
        outcome: TaskPhase,
        reason: Reason,
        failure: Option<&Failure>,
        now: Timestamp,
    ) {
        if let Some(record) = self.current_record()
            && record.outcome.is_none()
        {
            record.outcome = Some(outcome);
            record.finished_at = Some(now);
            record.reason = Some(reason.as_str().into());
            record.exit_code = failure.and_then(|f| f.exit_code);
            record.failure_kind = failure.map(|f| f.kind);
        }
    }

    fn requeue_at(&mut self, at: Timestamp, now: Timestamp) {
        let wait = at.duration_since(now).max(SignedDuration::ZERO);
        let wait = Duration::try_from(wait).unwrap_or_default();
        self.requeue_after = Some(self.requeue_after.map_or(wait, |d| d.min(wait)));
    }
}

/// Whether the task is finished for good: in a terminal phase and no worker of it may still run
/// (its `WorkerTerminating` condition is not True). DESIGN §3: a Canceled task's worker is being
/// stopped when the phase is written, and a Succeeded one's sidecars may still run; everything that
/// acts on a task's end — callbacks, a DAG's dependents, an AxCron's `Forbid`, `kubectl ax wait` —
/// waits for this, not for the phase alone.
pub fn is_final(status: &AxTaskStatus) -> bool {
    status.phase.is_some_and(TaskPhase::is_terminal)
        && !status
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::WORKER_TERMINATING && c.status == "True")
}

/// Decides what happens to a task now.
pub fn decide(inputs: &Inputs, clock: &Clock) -> Decision {
    let now = clock.now;
    let mut d = Decision::new(inputs.status);
    if behind(inputs.status, inputs.pods) {
        // Attempt n+2 exists only once a status said n+1: acting on this one could start a second
        // worker beside it. The newer version of the task is on its way.
        d.behind = true;
        d.queue = QueueState::Holding;
        d.requeue_after = Some(BEHIND_RETRY);
        return d;
    }
    d.status.observed_generation = inputs.generation;
    if let Some(template) = inputs.template {
        if d.status.template.is_none() {
            d.status.template = Some(template.clone());
        }
        d.status
            .conditions
            .retain(|c| c.type_ != crate::core::conditions::TEMPLATE_RESOLVED);
    }
    if !d.status.phase.is_some_and(TaskPhase::is_terminal) {
        d.status.queue_key = inputs.queue_key.cloned();
        if d.status.trace.is_none() {
            d.status.trace = inputs.trace.cloned();
        }
    }
    if let Some((result, message)) = inputs.callback {
        d.status = callback_outcome(&d.status, result, message, now);
    }
    let mut granted = inputs.granted;
    // Each event moves the phase forward; a task crosses at most a handful of rows per decision.
    for _ in 0..8 {
        let Some(event) = observe::observe(inputs, &d.status, granted, now) else {
            break;
        };
        // The pod found of the next attempt was created with a slot granted: the grant is used.
        let dispatch = event == Event::Granted || (event == Event::NextPodFound && granted);
        let absent = matches!(
            event,
            Event::WorkerGone | Event::PodNeverAppeared | Event::WorkersStopped
        ) && d.status.attempt > 0
            && current_pod(&d.status, inputs.pods).is_none();
        if absent {
            d.assumes_gone.get_or_insert(d.status.attempt);
        }
        if !machine::step(&mut d, event, inputs, clock) {
            break;
        }
        if dispatch {
            granted = false;
            d.dispatched = true;
        }
    }
    settle(&mut d, inputs, clock);
    if let Some(written) = inputs.written {
        // What the write will add: the entries decided earlier and not written yet come first.
        let unwritten = appended_since(written, inputs.status);
        d.transitions.splice(0..0, unwritten);
    }
    d.progress_only = progress_only(&d, inputs);
    d.write_by = put_off(&d, inputs, now);
    if let Some(at) = d.write_by {
        d.requeue_at(at, now);
    }
    d
}

/// How soon a decision on a status that is behind its pods ([`Decision::behind`]) looks again.
pub const BEHIND_RETRY: Duration = Duration::from_secs(2);

/// Whether `status` is behind the task's pods: one of them is of an attempt past the next.
pub fn behind(status: &AxTaskStatus, pods: &[WorkerState]) -> bool {
    let next = status.attempt.saturating_add(1);
    pods.iter().any(|p| p.attempt > next)
}

/// The history entries `later` has beyond `earlier` (history is append-only, its oldest entries
/// dropped and counted).
fn appended_since(earlier: &AxTaskStatus, later: &AxTaskStatus) -> Vec<HistoryEntry> {
    let total =
        |s: &AxTaskStatus| usize::try_from(s.history_dropped).unwrap_or_default() + s.history.len();
    let n = total(later)
        .saturating_sub(total(earlier))
        .min(later.history.len());
    later.history[later.history.len() - n..].to_vec()
}

/// Whether a decision's status differs from the written one by progress only: every transition
/// since the written status is progress (queued, dispatched, running), the task ends up Scheduled or
/// Running, and nothing but the current pod's create is to be done. Never with a zero
/// [`Inputs::progress_write_delay`].
fn progress_only(d: &Decision, inputs: &Inputs) -> bool {
    use TaskPhase::{Pending, Running, Scheduled};
    let written = inputs.written.unwrap_or(inputs.status);
    if inputs.progress_write_delay.is_zero() || d.status == *written {
        return false;
    }
    let progress = |from: Option<TaskPhase>, to: TaskPhase| {
        matches!(
            (from, to),
            (None, Pending) | (Some(Pending), Scheduled) | (Some(Scheduled), Running)
        )
    };
    d.transitions.iter().all(|t| progress(t.from, t.to))
        && matches!(d.status.phase, Some(Scheduled | Running))
        && matches!(written.phase, None | Some(Pending | Scheduled))
        && d.actions.iter().all(|a| *a == Action::CreatePod)
}

/// When a decision's status may be written at the latest, if it need not be written now: it
/// records only progress ([`progress_only`]) and the dispatch was less than
/// [`Inputs::progress_write_delay`] ago. Whatever else happens — an outcome, a failure, a cancel —
/// is written at once, with this progress in its history; once the delay has run out the progress
/// is due (written at once, or paced by the controller).
fn put_off(d: &Decision, inputs: &Inputs, now: Timestamp) -> Option<Timestamp> {
    let delay = SignedDuration::try_from(inputs.progress_write_delay).ok()?;
    let by = d.status.scheduled_at?.checked_add(delay).ok()?;
    (d.progress_only && now < by).then_some(by)
}

/// What follows from where the task stands: the pods to create or stop, the queue, conditions,
/// callbacks, TTL and when to look again.
fn settle(d: &mut Decision, inputs: &Inputs, clock: &Clock) {
    let now = clock.now;
    let spec = inputs.spec;
    let phase = d.status.phase;

    if phase.is_some_and(TaskPhase::has_worker) {
        let hard_at = hard_deadline(spec, &d.status, now);
        match current_pod(&d.status, inputs.pods) {
            None if phase == Some(TaskPhase::Scheduled) && inputs.refused.is_none() => {
                d.actions.push(Action::CreatePod);
            }
            Some(w) => {
                if let Some(soft_at) = soft_deadline(spec, &d.status) {
                    if now >= soft_at {
                        // Not alive would have timed the attempt out; alive: say so once.
                        d.status.soft_timeout_attempt = Some(d.status.attempt);
                        d.actions.push(Action::Warn {
                            reason: Reason::SoftTimeout,
                            message: format!(
                                "attempt {} still running after softSeconds={}; worker {} is alive",
                                d.status.attempt,
                                spec.timeout.soft_seconds.unwrap_or_default(),
                                w.name
                            ),
                        });
                    } else {
                        d.requeue_at(soft_at, now);
                    }
                }
            }
            None => {}
        }
        d.requeue_at(hard_at, now);
    }

    stop_pods(d, inputs, now);

    let fenced = fence(spec, &d.status, inputs.pods);
    let fenced_pod = fenced.first().map(|p| (p.name.clone(), p.attempt));
    d.queue = match phase {
        Some(TaskPhase::Pending) if d.status.next_attempt_at.is_some_and(|at| at > now) => {
            QueueState::Waiting
        }
        Some(TaskPhase::Pending) | None if fenced_pod.is_some() => QueueState::Holding,
        Some(TaskPhase::Pending) | None if spec.suspend => QueueState::Waiting,
        Some(TaskPhase::Pending) | None => QueueState::Ready,
        Some(p) if p.has_worker() => QueueState::Holding,
        Some(TaskPhase::Failed | TaskPhase::TimedOut) => QueueState::Holding,
        Some(_) if fenced_pod.is_some() => QueueState::Holding,
        Some(_) => QueueState::Done,
    };
    if let Some(at) = d.status.next_attempt_at.filter(|at| *at > now)
        && phase == Some(TaskPhase::Pending)
    {
        d.requeue_at(at, now);
    }
    d.outcome = attempt_outcome(d);

    if phase.is_some_and(TaskPhase::is_terminal) {
        let delivered = d
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == CALLBACK_DELIVERED);
        // The callback reports the final status: sent once no worker of the task runs.
        if spec.callback.is_some() && !delivered && fenced_pod.is_none() {
            d.actions.push(Action::SendCallback);
        }
        let handled = exit::decide(d, inputs, fenced_pod.is_none());
        // The task goes only once its exit handler's end is recorded: the handler goes with it.
        if let (Some(ttl), Some(finished)) = (spec.ttl_seconds_after_finished, d.status.finished_at)
            && fenced_pod.is_none()
            && handled
        {
            let expires = observe::add_seconds(finished, ttl);
            if now >= expires {
                d.actions.push(Action::DeleteTask);
            } else {
                d.requeue_at(expires, now);
            }
        }
    }
    conditions::update(d, inputs, fenced_pod, now);
}

/// Kills, as a level: every pod that should not run and may still run is deleted (again, with a
/// shorter grace if it is being deleted with a longer one), and the outcome finalizer comes off
/// every pod whose outcome can now be read. A fan-out item's ended pods are removed once it has
/// Succeeded (actions follow the status write, so its outcome and output are recorded first): a
/// `forEach` of 100,000 items would otherwise leave 100,000 pods in etcd and in the operator's
/// cache, and nothing reads them again. A failed item keeps its pods, for its logs.
fn stop_pods(d: &mut Decision, inputs: &Inputs, now: Timestamp) {
    let remove_ended = inputs.fan_out_item && d.status.phase == Some(TaskPhase::Succeeded);
    for pod in inputs.pods {
        let Some(uid) = pod.uid.clone() else {
            // Created a moment ago and not seen yet: it is handled once the cache shows it.
            continue;
        };
        if remove_ended && pod.is_inert() {
            d.actions.push(Action::RemovePod {
                name: pod.name.clone(),
                uid,
            });
            continue;
        }
        if pod.outcome_finalizer && pod.deleting {
            match outcome_release(pod, &d.status, now) {
                Release::Now => d.actions.push(Action::RemoveFinalizer {
                    name: pod.name.clone(),
                    uid: uid.clone(),
                }),
                Release::At(at) => d.requeue_at(at, now),
                Release::Keep => {}
            }
        }
        if should_run(pod, &d.status) || !pod.is_running_phase() {
            continue;
        }
        let grace = kill_grace(pod, &d.status);
        let sent = pod.deleting
            && match (grace, pod.deletion_grace_seconds) {
                (None, _) => true,
                (Some(want), Some(current)) => current <= want,
                (Some(_), None) => true,
            };
        if sent {
            continue;
        }
        let timed_out =
            d.status.phase == Some(TaskPhase::TimedOut) && pod.attempt == d.status.attempt;
        d.actions.push(Action::KillPod {
            name: pod.name.clone(),
            uid,
            grace_seconds: grace,
            keep_outcome: timed_out && !pod.outcome_finalizer && !pod.deleting,
        });
    }
}

/// How long past its deletion's due time a pod whose worker may still report a late success keeps
/// its outcome finalizer: a kubelet that answers at all confirms a deletion within seconds of it.
pub const OUTCOME_WAIT_PAST_DELETION_SECONDS: i64 = 60;

/// When the outcome finalizer comes off a pod being deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Now,
    /// Not before then, unless the pod finishes or its node goes first.
    At(Timestamp),
    /// While the pod is read for the attempt in flight.
    Keep,
}

/// The outcome finalizer of a pod being deleted comes off once `status` (the status written
/// before the finalizer's removal) holds all the pod can tell: its attempt ended before (an older
/// attempt, a retry scheduled, a terminal phase) or it is of an attempt that will not be taken up.
/// The next attempt's pod of a Pending task whose wait is over (a dispatch whose status write did
/// not land) is that attempt: it is taken up once nothing else fences the task, and keeps its
/// outcome until then (the chaos soak found one released while the previous attempt's pod was
/// still being deleted: its run left no record and the attempt ran again); one made while the task
/// still waits (its backoff, `startAfter`) is stopped instead, and goes. The current
/// attempt's pod, Failed or TimedOut, may still report a late success: it keeps the finalizer until
/// its main container finished, or until nothing will report on it again — never scheduled, its
/// node gone, the deletion forced (grace 0: Kubernetes 1.20's pod GC for a deleted node, `kubectl
/// delete --force`), or [`OUTCOME_WAIT_PAST_DELETION_SECONDS`] past its due time. While the attempt
/// is in flight the pod is still read (the decision that saw the deletion has ended it already).
fn outcome_release(pod: &WorkerState, status: &AxTaskStatus, now: Timestamp) -> Release {
    let phase = status.phase;
    if pod.attempt != status.attempt {
        let taken_up_once_unfenced = pod.attempt == status.attempt + 1
            && phase == Some(TaskPhase::Pending)
            && status.next_attempt_at.is_none_or(|at| at <= now);
        return if taken_up_once_unfenced {
            Release::Keep
        } else {
            Release::Now
        };
    }
    match phase {
        Some(p) if p.has_worker() => Release::Keep,
        Some(TaskPhase::Failed | TaskPhase::TimedOut) => {
            let unreachable = pod.node.is_none()
                || pod.node_gone
                || pod.deletion_grace_seconds == Some(0)
                || pod.main_finished();
            match pod.deletion_due {
                _ if unreachable => Release::Now,
                Some(due) => {
                    let at = observe::add_seconds(due, OUTCOME_WAIT_PAST_DELETION_SECONDS);
                    if now >= at {
                        Release::Now
                    } else {
                        Release::At(at)
                    }
                }
                None => Release::Keep,
            }
        }
        _ => Release::Now,
    }
}

/// How long a pod that should not run gets to stop: timeouts get a short grace, a container that
/// cannot start none, a canceled or finished task's pod its own `terminationGracePeriodSeconds`.
fn kill_grace(pod: &WorkerState, status: &AxTaskStatus) -> Option<i64> {
    if pod.attempt != status.attempt {
        return Some(TIMEOUT_KILL_GRACE_SECONDS);
    }
    let failure = status
        .last_failure
        .as_ref()
        .filter(|f| f.attempt == status.attempt);
    match (status.phase, failure) {
        (Some(TaskPhase::Canceled | TaskPhase::Succeeded), _) => None,
        (_, Some(f)) if f.kind == FailureKind::Timeout => Some(TIMEOUT_KILL_GRACE_SECONDS),
        (_, Some(_)) if pod.stuck_reason.is_some() => Some(0),
        _ => None,
    }
}

/// How the attempt in flight ended in this decision, as the circuit breaker sees it: a success or
/// a failure of the worker counts; an attempt that ended for a reason saying nothing about its type
/// (canceled, infrastructure, a refused pod) is `Aborted`.
fn attempt_outcome(d: &Decision) -> Option<Outcome> {
    let ended = d
        .transitions
        .iter()
        .find(|t| t.from.is_some_and(TaskPhase::has_worker) && !t.to.has_worker())?;
    Some(match ended.to {
        TaskPhase::Succeeded => Outcome::Succeeded,
        TaskPhase::Failed | TaskPhase::TimedOut => {
            let infrastructure = d.status.last_failure.as_ref().is_some_and(|f| {
                f.attempt == ended.attempt && f.kind == FailureKind::Infrastructure
            });
            if infrastructure {
                Outcome::Aborted
            } else {
                Outcome::Failed
            }
        }
        _ => Outcome::Aborted,
    })
}

/// How a history entry is published as an Event: failures, timeouts, warnings and outcomes tell a
/// person something; the routine steps (queued, dispatched, running) are in the history only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    Normal,
    Warning,
}

pub fn notice(entry: &HistoryEntry) -> Option<Notice> {
    match entry.to {
        TaskPhase::Failed | TaskPhase::TimedOut | TaskPhase::Dead => Some(Notice::Warning),
        TaskPhase::Succeeded | TaskPhase::Canceled => Some(Notice::Normal),
        TaskPhase::Pending if entry.reason == Reason::PodForbidden.as_str() => {
            Some(Notice::Warning)
        }
        TaskPhase::Pending if entry.reason == Reason::Rerun.as_str() => Some(Notice::Normal),
        _ => None,
    }
}
