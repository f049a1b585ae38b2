//! A task's conditions: `Ready`, `Failed` (from the first Dead on), `Queued` (what holds a waiting task), `CircuitOpen`,
//! `WorkerTerminating` (a pod that should not run is still stopping), `RerunRequested` and
//! `CallbackDelivered`: what each means for a task. The types, reasons and the builder are
//! `core::conditions`'.

use jiff::Timestamp;

use super::observe::rerun_requested;
use super::reason::Reason;
use super::{Decision, Inputs};
use crate::api::{AxTaskStatus, TaskPhase};
use crate::core::conditions::{self, reason};
use crate::core::queue::{HeldReason, estimate};

pub use crate::core::conditions::{
    CALLBACK_DELIVERED, CIRCUIT_OPEN, FAILED, QUEUED, READY, RERUN_REQUESTED, SUSPENDED,
    WORKER_TERMINATING,
};

/// How a callback delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallbackResult {
    Delivered,
    /// Attempted and failed (no answer, an error status).
    Failed,
    /// Not attempted: the destination is not allowed.
    Refused,
}

impl CallbackResult {
    fn reason(self) -> &'static str {
        match self {
            CallbackResult::Delivered => reason::DELIVERED,
            CallbackResult::Failed => reason::DELIVERY_FAILED,
            CallbackResult::Refused => reason::CALLBACK_REFUSED,
        }
    }
}

/// Records a callback's outcome as the `CallbackDelivered` condition; never changes the phase.
pub fn callback_outcome(
    status: &AxTaskStatus,
    result: CallbackResult,
    message: &str,
    now: Timestamp,
) -> AxTaskStatus {
    let mut s = status.clone();
    let delivered = result == CallbackResult::Delivered;
    let generation = status.observed_generation;
    conditions::set(
        &mut s.conditions,
        CALLBACK_DELIVERED,
        delivered,
        result.reason(),
        message,
        generation,
        now,
    );
    s
}

/// Brings the conditions in line with where the decision left the task. `fenced`: the first pod
/// that should not run and may still, with its attempt.
pub(super) fn update(
    d: &mut Decision,
    inputs: &Inputs,
    fenced: Option<(String, i32)>,
    now: Timestamp,
) {
    let generation = inputs.generation;
    let status = &mut d.status;
    let phase = status.phase.unwrap_or_default();

    let (ready, ready_reason) = match phase {
        TaskPhase::Succeeded => (true, TaskPhase::Succeeded.as_str()),
        p => (false, p.as_str()),
    };
    let ready_message = status.reason.clone().unwrap_or_default();
    conditions::set(
        &mut status.conditions,
        READY,
        ready,
        ready_reason,
        &ready_message,
        generation,
        now,
    );

    // Only a task that went Dead has it: one condition less on every other task's status.
    let failed = phase == TaskPhase::Dead;
    if failed || status.condition(FAILED).is_some() {
        let message = if failed { ready_message.as_str() } else { "" };
        conditions::set(
            &mut status.conditions,
            FAILED,
            failed,
            phase.as_str(),
            message,
            generation,
            now,
        );
    }

    let (queued, queued_reason, queued_message) = queued(status, inputs, &fenced, now);
    conditions::set(
        &mut status.conditions,
        QUEUED,
        queued,
        &queued_reason,
        &queued_message,
        generation,
        now,
    );
    let circuit = queued && queued_reason == HeldReason::CircuitOpen.as_str();
    if circuit {
        conditions::set(
            &mut status.conditions,
            CIRCUIT_OPEN,
            true,
            reason::CIRCUIT_OPEN,
            &queued_message,
            generation,
            now,
        );
    } else if has_true(status, CIRCUIT_OPEN) {
        let message = "no longer held by an open circuit";
        conditions::set(
            &mut status.conditions,
            CIRCUIT_OPEN,
            false,
            reason::NOT_HELD,
            message,
            generation,
            now,
        );
    }

    match &fenced {
        Some((pod, attempt)) => {
            let message = format!(
                "waiting for pod {pod} (attempt {attempt}) to stop; the next attempt and the final phase wait until it is gone"
            );
            conditions::set(
                &mut status.conditions,
                WORKER_TERMINATING,
                true,
                reason::WAITING_FOR_POD,
                &message,
                generation,
                now,
            );
        }
        None if has_true(status, WORKER_TERMINATING) => {
            conditions::set(
                &mut status.conditions,
                WORKER_TERMINATING,
                false,
                reason::PODS_STOPPED,
                "",
                generation,
                now,
            );
        }
        None => {}
    }

    // Only a task that was suspended has it, like `CircuitOpen`.
    let suspended = inputs.spec.suspend && phase == TaskPhase::Pending;
    if suspended {
        conditions::set(
            &mut status.conditions,
            SUSPENDED,
            true,
            reason::SUSPENDED,
            "spec.suspend is true: no attempt is dispatched until it is false",
            generation,
            now,
        );
    } else if has_true(status, SUSPENDED) {
        conditions::set(
            &mut status.conditions,
            SUSPENDED,
            false,
            reason::ACTIVE,
            "",
            generation,
            now,
        );
    }

    if rerun_requested(inputs.spec, status) {
        let (reason, message) = if !phase.is_terminal() {
            (
                reason::WAITING_FOR_FINISH,
                format!(
                    "spec.rerun={} is acted on when the task has finished",
                    inputs.spec.rerun
                ),
            )
        } else {
            (
                reason::CANCEL_SET,
                "spec.cancel is true: set it to false for the re-run to start".to_string(),
            )
        };
        conditions::set(
            &mut status.conditions,
            RERUN_REQUESTED,
            true,
            reason,
            &message,
            generation,
            now,
        );
    } else if has_true(status, RERUN_REQUESTED) {
        conditions::set(
            &mut status.conditions,
            RERUN_REQUESTED,
            false,
            reason::RERUN_STARTED,
            "",
            generation,
            now,
        );
    }
}

