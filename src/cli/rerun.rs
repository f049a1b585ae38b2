//! `kubectl ax retry` and `kubectl ax cancel`: bulk requests written into the spec, which the
//! operator acts on (`spec.rerun` + 1, `spec.cancel: true`). What to do with each object is decided
//! by pure functions (`retry_decision`, `cancel_decision`, the patches); `retry`/`cancel` read and
//! patch (client required).
//!
//! A re-run patch carries the resourceVersion it was computed from, so the API server refuses it
//! (409) when the object changed in between; we then read it again and decide again. Two `retry`
//! runs at once therefore never turn into one increment counted twice: the second one sees the
//! first one's request and reports it instead of adding another.

use std::io::{BufRead, Write};

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{AxDag, AxTask, DagPhase, TaskPhase};

use super::args::{CancelArgs, RetryArgs};
use super::ctx::Ctx;
use super::error::{CliError, Op, Resource, from_kube};
use super::operator;
use super::target::{Kind, Target, TaskFilter, effective_phase, parse_phases, parse_targets};

/// Field manager of our patches, as `kubectl` records its own.
pub const FIELD_MANAGER: &str = "kubectl-ax";

/// A re-run attempt that meets a conflict this often gives up.
const MAX_CONFLICTS: usize = 10;

/// What `retry` does with one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Ask for a re-run: `spec.rerun` from `current` to `current + 1`.
    Rerun { current: i64, phase: String },
    /// A request is in the spec and the operator has not acted on it yet.
    AlreadyRequested { rerun: i64 },
    /// Not finished: a re-run applies to finished objects only.
    NotFinished { phase: String },
    /// A DAG that Succeeded: nothing failed, nothing to re-run.
    NothingFailed,
}

pub fn retry_decision_task(task: &AxTask) -> RetryDecision {
    let status = task.status.clone().unwrap_or_default();
    let phase = effective_phase(task);
    if task.spec.rerun > status.observed_rerun {
        return RetryDecision::AlreadyRequested {
            rerun: task.spec.rerun,
        };
    }
    if !phase.is_terminal() {
        return RetryDecision::NotFinished {
            phase: phase.to_string(),
        };
    }
    RetryDecision::Rerun {
        current: task.spec.rerun,
        phase: format!("{phase} after attempt {}", status.attempt),
    }
}

pub fn retry_decision_dag(dag: &AxDag) -> RetryDecision {
    let status = dag.status.clone().unwrap_or_default();
    if dag.spec.rerun > status.observed_rerun {
        return RetryDecision::AlreadyRequested {
            rerun: dag.spec.rerun,
        };
    }
    match status.phase.unwrap_or_default() {
        DagPhase::Succeeded => RetryDecision::NothingFailed,
        phase @ (DagPhase::Failed | DagPhase::Canceled) => RetryDecision::Rerun {
            current: dag.spec.rerun,
            phase: format!(
                "{phase}, {} finished",
                status.progress.unwrap_or_else(|| "?".into())
            ),
        },
        phase => RetryDecision::NotFinished {
            phase: phase.to_string(),
        },
    }
}

/// The re-run request: one more than what was read, conditional on the version read, and
/// `cancel: false` so a Canceled object can run again.
pub fn rerun_patch(current: i64, resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"rerun": current + 1, "cancel": false},
    })
}

/// What `cancel` does with one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelDecision {
    Cancel { phase: String },
    AlreadyRequested,
    AlreadyFinished { phase: String },
}

pub fn cancel_decision_task(task: &AxTask) -> CancelDecision {
    let phase = effective_phase(task);
    if phase.is_terminal() {
        CancelDecision::AlreadyFinished {
            phase: phase.to_string(),
        }
    } else if task.spec.cancel {
        CancelDecision::AlreadyRequested
    } else {
        CancelDecision::Cancel {
            phase: phase.to_string(),
        }
    }
}

