//! Tests of the AxTask state machine: one test per row of DESIGN §3's transition table, the
//! classification order, validation, conditions, and property tests over random tasks, worker
//! observations and times.

use super::*;
use crate::api::{BackoffSpec, CallbackSpec, ExitCodeMatch, RetrySpec, TimeoutSpec};
use crate::core::worker::{ContainerExit, observe};
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::json;

use TaskPhase::{Canceled, Dead, Failed, Pending, Running, Scheduled, Succeeded, TimedOut};

const TASK: &str = "job";
const OP: &str = "ax-operator/ax-operator-0";
const ALL_PHASES: [TaskPhase; 8] = [
    Pending, Scheduled, Running, Succeeded, Failed, TimedOut, Dead, Canceled,
];

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

/// `secs` seconds after a fixed instant (negative: before it).
fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_900_000_000 + secs).expect("in range")
}

fn t_ms(millis: i64) -> Timestamp {
    Timestamp::from_millisecond(1_900_000_000_000 + millis).expect("in range")
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn clock(now: Timestamp) -> Clock<'static> {
    Clock {
        now,
        operator: OP,
        unit_random: 0.0,
    }
}

/// Defaults everywhere (maxRetries 3, backoff 1s·2ⁿ up to 300s, hardSeconds 600), one container.
fn spec() -> AxTaskSpec {
    serde_json::from_value(json!({
        "type": "report",
        "template": {"spec": {"containers": [{"name": "w", "image": "busybox"}]}}
    }))
    .expect("valid spec")
}

fn rule(operator: ExitCodeOperator, values: &[i64], action: RuleAction) -> RetryRule {
    RetryRule {
        on_exit_codes: ExitCodeMatch {
            operator,
            values: values.to_vec(),
        },
        action,
    }
}

/// Reconciles like the controller does: the spec is validated first.
fn step(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    worker: Option<&WorkerState>,
    now: Timestamp,
) -> Decision {
    let error = validate(spec).err();
    reconcile(spec, status, Some(1), worker, error.as_deref(), &clock(now))
}

fn admitted(spec: &AxTaskSpec, now: Timestamp) -> AxTaskStatus {
    step(spec, &AxTaskStatus::default(), None, now).status
}

fn dispatched(spec: &AxTaskSpec, status: &AxTaskStatus, now: Timestamp) -> AxTaskStatus {
    dispatch(TASK, spec, status, &clock(now))
        .expect("dispatchable")
        .status
}

/// Admitted and dispatched at t(0): attempt 1, Scheduled, worker `job-1`.
fn scheduled_task(spec: &AxTaskSpec) -> AxTaskStatus {
    dispatched(spec, &admitted(spec, t(0)), t(0))
}

/// Dispatched at t(0), its pod seen running at t(1).
fn running_task(spec: &AxTaskSpec) -> AxTaskStatus {
    let d = step(spec, &scheduled_task(spec), Some(&running_pod()), t(1));
    assert_eq!(d.status.phase, Some(Running));
    d.status
}

fn running_pod() -> WorkerState {
    WorkerState {
        phase: PodPhase::Running,
        node: Some("node-a".into()),
        node_ready: Some(true),
        ..Default::default()
    }
}

fn pending_pod() -> WorkerState {
    WorkerState {
        phase: PodPhase::Pending,
        ..Default::default()
    }
}

fn succeeded_pod() -> WorkerState {
    WorkerState {
        phase: PodPhase::Succeeded,
        node: Some("node-a".into()),
        exit: Some(ContainerExit {
            exit_code: 0,
            reason: "Completed".into(),
            message: String::new(),
        }),
        ..Default::default()
    }
}

fn failed_pod(exit_code: i32, message: &str) -> WorkerState {
    WorkerState {
        phase: PodPhase::Failed,
        node: Some("node-a".into()),
        exit: Some(ContainerExit {
            exit_code,
            reason: "Error".into(),
            message: message.into(),
        }),
        ..Default::default()
    }
}

fn evicted_pod() -> WorkerState {
    WorkerState {
        phase: PodPhase::Failed,
        disrupted: Some((
            "Evicted".into(),
            "The node was low on resource: memory.".into(),
        )),
        exit: Some(ContainerExit {
            exit_code: 137,
            reason: "Error".into(),
            message: String::new(),
        }),
        ..Default::default()
    }
}

fn image_pull_error_pod() -> WorkerState {
    WorkerState {
        phase: PodPhase::Pending,
        stuck_reason: Some(("ErrImagePull".into(), "pull access denied for nope".into())),
        ..Default::default()
    }
}

/// The (from, to) pairs of the transitions a decision made.
fn path(d: &Decision) -> Vec<(Option<TaskPhase>, TaskPhase)> {
    d.transitions.iter().map(|e| (e.from, e.to)).collect()
}

fn condition<'a>(status: &'a AxTaskStatus, type_: &str) -> &'a Condition {
    let mut found = status.conditions.iter().filter(|c| c.type_ == type_);
    let c = found
        .next()
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions));
    assert!(found.next().is_none(), "two {type_} conditions");
    c
}

fn condition_status(status: &AxTaskStatus, type_: &str) -> (String, String) {
    let c = condition(status, type_);
    (c.status.clone(), c.reason.clone())
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.into(), reason.into())
}

fn delete_pod(name: &str, grace_seconds: Option<i64>) -> Action {
    Action::DeletePod {
        name: name.into(),
        grace_seconds,
    }
}

fn pod_json(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "job-1", "namespace": "ns"},
        "spec": {"nodeName": "node-a", "restartPolicy": "Never", "containers": [{"name": "w", "image": "busybox"}]},
        "status": status
    }))
    .expect("valid pod")
}

// ---------------------------------------------------------------------------------------------
// (new) → Pending
// ---------------------------------------------------------------------------------------------

#[test]
fn new_task_is_queued_at_once() {
    let d = step(&spec(), &AxTaskStatus::default(), None, t(0));
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.status.queued_at, Some(t(0)));
    assert_eq!(d.status.next_attempt_at, None);
    assert_eq!((d.status.attempt, d.status.retries), (0, 0));
    assert_eq!(d.status.observed_generation, Some(1));
    assert_eq!(d.status.reason.as_deref(), Some("Queued"));
    assert_eq!(d.queue, QueueState::Ready);
    assert_eq!(d.requeue_after, None);
    assert!(d.actions.is_empty());
    assert_eq!(path(&d), [(None, Pending)]);
    let entry = &d.transitions[0];
    assert_eq!(
        (
            entry.time,
            entry.attempt,
            entry.reason.as_str(),
            entry.actor.as_str()
        ),
        (t(0), 0, "Queued", OP)
    );
    assert_eq!(d.status.history, d.transitions);
    assert_eq!(
        condition_status(&d.status, "Queued"),
        pair("True", "Waiting")
    );
    assert_eq!(
        condition_status(&d.status, "Ready"),
        pair("False", "Pending")
    );
    assert!(dispatch(TASK, &spec(), &d.status, &clock(t(0))).is_some());
}

#[test]
fn new_task_with_a_future_start_after_is_delayed_until_then() {
    let mut s = spec();
    s.start_after = Some(Time(t(90)));
    let d = step(&s, &AxTaskStatus::default(), None, t(0));
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.status.reason.as_deref(), Some("Delayed"));
    assert_eq!(d.status.queued_at, Some(t(90)));
    assert_eq!(d.status.next_attempt_at, Some(t(90)));
    assert_eq!(d.queue, QueueState::Waiting);
    assert_eq!(d.requeue_after, Some(secs(90)));
    assert_eq!(
        condition_status(&d.status, "Queued"),
        pair("False", "Delayed")
    );
    assert_eq!(path(&d), [(None, Pending)]);
    assert_eq!(d.transitions[0].reason, "Delayed");
    assert!(
        dispatch(TASK, &s, &d.status, &clock(t(89))).is_none(),
        "not before startAfter"
    );

    // Half-way: still waiting, the requeue shrinks, nothing is recorded.
    let halfway = step(&s, &d.status, None, t(30));
    assert!(halfway.transitions.is_empty());
    assert_eq!(halfway.queue, QueueState::Waiting);
    assert_eq!(halfway.requeue_after, Some(secs(60)));

    // At startAfter: eligible, the Queued condition flips (and only now moves its transition time).
    let due = step(&s, &halfway.status, None, t(90));
    assert!(due.transitions.is_empty());
    assert_eq!(due.queue, QueueState::Ready);
    assert_eq!(due.requeue_after, None);
    assert_eq!(
        condition_status(&due.status, "Queued"),
        pair("True", "Waiting")
    );
    assert_eq!(
        condition(&due.status, "Queued").last_transition_time,
        Time(t(90))
    );
    let scheduled = dispatch(TASK, &s, &due.status, &clock(t(90))).expect("due");
    assert_eq!(scheduled.status.attempt, 1);
}

#[test]
fn start_after_in_the_past_queues_now() {
    let mut s = spec();
    s.start_after = Some(Time(t(-10)));
    let d = step(&s, &AxTaskStatus::default(), None, t(0));
    assert_eq!(d.status.reason.as_deref(), Some("Queued"));
    assert_eq!(d.status.queued_at, Some(t(0)));
    assert_eq!(d.status.next_attempt_at, None);
    assert_eq!(d.queue, QueueState::Ready);
}

#[test]
fn invalid_new_task_goes_dead_and_nothing_else_happens() {
    let mut s = spec();
    s.timeout.soft_seconds = Some(600);
    let d = step(&s, &AxTaskStatus::default(), None, t(0));
    assert_eq!(d.status.phase, Some(Dead));
    assert_eq!(path(&d), [(None, Dead)]);
    assert_eq!(d.transitions[0].reason, "InvalidSpec");
    assert_eq!(d.status.reason.as_deref(), Some("InvalidSpec"));
    let dead_reason = d.status.dead_reason.clone().expect("deadReason");
    assert!(
        dead_reason.contains("spec.timeout.softSeconds"),
        "{dead_reason}"
    );
    assert_eq!(d.status.finished_at, Some(t(0)));
    assert_eq!(d.status.attempt, 0);
    assert!(d.actions.is_empty());
    assert_eq!(d.queue, QueueState::Done);
    assert_eq!(d.requeue_after, None);
    assert_eq!(condition_status(&d.status, "Ready"), pair("False", "Dead"));
    assert!(dispatch(TASK, &s, &d.status, &clock(t(0))).is_none());
}

#[test]
fn task_canceled_before_it_was_queued() {
    let mut s = spec();
    s.cancel = true;
    let d = step(&s, &AxTaskStatus::default(), None, t(0));
    assert_eq!(path(&d), [(None, Canceled)]);
    assert_eq!(d.transitions[0].actor, ACTOR_USER);
    assert!(d.actions.is_empty());
    assert_eq!(d.status.finished_at, Some(t(0)));
}

#[test]
fn pending_task_whose_spec_became_invalid_goes_dead() {
    let s = spec();
    let status = admitted(&s, t(0));
    let mut edited = s.clone();
    edited.template.spec = None;
    let d = step(&edited, &status, None, t(5));
    assert_eq!(path(&d), [(Some(Pending), Dead)]);
    assert_eq!(d.transitions[0].reason, "InvalidSpec");
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .is_some_and(|r| r.contains("containers"))
    );
}

// ---------------------------------------------------------------------------------------------
// Pending → Scheduled
// ---------------------------------------------------------------------------------------------

