//! The task reconciler's worker pods: which pods a task has (the caches, the pod just created, a
//! quorum read when the caches show none), and the pod writes a decision asks for — create the
//! current attempt's pod, kill one that should not run, let a recorded outcome go.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, warn};

use crate::api::AxTask;
use crate::controller::cache;
use crate::controller::write::{self, ApiError, api_message};
use crate::controller::{Ctx, Error, FIELD_MANAGER, Result, TaskKey};
use crate::core::task::{self as core, Refusal};
use crate::core::worker::{self, OUTCOME_FINALIZER, WorkerState, pod_name};

/// Every pod this task owns, of any attempt (`Context::pods_by_task`), plus the pod just created and not yet
/// in the cache. A pod of the next attempt exists when it was created beside a status write that
/// did not land (a conflict, or the operator stopped in between): the core takes the attempt up
/// with it, or stops it if the task may not start now. A pod of a later attempt says this status is
/// behind (`core::task::behind`).
pub(super) fn pods_of(task: &AxTask, key: &TaskKey, ctx: &Ctx) -> Vec<WorkerState> {
    match task.uid() {
        Some(uid) => pods_named(key, &uid, ctx),
        None => Vec::new(),
    }
}

/// The pods of task `key` (uid `uid`), as [`pods_of`] says.
pub(super) fn pods_named(key: &TaskKey, uid: &str, ctx: &Ctx) -> Vec<WorkerState> {
    let mut pods: Vec<WorkerState> = ctx
        .pods_by_task
        .children_of(uid)
        .into_iter()
        .filter_map(|child| {
            let pod = ctx.pods.get(&child.object_ref::<Pod>())?;
            // A pod of that name owned by another object (an older task of the same name) is not
            // ours; the index and the cache may be a moment apart.
            pod.owner_references()
                .iter()
                .any(|o| o.uid == uid)
                .then(|| observe_pod(&pod, ctx))
        })
        .collect();
    let removed = ctx.tracking.removed_pods(key, |uid| {
        pods.iter().any(|p| p.uid.as_deref() == Some(uid))
    });
    pods.retain(|p| !p.uid.as_ref().is_some_and(|uid| removed.contains(uid)));
    pods.sort_by_key(|p| p.attempt);
    let seen = |n: i32| pods.iter().any(|p| p.attempt == n);
    if let Some((name, n, created_at)) = ctx.tracking.expected_pod(key, seen) {
        pods.push(worker::expected(&name, n, created_at));
    }
    pods
}

/// The pod of `attempt` as the API server has it now (a quorum read), when the caches show none:
/// a pod whose `ax.dev/task` label was removed, or one a stale relist dropped, may still run.
/// `None` when it is gone or not this task's.
pub(super) async fn read_pod(task: &AxTask, attempt: i32, ctx: &Ctx) -> Result<Option<Pod>> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let pod = api
        .get_opt(&pod_name(&task.name_any(), attempt))
        .await
        .map_err(|e| Error::Read("the worker pod", e))?;
    Ok(pod.filter(|pod| {
        pod.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == task.metadata.uid.as_ref())
    }))
}

/// The pod as the core reads it, with what the node cache (complete: see `reconcile`) says of its
/// node.
pub(super) fn observe_pod(pod: &Pod, ctx: &Ctx) -> WorkerState {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .map(|node| ctx.nodes.get(&ObjectRef::new(node)));
    let node_ready = node.as_ref().and_then(|node| {
        let conditions = node.as_ref()?.status.as_ref()?.conditions.as_ref()?;
        Some(
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
        )
    });
    let mut worker = worker::observe(pod, node_ready);
    worker.node_gone = matches!(node, Some(None));
    worker
}

pub(super) enum Created {
    /// Created now, or it exists and is ours.
    Yes,
    /// A pod of that name exists and belongs to something else.
    NameTaken,
    Refused(Refusal),
}

