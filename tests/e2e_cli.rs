//! `kubectl ax` end to end: the real kubectl-ax binary against the real cluster, with the operator
//! started by e2e/run-tests.sh. Each test has its own namespace (AxQueues are cluster-scoped, so
//! the top test makes its own).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ax::api::{AxCron, AxDag, AxQueue, AxTask, TaskPhase};
use common::cli::*;
use common::sim::SimWorker;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// A task for the simulated nodes: "runs" `millis`, exits `exit_code`, no retries.
fn sim_task(name: &str, millis: u64, exit_code: i32, labels: serde_json::Value) -> AxTask {
    serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "type": "cli-sim",
            "retry": {"maxRetries": 0},
            "template": {"spec": sim_pod_spec(millis, exit_code, false)},
        },
    }))
    .expect("an AxTask")
}

fn sim_pod_spec(millis: u64, exit_code: i32, hang: bool) -> serde_json::Value {
    let worker = SimWorker::running_for(millis)
        .start_ms(50)
        .exit_code(exit_code);
    if hang { worker.hang() } else { worker }.pod_spec()
}

/// `kubectl ax wait TARGET --for succeeded --timeout 2m`, which must succeed.
async fn wait_succeeded(ns: &str, target: &str) -> Run {
    let args = ["wait", target, "--for", "succeeded", "--timeout", "2m"];
    ax_async(ns, &args).await.ok()
}

/// A task on the real kubelet running `script` with `max_retries`.
fn real_task(name: &str, script: &str, max_retries: i32) -> AxTask {
    example("hello.yaml", name, |v| {
        v["spec"]["type"] = "cli-real".into();
        v["spec"]["retry"] = json!({
            "maxRetries": max_retries,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 100},
        });
        v["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["sh", "-c", script]);
    })
}

async fn task_of(client: &Client, ns: &str, name: &str) -> AxTask {
    Api::<AxTask>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get task")
}

fn rerun_entries(t: &AxTask) -> usize {
    history(t).iter().filter(|h| h.reason == "Rerun").count()
}

#[tokio::test]
async fn submit_wait_list_and_describe_a_task() {
    let (client, ns) = namespace_with_leader("cli-submit").await;

    let submitted = ax(
        &ns,
        &[
            "submit",
            "--type",
            "cli-hello",
            "--image",
            "localhost/ax-busybox:1",
            "--image-pull-policy",
            "Never",
            "--command",
            "echo hello from $AX_TASK; cat /var/run/ax/payload.json",
            "--payload",
            r#"{"greeting": "hi"}"#,
            "--priority",
            "high",
            "--max-retries",
            "2",
            "--hard-timeout",
            "2m",
            "--label",
            &format!("run={ns}"),
        ],
    )
    .ok();
    let name = submitted.stdout.trim().to_string();
    assert!(
        name.starts_with("cli-hello-") && !name.contains(char::is_whitespace),
        "submit prints the name: {submitted:#?}"
    );
    let t = task_of(&client, &ns, &name).await;
    assert_eq!(t.spec.retry.max_retries, 2);
    assert_eq!(t.spec.timeout.hard_seconds, 120);
    assert_eq!(t.spec.payload.as_ref().unwrap()["greeting"], "hi");

    let waited = wait_succeeded(&ns, &name).await;
    assert_eq!(waited.stdout.trim(), format!("axtask/{name} Succeeded"));

    // A file with overrides: the example, renamed and with another command.
    let from_file = ax(
        &ns,
        &[
            "submit",
            "-f",
            repo_root().join("examples/hello.yaml").to_str().unwrap(),
            "--name",
            "from-file",
            "--command",
            "echo overridden",
        ],
    )
    .ok();
    assert_eq!(from_file.stdout.trim(), "from-file");
    ax_async(&ns, &["wait", "from-file", "--timeout", "2m"])
        .await
        .ok();

    let list = ax(&ns, &["list"]).ok();
    let rows = table_rows(&list.stdout);
    let row = rows
        .iter()
        .find(|r| r["NAME"] == name)
        .unwrap_or_else(|| panic!("{name} listed: {}", list.stdout));
    assert_eq!(row["PHASE"], "Succeeded");
    assert_eq!(row["TYPE"], "cli-hello");
    assert_eq!(row["PRIORITY"], "High");
    assert_eq!(row["ATTEMPT"], "1");
    assert_eq!(row["REASON"], "Completed");
    assert!(row.contains_key("LAST-CHANGE") && row.contains_key("AGE"));
    assert_eq!(rows.len(), 2, "{}", list.stdout);

    // Filters: type, phase, labels; other formats.
    let by_type = ax(&ns, &["ls", "--type", "cli-hello", "-o", "name"]).ok();
    assert_eq!(by_type.stdout.trim(), format!("axtask.ax.dev/{name}"));
    let selector = format!("run={ns}");
    let by_label = ax(&ns, &["list", "-l", &selector, "-o", "name"]).ok();
    assert_eq!(by_label.stdout.trim(), format!("axtask.ax.dev/{name}"));
    let none_dead = ax(&ns, &["list", "--phase", "Dead,Canceled"]).ok();
    assert_eq!(none_dead.stdout, "", "{none_dead:#?}");
    let json = ax(&ns, &["list", "--phase", "succeeded", "-o", "json"]).ok();
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(doc["kind"], "List");
    assert_eq!(doc["items"].as_array().unwrap().len(), 2);
    let yaml = ax(&ns, &["list", "-o", "yaml", "-l", &selector]).ok();
    let doc: serde_json::Value = ax::yaml::from_str(&yaml.stdout).expect("YAML");
    assert_eq!(doc["items"][0]["metadata"]["name"], name.as_str());
    // -A: the namespace column; the label is unique to this run.
    let wide = ax(&ns, &["list", "-o", "wide", "-A", "-l", &selector]).ok();
    let wide_rows = table_rows(&wide.stdout);
    assert_eq!(wide_rows.len(), 1, "{}", wide.stdout);
    assert_eq!(wide_rows[0]["NAMESPACE"], ns);
    assert_eq!(wide_rows[0]["QUEUE"], "default");
    assert_eq!(wide_rows[0]["NODE"], "localhost");

    // describe: the history as a table, one row per attempt.
    let text = ax(&ns, &["describe", &name]).ok().stdout;
    assert!(
        text.contains("Phase:         Succeeded (Completed)"),
        "{text}"
    );
    let history: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "History:")
        .skip(1)
        .collect();
    let header: Vec<&str> = history[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "TIME", "FROM", "TO", "ATTEMPT", "REASON", "ACTOR", "MESSAGE"
        ]
    );
    let transitions: Vec<(String, String)> = history[1..]
        .iter()
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect();
    let t = task_of(&client, &ns, &name).await;
    let want: Vec<(String, String)> = history_of(&t);
    assert_eq!(transitions, want, "{text}");
    let attempts: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Attempts:")
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(attempts.len(), 1, "{text}");
    let cells: Vec<&str> = attempts[0].split_whitespace().collect();
    assert_eq!(
        &cells[..5],
        ["1", &format!("{name}-1"), "localhost", "Succeeded", "0"],
        "{text}"
    );
}

