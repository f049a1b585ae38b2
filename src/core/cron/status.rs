//! What an AxCron shows (no client required): its spec checked, with a typed error naming the
//! field, and its status and conditions from its children and the firing decision — as
//! `core::dag::status` does for DAGs.

use jiff::{SignedDuration, Timestamp};

use super::firing::{Decision, Firing, Policy, jitter_offset};
use super::schedule::Schedule;
use crate::api::{AxCron, AxCronStatus, PendingChild};
use crate::core::conditions::{self, INVALID_SPEC, SUSPENDED, condition, reason};

/// Longest cron name: `<name>-<10-digit unix time>` must still be a valid label value (63), as
/// the children of a DAG child are labelled with its name (CronJob has the same limit).
pub const MAX_NAME: usize = 52;

/// Why a cron's spec cannot run (shown in its `InvalidSpec` condition); each names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCron {
    #[error(
        "metadata.name: at most {MAX_NAME} characters (children are named <cron>-<unix time>), \
         this one has {0}"
    )]
    NameTooLong(usize),
    #[error("spec: exactly one of task and dag must be set")]
    NotOneChildKind,
    #[error("schedule {schedule:?}: {error}")]
    Schedule { schedule: String, error: String },
}

impl InvalidCron {
    /// The field at fault, as the message begins with it.
    pub fn field(&self) -> &'static str {
        match self {
            InvalidCron::NameTooLong(_) => "metadata.name",
            InvalidCron::NotOneChildKind => "spec",
            InvalidCron::Schedule { .. } => "spec.schedule",
        }
    }
}

/// The spec, checked: what the firing decision needs, or why it cannot run.
pub fn validate(cron: &AxCron, uid: &str) -> Result<(Schedule, Policy), InvalidCron> {
    let spec = &cron.spec;
    let name = cron.metadata.name.as_deref().unwrap_or_default();
    if name.len() > MAX_NAME {
        return Err(InvalidCron::NameTooLong(name.len()));
    }
    match (&spec.task, &spec.dag) {
        (Some(_), None) | (None, Some(_)) => {}
        _ => return Err(InvalidCron::NotOneChildKind),
    }
    let schedule =
        Schedule::parse(&spec.schedule, &spec.time_zone).map_err(|e| InvalidCron::Schedule {
            schedule: spec.schedule.clone(),
            error: e.to_string(),
        })?;
    let policy = Policy {
        misfire: spec.misfire_policy,
        max_catch_up: u32::try_from(spec.max_catch_up.clamp(1, 100)).unwrap_or(1),
        starting_deadline: spec
            .starting_deadline_seconds
            .map(|s| SignedDuration::from_secs(s.max(0))),
        concurrency: spec.concurrency_policy,
        jitter: jitter_offset(uid, spec.jitter_seconds),
        suspend: spec.suspend,
    };
    Ok((schedule, policy))
}

