//! Tests of `decide`: one test per row of DESIGN §3's table, the fence and the kills, conditions,
//! and property tests over random tasks, pods and times — including a simulated world in which
//! pods start, finish, linger while being deleted and vanish, checked for "never two live workers".

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{
    BackoffSpec, CallbackSpec, ExitCodeMatch, ExitCodeOperator, PodReplacementPolicy, RetryRule,
    RuleAction, TimeoutSpec,
};
use crate::core::worker::{ContainerExit, MainContainer, PodPhase, pod_name};

use TaskPhase::{Canceled, Dead, Failed, Pending, Running, Scheduled, Succeeded, TimedOut};

const TASK: &str = "job";
const OP: &str = "ax-operator/ax-operator-0";

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

/// `secs` seconds after a fixed instant (negative: before it).
fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_900_000_000 + secs).expect("in range")
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

/// A decision as the controller asks for it: the spec validated, no slot granted.
fn at(spec: &AxTaskSpec, status: &AxTaskStatus, pods: &[WorkerState], now: Timestamp) -> Decision {
    decide_with(spec, status, pods, now, |_| {})
}

fn decide_with<'a>(
    spec: &'a AxTaskSpec,
    status: &'a AxTaskStatus,
    pods: &'a [WorkerState],
    now: Timestamp,
    edit: impl FnOnce(&mut Inputs<'a>),
) -> Decision {
    // Leaked so the error lives as long as the inputs borrowing it (tests only).
    let error: Option<&'a str> = validate(spec)
        .err()
        .map(|e| &*Box::leak(e.to_string().into_boxed_str()));
    let mut inputs = Inputs::new(TASK, spec, status, pods);
    inputs.generation = Some(1);
    inputs.spec_error = error;
    edit(&mut inputs);
    decide(&inputs, &clock(now))
}

/// The same with the queue's slot granted.
fn granted(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    pods: &[WorkerState],
    now: Timestamp,
) -> Decision {
    decide_with(spec, status, pods, now, |i| i.granted = true)
}

fn admitted(spec: &AxTaskSpec, now: Timestamp) -> AxTaskStatus {
    at(spec, &AxTaskStatus::default(), &[], now).status
}

/// Admitted and dispatched at t(0): attempt 1, Scheduled, worker `job-1`.
fn scheduled(spec: &AxTaskSpec) -> AxTaskStatus {
    let d = granted(spec, &AxTaskStatus::default(), &[], t(0));
    assert_eq!(d.status.phase, Some(Scheduled), "{:#?}", d.status.history);
    d.status
}

/// Dispatched at t(0), its pod seen running at t(1).
fn running(spec: &AxTaskSpec) -> AxTaskStatus {
    let d = at(spec, &scheduled(spec), &[pod(1, Run)], t(1));
    assert_eq!(d.status.phase, Some(Running));
    d.status
}

/// What a pod of attempt `attempt` is doing.
#[derive(Clone, Copy, Debug)]
enum PodIs {
    Waiting,
    Run,
    /// Main container exited with this code, pod terminal.
    Exited(i32),
    Evicted,
}
use PodIs::*;

fn pod(attempt: i32, is: PodIs) -> WorkerState {
    let mut w = WorkerState {
        name: pod_name(TASK, attempt),
        uid: Some(format!("uid-{attempt}")),
        attempt,
        node: Some("node-a".into()),
        node_ready: Some(true),
        ..WorkerState::default()
    };
    match is {
        Waiting => {
            w.main = MainContainer::Waiting;
        }
        Run => {
            w.phase = PodPhase::Running;
            w.main = MainContainer::Running { ready: true };
        }
        Exited(code) => {
            w.phase = if code == 0 {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
            w.main = MainContainer::Terminated;
            w.exit = Some(ContainerExit {
                exit_code: code,
                reason: if code == 0 { "Completed" } else { "Error" }.into(),
                message: String::new(),
            });
        }
        Evicted => {
            w.phase = PodPhase::Failed;
            w.disrupted = Some(("Evicted".into(), "node low on memory".into()));
        }
    }
    w
}

fn deleting(mut w: WorkerState, grace: i64) -> WorkerState {
    w.deleting = true;
    w.deletion_grace_seconds = Some(grace);
    w
}

fn with_finalizer(mut w: WorkerState) -> WorkerState {
    w.outcome_finalizer = true;
    w.finalizers = vec![crate::core::worker::OUTCOME_FINALIZER.into()];
    w
}

/// The main container exited but a sidecar keeps the pod Running.
fn sidecar_left(attempt: i32, code: i32) -> WorkerState {
    let mut w = pod(attempt, Run);
    w.main = MainContainer::Terminated;
    w.exit = Some(ContainerExit {
        exit_code: code,
        reason: "Completed".into(),
        message: String::new(),
    });
    w
}

fn stuck(attempt: i32, reason: &str) -> WorkerState {
    let mut w = pod(attempt, Waiting);
    w.stuck_reason = Some((reason.into(), "cannot pull".into()));
    w
}

fn path(d: &Decision) -> Vec<(Option<TaskPhase>, TaskPhase, String)> {
    d.transitions
        .iter()
        .map(|e| (e.from, e.to, e.reason.clone()))
        .collect()
}

fn row(
    from: Option<TaskPhase>,
    to: TaskPhase,
    reason: Reason,
) -> (Option<TaskPhase>, TaskPhase, String) {
    (from, to, reason.as_str().to_string())
}

fn condition_is(status: &AxTaskStatus, type_: &str) -> (String, String) {
    let c = status
        .condition(type_)
        .unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status.clone(), c.reason.clone())
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.into(), reason.into())
}

fn kills(d: &Decision) -> Vec<(String, Option<i64>, bool)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            Action::KillPod {
                name,
                grace_seconds,
                keep_outcome,
                ..
            } => Some((name.clone(), *grace_seconds, *keep_outcome)),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The table, row by row
// ---------------------------------------------------------------------------------------------

#[test]
fn new_task_is_queued_at_once() {
    let d = at(&spec(), &AxTaskStatus::default(), &[], t(0));
    assert_eq!(path(&d), vec![row(None, Pending, Reason::Queued)]);
    assert_eq!(d.status.queued_at, Some(t(0)));
    assert_eq!(d.queue, QueueState::Ready);
    assert_eq!(condition_is(&d.status, "Queued"), pair("True", "Waiting"));
    assert_eq!(condition_is(&d.status, "Ready"), pair("False", "Pending"));
    assert_eq!(d.transitions[0].actor, OP);
    assert!(d.actions.is_empty());
}

#[test]
fn new_task_with_a_free_slot_is_scheduled_in_the_same_decision() {
    let d = granted(&spec(), &AxTaskStatus::default(), &[], t(0));
    assert_eq!(
        path(&d),
        vec![
            row(None, Pending, Reason::Queued),
            row(Some(Pending), Scheduled, Reason::Dispatched)
        ]
    );
    let s = &d.status;
    assert_eq!((s.attempt, s.worker.as_deref()), (1, Some("job-1")));
    assert_eq!(s.scheduled_at, Some(t(0)));
    assert_eq!(d.actions, vec![Action::CreatePod]);
    assert_eq!(d.queue, QueueState::Holding);
    assert!(d.dispatched);
    assert_eq!(s.attempts.len(), 1);
    assert_eq!(s.attempts[0].pod, "job-1");
    assert_eq!(
        d.requeue_after,
        Some(Duration::from_secs(600)),
        "the hard timeout"
    );
}

#[test]
fn new_task_with_a_future_start_after_is_delayed_and_holds_nothing() {
    let mut s = spec();
    s.start_after = Some(Time(t(30)));
    let d = granted(&s, &AxTaskStatus::default(), &[], t(0));
    assert_eq!(path(&d), vec![row(None, Pending, Reason::Delayed)]);
    assert_eq!(d.status.next_attempt_at, Some(t(30)));
    assert_eq!(d.queue, QueueState::Waiting);
    assert!(
        !d.dispatched,
        "a granted slot is not used before startAfter"
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(30)));
    assert_eq!(condition_is(&d.status, "Queued"), pair("False", "Delayed"));
    // Once due, it waits for a slot like any task.
    let later = at(&s, &d.status, &[], t(30));
    assert!(later.transitions.is_empty());
    assert_eq!(later.queue, QueueState::Ready);
}

#[test]
fn invalid_new_task_goes_dead_and_nothing_else_happens() {
    let mut s = spec();
    s.timeout.soft_seconds = Some(900);
    let d = granted(&s, &AxTaskStatus::default(), &[], t(0));
    assert_eq!(path(&d), vec![row(None, Dead, Reason::InvalidSpec)]);
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .unwrap()
            .contains("softSeconds (900)")
    );
    assert!(d.actions.is_empty());
    assert_eq!(d.queue, QueueState::Done);
    assert_eq!(d.status.finished_at, Some(t(0)));
}

#[test]
fn task_canceled_before_it_was_queued_or_while_pending() {
    let mut s = spec();
    s.cancel = true;
    let d = at(&s, &AxTaskStatus::default(), &[], t(0));
    assert_eq!(path(&d), vec![row(None, Canceled, Reason::Canceled)]);
    assert_eq!(d.transitions[0].actor, ACTOR_USER);
    let pending = admitted(&spec(), t(0));
    let d = granted(&s, &pending, &[], t(1));
    assert_eq!(
        path(&d),
        vec![row(Some(Pending), Canceled, Reason::Canceled)]
    );
    assert_eq!(d.queue, QueueState::Done);
}

#[test]
fn scheduled_becomes_running_when_the_pod_runs() {
    let s = spec();
    let d = at(&s, &scheduled(&s), &[pod(1, Run)], t(1));
    assert_eq!(
        path(&d),
        vec![row(Some(Scheduled), Running, Reason::WorkerRunning)]
    );
    assert_eq!(d.transitions[0].actor, ACTOR_WORKER);
    assert_eq!(d.status.started_at, Some(t(1)));
    assert_eq!(d.status.node.as_deref(), Some("node-a"));
    assert_eq!(d.status.attempts[0].started_at, Some(t(1)));
    assert_eq!(d.queue, QueueState::Holding);
    assert!(d.actions.is_empty());
}

#[test]
fn scheduled_without_its_pod_creates_it_unless_it_was_just_created() {
    let s = spec();
    let d = at(&s, &scheduled(&s), &[], t(5));
    assert!(d.transitions.is_empty());
    assert_eq!(d.actions, vec![Action::CreatePod]);
    let just_created = crate::core::worker::expected("job-1", 1, t(0));
    let d = at(&s, &scheduled(&s), &[just_created], t(5));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn a_pod_that_never_appears_times_the_attempt_out_and_retries() {
    let s = spec();
    let d = at(&s, &scheduled(&s), &[], t(600));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Scheduled), TimedOut, Reason::PodNeverAppeared),
            row(Some(TimedOut), Pending, Reason::RetryScheduled)
        ]
    );
    assert_eq!(d.status.retries, 1);
}

/// A pod of attempt 1 whose main container exited 0 with termination message `message`.
fn exited_writing(message: &str) -> WorkerState {
    let mut w = pod(1, Exited(0));
    if let Some(exit) = w.exit.as_mut() {
        exit.message = message.into();
    }
    w
}

#[test]
fn a_succeeded_workers_termination_message_is_its_output_up_to_the_limit() {
    let s = spec();
    let d = at(
        &s,
        &running(&s),
        &[exited_writing("{\"rows\": 12}\n")],
        t(5),
    );
    assert_eq!(d.status.output, Some(serde_json::json!({"rows": 12})));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Succeeded, Reason::Completed)]
    );

    let big = "x".repeat(crate::core::output::TERMINATION_MESSAGE_KEPT_BYTES);
    let d = at(&s, &running(&s), &[exited_writing(&big)], t(5));
    assert_eq!(d.status.output, None);
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Succeeded, Reason::OutputTooLarge)],
        "over the limit the task still succeeds, saying why its output is missing"
    );
    assert!(
        d.status
            .history
            .last()
            .unwrap()
            .message
            .contains("over 4095 bytes")
    );
}

#[test]
fn a_failed_workers_termination_message_is_no_output() {
    let s = spec();
    let mut failed = pod(1, Exited(1));
    if let Some(exit) = failed.exit.as_mut() {
        exit.message = "{\"rows\": 12}".into();
    }
    let d = at(&s, &running(&s), &[failed], t(5));
    assert_eq!(d.status.output, None);
}

