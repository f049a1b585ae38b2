//! `kubectl ax suspend` and `kubectl ax resume`: hold tasks before dispatch (`spec.suspend`, like a
//! Job's) or stop a queue dispatching (`spec.stopPolicy`, Kueue's `Hold` / `HoldAndDrain`), and
//! let them go again. What to patch is decided here without a client; one line per object on
//! stdout, each failure one on stderr.

use kube::ResourceExt;
use kube::api::Patch;

use crate::api::{StopPolicy, TaskPhase};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::rerun::patch_params;

use super::args::{DryRun, SuspendArgs};
use super::rerun::finish;
use super::target::{AnyKind, kind_named};

/// An object named on the command line of `suspend`/`resume`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Suspendable {
    Task(String),
    Queue(String),
}

impl Suspendable {
    fn label(&self) -> String {
        match self {
            Suspendable::Task(name) => format!("axtask/{name}"),
            Suspendable::Queue(name) => format!("axqueue/{name}"),
        }
    }
}

/// `NAME` (a task), `task/NAME` or `queue/NAME`, in any spelling kubectl accepts for the kind.
pub fn parse(text: &str) -> Result<Suspendable, ClientError> {
    let (kind, name) = text.split_once('/').unwrap_or(("axtask", text));
    if name.is_empty() || name.contains('/') {
        return Err(ClientError::Usage(format!(
            "{text:?}: not a name (use NAME for a task, or queue/NAME)"
        )));
    }
    match kind_named(kind) {
        Some(AnyKind::Task) => Ok(Suspendable::Task(name.to_owned())),
        Some(AnyKind::Queue) => Ok(Suspendable::Queue(name.to_owned())),
        _ => Err(ClientError::Usage(format!(
            "{text:?}: {:?} cannot be suspended (use NAME for a task, or queue/NAME; a cron: kubectl ax cron suspend)",
            kind.to_ascii_lowercase()
        ))),
    }
}

/// The merge patch that suspends (or resumes) a task.
pub fn task_patch(suspend: bool) -> serde_json::Value {
    serde_json::json!({"spec": {"suspend": suspend}})
}

/// The stop policy a queue gets: `Hold`, `HoldAndDrain` with `--drain`, `None` to resume.
pub fn queue_policy(suspend: bool, drain: bool) -> StopPolicy {
    match (suspend, drain) {
        (false, _) => StopPolicy::None,
        (true, false) => StopPolicy::Hold,
        (true, true) => StopPolicy::HoldAndDrain,
    }
}

pub fn queue_patch(policy: StopPolicy) -> serde_json::Value {
    serde_json::json!({"spec": {"stopPolicy": policy.as_str()}})
}

/// Whether suspending a task does anything: a finished one never dispatches again by itself.
fn suspend_applies(phase: Option<TaskPhase>) -> bool {
    !phase.is_some_and(TaskPhase::is_terminal)
}

