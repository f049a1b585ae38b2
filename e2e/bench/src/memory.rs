//! Memory mode: N pending AxTasks (mixed priorities and types) in a queue of concurrency 0, the
//! operator's resident memory before and after, then a restart of the operator and the time it
//! takes to rebuild its queues from a fresh list, its memory after that, and (optionally) the time
//! until the first dispatch once the queue is opened.
//!
//! The rebuild is timed to the operator's log line "queues rebuilt from the cache", by its own
//! timestamp: that is the moment its caches have listed every task and the dispatcher holds all of
//! them, i.e. when dispatch can start. Without a log file it falls back to the operator's
//! `/metrics` showing the queue's pending count again, which lags the rebuild by up to the queue
//! status loop's period (2 s) plus the poll interval.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use serde_json::json;

use crate::bench::{self, Settle, random_suffix};
use crate::procs::{Memory, find_operator, is_alive};
use crate::workload::{self, SimWorker};

const PRIORITIES: [&str; 4] = ["Critical", "High", "Normal", "Low"];

/// How the operator is restarted.
#[derive(Clone, Debug)]
pub enum Restart {
    /// Run this shell command (`sh -c`); it must stop the operator and start a new one (it may
    /// leave the new one running in the background).
    Command(String),
    /// Send this signal to the operator's pid and wait for its supervisor (a kubelet, a shell
    /// loop, systemd) to start a new process matching the pattern.
    Signal(i32),
    /// Measure the load only.
    Skip,
}

pub struct MemorySettings {
    pub tasks: usize,
    pub types: usize,
    pub parallel: usize,
    pub operator_pid: Option<u32>,
    pub operator_pattern: String,
    pub operator_log: Option<PathBuf>,
    pub rebuilt_line: String,
    pub operator_metrics: Option<String>,
    pub restart: Restart,
    /// How long the operator may take to show every task pending, and to rebuild after a restart.
    pub timeout: Duration,
    /// After the rebuild, open the queue (concurrency 1) and time the first worker pod.
    pub dispatch_check: bool,
    pub settle: Settle,
    pub watched: Vec<crate::procs::Watched>,
    pub keep: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryReport {
    pub tasks: usize,
    pub created: usize,
    pub create_errors: usize,
    pub first_create_error: Option<String>,
    pub create_seconds: f64,
    pub namespace: String,
    pub queue: String,
    pub operator_pid: u32,
    pub operator_exe: Option<String>,
    pub idle: Option<Memory>,
    /// Once the operator's queue shows every task pending and the cluster has settled.
    pub loaded: Option<Memory>,
    /// Seconds from the last create until the queue's status showed every task pending.
    pub seen_pending_after_seconds: Option<f64>,
    pub kib_per_task: Option<f64>,
    pub mib_per_10k_tasks: Option<f64>,
    pub restart: Option<RestartReport>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RestartReport {
    pub how: String,
    pub new_pid: Option<u32>,
    /// Restart → the old process gone (signal mode).
    pub old_gone_seconds: Option<f64>,
    /// Restart → a new process matching the pattern.
    pub new_process_seconds: Option<f64>,
    /// Restart → the "queues rebuilt" log line's own timestamp.
    pub rebuilt_by_log_seconds: Option<f64>,
    /// The pending count that log line reports.
    pub rebuilt_pending: Option<u64>,
    /// Restart → the operator's /metrics showing every task pending in the queue.
    pub rebuilt_by_metrics_seconds: Option<f64>,
    /// Memory right when the rebuild was seen (peak = the peak of the rebuild).
    pub after_rebuild: Option<Memory>,
    /// Memory after the cluster settled again.
    pub settled: Option<Memory>,
    /// Queue opened to concurrency 1 → the first worker pod seen.
    pub first_dispatch_seconds: Option<f64>,
}

pub async fn run(client: &Client, s: &MemorySettings) -> Result<MemoryReport> {
    let pid = match s.operator_pid {
        Some(pid) => pid,
        None => find_operator(&s.operator_pattern).with_context(|| {
            format!(
                "no process whose command line starts with {:?}: start the operator or pass --operator-pid",
                s.operator_pattern
            )
        })?,
    };
    let suffix = random_suffix();
    let namespace = format!("ax-bench-memory-{suffix}");
    let queue = format!("ax-bench-memory-{suffix}");
    let mut report = MemoryReport {
        tasks: s.tasks,
        namespace: namespace.clone(),
        queue: queue.clone(),
        operator_pid: pid,
        operator_exe: std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.display().to_string()),
        idle: Memory::of(pid),
        ..MemoryReport::default()
    };
    eprintln!(
        "operator pid {pid} ({}), RSS {} MiB",
        report.operator_exe.as_deref().unwrap_or("?"),
        mib(report.idle)
    );
    let result = load_and_restart(client, s, pid, &mut report).await;
    if !s.keep {
        eprintln!("deleting namespace {namespace} and AxQueue {queue}");
        bench::delete_namespace(client, &namespace).await;
        bench::delete_queue(client, &queue).await;
    }
    result.map(|()| report)
}

async fn load_and_restart(
    client: &Client,
    s: &MemorySettings,
    pid: u32,
    report: &mut MemoryReport,
) -> Result<()> {
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &workload::axqueue_resource());
    queues
        .create(
            &PostParams::default(),
            &serde_json::from_value(workload::axqueue(&report.queue, 0))?,
        )
        .await
        .context("creating the AxQueue (are the CRDs installed?)")?;
    bench::create_namespace(client, &report.namespace).await?;