fn history_of(t: &AxTask) -> Vec<(String, String)> {
    history(t)
        .iter()
        .map(|h| {
            (
                h.from.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                h.to.to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn wait_fails_for_a_task_that_ends_otherwise_and_on_timeout() {
    let (client, ns) = namespace_with_leader("cli-wait").await;
    create(&client, &ns, &sim_task("doomed", 200, 1, json!({}))).await;
    let dead = ax_async(
        &ns,
        &["wait", "doomed", "--for", "succeeded", "--timeout", "2m"],
    )
    .await;
    let line = dead.one_line_error();
    assert!(
        line.contains("axtask/doomed ended Dead") && line.contains("not Succeeded"),
        "{line}"
    );
    assert_eq!(dead.code, 1, "the task ended otherwise: exit 1");
    // --for terminal accepts Dead.
    ax(&ns, &["wait", "doomed"]).ok();

    let mut hanging = sim_task("hangs", 0, 0, json!({}));
    hanging.spec.template.spec = Some(serde_json::from_value(sim_pod_spec(0, 0, true)).unwrap());
    create(&client, &ns, &hanging).await;
    let timed_out = ax_async(&ns, &["wait", "hangs", "--timeout", "3s"]).await;
    let line = timed_out.one_line_error();
    assert!(
        line.contains("timed out after 3s") && line.contains("axtask/hangs is"),
        "{line}"
    );
    assert_eq!(timed_out.code, 3, "a wait that timed out: exit 3");
    ax(&ns, &["cancel", "hangs"]).ok();
}

#[tokio::test]
async fn list_watch_prints_each_change() {
    let (client, ns) = namespace_with_leader("cli-watch").await;
    // One finished task, so the initial list prints something: then the watch is known to run.
    create(&client, &ns, &sim_task("before", 100, 0, json!({}))).await;
    wait_phase(&client, &ns, "before", TaskPhase::Succeeded, LONG).await;
    let mut child = Command::new(bin())
        .args(["list", "--watch", "-n", &ns])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start list --watch");
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = |what: &str| {
        lines_rx
            .recv_timeout(LONG)
            .unwrap_or_else(|_| panic!("no {what} from list --watch"))
    };
    assert!(next_line("header").starts_with("NAME "));
    assert!(next_line("initial row").starts_with("before "));

    create(&client, &ns, &sim_task("watched", 300, 0, json!({}))).await;
    let mut rows: Vec<String> = Vec::new();
    loop {
        let line = next_line("row of the new task");
        let done = line.starts_with("watched ") && line.contains(" Succeeded ");
        rows.push(line);
        if done {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        rows.len() >= 2 && rows.iter().all(|l| l.starts_with("watched ")),
        "one row per change of the new task: {rows:#?}"
    );
}

#[tokio::test]
async fn logs_of_each_attempt() {
    let (client, ns) = namespace_with_leader("cli-logs").await;
    create(
        &client,
        &ns,
        &real_task(
            "twice",
            "echo \"output of attempt $AX_ATTEMPT\"; [ \"$AX_ATTEMPT\" -ge 2 ]",
            1,
        ),
    )
    .await;
    wait_succeeded(&ns, "twice").await;
    let latest = ax(&ns, &["logs", "twice"]).ok();
    assert_eq!(latest.stdout.trim(), "output of attempt 2");
    let first = ax(&ns, &["logs", "twice", "--attempt", "1"]).ok();
    assert_eq!(first.stdout.trim(), "output of attempt 1");
    let previous = ax(&ns, &["logs", "twice", "--previous"]).ok();
    assert_eq!(previous.stdout.trim(), "output of attempt 1");
    let followed = ax(&ns, &["logs", "twice", "-f"]).ok();
    assert_eq!(followed.stdout.trim(), "output of attempt 2");
    let none = ax(&ns, &["logs", "twice", "--attempt", "3"]);
    assert!(none.one_line_error().contains("no attempt 3"), "{none:#?}");
}

#[tokio::test]
async fn cancel_by_selector_cancels_twenty_running_tasks() {
    let (client, ns) = namespace_with_leader("cli-cancel").await;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for i in 0..20 {
        let mut t = sim_task(&format!("run-{i:02}"), 0, 0, json!({"batch": "b1"}));
        t.spec.template.spec = Some(serde_json::from_value(sim_pod_spec(0, 0, true)).unwrap());
        api.create(&PostParams::default(), &t).await.unwrap();
    }
    // One task outside the selector, which must keep running.
    let mut other = sim_task("other", 0, 0, json!({"batch": "b2"}));
    other.spec.template.spec = Some(serde_json::from_value(sim_pod_spec(0, 0, true)).unwrap());
    api.create(&PostParams::default(), &other).await.unwrap();
    let deadline = Instant::now() + LONG;
    loop {
        let tasks = api.list(&ListParams::default()).await.unwrap().items;
        let running = tasks
            .iter()
            .filter(|t| phase(t) == Some(TaskPhase::Running))
            .count();
        if running == 21 {
            break;
        }
        assert!(Instant::now() < deadline, "only {running} of 21 Running");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // More than one match: it asks, and anything but yes cancels nothing.
    let refused = ax_with(&["cancel", "-l", "batch=b1", "-n", &ns], Some("n\n"), &[]);
    assert!(
        refused.stderr.contains("Cancel 20 tasks in namespace"),
        "{refused:#?}"
    );
    assert_ne!(refused.code, 0);
    let tasks = api.list(&ListParams::default()).await.unwrap().items;
    assert!(tasks.iter().all(|t| !t.spec.cancel), "nothing canceled yet");

    let done = ax_with(&["cancel", "-l", "batch=b1", "-n", &ns], Some("y\n"), &[]).ok();
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 20, "{done:#?}");
    assert!(
        lines
            .iter()
            .all(|l| l.ends_with("cancel requested (was Running)"))
    );

    for i in 0..20 {
        wait_phase(
            &client,
            &ns,
            &format!("run-{i:02}"),
            TaskPhase::Canceled,
            LONG,
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + LONG;
    loop {
        let left: Vec<String> = pods
            .list(&ListParams::default().labels("ax.dev/task"))
            .await
            .unwrap()
            .items
            .iter()
            .map(|p| p.name_any())
            .filter(|n| n.starts_with("run-"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "pods left: {left:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        phase(&api.get("other").await.unwrap()),
        Some(TaskPhase::Running)
    );
    // By queue, with --yes: the one left. Finished tasks are not matched again.
    let by_queue = ax(&ns, &["cancel", "--queue", "default", "--yes"]).ok();
    assert_eq!(
        by_queue.stdout.trim(),
        "axtask/other: cancel requested (was Running)"
    );
    wait_phase(&client, &ns, "other", TaskPhase::Canceled, LONG).await;
}

/// A queue of the test's own, deleted when the test ends.
struct TestQueue(String);

impl Drop for TestQueue {
    fn drop(&mut self) {
        run_kubectl(
            &[
                "delete",
                "axqueue",
                &self.0,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

fn queue_status_cells(q: &AxQueue) -> Vec<String> {
    let s = q.status.clone().unwrap_or_default();
    vec![
        q.name_any(),
        s.pending.critical.to_string(),
        s.pending.high.to_string(),
        s.pending.normal.to_string(),
        s.pending.low.to_string(),
        format!("{}/{}", s.running, q.spec.concurrency),
        if s.open_circuits.is_empty() {
            "-".into()
        } else {
            s.open_circuits.join(",")
        },
        s.retry_tokens.to_string(),
        s.dispatched.to_string(),
        s.dead.to_string(),
    ]
}

#[tokio::test]
async fn top_shows_the_queue_status_while_tasks_flow() {
    let (client, ns) = namespace_with_leader("cli-top").await;
    let name = format!("e2e-cli-top-{:04x}", rand::random::<u16>());
    let queues: Api<AxQueue> = Api::all(client.clone());
    let queue: AxQueue = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
        "metadata": {"name": name},
        "spec": {"concurrency": 2},
    }))
    .unwrap();
    queues.create(&PostParams::default(), &queue).await.unwrap();
    let _guard = TestQueue(name.clone());
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for i in 0..10 {
        let mut t = sim_task(&format!("flow-{i}"), 3000, i32::from(i % 5 == 0), json!({}));
        t.spec.queue = name.clone();
        if i % 2 == 0 {
            t.spec.priority = ax::api::Priority::Low;
        }
        api.create(&PostParams::default(), &t).await.unwrap();
    }
    // Compare with a status that did not change around the run, while tasks are in flight.
    let deadline = Instant::now() + LONG;
    let mut compared = 0;
    while compared < 3 {
        let before = queues.get(&name).await.unwrap();
        let run = ax_async(&ns, &["top", &name]).await.ok();
        let after = queues.get(&name).await.unwrap();
        let s = before.status.clone().unwrap_or_default();
        let in_flight = s.running > 0
            || s.pending.critical + s.pending.high + s.pending.normal + s.pending.low > 0;
        if before.resource_version() == after.resource_version() && in_flight {
            let lines: Vec<&str> = run.stdout.lines().collect();
            assert_eq!(lines.len(), 2, "{run:#?}");
            let cells: Vec<String> = lines[1].split_whitespace().map(str::to_string).collect();
            assert_eq!(cells, queue_status_cells(&before), "{}", run.stdout);
            compared += 1;
        }
        assert!(
            Instant::now() < deadline,
            "never saw a steady in-flight status ({compared} compared)"
        );
    }

    // --watch redraws from a watch: the first table names the queue.
    let mut child = Command::new(bin())
        .args(["top", "--watch", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        first.push(line);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first[1].starts_with("QUEUE "), "{first:?}");
    assert!(first[2].starts_with(&name), "{first:?}");

    for i in 0..10 {
        wait_task(&client, &ns, &format!("flow-{i}"), LONG, |t| {
            phase(t).is_some_and(TaskPhase::is_terminal)
        })
        .await;
    }
    // At rest the totals agree too, once the queue's status (written every 2 s) shows the rest.
    let deadline = Instant::now() + LONG;
    let q = loop {
        let q = queues.get(&name).await.unwrap();
        if q.status.as_ref().is_some_and(|s| s.running == 0) {
            break q;
        }
        assert!(
            Instant::now() < deadline,
            "the queue never showed 0 running"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let run = ax(&ns, &["top", &name]).ok();
    let cells: Vec<String> = run
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let want = queue_status_cells(&q);
    assert_eq!(cells[..7], want[..7], "{}", run.stdout);
    assert_eq!(cells[8..], want[8..], "{}", run.stdout);
}

fn dag_manifest(name: &str, tasks: serde_json::Value) -> AxDag {
    serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": name},
        "spec": {"tasks": tasks},
    }))
    .unwrap()
}

fn sim_step(millis: u64) -> serde_json::Value {
    json!({"type": "cli-step", "retry": {"maxRetries": 0}, "template": {"spec": sim_pod_spec(millis, 0, false)}})
}

#[tokio::test]
async fn dag_draws_the_graph_by_levels() {
    let (client, ns) = namespace_with_leader("cli-dag").await;
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    let dag = dag_manifest(
        "diamond",
        json!([
            {"name": "d", "dependsOn": ["b", "c"], "spec": sim_step(200)},
            {"name": "a", "spec": sim_step(200)},
            {"name": "b", "dependsOn": ["a"], "spec": sim_step(200)},
            {"name": "c", "dependsOn": ["a"], "spec": sim_step(200)},
        ]),
    );
    dags.create(&PostParams::default(), &dag).await.unwrap();
    wait_succeeded(&ns, "dag/diamond").await;
    let text = ax(&ns, &["dag", "diamond"]).ok().stdout;
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("axdag/diamond   Succeeded   4/4 finished"),
        "{text}"
    );
    let rows = table_rows(&lines[1..].join("\n"));
    let drawn: Vec<(String, String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["LEVEL"].clone(),
                r["TASK"].clone(),
                r["PHASE"].clone(),
                r["CHILD"].clone(),
            )
        })
        .collect();
    let want: Vec<(String, String, String, String)> =
        [("0", "a"), ("1", "b"), ("1", "c"), ("2", "d")]
            .iter()
            .map(|(l, t)| {
                (
                    l.to_string(),
                    t.to_string(),
                    "Succeeded".to_string(),
                    format!("diamond-{t}"),
                )
            })
            .collect();
    assert_eq!(drawn, want, "{text}");
    assert!(lines.last().unwrap().ends_with("b, c"), "{text}");
    let listed = table_rows(&ax(&ns, &["dag"]).ok().stdout);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["PHASE"], "Succeeded");
    assert_eq!(listed[0]["PROGRESS"], "4/4");
}

#[tokio::test]
async fn concurrent_retries_request_one_re_run() {
    let (client, ns) = namespace_with_leader("cli-race").await;
    // Dead after attempt 1; a re-run (attempt 2) keeps running, so it cannot finish and be
    // re-run again while the concurrent retries below look at it.
    create(
        &client,
        &ns,
        &real_task("dead", "[ \"$AX_ATTEMPT\" -ge 2 ] && sleep 120; exit 1", 0),
    )
    .await;
    wait_phase(&client, &ns, "dead", TaskPhase::Dead, LONG).await;

    let dry = ax(&ns, &["retry", "dead", "--dry-run"]).ok();
    assert_eq!(
        dry.stdout.trim(),
        "axtask/dead: would be re-run (spec.rerun 0 -> 1; Dead after attempt 1) [server dry run]"
    );
    assert_eq!(task_of(&client, &ns, "dead").await.spec.rerun, 0);

    let runs: Vec<Run> =
        futures::future::join_all((0..5).map(|_| ax_async(&ns, &["retry", "dead"]))).await;
    let requested = runs
        .iter()
        .filter(|r| r.code == 0 && r.stdout.contains("re-run requested (spec.rerun 1"))
        .count();
    assert_eq!(requested, 1, "exactly one run makes the request: {runs:#?}");
    for r in &runs {
        // The others saw it: still requested, or already started by the operator.
        assert!(
            r.stdout.contains("re-run requested (spec.rerun 1")
                || r.stdout.contains("already requested (spec.rerun 1")
                || r.stderr.contains("not finished"),
            "{r:#?}"
        );
    }
    assert_eq!(task_of(&client, &ns, "dead").await.spec.rerun, 1);
    ax(&ns, &["cancel", "dead"]);
}

#[tokio::test]
async fn errors_are_one_line_with_a_non_zero_exit() {
    let (client, ns) = namespace_with_leader("cli-errors").await;

    // Unknown task: the namespace searched is named.
    for args in [
        vec!["describe", "nope"],
        vec!["retry", "nope"],
        vec!["cancel", "nope"],
        vec!["logs", "nope"],
        vec!["wait", "nope"],
        vec!["dag", "nope"],
    ] {
        let line = ax(&ns, &args).one_line_error();
        let kind = if args[0] == "dag" { "axdag" } else { "axtask" };
        assert!(
            line.contains(&format!("{kind} \"nope\" not found in namespace \"{ns}\"")),
            "{args:?}: {line}"
        );
    }

    // Bad input.
    let line = ax(&ns, &["retry"]).one_line_error();
    assert!(line.contains("name the tasks to re-run"), "{line}");
    let line = ax(&ns, &["list", "--phase", "Finished"]).one_line_error();
    assert!(line.contains("not a phase"), "{line}");
    let line = ax(&ns, &["retry", "--phase", "Running"]).one_line_error();
    assert!(line.contains("finished tasks only"), "{line}");
    let line = ax(&ns, &["submit", "--image", "x"]).one_line_error();
    assert!(line.contains("--type is required"), "{line}");

    // No permission: the verb and the resource are named.
    create(&client, &ns, &sim_task("done", 100, 0, json!({}))).await;
    wait_phase(&client, &ns, "done", TaskPhase::Succeeded, LONG).await;
    let kubeconfig = read_only_kubeconfig(&ns).await;
    let kc = kubeconfig.to_str().unwrap();
    ax_with(&["list", "-n", &ns, "--kubeconfig", kc], None, &[]).ok();
    let line =
        ax_with(&["retry", "done", "-n", &ns, "--kubeconfig", kc], None, &[]).one_line_error();
    assert!(
        line.contains(&format!(
            "no permission to patch axtasks.ax.dev in namespace \"{ns}\" as \"system:serviceaccount:{ns}:viewer\""
        )),
        "{line}"
    );
    let line = ax_with(&["top", "--kubeconfig", kc], None, &[]).one_line_error();
    assert!(
        line.contains("no permission to list axqueues.ax.dev cluster-wide"),
        "{line}"
    );
    let line = ax_with(&["dag", "-n", &ns, "--kubeconfig", kc], None, &[]).one_line_error();
    assert!(
        line.contains("no permission to list axdags.ax.dev"),
        "{line}"
    );

    // Operator not running: a Lease of the test's own, expired, without holder, or missing.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let stale = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    for (name, holder) in [("stale", Some("gone-operator")), ("released", None)] {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": stale.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
        }))
        .unwrap();
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
    let line = ax(
        &ns,
        &[
            "retry",
            "done",
            "--operator-namespace",
            &ns,
            "--operator-lease",
            "stale",
        ],
    )
    .one_line_error();
    assert!(
        line.contains(&format!(
            "the ax operator is not running: Lease {ns}/stale held by \"gone-operator\" expired"
        )),
        "{line}"
    );
    let line = ax_with(
        &["cancel", "done", "-n", &ns],
        None,
        &[
            ("AX_OPERATOR_NAMESPACE", &ns),
            ("AX_OPERATOR_LEASE", "released"),
        ],
    );
    // A finished task needs no cancel: no request, so no check.
    assert_eq!(line.code, 0, "{line:#?}");
    let line = ax_with(
        &["retry", "done", "-n", &ns],
        None,
        &[
            ("AX_OPERATOR_NAMESPACE", &ns),
            ("AX_OPERATOR_LEASE", "released"),
        ],
    )
    .one_line_error();
    assert!(
        line.contains(&format!("Lease {ns}/released has no holder")),
        "{line}"
    );
    let line = ax(
        &ns,
        &[
            "submit",
            "--type",
            "x",
            "--image",
            "x",
            "--operator-namespace",
            &ns,
        ],
    )
    .one_line_error();
    assert!(
        line.contains(&format!("Lease {ns}/ax-operator does not exist")),
        "{line}"
    );
    assert_eq!(
        task_of(&client, &ns, "done").await.spec.rerun,
        0,
        "nothing was requested"
    );
    let tasks: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        tasks
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

#[tokio::test]
async fn make_run_puts_kubectl_ax_on_the_path_of_cluster_env() {
    let (_, ns) = namespace_with_leader("cli-path").await;
    let cache = tempfile::tempdir().unwrap();
    let root = repo_root();
    let out = Command::new(root.join("e2e/run-operator.sh"))
        .args(["plugin", bin()])
        .env("AX_CACHE", cache.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "run-operator.sh plugin: {out:?}");
    // What a user types after `make run`: the env line, then `kubectl ax`.
    let script = format!(
        "eval \"$({} env)\" && kubectl ax version --client && kubectl ax list -n {ns} && command -v kubectl-ax",
        root.join("e2e/cluster.sh").display()
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .env("AX_CACHE", cache.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.starts_with("kubectl-ax 0.1.0\n"), "{stdout}");
    assert!(
        stdout
            .trim_end()
            .ends_with(&format!("{}/tools/kubectl-ax", cache.path().display())),
        "{stdout}"
    );
    // Shell completion.
    let bash = ax_with(&["completion", "bash"], None, &[]).ok();
    assert!(
        bash.stdout.contains("complete -F _kubectl__ax"),
        "{}",
        &bash.stdout[..200.min(bash.stdout.len())]
    );
    let zsh = ax_with(&["completion", "zsh"], None, &[]).ok();
    assert!(zsh.stdout.contains("#compdef kubectl-ax"));
    let version = ax_with(&["version"], None, &[]).ok();
    assert!(version.stdout.contains("server     v1."), "{version:#?}");
}

// ---------------------------------------------------------------------------------------------
// Re-runs: these need the operator to act on spec.rerun (issue 11, the operator side).
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn retry_re_runs_a_dead_task_as_a_new_attempt() {
    let (client, ns) = namespace_with_leader("cli-rerun").await;
    let (seen, watch) = record_worker_pods(&client, &ns);
    // Fails on attempt 1 with no retries left; succeeds on any later attempt.
    create(
        &client,
        &ns,
        &real_task(
            "phoenix",
            "echo \"attempt $AX_ATTEMPT\"; [ \"$AX_ATTEMPT\" -ge 2 ]",
            0,
        ),
    )
    .await;
    ax_async(&ns, &["wait", "phoenix", "--timeout", "2m"])
        .await
        .ok();
    let dead = task_of(&client, &ns, "phoenix").await;
    assert_eq!(phase(&dead), Some(TaskPhase::Dead));
    let dead_history = history(&dead);

    let retried = ax(&ns, &["retry", "phoenix"]).ok();
    assert_eq!(
        retried.stdout.trim(),
        "axtask/phoenix: re-run requested (spec.rerun 1; was Dead after attempt 1)"
    );
    wait_succeeded(&ns, "phoenix").await;
    let t = task_of(&client, &ns, "phoenix").await;
    let s = t.status.clone().unwrap();
    assert_eq!(s.attempt, 2, "{:#?}", s.history);
    assert_eq!(s.observed_rerun, 1);
    assert_eq!(
        &history(&t)[..dead_history.len()],
        &dead_history[..],
        "the history is kept"
    );
    let rerun: Vec<_> = history(&t)
        .into_iter()
        .filter(|h| h.reason == "Rerun")
        .collect();
    assert_eq!(rerun.len(), 1, "{:#?}", s.history);
    assert_eq!(rerun[0].actor, "user");
    assert_eq!(
        ax(&ns, &["logs", "phoenix"]).ok().stdout.trim(),
        "attempt 2"
    );
    let text = ax(&ns, &["describe", "phoenix"]).ok().stdout;
    assert!(text.contains("Rerun"), "{text}");

    // Once more on the Succeeded task: exactly one more run.
    ax(&ns, &["retry", "phoenix"]).ok();
    wait_succeeded(&ns, "phoenix").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t = task_of(&client, &ns, "phoenix").await;
    let s = t.status.clone().unwrap();
    assert_eq!((s.attempt, s.observed_rerun), (3, 2), "{:#?}", s.history);
    assert_eq!(rerun_entries(&t), 2);
    assert_eq!(phase(&t), Some(TaskPhase::Succeeded));
    watch.abort();
    let seen = seen.lock().unwrap();
    let attempts: BTreeMap<String, usize> = seen
        .iter()
        .map(|((_, attempt), uids)| (attempt.clone(), uids.len()))
        .collect();
    assert_eq!(
        attempts,
        [("1", 1), ("2", 1), ("3", 1)]
            .into_iter()
            .map(|(a, n)| (a.to_string(), n))
            .collect(),
        "one new pod per re-run, names unique"
    );
}

/// Removes a directory of the host when the test ends, also when it fails.
struct RemoveDir(String);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn retry_of_a_dag_re_runs_only_the_dead_branch() {
    let (client, ns) = namespace_with_leader("cli-dag-retry").await;
    let (seen, watch) = record_worker_pods(&client, &ns);
    // b fails the first time it runs on this node and succeeds after: a marker on the host.
    let marker_dir = format!("/tmp/ax-e2e-cli/{ns}");
    let _cleanup = RemoveDir(marker_dir.clone());
    let flaky = json!({
        "type": "cli-step",
        "retry": {"maxRetries": 0},
        "template": {"spec": {
            "dnsPolicy": "Default",
            "volumes": [{"name": "marker", "hostPath": {"path": marker_dir, "type": "DirectoryOrCreate"}}],
            "containers": [{
                "name": "worker", "image": "localhost/ax-busybox:1", "imagePullPolicy": "Never",
                "command": ["sh", "-c", "if [ -e /marker/ran ]; then echo second; else touch /marker/ran; echo first; exit 1; fi"],
                "volumeMounts": [{"name": "marker", "mountPath": "/marker"}],
            }],
        }},
    });
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    let dag = dag_manifest(
        "branches",
        json!([
            {"name": "a", "spec": sim_step(100)},
            {"name": "b", "dependsOn": ["a"], "spec": flaky},
            {"name": "c", "dependsOn": ["a"], "spec": sim_step(100)},
            {"name": "d", "dependsOn": ["b"], "spec": sim_step(100)},
        ]),
    );
    dags.create(&PostParams::default(), &dag).await.unwrap();
    let failed = ax_async(
        &ns,
        &[
            "wait",
            "dag/branches",
            "--for",
            "succeeded",
            "--timeout",
            "2m",
        ],
    )
    .await;
    assert!(
        failed
            .one_line_error()
            .contains("axdag/branches ended Failed"),
        "{failed:#?}"
    );
    let drawn = ax(&ns, &["dag", "branches"]).ok().stdout;
    assert!(
        drawn.contains("Dead") && drawn.contains("Skipped"),
        "{drawn}"
    );

    let retried = ax(&ns, &["retry", "dag/branches"]).ok();
    assert!(
        retried
            .stdout
            .starts_with("axdag/branches: re-run requested (spec.rerun 1"),
        "{retried:#?}"
    );
    wait_succeeded(&ns, "dag/branches").await;
    watch.abort();
    let seen = seen.lock().unwrap();
    let runs = |task: &str| -> usize {
        seen.iter()
            .filter(|((t, _), _)| t == &format!("branches-{task}"))
            .map(|(_, uids)| uids.len())
            .sum()
    };
    assert_eq!(
        (runs("a"), runs("c")),
        (1, 1),
        "what succeeded is kept: {seen:?}"
    );
    assert_eq!(runs("b"), 2, "the dead branch ran again: {seen:?}");
    assert_eq!(runs("d"), 1, "and what depends on it: {seen:?}");
}

#[tokio::test]
async fn cron_list_trigger_suspend_and_resume() {
    let (client, ns) = namespace_with_leader("cli-cron").await;
    // Once a year: nothing fires during the test but the manual run.
    let cron: AxCron = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxCron",
        "metadata": {"name": "yearly"},
        "spec": {"schedule": "0 0 1 1 *", "timeZone": "Europe/Berlin",
            "task": {"type": "cli-cron", "retry": {"maxRetries": 0},
                "template": {"spec": sim_pod_spec(100, 0, false)}}},
    }))
    .unwrap();
    let crons: Api<AxCron> = Api::namespaced(client.clone(), &ns);
    crons.create(&PostParams::default(), &cron).await.unwrap();
    wait_for(&client, &ns, "yearly", LONG, |c: &AxCron| {
        c.status
            .as_ref()
            .is_some_and(|s| s.next_schedule_time.is_some())
    })
    .await;

    let list = ax(&ns, &["cron", "list"]).ok();
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{list:#?}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "NEXT", "STATUS"
        ]
    );
    assert!(lines[1].starts_with("yearly"), "{list:#?}");
    assert!(lines[1].contains("Europe/Berlin"), "{list:#?}");
    assert!(lines[1].ends_with("Scheduled"), "{list:#?}");

    // Fire now: one child from the template, owned by the cron, that runs like any task.
    let fired = ax(&ns, &["cron", "trigger", "yearly"]).ok();
    let child = fired
        .stdout
        .trim()
        .strip_prefix("axtask/")
        .and_then(|rest| rest.split_once(' '))
        .map(|(name, _)| name.to_string())
        .unwrap_or_else(|| panic!("{fired:#?}"));
    assert!(child.starts_with("yearly-manual-"), "{fired:#?}");
    let done = wait_task(&client, &ns, &child, LONG, |t| {
        phase(t).is_some_and(TaskPhase::is_terminal)
    })
    .await;
    assert_eq!(phase(&done), Some(TaskPhase::Succeeded));
    assert_eq!(done.labels()["ax.dev/cron"], "yearly");
    assert_eq!(done.owner_references()[0].kind, "AxCron");
    let after = crons.get("yearly").await.unwrap();
    assert!(
        after.status.unwrap().last_schedule_time.is_none(),
        "a manual run is no firing of the schedule"
    );

    // Suspend and resume through the spec; the operator reports each.
    let suspended = ax(&ns, &["cron", "suspend", "yearly"]).ok();
    assert_eq!(suspended.stdout.trim(), "axcron/yearly suspended");
    wait_for(&client, &ns, "yearly", LONG, |c: &AxCron| {
        c.spec.suspend && cron_suspended(c) == Some("True")
    })
    .await;
    let list = ax(&ns, &["cron", "list", "--no-headers"]).ok();
    assert!(list.stdout.trim_end().ends_with("Suspended"), "{list:#?}");
    let resumed = ax(&ns, &["cron", "resume", "yearly"]).ok();
    assert_eq!(resumed.stdout.trim(), "axcron/yearly resumed");
    wait_for(&client, &ns, "yearly", LONG, |c: &AxCron| {
        !c.spec.suspend && cron_suspended(c) == Some("False")
    })
    .await;

    let missing = ax(&ns, &["cron", "trigger", "nope"]).one_line_error();
    assert!(
        missing.contains("axcron \"nope\" not found in namespace"),
        "{missing}"
    );
}

fn cron_suspended(c: &AxCron) -> Option<&str> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|k| k.type_ == "Suspended")
        .map(|k| k.status.as_str())
}

