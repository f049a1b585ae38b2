//! What an AxCron does now, as a function of its spec, its status, its children and the time:
//! which scheduled times fire (and as which child), which are skipped and why, which children
//! `Replace` cancels, when to look again; and which finished children the history limits delete.
//!
//! A scheduled time S is *due* once `S + jitter <= now`. The latest due time is *regular* when it
//! is acted on within its tolerance, `min(60 s, half the time to the next scheduled time)`, after
//! its firing time; every other due time is *missed* (the operator was down, the cron suspended),
//! and `misfirePolicy` decides about it. `startingDeadlineSeconds` bounds both: a time whose
//! firing would start later than that after its firing time is skipped. A time that already has
//! its child (named after the time, so found again after any restart) is never fired again.

use std::collections::{HashSet, VecDeque};

use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

use super::Schedule;
use crate::api::{ConcurrencyPolicy, MisfirePolicy};

/// The longest tolerance of a regular firing: a cron acted on later than this after its time (a
/// daily job during a long operator failover) is a misfire.
pub const MAX_TOLERANCE: SignedDuration = SignedDuration::from_secs(60);

/// The policy fields of the spec, validated.
#[derive(Debug, Clone)]
pub struct Policy {
    pub misfire: MisfirePolicy,
    /// For `RunAll`: at most this many missed times run.
    pub max_catch_up: u32,
    pub starting_deadline: Option<SignedDuration>,
    pub concurrency: ConcurrencyPolicy,
    /// This cron's firing offset after each scheduled time ([`jitter_offset`]).
    pub jitter: SignedDuration,
    pub suspend: bool,
}

/// A child of the cron as the caches show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    pub name: String,
    pub scheduled: Timestamp,
    /// Not finished (an AxTask not Succeeded/Dead/Canceled, an AxDag not Succeeded/Failed/Canceled).
    pub active: bool,
}

/// Everything a decision depends on.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    pub cron: &'a str,
    pub schedule: &'a Schedule,
    pub policy: &'a Policy,
    /// Every scheduled time up to this one was handled: `status.lastHandledTime`, else the
    /// cron's creation time.
    pub handled_until: Timestamp,
    pub now: Timestamp,
    pub children: &'a [Child],
}

/// A child to create now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    pub scheduled: Timestamp,
    pub name: String,
    /// For a missed time (not the regular one).
    pub catch_up: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// `misfirePolicy: Skip`: the time passed while nothing could fire it.
    Missed,
    /// `misfirePolicy: RunOnce`: the run for this later time stands for it.
    CoveredBy(Timestamp),
    /// `misfirePolicy: RunAll`: older than the `maxCatchUp` latest missed times.
    TooManyMissed,
    /// Its firing would start more than `startingDeadlineSeconds` late.
    DeadlineExceeded,
    /// `concurrencyPolicy: Forbid`: this child was still active.
    ConcurrentChild(String),
    /// `concurrencyPolicy: Replace`: the run for this later time, due at the same moment, replaces it.
    Superseded(Timestamp),
}

/// Consecutive scheduled times skipped for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub first: Timestamp,
    pub last: Timestamp,
    pub count: u64,
    /// There may be more than `count` (a long outage of a frequent schedule is not enumerated).
    pub at_least: bool,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Children to create, oldest scheduled time first.
    pub create: Vec<Firing>,
    pub skipped: Vec<Skip>,
    /// Active children to cancel (`concurrencyPolicy: Replace`).
    pub cancel: Vec<String>,
    /// The new `status.lastHandledTime`; `None` leaves it as it is.
    pub handled_until: Option<Timestamp>,
    /// The next scheduled time; `None` while suspended.
    pub next_schedule_time: Option<Timestamp>,
    /// When to decide again: the firing time of `next_schedule_time`.
    pub wake_at: Option<Timestamp>,
}

/// The name of the child for scheduled time `scheduled`: the same on every operator, every time.
pub fn child_name(cron: &str, scheduled: Timestamp) -> String {
    format!("{cron}-{}", scheduled.as_second())
}

