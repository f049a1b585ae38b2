//! The project's targets (issue 10) as checks on one round's reports, and their summary over
//! several rounds. Pure: reports in, checks and text out.
//!
//! Each check is judged on one round; the summary judges timing checks on the median of the
//! rounds, because on a small shared machine one round's spread is as large as the gaps measured,
//! and the counts that must be 0 on their maximum, because one lost unit in any round is a bug.

use serde::Serialize;

use crate::report::{KindReport, number, table};
use crate::workload::Kind;

/// Which targets apply: those of a burst or those of a steady rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Burst,
    Rate,
}

/// Where a measured value must be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    AtLeast(f64),
    AtMost(f64),
    Zero,
}

impl Limit {
    fn holds(self, value: f64) -> bool {
        match self {
            Limit::AtLeast(limit) => value >= limit,
            Limit::AtMost(limit) => value <= limit,
            Limit::Zero => value == 0.0,
        }
    }

    fn text(self) -> String {
        match self {
            Limit::AtLeast(limit) => format!("≥ {limit}"),
            Limit::AtMost(limit) => format!("≤ {limit}"),
            Limit::Zero => "= 0".into(),
        }
    }
}

/// How a check's values over several rounds are combined into the one that is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AcrossRounds {
    /// Figures that vary from run to run: the middle round.
    Median,
    /// Counts that must be 0: the worst round.
    Max,
}

impl AcrossRounds {
    fn combine(self, values: &[Option<f64>]) -> Option<f64> {
        match self {
            AcrossRounds::Median => median(values),
            AcrossRounds::Max => max(values),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            AcrossRounds::Median => "median",
            AcrossRounds::Max => "max",
        }
    }
}

/// One target judged on one round.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    pub name: &'static str,
    /// `None`: a kind it needs failed in this round, or a figure is missing.
    pub value: Option<f64>,
    pub target: String,
    /// `None` when there is no value.
    pub met: Option<bool>,
    /// The figures the value comes from.
    pub detail: Option<String>,
    pub across_rounds: AcrossRounds,
    #[serde(skip)]
    limit: Limit,
    #[serde(skip)]
    decimals: usize,
}

impl Check {
    fn new(
        name: &'static str,
        value: Option<f64>,
        limit: Limit,
        decimals: usize,
        detail: Option<String>,
    ) -> Check {
        let value = value.filter(|v| v.is_finite());
        Check {
            name,
            value,
            target: limit.text(),
            met: value.map(|v| limit.holds(v)),
            detail,
            across_rounds: match limit {
                Limit::Zero => AcrossRounds::Max,
                _ => AcrossRounds::Median,
            },
            limit,
            decimals,
        }
    }
}

/// The rate target's allowance over bare pods' p50, in ms.
const P50_MARGIN_MS: f64 = 10.0;

