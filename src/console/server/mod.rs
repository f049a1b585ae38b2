//! The console's HTTP server (client required): the state the handlers share and the routes.
//! Every request passes the guard (`guard`: token, Origin, security headers); the pages are
//! assembled from the store (`browse`), their live parts re-sent as Server-Sent Events (`live`),
//! and the actions and the Submit form change the cluster (`changes`). Rendering is in `pages`,
//! decisions about requests in `security`.

mod browse;
mod changes;
mod guard;
mod live;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::html;

use crate::client::ctx::Ctx;
use crate::client::error::Resource;

use super::html::{Notice, Page, Section};
use super::store::Store;
use browse::{dag_page, dags_page, dashboard_page, logs_page, queues_page, task_page, tasks_page};
use changes::{cancel, retry, submit_page, submit_post};
use guard::guard;
use live::events;

/// How long a page waits for the first list of the data it shows.
const SYNC_WAIT: Duration = Duration::from_secs(10);

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
