//! `kubectl ax wait TARGET... --for terminal|succeeded --timeout 10m`: exit 0 once every target
//! meets the condition, non-zero as soon as one cannot (it finished otherwise, or was deleted) or
//! when time runs out. `task_state`/`dag_state` decide (pure); `run` watches (client required).

use std::io::Write;
use std::time::Duration;

use futures::TryStreamExt;
use futures::future::join_all;
use kube::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::api::{AxDag, AxTask, DagPhase, TaskPhase};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, watch_error};
use crate::client::format::{human, parse_duration};
use crate::client::operator;

use super::args::{WaitArgs, WaitFor};
use super::target::{Kind, Target, parse_targets};

/// Where one target stands with respect to the condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitState {
    /// Met; the text says how (the phase).
    Met(String),
    /// Can no longer be met.
    Failed(String),
    /// Not yet; the text is the phase now.
    Waiting(String),
}

pub fn task_state(task: &AxTask, condition: WaitFor) -> WaitState {
    let status = task.status.clone().unwrap_or_default();
    let Some(phase) = status.phase else {
        return WaitState::Waiting("not yet seen by the operator".into());
    };
    // A re-run the operator has not started yet: the phase is the old attempt's.
    if task.spec.rerun > status.observed_rerun {
        return WaitState::Waiting(format!("{phase}, re-run requested"));
    }
    if !phase.is_terminal() {
        return WaitState::Waiting(phase.to_string());
    }
    if !crate::core::task::is_final(&status) {
        return WaitState::Waiting(format!("{phase}, its worker still stopping"));
    }
    let why = status
        .dead_reason
        .or(status.reason)
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    match (condition, phase) {
        (WaitFor::Terminal, _) | (WaitFor::Succeeded, TaskPhase::Succeeded) => {
            WaitState::Met(phase.to_string())
        }
        (WaitFor::Succeeded, _) => WaitState::Failed(format!("ended {phase}{why}, not Succeeded")),
    }
}

pub fn dag_state(dag: &AxDag, condition: WaitFor) -> WaitState {
    let status = dag.status.clone().unwrap_or_default();
    let Some(phase) = status.phase else {
        return WaitState::Waiting("not yet seen by the operator".into());
    };
    if dag.spec.rerun > status.observed_rerun {
        return WaitState::Waiting(format!("{phase}, re-run requested"));
    }
    if !phase.is_terminal() {
        return WaitState::Waiting(phase.to_string());
    }
    match (condition, phase) {
        (WaitFor::Terminal, _) | (WaitFor::Succeeded, DagPhase::Succeeded) => {
            WaitState::Met(phase.to_string())
        }
        (WaitFor::Succeeded, _) => WaitState::Failed(format!(
            "ended {phase} ({} finished), not Succeeded",
            status.progress.unwrap_or_default()
        )),
    }
}

/// Follows one object by a watch on its name until its state is decided.
async fn follow<K>(
    api: Api<K>,
    op: Op,
    name: String,
    decide: impl Fn(&K) -> WaitState,
) -> Result<WaitState, ClientError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Send
        + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api, config);
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    loop {
        let event = match stream.try_next().await {
            Ok(event) => event,
            // The first list failing says why (403, no CRDs); later errors are interruptions.
            Err(e) if !listed => return Err(watch_error(&op, e)),
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        match event {
            None => return Err(ClientError::Unreachable("the watch ended".into())),
            Some(watcher::Event::Init) => {}
            Some(watcher::Event::InitDone) => listed = true,
            Some(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let state = decide(&o);
                if !matches!(state, WaitState::Waiting(_)) {
                    return Ok(state);
                }
            }
            Some(watcher::Event::Delete(_)) => {
                return Ok(WaitState::Failed("was deleted".into()));
            }
        }
    }
}

