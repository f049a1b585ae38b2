//! The chart's values checked without a cluster, with `helm template` and `helm lint --strict`:
//! values.schema.json refuses wrong types, unknown keys and values outside their set; the
//! PodDisruptionBudget and the NetworkPolicy select exactly the Deployment's pods; every value of
//! values.yaml has a comment and a schema entry; and the values table of charts/ax-operator/README.md
//! is the one generated from values.yaml (`AX_UPDATE_CHART_README=1` rewrites it).
//! Needs `helm` (or $HELM): e2e/run-tests.sh runs it as the phase "chart values (helm)".

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const RELEASE: &str = "ax";
const NAMESPACE: &str = "ax-system";
/// Where the generated values table sits in the chart's README.
const TABLE_START: &str = "<!-- values:start -->";
const TABLE_END: &str = "<!-- values:end -->";
/// Set to 1 to rewrite the README's values table instead of failing on a stale one.
const UPDATE_ENV: &str = "AX_UPDATE_CHART_README";

/// Values that are Kubernetes objects handed through as they are (resources, probes, security
/// contexts, scheduling, annotations and labels): the table and the schema stop at them, their
/// fields are Kubernetes'. Every other mapping of values.yaml is the chart's own and closed.
const PASS_THROUGH: &[&str] = &[
    "serviceAccount.annotations",
    "service.annotations",
    "resources",
    "livenessProbe",
    "readinessProbe",
    "podSecurityContext",
    "securityContext",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "affinity",
    "serviceMonitor.labels",
    "prometheusRule.labels",
    "grafanaDashboard.annotations",
];

fn helm_binary() -> String {
    std::env::var("HELM").unwrap_or_else(|_| "helm".into())
}

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/ax-operator")
}

