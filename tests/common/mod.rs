//! Helpers for the end-to-end tests: they talk to the real cluster named by KUBECONFIG, where
//! e2e/run-tests.sh has installed the CRDs and started the operator.

#![allow(dead_code)]

pub mod audit;
pub mod cli;
pub mod cluster;
pub mod helm;
pub mod metrics;
pub mod operator;
pub mod otlp;
pub mod process;
pub mod queue;
pub mod sim;
pub mod sim_pool;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax::api::{AxTask, HistoryEntry, TaskPhase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

pub async fn client() -> Client {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG not set: run the e2e tests with e2e/run-tests.sh (or `make test`), which starts the cluster and the operator"
    );
    Client::try_default()
        .await
        .expect("a client for the cluster in KUBECONFIG")
}

/// A fresh namespace for one test, so tests can run side by side.
pub async fn namespace(client: &Client, test: &str) -> String {
    let name = format!("e2e-{test}-{:04x}", rand::random::<u16>());
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    // Until the controller manager has made the namespace's `default` ServiceAccount, the API
    // server refuses every pod (PodForbidden): a dispatch then costs an extra attempt, which tests
    // that count dispatches would see under load.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    let deadline = Instant::now() + Duration::from_secs(60);
    while accounts
        .get_opt("default")
        .await
        .expect("read ServiceAccount")
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "namespace {name} has no default ServiceAccount after 60s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    name
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An example manifest from examples/, renamed; `edit` adjusts it for the test.
pub fn example(file: &str, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> AxTask {
    example_of(file, name, edit)
}

/// [`example`] for a manifest of any kind: an AxDag, an AxCron.
pub fn example_of<K: serde::de::DeserializeOwned>(
    file: &str,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> K {
    let path = repo_root().join("examples").join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut value: serde_json::Value = ax::yaml::from_str(&text).expect("example is YAML");
    value["metadata"]["name"] = name.into();
    edit(&mut value);
    serde_json::from_value(value).unwrap_or_else(|e| {
        panic!(
            "example {file} is not a {}: {e}",
            std::any::type_name::<K>()
        )
    })
}

pub async fn create(client: &Client, ns: &str, task: &AxTask) -> AxTask {
    let api: Api<AxTask> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), task)
        .await
        .expect("create task")
}

/// Creates the tasks a few at a time (the API server of the test cluster is small).
pub async fn create_all(client: &Client, ns: &str, tasks: Vec<AxTask>) {
    let api: Api<AxTask> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(tasks)
        .for_each_concurrent(16, |task| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &task)
                    .await
                    .unwrap_or_else(|e| panic!("create task {}: {e}", task.name_any()));
            }
        })
        .await;
}