#[test]
fn running_task_succeeds_when_the_main_container_exits_zero() {
    let s = spec();
    let d = at(&s, &running(&s), &[pod(1, Exited(0))], t(5));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Succeeded, Reason::Completed)]
    );
    assert_eq!(d.queue, QueueState::Done);
    assert_eq!(d.outcome, Some(Outcome::Succeeded));
    assert_eq!(condition_is(&d.status, "Ready"), pair("True", "Succeeded"));
    assert!(
        d.status.condition("Failed").is_none(),
        "only a task that went Dead carries Failed"
    );
    let record = &d.status.attempts[0];
    assert_eq!(
        (record.outcome, record.exit_code, record.finished_at),
        (Some(Succeeded), Some(0), Some(t(5)))
    );
    assert!(kills(&d).is_empty());
}

#[test]
fn a_success_wins_over_a_passed_hard_timeout() {
    let s = spec();
    let d = at(&s, &running(&s), &[pod(1, Exited(0))], t(900));
    assert_eq!(d.status.phase, Some(Succeeded));
}

#[test]
fn non_zero_exit_fails_the_attempt_and_schedules_a_retry_after_backoff() {
    let s = spec();
    let d = at(&s, &running(&s), &[pod(1, Exited(3))], t(10));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Running), Failed, Reason::ExitCode),
            row(Some(Failed), Pending, Reason::RetryScheduled)
        ]
    );
    let st = &d.status;
    assert_eq!((st.retries, st.infrastructure_retries), (1, 0));
    assert_eq!(
        st.next_attempt_at,
        Some(t(11)),
        "base 1s for the first retry"
    );
    assert_eq!(d.queue, QueueState::Waiting);
    assert_eq!(d.outcome, Some(Outcome::Failed));
    assert_eq!(condition_is(st, "Queued"), pair("False", "Backoff"));
    assert_eq!(st.attempts[0].exit_code, Some(3));
    // Due again: the retry takes a new attempt number and pod.
    let d = granted(&s, st, &[pod(1, Exited(3))], t(11));
    assert_eq!(d.status.attempt, 2);
    assert_eq!(d.status.worker.as_deref(), Some("job-2"));
    assert_eq!(d.actions, vec![Action::CreatePod]);
}

#[test]
fn retries_exhausted_goes_dead() {
    let mut s = spec();
    s.retry.max_retries = 0;
    let d = at(&s, &running(&s), &[pod(1, Exited(1))], t(10));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Running), Failed, Reason::ExitCode),
            row(Some(Failed), Dead, Reason::RetriesExhausted)
        ]
    );
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .unwrap()
            .contains("all 0 retries used")
    );
    assert_eq!(d.queue, QueueState::Done);
    // `kubectl wait --for=condition=Failed` ends here; Ready stays False.
    assert_eq!(condition_is(&d.status, "Failed"), pair("True", "Dead"));
    assert_eq!(condition_is(&d.status, "Ready"), pair("False", "Dead"));
    let failed = d.status.condition("Failed").unwrap();
    assert_eq!(Some(failed.message.as_str()), d.status.reason.as_deref());
}

#[test]
fn business_error_goes_dead_with_retries_left() {
    let s = spec();
    let mut w = pod(1, Exited(2));
    w.exit.as_mut().unwrap().message = r#"{"error":"biz","reason":"no such account"}"#.into();
    let d = at(&s, &running(&s), &[w], t(10));
    assert_eq!(d.status.phase, Some(Dead));
    assert_eq!(d.transitions[1].reason, "NonRetryable");
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .unwrap()
            .contains("no such account")
    );
}

#[test]
fn hard_timeout_kills_the_worker_and_waits_for_it_before_anything_else() {
    let s = spec();
    let d = at(&s, &running(&s), &[pod(1, Run)], t(600));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), TimedOut, Reason::HardTimeout)]
    );
    assert_eq!(kills(&d), vec![("job-1".into(), Some(10), true)]);
    assert_eq!(
        d.queue,
        QueueState::Holding,
        "the slot stays while the worker may run"
    );
    assert_eq!(d.outcome, Some(Outcome::Failed));
    assert_eq!(
        condition_is(&d.status, "WorkerTerminating"),
        pair("True", "WaitingForPod")
    );
    assert_eq!(d.status.retries, 0, "decided once the pod is gone");

    // Terminating, the worker ignores SIGTERM: nothing more happens, the kill is not re-sent.
    let killed = with_finalizer(deleting(pod(1, Run), 10));
    let wait = at(&s, &d.status, std::slice::from_ref(&killed), t(605));
    assert!(
        wait.transitions.is_empty() && wait.actions.is_empty(),
        "{:?}",
        wait.actions
    );
    assert_eq!(wait.queue, QueueState::Holding);

    // Killed: the finalizer comes off once the last status is read; still TimedOut until gone.
    let mut dead_pod = killed;
    dead_pod.phase = PodPhase::Failed;
    dead_pod.main = MainContainer::Terminated;
    dead_pod.exit = Some(ContainerExit {
        exit_code: 137,
        reason: "Error".into(),
        message: String::new(),
    });
    let read = at(&s, &d.status, &[dead_pod.clone()], t(611));
    assert!(read.transitions.is_empty());
    assert_eq!(
        read.actions,
        vec![Action::RemoveFinalizer {
            name: "job-1".into(),
            uid: "uid-1".into()
        }]
    );

    // Gone: now the retry is decided.
    let gone = at(&s, &d.status, &[], t(612));
    assert_eq!(
        path(&gone),
        vec![row(Some(TimedOut), Pending, Reason::RetryScheduled)]
    );
    assert_eq!(gone.status.retries, 1);
    assert_eq!(gone.status.next_attempt_at, Some(t(613)));
    assert_eq!(
        condition_is(&gone.status, "WorkerTerminating"),
        pair("False", "PodsStopped")
    );
}

#[test]
fn a_worker_that_exits_zero_after_its_hard_timeout_makes_the_task_succeed() {
    let s = spec();
    let timed_out = at(&s, &running(&s), &[pod(1, Run)], t(600)).status;
    let finished = with_finalizer(deleting(pod(1, Exited(0)), 10));
    let d = at(&s, &timed_out, &[finished], t(603));
    assert_eq!(
        path(&d),
        vec![row(
            Some(TimedOut),
            Succeeded,
            Reason::CompletedAfterTimeout
        )]
    );
    assert!(
        d.transitions[0]
            .message
            .contains("after the attempt had ended TimedOut")
    );
    assert_eq!(d.status.attempt, 1, "no second attempt");
    assert!(d.actions.contains(&Action::RemoveFinalizer {
        name: "job-1".into(),
        uid: "uid-1".into()
    }));
    assert_eq!(d.status.dead_reason, None);
}

#[test]
fn hard_timeout_of_the_last_retry_goes_dead_only_once_the_worker_is_gone() {
    let mut s = spec();
    s.retry.max_retries = 0;
    let d = at(&s, &running(&s), &[pod(1, Run)], t(600));
    assert_eq!(
        d.status.phase,
        Some(TimedOut),
        "not Dead while the worker may run"
    );
    let d = at(&s, &d.status, &[deleting(pod(1, Run), 10)], t(605));
    assert_eq!(d.status.phase, Some(TimedOut));
    let d = at(&s, &d.status, &[], t(611));
    assert_eq!(
        path(&d),
        vec![row(Some(TimedOut), Dead, Reason::RetriesExhausted)]
    );
}

#[test]
fn with_terminating_or_failed_the_next_attempt_does_not_wait_for_a_terminating_pod() {
    let mut s = spec();
    s.retry.pod_replacement_policy = PodReplacementPolicy::TerminatingOrFailed;
    let d = at(&s, &running(&s), &[pod(1, Run)], t(600));
    assert_eq!(d.status.phase, Some(TimedOut), "the kill is not sent yet");
    let d = at(&s, &d.status, &[deleting(pod(1, Run), 10)], t(600));
    assert_eq!(
        path(&d),
        vec![row(Some(TimedOut), Pending, Reason::RetryScheduled)]
    );
    let next = granted(&s, &d.status, &[deleting(pod(1, Run), 10)], t(700));
    assert_eq!(next.status.phase, Some(Scheduled));
    assert_eq!(next.status.attempt, 2);
}

#[test]
fn a_succeeded_pod_being_deleted_holds_nothing_a_failed_one_holds_the_retry() {
    let s = spec();
    // Succeeded, its pod being deleted (a fan-out item's, or anyone's delete): only its kubelet
    // sets that phase, once every container exited 0; nothing waits and nothing is written.
    let done = at(&s, &running(&s), &[pod(1, Exited(0))], t(5));
    assert_eq!(done.status.phase, Some(Succeeded));
    let gone_soon = with_finalizer(deleting(pod(1, Exited(0)), 0));
    let d = at(&s, &done.status, std::slice::from_ref(&gone_soon), t(6));
    assert_eq!(d.status, done.status, "no WorkerTerminating");
    assert_eq!(d.queue, QueueState::Done);
    // A timed-out attempt's pod that ends Failed while being deleted may be a lost node's, which pod
    // GC marks Failed while it may run on there: the retry waits until it is gone.
    let timed_out = at(&s, &running(&s), &[pod(1, Run)], t(600));
    assert_eq!(timed_out.status.phase, Some(TimedOut));
    let failed = deleting(pod(1, Exited(137)), 10);
    let d = at(&s, &timed_out.status, &[failed], t(601));
    assert_eq!(d.status.phase, Some(TimedOut));
    assert_eq!(
        condition_is(&d.status, "WorkerTerminating"),
        pair("True", "WaitingForPod")
    );
    // One that ends Succeeded while being deleted did the work: the task Succeeds.
    let d = at(&s, &timed_out.status, &[gone_soon], t(601));
    assert_eq!(d.status.phase, Some(Succeeded));
}

#[test]
fn a_pending_task_with_a_live_pod_of_an_earlier_attempt_holds_its_slot_and_is_not_dispatched() {
    let s = spec();
    let mut status = running(&s);
    status.phase = Some(Pending);
    let d = granted(&s, &status, &[pod(1, Run)], t(10));
    assert!(!d.dispatched);
    assert_eq!(d.status.attempt, 1);
    assert_eq!(d.queue, QueueState::Holding);
    assert_eq!(kills(&d), vec![("job-1".into(), None, false)]);
    assert_eq!(
        condition_is(&d.status, "Queued"),
        pair("True", "WorkerTerminating")
    );
}

#[test]
fn a_suspended_task_waits_outside_its_queue_and_a_slot_granted_goes_back_unused() {
    let mut s = spec();
    s.suspend = true;
    let d = at(&s, &AxTaskStatus::default(), &[], t(0));
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.queue, QueueState::Waiting);
    assert_eq!(
        condition_is(&d.status, "Queued"),
        pair("False", "Suspended")
    );
    assert_eq!(
        condition_is(&d.status, "Suspended"),
        pair("True", "Suspended")
    );
    let d = granted(&s, &d.status, &[], t(1));
    assert!(!d.dispatched, "suspended, yet dispatched");
    assert_eq!(d.status.attempt, 0);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.queue, QueueState::Waiting);
}

#[test]
fn a_resumed_task_is_queued_again_and_its_suspended_condition_ends_false() {
    let mut s = spec();
    s.suspend = true;
    let suspended = at(&s, &AxTaskStatus::default(), &[], t(0)).status;
    s.suspend = false;
    let d = at(&s, &suspended, &[], t(5));
    assert_eq!(d.queue, QueueState::Ready);
    assert_eq!(condition_is(&d.status, "Queued"), pair("True", "Waiting"));
    assert_eq!(
        condition_is(&d.status, "Suspended"),
        pair("False", "Active")
    );
    let d = granted(&s, &d.status, &[], t(6));
    assert!(d.dispatched);
    assert_eq!(d.status.phase, Some(Scheduled));
}

#[test]
fn suspend_leaves_a_running_attempt_alone_and_holds_its_retry() {
    let mut s = spec();
    let running = running(&s);
    s.suspend = true;
    let d = at(&s, &running, &[pod(1, Run)], t(5));
    assert_eq!(d.status.phase, Some(Running));
    assert!(d.actions.is_empty(), "no kill: {:?}", d.actions);
    assert_eq!(d.queue, QueueState::Holding);
    // It fails; once its backoff has passed it waits, suspended, instead of running again.
    let failed = at(&s, &d.status, &[pod(1, Exited(1))], t(6)).status;
    assert_eq!(failed.phase, Some(Pending));
    let later = failed.next_attempt_at.unwrap() + SignedDuration::from_secs(1);
    let d = granted(&s, &failed, &[pod(1, Exited(1))], later);
    assert!(!d.dispatched);
    assert_eq!(d.queue, QueueState::Waiting);
    assert_eq!(
        condition_is(&d.status, "Queued"),
        pair("False", "Suspended")
    );
}

