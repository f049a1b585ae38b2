//! The AxDag reconciler: read the DAG and its children from the caches, decide with `core::dag`,
//! create and cancel children, write the status when it changed.
//!
//! Woken by the DAG's own changes and by its children's (the task informer wakes a child's
//! controller, see `context::OwnerWake`), never by polling.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::cache::CachedTask;
use super::expected::{EXPECTATION_TTL, Expected, Sight};
use super::owner_index::is_controlled_by;
use super::write::{self, ApiError};
use super::{Ctx, Error, FIELD_MANAGER, Result, cache};
use crate::api::{
    AxDag, AxDagStatus, AxTask, AxTaskSpec, DagItemsStatus, DagNodePhase, DagPhase, FailurePolicy,
    ForEach, LABEL_DAG, LABEL_DAG_ITEM, LABEL_DAG_TASK, TaskPhase, TraceContext,
};
use crate::core::conditions;
use crate::core::dag::exit::{self, ON_EXIT_TASK};
use crate::core::dag::fanout::{self, FanOut};
use crate::core::dag::inputs::{self, ParentResult};
use crate::core::dag::status::{
    graph_status, invalid_status, recorded_as, remember_finished_children,
};
use crate::core::dag::{self as core, DagNode};
use crate::core::trace::{self, TRACELINK_ANNOTATION, TRACEPARENT_ANNOTATION};

/// How soon to look again when a child's name is taken by an object this DAG does not own.
const NAME_TAKEN_RETRY: Duration = Duration::from_secs(30);

/// On every child: the child cannot disappear before this DAG has recorded how it finished, so a
/// child that Succeeded and was deleted (its `ttlSecondsAfterFinished`) is never run again.
pub const CHILD_FINALIZER: &str = "ax.dev/dag-child";

/// How often children whose DAG is gone are freed of their finalizer.
const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The `controller` label of the reconcile metrics.
const CONTROLLER: &str = "axdag";

/// Runs the AxDag controller until a shutdown signal: `dags` is the informer behind `ctx.dags`,
/// `children_changed` the DAGs whose children the task informer saw change.
pub async fn run(
    ctx: Ctx,
    dags: impl Stream<Item = Result<AxDag, watcher::Error>> + Send + 'static,
    children_changed: impl Stream<Item = ObjectRef<AxDag>> + Send + 'static,
) {
    let controller = Controller::for_stream(dags, ctx.dags.clone())
        .reconcile_on(children_changed)
        .with_config(super::run::controller_config())
        .shutdown_on_signal();
    let sweep = tokio::spawn(free_orphans(ctx.clone()));
    info!("AxDag controller running");
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "dag reconcile");
            }
        })
        .await;
    sweep.abort();
}

/// Children being deleted whose DAG is gone (deleted in the background) are never reconciled again:
/// their finalizer comes off here.
async fn free_orphans(ctx: Ctx) {
    let mut tick = tokio::time::interval(ORPHAN_SWEEP_EVERY);
    loop {
        tick.tick().await;
        if !super::cache_listed(&ctx.dags) || !super::cache_listed(&ctx.tasks) {
            continue;
        }
        // Controllers with children that are no DAG here: gone DAGs (or crons, whose children
        // carry no DAG label).
        let dag_uids: BTreeSet<String> = ctx.dags.state().iter().filter_map(|d| d.uid()).collect();
        let owners = ctx.tasks_by_owner.owners().into_iter();
        let orphans = owners
            .filter(|uid| !dag_uids.contains(uid))
            .flat_map(|uid| {
                let children = ctx.tasks_by_owner.children_of(&uid).into_iter();
                children.filter_map(|key| ctx.tasks.get(&key.object_ref())?.child().cloned())
            });
        for child in orphans.filter(|child| child.labels().contains_key(LABEL_DAG)) {
            let held = child.metadata.deletion_timestamp.is_some() && has_finalizer(&child);
            if held {
                let api: Api<AxTask> =
                    Api::namespaced(ctx.client.clone(), &child.namespace().unwrap_or_default());
                if let Err(e) = write::remove_finalizer(&api, child.as_ref(), CHILD_FINALIZER).await
                {
                    debug!(child = child.name_any(), error = %e, "freeing an orphaned child failed");
                }
            }
        }
    }
}

fn has_finalizer(child: &AxTask) -> bool {
    child.finalizers().iter().any(|f| f == CHILD_FINALIZER)
}

