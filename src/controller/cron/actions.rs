//! What a decision does to a cron's children: create the due ones (named, labelled and owned for
//! their scheduled time), cancel those `Replace` replaces, delete those beyond the history limits.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::debug;

use crate::api::{ANNOTATION_CATCH_UP, AxCron, AxDag, AxTask, LABEL_CRON, LABEL_SCHEDULED_TIME};
use crate::controller::write::{ApiError, api_message};
use crate::controller::{Ctx, Error, FIELD_MANAGER, Result};
use crate::core::cron::status::{ChildKind, ChildState, Outcome};
use crate::core::cron::{self as core, Decision, Finished};
use crate::core::trace::{self, TRACELINK_ANNOTATION};

use super::events::publish;
use crate::controller::owner_index::is_controlled_by;

pub(super) enum Created {
    Yes,
    /// Created before (by an earlier run of the operator, or on a lagging cache).
    Existed,
    /// An object this cron does not control has the child's name.
    NameTaken(String),
    /// The API server refused the child (its template is invalid as an AxTask/AxDag).
    Rejected(String),
}

pub(super) fn child_metadata(cron: &AxCron, uid: &str, firing: &core::Firing) -> ObjectMeta {
    let mut annotations = BTreeMap::new();
    if firing.catch_up {
        annotations.insert(ANNOTATION_CATCH_UP.to_owned(), "true".to_owned());
    }
    ObjectMeta {
        name: Some(firing.name.clone()),
        namespace: cron.namespace(),
        labels: Some(BTreeMap::from([
            (LABEL_CRON.to_owned(), cron.name_any()),
            (
                LABEL_SCHEDULED_TIME.to_owned(),
                firing.scheduled.as_second().to_string(),
            ),
        ])),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: Some(vec![OwnerReference {
            api_version: AxCron::api_version(&()).into_owned(),
            kind: AxCron::kind(&()).into_owned(),
            name: cron.name_any(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        ..ObjectMeta::default()
    }
}

pub(super) async fn create_child(
    cron: &AxCron,
    uid: &str,
    firing: &core::Firing,
    ctx: &Ctx,
) -> Result<Created> {
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    let mut metadata = child_metadata(cron, uid, firing);
    // While traces are exported each firing is a trace of its own, and the child's run links to
    // the firing's span.
    let traced = ctx.traces.sampler().map(|sampler| {
        let firing_trace = trace::firing_context(uid, firing.scheduled, sampler);
        metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                TRACELINK_ANNOTATION.to_owned(),
                trace::firing_link(&firing_trace, uid),
            );
        firing_trace
    });
    let created = match (&cron.spec.task, &cron.spec.dag) {
        (Some(task), _) => {
            let child = AxTask {
                metadata,
                spec: task.clone(),
                status: None,
            };
            create_owned(
                Api::namespaced(ctx.client.clone(), &namespace),
                &child,
                uid,
                firing,
            )
            .await
        }
        (None, Some(dag)) => {
            let child = AxDag {
                metadata,
                spec: dag.clone(),
                status: None,
            };
            create_owned(
                Api::namespaced(ctx.client.clone(), &namespace),
                &child,
                uid,
                firing,
            )
            .await
        }
        (None, None) => Err(Error::Incomplete("task or dag")),
    }?;
    if let (Created::Yes, Some(firing_trace)) = (&created, traced) {
        let span = trace::firing_span(
            &firing_trace,
            &namespace,
            &cron.name_any(),
            uid,
            &firing.name,
            firing.scheduled,
            jiff::Timestamp::now(),
            firing.catch_up,
        );
        ctx.traces.record(span.into_iter().collect());
    }
    Ok(created)
}

pub(super) async fn create_owned<K>(
    api: Api<K>,
    child: &K,
    uid: &str,
    firing: &core::Firing,
) -> Result<Created>
where
    K: Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, child).await {
        Ok(_) => {
            debug!(child = firing.name, "child created");
            Ok(Created::Yes)
        }
        Err(e) if ApiError::of(&e) == ApiError::AlreadyExists => match api
            .get_opt(&firing.name)
            .await
            .map_err(|e| Error::Read("the existing child", e))?
        {
            // Deleted in between (history limit): it was there, the time was handled.
            None => Ok(Created::Existed),
            Some(existing) if is_controlled_by(&existing, uid) => Ok(Created::Existed),
            Some(_) => Ok(Created::NameTaken(format!(
                "{} exists and does not belong to this cron: scheduled time {} skipped",
                firing.name, firing.scheduled
            ))),
        },
        Err(e) if ApiError::of(&e) == ApiError::Invalid => Ok(Created::Rejected(format!(
            "the API server refused child {} for {}: {}",
            firing.name,
            firing.scheduled,
            api_message(&e)
        ))),
        Err(e) => Err(Error::CreateChild(e)),
    }
}

/// `concurrencyPolicy: Replace`: cancels the active children the normal way (`spec.cancel`).
pub(super) async fn cancel_replaced(
    cron: &AxCron,
    decision: &Decision,
    children: &[ChildState],
    ctx: &Ctx,
) -> Result<()> {
    if decision.cancel.is_empty() {
        return Ok(());
    }
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    let patch = Patch::Merge(serde_json::json!({"spec": {"cancel": true}}));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for name in &decision.cancel {
        let Some(child) = children.iter().find(|c| &c.name == name) else {
            continue;
        };
        if child.canceling {
            continue;
        }
        let result = match child.kind {
            ChildKind::Task => Api::<AxTask>::namespaced(ctx.client.clone(), &namespace)
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
            ChildKind::Dag => Api::<AxDag>::namespaced(ctx.client.clone(), &namespace)
                .patch(name, &params, &patch)
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {
                let replacement = decision.create.last().map_or("", |f| f.name.as_str());
                publish(
                    cron,
                    EventType::Normal,
                    "Replaced",
                    &format!(
                        "canceled {name}: {replacement} replaces it (concurrencyPolicy Replace)"
                    ),
                    ctx,
                );
            }
            Err(e) if ApiError::of(&e) == ApiError::NotFound => {}
            Err(e) => return Err(Error::UpdateChild(e)),
        }
    }
    Ok(())
}

/// Deletes the finished children beyond `successfulRunsHistoryLimit` / `failedRunsHistoryLimit`
/// (in the background: the garbage collector removes their pods and tasks through ownership).
pub(super) async fn delete_beyond_history(
    cron: &AxCron,
    children: &mut Vec<ChildState>,
    ctx: &Ctx,
) -> Result<()> {
    let finished: Vec<Finished> = children
        .iter()
        .filter_map(|c| match c.outcome {
            Outcome::Active => None,
            Outcome::Succeeded(_) => Some(Finished {
                name: c.name.clone(),
                scheduled: c.scheduled,
                succeeded: true,
            }),
            Outcome::Failed => Some(Finished {
                name: c.name.clone(),
                scheduled: c.scheduled,
                succeeded: false,
            }),
        })
        .collect();
    let keep = |limit: i32| usize::try_from(limit).unwrap_or(0);
    let delete = core::history_to_delete(
        &finished,
        keep(cron.spec.successful_runs_history_limit),
        keep(cron.spec.failed_runs_history_limit),
    );
    if delete.is_empty() {
        return Ok(());
    }
    let namespace = cron.namespace().ok_or(Error::Incomplete("namespace"))?;
    for name in &delete {
        let Some(child) = children.iter().find(|c| &c.name == name) else {
            continue;
        };
        let result = match child.kind {
            ChildKind::Task => Api::<AxTask>::namespaced(ctx.client.clone(), &namespace)
                .delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
            ChildKind::Dag => Api::<AxDag>::namespaced(ctx.client.clone(), &namespace)
                .delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {
                let kind = if child.outcome == Outcome::Failed {
                    "failedRunsHistoryLimit"
                } else {
                    "successfulRunsHistoryLimit"
                };
                publish(
                    cron,
                    EventType::Normal,
                    "DeletedHistory",
                    &format!("deleted finished child {name} (beyond {kind})"),
                    ctx,
                );
            }
            Err(e) if ApiError::of(&e) == ApiError::NotFound => {}
            Err(e) => return Err(Error::DeleteChild(e)),
        }
    }
    children.retain(|c| !delete.contains(&c.name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::cron::children::scheduled_time;
    use jiff::Timestamp;

    use crate::core::cron::fixtures::{cron, task};

    #[test]
    fn children_are_named_labelled_and_owned_for_their_time() {
        let c = cron(
            "nightly",
            serde_json::json!({"schedule": "@daily", "task": task()}),
        );
        let scheduled = Timestamp::from_second(1_767_225_600).unwrap();
        let firing = core::Firing {
            scheduled,
            name: core::child_name("nightly", scheduled),
            catch_up: true,
        };
        let meta = child_metadata(&c, "u-1", &firing);
        assert_eq!(meta.name.as_deref(), Some("nightly-1767225600"));
        let labels = meta.labels.clone().unwrap();
        assert_eq!(labels[LABEL_CRON], "nightly");
        assert_eq!(labels[LABEL_SCHEDULED_TIME], "1767225600");
        assert_eq!(meta.annotations.unwrap()[ANNOTATION_CATCH_UP], "true");
        let owner = &meta.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("AxCron", "u-1", Some(true))
        );

        let child = AxTask {
            metadata: ObjectMeta {
                labels: None,
                ..child_metadata(&c, "u-1", &firing)
            },
            spec: serde_json::from_value(task()).unwrap(),
            status: None,
        };
        // Without the label the name's suffix still gives the time.
        assert_eq!(scheduled_time(&child, "nightly-"), Some(scheduled));
    }
}
