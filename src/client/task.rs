//! What a task's status and its worker pods say, as both front ends show it (no client
//! required): the phase it shows, each attempt, and why it waits now.
//!
//! Attempts come from `status.attempts` where the operator recorded them, else they are rebuilt
//! from the history (Scheduled/Running/outcome entries of each attempt) and the worker pods still
//! there (labels `ax.dev/task`, `ax.dev/attempt`).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::api::{AxTask, TaskPhase};
use crate::core::conditions;
use crate::core::worker::{LABEL_ATTEMPT, pod_name};

use super::format::{relative, run_time, time};

pub const ALL_PHASES: [TaskPhase; 8] = [
    TaskPhase::Pending,
    TaskPhase::Scheduled,
    TaskPhase::Running,
    TaskPhase::Succeeded,
    TaskPhase::Failed,
    TaskPhase::TimedOut,
    TaskPhase::Dead,
    TaskPhase::Canceled,
];

/// The phase a task shows; a task the operator has not seen yet counts as Pending.
pub fn effective_phase(task: &AxTask) -> TaskPhase {
    task.status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or(TaskPhase::Pending)
}

/// Pod annotation naming the container that decides the attempt (DESIGN §2).
pub const MAIN_CONTAINER_ANNOTATION: &str = "ax.dev/main-container";

/// What one worker pod says about its attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub attempt: i32,
    pub name: String,
    pub node: Option<String>,
    pub phase: Option<String>,
    pub exit_code: Option<i32>,
    pub started: Option<Timestamp>,
    pub finished: Option<Timestamp>,
    pub deleting: bool,
}

/// The main container: the one named by `ax.dev/main-container`, else the first.
pub fn main_container(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let named = pod.annotations().get(MAIN_CONTAINER_ANNOTATION);
    named
        .filter(|n| spec.containers.iter().any(|c| &c.name == *n))
        .cloned()
        .or_else(|| spec.containers.first().map(|c| c.name.clone()))
}

/// The attempt a worker pod ran, with its main container's outcome; None for a pod without a
/// numeric `ax.dev/attempt` label.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let attempt = pod.labels().get(LABEL_ATTEMPT)?.parse().ok()?;
    let main = main_container(pod);
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| Some(&c.name) == main.as_ref()));
    let state = container.and_then(|c| c.state.as_ref());
    let terminated = state.and_then(|s| s.terminated.as_ref());
    Some(PodInfo {
        attempt,
        name: pod.name_any(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase: status.and_then(|s| s.phase.clone()),
        exit_code: terminated.map(|t| t.exit_code),
        started: terminated
            .and_then(|t| t.started_at.as_ref())
            .or_else(|| {
                state
                    .and_then(|s| s.running.as_ref())
                    .and_then(|r| r.started_at.as_ref())
            })
            .map(|t| t.0),
        finished: terminated.and_then(|t| t.finished_at.as_ref()).map(|t| t.0),
        deleting: pod.metadata.deletion_timestamp.is_some(),
    })
}

/// One attempt, as far as the status and the pods tell.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttemptRow {
    pub attempt: i32,
    pub pod: String,
    pub node: Option<String>,
    pub scheduled: Option<Timestamp>,
    pub started: Option<Timestamp>,
    pub finished: Option<Timestamp>,
    pub outcome: Option<String>,
    pub exit_code: Option<i32>,
    pub failure_kind: Option<String>,
    pub reason: Option<String>,
    /// The pod no longer exists (its logs are gone too).
    pub pod_gone: bool,
}

impl AttemptRow {
    /// How long it ran (from its start, else from its dispatch): `1m 5s`, `12s so far` while it
    /// runs, empty when it never started.
    pub fn duration(&self, now: Timestamp) -> String {
        let from = self.started.or(self.scheduled);
        match (from, self.finished) {
            (Some(s), Some(f)) => run_time(f.duration_since(s)),
            (Some(s), None) if self.outcome.is_none() => {
                format!("{} so far", run_time(now.duration_since(s)))
            }
            _ => String::new(),
        }
    }
}

fn ends_attempt(from: Option<TaskPhase>, to: TaskPhase) -> bool {
    matches!(from, Some(TaskPhase::Scheduled | TaskPhase::Running)) && !to.has_worker()
}