#[tracing::instrument(skip_all, fields(namespace = dag.namespace(), name = dag.name_any()))]
pub async fn reconcile(dag: Arc<AxDag>, ctx: Ctx) -> Result<Requeue> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    // A child missing from an incomplete cache would be created again: decide on a complete one.
    // Checked, not awaited: kube's `Store::wait_until_ready` wakes only the last of several
    // concurrent waiters (its oneshot keeps one waker), so parked reconciles would hang for good.
    if !super::cache_listed(&ctx.tasks) {
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let uid = dag.uid().ok_or(Error::Incomplete("uid"))?;
    let children = owned_children(&dag, &uid, &ctx);
    if dag.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references; there is
        // nothing left to record, so nothing may hold them.
        free_children(&dag, children.all(), &ctx).await?;
        return Ok(Requeue::await_change());
    }
    // Taken before any child is created: `startedAt` is never later than the first child.
    let now = Timestamp::now();
    let mut before = dag.status.clone().unwrap_or_default();

    let spec_nodes: Vec<DagNode> = dag
        .spec
        .tasks
        .iter()
        .map(|task| DagNode {
            name: task.name.clone(),
            depends_on: task.depends_on.clone(),
        })
        .collect();
    let valid = core::validate(&dag.name_any(), &spec_nodes)
        .map_err(|e| e.to_string())
        .and_then(|graph| Ok((graph, check_spec(&dag, &children)?)));
    let (graph, FanOuts { fan_outs, unusable }) = match valid {
        Ok(valid) => valid,
        Err(error) => {
            if dag.spec.cancel {
                cancel_children(&dag, children.all(), &ctx).await?;
            }
            let status = invalid_status(&dag, &before, &error, now);
            let written = write_and_publish(&dag, &before, status, false, &ctx).await?;
            return Ok(written.unwrap_or_else(Requeue::await_change));
        }
    };

    let rerun = start_rerun(&dag, &mut before, &children, &ctx).await?;
    let mut phases = child_phases(&children.tasks);
    let mut item_phases: HashMap<String, BTreeMap<u32, TaskPhase>> = children
        .items
        .iter()
        .map(|(task, items)| (task.clone(), child_phases(items)))
        .collect();
    for key in &rerun {
        // Its re-run request is in; the child's own reconcile takes it from there.
        key.set(&mut phases, &mut item_phases, TaskPhase::Pending);
    }
    let waiting_for_cache =
        fill_in_expected(&ctx.dag_children, &uid, &mut phases, &mut item_phases);
    // Items of a task that is no `forEach` (any more: the spec was edited) take no part.
    item_phases.retain(|task, _| fan_outs.contains_key(task));
    remember_finished_children(&before, &mut phases);

    // A `forEach` task counts in the graph by what its items give it, once it has started: one
    // step of its items per reconcile decides its phase, what to create and what to cancel.
    let step_of = |task: &String, items: &BTreeMap<u32, TaskPhase>| match unusable.get(task) {
        Some(why) => fanout::unusable(why.clone()),
        None => fanout::step(&fan_outs[task], items),
    };
    let mut steps: HashMap<String, fanout::Step> = item_phases
        .iter()
        .map(|(task, items)| (task.clone(), step_of(task, items)))
        .collect();
    let node_phase = |step: &fanout::Step| match step.phase() {
        TaskPhase::Dead if dag.spec.cancel => TaskPhase::Canceled,
        phase => phase,
    };
    for (task, step) in &steps {
        phases.insert(task.clone(), node_phase(step));
    }

    let policy = dag.spec.failure_policy;
    let parallelism = dag
        .spec
        .parallelism
        .map(|limit| u32::try_from(limit).unwrap_or(0));
    let mut evaluation = core::evaluate(&graph, &phases, policy, parallelism, dag.spec.cancel);
    let create = std::mem::take(&mut evaluation.create);
    if !create.is_empty() {
        for task in &create {
            let phase = match fan_outs.get(task) {
                Some(_) => {
                    let step = step_of(task, &BTreeMap::new());
                    let phase = node_phase(&step);
                    steps.insert(task.clone(), step);
                    phase
                }
                None => TaskPhase::Pending,
            };
            phases.insert(task.clone(), phase);
        }
        // The status reports the children about to be created.
        evaluation = core::evaluate(&graph, &phases, policy, parallelism, dag.spec.cancel);
    }

    // Items to create now: none once the DAG creates nothing more (canceled, or a task failed
    // under FailFast); a failed `forEach` task stops its own items.
    let stopped = dag.spec.cancel
        || (policy == FailurePolicy::FailFast
            && evaluation
                .nodes
                .iter()
                .any(|n| matches!(n.phase, DagNodePhase::Dead | DagNodePhase::Canceled)));
    let mut create_items: Vec<(String, u32)> = Vec::new();
    let mut cancel_items: Vec<&Arc<CachedTask>> = Vec::new();
    for (task, step) in &mut steps {
        if !stopped {
            // The status then counts them at work.
            create_items.extend(step.take_create().into_iter().map(|i| (task.clone(), i)));
        }
        let node_items = children.items.get(task);
        let at_work = |i: &u32| node_items.and_then(|items| items.get(i));
        if evaluation.cancel.contains(task) {
            cancel_items.extend(node_items.into_iter().flat_map(|items| items.values()));
        } else {
            cancel_items.extend(step.cancel.iter().filter_map(at_work));
        }
    }
    let plain = evaluation
        .cancel
        .iter()
        .filter_map(|t| children.tasks.get(t));
    cancel_children(&dag, plain.chain(cancel_items), &ctx).await?;
    let items_status: HashMap<String, DagItemsStatus> = steps
        .iter()
        .map(|(task, step)| (task.clone(), step.status(&fan_outs[task])))
        .collect();
    let create: Vec<String> = create
        .into_iter()
        .filter(|task| !fan_outs.contains_key(task))
        .collect();

    let mut status = graph_status(&graph, &dag, &before, &evaluation, &items_status, now);
    let on_exit = dag.spec.on_exit.as_ref().map(|_| {
        let phase = status.phase.unwrap_or_default();
        let child = phases.get(ON_EXIT_TASK).copied();
        exit::decide(&dag.name_any(), phase, before.on_exit.as_ref(), child)
    });
    let create_exit = on_exit.as_ref().is_some_and(|decided| decided.create);
    if let Some(decided) = on_exit {
        status.on_exit = decided.status;
    }
    // The cache keeps no task's spec: read the specs of the children to create. Only this
    // generation's may be used (a generation is one spec, so the decision above holds).
    let wanted: BTreeSet<&str> = create
        .iter()
        .map(String::as_str)
        .chain(create_items.iter().map(|(task, _)| task.as_str()))
        .chain(create_exit.then_some(ON_EXIT_TASK))
        .collect();
    let specs = if wanted.is_empty() {
        HashMap::new()
    } else {
        match task_specs(&dag, &wanted, &ctx).await? {
            Some(specs) => specs,
            // Edited or deleted since the cache's copy: its watch event brings the next reconcile.
            None => return Ok(Requeue::await_change()),
        }
    };
    if status.trace.is_none() && !status.phase.is_some_and(DagPhase::is_terminal) {
        status.trace = trace_of(&dag, &uid, &ctx);
    }
    let original = dag.status.clone().unwrap_or_default();
    // Status before children: the write is preconditioned on the resourceVersion this decision
    // read, so children are created only from the DAG's latest status. A child that finished, was
    // recorded and then deleted (its finalizer comes off only after the record) is missing from the
    // children cache at once, while the cached DAG may not show the record yet; deciding on that
    // copy would run the child a second time. Written even when unchanged, for the same check.
    let must_write = !wanted.is_empty();
    let exit_failed = |s: &AxDagStatus| {
        s.on_exit
            .as_ref()
            .is_some_and(|n| n.phase == DagNodePhase::Dead)
    };
    let publish_exit_failed = exit_failed(&status) && !exit_failed(&original);
    let Some(requeue) =
        write_and_publish(&dag, &original, status.clone(), must_write, &ctx).await?
    else {
        return Ok(Requeue::await_change());
    };
    if publish_exit_failed {
        let note = "the exit handler (spec.onExit) is Dead; the DAG's phase stands";
        publish(&dag, EventType::Warning, "OnExitFailed", note, &ctx);
    }
    let traceparent = status
        .trace
        .as_ref()
        .map(|t| trace::child_traceparent(t, &uid, status.observed_rerun));
    let new_children = create
        .iter()
        .map(|task| -> Result<NewChild> {
            let (spec, _) = specs.get(task).ok_or(Error::Incomplete("task in spec"))?;
            let parents: Vec<&str> = graph.dependencies(task).into_iter().flatten().collect();
            let spec = match parents.is_empty() {
                true => spec.clone(),
                false => {
                    let results = parents.into_iter().map(|parent| {
                        (
                            parent,
                            parent_result(parent, &children, &items_status, &before),
                        )
                    });
                    inputs::child_spec(spec, inputs::inputs(results))
                }
            };
            Ok(NewChild {
                key: ChildKey::Task(task.clone()),
                name: graph.child_name(task),
                spec,
            })
        })
        .chain(create_items.iter().map(|(task, index)| {
            let (spec, for_each) = specs.get(task).ok_or(Error::Incomplete("task in spec"))?;
            let item = for_each
                .as_ref()
                .and_then(|f| item_of(task, f, *index, &children, &before))
                .ok_or(Error::Incomplete("item in spec"))?;
            Ok(NewChild {
                key: ChildKey::Item(task.clone(), *index),
                name: fanout::item_child_name(&dag.name_any(), task, *index),
                spec: fanout::item_spec(spec, *index, item),
            })
        }))
        .chain(create_exit.then(|| {
            let (spec, _) = specs
                .get(ON_EXIT_TASK)
                .ok_or(Error::Incomplete("onExit in spec"))?;
            Ok(NewChild {
                key: ChildKey::Task(ON_EXIT_TASK.to_owned()),
                name: graph.child_name(ON_EXIT_TASK),
                spec: exit::spec(spec, &dag.name_any(), &status),
            })
        }))
        .collect::<Result<Vec<_>>>()?;
    // Concurrently: a `forEach` task starts up to its parallelism of children at once.
    let created: Vec<Result<(ChildKey, Created)>> = futures::stream::iter(new_children)
        .map(|child| {
            let (dag, uid, ctx, traceparent) = (&dag, &uid, &ctx, traceparent.clone());
            async move {
                let created = create_child(dag, uid, &child, traceparent, ctx).await?;
                Ok((child.key, created))
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    // Every child created is expected before any error is returned: a lagging cache must not
    // count it missing (and exceed a parallelism).
    let mut name_taken = false;
    let mut first_error = None;
    for result in created {
        match result {
            Ok((key, Created::Yes)) => {
                ctx.dag_children
                    .created(&uid, &key.expected(), (), Instant::now())
            }
            Ok((_, Created::NameTaken)) => name_taken = true,
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    // Recorded: children being deleted may go now. A `forEach` task's items are their own record
    // (the status keeps counts only): they stay while the DAG does. So does a child's output
    // until the DAG ends: its dependents get it as input when they are created.
    let dag_ended = status.phase.is_some_and(DagPhase::is_terminal);
    let recorded = children.tasks.iter().filter(|(task, child)| {
        if child.has_output() && !dag_ended {
            return false;
        }
        let phase = child.child_phase();
        let node = match dag.spec.on_exit.is_some() && *task == ON_EXIT_TASK {
            true => status.on_exit.as_ref(),
            false => status.nodes.get(*task),
        };
        !phase.is_terminal() || node.is_some_and(|n| recorded_as(n, phase))
    });
    free_children(&dag, recorded.map(|(_, child)| child), &ctx).await?;
    Ok(if name_taken {
        Requeue::requeue(NAME_TAKEN_RETRY)
    } else if waiting_for_cache {
        // A child created but never seen (deleted at once): look again when its expectation ends.
        Requeue::requeue(EXPECTATION_TTL)
    } else {
        requeue
    })
}

/// Children created at once by one reconcile.
const CREATE_CONCURRENCY: usize = 16;

/// The `forEach` tasks of a DAG.
struct FanOuts {
    /// By task name.
    fan_outs: HashMap<String, FanOut>,
    /// Those whose items cannot be known, with why: a `fromOutput` whose parent succeeded without
    /// the list.
    unusable: HashMap<String, String>,
}

/// The `forEach` tasks of `dag`, or why one cannot run (or a task has the exit handler's name).
/// A `fromOutput` task has its parent's list's items once the parent has succeeded.
fn check_spec(dag: &AxDag, children: &Children) -> std::result::Result<FanOuts, String> {
    let dag_name = dag.name_any();
    if dag.spec.on_exit.is_some() {
        for task in &dag.spec.tasks {
            exit::check_task_name(&task.name)?;
        }
    }
    let mut fan_outs = FanOuts {
        fan_outs: HashMap::new(),
        unusable: HashMap::new(),
    };
    let no_status = AxDagStatus::default();
    let recorded = dag.status.as_ref().unwrap_or(&no_status);
    for task in &dag.spec.tasks {
        let Some(for_each) = task.for_each.as_ref() else {
            continue;
        };
        if let Some(from) = &for_each.from_output {
            let parent = dag.spec.tasks.iter().find(|t| t.name == from.task);
            if parent.is_some_and(|p| p.for_each.is_some()) {
                return Err(format!(
                    "task `{}`: forEach.fromOutput.task `{}` is a forEach task, which has no output of its own",
                    task.name, from.task
                ));
            }
        }
        let output_items = match output_list(&task.name, for_each, children, recorded) {
            None => None,
            Some(Ok(items)) => Some(items.len()),
            Some(Err(why)) => {
                fan_outs.unusable.insert(task.name.clone(), why);
                Some(0)
            }
        };
        let fan_out = fanout::of_spec(
            &dag_name,
            &task.name,
            &task.depends_on,
            for_each,
            output_items,
        )?;
        fan_outs.fan_outs.insert(task.name.clone(), fan_out);
    }
    Ok(fan_outs)
}

/// The list the `fromOutput` of `task` names, once its parent has succeeded (or why there is
/// none); `None` before, or when `for_each` is no `fromOutput`.
fn output_list<'a>(
    task: &str,
    for_each: &ForEach,
    children: &'a Children,
    recorded: &AxDagStatus,
) -> Option<std::result::Result<&'a [serde_json::Value], String>> {
    let from = for_each.from_output.as_ref()?;
    let Some(parent) = children.tasks.get(&from.task) else {
        // Gone after its end was recorded (its finalizer taken off by hand): so is its output.
        let recorded = recorded.nodes.get(&from.task);
        return recorded
            .is_some_and(|node| node.phase == DagNodePhase::Succeeded)
            .then(|| {
                Err(format!(
                    "task `{task}`: forEach.fromOutput: the child of task `{}` is gone, and its output with it",
                    from.task
                ))
            });
    };
    if parent.child_phase() != TaskPhase::Succeeded {
        return None;
    }
    Some(fanout::output_items(task, from, parent.output()))
}

/// Item `index` of `task`'s `forEach`: from its list or range, or from its parent's output.
fn item_of(
    task: &str,
    for_each: &ForEach,
    index: u32,
    children: &Children,
    recorded: &AxDagStatus,
) -> Option<serde_json::Value> {
    match output_list(task, for_each, children, recorded) {
        Some(list) => list.ok()?.get(usize::try_from(index).ok()?).cloned(),
        None if for_each.from_output.is_some() => None,
        None => for_each.item(index),
    }
}

/// What `parent` gives the children that depend on it.
fn parent_result<'a>(
    parent: &str,
    children: &'a Children,
    items: &'a HashMap<String, DagItemsStatus>,
    recorded: &'a AxDagStatus,
) -> ParentResult<'a> {
    let counts = items
        .get(parent)
        .or_else(|| recorded.nodes.get(parent)?.items.as_ref());
    match (counts, children.items.get(parent)) {
        (Some(status), item_children) => {
            let outputs = item_children
                .into_iter()
                .flat_map(BTreeMap::values)
                .filter(|child| child.child_phase() == TaskPhase::Succeeded && child.has_output())
                .count();
            ParentResult::Items {
                status,
                outputs: u32::try_from(outputs).unwrap_or(u32::MAX),
            }
        }
        (None, _) => ParentResult::Task(children.tasks.get(parent).and_then(|c| c.output())),
    }
}

