//! What the chaos soak runs and when it breaks things, derived from its seed: the work mix (one
//! AxTask per planned task, DAGs of 50 children, an every-minute AxCron) and the fault schedule.
//! Pure: the same seed gives the same run.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};

use crate::workload::{BENCH_LABEL, BENCH_LABEL_VALUE, SIM_IMAGE, SIM_NODE_KEY};

/// What one task's worker does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Behavior {
    /// Succeeds after this much work (simulated node).
    Works { ms: u64 },
    /// Exits 1 on every attempt: retried, then Dead (simulated node).
    FailsRetryably,
    /// Runs past its hard timeout (simulated node, `AX_SIM_HANG`).
    HangsPastTimeout,
    /// Runs past its hard timeout and ignores SIGTERM (simulated node, `AX_SIM_IGNORE_SIGTERM`):
    /// its pod stays live for the whole grace period of its deletion.
    SimIgnoresSigterm,
    /// Exits with `{"error":"biz"}`: Dead at once (simulated node).
    FailsNonRetryably,
    /// On the real kubelet: a shell that works this long.
    RealWorks { ms: u64 },
    /// On the real kubelet: ignores SIGTERM and sleeps past its hard timeout, so the operator must
    /// wait out the grace period.
    RealIgnoresSigterm,
}

impl Behavior {
    /// The worker fails on its own (or times out): its attempts may count against maxRetries.
    pub fn fails_anyway(self) -> bool {
        !matches!(self, Behavior::Works { .. } | Behavior::RealWorks { .. })
    }

