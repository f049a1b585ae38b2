//! The one "created but not yet cached" tracker of the task, DAG and cron controllers: what this
//! process created that its informer cache does not show yet. Without it a reconcile on a lagging
//! cache would count a worker pod or a child as missing and create it again, or count fewer
//! children at work than there are and exceed a DAG's `parallelism`. The task controller also
//! tracks pods it removed that the cache still shows (`Tracking::removed_pods`): the same
//! bookkeeping, with the sight turned round.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an object this process created counts as existing while the cache has not shown it:
/// long enough for any watch lag, short enough that one deleted before the cache ever saw it is
/// noticed (and made again) soon.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(60);

/// What a reconcile knows of one object its owner expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sight {
    /// The cache shows it: the expectation ends.
    Seen,
    /// The cache does not show it: it counts until [`EXPECTATION_TTL`].
    NotSeen,
    /// Kept whatever the cache shows and however old: the owner's status still lists it.
    Held,
}

/// Per owner, by name, each object with a value of the caller's and when it was created.
type Owners<K, V> = HashMap<K, HashMap<String, (V, Instant)>>;

/// Per owner (a task's key, a DAG's or a cron's uid), the objects (by name) it created and the
/// cache has not shown yet, each with a value of the caller's and when it was created.
#[derive(Debug)]
pub struct Expected<K, V>(Mutex<Inner<K, V>>);

#[derive(Debug)]
struct Inner<K, V> {
    owners: Owners<K, V>,
    /// When every owner's expired objects were last swept out: once per TTL, so a look at one
    /// owner costs O(its objects), not O(every owner).
    swept: Option<Instant>,
}

impl<K, V> Default for Expected<K, V> {
    fn default() -> Self {
        Self(Mutex::new(Inner {
            owners: HashMap::new(),
            swept: None,
        }))
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Expected<K, V> {
    /// A panic while holding the lock leaves at worst an expectation too many, which ends with its
    /// TTL: a poisoned lock is taken over.
    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `owner` created `name` at `now`.
    pub fn created(&self, owner: &K, name: &str, value: V, now: Instant) {
        let mut inner = self.lock();
        let names = inner.owners.entry(owner.clone()).or_default();
        names.insert(name.to_owned(), (value, now));
    }

    /// `owner` created `name` at `now`, its only object in flight: what it expected before is
    /// forgotten (a task has one worker pod at a time).
    pub fn created_only(&self, owner: &K, name: &str, value: V, now: Instant) {
        let names = HashMap::from([(name.to_owned(), (value, now))]);
        self.lock().owners.insert(owner.clone(), names);
    }

    /// Expects `name` of `owner` from `now` unless it is expected already.
    pub fn keep(&self, owner: &K, name: &str, value: V, now: Instant) {
        let mut inner = self.lock();
        let names = inner.owners.entry(owner.clone()).or_default();
        names.entry(name.to_owned()).or_insert((value, now));
    }

    /// What `owner` still expects, by name, after `sight` has said what the cache shows of each:
    /// those seen are forgotten, and so are those too old, of this owner now and of every owner
    /// once per TTL (an owner deleted meanwhile leaves nothing behind).
    pub fn pending(
        &self,
        owner: &K,
        now: Instant,
        sight: impl Fn(&str, &V) -> Sight,
    ) -> Vec<(String, V)> {
        let young = |created: &Instant| now.duration_since(*created) < EXPECTATION_TTL;
        let mut inner = self.lock();
        if inner.swept.is_none_or(|at| !young(&at)) {
            inner.swept = Some(now);
            inner.owners.retain(|key, names| {
                // This owner's are decided by `sight` below.
                if key != owner {
                    names.retain(|_, (_, created)| young(created));
                }
                !names.is_empty()
            });
        }
        let Some(names) = inner.owners.get_mut(owner) else {
            return Vec::new();
        };
        names.retain(|name, (value, created)| match sight(name, value) {
            Sight::Held => true,
            Sight::Seen => false,
            Sight::NotSeen => young(created),
        });
        let mut pending: Vec<(String, V)> = names
            .iter()
            .map(|(name, (value, _))| (name.clone(), value.clone()))
            .collect();
        if names.is_empty() {
            inner.owners.remove(owner);
        }
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        pending
    }

    /// Whether `owner` expects anything (before any expiry).
    pub fn has_any(&self, owner: &K) -> bool {
        self.lock().owners.contains_key(owner)
    }

    /// Forgets what `owner` expected (it was deleted).
    pub fn forget(&self, owner: &K) {
        self.lock().owners.remove(owner);
    }

    /// Every owner that expects something, for sweeping out deleted ones.
    pub fn owners(&self) -> Vec<K> {
        self.lock().owners.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(pending: &[(String, u8)]) -> Vec<&str> {
        pending.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[test]
    fn an_expectation_lasts_until_the_cache_shows_it_or_it_expires() {
        let expected: Expected<&str, u8> = Expected::default();
        let start = Instant::now();
        expected.created(&"dag-1", "a", 1, start);
        expected.created(&"dag-1", "b", 2, start);
        expected.created(&"dag-2", "a", 3, start);

        let pending = expected.pending(&"dag-1", start, |_, _| Sight::NotSeen);
        assert_eq!(pending, vec![("a".into(), 1), ("b".into(), 2)]);
        // `a` is in the cache now: forgotten; `b` still counts.
        let pending = expected.pending(&"dag-1", start, |name, _| {
            if name == "a" {
                Sight::Seen
            } else {
                Sight::NotSeen
            }
        });
        assert_eq!(names(&pending), ["b"]);
        // Another owner's look leaves dag-1's expectation alone while it is young.
        assert_eq!(
            names(&expected.pending(&"dag-2", start, |_, _| Sight::NotSeen)),
            ["a"]
        );
        assert!(expected.has_any(&"dag-1"));

        // Too old: gone, for every owner, whoever looks.
        let later = start + EXPECTATION_TTL;
        assert!(
            expected
                .pending(&"dag-1", later, |_, _| Sight::NotSeen)
                .is_empty()
        );
        assert!(expected.owners().is_empty(), "{expected:?}");
    }

    #[test]
    fn a_held_expectation_outlives_the_cache_and_its_ttl() {
        let expected: Expected<&str, u8> = Expected::default();
        let start = Instant::now();
        expected.created(&"cron", "c-1", 1, start);
        let later = start + EXPECTATION_TTL * 2;
        let held = expected.pending(&"cron", later, |_, _| Sight::Held);
        assert_eq!(names(&held), ["c-1"]);
        // `keep` adds only what is not expected yet.
        expected.keep(&"cron", "c-1", 9, later);
        expected.keep(&"cron", "c-2", 2, later);
        let pending = expected.pending(&"cron", later, |_, _| Sight::Held);
        assert_eq!(pending, vec![("c-1".into(), 1), ("c-2".into(), 2)]);
    }

    #[test]
    fn an_only_object_replaces_what_its_owner_expected() {
        let expected: Expected<&str, u8> = Expected::default();
        let start = Instant::now();
        expected.created_only(&"task", "task-1", 1, start);
        expected.created_only(&"task", "task-2", 2, start);
        let pending = expected.pending(&"task", start, |_, _| Sight::NotSeen);
        assert_eq!(pending, vec![("task-2".into(), 2)]);
        expected.forget(&"task");
        assert!(!expected.has_any(&"task"));
    }
}