/// Which child of the DAG: the one of a task, or one item's of a `forEach` task.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ChildKey {
    Task(String),
    Item(String, u32),
}

impl ChildKey {
    /// Its key among the DAG's expected children: the task's name, or `task/index` (no task name
    /// has a `/`).
    fn expected(&self) -> String {
        match self {
            ChildKey::Task(task) => task.clone(),
            ChildKey::Item(task, index) => format!("{task}/{index}"),
        }
    }

    fn of_expected(key: &str) -> Self {
        match key.split_once('/').map(|(t, i)| (t, i.parse())) {
            Some((task, Ok(index))) => ChildKey::Item(task.to_owned(), index),
            _ => ChildKey::Task(key.to_owned()),
        }
    }

    fn set(
        &self,
        phases: &mut HashMap<String, TaskPhase>,
        items: &mut HashMap<String, BTreeMap<u32, TaskPhase>>,
        phase: TaskPhase,
    ) {
        match self {
            ChildKey::Task(task) => {
                phases.insert(task.clone(), phase);
            }
            ChildKey::Item(task, index) => {
                items.entry(task.clone()).or_default().insert(*index, phase);
            }
        }
    }

    fn is_in(
        &self,
        phases: &HashMap<String, TaskPhase>,
        items: &HashMap<String, BTreeMap<u32, TaskPhase>>,
    ) -> bool {
        match self {
            ChildKey::Task(task) => phases.contains_key(task),
            ChildKey::Item(task, index) => items.get(task).is_some_and(|i| i.contains_key(index)),
        }
    }
}

