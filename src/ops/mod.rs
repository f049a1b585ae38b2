//! Production plumbing around the controllers: metrics (with the process's own and the API
//! client's), the HTTP endpoints and leader election.
//! Independent of the rest of the crate, so each piece is tested on its own.

pub mod api_requests;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod process;
pub mod traces;
