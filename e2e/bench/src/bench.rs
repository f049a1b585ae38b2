//! One kind's run: a namespace of its own (for `worker-pods`, a sample worker pod from the
//! operator), the cluster let settle, watches on pods (and on the kind's objects), a scrape of the
//! API server's request counters and the components' CPU, the units created (a burst, or at a
//! steady rate), every unit waited for, a second scrape, the namespace deleted and waited for.
//! Times are the client's: `Instant`s taken in this process.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::apimetrics::{self, WriteKey, Writes};
use crate::procs::{CpuSnapshot, HostCpu, HostCpuShare, Watched, cpu_seconds};
use crate::report::{CpuRow, KindReport, Percentiles, WriteRow};
use crate::workload::{self, Kind, SampleTask, SimWorker, WorkerPodTemplate};

/// How the units are created.
#[derive(Clone, Copy, Debug)]
pub enum Plan {
    /// `units` at once, `parallel` create calls in flight.
    Burst { units: usize, parallel: usize },
    /// `per_second` creates a second for `seconds`, each sent at its time whatever the others do.
    Rate { per_second: f64, seconds: f64 },
}

impl Plan {
    pub fn units(&self) -> usize {
        match *self {
            Plan::Burst { units, .. } => units,
            Plan::Rate {
                per_second,
                seconds,
            } => (per_second * seconds).round() as usize,
        }
    }
}

/// When the cluster counts as quiet enough to start measuring.
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    /// Always wait this long first (the previous kind's last writes, the namespace's own setup).
    pub min: Duration,
    /// Then until the API server uses at most this many cores over a second…
    pub idle_cores: f64,
    /// …or this long has passed (measured anyway, with the rate printed).
    pub max: Duration,
}

pub struct Settings {
    pub worker: SimWorker,
    pub settle: Settle,
    /// How long, after the last create, units may take to finish before they count as lost.
    pub finish_timeout: Duration,
    /// Kept after the last unit finished before the second scrape, so the writes that follow a
    /// unit's end (the last status, Events) are counted.
    pub tail: Duration,
    /// Concurrency of the AxQueue of the `ax` kind (and of `worker-pods`, for its sample): high
    /// enough that the queue is never the limit.
    pub ax_concurrency: u32,
    /// Keys the `ax-keys` units are spread over.
    pub keys: usize,
    pub watched: Vec<Watched>,
    /// Leave the namespace (and queue) in place afterwards.
    pub keep: bool,
}

/// What the watches and the creators saw of one unit.
#[derive(Default)]
struct UnitState {
    /// Just before its create request was sent.
    created_at: Option<Instant>,
    create_error: Option<String>,
    /// The first pod event for it on the pod watch.
    pod_seen_at: Option<Instant>,
    pods: BTreeSet<String>,
    /// When its own object (Pod, Job, AxTask) was first seen finished, and whether it succeeded.
    finished: Option<(Instant, bool)>,
}

#[derive(Default)]
struct Shared {
    units: Mutex<HashMap<String, UnitState>>,
    changed: Notify,
}

impl Shared {
    fn with<R>(&self, name: &str, f: impl FnOnce(&mut UnitState) -> R) -> R {
        let mut units = self.units.lock().expect("unit state lock");
        f(units.entry(name.to_owned()).or_default())
    }
}

pub fn random_suffix() -> String {
    format!("{:04x}", rand::random::<u16>())
}

/// Runs `kind` under `plan` in a fresh namespace and measures it. The namespace (and the AxQueue)
/// are deleted afterwards even when the run fails, and waited for, so the next kind starts quiet.
pub async fn run_kind(
    client: &Client,
    kind: Kind,
    plan: Plan,
    settings: &Settings,
) -> Result<KindReport> {
    let suffix = random_suffix();
    let namespace = format!("ax-bench-{}-{suffix}", kind.as_str());
    let queue = format!("ax-bench-{suffix}");
    let result = measure(client, kind, plan, settings, &namespace, &queue).await;
    if !settings.keep {
        delete_namespace(client, &namespace).await;
        if kind.needs_queue() {
            delete_queue(client, &queue).await;
        }
    }
    result
}