/// Creates the worker pod of the current attempt.
pub(super) async fn create_pod(task: &AxTask, key: &TaskKey, ctx: &Ctx) -> Result<Created> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let full;
    let task = if cache::is_stripped(task) {
        // The cache keeps no pod templates (see `cache`). Only a pod missing outside the dispatch
        // path (a restart, an expectation that ran out) gets here: a dispatch builds its pod from
        // the whole task its status write returned.
        let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
        match api
            .get_opt(&task.name_any())
            .await
            .map_err(|e| Error::Read("the task", e))?
        {
            Some(fresh) => {
                full = fresh;
                &full
            }
            None => return Ok(Created::Yes),
        }
    } else {
        task
    };
    let status = task.status.clone().unwrap_or_default();
    let payload = task
        .spec
        .payload
        .as_ref()
        .map(core::payload_json)
        .unwrap_or_else(|| "{}".into());
    let pod = worker::build_pod(task, status.attempt, &payload);
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let sent_at = Timestamp::now();
    match api.create(&params, &pod).await {
        Ok(_) => {
            ctx.tracking.expect_pod(key, &name, status.attempt, sent_at);
            if let Some(queued_at) = status.queued_at {
                // Dispatch latency: from eligible (queuedAt) to the worker pod created.
                let latency = Timestamp::now().duration_since(queued_at);
                ctx.metrics.dispatched(
                    &task.spec.queue,
                    Duration::try_from(latency).unwrap_or_default(),
                );
            }
            Ok(Created::Yes)
        }
        Err(e) => match ApiError::of(&e) {
            // Created before the cache could show it (a reconcile of a restarted operator).
            ApiError::AlreadyExists => match api
                .get_opt(&name)
                .await
                .map_err(|e| Error::Read("the existing pod", e))?
            {
                Some(existing)
                    if existing
                        .owner_references()
                        .iter()
                        .any(|o| Some(&o.uid) == task.metadata.uid.as_ref()) =>
                {
                    let created_at = existing
                        .metadata
                        .creation_timestamp
                        .map_or(sent_at, |t| t.0);
                    ctx.tracking
                        .expect_pod(key, &name, status.attempt, created_at);
                    Ok(Created::Yes)
                }
                Some(_) => {
                    warn!(
                        pod = name,
                        "the worker pod's name is taken by a pod of another owner"
                    );
                    Ok(Created::NameTaken)
                }
                None => Ok(Created::NameTaken),
            },
            ApiError::Forbidden => {
                warn!(pod = name, error = %api_message(&e), "worker pod refused");
                Ok(Created::Refused(Refusal::Forbidden(api_message(&e))))
            }
            ApiError::Invalid => {
                warn!(pod = name, error = %api_message(&e), "worker pod rejected as invalid");
                Ok(Created::Refused(Refusal::Invalid(api_message(&e))))
            }
            _ => Err(Error::CreatePod(e)),
        },
    }
}

/// Stops a pod that should not run: deleted (preconditioned on its uid, so a newer pod of the same
/// name is never hit), after the outcome finalizer was put on it when its last status matters.
pub(super) async fn kill_pod(
    task: &AxTask,
    name: &str,
    uid: &str,
    grace_seconds: Option<i64>,
    keep_outcome: bool,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    if keep_outcome {
        let has_finalizers = ctx
            .pods
            .get(&ObjectRef::<Pod>::new(name).within(&namespace))
            .is_some_and(|p| {
                p.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
            });
        let add = if has_finalizers {
            serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": OUTCOME_FINALIZER})
        } else {
            serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [OUTCOME_FINALIZER]})
        };
        let ops = serde_json::json!([{"op": "test", "path": "/metadata/uid", "value": uid}, add]);
        let patch: json_patch::Patch = serde_json::from_value(ops)?;
        match api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => {}
            // Gone, or another pod by now: nothing to keep.
            Err(e) if matches!(ApiError::of(&e), ApiError::NotFound | ApiError::Invalid) => {}
            Err(e) => return Err(Error::DeletePod(e)),
        }
    }
    let params = DeleteParams {
        grace_period_seconds: grace_seconds.map(|g| g.clamp(0, i64::from(u32::MAX)) as u32),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            debug!(pod = name, ?grace_seconds, "worker pod deleted");
            Ok(())
        }
        Err(e) if matches!(ApiError::of(&e), ApiError::NotFound | ApiError::Conflict) => Ok(()),
        Err(e) => Err(Error::DeletePod(e)),
    }
}

/// Removes an ended pod whose outcome is recorded (`core::task::Action::RemovePod`): its outcome
/// finalizer off, then deleted, which for a terminal pod is at once. Remembered as removed until
/// the cache shows it gone.
pub(super) async fn remove_pod(
    task: &AxTask,
    key: &TaskKey,
    name: &str,
    uid: &str,
    ctx: &Ctx,
) -> Result<()> {
    remove_finalizer(task, name, uid, ctx).await?;
    kill_pod(task, name, uid, None, false, ctx).await?;
    ctx.tracking.pod_removed(key, uid);
    Ok(())
}

/// Takes the outcome finalizer off a pod whose last status has been read (and recorded).
pub(super) async fn remove_finalizer(
    task: &AxTask,
    name: &str,
    uid: &str,
    ctx: &Ctx,
) -> Result<()> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let Some(pod) = ctx
        .pods
        .get(&ObjectRef::<Pod>::new(name).within(&namespace))
    else {
        return Ok(());
    };
    if pod.metadata.uid.as_deref() != Some(uid) {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    write::remove_finalizer(&api, pod.as_ref(), OUTCOME_FINALIZER).await
}
