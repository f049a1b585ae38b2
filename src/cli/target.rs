//! What a command acts on (no client required): `NAME`, `dag/NAME`, `axtask.ax.dev/NAME` targets,
//! and the `--phase/--type/--queue` filters applied to tasks read from the API server.

use crate::api::{AxTask, TaskPhase};
use crate::client::error::ClientError;
use crate::client::task::{ALL_PHASES, effective_phase};

/// A kind of object a target names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Task,
    Dag,
}

/// One object named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: Kind,
    pub name: String,
}

impl Target {
    /// `axtask/NAME` or `axdag/NAME`, as printed in results.
    pub fn display(&self) -> String {
        match self.kind {
            Kind::Task => format!("axtask/{}", self.name),
            Kind::Dag => format!("axdag/{}", self.name),
        }
    }
}

/// A kind of ax object named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnyKind {
    Task,
    Dag,
    Queue,
    Cron,
}

/// The kind `spelling` names, in any spelling kubectl accepts for it: singular, plural, short
/// name, with or without `.ax.dev`, any case.
pub fn kind_named(spelling: &str) -> Option<AnyKind> {
    let lower = spelling.to_ascii_lowercase();
    Some(match lower.strip_suffix(".ax.dev").unwrap_or(&lower) {
        "axtask" | "axtasks" | "axt" | "task" | "tasks" => AnyKind::Task,
        "axdag" | "axdags" | "axd" | "dag" | "dags" => AnyKind::Dag,
        "axqueue" | "axqueues" | "axq" | "queue" | "queues" => AnyKind::Queue,
        "axcron" | "axcrons" | "axc" | "cron" | "crons" => AnyKind::Cron,
        _ => return None,
    })
}

/// `NAME` (a task), or `KIND/NAME` where KIND is any spelling kubectl accepts for AxTask or AxDag
/// ([`kind_named`]), so the output of `list -o name` can be fed back in.
pub fn parse_target(text: &str) -> Result<Target, ClientError> {
    let (kind, name) = match text.split_once('/') {
        None => (Kind::Task, text),
        Some((kind, name)) => {
            let kind = match kind_named(kind) {
                Some(AnyKind::Task) => Kind::Task,
                Some(AnyKind::Dag) => Kind::Dag,
                _ => {
                    return Err(ClientError::Usage(format!(
                        "{text:?}: unknown kind {:?} (use NAME for a task, or dag/NAME)",
                        kind.to_ascii_lowercase()
                    )));
                }
            };
            (kind, name)
        }
    };
    if name.is_empty() || name.contains('/') {
        return Err(ClientError::Usage(format!(
            "{text:?}: not a name (use NAME for a task, or dag/NAME)"
        )));
    }
    Ok(Target {
        kind,
        name: name.to_owned(),
    })
}

pub fn parse_targets(texts: &[String]) -> Result<Vec<Target>, ClientError> {
    texts.iter().map(|t| parse_target(t)).collect()
}

/// A phase name, case-insensitive.
pub fn parse_phase(text: &str) -> Result<TaskPhase, ClientError> {
    ALL_PHASES
        .iter()
        .copied()
        .find(|p| p.as_str().eq_ignore_ascii_case(text.trim()))
        .ok_or_else(|| {
            let names: Vec<&str> = ALL_PHASES.iter().map(|p| p.as_str()).collect();
            ClientError::Usage(format!(
                "--phase {text:?}: not a phase (one of {})",
                names.join(", ")
            ))
        })
}

pub fn parse_phases(texts: &[String]) -> Result<Vec<TaskPhase>, ClientError> {
    texts
        .iter()
        .filter(|t| !t.trim().is_empty())
        .map(|t| parse_phase(t))
        .collect()
}

/// Client-side filters: CRDs in Kubernetes 1.20 support no field selectors beyond the name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Empty = every phase.
    pub phases: Vec<TaskPhase>,
    pub task_type: Option<String>,
    pub queue: Option<String>,
}

impl TaskFilter {
    pub fn matches(&self, task: &AxTask) -> bool {
        (self.phases.is_empty() || self.phases.contains(&effective_phase(task)))
            && self
                .task_type
                .as_ref()
                .is_none_or(|t| *t == task.spec.task_type)
            && self.queue.as_ref().is_none_or(|q| *q == task.spec.queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(phase: Option<TaskPhase>, task_type: &str, queue: &str) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t", "namespace": "n"},
            "spec": {"type": task_type, "queue": queue, "template": {"spec": {"containers": []}}},
            "status": phase.map(|p| serde_json::json!({"phase": p.as_str()})).unwrap_or(serde_json::json!({})),
        }))
        .unwrap()
    }

    #[test]
    fn targets_accept_kubectl_spellings() {
        assert_eq!(
            parse_target("nightly").unwrap(),
            Target {
                kind: Kind::Task,
                name: "nightly".into()
            }
        );
        for t in ["axtask/x", "axt/x", "AxTask/x", "axtask.ax.dev/x", "task/x"] {
            assert_eq!(parse_target(t).unwrap().kind, Kind::Task, "{t}");
        }
        for t in ["dag/x", "axd/x", "axdag.ax.dev/x", "axdags/x"] {
            assert_eq!(parse_target(t).unwrap().kind, Kind::Dag, "{t}");
        }
        assert!(parse_target("pod/x").is_err());
        assert!(parse_target("dag/").is_err());
        assert!(parse_target("a/b/c").is_err());
        assert_eq!(parse_target("dag/d").unwrap().display(), "axdag/d");
    }

    #[test]
    fn phases_parse_case_insensitively_and_reject_unknown_ones() {
        assert_eq!(
            parse_phases(&["dead".into(), "Canceled".into()]).unwrap(),
            vec![TaskPhase::Dead, TaskPhase::Canceled]
        );
        let e = parse_phases(&["Finished".into()]).unwrap_err().to_string();
        assert!(e.contains("not a phase") && e.contains("Dead"), "{e}");
    }

    #[test]
    fn filters_combine_phase_type_and_queue() {
        let f = TaskFilter {
            phases: vec![TaskPhase::Dead],
            task_type: Some("report".into()),
            queue: None,
        };
        assert!(f.matches(&task(Some(TaskPhase::Dead), "report", "default")));
        assert!(!f.matches(&task(Some(TaskPhase::Running), "report", "default")));
        assert!(!f.matches(&task(Some(TaskPhase::Dead), "email", "default")));
        let by_queue = TaskFilter {
            queue: Some("batch".into()),
            ..TaskFilter::default()
        };
        assert!(by_queue.matches(&task(None, "x", "batch")));
        assert!(!by_queue.matches(&task(None, "x", "default")));
        // Not yet seen by the operator: Pending.
        let pending = TaskFilter {
            phases: vec![TaskPhase::Pending],
            ..TaskFilter::default()
        };
        assert!(pending.matches(&task(None, "x", "default")));
    }
}
