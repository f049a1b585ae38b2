//! The processes whose cost the benchmark reports, read from /proc: CPU time (utime + stime) and
//! resident memory. The cluster's components are found by their pid files
//! (`$AX_E2E_DIR/run/<name>.pid`), the operator by its command line. Also the host's CPU as a
//! whole (/proc/stat), to tell a slow run from a run the hypervisor took CPU away from.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Clock ticks per second, the unit of utime/stime in /proc/<pid>/stat.
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a constant of the running system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// CPU seconds the process has used (user + system), or `None` when it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|ticks| ticks as f64 / clock_ticks_per_second())
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line. The command name (field 2) is in
/// parentheses and may hold spaces or parentheses, so fields are counted after the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // after_name starts at field 3 (state): utime is the 12th field from here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory now and at its peak, in KiB (VmRSS, VmHWM of /proc/<pid>/status).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Memory {
    pub rss_kib: u64,
    pub peak_kib: u64,
}

impl Memory {
    pub fn of(pid: u32) -> Option<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        parse_memory(&status)
    }
}

fn parse_memory(status: &str) -> Option<Memory> {
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix(':')?;
            value.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    Some(Memory {
        rss_kib: field("VmRSS")?,
        peak_kib: field("VmHWM").unwrap_or(0),
    })
}

