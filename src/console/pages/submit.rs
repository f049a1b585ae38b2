//! Submitting a task (no client required, pure): a form for the common fields and a YAML editor
//! for everything, both turned into the manifest `kubectl ax submit` would send. The API server
//! judges it (a dry run for *Check*, the create itself for *Create*); its schema errors, and
//! the operator's own checks, are shown next to what was typed.

use maud::{Markup, html};
use serde_json::Value;

use crate::api::{AxTask, Priority};
use crate::client::submit::{TaskFields, build_task_value, parse_payload};
use crate::core::task::validate;

use super::super::html::token_field;

pub const EXAMPLE_YAML: &str = "apiVersion: ax.dev/v1alpha1
kind: AxTask
metadata:
  generateName: hello-
spec:
  type: hello
  priority: Normal
  payload: {greeting: hi}
  retry: {maxRetries: 2}
  template:
    spec:
      containers:
        - name: worker
          image: busybox:1.36
          imagePullPolicy: IfNotPresent
          command: [sh, -c, 'echo \"$AX_PAYLOAD\"']
";

/// Which of the two editors was used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Form,
    Yaml,
}

/// What the user typed, kept to show it again with the errors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Input {
    pub mode: Mode,
    pub namespace: String,
    /// Form fields by name.
    pub fields: Vec<(String, String)>,
    pub yaml: String,
}

impl Input {
    pub fn field(&self, name: &str) -> &str {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// From the posted form.
    pub fn parse(pairs: &[(String, String)], default_namespace: &str) -> Input {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let namespace = match get("ns").trim() {
            "" => default_namespace.to_owned(),
            ns => ns.to_owned(),
        };
        Input {
            mode: if get("mode") == "yaml" {
                Mode::Yaml
            } else {
                Mode::Form
            },
            namespace,
            fields: pairs
                .iter()
                .filter(|(k, _)| FORM_FIELDS.iter().any(|(f, _)| f == k))
                .cloned()
                .collect(),
            yaml: get("yaml"),
        }
    }
}

/// The form's fields: name and the manifest field its errors are reported on.
pub const FORM_FIELDS: [(&str, &str); 10] = [
    ("name", "metadata.name"),
    ("type", "spec.type"),
    ("image", "spec.template.spec.containers[0].image"),
    (
        "pullPolicy",
        "spec.template.spec.containers[0].imagePullPolicy",
    ),
    ("command", "spec.template.spec.containers[0].command"),
    ("priority", "spec.priority"),
    ("queue", "spec.queue"),
    ("payload", "spec.payload"),
    ("maxRetries", "spec.retry.maxRetries"),
    ("hardTimeout", "spec.timeout.hardSeconds"),
];

/// One error, on a manifest field when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: Option<String>,
    pub message: String,
}

impl FieldError {
    pub fn general(message: impl Into<String>) -> FieldError {
        FieldError {
            field: None,
            message: message.into(),
        }
    }
}

/// What happened to the last submission shown on the page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    #[default]
    Nothing,
    /// The dry run passed.
    Valid,
    Errors(Vec<FieldError>),
}

