//! What the operator keeps of each object in its informer caches (no client required): what its
//! decisions read, not the whole object. With 100,000 tasks waiting, a full AxTask — its pod
//! template, payload, managedFields, last-applied annotation — is most of the operator's memory and
//! none of what a waiting task's decisions need.
//!
//! A cached AxTask keeps its metadata (without managedFields and annotations), the spec's scalar
//! fields and the whole status; its template is [`PodTemplate::absent`], which marks it as
//! reduced. The facts the reconciler reads from the template and payload are worked out once,
//! when the object arrives, and kept — only where there is one to keep — as annotations that exist
//! only in this cache (the status subresource ignores everything but `status`, so they are never
//! written back). A
//! dispatch builds its worker pod from the template of the task as the watch just delivered it
//! ([`FreshTemplates`], a bounded few), else from the whole task its status write returns; only a
//! pod missing outside the dispatch path (a restart) reads the task again.
//!
//! The task controller's cache goes further ([`CachedTask`]): a task that is settled — waiting in
//! its queue without having run, or finished — is kept as its identity and the facts of
//! [`core::Settled`], a fraction of a whole task; its reconcile reads the whole task only when it
//! has something to do. A child of a DAG or a cron (a task with a controller) stays whole: the
//! same cache serves its controller's reconcile, which reads its labels, owners, finalizers and
//! output. Except a `forEach` item, of which a DAG may have 100,000: settled, it keeps its owners
//! and finalizers, and of its labels, spec and status only what its DAG reads ([`ItemFacts`]).
//!
//! A cached worker pod keeps what `core::worker::observe` reads: names, labels, owners, deletion,
//! finalizers, the main-container annotation, node, container names and statuses.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use futures::{Stream, TryStreamExt};
use kube::runtime::watcher;
use kube::{Client, Resource};

use super::{TaskKey, readable};
use crate::api::{AxDag, AxTask, LABEL_DAG_ITEM, LABEL_DAG_TASK, PodTemplate, TaskPhase};
use crate::core::task as core;
use crate::core::trace::{TRACELINK_ANNOTATION, TRACEPARENT_ANNOTATION};
use crate::core::worker::MAIN_CONTAINER_ANNOTATION;

/// The validation error of the dropped spec, if any.
pub const SPEC_ERROR: &str = "ax.dev/cache.spec-error";
/// The dropped template's main container has a readiness or liveness probe.
pub const MAIN_PROBE: &str = "ax.dev/cache.main-probe";

/// Reduces an AxTask to what the operator's caches keep.
pub fn task(t: &mut AxTask) {
    strip(t);
}

/// [`task`], returning the template and payload it drops.
fn strip(t: &mut AxTask) -> (PodTemplate, Option<serde_json::Value>) {
    let mut cached = BTreeMap::new();
    if let Err(e) = core::validate(&t.spec) {
        cached.insert(SPEC_ERROR.to_string(), e.to_string());
    }
    if core::main_has_probe(&t.spec) {
        cached.insert(MAIN_PROBE.to_string(), "true".to_string());
    }
    for kept in [
        TRACEPARENT_ANNOTATION,
        TRACELINK_ANNOTATION,
        crate::core::template::RESOLVED_ANNOTATION,
    ] {
        if let Some(value) = annotation(t, kept) {
            cached.insert(kept.to_string(), value.to_string());
        }
    }
    t.metadata.managed_fields = None;
    // Most tasks have no fact to note: no map at all, rather than an empty one.
    t.metadata.annotations = (!cached.is_empty()).then_some(cached);
    // An exit handler's template and payload are read whole when it is created.
    if let Some(handler) = t.spec.on_exit.as_mut() {
        handler.template = PodTemplate::absent();
        handler.payload = None;
    }
    (std::mem::take(&mut t.spec.template), t.spec.payload.take())
}

/// Reduces an AxDag to what the DAG and cron controllers' caches keep: metadata without
/// managedFields and annotations (`kubectl apply`'s last-applied copy is the whole spec again), the
/// spec's scalars, and each task's name and dependencies; each task's template is
/// [`PodTemplate::absent`] and its payload dropped. A DAG of 500 tasks with large specs would
/// otherwise be kept whole, parsed, for as long as it exists, finished or not. A reconcile that
/// creates children reads the whole DAG first (see [`dag_is_reduced`]).
pub fn dag(d: &mut AxDag) {
    d.metadata.managed_fields = None;
    // The trace annotations are the ones kept: the DAG's first status write records its trace
    // from them.
    let kept: BTreeMap<String, String> = d
        .metadata
        .annotations
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == TRACEPARENT_ANNOTATION || k == TRACELINK_ANNOTATION)
        .collect();
    d.metadata.annotations = (!kept.is_empty()).then_some(kept);
    if let Some(handler) = d.spec.on_exit.as_mut() {
        handler.template = PodTemplate::absent();
        handler.payload = None;
    }
    for task in &mut d.spec.tasks {
        task.spec.template = PodTemplate::absent();
        task.spec.payload = None;
        if let Some(for_each) = task.for_each.as_mut()
            && let Some(items) = for_each.items.take()
        {
            for_each.cached_item_count = Some(items.len());
        }
    }
}

