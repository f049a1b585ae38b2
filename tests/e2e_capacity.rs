//! Capacity that follows the clock and the cluster (issue 14), on the real cluster with the shared
//! operator: a `weightSchedule` window that caps concurrency until it ends, an adaptive queue that
//! finds the capacity of its nodes and follows it up, node pressure that shrinks an adaptive queue,
//! and estimated start times that come true.
//!
//! Tests that change node capacity or pressure start their own simulator for a private pool of
//! nodes (`common::sim_pool`): only their own pods select it, so tests running beside them on the
//! shared sim nodes are not disturbed, and they run in the parallel phase like any other.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax::api::{AxQueue, AxTask, Priority, TaskPhase};
use common::queue::{create_queue, get_queue, patch_queue, wait_queue};
use common::sim_pool::SimPool;
use common::*;
use futures::StreamExt;
use jiff::{SignedDuration, Timestamp, ToSpan};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

fn effective(queue: &AxQueue) -> Option<i64> {
    queue.status.as_ref()?.effective_concurrency
}

fn task_with(name: &str, queue: &str, priority: Priority, template: serde_json::Value) -> AxTask {
    serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name},
        "spec": {
            "type": "work",
            "queue": queue,
            "priority": priority.as_str(),
            "retry": {"maxRetries": 0},
            "template": template,
        },
    }))
    .expect("an AxTask")
}

/// A worker for the shared sim nodes that "runs" for `millis`.
fn shared_sim_pod(millis: u64) -> serde_json::Value {
    json!({"spec": common::sim::SimWorker::running_for(millis).start_ms(50).pod_spec()})
}

