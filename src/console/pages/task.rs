//! One task (no client required, pure): its state, why it waits now, the buttons (Retry, Cancel,
//! Clone as new task), the state machine with its path, one card per attempt and the history as
//! a timeline. Built from the same pure pieces as `kubectl ax describe`.

use jiff::Timestamp;
use kube::ResourceExt;
use maud::{Markup, html};

use crate::api::{AxTask, LABEL_DAG, LABEL_DAG_TASK};
use crate::client::format::time;
use crate::client::rerun::{
    CancelDecision, RetryDecision, cancel_decision_task, retry_decision_task,
};
use crate::client::task::{AttemptRow, PodInfo, attempt_rows, waiting};
use crate::core::conditions;

use super::super::diagram;
use super::super::html::{ago, dag_href, phase_badge, seg, task_href, token_field};

/// What the page knows about the worker pods: the pods, or why they could not be read.
pub type Pods = Result<Vec<PodInfo>, String>;

pub fn render(task: &AxTask, pods: &Pods, now: Timestamp, token: &str) -> Markup {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let status = task.status.clone().unwrap_or_default();
    let spec = &task.spec;
    let here = task_href(&ns, &name);
    let retry = retry_decision_task(task);
    let cancel = cancel_decision_task(task);
    let pod_list = pods.as_ref().map(Vec::as_slice).unwrap_or(&[]);
    let attempts = attempt_rows(task, pod_list);
    let unexpected = diagram::unexpected(&status.history);
    html! {
        div.task-head {
            h1 { (name) " " (phase_badge(status.phase.map(|p| p.as_str()))) }
            dl.facts {
                dt { "Namespace" } dd { (ns) }
                dt { "Type" } dd { (spec.task_type) }
                dt { "Queue" } dd { (spec.queue) }
                dt { "Priority" } dd { (spec.priority.as_str()) }
                dt { "Attempt" } dd #attempt { (status.attempt) }
                dt { "Retries" } dd { (status.retries) " of " (spec.retry.max_retries) }
                @if let Some(reason) = &status.reason { dt { "Reason" } dd { (reason) } }
                @if let Some(dag) = task.labels().get(LABEL_DAG) {
                    dt { "DAG" } dd { a href=(dag_href(&ns, dag)) { (dag) }
                        @if let Some(node) = task.labels().get(LABEL_DAG_TASK) { " (task " (node) ")" } }
                }
                dt { "Created" } dd { (ago(now, task.metadata.creation_timestamp.as_ref().map(|t| t.0))) " ago" }
                @if let (Some(f), true) = (status.finished_at, status.phase.is_some_and(|p| p.is_terminal())) {
                    dt { "Finished" } dd { (ago(now, Some(f))) " ago" }
                }
            }
        }
        (why(task, now))
        div.actions {
            form method="post" action="/actions/retry" {
                (token_field(token))
                input type="hidden" name="task" value=(format!("{ns}/{name}"));
                input type="hidden" name="return" value=(here);
                @let (enabled, title) = match &retry {
                    RetryDecision::Rerun { .. } => (true, "start this task again as a new attempt".to_string()),
                    RetryDecision::AlreadyRequested { rerun } => (false, format!("a re-run is already requested (spec.rerun {rerun})")),
                    RetryDecision::NotFinished { phase } => (false, format!("{phase}: only a finished task can be re-run")),
                    RetryDecision::NothingFailed => (false, "nothing to re-run".to_string()),
                };
                button #retry type="submit" disabled[!enabled] title=(title) { "Retry" }
            }
            form method="post" action="/actions/cancel" {
                (token_field(token))
                input type="hidden" name="task" value=(format!("{ns}/{name}"));
                input type="hidden" name="return" value=(here);
                @let (enabled, title) = match &cancel {
                    CancelDecision::Cancel { .. } => (true, "stop this task (spec.cancel)".to_string()),
                    CancelDecision::AlreadyRequested => (false, "cancel already requested".to_string()),
                    CancelDecision::AlreadyFinished { phase } => (false, format!("already {phase}")),
                };
                button #cancel .danger type="submit" disabled[!enabled] title=(title) { "Cancel" }
            }
            a #clone .button href=(format!("/submit?from={}%2F{}", seg(&ns), seg(&name))) { "Clone as new task" }
        }
        section {
            h2 { "State machine" }
            p.hint { "Edges this task took are marked; a number says how often." }
            (diagram::render(&status.history, status.phase))
            @if status.history_dropped > 0 {
                p.hint { "The " (status.history_dropped) " oldest transitions were dropped from the history and are not drawn." }
            }
            @if !unexpected.is_empty() {
                p.problem { "Transitions not in the state machine: "
                    @for (f, t) in &unexpected { (diagram::state_name(*f)) " → " (t.as_str()) "; " } }
            }
        }
        section {
            h2 { "Attempts" }
            @if let Err(e) = pods { p.hint { "Worker pods could not be read (" (e) "); the cards show what the task's status records." } }
            div.cards {
                @for a in attempts.iter().rev() { (card(&ns, &name, a, now)) }
                @if attempts.is_empty() { p.hint { "No attempt yet." } }
            }
        }
        @if status.last_failure.is_some() || status.dead_reason.is_some() {
            section.failure {
                h2 { "Last failure" }
                @if let Some(f) = &status.last_failure {
                    p { "Attempt " (f.attempt) ": " strong { (f.kind.as_str()) } ", " (f.reason)
                        @if let Some(c) = f.exit_code { ", exit code " (c) }
                        @if !f.message.is_empty() { " — " (f.message) } }
                }
                @if let Some(d) = &status.dead_reason { p #dead-reason { strong { "Dead: " } (d) } }
            }
        }
        @if !status.conditions.is_empty() {
            section {
                h2 { "Conditions" }
                table.conditions {
                    thead { tr { th { "Type" } th { "Status" } th { "Reason" } th { "Since" } th { "Message" } } }
                    tbody { @for c in &status.conditions {
                        tr { td { (c.type_) } td { (c.status) } td { (c.reason) }
                             td { (ago(now, Some(c.last_transition_time.0))) } td { (c.message) } }
                    } }
                }
            }
        }
        section {
            h2 { "History" }
            @if status.history_dropped > 0 { p.hint { "(" (status.history_dropped) " older entries dropped)" } }
            ol.timeline {
                @for h in status.history.iter().rev() {
                    li class=(format!("phase-{}", h.to)) {
                        span.t { time datetime=(time(h.time)) title=(time(h.time)) { (time(h.time)) } }
                        span.move { (diagram::state_name(h.from)) " → " strong { (h.to.as_str()) } }
                        span.attempt-no { "attempt " (h.attempt) }
                        span.reason { (h.reason) }
                        span.actor { (h.actor) }
                        @if !h.message.is_empty() { div.message { (h.message) } }
                    }
                }
            }
        }
    }
}

/// Why the task is not running right now, or what it waits for.
fn why(task: &AxTask, now: Timestamp) -> Markup {
    let lines = waiting(task, now);
    let status = task.status.clone().unwrap_or_default();
    let rerun = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::RERUN_REQUESTED && c.status == "True");
    let cancel_pending = task.spec.cancel && !status.phase.is_some_and(|p| p.is_terminal());
    if lines.is_empty() && rerun.is_none() && !cancel_pending {
        return html! {};
    }
    html! {
        div.why #why {
            h2 { "Why it waits" }
            ul {
                @for (label, text) in &lines { li { strong { (label) ": " } (text) } }
                @if let Some(c) = rerun { li { strong { "Re-run requested: " } (c.message) } }
                @if cancel_pending { li { strong { "Cancel: " } "requested, the worker is being stopped" } }
            }
        }
    }
}

