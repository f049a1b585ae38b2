//! What a pod asks the simulator to do, read from the literal env values of its first container.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

pub const START_MS_ENV: &str = "AX_SIM_START_MS";
pub const DURATION_MS_ENV: &str = "AX_SIM_DURATION_MS";
pub const EXIT_CODE_ENV: &str = "AX_SIM_EXIT_CODE";
pub const MESSAGE_ENV: &str = "AX_SIM_MESSAGE";
pub const HANG_ENV: &str = "AX_SIM_HANG";
pub const IGNORE_SIGTERM_ENV: &str = "AX_SIM_IGNORE_SIGTERM";
/// Comma-separated item indexes (an AxDag `forEach` child's `AX_ITEM_INDEX`) that exit with
/// `AX_SIM_EXIT_CODE`; the other items exit 0. Absent: every pod exits with `AX_SIM_EXIT_CODE`.
pub const FAILING_ITEMS_ENV: &str = "AX_SIM_FAILING_ITEMS";
/// The variable a `forEach` child's worker gets its item's index in (set by ax).
pub const ITEM_INDEX_ENV: &str = "AX_ITEM_INDEX";

const DEFAULT_START: Duration = Duration::from_millis(50);
const DEFAULT_DURATION: Duration = Duration::from_millis(100);

/// How long the pod stays Running once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    For(Duration),
    /// Never terminates on its own: `AX_SIM_HANG`, or a restart policy under which a real kubelet
    /// would restart the exited container (restarts are not simulated, the pod just stays Running).
    Forever,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodScript {
    pub start_delay: Duration,
    pub run: RunLength,
    pub exit_code: i32,
    pub message: String,
    /// `AX_SIM_IGNORE_SIGTERM=true`: a deleted pod keeps running for its whole grace period, as a
    /// worker that ignores SIGTERM does on a real kubelet.
    pub ignores_sigterm: bool,
}

/// A script and the env values that were ignored because they did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedScript {
    pub script: PodScript,
    pub ignored: Vec<String>,
}

