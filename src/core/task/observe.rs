//! What is happening to a task now, as one [`Event`]: read from the task, every pod of it and the
//! clock. This is the one place that says which observation wins when several hold at once.
//!
//! Precedence, for each phase (the first that holds is the event):
//! - new (no phase): invalid spec → `SpecInvalid`; `spec.cancel` → `CancelRequested`; else `Created`.
//! - Pending: `spec.cancel`; an earlier attempt's pod still alive → nothing (wait, the fence);
//!   invalid spec; retry budget used up → `BudgetExhausted`; `nextAttemptAt` in the future → nothing;
//!   the next attempt's pod exists already → `NextPodFound` (it was created beside the dispatch's
//!   status write, which did not land: the attempt is taken up with it, never with a second pod);
//!   a slot from the dispatcher → `Granted`.
//! - Scheduled/Running: `spec.cancel`; the pod create refused → `PodRefused`; then the current
//!   attempt's pod: missing (Scheduled: before the hard timeout the pod is created, after it
//!   `PodNeverAppeared`; Running: `WorkerGone`); Scheduled and its main container has started (a
//!   start time, whatever happened since) → `WorkerStarted`; it exited 0 → `WorkerSucceeded` (a
//!   result that arrived wins over a timeout); someone else deletes it → `WorkerFailed`
//!   (Infrastructure, whatever its exit code); it failed, or cannot start → `WorkerFailed`; the hard
//!   timeout passed → `HardTimeout`; the soft timeout passed and the worker is not alive →
//!   `SoftTimeoutNotAlive`; Scheduled and the pod runs → `WorkerStarted`.
//! - Failed/TimedOut (the attempt ended; its pod may still be stopping): `spec.cancel`; the main
//!   container exited 0 after all → `WorkerSucceeded` (a late success); every pod of the task stopped
//!   → `WorkersStopped`, when the retry decision is taken.
//! - Succeeded/Dead/Canceled: a re-run request and `spec.cancel` false → `RerunRequested`.
//!
//! The fence: a pod blocks the next attempt (and a Dead verdict) while it exists and is not in phase
//! Succeeded/Failed, or while it is being deleted — a pod the API server still shows as Terminating
//! may still run its worker (a node that stopped answering) until it is gone. With
//! `podReplacementPolicy: TerminatingOrFailed` a pod being deleted no longer blocks.

use jiff::{SignedDuration, Timestamp};

use super::Inputs;
use super::classify::classify;
use super::reason::Reason;
use crate::api::{AxTaskSpec, AxTaskStatus, Failure, FailureKind, PodReplacementPolicy, TaskPhase};
use crate::core::worker::{MainContainer, PodPhase, WorkerState, main_container_name};

/// One thing that happened, for the transition table in `machine.rs`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Created,
    SpecInvalid(String),
    CancelRequested,
    RerunRequested,
    BudgetExhausted,
    Granted,
    NextPodFound,
    PodRefused(Refusal),
    PodNeverAppeared,
    WorkerGone,
    WorkerStarted,
    WorkerSucceeded,
    WorkerFailed(Failure),
    HardTimeout,
    SoftTimeoutNotAlive(String),
    /// The queue drains (`stopPolicy: HoldAndDrain`) and the attempt has no outcome yet.
    Drained,
    /// The queue preempts the attempt for a waiting task of higher priority, and it has no
    /// outcome yet.
    Preempted,
    WorkersStopped,
}

/// The API server's answer when the worker pod was not created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 403: a ResourceQuota, LimitRange or admission webhook said no. Waiting may help.
    Forbidden(String),
    /// 422/400: the pod is invalid. Only a spec change helps.
    Invalid(String),
}

pub(crate) fn add_seconds(t: Timestamp, seconds: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_secs(seconds))
        .unwrap_or(Timestamp::MAX)
}

/// When the current attempt's hard timeout passes (counted from its dispatch).
pub fn hard_deadline(spec: &AxTaskSpec, status: &AxTaskStatus, now: Timestamp) -> Timestamp {
    add_seconds(
        status.scheduled_at.unwrap_or(now),
        spec.timeout.hard_seconds,
    )
}

/// The pod of the current attempt, if any.
pub fn current_pod<'a>(status: &AxTaskStatus, pods: &'a [WorkerState]) -> Option<&'a WorkerState> {
    if status.attempt == 0 {
        return None;
    }
    pods.iter().find(|p| p.attempt == status.attempt)
}

