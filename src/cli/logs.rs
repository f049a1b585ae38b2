//! `kubectl ax logs TASK [--attempt N | --previous] [-f]`: the logs of the worker pod of one
//! attempt. Which attempt and which pod is decided by `attempt_wanted` and `pod_candidates`
//! (pure); `run` finds the pod and streams its logs (client required).

use std::io::Write;

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, LogParams};
use kube::{Api, ResourceExt};

use crate::api::AxTask;
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::task::main_container;
use crate::core::worker::{LABEL_ATTEMPT, LABEL_TASK, label_value, pod_name};

use super::args::LogsArgs;

/// The attempt whose logs to show: `--attempt N`, the one before the current with `--previous`,
/// else the current one.
pub fn attempt_wanted(
    task: &AxTask,
    attempt: Option<i32>,
    previous: bool,
) -> Result<i32, ClientError> {
    let current = task.status.as_ref().map(|s| s.attempt).unwrap_or(0);
    let name = task.name_any();
    if current == 0 {
        return Err(ClientError::NotMet(format!(
            "axtask/{name} has not started an attempt yet: no worker pod, no logs (kubectl ax describe {name} says why it waits)"
        )));
    }
    let wanted = match (attempt, previous) {
        (Some(n), _) => n,
        (None, true) => current - 1,
        (None, false) => current,
    };
    if wanted < 1 || wanted > current {
        return Err(ClientError::Usage(format!(
            "axtask/{name} has attempts 1 to {current}; there is no attempt {wanted}"
        )));
    }
    Ok(wanted)
}

/// Names the pod of `attempt` may have, best first: the operator's record of the attempt, the
/// current worker, the deterministic `<task>-<attempt>`.
pub fn pod_candidates(task: &AxTask, attempt: i32) -> Vec<String> {
    let status = task.status.clone().unwrap_or_default();
    let mut names: Vec<String> = status
        .attempts
        .iter()
        .filter(|a| a.attempt == attempt)
        .map(|a| a.pod.clone())
        .collect();
    if status.attempt == attempt
        && let Some(worker) = status.worker
    {
        names.push(worker);
    }
    names.push(pod_name(&task.name_any(), attempt));
    names.dedup();
    names
}

async fn find_pod(ctx: &Ctx, task: &AxTask, attempt: i32) -> Result<Pod, ClientError> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let labels = format!(
        "{LABEL_TASK}={},{LABEL_ATTEMPT}={attempt}",
        label_value(&task.name_any())
    );
    let list = Op::new("list", Resource::Pod).namespace(Some(&ctx.namespace));
    let labelled = api
        .list(&ListParams::default().labels(&labels))
        .await
        .map_err(|e| from_kube(&list, e))?;
    if let Some(pod) = labelled.items.into_iter().next() {
        return Ok(pod);
    }
    let candidates = pod_candidates(task, attempt);
    for name in &candidates {
        let get = Op::new("get", Resource::Pod)
            .namespace(Some(&ctx.namespace))
            .name(name);
        if let Some(pod) = api.get_opt(name).await.map_err(|e| from_kube(&get, e))? {
            return Ok(pod);
        }
    }
    // A succeeded `forEach` item's pod is deleted at once (docs/dags.md): say so, not just "gone".
    let why = match crate::core::task::is_fan_out_item(task)
        && task.status.as_ref().and_then(|s| s.phase) == Some(crate::api::TaskPhase::Succeeded)
    {
        true => " (a forEach item's pod is deleted once it has succeeded)",
        false => "",
    };
    Err(ClientError::NotMet(format!(
        "the pod of attempt {attempt} of axtask/{} ({}) is gone, and its logs with it{why}",
        task.name_any(),
        candidates.first().cloned().unwrap_or_default()
    )))
}

pub async fn run(ctx: &Ctx, args: &LogsArgs) -> Result<(), ClientError> {
    let task = ctx.get_task(&args.task).await?;
    let attempt = attempt_wanted(&task, args.attempt, args.previous)?;
    let pod = find_pod(ctx, &task, attempt).await?;
    let container = args.container.clone().or_else(|| main_container(&pod));
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let op = Op::new("get", Resource::PodLog)
        .namespace(Some(&ctx.namespace))
        .name(&pod.name_any());
    let params = LogParams {
        container,
        follow: args.follow,
        tail_lines: args.tail,
        ..LogParams::default()
    };
    let mut stream = api
        .log_stream(&pod.name_any(), &params)
        .await
        .map_err(|e| from_kube(&op, e))?;
    let mut buffer = vec![0u8; 16 * 1024];
    let mut out = std::io::stdout().lock();
    loop {
        let n = stream
            .read(&mut buffer)
            .await
            .map_err(|e| ClientError::Unreachable(format!("reading logs: {e}")))?;
        if n == 0 {
            break;
        }
        out.write_all(&buffer[..n])?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(attempt: i32, worker: Option<&str>, attempts: serde_json::Value) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "job", "namespace": "n"},
            "spec": {"type": "x", "template": {}},
            "status": {"phase": "Running", "attempt": attempt, "worker": worker, "attempts": attempts},
        }))
        .unwrap()
    }

    #[test]
    fn the_current_attempt_by_default_the_one_before_with_previous() {
        let t = task(3, Some("job-3"), serde_json::json!([]));
        assert_eq!(attempt_wanted(&t, None, false).unwrap(), 3);
        assert_eq!(attempt_wanted(&t, None, true).unwrap(), 2);
        assert_eq!(attempt_wanted(&t, Some(1), false).unwrap(), 1);
        assert!(attempt_wanted(&t, Some(4), false).is_err());
        assert!(attempt_wanted(&t, Some(0), false).is_err());
        let first = task(1, Some("job-1"), serde_json::json!([]));
        assert!(attempt_wanted(&first, None, true).is_err(), "no attempt 0");
        let fresh = task(0, None, serde_json::json!([]));
        let e = attempt_wanted(&fresh, None, false).unwrap_err().to_string();
        assert!(e.contains("has not started"), "{e}");
    }

    #[test]
    fn pods_are_looked_up_by_record_then_worker_then_name() {
        let t = task(
            2,
            Some("job-2"),
            serde_json::json!([
                {"attempt": 1, "pod": "job-1-renamed", "scheduledAt": "2025-01-01T00:00:00Z"}
            ]),
        );
        assert_eq!(pod_candidates(&t, 1), vec!["job-1-renamed", "job-1"]);
        assert_eq!(pod_candidates(&t, 2), vec!["job-2"]);
    }
}
