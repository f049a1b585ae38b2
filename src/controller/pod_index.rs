//! The worker pods of each task, by the task's uid, kept from the pod watch beside the pod cache
//! (which is keyed by name). A task's reconcile finds every pod it owns here, whatever attempt its
//! status knows: a status that lags (a new leader's cache behind its pod cache) must still see the
//! pod of a later attempt, and hold off (`core::task::behind`) instead of starting another worker
//! beside it. A reconcile costs the task's own pods, never a scan of all pods.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

use crate::core::worker::LABEL_ATTEMPT;

/// Task uid → attempt → pod name.
type Index = HashMap<String, BTreeMap<i32, String>>;

#[derive(Debug, Default)]
pub struct PodsByTask(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    live: Index,
    /// A relist in progress: it replaces `live` once complete, so pods deleted while the watch was
    /// down do not linger.
    relist: Option<Index>,
}

/// The owning task's uid, the attempt (label `ax.dev/attempt`, 0 when missing or not a number)
/// and the name of a worker pod.
fn entry(pod: &Pod) -> Option<(String, i32, String)> {
    let meta = &pod.metadata;
    let owner = meta
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "AxTask" && o.controller == Some(true))?;
    let attempt = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ATTEMPT))
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    Some((owner.uid.clone(), attempt, meta.name.clone()?))
}

fn insert(index: &mut Index, pod: &Pod) {
    if let Some((uid, attempt, name)) = entry(pod) {
        index.entry(uid).or_default().insert(attempt, name);
    }
}

impl PodsByTask {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Follows one event of the pod watch.
    pub fn apply(&self, event: &Event<Pod>) {
        let mut state = self.state();
        match event {
            Event::Apply(pod) => insert(&mut state.live, pod),
            Event::Delete(pod) => {
                if let Some((uid, attempt, name)) = entry(pod)
                    && let Some(attempts) = state.live.get_mut(&uid)
                {
                    if attempts.get(&attempt) == Some(&name) {
                        attempts.remove(&attempt);
                    }
                    if attempts.is_empty() {
                        state.live.remove(&uid);
                    }
                }
            }
            Event::Init => state.relist = Some(Index::new()),
            Event::InitApply(pod) => {
                let relist = state.relist.get_or_insert_with(Index::new);
                insert(relist, pod);
            }
            Event::InitDone => {
                if let Some(relist) = state.relist.take() {
                    state.live = relist;
                }
            }
        }
    }

    /// The pods of the task with uid `uid`: (attempt, name), lowest attempt first.
    pub fn pods_of(&self, uid: &str) -> Vec<(i32, String)> {
        self.state()
            .live
            .get(uid)
            .map_or_else(Vec::new, |attempts| {
                attempts
                    .iter()
                    .map(|(attempt, name)| (*attempt, name.clone()))
                    .collect()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, owner: &str, attempt: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {LABEL_ATTEMPT: attempt},
                "ownerReferences": [{"apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
                    "name": "t", "uid": owner, "controller": true}],
            }
        }))
        .unwrap()
    }

    #[test]
    fn follows_applies_deletes_and_relists() {
        let index = PodsByTask::default();
        index.apply(&Event::Apply(pod("t-1", "u", "1")));
        index.apply(&Event::Apply(pod("t-3", "u", "3")));
        index.apply(&Event::Apply(pod("other-1", "v", "1")));
        assert_eq!(
            index.pods_of("u"),
            vec![(1, "t-1".to_string()), (3, "t-3".to_string())]
        );
        index.apply(&Event::Delete(pod("t-1", "u", "1")));
        assert_eq!(index.pods_of("u"), vec![(3, "t-3".to_string())]);

        // A relist replaces what was known once it is complete; until then the old view holds.
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("t-4", "u", "4")));
        assert_eq!(index.pods_of("u"), vec![(3, "t-3".to_string())]);
        index.apply(&Event::InitDone);
        assert_eq!(index.pods_of("u"), vec![(4, "t-4".to_string())]);
        assert!(index.pods_of("v").is_empty());
    }

    #[test]
    fn ignores_pods_no_task_controls() {
        let index = PodsByTask::default();
        let mut stray = pod("x", "u", "1");
        stray.metadata.owner_references = None;
        index.apply(&Event::Apply(stray));
        assert!(index.pods_of("u").is_empty());
    }
}