/// Whether `pod` may run a worker now, as far as the next attempt is concerned. A pod in phase
/// Succeeded never does, even while it is being deleted: only its kubelet sets that phase, once
/// every container has exited 0 for good. A Failed pod being deleted still may: pod GC marks the
/// pods of a node that stopped answering Failed while they may run on there.
pub fn blocks(pod: &WorkerState, policy: PodReplacementPolicy) -> bool {
    if pod.phase == PodPhase::Succeeded {
        return false;
    }
    match policy {
        PodReplacementPolicy::Failed => pod.is_running_phase() || pod.deleting,
        PodReplacementPolicy::TerminatingOrFailed => pod.is_running_phase() && !pod.deleting,
    }
}

/// Whether the pod should be running: it is the current attempt's and the attempt is in flight.
pub fn should_run(pod: &WorkerState, status: &AxTaskStatus) -> bool {
    pod.attempt == status.attempt && status.phase.is_some_and(TaskPhase::has_worker)
}

/// The pod of the attempt after the current one (seen in the cache, or created by this process a
/// moment ago): created at a dispatch whose status write was put off (see `Decision::write_by`) or
/// did not land. It is that attempt, running, finished (its work may be done) or being deleted
/// (evicted, force-deleted), so the dispatch is finished with it rather than with a second pod of
/// the same name: the attempt it ran is recorded, and one deleted under it fails as infrastructure.
pub fn next_attempt_pod<'a>(
    status: &AxTaskStatus,
    pods: &'a [WorkerState],
) -> Option<&'a WorkerState> {
    let next = status.attempt.checked_add(1)?;
    pods.iter().find(|p| p.attempt == next)
}

/// The pods that should not run and may still: the fence holds while there is one.
pub fn fence<'a>(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    pods: &'a [WorkerState],
) -> Vec<&'a WorkerState> {
    pods.iter()
        .filter(|p| !should_run(p, status) && blocks(p, spec.retry.pod_replacement_policy))
        .collect()
}

/// A re-run was requested and not yet acted on.
pub fn rerun_requested(spec: &AxTaskSpec, status: &AxTaskStatus) -> bool {
    spec.rerun > status.observed_rerun
}

/// What is happening now; `None` when nothing moves the task.
pub fn observe(
    inputs: &Inputs,
    status: &AxTaskStatus,
    granted: bool,
    now: Timestamp,
) -> Option<Event> {
    let spec = inputs.spec;
    let invalid = || inputs.spec_error.map(|e| Event::SpecInvalid(e.to_string()));
    let fence = fence(spec, status, inputs.pods);
    let fenced = !fence.is_empty();
    let Some(phase) = status.phase else {
        return invalid()
            .or(spec.cancel.then_some(Event::CancelRequested))
            .or(Some(Event::Created));
    };
    match phase {
        TaskPhase::Pending => {
            if spec.cancel {
                return Some(Event::CancelRequested);
            }
            // The next attempt's own pod does not fence its dispatch; any other pod that may run
            // does. A Dead verdict waits for every pod, that one too (it is stopped meanwhile).
            let next_pod = next_attempt_pod(status, inputs.pods);
            if fence
                .iter()
                .any(|p| Some(p.name.as_str()) != next_pod.map(|n| n.name.as_str()))
            {
                return None;
            }
            let next_runs = next_pod.is_some_and(|p| blocks(p, spec.retry.pod_replacement_policy));
            if let Some(e) = invalid() {
                return (!next_runs).then_some(e);
            }
            let budget_used = status.attempt > 0
                && status
                    .budget_deadline
                    .is_some_and(|deadline| now >= deadline);
            if budget_used {
                return (!next_runs).then_some(Event::BudgetExhausted);
            }
            if status.next_attempt_at.is_some_and(|at| at > now) {
                return None;
            }
            if next_pod.is_some() {
                return Some(Event::NextPodFound);
            }
            // A slot granted just before `suspend` was seen goes back unused; so does one the queue
            // took back for a waiting task of higher priority before its pod was created.
            (granted && !spec.suspend && !inputs.preempted).then_some(Event::Granted)
        }
        TaskPhase::Scheduled | TaskPhase::Running => {
            if spec.cancel {
                return Some(Event::CancelRequested);
            }
            if phase == TaskPhase::Scheduled
                && let Some(refusal) = &inputs.refused
            {
                return Some(Event::PodRefused((*refusal).clone()));
            }
            in_flight(inputs, status, current_pod(status, inputs.pods), now)
                .or(inputs.draining.then_some(Event::Drained))
                .or(inputs.preempted.then_some(Event::Preempted))
        }
        TaskPhase::Failed | TaskPhase::TimedOut => {
            if spec.cancel {
                return Some(Event::CancelRequested);
            }
            if current_pod(status, inputs.pods).is_some_and(main_exited_zero) {
                return Some(Event::WorkerSucceeded);
            }
            (!fenced).then_some(Event::WorkersStopped)
        }
        TaskPhase::Succeeded | TaskPhase::Dead | TaskPhase::Canceled => {
            (rerun_requested(spec, status) && !spec.cancel).then_some(Event::RerunRequested)
        }
    }
}

