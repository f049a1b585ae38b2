//! Drives pods bound to the simulated nodes: one watcher on all pods, one sleeping tokio task per
//! live pod (its timers), and every status write through the shared [`ApiWriter`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::AbortHandle;

use crate::script::{PodScript, RunLength};
use crate::status;
use crate::writer::{ApiWriter, WriteError};

/// Counts of what the simulator did, for the periodic progress log.
#[derive(Default)]
pub struct Counters {
    pub started: AtomicU64,
    pub finished: AtomicU64,
    pub deleted: AtomicU64,
    pub failed_writes: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> [u64; 4] {
        [
            &self.started,
            &self.finished,
            &self.deleted,
            &self.failed_writes,
        ]
        .map(|counter| counter.load(Ordering::Relaxed))
    }
}

struct Shared {
    client: Client,
    writer: ApiWriter,
    counters: Arc<Counters>,
}

/// What the simulator is doing about one pod (keyed by uid in [`PodDriver`]).
struct Tracked {
    task: AbortHandle,
    deleting: bool,
}

impl Tracked {
    fn stop(&self) {
        if !self.deleting {
            self.task.abort();
        }
    }
}

pub struct PodDriver {
    shared: Arc<Shared>,
    nodes: HashSet<String>,
    /// Only pods with this label (`key=value`) are watched: a private pool's, so that its
    /// simulator does not list every scheduled pod of the cluster.
    pod_selector: Option<String>,
    tracked: HashMap<String, Tracked>,
    /// UIDs seen during a (re-)list, to forget pods deleted while the watch was down.
    relisted: HashSet<String>,
}

impl PodDriver {
    pub fn new(
        client: Client,
        writer: ApiWriter,
        nodes: &[String],
        pod_selector: Option<String>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                writer,
                counters,
            }),
            nodes: nodes.iter().cloned().collect(),
            pod_selector,
            tracked: HashMap::new(),
            relisted: HashSet::new(),
        }
    }

    /// Watches pods until the stream ends (it retries with backoff, so in practice: forever).
    pub async fn run(mut self) {
        let all_pods: Api<Pod> = Api::all(self.shared.client.clone());
        // Only scheduled pods matter; the server filters out the (possibly many) pending ones.
        let mut config = watcher::Config::default().fields("spec.nodeName!=");
        if let Some(selector) = &self.pod_selector {
            config = config.labels(selector);
        }
        let mut events = watcher::watcher(all_pods, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => self.relisted.clear(),
                Ok(Event::InitApply(pod)) => {
                    if let Some(uid) = pod.uid() {
                        self.relisted.insert(uid);
                    }
                    self.on_apply(pod);
                }
                Ok(Event::InitDone) => self.forget_unlisted(),
                Ok(Event::Apply(pod)) => self.on_apply(pod),
                Ok(Event::Delete(pod)) => self.forget(pod.uid().as_deref()),
                Err(error) => tracing::warn!(%error, "pod watch failed; retrying"),
            }
        }
        tracing::error!("pod watch stream ended");
    }

    /// Stops driving a pod. A deletion task is left to finish: the Deleted event often arrives before
    /// the response to its own delete call, and aborting it then would only lose the count.
    fn forget(&mut self, uid: Option<&str>) {
        if let Some(tracked) = uid.and_then(|uid| self.tracked.remove(uid)) {
            tracked.stop();
        }
    }

    fn forget_unlisted(&mut self) {
        let relisted = std::mem::take(&mut self.relisted);
        self.tracked.retain(|uid, tracked| {
            let keep = relisted.contains(uid);
            if !keep {
                tracked.stop();
            }
            keep
        });
        tracing::info!(tracked = self.tracked.len(), "pod list synced");
    }

    fn on_apply(&mut self, pod: Pod) {
        let ours = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_ref())
            .is_some_and(|node| self.nodes.contains(node));
        let Some(uid) = pod.uid().filter(|_| ours) else {
            return;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            let already_deleting = self
                .tracked
                .get(&uid)
                .is_some_and(|tracked| tracked.deleting);
            if !already_deleting {
                self.forget(Some(&uid));
                let task = tokio::spawn(delete_pod(self.shared.clone(), pod)).abort_handle();
                self.tracked.insert(
                    uid,
                    Tracked {
                        task,
                        deleting: true,
                    },
                );
            }
            return;
        }
        if self.tracked.contains_key(&uid) || status::is_terminal(&pod) {
            return;
        }
        let task = tokio::spawn(drive_pod(self.shared.clone(), pod)).abort_handle();
        self.tracked.insert(
            uid,
            Tracked {
                task,
                deleting: false,
            },
        );
    }
}

