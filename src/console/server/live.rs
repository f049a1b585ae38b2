//! The live part of each page, rendered from the store, and the Server-Sent Events stream that
//! sends it again whenever it changes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use maud::{Markup, html};

use super::{App, query_pairs};
use crate::api::{AxDag, AxQueue, AxTask};
use crate::client::ctx::Ctx;
use crate::client::error::{Op, Resource, from_kube};
use crate::client::task::pod_info;
use crate::console::html::problem;
use crate::console::pages::{dags, dashboard, queues, task, tasks};
use crate::core::worker::{LABEL_TASK, label_value};

/// A page's live part, rebuilt by the SSE stream for each change.
#[derive(Clone, Debug)]
pub(super) enum View {
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
pub(super) async fn live(
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

/// A live view as Server-Sent Events: its live part now, then again whenever the data changed
/// (bursts coalesced) or every 10 s (ages move on), each time it differs from the last one sent.
pub(super) async fn events(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
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