#[test]
fn dispatch_records_the_attempt_and_worker_before_the_pod_exists() {
    let s = spec();
    let status = admitted(&s, t(0));
    let d = dispatch(TASK, &s, &status, &clock(t(4))).expect("dispatchable");
    assert_eq!(d.status.phase, Some(Scheduled));
    assert_eq!(d.status.attempt, 1);
    assert_eq!(d.status.retries, 0);
    assert_eq!(d.status.worker.as_deref(), Some("job-1"));
    assert_eq!(d.status.scheduled_at, Some(t(4)));
    assert_eq!(
        (
            d.status.started_at,
            d.status.node.as_deref(),
            d.status.next_attempt_at
        ),
        (None, None, None)
    );
    assert_eq!(d.status.budget_deadline, None, "no budget configured");
    assert_eq!(d.actions, [Action::CreatePod]);
    assert_eq!(d.queue, QueueState::Running);
    assert_eq!(
        d.requeue_after,
        Some(secs(600)),
        "reconcile again at the hard timeout"
    );
    assert_eq!(path(&d), [(Some(Pending), Scheduled)]);
    let entry = &d.transitions[0];
    assert_eq!(
        (entry.attempt, entry.reason.as_str(), entry.actor.as_str()),
        (1, "Dispatched", OP)
    );
    assert!(entry.message.contains("job-1"), "{}", entry.message);
    assert_eq!(d.status.history.len(), 2);
    assert_eq!(d.status.history[0], status.history[0]);
    assert_eq!(
        condition_status(&d.status, "Queued"),
        pair("False", "Scheduled")
    );
}

#[test]
fn soft_timeout_counts_from_when_the_worker_started_running() {
    let mut s = spec();
    s.timeout = TimeoutSpec {
        soft_seconds: Some(30),
        hard_seconds: 600,
    };
    let d = dispatch(TASK, &s, &admitted(&s, t(0)), &clock(t(0))).expect("dispatchable");
    assert_eq!(
        d.requeue_after,
        Some(secs(600)),
        "only the hard timeout runs before the pod does"
    );
    // A pod still waiting for its node or image at softSeconds is not hung.
    let waiting = step(&s, &d.status, Some(&pending_pod()), t(45));
    assert_eq!(waiting.status.phase, Some(Scheduled));
    assert!(waiting.actions.is_empty(), "{:?}", waiting.actions);
    // Running from t(50): soft at t(80).
    let running = step(&s, &waiting.status, Some(&running_pod()), t(50));
    assert_eq!(running.status.phase, Some(Running));
    assert_eq!(running.requeue_after, Some(secs(30)));
}

#[test]
fn dispatch_shortens_long_worker_names_like_pod_name() {
    let s = spec();
    let name = "n".repeat(70);
    let d = dispatch(&name, &s, &admitted(&s, t(0)), &clock(t(0))).expect("dispatchable");
    let worker = d.status.worker.expect("worker");
    assert_eq!(worker, pod_name(&name, 1));
    assert!(worker.len() <= 63 && worker.ends_with("-1"), "{worker}");
}

#[test]
fn budget_deadline_is_computed_once_at_the_first_dispatch() {
    let mut s = spec();
    s.retry.budget_seconds = Some(1000);
    let first = dispatched(&s, &admitted(&s, t(0)), t(5));
    assert_eq!(first.budget_deadline, Some(t(1005)));
    let failed = step(&s, &first, Some(&failed_pod(1, "")), t(10));
    assert_eq!(failed.status.phase, Some(Pending));
    assert_eq!(failed.status.budget_deadline, Some(t(1005)));
    let second = dispatched(&s, &failed.status, t(20));
    assert_eq!(second.attempt, 2);
    assert_eq!(second.worker.as_deref(), Some("job-2"));
    assert_eq!(second.budget_deadline, Some(t(1005)), "not recomputed");
}

#[test]
fn dispatch_refuses_anything_but_an_eligible_pending_task() {
    let s = spec();
    let pending = admitted(&s, t(0));
    for phase in ALL_PHASES.into_iter().filter(|p| *p != Pending) {
        let status = AxTaskStatus {
            phase: Some(phase),
            ..pending.clone()
        };
        assert!(
            dispatch(TASK, &s, &status, &clock(t(0))).is_none(),
            "{phase}"
        );
    }
    assert!(
        dispatch(TASK, &s, &AxTaskStatus::default(), &clock(t(0))).is_none(),
        "not admitted yet"
    );

    let mut canceled = s.clone();
    canceled.cancel = true;
    assert!(
        dispatch(TASK, &canceled, &pending, &clock(t(0))).is_none(),
        "cancel requested"
    );

    let backoff = AxTaskStatus {
        next_attempt_at: Some(t(10)),
        ..pending.clone()
    };
    assert!(
        dispatch(TASK, &s, &backoff, &clock(t(9))).is_none(),
        "backing off"
    );
    assert!(
        dispatch(TASK, &s, &backoff, &clock(t(10))).is_some(),
        "due exactly at nextAttemptAt"
    );

    let over_budget = AxTaskStatus {
        attempt: 1,
        budget_deadline: Some(t(50)),
        ..pending.clone()
    };
    assert!(
        dispatch(TASK, &s, &over_budget, &clock(t(49))).is_some(),
        "within budget"
    );
    assert!(
        dispatch(TASK, &s, &over_budget, &clock(t(50))).is_none(),
        "no attempt starts after the budget"
    );
}

// ---------------------------------------------------------------------------------------------
// Scheduled → Running, Scheduled/Running → Succeeded
// ---------------------------------------------------------------------------------------------

#[test]
fn scheduled_becomes_running_when_the_pod_runs() {
    let s = spec();
    let d = step(&s, &scheduled_task(&s), Some(&running_pod()), t(3));
    assert_eq!(path(&d), [(Some(Scheduled), Running)]);
    let entry = &d.transitions[0];
    assert_eq!(
        (entry.attempt, entry.reason.as_str(), entry.actor.as_str()),
        (1, "WorkerRunning", ACTOR_WORKER)
    );
    assert_eq!(d.status.started_at, Some(t(3)));
    assert_eq!(d.status.node.as_deref(), Some("node-a"));
    assert_eq!(d.queue, QueueState::Running);
    assert_eq!(
        d.requeue_after,
        Some(secs(597)),
        "hard timeout counts from dispatch"
    );
    assert!(d.actions.is_empty());

    // Seen again: nothing new.
    let again = step(&s, &d.status, Some(&running_pod()), t(4));
    assert!(again.transitions.is_empty() && again.actions.is_empty());
    assert_eq!(again.status.started_at, Some(t(3)));
}

#[test]
fn scheduled_with_a_pending_pod_waits() {
    let s = spec();
    let d = step(&s, &scheduled_task(&s), Some(&pending_pod()), t(3));
    assert!(d.transitions.is_empty());
    assert!(d.actions.is_empty());
    assert_eq!(d.status.phase, Some(Scheduled));
    assert_eq!(d.queue, QueueState::Running);
    assert_eq!(d.requeue_after, Some(secs(597)));
}

#[test]
fn running_task_succeeds_when_the_container_exits_zero() {
    let s = spec();
    let d = step(&s, &running_task(&s), Some(&succeeded_pod()), t(20));
    assert_eq!(path(&d), [(Some(Running), Succeeded)]);
    let entry = &d.transitions[0];
    assert_eq!(
        (entry.reason.as_str(), entry.actor.as_str()),
        ("Completed", ACTOR_WORKER)
    );
    assert_eq!(d.status.finished_at, Some(t(20)));
    assert_eq!(d.status.next_attempt_at, None);
    assert_eq!(d.queue, QueueState::Done);
    assert_eq!(d.requeue_after, None);
    assert!(d.actions.is_empty());
    assert_eq!(
        condition_status(&d.status, "Ready"),
        pair("True", "Succeeded")
    );
    assert_eq!(
        condition(&d.status, "Ready").last_transition_time,
        Time(t(20))
    );
    assert_eq!(condition_status(&d.status, "Queued").0, "False");
}

#[test]
fn scheduled_task_succeeds_directly_when_the_pod_was_never_seen_running() {
    let s = spec();
    let d = step(&s, &scheduled_task(&s), Some(&succeeded_pod()), t(2));
    assert_eq!(path(&d), [(Some(Scheduled), Succeeded)]);
    assert_eq!(d.status.node.as_deref(), Some("node-a"));
    assert_eq!(
        condition_status(&d.status, "Ready"),
        pair("True", "Succeeded")
    );
}

#[test]
fn a_succeeded_pod_wins_over_a_passed_hard_timeout() {
    let s = spec();
    let d = step(&s, &running_task(&s), Some(&succeeded_pod()), t(5000));
    assert_eq!(path(&d), [(Some(Running), Succeeded)]);
    assert!(d.actions.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Scheduled/Running → Failed → Pending | Dead
// ---------------------------------------------------------------------------------------------

#[test]
fn non_zero_exit_fails_the_attempt_and_schedules_a_retry_after_backoff() {
    let s = spec();
    let d = step(&s, &running_task(&s), Some(&failed_pod(2, "")), t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Pending)]);
    assert_eq!(d.transitions[0].reason, "ExitCode");
    assert_eq!(d.transitions[1].reason, "RetryScheduled");
    assert!(
        d.transitions
            .iter()
            .all(|e| e.attempt == 1 && e.actor == OP && e.time == t(10))
    );
    let failure = d.status.last_failure.clone().expect("lastFailure");
    assert_eq!(
        (failure.attempt, failure.kind, failure.exit_code),
        (1, FailureKind::Retryable, Some(2))
    );
    assert_eq!(failure.reason, "ExitCode");
    assert_eq!(d.status.retries, 1);
    assert_eq!(
        d.status.attempt, 1,
        "the attempt number moves at the next dispatch"
    );
    assert_eq!(
        d.status.next_attempt_at,
        Some(t(11)),
        "first backoff is baseSeconds"
    );
    assert_eq!(d.status.queued_at, Some(t(11)));
    assert_eq!(d.status.finished_at, None);
    assert_eq!(d.status.dead_reason, None);
    assert_eq!(d.queue, QueueState::Waiting);
    assert_eq!(d.requeue_after, Some(secs(1)));
    assert!(d.actions.is_empty());
    assert_eq!(
        condition_status(&d.status, "Queued"),
        pair("False", "Backoff")
    );
    assert!(dispatch(TASK, &s, &d.status, &clock(t(10))).is_none());
    let next = dispatched(&s, &d.status, t(11));
    assert_eq!((next.attempt, next.worker.as_deref()), (2, Some("job-2")));
}

#[test]
fn jitter_is_added_from_the_injected_random_sample() {
    let s = spec();
    let c = Clock {
        now: t(10),
        operator: OP,
        unit_random: 0.5,
    };
    let d = reconcile(
        &s,
        &running_task(&s),
        None,
        Some(&failed_pod(1, "")),
        None,
        &c,
    );
    assert_eq!(
        d.status.next_attempt_at,
        Some(t_ms(11_250)),
        "1s + 0.5 * 500ms"
    );
    assert_eq!(d.requeue_after, Some(Duration::from_millis(1250)));
}

#[test]
fn a_zero_backoff_makes_the_retry_eligible_at_once() {
    let mut s = spec();
    s.retry.backoff.base_seconds = 0;
    let d = step(&s, &running_task(&s), Some(&failed_pod(1, "")), t(10));
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.status.next_attempt_at, Some(t(10)));
    assert_eq!(d.queue, QueueState::Ready);
    assert_eq!(d.requeue_after, Some(Duration::ZERO));
    assert_eq!(
        condition_status(&d.status, "Queued"),
        pair("True", "Waiting")
    );
}

#[test]
fn eviction_is_an_infrastructure_failure_that_does_not_count() {
    let s = spec();
    let d = step(&s, &running_task(&s), Some(&evicted_pod()), t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Pending)]);
    assert_eq!(d.transitions[0].reason, "Evicted");
    let failure = d.status.last_failure.clone().expect("lastFailure");
    assert_eq!(failure.kind, FailureKind::Infrastructure);
    assert_eq!(d.status.retries, 0);
    assert!(
        d.transitions[1].message.contains("not counted"),
        "{}",
        d.transitions[1].message
    );
    assert_eq!(d.status.next_attempt_at, Some(t(11)));
}

#[test]
fn pod_deleted_by_someone_else_is_an_infrastructure_failure() {
    let s = spec();
    let deleting = WorkerState {
        deleting: true,
        ..running_pod()
    };
    let d = step(&s, &running_task(&s), Some(&deleting), t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Pending)]);
    assert_eq!(d.transitions[0].reason, "WorkerDeleted");
    assert_eq!(
        d.status.last_failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Infrastructure)
    );
    assert_eq!(d.status.retries, 0);
}