async fn measure(
    client: &Client,
    kind: Kind,
    plan: Plan,
    settings: &Settings,
    namespace: &str,
    queue: &str,
) -> Result<KindReport> {
    create_namespace(client, namespace).await?;
    if kind.needs_queue() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &workload::axqueue_resource());
        api.create(
            &PostParams::default(),
            &serde_json::from_value(match kind {
                Kind::AxKeys => workload::axqueue_keyed(queue, settings.ax_concurrency),
                _ => workload::axqueue(queue, settings.ax_concurrency),
            })?,
        )
        .await
        .with_context(|| format!("creating AxQueue {queue} (are the CRDs installed?)"))?;
    }
    // Before the settle: the sample's writes are over, and its pod gone, when the measure starts.
    let worker_pod = match kind {
        Kind::WorkerPods => {
            Some(worker_pod_template(client, namespace, queue, &settings.worker).await?)
        }
        _ => None,
    };
    let idle = settle(&settings.settle, &settings.watched).await;

    let shared = Arc::new(Shared::default());
    let mut watches = vec![
        watch(
            client,
            namespace,
            &workload::pod_resource(),
            kind,
            true,
            &shared,
        )
        .await?,
    ];
    if !kind.is_bare_pod() {
        watches.push(watch(client, namespace, &kind.resource(), kind, false, &shared).await?);
    }

    let writes_before = scrape_writes(client).await?;
    let cpu_before = CpuSnapshot::take(&settings.watched);
    let host_before = HostCpu::take();
    let started = Instant::now();
    let units = plan.units();
    eprintln!("  {}: creating {units} units in {namespace}", kind.as_str());
    create_all(
        client,
        kind,
        plan,
        settings,
        namespace,
        queue,
        worker_pod.as_ref(),
        &shared,
        started,
    )
    .await;
    let created_by = Instant::now();

    let deadline = created_by + settings.finish_timeout;
    let mut last_report = Instant::now();
    loop {
        let (waiting, finished) = {
            let units = shared.units.lock().expect("unit state lock");
            let live = units
                .values()
                .filter(|u| u.created_at.is_some() && u.create_error.is_none());
            let waiting = live.clone().filter(|u| u.finished.is_none()).count();
            (waiting, live.count() - waiting)
        };
        if waiting == 0 || Instant::now() >= deadline {
            break;
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            eprintln!("  {}: {finished} finished, {waiting} to go", kind.as_str());
            last_report = Instant::now();
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), shared.changed.notified()).await;
    }
    tokio::time::sleep(settings.tail).await;
    let writes_after = scrape_writes(client).await?;
    let cpu_after = CpuSnapshot::take(&settings.watched);
    let host_after = HostCpu::take();
    let window = started.elapsed();
    for w in watches {
        w.abort();
    }

    let units_state = std::mem::take(&mut *shared.units.lock().expect("unit state lock"));
    Ok(assemble(
        kind,
        namespace,
        units,
        units_state,
        started,
        apimetrics::delta(&writes_before, &writes_after),
        cpu_after.since(&cpu_before),
        host_after
            .zip(host_before)
            .and_then(|(after, before)| after.since(&before)),
        idle,
        window,
    ))
}

