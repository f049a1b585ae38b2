//! The chaos soak's audit: from what the cluster recorded — every worker pod ever created and when
//! it ended, each task's final state, the operator's successful creates (the API server's audit
//! log), DAG children and cron firings — the violations of "one live worker, nothing lost". Pure:
//! no client, no clock.
//!
//! Instants are etcd revisions (the `resourceVersion` of a write): one total order over every
//! write of every object in the cluster's single etcd, so "pod B was created while pod A was still
//! running" is exact, whatever the lag of the watches that reported them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

/// An etcd revision: the `resourceVersion` of one write.
pub type Revision = u64;

/// `namespace/name`.
pub type Key = String;

/// How a worker pod stopped being live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum PodEnd {
    /// Its phase became Succeeded or Failed at this revision.
    Terminal { at: Revision },
    /// Its deletion was confirmed (the object is gone) at this revision.
    Deleted { at: Revision },
    /// It went missing while the watch was away: it was last seen live at `after`, and was gone
    /// by `by`.
    Vanished { after: Revision, by: Revision },
    /// Still live when the run ended.
    Live,
}

impl PodEnd {
    /// The pod was surely live up to (not including) this revision.
    fn live_until(&self) -> Revision {
        match *self {
            PodEnd::Terminal { at } | PodEnd::Deleted { at } => at,
            PodEnd::Vanished { after, .. } => after.saturating_add(1),
            PodEnd::Live => Revision::MAX,
        }
    }
}

/// One worker pod, from its creation to its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodLife {
    pub task: Key,
    pub pod: String,
    pub uid: String,
    pub attempt: u32,
    /// The first revision it was seen at (its creation, when the watch was there).
    pub created: Revision,
    pub end: PodEnd,
}

/// One attempt as the task's `status.attempts` records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttemptOutcome {
    pub attempt: u32,
    pub failure_kind: Option<String>,
    pub reason: Option<String>,
}

/// A task as it ended the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskOutcome {
    pub key: Key,
    /// `status.phase` at the end (`None`: never written).
    pub phase: Option<String>,
    /// The first revision at which it was seen in a terminal phase.
    pub terminal_at: Option<Revision>,
    pub attempts: Vec<AttemptOutcome>,
}

/// A worker the soak disrupted (evicted, force-deleted, its node deleted or stopped) while it ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Disruption {
    pub task: Key,
    pub attempt: u32,
    pub fault: String,
    /// The worker was made to fail on its own anyway (a retryable exit): its attempt may count.
    pub fails_anyway: bool,
}

/// What the operator created, per the audit log: successful creates of each object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Creates {
    /// `(resource, namespace/name)` → successful creates (HTTP 201).
    #[serde(serialize_with = "creates_as_rows")]
    pub counts: BTreeMap<(String, Key), u32>,
}

/// JSON keys are strings: the counts go out as `[resource, key, count]` rows.
fn creates_as_rows<S: serde::Serializer>(
    counts: &BTreeMap<(String, Key), u32>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(counts.iter().map(|((r, k), n)| (r, k, n)))
}

impl Creates {
    pub fn of(&self, resource: &str, key: &str) -> u32 {
        self.counts
            .get(&(resource.to_owned(), key.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

/// One AxTask a DAG created for one of its tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DagChild {
    pub dag: Key,
    pub child: Key,
    pub uid: String,
}

/// A DAG as it ended the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DagOutcome {
    pub key: Key,
    pub phase: Option<String>,
    /// The first revision at which it was seen in a terminal phase.
    pub terminal_at: Option<Revision>,
}

/// One child an AxCron created for a scheduled time (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CronFiring {
    pub cron: Key,
    pub scheduled: i64,
    pub child: Key,
    pub uid: String,
}

/// The scheduled times a cron must have fired for, each exactly once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CronExpectation {
    pub cron: Key,
    pub scheduled: Vec<i64>,
}

/// The infrastructure reasons (src/core/task/reason.rs): a failure for any of them is not the
/// worker's fault and must not count against `maxRetries`.
pub const INFRASTRUCTURE_REASONS: [&str; 9] = [
    "Evicted",
    "NodeLost",
    "NodeShutdown",
    "DisruptionTarget",
    "WorkerDeleted",
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
];

