//! Errors of `kubectl ax` and its console, each one line a person can act on, and the
//! classification of API server failures into them (no client required: `classify` is a pure
//! function of the response).

use std::fmt;

use kube::runtime::watcher;

/// A kind of object the front ends read or write, named as kubectl names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Task,
    Dag,
    Queue,
    Cron,
    Pod,
    /// A pod's logs (RBAC: `get pods/log`).
    PodLog,
    Lease,
}

impl Resource {
    /// The singular kind in lower case, as in `axtask "x" not found`.
    pub fn singular(self) -> &'static str {
        match self {
            Resource::Task => "axtask",
            Resource::Dag => "axdag",
            Resource::Queue => "axqueue",
            Resource::Cron => "axcron",
            Resource::Pod => "pod",
            Resource::PodLog => "pod log",
            Resource::Lease => "lease",
        }
    }

    /// The plural with its API group, as RBAC rules and `kubectl api-resources` name it.
    pub fn qualified(self) -> &'static str {
        match self {
            Resource::Task => "axtasks.ax.dev",
            Resource::Dag => "axdags.ax.dev",
            Resource::Queue => "axqueues.ax.dev",
            Resource::Cron => "axcrons.ax.dev",
            Resource::Pod => "pods",
            Resource::PodLog => "pods/log",
            Resource::Lease => "leases.coordination.k8s.io",
        }
    }

    /// Served by the ax CRDs (a 404 on the collection means they are not installed).
    pub fn is_custom(self) -> bool {
        matches!(
            self,
            Resource::Task | Resource::Dag | Resource::Queue | Resource::Cron
        )
    }
}

/// One API call, for the error message when it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The RBAC verb: get, list, watch, patch, create.
    pub verb: &'static str,
    pub resource: Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Op {
    pub fn new(verb: &'static str, resource: Resource) -> Self {
        Self {
            verb,
            resource,
            namespace: None,
            name: None,
        }
    }

    pub fn namespace(mut self, namespace: Option<&str>) -> Self {
        self.namespace = namespace.map(str::to_owned);
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    fn scope(&self) -> String {
        match (&self.namespace, self.resource) {
            (_, Resource::Queue) => "cluster-wide".into(),
            (Some(ns), _) => format!("in namespace \"{ns}\""),
            (None, _) => "in all namespaces".into(),
        }
    }
}

/// Why a front end could not do what it was asked: a classified API failure, or bad input, an
/// unmet wait, an unwritable output.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientError {
    /// The named object does not exist where we looked.
    NotFound {
        resource: Resource,
        name: String,
        namespace: Option<String>,
    },
    /// RBAC denied the call.
    Forbidden { op: Op, user: Option<String> },
    /// The API server does not serve the resource: the ax CRDs are not installed.
    CrdsMissing { resource: Resource },
    /// No live holder of the operator's Lease: nothing would act on the request.
    OperatorNotRunning {
        namespace: String,
        lease: String,
        why: String,
    },
    /// The credentials were rejected.
    Unauthorized,
    /// No answer from the API server (connection, TLS, timeout).
    Unreachable(String),
    /// The kubeconfig could not be read or has no such context.
    Config(String),
    /// Bad input on the command line or in a file.
    Usage(String),
    /// Waited, and the condition was not met: a task ended otherwise.
    NotMet(String),
    /// Waited, and time ran out.
    TimedOut(String),
    /// Some of a bulk action's items failed; each was reported on its own line already.
    Partial { failed: usize, total: usize },
    /// Any other failure of an API call.
    Api {
        op: Op,
        code: u16,
        reason: String,
        message: String,
    },
    /// Writing the output failed (e.g. a closed pipe).
    Io(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            ClientError::NotFound {
                resource,
                name,
                namespace,
            } => match namespace {
                Some(ns) => format!(
                    "{} \"{name}\" not found in namespace \"{ns}\" (searched there only; -n NAMESPACE to look elsewhere)",
                    resource.singular()
                ),
                None => format!("{} \"{name}\" not found", resource.singular()),
            },
            ClientError::Forbidden { op, user } => {
                let who = user
                    .as_deref()
                    .map(|u| format!(" as \"{u}\""))
                    .unwrap_or_default();
                format!(
                    "no permission to {} {} {}{who}: ask for an RBAC role that allows it",
                    op.verb,
                    op.resource.qualified(),
                    op.scope()
                )
            }
            ClientError::CrdsMissing { resource } => format!(
                "the API server does not serve {}: the ax CRDs are not installed (kubectl apply --server-side -f crds/, or helm install charts/ax-operator)",
                resource.qualified()
            ),
            ClientError::OperatorNotRunning {
                namespace,
                lease,
                why,
            } => format!(
                "the ax operator is not running: Lease {namespace}/{lease} {why}; nothing would act on this (start the operator, or point --operator-namespace/--operator-lease at it)"
            ),
            ClientError::Unauthorized => {
                "the API server rejected the credentials (401 Unauthorized): check the kubeconfig's user or token".into()
            }
            ClientError::Unreachable(why) => format!("cannot reach the API server: {why}"),
            ClientError::Config(why) => format!("kubeconfig: {why}"),
            ClientError::Usage(why) => why.clone(),
            ClientError::NotMet(why) | ClientError::TimedOut(why) => why.clone(),
            ClientError::Partial { failed, total } => {
                format!("{failed} of {total} failed (see above)")
            }
            ClientError::Api {
                op,
                code,
                reason,
                message,
            } => {
                let target = op
                    .name
                    .as_deref()
                    .map(|n| format!(" \"{n}\""))
                    .unwrap_or_default();
                format!(
                    "{} {}{target} {} failed: {code} {reason}: {message}",
                    op.verb,
                    op.resource.qualified(),
                    op.scope()
                )
            }
            ClientError::Io(why) => format!("writing output: {why}"),
        };
        f.write_str(&one_line(&text))
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Io(e.to_string())
    }
}