/// `suspend`/`resume` of tasks by name and selector, and of a queue (`queue/NAME`): what they
/// print and what the operator then does.
#[tokio::test]
async fn suspend_and_resume_tasks_and_a_queue() {
    let (client, ns) = namespace_with_leader("cli-suspend").await;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    for name in ["a", "b"] {
        let mut t = sim_task(name, 100, 0, json!({"batch": "s1"}));
        t.spec.suspend = true;
        api.create(&PostParams::default(), &t).await.unwrap();
    }
    for name in ["a", "b"] {
        wait_task(&client, &ns, name, LONG, |t| {
            t.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Suspended" && c.status == "True")
            })
        })
        .await;
    }
    let described = ax_async(&ns, &["describe", "a"]).await.ok();
    assert!(described.stdout.contains("Suspend"), "{described:#?}");

    // By name; the server dry run changes nothing.
    let dry = ax_async(&ns, &["resume", "a", "--dry-run"]).await.ok();
    assert_eq!(dry.stdout.trim(), "axtask/a resumed (server dry run)");
    assert!(api.get("a").await.unwrap().spec.suspend);
    let resumed = ax_async(&ns, &["resume", "a"]).await.ok();
    assert_eq!(resumed.stdout.trim(), "axtask/a resumed");
    wait_phase(&client, &ns, "a", TaskPhase::Succeeded, LONG).await;
    assert_eq!(
        phase(&api.get("b").await.unwrap()),
        Some(TaskPhase::Pending)
    );
    // By selector: only what it changes (b).
    let resumed = ax_async(&ns, &["resume", "-l", "batch=s1"]).await.ok();
    assert_eq!(resumed.stdout.trim(), "axtask/b resumed", "{resumed:#?}");
    wait_phase(&client, &ns, "b", TaskPhase::Succeeded, LONG).await;

    // A queue: held, then let go.
    let queue = common::queue::create_queue(&client, "cli-stop", json!({})).await;
    let target = format!("queue/{}", queue.name);
    let held = ax_async(&ns, &["suspend", &target]).await.ok();
    assert_eq!(
        held.stdout.trim(),
        format!("axqueue/{} suspended (stopPolicy Hold)", queue.name)
    );
    let mut t = sim_task("c", 100, 0, json!({}));
    t.spec.queue = queue.name.clone();
    api.create(&PostParams::default(), &t).await.unwrap();
    wait_task(&client, &ns, "c", LONG, |t| {
        t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Queued" && c.reason == "QueueHeld")
        })
    })
    .await;
    let top = ax_async(&ns, &["top", &queue.name]).await.ok();
    assert!(top.stdout.contains("(Hold)"), "{top:#?}");
    ax_async(&ns, &["resume", &target]).await.ok();
    wait_phase(&client, &ns, "c", TaskPhase::Succeeded, LONG).await;

    // Usage errors exit 2 with one line.
    let usage = ax_async(&ns, &["suspend", "a", "--drain"]).await;
    assert_eq!(usage.code, 2, "{usage:#?}");
    assert!(usage.one_line_error().contains("--drain"));
}

