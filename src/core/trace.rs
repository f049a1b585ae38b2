//! Task traces (docs/operations.md "Traces") as pure functions: a task's trace context, the ids of
//! its spans, and the spans that a batch of transitions ends.
//!
//! Spans are not held open in memory across reconciles: each is built once it has ended, from the
//! status history the task reconciler has just written, with times taken from that history. Their
//! ids are derived from the trace id, the object's uid and what the span is, so the worker's
//! `TRACEPARENT` names its attempt's span at dispatch, long before that span ends, and a restarted
//! operator or the standby names every span the same way.

use std::fmt;

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::api::{AxTaskStatus, HistoryEntry, SpanLink, TaskPhase, TraceContext};
use crate::core::hex;
use crate::core::task::Reason;

/// The W3C `traceparent` a submitter puts on an AxTask or AxDag for its trace to continue there.
pub const TRACEPARENT_ANNOTATION: &str = "ax.dev/traceparent";
/// A span (in traceparent form) that an AxTask's or AxDag's run is linked to: the AxCron firing
/// that created it. Its trace stays its own.
pub const TRACELINK_ANNOTATION: &str = "ax.dev/tracelink";

/// A parsed W3C `traceparent` (version 00): `00-<trace id>-<parent span id>-<flags>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: String,
    pub span_id: String,
    pub sampled: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{TRACEPARENT_ANNOTATION} {value:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all zero)"
)]
pub struct TraceParentError {
    pub value: String,
}

impl TraceParent {
    pub fn parse(value: &str) -> Result<Self, TraceParentError> {
        let error = || TraceParentError {
            value: value.chars().take(80).collect(),
        };
        let parts: Vec<&str> = value.trim().split('-').collect();
        let [version, trace_id, span_id, flags] = parts[..] else {
            return Err(error());
        };
        let is_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        // Version ff is forbidden; a later version is read as 00 when it has 00's shape, as the
        // W3C spec asks (and here it has exactly four parts).
        if !is_hex(version, 2)
            || version == "ff"
            || !is_hex(trace_id, 32)
            || zero(trace_id)
            || !is_hex(span_id, 16)
            || zero(span_id)
            || !is_hex(flags, 2)
        {
            return Err(error());
        }
        let flags = u8::from_str_radix(flags, 16).map_err(|_| error())?;
        Ok(Self {
            trace_id: trace_id.to_string(),
            span_id: span_id.to_string(),
            sampled: flags & 1 == 1,
        })
    }
}

/// `00-<trace>-<span>-<flags>`.
pub fn traceparent(trace_id: &str, span_id: &str, sampled: bool) -> String {
    format!("00-{trace_id}-{span_id}-{:02x}", u8::from(sampled))
}

/// Which traces are sampled (exported), decided once per task and kept in its status.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampler {
    Always,
    /// This fraction of traces, by trace id (OpenTelemetry's TraceIdRatioBased).
    Ratio(f64),
    /// The submitter's decision when the task continues its trace, else the ratio.
    ParentBased(f64),
}

impl Sampler {
    /// From the operator's flags: `always`, `ratio` or `parentbased`, with the ratio for the last
    /// two.
    pub fn parse(name: &str, ratio: f64) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(format!(
                "the trace sampling ratio {ratio} is not within 0..1"
            ));
        }
        match name {
            "always" => Ok(Self::Always),
            "ratio" => Ok(Self::Ratio(ratio)),
            "parentbased" => Ok(Self::ParentBased(ratio)),
            other => Err(format!(
                "unknown trace sampler {other:?}: always, ratio or parentbased"
            )),
        }
    }

    pub fn sampled(self, trace_id: &str, parent: Option<&TraceParent>) -> bool {
        match (self, parent) {
            (Self::Always, _) => true,
            (Self::ParentBased(_), Some(parent)) => parent.sampled,
            (Self::Ratio(ratio) | Self::ParentBased(ratio), _) => by_ratio(trace_id, ratio),
        }
    }
}

/// The trace id's last 8 bytes as a number below the ratio's share of their range, as
/// OpenTelemetry's TraceIdRatioBased does, so every component sampling by ratio agrees.
fn by_ratio(trace_id: &str, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let low = trace_id
        .get(16..32)
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .unwrap_or(0);
    ((low >> 1) as f64) < ratio * (1u64 << 63) as f64
}

