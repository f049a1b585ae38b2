//! "When will my task run?": the measured dispatch rate of a priority bucket, the estimated start of
//! a waiting task from its position in the bucket, how that reads in its `Queued` condition, and
//! when a new estimate is worth a status write.
//!
//! The rate is an exponentially weighted mean of the intervals between a bucket's dispatches,
//! weighted by their age (time constant [`RATE_TIME_CONSTANT`]): every interval counts the same
//! whatever its length, so a burst of grants (many slots freed at once) reads as the rate it is.
//! Only intervals during which the bucket had tasks waiting are measured; the first dispatch after
//! the bucket was empty or the queue paused starts a new measurement, and the dispatcher leaves out
//! the grants that fill free slots and the wait for the first slot to free (see `dispatcher`). For a constant rate the mean
//! is the exact interval, and the task at position p starts p intervals after the last dispatch.
//! A wait since the last dispatch longer than the mean counts as one more (unfinished) interval, so
//! a stalled bucket's estimates move out instead of standing still; nothing dispatched for
//! [`STALE_AFTER`] means "unknown".

use jiff::{SignedDuration, Timestamp};

use crate::api::Priority;

/// Age at which a measured interval weighs 1/e of a new one.
pub const RATE_TIME_CONSTANT: SignedDuration = SignedDuration::from_secs(120);
/// No dispatch for this long: the rate is unknown.
pub const STALE_AFTER: SignedDuration = SignedDuration::from_secs(600);
/// An estimate that moved less than this is not rewritten...
pub const MIN_SHIFT: SignedDuration = SignedDuration::from_secs(15);
/// ... nor one that moved less than this share of the wait still ahead.
pub const RELATIVE_SHIFT: f64 = 0.2;

const MARKER: &str = "estimated start ";
const UNKNOWN: &str = "unknown";

/// The dispatch rate of one bucket, as an exponentially weighted mean interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatchRate {
    /// Sum of the weights of the measured intervals, as of `updated`.
    weight: f64,
    /// Sum of weight × interval (seconds), as of `updated`.
    weighted_seconds: f64,
    updated: Option<Timestamp>,
    last_dispatch: Option<Timestamp>,
}

impl DispatchRate {
    /// A dispatch at `at`. `interval`: the time since the previous dispatch (or since the bucket
    /// started waiting, if later) while tasks waited in it; `None` when the bucket was not waiting
    /// before (nothing was measured).
    pub fn record(&mut self, at: Timestamp, interval: Option<SignedDuration>) {
        if let Some(interval) = interval {
            let decay = self.decay_to(at);
            self.weight = self.weight * decay + 1.0;
            self.weighted_seconds = self.weighted_seconds * decay + interval.as_secs_f64().max(0.0);
            self.updated = Some(at);
        }
        self.last_dispatch = Some(self.last_dispatch.map_or(at, |last| last.max(at)));
    }

    pub fn last_dispatch(&self) -> Option<Timestamp> {
        self.last_dispatch
    }

    fn decay_to(&self, at: Timestamp) -> f64 {
        match self.updated {
            Some(updated) => {
                let age = at.duration_since(updated).as_secs_f64().max(0.0);
                (-age / RATE_TIME_CONSTANT.as_secs_f64()).exp()
            }
            None => 0.0,
        }
    }

    /// The mean time between dispatches at `now`, in seconds; `open_since` is when the interval
    /// still open began (the last dispatch, or when the bucket started waiting), if tasks wait.
    /// `None`: unknown (never measured, or nothing dispatched for [`STALE_AFTER`]).
    pub fn mean_interval(&self, now: Timestamp, open_since: Option<Timestamp>) -> Option<f64> {
        let last = self.last_dispatch?;
        if self.weight <= 0.0 || now.duration_since(last) > STALE_AFTER {
            return None;
        }
        let mean = self.weighted_seconds / self.weight;
        let open = open_since.map_or(0.0, |since| now.duration_since(since).as_secs_f64());
        if open > mean {
            // The unfinished interval is at least `open` long: count it as one more, the others
            // aged to now.
            let decay = self.decay_to(now);
            Some((self.weighted_seconds * decay + open) / (self.weight * decay + 1.0))
        } else {
            Some(mean)
        }
    }
}

/// Why a waiting task has no estimated start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoEstimate {
    /// Nothing measured yet, or nothing dispatched from the bucket for a long while.
    NoRate,
    /// The queue's concurrency in force is 0.
    Paused,
    /// A limit of its own holds it (circuit, type or key limit, retry rate): the bucket's pace says
    /// nothing.
    HeldApart,
}

