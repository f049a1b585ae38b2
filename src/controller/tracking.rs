//! What this process knows that the caches may not show yet: its own status writes, the pods it
//! created and removed, callback outcomes, statuses put off.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::expected::{EXPECTATION_TTL, Expected, Sight};
use crate::api::AxTaskStatus;
use crate::core::queue::TaskKey;
use crate::core::task::{CallbackResult, ProgressLine};

/// How long a deletion this process asked for is not asked for again (a task held by a finalizer).
const DELETION_RESENT_AFTER: Duration = EXPECTATION_TTL;
/// What this process knows that the caches may not show yet.
#[derive(Debug)]
pub struct Tracking {
    state: Mutex<TrackingState>,
    /// Worker pods created and not yet seen in the cache, by task: (attempt, created at).
    pods: Expected<TaskKey, (i32, Timestamp)>,
    /// Ended pods removed (`core::task::Action::RemovePod`) that the cache may still show, by task
    /// and pod uid: a look in between would take one for a pod still to remove, and read the whole
    /// task and send the delete again.
    removed: Expected<TaskKey, ()>,
}

#[derive(Debug)]
struct TrackingState {
    /// The resourceVersion of each task's last status write, until the cache has caught up: a
    /// reconcile on an older copy would decide on stale state and lose its write to a conflict.
    written: HashMap<TaskKey, u64>,
    /// Callback outcomes waiting to be recorded by the task's reconcile.
    callbacks: HashMap<TaskKey, (CallbackResult, String)>,
    /// Tasks this process asked the API server to delete (their TTL passed), and when: a task held
    /// by a finalizer is not deleted again on every reconcile until it is gone.
    deletions: HashMap<TaskKey, Instant>,
    /// Statuses decided and put off (`core::task::Decision::write_by`), kept until written.
    unwritten: HashMap<TaskKey, Unwritten>,
    /// Put-off statuses whose write delay ran out, waiting their turn to be written.
    progress: ProgressLine<TaskKey>,
}

#[derive(Debug)]
struct Unwritten {
    /// The task it was decided for.
    uid: Option<String>,
    /// The status as written when it was decided: if the cache shows another, it no longer holds.
    written: AxTaskStatus,
    decided: AxTaskStatus,
    turn: Turn,
}

/// Where a status put off stands in the line of due progress writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    NotInLine,
    Waiting,
    /// Let through: the next reconcile writes it.
    Up,
}

impl Tracking {
    /// Nothing tracked yet; due progress writes go at `progress_writes_per_second`.
    pub fn new(progress_writes_per_second: u32) -> Self {
        let state = Mutex::new(TrackingState {
            written: HashMap::new(),
            callbacks: HashMap::new(),
            deletions: HashMap::new(),
            unwritten: HashMap::new(),
            progress: ProgressLine::new(progress_writes_per_second, Timestamp::now()),
        });
        Self {
            state,
            pods: Expected::default(),
            removed: Expected::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TrackingState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the cached copy (of `version`) is older than what this process wrote; forgets the
    /// write once the cache has it.
    pub fn is_stale(&self, key: &TaskKey, version: Option<u64>) -> bool {
        let mut state = self.lock();
        match (state.written.get(key), version) {
            (Some(written), Some(cached)) if cached < *written => true,
            (Some(_), _) => {
                state.written.remove(key);
                false
            }
            (None, _) => false,
        }
    }

    pub fn wrote(&self, key: &TaskKey, version: Option<u64>) {
        if let Some(version) = version {
            self.lock().written.insert(key.clone(), version);
        }
    }

    /// The task's pod `name` of `attempt` was created (its one pod in flight).
    pub fn expect_pod(&self, key: &TaskKey, name: &str, attempt: i32, created_at: Timestamp) {
        let now = Instant::now();
        self.pods
            .created_only(key, name, (attempt, created_at), now);
    }

    /// The pod created for `key` that the cache does not show yet, if any: its name, attempt and
    /// when it was created; `seen` says whether the cache has a pod of that attempt (the
    /// expectation then ends).
    pub fn expected_pod(
        &self,
        key: &TaskKey,
        seen: impl Fn(i32) -> bool,
    ) -> Option<(String, i32, Timestamp)> {
        let sight = |_: &str, &(attempt, _): &(i32, Timestamp)| match seen(attempt) {
            true => Sight::Seen,
            false => Sight::NotSeen,
        };
        let pending = self.pods.pending(key, Instant::now(), sight);
        let (name, (attempt, created_at)) = pending.into_iter().next()?;
        Some((name, attempt, created_at))
    }

    /// The ended pod `uid` of `key` was removed.
    pub fn pod_removed(&self, key: &TaskKey, uid: &str) {
        self.removed.created(key, uid, (), Instant::now());
    }

    /// Which of the pods of `key` the cache still shows (`shown` says, by uid) this process
    /// removed a moment ago. A removal ends once the cache no longer shows the pod, or after a
    /// minute: a pod still there then is looked at again.
    pub fn removed_pods(&self, key: &TaskKey, shown: impl Fn(&str) -> bool) -> Vec<String> {
        let sight = |uid: &str, _: &()| match shown(uid) {
            true => Sight::NotSeen,
            false => Sight::Seen,
        };
        let removed = self.removed.pending(key, Instant::now(), sight);
        removed.into_iter().map(|(uid, ())| uid).collect()
    }

    pub fn callback_done(&self, key: &TaskKey, result: CallbackResult, message: String) {
        self.lock().callbacks.insert(key.clone(), (result, message));
    }

    pub fn take_callback(&self, key: &TaskKey) -> Option<(CallbackResult, String)> {
        self.lock().callbacks.remove(key)
    }

    /// Whether this process asked for the task's deletion in the last minute; records the ask
    /// otherwise (the caller sends it).
    pub fn deletion_sent(&self, key: &TaskKey) -> bool {
        let mut state = self.lock();
        if state
            .deletions
            .get(key)
            .is_some_and(|at| at.elapsed() < DELETION_RESENT_AFTER)
        {
            return true;
        }
        state.deletions.insert(key.clone(), Instant::now());
        false
    }

    /// Keeps a status decided for `key` and put off, decided on `written` (and its place in the
    /// line of due progress writes, if it has one).
    pub fn put_off(
        &self,
        key: &TaskKey,
        uid: Option<String>,
        written: AxTaskStatus,
        decided: AxTaskStatus,
    ) {
        let mut state = self.lock();
        let turn = state
            .unwritten
            .get(key)
            .filter(|kept| kept.uid == uid && kept.written == written)
            .map_or(Turn::NotInLine, |kept| kept.turn);
        let unwritten = Unwritten {
            uid,
            written,
            decided,
            turn,
        };
        state.unwritten.insert(key.clone(), unwritten);
    }

    /// Whether a due progress write of `key` may be made now: its turn has come, or nobody waits
    /// and the line has a token free (taken).
    pub fn progress_may_go(&self, key: &TaskKey) -> bool {
        let mut state = self.lock();
        state
            .unwritten
            .get(key)
            .is_some_and(|kept| kept.turn == Turn::Up)
            || state.progress.may_go_now(Timestamp::now())
    }

    /// Puts the status put off for `key` at the end of the line of due progress writes, unless it
    /// is in it already.
    pub fn wait_for_turn(&self, key: &TaskKey) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if let Some(kept) = state.unwritten.get_mut(key)
            && kept.turn == Turn::NotInLine
        {
            kept.turn = Turn::Waiting;
            state.progress.wait(key.clone());
        }
    }

    /// Lets due progress writes through as the rate allows at `now`: the tasks to reconcile (and
    /// write), and whether others still wait. A write an outcome carried since has left the line.
    pub fn progress_turns(&self, now: Timestamp) -> (Vec<TaskKey>, bool) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let unwritten = &mut state.unwritten;
        let through = state.progress.let_through(now, |key| {
            unwritten
                .get(key)
                .is_some_and(|kept| kept.turn == Turn::Waiting)
        });
        for key in &through {
            if let Some(kept) = unwritten.get_mut(key) {
                kept.turn = Turn::Up;
            }
        }
        (through, !state.progress.is_empty())
    }