/// Keeps about `backlog` tasks waiting in a queue, creating more as they are dispatched, until
/// stopped: the tests need tasks waiting throughout, not hundreds created up front.
struct Feeder {
    created: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Feeder {
    fn start(
        client: &Client,
        ns: &str,
        queue: &str,
        backlog: i64,
        template: serde_json::Value,
    ) -> Self {
        let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = created.clone();
        let (client, ns, queue) = (client.clone(), ns.to_string(), queue.to_string());
        let task = tokio::spawn(async move {
            let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
            let queues: Api<AxQueue> = Api::all(client);
            let mut next = 0;
            loop {
                // A failed read (the API server is busy) just skips a round.
                let waiting = match queues.get(&queue).await {
                    Ok(q) => q.status.map_or(0, |s| s.pending.normal),
                    Err(_) => backlog,
                };
                let missing = usize::try_from(backlog - waiting).unwrap_or(0);
                let batch: Vec<AxTask> = (next..next + missing)
                    .map(|i| {
                        task_with(
                            &format!("f-{i:04}"),
                            &queue,
                            Priority::Normal,
                            template.clone(),
                        )
                    })
                    .collect();
                futures::stream::iter(batch)
                    .for_each_concurrent(8, |task| {
                        let (tasks, count) = (tasks.clone(), count.clone());
                        async move {
                            match tasks.create(&PostParams::default(), &task).await {
                                Ok(_) => {
                                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                                Err(e) => eprintln!("feeder: create {}: {e}", task.name_any()),
                            }
                        }
                    })
                    .await;
                next += missing;
                // The queue status is written every 2 s: give it time to count the new ones.
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        Self { created, task }
    }

    /// Stops creating; returns how many tasks it created (at least: a create in flight when it
    /// stops may still land).
    fn stop(&self) -> usize {
        self.task.abort();
        self.created.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls the namespace until every task is terminal; they must all have Succeeded.
async fn wait_all_succeeded(client: &Client, ns: &str, timeout: Duration) -> Vec<AxTask> {
    let deadline = Instant::now() + timeout;
    loop {
        let tasks = tasks_in(client, ns).await;
        let open: Vec<String> = tasks
            .iter()
            .filter(|t| !phase(t).is_some_and(TaskPhase::is_terminal))
            .map(|t| t.name_any())
            .collect();
        if open.is_empty() {
            let failed: Vec<String> = tasks
                .iter()
                .filter(|t| phase(t) != Some(TaskPhase::Succeeded))
                .map(names)
                .collect();
            assert!(failed.is_empty(), "tasks did not succeed: {failed:?}");
            return tasks;
        }
        assert!(
            Instant::now() < deadline,
            "{} tasks in {ns} not finished within {timeout:?}, e.g. {:?}",
            open.len(),
            &open[..open.len().min(5)]
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Deletes the namespace's tasks and waits until their pods are gone, while the nodes they run on
/// are still driven (a pool's simulator stops when the pool is dropped).
async fn delete_tasks_and_pods(client: &Client, ns: &str) {
    run_kubectl(
        &["-n", ns, "delete", "axtasks", "--all", "--wait=false"],
        None,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(90);
    while !pods
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "pods of {ns} not gone in 90 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run_kubectl(&["delete", "namespace", ns, "--wait=false"], None);
}

/// One instant of the census: worker pods not finished, and those of them the scheduler found no
/// room for (`PodScheduled` False, reason `Unschedulable`; a pod just created and not yet looked at
/// is not counted).
#[derive(Clone, Copy, Debug)]
struct Census {
    at: Instant,
    live: usize,
    unschedulable: usize,
}

/// Every worker pod of a namespace as a watch sees it, counted after each change.
struct PodCensus {
    samples: Arc<Mutex<Vec<Census>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl PodCensus {
    fn start(client: &Client, ns: &str) -> Self {
        let samples: Arc<Mutex<Vec<Census>>> = Arc::default();
        let record = samples.clone();
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let watch = tokio::spawn(async move {
            // name -> (unschedulable, live)
            let mut pods: BTreeMap<String, (bool, bool)> = BTreeMap::new();
            let mut stream = watcher(api, watcher::Config::default().labels("ax.dev/task")).boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                        let live = !matches!(phase.as_deref(), Some("Succeeded" | "Failed"));
                        let unschedulable = p
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|conditions| {
                                conditions.iter().any(|c| {
                                    c.type_ == "PodScheduled"
                                        && c.status == "False"
                                        && c.reason.as_deref() == Some("Unschedulable")
                                })
                            });
                        pods.insert(p.name_any(), (unschedulable, live));
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        pods.remove(&p.name_any());
                    }
                    _ => continue,
                }
                let live = pods.values().filter(|(_, live)| *live).count();
                let unschedulable = pods.values().filter(|(u, l)| *l && *u).count();
                record.lock().unwrap().push(Census {
                    at: Instant::now(),
                    live,
                    unschedulable,
                });
            }
        });
        Self { samples, watch }
    }

    /// The largest counts seen at or after `since`: (live, unschedulable).
    fn max_since(&self, since: Instant) -> (usize, usize) {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|c| c.at >= since)
            .fold((0, 0), |(l, u), c| (l.max(c.live), u.max(c.unschedulable)))
    }

    /// The largest counts seen before `until`.
    fn max_before(&self, until: Instant) -> (usize, usize) {
        let samples = self.samples.lock().unwrap();
        samples
            .iter()
            .filter(|c| c.at < until)
            .fold((0, 0), |(l, u), c| (l.max(c.live), u.max(c.unschedulable)))
    }
}

impl Drop for PodCensus {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Waits until the effective concurrency stays within `range` for `hold`; returns when it first
/// saw a decrease for Unschedulable pods (the first adjustment), if it did.
async fn wait_settled(
    client: &Client,
    queue: &str,
    range: std::ops::RangeInclusive<i64>,
    hold: Duration,
    timeout: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + timeout;
    let mut inside_since: Option<Instant> = None;
    let mut first_decrease = None;
    loop {
        let q = get_queue(client, queue).await;
        let status = q.status.clone().unwrap_or_default();
        if first_decrease.is_none()
            && status
                .last_concurrency_change
                .as_ref()
                .is_some_and(|c| c.to < c.from)
        {
            first_decrease = Some(Instant::now());
        }
        let value = status.effective_concurrency.unwrap_or(-1);
        if range.contains(&value) {
            let since = *inside_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= hold {
                return first_decrease;
            }
        } else {
            inside_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "queue {queue}: effective concurrency not settled in {range:?} for {hold:?} within \
             {timeout:?}; last status:\n{}",
            ax::yaml::to_string(&q.status).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The value of `ax_queue_effective_concurrency` for `queue` on the shared operator's /metrics.
fn scraped_effective_concurrency(queue: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let addr =
        std::env::var("AX_OPERATOR_METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:18080".into());
    let mut stream = std::net::TcpStream::connect(&addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    let series = format!("ax_queue_effective_concurrency{{queue=\"{queue}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&series)?.split(' ').next()?.parse().ok())
}

/// `HH:MM` of the wall clock of `zone` at `at`.
fn wall_clock(at: Timestamp, zone: &str) -> String {
    let local = at.in_tz(zone).expect("a known zone");
    format!("{:02}:{:02}", local.hour(), local.minute())
}

#[tokio::test]
async fn a_schedule_window_caps_concurrency_until_it_ends() {
    let client = client().await;
    let ns = namespace(&client, "window").await;
    // A window in India's +05:30 wall clock that began a minute ago and ends at the first full
    // minute at least 30 s from now.
    let zone = "Asia/Kolkata";
    let now = Timestamp::now();
    let end = {
        let at = now + SignedDuration::from_secs(30);
        let local = at.in_tz(zone).expect("zone");
        let floor = local
            .round(
                jiff::ZonedRound::new()
                    .smallest(jiff::Unit::Minute)
                    .mode(jiff::RoundMode::Trunc),
            )
            .expect("round");
        (floor + 1.minute()).timestamp()
    };
    let from = wall_clock(now - SignedDuration::from_secs(60), zone);
    let to = wall_clock(end, zone);
    let queue = create_queue(
        &client,
        "window",
        json!({
            "concurrency": 6,
            "weightSchedule": [{"from": from, "to": to, "timeZone": zone, "concurrency": 2}],
        }),
    )
    .await;
    let q = wait_queue(&client, &queue.name, LONG, "the window in force", |q| {
        q.status.as_ref().is_some_and(|s| {
            s.active_window.as_ref().is_some_and(|w| w.index == 0)
                && s.limits.as_ref().is_some_and(|l| l.concurrency == 2)
                && s.effective_concurrency == Some(2)
        })
    })
    .await;
    let window = q.status.and_then(|s| s.active_window).expect("a window");
    assert_eq!(
        (
            window.from.as_str(),
            window.to.as_str(),
            window.time_zone.as_str()
        ),
        (from.as_str(), to.as_str(), zone)
    );

    let census = PodCensus::start(&client, &ns);
    let tasks = (0..80)
        .map(|i| {
            task_with(
                &format!("w-{i:03}"),
                &queue.name,
                Priority::Normal,
                shared_sim_pod(3000),
            )
        })
        .collect();
    create_all(&client, &ns, tasks).await;

    // Until the window ends, never more than 2 worker pods at once.
    let until_end = Duration::try_from(end.duration_since(Timestamp::now())).unwrap_or_default();
    let end_instant = Instant::now() + until_end;
    tokio::time::sleep(until_end).await;
    let (live, _) = census.max_before(end_instant);
    assert!(
        live <= 2,
        "{live} worker pods alive at once inside the window (concurrency 2)"
    );
    assert!(live >= 1, "nothing ran inside the window");

    // After it, the queue's own 6 apply again, without a restart.
    wait_queue(&client, &queue.name, LONG, "the window gone", |q| {
        q.status.as_ref().is_some_and(|s| {
            s.active_window.is_none() && s.limits.as_ref().is_some_and(|l| l.concurrency == 6)
        })
    })
    .await;
    let deadline = Instant::now() + LONG;
    while census.max_since(end_instant).0 < 4 {
        assert!(
            Instant::now() < deadline,
            "after the window ended, at most {:?} worker pods ran at once",
            census.max_since(end_instant)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        census.max_since(end_instant).0 <= 6,
        "over the queue's concurrency"
    );
    wait_all_succeeded(&client, &ns, Duration::from_secs(300)).await;
    run_kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}

#[tokio::test]
async fn an_adaptive_queue_settles_at_its_nodes_capacity_and_follows_it_up() {
    let client = client().await;
    // Two private nodes of 5 pods: the queue's pods can hold 10 slots at once.
    let pool = SimPool::start(&client, "adaptive", 2, 5).await;
    let ns = namespace(&client, "adaptive").await;
    let queue = create_queue(
        &client,
        "adaptive",
        json!({"concurrency": 50, "concurrencyPolicy": {"mode": "Adaptive", "min": 2}}),
    )
    .await;
    wait_queue(
        &client,
        &queue.name,
        LONG,
        "effective concurrency at min",
        |q| effective(q) == Some(2),
    )
    .await;
    let census = PodCensus::start(&client, &ns);
    let feeder = Feeder::start(&client, &ns, &queue.name, 25, pool.template(6000));

    // It grows until the pool is full, lowers its concurrency (the first adjustment), and settles.
    wait_queue(
        &client,
        &queue.name,
        Duration::from_secs(180),
        "a decrease for Unschedulable pods",
        |q| {
            q.status
                .as_ref()
                .and_then(|s| s.last_concurrency_change.as_ref())
                .is_some_and(|c| c.to < c.from && c.reason == "PodsUnschedulable")
        },
    )
    .await;
    let first_decrease = Instant::now();
    wait_settled(
        &client,
        &queue.name,
        8..=13,
        Duration::from_secs(12),
        Duration::from_secs(180),
    )
    .await;
    // After the first adjustment (and one task length for the pods it had over-dispatched to be
    // placed), the queue never floods the scheduler: at most a few pods are Unschedulable.
    let settled = first_decrease + Duration::from_secs(10);
    let (live, unschedulable) = census.max_since(settled);
    assert!(
        unschedulable <= 5,
        "{unschedulable} pods Unschedulable at once after the first adjustment"
    );
    assert!(live <= 15, "{live} pods alive at once on a capacity of 10");
    let metric =
        scraped_effective_concurrency(&queue.name).expect("ax_queue_effective_concurrency");
    assert!(
        (8.0..=13.0).contains(&metric),
        "ax_queue_effective_concurrency = {metric}"
    );

    // Four times the capacity: it grows to near 40, never past its maximum.
    pool.set_capacity(&client, 20).await;
    let mut highest = 0;
    wait_queue(
        &client,
        &queue.name,
        Duration::from_secs(150),
        "growth to near 40",
        |q| {
            highest = highest.max(effective(q).unwrap_or(0));
            highest >= 34
        },
    )
    .await;
    let q = get_queue(&client, &queue.name).await;
    let status = q.status.expect("status");
    assert!(status.effective_concurrency.unwrap_or(0) <= 50);
    let change = status.last_concurrency_change.expect("a change recorded");
    assert!(!change.message.is_empty(), "{change:?}");
    wait_events_of(
        &client,
        "default",
        "AxQueue",
        &queue.name,
        &["ConcurrencyRaised"],
    )
    .await;
    let created = feeder.stop();
    let finished = wait_all_succeeded(&client, &ns, Duration::from_secs(300)).await;
    assert!(
        finished.len() >= created,
        "{} of {created} tasks seen",
        finished.len()
    );
    run_kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    drop(pool);
}

/// Every `lastConcurrencyChange` a queue's status showed, from a watch of the queue.
struct ChangeLog {
    seen: Arc<Mutex<Vec<ax::api::ConcurrencyChange>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ChangeLog {
    fn start(client: &Client, queue: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let api: Api<AxQueue> = Api::all(client.clone());
        let (log, queue) = (seen.clone(), queue.to_string());
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher::watch_object(api, &queue));
            while let Some(event) = events.next().await {
                let Ok(Some(queue)) = event else { continue };
                let change = queue.status.and_then(|s| s.last_concurrency_change);
                let mut log = log.lock().expect("change log");
                if let Some(change) = change.filter(|c| log.last() != Some(c)) {
                    log.push(change);
                }
            }
        });
        Self { seen, task }
    }

    fn seen(&self) -> Vec<ax::api::ConcurrencyChange> {
        self.seen.lock().expect("change log").clone()
    }
}

impl Drop for ChangeLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn node_pressure_shrinks_an_adaptive_queue_and_clearing_it_lets_it_grow_back() {
    let client = client().await;
    let pool = SimPool::start(&client, "pressure", 2, 5).await;
    let ns = namespace(&client, "pressure").await;
    let queue = create_queue(
        &client,
        "pressure",
        json!({"concurrency": 30, "concurrencyPolicy": {"mode": "Adaptive", "min": 1}}),
    )
    .await;
    // Workers run 10 s, so the pressured node's pods are there for several of the operator's looks
    // (every 2 s) after it reports the pressure, on a busy machine too.
    let feeder = Feeder::start(&client, &ns, &queue.name, 20, pool.template(10_000));
    wait_settled(
        &client,
        &queue.name,
        8..=13,
        Duration::from_secs(8),
        Duration::from_secs(180),
    )
    .await;

    // One of the two nodes reports MemoryPressure: the queue backs off it. Every change is read
    // from a watch of the queue, so a change that a later one replaced within a poll still counts.
    let changes = ChangeLog::start(&client, &queue.name);
    pool.set_pressure(&client, 0, "MemoryPressure").await;
    let deadline = Instant::now() + LONG;
    let change = loop {
        let shrink = changes
            .seen()
            .into_iter()
            .find(|c| c.reason == "NodePressure" && c.to < c.from && c.to <= 7);
        if let Some(change) = shrink {
            break change;
        }
        assert!(
            Instant::now() < deadline,
            "queue {}: no shrink for node pressure within {LONG:?}; changes seen: {:#?}",
            queue.name,
            changes.seen()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(change.message.contains("MemoryPressure"), "{change:?}");
    wait_events_of(
        &client,
        "default",
        "AxQueue",
        &queue.name,
        &["ConcurrencyLowered"],
    )
    .await;
    // Held there while the pressure lasts: a waiting task says what holds it.
    let held = wait_queue(
        &client,
        &queue.name,
        LONG,
        "tasks held by the adaptive limit",
        |q| q.status.as_ref().is_some_and(|s| s.pending.normal > 0),
    )
    .await;
    drop(held);
    let deadline = Instant::now() + LONG;
    loop {
        let tasks = tasks_in(&client, &ns).await;
        let adaptive_held = tasks.iter().any(|t| {
            t.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Queued" && c.reason == "AdaptiveLimit")
            })
        });
        if adaptive_held {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no waiting task says AdaptiveLimit"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // The pressure cleared: it grows back to the capacity of both nodes.
    pool.set_pressure(&client, 0, "").await;
    wait_queue(
        &client,
        &queue.name,
        Duration::from_secs(120),
        "growth back",
        |q| effective(q).unwrap_or(0) >= 9,
    )
    .await;
    feeder.stop();
    delete_tasks_and_pods(&client, &ns).await;
    drop(pool);
}

/// The estimated start in a task's `Queued` message, if it has one.
fn estimated_start(task: &AxTask) -> Option<Timestamp> {
    let message = &task
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Queued")?
        .message;
    let (_, rest) = message.rsplit_once("estimated start ")?;
    rest.split([' ', ',', ')']).next()?.parse().ok()
}

fn queued_message(task: &AxTask) -> String {
    task.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Queued"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Cancels the longest-dispatched live tasks of `ns`, `per_second` of them for every second since
/// it started, until aborted: a dispatch clock that does not depend on how long workers take to
/// start. A tick that comes late (the API server is busy) cancels what the seconds it missed owed,
/// so the pace over any stretch of a few seconds is `per_second`, as a steady rate must be.
fn cancel_clock(client: &Client, ns: &str, per_second: usize) -> tokio::task::JoinHandle<()> {
    let api: Api<AxTask> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        // The clock starts with the first running task, so the wait for the first grants is not
        // owed as a burst of cancels.
        let mut started: Option<Instant> = None;
        let mut canceled = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let seconds = started.map_or(0, |s| s.elapsed().as_secs() as usize);
            let owed = ((seconds + 1) * per_second).saturating_sub(canceled);
            if started.is_some() && owed == 0 {
                continue;
            }
            // A failed read (the API server is busy) just skips a tick; the next one catches up.
            let Ok(list) = api.list(&ListParams::default()).await else {
                continue;
            };
            let mut live: Vec<(Timestamp, String)> = list
                .items
                .iter()
                .filter(|t| !t.spec.cancel)
                .filter(|t| matches!(phase(t), Some(TaskPhase::Scheduled | TaskPhase::Running)))
                .filter_map(|t| Some((t.status.as_ref()?.scheduled_at?, t.name_any())))
                .collect();
            live.sort();
            if live.is_empty() {
                continue;
            }
            started.get_or_insert_with(Instant::now);
            for (_, name) in live.into_iter().take(owed) {
                let patch = json!({"spec": {"cancel": true}});
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => canceled += 1,
                    Err(e) => eprintln!("cancel clock: {name}: {e}"),
                }
            }
        }
    })
}

#[tokio::test]
async fn estimated_start_times_come_true_at_a_steady_dispatch_rate() {
    let client = client().await;
    let ns = namespace(&client, "estimate").await;
    // Paused while the tasks are queued, so all 300 wait from the start.
    let queue = create_queue(&client, "estimate", json!({"concurrency": 0})).await;
    // A steady rate by construction: every worker would run for an hour, and the test cancels one
    // running task a second, so the full queue grants one slot a second. (At two a second, a debug
    // operator beside the other capacity tests lagged enough to miss task 100's 25 %.) A bucket is
    // in creation order, to the second: the names only label the tasks.
    let tasks: Vec<AxTask> = (1..=300u64)
        .map(|i| {
            task_with(
                &format!("e-{i:03}"),
                &queue.name,
                Priority::Low,
                shared_sim_pod(3_600_000),
            )
        })
        .collect();
    create_all(&client, &ns, tasks).await;
    wait_queue(&client, &queue.name, LONG, "300 pending", |q| {
        q.status.as_ref().is_some_and(|s| s.pending.low == 300)
    })
    .await;
    // Honest while paused: a position, no time.
    let paused = wait_task(&client, &ns, "e-150", LONG, |t| {
        queued_message(t).contains("estimated start unknown (the queue is paused")
    })
    .await;
    assert!(
        queued_message(&paused).contains("in the Low bucket"),
        "{}",
        queued_message(&paused)
    );

    patch_queue(&client, &queue.name, json!({"concurrency": 30})).await;
    let clock = cancel_clock(&client, &ns, 1);
    wait_queue(
        &client,
        &queue.name,
        Duration::from_secs(180),
        "60 dispatched",
        // The first 30 grants at once are not measured; the next 30 show the steady rate.
        |q| q.status.as_ref().is_some_and(|s| s.dispatched >= 60),
    )
    .await;
    // Estimates are written a few at a time (their writes are capped), so each is waited for.
    let mut picked = Vec::new();
    for name in ["e-100", "e-200", "e-300"] {
        let task = wait_task(&client, &ns, name, LONG, |t| {
            phase(t) == Some(TaskPhase::Pending) && estimated_start(t).is_some()
        })
        .await;
        let estimate = estimated_start(&task).expect("an estimate");
        picked.push((estimate, name.to_string(), Timestamp::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let started: Vec<Timestamp> = loop {
        let tasks = tasks_in(&client, &ns).await;
        let scheduled: Option<Vec<Timestamp>> = picked
            .iter()
            .map(|(_, name, _)| {
                let task = tasks.iter().find(|t| &t.name_any() == name)?;
                task.status.as_ref()?.scheduled_at
            })
            .collect();
        if let Some(scheduled) = scheduled {
            break scheduled;
        }
        assert!(
            Instant::now() < deadline,
            "not all of {picked:?} dispatched within 600 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    clock.abort();
    for ((estimate, name, read_at), started) in picked.iter().zip(started) {
        let waited = started.duration_since(*read_at).as_secs_f64();
        let error = estimate.duration_since(started).as_secs_f64().abs();
        eprintln!("{name}: off by {error:.1}s on a wait of {waited:.1}s");
        assert!(
            error <= 0.25 * waited,
            "{name}: estimated {estimate}, started {started}: off by {error:.1}s on a wait of \
             {waited:.1}s from when it was read"
        );
    }
    run_kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}
