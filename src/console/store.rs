//! What the console shows, kept current by API watches made with the user's own credentials
//! (client required): the AxTasks and AxDags of the namespace (or all, with `-A`) and the
//! AxQueues. Every change bumps a counter that the live views (Server-Sent Events) wait on. A
//! watch the user may not make (RBAC) leaves its error in `problems`, which the pages show.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::api::{AxDag, AxQueue, AxTask};
use crate::client::error::{Op, Resource, watch_error};

/// The objects, keyed by (namespace, name); queues by name.
#[derive(Default, Debug)]
pub struct Data {
    pub tasks: BTreeMap<(String, String), AxTask>,
    pub dags: BTreeMap<(String, String), AxDag>,
    pub queues: BTreeMap<String, AxQueue>,
    /// Per resource, why its watch fails now (e.g. not allowed to list it).
    pub problems: BTreeMap<Resource, String>,
    /// Resources whose first list has arrived.
    pub synced: BTreeSet<Resource>,
}

/// The namespace watched: `None` is all of them.
pub type Scope = Option<String>;

pub struct Store {
    data: RwLock<Data>,
    changes: watch::Sender<u64>,
    pub scope: Scope,
}

fn key<K: ResourceExt>(o: &K) -> (String, String) {
    (o.namespace().unwrap_or_default(), o.name_any())
}

impl Store {
    pub fn new(scope: Scope) -> Arc<Store> {
        Arc::new(Store {
            data: RwLock::default(),
            changes: watch::channel(0).0,
            scope,
        })
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Data> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn change(&self, f: impl FnOnce(&mut Data)) {
        {
            let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
            f(&mut data);
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// A receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Starts the three watches; they run until the process ends.
    pub fn start(self: &Arc<Self>, client: kube::Client) {
        let (tasks, dags): (Api<AxTask>, Api<AxDag>) = match &self.scope {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
        let ns = self.scope.clone();
        tokio::spawn(follow(
            self.clone(),
            tasks,
            Op::new("watch", Resource::Task).namespace(ns.as_deref()),
            |d, t| {
                d.tasks.insert(key(&t), t);
            },
            |d, t| {
                d.tasks.remove(&key(t));
            },
            |d, all| d.tasks = all.into_iter().map(|t| (key(&t), t)).collect(),
        ));
        tokio::spawn(follow(
            self.clone(),
            dags,
            Op::new("watch", Resource::Dag).namespace(ns.as_deref()),
            |d, o| {
                d.dags.insert(key(&o), o);
            },
            |d, o| {
                d.dags.remove(&key(o));
            },
            |d, all| d.dags = all.into_iter().map(|o| (key(&o), o)).collect(),
        ));
        tokio::spawn(follow(
            self.clone(),
            Api::<AxQueue>::all(client),
            Op::new("watch", Resource::Queue),
            |d, q| {
                d.queues.insert(q.name_any(), q);
            },
            |d, q| {
                d.queues.remove(&q.name_any());
            },
            |d, all| d.queues = all.into_iter().map(|q| (q.name_any(), q)).collect(),
        ));
    }
}

/// Follows one watch into the store: a (re)list replaces what was there, errors are recorded
/// (and retried with backoff) until the watch works again.
async fn follow<K>(
    store: Arc<Store>,
    api: Api<K>,
    op: Op,
    apply: fn(&mut Data, K),
    delete: fn(&mut Data, &K),
    replace: fn(&mut Data, Vec<K>),
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let resource = op.resource;
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing: Vec<K> = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(o)) => listing.push(o),
            Ok(watcher::Event::InitDone) => {
                let all = std::mem::take(&mut listing);
                store.change(|d| {
                    replace(d, all);
                    d.problems.remove(&resource);
                    d.synced.insert(resource);
                });
            }
            Ok(watcher::Event::Apply(o)) => store.change(|d| {
                apply(d, o);
                d.problems.remove(&resource);
            }),
            Ok(watcher::Event::Delete(o)) => store.change(|d| delete(d, &o)),
            Err(e) => {
                let text = watch_error(&op, e).to_string();
                let known = store.read().problems.get(&resource) == Some(&text);
                if !known {
                    store.change(|d| {
                        d.problems.insert(resource, text);
                    });
                }
            }
        }
    }
}