/// Whether `d` is as [`dag`] keeps it: its tasks' specs are not there to create children from.
pub fn dag_is_reduced(d: &AxDag) -> bool {
    d.spec.tasks.iter().any(|t| t.spec.template.is_absent())
}

/// The operator's one AxTask watch: every readable AxTask, reduced by [`task`], as a
/// [`CachedTask`]; the template and payload of a task that may be dispatched next go to `fresh`.
pub fn task_watch(
    client: Client,
    reporter: readable::Reporter,
    fresh: Arc<FreshTemplates>,
) -> impl Stream<Item = Result<watcher::Event<CachedTask>, watcher::Error>> + Send {
    readable::watch_reduced(client, None, Some(reporter), move |t| {
        reduce(t, Some(&fresh))
    })
    .map_ok(|event| map_event(event, CachedTask::of))
}

fn map_event<A, B>(event: watcher::Event<A>, mut f: impl FnMut(A) -> B) -> watcher::Event<B> {
    use watcher::Event::*;
    match event {
        Init => Init,
        InitApply(a) => InitApply(f(a)),
        InitDone => InitDone,
        Apply(a) => Apply(f(a)),
        Delete(a) => Delete(f(a)),
    }
}

/// An AxTask in the task controller's cache: whole (reduced by [`task`]) while a decision may act
/// on it, or settled — waiting in its queue without having run, or finished, in a state a decision
/// leaves as it is — as its identity and the facts of [`core::Settled`]: about a third of the
/// memory of a whole one. `task::reconcile` reads the whole task of a settled one only when it has
/// something to do.
#[derive(Clone, Debug)]
pub enum CachedTask {
    Whole(Arc<AxTask>),
    Settled(Box<SettledTask>),
}

#[derive(Clone, Debug)]
pub struct SettledTask {
    /// What identifies this version of the task: names, uid, resourceVersion, generation, creation;
    /// an item's owners and finalizers too.
    pub metadata: ObjectMeta,
    pub facts: core::Settled,
    /// Of a `forEach` item ([`core::is_fan_out_item`]).
    pub item: Option<ItemFacts>,
}

/// What a DAG reads of a settled item besides its phase, owners and finalizers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemFacts {
    /// Its DAG task (label `ax.dev/dag-task`) and index (label `ax.dev/item`): a map of three
    /// labels would be a third of a settled item's memory.
    pub task: Box<str>,
    pub index: u32,
    /// `spec.rerun` (equal to `status.observedRerun`: a settled task has no re-run waiting).
    pub rerun: i64,
    /// Whether it wrote an output: its DAG counts them, and reads none.
    pub has_output: bool,
}

impl CachedTask {
    /// What the controller's cache keeps of `task`, already reduced by [`task`].
    pub fn of(task: AxTask) -> CachedTask {
        let place = item_place(&task);
        if core::has_controller(&task) && place.is_none() {
            return CachedTask::Whole(Arc::new(task));
        }
        let valid = spec_error(&task).is_none();
        match core::Settled::of(&task, valid) {
            Some(facts) => {
                let item = place.map(|(dag_task, index)| ItemFacts {
                    task: dag_task.into(),
                    index,
                    rerun: task.spec.rerun,
                    has_output: task.status.as_ref().is_some_and(|s| s.output.is_some()),
                });
                let m = task.metadata;
                let mut metadata = ObjectMeta {
                    name: m.name,
                    namespace: m.namespace,
                    uid: m.uid,
                    resource_version: m.resource_version,
                    generation: m.generation,
                    creation_timestamp: m.creation_timestamp,
                    ..ObjectMeta::default()
                };
                if item.is_some() {
                    // Its DAG finds it by its owner, and frees it by its finalizer.
                    metadata.owner_references = m.owner_references;
                    metadata.finalizers = m.finalizers;
                }
                CachedTask::Settled(Box::new(SettledTask {
                    metadata,
                    facts,
                    item,
                }))
            }
            None => CachedTask::Whole(Arc::new(task)),
        }
    }

    /// The task as a cron's reconcile, or the exit handler's task, reads it: whole, with a
    /// controller. A DAG reads its children through [`CachedTask::is_child`] and the accessors
    /// below, which serve settled items too.
    pub fn child(&self) -> Option<&Arc<AxTask>> {
        self.whole().filter(|task| core::has_controller(task))
    }

    /// Whether it is some object's child: whole with a controller, or a settled item.
    pub fn is_child(&self) -> bool {
        match self {
            CachedTask::Whole(task) => core::has_controller(task),
            CachedTask::Settled(s) => s.item.is_some(),
        }
    }

    /// The phase its DAG counts it in (`core::dag::status::child_phase`).
    pub fn child_phase(&self) -> TaskPhase {
        match self {
            CachedTask::Whole(task) => crate::core::dag::status::child_phase(task),
            // Settled: no re-run waiting, and a final phase is final (no worker stopping).
            CachedTask::Settled(s) => s.facts.phase,
        }
    }

    /// Whether it wrote an output.
    pub fn has_output(&self) -> bool {
        match self {
            CachedTask::Whole(_) => self.output().is_some(),
            CachedTask::Settled(s) => s.item.as_ref().is_some_and(|i| i.has_output),
        }
    }

