//! Tasks with `spec.templateRef` (client required): completed from their AxTaskTemplate once,
//! before they are admitted, by a write of the spec (`core::template`); held with condition
//! `TemplateResolved` False while the template does not exist. A template that appears or changes
//! wakes the tasks waiting for it.

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use std::time::Duration;
use tracing::debug;

use super::super::cache::CachedTask;
use super::super::write::{self, ApiError};
use super::super::{Ctx, Error, FIELD_MANAGER, Result};
use crate::api::{AxTask, AxTaskSpec, AxTaskTemplate, TemplateUse};
use crate::core::conditions::{self, TEMPLATE_RESOLVED, reason};
use crate::core::template::{RESOLVED_ANNOTATION, resolve};

/// Where a task stands with its template in this reconcile.
pub enum Resolution {
    /// No reference, or resolved: decide on the task as it is, recording the template it was
    /// completed from (if any) with the next status write.
    Ready(Option<TemplateUse>),
    /// Waiting for its template, or its spec just completed: this reconcile ends here.
    Done(Requeue),
}

/// Resolves `task`'s `templateRef` if it has one not resolved yet.
pub async fn resolve_template(task: &AxTask, ctx: &Ctx) -> Result<Resolution> {
    let Some(reference) = &task.spec.template_ref else {
        return Ok(Resolution::Ready(None));
    };
    if let Some(version) = task.annotations().get(RESOLVED_ANNOTATION) {
        return Ok(Resolution::Ready(Some(TemplateUse {
            name: reference.name.clone(),
            resource_version: version.clone(),
        })));
    }
    // A reference added to a task already admitted is an edit of a spec that runs as it is.
    if task.status.as_ref().and_then(|s| s.phase).is_some() {
        return Ok(Resolution::Ready(None));
    }
    if !super::super::cache_listed(&ctx.templates) {
        return Ok(Resolution::Done(Requeue::requeue(Duration::from_millis(
            500,
        ))));
    }
    let namespace = task.namespace().ok_or(Error::Incomplete("namespace"))?;
    let found = ctx
        .templates
        .get(&ObjectRef::new(&reference.name).within(&namespace));
    let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(template) = found else {
        hold(task, &reference.name, ctx).await?;
        // The template's watch event wakes it.
        return Ok(Resolution::Done(Requeue::await_change()));
    };
    // The cache keeps no payload or pod template: complete the task as the API server has it.
    let Some(whole) = api
        .get_opt(&task.name_any())
        .await
        .map_err(|e| Error::Read("the task", e))?
    else {
        return Ok(Resolution::Done(Requeue::await_change()));
    };
    if whole.uid() != task.uid() {
        return Ok(Resolution::Done(Requeue::await_change()));
    }
    let spec = completed_spec(&whole, &template)?;
    let version = template.resource_version().unwrap_or_default();
    // Conditional on the version read: a concurrent edit of the task is resolved again.
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": whole.resource_version(),
            "annotations": {RESOLVED_ANNOTATION: version},
        },
        "spec": spec,
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch(&task.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            debug!(
                template = reference.name,
                version, "spec completed from its template"
            );
        }
        Err(e) if matches!(ApiError::of(&e), ApiError::Conflict | ApiError::NotFound) => {}
        Err(e) => return Err(Error::WriteSpec(e)),
    }
    Ok(Resolution::Done(Requeue::await_change()))
}

/// `task`'s spec completed from `template`, with the env a DAG child gets from its item or DAG in
/// the containers the template brought.
fn completed_spec(task: &AxTask, template: &AxTaskTemplate) -> Result<AxTaskSpec> {
    let json = |e: serde_json::Error| Error::Read("the template", kube::Error::SerdeError(e));
    let own = serde_json::to_value(&task.spec).map_err(json)?;
    let given = serde_json::to_value(&template.spec).map_err(json)?;
    let spec: AxTaskSpec = serde_json::from_value(resolve(&own, &given)).map_err(json)?;
    let vars = crate::core::dag::child_vars(task.metadata.labels.as_ref(), spec.payload.as_ref());
    Ok(match vars.is_empty() {
        true => spec,
        false => crate::core::dag::child_spec(&spec, Vec::new(), &vars),
    })
}

/// Records that `task` waits for template `name` (once: a Warning Event with it).
async fn hold(task: &AxTask, name: &str, ctx: &Ctx) -> Result<()> {
    let message = format!(
        "AxTaskTemplate {name} does not exist in namespace {}; the task waits for it",
        task.namespace().unwrap_or_default()
    );
    let mut status = task.status.clone().unwrap_or_default();
    let held = conditions::find(&status.conditions, TEMPLATE_RESOLVED, false)
        .is_some_and(|c| c.message == message);
    if held {
        return Ok(());
    }
    conditions::set(
        &mut status.conditions,
        TEMPLATE_RESOLVED,
        false,
        reason::TEMPLATE_NOT_FOUND,
        &message,
        task.metadata.generation,
        jiff::Timestamp::now(),
    );
    match write::task_status(&ctx.client, task, &status).await {
        Ok(_) => {
            ctx.events.publish(
                task,
                EventType::Warning,
                reason::TEMPLATE_NOT_FOUND,
                &message,
            );
            Ok(())
        }
        Err(Error::WriteStatus(e))
            if matches!(ApiError::of(&e), ApiError::Conflict | ApiError::NotFound) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Wakes the tasks waiting for each template that appears or changes.
pub async fn wake_waiting(
    ctx: Ctx,
    templates: impl Stream<Item = std::result::Result<AxTaskTemplate, kube::runtime::watcher::Error>>,
) {
    templates
        .for_each(|template| {
            let ctx = ctx.clone();
            async move {
                let Ok(template) = template else { return };
                let (namespace, name) = (template.namespace(), template.name_any());
                for cached in ctx.tasks.state() {
                    let CachedTask::Whole(task) = cached.as_ref() else {
                        continue;
                    };
                    let waits = task.namespace() == namespace
                        && task
                            .spec
                            .template_ref
                            .as_ref()
                            .is_some_and(|r| r.name == name)
                        && !task.annotations().contains_key(RESOLVED_ANNOTATION);
                    if waits {
                        let _ = ctx
                            .wake
                            .unbounded_send(ObjectRef::from_obj(cached.as_ref()));
                    }
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_child_gets_its_item_env_in_the_templates_containers() {
        let task: AxTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "d-map-3", "labels": {"ax.dev/dag": "d", "ax.dev/dag-task": "map", "ax.dev/item": "3"}},
            "spec": {"templateRef": {"name": "t"}, "payload": {"item": {"order": 9}, "itemIndex": 3}},
        }))
        .expect("a task");
        let template: AxTaskTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTaskTemplate",
            "metadata": {"name": "t"},
            "spec": {"type": "pack", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}},
        }))
        .expect("a template");
        let spec = completed_spec(&task, &template).expect("completed");
        assert_eq!(spec.task_type, "pack");
        let env = spec.template.containers()[0]
            .env
            .clone()
            .unwrap_or_default();
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("AX_ITEM").as_deref(), Some(r#"{"order":9}"#));
        assert_eq!(value("AX_ITEM_INDEX").as_deref(), Some("3"));
    }
}
