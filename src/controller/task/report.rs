//! What the task reconciler tells people and Prometheus about each transition: metrics for every
//! one, an Event for those that tell a person something.

use std::time::Duration;

use kube::runtime::events::EventType;

use kube::ResourceExt;

use crate::api::{AxTask, AxTaskStatus, HistoryEntry, TaskPhase};
use crate::controller::Ctx;
use crate::core::task::{self as core, Notice};
use crate::core::trace::{self, Subject};

/// Metrics for every transition; an Event for those that tell a person something (failures,
/// timeouts, outcomes, refusals, re-runs); the spans they end, when traces are exported. Events and
/// spans are sent in the background: they are a record for people, never on the path that moves a
/// task. The history in the status is the full record. `before` is the status written before
/// `task`'s.
pub fn publish_transitions(
    before: Option<&AxTaskStatus>,
    task: &AxTask,
    transitions: &[HistoryEntry],
    ctx: &Ctx,
) {
    record_spans(before, task, transitions, ctx);
    for t in transitions {
        record_metrics(task, t, ctx);
        let Some(notice) = core::notice(t) else {
            continue;
        };
        let kind = match notice {
            Notice::Normal => EventType::Normal,
            Notice::Warning => EventType::Warning,
        };
        let note = format!(
            "{} -> {} (attempt {}): {}",
            t.from.map_or("New", |p| p.as_str()),
            t.to,
            t.attempt,
            t.message
        );
        publish(task, kind, &t.reason, &note, ctx);
    }
}

/// The spans `transitions` end, handed to the exporter (`core::trace::spans_ended`).
fn record_spans(
    before: Option<&AxTaskStatus>,
    task: &AxTask,
    transitions: &[HistoryEntry],
    ctx: &Ctx,
) {
    if ctx.traces.sampler().is_none() || transitions.is_empty() {
        return;
    }
    let Some(status) = task.status.as_ref() else {
        return;
    };
    let Some(context) = status.trace.as_ref() else {
        return;
    };
    let (namespace, name, uid) = (
        task.namespace().unwrap_or_default(),
        task.name_any(),
        task.uid().unwrap_or_default(),
    );
    let subject = Subject {
        namespace: &namespace,
        name: &name,
        uid: &uid,
        created: task.metadata.creation_timestamp.as_ref().map(|t| t.0),
        task_type: &task.spec.task_type,
        queue: &task.spec.queue,
        priority: task.spec.priority.as_str(),
    };
    ctx.traces.record(trace::spans_ended(
        &subject,
        context,
        before,
        status,
        transitions,
    ));
}

pub(super) fn record_metrics(task: &AxTask, t: &HistoryEntry, ctx: &Ctx) {
    let metrics = &ctx.metrics;
    let task_type = task.spec.task_type.as_str();
    metrics.transition(t.from.map_or("New", |p| p.as_str()), t.to.as_str());
    let status = task.status.as_ref();
    match t.to {
        TaskPhase::Scheduled => {
            if let Some(queued_at) = status.and_then(|s| s.queued_at) {
                let waited =
                    Duration::try_from(t.time.duration_since(queued_at)).unwrap_or_default();
                metrics.queue_waited(&task.spec.queue, task.spec.priority.as_str(), waited);
            }
        }
        TaskPhase::Pending if t.reason == core::Reason::RetryScheduled.as_str() => {
            let kind = status
                .and_then(|s| s.last_failure.as_ref())
                .map_or("Unknown", |f| f.kind.as_str());
            metrics.retried(task_type, kind);
        }
        TaskPhase::Dead => {
            metrics.dead(task_type, &t.reason);
            ctx.queues.lock().count_dead(&task.spec.queue);
        }
        _ => {}
    }
    if t.to.is_terminal() {
        let since = status
            .and_then(|s| s.history.first())
            .map_or(t.time, |h| h.time);
        let took = Duration::try_from(t.time.duration_since(since)).unwrap_or_default();
        metrics.task_finished(task_type, t.to.as_str(), took);
    }
}

pub(super) fn publish(task: &AxTask, type_: EventType, reason: &str, note: &str, ctx: &Ctx) {
    ctx.events.publish(task, type_, reason, note);
}
