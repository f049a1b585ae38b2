//! The AxTask a front end submits (no client required): the fields of `kubectl ax submit` and of
//! the console's form over a manifest (or none), every field checked; and the copy of an
//! existing task that `resubmit` creates. `build_task_value` is what
//! the API server would be sent, `build_task` that read as an AxTask.

use std::collections::BTreeMap;

use clap::Args;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::api::{AxTask, Priority};
use crate::core::trace::{TRACEPARENT_ANNOTATION, TraceParent};

use super::error::ClientError;
use super::format::parse_seconds;
use super::task::MAIN_CONTAINER_ANNOTATION;

// A task's fields as `kubectl ax submit` takes them as flags and the console's form as fields;
// what is not given is left as the manifest (or the defaults) has it. Not a doc comment: clap
// would take it as the about text of `submit`.
#[derive(Args, Debug, Default)]
pub struct TaskFields {
    /// Task name (default: `<type>-` plus a random suffix chosen by the API server).
    #[arg(long)]
    pub name: Option<String>,
    /// Task type (`spec.type`); required without `-f`.
    #[arg(long = "type")]
    pub task_type: Option<String>,
    /// Worker image; required without `-f`.
    #[arg(long)]
    pub image: Option<String>,
    /// `imagePullPolicy` of the worker container (Always, IfNotPresent, Never).
    #[arg(long)]
    pub image_pull_policy: Option<String>,
    /// Shell command for the worker, run as `sh -c COMMAND`.
    #[arg(long, conflicts_with = "args")]
    pub command: Option<String>,
    /// Worker command in exec form, after `--`: `kubectl ax submit ... -- /bin/worker --fast`.
    #[arg(last = true)]
    pub args: Vec<String>,
    /// Environment variable of the worker, `NAME=VALUE` (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Priority bucket: Critical, High, Normal or Low.
    #[arg(long)]
    pub priority: Option<String>,
    /// AxQueue to wait in.
    #[arg(long)]
    pub queue: Option<String>,
    // Read by the caller, which may have to read a file: `build_task` takes it parsed.
    /// Payload: a JSON object, or `@FILE` to read it from a file.
    #[arg(long)]
    pub payload: Option<String>,
    /// Retries after the first attempt (`retry.maxRetries`).
    #[arg(long)]
    pub max_retries: Option<i32>,
    /// Hard timeout of an attempt: seconds, or a duration like `10m`, `1h30m`.
    #[arg(long)]
    pub hard_timeout: Option<String>,
    /// Soft timeout of an attempt: seconds, or a duration like `30s`.
    #[arg(long)]
    pub soft_timeout: Option<String>,
    /// Total retry budget from the first dispatch: seconds, or a duration like `1h`.
    #[arg(long)]
    pub budget: Option<String>,
    /// Do not queue the task before this RFC 3339 time.
    #[arg(long)]
    pub start_after: Option<String>,
    /// Delete the task this long after it finished: seconds, or a duration.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Label of the task, `KEY=VALUE` (repeatable). No short form: kubectl's `-L` means
    /// `--label-columns`.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// W3C traceparent of the submitting service (`00-<trace id>-<span id>-<flags>`): the task's
    /// trace continues it (annotation `ax.dev/traceparent`).
    #[arg(long)]
    pub traceparent: Option<String>,
}

fn usage(text: impl Into<String>) -> ClientError {
    ClientError::Usage(text.into())
}

/// `KEY=VALUE` of a repeatable flag.
fn key_value<'a>(flag: &str, text: &'a str) -> Result<(&'a str, &'a str), ClientError> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k, v)),
        _ => Err(usage(format!("--{flag} {text:?}: expected KEY=VALUE"))),
    }
}

/// The payload flag: a JSON object, or `@FILE` holding one (the file is read by the caller and
/// passed as `file_text`).
pub fn parse_payload(text: &str, file_text: Option<&str>) -> Result<Value, ClientError> {
    let (source, json_text) = match file_text {
        Some(t) => (text.to_string(), t),
        None => ("--payload".to_string(), text),
    };
    let value: Value =
        serde_json::from_str(json_text).map_err(|e| usage(format!("{source}: not JSON: {e}")))?;
    if !value.is_object() {
        return Err(usage(format!(
            "{source}: the payload must be a JSON object"
        )));
    }
    Ok(value)
}

