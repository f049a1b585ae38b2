//! Children by the uid of their controller (the owner reference with `controller: true`), fed
//! from the watch events of the children's cache, so that a DAG or cron reconcile reads its own
//! children, not every child in the cluster.
//!
//! It follows the reflector's store event for event: a relist (`Init`, `InitApply`…, `InitDone`)
//! builds new contents aside and replaces the old ones at `InitDone`, so an object gone while the
//! watch was down leaves the index when it leaves the store, and the index never shows a relist
//! half done. Fed before the store, it may run one event ahead of it: a reader looks each child up
//! in the store and skips one missing there.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

/// Whether `child`'s controller (its owner reference with `controller: true`) has uid `uid`.
pub fn is_controlled_by<K: Resource>(child: &K, uid: &str) -> bool {
    kube::ResourceExt::owner_references(child)
        .iter()
        .any(|owner| owner.uid == uid && owner.controller == Some(true))
}

/// A child's place in its store.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChildKey {
    pub namespace: Option<String>,
    pub name: String,
}

impl ChildKey {
    fn of<K: Resource>(object: &K) -> Self {
        let meta = object.meta();
        ChildKey {
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }

    /// The key of the child in a reflector store of `K`.
    pub fn object_ref<K>(&self) -> ObjectRef<K>
    where
        K: Resource<DynamicType = ()>,
    {
        let object = ObjectRef::new(&self.name);
        match &self.namespace {
            Some(namespace) => object.within(namespace),
            None => object,
        }
    }
}

#[derive(Debug, Default)]
pub struct OwnerIndex {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    live: Contents,
    /// The relist under way, from `Init` to `InitDone`.
    relist: Option<Contents>,
}

#[derive(Debug, Default, PartialEq)]
struct Contents {
    children: HashMap<String, BTreeSet<ChildKey>>,
    /// Each indexed child's controller, to move or drop it when it changes or goes.
    controller_of: HashMap<ChildKey, String>,
}

impl Contents {
    fn insert(&mut self, child: ChildKey, controller: Option<String>) {
        self.remove(&child);
        if let Some(controller) = controller {
            self.children
                .entry(controller.clone())
                .or_default()
                .insert(child.clone());
            self.controller_of.insert(child, controller);
        }
    }

    fn remove(&mut self, child: &ChildKey) {
        let Some(controller) = self.controller_of.remove(child) else {
            return;
        };
        if let Some(children) = self.children.get_mut(&controller) {
            children.remove(child);
            if children.is_empty() {
                self.children.remove(&controller);
            }
        }
    }
}

fn controller_uid<K: Resource>(object: &K) -> Option<String> {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| owner.uid.clone())
}

impl OwnerIndex {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes in one event of the children's watch.
    pub fn apply<K: Resource>(&self, event: &watcher::Event<K>) {
        let mut state = self.state();
        match event {
            watcher::Event::Apply(child) => {
                state
                    .live
                    .insert(ChildKey::of(child), controller_uid(child));
            }
            watcher::Event::Delete(child) => state.live.remove(&ChildKey::of(child)),
            watcher::Event::Init => state.relist = Some(Contents::default()),
            watcher::Event::InitApply(child) => state
                .relist
                .get_or_insert_with(Contents::default)
                .insert(ChildKey::of(child), controller_uid(child)),
            watcher::Event::InitDone => {
                state.live = state.relist.take().unwrap_or_default();
            }
        }
    }

    /// The uids of every controller with children.
    pub fn owners(&self) -> Vec<String> {
        self.state().live.children.keys().cloned().collect()
    }

