//! The console's HTTP server (client required): routes, the guard every request passes (token,
//! Origin, security headers), the pages assembled from the store, the live views as Server-Sent
//! Events, and the actions. Rendering is in `pages`, decisions about requests in `security`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams, LogParams, PostParams};
use kube::{Api, ResourceExt};
use maud::{Markup, html};

use crate::api::{AxDag, AxQueue, AxTask};
use crate::client::ctx::Ctx;
use crate::client::error::{ClientError, Op, Resource, from_kube};
use crate::client::operator;
use crate::client::rerun::FIELD_MANAGER;
use crate::client::task::{main_container, pod_info};
use crate::core::worker::{LABEL_TASK, label_value, pod_name};

use super::actions::{self, Action};
use super::html::{Notice, Page, Section, page, problem, task_href};
use super::pages::submit::{FieldError, Input, Mode, Outcome};
use super::pages::{dags, dashboard, queues, submit, task, tasks};
use super::security::{self, RequestFacts};
use super::store::Store;

/// Largest request body (a YAML manifest with a large payload).
const BODY_LIMIT: usize = 2 * 1024 * 1024;
/// How long a page waits for the first list of the data it shows.
const SYNC_WAIT: Duration = Duration::from_secs(10);
/// How long a worker's log may take to arrive (a node that does not answer must not hang the page).
const LOGS_WAIT: Duration = Duration::from_secs(10);
/// How long the page of a task just created waits for the watch to bring it.
const APPEAR_WAIT: Duration = Duration::from_secs(5);

pub struct App {
    pub ctx: Ctx,
    pub store: Arc<Store>,
    pub token: String,
    /// Notices waiting for the page an action redirects to, by id.
    flashes: Mutex<HashMap<String, Vec<Notice>>>,
    /// "namespace x" or "all namespaces".
    pub scope: String,
}

impl App {
    pub fn new(ctx: Ctx, store: Arc<Store>, token: String) -> Arc<App> {
        let scope = match &store.scope {
            Some(ns) => format!("namespace {ns}"),
            None => "all namespaces".into(),
        };
        Arc::new(App {
            ctx,
            store,
            token,
            flashes: Mutex::default(),
            scope,
        })
    }

