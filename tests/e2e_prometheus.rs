//! ax seen through a real Prometheus (Debian's `prometheus`, started by this test on a free loopback
//! port with its own config and a temporary data dir). It scrapes the operator that
//! e2e/run-tests.sh started (metrics on $AX_OPERATOR_METRICS_ADDR, default 127.0.0.1:18080) every
//! second and evaluates the alert rules the chart renders. After a known run — tasks that succeed,
//! tasks that retry and go Dead, a circuit that opens, all in an AxQueue of the test's own — PromQL
//! answers with the expected values, the chart's `AxTasksDead` fires for the test's task type, and
//! every query of every panel of the chart's Grafana dashboard returns data.
//!
//! It runs in the shared-operator phase, beside other tests: every assertion is on series the test
//! alone controls (its own queue and task types, random names), except `ax_leader`, which is the
//! same for everyone.

mod common;
mod monitoring;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ax::api::{AxTask, Priority, TaskPhase};
use bytes::Bytes;
use common::queue::create_queue;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// A Prometheus server of this test's own; killed when dropped (also when the test fails).
struct Prometheus {
    child: Child,
    url: String,
    http: HttpClient<HttpConnector, Full<Bytes>>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// One series of a query result: its labels and its values (one for an instant query).
#[derive(Debug, Clone)]
struct Series {
    labels: BTreeMap<String, String>,
    values: Vec<f64>,
}

impl Series {
    fn value(&self) -> f64 {
        *self.values.last().expect("a sample")
    }
}

fn parse_sample(v: &Value) -> f64 {
    match v[1].as_str().expect("sample value is a string") {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        s => s.parse().expect("sample value is a number"),
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second as job `JOB` with label
    /// `namespace="ax-system"` (what the chart's ServiceMonitor produces), with `rules` loaded.
    async fn start(target: &str, rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        std::fs::write(dir.path().join("rules.yaml"), rules).expect("write rules");
        let config = json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{
                "job_name": monitoring::JOB,
                "static_configs": [{"targets": [target], "labels": {"namespace": monitoring::NAMESPACE}}],
            }],
        });
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, ax::yaml::to_string(&config).unwrap()).expect("config");
        let artifacts = repo_root().join("target/e2e");
        std::fs::create_dir_all(&artifacts).expect("artifacts dir");
        let log = artifacts.join("prometheus.log");
        let log_file = std::fs::File::create(&log).expect("prometheus log");
        let binary = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1d")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {binary} (Debian's `prometheus`, installed by e2e/install.sh): {e}"
                )
            });
        let mut prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", prometheus.log_tail());
            }
            if prometheus.get_status("/-/ready").await == Some(200) {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 60s:\n{}",
                prometheus.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    async fn get_status(&self, path: &str) -> Option<u16> {
        let request = hyper::Request::get(format!("{}{path}", self.url))
            .body(Full::new(Bytes::new()))
            .ok()?;
        let response = self.http.request(request).await.ok()?;
        Some(response.status().as_u16())
    }

    /// A call of the HTTP API (`/api/v1/...`): a POST with form parameters, or a GET with them in
    /// the URL when `get`; returns its `data`.
    async fn call(&self, get: bool, path: &str, params: &[(&str, &str)]) -> Value {
        let encoded = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let request = if get {
            hyper::Request::get(format!("{}{path}?{encoded}", self.url))
                .body(Full::new(Bytes::new()))
        } else {
            hyper::Request::post(format!("{}{path}", self.url))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Full::new(Bytes::from(encoded)))
        }
        .expect("a request");
        let response = self
            .http
            .request(request)
            .await
            .unwrap_or_else(|e| panic!("prometheus {path}: {e}"));
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("response body")
            .to_bytes();
        let reply: Value = serde_json::from_slice(&bytes).expect("prometheus answers JSON");
        assert_eq!(
            reply["status"], "success",
            "prometheus {path} {params:?}: {reply}"
        );
        reply["data"].clone()
    }

    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        self.call(false, path, params).await
    }

    /// An instant query, evaluated now.
    async fn query(&self, promql: &str) -> Vec<Series> {
        let data = self.api("/api/v1/query", &[("query", promql)]).await;
        assert_eq!(data["resultType"], "vector", "{promql}: {data}");
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Series {
                labels: serde_json::from_value(s["metric"].clone()).unwrap(),
                values: vec![parse_sample(&s["value"])],
            })
            .collect()
    }

    /// A range query from `start` to the next whole second, one step per second (as a Grafana
    /// panel asks).
    async fn query_range(&self, promql: &str, start: jiff::Timestamp) -> Vec<Series> {
        let (start, end) = (
            start.as_second().to_string(),
            (jiff::Timestamp::now().as_second() + 1).to_string(),
        );
        let data = self
            .api(
                "/api/v1/query_range",
                &[
                    ("query", promql),
                    ("start", &start),
                    ("end", &end),
                    ("step", "1"),
                ],
            )
            .await;
        assert_eq!(data["resultType"], "matrix", "{promql}: {data}");
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Series {
                labels: serde_json::from_value(s["metric"].clone()).unwrap(),
                values: s["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(parse_sample)
                    .collect(),
            })
            .collect()
    }

    /// Polls an instant query until `done` holds for its result (scrapes and the operator's
    /// gauge refreshes take a few seconds); panics after `timeout` with the last result.
    async fn wait(
        &self,
        promql: &str,
        what: &str,
        done: impl Fn(&[Series]) -> bool,
    ) -> Vec<Series> {
        let timeout = Duration::from_secs(60);
        let deadline = Instant::now() + timeout;
        loop {
            let result = self.query(promql).await;
            if done(&result) {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: `{promql}` not as expected within {timeout:?}; last result: {result:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Polls until `promql` is exactly one series with value `want`.
    async fn wait_value(&self, promql: &str, want: f64) {
        self.wait(promql, &format!("value {want}"), |r| {
            r.len() == 1 && r[0].value() == want
        })
        .await;
    }

    /// The value of a query that must have exactly one sample.
    async fn only_value(&self, promql: &str) -> f64 {
        let result = self.query(promql).await;
        assert_eq!(result.len(), 1, "{promql}: {result:?}");
        result[0].value()
    }

    /// [`Self::wait_value`] for each (query, value), in order.
    async fn wait_values(&self, wanted: &[(String, f64)]) {
        for (promql, want) in wanted {
            self.wait_value(promql, *want).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A task for a simulated node that "runs" for `millis` and exits with `exit_code`.
fn sim_task(
    name: &str,
    queue: &str,
    task_type: &str,
    priority: Priority,
    millis: u64,
    exit_code: i32,
    max_retries: u32,
) -> AxTask {
    serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name},
        "spec": {
            "type": task_type,
            "queue": queue,
            "priority": priority.as_str(),
            "retry": {
                "maxRetries": max_retries,
                "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 100},
            },
            "template": {"spec": {
                "nodeSelector": {"ax.dev/sim-node": "true"},
                "tolerations": [{"key": "ax.dev/sim-node", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "worker",
                    "image": "localhost/ax-busybox:1",
                    "env": [
                        {"name": "AX_SIM_START_MS", "value": "50"},
                        {"name": "AX_SIM_DURATION_MS", "value": millis.to_string()},
                        {"name": "AX_SIM_EXIT_CODE", "value": exit_code.to_string()},
                    ],
                }],
            }},
        },
    }))
    .expect("an AxTask")
}

async fn wait_all_terminal(client: &Client, ns: &str, want: usize) -> Vec<AxTask> {
    let api: Api<AxTask> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + LONG;
    loop {
        let tasks = api.list(&ListParams::default()).await.expect("list").items;
        let open: Vec<String> = tasks
            .iter()
            .filter(|t| !phase(t).is_some_and(TaskPhase::is_terminal))
            .map(|t| t.name_any())
            .collect();
        if tasks.len() == want && open.is_empty() {
            return tasks;
        }
        assert!(
            Instant::now() < deadline,
            "tasks in {ns} not finished within {LONG:?}: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The known run: 6 tasks that succeed after 1.5 s (3 High, 3 Normal) and 2 Low tasks that fail
/// twice (maxRetries 1, so one retry each) and go Dead, through a queue of concurrency 2 whose
/// breaker opens exactly at the 4th failure of the failing type (window and minimum 4), long after
/// every one of its attempts has ended.
const SUCCEEDING: usize = 6;
const DYING: usize = 2;
const ATTEMPTS: usize = SUCCEEDING + 2 * DYING;

#[tokio::test]
async fn prometheus_answers_promql_about_a_known_run_and_every_dashboard_panel_has_data() {
    let client = client().await;
    let suffix = format!("{:04x}", rand::random::<u16>());
    let ok_type = format!("prom-ok-{suffix}");
    let dead_type = format!("prom-dead-{suffix}");
    let target = std::env::var("AX_OPERATOR_METRICS_ADDR").unwrap_or("127.0.0.1:18080".into());

    let prometheus = Prometheus::start(&target, &monitoring::rule_file(&[])).await;
    prometheus
        .wait_value(&format!(r#"up{{job="{}"}}"#, monitoring::JOB), 1.0)
        .await;
    let run_start = jiff::Timestamp::now();

    let queue_guard = create_queue(
        &client,
        "prom",
        json!({
            "concurrency": 2,
            "circuitBreaker": {"windowSize": 4, "minRequests": 4, "failureRatio": 0.5, "openSeconds": 600},
            // One namespace: the same order as without, and the per-key panel has its series.
            "fairness": {},
        }),
    )
    .await;
    let queue = queue_guard.name.clone();

    let ns = namespace(&client, "prom").await;
    let mut tasks = Vec::new();
    for i in 0..SUCCEEDING {
        let priority = if i < 3 {
            Priority::High
        } else {
            Priority::Normal
        };
        tasks.push(sim_task(
            &format!("ok-{i}"),
            &queue,
            &ok_type,
            priority,
            1500,
            0,
            0,
        ));
    }
    for i in 0..DYING {
        tasks.push(sim_task(
            &format!("dead-{i}"),
            &queue,
            &dead_type,
            Priority::Low,
            300,
            1,
            1,
        ));
    }
    for task in &tasks {
        create(&client, &ns, task).await;
    }
    let done = wait_all_terminal(&client, &ns, tasks.len()).await;
    for task in &done {
        let want = if task.name_any().starts_with("ok-") {
            TaskPhase::Succeeded
        } else {
            TaskPhase::Dead
        };
        assert_eq!(phase(task), Some(want), "{}", names(task));
    }

    // Counters and histograms, exactly.
    let q = &queue;
    let p = &prometheus;
    p.wait_values(&[
        (
            format!(r#"ax_dead_tasks_total{{type="{dead_type}",reason="RetriesExhausted"}}"#),
            DYING as f64,
        ),
        (
            format!(r#"sum(ax_dead_tasks_total{{type=~"{dead_type}|{ok_type}"}})"#),
            DYING as f64,
        ),
        (
            format!(r#"ax_retries_total{{type="{dead_type}",kind="Retryable"}}"#),
            DYING as f64,
        ),
        (
            format!(r#"ax_dispatch_latency_seconds_count{{queue="{q}"}}"#),
            ATTEMPTS as f64,
        ),
        (
            format!(r#"ax_dispatch_latency_seconds_bucket{{queue="{q}",le="+Inf"}}"#),
            ATTEMPTS as f64,
        ),
    ])
    .await;
    // With 2 slots for 8 tasks, 6 first attempts waited at least for a 350 ms attempt to end.
    let latency_sum = p
        .only_value(&format!(
            r#"ax_dispatch_latency_seconds_sum{{queue="{q}"}}"#
        ))
        .await;
    assert!(latency_sum > 1.0, "dispatch latency sum: {latency_sum:?}");
    let median = p.only_value(&format!(r#"histogram_quantile(0.5, sum by (le) (ax_dispatch_latency_seconds_bucket{{queue="{q}"}}))"#)).await;
    assert!(
        median.is_finite() && median > 0.0,
        "median dispatch latency: {median:?}"
    );
    // A wait is counted when the dispatch's Scheduled transition is written, which may come a
    // few seconds after the pod (progress is written lazily): wait for every one.
    let want_waits = BTreeMap::from([
        ("High".to_string(), 3.0),
        ("Normal".to_string(), 3.0),
        ("Low".to_string(), (2 * DYING) as f64),
    ]);
    let by_priority = |r: &[Series]| -> BTreeMap<String, f64> {
        r.iter()
            .map(|s| (s.labels["priority"].clone(), s.value()))
            .collect()
    };
    // The dispatches the tasks' histories record, and how: a wrong metric then says whether the
    // tasks were dispatched more often than planned or the operator counted one twice.
    let mut dispatches = BTreeMap::<String, f64>::new();
    let mut histories = String::new();
    for task in &done {
        let history = &task.status.as_ref().expect("a status").history;
        let scheduled = history
            .iter()
            .filter(|h| h.to == TaskPhase::Scheduled)
            .count();
        *dispatches
            .entry(task.spec.priority.as_str().to_string())
            .or_default() += scheduled as f64;
        histories.push_str(&format!("\n{}:", task.name_any()));
        for h in history {
            let from = h.from.map_or("New", |p| p.as_str());
            histories.push_str(&format!(" {from}->{} ({}, {})", h.to, h.reason, h.time));
        }
    }
    assert_eq!(
        dispatches, want_waits,
        "dispatches in the histories:{histories}"
    );
    let waits = p
        .wait(
            &format!(r#"sum by (priority) (ax_queue_wait_seconds_count{{queue="{q}"}})"#),
            &format!("one wait per dispatch, by priority; histories:{histories}"),
            |r| by_priority(r) == want_waits,
        )
        .await;
    assert_eq!(by_priority(&waits), want_waits);
    p.wait_values(&[
        (
            format!(r#"ax_task_duration_seconds_count{{type="{ok_type}",outcome="Succeeded"}}"#),
            SUCCEEDING as f64,
        ),
        (
            format!(r#"ax_task_duration_seconds_count{{type="{dead_type}",outcome="Dead"}}"#),
            DYING as f64,
        ),
    ])
    .await;
    let ran = p
        .only_value(&format!(
            r#"ax_task_duration_seconds_sum{{type="{ok_type}",outcome="Succeeded"}}"#
        ))
        .await;
    assert!(
        ran >= 1.5 * SUCCEEDING as f64,
        "each succeeding task took at least its 1.5 s: {ran:?}"
    );

    // Gauges, once the operator's periodic refresh has been scraped.
    p.wait_values(&[
        (
            format!(r#"ax_tasks{{queue="{q}",type="{ok_type}",phase="Succeeded"}}"#),
            SUCCEEDING as f64,
        ),
        (
            format!(r#"ax_tasks{{queue="{q}",type="{dead_type}",phase="Dead"}}"#),
            DYING as f64,
        ),
        (format!(r#"count(ax_tasks{{queue="{q}"}})"#), 2.0),
        (format!(r#"sum(ax_queue_pending{{queue="{q}"}})"#), 0.0),
        (format!(r#"count(ax_queue_pending{{queue="{q}"}})"#), 4.0),
    ])
    .await;
    let peak_pending = p
        .only_value(&format!(
            r#"max(max_over_time(ax_queue_pending{{queue="{q}"}}[10m]))"#
        ))
        .await;
    assert!(
        peak_pending >= 1.0,
        "8 tasks for 2 slots: some were seen pending: {peak_pending:?}"
    );
    p.wait_values(&[
        (format!(r#"ax_queue_concurrency{{queue="{q}"}}"#), 2.0),
        (format!(r#"ax_queue_running{{queue="{q}"}}"#), 0.0),
    ])
    .await;
    let peak_running = p
        .only_value(&format!(
            r#"max_over_time(ax_queue_running{{queue="{q}"}}[10m])"#
        ))
        .await;
    assert!(
        (1.0..=2.0).contains(&peak_running),
        "running stayed within the concurrency of 2 and was seen: {peak_running:?}"
    );
    p.wait_value(
        &format!(r#"ax_circuit_open{{queue="{q}",type="{dead_type}"}}"#),
        1.0,
    )
    .await;
    let ok_circuit = p
        .query(&format!(
            r#"ax_circuit_open{{queue="{q}",type="{ok_type}"}} == 1"#
        ))
        .await;
    assert!(
        ok_circuit.is_empty(),
        "the succeeding type's circuit opened: {ok_circuit:?}"
    );
    p.wait_value(
        &format!(r#"sum(ax_leader{{job="{}"}})"#, monitoring::JOB),
        1.0,
    )
    .await;

    // The chart's own alert, on the real series.
    p.wait(
        &format!(
            r#"ALERTS{{alertname="AxTasksDead",alertstate="firing",type="{dead_type}",reason="RetriesExhausted"}}"#
        ),
        "AxTasksDead firing for the failing type",
        |r| r.len() == 1,
    )
    .await;
    let ok_alert = p
        .query(&format!(
            r#"ALERTS{{alertname="AxTasksDead",type="{ok_type}"}}"#
        ))
        .await;
    assert!(
        ok_alert.is_empty(),
        "AxTasksDead for the succeeding type: {ok_alert:?}"
    );

    // Every panel of the dashboard, as Grafana would ask for it with this test's queue and types.
    let dashboard = monitoring::dashboard();
    let types = format!("{ok_type}|{dead_type}");
    // One cluster, no `cluster` label: the variable's "All" (`.*`) also matches its absence.
    let vars = [
        ("cluster", ".*"),
        ("namespace", monitoring::NAMESPACE),
        ("queue", q.as_str()),
        ("type", types.as_str()),
        ("__rate_interval", "10s"),
    ];
    // A rate needs two scrapes of a series, and the circuit opened with the last failure: poll.
    let deadline = Instant::now() + Duration::from_secs(30);
    for panel in monitoring::panel_queries(&dashboard) {
        let expr = monitoring::substitute(&panel.expr, &vars);
        loop {
            let result = p.query_range(&expr, run_start).await;
            let samples = result
                .iter()
                .flat_map(|s| &s.values)
                .filter(|v| v.is_finite())
                .count();
            if samples > 0 {
                println!(
                    "{} {}: {} series, {samples} samples: {expr}",
                    panel.panel,
                    panel.ref_id,
                    result.len()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "panel {} {} has no data since the run started: {expr}",
                panel.panel,
                panel.ref_id
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    for (name, metric, label) in monitoring::label_value_variables(&dashboard) {
        let want = match name.as_str() {
            // This Prometheus adds no cluster label: nothing to offer, and nothing to check.
            "cluster" => continue,
            "namespace" => monitoring::NAMESPACE,
            "queue" => q.as_str(),
            _ => ok_type.as_str(),
        };
        let metric = monitoring::substitute(&metric, &vars);
        let data = p
            .call(
                true,
                &format!("/api/v1/label/{label}/values"),
                &[("match[]", &metric)],
            )
            .await;
        let values: Vec<&str> = data
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            values.contains(&want),
            "variable {name} offers {values:?}, not {want}"
        );
    }
}
