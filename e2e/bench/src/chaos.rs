//! Chaos mode: an HA pair of operators of its own, a mix of work (tasks, DAGs, an every-minute
//! AxCron) created over the first part of the run while a seeded schedule of faults plays, then a
//! drain until every task is terminal, and the audit (`audit.rs`) of what the watches and the API
//! server's audit log saw. Exits non-zero on any violation.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::Mutex;

use crate::audit::{self, CronExpectation, Disruption};
use crate::bench::{self, random_suffix};
use crate::chaos_plan::{self, Behavior, FaultKind, PlannedTask, ScheduledFault};
use crate::chaos_record::{self, LivePod, Recorder};
use crate::workload;

pub struct ChaosSettings {
    pub tasks: usize,
    pub seed: u64,
    pub faults: Vec<FaultKind>,
    pub minutes: f64,
    pub dags: usize,
    pub real_kubelet_max: usize,
    pub concurrency: u32,
    pub operator_bin: PathBuf,
    pub operator_kubeconfig: PathBuf,
    pub operator_metrics_port: u16,
    pub log_dir: PathBuf,
    pub cluster_dir: PathBuf,
    pub cluster_script: PathBuf,
    pub sim_prefix: String,
    pub drain_seconds: f64,
    pub keep: bool,
}

/// The sim node annotation that stops its heartbeats (e2e/sim/src/nodes.rs).
const SIM_HEARTBEAT_ANNOTATION: &str = "ax.dev/sim-heartbeat";

