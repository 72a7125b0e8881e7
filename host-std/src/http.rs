//! HTTP `/metrics`: content negotiation (always available) and, with the `http` feature, a
//! hardened scrape server.
//!
//! A runtime that already runs an HTTP server (axum, hyper, …) mounts the metrics itself: it
//! picks the format with [`negotiate`] from the request's `Accept` header and encodes the
//! registry with [`render`](crate::prom::render); neither needs the `http` feature nor starts a
//! thread (see `examples/axum_metrics.rs`):
//!
//! ```
//! use specula::http::negotiate;
//! use specula::prom::{Format, render};
//! # let registry = specula::prometheus_client::registry::Registry::default();
//! // What Prometheus sends:
//! let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
//! let format = negotiate(Some(accept)).expect("acceptable");
//! assert_eq!(format, Format::OpenMetrics);
//! let body = render(&registry, format)?; // send with Content-Type: format.content_type()
//! assert!(body.ends_with("# EOF\n"));
//! // q=0 means "not this one"; media types are case-insensitive.
//! assert_eq!(negotiate(Some("Application/OpenMetrics-Text;q=0, */*")), Some(Format::Text));
//! // Nothing acceptable: answer 406.
//! assert_eq!(negotiate(Some("application/json")), None);
//! # Ok::<(), std::fmt::Error>(())
//! ```
//!
//! [`scrape`] does both for any server; with the `axum` feature, `axum::metrics` is
//! the route ready to mount: `Router::new().route("/metrics", specula::http::axum::metrics(registry))`.
//!
//! With the `http` feature, `MetricsServer` serves `/metrics` on its own thread (hyper 1 on a
//! one-thread tokio runtime) with bounds an exposed endpoint needs; see its documentation.

// Negotiation lives below this module and `prom`, which both need the formats.
pub use crate::exposition::negotiate;

#[cfg(feature = "http")]
mod server;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use server::{MetricsServer, ServeError, ServerConfig, default_max_connections};

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;

/// The path served.
pub const PATH: &str = "/metrics";

/// The answer to one `GET /metrics`, whatever serves it: [`scrape`]'s result, which the
/// `http` server and the axum route (`axum::metrics`, `axum` feature) send as is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scrape {
    /// The status code: `200`, `400` (an `Accept` value that is not visible ASCII), `406`
    /// (neither format acceptable) or `500` (the registry failed to encode).
    pub status: u16,
    /// The `Content-Type` to send: the format's on `200`, plain text otherwise.
    pub content_type: &'static str,
    /// The body: the encoded registry on `200`, the status line's text otherwise.
    pub body: String,
}

impl Scrape {
    fn error(status: u16, reason: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{status} {reason}\n"),
        }
    }
}

/// Answers a scrape whose `Accept` header lines are `accept` (as sent: several lines are one
/// list; none accepts anything): [`negotiate`]s the format and [`render`](crate::prom::render)s
/// `registry` in it. Send `Cache-Control: no-store` with it, as the `http` server does.
///
/// ```
/// use specula::http::scrape;
/// # let registry = specula::prometheus_client::registry::Registry::default();
/// let ok = scrape(&registry, [&b"application/openmetrics-text;version=1.0.0"[..]]);
/// assert_eq!((ok.status, ok.body.ends_with("# EOF\n")), (200, true));
/// assert_eq!(scrape(&registry, [&b"application/json"[..]]).status, 406);
/// assert_eq!(scrape(&registry, [&b"text/plain\xff"[..]]).status, 400);
/// ```
pub fn scrape<'a>(
    registry: &prometheus_client::registry::Registry,
    accept: impl IntoIterator<Item = &'a [u8]>,
) -> Scrape {
    let mut joined = String::new();
    let mut any = false;
    for v in accept {
        // What `http::HeaderValue::to_str` accepts: visible ASCII, spaces and tabs.
        let visible = v.iter().all(|&b| b == b'\t' || (b' '..0x7f).contains(&b));
        let Some(v) = std::str::from_utf8(v).ok().filter(|_| visible) else {
            return Scrape::error(400, "Bad Request");
        };
        if any {
            joined.push(',');
        }
        joined.push_str(v);
        any = true;
    }
    let Some(format) = negotiate(any.then_some(joined.as_str())) else {
        return Scrape::error(406, "Not Acceptable");
    };
    match crate::exposition::render(registry, format) {
        Ok(body) => Scrape {
            status: 200,
            content_type: format.content_type(),
            body,
        },
        Err(_) => Scrape::error(500, "Internal Server Error"),
    }
}
