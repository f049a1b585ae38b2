//! Delivery of `spec.callback`: POST the final status, retry a few times with backoff, and hand the
//! outcome to the task's reconcile, which records it as the `CallbackDelivered` condition. Never
//! changes the task's phase.
//!
//! The destination is checked before anything is sent (`core::egress`): a host that is, or resolves
//! to, a loopback, link-local, private or reserved address the allowlist does not admit is refused
//! (`CallbackDelivered=False`, reason `CallbackRefused`, a Warning Event) without a connection. The
//! connector's resolver checks again on every connection, so a name that changes its answer in
//! between (DNS rebinding) is refused too. Redirects are never followed: a 3xx is a failed POST.

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tokio::sync::Semaphore;
use tracing::{Instrument, info, warn};

use super::{Ctx, TaskKey};
use crate::api::AxTask;
use crate::core::egress::{Allowlist, Refusal, admit, admit_all};
use crate::core::task::CallbackResult;
use crate::core::trace;
use crate::ops::metrics::Metrics;

const ATTEMPTS: u32 = 4;
const FIRST_DELAY: Duration = Duration::from_millis(500);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Deliveries under way at once. Each holds a connection for up to ~23 s (four attempts with
/// backoff) to a receiver that may be slow or down: unbounded, a burst of finished tasks would open
/// a socket and a task per callback. At this bound a receiver that answers only after its timeout
/// still takes ~3 deliveries a second; the rest wait for a permit in order (tokio's semaphore is
/// fair), off the reconcile path.
const MAX_DELIVERIES: usize = 64;

/// Reason of the `CallbackDelivered=False` condition and the Warning Event of a refused destination.
pub const REASON_REFUSED: &str = "CallbackRefused";

type Https = hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>;

pub struct Callbacks {
    /// Tasks whose callback is being delivered, so a reconcile meanwhile does not send it twice.
    in_flight: Mutex<HashSet<TaskKey>>,
    http: HttpClient<Https, Full<Bytes>>,
    allow: Arc<Allowlist>,
    /// One permit per delivery under way ([`MAX_DELIVERIES`]).
    permits: Semaphore,
}

/// How one delivery ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Delivered(String),
    /// With the class of the last attempt's failure (the `class` label of
    /// `ax_callback_failures_total`).
    Failed(String, &'static str),
    /// The destination is not admitted: nothing was sent.
    Refused(String),
}

impl Callbacks {
    /// `allow` admits destinations beyond public addresses (`--callback-allow`).
    pub fn new(allow: Allowlist) -> std::io::Result<Self> {
        Self::with_limit(allow, MAX_DELIVERIES)
    }

    /// At most `deliveries` under way at once.
    fn with_limit(allow: Allowlist, deliveries: usize) -> std::io::Result<Self> {
        let builder = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
            Ok(builder) => builder,
            Err(e) => {
                // A minimal image may have no CA bundle: plain HTTP callbacks still work, and an
                // HTTPS one fails with a certificate error recorded on the task's condition.
                warn!(error = %e, "no system CA certificates; HTTPS callbacks will fail verification");
                let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
                let tls = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(std::io::Error::other)?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
            }
        };
        let allow = Arc::new(allow);
        let mut http = HttpConnector::new_with_resolver(GuardedResolver {
            allow: allow.clone(),
        });
        http.enforce_http(false);
        http.set_connect_timeout(Some(REQUEST_TIMEOUT));
        let https = builder.https_or_http().enable_http1().wrap_connector(http);
        Ok(Callbacks {
            in_flight: Mutex::new(HashSet::new()),
            http: HttpClient::builder(TokioExecutor::new()).build(https),
            allow,
            permits: Semaphore::new(deliveries),
        })
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<TaskKey>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers the callback in the background, once at a time per task; it waits for a permit
    /// while [`MAX_DELIVERIES`] are under way (the caller does not).
    pub fn send(&self, task: Arc<AxTask>, ctx: Ctx) {
        let key = super::task_key(task.as_ref());
        if !self.in_flight().insert(key.clone()) {
            return;
        }
        // Its log lines name the task and its trace, like the reconcile's.
        let span = tracing::info_span!(
            "callback",
            namespace = task.namespace(),
            name = task.name_any(),
            trace_id = task
                .status
                .as_ref()
                .and_then(|s| s.trace.as_ref())
                .map(|t| t.trace_id.clone())
        );
        tokio::spawn(
            async move {
                let started = jiff::Timestamp::now();
                let outcome = ctx.callbacks.deliver_in_turn(&task).await;
                record_span(&task, started, &outcome, &ctx);
                if let Outcome::Refused(message) = &outcome {
                    ctx.events
                        .publish(task.as_ref(), EventType::Warning, REASON_REFUSED, message);
                }
                count(&ctx.metrics, &outcome);
                let (result, message) = match outcome {
                    Outcome::Delivered(m) => (CallbackResult::Delivered, m),
                    Outcome::Failed(m, _) => (CallbackResult::Failed, m),
                    Outcome::Refused(m) => (CallbackResult::Refused, m),
                };
                ctx.tracking.callback_done(&key, result, message);
                ctx.callbacks.in_flight().remove(&key);
                ctx.wake(&key);
            }
            .instrument(span),
        );
    }

    /// [`Self::deliver`] once a permit is free.
    async fn deliver_in_turn(&self, task: &AxTask) -> Outcome {
        // Never closed, so acquiring fails only if it were.
        let _permit = self.permits.acquire().await;
        self.deliver(task).await
    }

    async fn deliver(&self, task: &AxTask) -> Outcome {
        let Some(url) = task.spec.callback.as_ref().map(|c| c.url.clone()) else {
            return Outcome::Failed("no callback URL".into(), "no_url");
        };
        if let Err(refusal) = self.check_destination(&url).await {
            warn!(url, %refusal, "callback refused");
            return Outcome::Refused(format!("POST {url} refused: {refusal}"));
        }
        let body = serde_json::json!({
            "apiVersion": AxTask::api_version(&()),
            "kind": AxTask::kind(&()),
            "metadata": {"name": task.name_any(), "namespace": task.namespace(), "uid": task.uid()},
            "status": task.status,
        });
        let body = Bytes::from(body.to_string());
        // The receiver's spans join the task's trace, under the delivery's span.
        let traceparent = task.status.as_ref().and_then(|s| {
            let uid = task.uid()?;
            Some(trace::callback_traceparent(
                s.trace.as_ref()?,
                &uid,
                s.observed_rerun,
            ))
        });
        let mut delay = FIRST_DELAY;
        let (mut last, mut last_class) = (String::new(), "");
        for attempt in 1..=ATTEMPTS {
            match self.post(&url, body.clone(), traceparent.as_deref()).await {
                Ok(code) if (200..300).contains(&code) => {
                    info!(url, code, attempt, "callback delivered");
                    return Outcome::Delivered(format!(
                        "POST {url} answered {code} (attempt {attempt})"
                    ));
                }
                Ok(code) => {
                    last = format!("POST {url} answered {code}");
                    last_class = status_class(code);
                }
                Err((class, e)) => {
                    last = format!("POST {url} failed: {e}");
                    last_class = class;
                }
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
        warn!(url, "callback not delivered: {last}");
        Outcome::Failed(format!("{last} (after {ATTEMPTS} attempts)"), last_class)
    }

    /// Refuses a destination the allowlist does not admit: the address itself, or every address
    /// its host resolves to. A URL that does not parse or a name that does not resolve is left to
    /// the POST, which fails with that error.
    async fn check_destination(&self, url: &str) -> Result<(), Refusal> {
        let Ok(uri) = url.parse::<hyper::Uri>() else {
            return Ok(());
        };
        let Some(host) = uri.host() else {
            return Ok(());
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return admit(&self.allow, host, ip);
        }
        let port = uri.port_u16().unwrap_or(80);
        match tokio::net::lookup_host((bare, port)).await {
            Ok(addrs) => admit_all(&self.allow, bare, addrs.map(|a| a.ip())),
            Err(_) => Ok(()),
        }
    }

    /// The status code, or the failure's class and message.
    async fn post(
        &self,
        url: &str,
        body: Bytes,
        traceparent: Option<&str>,
    ) -> Result<u16, (&'static str, String)> {
        let mut request = hyper::Request::post(url)
            .header("content-type", "application/json")
            .header("user-agent", "ax-operator");
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| ("invalid_url", e.to_string()))?;
        match tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(request)).await {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            // Includes names that do not resolve and destinations the resolver refuses.
            Ok(Err(e)) if e.is_connect() => Err(("connect", e.to_string())),
            Ok(Err(e)) => Err(("protocol", e.to_string())),
            Err(_) => Err((
                "timeout",
                format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
            )),
        }
    }
}

/// The delivery's span, when the task is traced.
fn record_span(task: &AxTask, started: jiff::Timestamp, outcome: &Outcome, ctx: &Ctx) {
    let Some(status) = task.status.as_ref() else {
        return;
    };
    let (Some(context), Some(uid)) = (status.trace.as_ref(), task.uid()) else {
        return;
    };
    let (name, detail) = match outcome {
        Outcome::Delivered(m) => ("delivered", m),
        Outcome::Failed(m, _) => ("failed", m),
        Outcome::Refused(m) => ("refused", m),
    };
    let span = trace::callback_span(
        context,
        &uid,
        status.observed_rerun,
        started,
        jiff::Timestamp::now(),
        name,
        detail,
    );
    ctx.traces.record(span.into_iter().collect());
}

/// Counts a finished delivery in `ax_callbacks_total` (and a failed one in
/// `ax_callback_failures_total`).
fn count(metrics: &Metrics, outcome: &Outcome) {
    match outcome {
        Outcome::Delivered(_) => metrics.callback_finished("delivered", None),
        Outcome::Failed(_, class) => metrics.callback_finished("failed", Some(class)),
        Outcome::Refused(_) => metrics.callback_finished("refused", None),
    }
}

/// The failure class of a POST answered with `code` (not 2xx): `status_3xx` (redirects are not
/// followed), `status_4xx`, `status_5xx`, or `status_other`.
fn status_class(code: u16) -> &'static str {
    match code {
        300..=399 => "status_3xx",
        400..=499 => "status_4xx",
        500..=599 => "status_5xx",
        _ => "status_other",
    }
}

