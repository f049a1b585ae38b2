//! The guard every request passes: the token and, for changes, our own Origin (as `security`
//! decides), and the headers that keep the console's pages to themselves.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{App, query_pairs, redirect};
use crate::console::security::{self, RequestFacts};

/// Largest request body (a YAML manifest with a large payload).
const BODY_LIMIT: usize = 2 * 1024 * 1024;

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Every request: the token (cookie, URL, or for changes the form or header) and, for changes,
/// our own Origin. A first visit with `?token=` gets the cookie and is sent on without it.
pub(super) async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
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