/// The firing offset of a cron after each of its scheduled times: in `[0, jitter_seconds)`, whole
/// seconds, the same for every firing of the cron and on every operator (derived from its uid).
pub fn jitter_offset(uid: &str, jitter_seconds: i64) -> SignedDuration {
    if jitter_seconds <= 0 {
        return SignedDuration::ZERO;
    }
    let digest = Sha256::digest(uid.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let offset = u64::from_be_bytes(first) % jitter_seconds as u64;
    SignedDuration::from_secs(offset as i64)
}

/// How late the regular firing of `scheduled` may still be acted on.
pub fn tolerance(schedule: &Schedule, scheduled: Timestamp) -> SignedDuration {
    match schedule.next_after(scheduled) {
        Some(next) => (next.duration_since(scheduled) / 2).min(MAX_TOLERANCE),
        None => MAX_TOLERANCE,
    }
}

/// The due scheduled times after `after` up to `until`: the latest `keep`, ascending, and the
/// earlier ones counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub times: Vec<Timestamp>,
    /// How many earlier times were counted, and the first and last of them.
    pub earlier: u64,
    pub earlier_range: Option<(Timestamp, Timestamp)>,
    /// There are more earlier times than counted (before the window looked at).
    pub at_least: bool,
}

/// The scheduled times in `(after, until]`, the latest `keep` of them. Looks back from `until`
/// through windows that double, so a long outage of a frequent schedule costs about as much as
/// the times kept.
pub fn due_times(schedule: &Schedule, after: Timestamp, until: Timestamp, keep: usize) -> Due {
    let keep = keep.max(1);
    let mut window = SignedDuration::from_mins(1);
    loop {
        let from = until
            .checked_sub(window)
            .ok()
            .filter(|from| *from > after)
            .unwrap_or(after);
        let mut kept: VecDeque<Timestamp> = VecDeque::with_capacity(keep.min(1024) + 1);
        let mut count = 0u64;
        let mut earlier_range: Option<(Timestamp, Timestamp)> = None;
        let mut cursor = from;
        while let Some(time) = schedule.next_after(cursor) {
            if time > until {
                break;
            }
            count += 1;
            kept.push_back(time);
            if kept.len() > keep
                && let Some(dropped) = kept.pop_front()
            {
                let first = earlier_range.map_or(dropped, |(first, _)| first);
                earlier_range = Some((first, dropped));
            }
            cursor = time;
        }
        // Stop once a time beyond those kept was seen (so the earlier ones are reported), or the
        // window reaches `after`.
        if from == after || count > keep as u64 {
            let at_least = from > after;
            if at_least && let Some((_, last)) = earlier_range {
                // The first of them is the first time after `after`, wherever the window began.
                let first = schedule.next_after(after).unwrap_or(last);
                earlier_range = Some((first, last));
            }
            return Due {
                earlier: count - kept.len() as u64,
                earlier_range,
                times: kept.into(),
                at_least,
            };
        }
        window = window.checked_mul(2).unwrap_or(SignedDuration::MAX);
    }
}

/// What happens to one due time before the concurrency policy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    /// Its child exists already.
    Exists,
    Fire {
        catch_up: bool,
    },
    Skip(SkipReason),
}

