//! The status an AxQueue shows, assembled from what its registry entry reports.

use jiff::Timestamp;

use super::breaker::BreakerState;
use super::registry::QueueReport;
use crate::api::{
    ActiveWindow, AxQueueStatus, CircuitStatus, ConcurrencyChange, PendingCounts, Priority,
    QueueKeyStatus, QueueLimits,
};
use crate::core::conditions::{self, INVALID_SPEC, reason};

/// The status a queue should show: the report's counts, the limits in force and the window that
/// set them, the effective concurrency and its last adaptive change, and the `InvalidSpec`
/// condition, whose transition time moves only when its value does.
pub fn queue_status(report: &QueueReport, before: &AxQueueStatus, now: Timestamp) -> AxQueueStatus {
    let count = |priority: Priority| {
        report
            .pending
            .iter()
            .find(|(p, _)| *p == priority)
            .map_or(0, |(_, n)| i64::try_from(*n).unwrap_or(i64::MAX))
    };
    let (invalid, reason, message) = match &report.invalid {
        Some(problem) => (
            true,
            reason::INVALID_SPEC,
            format!("{problem}; the previous configuration stays in force"),
        ),
        None => (false, reason::VALID, String::new()),
    };
    // Other types are kept as they are: the queue's status has one condition of its own.
    let mut conditions = before.conditions.clone();
    conditions::set(
        &mut conditions,
        INVALID_SPEC,
        invalid,
        reason,
        &message,
        report.generation,
        now,
    );
    AxQueueStatus {
        pending: PendingCounts {
            critical: count(Priority::Critical),
            high: count(Priority::High),
            normal: count(Priority::Normal),
            low: count(Priority::Low),
        },
        running: i64::try_from(report.running).unwrap_or(i64::MAX),
        open_circuit_count: i64::try_from(report.open_circuits.len()).unwrap_or(i64::MAX),
        open_circuits: report.open_circuits.clone(),
        circuits: report
            .circuits
            .iter()
            .map(|circuit| CircuitStatus {
                namespace: circuit.namespace.clone(),
                task_type: circuit.task_type.clone(),
                state: match circuit.state {
                    BreakerState::HalfOpen { .. } => "HalfOpen".into(),
                    _ => "Open".into(),
                },
                reopens_at: match circuit.state {
                    BreakerState::Open { until } => Some(until),
                    _ => None,
                },
            })
            .collect(),
        dispatched: report.dispatched,
        dead: report.dead,
        forbidden: i64::try_from(report.forbidden).unwrap_or(i64::MAX),
        retry_tokens: i64::from(report.retry_tokens),
        conditions,
        observed_generation: report.generation,
        limits: Some(QueueLimits {
            concurrency: i64::from(report.limits.concurrency),
            type_concurrency: report
                .limits
                .type_concurrency
                .iter()
                .map(|(t, n)| (t.clone(), i64::from(*n)))
                .collect(),
            retry_rate_per_minute: i64::from(report.limits.retry_rate_per_minute),
        }),
        active_window: report
            .window
            .as_ref()
            .map(|(index, from, to, zone)| ActiveWindow {
                index: i64::try_from(*index).unwrap_or(i64::MAX),
                from: from.clone(),
                to: to.clone(),
                time_zone: zone.clone(),
            }),
        effective_concurrency: Some(i64::from(report.effective_concurrency)),
        keys: report
            .keys
            .iter()
            .map(|k| QueueKeyStatus {
                key: k.key.clone(),
                running: i64::try_from(k.running).unwrap_or(i64::MAX),
                waiting: i64::try_from(k.waiting).unwrap_or(i64::MAX),
            })
            .collect(),
        last_concurrency_change: report.last_change.as_ref().map(|(time, change)| {
            ConcurrencyChange {
                time: *time,
                from: i64::from(change.from),
                to: i64::from(change.to),
                reason: change.reason.as_str().to_string(),
                message: change.message.clone(),
            }
        }),
    }
}
