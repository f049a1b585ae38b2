//! `kubectl ax describe TASK`: the task's state, why it waits now, one row per attempt and the
//! history as a table; `describe dag/NAME`, `queue/NAME`, `cron/NAME`: a DAG's nodes, a queue's
//! limits and counts, a cron's schedule. `render` and `render_*` are pure, over the objects (and
//! what `client::task` makes of a task's status and pods); `run` reads (client required).

use std::collections::BTreeMap;
use std::io::Write;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::api::{AxCron, AxDag, AxQueue, AxTask, Condition, LABEL_DAG, LABEL_DAG_TASK, TaskPhase};
use crate::client::ctx::Ctx;
use crate::client::dag::{levels, node_phase_name};
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::format::{NONE, age, relative, time};
use crate::client::task::{AttemptRow, PodInfo, attempt_rows, pod_info, waiting};
use crate::core::worker::{LABEL_TASK, label_value};

use super::args::DescribeArgs;
use super::format;
use super::output::write_objects;
use super::target::{AnyKind, kind_named};

fn or_none(value: Option<String>) -> String {
    value.unwrap_or_default()
}

fn field(out: &mut String, label: &str, value: impl AsRef<str>) {
    let value = value.as_ref();
    let value = if value.is_empty() { NONE } else { value };
    out.push_str(&format!("{:<15}{}\n", format!("{label}:"), value));
}

/// Longest output shown in full; `-o yaml` shows any output whole.
const OUTPUT_SHOWN_CHARS: usize = 200;

/// The output as compact JSON, cut after [`OUTPUT_SHOWN_CHARS`] characters.
fn output_line(output: &serde_json::Value) -> String {
    let text = output.to_string();
    match text.char_indices().nth(OUTPUT_SHOWN_CHARS) {
        Some((cut, _)) => format!(
            "{}… ({} bytes; `kubectl get axt -o jsonpath={{.status.output}}` shows it all)",
            &text[..cut],
            text.len()
        ),
        None => text,
    }
}

/// The trace id, what it continues, and whether it is exported.
fn trace_line(trace: &crate::api::TraceContext) -> String {
    let parent = trace
        .parent_span_id
        .as_ref()
        .map(|p| format!(" (child of span {p})"))
        .unwrap_or_default();
    let sampled = if trace.sampled { "" } else { "   not sampled" };
    format!("{}{parent}{sampled}", trace.trace_id)
}

