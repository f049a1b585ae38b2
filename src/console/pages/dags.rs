//! DAGs (no client required, pure): the list with phase and progress, and one DAG drawn as SVG —
//! a column per level (the longest chain of dependencies before a task, as `kubectl ax dag`
//! computes it), nodes coloured by phase and linked to their child AxTask.

use std::collections::{BTreeMap, HashSet};

use jiff::Timestamp;
use kube::ResourceExt;
use maud::{Markup, html};

use crate::api::AxDag;
use crate::client::dag::{levels, node_phase_name};
use crate::core::conditions;

use super::super::html::{ago, dag_href, phase_badge, task_href};

const COL_W: f64 = 190.0;
const ROW_H: f64 = 70.0;
const NODE_W: f64 = 150.0;
const NODE_H: f64 = 44.0;
const PAD: f64 = 20.0;

pub fn list(dags: &[&AxDag], now: Timestamp, many_namespaces: bool) -> Markup {
    html! {
        table.dags {
            thead { tr {
                @if many_namespaces { th { "Namespace" } }
                th { "Name" } th { "Phase" } th { "Progress" } th { "Tasks" } th { "Age" }
            } }
            tbody {
                @for d in dags {
                    @let ns = d.namespace().unwrap_or_default();
                    @let s = d.status.clone().unwrap_or_default();
                    tr data-dag=(format!("{ns}/{}", d.name_any())) {
                        @if many_namespaces { td { (ns) } }
                        td { a href=(dag_href(&ns, &d.name_any())) { (d.name_any()) } }
                        td { (phase_badge(s.phase.map(|p| p.as_str()))) }
                        td { (s.progress.unwrap_or_default()) }
                        td.num { (d.spec.tasks.len()) }
                        td { (ago(now, d.metadata.creation_timestamp.as_ref().map(|t| t.0))) }
                    }
                }
                @if dags.is_empty() { tr { td.empty colspan="6" { "No AxDag here." } } }
            }
        }
    }
}

/// Each task's place: (column, row). Tasks on or behind a cycle get the last column.
pub fn layout(dag: &AxDag) -> BTreeMap<String, (usize, usize)> {
    let levels = levels(&dag.spec.tasks);
    let last = levels.values().flatten().max().map_or(0, |l| l + 1);
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut seen = HashSet::new();
    for t in &dag.spec.tasks {
        if !seen.insert(t.name.as_str()) {
            continue;
        }
        let column = levels.get(&t.name).copied().flatten().unwrap_or(last);
        let row = rows.entry(column).or_insert(0);
        out.insert(t.name.clone(), (column, *row));
        *row += 1;
    }
    out
}

fn centre((column, row): (usize, usize)) -> (f64, f64) {
    (
        PAD + NODE_W / 2.0 + column as f64 * COL_W,
        PAD + NODE_H / 2.0 + row as f64 * ROW_H,
    )
}

pub fn graph(dag: &AxDag) -> Markup {
    let ns = dag.namespace().unwrap_or_default();
    let status = dag.status.clone().unwrap_or_default();
    let places = layout(dag);
    let columns = places.values().map(|p| p.0 + 1).max().unwrap_or(1);
    let rows = places.values().map(|p| p.1 + 1).max().unwrap_or(1);
    let width = PAD * 2.0 + NODE_W + (columns - 1) as f64 * COL_W;
    let height = PAD * 2.0 + NODE_H + (rows - 1) as f64 * ROW_H;
    html! {
        svg.dag xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {width} {height}"))
            width=(width) height=(height) role="img" aria-label="the DAG's tasks and dependencies" {
            defs {
                marker id="dag-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto" {
                    path d="M0,0 L10,5 L0,10 z" class="arrowhead" {}
                }
            }
            @for t in &dag.spec.tasks {
                @for dep in &t.depends_on {
                    @if let (Some(a), Some(b)) = (places.get(dep), places.get(&t.name)) {
                        @let (x1, y1) = centre(*a);
                        @let (x2, y2) = centre(*b);
                        @let (sx, ex) = (x1 + NODE_W / 2.0, x2 - NODE_W / 2.0 - 2.0);
                        @let mid = (sx + ex) / 2.0;
                        path.dep data-from=(dep) data-to=(t.name) marker-end="url(#dag-arrow)"
                            d=(format!("M{sx:.1},{y1:.1} C{mid:.1},{y1:.1} {mid:.1},{y2:.1} {ex:.1},{y2:.1}")) {}
                    }
                }
            }
            @for (name, place) in &places {
                @let node = status.nodes.get(name);
                @let phase = node.map_or_else(|| "NotStarted".to_string(), |n| node_phase_name(n.phase));
                // A fan-out is one box: its phase with how many of its items ended.
                @let shown = match node.and_then(|n| n.items.as_ref()) {
                    Some(i) => format!("{phase} {}/{}", i.succeeded + i.failed, i.total),
                    None => phase.clone(),
                };
                @let (x, y) = centre(*place);
                @let body = html! {
                    rect x=(x - NODE_W / 2.0) y=(y - NODE_H / 2.0) width=(NODE_W) height=(NODE_H) rx="8" {}
                    text.name x=(x) y=(y - 3.0) { (name) }
                    text.phase x=(x) y=(y + 13.0) { (shown) }
                };
                g class=(format!("node phase-{phase}")) data-node=(name) data-phase=(phase) {
                    @match node.and_then(|n| n.task.as_ref()) {
                        Some(child) => a href=(task_href(&ns, child)) { title { "AxTask " (child) } (body) },
                        None => (body),
                    }
                }
            }
        }
    }
}