pub async fn run(client: &Client, s: &ChaosSettings) -> Result<bool> {
    let suffix = random_suffix();
    let namespace = format!("ax-chaos-{suffix}");
    let queue = format!("ax-chaos-{suffix}");
    let plan = chaos_plan::tasks(s.seed, s.tasks, s.real_kubelet_max);
    let length = Duration::from_secs_f64(s.minutes * 60.0);
    let faults = chaos_plan::schedule(s.seed, &s.faults, length);
    eprintln!(
        "chaos: seed {}, {} tasks ({} on the real kubelet), {} DAGs of {}, one AxCron, {} faults \
         over {:.1} min, namespace {namespace}",
        s.seed,
        plan.len(),
        plan.iter().filter(|t| t.behavior.on_real_kubelet()).count(),
        s.dags,
        chaos_plan::DAG_CHILDREN,
        faults.len(),
        s.minutes
    );
    for f in &faults {
        if f.kind != FaultKind::OperatorKill {
            eprintln!("  at {:>4} s: {}", f.at.as_secs(), f.kind.as_str());
        }
    }
    let since = jiff::Timestamp::now().to_string();
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &workload::axqueue_resource());
    let mut axqueue = workload::axqueue(&queue, s.concurrency);
    // No circuit breakers: whole types of the mix fail by design, and an open breaker would hold
    // them (one probe every 30 s) until the drain runs out, testing the breaker, not the fencing.
    axqueue["spec"]["circuitBreaker"] = json!({"windowSize": 0});
    queues
        .create(&PostParams::default(), &serde_json::from_value(axqueue)?)
        .await
        .context("creating the AxQueue (are the CRDs installed?)")?;
    bench::create_namespace(client, &namespace).await?;

    let recorder = Recorder::default();
    for resource in [
        chaos_record::pod_resource(),
        chaos_record::ax_resource("AxTask", "axtasks"),
        chaos_record::ax_resource("AxDag", "axdags"),
    ] {
        let (ready, listed) = tokio::sync::oneshot::channel();
        tokio::spawn(
            recorder
                .clone()
                .follow(client.clone(), namespace.clone(), resource, ready),
        );
        listed
            .await
            .context("a watch ended before its first list")?;
    }

    let operators = Arc::new(Mutex::new(Operators::start(s)?));
    // Interrupted, it still continues what it stopped and stops its operators.
    let result = tokio::select! {
        result = soak(
            client, s, &namespace, &queue, &plan, &faults, length, &recorder, &operators,
        ) => result,
        signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    restore_components(s);
    // The operators stay up through the clean-up: every worker pod carries the outcome finalizer,
    // which only an operator takes off once the pod's task is gone.
    let (disruptions, cron_window) = match result {
        Ok(soaked) => soaked,
        Err(e) => {
            operators.lock().await.stop_all();
            return Err(e);
        }
    };

    let mut input = recorder.audit_input();
    input.disruptions = disruptions;
    input.creates = chaos_record::audit_log_creates(&s.cluster_dir, &namespace, &since);
    if input.creates.counts.is_empty() {
        eprintln!(
            "  warning: no operator creates in the audit log under {} (is the operator running \
             as the ax-operator ServiceAccount?)",
            s.cluster_dir.display()
        );
    }
    if let Some((cron, from, until)) = cron_window {
        input.cron_expected.push(CronExpectation {
            cron: format!("{namespace}/{cron}"),
            scheduled: (from..=until).step_by(60).collect(),
        });
    }
    let report = audit::audit(&input);
    println!(
        "chaos: seed {}, {} tasks + {} DAGs of {}, faults {}, {} relists of the pod watch",
        s.seed,
        s.tasks,
        s.dags,
        chaos_plan::DAG_CHILDREN,
        s.faults
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(","),
        recorder.relists()
    );
    print!("{}", audit::render(&report));
    // Kept for reading a violation afterwards; the report above stands without them.
    let files = [
        ("audit-input.json", serde_json::to_vec(&input)),
        ("audit-report.json", serde_json::to_vec(&report)),
        ("pods.json", serde_json::to_vec(&recorder.pod_histories())),
    ];
    for (file, json) in files {
        let path = s.log_dir.join(file);
        let written = json
            .map_err(anyhow::Error::from)
            .and_then(|json| std::fs::write(&path, json).map_err(Into::into));
        if let Err(e) = written {
            eprintln!("  writing {}: {e:#}", path.display());
        }
    }
    println!(
        "operator logs: {}; every pod's history: {}",
        s.log_dir.join("chaos-{a,b}.log").display(),
        s.log_dir.join("pods.json").display()
    );
    if !s.keep && report.violations() == 0 {
        eprintln!("deleting namespace {namespace} and AxQueue {queue}");
        bench::delete_namespace(client, &namespace).await;
        bench::delete_queue(client, &queue).await;
    } else if report.violations() > 0 {
        eprintln!("namespace {namespace} kept for inspection");
    }
    operators.lock().await.stop_all();
    Ok(report.violations() == 0)
}

/// The first SIGINT or SIGTERM.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

type CronWindow = Option<(String, i64, i64)>;