/// Names of the tasks in the namespace, sorted.
async fn task_names(client: &Client, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<AxTask>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|t| t.name_any())
        .collect();
    names.sort();
    names
}

/// `delete` by selector with `--completed`, `--older-than`, both dry runs and the question; by
/// name; a DAG with its children.
#[tokio::test]
async fn delete_finished_tasks_by_selector_name_and_dag() {
    let (client, ns) = namespace_with_leader("cli-delete").await;
    for name in ["done-a", "done-b", "done-c"] {
        create(
            &client,
            &ns,
            &sim_task(name, 100, 0, json!({"batch": "d1"})),
        )
        .await;
    }
    let mut hanging = sim_task("hangs", 0, 0, json!({"batch": "d1"}));
    hanging.spec.template.spec = Some(serde_json::from_value(sim_pod_spec(0, 0, true)).unwrap());
    create(&client, &ns, &hanging).await;
    for name in ["done-a", "done-b", "done-c"] {
        wait_phase(&client, &ns, name, TaskPhase::Succeeded, LONG).await;
    }
    wait_phase(&client, &ns, "hangs", TaskPhase::Running, LONG).await;
    let all_four = vec!["done-a", "done-b", "done-c", "hangs"];

    // Dry runs, client and server: what would go, and nothing goes.
    let dry = ax_async(
        &ns,
        &["delete", "-l", "batch=d1", "--completed", "--dry-run"],
    )
    .await
    .ok();
    assert_eq!(
        dry.stdout,
        "axtask/done-a deleted (dry run)\naxtask/done-b deleted (dry run)\naxtask/done-c deleted (dry run)\n"
    );
    let server = ax_async(
        &ns,
        &[
            "delete",
            "-l",
            "batch=d1",
            "--completed",
            "--dry-run=server",
        ],
    )
    .await
    .ok();
    assert_eq!(server.stdout.lines().count(), 3, "{server:#?}");
    assert!(
        server
            .stdout
            .lines()
            .all(|l| l.ends_with("deleted (server dry run)"))
    );
    assert_eq!(task_names(&client, &ns).await, all_four);

    // Finished just now: not older than an hour.
    let young = ax_async(&ns, &["delete", "--older-than", "1h"]).await.ok();
    assert_eq!(young.stdout.trim(), "nothing to delete: no task matches");

    // Three match: it asks, and anything but yes deletes nothing (exit 2).
    let args = ["delete", "-l", "batch=d1", "--completed", "-n", &ns];
    let refused = ax_with(&args, Some("n\n"), &[]);
    assert!(
        refused.stderr.contains("Delete 3 objects in namespace"),
        "{refused:#?}"
    );
    assert_eq!(refused.code, 2, "{refused:#?}");
    assert_eq!(task_names(&client, &ns).await, all_four);
    let done = ax_with(&args, Some("y\n"), &[]).ok();
    assert_eq!(
        done.stdout,
        "axtask/done-a deleted\naxtask/done-b deleted\naxtask/done-c deleted\n"
    );
    assert_eq!(task_names(&client, &ns).await, vec!["hangs"]);

    // By name, finished or not; a name that is not there is a one-line error, exit 1.
    let skipped = ax_async(&ns, &["delete", "hangs", "--completed"])
        .await
        .ok();
    assert_eq!(
        skipped.stdout.trim(),
        "axtask/hangs: not finished (Running), skipped"
    );
    let by_name = ax_async(&ns, &["delete", "hangs"]).await.ok();
    assert_eq!(by_name.stdout.trim(), "axtask/hangs deleted");
    assert!(task_names(&client, &ns).await.is_empty());
    let missing = ax_async(&ns, &["delete", "nope"]).await;
    assert!(
        missing
            .one_line_error()
            .contains("axtask \"nope\" not found"),
        "{missing:#?}"
    );
    assert_eq!(missing.code, 1);

    // A DAG: its children go with it (garbage collection of owned objects).
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    let dag = dag_manifest(
        "pair",
        json!([
            {"name": "a", "spec": sim_step(100)},
            {"name": "b", "dependsOn": ["a"], "spec": sim_step(100)},
        ]),
    );
    dags.create(&PostParams::default(), &dag).await.unwrap();
    wait_succeeded(&ns, "dag/pair").await;
    let gone = ax_async(&ns, &["delete", "dag/pair"]).await.ok();
    assert_eq!(gone.stdout.trim(), "axdag/pair deleted");
    let deadline = Instant::now() + LONG;
    while !task_names(&client, &ns).await.is_empty()
        || dags.get_opt("pair").await.unwrap().is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the DAG's children were not collected"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `resubmit`: a new task from an old one's spec, the operator's labels left behind; `--wait`
/// and `--dry-run`.
#[tokio::test]
async fn resubmit_creates_a_fresh_task_from_a_finished_one() {
    let (client, ns) = namespace_with_leader("cli-resubmit").await;
    let mut source = sim_task(
        "origin",
        100,
        0,
        json!({"team": "a", "ax.dev/cron": "gone"}),
    );
    source.metadata.annotations = Some(
        [
            ("note".to_string(), "kept".to_string()),
            ("ax.dev/manual-trigger".to_string(), "true".to_string()),
        ]
        .into(),
    );
    source.spec.priority = ax::api::Priority::High;
    create(&client, &ns, &source).await;
    wait_succeeded(&ns, "origin").await;

    let run = ax_async(&ns, &["resubmit", "origin", "--wait", "--timeout", "2m"])
        .await
        .ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{run:#?}");
    let name = lines[0].to_string();
    assert!(name.starts_with("origin-"), "{run:#?}");
    assert_eq!(lines[1], format!("axtask/{name} Succeeded"));
    let copy = task_of(&client, &ns, &name).await;
    assert_eq!(copy.labels().get("team").map(String::as_str), Some("a"));
    assert!(
        !copy.labels().contains_key("ax.dev/cron"),
        "{:?}",
        copy.labels()
    );
    assert_eq!(
        copy.annotations().get("note").map(String::as_str),
        Some("kept")
    );
    assert!(!copy.annotations().contains_key("ax.dev/manual-trigger"));
    assert_eq!(copy.spec.priority, ax::api::Priority::High);
    assert_eq!(copy.spec.task_type, "cli-sim");
    assert_eq!(copy.status.unwrap().attempt, 1, "a run of its own");

    // Dry runs create nothing: client prints the task, server names what it would create.
    let yaml = ax_async(&ns, &["resubmit", "origin", "--name", "again", "--dry-run"])
        .await
        .ok();
    let doc: serde_json::Value = ax::yaml::from_str(&yaml.stdout).expect("YAML");
    assert_eq!(doc["metadata"]["name"], "again");
    assert_eq!(doc["spec"]["type"], "cli-sim");
    let server = ax_async(
        &ns,
        &["resubmit", "origin", "--name", "again", "--dry-run=server"],
    )
    .await
    .ok();
    assert_eq!(
        server.stdout.trim(),
        "axtask/again created (server dry run)"
    );
    assert_eq!(task_names(&client, &ns).await, {
        let mut want = vec!["origin".to_string(), name.clone()];
        want.sort();
        want
    });
    let missing = ax_async(&ns, &["resubmit", "nope"]).await;
    assert!(
        missing
            .one_line_error()
            .contains("axtask \"nope\" not found")
    );
}

/// `submit --wait`: the name, then the wait's line; exit codes as `wait` (1 when the task ends
/// otherwise, 3 on timeout).
#[tokio::test]
async fn submit_wait_waits_for_success_with_the_exit_codes_of_wait() {
    let (client, ns) = namespace_with_leader("cli-submit-wait").await;
    let manifest = |name: &str, exit_code: i32, hang: bool| {
        let mut t = sim_task(name, 100, exit_code, json!({}));
        t.spec.template.spec =
            Some(serde_json::from_value(sim_pod_spec(100, exit_code, hang)).unwrap());
        serde_json::to_string(&t).unwrap()
    };
    let submit = |name: &str, exit_code: i32, hang: bool, timeout: &str| {
        let text = manifest(name, exit_code, hang);
        let args = [
            "submit".to_string(),
            "-f".into(),
            "-".into(),
            "--wait".into(),
            "--timeout".into(),
            timeout.to_string(),
            "-n".into(),
            ns.clone(),
        ];
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ax_with(&args, Some(&text), &[])
        })
    };
    let ok = submit("fine", 0, false, "2m").await.unwrap().ok();
    assert_eq!(ok.stdout, "fine\naxtask/fine Succeeded\n");

    let dead = submit("broken", 1, false, "2m").await.unwrap();
    assert_eq!(dead.stdout, "broken\n", "{dead:#?}");
    assert!(
        dead.one_line_error().contains("axtask/broken ended Dead"),
        "{dead:#?}"
    );
    assert_eq!(dead.code, 1);

    let slow = submit("slow", 0, true, "3s").await.unwrap();
    assert!(
        slow.one_line_error().contains("timed out after 3s"),
        "{slow:#?}"
    );
    assert_eq!(slow.code, 3);
    ax_async(&ns, &["cancel", "slow"]).await.ok();
    assert_eq!(
        phase(&task_of(&client, &ns, "fine").await),
        Some(TaskPhase::Succeeded)
    );
}

