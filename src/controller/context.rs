//! What every reconcile and the dispatcher share: the caches, the queues, the tracking of this
//! process's own writes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;

use super::tracking::Tracking;
use super::{cache, callback, events, owner_index};
use crate::api::AxQueue;
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
    pub tasks: Store<cache::CachedTask>,
    /// The templates of tasks just delivered, for a dispatch that builds its pod at once.
    pub fresh: Arc<cache::FreshTemplates>,
    pub pods: Store<Pod>,
    /// Every pod of each task, by the task's uid: a task's reconcile sees the pods of every
    /// attempt it owns, not only those its status knows (see `task::pods_named`).
    pub pods_by_task: Arc<owner_index::OwnerIndex>,
    pub nodes: Store<Node>,
    pub queue_store: Store<AxQueue>,
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