/// Where a waiting task stands and when it is expected to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub priority: Priority,
    /// 1 = next in its bucket.
    pub position: u64,
    /// Tasks waiting in its bucket.
    pub waiting: u64,
    /// When it was computed.
    pub at: Timestamp,
    pub start: Result<Timestamp, NoEstimate>,
    /// Dispatches per minute from the bucket, when known.
    pub per_minute: Option<f64>,
}

/// The estimate for the task at `position` of its bucket, from the bucket's rate.
pub fn estimate(
    priority: Priority,
    position: u64,
    waiting: u64,
    rate: &DispatchRate,
    open_since: Option<Timestamp>,
    now: Timestamp,
) -> Estimate {
    let mean = rate.mean_interval(now, open_since);
    let start = match (mean, rate.last_dispatch()) {
        (Some(mean), Some(last)) => {
            // From the later of the last dispatch and the start of the wait, p intervals on.
            let from = open_since.map_or(last, |since| since.max(last));
            let ahead = SignedDuration::try_from_secs_f64(mean * position as f64)
                .unwrap_or(SignedDuration::MAX);
            Ok(from.checked_add(ahead).unwrap_or(Timestamp::MAX).max(now))
        }
        _ => Err(NoEstimate::NoRate),
    };
    Estimate {
        priority,
        position,
        waiting,
        at: now,
        per_minute: mean.filter(|m| *m > 0.0).map(|m| 60.0 / m),
        start,
    }
}

impl Estimate {
    /// The same place in the bucket without a start time.
    pub fn without_start(mut self, why: NoEstimate) -> Self {
        self.start = Err(why);
        self
    }

    /// The same, starting no earlier than `at` (a limit of its key's): the bucket's pace is a
    /// lower bound then, and `at` alone when the pace is not known.
    pub fn not_before(mut self, at: Timestamp) -> Self {
        self.start = match self.start {
            Ok(start) => Ok(start.max(at)),
            Err(NoEstimate::NoRate) => Ok(at),
            Err(why) => Err(why),
        };
        self
    }

    /// The part of the `Queued` message that says where the task stands, e.g.
    /// `position 57 of 300 in the Low bucket at 2026-01-02T12:30:05Z, estimated start
    /// 2026-01-02T12:32:00Z (30.0 dispatches/min)`.
    pub fn describe(&self) -> String {
        let place = format!(
            "position {} of {} in the {} bucket at {}",
            self.position,
            self.waiting,
            self.priority.as_str(),
            seconds(self.at)
        );
        match self.start {
            Ok(start) => {
                let rate = self
                    .per_minute
                    .map_or(String::new(), |r| format!(" ({r:.1} dispatches/min)"));
                format!("{place}, {MARKER}{}{rate}", seconds(start))
            }
            Err(why) => format!("{place}, {MARKER}{UNKNOWN} ({})", self.why(why)),
        }
    }

    /// Why there is no estimated start, in words (no parentheses: the message is parsed back).
    fn why(&self, why: NoEstimate) -> String {
        match why {
            NoEstimate::NoRate => format!(
                "nothing measured: no dispatch from the {} bucket in the last {} minutes",
                self.priority.as_str(),
                STALE_AFTER.as_secs() / 60
            ),
            NoEstimate::Paused => "the queue is paused: concurrency 0".to_string(),
            NoEstimate::HeldApart => {
                "a limit of its own holds it, not its turn in the bucket".to_string()
            }
        }
    }
}

/// An instant to the second, as RFC 3339.
fn seconds(t: Timestamp) -> String {
    let whole = Timestamp::from_second(t.as_second()).unwrap_or(t);
    whole.to_string()
}

/// What a `Queued` message says about the start: `None` when it has no estimate part,
/// `Some(Err(why))` for "unknown (why)", `Some(Ok(t))` for a time.
pub fn written_start(message: &str) -> Option<Result<Timestamp, String>> {
    let (_, rest) = message.rsplit_once(MARKER)?;
    if let Some(why) = rest.strip_prefix(UNKNOWN) {
        let why = why.trim_start();
        let why = why.strip_prefix('(').unwrap_or(why);
        let why = why.rsplit_once(')').map_or(why, |(inside, _)| inside);
        return Some(Err(why.to_string()));
    }
    let token = rest.split([' ', ',', ')']).next().unwrap_or_default();
    Some(token.parse::<Timestamp>().map_err(|_| token.to_string()))
}

