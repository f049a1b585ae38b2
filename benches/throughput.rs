//! Task throughput and dispatch latency on the local cluster's simulated nodes.
//!
//! Needs a cluster with sim nodes and a running operator (`make run`), then:
//!   eval "$(e2e/cluster.sh env)"; cargo bench --bench throughput
//! Settings (env): AX_BENCH_TASKS (default 500), AX_BENCH_RATE tasks/s to submit at (default 0 =
//! as fast as possible), AX_BENCH_WORK_MS simulated work per task (default 100).
//! Prints figures; never fails on timing. Latency here is queuedAt → the Scheduled transition
//! (the status write just before the pod is created), read from each task's history.

use std::time::{Duration, Instant};

use ax::api::{AxTask, TaskPhase};
use ax_sim::worker::SimWorker;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn task(name: &str, work_ms: u64) -> AxTask {
    let worker = SimWorker::running_for(work_ms).start_ms(20);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name},
        "spec": {"type": "bench", "template": {"spec": worker.pod_spec()}},
    }))
    .expect("a valid task")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!(
            "KUBECONFIG not set: start the cluster and operator with `make run`, then eval \"$(e2e/cluster.sh env)\""
        );
        return Ok(());
    }
    let count = env_number("AX_BENCH_TASKS", 500) as usize;
    let rate = env_number("AX_BENCH_RATE", 0);
    let work_ms = env_number("AX_BENCH_WORK_MS", 100);
    let client = Client::try_default().await?;
    let ns = format!("bench-{:04x}", rand::random::<u16>());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    // A new namespace gets its default ServiceAccount a moment later; pods wait for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);

    println!("submitting {count} tasks ({work_ms} ms of simulated work each) into namespace {ns}");
    let started = Instant::now();
    let interval = (rate > 0).then(|| Duration::from_secs_f64(1.0 / rate as f64));
    let submit = stream::iter(0..count).map(|i| {
        let api = api.clone();
        async move {
            if let Some(every) = interval {
                tokio::time::sleep_until((started + every * i as u32).into()).await;
            }
            api.create(&PostParams::default(), &task(&format!("t-{i:05}"), work_ms))
                .await
                .map(|_| ())
        }
    });
    let results: Vec<_> = submit.buffer_unordered(32).collect().await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    let submitted_in = started.elapsed();
    println!(
        "submitted in {:.1}s ({failed} create errors)",
        submitted_in.as_secs_f64()
    );

    let deadline = started + Duration::from_secs(600);
    let tasks = loop {
        let tasks = api.list(&ListParams::default()).await?.items;
        let done = tasks
            .iter()
            .filter(|t| {
                t.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(TaskPhase::is_terminal)
            })
            .count();
        if done >= count - failed || Instant::now() > deadline {
            break tasks;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let wall = started.elapsed();

    let mut latencies_ms = Vec::new();
    let (mut first_queued, mut last_finished) = (None, None);
    let mut succeeded = 0;
    for t in &tasks {
        let Some(s) = &t.status else { continue };
        if s.phase == Some(TaskPhase::Succeeded) {
            succeeded += 1;
        }
        for pair in s.history.windows(2) {
            if pair[1].to == TaskPhase::Scheduled
                && let Some(queued) = s.queued_at.filter(|_| pair[1].attempt == 1)
            {
                latencies_ms.push(pair[1].time.duration_since(queued).as_secs_f64() * 1000.0);
            }
        }
        first_queued = first_queued
            .min(s.queued_at)
            .or(first_queued)
            .or(s.queued_at);
        last_finished = last_finished.max(s.finished_at);
    }
    latencies_ms.sort_by(f64::total_cmp);
    let busy = match (first_queued, last_finished) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => f64::NAN,
    };
    println!(
        "succeeded {succeeded}/{count}; wall {:.1}s",
        wall.as_secs_f64()
    );
    println!(
        "throughput: {:.1} tasks/s (first queuedAt to last finishedAt: {busy:.1}s)",
        succeeded as f64 / busy
    );
    println!(
        "dispatch latency (queuedAt -> Scheduled, first attempts, n={}): p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies_ms.len(),
        percentile(&latencies_ms, 50.0),
        percentile(&latencies_ms, 90.0),
        percentile(&latencies_ms, 99.0),
        latencies_ms.last().copied().unwrap_or(f64::NAN)
    );
    namespaces.delete(&ns, &DeleteParams::background()).await?;
    Ok(())
}
