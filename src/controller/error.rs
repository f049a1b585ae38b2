//! Why a reconcile failed, and what that means for when to try again.

use std::time::Duration;

use super::write;

/// Why a reconcile failed, by the step that failed: the step and its [`ErrorCategory`] label
/// `ax_reconcile_errors_total`, and the category decides when `error_policy` tries again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {0}: {1}")]
    Read(&'static str, #[source] kube::Error),
    #[error("writing the status: {0}")]
    WriteStatus(#[source] kube::Error),
    #[error("creating the worker pod: {0}")]
    CreatePod(#[source] kube::Error),
    #[error("deleting a worker pod: {0}")]
    DeletePod(#[source] kube::Error),
    #[error("creating a child: {0}")]
    CreateChild(#[source] kube::Error),
    #[error("updating a child (cancel or re-run): {0}")]
    UpdateChild(#[source] kube::Error),
    #[error("deleting a child: {0}")]
    DeleteChild(#[source] kube::Error),
    #[error("removing a finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("deleting the task (ttlSecondsAfterFinished): {0}")]
    DeleteTask(#[source] kube::Error),
    #[error("completing the spec from its template: {0}")]
    WriteSpec(#[source] kube::Error),
    #[error("serializing {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("object has no {0}")]
    Incomplete(&'static str),
}

/// What kind of failure an [`Error`] is, for metrics and for when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCategory {
    /// The object (or what the operator made of it) is invalid: only a change of it can help.
    InvalidObject,
    /// 429 or 5xx: the API server is busy or failing; back off.
    Throttled,
    /// The object changed or vanished meanwhile: its next event brings the new state.
    Stale,
    /// 403: RBAC, a ResourceQuota or an admission webhook refused; may pass later.
    Forbidden,
    /// Transport errors and anything else.
    Transient,
}

impl ErrorCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::InvalidObject => "invalid_object",
            ErrorCategory::Throttled => "throttled",
            ErrorCategory::Stale => "stale",
            ErrorCategory::Forbidden => "forbidden",
            ErrorCategory::Transient => "transient",
        }
    }

    /// How long until the failed reconcile runs again (an event of the object runs it sooner).
    pub fn retry_after(self) -> Duration {
        match self {
            ErrorCategory::InvalidObject => Duration::from_secs(300),
            ErrorCategory::Throttled => Duration::from_secs(10),
            ErrorCategory::Stale => Duration::from_secs(1),
            ErrorCategory::Forbidden => Duration::from_secs(30),
            ErrorCategory::Transient => Duration::from_secs(2),
        }
    }
}

impl Error {
    /// The step that failed, as a metric label.
    pub fn step(&self) -> &'static str {
        match self {
            Error::Read(..) => "read",
            Error::WriteStatus(_) => "write_status",
            Error::CreatePod(_) => "create_pod",
            Error::DeletePod(_) => "delete_pod",
            Error::CreateChild(_) => "create_child",
            Error::UpdateChild(_) => "update_child",
            Error::DeleteChild(_) => "delete_child",
            Error::RemoveFinalizer(_) => "remove_finalizer",
            Error::DeleteTask(_) => "delete_task",
            Error::WriteSpec(_) => "write_spec",
            Error::Serialize(_) => "serialize",
            Error::Incomplete(_) => "incomplete_object",
        }
    }

    /// The API server's error, if the step was a request.
    pub fn api(&self) -> Option<&kube::Error> {
        match self {
            Error::Read(_, e)
            | Error::WriteStatus(e)
            | Error::CreatePod(e)
            | Error::DeletePod(e)
            | Error::CreateChild(e)
            | Error::UpdateChild(e)
            | Error::DeleteChild(e)
            | Error::RemoveFinalizer(e)
            | Error::DeleteTask(e)
            | Error::WriteSpec(e) => Some(e),
            Error::Serialize(_) | Error::Incomplete(_) => None,
        }
    }

    pub fn category(&self) -> ErrorCategory {
        let Some(e) = self.api() else {
            return ErrorCategory::InvalidObject;
        };
        match write::ApiError::of(e) {
            write::ApiError::Conflict
            | write::ApiError::AlreadyExists
            | write::ApiError::NotFound => ErrorCategory::Stale,
            write::ApiError::Forbidden => ErrorCategory::Forbidden,
            write::ApiError::Invalid => ErrorCategory::InvalidObject,
            write::ApiError::Unavailable => ErrorCategory::Throttled,
            write::ApiError::Other => ErrorCategory::Transient,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
