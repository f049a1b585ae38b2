//! The operator pods of a Helm release and the Lease they compete for; and the check that no other
//! ax-operator runs, since two would both reconcile every namespace.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::helm::{LEASE_SECONDS, RELEASE, operator_image, text};

/// The Lease the replicas compete for.
pub const LEASE_NAME: &str = "ax-operator";

/// ax-operator processes on this machine that no pod runs: an operator started by hand or by
/// e2e/run-tests.sh, perhaps under another name (`ax-dag-operator`, …).
pub fn host_operator_processes() -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = text(&cmdline);
        let program = cmdline.split('\0').next().unwrap_or_default();
        let program = program.rsplit('/').next().unwrap_or_default();
        if !(program.starts_with("ax") && program.contains("operator")) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'));
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if zombie || cgroup.contains("kubepods") {
            continue;
        }
        found.push(format!("pid {pid}: {}", cmdline.replace('\0', " ").trim()));
    }
    found
}

/// Leases named `ax-operator` renewed within their duration: a running, leader-elected operator.
pub async fn live_leases(client: &Client) -> Vec<String> {
    let leases: Api<Lease> = Api::all(client.clone());
    let now = jiff::Timestamp::now();
    leases
        .list(&ListParams::default().fields(&format!("metadata.name={LEASE_NAME}")))
        .await
        .expect("list leases")
        .items
        .into_iter()
        .filter_map(|lease| {
            let spec = lease.spec.as_ref()?;
            let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
            let renewed = spec.renew_time.as_ref()?.0;
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            let valid_until = renewed + jiff::SignedDuration::from_secs(duration);
            (valid_until > now).then(|| {
                format!(
                    "{}: held by {holder}, renewed {renewed}",
                    lease.namespace().unwrap_or_default()
                )
            })
        })
        .collect()
}

/// Fails unless no ax-operator runs: none on this machine outside pods, no live `ax-operator` Lease
/// anywhere.
pub async fn assert_no_other_operator(client: &Client) {
    let processes = host_operator_processes();
    assert!(
        processes.is_empty(),
        "another ax-operator runs on this machine; these tests install their own in the cluster and \
         need it to be the only one (stop it, or run them through e2e/run-tests.sh, which stops its \
         own first):\n  {}",
        processes.join("\n  ")
    );
    assert_no_leader(client).await;
}

