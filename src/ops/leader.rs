//! Leader election through a `coordination.k8s.io/v1` Lease (DESIGN §6): only the leader reconciles;
//! a leader that loses the lease must stop (the process exits and restarts as a standby).
//!
//! `kube-lease-manager` acquires and renews the lease. It keeps reporting "leader" while its renewals
//! fail, so this module also reads the Lease itself and stops calling us leader once our last
//! renewal it has seen is about to expire: a leader cut off from the API server steps down before
//! a standby can take over (like client-go's renew deadline).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{Api, Client};
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerError, LeaseParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

/// Name of the Lease the replicas of ax-operator compete for.
pub const LEASE_NAME: &str = "ax-operator";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Namespace of the Lease: the operator's own namespace.
    pub namespace: String,
    pub lease_name: String,
    /// Unique among replicas: the pod name.
    pub identity: String,
    /// How long a lease stays valid after its last renewal (whole seconds).
    pub lease_duration: Duration,
    /// How long after a renewal the holder renews again (whole seconds, less than `lease_duration`).
    /// The difference is the time a renewal may take, and the clock skew tolerated between nodes.
    pub renew_interval: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not yet known whether we or another replica hold the lease.
    Unknown,
    Standby,
    Leader,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid lease settings: {0}")]
    InvalidSettings(&'static str),
    #[error("cannot set up Lease {namespace}/{name}: {source}")]
    Setup {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
    },
    #[error("leader election stopped")]
    Stopped,
}

/// A running election for one identity. Dropping it releases the lease if held (in the background).
#[derive(Debug)]
pub struct Leadership {
    role: watch::Receiver<Role>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Leadership {
    /// Creates the Lease if missing and starts competing for it.
    pub async fn start(client: Client, settings: LeaseSettings) -> Result<Self, LeaderError> {
        let timing = Timing::new(&settings)?;
        let params = LeaseParams::new(
            settings.identity.clone(),
            timing.duration_secs,
            timing.duration_secs - timing.renew_secs,
        );
        let manager = LeaseManager::new(
            client.clone(),
            &settings.lease_name,
            &settings.namespace,
            params,
            LeaseCreateMode::AutoCreate,
        )
        .await
        .map_err(|source| LeaderError::Setup {
            namespace: settings.namespace.clone(),
            name: settings.lease_name.clone(),
            source,
        })?;
        let (role_tx, role) = watch::channel(Role::Unknown);
        let (stop, stopped) = oneshot::channel();
        let election = Election {
            manager,
            leases: Api::namespaced(client, &settings.namespace),
            timing,
            settings,
            role: role_tx,
        };
        let task = tokio::spawn(election.run(stopped));
        Ok(Leadership {
            role,
            stop: Some(stop),
            task,
        })
    }

    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    /// Every change of role, starting with the current one.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Resolves once we hold the lease.
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        let mut role = self.role.clone();
        role.wait_for(|role| *role == Role::Leader)
            .await
            .map(|_| ())
            .map_err(|_| LeaderError::Stopped)
    }

    /// Resolves as soon as we are not the leader (at once if we are not): call it after
    /// [`acquire`](Self::acquire) and stop reconciling when it resolves.
    pub async fn lost(&self) {
        let mut role = self.role.clone();
        // A closed channel means the election ended: not leader either.
        let _ = role.wait_for(|role| *role != Role::Leader).await;
    }

    /// Stops competing and releases the lease if we hold it, so a standby takes over without
    /// waiting for it to expire.
    pub async fn step_down(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Err(error) = (&mut self.task).await {
            tracing::warn!(%error, "leader election task failed");
        }
    }
}

/// Lease timing in whole seconds, as the Lease API counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Timing {
    duration_secs: u64,
    renew_secs: u64,
}

impl Timing {
    fn new(settings: &LeaseSettings) -> Result<Self, LeaderError> {
        let whole_seconds = |d: Duration| d.subsec_nanos() == 0 && d.as_secs() > 0;
        if settings.identity.is_empty() {
            return Err(LeaderError::InvalidSettings("identity is empty"));
        }
        if !whole_seconds(settings.lease_duration) || !whole_seconds(settings.renew_interval) {
            return Err(LeaderError::InvalidSettings(
                "lease duration and renew interval must be whole, positive seconds",
            ));
        }
        let timing = Timing {
            duration_secs: settings.lease_duration.as_secs(),
            renew_secs: settings.renew_interval.as_secs(),
        };
        if timing.renew_secs >= timing.duration_secs {
            return Err(LeaderError::InvalidSettings(
                "renew interval must be shorter than the lease duration",
            ));
        }
        if i32::try_from(timing.duration_secs).is_err() {
            return Err(LeaderError::InvalidSettings("lease duration is too long"));
        }
        Ok(timing)
    }