pub fn decide(input: &Input) -> Decision {
    let policy = input.policy;
    if policy.suspend {
        return Decision::default();
    }
    let until = input.now.checked_sub(policy.jitter).unwrap_or(input.now);
    let next = input.schedule.next_after(until.max(input.handled_until));
    let mut decision = Decision {
        next_schedule_time: next,
        wake_at: next.and_then(|n| n.checked_add(policy.jitter).ok()),
        ..Decision::default()
    };
    let keep = match policy.misfire {
        MisfirePolicy::Skip | MisfirePolicy::RunOnce => 2,
        MisfirePolicy::RunAll => policy.max_catch_up as usize + 1,
    };
    let due = due_times(input.schedule, input.handled_until, until, keep);
    let Some(&latest) = due.times.last() else {
        return decision;
    };
    decision.handled_until = Some(latest);

    let existing: HashSet<Timestamp> = input.children.iter().map(|c| c.scheduled).collect();
    let lateness = |s: Timestamp| {
        input
            .now
            .duration_since(s.checked_add(policy.jitter).unwrap_or(s))
    };
    let within_deadline = |s: Timestamp| policy.starting_deadline.is_none_or(|d| lateness(s) <= d);
    let regular = lateness(latest) <= tolerance(input.schedule, latest);

    let mut plans: Vec<(Timestamp, Plan)> = Vec::with_capacity(due.times.len());
    let missed: &[Timestamp] = if regular {
        &due.times[..due.times.len() - 1]
    } else {
        &due.times
    };
    let regular_plan = regular.then(|| {
        if existing.contains(&latest) {
            Plan::Exists
        } else if within_deadline(latest) {
            Plan::Fire { catch_up: false }
        } else {
            Plan::Skip(SkipReason::DeadlineExceeded)
        }
    });
    let regular_runs = matches!(regular_plan, Some(Plan::Exists | Plan::Fire { .. }));

    // The missed times the policy runs, latest first: for RunOnce the latest one (unless the
    // regular run stands for them), for RunAll the latest `maxCatchUp`. Existing children count.
    let runnable: Vec<Timestamp> = missed
        .iter()
        .rev()
        .copied()
        .filter(|s| existing.contains(s) || within_deadline(*s))
        .collect();
    let to_run: HashSet<Timestamp> = match policy.misfire {
        MisfirePolicy::Skip => HashSet::new(),
        MisfirePolicy::RunOnce if regular_runs => HashSet::new(),
        MisfirePolicy::RunOnce => runnable.iter().take(1).copied().collect(),
        MisfirePolicy::RunAll => runnable
            .iter()
            .take(policy.max_catch_up as usize)
            .copied()
            .collect(),
    };
    let covering = if regular_runs {
        Some(latest)
    } else {
        runnable.first().copied()
    };
    let policy_skip = || match (policy.misfire, covering) {
        (MisfirePolicy::Skip, _) | (MisfirePolicy::RunOnce, None) => SkipReason::Missed,
        (MisfirePolicy::RunOnce, Some(by)) => SkipReason::CoveredBy(by),
        (MisfirePolicy::RunAll, _) => SkipReason::TooManyMissed,
    };
    for &s in missed {
        let plan = if existing.contains(&s) {
            Plan::Exists
        } else if !within_deadline(s) {
            Plan::Skip(SkipReason::DeadlineExceeded)
        } else if to_run.contains(&s) {
            Plan::Fire { catch_up: true }
        } else {
            Plan::Skip(policy_skip())
        };
        plans.push((s, plan));
    }
    if let Some(plan) = regular_plan {
        plans.push((latest, plan));
    }

    // Times before the ones enumerated: all missed, and older than every enumerated one.
    let mut skips: Vec<Skip> = Vec::new();
    if let Some((first, last)) = due.earlier_range {
        // Those with a child were handled (a status write lost after creating it).
        let with_child = existing
            .iter()
            .filter(|s| (first..=last).contains(*s))
            .count() as u64;
        let count = due.earlier.saturating_sub(with_child);
        let reason = if !within_deadline(last) {
            SkipReason::DeadlineExceeded
        } else {
            policy_skip()
        };
        if count > 0 || due.at_least {
            skips.push(Skip {
                first,
                last,
                count,
                at_least: due.at_least,
                reason,
            });
        }
    }

    // The concurrency policy, oldest first.
    let fires: Vec<(Timestamp, bool)> = plans
        .iter()
        .filter_map(|(s, plan)| match plan {
            Plan::Fire { catch_up } => Some((*s, *catch_up)),
            _ => None,
        })
        .collect();
    let active: Vec<&str> = input
        .children
        .iter()
        .filter(|c| c.active)
        .map(|c| c.name.as_str())
        .collect();
    let mut fire_plans: Vec<(Timestamp, Result<bool, SkipReason>)> = Vec::new();
    match policy.concurrency {
        ConcurrencyPolicy::Allow => {
            fire_plans.extend(fires.iter().map(|(s, c)| (*s, Ok(*c))));
        }
        ConcurrencyPolicy::Forbid => {
            let mut blocker: Option<String> = active.first().map(|name| (*name).to_owned());
            for (s, catch_up) in &fires {
                match &blocker {
                    Some(name) => {
                        fire_plans.push((*s, Err(SkipReason::ConcurrentChild(name.clone()))))
                    }
                    None => {
                        fire_plans.push((*s, Ok(*catch_up)));
                        blocker = Some(child_name(input.cron, *s));
                    }
                }
            }
        }
        ConcurrencyPolicy::Replace => {
            if let Some((last, _)) = fires.last() {
                for (s, catch_up) in &fires {
                    let outcome = if s == last {
                        Ok(*catch_up)
                    } else {
                        Err(SkipReason::Superseded(*last))
                    };
                    fire_plans.push((*s, outcome));
                }
                decision.cancel = active.iter().map(|name| (*name).to_owned()).collect();
            }
        }
    }

    let mut fire_outcomes = fire_plans.into_iter();
    for (s, plan) in plans {
        match plan {
            Plan::Exists => {}
            Plan::Skip(reason) => push_skip(&mut skips, s, reason),
            Plan::Fire { .. } => match fire_outcomes.next() {
                Some((_, Ok(catch_up))) => decision.create.push(Firing {
                    scheduled: s,
                    name: child_name(input.cron, s),
                    catch_up,
                }),
                Some((_, Err(reason))) => push_skip(&mut skips, s, reason),
                None => {}
            },
        }
    }
    decision.skipped = skips;
    decision
}

