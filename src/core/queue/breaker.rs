//! Circuit breaker for the tasks of one type in one namespace of one queue (DESIGN §4
//! `circuitBreaker`; per namespace so that teams sharing a queue do not open each other's circuits).
//!
//! Closed: outcomes go into a sliding window of the last `window_size` outcomes; when the window holds
//! at least `min_requests` outcomes and the failure ratio is at least `failure_ratio`, the breaker
//! opens for `open_for`. Open: nothing is dispatched until that time passes. Half-open: exactly one
//! probe is let through; its success closes the breaker with an empty window, its failure opens it
//! again for `open_for`. Outcomes of tasks that were already running when the breaker opened are
//! ignored: only the probe decides.

use std::collections::VecDeque;

use jiff::{SignedDuration, Timestamp};

/// Thresholds of a breaker; the same for every (namespace, type) of a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// How many of the most recent outcomes are judged. 0 disables the breaker.
    pub window_size: u32,
    /// Fewer outcomes than this in the window never open the breaker (a larger value than
    /// `window_size` therefore never opens it).
    pub min_requests: u32,
    /// Failures / outcomes in the window at or above which the breaker opens.
    pub failure_ratio: f64,
    /// How long the breaker stays open before it lets one probe through.
    pub open_for: SignedDuration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window_size: 20,
            min_requests: 10,
            failure_ratio: 0.5,
            open_for: SignedDuration::from_secs(30),
        }
    }
}

/// What a breaker lets through, as reported in queue status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// Nothing of the type is dispatched before `until`.
    Open {
        until: Timestamp,
    },
    /// `open_for` has passed; one probe may run (or is running when `probe_in_flight`).
    HalfOpen {
        probe_in_flight: bool,
    },
}

/// The outcome of a finished task as the breaker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Failure,
}

#[derive(Debug, Clone)]
enum State {
    Closed {
        /// `true` = failure, oldest first.
        window: VecDeque<bool>,
        failures: u32,
    },
    Open {
        until: Timestamp,
    },
    HalfOpen {
        probe_in_flight: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    state: State,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new()
    }
}

impl Breaker {
    pub fn new() -> Self {
        Self {
            state: State::Closed {
                window: VecDeque::new(),
                failures: 0,
            },
        }
    }

    /// The state at `now`, counting an open breaker whose time has passed as half-open.
    pub fn state(&self, now: Timestamp) -> BreakerState {
        match &self.state {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until } if now < *until => BreakerState::Open { until: *until },
            State::Open { .. } => BreakerState::HalfOpen {
                probe_in_flight: false,
            },
            State::HalfOpen { probe_in_flight } => BreakerState::HalfOpen {
                probe_in_flight: *probe_in_flight,
            },
        }
    }

    /// Whether a task of this type may be dispatched at `now`.
    pub fn allows(&self, now: Timestamp) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open { .. } => false,
            BreakerState::HalfOpen { probe_in_flight } => !probe_in_flight,
        }
    }

    /// Records that a task of this type was dispatched at `now` (the caller checked `allows`).
    /// Returns `true` when that task is the half-open probe, whose outcome decides the breaker.
    pub fn on_dispatch(&mut self, now: Timestamp) -> bool {
        match self.state(now) {
            BreakerState::Closed => false,
            BreakerState::Open { .. } | BreakerState::HalfOpen { .. } => {
                self.state = State::HalfOpen {
                    probe_in_flight: true,
                };
                true
            }
        }
    }

    /// Feeds the outcome of a task dispatched while closed (`probe == false`) or of the probe.
    pub fn record(
        &mut self,
        verdict: Verdict,
        probe: bool,
        now: Timestamp,
        config: &BreakerConfig,
    ) {
        let failed = verdict == Verdict::Failure;
        match &mut self.state {
            State::HalfOpen { .. } if probe => {
                self.state = if failed {
                    State::Open {
                        until: open_until(now, config),
                    }
                } else {
                    Self::new().state
                };
            }
            State::Closed { window, failures } if !probe => {
                window.push_back(failed);
                *failures += u32::from(failed);
                trim(window, failures, config.window_size);
                if trips(window.len(), *failures, config) {
                    self.state = State::Open {
                        until: open_until(now, config),
                    };
                }
            }
            // A task started before the breaker opened (or a stale probe): it does not decide.
            _ => {}
        }
    }

    /// Forgets a probe that ended without a verdict (canceled, deleted), so another probe may run.
    pub fn probe_abandoned(&mut self) {
        if let State::HalfOpen { probe_in_flight } = &mut self.state {
            *probe_in_flight = false;
        }
    }

    /// Applies a changed configuration at once: a shorter window drops the oldest outcomes.
    pub fn reconfigure(&mut self, now: Timestamp, config: &BreakerConfig) {
        if let State::Closed { window, failures } = &mut self.state {
            trim(window, failures, config.window_size);
            if trips(window.len(), *failures, config) {
                self.state = State::Open {
                    until: open_until(now, config),
                };
            }
        }
    }

    /// Whether forgetting this breaker loses nothing that matters: closed with no failure in its
    /// window. (Recent successes would only dilute future failures; dropping them when the type goes
    /// idle keeps memory bounded by the live types.)
    pub fn is_forgettable(&self) -> bool {
        matches!(&self.state, State::Closed { failures: 0, .. })
    }
}

fn open_until(now: Timestamp, config: &BreakerConfig) -> Timestamp {
    now.saturating_add(config.open_for)
        .unwrap_or(Timestamp::MAX)
}

fn trim(window: &mut VecDeque<bool>, failures: &mut u32, window_size: u32) {
    while window.len() > window_size as usize {
        if window.pop_front() == Some(true) {
            *failures -= 1;
        }
    }
}