/// A child about to be created.
struct NewChild {
    key: ChildKey,
    name: String,
    spec: AxTaskSpec,
}

/// The specs (and `forEach`) of `tasks` as the API server has `dag` now, if that is still the same
/// generation of the same DAG (from `dag` itself when it is whole). Read as JSON text of which only
/// those specs are parsed: a whole DAG of 500 tasks parses to many times its JSON, and every
/// creating reconcile in flight would hold one.
async fn task_specs(
    dag: &AxDag,
    tasks: &BTreeSet<&str>,
    ctx: &Ctx,
) -> Result<Option<HashMap<String, (AxTaskSpec, Option<ForEach>)>>> {
    // The exit handler's spec goes under its task name (which no task of the DAG has).
    let on_exit = |spec: Option<AxTaskSpec>| {
        spec.filter(|_| tasks.contains(ON_EXIT_TASK))
            .map(|spec| (ON_EXIT_TASK.to_owned(), (spec, None)))
    };
    if !cache::dag_is_reduced(dag) {
        let specs = dag
            .spec
            .tasks
            .iter()
            .filter(|t| tasks.contains(t.name.as_str()));
        let specs = specs.map(|t| (t.name.clone(), (t.spec.clone(), t.for_each.clone())));
        return Ok(Some(
            specs.chain(on_exit(dag.spec.on_exit.clone())).collect(),
        ));
    }
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxDag> = Api::namespaced(ctx.client.clone(), &namespace);
    let request = kube::core::Request::new(api.resource_url())
        .get(&dag.name_any(), &Default::default())
        .map_err(|e| Error::Read("the DAG", kube::Error::BuildRequest(e)))?;
    let text = match ctx.client.request_text(request).await {
        Ok(text) => text,
        Err(e) if ApiError::of(&e) == ApiError::NotFound => return Ok(None),
        Err(e) => return Err(Error::Read("the DAG", e)),
    };
    let read = |e: serde_json::Error| Error::Read("the DAG", kube::Error::SerdeError(e));
    let raw: RawDag = serde_json::from_str(&text).map_err(read)?;
    if raw.metadata.uid != dag.metadata.uid || raw.metadata.generation != dag.metadata.generation {
        return Ok(None);
    }
    let handler = raw.spec.on_exit.map(|h| serde_json::from_str(h.get()));
    let mut specs: HashMap<_, _> = on_exit(handler.transpose().map_err(read)?)
        .into_iter()
        .collect();
    for task in raw
        .spec
        .tasks
        .into_iter()
        .filter(|t| tasks.contains(t.name.as_str()))
    {
        let spec = serde_json::from_str(task.spec.get()).map_err(read)?;
        let for_each = task
            .for_each
            .map(|f| serde_json::from_str(f.get()))
            .transpose()
            .map_err(read)?;
        specs.insert(task.name, (spec, for_each));
    }
    Ok(Some(specs))
}

