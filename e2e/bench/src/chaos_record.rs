//! The chaos soak's record of the cluster: a watch on the run's pods, AxTasks and AxDags started
//! before the first task, kept through every fault (a watch that breaks resumes from its last
//! resourceVersion; after a `410 Gone` it lists again and notes the pods that vanished in the
//! gap), turned into the audit's input at the end. Plus the operator's successful creates, read
//! from the API server's audit log.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use crate::audit::{
    self, AttemptOutcome, CronFiring, DagChild, DagOutcome, Key, PodEnd, PodLife, Revision,
    TaskOutcome,
};

const LABEL_TASK: &str = "ax.dev/task";
const LABEL_ATTEMPT: &str = "ax.dev/attempt";
const LABEL_DAG: &str = "ax.dev/dag";
const LABEL_CRON: &str = "ax.dev/cron";
const LABEL_SCHEDULED_TIME: &str = "ax.dev/scheduled-time";

#[derive(Clone, Debug)]
struct PodState {
    task: Key,
    name: String,
    attempt: u32,
    node: Option<String>,
    created: Revision,
    last_seen: Revision,
    end: Option<PodEnd>,
    /// What each change showed (phase, node, deletion), for reading a violation afterwards.
    history: Vec<(Revision, String)>,
}

#[derive(Clone, Debug, Default)]
struct TaskState {
    uid: String,
    phase: Option<String>,
    terminal_at: Option<Revision>,
    attempts: Vec<AttemptOutcome>,
    reason: Option<String>,
}

#[derive(Default)]
struct State {
    /// By uid.
    pods: HashMap<String, PodState>,
    tasks: BTreeMap<Key, TaskState>,
    /// Phase and first terminal revision.
    dags: BTreeMap<Key, (Option<String>, Option<Revision>)>,
    dag_children: Vec<DagChild>,
    cron_firings: Vec<CronFiring>,
    /// Task uids already counted as a DAG child or cron firing.
    children_seen: std::collections::HashSet<String>,
    relists: usize,
}

/// What the watches have seen so far; shared with the fault injector, which picks live pods.
#[derive(Clone, Default)]
pub struct Recorder {
    state: Arc<Mutex<State>>,
}

/// A worker pod that is live now.
#[derive(Clone, Debug)]
pub struct LivePod {
    pub namespace: String,
    pub name: String,
    pub task: Key,
    pub attempt: u32,
    pub node: Option<String>,
}

pub fn pod_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

pub fn ax_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("ax.dev", "v1alpha1", kind), plural)
}

fn revision(object: &DynamicObject) -> Revision {
    object
        .metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

fn key(object: &DynamicObject) -> Key {
    format!(
        "{}/{}",
        object.metadata.namespace.as_deref().unwrap_or_default(),
        object.metadata.name.as_deref().unwrap_or_default()
    )
}

fn label<'a>(object: &'a DynamicObject, name: &str) -> Option<&'a str> {
    object
        .metadata
        .labels
        .as_ref()?
        .get(name)
        .map(String::as_str)
}

/// The AxTask a worker pod belongs to (its controller owner, else its task label) and its attempt.
fn worker_of(pod: &DynamicObject) -> Option<(Key, u32)> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "AxTask" && o.controller == Some(true))
        .map(|o| o.name.clone())
        .or_else(|| label(pod, LABEL_TASK).map(str::to_owned))?;
    let attempt = label(pod, LABEL_ATTEMPT)?.parse().ok()?;
    Some((format!("{namespace}/{owner}"), attempt))
}

/// `phase node [deleting grace=N]`: what a change of a pod showed.
fn pod_summary(pod: &DynamicObject) -> String {
    let mut summary = format!(
        "{} {}",
        pod.data["status"]["phase"].as_str().unwrap_or("-"),
        pod.data["spec"]["nodeName"].as_str().unwrap_or("-")
    );
    if pod.metadata.deletion_timestamp.is_some() {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(-1);
        summary.push_str(&format!(" deleting grace={grace}"));
    }
    summary
}