fn card(ns: &str, task: &str, a: &AttemptRow, now: Timestamp) -> Markup {
    let duration = a.duration(now);
    let outcome = a.outcome.clone().unwrap_or_else(|| "running".into());
    html! {
        div class=(format!("card attempt phase-{outcome}")) data-attempt=(a.attempt) {
            h3 { "Attempt " (a.attempt) " " span class=(format!("badge phase-{outcome}")) { (outcome) } }
            dl {
                dt { "Pod" } dd { (a.pod) @if a.pod_gone { " (gone)" } }
                dt { "Node" } dd { (a.node.clone().unwrap_or_else(|| "—".into())) }
                dt { "Exit code" } dd.exit-code { (a.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "—".into())) }
                dt { "Failure kind" } dd { (a.failure_kind.clone().unwrap_or_else(|| "—".into())) }
                dt { "Reason" } dd { (a.reason.clone().unwrap_or_else(|| "—".into())) }
                dt { "Duration" } dd { (if duration.is_empty() { "—".to_string() } else { duration }) }
                @if let Some(s) = a.scheduled { dt { "Dispatched" } dd { (time(s)) } }
            }
            @if a.pod_gone {
                span.hint { "logs went with the pod" }
            } @else {
                a.logs href=(format!("{}/logs?attempt={}", task_href(ns, task), a.attempt)) { "Logs" }
            }
        }
    }
}