    /// The status put off for this task, if it was decided on the status the cache shows as
    /// written; otherwise it is forgotten (a status write landed since).
    pub fn unwritten(
        &self,
        key: &TaskKey,
        uid: Option<&str>,
        written: &AxTaskStatus,
    ) -> Option<AxTaskStatus> {
        let mut state = self.lock();
        let kept = state.unwritten.get(key)?;
        if kept.uid.as_deref() == uid && kept.written == *written {
            return Some(kept.decided.clone());
        }
        state.unwritten.remove(key);
        None
    }

    /// Whether this process has something of its own to do for the task: a status put off, a pod
    /// just created, a callback's outcome to record.
    pub fn has_work(&self, key: &TaskKey) -> bool {
        let state = self.lock();
        state.unwritten.contains_key(key)
            || self.pods.has_any(key)
            || state.callbacks.contains_key(key)
    }

    /// The phase of every status put off, by task.
    pub fn unwritten_phases(&self) -> Vec<(TaskKey, crate::api::TaskPhase)> {
        self.lock()
            .unwritten
            .iter()
            .filter_map(|(key, u)| Some((key.clone(), u.decided.phase?)))
            .collect()
    }

    /// The task's status was written: nothing is put off any more.
    pub fn status_written(&self, key: &TaskKey) {
        self.lock().unwritten.remove(key);
    }

    /// Forgets a deleted task.
    pub fn forget(&self, key: &TaskKey) {
        let mut state = self.lock();
        state.written.remove(key);
        self.pods.forget(key);
        self.removed.forget(key);
        state.callbacks.remove(key);
        state.deletions.remove(key);
        state.unwritten.remove(key);
    }

    /// Keys with something tracked, for sweeping out deleted tasks.
    pub fn keys(&self) -> Vec<TaskKey> {
        let state = self.lock();
        state
            .written
            .keys()
            .chain(state.callbacks.keys())
            .chain(state.deletions.keys())
            .chain(state.unwritten.keys())
            .cloned()
            .chain(self.pods.owners())
            .chain(self.removed.owners())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> TaskKey {
        TaskKey::new(("ns".into(), name.into()))
    }

    #[test]
    fn a_cached_copy_older_than_our_write_is_stale_until_the_cache_catches_up() {
        let tracking = Tracking::new(10);
        assert!(!tracking.is_stale(&key("a"), Some(5)));
        tracking.wrote(&key("a"), Some(10));
        assert!(tracking.is_stale(&key("a"), Some(9)));
        assert!(!tracking.is_stale(&key("a"), Some(10)));
        // Forgotten once caught up: an older copy later (a re-list) is not held back for ever.
        assert!(!tracking.is_stale(&key("a"), Some(9)));
    }

    #[test]
    fn an_expected_pod_counts_until_the_cache_shows_its_attempt() {
        let tracking = Tracking::new(10);
        let at = Timestamp::from_second(1_900_000_000).expect("in range");
        tracking.expect_pod(&key("a"), "a-2", 2, at);
        assert_eq!(
            tracking.expected_pod(&key("a"), |_| false),
            Some(("a-2".into(), 2, at))
        );
        assert_eq!(
            tracking.expected_pod(&key("a"), |attempt| attempt == 2),
            None
        );
        assert_eq!(tracking.expected_pod(&key("a"), |_| false), None);
    }
}
