//! Leader election (`ax::ops::leader`) against the real API server: one holder at a time, a
//! standby taking over from a crashed holder, a deposed leader noticing, stepping down releasing.
//! Each test competes for its own Lease in `default`, so they run beside the shared operator.

mod common;

use std::time::{Duration, Instant};

use ax::ops::leader::{Leadership, LeaseSettings, Role};
use common::client;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::time::{sleep, timeout};

fn settings(
    lease_name: &str,
    identity: &str,
    duration: u64,
    deadline: u64,
    retry: u64,
) -> LeaseSettings {
    LeaseSettings {
        namespace: "default".into(),
        lease_name: lease_name.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(duration),
        renew_deadline: Duration::from_secs(deadline),
        retry_period: Duration::from_secs(retry),
    }
}

fn unique_lease(test: &str) -> String {
    format!("ax-test-{test}-{:04x}", rand::random::<u16>())
}

/// Deletes the Lease when the test ends, passed or failed.
struct LeaseCleanup {
    name: String,
}

impl Drop for LeaseCleanup {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot await, and the test's client lives on the test's runtime, blocked here: a
        // runtime and a client of their own, on another thread.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().map(|rt| {
                rt.block_on(async {
                    if let Ok(client) = Client::try_default().await {
                        let _ = Api::<Lease>::namespaced(client, "default")
                            .delete(&name, &DeleteParams::default())
                            .await;
                    }
                })
            })
        })
        .join();
    }
}

async fn holder(client: &Client, name: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .expect("read lease")
        .spec
        .and_then(|s| s.holder_identity)
}

/// Polls `condition` every 50 ms until it holds or `deadline` passes.
async fn eventually(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + deadline;
    while Instant::now() < give_up {
        if condition() {
            return true;
        }
        sleep(Duration::from_millis(50)).await;
    }
    condition()
}

#[tokio::test]
async fn one_holder_and_a_standby_takes_over_when_it_stops_renewing() {
    let client = client().await;
    let lease_name = unique_lease("takeover");
    let _cleanup = LeaseCleanup {
        name: lease_name.clone(),
    };
    // A renew deadline of 9 s: beside the other e2e tests on 2 CPUs, renewals failing for 4 s
    // once made the holder step down while it was watched (CI, 2026-12-07).
    let (duration, deadline, retry) = (12, 9, 1);
    let start = |identity: &str| {
        Leadership::start(
            client.clone(),
            settings(&lease_name, identity, duration, deadline, retry),
        )
        .expect("start")
    };
    let a = start("replica-a");
    let b = start("replica-b");

    assert!(
        eventually(Duration::from_secs(60), || a.role() == Role::Leader
            || b.role() == Role::Leader)
        .await,
        "nobody acquired the lease: a {:?}, b {:?}",
        a.role(),
        b.role()
    );
    let (holder_election, standby, standby_identity) = if a.role() == Role::Leader {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };
    assert!(
        eventually(Duration::from_secs(30), || standby.role() == Role::Standby).await,
        "standby role not known: {:?}",
        standby.role()
    );
    // Through several renewals the holder keeps the lease and the standby never leads.
    let watch_until = Instant::now() + Duration::from_secs(2 * duration);
    while Instant::now() < watch_until {
        assert_eq!(holder_election.role(), Role::Leader);
        assert_eq!(standby.role(), Role::Standby);
        sleep(Duration::from_millis(50)).await;
    }

    // The holder crashes: it stops renewing without releasing.
    holder_election.abort();
    let crashed_at = Instant::now();
    timeout(Duration::from_secs(60), standby.acquire())
        .await
        .expect("standby acquires within 60 s")
        .expect("acquire");
    let takeover = crashed_at.elapsed();
    eprintln!("standby took over {takeover:?} after the holder crashed");
    // The standby waits the lease duration after it last saw the record change, then writes; a
    // retry period and 5 s more for a busy API server.
    assert!(
        takeover >= Duration::from_secs(duration - retry - 1)
            && takeover <= Duration::from_secs(duration + retry + 5),
        "takeover took {takeover:?}"
    );
    assert_eq!(
        holder(&client, &lease_name).await.as_deref(),
        Some(standby_identity)
    );
    standby.step_down().await;
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_reports_the_loss_and_never_releases_it() {
    let client = client().await;
    let lease_name = unique_lease("lost");
    let _cleanup = LeaseCleanup {
        name: lease_name.clone(),
    };
    let leadership = Leadership::start(
        client.clone(),
        settings(&lease_name, "replica-a", 30, 20, 2),
    )
    .expect("start");
    timeout(Duration::from_secs(60), leadership.acquire())
        .await
        .expect("acquired within 60 s")
        .expect("acquire");

    let intruder = serde_json::json!({
        "spec": {
            "holderIdentity": "intruder",
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
            "leaseDurationSeconds": 3600,
        }
    });
    Api::<Lease>::namespaced(client.clone(), "default")
        .patch(
            &lease_name,
            &PatchParams::default(),
            &Patch::Merge(&intruder),
        )
        .await
        .expect("take the lease");
    let taken_at = Instant::now();
    // The next renewal (within 2 s) conflicts, the read after it shows the intruder.
    timeout(Duration::from_secs(10), leadership.lost())
        .await
        .expect("loss noticed within 10 s");
    eprintln!("loss noticed after {:?}", taken_at.elapsed());
    assert_eq!(leadership.role(), Role::Standby);

    leadership.step_down().await;
    assert_eq!(
        holder(&client, &lease_name).await.as_deref(),
        Some("intruder"),
        "a deposed leader must not release someone else's lease"
    );
}

#[tokio::test]
async fn stepping_down_releases_the_lease_and_a_standby_takes_it_at_once() {
    let client = client().await;
    let lease_name = unique_lease("release");
    let _cleanup = LeaseCleanup {
        name: lease_name.clone(),
    };
    let a = Leadership::start(
        client.clone(),
        settings(&lease_name, "replica-a", 30, 20, 1),
    )
    .expect("start a");
    timeout(Duration::from_secs(60), a.acquire())
        .await
        .expect("acquired within 60 s")
        .expect("acquire");
    let b = Leadership::start(
        client.clone(),
        settings(&lease_name, "replica-b", 30, 20, 1),
    )
    .expect("start b");
    assert!(eventually(Duration::from_secs(30), || b.role() == Role::Standby).await);

    a.step_down().await;
    let released_at = Instant::now();
    assert_ne!(
        holder(&client, &lease_name).await.as_deref(),
        Some("replica-a")
    );
    // Released, not expired: the standby does not wait out the 30 s lease.
    timeout(Duration::from_secs(10), b.acquire())
        .await
        .expect("standby takes a released lease within 10 s")
        .expect("acquire");
    eprintln!("standby led {:?} after the release", released_at.elapsed());
    assert_eq!(
        holder(&client, &lease_name).await.as_deref(),
        Some("replica-b")
    );
    b.step_down().await;
}
