//! `kubectl ax describe TASK`: the task's state, why it waits now, one row per attempt and the
//! history as a table. `render` is pure, over what `client::task` makes of the status and pods;
//! `run` reads the task and its worker pods (client required).

use std::io::Write;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::api::{AxTask, LABEL_DAG, LABEL_DAG_TASK, TaskPhase};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::format::{NONE, age, time};
use crate::client::task::{AttemptRow, PodInfo, attempt_rows, pod_info, waiting};
use crate::core::worker::{LABEL_TASK, label_value};

use super::args::DescribeArgs;
use super::format;

fn or_none(value: Option<String>) -> String {
    value.unwrap_or_default()
}

fn field(out: &mut String, label: &str, value: impl AsRef<str>) {
    let value = value.as_ref();
    let value = if value.is_empty() { NONE } else { value };
    out.push_str(&format!("{:<15}{}\n", format!("{label}:"), value));
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

    if !status.conditions.is_empty() {
        out.push_str("Conditions:\n");
        let rows: Vec<Vec<String>> = status
            .conditions
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
    let task = ctx.get_task(&args.task).await?;
    let pods = worker_pods(ctx, &task.name_any()).await?;
    let text = render(&task, &pods, Timestamp::now());
    std::io::stdout().lock().write_all(text.as_bytes())?;
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
