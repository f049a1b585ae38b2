//! The console's pages, each a pure function of what the store holds (no client required).

pub mod dags;
pub mod dashboard;
pub mod queues;
pub mod submit;
pub mod task;
pub mod tasks;
