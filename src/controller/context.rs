//! What every reconcile — of tasks, DAGs and crons — and the dispatcher share: the caches, the
//! queues, the tracking of this process's own writes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Notify;

use super::expected::Expected;
use super::tracking::Tracking;
use super::{cache, callback, events, owner_index};
use crate::api::{AxCron, AxDag, AxQueue, AxTaskTemplate};
use crate::core::queue::{Registry, TaskKey};
use crate::ops::metrics::Metrics;

/// The key of a task, whole or as a cache holds it: its namespace and name.
pub fn task_key(task: &impl kube::ResourceExt) -> TaskKey {
    TaskKey::new((task.namespace().unwrap_or_default(), task.name_any()))
}
/// What every reconcile and the dispatcher share.
pub struct Context {
    pub client: Client,
    pub events: events::Events,
    /// Every readable AxTask: the task controller's, and the children DAGs and crons read.
    pub tasks: Store<cache::CachedTask>,
    /// `tasks` by the uid of their controller (a DAG or a cron): a reconcile reads its own
    /// children, not every task.
    pub tasks_by_owner: Arc<owner_index::OwnerIndex>,
    /// Every readable AxDag, as `cache::dag` keeps it.
    pub dags: Store<AxDag>,
    /// `dags` by the uid of their controller (a cron).
    pub dags_by_owner: Arc<owner_index::OwnerIndex>,
    /// Every readable AxCron.
    pub crons: Store<AxCron>,
    /// DAG children created and not yet in `tasks`, by DAG uid: without them a reconcile on a
    /// lagging cache would count fewer children at work than there are, and exceed `parallelism`.
    pub dag_children: Expected<String, ()>,
    /// Cron children created and not yet in `tasks` or `dags`, by cron uid: name -> scheduled time.
    pub cron_children: Expected<String, Timestamp>,
    /// Reconciles the DAG or cron that controls a child that changed.
    pub owner_wake: OwnerWake,
    /// The templates of tasks just delivered, for a dispatch that builds its pod at once.
    pub fresh: Arc<cache::FreshTemplates>,
    pub pods: Store<Pod>,
    /// Every pod of each task, by the task's uid: a task's reconcile sees the pods of every
    /// attempt it owns, not only those its status knows (see `task::pods_named`).
    pub pods_by_task: Arc<owner_index::OwnerIndex>,
    pub nodes: Store<Node>,
    pub queue_store: Store<AxQueue>,
    /// Every readable AxTaskTemplate: tasks with `spec.templateRef` are completed from them.
    pub templates: Store<AxTaskTemplate>,
    /// Namespaces, metadata only: their labels decide which tasks a queue admits.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// One dispatcher per AxQueue and where every task is.
    pub queues: Queues,
    /// Wakes the dispatch loop when a slot may have been freed or a task became eligible.
    pub dispatch_wanted: Notify,
    /// Reconciles a task soon: it was granted a slot, what holds it changed, its callback answered.
    pub wake: UnboundedSender<ObjectRef<cache::CachedTask>>,
    pub tracking: Tracking,
    /// `ax-operator/<pod>`: the actor recorded in history.
    pub operator: String,
    pub callbacks: callback::Callbacks,
    pub metrics: Arc<Metrics>,
    /// See `core::task::Inputs::progress_write_delay`.
    pub progress_write_delay: Duration,
    /// Task spans go here (`ops::traces`); off unless an OTLP endpoint is configured.
    pub traces: crate::ops::traces::Traces,
    /// A due progress write joined the line (`task::pace_progress_writes`).
    pub progress_due: Notify,
}

pub type Ctx = Arc<Context>;

impl Context {
    /// Asks for a reconcile of the task `key` (dropped if the controller stopped).
    pub fn wake(&self, key: &TaskKey) {
        let _ = self
            .wake
            .unbounded_send(ObjectRef::new(&key.1).within(&key.0));
    }
}

/// Where a child's change goes: to its DAG's or its cron's reconcile, as `owns` does for a
/// controller with an informer of its own.
pub struct OwnerWake {
    pub dags: UnboundedSender<ObjectRef<AxDag>>,
    pub crons: UnboundedSender<ObjectRef<AxCron>>,
    /// Tasks whose exit handler (`spec.onExit`) changed.
    pub tasks: UnboundedSender<ObjectRef<cache::CachedTask>>,
}

impl OwnerWake {
    /// Asks for a reconcile of `child`'s controller, if it is a DAG, a cron or a task (dropped if
    /// that controller stopped).
    pub fn child_changed(&self, child: &impl Resource) {
        let Some(namespace) = child.meta().namespace.as_deref() else {
            return;
        };
        let owners = child.owner_references().iter();
        for owner in owners.filter(|owner| owner.controller == Some(true)) {
            if is_kind::<AxDag>(owner) {
                let _ = self
                    .dags
                    .unbounded_send(ObjectRef::new(&owner.name).within(namespace));
            } else if is_kind::<AxCron>(owner) {
                let _ = self
                    .crons
                    .unbounded_send(ObjectRef::new(&owner.name).within(namespace));
            } else if is_kind::<crate::api::AxTask>(owner) {
                let _ = self
                    .tasks
                    .unbounded_send(ObjectRef::new(&owner.name).within(namespace));
            }
        }
    }
}

/// Whether `owner` refers to a `K`, of any version of its group.
fn is_kind<K: Resource<DynamicType = ()>>(
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> bool {
    let group = owner
        .api_version
        .split_once('/')
        .map_or("", |(group, _)| group);
    owner.kind == K::kind(&()) && group == K::group(&())
}

/// The registry behind a lock, as the reconcilers and the dispatch loop share it.
#[derive(Debug, Default)]
pub struct Queues {
    registry: Mutex<Registry>,
}

impl Queues {
    /// A panic while holding the lock cannot leave the registry half-updated in a way that matters
    /// more than stopping dispatch, so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AxTask;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owner(api_version: &str, kind: &str, name: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            controller: Some(controller),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn a_childs_change_wakes_its_controlling_dag_cron_or_task_only() {
        let (dags, mut dags_woken) = futures::channel::mpsc::unbounded();
        let (crons, mut crons_woken) = futures::channel::mpsc::unbounded();
        let (tasks, mut tasks_woken) = futures::channel::mpsc::unbounded();
        let wake = OwnerWake { dags, crons, tasks };
        let mut child = AxTask::new("c", Default::default());
        child.metadata.namespace = Some("ns".into());
        child.metadata.owner_references = Some(vec![
            owner("ax.dev/v1alpha1", "AxDag", "d", true),
            owner("ax.dev/v1alpha1", "AxCron", "not-the-controller", false),
            owner("other.io/v1", "AxCron", "another-group", true),
        ]);
        wake.child_changed(&child);
        let dag = dags_woken.try_recv().expect("the DAG is woken");
        assert_eq!(
            (dag.name.as_str(), dag.namespace.as_deref()),
            ("d", Some("ns"))
        );
        assert!(dags_woken.try_recv().is_err());
        assert!(crons_woken.try_recv().is_err(), "no cron controls it");

        child.metadata.owner_references = Some(vec![owner("ax.dev/v1", "AxCron", "c", true)]);
        wake.child_changed(&child);
        assert_eq!(crons_woken.try_recv().expect("the cron").name, "c");
        assert!(tasks_woken.try_recv().is_err());

        // An exit handler wakes the task it handles.
        child.metadata.owner_references = Some(vec![owner("ax.dev/v1alpha1", "AxTask", "t", true)]);
        wake.child_changed(&child);
        assert_eq!(tasks_woken.try_recv().expect("the task").name, "t");
    }
}