/// The AxTask to create. `base` is the manifest of `-f` (None: built from flags alone);
/// `payload` the parsed `--payload`.
pub fn build_task(
    fields: &TaskFields,
    base: Option<Value>,
    payload: Option<Value>,
    namespace: &str,
) -> Result<AxTask, ClientError> {
    let what = if base.is_some() {
        "the manifest"
    } else {
        "the task"
    };
    let task = build_task_value(fields, base, payload, namespace)?;
    serde_json::from_value(task).map_err(|e| usage(format!("{what} is not a valid AxTask: {e}")))
}

/// `build_task` before it is read as an AxTask: what the API server would be sent, so that its
/// schema validation (a dry run) can judge fields this client would refuse to parse.
pub fn build_task_value(
    fields: &TaskFields,
    base: Option<Value>,
    payload: Option<Value>,
    namespace: &str,
) -> Result<Value, ClientError> {
    let mut task = base.unwrap_or_else(|| {
        json!({
            "apiVersion": "ax.dev/v1alpha1",
            "kind": "AxTask",
            "metadata": {},
            "spec": {"template": {"spec": {"containers": [{"name": "worker"}]}}},
        })
    });
    if !task.is_object() {
        return Err(usage("the manifest is not an object"));
    }
    if let Some(kind) = task.get("kind").and_then(Value::as_str)
        && kind != "AxTask"
    {
        return Err(usage(format!(
            "the manifest is a {kind}; submit creates AxTasks (kubectl apply -f for anything else)"
        )));
    }
    task["apiVersion"] = "ax.dev/v1alpha1".into();
    task["kind"] = "AxTask".into();
    if !task["metadata"].is_object() {
        task["metadata"] = json!({});
    }
    if !task["spec"].is_object() {
        task["spec"] = json!({});
    }
    let meta = &mut task["metadata"];
    meta["namespace"] = namespace.into();
    if let Some(name) = &fields.name {
        meta["name"] = name.as_str().into();
        if let Some(m) = meta.as_object_mut() {
            m.remove("generateName");
        }
    }
    for label in &fields.labels {
        let (k, v) = key_value("label", label)?;
        if !meta["labels"].is_object() {
            meta["labels"] = json!({});
        }
        meta["labels"][k] = v.into();
    }
    if let Some(traceparent) = &fields.traceparent {
        TraceParent::parse(traceparent).map_err(|e| usage(format!("--traceparent: {e}")))?;
        if !meta["annotations"].is_object() {
            meta["annotations"] = json!({});
        }
        meta["annotations"][TRACEPARENT_ANNOTATION] = traceparent.trim().into();
    }
    // Server-set fields of an exported manifest would make the create fail.
    if let Some(m) = meta.as_object_mut() {
        for f in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
        ] {
            m.remove(f);
        }
    }
    if let Some(t) = task.as_object_mut() {
        t.remove("status");
    }

    let spec = &mut task["spec"];
    if let Some(t) = &fields.task_type {
        spec["type"] = t.as_str().into();
    }
    let Some(task_type) = spec["type"].as_str().map(str::to_owned) else {
        return Err(usage(
            "--type is required (the task type, e.g. --type report)",
        ));
    };
    if let Some(p) = &fields.priority {
        let priority: Priority =
            serde_json::from_value(Value::String(capitalized(p))).map_err(|_| {
                usage(format!(
                    "--priority {p:?}: one of Critical, High, Normal, Low"
                ))
            })?;
        spec["priority"] = priority.as_str().into();
    }
    if let Some(q) = &fields.queue {
        spec["queue"] = q.as_str().into();
    }
    if let Some(p) = payload {
        spec["payload"] = p;
    }
    if let Some(n) = fields.max_retries {
        if n < 0 {
            return Err(usage(format!("--max-retries {n}: must be 0 or more")));
        }
        object_at(spec, "retry")["maxRetries"] = n.into();
    }
    if let Some(b) = &fields.budget {
        object_at(spec, "retry")["budgetSeconds"] = parse_seconds("budget", b)?.into();
    }
    if let Some(h) = &fields.hard_timeout {
        object_at(spec, "timeout")["hardSeconds"] = parse_seconds("hard-timeout", h)?.into();
    }
    if let Some(s) = &fields.soft_timeout {
        object_at(spec, "timeout")["softSeconds"] = parse_seconds("soft-timeout", s)?.into();
    }
    if let Some(t) = &fields.ttl {
        spec["ttlSecondsAfterFinished"] = parse_seconds("ttl", t)?.into();
    }
    if let Some(s) = &fields.start_after {
        let t: Timestamp = s
            .parse()
            .map_err(|e| usage(format!("--start-after {s:?}: not an RFC 3339 time: {e}")))?;
        spec["startAfter"] = t.to_string().into();
    }

    let template = object_at(spec, "template");
    let main_name = template["metadata"]["annotations"][MAIN_CONTAINER_ANNOTATION]
        .as_str()
        .map(str::to_owned);
    let pod_spec = object_at(template, "spec");
    if !pod_spec["containers"].is_array()
        || pod_spec["containers"].as_array().is_some_and(Vec::is_empty)
    {
        pod_spec["containers"] = json!([{"name": "worker"}]);
    }
    let Some(container) = pod_spec["containers"]
        .as_array_mut()
        .and_then(|containers| {
            let index = main_name
                .and_then(|n| containers.iter().position(|c| c["name"] == n.as_str()))
                .unwrap_or(0);
            containers.get_mut(index).filter(|c| c.is_object())
        })
    else {
        return Err(usage(
            "the template's spec.containers holds something that is not a container object",
        ));
    };
    if let Some(image) = &fields.image {
        container["image"] = image.as_str().into();
    }
    if container["image"].as_str().is_none_or(str::is_empty) {
        return Err(usage("--image is required (the worker image)"));
    }
    if let Some(policy) = &fields.image_pull_policy {
        if !["Always", "IfNotPresent", "Never"].contains(&policy.as_str()) {
            return Err(usage(format!(
                "--image-pull-policy {policy:?}: one of Always, IfNotPresent, Never"
            )));
        }
        container["imagePullPolicy"] = policy.as_str().into();
    }
    if let Some(command) = &fields.command {
        container["command"] = json!(["sh", "-c", command]);
        if let Some(c) = container.as_object_mut() {
            c.remove("args");
        }
    } else if !fields.args.is_empty() {
        container["command"] = json!(fields.args);
        if let Some(c) = container.as_object_mut() {
            c.remove("args");
        }
    }
    for e in &fields.env {
        let (k, v) = key_value("env", e)?;
        if !container["env"].is_array() {
            container["env"] = json!([]);
        }
        if let Some(env) = container["env"].as_array_mut() {
            env.retain(|var| var["name"] != k);
            env.push(json!({"name": k, "value": v}));
        }
    }

    if task["metadata"]["name"].as_str().is_none()
        && task["metadata"]["generateName"].as_str().is_none()
    {
        let prefix: String = task_type.chars().take(50).collect();
        task["metadata"]["generateName"] = format!("{prefix}-").into();
    }
    Ok(task)
}