fn indented(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// The whole description.
pub fn render(task: &AxTask, pods: &[PodInfo], now: Timestamp) -> String {
    let status = task.status.clone().unwrap_or_default();
    let spec = &task.spec;
    let mut out = String::new();
    field(&mut out, "Name", task.name_any());
    field(&mut out, "Namespace", task.namespace().unwrap_or_default());
    if let Some(dag) = task.labels().get(LABEL_DAG) {
        let node = task
            .labels()
            .get(LABEL_DAG_TASK)
            .cloned()
            .unwrap_or_default();
        field(&mut out, "DAG", format!("{dag} (task {node})"));
    }
    field(&mut out, "Type", &spec.task_type);
    field(&mut out, "Queue", &spec.queue);
    field(&mut out, "Priority", spec.priority.as_str());
    let phase = match (status.phase, &status.reason) {
        (Some(p), Some(r)) => format!("{p} ({r})"),
        (Some(p), None) => p.to_string(),
        (None, _) => "(not yet seen by the operator)".into(),
    };
    field(&mut out, "Phase", phase);
    field(
        &mut out,
        "Attempt",
        format!(
            "{}   retries {}/{}   infrastructure retries {}/{}",
            status.attempt,
            status.retries,
            spec.retry.max_retries,
            status.infrastructure_retries,
            spec.retry.max_infrastructure_retries
        ),
    );
    if let Some(worker) = &status.worker {
        let on = status
            .node
            .as_ref()
            .map(|n| format!(" on {n}"))
            .unwrap_or_default();
        field(&mut out, "Worker", format!("{worker}{on}"));
    }
    if let Some(created) = &task.metadata.creation_timestamp {
        field(
            &mut out,
            "Created",
            format!("{} ({} ago)", time(created.0), age(now, created.0)),
        );
    }
    if let Some(finished) = status.finished_at
        && status.phase.is_some_and(TaskPhase::is_terminal)
    {
        field(
            &mut out,
            "Finished",
            format!("{} ({} ago)", time(finished), age(now, finished)),
        );
    }
    for line in waiting(task, now) {
        field(&mut out, line.0, line.1);
    }
    if let Some(f) = &status.last_failure {
        let exit = f
            .exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        let message = if f.message.is_empty() {
            String::new()
        } else {
            format!(": {}", f.message)
        };
        field(
            &mut out,
            "Last failure",
            format!(
                "attempt {}, {}{exit}, {}{message}",
                f.attempt,
                f.kind.as_str(),
                f.reason
            ),
        );
    }
    if let Some(dead) = &status.dead_reason {
        field(&mut out, "Dead reason", dead);
    }
    if let Some(output) = &status.output {
        field(&mut out, "Output", output_line(output));
    }
    if let Some(template) = &status.template {
        let text = format!(
            "{} (resourceVersion {})",
            template.name, template.resource_version
        );
        field(&mut out, "Template", text);
    }
    if let Some(handler) = &status.on_exit {
        let phase = serde_json::to_value(handler.phase).unwrap_or_default();
        let text = format!(
            "{} {}",
            handler.task.as_deref().unwrap_or("-"),
            phase.as_str().unwrap_or_default()
        );
        field(&mut out, "Exit handler", text);
    }
    if let Some(trace) = &status.trace {
        field(&mut out, "Trace", trace_line(trace));
    }
    if spec.rerun > 0 || status.observed_rerun > 0 {
        let pending = if spec.rerun > status.observed_rerun {
            "   (a re-run is requested, not yet started)"
        } else {
            ""
        };
        field(
            &mut out,
            "Re-runs",
            format!(
                "requested {}, started {}{pending}",
                spec.rerun, status.observed_rerun
            ),
        );
    }
    if spec.cancel {
        field(&mut out, "Cancel", "requested (spec.cancel: true)");
    }
    if spec.suspend {
        field(
            &mut out,
            "Suspend",
            "true: no attempt is dispatched (kubectl ax resume NAME)",
        );
    }

    conditions_table(&mut out, &status.conditions, now);

    let attempts = attempt_rows(task, pods);
    out.push_str("Attempts:\n");
    if attempts.is_empty() {
        out.push_str("  (none yet)\n");
    } else {
        let rows: Vec<Vec<String>> = attempts.iter().map(|a| attempt_cells(a, now)).collect();
        out.push_str(&indented(&format::table(
            &[
                "ATTEMPT",
                "POD",
                "NODE",
                "OUTCOME",
                "EXIT-CODE",
                "DURATION",
                "FAILURE-KIND",
                "REASON",
            ],
            &rows,
        )));
    }

    out.push_str("History:\n");
    if status.history_dropped > 0 {
        out.push_str(&format!(
            "  ({} older entries dropped)\n",
            status.history_dropped
        ));
    }
    if status.history.is_empty() {
        out.push_str("  (none yet)\n");
    } else {
        let rows: Vec<Vec<String>> = status
            .history
            .iter()
            .map(|h| {
                vec![
                    time(h.time),
                    h.from.map(|p| p.to_string()).unwrap_or_default(),
                    h.to.to_string(),
                    h.attempt.to_string(),
                    h.reason.clone(),
                    h.actor.clone(),
                    h.message.clone(),
                ]
            })
            .collect();
        out.push_str(&indented(&format::table(
            &[
                "TIME", "FROM", "TO", "ATTEMPT", "REASON", "ACTOR", "MESSAGE",
            ],
            &rows,
        )));
    }
    out
}

/// The conditions as a table, none when there are none.
fn conditions_table(out: &mut String, conditions: &[Condition], now: Timestamp) {
    if conditions.is_empty() {
        return;
    }
    out.push_str("Conditions:\n");
    let rows: Vec<Vec<String>> = conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(now, c.last_transition_time.0),
                c.message.clone(),
            ]
        })
        .collect();
    out.push_str(&indented(&format::table(
        &["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
        &rows,
    )));
}

/// A time with how long ago (or until) it is.
fn when(t: Option<Timestamp>, now: Timestamp) -> String {
    t.map(|t| format!("{} ({})", time(t), relative(now, t)))
        .unwrap_or_default()
}

/// What `describe` was asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Describable {
    Task(String),
    Dag(String),
    Queue(String),
    Cron(String),
}

