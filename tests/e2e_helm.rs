//! The production install on the real cluster: the Helm chart with the locally built image, two
//! replicas under leader election, failover, metrics, RBAC and uninstall (DESIGN §6).
//!
//! Every test installs its own release into a fresh namespace and uninstalls it when done, and only
//! one operator may run at a time (they would all reconcile every namespace): run this file with
//! `--test-threads 1`. e2e/run-tests.sh builds the static image first (its name in
//! AX_OPERATOR_IMAGE, default `localhost/ax-operator:dev`) and stops its shared operator before it.
//! The helpers (the release, the operator pods and Lease, metrics) are in tests/common.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ax::api::{AxTask, TaskPhase};
use common::cluster::{ApiServerPause, wait_api_server};
use common::helm::{
    FULLNAME, LEASE_SECONDS, RELEASE, RENEW_DEADLINE_SECONDS, Release, helm, operator_image,
};
use common::metrics::{Sample, metric_value, parse_metrics, scrape};
use common::operator::{
    LEASE_NAME, LeaseAudit, lease_holder, lease_spec, restarts, wait_leader, wait_operator_ready,
};
use common::sim::sim_task;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

// --- tests ------------------------------------------------------------------------------------

/// A release of the chart with two operator pods, both Running and Ready, one of them leading.
struct Replicas {
    client: kube::Client,
    /// Uninstalls when dropped: bind it for the whole test.
    release: Release,
    ns: String,
    pods: Vec<Pod>,
    names: Vec<String>,
    leader: String,
    standby: String,
}

/// Installs the chart with its defaults (two replicas) for `test` and waits until they are ready
/// and one leads.
async fn install_two_replicas(test: &str) -> Replicas {
    let client = client().await;
    // The cluster holds the tasks of every earlier test, of many more types than the default cap
    // of the `type` label: comparing ax_tasks with kubectl needs each of them named.
    let values = serde_json::json!({"operator": {"metricsMaxTypes": 100_000}});
    let release = Release::install(&client, test, values).await;
    let ns = release.namespace.clone();
    let pods = wait_operator_ready(&client, &ns, 2).await;
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let leader = wait_leader(&client, &ns, &names).await;
    let standby = names
        .iter()
        .find(|n| **n != leader)
        .expect("a standby")
        .clone();
    Replicas {
        client,
        release,
        ns,
        pods,
        names,
        leader,
        standby,
    }
}

/// Waits until at least `count` tasks in `ns` Succeeded: tasks are flowing.
async fn wait_succeeded(client: &kube::Client, ns: &str, count: usize) {
    let deadline = Instant::now() + LONG;
    loop {
        let succeeded = tasks_in(client, ns)
            .await
            .iter()
            .filter(|t| phase(t) == Some(TaskPhase::Succeeded))
            .count();
        if succeeded >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tasks did not start flowing: {succeeded} succeeded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn helm_install_runs_two_ready_replicas_and_a_task_succeeds() {
    let Replicas {
        client,
        release: _release,
        ns,
        pods,
        names,
        leader,
        ..
    } = install_two_replicas("helm-install").await;
    for pod in &pods {
        let spec = pod.spec.as_ref().expect("pod spec");
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(FULLNAME),
            "{} runs under the chart's ServiceAccount",
            pod.name_any()
        );
        let container = &spec.containers[0];
        let (repository, tag) = operator_image();
        assert_eq!(
            container.image.as_deref(),
            Some(format!("{repository}:{tag}").as_str())
        );
        let security = container
            .security_context
            .as_ref()
            .expect("securityContext");
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.run_as_non_root, Some(true));
    }
    println!("operator pods {names:?}, leader {leader}");

    let manifest = std::fs::read_to_string(repo_root().join("examples/hello.yaml"))
        .expect("examples/hello.yaml");
    let (ok, out, err) = run_kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&manifest));
    assert!(ok, "kubectl apply failed: {out}{err}");
    let task = wait_phase(&client, &ns, "hello", TaskPhase::Succeeded, LONG).await;
    let scheduled: Vec<String> = history(&task)
        .into_iter()
        .filter(|h| h.to == TaskPhase::Scheduled)
        .map(|h| h.actor)
        .collect();
    assert_eq!(
        scheduled,
        vec![actor(&leader)],
        "the in-cluster leader dispatched the task"
    );
}