fn pod_terminal(pod: &DynamicObject) -> bool {
    matches!(
        pod.data["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

impl Recorder {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn on_pod(&self, pod: &DynamicObject, deleted: bool) {
        let Some((task, attempt)) = worker_of(pod) else {
            return;
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let rv = revision(pod);
        let node = pod.data["spec"]["nodeName"].as_str().map(str::to_owned);
        self.with(|s| {
            let state = s.pods.entry(uid).or_insert_with(|| PodState {
                task,
                name: pod.metadata.name.clone().unwrap_or_default(),
                attempt,
                node: None,
                created: rv,
                last_seen: rv,
                end: None,
                history: Vec::new(),
            });
            state.last_seen = state.last_seen.max(rv);
            let seen = if deleted {
                "deleted".to_owned()
            } else {
                pod_summary(pod)
            };
            if state.history.last().is_none_or(|(_, last)| *last != seen) {
                state.history.push((rv, seen));
            }
            if node.is_some() {
                state.node = node;
            }
            if state.end.is_none() {
                if deleted {
                    state.end = Some(PodEnd::Deleted { at: rv });
                } else if pod_terminal(pod) {
                    state.end = Some(PodEnd::Terminal { at: rv });
                }
            }
        });
    }

    /// After a fresh list at `listed_at`: a live pod missing from it went away in the gap.
    fn pods_listed(&self, listed: &[DynamicObject], listed_at: Revision) {
        let present: std::collections::HashSet<&str> = listed
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.with(|s| {
            s.relists += 1;
            for (uid, pod) in s.pods.iter_mut() {
                if pod.end.is_none() && !present.contains(uid.as_str()) {
                    pod.end = Some(PodEnd::Vanished {
                        after: pod.last_seen,
                        by: listed_at,
                    });
                }
            }
        });
        for pod in listed {
            self.on_pod(pod, false);
        }
    }

    fn on_task(&self, task: &DynamicObject) {
        let rv = revision(task);
        let key = key(task);
        let uid = task.metadata.uid.clone().unwrap_or_default();
        let status = &task.data["status"];
        let phase = status["phase"].as_str().map(str::to_owned);
        let terminal = matches!(phase.as_deref(), Some("Succeeded" | "Dead" | "Canceled"));
        let attempts = status["attempts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| AttemptOutcome {
                attempt: a["attempt"].as_u64().unwrap_or(0) as u32,
                failure_kind: a["failureKind"].as_str().map(str::to_owned),
                reason: a["reason"].as_str().map(str::to_owned),
            })
            .collect();
        let namespace = task.metadata.namespace.clone().unwrap_or_default();
        let dag = label(task, LABEL_DAG).map(|d| format!("{namespace}/{d}"));
        let cron = label(task, LABEL_CRON).map(|c| format!("{namespace}/{c}"));
        let scheduled = label(task, LABEL_SCHEDULED_TIME).and_then(|t| t.parse::<i64>().ok());
        self.with(|s| {
            if s.children_seen.insert(uid.clone()) {
                if let Some(dag) = dag {
                    s.dag_children.push(DagChild {
                        dag,
                        child: key.clone(),
                        uid: uid.clone(),
                    });
                }
                if let (Some(cron), Some(scheduled)) = (cron, scheduled) {
                    s.cron_firings.push(CronFiring {
                        cron,
                        scheduled,
                        child: key.clone(),
                        uid: uid.clone(),
                    });
                }
            }
            let state = s.tasks.entry(key).or_default();
            if state.uid != uid {
                *state = TaskState {
                    uid,
                    ..TaskState::default()
                };
            }
            state.phase = phase;
            state.reason = status["reason"].as_str().map(str::to_owned);
            state.attempts = attempts;
            if terminal && state.terminal_at.is_none() {
                state.terminal_at = Some(rv);
            }
        });
    }

    fn on_dag(&self, dag: &DynamicObject) {
        let rv = revision(dag);
        let phase = dag.data["status"]["phase"].as_str().map(str::to_owned);
        let terminal = phase
            .as_deref()
            .is_some_and(|p| audit::DAG_TERMINAL_PHASES.contains(&p));
        self.with(|s| {
            let state = s.dags.entry(key(dag)).or_default();
            state.0 = phase;
            if terminal && state.1.is_none() {
                state.1 = Some(rv);
            }
        });
    }

    /// Pods live now (not terminal, not gone), as last seen.
    pub fn live_pods(&self) -> Vec<LivePod> {
        self.with(|s| {
            s.pods
                .values()
                .filter(|p| p.end.is_none())
                .map(|p| LivePod {
                    namespace: p.task.split_once('/').map_or("", |(n, _)| n).to_owned(),
                    name: p.name.clone(),
                    task: p.task.clone(),
                    attempt: p.attempt,
                    node: p.node.clone(),
                })
                .collect()
        })
    }

    /// Tasks seen and how many of them are terminal.
    pub fn progress(&self) -> (usize, usize) {
        self.with(|s| {
            (
                s.tasks.len(),
                s.tasks.values().filter(|t| t.terminal_at.is_some()).count(),
            )
        })
    }

    /// Tasks and DAGs not terminal yet, with their phase and reason.
    pub fn unfinished(&self) -> Vec<(Key, Option<String>, Option<String>)> {
        self.with(|s| {
            let tasks = s
                .tasks
                .iter()
                .filter(|(_, t)| t.terminal_at.is_none())
                .map(|(k, t)| (k.clone(), t.phase.clone(), t.reason.clone()));
            let dags = s
                .dags
                .iter()
                .filter(|(_, (_, terminal))| terminal.is_none())
                .map(|(k, (phase, _))| (format!("AxDag {k}"), phase.clone(), None));
            tasks.chain(dags).collect()
        })
    }

    /// Every worker pod seen and the changes it went through, by task: the record a violation is
    /// read from after the run.
    pub fn pod_histories(&self) -> Value {
        self.with(|s| {
            let mut pods: Vec<(&String, &PodState)> = s.pods.iter().collect();
            pods.sort_by_key(|(_, p)| (p.task.clone(), p.created));
            Value::Array(
                pods.into_iter()
                    .map(|(uid, p)| {
                        serde_json::json!({
                            "task": p.task, "pod": p.name, "uid": uid, "attempt": p.attempt,
                            "history": p.history,
                        })
                    })
                    .collect(),
            )
        })
    }

    pub fn relists(&self) -> usize {
        self.with(|s| s.relists)
    }

    /// The audit's input from what was seen (disruptions, creates and cron expectations are the
    /// caller's).
    pub fn audit_input(&self) -> audit::Input {
        self.with(|s| audit::Input {
            pods: s
                .pods
                .iter()
                .map(|(uid, p)| PodLife {
                    task: p.task.clone(),
                    pod: p.name.clone(),
                    uid: uid.clone(),
                    attempt: p.attempt,
                    created: p.created,
                    end: p.end.clone().unwrap_or(PodEnd::Live),
                })
                .collect(),
            tasks: s
                .tasks
                .iter()
                .map(|(k, t)| TaskOutcome {
                    key: k.clone(),
                    phase: t.phase.clone(),
                    terminal_at: t.terminal_at,
                    attempts: t.attempts.clone(),
                })
                .collect(),
            dags: s
                .dags
                .iter()
                .map(|(k, (phase, terminal_at))| DagOutcome {
                    key: k.clone(),
                    phase: phase.clone(),
                    terminal_at: *terminal_at,
                })
                .collect(),
            dag_children: s.dag_children.clone(),
            cron_firings: s.cron_firings.clone(),
            ..audit::Input::default()
        })
    }

    /// Follows `resource` in `namespace` until the process ends; `ready` gets the first list.
    pub async fn follow(
        self,
        client: Client,
        namespace: String,
        resource: ApiResource,
        ready: tokio::sync::oneshot::Sender<()>,
    ) {
        let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource);
        let is_pod = resource.kind == "Pod";
        let mut ready = Some(ready);
        let mut from: Option<String> = None;
        loop {
            let since = match from.clone() {
                Some(rv) => rv,
                None => match api.list(&ListParams::default()).await {
                    Ok(list) => {
                        let at = list.metadata.resource_version.clone().unwrap_or_default();
                        if is_pod {
                            self.pods_listed(&list.items, at.parse().unwrap_or(0));
                        } else {
                            list.items
                                .iter()
                                .for_each(|o| self.dispatch(&resource, o, false));
                        }
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                        at
                    }
                    Err(e) => {
                        eprintln!("  chaos watch: listing {}: {e}", resource.plural);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
            };
            from = Some(since.clone());
            let params = WatchParams::default().timeout(240);
            let stream = match api.watch(&params, &since).await {
                Ok(stream) => stream,
                Err(e) => {
                    eprintln!("  chaos watch: {}: {e}", resource.plural);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let mut stream = stream.boxed();
            loop {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                        from = o.metadata.resource_version.clone();
                        self.dispatch(&resource, &o, false);
                    }
                    Ok(Some(WatchEvent::Deleted(o))) => {
                        from = o.metadata.resource_version.clone();
                        self.dispatch(&resource, &o, true);
                    }
                    Ok(Some(WatchEvent::Bookmark(b))) => {
                        from = Some(b.metadata.resource_version);
                    }
                    Ok(Some(WatchEvent::Error(status))) => {
                        if status.code == 410 {
                            from = None;
                        }
                        break;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("  chaos watch: {}: {e}", resource.plural);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        break;
                    }
                }
            }
        }
    }

    fn dispatch(&self, resource: &ApiResource, object: &DynamicObject, deleted: bool) {
        match resource.kind.as_str() {
            "Pod" => self.on_pod(object, deleted),
            "AxTask" if !deleted => self.on_task(object),
            "AxDag" if !deleted => self.on_dag(object),
            _ => {}
        }
    }
}

/// Successful creates (HTTP 201) per `(resource, namespace/name)` in `namespace`, from the API
/// server's audit log files (`audit.log` and its rotated backups) in `dir`, for requests received
/// at or after `since` (RFC 3339, compared as text: the log writes UTC with a `Z`).
pub fn audit_log_creates(dir: &Path, namespace: &str, since: &str) -> audit::Creates {
    let mut creates = audit::Creates::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return creates;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("audit") && name.ends_with(".log")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            count_create(&mut creates, line, namespace, since);
        }
    }
    creates
}

fn count_create(creates: &mut audit::Creates, line: &str, namespace: &str, since: &str) {
    let Ok(event) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let object = &event["objectRef"];
    if event["verb"] != "create"
        || event["stage"] != "ResponseComplete"
        || event["responseStatus"]["code"] != 201
        || object["namespace"] != namespace
        || object["subresource"].is_string()
        || event["requestReceivedTimestamp"]
            .as_str()
            .is_none_or(|t| t < since)
    {
        return;
    }
    let (Some(resource), Some(name)) = (object["resource"].as_str(), object["name"].as_str())
    else {
        return;
    };
    *creates
        .counts
        .entry((resource.to_owned(), format!("{namespace}/{name}")))
        .or_insert(0) += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn worker(uid: &str, rv: u64, phase: &str) -> DynamicObject {
        object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "t-1", "namespace": "ns", "uid": uid, "resourceVersion": rv.to_string(),
                "labels": {LABEL_TASK: "t", LABEL_ATTEMPT: "1"},
                "ownerReferences": [{"apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
                    "name": "t", "uid": "task-uid", "controller": true}],
            },
            "spec": {"nodeName": "ax-sim-0"},
            "status": {"phase": phase},
        }))
    }

    #[test]
    fn a_pod_is_live_from_its_first_sight_to_its_terminal_phase_or_deletion() {
        let r = Recorder::default();
        r.on_pod(&worker("a", 10, "Pending"), false);
        r.on_pod(&worker("a", 12, "Running"), false);
        assert_eq!(r.live_pods().len(), 1);
        assert_eq!(r.live_pods()[0].node.as_deref(), Some("ax-sim-0"));
        r.on_pod(&worker("a", 15, "Succeeded"), false);
        r.on_pod(&worker("a", 18, "Succeeded"), true);
        r.on_pod(&worker("b", 20, "Running"), false);
        r.on_pod(&worker("b", 25, "Running"), true);
        r.on_pod(&worker("c", 30, "Running"), false);
        r.pods_listed(&[], 40);
        assert!(r.live_pods().is_empty());
        let mut pods = r.audit_input().pods;
        pods.sort_by_key(|p| p.created);
        let ends: Vec<PodEnd> = pods.into_iter().map(|p| p.end).collect();
        assert_eq!(
            ends,
            vec![
                PodEnd::Terminal { at: 15 },
                PodEnd::Deleted { at: 25 },
                PodEnd::Vanished { after: 30, by: 40 }
            ]
        );
    }

    #[test]
    fn tasks_record_their_first_terminal_revision_attempts_and_parents() {
        let r = Recorder::default();
        let task = |rv: u64, phase: &str| {
            object(json!({
                "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
                "metadata": {"name": "cr-60", "namespace": "ns", "uid": "u1",
                    "resourceVersion": rv.to_string(),
                    "labels": {LABEL_CRON: "cr", LABEL_SCHEDULED_TIME: "60"}},
                "status": {"phase": phase, "attempts": [
                    {"attempt": 1, "pod": "cr-60-1", "failureKind": "Infrastructure",
                     "reason": "Evicted", "scheduledAt": "2025-01-01T00:00:00Z"}]},
            }))
        };
        r.on_task(&task(5, "Running"));
        r.on_task(&task(9, "Succeeded"));
        r.on_task(&task(11, "Succeeded"));
        let input = r.audit_input();
        assert_eq!(input.tasks[0].terminal_at, Some(9));
        assert_eq!(
            input.tasks[0].attempts[0].reason.as_deref(),
            Some("Evicted")
        );
        assert_eq!(input.cron_firings.len(), 1);
        assert_eq!(input.cron_firings[0].scheduled, 60);
        assert!(input.dag_children.is_empty());
        assert_eq!(r.progress(), (1, 1));
    }

    #[test]
    fn the_audit_log_counts_successful_creates_in_the_namespace_since_the_start() {
        let line = |verb: &str, code: u16, ns: &str, at: &str, sub: Option<&str>| {
            let mut object = json!({"resource": "pods", "namespace": ns, "name": "t-1"});
            if let Some(sub) = sub {
                object["subresource"] = sub.into();
            }
            json!({"verb": verb, "stage": "ResponseComplete", "responseStatus": {"code": code},
                "objectRef": object, "requestReceivedTimestamp": at})
            .to_string()
        };
        let mut creates = audit::Creates::default();
        for l in [
            line("create", 201, "ns", "2025-01-01T00:00:05.1Z", None),
            line("create", 201, "ns", "2025-01-01T00:00:07Z", None),
            line("create", 409, "ns", "2025-01-01T00:00:08Z", None),
            line("create", 201, "other", "2025-01-01T00:00:08Z", None),
            line("create", 201, "ns", "2024-12-31T23:59:59Z", None),
            line("create", 201, "ns", "2025-01-01T00:00:09Z", Some("binding")),
            line("delete", 200, "ns", "2025-01-01T00:00:09Z", None),
            "not json".to_owned(),
        ] {
            count_create(&mut creates, &l, "ns", "2025-01-01T00:00:00Z");
        }
        assert_eq!(creates.of("pods", "ns/t-1"), 2);
        assert_eq!(creates.counts.len(), 1);
    }
}