/// A child as the caches show it.
#[derive(Debug, Clone)]
pub struct ChildState {
    pub name: String,
    pub scheduled: Timestamp,
    pub kind: ChildKind,
    pub outcome: Outcome,
    /// `spec.cancel` is set already.
    pub canceling: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildKind {
    Task,
    Dag,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Active,
    Succeeded(Option<Timestamp>),
    Failed,
}

/// A recorded pending child as the firing decision reads it.
pub fn firing_of(pending: &PendingChild) -> Firing {
    Firing {
        scheduled: pending.scheduled_time,
        name: pending.name.clone(),
        catch_up: pending.catch_up,
    }
}

pub fn pending_of(firing: &Firing) -> PendingChild {
    PendingChild {
        name: firing.name.clone(),
        scheduled_time: firing.scheduled,
        catch_up: firing.catch_up,
    }
}

/// Whether `message` is news: the status does not say the spec is invalid for that reason yet
/// (the Warning Event goes out once per reason).
pub fn newly_invalid(before: &AxCronStatus, message: &str) -> bool {
    conditions::find(&before.conditions, INVALID_SPEC, true).is_none_or(|c| c.message != message)
}

/// The status after this reconcile: `decision` when the spec is valid, else `invalid` says why;
/// `pending` are the firings whose children are about to be created.
pub fn cron_status(
    cron: &AxCron,
    before: &AxCronStatus,
    children: &[ChildState],
    decision: Option<&Decision>,
    invalid: Option<&str>,
    pending: &[Firing],
    now: Timestamp,
) -> AxCronStatus {
    let generation = cron.metadata.generation;
    let active: Vec<String> = children
        .iter()
        .filter(|c| c.outcome == Outcome::Active)
        .map(|c| c.name.clone())
        .collect();
    let newest_child = children.iter().map(|c| c.scheduled).max();
    let newest_success = children
        .iter()
        .filter_map(|c| match c.outcome {
            Outcome::Succeeded(finished) => finished,
            _ => None,
        })
        .max();
    let (invalid_reason, invalid_message) = match invalid {
        Some(message) => (reason::INVALID_SPEC, message),
        None => (reason::VALID, ""),
    };
    let (suspended_reason, suspended_message) = if cron.spec.suspend {
        (
            reason::SUSPENDED,
            "spec.suspend is true: nothing is created; times passed meanwhile are misfires on resume",
        )
    } else {
        (reason::ACTIVE, "")
    };
    let conditions = vec![
        condition(
            &before.conditions,
            INVALID_SPEC,
            invalid.is_some(),
            invalid_reason,
            invalid_message,
            generation,
            now,
        ),
        condition(
            &before.conditions,
            SUSPENDED,
            cron.spec.suspend,
            suspended_reason,
            suspended_message,
            generation,
            now,
        ),
    ];
    AxCronStatus {
        last_schedule_time: before.last_schedule_time.max(newest_child),
        last_handled_time: decision
            .and_then(|d| d.handled_until)
            .or(before.last_handled_time),
        last_successful_time: before.last_successful_time.max(newest_success),
        next_schedule_time: decision.and_then(|d| d.next_schedule_time),
        active_count: i32::try_from(active.len()).unwrap_or(i32::MAX),
        active,
        pending_children: pending.iter().map(pending_of).collect(),
        conditions,
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MisfirePolicy;

    use crate::core::cron::fixtures::{cron, task};

    fn invalid(c: &AxCron) -> InvalidCron {
        validate(c, "u-1").unwrap_err()
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let bad_field = cron(
            "c",
            serde_json::json!({"schedule": "0 0 32 * *", "task": task()}),
        );
        let error = invalid(&bad_field);
        assert_eq!(
            error.to_string(),
            "schedule \"0 0 32 * *\": field 3 (day of month): 32 out of range 1-31"
        );
        assert_eq!(error.field(), "spec.schedule");
        let both = cron(
            "c",
            serde_json::json!({"schedule": "@daily", "task": task(), "dag": {"tasks": []}}),
        );
        assert_eq!(invalid(&both), InvalidCron::NotOneChildKind);
        assert_eq!(
            invalid(&both).to_string(),
            "spec: exactly one of task and dag must be set"
        );
        let zone = cron(
            "c",
            serde_json::json!({"schedule": "@daily", "timeZone": "Europe/Nowhere", "task": task()}),
        );
        assert!(invalid(&zone).to_string().contains("not an IANA time zone"));
        let long = cron(
            &"x".repeat(53),
            serde_json::json!({"schedule": "@daily", "task": task()}),
        );
        assert_eq!(invalid(&long), InvalidCron::NameTooLong(53));
        assert!(
            invalid(&long)
                .to_string()
                .starts_with("metadata.name: at most 52")
        );
        let ok = cron(
            "c",
            serde_json::json!({"schedule": "*/5 * * * * *", "jitterSeconds": 30, "task": task()}),
        );
        let (_, policy) = validate(&ok, "u-1").unwrap();
        assert_eq!(policy.jitter, jitter_offset("u-1", 30));
        assert_eq!(policy.misfire, MisfirePolicy::Skip);
    }

    #[test]
    fn status_counts_active_children_and_keeps_the_newest_times() {
        let c = cron(
            "c",
            serde_json::json!({"schedule": "@daily", "task": task(), "suspend": true}),
        );
        let t = |s: i64| Timestamp::from_second(s).unwrap();
        let children = [
            ChildState {
                name: "c-100".into(),
                scheduled: t(100),
                kind: ChildKind::Task,
                outcome: Outcome::Succeeded(Some(t(150))),
                canceling: false,
            },
            ChildState {
                name: "c-200".into(),
                scheduled: t(200),
                kind: ChildKind::Task,
                outcome: Outcome::Active,
                canceling: false,
            },
        ];
        let before = AxCronStatus {
            last_successful_time: Some(t(120)),
            ..Default::default()
        };
        let status = cron_status(
            &c,
            &before,
            &children,
            Some(&Decision::default()),
            None,
            &[],
            t(300),
        );
        assert_eq!(status.active, ["c-200"]);
        assert_eq!(status.active_count, 1);
        assert_eq!(status.last_schedule_time, Some(t(200)));
        assert_eq!(status.last_successful_time, Some(t(150)));
        let suspended = conditions::find(&status.conditions, SUSPENDED, true).unwrap();
        assert_eq!(suspended.reason, reason::SUSPENDED);
        assert!(newly_invalid(&status, "bad"));
        let invalid = cron_status(&c, &status, &children, None, Some("bad"), &[], t(400));
        let condition = conditions::find(&invalid.conditions, INVALID_SPEC, true).unwrap();
        assert_eq!(condition.message, "bad");
        assert_eq!(
            condition.last_transition_time.0,
            t(400),
            "the status changed"
        );
        assert_eq!(
            conditions::find(&invalid.conditions, SUSPENDED, true)
                .unwrap()
                .last_transition_time
                .0,
            t(300),
            "unchanged"
        );
        assert_eq!(invalid.next_schedule_time, None);
        assert!(!newly_invalid(&invalid, "bad"));
        assert!(newly_invalid(&invalid, "worse"));
    }
}