fn in_flight(
    inputs: &Inputs,
    status: &AxTaskStatus,
    pod: Option<&WorkerState>,
    now: Timestamp,
) -> Option<Event> {
    let spec = inputs.spec;
    let hard_at = hard_deadline(spec, status, now);
    let Some(w) = pod else {
        return match status.phase {
            Some(TaskPhase::Scheduled) if now < hard_at => None,
            Some(TaskPhase::Scheduled) => Some(Event::PodNeverAppeared),
            _ => Some(Event::WorkerGone),
        };
    };
    // A worker that started is Running before it has an outcome, even when it is first seen
    // finished: the history then says where and from when it ran.
    if status.phase == Some(TaskPhase::Scheduled) && w.started_at.is_some() {
        return Some(Event::WorkerStarted);
    }
    if main_exited_zero(w) {
        return Some(Event::WorkerSucceeded);
    }
    // Before its exit code: a worker stopped by someone else's delete exits non-zero (143 after
    // SIGTERM), which is not its fault.
    if w.deleting {
        return Some(Event::WorkerFailed(Failure {
            attempt: status.attempt,
            kind: FailureKind::Infrastructure,
            exit_code: w.exit.as_ref().map(|e| e.exit_code).filter(|c| *c != 0),
            reason: Reason::WorkerDeleted.as_str().into(),
            message: format!("worker pod {} is being deleted by someone else", w.name),
        }));
    }
    let failed = w.phase == PodPhase::Failed
        || (w.main == MainContainer::Terminated && w.exit.is_some())
        || w.stuck_reason.is_some();
    if failed {
        return Some(Event::WorkerFailed(classify(
            &spec.retry.rules,
            w,
            status.attempt,
        )));
    }
    if now >= hard_at {
        return Some(Event::HardTimeout);
    }
    if let Some(why) = soft_timeout_not_alive(spec, status, w, inputs.main_has_probe, now) {
        return Some(Event::SoftTimeoutNotAlive(why));
    }
    (status.phase == Some(TaskPhase::Scheduled) && w.phase == PodPhase::Running)
        .then_some(Event::WorkerStarted)
}

/// The main container decides: it exited 0 (whatever sidecars do), or the pod Succeeded.
pub fn main_exited_zero(w: &WorkerState) -> bool {
    w.phase == PodPhase::Succeeded
        || (w.main == MainContainer::Terminated
            && w.exit.as_ref().is_some_and(|e| e.exit_code == 0))
}

/// When the soft timeout passes for the current attempt, if it is set and not yet checked.
pub fn soft_deadline(spec: &AxTaskSpec, status: &AxTaskStatus) -> Option<Timestamp> {
    let soft = spec.timeout.soft_seconds?;
    let running_since = status.started_at?;
    if status.soft_timeout_attempt == Some(status.attempt) {
        return None;
    }
    Some(add_seconds(running_since, soft))
}

/// Whether the main container has a readiness or liveness probe: then it answers "are you still
/// there" itself.
pub fn main_has_probe(spec: &AxTaskSpec) -> bool {
    let containers = spec.template.containers();
    let annotations = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref());
    main_container_name(annotations, containers)
        .and_then(|main| containers.iter().find(|c| c.name == main))
        .is_some_and(|c| c.readiness_probe.is_some() || c.liveness_probe.is_some())
}

/// At the soft timeout: `Some(why)` when the worker is not alive. With a probe, alive means the
/// main container is Ready now and never restarted; without one, that the pod is Running, never
/// restarted, on a node that is not known to be NotReady.
pub fn soft_timeout_not_alive(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    w: &WorkerState,
    probe: bool,
    now: Timestamp,
) -> Option<String> {
    let soft_at = soft_deadline(spec, status)?;
    if now < soft_at {
        return None;
    }
    let soft = spec.timeout.soft_seconds.unwrap_or_default();
    if probe {
        let ready = matches!(w.main, MainContainer::Running { ready: true });
        if ready && w.restarts == 0 {
            return None;
        }
        return Some(format!(
            "worker not alive at softSeconds={soft}: its probe fails (main container {:?}, restarts {})",
            w.main, w.restarts
        ));
    }
    let alive = w.phase == PodPhase::Running && w.restarts == 0 && w.node_ready != Some(false);
    if alive {
        return None;
    }
    Some(format!(
        "worker not alive at softSeconds={soft} (pod {:?}, restarts {}, node ready {:?})",
        w.phase, w.restarts, w.node_ready
    ))
}