/// `--dry-run=client` decides without sending: nothing changes, and the lines say so.
#[tokio::test]
async fn client_dry_runs_of_suspend_cancel_and_retry_send_nothing() {
    let (client, ns) = namespace_with_leader("cli-dry-client").await;
    let mut hanging = sim_task("held", 0, 0, json!({}));
    hanging.spec.template.spec = Some(serde_json::from_value(sim_pod_spec(0, 0, true)).unwrap());
    create(&client, &ns, &hanging).await;
    create(&client, &ns, &sim_task("failed", 100, 1, json!({}))).await;
    wait_phase(&client, &ns, "failed", TaskPhase::Dead, LONG).await;

    let suspend = ax_async(&ns, &["suspend", "held", "--dry-run=client"])
        .await
        .ok();
    assert_eq!(suspend.stdout.trim(), "axtask/held suspended (dry run)");
    let cancel = ax_async(&ns, &["cancel", "held", "--dry-run=client"])
        .await
        .ok();
    assert!(
        cancel
            .stdout
            .starts_with("axtask/held: cancel requested (was ")
            && cancel.stdout.trim_end().ends_with("[dry run]"),
        "{cancel:#?}"
    );
    let retry = ax_async(&ns, &["retry", "failed", "--dry-run=client"])
        .await
        .ok();
    assert!(
        retry.stdout.contains("would be re-run (spec.rerun 0 -> 1")
            && retry.stdout.contains("[dry run]"),
        "{retry:#?}"
    );
    let held = task_of(&client, &ns, "held").await;
    assert!(!held.spec.suspend && !held.spec.cancel);
    assert_eq!(task_of(&client, &ns, "failed").await.spec.rerun, 0);
    ax_async(&ns, &["cancel", "held"]).await.ok();
}

