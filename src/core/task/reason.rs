//! The reasons a task's history, `status.reason`, `lastFailure.reason`, its conditions and its Events
//! give: one vocabulary, CamelCase, as users read them in `kubectl get axt -o wide`.

/// Why a transition (or a failure) happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    // Admission and dispatch.
    /// Created, or re-queued after `startAfter`: waits for dispatch.
    Queued,
    /// Created with a future `startAfter`.
    Delayed,
    /// The spec cannot run (validation, or the API server rejected the worker pod as invalid).
    InvalidSpec,
    /// `spec.cancel` was set.
    Canceled,
    /// A re-run request (`spec.rerun`) started a finished task again.
    Rerun,
    /// The dispatcher gave the task a slot: a new attempt starts.
    Dispatched,
    /// The API server refused to create the worker pod (quota, LimitRange, admission webhook).
    PodForbidden,
    /// The API server rejected the worker pod as invalid (422/400).
    PodRejected,

    // The worker.
    WorkerRunning,
    /// The main container exited 0.
    Completed,
    /// The main container exited 0 after the attempt had timed out, before any next attempt.
    CompletedAfterTimeout,
    /// The main container exited 0 with an output over the limit (`core::output`): the task
    /// succeeded, and its output is not kept.
    OutputTooLarge,
    /// The exit handler (`spec.onExit`) ended Dead; the task's phase stands.
    OnExitFailed,
    /// A `retry.rules` entry matched the exit code.
    ExitCodeRule,
    /// Termination message `{"error":"biz"}`.
    BusinessError,
    /// Termination message `{"error":"sys"}`.
    SystemError,
    /// Any other non-zero exit.
    ExitCode,
    /// The pod failed without an exit code to tell why.
    PodFailed,
    /// The worker pod disappeared, or someone else is deleting it.
    WorkerDeleted,
    /// The worker pod never appeared within the hard timeout.
    PodNeverAppeared,
    /// The task's queue is draining (`stopPolicy: HoldAndDrain`): the attempt was stopped.
    QueueDrained,
    /// The attempt was stopped to free a slot for a waiting task of higher priority
    /// (`preemption.withinQueue: LowerPriority`).
    Preempted,

    // Disruptions (the pod's own status reason or `DisruptionTarget` condition).
    Evicted,
    NodeLost,
    NodeShutdown,
    DisruptionTarget,

    // Containers that cannot start.
    ErrImagePull,
    ImagePullBackOff,
    CreateContainerConfigError,
    CreateContainerError,
    ErrImageNeverPull,
    InvalidImageName,

    // Timeouts.
    HardTimeout,
    SoftTimeout,

    // After a failure.
    RetryScheduled,
    NonRetryable,
    RetriesExhausted,
    InfrastructureRetriesExhausted,
    BudgetExceeded,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        use Reason::*;
        match self {
            Queued => "Queued",
            Delayed => "Delayed",
            // The word of every kind's `InvalidSpec` condition.
            InvalidSpec => crate::core::conditions::reason::INVALID_SPEC,
            Canceled => "Canceled",
            Rerun => "Rerun",
            Dispatched => "Dispatched",
            PodForbidden => "PodForbidden",
            PodRejected => "PodRejected",
            WorkerRunning => "WorkerRunning",
            Completed => "Completed",
            CompletedAfterTimeout => "CompletedAfterTimeout",
            OutputTooLarge => "OutputTooLarge",
            OnExitFailed => "OnExitFailed",
            ExitCodeRule => "ExitCodeRule",
            BusinessError => "BusinessError",
            SystemError => "SystemError",
            ExitCode => "ExitCode",
            PodFailed => "PodFailed",
            WorkerDeleted => "WorkerDeleted",
            QueueDrained => "QueueDrained",
            Preempted => "Preempted",
            PodNeverAppeared => "PodNeverAppeared",
            Evicted => "Evicted",
            NodeLost => "NodeLost",
            NodeShutdown => "NodeShutdown",
            DisruptionTarget => "DisruptionTarget",
            ErrImagePull => "ErrImagePull",
            ImagePullBackOff => "ImagePullBackOff",
            CreateContainerConfigError => "CreateContainerConfigError",
            CreateContainerError => "CreateContainerError",
            ErrImageNeverPull => "ErrImageNeverPull",
            InvalidImageName => "InvalidImageName",
            HardTimeout => "HardTimeout",
            SoftTimeout => "SoftTimeout",
            RetryScheduled => "RetryScheduled",
            NonRetryable => "NonRetryable",
            RetriesExhausted => "RetriesExhausted",
            InfrastructureRetriesExhausted => "InfrastructureRetriesExhausted",
            BudgetExceeded => "BudgetExceeded",
        }
    }

    /// A pod's status reason that means it was disrupted (not the worker's fault).
    pub fn of_disruption(pod_reason: &str) -> Option<Reason> {
        match pod_reason {
            "Evicted" => Some(Reason::Evicted),
            "NodeLost" => Some(Reason::NodeLost),
            "Shutdown" | "NodeShutdown" | "Terminated" => Some(Reason::NodeShutdown),
            _ => None,
        }
    }

    /// A container waiting reason after which it does not start by itself.
    pub fn of_stuck_container(waiting_reason: &str) -> Option<Reason> {
        match waiting_reason {
            "ErrImagePull" => Some(Reason::ErrImagePull),
            "ImagePullBackOff" => Some(Reason::ImagePullBackOff),
            "CreateContainerConfigError" => Some(Reason::CreateContainerConfigError),
            "CreateContainerError" => Some(Reason::CreateContainerError),
            "ErrImageNeverPull" => Some(Reason::ErrImageNeverPull),
            "InvalidImageName" => Some(Reason::InvalidImageName),
            _ => None,
        }
    }

    /// Whether a container stuck for this reason may start on a later attempt (a registry that is
    /// down, a Secret or ConfigMap created late): retried as Infrastructure. `ErrImageNeverPull`
    /// and `InvalidImageName` need a spec change.
    pub fn stuck_is_transient(self) -> bool {
        !matches!(self, Reason::ErrImageNeverPull | Reason::InvalidImageName)
    }

    /// Every reason, for tests and documentation.
    pub const ALL: [Reason; 39] = {
        use Reason::*;
        [
            Queued,
            Delayed,
            InvalidSpec,
            Canceled,
            Rerun,
            Dispatched,
            PodForbidden,
            PodRejected,
            WorkerRunning,
            Completed,
            CompletedAfterTimeout,
            OutputTooLarge,
            OnExitFailed,
            ExitCodeRule,
            BusinessError,
            SystemError,
            ExitCode,
            PodFailed,
            WorkerDeleted,
            PodNeverAppeared,
            QueueDrained,
            Preempted,
            Evicted,
            NodeLost,
            NodeShutdown,
            DisruptionTarget,
            ErrImagePull,
            ImagePullBackOff,
            CreateContainerConfigError,
            CreateContainerError,
            ErrImageNeverPull,
            InvalidImageName,
            HardTimeout,
            SoftTimeout,
            RetryScheduled,
            NonRetryable,
            RetriesExhausted,
            InfrastructureRetriesExhausted,
            BudgetExceeded,
        ]
    };
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_camel_case_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for reason in Reason::ALL {
            let s = reason.as_str();
            assert!(
                s.chars().next().is_some_and(|c| c.is_ascii_uppercase()),
                "{s}"
            );
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
            assert!(seen.insert(s), "{s} twice");
        }
    }

    #[test]
    fn image_errors_that_need_a_spec_change_are_not_transient() {
        for (waiting, transient) in [
            ("ErrImagePull", true),
            ("ImagePullBackOff", true),
            ("CreateContainerConfigError", true),
            ("ErrImageNeverPull", false),
            ("InvalidImageName", false),
        ] {
            let reason = Reason::of_stuck_container(waiting).expect(waiting);
            assert_eq!(reason.stuck_is_transient(), transient, "{waiting}");
        }
        assert_eq!(Reason::of_stuck_container("ContainerCreating"), None);
    }
}
