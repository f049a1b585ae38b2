//! The chart's monitoring pieces exactly as they ship, rendered with `helm template`: the
//! PrometheusRule's rule groups and the Grafana dashboard with the PromQL of every panel. Shared by
//! tests/chart_monitoring.rs (promtool, no cluster) and tests/e2e_prometheus.rs (a real Prometheus).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The release the tests render: the rules then select `namespace="ax-system", job="ax-ax-operator"`,
/// the labels the chart's ServiceMonitor gives the operator's series.
pub const RELEASE: &str = "ax";
pub const NAMESPACE: &str = "ax-system";
pub const JOB: &str = "ax-ax-operator";

pub fn helm() -> String {
    std::env::var("HELM").unwrap_or_else(|_| "helm".into())
}

pub fn promtool() -> String {
    std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `helm template ax charts/ax-operator -n ax-system ARGS...`, one value per YAML document.
pub fn render(args: &[&str]) -> Vec<serde_json::Value> {
    let chart = repo_root().join("charts/ax-operator");
    let out = Command::new(helm())
        .args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {} (set HELM): {e}", helm()));
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm output is UTF-8");
    ax::yaml::documents(&text).expect("helm renders YAML")
}

/// The rendered objects of `kind`.
pub fn of_kind<'a>(
    docs: &'a [serde_json::Value],
    kind: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> + 'a {
    docs.iter()
        .filter(move |d| d["kind"].as_str() == Some(kind))
}

/// The PrometheusRule's `spec` (a Prometheus rule file: `groups:`), rendered with `args` on top of
/// `prometheusRule.enabled=true`, as YAML text.
pub fn rule_file(args: &[&str]) -> String {
    let mut all = vec!["--set", "prometheusRule.enabled=true"];
    all.extend_from_slice(args);
    let docs = render(&all);
    let rules: Vec<_> = of_kind(&docs, "PrometheusRule").collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule rendered");
    ax::yaml::to_string(&rules[0]["spec"]).expect("rule groups as YAML")
}

/// Alert names of a rule file, in order.
pub fn alert_names(rule_file: &str) -> Vec<String> {
    let file: serde_json::Value = ax::yaml::from_str(rule_file).expect("rule file is YAML");
    file["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect()
}

/// The dashboard JSON of the ConfigMap rendered with `grafanaDashboard.enabled=true`.
pub fn dashboard() -> serde_json::Value {
    let docs = render(&["--set", "grafanaDashboard.enabled=true"]);
    let maps: Vec<_> = of_kind(&docs, "ConfigMap").collect();
    assert_eq!(maps.len(), 1, "one dashboard ConfigMap rendered");
    let data = maps[0]["data"].as_object().expect("the ConfigMap has data");
    assert_eq!(data.len(), 1, "one dashboard in the ConfigMap");
    let json = data.values().next().and_then(|v| v.as_str()).expect("text");
    serde_json::from_str(json).expect("the dashboard is JSON")
}

/// One query of one dashboard panel.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// Every query of every panel (also panels inside rows); panics on a panel without one.
pub fn panel_queries(dashboard: &serde_json::Value) -> Vec<PanelQuery> {
    let mut queries = Vec::new();
    let mut panels: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .expect("the dashboard has panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            panels.extend(inner);
        }
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap_or("(untitled)").to_string();
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default().to_string();
            assert!(!expr.is_empty(), "panel {title:?} has an empty query");
            queries.push(PanelQuery {
                panel: title.clone(),
                ref_id: target["refId"].as_str().unwrap_or("?").to_string(),
                expr,
            });
        }
    }
    queries.sort_by(|a, b| (&a.panel, &a.ref_id).cmp(&(&b.panel, &b.ref_id)));
    queries
}

/// `expr` with Grafana's variables (`$name`, `${name}`) replaced; panics if one is left, so a new
/// variable in the dashboard cannot go untested.
pub fn substitute(expr: &str, vars: &[(&str, &str)]) -> String {
    let mut out = expr.to_string();
    // Longest names first: `$__rate_interval` before a hypothetical `$__rate`.
    let mut vars = vars.to_vec();
    vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    for (name, value) in vars {
        out = out
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(
        !out.contains('$'),
        "a Grafana variable the tests do not know is left in {out:?}"
    );
    out
}

/// The dashboard's query variables as (name, metric, label) from `label_values(metric, label)`.
pub fn label_value_variables(dashboard: &serde_json::Value) -> Vec<(String, String, String)> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let name = v["name"].as_str().unwrap_or_default().to_string();
            let query = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .unwrap_or_default();
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("variable {name}: not label_values(...): {query}"));
            // The label is last; the metric's selector may hold commas of its own.
            let (metric, label) = inner
                .rsplit_once(',')
                .unwrap_or_else(|| panic!("variable {name}: label_values(metric, label): {query}"));
            (name, metric.trim().to_string(), label.trim().to_string())
        })
        .collect()
}
