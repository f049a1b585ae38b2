//! An AxQueue spec as the dispatcher applies it, and the checks the OpenAPI schema cannot make
//! (time zones, wall-clock times, a queue that could never dispatch). A spec that fails them is not
//! applied; the previous configuration stays in force.

use std::collections::BTreeMap;

use jiff::SignedDuration;

use super::breaker::BreakerConfig;
use super::weights::{WeightWindow, Weights};
use crate::api::{AxQueueSpec, Priority, QueueWeights};

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
        let window_weights = weights_of(&entry.weights, &format!("{field}.weights"))?;
        let window = WeightWindow::parse(&entry.from, &entry.to, &entry.time_zone, window_weights)
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
            weight_schedule
                .iter()
                .enumerate()
                .map(|(i, w)| (format!("spec.weightSchedule[{i}].weights"), w.weights())),
        );
        for (field, w) in stalled {
            if Priority::ALL.iter().all(|priority| w.of(*priority) == 0) {
                return Err(QueueSpecError::NothingDispatched(field));
            }
        }
    }
    Ok(QueueConfig {
        weights,
        max_wait,
        concurrency,
        type_concurrency,
        retry_rate_per_minute,
        circuit_breaker,
        weight_schedule,
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
    use crate::api::{CircuitBreakerSpec, MaxWaitSeconds, WeightScheduleEntry};

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
            weights: QueueWeights::default(),
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
}
