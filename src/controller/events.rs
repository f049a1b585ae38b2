//! Publishes Kubernetes Events (`events.k8s.io/v1`) for the objects the operator manages.
//!
//! Replaces kube's `Recorder`, which keeps every Event it published for six minutes as a whole
//! object and scans all of them on each publish: at a burst's rate that is tens of thousands of
//! objects, none ever read again (a task's Events are nearly all unique). Here an exact repeat (same
//! object, type, reason and note, as client-go's core/v1 recorder compares them) within
//! [`SERIES_WINDOW`] still counts up the first Event's series instead of making another, but what is
//! kept per Event is a hash of that key, its name and count, and expiry costs O(1) per publish.
//! Unlike kube's recorder, a repeat with another note (attempt 2 failing after attempt 1) is an
//! Event of its own, so no failure's message is hidden behind an earlier one's.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource};

/// A repeat within this long of the last occurrence counts up the series instead of making a new
/// Event (client-go's and kube's window).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// Events being published at once, for the same reason: they are a record, never urgent.
static EVENTS_IN_FLIGHT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(8);

/// The events API limits a note to 1 KiB.
const NOTE_MAX_CHARS: usize = 1000;

/// What makes two Events the same happening: the object (by uid, so a recreated namesake starts
/// afresh), the type, reason and note.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesKey<'a> {
    pub regarding_uid: &'a str,
    pub regarding_name: &'a str,
    pub warning: bool,
    pub reason: &'a str,
    pub note: &'a str,
}

impl SeriesKey<'_> {
    /// What [`Series`] keeps of the key: 64 bits make a false repeat vanishingly unlikely.
    pub fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

/// Whether to create a new Event or count up an earlier one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publish {
    Create { name: String },
    Repeat { name: String, count: i32 },
}

#[derive(Debug)]
struct Entry {
    name: String,
    count: i32,
    last_seen: Timestamp,
}

/// The Events published in the last [`SERIES_WINDOW`], by key: pure bookkeeping, no client.
#[derive(Debug, Default)]
pub struct Series {
    entries: HashMap<u64, Entry>,
    /// Each occurrence, oldest first; one whose entry has been seen since is skipped when it expires.
    seen: VecDeque<(Timestamp, u64)>,
}

impl Series {
    /// Records an occurrence of `key` (a [`SeriesKey::digest`]) at `now` and says how to publish
    /// it; `name` is the name a new Event gets.
    pub fn observe(&mut self, key: u64, name: String, now: Timestamp) -> Publish {
        self.expire(now);
        self.seen.push_back((now, key));
        match self.entries.get_mut(&key) {
            Some(entry) => {
                entry.count = entry.count.saturating_add(1);
                entry.last_seen = now;
                Publish::Repeat {
                    name: entry.name.clone(),
                    count: entry.count,
                }
            }
            None => {
                self.entries.insert(
                    key,
                    Entry {
                        name: name.clone(),
                        count: 1,
                        last_seen: now,
                    },
                );
                Publish::Create { name }
            }
        }
    }

    /// Forgets `key` when its Event `name` could not be created, so the next occurrence creates one.
    pub fn forget(&mut self, key: u64, name: &str) {
        if self.entries.get(&key).is_some_and(|e| e.name == name) {
            self.entries.remove(&key);
        }
    }