fn read_chart_file(name: &str) -> String {
    let path = chart_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn run_helm(args: &[&str]) -> Output {
    Command::new(helm_binary())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {} (set HELM): {e}", helm_binary()))
}

/// `helm template ax charts/ax-operator -n ax-system ARGS...`: the rendered objects, or helm's
/// stderr when it refuses.
fn try_render(args: &[&str]) -> Result<Vec<Value>, String> {
    let chart = chart_dir();
    let mut all = vec![
        "template",
        RELEASE,
        chart.to_str().expect("chart path is UTF-8"),
        "--namespace",
        NAMESPACE,
    ];
    all.extend_from_slice(args);
    let out = run_helm(&all);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("helm output is UTF-8");
    Ok(ax::yaml::documents(&text).expect("helm renders YAML"))
}

fn render(args: &[&str]) -> Vec<Value> {
    try_render(args).unwrap_or_else(|err| panic!("helm template {args:?} failed:\n{err}"))
}

/// Helm's error for `args`; panics if it renders.
fn refused(args: &[&str]) -> String {
    match try_render(args) {
        Ok(_) => panic!("helm template {args:?} rendered; the schema should refuse it"),
        Err(err) => err,
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "one {kind} rendered, found {}", found.len());
    found[0]
}

fn deployment_selector(docs: &[Value]) -> &Value {
    let selector = &one(docs, "Deployment")["spec"]["selector"]["matchLabels"];
    assert!(
        selector.as_object().is_some_and(|m| !m.is_empty()),
        "the Deployment has selector labels: {selector:?}"
    );
    selector
}

#[test]
fn the_schema_refuses_wrong_types_unknown_keys_and_values_outside_their_set() {
    let err = refused(&["--set", "replicaCount=abc"]);
    assert!(
        err.contains("replicaCount"),
        "error names replicaCount:\n{err}"
    );

    let err = refused(&["--set", "nosuchkey=1"]);
    assert!(err.contains("nosuchkey"), "error names nosuchkey:\n{err}");
    // Closed below the top level too: a typo in the chart's own objects is caught.
    let err = refused(&["--set", "operator.leaseDuration=15"]);
    assert!(err.contains("leaseDuration"), "error names the key:\n{err}");

    for (set, key) in [
        ("operator.logFormat=xml", "logFormat"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("service.type=ExternalName", "type"),
        ("httpPort=0", "httpPort"),
        ("httpPort=70000", "httpPort"),
        ("replicaCount=-1", "replicaCount"),
        ("operator.leaseDurationSeconds=0", "leaseDurationSeconds"),
        ("podDisruptionBudget.maxUnavailable=0", "maxUnavailable"),
        ("serviceMonitor.interval=often", "interval"),
    ] {
        let err = refused(&["--set", set]);
        assert!(err.contains(key), "--set {set}: error names {key}:\n{err}");
    }
    // Pass-through Kubernetes objects stay open.
    render(&[
        "--set",
        "resources.limits.cpu=1",
        "--set",
        "affinity.nodeAffinity.x=y",
    ]);
}

#[test]
fn the_defaults_render_and_pass_helm_lint_strict() {
    let docs = render(&[]);
    one(&docs, "Deployment");
    let chart = chart_dir();
    let out = run_helm(&[
        "lint",
        "--strict",
        chart.to_str().expect("chart path is UTF-8"),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "helm lint --strict failed:\n{text}");
}

#[test]
fn the_pod_disruption_budget_selects_the_deployments_pods_from_two_replicas_on() {
    let docs = render(&[]);
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        &pdb["spec"]["selector"]["matchLabels"],
        deployment_selector(&docs),
        "the budget selects the Deployment's pods"
    );
    assert!(
        pdb["spec"]["minAvailable"].is_null(),
        "one of minAvailable and maxUnavailable"
    );

    // Kubernetes 1.20 (the test cluster) has no policy/v1.
    let old = render(&["--kube-version", "1.20.0"]);
    assert_eq!(
        one(&old, "PodDisruptionBudget")["apiVersion"],
        "policy/v1beta1"
    );
    let discovered = render(&[
        "--kube-version",
        "1.20.0",
        "--api-versions",
        "policy/v1/PodDisruptionBudget",
    ]);
    assert_eq!(
        one(&discovered, "PodDisruptionBudget")["apiVersion"],
        "policy/v1"
    );

    let percent = render(&["--set", "podDisruptionBudget.maxUnavailable=50%"]);
    assert_eq!(
        one(&percent, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        "50%"
    );

    for args in [
        &["--set", "replicaCount=1"][..],
        &["--set", "replicaCount=0"],
        &["--set", "podDisruptionBudget.enabled=false"],
    ] {
        let docs = render(args);
        assert!(
            of_kind(&docs, "PodDisruptionBudget").is_empty(),
            "a PodDisruptionBudget is rendered with {args:?}"
        );
    }
}

#[test]
fn the_network_policy_admits_only_the_http_port_and_only_when_enabled() {
    assert!(
        of_kind(&render(&[]), "NetworkPolicy").is_empty(),
        "a NetworkPolicy is rendered by default"
    );

    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "httpPort=9090",
    ]);
    let policy = one(&docs, "NetworkPolicy");
    assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(
        &policy["spec"]["podSelector"]["matchLabels"],
        deployment_selector(&docs),
        "the policy selects the Deployment's pods"
    );
    let types: Vec<_> = policy["spec"]["policyTypes"]
        .as_array()
        .expect("policyTypes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(types, ["Ingress"], "ingress only: egress stays open");

    let container = &one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let ports = container["ports"].as_array().expect("container ports");
    assert_eq!(ports.len(), 1, "the operator listens on one port");
    assert_eq!(ports[0]["containerPort"], 9090);
    let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
    assert_eq!(rules.len(), 1, "one ingress rule");
    let allowed = rules[0]["ports"].as_array().expect("ports of the rule");
    assert_eq!(allowed.len(), 1, "one port admitted");
    assert_eq!(allowed[0]["port"], ports[0]["containerPort"]);
    assert_eq!(allowed[0]["protocol"], "TCP");
    // No peers given: every pod of the cluster, nothing from outside.
    let everyone: Value = ax::yaml::from_str("[{namespaceSelector: {}}]").unwrap();
    assert_eq!(rules[0]["from"], everyone);

    let peers = r#"[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}}]"#;
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        &format!("networkPolicy.metricsFrom={peers}"),
    ]);
    let policy = one(&docs, "NetworkPolicy");
    let want: Value = ax::yaml::from_str(peers).unwrap();
    assert_eq!(
        policy["spec"]["ingress"][0]["from"], want,
        "exactly the peers given"
    );
}

