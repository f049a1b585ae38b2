//! Figures and how they are printed: percentiles, the side-by-side table, the per-kind write
//! breakdown. Pure: reports in, text out.

use serde::Serialize;

use crate::workload::Kind;

/// Nearest-rank percentiles of a sample, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub n: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Percentiles {
    pub fn of(mut values: Vec<f64>) -> Percentiles {
        values.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            if values.is_empty() {
                return None;
            }
            // Nearest rank: the smallest value with at least p% of the sample at or below it.
            let index = ((p / 100.0) * values.len() as f64).ceil() as usize;
            Some(values[index.clamp(1, values.len()) - 1])
        };
        Percentiles {
            n: values.len(),
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
            max: values.last().copied(),
        }
    }
}

/// Writes of one resource, verb and status code during a kind's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WriteRow {
    pub resource: String,
    pub verb: String,
    pub code: String,
    pub count: u64,
    pub per_unit: f64,
}

/// CPU one process used during a kind's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuRow {
    pub process: String,
    /// `None`: the process was not found, or restarted during the run.
    pub seconds: Option<f64>,
    pub ms_per_unit: Option<f64>,
}

/// Everything measured for one kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KindReport {
    pub kind: String,
    pub namespace: String,
    pub units: usize,
    pub created: usize,
    pub create_errors: usize,
    pub first_create_error: Option<String>,
    pub finished: usize,
    pub succeeded: usize,
    pub failed: usize,
    /// Created but not finished within the deadline.
    pub lost: usize,
    /// Units for which the pod watch saw more than one pod.
    pub units_with_several_pods: usize,
    /// First create sent → last unit seen finished.
    pub busy_seconds: f64,
    pub throughput_per_second: f64,
    /// Create sent → the unit's first pod seen by a watch on pods.
    pub pod_seen_ms: Percentiles,
    /// Create sent → the unit's own object seen finished.
    pub finished_ms: Percentiles,
    /// Mutating requests by resource, verb and code, per created unit (background left out).
    pub writes: Vec<WriteRow>,
    /// Node heartbeats and leader-election leases, which come with time rather than with units.
    pub background_writes: Vec<WriteRow>,
    /// Successful writes per unit (background left out).
    pub writes_per_unit: f64,
    /// 409 answers per unit (update conflicts and AlreadyExists creates).
    pub conflicts_per_unit: f64,
    /// Other error answers per unit.
    pub other_errors_per_unit: f64,
    pub cpu: Vec<CpuRow>,
    /// The API server's CPU rate (cores) when the run started.
    pub apiserver_idle_cores: Option<f64>,
    /// Share of all the host's CPU time (every CPU) in the window spent busy, steal left out.
    pub host_busy_percent: Option<f64>,
    /// Share the hypervisor gave to other guests while this one had work (steal): a run with
    /// steal had less CPU than the others, whatever it measured.
    pub host_steal_percent: Option<f64>,
    /// Seconds from the first create to the second scrape (the CPU window).
    pub window_seconds: f64,
}

impl KindReport {
    /// The CPU ms per created unit of the process labelled `process`.
    pub fn cpu_ms(&self, process: &str) -> Option<f64> {
        self.cpu.iter().find(|c| c.process == process)?.ms_per_unit
    }
}

/// A plain text table, columns padded to their widest cell, the first left-aligned.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = width[c] - cell.chars().count();
            if c == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `value` with `decimals` decimals, or "-" when there is none.
