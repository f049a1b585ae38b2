//! The queues (no client required, pure): per AxQueue its buckets with pending counts and the
//! oldest wait, running against concurrency, type limits with what each type runs, open circuits
//! with their reopen time, and the weight schedule with the window in force now marked.

use jiff::Timestamp;
use kube::ResourceExt;
use maud::{Markup, html};

use crate::api::{AxQueue, AxTask, Priority, TaskPhase};
use crate::client::task::effective_phase;
use crate::core::conditions;
use crate::core::queue::queue_config;
use crate::core::queue::weights::effective_weights;

use super::super::html::{ago, when};

/// The oldest `queuedAt` of the Pending tasks of `queue` in `priority` that are due (a retry
/// waiting for its backoff is not yet in the bucket).
pub fn oldest_waiting(
    tasks: &[&AxTask],
    queue: &str,
    priority: Priority,
    now: Timestamp,
) -> Option<Timestamp> {
    tasks
        .iter()
        .filter(|t| t.spec.queue == queue && t.spec.priority == priority)
        .filter(|t| effective_phase(t) == TaskPhase::Pending && !t.spec.cancel)
        .filter_map(|t| t.status.as_ref().and_then(|s| s.queued_at))
        .filter(|q| *q <= now)
        .min()
}

/// Tasks of `task_type` in `queue` holding a slot (Scheduled or Running).
pub fn running_of_type(tasks: &[&AxTask], queue: &str, task_type: &str) -> usize {
    tasks
        .iter()
        .filter(|t| t.spec.queue == queue && t.spec.task_type == task_type)
        .filter(|t| effective_phase(t).has_worker())
        .count()
}

pub fn render(queues: &[&AxQueue], tasks: &[&AxTask], tasks_scope: &str, now: Timestamp) -> Markup {
    html! {
        @if queues.is_empty() { p.hint { "No AxQueue exists yet (the operator creates \"default\")." } }
        @for q in queues { (queue(q, tasks, tasks_scope, now)) }
    }
}

