//! What the archive of finished work keeps of a task, decided without a database: the history
//! entries and attempts it still lacks, and whether a task submitted with an idempotency key
//! duplicates one that already ran. The archive's writer (the PostgreSQL side is still to be
//! built) asks the database what it holds for a task, feeds the answer here and inserts what comes
//! back. Every row has a key of its own (task uid and sequence, task uid and attempt), and inserts
//! are idempotent on it, so a replay after a crash or a lost reply inserts nothing twice.
//!
//! The status keeps the last `core::task::HISTORY_CAP` transitions and counts those it dropped
//! (`status.historyDropped`): entry `i` of `status.history` is transition `historyDropped + i` of
//! the task's whole history, a sequence that never changes once given.

use std::ops::Range;

use jiff::{SignedDuration, Timestamp};

use crate::api::{AttemptRecord, AxTaskStatus, HistoryEntry};

/// The history entries of a task the archive lacks.
#[derive(Debug, PartialEq)]
pub struct Transitions<'a> {
    /// With their sequence, oldest first.
    pub rows: Vec<(i64, &'a HistoryEntry)>,
    /// Sequences the status dropped (its cap) before the archive had them: recorded as a gap,
    /// never guessed.
    pub lost: Option<Range<i64>>,
}

/// The history entries of `status` the archive lacks when it holds every sequence up to
/// `archived` (`None`: none yet). Rows of one task go in one transaction in order, so what the
/// archive holds of a task is always such a prefix.
pub fn transitions_to_archive(status: &AxTaskStatus, archived: Option<i64>) -> Transitions<'_> {
    let first = status.history_dropped.max(0);
    let next = archived.map_or(0, |held| held.saturating_add(1)).max(0);
    let lost = (next < first).then_some(next..first);
    let skip = usize::try_from(next.saturating_sub(first).max(0)).unwrap_or(usize::MAX);
    let rows = status
        .history
        .iter()
        .enumerate()
        .skip(skip)
        .map(|(i, entry)| (first.saturating_add(i as i64), entry))
        .collect();
    Transitions { rows, lost }
}

/// The ended attempts of `status` the archive lacks when it holds every attempt up to `archived`
/// (`None`: none yet). An attempt is archived once it has ended: until then its record still
/// changes. Attempts end in order (one live worker per task), so what the archive holds is again a
/// prefix.
pub fn attempts_to_archive(status: &AxTaskStatus, archived: Option<i32>) -> Vec<&AttemptRecord> {
    let held = archived.unwrap_or(0);
    status
        .attempts
        .iter()
        .filter(|a| a.attempt > held && a.outcome.is_some())
        .collect()
}

/// A task submitted with an idempotency key, as the live cache or the archive knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    pub name: String,
    pub uid: String,
    pub created: Timestamp,
}

impl Submission {
    /// Submissions are ordered by creation, then uid: the same order on every replica and after
    /// every restart, whatever order they are looked at in.
    fn order(&self) -> (Timestamp, &str) {
        (self.created, self.uid.as_str())
    }
}

/// Whether a submission runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Run,
    /// Another submission of its key ran within the window before it: this one never runs.
    DuplicateOf(Submission),
}

