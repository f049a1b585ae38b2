//! `kubectl ax delete`: tasks by name, labels, or as finished ones of a given age (`--completed`,
//! `--older-than 24h`), and DAGs (`dag/NAME`, whose child tasks the garbage collector takes
//! with them). Which objects go is decided by `skip_reason` (pure); `run` reads, asks when more
//! than one matches, and deletes (client required). One line per object on stdout.

use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::DeleteParams;

use crate::api::{AxDag, AxTask};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::format::{human, parse_duration};
use crate::client::task::effective_phase;

use super::args::{DeleteArgs, DryRun};
use super::rerun::{Item, confirm, finish};
use super::target::{Kind, parse_targets};

/// Which objects `delete` takes, beyond the names or the label selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteFilter {
    /// Only finished objects.
    pub completed: bool,
    /// Only objects that finished more than this long ago (finished ones only).
    pub older_than: Option<SignedDuration>,
}

/// What `skip_reason` needs of a task or a DAG.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub phase: String,
    pub finished: bool,
    pub finished_at: Option<Timestamp>,
    pub created: Option<Timestamp>,
}

impl Candidate {
    pub fn of_task(task: &AxTask) -> Candidate {
        let phase = effective_phase(task);
        Candidate {
            phase: phase.to_string(),
            finished: phase.is_terminal(),
            finished_at: task.status.as_ref().and_then(|s| s.finished_at),
            created: task.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    pub fn of_dag(dag: &AxDag) -> Candidate {
        let status = dag.status.clone().unwrap_or_default();
        let phase = status.phase.unwrap_or_default();
        Candidate {
            phase: phase.to_string(),
            finished: phase.is_terminal(),
            finished_at: status.finished_at,
            created: dag.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }
}

/// Why the filter keeps an object, or None when it is deleted. The age of a finished object
/// counts from `status.finishedAt`, else (a status written before that field) from its
/// creation, which is earlier still.
pub fn skip_reason(filter: &DeleteFilter, c: &Candidate, now: Timestamp) -> Option<String> {
    if (filter.completed || filter.older_than.is_some()) && !c.finished {
        return Some(format!("not finished ({})", c.phase));
    }
    let min_age = filter.older_than?;
    let Some(since) = c.finished_at.or(c.created) else {
        return Some("finished at an unknown time".into());
    };
    let age = now.duration_since(since);
    (age < min_age).then(|| {
        format!(
            "finished {} ago, not more than {}",
            human(age),
            human(min_age)
        )
    })
}

/// What the filter looks at of an object.
fn candidate(item: &Item) -> Candidate {
    match item {
        Item::Task(t) => Candidate::of_task(t),
        Item::Dag(d) => Candidate::of_dag(d),
    }
}

pub async fn run(ctx: &Ctx, args: &DeleteArgs) -> Result<(), ClientError> {
    let targets = parse_targets(&args.targets)?;
    let filter = DeleteFilter {
        completed: args.completed,
        older_than: match &args.older_than {
            Some(text) => Some(
                SignedDuration::try_from(parse_duration("older-than", text)?)
                    .map_err(|e| ClientError::Usage(format!("--older-than {text:?}: {e}")))?,
            ),
            None => None,
        },
    };
    let by_filter = args.selector.is_some() || filter != DeleteFilter::default();
    if targets.is_empty() && !by_filter {
        return Err(ClientError::Usage(
            "name what to delete (NAME..., dag/NAME), or select tasks with -l SELECTOR, --completed or --older-than DURATION".into(),
        ));
    }
    if !targets.is_empty() && args.selector.is_some() {
        return Err(ClientError::Usage(
            "names and -l SELECTOR exclude each other, as for kubectl delete".into(),
        ));
    }
    if !targets.is_empty() && ctx.global.all_namespaces {
        return Err(ClientError::Usage(
            "names need one namespace: use -n NAMESPACE, or -A with -l/--completed/--older-than only".into(),
        ));
    }
    let now = Timestamp::now();
    let all = ctx.global.all_namespaces;
    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    let mut items = Vec::new();
    if targets.is_empty() {
        // Selected: what the filter keeps is not part of the request, and not mentioned.
        let mut tasks: Vec<AxTask> = ctx
            .list_tasks(args.selector.as_deref())
            .await?
            .items
            .into_iter()
            .filter(|t| skip_reason(&filter, &Candidate::of_task(t), now).is_none())
            .collect();
        super::list::sort_tasks(&mut tasks);
        items.extend(tasks.into_iter().map(Item::Task));
    }
    for target in &targets {
        let read = match target.kind {
            Kind::Task => ctx.get_task(&target.name).await.map(Item::Task),
            Kind::Dag => ctx.get_dag(&target.name).await.map(Item::Dag),
        };
        match read {
            // Named and kept by the filter: said, not an error (the filter asked for it).
            Ok(item) => match skip_reason(&filter, &candidate(&item), now) {
                Some(why) => skipped.push(format!("{}: {why}, skipped", item.label(all))),
                None => items.push(item),
            },
            Err(e @ ClientError::NotFound { .. }) => failures.push(e),
            Err(e) => return Err(e),
        }
    }
    for line in &skipped {
        println!("{line}");
    }
    let total = items.len() + failures.len();
    if total == 0 {
        if skipped.is_empty() {
            println!("nothing to delete: no task matches");
        }
        return Ok(());
    }
    if items.len() > 1 && !args.yes && !args.dry_run.is_dry() {
        let scope = match ctx.list_namespace() {
            Some(ns) => format!("in namespace \"{ns}\""),
            None => "in all namespaces".into(),
        };
        let n = items.len();
        if !confirm(&format!("Delete {n} objects {scope}?"))? {
            return Err(ClientError::Usage(format!(
                "not deleted: {n} objects match and the answer was not yes (--yes deletes without asking)"
            )));
        }
    }
    let params = DeleteParams {
        dry_run: args.dry_run == DryRun::Server,
        ..DeleteParams::default()
    };
    for item in &items {
        let label = item.label(all);
        let result = if args.dry_run == DryRun::Client {
            Ok(())
        } else {
            let (resource, name, ns) = match item {
                Item::Task(t) => (Resource::Task, t.name_any(), t.namespace()),
                Item::Dag(d) => (Resource::Dag, d.name_any(), d.namespace()),
            };
            let ns = ns.unwrap_or_else(|| ctx.namespace.clone());
            let op = Op::new("delete", resource).namespace(Some(&ns)).name(&name);
            let deleted = match item {
                Item::Task(_) => ctx
                    .tasks(Some(&ns))
                    .delete(&name, &params)
                    .await
                    .map(|_| ()),
                Item::Dag(_) => ctx.dags(Some(&ns)).delete(&name, &params).await.map(|_| ()),
            };
            deleted.map_err(|e| from_kube(&op, e))
        };
        match result {
            Ok(()) => println!("{label} deleted{}", args.dry_run.note()),
            Err(e) => failures.push(e),
        }
    }
    finish(failures, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn task(phase: Option<&str>, finished_at: Option<&str>) -> AxTask {
        let mut status = serde_json::json!({});
        if let Some(p) = phase {
            status["phase"] = p.into();
        }
        if let Some(f) = finished_at {
            status["finishedAt"] = f.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"type": "x", "template": {}},
            "status": status,
        }))
        .unwrap()
    }

    fn filter(completed: bool, older_than: Option<&str>) -> DeleteFilter {
        DeleteFilter {
            completed,
            older_than: older_than.map(|d| d.parse().unwrap()),
        }
    }

    #[test]
    fn completed_takes_only_finished_tasks() {
        let now = at("2025-01-02T00:00:00Z");
        for phase in ["Succeeded", "Dead", "Canceled"] {
            let c = Candidate::of_task(&task(Some(phase), None));
            assert_eq!(skip_reason(&filter(true, None), &c, now), None, "{phase}");
        }
        for phase in [None, Some("Running"), Some("Failed"), Some("Pending")] {
            let c = Candidate::of_task(&task(phase, None));
            let why = skip_reason(&filter(true, None), &c, now).unwrap();
            assert!(why.starts_with("not finished"), "{phase:?}: {why}");
        }
        // No filter: everything named or selected goes, finished or not.
        let running = Candidate::of_task(&task(Some("Running"), None));
        assert_eq!(skip_reason(&DeleteFilter::default(), &running, now), None);
    }

    #[test]
    fn older_than_counts_from_finished_at_else_creation() {
        let now = at("2025-01-02T12:00:00Z");
        let day = filter(false, Some("24h"));
        let long_ago = Candidate::of_task(&task(Some("Dead"), Some("2025-01-01T06:00:00Z")));
        assert_eq!(skip_reason(&day, &long_ago, now), None);
        let recent = Candidate::of_task(&task(Some("Dead"), Some("2025-01-02T06:00:00Z")));
        assert_eq!(
            skip_reason(&day, &recent, now).as_deref(),
            Some("finished 6h ago, not more than 24h")
        );
        // No finishedAt: created 36h ago, so finished at least that long ago.
        let no_time = Candidate::of_task(&task(Some("Succeeded"), None));
        assert_eq!(skip_reason(&day, &no_time, now), None);
        // Old but unfinished: never taken by age.
        let running = Candidate::of_task(&task(Some("Running"), None));
        assert!(skip_reason(&day, &running, now).is_some());
    }

    #[test]
    fn dags_are_judged_by_their_own_phase() {
        let dag: AxDag = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "d"},
            "spec": {"tasks": []},
            "status": {"phase": "Failed", "finishedAt": "2025-01-01T00:00:00Z"},
        }))
        .unwrap();
        let c = Candidate::of_dag(&dag);
        assert!(c.finished);
        assert_eq!(
            skip_reason(&filter(true, Some("1h")), &c, at("2025-01-01T02:00:00Z")),
            None
        );
    }
}
