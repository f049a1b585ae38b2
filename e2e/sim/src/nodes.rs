//! Registers the simulated Node objects and keeps them alive the way a kubelet does: a Lease renewed
//! every 10 s and the Ready condition's heartbeat every 20 s (the node lifecycle controller marks a
//! node unreachable after 40 s without either and evicts its pods).
//!
//! Nodes carry the label and NoSchedule taint `ax.dev/sim-node=true`, so only pods that select and
//! tolerate them land there; with `--pool NAME` they carry `ax.dev/sim-pool=NAME` instead: a
//! private pool that a test starts its own simulator for, which no other pod selects.
//!
//! Each node reports the capacity and pressure conditions its annotations ask for, re-read on every
//! change of the Node: `ax.dev/sim-capacity: "pods=10,cpu=4,memory=8Gi"` (any subset; the rest
//! stays at the large default) and `ax.dev/sim-pressure: "MemoryPressure"` (a comma-separated
//! subset of MemoryPressure, DiskPressure, PIDPressure; empty or absent: none).
//! `ax.dev/sim-heartbeat: "stopped"` makes the node go silent, as a node cut off from the API
//! server does: no Lease renewal, no Ready heartbeat (the node lifecycle controller marks it
//! NotReady and taints it) until the annotation is removed. Its pods are still driven.
//! `"stopped-until=<RFC 3339 time>"` ends the silence on its own at that time, even if the Node
//! object was deleted meanwhile (a node deleted while silent is registered again only then, so
//! pod GC sees it gone), and even if whoever silenced it is gone.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::writer::{ApiWriter, WriteError};

pub use ax_sim::worker::SIM_NODE_LABEL;
#[cfg(test)]
use ax_sim::worker::SIM_NODE_TAINT_KEY;
/// Label and taint key of the nodes of a private pool (`--pool`).
pub const SIM_POOL_LABEL: &str = "ax.dev/sim-pool";
pub const CAPACITY_ANNOTATION: &str = "ax.dev/sim-capacity";
pub const PRESSURE_ANNOTATION: &str = "ax.dev/sim-pressure";
pub const HEARTBEAT_ANNOTATION: &str = "ax.dev/sim-heartbeat";
const PRESSURE_CONDITIONS: [&str; 3] = ["MemoryPressure", "DiskPressure", "PIDPressure"];

/// The label (and taint) that marks this simulator's nodes: `ax.dev/sim-node=true`, or
/// `ax.dev/sim-pool=NAME` for a private pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub key: &'static str,
    pub value: String,
}

impl Marker {
    pub fn for_pool(pool: Option<&str>) -> Self {
        match pool {
            Some(pool) => Self {
                key: SIM_POOL_LABEL,
                value: pool.to_owned(),
            },
            None => Self {
                key: SIM_NODE_LABEL,
                value: "true".to_owned(),
            },
        }
    }

    pub fn selector(&self) -> String {
        format!("{}={}", self.key, self.value)
    }
}

/// What a node reports: its capacity (also its allocatable, which the scheduler places by) and the
/// pressure conditions that are True.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    pub pods: String,
    pub cpu: String,
    pub memory: String,
    pub pressure: Vec<&'static str>,
    /// Heartbeats stopped (`ax.dev/sim-heartbeat`).
    pub heartbeat: Heartbeat,
}

/// Whether a node sends its heartbeats and renews its Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Heartbeat {
    #[default]
    Beating,
    /// Silent until the annotation goes.
    Stopped,
    /// Silent until this time.
    StoppedUntil(Timestamp),
}

impl Heartbeat {
    pub fn silent_at(self, now: Timestamp) -> bool {
        match self {
            Heartbeat::Beating => false,
            Heartbeat::Stopped => true,
            Heartbeat::StoppedUntil(until) => now < until,
        }
    }
}

impl Default for NodeSettings {
    /// A capacity no test exhausts, no pressure.
    fn default() -> Self {
        Self {
            pods: "10000".into(),
            cpu: "1000".into(),
            memory: "4Ti".into(),
            pressure: Vec::new(),
            heartbeat: Heartbeat::Beating,
        }
    }
}

/// Whether `value` looks like a Kubernetes quantity ("10", "500m", "8Gi", "1.5").
fn is_quantity(value: &str) -> bool {
    !value.is_empty()
        && value.starts_with(|c: char| c.is_ascii_digit())
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
}