/// `NAME` (a task) or `KIND/NAME` in any spelling kubectl accepts for the kind.
pub fn parse(text: &str) -> Result<Describable, ClientError> {
    let usage = |why: String| {
        ClientError::Usage(format!(
            "{text:?}: {why} (use NAME for a task, or dag/NAME, queue/NAME, cron/NAME)"
        ))
    };
    let (kind, name) = text.split_once('/').unwrap_or(("axtask", text));
    if name.is_empty() || name.contains('/') {
        return Err(usage("not a name".into()));
    }
    let name = name.to_owned();
    Ok(match kind_named(kind) {
        Some(AnyKind::Task) => Describable::Task(name),
        Some(AnyKind::Dag) => Describable::Dag(name),
        Some(AnyKind::Queue) => Describable::Queue(name),
        Some(AnyKind::Cron) => Describable::Cron(name),
        None => {
            let kind = kind.to_ascii_lowercase();
            return Err(usage(format!("unknown kind {kind:?}")));
        }
    })
}

/// A DAG: where it stands, then each task by level with its phase and child AxTask.
pub fn render_dag(dag: &AxDag, now: Timestamp) -> String {
    let status = dag.status.clone().unwrap_or_default();
    let spec = &dag.spec;
    let mut out = String::new();
    field(&mut out, "Name", dag.name_any());
    field(&mut out, "Namespace", dag.namespace().unwrap_or_default());
    field(
        &mut out,
        "Phase",
        status
            .phase
            .map(|p| p.to_string())
            .unwrap_or_else(|| "(not yet seen by the operator)".into()),
    );
    field(
        &mut out,
        "Progress",
        format!(
            "{} finished",
            status
                .progress
                .clone()
                .unwrap_or_else(|| format!("0/{}", spec.tasks.len()))
        ),
    );
    field(
        &mut out,
        "Failure policy",
        format!("{:?}", spec.failure_policy),
    );
    field(
        &mut out,
        "Parallelism",
        spec.parallelism
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unlimited".into()),
    );
    field(&mut out, "Started", when(status.started_at, now));
    field(&mut out, "Finished", when(status.finished_at, now));
    if let Some(trace) = &status.trace {
        field(&mut out, "Trace", trace_line(trace));
    }
    if spec.rerun > 0 || status.observed_rerun > 0 {
        field(
            &mut out,
            "Re-runs",
            format!(
                "requested {}, started {}",
                spec.rerun, status.observed_rerun
            ),
        );
    }
    if spec.cancel {
        field(&mut out, "Cancel", "requested (spec.cancel: true)");
    }
    conditions_table(&mut out, &status.conditions, now);
    out.push_str("Tasks:\n");
    let levels = levels(&spec.tasks);
    let mut rows: Vec<(usize, usize, Vec<String>)> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(index, t)| {
            let level = levels.get(&t.name).copied().flatten();
            let node = status.nodes.get(&t.name);
            (
                level.unwrap_or(usize::MAX),
                index,
                vec![
                    level.map_or_else(|| "cycle".into(), |l| l.to_string()),
                    t.name.clone(),
                    node.map_or_else(|| "NotStarted".into(), |n| node_phase_name(n.phase)),
                    node.and_then(|n| n.task.clone()).unwrap_or_default(),
                    t.depends_on.join(", "),
                ],
            )
        })
        .collect();
    rows.sort_by_key(|(level, index, _)| (*level, *index));
    let rows: Vec<Vec<String>> = rows.into_iter().map(|(_, _, r)| r).collect();
    out.push_str(&indented(&format::table(
        &["LEVEL", "TASK", "PHASE", "CHILD", "DEPENDS-ON"],
        &rows,
    )));
    out
}

