//! The one place that writes the status of AxTasks, AxDags and AxQueues (client required), and the
//! one reading of API status codes. Each caller names what it does on a conflict:
//!
//! - AxTask (the task reconciler, the only writer of a task's status): conditional on the
//!   resourceVersion it decided on; a conflict means someone else changed the task, whose newer
//!   version is on its way through the watch → *await change*.
//! - AxDag (the DAG reconciler, the only writer of a DAG's status): the same → *await change*.
//! - AxCron (the cron reconciler, the only writer of a cron's status): conditional on the
//!   resourceVersion like the others; a conflict or a cron gone → *decide again* on the newer
//!   version (reported as `Ok(false)`: the reconciler requeues at once). Clearing the pending
//!   children after their creates is conditional on the list instead (see
//!   [`cron_pending_created`]); a failure there is *skipped*: the next status write drops them.
//! - AxQueue (the queue status loop, the only writer of a queue's status, every few seconds):
//!   unconditional apply of the fields it owns → *no conflict possible*; a failure is *skipped*
//!   until the next round.
//!
//! One policy under all of them: a status is written only by the one reconciler of its kind, from
//! a decision on a copy it names by resourceVersion, so a stale decision never lands.

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};

use super::{Error, Result};
use crate::api::{
    AxCron, AxCronStatus, AxDag, AxDagStatus, AxQueue, AxQueueStatus, AxTask, AxTaskStatus,
    PendingChild,
};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "ax-operator";

/// What an API error means for the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// 409 on an update: the object changed since it was read.
    Conflict,
    /// 409 on a create: the name is taken.
    AlreadyExists,
    NotFound,
    /// 403: RBAC, a ResourceQuota, a LimitRange or an admission webhook refused it.
    Forbidden,
    /// 422/400: the object is invalid.
    Invalid,
    /// 429 or 5xx: try again later.
    Unavailable,
    /// Anything else, including transport errors.
    Other,
}

impl ApiError {
    pub fn of(error: &kube::Error) -> ApiError {
        match error {
            kube::Error::Api(e) => match (e.code, e.reason.as_str()) {
                (409, "AlreadyExists") => ApiError::AlreadyExists,
                (409, _) => ApiError::Conflict,
                (404, _) => ApiError::NotFound,
                (403, _) => ApiError::Forbidden,
                (422 | 400, _) => ApiError::Invalid,
                (429, _) | (500..=599, _) => ApiError::Unavailable,
                _ => ApiError::Other,
            },
            _ => ApiError::Other,
        }
    }

    pub fn of_result(error: &Error) -> ApiError {
        error.api().map_or(ApiError::Other, ApiError::of)
    }
}

/// The message of an API error, as the API server wrote it.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(e) => e.message.clone(),
        e => e.to_string(),
    }
}

/// Writes a task's whole status, conditional on the resourceVersion the decision was taken on: a
/// stale decision fails with a conflict instead of overwriting newer state. A PUT of the status
/// subresource, not an apply: the reconciler owns the whole status, and a replace costs the API
/// server a fraction of a server-side apply's merge — the status write is on every task's path.
/// The API server keeps everything of the stored object but its `status`, so the body carries only
/// what names the object and the precondition: the cached copy's cache-only annotations would
/// otherwise be recorded as ours in managedFields.
pub async fn task_status(client: &Client, task: &AxTask, status: &AxTaskStatus) -> Result<AxTask> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &namespace);
    let mut body = AxTask::new(&task.name_any(), task.spec.clone());
    body.metadata.namespace = Some(namespace.clone());
    body.metadata.uid = task.metadata.uid.clone();
    body.metadata.resource_version = task.metadata.resource_version.clone();
    body.spec.template = Default::default();
    body.spec.payload = None;
    body.status = Some(status.clone());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    api.replace_status(&task.name_any(), &params, &body)
        .await
        .map_err(Error::WriteStatus)
}

/// Writes a DAG's whole status, conditional on the resourceVersion like [`task_status`]. The DAG
/// the API server returns is not read: parsed, a DAG of 500 tasks with large specs is many times
/// its JSON, and the cache gets it from the watch anyway.
pub async fn dag_status(client: &Client, dag: &AxDag, status: &AxDagStatus) -> Result<()> {
    let namespace = dag.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxDag> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": AxDag::api_version(&()),
        "kind": AxDag::kind(&()),
        "metadata": { "name": dag.name_any(), "resourceVersion": dag.resource_version() },
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let request = kube::core::Request::new(api.resource_url())
        .patch_subresource("status", &dag.name_any(), &params, &Patch::Apply(&patch))
        .map_err(|e| Error::WriteStatus(kube::Error::BuildRequest(e)))?;
    client
        .request_text(request)
        .await
        .map_err(Error::WriteStatus)?;
    Ok(())
}

