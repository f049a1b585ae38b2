//! `ax-bench`: bare Pods, one `batch/v1` Job per unit and one AxTask per unit, side by side on the
//! local cluster's simulated nodes, with the same pod template (and, on request, bare Pods shaped
//! like the operator's worker pods); and the operator's memory and rebuild time with a large
//! backlog. Prints figures; fails only on errors, never on timing.
//!
//! Needs a cluster with simulated nodes and a running operator (`make run`, then
//! `eval "$(e2e/cluster.sh env)"`); see README "Benchmarks".

mod apimetrics;
mod audit;
mod bench;
mod chaos;
mod chaos_plan;
mod chaos_record;
mod fanout;
mod memory;
mod procs;
mod report;
mod targets;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kube::Client;
use serde::Serialize;
use serde_json::json;

use bench::{Plan, Settings, Settle};
use procs::PidSource;
use workload::{Kind, SimWorker};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args, Debug)]
struct Common {
    /// Kinds to run, in this order.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "pods,jobs,ax"
    )]
    kinds: Vec<Kind>,
    /// Simulated work per unit (AX_SIM_DURATION_MS of the pod).
    #[arg(long, global = true, default_value_t = 100)]
    work_ms: u64,
    /// Delay between a pod's binding and it running (AX_SIM_START_MS).
    #[arg(long, global = true, default_value_t = 20)]
    start_ms: u64,
    /// Print the figures as JSON on stdout (the tables go to stderr).
    #[arg(long, global = true)]
    json: bool,
    /// The cluster's state directory (pid files in run/).
    #[arg(
        long,
        global = true,
        env = "AX_E2E_DIR",
        default_value = "/var/lib/ax-e2e"
    )]
    cluster_dir: PathBuf,
    /// The operator's pid (default: found by --operator-pattern).
    #[arg(long, global = true)]
    operator_pid: Option<u32>,
    /// Finds the operator: a process whose command line, without the program's directory,
    /// starts with this.
    #[arg(long, global = true, default_value = "ax-operator --identity")]
    operator_pattern: String,
    /// Wait at least this long before each kind.
    #[arg(long, global = true, default_value_t = 3.0)]
    settle_seconds: f64,
    /// Then until the API server uses at most this many cores…
    #[arg(long, global = true, default_value_t = 0.15)]
    idle_cores: f64,
    /// …or this many seconds have passed.
    #[arg(long, global = true, default_value_t = 60.0)]
    settle_max_seconds: f64,
    /// A unit not finished this long after the last create is reported lost.
    #[arg(long, global = true, default_value_t = 600.0)]
    finish_timeout_seconds: f64,
    /// Counted after the last unit finished, for the writes that follow its end.
    #[arg(long, global = true, default_value_t = 2.0)]
    tail_seconds: f64,
    /// Burst and rate: run the kinds this many times, interleaved (pods, jobs, ax, pods, jobs,
    /// ax, …), and judge the targets on the median across rounds: on a small or shared machine
    /// one run's spread is as large as the gaps measured.
    #[arg(
        long,
        global = true,
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    rounds: u32,
    /// Concurrency of the `ax` kind's own AxQueue (and of `worker-pods`' own, for its sample).
    #[arg(long, global = true, default_value_t = 1000)]
    ax_concurrency: u32,
    /// Distinct keys the units of the `ax-keys` kind are spread over (its queue shares its
    /// dispatches fairly between them).
    #[arg(long, global = true, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    keys: u32,
    /// Leave the namespaces (and queues) in place.
    #[arg(long, global = true)]
    keep: bool,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// An HA pair of operators of its own, a mix of tasks, DAGs and an every-minute AxCron, a
    /// seeded schedule of faults, then an audit of every worker pod: exits non-zero on any
    /// overlap, lost task, duplicate pod, infrastructure fault charged to maxRetries, doubled DAG
    /// child or doubled or missed cron firing.
    Chaos {
        #[arg(long, default_value_t = 3000)]
        tasks: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// `all`, or a comma-separated list of fault kinds.
        #[arg(long, default_value = "all", value_parser = parse_faults)]
        faults: FaultList,
        /// How long the faults play (work is created over the first 60 % of it).
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
        /// DAGs of 50 children (default: one per 500 tasks, at least one).
        #[arg(long)]
        dags: Option<usize>,
        /// At most this many tasks on the real kubelet (it runs about one pod a second).
        #[arg(long, default_value_t = 150)]
        real_kubelet_max: usize,
        /// Concurrency of the run's AxQueue.
        #[arg(long, default_value_t = 300)]
        concurrency: u32,
        #[arg(
            long,
            env = "AX_OPERATOR_BIN",
            default_value = "target/debug/ax-operator"
        )]
        operator_bin: PathBuf,
        /// The operator's kubeconfig: the ax-operator ServiceAccount's, so the audit log records
        /// its writes (`e2e/cluster.sh sa-kubeconfig ax-system ax-operator FILE`).
        #[arg(long, env = "AX_OPERATOR_KUBECONFIG")]
        operator_kubeconfig: PathBuf,
        /// The two operators' /metrics listen on 127.0.0.1:PORT and PORT+1.
        #[arg(long, default_value_t = 18180)]
        operator_metrics_port: u16,
        /// Where the operators' logs (chaos-a.log, chaos-b.log) go.
        #[arg(long, default_value = "/tmp/ax-chaos")]
        log_dir: PathBuf,
        #[arg(long, default_value = "e2e/cluster.sh")]
        cluster_script: PathBuf,
        /// Name prefix of the simulated nodes.
        #[arg(long, default_value = "ax-sim")]
        sim_prefix: String,
        /// After the faults, how long every task may take to become terminal.
        #[arg(long, default_value_t = 900.0)]
        drain_seconds: f64,
    },
    /// Create N units of each kind as fast as possible; measure until all have finished.
    Burst {
        #[arg(long, default_value_t = 500)]
        units: usize,
        /// Create calls in flight at once.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
    },
    /// Create units at a steady rate for a while; latency is the point.
    Rate {
        #[arg(long, default_value_t = 10.0)]
        per_second: f64,
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
    },
    /// One AxDag whose task fans out over N items (`forEach.range`, on the simulated nodes),
    /// after a burst of the same N as independent AxTasks: throughput of both, the AxDag's largest
    /// size and the operator's RSS.
    Fanout {
        #[arg(long, default_value_t = 100_000)]
        items: usize,
        /// The fan-out's `forEach.parallelism`.
        #[arg(long, default_value_t = 500)]
        parallelism: u32,
        /// Skip the burst of independent AxTasks.
        #[arg(long)]
        no_compare: bool,
        /// Create calls in flight for the burst of independent AxTasks.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        #[arg(long, default_value_t = 7200.0)]
        timeout_seconds: f64,
    },
    /// N pending AxTasks in a queue of concurrency 0: operator RSS, then a restart and the
    /// rebuild time.
    Memory {
        #[arg(long, default_value_t = 10_000)]
        tasks: usize,
        /// Distinct task types (type-0 … type-N-1); priorities cycle Critical, High, Normal, Low.
        #[arg(long, default_value_t = 8)]
        types: usize,
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        /// The operator's log file: the rebuild is timed to its "queues rebuilt" line.
        #[arg(long)]
        operator_log: Option<PathBuf>,
        /// The line that says the queues are rebuilt.
        #[arg(long, default_value = "queues rebuilt from the cache")]
        rebuilt_line: String,
        /// The operator's metrics (plain HTTP): the rebuild is also timed to its
        /// ax_queue_pending showing every task again.
        #[arg(long, default_value = "http://127.0.0.1:18080/metrics")]
        operator_metrics: String,
        /// Restart by running this shell command (it must stop the operator and start a new one).
        #[arg(long, conflicts_with = "restart_signal")]
        restart_cmd: Option<String>,
        /// Restart by sending this signal to the operator; something else (kubelet, a shell loop)
        /// must start it again.
        #[arg(long, value_parser = ["TERM", "KILL"])]
        restart_signal: Option<String>,
        /// How long the operator may take to show all tasks pending, and to rebuild.
        #[arg(long, default_value_t = 900.0)]
        timeout_seconds: f64,
        /// After the rebuild, open the queue to 1 and time the first worker pod.
        #[arg(long)]
        dispatch_check: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ax-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Clone, Debug)]