/// A queue: its limits as the spec sets them and as they apply now, what waits and runs.
pub fn render_queue(queue: &AxQueue, now: Timestamp) -> String {
    let status = queue.status.clone().unwrap_or_default();
    let spec = &queue.spec;
    let mut out = String::new();
    field(&mut out, "Name", queue.name_any());
    field(
        &mut out,
        "Concurrency",
        format!(
            "{} ({:?}{})",
            spec.concurrency,
            spec.concurrency_policy.mode,
            if spec.concurrency_policy.min > 0 {
                format!(", min {}", spec.concurrency_policy.min)
            } else {
                String::new()
            }
        ),
    );
    let per_type = |map: &BTreeMap<String, String>| {
        map.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    field(
        &mut out,
        "Per type",
        per_type(
            &spec
                .type_concurrency
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
        ),
    );
    field(
        &mut out,
        "Retry rate",
        format!("{}/min", spec.retry_rate_per_minute),
    );
    let w = &spec.weights;
    field(
        &mut out,
        "Weights",
        format!(
            "Critical {}, High {}, Normal {}, Low {}",
            w.critical, w.high, w.normal, w.low
        ),
    );
    let m = &spec.max_wait_seconds;
    field(
        &mut out,
        "Max wait",
        format!(
            "Critical {}s, High {}s, Normal {}s, Low {}s",
            m.critical, m.high, m.normal, m.low
        ),
    );
    let cb = &spec.circuit_breaker;
    field(
        &mut out,
        "Breaker",
        format!(
            "opens at {}% failures of the last {} (at least {}), for {}s",
            (cb.failure_ratio * 100.0).round(),
            cb.window_size,
            cb.min_requests,
            cb.open_seconds
        ),
    );
    let stop = if spec.stop_policy.holds() {
        format!(
            "{}: nothing is dispatched (kubectl ax resume queue/{})",
            spec.stop_policy.as_str(),
            queue.name_any()
        )
    } else {
        spec.stop_policy.as_str().to_string()
    };
    field(&mut out, "Stop policy", stop);
    let effective = status
        .effective_concurrency
        .unwrap_or(i64::from(spec.concurrency));
    field(
        &mut out,
        "Running",
        format!("{} of {effective} (effective concurrency)", status.running),
    );
    if let Some(limits) = &status.limits {
        let types: BTreeMap<String, String> = limits
            .type_concurrency
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        let types = per_type(&types);
        field(
            &mut out,
            "Limits now",
            format!(
                "concurrency {}, retries {}/min{}",
                limits.concurrency,
                limits.retry_rate_per_minute,
                if types.is_empty() {
                    String::new()
                } else {
                    format!(", per type {types}")
                }
            ),
        );
    }
    if let Some(window) = &status.active_window {
        field(
            &mut out,
            "Window",
            format!(
                "#{} {}-{} {}",
                window.index, window.from, window.to, window.time_zone
            ),
        );
    }
    if let Some(change) = &status.last_concurrency_change {
        field(
            &mut out,
            "Last change",
            format!(
                "{} -> {} {} ({}){}",
                change.from,
                change.to,
                relative(now, change.time),
                change.reason,
                if change.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", change.message)
                }
            ),
        );
    }
    field(
        &mut out,
        "Totals",
        format!(
            "dispatched {}, dead {}, forbidden {}, retry tokens {}",
            status.dispatched, status.dead, status.forbidden, status.retry_tokens
        ),
    );
    out.push_str("Pending:\n");
    let p = &status.pending;
    out.push_str(&indented(&format::table(
        &["CRITICAL", "HIGH", "NORMAL", "LOW"],
        &[vec![
            p.critical.to_string(),
            p.high.to_string(),
            p.normal.to_string(),
            p.low.to_string(),
        ]],
    )));
    out.push_str("Open circuits:\n");
    let open: Vec<Vec<String>> = status
        .circuits
        .iter()
        .map(|c| {
            vec![
                c.namespace.clone(),
                c.task_type.clone(),
                c.state.clone(),
                when(c.reopens_at, now),
            ]
        })
        .collect();
    if open.is_empty() && status.open_circuits.is_empty() {
        out.push_str("  (none)\n");
    } else if open.is_empty() {
        out.push_str(&format!("  {}\n", status.open_circuits.join(", ")));
    } else {
        out.push_str(&indented(&format::table(
            &["NAMESPACE", "TYPE", "STATE", "REOPENS"],
            &open,
        )));
    }
    conditions_table(&mut out, &status.conditions, now);
    out
}

