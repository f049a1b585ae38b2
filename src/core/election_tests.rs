//! Tests of `core::election`: the decisions one by one, then replicas racing through a simulated
//! API server with random latencies and pauses, checked for two leaders at once and for flapping.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BinaryHeap};

fn timing() -> Timing {
    Timing::new(
        Duration::from_secs(10),
        Duration::from_secs(7),
        Duration::from_secs(1),
    )
    .expect("valid timing")
}

fn held_by(holder: &str, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
        lease_duration_seconds: Some(10),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

fn written_spec(step: Step) -> LeaseSpec {
    match step {
        Step::Write(spec) => spec,
        Step::Wait => panic!("expected a write"),
    }
}

#[test]
fn timing_is_validated() {
    let s = Duration::from_secs;
    assert!(Timing::new(s(15), s(10), s(2)).is_ok());
    for (duration, deadline, retry) in [
        (s(10), s(10), s(2)),
        (s(10), s(12), s(2)),
        (s(10), s(5), s(5)),
        (s(10), s(5), s(0)),
        (
            Duration::from_millis(1500),
            s(1),
            Duration::from_millis(100),
        ),
        (s(0), s(0), s(0)),
    ] {
        assert!(
            Timing::new(duration, deadline, retry).is_err(),
            "{duration:?} {deadline:?} {retry:?}"
        );
    }
}

#[test]
fn a_missing_or_released_lease_is_taken_at_once() {
    let now = Instant::now();
    let mut e = Elector::new("a", timing());
    assert_eq!(e.role(now), Role::Unknown);
    assert_eq!(e.next_step(now, Timestamp::UNIX_EPOCH), Step::Wait);
    e.observe(None, now);
    assert_eq!(e.role(now), Role::Standby);
    let spec = written_spec(e.next_step(now, Timestamp::UNIX_EPOCH));
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_duration_seconds, Some(10));
    assert_eq!(spec.lease_transitions, Some(0));

    let released = LeaseSpec {
        holder_identity: None,
        lease_transitions: Some(3),
        renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
        ..LeaseSpec::default()
    };
    e.observe(Some(&released), now);
    let spec = written_spec(e.next_step(now, Timestamp::UNIX_EPOCH));
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(4));
}

#[test]
fn a_held_lease_is_taken_only_after_it_did_not_change_for_the_lease_duration() {
    let start = Instant::now();
    let mut e = Elector::new("b", timing());
    e.observe(Some(&held_by("a", 1)), start);
    assert_eq!(
        e.next_step(start + Duration::from_secs(9), Timestamp::UNIX_EPOCH),
        Step::Wait
    );
    // A renewal (a changed record) restarts the wait, whatever its timestamps say.
    let renewed = LeaseSpec {
        renew_time: Some(MicroTime(
            Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(9),
        )),
        ..held_by("a", 1)
    };
    e.observe(Some(&renewed), start + Duration::from_secs(9));
    assert_eq!(
        e.next_step(start + Duration::from_secs(18), Timestamp::UNIX_EPOCH),
        Step::Wait
    );
    // Reading the same record again does not.
    e.observe(Some(&renewed), start + Duration::from_secs(18));
    let spec = written_spec(e.next_step(start + Duration::from_secs(19), Timestamp::UNIX_EPOCH));
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(2));
    // The holder's longer duration counts.
    let mut e = Elector::new("b", timing());
    let long = LeaseSpec {
        lease_duration_seconds: Some(60),
        ..held_by("a", 1)
    };
    e.observe(Some(&long), start);
    assert_eq!(
        e.next_step(start + Duration::from_secs(30), Timestamp::UNIX_EPOCH),
        Step::Wait
    );
    assert!(matches!(
        e.next_step(start + Duration::from_secs(60), Timestamp::UNIX_EPOCH),
        Step::Write(_)
    ));
}

