//! The task list (no client required, pure): filters (namespace, phase, type, queue, priority,
//! free text), sorting by any column, and checkboxes that belong to the bulk form above the
//! table, so a live update of the table keeps the buttons and what was typed.

use std::collections::BTreeSet;

use jiff::Timestamp;
use kube::ResourceExt;
use maud::{Markup, html};

use crate::api::{AxTask, Priority};
use crate::client::task::{ALL_PHASES, effective_phase};

use super::super::html::{ago, phase_badge, task_href, token_field};

/// The list's filters and order, as in its URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskQuery {
    pub namespace: Option<String>,
    pub phases: Vec<String>,
    pub task_type: Option<String>,
    pub queue: Option<String>,
    pub priority: Option<String>,
    pub text: Option<String>,
    pub sort: Column,
    pub descending: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Column {
    #[default]
    Name,
    Phase,
    Type,
    Queue,
    Priority,
    Attempt,
    LastChange,
    Age,
}

impl Column {
    const ALL: [Column; 8] = [
        Column::Name,
        Column::Phase,
        Column::Type,
        Column::Queue,
        Column::Priority,
        Column::Attempt,
        Column::LastChange,
        Column::Age,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Column::Name => "name",
            Column::Phase => "phase",
            Column::Type => "type",
            Column::Queue => "queue",
            Column::Priority => "priority",
            Column::Attempt => "attempt",
            Column::LastChange => "change",
            Column::Age => "age",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Column::Name => "Name",
            Column::Phase => "Phase",
            Column::Type => "Type",
            Column::Queue => "Queue",
            Column::Priority => "Priority",
            Column::Attempt => "Attempt",
            Column::LastChange => "Last change",
            Column::Age => "Age",
        }
    }
}

fn non_empty(v: &str) -> Option<String> {
    let v = v.trim();
    (!v.is_empty()).then(|| v.to_owned())
}

impl TaskQuery {
    /// From the URL's query pairs; unknown keys and values are ignored.
    pub fn parse(pairs: &[(String, String)]) -> TaskQuery {
        let mut q = TaskQuery::default();
        for (k, v) in pairs {
            match k.as_str() {
                "ns" => q.namespace = non_empty(v),
                "phase" => {
                    if let Some(p) = ALL_PHASES.iter().find(|p| p.as_str() == v.trim()) {
                        q.phases.push(p.as_str().to_owned());
                    }
                }
                "type" => q.task_type = non_empty(v),
                "queue" => q.queue = non_empty(v),
                "priority" => q.priority = non_empty(v),
                "q" => q.text = non_empty(v),
                "sort" => {
                    if let Some(c) = Column::ALL.into_iter().find(|c| c.key() == v) {
                        q.sort = c;
                    }
                }
                "desc" => q.descending = v == "1",
                _ => {}
            }
        }
        q
    }

    /// The query string for these filters sorted by `sort` (`descending`).
    pub fn to_query(&self, sort: Column, descending: bool) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("ns", &self.namespace),
            ("type", &self.task_type),
            ("queue", &self.queue),
            ("priority", &self.priority),
            ("q", &self.text),
        ] {
            if let Some(v) = v {
                s.append_pair(k, v);
            }
        }
        for p in &self.phases {
            s.append_pair("phase", p);
        }
        if sort != Column::Name {
            s.append_pair("sort", sort.key());
        }
        if descending {
            s.append_pair("desc", "1");
        }
        s.finish()
    }

    pub fn matches(&self, task: &AxTask) -> bool {
        let phase = effective_phase(task);
        let text_ok = self.text.as_ref().is_none_or(|t| {
            let t = t.to_lowercase();
            let status = task.status.clone().unwrap_or_default();
            [
                task.name_any(),
                task.spec.task_type.clone(),
                task.spec.queue.clone(),
                status.worker.unwrap_or_default(),
                status.reason.unwrap_or_default(),
            ]
            .iter()
            .chain(task.labels().values())
            .any(|f| f.to_lowercase().contains(&t))
        });
        self.namespace
            .as_ref()
            .is_none_or(|ns| task.namespace().as_deref() == Some(ns))
            && (self.phases.is_empty() || self.phases.iter().any(|p| p == phase.as_str()))
            && self
                .task_type
                .as_ref()
                .is_none_or(|t| *t == task.spec.task_type)
            && self.queue.as_ref().is_none_or(|q| *q == task.spec.queue)
            && self
                .priority
                .as_ref()
                .is_none_or(|p| p == task.spec.priority.as_str())
            && text_ok
    }
}

fn last_change(task: &AxTask) -> Option<Timestamp> {
    task.status
        .as_ref()
        .and_then(|s| s.history.last())
        .map(|h| h.time)
}