#[test]
fn image_pull_error_kills_the_pod_and_the_task_goes_dead() {
    let s = spec();
    let d = step(
        &s,
        &scheduled_task(&s),
        Some(&image_pull_error_pod()),
        t(10),
    );
    assert_eq!(d.actions, [delete_pod("job-1", Some(0))]);
    assert_eq!(path(&d), [(Some(Scheduled), Failed), (Some(Failed), Dead)]);
    assert_eq!(d.transitions[0].reason, "ErrImagePull");
    assert_eq!(d.transitions[1].reason, "NonRetryable");
    let failure = d.status.last_failure.clone().expect("lastFailure");
    assert_eq!(
        (failure.kind, failure.reason.as_str()),
        (FailureKind::NonRetryable, "ErrImagePull")
    );
    let dead_reason = d.status.dead_reason.clone().expect("deadReason");
    assert!(
        dead_reason.contains("ErrImagePull") && dead_reason.contains("pull access denied"),
        "{dead_reason}"
    );
    assert_eq!(d.status.retries, 0);
    assert_eq!(d.status.finished_at, Some(t(10)));
    assert_eq!(d.queue, QueueState::Done);
}

#[test]
fn business_error_goes_dead_with_retries_left_and_system_error_retries() {
    let s = spec();
    let biz = step(
        &s,
        &running_task(&s),
        Some(&failed_pod(
            3,
            r#"{"error":"biz","reason":"unknown customer"}"#,
        )),
        t(10),
    );
    assert_eq!(path(&biz), [(Some(Running), Failed), (Some(Failed), Dead)]);
    let failure = biz.status.last_failure.clone().expect("lastFailure");
    assert_eq!(
        (failure.kind, failure.reason.as_str()),
        (FailureKind::NonRetryable, "BusinessError")
    );
    assert_eq!(failure.message, "unknown customer");
    assert!(
        biz.status
            .dead_reason
            .as_deref()
            .is_some_and(|r| r.contains("unknown customer"))
    );

    let sys = step(
        &s,
        &running_task(&s),
        Some(&failed_pod(3, r#"{"error":"sys","reason":"db down"}"#)),
        t(10),
    );
    assert_eq!(
        path(&sys),
        [(Some(Running), Failed), (Some(Failed), Pending)]
    );
    assert_eq!(
        sys.status.last_failure.as_ref().map(|f| f.reason.as_str()),
        Some("SystemError")
    );
    assert_eq!(sys.status.retries, 1);
}

#[test]
fn retries_exhausted_goes_dead_with_retries_at_the_maximum() {
    let mut s = spec();
    s.retry.max_retries = 2;
    let status = AxTaskStatus {
        retries: 2,
        ..running_task(&s)
    };
    let d = step(&s, &status, Some(&failed_pod(1, "")), t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Dead)]);
    assert_eq!(d.transitions[1].reason, "RetriesExhausted");
    assert_eq!(d.status.retries, 2);
    let dead_reason = d.status.dead_reason.clone().expect("deadReason");
    assert!(dead_reason.contains("all 2 retries used"), "{dead_reason}");
    assert_eq!(d.status.next_attempt_at, None);
    assert_eq!(d.status.finished_at, Some(t(10)));
    assert_eq!(d.requeue_after, None);
    assert_eq!(d.queue, QueueState::Done);
}

#[test]
fn zero_max_retries_means_the_first_counted_failure_is_final() {
    let mut s = spec();
    s.retry.max_retries = 0;
    let d = step(&s, &running_task(&s), Some(&failed_pod(1, "")), t(10));
    assert_eq!(d.status.phase, Some(Dead));
    assert_eq!(d.status.retries, 0);
    // An infrastructure failure still retries.
    let d = step(&s, &running_task(&s), Some(&evicted_pod()), t(10));
    assert_eq!(d.status.phase, Some(Pending));
}

#[test]
fn infrastructure_failures_retry_even_when_retries_are_used_up() {
    let mut s = spec();
    s.retry.max_retries = 1;
    let status = AxTaskStatus {
        retries: 1,
        ..running_task(&s)
    };
    let d = step(&s, &status, Some(&evicted_pod()), t(10));
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.status.retries, 1);
}

#[test]
fn a_retry_that_would_start_after_the_budget_goes_dead() {
    let mut s = spec();
    s.retry.budget_seconds = Some(30);
    let status = running_task(&s);
    assert_eq!(status.budget_deadline, Some(t(30)));
    // Backoff 1s: the next attempt at t(30) is still within the budget...
    let within = step(&s, &status, Some(&failed_pod(1, "")), t(29));
    assert_eq!(within.status.phase, Some(Pending));
    assert_eq!(within.status.next_attempt_at, Some(t(30)));
    // ...at t(31) it is not.
    let over = step(&s, &status, Some(&failed_pod(1, "")), t(30));
    assert_eq!(path(&over), [(Some(Running), Failed), (Some(Failed), Dead)]);
    assert_eq!(over.transitions[1].reason, "BudgetExceeded");
    assert_eq!(
        over.status.retries, 0,
        "a retry that never happens is not counted"
    );
    assert!(
        over.status
            .dead_reason
            .as_deref()
            .is_some_and(|r| r.contains("budget"))
    );
}

#[test]
fn a_pending_retry_past_its_budget_goes_dead() {
    let mut s = spec();
    s.retry.budget_seconds = Some(30);
    let failed = step(&s, &running_task(&s), Some(&failed_pod(1, "")), t(20)).status;
    assert_eq!(failed.next_attempt_at, Some(t(21)));
    // The dispatcher did not get to it in time.
    let within = step(&s, &failed, None, t(29));
    assert_eq!(within.queue, QueueState::Ready);
    let over = step(&s, &failed, None, t(30));
    assert_eq!(path(&over), [(Some(Pending), Dead)]);
    assert_eq!(over.transitions[0].reason, "BudgetExceeded");
    assert!(over.status.dead_reason.is_some());
    assert_eq!(over.queue, QueueState::Done);
}

#[test]
fn an_interrupted_failure_is_finished_by_the_next_reconcile() {
    let s = spec();
    let failure = Failure {
        attempt: 1,
        kind: FailureKind::Retryable,
        exit_code: Some(1),
        reason: "ExitCode".into(),
        message: String::new(),
    };
    let failed = AxTaskStatus {
        phase: Some(Failed),
        last_failure: Some(failure.clone()),
        ..running_task(&s)
    };
    let d = step(&s, &failed, None, t(10));
    assert_eq!(path(&d), [(Some(Failed), Pending)]);
    assert_eq!(d.status.retries, 1);
    assert_eq!(d.queue, QueueState::Waiting);

    let timed_out = AxTaskStatus {
        phase: Some(TimedOut),
        last_failure: None,
        ..running_task(&s)
    };
    let d = step(&s, &timed_out, None, t(10));
    assert_eq!(path(&d), [(Some(TimedOut), Pending)]);
    assert_eq!(
        d.status.last_failure.as_ref().map(|f| f.reason.as_str()),
        Some("Unknown")
    );

    let fatal = Failure {
        kind: FailureKind::NonRetryable,
        ..failure
    };
    let failed = AxTaskStatus {
        phase: Some(Failed),
        last_failure: Some(fatal),
        ..running_task(&s)
    };
    let d = step(&s, &failed, None, t(10));
    assert_eq!(path(&d), [(Some(Failed), Dead)]);
}

// ---------------------------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------------------------

#[test]
fn hard_timeout_kills_the_pod_with_grace_and_counts_a_retry() {
    let s = spec();
    let before = step(&s, &running_task(&s), Some(&running_pod()), t(599));
    assert!(before.transitions.is_empty() && before.actions.is_empty());
    assert_eq!(before.requeue_after, Some(secs(1)));

    let d = step(&s, &running_task(&s), Some(&running_pod()), t(600));
    assert_eq!(
        d.actions,
        [delete_pod("job-1", Some(HARD_TIMEOUT_GRACE_SECONDS))]
    );
    assert_eq!(HARD_TIMEOUT_GRACE_SECONDS, 10);
    assert_eq!(
        path(&d),
        [(Some(Running), TimedOut), (Some(TimedOut), Pending)]
    );
    assert_eq!(d.transitions[0].reason, "HardTimeout");
    let failure = d.status.last_failure.clone().expect("lastFailure");
    assert_eq!(
        (failure.kind, failure.reason.as_str(), failure.attempt),
        (FailureKind::Timeout, "HardTimeout", 1)
    );
    assert_eq!(d.status.retries, 1);
    assert_eq!(d.status.next_attempt_at, Some(t(601)));
}

#[test]
fn hard_timeout_of_the_last_retry_goes_dead() {
    let mut s = spec();
    s.retry.max_retries = 0;
    let d = step(&s, &running_task(&s), Some(&running_pod()), t(600));
    assert_eq!(d.actions, [delete_pod("job-1", Some(10))]);
    assert_eq!(
        path(&d),
        [(Some(Running), TimedOut), (Some(TimedOut), Dead)]
    );
    assert_eq!(d.transitions[1].reason, "RetriesExhausted");
}

#[test]
fn hard_timeout_applies_to_a_pod_that_never_started() {
    let s = spec();
    let d = step(&s, &scheduled_task(&s), Some(&pending_pod()), t(600));
    assert_eq!(
        path(&d),
        [(Some(Scheduled), TimedOut), (Some(TimedOut), Pending)]
    );
    assert_eq!(d.actions, [delete_pod("job-1", Some(10))]);
}

fn soft_spec() -> AxTaskSpec {
    let mut s = spec();
    s.timeout = TimeoutSpec {
        soft_seconds: Some(60),
        hard_seconds: 600,
    };
    s
}

#[test]
fn soft_timeout_with_an_alive_worker_warns_once_per_attempt() {
    let s = soft_spec();
    let early = step(&s, &running_task(&s), Some(&running_pod()), t(30));
    assert_eq!(
        early.requeue_after,
        Some(secs(31)),
        "wake up at softSeconds"
    );
    assert!(early.actions.is_empty());

    let warned = step(&s, &early.status, Some(&running_pod()), t(61));
    assert_eq!(warned.status.phase, Some(Running));
    assert!(warned.transitions.is_empty());
    assert_eq!(warned.actions.len(), 1);
    match &warned.actions[0] {
        Action::Warn { reason, message } => {
            assert_eq!(reason, "SoftTimeout");
            assert!(message.contains("softSeconds=60"), "{message}");
        }
        other => panic!("expected a SoftTimeout warning, got {other:?}"),
    }
    assert_eq!(warned.status.soft_timeout_attempt, Some(1));
    assert_eq!(
        warned.requeue_after,
        Some(secs(539)),
        "next wake-up is the hard timeout"
    );
    assert_eq!(warned.queue, QueueState::Running);

    let later = step(&s, &warned.status, Some(&running_pod()), t(61));
    assert!(later.actions.is_empty(), "warned once: {:?}", later.actions);
    assert_eq!(later.requeue_after, Some(secs(539)));
    // Even a worker that dies after the warning is left to the hard timeout or its own exit.
    let restarted = WorkerState {
        restarts: 1,
        ..running_pod()
    };
    assert!(
        step(&s, &warned.status, Some(&restarted), t(70))
            .transitions
            .is_empty()
    );

    // The next attempt gets its own check.
    let failed = step(&s, &later.status, Some(&failed_pod(1, "")), t(100));
    let second = dispatched(&s, &failed.status, t(101));
    let running = step(&s, &second, Some(&running_pod()), t(102)).status;
    let warned_again = step(&s, &running, Some(&running_pod()), t(162));
    assert!(
        matches!(warned_again.actions.as_slice(), [Action::Warn { .. }]),
        "{:?}",
        warned_again.actions
    );
    assert_eq!(warned_again.status.soft_timeout_attempt, Some(2));
}

#[test]
fn soft_timeout_counts_an_unknown_node_readiness_as_alive() {
    let s = soft_spec();
    let unknown_node = WorkerState {
        node_ready: None,
        ..running_pod()
    };
    let d = step(&s, &running_task(&s), Some(&unknown_node), t(61));
    assert!(
        matches!(d.actions.as_slice(), [Action::Warn { .. }]),
        "{:?}",
        d.actions
    );
}