#[test]
fn a_leader_leads_until_the_deadline_after_its_last_renewal_started() {
    let start = Instant::now();
    let mut e = Elector::new("a", timing());
    e.observe(None, start);
    let spec = written_spec(e.next_step(start, Timestamp::UNIX_EPOCH));
    // The write took 3 s: slow, not lost. The term counts from when it was sent.
    e.written(&spec, start, start + Duration::from_secs(3));
    assert_eq!(e.role(start + Duration::from_secs(3)), Role::Leader);
    assert_eq!(e.leading_until(), Some(start + Duration::from_secs(7)));
    assert_eq!(e.role(start + Duration::from_millis(6999)), Role::Leader);
    assert_eq!(e.role(start + Duration::from_secs(7)), Role::Standby);
    // Its own record again: a renewal keeps acquireTime and the transition count.
    let renewal = written_spec(e.next_step(start + Duration::from_secs(1), Timestamp::now()));
    assert_eq!(renewal.acquire_time, spec.acquire_time);
    assert_eq!(renewal.lease_transitions, spec.lease_transitions);
    assert_eq!(renewal.holder_identity.as_deref(), Some("a"));
}

#[test]
fn seeing_another_holder_ends_the_term_at_once() {
    let start = Instant::now();
    let mut e = Elector::new("a", timing());
    e.observe(None, start);
    let spec = written_spec(e.next_step(start, Timestamp::UNIX_EPOCH));
    e.written(&spec, start, start);
    e.observe(
        Some(&held_by("intruder", 5)),
        start + Duration::from_secs(1),
    );
    assert_eq!(e.role(start + Duration::from_secs(1)), Role::Standby);
    assert_eq!(
        e.release(Timestamp::UNIX_EPOCH),
        None,
        "never release someone else's lease"
    );
    e.observe(None, start + Duration::from_secs(2));
    assert_eq!(e.leading_until(), None);
}

#[test]
fn release_hands_over_only_our_own_record() {
    let start = Instant::now();
    let mut e = Elector::new("a", timing());
    e.observe(Some(&held_by("a", 2)), start);
    let spec = written_spec(e.next_step(start, Timestamp::UNIX_EPOCH));
    e.written(&spec, start, start);
    let release = e.release(Timestamp::UNIX_EPOCH).expect("ours to release");
    assert_eq!(release.holder_identity, None);
    assert_eq!(release.lease_transitions, Some(2));
    assert!(release.renew_time.is_some());
    e.released();
    assert_eq!(e.role(start), Role::Standby);
}

// --- replicas racing through a simulated API server -------------------------------------------

/// Milliseconds since the start of the simulation.
type Ms = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Replica starts an attempt (a read, maybe a write).
    Attempt(usize),
    /// The server handles a replica's read (attempt number).
    ServerRead(usize, u64),
    /// The read's answer reaches the replica.
    ReadAnswer(usize, u64),
    ServerWrite(usize, u64),
    WriteAnswer(usize, u64),
    /// The attempt's timeout fires.
    Timeout(usize, u64),
}

struct Server {
    spec: Option<LeaseSpec>,
    version: u64,
}

struct Replica {
    elector: Elector,
    /// Number of the attempt in flight; answers of other attempts are dropped (timed out).
    attempt: u64,
    attempt_started: Ms,
    read: Option<(Option<LeaseSpec>, u64)>,
    pending_write: Option<(LeaseSpec, u64, Ms)>,
    write_result: Option<Result<(LeaseSpec, u64), ()>>,
    /// The server's version after our last write, if that write succeeded and nothing failed
    /// since: the leader then renews without reading first, as `ops::leader` does.
    fresh_write: Option<u64>,
    /// Leader intervals [start, end) on the common clock.
    terms: Vec<(Ms, Ms)>,
    led: bool,
}

/// Latencies (ms) for requests and answers, consumed in turn.
struct Latencies {
    values: Vec<Ms>,
    next: usize,
}

impl Latencies {
    fn next(&mut self) -> Ms {
        let v = self.values[self.next % self.values.len()];
        self.next += 1;
        v
    }
}