/// Every attempt of the task, oldest first.
pub fn attempt_rows(task: &AxTask, pods: &[PodInfo]) -> Vec<AttemptRow> {
    let status = task.status.clone().unwrap_or_default();
    let name = task.name_any();
    let mut rows: BTreeMap<i32, AttemptRow> = BTreeMap::new();
    let current = status.attempt;
    let first = status
        .history
        .iter()
        .map(|h| h.attempt)
        .chain(status.attempts.iter().map(|a| a.attempt))
        .chain(pods.iter().map(|p| p.attempt))
        .filter(|a| *a >= 1)
        .min()
        .unwrap_or(1);
    for n in first..=current.max(pods.iter().map(|p| p.attempt).max().unwrap_or(0)) {
        let entries: Vec<_> = status.history.iter().filter(|h| h.attempt == n).collect();
        let end = entries.iter().find(|h| ends_attempt(h.from, h.to));
        let pod = pods.iter().find(|p| p.attempt == n);
        let failure = status.last_failure.as_ref().filter(|f| f.attempt == n);
        let row = AttemptRow {
            attempt: n,
            pod: pod.map(|p| p.name.clone()).unwrap_or_else(|| {
                if n == current {
                    status.worker.clone().unwrap_or_else(|| pod_name(&name, n))
                } else {
                    pod_name(&name, n)
                }
            }),
            node: pod
                .and_then(|p| p.node.clone())
                .or_else(|| (n == current).then(|| status.node.clone()).flatten()),
            scheduled: entries
                .iter()
                .find(|h| h.to == TaskPhase::Scheduled)
                .map(|h| h.time),
            started: entries
                .iter()
                .find(|h| h.to == TaskPhase::Running)
                .map(|h| h.time)
                .or(pod.and_then(|p| p.started)),
            finished: end.map(|h| h.time).or(pod.and_then(|p| p.finished)),
            outcome: end.map(|h| h.to.to_string()),
            exit_code: pod
                .and_then(|p| p.exit_code)
                .or(failure.and_then(|f| f.exit_code)),
            failure_kind: failure.map(|f| f.kind.as_str().to_string()),
            reason: end.map(|h| h.reason.clone()),
            pod_gone: pod.is_none(),
        };
        rows.insert(n, row);
    }
    // What the operator recorded per attempt wins over what was pieced together.
    for record in &status.attempts {
        let pod = pods.iter().find(|p| p.attempt == record.attempt);
        let row = rows.entry(record.attempt).or_default();
        *row = AttemptRow {
            attempt: record.attempt,
            pod: record.pod.clone(),
            node: record.node.clone().or(row.node.clone()),
            scheduled: Some(record.scheduled_at),
            started: record.started_at.or(row.started),
            finished: record.finished_at.or(row.finished),
            outcome: record
                .outcome
                .map(|o| o.to_string())
                .or(row.outcome.clone()),
            exit_code: record.exit_code.or(row.exit_code),
            failure_kind: record
                .failure_kind
                .map(|k| k.as_str().to_string())
                .or(row.failure_kind.clone()),
            reason: record.reason.clone().or(row.reason.clone()),
            pod_gone: pod.is_none(),
        };
    }
    rows.into_values().collect()
}

/// Why a task that has not finished is not running right now: the queue's reason, the time of
/// the next attempt, an old worker still terminating.
pub fn waiting(task: &AxTask, now: Timestamp) -> Vec<(&'static str, String)> {
    let status = task.status.clone().unwrap_or_default();
    let mut lines = Vec::new();
    if status.phase.is_some_and(TaskPhase::is_terminal) {
        return lines;
    }
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if status.phase.is_none_or(|p| p == TaskPhase::Pending) {
        if let Some(q) = status.condition(conditions::QUEUED) {
            let message = if q.message.is_empty() {
                String::new()
            } else {
                format!(": {}", q.message)
            };
            lines.push(("Waiting", format!("{}{message}", q.reason)));
        }
        if let Some(next) = status.next_attempt_at {
            lines.push((
                "Next attempt",
                format!("{} ({})", time(next), relative(now, next)),
            ));
        }
    }
    if let Some(c) = condition(conditions::WORKER_TERMINATING) {
        lines.push(("Blocked", format!("WorkerTerminating: {}", c.message)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::fixtures::dead_task;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn attempts_are_rebuilt_from_history_and_pods() {
        let task = dead_task(serde_json::json!([]));
        let pods = [PodInfo {
            attempt: 2,
            name: "flaky-2".into(),
            node: Some("localhost".into()),
            exit_code: Some(1),
            ..PodInfo::default()
        }];
        let rows = attempt_rows(&task, &pods);
        assert_eq!(rows.len(), 2);
        let first = &rows[0];
        assert_eq!(first.attempt, 1);
        assert_eq!(first.pod, "flaky-1");
        assert!(first.pod_gone);
        assert_eq!(first.outcome.as_deref(), Some("Failed"));
        assert_eq!(first.started, Some(at("2025-01-01T00:00:02Z")));
        assert_eq!(first.finished, Some(at("2025-01-01T00:00:04Z")));
        assert_eq!(
            first.exit_code, None,
            "pod gone, and lastFailure is attempt 2"
        );
        let second = &rows[1];
        assert_eq!(
            (second.exit_code, second.failure_kind.as_deref()),
            (Some(1), Some("Retryable"))
        );
        assert_eq!(second.node.as_deref(), Some("localhost"));
        assert!(!second.pod_gone);
    }

    #[test]
    fn recorded_attempts_win_over_rebuilt_ones() {
        let task = dead_task(serde_json::json!([
            {"attempt": 1, "pod": "flaky-1", "node": "ax-sim-0",
             "scheduledAt": "2025-01-01T00:00:01Z", "startedAt": "2025-01-01T00:00:02Z",
             "finishedAt": "2025-01-01T00:00:04Z", "outcome": "Failed", "exitCode": 3,
             "failureKind": "Retryable", "reason": "ExitCode"}
        ]));
        let rows = attempt_rows(&task, &[]);
        assert_eq!(rows[0].node.as_deref(), Some("ax-sim-0"));
        assert_eq!(rows[0].exit_code, Some(3));
        assert_eq!(rows[0].failure_kind.as_deref(), Some("Retryable"));
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn a_pending_task_says_why_it_waits_and_when_it_runs_next() {
        let task: AxTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t"},
            "spec": {"type": "x", "template": {}},
            "status": {"phase": "Pending", "attempt": 1,
                       "nextAttemptAt": "2025-01-01T00:00:30Z",
                       "conditions": [
                           {"type": "Queued", "status": "True", "reason": "ConcurrencyLimit",
                            "message": "10 of 10 in use", "lastTransitionTime": "2025-01-01T00:00:00Z"},
                           {"type": "WorkerTerminating", "status": "True", "reason": "WorkerTerminating",
                            "message": "t-1 is terminating", "lastTransitionTime": "2025-01-01T00:00:00Z"}
                       ]}
        }))
        .unwrap();
        let lines = waiting(&task, at("2025-01-01T00:00:10Z"));
        assert_eq!(
            lines,
            vec![
                ("Waiting", "ConcurrencyLimit: 10 of 10 in use".to_string()),
                ("Next attempt", "2025-01-01T00:00:30Z (in 20s)".to_string()),
                (
                    "Blocked",
                    "WorkerTerminating: t-1 is terminating".to_string()
                ),
            ]
        );
    }

    #[test]
    fn pods_report_their_attempt_and_main_container_exit() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t-3", "labels": {"ax.dev/task": "t", "ax.dev/attempt": "3"},
                         "annotations": {"ax.dev/main-container": "main"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "sidecar"}, {"name": "main"}]},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "sidecar", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"terminated": {"exitCode": 0}}},
                {"name": "main", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                 "state": {"terminated": {"exitCode": 7, "startedAt": "2025-01-01T00:00:00Z",
                                           "finishedAt": "2025-01-01T00:00:05Z"}}}
            ]}
        }))
        .unwrap();
        let info = pod_info(&pod).unwrap();
        assert_eq!(info.attempt, 3);
        assert_eq!(info.exit_code, Some(7));
        assert_eq!(info.node.as_deref(), Some("n1"));
        assert_eq!(info.finished, Some(at("2025-01-01T00:00:05Z")));
        let mut unlabelled = pod.clone();
        unlabelled.metadata.labels = None;
        assert_eq!(pod_info(&unlabelled), None);
    }
}