/// The targets of `mode` that the kinds run (`kinds`) allow, judged on the round's `reports`
/// (one per kind that did not fail).
pub fn checks(mode: Mode, kinds: &[Kind], reports: &[KindReport]) -> Vec<Check> {
    let ran = |kind: Kind| kinds.contains(&kind);
    let report = |kind: Kind| reports.iter().find(|r| r.kind == kind.as_str());
    let pods = report(Kind::Pods);
    let jobs = report(Kind::Jobs);
    let ax = report(Kind::Ax);
    let ax_keys = report(Kind::AxKeys);
    let ratio =
        |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|&(_, b)| b > 0.0).map(|(a, b)| a / b);
    let throughput = |r: Option<&KindReport>| r.map(|r| r.throughput_per_second);
    let apiserver_ms = |r: Option<&KindReport>| r.and_then(|r| r.cpu_ms("kube-apiserver"));
    let p50 = |r: Option<&KindReport>| r.and_then(|r| r.pod_seen_ms.p50);

    let mut checks = Vec::new();
    match mode {
        Mode::Burst => {
            if ran(Kind::Pods) && ran(Kind::Ax) {
                checks.push(Check::new(
                    "ax throughput / bare pods'",
                    ratio(throughput(ax), throughput(pods)),
                    Limit::AtLeast(0.45),
                    2,
                    pair("ax", throughput(ax), "pods", throughput(pods), "units/s"),
                ));
            }
            if ran(Kind::Jobs) && ran(Kind::Ax) {
                checks.push(Check::new(
                    "ax throughput / Jobs'",
                    ratio(throughput(ax), throughput(jobs)),
                    Limit::AtLeast(5.0),
                    2,
                    pair("ax", throughput(ax), "jobs", throughput(jobs), "units/s"),
                ));
            }
            if ran(Kind::Ax) && ran(Kind::AxKeys) {
                checks.push(Check::new(
                    "ax throughput with keys / without",
                    ratio(throughput(ax_keys), throughput(ax)),
                    Limit::AtLeast(0.9),
                    2,
                    pair(
                        "ax-keys",
                        throughput(ax_keys),
                        "ax",
                        throughput(ax),
                        "units/s",
                    ),
                ));
            }
            if ran(Kind::Pods) && ran(Kind::Ax) {
                checks.push(Check::new(
                    "ax API server CPU ms/unit / bare pods'",
                    ratio(apiserver_ms(ax), apiserver_ms(pods)),
                    Limit::AtMost(3.0),
                    2,
                    pair(
                        "ax",
                        apiserver_ms(ax),
                        "pods",
                        apiserver_ms(pods),
                        "ms/unit",
                    ),
                ));
            }
        }
        Mode::Rate => {
            if ran(Kind::Pods) && ran(Kind::Ax) {
                let detail = p50(ax).zip(p50(pods)).map(|(ax, pods)| {
                    format!(
                        "ax p50 {ax:.1} ms, limit {:.1} ms: pods' {pods:.1} + {P50_MARGIN_MS}",
                        pods + P50_MARGIN_MS
                    )
                });
                checks.push(Check::new(
                    "ax p50 − bare pods' p50, create → pod seen ms",
                    p50(ax).zip(p50(pods)).map(|(ax, pods)| ax - pods),
                    Limit::AtMost(P50_MARGIN_MS),
                    1,
                    detail,
                ));
            }
            if ran(Kind::Ax) {
                checks.push(Check::new(
                    "ax p99 create → pod seen ms",
                    ax.and_then(|r| r.pod_seen_ms.p99),
                    Limit::AtMost(100.0),
                    1,
                    None,
                ));
            }
        }
    }
    if !kinds.is_empty() {
        checks.push(count_check("lost units (all kinds)", kinds, reports, |r| {
            r.lost
        }));
        checks.push(count_check(
            "units with two pods (all kinds)",
            kinds,
            reports,
            |r| r.units_with_several_pods,
        ));
    }
    checks
}

/// "ax 31.3, pods 84.8 units/s", when both figures are there.
fn pair(a_name: &str, a: Option<f64>, b_name: &str, b: Option<f64>, unit: &str) -> Option<String> {
    let (a, b) = a.zip(b)?;
    Some(format!("{a_name} {a:.1}, {b_name} {b:.1} {unit}"))
}

/// A count summed over every kind run, which must be 0; no value if a kind has no report.
fn count_check(
    name: &'static str,
    kinds: &[Kind],
    reports: &[KindReport],
    count: fn(&KindReport) -> usize,
) -> Check {
    let per_kind: Option<Vec<(&str, usize)>> = kinds
        .iter()
        .map(|kind| {
            let report = reports.iter().find(|r| r.kind == kind.as_str())?;
            Some((kind.as_str(), count(report)))
        })
        .collect();
    let total = per_kind
        .as_ref()
        .map(|counts| counts.iter().map(|(_, n)| *n as f64).sum());
    let detail = per_kind.map(|counts| {
        counts
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    });
    Check::new(name, total, Limit::Zero, 0, detail)
}

/// The median of the values there are (the mean of the two middle ones for an even count);
/// `None` when there are none.
pub fn median(values: &[Option<f64>]) -> Option<f64> {
    let mut present: Vec<f64> = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    if present.is_empty() {
        return None;
    }
    present.sort_by(f64::total_cmp);
    let middle = present.len() / 2;
    Some(if present.len() % 2 == 1 {
        present[middle]
    } else {
        (present[middle - 1] + present[middle]) / 2.0
    })
}

/// The largest of the values there are; `None` when there are none.
pub fn max(values: &[Option<f64>]) -> Option<f64> {
    values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .max_by(f64::total_cmp)
}

