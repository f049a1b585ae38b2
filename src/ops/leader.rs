//! Leader election through the `coordination.k8s.io/v1` Lease `ax-operator` (DESIGN §6): only the
//! leader reconciles; a leader that loses the lease stops (the process exits and restarts as a
//! standby). The decisions are `core::election`'s; this is the loop that reads and writes the Lease.
//!
//! Every attempt is one read and at most one write, the write a replace of the version read
//! (resourceVersion precondition) carrying this replica's identity, so two replicas racing for the
//! lease cannot both win. A leader's attempt may take as long as its term has left: a slow API
//! server costs nothing until the renew deadline, and at the deadline the role turns Standby on
//! time even while a request still hangs.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

pub use crate::core::election::Role;
use crate::core::election::{Elector, Step, Timing, TimingError};

/// Name of the Lease the replicas of ax-operator compete for.
pub const LEASE_NAME: &str = "ax-operator";

/// The field manager of the operator's Lease writes.
const FIELD_MANAGER: &str = "ax-operator";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Namespace of the Lease: the operator's own namespace.
    pub namespace: String,
    pub lease_name: String,
    /// Unique among replicas: the pod name.
    pub identity: String,
    /// How long a standby waits after the Lease last changed before taking it (whole seconds).
    pub lease_duration: Duration,
    /// How long after the start of its last successful renewal the leader keeps leading; less
    /// than `lease_duration`, the difference being the time the old leader has to stop.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby reads the Lease; less than `renew_deadline`.
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid lease settings: {0}")]
    InvalidSettings(#[from] TimingError),
    #[error("invalid lease settings: the identity is empty")]
    NoIdentity,
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
    /// Starts competing for the lease (creating the Lease if it is missing).
    pub fn start(client: Client, settings: LeaseSettings) -> Result<Self, LeaderError> {
        if settings.identity.is_empty() {
            return Err(LeaderError::NoIdentity);
        }
        let timing = Timing::new(
            settings.lease_duration,
            settings.renew_deadline,
            settings.retry_period,
        )?;
        let (role_tx, role) = watch::channel(Role::Unknown);
        let (stop, stopped) = oneshot::channel();
        let election = Election {
            leases: Api::namespaced(client, &settings.namespace),
            elector: Elector::new(settings.identity.clone(), timing),
            lease: format!("{}/{}", settings.namespace, settings.lease_name),
            settings,
            last: None,
            fresh_write: false,
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

    /// Stops competing at once without releasing the lease, as a crash would: a standby takes
    /// over once the lease has not been renewed for its duration.
    pub fn abort(self) {
        self.task.abort();
    }
}

struct Election {
    leases: Api<Lease>,
    elector: Elector,
    settings: LeaseSettings,
    /// `namespace/name`, for logs.
    lease: String,
    /// The Lease as last read or written: its resourceVersion is the precondition of the next
    /// write.
    last: Option<Lease>,
    /// The last attempt ended with our successful write: `last` is current unless someone wrote
    /// since.
    fresh_write: bool,
    role: watch::Sender<Role>,
}

impl Election {
    async fn run(mut self, mut stopped: oneshot::Receiver<()>) {
        let timing = self.elector.timing();
        tracing::info!(lease = %self.lease, identity = %self.settings.identity, "joining leader election");
        'election: loop {
            let started = Instant::now();
            // A leader's attempt may use what is left of its term; a standby's, a renew deadline.
            let limit = match self.leading_until() {
                Some(until) if until > started => until,
                _ => started + timing.renew_deadline,
            };
            tokio::select! {
                biased;
                _ = &mut stopped => break 'election,
                result = timeout_at(limit, self.attempt()) => match result {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::warn!(lease = %self.lease, %error, "lease attempt failed"),
                    Err(_) => tracing::warn!(
                        lease = %self.lease,
                        waited = ?started.elapsed(),
                        "lease attempt did not finish before the renew deadline"
                    ),
                },
            }
            self.publish();
            // Wait for the next attempt, waking at the end of the term to report it on time.
            let next = started + timing.retry_period;
            loop {
                let wake = match self.leading_until() {
                    Some(until) if until < next && until > Instant::now() => until,
                    _ => next,
                };
                tokio::select! {
                    biased;
                    _ = &mut stopped => break 'election,
                    _ = sleep_until(wake) => {}
                }
                self.publish();
                if Instant::now() >= next {
                    break;
                }
            }
        }
        self.step_down().await;
    }

    /// One read and, if the election says so, one write. A leader whose last write succeeded
    /// renews with the write alone, over the version it wrote: half the round trips, so twice the
    /// slowness tolerated; a conflict means someone else wrote, and it reads at once.
    async fn attempt(&mut self) -> Result<(), kube::Error> {
        let now = std::time::Instant::now();
        let renew_blind = self.fresh_write && self.elector.role(now) == Role::Leader;
        self.fresh_write = false;
        if renew_blind && let Some(ours) = self.last.clone() {
            match self.decide_and_write(Some(ours), now).await {
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(lease = %self.lease, "the Lease changed since our renewal: reading it");
                }
                other => return other,
            }
        }
        let current = self.leases.get_opt(&self.settings.lease_name).await?;
        let read_at = std::time::Instant::now();
        self.elector
            .observe(current.as_ref().and_then(|l| l.spec.as_ref()), read_at);
        self.last = current.clone();
        // Seeing another holder ends our term at once: say so before writing anything.
        self.publish();
        match self.decide_and_write(current, read_at).await {
            // Another replica wrote first (or created the Lease): the next read shows it.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(lease = %self.lease, reason = %e.reason, "lost a race for the lease");
                Ok(())
            }
            other => other,
        }
    }

    /// Writes what the election decides over `current` (the version read or last written).
    async fn decide_and_write(
        &mut self,
        current: Option<Lease>,
        now: std::time::Instant,
    ) -> Result<(), kube::Error> {
        let Step::Write(spec) = self.elector.next_step(now, Timestamp::now()) else {
            return Ok(());
        };
        let sent_at = std::time::Instant::now();
        let written = self.write(current, spec).await?;
        let spec = written.spec.clone().unwrap_or_default();
        self.elector
            .written(&spec, sent_at, std::time::Instant::now());
        self.last = Some(written);
        self.fresh_write = true;
        Ok(())
    }

    /// Replaces `current` (or creates the Lease) with `spec`, conditional on the version read.
    async fn write(&self, current: Option<Lease>, spec: LeaseSpec) -> Result<Lease, kube::Error> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.lease_name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.leases.create(&params, &lease).await
            }
            Some(mut lease) => {
                // metadata.resourceVersion stays that of the read: the precondition.
                lease.metadata.managed_fields = None;
                lease.spec = Some(spec);
                self.leases
                    .replace(&self.settings.lease_name, &params, &lease)
                    .await
            }
        }
    }

    fn leading_until(&self) -> Option<Instant> {
        self.elector.leading_until().map(Instant::from_std)
    }

    fn publish(&self) {
        let role = self.elector.role(std::time::Instant::now());
        let lease = &self.lease;
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

    /// Stops acting as leader, then hands the lease over if the last record we saw is ours (the
    /// write is conditional on that version, so it never touches a lease someone else took).
    async fn step_down(&mut self) {
        let was_leader = self.role.send_replace(Role::Standby) == Role::Leader;
        let (Some(release), Some(last)) =
            (self.elector.release(Timestamp::now()), self.last.clone())
        else {
            return;
        };
        if was_leader {
            tracing::info!(lease = %self.lease, "stepping down");
        }
        let (mut last, mut release) = (last, release);
        // Twice at most: a renewal given up on when the stop came may have landed after all, so
        // `last` is one version behind; the Lease is read again and released if still ours.
        for _ in 0..2 {
            match timeout(Duration::from_secs(5), self.write(Some(last), release)).await {
                Ok(Ok(_)) => {
                    self.elector.released();
                    tracing::info!(lease = %self.lease, "released lease");
                    return;
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                    let Ok(Ok(Some(fresh))) = timeout(
                        Duration::from_secs(5),
                        self.leases.get_opt(&self.settings.lease_name),
                    )
                    .await
                    else {
                        break;
                    };
                    self.elector
                        .observe(fresh.spec.as_ref(), std::time::Instant::now());
                    let Some(again) = self.elector.release(Timestamp::now()) else {
                        // Someone else holds it now: nothing of ours to hand over.
                        return;
                    };
                    (last, release) = (fresh, again);
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = %self.lease, %error, "cannot release lease");
                    return;
                }
                Err(_) => {
                    tracing::warn!(lease = %self.lease, "releasing lease timed out");
                    return;
                }
            }
        }
        tracing::warn!(lease = %self.lease, "cannot release lease: it kept changing");
    }
}