/// Runs `replicas` electors for `horizon` ms; returns each one's leader terms.
fn simulate(
    replicas: usize,
    horizon: Ms,
    latencies: Vec<Ms>,
    starts: Vec<Ms>,
) -> Vec<Vec<(Ms, Ms)>> {
    let base = Instant::now();
    let at = |ms: Ms| base + Duration::from_millis(ms);
    let wall = |ms: Ms| Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_millis(ms as i64);
    let timing = timing();
    let mut latencies = Latencies {
        values: latencies,
        next: 0,
    };
    let mut server = Server {
        spec: None,
        version: 0,
    };
    let mut nodes: Vec<Replica> = (0..replicas)
        .map(|i| Replica {
            elector: Elector::new(format!("r{i}"), timing),
            attempt: 0,
            attempt_started: 0,
            read: None,
            pending_write: None,
            write_result: None,
            fresh_write: None,
            terms: Vec::new(),
            led: false,
        })
        .collect();
    let mut queue: BinaryHeap<std::cmp::Reverse<(Ms, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |queue: &mut BinaryHeap<_>, time: Ms, event: Event| {
        seq += 1;
        queue.push(std::cmp::Reverse((time, seq, event)));
    };
    for (i, start) in starts.iter().enumerate().take(replicas) {
        push(&mut queue, *start, Event::Attempt(i));
    }
    let retry = timing.retry_period.as_millis() as Ms;
    let deadline = timing.renew_deadline.as_millis() as Ms;
    // Reads and writes the server handles, by (replica, attempt).
    let mut reads: BTreeMap<(usize, u64), (Option<LeaseSpec>, u64)> = BTreeMap::new();

    while let Some(std::cmp::Reverse((now, _, event))) = queue.pop() {
        if now > horizon {
            break;
        }
        // Terms end when the deadline passes, between events too.
        close_terms(&mut nodes, base, now);
        match event {
            Event::Attempt(i) => {
                let node = &mut nodes[i];
                node.attempt += 1;
                node.attempt_started = now;
                let limit = match node.elector.leading_until() {
                    Some(until) if until > at(now) => (until - base).as_millis() as Ms,
                    _ => now + deadline,
                };
                push(&mut queue, limit, Event::Timeout(i, node.attempt));
                match node.fresh_write.take() {
                    Some(version) if node.elector.role(at(now)) == Role::Leader => {
                        let Step::Write(spec) = node.elector.next_step(at(now), wall(now)) else {
                            unreachable!("a leader renews");
                        };
                        node.pending_write = Some((spec, version, now));
                        push(
                            &mut queue,
                            now + latencies.next(),
                            Event::ServerWrite(i, node.attempt),
                        );
                    }
                    _ => push(
                        &mut queue,
                        now + latencies.next(),
                        Event::ServerRead(i, node.attempt),
                    ),
                }
            }
            Event::ServerRead(i, n) => {
                reads.insert((i, n), (server.spec.clone(), server.version));
                push(&mut queue, now + latencies.next(), Event::ReadAnswer(i, n));
            }
            Event::ReadAnswer(i, n) => {
                let node = &mut nodes[i];
                if n != node.attempt {
                    continue;
                }
                let (spec, version) = reads[&(i, n)].clone();
                node.elector.observe(spec.as_ref(), at(now));
                node.read = Some((spec, version));
                match node.elector.next_step(at(now), wall(now)) {
                    Step::Write(spec) => {
                        node.pending_write = Some((spec, version, now));
                        push(&mut queue, now + latencies.next(), Event::ServerWrite(i, n));
                    }
                    Step::Wait => {
                        node.attempt += 1; // the timeout of this attempt is void
                        let next = (node.attempt_started + retry).max(now);
                        push(&mut queue, next, Event::Attempt(i));
                    }
                }
            }
            Event::ServerWrite(i, n) => {
                let node = &mut nodes[i];
                let Some((spec, version, _)) = node.pending_write.clone() else {
                    continue;
                };
                // The server applies it even if the replica stopped waiting for the answer.
                let result = if version == server.version {
                    server.spec = Some(spec.clone());
                    server.version += 1;
                    Ok((spec, server.version))
                } else {
                    Err(())
                };
                if n == node.attempt {
                    node.write_result = Some(result);
                    push(&mut queue, now + latencies.next(), Event::WriteAnswer(i, n));
                }
            }
            Event::WriteAnswer(i, n) => {
                let node = &mut nodes[i];
                if n != node.attempt {
                    continue;
                }
                let sent = node.pending_write.take().map_or(now, |(_, _, sent)| sent);
                if let Some(Ok((spec, version))) = node.write_result.take() {
                    node.elector.written(&spec, at(sent), at(now));
                    node.fresh_write = Some(version);
                }
                node.attempt += 1;
                let next = (node.attempt_started + retry).max(now);
                push(&mut queue, next, Event::Attempt(i));
            }
            Event::Timeout(i, n) => {
                let node = &mut nodes[i];
                if n != node.attempt {
                    continue;
                }
                node.pending_write = None;
                node.attempt += 1;
                push(&mut queue, now, Event::Attempt(i));
            }
        }
        close_terms(&mut nodes, base, now);
        for node in nodes.iter_mut() {
            if !node.led && node.elector.role(at(now)) == Role::Leader {
                node.terms.push((now, now));
                node.led = true;
            }
        }
    }
    for node in nodes.iter_mut() {
        if node.led {
            let end = node.elector.leading_until().map_or(horizon, |until| {
                ((until - base).as_millis() as Ms).min(horizon)
            });
            if let Some(term) = node.terms.last_mut() {
                term.1 = end;
            }
        }
    }
    nodes.into_iter().map(|n| n.terms).collect()
}

/// Ends the term of every replica that no longer leads at `now`: at its deadline if that passed,
/// else now (it saw another holder).
fn close_terms(nodes: &mut [Replica], base: Instant, now: Ms) {
    for node in nodes.iter_mut() {
        if node.led && node.elector.role(base + Duration::from_millis(now)) != Role::Leader {
            let end = node
                .elector
                .leading_until()
                .map_or(now, |until| ((until - base).as_millis() as Ms).min(now));
            if let Some(term) = node.terms.last_mut() {
                term.1 = end;
            }
            node.led = false;
        }
    }
}

fn overlaps(terms: &[Vec<(Ms, Ms)>]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, a) in terms.iter().enumerate() {
        for (j, b) in terms.iter().enumerate().skip(i + 1) {
            for &(a0, a1) in a {
                for &(b0, b1) in b {
                    if a0 < b1 && b0 < a1 {
                        found.push(format!("r{i} {a0}..{a1} and r{j} {b0}..{b1}"));
                    }
                }
            }
        }
    }
    found
}

