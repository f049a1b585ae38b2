//! The standard process metrics (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
//! `process_open_fds`, `process_start_time_seconds`), read from Linux's /proc on every scrape.
//! prometheus-client 0.26 has no process collector of its own. Elsewhere than Linux, or where a
//! file cannot be read, the metric it feeds is left out of the scrape rather than reported wrong.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of the times in /proc/<pid>/stat: USER_HZ, fixed at 100 by the kernel's
/// ABI on the architectures the operator ships for (amd64, arm64), whatever the kernel's own HZ.
const TICKS_PER_SECOND: f64 = 100.0;

/// Fields of /proc/self/stat the metrics need, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatTimes {
    /// utime + stime: CPU time in user and kernel mode.
    pub cpu_ticks: u64,
    /// When the process started, after boot.
    pub start_ticks: u64,
}

/// Parses /proc/<pid>/stat. The command name (field 2) is in parentheses and may hold spaces and
/// parentheses itself, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<StatTimes> {
    let after_name = &text[text.rfind(')')? + 1..];
    // Fields from 3 (state) on; utime is field 14, stime 15, starttime 22.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(StatTimes {
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
        start_ticks: field(22)?,
    })
}

/// The resident set size in bytes from /proc/<pid>/status (`VmRSS:  1234 kB`): in kB, so no
/// page size is needed, unlike statm.
pub fn parse_resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some(kib * 1024)
}

/// The boot time in seconds since the epoch from /proc/stat (`btime 1700000000`).
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The process start time in seconds since the epoch.
pub fn start_time_seconds(boot_time: u64, start_ticks: u64) -> f64 {
    boot_time as f64 + start_ticks as f64 / TICKS_PER_SECOND
}

/// Reads /proc on every scrape (a few small files: cheaper than a background sampler).
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat").as_deref().and_then(parse_stat);
        if let Some(times) = stat {
            let cpu = ConstCounter::new(times.cpu_ticks as f64 / TICKS_PER_SECOND);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            if let Some(boot) = read("/proc/stat").as_deref().and_then(parse_boot_time) {
                let start = ConstGauge::new(start_time_seconds(boot, times.start_ticks));
                start.encode(encoder.encode_descriptor(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    None,
                    start.metric_type(),
                )?)?;
            }
        }
        if let Some(bytes) = read("/proc/self/status")
            .as_deref()
            .and_then(parse_resident_bytes)
        {
            let rss = ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
            rss.encode(encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                None,
                rss.metric_type(),
            )?)?;
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own descriptor, open while it is read, is counted too (as in
            // client_golang's procfs).
            let fds = ConstGauge::new(i64::try_from(entries.count()).unwrap_or(i64::MAX));
            fds.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                fds.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line of /proc/<pid>/stat, with a command name holding a space and a parenthesis.
    const STAT: &str = "4242 (ax op) x) S 1 4242 4242 0 -1 4194560 5210 0 0 0 250 130 0 0 20 0 9 0 12345 1092616192 7000 18446744073709551615 1 1 0 0 0 0 0 4096 17663 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        assert_eq!(
            parse_stat(STAT),
            Some(StatTimes {
                cpu_ticks: 380,
                start_ticks: 12345
            })
        );
        assert_eq!(parse_stat("4242 (ax) S 1 2"), None, "truncated");
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn resident_bytes_come_from_vm_rss_in_kib() {
        let status = "Name:\tax-operator\nVmPeak:\t  200000 kB\nVmRSS:\t   51200 kB\nThreads:\t9\n";
        assert_eq!(parse_resident_bytes(status), Some(51200 * 1024));
        assert_eq!(parse_resident_bytes("Name:\tkthreadd\n"), None);
        assert_eq!(parse_resident_bytes("VmRSS:\t12 MB\n"), None);
    }

    #[test]
    fn start_time_is_boot_time_plus_ticks() {
        let proc_stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1700000000\nprocesses 7\n";
        let boot = parse_boot_time(proc_stat).expect("btime");
        assert_eq!(boot, 1_700_000_000);
        assert_eq!(start_time_seconds(boot, 12345), 1_700_000_123.45);
        assert_eq!(parse_boot_time("cpu 1\n"), None);
    }
}