/// A task as the front ends' tests read it: Dead after two attempts, with its whole history.
#[cfg(test)]
pub mod fixtures {
    use crate::api::AxTask;

    pub fn dead_task(attempts: serde_json::Value) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "flaky", "namespace": "team-a",
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"type": "flaky", "retry": {"maxRetries": 1},
                     "template": {"spec": {"containers": []}}},
            "status": {
                "phase": "Dead", "attempt": 2, "retries": 1, "reason": "RetriesExhausted",
                "worker": "flaky-2", "node": "localhost",
                "deadReason": "2 attempts failed",
                "lastFailure": {"attempt": 2, "kind": "Retryable", "exitCode": 1, "reason": "ExitCode"},
                "finishedAt": "2025-01-01T00:00:09Z",
                "history": [
                    {"time": "2025-01-01T00:00:00Z", "to": "Pending", "attempt": 0, "reason": "Queued", "actor": "ax-operator/a"},
                    {"time": "2025-01-01T00:00:01Z", "from": "Pending", "to": "Scheduled", "attempt": 1, "reason": "Dispatched", "actor": "ax-operator/a"},
                    {"time": "2025-01-01T00:00:02Z", "from": "Scheduled", "to": "Running", "attempt": 1, "reason": "Started", "actor": "ax-operator/a"},
                    {"time": "2025-01-01T00:00:04Z", "from": "Running", "to": "Failed", "attempt": 1, "reason": "ExitCode", "message": "exit code 1", "actor": "worker"},
                    {"time": "2025-01-01T00:00:04Z", "from": "Failed", "to": "Pending", "attempt": 1, "reason": "Backoff", "actor": "ax-operator/a"},
                    {"time": "2025-01-01T00:00:06Z", "from": "Pending", "to": "Scheduled", "attempt": 2, "reason": "Dispatched", "actor": "ax-operator/a"},
                    {"time": "2025-01-01T00:00:07Z", "from": "Scheduled", "to": "Running", "attempt": 2, "reason": "Started", "actor": "ax-operator/a"},
                    {"time": "2025-01-01T00:00:09Z", "from": "Running", "to": "Failed", "attempt": 2, "reason": "ExitCode", "actor": "worker"},
                    {"time": "2025-01-01T00:00:09Z", "from": "Failed", "to": "Dead", "attempt": 2, "reason": "RetriesExhausted", "actor": "ax-operator/a"}
                ],
                "attempts": attempts,
            }
        }))
        .unwrap()
    }
}