    /// Its output, when it is whole (a settled item's is not kept: nothing reads it).
    pub fn output(&self) -> Option<&serde_json::Value> {
        self.whole()?.status.as_ref()?.output.as_ref()
    }

    /// `spec.rerun`, if kept: of a whole task or a settled item.
    pub fn rerun(&self) -> Option<i64> {
        match self {
            CachedTask::Whole(task) => Some(task.spec.rerun),
            CachedTask::Settled(s) => s.item.as_ref().map(|i| i.rerun),
        }
    }

    /// Its place in its DAG, as labels `ax.dev/dag-task` and `ax.dev/item` say: its task, and an
    /// item's index (`Err` for an item label that is no index: not made by this operator).
    pub fn dag_place(&self) -> (Option<&str>, Option<Result<u32, std::num::ParseIntError>>) {
        match self {
            CachedTask::Whole(task) => {
                let labels = task.metadata.labels.as_ref();
                let label = |name| labels?.get(name).map(String::as_str);
                let index = label(LABEL_DAG_ITEM).map(str::parse);
                (label(LABEL_DAG_TASK), index)
            }
            CachedTask::Settled(s) => match &s.item {
                Some(item) => (Some(&item.task), Some(Ok(item.index))),
                None => (None, None),
            },
        }
    }

    /// Whether a cancel request would change anything: not asked for yet, and not finished.
    pub fn may_be_canceled(&self) -> bool {
        match self {
            CachedTask::Whole(task) => {
                let phase = task.status.as_ref().and_then(|s| s.phase);
                !task.spec.cancel && !phase.is_some_and(TaskPhase::is_terminal)
            }
            // A settled task waiting in its queue was never asked to cancel.
            CachedTask::Settled(s) => !s.facts.phase.is_terminal(),
        }
    }

    pub fn whole(&self) -> Option<&Arc<AxTask>> {
        match self {
            CachedTask::Whole(task) => Some(task),
            CachedTask::Settled(_) => None,
        }
    }

    pub fn queue(&self) -> &str {
        match self {
            CachedTask::Whole(task) => &task.spec.queue,
            CachedTask::Settled(s) => &s.facts.queue,
        }
    }

    pub fn task_type(&self) -> &str {
        match self {
            CachedTask::Whole(task) => &task.spec.task_type,
            CachedTask::Settled(s) => &s.facts.task_type,
        }
    }

    pub fn phase(&self) -> Option<TaskPhase> {
        match self {
            CachedTask::Whole(task) => task.status.as_ref().and_then(|s| s.phase),
            CachedTask::Settled(s) => Some(s.facts.phase),
        }
    }

    /// The written `Queued` condition's reason and message, if it has one.
    pub fn queued(&self) -> Option<(&str, &str)> {
        match self {
            CachedTask::Whole(task) => task
                .status
                .as_ref()?
                .condition(crate::core::conditions::QUEUED)
                .map(|c| (c.reason.as_str(), c.message.as_str())),
            CachedTask::Settled(s) => Some(s.facts.queued_condition()),
        }
    }
}

impl Resource for CachedTask {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        AxTask::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        AxTask::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        AxTask::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        AxTask::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            CachedTask::Whole(task) => &task.metadata,
            CachedTask::Settled(s) => &s.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            CachedTask::Whole(task) => &mut Arc::make_mut(task).metadata,
            CachedTask::Settled(s) => &mut s.metadata,
        }
    }
}

/// A `forEach` item's task and index, from its labels.
fn item_place(task: &AxTask) -> Option<(&str, u32)> {
    if !core::is_fan_out_item(task) {
        return None;
    }
    let labels = task.metadata.labels.as_ref()?;
    let index = labels.get(LABEL_DAG_ITEM)?.parse().ok()?;
    Some((labels.get(LABEL_DAG_TASK)?, index))
}

/// Read as an AxTask and kept as the cache keeps it (kube's controller asks for it; the cache is
/// fed by [`task_watch`]).
impl<'de> serde::Deserialize<'de> for CachedTask {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut task = AxTask::deserialize(deserializer)?;
        self::task(&mut task);
        Ok(CachedTask::of(task))
    }
}

/// [`task`], handing what it drops to `fresh`.
fn reduce(t: &mut AxTask, fresh: Option<&FreshTemplates>) {
    let (template, payload) = strip(t);
    if let Some(fresh) = fresh {
        fresh.keep(t, &template, payload.as_ref());
    }
}

/// How many templates [`FreshTemplates`] holds: enough for a burst being dispatched, small beside
/// a backlog (a task that waited longer gets its pod after its status write, from the whole task
/// that write returns).
pub const FRESH_TEMPLATES: usize = 1024;

/// The most [`FreshTemplates`] holds in all, counted as the JSON it keeps plus
/// [`FRESH_ENTRY_OVERHEAD`] an entry. A count alone let any tenant fill it with large payloads
/// (1,024 × 256 KiB, and more again as parsed JSON) and run the operator out of memory; 32 MiB is a
/// small part of the operator's usual memory limit and still a whole burst of tasks of 32 KiB.
pub const FRESH_BYTES: usize = 32 * 1024 * 1024;

