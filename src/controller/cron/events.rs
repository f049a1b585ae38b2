//! The Events a cron publishes: a firing, a skipped time, with times as people read them; and the
//! metrics counted with them.

use jiff::Timestamp;
use jiff::tz::TimeZone;
use kube::runtime::events::EventType;

use crate::api::AxCron;
use crate::controller::Ctx;
use crate::core::cron::{self as core, Policy, Schedule, Skip, SkipReason};

/// A scheduled time as people read it: UTC, and the wall clock of the cron's zone.
pub(super) fn when(schedule: &Schedule, time: Timestamp) -> String {
    let zone: &TimeZone = schedule.time_zone();
    let local = time.to_zoned(zone.clone());
    match zone.iana_name() {
        Some("UTC") | None => time.to_string(),
        Some(name) => format!("{time} ({} {name})", local.strftime("%Y-%m-%d %H:%M:%S")),
    }
}

pub(super) fn publish_fired(cron: &AxCron, schedule: &Schedule, firing: &core::Firing, ctx: &Ctx) {
    let kind = if cron.spec.task.is_some() {
        "AxTask"
    } else {
        "AxDag"
    };
    let catch_up = if firing.catch_up {
        format!(
            " (catch-up for a missed time, misfirePolicy {:?})",
            cron.spec.misfire_policy
        )
    } else {
        String::new()
    };
    let note = format!(
        "created {kind} {} for {}{catch_up}",
        firing.name,
        when(schedule, firing.scheduled)
    );
    publish(cron, EventType::Normal, "Fired", &note, ctx);
}

pub(super) fn publish_skip(
    cron: &AxCron,
    schedule: &Schedule,
    policy: &Policy,
    skip: &Skip,
    ctx: &Ctx,
) {
    let times = if skip.count == 1 && !skip.at_least {
        format!("scheduled time {}", when(schedule, skip.first))
    } else {
        format!(
            "{}{} scheduled times from {} to {}",
            if skip.at_least { "at least " } else { "" },
            skip.count,
            when(schedule, skip.first),
            when(schedule, skip.last)
        )
    };
    let (type_, reason, why) = match &skip.reason {
        SkipReason::Missed => (
            EventType::Warning,
            "MissedSchedule",
            "missed (the operator was not running or the cron was suspended) and skipped: misfirePolicy Skip".to_owned(),
        ),
        SkipReason::CoveredBy(by) => (
            EventType::Warning,
            "MissedSchedule",
            format!(
                "missed; the run for {} stands for them (misfirePolicy RunOnce)",
                when(schedule, *by)
            ),
        ),
        SkipReason::TooManyMissed => (
            EventType::Warning,
            "MissedSchedule",
            format!(
                "missed and skipped: only the latest {} missed times run (misfirePolicy RunAll, maxCatchUp)",
                policy.max_catch_up
            ),
        ),
        SkipReason::DeadlineExceeded => (
            EventType::Warning,
            "MissedSchedule",
            format!(
                "skipped: more than startingDeadlineSeconds ({}) late",
                policy.starting_deadline.map_or(0, |d| d.as_secs())
            ),
        ),
        SkipReason::ConcurrentChild(child) => (
            EventType::Normal,
            "SkippedConcurrent",
            format!("skipped: {child} is still active (concurrencyPolicy Forbid)"),
        ),
        SkipReason::Superseded(by) => (
            EventType::Normal,
            "Superseded",
            format!(
                "skipped: the run for {} replaces it (concurrencyPolicy Replace)",
                when(schedule, *by)
            ),
        ),
    };
    publish(cron, type_, reason, &format!("{times}: {why}"), ctx);
}

/// Counts a firing in `ax_cron_firings_total`, by the kind of child and whether it catches up.
pub(super) fn count_fired(cron: &AxCron, firing: &core::Firing, ctx: &Ctx) {
    let kind = if cron.spec.task.is_some() {
        "AxTask"
    } else {
        "AxDag"
    };
    ctx.metrics.cron_fired(kind, firing.catch_up);
}

/// Counts skipped times: missed ones in `ax_cron_missed_times_total{reason}`, those the
/// concurrencyPolicy skipped in `ax_cron_concurrency_skips_total{policy}`. The labels are the
/// reason, never the cron, so the series stay few however many crons there are.
pub(super) fn count_skip(skip: &Skip, ctx: &Ctx) {
    match skip_metric(&skip.reason) {
        SkipMetric::Missed(reason) => ctx.metrics.cron_missed(reason, skip.count),
        SkipMetric::Concurrency(policy) => ctx.metrics.cron_concurrency_skipped(policy, skip.count),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum SkipMetric {
    /// A missed time, with the `reason` label.
    Missed(&'static str),
    /// A time the concurrencyPolicy skipped, with the `policy` label.
    Concurrency(&'static str),
}

fn skip_metric(reason: &SkipReason) -> SkipMetric {
    match reason {
        SkipReason::Missed => SkipMetric::Missed("MisfireSkip"),
        SkipReason::CoveredBy(_) => SkipMetric::Missed("CoveredByCatchUp"),
        SkipReason::TooManyMissed => SkipMetric::Missed("TooManyMissed"),
        SkipReason::DeadlineExceeded => SkipMetric::Missed("DeadlineExceeded"),
        SkipReason::ConcurrentChild(_) => SkipMetric::Concurrency("Forbid"),
        SkipReason::Superseded(_) => SkipMetric::Concurrency("Replace"),
    }
}

pub(super) fn publish(cron: &AxCron, type_: EventType, reason: &str, note: &str, ctx: &Ctx) {
    ctx.events.publish(cron, type_, reason, note);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_skips_are_not_counted_as_missed() {
        let t: Timestamp = "2025-03-30T01:00:00Z".parse().unwrap();
        assert_eq!(
            skip_metric(&SkipReason::ConcurrentChild("c-1".into())),
            SkipMetric::Concurrency("Forbid")
        );
        assert_eq!(
            skip_metric(&SkipReason::Superseded(t)),
            SkipMetric::Concurrency("Replace")
        );
        for (reason, label) in [
            (SkipReason::Missed, "MisfireSkip"),
            (SkipReason::CoveredBy(t), "CoveredByCatchUp"),
            (SkipReason::TooManyMissed, "TooManyMissed"),
            (SkipReason::DeadlineExceeded, "DeadlineExceeded"),
        ] {
            assert_eq!(skip_metric(&reason), SkipMetric::Missed(label));
        }
    }

    #[test]
    fn times_in_events_show_the_zone_wall_clock() {
        let berlin = Schedule::parse("@daily", "Europe/Berlin").unwrap();
        let t: Timestamp = "2025-03-30T01:00:00Z".parse().unwrap();
        assert_eq!(
            when(&berlin, t),
            "2025-03-30T01:00:00Z (2025-03-30 03:00:00 Europe/Berlin)"
        );
        let utc = Schedule::parse("@daily", "UTC").unwrap();
        assert_eq!(when(&utc, t), "2025-03-30T01:00:00Z");
    }
}
