//! Watches that survive objects this operator cannot read.
//!
//! The API server stores what the CRD's schema admits, and that is more than serde reads: a
//! timestamp with more than nine fractional digits, a value written by an older or newer version of
//! ax or by another client. A kube watcher of `AxTask` fails its whole list on one such object, so
//! one bad task would stop every task (and every restart would stall on it). Here each object is
//! read on its own: an unreadable one is left out of the cache — removed, if an older readable copy
//! was there — and reported once per version with a Warning Event that names the field.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt, future};
use kube::api::ObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

use super::events::Events;
use super::list_watch;
use crate::api::{
    AxCron, AxCronSpec, AxDag, AxDagSpec, AxQueue, AxQueueSpec, AxTask, AxTaskSpec, AxTaskTemplate,
    AxTaskTemplateSpec,
};

/// The Event reason of an object the operator skips.
pub const REASON: &str = "Unreadable";

/// An object as the API server sent it: read, or why not.
#[derive(Clone, Debug)]
pub struct Checked<K>(pub Result<K, Unreadable>);

/// An object that does not read as its type: its metadata and the failing field.
#[derive(Clone, Debug)]
pub struct Unreadable {
    pub metadata: ObjectMeta,
    /// `spec.startAfter: premature end of input`-style: the path, then serde's reason.
    pub error: String,
}

impl<K: DeserializeOwned> Checked<K> {
    /// Reads one object's JSON, as [`Checked`]'s `Deserialize` does, without building a
    /// `serde_json::Value` of it first when it reads: the items of a large list go this way.
    pub fn read(bytes: &[u8]) -> serde_json::Result<Self> {
        if let Ok(object) = serde_json::from_slice::<K>(bytes) {
            return Ok(Checked(Ok(object)));
        }
        serde_json::from_slice(bytes)
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Checked<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        // `K` reads from a borrow of the value; only an unreadable object is read again, to name
        // the field.
        if let Ok(object) = K::deserialize(&value) {
            return Ok(Checked(Ok(object)));
        }
        let error = match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(object) => return Ok(Checked(Ok(object))),
            Err(e) if e.path().to_string() == "." => e.into_inner().to_string(),
            Err(e) => format!("{}: {}", e.path(), e.inner()),
        };
        let metadata = ObjectMeta::deserialize(value.get("metadata").unwrap_or(&value))
            .map_err(|e| D::Error::custom(format!("metadata: {e}")))?;
        Ok(Checked(Err(Unreadable { metadata, error })))
    }
}

impl<K: Resource> Resource for Checked<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.as_ref().map_or_else(|u| &u.metadata, K::meta)
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0
            .as_mut()
            .map_or_else(|u| &mut u.metadata, K::meta_mut)
    }
}

/// An object with nothing but its metadata: what a cache is told to delete.
pub trait Placeholder {
    fn placeholder(metadata: ObjectMeta) -> Self;
}

impl Placeholder for AxTask {
    fn placeholder(metadata: ObjectMeta) -> Self {
        AxTask {
            metadata,
            spec: AxTaskSpec::default(),
            status: None,
        }
    }
}

impl Placeholder for AxCron {
    fn placeholder(metadata: ObjectMeta) -> Self {
        AxCron {
            metadata,
            spec: AxCronSpec::default(),
            status: None,
        }
    }
}

impl Placeholder for AxQueue {
    fn placeholder(metadata: ObjectMeta) -> Self {
        AxQueue {
            metadata,
            spec: AxQueueSpec::default(),
            status: None,
        }
    }
}

impl Placeholder for AxDag {
    fn placeholder(metadata: ObjectMeta) -> Self {
        AxDag {
            metadata,
            spec: AxDagSpec::default(),
            status: None,
        }
    }
}

impl Placeholder for AxTaskTemplate {
    fn placeholder(metadata: ObjectMeta) -> Self {
        AxTaskTemplate {
            metadata,
            spec: AxTaskTemplateSpec::default(),
        }
    }
}