/// Polls until `done` holds for the namespaced object, or panics after `timeout` showing it.
pub async fn wait_for<K>(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    done: impl Fn(&K) -> bool,
) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + timeout;
    loop {
        let object = api.get_opt(name).await.expect("get object");
        if let Some(o) = &object
            && done(o)
        {
            return o.clone();
        }
        if Instant::now() > deadline {
            // Without managedFields: they come first and a CI log cut short keeps only them.
            let last = object.map(|mut o| {
                o.meta_mut().managed_fields = None;
                ax::yaml::to_string(&o).unwrap_or_default()
            });
            panic!(
                "{} {ns}/{name}: condition not met within {timeout:?}; last seen:\n{}",
                K::kind(&()),
                last.unwrap_or_else(|| "(gone)".into())
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn wait_task(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    done: impl Fn(&AxTask) -> bool,
) -> AxTask {
    wait_for(client, ns, name, timeout, done).await
}

pub fn phase(t: &AxTask) -> Option<TaskPhase> {
    t.status.as_ref().and_then(|s| s.phase)
}

pub async fn wait_phase(
    client: &Client,
    ns: &str,
    name: &str,
    want: TaskPhase,
    timeout: Duration,
) -> AxTask {
    wait_task(client, ns, name, timeout, |t| phase(t) == Some(want)).await
}

pub fn history(t: &AxTask) -> Vec<HistoryEntry> {
    t.status
        .as_ref()
        .map(|s| s.history.clone())
        .unwrap_or_default()
}

/// The phases the task went through, in order.
pub fn phases(t: &AxTask) -> Vec<TaskPhase> {
    history(t).iter().map(|h| h.to).collect()
}

/// Asserts the history is a chain: each entry starts where the previous one ended.
pub fn assert_history_chain(t: &AxTask) {
    let h = history(t);
    for pair in h.windows(2) {
        assert_eq!(
            pair[1].from,
            Some(pair[0].to),
            "history is not a chain: {h:#?}"
        );
        assert!(
            pair[1].time >= pair[0].time,
            "history goes back in time: {h:#?}"
        );
    }
}

/// Reasons of the Events about this task, polled until `want` are all there (Events are sent in
/// the background, so they may trail the status a little).
pub async fn wait_events(client: &Client, ns: &str, name: &str, want: &[&str]) -> Vec<Event> {
    wait_events_of(client, ns, "AxTask", name, want).await
}

/// The Events about the object of `kind` named `name`, polled until the reasons `want` are all there.
pub async fn wait_events_of(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    want: &[&str],
) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lp = ListParams::default().fields(&format!(
            "involvedObject.name={name},involvedObject.kind={kind}"
        ));
        let events = api.list(&lp).await.expect("list events").items;
        let reasons: Vec<String> = events.iter().filter_map(|e| e.reason.clone()).collect();
        if want.iter().all(|w| reasons.iter().any(|r| r == w)) {
            return events;
        }
        if Instant::now() > deadline {
            panic!("events of {kind} {ns}/{name}: want {want:?}, have {reasons:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How many times the Events about task `name` with `reason` say it happened (a repeat within the
/// series window counts up the first Event's series), polled until there are `want`.
pub async fn wait_event_occurrences(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    want: i32,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = wait_events(client, ns, name, &[reason]).await;
        let occurrences: i32 = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.series.as_ref().and_then(|s| s.count).unwrap_or(1))
            .sum();
        if occurrences >= want {
            assert_eq!(
                occurrences, want,
                "{reason} Events of {ns}/{name}: {events:#?}"
            );
            return;
        }
        if Instant::now() > deadline {
            panic!("{reason} Events of {ns}/{name}: want {want} occurrences, have {occurrences}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn pods_of(client: &Client, ns: &str, task: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("ax.dev/task={task}")))
        .await
        .expect("list pods")
        .items
}

pub async fn wait_pod_gone(client: &Client, ns: &str, pod: &str, timeout: Duration) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + timeout;
    while api.get_opt(pod).await.expect("get pod").is_some() {
        assert!(
            Instant::now() < deadline,
            "pod {ns}/{pod} still exists after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn kubectl() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

/// Runs kubectl; panics with its output unless it succeeds.
pub fn kubectl_ok(args: &[&str]) -> String {
    let (ok, stdout, stderr) = run_kubectl(args, None);
    assert!(ok, "kubectl {} failed:\n{stdout}{stderr}", args.join(" "));
    stdout
}

/// Runs kubectl; returns (success, stdout, stderr).
pub fn run_kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(kubectl());
    cmd.args(args);
    let out = output_with_stdin(&mut cmd, stdin);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Runs `cmd` with `stdin` written to it (closed at once when None); its output.
pub fn output_with_stdin(cmd: &mut std::process::Command, stdin: Option<&str>) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {program}: {e}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin piped")
            .write_all(input.as_bytes())
            .unwrap_or_else(|e| panic!("write to {program}: {e}"));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("output of {program}: {e}"))
}

/// `kubectl apply` of one object; panics unless it succeeds.
pub fn kubectl_apply(object: &serde_json::Value) {
    let (ok, _, err) = run_kubectl(&["apply", "-f", "-"], Some(&object.to_string()));
    assert!(ok, "kubectl apply: {err}");
}

/// Writes to `path` a kubeconfig for ServiceAccount `account` of `ns` (e2e/cluster.sh
/// sa-kubeconfig), off the async test's thread.
pub async fn write_service_account_kubeconfig(ns: &str, account: &str, path: &Path) {
    let args = [
        "sa-kubeconfig".to_string(),
        ns.to_string(),
        account.to_string(),
        path.to_str().expect("a UTF-8 path").to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(repo_root().join("e2e/cluster.sh"))
            .args(&args)
            .output()
            .expect("run e2e/cluster.sh")
    })
    .await
    .expect("e2e/cluster.sh thread");
    assert!(out.status.success(), "sa-kubeconfig: {out:?}");
}

/// A kubeconfig for a ServiceAccount `viewer` of the test namespace that may read tasks and
/// nothing else; the file goes when dropped.
pub async fn read_only_kubeconfig(ns: &str) -> tempfile::TempPath {
    kubectl_apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer", "namespace": ns}}),
    );
    kubectl_apply(
        &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "axtask-viewer", "namespace": ns},
        "rules": [{"apiGroups": ["ax.dev"], "resources": ["axtasks"], "verbs": ["get", "list", "watch"]}]}),
    );
    kubectl_apply(
        &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "viewer", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "axtask-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}]}),
    );
    let file = tempfile::NamedTempFile::new()
        .expect("a temporary file")
        .into_temp_path();
    write_service_account_kubeconfig(ns, "viewer", &file).await;
    file
}

pub fn names(t: &AxTask) -> String {
    format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any())
}

