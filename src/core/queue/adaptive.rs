//! `concurrencyPolicy: Adaptive`: a queue's effective concurrency follows what the cluster can
//! place, between the policy's `min` and the concurrency in force (`spec.concurrency` or a window's).
//!
//! The algorithm is AIMD — additive increase, multiplicative decrease — the congestion control of
//! TCP, driven by one look at the queue's worker pods per period:
//! - congested (some of its pods are Unschedulable, or run on nodes reporting MemoryPressure,
//!   DiskPressure or PIDPressure): decrease to what the cluster holds for the queue on healthy
//!   nodes, but at most by half in one period; never grow. For Unschedulable pods "what it holds"
//!   is the most placed in the last [`PLACED_MEMORY`] looks: the scheduler retries an
//!   Unschedulable pod only after a back-off (up to 10 s), so pods that finished leave room that
//!   still-waiting pods have not taken yet, and the count of the moment would undershoot;
//! - not congested, with tasks waiting and every slot in use: increase by a step that starts at 1
//!   and doubles after every [`CALM_PERIODS`] calm periods in a row, at most a quarter of the
//!   current value (so a cluster that grew is found in a few periods, and an overshoot is small);
//!   near the value of the last decrease (up to a quarter above it) the step stays 1, like TCP's
//!   congestion avoidance above its slow-start threshold, so probing the known edge costs at
//!   most a pod or two;
//! - otherwise (idle, or a limit of another kind binds): stay, since nothing was learned.
//!
//! Why AIMD and not a gradient (as in Netflix's concurrency-limits): a gradient needs a latency to
//! compare with its minimum, and the signal here is not a latency but whether pods were placed —
//! a binary, delayed (scheduler back-off) congestion signal, exactly what AIMD is stable under. The
//! decrease does not halve blindly: the number of pods placed is a measurement of the capacity the
//! queue got, so the limit drops to it in one step instead of oscillating below it.
//!
//! Pure: the controller is fed an [`Observation`] and the bounds in force, and says what changed.

use std::fmt;

/// Calm periods (no congestion, every slot used, tasks waiting) after which the step doubles.
pub const CALM_PERIODS: u32 = 4;
/// Looks over which the most pods placed is taken as the capacity the queue got.
pub const PLACED_MEMORY: usize = 5;

/// What the cluster shows about one queue's worker pods at one look, and the queue's own counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// Live pods whose `PodScheduled` condition is False with reason `Unschedulable`.
    pub unschedulable: u32,
    /// Live pods bound to a node.
    pub placed: u32,
    /// Of `placed`, those on a node reporting a pressure condition.
    pub on_pressured_nodes: u32,
    /// Such nodes and their conditions, for messages (e.g. `ax-sim-1 MemoryPressure`).
    pub pressured_nodes: Vec<String>,
    /// Slots in use (tasks Scheduled or Running, or with a pod still stopping).
    pub held: u32,
    /// Tasks waiting for a slot.
    pub waiting: u32,
}

/// The limits the controller moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `concurrencyPolicy.min`.
    pub min: u32,
    /// The concurrency in force; it wins over `min` when lower (0 pauses the queue).
    pub max: u32,
}

impl Bounds {
    fn clamp(self, value: u32) -> u32 {
        value.clamp(self.min.min(self.max), self.max)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeReason {
    PodsUnschedulable,
    NodePressure,
    PodsPlaced,
}

impl ChangeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeReason::PodsUnschedulable => "PodsUnschedulable",
            ChangeReason::NodePressure => "NodePressure",
            ChangeReason::PodsPlaced => "PodsPlaced",
        }
    }
}

/// A change the controller made, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub from: u32,
    pub to: u32,
    pub reason: ChangeReason,
    pub message: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "effective concurrency {} -> {}: {}",
            self.from, self.to, self.message
        )
    }
}

/// The adaptive limit of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptiveConcurrency {
    current: u32,
    step: u32,
    calm: u32,
    /// Healthy pods placed at the last [`PLACED_MEMORY`] looks, newest last.
    recent_placed: std::collections::VecDeque<u32>,
    /// The value of the last decrease: growth near it is by 1.
    edge: Option<u32>,
}