/// JSON Schema type names a value of values.yaml may have.
#[test]
fn tracing_is_off_by_default_and_its_values_become_the_operators_flags() {
    let args = |docs: &[Value]| -> Vec<String> {
        one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .filter(|a| a.starts_with("--trace-"))
            .collect()
    };
    assert!(args(&render(&[])).is_empty());
    let on = render(&[
        "--set",
        "tracing.endpoint=http://otel-collector.observability:4317",
        "--set",
        "tracing.protocol=grpc",
        "--set",
        "tracing.sampler=ratio",
        // `--set` reads 0.25 as a string.
        "--set-json",
        "tracing.samplerRatio=0.25",
    ]);
    assert_eq!(
        args(&on),
        [
            "--trace-endpoint=http://otel-collector.observability:4317",
            "--trace-protocol=grpc",
            "--trace-sampler=ratio",
            "--trace-sampler-ratio=0.25",
        ]
    );
    assert!(refused(&["--set", "tracing.protocol=thrift"]).contains("tracing"));
    assert!(refused(&["--set-json", "tracing.samplerRatio=2"]).contains("samplerRatio"));
}

fn json_types(value: &Value) -> &'static [&'static str] {
    match value {
        Value::Null => &["null"],
        Value::Bool(_) => &["boolean"],
        Value::Number(n) if n.is_i64() || n.is_u64() => &["integer", "number"],
        Value::Number(_) => &["number"],
        Value::String(_) => &["string"],
        Value::Array(_) => &["array"],
        Value::Object(_) => &["object"],
    }
}

/// The `type`s a schema admits, also those of its `anyOf` alternatives.
fn schema_types(schema: &serde_json::Value) -> Vec<String> {
    let mut types = Vec::new();
    let mut add = |t: &serde_json::Value| match t {
        serde_json::Value::String(s) => types.push(s.clone()),
        serde_json::Value::Array(a) => {
            types.extend(a.iter().filter_map(|s| s.as_str().map(String::from)))
        }
        _ => {}
    };
    add(&schema["type"]);
    for alternative in schema["anyOf"].as_array().into_iter().flatten() {
        add(&alternative["type"]);
    }
    types
}

/// Checks `values` (at `path`, "" for the top) against the schema `object` that must describe it;
/// collects the problems.
fn check_schema(
    path: &str,
    values: &Value,
    object: &serde_json::Value,
    problems: &mut Vec<String>,
) {
    let Some(mapping) = values.as_object() else {
        return;
    };
    let shown = if path.is_empty() { "(top level)" } else { path };
    if object["additionalProperties"] != false {
        problems.push(format!(
            "{shown}: the chart's own object needs additionalProperties: false"
        ));
    }
    for (key, value) in mapping {
        let full = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        let Some(property) = object["properties"].get(key) else {
            problems.push(format!("{full}: no property in values.schema.json"));
            continue;
        };
        if property["description"]
            .as_str()
            .is_none_or(|d| d.trim().is_empty())
        {
            problems.push(format!("{full}: no description in values.schema.json"));
        }
        let admitted = schema_types(property);
        if !json_types(value)
            .iter()
            .any(|t| admitted.iter().any(|a| a == t))
        {
            problems.push(format!(
                "{full}: default {value:?} is none of the schema's types {admitted:?}"
            ));
        }
        if PASS_THROUGH.contains(&full.as_str()) {
            if property["additionalProperties"] == false {
                problems.push(format!(
                    "{full}: a Kubernetes object handed through must stay open (no additionalProperties: false)"
                ));
            }
        } else if value.is_object() {
            check_schema(&full, value, property, problems);
        }
    }
}

#[test]
fn every_value_has_a_typed_and_described_schema_property() {
    let values: Value =
        ax::yaml::from_str(&read_chart_file("values.yaml")).expect("values.yaml is YAML");
    let schema: serde_json::Value = serde_json::from_str(&read_chart_file("values.schema.json"))
        .expect("values.schema.json is JSON");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let mut problems = Vec::new();
    check_schema("", &values, &schema, &mut problems);
    for required in ["replicaCount", "image"] {
        let listed = schema["required"].as_array().into_iter().flatten();
        if !listed.clone().any(|r| r == required) {
            problems.push(format!("{required}: not in the schema's required"));
        }
    }
    assert!(
        problems.is_empty(),
        "values.schema.json does not cover values.yaml:\n{}",
        problems.join("\n")
    );
}

/// One row of the values table.
struct Row {
    key: String,
    kind: &'static str,
    default: String,
    description: String,
}

/// The comment lines directly above each key of values.yaml (no blank line between), joined into
/// one line, by dotted key path. YAML readers drop comments, so this reads the lines: indentation
/// gives the nesting.
fn key_comments(text: &str) -> BTreeMap<String, String> {
    let mut comments = BTreeMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            pending.clear();
        } else if let Some(comment) = trimmed.strip_prefix('#') {
            pending.push(comment.trim());
        } else if let Some((key, _)) = trimmed.split_once(':').filter(|(key, _)| {
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        }) {
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            stack.push((indent, key.to_string()));
            let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
            if !pending.is_empty() {
                comments.insert(path.join("."), pending.join(" "));
            }
            pending.clear();
        } else {
            // A list item or a continuation: a comment above it describes no key.
            pending.clear();
        }
    }
    comments
}

