//! Is the ax operator running? It is when its leader-election Lease has a holder whose renewal is
//! younger than the lease duration. `lease_state` and `choose_lease_namespace` decide (no client
//! required); `lease_namespace` finds the Lease, `check` reads it (client required).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::ctx::Ctx;
use super::error::{ClientError, Op, Resource, from_kube};
use super::format::human;

/// What the Lease says about the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperatorState {
    /// A holder renewed within the lease duration.
    Running { holder: String, renewed_ago: String },
    /// Nobody holds the lease (released on shutdown, or never acquired).
    NoHolder,
    /// The holder stopped renewing: its lease ran out this long ago.
    Expired { holder: String, expired_ago: String },
    /// No Lease of that name: no operator ever ran there.
    Missing,
    /// We may not read the Lease; nothing is known.
    Unknown(String),
}

impl OperatorState {
    /// The reason for `ClientError::OperatorNotRunning`, or None when the operator is (or may be) up.
    pub fn not_running_because(&self) -> Option<String> {
        match self {
            OperatorState::Running { .. } | OperatorState::Unknown(_) => None,
            OperatorState::NoHolder => Some("has no holder".into()),
            OperatorState::Expired {
                holder,
                expired_ago,
            } => Some(format!(
                "held by \"{holder}\" expired {expired_ago} ago (not renewed)"
            )),
            OperatorState::Missing => Some("does not exist (no operator ever ran there)".into()),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            OperatorState::Running {
                holder,
                renewed_ago,
            } => format!("running (leader \"{holder}\", renewed {renewed_ago} ago)"),
            OperatorState::Unknown(why) => format!("unknown ({why})"),
            other => format!(
                "not running (Lease {})",
                other.not_running_because().unwrap_or_default()
            ),
        }
    }
}

/// The operator's state from its Lease at `now`.
pub fn lease_state(spec: Option<&LeaseSpec>, now: Timestamp) -> OperatorState {
    let Some(spec) = spec else {
        return OperatorState::NoHolder;
    };
    let holder = match spec.holder_identity.as_deref() {
        Some(h) if !h.is_empty() => h.to_owned(),
        _ => return OperatorState::NoHolder,
    };
    let Some(renewed) = spec
        .renew_time
        .as_ref()
        .map(|t| t.0)
        .or(spec.acquire_time.as_ref().map(|t| t.0))
    else {
        // Held but never renewed: cannot be judged stale; trust the holder.
        return OperatorState::Running {
            holder,
            renewed_ago: "?".into(),
        };
    };
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(15).into());
    let expires = renewed.checked_add(duration).unwrap_or(renewed);
    if now > expires {
        OperatorState::Expired {
            holder,
            expired_ago: human(now.duration_since(expires)),
        }
    } else {
        OperatorState::Running {
            holder,
            renewed_ago: human(now.duration_since(renewed)),
        }
    }
}

/// Where the operator's Lease is when nothing says: the install's default namespace.
pub const DEFAULT_NAMESPACE: &str = "ax-system";

/// The namespace of the operator's Lease: the one given (`--operator-namespace`,
/// `AX_OPERATOR_NAMESPACE`), else among those holding a Lease of that name (`found`; None when
/// they could not be listed) `ax-system`, then a live one, then by name; else `ax-system`. An
/// install in another namespace is found without a flag, while one in `ax-system` keeps the
/// meaning it always had: a second install elsewhere (a Helm test release, say) does not make
/// a stopped default operator look alive.
pub fn choose_lease_namespace(
    given: Option<&str>,
    found: Option<&[(String, OperatorState)]>,
) -> String {
    if let Some(ns) = given {
        return ns.to_owned();
    }
    found
        .into_iter()
        .flatten()
        .min_by_key(|(ns, state)| {
            (
                ns != DEFAULT_NAMESPACE,
                !matches!(state, OperatorState::Running { .. }),
                ns.clone(),
            )
        })
        .map(|(ns, _)| ns.clone())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
}

/// The namespace of the operator's Lease, looked up once per run: a cluster-wide list of the
/// Leases of that name (field selector), `ax-system` when the list is refused or fails.
pub async fn lease_namespace(ctx: &Ctx) -> String {
    if let Some(ns) = ctx.operator_namespace.get() {
        return ns.clone();
    }
    let given = ctx.global.operator_namespace.as_deref();
    let found = if given.is_some() {
        None
    } else {
        let api: Api<Lease> = Api::all(ctx.client.clone());
        let params =
            ListParams::default().fields(&format!("metadata.name={}", ctx.global.operator_lease));
        let now = Timestamp::now();
        api.list(&params).await.ok().map(|list| {
            list.items
                .iter()
                .filter_map(|l| Some((l.namespace()?, lease_state(l.spec.as_ref(), now))))
                .collect::<Vec<_>>()
        })
    };
    let chosen = choose_lease_namespace(given, found.as_deref());
    ctx.operator_namespace.get_or_init(|| chosen).clone()
}

