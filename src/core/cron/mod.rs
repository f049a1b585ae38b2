//! AxCron decisions: cron schedules in IANA time zones ([`schedule`]) and what a cron does at a
//! given moment ([`firing`]): fire, skip (and why), cancel for `Replace`, prune its history.
//!
//! The schedule parser and the next-time search are our own, on top of jiff, rather than a cron
//! crate: the crates that compute in time zones either fire a time twice on the fall-back day
//! (they step through instants, and 01:30 occurs twice) or follow other conventions (7-field
//! Quartz syntax with 1-based weekdays), and none names the offending field in its errors
//! (`field 3 (day of month): 32 out of range 1-31`) or says that `0 0 31 2 *` never fires. Both
//! are a few hundred lines here, and property-tested.
//!
//! Seconds are supported: a sixth field, first, as in Quartz and Spring (`*/10 * * * * *`).

pub mod firing;
pub mod schedule;
pub mod status;

#[cfg(test)]
pub mod fixtures;
#[cfg(test)]
mod tests;

pub use firing::{
    Child, Decision, Finished, Firing, Input, Policy, Skip, SkipReason, child_name, decide,
    history_to_delete, jitter_offset, recorded_missing, to_create,
};
pub use schedule::{ParseError, Schedule};
pub use status::{ChildKind, ChildState, InvalidCron, MAX_NAME, Outcome, cron_status, validate};