    let tasks: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &report.namespace,
        &workload::axtask_resource(),
    );
    let worker = SimWorker {
        start_ms: 20,
        work_ms: 100,
    };
    let started = Instant::now();
    let step = (s.tasks / 10).max(1);
    let results: Vec<Result<(), String>> = stream::iter(0..s.tasks)
        .map(|i| {
            let tasks = tasks.clone();
            let task = workload::axtask(
                &format!("m-{i:06}"),
                &format!("type-{}", i % s.types.max(1)),
                PRIORITIES[i % PRIORITIES.len()],
                &report.queue,
                &worker,
            );
            async move {
                if i > 0 && i % step == 0 {
                    eprintln!(
                        "  {i} tasks created ({:.0} s)",
                        started.elapsed().as_secs_f64()
                    );
                }
                let task: DynamicObject =
                    serde_json::from_value(task).map_err(|e| e.to_string())?;
                tasks
                    .create(&PostParams::default(), &task)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(s.parallel.max(1))
        .collect()
        .await;
    report.create_seconds = started.elapsed().as_secs_f64();
    report.created = results.iter().filter(|r| r.is_ok()).count();
    report.create_errors = results.len() - report.created;
    report.first_create_error = results.into_iter().find_map(Result::err);
    eprintln!(
        "{} tasks created in {:.1} s ({} errors)",
        report.created, report.create_seconds, report.create_errors
    );

    let created_by = Instant::now();
    let deadline = created_by + s.timeout;
    loop {
        let pending = queue_pending(&queues, &report.queue).await?;
        if pending >= report.created as i64 {
            report.seen_pending_after_seconds = Some(created_by.elapsed().as_secs_f64());
            break;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "the queue shows {pending} of {} pending after {:?}; measuring anyway",
                report.created, s.timeout
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    bench::settle(&s.settle, &s.watched).await;
    report.loaded = Memory::of(pid);
    if let (Some(idle), Some(loaded)) = (report.idle, report.loaded)
        && report.created > 0
    {
        let per_task = (loaded.rss_kib as f64 - idle.rss_kib as f64) / report.created as f64;
        report.kib_per_task = Some(per_task);
        report.mib_per_10k_tasks = Some(per_task * 10_000.0 / 1024.0);
    }
    eprintln!(
        "operator RSS with {} pending: {} MiB (peak {} MiB)",
        report.created,
        mib(report.loaded),
        report.loaded.map_or(0, |m| m.peak_kib / 1024)
    );
    if matches!(s.restart, Restart::Skip) {
        return Ok(());
    }
    report.restart = Some(restart(client, s, pid, report).await?);
    Ok(())
}

async fn restart(
    client: &Client,
    s: &MemorySettings,
    pid: u32,
    report: &MemoryReport,
) -> Result<RestartReport> {
    let log_offset = match &s.operator_log {
        Some(path) => Some(
            std::fs::metadata(path)
                .with_context(|| format!("reading the operator log {}", path.display()))?
                .len(),
        ),
        None => None,
    };
    let mut out = RestartReport::default();
    let wall_at_restart = SystemTime::now();
    let at = Instant::now();
    match &s.restart {
        Restart::Signal(signal) => {
            out.how = format!("signal {signal} to pid {pid}");
            // SAFETY: kill only sends a signal; the pid is the operator's.
            if unsafe { libc::kill(pid as i32, *signal) } != 0 {
                bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
            }
            while is_alive(pid) {
                if at.elapsed() > Duration::from_secs(120) {
                    bail!("the operator (pid {pid}) did not stop within 120 s of signal {signal}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            out.old_gone_seconds = Some(at.elapsed().as_secs_f64());
        }
        Restart::Command(command) => {
            out.how = format!("sh -c {command:?}");
            let mut child = std::process::Command::new("sh")
                .arg("-c")
                .arg(command)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .context("starting the restart command")?;
            // The command may run the new operator in the foreground: never wait on it for long.
            while at.elapsed() < Duration::from_secs(60) {
                match child.try_wait()? {
                    Some(status) if !status.success() => {
                        bail!("the restart command failed: {status}")
                    }
                    Some(_) => break,
                    None => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }
        Restart::Skip => unreachable!("checked by the caller"),
    }
    let deadline = at + s.timeout;
    let new_pid = loop {
        if let Some(new) = find_operator(&s.operator_pattern).filter(|&p| p != pid) {
            break new;
        }
        if Instant::now() >= deadline {
            bail!(
                "no new process starting with {:?} within {:?} of the restart",
                s.operator_pattern,
                s.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    out.new_pid = Some(new_pid);
    out.new_process_seconds = Some(at.elapsed().as_secs_f64());
    eprintln!(
        "new operator pid {new_pid} after {:.2} s; waiting for its queues to be rebuilt",
        at.elapsed().as_secs_f64()
    );

    let expected = report.created as u64;
    let mut offset = log_offset;
    let mut log_pending = String::new();
    let mut metrics_failed = false;
    loop {
        if let (Some(path), Some(from)) = (&s.operator_log, offset) {
            let (text, end) = read_from(path, from)?;
            offset = Some(end);
            log_pending.push_str(&text);
            if let Some(line) = log_pending
                .lines()
                .find(|l| strip_ansi(l).contains(&s.rebuilt_line))
            {
                let line = strip_ansi(line);
                let stamp = line
                    .split_whitespace()
                    .next()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                let restart_stamp = jiff::Timestamp::try_from(wall_at_restart).ok();
                out.rebuilt_by_log_seconds = match (stamp, restart_stamp) {
                    (Some(t), Some(r)) => Some(t.duration_since(r).as_secs_f64()),
                    _ => Some(at.elapsed().as_secs_f64()),
                };
                out.rebuilt_pending = field_value(&line, "pending");
                out.after_rebuild = Memory::of(new_pid);
                offset = None;
            } else if let Some(cut) = log_pending.rfind('\n') {
                log_pending.drain(..=cut);
            }
        }
        if out.rebuilt_by_metrics_seconds.is_none()
            && !metrics_failed
            && let Some(url) = &s.operator_metrics
        {
            match metrics_pending(url, &report.queue).await {
                Ok(Some(n)) if n >= expected => {
                    out.rebuilt_by_metrics_seconds = Some(at.elapsed().as_secs_f64());
                    if out.after_rebuild.is_none() {
                        out.after_rebuild = Memory::of(new_pid);
                    }
                }
                Ok(_) => {}
                // Not up yet, or not there at all: keep trying until the deadline, quietly.
                Err(_) if Instant::now() < deadline => {}
                Err(e) => {
                    eprintln!("reading {url}: {e}");
                    metrics_failed = true;
                }
            }
        }
        let log_done = s.operator_log.is_none() || offset.is_none();
        let metrics_done = s.operator_metrics.is_none()
            || metrics_failed
            || out.rebuilt_by_metrics_seconds.is_some();
        if log_done && metrics_done {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("no rebuild seen within {:?} of the restart", s.timeout);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "rebuilt: by the log line {} s, by /metrics {} s; RSS {} MiB (peak {} MiB)",
        secs(out.rebuilt_by_log_seconds),
        secs(out.rebuilt_by_metrics_seconds),
        mib(out.after_rebuild),
        out.after_rebuild.map_or(0, |m| m.peak_kib / 1024)
    );
    if s.dispatch_check {
        out.first_dispatch_seconds = first_dispatch(client, report).await?;
    }
    bench::settle(&s.settle, &s.watched).await;
    out.settled = Memory::of(new_pid);
    Ok(out)
}

/// Opens the queue to one task at a time and times the first worker pod a watch sees.
async fn first_dispatch(client: &Client, report: &MemoryReport) -> Result<Option<f64>> {
    let pods: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &report.namespace, &workload::pod_resource());
    let mut events = watcher::watcher(pods, watcher::Config::default()).boxed();
    // Listed first, so a pod seen later is one made after the queue opened.
    while let Some(event) = events.try_next().await? {
        if matches!(event, Event::InitDone) {
            break;
        }
    }
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &workload::axqueue_resource());
    let opened = Instant::now();
    queues
        .patch(
            &report.queue,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"concurrency": 1}})),
        )
        .await?;
    let seen = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(event) = events.try_next().await? {
            if let Event::Apply(_) = event {
                return Ok::<_, anyhow::Error>(Some(opened.elapsed().as_secs_f64()));
            }
        }
        Ok(None)
    })
    .await;
    // Hold the rest again so the cleanup does not race a stream of dispatches.
    queues
        .patch(
            &report.queue,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"concurrency": 0}})),
        )
        .await?;
    match seen {
        Ok(result) => result,
        Err(_) => Ok(None),
    }
}

async fn queue_pending(queues: &Api<DynamicObject>, name: &str) -> Result<i64> {
    let queue = queues.get(name).await?;
    let pending = &queue.data["status"]["pending"];
    Ok(PRIORITIES
        .iter()
        .map(|p| pending[p.to_lowercase()].as_i64().unwrap_or(0))
        .sum())
}

/// Reads what `path` holds past `from`, returning it and the new end.
fn read_from(path: &PathBuf, from: u64) -> Result<(String, u64)> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    // A log that was truncated or replaced starts again from its beginning.
    let from = if len < from { 0 } else { from };
    file.seek(std::io::SeekFrom::Start(from))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let end = from + bytes.len() as u64;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), end))
}

