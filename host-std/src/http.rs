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
//! [`scrape`] does both for any server; with the `axum` feature, [`axum::metrics`](mod@axum) is
//! the route ready to mount: `Router::new().route("/metrics", specula::http::axum::metrics(registry))`.
//!
//! With the `http` feature, `MetricsServer` serves `/metrics` on its own thread (hyper 1 on a
//! one-thread tokio runtime) with bounds an exposed endpoint needs; see its documentation.

use crate::prom::Format;

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
/// `http` server and the axum route ([`axum::metrics`](mod@axum), `axum` feature) send as is.
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
    match crate::prom::render(registry, format) {
        Ok(body) => Scrape {
            status: 200,
            content_type: format.content_type(),
            body,
        },
        Err(_) => Scrape::error(500, "Internal Server Error"),
    }
}

/// The format to answer a request whose `Accept` header is `accept` with (RFC 9110 §12.5.1):
/// the acceptable format with the highest quality value, `None` when neither is acceptable
/// (answer `406 Not Acceptable`).
///
/// * Each media range's quality is its `q` parameter (0 to 1, at most three decimals; default
///   1); a malformed `q` makes the range count as `q=0`, as do ranges that are not
///   `type/subtype`.
/// * A format takes the quality of the most specific range that matches it
///   (`application/openmetrics-text` before `application/*` before `*/*`), so
///   `application/openmetrics-text;q=0, */*` excludes OpenMetrics.
/// * Media types and parameter names compare case-insensitively.
/// * On equal quality the more specific match wins, then the range listed first; when all else
///   is equal the classic text format, which every scraper reads.
/// * No header (or an empty one) accepts anything: the text format.
///
/// Several `Accept` header lines are one list: join their values with `,`.
pub fn negotiate(accept: Option<&str>) -> Option<Format> {
    let accept = match accept {
        Some(a) if !a.trim().is_empty() => a,
        _ => return Some(Format::Text),
    };
    // Per format: (quality in thousandths, specificity, position of the range) of its best match.
    let mut best: [Option<(u16, u8, usize)>; 2] = [None, None];
    for (pos, range) in accept.split(',').enumerate() {
        let range = range.trim();
        if range.is_empty() {
            continue;
        }
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim();
        let mut q = Some(1000u16);
        for p in parts {
            let Some((name, value)) = p.split_once('=') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("q") {
                q = parse_q(value.trim());
            }
        }
        let q = q.unwrap_or(0);
        let Some((ty, sub)) = media.split_once('/') else {
            continue;
        };
        let (ty, sub) = (ty.trim(), sub.trim());
        for (i, (fty, fsub)) in [("application", "openmetrics-text"), ("text", "plain")]
            .into_iter()
            .enumerate()
        {
            let specificity = if ty.eq_ignore_ascii_case(fty) && sub.eq_ignore_ascii_case(fsub) {
                2
            } else if ty.eq_ignore_ascii_case(fty) && sub == "*" {
                1
            } else if ty == "*" && sub == "*" {
                0
            } else {
                continue;
            };
            // The most specific range decides the quality; among equally specific ones the
            // first listed.
            match best[i] {
                Some((_, s, _)) if s >= specificity => {}
                _ => best[i] = Some((q, specificity, pos)),
            }
        }
    }
    let score = |b: Option<(u16, u8, usize)>| match b {
        Some((q, s, pos)) if q > 0 => Some((q, s, std::cmp::Reverse(pos))),
        _ => None,
    };
    match (score(best[0]), score(best[1])) {
        (None, None) => None,
        (Some(_), None) => Some(Format::OpenMetrics),
        (None, Some(_)) => Some(Format::Text),
        (Some(om), Some(text)) if om > text => Some(Format::OpenMetrics),
        (Some(_), Some(_)) => Some(Format::Text),
    }
}

/// A `qvalue` (RFC 9110 §12.4.2) in thousandths, `None` when malformed.
fn parse_q(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths = 0u16;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_quality_values() {
        use Format::{OpenMetrics as Om, Text};
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
                          application/openmetrics-text;version=0.0.1;q=0.5,\
                          text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,\
                          text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        for (accept, want) in [
            (None, Some(Text)),
            (Some(""), Some(Text)),
            (Some("*/*"), Some(Text)),
            (Some("text/plain"), Some(Text)),
            (Some("application/openmetrics-text"), Some(Om)),
            (Some(prometheus), Some(Om)),
            (Some("application/openmetrics-text;q=0"), None),
            (Some("application/openmetrics-text;q=0, */*"), Some(Text)),
            (
                Some("application/openmetrics-text;Q=0.0, text/plain"),
                Some(Text),
            ),
            (
                Some("text/plain;q=0.1, application/openmetrics-text;q=0.2"),
                Some(Om),
            ),
            (
                Some("text/plain;q=0.3, application/openmetrics-text;q=0.2"),
                Some(Text),
            ),
            (Some("APPLICATION/OPENMETRICS-TEXT"), Some(Om)),
            (
                Some("Application/OpenMetrics-Text; Version=1.0.0"),
                Some(Om),
            ),
            (Some("application/*"), Some(Om)),
            (Some("application/*;q=0.9, text/*;q=0.8"), Some(Om)),
            (
                Some("application/*, application/openmetrics-text;q=0"),
                None,
            ),
            (Some("application/openmetrics-text, text/plain"), Some(Om)),
            (Some("text/plain, application/openmetrics-text"), Some(Text)),
            (Some("application/json"), None),
            (Some("text/plain;q=0, */*;q=0.5"), Some(Om)),
            (Some("*/*;q=0.5, text/plain;q=0"), Some(Om)),
            (Some("application/openmetrics-text;q=1.5"), None),
            (Some("application/openmetrics-text;q=0.0001"), None),
            (
                Some("application/openmetrics-text;q=abc, text/plain;q=0.1"),
                Some(Text),
            ),
            (Some("garbage, ,;;,==,/,"), None),
        ] {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn qvalues_parse_strictly() {
        assert_eq!(parse_q("1"), Some(1000));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("0.5"), Some(500));
        assert_eq!(parse_q("0.125"), Some(125));
        assert_eq!(parse_q("0"), Some(0));
        for bad in ["1.001", "2", "-0", "0.1234", "", ".5", "0.x", "1e0"] {
            assert_eq!(parse_q(bad), None, "{bad}");
        }
    }
}
