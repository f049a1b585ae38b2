//! ax: a Kubernetes operator that schedules and supervises tasks.
//!
//! `api` holds the custom resource types, `core` every decision as pure functions over plain data,
//! `controller` the thin reconcilers that read, decide with the core, and write; `ops` metrics, the
//! HTTP endpoints and leader election; `cli` the `kubectl ax` plugin (binary `kubectl-ax`),
//! `console` its web console (`kubectl ax ui`), and `client` what both front ends share: the
//! connection, the errors, the requests they write and what they make of what they read; `yaml`
//! the one YAML dialect they all read and write.

// No object the API server accepts and no user input may panic the operator or the CLI: an
// `unwrap` outside tests is an error (an invariant that cannot fail says why in an `expect`).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod api;
pub mod cli;
pub mod client;
pub mod console;
pub mod controller;
pub mod core;
pub mod ops;
pub mod yaml;

#[cfg(test)]
mod module_import_tests;
#[cfg(test)]
mod schema_tests;
#[cfg(test)]
mod test_heap;
