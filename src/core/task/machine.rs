//! The AxTask state machine of DESIGN §3 as one table: `(phase, event) → next phase, reason`, with
//! the bookkeeping each row does. Which event holds is decided in `observe.rs`; what to do to the
//! pods afterwards (create, kill, release) in `mod.rs`, from the phase this leaves.

use jiff::Timestamp;

use super::observe::{Event, Refusal};
use super::reason::Reason;
use super::{ACTOR_USER, ACTOR_WORKER, Clock, Decision, Inputs};
use crate::api::{AttemptRecord, Failure, FailureKind, TaskPhase};
use crate::core::backoff::retry_delay;
use crate::core::conditions::CALLBACK_DELIVERED;
use crate::core::output::{self, Output};
use crate::core::worker::pod_name;

use TaskPhase::{Canceled, Dead, Failed, Pending, Running, Scheduled, Succeeded, TimedOut};

/// Every (from, to) pair a decision may record; `None` is a task the operator has not seen yet.
pub const LEGAL: &[(Option<TaskPhase>, TaskPhase)] = &[
    (None, Pending),
    (None, Dead),
    (None, Canceled),
    (Some(Pending), Scheduled),
    (Some(Pending), Dead),
    (Some(Pending), Canceled),
    (Some(Scheduled), Running),
    (Some(Scheduled), Succeeded),
    (Some(Scheduled), Failed),
    (Some(Scheduled), TimedOut),
    (Some(Scheduled), Canceled),
    // The API server refused the pod (quota): back in the queue without a failure counted.
    (Some(Scheduled), Pending),
    (Some(Running), Succeeded),
    (Some(Running), Failed),
    (Some(Running), TimedOut),
    (Some(Running), Canceled),
    (Some(Failed), Pending),
    (Some(Failed), Dead),
    (Some(Failed), Canceled),
    // A late success: the worker finished while it was being stopped, before any next attempt.
    (Some(Failed), Succeeded),
    (Some(TimedOut), Pending),
    (Some(TimedOut), Dead),
    (Some(TimedOut), Canceled),
    (Some(TimedOut), Succeeded),
    // Re-runs.
    (Some(Succeeded), Pending),
    (Some(Dead), Pending),
    (Some(Canceled), Pending),
];

pub fn is_legal(from: Option<TaskPhase>, to: TaskPhase) -> bool {
    LEGAL.contains(&(from, to))
}