fn trips(outcomes: usize, failures: u32, config: &BreakerConfig) -> bool {
    outcomes > 0
        && outcomes >= config.min_requests as usize
        && f64::from(failures) >= config.failure_ratio * outcomes as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid test timestamp")
    }

    fn feed(breaker: &mut Breaker, failures: usize, successes: usize, now: Timestamp) {
        let config = BreakerConfig::default();
        for _ in 0..successes {
            breaker.record(Verdict::Success, false, now, &config);
        }
        for _ in 0..failures {
            breaker.record(Verdict::Failure, false, now, &config);
        }
    }

    #[test]
    fn stays_closed_below_min_requests() {
        let mut breaker = Breaker::new();
        feed(&mut breaker, 9, 0, t(0));
        assert_eq!(breaker.state(t(0)), BreakerState::Closed);
        feed(&mut breaker, 1, 0, t(0));
        assert_eq!(breaker.state(t(0)), BreakerState::Open { until: t(30) });
    }

    #[test]
    fn stays_closed_below_failure_ratio() {
        let mut breaker = Breaker::new();
        feed(&mut breaker, 9, 11, t(0));
        assert_eq!(breaker.state(t(0)), BreakerState::Closed);
        // One more failure pushes the oldest success out: 10 of 20 failed.
        feed(&mut breaker, 1, 0, t(0));
        assert!(!breaker.allows(t(0)));
    }

    #[test]
    fn window_slides_over_old_failures() {
        let mut breaker = Breaker::new();
        feed(&mut breaker, 9, 11, t(0));
        // 18 failures out of 40 outcomes, but the first nine left the window of 20.
        feed(&mut breaker, 9, 11, t(0));
        assert_eq!(breaker.state(t(0)), BreakerState::Closed);
        feed(&mut breaker, 1, 0, t(0));
        assert!(!breaker.allows(t(0)));
    }

    #[test]
    fn half_open_lets_exactly_one_probe_then_closes_on_success() {
        let config = BreakerConfig::default();
        let mut breaker = Breaker::new();
        feed(&mut breaker, 10, 0, t(0));
        assert!(!breaker.allows(t(29)));
        assert!(breaker.allows(t(30)));
        assert_eq!(
            breaker.state(t(30)),
            BreakerState::HalfOpen {
                probe_in_flight: false
            }
        );
        assert!(breaker.on_dispatch(t(30)));
        assert!(!breaker.allows(t(31)));
        assert!(!breaker.allows(t(1000)));
        // A task that was running before the breaker opened does not decide.
        breaker.record(Verdict::Success, false, t(32), &config);
        assert!(!breaker.allows(t(32)));
        breaker.record(Verdict::Success, true, t(33), &config);
        assert_eq!(breaker.state(t(33)), BreakerState::Closed);
        assert!(breaker.is_forgettable());
        // The window was reset: nine failures do not open it again.
        feed(&mut breaker, 9, 0, t(34));
        assert!(breaker.allows(t(34)));
    }

    #[test]
    fn probe_failure_opens_again_for_open_for() {
        let config = BreakerConfig::default();
        let mut breaker = Breaker::new();
        feed(&mut breaker, 10, 0, t(0));
        assert!(breaker.on_dispatch(t(40)));
        breaker.record(Verdict::Failure, true, t(45), &config);
        assert_eq!(breaker.state(t(45)), BreakerState::Open { until: t(75) });
        assert!(!breaker.allows(t(74)));
        assert!(breaker.allows(t(75)));
    }

    #[test]
    fn abandoned_probe_lets_another_probe_through() {
        let mut breaker = Breaker::new();
        feed(&mut breaker, 10, 0, t(0));
        assert!(breaker.on_dispatch(t(30)));
        assert!(!breaker.allows(t(31)));
        breaker.probe_abandoned();
        assert!(breaker.allows(t(31)));
    }

    #[test]
    fn only_a_closed_breaker_without_failures_is_forgettable() {
        let config = BreakerConfig::default();
        let mut breaker = Breaker::new();
        assert!(breaker.is_forgettable());
        breaker.record(Verdict::Success, false, t(0), &config);
        assert!(breaker.is_forgettable());
        breaker.record(Verdict::Failure, false, t(0), &config);
        assert!(!breaker.is_forgettable());
        feed(&mut breaker, 10, 0, t(0));
        assert!(!breaker.is_forgettable());
    }

    #[test]
    fn closed_dispatch_is_not_a_probe() {
        let mut breaker = Breaker::new();
        assert!(!breaker.on_dispatch(t(0)));
        assert!(breaker.allows(t(0)));
    }

    #[test]
    fn zero_window_never_opens() {
        let config = BreakerConfig {
            window_size: 0,
            min_requests: 0,
            ..BreakerConfig::default()
        };
        let mut breaker = Breaker::new();
        for _ in 0..50 {
            breaker.record(Verdict::Failure, false, t(0), &config);
        }
        assert_eq!(breaker.state(t(0)), BreakerState::Closed);
    }

    #[test]
    fn shrinking_the_window_applies_at_once() {
        let mut breaker = Breaker::new();
        let config = BreakerConfig::default();
        for _ in 0..10 {
            breaker.record(Verdict::Success, false, t(0), &config);
        }
        for _ in 0..9 {
            breaker.record(Verdict::Failure, false, t(0), &config);
        }
        assert_eq!(breaker.state(t(0)), BreakerState::Closed);
        let smaller = BreakerConfig {
            window_size: 10,
            ..config
        };
        breaker.reconfigure(t(1), &smaller);
        assert_eq!(breaker.state(t(1)), BreakerState::Open { until: t(31) });
    }
}
