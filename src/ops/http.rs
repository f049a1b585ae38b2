//! The operator's HTTP endpoints on :8080 (DESIGN §6): `/metrics`, `/healthz`, `/readyz`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};

/// What the HTTP endpoints read. Cheap to clone; the controllers flip the readiness flags.
#[derive(Clone, Debug)]
pub struct HttpState {
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
}

#[derive(Debug, Default)]
struct Readiness {
    caches_synced: AtomicBool,
    role_known: AtomicBool,
}

impl HttpState {
    /// Starts not ready: caches not synced, leader/standby role unknown.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        HttpState {
            metrics,
            readiness: Arc::default(),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The informer caches the controllers read have completed their initial list.
    pub fn set_caches_synced(&self, synced: bool) {
        self.readiness
            .caches_synced
            .store(synced, Ordering::Release);
    }

    /// Leader election has determined whether this replica is the leader or a standby.
    pub fn set_role_known(&self, known: bool) {
        self.readiness.role_known.store(known, Ordering::Release);
    }

    /// `Ok` when ready, else why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        if !self.readiness.role_known.load(Ordering::Acquire) {
            Err("leader election role not known")
        } else if !self.readiness.caches_synced.load(Ordering::Acquire) {
            Err("caches not synced")
        } else {
            Ok(())
        }
    }
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `addr` and serves until the process ends.
pub async fn serve(addr: SocketAddr, state: HttpState) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    serve_listener(listener, state, std::future::pending()).await
}

/// Serves on an already bound listener until `shutdown` resolves, then lets open requests finish.
pub async fn serve_listener(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(State(state): State<HttpState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> Response {
    match state.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use std::time::Duration;
    use tokio::sync::oneshot;

    struct TestServer {
        base: String,
        stop: Option<oneshot::Sender<()>>,
        server: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    async fn start(state: HttpState) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve_listener(listener, state, async {
            let _ = stopped.await;
        }));
        TestServer {
            base,
            stop: Some(stop),
            server,
        }
    }

    async fn fetch(base: &str, path: &str) -> (StatusCode, Option<String>, String) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let uri = format!("{base}{path}").parse().expect("uri");
        let response = tokio::time::timeout(Duration::from_secs(30), client.get(uri))
            .await
            .expect("response within 30 s")
            .expect("request");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (
            status,
            content_type,
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    #[tokio::test]
    async fn endpoints_over_a_real_socket() {
        let metrics = Arc::new(Metrics::new());
        metrics.set_leader(true);
        let state = HttpState::new(metrics);
        let mut server = start(state.clone()).await;

        let (status, content_type, body) = fetch(&server.base, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type.as_deref(), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(body.contains("\nax_leader 1\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");

        let (status, _, body) = fetch(&server.base, "/healthz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));

        let (status, _, body) = fetch(&server.base, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "leader election role not known\n"
            )
        );
        state.set_role_known(true);
        let (status, _, body) = fetch(&server.base, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n")
        );
        state.set_caches_synced(true);
        let (status, _, body) = fetch(&server.base, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
        state.set_caches_synced(false);
        let (status, _, _) = fetch(&server.base, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

        let (status, _, _) = fetch(&server.base, "/nothing-here").await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        if let Some(stop) = server.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(30), &mut server.server)
            .await
            .expect("server stops on shutdown")
            .expect("server task");
        assert!(result.is_ok(), "{result:?}");
    }
}