fn describe(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Writes a pod's status; the uid in the patch makes the server refuse it for a re-created namesake.
async fn write_status(
    shared: &Shared,
    pod: &Pod,
    what: &str,
    status: PodStatus,
) -> Result<(), WriteError> {
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let patch = Patch::Merge(json!({"metadata": {"uid": pod.uid()}, "status": status}));
    let params = PatchParams::default();
    shared
        .writer
        .write(what, || api.patch_status(&name, &params, &patch))
        .await
        .map(drop)
}

fn report(shared: &Shared, pod: &Pod, what: &str, result: Result<(), WriteError>) -> bool {
    match result {
        Ok(()) => true,
        Err(WriteError::Gone) => {
            tracing::debug!(pod = describe(pod), what, "pod gone before the write");
            false
        }
        Err(error) => {
            shared
                .counters
                .failed_writes
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pod = describe(pod), %error, "pod status write failed");
            false
        }
    }
}

fn millis_between(from: Timestamp, to: Timestamp) -> u64 {
    u64::try_from(to.as_millisecond().saturating_sub(from.as_millisecond())).unwrap_or(0)
}

/// Start (unless an earlier run of the simulator already did), run, terminate.
async fn drive_pod(shared: Arc<Shared>, pod: Pod) {
    let parsed = PodScript::from_pod(&pod);
    if !parsed.ignored.is_empty() {
        let ignored = parsed.ignored.join(", ");
        tracing::warn!(
            pod = describe(&pod),
            ignored,
            "unparsable ax-sim env values, using defaults"
        );
    }
    let script = parsed.script;
    let started_at = match status::running_since(&pod) {
        Some(started_at) => started_at,
        None => {
            tokio::time::sleep(script.start_delay).await;
            let started_at = Timestamp::now();
            let result = write_status(
                &shared,
                &pod,
                "pod running",
                status::running(&pod, started_at),
            )
            .await;
            if !report(&shared, &pod, "running", result) {
                return;
            }
            shared.counters.started.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(pod = describe(&pod), "pod running");
            started_at
        }
    };
    let RunLength::For(duration) = script.run else {
        return;
    };
    let ran_for = Duration::from_millis(millis_between(started_at, Timestamp::now()));
    tokio::time::sleep(duration.saturating_sub(ran_for)).await;
    let finished_at = Timestamp::now();
    let status = status::terminated(&pod, &script, started_at, finished_at);
    let result = write_status(&shared, &pod, "pod terminated", status).await;
    if report(&shared, &pod, "terminated", result) {
        shared.counters.finished.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            pod = describe(&pod),
            exit_code = script.exit_code,
            "pod terminated"
        );
    }
}

/// What the kubelet does for a pod being deleted: kill its containers, then remove the object.
async fn delete_pod(shared: Arc<Shared>, pod: Pod) {
    let running = !status::is_terminal(&pod) || !status::all_containers_terminated(&pod);
    if running && PodScript::from_pod(&pod).script.ignores_sigterm {
        // SIGTERM ignored: the kubelet kills it when the grace period of the deletion runs out.
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
        let due = pod.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        let wait = due.map_or(Duration::from_secs(grace.clamp(0, 600) as u64), |due| {
            Duration::try_from(due.duration_since(Timestamp::now())).unwrap_or_default()
        });
        tokio::time::sleep(wait.min(Duration::from_secs(600))).await;
    }
    if running {
        let result = write_status(
            &shared,
            &pod,
            "pod killed",
            status::killed(&pod, Timestamp::now()),
        )
        .await;
        if !report(&shared, &pod, "killed", result) {
            return;
        }
    }
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match shared
        .writer
        .write("delete pod", || api.delete(&name, &params))
        .await
    {
        Ok(_) => {
            shared.counters.deleted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(pod = describe(&pod), "pod deleted");
        }
        Err(WriteError::Gone) => {}
        Err(error) => {
            shared
                .counters
                .failed_writes
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pod = describe(&pod), %error, "pod delete failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_time_never_goes_negative() {
        let earlier = Timestamp::from_second(100).expect("valid");
        let later = Timestamp::from_millisecond(100_250).expect("valid");
        assert_eq!(millis_between(earlier, later), 250);
        assert_eq!(millis_between(later, earlier), 0);
    }
}
