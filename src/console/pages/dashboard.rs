//! The dashboard (no client required, pure): tasks per phase and per queue, attempts dispatched
//! and tasks gone Dead per minute over the last hour, and the latest Dead tasks with their
//! reasons — all computed from the watched tasks' histories, so it needs no Prometheus and
//! shows exactly what the user may see.

use std::collections::{BTreeMap, HashMap};

use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use maud::{Markup, html};

use crate::api::{AxTask, TaskPhase};
use crate::client::task::{ALL_PHASES, effective_phase};

use super::super::html::{ago, phase_badge, task_href};

pub const MINUTES: usize = 60;

/// Per minute of the hour before `now` (oldest first), how many history entries went to `to`.
pub fn per_minute(tasks: &[&AxTask], to: TaskPhase, now: Timestamp) -> [usize; MINUTES] {
    let mut out = [0; MINUTES];
    let start = now - SignedDuration::from_mins(MINUTES as i64);
    for t in tasks {
        for h in t.status.iter().flat_map(|s| &s.history) {
            if h.to != to || h.time <= start || h.time > now {
                continue;
            }
            let minute = (h.time.duration_since(start).as_secs() / 60) as usize;
            out[minute.min(MINUTES - 1)] += 1;
        }
    }
    out
}

/// Counts per queue and phase.
pub fn by_queue(tasks: &[&AxTask]) -> BTreeMap<String, HashMap<TaskPhase, usize>> {
    let mut out: BTreeMap<String, HashMap<TaskPhase, usize>> = BTreeMap::new();
    for t in tasks {
        *out.entry(t.spec.queue.clone())
            .or_default()
            .entry(effective_phase(t))
            .or_default() += 1;
    }
    out
}

/// Dead tasks, the latest first, with when and why.
pub fn latest_dead<'a>(tasks: &[&'a AxTask], n: usize) -> Vec<(&'a AxTask, Option<Timestamp>)> {
    let mut dead: Vec<(&AxTask, Option<Timestamp>)> = tasks
        .iter()
        .filter(|t| effective_phase(t) == TaskPhase::Dead)
        .map(|t| {
            let at = t.status.as_ref().and_then(|s| {
                s.history
                    .iter()
                    .rev()
                    .find(|h| h.to == TaskPhase::Dead)
                    .map(|h| h.time)
                    .or(s.finished_at)
            });
            (*t, at)
        })
        .collect();
    dead.sort_by_key(|d| std::cmp::Reverse(d.1));
    dead.truncate(n);
    dead
}

fn chart(id: &str, title: &str, counts: &[usize; MINUTES], class: &str) -> Markup {
    let (w, h, bar) = (600.0, 120.0, 10.0);
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let total: usize = counts.iter().sum();
    html! {
        figure.chart {
            figcaption { (title) ": " strong data-total=(total) { (total) } " in the last hour (max " (max) "/min)" }
            svg id=(id) xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {w} {}", h + 16.0)) width=(w) height=(h + 16.0) {
                line.axis x1="0" y1=(h) x2=(w) y2=(h) {}
                @for (i, n) in counts.iter().enumerate() {
                    @let bh = h * (*n as f64) / (max as f64);
                    rect class=(class) x=(format!("{:.1}", i as f64 * bar)) y=(format!("{:.1}", h - bh))
                        width=(bar - 1.0) height=(format!("{bh:.1}")) data-minute=(i) data-count=(n) {
                        title { (MINUTES - i) " min ago: " (n) }
                    }
                }
                text.axis-label x="0" y=(h + 14.0) { "-60 min" }
                text.axis-label x=(w - 30.0) y=(h + 14.0) { "now" }
            }
        }
    }
}