/// The sum of `ax_queue_pending{queue="<queue>"}` on the operator's /metrics (plain HTTP).
async fn metrics_pending(url: &str, queue: &str) -> Result<Option<u64>> {
    let text = http_get(url).await?;
    let needle = format!("queue=\"{queue}\"");
    let mut total = None;
    for line in text.lines() {
        if line.starts_with("ax_queue_pending{") && line.contains(&needle) {
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *total.get_or_insert(0) += value as u64;
        }
    }
    Ok(total)
}

/// A bare HTTP/1.0 GET of `http://host:port/path` (the operator's metrics port has no TLS).
async fn http_get(url: &str) -> Result<String> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || http_get_blocking(&url)).await?
}

fn http_get_blocking(url: &str) -> Result<String> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let rest = url
        .strip_prefix("http://")
        .context("only http:// URLs are supported for --operator-metrics")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("no address for {authority}"))?;
    let timeout = Duration::from_secs(5);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body)?;
    let text = String::from_utf8_lossy(&body);
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_owned())
}

/// A log line without its terminal colour codes (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number after `name=` in a tracing log line.
fn field_value(line: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix)?.parse().ok())
}

fn mib(memory: Option<Memory>) -> String {
    memory.map_or("?".into(), |m| format!("{:.0}", m.rss_kib as f64 / 1024.0))
}

