//! The front ends' view of the cluster, shared by `cli` (`kubectl ax`) and `console` (its web
//! console): the connection and its reads (`ctx`), the errors a person reads (`error`), whether
//! the operator is running (`operator`), the re-run and cancel requests (`rerun`), the task a
//! submit creates (`submit`), what a task's status and worker pods say (`task`), how a DAG is
//! drawn (`dag`), and times as both show them (`format`). Nothing here imports either front end.

pub mod ctx;
pub mod dag;
pub mod error;
pub mod format;
pub mod operator;
pub mod rerun;
pub mod submit;
pub mod task;