impl PodScript {
    pub fn from_pod(pod: &Pod) -> ParsedScript {
        let mut ignored = Vec::new();
        let spec = pod.spec.as_ref();
        let env = spec
            .and_then(|spec| spec.containers.first())
            .and_then(|container| container.env.as_deref())
            .unwrap_or_default();
        let literal = |name: &str| {
            env.iter()
                .find(|var| var.name == name)
                .and_then(|var| var.value.as_deref())
                .map(str::trim)
        };
        let mut millis = |name: &str, default: Duration| match literal(name) {
            None => default,
            Some(raw) => match raw.parse::<u64>() {
                Ok(ms) => Duration::from_millis(ms),
                Err(_) => {
                    ignored.push(format!("{name}={raw:?}"));
                    default
                }
            },
        };
        let start_delay = millis(START_MS_ENV, DEFAULT_START);
        let duration = millis(DURATION_MS_ENV, DEFAULT_DURATION);
        let exit_code = match literal(EXIT_CODE_ENV) {
            None => 0,
            Some(raw) => raw.parse::<i32>().unwrap_or_else(|_| {
                ignored.push(format!("{EXIT_CODE_ENV}={raw:?}"));
                0
            }),
        };
        let exit_code = match literal(FAILING_ITEMS_ENV) {
            None => exit_code,
            Some(list) => {
                let index = literal(ITEM_INDEX_ENV).unwrap_or_default();
                let fails = list.split(',').any(|i| i.trim() == index);
                if fails { exit_code } else { 0 }
            }
        };
        // The message is kept verbatim (not trimmed), like a termination-log file.
        let message = env
            .iter()
            .find(|var| var.name == MESSAGE_ENV)
            .and_then(|var| var.value.clone())
            .unwrap_or_default();
        let hang = literal(HANG_ENV).is_some_and(|raw| raw.eq_ignore_ascii_case("true"));
        let ignores_sigterm =
            literal(IGNORE_SIGTERM_ENV).is_some_and(|raw| raw.eq_ignore_ascii_case("true"));
        let restarts_on_exit = match spec.and_then(|spec| spec.restart_policy.as_deref()) {
            Some("Never") => false,
            Some("OnFailure") => exit_code != 0,
            // The API server defaults an absent restartPolicy to Always.
            _ => true,
        };
        let run = if hang || restarts_on_exit {
            RunLength::Forever
        } else {
            RunLength::For(duration)
        };
        ParsedScript {
            script: PodScript {
                start_delay,
                run,
                exit_code,
                message,
                ignores_sigterm,
            },
            ignored,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(restart_policy: &str, env: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "restartPolicy": restart_policy,
                "containers": [{"name": "main", "image": "img", "env": env}, {"name": "side", "image": "img"}]
            }
        }))
        .expect("valid pod")
    }

    #[test]
    fn only_the_failing_items_exit_with_the_exit_code() {
        let exit = |index: &str| {
            let env = json!([
                {"name": "AX_ITEM_INDEX", "value": index},
                {"name": "AX_SIM_EXIT_CODE", "value": "3"},
                {"name": "AX_SIM_FAILING_ITEMS", "value": "1, 4"},
            ]);
            PodScript::from_pod(&pod("Never", env)).script.exit_code
        };
        assert_eq!((exit("0"), exit("1"), exit("4"), exit("14")), (0, 3, 3, 0));
    }

    #[test]
    fn defaults_when_env_is_absent() {
        let parsed = PodScript::from_pod(&pod("Never", json!([])));
        assert_eq!(
            parsed.script,
            PodScript {
                start_delay: Duration::from_millis(50),
                run: RunLength::For(Duration::from_millis(100)),
                exit_code: 0,
                message: String::new(),
                ignores_sigterm: false,
            }
        );
        assert!(parsed.ignored.is_empty());
    }

    #[test]
    fn reads_every_variable() {
        let parsed = PodScript::from_pod(&pod(
            "Never",
            json!([
                {"name": "AX_SIM_START_MS", "value": "7"},
                {"name": "AX_SIM_DURATION_MS", "value": " 300 "},
                {"name": "AX_SIM_EXIT_CODE", "value": "42"},
                {"name": "AX_SIM_MESSAGE", "value": " {\"error\":\"biz\"} "},
            ]),
        ));
        assert_eq!(parsed.script.start_delay, Duration::from_millis(7));
        assert_eq!(
            parsed.script.run,
            RunLength::For(Duration::from_millis(300))
        );
        assert_eq!(parsed.script.exit_code, 42);
        assert_eq!(parsed.script.message, " {\"error\":\"biz\"} ");
    }

    #[test]
    fn hang_runs_forever() {
        let parsed = PodScript::from_pod(&pod(
            "Never",
            json!([{"name": "AX_SIM_HANG", "value": "TRUE"}]),
        ));
        assert_eq!(parsed.script.run, RunLength::Forever);
        let parsed = PodScript::from_pod(&pod(
            "Never",
            json!([{"name": "AX_SIM_HANG", "value": "no"}]),
        ));
        assert_ne!(parsed.script.run, RunLength::Forever);
    }

    #[test]
    fn bad_values_fall_back_to_defaults_and_are_reported() {
        let parsed = PodScript::from_pod(&pod(
            "Never",
            json!([
                {"name": "AX_SIM_START_MS", "value": "-1"},
                {"name": "AX_SIM_EXIT_CODE", "value": "x"},
                {"name": "AX_SIM_DURATION_MS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ]),
        ));
        assert_eq!(parsed.script.start_delay, Duration::from_millis(50));
        assert_eq!(parsed.script.exit_code, 0);
        assert_eq!(
            parsed.script.run,
            RunLength::For(Duration::from_millis(100))
        );
        assert_eq!(parsed.ignored.len(), 2);
    }

    #[test]
    fn restart_policy_decides_whether_an_exit_is_final() {
        let failing = json!([{"name": "AX_SIM_EXIT_CODE", "value": "1"}]);
        assert_eq!(
            PodScript::from_pod(&pod("Always", json!([]))).script.run,
            RunLength::Forever
        );
        assert_eq!(
            PodScript::from_pod(&pod("OnFailure", failing.clone()))
                .script
                .run,
            RunLength::Forever
        );
        assert!(matches!(
            PodScript::from_pod(&pod("OnFailure", json!([]))).script.run,
            RunLength::For(_)
        ));
        assert!(matches!(
            PodScript::from_pod(&pod("Never", failing)).script.run,
            RunLength::For(_)
        ));
    }

    #[test]
    fn pod_without_spec_gets_defaults() {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("valid pod");
        let parsed = PodScript::from_pod(&pod);
        assert_eq!(parsed.script.exit_code, 0);
        assert_eq!(parsed.script.run, RunLength::Forever);
    }
}