/// An AxDag as JSON whose tasks' specs are left unparsed.
#[derive(serde::Deserialize)]
struct RawDag<'a> {
    metadata: kube::api::ObjectMeta,
    #[serde(borrow)]
    spec: RawDagSpec<'a>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDagSpec<'a> {
    #[serde(borrow, default)]
    tasks: Vec<RawDagTask<'a>>,
    #[serde(borrow, default)]
    on_exit: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDagTask<'a> {
    name: String,
    #[serde(borrow)]
    spec: &'a serde_json::value::RawValue,
    #[serde(borrow, default)]
    for_each: Option<&'a serde_json::value::RawValue>,
}

/// The children of a DAG.
struct Children {
    /// Of the tasks that run once, by task name.
    tasks: HashMap<String, Arc<CachedTask>>,
    /// Of the `forEach` tasks, by task name and item index (a finished item is settled: see
    /// `cache::ItemFacts`).
    items: HashMap<String, BTreeMap<u32, Arc<CachedTask>>>,
}

impl Children {
    fn all(&self) -> impl Iterator<Item = &Arc<CachedTask>> {
        let items = self.items.values().flat_map(BTreeMap::values);
        self.tasks.values().chain(items)
    }
}

/// The children of this DAG in the cache: AxTasks in its namespace whose controller is this DAG
/// (by uid, so the children of an older DAG of the same name do not count). Looked up through the
/// owner index: a reconcile reads its own children, not every DAG's.
fn owned_children(dag: &AxDag, uid: &str, ctx: &Ctx) -> Children {
    let namespace = dag.namespace();
    let prefix = format!("{}-", dag.name_any());
    let mut children = Children {
        tasks: HashMap::new(),
        items: HashMap::new(),
    };
    let keys = ctx.tasks_by_owner.children_of(uid);
    let owned = keys
        .iter()
        .filter_map(|key| ctx.tasks.get(&key.object_ref()))
        .filter(|child| child.is_child())
        .filter(|child| child.namespace() == namespace && is_controlled_by(child.as_ref(), uid));
    for child in owned {
        let (task, item) = child.dag_place();
        let task = match task {
            Some(task) => task.to_owned(),
            None => match child.name_any().strip_prefix(&prefix) {
                Some(task) => task.to_owned(),
                None => continue,
            },
        };
        match item {
            Some(Ok(index)) => {
                children.items.entry(task).or_default().insert(index, child);
            }
            // Not made by this operator: an item label that is no index.
            Some(Err(_)) => {}
            None => {
                children.tasks.insert(task, child);
            }
        }
    }
    children
}

