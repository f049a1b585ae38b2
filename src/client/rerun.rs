//! Re-run and cancel requests, written into the spec for the operator to act on (`spec.rerun` + 1,
//! `spec.cancel: true`), as both front ends make them. What to do with each object is decided by
//! pure functions (`retry_decision_*`, `cancel_decision_*`, the patches); `rerun` and
//! `cancel_task` read and patch (client required).
//!
//! A re-run patch carries the resourceVersion it was computed from, so the API server refuses it
//! (409) when the object changed in between; we then read it again and decide again. Two re-runs
//! requested at once therefore never turn into one increment counted twice: the second one sees
//! the first one's request and reports it instead of adding another.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{AxDag, AxTask, DagPhase};

use super::ctx::Ctx;
use super::error::{ClientError, Op, Resource, from_kube};
use super::task::effective_phase;

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

pub fn patch_params(dry_run: bool) -> PatchParams {
    let mut params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    params.dry_run = dry_run;
    params
}

pub fn api_for<K>(ctx: &Ctx, object: &K) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    let ns = object.namespace().unwrap_or_else(|| ctx.namespace.clone());
    Api::namespaced(ctx.client.clone(), &ns)
}

/// Patches the re-run request, reading again and deciding again after each conflict; the
/// decision acted on and the `spec.rerun` written (0 when nothing was patched).
pub async fn rerun<K>(
    ctx: &Ctx,
    resource: Resource,
    first: K,
    decide: fn(&K) -> RetryDecision,
    dry_run: bool,
) -> Result<(RetryDecision, i64), ClientError>
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
    Err(ClientError::NotMet(format!(
        "{} \"{name}\" kept changing: gave up after {MAX_CONFLICTS} conflicting writes",
        resource.singular()
    )))
}

/// Sets `spec.cancel: true` on the task if it is not finished and not canceled already; the
/// decision taken.
pub async fn cancel_task(
    ctx: &Ctx,
    task: &AxTask,
    params: &PatchParams,
) -> Result<CancelDecision, ClientError> {
    let decision = cancel_decision_task(task);
    if matches!(decision, CancelDecision::Cancel { .. }) {
        let op = Op::new("patch", Resource::Task)
            .namespace(task.namespace().as_deref())
            .name(&task.name_any());
        api_for(ctx, task)
            .patch(&task.name_any(), params, &Patch::Merge(cancel_patch()))
            .await
            .map_err(|e| from_kube(&op, e))?;
    }
    Ok(decision)
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
}
