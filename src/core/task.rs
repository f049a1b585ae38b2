//! The AxTask state machine (DESIGN §3) as pure functions: from the task, what was observed of its
//! worker pod and the current time to the new status and the side effects to perform.
//!
//! Every transition appends to `status.history`; the controller publishes one Event per new entry.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::backoff::retry_delay;
use super::queue::Outcome;
use super::worker::{PodPhase, WorkerState, pod_name};
use crate::api::{
    AxTaskSpec, AxTaskStatus, Condition, ExitCodeOperator, Failure, FailureKind, HistoryEntry,
    RetryRule, RuleAction, TaskPhase,
};

/// The status keeps at most this many history entries; older ones are dropped and counted.
pub const HISTORY_CAP: usize = 100;
/// Largest payload handed to a worker (serialized JSON).
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Grace period for a worker killed by a hard timeout.
pub const HARD_TIMEOUT_GRACE_SECONDS: i64 = 10;
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

/// A side effect for the controller to perform after the status is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the worker pod for `status.attempt` (idempotent: the name is deterministic).
    CreatePod,
    DeletePod {
        name: String,
        grace_seconds: Option<i64>,
    },
    /// A Warning Event that is not a transition.
    Warn {
        reason: String,
        message: String,
    },
    SendCallback,
    DeleteTask,
}

/// Where the task stands with the dispatcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueState {
    /// Pending and eligible now: dispatch it.
    Ready,
    /// Pending but not before `nextAttemptAt` (startAfter or backoff).
    Waiting,
    /// An attempt is in flight and holds a concurrency slot.
    Running,
    /// Terminal: holds nothing.
    Done,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: AxTaskStatus,
    /// The history entries this decision appended, oldest first.
    pub transitions: Vec<HistoryEntry>,
    pub actions: Vec<Action>,
    pub queue: QueueState,
    /// Reconcile again after this long at the latest (timeouts, backoff, TTL).
    pub requeue_after: Option<Duration>,
}

impl Decision {
    fn new(status: &AxTaskStatus) -> Self {
        Decision {
            status: status.clone(),
            transitions: Vec::new(),
            actions: Vec::new(),
            queue: QueueState::Done,
            requeue_after: None,
        }
    }

    fn phase(&self) -> Option<TaskPhase> {
        self.status.phase
    }

