//! `kubectl ax ui` end to end: the real kubectl-ax binary serving the console against the real
//! cluster (operator started by e2e/run-tests.sh), driven by headless Chromium through
//! chromedriver (WebDriver, fantoccini). Each test has its own namespace, console, chromedriver
//! and browser. Screenshots of every page go to target/e2e/screenshots/ (or $AX_E2E_ARTIFACTS).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ax::api::{AxDag, AxQueue, AxTask, TaskPhase};
use common::cli::namespace_with_leader;
use common::sim::{SimWorker, sim_task_with};
use common::*;
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------------------------
// The console process, chromedriver and the browser.
// ---------------------------------------------------------------------------------------------

/// A running `kubectl-ax ui`; stopped when dropped.
struct Console {
    child: Child,
    /// `http://127.0.0.1:PORT`
    base: String,
    token: String,
}

impl Console {
    /// `kubectl-ax ui -n NS --port 0`, with `kubeconfig` instead of $KUBECONFIG when given.
    fn start(ns: &str, kubeconfig: Option<&str>) -> Console {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-ax"));
        cmd.args(["ui", "-n", ns, "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null());
        if let Some(k) = kubeconfig {
            cmd.env("KUBECONFIG", k);
        }
        let mut child = cmd.spawn().expect("start kubectl-ax ui");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("the console's first line");
        let url = line
            .trim()
            .strip_prefix("ax console: ")
            .unwrap_or_else(|| panic!("the first line is the URL: {line:?}"))
            .to_string();
        let (base, token) = url.split_once("/?token=").expect("URL with a token");
        Console {
            child,
            base: base.to_string(),
            token: token.to_string(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The first visit: with the token, which sets the cookie.
    fn entry(&self, path: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{sep}token={}", self.base, self.token)
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver in its own process group (its Chromium goes with it), and a profile directory.
struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the browser it started.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

fn chromedriver_path() -> String {
    ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("chromedriver installed (e2e/install.sh: apt-get install chromium-driver)")
        .to_string()
}

/// Starts chromedriver and a headless Chromium session.
async fn browser() -> (Driver, Browser) {
    use std::os::unix::process::CommandExt;
    let port = free_port();
    let child = Command::new(chromedriver_path())
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start chromedriver");
    let profile = tempfile::tempdir().unwrap();
    let driver = Driver {
        child,
        port,
        _profile: profile,
    };
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,1000",
                format!("--user-data-dir={}", driver._profile.path().display()),
            ],
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no WebDriver session: {e}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    (driver, client)
}

/// Saves what the browser shows as screenshots/NAME.png among the e2e artifacts
/// ($AX_E2E_ARTIFACTS, target/e2e by default, as in e2e/run-tests.sh).
async fn screenshot(b: &Browser, name: &str) {
    let artifacts = std::env::var_os("AX_E2E_ARTIFACTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/e2e"));
    let dir = artifacts.join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = b.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Polls `check` (which reads the page) until it returns Some, or panics with `what`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// The page is re-rendered by every live update, and any change of any AxQueue in the cluster
// (other tests run beside these) makes one; an element found in one call may be gone in the next
// (stale). So reads are one script each: they see one version of the page.

/// Runs `script` in the page; None if it fails (e.g. during a navigation).
async fn js(b: &Browser, script: &str, args: Vec<serde_json::Value>) -> Option<serde_json::Value> {
    b.execute(script, args).await.ok()
}

async fn attr(b: &Browser, css: &str, name: &str) -> Option<String> {
    let v = js(
        b,
        "var e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null;",
        vec![json!(css), json!(name)],
    )
    .await?;
    v.as_str().map(str::to_string)
}

/// The rendered text of the first element `css` selects.
async fn text(b: &Browser, css: &str) -> Option<String> {
    let v = js(
        b,
        "var e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
        vec![json!(css)],
    )
    .await?;
    v.as_str().map(|t| t.trim().to_string())
}

/// The rendered texts of every element `css` selects.
async fn texts(b: &Browser, css: &str) -> Vec<String> {
    let v = js(
        b,
        "return Array.from(document.querySelectorAll(arguments[0])).map(function (e) { return e.innerText; });",
        vec![json!(css)],
    )
    .await;
    serde_json::from_value::<Vec<String>>(v.unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.trim().to_string())
        .collect()
}

/// Two attributes of every element `css` selects (empty where missing).
async fn attr_pairs(b: &Browser, css: &str, first: &str, second: &str) -> Vec<(String, String)> {
    let v = js(
        b,
        "var a = arguments; return Array.from(document.querySelectorAll(a[0])).map(function (e) { \
           return [e.getAttribute(a[1]) || '', e.getAttribute(a[2]) || '']; });",
        vec![json!(css), json!(first), json!(second)],
    )
    .await
    .expect("read the page");
    serde_json::from_value(v).expect("pairs of strings")
}

/// How many live updates the page received (the script counts them on <body>).
async fn live_updates(b: &Browser) -> u64 {
    attr(b, "body", "data-live-updates")
        .await
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn wait_live(b: &Browser) {
    eventually("the page's live updates connected", LONG, || async {
        (live_updates(b).await >= 1).then_some(())
    })
    .await;
}

/// Clicks the element `css` selects, finding it again if a live update replaced it meanwhile.
async fn click(b: &Browser, css: &str) {
    let mut last = None;
    for _ in 0..10 {
        match b.find(Locator::Css(css)).await {
            Ok(e) => match e.click().await {
                Ok(()) => return,
                // Replaced between the find and the click: on a busy page that can happen every
                // time, so click it from inside the page, where finding and clicking are one step.
                Err(err) if err.to_string().contains("stale element") => {
                    let clicked = js(
                        b,
                        "var e = document.querySelector(arguments[0]); \
                         if (!e) { return false; } e.click(); return true;",
                        vec![json!(css)],
                    )
                    .await;
                    if clicked == Some(json!(true)) {
                        return;
                    }
                    last = Some(err.to_string());
                }
                Err(err) => last = Some(err.to_string()),
            },
            Err(err) => last = Some(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("could not click {css}: {last:?}");
}

/// Clicks a button that submits a form and waits until the browser shows the page that answers
/// it (the old page's mark is gone), so what is read next is not the old page.
async fn click_to_load(b: &Browser, css: &str) {
    b.execute("window.axOldPage = true;", vec![]).await.unwrap();
    click(b, css).await;
    eventually(&format!("the page answering {css}"), LONG, || async {
        let old = js(b, "return window.axOldPage === true;", vec![]).await;
        (old == Some(json!(false))).then_some(())
    })
    .await;
}

async fn notices(b: &Browser) -> Vec<String> {
    texts(b, ".notice").await
}

// ---------------------------------------------------------------------------------------------
// Tasks for the simulated nodes.
// ---------------------------------------------------------------------------------------------

fn hanging(name: &str) -> AxTask {
    sim_task_with(
        name,
        "console-hang",
        &SimWorker::default().start_ms(50).hang(),
        |v| {
            v["spec"]["retry"] = json!({"maxRetries": 0});
        },
    )
}

fn quick(name: &str, millis: u64, exit_code: i32, max_retries: i32) -> AxTask {
    let worker = SimWorker::running_for(millis)
        .start_ms(50)
        .exit_code(exit_code);
    sim_task_with(name, "console-sim", &worker, |v| {
        v["spec"]["retry"] = json!({
            "maxRetries": max_retries,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 100},
        });
    })
}

async fn task(client: &Client, ns: &str, name: &str) -> AxTask {
    Api::<AxTask>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get task")
}

async fn cancel_by_api(client: &Client, ns: &str, name: &str) {
    let _ = Api::<AxTask>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"cancel": true}})),
        )
        .await;
}

// ---------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn task_list_updates_live_and_cancel_cancels_exactly_the_selected() {
    let (client, ns) = namespace_with_leader("console-list").await;
    for i in 0..4 {
        create(&client, &ns, &hanging(&format!("hang-{i}"))).await;
    }
    let console = Console::start(&ns, None);
    let (_driver, b) = browser().await;
    b.goto(&console.entry("/tasks")).await.unwrap();
    wait_live(&b).await;
    eventually("four rows", LONG, || async {
        let rows = b.find_all(Locator::Css("tr[data-task]")).await.ok()?;
        (rows.len() == 4).then_some(())
    })
    .await;
    // Live: a task created now appears and finishes on the page, which is not reloaded (the
    // marker survives).
    b.execute("window.axMarker = 42;", vec![]).await.unwrap();
    create(&client, &ns, &quick("quick", 1500, 0, 0)).await;
    let quick_row = format!("tr[data-task='{ns}/quick']");
    eventually("quick shown Succeeded without a reload", LONG, || async {
        (attr(&b, &quick_row, "data-phase").await.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    let marker = b.execute("return window.axMarker;", vec![]).await.unwrap();
    assert_eq!(marker, json!(42), "the list updated in place");
    assert!(live_updates(&b).await >= 2);
    for i in 0..4 {
        let row = format!("tr[data-task='{ns}/hang-{i}']");
        eventually(&format!("hang-{i} shown Running"), LONG, || async {
            (attr(&b, &row, "data-phase").await.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    screenshot(&b, "tasks").await;

    // Select three of the four running tasks; a live update meanwhile keeps the selection.
    for i in 0..3 {
        click(&b, &format!("input.select[value='{ns}/hang-{i}']")).await;
    }
    assert_eq!(
        text(&b, "#selected-count").await.as_deref(),
        Some("3 selected")
    );
    click_to_load(&b, "#bulk-cancel").await;
    let shown = eventually("the cancel notices", LONG, || async {
        let n = notices(&b).await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(shown.len(), 3, "{shown:?}");
    assert!(
        shown.iter().all(|n| n.contains("cancel requested")),
        "{shown:?}"
    );
    screenshot(&b, "tasks-after-cancel").await;
    for i in 0..3 {
        wait_phase(
            &client,
            &ns,
            &format!("hang-{i}"),
            TaskPhase::Canceled,
            LONG,
        )
        .await;
    }
    let untouched = task(&client, &ns, "hang-3").await;
    assert!(
        !untouched.spec.cancel,
        "the unselected task is not canceled"
    );
    assert_eq!(phase(&untouched), Some(TaskPhase::Running));
    b.close().await.unwrap();
    cancel_by_api(&client, &ns, "hang-3").await;
}

#[tokio::test]
async fn task_page_draws_the_taken_path_and_retry_starts_a_new_attempt() {
    let (client, ns) = namespace_with_leader("console-task").await;
    // Fails twice (one retry), then Dead.
    create(&client, &ns, &quick("flaky", 1000, 3, 1)).await;
    wait_phase(&client, &ns, "flaky", TaskPhase::Dead, LONG).await;
    let console = Console::start(&ns, None);
    let (_driver, b) = browser().await;
    b.goto(&console.entry(&format!("/tasks/{ns}/flaky")))
        .await
        .unwrap();
    wait_live(&b).await;
    let edge = |id: &str| format!("#edge-{id}");
    let mut taken = attr_pairs(&b, "svg.state-machine path.edge.taken", "id", "data-count").await;
    taken.sort();
    // Exactly the task's own path, as its history records it ...
    let t = task(&client, &ns, "flaky").await;
    let mut want: Vec<(String, String)> = ax::console::diagram::path_counts(&history(&t))
        .into_iter()
        .map(|((from, to), n)| {
            (
                format!(
                    "edge-{}-{}",
                    ax::console::diagram::state_name(from),
                    to.as_str()
                ),
                n.to_string(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(taken, want, "the path through the state machine");
    // ... which went twice through dispatch and failure, and ended Dead.
    for (id, n) in [
        ("edge-new-Pending", "1"),
        ("edge-Pending-Scheduled", "2"),
        ("edge-Failed-Pending", "1"),
        ("edge-Failed-Dead", "1"),
    ] {
        assert!(
            taken.contains(&(id.to_string(), n.to_string())),
            "{id} taken {n}x: {taken:?}"
        );
    }
    assert_eq!(
        attr(&b, &edge("Running-Succeeded"), "class")
            .await
            .as_deref(),
        Some("edge"),
        "an edge not taken is not marked"
    );
    // Counts are written on edges taken more than once.
    assert!(
        b.find(Locator::Css("g.edge-count[data-edge='Pending-Scheduled']"))
            .await
            .is_ok()
    );
    assert!(
        attr(&b, "g.state[data-state='Dead']", "class")
            .await
            .unwrap()
            .contains("current")
    );
    let cards = b.find_all(Locator::Css(".card.attempt")).await.unwrap();
    assert_eq!(cards.len(), 2, "one card per attempt");
    let card2 = text(&b, ".card.attempt[data-attempt='2']").await.unwrap();
    assert!(card2.contains("flaky-2"), "{card2}");
    assert!(
        card2.contains("Retryable") && card2.contains('3'),
        "{card2}"
    );
    screenshot(&b, "task").await;

    click_to_load(&b, "#retry").await;
    let shown = eventually("the retry notice", LONG, || async {
        let n = notices(&b).await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert!(
        shown[0].contains("re-run requested (spec.rerun 1; was Dead after attempt 2)"),
        "{shown:?}"
    );
    let t = wait_task(&client, &ns, "flaky", LONG, |t| {
        t.status.as_ref().is_some_and(|s| s.attempt >= 3)
    })
    .await;
    assert_eq!(t.status.unwrap().observed_rerun, 1);
    eventually("the third attempt's card, live", LONG, || async {
        b.find(Locator::Css(".card.attempt[data-attempt='3']"))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    wait_phase(&client, &ns, "flaky", TaskPhase::Dead, LONG).await;
    eventually("the re-run drawn", LONG, || async {
        (attr(&b, &edge("Dead-Pending"), "data-count")
            .await
            .as_deref()
            == Some("1"))
        .then_some(())
    })
    .await;
    screenshot(&b, "task-after-retry").await;
    // The logs page of an attempt (simulated pods have no kubelet: the page says why).
    b.goto(&console.url(&format!("/tasks/{ns}/flaky/logs?attempt=3")))
        .await
        .unwrap();
    assert!(text(&b, "h1").await.unwrap().contains("attempt 3"));
    screenshot(&b, "logs").await;
    b.close().await.unwrap();
}

fn dag(name: &str) -> AxDag {
    let step = |ms: u64| {
        json!({"type": "console-step", "retry": {"maxRetries": 0},
               "template": {"spec": SimWorker::running_for(ms).start_ms(50).pod_spec()}})
    };
    serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
        "metadata": {"name": name},
        "spec": {"tasks": [
            {"name": "extract", "spec": step(200)},
            {"name": "left", "dependsOn": ["extract"], "spec": step(200)},
            {"name": "right", "dependsOn": ["extract"], "spec": step(200)},
            {"name": "load", "dependsOn": ["left", "right"], "spec": step(200)},
        ]},
    }))
    .unwrap()
}

#[tokio::test]
async fn dag_queue_and_dashboard_pages_show_what_the_cluster_holds() {
    let (client, ns) = namespace_with_leader("console-dag").await;
    let dags: Api<AxDag> = Api::namespaced(client.clone(), &ns);
    dags.create(&PostParams::default(), &dag("etl"))
        .await
        .unwrap();
    // A queue of our own, with a type limit and a window that is always in force.
    let queue_name = ns.clone();
    let queues: Api<AxQueue> = Api::all(client.clone());
    let q: AxQueue = serde_json::from_value(json!({
        "apiVersion": "ax.dev/v1alpha1", "kind": "AxQueue",
        "metadata": {"name": queue_name},
        "spec": {"concurrency": 7, "typeConcurrency": {"console-step": 2},
                 "weightSchedule": [{"from": "00:00", "to": "00:00", "timeZone": "UTC", "weights": {"low": 9}}]},
    }))
    .unwrap();
    queues.create(&PostParams::default(), &q).await.unwrap();
    wait_for::<AxDag>(&client, &ns, "etl", LONG, |d| {
        d.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_terminal())
    })
    .await;

    let console = Console::start(&ns, None);
    let (_driver, b) = browser().await;
    b.goto(&console.entry("/dags")).await.unwrap();
    wait_live(&b).await;
    eventually("the DAG listed", LONG, || async {
        b.find(Locator::Css(&format!("tr[data-dag='{ns}/etl']")))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    screenshot(&b, "dags").await;
    b.goto(&console.url(&format!("/dags/{ns}/etl")))
        .await
        .unwrap();
    wait_live(&b).await;
    let mut nodes = attr_pairs(&b, "svg.dag g.node", "data-node", "data-phase").await;
    nodes.sort();
    assert_eq!(
        nodes,
        ["extract", "left", "load", "right"].map(|n| (n.to_string(), "Succeeded".to_string())),
        "every node, coloured by its phase"
    );
    assert_eq!(text(&b, "#progress").await.as_deref(), Some("4/4"));
    screenshot(&b, "dag").await;
    // A node links to its child task.
    click(&b, "svg.dag g.node[data-node='load'] a").await;
    eventually("the child's task page", LONG, || async {
        let url = b.current_url().await.ok()?;
        url.path()
            .ends_with(&format!("/tasks/{ns}/etl-load"))
            .then_some(())
    })
    .await;

    b.goto(&console.url("/queues")).await.unwrap();
    wait_live(&b).await;
    let section = format!("section.queue[data-queue='{queue_name}']");
    let shown = text(&b, &section).await.expect("our queue shown");
    assert!(shown.contains("Running 0 of 7"), "{shown}");
    let limit = text(&b, &format!("{section} tr[data-type='console-step']"))
        .await
        .unwrap();
    assert!(limit.ends_with('2'), "type limit: {limit}");
    let window = text(&b, &format!("{section} tr.active-window"))
        .await
        .unwrap();
    assert!(
        window.starts_with("now") && window.contains("00:00"),
        "{window}"
    );
    screenshot(&b, "queues").await;

    b.goto(&console.url("/dashboard")).await.unwrap();
    wait_live(&b).await;
    let succeeded = text(&b, "a.phase-count[data-phase='Succeeded'] .n").await;
    assert_eq!(succeeded.as_deref(), Some("4"));
    let dispatched = attr(&b, "figure.chart strong[data-total]", "data-total")
        .await
        .unwrap();
    assert_eq!(dispatched, "4", "four attempts dispatched in the last hour");
    screenshot(&b, "dashboard").await;
    b.close().await.unwrap();
    let _ = queues.delete(&queue_name, &DeleteParams::default()).await;
}

#[tokio::test]
async fn submit_creates_a_task_and_shows_a_schema_error_inline() {
    let (client, ns) = namespace_with_leader("console-submit").await;
    let console = Console::start(&ns, None);
    let (_driver, b) = browser().await;
    b.goto(&console.entry("/submit")).await.unwrap();
    for (field, value) in [
        ("f-name", "from-form"),
        ("f-type", "console-form"),
        ("f-image", "localhost/ax-busybox:1"),
        ("f-command", "echo submitted"),
        ("f-maxRetries", "1"),
    ] {
        b.find(Locator::Id(field))
            .await
            .unwrap()
            .send_keys(value)
            .await
            .unwrap();
    }
    b.find(Locator::Id("f-pullPolicy"))
        .await
        .unwrap()
        .select_by_value("Never")
        .await
        .unwrap();
    b.find(Locator::Id("f-priority"))
        .await
        .unwrap()
        .select_by_value("High")
        .await
        .unwrap();
    screenshot(&b, "submit").await;
    click_to_load(&b, "#form-create").await;
    eventually("the new task's page", LONG, || async {
        let url = b.current_url().await.ok()?;
        url.path()
            .ends_with(&format!("/tasks/{ns}/from-form"))
            .then_some(())
    })
    .await;
    let created = task(&client, &ns, "from-form").await;
    assert_eq!(created.spec.task_type, "console-form");
    assert_eq!(created.spec.priority.as_str(), "High");
    assert_eq!(created.spec.retry.max_retries, 1);
    assert!(notices(&b).await[0].contains("axtask/from-form created"));

    // The YAML editor: a priority the schema does not allow is refused by the API server, and
    // its message is shown under the editor; nothing is created.
    b.goto(&console.url("/submit")).await.unwrap();
    let yaml = ax::console::pages::submit::EXAMPLE_YAML
        .replace("generateName: hello-", "name: bad-one")
        .replace("priority: Normal", "priority: Urgent");
    b.execute(
        "document.getElementById('yaml').value = arguments[0];",
        vec![json!(yaml)],
    )
    .await
    .unwrap();
    click_to_load(&b, "#yaml-create").await;
    let errors = eventually("the schema error", LONG, || async {
        text(&b, "#yaml-errors").await
    })
    .await;
    assert!(
        errors.contains("spec.priority") && errors.contains("Urgent"),
        "{errors}"
    );
    let kept = b
        .find(Locator::Id("yaml"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap()
        .unwrap();
    assert!(kept.contains("priority: Urgent"), "what was typed stays");
    screenshot(&b, "submit-schema-error").await;
    let api: Api<AxTask> = Api::namespaced(client.clone(), &ns);
    assert!(api.get_opt("bad-one").await.unwrap().is_none());
    // Check (a dry run) of a good manifest says so and creates nothing.
    let good = yaml.replace("priority: Urgent", "priority: Low");
    b.execute(
        "document.getElementById('yaml').value = arguments[0];",
        vec![json!(good)],
    )
    .await
    .unwrap();
    click_to_load(&b, "#yaml-check").await;
    let result = eventually("the dry run's verdict", LONG, || async {
        text(&b, "#check-result").await
    })
    .await;
    assert!(result.contains("accepts this task (dry run)"), "{result}");
    assert!(api.get_opt("bad-one").await.unwrap().is_none());
    b.close().await.unwrap();
}

/// One raw HTTP/1.1 request; (status, headers and body as text).
async fn http(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let host = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!(
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

#[tokio::test]
async fn a_change_without_the_token_or_from_another_origin_is_refused() {
    let (client, ns) = namespace_with_leader("console-csrf").await;
    create(&client, &ns, &hanging("target")).await;
    wait_phase(&client, &ns, "target", TaskPhase::Running, LONG).await;
    let console = Console::start(&ns, None);
    let ours = console.base.clone();
    let cookie = format!("ax_console_token={}", console.token);
    let form_with_token = format!("token={}&task={ns}%2Ftarget&return=%2Ftasks", console.token);
    let form_without = format!("task={ns}%2Ftarget&return=%2Ftasks");

    // Pages need the token too.
    let (status, _) = http(&console.base, "GET", "/tasks", &[], "").await;
    assert_eq!(status, 403);
    let (status, body) = http(&console.base, "GET", "/tasks", &[("Cookie", &cookie)], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("frame-ancestors 'none'"),
        "no framing: {body}"
    );
    // `no-referrer` would make browsers send `Origin: null` on the console's own forms.
    assert!(
        body.to_ascii_lowercase()
            .contains("referrer-policy: same-origin"),
        "{body}"
    );

    type Headers<'a> = Vec<(&'a str, &'a str)>;
    let refused: [(&str, Headers, &str); 5] = [
        ("no token at all", vec![("Origin", &ours)], &form_without),
        (
            "the cookie only",
            vec![("Origin", &ours), ("Cookie", &cookie)],
            &form_without,
        ),
        (
            "a foreign Origin",
            vec![("Origin", "https://evil.example"), ("Cookie", &cookie)],
            &form_with_token,
        ),
        (
            "another port",
            vec![("Origin", "http://127.0.0.1:1"), ("Cookie", &cookie)],
            &form_with_token,
        ),
        ("no Origin", vec![("Cookie", &cookie)], &form_with_token),
    ];
    for (what, headers, body) in &refused {
        let (status, response) =
            http(&console.base, "POST", "/actions/cancel", headers, body).await;
        assert_eq!(status, 403, "{what}: {response}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = task(&client, &ns, "target").await;
    assert!(!t.spec.cancel, "nothing changed");
    assert_eq!(phase(&t), Some(TaskPhase::Running));

    // The same request from the console's own page is carried out (so the refusals above were
    // the checks, not a broken endpoint).
    let (status, response) = http(
        &console.base,
        "POST",
        "/actions/cancel",
        &[("Origin", &ours), ("Cookie", &cookie)],
        &form_with_token,
    )
    .await;
    assert_eq!(status, 303, "{response}");
    wait_phase(&client, &ns, "target", TaskPhase::Canceled, LONG).await;
}

#[tokio::test]
async fn a_read_only_user_sees_the_pages_and_is_not_allowed_to_cancel() {
    let (client, ns) = namespace_with_leader("console-rbac").await;
    create(&client, &ns, &hanging("guarded")).await;
    wait_phase(&client, &ns, "guarded", TaskPhase::Running, LONG).await;
    let kubeconfig = read_only_kubeconfig(&ns).await;
    let console = Console::start(&ns, Some(kubeconfig.to_str().unwrap()));
    let (_driver, b) = browser().await;
    b.goto(&console.entry("/tasks")).await.unwrap();
    wait_live(&b).await;
    let row = format!("tr[data-task='{ns}/guarded']");
    eventually("the task listed for the viewer", LONG, || async {
        (attr(&b, &row, "data-phase").await.as_deref() == Some("Running")).then_some(())
    })
    .await;
    b.goto(&console.url(&format!("/tasks/{ns}/guarded")))
        .await
        .unwrap();
    wait_live(&b).await;
    assert!(text(&b, "h1").await.unwrap().contains("guarded"));
    // The pods are not the viewer's to read: said, and the page still works.
    let attempts = text(&b, ".cards").await.unwrap_or_default();
    assert!(attempts.contains("Attempt 1"), "{attempts}");
    click_to_load(&b, "#cancel").await;
    let deadline = Instant::now() + LONG;
    let shown = loop {
        let n = notices(&b).await;
        if !n.is_empty() {
            break n;
        }
        if Instant::now() > deadline {
            // Say what the browser shows instead (once seen: a page without the notice).
            screenshot(&b, "read-only-cancel-without-notice").await;
            let url = b
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let body = text(&b, "body").await.unwrap_or_default();
            panic!("no notice within {LONG:?} after the cancel; the browser shows {url}:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(
        shown[0].contains("not allowed")
            && shown[0].contains("no permission to patch axtasks.ax.dev in namespace")
            && shown[0].contains("system:serviceaccount"),
        "{shown:?}"
    );
    screenshot(&b, "task-not-allowed").await;
    let t = task(&client, &ns, "guarded").await;
    assert!(!t.spec.cancel);
    assert_eq!(phase(&t), Some(TaskPhase::Running));
    // Queues are not the viewer's to list: the page says so instead of failing.
    b.goto(&console.url("/queues")).await.unwrap();
    let problem = eventually("the queue page's problem", LONG, || async {
        text(&b, ".problem").await
    })
    .await;
    assert!(problem.contains("no permission to"), "{problem}");
    b.close().await.unwrap();
    cancel_by_api(&client, &ns, "guarded").await;
}
