//! Pod statuses the simulator writes, built as plain functions of the pod and the clock, the way a
//! kubelet would report them.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::script::PodScript;

pub const HOST_IP: &str = "127.0.0.1";
/// Exit code of a container stopped by SIGKILL (128 + 9), as runtimes report it.
pub const KILLED_EXIT_CODE: i32 = 137;

/// What a kubelet keeps of a termination message: its last 4096 bytes (`tail.ReadAtMost` with
/// `MaxContainerTerminationMessageLength`), from a whole character on.
pub fn kept_message(message: &str) -> String {
    const KEPT: usize = 4096;
    let mut start = message.len().saturating_sub(KEPT);
    while !message.is_char_boundary(start) {
        start += 1;
    }
    message[start..].to_owned()
}

pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// When the pod's main container started, if the pod is already Running (written by an earlier run of
/// the simulator): its remaining run time is counted from there.
pub fn running_since(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let container_started = status
        .container_statuses
        .as_deref()
        .and_then(<[ContainerStatus]>::first)
        .and_then(|container| {
            container
                .state
                .as_ref()?
                .running
                .as_ref()?
                .started_at
                .as_ref()
        });
    container_started
        .or(status.start_time.as_ref())
        .map(|time| time.0)
}

/// Whether every container (init and regular) of the pod already reports a terminated state.
pub fn all_containers_terminated(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let statuses = pod.status.as_ref();
    let terminated = |containers: &[Container], reported: Option<&Vec<ContainerStatus>>| {
        containers.iter().all(|container| {
            reported
                .and_then(|reported| reported.iter().find(|status| status.name == container.name))
                .and_then(|status| status.state.as_ref()?.terminated.as_ref())
                .is_some()
        })
    };
    terminated(
        spec.init_containers.as_deref().unwrap_or_default(),
        statuses.and_then(|status| status.init_container_statuses.as_ref()),
    ) && terminated(
        &spec.containers,
        statuses.and_then(|status| status.container_statuses.as_ref()),
    )
}

/// Status of a pod whose containers all run since `started_at` (init containers have completed).
pub fn running(pod: &Pod, started_at: Timestamp) -> PodStatus {
    let containers = containers(pod)
        .iter()
        .map(|container| ContainerStatus {
            ready: true,
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(started_at)),
                }),
                ..ContainerState::default()
            }),
            ..container_status(pod, container)
        })
        .collect();
    PodStatus {
        phase: Some("Running".into()),
        conditions: Some(conditions(pod, started_at, true)),
        container_statuses: Some(containers),
        ..base(pod, started_at)
    }
}

/// Status of a pod whose main (first) container exited as the script says; other containers exit 0.
pub fn terminated(
    pod: &Pod,
    script: &PodScript,
    started_at: Timestamp,
    finished_at: Timestamp,
) -> PodStatus {
    let containers: Vec<ContainerStatus> = containers(pod)
        .iter()
        .enumerate()
        .map(|(index, container)| {
            let (exit_code, message) = if index == 0 {
                (
                    script.exit_code,
                    Some(kept_message(&script.message)).filter(|message| !message.is_empty()),
                )
            } else {
                (0, None)
            };
            ContainerStatus {
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code,
                        reason: Some(if exit_code == 0 { "Completed" } else { "Error" }.into()),
                        message,
                        started_at: Some(Time(started_at)),
                        finished_at: Some(Time(finished_at)),
                        container_id: Some(container_id(pod, &container.name)),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..container_status(pod, container)
            }
        })
        .collect();
    let failed = script.exit_code != 0;
    PodStatus {
        phase: Some(if failed { "Failed" } else { "Succeeded" }.into()),
        conditions: Some(conditions(pod, finished_at, false)),
        container_statuses: Some(containers),
        ..base(pod, started_at)
    }
}