#[allow(clippy::too_many_arguments)]
async fn soak(
    client: &Client,
    s: &ChaosSettings,
    namespace: &str,
    queue: &str,
    plan: &[PlannedTask],
    faults: &[ScheduledFault],
    length: Duration,
    recorder: &Recorder,
    operators: &Arc<Mutex<Operators>>,
) -> Result<(Vec<Disruption>, CronWindow)> {
    let started = Instant::now();
    let api = |resource: kube::core::ApiResource| {
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
    };
    let crons = api(chaos_record::ax_resource("AxCron", "axcrons"));
    let cron_name = "chaos-cron";
    let cron = crons
        .create(
            &PostParams::default(),
            &serde_json::from_value(chaos_plan::axcron(cron_name, queue))?,
        )
        .await
        .context("creating the AxCron")?;
    let cron_created = cron
        .metadata
        .creation_timestamp
        .map_or_else(|| jiff::Timestamp::now().as_second(), |t| t.0.as_second());

    let disruptions = Arc::new(std::sync::Mutex::new(Vec::new()));
    let behaviors: Arc<std::collections::HashMap<String, Behavior>> = Arc::new(
        plan.iter()
            .map(|t| (format!("{namespace}/{}", t.name), t.behavior))
            .collect(),
    );
    let injector = Injector {
        client: client.clone(),
        settings: Arc::new(InjectorSettings {
            cluster_dir: s.cluster_dir.clone(),
            cluster_script: s.cluster_script.clone(),
            sim_prefix: s.sim_prefix.clone(),
        }),
        recorder: recorder.clone(),
        operators: operators.clone(),
        disruptions: disruptions.clone(),
        behaviors,
    };
    let mut fault_tasks = AbortOnDrop(Vec::new());
    for (i, fault) in faults.iter().cloned().enumerate() {
        let injector = injector.clone();
        let seed = s.seed.wrapping_add(i as u64);
        fault_tasks.0.push(tokio::spawn(async move {
            tokio::time::sleep_until((started + fault.at).into()).await;
            if let Err(e) = injector.inject(fault.kind, seed).await {
                eprintln!("  fault {} failed: {e:#}", fault.kind.as_str());
            }
        }));
    }

    // Work is created over the first 60 % of the run, so the faults meet it running.
    let tasks = api(chaos_record::ax_resource("AxTask", "axtasks"));
    let dags = api(chaos_record::ax_resource("AxDag", "axdags"));
    let spread = length.mul_f64(0.6);
    let units = plan.len() + s.dags;
    let dag_every = plan.len().checked_div(s.dags).unwrap_or(usize::MAX).max(1);
    let mut dags_made = 0;
    let mut create_errors = 0usize;
    let mut i = 0;
    for (n, task) in plan.iter().enumerate() {
        let due = started + spread.mul_f64(i as f64 / units.max(1) as f64);
        tokio::time::sleep_until(due.into()).await;
        i += 1;
        if let Err(e) = create(&tasks, chaos_plan::axtask(&task.name, task.behavior, queue)).await {
            create_errors += 1;
            eprintln!("  creating {}: {e:#}", task.name);
        }
        if n % dag_every == dag_every - 1 && dags_made < s.dags {
            create_errors += create_dag(&dags, dags_made, s.seed, queue).await;
            dags_made += 1;
            i += 1;
        }
        if n % 100 == 99 {
            let (seen, terminal) = recorder.progress();
            eprintln!(
                "  {:>4.0} s: {} tasks created, {seen} seen, {terminal} terminal",
                started.elapsed().as_secs_f64(),
                n + 1
            );
        }
    }
    while dags_made < s.dags {
        create_errors += create_dag(&dags, dags_made, s.seed, queue).await;
        dags_made += 1;
    }
    for task in &mut fault_tasks.0 {
        let _ = task.await;
    }
    tokio::time::sleep_until((started + length).into()).await;
    restore_components(s);
    operators.lock().await.ensure_running()?;
    // The cron stops here: its expected firings are the whole minutes after its creation up to a
    // minute before now (a firing due while the operator was down may come that late).
    let suspended_at = jiff::Timestamp::now().as_second();
    suspend(&crons, cron_name).await;
    let first = (cron_created / 60 + 1) * 60;
    let last = (suspended_at - 60) / 60 * 60;
    eprintln!(
        "chaos: faults over at {:.0} s; draining (up to {:.0} s)",
        started.elapsed().as_secs_f64(),
        s.drain_seconds
    );
    let deadline = Instant::now() + Duration::from_secs_f64(s.drain_seconds);
    let mut said = Instant::now();
    loop {
        let unfinished = recorder.unfinished();
        let (seen, _) = recorder.progress();
        // DAG children not created yet are covered by their DAG, which is not terminal either.
        if unfinished.is_empty() && seen >= plan.len() - create_errors {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "chaos: {} tasks still not terminal after the drain",
                unfinished.len()
            );
            break;
        }
        if said.elapsed() >= Duration::from_secs(30) {
            let sample: Vec<String> = unfinished
                .iter()
                .take(5)
                .map(|(k, p, r)| {
                    format!(
                        "{k} {} {}",
                        p.as_deref().unwrap_or("-"),
                        r.as_deref().unwrap_or("")
                    )
                })
                .collect();
            eprintln!(
                "  {:>4.0} s: {} not terminal (e.g. {})",
                started.elapsed().as_secs_f64(),
                unfinished.len(),
                sample.join("; ")
            );
            said = Instant::now();
        }
        operators.lock().await.ensure_running()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The last writes' events reach the watches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    if create_errors > 0 {
        eprintln!("chaos: {create_errors} creates failed (after retries)");
    }
    let disruptions = disruptions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok((
        disruptions,
        (last >= first).then(|| (cron_name.to_owned(), first, last)),
    ))
}

