//! A task's conditions: `Ready`, `Queued` (what holds a waiting task), `CircuitOpen`,
//! `WorkerTerminating` (a pod that should not run is still stopping), `RerunRequested` and
//! `CallbackDelivered`. A condition's `lastTransitionTime` moves only when its status value does.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::observe::rerun_requested;
use super::reason::Reason;
use super::{Decision, Inputs};
use crate::api::{AxTaskStatus, Condition, TaskPhase};
use crate::core::queue::{HeldReason, estimate};

pub const READY: &str = "Ready";
pub const QUEUED: &str = "Queued";
pub const CIRCUIT_OPEN: &str = "CircuitOpen";
pub const WORKER_TERMINATING: &str = "WorkerTerminating";
pub const RERUN_REQUESTED: &str = "RerunRequested";
pub const CALLBACK_DELIVERED: &str = "CallbackDelivered";

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
            CallbackResult::Delivered => "Delivered",
            CallbackResult::Failed => "DeliveryFailed",
            CallbackResult::Refused => "CallbackRefused",
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
    let value = if result == CallbackResult::Delivered {
        "True"
    } else {
        "False"
    };
    let generation = status.observed_generation;
    set_condition(
        &mut s,
        CALLBACK_DELIVERED,
        value,
        result.reason(),
        message,
        now,
        generation,
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
        TaskPhase::Succeeded => ("True", "Succeeded"),
        p => ("False", p.as_str()),
    };
    let ready_message = status.reason.clone().unwrap_or_default();
    set_condition(
        status,
        READY,
        ready,
        ready_reason,
        &ready_message,
        now,
        generation,
    );

    let (queued, queued_reason, queued_message) = queued(status, inputs, &fenced, now);
    set_condition(
        status,
        QUEUED,
        queued,
        &queued_reason,
        &queued_message,
        now,
        generation,
    );
    let circuit = queued == "True" && queued_reason == HeldReason::CircuitOpen.as_str();
    if circuit {
        set_condition(
            status,
            CIRCUIT_OPEN,
            "True",
            "CircuitOpen",
            &queued_message,
            now,
            generation,
        );
    } else if has_true(status, CIRCUIT_OPEN) {
        let message = "no longer held by an open circuit";
        set_condition(
            status,
            CIRCUIT_OPEN,
            "False",
            "NotHeld",
            message,
            now,
            generation,
        );
    }

    match &fenced {
        Some((pod, attempt)) => {
            let message = format!(
                "waiting for pod {pod} (attempt {attempt}) to stop; the next attempt and the final phase wait until it is gone"
            );
            set_condition(
                status,
                WORKER_TERMINATING,
                "True",
                "WaitingForPod",
                &message,
                now,
                generation,
            );
        }
        None if has_true(status, WORKER_TERMINATING) => {
            set_condition(
                status,
                WORKER_TERMINATING,
                "False",
                "PodsStopped",
                "",
                now,
                generation,
            );
        }
        None => {}
    }

    if rerun_requested(inputs.spec, status) {
        let (reason, message) = if !phase.is_terminal() {
            (
                "WaitingForFinish",
                format!(
                    "spec.rerun={} is acted on when the task has finished",
                    inputs.spec.rerun
                ),
            )
        } else {
            (
                "CancelSet",
                "spec.cancel is true: set it to false for the re-run to start".to_string(),
            )
        };
        set_condition(
            status,
            RERUN_REQUESTED,
            "True",
            reason,
            &message,
            now,
            generation,
        );
    } else if has_true(status, RERUN_REQUESTED) {
        set_condition(
            status,
            RERUN_REQUESTED,
            "False",
            "RerunStarted",
            "",
            now,
            generation,
        );
    }
}

fn has_true(status: &AxTaskStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The `Queued` condition: true while the task waits for a slot, with what holds it.
fn queued(
    status: &AxTaskStatus,
    inputs: &Inputs,
    fenced: &Option<(String, i32)>,
    now: Timestamp,
) -> (&'static str, String, String) {
    let phase = status.phase.unwrap_or_default();
    if phase != TaskPhase::Pending {
        return ("False", phase.as_str().into(), String::new());
    }
    if let Some(at) = status.next_attempt_at.filter(|t| *t > now) {
        let refused = status
            .last_failure
            .as_ref()
            .filter(|f| f.attempt == status.attempt && f.reason == Reason::PodForbidden.as_str());
        return match refused {
            Some(f) => (
                "False",
                Reason::PodForbidden.as_str().into(),
                format!(
                    "the worker pod was not created ({}); next try at {at}",
                    f.message
                ),
            ),
            None if status.attempt == 0 => {
                ("False", "Delayed".into(), format!("waiting until {at}"))
            }
            None => ("False", "Backoff".into(), format!("waiting until {at}")),
        };
    }
    if let Some((pod, attempt)) = fenced {
        return (
            "True",
            "WorkerTerminating".into(),
            format!("waiting for pod {pod} (attempt {attempt}) to stop"),
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
                    ("True", c.reason.clone(), c.message.clone())
                }
                _ => ("True", reason.as_str().into(), message.to_string()),
            }
        }
        None => {
            // What holds a queued task is the queue's to say: keep its last word.
            let current = status.condition(QUEUED);
            match current {
                Some(c) if c.status == "True" && HeldReason::parse(&c.reason).is_some() => {
                    ("True", c.reason.clone(), c.message.clone())
                }
                _ => (
                    "True",
                    HeldReason::Waiting.as_str().into(),
                    "waiting for dispatch".into(),
                ),
            }
        }
    }
}

/// Sets a condition; `lastTransitionTime` moves only when its status value changes.
pub fn set_condition(
    status: &mut AxTaskStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    match status.conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != value {
                c.last_transition_time = Time(now);
            }
            c.status = value.into();
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
        }
        None => status.conditions.push(Condition {
            type_: type_.into(),
            status: value.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(now),
            observed_generation: generation,
        }),
    }
}