/// The firings recorded earlier (`status.pendingChildren`, written before their children were
/// created) whose children are not `present`: never created, because the process stopped between
/// the write and the create or the create failed. They count as active children of their times.
pub fn recorded_missing(recorded: &[Firing], present: impl Fn(&str) -> bool) -> Vec<&Firing> {
    recorded.iter().filter(|f| !present(&f.name)).collect()
}

/// The children to create once the status that records them is written (it records exactly
/// these as pending): the [`recorded_missing`] ones, then `decision`'s new firings, oldest first,
/// each once. A recorded one that `Replace` cancels now (`decision.cancel`) is dropped: its child
/// would be canceled at once, and the new firing stands for it.
pub fn to_create(
    recorded: &[Firing],
    present: impl Fn(&str) -> bool,
    decision: &Decision,
) -> Vec<Firing> {
    let mut create: Vec<Firing> = recorded_missing(recorded, &present)
        .into_iter()
        .filter(|f| !decision.cancel.contains(&f.name))
        .cloned()
        .collect();
    for firing in &decision.create {
        if !present(&firing.name) && create.iter().all(|f| f.name != firing.name) {
            create.push(firing.clone());
        }
    }
    create.sort_by(|a, b| a.scheduled.cmp(&b.scheduled).then(a.name.cmp(&b.name)));
    create
}

/// Adds a skipped time, merging it into the previous entry when the reason is the same.
fn push_skip(skips: &mut Vec<Skip>, scheduled: Timestamp, reason: SkipReason) {
    if let Some(last) = skips.last_mut()
        && last.reason == reason
        && last.last <= scheduled
    {
        last.last = scheduled;
        last.count += 1;
        return;
    }
    skips.push(Skip {
        first: scheduled,
        last: scheduled,
        count: 1,
        at_least: false,
        reason,
    });
}

/// A finished child, for the history limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub name: String,
    pub scheduled: Timestamp,
    pub succeeded: bool,
}

/// The finished children beyond the history limits: all but the newest `keep_succeeded` that
/// succeeded and the newest `keep_failed` that did not, newest by scheduled time.
pub fn history_to_delete(
    finished: &[Finished],
    keep_succeeded: usize,
    keep_failed: usize,
) -> Vec<String> {
    let mut sorted: Vec<&Finished> = finished.iter().collect();
    sorted.sort_by(|a, b| b.scheduled.cmp(&a.scheduled).then(b.name.cmp(&a.name)));
    let (mut succeeded, mut failed) = (0usize, 0usize);
    let mut delete = Vec::new();
    for child in sorted {
        let (seen, keep) = if child.succeeded {
            (&mut succeeded, keep_succeeded)
        } else {
            (&mut failed, keep_failed)
        };
        *seen += 1;
        if *seen > keep {
            delete.push(child.name.clone());
        }
    }
    delete
}