fn opt(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// The manifest to send, or what is wrong before the API server needs to be asked. The
/// operator's own checks (which the schema cannot express) run on what can be read as an AxTask.
pub fn manifest(input: &Input) -> Result<Value, Vec<FieldError>> {
    let value = match input.mode {
        Mode::Yaml => {
            let base: Value = crate::yaml::from_str(&input.yaml).map_err(|e| {
                vec![FieldError {
                    field: Some("yaml".into()),
                    message: format!("not YAML: {e}"),
                }]
            })?;
            if !base.is_object() {
                return Err(vec![FieldError::general("the manifest must be an object")]);
            }
            let mut base = base;
            base["apiVersion"] = "ax.dev/v1alpha1".into();
            if base.get("kind").is_none() {
                base["kind"] = "AxTask".into();
            }
            if base["kind"] != "AxTask" {
                return Err(vec![FieldError::general(format!(
                    "the manifest is a {}; this page creates AxTasks",
                    base["kind"]
                ))]);
            }
            if !base["metadata"].is_object() {
                base["metadata"] = serde_json::json!({});
            }
            base["metadata"]["namespace"] = input.namespace.as_str().into();
            if base["metadata"]["name"].as_str().is_none_or(str::is_empty)
                && base["metadata"]["generateName"].as_str().is_none()
            {
                let prefix: String = base["spec"]["type"]
                    .as_str()
                    .unwrap_or("task")
                    .chars()
                    .take(50)
                    .collect();
                base["metadata"]["generateName"] = format!("{prefix}-").into();
            }
            base
        }
        Mode::Form => {
            let payload = match opt(input.field("payload")) {
                Some(p) => Some(parse_payload(&p, None).map_err(|e| {
                    vec![FieldError {
                        field: Some("spec.payload".into()),
                        message: e.to_string().replace("--payload: ", ""),
                    }]
                })?),
                None => None,
            };
            let max_retries = match opt(input.field("maxRetries")) {
                Some(n) => Some(n.parse::<i32>().map_err(|_| {
                    vec![FieldError {
                        field: Some("spec.retry.maxRetries".into()),
                        message: format!("{n:?} is not a whole number"),
                    }]
                })?),
                None => None,
            };
            let fields = TaskFields {
                name: opt(input.field("name")),
                task_type: opt(input.field("type")),
                image: opt(input.field("image")),
                image_pull_policy: opt(input.field("pullPolicy")),
                command: opt(input.field("command")),
                priority: opt(input.field("priority")),
                queue: opt(input.field("queue")),
                max_retries,
                hard_timeout: opt(input.field("hardTimeout")),
                ..TaskFields::default()
            };
            build_task_value(&fields, None, payload, &input.namespace)
                .map_err(|e| vec![FieldError::general(e.to_string())])?
        }
    };
    if let Ok(task) = serde_json::from_value::<AxTask>(value.clone())
        && let Err(e) = validate(&task.spec)
    {
        return Err(vec![FieldError::general(format!(
            "the operator would refuse it (Dead, InvalidSpec): {e}"
        ))]);
    }
    Ok(value)
}

/// The YAML of a task to start a copy from: its spec, a generated name after its own, its
/// labels except those ax sets; no status, no re-run or cancel request.
pub fn clone_yaml(task: &AxTask) -> String {
    let mut spec = serde_json::to_value(&task.spec).unwrap_or_default();
    if let Some(s) = spec.as_object_mut() {
        s.remove("rerun");
        s.remove("cancel");
    }
    let labels: serde_json::Map<String, Value> = task
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("ax.dev/"))
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    let name = task.metadata.name.clone().unwrap_or_default();
    let mut metadata = serde_json::json!({"generateName": format!("{name}-")});
    if !labels.is_empty() {
        metadata["labels"] = labels.into();
    }
    let doc = serde_json::json!({
        "apiVersion": "ax.dev/v1alpha1",
        "kind": "AxTask",
        "metadata": metadata,
        "spec": spec,
    });
    crate::yaml::to_string(&doc).unwrap_or_default()
}

fn errors_for<'a>(errors: &'a [FieldError], field: &str) -> Vec<&'a FieldError> {
    errors
        .iter()
        .filter(|e| e.field.as_deref() == Some(field))
        .collect()
}