/// Adds the children this process created that the cache does not show yet to `phases` and
/// `items`, as Pending. Returns whether any remain.
fn fill_in_expected(
    expected: &Expected<String, ()>,
    dag_uid: &String,
    phases: &mut HashMap<String, TaskPhase>,
    items: &mut HashMap<String, BTreeMap<u32, TaskPhase>>,
) -> bool {
    let sight = |key: &str, _: &()| match ChildKey::of_expected(key).is_in(phases, items) {
        true => Sight::Seen,
        false => Sight::NotSeen,
    };
    let pending = expected.pending(dag_uid, Instant::now(), sight);
    let any = !pending.is_empty();
    for (key, ()) in pending {
        ChildKey::of_expected(&key).set(phases, items, TaskPhase::Pending);
    }
    any
}

fn child_phases<'a, K: Clone + 'a, C: FromIterator<(K, TaskPhase)>>(
    children: impl IntoIterator<Item = (&'a K, &'a Arc<CachedTask>)>,
) -> C {
    children
        .into_iter()
        .map(|(key, child)| (key.clone(), child.child_phase()))
        .collect()
}

/// Takes the finalizer off children being deleted.
async fn free_children<'a>(
    dag: &AxDag,
    children: impl Iterator<Item = &'a Arc<CachedTask>>,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    // A child being deleted is never settled: it is here whole.
    for child in children.filter_map(|child| child.whole()) {
        if child.metadata.deletion_timestamp.is_some() && has_finalizer(child) {
            write::remove_finalizer(&api, child.as_ref(), CHILD_FINALIZER).await?;
            debug!(
                child = child.name_any(),
                "finished child recorded; it may go"
            );
        }
    }
    Ok(())
}

