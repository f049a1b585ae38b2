//! An AxQueue spec as the dispatcher applies it, and the checks the OpenAPI schema cannot make
//! (time zones, wall-clock times, a queue that could never dispatch). A spec that fails them is not
//! applied; the previous configuration stays in force.

use std::collections::BTreeMap;

use jiff::SignedDuration;

use super::breaker::BreakerConfig;
use super::key::{KeySource, KeySourceError};
use super::weights::{WeightWindow, Weights, WindowLimits, window_in_force};
use crate::api::{
    AxQueueSpec, ConcurrencyMode, FairnessSpec, KeyConcurrencySpec, KeyRateSpec, PreemptionPolicy,
    PreemptionSpec, Priority, QueueWeights, StopPolicy,
};
use crate::core::selector::{self, Selector, SelectorError};

/// How long the next task of a bucket may wait before it goes ahead of the weights; `None` = no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxWait {
    pub critical: Option<SignedDuration>,
    pub high: Option<SignedDuration>,
    pub normal: Option<SignedDuration>,
    pub low: Option<SignedDuration>,
}

impl Default for MaxWait {
    fn default() -> Self {
        Self {
            critical: None,
            high: None,
            normal: Some(SignedDuration::from_secs(30)),
            low: Some(SignedDuration::from_secs(120)),
        }
    }
}

impl MaxWait {
    pub fn of(&self, priority: Priority) -> Option<SignedDuration> {
        match priority {
            Priority::Critical => self.critical,
            Priority::High => self.high,
            Priority::Normal => self.normal,
            Priority::Low => self.low,
        }
    }
}

/// The dispatch-relevant part of an AxQueue spec.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub weights: Weights,
    pub max_wait: MaxWait,
    /// Most tasks dispatched and not yet finished (Scheduled + Running) at once.
    pub concurrency: u32,
    /// Per task type, most of its tasks dispatched and not yet finished at once.
    pub type_concurrency: BTreeMap<String, u32>,
    /// Rate of dispatches of attempts after the first; see `token_bucket` for the burst.
    pub retry_rate_per_minute: u32,
    pub circuit_breaker: BreakerConfig,
    pub weight_schedule: Vec<WeightWindow>,
    /// `concurrencyPolicy: Adaptive`, with its minimum; `None`: the limit is fixed.
    pub adaptive_min: Option<u32>,
    /// The namespaces whose tasks may be dispatched (`namespaceSelector`).
    pub namespace_selector: Selector,
    /// `Hold` and `HoldAndDrain` dispatch nothing (`stopPolicy`).
    pub stop_policy: StopPolicy,
    /// Fair shares between tenants within each bucket; `None`: oldest first, whoever's.
    pub fairness: Option<Fairness>,
    /// Where a task's tenant comes from (`fairness.key`), for fair shares and per-key limits.
    pub key: KeySource,
    /// Most tasks of one tenant dispatched and not yet finished at once; `None`: no such limit.
    pub key_concurrency: Option<KeyConcurrency>,
    /// Most dispatches of one tenant per minute, with a burst; `None`: no such limit.
    pub key_rate: Option<KeyRate>,
    /// `preemption.withinQueue: LowerPriority`; `None`: `Never`.
    pub preemption: Option<Preemption>,
}

/// `spec.preemption` when it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemption {
    /// How long a Critical or High task waits in a full queue before a slot is taken for it.
    pub after: SignedDuration,
    /// Most attempts stopped in any minute.
    pub max_per_minute: u32,
}

/// `spec.keyRate`: a token bucket per tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyRate {
    pub per_minute: u32,
    pub burst: u32,
}

/// `spec.fairness`: the weights of the tenants (namespaces) named; the others weigh 1.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fairness {
    pub weights: BTreeMap<String, u32>,
}

/// `spec.keyConcurrency`: a limit for every tenant, and limits for some by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyConcurrency {
    pub limit: Option<u32>,
    pub overrides: BTreeMap<String, u32>,
}

