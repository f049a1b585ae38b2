//! Failure classification (DESIGN §3), in order: the first matching `retry.rules` entry; a JSON
//! termination message (`biz` never retried, `sys` retried); a disruption (eviction, node loss:
//! Infrastructure, retried without counting); a container that cannot start (image pull, missing
//! Secret or ConfigMap: Infrastructure; an image that may never be pulled or an invalid image name:
//! NonRetryable); any other non-zero exit (Retryable).

use super::reason::Reason;
use crate::api::{ExitCodeOperator, Failure, FailureKind, RetryRule, RuleAction};
use crate::core::worker::WorkerState;

pub fn classify(rules: &[RetryRule], w: &WorkerState, attempt: i32) -> Failure {
    let exit_code = w.exit.as_ref().map(|e| e.exit_code).filter(|c| *c != 0);
    let failure = |kind, reason: Reason, message: String| Failure {
        attempt,
        kind,
        exit_code,
        reason: reason.as_str().into(),
        message,
    };
    if let Some(code) = exit_code
        && let Some((i, rule)) = rules
            .iter()
            .enumerate()
            .find(|(_, r)| rule_matches(r, code))
    {
        let kind = match rule.action {
            RuleAction::Retry => FailureKind::Retryable,
            RuleAction::Dead => FailureKind::NonRetryable,
            RuleAction::Ignore => FailureKind::Infrastructure,
        };
        return failure(
            kind,
            Reason::ExitCodeRule,
            format!(
                "exit code {code} matched spec.retry.rules[{i}] ({:?})",
                rule.action
            ),
        );
    }
    let message = w
        .exit
        .as_ref()
        .map(|e| e.message.trim())
        .unwrap_or_default();
    if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(message) {
        let why = m
            .get("reason")
            .and_then(|r| r.as_str())
            .unwrap_or_default()
            .to_string();
        match m.get("error").and_then(|e| e.as_str()) {
            Some("biz") => return failure(FailureKind::NonRetryable, Reason::BusinessError, why),
            Some("sys") => return failure(FailureKind::Retryable, Reason::SystemError, why),
            _ => {}
        }
    }
    if let Some((pod_reason, message)) = &w.disrupted {
        let reason = Reason::of_disruption(pod_reason).unwrap_or(Reason::DisruptionTarget);
        let message = if message.is_empty() {
            pod_reason.clone()
        } else {
            format!("{pod_reason}: {message}")
        };
        return failure(FailureKind::Infrastructure, reason, message);
    }
    if let Some((waiting, message)) = &w.stuck_reason
        && let Some(reason) = Reason::of_stuck_container(waiting)
    {
        let kind = if reason.stuck_is_transient() {
            FailureKind::Infrastructure
        } else {
            FailureKind::NonRetryable
        };
        return failure(kind, reason, message.clone());
    }
    match &w.exit {
        Some(e) if e.exit_code != 0 => {
            let detail = if e.message.is_empty() {
                e.reason.clone()
            } else {
                format!("{}: {}", e.reason, e.message)
            };
            failure(
                FailureKind::Retryable,
                Reason::ExitCode,
                format!("exit code {} ({detail})", e.exit_code),
            )
        }
        _ => failure(
            FailureKind::Retryable,
            Reason::PodFailed,
            "worker pod failed without an exit code".into(),
        ),
    }
}