/// Status of a pod stopped by deletion: containers not yet terminated are killed at `now`.
pub fn killed(pod: &Pod, now: Timestamp) -> PodStatus {
    let reported = pod.status.as_ref();
    let kill_all = |containers: &[Container],
                    reported: Option<&Vec<ContainerStatus>>|
     -> Vec<ContainerStatus> {
        containers
            .iter()
            .map(|container| {
                let previous = reported.and_then(|reported| {
                    reported.iter().find(|status| status.name == container.name)
                });
                let previous_state = previous.and_then(|status| status.state.as_ref());
                if previous_state.is_some_and(|state| state.terminated.is_some()) {
                    return previous
                        .cloned()
                        .unwrap_or_else(|| container_status(pod, container));
                }
                let started_at = previous_state
                    .and_then(|state| state.running.as_ref())
                    .and_then(|running| running.started_at.clone());
                ContainerStatus {
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: KILLED_EXIT_CODE,
                            reason: Some("Killed".into()),
                            started_at,
                            finished_at: Some(Time(now)),
                            container_id: Some(container_id(pod, &container.name)),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..container_status(pod, container)
                }
            })
            .collect()
    };
    let spec = pod.spec.as_ref();
    let init_containers = kill_all(
        spec.and_then(|spec| spec.init_containers.as_deref())
            .unwrap_or_default(),
        reported.and_then(|status| status.init_container_statuses.as_ref()),
    );
    let containers = kill_all(
        containers(pod),
        reported.and_then(|status| status.container_statuses.as_ref()),
    );
    let failed = init_containers.iter().chain(&containers).any(|status| {
        status
            .state
            .as_ref()
            .and_then(|state| state.terminated.as_ref())
            .is_some_and(|terminated| terminated.exit_code != 0)
    });
    let started_at = reported
        .and_then(|status| status.start_time.as_ref())
        .map_or(now, |time| time.0);
    PodStatus {
        phase: Some(if failed { "Failed" } else { "Succeeded" }.into()),
        conditions: Some(conditions(pod, now, false)),
        init_container_statuses: (!init_containers.is_empty()).then_some(init_containers),
        container_statuses: Some(containers),
        ..base(pod, started_at)
    }
}

/// Fields every status the simulator writes shares: addresses, start time, completed init containers.
fn base(pod: &Pod, started_at: Timestamp) -> PodStatus {
    let pod_ip = pod_ip(pod);
    let init_containers: Vec<ContainerStatus> = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|container| ContainerStatus {
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 0,
                    reason: Some("Completed".into()),
                    started_at: Some(Time(started_at)),
                    finished_at: Some(Time(started_at)),
                    container_id: Some(container_id(pod, &container.name)),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..container_status(pod, container)
        })
        .collect();
    PodStatus {
        host_ip: Some(HOST_IP.into()),
        host_ips: Some(vec![HostIP { ip: HOST_IP.into() }]),
        pod_ip: Some(pod_ip.clone()),
        pod_ips: Some(vec![PodIP { ip: pod_ip }]),
        start_time: Some(Time(started_at)),
        qos_class: pod
            .status
            .as_ref()
            .and_then(|status| status.qos_class.clone()),
        init_container_statuses: (!init_containers.is_empty()).then_some(init_containers),
        ..PodStatus::default()
    }
}

fn containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|spec| spec.containers.as_slice())
        .unwrap_or_default()
}

/// The identity fields of a container's status, not yet running or terminated.
fn container_status(pod: &Pod, container: &Container) -> ContainerStatus {
    let image = container.image.clone().unwrap_or_default();
    ContainerStatus {
        name: container.name.clone(),
        image_id: format!("sha256:{}", hex_digest(&[image.as_bytes()])),
        image,
        container_id: Some(container_id(pod, &container.name)),
        ready: false,
        started: Some(false),
        restart_count: 0,
        ..ContainerStatus::default()
    }
}

fn conditions(pod: &Pod, changed_at: Timestamp, ready: bool) -> Vec<PodCondition> {
    let condition = |type_: &str, ok: bool| PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: (!ok).then(|| "PodCompleted".into()),
        last_transition_time: Some(Time(changed_at)),
        ..PodCondition::default()
    };
    // Keep the scheduler's own PodScheduled condition (its time says when the pod was bound).
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_deref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|condition| condition.type_ == "PodScheduled")
        })
        .filter(|condition| condition.status == "True")
        .cloned()
        .unwrap_or_else(|| condition("PodScheduled", true));
    vec![
        condition("Initialized", true),
        condition("Ready", ready),
        condition("ContainersReady", ready),
        scheduled,
    ]
}