/// The value after `Label:` on its line of a `describe`.
fn described<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{label}:")))
        .unwrap_or_else(|| panic!("no {label}: in\n{text}"))
        .trim()
}

/// `describe dag/NAME`, `queue/NAME`, `cron/NAME`: each from the real objects.
#[tokio::test]
async fn describe_a_dag_a_queue_and_a_cron() {
    let (client, ns) = namespace_with_leader("cli-describe").await;
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    let dag = dag_manifest(
        "chain",
        json!([
            {"name": "first", "spec": sim_step(100)},
            {"name": "second", "dependsOn": ["first"], "spec": sim_step(100)},
        ]),
    );
    dags.create(&PostParams::default(), &dag).await.unwrap();
    wait_succeeded(&ns, "dag/chain").await;
    let text = ax_async(&ns, &["describe", "dag/chain"]).await.ok().stdout;
    assert_eq!(described(&text, "Phase"), "Succeeded", "{text}");
    assert_eq!(described(&text, "Progress"), "2/2 finished", "{text}");
    let nodes: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| *l != "Tasks:")
        .skip(2)
        .map(|l| l.split_whitespace().take(4).collect())
        .collect();
    assert_eq!(
        nodes,
        vec![
            vec!["0", "first", "Succeeded", "chain-first"],
            vec!["1", "second", "Succeeded", "chain-second"],
        ],
        "{text}"
    );

    let queue =
        common::queue::create_queue(&client, "cli-describe", json!({"concurrency": 3})).await;
    let target = format!("queue/{}", queue.name);
    ax_async(&ns, &["suspend", &target]).await.ok();
    let text = ax_async(&ns, &["describe", &target]).await.ok().stdout;
    assert!(described(&text, "Concurrency").starts_with("3 ("), "{text}");
    assert!(
        described(&text, "Stop policy").starts_with("Hold:"),
        "{text}"
    );
    assert!(described(&text, "Running").starts_with("0 of "), "{text}");
    assert!(text.contains("Pending:\n"), "{text}");

    let cron: AxCron = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxCron",
        "metadata": {"name": "yearly"},
        "spec": {"schedule": "0 0 1 1 *", "timeZone": "Europe/Berlin", "concurrencyPolicy": "Forbid",
            "task": {"type": "cli-cron", "template": {"spec": sim_pod_spec(100, 0, false)}}},
    }))
    .unwrap();
    Api::<AxCron>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cron)
        .await
        .unwrap();
    wait_for(&client, &ns, "yearly", LONG, |c: &AxCron| {
        c.status
            .as_ref()
            .is_some_and(|s| s.next_schedule_time.is_some())
    })
    .await;
    let text = ax_async(&ns, &["describe", "cron/yearly"])
        .await
        .ok()
        .stdout;
    assert_eq!(described(&text, "Schedule"), "0 0 1 1 *", "{text}");
    assert_eq!(described(&text, "Time zone"), "Europe/Berlin", "{text}");
    assert_eq!(described(&text, "Concurrency"), "Forbid", "{text}");
    assert!(described(&text, "Next").contains("(in "), "{text}");
    assert!(text.contains("Active (0):\n  (none)\n"), "{text}");

    let missing = ax_async(&ns, &["describe", "cron/nope"]).await;
    assert!(
        missing
            .one_line_error()
            .contains("axcron \"nope\" not found"),
        "{missing:#?}"
    );
}

