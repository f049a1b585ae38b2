//! `kubectl ax retry` and `kubectl ax cancel`: bulk requests written into the spec, which the
//! operator acts on. The objects are named, or selected by labels, phase or queue; what to do
//! with each, and the patches, are in `client::rerun`, shared with the console's buttons. Each
//! object gets one line on stdout, each failure one on stderr (client required).

use std::io::{BufRead, Write};

use kube::ResourceExt;
use kube::api::Patch;

use crate::api::{AxDag, AxTask, TaskPhase};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::operator;
use crate::client::rerun::{
    CancelDecision, RetryDecision, api_for, cancel_decision_dag, cancel_decision_task,
    cancel_patch, cancel_task, patch_params, rerun, retry_decision_dag, retry_decision_task,
};

use super::args::{CancelArgs, DryRun, RetryArgs};
use super::target::{Kind, Target, TaskFilter, parse_phases, parse_targets};

/// An object to act on, as read (also `delete`'s).
// Held in one list per run; boxing would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(super) enum Item {
    Task(AxTask),
    Dag(AxDag),
}

impl Item {
    pub(super) fn label(&self, all_namespaces: bool) -> String {
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
    errors: Vec<ClientError>,
}

async fn select(
    ctx: &Ctx,
    targets: &[Target],
    selector: Option<&str>,
    filter: Option<&TaskFilter>,
) -> Result<Selection, ClientError> {
    if !targets.is_empty() && ctx.global.all_namespaces {
        return Err(ClientError::Usage(
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
            Err(e @ ClientError::NotFound { .. }) => selection.errors.push(e),
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

/// The per-object report lines go to stdout, errors to stderr; a single failing target returns
/// its own error (one line), several return `Partial`.
pub fn finish(failures: Vec<ClientError>, total: usize) -> Result<(), ClientError> {
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
    Err(ClientError::Partial { failed, total })
}

pub async fn retry(ctx: &Ctx, args: &RetryArgs) -> Result<(), ClientError> {
    let targets = parse_targets(&args.targets)?;
    let phases = parse_phases(&args.phase)?;
    if let Some(p) = phases.iter().find(|p| !p.is_terminal()) {
        return Err(ClientError::Usage(format!(
            "--phase {p}: retry re-runs finished tasks only (Succeeded, Dead, Canceled)"
        )));
    }
    let by_selection = args.selector.is_some() || !phases.is_empty();
    if targets.is_empty() && !by_selection {
        return Err(ClientError::Usage(
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
    if wants_patch && !args.dry_run.is_dry() {
        operator::check(ctx).await?;
    }
    let server_dry = args.dry_run == DryRun::Server;
    let mut out = std::io::stdout().lock();
    for (item, explicit) in selection.items {
        let label = item.label(all);
        let result = match item {
            // Decided here, sent nowhere.
            Item::Task(t) if args.dry_run == DryRun::Client => {
                Ok(client_dry_run(retry_decision_task(&t)))
            }
            Item::Dag(d) if args.dry_run == DryRun::Client => {
                Ok(client_dry_run(retry_decision_dag(&d)))
            }
            Item::Task(t) => rerun(ctx, Resource::Task, t, retry_decision_task, server_dry).await,
            Item::Dag(d) => rerun(ctx, Resource::Dag, d, retry_decision_dag, server_dry).await,
        };
        match result {
            Ok((RetryDecision::Rerun { phase, current }, next)) if args.dry_run.is_dry() => {
                let which = if server_dry {
                    "server dry run"
                } else {
                    "dry run"
                };
                writeln!(
                    out,
                    "{label}: would be re-run (spec.rerun {current} -> {next}; {phase}) [{which}]"
                )?
            }
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
                    failures.push(ClientError::NotMet(text));
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

/// What `rerun` would return for a decision, without sending anything.
fn client_dry_run(decision: RetryDecision) -> (RetryDecision, i64) {
    let next = match &decision {
        RetryDecision::Rerun { current, .. } => current + 1,
        _ => 0,
    };
    (decision, next)
}

/// Asks on stderr, reads the answer from stdin; only `y`/`yes` confirms.
pub fn confirm(question: &str) -> Result<bool, ClientError> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

pub async fn cancel(ctx: &Ctx, args: &CancelArgs) -> Result<(), ClientError> {
    let targets = parse_targets(&args.targets)?;
    let by_selection = args.selector.is_some() || args.queue.is_some();
    if targets.is_empty() && !by_selection {
        return Err(ClientError::Usage(
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
    if to_cancel > 1 && !args.yes && !args.dry_run.is_dry() {
        let scope = match ctx.list_namespace() {
            Some(ns) => format!("in namespace \"{ns}\""),
            None => "in all namespaces".into(),
        };
        if !confirm(&format!("Cancel {to_cancel} tasks {scope}?"))? {
            return Err(ClientError::Usage(format!(
                "not canceled: {to_cancel} tasks match and the answer was not yes (--yes cancels without asking)"
            )));
        }
    }
    if to_cancel > 0 && !args.dry_run.is_dry() {
        operator::check(ctx).await?;
    }
    let client_dry = args.dry_run == DryRun::Client;
    let params = patch_params(args.dry_run == DryRun::Server);
    let dry = match args.dry_run {
        DryRun::None => "",
        DryRun::Client => " [dry run]",
        DryRun::Server => " [server dry run]",
    };
    let mut out = std::io::stdout().lock();
    for (item, _) in selection.items {
        let label = item.label(all);
        let (decision, result) = match &item {
            Item::Task(t) if client_dry => (cancel_decision_task(t), Ok(())),
            Item::Task(t) => {
                let d = cancel_decision_task(t);
                (d, cancel_task(ctx, t, &params).await.map(|_| ()))
            }
            Item::Dag(dag) => {
                let d = cancel_decision_dag(dag);
                let r = if matches!(d, CancelDecision::Cancel { .. }) && !client_dry {
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

    #[test]
    fn one_failing_target_reports_its_own_error() {
        let e = finish(vec![ClientError::Usage("only".into())], 1).unwrap_err();
        assert_eq!(e.to_string(), "only");
        let e = finish(vec![ClientError::Usage("a".into())], 3).unwrap_err();
        assert_eq!(
            e,
            ClientError::Partial {
                failed: 1,
                total: 3
            }
        );
        assert!(finish(vec![], 3).is_ok());
    }
}