/// The connector's resolver: the system's, then the allowlist on every address, so the connection
/// goes only to addresses that were checked (an IP literal skips the resolver and is checked by
/// [`Callbacks::check_destination`]).
#[derive(Clone)]
struct GuardedResolver {
    allow: Arc<Allowlist>,
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let allow = self.allow.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            // Port 0: the connector puts the URL's port in.
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            admit_all(&allow, &host, addrs.iter().map(|a| a.ip())).map_err(|refusal| {
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, refusal)
            })?;
            Ok(addrs.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn task_calling(url: &str) -> AxTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ax.dev/v1alpha1",
            "kind": "AxTask",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"type": "t", "callback": {"url": url}, "template": {"spec": {"containers": []}}},
        }))
        .expect("a task")
    }

    fn callbacks(allow: &[&str]) -> Callbacks {
        Callbacks::new(Allowlist::parse(allow.iter().copied()).expect("allowlist")).expect("client")
    }

    /// A listener that counts its connections and answers each with `answer`.
    async fn listener(
        ip: &str,
        answer: &'static str,
    ) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        (addr, connections)
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

    #[tokio::test]
    async fn loopback_and_names_resolving_to_it_are_refused_without_a_connection() {
        let (addr, connections) = listener("127.0.0.1", OK).await;
        let guarded = callbacks(&[]);
        for url in [
            format!("http://127.0.0.1:{}/done", addr.port()),
            format!("http://localhost:{}/done", addr.port()),
            format!("http://[::ffff:127.0.0.1]:{}/done", addr.port()),
            "http://169.254.169.254/latest/meta-data".to_string(),
            "http://10.96.0.1/".to_string(),
        ] {
            match guarded.deliver(&task_calling(&url)).await {
                Outcome::Refused(message) => {
                    assert!(message.contains("--callback-allow"), "{message}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn outcomes_are_counted_by_what_happened() {
        let (addr, _) = listener("127.0.0.1", OK).await;
        let url = format!("http://127.0.0.1:{}/done", addr.port());
        let metrics = Metrics::new();
        count(&metrics, &callbacks(&[]).deliver(&task_calling(&url)).await);
        let allowed = callbacks(&["127.0.0.1/32"]);
        count(&metrics, &allowed.deliver(&task_calling(&url)).await);
        count(
            &metrics,
            &Outcome::Failed("POST answered 503".into(), "status_5xx"),
        );
        let text = metrics.encode().expect("encode");
        for series in [
            r#"ax_callbacks_total{outcome="refused"} 1"#,
            r#"ax_callbacks_total{outcome="delivered"} 1"#,
            r#"ax_callbacks_total{outcome="failed"} 1"#,
            r#"ax_callback_failures_total{class="status_5xx"} 1"#,
        ] {
            assert!(text.contains(&format!("{series}\n")), "{series}:\n{text}");
        }
    }

    #[tokio::test]
    async fn an_allowlisted_receiver_gets_its_post() {
        let (addr, connections) = listener("127.0.0.1", OK).await;
        let url = format!("http://127.0.0.1:{}/done", addr.port());
        let outcome = callbacks(&["127.0.0.1/32"])
            .deliver(&task_calling(&url))
            .await;
        assert!(matches!(outcome, Outcome::Delivered(_)), "{outcome:?}");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn deliveries_beyond_the_limit_wait_their_turn_and_all_arrive() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // Holds every request 300 ms, counting those open at once.
        let listener = TcpListener::bind(("127.0.0.2", 0)).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (open, most, answered) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (o, m, a) = (open.clone(), most.clone(), answered.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (o, m, a) = (o.clone(), m.clone(), a.clone());
                tokio::spawn(async move {
                    let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    let mut buf = [0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    o.fetch_sub(1, Ordering::SeqCst);
                    a.fetch_add(1, Ordering::SeqCst);
                    let _ = socket.write_all(OK.as_bytes()).await;
                });
            }
        });
        let callbacks = Arc::new(
            Callbacks::with_limit(Allowlist::parse(["127.0.0.2/32"]).expect("allowlist"), 3)
                .expect("client"),
        );
        let url = format!("http://{addr}/done");
        let deliveries: Vec<_> = (0..10)
            .map(|_| {
                let (callbacks, task) = (callbacks.clone(), task_calling(&url));
                tokio::spawn(async move { callbacks.deliver_in_turn(&task).await })
            })
            .collect();
        for delivery in deliveries {
            let outcome = delivery.await.expect("delivery");
            assert!(matches!(outcome, Outcome::Delivered(_)), "{outcome:?}");
        }
        assert_eq!(answered.load(Ordering::SeqCst), 10);
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= 3,
            "{most} deliveries under way at once, the limit is 3"
        );
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (target, followed) = listener("127.0.0.1", OK).await;
        let redirect: &'static str = Box::leak(
            format!(
                "HTTP/1.1 302 Found\r\nlocation: http://{target}/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
            .into_boxed_str(),
        );
        let (receiver, _) = listener("127.0.0.2", redirect).await;
        let url = format!("http://{receiver}/done");
        let outcome = callbacks(&["127.0.0.2/32"])
            .deliver(&task_calling(&url))
            .await;
        match outcome {
            Outcome::Failed(message, class) => {
                assert!(message.contains("answered 302"), "{message}");
                assert_eq!(class, "status_3xx");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(followed.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn answers_are_classed_by_their_hundreds() {
        assert_eq!(status_class(301), "status_3xx");
        assert_eq!(status_class(404), "status_4xx");
        assert_eq!(status_class(503), "status_5xx");
        assert_eq!(status_class(101), "status_other");
    }

    #[tokio::test]
    async fn the_resolver_refuses_what_the_allowlist_does_not_admit() {
        use tower_service::Service;
        let mut resolver = GuardedResolver {
            allow: Arc::new(Allowlist::default()),
        };
        let error = resolver
            .call("localhost".parse().expect("a name"))
            .await
            .expect_err("localhost is loopback");
        assert_eq!(error.kind(), std::io::ErrorKind::PermissionDenied);
        let mut allowed = GuardedResolver {
            allow: Arc::new(Allowlist::parse(["127.0.0.0/8", "::1"]).expect("allowlist")),
        };
        let addrs: Vec<SocketAddr> = allowed
            .call("localhost".parse().expect("a name"))
            .await
            .expect("admitted")
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