fn created(task: &AxTask) -> Option<Timestamp> {
    task.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// The tasks that pass the filters, in the query's order (ties by namespace and name).
pub fn select<'a>(tasks: impl Iterator<Item = &'a AxTask>, q: &TaskQuery) -> Vec<&'a AxTask> {
    let mut out: Vec<&AxTask> = tasks.filter(|t| q.matches(t)).collect();
    let name = |t: &AxTask| (t.namespace().unwrap_or_default(), t.name_any());
    out.sort_by(|a, b| {
        let primary = match q.sort {
            Column::Name => std::cmp::Ordering::Equal,
            Column::Phase => ALL_PHASES
                .iter()
                .position(|p| *p == effective_phase(a))
                .cmp(&ALL_PHASES.iter().position(|p| *p == effective_phase(b))),
            Column::Type => a.spec.task_type.cmp(&b.spec.task_type),
            Column::Queue => a.spec.queue.cmp(&b.spec.queue),
            Column::Priority => a.spec.priority.index().cmp(&b.spec.priority.index()),
            Column::Attempt => attempt(a).cmp(&attempt(b)),
            Column::LastChange => last_change(a).cmp(&last_change(b)),
            Column::Age => created(b).cmp(&created(a)),
        };
        let ordering = primary.then_with(|| name(a).cmp(&name(b)));
        if q.descending {
            ordering.reverse()
        } else {
            ordering
        }
    });
    out
}

fn attempt(t: &AxTask) -> i32 {
    t.status.as_ref().map_or(0, |s| s.attempt)
}

/// The filter form and the bulk form (outside the live region, so typing is never replaced).
pub fn head(q: &TaskQuery, tasks: &[&AxTask], token: &str, return_to: &str) -> Markup {
    let namespaces: BTreeSet<String> = tasks.iter().filter_map(|t| t.namespace()).collect();
    let types: BTreeSet<&str> = tasks.iter().map(|t| t.spec.task_type.as_str()).collect();
    let queues: BTreeSet<&str> = tasks.iter().map(|t| t.spec.queue.as_str()).collect();
    let option = |value: &str, selected: bool| {
        html! { option value=(value) selected[selected] { (value) } }
    };
    html! {
        h1 { "Tasks" }
        form #filters .filters method="get" action="/tasks" {
            label { "Namespace "
                select name="ns" {
                    option value="" { "all" }
                    @for ns in &namespaces { (option(ns, q.namespace.as_deref() == Some(ns.as_str()))) }
                }
            }
            label { "Phase "
                select name="phase" {
                    option value="" { "any" }
                    @for p in ALL_PHASES { (option(p.as_str(), q.phases.iter().any(|x| x == p.as_str()))) }
                }
            }
            label { "Type "
                select name="type" {
                    option value="" { "any" }
                    @for t in &types { (option(t, q.task_type.as_deref() == Some(*t))) }
                }
            }
            label { "Queue "
                select name="queue" {
                    option value="" { "any" }
                    @for name in &queues { (option(name, q.queue.as_deref() == Some(*name))) }
                }
            }
            label { "Priority "
                select name="priority" {
                    option value="" { "any" }
                    @for p in Priority::ALL { (option(p.as_str(), q.priority.as_deref() == Some(p.as_str()))) }
                }
            }
            label { "Text "
                input type="search" name="q" value=(q.text.clone().unwrap_or_default())
                    placeholder="name, type, label, reason";
            }
            @if q.sort != Column::Name { input type="hidden" name="sort" value=(q.sort.key()); }
            @if q.descending { input type="hidden" name="desc" value="1"; }
            button type="submit" { "Filter" }
            a href="/tasks" { "clear" }
        }
        form #bulk .bulk method="post" action="/actions/cancel" {
            (token_field(token))
            input type="hidden" name="return" value=(return_to);
            span #selected-count { "0 selected" }
            button #bulk-cancel type="submit" formaction="/actions/cancel" class="danger" { "Cancel selected" }
            button #bulk-retry type="submit" formaction="/actions/retry" { "Retry selected" }
        }
    }
}

/// Rows shown at most; the count says how many matched (filters narrow the list).
pub const MAX_ROWS: usize = 500;