/// One target over all rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryRow {
    pub name: &'static str,
    /// One per round, in order; `None` where the round has no value.
    pub values: Vec<Option<f64>>,
    pub across_rounds: AcrossRounds,
    /// The median (or max) of the values there are: the one judged.
    pub value: Option<f64>,
    pub target: String,
    pub met: Option<bool>,
    #[serde(skip)]
    decimals: usize,
}

/// The checks of every round (`rounds[i]` is round i + 1's), one row per check, in the order
/// they first appear.
pub fn summarize(rounds: &[Vec<Check>]) -> Vec<SummaryRow> {
    let mut first: Vec<&Check> = Vec::new();
    for check in rounds.iter().flatten() {
        if !first.iter().any(|c| c.name == check.name) {
            first.push(check);
        }
    }
    first
        .into_iter()
        .map(|check| {
            let values: Vec<Option<f64>> = rounds
                .iter()
                .map(|round| round.iter().find(|c| c.name == check.name)?.value)
                .collect();
            let value = check.across_rounds.combine(&values);
            SummaryRow {
                name: check.name,
                across_rounds: check.across_rounds,
                value,
                target: check.target.clone(),
                met: value.map(|v| check.limit.holds(v)),
                decimals: check.decimals,
                values,
            }
        })
        .collect()
}

fn met_text(met: Option<bool>) -> String {
    match met {
        Some(true) => "met".into(),
        Some(false) => "NOT met".into(),
        None => "no figure".into(),
    }
}

/// One round's checks: value, target, met, and the figures each value comes from.
pub fn render_checks(checks: &[Check]) -> String {
    let mut rows = vec![vec![
        "check".to_owned(),
        "value".to_owned(),
        "target".to_owned(),
        "met".to_owned(),
    ]];
    let mut details = vec![String::new()];
    for c in checks {
        rows.push(vec![
            c.name.to_owned(),
            number(c.value, c.decimals),
            c.target.clone(),
            met_text(c.met),
        ]);
        details.push(c.detail.clone().unwrap_or_default());
    }
    // The details vary in length: after the table, so its right-aligned columns stay tidy.
    table(&rows)
        .lines()
        .zip(details)
        .map(|(line, detail)| {
            if detail.is_empty() {
                format!("{line}\n")
            } else {
                format!("{line}  ({detail})\n")
            }
        })
        .collect()
}