pub const LONG: Duration = Duration::from_secs(120);

/// The objects of kind `K` in `ns` that `selector` selects, by name.
pub async fn by_label<K>(client: &Client, ns: &str, selector: &str) -> BTreeMap<String, K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(selector))
        .await
        .expect("list by label")
        .items
        .into_iter()
        .map(|object| (object.name_any(), object))
        .collect()
}

pub async fn tasks_in(client: &Client, namespace: &str) -> Vec<AxTask> {
    let api: Api<AxTask> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default())
        .await
        .expect("list tasks")
        .items
}

/// Waits until every task in the namespace is terminal; returns them.
pub async fn wait_all_terminal(client: &Client, namespace: &str, timeout: Duration) -> Vec<AxTask> {
    let deadline = Instant::now() + timeout;
    loop {
        let tasks = tasks_in(client, namespace).await;
        let open: Vec<String> = tasks
            .iter()
            .filter(|t| !phase(t).is_some_and(TaskPhase::is_terminal))
            .map(|t| format!("{} {:?}", t.name_any(), phase(t)))
            .collect();
        if open.is_empty() {
            return tasks;
        }
        assert!(
            Instant::now() < deadline,
            "{} tasks in {namespace} not terminal after {timeout:?}, e.g. {:?}",
            open.len(),
            &open[..open.len().min(10)]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The actor an operator with this identity (its pod name) records in history.
pub fn actor(identity: &str) -> String {
    format!("ax-operator/{identity}")
}

/// Times of the Scheduled transitions `actor` wrote into the tasks' histories.
pub fn dispatches_by(tasks: &[AxTask], actor: &str) -> Vec<jiff::Timestamp> {
    tasks
        .iter()
        .flat_map(history)
        .filter(|h| h.to == TaskPhase::Scheduled && h.actor == actor)
        .map(|h| h.time)
        .collect()
}

/// Every worker pod ever seen in a namespace, by (task, attempt) → pod uids.
pub type PodsByAttempt = BTreeMap<(String, String), BTreeSet<String>>;

/// Records every worker pod created in `namespace` from now on.
pub fn record_worker_pods(
    client: &Client,
    namespace: &str,
) -> (Arc<Mutex<PodsByAttempt>>, tokio::task::JoinHandle<()>) {
    let seen: Arc<Mutex<PodsByAttempt>> = Arc::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let recorder = seen.clone();
    let watch = tokio::spawn(async move {
        let mut stream = watcher(pods, watcher::Config::default().labels("ax.dev/task"))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(pod)) = stream.next().await {
            let labels = pod.labels();
            if let (Some(task), Some(attempt)) =
                (labels.get("ax.dev/task"), labels.get("ax.dev/attempt"))
            {
                recorder
                    .lock()
                    .expect("pod record lock")
                    .entry((task.clone(), attempt.clone()))
                    .or_default()
                    .insert(pod.uid().unwrap_or_default());
            }
        }
    });
    (seen, watch)
}