pub async fn run(ctx: &Ctx, args: &WaitArgs) -> Result<(), ClientError> {
    let targets = parse_targets(&args.targets)?;
    let timeout = parse_duration("timeout", &args.timeout)?;
    let condition = args.condition;
    // Read each first: an unknown name fails now, and what is already decided needs no watch.
    let mut first: Vec<(Target, WaitState)> = Vec::new();
    for target in &targets {
        let state = match target.kind {
            Kind::Task => task_state(&ctx.get_task(&target.name).await?, condition),
            Kind::Dag => dag_state(&ctx.get_dag(&target.name).await?, condition),
        };
        first.push((target.clone(), state));
    }
    if first
        .iter()
        .any(|(_, s)| matches!(s, WaitState::Waiting(_)))
    {
        operator::check(ctx).await?;
    }
    let ns = ctx.namespace.clone();
    let waits = first.iter().map(|(target, state)| {
        let target = target.clone();
        let state = state.clone();
        let ns = ns.clone();
        async move {
            if !matches!(state, WaitState::Waiting(_)) {
                return (target, Ok(state));
            }
            let result = match target.kind {
                Kind::Task => {
                    let op = Op::new("watch", Resource::Task)
                        .namespace(Some(&ns))
                        .name(&target.name);
                    follow(
                        ctx.tasks(Some(&ns)),
                        op,
                        target.name.clone(),
                        |t: &AxTask| task_state(t, condition),
                    )
                    .await
                }
                Kind::Dag => {
                    let op = Op::new("watch", Resource::Dag)
                        .namespace(Some(&ns))
                        .name(&target.name);
                    follow(ctx.dags(Some(&ns)), op, target.name.clone(), |d: &AxDag| {
                        dag_state(d, condition)
                    })
                    .await
                }
            };
            (target, result)
        }
    });
    let results = match tokio::time::timeout(timeout, join_all(waits)).await {
        Ok(results) => results,
        Err(_) => return Err(timed_out(ctx, &targets, condition, timeout).await),
    };
    let mut failures = Vec::new();
    let mut out = std::io::stdout().lock();
    for (target, result) in results {
        match result? {
            WaitState::Met(phase) => writeln!(out, "{} {phase}", target.display())?,
            WaitState::Failed(why) => {
                failures.push(ClientError::NotMet(format!("{} {why}", target.display())))
            }
            WaitState::Waiting(_) => unreachable!("follow returns decided states only"),
        }
    }
    drop(out);
    let total = targets.len();
    match failures.len() {
        0 => Ok(()),
        1 if total == 1 => Err(failures.remove(0)),
        failed => {
            for f in &failures {
                eprintln!("error: {f}");
            }
            Err(ClientError::Partial { failed, total })
        }
    }
}

/// The timeout error, with where each unfinished target stands now.
async fn timed_out(
    ctx: &Ctx,
    targets: &[Target],
    condition: WaitFor,
    timeout: Duration,
) -> ClientError {
    let mut waiting = Vec::new();
    for target in targets {
        let state = match target.kind {
            Kind::Task => ctx
                .get_task(&target.name)
                .await
                .map(|t| task_state(&t, condition)),
            Kind::Dag => ctx
                .get_dag(&target.name)
                .await
                .map(|d| dag_state(&d, condition)),
        };
        match state {
            Ok(WaitState::Waiting(phase)) => {
                waiting.push(format!("{} is {phase}", target.display()))
            }
            Ok(_) => {}
            Err(e) => waiting.push(format!("{}: {e}", target.display())),
        }
    }
    let for_what = match condition {
        WaitFor::Terminal => "to finish",
        WaitFor::Succeeded => "to succeed",
    };
    ClientError::TimedOut(format!(
        "timed out after {} waiting {for_what}: {}",
        human(jiff::SignedDuration::try_from(timeout).unwrap_or_default()),
        waiting.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(phase: Option<&str>, rerun: i64, observed: i64) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "t"},
            "spec": {"type": "x", "template": {}, "rerun": rerun},
            "status": match phase {
                Some(p) => serde_json::json!({"phase": p, "observedRerun": observed, "deadReason": "no luck"}),
                None => serde_json::json!({}),
            },
        }))
        .unwrap()
    }

    #[test]
    fn terminal_is_any_final_phase_succeeded_only_success() {
        assert_eq!(
            task_state(&task(Some("Dead"), 0, 0), WaitFor::Terminal),
            WaitState::Met("Dead".into())
        );
        assert_eq!(
            task_state(&task(Some("Dead"), 0, 0), WaitFor::Succeeded),
            WaitState::Failed("ended Dead (no luck), not Succeeded".into())
        );
        assert_eq!(
            task_state(&task(Some("Succeeded"), 0, 0), WaitFor::Succeeded),
            WaitState::Met("Succeeded".into())
        );
        assert!(matches!(
            task_state(&task(Some("Running"), 0, 0), WaitFor::Terminal),
            WaitState::Waiting(_)
        ));
        assert!(matches!(
            task_state(&task(None, 0, 0), WaitFor::Terminal),
            WaitState::Waiting(_)
        ));
    }

    #[test]
    fn a_pending_re_run_is_waited_for() {
        assert_eq!(
            task_state(&task(Some("Dead"), 1, 0), WaitFor::Succeeded),
            WaitState::Waiting("Dead, re-run requested".into())
        );
    }

    #[test]
    fn dags_fail_a_succeeded_wait_when_they_fail() {
        let dag: AxDag = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
            "metadata": {"name": "d"},
            "spec": {"tasks": []},
            "status": {"phase": "Failed", "progress": "3/3"},
        }))
        .unwrap();
        assert_eq!(
            dag_state(&dag, WaitFor::Succeeded),
            WaitState::Failed("ended Failed (3/3 finished), not Succeeded".into())
        );
        assert_eq!(
            dag_state(&dag, WaitFor::Terminal),
            WaitState::Met("Failed".into())
        );
    }
}