fn rule_matches(rule: &RetryRule, code: i32) -> bool {
    let listed = rule.on_exit_codes.values.contains(&i64::from(code));
    match rule.on_exit_codes.operator {
        ExitCodeOperator::In => listed,
        ExitCodeOperator::NotIn => !listed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ExitCodeMatch;
    use crate::core::worker::{ContainerExit, PodPhase};

    fn rule(operator: ExitCodeOperator, values: &[i64], action: RuleAction) -> RetryRule {
        RetryRule {
            on_exit_codes: ExitCodeMatch {
                operator,
                values: values.to_vec(),
            },
            action,
        }
    }

    fn failed(code: i32, message: &str) -> WorkerState {
        WorkerState {
            phase: PodPhase::Failed,
            exit: Some(ContainerExit {
                exit_code: code,
                reason: "Error".into(),
                message: message.into(),
            }),
            ..WorkerState::default()
        }
    }

    fn kind_and_reason(f: &Failure) -> (FailureKind, &str) {
        (f.kind, f.reason.as_str())
    }

    #[test]
    fn rules_come_first_in_order_then_the_termination_message() {
        let rules = [
            rule(ExitCodeOperator::In, &[42], RuleAction::Dead),
            rule(ExitCodeOperator::NotIn, &[1], RuleAction::Ignore),
        ];
        let biz = r#"{"error":"biz"}"#;
        assert_eq!(
            kind_and_reason(&classify(&rules, &failed(42, biz), 1)),
            (FailureKind::NonRetryable, "ExitCodeRule")
        );
        assert_eq!(
            kind_and_reason(&classify(&rules, &failed(7, ""), 1)),
            (FailureKind::Infrastructure, "ExitCodeRule")
        );
        assert_eq!(
            kind_and_reason(&classify(&rules, &failed(1, biz), 1)),
            (FailureKind::NonRetryable, "BusinessError")
        );
        assert_eq!(
            kind_and_reason(&classify(
                &[],
                &failed(1, r#" {"error":"sys","reason":"db"} "#),
                1
            )),
            (FailureKind::Retryable, "SystemError")
        );
    }

    #[test]
    fn disruption_comes_before_a_stuck_container_and_the_exit_code() {
        let mut w = failed(137, "");
        w.disrupted = Some(("Evicted".into(), "low on memory".into()));
        w.stuck_reason = Some(("ErrImageNeverPull".into(), String::new()));
        let f = classify(&[], &w, 2);
        assert_eq!(
            kind_and_reason(&f),
            (FailureKind::Infrastructure, "Evicted")
        );
        assert_eq!((f.attempt, f.exit_code), (2, Some(137)));
        w.disrupted = Some(("PreemptionByScheduler".into(), String::new()));
        assert_eq!(classify(&[], &w, 2).reason, "DisruptionTarget");
    }

    #[test]
    fn image_and_config_errors_are_transient_unless_they_need_a_spec_change() {
        for (waiting, kind) in [
            ("ErrImagePull", FailureKind::Infrastructure),
            ("ImagePullBackOff", FailureKind::Infrastructure),
            ("CreateContainerConfigError", FailureKind::Infrastructure),
            ("ErrImageNeverPull", FailureKind::NonRetryable),
            ("InvalidImageName", FailureKind::NonRetryable),
        ] {
            let w = WorkerState {
                stuck_reason: Some((waiting.into(), "why".into())),
                ..WorkerState::default()
            };
            assert_eq!(kind_and_reason(&classify(&[], &w, 1)), (kind, waiting));
        }
    }

    #[test]
    fn other_exits_are_retryable_and_a_failure_without_exit_says_so() {
        let f = classify(&[], &failed(3, "disk full"), 1);
        assert_eq!(kind_and_reason(&f), (FailureKind::Retryable, "ExitCode"));
        assert!(
            f.message.contains("exit code 3 (Error: disk full)"),
            "{}",
            f.message
        );
        let f = classify(&[], &WorkerState::default(), 1);
        assert_eq!(kind_and_reason(&f), (FailureKind::Retryable, "PodFailed"));
        assert_eq!(f.exit_code, None);
    }

    #[test]
    fn rules_never_apply_without_a_failing_exit_code() {
        let rules = [rule(ExitCodeOperator::NotIn, &[5], RuleAction::Dead)];
        let mut w = failed(0, "");
        w.disrupted = Some(("Evicted".into(), String::new()));
        assert_eq!(classify(&rules, &w, 1).reason, "Evicted");
    }
}