/// The limits a queue applies at one instant: its own, or those the window in force overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsInForce {
    /// Index of the `weightSchedule` window in force, if any.
    pub window: Option<usize>,
    pub concurrency: u32,
    /// Every type with a limit: the queue's own, overridden by the window's.
    pub type_concurrency: BTreeMap<String, u32>,
    pub retry_rate_per_minute: u32,
}

impl QueueConfig {
    /// The limits in force while `window` (an index into `weight_schedule`, or none) is in force.
    pub fn limits_in(&self, window: Option<usize>) -> LimitsInForce {
        let overrides = window
            .and_then(|index| self.weight_schedule.get(index))
            .map(WeightWindow::limits);
        let mut type_concurrency = self.type_concurrency.clone();
        if let Some(limits) = overrides {
            type_concurrency.extend(limits.type_concurrency.iter().map(|(k, v)| (k.clone(), *v)));
        }
        LimitsInForce {
            window: window.filter(|index| *index < self.weight_schedule.len()),
            concurrency: overrides
                .and_then(|l| l.concurrency)
                .unwrap_or(self.concurrency),
            type_concurrency,
            retry_rate_per_minute: overrides
                .and_then(|l| l.retry_rate_per_minute)
                .unwrap_or(self.retry_rate_per_minute),
        }
    }

    /// The limits in force at `now`.
    pub fn limits_at(&self, now: jiff::Timestamp) -> LimitsInForce {
        self.limits_in(window_in_force(&self.weight_schedule, now))
    }

    /// The concurrency limit while `window` is in force (no map built, for the dispatch path).
    pub fn concurrency_in(&self, window: Option<usize>) -> u32 {
        window
            .and_then(|index| self.weight_schedule.get(index))
            .and_then(|w| w.limits().concurrency)
            .unwrap_or(self.concurrency)
    }

    /// The limit of `task_type` while `window` is in force, if it has one.
    pub fn type_limit_in(&self, window: Option<usize>, task_type: &str) -> Option<u32> {
        window
            .and_then(|index| self.weight_schedule.get(index))
            .and_then(|w| w.limits().type_concurrency.get(task_type))
            .or_else(|| self.type_concurrency.get(task_type))
            .copied()
    }

    /// The fair-share weight of tenant `name` (1 unless `fairness.weights` says otherwise).
    pub fn tenant_weight(&self, name: &str) -> u32 {
        self.fairness
            .as_ref()
            .and_then(|f| f.weights.get(name))
            .copied()
            .unwrap_or(1)
    }

    /// Whether the queue treats its tenants apart (`fairness`, `keyConcurrency` or `keyRate`): its
    /// status and metrics then count tasks per tenant.
    pub fn has_keys(&self) -> bool {
        self.fairness.is_some() || self.key_concurrency.is_some() || self.key_rate.is_some()
    }

    /// The `keyConcurrency` limit of tenant `name`, if it has one.
    pub fn tenant_limit(&self, name: &str) -> Option<u32> {
        let limits = self.key_concurrency.as_ref()?;
        limits.overrides.get(name).copied().or(limits.limit)
    }

    /// The retry rate while `window` is in force.
    pub fn retry_rate_in(&self, window: Option<usize>) -> u32 {
        window
            .and_then(|index| self.weight_schedule.get(index))
            .and_then(|w| w.limits().retry_rate_per_minute)
            .unwrap_or(self.retry_rate_per_minute)
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            max_wait: MaxWait::default(),
            concurrency: 100,
            type_concurrency: BTreeMap::new(),
            retry_rate_per_minute: 1000,
            circuit_breaker: BreakerConfig::default(),
            weight_schedule: Vec::new(),
            adaptive_min: None,
            namespace_selector: Selector::default(),
            stop_policy: StopPolicy::None,
            fairness: None,
            key: KeySource::Namespace,
            key_concurrency: None,
            key_rate: None,
            preemption: None,
        }
    }
}