    pub fn on_real_kubelet(self) -> bool {
        matches!(
            self,
            Behavior::RealWorks { .. } | Behavior::RealIgnoresSigterm
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedTask {
    pub name: String,
    pub behavior: Behavior,
}

/// Retries a task gets: a failing one ends Dead after three attempts.
pub const MAX_RETRIES: i32 = 2;
/// Hard timeout of the tasks that hang, and of the real-kubelet ones that ignore SIGTERM.
pub const HANG_HARD_SECONDS: i64 = 20;
/// Grace period of the workers that ignore SIGTERM.
pub const IGNORE_SIGTERM_GRACE_SECONDS: i64 = 10;
/// Children per DAG.
pub const DAG_CHILDREN: usize = 50;

/// `tasks` tasks, by the issue's mix: 10 % failing retryably, 5 % ignoring SIGTERM, 5 % hanging
/// past their hard timeout, 2 % non-retryable, the rest working 100 ms to 20 s; a few of the
/// working ones and the SIGTERM-ignoring ones on the real kubelet, at most `real_kubelet_max` in
/// all, since it runs about one pod a second (beyond it, they run on a simulated node: the working
/// ones as such, the SIGTERM-ignoring ones with the sim's `AX_SIM_IGNORE_SIGTERM`).
pub fn tasks(seed: u64, tasks: usize, real_kubelet_max: usize) -> Vec<PlannedTask> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut on_real = 0;
    (0..tasks)
        .map(|i| {
            let roll = rng.random_range(0..100u32);
            let mut behavior = match roll {
                0..10 => Behavior::FailsRetryably,
                10..15 => Behavior::RealIgnoresSigterm,
                15..20 => Behavior::HangsPastTimeout,
                20..22 => Behavior::FailsNonRetryably,
                22..25 => Behavior::RealWorks {
                    ms: rng.random_range(1_000..10_000),
                },
                _ => Behavior::Works {
                    ms: work_ms(&mut rng),
                },
            };
            if behavior.on_real_kubelet() {
                if on_real < real_kubelet_max {
                    on_real += 1;
                } else {
                    behavior = match behavior {
                        Behavior::RealWorks { ms } => Behavior::Works { ms },
                        _ => Behavior::SimIgnoresSigterm,
                    };
                }
            }
            PlannedTask {
                name: format!("c-{i:05}"),
                behavior,
            }
        })
        .collect()
}

/// 100 ms to 20 s, most of them short: the log of the duration is uniform.
fn work_ms(rng: &mut StdRng) -> u64 {
    let ln = rng.random_range((100f64).ln()..(20_000f64).ln());
    ln.exp() as u64
}

fn sim_spec(env: Vec<Value>) -> Value {
    sim_spec_with_grace(env, 30)
}

fn sim_spec_with_grace(env: Vec<Value>, grace_seconds: i64) -> Value {
    json!({
        "metadata": {"labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace_seconds,
            "nodeSelector": {SIM_NODE_KEY: "true"},
            "tolerations": [{"key": SIM_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "worker",
                "image": SIM_IMAGE,
                "imagePullPolicy": "Never",
                "env": env,
            }],
        },
    })
}

fn env(name: &str, value: impl ToString) -> Value {
    json!({"name": name, "value": value.to_string()})
}

fn real_spec(script: &str, grace_seconds: i64) -> Value {
    json!({
        "metadata": {"labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {
            "automountServiceAccountToken": false,
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": grace_seconds,
            "containers": [{
                "name": "worker",
                "image": SIM_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    })
}

/// The AxTask spec of a behavior, in queue `queue`.
pub fn task_spec(behavior: Behavior, queue: &str) -> Value {
    let start = env("AX_SIM_START_MS", 50);
    let (template, hard_seconds) = match behavior {
        Behavior::Works { ms } => (sim_spec(vec![start, env("AX_SIM_DURATION_MS", ms)]), 120),
        Behavior::FailsRetryably => (
            sim_spec(vec![
                start,
                env("AX_SIM_DURATION_MS", 500),
                env("AX_SIM_EXIT_CODE", 1),
            ]),
            120,
        ),
        Behavior::HangsPastTimeout => (
            sim_spec(vec![start, env("AX_SIM_HANG", "true")]),
            HANG_HARD_SECONDS,
        ),
        Behavior::SimIgnoresSigterm => (
            sim_spec_with_grace(
                vec![
                    start,
                    env("AX_SIM_HANG", "true"),
                    env("AX_SIM_IGNORE_SIGTERM", "true"),
                ],
                IGNORE_SIGTERM_GRACE_SECONDS,
            ),
            HANG_HARD_SECONDS,
        ),
        Behavior::FailsNonRetryably => (
            sim_spec(vec![
                start,
                env("AX_SIM_DURATION_MS", 300),
                env("AX_SIM_EXIT_CODE", 1),
                env("AX_SIM_MESSAGE", r#"{"error":"biz","reason":"chaos"}"#),
            ]),
            120,
        ),
        Behavior::RealWorks { ms } => (real_spec(&format!("sleep {}", ms as f64 / 1000.0), 5), 300),
        Behavior::RealIgnoresSigterm => (
            real_spec("trap '' TERM; sleep 3600", IGNORE_SIGTERM_GRACE_SECONDS),
            HANG_HARD_SECONDS,
        ),
    };
    json!({
        "type": match behavior {
            Behavior::RealWorks { .. } | Behavior::RealIgnoresSigterm => "chaos-real",
            _ => "chaos-sim",
        },
        "priority": "Normal",
        "queue": queue,
        "timeout": {"hardSeconds": hard_seconds},
        "retry": {
            "maxRetries": MAX_RETRIES,
            "backoff": {"baseSeconds": 1, "factor": 2, "maxSeconds": 10, "jitterMillis": 500},
        },
        "template": template,
    })
}

pub fn axtask(name: &str, behavior: Behavior, queue: &str) -> Value {
    json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": task_spec(behavior, queue),
    })
}

/// A DAG of [`DAG_CHILDREN`] short simulated tasks in five waves of ten: each task of a wave
/// depends on one of the wave before.
pub fn axdag(name: &str, seed: u64, queue: &str) -> Value {
    let mut rng = StdRng::seed_from_u64(seed);
    let tasks: Vec<Value> = (0..DAG_CHILDREN)
        .map(|i| {
            let depends_on: Vec<String> = if i >= 10 {
                vec![format!(
                    "t{:02}",
                    (i / 10 - 1) * 10 + rng.random_range(0..10)
                )]
            } else {
                Vec::new()
            };
            json!({
                "name": format!("t{i:02}"),
                "dependsOn": depends_on,
                "spec": task_spec(Behavior::Works { ms: rng.random_range(100..3_000) }, queue),
            })
        })
        .collect();
    json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxDag",
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {"tasks": tasks},
    })
}

/// An AxCron firing every minute, every missed time run (`RunAll`) and every child kept, so each
/// scheduled time must show exactly one child.
pub fn axcron(name: &str, queue: &str) -> Value {
    json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxCron",
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_LABEL_VALUE}},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Allow",
            "misfirePolicy": "RunAll",
            "maxCatchUp": 100,
            "successfulRunsHistoryLimit": 1000,
            "failedRunsHistoryLimit": 1000,
            "task": task_spec(Behavior::Works { ms: 1_000 }, queue),
        },
    })
}

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL the leading operator every 10–30 s, then start it again.
    OperatorKill,
    /// SIGSTOP kube-apiserver for 5 s.
    ApiserverStopShort,
    /// SIGSTOP kube-apiserver for 25 s (past the operator's lease).
    ApiserverStopLong,
    /// Stop the real kubelet for 60 s.
    KubeletStop,
    /// Stop a simulated node's heartbeats for 90 s.
    SimNodeSilent,
    /// Delete a simulated Node object with running workers; it comes back after 90 s.
    NodeDelete,
    /// Evict running workers through the Eviction API.
    Evict,
    /// Force-delete running workers (grace 0).
    ForceDelete,
    /// SIGSTOP etcd for 5 s.
    EtcdStop,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::OperatorKill,
        FaultKind::ApiserverStopShort,
        FaultKind::ApiserverStopLong,
        FaultKind::KubeletStop,
        FaultKind::SimNodeSilent,
        FaultKind::NodeDelete,
        FaultKind::Evict,
        FaultKind::ForceDelete,
        FaultKind::EtcdStop,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::OperatorKill => "operator-kill",
            FaultKind::ApiserverStopShort => "apiserver-stop-short",
            FaultKind::ApiserverStopLong => "apiserver-stop-long",
            FaultKind::KubeletStop => "kubelet-stop",
            FaultKind::SimNodeSilent => "sim-node-silent",
            FaultKind::NodeDelete => "node-delete",
            FaultKind::Evict => "evict",
            FaultKind::ForceDelete => "force-delete",
            FaultKind::EtcdStop => "etcd-stop",
        }
    }

    /// How long the fault holds (0: a single act).
    pub fn holds(self) -> Duration {
        Duration::from_secs(match self {
            FaultKind::ApiserverStopShort | FaultKind::EtcdStop => 5,
            FaultKind::ApiserverStopLong => 25,
            FaultKind::KubeletStop => 60,
            // A deleted node stays away long enough for pod GC to collect its pods.
            FaultKind::SimNodeSilent | FaultKind::NodeDelete => 90,
            _ => 0,
        })
    }

    /// One occurrence in every this long of the run (at least one each run).
    fn every(self) -> Duration {
        Duration::from_secs(match self {
            FaultKind::OperatorKill => 20,
            FaultKind::Evict | FaultKind::ForceDelete => 40,
            FaultKind::EtcdStop | FaultKind::ApiserverStopShort => 150,
            FaultKind::NodeDelete => 240,
            FaultKind::ApiserverStopLong | FaultKind::KubeletStop | FaultKind::SimNodeSilent => 300,
        })
    }
}