#[test]
fn soft_timeout_with_a_worker_that_is_not_alive_times_out_now() {
    let s = soft_spec();
    let cases = [
        (
            "restarted container",
            running_task(&s),
            WorkerState {
                restarts: 1,
                ..running_pod()
            },
        ),
        (
            "node not ready",
            running_task(&s),
            WorkerState {
                node_ready: Some(false),
                ..running_pod()
            },
        ),
        (
            "pod phase unknown",
            running_task(&s),
            WorkerState {
                phase: PodPhase::Unknown,
                ..running_pod()
            },
        ),
    ];
    for (case, status, worker) in cases {
        let from = status.phase;
        let d = step(&s, &status, Some(&worker), t(61));
        assert_eq!(
            path(&d),
            [(from, TimedOut), (Some(TimedOut), Pending)],
            "{case}"
        );
        assert_eq!(d.transitions[0].reason, "SoftTimeout", "{case}");
        assert_eq!(d.actions, [delete_pod("job-1", Some(10))], "{case}");
        let failure = d.status.last_failure.clone().expect("lastFailure");
        assert_eq!(failure.kind, FailureKind::Timeout, "{case}");
        assert_eq!(d.status.retries, 1, "{case}");
    }
}

// ---------------------------------------------------------------------------------------------
// Cancel
// ---------------------------------------------------------------------------------------------

#[test]
fn cancel_from_every_non_terminal_phase() {
    let s = spec();
    let mut canceled = s.clone();
    canceled.cancel = true;

    let pending = step(&canceled, &admitted(&s, t(0)), None, t(5));
    assert_eq!(path(&pending), [(Some(Pending), Canceled)]);
    assert!(pending.actions.is_empty(), "no worker to kill");

    let mut delayed_spec = s.clone();
    delayed_spec.start_after = Some(Time(t(100)));
    let delayed = admitted(&delayed_spec, t(0));
    delayed_spec.cancel = true;
    let d = step(&delayed_spec, &delayed, None, t(5));
    assert_eq!(path(&d), [(Some(Pending), Canceled)]);
    assert_eq!(d.status.next_attempt_at, None);
    assert_eq!(d.requeue_after, None);

    for (status, worker) in [
        (scheduled_task(&s), pending_pod()),
        (running_task(&s), running_pod()),
    ] {
        let from = status.phase;
        let d = step(&canceled, &status, Some(&worker), t(5));
        assert_eq!(path(&d), [(from, Canceled)]);
        assert_eq!(d.transitions[0].actor, ACTOR_USER);
        assert_eq!(d.actions, [delete_pod("job-1", None)]);
        assert_eq!(d.status.finished_at, Some(t(5)));
        assert_eq!(d.queue, QueueState::Done);
        assert_eq!(
            condition_status(&d.status, "Ready"),
            pair("False", "Canceled")
        );
        assert!(dispatch(TASK, &canceled, &d.status, &clock(t(6))).is_none());
    }

    // A retry waiting for its backoff.
    let backing_off = step(&s, &running_task(&s), Some(&failed_pod(1, "")), t(10)).status;
    let d = step(&canceled, &backing_off, None, t(10));
    assert_eq!(path(&d), [(Some(Pending), Canceled)]);
    assert!(d.actions.is_empty());
}

#[test]
fn cancel_without_a_recorded_worker_deletes_nothing() {
    let s = spec();
    let mut canceled = s.clone();
    canceled.cancel = true;
    let status = AxTaskStatus {
        worker: None,
        ..scheduled_task(&s)
    };
    let d = step(&canceled, &status, None, t(5));
    assert_eq!(d.status.phase, Some(Canceled));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn cancel_does_not_touch_a_finished_task() {
    let s = spec();
    let done = step(&s, &running_task(&s), Some(&succeeded_pod()), t(10)).status;
    let mut canceled = s.clone();
    canceled.cancel = true;
    let d = step(&canceled, &done, None, t(20));
    assert_eq!(d.status.phase, Some(Succeeded));
    assert!(d.transitions.is_empty() && d.actions.is_empty());
    assert_eq!(d.status.finished_at, Some(t(10)));
}

// ---------------------------------------------------------------------------------------------
// Crash repair and lost workers
// ---------------------------------------------------------------------------------------------

#[test]
fn scheduled_without_a_pod_creates_it_again() {
    let s = spec();
    let status = scheduled_task(&s);
    let d = step(&s, &status, None, t(5));
    assert_eq!(d.actions, [Action::CreatePod]);
    assert!(d.transitions.is_empty());
    assert_eq!(d.status.attempt, 1, "same attempt, same pod name");
    assert_eq!(d.status.worker.as_deref(), Some("job-1"));
    assert_eq!(d.queue, QueueState::Running);
    assert_eq!(d.requeue_after, Some(secs(595)));
}

#[test]
fn scheduled_without_a_pod_past_the_hard_timeout_times_out() {
    let s = spec();
    let d = step(&s, &scheduled_task(&s), None, t(600));
    assert_eq!(
        path(&d),
        [(Some(Scheduled), TimedOut), (Some(TimedOut), Pending)]
    );
    assert_eq!(d.transitions[0].reason, "HardTimeout");
    assert!(!d.actions.contains(&Action::CreatePod), "{:?}", d.actions);
    assert_eq!(d.status.retries, 1);
}

#[test]
fn running_without_a_pod_is_an_infrastructure_failure_that_keeps_retries() {
    let s = spec();
    let status = AxTaskStatus {
        retries: 2,
        ..running_task(&s)
    };
    let d = step(&s, &status, None, t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Pending)]);
    assert_eq!(d.transitions[0].reason, "WorkerDeleted");
    let failure = d.status.last_failure.clone().expect("lastFailure");
    assert_eq!(
        (failure.kind, failure.attempt),
        (FailureKind::Infrastructure, 1)
    );
    assert_eq!(d.status.retries, 2, "not counted");
    assert!(d.actions.is_empty());
    let next = dispatched(&s, &d.status, t(11));
    assert_eq!(
        (next.attempt, next.retries, next.worker.as_deref()),
        (2, 2, Some("job-2"))
    );
}

// ---------------------------------------------------------------------------------------------
// Pod creation rejected
// ---------------------------------------------------------------------------------------------

#[test]
fn a_rejected_pod_makes_the_task_dead() {
    let mut s = spec();
    s.callback = Some(CallbackSpec {
        url: "http://hooks.example/done".into(),
    });
    let status = scheduled_task(&s);
    let d = pod_rejected(
        &s,
        &status,
        "admission webhook denied the request",
        &clock(t(1)),
    );
    assert_eq!(path(&d), [(Some(Scheduled), Failed), (Some(Failed), Dead)]);
    assert_eq!(d.transitions[0].reason, "PodRejected");
    let failure = d.status.last_failure.clone().expect("lastFailure");
    assert_eq!(
        (failure.kind, failure.attempt),
        (FailureKind::NonRetryable, 1)
    );
    assert_eq!(failure.message, "admission webhook denied the request");
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .is_some_and(|r| r.contains("admission webhook denied"))
    );
    assert_eq!(d.status.finished_at, Some(t(1)));
    assert_eq!(d.queue, QueueState::Done);
    assert_eq!(d.actions, [Action::SendCallback]);
    assert_eq!(condition_status(&d.status, "Ready"), pair("False", "Dead"));
}

#[test]
fn a_rejected_pod_of_a_task_that_moved_on_changes_nothing() {
    let s = spec();
    let mut canceled_spec = s.clone();
    canceled_spec.cancel = true;
    let canceled = step(&canceled_spec, &scheduled_task(&s), None, t(1)).status;
    let d = pod_rejected(&s, &canceled, "too late", &clock(t(2)));
    assert_eq!(d.status, canceled);
    assert!(d.transitions.is_empty() && d.actions.is_empty());
    assert_eq!(d.queue, QueueState::Done);

    let pending = admitted(&s, t(0));
    let d = pod_rejected(&s, &pending, "stale", &clock(t(2)));
    assert_eq!(d.status, pending);
    assert_eq!(d.queue, QueueState::Ready);

    let running = running_task(&s);
    let d = pod_rejected(&s, &running, "stale", &clock(t(2)));
    assert_eq!(d.status, running);
    assert_eq!(d.queue, QueueState::Running);
}

// ---------------------------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------------------------

#[test]
fn classification_rules_come_first() {
    let rules = [rule(ExitCodeOperator::In, &[3], RuleAction::Retry)];
    let biz = failed_pod(3, r#"{"error":"biz","reason":"no"}"#);
    let f = classify(&rules, &biz, 4);
    assert_eq!(
        (f.kind, f.reason.as_str(), f.exit_code, f.attempt),
        (FailureKind::Retryable, "ExitCodeRule", Some(3), 4)
    );
    assert!(f.message.contains("spec.retry.rules[0]"), "{}", f.message);
    let evicted = WorkerState {
        exit: biz.exit.clone(),
        ..evicted_pod()
    };
    let dead = [rule(ExitCodeOperator::In, &[3], RuleAction::Dead)];
    assert_eq!(
        classify(&dead, &evicted, 1).kind,
        FailureKind::NonRetryable,
        "a rule beats disruption too"
    );
    // A rule that does not match falls through to the termination message.
    let other = [rule(ExitCodeOperator::In, &[4], RuleAction::Retry)];
    assert_eq!(classify(&other, &biz, 1).reason, "BusinessError");
}

#[test]
fn classification_termination_message_comes_before_disruption() {
    let sys = WorkerState {
        exit: Some(ContainerExit {
            exit_code: 137,
            reason: "Error".into(),
            message: r#" {"error":"sys"} "#.into(),
        }),
        ..evicted_pod()
    };
    let f = classify(&[], &sys, 1);
    assert_eq!(
        (f.kind, f.reason.as_str()),
        (FailureKind::Retryable, "SystemError")
    );
    let biz = WorkerState {
        exit: Some(ContainerExit {
            exit_code: 1,
            reason: "Error".into(),
            message: r#"{"error":"biz"}"#.into(),
        }),
        ..evicted_pod()
    };
    let f = classify(&[], &biz, 1);
    assert_eq!(
        (f.kind, f.reason.as_str(), f.message.as_str()),
        (FailureKind::NonRetryable, "BusinessError", "")
    );
}

#[test]
fn classification_disruption_comes_before_a_stuck_container() {
    let both = WorkerState {
        stuck_reason: image_pull_error_pod().stuck_reason,
        exit: None,
        ..evicted_pod()
    };
    let f = classify(&[], &both, 1);
    assert_eq!(
        (f.kind, f.reason.as_str()),
        (FailureKind::Infrastructure, "Evicted")
    );
    assert_eq!(f.message, "The node was low on resource: memory.");
}

#[test]
fn classification_stuck_container_comes_before_the_exit_code() {
    let w = WorkerState {
        exit: failed_pod(1, "").exit,
        ..image_pull_error_pod()
    };
    let f = classify(&[], &w, 1);
    assert_eq!(
        (f.kind, f.reason.as_str()),
        (FailureKind::NonRetryable, "ErrImagePull")
    );
}

#[test]
fn classification_other_exits_are_retryable() {
    let w = WorkerState {
        exit: Some(ContainerExit {
            exit_code: 2,
            reason: "Error".into(),
            message: "disk full".into(),
        }),
        ..failed_pod(0, "")
    };
    let f = classify(&[], &w, 1);
    assert_eq!(
        (f.kind, f.reason.as_str(), f.exit_code),
        (FailureKind::Retryable, "ExitCode", Some(2))
    );
    assert!(
        f.message.contains("exit code 2") && f.message.contains("disk full"),
        "{}",
        f.message
    );

    let no_exit = WorkerState {
        phase: PodPhase::Failed,
        ..Default::default()
    };
    let f = classify(&[], &no_exit, 1);
    assert_eq!(
        (f.kind, f.reason.as_str(), f.exit_code),
        (FailureKind::Retryable, "PodFailed", None)
    );

    // Termination messages that are not the JSON contract are just messages.
    for message in [
        "oops",
        "[1,2]",
        r#"{"error":"other"}"#,
        r#"{"reason":"no kind"}"#,
        "{not json",
    ] {
        assert_eq!(
            classify(&[], &failed_pod(1, message), 1).reason,
            "ExitCode",
            "{message}"
        );
    }
}

#[test]
fn rules_match_in_and_not_in_in_order() {
    let rules = [
        rule(ExitCodeOperator::In, &[42], RuleAction::Ignore),
        rule(ExitCodeOperator::NotIn, &[1, 2, 42], RuleAction::Dead),
        rule(ExitCodeOperator::In, &[1], RuleAction::Retry),
    ];
    let kind = |code| classify(&rules, &failed_pod(code, ""), 1);
    assert_eq!(kind(42).kind, FailureKind::Infrastructure);
    assert_eq!(kind(42).reason, "ExitCodeRule");
    assert_eq!(
        kind(7).kind,
        FailureKind::NonRetryable,
        "NotIn matches codes not listed"
    );
    assert!(kind(7).message.contains("rules[1]"));
    assert_eq!(kind(1).kind, FailureKind::Retryable);
    assert!(kind(1).message.contains("rules[2]"));
    assert_eq!(
        (kind(2).kind, kind(2).reason.as_str()),
        (FailureKind::Retryable, "ExitCode"),
        "no rule matches"
    );
}

#[test]
fn rules_never_apply_without_a_failing_exit_code() {
    let rules = [rule(ExitCodeOperator::NotIn, &[1], RuleAction::Dead)];
    let evicted_without_exit = WorkerState {
        exit: None,
        ..evicted_pod()
    };
    assert_eq!(
        classify(&rules, &evicted_without_exit, 1).kind,
        FailureKind::Infrastructure
    );
    let failed_with_zero = failed_pod(0, "");
    let f = classify(&rules, &failed_with_zero, 1);
    assert_eq!(
        (f.kind, f.reason.as_str(), f.exit_code),
        (FailureKind::Retryable, "PodFailed", None)
    );
}

#[test]
fn ignore_rule_does_not_consume_a_retry() {
    let mut s = spec();
    s.retry.max_retries = 1;
    s.retry.rules = vec![rule(ExitCodeOperator::In, &[75], RuleAction::Ignore)];
    let status = AxTaskStatus {
        retries: 1,
        ..running_task(&s)
    };
    let d = step(&s, &status, Some(&failed_pod(75, "")), t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Pending)]);
    assert_eq!(d.status.retries, 1);
    assert_eq!(
        d.status.last_failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Infrastructure)
    );
    // Any other code with retries used up: Dead.
    let d = step(&s, &status, Some(&failed_pod(1, "")), t(10));
    assert_eq!(d.status.phase, Some(Dead));
}