/// Applies one event; returns whether the phase changed (the caller then observes again).
pub fn step(d: &mut Decision, event: Event, inputs: &Inputs, clock: &Clock) -> bool {
    let now = clock.now;
    let op = clock.operator;
    match (d.status.phase, event) {
        (None, Event::Created) => admit(d, inputs, clock),
        (None | Some(Pending), Event::SpecInvalid(error)) => {
            d.status.dead_reason = Some(format!("invalid spec: {error}"));
            d.transition(Dead, Reason::InvalidSpec, error, op, now);
        }
        (Some(phase), Event::CancelRequested) if !phase.is_terminal() => {
            let message = match phase {
                Pending => "canceled while pending",
                Scheduled | Running => "canceled; the worker is stopped",
                _ => "canceled while its last attempt stops",
            };
            if phase.has_worker() {
                d.end_attempt(Canceled, Reason::Canceled, None, now);
            }
            d.transition(Canceled, Reason::Canceled, message.into(), ACTOR_USER, now);
        }
        (None, Event::CancelRequested) => {
            d.transition(
                Canceled,
                Reason::Canceled,
                "canceled before it was queued".into(),
                ACTOR_USER,
                now,
            );
        }
        (Some(Pending), Event::BudgetExhausted) => {
            let message = format!(
                "retry budget of {}s ended at {}",
                inputs.spec.retry.budget_seconds.unwrap_or(0),
                d.status.budget_deadline.unwrap_or(now)
            );
            d.status.dead_reason = Some(message.clone());
            d.transition(Dead, Reason::BudgetExceeded, message, op, now);
        }
        (Some(Pending), Event::Granted) => start_attempt(d, inputs, clock, now, "runs as"),
        (Some(Pending), Event::NextPodFound) => {
            // Dispatched when its pod was created, which may have been a while before this look.
            let created =
                super::observe::next_attempt_pod(&d.status, inputs.pods).and_then(|p| p.created_at);
            let at = since_last(d, created, now);
            start_attempt(
                d,
                inputs,
                clock,
                at,
                "runs in the pod created at its dispatch,",
            )
        }
        (Some(Scheduled), Event::PodRefused(Refusal::Forbidden(message))) => {
            refused_for_now(d, inputs, clock, message)
        }
        (Some(Scheduled), Event::PodRefused(Refusal::Invalid(message))) => {
            let failure = failure(d, FailureKind::NonRetryable, Reason::PodRejected, message);
            fail(d, Failed, failure, now, op);
        }
        (Some(Scheduled), Event::PodNeverAppeared) => {
            let message = format!(
                "worker pod {} never appeared within hardSeconds={}",
                d.status.worker.clone().unwrap_or_default(),
                inputs.spec.timeout.hard_seconds
            );
            let failure = failure(d, FailureKind::Timeout, Reason::PodNeverAppeared, message);
            fail(d, TimedOut, failure, now, op);
        }
        (Some(Running), Event::WorkerGone) => {
            let message = format!(
                "worker pod {} disappeared",
                d.status.worker.clone().unwrap_or_default()
            );
            let failure = failure(
                d,
                FailureKind::Infrastructure,
                Reason::WorkerDeleted,
                message,
            );
            fail(d, Failed, failure, now, op);
        }
        (Some(Scheduled), Event::WorkerStarted) => {
            let pod = super::observe::current_pod(&d.status, inputs.pods);
            let node = pod.and_then(|p| p.node.clone());
            // When the container says it started: this look may come well after it.
            let started = since_last(d, pod.and_then(|p| p.started_at), now);
            d.status.started_at = Some(started);
            d.status.node = node.clone();
            if let Some(record) = d.current_record() {
                record.started_at = Some(started);
                record.node = node.clone();
            }
            let message = format!(
                "worker {} running on {}",
                d.status.worker.clone().unwrap_or_default(),
                node.as_deref().unwrap_or("?")
            );
            d.transition(
                Running,
                Reason::WorkerRunning,
                message,
                ACTOR_WORKER,
                started,
            );
        }
        (Some(phase @ (Scheduled | Running)), Event::WorkerSucceeded) => {
            succeed(d, inputs, phase, Reason::Completed, now)
        }
        (Some(phase @ (Failed | TimedOut)), Event::WorkerSucceeded) => {
            succeed(d, inputs, phase, Reason::CompletedAfterTimeout, now)
        }
        (Some(Scheduled | Running), Event::WorkerFailed(failure)) => {
            fail(d, Failed, failure, now, op)
        }
        (Some(Scheduled | Running), Event::HardTimeout) => {
            let message = format!(
                "no result after hardSeconds={}",
                inputs.spec.timeout.hard_seconds
            );
            let failure = failure(d, FailureKind::Timeout, Reason::HardTimeout, message);
            fail(d, TimedOut, failure, now, op);
        }
        (Some(Scheduled | Running), Event::Drained) => {
            let message = format!(
                "AxQueue {} is draining (stopPolicy HoldAndDrain): attempt {} stopped; it runs again once the queue dispatches",
                inputs.spec.queue, d.status.attempt
            );
            // Not the worker's fault: retried without using maxRetries, like an eviction.
            let failure = failure(
                d,
                FailureKind::Infrastructure,
                Reason::QueueDrained,
                message,
            );
            fail(d, Failed, failure, now, op);
        }
        (Some(Scheduled | Running), Event::Preempted) => {
            let message = format!(
                "AxQueue {} preempted attempt {} for a waiting task of higher priority (preemption LowerPriority); it waits in the queue again",
                inputs.spec.queue, d.status.attempt
            );
            // Not the worker's fault: retried without using maxRetries, like a drain.
            let failure = failure(d, FailureKind::Infrastructure, Reason::Preempted, message);
            fail(d, Failed, failure, now, op);
        }
        (Some(Scheduled | Running), Event::SoftTimeoutNotAlive(why)) => {
            let failure = failure(d, FailureKind::Timeout, Reason::SoftTimeout, why);
            fail(d, TimedOut, failure, now, op);
        }
        (Some(Failed | TimedOut), Event::WorkersStopped) => after_failure(d, inputs, clock),
        (Some(Succeeded | Dead | Canceled), Event::RerunRequested) => rerun(d, inputs, now),
        // `observe` produces no other pair; should one slip through, nothing changes.
        _ => return false,
    }
    true
}

/// A new task: queued now, or at `startAfter`.
fn admit(d: &mut Decision, inputs: &Inputs, clock: &Clock) {
    let now = clock.now;
    match inputs
        .spec
        .start_after
        .as_ref()
        .map(|t| t.0)
        .filter(|t| *t > now)
    {
        Some(start) => {
            d.status.queued_at = Some(start);
            d.status.next_attempt_at = Some(start);
            let message = format!("queued at startAfter {start}");
            d.transition(Pending, Reason::Delayed, message, clock.operator, now);
        }
        None => {
            d.status.queued_at = Some(now);
            let message = "queued for dispatch".to_string();
            d.transition(Pending, Reason::Queued, message, clock.operator, now);
        }
    }
}