#[allow(clippy::too_many_arguments)]
async fn create_all(
    client: &Client,
    kind: Kind,
    plan: Plan,
    settings: &Settings,
    namespace: &str,
    queue: &str,
    worker_pod: Option<&WorkerPodTemplate>,
    shared: &Arc<Shared>,
    started: Instant,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &kind.resource());
    let worker = settings.worker;
    let create = |i: usize| {
        let api = api.clone();
        let shared = shared.clone();
        let name = format!("u-{i:05}");
        // Built here, not in the future, which must own what it uses (a rate spawns it).
        let mut object = match worker_pod {
            Some(template) => template.pod(&name, namespace, &workload::random_uid()),
            None => kind
                .object(&name, &worker, queue)
                .expect("every kind but worker-pods builds its objects from the worker"),
        };
        if kind == Kind::AxKeys {
            workload::set_key(&mut object, i, settings.keys);
        }
        async move {
            let object: DynamicObject = serde_json::from_value(object)
                .expect("a benchmark object is a valid DynamicObject");
            shared.with(&name, |u| u.created_at = Some(Instant::now()));
            if let Err(e) = api.create(&PostParams::default(), &object).await {
                shared.with(&name, |u| u.create_error = Some(e.to_string()));
            }
        }
    };
    match plan {
        Plan::Burst { units, parallel } => {
            stream::iter(0..units)
                .map(create)
                .buffer_unordered(parallel.max(1))
                .collect::<Vec<()>>()
                .await;
        }
        Plan::Rate { per_second, .. } => {
            let every = Duration::from_secs_f64(1.0 / per_second);
            let calls: Vec<JoinHandle<()>> = (0..plan.units())
                .map(|i| {
                    let at = started + every.mul_f64(i as f64);
                    let call = create(i);
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at.into()).await;
                        call.await
                    })
                })
                .collect();
            for call in calls {
                let _ = call.await;
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    kind: Kind,
    namespace: &str,
    units: usize,
    state: HashMap<String, UnitState>,
    started: Instant,
    writes: std::collections::BTreeMap<WriteKey, u64>,
    cpu: Vec<(&'static str, Option<f64>)>,
    host: Option<HostCpuShare>,
    idle: Option<f64>,
    window: Duration,
) -> KindReport {
    let live: Vec<&UnitState> = state
        .values()
        .filter(|u| u.created_at.is_some() && u.create_error.is_none())
        .collect();
    let created = live.len();
    let errors: Vec<&String> = state
        .values()
        .filter_map(|u| u.create_error.as_ref())
        .collect();
    let finished: Vec<(Instant, bool)> = live.iter().filter_map(|u| u.finished).collect();
    let succeeded = finished.iter().filter(|f| f.1).count();
    let last_finish = finished.iter().map(|f| f.0).max();
    let busy = last_finish.map_or(0.0, |t| t.duration_since(started).as_secs_f64());
    let ms = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1000.0;
    let pod_seen = live
        .iter()
        .filter_map(|u| Some(ms(u.created_at?, u.pod_seen_at?)))
        .collect();
    let finished_after = live
        .iter()
        .filter_map(|u| Some(ms(u.created_at?, u.finished?.0)))
        .collect();
    let per_unit = |count: u64| {
        if created == 0 {
            0.0
        } else {
            count as f64 / created as f64
        }
    };
    let row = |key: &WriteKey, count: u64| WriteRow {
        resource: key.display_resource(),
        verb: key.verb.clone(),
        code: key.code.clone(),
        count,
        per_unit: per_unit(count),
    };
    let (background, per_unit_writes): (Vec<_>, Vec<_>) =
        writes.iter().partition(|(key, _)| key.is_background());
    let sum = |pick: &dyn Fn(&WriteKey) -> bool| {
        per_unit(
            per_unit_writes
                .iter()
                .filter(|(k, _)| pick(k))
                .map(|(_, n)| **n)
                .sum(),
        )
    };
    KindReport {
        kind: kind.as_str().to_owned(),
        namespace: namespace.to_owned(),
        units,
        created,
        create_errors: errors.len(),
        first_create_error: errors.first().map(|e| (*e).clone()),
        finished: finished.len(),
        succeeded,
        failed: finished.len() - succeeded,
        lost: created - finished.len(),
        units_with_several_pods: live.iter().filter(|u| u.pods.len() > 1).count(),
        busy_seconds: busy,
        throughput_per_second: if busy > 0.0 {
            finished.len() as f64 / busy
        } else {
            0.0
        },
        pod_seen_ms: Percentiles::of(pod_seen),
        finished_ms: Percentiles::of(finished_after),
        writes: per_unit_writes.iter().map(|(k, n)| row(k, **n)).collect(),
        background_writes: background.iter().map(|(k, n)| row(k, **n)).collect(),
        writes_per_unit: sum(&WriteKey::is_success),
        conflicts_per_unit: sum(&WriteKey::is_conflict),
        other_errors_per_unit: sum(&|k| !k.is_success() && !k.is_conflict()),
        cpu: cpu
            .into_iter()
            .map(|(process, seconds)| CpuRow {
                process: process.to_owned(),
                seconds,
                ms_per_unit: seconds
                    .filter(|_| created > 0)
                    .map(|s| s * 1000.0 / created as f64),
            })
            .collect(),
        apiserver_idle_cores: idle,
        host_busy_percent: host.map(|h| h.busy_percent),
        host_steal_percent: host.map(|h| h.steal_percent),
        window_seconds: window.as_secs_f64(),
    }
}

/// Starts a watch on `resource` in `namespace` that records, per unit, pods seen (when
/// `pods` is true) and finished objects of `kind`; returns once the watch has listed what exists.
async fn watch(
    client: &Client,
    namespace: &str,
    resource: &ApiResource,
    kind: Kind,
    pods: bool,
    shared: &Arc<Shared>,
) -> Result<JoinHandle<()>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let shared = shared.clone();
    let plural = resource.plural.clone();
    let handle = tokio::spawn(async move {
        let mut listed = Some(listed_tx);
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        loop {
            let event = match events.try_next().await {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(e) => {
                    eprintln!("  watch on {plural}: {e} (retrying)");
                    continue;
                }
            };
            let object = match event {
                Event::Apply(o) | Event::InitApply(o) => o,
                Event::InitDone => {
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Event::Init | Event::Delete(_) => continue,
            };
            let seen = Instant::now();
            let Ok(value) = serde_json::to_value(&object) else {
                continue;
            };
            let unit = if pods {
                kind.unit_of_pod(&value)
            } else {
                value["metadata"]["name"].as_str().map(str::to_owned)
            };
            let Some(unit) = unit else { continue };
            // The pod is the unit's own object only for bare pods.
            let own_object = !pods || kind.is_bare_pod();
            let outcome = own_object.then(|| kind.finished(&value)).flatten();
            let pod_name = pods.then(|| object.metadata.name.clone()).flatten();
            let newly_finished = shared.with(&unit, |u| {
                if let Some(pod) = pod_name {
                    u.pod_seen_at.get_or_insert(seen);
                    u.pods.insert(pod);
                }
                match (outcome, u.finished) {
                    (Some(ok), None) => {
                        u.finished = Some((seen, ok));
                        true
                    }
                    _ => false,
                }
            });
            if newly_finished {
                shared.changed.notify_one();
            }
        }
    });
    match tokio::time::timeout(Duration::from_secs(60), listed_rx).await {
        Ok(Ok(())) => Ok(handle),
        _ => {
            handle.abort();
            bail!(
                "the watch on {} in {namespace} did not list within 60 s",
                resource.plural
            )
        }
    }
}

/// The AxTask whose worker pod `worker-pods` copies, and the ConfigMap that owns the copies.
const SAMPLE_TASK: &str = "ax-bench-sample";
const WORKER_PODS_OWNER: &str = "worker-pods-owner";
/// How long the operator may take to build the sample's pod, and the cluster to delete it.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The template of `worker-pods` in `namespace`: the worker pod the running operator builds for an
/// AxTask of `worker` in `queue`, its copies owned by a ConfigMap made for the run. The sample
/// task is deleted, and its pod waited for until gone, so neither is in the measure.
async fn worker_pod_template(
    client: &Client,
    namespace: &str,
    queue: &str,
    worker: &SimWorker,
) -> Result<WorkerPodTemplate> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let owner = config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {
                    "name": WORKER_PODS_OWNER,
                    "labels": {workload::BENCH_LABEL: workload::BENCH_LABEL_VALUE},
                },
            }))?,
        )
        .await
        .with_context(|| format!("creating ConfigMap {WORKER_PODS_OWNER} in {namespace}"))?;
    let owner_uid = owner
        .metadata
        .uid
        .context("the created ConfigMap has no uid")?;

    let tasks: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &workload::axtask_resource());
    let task = workload::axtask(
        SAMPLE_TASK,
        workload::AX_TASK_TYPE,
        workload::AX_PRIORITY,
        queue,
        worker,
    );
    let task = tasks
        .create(&PostParams::default(), &serde_json::from_value(task)?)
        .await
        .with_context(|| format!("creating the sample AxTask {SAMPLE_TASK} in {namespace}"))?;
    let task_uid = task.metadata.uid.context("the created AxTask has no uid")?;

    // The operator names a task's first pod `<task>-1`.
    let pod_name = format!("{SAMPLE_TASK}-1");
    let pods: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &workload::pod_resource());
    let pod = poll_until(
        SAMPLE_TIMEOUT,
        Duration::from_millis(100),
        || async { Ok(pods.get_opt(&pod_name).await?) },
        || {
            format!(
                "no worker pod {pod_name} for the sample AxTask {SAMPLE_TASK} in {namespace} \
                 after {} s: worker-pods copies the pod the operator builds, so the operator must \
                 be running (`make run`)",
                SAMPLE_TIMEOUT.as_secs()
            )
        },
    )
    .await?;

    tasks
        .delete(SAMPLE_TASK, &DeleteParams::background())
        .await
        .with_context(|| format!("deleting the sample AxTask {SAMPLE_TASK} in {namespace}"))?;
    // Its pod goes with it (garbage collector, then the simulated node).
    poll_until(
        SAMPLE_TIMEOUT,
        Duration::from_millis(200),
        || async {
            let gone = tasks.get_opt(SAMPLE_TASK).await?.is_none()
                && pods.get_opt(&pod_name).await?.is_none();
            Ok(gone.then_some(()))
        },
        || {
            format!(
                "the sample AxTask {SAMPLE_TASK} or its pod {pod_name} in {namespace} still there \
                 {} s after deleting the task",
                SAMPLE_TIMEOUT.as_secs()
            )
        },
    )
    .await?;

    Ok(WorkerPodTemplate::from_sample(
        &serde_json::to_value(&pod)?,
        SampleTask {
            name: SAMPLE_TASK.to_owned(),
            namespace: namespace.to_owned(),
            uid: task_uid,
        },
        workload::config_map_owner(WORKER_PODS_OWNER, &owner_uid),
    ))
}

