//! `kubectl ax dag [DAG]`: a DAG drawn as levels (a task's level is the longest chain of
//! dependencies before it), each task with its phase, its child AxTask and what it depends on;
//! without a name, the DAGs of the namespace. `render` is pure (levels from `client::dag`); `run`
//! reads (client required).

use std::collections::HashSet;
use std::io::Write;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;

use crate::api::AxDag;
use crate::client::ctx::Ctx;
use crate::client::dag::{levels, node_phase_name};
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::format::age;
use crate::core::conditions;

use super::args::DagArgs;
use super::format;
use super::output::write_objects;

/// The DAG's header line, conditions that are true, and the table of its tasks by level.
pub fn render(dag: &AxDag) -> String {
    let status = dag.status.clone().unwrap_or_default();
    let mut out = format!(
        "axdag/{}   {}   {} finished   {:?}{}\n",
        dag.name_any(),
        status
            .phase
            .map(|p| p.to_string())
            .unwrap_or_else(|| "(not yet seen by the operator)".into()),
        status
            .progress
            .clone()
            .unwrap_or_else(|| format!("0/{}", dag.spec.tasks.len())),
        dag.spec.failure_policy,
        if dag.spec.cancel {
            "   cancel requested"
        } else {
            ""
        },
    );
    for c in status
        .conditions
        .iter()
        .filter(|c| c.status == "True" && !conditions::restates_phase(&c.type_))
    {
        out.push_str(&format!("{}: {}: {}\n", c.type_, c.reason, c.message));
    }
    let levels = levels(&dag.spec.tasks);
    let mut rows: Vec<(Option<usize>, usize, Vec<String>)> = Vec::new();
    let mut seen = HashSet::new();
    for (index, t) in dag.spec.tasks.iter().enumerate() {
        if !seen.insert(t.name.clone()) {
            continue;
        }
        let level = levels.get(&t.name).copied().flatten();
        let node = status.nodes.get(&t.name);
        rows.push((
            level,
            index,
            vec![
                level
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "cycle".into()),
                t.name.clone(),
                node.map(|n| node_phase_name(n.phase))
                    .unwrap_or_else(|| "NotStarted".into()),
                match (node, &t.for_each) {
                    (Some(n), _) if n.items.is_some() => items_cell(&dag.name_any(), &t.name, n),
                    (_, Some(f)) => format!(
                        "{}-{}-<index>, {} items",
                        dag.name_any(),
                        t.name,
                        f.item_count().unwrap_or_default()
                    ),
                    _ => node.and_then(|n| n.task.clone()).unwrap_or_default(),
                },
                t.depends_on.join(", "),
            ],
        ));
    }
    // By level, tasks without one (cycles) last; within a level in spec order.
    rows.sort_by_key(|(level, index, _)| (level.unwrap_or(usize::MAX), *index));
    let rows: Vec<Vec<String>> = rows.into_iter().map(|(_, _, r)| r).collect();
    out.push_str(&format::table(
        &["LEVEL", "TASK", "PHASE", "CHILD", "DEPENDS-ON"],
        &rows,
    ));
    if let Some(handler) = &status.on_exit {
        out.push_str(&format!(
            "onExit: {} {}\n",
            handler.task.as_deref().unwrap_or_default(),
            node_phase_name(handler.phase)
        ));
    } else if dag.spec.on_exit.is_some() {
        out.push_str("onExit: runs when the DAG ends\n");
    }
    // The failed items of each forEach task: their indexes, and why the task failed.
    for (task, node) in &status.nodes {
        let Some(items) = node.items.as_ref().filter(|i| i.failed > 0) else {
            continue;
        };
        out.push_str(&format!("{task}: failed items {}", items.failed_indexes));
        if !items.message.is_empty() {
            out.push_str(&format!(" ({})", items.message));
        }
        out.push('\n');
    }
    out
}

/// A forEach task's children in one cell: their names and how its items stand.
fn items_cell(dag: &str, task: &str, node: &crate::api::DagNodeStatus) -> String {
    let Some(items) = &node.items else {
        return String::new();
    };
    format!(
        "{dag}-{task}-<index>, {} items: {} succeeded, {} failed, {} at work",
        items.total, items.succeeded, items.failed, items.at_work
    )
}