/// A cron: its schedule and policies, the last and next times, the children running now.
pub fn render_cron(cron: &AxCron, now: Timestamp) -> String {
    let status = cron.status.clone().unwrap_or_default();
    let spec = &cron.spec;
    let mut out = String::new();
    field(&mut out, "Name", cron.name_any());
    field(&mut out, "Namespace", cron.namespace().unwrap_or_default());
    field(&mut out, "Schedule", &spec.schedule);
    field(
        &mut out,
        "Time zone",
        if spec.time_zone.is_empty() {
            "UTC"
        } else {
            &spec.time_zone
        },
    );
    field(
        &mut out,
        "Suspend",
        if spec.suspend {
            "true: nothing fires (kubectl ax cron resume NAME)"
        } else {
            "false"
        },
    );
    field(
        &mut out,
        "Concurrency",
        format!("{:?}", spec.concurrency_policy),
    );
    field(
        &mut out,
        "Misfires",
        format!(
            "{:?} (at most {} caught up{})",
            spec.misfire_policy,
            spec.max_catch_up,
            spec.starting_deadline_seconds
                .map(|s| format!(", deadline {s}s"))
                .unwrap_or_default()
        ),
    );
    let template = match (&spec.task, &spec.dag) {
        (Some(t), _) => format!("AxTask of type {}", t.task_type),
        (None, Some(d)) => format!("AxDag of {} tasks", d.tasks.len()),
        (None, None) => String::new(),
    };
    field(&mut out, "Creates", template);
    field(
        &mut out,
        "Last scheduled",
        when(status.last_schedule_time, now),
    );
    field(
        &mut out,
        "Last success",
        when(status.last_successful_time, now),
    );
    let next = if spec.suspend {
        None
    } else {
        status.next_schedule_time
    };
    field(&mut out, "Next", when(next, now));
    out.push_str(&format!("Active ({}):\n", status.active_count));
    if status.active.is_empty() {
        out.push_str("  (none)\n");
    }
    for child in &status.active {
        out.push_str(&format!("  {child}\n"));
    }
    conditions_table(&mut out, &status.conditions, now);
    out
}

fn attempt_cells(a: &AttemptRow, now: Timestamp) -> Vec<String> {
    let duration = a.duration(now);
    let pod = if a.pod_gone {
        format!("{} (gone)", a.pod)
    } else {
        a.pod.clone()
    };
    vec![
        a.attempt.to_string(),
        pod,
        or_none(a.node.clone()),
        a.outcome.clone().unwrap_or_else(|| {
            if a.finished.is_none() {
                "(running)".into()
            } else {
                String::new()
            }
        }),
        a.exit_code.map(|c| c.to_string()).unwrap_or_default(),
        duration,
        or_none(a.failure_kind.clone()),
        or_none(a.reason.clone()),
    ]
}

