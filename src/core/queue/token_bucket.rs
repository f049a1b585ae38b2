//! Token bucket that limits retries of a queue (DESIGN §4 `retryRatePerMinute`), and the dispatches of
//! one tenant (`keyRate`).
//!
//! Refills at `rate_per_minute` tokens per minute up to a burst, by default one second's worth of
//! tokens, at least one: `burst = max(1, rate / 60)` (the default 1000/min gives 16); `keyRate`
//! sets its burst itself. A one-second burst keeps a
//! storm of simultaneous failures from all retrying in the same instant, while a low rate still lets
//! one retry through at once. Rate 0 lets nothing through. Over any window of length `T` the bucket
//! grants at most `burst + rate * T / 1 min` tokens.
//!
//! Arithmetic is exact: one token is `NANOS_PER_MINUTE` units and every elapsed nanosecond adds
//! `rate` units, so no rounding drifts and the same inputs always give the same answers.

use jiff::Timestamp;

const NANOS_PER_MINUTE: u128 = 60_000_000_000;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_minute: u32,
    /// The burst set explicitly; `None`: one second's worth of tokens.
    explicit_burst: Option<u32>,
    /// Current content in units of 1 / `NANOS_PER_MINUTE` token.
    level: u128,
    /// The latest time the level was brought up to date for; never moves backwards.
    updated_at: Timestamp,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate_per_minute: u32, now: Timestamp) -> Self {
        Self {
            rate_per_minute,
            explicit_burst: None,
            level: capacity(burst(rate_per_minute)),
            updated_at: now,
        }
    }

    /// A full bucket at `now` holding at most `burst` tokens (a rate of 0 grants nothing).
    pub fn with_burst(rate_per_minute: u32, burst: u32, now: Timestamp) -> Self {
        let mut bucket = Self::new(rate_per_minute, now);
        bucket.explicit_burst = Some(burst);
        bucket.level = capacity(bucket.burst());
        bucket
    }

    pub fn rate_per_minute(&self) -> u32 {
        self.rate_per_minute
    }

    /// How many tokens a full bucket holds.
    pub fn burst(&self) -> u32 {
        match self.explicit_burst {
            _ if self.rate_per_minute == 0 => 0,
            Some(explicit) => explicit,
            None => burst(self.rate_per_minute),
        }
    }

    /// Whether the bucket is full at `now`: forgetting it then loses nothing.
    pub fn is_full(&self, now: Timestamp) -> bool {
        self.level_at(now) >= capacity(self.burst())
    }

    /// Whether a token is available at `now`, without taking it.
    pub fn has_token(&self, now: Timestamp) -> bool {
        self.level_at(now) >= NANOS_PER_MINUTE
    }

    /// Whole tokens available at `now`.
    pub fn tokens(&self, now: Timestamp) -> u32 {
        u32::try_from(self.level_at(now) / NANOS_PER_MINUTE).unwrap_or(u32::MAX)
    }

    /// When the `n`th token from `now` on is there, if every one before it is taken as it comes;
    /// `None` at rate 0.
    pub fn nth_token_at(&self, n: u64, now: Timestamp) -> Option<Timestamp> {
        if self.rate_per_minute == 0 {
            return None;
        }
        let needed = u128::from(n)
            .saturating_mul(NANOS_PER_MINUTE)
            .saturating_sub(self.level_at(now));
        let nanos = needed.div_ceil(u128::from(self.rate_per_minute));
        let wait = jiff::SignedDuration::from_nanos(i64::try_from(nanos).unwrap_or(i64::MAX));
        Some(now.checked_add(wait).unwrap_or(Timestamp::MAX))
    }

    /// Takes one token if one is available at `now`.
    pub fn try_take(&mut self, now: Timestamp) -> bool {
        self.refill(now);
        if self.level >= NANOS_PER_MINUTE {
            self.level -= NANOS_PER_MINUTE;
            true
        } else {
            false
        }
    }

    /// Changes the rate at `now`: time before `now` refills at the old rate, and the content is cut
    /// down to the new burst.
    pub fn set_rate(&mut self, rate_per_minute: u32, now: Timestamp) {
        self.refill(now);
        self.rate_per_minute = rate_per_minute;
        self.level = self.level.min(capacity(self.burst()));
    }

    /// Changes the rate and the burst at `now`, as `set_rate` does.
    pub fn set_rate_and_burst(&mut self, rate_per_minute: u32, burst: u32, now: Timestamp) {
        self.explicit_burst = Some(burst);
        self.set_rate(rate_per_minute, now);
    }

    fn refill(&mut self, now: Timestamp) {
        self.level = self.level_at(now);
        self.updated_at = self.updated_at.max(now);
    }

    fn level_at(&self, now: Timestamp) -> u128 {
        // A clock that stepped backwards refills nothing.
        let elapsed = u128::try_from(now.duration_since(self.updated_at).as_nanos()).unwrap_or(0);
        let added = elapsed.saturating_mul(u128::from(self.rate_per_minute));
        self.level.saturating_add(added).min(capacity(self.burst()))
    }
}

fn burst(rate_per_minute: u32) -> u32 {
    if rate_per_minute == 0 {
        0
    } else {
        (rate_per_minute / 60).max(1)
    }
}