/// The trace of an object with `uid`: the submitter's when `annotation` is a valid traceparent,
/// else one derived from the uid (so the standby derives the same). An invalid annotation starts a
/// trace of its own and is returned for the caller to report.
pub fn context_of(
    uid: &str,
    annotation: Option<&str>,
    link: Option<&str>,
    sampler: Sampler,
) -> (TraceContext, Option<TraceParentError>) {
    let (parent, error) = match annotation.map(TraceParent::parse) {
        Some(Ok(parent)) => (Some(parent), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let trace_id = match &parent {
        Some(p) => p.trace_id.clone(),
        None => hex(&Sha256::digest(format!("ax.dev/trace/{uid}"))[..16]),
    };
    let sampled = sampler.sampled(&trace_id, parent.as_ref());
    // Written by the cron controller: one that does not parse is left out.
    let link = link
        .and_then(|l| TraceParent::parse(l).ok())
        .map(|l| SpanLink {
            trace_id: l.trace_id,
            span_id: l.span_id,
        });
    let context = TraceContext {
        trace_id,
        parent_span_id: parent.map(|p| p.span_id),
        sampled,
        link,
    };
    (context, error)
}

/// The trace of one firing of an AxCron (uid `cron_uid`) at its scheduled time: a trace of its own
/// per firing, whose span the child's run links to.
pub fn firing_context(cron_uid: &str, scheduled: Timestamp, sampler: Sampler) -> TraceContext {
    let trace_id = hex(&Sha256::digest(format!(
        "ax.dev/firing/{cron_uid}/{}",
        scheduled.as_second()
    ))[..16]);
    TraceContext {
        sampled: sampler.sampled(&trace_id, None),
        trace_id,
        parent_span_id: None,
        link: None,
    }
}

/// The annotation (`TRACELINK_ANNOTATION`) a firing's child carries: the firing's span.
pub fn firing_link(firing: &TraceContext, cron_uid: &str) -> String {
    traceparent_of(firing, cron_uid, SpanOf::Firing)
}

/// The span of a cron's firing: from its scheduled time to its child's creation.
#[allow(clippy::too_many_arguments)]
pub fn firing_span(
    firing: &TraceContext,
    namespace: &str,
    cron: &str,
    cron_uid: &str,
    child: &str,
    scheduled: Timestamp,
    created: Timestamp,
    catch_up: bool,
) -> Option<Span> {
    if !firing.sampled {
        return None;
    }
    Some(Span {
        name: "cron",
        trace_id: firing.trace_id.clone(),
        span_id: span_id(&firing.trace_id, cron_uid, SpanOf::Firing),
        parent_span_id: None,
        parent_is_remote: false,
        start: scheduled.min(created),
        end: created,
        attributes: vec![
            ("ax.namespace", namespace.into()),
            ("ax.cron", cron.into()),
            ("ax.child", child.into()),
            ("ax.scheduled_time", scheduled.to_string().into()),
            ("ax.catch_up", i64::from(catch_up).into()),
        ],
        events: Vec::new(),
        links: Vec::new(),
        status: SpanStatus::Unset,
    })
}

/// What a span of an object is; with the trace id and the object's uid it fixes the span's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanOf {
    /// The whole run of a task (its `observed_rerun`), or of a DAG.
    Run(i64),
    /// Waiting in the queue before the first attempt of a run, or after a requeue.
    Queued(i32),
    /// Waiting for the retry of a failed attempt: backoff, then the queue.
    Backoff(i32),
    Attempt(i32),
    /// The delivery of a run's callback.
    Callback(i64),
    /// A cron's firing (its trace is the firing's own).
    Firing,
}

impl fmt::Display for SpanOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Run(run) => write!(f, "run/{run}"),
            Self::Queued(attempt) => write!(f, "queued/{attempt}"),
            Self::Backoff(attempt) => write!(f, "backoff/{attempt}"),
            Self::Attempt(attempt) => write!(f, "attempt/{attempt}"),
            Self::Callback(run) => write!(f, "callback/{run}"),
            Self::Firing => f.write_str("firing"),
        }
    }
}

/// The span id (16 hex digits, never all zero) of `what` of the object with `uid` in `trace_id`.
pub fn span_id(trace_id: &str, uid: &str, what: SpanOf) -> String {
    let digest = Sha256::digest(format!("{trace_id}/{uid}/{what}"));
    let mut bytes: [u8; 8] = digest[..8]
        .try_into()
        .expect("a SHA-256 digest has 32 bytes");
    if bytes == [0; 8] {
        bytes[7] = 1;
    }
    hex(&bytes)
}

