//! Tests of the cron core: parsing and its errors, next times through DST in two zones and leap
//! days, a brute-force reference for the next-time search, and the firing decisions (misfire,
//! deadline, overlap, idempotence across lost status writes) under random operator timelines.

use std::collections::{BTreeMap, BTreeSet};

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::firing::{Due, MAX_TOLERANCE, due_times, tolerance};
use super::*;
use crate::api::{ConcurrencyPolicy, MisfirePolicy};

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn schedule(expression: &str, zone: &str) -> Schedule {
    Schedule::parse(expression, zone).unwrap_or_else(|e| panic!("{expression}: {e}"))
}

fn error(expression: &str) -> String {
    match Schedule::parse(expression, "UTC") {
        Ok(_) => panic!("{expression} parsed"),
        Err(e) => e.to_string(),
    }
}

/// The next `n` times after `after`, as RFC 3339 instants.
fn next_n(s: &Schedule, after: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = ts(after);
    for _ in 0..n {
        let Some(next) = s.next_after(cursor) else {
            break;
        };
        out.push(next.to_string());
        cursor = next;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Parsing

#[test]
fn errors_name_the_field_and_the_problem() {
    assert_eq!(
        error("0 0 32 * *"),
        "field 3 (day of month): 32 out of range 1-31"
    );
    assert_eq!(
        error("0 0 0 32 * *"),
        "field 4 (day of month): 32 out of range 1-31"
    );
    assert_eq!(error("0 24 * * *"), "field 2 (hour): 24 out of range 0-23");
    assert_eq!(
        error("60 * * * *"),
        "field 1 (minute): 60 out of range 0-59"
    );
    assert_eq!(
        error("60 * * * * *"),
        "field 1 (second): 60 out of range 0-59"
    );
    assert_eq!(error("*/0 * * * *"), "field 1 (minute): step 0");
    assert_eq!(
        error("* * * * 8"),
        "field 5 (day of week): 8 out of range 0-7"
    );
    assert_eq!(
        error("5-1 * * * *"),
        "field 1 (minute): range 5-1 goes backwards"
    );
    assert_eq!(
        error("* * * FOO *"),
        "field 4 (month): \"FOO\" is neither a number nor one of JAN, FEB, MAR, APR, MAY, JUN, \
         JUL, AUG, SEP, OCT, NOV, DEC"
    );
    assert_eq!(
        error("x * * * *"),
        "field 1 (minute): \"x\" is not a number"
    );
    assert_eq!(
        error("1,,2 * * * *"),
        "field 1 (minute): empty list item in \"1,,2\""
    );
    assert_eq!(
        error("? * * * *"),
        "field 1 (minute): `?` is only allowed in the day-of-month and day-of-week fields"
    );
    assert!(
        error("* * *").starts_with("expected 5 fields"),
        "{}",
        error("* * *")
    );
    assert!(error("* * * * * * *").contains("got 7"));
    assert!(error("@reboot").starts_with("unknown macro \"@reboot\""));
    let zone = Schedule::parse("* * * * *", "Mars/Olympus_Mons").unwrap_err();
    assert_eq!(
        zone.to_string(),
        "timeZone: \"Mars/Olympus_Mons\" is not an IANA time zone"
    );
}

#[test]
fn a_schedule_that_never_fires_is_an_error_that_says_so() {
    assert_eq!(
        error("0 0 31 2 *"),
        "field 3 (day of month) and field 4 (month): the schedule never fires, February has no \
         day 31"
    );
    assert_eq!(
        error("0 0 0 30,31 2 *"),
        "field 4 (day of month) and field 5 (month): the schedule never fires, February has no \
         day 30, 31"
    );
    assert!(error("0 0 31 4,6,9,11 *").contains("April, June, September, November has no day 31"));
    // With a restricted day of week the fields are a union (Vixie cron): Mondays in February.
    let mondays = schedule("0 0 31 2 MON", "UTC");
    assert_eq!(
        next_n(&mondays, "2025-01-01T00:00:00Z", 2),
        ["2025-02-03T00:00:00Z", "2025-02-10T00:00:00Z"]
    );
}

#[test]
fn leap_days_fire_only_in_leap_years() {
    let leap = schedule("0 12 29 2 *", "UTC");
    assert_eq!(
        next_n(&leap, "2025-01-01T00:00:00Z", 2),
        ["2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"]
    );
    // 2100 is not a leap year: eight years between two firings.
    assert_eq!(
        next_n(&leap, "2096-03-01T00:00:00Z", 1),
        ["2104-02-29T12:00:00Z"]
    );
    // The last day of February in a leap year, in a zone ahead of UTC.
    let tokyo = schedule("30 23 28,29 2 *", "Asia/Tokyo");
    assert_eq!(
        next_n(&tokyo, "2024-02-01T00:00:00Z", 3),
        [
            "2024-02-28T14:30:00Z",
            "2024-02-29T14:30:00Z",
            "2025-02-28T14:30:00Z"
        ]
    );
}

#[test]
fn macros_names_and_sunday_as_seven() {
    let pairs = [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
        ("0 0 * * 7", "0 0 * * SUN"),
        ("0 0 1 jan-mar *", "0 0 1 1-3 *"),
        ("0 0 * * mon-fri", "0 0 * * 1-5"),
        ("0 0 ? * 1", "0 0 * * 1"),
        ("0 */6 * * *", "0 0,6,12,18 * * *"),
        ("0 3/6 * * *", "0 3,9,15,21 * * *"),
        ("0 1-10/4 * * *", "0 1,5,9 * * *"),
        ("0 0 * * 5-7", "0 0 * * 0,5,6"),
    ];
    for (a, b) in pairs {
        let (sa, sb) = (schedule(a, "UTC"), schedule(b, "UTC"));
        assert_eq!(
            next_n(&sa, "2024-12-30T10:07:00Z", 12),
            next_n(&sb, "2024-12-30T10:07:00Z", 12),
            "{a} vs {b}"
        );
    }
}

#[test]
fn day_fields_follow_vixie_cron() {
    // `*/2` starts with `*`: both day fields must match (odd days that are weekends).
    let intersect = schedule("0 12 */2 * 0,6", "UTC");
    assert_eq!(
        next_n(&intersect, "2024-09-24T13:06:52Z", 2),
        ["2024-09-29T12:00:00Z", "2024-10-05T12:00:00Z"]
    );
    // `1-31/2` does not: either matches (odd days, and weekends).
    let union = schedule("0 12 1-31/2 * 0,6", "UTC");
    assert_eq!(
        next_n(&union, "2024-09-24T13:06:52Z", 4),
        [
            "2024-09-25T12:00:00Z",
            "2024-09-27T12:00:00Z",
            "2024-09-28T12:00:00Z",
            "2024-09-29T12:00:00Z"
        ]
    );
}

#[test]
fn seconds_field() {
    let every_ten = schedule("*/10 * * * * *", "UTC");
    assert_eq!(
        next_n(&every_ten, "2025-01-01T00:00:05.5Z", 3),
        [
            "2025-01-01T00:00:10Z",
            "2025-01-01T00:00:20Z",
            "2025-01-01T00:00:30Z"
        ]
    );
    // Strictly after: a time exactly on the schedule is not its own next time.
    assert_eq!(
        next_n(&every_ten, "2025-01-01T00:00:10Z", 1),
        ["2025-01-01T00:00:20Z"]
    );
    // Five fields fire at second 0.
    let minutely = schedule("* * * * *", "UTC");
    assert_eq!(
        next_n(&minutely, "2025-01-01T00:00:00.001Z", 1),
        ["2025-01-01T00:01:00Z"]
    );
}

// ---------------------------------------------------------------------------------------------
// Daylight saving time, in two zones

#[test]
fn spring_forward_runs_a_time_in_the_gap_once_at_the_end_of_the_gap() {
    // Europe/Berlin, 2025-03-30: 02:00 CET becomes 03:00 CEST (01:00Z).
    let berlin = schedule("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        next_n(&berlin, "2025-03-28T12:00:00Z", 3),
        [
            "2025-03-29T01:30:00Z", // 02:30 CET
            "2025-03-30T01:00:00Z", // 02:30 does not exist: 03:00 CEST
            "2025-03-31T00:30:00Z"  // 02:30 CEST
        ]
    );
    // America/New_York, 2025-03-09: 02:00 EST becomes 03:00 EDT (07:00Z). The four quarter
    // hours of the gap and 03:00 itself collapse into one firing at 03:00.
    let new_york = schedule("*/15 * * * *", "America/New_York");
    assert_eq!(
        next_n(&new_york, "2025-03-09T06:40:00Z", 3),
        [
            "2025-03-09T06:45:00Z", // 01:45 EST
            "2025-03-09T07:00:00Z", // 03:00 EDT
            "2025-03-09T07:15:00Z"  // 03:15 EDT
        ]
    );
}

#[test]
fn fall_back_never_fires_twice() {
    // Europe/Berlin, 2025-10-26: 03:00 CEST becomes 02:00 CET; 02:30 occurs twice.
    let berlin = schedule("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        next_n(&berlin, "2025-10-25T12:00:00Z", 2),
        [
            "2025-10-26T00:30:00Z", // 02:30 CEST, the first occurrence
            "2025-10-27T01:30:00Z"  // the next day, 02:30 CET
        ]
    );
    // America/New_York, 2025-11-02: 02:00 EDT becomes 01:00 EST; the second 01:00-01:59 runs
    // nothing.
    let new_york = schedule("*/30 * * * *", "America/New_York");
    assert_eq!(
        next_n(&new_york, "2025-11-02T04:50:00Z", 4),
        [
            "2025-11-02T05:00:00Z", // 01:00 EDT
            "2025-11-02T05:30:00Z", // 01:30 EDT
            "2025-11-02T07:00:00Z", // 02:00 EST
            "2025-11-02T07:30:00Z"  // 02:30 EST
        ]
    );
    // Asked from inside the repeated hour, the next time is after it.
    assert_eq!(
        next_n(&new_york, "2025-11-02T06:10:00Z", 1), // 01:10 EST
        ["2025-11-02T07:00:00Z"]
    );
}

/// The reference semantics, checked instant by instant: an instant fires when its civil time
/// matches and this is the civil time's first occurrence, or when it ends a DST gap that
/// contains a matching civil time.
fn fires_by_reference(s: &Schedule, zone: &TimeZone, instant: Timestamp) -> bool {
    let civil = instant.to_zoned(zone.clone()).datetime();
    let first_occurrence = match zone.to_ambiguous_timestamp(civil).offset() {
        AmbiguousOffset::Unambiguous { .. } => true,
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(civil).ok() == Some(instant),
        AmbiguousOffset::Gap { .. } => false,
    };
    if first_occurrence && s.matches(civil) {
        return true;
    }
    // Does a gap end here? Then the civil times from the old offset's reading up to now were
    // skipped.
    let before = (instant - SignedDuration::from_nanos(1))
        .to_zoned(zone.clone())
        .offset();
    let after = instant.to_zoned(zone.clone()).offset();
    if after.seconds() <= before.seconds() {
        return false;
    }
    let gap_start = instant.to_zoned(TimeZone::fixed(before)).datetime();
    let mut minute = gap_start;
    while minute < civil {
        if s.matches(minute) {
            return true;
        }
        minute = minute
            .checked_add(SignedDuration::from_mins(1))
            .expect("in range");
    }
    false
}

/// A zone and an instant within a day of one of its DST changes of 2024/2025 (or of a leap
/// day, in UTC).
fn near_dst() -> impl Strategy<Value = (&'static str, Timestamp)> {
    let changes = vec![
        ("Europe/Berlin", "2025-03-30T01:00:00Z"), // spring forward
        ("Europe/Berlin", "2025-10-26T01:00:00Z"), // fall back
        ("America/New_York", "2025-03-09T07:00:00Z"), // spring forward
        ("America/New_York", "2025-11-02T06:00:00Z"), // fall back
        ("Australia/Sydney", "2025-04-05T16:00:00Z"), // fall back (April)
        ("Australia/Sydney", "2024-10-05T16:00:00Z"), // spring forward (October)
        ("UTC", "2024-02-29T00:00:00Z"),           // a leap day
    ];
    (prop::sample::select(changes), -26 * 3600i64..26 * 3600)
        .prop_map(|((zone, change), offset)| (zone, ts(change) + SignedDuration::from_secs(offset)))
}

/// Minute-level expressions that fire often enough to meet DST changes.
fn minute_expression() -> impl Strategy<Value = String> {
    let minute = prop::sample::select(vec!["*", "0", "30", "*/15", "5,35", "0-10/5", "59"]);
    let hour = prop::sample::select(vec!["*", "2", "1-3", "*/2", "0,2,23", "3"]);
    let dom = prop::sample::select(vec!["*", "*", "1-31/2", "29", "26,30,9"]);
    let dow = prop::sample::select(vec!["*", "*", "0", "1-5", "SAT,SUN"]);
    (minute, hour, dom, dow).prop_map(|(m, h, d, w)| format!("{m} {h} {d} * {w}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// next_after agrees with the reference, minute by minute over two days around a DST change.
    #[test]
    fn next_after_matches_the_reference(
        expression in minute_expression(),
        (zone, start) in near_dst(),
    ) {
        let s = schedule(&expression, zone);
        let tz = TimeZone::get(zone).unwrap();
        let start = start.round(jiff::Unit::Minute).unwrap();
        let end = start + SignedDuration::from_hours(48);
        let mut expected = Vec::new();
        let mut minute = start + SignedDuration::from_mins(1);
        while minute <= end {
            if fires_by_reference(&s, &tz, minute) {
                expected.push(minute);
            }
            minute += SignedDuration::from_mins(1);
        }
        let mut actual = Vec::new();
        let mut cursor = start;
        while let Some(next) = s.next_after(cursor) {
            if next > end {
                break;
            }
            actual.push(next);
            cursor = next;
        }
        prop_assert_eq!(actual, expected, "{} in {}", expression, zone);
    }

    /// Strictly after, monotonic in its argument, and with nothing in between.
    #[test]
    fn next_after_is_strictly_later_and_monotonic(
        expression in minute_expression(),
        (zone, a) in near_dst(),
        gap in 0i64..200_000_000_000,
    ) {
        let s = schedule(&expression, zone);
        let b = a + SignedDuration::from_nanos(gap);
        let (na, nb) = (s.next_after(a).unwrap(), s.next_after(b).unwrap());
        prop_assert!(na > a);
        prop_assert!(nb > b);
        prop_assert!(na <= nb);
        // Nothing fires in (a, na): asking from any instant before na gives na.
        if b < na {
            prop_assert_eq!(nb, na);
        }
    }

    /// Consecutive firings are at strictly later civil times too: no civil time fires twice.
    #[test]
    fn no_civil_time_fires_twice(
        expression in minute_expression(),
        (zone, start) in near_dst(),
    ) {
        let s = schedule(&expression, zone);
        let tz = TimeZone::get(zone).unwrap();
        let mut cursor = start;
        let mut last_civil: Option<DateTime> = None;
        for _ in 0..200 {
            let next = s.next_after(cursor).unwrap();
            let civil = next.to_zoned(tz.clone()).datetime();
            if let Some(last) = last_civil {
                prop_assert!(civil > last, "{} then {} ({} in {})", last, civil, expression, zone);
            }
            last_civil = Some(civil);
            cursor = next;
        }
    }

    /// Any expression the parser accepts has a next time, and it matches unless it ends a gap.
    #[test]
    fn accepted_schedules_fire(
        second in prop::option::of(0u8..60),
        minute in 0u8..60,
        hour in 0u8..24,
        dom in 1u8..32,
        month in 1u8..13,
        (zone, start) in near_dst(),
    ) {
        let expression = match second {
            Some(sec) => format!("{sec} {minute} {hour} {dom} {month} *"),
            None => format!("{minute} {hour} {dom} {month} *"),
        };
        let longest = match month { 2 => 29, 4 | 6 | 9 | 11 => 30, _ => 31 };
        match Schedule::parse(&expression, zone) {
            Err(e) => {
                prop_assert!(dom > longest, "{}: {}", expression, e);
                prop_assert!(e.to_string().contains("never fires"));
            }
            Ok(s) => {
                prop_assert!(dom <= longest);
                let next = s.next_after(start).expect("fires");
                prop_assert!(next > start);
                let tz = TimeZone::get(zone).unwrap();
                let civil = next.to_zoned(tz.clone()).datetime();
                let at_transition = tz
                    .preceding(next + SignedDuration::from_nanos(1))
                    .next()
                    .is_some_and(|t| t.timestamp() == next);
                prop_assert!(s.matches(civil) || at_transition, "{} fired at {}", expression, civil);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Firing decisions

fn policy(misfire: MisfirePolicy, concurrency: ConcurrencyPolicy) -> Policy {
    Policy {
        misfire,
        max_catch_up: 10,
        starting_deadline: None,
        concurrency,
        jitter: SignedDuration::ZERO,
        suspend: false,
    }
}

fn run(s: &Schedule, p: &Policy, handled_until: &str, now: &str, children: &[Child]) -> Decision {
    decide(&Input {
        cron: "c",
        schedule: s,
        policy: p,
        handled_until: ts(handled_until),
        now: ts(now),
        children,
    })
}

fn created(d: &Decision) -> Vec<(String, bool)> {
    d.create
        .iter()
        .map(|f| (f.scheduled.to_string(), f.catch_up))
        .collect()
}

fn reasons(d: &Decision) -> Vec<(u64, SkipReason)> {
    d.skipped
        .iter()
        .map(|s| (s.count, s.reason.clone()))
        .collect()
}

#[test]
fn a_regular_time_fires_once_and_the_next_is_planned() {
    let s = schedule("* * * * *", "UTC");
    let p = policy(MisfirePolicy::Skip, ConcurrencyPolicy::Allow);
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T12:01:00.300Z",
        &[],
    );
    assert_eq!(created(&d), [("2025-01-01T12:01:00Z".into(), false)]);
    assert_eq!(
        d.create[0].name,
        format!("c-{}", ts("2025-01-01T12:01:00Z").as_second())
    );
    assert!(d.skipped.is_empty());
    assert_eq!(d.handled_until, Some(ts("2025-01-01T12:01:00Z")));
    assert_eq!(d.next_schedule_time, Some(ts("2025-01-01T12:02:00Z")));
    assert_eq!(d.wake_at, Some(ts("2025-01-01T12:02:00Z")));

    // A moment early: nothing yet.
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T12:00:59.900Z",
        &[],
    );
    assert_eq!(
        d,
        Decision {
            next_schedule_time: Some(ts("2025-01-01T12:01:00Z")),
            wake_at: Some(ts("2025-01-01T12:01:00Z")),
            ..Decision::default()
        }
    );
}

#[test]
fn misfire_policies_after_an_outage_of_three_times() {
    // Handled up to 12:00; the operator comes back at 12:03:40, past the tolerance (30 s) of 12:03.
    let s = schedule("* * * * *", "UTC");
    let (from, now) = ("2025-01-01T12:00:00Z", "2025-01-01T12:03:40Z");

    let skip = run(
        &s,
        &policy(MisfirePolicy::Skip, ConcurrencyPolicy::Allow),
        from,
        now,
        &[],
    );
    assert!(skip.create.is_empty());
    assert_eq!(reasons(&skip), [(3, SkipReason::Missed)]);
    assert_eq!(skip.handled_until, Some(ts("2025-01-01T12:03:00Z")));
    assert_eq!(skip.next_schedule_time, Some(ts("2025-01-01T12:04:00Z")));

    let once = run(
        &s,
        &policy(MisfirePolicy::RunOnce, ConcurrencyPolicy::Allow),
        from,
        now,
        &[],
    );
    assert_eq!(created(&once), [("2025-01-01T12:03:00Z".into(), true)]);
    assert_eq!(
        reasons(&once),
        [(2, SkipReason::CoveredBy(ts("2025-01-01T12:03:00Z")))]
    );

    let mut all = policy(MisfirePolicy::RunAll, ConcurrencyPolicy::Allow);
    all.max_catch_up = 2;
    let all = run(&s, &all, from, now, &[]);
    assert_eq!(
        created(&all),
        [
            ("2025-01-01T12:02:00Z".into(), true),
            ("2025-01-01T12:03:00Z".into(), true)
        ]
    );
    assert_eq!(reasons(&all), [(1, SkipReason::TooManyMissed)]);
}

#[test]
fn run_once_adds_nothing_when_a_regular_time_runs_anyway() {
    let s = schedule("* * * * *", "UTC");
    let p = policy(MisfirePolicy::RunOnce, ConcurrencyPolicy::Allow);
    let d = run(&s, &p, "2025-01-01T12:00:00Z", "2025-01-01T12:03:05Z", &[]);
    assert_eq!(created(&d), [("2025-01-01T12:03:00Z".into(), false)]);
    assert_eq!(
        reasons(&d),
        [(2, SkipReason::CoveredBy(ts("2025-01-01T12:03:00Z")))]
    );
}

#[test]
fn starting_deadline_bounds_every_firing() {
    let s = schedule("* * * * *", "UTC");
    let mut p = policy(MisfirePolicy::RunAll, ConcurrencyPolicy::Allow);
    p.starting_deadline = Some(SignedDuration::from_secs(90));
    // 12:01 is 160 s late, 12:02 100 s, 12:03 40 s: only 12:03 may still start.
    let d = run(&s, &p, "2025-01-01T12:00:00Z", "2025-01-01T12:03:40Z", &[]);
    assert_eq!(created(&d), [("2025-01-01T12:03:00Z".into(), true)]);
    assert_eq!(reasons(&d), [(2, SkipReason::DeadlineExceeded)]);
    // A deadline shorter than the tolerance also holds for the regular time.
    p.starting_deadline = Some(SignedDuration::from_secs(5));
    let d = run(&s, &p, "2025-01-01T12:02:00Z", "2025-01-01T12:03:10Z", &[]);
    assert!(d.create.is_empty());
    assert_eq!(reasons(&d), [(1, SkipReason::DeadlineExceeded)]);
}

#[test]
fn a_time_whose_child_exists_is_neither_fired_nor_skipped_again() {
    // The status write after creating c-<12:01> was lost (operator killed): same decision
    // input, the child in the cache.
    let s = schedule("* * * * *", "UTC");
    let p = policy(MisfirePolicy::RunAll, ConcurrencyPolicy::Forbid);
    let child = Child {
        name: child_name("c", ts("2025-01-01T12:01:00Z")),
        scheduled: ts("2025-01-01T12:01:00Z"),
        active: true,
    };
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T12:01:02Z",
        &[child],
    );
    assert!(d.create.is_empty());
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    assert_eq!(d.handled_until, Some(ts("2025-01-01T12:01:00Z")));
}

#[test]
fn forbid_skips_while_a_child_is_active() {
    let s = schedule("* * * * *", "UTC");
    let p = policy(MisfirePolicy::RunAll, ConcurrencyPolicy::Forbid);
    let running = Child {
        name: "c-old".into(),
        scheduled: ts("2025-01-01T11:00:00Z"),
        active: true,
    };
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T12:01:01Z",
        std::slice::from_ref(&running),
    );
    assert!(d.create.is_empty());
    assert_eq!(
        reasons(&d),
        [(1, SkipReason::ConcurrentChild("c-old".into()))]
    );
    assert!(d.cancel.is_empty());

    // Catch-ups under Forbid: the first one runs, the rest would overlap it.
    let d = run(&s, &p, "2025-01-01T12:00:00Z", "2025-01-01T12:03:40Z", &[]);
    assert_eq!(created(&d), [("2025-01-01T12:01:00Z".into(), true)]);
    let first = child_name("c", ts("2025-01-01T12:01:00Z"));
    assert_eq!(reasons(&d), [(2, SkipReason::ConcurrentChild(first))]);

    // A finished child does not block.
    let done = Child {
        active: false,
        ..running
    };
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T12:01:01Z",
        &[done],
    );
    assert_eq!(created(&d), [("2025-01-01T12:01:00Z".into(), false)]);
}

#[test]
fn replace_cancels_the_active_children_and_runs_the_latest() {
    let s = schedule("* * * * *", "UTC");
    let p = policy(MisfirePolicy::RunAll, ConcurrencyPolicy::Replace);
    let children = [
        Child {
            name: "c-1".into(),
            scheduled: ts("2025-01-01T11:58:00Z"),
            active: true,
        },
        Child {
            name: "c-2".into(),
            scheduled: ts("2025-01-01T11:59:00Z"),
            active: false,
        },
    ];
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T12:02:01Z",
        &children,
    );
    assert_eq!(created(&d), [("2025-01-01T12:02:00Z".into(), false)]);
    assert_eq!(
        reasons(&d),
        [(1, SkipReason::Superseded(ts("2025-01-01T12:02:00Z")))]
    );
    assert_eq!(d.cancel, ["c-1"]);
    // Nothing due: nothing canceled.
    let d = run(
        &s,
        &p,
        "2025-01-01T12:02:00Z",
        "2025-01-01T12:02:30Z",
        &children,
    );
    assert!(d.cancel.is_empty() && d.create.is_empty());
}

#[test]
fn suspended_crons_do_nothing_and_keep_their_missed_times() {
    let s = schedule("* * * * *", "UTC");
    let mut p = policy(MisfirePolicy::RunOnce, ConcurrencyPolicy::Allow);
    p.suspend = true;
    let d = run(&s, &p, "2025-01-01T12:00:00Z", "2025-01-01T12:05:30Z", &[]);
    assert_eq!(d, Decision::default());
    // Resumed: the times passed meanwhile are misfires.
    p.suspend = false;
    let d = run(&s, &p, "2025-01-01T12:00:00Z", "2025-01-01T12:05:40Z", &[]);
    assert_eq!(created(&d), [("2025-01-01T12:05:00Z".into(), true)]);
}

#[test]
fn jitter_delays_every_firing_by_the_same_offset() {
    let s = schedule("0 * * * *", "UTC");
    let mut p = policy(MisfirePolicy::Skip, ConcurrencyPolicy::Allow);
    p.jitter = SignedDuration::from_secs(90);
    let d = run(&s, &p, "2025-01-01T12:00:00Z", "2025-01-01T13:01:00Z", &[]);
    assert!(d.create.is_empty());
    assert_eq!(d.wake_at, Some(ts("2025-01-01T13:01:30Z")));
    assert_eq!(d.next_schedule_time, Some(ts("2025-01-01T13:00:00Z")));
    let d = run(
        &s,
        &p,
        "2025-01-01T12:00:00Z",
        "2025-01-01T13:01:30.2Z",
        &[],
    );
    // Named after the scheduled time, not the firing time.
    assert_eq!(created(&d), [("2025-01-01T13:00:00Z".into(), false)]);
}

#[test]
fn jitter_offsets_are_deterministic_bounded_and_spread() {
    assert_eq!(jitter_offset("uid", 0), SignedDuration::ZERO);
    assert_eq!(jitter_offset("uid", 1), SignedDuration::ZERO);
    let a = jitter_offset("4f1c6a", 3600);
    assert_eq!(a, jitter_offset("4f1c6a", 3600));
    let offsets: BTreeSet<i64> = (0..1000)
        .map(|i| jitter_offset(&format!("uid-{i}"), 3600).as_secs())
        .collect();
    assert!(offsets.iter().all(|o| (0..3600).contains(o)));
    // A thousand crons land on many different seconds, not all at :00.
    assert!(offsets.len() > 700, "{}", offsets.len());
}

#[test]
fn a_long_outage_of_a_frequent_schedule_is_cheap_and_reported() {
    let s = schedule("* * * * * *", "UTC");
    let mut p = policy(MisfirePolicy::RunAll, ConcurrencyPolicy::Allow);
    p.max_catch_up = 3;
    let started = std::time::Instant::now();
    let d = run(
        &s,
        &p,
        "2025-01-01T00:00:00Z",
        "2025-01-04T00:00:00.700Z",
        &[],
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    // Even the latest time is missed: 0.7 s late, past its tolerance of half a second.
    assert_eq!(
        created(&d),
        [
            ("2025-01-03T23:59:58Z".into(), true),
            ("2025-01-03T23:59:59Z".into(), true),
            ("2025-01-04T00:00:00Z".into(), true)
        ]
    );
    let earlier = &d.skipped[0];
    assert_eq!(earlier.reason, SkipReason::TooManyMissed);
    assert_eq!(earlier.first, ts("2025-01-01T00:00:01Z"));
    assert_eq!(earlier.last, ts("2025-01-03T23:59:57Z"));
    assert!(earlier.at_least);
}

#[test]
fn due_times_counts_what_it_does_not_keep() {
    let s = schedule("*/10 * * * * *", "UTC");
    let due = due_times(
        &s,
        ts("2025-01-01T00:00:00Z"),
        ts("2025-01-01T00:01:00Z"),
        2,
    );
    assert_eq!(
        due,
        Due {
            times: vec![ts("2025-01-01T00:00:50Z"), ts("2025-01-01T00:01:00Z")],
            earlier: 4,
            earlier_range: Some((ts("2025-01-01T00:00:10Z"), ts("2025-01-01T00:00:40Z"))),
            at_least: false,
        }
    );
}

#[test]
fn tolerance_is_half_the_interval_at_most_a_minute() {
    let every_ten = schedule("*/10 * * * * *", "UTC");
    assert_eq!(
        tolerance(&every_ten, ts("2025-01-01T00:00:10Z")),
        SignedDuration::from_secs(5)
    );
    let daily = schedule("@daily", "UTC");
    assert_eq!(tolerance(&daily, ts("2025-01-01T00:00:00Z")), MAX_TOLERANCE);
}

#[test]
fn history_keeps_the_newest_of_each_kind() {
    let f = |name: &str, minute: i64, succeeded: bool| Finished {
        name: name.into(),
        scheduled: ts("2025-01-01T00:00:00Z") + SignedDuration::from_mins(minute),
        succeeded,
    };
    let finished = [
        f("s1", 1, true),
        f("s2", 2, true),
        f("f3", 3, false),
        f("s4", 4, true),
        f("f5", 5, false),
    ];
    let mut deleted = history_to_delete(&finished, 2, 1);
    deleted.sort();
    assert_eq!(deleted, ["f3", "s1"]);
    assert_eq!(history_to_delete(&finished, 0, 0).len(), 5);
    assert!(history_to_delete(&finished, 10, 10).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Random operator timelines

#[derive(Debug, Clone)]
struct Timeline {
    expression: &'static str,
    misfire: MisfirePolicy,
    concurrency: ConcurrencyPolicy,
    max_catch_up: u32,
    deadline: Option<i64>,
    jitter: i64,
    /// Seconds between reconciles (large ones are outages).
    steps: Vec<u32>,
    /// How many reconciles each child stays active.
    durations: Vec<u8>,
    /// Reconciles whose status write is lost (the operator dies after creating children).
    lost_writes: Vec<bool>,
}

fn timeline() -> impl Strategy<Value = Timeline> {
    (
        prop::sample::select(vec![
            "*/10 * * * * *",
            "* * * * *",
            "*/7 * * * * *",
            "0 */2 * * * *",
        ]),
        prop::sample::select(vec![
            MisfirePolicy::Skip,
            MisfirePolicy::RunOnce,
            MisfirePolicy::RunAll,
        ]),
        prop::sample::select(vec![
            ConcurrencyPolicy::Allow,
            ConcurrencyPolicy::Forbid,
            ConcurrencyPolicy::Replace,
        ]),
        1u32..4,
        prop::option::of(1i64..200),
        0i64..15,
        prop::collection::vec(
            prop::sample::select(vec![1u32, 2, 3, 5, 9, 10, 11, 30, 61, 400]),
            1..60,
        ),
        prop::collection::vec(0u8..5, 60),
        prop::collection::vec(prop::bool::weighted(0.15), 60),
    )
        .prop_map(
            |(
                expression,
                misfire,
                concurrency,
                max_catch_up,
                deadline,
                jitter,
                steps,
                durations,
                lost_writes,
            )| Timeline {
                expression,
                misfire,
                concurrency,
                max_catch_up,
                deadline,
                jitter,
                steps,
                durations,
                lost_writes,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn decisions_over_random_timelines_keep_every_promise(t in timeline()) {
        let s = schedule(t.expression, "Europe/Berlin");
        let p = Policy {
            misfire: t.misfire,
            max_catch_up: t.max_catch_up,
            starting_deadline: t.deadline.map(SignedDuration::from_secs),
            concurrency: t.concurrency,
            jitter: SignedDuration::from_secs(t.jitter),
            suspend: false,
        };
        let created_at = ts("2025-10-26T00:59:03Z"); // just before Berlin falls back
        let mut handled = created_at;
        let mut now = created_at;
        // name -> (scheduled, reconciles left active)
        let mut children: BTreeMap<String, (Timestamp, u8)> = BTreeMap::new();
        let mut creations: Vec<String> = Vec::new();
        let mut accounted: u64 = 0;
        for (i, step) in t.steps.iter().enumerate() {
            now += SignedDuration::from_secs(i64::from(*step));
            let list: Vec<Child> = children
                .iter()
                .map(|(name, (scheduled, left))| Child { name: name.clone(), scheduled: *scheduled, active: *left > 0 })
                .collect();
            let d = decide(&Input { cron: "c", schedule: &s, policy: &p, handled_until: handled, now, children: &list });

            let active_before = list.iter().filter(|c| c.active).count();
            for firing in &d.create {
                // Never a second child for a time, even when the status was lost.
                prop_assert!(!children.contains_key(&firing.name), "{} created twice", firing.name);
                prop_assert_eq!(&firing.name, &child_name("c", firing.scheduled));
                // Due, after what was handled, and within the deadline.
                prop_assert!(firing.scheduled > handled);
                prop_assert!(firing.scheduled + p.jitter <= now);
                if let Some(deadline) = p.starting_deadline {
                    prop_assert!(now.duration_since(firing.scheduled + p.jitter) <= deadline);
                }
                if p.misfire == MisfirePolicy::Skip {
                    prop_assert!(!firing.catch_up);
                }
            }
            let catch_ups = d.create.iter().filter(|f| f.catch_up).count();
            match p.misfire {
                MisfirePolicy::Skip => prop_assert_eq!(catch_ups, 0),
                MisfirePolicy::RunOnce => prop_assert!(catch_ups <= 1),
                MisfirePolicy::RunAll => prop_assert!(catch_ups <= p.max_catch_up as usize),
            }
            match p.concurrency {
                ConcurrencyPolicy::Forbid => {
                    prop_assert!(d.create.len() <= 1);
                    if active_before > 0 { prop_assert!(d.create.is_empty()); }
                }
                ConcurrencyPolicy::Replace => {
                    prop_assert!(d.create.len() <= 1);
                    if !d.create.is_empty() {
                        prop_assert_eq!(d.cancel.len(), active_before);
                    }
                }
                ConcurrencyPolicy::Allow => prop_assert!(d.cancel.is_empty()),
            }
            // The next time is in the future and scheduled.
            let next = d.next_schedule_time.expect("a next time");
            prop_assert!(next + p.jitter > now);
            prop_assert_eq!(d.wake_at, Some(next + p.jitter));

            // Apply: children finish, new ones start, canceled ones stop.
            for (_, left) in children.values_mut() {
                *left = left.saturating_sub(1);
            }
            for name in &d.cancel {
                if let Some((_, left)) = children.get_mut(name) { *left = 0; }
            }
            for firing in &d.create {
                children.insert(firing.name.clone(), (firing.scheduled, t.durations[i % t.durations.len()]));
                creations.push(firing.name.clone());
            }
            if !t.lost_writes[i % t.lost_writes.len()]
                && let Some(until) = d.handled_until
            {
                prop_assert!(until > handled);
                // Every due time up to the new mark was created, skipped, or had its child.
                let due = due_times(&s, handled, until, usize::MAX >> 1);
                let existing = due.times.iter().filter(|s| list.iter().any(|c| c.scheduled == **s)).count() as u64;
                let skipped: u64 = d.skipped.iter().map(|s| s.count).sum();
                let accounted_now = d.create.len() as u64 + skipped + existing;
                if d.skipped.iter().any(|s| s.at_least) {
                    prop_assert!(accounted_now <= due.times.len() as u64, "{:?}", d);
                } else {
                    prop_assert_eq!(accounted_now, due.times.len() as u64, "{:?}", d);
                }
                accounted += due.times.len() as u64;
                handled = until;
            }
        }
        let unique: BTreeSet<&String> = creations.iter().collect();
        prop_assert_eq!(unique.len(), creations.len());
        let _ = accounted;
    }
}

// ---------------------------------------------------------------------------------------------
// Status before children: the recorded firings whose children are missing

fn firing(name: &str, second: i64) -> Firing {
    Firing {
        scheduled: Timestamp::from_second(second).unwrap(),
        name: name.into(),
        catch_up: false,
    }
}

#[test]
fn recorded_children_never_created_are_created_with_the_new_ones_each_once() {
    let recorded = [firing("c-100", 100), firing("c-200", 200)];
    let decision = Decision {
        create: vec![firing("c-300", 300), firing("c-200", 200)],
        ..Decision::default()
    };
    let present = |name: &str| name == "c-100";
    assert_eq!(
        recorded_missing(&recorded, present),
        [&firing("c-200", 200)]
    );
    assert_eq!(
        to_create(&recorded, present, &decision),
        [firing("c-200", 200), firing("c-300", 300)]
    );
    // Nothing recorded, nothing new: nothing.
    assert!(to_create(&[], present, &Decision::default()).is_empty());
    // All there: nothing.
    assert!(to_create(&recorded, |_| true, &Decision::default()).is_empty());
}

#[test]
fn a_recorded_child_replace_cancels_now_is_not_created() {
    let recorded = [firing("c-100", 100)];
    let decision = Decision {
        create: vec![firing("c-200", 200)],
        cancel: vec!["c-100".into()],
        ..Decision::default()
    };
    assert_eq!(
        to_create(&recorded, |_| false, &decision),
        [firing("c-200", 200)]
    );
}

/// One reconcile's faults in the model below.
#[derive(Debug, Clone)]
struct Faults {
    /// The status write (before any create) conflicts or fails.
    write_fails: bool,
    /// The process stops right after that write (before any create).
    crash_after_write: bool,
    /// The create of the n-th child fails (the reconcile ends with an error).
    create_fails_at: Option<usize>,
    /// The process stops right after the creates (before the pending list is confirmed).
    crash_after_creates: bool,
    /// The confirming write after the creates fails.
    confirm_fails: bool,
}

fn faults() -> impl Strategy<Value = Faults> {
    (
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.15, 0usize..3),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(
                write_fails,
                crash_after_write,
                create_fails_at,
                crash_after_creates,
                confirm_fails,
            )| {
                Faults {
                    write_fails,
                    crash_after_write,
                    create_fails_at,
                    crash_after_creates,
                    confirm_fails,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The controller's protocol, modelled: decide, write the firings as pending (conditional),
    /// create, confirm; children with `ttlSecondsAfterFinished: 0` vanish as soon as they finish,
    /// and a restart forgets what the process saw. Whatever fails when: no time gets a second
    /// child, no child is created before its firing is recorded, and once the faults stop every
    /// recorded firing has its child (or was superseded by Replace) and nothing stays pending.
    #[test]
    fn status_first_fires_each_time_once_across_failed_writes_restarts_and_ttl(
        steps in prop::collection::vec((1u8..4, faults()), 1..60),
        durations in prop::collection::vec(1u8..4, 16),
        misfire in prop::sample::select(vec![MisfirePolicy::Skip, MisfirePolicy::RunOnce, MisfirePolicy::RunAll]),
        concurrency in prop::sample::select(vec![ConcurrencyPolicy::Allow, ConcurrencyPolicy::Forbid, ConcurrencyPolicy::Replace]),
    ) {
        let s = schedule("*/2 * * * * *", "UTC");
        let p = Policy {
            misfire,
            max_catch_up: 3,
            starting_deadline: None,
            concurrency,
            jitter: SignedDuration::ZERO,
            suspend: false,
        };
        let mut now = ts("2026-12-04T10:00:00.5Z");
        let mut handled = now;
        let mut pending: Vec<Firing> = Vec::new();
        // The API server's children: name -> (scheduled, reconciles left to run).
        let mut api: BTreeMap<String, (Timestamp, u8)> = BTreeMap::new();
        // The process's memory: children it created or saw while pending.
        let mut expected: BTreeSet<String> = BTreeSet::new();
        let mut creations: Vec<String> = Vec::new();
        let mut ever_recorded: BTreeSet<String> = BTreeSet::new();
        let mut superseded: BTreeSet<String> = BTreeSet::new();
        let quiet = Faults { write_fails: false, crash_after_write: false, create_fails_at: None, crash_after_creates: false, confirm_fails: false };
        let tail = std::iter::repeat_n((1u8, quiet), 8);
        for (i, (advance, f)) in steps.into_iter().chain(tail).enumerate() {
            // The controller's add_expected.
            expected.retain(|n| pending.iter().any(|f| &f.name == n) || !api.contains_key(n));
            for r in &pending {
                if api.contains_key(&r.name) {
                    expected.insert(r.name.clone());
                }
            }
            let present = |name: &str| api.contains_key(name) || expected.contains(name);
            let mut children: Vec<Child> = api
                .iter()
                .map(|(name, (scheduled, left))| Child { name: name.clone(), scheduled: *scheduled, active: *left > 0 })
                .collect();
            for name in expected.iter().filter(|n| !api.contains_key(*n)) {
                let scheduled = Timestamp::from_second(name.trim_start_matches("c-").parse().unwrap()).unwrap();
                children.push(Child { name: name.clone(), scheduled, active: true });
            }
            children.extend(recorded_missing(&pending, present).into_iter().map(|f| Child {
                name: f.name.clone(), scheduled: f.scheduled, active: true,
            }));
            let d = decide(&Input { cron: "c", schedule: &s, policy: &p, handled_until: handled, now, children: &children });
            let create = to_create(&pending, present, &d);
            for r in recorded_missing(&pending, present) {
                if !create.iter().any(|c| c.name == r.name) {
                    superseded.insert(r.name.clone());
                }
            }
            let mut crashed = false;
            'reconcile: {
                if f.write_fails {
                    break 'reconcile;
                }
                if let Some(until) = d.handled_until {
                    handled = until;
                }
                pending = create.clone();
                ever_recorded.extend(create.iter().map(|c| c.name.clone()));
                if f.crash_after_write {
                    crashed = true;
                    break 'reconcile;
                }
                for name in &d.cancel {
                    if let Some((_, left)) = api.get_mut(name) { *left = 0; }
                }
                let mut answered = BTreeSet::new();
                for (k, c) in create.iter().enumerate() {
                    if f.create_fails_at == Some(k) {
                        break 'reconcile;
                    }
                    // Status first: recorded before it exists.
                    prop_assert!(pending.contains(c) && handled >= c.scheduled);
                    if !api.contains_key(&c.name) {
                        prop_assert!(!creations.contains(&c.name), "{} created twice", c.name);
                        api.insert(c.name.clone(), (c.scheduled, durations[i % durations.len()]));
                        creations.push(c.name.clone());
                        expected.insert(c.name.clone());
                    }
                    answered.insert(c.name.clone());
                }
                if f.crash_after_creates {
                    crashed = true;
                    break 'reconcile;
                }
                if !f.confirm_fails {
                    pending.retain(|p| !answered.contains(&p.name));
                }
            }
            if crashed {
                // A new process lists before anything else happens.
                expected.clear();
                continue;
            }
            // Time passes: children run; a finished child is deleted at once (TTL 0).
            now += SignedDuration::from_secs(i64::from(advance));
            for (_, left) in api.values_mut() {
                *left = left.saturating_sub(1);
            }
            api.retain(|_, (_, left)| *left > 0);
        }
        prop_assert!(pending.is_empty(), "still pending: {:?}", pending);
        for name in &ever_recorded {
            prop_assert!(creations.contains(name) || superseded.contains(name), "{} recorded, never created", name);
        }
    }
}
