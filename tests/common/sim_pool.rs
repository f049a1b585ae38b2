//! A test's own simulated nodes: an `ax-sim --pool NAME` process of the test's own, driving nodes
//! labelled and tainted `ax.dev/sim-pool=NAME` that only the test's pods (labelled so too) select
//! and tolerate. The
//! test may change their capacity and pressure at will (annotations `ax.dev/sim-capacity`,
//! `ax.dev/sim-pressure`) without disturbing tests that run beside it on the shared sim nodes.
//! Dropping the pool stops its simulator and deletes its nodes.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::sim::SimWorker;
use super::{repo_root, run_kubectl};

pub const POOL_LABEL: &str = "ax.dev/sim-pool";

pub struct SimPool {
    pub name: String,
    pub nodes: Vec<String>,
    sim: Child,
}

fn sim_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("AX_SIM_BIN") {
        return path.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("debug").join("ax-sim")
}

fn allocatable_pods(node: &Node) -> Option<String> {
    let quantity = node.status.as_ref()?.allocatable.as_ref()?.get("pods")?;
    Some(quantity.0.clone())
}

fn ready(node: &Node) -> bool {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .cloned()
        .unwrap_or_default();
    let is_ready = conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    // The node lifecycle controller's not-ready/unreachable taints keep pods off a new node a while.
    let lifecycle_taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints.iter().any(|t| {
                t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
            })
        });
    is_ready && !lifecycle_taint
}

impl SimPool {
    /// Starts a simulator for `count` nodes of `pods_per_node` pods each and waits until they are
    /// Ready with that capacity.
    pub async fn start(client: &Client, test: &str, count: usize, pods_per_node: u32) -> SimPool {
        let name = format!("{test}-{:04x}", rand::random::<u16>());
        let prefix = format!("ax-pool-{name}");
        let log_dir = repo_root().join("target").join("e2e");
        std::fs::create_dir_all(&log_dir).expect("target/e2e");
        let log_path = log_dir.join(format!("ax-sim-{name}.log"));
        let log = std::fs::File::create(&log_path).expect("sim log file");
        let binary = sim_binary();
        let sim = Command::new(&binary)
            .args([
                "--nodes",
                &count.to_string(),
                "--prefix",
                &prefix,
                "--pool",
                &name,
            ])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("sim log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {} (build it with `cargo build -p ax-sim`): {e}",
                    binary.display()
                )
            });
        let nodes = (0..count).map(|i| format!("{prefix}-{i}")).collect();
        let pool = SimPool { name, nodes, sim };
        pool.wait_nodes(client, ready).await;
        pool.set_capacity(client, pods_per_node).await;
        pool
    }

    /// Waits until every node of the pool exists and satisfies `done`.
    async fn wait_nodes(&self, client: &Client, done: impl Fn(&Node) -> bool) {
        let api: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let listed = api
                .list(&ListParams::default().labels(&format!("{POOL_LABEL}={}", self.name)))
                .await
                .expect("list pool nodes");
            let ok = listed.items.iter().filter(|n| done(n)).count();
            if ok == self.nodes.len() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sim pool {}: {ok} of {} nodes ready as wanted; nodes: {:#?}",
                self.name,
                self.nodes.len(),
                listed
                    .items
                    .iter()
                    .map(|n| (n.name_any(), n.status.clone()))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn annotate(&self, client: &Client, node: &str, key: &str, value: &str) {
        let api: Api<Node> = Api::all(client.clone());
        let patch = json!({"metadata": {"annotations": {key: value}}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("annotating node {node}: {e}"));
    }

    /// Sets every node's pod capacity and waits until all of them report it.
    pub async fn set_capacity(&self, client: &Client, pods_per_node: u32) {
        let value = format!("pods={pods_per_node}");
        for node in &self.nodes {
            self.annotate(client, node, "ax.dev/sim-capacity", &value)
                .await;
        }
        let want = pods_per_node.to_string();
        self.wait_nodes(client, |node| {
            ready(node) && allocatable_pods(node).as_deref() == Some(want.as_str())
        })
        .await;
    }

    /// Makes node `index` report `conditions` (e.g. "MemoryPressure", or "" for none).
    pub async fn set_pressure(&self, client: &Client, index: usize, conditions: &str) {
        let node = &self.nodes[index];
        self.annotate(client, node, "ax.dev/sim-pressure", conditions)
            .await;
        let api: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let current = api.get(node).await.expect("get node");
            let pressed: Vec<String> = current
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .map(|cs| {
                    cs.iter()
                        .filter(|c| c.type_.ends_with("Pressure") && c.status == "True")
                        .map(|c| c.type_.clone())
                        .collect()
                })
                .unwrap_or_default();
            let want: Vec<String> = conditions
                .split(',')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
            if pressed == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} reports {pressed:?}, not {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A worker pod template that lands on this pool only (and carries the pool's label, which its
    /// simulator watches for); the simulator runs it for `millis`.
    pub fn template(&self, millis: u64) -> serde_json::Value {
        json!({
            "metadata": {"labels": {POOL_LABEL: self.name}},
            "spec": self.pod_spec(millis),
        })
    }

    fn pod_spec(&self, millis: u64) -> serde_json::Value {
        // ax-sim's own builder, with the pool's selector and toleration instead of the shared ones.
        let mut spec = SimWorker::running_for(millis).start_ms(50).pod_spec();
        spec["nodeSelector"] = json!({POOL_LABEL: self.name});
        spec["tolerations"] =
            json!([{"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}]);
        spec
    }
}

impl SimPool {
    /// Stops the simulator and leaves its nodes: as a kubelet that died with its machine, nothing
    /// reports on their pods any more (the nodes go NotReady once their heartbeats stop).
    pub fn stop_simulator(&mut self) {
        let _ = self.sim.kill();
        let _ = self.sim.wait();
    }
}

impl Drop for SimPool {
    fn drop(&mut self) {
        let _ = self.sim.kill();
        let _ = self.sim.wait();
        let mut args = vec!["delete", "node", "--ignore-not-found", "--wait=false"];
        args.extend(self.nodes.iter().map(String::as_str));
        run_kubectl(&args, None);
    }
}
