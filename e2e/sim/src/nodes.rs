//! Registers the simulated Node objects and keeps them alive the way a kubelet does: a Lease renewed
//! every 10 s and the Ready condition's heartbeat every 20 s (the node lifecycle controller marks a
//! node unreachable after 40 s without either and evicts its pods).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::future::join_all;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::writer::{ApiWriter, WriteError};

pub use ax_sim::worker::{SIM_NODE_LABEL, SIM_NODE_TAINT_KEY};
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
const LEASE_DURATION_SECONDS: i32 = 40;
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// The Ready heartbeat is written every this many lease renewals (20 s).
const RENEWALS_PER_HEARTBEAT: u64 = 2;

pub fn node_names(prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|index| format!("{prefix}-{index}"))
        .collect()
}

fn sim_taint() -> Taint {
    Taint {
        key: SIM_NODE_TAINT_KEY.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn sim_labels(name: &str) -> BTreeMap<String, String> {
    [
        (SIM_NODE_LABEL, "true"),
        ("type", "sim"),
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .collect()
}

/// The patch that brings an existing node's labels and taints to what the simulator needs, keeping
/// taints others added; `None` if nothing is missing.
pub fn node_metadata_patch(node: &Node) -> Option<Value> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let wanted = sim_labels(name);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let missing_labels: BTreeMap<&String, &String> = wanted
        .iter()
        .filter(|(key, value)| labels.get(*key) != Some(*value))
        .collect();
    let taints = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.clone())
        .unwrap_or_default();
    let taint = sim_taint();
    let has_taint = taints.iter().any(|existing| {
        existing.key == taint.key
            && existing.effect == taint.effect
            && existing.value == taint.value
    });
    if missing_labels.is_empty() && has_taint {
        return None;
    }
    let mut patch = json!({"metadata": {"labels": missing_labels}});
    if !has_taint {
        let mut taints: Vec<Taint> = taints
            .into_iter()
            .filter(|existing| !(existing.key == taint.key && existing.effect == taint.effect))
            .collect();
        taints.push(taint);
        patch["spec"] = json!({ "taints": taints });
    }
    Some(patch)
}

/// Node status: Ready with a fresh heartbeat and a capacity no test will exhaust.
pub fn node_status(
    name: &str,
    now: Timestamp,
    ready_since: Timestamp,
    kubelet_version: &str,
) -> Value {
    let resources = json!({
        "cpu": "1000",
        "memory": "4Ti",
        "pods": "10000",
        "ephemeral-storage": "10Ti",
    });
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ready_since),
        })
    };
    json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "phase": "Running",
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "simulated node"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "simulated node"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "simulated node"),
                condition("Ready", "True", "KubeletReady", "ax-sim is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": crate::status::HOST_IP},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": "ax-sim",
                "osImage": "ax-sim",
                "containerRuntimeVersion": "ax-sim://1",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": kubelet_version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
    })
}

/// The Lease that says the node's "kubelet" is alive; owned by the Node so it goes when the node goes.
pub fn node_lease(name: &str, node_uid: &str, now: Timestamp) -> Lease {
    let mut lease = Lease::default();
    lease.metadata.name = Some(name.to_owned());
    lease.metadata.namespace = Some(NODE_LEASE_NAMESPACE.to_owned());
    lease.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.to_owned(),
            uid: node_uid.to_owned(),
            ..Default::default()
        },
    ]);
    lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
        holder_identity: Some(name.to_owned()),
        lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
        renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            now,
        )),
        ..Default::default()
    });
    lease
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("node {node}: {source}")]
    Write {
        node: String,
        #[source]
        source: WriteError,
    },
    #[error("node {node}: the API server returned it without a uid")]
    NoUid { node: String },
}

pub struct SimNodes {
    nodes: Api<Node>,
    leases: Api<Lease>,
    writer: ApiWriter,
    names: Vec<String>,
    kubelet_version: String,
    ready_since: Timestamp,
    /// Node name → uid, for the Lease owner reference; refreshed when a node is re-created.
    uids: Mutex<HashMap<String, String>>,
}