#[test]
fn dead_rule_ends_the_task_with_retries_left() {
    let mut s = spec();
    s.retry.rules = vec![rule(ExitCodeOperator::In, &[64], RuleAction::Dead)];
    let d = step(&s, &running_task(&s), Some(&failed_pod(64, "")), t(10));
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Dead)]);
    assert_eq!(d.status.retries, 0);
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .is_some_and(|r| r.contains("ExitCodeRule"))
    );
}

// ---------------------------------------------------------------------------------------------
// Real-looking pods through `observe`
// ---------------------------------------------------------------------------------------------

#[test]
fn observed_failed_pod_with_a_business_error_goes_dead() {
    let pod = pod_json(json!({"phase": "Failed", "containerStatuses": [{
        "name": "w", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 3, "reason": "Error",
                                 "message": "{\"error\":\"biz\",\"reason\":\"invoice already paid\"}"}}}]}));
    let s = spec();
    let d = step(
        &s,
        &running_task(&s),
        Some(&observe(&pod, Some(true))),
        t(10),
    );
    assert_eq!(path(&d), [(Some(Running), Failed), (Some(Failed), Dead)]);
    let failure = d.status.last_failure.expect("lastFailure");
    assert_eq!(
        (failure.reason.as_str(), failure.exit_code),
        ("BusinessError", Some(3))
    );
    assert_eq!(failure.message, "invoice already paid");
}

#[test]
fn observed_evicted_pod_retries_without_counting() {
    let pod = pod_json(json!({"phase": "Failed", "reason": "Evicted",
        "message": "The node was low on resource: ephemeral-storage."}));
    let s = spec();
    let d = step(
        &s,
        &running_task(&s),
        Some(&observe(&pod, Some(true))),
        t(10),
    );
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.status.retries, 0);
    assert_eq!(
        d.status.last_failure.map(|f| f.kind),
        Some(FailureKind::Infrastructure)
    );
}

#[test]
fn observed_image_pull_error_goes_dead() {
    let pod = pod_json(json!({"phase": "Pending", "containerStatuses": [{
        "name": "w", "image": "nope", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}}]}));
    let s = spec();
    let d = step(&s, &scheduled_task(&s), Some(&observe(&pod, None)), t(10));
    assert_eq!(d.status.phase, Some(Dead));
    assert_eq!(d.actions, [delete_pod("job-1", Some(0))]);
}