/// The API server's mutating request counters.
pub async fn scrape_writes(client: &Client) -> Result<Writes> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading the API server's /metrics (needs get on nonResourceURLs /metrics)")?;
    Ok(apimetrics::writes(&text))
}

/// Waits `settle.min`, then until the API server's CPU rate is at most `settle.idle_cores` (or
/// `settle.max` has passed). Returns the last rate measured.
pub async fn settle(settle: &Settle, watched: &[Watched]) -> Option<f64> {
    tokio::time::sleep(settle.min).await;
    let apiserver = watched.iter().find(|w| w.label == "kube-apiserver")?;
    let deadline = Instant::now() + settle.max;
    loop {
        let pid = apiserver.source.resolve()?;
        let before = cpu_seconds(pid)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rate = cpu_seconds(pid)? - before;
        if rate <= settle.idle_cores || Instant::now() >= deadline {
            if rate > settle.idle_cores {
                eprintln!("  the API server still uses {rate:.2} cores; measuring anyway");
            }
            return Some(rate);
        }
    }
}

pub async fn create_namespace(client: &Client, namespace: &str) -> Result<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &namespace_resource());
    let object = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {workload::BENCH_LABEL: workload::BENCH_LABEL_VALUE}},
    });
    api.create(&PostParams::default(), &serde_json::from_value(object)?)
        .await
        .with_context(|| format!("creating namespace {namespace}"))?;
    // Pods are refused until the namespace's default ServiceAccount exists.
    let accounts: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "ServiceAccount"),
            "serviceaccounts",
        ),
    );
    poll_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
        || format!("namespace {namespace} has no default ServiceAccount after 60 s"),
    )
    .await
}

