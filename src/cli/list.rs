//! `kubectl ax list`: tasks as `kubectl get` columns plus the last reason and the age of the last
//! transition, filtered by phase, type, queue and labels; `--watch` follows an API watch.
//! `task_row` and `headers` are pure; `run` reads (client required).

use std::collections::BTreeMap;
use std::io::Write;

use futures::TryStreamExt;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::watcher;
use serde::Serialize;

use crate::api::AxTask;
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, watch_error};
use crate::client::format::{age, relative};

use super::args::{ListArgs, OutputFormat};
use super::format;
use super::output::write_objects;
use super::target::{TaskFilter, parse_phases};

pub fn headers(wide: bool, all_namespaces: bool) -> Vec<&'static str> {
    let mut h = Vec::new();
    if all_namespaces {
        h.push("NAMESPACE");
    }
    h.extend([
        "NAME",
        "PHASE",
        "TYPE",
        "PRIORITY",
        "ATTEMPT",
        "WORKER",
        "REASON",
        "LAST-CHANGE",
        "AGE",
    ]);
    if wide {
        h.extend(["QUEUE", "RETRIES", "NODE", "NEXT-ATTEMPT", "MESSAGE"]);
    }
    h
}

/// One task as a row under `headers(wide, all_namespaces)`.
pub fn task_row(task: &AxTask, now: Timestamp, wide: bool, all_namespaces: bool) -> Vec<String> {
    let status = task.status.clone().unwrap_or_default();
    let last = status.history.last();
    let mut row = Vec::new();
    if all_namespaces {
        row.push(task.namespace().unwrap_or_default());
    }
    row.extend([
        task.name_any(),
        status.phase.map(|p| p.to_string()).unwrap_or_default(),
        task.spec.task_type.clone(),
        task.spec.priority.as_str().to_string(),
        status.attempt.to_string(),
        status.worker.clone().unwrap_or_default(),
        status
            .reason
            .clone()
            .or_else(|| last.map(|h| h.reason.clone()))
            .unwrap_or_default(),
        last.map(|h| age(now, h.time)).unwrap_or_default(),
        task.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| age(now, t.0))
            .unwrap_or_default(),
    ]);
    if wide {
        row.extend([
            task.spec.queue.clone(),
            status.retries.to_string(),
            status.node.clone().unwrap_or_default(),
            status
                .next_attempt_at
                .map(|t| relative(now, t))
                .unwrap_or_default(),
            last.map(|h| h.message.clone()).unwrap_or_default(),
        ]);
    }
    row
}

/// Tasks in the order kubectl shows them: by namespace, then name.
pub fn sort_tasks(tasks: &mut [AxTask]) {
    tasks.sort_by_key(|t| (t.namespace(), t.name_any()));
}

/// `axtask.ax.dev/NAME`, as `kubectl get -o name` prints it.
pub fn object_name(kind: &str, name: &str) -> String {
    format!("{kind}.ax.dev/{name}")
}

/// A kubectl-style `List` of the objects, for `-o json|yaml`.
pub fn list_document<T: Serialize>(items: &[T]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
    })
}

pub fn to_json<T: Serialize>(value: &T) -> Result<String, ClientError> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| ClientError::Io(e.to_string()))
}

pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, ClientError> {
    crate::yaml::to_string(value).map_err(|e| ClientError::Io(e.to_string()))
}

fn filter_of(args: &ListArgs) -> Result<TaskFilter, ClientError> {
    Ok(TaskFilter {
        phases: parse_phases(&args.filter.phase)?,
        task_type: args.filter.task_type.clone(),
        queue: args.filter.queue.clone(),
    })
}

pub async fn run(ctx: &Ctx, args: &ListArgs) -> Result<(), ClientError> {
    let filter = filter_of(args)?;
    let all = ctx.global.all_namespaces;
    let wide = args.output == Some(OutputFormat::Wide);
    let mut out = std::io::stdout().lock();
    if args.watch {
        drop(out);
        return watch(ctx, args, &filter).await;
    }
    let mut tasks: Vec<AxTask> = ctx
        .list_tasks(args.filter.selector.as_deref())
        .await?
        .items
        .into_iter()
        .filter(|t| filter.matches(t))
        .collect();
    sort_tasks(&mut tasks);
    match args.output {
        Some(
            OutputFormat::Json
            | OutputFormat::Yaml
            | OutputFormat::Name
            | OutputFormat::JsonPath(_),
        ) => {
            write_objects(&mut out, args.output.as_ref(), "axtask", &tasks, false)?;
        }
        None | Some(OutputFormat::Wide) => {
            if tasks.is_empty() {
                let scope = match ctx.list_namespace() {
                    Some(ns) => format!("in namespace \"{ns}\""),
                    None => "in any namespace".into(),
                };
                eprintln!("No tasks found {scope}.");
                return Ok(());
            }
            let now = Timestamp::now();
            let rows: Vec<Vec<String>> =
                tasks.iter().map(|t| task_row(t, now, wide, all)).collect();
            let headers = headers(wide, all);
            let text = if args.no_headers {
                format::table_without_headers(&headers, &rows)
            } else {
                format::table(&headers, &rows)
            };
            out.write_all(text.as_bytes())?;
        }
    }
    Ok(())
}