pub async fn run(ctx: &Ctx, args: &SuspendArgs, suspend: bool) -> Result<(), ClientError> {
    let verb = if suspend { "suspend" } else { "resume" };
    let mut targets = args
        .targets
        .iter()
        .map(|t| parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    if targets.is_empty() && args.selector.is_none() {
        return Err(ClientError::Usage(format!(
            "name what to {verb} (NAME..., queue/NAME), or select tasks with -l SELECTOR"
        )));
    }
    if args.drain && (!suspend || !targets.iter().any(|t| matches!(t, Suspendable::Queue(_)))) {
        return Err(ClientError::Usage(
            "--drain applies to `kubectl ax suspend queue/NAME` only".into(),
        ));
    }
    if ctx.global.all_namespaces && targets.iter().any(|t| matches!(t, Suspendable::Task(_))) {
        return Err(ClientError::Usage(
            "task names need one namespace: use -n NAMESPACE, or -A with -l only".into(),
        ));
    }
    let mut selected: Vec<(Option<String>, String)> = Vec::new();
    if let Some(selector) = args.selector.as_deref() {
        for task in ctx.list_tasks(Some(selector)).await?.items {
            let phase = task.status.as_ref().and_then(|s| s.phase);
            let name = task.name_any();
            // Only where it changes something: unfinished tasks not already in that state.
            if suspend_applies(phase) && task.spec.suspend != suspend {
                selected.push((task.namespace(), name));
            }
        }
    }
    if targets.is_empty() && selected.is_empty() {
        println!("nothing to {verb}: no task matches");
        return Ok(());
    }
    let params = patch_params(args.dry_run == DryRun::Server);
    let dry = args.dry_run.note();
    // `--dry-run=client`: every patch below is decided already; none is sent.
    let send = args.dry_run != DryRun::Client;
    let total = targets.len() + selected.len();
    let mut failures = Vec::new();
    let done = if suspend { "suspended" } else { "resumed" };
    // Named tasks first, in the command line's order, then those the selector found.
    targets.extend(
        selected
            .iter()
            .map(|(_, name)| Suspendable::Task(name.clone())),
    );
    let namespaces = std::iter::repeat_n(None, targets.len() - selected.len())
        .chain(selected.iter().map(|(ns, _)| ns.clone()));
    for (target, namespace) in targets.iter().zip(namespaces) {
        let result = match target {
            Suspendable::Task(name) => {
                let ns = namespace.unwrap_or_else(|| ctx.namespace.clone());
                let op = Op::new("patch", Resource::Task)
                    .namespace(Some(&ns))
                    .name(name);
                let patched = if send {
                    ctx.tasks(Some(&ns))
                        .patch(name, &params, &Patch::Merge(task_patch(suspend)))
                        .await
                        .map(|_| ())
                } else {
                    Ok(())
                };
                patched
                    .map(|_| format!("{} {done}{dry}", target.label()))
                    .map_err(|e| from_kube(&op, e))
            }
            Suspendable::Queue(name) => {
                let policy = queue_policy(suspend, args.drain);
                let op = Op::new("patch", Resource::Queue).name(name);
                let patched = if send {
                    ctx.queues()
                        .patch(name, &params, &Patch::Merge(queue_patch(policy)))
                        .await
                        .map(|_| ())
                } else {
                    Ok(())
                };
                patched
                    .map(|_| {
                        format!(
                            "{} {done} (stopPolicy {}){dry}",
                            target.label(),
                            policy.as_str()
                        )
                    })
                    .map_err(|e| from_kube(&op, e))
            }
        };
        match result {
            Ok(line) => println!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    finish(failures, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_tasks_and_queue_slash_names_are_queues_in_kubectls_spellings() {
        assert_eq!(parse("x").unwrap(), Suspendable::Task("x".into()));
        assert_eq!(parse("axt/x").unwrap(), Suspendable::Task("x".into()));
        for kind in ["queue", "axq", "axqueue", "AxQueues.ax.dev"] {
            assert_eq!(
                parse(&format!("{kind}/batch")).unwrap(),
                Suspendable::Queue("batch".into())
            );
        }
        for bad in ["cron/x", "queue/", "a/b/c", "dag/d"] {
            assert!(
                matches!(parse(bad), Err(ClientError::Usage(_))),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn a_queue_is_held_drained_or_let_go_and_a_task_suspended_or_resumed() {
        assert_eq!(queue_policy(true, false), StopPolicy::Hold);
        assert_eq!(queue_policy(true, true), StopPolicy::HoldAndDrain);
        assert_eq!(queue_policy(false, true), StopPolicy::None);
        assert_eq!(
            queue_patch(StopPolicy::HoldAndDrain),
            serde_json::json!({"spec": {"stopPolicy": "HoldAndDrain"}})
        );
        assert_eq!(
            task_patch(false),
            serde_json::json!({"spec": {"suspend": false}})
        );
        assert!(suspend_applies(None));
        assert!(suspend_applies(Some(TaskPhase::Running)));
        assert!(!suspend_applies(Some(TaskPhase::Dead)));
    }
}
