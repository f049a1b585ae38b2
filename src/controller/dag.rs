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

use super::expected::{EXPECTATION_TTL, Expected, Sight};
use super::write::{self, ApiError};
use super::{Ctx, Error, FIELD_MANAGER, Result, cache};
use crate::api::{
    AxDag, AxDagStatus, AxTask, AxTaskSpec, DagNodePhase, DagPhase, LABEL_DAG, LABEL_DAG_TASK,
    TaskPhase, TraceContext,
};
use crate::core::conditions;
use crate::core::dag::status::{
    child_phase, graph_status, invalid_status, recorded_as, remember_finished_children,
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
        free_children(&dag, children.values(), &ctx).await?;
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
    let graph = match core::validate(&dag.name_any(), &spec_nodes) {
        Ok(graph) => graph,
        Err(error) => {
            if dag.spec.cancel {
                cancel_children(&dag, children.keys(), &children, &ctx).await?;
            }
            let status = invalid_status(&dag, &before, &error.to_string(), now);
            let written = write_and_publish(&dag, &before, status, false, &ctx).await?;
            return Ok(written.unwrap_or_else(Requeue::await_change));
        }
    };

    let rerun = start_rerun(&dag, &mut before, &children, &ctx).await?;
    let mut phases = child_phases(&children);
    for task in &rerun {
        // Its re-run request is in; the child's own reconcile takes it from there.
        phases.insert(task.clone(), TaskPhase::Pending);
    }
    let waiting_for_cache = fill_in_expected(&ctx.dag_children, &uid, &mut phases);
    remember_finished_children(&before, &mut phases);

    let policy = dag.spec.failure_policy;
    let parallelism = dag
        .spec
        .parallelism
        .map(|limit| u32::try_from(limit).unwrap_or(0));
    let mut evaluation = core::evaluate(&graph, &phases, policy, parallelism, dag.spec.cancel);
    let create = std::mem::take(&mut evaluation.create);
    if !create.is_empty() {
        for task in &create {
            phases.insert(task.clone(), TaskPhase::Pending);
        }
        // The status reports the children about to be created.
        evaluation = core::evaluate(&graph, &phases, policy, parallelism, dag.spec.cancel);
    }
    cancel_children(&dag, evaluation.cancel.iter(), &children, &ctx).await?;

    // The cache keeps no task's spec: read the specs of the children to create. Only this
    // generation's may be used (a generation is one spec, so the decision above holds).
    let specs = if create.is_empty() {
        HashMap::new()
    } else {
        match task_specs(&dag, &create, &ctx).await? {
            Some(specs) => specs,
            // Edited or deleted since the cache's copy: its watch event brings the next reconcile.
            None => return Ok(Requeue::await_change()),
        }
    };
    let mut status = graph_status(&graph, &dag, &before, &evaluation, now);
    if status.trace.is_none() && !status.phase.is_some_and(DagPhase::is_terminal) {
        status.trace = trace_of(&dag, &uid, &ctx);
    }
    let original = dag.status.clone().unwrap_or_default();
    // Status before children: the write is preconditioned on the resourceVersion this decision
    // read, so children are created only from the DAG's latest status. A child that finished, was
    // recorded and then deleted (its finalizer comes off only after the record) is missing from the
    // children cache at once, while the cached DAG may not show the record yet; deciding on that
    // copy would run the child a second time. Written even when unchanged, for the same check.
    let must_write = !create.is_empty();
    let Some(requeue) =
        write_and_publish(&dag, &original, status.clone(), must_write, &ctx).await?
    else {
        return Ok(Requeue::await_change());
    };
    let mut name_taken = false;
    for task in &create {
        let spec = specs.get(task).ok_or(Error::Incomplete("task in spec"))?;
        let traceparent = status
            .trace
            .as_ref()
            .map(|t| trace::child_traceparent(t, &uid, status.observed_rerun));
        let child_name = graph.child_name(task);
        match create_child(&dag, &uid, &child_name, task, spec, traceparent, &ctx).await? {
            Created::Yes => ctx.dag_children.created(&uid, task, (), Instant::now()),
            Created::NameTaken => name_taken = true,
        }
    }
    // Recorded: children being deleted may go now.
    let recorded = children.iter().filter(|(task, child)| {
        let phase = child_phase(child);
        !phase.is_terminal()
            || status
                .nodes
                .get(*task)
                .is_some_and(|n| recorded_as(n, phase))
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

/// The specs of `tasks` as the API server has `dag` now, if that is still the same generation of
/// the same DAG (from `dag` itself when it is whole). Read as JSON text of which only those specs
/// are parsed: a whole DAG of 500 tasks parses to many times its JSON, and every creating reconcile
/// in flight would hold one.
async fn task_specs(
    dag: &AxDag,
    tasks: &[String],
    ctx: &Ctx,
) -> Result<Option<HashMap<String, AxTaskSpec>>> {
    let wanted = |name: &str| tasks.iter().any(|t| t == name);
    if !cache::dag_is_reduced(dag) {
        let specs = dag.spec.tasks.iter().filter(|t| wanted(&t.name));
        return Ok(Some(
            specs.map(|t| (t.name.clone(), t.spec.clone())).collect(),
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
    let mut specs = HashMap::new();
    for task in raw.spec.tasks.into_iter().filter(|t| wanted(&t.name)) {
        let spec = serde_json::from_str(task.spec.get()).map_err(read)?;
        specs.insert(task.name, spec);
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
struct RawDagSpec<'a> {
    #[serde(borrow, default)]
    tasks: Vec<RawDagTask<'a>>,
}

#[derive(serde::Deserialize)]
struct RawDagTask<'a> {
    name: String,
    #[serde(borrow)]
    spec: &'a serde_json::value::RawValue,
}

/// The children of this DAG in the cache, by task name: AxTasks in its namespace whose controller
/// is this DAG (by uid, so the children of an older DAG of the same name do not count). Looked up
/// through the owner index: a reconcile reads its own children, not every DAG's.
fn owned_children(dag: &AxDag, uid: &str, ctx: &Ctx) -> HashMap<String, Arc<AxTask>> {
    let namespace = dag.namespace();
    let prefix = format!("{}-", dag.name_any());
    ctx.tasks_by_owner
        .children_of(uid)
        .iter()
        .filter_map(|key| ctx.tasks.get(&key.object_ref())?.child().cloned())
        .filter(|child| child.namespace() == namespace && is_controlled_by(child, uid))
        .filter_map(|child| {
            let task = match child.labels().get(LABEL_DAG_TASK) {
                Some(task) => task.clone(),
                None => child.name_any().strip_prefix(&prefix)?.to_owned(),
            };
            Some((task, child))
        })
        .collect()
}

fn is_controlled_by(child: &AxTask, uid: &str) -> bool {
    child
        .owner_references()
        .iter()
        .any(|owner| owner.uid == uid && owner.controller == Some(true))
}

/// Adds the children this process created that the cache does not show yet to `phases`, as
/// Pending. Returns whether any remain.
fn fill_in_expected(
    expected: &Expected<String, ()>,
    dag_uid: &String,
    phases: &mut HashMap<String, TaskPhase>,
) -> bool {
    let sight = |task: &str, _: &()| match phases.contains_key(task) {
        true => Sight::Seen,
        false => Sight::NotSeen,
    };
    let pending = expected.pending(dag_uid, Instant::now(), sight);
    let any = !pending.is_empty();
    for (task, ()) in pending {
        phases.insert(task, TaskPhase::Pending);
    }
    any
}

fn child_phases(children: &HashMap<String, Arc<AxTask>>) -> HashMap<String, TaskPhase> {
    children
        .iter()
        .map(|(task, child)| (task.clone(), child_phase(child)))
        .collect()
}

/// Takes the finalizer off children being deleted.
async fn free_children<'a>(
    dag: &AxDag,
    children: impl Iterator<Item = &'a Arc<AxTask>>,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    for child in children {
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
/// Dead and Canceled children get a re-run request of their own; Skipped tasks, and finished
/// children that are gone, start again from nothing. `before` becomes the status the re-run starts
/// from. Returns the tasks whose children were asked to re-run. A request while the DAG runs waits
/// until it has finished.
async fn start_rerun(
    dag: &AxDag,
    before: &mut AxDagStatus,
    children: &HashMap<String, Arc<AxTask>>,
    ctx: &Ctx,
) -> Result<BTreeSet<String>> {
    let mut asked = BTreeSet::new();
    let finished = before.phase.is_some_and(DagPhase::is_terminal);
    if dag.spec.rerun <= before.observed_rerun || dag.spec.cancel || !finished {
        return Ok(asked);
    }
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    for (task, node) in before.nodes.iter_mut() {
        if matches!(node.phase, DagNodePhase::Succeeded) {
            continue;
        }
        match children.get(task) {
            Some(child) if matches!(child_phase(child), TaskPhase::Dead | TaskPhase::Canceled) => {
                let patch = Patch::Merge(serde_json::json!({
                    "metadata": {"resourceVersion": child.resource_version()},
                    "spec": {"rerun": child.spec.rerun + 1, "cancel": false},
                }));
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                api.patch(&child.name_any(), &params, &patch)
                    .await
                    .map_err(Error::UpdateChild)?;
                asked.insert(task.clone());
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
        "re-run {} (spec.rerun={}): {} failed tasks asked to run again",
        before.observed_rerun,
        dag.spec.rerun,
        asked.len()
    );
    publish(dag, EventType::Normal, "Rerun", &note, ctx);
    Ok(asked)
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
    child_name: &str,
    task: &str,
    spec: &AxTaskSpec,
    traceparent: Option<String>,
    ctx: &Ctx,
) -> Result<Created> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let mut child = AxTask::new(child_name, spec.clone());
    child.metadata.namespace = Some(namespace.clone());
    // The child's trace is a child of the DAG's span.
    child.metadata.annotations =
        traceparent.map(|t| BTreeMap::from([(TRACEPARENT_ANNOTATION.to_owned(), t)]));
    child.metadata.labels = Some(BTreeMap::from([
        (LABEL_DAG.to_owned(), dag.name_any()),
        (LABEL_DAG_TASK.to_owned(), task.to_owned()),
    ]));
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

/// Sets `spec.cancel` on each listed child that exists and is not canceled already.
async fn cancel_children<'a>(
    dag: &AxDag,
    tasks: impl Iterator<Item = &'a String>,
    children: &HashMap<String, Arc<AxTask>>,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for task in tasks {
        let Some(child) = children.get(task) else {
            // Created a moment ago: the cache will show it and the next reconcile cancels it.
            continue;
        };
        let terminal = child
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(TaskPhase::is_terminal);
        if child.spec.cancel || terminal {
            continue;
        }
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