impl SimNodes {
    pub fn new(
        client: Client,
        writer: ApiWriter,
        names: Vec<String>,
        kubelet_version: String,
    ) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            writer,
            names,
            kubelet_version,
            ready_since: Timestamp::now(),
            uids: Mutex::new(HashMap::new()),
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Creates or updates every node, marks it Ready and takes its Lease.
    pub async fn register_all(&self) -> Result<(), NodeError> {
        for result in join_all(self.names.iter().map(|name| self.register(name))).await {
            result?;
        }
        Ok(())
    }

    async fn register(&self, name: &str) -> Result<(), NodeError> {
        let write_error = |source| NodeError::Write {
            node: name.to_owned(),
            source,
        };
        let existing = self
            .writer
            .write("get node", || self.nodes.get_opt(name))
            .await
            .map_err(write_error)?;
        let (post_params, patch_params) = (PostParams::default(), PatchParams::default());
        let node = match existing {
            None => {
                let mut node = Node::default();
                node.metadata.name = Some(name.to_owned());
                node.metadata.labels = Some(sim_labels(name));
                node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                    taints: Some(vec![sim_taint()]),
                    ..Default::default()
                });
                let created = self
                    .writer
                    .write("create node", || self.nodes.create(&post_params, &node))
                    .await;
                match created {
                    Ok(created) => created,
                    // Created concurrently (another registration after a 404): use what is there.
                    Err(WriteError::Failed {
                        source: kube::Error::Api(status),
                        ..
                    }) if status.code == 409 => self
                        .writer
                        .write("get node", || self.nodes.get(name))
                        .await
                        .map_err(write_error)?,
                    Err(error) => return Err(write_error(error)),
                }
            }
            Some(node) => match node_metadata_patch(&node).map(Patch::Merge) {
                None => node,
                Some(patch) => self
                    .writer
                    .write("patch node", || {
                        self.nodes.patch(name, &patch_params, &patch)
                    })
                    .await
                    .map_err(write_error)?,
            },
        };
        let uid = node.metadata.uid.clone().ok_or_else(|| NodeError::NoUid {
            node: name.to_owned(),
        })?;
        self.uids.lock().await.insert(name.to_owned(), uid);
        self.heartbeat(name).await?;
        self.renew_lease(name).await?;
        tracing::info!(node = name, "sim node registered and Ready");
        Ok(())
    }

    async fn heartbeat(&self, name: &str) -> Result<(), NodeError> {
        let status = Patch::Merge(node_status(
            name,
            Timestamp::now(),
            self.ready_since,
            &self.kubelet_version,
        ));
        let params = PatchParams::default();
        self.writer
            .write("node status", || {
                self.nodes.patch_status(name, &params, &status)
            })
            .await
            .map(drop)
            .map_err(|source| NodeError::Write {
                node: name.to_owned(),
                source,
            })
    }

    async fn renew_lease(&self, name: &str) -> Result<(), NodeError> {
        let Some(uid) = self.uids.lock().await.get(name).cloned() else {
            return Err(NodeError::NoUid {
                node: name.to_owned(),
            });
        };
        let lease = node_lease(name, &uid, Timestamp::now());
        let (post_params, patch_params) = (PostParams::default(), PatchParams::default());
        let patch = Patch::Merge(&lease);
        let patched = self
            .writer
            .write("renew lease", || {
                self.leases.patch(name, &patch_params, &patch)
            })
            .await;
        let result = match patched {
            Err(WriteError::Gone) => self
                .writer
                .write("create lease", || self.leases.create(&post_params, &lease))
                .await
                .map(drop),
            other => other.map(drop),
        };
        result.map_err(|source| NodeError::Write {
            node: name.to_owned(),
            source,
        })
    }

    /// One node's share of a keep-alive tick; a node deleted behind our back is registered again.
    async fn keep_alive_one(&self, name: &str, with_heartbeat: bool) {
        let mut result = self.renew_lease(name).await;
        if result.is_ok() && with_heartbeat {
            result = self.heartbeat(name).await;
        }
        let result = match result {
            Err(NodeError::Write {
                source: WriteError::Gone,
                ..
            }) => {
                tracing::warn!(node = name, "sim node disappeared, registering it again");
                self.register(name).await
            }
            other => other,
        };
        if let Err(error) = result {
            tracing::warn!(node = name, %error, "sim node keep-alive failed; retrying next tick");
        }
    }

    /// Renews leases and heartbeats forever.
    pub async fn keep_alive(&self) {
        let mut ticks = tokio::time::interval(LEASE_RENEW_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick fires at once; registration just wrote everything.
        ticks.tick().await;
        let mut tick: u64 = 0;
        loop {
            ticks.tick().await;
            tick += 1;
            let with_heartbeat = tick.is_multiple_of(RENEWALS_PER_HEARTBEAT);
            join_all(
                self.names
                    .iter()
                    .map(|name| self.keep_alive_one(name, with_heartbeat)),
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("valid timestamp")
    }

    #[test]
    fn names_follow_the_prefix() {
        assert_eq!(
            node_names("ax-sim", 3),
            ["ax-sim-0", "ax-sim-1", "ax-sim-2"]
        );
        assert!(node_names("x", 0).is_empty());
    }

    #[test]
    fn status_is_ready_with_large_capacity() {
        let status = node_status("ax-sim-0", ts(), ts(), "v1.20.2");
        assert_eq!(status["status"]["capacity"]["cpu"], "1000");
        assert_eq!(status["status"]["allocatable"]["memory"], "4Ti");
        assert_eq!(status["status"]["allocatable"]["pods"], "10000");
        let conditions = status["status"]["conditions"]
            .as_array()
            .expect("conditions");
        let ready = conditions
            .iter()
            .find(|condition| condition["type"] == "Ready")
            .expect("Ready");
        assert_eq!(ready["status"], "True");
        assert_eq!(ready["lastHeartbeatTime"], "2027-01-15T08:00:00Z");
        // The patch must deserialize as a Node, so its field names are real ones.
        let node: Node = serde_json::from_value(status).expect("a Node");
        assert_eq!(
            node.status
                .and_then(|status| status.node_info)
                .map(|info| info.kubelet_version)
                .as_deref(),
            Some("v1.20.2")
        );
    }

    #[test]
    fn lease_is_owned_by_the_node() {
        let lease = node_lease("ax-sim-1", "uid-1", ts());
        let value = serde_json::to_value(&lease).expect("serializable");
        assert_eq!(value["metadata"]["namespace"], "kube-node-lease");
        assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(value["spec"]["holderIdentity"], "ax-sim-1");
        assert_eq!(value["spec"]["renewTime"], "2027-01-15T08:00:00.000000Z");
    }

    #[test]
    fn metadata_patch_adds_only_what_is_missing() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "ax-sim-0", "labels": {"extra": "kept"}},
            "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}
        }))
        .expect("a Node");
        let patch = node_metadata_patch(&node).expect("a patch");
        assert_eq!(patch["metadata"]["labels"][SIM_NODE_LABEL], "true");
        assert_eq!(patch["metadata"]["labels"]["type"], "sim");
        assert!(patch["metadata"]["labels"].get("extra").is_none());
        let taints = patch["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[1]["key"], SIM_NODE_TAINT_KEY);
        assert_eq!(taints[1]["effect"], "NoSchedule");

        let mut complete = node.clone();
        complete.metadata.labels = Some(sim_labels("ax-sim-0"));
        complete.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![sim_taint()]),
            ..Default::default()
        });
        assert_eq!(node_metadata_patch(&complete), None);
    }
}
