//! The pages that show what the store holds (tasks, a task and its logs, queues, DAGs, the
//! dashboard): each waits for its data, then renders its frame around its live part.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use maud::{Markup, html};

use super::live::{View, live};
use super::{App, query_pairs};
use crate::api::AxTask;
use crate::client::error::{Op, Resource, from_kube};
use crate::client::task::main_container;
use crate::console::html::{Notice, Section, page};
use crate::console::pages::{task, tasks};
use crate::core::worker::pod_name;

/// How long a worker's log may take to arrive (a node that does not answer must not hang the page).
const LOGS_WAIT: Duration = Duration::from_secs(10);
/// How long the page of a task just created waits for the watch to bring it.
const APPEAR_WAIT: Duration = Duration::from_secs(5);

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

pub(super) async fn tasks_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
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

pub(super) async fn task_page(
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

pub(super) async fn queues_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
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

pub(super) async fn dags_page(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
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

pub(super) async fn dag_page(
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

pub(super) async fn dashboard_page(State(app): State<Arc<App>>) -> Response {
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

pub(super) async fn logs_page(
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
