//! The handlers that change the cluster: the Cancel and Retry buttons, and the Submit form that
//! creates a task (or only validates it, dry run).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, ResourceExt};

use super::{App, query_pairs, redirect};
use crate::api::AxTask;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::operator;
use crate::client::rerun::FIELD_MANAGER;
use crate::console::actions::{self, Action};
use crate::console::html::{Notice, Section, page, task_href};
use crate::console::pages::submit::{self, FieldError, Input, Mode, Outcome};
use crate::console::security;

fn form_pairs(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body).into_owned().collect()
}

async fn act(app: &App, action: Action, body: &[u8]) -> Response {
    let pairs = form_pairs(body);
    let targets: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "task")
        .map(|(_, v)| v.clone())
        .collect();
    let back = pairs
        .iter()
        .find(|(k, _)| k == "return")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/tasks");
    let back = security::safe_return(back).to_string();
    let notices = actions::run(&app.ctx, action, &targets).await;
    let id = app.put_flash(notices);
    let sep = if back.contains('?') { '&' } else { '?' };
    redirect(&format!("{back}{sep}flash={id}"))
}

pub(super) async fn cancel(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    act(&app, Action::Cancel, &body).await
}

pub(super) async fn retry(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    act(&app, Action::Retry, &body).await
}

fn submit_response(app: &App, input: &Input, outcome: &Outcome, status: StatusCode) -> Response {
    let mut p = app.frame("Submit".into(), Section::Submit, &[]);
    p.head = submit::render(input, outcome, app.store.scope.as_deref(), &app.token);
    (status, page(p)).into_response()
}

pub(super) async fn submit_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let pairs = query_pairs(q.as_deref());
    let default_ns = app
        .store
        .scope
        .clone()
        .unwrap_or_else(|| app.ctx.namespace.clone());
    let mut input = Input {
        namespace: default_ns,
        ..Input::default()
    };
    let mut outcome = Outcome::Nothing;
    if let Some(from) = pairs.iter().find(|(k, _)| k == "from").map(|(_, v)| v) {
        app.synced(Resource::Task).await;
        let source =
            actions::parse_target(from).and_then(|key| app.store.read().tasks.get(&key).cloned());
        match source {
            Some(t) => {
                input.mode = Mode::Yaml;
                input.yaml = submit::clone_yaml(&t);
                input.namespace = t.namespace().unwrap_or(input.namespace);
            }
            None => {
                outcome = Outcome::Errors(vec![FieldError::general(format!(
                    "no task {from} to clone"
                ))]);
            }
        }
    }
    submit_response(&app, &input, &outcome, StatusCode::OK)
}

/// The API server's verdict on a refused create, field by field where it says which.
fn api_errors(e: ClientError, kube_error: Option<&kube::Error>) -> Vec<FieldError> {
    if let Some(kube::Error::Api(status)) = kube_error
        && status.code == 422
    {
        let causes: Vec<FieldError> = status
            .details
            .iter()
            .flat_map(|d| &d.causes)
            .map(|c| FieldError {
                field: (!c.field.is_empty()).then(|| c.field.clone()),
                message: c.message.clone(),
            })
            .collect();
        if !causes.is_empty() {
            return causes;
        }
        return vec![FieldError::general(status.message.clone())];
    }
    let text = match &e {
        ClientError::Forbidden { .. } => format!("not allowed — {e}"),
        _ => e.to_string(),
    };
    vec![FieldError::general(text)]
}

pub(super) async fn submit_post(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let pairs = form_pairs(&body);
    let default_ns = app
        .store
        .scope
        .clone()
        .unwrap_or_else(|| app.ctx.namespace.clone());
    let input = Input::parse(&pairs, &default_ns);
    if let Some(fixed) = &app.store.scope
        && input.namespace != *fixed
    {
        let outcome = Outcome::Errors(vec![FieldError::general(format!(
            "this console works in namespace {fixed}"
        ))]);
        return submit_response(&app, &input, &outcome, StatusCode::UNPROCESSABLE_ENTITY);
    }
    let dry = pairs.iter().any(|(k, v)| k == "dry" && v == "1");
    let value = match submit::manifest(&input) {
        Ok(v) => v,
        Err(errors) => {
            return submit_response(
                &app,
                &input,
                &Outcome::Errors(errors),
                StatusCode::UNPROCESSABLE_ENTITY,
            );
        }
    };
    if !dry && let Err(e) = operator::check(&app.ctx).await {
        let outcome = Outcome::Errors(vec![FieldError::general(format!(
            "Nothing was created: {e}"
        ))]);
        return submit_response(&app, &input, &outcome, StatusCode::SERVICE_UNAVAILABLE);
    }
    let object: DynamicObject = match serde_json::from_value(value) {
        Ok(o) => o,
        Err(e) => {
            let outcome = Outcome::Errors(vec![FieldError::general(format!(
                "not a Kubernetes object: {e}"
            ))]);
            return submit_response(&app, &input, &outcome, StatusCode::UNPROCESSABLE_ENTITY);
        }
    };
    let resource = ApiResource::erase::<AxTask>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(app.ctx.client.clone(), &input.namespace, &resource);
    let params = PostParams {
        dry_run: dry,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let op = Op::new("create", Resource::Task).namespace(Some(&input.namespace));
    match api.create(&params, &object).await {
        Ok(_) if dry => submit_response(&app, &input, &Outcome::Valid, StatusCode::OK),
        Ok(created) => {
            let name = created.name_any();
            let id = app.put_flash(vec![Notice {
                ok: true,
                text: format!("axtask/{name} created in {}", input.namespace),
            }]);
            redirect(&format!(
                "{}?flash={id}",
                task_href(&input.namespace, &name)
            ))
        }
        Err(e) => {
            let errors = match &e {
                kube::Error::Api(status) if status.code == 422 => {
                    api_errors(ClientError::Usage(String::new()), Some(&e))
                }
                _ => api_errors(from_kube(&op, e), None),
            };
            submit_response(
                &app,
                &input,
                &Outcome::Errors(errors),
                StatusCode::UNPROCESSABLE_ENTITY,
            )
        }
    }
}