#[test]
fn a_pod_created_before_suspend_was_seen_is_taken_up_not_left_running_unrecorded() {
    let mut s = spec();
    let pending = admitted(&s, t(0));
    s.suspend = true;
    let d = at(&s, &pending, &[pod(1, Run)], t(1));
    assert_eq!(d.status.attempt, 1);
    assert_eq!(d.status.phase, Some(Running));
}

#[test]
fn a_draining_queue_stops_the_attempt_without_using_a_retry_and_it_waits_for_the_queue() {
    let s = spec();
    let running = running(&s);
    let d = decide_with(&s, &running, &[pod(1, Run)], t(5), |i| i.draining = true);
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Failed, Reason::QueueDrained)]
    );
    assert_eq!(kills(&d).len(), 1, "the worker is stopped: {:?}", d.actions);
    let failure = d.status.last_failure.clone().unwrap();
    assert_eq!(failure.kind, FailureKind::Infrastructure);
    assert_eq!(
        d.outcome,
        Some(Outcome::Aborted),
        "not a failure of the type"
    );
    // Once its pod is gone it waits Pending, its maxRetries untouched.
    let d = decide_with(&s, &d.status, &[], t(20), |i| i.draining = true);
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!((d.status.retries, d.status.infrastructure_retries), (0, 1));
    // A worker that already exited 0 keeps its success.
    let d = decide_with(&s, &running, &[pod(1, Exited(0))], t(5), |i| {
        i.draining = true
    });
    assert_eq!(d.status.phase, Some(Succeeded));
}

#[test]
fn a_preempted_attempt_stops_without_using_a_retry_and_waits_in_the_queue_again() {
    let s = spec();
    let running = running(&s);
    let d = decide_with(&s, &running, &[pod(1, Run)], t(5), |i| i.preempted = true);
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Failed, Reason::Preempted)]
    );
    assert_eq!(kills(&d).len(), 1, "the worker is stopped: {:?}", d.actions);
    let failure = d.status.last_failure.clone().unwrap();
    assert_eq!(failure.kind, FailureKind::Infrastructure);
    assert!(failure.message.contains("preempted"), "{}", failure.message);
    assert_eq!(
        d.outcome,
        Some(Outcome::Aborted),
        "not a failure of the type"
    );
    // Once its pod is gone it waits Pending again, its maxRetries untouched.
    let d = decide_with(&s, &d.status, &[], t(20), |i| i.preempted = true);
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!((d.status.retries, d.status.infrastructure_retries), (0, 1));
    // A worker that already exited 0 keeps its success.
    let d = decide_with(&s, &running, &[pod(1, Exited(0))], t(5), |i| {
        i.preempted = true
    });
    assert_eq!(d.status.phase, Some(Succeeded));
    // A grant taken back before its pod was created goes back to the queue unused.
    let pending = admitted(&s, t(0));
    let d = decide_with(&s, &pending, &[], t(1), |i| {
        i.granted = true;
        i.preempted = true;
    });
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.phase, Some(Pending));
    assert_eq!(d.queue, QueueState::Ready);
}

#[test]
fn a_pending_task_whose_next_attempts_pod_exists_takes_the_attempt_up_with_it() {
    // The pod was created beside the dispatch's status write, which did not land.
    let s = spec();
    let pending = admitted(&s, t(0));
    for grant in [false, true] {
        let d = decide_with(&s, &pending, &[pod(1, Run)], t(1), |i| i.granted = grant);
        assert_eq!(
            path(&d),
            vec![
                row(Some(Pending), Scheduled, Reason::Dispatched),
                row(Some(Scheduled), Running, Reason::WorkerRunning)
            ]
        );
        assert_eq!(d.status.attempt, 1);
        assert_eq!(d.status.worker.as_deref(), Some("job-1"));
        assert!(
            d.actions.is_empty(),
            "no second pod, no kill: {:?}",
            d.actions
        );
        assert_eq!(d.dispatched, grant, "a slot granted is used");
        assert_eq!(d.queue, QueueState::Holding);
    }
    // It may have finished meanwhile: its result is the attempt's.
    let d = at(&s, &pending, &[pod(1, Exited(0))], t(1));
    assert_eq!(d.status.phase, Some(Succeeded));
    assert_eq!(d.status.attempt, 1);
}

#[test]
fn a_next_attempts_pod_that_may_not_start_is_stopped_and_a_dead_verdict_waits_for_it() {
    let mut s = spec();
    s.retry.budget_seconds = Some(10);
    let mut status = at(&s, &running(&s), &[pod(1, Exited(1))], t(5)).status;
    assert_eq!(status.phase, Some(Pending));
    status.next_attempt_at = Some(t(8));
    // Still in its backoff: the pod is stopped, the task waits.
    let early = granted(&s, &status, &[pod(2, Run)], t(6));
    assert_eq!(early.status.attempt, 1);
    assert_eq!(kills(&early), vec![("job-2".into(), Some(10), false)]);
    // The budget ended: Dead only once that pod is gone.
    let late = granted(&s, &status, &[deleting(pod(2, Run), 10)], t(20));
    assert_eq!(
        late.status.phase,
        Some(Pending),
        "not Dead while it may run"
    );
    let gone = granted(&s, &status, &[], t(21));
    assert_eq!(
        path(&gone),
        vec![row(Some(Pending), Dead, Reason::BudgetExceeded)]
    );
}

/// The dispatch's pod was evicted or force-deleted before its status write landed (the operator
/// died in between): the attempt it ran is taken up and recorded, failed as infrastructure, and the
/// retry is attempt 2 — never a second pod named for attempt 1.
#[test]
fn a_next_attempts_pod_being_deleted_is_taken_up_and_fails_as_infrastructure() {
    let s = spec();
    let evicted = deleting(with_finalizer(pod(1, Run)), 0);
    let d = granted(&s, &admitted(&s, t(0)), &[evicted], t(1));
    assert!(!d.actions.contains(&Action::CreatePod), "{:?}", d.actions);
    assert_eq!(d.status.attempt, 1);
    assert_eq!(d.status.phase, Some(Failed), "{:#?}", d.transitions);
    let failure = d.status.last_failure.clone().unwrap();
    assert_eq!(failure.kind, FailureKind::Infrastructure);
    assert_eq!(d.status.retries, 0);
    assert_eq!(d.status.attempts.len(), 1);
    // Force-deleted (grace 0): nothing will report on it, its finalizer comes off.
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::RemoveFinalizer { name, .. } if name == "job-1")),
        "{:?}",
        d.actions
    );
}

/// What the 3,000-task soak found: the previous attempt's pod was still being deleted (pod GC)
/// when the next attempt's pod, from a dispatch whose status write did not land, finished and was
/// deleted too. The first pod fences the task, so the second is not taken up yet; its outcome
/// finalizer must stay until it is, or its run leaves no record and the attempt runs again.
#[test]
fn a_next_attempts_pod_keeps_its_outcome_while_an_older_pod_fences_the_task() {
    let s = spec();
    let mut status = at(&s, &running(&s), &[pod(1, Exited(1))], t(5)).status;
    assert_eq!(status.phase, Some(Pending));
    status.next_attempt_at = Some(t(8));
    let older = deleting(pod(1, Exited(1)), 0);
    let next = with_finalizer(deleting(pod(2, Exited(1)), 0));
    let fenced = granted(&s, &status, &[older, next.clone()], t(10));
    assert_eq!(fenced.status.attempt, 1, "not taken up while fenced");
    assert!(!removes_finalizer(&fenced, 2), "{:?}", fenced.actions);

    let taken = granted(&s, &status, std::slice::from_ref(&next), t(11));
    assert_eq!(taken.status.attempt, 2, "{:#?}", taken.transitions);
    assert_eq!(
        taken.status.last_failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Infrastructure)
    );
    assert!(removes_finalizer(&taken, 2), "recorded, so it may go");

    // A task that ended never takes it up: nothing to keep it for.
    let mut canceled = status.clone();
    canceled.phase = Some(Canceled);
    assert!(removes_finalizer(
        &at(&s, &canceled, std::slice::from_ref(&next), t(12)),
        2
    ));
    // Nor one still in its wait: the pod is stopped, not taken up, and must be free to go.
    let mut waiting = status.clone();
    waiting.next_attempt_at = Some(t(60));
    let early = granted(&s, &waiting, &[next], t(12));
    assert_eq!(early.status.attempt, 1);
    assert!(removes_finalizer(&early, 2), "{:?}", early.actions);
}

#[test]
fn cancel_shows_canceled_at_once_and_the_condition_stays_until_the_pod_is_gone() {
    let mut s = spec();
    let status = running(&s);
    s.cancel = true;
    let d = at(&s, &status, &[pod(1, Run)], t(5));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Canceled, Reason::Canceled)]
    );
    assert_eq!(kills(&d), vec![("job-1".into(), None, false)]);
    assert_eq!(d.queue, QueueState::Holding);
    assert_eq!(d.outcome, Some(Outcome::Aborted));
    assert_eq!(
        condition_is(&d.status, "WorkerTerminating"),
        pair("True", "WaitingForPod")
    );
    let still = at(&s, &d.status, &[deleting(pod(1, Run), 30)], t(6));
    assert!(still.actions.is_empty() && still.transitions.is_empty());
    let gone = at(&s, &d.status, &[], t(40));
    assert_eq!(gone.queue, QueueState::Done);
    assert_eq!(
        condition_is(&gone.status, "WorkerTerminating"),
        pair("False", "PodsStopped")
    );
}

#[test]
fn a_kill_that_was_lost_is_sent_again_by_the_next_decision() {
    let mut s = spec();
    let status = running(&s);
    s.cancel = true;
    let canceled = at(&s, &status, &[pod(1, Run)], t(5)).status;
    // The delete never happened (the operator died, the API server said 503): the pod runs on.
    let again = at(&s, &canceled, &[pod(1, Run)], t(60));
    assert_eq!(kills(&again), vec![("job-1".into(), None, false)]);
    // A deletion with a longer grace than a timeout kill allows is shortened.
    let timed_out = at(&spec(), &running(&spec()), &[pod(1, Run)], t(600)).status;
    let slow = deleting(pod(1, Run), 40);
    let d = at(&spec(), &timed_out, &[slow], t(601));
    assert_eq!(kills(&d), vec![("job-1".into(), Some(10), false)]);
}

#[test]
fn eviction_retries_without_counting_up_to_max_infrastructure_retries() {
    let mut s = spec();
    s.retry.max_infrastructure_retries = 1;
    let d = at(&s, &running(&s), &[pod(1, Evicted)], t(10));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Running), Failed, Reason::Evicted),
            row(Some(Failed), Pending, Reason::RetryScheduled)
        ]
    );
    assert_eq!((d.status.retries, d.status.infrastructure_retries), (0, 1));
    assert_eq!(
        d.outcome,
        Some(Outcome::Aborted),
        "says nothing about the type"
    );
    let second = granted(&s, &d.status, &[pod(1, Evicted)], t(20)).status;
    let second = at(&s, &second, &[pod(1, Evicted), pod(2, Run)], t(21)).status;
    let d = at(&s, &second, &[pod(1, Evicted), pod(2, Evicted)], t(22));
    assert_eq!(
        d.transitions.last().map(|e| (e.to, e.reason.as_str())),
        Some((Dead, "InfrastructureRetriesExhausted"))
    );
    assert!(
        d.status
            .dead_reason
            .as_deref()
            .unwrap()
            .contains("maxInfrastructureRetries")
    );
}

#[test]
fn an_image_pull_error_kills_the_pod_at_once_and_retries_as_infrastructure() {
    let s = spec();
    let d = at(&s, &scheduled(&s), &[stuck(1, "ErrImagePull")], t(5));
    assert_eq!(
        path(&d),
        vec![row(Some(Scheduled), Failed, Reason::ErrImagePull)]
    );
    assert_eq!(kills(&d), vec![("job-1".into(), Some(0), false)]);
    assert_eq!(d.queue, QueueState::Holding);
    let gone = at(&s, &d.status, &[], t(6));
    assert_eq!(gone.status.phase, Some(Pending));
    assert_eq!(gone.status.infrastructure_retries, 1);
}