/// A time a pod reports (`reported`), as the time of the next history entry: never before the last
/// entry (a creationTimestamp has whole seconds only), never after `now`; `now` when unknown.
fn since_last(d: &Decision, reported: Option<Timestamp>, now: Timestamp) -> Timestamp {
    let last = d.status.history.last().map(|h| h.time);
    match reported {
        Some(at) => at.max(last.unwrap_or(at)).min(now),
        None => now,
    }
}

/// Pending → Scheduled at `now`: the attempt number and worker name are recorded, and the pod is
/// created beside this write, or before it when the write is put off (`Decision::write_by`).
/// Whatever lands first, a crash in between is repaired without a second pod: a Scheduled attempt
/// without its pod creates it, a Pending task with the next attempt's pod takes the attempt up with
/// that pod (`NextPodFound`, dispatched when that pod was created).
fn start_attempt(d: &mut Decision, inputs: &Inputs, clock: &Clock, now: Timestamp, runs: &str) {
    d.status.attempt += 1;
    let attempt = d.status.attempt;
    let worker = pod_name(inputs.task_name, attempt);
    if d.status.budget_deadline.is_none()
        && let Some(budget) = inputs.spec.retry.budget_seconds
    {
        d.status.budget_deadline = now
            .checked_add(jiff::SignedDuration::from_secs(budget))
            .ok();
    }
    d.status.worker = Some(worker.clone());
    d.status.node = None;
    d.status.scheduled_at = Some(now);
    d.status.started_at = None;
    d.status.next_attempt_at = None;
    d.push_record(AttemptRecord {
        attempt,
        pod: worker.clone(),
        node: None,
        scheduled_at: now,
        started_at: None,
        finished_at: None,
        outcome: None,
        exit_code: None,
        failure_kind: None,
        reason: None,
    });
    let message = format!("attempt {attempt} {runs} pod {worker}");
    d.transition(Scheduled, Reason::Dispatched, message, clock.operator, now);
}

fn failure(d: &Decision, kind: FailureKind, reason: Reason, message: String) -> Failure {
    Failure {
        attempt: d.status.attempt,
        kind,
        exit_code: None,
        reason: reason.as_str().into(),
        message,
    }
}

/// Scheduled/Running → Failed|TimedOut. What follows (retry or Dead) is decided once every pod of
/// the task has stopped.
fn fail(d: &mut Decision, to: TaskPhase, failure: Failure, now: Timestamp, actor: &str) {
    let message = match failure.exit_code {
        Some(code) => format!(
            "{} (exit code {code}): {}",
            failure.kind.as_str(),
            failure.message
        ),
        None => format!("{}: {}", failure.kind.as_str(), failure.message),
    };
    let reason = reason_of(&failure);
    d.end_attempt(to, reason, Some(&failure), now);
    d.status.last_failure = Some(failure);
    d.transition(to, reason, message, actor, now);
}

/// The [`Reason`] a failure's reason string names (they are always written from one).
fn reason_of(failure: &Failure) -> Reason {
    Reason::ALL
        .into_iter()
        .find(|r| r.as_str() == failure.reason)
        .unwrap_or(Reason::PodFailed)
}

fn succeed(d: &mut Decision, inputs: &Inputs, from: TaskPhase, reason: Reason, now: Timestamp) {
    let pod = super::observe::current_pod(&d.status, inputs.pods);
    if let Some(node) = pod.and_then(|p| p.node.clone()) {
        d.status.node = Some(node);
    }
    let name = d.status.worker.clone().unwrap_or_default();
    let mut message = if reason == Reason::CompletedAfterTimeout {
        format!(
            "worker {name} exited 0 after the attempt had ended {from}; no next attempt was started"
        )
    } else {
        format!("worker {name} exited 0")
    };
    let exit = pod
        .and_then(|p| p.exit.as_ref())
        .filter(|e| e.exit_code == 0);
    let written = exit.map(|e| e.message.as_str());
    let mut reason = reason;
    d.status.output = match output::of_message(written.unwrap_or_default()) {
        Output::None => None,
        Output::Some(value) => Some(value),
        Output::TooLarge => {
            reason = Reason::OutputTooLarge;
            message.push_str(&format!(
                "; its output ($AX_OUTPUT_FILE) is over {} bytes and is not kept: the kubelet keeps only the last {} bytes of it. Keep large results in your own storage and output where they are",
                output::MAX_OUTPUT_BYTES,
                output::TERMINATION_MESSAGE_KEPT_BYTES
            ));
            None
        }
    };
    d.end_attempt(Succeeded, reason, None, now);
    if let Some(record) = d.current_record() {
        record.exit_code = Some(0);
        record.failure_kind = None;
    }
    d.status.dead_reason = None;
    d.transition(Succeeded, reason, message, ACTOR_WORKER, now);
}