/// A stable pod IP in 10.250.0.0/16 derived from the pod's UID, so rewrites report the same address.
pub fn pod_ip(pod: &Pod) -> String {
    let hash = fnv1a(
        0,
        pod.metadata.uid.as_deref().unwrap_or_default().as_bytes(),
    );
    let third = (hash >> 8) as u8;
    let fourth = (hash % 254) as u8 + 1;
    format!("10.250.{third}.{fourth}")
}

fn container_id(pod: &Pod, container: &str) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    format!(
        "containerd://{}",
        hex_digest(&[uid.as_bytes(), b"/", container.as_bytes()])
    )
}

/// 64 hex digits (the shape of a sha256), from four seeded FNV-1a hashes: an id, not a security hash.
fn hex_digest(parts: &[&[u8]]) -> String {
    (0..4u64)
        .map(|seed| {
            let hash = parts
                .iter()
                .fold(fnv1a(seed, &[]), |hash, part| fnv1a_continue(hash, part));
            format!("{hash:016x}")
        })
        .collect()
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    fnv1a_continue(FNV_OFFSET ^ seed.wrapping_mul(FNV_PRIME), bytes)
}

fn fnv1a_continue(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::RunLength;
    use serde_json::json;
    use std::time::Duration;

    fn ts(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("valid timestamp")
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "8d3c-uid"},
            "spec": {
                "nodeName": "ax-sim-0",
                "initContainers": [{"name": "init", "image": "img:init"}],
                "containers": [{"name": "main", "image": "img:1"}, {"name": "side", "image": "img:2"}]
            },
            "status": {
                "phase": "Pending",
                "qosClass": "BestEffort",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T08:00:00Z"}]
            }
        }))
        .expect("valid pod")
    }

    fn with_status(mut pod: Pod, status: PodStatus) -> Pod {
        pod.status = Some(status);
        pod
    }

    fn condition<'a>(status: &'a PodStatus, type_: &str) -> &'a PodCondition {
        status
            .conditions
            .as_deref()
            .and_then(|conditions| conditions.iter().find(|condition| condition.type_ == type_))
            .expect("condition present")
    }

    #[test]
    fn a_long_message_keeps_its_last_4096_bytes_like_a_kubelet() {
        assert_eq!(kept_message("boom"), "boom");
        let long = format!("{}{}", "a".repeat(10), "b".repeat(4096));
        assert_eq!(kept_message(&long), "b".repeat(4096));
        let wide = format!("é{}", "b".repeat(4095));
        assert_eq!(kept_message(&wide), "b".repeat(4095));
    }

    fn script(exit_code: i32, message: &str) -> PodScript {
        PodScript {
            start_delay: Duration::ZERO,
            run: RunLength::For(Duration::from_secs(1)),
            exit_code,
            message: message.into(),
            ignores_sigterm: false,
        }
    }

    #[test]
    fn running_reports_every_container_running_and_ready() {
        let status = running(&pod(), ts(0));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.host_ip.as_deref(), Some(HOST_IP));
        assert_eq!(status.start_time, Some(Time(ts(0))));
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        let containers = status
            .container_statuses
            .as_deref()
            .expect("container statuses");
        assert_eq!(containers.len(), 2);
        for container in containers {
            assert!(container.ready);
            assert_eq!(container.restart_count, 0);
            let running = container
                .state
                .as_ref()
                .and_then(|state| state.running.as_ref());
            assert_eq!(
                running.and_then(|running| running.started_at.clone()),
                Some(Time(ts(0)))
            );
            assert!(
                container
                    .container_id
                    .as_deref()
                    .is_some_and(|id| id.len() == "containerd://".len() + 64)
            );
        }
        for type_ in ["Initialized", "Ready", "ContainersReady", "PodScheduled"] {
            assert_eq!(condition(&status, type_).status, "True", "{type_}");
        }
        assert_eq!(
            condition(&status, "PodScheduled").last_transition_time,
            Some(Time("2027-01-15T08:00:00Z".parse().expect("time")))
        );
        let init = status
            .init_container_statuses
            .as_deref()
            .expect("init statuses");
        assert_eq!(
            init[0]
                .state
                .as_ref()
                .and_then(|state| state.terminated.as_ref())
                .map(|t| t.exit_code),
            Some(0)
        );
    }

    #[test]
    fn terminated_reports_the_script_exit_on_the_main_container() {
        let status = terminated(&pod(), &script(42, "boom"), ts(0), ts(5));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(condition(&status, "Ready").status, "False");
        let containers = status
            .container_statuses
            .as_deref()
            .expect("container statuses");
        let main = containers[0]
            .state
            .as_ref()
            .and_then(|state| state.terminated.as_ref())
            .expect("terminated");
        assert_eq!(main.exit_code, 42);
        assert_eq!(main.reason.as_deref(), Some("Error"));
        assert_eq!(main.message.as_deref(), Some("boom"));
        assert_eq!(main.started_at, Some(Time(ts(0))));
        assert_eq!(main.finished_at, Some(Time(ts(5))));
        let side = containers[1]
            .state
            .as_ref()
            .and_then(|state| state.terminated.as_ref())
            .expect("terminated");
        assert_eq!(side.exit_code, 0);
        assert!(!containers[0].ready);

        let status = terminated(&pod(), &script(0, ""), ts(0), ts(5));
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        let main = status.container_statuses.as_deref().expect("statuses")[0]
            .state
            .clone()
            .expect("state");
        let main = main.terminated.expect("terminated");
        assert_eq!(main.reason.as_deref(), Some("Completed"));
        assert_eq!(main.message, None);
    }

    #[test]
    fn killed_keeps_containers_that_already_exited() {
        let mut status = running(&pod(), ts(0));
        let finished = terminated(&pod(), &script(0, ""), ts(0), ts(3));
        // Main container exited 0, the sidecar is still running.
        if let (Some(containers), Some(done)) = (
            status.container_statuses.as_mut(),
            finished.container_statuses,
        ) {
            containers[0] = done[0].clone();
        }
        let pod = with_status(pod(), status);
        assert!(!all_containers_terminated(&pod));
        let status = killed(&pod, ts(9));
        let containers = status.container_statuses.as_deref().expect("statuses");
        let main = containers[0]
            .state
            .as_ref()
            .and_then(|state| state.terminated.as_ref())
            .expect("terminated");
        assert_eq!(
            (main.exit_code, main.finished_at.clone()),
            (0, Some(Time(ts(3))))
        );
        let side = containers[1]
            .state
            .as_ref()
            .and_then(|state| state.terminated.as_ref())
            .expect("terminated");
        assert_eq!(side.exit_code, KILLED_EXIT_CODE);
        assert_eq!(side.reason.as_deref(), Some("Killed"));
        assert_eq!(side.started_at, Some(Time(ts(0))));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.start_time, Some(Time(ts(0))));
        assert!(all_containers_terminated(&with_status(pod.clone(), status)));
    }

    #[test]
    fn killed_handles_a_pod_that_never_started() {
        let status = killed(&pod(), ts(1));
        let containers = status.container_statuses.as_deref().expect("statuses");
        assert!(containers.iter().all(|container| {
            container
                .state
                .as_ref()
                .and_then(|state| state.terminated.as_ref())
                .map(|t| t.exit_code)
                == Some(KILLED_EXIT_CODE)
        }));
        let bare: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("valid pod");
        assert_eq!(killed(&bare, ts(1)).container_statuses, Some(vec![]));
        assert!(all_containers_terminated(&bare));
    }

    #[test]
    fn running_since_prefers_the_container_start() {
        assert_eq!(running_since(&pod()), None);
        let pod = with_status(pod(), running(&pod(), ts(7)));
        assert_eq!(running_since(&pod), Some(ts(7)));
        assert!(!is_terminal(&pod));
        let done = with_status(pod.clone(), terminated(&pod, &script(1, ""), ts(7), ts(8)));
        assert_eq!(running_since(&done), None);
        assert!(is_terminal(&done));
    }

    #[test]
    fn addresses_and_ids_are_stable_per_pod() {
        assert_eq!(pod_ip(&pod()), pod_ip(&pod()));
        let mut other = pod();
        other.metadata.uid = Some("another-uid".into());
        assert_ne!(container_id(&pod(), "main"), container_id(&other, "main"));
        assert_ne!(container_id(&pod(), "main"), container_id(&pod(), "side"));
        let ip: std::net::Ipv4Addr = pod_ip(&other).parse().expect("an IPv4 address");
        assert_eq!(ip.octets()[..2], [10, 250]);
        assert_ne!(ip.octets()[3], 0);
    }
}