impl AdaptiveConcurrency {
    /// Starts at `start` (e.g. the slots already in use, or the value an earlier leader reported),
    /// within `bounds`.
    pub fn new(start: u32, bounds: Bounds) -> Self {
        Self {
            current: bounds.clamp(start),
            step: 1,
            calm: 0,
            recent_placed: std::collections::VecDeque::with_capacity(PLACED_MEMORY),
            edge: None,
        }
    }

    /// The limit now, within the bounds it was last given.
    pub fn current(&self) -> u32 {
        self.current
    }

    /// One period's look. Returns the change it made, if any (a value only clamped into new
    /// bounds is not a change of the controller's).
    pub fn observe(&mut self, seen: &Observation, bounds: Bounds) -> Option<Change> {
        let current = bounds.clamp(self.current);
        self.current = current;
        let healthy = seen.placed.saturating_sub(seen.on_pressured_nodes);
        if self.recent_placed.len() == PLACED_MEMORY {
            self.recent_placed.pop_front();
        }
        self.recent_placed.push_back(healthy);
        let congested = seen.unschedulable > 0 || seen.on_pressured_nodes > 0;
        let (to, reason, message) = if congested {
            self.step = 1;
            self.calm = 0;
            // Pressure is news of the moment; Unschedulable pods may be a scheduler back-off's lag.
            let held_lately = if seen.on_pressured_nodes > 0 {
                healthy
            } else {
                self.recent_placed.iter().copied().max().unwrap_or(healthy)
            };
            let to = bounds.clamp(held_lately.max(current / 2).min(current));
            if to < current {
                self.edge = Some(to);
            }
            if seen.on_pressured_nodes > 0 {
                let message = format!(
                    "{} pods of the queue run on nodes reporting pressure ({}), {healthy} placed elsewhere, {} Unschedulable",
                    seen.on_pressured_nodes,
                    seen.pressured_nodes.join(", "),
                    seen.unschedulable
                );
                (to, ChangeReason::NodePressure, message)
            } else {
                let message = format!(
                    "{} pods of the queue are Unschedulable, {healthy} placed",
                    seen.unschedulable
                );
                (to, ChangeReason::PodsUnschedulable, message)
            }
        } else if seen.waiting > 0 && seen.held >= current {
            // Past a quarter above the last decrease, that edge is stale: the cluster grew.
            if self
                .edge
                .is_some_and(|edge| current > edge.saturating_add((edge / 4).max(1)))
            {
                self.edge = None;
                self.step = 1;
                self.calm = 0;
            }
            let step = if self.edge.is_some() { 1 } else { self.step };
            let to = bounds.clamp(current.saturating_add(step));
            self.calm += 1;
            if self.calm.is_multiple_of(CALM_PERIODS) {
                self.step = (self.step * 2).min((current / 4).max(1));
            }
            let message = format!(
                "every pod of the queue was placed and {} tasks wait",
                seen.waiting
            );
            (to, ChangeReason::PodsPlaced, message)
        } else {
            return None;
        };
        self.current = to;
        (to != current).then_some(Change {
            from: current,
            to,
            reason,
            message,
        })
    }
}