/// The pod was refused (quota, admission): back to Pending after a backoff, counting nothing.
fn refused_for_now(d: &mut Decision, inputs: &Inputs, clock: &Clock, message: String) {
    let now = clock.now;
    let failure = failure(
        d,
        FailureKind::Infrastructure,
        Reason::PodForbidden,
        message.clone(),
    );
    d.end_attempt(Failed, Reason::PodForbidden, Some(&failure), now);
    d.status.last_failure = Some(failure);
    let n = d.status.attempt.max(1) as u32;
    let delay = retry_delay(&inputs.spec.retry.backoff, n, clock.unit_random);
    let next = now.checked_add(delay).unwrap_or(Timestamp::MAX);
    d.status.next_attempt_at = Some(next);
    d.status.queued_at = Some(next);
    let text = format!(
        "the worker pod was not created: {message}; trying again in {:.3}s (not counted as a retry)",
        delay.as_secs_f64()
    );
    d.transition(Pending, Reason::PodForbidden, text, clock.operator, now);
}

/// Failed/TimedOut, every pod stopped → Pending (retry after backoff) or Dead.
fn after_failure(d: &mut Decision, inputs: &Inputs, clock: &Clock) {
    let now = clock.now;
    let op = clock.operator;
    let spec = inputs.spec;
    let failure = d.status.last_failure.clone().unwrap_or(Failure {
        attempt: d.status.attempt,
        kind: FailureKind::Retryable,
        exit_code: None,
        reason: "Unknown".into(),
        message: String::new(),
    });
    let summary = format!(
        "attempt {} failed: {} ({})",
        failure.attempt,
        failure.reason,
        failure.kind.as_str()
    );
    let dead = |d: &mut Decision, reason: Reason, message: String| {
        d.status.dead_reason = Some(message.clone());
        d.transition(Dead, reason, message, op, now);
    };
    if failure.kind == FailureKind::NonRetryable {
        let reason = if failure.reason == Reason::PodRejected.as_str() {
            Reason::InvalidSpec
        } else {
            Reason::NonRetryable
        };
        let message = format!("{summary}, not retryable: {}", failure.message);
        return dead(d, reason, message);
    }
    let counts = failure.kind != FailureKind::Infrastructure;
    let max = spec.retry.max_retries.max(0);
    let max_infrastructure = spec.retry.max_infrastructure_retries.max(0);
    if counts && d.status.retries >= max {
        return dead(
            d,
            Reason::RetriesExhausted,
            format!("{summary}; all {max} retries used"),
        );
    }
    if !counts && d.status.infrastructure_retries >= max_infrastructure {
        let message = format!(
            "{summary}; all {max_infrastructure} retries for failures that do not count (maxInfrastructureRetries) used"
        );
        return dead(d, Reason::InfrastructureRetriesExhausted, message);
    }
    let n = d.status.attempt.max(1) as u32;
    let delay = retry_delay(&spec.retry.backoff, n, clock.unit_random);
    let next = now.checked_add(delay).unwrap_or(Timestamp::MAX);
    if let Some(deadline) = d.status.budget_deadline
        && next > deadline
    {
        let message = format!(
            "{summary}; the next attempt at {next} would start after the retry budget ends at {deadline}"
        );
        return dead(d, Reason::BudgetExceeded, message);
    }
    let counted = if counts {
        d.status.retries += 1;
        format!("retry {} of {max}", d.status.retries)
    } else {
        d.status.infrastructure_retries += 1;
        format!(
            "not counted ({} of {max_infrastructure} such retries)",
            d.status.infrastructure_retries
        )
    };
    d.status.next_attempt_at = Some(next);
    d.status.queued_at = Some(next);
    let message = format!(
        "{summary}; {counted}, next attempt in {:.3}s",
        delay.as_secs_f64()
    );
    d.transition(Pending, Reason::RetryScheduled, message, op, now);
}

/// A finished task starts again: a new attempt number, retries and budget reset, history kept.
fn rerun(d: &mut Decision, inputs: &Inputs, now: Timestamp) {
    d.status.observed_rerun += 1;
    let s = &mut d.status;
    s.retries = 0;
    s.infrastructure_retries = 0;
    s.budget_deadline = None;
    s.dead_reason = None;
    s.finished_at = None;
    s.next_attempt_at = None;
    s.queued_at = Some(now);
    s.soft_timeout_attempt = None;
    s.output = None;
    s.conditions.retain(|c| c.type_ != CALLBACK_DELIVERED);
    let message = format!(
        "re-run {} of {} requested (spec.rerun); the next attempt is {}",
        d.status.observed_rerun,
        inputs.spec.rerun,
        d.status.attempt + 1
    );
    d.transition(Pending, Reason::Rerun, message, ACTOR_USER, now);
}