/// The table: the part that live updates replace.
pub fn table(q: &TaskQuery, tasks: &[&AxTask], now: Timestamp, many_namespaces: bool) -> Markup {
    let total = tasks.len();
    let tasks = &tasks[..total.min(MAX_ROWS)];
    let header = |c: Column| {
        let (desc, arrow) = match (q.sort == c, q.descending) {
            (true, false) => (true, " ▲"),
            (true, true) => (false, " ▼"),
            (false, _) => (false, ""),
        };
        html! {
            th { a href=(format!("/tasks?{}", q.to_query(c, desc))) { (c.label()) (arrow) } }
        }
    };
    html! {
        p.count #task-count data-count=(total) { (total) " task" @if total != 1 { "s" }
            @if total > tasks.len() { " (the first " (tasks.len()) " shown: filter to see others)" } }
        table.tasks #task-table {
            thead { tr {
                th { input #select-all type="checkbox" title="select all shown"; }
                @if many_namespaces { th { "Namespace" } }
                (header(Column::Name)) (header(Column::Phase)) (header(Column::Type))
                (header(Column::Queue)) (header(Column::Priority)) (header(Column::Attempt))
                th { "Worker" } th { "Reason" }
                (header(Column::LastChange)) (header(Column::Age))
            } }
            tbody {
                @for t in tasks {
                    @let ns = t.namespace().unwrap_or_default();
                    @let name = t.name_any();
                    @let status = t.status.clone().unwrap_or_default();
                    @let id = format!("{ns}/{name}");
                    tr data-task=(id) data-phase=(effective_phase(t).as_str()) {
                        td { input.select type="checkbox" form="bulk" name="task" value=(id); }
                        @if many_namespaces { td { (ns) } }
                        td { a href=(task_href(&ns, &name)) { (name) } }
                        td.phase { (phase_badge(status.phase.map(|p| p.as_str()))) }
                        td { (t.spec.task_type) }
                        td { (t.spec.queue) }
                        td { (t.spec.priority.as_str()) }
                        td.num { (status.attempt) }
                        td { (status.worker.clone().unwrap_or_default()) }
                        td { (status.reason.clone().unwrap_or_default()) }
                        td { (ago(now, last_change(t))) }
                        td { (ago(now, created(t))) }
                    }
                }
                @if tasks.is_empty() {
                    tr { td.empty colspan="12" { "No task matches." } }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(ns: &str, name: &str, phase: &str, task_type: &str, priority: &str) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": name, "namespace": ns, "labels": {"team": "blue"},
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"type": task_type, "priority": priority, "template": {}},
            "status": {"phase": phase, "attempt": 1},
        }))
        .unwrap()
    }

    fn pairs(s: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(s.as_bytes()).into_owned().collect()
    }

    #[test]
    fn filters_combine_and_the_query_round_trips() {
        let tasks = [
            task("a", "one", "Running", "mail", "High"),
            task("a", "two", "Dead", "mail", "Low"),
            task("b", "three", "Running", "report", "High"),
        ];
        let q = TaskQuery::parse(&pairs("ns=a&phase=Running&phase=Dead&type=mail&q=ON"));
        let names: Vec<String> = select(tasks.iter(), &q)
            .iter()
            .map(|t| t.name_any())
            .collect();
        assert_eq!(names, ["one"], "text matches name case-insensitively");
        let q = TaskQuery::parse(&pairs("priority=High&q=blue"));
        assert_eq!(select(tasks.iter(), &q).len(), 2, "labels are searched");
        let q = TaskQuery::parse(&pairs("phase=Bogus&sort=nope&ns="));
        assert_eq!(q, TaskQuery::default());
        let q = TaskQuery::parse(&pairs("ns=a&phase=Dead&sort=type&desc=1"));
        assert_eq!(
            TaskQuery::parse(&pairs(&q.to_query(q.sort, q.descending))),
            q
        );
    }

    #[test]
    fn sorting_by_a_column_and_reversed() {
        let tasks = [
            task("a", "x", "Running", "b", "Low"),
            task("a", "y", "Pending", "a", "Critical"),
            task("a", "z", "Dead", "c", "Normal"),
        ];
        let order = |query: &str| -> Vec<String> {
            select(tasks.iter(), &TaskQuery::parse(&pairs(query)))
                .iter()
                .map(|t| t.name_any())
                .collect()
        };
        assert_eq!(order(""), ["x", "y", "z"]);
        assert_eq!(order("sort=phase"), ["y", "x", "z"]);
        assert_eq!(order("sort=type&desc=1"), ["z", "x", "y"]);
        assert_eq!(order("sort=priority"), ["y", "z", "x"]);
    }

    #[test]
    fn rows_carry_their_task_and_a_checkbox_of_the_bulk_form() {
        let tasks = [task("a", "one", "Running", "mail", "High")];
        let shown: Vec<&AxTask> = tasks.iter().collect();
        let html = table(&TaskQuery::default(), &shown, Timestamp::UNIX_EPOCH, false).into_string();
        assert!(
            html.contains(r#"<tr data-task="a/one" data-phase="Running">"#),
            "{html}"
        );
        assert!(html.contains(r#"form="bulk" name="task" value="a/one""#));
        assert!(html.contains(r#"href="/tasks/a/one""#));
    }
}