pub fn cancel_decision_dag(dag: &AxDag) -> CancelDecision {
    let phase = dag
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or_default();
    if phase.is_terminal() {
        CancelDecision::AlreadyFinished {
            phase: phase.to_string(),
        }
    } else if dag.spec.cancel {
        CancelDecision::AlreadyRequested
    } else {
        CancelDecision::Cancel {
            phase: phase.to_string(),
        }
    }
}

pub fn cancel_patch() -> serde_json::Value {
    serde_json::json!({"spec": {"cancel": true}})
}

/// An object to act on, as read.
// Held in one list per run; boxing would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Item {
    Task(AxTask),
    Dag(AxDag),
}

impl Item {
    fn label(&self, all_namespaces: bool) -> String {
        let (kind, name, ns) = match self {
            Item::Task(t) => ("axtask", t.name_any(), t.namespace()),
            Item::Dag(d) => ("axdag", d.name_any(), d.namespace()),
        };
        match ns {
            Some(ns) if all_namespaces => format!("{kind}/{name} in {ns}"),
            _ => format!("{kind}/{name}"),
        }
    }
}

/// The objects named or selected; `explicit` ones that cannot be acted on are errors, selected
/// ones are skipped quietly (a selector matches whatever happens to be there).
struct Selection {
    items: Vec<(Item, bool)>,
    errors: Vec<CliError>,
}

async fn select(
    ctx: &Ctx,
    targets: &[Target],
    selector: Option<&str>,
    filter: Option<&TaskFilter>,
) -> Result<Selection, CliError> {
    if !targets.is_empty() && ctx.global.all_namespaces {
        return Err(CliError::Usage(
            "names need one namespace: use -n NAMESPACE, or -A with -l/--phase/--queue only".into(),
        ));
    }
    let mut selection = Selection {
        items: Vec::new(),
        errors: Vec::new(),
    };
    for target in targets {
        let read = match target.kind {
            Kind::Task => ctx.get_task(&target.name).await.map(Item::Task),
            Kind::Dag => ctx.get_dag(&target.name).await.map(Item::Dag),
        };
        match read {
            Ok(item) => selection.items.push((item, true)),
            Err(e @ CliError::NotFound { .. }) => selection.errors.push(e),
            Err(e) => return Err(e),
        }
    }
    if let Some(filter) = filter {
        let mut tasks: Vec<AxTask> = ctx
            .list_tasks(selector)
            .await?
            .items
            .into_iter()
            .filter(|t| filter.matches(t))
            .collect();
        super::list::sort_tasks(&mut tasks);
        let named: Vec<(Option<String>, String)> = selection
            .items
            .iter()
            .filter_map(|(i, _)| match i {
                Item::Task(t) => Some((t.namespace(), t.name_any())),
                Item::Dag(_) => None,
            })
            .collect();
        for t in tasks {
            if !named.contains(&(t.namespace(), t.name_any())) {
                selection.items.push((Item::Task(t), false));
            }
        }
    }
    Ok(selection)
}

fn patch_params(dry_run: bool) -> PatchParams {
    let mut params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    params.dry_run = dry_run;
    params
}

fn api_for<K>(ctx: &Ctx, object: &K) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    let ns = object.namespace().unwrap_or_else(|| ctx.namespace.clone());
    Api::namespaced(ctx.client.clone(), &ns)
}

/// Patches the re-run request, reading again and deciding again after each conflict.
async fn rerun<K>(
    ctx: &Ctx,
    resource: Resource,
    first: K,
    decide: fn(&K) -> RetryDecision,
    dry_run: bool,
) -> Result<(RetryDecision, i64), CliError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
{
    let api = api_for(ctx, &first);
    let name = first.name_any();
    let op = Op::new("patch", resource)
        .namespace(first.namespace().as_deref())
        .name(&name);
    let mut object = first;
    for _ in 0..MAX_CONFLICTS {
        let decision = decide(&object);
        let RetryDecision::Rerun { current, .. } = &decision else {
            return Ok((decision, 0));
        };
        let patch = rerun_patch(*current, &object.resource_version().unwrap_or_default());
        match api
            .patch(&name, &patch_params(dry_run), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok((decision.clone(), current + 1)),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let get = Op::new("get", resource)
                    .namespace(object.namespace().as_deref())
                    .name(&name);
                object = api.get(&name).await.map_err(|e| from_kube(&get, e))?;
            }
            Err(e) => return Err(from_kube(&op, e)),
        }
    }
    Err(CliError::NotMet(format!(
        "{} \"{name}\" kept changing: gave up after {MAX_CONFLICTS} conflicting writes",
        resource.singular()
    )))
}