/// Reads the operator's Lease.
pub async fn state(ctx: &Ctx) -> Result<OperatorState, ClientError> {
    let namespace = &lease_namespace(ctx).await;
    let name = &ctx.global.operator_lease;
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), namespace);
    let op = Op::new("get", Resource::Lease)
        .namespace(Some(namespace))
        .name(name);
    match api.get_opt(name).await {
        Ok(Some(lease)) => Ok(lease_state(lease.spec.as_ref(), Timestamp::now())),
        Ok(None) => Ok(OperatorState::Missing),
        Err(e) => match from_kube(&op, e) {
            // Most users may not read the operator's namespace: then we cannot tell, and go on.
            ClientError::Forbidden { .. } => Ok(OperatorState::Unknown(format!(
                "no permission to read Lease {namespace}/{name}"
            ))),
            other => Err(other),
        },
    }
}

/// How long `check` keeps looking before it calls the operator not running: an operator that
/// just started takes a moment to acquire its Lease, and a script may start both at once.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Fails with `OperatorNotRunning` when the Lease shows no live operator for `GRACE` (skipped
/// with `--skip-operator-check`).
pub async fn check(ctx: &Ctx) -> Result<(), ClientError> {
    if ctx.global.skip_operator_check {
        return Ok(());
    }
    let deadline = std::time::Instant::now() + GRACE;
    loop {
        let state = state(ctx).await?;
        let Some(why) = state.not_running_because() else {
            return Ok(());
        };
        if std::time::Instant::now() >= deadline {
            return Err(ClientError::OperatorNotRunning {
                namespace: lease_namespace(ctx).await,
                lease: ctx.global.operator_lease.clone(),
                why,
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn spec(holder: Option<&str>, renewed: Option<&str>, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(|r| MicroTime(at(r))),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn the_lease_namespace_is_the_given_one_else_a_live_found_one_else_ax_system() {
        let running = || OperatorState::Running {
            holder: "ax-operator-0".into(),
            renewed_ago: "1s".into(),
        };
        let found = |list: &[(&str, OperatorState)]| -> Vec<(String, OperatorState)> {
            list.iter()
                .map(|(ns, st)| (ns.to_string(), st.clone()))
                .collect()
        };
        let both = found(&[("ops", running()), ("ax-system", OperatorState::NoHolder)]);
        assert_eq!(choose_lease_namespace(Some("given"), Some(&both)), "given");
        assert_eq!(
            choose_lease_namespace(None, Some(&both)),
            "ax-system",
            "the default install keeps its meaning, running or not"
        );
        let elsewhere = found(&[("b", OperatorState::NoHolder), ("c", running())]);
        assert_eq!(
            choose_lease_namespace(None, Some(&elsewhere)),
            "c",
            "the live one"
        );
        assert_eq!(
            choose_lease_namespace(None, Some(&found(&[("ops", running())]))),
            "ops",
            "an install elsewhere is found"
        );
        let two_live = found(&[
            ("zz", running()),
            ("ax-system", running()),
            ("aa", running()),
        ]);
        assert_eq!(choose_lease_namespace(None, Some(&two_live)), "ax-system");
        let stale = found(&[
            ("b", OperatorState::NoHolder),
            ("a", OperatorState::NoHolder),
        ]);
        assert_eq!(choose_lease_namespace(None, Some(&stale)), "a");
        assert_eq!(
            choose_lease_namespace(None, Some(&[])),
            "ax-system",
            "none found"
        );
        assert_eq!(
            choose_lease_namespace(None, None),
            "ax-system",
            "list refused"
        );
    }

    #[test]
    fn a_fresh_renewal_means_running() {
        let s = spec(Some("op-1"), Some("2025-01-01T00:00:00Z"), 15);
        assert_eq!(
            lease_state(Some(&s), at("2025-01-01T00:00:10Z")),
            OperatorState::Running {
                holder: "op-1".into(),
                renewed_ago: "10s".into()
            }
        );
        assert_eq!(
            lease_state(Some(&s), at("2025-01-01T00:00:15Z")).not_running_because(),
            None,
            "valid up to and including the duration"
        );
    }

    #[test]
    fn an_old_renewal_means_expired() {
        let s = spec(Some("op-1"), Some("2025-01-01T00:00:00Z"), 15);
        let state = lease_state(Some(&s), at("2025-01-01T00:01:15Z"));
        assert_eq!(
            state,
            OperatorState::Expired {
                holder: "op-1".into(),
                expired_ago: "60s".into()
            }
        );
        assert!(state.not_running_because().unwrap().contains("expired"));
    }

    #[test]
    fn no_holder_or_no_spec_means_not_running() {
        let now = at("2025-01-01T00:00:00Z");
        for s in [
            spec(None, Some("2025-01-01T00:00:00Z"), 15),
            spec(Some(""), None, 15),
        ] {
            assert_eq!(lease_state(Some(&s), now), OperatorState::NoHolder);
        }
        assert_eq!(lease_state(None, now), OperatorState::NoHolder);
        assert_eq!(
            OperatorState::NoHolder.not_running_because().unwrap(),
            "has no holder"
        );
    }

    #[test]
    fn unknown_is_not_an_error() {
        assert_eq!(
            OperatorState::Unknown("forbidden".into()).not_running_because(),
            None
        );
    }
}