/// The `TRACEPARENT` a worker of `attempt` gets: its spans are children of the attempt's span.
pub fn worker_traceparent(trace: &TraceContext, uid: &str, attempt: i32) -> String {
    traceparent_of(trace, uid, SpanOf::Attempt(attempt))
}

/// The traceparent a DAG's child task carries: its trace is a child of the DAG run's span.
pub fn child_traceparent(trace: &TraceContext, dag_uid: &str, run: i64) -> String {
    traceparent_of(trace, dag_uid, SpanOf::Run(run))
}

/// The traceparent naming `what` of the object with `uid` in `trace`.
fn traceparent_of(trace: &TraceContext, uid: &str, what: SpanOf) -> String {
    let span = span_id(&trace.trace_id, uid, what);
    traceparent(&trace.trace_id, &span, trace.sampled)
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Text(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<i32> for Value {
    fn from(n: i32) -> Self {
        Self::Int(n.into())
    }
}

pub type Attributes = Vec<(&'static str, Value)>;

#[derive(Clone, Debug, PartialEq)]
pub struct SpanEvent {
    pub name: String,
    pub time: Timestamp,
    pub attributes: Attributes,
}

/// How a span ended (OpenTelemetry's span status).
#[derive(Clone, Debug, PartialEq)]
pub enum SpanStatus {
    Unset,
    Ok,
    Error(String),
}

/// An ended span, ready to export.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: &'static str,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: Option<String>,
    /// The parent is the submitter's span (in another process), not one of ours.
    pub parent_is_remote: bool,
    pub start: Timestamp,
    pub end: Timestamp,
    pub attributes: Attributes,
    pub events: Vec<SpanEvent>,
    /// Spans of other traces this one is linked to.
    pub links: Vec<SpanLink>,
    pub status: SpanStatus,
}

/// The object whose spans are built: what names it in every span.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub created: Option<Timestamp>,
    pub task_type: &'a str,
    pub queue: &'a str,
    pub priority: &'a str,
}

impl Subject<'_> {
    fn attributes(&self) -> Attributes {
        vec![
            ("ax.namespace", self.namespace.into()),
            ("ax.task", self.name.into()),
            ("ax.type", self.task_type.into()),
            ("ax.queue", self.queue.into()),
            ("ax.priority", self.priority.into()),
        ]
    }
}