/// Why a queue spec cannot be applied; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueSpecError {
    #[error("{field} ({value}) must not be negative")]
    Negative { field: String, value: i64 },
    #[error("spec.maxWaitSeconds.{field} ({value}) must be 0 (no limit) or more")]
    MaxWait { field: &'static str, value: i64 },
    #[error("spec.circuitBreaker.failureRatio ({0}) must be above 0 and at most 1")]
    FailureRatio(f64),
    #[error("spec.circuitBreaker.openSeconds ({0}) must be at least 1")]
    OpenSeconds(i64),
    #[error("{field}: {message}")]
    Window { field: String, message: String },
    #[error("{0} are all 0 and no maxWaitSeconds is set: nothing would ever be dispatched")]
    NothingDispatched(String),
    #[error("spec.concurrencyPolicy.min ({0}) must be at least 1")]
    AdaptiveMin(i32),
    #[error("{0}")]
    NamespaceSelector(SelectorError),
    #[error("spec.fairness.weights[{key}] ({value}) must be at least 1")]
    KeyWeight { key: String, value: i32 },
    #[error("{0}")]
    Key(KeySourceError),
}

/// The dispatcher configuration of a queue spec, or why the spec cannot be applied.
pub fn queue_config(spec: &AxQueueSpec) -> Result<QueueConfig, QueueSpecError> {
    let weights = weights_of(&spec.weights, "spec.weights")?;
    let wait = |field: &'static str, seconds: i64| match seconds {
        0 => Ok(None),
        s if s > 0 => Ok(Some(SignedDuration::from_secs(s))),
        value => Err(QueueSpecError::MaxWait { field, value }),
    };
    let m = &spec.max_wait_seconds;
    let max_wait = MaxWait {
        critical: wait("critical", m.critical)?,
        high: wait("high", m.high)?,
        normal: wait("normal", m.normal)?,
        low: wait("low", m.low)?,
    };
    let concurrency = non_negative(spec.concurrency, "spec.concurrency")?;
    let type_concurrency = spec
        .type_concurrency
        .iter()
        .map(|(task_type, limit)| {
            non_negative(*limit, &format!("spec.typeConcurrency[{task_type}]"))
                .map(|limit| (task_type.clone(), limit))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    let retry_rate_per_minute =
        non_negative(spec.retry_rate_per_minute, "spec.retryRatePerMinute")?;
    let cb = &spec.circuit_breaker;
    if !(cb.failure_ratio > 0.0 && cb.failure_ratio <= 1.0) {
        return Err(QueueSpecError::FailureRatio(cb.failure_ratio));
    }
    if cb.open_seconds < 1 {
        return Err(QueueSpecError::OpenSeconds(cb.open_seconds));
    }
    let circuit_breaker = BreakerConfig {
        window_size: non_negative(cb.window_size, "spec.circuitBreaker.windowSize")?,
        min_requests: non_negative(cb.min_requests, "spec.circuitBreaker.minRequests")?.max(1),
        failure_ratio: cb.failure_ratio,
        open_for: SignedDuration::from_secs(cb.open_seconds),
    };
    let mut weight_schedule = Vec::with_capacity(spec.weight_schedule.len());
    for (i, entry) in spec.weight_schedule.iter().enumerate() {
        let field = format!("spec.weightSchedule[{i}]");
        let window_weights = entry
            .weights
            .as_ref()
            .map(|w| weights_of(w, &format!("{field}.weights")))
            .transpose()?;
        let limits = WindowLimits {
            concurrency: entry
                .concurrency
                .map(|c| non_negative(c, &format!("{field}.concurrency")))
                .transpose()?,
            type_concurrency: entry
                .type_concurrency
                .iter()
                .map(|(task_type, limit)| {
                    non_negative(*limit, &format!("{field}.typeConcurrency[{task_type}]"))
                        .map(|limit| (task_type.clone(), limit))
                })
                .collect::<Result<BTreeMap<_, _>, _>>()?,
            retry_rate_per_minute: entry
                .retry_rate_per_minute
                .map(|r| non_negative(r, &format!("{field}.retryRatePerMinute")))
                .transpose()?,
        };
        let window = WeightWindow::parse_with(
            &entry.from,
            &entry.to,
            &entry.time_zone,
            window_weights,
            limits,
        )
        .map_err(|e| QueueSpecError::Window {
            field,
            message: e.to_string(),
        })?;
        weight_schedule.push(window);
    }
    let any_max_wait = Priority::ALL
        .iter()
        .any(|priority| max_wait.of(*priority).is_some());
    if !any_max_wait {
        let stalled = std::iter::once(("spec.weights".to_string(), &weights)).chain(
            weight_schedule.iter().enumerate().filter_map(|(i, w)| {
                Some((format!("spec.weightSchedule[{i}].weights"), w.weights()?))
            }),
        );
        for (field, w) in stalled {
            if Priority::ALL.iter().all(|priority| w.of(*priority) == 0) {
                return Err(QueueSpecError::NothingDispatched(field));
            }
        }
    }
    let policy = &spec.concurrency_policy;
    let adaptive_min = match policy.mode {
        ConcurrencyMode::Fixed => None,
        ConcurrencyMode::Adaptive if policy.min < 1 => {
            return Err(QueueSpecError::AdaptiveMin(policy.min));
        }
        ConcurrencyMode::Adaptive => Some(non_negative(policy.min, "spec.concurrencyPolicy.min")?),
    };
    let namespace_selector = match &spec.namespace_selector {
        Some(s) => selector::parse(s, "spec.namespaceSelector")
            .map_err(QueueSpecError::NamespaceSelector)?,
        None => Selector::default(),
    };
    Ok(QueueConfig {
        weights,
        max_wait,
        concurrency,
        type_concurrency,
        retry_rate_per_minute,
        circuit_breaker,
        weight_schedule,
        adaptive_min,
        namespace_selector,
        stop_policy: spec.stop_policy,
        fairness: spec.fairness.as_ref().map(fairness_of).transpose()?,
        key: match spec.fairness.as_ref().and_then(|f| f.key.as_ref()) {
            Some(key) => KeySource::of(key).map_err(QueueSpecError::Key)?,
            None => KeySource::Namespace,
        },
        key_concurrency: spec
            .key_concurrency
            .as_ref()
            .map(key_concurrency_of)
            .transpose()?,
        key_rate: spec.key_rate.as_ref().map(key_rate_of).transpose()?,
        preemption: preemption_of(&spec.preemption)?,
    })
}

fn preemption_of(spec: &PreemptionSpec) -> Result<Option<Preemption>, QueueSpecError> {
    if spec.within_queue == PreemptionPolicy::Never {
        return Ok(None);
    }
    let after = non_negative(spec.after_seconds, "spec.preemption.afterSeconds")?;
    let max_per_minute = non_negative(spec.max_per_minute, "spec.preemption.maxPerMinute")?.max(1);
    Ok(Some(Preemption {
        after: SignedDuration::from_secs(i64::from(after)),
        max_per_minute,
    }))
}

fn key_rate_of(spec: &KeyRateSpec) -> Result<KeyRate, QueueSpecError> {
    let per_minute = non_negative(spec.per_minute, "spec.keyRate.perMinute")?;
    let burst = match spec.burst {
        Some(burst) => non_negative(burst, "spec.keyRate.burst")?.max(1),
        None => (per_minute / 60).max(1),
    };
    Ok(KeyRate { per_minute, burst })
}

fn fairness_of(spec: &FairnessSpec) -> Result<Fairness, QueueSpecError> {
    let weights = spec
        .weights
        .iter()
        .map(|(key, weight)| match u32::try_from(*weight) {
            Ok(w) if w >= 1 => Ok((key.clone(), w)),
            _ => Err(QueueSpecError::KeyWeight {
                key: key.clone(),
                value: *weight,
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok(Fairness { weights })
}

fn key_concurrency_of(spec: &KeyConcurrencySpec) -> Result<KeyConcurrency, QueueSpecError> {
    Ok(KeyConcurrency {
        limit: spec
            .limit
            .map(|l| non_negative(l, "spec.keyConcurrency.limit"))
            .transpose()?,
        overrides: spec
            .overrides
            .iter()
            .map(|(key, limit)| {
                non_negative(*limit, &format!("spec.keyConcurrency.overrides[{key}]"))
                    .map(|limit| (key.clone(), limit))
            })
            .collect::<Result<_, _>>()?,
    })
}

fn weights_of(w: &QueueWeights, field: &str) -> Result<Weights, QueueSpecError> {
    Ok(Weights {
        critical: non_negative(w.critical, &format!("{field}.critical"))?,
        high: non_negative(w.high, &format!("{field}.high"))?,
        normal: non_negative(w.normal, &format!("{field}.normal"))?,
        low: non_negative(w.low, &format!("{field}.low"))?,
    })
}

fn non_negative(value: i32, field: &str) -> Result<u32, QueueSpecError> {
    u32::try_from(value).map_err(|_| QueueSpecError::Negative {
        field: field.to_string(),
        value: i64::from(value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        CircuitBreakerSpec, MaxWaitSeconds, QueueConcurrencyPolicy, WeightScheduleEntry,
    };

    #[test]
    fn spec_defaults_match_the_design() {
        let spec: AxQueueSpec = serde_json::from_value(serde_json::json!({})).expect("empty spec");
        let config = queue_config(&spec).expect("defaults are valid");
        assert_eq!(config, QueueConfig::default());
        let partial: AxQueueSpec = serde_json::from_value(
            serde_json::json!({"weights": {"low": 5}, "maxWaitSeconds": {"low": 0}}),
        )
        .expect("partial spec");
        let config = queue_config(&partial).expect("valid");
        assert_eq!(
            config.weights,
            Weights {
                critical: 4,
                high: 3,
                normal: 2,
                low: 5
            }
        );
        assert_eq!(config.max_wait.low, None);
        assert_eq!(config.max_wait.normal, Some(SignedDuration::from_secs(30)));
    }

    #[test]
    fn specs_the_schema_cannot_check_are_rejected_with_the_field() {
        let window = |from: &str, to: &str, tz: &str| WeightScheduleEntry {
            from: from.into(),
            to: to.into(),
            time_zone: tz.into(),
            weights: Some(QueueWeights::default()),
            ..WeightScheduleEntry::default()
        };
        let cases = [
            (
                AxQueueSpec {
                    weight_schedule: vec![window("22:00", "06:00", "Mars/Olympus")],
                    ..AxQueueSpec::default()
                },
                "spec.weightSchedule[0]",
            ),
            (
                AxQueueSpec {
                    weight_schedule: vec![
                        window("22:00", "06:00", "Europe/Berlin"),
                        window("25:00", "06:00", "UTC"),
                    ],
                    ..AxQueueSpec::default()
                },
                "spec.weightSchedule[1]",
            ),
            (
                AxQueueSpec {
                    weights: QueueWeights {
                        critical: 0,
                        high: 0,
                        normal: 0,
                        low: 0,
                    },
                    max_wait_seconds: MaxWaitSeconds {
                        critical: 0,
                        high: 0,
                        normal: 0,
                        low: 0,
                    },
                    ..AxQueueSpec::default()
                },
                "spec.weights are all 0",
            ),
            (
                AxQueueSpec {
                    circuit_breaker: CircuitBreakerSpec {
                        failure_ratio: 0.0,
                        ..CircuitBreakerSpec::default()
                    },
                    ..AxQueueSpec::default()
                },
                "failureRatio",
            ),
            (
                AxQueueSpec {
                    type_concurrency: [("resize".to_string(), -1)].into(),
                    ..AxQueueSpec::default()
                },
                "spec.typeConcurrency[resize]",
            ),
            (
                AxQueueSpec {
                    weight_schedule: vec![WeightScheduleEntry {
                        type_concurrency: [("resize".to_string(), -2)].into(),
                        ..WeightScheduleEntry::default()
                    }],
                    ..AxQueueSpec::default()
                },
                "spec.weightSchedule[0].typeConcurrency[resize]",
            ),
            (
                AxQueueSpec {
                    weight_schedule: vec![WeightScheduleEntry {
                        concurrency: Some(-1),
                        ..WeightScheduleEntry::default()
                    }],
                    ..AxQueueSpec::default()
                },
                "spec.weightSchedule[0].concurrency",
            ),
            (
                AxQueueSpec {
                    concurrency_policy: QueueConcurrencyPolicy {
                        mode: ConcurrencyMode::Adaptive,
                        min: 0,
                    },
                    ..AxQueueSpec::default()
                },
                "spec.concurrencyPolicy.min",
            ),
            (
                serde_json::from_value(serde_json::json!({"namespaceSelector": {
                    "matchExpressions": [{"key": "team", "operator": "Equals", "values": ["a"]}],
                }}))
                .expect("a spec"),
                "spec.namespaceSelector.matchExpressions[0].operator",
            ),
        ];
        for (spec, field) in cases {
            let problem = queue_config(&spec).expect_err("invalid").to_string();
            assert!(problem.contains(field), "{problem:?} should name {field}");
        }
        // All weights 0 is fine while a max-wait still lets tasks through.
        let only_max_wait = AxQueueSpec {
            weights: QueueWeights {
                critical: 0,
                high: 0,
                normal: 0,
                low: 0,
            },
            ..AxQueueSpec::default()
        };
        assert!(queue_config(&only_max_wait).is_ok());
    }

    #[test]
    fn a_window_overrides_the_limits_it_names_and_keeps_the_others() {
        let spec: AxQueueSpec = serde_json::from_value(serde_json::json!({
            "concurrency": 10,
            "typeConcurrency": {"report": 3, "resize": 4},
            "retryRatePerMinute": 60,
            "weightSchedule": [
                {"from": "09:00", "to": "17:00", "timeZone": "Europe/Berlin",
                 "concurrency": 2, "typeConcurrency": {"report": 1}},
                {"from": "22:00", "to": "06:00", "weights": {"low": 8}, "retryRatePerMinute": 5},
            ],
            "concurrencyPolicy": {"mode": "Adaptive", "min": 2},
        }))
        .expect("a spec");
        let config = queue_config(&spec).expect("valid");
        assert_eq!(config.adaptive_min, Some(2));
        // 10:00 in Berlin (summer, +02:00).
        let day: jiff::Timestamp = "2026-07-01T08:00:00Z".parse().expect("timestamp");
        let limits = config.limits_at(day);
        assert_eq!(limits.window, Some(0));
        assert_eq!(limits.concurrency, 2);
        assert_eq!(
            limits.type_concurrency,
            [("report".to_string(), 1), ("resize".to_string(), 4)].into()
        );
        assert_eq!(limits.retry_rate_per_minute, 60);
        assert_eq!(config.type_limit_in(Some(0), "resize"), Some(4));
        assert_eq!(config.type_limit_in(Some(0), "other"), None);
        // The second window keeps the queue's concurrency and weights its own.
        let night: jiff::Timestamp = "2026-07-01T23:00:00Z".parse().expect("timestamp");
        let limits = config.limits_at(night);
        assert_eq!(
            (
                limits.window,
                limits.concurrency,
                limits.retry_rate_per_minute
            ),
            (Some(1), 10, 5)
        );
        let outside: jiff::Timestamp = "2026-07-01T18:00:00Z".parse().expect("timestamp");
        assert_eq!(config.limits_at(outside).window, None);
        assert_eq!(config.limits_at(outside).concurrency, 10);
    }

    #[test]
    fn the_queue_examples_apply_or_fail_as_they_say() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("examples/") {
            let path = entry.expect("an entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if !name.starts_with("queue-") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable");
            // The queue comes first; a task that uses it may follow.
            let documents: Vec<serde_json::Value> =
                crate::yaml::documents(&text).expect("YAML documents");
            let queue: crate::api::AxQueue =
                serde_json::from_value(documents[0].clone()).expect("an AxQueue");
            let applied = queue_config(&queue.spec);
            assert_eq!(
                applied.is_ok(),
                !name.contains("invalid"),
                "{name}: {applied:?}"
            );
            seen += 1;
        }
        assert!(seen >= 3, "queue examples found: {seen}");
    }
}