/// `-o json|yaml|name|jsonpath=` on the read verbs, kubectl's template syntax included.
#[tokio::test]
async fn read_verbs_print_json_yaml_name_and_jsonpath() {
    let (client, ns) = namespace_with_leader("cli-output").await;
    for name in ["one", "two"] {
        create(&client, &ns, &sim_task(name, 100, 0, json!({}))).await;
    }
    for name in ["one", "two"] {
        wait_phase(&client, &ns, name, TaskPhase::Succeeded, LONG).await;
    }
    let names = ax_async(&ns, &["list", "-o", "jsonpath={.items[*].metadata.name}"])
        .await
        .ok();
    assert_eq!(names.stdout, "one two");
    let template = r#"jsonpath={range .items[*]}{.metadata.name}{"\t"}{.status.phase}{"\n"}{end}"#;
    let rows = ax_async(&ns, &["list", "-o", template]).await.ok();
    assert_eq!(rows.stdout, "one\tSucceeded\ntwo\tSucceeded\n");

    let json = ax_async(&ns, &["describe", "one", "-o", "json"]).await.ok();
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(doc["metadata"]["name"], "one");
    let yaml = ax_async(&ns, &["describe", "one", "-o", "yaml"]).await.ok();
    let doc: serde_json::Value = ax::yaml::from_str(&yaml.stdout).expect("YAML");
    assert_eq!(doc["status"]["phase"], "Succeeded");
    let phase = ax_async(&ns, &["describe", "two", "-o", "jsonpath={.status.phase}"])
        .await
        .ok();
    assert_eq!(phase.stdout, "Succeeded");

    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(
        &PostParams::default(),
        &dag_manifest("solo", json!([{"name": "a", "spec": sim_step(100)}])),
    )
    .await
    .unwrap();
    wait_succeeded(&ns, "dag/solo").await;
    let dag = ax_async(&ns, &["dag", "solo", "-o", "jsonpath={.status.phase}"])
        .await
        .ok();
    assert_eq!(dag.stdout, "Succeeded");
    let listed = ax_async(&ns, &["dag", "-o", "name"]).await.ok();
    assert_eq!(listed.stdout, "axdag.ax.dev/solo\n");

    let queue = common::queue::create_queue(&client, "cli-output", json!({"concurrency": 4})).await;
    let top = ax_async(
        &ns,
        &[
            "top",
            &queue.name,
            "-o",
            "jsonpath={.items[0].spec.concurrency}",
        ],
    )
    .await
    .ok();
    assert_eq!(top.stdout, "4");
    let crons = ax_async(&ns, &["cron", "list", "-o", "json"]).await.ok();
    let doc: serde_json::Value = serde_json::from_str(&crons.stdout).expect("JSON");
    assert_eq!(doc["items"].as_array().unwrap().len(), 0);

    let bad = ax_async(&ns, &["list", "-o", "jsonpath={.items["]).await;
    assert_eq!(bad.code, 2, "{bad:#?}");
}

