//! `kubectl ax cron`: list AxCrons, fire one now, suspend and resume. The table and the manual
//! child are pure functions of the AxCron; the rest reads and writes through the user's kubeconfig.
//!
//! `trigger` works like `kubectl create job --from=cronjob/NAME`: the CLI creates one child from
//! the cron's template itself, named `<cron>-manual-<unix seconds>`, owned by the cron (deleted
//! with it) and labelled `ax.dev/cron` like a scheduled child, but without the
//! `ax.dev/scheduled-time` label: it is no firing of the schedule, so it changes neither
//! `lastScheduleTime` nor the misfire accounting, and the concurrency policy and history limits
//! (which are about scheduled runs) leave it alone.

use std::collections::BTreeMap;
use std::io::Write;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource as _, ResourceExt};

use crate::api::{AxCron, AxDag, AxTask, LABEL_CRON};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::format::relative;
use crate::client::operator;
use crate::core::conditions;

use super::args::{CronArgs, CronCommand, CronListArgs};
use super::format::{self, qualified_name};
use super::output::write_objects;

/// On a child created by `kubectl ax cron trigger` (the value: who asked, as the CLI knows it).
pub const ANNOTATION_MANUAL: &str = "ax.dev/manual-trigger";

pub async fn run(ctx: &Ctx, args: &CronArgs) -> Result<(), ClientError> {
    match &args.command {
        CronCommand::List(list) => self::list(ctx, list).await,
        CronCommand::Trigger { name } => trigger(ctx, name).await,
        CronCommand::Suspend { name } => set_suspend(ctx, name, true).await,
        CronCommand::Resume { name } => set_suspend(ctx, name, false).await,
    }
}

fn crons(ctx: &Ctx, namespace: Option<&str>) -> Api<AxCron> {
    match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    }
}

pub async fn get(ctx: &Ctx, name: &str) -> Result<AxCron, ClientError> {
    let op = Op::new("get", Resource::Cron)
        .namespace(Some(&ctx.namespace))
        .name(name);
    crons(ctx, Some(&ctx.namespace))
        .get(name)
        .await
        .map_err(|e| from_kube(&op, e))
}

async fn list(ctx: &Ctx, args: &CronListArgs) -> Result<(), ClientError> {
    let namespace = ctx.list_namespace();
    let op = Op::new("list", Resource::Cron).namespace(namespace);
    let mut items = crons(ctx, namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| from_kube(&op, e))?
        .items;
    items.sort_by_key(|c| (c.namespace(), c.name_any()));
    let all = ctx.global.all_namespaces;
    let mut out = std::io::stdout().lock();
    if write_objects(&mut out, args.output.as_ref(), "axcron", &items, false)? {
        return Ok(());
    }
    if items.is_empty() {
        match namespace {
            Some(ns) => writeln!(out, "No AxCrons in namespace {ns}.")?,
            None => writeln!(out, "No AxCrons.")?,
        }
        return Ok(());
    }
    let (headers, rows) = table(&items, Timestamp::now(), all);
    let text = if args.no_headers {
        format::table_without_headers(&headers, &rows)
    } else {
        format::table(&headers, &rows)
    };
    write!(out, "{text}")?;
    Ok(())
}

/// The `cron list` table: what `kubectl get axcrons` shows, with times relative to `now`.
pub fn table(crons: &[AxCron], now: Timestamp, all: bool) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let headers = vec![
        "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "NEXT", "STATUS",
    ];
    let rows = crons
        .iter()
        .map(|c| {
            let status = c.status.clone().unwrap_or_default();
            let invalid = conditions::find(&status.conditions, conditions::INVALID_SPEC, true);
            vec![
                qualified_name(c.namespace().as_deref(), &c.name_any(), all),
                c.spec.schedule.clone(),
                if c.spec.time_zone.is_empty() {
                    "UTC".into()
                } else {
                    c.spec.time_zone.clone()
                },
                c.spec.suspend.to_string(),
                status.active_count.to_string(),
                status
                    .last_schedule_time
                    .map_or("-".into(), |t| relative(now, t)),
                match status.next_schedule_time {
                    Some(_) if c.spec.suspend => "-".into(),
                    Some(t) => relative(now, t),
                    None => "-".into(),
                },
                match invalid {
                    Some(k) => format!("InvalidSpec: {}", k.message),
                    None if c.spec.suspend => conditions::SUSPENDED.into(),
                    None => "Scheduled".into(),
                },
            ]
        })
        .collect();
    (headers, rows)
}

/// What `trigger` creates: one AxTask or one AxDag from the cron's template.
// One value per run: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ManualChild {
    Task(AxTask),
    Dag(AxDag),
}