/// The spans that `transitions` — the entries just appended to `after.history` by one status
/// write — end: the wait before an attempt (`queued`, or `backoff` after a failed attempt), the
/// attempt (`attempt`, from dispatch to its exit), and at a terminal phase the run (`task`), whose
/// parent is the submitter's span. `before` is the status as written before: what held the task
/// becomes an event of its wait. Nothing when the trace is not sampled.
pub fn spans_ended(
    subject: &Subject,
    trace: &TraceContext,
    before: Option<&AxTaskStatus>,
    after: &AxTaskStatus,
    transitions: &[HistoryEntry],
) -> Vec<Span> {
    let history = &after.history;
    if !trace.sampled || transitions.is_empty() || transitions.len() > history.len() {
        return Vec::new();
    }
    let first_new = history.len() - transitions.len();
    let reruns_from = |i: usize| -> i64 {
        history[i + 1..]
            .iter()
            .filter(|h| h.reason == Reason::Rerun.as_str())
            .count() as i64
    };
    let span = |name: &'static str, what: SpanOf, parent: Option<String>, start, end| Span {
        name,
        trace_id: trace.trace_id.clone(),
        span_id: span_id(&trace.trace_id, subject.uid, what),
        parent_is_remote: false,
        parent_span_id: parent,
        start,
        end,
        attributes: Vec::new(),
        events: Vec::new(),
        links: Vec::new(),
        status: SpanStatus::Unset,
    };
    let mut spans = Vec::new();
    for i in first_new..history.len() {
        let entry = &history[i];
        let run = after.observed_rerun - reruns_from(i);
        let run_span = span_id(&trace.trace_id, subject.uid, SpanOf::Run(run));
        let earlier = &history[..i];
        if entry.to == TaskPhase::Scheduled
            && let Some(waited) = earlier.iter().rposition(|h| h.to == TaskPhase::Pending)
        {
            let from_failure = matches!(
                history[waited].from,
                Some(TaskPhase::Failed | TaskPhase::TimedOut)
            );
            let (name, what) = if from_failure {
                ("backoff", SpanOf::Backoff(entry.attempt))
            } else {
                ("queued", SpanOf::Queued(entry.attempt))
            };
            let start = history[waited].time;
            let mut wait = span(name, what, Some(run_span.clone()), start, entry.time);
            wait.attributes = vec![
                ("ax.attempt", entry.attempt.into()),
                ("ax.queue", subject.queue.into()),
                ("ax.priority", subject.priority.into()),
            ];
            wait.events = held_events(before, start, entry.time);
            spans.push(wait);
        }
        let ends_attempt = matches!(entry.from, Some(TaskPhase::Scheduled | TaskPhase::Running))
            && entry.to != TaskPhase::Running;
        if ends_attempt {
            spans.push(attempt_span(
                subject,
                trace,
                after,
                history,
                i,
                run_span.clone(),
            ));
        }
        if entry.to.is_terminal() {
            // A re-run starts at its Rerun entry; the first run has none before it.
            let start = earlier
                .iter()
                .rev()
                .find(|h| h.reason == Reason::Rerun.as_str())
                .map(|h| h.time)
                .or(subject.created)
                .or(history.first().map(|h| h.time))
                .unwrap_or(entry.time);
            let mut task = span(
                "task",
                SpanOf::Run(run),
                trace.parent_span_id.clone(),
                start,
                entry.time,
            );
            task.parent_is_remote = trace.parent_span_id.is_some();
            task.links = trace.link.iter().cloned().collect();
            task.attributes = subject.attributes();
            task.attributes.extend([
                ("ax.phase", entry.to.as_str().into()),
                ("ax.reason", entry.reason.as_str().into()),
                ("ax.attempts", after.attempt.into()),
                ("ax.retries", after.retries.into()),
                ("ax.run", run.into()),
            ]);
            task.events = vec![SpanEvent {
                name: entry.to.as_str().to_string(),
                time: entry.time,
                attributes: vec![
                    ("ax.reason", entry.reason.as_str().into()),
                    ("ax.message", entry.message.as_str().into()),
                ],
            }];
            task.status = match entry.to {
                TaskPhase::Succeeded => SpanStatus::Ok,
                TaskPhase::Canceled => SpanStatus::Unset,
                _ => SpanStatus::Error(format!("{}: {}", entry.reason, entry.message)),
            };
            spans.push(task);
        }
    }
    spans
}

/// The span of the attempt that `history[i]` ends.
fn attempt_span(
    subject: &Subject,
    trace: &TraceContext,
    after: &AxTaskStatus,
    history: &[HistoryEntry],
    i: usize,
    parent: String,
) -> Span {
    let entry = &history[i];
    let record = after.attempts.iter().find(|r| r.attempt == entry.attempt);
    let start = record.map(|r| r.scheduled_at).unwrap_or_else(|| {
        history[..i]
            .iter()
            .rev()
            .find(|h| h.to == TaskPhase::Scheduled && h.attempt == entry.attempt)
            .map_or(entry.time, |h| h.time)
    });
    let mut attributes: Attributes = vec![
        ("ax.attempt", entry.attempt.into()),
        ("ax.outcome", entry.to.as_str().into()),
        ("ax.reason", entry.reason.as_str().into()),
    ];
    let mut events = Vec::new();
    if let Some(record) = record {
        attributes.push(("k8s.pod.name", record.pod.as_str().into()));
        if let Some(node) = &record.node {
            attributes.push(("k8s.node.name", node.as_str().into()));
        }
        if let Some(code) = record.exit_code {
            attributes.push(("ax.exit_code", code.into()));
        }
        if let Some(kind) = record.failure_kind {
            attributes.push(("ax.failure_kind", kind.as_str().into()));
        }
        if let Some(started) = record.started_at {
            events.push(SpanEvent {
                name: "Running".into(),
                time: started,
                attributes: Vec::new(),
            });
        }
    }
    // What became of the attempt's failure, when the same write says it.
    let next = history[i + 1..].iter().find(|h| h.from == Some(entry.to));
    let classification = match (entry.to, next.map(|h| h.to)) {
        (TaskPhase::Failed | TaskPhase::TimedOut, Some(TaskPhase::Pending)) => Some("retry"),
        (TaskPhase::Failed | TaskPhase::TimedOut, Some(TaskPhase::Dead)) => Some("dead"),
        (TaskPhase::Pending, _) => Some("requeued"),
        _ => None,
    };
    if let Some(classification) = classification {
        attributes.push(("ax.retry", classification.into()));
    }
    Span {
        name: "attempt",
        trace_id: trace.trace_id.clone(),
        span_id: span_id(&trace.trace_id, subject.uid, SpanOf::Attempt(entry.attempt)),
        parent_span_id: Some(parent),
        parent_is_remote: false,
        start,
        end: entry.time,
        attributes,
        events,
        links: Vec::new(),
        status: match entry.to {
            TaskPhase::Succeeded => SpanStatus::Ok,
            TaskPhase::Canceled | TaskPhase::Pending => SpanStatus::Unset,
            _ => SpanStatus::Error(format!("{}: {}", entry.reason, entry.message)),
        },
    }
}