/// Newlines and runs of blanks become one space: every error is a single line.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the API server answered, reduced to what `classify` needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// `details.name` of the Status: set when one named object is missing.
    pub details_name: String,
}

/// The error for a failed call. A 404 naming the object means the object is missing; a 404
/// without (the plain "404 page not found" of an unknown API path, or a Status with empty
/// details) means the resource is not served, i.e. the CRDs are not installed.
pub fn classify(op: &Op, failure: &Failure) -> ClientError {
    match failure.code {
        401 => ClientError::Unauthorized,
        403 => ClientError::Forbidden {
            op: op.clone(),
            user: forbidden_user(&failure.message),
        },
        404 if op.resource.is_custom()
            && (op.name.is_none() || failure.details_name.is_empty()) =>
        {
            ClientError::CrdsMissing {
                resource: op.resource,
            }
        }
        404 if op.name.is_some() => ClientError::NotFound {
            resource: op.resource,
            name: op.name.clone().unwrap_or_default(),
            namespace: op.namespace.clone(),
        },
        code => ClientError::Api {
            op: op.clone(),
            code,
            reason: failure.reason.clone(),
            message: failure.message.clone(),
        },
    }
}

/// The user in an RBAC denial: `... is forbidden: User "alice" cannot patch resource ...`.
pub fn forbidden_user(message: &str) -> Option<String> {
    let rest = &message[message.find("User \"")? + 6..];
    Some(rest[..rest.find('"')?].to_owned())
}

/// The error for any failure of a kube call.
pub fn from_kube(op: &Op, error: kube::Error) -> ClientError {
    match error {
        kube::Error::Api(status) => classify(
            op,
            &Failure {
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                details_name: status
                    .details
                    .as_ref()
                    .map(|d| d.name.clone())
                    .unwrap_or_default(),
            },
        ),
        kube::Error::Auth(e) => ClientError::Config(e.to_string()),
        other => ClientError::Unreachable(error_chain(&other)),
    }
}

/// A watch failure; the first one usually says why nothing can be watched (403, missing CRDs).
pub fn watch_error(op: &Op, error: watcher::Error) -> ClientError {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => from_kube(op, e),
        watcher::Error::WatchError(status) => from_kube(op, kube::Error::Api(status)),
        other => ClientError::Unreachable(other.to_string()),
    }
}