/// The settings a node's annotations ask for, and the parts that could not be read (ignored).
pub fn settings_of(node: &Node) -> (NodeSettings, Vec<String>) {
    let annotations = node.annotations();
    let mut settings = NodeSettings::default();
    let mut ignored = Vec::new();
    if let Some(capacity) = annotations.get(CAPACITY_ANNOTATION) {
        for part in capacity.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let slot = match part.split_once('=') {
                Some(("pods", v)) if is_quantity(v) => Some((&mut settings.pods, v)),
                Some(("cpu", v)) if is_quantity(v) => Some((&mut settings.cpu, v)),
                Some(("memory", v)) if is_quantity(v) => Some((&mut settings.memory, v)),
                _ => None,
            };
            match slot {
                Some((field, value)) => *field = value.to_owned(),
                None => ignored.push(format!("{CAPACITY_ANNOTATION}: {part}")),
            }
        }
    }
    if let Some(pressure) = annotations.get(PRESSURE_ANNOTATION) {
        for part in pressure.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match PRESSURE_CONDITIONS.iter().find(|c| **c == part) {
                Some(condition) if !settings.pressure.contains(condition) => {
                    settings.pressure.push(condition)
                }
                Some(_) => {}
                None => ignored.push(format!("{PRESSURE_ANNOTATION}: {part}")),
            }
        }
    }
    if let Some(value) = annotations.get(HEARTBEAT_ANNOTATION).map(|v| v.trim()) {
        let until = value.strip_prefix("stopped-until=").map(str::parse);
        match (value, until) {
            ("stopped", _) => settings.heartbeat = Heartbeat::Stopped,
            (_, Some(Ok(until))) => settings.heartbeat = Heartbeat::StoppedUntil(until),
            _ => ignored.push(format!("{HEARTBEAT_ANNOTATION}: {value}")),
        }
    }
    (settings, ignored)
}
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