fn has_true(status: &AxTaskStatus, type_: &str) -> bool {
    conditions::find(&status.conditions, type_, true).is_some()
}

/// The `Queued` condition: true while the task waits for a slot, with what holds it.
fn queued(
    status: &AxTaskStatus,
    inputs: &Inputs,
    fenced: &Option<(String, i32)>,
    now: Timestamp,
) -> (bool, String, String) {
    let phase = status.phase.unwrap_or_default();
    if phase != TaskPhase::Pending {
        return (false, phase.as_str().into(), String::new());
    }
    if let Some(at) = status.next_attempt_at.filter(|t| *t > now) {
        let refused = status
            .last_failure
            .as_ref()
            .filter(|f| f.attempt == status.attempt && f.reason == Reason::PodForbidden.as_str());
        return match refused {
            Some(f) => (
                false,
                Reason::PodForbidden.as_str().into(),
                format!(
                    "the worker pod was not created ({}); next try at {at}",
                    f.message
                ),
            ),
            None if status.attempt == 0 => {
                (false, reason::DELAYED.into(), format!("waiting until {at}"))
            }
            None => (false, reason::BACKOFF.into(), format!("waiting until {at}")),
        };
    }
    if let Some((pod, attempt)) = fenced {
        return (
            true,
            reason::WORKER_TERMINATING.into(),
            format!("waiting for pod {pod} (attempt {attempt}) to stop"),
        );
    }
    if inputs.spec.suspend {
        return (
            false,
            reason::SUSPENDED.into(),
            "spec.suspend is true: not dispatched until it is false".into(),
        );
    }
    match inputs.held {
        Some((reason, message)) => {
            // Same reason and an estimate that did not move: keep the written message, whose
            // place and time alone would differ at every reconcile (and cost a write each).
            let current = status
                .conditions
                .iter()
                .find(|c| c.type_ == QUEUED && c.status == "True" && c.reason == reason.as_str());
            match current {
                Some(c) if !estimate::message_moved(&c.message, message, now) => {
                    (true, c.reason.clone(), c.message.clone())
                }
                _ => (true, reason.as_str().into(), message.to_string()),
            }
        }
        None => {
            // What holds a queued task is the queue's to say: keep its last word.
            let current = status.condition(QUEUED);
            match current {
                Some(c) if c.status == "True" && HeldReason::parse(&c.reason).is_some() => {
                    (true, c.reason.clone(), c.message.clone())
                }
                _ => (
                    true,
                    HeldReason::Waiting.as_str().into(),
                    "waiting for dispatch".into(),
                ),
            }
        }
    }
}