    fn frame(&self, title: String, section: Section, notices: &[Notice]) -> Page<'_> {
        Page {
            title,
            section,
            token: &self.token,
            scope: &self.scope,
            notices: notices.to_vec(),
            head: html! {},
            live: None,
            tail: html! {},
        }
    }

    fn take_flash(&self, pairs: &[(String, String)]) -> Vec<Notice> {
        let Some(id) = pairs.iter().find(|(k, _)| k == "flash").map(|(_, v)| v) else {
            return Vec::new();
        };
        self.flashes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
            .unwrap_or_default()
    }

    fn put_flash(&self, notices: Vec<Notice>) -> String {
        let id = format!("{:016x}", rand::random::<u64>());
        let mut flashes = self.flashes.lock().unwrap_or_else(|e| e.into_inner());
        // A flash nobody fetched (a closed tab) should not pile up forever.
        if flashes.len() > 200 {
            flashes.clear();
        }
        flashes.insert(id.clone(), notices);
        id
    }

    /// Waits until the first list of `resource` arrived (or failed), at most `SYNC_WAIT`.
    async fn synced(&self, resource: Resource) {
        let mut rx = self.store.subscribe();
        let deadline = tokio::time::Instant::now() + SYNC_WAIT;
        loop {
            {
                let d = self.store.read();
                if d.synced.contains(&resource) || d.problems.contains_key(&resource) {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { redirect("/tasks") }))
        .route("/tasks", get(tasks_page))
        .route("/tasks/{ns}/{name}", get(task_page))
        .route("/tasks/{ns}/{name}/logs", get(logs_page))
        .route("/queues", get(queues_page))
        .route("/dags", get(dags_page))
        .route("/dags/{ns}/{name}", get(dag_page))
        .route("/dashboard", get(dashboard_page))
        .route("/submit", get(submit_page).post(submit_post))
        .route("/actions/cancel", post(cancel))
        .route("/actions/retry", post(retry))
        .route("/events", get(events))
        .route(
            "/assets/console.css",
            get(|| async { asset("text/css", super::html::CSS) }),
        )
        .route(
            "/assets/console.js",
            get(|| async { asset("text/javascript", super::html::JS) }),
        )
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn redirect(to: &str) -> Response {
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, to)
        .body(Body::empty())
        // Only a target that is no header value fails (`safe_return` keeps control characters out).
        .unwrap_or_else(|_| StatusCode::BAD_REQUEST.into_response())
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Every request: the token (cookie, URL, or for changes the form or header) and, for changes,
/// our own Origin. A first visit with `?token=` gets the cookie and is sent on without it.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let state_changing = !matches!(*request.method(), Method::GET | Method::HEAD);
    let query = query_pairs(request.uri().query());
    let url_token = query
        .iter()
        .find(|(k, _)| k == security::FORM_FIELD)
        .map(|(_, v)| v.clone());
    let headers = request.headers().clone();
    let host = header_str(&headers, header::HOST);
    let origin = header_str(&headers, header::ORIGIN);
    let cookie_token = header_str(&headers, header::COOKIE)
        .and_then(|c| security::cookie_value(c, security::COOKIE));
    let header_token = header_str(&headers, header::HeaderName::from_static(security::HEADER));
    let mut response = if state_changing {
        let (parts, body) = request.into_parts();
        let Ok(bytes) = to_bytes(body, BODY_LIMIT).await else {
            return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
        };
        let form_token = form_urlencoded::parse(&bytes)
            .find(|(k, _)| k == security::FORM_FIELD)
            .map(|(_, v)| v.into_owned());
        let facts = RequestFacts {
            state_changing,
            host,
            origin,
            cookie_token,
            presented_token: header_token.or(form_token.as_deref()),
        };
        if let Err(refusal) = security::check(&facts, &app.token) {
            tracing::warn!(%refusal, path = %parts.uri.path(), "refused a request");
            return secured((StatusCode::FORBIDDEN, refusal.to_string()).into_response());
        }
        next.run(Request::from_parts(parts, Body::from(bytes)))
            .await
    } else {
        let facts = RequestFacts {
            state_changing,
            host,
            origin,
            cookie_token,
            presented_token: url_token.as_deref(),
        };
        if let Err(refusal) = security::check(&facts, &app.token) {
            return secured((StatusCode::FORBIDDEN, refusal.to_string()).into_response());
        }
        if url_token.is_some() {
            // Set the cookie and take the token out of the address bar (and of any Referer).
            let rest: Vec<(String, String)> = query
                .into_iter()
                .filter(|(k, _)| k != security::FORM_FIELD)
                .collect();
            let mut to = request.uri().path().to_string();
            if !rest.is_empty() {
                to.push('?');
                to.push_str(
                    &form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(rest)
                        .finish(),
                );
            }
            let mut r = redirect(security::safe_return(&to));
            let cookie = format!(
                "{}={}; HttpOnly; SameSite=Strict; Path=/",
                security::COOKIE,
                app.token
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        } else {
            next.run(request).await
        }
    };
    response = secured(response);
    response
}

/// Headers that keep the console's pages to themselves: no framing by other sites, no inline
/// script, no caching of what was shown.
fn secured(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: with it, browsers send `Origin: null` on the console's own form posts
    // (Fetch, "serialize a request origin"), which the Origin check must refuse.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// A page's live part, rebuilt by the SSE stream for each change.
#[derive(Clone, Debug)]
enum View {
    Tasks(tasks::TaskQuery),
    Task(String, String),
    Queues,
    Dags,
    Dag(String, String),
    Dashboard,
}

fn parse_view(path_and_query: &str) -> Option<View> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|s| {
            form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    Some(match parts.as_slice() {
        ["tasks"] => View::Tasks(tasks::TaskQuery::parse(&query_pairs(Some(query)))),
        ["tasks", ns, name] => View::Task(ns.to_string(), name.to_string()),
        ["queues"] => View::Queues,
        ["dags"] => View::Dags,
        ["dags", ns, name] => View::Dag(ns.to_string(), name.to_string()),
        ["dashboard"] => View::Dashboard,
        _ => return None,
    })
}

/// The worker pods of a task, or why they cannot be read (e.g. RBAC).
async fn worker_pods(ctx: &Ctx, ns: &str, task: &str) -> task::Pods {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let op = Op::new("list", Resource::Pod).namespace(Some(ns));
    api.list(&ListParams::default().labels(&format!("{LABEL_TASK}={}", label_value(task))))
        .await
        .map(|l| l.items.iter().filter_map(pod_info).collect())
        .map_err(|e| from_kube(&op, e).to_string())
}

fn many_namespaces(app: &App) -> bool {
    app.store.scope.is_none()
}

/// The live part of `view`, and for the task view the pods read for it (reused while the task
/// has not changed).
async fn live(
    app: &App,
    view: &View,
    now: Timestamp,
    pods: &mut Option<(String, task::Pods)>,
) -> Markup {
    let (resource, problem_first) = match view {
        View::Tasks(_) | View::Task(..) | View::Dashboard => (Resource::Task, true),
        View::Queues => (Resource::Queue, true),
        View::Dags | View::Dag(..) => (Resource::Dag, true),
    };
    let issue = problem_first
        .then(|| app.store.read().problems.get(&resource).cloned())
        .flatten();
    let body = match view {
        View::Tasks(q) => {
            let d = app.store.read();
            let shown = tasks::select(d.tasks.values(), q);
            tasks::table(q, &shown, now, many_namespaces(app))
        }
        View::Task(ns, name) => {
            let found = app
                .store
                .read()
                .tasks
                .get(&(ns.clone(), name.clone()))
                .cloned();
            match found {
                None => problem(&format!(
                    "axtask \"{name}\" is not in namespace \"{ns}\" (deleted, or not visible to you)"
                )),
                Some(t) => {
                    let version = t.resource_version().unwrap_or_default();
                    let fresh = match pods {
                        Some((v, p)) if *v == version => p.clone(),
                        _ => {
                            let p = worker_pods(&app.ctx, ns, name).await;
                            *pods = Some((version, p.clone()));
                            p
                        }
                    };
                    task::render(&t, &fresh, now, &app.token)
                }
            }
        }
        View::Queues => {
            let d = app.store.read();
            let qs: Vec<&AxQueue> = d.queues.values().collect();
            let ts: Vec<&AxTask> = d.tasks.values().collect();
            let task_problem = d.problems.get(&Resource::Task).cloned();
            html! {
                @if let Some(p) = task_problem { (problem(&p)) }
                (queues::render(&qs, &ts, &format!("in {}", app.scope), now))
            }
        }
        View::Dags => {
            let d = app.store.read();
            let ds: Vec<&AxDag> = d.dags.values().collect();
            dags::list(&ds, now, many_namespaces(app))
        }
        View::Dag(ns, name) => {
            let d = app.store.read();
            match d.dags.get(&(ns.clone(), name.clone())) {
                Some(dag) => dags::page(dag, now),
                None => problem(&format!(
                    "axdag \"{name}\" is not in namespace \"{ns}\" (deleted, or not visible to you)"
                )),
            }
        }
        View::Dashboard => {
            let d = app.store.read();
            let ts: Vec<&AxTask> = d.tasks.values().collect();
            dashboard::render(&ts, &format!("in {}", app.scope), now)
        }
    };
    html! {
        @if let Some(p) = issue { (problem(&p)) }
        (body)
    }
}

async fn render_view(
    app: &App,
    view: View,
    title: String,
    section: Section,
    notices: Vec<Notice>,
    head: Markup,
) -> Response {
    let resource = match view {
        View::Queues => Resource::Queue,
        View::Dags | View::Dag(..) => Resource::Dag,
        _ => Resource::Task,
    };
    app.synced(resource).await;
    if matches!(view, View::Queues) {
        app.synced(Resource::Task).await;
    }
    if let View::Task(ns, name) = &view {
        // Right after a create (the Submit page redirects here) the watch may not have it yet.
        let key = (ns.clone(), name.clone());
        let deadline = tokio::time::Instant::now() + APPEAR_WAIT;
        let mut rx = app.store.subscribe();
        loop {
            // The read guard ends with this condition, before any await.
            if app.store.read().tasks.contains_key(&key) {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
    }
    let live = live(app, &view, Timestamp::now(), &mut None).await;
    let mut p = app.frame(title, section, &notices);
    p.head = head;
    p.live = Some(live);
    page(p).into_response()
}

async fn tasks_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let pairs = query_pairs(q.as_deref());
    let notices = app.take_flash(&pairs);
    let query = tasks::TaskQuery::parse(&pairs);
    app.synced(Resource::Task).await;
    let head = {
        let d = app.store.read();
        let all: Vec<&AxTask> = d.tasks.values().collect();
        let here = format!("/tasks?{}", query.to_query(query.sort, query.descending));
        tasks::head(&query, &all, &app.token, &here)
    };
    render_view(
        &app,
        View::Tasks(query),
        "Tasks".into(),
        Section::Tasks,
        notices,
        head,
    )
    .await
}

async fn task_page(
    State(app): State<Arc<App>>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Response {
    let notices = app.take_flash(&query_pairs(q.as_deref()));
    render_view(
        &app,
        View::Task(ns, name.clone()),
        name,
        Section::Tasks,
        notices,
        html! {},
    )
    .await
}

async fn queues_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let notices = app.take_flash(&query_pairs(q.as_deref()));
    render_view(
        &app,
        View::Queues,
        "Queues".into(),
        Section::Queues,
        notices,
        html! { h1 { "Queues" } },
    )
    .await
}

async fn dags_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let notices = app.take_flash(&query_pairs(q.as_deref()));
    render_view(
        &app,
        View::Dags,
        "DAGs".into(),
        Section::Dags,
        notices,
        html! { h1 { "DAGs" } },
    )
    .await
}

async fn dag_page(
    State(app): State<Arc<App>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    render_view(
        &app,
        View::Dag(ns, name.clone()),
        name,
        Section::Dags,
        Vec::new(),
        html! {},
    )
    .await
}

async fn dashboard_page(State(app): State<Arc<App>>) -> Response {
    render_view(
        &app,
        View::Dashboard,
        "Dashboard".into(),
        Section::Dashboard,
        Vec::new(),
        html! { h1 { "Dashboard" } },
    )
    .await
}

async fn logs_page(
    State(app): State<Arc<App>>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> Response {
    let pairs = query_pairs(q.as_deref());
    let found = app
        .store
        .read()
        .tasks
        .get(&(ns.clone(), name.clone()))
        .cloned();
    let current = found
        .as_ref()
        .and_then(|t| t.status.as_ref())
        .map_or(1, |s| s.attempt.max(1));
    let attempt = pairs
        .iter()
        .find(|(k, _)| k == "attempt")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(current);
    let pod = found
        .as_ref()
        .and_then(|t| t.status.as_ref())
        .and_then(|s| s.attempts.iter().find(|a| a.attempt == attempt))
        .map(|a| a.pod.clone())
        .unwrap_or_else(|| pod_name(&name, attempt));
    let pods: Api<Pod> = Api::namespaced(app.ctx.client.clone(), &ns);
    let text = match pods.get(&pod).await {
        Err(e) => Err(from_kube(
            &Op::new("get", Resource::Pod)
                .namespace(Some(&ns))
                .name(&pod),
            e,
        )
        .to_string()),
        Ok(p) => {
            let params = LogParams {
                container: main_container(&p),
                tail_lines: Some(5000),
                ..LogParams::default()
            };
            match tokio::time::timeout(LOGS_WAIT, pods.logs(&pod, &params)).await {
                Err(_) => Err(format!(
                    "the kubelet of pod {pod} did not answer within {}s",
                    LOGS_WAIT.as_secs()
                )),
                Ok(read) => read.map_err(|e| {
                    from_kube(
                        &Op::new("get", Resource::PodLog)
                            .namespace(Some(&ns))
                            .name(&pod),
                        e,
                    )
                    .to_string()
                }),
            }
        }
    };
    let mut p = app.frame(format!("Logs of {name}"), Section::Tasks, &[]);
    p.head = task::logs(&ns, &name, attempt, &text);
    page(p).into_response()
}

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

async fn cancel(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    act(&app, Action::Cancel, &body).await
}

async fn retry(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    act(&app, Action::Retry, &body).await
}

fn submit_response(app: &App, input: &Input, outcome: &Outcome, status: StatusCode) -> Response {
    let mut p = app.frame("Submit".into(), Section::Submit, &[]);
    p.head = submit::render(input, outcome, app.store.scope.as_deref(), &app.token);
    (status, page(p)).into_response()
}

async fn submit_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
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

async fn submit_post(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
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

/// A live view as Server-Sent Events: its live part now, then again whenever the data changed
/// (bursts coalesced) or every 10 s (ages move on), each time it differs from the last one sent.
async fn events(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let pairs = query_pairs(q.as_deref());
    let Some(view) = pairs
        .iter()
        .find(|(k, _)| k == "view")
        .and_then(|(_, v)| parse_view(v))
    else {
        return (StatusCode::NOT_FOUND, "no such view").into_response();
    };
    let mut rx = app.store.subscribe();
    rx.borrow_and_update();
    struct S {
        app: Arc<App>,
        view: View,
        rx: tokio::sync::watch::Receiver<u64>,
        last: Option<String>,
        pods: Option<(String, task::Pods)>,
    }
    let state = S {
        app,
        view,
        rx,
        last: None,
        pods: None,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.last.is_some() {
                tokio::select! {
                    changed = s.rx.changed() => if changed.is_err() { return None; },
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {},
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
                s.rx.borrow_and_update();
            }
            let html = live(&s.app, &s.view, Timestamp::now(), &mut s.pods)
                .await
                .into_string();
            if s.last.as_deref() != Some(html.as_str()) {
                let event = Event::default().event("live").data(&html);
                s.last = Some(html);
                return Some((Ok::<_, Infallible>(event), s));
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_parsed_from_the_page_address() {
        assert!(
            matches!(parse_view("/tasks?phase=Dead"), Some(View::Tasks(q)) if q.phases == ["Dead"])
        );
        assert!(
            matches!(parse_view("/tasks/a/b"), Some(View::Task(ns, n)) if ns == "a" && n == "b")
        );
        assert!(matches!(parse_view("/dags/a/b%2Dc"), Some(View::Dag(_, n)) if n == "b-c"));
        assert!(matches!(parse_view("/queues"), Some(View::Queues)));
        assert!(parse_view("/submit").is_none());
        assert!(parse_view("/tasks/a").is_none());
    }
}