/// A worker's log, or why it cannot be shown.
pub fn logs(ns: &str, task: &str, attempt: i32, text: &Result<String, String>) -> Markup {
    html! {
        h1 { "Logs of " a href=(task_href(ns, task)) { (task) } ", attempt " (attempt) }
        @match text {
            Ok(t) if t.is_empty() => p.hint { "(the log is empty)" },
            Ok(t) => pre.log { (t) },
            Err(e) => div.problem { (e) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_task() -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "flaky", "namespace": "team", "resourceVersion": "7",
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"type": "x", "template": {}, "retry": {"maxRetries": 1}},
            "status": {
                "phase": "Dead", "attempt": 2, "retries": 1, "reason": "RetriesExhausted",
                "deadReason": "all 1 retries used <b>",
                "history": [
                    {"time": "2025-01-01T00:00:01Z", "to": "Pending", "attempt": 0, "reason": "Queued", "actor": "a"},
                    {"time": "2025-01-01T00:00:02Z", "from": "Pending", "to": "Scheduled", "attempt": 1, "reason": "Dispatched", "actor": "a"},
                    {"time": "2025-01-01T00:00:03Z", "from": "Scheduled", "to": "Running", "attempt": 1, "reason": "WorkerRunning", "actor": "worker"},
                    {"time": "2025-01-01T00:00:04Z", "from": "Running", "to": "Failed", "attempt": 1, "reason": "ExitCode", "actor": "a"},
                    {"time": "2025-01-01T00:00:05Z", "from": "Failed", "to": "Pending", "attempt": 1, "reason": "RetryScheduled", "actor": "a"},
                    {"time": "2025-01-01T00:00:06Z", "from": "Pending", "to": "Scheduled", "attempt": 2, "reason": "Dispatched", "actor": "a"},
                    {"time": "2025-01-01T00:00:07Z", "from": "Scheduled", "to": "Running", "attempt": 2, "reason": "WorkerRunning", "actor": "worker"},
                    {"time": "2025-01-01T00:00:08Z", "from": "Running", "to": "Failed", "attempt": 2, "reason": "ExitCode", "actor": "a"},
                    {"time": "2025-01-01T00:00:09Z", "from": "Failed", "to": "Dead", "attempt": 2, "reason": "RetriesExhausted", "actor": "a"}
                ],
                "attempts": [
                    {"attempt": 1, "pod": "flaky-1", "node": "n1", "scheduledAt": "2025-01-01T00:00:02Z",
                     "finishedAt": "2025-01-01T00:00:04Z", "outcome": "Failed", "exitCode": 3, "failureKind": "Retryable", "reason": "ExitCode"},
                    {"attempt": 2, "pod": "flaky-2", "node": "n2", "scheduledAt": "2025-01-01T00:00:06Z",
                     "finishedAt": "2025-01-01T00:00:08Z", "outcome": "Failed", "exitCode": 3, "failureKind": "Retryable", "reason": "ExitCode"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_dead_task_offers_retry_not_cancel_and_shows_every_attempt() {
        let html = render(&dead_task(), &Ok(vec![]), Timestamp::UNIX_EPOCH, "tok").into_string();
        assert!(
            html.contains(r#"<button id="retry" type="submit""#),
            "{html}"
        );
        assert!(!html.contains(r#"id="retry" type="submit" disabled"#));
        assert!(
            html.contains(r#"<button class="danger" id="cancel" type="submit" disabled"#),
            "{html}"
        );
        assert_eq!(html.matches(r#"class="card attempt"#).count(), 2);
        assert!(html.contains(r#"data-attempt="2""#) && html.contains("flaky-2 (gone)"));
        assert!(
            html.contains("all 1 retries used &lt;b&gt;"),
            "escaped: {html}"
        );
        assert!(html.contains(r#"id="edge-Pending-Scheduled" class="edge taken""#));
        assert!(html.contains(r#"href="/submit?from=team%2Fflaky""#));
    }

    #[test]
    fn unreadable_pods_are_said_and_the_cards_remain() {
        let html = render(
            &dead_task(),
            &Err("no permission to list pods".into()),
            Timestamp::UNIX_EPOCH,
            "tok",
        )
        .into_string();
        assert!(html.contains("Worker pods could not be read (no permission to list pods)"));
        assert_eq!(html.matches(r#"class="card attempt"#).count(), 2);
    }
}
