//! `ax-bench fanout`: one AxDag whose task fans out over `items` (`forEach.range`), against the
//! same number of independent AxTasks (the `ax` burst) in the same run: throughput of each, the
//! AxDag's largest JSON while it ran, and the operator's RSS.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde_json::{Value, json};

use crate::bench::{create_namespace, delete_namespace, delete_queue, random_suffix};
use crate::procs::{Memory, PidSource};
use crate::workload::{self, SimWorker};

pub struct FanoutSettings {
    pub items: usize,
    pub parallelism: u32,
    pub worker: SimWorker,
    pub operator: PidSource,
    pub timeout: Duration,
    pub keep: bool,
}

#[derive(Debug, Serialize)]
pub struct FanoutReport {
    pub namespace: String,
    pub queue: String,
    pub items: usize,
    pub parallelism: u32,
    /// The DAG's final phase.
    pub phase: String,
    /// DAG created → DAG seen terminal.
    pub seconds: f64,
    pub items_per_second: f64,
    pub succeeded: u64,
    pub failed: u64,
    /// The largest JSON of the AxDag any watch event carried.
    pub largest_dag_bytes: usize,
    /// The operator's RSS, sampled each second while the DAG ran: the most, and its VmHWM.
    pub operator_rss_max_kib: Option<u64>,
    pub operator_peak_kib: Option<u64>,
}

fn axdag_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ax.dev", "v1alpha1", "AxDag"),
        "axdags",
    )
}

/// The AxDag: one task `map` over `0..items`, `parallelism` at work, in `queue`.
pub fn fanout_dag(
    name: &str,
    items: usize,
    parallelism: u32,
    queue: &str,
    worker: &SimWorker,
) -> Value {
    json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxDag",
        "metadata": {"name": name, "labels": {workload::BENCH_LABEL: workload::BENCH_LABEL_VALUE}},
        "spec": {"tasks": [{
            "name": "map",
            "forEach": {"range": {"count": items}, "parallelism": parallelism},
            "spec": {
                "type": workload::AX_TASK_TYPE,
                "queue": queue,
                "template": worker.pod_template(),
            },
        }]},
    })
}

/// Runs the fan-out in a namespace and AxQueue of its own, which stay until [`clean_up`] (a
/// namespace of 100,000 finished tasks takes minutes to delete: the figures come first).
pub async fn run(client: &Client, s: &FanoutSettings) -> Result<FanoutReport> {
    let suffix = random_suffix();
    let namespace = format!("ax-bench-fanout-{suffix}");
    let queue = format!("ax-bench-{suffix}");
    create_namespace(client, &namespace).await?;
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &workload::axqueue_resource());
    let object: DynamicObject = serde_json::from_value(workload::axqueue(&queue, 100_000))?;
    queues
        .create(&PostParams::default(), &object)
        .await
        .context("create the AxQueue")?;
    let result = measure(client, s, &namespace, &queue).await;
    if result.is_err() && !s.keep {
        clean_up(client, &namespace, &queue).await;
    }
    result
}

pub async fn clean_up(client: &Client, namespace: &str, queue: &str) {
    delete_namespace(client, namespace).await;
    delete_queue(client, queue).await;
}

async fn measure(
    client: &Client,
    s: &FanoutSettings,
    namespace: &str,
    queue: &str,
) -> Result<FanoutReport> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &axdag_resource());
    let name = "fanout";
    let mut events = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .boxed();
    let dag: DynamicObject =
        serde_json::from_value(fanout_dag(name, s.items, s.parallelism, queue, &s.worker))?;
    let started = Instant::now();
    api.create(&PostParams::default(), &dag)
        .await
        .context("create the AxDag")?;
    let mut largest = 0;
    let mut rss_max: Option<u64> = None;
    let mut peak: Option<u64> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = tokio::time::sleep(s.timeout);
    tokio::pin!(deadline);
    let last = loop {
        tokio::select! {
            _ = &mut deadline => bail!("the fan-out did not finish within {:?}", s.timeout),
            _ = tick.tick() => {
                if let Some(memory) = s.operator.resolve().and_then(Memory::of) {
                    rss_max = Some(rss_max.unwrap_or(0).max(memory.rss_kib));
                    peak = Some(memory.peak_kib);
                }
            }
            event = events.next() => {
                let Some(event) = event else { bail!("the AxDag watch ended") };
                if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = event {
                    largest = largest.max(serde_json::to_vec(&d)?.len());
                    let phase = d.data["status"]["phase"].as_str().unwrap_or_default();
                    if matches!(phase, "Succeeded" | "Failed" | "Canceled") {
                        break d;
                    }
                }
            }
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let items = &last.data["status"]["nodes"]["map"]["items"];
    let count = |field: &str| items[field].as_u64().unwrap_or(0);
    Ok(FanoutReport {
        namespace: namespace.to_owned(),
        queue: queue.to_owned(),
        items: s.items,
        parallelism: s.parallelism,
        phase: last.data["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        seconds,
        items_per_second: s.items as f64 / seconds,
        succeeded: count("succeeded"),
        failed: count("failed"),
        largest_dag_bytes: largest,
        operator_rss_max_kib: rss_max,
        operator_peak_kib: peak,
    })
}

pub fn render(r: &FanoutReport, tasks_per_second: Option<f64>) -> String {
    let mut out = format!(
        "fan-out: one AxDag, forEach range {} (parallelism {}): {} in {:.1} s = {:.1} items/s \
         ({} succeeded, {} failed)\n",
        r.items, r.parallelism, r.phase, r.seconds, r.items_per_second, r.succeeded, r.failed
    );
    out.push_str(&format!(
        "  largest AxDag: {:.1} KB (target <= 256 KB)\n",
        r.largest_dag_bytes as f64 / 1024.0
    ));
    if let Some(rss) = r.operator_rss_max_kib {
        out.push_str(&format!(
            "  operator RSS: at most {:.0} MB sampled, VmHWM {:.0} MB (target <= 256 MB)\n",
            rss as f64 / 1024.0,
            r.operator_peak_kib.unwrap_or(0) as f64 / 1024.0
        ));
    }
    if let Some(tasks) = tasks_per_second {
        out.push_str(&format!(
            "  independent AxTasks: {tasks:.1} units/s; fan-out / tasks = {:.2} (target >= 0.8)\n",
            r.items_per_second / tasks
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dag_fans_out_over_a_range_in_the_benchs_queue() {
        let worker = SimWorker {
            start_ms: 50,
            work_ms: 100,
        };
        let dag = fanout_dag("f", 1000, 50, "q", &worker);
        let task = &dag["spec"]["tasks"][0];
        assert_eq!(
            task["forEach"],
            json!({"range": {"count": 1000}, "parallelism": 50})
        );
        assert_eq!(task["spec"]["queue"], "q");
        assert_eq!(task["spec"]["template"], worker.pod_template());
    }
}