/// Acts on a re-run request of a finished DAG, like `argo retry`: children that Succeeded are kept;
/// Dead and Canceled children (a `forEach` task's failed items) get a re-run request of their own;
/// Skipped tasks, and finished children that are gone, start again from nothing. `before` becomes
/// the status the re-run starts from. Returns the children that were asked to re-run. A request
/// while the DAG runs waits until it has finished.
async fn start_rerun(
    dag: &AxDag,
    before: &mut AxDagStatus,
    children: &Children,
    ctx: &Ctx,
) -> Result<Vec<ChildKey>> {
    let mut asked = Vec::new();
    let finished = before.phase.is_some_and(DagPhase::is_terminal);
    if dag.spec.rerun <= before.observed_rerun || dag.spec.cancel || !finished {
        return Ok(asked);
    }
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    let failed = |child: &Arc<CachedTask>| {
        matches!(child.child_phase(), TaskPhase::Dead | TaskPhase::Canceled)
    };
    for (task, node) in before.nodes.iter_mut() {
        if matches!(node.phase, DagNodePhase::Succeeded) {
            continue;
        }
        if let Some(items) = children.items.get(task) {
            for (index, child) in items.iter().filter(|(_, child)| failed(child)) {
                ask_rerun(&api, child).await?;
                asked.push(ChildKey::Item(task.clone(), *index));
            }
            continue;
        }
        match children.tasks.get(task) {
            Some(child) if failed(child) => {
                ask_rerun(&api, child).await?;
                asked.push(ChildKey::Task(task.clone()));
            }
            Some(_) => {}
            None => {
                node.phase = DagNodePhase::NotStarted;
                node.task = None;
            }
        }
    }
    before.observed_rerun += 1;
    let note = format!(
        "re-run {} (spec.rerun={}): {} failed children asked to run again",
        before.observed_rerun,
        dag.spec.rerun,
        asked.len()
    );
    publish(dag, EventType::Normal, "Rerun", &note, ctx);
    Ok(asked)
}

async fn ask_rerun(api: &Api<AxTask>, child: &CachedTask) -> Result<()> {
    let rerun = child
        .rerun()
        .ok_or(Error::Incomplete("the child's spec.rerun"))?;
    let patch = Patch::Merge(serde_json::json!({
        "metadata": {"resourceVersion": child.resource_version()},
        "spec": {"rerun": rerun + 1, "cancel": false},
    }));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(&child.name_any(), &params, &patch)
        .await
        .map_err(Error::UpdateChild)?;
    Ok(())
}

enum Created {
    /// Created now, or it already existed as this DAG's child.
    Yes,
    /// An object this DAG does not control has the child's name.
    NameTaken,
}

async fn create_child(
    dag: &AxDag,
    uid: &str,
    new: &NewChild,
    traceparent: Option<String>,
    ctx: &Ctx,
) -> Result<Created> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let child_name = new.name.as_str();
    let mut child = AxTask::new(child_name, new.spec.clone());
    child.metadata.namespace = Some(namespace.clone());
    // The child's trace is a child of the DAG's span.
    child.metadata.annotations =
        traceparent.map(|t| BTreeMap::from([(TRACEPARENT_ANNOTATION.to_owned(), t)]));
    let mut labels = BTreeMap::from([(LABEL_DAG.to_owned(), dag.name_any())]);
    match &new.key {
        ChildKey::Task(task) => {
            labels.insert(LABEL_DAG_TASK.to_owned(), task.clone());
        }
        ChildKey::Item(task, index) => {
            labels.insert(LABEL_DAG_TASK.to_owned(), task.clone());
            labels.insert(LABEL_DAG_ITEM.to_owned(), index.to_string());
        }
    }
    child.metadata.labels = Some(labels);
    child.metadata.finalizers = Some(vec![CHILD_FINALIZER.to_owned()]);
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: AxDag::api_version(&()).into_owned(),
        kind: AxDag::kind(&()).into_owned(),
        name: dag.name_any(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &child).await {
        Ok(_) => {
            debug!(child = child_name, "child created");
            Ok(Created::Yes)
        }
        // Created before (by an earlier run of the operator, or by this one on a lagging cache).
        Err(e) if ApiError::of(&e) == ApiError::AlreadyExists => {
            match api
                .get_opt(child_name)
                .await
                .map_err(|e| Error::Read("the existing child", e))?
            {
                Some(existing) if is_controlled_by(&existing, uid) => Ok(Created::Yes),
                // Deleted in between: the next reconcile creates it.
                None => Ok(Created::Yes),
                Some(_) => {
                    publish(
                        dag,
                        EventType::Warning,
                        "ChildNameTaken",
                        &format!("AxTask {child_name} exists and does not belong to this DAG"),
                        ctx,
                    );
                    Ok(Created::NameTaken)
                }
            }
        }
        Err(e) => Err(Error::CreateChild(e)),
    }
}

/// Sets `spec.cancel` on each of `children` that is not canceled or finished already. (A child
/// created a moment ago and not in the cache yet is canceled by the next reconcile.)
async fn cancel_children<'a>(
    dag: &AxDag,
    children: impl Iterator<Item = &'a Arc<CachedTask>>,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for child in children.filter(|child| child.may_be_canceled()) {
        match api.patch(&child.name_any(), &params, &patch).await {
            Ok(_) => debug!(child = child.name_any(), "child canceled"),
            Err(e) if ApiError::of(&e) == ApiError::NotFound => {}
            Err(e) => return Err(Error::UpdateChild(e)),
        }
    }
    Ok(())
}

