//! `kubectl ax dag [DAG]`: a DAG drawn as levels (a task's level is the longest chain of
//! dependencies before it), each task with its phase, its child AxTask and what it depends on;
//! without a name, the DAGs of the namespace. `levels` and `render` are pure; `run` reads
//! (client required).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;

use crate::api::{AxDag, DagNodePhase, DagTask};

use super::args::{DagArgs, OutputFormat};
use super::ctx::Ctx;
use super::error::{CliError, Op, Resource, from_kube};
use super::format::{self, age};
use super::list::{list_document, object_name, to_json, to_yaml};

/// Each task's level: 0 without dependencies, else one more than its deepest dependency. Tasks
/// on or behind a cycle have none. Unknown dependencies are ignored (the operator reports them).
pub fn levels(tasks: &[DagTask]) -> BTreeMap<String, Option<usize>> {
    let names: HashSet<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    let mut deps: HashMap<&str, Vec<&str>> = HashMap::new();
    for t in tasks {
        // The first of duplicate names counts, as everywhere else here.
        deps.entry(t.name.as_str()).or_insert_with(|| {
            t.depends_on
                .iter()
                .map(String::as_str)
                .filter(|d| names.contains(d))
                .collect()
        });
    }
    let mut level: HashMap<&str, usize> = HashMap::new();
    // Relax until nothing changes; a task gets a level once all its dependencies have one.
    loop {
        let mut changed = false;
        for (name, ds) in &deps {
            if level.contains_key(name) {
                continue;
            }
            if ds.iter().all(|d| level.contains_key(d)) {
                let l = ds.iter().map(|d| level[d] + 1).max().unwrap_or(0);
                level.insert(name, l);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    deps.keys()
        .map(|name| (name.to_string(), level.get(name).copied()))
        .collect()
}

pub fn node_phase_name(phase: DagNodePhase) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

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
        .filter(|c| c.status == "True" && c.type_ != "Ready")
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
                node.and_then(|n| n.task.clone()).unwrap_or_default(),
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
    out
}

pub async fn run(ctx: &Ctx, args: &DagArgs) -> Result<(), CliError> {
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
        return match args.output {
            Some(OutputFormat::Json) => {
                Ok(out.write_all(to_json(&list_document(&dags))?.as_bytes())?)
            }
            Some(OutputFormat::Yaml) => {
                Ok(out.write_all(to_yaml(&list_document(&dags))?.as_bytes())?)
            }
            Some(OutputFormat::Name) => {
                for d in &dags {
                    writeln!(out, "{}", object_name("axdag", &d.name_any()))?;
                }
                Ok(())
            }
            _ => {
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
                Ok(out.write_all(format::table(&headers, &rows).as_bytes())?)
            }
        };
    };
    let dag = ctx.get_dag(name).await?;
    match args.output {
        Some(OutputFormat::Json) => out.write_all(to_json(&dag)?.as_bytes())?,
        Some(OutputFormat::Yaml) => out.write_all(to_yaml(&dag)?.as_bytes())?,
        Some(OutputFormat::Name) => writeln!(out, "{}", object_name("axdag", &dag.name_any()))?,
        _ => out.write_all(render(&dag).as_bytes())?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tasks(edges: &[(&str, &[&str])]) -> Vec<DagTask> {
        edges
            .iter()
            .map(|(name, deps)| {
                serde_json::from_value(serde_json::json!({
                    "name": name, "dependsOn": deps,
                    "spec": {"type": "x", "template": {}},
                }))
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn levels_are_the_longest_chain_of_dependencies() {
        let l = levels(&tasks(&[
            ("a", &[]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &["b", "c"]),
            ("e", &["a", "d"]),
            ("x", &["nope"]),
        ]));
        let want: BTreeMap<String, Option<usize>> = [
            ("a", Some(0)),
            ("b", Some(1)),
            ("c", Some(1)),
            ("d", Some(2)),
            ("e", Some(3)),
            ("x", Some(0)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(l, want);
    }

    #[test]
    fn tasks_on_or_behind_a_cycle_have_no_level() {
        let l = levels(&tasks(&[
            ("a", &["b"]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &[]),
        ]));
        assert_eq!(l["a"], None);
        assert_eq!(l["c"], None);
        assert_eq!(l["d"], Some(0));
    }

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

    proptest! {
        /// In a random acyclic graph every task has a level above each of its dependencies'.
        #[test]
        fn levels_respect_every_edge(edges in proptest::collection::vec(proptest::collection::vec(any::<prop::sample::Index>(), 0..4), 1..15)) {
            let names: Vec<String> = (0..edges.len()).map(|i| format!("t{i}")).collect();
            // Only edges to earlier tasks: acyclic by construction.
            let ts: Vec<DagTask> = edges.iter().enumerate().map(|(i, deps)| {
                let deps: Vec<String> = if i == 0 { vec![] } else {
                    deps.iter().map(|d| names[d.index(i)].clone()).collect()
                };
                serde_json::from_value(serde_json::json!({
                    "name": names[i], "dependsOn": deps, "spec": {"type": "x", "template": {}},
                })).unwrap()
            }).collect();
            let l = levels(&ts);
            for t in &ts {
                let mine = l[&t.name].expect("acyclic: every task has a level");
                for d in &t.depends_on {
                    prop_assert!(mine > l[d].unwrap());
                }
                if t.depends_on.is_empty() {
                    prop_assert_eq!(mine, 0);
                }
            }
        }
    }
}