/// Largest template and payload (JSON, together) kept: a task above it gets its pod the slower
/// way, like one that is no longer here. It keeps a few large tasks from pushing a burst of small
/// ones out, and 512 of them still fit in [`FRESH_BYTES`].
pub const FRESH_ENTRY_BYTES: usize = 64 * 1024;

/// What an entry costs beside its JSON: its key, uid, the map's and the order's slots.
const FRESH_ENTRY_OVERHEAD: usize = 256;

/// The template and payload of the Pending tasks the watch delivered last, as they arrived. A
/// dispatch that finds its task here builds the worker pod at once and creates it beside the
/// Scheduled status write instead of after it: one round trip from a new task to its pod, not two.
///
/// They are kept as JSON text, not as `serde_json::Value` and `PodTemplateSpec`: a parsed array of
/// small numbers takes about 16 times its JSON, and the typed template several times its own.
#[derive(Debug, Default)]
pub struct FreshTemplates(Mutex<FreshState>);

#[derive(Debug, Default)]
struct FreshState {
    by_task: HashMap<TaskKey, FreshTemplate>,
    /// Keys oldest first, with the sequence number they were kept under (a later keep of the same
    /// task makes its older place here stale).
    order: VecDeque<(u64, TaskKey)>,
    next: u64,
    /// The sum of the entries' [`FreshTemplate::cost`].
    bytes: usize,
}

#[derive(Debug)]
struct FreshTemplate {
    seq: u64,
    uid: Option<String>,
    generation: Option<i64>,
    /// `spec.template` as JSON.
    template: Box<str>,
    /// `spec.payload` as JSON.
    payload: Option<Box<str>>,
}

impl FreshTemplate {
    fn cost(&self) -> usize {
        self.template.len() + self.payload.as_ref().map_or(0, |p| p.len()) + FRESH_ENTRY_OVERHEAD
    }
}

impl FreshState {
    fn insert(&mut self, key: TaskKey, kept: FreshTemplate) {
        self.bytes += kept.cost();
        self.order.push_back((kept.seq, key.clone()));
        if let Some(old) = self.by_task.insert(key, kept) {
            self.bytes -= old.cost();
        }
    }

    fn remove(&mut self, key: &TaskKey) -> Option<FreshTemplate> {
        let kept = self.by_task.remove(key)?;
        self.bytes -= kept.cost();
        Some(kept)
    }
}

impl FreshTemplates {
    fn lock(&self) -> MutexGuard<'_, FreshState> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps the template and payload [`task`] dropped from `t` if it may be dispatched soon (new,
    /// or Pending, and valid: an invalid spec is never dispatched) and they are not above
    /// [`FRESH_ENTRY_BYTES`]. The oldest entries go when the store is full.
    fn keep(&self, t: &AxTask, template: &PodTemplate, payload: Option<&serde_json::Value>) {
        let phase = t.status.as_ref().and_then(|s| s.phase);
        let key = super::task_key(t);
        let json = (matches!(phase, None | Some(TaskPhase::Pending))
            && annotation(t, SPEC_ERROR).is_none())
        .then(|| fresh_json(template, payload))
        .flatten();
        let Some((template, payload)) = json else {
            // An older version's entry is of no use any more.
            self.lock().remove(&key);
            return;
        };
        let mut state = self.lock();
        let seq = state.next;
        state.next += 1;
        let kept = FreshTemplate {
            seq,
            uid: t.metadata.uid.clone(),
            generation: t.metadata.generation,
            template,
            payload,
        };
        state.insert(key, kept);
        while state.by_task.len() > FRESH_TEMPLATES || state.bytes > FRESH_BYTES {
            let Some((seq, oldest)) = state.order.pop_front() else {
                break;
            };
            if state.by_task.get(&oldest).is_some_and(|f| f.seq == seq) {
                state.remove(&oldest);
            }
        }
        // Stale places are dropped as they reach the front; bound them too.
        if state.order.len() > 4 * FRESH_TEMPLATES {
            let FreshState { by_task, order, .. } = &mut *state;
            order.retain(|(seq, key)| by_task.get(key).is_some_and(|f| f.seq == *seq));
        }
    }

    /// A copy of `cached` with the template and payload it arrived with, if they are still here and
    /// of this very task (uid) and spec (generation). They are handed out once.
    pub fn take(&self, key: &TaskKey, cached: &AxTask) -> Option<AxTask> {
        let mut state = self.lock();
        let kept = state.by_task.get(key)?;
        if kept.uid != cached.metadata.uid || kept.generation != cached.metadata.generation {
            state.remove(key);
            return None;
        }
        let kept = state.remove(key)?;
        drop(state);
        // Written by `fresh_json` from what was read: they read back (else the slower way).
        let template = serde_json::from_str(&kept.template).ok()?;
        let payload = match &kept.payload {
            Some(p) => Some(serde_json::from_str(p).ok()?),
            None => None,
        };
        let mut full = cached.clone();
        full.spec.template = template;
        full.spec.payload = payload;
        Some(full)
    }

    /// Forgets a task that is gone.
    pub fn forget(&self, key: &TaskKey) {
        self.lock().remove(key);
    }
}

