//! The AxDag core (DESIGN §5): validates a task graph, then decides from the phases of the children
//! that exist which tasks to create, which are Skipped, which children to cancel, and the DAG's phase.
//!
//! Pure: no client, no clock, no memory between calls. Every decision is derived again from the
//! children's phases on each reconcile, so an operator that restarts needs nothing else, and a child
//! that `kubectl ax retry` brings back from Dead un-skips its dependents on the next evaluation.
//!
//! Choices the spec leaves open:
//! - Under `FailFast` every task not yet created is Skipped as soon as any child is Dead or Canceled,
//!   without waiting for the running children: none of them can start any more, so the status says so
//!   at once and progress counts them. The DAG phase still stays Running until the running children
//!   finish: a terminal DAG phase always means that no child of it is still at work.
//! - `cancel` creates nothing more, cancels every child that is not terminal and skips the rest; the
//!   phase becomes Canceled once no child is at work (Succeeded if everything had already succeeded).
//! - progress is "finished/total", finished = Succeeded, Dead, Canceled or Skipped (nodes that will not
//!   change again). It reaches total exactly when the DAG phase is terminal.
//! - Tasks are created in waves: by wave (longest dependency chain above the task), then by name.

pub mod exit;
pub mod fanout;
pub mod inputs;
pub mod status;

use std::collections::{HashMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

pub use crate::api::{DagNodePhase, DagPhase, FailurePolicy, TaskPhase};

/// Longest allowed child AxTask name `<dag>-<task>`: the child's name is the value of the pod label
/// `ax.dev/task`, and label values are at most 63 characters.
pub const MAX_CHILD_NAME_LEN: usize = 63;

/// One task of a DAG as the spec lists it (the task's AxTask spec is not needed to schedule it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DagNode {
    pub name: String,
    #[serde(default)]
    pub depends_on: Vec<String>,
}

impl DagNode {
    pub fn new(name: &str, depends_on: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            depends_on: depends_on.iter().map(|&dep| dep.to_owned()).collect(),
        }
    }
}

/// Dependents of a child that ended this way can never run.
fn is_final_failure(phase: TaskPhase) -> bool {
    matches!(phase, TaskPhase::Dead | TaskPhase::Canceled)
}

/// The node's phase when its child is in `phase`.
pub fn node_phase(phase: TaskPhase) -> DagNodePhase {
    match phase {
        TaskPhase::Pending => DagNodePhase::Pending,
        TaskPhase::Scheduled => DagNodePhase::Scheduled,
        TaskPhase::Running => DagNodePhase::Running,
        TaskPhase::Succeeded => DagNodePhase::Succeeded,
        TaskPhase::Failed => DagNodePhase::Failed,
        TaskPhase::TimedOut => DagNodePhase::TimedOut,
        TaskPhase::Dead => DagNodePhase::Dead,
        TaskPhase::Canceled => DagNodePhase::Canceled,
    }
}

/// Dependents of a node in this phase can never run.
fn blocks_dependents(phase: DagNodePhase) -> bool {
    matches!(
        phase,
        DagNodePhase::Dead | DagNodePhase::Canceled | DagNodePhase::Skipped
    )
}

/// Why a DAG spec is invalid; the message is meant for the `InvalidSpec` condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DagError {
    #[error("the DAG has no tasks")]
    Empty,
    #[error(
        "task name `{task}` is not a DNS-1123 label (lowercase letters, digits and '-', \
         starting and ending with a letter or digit)"
    )]
    InvalidName { task: String },
    #[error(
        "task `{task}`: child name `{child}` is {len} characters, more than {MAX_CHILD_NAME_LEN}"
    )]
    NameTooLong {
        task: String,
        child: String,
        len: usize,
    },
    #[error("task `{task}` is defined more than once")]
    DuplicateName { task: String },
    #[error("task `{task}` depends on itself")]
    SelfDependency { task: String },
    #[error("task `{task}` depends on `{dependency}`, which is not a task of this DAG")]
    UnknownDependency { task: String, dependency: String },
    /// `path` starts and ends with the same task; each task in it is a dependency of the next.
    #[error("dependency cycle: {}", path.join(" -> "))]
    Cycle { path: Vec<String> },
}

/// A child's spec: `spec` with `fields` set in its payload (a payload that is no object is kept
/// under `payload`) and `vars` first in the env of each container of its template (a variable the
/// template sets itself wins).
pub(crate) fn child_spec(
    spec: &crate::api::AxTaskSpec,
    fields: Vec<(&str, serde_json::Value)>,
    vars: &[(&str, String)],
) -> crate::api::AxTaskSpec {
    let mut spec = spec.clone();
    let mut payload = match spec.payload.take() {
        Some(serde_json::Value::Object(map)) => map,
        Some(other) => serde_json::Map::from_iter([("payload".to_owned(), other)]),
        None => serde_json::Map::new(),
    };
    for (key, value) in fields {
        payload.insert(key.to_owned(), value);
    }
    spec.payload = Some(serde_json::Value::Object(payload));
    let Some(pod) = spec.template.spec.as_mut() else {
        return spec;
    };
    for container in &mut pod.containers {
        let env = container.env.get_or_insert_with(Vec::new);
        for (name, value) in vars.iter().rev() {
            if !env.iter().any(|e| e.name == *name) {
                let var = k8s_openapi::api::core::v1::EnvVar {
                    name: (*name).into(),
                    value: Some(value.clone()),
                    value_from: None,
                };
                env.insert(0, var);
            }
        }
    }
    spec
}