fn sim_taint(marker: &Marker) -> Taint {
    Taint {
        key: marker.key.into(),
        value: Some(marker.value.clone()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn sim_labels(name: &str, marker: &Marker) -> BTreeMap<String, String> {
    [
        (marker.key, marker.value.as_str()),
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
pub fn node_metadata_patch(node: &Node, marker: &Marker) -> Option<Value> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let wanted = sim_labels(name, marker);
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
    let taint = sim_taint(marker);
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

/// Node status: Ready with a fresh heartbeat, the capacity `settings` ask for (as allocatable too)
/// and their pressure conditions (changed at `settings_since`).
pub fn node_status(
    name: &str,
    now: Timestamp,
    ready_since: Timestamp,
    kubelet_version: &str,
    settings: &NodeSettings,
    settings_since: Timestamp,
) -> Value {
    let resources = json!({
        "cpu": settings.cpu,
        "memory": settings.memory,
        "pods": settings.pods,
        "ephemeral-storage": "10Ti",
    });
    let pressed = |type_: &str| settings.pressure.contains(&type_);
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        let since = if type_ == "Ready" {
            ready_since
        } else {
            settings_since.max(ready_since)
        };
        json!({
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since),
        })
    };
    let pressure = |type_: &str, calm: &str, pressed_reason: &str| {
        if pressed(type_) {
            condition(
                type_,
                "True",
                pressed_reason,
                &format!("simulated {type_} ({PRESSURE_ANNOTATION})"),
            )
        } else {
            condition(type_, "False", calm, "simulated node")
        }
    };
    json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "phase": "Running",
            "conditions": [
                pressure("MemoryPressure", "KubeletHasSufficientMemory", "KubeletHasInsufficientMemory"),
                pressure("DiskPressure", "KubeletHasNoDiskPressure", "KubeletHasDiskPressure"),
                pressure("PIDPressure", "KubeletHasSufficientPID", "KubeletHasInsufficientPID"),
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

/// What the simulator keeps per node.
#[derive(Debug, Clone)]
struct NodeState {
    /// For the Lease owner reference; refreshed when the node is re-created.
    uid: Option<String>,
    settings: NodeSettings,
    settings_since: Timestamp,
}

pub struct SimNodes {
    nodes: Api<Node>,
    leases: Api<Lease>,
    writer: ApiWriter,
    names: Vec<String>,
    marker: Marker,
    kubelet_version: String,
    ready_since: Timestamp,
    state: Mutex<HashMap<String, NodeState>>,
}

impl SimNodes {
    pub fn new(
        client: Client,
        writer: ApiWriter,
        names: Vec<String>,
        marker: Marker,
        kubelet_version: String,
    ) -> Self {
        let ready_since = Timestamp::now();
        let state = names
            .iter()
            .map(|name| {
                let fresh = NodeState {
                    uid: None,
                    settings: NodeSettings::default(),
                    settings_since: ready_since,
                };
                (name.clone(), fresh)
            })
            .collect();
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            writer,
            names,
            marker,
            kubelet_version,
            ready_since,
            state: Mutex::new(state),
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

    /// Follows this simulator's Nodes: a changed capacity or pressure annotation is reported at
    /// once, not only with the next heartbeat.
    pub async fn watch(&self) {
        let config = watcher::Config::default().labels(&self.marker.selector());
        let mut events = watcher::watcher(self.nodes.clone(), config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(node) => self.on_node(&node).await,
                Err(error) => tracing::warn!(%error, "node watch failed; retrying"),
            }
        }
        tracing::error!("node watch stream ended");
    }

    async fn on_node(&self, node: &Node) {
        let name = node.name_any();
        let (settings, ignored) = settings_of(node);
        let changed = {
            let mut state = self.state.lock().await;
            match state.get_mut(&name) {
                Some(known) if known.settings != settings => {
                    known.settings = settings.clone();
                    known.settings_since = Timestamp::now();
                    true
                }
                _ => false,
            }
        };
        if !changed {
            return;
        }
        if !ignored.is_empty() {
            tracing::warn!(
                node = name,
                ?ignored,
                "unreadable sim node annotations, ignored"
            );
        }
        // A node heard from again renews its Lease at once, not with the next tick.
        let reported = async {
            self.heartbeat(&name).await?;
            self.renew_lease(&name).await
        };
        match reported.await {
            Ok(()) => tracing::info!(
                node = name,
                ?settings,
                "sim node capacity, pressure or heartbeat changed"
            ),
            Err(error) => tracing::warn!(node = name, %error, "sim node status write failed"),
        }
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
                node.metadata.labels = Some(sim_labels(name, &self.marker));
                node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                    taints: Some(vec![sim_taint(&self.marker)]),
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
            Some(node) => match node_metadata_patch(&node, &self.marker).map(Patch::Merge) {
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
        let (settings, _) = settings_of(&node);
        {
            let mut state = self.state.lock().await;
            let Some(entry) = state.get_mut(name) else {
                return Ok(());
            };
            entry.uid = Some(uid);
            if entry.settings != settings {
                entry.settings = settings;
                entry.settings_since = Timestamp::now();
            }
        }
        self.heartbeat(name).await?;
        self.renew_lease(name).await?;
        tracing::info!(node = name, "sim node registered and Ready");
        Ok(())
    }

    async fn heartbeat(&self, name: &str) -> Result<(), NodeError> {
        let Some(node) = self.state.lock().await.get(name).cloned() else {
            return Ok(());
        };
        if node.settings.heartbeat.silent_at(Timestamp::now()) {
            return Ok(());
        }
        let status = Patch::Merge(node_status(
            name,
            Timestamp::now(),
            self.ready_since,
            &self.kubelet_version,
            &node.settings,
            node.settings_since,
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
        let (uid, silent) = {
            let state = self.state.lock().await;
            let node = state.get(name);
            (
                node.and_then(|node| node.uid.clone()),
                node.is_some_and(|node| node.settings.heartbeat.silent_at(Timestamp::now())),
            )
        };
        if silent {
            return Ok(());
        }
        let Some(uid) = uid else {
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
        let status = node_status(
            "ax-sim-0",
            ts(),
            ts(),
            "v1.20.2",
            &NodeSettings::default(),
            ts(),
        );
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
        let shared = Marker::for_pool(None);
        let patch = node_metadata_patch(&node, &shared).expect("a patch");
        assert_eq!(patch["metadata"]["labels"][SIM_NODE_LABEL], "true");
        assert_eq!(patch["metadata"]["labels"]["type"], "sim");
        assert!(patch["metadata"]["labels"].get("extra").is_none());
        let taints = patch["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[1]["key"], SIM_NODE_TAINT_KEY);
        assert_eq!(taints[1]["effect"], "NoSchedule");

        let mut complete = node.clone();
        complete.metadata.labels = Some(sim_labels("ax-sim-0", &shared));
        complete.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![sim_taint(&shared)]),
            ..Default::default()
        });
        assert_eq!(node_metadata_patch(&complete, &shared), None);
        // A pool node is marked with its pool, not as a shared sim node.
        let pool = Marker::for_pool(Some("cap-1"));
        let patch = node_metadata_patch(&complete, &pool).expect("a patch");
        assert_eq!(patch["metadata"]["labels"][SIM_POOL_LABEL], "cap-1");
        let taints = patch["spec"]["taints"].as_array().expect("taints");
        assert!(
            taints
                .iter()
                .any(|t| t["key"] == SIM_POOL_LABEL && t["value"] == "cap-1")
        );
    }

    fn annotated(annotations: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n", "annotations": annotations}}))
            .expect("a Node")
    }

    #[test]
    fn annotations_set_capacity_and_pressure_and_bad_parts_are_ignored() {
        let node = annotated(json!({
            CAPACITY_ANNOTATION: "pods=5, memory=8Gi,cpu=-1,disk=3",
            PRESSURE_ANNOTATION: "MemoryPressure,Hunger,MemoryPressure",
        }));
        let (settings, ignored) = settings_of(&node);
        assert_eq!(settings.pods, "5");
        assert_eq!(settings.memory, "8Gi");
        assert_eq!(
            settings.cpu, "1000",
            "an unreadable value keeps the default"
        );
        assert_eq!(settings.pressure, ["MemoryPressure"]);
        assert_eq!(ignored.len(), 3, "{ignored:?}");
        let (plain, ignored) = settings_of(&annotated(json!({})));
        assert_eq!(plain, NodeSettings::default());
        assert!(ignored.is_empty());
    }

    #[test]
    fn the_heartbeat_annotation_silences_the_node() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let (settings, ignored) = settings_of(&annotated(json!({HEARTBEAT_ANNOTATION: "stopped"})));
        assert_eq!(settings.heartbeat, Heartbeat::Stopped);
        assert!(settings.heartbeat.silent_at(now));
        assert!(ignored.is_empty());
        let until = json!({HEARTBEAT_ANNOTATION: "stopped-until=2026-01-01T00:01:30Z"});
        let (settings, ignored) = settings_of(&annotated(until));
        assert!(ignored.is_empty());
        assert!(settings.heartbeat.silent_at(now));
        assert!(
            settings
                .heartbeat
                .silent_at("2026-01-01T00:01:29Z".parse().unwrap())
        );
        assert!(
            !settings
                .heartbeat
                .silent_at("2026-01-01T00:01:30Z".parse().unwrap())
        );
        for unreadable in ["off", "stopped-until=soon"] {
            let (settings, ignored) =
                settings_of(&annotated(json!({HEARTBEAT_ANNOTATION: unreadable})));
            assert_eq!(settings.heartbeat, Heartbeat::Beating);
            assert!(!settings.heartbeat.silent_at(now));
            assert_eq!(ignored, [format!("{HEARTBEAT_ANNOTATION}: {unreadable}")]);
        }
    }

    #[test]
    fn status_reports_the_capacity_and_pressure_it_is_told() {
        let settings = NodeSettings {
            pods: "5".into(),
            pressure: vec!["DiskPressure"],
            ..NodeSettings::default()
        };
        let later = Timestamp::from_second(1_800_000_100).expect("valid timestamp");
        let status = node_status("n", later, ts(), "v1.20.2", &settings, later);
        assert_eq!(status["status"]["capacity"]["pods"], "5");
        assert_eq!(status["status"]["allocatable"]["pods"], "5");
        let conditions = status["status"]["conditions"]
            .as_array()
            .expect("conditions");
        let find = |type_: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == type_)
                .expect("condition")
        };
        assert_eq!(find("DiskPressure")["status"], "True");
        assert_eq!(find("DiskPressure")["reason"], "KubeletHasDiskPressure");
        assert_eq!(
            find("DiskPressure")["lastTransitionTime"],
            "2027-01-15T08:01:40Z"
        );
        assert_eq!(find("MemoryPressure")["status"], "False");
        assert_eq!(find("Ready")["lastTransitionTime"], "2027-01-15T08:00:00Z");
        serde_json::from_value::<Node>(status).expect("a Node");
    }
}