/// The template and payload as JSON, unless together above [`FRESH_ENTRY_BYTES`] (then written
/// only up to there).
fn fresh_json(
    template: &PodTemplate,
    payload: Option<&serde_json::Value>,
) -> Option<(Box<str>, Option<Box<str>>)> {
    let mut out = Bounded(Vec::new(), FRESH_ENTRY_BYTES);
    serde_json::to_writer(&mut out, &**template).ok()?;
    let template_len = out.0.len();
    if let Some(payload) = payload {
        serde_json::to_writer(&mut out, payload).ok()?;
    }
    let mut json = String::from_utf8(out.0).ok()?;
    let payload = payload
        .is_some()
        .then(|| json.split_off(template_len).into_boxed_str());
    Some((json.into_boxed_str(), payload))
}

/// A buffer that refuses to grow past its bound.
struct Bounded(Vec<u8>, usize);

impl std::io::Write for Bounded {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + bytes.len() > self.1 {
            return Err(std::io::Error::other("above the bound"));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `t` is a cached copy, without its template and payload.
pub fn is_stripped(t: &AxTask) -> bool {
    t.spec.template.is_absent()
}

/// The spec's validation error: from the cache's note when the spec was dropped, else worked out.
pub fn spec_error(t: &AxTask) -> Option<String> {
    if is_stripped(t) {
        annotation(t, SPEC_ERROR).map(str::to_string)
    } else {
        core::validate(&t.spec).err().map(|e| e.to_string())
    }
}

/// Whether the main container has a probe, from the cache's note when the spec was dropped.
pub fn main_has_probe(t: &AxTask) -> bool {
    if is_stripped(t) {
        annotation(t, MAIN_PROBE).is_some()
    } else {
        core::main_has_probe(&t.spec)
    }
}

/// The submitter's `ax.dev/traceparent`, which the cache keeps (the first status write records the
/// trace it names).
pub fn traceparent(t: &AxTask) -> Option<&str> {
    annotation(t, TRACEPARENT_ANNOTATION)
}

/// The cron firing's `ax.dev/tracelink`, kept like [`traceparent`].
pub fn tracelink(t: &AxTask) -> Option<&str> {
    annotation(t, TRACELINK_ANNOTATION)
}

fn annotation<'a>(t: &'a AxTask, key: &str) -> Option<&'a str> {
    t.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Reduces a worker pod to what the operator reads of it.
pub fn pod(p: &mut Pod) {
    let meta = &mut p.metadata;
    meta.managed_fields = None;
    let main = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MAIN_CONTAINER_ANNOTATION))
        .cloned();
    meta.annotations = main.map(|m| BTreeMap::from([(MAIN_CONTAINER_ANNOTATION.to_string(), m)]));
    if let Some(spec) = p.spec.take() {
        let names = |containers: &[Container]| -> Vec<Container> {
            containers
                .iter()
                .map(|c| Container {
                    name: c.name.clone(),
                    ..Container::default()
                })
                .collect()
        };
        p.spec = Some(PodSpec {
            node_name: spec.node_name,
            containers: names(&spec.containers),
            init_containers: spec.init_containers.as_deref().map(names),
            ..PodSpec::default()
        });
    }
    if let Some(status) = p.status.take() {
        let keep = |statuses: Option<Vec<ContainerStatus>>| {
            statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        ready: c.ready,
                        restart_count: c.restart_count,
                        state: c.state,
                        ..ContainerStatus::default()
                    })
                    .collect()
            })
        };
        p.status = Some(PodStatus {
            phase: status.phase,
            reason: status.reason,
            message: status.message,
            conditions: status.conditions,
            container_statuses: keep(status.container_statuses),
            init_container_statuses: keep(status.init_container_statuses),
            ..PodStatus::default()
        });
    }
}

/// The resourceVersion of an object as a number (etcd makes it a counter).
pub fn version_of<K: kube::Resource>(object: &K) -> Option<u64> {
    object.meta().resource_version.as_deref()?.parse().ok()
}