/// The env a DAG child's worker gets from its item or its DAG, worked out again from its labels
/// and payload: `child_spec` sets it in the containers a spec has, and a child completed from its
/// template later (`core::template`) gets it then.
pub fn child_vars(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    payload: Option<&serde_json::Value>,
) -> Vec<(&'static str, String)> {
    let label = |name: &str| labels.and_then(|l| l.get(name)).map(String::as_str);
    let field = |name: &str| payload.and_then(|p| p.get(name));
    let mut vars = Vec::new();
    let text = |summary: &serde_json::Value, key: &str| {
        summary
            .get(key)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    if label(crate::api::LABEL_DAG_ITEM).is_some()
        && let (Some(item), Some(index)) = (field("item"), field("itemIndex"))
    {
        vars.extend(item_vars(item, index));
    }
    if label(crate::api::LABEL_EXIT_OF).is_some()
        && let Some(task) = field("task")
    {
        vars.extend(parent_vars(text(task, "name"), text(task, "phase")));
    }
    if label(crate::api::LABEL_DAG_TASK) == Some(exit::ON_EXIT_TASK)
        && let Some(dag) = field("dag")
    {
        vars.extend(dag_vars(text(dag, "name"), text(dag, "phase")));
    }
    vars
}

/// The env of a `forEach` item's worker: its item as JSON and its index.
pub(crate) fn item_vars(
    item: &serde_json::Value,
    index: impl std::fmt::Display,
) -> [(&'static str, String); 2] {
    [
        ("AX_ITEM", item.to_string()),
        ("AX_ITEM_INDEX", index.to_string()),
    ]
}

/// The env of a DAG's exit handler's worker: the DAG and its phase.
pub(crate) fn dag_vars(dag: String, phase: String) -> [(&'static str, String); 2] {
    [("AX_DAG", dag), ("AX_DAG_PHASE", phase)]
}

/// The env of an AxTask's exit handler's worker: the task and its phase.
pub(crate) fn parent_vars(task: String, phase: String) -> [(&'static str, String); 2] {
    [("AX_PARENT_TASK", task), ("AX_PARENT_PHASE", phase)]
}

/// The name of the child AxTask that runs `task` of DAG `dag_name`.
pub fn child_name(dag_name: &str, task: &str) -> String {
    format!("{dag_name}-{task}")
}

/// A validated, acyclic task graph. Nodes are numbered in name order, so "smallest index" is
/// "smallest name" and adjacency lists kept sorted by index are sorted by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    dag_name: String,
    names: Vec<String>,
    index: HashMap<String, usize>,
    /// Per node, the nodes it depends on.
    dependencies: Vec<Vec<usize>>,
    /// Per node, 0 for a task without dependencies, else 1 + the largest wave among its dependencies.
    waves: Vec<usize>,
    /// Every node by (wave, name): a topological order, and the order tasks are created in.
    schedule_order: Vec<usize>,
}

impl Graph {
    pub fn dag_name(&self) -> &str {
        &self.dag_name
    }

    pub fn task_count(&self) -> usize {
        self.names.len()
    }

    /// Task names in name order.
    pub fn tasks(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// Task names by wave, then name: the order tasks become ready when everything succeeds.
    pub fn schedule_order(&self) -> impl Iterator<Item = &str> {
        self.schedule_order
            .iter()
            .map(|&id| self.names[id].as_str())
    }

    /// The dependencies of `task` in name order, without repeats; `None` for an unknown task.
    pub fn dependencies(&self, task: &str) -> Option<impl Iterator<Item = &str>> {
        let id = *self.index.get(task)?;
        Some(
            self.dependencies[id]
                .iter()
                .map(|&dep| self.names[dep].as_str()),
        )
    }

    /// 0 for a task without dependencies, else 1 + the largest wave among its dependencies.
    pub fn wave(&self, task: &str) -> Option<usize> {
        self.index.get(task).map(|&id| self.waves[id])
    }

    /// The name of the child AxTask that runs `task`.
    pub fn child_name(&self, task: &str) -> String {
        child_name(&self.dag_name, task)
    }
}

/// Checks the tasks of DAG `dag_name` and builds its graph. The first problem found is reported, in
/// this order: no tasks; per task in spec order a bad name or a duplicate; per task in spec order a
/// self-dependency or an unknown dependency; a cycle (the one through the smallest task name on any
/// cycle, shortest such). Repeated entries in one `depends_on` are harmless and merged.
pub fn validate(dag_name: &str, nodes: &[DagNode]) -> Result<Graph, DagError> {
    if nodes.is_empty() {
        return Err(DagError::Empty);
    }
    let mut seen = HashSet::with_capacity(nodes.len());
    for node in nodes {
        check_task_name(dag_name, &node.name)?;
        if !seen.insert(node.name.as_str()) {
            return Err(DagError::DuplicateName {
                task: node.name.clone(),
            });
        }
    }

    let mut names: Vec<String> = nodes.iter().map(|node| node.name.clone()).collect();
    names.sort_unstable();
    let index: HashMap<String, usize> = names
        .iter()
        .enumerate()
        .map(|(id, name)| (name.clone(), id))
        .collect();

    let mut dependencies = vec![Vec::new(); names.len()];
    for node in nodes {
        let mut deps = Vec::with_capacity(node.depends_on.len());
        for dependency in &node.depends_on {
            if *dependency == node.name {
                return Err(DagError::SelfDependency {
                    task: node.name.clone(),
                });
            }
            match index.get(dependency) {
                Some(&dep) => deps.push(dep),
                None => {
                    return Err(DagError::UnknownDependency {
                        task: node.name.clone(),
                        dependency: dependency.clone(),
                    });
                }
            }
        }
        deps.sort_unstable();
        deps.dedup();
        if let Some(&id) = index.get(&node.name) {
            dependencies[id] = deps;
        }
    }

    // Nodes are visited in increasing order, so every list of dependents comes out sorted.
    let mut dependents = vec![Vec::new(); names.len()];
    for (id, deps) in dependencies.iter().enumerate() {
        for &dep in deps {
            dependents[dep].push(id);
        }
    }

    let Some(waves) = waves_if_acyclic(&dependencies, &dependents) else {
        let path = find_cycle(&dependencies, &dependents).unwrap_or_default();
        return Err(DagError::Cycle {
            path: path.into_iter().map(|id| names[id].clone()).collect(),
        });
    };
    let mut schedule_order: Vec<usize> = (0..names.len()).collect();
    schedule_order.sort_unstable_by_key(|&id| (waves[id], id));

    Ok(Graph {
        dag_name: dag_name.to_owned(),
        names,
        index,
        dependencies,
        waves,
        schedule_order,
    })
}

fn check_task_name(dag_name: &str, task: &str) -> Result<(), DagError> {
    if !is_dns1123_label(task) {
        return Err(DagError::InvalidName {
            task: task.to_owned(),
        });
    }
    let child = child_name(dag_name, task);
    if child.len() > MAX_CHILD_NAME_LEN {
        return Err(DagError::NameTooLong {
            task: task.to_owned(),
            len: child.len(),
            child,
        });
    }
    Ok(())
}

fn is_dns1123_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && alphanumeric(first)
                && alphanumeric(last)
                && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
        }
        _ => false,
    }
}

/// Kahn's algorithm; `None` when some nodes lie on or behind a cycle.
fn waves_if_acyclic(dependencies: &[Vec<usize>], dependents: &[Vec<usize>]) -> Option<Vec<usize>> {
    let mut waiting_on: Vec<usize> = dependencies.iter().map(Vec::len).collect();
    let mut waves = vec![0; dependencies.len()];
    let mut ready: VecDeque<usize> = (0..dependencies.len())
        .filter(|&id| waiting_on[id] == 0)
        .collect();
    let mut ordered = 0;
    while let Some(id) = ready.pop_front() {
        ordered += 1;
        for &next in &dependents[id] {
            waves[next] = waves[next].max(waves[id] + 1);
            waiting_on[next] -= 1;
            if waiting_on[next] == 0 {
                ready.push_back(next);
            }
        }
    }
    (ordered == dependencies.len()).then_some(waves)
}

/// The shortest cycle through the smallest node that lies on any cycle, as a path along
/// dependency → dependent edges that starts and ends with that node. Strongly connected components
/// (Kosaraju) tell which nodes lie on a cycle: with self-dependencies rejected, exactly those in a
/// component of two or more nodes.
fn find_cycle(dependencies: &[Vec<usize>], dependents: &[Vec<usize>]) -> Option<Vec<usize>> {
    let count = dependencies.len();
    let finish_order = post_order(dependents);
    let mut component = vec![usize::MAX; count];
    let mut component_sizes = Vec::new();
    for &root in finish_order.iter().rev() {
        if component[root] != usize::MAX {
            continue;
        }
        let current = component_sizes.len();
        let mut size = 0;
        component[root] = current;
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            size += 1;
            for &dep in &dependencies[id] {
                if component[dep] == usize::MAX {
                    component[dep] = current;
                    stack.push(dep);
                }
            }
        }
        component_sizes.push(size);
    }
    let start = (0..count).find(|&id| component_sizes[component[id]] > 1)?;

    // Breadth-first inside the component, neighbours in name order: the shortest cycle, deterministic.
    let mut parent = vec![usize::MAX; count];
    parent[start] = start;
    let mut queue = VecDeque::from([start]);
    while let Some(id) = queue.pop_front() {
        for &next in &dependents[id] {
            if next == start {
                let mut backwards = vec![start];
                let mut at = id;
                while at != start {
                    backwards.push(at);
                    at = parent[at];
                }
                backwards.push(start);
                backwards.reverse();
                return Some(backwards);
            }
            if component[next] == component[start] && parent[next] == usize::MAX {
                parent[next] = id;
                queue.push_back(next);
            }
        }
    }
    None
}