/// A fan-out's children and counts, and its failed items.
fn items_text(dag: &str, task: &str, items: &crate::api::DagItemsStatus) -> String {
    let mut text = format!(
        "{dag}-{task}-<index>: {} items, {} succeeded, {} failed, {} at work",
        items.total, items.succeeded, items.failed, items.at_work
    );
    if !items.failed_indexes.is_empty() {
        text.push_str(&format!("; failed items {}", items.failed_indexes));
    }
    if !items.message.is_empty() {
        text.push_str(&format!(" ({})", items.message));
    }
    text
}

pub fn page(dag: &AxDag, now: Timestamp) -> Markup {
    let ns = dag.namespace().unwrap_or_default();
    let s = dag.status.clone().unwrap_or_default();
    html! {
        h1 { "DAG " (dag.name_any()) " " (phase_badge(s.phase.map(|p| p.as_str()))) }
        dl.facts {
            dt { "Namespace" } dd { (ns) }
            dt { "Progress" } dd #progress { (s.progress.clone().unwrap_or_else(|| format!("0/{}", dag.spec.tasks.len()))) }
            dt { "Failure policy" } dd { (format!("{:?}", dag.spec.failure_policy)) }
            @if let Some(p) = dag.spec.parallelism { dt { "Parallelism" } dd { (p) } }
            dt { "Created" } dd { (ago(now, dag.metadata.creation_timestamp.as_ref().map(|t| t.0))) " ago" }
            @if dag.spec.cancel { dt { "Cancel" } dd { "requested" } }
        }
        @for c in s.conditions.iter().filter(|c| c.status == "True" && !conditions::restates_phase(&c.type_)) {
            div.problem { (c.type_) ": " (c.reason) ": " (c.message) }
        }
        div.graph { (graph(dag)) }
        h2 { "Tasks" }
        table.dag-nodes {
            thead { tr { th { "Task" } th { "Phase" } th { "Child AxTask" } th { "Depends on" } } }
            tbody { @for t in &dag.spec.tasks {
                @let node = s.nodes.get(&t.name);
                tr { td { (t.name) }
                     td { (node.map_or_else(|| "NotStarted".to_string(), |n| node_phase_name(n.phase))) }
                     td {
                        @if let Some(child) = node.and_then(|n| n.task.as_ref()) { a href=(task_href(&ns, child)) { (child) } }
                        @if let Some(items) = node.and_then(|n| n.items.as_ref()) {
                            span.items { (items_text(&dag.name_any(), &t.name, items)) }
                        }
                     }
                     td { (t.depends_on.join(", ")) } }
            } }
        }
        @if let Some(handler) = &s.on_exit {
            p.on-exit { "Exit handler: "
                @if let Some(child) = &handler.task { a href=(task_href(&ns, child)) { (child) } }
                " " (node_phase_name(handler.phase)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diamond() -> AxDag {
        let step = serde_json::json!({"type": "s", "template": {}});
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "d", "namespace": "n"},
            "spec": {"tasks": [
                {"name": "a", "spec": step},
                {"name": "b", "dependsOn": ["a"], "spec": step},
                {"name": "c", "dependsOn": ["a"], "spec": step},
                {"name": "e", "dependsOn": ["b", "c"], "spec": step},
            ]},
            "status": {"phase": "Running", "progress": "1/4", "nodes": {
                "a": {"phase": "Succeeded", "task": "d-a"},
                "b": {"phase": "Running", "task": "d-b"},
            }},
        }))
        .unwrap()
    }

    #[test]
    fn levels_become_columns_and_every_node_is_drawn_linked_to_its_child() {
        let dag = diamond();
        let places = layout(&dag);
        assert_eq!(places["a"], (0, 0));
        assert_eq!(places["b"], (1, 0));
        assert_eq!(places["c"], (1, 1));
        assert_eq!(places["e"], (2, 0));
        let svg = graph(&dag).into_string();
        assert_eq!(svg.matches("<g class=\"node ").count(), 4);
        assert!(
            svg.contains(r#"data-node="a" data-phase="Succeeded"><a href="/tasks/n/d-a">"#),
            "{svg}"
        );
        assert!(svg.contains(r#"data-node="c" data-phase="NotStarted"><rect"#));
        assert_eq!(svg.matches("class=\"dep\"").count(), 4);
    }

    #[test]
    fn a_fan_out_is_one_box_with_its_counts_and_its_failed_items_in_the_table() {
        let mut dag = diamond();
        let status = dag.status.as_mut().unwrap();
        status.nodes.insert(
            "c".into(),
            serde_json::from_value(serde_json::json!({"phase": "Running", "items": {
                "total": 2000, "atWork": 200, "succeeded": 1500, "failed": 3,
                "failedIndexes": "3,17-18"}}))
            .unwrap(),
        );
        status.on_exit = Some(
            serde_json::from_value(serde_json::json!({"phase": "Pending", "task": "d-onexit"}))
                .unwrap(),
        );
        let svg = graph(&dag).into_string();
        assert!(svg.contains(">Running 1503/2000<"), "{svg}");
        let page = page(&dag, Timestamp::now()).into_string();
        assert!(
            page.contains("d-c-&lt;index&gt;: 2000 items, 1500 succeeded, 3 failed, 200 at work; failed items 3,17-18"),
            "{page}"
        );
        assert!(
            page.contains(r#"Exit handler: <a href="/tasks/n/d-onexit">d-onexit</a> Pending"#),
            "{page}"
        );
    }
}
