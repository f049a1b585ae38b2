//! The checks of an AxTask spec that the OpenAPI schema cannot express. A task whose spec fails them
//! is Dead with reason `InvalidSpec` before it runs anything.

use crate::api::{AxTaskSpec, ExitCodeOperator, INVALID_TEMPLATE_ANNOTATION, RetryRule};
use crate::core::worker::{MAIN_CONTAINER_ANNOTATION, PAYLOAD_ANNOTATION, main_container_name};

/// Largest payload handed to a worker (serialized JSON).
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// The API server's limit on the total size of a pod's annotations (keys and values), which carry
/// the payload to the worker's file.
pub const POD_ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// Why a spec cannot run; the message is what the task's history and `deadReason` show.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskSpecError {
    #[error("spec.type is required unless spec.templateRef names an AxTaskTemplate that gives it")]
    NoType,
    /// The exit handler's spec, inline, cannot run.
    #[error("spec.onExit: {0}")]
    InvalidExitHandler(String),
    #[error(
        "spec.timeout.softSeconds ({soft}) must be less than spec.timeout.hardSeconds ({hard})"
    )]
    SoftNotBelowHard { soft: i64, hard: i64 },
    #[error("spec.payload is {len} bytes, more than the limit of {MAX_PAYLOAD_BYTES}")]
    PayloadTooLarge { len: usize },
    #[error(
        "spec.payload ({payload} bytes) and the template's annotations ({annotations} bytes) exceed the {POD_ANNOTATIONS_MAX_BYTES}-byte limit on a pod's annotations"
    )]
    AnnotationsTooLarge { payload: usize, annotations: usize },
    /// The template did not read as a PodTemplateSpec (see `api::PodTemplate`).
    #[error("spec.template is not a pod template: {0}")]
    InvalidTemplate(String),
    #[error("spec.template.spec.containers must name at least one container")]
    NoContainer,
    #[error(
        "annotation {MAIN_CONTAINER_ANNOTATION} names container {0:?}, which the template does not have"
    )]
    UnknownMainContainer(String),
    #[error("spec.retry.backoff.factor ({0}) must be at least 1")]
    BackoffFactor(f64),
    #[error("spec.retry.rules[{0}] lists exit code 0, which is success, not a failure")]
    RuleOnSuccess(usize),
    #[error(
        "spec.retry.rules[{earlier}] ({earlier_action}) and spec.retry.rules[{later}] ({later_action}) contradict each other on exit code {code}"
    )]
    ContradictoryRules {
        earlier: usize,
        earlier_action: String,
        later: usize,
        later_action: String,
        code: i64,
    },
}

/// Semantic checks of a spec.
pub fn validate(spec: &AxTaskSpec) -> Result<(), TaskSpecError> {
    if spec.task_type.is_empty() {
        return Err(TaskSpecError::NoType);
    }
    if let Some(reason) = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(INVALID_TEMPLATE_ANNOTATION))
    {
        return Err(TaskSpecError::InvalidTemplate(reason.clone()));
    }
    if let Some(soft) = spec.timeout.soft_seconds
        && soft >= spec.timeout.hard_seconds
    {
        return Err(TaskSpecError::SoftNotBelowHard {
            soft,
            hard: spec.timeout.hard_seconds,
        });
    }
    let payload = spec.payload.as_ref().map_or(2, |p| payload_json(p).len());
    if payload > MAX_PAYLOAD_BYTES {
        return Err(TaskSpecError::PayloadTooLarge { len: payload });
    }
    let template_annotations = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref());
    let annotations: usize = template_annotations
        .iter()
        .flat_map(|a| a.iter())
        .filter(|(k, _)| k.as_str() != PAYLOAD_ANNOTATION)
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if payload + PAYLOAD_ANNOTATION.len() + annotations > POD_ANNOTATIONS_MAX_BYTES {
        return Err(TaskSpecError::AnnotationsTooLarge {
            payload,
            annotations,
        });
    }
    let containers = spec.template.containers();
    if containers.is_empty() {
        return Err(TaskSpecError::NoContainer);
    }
    if let Some(main) = main_container_name(template_annotations, containers)
        && !containers.iter().any(|c| c.name == main)
    {
        return Err(TaskSpecError::UnknownMainContainer(main.to_string()));
    }
    let b = &spec.retry.backoff;
    if !b.factor.is_finite() || b.factor < 1.0 {
        return Err(TaskSpecError::BackoffFactor(b.factor));
    }
    validate_rules(&spec.retry.rules)?;
    // A handler from a template is checked when it is resolved, as any task.
    if let Some(handler) = spec.on_exit.as_ref().filter(|h| h.template_ref.is_none())
        && !handler.template.is_absent()
        && let Err(e) = validate(&handler.task_spec())
    {
        let why = e.to_string();
        return Err(TaskSpecError::InvalidExitHandler(
            why.strip_prefix("spec.").unwrap_or(&why).to_owned(),
        ));
    }
    Ok(())
}

