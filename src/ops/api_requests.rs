//! Counts the operator's requests to the Kubernetes API by verb and status code
//! (`ax_kubernetes_requests_total`): a tower layer around the kube client's HTTP service, so every
//! request is counted, from the controllers, the watchers and leader election alike.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::{Method, Request, Response, Uri};
use tower_layer::Layer;
use tower_service::Service;

use super::metrics::Metrics;

/// The Kubernetes verb of a request, from its method and path (`/api/v1/namespaces/ns/pods/p`,
/// `/apis/group/version/resource`): a GET of a collection is `list` (or `watch` with
/// `watch=true`), of one object `get`.
pub fn verb_of(method: &Method, uri: &Uri) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::GET => {
            let watch = uri.query().is_some_and(|q| {
                q.split('&')
                    .any(|pair| pair == "watch=true" || pair == "watch=1")
            });
            if watch {
                "watch"
            } else if names_an_object(uri.path()) {
                "get"
            } else {
                "list"
            }
        }
        _ => "other",
    }
}

/// Whether a resource path names one object rather than a collection.
fn names_an_object(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        // /version, /openapi/...: not resources; one document each.
        _ => return true,
    };
    // `namespaces/<ns>/<resource>...` is namespaced; `namespaces/<ns>` alone is the Namespace.
    let after_resource = match rest {
        ["namespaces", _ns, _resource, more @ ..] => more,
        [_resource, more @ ..] => more,
        [] => return false,
    };
    !after_resource.is_empty()
}

/// Wraps the client's service in [`CountRequests`].
#[derive(Clone)]
pub struct CountRequestsLayer {
    metrics: Arc<Metrics>,
}

impl CountRequestsLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        CountRequestsLayer { metrics }
    }
}

impl<S> Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountRequests {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// Counts each request once its response head (or error) arrives; a watch counts when it opens.
#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, R> Service<Request<B>> for CountRequests<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verb = verb_of(request.method(), request.uri());
        let response = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response.status().as_str().to_owned(),
                Err(_) => "error".to_owned(),
            };
            metrics.kubernetes_request(verb, &code);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb(method: Method, uri: &str) -> &'static str {
        verb_of(&method, &uri.parse().expect("a URI"))
    }

    #[test]
    fn gets_of_collections_are_lists_and_watches_say_so() {
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/ns/pods"), "list");
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/ns/pods/p"), "get");
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/ns/pods/p/log"), "get");
        assert_eq!(verb(Method::GET, "/api/v1/pods?limit=500"), "list");
        assert_eq!(verb(Method::GET, "/api/v1/namespaces"), "list");
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/ns"), "get");
        assert_eq!(verb(Method::GET, "/apis/ax.dev/v1alpha1/axtasks"), "list");
        assert_eq!(
            verb(Method::GET, "/apis/ax.dev/v1alpha1/axqueues/default"),
            "get"
        );
        assert_eq!(
            verb(
                Method::GET,
                "/apis/ax.dev/v1alpha1/namespaces/ns/axtasks?watch=true&resourceVersion=5"
            ),
            "watch"
        );
        assert_eq!(verb(Method::GET, "/version"), "get");
    }

    /// Answers every request with `status`, or fails when `None`.
    struct Answer(Option<u16>);

    impl Service<Request<()>> for Answer {
        type Response = Response<()>;
        type Error = &'static str;
        type Future = std::future::Ready<Result<Response<()>, &'static str>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(match self.0 {
                Some(status) => Ok(Response::builder().status(status).body(()).unwrap()),
                None => Err("connection refused"),
            })
        }
    }

    #[tokio::test]
    async fn every_answer_and_every_error_is_counted() {
        let metrics = Arc::new(Metrics::new());
        let layer = CountRequestsLayer::new(metrics.clone());
        let patch = || {
            Request::patch("/apis/ax.dev/v1alpha1/namespaces/ns/axtasks/t/status")
                .body(())
                .unwrap()
        };
        let mut conflict = layer.layer(Answer(Some(409)));
        conflict.call(patch()).await.expect("answered");
        conflict.call(patch()).await.expect("answered");
        let mut down = layer.layer(Answer(None));
        down.call(patch()).await.expect_err("no answer");
        let text = metrics.encode().expect("encode");
        assert!(
            text.contains("ax_kubernetes_requests_total{verb=\"patch\",code=\"409\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("ax_kubernetes_requests_total{verb=\"patch\",code=\"error\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn writes_are_named_by_method() {
        let lease = "/apis/coordination.k8s.io/v1/namespaces/ax/leases/ax-operator";
        assert_eq!(verb(Method::PUT, lease), "update");
        assert_eq!(verb(Method::PATCH, lease), "patch");
        assert_eq!(verb(Method::DELETE, lease), "delete");
        assert_eq!(verb(Method::POST, "/api/v1/namespaces/ns/pods"), "create");
        assert_eq!(verb(Method::OPTIONS, "/"), "other");
    }
}