    /// The children whose controller has `uid`, by namespace and name.
    pub fn children_of(&self, uid: &str) -> Vec<ChildKey> {
        self.state()
            .live
            .children
            .get(uid)
            .map(|children| children.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AxTask;
    use watcher::Event;

    fn child(namespace: &str, name: &str, controller: Option<&str>) -> AxTask {
        let owners: Vec<serde_json::Value> = controller
            .map(|uid| {
                serde_json::json!({"apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
                    "name": "d", "uid": uid, "controller": true})
            })
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners},
            "spec": {"type": "t", "template": {}},
        }))
        .expect("an AxTask")
    }

    fn names(index: &OwnerIndex, uid: &str) -> Vec<String> {
        index
            .children_of(uid)
            .into_iter()
            .map(|k| format!("{}/{}", k.namespace.unwrap_or_default(), k.name))
            .collect()
    }

    #[test]
    fn children_are_found_by_their_controller_and_leave_when_deleted_or_moved() {
        let index = OwnerIndex::default();
        index.apply(&Event::Apply(child("a", "d-x", Some("u1"))));
        index.apply(&Event::Apply(child("a", "d-y", Some("u1"))));
        index.apply(&Event::Apply(child("b", "d-x", Some("u2"))));
        // Owned, but not as its controller: not a child.
        let mut not_controlled = child("a", "other", Some("u1"));
        not_controlled.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        index.apply(&Event::Apply(not_controlled));
        index.apply(&Event::Apply(child("a", "orphan", None)));
        assert_eq!(names(&index, "u1"), ["a/d-x", "a/d-y"]);
        assert_eq!(names(&index, "u2"), ["b/d-x"]);

        // An update that changes nothing keeps it once; one that changes the controller moves it.
        index.apply(&Event::Apply(child("a", "d-x", Some("u1"))));
        index.apply(&Event::Apply(child("a", "d-y", Some("u3"))));
        assert_eq!(names(&index, "u1"), ["a/d-x"]);
        assert_eq!(names(&index, "u3"), ["a/d-y"]);
        // One that drops the controller reference drops it.
        index.apply(&Event::Apply(child("a", "d-y", None)));
        assert!(names(&index, "u3").is_empty());

        // Deleted (the event may carry a bare placeholder): gone, from its own namespace only.
        index.apply(&Event::Delete(child("a", "d-x", None)));
        assert!(names(&index, "u1").is_empty());
        assert_eq!(names(&index, "u2"), ["b/d-x"]);
        assert!(index.state().live.children.keys().eq(["u2"]), "{index:?}");
    }

    #[test]
    fn a_relist_replaces_the_contents_when_it_is_done() {
        let index = OwnerIndex::default();
        index.apply(&Event::Apply(child("a", "d-gone", Some("u1"))));
        index.apply(&Event::Apply(child("a", "d-kept", Some("u1"))));
        index.apply(&Event::<AxTask>::Init);
        index.apply(&Event::InitApply(child("a", "d-kept", Some("u1"))));
        index.apply(&Event::InitApply(child("a", "d-new", Some("u1"))));
        // Until the relist is done the old contents stand, as in the store.
        assert_eq!(names(&index, "u1"), ["a/d-gone", "a/d-kept"]);
        index.apply(&Event::<AxTask>::InitDone);
        // Deleted while the watch was down: gone; created meanwhile: there.
        assert_eq!(names(&index, "u1"), ["a/d-kept", "a/d-new"]);
        let key = ChildKey {
            namespace: Some("a".into()),
            name: "d-gone".into(),
        };
        assert!(!index.state().live.controller_of.contains_key(&key));

        // An empty relist empties it.
        index.apply(&Event::<AxTask>::Init);
        index.apply(&Event::<AxTask>::InitDone);
        assert_eq!(index.state().live, Contents::default());
    }

    #[test]
    fn keys_find_the_child_in_its_store() {
        let (store, mut writer) = kube::runtime::reflector::store::<AxTask>();
        let task = child("a", "d-x", Some("u1"));
        writer.apply_watcher_event(&Event::Apply(task.clone()));
        let index = OwnerIndex::default();
        index.apply(&Event::Apply(task));
        let found: Vec<_> = index
            .children_of("u1")
            .iter()
            .filter_map(|k| store.get(&k.object_ref()))
            .collect();
        assert_eq!(found.len(), 1);
    }
}