/// Asks `look` every `every` until it finds something, and returns that; fails with `failure`
/// when it has found nothing for `timeout`, or at once when `look` fails.
async fn poll_until<T, Look, Looking>(
    timeout: Duration,
    every: Duration,
    mut look: Look,
    failure: impl FnOnce() -> String,
) -> Result<T>
where
    Look: FnMut() -> Looking,
    Looking: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = look().await? {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            bail!(failure());
        }
        tokio::time::sleep(every).await;
    }
}

/// Deletes the namespace and waits until it is gone (up to 10 minutes; a warning, not an error,
/// if it takes longer).
pub async fn delete_namespace(client: &Client, namespace: &str) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &namespace_resource());
    if let Err(e) = api.delete(namespace, &DeleteParams::background()).await {
        eprintln!("  deleting namespace {namespace}: {e}");
        return;
    }
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        match api.get_opt(namespace).await {
            Ok(None) => return,
            Ok(Some(_)) | Err(_) if started.elapsed() < Duration::from_secs(600) => {}
            _ => {
                eprintln!("  namespace {namespace} still there after 10 min; going on");
                return;
            }
        }
        if said.elapsed() >= Duration::from_secs(30) {
            eprintln!(
                "  waiting for namespace {namespace} to go ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn delete_queue(client: &Client, queue: &str) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &workload::axqueue_resource());
    if let Err(e) = api.delete(queue, &DeleteParams::default()).await {
        eprintln!("  deleting AxQueue {queue}: {e}");
    }
}

fn namespace_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Namespace"), "namespaces")
}