/// Writes the status if it changed (or `always`), then publishes an Event if the phase changed.
/// `None` when the write conflicted (a newer DAG is on its way) or the DAG is gone: nothing was
/// recorded.
async fn write_and_publish(
    dag: &AxDag,
    before: &AxDagStatus,
    status: AxDagStatus,
    always: bool,
    ctx: &Ctx,
) -> Result<Option<Requeue>> {
    if *before == status && !always {
        return Ok(Some(Requeue::await_change()));
    }
    if let Err(e) = write::dag_status(&ctx.client, dag, &status).await {
        return match ApiError::of_result(&e) {
            ApiError::Conflict | ApiError::NotFound => {
                debug!("dag status write conflicted; waiting for the newer version");
                Ok(None)
            }
            _ => Err(e),
        };
    }
    if before.phase != status.phase
        && let Some(phase) = status.phase
    {
        publish_phase(dag, before.phase, phase, &status, ctx);
        record_span(dag, phase, &status, ctx);
    }
    Ok(Some(Requeue::await_change()))
}

/// The trace a DAG without one records while traces are exported: the submitter's, from its
/// `ax.dev/traceparent`, or one of its own.
fn trace_of(dag: &AxDag, uid: &str, ctx: &Ctx) -> Option<TraceContext> {
    let sampler = ctx.traces.sampler()?;
    let annotation = |key| dag.annotations().get(key).map(String::as_str);
    let (trace, invalid) = trace::context_of(
        uid,
        annotation(TRACEPARENT_ANNOTATION),
        annotation(TRACELINK_ANNOTATION),
        sampler,
    );
    if let Some(invalid) = invalid {
        publish(
            dag,
            EventType::Warning,
            "InvalidTraceparent",
            &invalid.to_string(),
            ctx,
        );
    }
    Some(trace)
}

/// The span of the DAG's run, once it has ended.
fn record_span(dag: &AxDag, phase: DagPhase, status: &AxDagStatus, ctx: &Ctx) {
    let (Some(trace), true) = (status.trace.as_ref(), phase.is_terminal()) else {
        return;
    };
    let end = status.finished_at.unwrap_or_else(Timestamp::now);
    // A first run spans from the DAG's creation, a re-run from its first child.
    let created = dag.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let start = if status.observed_rerun == 0 {
        created.or(status.started_at)
    } else {
        status.started_at.or(created)
    }
    .unwrap_or(end);
    let span = trace::dag_span(
        &dag.namespace().unwrap_or_default(),
        &dag.name_any(),
        &dag.uid().unwrap_or_default(),
        trace,
        status.observed_rerun,
        start,
        end,
        phase.as_str(),
        status.progress.as_deref(),
    );
    ctx.traces.record(span.into_iter().collect());
}

fn publish_phase(
    dag: &AxDag,
    from: Option<DagPhase>,
    to: DagPhase,
    status: &AxDagStatus,
    ctx: &Ctx,
) {
    let invalid = conditions::find(&status.conditions, conditions::INVALID_SPEC, true);
    let (type_, reason, detail) = match (to, invalid) {
        (DagPhase::Failed, Some(invalid)) => (
            EventType::Warning,
            conditions::reason::INVALID_SPEC,
            invalid.message.clone(),
        ),
        _ => {
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::READY);
            let kind = if to == DagPhase::Failed {
                EventType::Warning
            } else {
                EventType::Normal
            };
            (
                kind,
                to.as_str(),
                ready.map(|c| c.message.clone()).unwrap_or_default(),
            )
        }
    };
    let note = format!(
        "{} -> {to} ({}): {detail}",
        from.map_or("New", DagPhase::as_str),
        status.progress.as_deref().unwrap_or("")
    );
    publish(dag, type_, reason, &note, ctx);
}

fn publish(dag: &AxDag, type_: EventType, reason: &str, note: &str, ctx: &Ctx) {
    ctx.events.publish(dag, type_, reason, note);
}

pub fn error_policy(dag: Arc<AxDag>, error: &Error, ctx: Ctx) -> Requeue {
    let category = error.category();
    ctx.metrics
        .reconcile_error(CONTROLLER, error.step(), category.as_str());
    warn!(namespace = dag.namespace(), name = dag.name_any(), %error, category = category.as_str(), "dag reconcile failed");
    Requeue::requeue(category.retry_after())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_children_cache_counts_as_listed_once_its_first_list_is_in() {
        let (store, mut writer) = kube::runtime::reflector::store::<AxTask>();
        assert!(!crate::controller::cache_listed(&store));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
        assert!(
            !crate::controller::cache_listed(&store),
            "a list in progress is not complete"
        );
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        assert!(crate::controller::cache_listed(&store));
        assert!(crate::controller::cache_listed(&store.clone()));
    }
}