/// Mostly fast answers, some slow, some stuck behind a paused API server for up to 20 s.
fn latency() -> impl Strategy<Value = Ms> {
    prop_oneof![
        6 => 0u64..200,
        3 => 200u64..3_000,
        2 => 3_000u64..20_000,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_two_leaders_whatever_the_latencies(
        replicas in 2usize..4,
        latencies in proptest::collection::vec(latency(), 1..200),
        starts in proptest::collection::vec(0u64..5_000, 4),
    ) {
        let terms = simulate(replicas, 120_000, latencies, starts);
        let overlaps = overlaps(&terms);
        prop_assert!(overlaps.is_empty(), "two leaders at once: {overlaps:?} (terms {terms:?})");
    }

    #[test]
    fn slow_answers_within_the_deadline_never_cost_the_lease(
        latencies in proptest::collection::vec(0u64..1_400, 1..200),
        starts in proptest::collection::vec(0u64..5_000, 4),
    ) {
        // A leader renews with one write (two legs of at most 1.4 s) and the next renewal starts
        // when that one ends: the write after next is known at most 4 × 1.4 = 5.6 s after the
        // last one was sent, within the 7 s deadline, so the first leader leads for the whole run.
        let terms = simulate(3, 120_000, latencies, starts);
        let leaders: Vec<usize> = (0..terms.len()).filter(|i| !terms[*i].is_empty()).collect();
        prop_assert_eq!(leaders.len(), 1, "terms: {:?}", terms);
        let only = &terms[leaders[0]];
        prop_assert_eq!(only.len(), 1, "the leader flapped: {:?}", only);
        prop_assert_eq!(only[0].1, 120_000, "the leader stopped: {:?}", only);
    }
}

#[test]
fn a_paused_api_server_hands_the_lease_over_only_after_the_old_leader_stopped() {
    // All answers fast except a 15 s stall (a paused API server) in the middle of the leader's run.
    let mut latencies = vec![20; 40];
    latencies.extend([15_000; 8]);
    latencies.extend(vec![20; 400]);
    let terms = simulate(2, 90_000, latencies, vec![0, 500]);
    assert!(overlaps(&terms).is_empty(), "{terms:?}");
    let all: Vec<(Ms, Ms)> = terms.iter().flatten().copied().collect();
    assert!(
        all.len() >= 2,
        "the lease changed hands or was re-acquired after the stall: {terms:?}"
    );
}