pub async fn run(ctx: &Ctx, args: &DescribeArgs) -> Result<(), ClientError> {
    let now = Timestamp::now();
    let mut out = std::io::stdout().lock();
    // `-o`: the object as stored (or a path of it) instead of the description.
    let format = args.output.as_ref();
    let text = match parse(&args.target)? {
        Describable::Task(name) => {
            let task = ctx.get_task(&name).await?;
            if write_objects(
                &mut out,
                format,
                "axtask",
                std::slice::from_ref(&task),
                true,
            )? {
                return Ok(());
            }
            let pods = worker_pods(ctx, &task.name_any()).await?;
            render(&task, &pods, now)
        }
        Describable::Dag(name) => {
            let dag = ctx.get_dag(&name).await?;
            if write_objects(&mut out, format, "axdag", std::slice::from_ref(&dag), true)? {
                return Ok(());
            }
            render_dag(&dag, now)
        }
        Describable::Queue(name) => {
            let op = Op::new("get", Resource::Queue).name(&name);
            let queue = ctx
                .queues()
                .get(&name)
                .await
                .map_err(|e| from_kube(&op, e))?;
            if write_objects(
                &mut out,
                format,
                "axqueue",
                std::slice::from_ref(&queue),
                true,
            )? {
                return Ok(());
            }
            render_queue(&queue, now)
        }
        Describable::Cron(name) => {
            let cron = super::cron::get(ctx, &name).await?;
            if write_objects(
                &mut out,
                format,
                "axcron",
                std::slice::from_ref(&cron),
                true,
            )? {
                return Ok(());
            }
            render_cron(&cron, now)
        }
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The task's worker pods that still exist.
pub async fn worker_pods(ctx: &Ctx, task: &str) -> Result<Vec<PodInfo>, ClientError> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let op = Op::new("list", Resource::Pod).namespace(Some(&ctx.namespace));
    let pods = api
        .list(&ListParams::default().labels(&format!("{LABEL_TASK}={}", label_value(task))))
        .await
        .map_err(|e| from_kube(&op, e))?;
    let mut infos: Vec<PodInfo> = pods.items.iter().filter_map(pod_info).collect();
    infos.sort_by_key(|p| p.attempt);
    Ok(infos)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::client::task::fixtures::dead_task;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// The value after `Label:` on its line.
    fn value_of<'a>(text: &'a str, label: &str) -> &'a str {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{label}:")))
            .unwrap_or_else(|| panic!("no {label}: in\n{text}"))
            .trim()
    }

    #[test]
    fn targets_name_a_task_or_a_kind_in_kubectls_spellings() {
        assert_eq!(parse("x").unwrap(), Describable::Task("x".into()));
        assert_eq!(parse("axt/x").unwrap(), Describable::Task("x".into()));
        assert_eq!(parse("dag/d").unwrap(), Describable::Dag("d".into()));
        assert_eq!(
            parse("AxQueues.ax.dev/q").unwrap(),
            Describable::Queue("q".into())
        );
        assert_eq!(parse("axcron/c").unwrap(), Describable::Cron("c".into()));
        for bad in ["pod/x", "dag/", "a/b/c"] {
            assert!(matches!(parse(bad), Err(ClientError::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn a_dag_shows_phase_progress_and_each_node_by_level() {
        let dag: AxDag = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "diamond", "namespace": "team-a"},
            "spec": {"parallelism": 2, "rerun": 1, "tasks": [
                {"name": "d", "dependsOn": ["b", "c"], "spec": {"type": "x", "template": {}}},
                {"name": "a", "spec": {"type": "x", "template": {}}},
                {"name": "b", "dependsOn": ["a"], "spec": {"type": "x", "template": {}}},
                {"name": "c", "dependsOn": ["a"], "spec": {"type": "x", "template": {}}},
            ]},
            "status": {"phase": "Failed", "progress": "3/4", "observedRerun": 1,
                "startedAt": "2025-01-01T00:00:00Z", "finishedAt": "2025-01-01T00:00:50Z",
                "nodes": {"a": {"phase": "Succeeded", "task": "diamond-a"},
                          "b": {"phase": "Dead", "task": "diamond-b"},
                          "c": {"phase": "Succeeded", "task": "diamond-c"},
                          "d": {"phase": "Skipped"}},
                "conditions": [{"type": "Failed", "status": "True", "reason": "TaskDead",
                    "message": "b is Dead", "lastTransitionTime": "2025-01-01T00:00:50Z"}]},
        }))
        .unwrap();
        let text = render_dag(&dag, at("2025-01-01T00:01:00Z"));
        assert_eq!(value_of(&text, "Phase"), "Failed");
        assert_eq!(value_of(&text, "Progress"), "3/4 finished");
        assert_eq!(value_of(&text, "Parallelism"), "2");
        assert_eq!(value_of(&text, "Re-runs"), "requested 1, started 1");
        assert_eq!(
            value_of(&text, "Finished"),
            "2025-01-01T00:00:50Z (10s ago)"
        );
        assert!(text.contains("TaskDead"), "{text}");
        let nodes: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| *l != "Tasks:")
            .skip(2)
            .map(|l| l.split_whitespace().take(4).collect())
            .collect();
        assert_eq!(
            nodes,
            vec![
                vec!["0", "a", "Succeeded", "diamond-a"],
                vec!["1", "b", "Dead", "diamond-b"],
                vec!["1", "c", "Succeeded", "diamond-c"],
                vec!["2", "d", "Skipped", "-"],
            ],
            "{text}"
        );
    }

    #[test]
    fn a_queue_shows_limits_stop_policy_pending_and_open_circuits() {
        let queue: AxQueue = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
            "metadata": {"name": "batch"},
            "spec": {"concurrency": 10, "typeConcurrency": {"report": 2},
                     "stopPolicy": "HoldAndDrain",
                     "concurrencyPolicy": {"mode": "Adaptive", "min": 2}},
            "status": {"pending": {"critical": 1, "high": 0, "normal": 7, "low": 3},
                "running": 4, "effectiveConcurrency": 6, "dispatched": 40, "dead": 2,
                "openCircuits": ["team-a/report"],
                "circuits": [{"namespace": "team-a", "type": "report", "state": "Open",
                              "reopensAt": "2025-01-01T00:01:30Z"}]},
        }))
        .unwrap();
        let text = render_queue(&queue, at("2025-01-01T00:01:00Z"));
        assert_eq!(value_of(&text, "Concurrency"), "10 (Adaptive, min 2)");
        assert_eq!(value_of(&text, "Per type"), "report=2");
        assert!(
            value_of(&text, "Stop policy").starts_with("HoldAndDrain: nothing is dispatched"),
            "{text}"
        );
        assert_eq!(value_of(&text, "Running"), "4 of 6 (effective concurrency)");
        let pending: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "Pending:")
            .nth(2)
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(pending, ["1", "0", "7", "3"]);
        let circuit: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "Open circuits:")
            .nth(2)
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            circuit,
            [
                "team-a",
                "report",
                "Open",
                "2025-01-01T00:01:30Z",
                "(in",
                "30s)"
            ]
        );
    }

    #[test]
    fn a_cron_shows_schedule_policies_times_and_active_children() {
        let cron: AxCron = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxCron",
            "metadata": {"name": "nightly", "namespace": "team-a"},
            "spec": {"schedule": "0 2 * * *", "timeZone": "Europe/Berlin",
                     "concurrencyPolicy": "Forbid",
                     "task": {"type": "report", "template": {}}},
            "status": {"lastScheduleTime": "2025-01-01T01:00:00Z",
                       "nextScheduleTime": "2025-01-02T01:00:00Z",
                       "active": ["nightly-1735693200"], "activeCount": 1},
        }))
        .unwrap();
        let now = at("2025-01-01T01:00:30Z");
        let text = render_cron(&cron, now);
        assert_eq!(value_of(&text, "Schedule"), "0 2 * * *");
        assert_eq!(value_of(&text, "Time zone"), "Europe/Berlin");
        assert_eq!(value_of(&text, "Suspend"), "false");
        assert_eq!(value_of(&text, "Concurrency"), "Forbid");
        assert_eq!(value_of(&text, "Creates"), "AxTask of type report");
        assert_eq!(
            value_of(&text, "Last scheduled"),
            "2025-01-01T01:00:00Z (30s ago)"
        );
        assert!(value_of(&text, "Next").starts_with("2025-01-02T01:00:00Z (in "));
        assert!(
            text.contains("Active (1):\n  nightly-1735693200\n"),
            "{text}"
        );
        let mut suspended = cron.clone();
        suspended.spec.suspend = true;
        let text = render_cron(&suspended, now);
        assert_eq!(value_of(&text, "Next"), "-", "a suspended cron fires never");
    }

    #[test]
    fn the_template_and_the_exit_handler_are_shown() {
        let mut task = dead_task(serde_json::json!([]));
        let status = task.status.as_mut().expect("status");
        status.template = Some(crate::api::TemplateUse {
            name: "resize".into(),
            resource_version: "42".into(),
        });
        status.on_exit = Some(crate::api::DagNodeStatus {
            phase: crate::api::DagNodePhase::Succeeded,
            task: Some("flaky-onexit".into()),
            items: None,
        });
        let text = render(&task, &[], at("2025-01-01T00:01:00Z"));
        assert_eq!(value_of(&text, "Template"), "resize (resourceVersion 42)");
        assert_eq!(value_of(&text, "Exit handler"), "flaky-onexit Succeeded");
    }

    #[test]
    fn an_output_is_shown_as_json_and_a_long_one_cut() {
        assert_eq!(
            output_line(&serde_json::json!({"orders": [1, 2]})),
            r#"{"orders":[1,2]}"#
        );
        let long = output_line(&serde_json::json!("x".repeat(1000)));
        assert!(
            long.starts_with(&format!("\"{}…", "x".repeat(199))),
            "{long}"
        );
        assert!(long.contains("(1002 bytes;"), "{long}");
    }

    #[test]
    fn the_description_has_a_history_table_and_an_attempt_table() {
        let task = dead_task(serde_json::json!([]));
        let text = render(&task, &[], at("2025-01-01T00:01:00Z"));
        assert!(
            text.contains("Phase:         Dead (RetriesExhausted)"),
            "{text}"
        );
        assert!(text.contains("Dead reason:   2 attempts failed"), "{text}");
        let history: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "History:")
            .skip(1)
            .collect();
        assert!(history[0].trim_start().starts_with("TIME"), "{text}");
        assert!(history[0].contains("FROM") && history[0].contains("ACTOR"));
        assert_eq!(history.len(), 10, "a header and 9 entries: {text}");
        assert!(history[4].contains("Running") && history[4].contains("Failed"));
        let attempts: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "Attempts:")
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert_eq!(attempts.len(), 3, "{text}");
        assert!(attempts[1].contains("flaky-1 (gone)"), "{text}");
        assert!(attempts[2].contains("2.0s"), "{text}");
    }
}