/// Depth-first post-order over every node, iterative so deep graphs cannot overflow the stack.
fn post_order(edges: &[Vec<usize>]) -> Vec<usize> {
    let mut visited = vec![false; edges.len()];
    let mut order = Vec::with_capacity(edges.len());
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..edges.len() {
        if visited[root] {
            continue;
        }
        visited[root] = true;
        stack.push((root, 0));
        while let Some(top) = stack.last_mut() {
            let id = top.0;
            match edges[id].get(top.1) {
                Some(&next) => {
                    top.1 += 1;
                    if !visited[next] {
                        visited[next] = true;
                        stack.push((next, 0));
                    }
                }
                None => {
                    order.push(id);
                    stack.pop();
                }
            }
        }
    }
    order
}

/// One node as the DAG status reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub phase: DagNodePhase,
}

/// What to do now, and the status to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// Tasks whose child to create now, by wave then name.
    pub create: Vec<String>,
    /// Tasks whose child to cancel now (only when the DAG is canceled), in name order.
    pub cancel: Vec<String>,
    /// Tasks that will get no child, in name order.
    pub skipped: Vec<String>,
    /// Every node, in name order.
    pub nodes: Vec<NodeState>,
    /// Nodes that will not change again: Succeeded, Dead, Canceled or Skipped.
    pub finished: usize,
    pub total: usize,
    pub phase: DagPhase,
}

impl Evaluation {
    /// "finished/total", e.g. "3/5".
    pub fn progress(&self) -> String {
        format!("{}/{}", self.finished, self.total)
    }
}