fn secs(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The report as a table.
pub fn render(r: &MemoryReport) -> String {
    let m = |memory: Option<Memory>| {
        memory.map_or("-".into(), |m| {
            format!(
                "{:.0} MiB (peak {:.0} MiB)",
                m.rss_kib as f64 / 1024.0,
                m.peak_kib as f64 / 1024.0
            )
        })
    };
    let mut rows = vec![
        vec![
            "operator".to_owned(),
            format!(
                "pid {} {}",
                r.operator_pid,
                r.operator_exe.as_deref().unwrap_or("")
            ),
        ],
        vec![
            "tasks created (errors)".into(),
            format!("{} ({})", r.created, r.create_errors),
        ],
        vec!["created in".into(), format!("{:.1} s", r.create_seconds)],
        vec!["RSS before".into(), m(r.idle)],
        vec![format!("RSS with {} pending", r.created), m(r.loaded)],
        vec![
            "all pending in the queue's status after the last create".into(),
            format!("{} s", secs(r.seen_pending_after_seconds)),
        ],
        vec![
            "per task".into(),
            r.kib_per_task.map_or("-".into(), |k| {
                format!(
                    "{k:.1} KiB ({:.1} MiB per 10k tasks)",
                    r.mib_per_10k_tasks.unwrap_or(0.0)
                )
            }),
        ],
    ];
    if let Some(x) = &r.restart {
        rows.extend([
            vec!["restart".to_owned(), x.how.clone()],
            vec![
                "old process gone".into(),
                format!("{} s", secs(x.old_gone_seconds)),
            ],
            vec![
                "new process seen".into(),
                format!(
                    "{} s (pid {})",
                    secs(x.new_process_seconds),
                    x.new_pid.unwrap_or(0)
                ),
            ],
            vec![
                "rebuilt (log line's timestamp)".into(),
                format!(
                    "{} s (pending={})",
                    secs(x.rebuilt_by_log_seconds),
                    x.rebuilt_pending.map_or("?".into(), |n| n.to_string())
                ),
            ],
            vec![
                "rebuilt (/metrics shows all pending)".into(),
                format!("{} s", secs(x.rebuilt_by_metrics_seconds)),
            ],
            vec!["RSS right after the rebuild".into(), m(x.after_rebuild)],
            vec!["RSS after settling".into(), m(x.settled)],
            vec![
                "queue opened → first worker pod".into(),
                format!("{} s", secs(x.first_dispatch_seconds)),
            ],
        ]);
    }
    crate::report::table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rebuilt_line_is_read_through_colour_codes() {
        let raw = "\u{1b}[2m2026-12-01T11:36:42.259586Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2max::controller::dispatch\u{1b}[0m\u{1b}[2m:\u{1b}[0m queues rebuilt from the cache \u{1b}[3mholding\u{1b}[0m\u{1b}[2m=\u{1b}[0m0 \u{1b}[3mpending\u{1b}[0m\u{1b}[2m=\u{1b}[0m100000";
        let line = strip_ansi(raw);
        assert!(line.contains("queues rebuilt from the cache"));
        assert_eq!(field_value(&line, "pending"), Some(100_000));
        assert_eq!(field_value(&line, "holding"), Some(0));
        let stamp: jiff::Timestamp = line.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(stamp.as_second(), 1_796_125_002);
    }
}