#[test]
fn observed_restarted_container_is_not_alive_at_the_soft_timeout() {
    let pod = pod_json(json!({"phase": "Running", "containerStatuses": [{
        "name": "w", "image": "busybox", "imageID": "", "ready": true, "restartCount": 1,
        "state": {"running": {"startedAt": "2030-01-01T00:00:00Z"}}}]}));
    let s = soft_spec();
    let d = step(
        &s,
        &running_task(&s),
        Some(&observe(&pod, Some(true))),
        t(61),
    );
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.transitions[0].to, TimedOut);
    let healthy = pod_json(json!({"phase": "Running", "containerStatuses": [{
        "name": "w", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2030-01-01T00:00:00Z"}}}]}));
    let d = step(
        &s,
        &running_task(&s),
        Some(&observe(&healthy, Some(true))),
        t(61),
    );
    assert!(
        matches!(d.actions.as_slice(), [Action::Warn { .. }]),
        "{:?}",
        d.actions
    );
}

#[test]
fn observed_pod_runs_then_succeeds() {
    let s = spec();
    let running = pod_json(json!({"phase": "Running", "containerStatuses": [{
        "name": "w", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {}}}]}));
    let d = step(
        &s,
        &scheduled_task(&s),
        Some(&observe(&running, Some(true))),
        t(1),
    );
    assert_eq!(path(&d), [(Some(Scheduled), Running)]);
    assert_eq!(d.status.node.as_deref(), Some("node-a"));
    let done = pod_json(json!({"phase": "Succeeded", "containerStatuses": [{
        "name": "w", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}));
    let d = step(&s, &d.status, Some(&observe(&done, Some(true))), t(9));
    assert_eq!(path(&d), [(Some(Running), Succeeded)]);
}

// ---------------------------------------------------------------------------------------------
// validate
// ---------------------------------------------------------------------------------------------

fn validation_error(spec: &AxTaskSpec) -> String {
    validate(spec).expect_err("invalid spec")
}

#[test]
fn valid_specs_pass() {
    assert_eq!(validate(&spec()), Ok(()));
    let mut s = spec();
    s.timeout = TimeoutSpec {
        soft_seconds: Some(599),
        hard_seconds: 600,
    };
    s.payload = Some(json!({"customer": 7, "items": [1, 2, 3]}));
    s.retry = RetrySpec {
        rules: vec![
            rule(ExitCodeOperator::In, &[1, 2], RuleAction::Retry),
            rule(ExitCodeOperator::In, &[2, 3], RuleAction::Retry),
            rule(ExitCodeOperator::NotIn, &[0, 1, 2, 3], RuleAction::Dead),
            rule(ExitCodeOperator::In, &[9], RuleAction::Ignore),
        ],
        ..RetrySpec::default()
    };
    assert_eq!(validate(&s), Ok(()));
}

#[test]
fn soft_timeout_must_be_below_the_hard_timeout() {
    for soft in [600, 601] {
        let mut s = spec();
        s.timeout = TimeoutSpec {
            soft_seconds: Some(soft),
            hard_seconds: 600,
        };
        let e = validation_error(&s);
        assert!(
            e.contains("spec.timeout.softSeconds") && e.contains("hardSeconds"),
            "{e}"
        );
    }
}

#[test]
fn payload_is_limited_to_256_kib() {
    // `{"d":"…"}` is 8 bytes plus the string.
    let at_limit = json!({"d": "x".repeat(MAX_PAYLOAD_BYTES - 8)});
    assert_eq!(payload_json(&at_limit).len(), MAX_PAYLOAD_BYTES);
    let mut s = spec();
    s.payload = Some(at_limit);
    assert_eq!(validate(&s), Ok(()));
    s.payload = Some(json!({"d": "x".repeat(MAX_PAYLOAD_BYTES - 7)}));
    let e = validation_error(&s);
    assert!(
        e.contains("spec.payload") && e.contains(&MAX_PAYLOAD_BYTES.to_string()),
        "{e}"
    );
}

#[test]
fn a_template_needs_a_container() {
    let mut s = spec();
    s.template.spec = None;
    assert!(validation_error(&s).contains("spec.template.spec.containers"));
    let mut s = spec();
    if let Some(pod) = s.template.spec.as_mut() {
        pod.containers.clear();
    }
    assert!(validation_error(&s).contains("spec.template.spec.containers"));
}

#[test]
fn contradictory_rules_are_rejected() {
    let mut s = spec();
    s.retry.rules = vec![
        rule(ExitCodeOperator::In, &[1], RuleAction::Retry),
        rule(ExitCodeOperator::In, &[5, 6], RuleAction::Retry),
        rule(ExitCodeOperator::In, &[7, 6], RuleAction::Dead),
    ];
    let e = validation_error(&s);
    assert!(
        e.contains("spec.retry.rules[1]") && e.contains("spec.retry.rules[2]") && e.contains("6"),
        "{e}"
    );
}

#[test]
fn a_rule_listing_exit_code_zero_is_rejected() {
    let mut s = spec();
    s.retry.rules = vec![
        rule(ExitCodeOperator::In, &[1], RuleAction::Retry),
        rule(ExitCodeOperator::In, &[2, 0], RuleAction::Dead),
    ];
    let e = validation_error(&s);
    assert!(
        e.contains("spec.retry.rules[1]") && e.contains("exit code 0"),
        "{e}"
    );
}

#[test]
fn backoff_factor_must_be_at_least_one() {
    for factor in [0.5, f64::NAN, f64::INFINITY] {
        let mut s = spec();
        s.retry.backoff.factor = factor;
        assert!(
            validation_error(&s).contains("spec.retry.backoff.factor"),
            "{factor}"
        );
    }
}

#[test]
fn each_invalid_spec_makes_a_new_task_dead_with_invalid_spec() {
    let mut specs = Vec::new();
    let mut s = spec();
    s.timeout.soft_seconds = Some(700);
    specs.push(s);
    let mut s = spec();
    s.payload = Some(json!({"d": "x".repeat(MAX_PAYLOAD_BYTES)}));
    specs.push(s);
    let mut s = spec();
    s.template.spec = None;
    specs.push(s);
    let mut s = spec();
    s.retry.rules = vec![rule(ExitCodeOperator::In, &[0], RuleAction::Retry)];
    specs.push(s);
    for s in specs {
        let error = validation_error(&s);
        let d = step(&s, &AxTaskStatus::default(), None, t(0));
        assert_eq!(path(&d), [(None, Dead)]);
        assert_eq!(d.transitions[0].reason, "InvalidSpec");
        assert_eq!(d.transitions[0].message, error);
        assert_eq!(d.status.dead_reason, Some(format!("invalid spec: {error}")));
        assert!(!d.actions.contains(&Action::CreatePod));
    }
}

// ---------------------------------------------------------------------------------------------
// Conditions, callback, TTL, history cap
// ---------------------------------------------------------------------------------------------

#[test]
fn condition_transition_times_move_only_when_the_status_flips() {
    let s = spec();
    let admitted = admitted(&s, t(0));
    assert_eq!(
        condition(&admitted, "Ready").last_transition_time,
        Time(t(0))
    );
    assert_eq!(
        condition(&admitted, "Queued").last_transition_time,
        Time(t(0))
    );

    let later = step(&s, &admitted, None, t(5)).status;
    assert_eq!(later.conditions, admitted.conditions);

    let scheduled = dispatched(&s, &later, t(10));
    let queued = condition(&scheduled, "Queued");
    assert_eq!(
        (queued.status.as_str(), queued.last_transition_time.clone()),
        ("False", Time(t(10)))
    );
    let ready = condition(&scheduled, "Ready");
    assert_eq!(
        (ready.reason.as_str(), ready.last_transition_time.clone()),
        ("Scheduled", Time(t(0))),
        "False → False"
    );

    let running = step(&s, &scheduled, Some(&running_pod()), t(11)).status;
    let done = step(&s, &running, Some(&succeeded_pod()), t(20)).status;
    assert_eq!(condition(&done, "Ready").last_transition_time, Time(t(20)));
    assert_eq!(condition(&done, "Queued").last_transition_time, Time(t(10)));
    let after = step(&s, &done, None, t(30)).status;
    assert_eq!(after.conditions, done.conditions);
}

#[test]
fn set_condition_keeps_the_transition_time_when_only_the_reason_changes() {
    let mut status = AxTaskStatus::default();
    set_condition(&mut status, "X", "False", "A", "first", t(0), Some(1));
    set_condition(&mut status, "X", "False", "B", "second", t(5), Some(2));
    let c = condition(&status, "X");
    assert_eq!(
        (c.reason.as_str(), c.message.as_str(), c.observed_generation),
        ("B", "second", Some(2))
    );
    assert_eq!(c.last_transition_time, Time(t(0)));
    set_condition(&mut status, "X", "True", "C", "", t(9), Some(2));
    assert_eq!(condition(&status, "X").last_transition_time, Time(t(9)));
}

#[test]
fn ready_is_true_only_when_succeeded() {
    let s = spec();
    let outcomes = [
        step(&s, &running_task(&s), Some(&succeeded_pod()), t(10)).status,
        step(&s, &running_task(&s), Some(&failed_pod(1, "")), t(10)).status,
        step(&s, &running_task(&s), Some(&image_pull_error_pod()), t(10)).status,
        running_task(&s),
        scheduled_task(&s),
        admitted(&s, t(0)),
    ];
    for status in outcomes {
        let ready = condition(&status, "Ready").status.clone();
        assert_eq!(
            ready == "True",
            status.phase == Some(Succeeded),
            "{:?}: Ready {ready}",
            status.phase
        );
    }
}

#[test]
fn callback_is_requested_until_its_outcome_is_recorded() {
    let mut s = spec();
    s.callback = Some(CallbackSpec {
        url: "https://hooks.example/ax".into(),
    });
    let done = step(&s, &running_task(&s), Some(&succeeded_pod()), t(10));
    assert_eq!(done.actions, [Action::SendCallback]);
    assert_eq!(
        step(&s, &done.status, None, t(11)).actions,
        [Action::SendCallback],
        "not delivered yet"
    );

    let failed = callback_outcome(&done.status, false, "503 after 3 tries", t(12));
    assert_eq!(
        condition_status(&failed, "CallbackDelivered"),
        pair("False", "DeliveryFailed")
    );
    assert_eq!(
        condition(&failed, "CallbackDelivered").message,
        "503 after 3 tries"
    );
    let without_callback = AxTaskStatus {
        conditions: failed
            .conditions
            .iter()
            .filter(|c| c.type_ != "CallbackDelivered")
            .cloned()
            .collect(),
        ..failed.clone()
    };
    assert_eq!(
        without_callback, done.status,
        "nothing but the condition changes"
    );
    assert!(
        step(&s, &failed, None, t(13)).actions.is_empty(),
        "the sender retried on its own"
    );

    let delivered = callback_outcome(&failed, true, "200", t(20));
    assert_eq!(
        condition_status(&delivered, "CallbackDelivered"),
        pair("True", "Delivered")
    );
    assert_eq!(
        condition(&delivered, "CallbackDelivered").last_transition_time,
        Time(t(20))
    );
    assert_eq!(delivered.phase, Some(Succeeded));
    assert_eq!(delivered.history, done.status.history);
    let again = callback_outcome(&delivered, true, "200", t(30));
    assert_eq!(
        condition(&again, "CallbackDelivered").last_transition_time,
        Time(t(20))
    );

    // On a task that is not finished (should not happen), the phase still never changes.
    let running = running_task(&s);
    assert_eq!(
        callback_outcome(&running, true, "", t(5)).phase,
        Some(Running)
    );
}

#[test]
fn no_callback_before_a_terminal_phase() {
    let mut s = spec();
    s.callback = Some(CallbackSpec {
        url: "https://hooks.example/ax".into(),
    });
    let retry = step(&s, &running_task(&s), Some(&failed_pod(1, "")), t(10));
    assert!(retry.actions.is_empty());
    let mut canceled = s.clone();
    canceled.cancel = true;
    assert_eq!(
        step(&canceled, &retry.status, None, t(10)).actions,
        [Action::SendCallback]
    );
}

#[test]
fn ttl_deletes_the_task_once_expired_and_requeues_before() {
    let mut s = spec();
    s.ttl_seconds_after_finished = Some(100);
    let done = step(&s, &running_task(&s), Some(&succeeded_pod()), t(10));
    assert!(done.actions.is_empty());
    assert_eq!(done.requeue_after, Some(secs(100)));
    let waiting = step(&s, &done.status, None, t(50));
    assert!(waiting.actions.is_empty());
    assert_eq!(waiting.requeue_after, Some(secs(60)));
    for now in [t(110), t(500)] {
        let expired = step(&s, &done.status, None, now);
        assert_eq!(expired.actions, [Action::DeleteTask]);
        assert_eq!(expired.status.phase, Some(Succeeded));
    }
    // Dead tasks expire the same way; TTL 0 deletes at once.
    s.ttl_seconds_after_finished = Some(0);
    let dead = step(&s, &running_task(&s), Some(&image_pull_error_pod()), t(10));
    assert_eq!(
        dead.actions,
        [delete_pod("job-1", Some(0)), Action::DeleteTask]
    );
}

#[test]
fn no_ttl_means_no_requeue_for_a_finished_task() {
    let s = spec();
    let done = step(&s, &running_task(&s), Some(&succeeded_pod()), t(10)).status;
    let d = step(&s, &done, None, t(100_000));
    assert_eq!(
        (d.requeue_after, d.actions.is_empty(), d.queue),
        (None, true, QueueState::Done)
    );
}

#[test]
fn history_is_capped_at_100_and_counts_what_it_drops() {
    let s = spec();
    let mut status = running_task(&s);
    let old: Vec<HistoryEntry> = (0..HISTORY_CAP as i32)
        .map(|i| HistoryEntry {
            time: t(-1000 + i64::from(i)),
            from: Some(Pending),
            to: Scheduled,
            attempt: i,
            reason: format!("old-{i}"),
            message: String::new(),
            actor: OP.into(),
        })
        .collect();
    status.history = old.clone();
    status.history_dropped = 5;
    let d = step(&s, &status, Some(&failed_pod(1, "")), t(10));
    assert_eq!(d.transitions.len(), 2);
    assert_eq!(d.status.history.len(), HISTORY_CAP);
    assert_eq!(d.status.history_dropped, 7);
    assert_eq!(d.status.history[..HISTORY_CAP - 2], old[2..]);
    assert_eq!(d.status.history[HISTORY_CAP - 2..], d.transitions[..]);
}

#[test]
fn observed_generation_is_recorded() {
    let s = spec();
    let d = reconcile(
        &s,
        &AxTaskStatus::default(),
        Some(9),
        None,
        None,
        &clock(t(0)),
    );
    assert_eq!(d.status.observed_generation, Some(9));
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(9))
    );
}

#[test]
fn infrastructure_failures_and_retries_interleave_in_a_full_run() {
    let mut s = spec();
    s.retry.max_retries = 1;
    let mut status = admitted(&s, t(0));
    let mut now = t(0);
    // attempt 1 evicted (free), attempt 2 exits 1 (retry 1), attempt 3 lost (free), attempt 4 succeeds.
    let outcomes = [
        Some(evicted_pod()),
        Some(failed_pod(1, "")),
        None,
        Some(succeeded_pod()),
    ];
    for outcome in outcomes {
        status = dispatched(&s, &status, now);
        now += SignedDuration::from_secs(1);
        status = step(&s, &status, Some(&running_pod()), now).status;
        now += SignedDuration::from_secs(1);
        status = step(&s, &status, outcome.as_ref(), now).status;
        if let Some(next) = status
            .next_attempt_at
            .filter(|_| status.phase == Some(Pending))
        {
            now = now.max(next);
        }
    }
    assert_eq!(status.phase, Some(Succeeded));
    assert_eq!((status.attempt, status.retries), (4, 1));
    let workers: Vec<_> = status
        .history
        .iter()
        .filter(|e| e.to == Scheduled)
        .map(|e| e.message.clone())
        .collect();
    assert_eq!(workers.len(), 4);
    assert!(workers[3].contains("job-4"), "{workers:?}");
}

// ---------------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------------

fn arb_phase() -> impl Strategy<Value = TaskPhase> {
    proptest::sample::select(ALL_PHASES.to_vec())
}

fn arb_rule() -> impl Strategy<Value = RetryRule> {
    (
        prop_oneof![Just(ExitCodeOperator::In), Just(ExitCodeOperator::NotIn)],
        prop::collection::vec(0i64..5, 1..3),
        prop_oneof![
            Just(RuleAction::Retry),
            Just(RuleAction::Dead),
            Just(RuleAction::Ignore)
        ],
    )
        .prop_map(|(operator, values, action)| rule(operator, &values, action))
}

/// Any spec, valid or not: reconcile receives the validation error alongside.
fn arb_spec() -> impl Strategy<Value = AxTaskSpec> {
    let retry = (
        0i32..4,
        (0i64..5, 1.0f64..3.0, 0i64..60, 0i64..1500),
        prop::option::of(1i64..400),
        prop::collection::vec(arb_rule(), 0..3),
    );
    let timing = (
        prop::option::of(1i64..200),
        1i64..300,
        prop::option::of(-50i64..200),
    );
    let end = (
        prop::bool::weighted(0.1),
        any::<bool>(),
        prop::option::of(0i64..200),
    );
    (retry, timing, end).prop_map(
        |(
            (max_retries, (base, factor, max, jitter), budget, rules),
            (soft, hard, start),
            (cancel, callback, ttl),
        )| {
            let mut s = spec();
            s.retry.max_retries = max_retries;
            s.retry.backoff = BackoffSpec {
                base_seconds: base,
                factor,
                max_seconds: max,
                jitter_millis: jitter,
            };
            s.retry.budget_seconds = budget;
            s.retry.rules = rules;
            s.timeout = TimeoutSpec {
                soft_seconds: soft,
                hard_seconds: hard,
            };
            s.start_after = start.map(|o| Time(t(o)));
            s.cancel = cancel;
            s.callback = callback.then(|| CallbackSpec {
                url: "http://cb.example/".into(),
            });
            s.ttl_seconds_after_finished = ttl;
            s
        },
    )
}

fn arb_worker() -> impl Strategy<Value = WorkerState> {
    let exit = (
        prop_oneof![Just(0), 1i32..4, Just(137)],
        proptest::sample::select(vec![
            "",
            "oops",
            r#"{"error":"biz","reason":"b"}"#,
            r#"{"error":"sys"}"#,
        ]),
    )
        .prop_map(|(exit_code, message)| ContainerExit {
            exit_code,
            reason: "Error".into(),
            message: message.into(),
        });
    let reason = || ("[A-Z][a-z]{2,6}", "[a-z ]{0,8}");
    (
        proptest::sample::select(vec![
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
            PodPhase::Unknown,
        ]),
        prop::bool::weighted(0.1),
        prop::option::of(Just("node-a".to_string())),
        prop::option::of(any::<bool>()),
        prop_oneof![4 => Just(0), 1 => 1i32..3],
        prop::option::of(exit),
        prop::option::weighted(0.1, reason()),
        prop::option::weighted(0.1, reason()),
    )
        .prop_map(
            |(phase, deleting, node, node_ready, restarts, exit, stuck_reason, disrupted)| {
                WorkerState {
                    phase,
                    deleting,
                    node,
                    node_ready,
                    restarts,
                    exit,
                    stuck_reason,
                    disrupted,
                }
            },
        )
}

fn arb_entry() -> impl Strategy<Value = HistoryEntry> {
    (
        -500i64..0,
        prop::option::of(arb_phase()),
        arb_phase(),
        0i32..5,
    )
        .prop_map(|(at, from, to, attempt)| HistoryEntry {
            time: t(at),
            from,
            to,
            attempt,
            reason: "Earlier".into(),
            message: String::new(),
            actor: OP.into(),
        })
}

fn arb_failure() -> impl Strategy<Value = Failure> {
    (
        0i32..5,
        proptest::sample::select(vec![
            FailureKind::Retryable,
            FailureKind::NonRetryable,
            FailureKind::Infrastructure,
            FailureKind::Timeout,
        ]),
    )
        .prop_map(|(attempt, kind)| Failure {
            attempt,
            kind,
            exit_code: None,
            reason: "Earlier".into(),
            message: String::new(),
        })
}

/// Any status, reachable or not; `time` offsets are seconds around t(0).
fn arb_status() -> impl Strategy<Value = AxTaskStatus> {
    let counters = (
        prop::option::of(arb_phase()),
        0i32..5,
        0i32..5,
        any::<bool>(),
        0i64..5,
    );
    let times = (
        prop::option::of(-100i64..400),
        prop::option::of(-700i64..400),
        prop::option::of(-100i64..600),
        prop::option::of(-100i64..400),
    );
    let rest = (
        prop::option::of(0i32..5),
        prop::option::of(arb_failure()),
        prop_oneof![3 => prop::collection::vec(arb_entry(), 0..5), 1 => prop::collection::vec(arb_entry(), 98..=102)],
        any::<bool>(),
    );
    (counters, times, rest).prop_map(
        |(
            (phase, attempt, retries, has_worker, history_dropped),
            (next, scheduled, budget, finished),
            (soft_timeout_attempt, last_failure, history, with_conditions),
        )| {
            let mut s = AxTaskStatus {
                phase,
                attempt,
                retries,
                worker: has_worker.then(|| pod_name(TASK, attempt)),
                next_attempt_at: next
                    .map(t)
                    .filter(|_| !phase.is_some_and(TaskPhase::is_terminal)),
                queued_at: Some(t(-100)),
                scheduled_at: scheduled.map(t),
                budget_deadline: budget.map(t),
                // Every way into a terminal phase records when.
                finished_at: match phase {
                    Some(p) if p.is_terminal() => Some(t(finished.unwrap_or(-50))),
                    _ => finished.map(t),
                },
                soft_timeout_attempt,
                last_failure,
                history,
                history_dropped,
                ..AxTaskStatus::default()
            };
            if with_conditions {
                set_conditions(&mut s, t(-200), Some(1));
            }
            s
        },
    )
}

/// Invariants every decision keeps, whatever it started from.
fn check_decision(
    spec: &AxTaskSpec,
    old: &AxTaskStatus,
    d: &Decision,
    now: Timestamp,
) -> Result<(), TestCaseError> {
    let new = &d.status;
    // Terminal phases are never left, and nothing is recorded for them.
    if old.phase.is_some_and(TaskPhase::is_terminal) {
        prop_assert_eq!(new.phase, old.phase);
        prop_assert!(d.transitions.is_empty());
        prop_assert_eq!(&new.history, &old.history);
        prop_assert_eq!(new.finished_at, old.finished_at);
        let touches_worker = d.actions.iter().any(|a| {
            matches!(
                a,
                Action::CreatePod | Action::DeletePod { .. } | Action::Warn { .. }
            )
        });
        prop_assert!(!touches_worker, "{:?}", d.actions);
    }
    // History: append-only, capped, and the drop count accounts for every entry.
    if d.transitions.is_empty() {
        prop_assert_eq!(&new.history, &old.history);
        prop_assert_eq!(new.history_dropped, old.history_dropped);
    } else {
        let all: Vec<_> = old.history.iter().chain(&d.transitions).cloned().collect();
        let kept = all.len().min(HISTORY_CAP);
        prop_assert_eq!(&new.history[..], &all[all.len() - kept..]);
        prop_assert_eq!(
            new.history_dropped,
            old.history_dropped + (all.len() - kept) as i64
        );
    }
    // Transitions chain from the old phase to the new one, at `now`, for the current attempt.
    let mut from = old.phase;
    for e in &d.transitions {
        prop_assert_eq!(e.from, from);
        prop_assert_ne!(Some(e.to), e.from);
        prop_assert_eq!(e.time, now);
        prop_assert_eq!(e.attempt, new.attempt);
        prop_assert!(
            from.is_none_or(|p| !p.is_terminal()),
            "left terminal {:?}",
            from
        );
        from = Some(e.to);
    }
    prop_assert_eq!(new.phase, from);
    // Counters.
    prop_assert!(new.attempt >= old.attempt);
    prop_assert!(new.retries >= old.retries && new.retries <= old.retries + 1);
    prop_assert!(new.retries <= old.retries.max(spec.retry.max_retries));
    // Failed and TimedOut are passed through within one decision.
    let Some(phase) = new.phase else {
        // Only a task the operator has not seen yet has no phase, and only `pod_rejected` leaves it so.
        prop_assert_eq!(old.phase, None);
        prop_assert_eq!(new, old);
        return Ok(());
    };
    prop_assert!(!matches!(phase, Failed | TimedOut), "stopped in {}", phase);
    // Conditions.
    let ready = new
        .conditions
        .iter()
        .filter(|c| c.type_ == "Ready")
        .collect::<Vec<_>>();
    prop_assert_eq!(ready.len(), 1);
    prop_assert_eq!(ready[0].status == "True", phase == Succeeded);
    for c in &new.conditions {
        if let Some(before) = old.conditions.iter().find(|b| b.type_ == c.type_) {
            if before.status == c.status {
                prop_assert_eq!(&c.last_transition_time, &before.last_transition_time);
            } else {
                prop_assert_eq!(&c.last_transition_time, &Time(now));
            }
        }
    }
    // Terminal bookkeeping.
    if phase.is_terminal() {
        prop_assert_eq!(d.queue, QueueState::Done);
        prop_assert!(new.finished_at.is_some());
        prop_assert_eq!(new.next_attempt_at, None::<Timestamp>);
        if !old.phase.is_some_and(TaskPhase::is_terminal) {
            prop_assert_eq!(new.finished_at, Some(now));
        }
        if phase == Dead && !d.transitions.is_empty() {
            prop_assert!(new.dead_reason.is_some());
        }
    }
    // Side effects fit the phase.
    for a in &d.actions {
        match a {
            Action::CreatePod => prop_assert_eq!(phase, Scheduled),
            Action::DeletePod { name, .. } => {
                prop_assert!(!name.is_empty());
                prop_assert_eq!(Some(name), old.worker.as_ref());
            }
            Action::Warn { .. } => {
                prop_assert!(phase.has_worker() && d.transitions.iter().all(|e| e.to == Running))
            }
            Action::SendCallback => prop_assert!(phase.is_terminal() && spec.callback.is_some()),
            Action::DeleteTask => prop_assert!(phase.is_terminal()),
        }
    }
    let warnings = d
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Warn { .. }))
        .count();
    prop_assert!(warnings <= 1);
    Ok(())
}

/// What reconcile says about the queue matches the phase and `nextAttemptAt`.
fn check_queue(spec: &AxTaskSpec, d: &Decision, now: Timestamp) -> Result<(), TestCaseError> {
    let phase = d.status.phase.expect("phase");
    match phase {
        Pending => {
            let due = d.status.next_attempt_at.is_none_or(|at| at <= now);
            prop_assert_eq!(
                d.queue,
                if due {
                    QueueState::Ready
                } else {
                    QueueState::Waiting
                }
            );
            if let Some(at) = d.status.next_attempt_at.filter(|at| *at > now) {
                let wait = Duration::try_from(at.duration_since(now)).expect("positive");
                prop_assert_eq!(d.requeue_after, Some(wait));
            }
            let queued = d
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == "Queued")
                .expect("Queued");
            prop_assert_eq!(queued.status == "True", due);
        }
        Scheduled | Running => {
            prop_assert_eq!(d.queue, QueueState::Running);
            let wait = d
                .requeue_after
                .expect("in flight tasks wake up for their timeouts");
            if d.status.scheduled_at.is_none_or(|at| at <= now) {
                prop_assert!(wait <= Duration::from_secs(spec.timeout.hard_seconds as u64));
            }
        }
        _ => prop_assert_eq!(d.queue, QueueState::Done),
    }
    Ok(())
}

