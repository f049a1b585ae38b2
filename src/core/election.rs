//! Leader election over a `coordination.k8s.io/v1` Lease, as decisions (DESIGN §6): what a replica
//! writes, and whether it leads, given what it read and when. The shell (`ops::leader`) does the
//! reads and writes; every write replaces the version that was read (resourceVersion precondition),
//! so of two replicas racing for one version exactly one wins.
//!
//! The timing is client-go's. A leader renews every `retry_period`; it leads until
//! `renew_deadline` after the start of its last successful write, however slow the attempts in
//! between are (slow is not lost). A standby takes the lease over only once the record it reads has
//! not changed for `lease_duration` by its *own* clock, counted from when it first saw that record,
//! so clock skew between nodes does not matter. Since a standby sees a record only after it was
//! written, and `renew_deadline < lease_duration`, a leader always stops before a standby can start;
//! the difference is the time the old leader has to actually stop.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not yet known whether we or another replica hold the lease.
    Unknown,
    Standby,
    Leader,
}

/// How long a lease lasts and how it is renewed; `retry_period < renew_deadline < lease_duration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a standby waits, after the record last changed, before it takes the lease.
    pub lease_duration: Duration,
    /// How long after the start of its last successful renewal a leader keeps leading.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby reads.
    pub retry_period: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "renew interval ({retry_period:?}) must be positive and shorter than the renew deadline ({renew_deadline:?})"
    )]
    RetryNotBelowDeadline {
        retry_period: Duration,
        renew_deadline: Duration,
    },
    #[error(
        "renew deadline ({renew_deadline:?}) must be shorter than the lease duration ({lease_duration:?})"
    )]
    DeadlineNotBelowDuration {
        renew_deadline: Duration,
        lease_duration: Duration,
    },
    #[error("lease duration {0:?} is not a whole number of seconds between 1 and 2^31")]
    Duration(Duration),
}

impl Timing {
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingError> {
        let whole = lease_duration.subsec_nanos() == 0
            && lease_duration.as_secs() > 0
            && i32::try_from(lease_duration.as_secs()).is_ok();
        if !whole {
            return Err(TimingError::Duration(lease_duration));
        }
        if retry_period.is_zero() || retry_period >= renew_deadline {
            return Err(TimingError::RetryNotBelowDeadline {
                retry_period,
                renew_deadline,
            });
        }
        if renew_deadline >= lease_duration {
            return Err(TimingError::DeadlineNotBelowDuration {
                renew_deadline,
                lease_duration,
            });
        }
        Ok(Timing {
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }

    fn lease_duration_seconds(&self) -> i32 {
        // Checked in `new`.
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// What to do after a read.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Write this spec over the version read (or create the Lease if there was none).
    Write(LeaseSpec),
    /// Another replica holds the lease and it has not expired by our clock.
    Wait,
}

/// One replica's view of the election.
#[derive(Clone, Debug)]
pub struct Elector {
    identity: String,
    timing: Timing,
    /// The record as last read (`None`: no Lease) and when we first saw it in that state.
    observed: Option<(Option<LeaseSpec>, Instant)>,
    /// Start of our last successful write as the holder.
    renewed_at: Option<Instant>,
}

impl Elector {
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Elector {
            identity: identity.into(),
            timing,
            observed: None,
            renewed_at: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// A read of the Lease (`None`: it does not exist) that completed at `now`.
    pub fn observe(&mut self, spec: Option<&LeaseSpec>, now: Instant) {
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| seen.as_ref() != spec);
        if changed {
            self.observed = Some((spec.cloned(), now));
        }
        // Someone else holds it: we stop leading at once, whatever our deadline says.
        if holder(spec) != Some(self.identity.as_str()) {
            self.renewed_at = None;
        }
    }

    /// What to write after the last read, at `now` (monotonic) and `wall` (for the record).
    pub fn next_step(&self, now: Instant, wall: Timestamp) -> Step {
        let Some((spec, first_seen)) = &self.observed else {
            return Step::Wait;
        };
        let spec = spec.as_ref();
        match holder(spec) {
            Some(current) if current == self.identity => Step::Write(self.renewal(spec, wall)),
            None => Step::Write(self.acquisition(spec, wall)),
            Some(_) => {
                // The holder's own duration if it is longer than ours (replicas configured apart).
                let holders = spec
                    .and_then(|s| s.lease_duration_seconds)
                    .and_then(|s| u64::try_from(s).ok())
                    .map_or(Duration::ZERO, Duration::from_secs);
                let wait = self.timing.lease_duration.max(holders);
                if now.saturating_duration_since(*first_seen) >= wait {
                    Step::Write(self.acquisition(spec, wall))
                } else {
                    Step::Wait
                }
            }
        }
    }

    /// Our write of `spec`, sent at `sent_at`, succeeded.
    pub fn written(&mut self, spec: &LeaseSpec, sent_at: Instant, now: Instant) {
        self.observe(Some(spec), now);
        if holder(Some(spec)) == Some(self.identity.as_str()) {
            self.renewed_at = Some(sent_at);
        }
    }

    /// Until when we lead, if we do (by the last renewal, whether or not that time has passed).
    pub fn leading_until(&self) -> Option<Instant> {
        self.renewed_at.map(|at| at + self.timing.renew_deadline)
    }

    pub fn role(&self, now: Instant) -> Role {
        match (self.leading_until(), &self.observed) {
            (Some(until), _) if now < until => Role::Leader,
            (_, Some(_)) => Role::Standby,
            (_, None) => Role::Unknown,
        }
    }

    /// The spec that hands the lease over at once, if the last record read is ours.
    pub fn release(&self, wall: Timestamp) -> Option<LeaseSpec> {
        let (Some(spec), _) = self.observed.as_ref()? else {
            return None;
        };
        (holder(Some(spec)) == Some(self.identity.as_str())).then(|| LeaseSpec {
            holder_identity: None,
            acquire_time: None,
            // When it was let go: the end of our term for anyone auditing the Lease.
            renew_time: Some(MicroTime(wall)),
            lease_duration_seconds: Some(1),
            lease_transitions: spec.lease_transitions,
            ..LeaseSpec::default()
        })
    }

    /// Called after [`release`](Self::release) was written: we no longer lead.
    pub fn released(&mut self) {
        self.renewed_at = None;
    }

    fn renewal(&self, spec: Option<&LeaseSpec>, wall: Timestamp) -> LeaseSpec {
        let current = spec.cloned().unwrap_or_default();
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            acquire_time: current.acquire_time.or(Some(MicroTime(wall))),
            renew_time: Some(MicroTime(wall)),
            lease_duration_seconds: Some(self.timing.lease_duration_seconds()),
            lease_transitions: current.lease_transitions.or(Some(0)),
            ..current
        }
    }

    fn acquisition(&self, spec: Option<&LeaseSpec>, wall: Timestamp) -> LeaseSpec {
        let current = spec.cloned().unwrap_or_default();
        let transitions = match current.lease_transitions {
            Some(n) if holder(spec).is_some() || current.renew_time.is_some() => {
                n.saturating_add(1)
            }
            Some(n) => n,
            None => 0,
        };
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            acquire_time: Some(MicroTime(wall)),
            renew_time: Some(MicroTime(wall)),
            lease_duration_seconds: Some(self.timing.lease_duration_seconds()),
            lease_transitions: Some(transitions),
            ..current
        }
    }
}

fn holder(spec: Option<&LeaseSpec>) -> Option<&str> {
    spec?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

#[cfg(test)]
#[path = "election_tests.rs"]
mod tests;