#[test]
fn an_image_that_may_never_be_pulled_goes_dead_once_its_pod_is_gone() {
    let s = spec();
    let d = at(&s, &scheduled(&s), &[stuck(1, "ErrImageNeverPull")], t(5));
    assert_eq!(d.status.phase, Some(Failed));
    let gone = at(&s, &d.status, &[], t(6));
    assert_eq!(
        path(&gone),
        vec![row(Some(Failed), Dead, Reason::NonRetryable)]
    );
}

#[test]
fn a_pod_deleted_by_someone_else_fails_the_attempt_and_the_retry_waits_for_it() {
    let s = spec();
    let d = at(&s, &running(&s), &[deleting(pod(1, Run), 30)], t(5));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Failed, Reason::WorkerDeleted)]
    );
    assert!(kills(&d).is_empty(), "already being deleted");
    assert_eq!(d.queue, QueueState::Holding);
    let gone = at(&s, &d.status, &[], t(30));
    assert_eq!(gone.status.phase, Some(Pending));
    assert_eq!(
        (gone.status.retries, gone.status.infrastructure_retries),
        (0, 1)
    );
}

#[test]
fn a_worker_stopped_by_someone_elses_delete_is_not_blamed_for_its_exit_code() {
    let s = spec();
    let mut stopped = deleting(pod(1, Exited(143)), 30);
    stopped.phase = PodPhase::Failed;
    let d = at(&s, &running(&s), &[stopped], t(5));
    assert_eq!(d.transitions[0].reason, "WorkerDeleted");
    assert_eq!(
        d.status.last_failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Infrastructure)
    );
}

#[test]
fn a_running_pod_that_disappeared_is_retried_without_counting() {
    let s = spec();
    let d = at(&s, &running(&s), &[], t(5));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Running), Failed, Reason::WorkerDeleted),
            row(Some(Failed), Pending, Reason::RetryScheduled)
        ]
    );
}

#[test]
fn sidecars_do_not_keep_a_task_running_when_the_main_container_succeeded() {
    let s = spec();
    let d = at(&s, &running(&s), &[sidecar_left(1, 0)], t(5));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), Succeeded, Reason::Completed)]
    );
    assert_eq!(kills(&d), vec![("job-1".into(), None, false)]);
    assert_eq!(d.queue, QueueState::Holding, "until the sidecar is stopped");
    let gone = at(&s, &d.status, &[], t(35));
    assert_eq!(gone.queue, QueueState::Done);
}

#[test]
fn a_main_container_failure_with_a_sidecar_left_retries_once_the_pod_is_gone() {
    let s = spec();
    let d = at(&s, &running(&s), &[sidecar_left(1, 4)], t(5));
    assert_eq!(path(&d), vec![row(Some(Running), Failed, Reason::ExitCode)]);
    assert_eq!(kills(&d), vec![("job-1".into(), None, false)]);
    let d = at(&s, &d.status, &[], t(40));
    assert_eq!(d.status.phase, Some(Pending));
}

#[test]
fn an_init_container_failure_is_classified_like_the_main_container() {
    let mut s = spec();
    s.retry.rules = vec![rule(ExitCodeOperator::In, &[9], RuleAction::Dead)];
    let mut w = pod(1, Waiting);
    w.phase = PodPhase::Failed;
    w.exit = Some(ContainerExit {
        exit_code: 9,
        reason: "init container setup: Error".into(),
        message: String::new(),
    });
    let d = at(&s, &scheduled(&s), &[w], t(5));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Scheduled), Failed, Reason::ExitCodeRule),
            row(Some(Failed), Dead, Reason::NonRetryable)
        ]
    );
}

fn soft(probe: bool) -> AxTaskSpec {
    let mut s = spec();
    s.timeout = TimeoutSpec {
        soft_seconds: Some(30),
        hard_seconds: 600,
    };
    if probe {
        let container = &mut s.template.spec.as_mut().unwrap().containers[0];
        container.readiness_probe = Some(
            serde_json::from_value(json!({"exec": {"command": ["test", "-f", "/tmp/ok"]}}))
                .unwrap(),
        );
    }
    s
}

#[test]
fn soft_timeout_without_a_probe_warns_once_for_a_running_worker() {
    let s = soft(false);
    let st = running(&s);
    let before = at(&s, &st, &[pod(1, Run)], t(20));
    assert_eq!(
        before.requeue_after,
        Some(Duration::from_secs(11)),
        "soft at t(31)"
    );
    let d = at(&s, &st, &[pod(1, Run)], t(31));
    assert!(d.transitions.is_empty());
    assert!(matches!(
        d.actions.as_slice(),
        [Action::Warn {
            reason: Reason::SoftTimeout,
            ..
        }]
    ));
    let again = at(&s, &d.status, &[pod(1, Run)], t(40));
    assert!(again.actions.is_empty(), "once per attempt");
}

#[test]
fn soft_timeout_asks_the_probe_when_there_is_one() {
    let s = soft(true);
    let st = running(&s);
    let d = at(&s, &st, &[pod(1, Run)], t(31));
    assert!(d.transitions.is_empty(), "ready: alive");
    let mut not_ready = pod(1, Run);
    not_ready.main = MainContainer::Running { ready: false };
    let d = at(&s, &st, &[not_ready], t(31));
    assert_eq!(
        path(&d),
        vec![row(Some(Running), TimedOut, Reason::SoftTimeout)]
    );
    assert!(d.transitions[0].message.contains("probe fails"));
    assert_eq!(kills(&d), vec![("job-1".into(), Some(10), true)]);
}

#[test]
fn soft_timeout_without_a_probe_counts_a_not_ready_node_as_dead() {
    let s = soft(false);
    let mut w = pod(1, Run);
    w.node_ready = Some(false);
    let d = at(&s, &running(&s), &[w], t(31));
    assert_eq!(d.status.phase, Some(TimedOut));
}

#[test]
fn a_pod_refused_by_a_quota_waits_in_the_queue_without_using_a_retry() {
    let s = spec();
    let refusal = Refusal::Forbidden("exceeded quota: pods=0".into());
    let d = decide_with(&s, &scheduled(&s), &[], t(0), |i| {
        i.refused = Some(&refusal)
    });
    assert_eq!(
        path(&d),
        vec![row(Some(Scheduled), Pending, Reason::PodForbidden)]
    );
    assert_eq!((d.status.retries, d.status.infrastructure_retries), (0, 0));
    assert_eq!(d.status.next_attempt_at, Some(t(1)));
    assert_eq!(
        d.queue,
        QueueState::Waiting,
        "the slot is released while it waits"
    );
    assert_eq!(d.outcome, Some(Outcome::Aborted));
    let (status, reason) = condition_is(&d.status, "Queued");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PodForbidden")
    );
    assert!(
        d.status
            .condition("Queued")
            .unwrap()
            .message
            .contains("exceeded quota")
    );
    assert!(!d.actions.contains(&Action::CreatePod));
    assert_eq!(notice(&d.transitions[0]), Some(Notice::Warning));
}

#[test]
fn an_invalid_pod_makes_the_task_dead_with_invalid_spec() {
    let s = spec();
    let refusal = Refusal::Invalid("spec.containers[0].image: Required value".into());
    let d = decide_with(&s, &scheduled(&s), &[], t(0), |i| {
        i.refused = Some(&refusal)
    });
    assert_eq!(
        path(&d),
        vec![
            row(Some(Scheduled), Failed, Reason::PodRejected),
            row(Some(Failed), Dead, Reason::InvalidSpec)
        ]
    );
}

#[test]
fn retry_budget_ends_retries() {
    let mut s = spec();
    s.retry.budget_seconds = Some(5);
    let st = running(&s);
    assert_eq!(st.budget_deadline, Some(t(5)));
    let mut w = pod(1, Exited(1));
    w.node = None;
    s.retry.backoff.base_seconds = 10;
    let d = at(&s, &st, &[w], t(2));
    assert_eq!(d.transitions.last().unwrap().reason, "BudgetExceeded");
}

#[test]
fn a_rerun_starts_a_dead_task_again_with_retries_and_budget_reset() {
    let mut s = spec();
    s.retry.max_retries = 0;
    s.retry.budget_seconds = Some(100);
    let dead = at(&s, &running(&s), &[pod(1, Exited(1))], t(10)).status;
    assert_eq!(dead.phase, Some(Dead));
    s.rerun = 1;
    let d = granted(&s, &dead, &[pod(1, Exited(1))], t(20));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Dead), Pending, Reason::Rerun),
            row(Some(Pending), Scheduled, Reason::Dispatched)
        ]
    );
    assert_eq!(d.transitions[0].actor, ACTOR_USER);
    let st = &d.status;
    assert_eq!((st.attempt, st.retries, st.observed_rerun), (2, 0, 1));
    assert_eq!(st.worker.as_deref(), Some("job-2"), "pod names stay unique");
    assert_eq!(
        st.budget_deadline,
        Some(t(120)),
        "budget counted from the re-run"
    );
    assert_eq!(st.dead_reason, None);
    assert_eq!(
        condition_is(st, "Failed"),
        pair("False", "Scheduled"),
        "a re-run is no longer Failed"
    );
    assert!(st.history.len() > 4, "history kept");
    // The same request seen again changes nothing more.
    let again = at(&s, st, &[pod(1, Exited(1)), pod(2, Run)], t(21));
    assert_eq!(again.status.observed_rerun, 1);
    assert_eq!(again.status.attempt, 2);
}

#[test]
fn a_rerun_requested_while_running_is_acted_on_when_the_task_finishes() {
    let mut s = spec();
    let st = running(&s);
    s.rerun = 1;
    let d = at(&s, &st, &[pod(1, Run)], t(5));
    assert_eq!(
        condition_is(&d.status, "RerunRequested"),
        pair("True", "WaitingForFinish")
    );
    let d = at(&s, &d.status, &[pod(1, Exited(0))], t(6));
    assert_eq!(
        path(&d),
        vec![
            row(Some(Running), Succeeded, Reason::Completed),
            row(Some(Succeeded), Pending, Reason::Rerun)
        ]
    );
    assert_eq!(
        condition_is(&d.status, "RerunRequested"),
        pair("False", "RerunStarted")
    );
}

#[test]
fn a_rerun_of_a_canceled_task_waits_for_cancel_to_be_cleared() {
    let mut s = spec();
    s.cancel = true;
    let canceled = at(&s, &admitted(&spec(), t(0)), &[], t(1)).status;
    s.rerun = 1;
    let d = at(&s, &canceled, &[], t(2));
    assert!(d.transitions.is_empty());
    assert_eq!(
        condition_is(&d.status, "RerunRequested"),
        pair("True", "CancelSet")
    );
    s.cancel = false;
    let d = at(&s, &d.status, &[], t(3));
    assert_eq!(path(&d), vec![row(Some(Canceled), Pending, Reason::Rerun)]);
}

#[test]
fn two_rerun_requests_are_two_reruns() {
    let mut s = spec();
    let done = at(&s, &running(&s), &[pod(1, Exited(0))], t(5)).status;
    s.rerun = 2;
    let first = granted(&s, &done, &[pod(1, Exited(0))], t(6)).status;
    assert_eq!(first.observed_rerun, 1);
    let first = at(&s, &first, &[pod(1, Exited(0)), pod(2, Run)], t(7)).status;
    let d = at(&s, &first, &[pod(1, Exited(0)), pod(2, Exited(0))], t(8));
    assert_eq!(d.status.observed_rerun, 2);
    assert_eq!(d.status.phase, Some(Pending));
    let d = at(&s, &d.status, &[pod(1, Exited(0)), pod(2, Exited(0))], t(9));
    assert_eq!(d.status.observed_rerun, 2, "no third");
}

#[test]
fn callbacks_are_sent_until_their_outcome_is_recorded_and_ttl_waits_for_the_pods() {
    let mut s = spec();
    s.callback = Some(CallbackSpec {
        url: "http://cb.example/".into(),
    });
    s.ttl_seconds_after_finished = Some(0);
    let d = at(&s, &running(&s), &[sidecar_left(1, 0)], t(5));
    assert!(
        !d.actions.contains(&Action::SendCallback),
        "the callback reports the final status: once the pod stopped"
    );
    assert!(
        !d.actions.contains(&Action::DeleteTask),
        "the pod still stops"
    );
    let d = at(&s, &d.status, &[], t(6));
    assert!(d.actions.contains(&Action::SendCallback));
    let d = decide_with(&s, &d.status, &[], t(6), |i| {
        i.callback = Some((CallbackResult::Delivered, "POST answered 200"))
    });
    assert!(!d.actions.contains(&Action::SendCallback));
    assert!(d.actions.contains(&Action::DeleteTask));
    assert_eq!(
        condition_is(&d.status, "CallbackDelivered"),
        pair("True", "Delivered")
    );
    let refused = callback_outcome(&d.status, CallbackResult::Refused, "loopback", t(7));
    assert_eq!(
        condition_is(&refused, "CallbackDelivered"),
        pair("False", "CallbackRefused")
    );
}