    fn transition(
        &mut self,
        to: TaskPhase,
        reason: &str,
        message: String,
        actor: &str,
        now: Timestamp,
    ) {
        let entry = HistoryEntry {
            time: now,
            from: self.status.phase,
            to,
            attempt: self.status.attempt,
            reason: reason.to_string(),
            message,
            actor: actor.to_string(),
        };
        self.status.phase = Some(to);
        self.status.reason = Some(reason.to_string());
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

    fn requeue_at(&mut self, at: Timestamp, now: Timestamp) {
        let wait = at.duration_since(now).max(SignedDuration::ZERO);
        let wait = Duration::try_from(wait).unwrap_or_default();
        self.requeue_after = Some(self.requeue_after.map_or(wait, |d| d.min(wait)));
    }
}

/// Semantic checks the OpenAPI schema cannot express. `Err` makes the task Dead with `InvalidSpec`.
pub fn validate(spec: &AxTaskSpec) -> Result<(), String> {
    if let Some(soft) = spec.timeout.soft_seconds
        && soft >= spec.timeout.hard_seconds
    {
        return Err(format!(
            "spec.timeout.softSeconds ({soft}) must be less than spec.timeout.hardSeconds ({})",
            spec.timeout.hard_seconds
        ));
    }
    if let Some(payload) = &spec.payload {
        let len = payload_json(payload).len();
        if len > MAX_PAYLOAD_BYTES {
            return Err(format!(
                "spec.payload is {len} bytes, more than the limit of {MAX_PAYLOAD_BYTES}"
            ));
        }
    }
    let containers = spec
        .template
        .spec
        .as_ref()
        .map_or(0, |s| s.containers.len());
    if containers == 0 {
        return Err("spec.template.spec.containers must name at least one container".into());
    }
    let b = &spec.retry.backoff;
    if !b.factor.is_finite() || b.factor < 1.0 {
        return Err(format!(
            "spec.retry.backoff.factor ({}) must be at least 1",
            b.factor
        ));
    }
    validate_rules(&spec.retry.rules)
}

/// Rules that can never apply as written are a mistake: exit code 0 is success, never a failure, and
/// two `In` rules that list the same code with different actions contradict each other.
fn validate_rules(rules: &[RetryRule]) -> Result<(), String> {
    for (i, rule) in rules.iter().enumerate() {
        let m = &rule.on_exit_codes;
        if m.operator == ExitCodeOperator::In && m.values.contains(&0) {
            return Err(format!(
                "spec.retry.rules[{i}] lists exit code 0, which is success, not a failure"
            ));
        }
        for (j, earlier) in rules[..i].iter().enumerate() {
            let e = &earlier.on_exit_codes;
            if e.operator != ExitCodeOperator::In
                || m.operator != ExitCodeOperator::In
                || earlier.action == rule.action
            {
                continue;
            }
            if let Some(code) = m.values.iter().find(|v| e.values.contains(v)) {
                return Err(format!(
                    "spec.retry.rules[{j}] ({:?}) and spec.retry.rules[{i}] ({:?}) contradict each other on exit code {code}",
                    earlier.action, rule.action
                ));
            }
        }
    }
    Ok(())
}

/// The payload as the worker sees it.
pub fn payload_json(payload: &serde_json::Value) -> String {
    serde_json::to_string(payload).unwrap_or_else(|_| "{}".into())
}

/// Decides what happens to a task now. `worker` is the pod named `status.worker` as found in the
/// cache (`None`: no such pod); `spec_error` is the result of [`validate`].
pub fn reconcile(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    generation: Option<i64>,
    worker: Option<&WorkerState>,
    spec_error: Option<&str>,
    clock: &Clock,
) -> Decision {
    let now = clock.now;
    let mut d = Decision::new(status);
    d.status.observed_generation = generation;

    if d.phase().is_none() {
        admit(spec, spec_error, &mut d, clock);
    }
    match d.phase() {
        None | Some(TaskPhase::Pending) => pending(spec, spec_error, &mut d, clock),
        Some(TaskPhase::Scheduled | TaskPhase::Running) => in_flight(spec, worker, &mut d, clock),
        // Failed and TimedOut are passed through in the same decision that enters them; seeing one
        // here means a write was cut short, so finish the retry decision now.
        Some(TaskPhase::Failed | TaskPhase::TimedOut) => {
            let failure = d.status.last_failure.clone().unwrap_or(Failure {
                attempt: d.status.attempt,
                kind: FailureKind::Retryable,
                exit_code: None,
                reason: "Unknown".into(),
                message: String::new(),
            });
            after_failure(spec, failure, &mut d, clock);
            if d.phase() == Some(TaskPhase::Pending) {
                pending(spec, spec_error, &mut d, clock);
            }
        }
        Some(TaskPhase::Succeeded | TaskPhase::Dead | TaskPhase::Canceled) => {}
    }
    if d.phase().is_some_and(TaskPhase::is_terminal) {
        finished(spec, &mut d, now);
    }
    set_conditions(&mut d.status, now, generation);
    d
}

/// A new task: validate, then queue it (or note that it waits for `startAfter`).
fn admit(spec: &AxTaskSpec, spec_error: Option<&str>, d: &mut Decision, clock: &Clock) {
    let now = clock.now;
    if let Some(err) = spec_error {
        d.status.dead_reason = Some(format!("invalid spec: {err}"));
        d.transition(
            TaskPhase::Dead,
            "InvalidSpec",
            err.to_string(),
            clock.operator,
            now,
        );
        return;
    }
    if spec.cancel {
        d.transition(
            TaskPhase::Canceled,
            "Canceled",
            "canceled before it was queued".into(),
            ACTOR_USER,
            now,
        );
        return;
    }
    match spec.start_after.as_ref().map(|t| t.0).filter(|t| *t > now) {
        Some(start) => {
            d.status.queued_at = Some(start);
            d.status.next_attempt_at = Some(start);
            d.transition(
                TaskPhase::Pending,
                "Delayed",
                format!("queued at startAfter {start}"),
                clock.operator,
                now,
            );
        }
        None => {
            d.status.queued_at = Some(now);
            d.transition(
                TaskPhase::Pending,
                "Queued",
                "queued for dispatch".into(),
                clock.operator,
                now,
            );
        }
    }
}

fn pending(spec: &AxTaskSpec, spec_error: Option<&str>, d: &mut Decision, clock: &Clock) {
    let now = clock.now;
    if spec.cancel {
        d.transition(
            TaskPhase::Canceled,
            "Canceled",
            "canceled while pending".into(),
            ACTOR_USER,
            now,
        );
        return;
    }
    if let Some(err) = spec_error {
        d.status.dead_reason = Some(format!("invalid spec: {err}"));
        d.transition(
            TaskPhase::Dead,
            "InvalidSpec",
            err.to_string(),
            clock.operator,
            now,
        );
        return;
    }
    if d.status.attempt > 0
        && let Some(deadline) = d.status.budget_deadline
        && now >= deadline
    {
        let reason = format!(
            "retry budget of {}s ended at {deadline}",
            spec.retry.budget_seconds.unwrap_or(0)
        );
        d.status.dead_reason = Some(reason.clone());
        d.transition(
            TaskPhase::Dead,
            "BudgetExceeded",
            reason,
            clock.operator,
            now,
        );
        return;
    }
    match d.status.next_attempt_at.filter(|t| *t > now) {
        Some(at) => {
            d.queue = QueueState::Waiting;
            d.requeue_at(at, now);
        }
        None => d.queue = QueueState::Ready,
    }
}

/// Pending → Scheduled: the dispatcher picked the task. The attempt number and worker name are
/// recorded here, before the pod exists, so a crash in between is repaired without a second pod.
/// `None` when the task is not dispatchable (anymore).
pub fn dispatch(
    task_name: &str,
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    clock: &Clock,
) -> Option<Decision> {
    let now = clock.now;
    if status.phase != Some(TaskPhase::Pending)
        || spec.cancel
        || status.next_attempt_at.is_some_and(|t| t > now)
    {
        return None;
    }
    // No new attempt after the budget: reconcile turns such a task Dead.
    if status.attempt > 0
        && status
            .budget_deadline
            .is_some_and(|deadline| now >= deadline)
    {
        return None;
    }
    let mut d = Decision::new(status);
    d.status.attempt += 1;
    let attempt = d.status.attempt;
    let worker = pod_name(task_name, attempt);
    if d.status.budget_deadline.is_none()
        && let Some(budget) = spec.retry.budget_seconds
    {
        d.status.budget_deadline = now.checked_add(SignedDuration::from_secs(budget)).ok();
    }
    d.status.worker = Some(worker.clone());
    d.status.node = None;
    d.status.scheduled_at = Some(now);
    d.status.started_at = None;
    d.status.next_attempt_at = None;
    d.transition(
        TaskPhase::Scheduled,
        "Dispatched",
        format!("attempt {attempt} runs as pod {worker}"),
        clock.operator,
        now,
    );
    d.actions.push(Action::CreatePod);
    d.queue = QueueState::Running;
    hard_deadline_requeue(spec, &mut d, now);
    set_conditions(&mut d.status, now, status.observed_generation);
    Some(d)
}

/// The worker pod could not be created (the API server rejected it): the attempt fails.
/// A task that is no longer Scheduled (canceled meanwhile, say) is left as it is.
pub fn pod_rejected(
    spec: &AxTaskSpec,
    status: &AxTaskStatus,
    message: &str,
    clock: &Clock,
) -> Decision {
    let mut d = Decision::new(status);
    match status.phase {
        Some(TaskPhase::Scheduled) => {}
        Some(TaskPhase::Running) => {
            d.queue = QueueState::Running;
            return d;
        }
        Some(TaskPhase::Pending) | None => {
            d.queue = if status.next_attempt_at.is_some_and(|t| t > clock.now) {
                QueueState::Waiting
            } else {
                QueueState::Ready
            };
            return d;
        }
        Some(_) => return d,
    }
    let failure = Failure {
        attempt: status.attempt,
        kind: FailureKind::NonRetryable,
        exit_code: None,
        reason: "PodRejected".into(),
        message: message.to_string(),
    };
    fail(spec, TaskPhase::Failed, failure, &mut d, clock);
    if d.phase().is_some_and(TaskPhase::is_terminal) {
        finished(spec, &mut d, clock.now);
    }
    set_conditions(&mut d.status, clock.now, status.observed_generation);
    d
}

fn in_flight(spec: &AxTaskSpec, worker: Option<&WorkerState>, d: &mut Decision, clock: &Clock) {
    let now = clock.now;
    if spec.cancel {
        if let Some(name) = d.status.worker.clone() {
            d.actions.push(Action::DeletePod {
                name,
                grace_seconds: None,
            });
        }
        d.transition(
            TaskPhase::Canceled,
            "Canceled",
            "canceled; worker killed".into(),
            ACTOR_USER,
            now,
        );
        return;
    }
    let name = d.status.worker.clone().unwrap_or_default();
    let started = d.status.scheduled_at.unwrap_or(now);
    let hard_at = add_seconds(started, spec.timeout.hard_seconds);
    let Some(w) = worker else {
        if d.phase() == Some(TaskPhase::Scheduled) && now < hard_at {
            // Recorded but not (yet) created, e.g. the operator stopped in between: create it now.
            d.actions.push(Action::CreatePod);
            d.queue = QueueState::Running;
            hard_deadline_requeue(spec, d, now);
        } else if d.phase() == Some(TaskPhase::Scheduled) {
            // The pod never showed up: the hard timeout holds anyway, or the task would re-create it
            // forever. Delete it in case the cache is only behind.
            if let Some(name) = d.status.worker.clone() {
                d.actions.push(Action::DeletePod {
                    name,
                    grace_seconds: Some(HARD_TIMEOUT_GRACE_SECONDS),
                });
            }
            let message = format!(
                "worker pod {name} never appeared within hardSeconds={}",
                spec.timeout.hard_seconds
            );
            let failure = timeout(d, "HardTimeout", message);
            fail(spec, TaskPhase::TimedOut, failure, d, clock);
        } else {
            let failure =
                infrastructure(d, "WorkerDeleted", format!("worker pod {name} disappeared"));
            fail(spec, TaskPhase::Failed, failure, d, clock);
        }
        return;
    };
    if w.phase == PodPhase::Succeeded {
        if let Some(node) = &w.node {
            d.status.node = Some(node.clone());
        }
        let message = format!("worker {name} exited 0");
        d.transition(
            TaskPhase::Succeeded,
            "Completed",
            message,
            ACTOR_WORKER,
            now,
        );
        return;
    }
    if w.phase == PodPhase::Failed || w.stuck_reason.is_some() {
        if w.phase != PodPhase::Failed {
            // A pod stuck on its image never ends by itself.
            d.actions.push(Action::DeletePod {
                name,
                grace_seconds: Some(0),
            });
        }
        let failure = classify(&spec.retry.rules, w, d.status.attempt);
        fail(spec, TaskPhase::Failed, failure, d, clock);
        return;
    }
    if w.deleting {
        let failure = infrastructure(
            d,
            "WorkerDeleted",
            format!("worker pod {name} is being deleted by someone else"),
        );
        fail(spec, TaskPhase::Failed, failure, d, clock);
        return;
    }
    if w.phase == PodPhase::Running && d.phase() == Some(TaskPhase::Scheduled) {
        d.status.started_at = Some(now);
        d.status.node = w.node.clone();
        let node = w.node.as_deref().unwrap_or("?");
        d.transition(
            TaskPhase::Running,
            "WorkerRunning",
            format!("worker {name} running on {node}"),
            ACTOR_WORKER,
            now,
        );
    }
    if now >= hard_at {
        d.actions.push(Action::DeletePod {
            name,
            grace_seconds: Some(HARD_TIMEOUT_GRACE_SECONDS),
        });
        let failure = timeout(
            d,
            "HardTimeout",
            format!("no result after hardSeconds={}", spec.timeout.hard_seconds),
        );
        fail(spec, TaskPhase::TimedOut, failure, d, clock);
        return;
    }
    // The soft timeout counts from when the worker started running: a pod still waiting for a
    // node or its image is not hung, and the hard timeout (from dispatch) bounds that wait.
    if let Some(soft) = spec.timeout.soft_seconds
        && let Some(running_since) = d.status.started_at
        && d.status.soft_timeout_attempt != Some(d.status.attempt)
    {
        let soft_at = add_seconds(running_since, soft);
        if now >= soft_at {
            let alive =
                w.phase == PodPhase::Running && w.restarts == 0 && w.node_ready != Some(false);
            if !alive {
                d.actions.push(Action::DeletePod {
                    name,
                    grace_seconds: Some(HARD_TIMEOUT_GRACE_SECONDS),
                });
                let why = format!(
                    "worker not alive at softSeconds={soft} (pod {:?}, restarts {}, node ready {:?})",
                    w.phase, w.restarts, w.node_ready
                );
                let failure = timeout(d, "SoftTimeout", why);
                fail(spec, TaskPhase::TimedOut, failure, d, clock);
                return;
            }
            d.status.soft_timeout_attempt = Some(d.status.attempt);
            d.actions.push(Action::Warn {
                reason: "SoftTimeout".into(),
                message: format!(
                    "attempt {} still running after softSeconds={soft}; worker is alive",
                    d.status.attempt
                ),
            });
        } else {
            d.requeue_at(soft_at, now);
        }
    }
    d.queue = QueueState::Running;
    d.requeue_at(hard_at, now);
}

fn hard_deadline_requeue(spec: &AxTaskSpec, d: &mut Decision, now: Timestamp) {
    let started = d.status.scheduled_at.unwrap_or(now);
    d.requeue_at(add_seconds(started, spec.timeout.hard_seconds), now);
}

fn add_seconds(t: Timestamp, seconds: i64) -> Timestamp {
    t.checked_add(SignedDuration::from_secs(seconds))
        .unwrap_or(Timestamp::MAX)
}

fn infrastructure(d: &Decision, reason: &str, message: String) -> Failure {
    Failure {
        attempt: d.status.attempt,
        kind: FailureKind::Infrastructure,
        exit_code: None,
        reason: reason.into(),
        message,
    }
}

fn timeout(d: &Decision, reason: &str, message: String) -> Failure {
    Failure {
        attempt: d.status.attempt,
        kind: FailureKind::Timeout,
        exit_code: None,
        reason: reason.into(),
        message,
    }
}

/// Failure classification, in DESIGN §3's order: retry rules, a JSON termination message,
/// disruption, a container that can never start, any other non-zero exit.
pub fn classify(rules: &[RetryRule], w: &WorkerState, attempt: i32) -> Failure {
    let exit_code = w.exit.as_ref().map(|e| e.exit_code).filter(|c| *c != 0);
    let failure = |kind, reason: &str, message: String| Failure {
        attempt,
        kind,
        exit_code,
        reason: reason.into(),
        message,
    };
    if let Some(code) = exit_code
        && let Some((i, rule)) = rules
            .iter()
            .enumerate()
            .find(|(_, r)| rule_matches(r, code))
    {
        let kind = match rule.action {
            RuleAction::Retry => FailureKind::Retryable,
            RuleAction::Dead => FailureKind::NonRetryable,
            RuleAction::Ignore => FailureKind::Infrastructure,
        };
        return failure(
            kind,
            "ExitCodeRule",
            format!(
                "exit code {code} matched spec.retry.rules[{i}] ({:?})",
                rule.action
            ),
        );
    }
    let message = w
        .exit
        .as_ref()
        .map(|e| e.message.trim())
        .unwrap_or_default();
    if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(message) {
        let why = m
            .get("reason")
            .and_then(|r| r.as_str())
            .unwrap_or_default()
            .to_string();
        match m.get("error").and_then(|e| e.as_str()) {
            Some("biz") => return failure(FailureKind::NonRetryable, "BusinessError", why),
            Some("sys") => return failure(FailureKind::Retryable, "SystemError", why),
            _ => {}
        }
    }
    if let Some((reason, message)) = &w.disrupted {
        return failure(FailureKind::Infrastructure, reason, message.clone());
    }
    if let Some((reason, message)) = &w.stuck_reason {
        return failure(FailureKind::NonRetryable, reason, message.clone());
    }
    match &w.exit {
        Some(e) if e.exit_code != 0 => {
            let detail = if e.message.is_empty() {
                e.reason.clone()
            } else {
                format!("{}: {}", e.reason, e.message)
            };
            failure(
                FailureKind::Retryable,
                "ExitCode",
                format!("exit code {} ({detail})", e.exit_code),
            )
        }
        _ => failure(
            FailureKind::Retryable,
            "PodFailed",
            "worker pod failed without an exit code".into(),
        ),
    }
}

fn rule_matches(rule: &RetryRule, code: i32) -> bool {
    let listed = rule.on_exit_codes.values.contains(&i64::from(code));
    match rule.on_exit_codes.operator {
        ExitCodeOperator::In => listed,
        ExitCodeOperator::NotIn => !listed,
    }
}

/// Scheduled/Running → Failed|TimedOut, then at once → Pending (retry after backoff) or Dead.
fn fail(spec: &AxTaskSpec, to: TaskPhase, failure: Failure, d: &mut Decision, clock: &Clock) {
    let message = match failure.exit_code {
        Some(code) => format!(
            "{} (exit code {code}): {}",
            failure.kind.as_str(),
            failure.message
        ),
        None => format!("{}: {}", failure.kind.as_str(), failure.message),
    };
    d.transition(
        to,
        &failure.reason.clone(),
        message,
        clock.operator,
        clock.now,
    );
    after_failure(spec, failure, d, clock);
}

fn after_failure(spec: &AxTaskSpec, failure: Failure, d: &mut Decision, clock: &Clock) {
    let now = clock.now;
    let summary = format!(
        "attempt {} failed: {} ({})",
        failure.attempt,
        failure.reason,
        failure.kind.as_str()
    );
    d.status.last_failure = Some(failure.clone());
    if failure.kind == FailureKind::NonRetryable {
        d.status.dead_reason = Some(format!("{summary}, not retryable: {}", failure.message));
        d.transition(
            TaskPhase::Dead,
            "NonRetryable",
            summary,
            clock.operator,
            now,
        );
        return;
    }
    let counts = failure.kind != FailureKind::Infrastructure;
    let max = spec.retry.max_retries.max(0);
    if counts && d.status.retries >= max {
        d.status.dead_reason = Some(format!("{summary}; all {max} retries used"));
        d.transition(
            TaskPhase::Dead,
            "RetriesExhausted",
            format!("{summary}; all {max} retries used"),
            clock.operator,
            now,
        );
        return;
    }
    let n = d.status.attempt.max(1) as u32;
    let delay = retry_delay(&spec.retry.backoff, n, clock.unit_random);
    let next = now.checked_add(delay).unwrap_or(Timestamp::MAX);
    if let Some(deadline) = d.status.budget_deadline
        && next > deadline
    {
        let reason = format!(
            "{summary}; the next attempt at {next} would start after the retry budget ends at {deadline}"
        );
        d.status.dead_reason = Some(reason.clone());
        d.transition(
            TaskPhase::Dead,
            "BudgetExceeded",
            reason,
            clock.operator,
            now,
        );
        return;
    }
    if counts {
        d.status.retries += 1;
    }
    d.status.next_attempt_at = Some(next);
    d.status.queued_at = Some(next);
    let counted = if counts {
        format!("retry {} of {max}", d.status.retries)
    } else {
        "not counted".into()
    };
    let message = format!(
        "{summary}; {counted}, next attempt in {:.3}s",
        delay.as_secs_f64()
    );
    d.transition(
        TaskPhase::Pending,
        "RetryScheduled",
        message,
        clock.operator,
        now,
    );
    // A zero backoff (base 0, no jitter) makes the task eligible at once.
    d.queue = if next > now {
        QueueState::Waiting
    } else {
        QueueState::Ready
    };
    d.requeue_at(next, now);
}

/// A terminal task: deliver the callback once, delete it when its TTL runs out.
fn finished(spec: &AxTaskSpec, d: &mut Decision, now: Timestamp) {
    d.queue = QueueState::Done;
    if spec.callback.is_some()
        && !d
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "CallbackDelivered")
    {
        d.actions.push(Action::SendCallback);
    }
    if let (Some(ttl), Some(finished)) = (spec.ttl_seconds_after_finished, d.status.finished_at) {
        let expires = add_seconds(finished, ttl);
        if now >= expires {
            d.actions.push(Action::DeleteTask);
        } else {
            d.requeue_at(expires, now);
        }
    }
}