pub fn number(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

/// The side-by-side table: one column per kind, one row per measure.
pub fn side_by_side(reports: &[KindReport]) -> String {
    let mut rows = vec![
        std::iter::once("measure".to_owned())
            .chain(reports.iter().map(|r| r.kind.clone()))
            .collect::<Vec<_>>(),
    ];
    let mut row = |name: &str, cell: &dyn Fn(&KindReport) -> String| {
        rows.push(
            std::iter::once(name.to_owned())
                .chain(reports.iter().map(cell))
                .collect(),
        );
    };
    let floor = reports.iter().find(|r| r.kind == Kind::Pods.as_str());
    // The worker contract's floor: bare pods shaped like the operator's worker pods.
    let worker_floor = reports.iter().find(|r| r.kind == Kind::WorkerPods.as_str());
    row("units created / finished", &|r| {
        format!("{} / {}", r.created, r.finished)
    });
    row("succeeded / failed / lost", &|r| {
        format!("{} / {} / {}", r.succeeded, r.failed, r.lost)
    });
    row("create errors", &|r| r.create_errors.to_string());
    row("units with more than one pod", &|r| {
        r.units_with_several_pods.to_string()
    });
    row("busy s (first create → last finish)", &|r| {
        number(Some(r.busy_seconds), 1)
    });
    row("throughput units/s", &|r| {
        number(Some(r.throughput_per_second), 1)
    });
    for (name, floor) in [
        ("throughput / bare pods'", floor),
        ("throughput / worker-pods'", worker_floor),
    ] {
        if let Some(floor) = floor {
            row(name, &|r| {
                number(
                    Some(r.throughput_per_second / floor.throughput_per_second),
                    2,
                )
            });
        }
    }
    let latency = |p: &Percentiles| {
        format!(
            "{} / {} / {}",
            number(p.p50, 0),
            number(p.p90, 0),
            number(p.p99, 0)
        )
    };
    row("create → pod seen ms p50/p90/p99", &|r| {
        latency(&r.pod_seen_ms)
    });
    row("create → pod seen ms max", &|r| {
        number(r.pod_seen_ms.max, 0)
    });
    row("create → finished ms p50/p90/p99", &|r| {
        latency(&r.finished_ms)
    });
    row("API writes/unit (2xx)", &|r| {
        number(Some(r.writes_per_unit), 2)
    });
    row("API 409s/unit", &|r| number(Some(r.conflicts_per_unit), 2));
    row("API other errors/unit", &|r| {
        number(Some(r.other_errors_per_unit), 2)
    });
    row("API server CPU ms/unit", &|r| {
        number(r.cpu_ms("kube-apiserver"), 1)
    });
    for (name, floor) in [
        ("API server CPU / bare pod's", floor),
        ("API server CPU / worker-pods'", worker_floor),
    ] {
        if let Some(floor) = floor {
            row(name, &|r| {
                number(
                    r.cpu_ms("kube-apiserver")
                        .zip(floor.cpu_ms("kube-apiserver"))
                        .map(|(a, b)| a / b),
                    2,
                )
            });
        }
    }
    row("etcd CPU ms/unit", &|r| number(r.cpu_ms("etcd"), 1));
    row("controller-manager CPU ms/unit (Job ctrl)", &|r| {
        number(r.cpu_ms("kube-controller-manager"), 1)
    });
    row("scheduler CPU ms/unit", &|r| {
        number(r.cpu_ms("kube-scheduler"), 1)
    });
    row("ax-operator CPU ms/unit", &|r| {
        number(r.cpu_ms("ax-operator"), 1)
    });
    row("ax-sim CPU ms/unit", &|r| number(r.cpu_ms("ax-sim"), 1));
    row("host CPU busy / steal %", &|r| {
        format!(
            "{} / {}",
            number(r.host_busy_percent, 0),
            number(r.host_steal_percent, 0)
        )
    });
    row("API server idle cores before", &|r| {
        number(r.apiserver_idle_cores, 3)
    });
    table(&rows)
}

/// One kind's writes, by resource, verb and code, with per-unit counts.
pub fn writes_breakdown(report: &KindReport) -> String {
    let mut rows = vec![vec![
        "resource".to_owned(),
        "verb".to_owned(),
        "code".to_owned(),
        "count".to_owned(),
        "per unit".to_owned(),
    ]];
    for w in &report.writes {
        rows.push(vec![
            w.resource.clone(),
            w.verb.clone(),
            w.code.clone(),
            w.count.to_string(),
            format!("{:.2}", w.per_unit),
        ]);
    }
    for w in &report.background_writes {
        rows.push(vec![
            format!("({} background)", w.resource),
            w.verb.clone(),
            w.code.clone(),
            w.count.to_string(),
            "-".into(),
        ]);
    }
    table(&rows)
}

/// A report to start tests from: `units` created, finished and succeeded in 10 s, nothing else
/// measured.
#[cfg(test)]
impl KindReport {
    pub fn for_test(kind: &str, units: usize) -> KindReport {
        KindReport {
            kind: kind.to_owned(),
            namespace: format!("ax-bench-{kind}-test"),
            units,
            created: units,
            create_errors: 0,
            first_create_error: None,
            finished: units,
            succeeded: units,
            failed: 0,
            lost: 0,
            units_with_several_pods: 0,
            busy_seconds: 10.0,
            throughput_per_second: units as f64 / 10.0,
            pod_seen_ms: Percentiles::default(),
            finished_ms: Percentiles::default(),
            writes: Vec::new(),
            background_writes: Vec::new(),
            writes_per_unit: 0.0,
            conflicts_per_unit: 0.0,
            other_errors_per_unit: 0.0,
            cpu: Vec::new(),
            apiserver_idle_cores: None,
            host_busy_percent: None,
            host_steal_percent: None,
            window_seconds: 12.0,
        }
    }

    /// With the API server's CPU at `ms_per_unit`.
    pub fn with_apiserver_ms(mut self, ms_per_unit: f64) -> KindReport {
        self.cpu.push(CpuRow {
            process: "kube-apiserver".into(),
            seconds: Some(ms_per_unit * self.created as f64 / 1000.0),
            ms_per_unit: Some(ms_per_unit),
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(p.n, 100);
        assert_eq!(p.p50, Some(50.0));
        assert_eq!(p.p90, Some(90.0));
        assert_eq!(p.p99, Some(99.0));
        assert_eq!(p.max, Some(100.0));
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.p99), (Some(7.0), Some(7.0)));
        assert_eq!(Percentiles::of(vec![]).p50, None);
    }

    #[test]
    fn tables_pad_columns_to_their_widest_cell() {
        let t = table(&[
            vec!["a".into(), "1".into()],
            vec!["longer".into(), "22".into()],
        ]);
        assert_eq!(t, "a        1\nlonger  22\n");
    }

    #[test]
    fn the_host_row_shows_busy_and_steal() {
        let mut pods = KindReport::for_test("pods", 10);
        pods.host_busy_percent = Some(96.6);
        pods.host_steal_percent = Some(3.2);
        let ax = KindReport::for_test("ax", 10);
        let table = side_by_side(&[pods, ax]);
        let line = table
            .lines()
            .find(|l| l.starts_with("host CPU busy / steal %"))
            .unwrap();
        let cells: Vec<&str> = line.split("  ").filter(|c| !c.trim().is_empty()).collect();
        assert_eq!(
            cells.iter().map(|c| c.trim()).collect::<Vec<_>>(),
            ["host CPU busy / steal %", "97 / 3", "- / -"]
        );
    }

    /// The cells of the table's row `name`, first column left out.
    fn cells(table: &str, name: &str) -> Option<Vec<String>> {
        let line = table.lines().find(|l| l.starts_with(name))?;
        let rest = &line[name.len()..];
        Some(rest.split_whitespace().map(str::to_owned).collect())
    }

    #[test]
    fn ratios_to_the_worker_pods_floor_follow_those_to_bare_pods() {
        let pods = KindReport::for_test("pods", 100).with_apiserver_ms(10.0);
        let worker_pods = KindReport::for_test("worker-pods", 80).with_apiserver_ms(15.0);
        let ax = KindReport::for_test("ax", 40).with_apiserver_ms(30.0);
        let table = side_by_side(&[pods.clone(), worker_pods, ax.clone()]);
        assert_eq!(
            cells(&table, "throughput / bare pods'").unwrap(),
            ["1.00", "0.80", "0.40"]
        );
        assert_eq!(
            cells(&table, "throughput / worker-pods'").unwrap(),
            ["1.25", "1.00", "0.50"]
        );
        assert_eq!(
            cells(&table, "API server CPU / bare pod's").unwrap(),
            ["1.00", "1.50", "3.00"]
        );
        assert_eq!(
            cells(&table, "API server CPU / worker-pods'").unwrap(),
            ["0.67", "1.00", "2.00"]
        );
        let rows: Vec<&str> = table
            .lines()
            .map(|l| l.split("  ").next().unwrap())
            .collect();
        let at = |name: &str| rows.iter().position(|r| *r == name).unwrap();
        assert_eq!(
            at("throughput / worker-pods'"),
            at("throughput / bare pods'") + 1
        );
        assert_eq!(
            at("API server CPU / worker-pods'"),
            at("API server CPU / bare pod's") + 1
        );

        let without = side_by_side(&[pods, ax]);
        assert_eq!(cells(&without, "throughput / worker-pods'"), None);
        assert_eq!(cells(&without, "API server CPU / worker-pods'"), None);
    }
}