/// The per-object report lines go to stdout, errors to stderr; a single failing target returns
/// its own error (one line), several return `Partial`.
fn finish(failures: Vec<CliError>, total: usize) -> Result<(), CliError> {
    if failures.is_empty() {
        return Ok(());
    }
    if total == 1 && failures.len() == 1 {
        return Err(failures.into_iter().next().expect("one failure"));
    }
    let failed = failures.len();
    for f in failures {
        eprintln!("error: {f}");
    }
    Err(CliError::Partial { failed, total })
}

pub async fn retry(ctx: &Ctx, args: &RetryArgs) -> Result<(), CliError> {
    let targets = parse_targets(&args.targets)?;
    let phases = parse_phases(&args.phase)?;
    if let Some(p) = phases.iter().find(|p| !p.is_terminal()) {
        return Err(CliError::Usage(format!(
            "--phase {p}: retry re-runs finished tasks only (Succeeded, Dead, Canceled)"
        )));
    }
    let by_selection = args.selector.is_some() || !phases.is_empty();
    if targets.is_empty() && !by_selection {
        return Err(CliError::Usage(
            "name the tasks to re-run (NAME..., dag/NAME), or select them with -l SELECTOR or --phase Dead".into(),
        ));
    }
    let filter = by_selection.then(|| TaskFilter {
        phases: if phases.is_empty() {
            // What failed; Succeeded tasks are re-run only when named or asked for by phase.
            vec![TaskPhase::Dead, TaskPhase::Canceled]
        } else {
            phases
        },
        ..TaskFilter::default()
    });
    let selection = select(ctx, &targets, args.selector.as_deref(), filter.as_ref()).await?;
    let total = selection.items.len() + selection.errors.len();
    let mut failures = selection.errors;
    let all = ctx.global.all_namespaces;
    if selection.items.is_empty() && failures.is_empty() {
        println!("nothing to re-run: no task matches");
        return Ok(());
    }
    let wants_patch = selection.items.iter().any(|(item, _)| {
        matches!(
            match item {
                Item::Task(t) => retry_decision_task(t),
                Item::Dag(d) => retry_decision_dag(d),
            },
            RetryDecision::Rerun { .. }
        )
    });
    if wants_patch && !args.dry_run {
        operator::check(ctx).await?;
    }
    let mut out = std::io::stdout().lock();
    for (item, explicit) in selection.items {
        let label = item.label(all);
        let result = match item {
            Item::Task(t) => rerun(ctx, Resource::Task, t, retry_decision_task, args.dry_run).await,
            Item::Dag(d) => rerun(ctx, Resource::Dag, d, retry_decision_dag, args.dry_run).await,
        };
        match result {
            Ok((RetryDecision::Rerun { phase, current }, next)) if args.dry_run => writeln!(
                out,
                "{label}: would be re-run (spec.rerun {current} -> {next}; {phase}) [server dry run]"
            )?,
            Ok((RetryDecision::Rerun { phase, .. }, next)) => writeln!(
                out,
                "{label}: re-run requested (spec.rerun {next}; was {phase})"
            )?,
            Ok((RetryDecision::AlreadyRequested { rerun }, _)) => writeln!(
                out,
                "{label}: a re-run is already requested (spec.rerun {rerun}, not started yet)"
            )?,
            Ok((RetryDecision::NotFinished { phase }, _)) => {
                let text =
                    format!("{label}: not finished ({phase}); retry re-runs finished tasks only");
                if explicit {
                    failures.push(CliError::NotMet(text));
                } else {
                    writeln!(out, "{text}: skipped")?;
                }
            }
            Ok((RetryDecision::NothingFailed, _)) => {
                writeln!(out, "{label}: Succeeded, nothing to re-run")?
            }
            Err(e) => failures.push(e),
        }
    }
    drop(out);
    finish(failures, total)
}

