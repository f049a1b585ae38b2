//! Production plumbing around the controllers: metrics, the HTTP endpoints and leader election.
//! Independent of the rest of the crate, so each piece is tested on its own.

pub mod http;
pub mod leader;
pub mod metrics;