pub fn render(tasks: &[&AxTask], scope: &str, now: Timestamp) -> Markup {
    let mut phases: HashMap<TaskPhase, usize> = HashMap::new();
    for t in tasks {
        *phases.entry(effective_phase(t)).or_default() += 1;
    }
    let queues = by_queue(tasks);
    let dispatched = per_minute(tasks, TaskPhase::Scheduled, now);
    let dead = per_minute(tasks, TaskPhase::Dead, now);
    html! {
        p.hint { "From the " (tasks.len()) " tasks visible " (scope) " (deleted tasks no longer count)." }
        div.phase-counts {
            @for p in ALL_PHASES {
                a.phase-count href=(format!("/tasks?phase={p}")) data-phase=(p.as_str()) {
                    span class=(format!("badge phase-{p}")) { (p.as_str()) }
                    span.n { (phases.get(&p).copied().unwrap_or(0)) }
                }
            }
        }
        (chart("dispatched-chart", "Attempts dispatched per minute", &dispatched, "bar dispatched"))
        (chart("dead-chart", "Tasks gone Dead per minute", &dead, "bar dead"))
        h2 { "Per queue" }
        table.per-queue {
            thead { tr { th { "Queue" } @for p in ALL_PHASES { th { (p.as_str()) } } } }
            tbody { @for (q, counts) in &queues {
                tr data-queue=(q) { td { a href=(format!("/tasks?queue={q}")) { (q) } }
                    @for p in ALL_PHASES { td.num { (counts.get(&p).copied().unwrap_or(0)) } } }
            } }
        }
        h2 { "Latest Dead tasks" }
        table.dead {
            thead { tr { th { "Task" } th { "Type" } th { "When" } th { "Why" } } }
            tbody {
                @for (t, at) in latest_dead(tasks, 10) {
                    @let s = t.status.clone().unwrap_or_default();
                    tr data-task=(format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any())) {
                        td { a href=(task_href(&t.namespace().unwrap_or_default(), &t.name_any())) { (t.name_any()) } " " (phase_badge(Some("Dead"))) }
                        td { (t.spec.task_type) }
                        td { (ago(now, at)) " ago" }
                        td { strong { (s.reason.unwrap_or_default()) } " " (s.dead_reason.unwrap_or_default()) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str, history: serde_json::Value, phase: &str) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": name, "namespace": "n"},
            "spec": {"type": "t", "queue": "q", "template": {}},
            "status": {"phase": phase, "history": history, "reason": "RetriesExhausted", "deadReason": "all used"},
        }))
        .unwrap()
    }

    fn entry(time: &str, to: &str) -> serde_json::Value {
        serde_json::json!({"time": time, "to": to, "attempt": 1, "reason": "r", "actor": "a"})
    }

    #[test]
    fn dispatches_and_deaths_are_counted_per_minute_of_the_last_hour() {
        let now: Timestamp = "2025-01-01T12:00:00Z".parse().unwrap();
        let a = task(
            "a",
            serde_json::json!([
                entry("2025-01-01T10:00:00Z", "Scheduled"), // over an hour ago
                entry("2025-01-01T11:00:30Z", "Scheduled"), // minute 0
                entry("2025-01-01T11:59:59Z", "Scheduled"), // minute 59
                entry("2025-01-01T11:59:59Z", "Dead"),
            ]),
            "Dead",
        );
        let b = task(
            "b",
            serde_json::json!([entry("2025-01-01T11:00:40Z", "Scheduled")]),
            "Running",
        );
        let tasks = [&a, &b];
        let d = per_minute(&tasks, TaskPhase::Scheduled, now);
        assert_eq!((d[0], d[59], d.iter().sum::<usize>()), (2, 1, 3));
        assert_eq!(per_minute(&tasks, TaskPhase::Dead, now)[59], 1);
        assert_eq!(by_queue(&tasks)["q"][&TaskPhase::Dead], 1);
        let dead = latest_dead(&tasks, 10);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].1, Some("2025-01-01T11:59:59Z".parse().unwrap()));
        let html = render(&tasks, "in namespace n", now).into_string();
        assert!(html.contains(r#"data-total="3""#), "{html}");
        assert!(html.contains("<strong>RetriesExhausted</strong> all used"));
    }
}
