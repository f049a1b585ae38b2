//! End to end against a real cluster with ax-sim running (`e2e/cluster.sh up --sim-nodes 3`): 200 pods
//! on sim nodes reach the phase their env asks for, and graceful deletion makes them disappear.
//!
//! Run: `KUBECONFIG=/var/lib/ax-e2e/admin.kubeconfig cargo test -p ax-sim --test sim_pods -- --nocapture`

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ax_sim::worker::{SIM_NODE_LABEL, SimWorker};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Namespace, Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const NAMESPACE: &str = "ax-e2e";
const POD_COUNT: usize = 200;
const HANGING_PODS: usize = 6;
const PHASE_DEADLINE: Duration = Duration::from_secs(60);
const GONE_DEADLINE: Duration = Duration::from_secs(60);
const SETUP_DEADLINE: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(500);
const RUN_LABEL: &str = "ax.dev/e2e-run";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Succeeded,
    Failed {
        exit_code: i32,
        message: Option<String>,
    },
    Hanging,
}

/// ~1/2 exit 0, ~1/4 exit 1 with a message, ~1/4 exit 42, and the first few hang.
fn expected_for(index: usize) -> Expected {
    if index < HANGING_PODS {
        return Expected::Hanging;
    }
    match index % 4 {
        0 | 1 => Expected::Succeeded,
        2 => Expected::Failed {
            exit_code: 1,
            message: Some(format!("{{\"error\":\"sim-{index}\"}}")),
        },
        _ => Expected::Failed {
            exit_code: 42,
            message: None,
        },
    }
}

fn pod_manifest(run_id: &str, index: usize, expected: &Expected) -> Pod {
    let mut worker = SimWorker::default()
        .start_ms(((index * 37) % 200) as u64)
        .duration_ms(((index * 53) % 500) as u64);
    match expected {
        Expected::Succeeded => {}
        Expected::Failed { exit_code, message } => {
            worker = worker.exit_code(*exit_code);
            if let Some(message) = message {
                worker = worker.message(message.clone());
            }
        }
        Expected::Hanging => worker = worker.hang(),
    }
    let mut spec = worker.pod_spec();
    spec["restartPolicy"] = "Never".into();
    spec["dnsPolicy"] = "Default".into();
    spec["automountServiceAccountToken"] = false.into();
    spec["containers"][0]["command"] = json!(["sh", "-c", "exit 0"]);
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("sim-{run_id}-{index}"),
            "namespace": NAMESPACE,
            "labels": {RUN_LABEL: run_id, "ax.dev/e2e-test": "sim-pods"},
        },
        "spec": spec,
    }))
    .expect("the pod manifest is a valid Pod")
}

fn main_terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

/// Why the pod is not (yet) what was expected, or `None` when it is.
fn mismatch(pod: &Pod, expected: &Expected) -> Option<String> {
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .unwrap_or("<none>");
    let terminated = main_terminated(pod).map(|t| (t.exit_code, t.message.clone()));
    let ok = match expected {
        Expected::Succeeded => {
            phase == "Succeeded" && terminated.as_ref().is_some_and(|(code, _)| *code == 0)
        }
        Expected::Failed { exit_code, message } => {
            phase == "Failed" && terminated.as_ref() == Some(&(*exit_code, message.clone()))
        }
        Expected::Hanging => {
            let running = pod.status.as_ref().and_then(|status| {
                status
                    .container_statuses
                    .as_ref()?
                    .first()?
                    .state
                    .as_ref()?
                    .running
                    .as_ref()
            });
            phase == "Running" && running.is_some()
        }
    };
    (!ok).then(|| {
        format!(
            "{}: expected {expected:?}, got phase {phase} terminated {terminated:?}",
            pod.name_any()
        )
    })
}