/// The fault injections, stopped when the soak is (interrupted, or on an error): none may stop a
/// component after the soak restored them.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.iter().for_each(|task| task.abort());
    }
}

/// Creates `object`, retrying while the API server is stopped or the write times out; a 409
/// means an earlier try got through.
/// Creates the soak's DAG number `n` (`d-NNN`, its shape from the seed); 1 when that failed.
async fn create_dag(dags: &Api<DynamicObject>, n: usize, seed: u64, queue: &str) -> usize {
    let name = format!("d-{n:03}");
    let dag = chaos_plan::axdag(&name, seed.wrapping_add(n as u64), queue);
    match create(dags, dag).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("  creating {name}: {e:#}");
            1
        }
    }
}

async fn create(api: &Api<DynamicObject>, object: serde_json::Value) -> Result<()> {
    let object: DynamicObject = serde_json::from_value(object)?;
    let mut tries = 0;
    loop {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            Err(kube::Error::Api(status)) if status.code < 500 && status.code != 429 => {
                bail!("{}", status.message)
            }
            Err(e) if tries >= 30 => return Err(e.into()),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn suspend(crons: &Api<DynamicObject>, name: &str) {
    let patch = Patch::Merge(json!({"spec": {"suspend": true}}));
    for _ in 0..30 {
        if crons
            .patch(name, &PatchParams::default(), &patch)
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("  could not suspend the AxCron {name}");
}

/// The soak's two operator processes, in slots `chaos-a` and `chaos-b`. Each start gets a new
/// identity (`chaos-a-3`), as a replacement pod gets a new name: a restarted leader must not take
/// its predecessor's Lease back at once, the standby takes over once it expires.
pub struct Operators {
    bin: PathBuf,
    kubeconfig: PathBuf,
    metrics_port: u16,
    log_dir: PathBuf,
    children: [Option<(String, Child)>; 2],
    starts: [usize; 2],
    kills: usize,
}

const SLOTS: [&str; 2] = ["chaos-a", "chaos-b"];

impl Operators {
    fn start(s: &ChaosSettings) -> Result<Operators> {
        if !s.operator_bin.exists() {
            bail!(
                "no operator binary at {} (cargo build --bin ax-operator, or --operator-bin)",
                s.operator_bin.display()
            );
        }
        std::fs::create_dir_all(&s.log_dir)?;
        let mut operators = Operators {
            bin: s.operator_bin.clone(),
            kubeconfig: s.operator_kubeconfig.clone(),
            metrics_port: s.operator_metrics_port,
            log_dir: s.log_dir.clone(),
            children: [None, None],
            starts: [0, 0],
            kills: 0,
        };
        operators.ensure_running()?;
        Ok(operators)
    }

    fn spawn(&mut self, i: usize) -> Result<(String, Child)> {
        self.starts[i] += 1;
        let identity = format!("{}-{}", SLOTS[i], self.starts[i]);
        let log_path = self.log_dir.join(format!("{}.log", SLOTS[i]));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let child = Command::new(&self.bin)
            .arg("--identity")
            .arg(&identity)
            .env("KUBECONFIG", &self.kubeconfig)
            .env(
                "AX_METRICS_ADDR",
                format!("127.0.0.1:{}", self.metrics_port + i as u16),
            )
            .env(
                "RUST_LOG",
                std::env::var("AX_CHAOS_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        eprintln!("  operator {identity} started, pid {}", child.id());
        Ok((identity, child))
    }

    /// Starts whichever of the two is not running.
    fn ensure_running(&mut self) -> Result<()> {
        for i in 0..2 {
            let exited = match self.children[i].as_mut() {
                None => true,
                Some((_, child)) => child.try_wait()?.is_some(),
            };
            if exited {
                self.children[i] = Some(self.spawn(i)?);
            }
        }
        Ok(())
    }

    /// The slot whose running operator is `identity`.
    fn slot_of(&self, identity: &str) -> Option<usize> {
        self.children
            .iter()
            .position(|c| c.as_ref().is_some_and(|(id, _)| id == identity))
    }

    /// SIGKILLs the operator in slot `i` and reaps it: its identity and pid.
    fn kill(&mut self, i: usize) -> Option<(String, u32)> {
        let (identity, mut child) = self.children[i].take()?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        self.kills += 1;
        Some((identity, pid))
    }

    fn stop_all(&mut self) {
        for slot in &mut self.children {
            if let Some((_, mut child)) = slot.take() {
                // SIGTERM: a clean stop releases the Lease.
                // SAFETY: kill(2) on a child we spawned and have not reaped.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                let deadline = Instant::now() + Duration::from_secs(15);
                while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        eprintln!("  operators stopped ({} kills)", self.kills);
    }
}

impl Drop for Operators {
    fn drop(&mut self) {
        for (_, child) in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct InjectorSettings {
    cluster_dir: PathBuf,
    cluster_script: PathBuf,
    sim_prefix: String,
}

#[derive(Clone)]
struct Injector {
    client: Client,
    settings: Arc<InjectorSettings>,
    recorder: Recorder,
    operators: Arc<Mutex<Operators>>,
    disruptions: Arc<std::sync::Mutex<Vec<Disruption>>>,
    behaviors: Arc<std::collections::HashMap<String, Behavior>>,
}

/// Live pods a fault picks from at once.
const PODS_PER_FAULT: usize = 3;

impl Injector {
    async fn inject(&self, kind: FaultKind, seed: u64) -> Result<()> {
        let mut rng = StdRng::seed_from_u64(seed);
        let holds = kind.holds();
        match kind {
            FaultKind::OperatorKill => {
                let leader = self.leader().await;
                let mut operators = self.operators.lock().await;
                // The leader most of the time (the standby takes over); now and then the standby.
                let victim = match leader.as_deref().and_then(|l| operators.slot_of(l)) {
                    Some(l) if rng.random_bool(0.8) => l,
                    Some(l) => 1 - l,
                    None => rng.random_range(0..2),
                };
                if let Some((identity, pid)) = operators.kill(victim) {
                    let role = if leader.as_deref() == Some(identity.as_str()) {
                        "leading"
                    } else {
                        "standby"
                    };
                    eprintln!("  fault: SIGKILL operator {identity} ({role}, pid {pid})");
                }
                drop(operators);
                tokio::time::sleep(Duration::from_millis(rng.random_range(500..5_000))).await;
                self.operators.lock().await.ensure_running()?;
            }
            FaultKind::ApiserverStopShort | FaultKind::ApiserverStopLong => {
                self.stop_process("kube-apiserver", holds).await?
            }
            FaultKind::EtcdStop => self.stop_process("etcd", holds).await?,
            FaultKind::KubeletStop => {
                self.record_all_live_on(Some("localhost"), kind);
                self.cluster_script(&["kubelet", "stop"])?;
                eprintln!("  fault: kubelet stopped for {} s", holds.as_secs());
                tokio::time::sleep(holds).await;
                self.cluster_script(&["kubelet", "start"])?;
                eprintln!("  fault over: kubelet started");
            }
            FaultKind::SimNodeSilent => {
                let node = self.sim_node(&mut rng).await?;
                self.record_all_live_on(Some(&node), kind);
                self.silence(&node, holds).await?;
                eprintln!(
                    "  fault: sim node {node}'s heartbeats stopped for {} s",
                    holds.as_secs()
                );
                tokio::time::sleep(holds).await;
                self.annotate_heartbeat(&node, None).await?;
                eprintln!("  fault over: sim node {node}'s heartbeats again");
            }
            FaultKind::NodeDelete => {
                let node = self.sim_node(&mut rng).await?;
                let on_node = self.record_all_live_on(Some(&node), kind);
                // Silenced first: the sim registers a deleted node again at its next heartbeat,
                // before pod GC (40 s quarantine, 20 s period) would see it gone.
                self.silence(&node, holds).await?;
                nodes(&self.client)
                    .delete(&node, &DeleteParams::default())
                    .await
                    .with_context(|| format!("deleting node {node}"))?;
                eprintln!(
                    "  fault: node {node} deleted under {on_node} live workers, back in {} s",
                    holds.as_secs()
                );
            }
            FaultKind::Evict | FaultKind::ForceDelete => {
                let live = self.recorder.live_pods();
                let picked: Vec<LivePod> = live
                    .choose_multiple(&mut rng, PODS_PER_FAULT)
                    .cloned()
                    .collect();
                for pod in picked {
                    let done = if kind == FaultKind::Evict {
                        self.evict(&pod).await
                    } else {
                        self.force_delete(&pod).await
                    };
                    match done {
                        Ok(()) => {
                            eprintln!("  fault: {} {}/{}", kind.as_str(), pod.namespace, pod.name);
                            self.record(&pod, kind);
                        }
                        Err(e) => eprintln!(
                            "  fault: {} {}/{}: {e:#}",
                            kind.as_str(),
                            pod.namespace,
                            pod.name
                        ),
                    }
                }
            }
        }
        Ok(())
    }

    fn record(&self, pod: &LivePod, kind: FaultKind) {
        let fails_anyway = self
            .behaviors
            .get(&pod.task)
            .is_some_and(|b| b.fails_anyway());
        self.disruptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Disruption {
                task: pod.task.clone(),
                attempt: pod.attempt,
                fault: kind.as_str().to_owned(),
                fails_anyway,
            });
    }

    /// Records every live pod on `node` as disrupted; returns how many.
    fn record_all_live_on(&self, node: Option<&str>, kind: FaultKind) -> usize {
        let live: Vec<LivePod> = self
            .recorder
            .live_pods()
            .into_iter()
            .filter(|p| p.node.as_deref() == node)
            .collect();
        for pod in &live {
            self.record(pod, kind);
        }
        live.len()
    }

    async fn leader(&self) -> Option<String> {
        let leases: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            "ax-system",
            &kube::core::ApiResource::from_gvk_with_plural(
                &kube::core::GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
                "leases",
            ),
        );
        let lease = tokio::time::timeout(Duration::from_secs(3), leases.get("ax-operator"))
            .await
            .ok()?
            .ok()?;
        lease.data["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_owned)
    }

    async fn stop_process(&self, component: &str, holds: Duration) -> Result<()> {
        let pid = component_pid(&self.settings.cluster_dir, component)?;
        // SAFETY: kill(2) with a pid read from the harness's pid file.
        if unsafe { libc::kill(pid as i32, libc::SIGSTOP) } != 0 {
            bail!("SIGSTOP {component} (pid {pid}) failed");
        }
        eprintln!(
            "  fault: {component} (pid {pid}) stopped for {} s",
            holds.as_secs()
        );
        tokio::time::sleep(holds).await;
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        eprintln!("  fault over: {component} continued");
        Ok(())
    }

    fn cluster_script(&self, args: &[&str]) -> Result<()> {
        let status = Command::new(&self.settings.cluster_script)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {}", self.settings.cluster_script.display()))?;
        if !status.success() {
            bail!(
                "{} {} failed",
                self.settings.cluster_script.display(),
                args.join(" ")
            );
        }
        Ok(())
    }

    /// A sim node to fault: one that exists and is not silent already (another fault has it),
    /// picked through a random live worker so that busy nodes are hit more often.
    async fn sim_node(&self, rng: &mut StdRng) -> Result<String> {
        let listed = nodes(&self.client)
            .list(&ListParams::default())
            .await
            .context("listing nodes")?;
        let candidates: Vec<String> = listed
            .items
            .iter()
            .filter(|n| {
                n.metadata
                    .annotations
                    .as_ref()
                    .is_none_or(|a| !a.contains_key(SIM_HEARTBEAT_ANNOTATION))
            })
            .filter_map(|n| n.metadata.name.clone())
            .filter(|n| n.starts_with(&self.settings.sim_prefix))
            .collect();
        let busy: Vec<String> = self
            .recorder
            .live_pods()
            .into_iter()
            .filter_map(|p| p.node)
            .filter(|n| candidates.contains(n))
            .collect();
        busy.choose(rng)
            .or_else(|| candidates.choose(rng))
            .cloned()
            .context("no sim node that is up and not faulted already")
    }

    /// Stops `node`'s heartbeats for `holds`: the sim ends the silence on its own, so a run that
    /// dies meanwhile leaves no node silent, and a deleted node stays away that long.
    async fn silence(&self, node: &str, holds: Duration) -> Result<()> {
        let until = jiff::Timestamp::now() + jiff::SignedDuration::try_from(holds)?;
        let value = format!("stopped-until={until}");
        self.annotate_heartbeat(node, Some(&value)).await
    }

    async fn annotate_heartbeat(&self, node: &str, value: Option<&str>) -> Result<()> {
        let nodes = nodes(&self.client);
        let patch = Patch::Merge(json!({
            "metadata": {"annotations": {SIM_HEARTBEAT_ANNOTATION: value}}
        }));
        let mut tries = 0;
        loop {
            match nodes.patch(node, &PatchParams::default(), &patch).await {
                Ok(_) => return Ok(()),
                // Gone (deleted by another fault): nothing to silence, and no silence to lift.
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    bail!("node {node} is gone")
                }
                Err(e) if tries >= 30 => return Err(e).context(format!("annotating {node}")),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Through the Eviction API (policy/v1beta1: the local cluster is 1.20).
    async fn evict(&self, pod: &LivePod) -> Result<()> {
        let body = json!({
            "apiVersion": "policy/v1beta1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        });
        let request = http::Request::post(format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body)?)?;
        self.client
            .request::<serde_json::Value>(request)
            .await
            .map(drop)
            .map_err(Into::into)
    }

    async fn force_delete(&self, pod: &LivePod) -> Result<()> {
        let pods: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &pod.namespace,
            &chaos_record::pod_resource(),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete(&pod.name, &params).await.map(drop)?;
        Ok(())
    }
}

fn nodes(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("", "v1", "Node"),
            "nodes",
        ),
    )
}

/// A cluster component's pid from the harness's pid file (`$AX_E2E_DIR/run/<name>.pid`).
fn component_pid(cluster_dir: &std::path::Path, component: &str) -> Result<u32> {
    let path = cluster_dir.join("run").join(format!("{component}.pid"));
    let pid: u32 = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", path.display()))?;
    if !crate::procs::is_alive(pid) {
        bail!(
            "{component} (pid {pid} from {}) is not running",
            path.display()
        );
    }
    Ok(pid)
}

/// Whatever a fault left stopped runs again: SIGCONT to the API server and etcd, the kubelet
/// started (a no-op when it runs). Called when the fault window ends and on every way out.
fn restore_components(s: &ChaosSettings) {
    for component in ["kube-apiserver", "etcd"] {
        if let Ok(pid) = component_pid(&s.cluster_dir, component) {
            // SAFETY: kill(2) with a pid read from the harness's pid file.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
    if s.faults.contains(&FaultKind::KubeletStop) {
        let _ = Command::new(&s.cluster_script)
            .args(["kubelet", "start"])
            .stdout(Stdio::null())
            .status();
    }
}