/// Whether `new` is worth rewriting a `Queued` message that reads `written`: it gained or lost an
/// estimate, turned (un)known, or its start moved by more than [`MIN_SHIFT`] and more than
/// [`RELATIVE_SHIFT`] of the wait still ahead. Positions alone never cause a write: at a steady
/// rate the start stays put while the position counts down.
pub fn moved(written: &str, new: Option<&Estimate>, now: Timestamp) -> bool {
    let before = written_start(written);
    match (before, new.map(|e| e.start)) {
        (None, None) => false,
        (Some(Ok(old)), Some(Ok(start))) => start_moved(old, start, now),
        (Some(Err(written_why)), Some(Err(why))) => new.is_some_and(|e| e.why(why) != written_why),
        _ => true,
    }
}

/// Whether the `Queued` message `new` says something `written` does not: another stem (what holds
/// the task), or an estimate that [`moved`]. The place and time of the estimate alone change at
/// every look, so a reconcile that rewrote them would write the status each time it runs.
pub fn message_moved(written: &str, new: &str, now: Timestamp) -> bool {
    let stem = |m: &str| {
        m.split_once("; position ")
            .map_or(m, |(stem, _)| stem)
            .to_owned()
    };
    if stem(written) != stem(new) {
        return true;
    }
    match (written_start(written), written_start(new)) {
        (None, None) => written != new,
        (Some(Ok(old)), Some(Ok(start))) => start_moved(old, start, now),
        (Some(Err(a)), Some(Err(b))) => a != b,
        _ => true,
    }
}