/// An error and its sources, joined: hyper's top-level message alone says little.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    one_line(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op_get_task() -> Op {
        Op::new("get", Resource::Task)
            .namespace(Some("team-a"))
            .name("nightly")
    }

    #[test]
    fn a_named_404_is_an_unknown_task_naming_the_namespace() {
        let failure = Failure {
            code: 404,
            reason: "NotFound".into(),
            message: "axtasks.ax.dev \"nightly\" not found".into(),
            details_name: "nightly".into(),
        };
        let e = classify(&op_get_task(), &failure);
        assert_eq!(
            e,
            ClientError::NotFound {
                resource: Resource::Task,
                name: "nightly".into(),
                namespace: Some("team-a".into()),
            }
        );
        let text = e.to_string();
        assert!(text.contains("axtask \"nightly\" not found in namespace \"team-a\""));
    }

    #[test]
    fn a_404_page_not_found_means_the_crds_are_missing() {
        // What kube makes of the API server's plain-text answer for an unknown path.
        let failure = Failure {
            code: 404,
            reason: "Failed to parse error data".into(),
            message: "404 page not found".into(),
            details_name: String::new(),
        };
        for op in [
            op_get_task(),
            Op::new("list", Resource::Queue),
            Op::new("list", Resource::Dag).namespace(Some("x")),
        ] {
            let e = classify(&op, &failure);
            assert_eq!(
                e,
                ClientError::CrdsMissing {
                    resource: op.resource
                }
            );
            assert!(e.to_string().contains("CRDs are not installed"), "{e}");
        }
    }

    #[test]
    fn a_404_on_a_pod_is_not_found_not_missing_crds() {
        let op = Op::new("get", Resource::Pod)
            .namespace(Some("a"))
            .name("t-1");
        let e = classify(
            &op,
            &Failure {
                code: 404,
                reason: "Failed to parse error data".into(),
                ..Failure::default()
            },
        );
        assert!(matches!(e, ClientError::NotFound { .. }), "{e:?}");
    }

    #[test]
    fn a_403_names_verb_resource_scope_and_user() {
        let op = Op::new("patch", Resource::Task)
            .namespace(Some("team-a"))
            .name("nightly");
        let message = "axtasks.ax.dev \"nightly\" is forbidden: User \"system:serviceaccount:team-a:viewer\" cannot patch resource \"axtasks\" in API group \"ax.dev\" in the namespace \"team-a\"";
        let e = classify(
            &op,
            &Failure {
                code: 403,
                reason: "Forbidden".into(),
                message: message.into(),
                details_name: "nightly".into(),
            },
        );
        assert_eq!(
            e.to_string(),
            "no permission to patch axtasks.ax.dev in namespace \"team-a\" as \"system:serviceaccount:team-a:viewer\": ask for an RBAC role that allows it"
        );
    }

    #[test]
    fn queues_are_cluster_wide_in_messages() {
        let e = classify(
            &Op::new("list", Resource::Queue),
            &Failure {
                code: 403,
                message: "forbidden".into(),
                ..Failure::default()
            },
        );
        assert_eq!(
            e.to_string(),
            "no permission to list axqueues.ax.dev cluster-wide: ask for an RBAC role that allows it"
        );
    }

    #[test]
    fn other_failures_keep_code_reason_and_message_on_one_line() {
        let e = classify(
            &op_get_task(),
            &Failure {
                code: 500,
                reason: "InternalError".into(),
                message: "etcd\nis down".into(),
                details_name: String::new(),
            },
        );
        let text = e.to_string();
        assert!(!text.contains('\n'));
        assert!(
            text.contains("get axtasks.ax.dev \"nightly\" in namespace \"team-a\" failed: 500 InternalError: etcd is down"),
            "{text}"
        );
    }

    #[test]
    fn every_error_is_one_line() {
        let errors = [
            ClientError::Usage("a\nb".into()),
            ClientError::Unreachable("x\n y".into()),
            ClientError::OperatorNotRunning {
                namespace: "ax-system".into(),
                lease: "ax-operator".into(),
                why: "has no holder".into(),
            },
            ClientError::Partial {
                failed: 1,
                total: 3,
            },
        ];
        for e in errors {
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }

    #[test]
    fn forbidden_user_is_read_from_the_rbac_message() {
        assert_eq!(
            forbidden_user("x is forbidden: User \"bob\" cannot list"),
            Some("bob".into())
        );
        assert_eq!(forbidden_user("forbidden"), None);
        assert_eq!(forbidden_user("User \"unterminated"), None);
    }
}
