//! Thin reconcilers: gather inputs from the informer caches, decide with `crate::core`, write.

pub mod callback;
pub mod cron;
pub mod dag;
pub mod dispatch;
pub mod queue;
pub mod run;
pub mod task;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use tokio::sync::Notify;

use crate::api::{AxQueue, AxTask};
use crate::ops::metrics::Metrics;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "ax-operator";

/// Namespace and name of a task: how the queue refers to it.
pub type TaskKey = (String, String);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("serializing {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("object has no {0}")]
    Incomplete(&'static str),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What every reconcile and the dispatcher share.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub tasks: Store<AxTask>,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub queue_store: Store<AxQueue>,
    /// One dispatcher per AxQueue and where every queued task is.
    pub queues: queue::Queues,
    /// The copy of each queued task as the reconciler last wrote it, which the cache may not have
    /// caught up with yet when the dispatcher picks the task.
    pub queued_copies: Mutex<HashMap<TaskKey, Arc<AxTask>>>,
    /// Wakes the dispatcher when the queue may have something to do.
    pub dispatch_wanted: Notify,
    /// `ax-operator/<pod>`: the actor recorded in history.
    pub operator: String,
    pub callbacks: callback::Callbacks,
    pub metrics: Arc<Metrics>,
}

pub type Ctx = Arc<Context>;

impl Context {
    /// The newer of the cached task and the copy the reconciler queued (by resourceVersion, which
    /// etcd makes a counter; if either does not parse, the queued copy wins as it was written last).
    pub fn freshest_task(&self, key: &TaskKey) -> Option<Arc<AxTask>> {
        let queued = self
            .queued_copies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        let cached = self
            .tasks
            .get(&kube::runtime::reflector::ObjectRef::new(&key.1).within(&key.0));
        let version = |t: &AxTask| {
            t.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        };
        match (queued, cached) {
            (Some(q), Some(c)) => match (version(&q), version(&c)) {
                (Some(qv), Some(cv)) if cv > qv => Some(c),
                _ => Some(q),
            },
            (q, c) => q.or(c),
        }
    }
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

/// Publishes an Event in the background: Events are a record for people, never on the path that
/// moves an object, so a slow or failing events API delays nothing.
pub fn publish_event<K>(recorder: &Recorder, object: &K, type_: EventType, reason: &str, note: &str)
where
    K: kube::Resource<DynamicType = ()>,
{
    let recorder = recorder.clone();
    let reference = object.object_ref(&());
    // The events API limits a note to 1 KiB.
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "publishing event failed");
        }
    });
}