/// Fails unless no `ax-operator` Lease of this cluster is live: no operator reconciles it. (Other
/// clusters' operators on this machine do not matter to a test that runs its operator on the
/// host.)
pub async fn assert_no_leader(client: &Client) {
    // A deleted operator's Lease stays valid until it expires: wait that long, then fail.
    let deadline = Instant::now() + Duration::from_secs(LEASE_SECONDS.max(15) * 2 + 5);
    loop {
        let live = live_leases(client).await;
        if live.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "another ax-operator is running (its Lease keeps being renewed); stop it first:\n  {}",
            live.join("\n  ")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Why a container cannot start, when the reason is one waiting will not fix.
pub fn stuck_reason(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|s| {
        let waiting = s.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.clone()?;
        matches!(
            reason.as_str(),
            "ErrImageNeverPull"
                | "ImagePullBackOff"
                | "ErrImagePull"
                | "CrashLoopBackOff"
                | "CreateContainerConfigError"
                | "CreateContainerError"
        )
        .then(|| format!("{reason}: {}", waiting.message.clone().unwrap_or_default()))
    })
}

/// The operator pods of the release, not being deleted.
pub async fn operator_pods(client: &Client, namespace: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
        .await
        .expect("list operator pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Waits until `replicas` operator pods are Running and Ready; returns them.
pub async fn wait_operator_ready(client: &Client, namespace: &str, replicas: usize) -> Vec<Pod> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let pods = operator_pods(client, namespace).await;
        if let Some((pod, reason)) = pods.iter().find_map(|p| stuck_reason(p).map(|r| (p, r))) {
            let (repository, tag) = operator_image();
            panic!(
                "operator pod {} cannot start: {reason}\n(is {repository}:{tag} built and imported? \
                 e2e/run-tests.sh does it; by hand: e2e/image.sh target/debug/ax-operator {repository}:{tag})",
                pod.name_any()
            );
        }
        let ready: Vec<Pod> = pods
            .iter()
            .filter(|p| pod_phase(p) == "Running" && pod_ready(p))
            .cloned()
            .collect();
        if ready.len() == replicas && pods.len() == replicas {
            return ready;
        }
        assert!(
            Instant::now() < deadline,
            "{replicas} operator pods not Running and Ready within 180s: {:?}",
            pods.iter()
                .map(|p| format!("{} {} ready={}", p.name_any(), pod_phase(p), pod_ready(p)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    leases
        .get_opt(LEASE_NAME)
        .await
        .expect("get lease")?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// Waits until one of `candidates` holds the Lease; returns its name.
pub async fn wait_leader(client: &Client, namespace: &str, candidates: &[String]) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holder = lease_holder(client, namespace).await;
        if let Some(holder) = holder.as_ref().filter(|h| candidates.contains(h)) {
            return holder.clone();
        }
        assert!(
            Instant::now() < deadline,
            "none of {candidates:?} holds Lease {namespace}/{LEASE_NAME} within 60s (holder: {holder:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The spec of the release's Lease, if it exists.
pub async fn lease_spec(client: &Client, namespace: &str) -> Option<LeaseSpec> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    leases.get_opt(LEASE_NAME).await.expect("get lease")?.spec
}

/// How many times the operator container of `pod` restarted, and when its previous run ended.
pub async fn restarts(
    client: &Client,
    namespace: &str,
    pod: &str,
) -> (i32, Option<jiff::Timestamp>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(pod).await.expect("get operator pod");
    let status = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next());
    let Some(status) = status else {
        return (0, None);
    };
    let finished = status
        .last_state
        .and_then(|s| s.terminated)
        .and_then(|t| t.finished_at)
        .map(|t| t.0);
    (status.restart_count, finished)
}

/// Every version of the release's Lease seen by a watch from now on, in order.
pub struct LeaseAudit {
    seen: Arc<Mutex<Vec<LeaseSpec>>>,
    watch: tokio::task::JoinHandle<()>,
}

/// One holder's hold of the Lease, by the times the operators wrote into it.
#[derive(Clone, Debug, PartialEq)]
pub struct Term {
    pub holder: String,
    pub acquired: jiff::Timestamp,
    /// When it was released or taken over; None while held.
    pub ended: Option<jiff::Timestamp>,
}

impl LeaseAudit {
    pub fn start(client: &Client, namespace: &str) -> LeaseAudit {
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let seen: Arc<Mutex<Vec<LeaseSpec>>> = Arc::default();
        let record = seen.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}"));
        let watch = tokio::spawn(async move {
            let mut stream = watcher(leases, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = stream.next().await {
                if let Ok(lease) = event {
                    let spec = lease.spec.unwrap_or_default();
                    let mut seen = record.lock().expect("lease audit lock");
                    if seen.last() != Some(&spec) {
                        seen.push(spec);
                    }
                }
            }
        });
        LeaseAudit { seen, watch }
    }

    /// The holds seen so far: a term starts at its holder's acquireTime and ends at the release's
    /// renewTime, or at the next holder's acquireTime.
    pub fn terms(&self) -> Vec<Term> {
        let seen = self.seen.lock().expect("lease audit lock").clone();
        let mut terms: Vec<Term> = Vec::new();
        for spec in seen {
            let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
            let acquired = spec.acquire_time.as_ref().map(|t| t.0);
            let renewed = spec.renew_time.as_ref().map(|t| t.0);
            let current = terms.last_mut().filter(|t| t.ended.is_none());
            match (holder, current) {
                (Some(h), Some(term)) if term.holder == h && Some(term.acquired) == acquired => {}
                (Some(h), current) => {
                    let acquired =
                        acquired.unwrap_or_else(|| panic!("{h} holds a Lease without acquireTime"));
                    if let Some(term) = current {
                        term.ended = Some(acquired);
                    }
                    terms.push(Term {
                        holder: h,
                        acquired,
                        ended: None,
                    });
                }
                (None, Some(term)) => term.ended = Some(renewed.unwrap_or(term.acquired)),
                (None, None) => {}
            }
        }
        terms
    }

    pub fn stop(self) -> Vec<Term> {
        self.watch.abort();
        self.terms()
    }
}