/// The list, then one line (or document) per change, from an API watch: no polling.
async fn watch(ctx: &Ctx, args: &ListArgs, filter: &TaskFilter) -> Result<(), ClientError> {
    let namespace = ctx.list_namespace();
    let op = Op::new("watch", Resource::Task).namespace(namespace);
    let all = ctx.global.all_namespaces;
    let wide = args.output == Some(OutputFormat::Wide);
    let mut config = watcher::Config::default();
    if let Some(s) = &args.filter.selector {
        config = config.labels(s);
    }
    let stream = watcher(ctx.tasks(namespace), config);
    let mut stream = std::pin::pin!(stream);
    let headers = headers(wide, all);
    let mut widths: Option<Vec<usize>> = None;
    let mut initial: Vec<AxTask> = Vec::new();
    // The resourceVersion last printed per task: a re-list after a watch restart repeats nothing.
    let mut printed: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut listed = false;
    loop {
        let event = match stream.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(()),
            // Before the first list, an error says why nothing can be watched (403, no CRDs);
            // later ones are interruptions the watcher recovers from.
            Err(e) if !listed => return Err(watch_error(&op, e)),
            Err(e) => {
                eprintln!(
                    "warning: watch interrupted ({}); resuming",
                    watch_error(&op, e)
                );
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut changed: Vec<AxTask> = Vec::new();
        match event {
            watcher::Event::Init => initial.clear(),
            watcher::Event::InitApply(t) => initial.push(t),
            watcher::Event::InitDone => {
                listed = true;
                sort_tasks(&mut initial);
                changed = std::mem::take(&mut initial);
            }
            watcher::Event::Apply(t) | watcher::Event::Delete(t) => changed.push(t),
        }
        let changed: Vec<AxTask> = changed
            .into_iter()
            .filter(|t| filter.matches(t))
            .filter(|t| {
                let key = (t.namespace().unwrap_or_default(), t.name_any());
                let version = t.resource_version().unwrap_or_default();
                printed.insert(key, version.clone()) != Some(version)
            })
            .collect();
        let mut out = std::io::stdout().lock();
        let now = Timestamp::now();
        for t in &changed {
            match &args.output {
                Some(OutputFormat::JsonPath(template)) => {
                    let value =
                        serde_json::to_value(t).map_err(|e| ClientError::Io(e.to_string()))?;
                    out.write_all(template.render(&value)?.as_bytes())?
                }
                Some(OutputFormat::Json) => out.write_all(to_json(t)?.as_bytes())?,
                Some(OutputFormat::Yaml) => {
                    out.write_all(format!("---\n{}", to_yaml(t)?).as_bytes())?
                }
                Some(OutputFormat::Name) => {
                    writeln!(out, "{}", object_name("axtask", &t.name_any()))?
                }
                None | Some(OutputFormat::Wide) => {
                    let row = task_row(t, now, wide, all);
                    let w = widths.get_or_insert_with(|| {
                        let rows: Vec<Vec<String>> = changed
                            .iter()
                            .map(|t| task_row(t, now, wide, all))
                            .collect();
                        let w = format::widths(&headers, &rows);
                        if !args.no_headers {
                            let header_row: Vec<String> =
                                headers.iter().map(|h| h.to_string()).collect();
                            let _ = out.write_all(format::line(&header_row, &w).as_bytes());
                        }
                        w
                    });
                    out.write_all(format::line(&row, w).as_bytes())?;
                }
            }
        }
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "nightly", "namespace": "team-a",
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"type": "report", "queue": "batch", "priority": "High",
                     "template": {"spec": {"containers": []}}},
            "status": {
                "phase": "Pending", "attempt": 2, "retries": 1, "reason": "Backoff",
                "nextAttemptAt": "2025-01-01T00:10:30Z",
                "history": [
                    {"time": "2025-01-01T00:00:01Z", "to": "Pending", "attempt": 0, "reason": "Created", "actor": "ax-operator/x"},
                    {"time": "2025-01-01T00:10:00Z", "from": "Failed", "to": "Pending", "attempt": 2,
                     "reason": "Backoff", "message": "retry 2 in 30s", "actor": "ax-operator/x"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn rows_show_the_last_reason_and_its_age() {
        let now: Timestamp = "2025-01-01T00:10:20Z".parse().unwrap();
        let row = task_row(&task(), now, false, false);
        assert_eq!(
            row,
            vec![
                "nightly", "Pending", "report", "High", "2", "", "Backoff", "20s", "10m"
            ]
        );
        assert_eq!(row.len(), headers(false, false).len());
    }

    #[test]
    fn wide_and_all_namespaces_add_columns() {
        let now: Timestamp = "2025-01-01T00:10:20Z".parse().unwrap();
        let row = task_row(&task(), now, true, true);
        assert_eq!(row.len(), headers(true, true).len());
        assert_eq!(row[0], "team-a");
        let wide: BTreeMap<&str, &str> = headers(true, true)
            .into_iter()
            .zip(row.iter().map(String::as_str))
            .collect();
        assert_eq!(wide["QUEUE"], "batch");
        assert_eq!(wide["RETRIES"], "1");
        assert_eq!(wide["NEXT-ATTEMPT"], "in 10s");
        assert_eq!(wide["MESSAGE"], "retry 2 in 30s");
    }

    #[test]
    fn a_task_without_status_has_empty_cells_not_a_panic() {
        let t: AxTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "new"},
            "spec": {"type": "x", "template": {}},
        }))
        .unwrap();
        let row = task_row(&t, Timestamp::now(), true, true);
        assert_eq!(row[1], "new");
        assert_eq!(row[2], "");
    }

    #[test]
    fn json_lists_look_like_kubectl_lists() {
        let doc = list_document(&[task()]);
        assert_eq!(doc["kind"], "List");
        assert_eq!(doc["items"][0]["kind"], "AxTask");
        assert_eq!(doc["items"][0]["metadata"]["name"], "nightly");
        assert_eq!(object_name("axtask", "x"), "axtask.ax.dev/x");
    }
}