#[test]
fn what_holds_a_waiting_task_is_the_queues_word_and_is_kept_between_reconciles() {
    let s = spec();
    let st = admitted(&s, t(0));
    let d = decide_with(&s, &st, &[], t(1), |i| {
        i.held = Some((
            HeldReason::CircuitOpen,
            "the circuit of type report is open",
        ))
    });
    assert_eq!(
        condition_is(&d.status, "Queued"),
        pair("True", "CircuitOpen")
    );
    assert_eq!(
        condition_is(&d.status, "CircuitOpen"),
        pair("True", "CircuitOpen")
    );
    let kept = at(&s, &d.status, &[], t(2));
    assert_eq!(
        condition_is(&kept.status, "Queued"),
        pair("True", "CircuitOpen")
    );
    let released = decide_with(&s, &d.status, &[], t(3), |i| {
        i.held = Some((HeldReason::Waiting, "its turn"))
    });
    assert_eq!(
        condition_is(&released.status, "CircuitOpen"),
        pair("False", "NotHeld")
    );
}

#[test]
fn history_is_capped_and_counts_what_it_drops() {
    let s = spec();
    let mut st = running(&s);
    st.history = (0..HISTORY_CAP)
        .map(|i| st.history[i % st.history.len()].clone())
        .collect();
    let d = at(&s, &st, &[pod(1, Exited(0))], t(5));
    assert_eq!(d.status.history.len(), HISTORY_CAP);
    assert_eq!(d.status.history_dropped, 1);
    assert_eq!(d.status.history.last().unwrap().to, Succeeded);
}

#[test]
fn attempts_are_capped_oldest_first() {
    let mut s = spec();
    s.retry.max_infrastructure_retries = 100;
    s.retry.backoff.base_seconds = 0;
    s.retry.backoff.jitter_millis = 0;
    let mut st = AxTaskStatus::default();
    let mut pods = Vec::new();
    for n in 1..=(crate::api::ATTEMPTS_CAP as i32 + 3) {
        st = granted(&s, &st, &pods, t(i64::from(n))).status;
        pods.push(pod(n, Evicted));
        st = at(&s, &st, &pods, t(i64::from(n))).status;
    }
    assert_eq!(st.attempts.len(), crate::api::ATTEMPTS_CAP);
    assert_eq!(st.attempts.first().unwrap().attempt, 4);
}

