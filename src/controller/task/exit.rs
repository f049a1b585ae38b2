//! An AxTask's exit handler (`spec.onExit`, decided in `core::task::exit`; client required): found
//! in the cache by its fixed name, created once the status records it.

use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use tracing::debug;

use super::super::owner_index::is_controlled_by;
use super::super::write::ApiError;
use super::super::{Ctx, Error, FIELD_MANAGER, Result};
use crate::api::{AxTask, LABEL_EXIT_OF, TaskPhase};
use crate::core::dag::status::child_phase;
use crate::core::task::exit;
use crate::core::worker::label_value;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The phase of `task`'s exit handler, if the cache shows one that `task` controls.
pub fn handler_phase(task: &AxTask, ctx: &Ctx) -> Option<TaskPhase> {
    task.spec.on_exit.as_ref()?;
    let uid = task.uid()?;
    let name = exit::handler_name(&task.name_any());
    let cached = ctx
        .tasks
        .get(&ObjectRef::new(&name).within(&task.namespace()?))?;
    let handler = cached.child()?;
    is_controlled_by(handler.as_ref(), &uid).then(|| child_phase(handler))
}

/// Creates `task`'s exit handler (a second create finds the first).
pub async fn create_handler(task: &AxTask, ctx: &Ctx) -> Result<()> {
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = task.name_any();
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    // The cache keeps no handler template or payload: read the task whole, with the status that
    // records the handler.
    let Some(whole) = api
        .get_opt(&name)
        .await
        .map_err(|e| Error::Read("the task", e))?
    else {
        return Ok(());
    };
    let (Some(handler), Some(uid)) = (whole.spec.on_exit.as_ref(), whole.uid()) else {
        return Ok(());
    };
    if whole.uid() != task.uid() {
        return Ok(());
    }
    let status = whole.status.clone().unwrap_or_default();
    let mut child = AxTask::new(
        &exit::handler_name(&name),
        exit::handler_spec(handler, &name, &status),
    );
    child.metadata.namespace = Some(namespace);
    child.metadata.labels = Some(BTreeMap::from([(
        LABEL_EXIT_OF.to_owned(),
        label_value(&name),
    )]));
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: AxTask::api_version(&()).into_owned(),
        kind: AxTask::kind(&()).into_owned(),
        name: name.clone(),
        uid,
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, &child).await {
        Ok(_) => {
            debug!(handler = child.name_any(), "exit handler created");
            Ok(())
        }
        // Created before, by an earlier run of the operator.
        Err(e) if ApiError::of(&e) == ApiError::AlreadyExists => Ok(()),
        Err(e) => Err(Error::CreateChild(e)),
    }
}
