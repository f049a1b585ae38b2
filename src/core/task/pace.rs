//! The line of progress writes that are due: a status that records only progress (dispatched,
//! running; `Decision::progress_only`) whose write delay has run out is written at most
//! `per_second` a second, in the order they fell due; outcomes never wait here.
//!
//! Why: in a burst, dispatch → outcome outlasts the write delay for most tasks, and the one extra
//! status write each then makes slows every other write down — more tasks outlast the delay, and
//! so on. Measured on the benchmark's burst of 500, these writes took ax from 46 to 30 units/s.
//! A paced progress write that an outcome overtakes is never made: the outcome's write carries it.

use std::collections::VecDeque;

use jiff::Timestamp;

use crate::core::queue::token_bucket::TokenBucket;

#[derive(Debug, Clone)]
pub struct ProgressLine<K> {
    waiting: VecDeque<K>,
    tokens: TokenBucket,
}

impl<K> ProgressLine<K> {
    /// A line letting `per_second` writes through a second, after a first second's worth at once.
    pub fn new(per_second: u32, now: Timestamp) -> Self {
        Self {
            waiting: VecDeque::new(),
            tokens: TokenBucket::new(per_second.saturating_mul(60), now),
        }
    }

    /// A due progress write asks to go: yes (and a token is taken) when nobody waits before it
    /// and a token is free; otherwise it is to [`Self::wait`].
    pub fn may_go_now(&mut self, now: Timestamp) -> bool {
        self.waiting.is_empty() && self.tokens.try_take(now)
    }

    /// Puts a due write at the end of the line.
    pub fn wait(&mut self, key: K) {
        self.waiting.push_back(key);
    }

    /// Lets writes through from the front of the line as tokens allow. `still_due` says whether a
    /// key still has its write to make (an outcome may have carried it since): one that has not
    /// leaves the line without taking a token.
    pub fn let_through(&mut self, now: Timestamp, mut still_due: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut through = Vec::new();
        while let Some(key) = self.waiting.front() {
            if !still_due(key) {
                self.waiting.pop_front();
            } else if self.tokens.try_take(now) {
                through.extend(self.waiting.pop_front());
            } else {
                break;
            }
        }
        through
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_700_000_000_000 + millis).expect("valid test timestamp")
    }

    #[test]
    fn a_second_worth_goes_at_once_then_the_rest_waits_its_turn_in_order() {
        let mut line = ProgressLine::new(2, t(0));
        assert!(line.may_go_now(t(0)));
        assert!(line.may_go_now(t(0)));
        assert!(!line.may_go_now(t(0)));
        for key in ["a", "b", "c"] {
            line.wait(key);
        }
        assert_eq!(line.let_through(t(0), |_| true), Vec::<&str>::new());
        assert_eq!(line.let_through(t(500), |_| true), vec!["a"]);
        // Someone waits: a newcomer does not jump the line even with a token free.
        assert!(!line.may_go_now(t(1000)));
        assert_eq!(line.let_through(t(1000), |_| true), vec!["b"]);
        assert_eq!(line.let_through(t(2000), |_| true), vec!["c"]);
        assert!(line.is_empty());
    }

    #[test]
    fn a_write_an_outcome_carried_leaves_the_line_without_a_token() {
        let mut line = ProgressLine::new(1, t(0));
        assert!(line.may_go_now(t(0)));
        for key in ["done", "done-too", "running"] {
            line.wait(key);
        }
        let through = line.let_through(t(1000), |k| !k.starts_with("done"));
        assert_eq!(through, vec!["running"]);
        assert!(line.is_empty());
    }

    proptest! {
        /// Over any run, no more are let through than the rate allows, in the order they waited,
        /// and every key still due is let through once enough time has passed.
        #[test]
        fn the_line_keeps_order_and_rate(
            per_second in 1u32..20,
            steps in prop::collection::vec((0i64..400, 0usize..5), 1..60),
        ) {
            let mut line = ProgressLine::new(per_second, t(0));
            let mut now = 0;
            let mut next = 0u32;
            let mut through = Vec::new();
            for (wait, arrivals) in steps {
                now += wait;
                for _ in 0..arrivals {
                    line.wait(next);
                    next += 1;
                }
                through.extend(line.let_through(t(now), |_| true));
            }
            let allowed = u64::from(per_second) + u64::from(per_second) * u64::try_from(now).unwrap() / 1000;
            prop_assert!(through.len() as u64 <= allowed);
            prop_assert!(through.windows(2).all(|w| w[0] < w[1]));
            for second in 1..=i64::from(next) + 1 {
                through.extend(line.let_through(t(now + 1000 * second), |_| true));
            }
            prop_assert_eq!(through, (0..next).collect::<Vec<_>>());
        }
    }
}