/// `kubectl ax <TAB>`: kubectl runs kubectl_complete-ax, which offers verbs, and the tasks of
/// the namespace from the cluster; nothing (but the directive) when the cluster is unreachable.
#[tokio::test]
async fn completion_binary_offers_verbs_and_task_names_through_kubectl() {
    let (client, ns) = namespace_with_leader("cli-complete").await;
    for name in ["alpha", "alpine", "beta"] {
        create(&client, &ns, &sim_task(name, 100, 0, json!({}))).await;
    }
    let complete = env!("CARGO_BIN_EXE_kubectl_complete-ax");
    let direct = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(complete);
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(direct(&["res"], &[]), "resume\nresubmit\n:4\n");
    assert_eq!(
        direct(&["describe", "-n", &ns, "alp"], &[]),
        "alpha\nalpine\n:4\n"
    );
    assert_eq!(
        direct(&["describe", "alp"], &[("KUBECONFIG", "/nonexistent")]),
        ":4\n",
        "no cluster: no names, silently"
    );

    // Through kubectl itself (1.26+), with both binaries on PATH as a user has them.
    let dir = std::path::Path::new(complete).parent().unwrap();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());
    let out = Command::new(kubectl())
        .args(["__complete", "ax", "logs", "-n", &ns, "b"])
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, "beta\n:4\n", "{out:?}");
}

/// Without --operator-namespace or AX_OPERATOR_NAMESPACE, the operator's Lease is found where it
/// is (a cluster-wide list by name), and looked for in ax-system when there is none.
#[tokio::test]
async fn the_operator_lease_is_found_in_the_namespace_of_the_install() {
    let (client, ns) = namespace_with_leader("cli-lease-ns").await;
    let lease_name = format!("ax-cli-detect-{:04x}", rand::random::<u16>());
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(lease_name.clone()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some("elsewhere-0".into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                jiff::Timestamp::now(),
            )),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let version = |lease: &str, extra: &[&str]| {
        let out = Command::new(bin())
            .args(["version", "-n", &ns])
            .args(extra)
            .env_remove("AX_OPERATOR_NAMESPACE")
            .env("AX_OPERATOR_LEASE", lease)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let found = version(&lease_name, &[]);
    assert!(
        found.contains("operator   running (leader \"elsewhere-0\"")
            && found.contains(&format!("[Lease {ns}/{lease_name}]")),
        "{found}"
    );
    let given = version(&lease_name, &["--operator-namespace", "ax-system"]);
    assert!(
        given.contains(&format!("[Lease ax-system/{lease_name}]")),
        "{given}"
    );
    let nowhere = format!("{lease_name}-none");
    let default = version(&nowhere, &[]);
    assert!(
        default.contains(&format!("[Lease ax-system/{nowhere}]"))
            && default.contains("does not exist"),
        "{default}"
    );
}