/// Pids of the processes whose command line, with the program's directory left out, starts with
/// `pattern` (`ax-operator --identity` matches `/x/target/debug/ax-operator --identity e2e`, not
/// `bash -c '… ax-operator --identity …'` nor `cargo run --bin ax-operator`). This process and its
/// ancestors are left out.
pub fn matching_command_line(pattern: &str) -> Vec<u32> {
    let mut excluded = Vec::new();
    let mut pid = std::process::id();
    while pid > 1 {
        excluded.push(pid);
        match parent_of(pid) {
            Some(parent) => pid = parent,
            None => break,
        }
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !excluded.contains(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|raw| command_line_starts_with(&raw, pattern))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The one operator process matching `pattern` (the newest if there are several).
pub fn find_operator(pattern: &str) -> Option<u32> {
    matching_command_line(pattern).last().copied()
}

/// Whether a raw /proc/<pid>/cmdline (NUL-separated) starts with `pattern` once the program's
/// directory is dropped and the arguments are joined by spaces.
fn command_line_starts_with(raw: &[u8], pattern: &str) -> bool {
    let text = String::from_utf8_lossy(raw);
    let mut args = text.split('\0').filter(|a| !a.is_empty());
    let Some(program) = args.next() else {
        return false;
    };
    let program = program.rsplit('/').next().unwrap_or(program);
    let line = std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ");
    line.starts_with(pattern)
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub fn is_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Where a watched process's pid comes from.
#[derive(Clone, Debug)]
pub enum PidSource {
    File(PathBuf),
    Fixed(u32),
    CommandLine(String),
}

impl PidSource {
    pub fn resolve(&self) -> Option<u32> {
        match self {
            PidSource::File(path) => std::fs::read_to_string(path).ok()?.trim().parse().ok(),
            PidSource::Fixed(pid) => Some(*pid),
            PidSource::CommandLine(pattern) => find_operator(pattern),
        }
    }
}

/// A process whose CPU the benchmark reports, under a label that says what it is.
#[derive(Clone, Debug)]
pub struct Watched {
    pub label: &'static str,
    pub source: PidSource,
}

/// The cluster's components and the operator, as the benchmark reports them.
pub fn watched(cluster_dir: &Path, operator: PidSource) -> Vec<Watched> {
    let file = |name: &str| PidSource::File(cluster_dir.join("run").join(format!("{name}.pid")));
    vec![
        Watched {
            label: "kube-apiserver",
            source: file("kube-apiserver"),
        },
        Watched {
            label: "etcd",
            source: file("etcd"),
        },
        Watched {
            label: "kube-controller-manager",
            source: file("kube-controller-manager"),
        },
        Watched {
            label: "kube-scheduler",
            source: file("kube-scheduler"),
        },
        Watched {
            label: "ax-sim",
            source: file("ax-sim"),
        },
        Watched {
            label: "ax-operator",
            source: operator,
        },
    ]
}

/// CPU seconds of each watched process at one moment (`None`: not found).
#[derive(Clone, Debug)]
pub struct CpuSnapshot(Vec<(&'static str, Option<(u32, f64)>)>);

impl CpuSnapshot {
    pub fn take(watched: &[Watched]) -> CpuSnapshot {
        CpuSnapshot(
            watched
                .iter()
                .map(|w| {
                    let sample = w
                        .source
                        .resolve()
                        .and_then(|pid| Some((pid, cpu_seconds(pid)?)));
                    (w.label, sample)
                })
                .collect(),
        )
    }

    /// CPU seconds each process used since `earlier`; `None` for a process that was missing or
    /// restarted in between (its count started again).
    pub fn since(&self, earlier: &CpuSnapshot) -> Vec<(&'static str, Option<f64>)> {
        self.0
            .iter()
            .map(|(label, now)| {
                let before = earlier.0.iter().find(|(l, _)| l == label).and_then(|x| x.1);
                let used = match (before, now) {
                    (Some((pid_a, a)), Some((pid_b, b))) if pid_a == *pid_b => Some(b - a),
                    _ => None,
                };
                (*label, used)
            })
            .collect()
    }
}

/// Host-wide CPU time since boot, summed over all CPUs, in clock ticks, from the aggregate `cpu`
/// line of /proc/stat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCpu {
    /// user + nice + system + irq + softirq (guest time is already inside user and nice).
    pub busy: u64,
    /// idle + iowait: a CPU waiting on I/O could have run something else.
    pub idle: u64,
    /// Time this VM had work for a CPU and the hypervisor ran someone else instead.
    pub steal: u64,
}

/// How the host's CPU time in a window was spent, in percent of all of it (all CPUs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostCpuShare {
    pub busy_percent: f64,
    pub steal_percent: f64,
}

impl HostCpu {
    /// Now, or `None` when /proc/stat cannot be read.
    pub fn take() -> Option<HostCpu> {
        parse_host_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Busy and steal shares of the host's CPU time between `earlier` and this snapshot; `None`
    /// when no time passed or a counter went backwards.
    pub fn since(&self, earlier: &HostCpu) -> Option<HostCpuShare> {
        let busy = self.busy.checked_sub(earlier.busy)?;
        let idle = self.idle.checked_sub(earlier.idle)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        let total = busy + idle + steal;
        if total == 0 {
            return None;
        }
        let percent = |ticks: u64| ticks as f64 * 100.0 / total as f64;
        Some(HostCpuShare {
            busy_percent: percent(busy),
            steal_percent: percent(steal),
        })
    }
}

/// The aggregate `cpu` line of /proc/stat: `cpu user nice system idle iowait irq softirq steal
/// guest guest_nice`. Fields after idle are missing on old kernels and count as 0.
fn parse_host_cpu(stat: &str) -> Option<HostCpu> {
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if fields.len() < 4 {
        return None;
    }
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    let (user, nice, system, idle) = (field(0), field(1), field(2), field(3));
    let (iowait, irq, softirq, steal) = (field(4), field(5), field(6), field(7));
    Some(HostCpu {
        busy: user + nice + system + irq + softirq,
        idle: idle + iowait,
        steal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat =
            "633 (kube (api) server) S 1 633 633 0 -1 4194560 1 0 0 0 1500 250 0 0 20 0 1 0 1 2 3";
        assert_eq!(parse_cpu_ticks(stat), Some(1750));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn memory_reads_rss_and_peak() {
        let status = "Name:\tax-operator\nVmHWM:\t  450000 kB\nVmRSS:\t  52000 kB\n";
        assert_eq!(
            parse_memory(status),
            Some(Memory {
                rss_kib: 52000,
                peak_kib: 450000
            })
        );
        assert_eq!(parse_memory("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_is_readable_and_never_found_by_its_own_command_line() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(Memory::of(me).is_some_and(|m| m.rss_kib > 0));
        assert!(parent_of(me).is_some());
        let my_name = std::env::args().next().unwrap();
        let my_name = my_name.rsplit('/').next().unwrap();
        assert!(!matching_command_line(my_name).contains(&me));
    }

    #[test]
    fn the_pattern_is_a_prefix_of_the_command_line_without_the_programs_directory() {
        let raw = b"/work/main/target/debug/ax-operator\0--identity\0e2e\0";
        assert!(command_line_starts_with(raw, "ax-operator --identity"));
        assert!(command_line_starts_with(raw, "ax-operator"));
        assert!(!command_line_starts_with(raw, "--identity"));
        let wrapper = b"bash\0-c\0while :; do ax-operator --identity e2e; done\0";
        assert!(!command_line_starts_with(wrapper, "ax-operator --identity"));
        assert!(!command_line_starts_with(
            b"cargo\0run\0--bin\0ax-operator\0",
            "ax-operator"
        ));
        assert!(!command_line_starts_with(b"", "ax-operator"));
    }

    #[test]
    fn host_cpu_reads_the_aggregate_line_only() {
        let stat = "cpu  868361 590 151765 717367 5573 0 12794 54779 0 0\n\
                    cpu0 431190 238 75870 364990 2718 0 4729 26894 0 0\n\
                    intr 1 2 3\n";
        assert_eq!(
            parse_host_cpu(stat),
            Some(HostCpu {
                busy: 868361 + 590 + 151765 + 12794,
                idle: 717367 + 5573,
                steal: 54779,
            })
        );
        // An old kernel's line without iowait, irq, softirq, steal.
        assert_eq!(
            parse_host_cpu("cpu 10 0 5 85\n"),
            Some(HostCpu {
                busy: 15,
                idle: 85,
                steal: 0
            })
        );
        assert_eq!(parse_host_cpu("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_host_cpu("cpu 1 2 x 4\n"), None);
        assert_eq!(parse_host_cpu("cpu 1 2 3\n"), None);
        assert!(HostCpu::take().is_some());
    }

    #[test]
    fn host_cpu_shares_are_of_all_time_in_the_window_steal_apart_from_busy() {
        let before = HostCpu {
            busy: 1000,
            idle: 5000,
            steal: 100,
        };
        // 200 ticks on 2 CPUs: 164 busy, 6 idle, 30 stolen.
        let after = HostCpu {
            busy: 1164,
            idle: 5006,
            steal: 130,
        };
        let share = after.since(&before).unwrap();
        assert!((share.busy_percent - 82.0).abs() < 1e-9);
        assert!((share.steal_percent - 15.0).abs() < 1e-9);
        assert_eq!(before.since(&before), None);
        assert_eq!(before.since(&after), None);
    }
}