/// values.yaml as written: the table follows the file, and serde_json's maps sort their keys.
enum InOrder {
    Map(Vec<(String, InOrder)>),
    Other(Value),
}

impl<'de> serde::Deserialize<'de> for InOrder {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = Vec<(String, InOrder)>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(entries)
            }
        }
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Either {
            Map(#[serde(deserialize_with = "map_in_order")] Vec<(String, InOrder)>),
            Other(Value),
        }
        fn map_in_order<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<(String, InOrder)>, D::Error> {
            d.deserialize_map(Entries)
        }
        Ok(
            match <Either as serde::Deserialize>::deserialize(deserializer)? {
                Either::Map(entries) => InOrder::Map(entries),
                Either::Other(value) => InOrder::Other(value),
            },
        )
    }
}

impl serde::Serialize for InOrder {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            InOrder::Map(entries) => serializer.collect_map(entries.iter().map(|(k, v)| (k, v))),
            InOrder::Other(value) => serde::Serialize::serialize(value, serializer),
        }
    }
}

/// The table's rows: every value down to the pass-through objects, in the order of values.yaml.
fn rows(values: &InOrder, path: &str, comments: &BTreeMap<String, String>, out: &mut Vec<Row>) {
    let InOrder::Map(entries) = values else {
        panic!("{path}: a mapping");
    };
    for (key, value) in entries {
        let full = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        if matches!(value, InOrder::Map(_)) && !PASS_THROUGH.contains(&full.as_str()) {
            rows(value, &full, comments, out);
            continue;
        }
        let kind = match value {
            InOrder::Map(_) => "object",
            InOrder::Other(value) => json_types(value).first().copied().unwrap_or("?"),
        };
        out.push(Row {
            kind,
            default: serde_json::to_string(value).expect("default as JSON"),
            description: comments.get(&full).cloned().unwrap_or_default(),
            key: full,
        });
    }
}

fn value_rows() -> Vec<Row> {
    let text = read_chart_file("values.yaml");
    let values: InOrder = ax::yaml::from_str(&text).expect("values.yaml is YAML");
    let mut out = Vec::new();
    rows(&values, "", &key_comments(&text), &mut out);
    out
}

/// A table cell: pipes escaped, so a value cannot split its row.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The README's values table (Key | Type | Default | Description), generated from values.yaml.
fn values_table() -> String {
    let mut table = String::from("| Key | Type | Default | Description |\n|---|---|---|---|\n");
    for row in value_rows() {
        table.push_str(&format!(
            "| `{}` | {} | `{}` | {} |\n",
            row.key,
            row.kind,
            cell(&row.default),
            cell(&row.description)
        ));
    }
    table
}

#[test]
fn every_value_has_a_comment_above_it() {
    let undocumented: Vec<String> = value_rows()
        .into_iter()
        .filter(|row| row.description.is_empty())
        .map(|row| row.key)
        .collect();
    assert!(
        undocumented.is_empty(),
        "values without a comment directly above them in values.yaml (it becomes their README description): {undocumented:?}"
    );
}

#[test]
fn the_readme_values_table_is_generated_from_values_yaml() {
    let path = chart_dir().join("README.md");
    let readme = read_chart_file("README.md");
    let start = readme
        .find(TABLE_START)
        .unwrap_or_else(|| panic!("{TABLE_START} missing in {}", path.display()));
    let body = start + TABLE_START.len();
    let end = body
        + readme[body..].find(TABLE_END).unwrap_or_else(|| {
            panic!(
                "{TABLE_END} missing after {TABLE_START} in {}",
                path.display()
            )
        });
    let want = format!("\n{}", values_table());
    if readme[body..end] == want {
        return;
    }
    if std::env::var(UPDATE_ENV).as_deref() == Ok("1") {
        let updated = format!("{}{want}{}", &readme[..body], &readme[end..]);
        std::fs::write(&path, updated).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("rewrote the values table of {}", path.display());
        return;
    }
    panic!(
        "the values table of {} differs from values.yaml; regenerate it with\n  \
         {UPDATE_ENV}=1 cargo test --test chart_values the_readme_values_table\n\
         --- want ---\n{want}--- have ---\n{}",
        path.display(),
        &readme[body..end]
    );
}