const TERMINAL_PHASES: [&str; 3] = ["Succeeded", "Dead", "Canceled"];
pub const DAG_TERMINAL_PHASES: [&str; 3] = ["Succeeded", "Failed", "Canceled"];
/// Failure kinds that count against `maxRetries`.
const CHARGED_KINDS: [&str; 2] = ["Retryable", "Timeout"];

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Input {
    pub pods: Vec<PodLife>,
    pub tasks: Vec<TaskOutcome>,
    pub dags: Vec<DagOutcome>,
    pub disruptions: Vec<Disruption>,
    pub creates: Creates,
    pub dag_children: Vec<DagChild>,
    pub cron_firings: Vec<CronFiring>,
    pub cron_expected: Vec<CronExpectation>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Overlap {
    pub task: Key,
    pub first: String,
    pub second: String,
    /// The revision at which both were live (the later creation).
    pub at: Revision,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TerminalWhileLive {
    pub task: Key,
    pub phase: String,
    pub terminal_at: Revision,
    pub pod: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DuplicateAttempt {
    pub task: Key,
    pub attempt: u32,
    /// Distinct pods (uids) seen for the attempt.
    pub pods_seen: usize,
    /// Successful creates of the attempt's pod name in the audit log.
    pub creates: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Charged {
    pub task: Key,
    pub attempt: u32,
    pub failure_kind: String,
    pub reason: String,
    /// The fault the soak injected into that attempt, if it was one.
    pub fault: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Twice {
    pub parent: Key,
    pub child: Key,
    pub seen: usize,
    pub creates: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Missed {
    pub cron: Key,
    pub scheduled: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub tasks: usize,
    pub pods: usize,
    pub terminal: usize,
    pub overlaps: Vec<Overlap>,
    pub not_terminal: Vec<(Key, Option<String>)>,
    pub terminal_while_live: Vec<TerminalWhileLive>,
    pub duplicate_attempts: Vec<DuplicateAttempt>,
    pub infrastructure_charged: Vec<Charged>,
    pub dag_children_twice: Vec<Twice>,
    pub cron_doubled: Vec<Twice>,
    pub cron_missed: Vec<Missed>,
    /// Pods whose end fell in a gap of the watch (not violations; their end is a bound).
    pub uncertain_ends: usize,
    /// DAG children seen, and the cron times that had to fire (what the zeros below stand on).
    pub dag_children: usize,
    pub cron_times_expected: usize,
}

impl Report {
    pub fn violations(&self) -> usize {
        self.overlaps.len()
            + self.not_terminal.len()
            + self.terminal_while_live.len()
            + self.duplicate_attempts.len()
            + self.infrastructure_charged.len()
            + self.dag_children_twice.len()
            + self.cron_doubled.len()
            + self.cron_missed.len()
    }
}

pub fn audit(input: &Input) -> Report {
    let mut pods_of: BTreeMap<&str, Vec<&PodLife>> = BTreeMap::new();
    for pod in &input.pods {
        pods_of.entry(&pod.task).or_default().push(pod);
    }
    let mut report = Report {
        tasks: input.tasks.len(),
        pods: input.pods.len(),
        uncertain_ends: input
            .pods
            .iter()
            .filter(|p| matches!(p.end, PodEnd::Vanished { .. }))
            .count(),
        dag_children: input.dag_children.len(),
        cron_times_expected: input.cron_expected.iter().map(|c| c.scheduled.len()).sum(),
        ..Report::default()
    };
    for (task, pods) in &pods_of {
        report.overlaps.extend(overlaps(task, pods));
        report
            .duplicate_attempts
            .extend(duplicate_attempts(task, pods, &input.creates));
    }
    // A task whose pods the audit log shows created twice but the watch saw once.
    let seen: BTreeSet<(String, u32)> = report
        .duplicate_attempts
        .iter()
        .map(|d| (d.task.clone(), d.attempt))
        .collect();
    for ((resource, key), &count) in &input.creates.counts {
        if resource != "pods" || count < 2 {
            continue;
        }
        let Some(pod) = input.pods.iter().find(|p| pod_key(p) == *key) else {
            continue;
        };
        if !seen.contains(&(pod.task.clone(), pod.attempt)) {
            report.duplicate_attempts.push(DuplicateAttempt {
                task: pod.task.clone(),
                attempt: pod.attempt,
                pods_seen: 1,
                creates: count,
            });
        }
    }
    for task in &input.tasks {
        let phase = task.phase.as_deref();
        let terminal = phase.is_some_and(|p| TERMINAL_PHASES.contains(&p));
        if terminal {
            report.terminal += 1;
        } else {
            report
                .not_terminal
                .push((task.key.clone(), task.phase.clone()));
        }
        if let Some(at) = task.terminal_at {
            for pod in pods_of.get(task.key.as_str()).into_iter().flatten() {
                if pod.end.live_until() > at {
                    report.terminal_while_live.push(TerminalWhileLive {
                        task: task.key.clone(),
                        phase: phase.unwrap_or_default().to_owned(),
                        terminal_at: at,
                        pod: pod.pod.clone(),
                    });
                }
            }
        }
        report
            .infrastructure_charged
            .extend(charged(task, &input.disruptions));
    }
    // A DAG is terminal only once none of its children's workers lives.
    for dag in &input.dags {
        let phase = dag.phase.as_deref();
        if !phase.is_some_and(|p| DAG_TERMINAL_PHASES.contains(&p)) {
            report
                .not_terminal
                .push((format!("AxDag {}", dag.key), dag.phase.clone()));
        }
        let Some(at) = dag.terminal_at else { continue };
        let children = input.dag_children.iter().filter(|c| c.dag == dag.key);
        for child in children {
            for pod in pods_of.get(child.child.as_str()).into_iter().flatten() {
                if pod.end.live_until() > at {
                    report.terminal_while_live.push(TerminalWhileLive {
                        task: format!("AxDag {}", dag.key),
                        phase: phase.unwrap_or_default().to_owned(),
                        terminal_at: at,
                        pod: pod.pod.clone(),
                    });
                }
            }
        }
    }
    report.dag_children_twice = twice(
        input
            .dag_children
            .iter()
            .map(|c| (&c.dag, &c.child, &c.uid)),
        &input.creates,
    );
    report.cron_doubled = twice(
        input
            .cron_firings
            .iter()
            .map(|f| (&f.cron, &f.child, &f.uid)),
        &input.creates,
    );
    // Two children for one scheduled time under different names count as doubled too.
    let mut by_time: BTreeMap<(&str, i64), BTreeSet<&str>> = BTreeMap::new();
    for f in &input.cron_firings {
        by_time
            .entry((&f.cron, f.scheduled))
            .or_default()
            .insert(&f.child);
    }
    for ((cron, scheduled), children) in &by_time {
        if children.len() > 1 {
            report.cron_doubled.push(Twice {
                parent: (*cron).to_owned(),
                child: format!(
                    "{} children for {scheduled}: {}",
                    children.len(),
                    children.iter().copied().collect::<Vec<_>>().join(", ")
                ),
                seen: children.len(),
                creates: 0,
            });
        }
    }
    for expected in &input.cron_expected {
        for &scheduled in &expected.scheduled {
            if !by_time.contains_key(&(expected.cron.as_str(), scheduled)) {
                report.cron_missed.push(Missed {
                    cron: expected.cron.clone(),
                    scheduled,
                });
            }
        }
    }
    report
}

fn pod_key(pod: &PodLife) -> String {
    let namespace = pod.task.split_once('/').map_or("", |(ns, _)| ns);
    format!("{namespace}/{}", pod.pod)
}

/// Every pair of the task's pods that were both live at one revision.
fn overlaps(task: &str, pods: &[&PodLife]) -> Vec<Overlap> {
    let mut sorted: Vec<&PodLife> = pods.to_vec();
    sorted.sort_by_key(|p| (p.created, p.uid.clone()));
    let mut found = Vec::new();
    for (i, second) in sorted.iter().enumerate() {
        for first in &sorted[..i] {
            // `first` was created no later; both live at `second.created` when first had not ended.
            if second.created < first.end.live_until() && second.created < second.end.live_until() {
                found.push(Overlap {
                    task: task.to_owned(),
                    first: first.pod.clone(),
                    second: second.pod.clone(),
                    at: second.created,
                });
            }
        }
    }
    found
}

fn duplicate_attempts(task: &str, pods: &[&PodLife], creates: &Creates) -> Vec<DuplicateAttempt> {
    let mut by_attempt: BTreeMap<u32, (BTreeSet<&str>, &PodLife)> = BTreeMap::new();
    for pod in pods {
        by_attempt
            .entry(pod.attempt)
            .or_insert_with(|| (BTreeSet::new(), pod))
            .0
            .insert(&pod.uid);
    }
    by_attempt
        .into_iter()
        .filter_map(|(attempt, (uids, pod))| {
            let created = creates.of("pods", &pod_key(pod));
            (uids.len() > 1 || created > 1).then(|| DuplicateAttempt {
                task: task.to_owned(),
                attempt,
                pods_seen: uids.len(),
                creates: created,
            })
        })
        .collect()
}

/// Attempts of `task` that failed for an infrastructure reason, or that the soak disrupted, yet
/// count against `maxRetries`.
fn charged(task: &TaskOutcome, disruptions: &[Disruption]) -> Vec<Charged> {
    task.attempts
        .iter()
        .filter_map(|a| {
            let kind = a.failure_kind.as_deref()?;
            if !CHARGED_KINDS.contains(&kind) {
                return None;
            }
            let reason = a.reason.clone().unwrap_or_default();
            let disruption = disruptions
                .iter()
                .find(|d| d.task == task.key && d.attempt == a.attempt && !d.fails_anyway);
            let infrastructure = INFRASTRUCTURE_REASONS.contains(&reason.as_str());
            // A disrupted worker may still run into its own hard timeout: that one is the user's.
            let disrupted_and_charged = disruption.is_some() && kind == "Retryable";
            (infrastructure || disrupted_and_charged).then(|| Charged {
                task: task.key.clone(),
                attempt: a.attempt,
                failure_kind: kind.to_owned(),
                reason,
                fault: disruption.map(|d| d.fault.clone()),
            })
        })
        .collect()
}

/// Children (by name) created more than once: more than one uid seen, or more than one
/// successful create in the audit log.
fn twice<'a>(
    children: impl Iterator<Item = (&'a Key, &'a Key, &'a String)>,
    creates: &Creates,
) -> Vec<Twice> {
    let mut uids: BTreeMap<(&Key, &Key), BTreeSet<&String>> = BTreeMap::new();
    for (parent, child, uid) in children {
        uids.entry((parent, child)).or_default().insert(uid);
    }
    uids.into_iter()
        .filter_map(|((parent, child), uids)| {
            let created = creates
                .of("axtasks", child)
                .max(creates.of("axdags", child));
            (uids.len() > 1 || created > 1).then(|| Twice {
                parent: parent.clone(),
                child: child.clone(),
                seen: uids.len(),
                creates: created,
            })
        })
        .collect()
}

/// The report as text: the figures, then every violation by name.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "audit: {} tasks ({} DAG children), {} worker pods, {} terminal; {} cron times due; {} pod \
         ends fell in a watch gap",
        report.tasks,
        report.dag_children,
        report.pods,
        report.terminal,
        report.cron_times_expected,
        report.uncertain_ends
    );
    let rows: [(&str, usize); 8] = [
        ("live-worker overlaps", report.overlaps.len()),
        ("tasks not terminal at the end", report.not_terminal.len()),
        (
            "tasks terminal while a pod was live",
            report.terminal_while_live.len(),
        ),
        (
            "duplicate pods of one attempt",
            report.duplicate_attempts.len(),
        ),
        (
            "infrastructure faults charged to maxRetries",
            report.infrastructure_charged.len(),
        ),
        (
            "DAG children created twice",
            report.dag_children_twice.len(),
        ),
        ("cron firings doubled", report.cron_doubled.len()),
        ("cron firings missed", report.cron_missed.len()),
    ];
    for (what, count) in rows {
        let _ = writeln!(
            out,
            "  {what:<46} {count:>6}{}",
            if count == 0 { "" } else { "  VIOLATION" }
        );
    }
    const SHOWN: usize = 50;
    let mut list = |title: &str, lines: Vec<String>| {
        if lines.is_empty() {
            return;
        }
        let _ = writeln!(out, "{title}:");
        for line in lines.iter().take(SHOWN) {
            let _ = writeln!(out, "  {line}");
        }
        if lines.len() > SHOWN {
            let _ = writeln!(out, "  … and {} more", lines.len() - SHOWN);
        }
    };
    list(
        "live-worker overlaps",
        report
            .overlaps
            .iter()
            .map(|o| {
                format!(
                    "{}: {} still live when {} was created (revision {})",
                    o.task, o.first, o.second, o.at
                )
            })
            .collect(),
    );
    list(
        "tasks not terminal at the end",
        report
            .not_terminal
            .iter()
            .map(|(k, p)| format!("{k}: {}", p.as_deref().unwrap_or("no status")))
            .collect(),
    );
    list(
        "tasks terminal while a pod was live",
        report
            .terminal_while_live
            .iter()
            .map(|t| {
                format!(
                    "{}: {} at revision {} while {} was live",
                    t.task, t.phase, t.terminal_at, t.pod
                )
            })
            .collect(),
    );
    list(
        "duplicate pods of one attempt",
        report
            .duplicate_attempts
            .iter()
            .map(|d| {
                format!(
                    "{} attempt {}: {} pods seen, {} creates in the audit log",
                    d.task, d.attempt, d.pods_seen, d.creates
                )
            })
            .collect(),
    );
    list(
        "infrastructure faults charged to maxRetries",
        report
            .infrastructure_charged
            .iter()
            .map(|c| {
                format!(
                    "{} attempt {}: {} ({}){}",
                    c.task,
                    c.attempt,
                    c.failure_kind,
                    c.reason,
                    c.fault
                        .as_deref()
                        .map(|f| format!(" after fault {f}"))
                        .unwrap_or_default()
                )
            })
            .collect(),
    );
    let twice_line = |t: &Twice| {
        format!(
            "{}: {} ({} uids seen, {} creates in the audit log)",
            t.parent, t.child, t.seen, t.creates
        )
    };
    list(
        "DAG children created twice",
        report.dag_children_twice.iter().map(twice_line).collect(),
    );
    list(
        "cron firings doubled",
        report.cron_doubled.iter().map(twice_line).collect(),
    );
    list(
        "cron firings missed",
        report
            .cron_missed
            .iter()
            .map(|m| format!("{}: scheduled time {}", m.cron, m.scheduled))
            .collect(),
    );
    let _ = writeln!(out, "{} violation(s)", report.violations());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pod(task: &str, attempt: u32, created: Revision, end: PodEnd) -> PodLife {
        PodLife {
            task: format!("ns/{task}"),
            pod: format!("{task}-{attempt}"),
            uid: format!("uid-{task}-{attempt}-{created}"),
            attempt,
            created,
            end,
        }
    }

    fn task(name: &str, phase: &str, terminal_at: Option<Revision>) -> TaskOutcome {
        TaskOutcome {
            key: format!("ns/{name}"),
            phase: Some(phase.into()),
            terminal_at,
            attempts: Vec::new(),
        }
    }

    fn attempt(n: u32, kind: &str, reason: &str) -> AttemptOutcome {
        AttemptOutcome {
            attempt: n,
            failure_kind: Some(kind.into()),
            reason: Some(reason.into()),
        }
    }

    #[test]
    fn the_input_and_the_report_serialize_to_json() {
        let mut creates = Creates::default();
        creates.counts.insert(("pods".into(), "ns/t-1".into()), 2);
        let input = Input {
            pods: vec![pod("t", 1, 10, PodEnd::Live)],
            creates,
            ..Input::default()
        };
        let json = serde_json::to_value(&input).expect("the input as JSON");
        assert_eq!(
            json["creates"]["counts"][0],
            serde_json::json!(["pods", "ns/t-1", 2])
        );
        serde_json::to_value(audit(&input)).expect("the report as JSON");
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let input = Input {
            pods: vec![
                pod("t", 1, 10, PodEnd::Terminal { at: 20 }),
                pod("t", 2, 25, PodEnd::Terminal { at: 30 }),
            ],
            tasks: vec![TaskOutcome {
                attempts: vec![attempt(1, "Retryable", "ExitCode")],
                ..task("t", "Succeeded", Some(31))
            }],
            ..Input::default()
        };
        let report = audit(&input);
        assert_eq!(report.violations(), 0, "{}", render(&report));
        assert_eq!(report.terminal, 1);
    }

    #[test]
    fn a_pod_created_before_the_previous_one_ended_is_an_overlap() {
        let input = Input {
            pods: vec![
                pod("t", 1, 10, PodEnd::Deleted { at: 30 }),
                pod("t", 2, 25, PodEnd::Terminal { at: 40 }),
                // Another task's pods never overlap this one's.
                pod("u", 1, 11, PodEnd::Live),
            ],
            tasks: vec![task("t", "Succeeded", Some(41))],
            ..Input::default()
        };
        let report = audit(&input);
        assert_eq!(
            report.overlaps,
            vec![Overlap {
                task: "ns/t".into(),
                first: "t-1".into(),
                second: "t-2".into(),
                at: 25
            }]
        );
    }

    #[test]
    fn a_pod_gone_in_a_watch_gap_overlaps_only_if_surely_live() {
        let gap = PodEnd::Vanished { after: 20, by: 50 };
        let later = Input {
            pods: vec![pod("t", 1, 10, gap.clone()), pod("t", 2, 30, PodEnd::Live)],
            ..Input::default()
        };
        let report = audit(&later);
        assert!(report.overlaps.is_empty());
        assert_eq!(report.uncertain_ends, 1);
        let during = Input {
            pods: vec![pod("t", 1, 10, gap), pod("t", 2, 15, PodEnd::Live)],
            ..Input::default()
        };
        assert_eq!(audit(&during).overlaps.len(), 1);
    }

    #[test]
    fn tasks_not_terminal_and_terminal_while_a_pod_lives_are_named() {
        let input = Input {
            pods: vec![
                pod("done", 1, 10, PodEnd::Deleted { at: 50 }),
                pod("stuck", 1, 11, PodEnd::Live),
            ],
            tasks: vec![
                task("done", "Canceled", Some(40)),
                task("stuck", "Running", None),
                TaskOutcome {
                    phase: None,
                    ..task("never", "", None)
                },
            ],
            ..Input::default()
        };
        let report = audit(&input);
        assert_eq!(
            report.not_terminal,
            vec![
                ("ns/stuck".into(), Some("Running".into())),
                ("ns/never".into(), None)
            ]
        );
        assert_eq!(
            report.terminal_while_live,
            vec![TerminalWhileLive {
                task: "ns/done".into(),
                phase: "Canceled".into(),
                terminal_at: 40,
                pod: "done-1".into()
            }]
        );
    }

    #[test]
    fn a_dag_terminal_while_a_childs_worker_lives_or_not_terminal_is_named() {
        let input = Input {
            pods: vec![
                pod("d-a", 1, 10, PodEnd::Deleted { at: 50 }),
                pod("e-a", 1, 10, PodEnd::Deleted { at: 20 }),
            ],
            dags: vec![
                DagOutcome {
                    key: "ns/d".into(),
                    phase: Some("Failed".into()),
                    terminal_at: Some(40),
                },
                DagOutcome {
                    key: "ns/e".into(),
                    phase: Some("Running".into()),
                    terminal_at: None,
                },
            ],
            dag_children: vec![
                DagChild {
                    dag: "ns/d".into(),
                    child: "ns/d-a".into(),
                    uid: "1".into(),
                },
                DagChild {
                    dag: "ns/e".into(),
                    child: "ns/e-a".into(),
                    uid: "2".into(),
                },
            ],
            ..Input::default()
        };
        let report = audit(&input);
        assert_eq!(
            report.not_terminal,
            vec![("AxDag ns/e".into(), Some("Running".into()))]
        );
        assert_eq!(report.terminal_while_live.len(), 1);
        assert_eq!(report.terminal_while_live[0].task, "AxDag ns/d");
        assert_eq!(report.terminal_while_live[0].pod, "d-a-1");
    }

    #[test]
    fn a_pod_created_after_its_task_was_terminal_is_a_pod_live_after_the_end() {
        let input = Input {
            pods: vec![
                pod("t", 1, 10, PodEnd::Terminal { at: 20 }),
                pod("t", 2, 30, PodEnd::Terminal { at: 35 }),
            ],
            tasks: vec![task("t", "Succeeded", Some(21))],
            ..Input::default()
        };
        let report = audit(&input);
        assert_eq!(report.terminal_while_live.len(), 1);
        assert_eq!(report.terminal_while_live[0].pod, "t-2");
    }

    #[test]
    fn two_pods_of_one_attempt_by_uid_or_by_the_audit_log_are_duplicates() {
        let mut recreated = pod("t", 1, 30, PodEnd::Terminal { at: 40 });
        recreated.uid = "other".into();
        let mut creates = Creates::default();
        creates.counts.insert(("pods".into(), "ns/u-1".into()), 2);
        let input = Input {
            pods: vec![
                pod("t", 1, 10, PodEnd::Deleted { at: 20 }),
                recreated,
                pod("u", 1, 10, PodEnd::Terminal { at: 20 }),
            ],
            creates,
            ..Input::default()
        };
        let report = audit(&input);
        assert_eq!(
            report.duplicate_attempts,
            vec![
                DuplicateAttempt {
                    task: "ns/t".into(),
                    attempt: 1,
                    pods_seen: 2,
                    creates: 0
                },
                DuplicateAttempt {
                    task: "ns/u".into(),
                    attempt: 1,
                    pods_seen: 1,
                    creates: 2
                },
            ]
        );
        assert!(report.overlaps.is_empty());
    }

    #[test]
    fn infrastructure_reasons_and_disrupted_workers_must_not_be_charged() {
        let disrupted = |task: &str, fails_anyway| Disruption {
            task: format!("ns/{task}"),
            attempt: 1,
            fault: "evict".into(),
            fails_anyway,
        };
        let input = Input {
            tasks: vec![
                TaskOutcome {
                    attempts: vec![
                        attempt(1, "Retryable", "Evicted"),
                        attempt(2, "Infrastructure", "WorkerDeleted"),
                        attempt(3, "Timeout", "HardTimeout"),
                    ],
                    ..task("a", "Succeeded", Some(1))
                },
                TaskOutcome {
                    attempts: vec![attempt(1, "Retryable", "ExitCode")],
                    ..task("b", "Succeeded", Some(1))
                },
                TaskOutcome {
                    attempts: vec![attempt(1, "Retryable", "ExitCode")],
                    ..task("c", "Succeeded", Some(1))
                },
                TaskOutcome {
                    attempts: vec![attempt(1, "Timeout", "HardTimeout")],
                    ..task("d", "Succeeded", Some(1))
                },
            ],
            disruptions: vec![
                disrupted("b", false),
                disrupted("c", true),
                disrupted("d", false),
            ],
            ..Input::default()
        };
        let report = audit(&input);
        let named: Vec<(&str, u32, Option<&str>)> = report
            .infrastructure_charged
            .iter()
            .map(|c| (c.task.as_str(), c.attempt, c.fault.as_deref()))
            .collect();
        assert_eq!(named, vec![("ns/a", 1, None), ("ns/b", 1, Some("evict"))]);
    }

    #[test]
    fn dag_children_and_cron_firings_made_twice_or_missed_are_found() {
        let child = |name: &str, uid: &str| DagChild {
            dag: "ns/d".into(),
            child: format!("ns/{name}"),
            uid: uid.into(),
        };
        let firing = |scheduled: i64, name: &str, uid: &str| CronFiring {
            cron: "ns/c".into(),
            scheduled,
            child: format!("ns/{name}"),
            uid: uid.into(),
        };
        let mut creates = Creates::default();
        creates
            .counts
            .insert(("axtasks".into(), "ns/d-b".into()), 2);
        let input = Input {
            dag_children: vec![
                child("d-a", "1"),
                child("d-a", "2"),
                child("d-b", "3"),
                child("d-c", "4"),
            ],
            cron_firings: vec![
                firing(60, "c-60", "5"),
                firing(120, "c-120", "6"),
                firing(120, "c-120", "7"),
                firing(180, "c-180", "8"),
                firing(180, "c-180x", "9"),
            ],
            cron_expected: vec![CronExpectation {
                cron: "ns/c".into(),
                scheduled: vec![60, 120, 180, 240],
            }],
            creates,
            ..Input::default()
        };
        let report = audit(&input);
        let twice: Vec<&str> = report
            .dag_children_twice
            .iter()
            .map(|t| t.child.as_str())
            .collect();
        assert_eq!(twice, vec!["ns/d-a", "ns/d-b"]);
        assert_eq!(report.cron_doubled.len(), 2, "{:?}", report.cron_doubled);
        assert_eq!(
            report.cron_missed,
            vec![Missed {
                cron: "ns/c".into(),
                scheduled: 240
            }]
        );
        assert_eq!((report.dag_children, report.cron_times_expected), (4, 4));
        assert!(render(&report).contains("VIOLATION"));
    }

    /// Live at revision `r`: created at or before it and not yet ended.
    fn live_at(pod: &PodLife, r: Revision) -> bool {
        pod.created <= r && r < pod.end.live_until()
    }

    fn end_strategy() -> impl Strategy<Value = Option<u64>> {
        prop_oneof![1 => Just(None), 4 => (1u64..40).prop_map(Some)]
    }

    proptest! {
        /// The overlaps found are exactly the pairs a brute-force scan over every revision finds.
        #[test]
        fn overlaps_match_a_scan_of_every_revision(
            lives in prop::collection::vec((0u64..60, end_strategy()), 0..6)
        ) {
            let pods: Vec<PodLife> = lives
                .iter()
                .enumerate()
                .map(|(i, &(created, length))| {
                    let end = match length {
                        None => PodEnd::Live,
                        Some(l) => PodEnd::Deleted { at: created + l },
                    };
                    let mut p = pod("t", i as u32 + 1, created, end);
                    p.uid = format!("u{i}");
                    p
                })
                .collect();
            let report = audit(&Input { pods: pods.clone(), ..Input::default() });
            let mut found: BTreeSet<(String, String)> = report
                .overlaps
                .iter()
                .map(|o| {
                    let (a, b) = (o.first.clone(), o.second.clone());
                    if a < b { (a, b) } else { (b, a) }
                })
                .collect();
            for i in 0..pods.len() {
                for j in i + 1..pods.len() {
                    let both = (0..200).any(|r| live_at(&pods[i], r) && live_at(&pods[j], r));
                    let pair = {
                        let (a, b) = (pods[i].pod.clone(), pods[j].pod.clone());
                        if a < b { (a, b) } else { (b, a) }
                    };
                    prop_assert_eq!(both, found.remove(&pair), "{:?} {:?}", pods[i], pods[j]);
                }
            }
            prop_assert!(found.is_empty());
        }

        /// Attempts run one after another, each pod created after the previous one ended, and the
        /// task terminal after the last: never a violation, whatever the gaps.
        #[test]
        fn sequential_attempts_are_clean(
            steps in prop::collection::vec((1u64..5, 1u64..20), 1..8),
            deleted in prop::collection::vec(any::<bool>(), 8),
        ) {
            let mut at = 1;
            let mut pods = Vec::new();
            for (i, &(gap, length)) in steps.iter().enumerate() {
                let created = at + gap;
                let ended = created + length;
                let end = if deleted[i] {
                    PodEnd::Deleted { at: ended }
                } else {
                    PodEnd::Terminal { at: ended }
                };
                pods.push(pod("t", i as u32 + 1, created, end));
                at = ended;
            }
            let input = Input {
                pods,
                tasks: vec![task("t", "Succeeded", Some(at + 1))],
                ..Input::default()
            };
            let report = audit(&input);
            prop_assert_eq!(report.violations(), 0, "{}", render(&report));
        }
    }
}