/// Records the callback's outcome as the `CallbackDelivered` condition; never changes the phase.
pub fn callback_outcome(
    status: &AxTaskStatus,
    delivered: bool,
    message: &str,
    now: Timestamp,
) -> AxTaskStatus {
    let mut s = status.clone();
    let (value, reason) = if delivered {
        ("True", "Delivered")
    } else {
        ("False", "DeliveryFailed")
    };
    set_condition(
        &mut s,
        "CallbackDelivered",
        value,
        reason,
        message,
        now,
        status.observed_generation,
    );
    s
}

fn set_conditions(status: &mut AxTaskStatus, now: Timestamp, generation: Option<i64>) {
    let phase = status.phase.unwrap_or_default();
    let (ready, ready_reason) = match phase {
        TaskPhase::Succeeded => ("True", "Succeeded"),
        p => ("False", p.as_str()),
    };
    let ready_message = status.reason.clone().unwrap_or_default();
    set_condition(
        status,
        "Ready",
        ready,
        ready_reason,
        &ready_message,
        now,
        generation,
    );
    let (queued, queued_reason, queued_message) = match phase {
        TaskPhase::Pending if status.next_attempt_at.is_some_and(|t| t > now) => {
            let why = if status.attempt == 0 {
                "Delayed"
            } else {
                "Backoff"
            };
            ("False", why, "waiting for nextAttemptAt".to_string())
        }
        TaskPhase::Pending => match queued_condition(status) {
            // What holds a queued task is the dispatcher's to say (see `held`): keep its word.
            Some(c) if c.status == "True" && HELD_REASONS.contains(&c.reason.as_str()) => {
                ("True", held_reason_str(&c.reason), c.message.clone())
            }
            _ => ("True", "Waiting", "waiting for dispatch".to_string()),
        },
        p => ("False", p.as_str(), String::new()),
    };
    let held_by_circuit = queued == "True" && queued_reason == "CircuitOpen";
    set_condition(
        status,
        "Queued",
        queued,
        queued_reason,
        &queued_message,
        now,
        generation,
    );
    if !held_by_circuit {
        release_circuit_condition(status, now, generation);
    }
}