#[test]
fn every_legal_pair_is_a_row_of_designs_table() {
    for (from, to) in LEGAL {
        assert!(from.is_none_or(|f| f != *to), "{from:?} -> {to:?}");
        if from.is_some_and(TaskPhase::is_terminal) {
            assert_eq!(*to, Pending, "only a re-run leaves a terminal phase");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn arb_phase() -> impl Strategy<Value = TaskPhase> {
    proptest::sample::select(vec![
        Pending, Scheduled, Running, Succeeded, Failed, TimedOut, Dead, Canceled,
    ])
}

fn arb_spec() -> impl Strategy<Value = AxTaskSpec> {
    (
        (
            0i32..3,
            0i32..3,
            0i64..4,
            0i64..800,
            prop::option::of(1i64..200),
        ),
        (
            prop::option::of(1i64..100),
            1i64..300,
            prop::option::of(-50i64..200),
        ),
        (
            prop::bool::weighted(0.15),
            0i64..3,
            any::<bool>(),
            any::<bool>(),
            prop::option::of(0i64..100),
            prop::bool::weighted(0.15),
        ),
        prop::collection::vec(
            (
                prop_oneof![Just(ExitCodeOperator::In), Just(ExitCodeOperator::NotIn)],
                prop::collection::vec(1i64..5, 1..3),
                prop_oneof![
                    Just(RuleAction::Retry),
                    Just(RuleAction::Dead),
                    Just(RuleAction::Ignore)
                ],
            )
                .prop_map(|(o, v, a)| rule(o, &v, a)),
            0..2,
        ),
    )
        .prop_map(
            |(
                (max, max_infra, base, jitter, budget),
                (soft, hard, start),
                (cancel, rerun, policy, callback, ttl, suspend),
                rules,
            )| {
                let mut s = spec();
                s.retry.max_retries = max;
                s.retry.max_infrastructure_retries = max_infra;
                s.retry.backoff = BackoffSpec {
                    base_seconds: base,
                    factor: 2.0,
                    max_seconds: 60,
                    jitter_millis: jitter,
                };
                s.retry.budget_seconds = budget;
                s.retry.rules = rules;
                s.retry.pod_replacement_policy = if policy {
                    PodReplacementPolicy::TerminatingOrFailed
                } else {
                    PodReplacementPolicy::Failed
                };
                s.timeout = TimeoutSpec {
                    soft_seconds: soft,
                    hard_seconds: hard,
                };
                s.start_after = start.map(|o| Time(t(o)));
                s.cancel = cancel;
                s.suspend = suspend;
                s.rerun = rerun;
                s.callback = callback.then(|| CallbackSpec {
                    url: "http://cb.example/".into(),
                });
                s.ttl_seconds_after_finished = ttl;
                s
            },
        )
}

fn arb_pod(attempt: i32) -> impl Strategy<Value = WorkerState> {
    (
        proptest::sample::select(vec![
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
            PodPhase::Unknown,
        ]),
        proptest::sample::select(vec![
            MainContainer::Unknown,
            MainContainer::Waiting,
            MainContainer::Running { ready: true },
            MainContainer::Running { ready: false },
            MainContainer::Terminated,
        ]),
        prop::option::of(prop_oneof![Just(0), 1i32..4, Just(137)]),
        (
            prop::bool::weighted(0.3),
            prop::option::of(0i64..40),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            prop::option::weighted(0.1, Just(("ErrImagePull".to_string(), String::new()))),
            prop::option::weighted(0.1, Just(("Evicted".to_string(), String::new()))),
            prop::option::of(any::<bool>()),
            0i32..2,
            prop::bool::weighted(0.1),
        ),
    )
        .prop_map(
            move |(
                phase,
                main,
                exit,
                (deleting, grace, finalizer, scheduled),
                (stuck, disrupted, node_ready, restarts, expected),
            )| {
                if expected {
                    return crate::core::worker::expected(&pod_name(TASK, attempt), attempt, t(0));
                }
                WorkerState {
                    name: pod_name(TASK, attempt),
                    uid: Some(format!("uid-{attempt}")),
                    attempt,
                    phase,
                    deleting,
                    deletion_grace_seconds: grace.filter(|_| deleting),
                    deletion_due: deleting.then(|| t(grace.unwrap_or(30))),
                    outcome_finalizer: finalizer,
                    finalizers: if finalizer {
                        vec![crate::core::worker::OUTCOME_FINALIZER.into()]
                    } else {
                        Vec::new()
                    },
                    node: scheduled.then(|| "node-a".to_string()),
                    node_ready,
                    node_gone: false,
                    main,
                    restarts,
                    exit: exit.map(|exit_code| ContainerExit {
                        exit_code,
                        reason: "Error".into(),
                        message: String::new(),
                    }),
                    stuck_reason: stuck,
                    disrupted,
                    created_at: Some(t(0)),
                    // A container that ran says when it started.
                    started_at: matches!(
                        main,
                        MainContainer::Running { .. } | MainContainer::Terminated
                    )
                    .then(|| t(1)),
                }
            },
        )
}

/// Any status, reachable or not, with pods for some of its attempts.
fn arb_task() -> impl Strategy<Value = (AxTaskSpec, AxTaskStatus, Vec<WorkerState>)> {
    (
        arb_spec(),
        prop::option::of(arb_phase()),
        0i32..4,
        0i32..4,
        0i64..3,
        prop::option::of(-700i64..400),
        prop::option::of(-100i64..400),
        prop::option::of(-100i64..400),
    )
        .prop_flat_map(
            |(spec, phase, attempt, retries, observed_rerun, scheduled_at, next, budget)| {
                let attempt = if phase.is_some_and(TaskPhase::has_worker) {
                    attempt.max(1)
                } else {
                    attempt
                };
                // Sometimes also a pod of the next attempt: created beside a dispatch's status
                // write that did not land.
                let pods = (
                    prop::collection::vec(
                        prop::option::weighted(0.7, arb_pod(0)),
                        attempt as usize,
                    ),
                    prop::option::weighted(0.15, arb_pod(0)),
                )
                    .prop_map(move |(mut pods, next)| {
                        pods.push(next);
                        pods.into_iter()
                            .enumerate()
                            .filter_map(|(i, p)| {
                                p.map(|mut p| {
                                    let n = i as i32 + 1;
                                    p.attempt = n;
                                    p.name = pod_name(TASK, n);
                                    if p.uid.is_some() {
                                        p.uid = Some(format!("uid-{n}"));
                                    }
                                    p
                                })
                            })
                            .collect::<Vec<_>>()
                    });
                let status = AxTaskStatus {
                    phase,
                    attempt,
                    retries,
                    worker: (attempt > 0).then(|| pod_name(TASK, attempt)),
                    queued_at: Some(t(-100)),
                    scheduled_at: scheduled_at.map(t),
                    started_at: scheduled_at.map(t),
                    next_attempt_at: next
                        .map(t)
                        .filter(|_| !phase.is_some_and(TaskPhase::is_terminal)),
                    budget_deadline: budget.map(t),
                    finished_at: phase.filter(|p| p.is_terminal()).map(|_| t(-50)),
                    observed_rerun,
                    last_failure: matches!(phase, Some(Failed | TimedOut)).then(|| Failure {
                        attempt,
                        kind: FailureKind::Timeout,
                        exit_code: None,
                        reason: "HardTimeout".into(),
                        message: String::new(),
                    }),
                    ..AxTaskStatus::default()
                };
                (Just(spec), Just(status), pods)
            },
        )
}

/// Invariants every decision keeps, whatever it started from.
fn check(
    spec: &AxTaskSpec,
    old: &AxTaskStatus,
    pods: &[WorkerState],
    d: &Decision,
    now: Timestamp,
) -> Result<(), TestCaseError> {
    let new = &d.status;
    // Every transition is a legal row, chained, in time order up to `now` (a dispatch or a start
    // may be dated by its pod, before this look).
    let mut from = old.phase;
    let mut last = old.history.last().map(|h| h.time);
    for e in &d.transitions {
        prop_assert!(is_legal(e.from, e.to), "illegal {:?} -> {:?}", e.from, e.to);
        prop_assert_eq!(e.from, from);
        prop_assert!(e.time <= now, "{} after {now}", e.time);
        if let Some(last) = last {
            prop_assert!(e.time >= last.min(now), "{} before {last}", e.time);
        }
        last = Some(e.time);
        if e.from.is_some_and(TaskPhase::is_terminal) {
            prop_assert_eq!(e.reason.as_str(), "Rerun");
        }
        from = Some(e.to);
    }
    prop_assert_eq!(new.phase, from);
    // History: append-only and capped.
    let all: Vec<_> = old.history.iter().chain(&d.transitions).cloned().collect();
    let kept = all.len().min(HISTORY_CAP);
    prop_assert_eq!(&new.history[..], &all[all.len() - kept..]);
    // The fence: no attempt starts while a pod of an earlier attempt may run, and no Dead verdict.
    let policy = spec.retry.pod_replacement_policy;
    let blocking_before = |attempt: i32| {
        pods.iter()
            .any(|p| p.attempt < attempt && blocks(p, policy))
    };
    for e in &d.transitions {
        if e.to == Scheduled {
            prop_assert!(
                !blocking_before(e.attempt),
                "attempt {} started beside a live pod: {:?}",
                e.attempt,
                pods
            );
        }
        if e.to == Dead && e.from.is_some() {
            prop_assert!(
                !pods.iter().any(|p| blocks(p, policy)),
                "Dead beside a live pod: {:?}",
                pods
            );
        }
    }
    prop_assert!(new.attempt >= old.attempt && new.attempt <= old.attempt + 1);
    if new.attempt == old.attempt + 1 {
        // A new attempt uses the slot granted, or takes up the pod its dispatch created.
        prop_assert!(d.dispatched || next_attempt_pod(old, pods).is_some());
        if next_attempt_pod(old, pods).is_some() {
            prop_assert!(!d.actions.contains(&Action::CreatePod));
        }
    } else {
        prop_assert!(!d.dispatched);
    }
    // Kills: only pods that should not run, that may still run, and that we have seen.
    for a in &d.actions {
        match a {
            Action::KillPod { name, uid, .. } => {
                let p = pods.iter().find(|p| &p.name == name).expect("a known pod");
                prop_assert_eq!(p.uid.as_ref(), Some(uid));
                prop_assert!(!should_run(p, new));
                prop_assert!(p.is_running_phase());
            }
            Action::CreatePod => {
                prop_assert_eq!(new.phase, Some(Scheduled));
                prop_assert!(current_pod(new, pods).is_none());
            }
            Action::RemoveFinalizer { name, .. } => {
                prop_assert!(pods.iter().any(|p| &p.name == name && p.outcome_finalizer));
            }
            // Only an ended pod of a task whose success is recorded.
            Action::RemovePod { name, uid } => {
                let p = pods.iter().find(|p| &p.name == name).expect("a known pod");
                prop_assert_eq!(p.uid.as_ref(), Some(uid));
                prop_assert!(!p.is_running_phase());
                prop_assert_eq!(new.phase, Some(Succeeded));
            }
            Action::SendCallback | Action::DeleteTask => {
                prop_assert!(new.phase.is_some_and(TaskPhase::is_terminal))
            }
            Action::CreateExitHandler => {
                prop_assert!(new.phase.is_some_and(TaskPhase::is_terminal));
                prop_assert!(spec.on_exit.is_some());
            }
            Action::Warn { reason, .. } => prop_assert!(
                new.phase.is_some_and(TaskPhase::has_worker)
                    || (*reason == Reason::OnExitFailed
                        && new.phase.is_some_and(TaskPhase::is_terminal))
            ),
        }
    }
    // Where the task stands with its queue follows from its phase and pods.
    let fenced = !fence(spec, new, pods).is_empty();
    match new.phase {
        Some(p) if p.has_worker() || matches!(p, Failed | TimedOut) => {
            prop_assert_eq!(d.queue, QueueState::Holding)
        }
        Some(p) if p.is_terminal() => prop_assert_eq!(
            d.queue,
            if fenced {
                QueueState::Holding
            } else {
                QueueState::Done
            }
        ),
        _ => {}
    }
    if matches!(new.phase, Some(Failed | TimedOut)) {
        prop_assert!(
            fenced || current_pod(new, pods).is_some_and(observe::main_exited_zero),
            "stopped in {:?} without a pod to wait for",
            new.phase
        );
    }
    let ready = new.condition("Ready").expect("Ready");
    prop_assert_eq!(ready.status == "True", new.phase == Some(Succeeded));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn every_decision_is_legal_and_respects_the_fence(
        (spec, status, pods) in arb_task(),
        now in -100i64..1500,
        grant in any::<bool>(),
        unit_random in 0.0f64..1.0,
    ) {
        let now = t(now);
        let error = validate(&spec).err().map(|e| e.to_string());
        let mut inputs = Inputs::new(TASK, &spec, &status, &pods);
        inputs.spec_error = error.as_deref();
        inputs.granted = grant;
        let d = decide(&inputs, &Clock { now, operator: OP, unit_random });
        check(&spec, &status, &pods, &d, now)?;
        // Deciding again on the result with the same pods and time moves nothing that is done.
        if d.status.phase.is_some_and(TaskPhase::is_terminal) && !observe::rerun_requested(&spec, &d.status) {
            let again_inputs = Inputs { status: &d.status, ..inputs };
            let again = decide(&again_inputs, &Clock { now, operator: OP, unit_random });
            prop_assert!(again.transitions.is_empty());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A simulated world: never two live workers
// ---------------------------------------------------------------------------------------------

/// What the world does between two decisions.
#[derive(Clone, Debug)]
enum World {
    /// Time passes (seconds).
    Wait(i64),
    /// The oldest pod still Pending starts running.
    Start,
    /// A running pod's main container exits with this code.
    Exit(i32),
    /// A pod being deleted finishes stopping: with exit 0 or killed, staying until its finalizers
    /// are gone.
    Stopped(bool),
    /// Deleted pods without finalizers vanish.
    Vanish,
    /// The API server drops a kill (the delete never happens).
    DropKills,
    /// The user sets cancel.
    Cancel,
    /// The user sets or clears suspend.
    Suspend(bool),
    /// The task's queue starts or stops draining (`stopPolicy: HoldAndDrain`).
    Drain(bool),
    /// The task's queue chooses, or stops choosing, its running attempt to preempt.
    Preempt(bool),
    /// The next decision's status write does not land (a conflict, the operator stops); the pod it
    /// created beside the write does.
    LoseWrite,
    /// The next decision's status, if it records only progress, waits behind other progress
    /// writes (the controller's pacing) and is not written in this step.
    PaceProgress,
}

fn arb_world() -> impl Strategy<Value = World> {
    prop_oneof![
        3 => (1i64..400).prop_map(World::Wait),
        3 => Just(World::Start),
        2 => prop_oneof![Just(0), Just(1), Just(42)].prop_map(World::Exit),
        2 => any::<bool>().prop_map(World::Stopped),
        2 => Just(World::Vanish),
        1 => Just(World::DropKills),
        1 => Just(World::Cancel),
        1 => any::<bool>().prop_map(World::Suspend),
        1 => any::<bool>().prop_map(World::Drain),
        1 => any::<bool>().prop_map(World::Preempt),
        2 => Just(World::LoseWrite),
        2 => Just(World::PaceProgress),
    ]
}

fn apply_actions(
    d: &Decision,
    pods: &mut Vec<WorkerState>,
    status: &AxTaskStatus,
    drop_kills: bool,
) {
    for a in &d.actions {
        match a {
            Action::CreatePod => {
                let mut p = with_finalizer(pod(status.attempt, Waiting));
                p.phase = PodPhase::Pending;
                p.main = MainContainer::Waiting;
                p.created_at = status.scheduled_at;
                pods.push(p);
            }
            Action::KillPod {
                name,
                grace_seconds,
                keep_outcome,
                ..
            } if !drop_kills => {
                if let Some(p) = pods.iter_mut().find(|p| &p.name == name) {
                    if *keep_outcome {
                        p.outcome_finalizer = true;
                    }
                    p.deleting = true;
                    p.deletion_grace_seconds = Some(grace_seconds.unwrap_or(30));
                }
            }
            Action::RemoveFinalizer { name, .. } => {
                if let Some(p) = pods.iter_mut().find(|p| &p.name == name) {
                    p.outcome_finalizer = false;
                }
            }
            // Terminal, its finalizer off: gone at once.
            Action::RemovePod { name, .. } if !drop_kills => pods.retain(|p| &p.name != name),
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn in_any_world_at_most_one_pod_of_a_task_may_run_and_dead_means_nothing_runs(
        max_retries in 0i32..3,
        hard in 5i64..100,
        write_delay in prop_oneof![Just(0u64), 1u64..40],
        steps in prop::collection::vec(arb_world(), 1..60),
    ) {
        let mut spec = spec();
        spec.retry.max_retries = max_retries;
        spec.retry.max_infrastructure_retries = 2;
        spec.retry.backoff.jitter_millis = 0;
        spec.timeout.hard_seconds = hard;
        let mut status = AxTaskStatus::default();
        let mut pods: Vec<WorkerState> = Vec::new();
        let mut now = 0i64;
        let mut drop_kills = false;
        let mut draining = false;
        let mut preempted = false;
        for step in steps {
            let mut lose_write = false;
            let mut pace = false;
            match step {
                World::Wait(s) => now += s,
                World::Start => {
                    if let Some(p) = pods.iter_mut().find(|p| p.phase == PodPhase::Pending && !p.deleting) {
                        p.phase = PodPhase::Running;
                        p.main = MainContainer::Running { ready: true };
                        p.started_at = Some(t(now));
                    }
                }
                World::Exit(code) => {
                    if let Some(p) = pods.iter_mut().find(|p| p.phase == PodPhase::Running) {
                        p.phase = if code == 0 { PodPhase::Succeeded } else { PodPhase::Failed };
                        p.main = MainContainer::Terminated;
                        p.exit = Some(ContainerExit { exit_code: code, reason: String::new(), message: String::new() });
                    }
                }
                World::Stopped(zero) => {
                    if let Some(p) = pods.iter_mut().find(|p| p.deleting && p.is_running_phase()) {
                        let code = if zero { 0 } else { 137 };
                        p.phase = if zero { PodPhase::Succeeded } else { PodPhase::Failed };
                        p.main = MainContainer::Terminated;
                        p.exit = Some(ContainerExit { exit_code: code, reason: String::new(), message: String::new() });
                    }
                }
                World::Vanish => pods.retain(|p| !(p.deleting && !p.outcome_finalizer && !p.is_running_phase())),
                World::DropKills => drop_kills = !drop_kills,
                World::Cancel => spec.cancel = true,
                World::Suspend(on) => spec.suspend = on,
                World::Drain(on) => draining = on,
                World::Preempt(on) => preempted = on,
                World::LoseWrite => lose_write = true,
                World::PaceProgress => pace = true,
            }
            let mut inputs = Inputs::new(TASK, &spec, &status, &pods);
            inputs.granted = !draining;
            inputs.draining = draining;
            inputs.preempted = preempted;
            inputs.progress_write_delay = Duration::from_secs(write_delay);
            let d = decide(&inputs, &clock(t(now)));
            for e in &d.transitions {
                prop_assert!(is_legal(e.from, e.to));
            }
            if let Some(by) = d.write_by {
                // Put off: nothing but the current pod's create happens before it is written.
                prop_assert!(by > t(now));
                prop_assert!(d.actions.iter().all(|a| *a == Action::CreatePod), "{:?}", d.actions);
                prop_assert!(matches!(d.status.phase, Some(Scheduled | Running)));
                prop_assert!(d.requeue_after.is_some_and(|r| r <= Duration::try_from(by.duration_since(t(now))).unwrap()));
            }
            if d.progress_only {
                // Progress only: nothing but the current pod's create is to be done.
                prop_assert!(d.actions.iter().all(|a| *a == Action::CreatePod), "{:?}", d.actions);
            }
            let paced = pace && d.progress_only;
            if lose_write || paced || d.write_by.is_some() {
                // Only the pod created beside (or before) the write happens; the status stays as
                // it was.
                if d.actions.contains(&Action::CreatePod) {
                    let mut p = pod(d.status.attempt, Waiting);
                    p.phase = PodPhase::Pending;
                    p.created_at = Some(t(now));
                    pods.push(p);
                }
            } else {
                apply_actions(&d, &mut pods, &d.status, drop_kills);
                status = d.status;
            }
            // Never two pods that may run a worker.
            let live = pods.iter().filter(|p| p.is_running_phase() || p.deleting).count();
            prop_assert!(live <= 1, "{} live pods: {:#?}\n{:#?}", live, pods, status.history);
            if status.phase == Some(Dead) {
                prop_assert!(!pods.iter().any(|p| p.is_running_phase() || p.deleting), "Dead with a live pod");
            }
        }
    }
}

#[test]
fn reasons_in_history_parse_back() {
    let s = spec();
    let d = at(&s, &running(&s), &[pod(1, Exited(3))], t(10));
    for e in &d.status.history {
        assert!(
            Reason::ALL.iter().any(|r| r.as_str() == e.reason),
            "{}",
            e.reason
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Progress whose write waits (Decision::write_by)
// ---------------------------------------------------------------------------------------------

const DELAY: Duration = Duration::from_secs(2);

/// A decision with a progress write delay, from `status` as decided (maybe not written).
fn lazily(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    written: Option<&AxTaskStatus>,
    pods: &[WorkerState],
    now: Timestamp,
    grant: bool,
) -> Decision {
    decide_with(spec, status, pods, now, |i| {
        i.granted = grant;
        i.progress_write_delay = DELAY;
        i.written = written.map(|w| &*Box::leak(Box::new(w.clone())));
    })
}

fn ran(mut w: WorkerState, created: Timestamp, started: Timestamp) -> WorkerState {
    w.created_at = Some(created);
    w.started_at = Some(started);
    w
}

#[test]
fn a_dispatch_creates_its_pod_and_puts_its_status_off_until_the_delay() {
    let s = spec();
    let new = AxTaskStatus::default();
    let d = lazily(&s, &new, None, &[], t(0), true);
    assert_eq!(d.status.phase, Some(Scheduled));
    assert!(d.dispatched);
    assert_eq!(d.actions, vec![Action::CreatePod]);
    assert_eq!(d.write_by, Some(t(2)));
    assert!(d.progress_only);
    assert!(d.requeue_after.is_some_and(|r| r <= DELAY));
    // Without a delay it is written at once, never paced.
    let d = granted(&s, &new, &[], t(0));
    assert_eq!(d.write_by, None);
    assert!(!d.progress_only);
}

#[test]
fn an_attempt_that_ends_within_the_delay_is_written_once_with_its_whole_path() {
    let s = spec();
    let new = AxTaskStatus::default();
    let dispatch = lazily(&s, &new, None, &[], t(0), true);
    // The worker ran from t(1) and exited 0; the status decided at the dispatch was not written.
    let done = ran(pod(1, Exited(0)), t(0), t(1));
    let d = lazily(&s, &dispatch.status, Some(&new), &[done], t(1), false);
    assert_eq!(d.write_by, None);
    assert_eq!(
        d.transitions
            .iter()
            .map(|e| (e.from, e.to, e.time))
            .collect::<Vec<_>>(),
        vec![
            (None, Pending, t(0)),
            (Some(Pending), Scheduled, t(0)),
            (Some(Scheduled), Running, t(1)),
            (Some(Running), Succeeded, t(1)),
        ]
    );
    assert_eq!(d.status.started_at, Some(t(1)));
    assert_eq!(d.status.node.as_deref(), Some("node-a"));
}

#[test]
fn a_worker_still_running_when_the_delay_ends_is_written_running() {
    let s = spec();
    let new = AxTaskStatus::default();
    let dispatch = lazily(&s, &new, None, &[], t(0), true);
    let mut running = ran(pod(1, Run), t(0), t(1));
    running.created_at = Some(t(0));
    // Started within the delay: still put off, until the dispatch's delay ends.
    let d = lazily(
        &s,
        &dispatch.status,
        Some(&new),
        &[running.clone()],
        t(1),
        false,
    );
    assert_eq!(d.status.phase, Some(Running));
    assert_eq!(d.write_by, Some(t(2)));
    assert!(d.actions.is_empty());
    // At the end of the delay: due (the controller may still pace it behind other progress), with
    // the dispatch and the start at their own times.
    let d = lazily(&s, &d.status, Some(&new), &[running], t(2), false);
    assert_eq!(d.write_by, None);
    assert!(d.progress_only);
    assert_eq!(
        d.transitions
            .iter()
            .map(|e| (e.to, e.time))
            .collect::<Vec<_>>(),
        vec![(Pending, t(0)), (Scheduled, t(0)), (Running, t(1))]
    );
}

#[test]
fn a_failure_or_a_cancel_within_the_delay_is_written_at_once() {
    let s = spec();
    let new = AxTaskStatus::default();
    let dispatch = lazily(&s, &new, None, &[], t(0), true);
    let failed = ran(pod(1, Exited(3)), t(0), t(1));
    let d = lazily(&s, &dispatch.status, Some(&new), &[failed], t(1), false);
    assert_eq!(d.write_by, None);
    assert!(!d.progress_only);
    assert!(d.transitions.iter().any(|e| e.to == Failed));

    let mut canceled = s.clone();
    canceled.cancel = true;
    let running = ran(pod(1, Run), t(0), t(1));
    let d = lazily(
        &canceled,
        &dispatch.status,
        Some(&new),
        &[running],
        t(1),
        false,
    );
    assert_eq!(d.write_by, None);
    assert!(!d.progress_only);
    assert_eq!(d.status.phase, Some(Canceled));
    assert!(
        d.actions
            .iter()
            .any(|a| matches!(a, Action::KillPod { .. }))
    );
}

#[test]
fn after_a_restart_the_unwritten_dispatch_is_taken_up_from_its_pod_at_the_pods_time() {
    let s = spec();
    // The operator that dispatched at t(0) is gone; the status still says Pending since t(0).
    let pending = admitted(&s, t(0));
    let running = ran(pod(1, Run), t(0), t(1));
    let d = lazily(&s, &pending, None, &[running], t(5), false);
    assert_eq!(d.status.attempt, 1);
    assert_eq!(d.status.scheduled_at, Some(t(0)));
    assert_eq!(d.status.started_at, Some(t(1)));
    // Its delay ended long ago: written now.
    assert_eq!(d.write_by, None);
    assert_eq!(d.actions, Vec::new());
}

#[test]
fn a_worker_first_seen_finished_was_running_before() {
    let s = spec();
    let done = ran(pod(1, Exited(0)), t(0), t(3));
    let d = at(&s, &scheduled(&s), &[done], t(9));
    assert_eq!(
        d.transitions
            .iter()
            .map(|e| (e.to, e.time))
            .collect::<Vec<_>>(),
        vec![(Running, t(3)), (Succeeded, t(9))]
    );
    // A pod that never started goes from Scheduled straight to its outcome.
    let d = at(&s, &scheduled(&s), &[pod(1, Exited(0))], t(9));
    assert_eq!(path(&d).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Settled tasks: what the cache keeps of a waiting or finished task (Settled)
// ---------------------------------------------------------------------------------------------

fn arb_held() -> impl Strategy<Value = Option<(HeldReason, String)>> {
    let reasons = proptest::sample::select(vec![
        HeldReason::ConcurrencyLimit,
        HeldReason::Waiting,
        HeldReason::TypeConcurrencyLimit,
        HeldReason::QueueNotFound,
        HeldReason::CircuitOpen,
    ]);
    let messages = proptest::sample::select(vec![
        "the concurrency of AxQueue q is in use".to_string(),
        "the concurrency of AxQueue q is in use; position 3 of 9 in the Normal bucket at 2030-03-17T17:46:40Z, estimated start 2030-03-17T17:50:00Z (1.0 dispatches/min)".to_string(),
        "the concurrency of AxQueue q is in use; position 2 of 8 in the Normal bucket at 2030-03-17T17:46:50Z, estimated start 2030-03-17T17:50:05Z (1.0 dispatches/min)".to_string(),
        "waiting for dispatch".to_string(),
    ]);
    prop::option::weighted(0.8, (reasons, messages))
}

/// A task as decisions leave it: admitted (held or delayed, maybe later held), or run to an end
/// (its pod stopped), with the pods it has then and what held it last.
type SettledCase = (
    AxTaskSpec,
    AxTaskStatus,
    Vec<WorkerState>,
    Option<(HeldReason, String)>,
);

fn arb_settled_task() -> impl Strategy<Value = SettledCase> {
    (
        arb_spec(),
        arb_held(),
        arb_held(),
        0u8..5,
        0i64..900,
        prop::bool::weighted(0.8),
    )
        .prop_map(|(mut spec, first, later, path, later_at, no_rerun)| {
            if no_rerun {
                spec.rerun = 0;
            }
            let held = |h: &Option<(HeldReason, String)>| h.as_ref().map(|(r, m)| (*r, m.clone()));
            let decide_held = |spec: &AxTaskSpec,
                               status: &AxTaskStatus,
                               pods: &[WorkerState],
                               h: Option<(HeldReason, String)>,
                               now: Timestamp| {
                let message = h.as_ref().map(|(_, m)| m.clone()).unwrap_or_default();
                let reason = h.map(|(r, _)| r);
                decide_with(spec, status, pods, now, |i| {
                    i.held = reason.map(|r| (r, &*Box::leak(message.into_boxed_str())));
                })
                .status
            };
            if path < 2 || validate(&spec).is_err() {
                spec.cancel = false;
                let admitted =
                    decide_held(&spec, &AxTaskStatus::default(), &[], held(&first), t(0));
                let (status, last) = if path == 1 {
                    let status = decide_held(&spec, &admitted, &[], held(&later), t(later_at));
                    (status, later)
                } else {
                    (admitted, first)
                };
                return (spec, status, Vec::new(), last);
            }
            // Dispatched at t(0), ran, ended: exit 0, exit 3 (retried or Dead), or canceled.
            spec.start_after = None;
            let code = if path == 2 { 0 } else { 3 };
            spec.cancel = false;
            spec.suspend = false;
            spec.retry.max_retries = 0;
            let mut status = scheduled(&spec);
            spec.cancel = path == 4;
            let mut pods = vec![pod(1, Run)];
            for step in 0..6 {
                if step == 1 && !spec.cancel {
                    pods = vec![pod(1, Exited(code))];
                }
                if step == 2 {
                    // Whatever was killed has stopped.
                    for p in &mut pods {
                        p.deleting = false;
                        p.outcome_finalizer = false;
                        if p.is_running_phase() {
                            p.phase = PodPhase::Failed;
                            p.main = MainContainer::Terminated;
                        }
                    }
                }
                status = at(&spec, &status, &pods, t(10 + step)).status;
            }
            if spec.callback.is_some() {
                status = callback_outcome(&status, CallbackResult::Delivered, "200", t(20));
            }
            (spec, status, pods, None)
        })
}

fn task_of(spec: &AxTaskSpec, status: &AxTaskStatus) -> crate::api::AxTask {
    let mut task = crate::api::AxTask::new(TASK, spec.clone());
    task.metadata.generation = Some(1);
    task.status = Some(status.clone());
    task
}

/// [`task_of`], as item 7 of DAG `orders`'s `forEach` task `map`.
fn item_of(spec: &AxTaskSpec, status: &AxTaskStatus) -> crate::api::AxTask {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let mut task = task_of(spec, status);
    task.metadata.labels = Some(
        [
            (crate::api::LABEL_DAG, "orders"),
            (crate::api::LABEL_DAG_TASK, "map"),
            (crate::api::LABEL_DAG_ITEM, "7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    task.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "ax.dev/v1alpha1".into(),
        kind: "AxDag".into(),
        name: "orders".into(),
        uid: "dag-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    task
}

#[test]
fn a_succeeded_fan_out_items_ended_pods_go_after_its_status_a_failed_items_stay() {
    let s = spec();
    let item = |d: &mut Inputs| d.fan_out_item = true;
    let kills = |d: &Decision| {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::RemovePod { name, .. } => Some(name.clone()),
                Action::KillPod { name, .. } => Some(format!("kill {name}")),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // The decision that records the success removes the pod: its actions follow the write.
    let done = decide_with(&s, &running(&s), &[pod(1, Exited(0))], t(5), item);
    assert_eq!(done.status.phase, Some(Succeeded));
    assert_eq!(kills(&done), vec![pod(1, Exited(0)).name]);
    // Recorded, with the pod still there (its removal failed, or a restart): removed again; being
    // deleted or gone: nothing more, and the settled facts agree.
    let again = decide_with(&s, &done.status, &[pod(1, Exited(0))], t(6), item);
    assert_eq!(again.status, done.status);
    assert_eq!(kills(&again), vec![pod(1, Exited(0)).name]);
    let mut deleting = pod(1, Exited(0));
    deleting.deleting = true;
    let after = decide_with(&s, &done.status, &[deleting.clone()], t(6), item);
    assert!(after.actions.is_empty(), "{:?}", after.actions);
    let settled = Settled::of(&item_of(&s, &done.status), true).expect("settled");
    assert!(settled.removes_pods);
    assert_eq!(
        settled.idle(Some(1), false, None, None, &[pod(1, Exited(0))], t(6)),
        None
    );
    assert!(
        settled
            .idle(Some(1), false, None, None, &[], t(6))
            .is_some()
    );
    // Not an item, or an item that failed: its pods stay, for their logs.
    assert!(kills(&at(&s, &running(&s), &[pod(1, Exited(0))], t(5))).is_empty());
    assert!(
        !Settled::of(&task_of(&s, &done.status), true)
            .unwrap()
            .removes_pods
    );
    let mut once = s.clone();
    once.retry.max_retries = 0;
    let dead = decide_with(&once, &running(&once), &[pod(1, Exited(1))], t(5), item);
    assert_eq!(dead.status.phase, Some(Dead));
    assert!(kills(&dead).is_empty());
    // While it runs, nothing of this: the worker is not stopped.
    let live = decide_with(&s, &running(&s), &[pod(1, Run)], t(5), item);
    assert!(kills(&live).is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Whenever the cached facts say a look changes nothing, deciding on the whole task agrees:
    /// same status, no action, the same place in the queue and the same time to look again.
    #[test]
    fn an_idle_settled_task_is_one_decide_leaves_as_it_is(
        (spec, status, pods, last_held) in arb_settled_task(),
        extra_pod in prop::option::weighted(0.2, arb_pod(1)),
        now in 0i64..2000,
        granted in prop::bool::weighted(0.2),
        other_held in arb_held(),
        same_held in prop::bool::weighted(0.6),
        spec_changed in prop::bool::weighted(0.1),
        fan_out_item in prop::bool::weighted(0.3),
    ) {
        let held = if same_held { last_held } else { other_held };
        let now = t(now);
        let task = if fan_out_item { item_of(&spec, &status) } else { task_of(&spec, &status) };
        let valid = validate(&spec).is_ok();
        let Some(settled) = Settled::of(&task, valid) else {
            return Ok(());
        };
        let mut pods = pods;
        pods.extend(extra_pod);
        let generation = Some(if spec_changed { 2 } else { 1 });
        let held_ref = held.as_ref().map(|(r, m)| (*r, m.as_str()));
        let Some(idle) = settled.idle(generation, granted, held_ref, None, &pods, now) else {
            return Ok(());
        };
        let mut inputs = Inputs::new(TASK, &spec, &status, &pods);
        inputs.generation = generation;
        inputs.granted = granted;
        inputs.held = held_ref;
        inputs.fan_out_item = fan_out_item;
        let d = decide(&inputs, &clock(now));
        prop_assert_eq!(&d.status, &status);
        prop_assert!(d.actions.is_empty(), "{:?}", d.actions);
        prop_assert_eq!(d.queue, idle.queue);
        let look_again = idle
            .look_again
            .map(|at| Duration::try_from(at.duration_since(now)).unwrap_or_default());
        prop_assert_eq!(d.requeue_after, look_again);
    }
}

#[test]
fn a_backlog_task_and_a_finished_one_are_settled_and_idle() {
    let s = spec();
    let message = "the concurrency of AxQueue default is in use";
    let waiting = decide_with(&s, &AxTaskStatus::default(), &[], t(0), |i| {
        i.held = Some((HeldReason::ConcurrencyLimit, message));
    })
    .status;
    let settled = Settled::of(&task_of(&s, &waiting), true).expect("a waiting task is settled");
    assert_eq!(
        settled.queued,
        QueuedAs::Held(HeldReason::ConcurrencyLimit, message.into())
    );
    let held = Some((HeldReason::ConcurrencyLimit, message));
    let idle = settled.idle(Some(1), false, held, None, &[], t(5));
    assert_eq!(idle.map(|i| i.queue), Some(QueueState::Ready));
    // A slot, another reason, a pod or a spec edit needs the whole task.
    assert_eq!(settled.idle(Some(1), true, held, None, &[], t(5)), None);
    let other = Some((HeldReason::TypeConcurrencyLimit, message));
    assert_eq!(settled.idle(Some(1), false, other, None, &[], t(5)), None);
    assert_eq!(
        settled.idle(Some(1), false, held, None, &[pod(1, Run)], t(5)),
        None
    );
    assert_eq!(settled.idle(Some(2), false, held, None, &[], t(5)), None);

    let done = at(&s, &running(&s), &[pod(1, Exited(0))], t(9)).status;
    assert_eq!(done.phase, Some(Succeeded));
    let settled = Settled::of(&task_of(&s, &done), true).expect("a finished task is settled");
    let idle = settled.idle(Some(1), false, None, None, &[pod(1, Exited(0))], t(50));
    assert_eq!(idle.map(|i| i.queue), Some(QueueState::Done));
    let mut once = s.clone();
    once.retry.max_retries = 0;
    let dead = at(&once, &running(&once), &[pod(1, Exited(1))], t(9)).status;
    assert_eq!(dead.phase, Some(Dead));
    let settled = Settled::of(&task_of(&once, &dead), true).expect("a Dead task is settled");
    let idle = settled.idle(Some(1), false, None, None, &[pod(1, Exited(1))], t(50));
    assert_eq!(idle.map(|i| i.queue), Some(QueueState::Done));
    // A running or retried task is not.
    assert!(Settled::of(&task_of(&s, &running(&s)), true).is_none());
}

#[test]
fn a_key_from_a_label_is_recorded_while_the_task_is_not_finished_and_kept_current() {
    use crate::api::KeySourceSpec;
    use crate::core::queue::key::KeySource;
    let s = spec();
    let by_customer = KeySource::of(&KeySourceSpec {
        label: Some("customer".into()),
        payload: None,
    })
    .unwrap();
    let labels = std::collections::BTreeMap::from([("customer".to_string(), "x".to_string())]);
    let key = by_customer.key_of(Some(&labels), None);
    let message = "the concurrency of AxQueue default is in use";
    let waiting = decide_with(&s, &AxTaskStatus::default(), &[], t(0), |i| {
        i.held = Some((HeldReason::ConcurrencyLimit, message));
        i.queue_key = key.as_ref();
    })
    .status;
    assert_eq!(waiting.queue_key, key, "recorded with the first write");
    let mut task = task_of(&s, &waiting);
    task.metadata.labels = Some(labels.clone());
    let settled = Settled::of(&task, true).expect("settled with its key");
    let held = Some((HeldReason::ConcurrencyLimit, message));
    assert!(
        settled
            .idle(Some(1), false, held, Some(&by_customer), &[], t(5))
            .is_some()
    );
    assert_eq!(settled.pending("ns").key.as_deref(), Some("x"));
    // The queue now takes keys from elsewhere: the whole task is decided on, and records anew.
    let by_team = KeySource::of(&KeySourceSpec {
        label: Some("team".into()),
        payload: None,
    })
    .unwrap();
    for other in [&by_team, &KeySource::Namespace] {
        assert_eq!(
            settled.idle(Some(1), false, held, Some(other), &[], t(5)),
            None
        );
    }
    let namespaced = decide_with(&s, &waiting, &[], t(6), |i| {
        i.held = Some((HeldReason::ConcurrencyLimit, message));
        i.queue_key = None;
    });
    assert_eq!(namespaced.status.queue_key, None);
    // The label edited (no new generation): not settled until a decision records the new key.
    task.metadata.labels = Some(std::collections::BTreeMap::from([(
        "customer".to_string(),
        "y".to_string(),
    )]));
    assert!(Settled::of(&task, true).is_none());
    // A finished task keeps the key it ran under.
    let done = at(&s, &running(&s), &[pod(1, Exited(0))], t(9));
    let mut finished = done.status.clone();
    finished.queue_key = key.clone();
    let later = decide_with(&s, &finished, &[pod(1, Exited(0))], t(20), |i| {
        i.queue_key = None;
    });
    assert_eq!(later.status.queue_key, key);
}

// ---------------------------------------------------------------------------------------------
// Issue 24: the outcome finalizer on every worker, final vs terminal, pods the caches miss
// ---------------------------------------------------------------------------------------------

fn removes_finalizer(d: &Decision, attempt: i32) -> bool {
    d.actions.contains(&Action::RemoveFinalizer {
        name: pod_name(TASK, attempt),
        uid: format!("uid-{attempt}"),
    })
}

#[test]
fn a_finished_worker_deleted_before_it_was_read_keeps_its_outcome_until_it_is_recorded() {
    let s = spec();
    // Pod GC (or a script) deleted the worker that exited 0; the finalizer kept it readable.
    let gone_by_gc = with_finalizer(deleting(pod(1, Exited(0)), 0));
    let d = at(&s, &running(&s), std::slice::from_ref(&gone_by_gc), t(5));
    assert_eq!(d.status.phase, Some(Succeeded), "{:?}", path(&d));
    assert_eq!(d.status.attempt, 1);
    assert!(
        removes_finalizer(&d, 1),
        "released with the status that records it"
    );

    // Not being deleted: the finalizer stays, costing no write; the pod is inert.
    let kept = with_finalizer(pod(1, Exited(0)));
    let d = at(&s, &running(&s), std::slice::from_ref(&kept), t(5));
    assert_eq!(d.status.phase, Some(Succeeded));
    assert!(!removes_finalizer(&d, 1));
    assert!(kept.is_inert());

    // A pod of an earlier attempt, deleted: nothing more to read from it.
    let mut status = running(&s);
    status.attempt = 2;
    let old = with_finalizer(deleting(pod(1, Exited(1)), 30));
    let d = at(&s, &status, &[old], t(5));
    assert!(removes_finalizer(&d, 1));
}

#[test]
fn a_timed_out_worker_whose_node_is_lost_releases_its_finalizer_and_the_retry_goes_on() {
    let s = spec();
    let timed_out = at(&s, &running(&s), &[pod(1, Run)], t(600)).status;
    assert_eq!(timed_out.phase, Some(TimedOut));
    let killed = |grace: i64| {
        let mut w = with_finalizer(deleting(pod(1, Run), grace));
        w.deletion_due = Some(t(600 + grace));
        w
    };

    // Kubernetes 1.20's pod GC force-deletes a deleted node's pod and leaves it "Running".
    let d = at(&s, &timed_out, &[killed(0)], t(650));
    assert!(removes_finalizer(&d, 1), "{:?}", d.actions);
    // Its node gone from the cache, a graceful deletion will never be confirmed either.
    let mut orphan = killed(10);
    orphan.node_gone = true;
    assert!(removes_finalizer(&at(&s, &timed_out, &[orphan], t(612)), 1));

    // A kubelet that only answers slowly: the late success may still come, until a bound.
    let waiting = at(&s, &timed_out, &[killed(10)], t(620));
    assert!(!removes_finalizer(&waiting, 1));
    assert!(
        waiting.requeue_after <= Some(Duration::from_secs(50)),
        "{:?}",
        waiting.requeue_after
    );
    let overdue = at(
        &s,
        &timed_out,
        &[killed(10)],
        t(600 + 10 + OUTCOME_WAIT_PAST_DELETION_SECONDS),
    );
    assert!(removes_finalizer(&overdue, 1));

    // Once the pod is gone the retry is decided.
    let gone = at(&s, &timed_out, &[], t(700));
    assert_eq!(gone.status.phase, Some(Pending));
    assert_eq!(gone.assumes_gone, Some(1), "the API server is asked first");
}

#[test]
fn a_canceled_task_is_final_and_calls_back_only_once_its_worker_is_gone() {
    let mut s = spec();
    s.callback = Some(CallbackSpec {
        url: "http://cb.example/".into(),
    });
    let status = running(&s);
    s.cancel = true;
    let canceled = at(&s, &status, &[with_finalizer(pod(1, Run))], t(5));
    assert_eq!(canceled.status.phase, Some(Canceled));
    assert!(!is_final(&canceled.status), "its worker still runs");
    assert!(!canceled.actions.contains(&Action::SendCallback));

    let stopping = with_finalizer(deleting(pod(1, Run), 30));
    let d = at(&s, &canceled.status, &[stopping], t(10));
    assert!(!is_final(&d.status));
    assert!(!d.actions.contains(&Action::SendCallback));

    let stopped = at(&s, &canceled.status, &[], t(40));
    assert!(is_final(&stopped.status));
    assert!(stopped.actions.contains(&Action::SendCallback));
    assert_eq!(stopped.status.phase, Some(Canceled));
}

#[test]
fn a_pod_of_a_later_attempt_than_the_status_knows_holds_every_decision() {
    let s = spec();
    let status = running(&s);
    let d = at(&s, &status, &[pod(1, Exited(1)), pod(3, Run)], t(5));
    assert!(d.behind);
    assert_eq!(d.status, status, "nothing decided");
    assert!(d.actions.is_empty());
    assert_eq!(d.queue, QueueState::Holding);
    // The next attempt's own pod is not "later": it is taken up.
    let d = at(&s, &status, &[pod(1, Exited(1)), pod(2, Run)], t(5));
    assert!(!d.behind);
}

#[test]
fn a_worker_missing_from_the_caches_is_asked_for_before_it_is_taken_as_gone() {
    let s = spec();
    let d = at(&s, &running(&s), &[], t(5));
    assert_eq!(d.assumes_gone, Some(1));
    // Seen: nothing to ask.
    let d = at(&s, &running(&s), &[pod(1, Run)], t(5));
    assert_eq!(d.assumes_gone, None);
}