struct FaultList(Vec<chaos_plan::FaultKind>);

fn parse_faults(value: &str) -> Result<FaultList, String> {
    use clap::ValueEnum;
    if value == "all" {
        return Ok(FaultList(chaos_plan::FaultKind::ALL.to_vec()));
    }
    value
        .split(',')
        .map(|f| chaos_plan::FaultKind::from_str(f.trim(), false))
        .collect::<Result<Vec<_>, _>>()
        .map(FaultList)
        .map_err(|e| {
            format!(
                "{e}; kinds: all or a list of {}",
                chaos_plan::FaultKind::ALL.map(|k| k.as_str()).join(", ")
            )
        })
}

async fn run(cli: Cli) -> Result<ExitCode> {
    if !matches!(cli.mode, Mode::Burst { .. } | Mode::Rate { .. }) && cli.common.rounds > 1 {
        anyhow::bail!("--rounds is for burst and rate; memory, chaos and fanout run once");
    }
    let client = Client::try_default()
        .await
        .context("no cluster: run `make run`, then `eval \"$(e2e/cluster.sh env)\"`")?;
    let c = &cli.common;
    let operator = match c.operator_pid {
        Some(pid) => PidSource::Fixed(pid),
        None => PidSource::CommandLine(c.operator_pattern.clone()),
    };
    let watched = procs::watched(&c.cluster_dir, operator.clone());
    let settle = Settle {
        min: Duration::from_secs_f64(c.settle_seconds),
        idle_cores: c.idle_cores,
        max: Duration::from_secs_f64(c.settle_max_seconds),
    };
    let context = RunContext::now(&operator);
    let plan = match cli.mode {
        Mode::Chaos {
            tasks,
            seed,
            faults,
            minutes,
            dags,
            real_kubelet_max,
            concurrency,
            operator_bin,
            operator_kubeconfig,
            operator_metrics_port,
            log_dir,
            cluster_script,
            sim_prefix,
            drain_seconds,
        } => {
            let settings = chaos::ChaosSettings {
                tasks,
                seed,
                faults: faults.0,
                minutes,
                dags: dags.unwrap_or((tasks / 500).max(1)),
                real_kubelet_max,
                concurrency,
                operator_bin,
                operator_kubeconfig,
                operator_metrics_port,
                log_dir,
                cluster_dir: c.cluster_dir.clone(),
                cluster_script,
                sim_prefix,
                drain_seconds,
                keep: c.keep,
            };
            // The operators are the soak's own, not whichever one the pattern would find.
            let context = RunContext {
                operator_exe: Some(settings.operator_bin.display().to_string()),
                ..context
            };
            println!("{}", context.render());
            let clean = chaos::run(&client, &settings).await?;
            return Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Mode::Burst { units, parallel } => Plan::Burst { units, parallel },
        Mode::Fanout {
            items,
            parallelism,
            no_compare,
            parallel,
            timeout_seconds,
        } => {
            let worker = SimWorker {
                start_ms: c.start_ms,
                work_ms: c.work_ms,
            };
            println!("{}", context.render());
            let tasks = if no_compare {
                None
            } else {
                let settings = Settings {
                    worker,
                    settle,
                    finish_timeout: Duration::from_secs_f64(c.finish_timeout_seconds),
                    tail: Duration::from_secs_f64(c.tail_seconds),
                    ax_concurrency: c.ax_concurrency,
                    keys: c.keys as usize,
                    watched: watched.clone(),
                    keep: c.keep,
                };
                let plan = Plan::Burst {
                    units: items,
                    parallel,
                };
                let report = bench::run_kind(&client, Kind::Ax, plan, &settings).await?;
                println!(
                    "independent AxTasks: {} units in {:.1} s = {:.1} units/s ({} lost)",
                    report.units, report.busy_seconds, report.throughput_per_second, report.lost
                );
                bench::settle(&settle, &watched).await;
                Some(report.throughput_per_second)
            };
            let settings = fanout::FanoutSettings {
                items,
                parallelism,
                worker,
                operator: operator.clone(),
                timeout: Duration::from_secs_f64(timeout_seconds),
                keep: c.keep,
            };
            let report = fanout::run(&client, &settings).await?;
            let text = fanout::render(&report, tasks);
            if c.json {
                let all = json!({"context": context, "fanout": report, "tasks_per_second": tasks});
                println!("{}", serde_json::to_string_pretty(&all)?);
                eprint!("{text}");
            } else {
                print!("{text}");
            }
            if !c.keep {
                fanout::clean_up(&client, &report.namespace, &report.queue).await;
            }
            return Ok(ExitCode::SUCCESS);
        }
        Mode::Rate {
            per_second,
            seconds,
        } => Plan::Rate {
            per_second,
            seconds,
        },
        Mode::Memory {
            tasks,
            types,
            parallel,
            operator_log,
            rebuilt_line,
            operator_metrics,
            restart_cmd,
            restart_signal,
            timeout_seconds,
            dispatch_check,
        } => {
            let restart = match (restart_cmd, restart_signal.as_deref()) {
                (Some(cmd), _) => memory::Restart::Command(cmd),
                (None, Some("KILL")) => memory::Restart::Signal(libc::SIGKILL),
                (None, Some(_)) => memory::Restart::Signal(libc::SIGTERM),
                (None, None) => memory::Restart::Skip,
            };
            let settings = memory::MemorySettings {
                tasks,
                types,
                parallel,
                operator_pid: c.operator_pid,
                operator_pattern: c.operator_pattern.clone(),
                operator_log,
                rebuilt_line,
                operator_metrics: (!operator_metrics.is_empty()).then_some(operator_metrics),
                restart,
                timeout: Duration::from_secs_f64(timeout_seconds),
                dispatch_check,
                settle,
                watched,
                keep: c.keep,
            };
            let report = memory::run(&client, &settings).await?;
            let text = format!("{}\n{}", context.render(), memory::render(&report));
            if c.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({"context": context, "memory": report}))?
                );
                eprint!("{text}");
            } else {
                print!("{text}");
            }
            return Ok(ExitCode::SUCCESS);
        }
    };

    let settings = Settings {
        worker: SimWorker {
            start_ms: c.start_ms,
            work_ms: c.work_ms,
        },
        settle,
        finish_timeout: Duration::from_secs_f64(c.finish_timeout_seconds),
        tail: Duration::from_secs_f64(c.tail_seconds),
        ax_concurrency: c.ax_concurrency,
        keys: c.keys as usize,
        watched,
        keep: c.keep,
    };
    let (describe, mode) = match plan {
        Plan::Burst { units, parallel } => (
            format!("burst of {units} units ({parallel} creates in flight)"),
            targets::Mode::Burst,
        ),
        Plan::Rate {
            per_second,
            seconds,
        } => (
            format!("{per_second} units/s for {seconds} s"),
            targets::Mode::Rate,
        ),
    };
    let rounds = c.rounds as usize;
    eprintln!(
        "{describe}, {} ms of work each, kinds {:?}{}",
        c.work_ms,
        c.kinds,
        if rounds > 1 {
            format!(", {rounds} rounds")
        } else {
            String::new()
        }
    );
    // Each round is printed when it ends, so a long run interrupted still leaves its figures.
    let show = |text: &str| {
        if c.json {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
    };
    show(&format!(
        "{}\n{describe}, {} ms of simulated work each\n",
        context.render(),
        c.work_ms
    ));
    let mut round_reports: Vec<Vec<report::KindReport>> = Vec::new();
    let mut round_checks = Vec::new();
    let mut failures = Vec::new();
    for round in 1..=rounds {
        if rounds > 1 {
            eprintln!("round {round} of {rounds}");
        }
        let mut reports = Vec::new();
        for &kind in &c.kinds {
            match bench::run_kind(&client, kind, plan, &settings).await {
                Ok(r) => reports.push(r),
                Err(e) => {
                    eprintln!("{}: {e:#}", kind.as_str());
                    failures.push(json!({
                        "round": round,
                        "kind": kind.as_str(),
                        "error": format!("{e:#}"),
                    }));
                }
            }
        }
        let mut text = String::new();
        if rounds > 1 {
            text.push_str(&format!("\nround {round} of {rounds}\n"));
        }
        text.push_str(&format!("\n{}", report::side_by_side(&reports)));
        for r in &reports {
            text.push_str(&format!(
                "\nAPI writes during {} ({} units, namespace {}):\n{}",
                r.kind,
                r.created,
                r.namespace,
                report::writes_breakdown(r)
            ));
            if let Some(e) = &r.first_create_error {
                text.push_str(&format!("first create error: {e}\n"));
            }
        }
        let checks = targets::checks(mode, &c.kinds, &reports);
        if rounds == 1 && !checks.is_empty() {
            text.push_str(&format!(
                "\ntargets (issue 10):\n{}",
                targets::render_checks(&checks)
            ));
        }
        show(&text);
        round_reports.push(reports);
        round_checks.push(checks);
    }
    let summary = targets::summarize(&round_checks);
    if rounds > 1 && !summary.is_empty() {
        show(&format!(
            "\ntargets (issue 10) over {rounds} rounds, judged on the median (the max for counts \
             that must be 0):\n{}",
            targets::render_summary(&summary)
        ));
    }
    if c.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "context": context,
                "mode": describe,
                "workMs": c.work_ms,
                "startMs": c.start_ms,
                // The last round's, for consumers of the single-round output.
                "kinds": round_reports.last(),
                "rounds": round_reports,
                "checks": round_checks,
                "summary": summary,
                "errors": failures,
            }))?
        );
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// When and where the figures were taken.
#[derive(Serialize)]
struct RunContext {
    date: String,
    host: String,
    cpus: usize,
    cpu_model: String,
    operator_exe: Option<String>,
}

impl RunContext {
    fn now(operator: &PidSource) -> RunContext {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        RunContext {
            date: jiff::Timestamp::now()
                .strftime("%Y-%m-%d %H:%M UTC")
                .to_string(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map_or(String::new(), |(_, m)| m.trim().to_owned()),
            operator_exe: operator
                .resolve()
                .and_then(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).ok())
                .map(|p| p.display().to_string()),
        }
    }

    fn render(&self) -> String {
        format!(
            "{} on {} ({} CPUs, {}); operator {}",
            self.date,
            self.host,
            self.cpus,
            self.cpu_model,
            self.operator_exe.as_deref().unwrap_or("not found")
        )
    }
}