/// Reasons of the `Queued` condition of an eligible Pending task that the dispatcher sets.
pub const HELD_REASONS: [&str; 7] = [
    "ConcurrencyLimit",
    "TypeConcurrencyLimit",
    "RetryRateLimited",
    "CircuitOpen",
    "Waiting",
    "QueueNotFound",
    "QueueInvalid",
];

fn held_reason_str(reason: &str) -> &'static str {
    HELD_REASONS
        .iter()
        .find(|held| **held == reason)
        .copied()
        .unwrap_or("Waiting")
}

fn queued_condition(status: &AxTaskStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == "Queued")
}

/// A `CircuitOpen` condition that is true turns false: the task is no longer held by a circuit.
fn release_circuit_condition(status: &mut AxTaskStatus, now: Timestamp, generation: Option<i64>) {
    let open = status
        .conditions
        .iter()
        .any(|c| c.type_ == "CircuitOpen" && c.status == "True");
    if open {
        set_condition(
            status,
            "CircuitOpen",
            "False",
            "NotHeld",
            "no longer held by an open circuit",
            now,
            generation,
        );
    }
}

/// Records why the dispatcher holds an eligible Pending task: the `Queued` condition's reason (one
/// of [`HELD_REASONS`]) and, for `CircuitOpen`, a true `CircuitOpen` condition naming the type.
/// `None` when nothing would change (same reasons; messages alone are not worth a write) or the task
/// is not an eligible Pending task.
pub fn held(
    status: &AxTaskStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Option<AxTaskStatus> {
    let eligible = status.phase == Some(TaskPhase::Pending)
        && status.next_attempt_at.is_none_or(|at| at <= now);
    if !eligible || !HELD_REASONS.contains(&reason) {
        return None;
    }
    let circuit = reason == "CircuitOpen";
    let circuit_now = status
        .conditions
        .iter()
        .any(|c| c.type_ == "CircuitOpen" && c.status == "True");
    let unchanged = queued_condition(status)
        .is_some_and(|c| c.status == "True" && c.reason == reason)
        && circuit_now == circuit;
    if unchanged {
        return None;
    }
    let mut s = status.clone();
    let generation = s.observed_generation;
    set_condition(&mut s, "Queued", "True", reason, message, now, generation);
    if circuit {
        set_condition(
            &mut s,
            "CircuitOpen",
            "True",
            "CircuitOpen",
            message,
            now,
            generation,
        );
    } else {
        release_circuit_condition(&mut s, now, generation);
    }
    Some(s)
}

/// How the attempt in flight ended in this decision, as the queue's circuit breaker sees it; `None`
/// when no attempt ended. A success or a failure of the worker counts; an attempt that ended for a
/// reason saying nothing about its type (canceled, infrastructure) is `Aborted`.
pub fn attempt_outcome(d: &Decision) -> Option<Outcome> {
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

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