/// One fault at `at` after the start of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ScheduledFault {
    pub at: Duration,
    pub kind: FaultKind,
}

/// The faults of a run of `length`, by time: the operator killed every 10–30 s; every other kind
/// at seeded random times, as often as [`FaultKind::every`] says and at least once, each one over
/// before the run's last 30 s so the cluster is whole when the drain starts.
pub fn schedule(seed: u64, kinds: &[FaultKind], length: Duration) -> Vec<ScheduledFault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let mut faults = Vec::new();
    let first = Duration::from_secs(10);
    let tail = Duration::from_secs(30);
    for &kind in kinds {
        if kind == FaultKind::OperatorKill {
            let mut at = first;
            while at + tail <= length {
                faults.push(ScheduledFault { at, kind });
                at += Duration::from_secs(rng.random_range(10..=30));
            }
            continue;
        }
        let latest = length.saturating_sub(tail + kind.holds());
        if latest <= first {
            continue;
        }
        let count = (length.as_secs() / kind.every().as_secs()).max(1);
        for _ in 0..count {
            let secs = rng.random_range(first.as_secs()..=latest.as_secs());
            faults.push(ScheduledFault {
                at: Duration::from_secs(secs),
                kind,
            });
        }
    }
    faults.sort_by_key(|f| (f.at, f.kind));
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_follows_the_issue_and_the_seed() {
        let plan = tasks(7, 10_000, 300);
        assert_eq!(plan, tasks(7, 10_000, 300));
        assert_ne!(plan, tasks(8, 10_000, 300));
        let share = |f: fn(&Behavior) -> bool| {
            plan.iter().filter(|t| f(&t.behavior)).count() as f64 / plan.len() as f64
        };
        let retryable = share(|b| *b == Behavior::FailsRetryably);
        assert!((0.08..0.12).contains(&retryable), "{retryable}");
        let biz = share(|b| *b == Behavior::FailsNonRetryably);
        assert!((0.01..0.03).contains(&biz), "{biz}");
        let real = plan.iter().filter(|t| t.behavior.on_real_kubelet()).count();
        assert_eq!(real, 300);
        // Beyond the real kubelet's share, SIGTERM is ignored on the simulated nodes.
        let ignoring = share(|b| {
            matches!(
                b,
                Behavior::RealIgnoresSigterm | Behavior::SimIgnoresSigterm
            )
        });
        assert!((0.04..0.06).contains(&ignoring), "{ignoring}");
        for t in &plan {
            if let Behavior::Works { ms } = t.behavior {
                assert!((100..=20_000).contains(&ms), "{ms}");
            }
        }
    }

    #[test]
    fn every_behavior_makes_a_task_with_a_template() {
        for behavior in [
            Behavior::Works { ms: 100 },
            Behavior::FailsRetryably,
            Behavior::HangsPastTimeout,
            Behavior::SimIgnoresSigterm,
            Behavior::FailsNonRetryably,
            Behavior::RealWorks { ms: 1500 },
            Behavior::RealIgnoresSigterm,
        ] {
            let task = axtask("t", behavior, "q");
            assert_eq!(task["spec"]["queue"], "q");
            let spec = &task["spec"]["template"]["spec"];
            assert_eq!(spec["containers"][0]["name"], "worker");
            let on_sim = spec["nodeSelector"][SIM_NODE_KEY] == "true";
            assert_eq!(on_sim, !behavior.on_real_kubelet(), "{behavior:?}");
        }
        let ignoring = axtask("t", Behavior::SimIgnoresSigterm, "q");
        let spec = &ignoring["spec"]["template"]["spec"];
        assert_eq!(
            spec["terminationGracePeriodSeconds"],
            IGNORE_SIGTERM_GRACE_SECONDS
        );
        let env = spec["containers"][0]["env"].as_array().unwrap();
        assert!(
            env.iter()
                .any(|e| e["name"] == "AX_SIM_IGNORE_SIGTERM" && e["value"] == "true")
        );
        assert_eq!(
            ignoring["spec"]["timeout"]["hardSeconds"],
            HANG_HARD_SECONDS
        );
        let real = axtask("t", Behavior::RealWorks { ms: 1500 }, "q");
        assert_eq!(
            real["spec"]["template"]["spec"]["containers"][0]["command"][2],
            "sleep 1.5"
        );
    }

    #[test]
    fn a_dag_has_fifty_children_each_depending_on_an_earlier_one() {
        let dag = axdag("d", 1, "q");
        let tasks = dag["spec"]["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), DAG_CHILDREN);
        for (i, t) in tasks.iter().enumerate() {
            let deps = t["dependsOn"].as_array().unwrap();
            if i < 10 {
                assert!(deps.is_empty());
            } else {
                let dep: usize = deps[0].as_str().unwrap()[1..].parse().unwrap();
                assert!(dep < i);
            }
        }
    }

    #[test]
    fn the_schedule_is_the_seeds_and_ends_before_the_tail() {
        let length = Duration::from_secs(600);
        let all = schedule(3, &FaultKind::ALL, length);
        assert_eq!(all, schedule(3, &FaultKind::ALL, length));
        for kind in FaultKind::ALL {
            assert!(all.iter().any(|f| f.kind == kind), "{kind:?} missing");
        }
        for f in &all {
            assert!(f.at >= Duration::from_secs(10));
            assert!(
                f.at + f.kind.holds() + Duration::from_secs(30) <= length,
                "{f:?}"
            );
        }
        let kills: Vec<u64> = all
            .iter()
            .filter(|f| f.kind == FaultKind::OperatorKill)
            .map(|f| f.at.as_secs())
            .collect();
        for pair in kills.windows(2) {
            assert!((10..=30).contains(&(pair[1] - pair[0])), "{pair:?}");
        }
        let only = schedule(3, &[FaultKind::Evict], length);
        assert!(only.iter().all(|f| f.kind == FaultKind::Evict));
        assert!(schedule(3, &FaultKind::ALL, Duration::from_secs(20)).is_empty());
    }
}