/// The verdict on `this` among `others`, every submission with its key in its namespace (it may
/// be among them). Going through them in order, one runs unless another ran at most `window`
/// before it; `this` duplicates the one that ran. A submission's verdict depends only on those
/// before it, so it never changes once given, and two replicas, or a restart, agree.
pub fn verdict(this: &Submission, others: &[Submission], window: SignedDuration) -> Verdict {
    let mut before: Vec<&Submission> = others.iter().filter(|s| s.order() < this.order()).collect();
    before.sort_by(|a, b| a.order().cmp(&b.order()));
    before.dedup_by(|a, b| a.uid == b.uid);
    let within =
        |ran: &Submission, later: &Submission| later.created.duration_since(ran.created) <= window;
    let mut last_run: Option<&Submission> = None;
    for submission in before {
        if !last_run.is_some_and(|ran| within(ran, submission)) {
            last_run = Some(submission);
        }
    }
    match last_run {
        Some(ran) if within(ran, this) => Verdict::DuplicateOf(ran.clone()),
        _ => Verdict::Run,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::api::TaskPhase;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("a valid time")
    }

    fn entry(n: i64) -> HistoryEntry {
        HistoryEntry {
            time: at(n),
            from: None,
            to: TaskPhase::Pending,
            attempt: 0,
            reason: format!("Step{n}"),
            message: String::new(),
            actor: "user".into(),
        }
    }

    /// The status after `total` transitions, keeping the last `cap`.
    fn status_after(total: i64, cap: i64) -> AxTaskStatus {
        let dropped = (total - cap).max(0);
        AxTaskStatus {
            history: (dropped..total).map(entry).collect(),
            history_dropped: dropped,
            ..AxTaskStatus::default()
        }
    }

    #[test]
    fn the_archive_gets_what_it_lacks_and_a_gap_the_cap_made_is_named() {
        let s = status_after(5, 100);
        let all = transitions_to_archive(&s, None);
        assert_eq!(all.lost, None);
        let sequences: Vec<i64> = all.rows.iter().map(|(n, _)| *n).collect();
        assert_eq!(sequences, [0, 1, 2, 3, 4]);
        assert_eq!(all.rows[3].1.reason, "Step3");
        let rest = transitions_to_archive(&s, Some(2));
        assert_eq!(
            rest.rows.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [3, 4]
        );
        assert!(transitions_to_archive(&s, Some(4)).rows.is_empty());
        assert!(transitions_to_archive(&s, Some(9)).rows.is_empty());
        // 250 transitions, 100 kept, the archive at 120: 120..150 were dropped before it had them.
        let s = status_after(250, 100);
        let behind = transitions_to_archive(&s, Some(119));
        assert_eq!(behind.lost, Some(120..150));
        assert_eq!(
            behind.rows.first().map(|(n, e)| (*n, e.reason.as_str())),
            Some((150, "Step150"))
        );
        assert_eq!(behind.rows.len(), 100);
    }

    #[test]
    fn an_attempt_is_archived_once_it_has_ended() {
        let attempt = |n: i32, outcome: Option<TaskPhase>| AttemptRecord {
            attempt: n,
            pod: format!("job-{n}"),
            node: None,
            scheduled_at: at(i64::from(n)),
            started_at: None,
            finished_at: None,
            outcome,
            exit_code: None,
            failure_kind: None,
            reason: None,
        };
        let s = AxTaskStatus {
            attempts: vec![
                attempt(1, Some(TaskPhase::Failed)),
                attempt(2, Some(TaskPhase::TimedOut)),
                attempt(3, None),
            ],
            ..AxTaskStatus::default()
        };
        let numbers = |held| {
            attempts_to_archive(&s, held)
                .iter()
                .map(|a| a.attempt)
                .collect::<Vec<_>>()
        };
        assert_eq!(numbers(None), [1, 2]);
        assert_eq!(numbers(Some(1)), [2]);
        assert!(numbers(Some(2)).is_empty());
    }

    fn submission(n: usize, created: i64) -> Submission {
        Submission {
            name: format!("order-{n}"),
            uid: format!("uid-{n:03}"),
            created: at(created),
        }
    }

    #[test]
    fn a_key_runs_once_per_window_and_a_duplicate_names_the_one_that_ran() {
        let day = SignedDuration::from_hours(24);
        let hour = 3600;
        let all = [
            submission(0, 0),
            submission(1, 20 * hour),
            submission(2, 30 * hour),
            submission(3, 24 * hour),
        ];
        assert_eq!(verdict(&all[0], &all, day), Verdict::Run);
        assert_eq!(
            verdict(&all[1], &all, day),
            Verdict::DuplicateOf(all[0].clone())
        );
        // Exactly a window after the run: still within it.
        assert_eq!(
            verdict(&all[3], &all, day),
            Verdict::DuplicateOf(all[0].clone())
        );
        // 30 h after the run: the duplicates in between never ran, so this one does.
        assert_eq!(verdict(&all[2], &all, day), Verdict::Run);
        // Created in the same second: the smaller uid runs.
        let twins = [submission(5, 0), submission(4, 0)];
        assert_eq!(verdict(&twins[1], &twins, day), Verdict::Run);
        assert_eq!(
            verdict(&twins[0], &twins, day),
            Verdict::DuplicateOf(twins[1].clone())
        );
    }

    proptest! {
        /// Whatever prefix of its history a task has reached, and whatever the archive holds of
        /// it, inserting what `transitions_to_archive` gives (idempotently, on the sequence)
        /// makes the archive hold each transition once, at its own sequence, with nothing
        /// missing but the gaps it names. Replays of any prefix insert nothing new.
        #[test]
        fn replaying_any_prefix_inserts_each_transition_exactly_once(
            steps in prop::collection::vec(1i64..40, 1..30),
            cap in 1i64..60,
            lose_reply in prop::collection::vec(any::<bool>(), 30),
        ) {
            let mut archive: BTreeMap<i64, String> = BTreeMap::new();
            let mut lost: Vec<Range<i64>> = Vec::new();
            let mut inserts = 0usize;
            let mut total = 0;
            for (i, step) in steps.iter().enumerate() {
                total += step;
                let s = status_after(total, cap);
                // What the archive holds is a prefix (or gaps named as lost): its highest key.
                let held = archive.keys().next_back().copied()
                    .max(lost.last().map(|r| r.end - 1));
                let todo = transitions_to_archive(&s, held);
                for (n, e) in &todo.rows {
                    if archive.insert(*n, e.reason.clone()).is_none() {
                        inserts += 1;
                    }
                }
                lost.extend(todo.lost.clone());
                // A lost reply: the writer does it again from what it thought the archive held.
                if lose_reply[i] {
                    let again = transitions_to_archive(&s, held);
                    prop_assert_eq!(&again, &todo);
                    for (n, e) in &again.rows {
                        prop_assert_eq!(archive.get(n), Some(&e.reason));
                    }
                }
                // A replay from what the archive now holds inserts nothing.
                let after = archive.keys().next_back().copied()
                    .max(lost.last().map(|r| r.end - 1));
                prop_assert!(transitions_to_archive(&s, after).rows.is_empty());
            }
            prop_assert_eq!(inserts, archive.len());
            for n in 0..total {
                let in_gap = lost.iter().any(|r| r.contains(&n));
                prop_assert!(archive.contains_key(&n) != in_gap, "transition {} once", n);
                if let Some(reason) = archive.get(&n) {
                    prop_assert_eq!(reason, &format!("Step{n}"));
                }
            }
            // Archived after every step, a cap at least as large as the largest step loses
            // nothing.
            if steps.iter().all(|s| *s <= cap) {
                prop_assert!(lost.is_empty());
            }
        }

        /// Verdicts do not depend on the order submissions are looked at in: each one is what
        /// going through all of them in order gives, no two runs are within a window of each
        /// other, and every duplicate names a run at most a window before it.
        #[test]
        fn verdicts_are_the_same_in_any_order_and_one_runs_per_window(
            times in prop::collection::vec(0i64..200, 1..25),
            window in 0i64..60,
            order in prop::collection::vec(any::<prop::sample::Index>(), 25),
        ) {
            let window = SignedDuration::from_secs(window);
            let all: Vec<Submission> =
                times.iter().enumerate().map(|(n, t)| submission(n, *t)).collect();
            let mut shuffled = all.clone();
            for (i, index) in order.iter().enumerate().take(shuffled.len()) {
                let j = index.index(shuffled.len());
                shuffled.swap(i, j);
            }
            let verdicts: Vec<Verdict> = all.iter().map(|s| verdict(s, &all, window)).collect();
            for (s, v) in all.iter().zip(&verdicts) {
                prop_assert_eq!(&verdict(s, &shuffled, window), v);
                if let Verdict::DuplicateOf(ran) = v {
                    prop_assert_eq!(verdict(ran, &all, window), Verdict::Run);
                    prop_assert!(ran.order() < s.order());
                    prop_assert!(s.created.duration_since(ran.created) <= window);
                }
            }
            let mut runs: Vec<&Submission> = all
                .iter()
                .zip(&verdicts)
                .filter(|(_, v)| **v == Verdict::Run)
                .map(|(s, _)| s)
                .collect();
            runs.sort_by(|a, b| a.order().cmp(&b.order()));
            prop_assert!(!runs.is_empty());
            for pair in runs.windows(2) {
                prop_assert!(pair[1].created.duration_since(pair[0].created) > window);
            }
        }
    }
}