/// Publishes one Warning Event per unreadable object version.
#[derive(Clone)]
pub struct Reporter {
    events: Events,
    reported: Arc<Mutex<Reported>>,
}

/// By uid, the resourceVersion last reported of each object unreadable now: an object that reads
/// again, or is deleted, is forgotten, so this holds only what is unreadable.
#[derive(Debug, Default)]
struct Reported(HashMap<String, String>);

impl Reported {
    /// Whether this version of the object is to be reported: not reported before.
    fn first(&mut self, uid: &str, version: &str) -> bool {
        if self.0.get(uid).is_some_and(|v| v == version) {
            return false;
        }
        self.0.insert(uid.to_owned(), version.to_owned());
        true
    }

    fn forget(&mut self, uid: &str) {
        if !self.0.is_empty() {
            self.0.remove(uid);
        }
    }
}

impl Reporter {
    pub fn new(events: Events) -> Self {
        Reporter {
            events,
            reported: Arc::default(),
        }
    }

    fn report<K>(&self, unreadable: &Unreadable)
    where
        K: Resource<DynamicType = ()> + Placeholder,
    {
        let meta = &unreadable.metadata;
        let uid = meta.uid.as_deref().unwrap_or_default();
        let version = meta.resource_version.as_deref().unwrap_or_default();
        let Ok(mut reported) = self.reported.lock() else {
            return;
        };
        if !reported.first(uid, version) {
            return;
        }
        drop(reported);
        tracing::warn!(
            kind = %K::kind(&()),
            namespace = meta.namespace.as_deref().unwrap_or(""),
            name = meta.name.as_deref().unwrap_or(""),
            error = %unreadable.error,
            "skipping an object this operator cannot read"
        );
        let note = format!(
            "{} {} is skipped: this operator cannot read {}",
            K::kind(&()),
            meta.name.as_deref().unwrap_or(""),
            unreadable.error
        );
        let object = K::placeholder(meta.clone());
        self.events
            .publish(&object, EventType::Warning, REASON, &note);
    }

    /// The object with this metadata reads again, or is gone.
    fn forget(&self, meta: &ObjectMeta) {
        if let Ok(mut reported) = self.reported.lock() {
            reported.forget(meta.uid.as_deref().unwrap_or_default());
        }
    }
}