/// Applies a cron's whole status under the operator's field manager, conditional on the
/// resourceVersion the decision read. Returns false when it conflicted or the cron is gone: a
/// newer version is on its way, to decide again on.
pub async fn cron_status(client: &Client, cron: &AxCron, status: &AxCronStatus) -> Result<bool> {
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    let api: Api<AxCron> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": AxCron::api_version(&()),
        "kind": AxCron::kind(&()),
        "metadata": { "name": cron.name_any(), "resourceVersion": cron.resource_version() },
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api
        .patch_status(&cron.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if matches!(ApiError::of(&e), ApiError::Conflict | ApiError::NotFound) => Ok(false),
        Err(e) => Err(Error::WriteStatus(e)),
    }
}

/// Clears a cron's `status.pendingChildren`, as `written` just before, once their children are
/// created. A JSON patch that tests the list is still `written`, not the resourceVersion, so a
/// change elsewhere in the cron does not stop it. Only ever a removal: a list left in part would
/// belong to this Update, not to the next apply, which could then not drop it.
pub async fn cron_pending_created(
    client: &Client,
    cron: &AxCron,
    written: &[PendingChild],
) -> Result<()> {
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    let path = "/status/pendingChildren";
    let ops = serde_json::json!([
        {"op": "test", "path": path, "value": written},
        {"op": "remove", "path": path},
    ]);
    let patch: json_patch::Patch =
        serde_json::from_value(ops).map_err(|e| Error::WriteStatus(kube::Error::SerdeError(e)))?;
    let api: Api<AxCron> = Api::namespaced(client.clone(), &namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(&cron.name_any(), &params, &Patch::<()>::Json(patch))
        .await
        .map_err(Error::WriteStatus)?;
    Ok(())
}

/// Applies a queue's status (the queue status loop is its only writer, so no precondition).
pub async fn queue_status(client: &Client, name: &str, status: &AxQueueStatus) -> Result<()> {
    let api: Api<AxQueue> = Api::all(client.clone());
    let patch = serde_json::json!({
        "apiVersion": AxQueue::api_version(&()),
        "kind": AxQueue::kind(&()),
        "metadata": { "name": name },
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::WriteStatus)?;
    Ok(())
}

/// Takes `finalizer` off `object` (as last seen), preconditioned on its uid and on the finalizer
/// still being where the copy has it: a list changed meanwhile is left for the next look.
pub async fn remove_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let meta = object.meta();
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let Some(index) = finalizers.iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    let (Some(name), Some(uid)) = (meta.name.clone(), meta.uid.clone()) else {
        return Err(Error::Incomplete("name or uid"));
    };
    let path = format!("/metadata/finalizers/{index}");
    let ops = serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(ops)?;
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone, or the list changed since the copy (its next event brings a fresh one).
        Err(e) if matches!(ApiError::of(&e), ApiError::NotFound | ApiError::Invalid) => Ok(()),
        Err(e) => Err(Error::RemoveFinalizer(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("m", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn reconcile_errors_are_categorised_by_status_and_retried_accordingly() {
        use crate::controller::ErrorCategory;
        let cases = [
            (
                Error::WriteStatus(api_error(409, "Conflict")),
                ErrorCategory::Stale,
            ),
            (
                Error::DeletePod(api_error(404, "NotFound")),
                ErrorCategory::Stale,
            ),
            (
                Error::CreatePod(api_error(429, "TooManyRequests")),
                ErrorCategory::Throttled,
            ),
            (
                Error::CreateChild(api_error(500, "InternalError")),
                ErrorCategory::Throttled,
            ),
            (
                Error::UpdateChild(api_error(403, "Forbidden")),
                ErrorCategory::Forbidden,
            ),
            (
                Error::CreatePod(api_error(422, "Invalid")),
                ErrorCategory::InvalidObject,
            ),
            (Error::Incomplete("namespace"), ErrorCategory::InvalidObject),
            (
                Error::RemoveFinalizer(api_error(418, "Teapot")),
                ErrorCategory::Transient,
            ),
        ];
        for (error, category) in cases {
            assert_eq!(error.category(), category, "{error}");
        }
        assert_eq!(Error::CreatePod(api_error(429, "x")).step(), "create_pod");
        // A busy API server is given longer than a conflict, which its next event resolves.
        assert!(ErrorCategory::Throttled.retry_after() > ErrorCategory::Stale.retry_after());
    }

    #[test]
    fn status_codes_mean_what_the_api_conventions_say() {
        assert_eq!(
            ApiError::of(&api_error(409, "AlreadyExists")),
            ApiError::AlreadyExists
        );
        assert_eq!(
            ApiError::of(&api_error(409, "Conflict")),
            ApiError::Conflict
        );
        assert_eq!(
            ApiError::of(&api_error(404, "NotFound")),
            ApiError::NotFound
        );
        assert_eq!(
            ApiError::of(&api_error(403, "Forbidden")),
            ApiError::Forbidden
        );
        assert_eq!(ApiError::of(&api_error(422, "Invalid")), ApiError::Invalid);
        assert_eq!(
            ApiError::of(&api_error(429, "TooManyRequests")),
            ApiError::Unavailable
        );
        assert_eq!(
            ApiError::of(&api_error(503, "ServiceUnavailable")),
            ApiError::Unavailable
        );
        assert_eq!(ApiError::of(&api_error(418, "Teapot")), ApiError::Other);
    }
}