async fn ensure_namespace(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("valid namespace");
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("creating namespace {NAMESPACE}: {error}"),
    }
    // Pod admission needs the namespace's default ServiceAccount, which a controller creates shortly after.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    while accounts.get_opt("default").await.ok().flatten().is_none() {
        assert!(
            start.elapsed() < SETUP_DEADLINE,
            "namespace {NAMESPACE} got no default ServiceAccount within {SETUP_DEADLINE:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn wait_for_ready_sim_node(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let params = ListParams::default().labels(&format!("{SIM_NODE_LABEL}=true"));
    let start = Instant::now();
    loop {
        let listed = nodes.list(&params).await.expect("listing nodes");
        let ready = listed.items.iter().any(|node| {
            node.status
                .as_ref()
                .and_then(|status| status.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|condition| condition.type_ == "Ready" && condition.status == "True")
                })
        });
        if ready {
            return;
        }
        assert!(
            start.elapsed() < SETUP_DEADLINE,
            "no Ready node labelled ax.dev/sim-node=true (found {}): is ax-sim running? \
             Start the cluster with e2e/cluster.sh up --sim-nodes 3",
            listed.items.len()
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Polls until every pod matches its expectation; returns how long that took or what still differs.
async fn wait_for_expected(
    pods: &Api<Pod>,
    selector: &str,
    expected: &HashMap<String, Expected>,
    start: Instant,
) -> Result<Duration, String> {
    let params = ListParams::default().labels(selector);
    loop {
        let problems: Vec<String> = match pods.list(&params).await {
            Ok(listed) => {
                let mut problems: Vec<String> = listed
                    .items
                    .iter()
                    .filter_map(|pod| match expected.get(&pod.name_any()) {
                        Some(expected) => mismatch(pod, expected),
                        None => Some(format!("{}: unexpected pod", pod.name_any())),
                    })
                    .collect();
                if listed.items.len() != expected.len() {
                    problems.push(format!(
                        "{} pods listed, {} created",
                        listed.items.len(),
                        expected.len()
                    ));
                }
                problems
            }
            Err(error) => vec![format!("listing pods: {error}")],
        };
        if problems.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > PHASE_DEADLINE {
            let shown: Vec<&String> = problems.iter().take(10).collect();
            return Err(format!(
                "{} pod(s) not in the expected state after {PHASE_DEADLINE:?}, e.g. {shown:#?}",
                problems.len()
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Deletes the run's pods one by one (default grace period) and watches until all are gone; returns the last
/// state of each deleted pod, as the Deleted watch events carry it.
async fn delete_and_wait_gone(
    pods: &Api<Pod>,
    selector: &str,
) -> Result<(Duration, BTreeMap<String, Pod>), String> {
    let mut events =
        watcher::watcher(pods.clone(), watcher::Config::default().labels(selector)).boxed();
    let mut remaining = HashSet::new();
    // The list must be complete before deleting, so that no deletion goes unseen.
    loop {
        match events.try_next().await {
            Ok(Some(Event::InitApply(pod))) => {
                remaining.insert(pod.name_any());
            }
            Ok(Some(Event::InitDone)) => break,
            Ok(Some(_)) => {}
            Ok(None) => return Err("pod watch ended before listing".into()),
            Err(error) => return Err(format!("pod watch failed while listing: {error}")),
        }
    }
    // One delete per pod, like the operator does: a 1.20 API server's DeleteCollection reuses one
    // DeleteOptions for all items, so after the first terminal pod every Running one got grace 0 too,
    // bypassing the graceful path this test is about.
    let names: Vec<String> = remaining.iter().cloned().collect();
    let deleting = stream::iter(names)
        .map(|name| async move {
            match pods.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                Err(error) => Err(format!("deleting {name}: {error}")),
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>();
    let start = Instant::now();
    let mut deleted = BTreeMap::new();
    let mut relisted = HashSet::new();
    let watching = async {
        while !remaining.is_empty() {
            match events.try_next().await {
                Ok(Some(Event::Delete(pod))) => {
                    remaining.remove(&pod.name_any());
                    deleted.insert(pod.name_any(), pod);
                }
                // The watcher re-lists after an error: pods absent from that list were deleted unseen.
                Ok(Some(Event::Init)) => relisted.clear(),
                Ok(Some(Event::InitApply(pod))) => {
                    relisted.insert(pod.name_any());
                }
                Ok(Some(Event::InitDone)) => remaining.retain(|name| relisted.contains(name)),
                Ok(Some(Event::Apply(_))) => {}
                Ok(None) => return Err("pod watch ended".to_owned()),
                Err(error) => eprintln!("pod watch error (continuing): {error}"),
            }
        }
        Ok(())
    };
    // Watch while deleting, so the server never drops a watch whose events pile up unread.
    match tokio::time::timeout(GONE_DEADLINE, async { tokio::join!(deleting, watching) }).await {
        Ok((deleted_all, watched)) => {
            deleted_all?;
            watched?;
        }
        Err(_) => {
            let left: Vec<&String> = remaining.iter().take(10).collect();
            return Err(format!(
                "{} pod(s) still present {GONE_DEADLINE:?} after deletion, e.g. {left:?}",
                remaining.len()
            ));
        }
    }
    let left = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|error| format!("listing pods after deletion: {error}"))?;
    if !left.items.is_empty() {
        return Err(format!(
            "{} pod(s) listed after their deletion was seen",
            left.items.len()
        ));
    }
    Ok((start.elapsed(), deleted))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_drives_pods_to_the_phase_their_env_asks_for() {
    if std::env::var_os("KUBECONFIG").is_none() {
        panic!("KUBECONFIG not set: start the cluster with e2e/cluster.sh up --sim-nodes 3");
    }
    let client = Client::try_default()
        .await
        .expect("a client from KUBECONFIG");
    ensure_namespace(&client).await;
    wait_for_ready_sim_node(&client).await;

    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let run_id = format!("{}-{}", since_epoch.as_millis(), std::process::id());
    let selector = format!("{RUN_LABEL}={run_id}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let expected: HashMap<String, Expected> = (0..POD_COUNT)
        .map(|index| (format!("sim-{run_id}-{index}"), expected_for(index)))
        .collect();

    let start = Instant::now();
    let created: Result<Vec<Pod>, kube::Error> = stream::iter(0..POD_COUNT)
        .map(|index| {
            let pods = pods.clone();
            let manifest = pod_manifest(&run_id, index, &expected_for(index));
            async move { pods.create(&PostParams::default(), &manifest).await }
        })
        .buffer_unordered(16)
        .try_collect()
        .await;
    let created_in = start.elapsed();
    let outcome = match created {
        Ok(_) => wait_for_expected(&pods, &selector, &expected, start).await,
        Err(error) => Err(format!("creating pods: {error}")),
    };
    // Always clean up, also after a failure above, so runs do not pile pods up.
    let deletion = delete_and_wait_gone(&pods, &selector).await;

    let reached_in = outcome.unwrap_or_else(|problem| panic!("{problem}"));
    println!(
        "created {POD_COUNT} pods in {:.1}s; all reached their expected phase {:.1}s after the first create ({:.1} pods/s)",
        created_in.as_secs_f64(),
        reached_in.as_secs_f64(),
        POD_COUNT as f64 / reached_in.as_secs_f64()
    );
    let (gone_in, deleted) = deletion.unwrap_or_else(|problem| panic!("{problem}"));
    println!(
        "all {POD_COUNT} pods gone {:.1}s after the delete ({:.1} pods/s)",
        gone_in.as_secs_f64(),
        POD_COUNT as f64 / gone_in.as_secs_f64().max(0.001)
    );
    // Running pods can only go through the simulator's graceful-deletion path: killed, then removed.
    for index in 0..HANGING_PODS {
        let name = format!("sim-{run_id}-{index}");
        let last = deleted
            .get(&name)
            .unwrap_or_else(|| panic!("{name}: deletion not seen"));
        let killed = main_terminated(last).map(|t| (t.exit_code, t.reason.clone()));
        assert_eq!(
            killed,
            Some((137, Some("Killed".to_owned()))),
            "{name}: last state before removal"
        );
    }
}