/// Asks on stderr, reads the answer from stdin; only `y`/`yes` confirms.
fn confirm(question: &str) -> Result<bool, CliError> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

pub async fn cancel(ctx: &Ctx, args: &CancelArgs) -> Result<(), CliError> {
    let targets = parse_targets(&args.targets)?;
    let by_selection = args.selector.is_some() || args.queue.is_some();
    if targets.is_empty() && !by_selection {
        return Err(CliError::Usage(
            "name the tasks to cancel (NAME..., dag/NAME), or select them with -l SELECTOR or --queue QUEUE".into(),
        ));
    }
    let filter = by_selection.then(|| TaskFilter {
        queue: args.queue.clone(),
        ..TaskFilter::default()
    });
    let mut selection = select(ctx, &targets, args.selector.as_deref(), filter.as_ref()).await?;
    // Selected tasks that already finished are not part of the request at all.
    selection.items.retain(|(item, explicit)| {
        *explicit
            || match item {
                Item::Task(t) => matches!(cancel_decision_task(t), CancelDecision::Cancel { .. }),
                Item::Dag(_) => true,
            }
    });
    let total = selection.items.len() + selection.errors.len();
    let mut failures = selection.errors;
    let all = ctx.global.all_namespaces;
    let to_cancel = selection
        .items
        .iter()
        .filter(|(item, _)| {
            matches!(
                match item {
                    Item::Task(t) => cancel_decision_task(t),
                    Item::Dag(d) => cancel_decision_dag(d),
                },
                CancelDecision::Cancel { .. }
            )
        })
        .count();
    if selection.items.is_empty() && failures.is_empty() {
        println!("nothing to cancel: no unfinished task matches");
        return Ok(());
    }
    if to_cancel > 1 && !args.yes && !args.dry_run {
        let scope = match ctx.list_namespace() {
            Some(ns) => format!("in namespace \"{ns}\""),
            None => "in all namespaces".into(),
        };
        if !confirm(&format!("Cancel {to_cancel} tasks {scope}?"))? {
            return Err(CliError::Usage(format!(
                "not canceled: {to_cancel} tasks match and the answer was not yes (--yes cancels without asking)"
            )));
        }
    }
    if to_cancel > 0 && !args.dry_run {
        operator::check(ctx).await?;
    }
    let params = patch_params(args.dry_run);
    let dry = if args.dry_run {
        " [server dry run]"
    } else {
        ""
    };
    let mut out = std::io::stdout().lock();
    for (item, _) in selection.items {
        let label = item.label(all);
        let (decision, result) = match &item {
            Item::Task(t) => {
                let d = cancel_decision_task(t);
                let r = if matches!(d, CancelDecision::Cancel { .. }) {
                    let op = Op::new("patch", Resource::Task)
                        .namespace(t.namespace().as_deref())
                        .name(&t.name_any());
                    api_for(ctx, t)
                        .patch(&t.name_any(), &params, &Patch::Merge(cancel_patch()))
                        .await
                        .map(|_| ())
                        .map_err(|e| from_kube(&op, e))
                } else {
                    Ok(())
                };
                (d, r)
            }
            Item::Dag(dag) => {
                let d = cancel_decision_dag(dag);
                let r = if matches!(d, CancelDecision::Cancel { .. }) {
                    let op = Op::new("patch", Resource::Dag)
                        .namespace(dag.namespace().as_deref())
                        .name(&dag.name_any());
                    api_for(ctx, dag)
                        .patch(&dag.name_any(), &params, &Patch::Merge(cancel_patch()))
                        .await
                        .map(|_| ())
                        .map_err(|e| from_kube(&op, e))
                } else {
                    Ok(())
                };
                (d, r)
            }
        };
        if let Err(e) = result {
            failures.push(e);
            continue;
        }
        match decision {
            CancelDecision::Cancel { phase } => {
                writeln!(out, "{label}: cancel requested (was {phase}){dry}")?
            }
            CancelDecision::AlreadyRequested => writeln!(out, "{label}: cancel already requested")?,
            CancelDecision::AlreadyFinished { phase } => {
                writeln!(out, "{label}: already {phase}, nothing to cancel")?
            }
        }
    }
    drop(out);
    finish(failures, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(phase: &str, rerun: i64, observed: i64, cancel: bool) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t", "namespace": "n", "resourceVersion": "42"},
            "spec": {"type": "x", "template": {}, "rerun": rerun, "cancel": cancel},
            "status": {"phase": phase, "attempt": 3, "observedRerun": observed},
        }))
        .unwrap()
    }

    fn dag(phase: &str, rerun: i64, observed: i64) -> AxDag {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "d", "namespace": "n"},
            "spec": {"tasks": [], "rerun": rerun},
            "status": {"phase": phase, "progress": "2/3", "observedRerun": observed},
        }))
        .unwrap()
    }

    #[test]
    fn finished_tasks_are_re_run_once_per_request() {
        for phase in ["Dead", "Canceled", "Succeeded"] {
            assert!(
                matches!(
                    retry_decision_task(&task(phase, 1, 1, false)),
                    RetryDecision::Rerun { current: 1, .. }
                ),
                "{phase}"
            );
        }
        assert_eq!(
            retry_decision_task(&task("Dead", 2, 1, false)),
            RetryDecision::AlreadyRequested { rerun: 2 },
            "a request the operator has not acted on is not doubled"
        );
        for phase in ["Pending", "Running", "Failed", "Scheduled"] {
            assert_eq!(
                retry_decision_task(&task(phase, 0, 0, false)),
                RetryDecision::NotFinished {
                    phase: phase.into()
                }
            );
        }
    }

    #[test]
    fn the_rerun_patch_is_conditional_and_uncancels() {
        assert_eq!(
            rerun_patch(4, "42"),
            serde_json::json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {"rerun": 5, "cancel": false},
            })
        );
    }

    #[test]
    fn dags_re_run_only_when_something_failed() {
        assert!(matches!(
            retry_decision_dag(&dag("Failed", 0, 0)),
            RetryDecision::Rerun { current: 0, .. }
        ));
        assert!(matches!(
            retry_decision_dag(&dag("Canceled", 0, 0)),
            RetryDecision::Rerun { .. }
        ));
        assert_eq!(
            retry_decision_dag(&dag("Succeeded", 0, 0)),
            RetryDecision::NothingFailed
        );
        assert_eq!(
            retry_decision_dag(&dag("Running", 0, 0)),
            RetryDecision::NotFinished {
                phase: "Running".into()
            }
        );
        assert_eq!(
            retry_decision_dag(&dag("Failed", 1, 0)),
            RetryDecision::AlreadyRequested { rerun: 1 }
        );
    }

    #[test]
    fn only_unfinished_tasks_are_canceled() {
        assert!(matches!(
            cancel_decision_task(&task("Running", 0, 0, false)),
            CancelDecision::Cancel { .. }
        ));
        assert_eq!(
            cancel_decision_task(&task("Running", 0, 0, true)),
            CancelDecision::AlreadyRequested
        );
        assert_eq!(
            cancel_decision_task(&task("Succeeded", 0, 0, false)),
            CancelDecision::AlreadyFinished {
                phase: "Succeeded".into()
            }
        );
        assert_eq!(
            cancel_patch(),
            serde_json::json!({"spec": {"cancel": true}})
        );
    }

    #[test]
    fn one_failing_target_reports_its_own_error() {
        let e = finish(vec![CliError::Usage("only".into())], 1).unwrap_err();
        assert_eq!(e.to_string(), "only");
        let e = finish(vec![CliError::Usage("a".into())], 3).unwrap_err();
        assert_eq!(
            e,
            CliError::Partial {
                failed: 1,
                total: 3
            }
        );
        assert!(finish(vec![], 3).is_ok());
    }
}