fn check_dispatch(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    now: Timestamp,
) -> Result<Option<Decision>, TestCaseError> {
    let result = dispatch(TASK, spec, status, &clock(now));
    let eligible = status.phase == Some(Pending)
        && !spec.cancel
        && status.next_attempt_at.is_none_or(|at| at <= now)
        && !(status.attempt > 0
            && status
                .budget_deadline
                .is_some_and(|deadline| now >= deadline));
    prop_assert_eq!(result.is_some(), eligible);
    if let Some(d) = &result {
        check_decision(spec, status, d, now)?;
        prop_assert_eq!(d.status.attempt, status.attempt + 1);
        prop_assert_eq!(d.status.retries, status.retries);
        prop_assert_eq!(d.transitions.len(), 1);
        prop_assert_eq!(d.status.phase, Some(Scheduled));
        prop_assert_eq!(
            d.status.worker.clone(),
            Some(pod_name(TASK, d.status.attempt))
        );
        prop_assert_eq!(&d.actions, &vec![Action::CreatePod]);
        prop_assert_eq!(d.status.scheduled_at, Some(now));
        prop_assert_eq!(d.queue, QueueState::Running);
        let expected_deadline = match (status.budget_deadline, spec.retry.budget_seconds) {
            (Some(deadline), _) => Some(deadline),
            (None, Some(budget)) => Some(now + SignedDuration::from_secs(budget)),
            (None, None) => None,
        };
        prop_assert_eq!(d.status.budget_deadline, expected_deadline);
    }
    Ok(result)
}