pub fn render(
    input: &Input,
    outcome: &Outcome,
    fixed_namespace: Option<&str>,
    token: &str,
) -> Markup {
    let errors: &[FieldError] = match outcome {
        Outcome::Errors(e) => e,
        _ => &[],
    };
    let form_fields: Vec<&str> = FORM_FIELDS.iter().map(|(_, f)| *f).collect();
    // Errors not next to a field of the editor used go on top.
    let general: Vec<&FieldError> = errors
        .iter()
        .filter(|e| match (&e.field, input.mode) {
            (None, _) => true,
            (Some(f), Mode::Form) => !form_fields.contains(&f.as_str()),
            (Some(_), Mode::Yaml) => false,
        })
        .collect();
    let yaml_errors: Vec<&FieldError> = match input.mode {
        Mode::Yaml => errors.iter().filter(|e| e.field.is_some()).collect(),
        Mode::Form => Vec::new(),
    };
    let yaml = if input.yaml.is_empty() {
        EXAMPLE_YAML
    } else {
        &input.yaml
    };
    let namespace_input = |mode: &str| {
        html! {
            @match fixed_namespace {
                Some(ns) => { input type="hidden" name="ns" value=(ns); span.hint { "in namespace " (ns) } },
                None => label { "Namespace " input name="ns" value=(input.namespace) required id=(format!("{mode}-ns")); },
            }
        }
    };
    let field = |name: &str, label: &str, manifest_field: &str, control: Markup| {
        let errs = if input.mode == Mode::Form {
            errors_for(errors, manifest_field)
        } else {
            Vec::new()
        };
        html! {
            div class=(if errs.is_empty() { "field" } else { "field invalid" }) data-field=(name) {
                label for=(format!("f-{name}")) { (label) }
                (control)
                @for e in errs { span.field-error { (e.message) } }
            }
        }
    };
    let text = |name: &str, placeholder: &str| {
        let value = if input.mode == Mode::Form {
            input.field(name)
        } else {
            ""
        };
        html! { input id=(format!("f-{name}")) name=(name) value=(value) placeholder=(placeholder); }
    };
    html! {
        h1 { "Submit a task" }
        @match outcome {
            Outcome::Valid => div.notice.ok #check-result { "The API server accepts this task (dry run): nothing was created." },
            Outcome::Errors(_) => div.notice.error #check-result { "The task was not created: see the errors below." },
            Outcome::Nothing => {},
        }
        @if !general.is_empty() {
            ul.errors #general-errors { @for e in &general {
                li.field-error { @if let Some(f) = &e.field { code { (f) } ": " } (e.message) }
            } }
        }
        div.editors {
            form #submit-form .submit-form method="post" action="/submit" {
                h2 { "Form" }
                (token_field(token))
                input type="hidden" name="mode" value="form";
                (namespace_input("form"))
                (field("name", "Name", "metadata.name", text("name", "generated from the type")))
                (field("type", "Type", "spec.type", text("type", "e.g. report")))
                (field("image", "Image", "spec.template.spec.containers[0].image", text("image", "e.g. busybox:1.36")))
                (field("pullPolicy", "Pull policy", "spec.template.spec.containers[0].imagePullPolicy", html! {
                    select id="f-pullPolicy" name="pullPolicy" {
                        @for p in ["", "IfNotPresent", "Always", "Never"] {
                            option value=(p) selected[input.field("pullPolicy") == p] { (if p.is_empty() { "(default)" } else { p }) }
                        }
                    }
                }))
                (field("command", "Command (sh -c)", "spec.template.spec.containers[0].command", text("command", "echo hello")))
                (field("priority", "Priority", "spec.priority", html! {
                    select id="f-priority" name="priority" {
                        @for p in Priority::ALL {
                            option value=(p.as_str()) selected[input.field("priority") == p.as_str() || (input.field("priority").is_empty() && p == Priority::Normal)] { (p.as_str()) }
                        }
                    }
                }))
                (field("queue", "Queue", "spec.queue", text("queue", "default")))
                (field("payload", "Payload (JSON object)", "spec.payload", html! {
                    textarea id="f-payload" name="payload" rows="3" placeholder="{\"key\": \"value\"}" { (if input.mode == Mode::Form { input.field("payload") } else { "" }) }
                }))
                (field("maxRetries", "Max retries", "spec.retry.maxRetries", text("maxRetries", "3")))
                (field("hardTimeout", "Hard timeout", "spec.timeout.hardSeconds", text("hardTimeout", "600, 10m")))
                div.buttons {
                    button type="submit" name="dry" value="1" { "Check" }
                    button #form-create type="submit" name="dry" value="0" class="primary" { "Create" }
                }
            }
            form #yaml-form .submit-form method="post" action="/submit" {
                h2 { "YAML" }
                (token_field(token))
                input type="hidden" name="mode" value="yaml";
                (namespace_input("yaml"))
                textarea #yaml name="yaml" rows="24" spellcheck="false"
                    class=(if yaml_errors.is_empty() { "yaml" } else { "yaml invalid" }) { (yaml) }
                @if !yaml_errors.is_empty() {
                    ul.errors #yaml-errors { @for e in &yaml_errors {
                        li.field-error { @if let Some(f) = &e.field { code { (f) } ": " } (e.message) }
                    } }
                }
                div.buttons {
                    button #yaml-check type="submit" name="dry" value="1" { "Check" }
                    button #yaml-create type="submit" name="dry" value="0" class="primary" { "Create" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(fields: &[(&str, &str)]) -> Input {
        Input {
            mode: Mode::Form,
            namespace: "team".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            yaml: String::new(),
        }
    }

    #[test]
    fn the_form_makes_the_manifest_kubectl_ax_submit_would() {
        let v = manifest(&form(&[
            ("type", "report"),
            ("image", "busybox"),
            ("command", "echo hi"),
            ("priority", "High"),
            ("payload", r#"{"a": 1}"#),
            ("maxRetries", "2"),
            ("hardTimeout", "1m"),
        ]))
        .unwrap();
        assert_eq!(v["metadata"]["generateName"], "report-");
        assert_eq!(v["metadata"]["namespace"], "team");
        assert_eq!(v["spec"]["priority"], "High");
        assert_eq!(v["spec"]["payload"]["a"], 1);
        assert_eq!(v["spec"]["timeout"]["hardSeconds"], 60);
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["command"],
            serde_json::json!(["sh", "-c", "echo hi"])
        );
    }

    #[test]
    fn bad_input_is_reported_on_its_field() {
        let e = manifest(&form(&[("type", "x"), ("image", "i"), ("payload", "[1]")])).unwrap_err();
        assert_eq!(e[0].field.as_deref(), Some("spec.payload"));
        let e = manifest(&form(&[
            ("type", "x"),
            ("image", "i"),
            ("maxRetries", "many"),
        ]))
        .unwrap_err();
        assert_eq!(e[0].field.as_deref(), Some("spec.retry.maxRetries"));
        let html = render(
            &form(&[("maxRetries", "many")]),
            &Outcome::Errors(e),
            Some("team"),
            "t",
        )
        .into_string();
        assert!(
            html.contains(r#"<div class="field invalid" data-field="maxRetries">"#),
            "{html}"
        );
        assert!(html.contains(r#"value="many""#), "what was typed stays");
    }

    #[test]
    fn yaml_keeps_fields_the_client_does_not_know_for_the_server_to_judge() {
        let input = Input {
            mode: Mode::Yaml,
            namespace: "team".into(),
            fields: vec![],
            yaml: EXAMPLE_YAML.replace("priority: Normal", "priority: Urgent"),
        };
        let v = manifest(&input).unwrap();
        assert_eq!(v["spec"]["priority"], "Urgent");
        assert_eq!(v["metadata"]["namespace"], "team");
        let bad = Input {
            yaml: "a: [".into(),
            ..input.clone()
        };
        assert_eq!(
            manifest(&bad).unwrap_err()[0].field.as_deref(),
            Some("yaml")
        );
        // The operator's own checks: soft timeout not below hard.
        let soft = Input {
            yaml: EXAMPLE_YAML.replace(
                "  retry: {maxRetries: 2}",
                "  timeout: {softSeconds: 90, hardSeconds: 60}",
            ),
            ..input
        };
        let e = manifest(&soft).unwrap_err();
        assert!(e[0].message.contains("softSeconds"), "{e:?}");
    }

    #[test]
    fn a_clone_keeps_the_spec_and_drops_requests_and_ax_labels() {
        let task: AxTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1", "kind": "AxTask",
            "metadata": {"name": "nightly", "namespace": "n", "uid": "u",
                         "labels": {"team": "a", "ax.dev/dag": "d"}},
            "spec": {"type": "report", "rerun": 3, "cancel": true, "template": {}},
            "status": {"phase": "Dead"},
        }))
        .unwrap();
        let doc: Value = crate::yaml::from_str(&clone_yaml(&task)).unwrap();
        assert_eq!(doc["metadata"]["generateName"], "nightly-");
        assert_eq!(doc["metadata"]["labels"], serde_json::json!({"team": "a"}));
        assert_eq!(doc["spec"]["type"], "report");
        assert!(doc["spec"].get("rerun").is_none() && doc["spec"].get("cancel").is_none());
        assert!(doc.get("status").is_none() && doc["metadata"].get("uid").is_none());
    }
}