/// The child a manual trigger at `now` creates, or a usage error naming what is missing.
pub fn manual_child(cron: &AxCron, now: Timestamp) -> Result<ManualChild, ClientError> {
    let name = cron.name_any();
    let uid = cron
        .uid()
        .ok_or_else(|| ClientError::Usage(format!("axcron/{name} has no uid yet")))?;
    let metadata = ObjectMeta {
        name: Some(format!("{name}-manual-{}", now.as_second())),
        namespace: cron.namespace(),
        labels: Some(BTreeMap::from([(LABEL_CRON.to_owned(), name.clone())])),
        annotations: Some(BTreeMap::from([(
            ANNOTATION_MANUAL.to_owned(),
            "kubectl-ax".to_owned(),
        )])),
        owner_references: Some(vec![OwnerReference {
            api_version: AxCron::api_version(&()).into_owned(),
            kind: AxCron::kind(&()).into_owned(),
            name: name.clone(),
            uid,
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        ..ObjectMeta::default()
    };
    match (&cron.spec.task, &cron.spec.dag) {
        (Some(spec), None) => Ok(ManualChild::Task(AxTask {
            metadata,
            spec: spec.clone(),
            status: None,
        })),
        (None, Some(spec)) => Ok(ManualChild::Dag(AxDag {
            metadata,
            spec: spec.clone(),
            status: None,
        })),
        _ => Err(ClientError::Usage(format!(
            "axcron/{name} must name exactly one of spec.task and spec.dag; nothing to create"
        ))),
    }
}

async fn trigger(ctx: &Ctx, name: &str) -> Result<(), ClientError> {
    let cron = get(ctx, name).await?;
    operator::check(ctx).await?;
    let params = PostParams {
        field_manager: Some("kubectl-ax".into()),
        ..PostParams::default()
    };
    let ns = ctx.namespace.as_str();
    let created = match manual_child(&cron, Timestamp::now())? {
        ManualChild::Task(task) => {
            let op = Op::new("create", Resource::Task).namespace(Some(ns));
            let api: Api<AxTask> = Api::namespaced(ctx.client.clone(), ns);
            let t = api
                .create(&params, &task)
                .await
                .map_err(|e| from_kube(&op, e))?;
            format!("axtask/{}", t.name_any())
        }
        ManualChild::Dag(dag) => {
            let op = Op::new("create", Resource::Dag).namespace(Some(ns));
            let api: Api<AxDag> = Api::namespaced(ctx.client.clone(), ns);
            let d = api
                .create(&params, &dag)
                .await
                .map_err(|e| from_kube(&op, e))?;
            format!("axdag/{}", d.name_any())
        }
    };
    println!("{created} created (manual run of axcron/{name})");
    Ok(())
}

async fn set_suspend(ctx: &Ctx, name: &str, suspend: bool) -> Result<(), ClientError> {
    let op = Op::new("patch", Resource::Cron)
        .namespace(Some(&ctx.namespace))
        .name(name);
    let patch = serde_json::json!({"spec": {"suspend": suspend}});
    let params = PatchParams {
        field_manager: Some("kubectl-ax".into()),
        ..PatchParams::default()
    };
    crons(ctx, Some(&ctx.namespace))
        .patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| from_kube(&op, e))?;
    let done = if suspend { "suspended" } else { "resumed" };
    println!("axcron/{name} {done}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(extra: serde_json::Value) -> AxCron {
        let mut v = serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxCron",
            "metadata": {"name": "nightly", "namespace": "ns", "uid": "u-1"},
            "spec": {"schedule": "0 2 * * *",
                "task": {"type": "t", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}},
        });
        if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, val) in extra {
                obj.insert(k.clone(), val.clone());
            }
        }
        serde_json::from_value(v).expect("an AxCron")
    }

    #[test]
    fn a_manual_child_is_owned_labelled_and_no_firing_of_the_schedule() {
        let c = cron(serde_json::json!({}));
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let ManualChild::Task(t) = manual_child(&c, now).unwrap() else {
            panic!("a task cron makes a task");
        };
        assert_eq!(t.name_any(), "nightly-manual-1800000000");
        assert_eq!(t.labels()[LABEL_CRON], "nightly");
        assert!(
            !t.labels().contains_key(crate::api::LABEL_SCHEDULED_TIME),
            "not a scheduled firing"
        );
        let owner = &t.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("AxCron", "u-1"));
        assert_eq!(t.spec.task_type, "t");
    }

    #[test]
    fn a_cron_with_neither_template_is_a_clear_error() {
        let mut c = cron(serde_json::json!({}));
        c.spec.task = None;
        let err = manual_child(&c, Timestamp::now()).err().unwrap();
        assert!(
            err.to_string()
                .contains("exactly one of spec.task and spec.dag")
        );
    }

    #[test]
    fn the_table_shows_suspension_and_invalid_specs() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut suspended = cron(serde_json::json!({}));
        suspended.spec.suspend = true;
        let invalid = cron(serde_json::json!({"status": {"conditions": [{
            "type": "InvalidSpec", "status": "True", "reason": "InvalidSchedule",
            "message": "field 3 (day of month): 32 out of range",
            "lastTransitionTime": "2027-01-15T08:00:00Z"}]}}));
        let (headers, rows) = table(&[suspended, invalid], now, false);
        assert_eq!(headers.len(), rows[0].len());
        assert_eq!(rows[0][3], "true");
        assert_eq!(rows[0][7], "Suspended");
        assert_eq!(rows[0][2], "UTC", "an empty timeZone is UTC");
        assert!(rows[1][7].contains("32 out of range"), "{:?}", rows[1]);
    }
}