    /// Time between a due renewal and the lease's expiry.
    fn slack(&self) -> Duration {
        Duration::from_secs(self.duration_secs - self.renew_secs)
    }

    /// How often a leader reads the Lease to confirm its renewals. A renewal is seen in time if it
    /// completes within `slack - margin - period` (half the slack) after it is due.
    fn leader_check_period(&self) -> Duration {
        (self.slack() / 4).max(Duration::from_millis(200))
    }

    /// We stop calling ourselves leader this long before our lease expires by our clock, as a
    /// standby's clock may run ahead.
    fn safety_margin(&self) -> Duration {
        self.slack() / 4
    }
}

/// Until when, on our monotonic clock, `spec` (read at wall time `read_at_wall`, monotonic
/// `read_at`) shows the lease held by `identity`; `None` if it does not.
fn held_until(
    spec: Option<&LeaseSpec>,
    identity: &str,
    read_at_wall: SystemTime,
    read_at: Instant,
    margin: Duration,
) -> Option<Instant> {
    let spec = spec?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let remaining = (renewed + duration)
        .duration_since(read_at_wall)
        .ok()?
        .checked_sub(margin)?;
    Some(read_at + remaining)
}

type ChangeFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, LeaseManagerError>> + Send + 'a>>;

struct Election {
    manager: LeaseManager,
    leases: Api<Lease>,
    timing: Timing,
    settings: LeaseSettings,
    role: watch::Sender<Role>,
}

impl Election {
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        let identity = self.settings.identity.as_str();
        let lease = format!("{}/{}", self.settings.namespace, self.settings.lease_name);
        // What kube-lease-manager believes, and what our own reads of the Lease confirm.
        let mut manager_says_leader = false;
        let mut confirmed_until: Option<Instant> = None;
        let mut observed = false;
        let mut failures: u32 = 0;
        let mut change = self.next_change(Duration::ZERO);
        let mut next_read = Instant::now();
        tracing::info!(%lease, %identity, "joining leader election");

        loop {
            let expiry_check = confirmed_until.filter(|_| manager_says_leader);
            tokio::select! {
                biased;
                _ = &mut stopped => break,
                result = &mut change => match result {
                    Ok(leader) => {
                        failures = 0;
                        manager_says_leader = leader;
                        // Confirm a fresh acquisition right away rather than at the next read.
                        next_read = Instant::now();
                        change = self.next_change(Duration::ZERO);
                    }
                    Err(error) => {
                        failures = failures.saturating_add(1);
                        let delay = retry_delay(failures);
                        tracing::warn!(%lease, %error, ?delay, "lease update failed");
                        change = self.next_change(delay);
                    }
                },
                _ = sleep_until(next_read) => {
                    let read_at_wall = SystemTime::now();
                    let read_at = Instant::now();
                    let read = timeout(self.timing.leader_check_period().max(Duration::from_secs(1)),
                        self.leases.get(&self.settings.lease_name)).await;
                    match read {
                        Ok(Ok(current)) => {
                            observed = true;
                            confirmed_until = held_until(
                                current.spec.as_ref(),
                                identity,
                                read_at_wall,
                                read_at,
                                self.timing.safety_margin(),
                            );
                            if confirmed_until.is_none()
                                && let Some(holder) =
                                    current.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                            {
                                tracing::debug!(%lease, %holder, "lease held by another replica");
                            }
                        }
                        Ok(Err(error)) => tracing::warn!(%lease, %error, "cannot read lease"),
                        Err(_) => tracing::warn!(%lease, "reading lease timed out"),
                    }
                    next_read = Instant::now() + if manager_says_leader {
                        self.timing.leader_check_period()
                    } else {
                        Duration::from_secs(self.timing.renew_secs)
                    };
                },
                _ = sleep_until(expiry_check.unwrap_or_else(Instant::now)), if expiry_check.is_some() => {}
            }

            if confirmed_until.is_some_and(|until| Instant::now() >= until) {
                confirmed_until = None;
            }
            let role = if manager_says_leader && confirmed_until.is_some() {
                Role::Leader
            } else if observed || manager_says_leader {
                Role::Standby
            } else {
                Role::Unknown
            };
            self.publish(role, &lease);
        }