fn queue(q: &AxQueue, tasks: &[&AxTask], tasks_scope: &str, now: Timestamp) -> Markup {
    let name = q.name_any();
    let status = q.status.clone().unwrap_or_default();
    let spec = &q.spec;
    let config = queue_config(spec);
    let invalid = conditions::find(&status.conditions, conditions::INVALID_SPEC, true);
    let pending = |p: Priority| match p {
        Priority::Critical => status.pending.critical,
        Priority::High => status.pending.high,
        Priority::Normal => status.pending.normal,
        Priority::Low => status.pending.low,
    };
    let weights = config
        .as_ref()
        .ok()
        .map(|c| *effective_weights(&c.weights, &c.weight_schedule, now));
    let active_window = config
        .as_ref()
        .ok()
        .and_then(|c| c.weight_schedule.iter().position(|w| w.contains(now)));
    let max_wait = |p: Priority| match p {
        Priority::Critical => spec.max_wait_seconds.critical,
        Priority::High => spec.max_wait_seconds.high,
        Priority::Normal => spec.max_wait_seconds.normal,
        Priority::Low => spec.max_wait_seconds.low,
    };
    let used = if spec.concurrency > 0 {
        (status.running as f64 / spec.concurrency as f64).min(1.0)
    } else {
        1.0
    };
    html! {
        section.queue data-queue=(name) {
            h2 { "Queue " (name)
                @if spec.concurrency == 0 { " " span.badge.phase-Canceled { "paused" } } }
            @if let Some(c) = invalid { div.problem { "InvalidSpec: " (c.message) } }
            div.running {
                span { "Running " strong.running-count { (status.running) } " of " (spec.concurrency) }
                svg.meter width="240" height="12" viewBox="0 0 240 12" {
                    rect.meter-bg x="0" y="0" width="240" height="12" rx="3" {}
                    rect.meter-fill x="0" y="0" width=(format!("{:.0}", 240.0 * used)) height="12" rx="3" {}
                }
                span.hint { "dispatched " (status.dispatched) ", dead " (status.dead) ", retry tokens " (status.retry_tokens) " (" (spec.retry_rate_per_minute) "/min)" }
            }
            table.buckets {
                thead { tr { th { "Bucket" } th { "Pending" } th { "Oldest wait" } th { "Weight now" } th { "Max wait" } } }
                tbody {
                    @for p in Priority::ALL {
                        tr data-bucket=(p.as_str()) {
                            td { (p.as_str()) }
                            td.num.pending { (pending(p)) }
                            td { @if let Some(t) = oldest_waiting(tasks, &name, p, now) { (ago(now, Some(t))) } @else { "—" } }
                            td.num { @if let Some(w) = &weights { (w.of(p)) } }
                            td { @match max_wait(p) { 0 => "—", s => (format!("{s}s")) } }
                        }
                    }
                }
            }
            p.hint { "Oldest wait is computed from the tasks visible " (tasks_scope) "." }
            h3 { "Type limits" }
            @if spec.type_concurrency.is_empty() {
                p.hint { "None: every type may use the whole concurrency." }
            } @else {
                table.types {
                    thead { tr { th { "Type" } th { "Running" } th { "Limit" } } }
                    tbody { @for (t, limit) in &spec.type_concurrency {
                        tr data-type=(t) { td { (t) } td.num { (running_of_type(tasks, &name, t)) } td.num { (limit) } }
                    } }
                }
            }
            h3 { "Circuits" }
            @if status.open_circuits.is_empty() {
                p.hint { "All closed (opens at a failure ratio of " (spec.circuit_breaker.failure_ratio) " over the last "
                    (spec.circuit_breaker.window_size) " outcomes, for " (spec.circuit_breaker.open_seconds) "s)." }
            } @else {
                // Breakers are per (namespace, type): one line per namespace whose circuit is open.
                ul.circuits { @for t in &status.open_circuits {
                    @let details: Vec<_> = status.circuits.iter().filter(|c| &c.task_type == t).collect();
                    @if details.is_empty() { li data-circuit=(t) { strong { (t) } ": open" } }
                    @for c in details {
                        li data-circuit=(t) { strong { (t) }
                            @if !c.namespace.is_empty() { " in " (c.namespace) }
                            ": "
                            @if c.state == "HalfOpen" { "half-open: one probe task may run" } @else { "open"
                                @if let Some(at) = c.reopens_at { ", lets a probe through " (when(now, at)) } }
                        }
                    }
                } }
            }
            h3 { "Weight schedule" }
            @if spec.weight_schedule.is_empty() {
                p.hint { "None: the weights are always "
                    (spec.weights.critical) "/" (spec.weights.high) "/" (spec.weights.normal) "/" (spec.weights.low) "." }
            } @else {
                table.schedule {
                    thead { tr { th {} th { "From" } th { "To" } th { "Time zone" } th { "Weights C/H/N/L" } } }
                    tbody {
                        @for (i, w) in spec.weight_schedule.iter().enumerate() {
                            tr class=(if active_window == Some(i) { "active-window" } else { "" }) {
                                td { @if active_window == Some(i) { span.badge.phase-Running { "now" } } }
                                td { (w.from) } td { (w.to) } td { (w.time_zone) }
                                @let ww = w.weights.as_ref().unwrap_or(&spec.weights);
                                td { (ww.critical) "/" (ww.high) "/" (ww.normal) "/" (ww.low) }
                            }
                        }
                        tr class=(if active_window.is_none() { "active-window" } else { "" }) {
                            td { @if active_window.is_none() { span.badge.phase-Running { "now" } } }
                            td colspan="3" { "outside every window" }
                            td { (spec.weights.critical) "/" (spec.weights.high) "/" (spec.weights.normal) "/" (spec.weights.low) }
                        }
                    }
                }
            }
            @if let Err(e) = &config { p.problem { "The spec cannot be applied: " (e) } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(schedule: serde_json::Value) -> AxQueue {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
            "metadata": {"name": "batch"},
            "spec": {"concurrency": 4, "typeConcurrency": {"report": 1}, "weightSchedule": schedule},
            "status": {"pending": {"high": 2}, "running": 3, "openCircuits": ["mail"],
                       "circuits": [{"type": "mail", "namespace": "team-a", "state": "Open", "reopensAt": "2025-01-01T12:00:30Z"}]},
        }))
        .unwrap()
    }

    fn task(name: &str, phase: &str, queued: &str) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": name, "namespace": "n"},
            "spec": {"type": "report", "queue": "batch", "priority": "High", "template": {}},
            "status": {"phase": phase, "queuedAt": queued},
        }))
        .unwrap()
    }

    #[test]
    fn buckets_types_circuits_and_the_active_window() {
        let now: Timestamp = "2025-01-01T12:00:00Z".parse().unwrap();
        let q = queue(serde_json::json!([
            {"from": "22:00", "to": "06:00", "weights": {"low": 8}},
            {"from": "11:00", "to": "13:00", "timeZone": "UTC", "weights": {"critical": 9}},
        ]));
        let tasks = [
            task("a", "Pending", "2025-01-01T11:58:00Z"),
            task("b", "Pending", "2025-01-01T11:59:00Z"),
            task("c", "Running", "2025-01-01T11:00:00Z"),
            // A retry waiting for its backoff is not in the bucket yet.
            task("d", "Pending", "2025-01-01T12:05:00Z"),
        ];
        let shown: Vec<&AxTask> = tasks.iter().collect();
        assert_eq!(
            oldest_waiting(&shown, "batch", Priority::High, now),
            Some("2025-01-01T11:58:00Z".parse().unwrap())
        );
        assert_eq!(running_of_type(&shown, "batch", "report"), 1);
        let html = render(&[&q], &shown, "in namespace n", now).into_string();
        assert!(
            html.contains(
                r#"<tr data-bucket="High"><td>High</td><td class="num pending">2</td><td><time"#
            ),
            "{html}"
        );
        assert!(html.contains(">2m</time>"), "oldest wait 2m: {html}");
        // The second window is in force: its weight for Critical, and it is marked.
        assert!(html.contains(r#"<tr class="active-window"><td><span class="badge phase-Running">now</span></td><td>11:00</td>"#));
        assert!(html.contains(
            r#"<li data-circuit="mail"><strong>mail</strong> in team-a: open, lets a probe through <time"#
        ));
        assert!(html.contains(">in 30s</time>"));
        assert!(html.contains(
            r#"<tr data-type="report"><td>report</td><td class="num">1</td><td class="num">1</td>"#
        ));
    }
}