/// What held the task while it waited, as the status written before its dispatch says: its
/// `Queued` condition when false (a queue limit, a hold, suspension), at the time it began.
fn held_events(before: Option<&AxTaskStatus>, start: Timestamp, end: Timestamp) -> Vec<SpanEvent> {
    before
        .into_iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| c.type_ == crate::core::conditions::QUEUED && c.status == "False")
        .map(|c| SpanEvent {
            name: "held".into(),
            time: c.last_transition_time.0.clamp(start, end),
            attributes: vec![
                ("ax.reason", c.reason.as_str().into()),
                ("ax.message", c.message.as_str().into()),
            ],
        })
        .collect()
}

/// The span of the delivery of a run's callback (`outcome`: delivered, failed or refused), a child
/// of the run's span; its id is the parent of the `traceparent` header the POST carries.
pub fn callback_span(
    trace: &TraceContext,
    uid: &str,
    run: i64,
    start: Timestamp,
    end: Timestamp,
    outcome: &str,
    detail: &str,
) -> Option<Span> {
    if !trace.sampled {
        return None;
    }
    Some(Span {
        name: "callback",
        trace_id: trace.trace_id.clone(),
        span_id: span_id(&trace.trace_id, uid, SpanOf::Callback(run)),
        parent_span_id: Some(span_id(&trace.trace_id, uid, SpanOf::Run(run))),
        parent_is_remote: false,
        start,
        end,
        attributes: vec![("ax.outcome", outcome.into()), ("ax.detail", detail.into())],
        events: Vec::new(),
        links: Vec::new(),
        status: match outcome {
            "delivered" => SpanStatus::Ok,
            _ => SpanStatus::Error(detail.to_string()),
        },
    })
}

/// The `traceparent` header of a run's callback POST: the receiver's spans join the task's trace.
pub fn callback_traceparent(trace: &TraceContext, uid: &str, run: i64) -> String {
    traceparent_of(trace, uid, SpanOf::Callback(run))
}

/// The span of a DAG's run, built when the DAG reaches `phase` (terminal) at `end`; its tasks'
/// spans are its children (see [`child_traceparent`]).
#[allow(clippy::too_many_arguments)]
pub fn dag_span(
    namespace: &str,
    name: &str,
    uid: &str,
    trace: &TraceContext,
    run: i64,
    start: Timestamp,
    end: Timestamp,
    phase: &str,
    progress: Option<&str>,
) -> Option<Span> {
    if !trace.sampled {
        return None;
    }
    let mut attributes: Attributes = vec![
        ("ax.namespace", namespace.into()),
        ("ax.dag", name.into()),
        ("ax.phase", phase.into()),
        ("ax.run", run.into()),
    ];
    if let Some(progress) = progress {
        attributes.push(("ax.progress", progress.into()));
    }
    Some(Span {
        name: "dag",
        trace_id: trace.trace_id.clone(),
        span_id: span_id(&trace.trace_id, uid, SpanOf::Run(run)),
        parent_span_id: trace.parent_span_id.clone(),
        parent_is_remote: trace.parent_span_id.is_some(),
        start,
        end,
        attributes,
        events: Vec::new(),
        links: trace.link.iter().cloned().collect(),
        status: match phase {
            "Succeeded" => SpanStatus::Ok,
            _ => SpanStatus::Error(format!("the DAG ended {phase}")),
        },
    })
}

#[cfg(test)]
mod tests;
