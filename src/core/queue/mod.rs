//! AxQueues (DESIGN §4) as pure logic: a queue spec as configuration (`config`), the dispatcher of
//! one queue with its priority buckets (`dispatcher`), and its parts — bucket weights and their
//! schedule (`weights`), the circuit breaker per task type (`breaker`), the retry token bucket
//! (`token_bucket`) — the registry of every queue and where each task is (`registry`), the status a
//! queue shows (`status`), the adaptive concurrency (`adaptive`) with what it reads from the pods
//! (`capacity`), the estimated start of a waiting task (`estimate`), and where a task's key
//! (tenant) comes from (`key`). No client, no clock: time comes in as arguments.

pub mod adaptive;
pub mod breaker;
pub mod capacity;
pub mod config;
pub mod dispatcher;
pub mod estimate;
pub mod key;
pub mod registry;
pub mod status;
pub mod token_bucket;
pub mod weights;

pub use adaptive::{AdaptiveConcurrency, Change, Observation};
pub use config::{LimitsInForce, MaxWait, QueueConfig, QueueSpecError, queue_config};
pub use dispatcher::{Dispatcher, HeldReason, Holder, Outcome, PendingTask, QueueStats};
pub use registry::{
    Cached, Held, QueueReport, Registry, TaskKey, holder, pending_of, pending_task, rebuild,
};
pub use status::queue_status;