/// Whether a move from `evented` (the value at the last Event) to `now` is large enough for an
/// Event: at least a quarter, and at least 2.
pub fn worth_an_event(evented: u32, now: u32) -> bool {
    now.abs_diff(evented) >= (evented.div_ceil(4)).max(2)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bounds(min: u32, max: u32) -> Bounds {
        Bounds { min, max }
    }

    /// One period of a simple cluster: the queue keeps `limit` tasks dispatched while it has a
    /// backlog; the cluster places at most `capacity` of them; placed ones finish within the period
    /// and are replaced; the rest stay Unschedulable (holding their slots) until placed.
    struct Cluster {
        capacity: u32,
        pressured: u32,
        held: u32,
        backlog: u32,
    }

    impl Cluster {
        fn look(&mut self, limit: u32) -> Observation {
            // Dispatch up to the limit (never takes back what already holds a slot).
            let dispatch = limit.saturating_sub(self.held).min(self.backlog);
            self.held += dispatch;
            self.backlog -= dispatch;
            let placed = self.held.min(self.capacity);
            let seen = Observation {
                unschedulable: self.held - placed,
                placed,
                on_pressured_nodes: self.pressured.min(placed),
                pressured_nodes: vec!["node-0 MemoryPressure".into()],
                held: self.held,
                waiting: self.backlog,
            };
            // Placed tasks finish and free their slots; new work keeps arriving.
            self.held -= placed;
            self.backlog += placed;
            seen
        }
    }

    #[test]
    fn finds_the_capacity_and_follows_it_when_it_grows() {
        let b = bounds(2, 50);
        let mut adaptive = AdaptiveConcurrency::new(0, b);
        assert_eq!(adaptive.current(), 2);
        let mut cluster = Cluster {
            capacity: 10,
            pressured: 0,
            held: 0,
            backlog: 1000,
        };
        let mut values = Vec::new();
        for _ in 0..30 {
            let seen = cluster.look(adaptive.current());
            adaptive.observe(&seen, b);
            values.push(adaptive.current());
        }
        assert!(
            values[15..].iter().all(|v| (10..=12).contains(v)),
            "{values:?}"
        );
        cluster.capacity = 40;
        let mut periods = 0;
        while adaptive.current() < 36 {
            let seen = cluster.look(adaptive.current());
            adaptive.observe(&seen, b);
            periods += 1;
            assert!(periods < 25, "too slow to grow: {}", adaptive.current());
        }
    }

    #[test]
    fn pods_waiting_out_a_scheduler_back_off_do_not_cut_below_what_was_just_placed() {
        let b = bounds(2, 50);
        let mut adaptive = AdaptiveConcurrency::new(16, b);
        let full = Observation {
            unschedulable: 6,
            placed: 10,
            held: 16,
            waiting: 20,
            ..Observation::default()
        };
        let change = adaptive.observe(&full, b).expect("a decrease");
        assert_eq!((change.from, change.to), (16, 10));
        // Some pods finished; the Unschedulable ones have not been retried yet.
        let lagging = Observation {
            unschedulable: 4,
            placed: 4,
            held: 10,
            waiting: 20,
            ..Observation::default()
        };
        assert_eq!(adaptive.observe(&lagging, b), None);
        assert_eq!(adaptive.current(), 10);
        // Once that look has aged out, a capacity that really shrank is followed (by half at most
        // per look: 10 -> 5 -> 4).
        for _ in 0..PLACED_MEMORY {
            adaptive.observe(&lagging, b);
        }
        assert_eq!(adaptive.current(), 4);
    }

    #[test]
    fn probes_the_last_edge_one_pod_at_a_time() {
        let b = bounds(2, 50);
        let mut adaptive = AdaptiveConcurrency::new(16, b);
        let over = Observation {
            unschedulable: 6,
            placed: 10,
            held: 16,
            waiting: 20,
            ..Observation::default()
        };
        adaptive.observe(&over, b);
        let mut values = Vec::new();
        for _ in 0..8 {
            let current = adaptive.current();
            let calm = Observation {
                placed: current,
                held: current,
                waiting: 20,
                ..Observation::default()
            };
            adaptive.observe(&calm, b);
            values.push(adaptive.current());
        }
        // By 1 up to a quarter above the edge, then faster again.
        assert_eq!(&values[..3], &[11, 12, 13], "{values:?}");
    }

    #[test]
    fn pressure_shrinks_by_the_pods_exposed_and_says_so() {
        let b = bounds(2, 50);
        let mut adaptive = AdaptiveConcurrency::new(10, b);
        let seen = Observation {
            placed: 10,
            on_pressured_nodes: 4,
            pressured_nodes: vec!["ax-sim-1 MemoryPressure".into()],
            held: 10,
            waiting: 5,
            ..Observation::default()
        };
        let change = adaptive.observe(&seen, b).expect("a change");
        assert_eq!((change.from, change.to), (10, 6));
        assert_eq!(change.reason, ChangeReason::NodePressure);
        assert!(
            change.message.contains("ax-sim-1 MemoryPressure"),
            "{change}"
        );
    }

    #[test]
    fn a_window_lowering_the_maximum_caps_it_silently() {
        let mut adaptive = AdaptiveConcurrency::new(20, bounds(2, 50));
        let idle = Observation::default();
        assert_eq!(adaptive.observe(&idle, bounds(2, 5)), None);
        assert_eq!(adaptive.current(), 5);
        // Paused: 0 wins over min.
        assert_eq!(adaptive.observe(&idle, bounds(2, 0)), None);
        assert_eq!(adaptive.current(), 0);
    }

    #[test]
    fn events_only_for_large_moves() {
        assert!(!worth_an_event(10, 11));
        assert!(!worth_an_event(10, 12));
        assert!(worth_an_event(10, 13));
        assert!(worth_an_event(16, 10));
        assert!(!worth_an_event(2, 3));
        assert!(worth_an_event(2, 4));
    }

    fn observation() -> impl Strategy<Value = Observation> {
        (0u32..30, 0u32..60, 0u32..20, 0u32..80, 0u32..50).prop_map(
            |(unschedulable, placed, pressured, held, waiting)| Observation {
                unschedulable,
                placed,
                on_pressured_nodes: pressured.min(placed),
                pressured_nodes: Vec::new(),
                held,
                waiting,
            },
        )
    }

    proptest! {
        /// Whatever the cluster shows, the limit stays within [min, max] (max wins when lower),
        /// and never grows in a period where pods are Unschedulable or nodes under pressure.
        #[test]
        fn stays_in_bounds_and_never_grows_while_congested(
            start in 0u32..100,
            looks in proptest::collection::vec((observation(), 1u32..10, 0u32..80), 1..200),
        ) {
            let mut adaptive = AdaptiveConcurrency::new(start, bounds(1, 50));
            for (seen, min, max) in looks {
                let b = bounds(min, max);
                let before = b.clamp(adaptive.current());
                let change = adaptive.observe(&seen, b);
                let now = adaptive.current();
                prop_assert!(now <= max);
                prop_assert!(now >= min.min(max));
                if seen.unschedulable > 0 || seen.on_pressured_nodes > 0 {
                    prop_assert!(now <= before, "grew from {} to {} while congested", before, now);
                }
                if let Some(change) = change {
                    prop_assert_eq!((change.from, change.to), (before, now));
                }
            }
        }

        /// In a simulated cluster of any capacity, the limit converges to it: after a while it
        /// stays within one step above (the probe that finds the edge) and never below.
        #[test]
        fn converges_to_the_capacity(capacity in 1u32..200, min in 1u32..5, max in 200u32..400) {
            let b = bounds(min, max);
            let mut adaptive = AdaptiveConcurrency::new(min, b);
            let mut cluster = Cluster { capacity, pressured: 0, held: 0, backlog: 10_000 };
            let mut late = Vec::new();
            for period in 0..200 {
                let seen = cluster.look(adaptive.current());
                adaptive.observe(&seen, b);
                if period >= 150 {
                    late.push(adaptive.current());
                }
            }
            let floor = capacity.max(min);
            let ceiling = floor + (floor / 4).max(1);
            prop_assert!(
                late.iter().all(|v| (floor..=ceiling).contains(v)),
                "capacity {capacity}: {late:?}"
            );
        }

        /// Pressure on nodes holding some of the queue's pods always lowers it (down to min).
        #[test]
        fn pressure_lowers_it(capacity in 4u32..100, share in 1u32..4) {
            let b = bounds(1, 400);
            let mut adaptive = AdaptiveConcurrency::new(capacity, b);
            let mut cluster = Cluster { capacity, pressured: capacity / share / 2 + 1, held: 0, backlog: 10_000 };
            let seen = cluster.look(adaptive.current());
            let change = adaptive.observe(&seen, b).expect("a change");
            prop_assert_eq!(change.reason, ChangeReason::NodePressure);
            prop_assert!(change.to < change.from);
        }
    }
}