/// The summary: each round's value, the median (or max) across rounds, the target, and whether
/// that median (or max) meets it.
pub fn render_summary(summary: &[SummaryRow]) -> String {
    let rounds = summary.iter().map(|s| s.values.len()).max().unwrap_or(0);
    let mut rows = vec![
        std::iter::once("check".to_owned())
            .chain((1..=rounds).map(|i| format!("round {i}")))
            .chain(["across rounds".to_owned(), "target".into(), "met".into()])
            .collect::<Vec<_>>(),
    ];
    for s in summary {
        rows.push(
            std::iter::once(s.name.to_owned())
                .chain(s.values.iter().map(|v| number(*v, s.decimals)))
                .chain([
                    format!(
                        "{} {}",
                        number(s.value, s.decimals),
                        s.across_rounds.as_str()
                    ),
                    s.target.clone(),
                    met_text(s.met),
                ])
                .collect(),
        );
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Percentiles;

    const ALL: [Kind; 3] = [Kind::Pods, Kind::Jobs, Kind::Ax];

    fn burst_round(pods_tp: f64, jobs_tp: f64, ax_tp: f64) -> Vec<KindReport> {
        let mut pods = KindReport::for_test("pods", 500).with_apiserver_ms(12.0);
        pods.throughput_per_second = pods_tp;
        let mut jobs = KindReport::for_test("jobs", 500).with_apiserver_ms(50.0);
        jobs.throughput_per_second = jobs_tp;
        let mut ax = KindReport::for_test("ax", 500).with_apiserver_ms(30.0);
        ax.throughput_per_second = ax_tp;
        vec![pods, jobs, ax]
    }

    #[test]
    fn keys_are_judged_against_the_same_run_without_them() {
        let mut reports = burst_round(100.0, 10.0, 50.0);
        let mut keyed = KindReport::for_test("ax-keys", 500).with_apiserver_ms(30.0);
        keyed.throughput_per_second = 46.0;
        reports.push(keyed);
        let kinds = [Kind::Pods, Kind::Jobs, Kind::Ax, Kind::AxKeys];
        let judged = checks(Mode::Burst, &kinds, &reports);
        let check = by_name(&judged, "ax throughput with keys / without");
        assert_eq!(check.met, Some(true), "{check:?}");
        reports[3].throughput_per_second = 40.0;
        let judged = checks(Mode::Burst, &kinds, &reports);
        let check = by_name(&judged, "ax throughput with keys / without");
        assert_eq!(check.met, Some(false), "{check:?}");
        // Without the keyed kind there is nothing to judge.
        let judged = checks(Mode::Burst, &ALL, &reports[..3]);
        assert!(!judged.iter().any(|c| c.name.contains("with keys")));
    }

    fn rate_round(pods_p50: f64, ax_p50: f64, ax_p99: f64) -> Vec<KindReport> {
        let mut pods = KindReport::for_test("pods", 600);
        pods.pod_seen_ms = Percentiles {
            n: 600,
            p50: Some(pods_p50),
            p90: Some(pods_p50 * 2.0),
            p99: Some(pods_p50 * 3.0),
            max: Some(pods_p50 * 4.0),
        };
        let mut ax = KindReport::for_test("ax", 600);
        ax.pod_seen_ms = Percentiles {
            n: 600,
            p50: Some(ax_p50),
            p90: Some(ax_p99 * 0.7),
            p99: Some(ax_p99),
            max: Some(ax_p99 * 1.5),
        };
        vec![pods, ax]
    }

    fn by_name<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap()
    }

    fn near(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn burst_checks_judge_throughput_cpu_and_counts() {
        let mut reports = burst_round(80.0, 8.0, 44.0);
        reports[1].lost = 2;
        let judged = checks(Mode::Burst, &ALL, &reports);
        let names: Vec<&str> = judged.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "ax throughput / bare pods'",
                "ax throughput / Jobs'",
                "ax API server CPU ms/unit / bare pods'",
                "lost units (all kinds)",
                "units with two pods (all kinds)",
            ]
        );
        let pods = by_name(&judged, "ax throughput / bare pods'");
        assert!(near(pods.value, 0.55));
        assert_eq!((pods.target.as_str(), pods.met), ("≥ 0.45", Some(true)));
        assert_eq!(pods.detail.as_deref(), Some("ax 44.0, pods 80.0 units/s"));
        let jobs = by_name(&judged, "ax throughput / Jobs'");
        assert!(near(jobs.value, 5.5));
        assert_eq!((jobs.target.as_str(), jobs.met), ("≥ 5", Some(true)));
        let cpu = by_name(&judged, "ax API server CPU ms/unit / bare pods'");
        assert!(near(cpu.value, 2.5));
        assert_eq!((cpu.target.as_str(), cpu.met), ("≤ 3", Some(true)));
        let lost = by_name(&judged, "lost units (all kinds)");
        assert_eq!((lost.value, lost.met), (Some(2.0), Some(false)));
        assert_eq!(lost.detail.as_deref(), Some("pods 0, jobs 2, ax 0"));
        assert_eq!(lost.across_rounds, AcrossRounds::Max);
        let two = by_name(&judged, "units with two pods (all kinds)");
        assert_eq!((two.value, two.met), (Some(0.0), Some(true)));

        let slow = checks(Mode::Burst, &ALL, &burst_round(100.0, 10.0, 40.0));
        assert_eq!(
            by_name(&slow, "ax throughput / bare pods'").met,
            Some(false)
        );
        assert_eq!(by_name(&slow, "ax throughput / Jobs'").met, Some(false));
    }

    #[test]
    fn only_the_checks_whose_kinds_ran_are_made() {
        let reports = burst_round(80.0, 8.0, 44.0);
        let pods_ax = [reports[0].clone(), reports[2].clone()];
        let names = |checks: Vec<Check>| checks.iter().map(|c| c.name).collect::<Vec<_>>();
        assert_eq!(
            names(checks(Mode::Burst, &[Kind::Pods, Kind::Ax], &pods_ax)),
            [
                "ax throughput / bare pods'",
                "ax API server CPU ms/unit / bare pods'",
                "lost units (all kinds)",
                "units with two pods (all kinds)",
            ]
        );
        assert_eq!(
            names(checks(
                Mode::Burst,
                &[Kind::Pods, Kind::Jobs],
                &reports[..2]
            )),
            ["lost units (all kinds)", "units with two pods (all kinds)"]
        );
        assert!(checks(Mode::Burst, &[], &[]).is_empty());
        assert_eq!(
            names(checks(
                Mode::Rate,
                &[Kind::Ax],
                &rate_round(5.0, 12.0, 40.0)[1..]
            )),
            [
                "ax p99 create → pod seen ms",
                "lost units (all kinds)",
                "units with two pods (all kinds)",
            ]
        );
    }

    #[test]
    fn a_kind_that_failed_leaves_its_checks_without_a_value() {
        // Jobs were asked for but failed in this round: no report.
        let reports = burst_round(80.0, 8.0, 44.0);
        let without_jobs = [reports[0].clone(), reports[2].clone()];
        let judged = checks(Mode::Burst, &ALL, &without_jobs);
        let jobs = by_name(&judged, "ax throughput / Jobs'");
        assert_eq!((jobs.value, jobs.met, &jobs.detail), (None, None, &None));
        assert_eq!(
            by_name(&judged, "lost units (all kinds)").value,
            None,
            "a count over all kinds is unknown when one kind has none"
        );
        assert_eq!(
            by_name(&judged, "ax throughput / bare pods'").met,
            Some(true)
        );

        // No API server CPU figure (its pid file was missing).
        let mut reports = burst_round(80.0, 8.0, 44.0);
        reports[0].cpu.clear();
        let judged = checks(Mode::Burst, &ALL, &reports);
        let cpu = by_name(&judged, "ax API server CPU ms/unit / bare pods'");
        assert_eq!((cpu.value, cpu.met), (None, None));

        // Bare pods finished nothing: no ratio rather than an infinite one.
        let mut reports = burst_round(0.0, 8.0, 44.0);
        reports[0].throughput_per_second = 0.0;
        let judged = checks(Mode::Burst, &ALL, &reports);
        assert_eq!(by_name(&judged, "ax throughput / bare pods'").value, None);
    }

    #[test]
    fn rate_checks_judge_the_p50_margin_and_the_p99() {
        let kinds = [Kind::Pods, Kind::Ax];
        let judged = checks(Mode::Rate, &kinds, &rate_round(6.0, 19.0, 70.0));
        let margin = by_name(&judged, "ax p50 − bare pods' p50, create → pod seen ms");
        assert!(near(margin.value, 13.0));
        assert_eq!((margin.target.as_str(), margin.met), ("≤ 10", Some(false)));
        assert_eq!(
            margin.detail.as_deref(),
            Some("ax p50 19.0 ms, limit 16.0 ms: pods' 6.0 + 10")
        );
        let p99 = by_name(&judged, "ax p99 create → pod seen ms");
        assert_eq!(p99.value, Some(70.0));
        assert_eq!((p99.target.as_str(), p99.met), ("≤ 100", Some(true)));
        assert_eq!(judged.len(), 4);

        let fast = checks(Mode::Rate, &kinds, &rate_round(5.0, 15.0, 120.0));
        assert_eq!(
            by_name(&fast, "ax p50 − bare pods' p50, create → pod seen ms").met,
            Some(true),
            "exactly pods' p50 + 10 ms meets it"
        );
        assert_eq!(
            by_name(&fast, "ax p99 create → pod seen ms").met,
            Some(false)
        );
    }

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_value() {
        assert_eq!(median(&[Some(3.0), Some(1.0), Some(2.0)]), Some(2.0));
        assert_eq!(median(&[Some(7.0)]), Some(7.0));
        assert_eq!(
            median(&[Some(0.37), Some(0.59), Some(0.41), Some(0.30), Some(0.55)]),
            Some(0.41)
        );
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_two_middle_values() {
        assert_eq!(
            median(&[Some(4.0), Some(1.0), Some(3.0), Some(2.0)]),
            Some(2.5)
        );
        assert_eq!(median(&[Some(10.0), Some(20.0)]), Some(15.0));
    }

    #[test]
    fn missing_values_are_left_out_of_the_median_and_the_max() {
        assert_eq!(median(&[Some(1.0), None, Some(3.0)]), Some(2.0));
        assert_eq!(median(&[None, Some(5.0), None]), Some(5.0));
        assert_eq!(median(&[None, None]), None);
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[Some(f64::NAN), Some(4.0)]), Some(4.0));
        assert_eq!(max(&[Some(0.0), None, Some(2.0), Some(1.0)]), Some(2.0));
        assert_eq!(max(&[None]), None);
    }

    fn three_burst_rounds() -> Vec<Vec<Check>> {
        let mut second = burst_round(76.3, 8.6, 44.7);
        second[2].lost = 1;
        let third = burst_round(77.2, 8.6, 32.0);
        let mut without_jobs = third.clone();
        without_jobs.remove(1);
        vec![
            checks(Mode::Burst, &ALL, &burst_round(84.8, 8.6, 31.3)),
            checks(Mode::Burst, &ALL, &second),
            checks(Mode::Burst, &ALL, &without_jobs),
        ]
    }

    #[test]
    fn the_summary_judges_the_median_and_the_max_across_rounds() {
        let summary = summarize(&three_burst_rounds());
        assert_eq!(summary.len(), 5);

        let pods = &summary[0];
        assert_eq!(pods.name, "ax throughput / bare pods'");
        assert_eq!(pods.values.len(), 3);
        assert_eq!(pods.across_rounds, AcrossRounds::Median);
        assert!(near(pods.value, 32.0 / 77.2));
        assert_eq!(pods.met, Some(false));

        // Round 3 has no Jobs figure: the median of the other two, 3.64 and 5.20.
        let jobs = &summary[1];
        assert_eq!(jobs.values[2], None);
        assert!(near(jobs.value, (31.3 / 8.6 + 44.7 / 8.6) / 2.0));
        assert_eq!(jobs.met, Some(false));

        let cpu = &summary[2];
        assert!(near(cpu.value, 2.5));
        assert_eq!(cpu.met, Some(true));

        // One lost unit in round 2 fails the whole summary, whatever the median.
        let lost = &summary[3];
        assert_eq!(lost.values, [Some(0.0), Some(1.0), None]);
        assert_eq!(
            (lost.across_rounds, lost.value),
            (AcrossRounds::Max, Some(1.0))
        );
        assert_eq!(lost.met, Some(false));
        assert_eq!(summary[4].met, Some(true));

        assert!(summarize(&[]).is_empty());
    }

    #[test]
    fn the_summary_prints_each_round_then_the_judged_value() {
        let text = render_summary(&summarize(&three_burst_rounds()));
        println!("{text}");
        assert_eq!(
            text,
            "\
check                                   round 1  round 2  round 3  across rounds  target      met
ax throughput / bare pods'                 0.37     0.59     0.41    0.41 median  ≥ 0.45  NOT met
ax throughput / Jobs'                      3.64     5.20        -    4.42 median     ≥ 5  NOT met
ax API server CPU ms/unit / bare pods'     2.50     2.50     2.50    2.50 median     ≤ 3      met
lost units (all kinds)                        0        1        -          1 max     = 0  NOT met
units with two pods (all kinds)               0        0        -          0 max     = 0      met
"
        );
    }

    #[test]
    fn one_rounds_checks_print_with_their_figures() {
        let round = rate_round(6.0, 19.0, 70.0);
        let text = render_checks(&checks(Mode::Rate, &[Kind::Pods, Kind::Ax], &round));
        println!("{text}");
        assert_eq!(
            text,
            "\
check                                          value  target      met
ax p50 − bare pods' p50, create → pod seen ms   13.0    ≤ 10  NOT met  (ax p50 19.0 ms, limit 16.0 ms: pods' 6.0 + 10)
ax p99 create → pod seen ms                     70.0   ≤ 100      met
lost units (all kinds)                             0     = 0      met  (pods 0, ax 0)
units with two pods (all kinds)                    0     = 0      met  (pods 0, ax 0)
"
        );
    }
}