/// One thing that can happen to a task.
#[derive(Clone, Debug)]
enum Event {
    Reconcile(Option<WorkerState>),
    Dispatch,
    PodRejected,
    Callback(bool),
    Wait(i64),
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => prop::option::of(arb_worker()).prop_map(Event::Reconcile),
        2 => Just(Event::Dispatch),
        1 => Just(Event::PodRejected),
        1 => any::<bool>().prop_map(Event::Callback),
        3 => (0i64..400).prop_map(Event::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// One reconcile from any status, with any observation, at any time.
    #[test]
    fn reconcile_keeps_its_invariants(
        spec in arb_spec(),
        status in arb_status(),
        worker in prop::option::of(arb_worker()),
        now in -100i64..1500,
        unit_random in 0.0f64..1.0,
    ) {
        let now = t(now);
        // The controller looks the pod up by `status.worker`: no name, no pod.
        let worker = worker.filter(|_| status.worker.is_some());
        let error = validate(&spec).err();
        let c = Clock { now, operator: OP, unit_random };
        let d = reconcile(&spec, &status, Some(7), worker.as_ref(), error.as_deref(), &c);
        check_decision(&spec, &status, &d, now)?;
        check_queue(&spec, &d, now)?;
        prop_assert_eq!(d.status.attempt, status.attempt, "only dispatch starts attempts");
        prop_assert_eq!(d.status.observed_generation, Some(7));
        // Reconciling the result again at the same instant with the same inputs changes nothing
        // more for a task that is done.
        if d.status.phase.is_some_and(TaskPhase::is_terminal) {
            let again = reconcile(&spec, &d.status, Some(7), worker.as_ref(), error.as_deref(), &c);
            prop_assert_eq!(&again.status, &d.status);
        }
    }

    #[test]
    fn dispatch_only_picks_eligible_pending_tasks(
        spec in arb_spec(),
        status in arb_status(),
        now in -100i64..1500,
    ) {
        check_dispatch(&spec, &status, t(now))?;
    }

    #[test]
    fn pod_rejected_only_fails_a_scheduled_task(spec in arb_spec(), status in arb_status(), now in -100i64..1500) {
        let now = t(now);
        let d = pod_rejected(&spec, &status, "rejected", &clock(now));
        if status.phase == Some(Scheduled) {
            check_decision(&spec, &status, &d, now)?;
            prop_assert_eq!(d.status.phase, Some(Dead));
            prop_assert_eq!(d.status.last_failure.as_ref().map(|f| f.kind), Some(FailureKind::NonRetryable));
        } else {
            prop_assert_eq!(&d.status, &status);
            prop_assert!(d.transitions.is_empty() && d.actions.is_empty());
        }
    }

    #[test]
    fn callback_outcome_never_changes_the_phase_or_history(
        status in arb_status(),
        delivered in any::<bool>(),
        now in 0i64..100,
    ) {
        let s = callback_outcome(&status, delivered, "m", t(now));
        prop_assert_eq!(s.phase, status.phase);
        prop_assert_eq!(&s.history, &status.history);
        let c = s.conditions.iter().find(|c| c.type_ == "CallbackDelivered").expect("condition");
        prop_assert_eq!(c.status == "True", delivered);
        prop_assert_eq!(s.conditions.len(), status.conditions.len() + 1);
    }

    /// Whole lifetimes: a fixed spec, a random sequence of observations, dispatches, rejections,
    /// callback outcomes and waits, from creation on.
    #[test]
    fn random_lifetimes_keep_their_invariants(
        spec in arb_spec(),
        events in prop::collection::vec(arb_event(), 1..60),
        unit_random in 0.0f64..1.0,
    ) {
        let error = validate(&spec).err();
        let mut now = t(0);
        let mut status = AxTaskStatus::default();
        let mut recorded = 0i64;
        let mut finished: Option<(TaskPhase, Option<Timestamp>)> = None;
        for event in events {
            let c = Clock { now, operator: OP, unit_random };
            let before = status.clone();
            let decision = match event {
                Event::Reconcile(worker) => {
                    let worker = worker.filter(|_| status.worker.is_some());
                    let d = reconcile(&spec, &status, Some(1), worker.as_ref(), error.as_deref(), &c);
                    check_queue(&spec, &d, now)?;
                    Some(d)
                }
                Event::Dispatch => check_dispatch(&spec, &status, now)?,
                Event::PodRejected => Some(pod_rejected(&spec, &status, "rejected", &c)),
                Event::Callback(delivered) => {
                    status = callback_outcome(&status, delivered, "", now);
                    prop_assert_eq!(status.phase, before.phase);
                    None
                }
                Event::Wait(seconds) => {
                    now += SignedDuration::from_secs(seconds);
                    None
                }
            };
            if let Some(d) = decision {
                check_decision(&spec, &before, &d, now)?;
                recorded += d.transitions.len() as i64;
                status = d.status;
            }
            prop_assert!(status.retries <= spec.retry.max_retries, "retries {} > max", status.retries);
            prop_assert_eq!(status.history.len() as i64 + status.history_dropped, recorded);
            prop_assert!(status.history.len() <= HISTORY_CAP);
            prop_assert!(status.attempt >= before.attempt);
            if let Some(done) = finished {
                prop_assert_eq!((status.phase.expect("phase"), status.finished_at), done);
            } else if let Some(phase) = status.phase.filter(|p| p.is_terminal()) {
                finished = Some((phase, status.finished_at));
            }
            // Every attempt that was dispatched is in the history, in order.
            if status.history_dropped == 0 {
                let dispatched: Vec<i32> =
                    status.history.iter().filter(|e| e.to == Scheduled).map(|e| e.attempt).collect();
                prop_assert_eq!(dispatched, (1..=status.attempt).collect::<Vec<_>>());
            }
        }
    }

    /// A task that fails `failures` times and then succeeds: Succeeded with `retries == failures` when
    /// the retries suffice, otherwise Dead after `maxRetries + 1` attempts; with no jitter the gaps
    /// between attempts follow the backoff and grow.
    #[test]
    fn fail_k_times_then_succeed(
        failures in 0i32..8,
        max_retries in 0i32..6,
        base in 1i64..5,
        factor in 1.5f64..3.0,
    ) {
        let mut s = spec();
        s.retry.max_retries = max_retries;
        s.retry.backoff = BackoffSpec { base_seconds: base, factor, max_seconds: 1_000_000, jitter_millis: 0 };
        let mut now = t(0);
        let mut status = admitted(&s, now);
        let mut gaps = Vec::new();
        let mut failed = 0;
        loop {
            status = check_dispatch(&s, &status, now)?.expect("due").status;
            now += SignedDuration::from_secs(1);
            status = step(&s, &status, Some(&running_pod()), now).status;
            now += SignedDuration::from_secs(5);
            if failed == failures {
                status = step(&s, &status, Some(&succeeded_pod()), now).status;
                break;
            }
            let d = step(&s, &status, Some(&failed_pod(1, "")), now);
            failed += 1;
            status = d.status;
            if status.phase == Some(Dead) {
                break;
            }
            let next = status.next_attempt_at.expect("backoff");
            prop_assert_eq!(d.requeue_after, Some(Duration::try_from(next.duration_since(now)).expect("positive")));
            gaps.push(next.duration_since(now));
            now = next;
        }
        if failures <= max_retries {
            prop_assert_eq!(status.phase, Some(Succeeded));
            prop_assert_eq!(status.retries, failures);
            prop_assert_eq!(status.attempt, failures + 1);
            prop_assert_eq!(status.dead_reason, None);
        } else {
            prop_assert_eq!(status.phase, Some(Dead));
            prop_assert_eq!(status.retries, max_retries);
            prop_assert_eq!(status.attempt, max_retries + 1);
            prop_assert!(status.dead_reason.as_deref().is_some_and(|r| r.contains("retries used")));
        }
        for (i, gap) in gaps.iter().enumerate() {
            let expected = retry_delay(&s.retry.backoff, i as u32 + 1, 0.0);
            prop_assert_eq!(*gap, SignedDuration::try_from(expected).expect("fits"));
        }
        prop_assert!(gaps.windows(2).all(|w| w[1] > w[0]), "gaps grow: {:?}", gaps);
        let pods: Vec<String> = status.history.iter().filter(|e| e.to == Scheduled).map(|e| e.message.clone()).collect();
        prop_assert_eq!(pods.len() as i32, status.attempt);
        for (i, message) in pods.iter().enumerate() {
            let expected_pod = format!("pod job-{}", i + 1);
            prop_assert!(message.contains(&expected_pod), "{}", message);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the queue holds a task for, and what it learns when an attempt ends
// ---------------------------------------------------------------------------------------------

#[test]
fn held_reasons_are_written_once_and_kept_by_reconciles() {
    let spec = spec();
    let queued = admitted(&spec, t(0));
    let held_status = held(
        &queued,
        "ConcurrencyLimit",
        "the concurrency is in use",
        t(1),
    )
    .expect("a new reason is a change");
    assert_eq!(
        condition_status(&held_status, "Queued"),
        pair("True", "ConcurrencyLimit")
    );
    assert_eq!(
        held(&held_status, "ConcurrencyLimit", "other words", t(2)),
        None,
        "the same reason is no change"
    );
    // A reconcile of the held task keeps what the dispatcher said.
    let d = step(&spec, &held_status, None, t(3));
    assert_eq!(d.status, held_status, "nothing to write");
    // Dispatch ends the hold.
    let scheduled = dispatched(&spec, &held_status, t(4));
    assert_eq!(
        condition_status(&scheduled, "Queued"),
        pair("False", "Scheduled")
    );
}

#[test]
fn circuit_open_sets_and_clears_its_own_condition() {
    let spec = spec();
    let queued = admitted(&spec, t(0));
    let open = held(
        &queued,
        "CircuitOpen",
        "the circuit of report is open",
        t(1),
    )
    .expect("change");
    assert_eq!(
        condition_status(&open, "Queued"),
        pair("True", "CircuitOpen")
    );
    assert_eq!(
        condition_status(&open, "CircuitOpen"),
        pair("True", "CircuitOpen")
    );
    let step_status = step(&spec, &open, None, t(2)).status;
    assert_eq!(
        condition_status(&step_status, "CircuitOpen"),
        pair("True", "CircuitOpen"),
        "a reconcile keeps the hold"
    );
    let type_limited = held(&open, "TypeConcurrencyLimit", "limit", t(3)).expect("change");
    assert_eq!(
        condition_status(&type_limited, "CircuitOpen"),
        pair("False", "NotHeld")
    );
    // Dispatched straight out of an open-circuit hold (the probe): the condition clears too.
    let probe = dispatched(&spec, &open, t(31));
    assert_eq!(
        condition_status(&probe, "CircuitOpen"),
        pair("False", "NotHeld")
    );
    assert_eq!(
        condition(&probe, "CircuitOpen").last_transition_time,
        Time(t(31))
    );
}

#[test]
fn only_eligible_pending_tasks_are_held() {
    let spec = spec();
    let delayed = AxTaskSpec {
        start_after: Some(Time(t(100))),
        ..spec.clone()
    };
    assert_eq!(
        held(&admitted(&delayed, t(0)), "ConcurrencyLimit", "", t(1)),
        None
    );
    assert_eq!(
        held(&scheduled_task(&spec), "ConcurrencyLimit", "", t(1)),
        None
    );
    assert_eq!(held(&admitted(&spec, t(0)), "NoSuchReason", "", t(1)), None);
    // Back in backoff after a failure: the hold of the earlier attempt is gone.
    let held_status = held(&admitted(&spec, t(0)), "RetryRateLimited", "", t(1)).expect("held");
    let running = step(
        &spec,
        &dispatched(&spec, &held_status, t(2)),
        Some(&running_pod()),
        t(3),
    )
    .status;
    let retrying = step(&spec, &running, Some(&failed_pod(1, "")), t(4)).status;
    assert_eq!(
        condition_status(&retrying, "Queued"),
        pair("False", "Backoff")
    );
    let due = retrying.next_attempt_at.expect("backoff");
    let eligible = step(&spec, &retrying, None, due).status;
    assert_eq!(
        condition_status(&eligible, "Queued"),
        pair("True", "Waiting")
    );
}

#[test]
fn attempt_outcomes_as_the_breaker_sees_them() {
    let spec = spec();
    let running = running_task(&spec);
    let outcome = |worker: Option<&WorkerState>, spec: &AxTaskSpec| {
        attempt_outcome(&step(spec, &running, worker, t(5)))
    };
    assert_eq!(
        outcome(Some(&succeeded_pod()), &spec),
        Some(Outcome::Succeeded)
    );
    // Failed and retried, or failed for good: both are failures of the type.
    assert_eq!(
        outcome(Some(&failed_pod(1, "")), &spec),
        Some(Outcome::Failed)
    );
    let no_retries = AxTaskSpec {
        retry: RetrySpec {
            max_retries: 0,
            ..RetrySpec::default()
        },
        ..spec.clone()
    };
    assert_eq!(
        outcome(Some(&failed_pod(1, "")), &no_retries),
        Some(Outcome::Failed)
    );
    // Not the type's fault: evicted, deleted under it, canceled.
    assert_eq!(outcome(Some(&evicted_pod()), &spec), Some(Outcome::Aborted));
    assert_eq!(outcome(None, &spec), Some(Outcome::Aborted));
    let canceled = AxTaskSpec {
        cancel: true,
        ..spec.clone()
    };
    assert_eq!(
        outcome(Some(&running_pod()), &canceled),
        Some(Outcome::Aborted)
    );
    // Hard timeout is the worker's failure.
    assert_eq!(
        attempt_outcome(&step(&spec, &running, Some(&running_pod()), t(601))),
        Some(Outcome::Failed)
    );
    // Nothing ended.
    assert_eq!(outcome(Some(&running_pod()), &spec), None);
    assert_eq!(
        attempt_outcome(&step(&spec, &admitted(&spec, t(0)), None, t(1))),
        None
    );
}