fn start_moved(old: Timestamp, start: Timestamp, now: Timestamp) -> bool {
    let shift = start.duration_since(old).abs();
    let ahead = start.duration_since(now).max(SignedDuration::ZERO);
    let relative = SignedDuration::try_from_secs_f64(ahead.as_secs_f64() * RELATIVE_SHIFT)
        .unwrap_or(SignedDuration::MAX);
    shift > MIN_SHIFT.max(relative)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_new_place_and_time_alone_is_not_a_new_message() {
        let now: Timestamp = "2026-01-02T12:30:05Z".parse().unwrap();
        let stem = "the concurrency of AxQueue batch is in use";
        let written = format!(
            "{stem}; position 57 of 300 in the Low bucket at 2026-01-02T12:30:05Z, estimated start 2026-01-02T12:32:00Z (30.0 dispatches/min)"
        );
        let later = format!(
            "{stem}; position 50 of 293 in the Low bucket at 2026-01-02T12:30:19Z, estimated start 2026-01-02T12:32:03Z (30.5 dispatches/min)"
        );
        assert!(!message_moved(&written, &later, now));
        let moved_far = later.replace("12:32:03", "12:40:00");
        assert!(message_moved(&written, &moved_far, now));
        let other_reason = later.replace("the concurrency of", "the retry rate of");
        assert!(message_moved(&written, &other_reason, now));
        assert!(message_moved(&written, stem, now));
        assert!(!message_moved(stem, stem, now));
    }

    fn t(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_900_000_000_000 + millis).expect("in range")
    }

    /// Dispatches every `interval_ms` from `start`, `count` of them, the bucket waiting throughout.
    fn steady(interval_ms: i64, count: i64) -> DispatchRate {
        let mut rate = DispatchRate::default();
        rate.record(t(0), None);
        for k in 1..count {
            rate.record(
                t(k * interval_ms),
                Some(SignedDuration::from_millis(interval_ms)),
            );
        }
        rate
    }

    #[test]
    fn nothing_measured_is_unknown() {
        let mut rate = DispatchRate::default();
        assert_eq!(rate.mean_interval(t(0), None), None);
        rate.record(t(0), None);
        let e = estimate(Priority::Low, 3, 3, &rate, Some(t(0)), t(10));
        assert_eq!(e.start, Err(NoEstimate::NoRate));
        assert!(
            e.describe().contains("estimated start unknown"),
            "{}",
            e.describe()
        );
    }

    #[test]
    fn a_burst_counts_each_grant() {
        // 5 slots freed every 2 s: 2.5 dispatches/s, not one per 2 s.
        let mut rate = DispatchRate::default();
        rate.record(t(0), None);
        for burst in 1..=20 {
            let at = t(burst * 2000);
            rate.record(at, Some(SignedDuration::from_secs(2)));
            for _ in 1..5 {
                rate.record(at, Some(SignedDuration::ZERO));
            }
        }
        let mean = rate
            .mean_interval(t(40_000), Some(t(40_000)))
            .expect("known");
        assert!((mean - 0.4).abs() < 1e-9, "{mean}");
    }

    #[test]
    fn a_stalled_bucket_moves_its_estimates_out_and_then_knows_nothing() {
        let rate = steady(1000, 100);
        let last = t(99_000);
        let fresh = rate.mean_interval(last, Some(last)).expect("known");
        let stalled = rate
            .mean_interval(t(99_000 + 120_000), Some(last))
            .expect("known");
        assert!(stalled > 2.0 * fresh, "{fresh} {stalled}");
        assert_eq!(rate.mean_interval(t(99_000 + 601_000), Some(last)), None);
    }

    #[test]
    fn the_message_round_trips_and_small_moves_are_not_rewritten() {
        let rate = steady(500, 50);
        let now = t(24_600);
        let e = estimate(Priority::Normal, 40, 120, &rate, Some(t(24_500)), now);
        let text = format!("waiting for its turn in AxQueue q; {}", e.describe());
        assert!(
            text.contains("position 40 of 120 in the Normal bucket"),
            "{text}"
        );
        let written = written_start(&text).expect("an estimate").expect("a time");
        assert_eq!(
            written,
            Timestamp::from_second(e.start.unwrap().as_second()).unwrap()
        );
        assert!(!moved(&text, Some(&e), now));
        // 2 s later, 4 dispatched: the start is where it was.
        let later = estimate(Priority::Normal, 36, 116, &rate, Some(t(26_500)), t(26_600));
        assert!(!moved(&text, Some(&later), t(26_600)));
        // Half the rate: far off.
        let slow = estimate(
            Priority::Normal,
            40,
            120,
            &steady(1000, 50),
            Some(t(49_000)),
            t(49_000),
        );
        assert!(moved(&text, Some(&slow), t(49_000)));
        // Known → unknown, and back.
        let unknown = e.clone().without_start(NoEstimate::Paused);
        assert!(moved(&text, Some(&unknown), now));
        let unknown_text = unknown.describe();
        assert_eq!(
            written_start(&unknown_text),
            Some(Err("the queue is paused: concurrency 0".to_string()))
        );
        assert!(!moved(
            &unknown_text,
            Some(&e.clone().without_start(NoEstimate::Paused)),
            now
        ));
        // Unknown for another reason: the message would be wrong, rewrite it.
        assert!(moved(
            &unknown_text,
            Some(&e.clone().without_start(NoEstimate::NoRate)),
            now
        ));
        assert!(moved(&unknown_text, Some(&e), now));
        // Messages without an estimate (an old operator's, a missing queue).
        assert!(!moved("AxQueue q does not exist", None, now));
        assert!(moved(
            "the concurrency of AxQueue q is in use",
            Some(&e),
            now
        ));
        assert!(moved(&text, None, now));
    }

    proptest! {
        /// For a constant dispatch rate the estimate is exact: the task at position p starts p
        /// intervals after the last dispatch, whenever it is asked between two dispatches.
        #[test]
        fn exact_for_a_constant_rate(
            interval_ms in 50i64..20_000,
            count in 2i64..400,
            position in 1u64..5_000,
            phase in 0.0f64..1.0,
        ) {
            let rate = steady(interval_ms, count);
            let last = t((count - 1) * interval_ms);
            let now = last + SignedDuration::from_millis((phase * interval_ms as f64) as i64);
            let e = estimate(Priority::Low, position, position, &rate, Some(last), now);
            let start = e.start.expect("known");
            let truth = last + SignedDuration::from_millis(interval_ms * position as i64);
            let error = start.duration_since(truth).abs();
            prop_assert!(error <= SignedDuration::from_millis(2), "{start} vs {truth}");
            let per_minute = e.per_minute.expect("a rate");
            prop_assert!((per_minute - 60_000.0 / interval_ms as f64).abs() < 1e-6 * per_minute);
        }

        /// Re-asking at a steady rate while the position counts down never asks for a rewrite.
        #[test]
        fn a_steady_countdown_is_written_once(
            interval_ms in 100i64..5_000,
            position in 2u64..2_000,
        ) {
            let rate_at = |k: i64| steady(interval_ms, 20 + k);
            let first_last = t(19 * interval_ms);
            let first = estimate(Priority::High, position, position, &rate_at(0), Some(first_last), first_last);
            let written = first.describe();
            for k in 1..(position as i64).min(200) {
                let last = t((19 + k) * interval_ms);
                let e = estimate(Priority::High, position - k as u64, position, &rate_at(k), Some(last), last);
                prop_assert!(!moved(&written, Some(&e), last), "rewrite at {k}: {written} vs {:?}", e.start);
            }
        }
    }
}
