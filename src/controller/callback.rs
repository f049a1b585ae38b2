//! Delivery of `spec.callback`: POST the final status, retry a few times with backoff, and hand the
//! outcome to the task's reconcile, which records it as the `CallbackDelivered` condition. Never
//! changes the task's phase.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::task::key;
use super::{Ctx, TaskKey};
use crate::api::AxTask;
use crate::core::task::CallbackResult;

const ATTEMPTS: u32 = 4;
const FIRST_DELAY: Duration = Duration::from_millis(500);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

pub struct Callbacks {
    /// Tasks whose callback is being delivered, so a reconcile meanwhile does not send it twice.
    in_flight: Mutex<HashSet<TaskKey>>,
    http: HttpClient<Https, Full<Bytes>>,
}

impl Callbacks {
    pub fn new() -> std::io::Result<Self> {
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
        let https = builder.https_or_http().enable_http1().build();
        Ok(Callbacks {
            in_flight: Mutex::new(HashSet::new()),
            http: HttpClient::builder(TokioExecutor::new()).build(https),
        })
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<TaskKey>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers the callback in the background, once at a time per task.
    pub fn send(&self, task: Arc<AxTask>, ctx: Ctx) {
        let key = key(&task);
        if !self.in_flight().insert(key.clone()) {
            return;
        }
        tokio::spawn(async move {
            let (delivered, message) = ctx.callbacks.deliver(&task).await;
            let result = if delivered {
                CallbackResult::Delivered
            } else {
                CallbackResult::Failed
            };
            ctx.tracking.callback_done(&key, result, message);
            ctx.callbacks.in_flight().remove(&key);
            ctx.wake(&key);
        });
    }

    async fn deliver(&self, task: &AxTask) -> (bool, String) {
        let Some(url) = task.spec.callback.as_ref().map(|c| c.url.clone()) else {
            return (false, "no callback URL".into());
        };
        let body = serde_json::json!({
            "apiVersion": AxTask::api_version(&()),
            "kind": AxTask::kind(&()),
            "metadata": {"name": task.name_any(), "namespace": task.namespace(), "uid": task.uid()},
            "status": task.status,
        });
        let body = Bytes::from(body.to_string());
        let mut delay = FIRST_DELAY;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            match self.post(&url, body.clone()).await {
                Ok(code) if (200..300).contains(&code) => {
                    info!(url, code, attempt, "callback delivered");
                    return (
                        true,
                        format!("POST {url} answered {code} (attempt {attempt})"),
                    );
                }
                Ok(code) => last = format!("POST {url} answered {code}"),
                Err(e) => last = format!("POST {url} failed: {e}"),
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
        warn!(url, "callback not delivered: {last}");
        (false, format!("{last} (after {ATTEMPTS} attempts)"))
    }

    async fn post(&self, url: &str, body: Bytes) -> Result<u16, String> {
        let request = hyper::Request::post(url)
            .header("content-type", "application/json")
            .header("user-agent", "ax-operator")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(request)).await {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())),
        }
    }
}