    fn expire(&mut self, now: Timestamp) {
        while let Some(&(at, key)) = self.seen.front() {
            if at + SERIES_WINDOW > now {
                break;
            }
            self.seen.pop_front();
            if self.entries.get(&key).is_some_and(|e| e.last_seen == at) {
                self.entries.remove(&key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Who publishes: the controller's name and this replica's identity.
#[derive(Clone)]
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    series: Arc<Mutex<Series>>,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Events {
            client,
            controller: controller.into(),
            instance: instance.into(),
            series: Arc::default(),
        }
    }

    /// Publishes an Event in the background: Events are a record for people, never on the path
    /// that moves an object, so a slow or failing events API delays nothing.
    pub fn publish<K>(&self, object: &K, type_: EventType, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let regarding = object.object_ref(&());
        let now = Timestamp::now();
        let note: String = note.chars().take(NOTE_MAX_CHARS).collect();
        let warning = matches!(type_, EventType::Warning);
        let digest = SeriesKey {
            regarding_uid: regarding.uid.as_deref().unwrap_or_default(),
            regarding_name: regarding.name.as_deref().unwrap_or_default(),
            warning,
            reason,
            note: &note,
        }
        .digest();
        let fresh_name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let publish = lock(&self.series).observe(digest, fresh_name, now);
        // The request needs only the client and the series, not the whole publisher. Events about
        // a cluster-scoped object go to `default`, as kube's and client-go's recorders put them.
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let series = self.series.clone();
        let request = match publish {
            Publish::Create { name } => Request::Create(Box::new(
                self.event(name, regarding, warning, reason, note, now),
            )),
            Publish::Repeat { name, count } => Request::CountUp { name, count },
        };
        tokio::spawn(async move {
            let Ok(_permit) = EVENTS_IN_FLIGHT.acquire().await else {
                return;
            };
            match request {
                Request::Create(event) => {
                    if let Err(e) = api.create(&PostParams::default(), &event).await {
                        tracing::debug!(error = %e, "publishing event failed");
                        lock(&series)
                            .forget(digest, event.metadata.name.as_deref().unwrap_or_default());
                    }
                }
                Request::CountUp { name, count } => {
                    let patch = serde_json::json!({
                        "series": EventSeries { count, last_observed_time: MicroTime(now) }
                    });
                    let patched = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                    if let Err(e) = patched {
                        tracing::debug!(error = %e, "counting up an event's series failed");
                    }
                }
            }
        });
    }

    fn event(
        &self,
        name: String,
        regarding: ObjectReference,
        warning: bool,
        reason: &str,
        note: String,
        now: Timestamp,
    ) -> K8sEvent {
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            action: Some(ACTION.into()),
            reason: Some(reason.into()),
            note: Some(note),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            ..Default::default()
        }
    }
}

/// The series behind its lock. Bookkeeping only: a panic elsewhere cannot leave it worse than a
/// missed series, so a poisoned lock is taken over.
fn lock(series: &Mutex<Series>) -> MutexGuard<'_, Series> {
    series
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What one publish sends.
enum Request {
    Create(Box<K8sEvent>),
    /// Counts up the series of the Event `name`.
    CountUp {
        name: String,
        count: i32,
    },
}

/// The one action the operator's Events report.
const ACTION: &str = "Reconcile";

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uid: &str, reason: &str) -> u64 {
        SeriesKey {
            regarding_uid: uid,
            regarding_name: uid,
            warning: false,
            reason,
            note: "the same note",
        }
        .digest()
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_repeat_within_the_window_counts_up_the_first_event() {
        let mut series = Series::default();
        assert_eq!(
            series.observe(key("a", "Retrying"), "a.1".into(), at(0)),
            Publish::Create { name: "a.1".into() }
        );
        assert_eq!(
            series.observe(key("a", "Retrying"), "a.2".into(), at(300)),
            Publish::Repeat {
                name: "a.1".into(),
                count: 2
            }
        );
        // The window runs from the last occurrence, not the first.
        assert_eq!(
            series.observe(key("a", "Retrying"), "a.3".into(), at(600)),
            Publish::Repeat {
                name: "a.1".into(),
                count: 3
            }
        );
    }

    #[test]
    fn another_object_or_reason_is_another_event() {
        let mut series = Series::default();
        series.observe(key("a", "Retrying"), "a.1".into(), at(0));
        assert!(matches!(
            series.observe(key("b", "Retrying"), "b.1".into(), at(1)),
            Publish::Create { .. }
        ));
        assert!(matches!(
            series.observe(key("a", "Dead"), "a.2".into(), at(2)),
            Publish::Create { .. }
        ));
    }

    #[test]
    fn after_the_window_the_same_happening_is_a_new_event_and_old_keys_are_dropped() {
        let mut series = Series::default();
        for i in 0..100 {
            series.observe(key(&format!("t{i}"), "Succeeded"), format!("t{i}.1"), at(i));
        }
        series.observe(key("t0", "Succeeded"), "t0.x".into(), at(80));
        assert_eq!(series.len(), 100);
        // t0 was seen again at 80 s; the others expire once their window passed.
        let later = at(360 + 50);
        assert_eq!(
            series.observe(key("t0", "Succeeded"), "t0.2".into(), later),
            Publish::Repeat {
                name: "t0.1".into(),
                count: 3
            }
        );
        assert_eq!(
            series.observe(key("t99", "Succeeded"), "t99.2".into(), later),
            Publish::Repeat {
                name: "t99.1".into(),
                count: 2
            }
        );
        // Everything but t0 and t51..t99 has expired, and what is kept stays bounded.
        assert_eq!(series.len(), 50);
        assert_eq!(
            series.observe(key("t1", "Succeeded"), "t1.2".into(), later),
            Publish::Create {
                name: "t1.2".into()
            }
        );
        series.observe(key("z", "Succeeded"), "z.1".into(), at(10_000));
        assert_eq!(series.len(), 1);
        assert_eq!(series.seen.len(), 1);
    }

    #[test]
    fn another_note_is_another_event_so_no_message_is_hidden() {
        let key_with = |note| {
            SeriesKey {
                regarding_uid: "a",
                regarding_name: "a",
                warning: true,
                reason: "ExitCode",
                note,
            }
            .digest()
        };
        let mut series = Series::default();
        series.observe(key_with("attempt 1: exit 1"), "a.1".into(), at(0));
        assert!(matches!(
            series.observe(key_with("attempt 2: exit 1"), "a.2".into(), at(1)),
            Publish::Create { .. }
        ));
        assert!(matches!(
            series.observe(key_with("attempt 2: exit 1"), "a.3".into(), at(2)),
            Publish::Repeat { count: 2, .. }
        ));
    }

    #[test]
    fn a_failed_create_is_forgotten_so_the_next_one_creates() {
        let mut series = Series::default();
        series.observe(key("a", "Dead"), "a.1".into(), at(0));
        series.forget(key("a", "Dead"), "a.1");
        assert!(series.is_empty());
        assert!(matches!(
            series.observe(key("a", "Dead"), "a.2".into(), at(1)),
            Publish::Create { .. }
        ));
    }

    proptest::proptest! {
        /// Against a model that keeps every key and scans them all: the same decisions, and no
        /// more keys kept than were seen within the window.
        #[test]
        fn series_agree_with_a_scanning_model(
            steps in proptest::collection::vec((0usize..6, 0i64..200), 1..200)
        ) {
            let mut series = Series::default();
            let mut model: HashMap<usize, (String, i32, Timestamp)> = HashMap::new();
            let mut now = at(0);
            for (i, (k, advance)) in steps.into_iter().enumerate() {
                now += SignedDuration::from_secs(advance);
                model.retain(|_, (_, _, last)| *last + SERIES_WINDOW > now);
                let name = format!("e{i}");
                let expected = match model.get_mut(&k) {
                    Some((first, count, last)) => {
                        *count += 1;
                        *last = now;
                        Publish::Repeat { name: first.clone(), count: *count }
                    }
                    None => {
                        model.insert(k, (name.clone(), 1, now));
                        Publish::Create { name: name.clone() }
                    }
                };
                proptest::prop_assert_eq!(series.observe(key(&k.to_string(), "R"), name, now), expected);
                proptest::prop_assert_eq!(series.len(), model.len());
            }
        }
    }
}