/// Prefix of the labels and annotations the operator owns (`ax.dev/dag`, `ax.dev/cron`, ...):
/// they say where the source task came from, which the new one did not.
pub const OPERATOR_PREFIX: &str = "ax.dev/";

/// What `kubectl apply` records of the object it applied: not of the new one.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A new task from `source`'s spec, as `kubectl ax resubmit` creates it: the requests of the
/// old one (`rerun`, `cancel`, `suspend`) back at their defaults, its own labels and
/// annotations without the operator's, no owner (a DAG's or cron's child becomes a task of
/// its own), named `name` or `<source>-` plus a suffix the API server picks.
pub fn resubmit_task(source: &AxTask, name: Option<&str>) -> AxTask {
    let keep = |map: &Option<BTreeMap<String, String>>| {
        let kept: BTreeMap<String, String> = map
            .iter()
            .flatten()
            .filter(|(k, _)| !k.starts_with(OPERATOR_PREFIX) && k.as_str() != LAST_APPLIED)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (!kept.is_empty()).then_some(kept)
    };
    let mut spec = source.spec.clone();
    spec.rerun = 0;
    spec.cancel = false;
    spec.suspend = false;
    AxTask {
        metadata: ObjectMeta {
            name: name.map(str::to_owned),
            generate_name: name.is_none().then(|| format!("{}-", source.name_any())),
            namespace: source.metadata.namespace.clone(),
            labels: keep(&source.metadata.labels),
            annotations: keep(&source.metadata.annotations),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

fn capitalized(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut chars = lower.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// `value[key]`, made an object first when it is not one.
fn object_at<'a>(value: &'a mut Value, key: &str) -> &'a mut Value {
    if !value[key].is_object() {
        value[key] = json!({});
    }
    &mut value[key]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> TaskFields {
        TaskFields {
            task_type: Some("report".into()),
            image: Some("busybox".into()),
            ..TaskFields::default()
        }
    }

    #[test]
    fn a_traceparent_becomes_the_annotation_and_a_bad_one_is_a_usage_error() {
        let mut args = flags();
        args.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        let t = build_task(&args, None, None, "ns").unwrap();
        assert_eq!(
            t.metadata.annotations.unwrap()[TRACEPARENT_ANNOTATION],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        args.traceparent = Some("00-nope".into());
        let error = build_task(&args, None, None, "ns").unwrap_err();
        assert!(
            matches!(&error, ClientError::Usage(m) if m.starts_with("--traceparent: ")),
            "{error:?}"
        );
    }

    #[test]
    fn flags_alone_make_a_task_with_a_generated_name() {
        let mut args = flags();
        args.command = Some("echo hi".into());
        args.priority = Some("high".into());
        args.queue = Some("batch".into());
        args.max_retries = Some(5);
        args.hard_timeout = Some("10m".into());
        args.env = vec!["A=1".into(), "B=x=y".into()];
        args.labels = vec!["team=a".into()];
        let payload = parse_payload(r#"{"day": "mon"}"#, None).unwrap();
        let t = build_task(&args, None, Some(payload), "ns").unwrap();
        assert_eq!(t.metadata.generate_name.as_deref(), Some("report-"));
        assert_eq!(t.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(t.metadata.labels.unwrap()["team"], "a");
        assert_eq!(t.spec.priority, Priority::High);
        assert_eq!(t.spec.queue, "batch");
        assert_eq!(t.spec.retry.max_retries, 5);
        assert_eq!(t.spec.timeout.hard_seconds, 600);
        assert_eq!(t.spec.payload.unwrap()["day"], "mon");
        let c = &t.spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert_eq!(c.command.clone().unwrap(), ["sh", "-c", "echo hi"]);
        let env: Vec<(String, Option<String>)> = c
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect();
        assert_eq!(
            env,
            [
                ("A".into(), Some("1".into())),
                ("B".into(), Some("x=y".into()))
            ]
        );
    }

    #[test]
    fn a_manifest_whose_containers_are_not_objects_is_refused_not_a_panic() {
        for containers in ["[5]", "[\"worker\"]", "[null, {name: b}]"] {
            let manifest: Value = crate::yaml::from_str(&format!(
                "kind: AxTask\nspec: {{type: t, template: {{spec: {{containers: {containers}}}}}}}"
            ))
            .unwrap();
            let mut args = flags();
            args.env = vec!["A=1".into()];
            let error = build_task(&args, Some(manifest), None, "ns").unwrap_err();
            assert!(
                error.to_string().contains("not a container object"),
                "{containers}: {error}"
            );
        }
    }

    #[test]
    fn flags_override_the_manifest_and_keep_the_rest() {
        let manifest: Value = crate::yaml::from_str(
            r#"
apiVersion: ax.dev/v1alpha1
kind: AxTask
metadata: {name: from-file, namespace: elsewhere, resourceVersion: "5"}
spec:
  type: hello
  retry: {maxRetries: 1, backoff: {baseSeconds: 7}}
  template:
    metadata: {annotations: {ax.dev/main-container: main}}
    spec:
      containers:
        - {name: sidecar, image: proxy}
        - {name: main, image: old, env: [{name: A, value: old}]}
status: {phase: Dead}
"#,
        )
        .unwrap();
        let args = TaskFields {
            name: Some("renamed".into()),
            image: Some("new".into()),
            max_retries: Some(4),
            env: vec!["A=new".into()],
            args: vec!["/bin/work".into(), "--fast".into()],
            ..TaskFields::default()
        };
        let t = build_task(&args, Some(manifest), None, "ns").unwrap();
        assert_eq!(t.metadata.name.as_deref(), Some("renamed"));
        assert_eq!(t.metadata.resource_version, None);
        assert!(t.status.is_none());
        assert_eq!(t.spec.task_type, "hello");
        assert_eq!(t.spec.retry.max_retries, 4);
        assert_eq!(t.spec.retry.backoff.base_seconds, 7, "the rest is kept");
        let containers = t.spec.template.spec.clone().unwrap().containers;
        assert_eq!(containers[0].image.as_deref(), Some("proxy"));
        assert_eq!(containers[1].image.as_deref(), Some("new"));
        assert_eq!(
            containers[1].command.clone().unwrap(),
            ["/bin/work", "--fast"]
        );
        assert_eq!(containers[1].env.clone().unwrap().len(), 1);
    }

    #[test]
    fn a_resubmitted_task_keeps_the_spec_and_the_users_metadata_only() {
        let source: AxTask = serde_json::from_value(json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {
                "name": "nightly-a", "namespace": "team-a", "uid": "u1", "resourceVersion": "9",
                "creationTimestamp": "2025-01-01T00:00:00Z", "finalizers": ["x/y"],
                "labels": {"team": "a", "ax.dev/dag": "nightly", "ax.dev/dag-task": "a"},
                "annotations": {"note": "keep", "ax.dev/manual-trigger": "true",
                                "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [{"apiVersion": "ax.dev/v1alpha1", "kind": "AxDag",
                                     "name": "nightly", "uid": "u0"}],
            },
            "spec": {"type": "report", "priority": "High", "rerun": 3, "cancel": true,
                     "suspend": true, "retry": {"maxRetries": 4},
                     "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}},
            "status": {"phase": "Canceled"},
        }))
        .unwrap();
        let t = resubmit_task(&source, None);
        assert_eq!(t.metadata.name, None);
        assert_eq!(t.metadata.generate_name.as_deref(), Some("nightly-a-"));
        assert_eq!(t.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            t.metadata.labels,
            Some([("team".to_string(), "a".to_string())].into())
        );
        assert_eq!(
            t.metadata.annotations,
            Some([("note".to_string(), "keep".to_string())].into())
        );
        assert!(t.metadata.owner_references.is_none() && t.metadata.finalizers.is_none());
        assert!(t.metadata.uid.is_none() && t.metadata.resource_version.is_none());
        assert!(t.status.is_none());
        assert_eq!(
            (t.spec.rerun, t.spec.cancel, t.spec.suspend),
            (0, false, false)
        );
        assert_eq!(t.spec.retry.max_retries, 4);
        assert_eq!(t.spec.priority, Priority::High);
        assert_eq!(t.spec.template, source.spec.template);

        let named = resubmit_task(&source, Some("again"));
        assert_eq!(named.metadata.name.as_deref(), Some("again"));
        assert_eq!(named.metadata.generate_name, None);
        let mut bare = source.clone();
        bare.metadata.labels = Some([("ax.dev/cron".to_string(), "c".to_string())].into());
        assert_eq!(resubmit_task(&bare, None).metadata.labels, None);
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        let cases: Vec<(TaskFields, &str)> = vec![
            (
                TaskFields {
                    image: Some("x".into()),
                    ..TaskFields::default()
                },
                "--type is required",
            ),
            (
                TaskFields {
                    task_type: Some("x".into()),
                    ..TaskFields::default()
                },
                "--image is required",
            ),
            (
                TaskFields {
                    priority: Some("urgent".into()),
                    ..flags()
                },
                "--priority",
            ),
            (
                TaskFields {
                    hard_timeout: Some("soon".into()),
                    ..flags()
                },
                "--hard-timeout",
            ),
            (
                TaskFields {
                    env: vec!["NOVALUE".into()],
                    ..flags()
                },
                "KEY=VALUE",
            ),
            (
                TaskFields {
                    start_after: Some("tomorrow".into()),
                    ..flags()
                },
                "RFC 3339",
            ),
        ];
        for (args, want) in cases {
            let e = build_task(&args, None, None, "ns").unwrap_err().to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        }
        assert!(parse_payload("[1]", None).is_err());
        assert!(parse_payload("{", None).is_err());
        let e = build_task(
            &flags(),
            Some(json!({"kind": "AxDag", "spec": {}})),
            None,
            "ns",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("AxDag"), "{e}");
    }
}