/// A watcher of every `K` matching `labels` (see `list_watch`) whose unreadable objects are left
/// out, or deleted from the cache when a readable copy came before; with a reporter they are also
/// reported.
pub fn watch<K>(
    client: Client,
    labels: Option<&str>,
    reporter: Option<Reporter>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Placeholder + Clone + DeserializeOwned + Debug + Send + Sync,
    K: 'static,
{
    watch_reduced(client, labels, reporter, |_: &mut K| {})
}

/// [`watch`], with `reduce` applied to every readable object as soon as it is read (see
/// `list_watch::watch`).
pub fn watch_reduced<K>(
    client: Client,
    labels: Option<&str>,
    reporter: Option<Reporter>,
    reduce: impl Fn(&mut K) + Send + Sync + 'static,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Placeholder + Clone + DeserializeOwned + Debug + Send + Sync,
    K: 'static,
{
    let reduce = move |checked: &mut Checked<K>| {
        if let Ok(object) = &mut checked.0 {
            reduce(object);
        }
    };
    let labels = labels.map(str::to_string);
    list_watch::watch::<Checked<K>, _>(client, labels, Checked::read, reduce).filter_map(
        move |event| {
            future::ready(match event {
                Ok(event) => readable(event, reporter.as_ref()).map(Ok),
                Err(e) => Some(Err(e)),
            })
        },
    )
}

fn readable<K>(
    event: watcher::Event<Checked<K>>,
    reporter: Option<&Reporter>,
) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + Placeholder,
{
    use watcher::Event::*;
    let unreadable = |u: Unreadable| {
        if let Some(reporter) = reporter {
            reporter.report::<K>(&u);
        }
        K::placeholder(u.metadata)
    };
    let forget = |meta: &ObjectMeta| {
        if let Some(reporter) = reporter {
            reporter.forget(meta);
        }
    };
    if let InitApply(Checked(Ok(k))) | Apply(Checked(Ok(k))) | Delete(Checked(Ok(k))) = &event {
        forget(k.meta());
    }
    if let Delete(Checked(Err(u))) = &event {
        forget(&u.metadata);
    }
    Some(match event {
        Init => Init,
        InitDone => InitDone,
        InitApply(Checked(Ok(k))) => InitApply(k),
        Apply(Checked(Ok(k))) => Apply(k),
        Delete(Checked(Ok(k))) => Delete(k),
        // Never listed, so nothing to remove.
        InitApply(Checked(Err(u))) => {
            unreadable(u);
            return None;
        }
        // The cache may hold an older, readable copy: it must not act on that.
        Apply(Checked(Err(u))) => Delete(unreadable(u)),
        Delete(Checked(Err(u))) => Delete(K::placeholder(u.metadata)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "spec": spec,
        })
    }

    #[test]
    fn a_readable_object_reads_as_itself() {
        let value = task(json!({"type": "x", "template": {}}));
        let checked: Checked<AxTask> = serde_json::from_value(value.clone()).expect("reads");
        let expected: AxTask = serde_json::from_value(value).expect("reads");
        let read = checked.0.expect("readable");
        assert_eq!(
            (read.metadata, read.spec),
            (expected.metadata, expected.spec)
        );
    }

    #[test]
    fn an_unreadable_object_keeps_its_metadata_and_names_the_field() {
        let value = task(json!({"type": "x", "template": {},
            "startAfter": "2026-12-01T10:00:00.123456789123Z"}));
        let checked: Checked<AxTask> = serde_json::from_value(value).expect("never fails");
        let unreadable = checked.0.expect_err("unreadable");
        assert_eq!(unreadable.metadata.name.as_deref(), Some("t"));
        assert_eq!(unreadable.metadata.resource_version.as_deref(), Some("7"));
        assert!(
            unreadable.error.starts_with("spec.startAfter: "),
            "{}",
            unreadable.error
        );
    }

    #[test]
    fn a_list_with_one_unreadable_object_reads_the_others() {
        let list = json!({"metadata": {}, "items": [
            task(json!({"type": "a", "template": {}})),
            task(json!({"type": "b", "template": {}, "timeout": {"hardSeconds": "ten"}})),
            task(json!({"type": "c", "template": {}})),
        ]});
        let list: kube::core::ObjectList<Checked<AxTask>> =
            serde_json::from_value(list).expect("the list reads");
        let readable: Vec<_> = list
            .items
            .iter()
            .filter_map(|c| c.0.as_ref().ok())
            .map(|t| t.spec.task_type.as_str())
            .collect();
        assert_eq!(readable, ["a", "c"]);
    }

    #[test]
    fn an_object_turned_unreadable_is_deleted_from_the_cache_and_never_listed() {
        let bad = || {
            Checked::<AxTask>(Err(Unreadable {
                metadata: ObjectMeta {
                    name: Some("t".into()),
                    ..ObjectMeta::default()
                },
                error: "spec.x: bad".into(),
            }))
        };
        assert!(matches!(
            readable(watcher::Event::Apply(bad()), None),
            Some(watcher::Event::Delete(t)) if t.metadata.name.as_deref() == Some("t")
        ));
        assert!(readable(watcher::Event::InitApply(bad()), None).is_none());
    }

    #[test]
    fn each_unreadable_version_is_reported_once_and_forgotten_once_readable() {
        let mut reported = Reported::default();
        assert!(reported.first("u", "7"));
        assert!(!reported.first("u", "7"), "the same version again");
        assert!(
            reported.first("u", "8"),
            "a newer version, still unreadable"
        );
        assert!(reported.first("v", "3"));
        reported.forget("u");
        assert_eq!(reported.0.len(), 1, "only what is unreadable now is kept");
        assert!(reported.first("u", "8"), "unreadable again after reading");
        reported.forget("u");
        reported.forget("v");
        assert!(reported.0.is_empty());
    }
}