        // Stop acting as leader before the lease can pass to someone else.
        let was_leader = self.role.send_replace(Role::Standby) == Role::Leader;
        drop(change);
        // Only a confirmed leader releases: the manager's own view may be stale.
        if was_leader {
            tracing::info!(%lease, "stepping down");
            match timeout(Duration::from_secs(5), self.manager.release()).await {
                Ok(Ok(())) => tracing::info!(%lease, "released lease"),
                Ok(Err(error)) => tracing::warn!(%lease, %error, "cannot release lease"),
                Err(_) => tracing::warn!(%lease, "releasing lease timed out"),
            }
        }
    }

    fn next_change(&self, delay: Duration) -> ChangeFuture<'_> {
        let manager = &self.manager;
        Box::pin(async move {
            if !delay.is_zero() {
                sleep(delay).await;
            }
            manager.changed().await
        })
    }

    fn publish(&self, role: Role, lease: &str) {
        self.role.send_if_modified(|current| {
            if *current == role {
                return false;
            }
            match (*current, role) {
                (_, Role::Leader) => tracing::info!(%lease, "acquired lease: leading"),
                (Role::Leader, _) => tracing::warn!(%lease, "lost lease"),
                _ => tracing::info!(%lease, "standing by"),
            }
            *current = role;
            true
        });
    }
}