/// Rules that can never apply as written are a mistake: exit code 0 is success, never a failure, and
/// two `In` rules that list the same code with different actions contradict each other.
fn validate_rules(rules: &[RetryRule]) -> Result<(), TaskSpecError> {
    for (i, rule) in rules.iter().enumerate() {
        let m = &rule.on_exit_codes;
        if m.operator == ExitCodeOperator::In && m.values.contains(&0) {
            return Err(TaskSpecError::RuleOnSuccess(i));
        }
        for (j, earlier) in rules[..i].iter().enumerate() {
            let e = &earlier.on_exit_codes;
            if e.operator != ExitCodeOperator::In
                || m.operator != ExitCodeOperator::In
                || earlier.action == rule.action
            {
                continue;
            }
            if let Some(code) = m.values.iter().find(|v| e.values.contains(v)) {
                return Err(TaskSpecError::ContradictoryRules {
                    earlier: j,
                    earlier_action: format!("{:?}", earlier.action),
                    later: i,
                    later_action: format!("{:?}", rule.action),
                    code: *code,
                });
            }
        }
    }
    Ok(())
}

/// The payload as the worker sees it.
pub fn payload_json(payload: &serde_json::Value) -> String {
    serde_json::to_string(payload).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExitCodeMatch, RuleAction};
    use serde_json::json;

    fn spec() -> AxTaskSpec {
        serde_json::from_value(json!({
            "type": "report",
            "template": {"spec": {"containers": [{"name": "w", "image": "busybox"}]}}
        }))
        .expect("valid spec")
    }

    fn rule(operator: ExitCodeOperator, values: &[i64], action: RuleAction) -> RetryRule {
        RetryRule {
            on_exit_codes: ExitCodeMatch {
                operator,
                values: values.to_vec(),
            },
            action,
        }
    }

    fn error(spec: &AxTaskSpec) -> String {
        validate(spec).expect_err("invalid").to_string()
    }

    #[test]
    fn a_template_that_is_no_pod_template_reads_and_is_invalid_naming_the_field() {
        // The API server stores any object as the template; reading it must not fail.
        let malformed: AxTaskSpec = serde_json::from_value(json!({
            "type": "report",
            "template": {"spec": {"containers": [{"name": "w", "image": "i", "ports": "80"}]}}
        }))
        .expect("a malformed template still reads");
        let message = error(&malformed);
        assert!(
            message.starts_with("spec.template is not a pod template: spec.template.spec.containers[0].ports: invalid type"),
            "{message}"
        );
        assert!(validate(&spec()).is_ok());
    }

    #[test]
    fn valid_specs_pass() {
        let mut s = spec();
        assert_eq!(validate(&s), Ok(()));
        s.timeout.soft_seconds = Some(10);
        s.timeout.hard_seconds = 20;
        s.retry.rules = vec![
            rule(ExitCodeOperator::In, &[42], RuleAction::Dead),
            rule(ExitCodeOperator::NotIn, &[0, 1], RuleAction::Ignore),
            rule(ExitCodeOperator::In, &[42, 43], RuleAction::Dead),
        ];
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn soft_timeout_must_be_below_the_hard_timeout() {
        let mut s = spec();
        s.timeout.soft_seconds = Some(30);
        s.timeout.hard_seconds = 30;
        assert!(error(&s).contains("softSeconds (30) must be less than"));
    }

    #[test]
    fn payload_is_limited_to_256_kib_and_to_what_fits_in_the_annotations() {
        let mut s = spec();
        s.payload = Some(json!({"blob": "x".repeat(250 * 1024)}));
        assert_eq!(validate(&s), Ok(()), "250 KiB fits");
        s.payload = Some(json!({"blob": "x".repeat(MAX_PAYLOAD_BYTES)}));
        assert!(error(&s).contains("more than the limit of 262144"));
        s.payload = Some(json!({"blob": "x".repeat(250 * 1024)}));
        let mut template_meta = s.template.metadata.clone().unwrap_or_default();
        template_meta.annotations = Some([("big".to_string(), "y".repeat(10 * 1024))].into());
        s.template.metadata = Some(template_meta);
        assert!(error(&s).contains("limit on a pod's annotations"));
    }

    #[test]
    fn a_template_needs_a_container_and_the_main_container_must_exist() {
        let mut s = spec();
        s.template.spec.as_mut().unwrap().containers.clear();
        assert!(error(&s).contains("at least one container"));
        let mut s = spec();
        let mut meta = s.template.metadata.clone().unwrap_or_default();
        meta.annotations =
            Some([(MAIN_CONTAINER_ANNOTATION.to_string(), "nope".to_string())].into());
        s.template.metadata = Some(meta);
        assert!(error(&s).contains("\"nope\""));
    }

    #[test]
    fn contradictory_rules_and_rules_on_exit_code_zero_are_rejected() {
        let mut s = spec();
        s.retry.rules = vec![
            rule(ExitCodeOperator::In, &[1, 2], RuleAction::Retry),
            rule(ExitCodeOperator::In, &[2], RuleAction::Dead),
        ];
        assert!(error(&s).contains("contradict each other on exit code 2"));
        s.retry.rules = vec![rule(ExitCodeOperator::In, &[0], RuleAction::Dead)];
        assert!(error(&s).contains("lists exit code 0"));
    }

    #[test]
    fn backoff_factor_must_be_at_least_one() {
        let mut s = spec();
        s.retry.backoff.factor = 0.5;
        assert!(error(&s).contains("factor (0.5) must be at least 1"));
    }
}
