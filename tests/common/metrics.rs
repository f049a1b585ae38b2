//! Reading an operator's `/metrics`: a scrape through the API server's pod proxy and a parser of
//! the Prometheus text format good enough for ax's own series.

use std::collections::BTreeMap;

use super::kubectl_ok;

/// Port of /metrics in the operator pods (the chart's `httpPort`).
pub const METRICS_PORT: u16 = 8080;

/// /metrics of an operator pod, through the API server's pod proxy.
pub fn scrape(namespace: &str, pod: &str) -> String {
    kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/{namespace}/pods/{pod}:{METRICS_PORT}/proxy/metrics"),
    ])
}

/// One sample of the Prometheus text format: metric name, labels, value.
#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

pub fn parse_metrics(exposition: &str) -> Vec<Sample> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample: {line}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("not a number in: {line}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            // ax's label values are names and phases: no commas or quotes inside.
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad label in: {line}"));
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            Sample {
                name: name.to_string(),
                labels,
                value,
            }
        })
        .collect()
}

/// The sum of the samples of `name` whose labels include `labels`; None when there is none.
pub fn metric_value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .reduce(|a, b| a + b)
}