/// Decides what to do with `graph` given the phase of each child that exists, keyed by task name
/// (entries for names that are not tasks of the graph are ignored). `parallelism` caps the children
/// that exist and are not terminal; `Some(0)` pauses creation. O(tasks + dependencies).
pub fn evaluate(
    graph: &Graph,
    children: &HashMap<String, TaskPhase>,
    failure_policy: FailurePolicy,
    parallelism: Option<u32>,
    cancel: bool,
) -> Evaluation {
    let child_phases: Vec<Option<TaskPhase>> = graph
        .names
        .iter()
        .map(|name| children.get(name).copied())
        .collect();
    let at_work = child_phases
        .iter()
        .flatten()
        .filter(|phase| !phase.is_terminal())
        .count();
    let any_final_failure = child_phases
        .iter()
        .flatten()
        .any(|phase| is_final_failure(*phase));
    let start_nothing = cancel || (failure_policy == FailurePolicy::FailFast && any_final_failure);
    let mut free_slots = parallelism.map_or(usize::MAX, |limit| {
        usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(at_work)
    });

    let mut node_phases = vec![DagNodePhase::NotStarted; graph.names.len()];
    let mut create = Vec::new();
    // Schedule order is topological: dependencies are decided before their dependents.
    for &id in &graph.schedule_order {
        node_phases[id] = match child_phases[id] {
            Some(phase) => node_phase(phase),
            None => {
                let deps = &graph.dependencies[id];
                if start_nothing || deps.iter().any(|&dep| blocks_dependents(node_phases[dep])) {
                    DagNodePhase::Skipped
                } else {
                    let ready = deps
                        .iter()
                        .all(|&dep| node_phases[dep] == DagNodePhase::Succeeded);
                    if ready && free_slots > 0 {
                        free_slots -= 1;
                        create.push(graph.names[id].clone());
                    }
                    DagNodePhase::NotStarted
                }
            }
        };
    }

    let cancel_now = if cancel {
        (0..graph.names.len())
            .filter(|&id| child_phases[id].is_some_and(|phase| !phase.is_terminal()))
            .map(|id| graph.names[id].clone())
            .collect()
    } else {
        Vec::new()
    };
    let skipped = (0..graph.names.len())
        .filter(|&id| node_phases[id] == DagNodePhase::Skipped)
        .map(|id| graph.names[id].clone())
        .collect();
    let nodes = graph
        .names
        .iter()
        .zip(&node_phases)
        .map(|(name, &phase)| NodeState {
            name: name.clone(),
            phase,
        })
        .collect();
    let total = node_phases.len();
    let finished = node_phases
        .iter()
        .filter(|phase| phase.is_terminal())
        .count();
    let phase = if finished == total {
        if node_phases
            .iter()
            .all(|&phase| phase == DagNodePhase::Succeeded)
        {
            DagPhase::Succeeded
        } else if cancel {
            DagPhase::Canceled
        } else {
            DagPhase::Failed
        }
    } else if child_phases.iter().all(Option::is_none) {
        DagPhase::Pending
    } else {
        DagPhase::Running
    };

    Evaluation {
        create,
        cancel: cancel_now,
        skipped,
        nodes,
        finished,
        total,
        phase,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    fn graph_of(nodes: &[(&str, &[&str])]) -> Graph {
        let nodes: Vec<DagNode> = nodes
            .iter()
            .map(|(name, deps)| DagNode::new(name, deps))
            .collect();
        match validate("dag", &nodes) {
            Ok(graph) => graph,
            Err(error) => panic!("valid test graph rejected: {error}"),
        }
    }

    fn phases(entries: &[(&str, TaskPhase)]) -> HashMap<String, TaskPhase> {
        entries
            .iter()
            .map(|&(name, phase)| (name.to_owned(), phase))
            .collect()
    }

    fn node_phase(evaluation: &Evaluation, task: &str) -> DagNodePhase {
        match evaluation.nodes.iter().find(|node| node.name == task) {
            Some(node) => node.phase,
            None => panic!("no node {task} in evaluation"),
        }
    }

    fn validation_error(nodes: &[DagNode]) -> String {
        match validate("dag", nodes) {
            Ok(_) => panic!("invalid graph accepted: {nodes:?}"),
            Err(error) => error.to_string(),
        }
    }

    fn diamond() -> Graph {
        graph_of(&[("d", &["b", "c"]), ("b", &["a"]), ("c", &["a"]), ("a", &[])])
    }

    use FailurePolicy::{ContinueIndependent, FailFast};
    use TaskPhase::{Canceled, Dead, Failed, Pending, Running, Scheduled, Succeeded, TimedOut};

    #[test]
    fn diamond_runs_in_waves_and_succeeds() {
        let graph = diamond();
        assert_eq!(
            graph.schedule_order().collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert_eq!(graph.wave("d"), Some(2));

        let step = |children: &[(&str, TaskPhase)]| {
            evaluate(&graph, &phases(children), FailFast, None, false)
        };
        let start = step(&[]);
        assert_eq!(start.create, ["a"]);
        assert_eq!(start.phase, DagPhase::Pending);
        assert_eq!(start.progress(), "0/4");
        assert_eq!(node_phase(&start, "a"), DagNodePhase::NotStarted);

        let a_running = step(&[("a", Running)]);
        assert!(a_running.create.is_empty());
        assert_eq!(a_running.phase, DagPhase::Running);

        let a_done = step(&[("a", Succeeded)]);
        assert_eq!(a_done.create, ["b", "c"]);
        assert_eq!(a_done.progress(), "1/4");

        let c_running = step(&[("a", Succeeded), ("b", Succeeded), ("c", Running)]);
        assert!(c_running.create.is_empty(), "d must wait for c");
        assert_eq!(c_running.phase, DagPhase::Running);

        let c_done = step(&[("a", Succeeded), ("b", Succeeded), ("c", Succeeded)]);
        assert_eq!(c_done.create, ["d"]);

        let all = step(&[
            ("a", Succeeded),
            ("b", Succeeded),
            ("c", Succeeded),
            ("d", Succeeded),
        ]);
        assert!(all.create.is_empty() && all.skipped.is_empty() && all.cancel.is_empty());
        assert_eq!(all.phase, DagPhase::Succeeded);
        assert_eq!(all.progress(), "4/4");
    }

    #[test]
    fn diamond_fail_fast_skips_at_once_and_fails_after_running_children_finish() {
        let graph = diamond();
        let running = evaluate(
            &graph,
            &phases(&[("a", Succeeded), ("b", Dead), ("c", Running)]),
            FailFast,
            None,
            false,
        );
        assert!(running.create.is_empty());
        assert_eq!(running.skipped, ["d"]);
        assert_eq!(running.phase, DagPhase::Running, "c is still at work");
        assert_eq!(running.progress(), "3/4");

        let done = evaluate(
            &graph,
            &phases(&[("a", Succeeded), ("b", Dead), ("c", Succeeded)]),
            FailFast,
            None,
            false,
        );
        assert_eq!(done.phase, DagPhase::Failed);
        assert_eq!(done.progress(), "4/4");
        assert_eq!(node_phase(&done, "d"), DagNodePhase::Skipped);
    }

    // a -> b -> d, a -> c -> e: the failure of b says nothing about e.
    fn two_branches() -> Graph {
        graph_of(&[
            ("a", &[]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &["b"]),
            ("e", &["c"]),
        ])
    }

    #[test]
    fn continue_independent_runs_what_does_not_depend_on_the_failure() {
        let graph = two_branches();
        let children = phases(&[("a", Succeeded), ("b", Dead), ("c", Succeeded)]);
        let independent = evaluate(&graph, &children, ContinueIndependent, None, false);
        assert_eq!(independent.create, ["e"]);
        assert_eq!(independent.skipped, ["d"]);
        assert_eq!(independent.phase, DagPhase::Running);

        let fail_fast = evaluate(&graph, &children, FailFast, None, false);
        assert!(fail_fast.create.is_empty());
        assert_eq!(fail_fast.skipped, ["d", "e"]);
        assert_eq!(fail_fast.phase, DagPhase::Failed);

        let finished = phases(&[
            ("a", Succeeded),
            ("b", Dead),
            ("c", Succeeded),
            ("e", Succeeded),
        ]);
        let end = evaluate(&graph, &finished, ContinueIndependent, None, false);
        assert_eq!(end.phase, DagPhase::Failed);
        assert_eq!(end.progress(), "5/5");
    }

    #[test]
    fn a_canceled_child_blocks_its_dependents_like_a_dead_one() {
        let graph = two_branches();
        let children = phases(&[("a", Succeeded), ("b", Canceled), ("c", Succeeded)]);
        let evaluation = evaluate(&graph, &children, ContinueIndependent, None, false);
        assert_eq!(evaluation.create, ["e"]);
        assert_eq!(evaluation.skipped, ["d"]);
        let fail_fast = evaluate(&graph, &children, FailFast, None, false);
        assert_eq!(fail_fast.skipped, ["d", "e"]);
    }

    #[test]
    fn transient_failures_block_nothing_and_occupy_a_slot() {
        let graph = two_branches();
        let children = phases(&[("a", Succeeded), ("b", Failed), ("c", TimedOut)]);
        let evaluation = evaluate(&graph, &children, FailFast, Some(3), false);
        assert!(evaluation.skipped.is_empty());
        assert!(evaluation.create.is_empty());
        assert_eq!(node_phase(&evaluation, "b"), DagNodePhase::Failed);
        assert_eq!(node_phase(&evaluation, "d"), DagNodePhase::NotStarted);
        assert_eq!(evaluation.progress(), "1/5");
        assert_eq!(evaluation.phase, DagPhase::Running);
    }

    #[test]
    fn a_dead_child_brought_back_by_hand_unskips_its_dependents() {
        let graph = diamond();
        let retried = evaluate(
            &graph,
            &phases(&[("a", Succeeded), ("b", Pending), ("c", Succeeded)]),
            FailFast,
            None,
            false,
        );
        assert!(retried.skipped.is_empty());
        assert_eq!(node_phase(&retried, "d"), DagNodePhase::NotStarted);
        assert_eq!(retried.phase, DagPhase::Running);
    }

    #[test]
    fn parallelism_caps_children_at_work_and_fills_by_wave_then_name() {
        let graph = graph_of(&[
            ("z", &[]),
            ("y", &[]),
            ("x", &[]),
            ("w", &["x"]),
            ("v", &[]),
        ]);
        let first = evaluate(&graph, &HashMap::new(), FailFast, Some(2), false);
        assert_eq!(first.create, ["v", "x"]);

        let one_busy = evaluate(
            &graph,
            &phases(&[("v", Running), ("x", Succeeded)]),
            FailFast,
            Some(2),
            false,
        );
        assert_eq!(one_busy.create, ["y"], "wave 0 before w in wave 1");

        let full = evaluate(
            &graph,
            &phases(&[("v", Scheduled), ("x", Failed)]),
            FailFast,
            Some(2),
            false,
        );
        assert!(full.create.is_empty());

        let over = evaluate(
            &graph,
            &phases(&[("v", Running), ("x", Running), ("y", Running)]),
            FailFast,
            Some(2),
            false,
        );
        assert!(
            over.create.is_empty(),
            "lowered parallelism creates nothing"
        );
    }

    #[test]
    fn zero_parallelism_pauses_creation() {
        let graph = diamond();
        let evaluation = evaluate(&graph, &HashMap::new(), FailFast, Some(0), false);
        assert!(evaluation.create.is_empty());
        assert_eq!(evaluation.phase, DagPhase::Pending);
    }

    #[test]
    fn cancel_stops_children_at_work_and_ends_canceled_once_they_stop() {
        let graph = two_branches();
        let canceling = evaluate(
            &graph,
            &phases(&[("a", Succeeded), ("b", Running), ("c", Failed)]),
            ContinueIndependent,
            None,
            true,
        );
        assert!(canceling.create.is_empty());
        assert_eq!(canceling.cancel, ["b", "c"]);
        assert_eq!(canceling.skipped, ["d", "e"]);
        assert_eq!(canceling.phase, DagPhase::Running);

        let canceled = evaluate(
            &graph,
            &phases(&[("a", Succeeded), ("b", Canceled), ("c", Canceled)]),
            ContinueIndependent,
            None,
            true,
        );
        assert!(canceled.cancel.is_empty());
        assert_eq!(canceled.phase, DagPhase::Canceled);
        assert_eq!(canceled.progress(), "5/5");

        let before_start = evaluate(&graph, &HashMap::new(), FailFast, None, true);
        assert_eq!(before_start.phase, DagPhase::Canceled);
        assert_eq!(before_start.skipped.len(), 5);

        let all_done: Vec<(&str, TaskPhase)> =
            graph.tasks().map(|task| (task, Succeeded)).collect();
        let too_late = evaluate(&graph, &phases(&all_done), FailFast, None, true);
        assert_eq!(too_late.phase, DagPhase::Succeeded);
    }

    #[test]
    fn children_that_are_not_tasks_are_ignored() {
        let graph = diamond();
        let evaluation = evaluate(
            &graph,
            &phases(&[("gone", Running)]),
            FailFast,
            Some(1),
            true,
        );
        assert!(evaluation.cancel.is_empty());
        assert_eq!(evaluation.phase, DagPhase::Canceled);
    }

    #[test]
    fn repeated_dependencies_are_merged() {
        let graph = graph_of(&[("a", &[]), ("b", &["a", "a"])]);
        let deps: Vec<&str> = graph.dependencies("b").into_iter().flatten().collect();
        assert_eq!(deps, ["a"]);
        assert!(graph.dependencies("nope").is_none());
    }

    #[test]
    fn child_names_join_dag_and_task() {
        let graph = diamond();
        assert_eq!(graph.child_name("a"), "dag-a");
        assert_eq!(graph.dag_name(), "dag");
        assert_eq!(graph.task_count(), 4);
    }

    #[test]
    fn nodes_deserialize_from_the_spec_shape() {
        let node: DagNode = match serde_json::from_str(r#"{"name":"b","dependsOn":["a"]}"#) {
            Ok(node) => node,
            Err(error) => panic!("{error}"),
        };
        assert_eq!(node, DagNode::new("b", &["a"]));
        let root: DagNode = match serde_json::from_str(r#"{"name":"a"}"#) {
            Ok(node) => node,
            Err(error) => panic!("{error}"),
        };
        assert!(root.depends_on.is_empty());
    }

    #[test]
    fn error_messages() {
        assert_eq!(validation_error(&[]), "the DAG has no tasks");
        assert_eq!(
            validation_error(&[DagNode::new("Build", &[])]),
            "task name `Build` is not a DNS-1123 label (lowercase letters, digits and '-', \
             starting and ending with a letter or digit)"
        );
        let long = "t".repeat(60);
        assert_eq!(
            validation_error(&[DagNode::new(&long, &[])]),
            format!("task `{long}`: child name `dag-{long}` is 64 characters, more than 63")
        );
        assert_eq!(
            validation_error(&[DagNode::new("a", &[]), DagNode::new("a", &[])]),
            "task `a` is defined more than once"
        );
        assert_eq!(
            validation_error(&[DagNode::new("a", &["a"])]),
            "task `a` depends on itself"
        );
        assert_eq!(
            validation_error(&[DagNode::new("a", &[]), DagNode::new("b", &["a", "zz"])]),
            "task `b` depends on `zz`, which is not a task of this DAG"
        );
        assert_eq!(
            validation_error(&[
                DagNode::new("c", &["b"]),
                DagNode::new("b", &["c"]),
                DagNode::new("a", &[]),
            ]),
            "dependency cycle: b -> c -> b"
        );
        // x needs z, z needs y, y needs x; w hangs below the cycle and is not part of it.
        assert_eq!(
            validation_error(&[
                DagNode::new("w", &["z"]),
                DagNode::new("x", &["z"]),
                DagNode::new("y", &["x"]),
                DagNode::new("z", &["y"]),
            ]),
            "dependency cycle: x -> y -> z -> x"
        );
    }

    #[test]
    fn name_rules() {
        for bad in ["", "-a", "a-", "a_b", "a.b", "A", "é"] {
            assert!(
                matches!(
                    validate("dag", &[DagNode::new(bad, &[])]),
                    Err(DagError::InvalidName { .. })
                ),
                "{bad:?} accepted"
            );
        }
        for good in ["a", "0", "a-b", "1-2-x"] {
            assert!(
                validate("dag", &[DagNode::new(good, &[])]).is_ok(),
                "{good:?}"
            );
        }
        let longest = "t".repeat(MAX_CHILD_NAME_LEN - "dag-".len());
        assert!(validate("dag", &[DagNode::new(&longest, &[])]).is_ok());
        assert!(matches!(
            validate("dag", &[DagNode::new(&format!("{longest}t"), &[])]),
            Err(DagError::NameTooLong { len: 64, .. })
        ));
    }

    #[test]
    fn first_problem_in_spec_order_is_reported() {
        let nodes = [DagNode::new("b", &["missing"]), DagNode::new("a", &["a"])];
        assert_eq!(
            validate("dag", &nodes),
            Err(DagError::UnknownDependency {
                task: "b".into(),
                dependency: "missing".into()
            })
        );
    }

    #[test]
    fn a_deep_chain_does_not_overflow_the_stack() {
        let count = 100_000;
        let mut nodes: Vec<DagNode> = (0..count)
            .map(|i| DagNode {
                name: format!("n{i}"),
                depends_on: if i == 0 {
                    Vec::new()
                } else {
                    vec![format!("n{}", i - 1)]
                },
            })
            .collect();
        nodes[0].depends_on.push(format!("n{}", count - 1));
        match validate("d", &nodes) {
            Err(DagError::Cycle { path }) => assert_eq!(path.len(), count + 1),
            other => panic!("expected a cycle, got {other:?}"),
        }
    }

    /// Small deterministic generator so a failing case replays from its seed.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, bound: usize) -> usize {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let value = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
            usize::try_from(value % bound as u64).unwrap_or(0)
        }
    }

    /// Random DAGs of 1..=200 tasks: node i depends only on lower-indexed nodes, names are a random
    /// permutation (so name order is unrelated to dependency order) and the spec lists the nodes
    /// shuffled. Returned in index order (node i depends on lower indices only) and spec order.
    fn random_dag() -> impl Strategy<Value = (Vec<DagNode>, Vec<DagNode>)> {
        (1usize..=200)
            .prop_flat_map(|count| {
                (
                    proptest::collection::vec(
                        proptest::collection::vec(any::<Index>(), 0..4),
                        count,
                    ),
                    Just((0..count).collect::<Vec<_>>()).prop_shuffle(),
                    Just((0..count).collect::<Vec<_>>()).prop_shuffle(),
                )
            })
            .prop_map(|(picks, names, spec_order)| {
                let by_index: Vec<DagNode> = picks
                    .iter()
                    .enumerate()
                    .map(|(i, picks)| DagNode {
                        name: format!("t{}", names[i]),
                        depends_on: if i == 0 {
                            Vec::new()
                        } else {
                            picks
                                .iter()
                                .map(|pick| format!("t{}", names[pick.index(i)]))
                                .collect()
                        },
                    })
                    .collect();
                let spec = spec_order.iter().map(|&i| by_index[i].clone()).collect();
                (by_index, spec)
            })
    }

    fn must_validate(nodes: &[DagNode]) -> Graph {
        match validate("dag", nodes) {
            Ok(graph) => graph,
            Err(error) => panic!("random DAG rejected: {error}"),
        }
    }

    /// Every task downstream of `root` (not `root` itself), computed without the graph.
    fn downstream(nodes: &[DagNode], root: &str) -> HashSet<String> {
        let mut found: HashSet<String> = HashSet::new();
        let mut frontier = vec![root.to_owned()];
        while let Some(task) = frontier.pop() {
            for node in nodes {
                if node.depends_on.contains(&task) && found.insert(node.name.clone()) {
                    frontier.push(node.name.clone());
                }
            }
        }
        found
    }

    fn is_at_work(phase: TaskPhase) -> bool {
        !phase.is_terminal()
    }

    /// Checks that hold for every evaluation, whatever the children's phases.
    fn check_evaluation(
        graph: &Graph,
        children: &HashMap<String, TaskPhase>,
        evaluation: &Evaluation,
        policy: FailurePolicy,
        parallelism: Option<u32>,
    ) {
        let mut created_now = HashSet::new();
        for task in &evaluation.create {
            assert!(created_now.insert(task), "{task} created twice at once");
            assert!(!children.contains_key(task), "{task} created again");
            for dep in graph.dependencies(task).into_iter().flatten() {
                assert_eq!(
                    children.get(dep),
                    Some(&Succeeded),
                    "{task} ready before its dependency {dep} succeeded"
                );
            }
        }
        let keys: Vec<(usize, &str)> = evaluation
            .create
            .iter()
            .map(|task| (graph.wave(task).unwrap_or(usize::MAX), task.as_str()))
            .collect();
        assert!(
            keys.is_sorted(),
            "creation order not by wave then name: {keys:?}"
        );

        let at_work = children
            .values()
            .filter(|&&phase| is_at_work(phase))
            .count();
        if let Some(limit) = parallelism {
            assert!(
                at_work + evaluation.create.len() <= limit as usize,
                "parallelism {limit} exceeded: {at_work} at work + {} new",
                evaluation.create.len()
            );
        }
        if policy == FailFast && children.values().any(|phase| is_final_failure(*phase)) {
            assert!(evaluation.create.is_empty(), "new task after a failure");
        }
        for task in &evaluation.skipped {
            assert!(!children.contains_key(task));
        }
        assert!(evaluation.cancel.is_empty());

        assert_eq!(evaluation.total, graph.task_count());
        assert_eq!(evaluation.nodes.len(), graph.task_count());
        for node in &evaluation.nodes {
            if let Some(&phase) = children.get(&node.name) {
                assert_eq!(node.phase, super::node_phase(phase));
            }
        }
        let finished = evaluation
            .nodes
            .iter()
            .filter(|node| node.phase.is_terminal())
            .count();
        assert_eq!(evaluation.finished, finished);
        assert_eq!(
            evaluation.phase.is_terminal(),
            finished == evaluation.total,
            "terminal phase iff every node finished"
        );
        if evaluation.phase.is_terminal() {
            assert_eq!(at_work, 0, "terminal DAG with children at work");
            assert!(evaluation.create.is_empty());
        }
    }

    struct Outcome {
        final_evaluation: Evaluation,
        children: HashMap<String, TaskPhase>,
        created: Vec<String>,
    }

    /// Runs the DAG to the end: creates what evaluation asks for, then moves one random child at
    /// work a step forward (Pending → Scheduled → Running → Succeeded, sometimes through a
    /// transient Failed/TimedOut and a retry). `doomed` goes Dead instead of succeeding.
    fn simulate(
        graph: &Graph,
        policy: FailurePolicy,
        parallelism: Option<u32>,
        doomed: Option<&str>,
        seed: u64,
    ) -> Outcome {
        let mut rng = Rng(seed | 1);
        let mut children: HashMap<String, TaskPhase> = HashMap::new();
        let mut failures: HashMap<String, u32> = HashMap::new();
        let mut created = Vec::new();
        let step_limit = 20 * graph.task_count() + 10;
        for _ in 0..step_limit {
            let evaluation = evaluate(graph, &children, policy, parallelism, false);
            check_evaluation(graph, &children, &evaluation, policy, parallelism);
            if evaluation.phase.is_terminal() {
                return Outcome {
                    final_evaluation: evaluation,
                    children,
                    created,
                };
            }
            for task in evaluation.create {
                children.insert(task.clone(), Pending);
                created.push(task);
            }
            let mut at_work: Vec<&String> = children
                .iter()
                .filter(|&(_, &phase)| is_at_work(phase))
                .map(|(task, _)| task)
                .collect();
            assert!(
                !at_work.is_empty(),
                "stuck: nothing at work, nothing to create"
            );
            at_work.sort();
            let task = at_work[rng.below(at_work.len())].clone();
            let next = match children[&task] {
                Pending => Scheduled,
                Scheduled => Running,
                Running if doomed == Some(task.as_str()) => Dead,
                Running if rng.below(6) == 0 && failures.get(&task).copied().unwrap_or(0) < 2 => {
                    *failures.entry(task.clone()).or_default() += 1;
                    if rng.below(2) == 0 { Failed } else { TimedOut }
                }
                Running => Succeeded,
                Failed | TimedOut => Pending,
                terminal => terminal,
            };
            children.insert(task, next);
        }
        panic!("the DAG did not finish within {step_limit} steps");
    }

    fn parallelism_strategy() -> impl Strategy<Value = Option<u32>> {
        prop_oneof![Just(None), (1u32..=6).prop_map(Some)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_task_runs_once_after_its_dependencies_and_the_dag_succeeds(
            (by_index, spec) in random_dag(),
            parallelism in parallelism_strategy(),
            policy in prop_oneof![Just(FailFast), Just(ContinueIndependent)],
            seed in any::<u64>(),
        ) {
            let graph = must_validate(&spec);
            let outcome = simulate(&graph, policy, parallelism, None, seed);
            prop_assert_eq!(outcome.final_evaluation.phase, DagPhase::Succeeded);
            prop_assert_eq!(outcome.created.len(), by_index.len());
            let distinct: HashSet<&String> = outcome.created.iter().collect();
            prop_assert_eq!(distinct.len(), by_index.len());
            prop_assert!(outcome.final_evaluation.skipped.is_empty());
            prop_assert_eq!(
                outcome.final_evaluation.progress(),
                format!("{0}/{0}", by_index.len())
            );
        }

        #[test]
        fn without_a_limit_tasks_start_in_topological_waves(
            (by_index, spec) in random_dag(),
        ) {
            let graph = must_validate(&spec);
            // Expected wave of node i, computed from the index-ordered spec alone.
            let mut expected_wave: HashMap<&str, usize> = HashMap::new();
            for node in &by_index {
                let wave = node
                    .depends_on
                    .iter()
                    .map(|dep| expected_wave[dep.as_str()] + 1)
                    .max()
                    .unwrap_or(0);
                expected_wave.insert(node.name.as_str(), wave);
            }
            // Lockstep: everything at work succeeds before the next evaluation.
            let mut children = HashMap::new();
            for wave in 0.. {
                let evaluation = evaluate(&graph, &children, FailFast, None, false);
                check_evaluation(&graph, &children, &evaluation, FailFast, None);
                if evaluation.phase.is_terminal() {
                    prop_assert_eq!(evaluation.phase, DagPhase::Succeeded);
                    prop_assert_eq!(Some(wave), expected_wave.values().max().map(|max| max + 1));
                    break;
                }
                let mut expected: Vec<&str> = expected_wave
                    .iter()
                    .filter(|&(_, &w)| w == wave)
                    .map(|(&task, _)| task)
                    .collect();
                expected.sort_unstable();
                prop_assert_eq!(&evaluation.create, &expected);
                for task in evaluation.create {
                    children.insert(task, Succeeded);
                }
            }
        }

        #[test]
        fn fail_fast_starts_nothing_after_a_dead_task_and_fails(
            (by_index, spec) in random_dag(),
            doomed in any::<Index>(),
            parallelism in parallelism_strategy(),
            seed in any::<u64>(),
        ) {
            let graph = must_validate(&spec);
            let doomed = by_index[doomed.index(by_index.len())].name.clone();
            // check_evaluation asserts at every step that nothing is created after the death.
            let outcome = simulate(&graph, FailFast, parallelism, Some(&doomed), seed);
            prop_assert_eq!(outcome.final_evaluation.phase, DagPhase::Failed);
            prop_assert_eq!(outcome.children.get(&doomed), Some(&Dead));
            for node in &outcome.final_evaluation.nodes {
                match outcome.children.get(&node.name) {
                    Some(_) if node.name == doomed => {}
                    Some(_) => prop_assert_eq!(node.phase, DagNodePhase::Succeeded),
                    None => prop_assert_eq!(node.phase, DagNodePhase::Skipped),
                }
            }
        }

        #[test]
        fn continue_independent_runs_everything_not_downstream_of_a_dead_task(
            (by_index, spec) in random_dag(),
            doomed in any::<Index>(),
            parallelism in parallelism_strategy(),
            seed in any::<u64>(),
        ) {
            let graph = must_validate(&spec);
            let doomed = by_index[doomed.index(by_index.len())].name.clone();
            let blocked = downstream(&spec, &doomed);
            let outcome = simulate(&graph, ContinueIndependent, parallelism, Some(&doomed), seed);
            prop_assert_eq!(outcome.final_evaluation.phase, DagPhase::Failed);
            for node in &outcome.final_evaluation.nodes {
                let expected = if node.name == doomed {
                    DagNodePhase::Dead
                } else if blocked.contains(&node.name) {
                    DagNodePhase::Skipped
                } else {
                    DagNodePhase::Succeeded
                };
                prop_assert_eq!(node.phase, expected, "task {}", node.name);
            }
        }

        #[test]
        fn a_back_edge_is_reported_as_a_real_cycle(
            (by_index, _spec) in random_dag(),
            start in any::<Index>(),
            walk in proptest::collection::vec(any::<Index>(), 1..8),
            extra_back_edges in proptest::collection::vec((any::<Index>(), any::<Index>()), 0..3),
        ) {
            let mut nodes = by_index.clone();
            let position: HashMap<String, usize> = nodes
                .iter()
                .enumerate()
                .map(|(i, node)| (node.name.clone(), i))
                .collect();
            // Walk up the dependencies from a node with some, then make the ancestor depend on it.
            let with_deps: Vec<usize> = (0..nodes.len())
                .filter(|&i| !nodes[i].depends_on.is_empty())
                .collect();
            prop_assume!(!with_deps.is_empty());
            let low = with_deps[start.index(with_deps.len())];
            let mut ancestor = low;
            for step in &walk {
                let deps = &by_index[ancestor].depends_on;
                if deps.is_empty() {
                    break;
                }
                ancestor = position[&deps[step.index(deps.len())]];
            }
            let low_name = nodes[low].name.clone();
            nodes[ancestor].depends_on.push(low_name);
            for (from, to) in &extra_back_edges {
                // More edges against the index order: they may close further cycles, which must
                // not confuse the choice of the reported one.
                let (i, j) = (from.index(nodes.len()), to.index(nodes.len()));
                if i < j {
                    let name = nodes[j].name.clone();
                    nodes[i].depends_on.push(name);
                }
            }

            let path = match validate("dag", &nodes) {
                Err(DagError::Cycle { path }) => path,
                other => return Err(TestCaseError::fail(format!("expected a cycle, got {other:?}"))),
            };
            prop_assert!(path.len() >= 3);
            prop_assert_eq!(path.first(), path.last());
            let inner: HashSet<&String> = path[..path.len() - 1].iter().collect();
            prop_assert_eq!(inner.len(), path.len() - 1, "the cycle repeats a task: {:?}", path);
            let deps_of: HashMap<&str, &Vec<String>> = nodes
                .iter()
                .map(|node| (node.name.as_str(), &node.depends_on))
                .collect();
            for pair in path.windows(2) {
                prop_assert!(
                    deps_of[pair[1].as_str()].contains(&pair[0]),
                    "{} does not depend on {}", pair[1], pair[0]
                );
            }
            // The cycle starts at the smallest name among all tasks that lie on any cycle.
            let on_a_cycle = |name: &str| {
                let mut seen = HashSet::new();
                let mut frontier: Vec<&str> = deps_of[name].iter().map(String::as_str).collect();
                while let Some(task) = frontier.pop() {
                    if task == name {
                        return true;
                    }
                    if seen.insert(task) {
                        frontier.extend(deps_of[task].iter().map(String::as_str));
                    }
                }
                false
            };
            let smallest = nodes
                .iter()
                .map(|node| node.name.as_str())
                .filter(|&name| on_a_cycle(name))
                .min();
            prop_assert_eq!(smallest, Some(path[0].as_str()));
            let message = DagError::Cycle { path: path.clone() }.to_string();
            prop_assert_eq!(message, format!("dependency cycle: {}", path.join(" -> ")));
        }
    }
}