fn capacity(burst: u32) -> u128 {
    u128::from(burst) * NANOS_PER_MINUTE
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;
    use proptest::prelude::*;

    fn t(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_700_000_000_000 + millis).expect("valid test timestamp")
    }

    #[test]
    fn burst_is_one_second_of_tokens_at_least_one() {
        assert_eq!(TokenBucket::new(1000, t(0)).burst(), 16);
        assert_eq!(TokenBucket::new(60, t(0)).burst(), 1);
        assert_eq!(TokenBucket::new(1, t(0)).burst(), 1);
        assert_eq!(TokenBucket::new(0, t(0)).burst(), 0);
    }

    #[test]
    fn refills_at_the_rate() {
        let mut bucket = TokenBucket::new(60, t(0));
        assert!(bucket.try_take(t(0)));
        assert!(!bucket.try_take(t(0)));
        assert!(!bucket.has_token(t(999)));
        assert!(bucket.has_token(t(1000)));
        assert!(bucket.try_take(t(1000)));
        assert!(!bucket.try_take(t(1500)));
    }

    #[test]
    fn the_nth_token_comes_after_the_burst_at_the_rate() {
        let mut bucket = TokenBucket::with_burst(60, 5, t(0));
        for n in 1..=5 {
            assert_eq!(bucket.nth_token_at(n, t(0)), Some(t(0)), "token {n}");
        }
        assert_eq!(bucket.nth_token_at(6, t(0)), Some(t(1000)));
        assert_eq!(bucket.nth_token_at(10, t(0)), Some(t(5000)));
        // Emptied, the first comes a second on, and half a second later half the wait is left.
        for _ in 0..5 {
            assert!(bucket.try_take(t(0)));
        }
        assert_eq!(bucket.nth_token_at(1, t(0)), Some(t(1000)));
        assert_eq!(bucket.nth_token_at(1, t(500)), Some(t(1000)));
        assert_eq!(bucket.nth_token_at(3, t(500)), Some(t(3000)));
        assert_eq!(TokenBucket::new(0, t(0)).nth_token_at(1, t(0)), None);
    }

    #[test]
    fn zero_rate_grants_nothing() {
        let mut bucket = TokenBucket::new(0, t(0));
        assert!(!bucket.try_take(t(0)));
        assert!(!bucket.try_take(t(3_600_000)));
    }

    #[test]
    fn clock_stepping_back_refills_nothing() {
        let mut bucket = TokenBucket::new(60, t(10_000));
        assert!(bucket.try_take(t(10_000)));
        assert!(!bucket.try_take(t(0)));
        // The step back did not move the refill origin backwards either.
        assert!(!bucket.try_take(t(10_999)));
        assert!(bucket.try_take(t(11_000)));
    }

    #[test]
    fn an_explicit_burst_is_kept_across_rate_changes() {
        let mut bucket = TokenBucket::with_burst(60, 3, t(0));
        assert_eq!(bucket.burst(), 3);
        for _ in 0..3 {
            assert!(bucket.try_take(t(0)));
        }
        assert!(!bucket.try_take(t(0)));
        assert!(!bucket.is_full(t(2000)));
        assert!(bucket.is_full(t(3000)));
        bucket.set_rate(120, t(3000));
        assert_eq!(bucket.burst(), 3);
        bucket.set_rate_and_burst(120, 1, t(3000));
        assert!(bucket.try_take(t(3000)));
        assert!(!bucket.try_take(t(3000)));
        assert!(bucket.try_take(t(3500)));
    }

    #[test]
    fn lowering_the_rate_cuts_the_burst() {
        let mut bucket = TokenBucket::new(6000, t(0));
        bucket.set_rate(60, t(0));
        assert!(bucket.try_take(t(0)));
        assert!(!bucket.try_take(t(0)));
    }

    proptest! {
        /// Over every window between two grants, the grants in it stay within burst + rate * length.
        #[test]
        fn never_exceeds_its_rate_over_any_window(
            rate in 0u32..5000,
            steps in proptest::collection::vec((0i64..5_000, 1usize..40), 1..200),
        ) {
            let mut now = t(0);
            let mut bucket = TokenBucket::new(rate, now);
            let mut grants: Vec<Timestamp> = Vec::new();
            for (advance_millis, tries) in steps {
                now += SignedDuration::from_millis(advance_millis);
                for _ in 0..tries {
                    if bucket.try_take(now) {
                        grants.push(now);
                    }
                }
            }
            // Grants first..=last must satisfy count * U <= burst * U + rate * (t_last - t_first).
            // With f(k) = k * U - rate * t_k that is f(last) - f(first) + U <= burst * U, so
            // checking each `last` against the smallest f(first) before it covers every window.
            let unit = NANOS_PER_MINUTE as i128;
            let documented_burst = if rate == 0 { 0 } else { (rate / 60).max(1) };
            let origin = t(0);
            let mut smallest_before: Option<i128> = None;
            for (index, granted_at) in grants.iter().enumerate() {
                let nanos = granted_at.duration_since(origin).as_nanos();
                let f = index as i128 * unit - i128::from(rate) * nanos;
                let smallest = smallest_before.map_or(f, |smallest| smallest.min(f));
                smallest_before = Some(smallest);
                prop_assert!(
                    f - smallest + unit <= i128::from(documented_burst) * unit,
                    "grant {index} at {granted_at} exceeds {rate}/min"
                );
            }
        }

        /// The bucket is not stingier than its rate: a caller asking every 7 ms gets the rate, less
        /// what overflows a full bucket between two asks (with a burst of 1, up to 7 ms of refill per
        /// grant: under 1.4% below 120/min, nothing above).
        #[test]
        fn grants_the_full_rate_to_a_busy_caller(rate in 1u32..5000, minutes in 1i64..5) {
            let mut now = t(0);
            let mut bucket = TokenBucket::new(rate, now);
            let mut granted = 0u64;
            let end = now + SignedDuration::from_mins(minutes);
            while now <= end {
                while bucket.try_take(now) {
                    granted += 1;
                }
                now += SignedDuration::from_millis(7);
            }
            let expected = u64::from(rate) * minutes as u64;
            prop_assert!(
                granted * 1000 >= expected * 986,
                "granted {granted}, expected about {expected}"
            );
        }
    }
}