#[tokio::test]
async fn leader_pod_force_deleted_standby_takes_over_within_lease_duration() {
    let Replicas {
        client,
        release: _release,
        ns,
        leader: old_leader,
        ..
    } = install_two_replicas("helm-failover").await;

    // Tasks keep arriving, before, during and after the failover (about 18 s of them), so there is
    // always dispatching to take over, whatever the queue's concurrency.
    let workers = record_worker_pods(&client, &ns);
    const TASKS: u64 = 60;
    let creator = task_flow(&client, &ns, "failover", TASKS, Duration::from_millis(300));

    // Tasks flowing: a few done already.
    wait_succeeded(&client, &ns, 5).await;

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let renewed_before_delete = leases
        .get(LEASE_NAME)
        .await
        .expect("get lease")
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0);
    let deleted_at = jiff::Timestamp::now();
    kubectl_ok(&[
        "-n",
        &ns,
        "delete",
        "pod",
        &old_leader,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);

    // The Lease passes to another pod: the standby, or the replacement if it wins the race.
    let deadline = Instant::now() + Duration::from_secs(LEASE_SECONDS + 60);
    let new_leader = loop {
        if let Some(holder) = lease_holder(&client, &ns)
            .await
            .filter(|h| *h != old_leader)
        {
            break holder;
        }
        assert!(
            Instant::now() < deadline,
            "no pod took the Lease over from {old_leader}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // ... and dispatches again.
    let deadline = Instant::now() + Duration::from_secs(LEASE_SECONDS + 60);
    let first_dispatch = loop {
        let tasks = tasks_in(&client, &ns).await;
        if let Some(first) = dispatches_by(&tasks, &actor(&new_leader))
            .into_iter()
            .filter(|t| *t >= deleted_at)
            .min()
        {
            break first;
        }
        assert!(
            Instant::now() < deadline,
            "{new_leader} holds the Lease but dispatches nothing"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let failover = first_dispatch.duration_since(deleted_at);
    println!(
        "failover: leader {old_leader} force-deleted; {new_leader} dispatched {:.1}s later (limit {}s)",
        failover.as_secs_f64(),
        LEASE_SECONDS + 5
    );
    // Sooner than the lease's expiry means the old leader released it (SIGTERM comes before the
    // kill even with --grace-period=0); otherwise the standby waited for it to expire.
    if let Some(renewed) = renewed_before_delete {
        let expiry = renewed + jiff::SignedDuration::from_secs(LEASE_SECONDS as i64);
        println!(
            "  the old lease was last renewed {:.1}s before the delete; it would have expired {:.1}s after it",
            deleted_at.duration_since(renewed).as_secs_f64(),
            expiry.duration_since(deleted_at).as_secs_f64()
        );
    }
    assert!(
        failover <= jiff::SignedDuration::from_secs((LEASE_SECONDS + 5) as i64),
        "failover took {failover:?}, more than the lease duration + 5s"
    );
    assert_ne!(
        new_leader, old_leader,
        "the deleted pod cannot lead any more"
    );

    creator.await.expect("creating the tasks");
    assert_all_succeeded_once(&client, &ns, TASKS, workers, Duration::from_secs(240)).await;
}

/// Task counts by (queue, type, phase).
type TaskCounts = BTreeMap<(String, String, String), u64>;

/// Task counts as `kubectl get axtasks -A` shows them, and the tasks themselves.
fn kubectl_task_counts() -> (TaskCounts, Vec<serde_json::Value>) {
    let out = kubectl_ok(&["get", "axtasks", "--all-namespaces", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&out).expect("kubectl JSON");
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let mut counts = BTreeMap::new();
    for t in &items {
        let queue = t["spec"]["queue"].as_str().unwrap_or("default").to_string();
        let task_type = t["spec"]["type"].as_str().unwrap_or_default().to_string();
        let phase = t["status"]["phase"].as_str().unwrap_or("New").to_string();
        *counts.entry((queue, task_type, phase)).or_insert(0) += 1;
    }
    (counts, items)
}

fn metric_task_counts(samples: &[Sample]) -> TaskCounts {
    samples
        .iter()
        .filter(|s| s.name == "ax_tasks" && s.value > 0.0)
        .map(|s| {
            let label = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            (
                (label("queue"), label("type"), label("phase")),
                s.value as u64,
            )
        })
        .collect()
}

/// The counts of queue `queue`'s tasks.
fn of_queue(counts: TaskCounts, queue: &str) -> TaskCounts {
    counts
        .into_iter()
        .filter(|((q, _, _), _)| q == queue)
        .collect()
}

/// Scheduled history entries written by `actor`, in kubectl's JSON.
fn kubectl_dispatches_by(items: &[serde_json::Value], actor: &str) -> u64 {
    items
        .iter()
        .flat_map(|t| {
            t["status"]["history"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|h| h["to"] == "Scheduled" && h["actor"] == actor)
        .count() as u64
}

#[tokio::test]
async fn metrics_match_kubectl_task_counts_and_dispatches() {
    let Replicas {
        client,
        release: _release,
        ns,
        leader,
        standby,
        ..
    } = install_two_replicas("helm-metrics").await;

    // A queue of the test's own: the dispatch histogram is compared for it alone. Tasks left by
    // earlier tests in the default queue may be taken up by this leader from pods another
    // operator created: a dispatch it records without having created the pod.
    let queue = queue::create_queue(
        &client,
        "helm-metrics",
        serde_json::json!({"concurrency": 20}),
    )
    .await;
    for i in 0..12 {
        let mut task = sim_task(&format!("ok-{i:02}"), "helm-ok", 1500, 0);
        task.spec.queue = queue.name.clone();
        create(&client, &ns, &task).await;
    }
    // Failing tasks: one retry each, then Dead: two dispatches apiece.
    for i in 0..4 {
        let mut task = sim_task(&format!("bad-{i}"), "helm-bad", 300, 1);
        task.spec.queue = queue.name.clone();
        let mut value = serde_json::to_value(&task).expect("task JSON");
        value["spec"]["retry"] = serde_json::json!({
            "maxRetries": 1,
            "backoff": {"baseSeconds": 1, "factor": 1, "maxSeconds": 1, "jitterMillis": 0}});
        task = serde_json::from_value(value).expect("task with retry");
        create(&client, &ns, &task).await;
    }

    // During the run: the leader reports leading and tasks in flight; the standby does not lead.
    let deadline = Instant::now() + LONG;
    loop {
        let samples = parse_metrics(&scrape(&ns, &leader));
        assert_eq!(
            metric_value(&samples, "ax_leader", &[]),
            Some(1.0),
            "leader's ax_leader"
        );
        let in_flight: f64 = samples
            .iter()
            .filter(|s| s.name == "ax_tasks")
            .filter(|s| s.labels.get("type").is_some_and(|t| t.starts_with("helm-")))
            .filter(|s| {
                s.labels
                    .get("phase")
                    .is_some_and(|p| p == "Scheduled" || p == "Running")
            })
            .map(|s| s.value)
            .sum();
        if in_flight > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ax_tasks never showed a task in flight"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let standby_samples = parse_metrics(&scrape(&ns, &standby));
    assert_eq!(
        metric_value(&standby_samples, "ax_leader", &[]),
        Some(0.0),
        "standby's ax_leader"
    );

    wait_all_terminal(&client, &ns, Duration::from_secs(180)).await;

    // After the run: the gauges (recomputed every 2s) agree with kubectl, and the histogram holds
    // one observation per dispatch this leader made from the test's queue. Compare two equal
    // kubectl reads around one scrape, so no task changed in between.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Only the test's queue is compared: tasks other tests left in the default queue may
        // still move (a cron's children, a task fenced on a stopped node), so two whole-cluster
        // reads around a scrape need not agree.
        let (before, _) = kubectl_task_counts();
        let samples = parse_metrics(&scrape(&ns, &leader));
        let (after, items) = kubectl_task_counts();
        let (before, after) = (of_queue(before, &queue.name), of_queue(after, &queue.name));
        let metrics = of_queue(metric_task_counts(&samples), &queue.name);
        let ours: Vec<serde_json::Value> = items
            .into_iter()
            .filter(|t| t["metadata"]["namespace"] == ns.as_str())
            .collect();
        let dispatches = kubectl_dispatches_by(&ours, &actor(&leader));
        let observations = metric_value(
            &samples,
            "ax_dispatch_latency_seconds_count",
            &[("queue", queue.name.as_str())],
        );
        if before == after && metrics == after && observations == Some(dispatches as f64) {
            // 12 + 4 × 2 dispatches, and more only if an attempt was retried for the infrastructure.
            assert!(dispatches >= 20, "only {dispatches} dispatches by {leader}");
            let dead = metric_value(&samples, "ax_dead_tasks_total", &[("type", "helm-bad")]);
            assert_eq!(dead, Some(4.0), "ax_dead_tasks_total for the failing tasks");
            println!(
                "metrics agree: {} task series, {dispatches} dispatches",
                metrics.len()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "metrics of {leader} disagree with kubectl for 60s:\n kubectl ax_tasks: {after:?}\n \
             metrics ax_tasks: {metrics:?}\n kubectl before the scrape: {before:?}\n dispatches by {leader}: {dispatches}, \
             ax_dispatch_latency_seconds_count: {observations:?}"
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}

/// `kubectl auth can-i` as the operator's ServiceAccount: true for "yes".
fn can_i(account: &str, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--as", account]);
    let (ok, out, err) = run_kubectl(&all, None);
    match out.trim() {
        "yes" => true,
        "no" => false,
        _ => panic!(
            "kubectl {} gave neither yes nor no (ok={ok}): {out}{err}",
            all.join(" ")
        ),
    }
}

#[tokio::test]
async fn service_account_is_denied_secrets_and_allowed_its_work() {
    let client = client().await;
    // RBAC needs no running operator.
    let release =
        Release::install(&client, "helm-rbac", serde_json::json!({"replicaCount": 0})).await;
    let ns = release.namespace.clone();
    let sa = release.service_account();

    let allowed: &[&[&str]] = &[
        &["watch", "axtasks.ax.dev", "--all-namespaces"],
        &["create", "axtasks.ax.dev", "-n", "default"],
        &[
            "patch",
            "axtasks.ax.dev",
            "--subresource=status",
            "-n",
            "default",
        ],
        &[
            "patch",
            "axdags.ax.dev",
            "--subresource=status",
            "-n",
            "default",
        ],
        &["watch", "axcrons.ax.dev", "--all-namespaces"],
        &[
            "patch",
            "axcrons.ax.dev",
            "--subresource=status",
            "-n",
            "default",
        ],
        &["create", "pods", "-n", "default"],
        // The outcome finalizer of a worker killed for a timeout comes off by a JSON patch.
        &["patch", "pods", "-n", "default"],
        &["delete", "pods", "-n", "default"],
        &["watch", "pods", "--all-namespaces"],
        &["list", "nodes"],
        // An AxQueue's namespaceSelector reads namespace labels.
        &["watch", "namespaces"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &["update", "leases.coordination.k8s.io", "-n", &ns],
        &["create", "leases.coordination.k8s.io", "-n", &ns],
    ];
    let denied: &[&[&str]] = &[
        &["delete", "axcrons.ax.dev", "-n", "default"],
        &["get", "secrets", "-n", &ns],
        &["list", "secrets", "--all-namespaces"],
        &["get", "secrets", "-n", "kube-system"],
        &["get", "configmaps", "-n", &ns],
        &["create", "pods", "--subresource=exec", "-n", "default"],
        &["delete", "nodes"],
        &["patch", "namespaces"],
        &["delete", "namespaces"],
        // The Lease is written by replace over the version read, never patched.
        &["patch", "leases.coordination.k8s.io", "-n", &ns],
        &[
            "patch",
            "leases.coordination.k8s.io",
            "-n",
            "kube-node-lease",
        ],
        &["create", "clusterrolebindings"],
        &[
            "create",
            "serviceaccounts",
            "--subresource=token",
            "-n",
            &ns,
        ],
        &["*", "*"],
    ];
    let mut wrong = Vec::new();
    for args in allowed {
        if !can_i(&sa, args) {
            wrong.push(format!("denied but needed: {}", args.join(" ")));
        }
    }
    for args in denied {
        if can_i(&sa, args) {
            wrong.push(format!("allowed but not needed: {}", args.join(" ")));
        }
    }
    assert!(wrong.is_empty(), "RBAC of {sa}:\n  {}", wrong.join("\n  "));

    // A real request as the account is refused too.
    let (ok, out, err) = run_kubectl(&["get", "secrets", "-n", &ns, "--as", &sa], None);
    assert!(
        !ok && err.contains("Forbidden"),
        "reading Secrets as {sa}: ok={ok} {out}{err}"
    );

    // No wildcards anywhere in the chart's ClusterRole.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = roles.get(FULLNAME).await.expect("the chart's ClusterRole");
    for rule in role.rules.unwrap_or_default() {
        let words = rule
            .verbs
            .iter()
            .chain(rule.resources.iter().flatten())
            .chain(rule.api_groups.iter().flatten());
        for word in words {
            assert!(
                word != "*" && word != "secrets",
                "ClusterRole rule {rule:?}"
            );
        }
    }
}

#[tokio::test]
async fn helm_uninstall_removes_all_but_the_crds_and_leaves_no_worker_pods() {
    let Replicas {
        client,
        mut release,
        ns,
        names,
        leader,
        ..
    } = install_two_replicas("helm-uninstall").await;

    for i in 0..5 {
        create(
            &client,
            &ns,
            &sim_task(&format!("sim-{i}"), "helm-uninstall", 500, 0),
        )
        .await;
    }
    create(&client, &ns, &example("hello.yaml", "real", |_| {})).await;
    wait_all_terminal(&client, &ns, LONG).await;
    assert!(
        !pods_of(&client, &ns, "real").await.is_empty(),
        "the worker pod of a finished task stays with it"
    );

    // The documented way (README, "Install with Helm"): delete the tasks, then uninstall. Worker
    // pods belong to their task (owner reference) and go with it.
    kubectl_ok(&[
        "delete",
        "axtasks",
        "--all",
        "-n",
        &ns,
        "--wait=true",
        "--timeout=60s",
    ]);
    let workers: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = workers
            .list(&ListParams::default().labels("ax.dev/task"))
            .await
            .expect("list worker pods")
            .items;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "worker pods left after their tasks were deleted: {:?}",
            left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    release.uninstall();

    // Everything the chart made is gone; the operator pods (and so the Lease holder) too.
    let deadline = Instant::now() + Duration::from_secs(90);
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    loop {
        let (_, namespaced, _) = run_kubectl(
            &[
                "-n",
                &ns,
                "get",
                "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings",
                "-l",
                &selector,
                "-o",
                "name",
            ],
            None,
        );
        let (_, cluster, _) = run_kubectl(
            &[
                "get",
                "clusterroles,clusterrolebindings",
                "-l",
                &selector,
                "-o",
                "name",
            ],
            None,
        );
        let left: Vec<&str> = namespaced.lines().chain(cluster.lines()).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left after helm uninstall: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let remaining: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(remaining.is_empty(), "pods left in {ns}: {remaining:?}");
    assert!(
        helm(&["list", "--namespace", &ns, "--short"])
            .trim()
            .is_empty(),
        "the release is gone"
    );
    // The Lease is the operator's own record, not the chart's: it may stay, but what held it is
    // gone (no pod at all is left in the namespace).
    let holder = lease_holder(&client, &ns).await;
    assert!(
        holder.is_none() || holder.as_ref().is_some_and(|h| names.contains(h)),
        "Lease held by {holder:?}, not one of the operator pods {names:?} (leader was {leader})"
    );
    // Helm never deletes CRDs: the AxTask API and everything stored in it outlive the release.
    kubectl_ok(&["get", "crd", "axtasks.ax.dev"]);
}

// --- leader election under a slow API server and a rolling restart -----------------------------

/// Starts a flow of `count` simulated tasks of 1–2 s into `ns`, one every `every`.
fn task_flow(
    client: &kube::Client,
    ns: &str,
    prefix: &'static str,
    count: u64,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let (client, ns) = (client.clone(), ns.to_string());
    tokio::spawn(async move {
        for i in 0..count {
            let task = sim_task(&format!("{prefix}-{i:03}"), prefix, 1000 + (i % 3) * 500, 0);
            create(&client, &ns, &task).await;
            tokio::time::sleep(every).await;
        }
    })
}

/// What `record_worker_pods` returns: the pods seen, and the watch recording them.
type RecordedWorkers = (
    std::sync::Arc<std::sync::Mutex<PodsByAttempt>>,
    tokio::task::JoinHandle<()>,
);

/// How long a flow of tasks through a disturbed operator may take to finish.
const FLOW_TIMEOUT: Duration = Duration::from_secs(300);

/// Every one of the `count` tasks Succeeded within `timeout` on its first attempt, and no attempt
/// ever had two pods, as the `workers` recording (from `record_worker_pods`, stopped here) saw.
async fn assert_all_succeeded_once(
    client: &kube::Client,
    ns: &str,
    count: u64,
    workers: RecordedWorkers,
    timeout: Duration,
) -> Vec<AxTask> {
    let (seen, watch) = workers;
    let tasks = wait_all_terminal(client, ns, timeout).await;
    assert_eq!(tasks.len() as u64, count);
    for t in &tasks {
        let s = t.status.clone().expect("status");
        assert_eq!(
            (s.phase, s.attempt, s.retries),
            (Some(TaskPhase::Succeeded), 1, 0),
            "{}: {:#?}",
            t.name_any(),
            s.history
        );
        assert_history_chain(t);
    }
    // Pods are created before the status says so; give the watch a moment to see the last ones.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    let seen = seen.lock().expect("pod record lock");
    let duplicated: Vec<_> = seen.iter().filter(|(_, uids)| uids.len() > 1).collect();
    assert!(
        duplicated.is_empty(),
        "attempts with two pods: {duplicated:?}"
    );
    for t in &tasks {
        assert!(
            seen.contains_key(&(t.name_any(), "1".into())),
            "no worker pod seen for {}",
            t.name_any()
        );
    }
    tasks
}

#[tokio::test]
async fn leader_keeps_leading_through_an_api_server_pause_shorter_than_its_renew_deadline() {
    let Replicas {
        client,
        release: _release,
        ns,
        names,
        leader,
        ..
    } = install_two_replicas("helm-pause-short").await;
    let before = lease_spec(&client, &ns).await.expect("the Lease");

    // Paused for 4 s: renewals are 1 s apart and the leader leads 7 s past the last one sent, so
    // the renewal stuck in the paused server still lands in time.
    const PAUSE: Duration = Duration::from_secs(4);
    assert!(PAUSE.as_secs() + 2 < RENEW_DEADLINE_SECONDS);
    let pause = ApiServerPause::start(PAUSE + Duration::from_secs(5));
    tokio::time::sleep(PAUSE).await;
    let paused = pause.resume();
    wait_api_server(&client).await;
    println!("API server paused for {paused:?}");

    // Through the next renewals: the same holder, the same term, nobody restarted.
    let watch_until = Instant::now() + Duration::from_secs(2 * LEASE_SECONDS);
    while Instant::now() < watch_until {
        let now = lease_spec(&client, &ns).await.expect("the Lease");
        assert_eq!(now.holder_identity.as_deref(), Some(leader.as_str()));
        assert_eq!(
            (now.acquire_time.clone(), now.lease_transitions),
            (before.acquire_time.clone(), before.lease_transitions),
            "the leader's term did not change"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for pod in &names {
        assert_eq!(restarts(&client, &ns, pod).await.0, 0, "{pod} restarted");
    }
    let logs = kubectl_ok(&["-n", &ns, "logs", &leader]);
    assert!(
        !logs.contains("lost lease") && !logs.contains("lost the lease"),
        "{leader} lost its lease:\n{logs}"
    );
    // And it still does the work.
    create(&client, &ns, &sim_task("after-pause", "pause", 200, 0)).await;
    let task = wait_phase(&client, &ns, "after-pause", TaskPhase::Succeeded, LONG).await;
    assert_eq!(dispatches_by(&[task], &actor(&leader)).len(), 1);
}

#[tokio::test]
async fn leader_stops_before_the_standby_starts_when_the_api_server_pauses_past_the_lease() {
    let Replicas {
        client,
        release: _release,
        ns,
        leader,
        standby,
        ..
    } = install_two_replicas("helm-pause-long").await;

    let workers = record_worker_pods(&client, &ns);
    const TASKS: u64 = 30;
    task_flow(&client, &ns, "paused", TASKS, Duration::from_millis(100))
        .await
        .expect("creating the tasks");
    // Tasks in flight when the API server stops.
    wait_succeeded(&client, &ns, 1).await;

    // Longer than the lease: the leader cannot know whether a standby took over, so it must stop
    // by its renew deadline, while the API server is still stopped.
    let pause_length = Duration::from_secs(LEASE_SECONDS + 4);
    let paused_at = jiff::Timestamp::now();
    let pause = ApiServerPause::start(pause_length + Duration::from_secs(5));
    tokio::time::sleep(pause_length).await;
    pause.resume();
    let resumed_at = jiff::Timestamp::now();
    wait_api_server(&client).await;

    // The old leader's process ended during the pause (the kubelet reports it once it can).
    let deadline = Instant::now() + Duration::from_secs(90);
    let finished = loop {
        if let (n, Some(finished)) = restarts(&client, &ns, &leader).await
            && n >= 1
        {
            break finished;
        }
        assert!(
            Instant::now() < deadline,
            "{leader} did not stop after a {pause_length:?} pause"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("paused {paused_at}, {leader} exited {finished}, resumed {resumed_at}");
    // finishedAt has whole seconds: compare within that.
    let second = jiff::SignedDuration::from_secs(1);
    assert!(
        finished >= paused_at - second && finished <= resumed_at,
        "{leader} stopped at {finished}, not during the pause ({paused_at} to {resumed_at})"
    );
    let previous = kubectl_ok(&["-n", &ns, "logs", &leader, "--previous"]);
    assert!(previous.contains("lost the lease; exiting"), "{previous}");

    // Someone leads again, with a renewal written after the resume, i.e. after the old leader
    // was gone; the standby never restarted.
    let deadline = Instant::now() + Duration::from_secs(LEASE_SECONDS * 3 + 30);
    let holder = loop {
        let spec = lease_spec(&client, &ns).await.unwrap_or_default();
        let renewed = spec.renew_time.map(|t| t.0);
        if let Some(h) = spec.holder_identity.filter(|h| !h.is_empty())
            && renewed.is_some_and(|r| r > resumed_at)
        {
            break h;
        }
        assert!(Instant::now() < deadline, "nobody leads after the pause");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    println!("leading after the pause: {holder}");
    assert_eq!(
        restarts(&client, &ns, &standby).await.0,
        0,
        "the standby restarted"
    );

    let tasks = assert_all_succeeded_once(&client, &ns, TASKS, workers, FLOW_TIMEOUT).await;
    // No dispatch by the old leader's process between its exit and the resume.
    let late: Vec<_> = dispatches_by(&tasks, &actor(&leader))
        .into_iter()
        .filter(|t| *t > finished + second && *t < resumed_at)
        .collect();
    assert!(late.is_empty(), "dispatched while stopped: {late:?}");
}

#[tokio::test]
async fn rollout_restart_while_tasks_flow_keeps_one_leader_at_a_time() {
    let Replicas {
        client,
        release: _release,
        ns,
        names,
        ..
    } = install_two_replicas("helm-rollout").await;

    let audit = LeaseAudit::start(&client, &ns);
    let workers = record_worker_pods(&client, &ns);
    const TASKS: u64 = 200;
    let creator = task_flow(&client, &ns, "rollout", TASKS, Duration::from_millis(100));
    // Tasks flowing: a few done already.
    wait_succeeded(&client, &ns, 5).await;
    let deployment = format!("deployment/{FULLNAME}");
    kubectl_ok(&["-n", &ns, "rollout", "restart", &deployment]);
    kubectl_ok(&[
        "-n",
        &ns,
        "rollout",
        "status",
        &deployment,
        "--timeout=180s",
    ]);
    creator.await.expect("creating the tasks");
    let tasks = assert_all_succeeded_once(&client, &ns, TASKS, workers, FLOW_TIMEOUT).await;

    let terms = audit.stop();
    println!("Lease terms: {terms:#?}");
    let holders: std::collections::BTreeSet<&str> =
        terms.iter().map(|t| t.holder.as_str()).collect();
    assert!(
        holders.iter().any(|h| !names.iter().any(|n| n == h)),
        "a new pod leads after the rollout: {terms:?}"
    );
    for pair in terms.windows(2) {
        let ended = pair[0].ended.expect("a term followed by another ended");
        assert!(ended <= pair[1].acquired, "terms overlap: {pair:?}");
    }
    // Every dispatch was made by the holder of the Lease at that moment.
    let mut outside = Vec::new();
    for t in &tasks {
        for h in history(t).iter().filter(|h| h.to == TaskPhase::Scheduled) {
            let during_a_term = terms.iter().any(|term| {
                actor(&term.holder) == h.actor
                    && h.time >= term.acquired
                    && term.ended.is_none_or(|end| h.time <= end)
            });
            if !during_a_term {
                outside.push(format!("{} by {} at {}", t.name_any(), h.actor, h.time));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "dispatches outside the dispatcher's term: {outside:#?}"
    );
}
