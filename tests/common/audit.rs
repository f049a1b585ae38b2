//! An audit of a namespace from watches: every change of every worker pod and every AxTask, in the
//! order etcd made them (resourceVersion), so a test can replay them and ask "were two workers of
//! one task ever alive at the same instant?".

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ax::api::{AxTask, TaskPhase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

#[derive(Clone, Debug)]
pub enum Seen {
    Pod {
        rv: u64,
        task: String,
        name: String,
        attempt: String,
        uid: String,
        phase: String,
        deleting: bool,
        gone: bool,
    },
    Task {
        rv: u64,
        name: String,
        uid: String,
        phase: Option<TaskPhase>,
    },
}

impl Seen {
    fn rv(&self) -> u64 {
        match self {
            Seen::Pod { rv, .. } | Seen::Task { rv, .. } => *rv,
        }
    }
}

pub struct Audit {
    seen: Arc<Mutex<Vec<Seen>>>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

fn rv_of<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pod_seen(pod: &Pod, gone: bool) -> Option<Seen> {
    let labels = pod.labels();
    Some(Seen::Pod {
        rv: rv_of(pod),
        task: labels.get("ax.dev/task")?.clone(),
        name: pod.name_any(),
        attempt: labels.get("ax.dev/attempt")?.clone(),
        uid: pod.uid().unwrap_or_default(),
        phase: pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        gone,
    })
}

fn task_seen(task: &AxTask) -> Seen {
    Seen::Task {
        rv: rv_of(task),
        name: task.name_any(),
        uid: task.uid().unwrap_or_default(),
        phase: task.status.as_ref().and_then(|s| s.phase),
    }
}

/// Starts watching the worker pods and AxTasks of `namespace`.
pub fn audit(client: &Client, namespace: &str) -> Audit {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), namespace);
    let record = seen.clone();
    let pod_watch = tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default().labels("ax.dev/task")).boxed();
        while let Some(event) = stream.next().await {
            let entry = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => pod_seen(&p, false),
                Ok(watcher::Event::Delete(p)) => pod_seen(&p, true),
                _ => None,
            };
            if let Some(entry) = entry {
                record.lock().unwrap().push(entry);
            }
        }
    });
    let record = seen.clone();
    let task_watch = tokio::spawn(async move {
        let mut stream = watcher(tasks, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t)) = event {
                record.lock().unwrap().push(task_seen(&t));
            }
        }
    });
    Audit {
        seen,
        watches: vec![pod_watch, task_watch],
    }
}

/// One pod's state at one point of the replay.
#[derive(Clone, Debug)]
struct PodState {
    attempt: String,
    phase: String,
    deleting: bool,
}

fn live(p: &PodState) -> bool {
    p.phase != "Succeeded" && p.phase != "Failed"
}

impl Audit {
    /// Everything seen so far, in etcd's order.
    pub fn events(&self) -> Vec<Seen> {
        let mut events = self.seen.lock().unwrap().clone();
        events.sort_by_key(Seen::rv);
        events
    }

    /// Replays the audit for `task`: calls `check` after every change with the pods that exist
    /// (by name) and the task's phase at that instant.
    fn replay(
        &self,
        task: &str,
        mut check: impl FnMut(&BTreeMap<String, PodState>, Option<TaskPhase>, &Seen),
    ) {
        let mut pods: BTreeMap<String, PodState> = BTreeMap::new();
        let mut phase = None;
        for event in self.events() {
            match &event {
                Seen::Pod {
                    task: t,
                    name,
                    attempt,
                    phase: p,
                    deleting,
                    gone,
                    ..
                } if t == task => {
                    if *gone {
                        pods.remove(name);
                    } else {
                        pods.insert(
                            name.clone(),
                            PodState {
                                attempt: attempt.clone(),
                                phase: p.clone(),
                                deleting: *deleting,
                            },
                        );
                    }
                }
                Seen::Task { name, phase: p, .. } if name == task => phase = *p,
                _ => continue,
            }
            check(&pods, phase, &event);
        }
    }

    /// Fails unless, at every instant, at most one pod of `task` was in a non-terminal phase, and
    /// the task was never terminal while one was.
    pub fn assert_one_live_worker(&self, task: &str) {
        self.replay(task, |pods, phase, event| {
            let alive: Vec<_> = pods.iter().filter(|(_, p)| live(p)).collect();
            assert!(
                alive.len() <= 1,
                "{task}: two live workers at {event:?}: {alive:?}"
            );
            if phase == Some(TaskPhase::Dead) {
                assert!(
                    alive.is_empty(),
                    "{task}: Dead while a worker was alive: {alive:?}"
                );
            }
        });
    }

    /// Whether some pod of `task` was alive while another of it existed and was being deleted
    /// (what `podReplacementPolicy: TerminatingOrFailed` allows).
    pub fn overlapped(&self, task: &str) -> bool {
        let mut overlap = false;
        self.replay(task, |pods, _, _| {
            let terminating = pods.values().filter(|p| p.deleting).count();
            let running_new = pods.values().filter(|p| !p.deleting && live(p)).count();
            overlap |= terminating >= 1 && running_new >= 1;
        });
        overlap
    }

    /// The order in which the pods of `task` were created and removed, as ("+"|"-", attempt).
    pub fn pod_lifecycle(&self, task: &str) -> Vec<(char, String)> {
        let mut out = Vec::new();
        let mut known: BTreeMap<String, ()> = BTreeMap::new();
        for event in self.events() {
            if let Seen::Pod {
                task: t,
                name,
                attempt,
                gone,
                ..
            } = event
                && t == task
            {
                if gone {
                    if known.remove(&name).is_some() {
                        out.push(('-', attempt));
                    }
                } else if known.insert(name, ()).is_none() {
                    out.push(('+', attempt));
                }
            }
        }
        out
    }

    /// Distinct uids of AxTasks seen whose name starts with `prefix`.
    pub fn task_uids(&self, prefix: &str) -> std::collections::BTreeSet<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Seen::Task { name, uid, .. } if name.starts_with(prefix) => Some(uid),
                _ => None,
            })
            .collect()
    }

    pub fn stop(&self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.stop();
    }
}
