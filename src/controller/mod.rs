//! Thin reconcilers (client required): gather inputs from the informer caches, decide with
//! `crate::core`, write once, then act.
//!
//! - `task`: the AxTask reconciler, the only writer of a task's status; it also starts attempts
//!   when the dispatcher grants a slot (`dispatch`), so no two writers race on a task.
//! - `dispatch`: asks the queues which tasks go next and wakes their reconciles.
//! - `queue`: the AxQueue watcher, the queue status loop, the `default` queue, queue Events.
//! - `namespace`: the Namespace watcher, for the queues' `namespaceSelector`.
//! - `dag`: the AxDag reconciler. `cron`: the AxCron reconciler. `owner_index`: their children by
//!   owner uid. `callback`: delivery of `spec.callback`.
//! - `write`: every status write and the reading of API status codes.
//! - `run`: the wiring.

pub mod cache;
pub mod callback;
pub mod cron;
pub mod dag;
pub mod dispatch;
pub mod events;
pub mod list_watch;
pub mod namespace;
pub mod owner_index;
pub mod queue;
pub mod readable;
pub mod run;
pub mod task;
pub mod write;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;

use crate::api::{AxQueue, AxTaskStatus};
use crate::core::queue::Registry;
use crate::core::task::{CallbackResult, ProgressLine};
use crate::ops::metrics::Metrics;

pub use crate::core::queue::TaskKey;

/// The key of a task, whole or as a cache holds it: its namespace and name.
pub fn task_key(task: &impl kube::ResourceExt) -> TaskKey {
    TaskKey::new((task.namespace().unwrap_or_default(), task.name_any()))
}

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "ax-operator";

/// Reconciles of one controller in flight at once. The client speaks HTTP/1.1, so every request
/// in flight holds a TLS connection to the API server: unbounded, a backlog of 100,000 new tasks
/// opened ~700 connections and queued thousands of writes the API server could not serve (504s).
/// A few dozen keep a 2-core API server busy; the rest wait in the controller's queue, deduplicated.
pub fn controller_config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(32)
}

/// How long a pod this process created counts as existing while the cache has not shown it: long
/// enough for any watch lag, short enough that a pod deleted before the cache saw it is noticed.
const EXPECTED_POD_TTL: Duration = Duration::from_secs(60);