pub async fn run(ctx: &Ctx, args: &DagArgs) -> Result<(), ClientError> {
    let mut out = std::io::stdout().lock();
    let Some(name) = &args.dag else {
        let namespace = ctx.list_namespace();
        let op = Op::new("list", Resource::Dag).namespace(namespace);
        let mut dags = ctx
            .dags(namespace)
            .list(&ListParams::default())
            .await
            .map_err(|e| from_kube(&op, e))?
            .items;
        dags.sort_by_key(|d| (d.namespace(), d.name_any()));
        if write_objects(&mut out, args.output.as_ref(), "axdag", &dags, false)? {
            return Ok(());
        }
        if dags.is_empty() {
            eprintln!("No DAGs found.");
            return Ok(());
        }
        let now = Timestamp::now();
        let all = ctx.global.all_namespaces;
        let mut headers = vec![];
        if all {
            headers.push("NAMESPACE");
        }
        headers.extend(["NAME", "PHASE", "PROGRESS", "AGE"]);
        let rows: Vec<Vec<String>> = dags
            .iter()
            .map(|d| {
                let s = d.status.clone().unwrap_or_default();
                let mut row = vec![];
                if all {
                    row.push(d.namespace().unwrap_or_default());
                }
                row.extend([
                    d.name_any(),
                    s.phase.map(|p| p.to_string()).unwrap_or_default(),
                    s.progress.unwrap_or_default(),
                    d.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| age(now, t.0))
                        .unwrap_or_default(),
                ]);
                row
            })
            .collect();
        return Ok(out.write_all(format::table(&headers, &rows).as_bytes())?);
    };
    let dag = ctx.get_dag(name).await?;
    if !write_objects(
        &mut out,
        args.output.as_ref(),
        "axdag",
        std::slice::from_ref(&dag),
        true,
    )? {
        out.write_all(render(&dag).as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drawing_lists_tasks_by_level_with_phase_and_child() {
        let dag: AxDag = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "diamond", "namespace": "n"},
            "spec": {"tasks": [
                {"name": "d", "dependsOn": ["b", "c"], "spec": {"type": "x", "template": {}}},
                {"name": "b", "dependsOn": ["a"], "spec": {"type": "x", "template": {}}},
                {"name": "a", "spec": {"type": "x", "template": {}}},
                {"name": "c", "dependsOn": ["a"], "spec": {"type": "x", "template": {}}},
            ]},
            "status": {"phase": "Failed", "progress": "4/4", "nodes": {
                "a": {"phase": "Succeeded", "task": "diamond-a"},
                "b": {"phase": "Dead", "task": "diamond-b"},
                "c": {"phase": "Succeeded", "task": "diamond-c"},
                "d": {"phase": "Skipped"},
            }},
        }))
        .unwrap();
        let text = render(&dag);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "axdag/diamond   Failed   4/4 finished   FailFast");
        assert!(lines[1].starts_with("LEVEL"));
        let order: Vec<&str> = lines[2..]
            .iter()
            .map(|l| l.split_whitespace().nth(1).unwrap())
            .collect();
        assert_eq!(order, ["a", "b", "c", "d"]);
        assert!(
            lines[3].contains("Dead") && lines[3].contains("diamond-b"),
            "{text}"
        );
        assert!(
            lines[5].contains("Skipped") && lines[5].contains("b, c"),
            "{text}"
        );
    }

    #[test]
    fn a_for_each_task_is_one_row_with_counts_and_its_failed_items_below() {
        let dag: AxDag = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "orders", "namespace": "n"},
            "spec": {"tasks": [
                {"name": "map", "spec": {"type": "x", "template": {}},
                    "forEach": {"range": {"count": 2000}}},
                {"name": "join", "dependsOn": ["map"], "spec": {"type": "x", "template": {}}},
            ]},
            "status": {"phase": "Running", "progress": "0/2", "nodes": {
                "map": {"phase": "Running", "items": {"total": 2000, "atWork": 200,
                    "succeeded": 1500, "failed": 3, "failedIndexes": "3,17-18"}},
                "join": {"phase": "NotStarted"},
            }},
        }))
        .unwrap();
        let text = render(&dag);
        assert!(
            text.contains("orders-map-<index>, 2000 items: 1500 succeeded, 3 failed, 200 at work"),
            "{text}"
        );
        assert!(text.ends_with("map: failed items 3,17-18\n"), "{text}");
        let mut ended = dag.clone();
        ended.status.as_mut().unwrap().on_exit = Some(
            serde_json::from_value(serde_json::json!({"phase": "Dead", "task": "orders-onexit"}))
                .unwrap(),
        );
        assert!(render(&ended).contains("onExit: orders-onexit Dead\n"));
        let fresh = AxDag {
            status: None,
            ..dag
        };
        assert!(render(&fresh).contains("orders-map-<index>, 2000 items"));
    }
}
