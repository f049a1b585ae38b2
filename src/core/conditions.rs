//! The conditions every kind shows, as the Kubernetes API conventions have them
//! (`type/status/reason/message/lastTransitionTime/observedGeneration`): their types, the reasons
//! that are not a kind's typed reasons (a task's phase reasons are `core::task::Reason`, what holds
//! a queued task `core::queue::HeldReason`), and the one builder. A condition's
//! `lastTransitionTime` moves only when its status does; its `observedGeneration` is the
//! generation of the spec the status was worked out from.
//!
//! | kind    | types                                                                   |
//! |---------|-------------------------------------------------------------------------|
//! | AxTask  | `Ready`, `Failed`, `Queued`, `CircuitOpen`, `WorkerTerminating`, `RerunRequested`, `CallbackDelivered` |
//! | AxDag   | `Ready`, `Failed`, `InvalidSpec`                                        |
//! | AxQueue | `InvalidSpec`                                                           |
//! | AxCron  | `InvalidSpec`, `Suspended`                                              |

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::Condition;

/// True once a task or DAG succeeded; its reason says how it ended otherwise.
pub const READY: &str = "Ready";
/// True once a task is Dead or a DAG Failed, so `kubectl wait --for=condition=Failed` ends where
/// `--for=condition=Ready` never will. A task has it from its first Dead on (False again after a
/// re-run); a DAG always.
pub const FAILED: &str = "Failed";

/// `Ready` and `Failed` restate the phase: views that show the phase leave them out.
pub fn restates_phase(type_: &str) -> bool {
    type_ == READY || type_ == FAILED
}
/// What holds a waiting task (its reason is a `HeldReason`).
pub const QUEUED: &str = "Queued";
/// A task held because its type's circuit is open.
pub const CIRCUIT_OPEN: &str = "CircuitOpen";
/// A pod that should no longer run is still stopping.
pub const WORKER_TERMINATING: &str = "WorkerTerminating";
/// A re-run was asked for (`spec.rerun`) and has not started yet.
pub const RERUN_REQUESTED: &str = "RerunRequested";
/// How the task's callback delivery ended.
pub const CALLBACK_DELIVERED: &str = "CallbackDelivered";
/// The spec cannot be acted on; the message names the field.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// A cron's or a Pending task's `spec.suspend` is set.
pub const SUSPENDED: &str = "Suspended";
/// False while the AxTaskTemplate a task's `spec.templateRef` names does not exist (the task
/// waits, unadmitted); gone once the spec is completed from it (`status.template` records it).
pub const TEMPLATE_RESOLVED: &str = "TemplateResolved";

/// Reasons of the conditions above.
pub mod reason {
    /// `InvalidSpec` is False.
    pub const VALID: &str = "Valid";
    /// `InvalidSpec` is True (and a DAG's `Ready` is False because of it).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A cron's `Suspended` is True; a task's `Suspended` is True, or its `Queued` is False.
    pub const SUSPENDED: &str = "Suspended";
    /// A cron's or a task's `Suspended` is False.
    pub const ACTIVE: &str = "Active";
    /// A task's `CircuitOpen` is True.
    pub const CIRCUIT_OPEN: &str = "CircuitOpen";
    /// A task's `CircuitOpen` is False.
    pub const NOT_HELD: &str = "NotHeld";
    /// A task's `WorkerTerminating` is True.
    pub const WAITING_FOR_POD: &str = "WaitingForPod";
    /// A task's `WorkerTerminating` is False.
    pub const PODS_STOPPED: &str = "PodsStopped";
    /// A task's `Queued` is False: waiting for its `startAfter`.
    pub const DELAYED: &str = "Delayed";
    /// A task's `Queued` is False: waiting out its backoff before the next attempt.
    pub const BACKOFF: &str = "Backoff";
    /// A task's `Queued` is True: its next attempt waits for the previous pod to stop.
    pub const WORKER_TERMINATING: &str = "WorkerTerminating";
    /// A task's `RerunRequested` is True: it has not finished yet.
    pub const WAITING_FOR_FINISH: &str = "WaitingForFinish";
    /// A task's `RerunRequested` is True: `spec.cancel` is still set.
    pub const CANCEL_SET: &str = "CancelSet";
    /// A task's `RerunRequested` is False.
    pub const RERUN_STARTED: &str = "RerunStarted";
    /// `CallbackDelivered` True.
    pub const DELIVERED: &str = "Delivered";
    /// `CallbackDelivered` False: attempted, and no answer or an error status.
    pub const DELIVERY_FAILED: &str = "DeliveryFailed";
    /// `CallbackDelivered` False: not attempted, the destination is not allowed.
    pub const CALLBACK_REFUSED: &str = "CallbackRefused";
    /// `TemplateResolved` False: the AxTaskTemplate does not exist.
    pub const TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";
}

/// `True` or `False`.
pub fn status_of(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// The condition `type_` with this value, keeping the `lastTransitionTime` it has in `before`
/// while its status is unchanged.
pub fn condition(
    before: &[Condition],
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = status_of(value);
    let last_transition_time = before
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time,
        observed_generation: generation,
    }
}

/// Sets `type_` in `conditions` as [`condition`] builds it, in its place, or last when missing.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let new = condition(conditions, type_, value, reason, message, generation, now);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => *c = new,
        None => conditions.push(new),
    }
}

/// The condition `type_` if its status is `value`.
pub fn find<'a>(conditions: &'a [Condition], type_: &str, value: bool) -> Option<&'a Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status_of(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_does() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            READY,
            false,
            "Running",
            "",
            Some(1),
            at(10),
        );
        set(
            &mut conditions,
            INVALID_SPEC,
            false,
            reason::VALID,
            "",
            Some(1),
            at(10),
        );
        set(
            &mut conditions,
            READY,
            false,
            "Retrying",
            "m",
            Some(2),
            at(20),
        );
        assert_eq!(conditions.len(), 2, "set in its place");
        let ready = &conditions[0];
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("Retrying", "m")
        );
        assert_eq!(ready.last_transition_time, Time(at(10)), "same status");
        assert_eq!(ready.observed_generation, Some(2));
        set(
            &mut conditions,
            READY,
            true,
            "Succeeded",
            "",
            Some(2),
            at(30),
        );
        assert_eq!(
            conditions[0].last_transition_time,
            Time(at(30)),
            "status changed"
        );
        assert_eq!(conditions[0].status, "True");
        assert!(find(&conditions, READY, true).is_some());
        assert!(find(&conditions, INVALID_SPEC, true).is_none());
    }

    #[test]
    fn a_condition_built_anew_keeps_its_transition_time_from_before() {
        let before = vec![condition(
            &[],
            SUSPENDED,
            true,
            reason::SUSPENDED,
            "",
            None,
            at(5),
        )];
        let same = condition(
            &before,
            SUSPENDED,
            true,
            reason::SUSPENDED,
            "x",
            Some(3),
            at(9),
        );
        assert_eq!(same.last_transition_time, Time(at(5)));
        let flipped = condition(
            &before,
            SUSPENDED,
            false,
            reason::ACTIVE,
            "",
            Some(3),
            at(9),
        );
        assert_eq!(flipped.last_transition_time, Time(at(9)));
    }
}