/// Whether a cache has completed its first list, without waiting for it. Never await
/// `Store::wait_until_ready` instead: kube-runtime 5.0 wakes only the last of several waiters, and
/// the others would wait for good.
pub fn cache_listed<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    use futures::FutureExt;
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// Waits until a cache has completed its first list (polling, see [`cache_listed`]).
pub async fn cache_synced<K>(store: &kube::runtime::reflector::Store<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    while !cache_listed(store) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::worker;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::ResourceExt;

    fn task_json(extra: serde_json::Value) -> AxTask {
        let mut v = serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "x", "payload": {"big": "x".repeat(1000)},
                "template": {"spec": {"containers": [{"name": "w", "image": "i",
                    "readinessProbe": {"exec": {"command": ["true"]}}}]}}},
        });
        if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(v).expect("a task")
    }

    /// What the cache keeps of one finished `forEach` item: settled, with what its DAG reads (its
    /// worker pod is deleted once its success is written: `core::task::decide`). Measured, and held
    /// to a bound so that a change that makes a 100,000-item fan-out heavier shows here first.
    #[test]
    fn what_the_caches_keep_of_a_finished_fan_out_item() {
        let at = |s: u32| format!("2026-12-07T08:00:{s:02}.123456Z");
        let entry = |from: Option<&str>, to: &str, reason: &str, message: &str, actor: &str, s| {
            serde_json::json!({"time": at(s), "from": from, "to": to, "attempt": if to == "Pending" { 0 } else { 1 },
                "reason": reason, "message": message, "actor": actor})
        };
        let child = serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {
                "name": "orders-map-1234", "namespace": "e2e-fanout-range-1a2b",
                "uid": "0f5e4b1c-6a3d-4c62-9d2e-1b7f3a9c8e21", "resourceVersion": "1234567",
                "generation": 1, "creationTimestamp": "2026-12-07T08:00:00Z",
                "labels": {"ax.dev/dag": "orders", "ax.dev/dag-task": "map", "ax.dev/item": "1234"},
                "finalizers": ["ax.dev/dag-child"],
                "ownerReferences": [{"apiVersion": "ax.dev/v1alpha1", "kind": "AxDag", "name": "orders",
                    "uid": "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f", "controller": true}],
                "managedFields": [{"manager": "ax-operator", "operation": "Update", "apiVersion": "ax.dev/v1alpha1",
                    "time": "2026-12-07T08:00:01Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {
                "type": "sim-step", "payload": {"item": 1234, "itemIndex": 1234},
                "template": {"spec": {"containers": [{"name": "worker", "image": "localhost/ax-busybox:1",
                    "env": [{"name": "AX_ITEM", "value": "1234"}, {"name": "AX_ITEM_INDEX", "value": "1234"}]}]}},
            },
            "status": {
                "phase": "Succeeded", "attempt": 1, "worker": "orders-map-1234-1", "node": "ax-sim-2",
                "reason": "Completed", "queuedAt": at(0), "scheduledAt": at(1), "startedAt": at(2),
                "finishedAt": at(3), "observedGeneration": 1,
                "history": [
                    entry(None, "Pending", "Queued", "queued for dispatch", "ax-operator/e2e", 0),
                    entry(Some("Pending"), "Scheduled", "Dispatched", "attempt 1 dispatched: worker orders-map-1234-1", "ax-operator/e2e", 1),
                    entry(Some("Scheduled"), "Running", "WorkerRunning", "worker orders-map-1234-1 running on ax-sim-2", "worker", 2),
                    entry(Some("Running"), "Succeeded", "Completed", "worker orders-map-1234-1 exited 0", "worker", 3),
                ],
                "attempts": [{"attempt": 1, "pod": "orders-map-1234-1", "node": "ax-sim-2", "scheduledAt": at(1),
                    "startedAt": at(2), "finishedAt": at(3), "outcome": "Succeeded", "exitCode": 0}],
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Succeeded", "message": "Completed", "lastTransitionTime": "2026-12-07T08:00:03Z", "observedGeneration": 1},
                    {"type": "Queued", "status": "False", "reason": "Succeeded", "message": "", "lastTransitionTime": "2026-12-07T08:00:01Z", "observedGeneration": 1},
                ],
            },
        });
        let cache = || {
            let mut t: AxTask = serde_json::from_value(child.clone()).expect("a task");
            task(&mut t);
            Arc::new(CachedTask::of(t))
        };
        // Once before measuring: what the first call sets up for good (lazy statics) is no item's.
        drop(cache());
        let (cached, bytes) = crate::test_heap::kept_by(cache);
        assert!(cached.whole().is_none(), "a finished item is settled");
        assert!(cached.is_child(), "and stays its DAG's child");
        assert_eq!(cached.child_phase(), TaskPhase::Succeeded);
        assert_eq!(cached.rerun(), Some(0));
        assert!(!cached.has_output() && !cached.may_be_canceled());
        let meta = cached.meta();
        assert_eq!(cached.dag_place(), (Some("map"), Some(Ok(1234))));
        assert_eq!(meta.owner_references.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            meta.finalizers.as_deref(),
            Some(&["ax.dev/dag-child".to_string()][..])
        );
        eprintln!("a finished item: {bytes} bytes");
        // 935 bytes (2026-12-07). Kept whole with its worker pod, it was 3,717 + 6,781 bytes: 1 GB
        // at 100,000 items.
        assert!(bytes > 500, "the counter counts");
        assert!(bytes <= 1_200, "a finished item: {bytes} bytes");

        // One that wrote an output is counted as such; a running one stays whole.
        let mut with_output = child.clone();
        with_output["status"]["output"] = serde_json::json!({"order": 1234});
        let mut t: AxTask = serde_json::from_value(with_output).expect("a task");
        task(&mut t);
        let cached = CachedTask::of(t);
        assert!(cached.has_output() && cached.output().is_none());
        let mut running = child.clone();
        running["status"]["phase"] = "Running".into();
        let mut t: AxTask = serde_json::from_value(running).expect("a task");
        task(&mut t);
        let cached = CachedTask::of(t);
        assert!(cached.whole().is_some() && cached.is_child());
    }

    #[test]
    fn a_cached_task_keeps_what_decisions_read_and_the_facts_of_what_it_drops() {
        let mut t = task_json(serde_json::json!({}));
        assert!(!is_stripped(&t));
        assert!(main_has_probe(&t));
        task(&mut t);
        assert!(is_stripped(&t));
        assert_eq!(t.spec.payload, None);
        assert!(t.spec.template.is_absent());
        assert_eq!(t.metadata.managed_fields, None);
        assert_eq!(t.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
        assert!(main_has_probe(&t));
        assert_eq!(spec_error(&t), None);
        assert_eq!(t.spec.task_type, "x");
    }

    #[test]
    fn a_pending_tasks_template_is_handed_out_once_to_the_same_task_and_spec() {
        let fresh = FreshTemplates::default();
        let key = TaskKey::new(("ns".to_string(), "t".to_string()));
        let mut t = task_json(serde_json::json!({}));
        t.metadata.generation = Some(1);
        let whole = t.clone();
        reduce(&mut t, Some(&fresh));
        // Validated whole before the template went: the cached copy is not "invalid".
        assert_eq!(spec_error(&t), None);
        assert!(is_stripped(&t));
        let mut newer = t.clone();
        newer.metadata.generation = Some(2);
        assert!(fresh.take(&key, &newer).is_none(), "another spec");
        let mut t = whole.clone();
        reduce(&mut t, Some(&fresh));
        let full = fresh.take(&key, &t).expect("kept");
        assert!(!is_stripped(&full));
        assert_eq!(full.spec.template, whole.spec.template);
        assert_eq!(full.spec.payload, whole.spec.payload);
        assert!(fresh.take(&key, &t).is_none(), "handed out once");
        // A running task's template is not kept.
        let mut running = whole.clone();
        running.status = Some(crate::api::AxTaskStatus {
            phase: Some(TaskPhase::Running),
            ..Default::default()
        });
        reduce(&mut running, Some(&fresh));
        assert!(fresh.take(&key, &running).is_none());
    }

    #[test]
    fn the_fresh_templates_keep_only_the_newest() {
        let fresh = FreshTemplates::default();
        let named = |i: usize| {
            let mut t = task_json(serde_json::json!({}));
            t.metadata.name = Some(format!("t-{i}"));
            t
        };
        for round in 0..2 {
            for i in 0..FRESH_TEMPLATES + 10 {
                let mut t = named(i);
                reduce(&mut t, Some(&fresh));
            }
            assert_eq!(fresh.lock().by_task.len(), FRESH_TEMPLATES, "round {round}");
            assert!(fresh.lock().order.len() <= 4 * FRESH_TEMPLATES + 1);
        }
        let mut oldest = named(0);
        task(&mut oldest);
        assert!(
            fresh
                .take(&TaskKey::new(("ns".into(), "t-0".into())), &oldest)
                .is_none()
        );
        let mut newest = named(FRESH_TEMPLATES + 9);
        task(&mut newest);
        let key = TaskKey::new(("ns".to_string(), format!("t-{}", FRESH_TEMPLATES + 9)));
        assert!(fresh.take(&key, &newest).is_some());
    }

    /// The bytes `fresh` counts, checked against every entry's cost summed anew.
    fn counted(fresh: &FreshTemplates) -> usize {
        let state = fresh.lock();
        let sum = state.by_task.values().map(FreshTemplate::cost).sum();
        assert_eq!(state.bytes, sum);
        sum
    }

    #[test]
    fn the_fresh_templates_are_bounded_in_bytes() {
        let fresh = FreshTemplates::default();
        // Arrays of small numbers: about 16 times their JSON once parsed.
        let numbers = vec![7; 20_000];
        let entry = serde_json::to_string(&numbers).unwrap().len();
        assert!(entry < FRESH_ENTRY_BYTES, "{entry}: kept");
        assert!(
            entry > FRESH_BYTES / FRESH_TEMPLATES,
            "{entry}: bytes bind before the count"
        );
        let one = task_json(serde_json::json!({"payload": {"n": numbers}}));
        for i in 0..2 * FRESH_BYTES / entry {
            let mut t = one.clone();
            t.metadata.name = Some(format!("t-{i}"));
            reduce(&mut t, Some(&fresh));
        }
        let bytes = counted(&fresh);
        assert!(bytes <= FRESH_BYTES, "{bytes}");
        assert!(
            bytes + 2 * entry > FRESH_BYTES,
            "{bytes}: filled up to the budget"
        );
        assert!(fresh.lock().by_task.len() < FRESH_TEMPLATES);
        let last = 2 * FRESH_BYTES / entry - 1;
        let mut newest = one.clone();
        newest.metadata.name = Some(format!("t-{last}"));
        let whole = newest.clone();
        task(&mut newest);
        let key = TaskKey::new(("ns".to_string(), format!("t-{last}")));
        let full = fresh.take(&key, &newest).expect("the newest is kept");
        assert_eq!(full.spec, whole.spec);
        counted(&fresh);
        fresh.forget(&TaskKey::new(("ns".to_string(), format!("t-{}", last - 1))));
        counted(&fresh);
    }

    #[test]
    fn oversized_or_invalid_templates_are_not_kept() {
        let fresh = FreshTemplates::default();
        let key = TaskKey::new(("ns".to_string(), "t".to_string()));
        let big = serde_json::json!({"payload": {"n": vec![1; FRESH_ENTRY_BYTES / 2]}});
        let mut t = task_json(big);
        assert_eq!(spec_error(&t), None, "valid, only large");
        reduce(&mut t, Some(&fresh));
        assert!(fresh.take(&key, &t).is_none());
        // A smaller version replaces it; a larger one after it removes it again.
        let mut small = task_json(serde_json::json!({}));
        reduce(&mut small, Some(&fresh));
        let mut t =
            task_json(serde_json::json!({"payload": {"n": vec![1; FRESH_ENTRY_BYTES / 2]}}));
        reduce(&mut t, Some(&fresh));
        assert!(fresh.take(&key, &t).is_none(), "the older version went");
        assert_eq!(counted(&fresh), 0);
        // An invalid version removes a valid one's entry too.
        let mut small = task_json(serde_json::json!({}));
        reduce(&mut small, Some(&fresh));
        let mut invalid =
            task_json(serde_json::json!({"timeout": {"softSeconds": 10, "hardSeconds": 5}}));
        reduce(&mut invalid, Some(&fresh));
        assert!(spec_error(&invalid).is_some());
        assert!(fresh.take(&key, &invalid).is_none());
        assert_eq!(counted(&fresh), 0);
    }

    #[test]
    fn a_child_of_a_dag_or_cron_is_cached_whole_for_its_controller() {
        let mut t = task_json(serde_json::json!({}));
        task(&mut t);
        assert!(CachedTask::of(t.clone()).child().is_none(), "no controller");
        t.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "ax.dev/v1alpha1".into(),
            kind: "AxDag".into(),
            name: "d".into(),
            uid: "dag-uid".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let cached = CachedTask::of(t);
        let child = cached.child().expect("a DAG's child is whole");
        assert_eq!(child.owner_references()[0].uid, "dag-uid");
    }

    #[test]
    fn a_cached_task_remembers_why_its_spec_is_invalid() {
        let mut t =
            task_json(serde_json::json!({"timeout": {"softSeconds": 10, "hardSeconds": 5}}));
        let before = spec_error(&t);
        assert!(before.is_some());
        task(&mut t);
        assert_eq!(spec_error(&t), before);
    }

    #[test]
    fn a_cached_dag_keeps_its_graph_and_drops_its_tasks_specs() {
        let mut d: AxDag = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "d", "namespace": "ns", "uid": "u", "generation": 3,
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"parallelism": 2, "cancel": true, "rerun": 1, "tasks": [
                {"name": "a", "spec": {"type": "x", "queue": "q", "payload": {"big": "x".repeat(1000)},
                    "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}},
                {"name": "b", "dependsOn": ["a"], "spec": {"type": "y",
                    "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}},
                    "forEach": {"items": [{"big": "x".repeat(1000)}, 2], "parallelism": 5}},
            ]},
            "status": {"phase": "Running", "observedGeneration": 3},
        }))
        .expect("a DAG");
        let whole = d.clone();
        assert!(!dag_is_reduced(&whole));
        dag(&mut d);
        assert!(dag_is_reduced(&d));
        assert!(d.metadata.annotations.is_none() && d.metadata.managed_fields.is_none());
        assert_eq!(d.metadata.generation, Some(3));
        assert_eq!(d.status, whole.status);
        let graph = |d: &AxDag| -> Vec<(String, Vec<String>)> {
            d.spec
                .tasks
                .iter()
                .map(|t| (t.name.clone(), t.depends_on.clone()))
                .collect()
        };
        assert_eq!(graph(&d), graph(&whole));
        assert_eq!(
            (d.spec.parallelism, d.spec.cancel, d.spec.rerun),
            (Some(2), true, 1)
        );
        assert!(d.spec.tasks.iter().all(|t| t.spec.payload.is_none()));
        assert_eq!(d.spec.tasks[0].spec.queue, "q", "a task's scalars stay");
        let for_each = d.spec.tasks[1].for_each.as_ref().expect("forEach kept");
        assert_eq!(
            (
                for_each.items.as_ref(),
                for_each.item_count(),
                for_each.parallelism
            ),
            (None, Some(2), Some(5)),
            "a forEach list is kept as its length"
        );
    }

    #[test]
    fn a_cached_pod_is_still_observed_the_same() {
        let raw: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t-1", "uid": "p", "labels": {"ax.dev/task": "t", "ax.dev/attempt": "1"},
                "annotations": {"ax.dev/payload": "x".repeat(10000), "ax.dev/main-container": "w"},
                "finalizers": ["f"], "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 10},
            "spec": {"nodeName": "n", "containers": [{"name": "side", "image": "i"}, {"name": "w", "image": "i",
                "env": [{"name": "AX_PAYLOAD", "value": "x"}]}]},
            "status": {"phase": "Running", "reason": "Evicted", "podIP": "10.0.0.1",
                "conditions": [{"type": "DisruptionTarget", "status": "True"}],
                "containerStatuses": [
                    {"name": "w", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
                     "state": {"terminated": {"exitCode": 3, "message": "m"}}},
                    {"name": "side", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                     "state": {"running": {}}}]}
        }))
        .unwrap();
        let mut stripped = raw.clone();
        pod(&mut stripped);
        assert_eq!(
            worker::observe(&stripped, Some(true)),
            worker::observe(&raw, Some(true))
        );
        let size = |p: &Pod| serde_json::to_string(p).unwrap().len();
        assert!(
            size(&stripped) * 10 < size(&raw),
            "{} vs {}",
            size(&stripped),
            size(&raw)
        );
    }
}
