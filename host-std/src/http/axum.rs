//! `/metrics` as an axum route (`axum` feature): the runtime's own router serves Prometheus in
//! one line, with the same negotiation and answers as the `http` server ([`scrape`]).
//!
//! ```
//! use specula::http::axum::metrics;
//! use specula::prom::{Options, SpecCollector};
//! use std::sync::Arc;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let wired = specula::wire_ranks::<4>(1)?;
//! let registry = Arc::new(SpecCollector::new(wired.slots.clone(), Options::default()).into_registry());
//! // Any router state: the route carries its registry.
//! let app: axum::Router = axum::Router::new().route("/metrics", metrics(registry));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! Built against axum 0.8 (the versions of axum and of `prometheus-client` a runtime uses must
//! be the ones this crate is built with: register with [`crate::prometheus_client`]).

use super::scrape;
use ::axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use ::axum::response::{IntoResponse, Response};
use ::axum::routing::{MethodRouter, get};
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The `GET` (and `HEAD`) route answering scrapes of `registry`: `200` in the negotiated format
/// with `Cache-Control: no-store`, `406` when neither format is acceptable, `400` for an
/// `Accept` value that is not visible ASCII. Generic over the router's state, so it mounts in
/// any `Router<S>`.
pub fn metrics<S>(registry: Arc<Registry>) -> MethodRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    get(move |headers: HeaderMap| {
        let registry = Arc::clone(&registry);
        async move { answer(&registry, &headers) }
    })
}

/// The response to one scrape with request headers `headers`.
fn answer(registry: &Registry, headers: &HeaderMap) -> Response {
    let s = scrape(
        registry,
        headers
            .get_all(header::ACCEPT)
            .iter()
            .map(HeaderValue::as_bytes),
    );
    let status = StatusCode::from_u16(s.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, [(header::CONTENT_TYPE, s.content_type)], s.body).into_response();
    if status == StatusCode::OK {
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::answer;
    use ::axum::http::{HeaderMap, HeaderValue, StatusCode, header};
    use prometheus_client::registry::Registry;

    fn with_accept(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                header::ACCEPT,
                HeaderValue::from_bytes(v).expect("a header value"),
            );
        }
        h
    }

    #[test]
    fn answers_as_the_server_does() {
        let r = Registry::default();
        let ok = answer(
            &r,
            &with_accept(&[b"application/json", b"application/openmetrics-text;q=0.9"]),
        );
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(ok.headers()[header::CACHE_CONTROL], "no-store");
        let text = answer(&r, &HeaderMap::new());
        assert_eq!(text.status(), StatusCode::OK);
        assert!(
            text.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        let none = answer(&r, &with_accept(&[b"application/json"]));
        assert_eq!(none.status(), StatusCode::NOT_ACCEPTABLE);
        assert!(none.headers().get(header::CACHE_CONTROL).is_none());
        let bad = answer(&r, &with_accept(&[b"text/plain\xff"]));
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    }
}
