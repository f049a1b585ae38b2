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
//! - `context`: what they all share; `tracking`: what this process wrote that the caches may not
//!   show yet; `expected`: what it created that they do not show yet; `error`: why a reconcile failed and when to try again.
//! - `run`: the wiring.

pub mod cache;
pub mod callback;
pub mod context;
pub mod cron;
pub mod dag;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod expected;
pub mod list_watch;
pub mod namespace;
pub mod owner_index;
pub mod queue;
pub mod readable;
pub mod run;
pub mod task;
pub mod tracking;
pub mod write;

pub use cache::{cache_listed, cache_synced, version_of};
pub use context::{Context, Ctx, Queues, task_key};
pub use error::{Error, ErrorCategory, Result};
pub use tracking::Tracking;
pub use write::FIELD_MANAGER;

pub use crate::core::queue::TaskKey;