/// Why a reconcile failed, by the step that failed: the step and its [`ErrorCategory`] label
/// `ax_reconcile_errors_total`, and the category decides when `error_policy` tries again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {0}: {1}")]
    Read(&'static str, #[source] kube::Error),
    #[error("writing the status: {0}")]
    WriteStatus(#[source] kube::Error),
    #[error("creating the worker pod: {0}")]
    CreatePod(#[source] kube::Error),
    #[error("deleting a worker pod: {0}")]
    DeletePod(#[source] kube::Error),
    #[error("creating a child: {0}")]
    CreateChild(#[source] kube::Error),
    #[error("updating a child (cancel or re-run): {0}")]
    UpdateChild(#[source] kube::Error),
    #[error("deleting a child: {0}")]
    DeleteChild(#[source] kube::Error),
    #[error("removing a finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("deleting the task (ttlSecondsAfterFinished): {0}")]
    DeleteTask(#[source] kube::Error),
    #[error("serializing {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("object has no {0}")]
    Incomplete(&'static str),
}

/// What kind of failure an [`Error`] is, for metrics and for when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCategory {
    /// The object (or what the operator made of it) is invalid: only a change of it can help.
    InvalidObject,
    /// 429 or 5xx: the API server is busy or failing; back off.
    Throttled,
    /// The object changed or vanished meanwhile: its next event brings the new state.
    Stale,
    /// 403: RBAC, a ResourceQuota or an admission webhook refused; may pass later.
    Forbidden,
    /// Transport errors and anything else.
    Transient,
}

impl ErrorCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::InvalidObject => "invalid_object",
            ErrorCategory::Throttled => "throttled",
            ErrorCategory::Stale => "stale",
            ErrorCategory::Forbidden => "forbidden",
            ErrorCategory::Transient => "transient",
        }
    }

    /// How long until the failed reconcile runs again (an event of the object runs it sooner).
    pub fn retry_after(self) -> Duration {
        match self {
            ErrorCategory::InvalidObject => Duration::from_secs(300),
            ErrorCategory::Throttled => Duration::from_secs(10),
            ErrorCategory::Stale => Duration::from_secs(1),
            ErrorCategory::Forbidden => Duration::from_secs(30),
            ErrorCategory::Transient => Duration::from_secs(2),
        }
    }
}

impl Error {
    /// The step that failed, as a metric label.
    pub fn step(&self) -> &'static str {
        match self {
            Error::Read(..) => "read",
            Error::WriteStatus(_) => "write_status",
            Error::CreatePod(_) => "create_pod",
            Error::DeletePod(_) => "delete_pod",
            Error::CreateChild(_) => "create_child",
            Error::UpdateChild(_) => "update_child",
            Error::DeleteChild(_) => "delete_child",
            Error::RemoveFinalizer(_) => "remove_finalizer",
            Error::DeleteTask(_) => "delete_task",
            Error::Serialize(_) => "serialize",
            Error::Incomplete(_) => "incomplete_object",
        }
    }

    /// The API server's error, if the step was a request.
    pub fn api(&self) -> Option<&kube::Error> {
        match self {
            Error::Read(_, e)
            | Error::WriteStatus(e)
            | Error::CreatePod(e)
            | Error::DeletePod(e)
            | Error::CreateChild(e)
            | Error::UpdateChild(e)
            | Error::DeleteChild(e)
            | Error::RemoveFinalizer(e)
            | Error::DeleteTask(e) => Some(e),
            Error::Serialize(_) | Error::Incomplete(_) => None,
        }
    }

    pub fn category(&self) -> ErrorCategory {
        let Some(e) = self.api() else {
            return ErrorCategory::InvalidObject;
        };
        match write::ApiError::of(e) {
            write::ApiError::Conflict
            | write::ApiError::AlreadyExists
            | write::ApiError::NotFound => ErrorCategory::Stale,
            write::ApiError::Forbidden => ErrorCategory::Forbidden,
            write::ApiError::Invalid => ErrorCategory::InvalidObject,
            write::ApiError::Unavailable => ErrorCategory::Throttled,
            write::ApiError::Other => ErrorCategory::Transient,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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

/// What this process knows that the caches may not show yet.
#[derive(Debug)]
pub struct Tracking(Mutex<TrackingState>);

#[derive(Debug)]
struct TrackingState {
    /// The resourceVersion of each task's last status write, until the cache has caught up: a
    /// reconcile on an older copy would decide on stale state and lose its write to a conflict.
    written: HashMap<TaskKey, u64>,
    /// Worker pods created and not yet seen in the cache: (name, attempt, when, created at).
    expected_pods: HashMap<TaskKey, (String, i32, Instant, Timestamp)>,
    /// Callback outcomes waiting to be recorded by the task's reconcile.
    callbacks: HashMap<TaskKey, (CallbackResult, String)>,
    /// Tasks this process asked the API server to delete (their TTL passed), and when: a task held
    /// by a finalizer is not deleted again on every reconcile until it is gone.
    deletions: HashMap<TaskKey, Instant>,
    /// Statuses decided and put off (`core::task::Decision::write_by`), kept until written.
    unwritten: HashMap<TaskKey, Unwritten>,
    /// Put-off statuses whose write delay ran out, waiting their turn to be written.
    progress: ProgressLine<TaskKey>,
}

#[derive(Debug)]
struct Unwritten {
    /// The task it was decided for.
    uid: Option<String>,
    /// The status as written when it was decided: if the cache shows another, it no longer holds.
    written: AxTaskStatus,
    decided: AxTaskStatus,
    turn: Turn,
}

/// Where a status put off stands in the line of due progress writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    NotInLine,
    Waiting,
    /// Let through: the next reconcile writes it.
    Up,
}

impl Tracking {
    /// Nothing tracked yet; due progress writes go at `progress_writes_per_second`.
    pub fn new(progress_writes_per_second: u32) -> Self {
        Self(Mutex::new(TrackingState {
            written: HashMap::new(),
            expected_pods: HashMap::new(),
            callbacks: HashMap::new(),
            deletions: HashMap::new(),
            unwritten: HashMap::new(),
            progress: ProgressLine::new(progress_writes_per_second, Timestamp::now()),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, TrackingState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the cached copy (of `version`) is older than what this process wrote; forgets the
    /// write once the cache has it.
    pub fn is_stale(&self, key: &TaskKey, version: Option<u64>) -> bool {
        let mut state = self.lock();
        match (state.written.get(key), version) {
            (Some(written), Some(cached)) if cached < *written => true,
            (Some(_), _) => {
                state.written.remove(key);
                false
            }
            (None, _) => false,
        }
    }

    pub fn wrote(&self, key: &TaskKey, version: Option<u64>) {
        if let Some(version) = version {
            self.lock().written.insert(key.clone(), version);
        }
    }

    pub fn expect_pod(&self, key: &TaskKey, name: &str, attempt: i32, created_at: Timestamp) {
        let expected = (name.to_string(), attempt, Instant::now(), created_at);
        self.lock().expected_pods.insert(key.clone(), expected);
    }

    /// The pod created for `key` that the cache does not show yet, if any: its name, attempt and
    /// when it was created; `seen` says whether the cache has a pod of that attempt (the
    /// expectation then ends).
    pub fn expected_pod(
        &self,
        key: &TaskKey,
        seen: impl Fn(i32) -> bool,
    ) -> Option<(String, i32, Timestamp)> {
        let mut state = self.lock();
        let (name, attempt, since, created_at) = state.expected_pods.get(key)?.clone();
        if seen(attempt) || since.elapsed() > EXPECTED_POD_TTL {
            state.expected_pods.remove(key);
            return None;
        }
        Some((name, attempt, created_at))
    }

    pub fn callback_done(&self, key: &TaskKey, result: CallbackResult, message: String) {
        self.lock().callbacks.insert(key.clone(), (result, message));
    }

    pub fn take_callback(&self, key: &TaskKey) -> Option<(CallbackResult, String)> {
        self.lock().callbacks.remove(key)
    }

    /// Whether this process asked for the task's deletion in the last minute; records the ask
    /// otherwise (the caller sends it).
    pub fn deletion_sent(&self, key: &TaskKey) -> bool {
        let mut state = self.lock();
        if state
            .deletions
            .get(key)
            .is_some_and(|at| at.elapsed() < EXPECTED_POD_TTL)
        {
            return true;
        }
        state.deletions.insert(key.clone(), Instant::now());
        false
    }

    /// Keeps a status decided for `key` and put off, decided on `written` (and its place in the
    /// line of due progress writes, if it has one).
    pub fn put_off(
        &self,
        key: &TaskKey,
        uid: Option<String>,
        written: AxTaskStatus,
        decided: AxTaskStatus,
    ) {
        let mut state = self.lock();
        let turn = state
            .unwritten
            .get(key)
            .filter(|kept| kept.uid == uid && kept.written == written)
            .map_or(Turn::NotInLine, |kept| kept.turn);
        let unwritten = Unwritten {
            uid,
            written,
            decided,
            turn,
        };
        state.unwritten.insert(key.clone(), unwritten);
    }

    /// Whether a due progress write of `key` may be made now: its turn has come, or nobody waits
    /// and the line has a token free (taken).
    pub fn progress_may_go(&self, key: &TaskKey) -> bool {
        let mut state = self.lock();
        state
            .unwritten
            .get(key)
            .is_some_and(|kept| kept.turn == Turn::Up)
            || state.progress.may_go_now(Timestamp::now())
    }

    /// Puts the status put off for `key` at the end of the line of due progress writes, unless it
    /// is in it already.
    pub fn wait_for_turn(&self, key: &TaskKey) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(kept) = state.unwritten.get_mut(key)
            && kept.turn == Turn::NotInLine
        {
            kept.turn = Turn::Waiting;
            state.progress.wait(key.clone());
        }
    }

    /// Lets due progress writes through as the rate allows at `now`: the tasks to reconcile (and
    /// write), and whether others still wait. A write an outcome carried since has left the line.
    pub fn progress_turns(&self, now: Timestamp) -> (Vec<TaskKey>, bool) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let unwritten = &mut state.unwritten;
        let through = state.progress.let_through(now, |key| {
            unwritten
                .get(key)
                .is_some_and(|kept| kept.turn == Turn::Waiting)
        });
        for key in &through {
            if let Some(kept) = unwritten.get_mut(key) {
                kept.turn = Turn::Up;
            }
        }
        (through, !state.progress.is_empty())
    }

    /// The status put off for this task, if it was decided on the status the cache shows as
    /// written; otherwise it is forgotten (a status write landed since).
    pub fn unwritten(
        &self,
        key: &TaskKey,
        uid: Option<&str>,
        written: &AxTaskStatus,
    ) -> Option<AxTaskStatus> {
        let mut state = self.lock();
        let kept = state.unwritten.get(key)?;
        if kept.uid.as_deref() == uid && kept.written == *written {
            return Some(kept.decided.clone());
        }
        state.unwritten.remove(key);
        None
    }

    /// Whether this process has something of its own to do for the task: a status put off, a pod
    /// just created, a callback's outcome to record.
    pub fn has_work(&self, key: &TaskKey) -> bool {
        let state = self.lock();
        state.unwritten.contains_key(key)
            || state.expected_pods.contains_key(key)
            || state.callbacks.contains_key(key)
    }

    /// The phase of every status put off, by task.
    pub fn unwritten_phases(&self) -> Vec<(TaskKey, crate::api::TaskPhase)> {
        self.lock()
            .unwritten
            .iter()
            .filter_map(|(key, u)| Some((key.clone(), u.decided.phase?)))
            .collect()
    }

    /// The task's status was written: nothing is put off any more.
    pub fn status_written(&self, key: &TaskKey) {
        self.lock().unwritten.remove(key);
    }

    /// Forgets a deleted task.
    pub fn forget(&self, key: &TaskKey) {
        let mut state = self.lock();
        state.written.remove(key);
        state.expected_pods.remove(key);
        state.callbacks.remove(key);
        state.deletions.remove(key);
        state.unwritten.remove(key);
    }

    /// Keys with something tracked, for sweeping out deleted tasks.
    pub fn keys(&self) -> Vec<TaskKey> {
        let state = self.lock();
        state
            .written
            .keys()
            .chain(state.expected_pods.keys())
            .chain(state.callbacks.keys())
            .chain(state.deletions.keys())
            .chain(state.unwritten.keys())
            .cloned()
            .collect()
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

    fn key(name: &str) -> TaskKey {
        TaskKey::new(("ns".into(), name.into()))
    }

    #[test]
    fn a_cached_copy_older_than_our_write_is_stale_until_the_cache_catches_up() {
        let tracking = Tracking::new(10);
        assert!(!tracking.is_stale(&key("a"), Some(5)));
        tracking.wrote(&key("a"), Some(10));
        assert!(tracking.is_stale(&key("a"), Some(9)));
        assert!(!tracking.is_stale(&key("a"), Some(10)));
        // Forgotten once caught up: an older copy later (a re-list) is not held back for ever.
        assert!(!tracking.is_stale(&key("a"), Some(9)));
    }

    #[test]
    fn an_expected_pod_counts_until_the_cache_shows_its_attempt() {
        let tracking = Tracking::new(10);
        let at = Timestamp::from_second(1_900_000_000).expect("in range");
        tracking.expect_pod(&key("a"), "a-2", 2, at);
        assert_eq!(
            tracking.expected_pod(&key("a"), |_| false),
            Some(("a-2".into(), 2, at))
        );
        assert_eq!(
            tracking.expected_pod(&key("a"), |attempt| attempt == 2),
            None
        );
        assert_eq!(tracking.expected_pod(&key("a"), |_| false), None);
    }
}