/// 1 s, 2 s, 4 s … capped at 30 s.
fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::{DeleteParams, Patch, PatchParams};

    fn settings(identity: &str, duration: u64, renew: u64) -> LeaseSettings {
        LeaseSettings {
            namespace: "default".into(),
            lease_name: LEASE_NAME.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(duration),
            renew_interval: Duration::from_secs(renew),
        }
    }

    fn spec(holder: &str, renewed: SystemTime, duration_secs: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::try_from(renewed).expect("timestamp"),
            )),
            lease_duration_seconds: Some(duration_secs),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn timing_is_validated() {
        assert!(Timing::new(&settings("a", 15, 10)).is_ok());
        for bad in [
            settings("", 15, 10),
            settings("a", 10, 10),
            settings("a", 10, 15),
            settings("a", 10, 0),
            LeaseSettings {
                lease_duration: Duration::from_millis(1500),
                ..settings("a", 15, 10)
            },
        ] {
            assert!(
                matches!(Timing::new(&bad), Err(LeaderError::InvalidSettings(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn held_until_counts_from_our_last_renewal() {
        let wall = SystemTime::now();
        let now = Instant::now();
        let margin = Duration::from_secs(1);
        let renewed_2s_ago = wall - Duration::from_secs(2);

        let ours = spec("me", renewed_2s_ago, 15);
        assert_eq!(
            held_until(Some(&ours), "me", wall, now, margin),
            Some(now + Duration::from_secs(12))
        );
        let theirs = spec("other", renewed_2s_ago, 15);
        assert_eq!(held_until(Some(&theirs), "me", wall, now, margin), None);
        let expired = spec("me", wall - Duration::from_secs(20), 15);
        assert_eq!(held_until(Some(&expired), "me", wall, now, margin), None);
        let within_margin = spec("me", wall - Duration::from_millis(14_500), 15);
        assert_eq!(
            held_until(Some(&within_margin), "me", wall, now, margin),
            None
        );
        let released = LeaseSpec::default();
        assert_eq!(held_until(Some(&released), "me", wall, now, margin), None);
        assert_eq!(held_until(None, "me", wall, now, margin), None);
    }

    #[test]
    fn retry_delay_doubles_up_to_30s() {
        let delays: Vec<u64> = (1..=8).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    /// A client for the cluster in KUBECONFIG, or `None` (the test is skipped) when it is unset.
    async fn cluster() -> Option<Client> {
        if std::env::var_os("KUBECONFIG").is_none() {
            eprintln!("KUBECONFIG is unset: skipping a test that needs a cluster");
            return None;
        }
        Some(Client::try_default().await.expect("client from KUBECONFIG"))
    }

    fn unique_lease(test: &str) -> String {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        format!("ax-test-{test}-{}-{nanos}", std::process::id())
    }

    async fn delete_lease(client: &Client, name: &str) {
        let _ = Api::<Lease>::namespaced(client.clone(), "default")
            .delete(name, &DeleteParams::default())
            .await;
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
        let Some(client) = cluster().await else {
            return;
        };
        let lease_name = unique_lease("takeover");
        let (duration, renew) = (10, 5);
        let start = |identity: &str| {
            Leadership::start(
                client.clone(),
                LeaseSettings {
                    lease_name: lease_name.clone(),
                    ..settings(identity, duration, renew)
                },
            )
        };
        let a = start("replica-a").await.expect("start a");
        let b = start("replica-b").await.expect("start b");

        assert!(
            eventually(Duration::from_secs(60), || a.role() == Role::Leader
                || b.role() == Role::Leader)
            .await,
            "nobody acquired the lease: a {:?}, b {:?}",
            a.role(),
            b.role()
        );
        let (holder, standby, standby_identity) = if a.role() == Role::Leader {
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
            assert_eq!(holder.role(), Role::Leader);
            assert_eq!(standby.role(), Role::Standby);
            sleep(Duration::from_millis(50)).await;
        }

        // The holder crashes: it stops renewing without releasing.
        holder.task.abort();
        let crashed_at = Instant::now();
        standby.acquire().await.expect("standby acquires");
        let takeover = crashed_at.elapsed();
        eprintln!("standby took over {takeover:?} after the holder crashed");
        // Expiry comes at most `duration` after the last renewal; the standby notices at expiry
        // plus up to 1 s of jitter; 5 s more for a busy API server.
        assert!(
            takeover <= Duration::from_secs(duration + renew + 5),
            "takeover took {takeover:?}"
        );
        let current = Api::<Lease>::namespaced(client.clone(), "default")
            .get(&lease_name)
            .await
            .expect("read lease");
        assert_eq!(
            current.spec.and_then(|s| s.holder_identity).as_deref(),
            Some(standby_identity)
        );
        standby.step_down().await;
        delete_lease(&client, &lease_name).await;
    }

    #[tokio::test]
    async fn a_leader_whose_lease_is_taken_reports_the_loss() {
        let Some(client) = cluster().await else {
            return;
        };
        let lease_name = unique_lease("lost");
        let leadership = Leadership::start(
            client.clone(),
            LeaseSettings {
                lease_name: lease_name.clone(),
                // kube-lease-manager itself would only notice at its next renewal, 20 s after it
                // acquired; our own reads of the Lease notice within a quarter of the 10 s slack.
                ..settings("replica-a", 30, 20)
            },
        )
        .await
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
        timeout(Duration::from_secs(12), leadership.lost())
            .await
            .expect("loss noticed within 12 s");
        eprintln!("loss noticed after {:?}", taken_at.elapsed());
        assert_eq!(leadership.role(), Role::Standby);

        leadership.step_down().await;
        let current = Api::<Lease>::namespaced(client.clone(), "default")
            .get(&lease_name)
            .await
            .expect("read lease");
        assert_eq!(
            current.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("intruder"),
            "a deposed leader must not release someone else's lease"
        );
        delete_lease(&client, &lease_name).await;
    }

    #[tokio::test]
    async fn stepping_down_releases_the_lease() {
        let Some(client) = cluster().await else {
            return;
        };
        let lease_name = unique_lease("release");
        let leadership = Leadership::start(
            client.clone(),
            LeaseSettings {
                lease_name: lease_name.clone(),
                ..settings("replica-a", 6, 3)
            },
        )
        .await
        .expect("start");
        timeout(Duration::from_secs(60), leadership.acquire())
            .await
            .expect("acquired within 60 s")
            .expect("acquire");
        leadership.step_down().await;

        let current = Api::<Lease>::namespaced(client.clone(), "default")
            .get(&lease_name)
            .await
            .expect("read lease");
        assert_eq!(current.spec.and_then(|s| s.holder_identity), None);
        delete_lease(&client, &lease_name).await;
    }
}
