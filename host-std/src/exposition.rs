//! The exposition formats and how a scrape picks one: [`Format`], [`render`] and
//! [`negotiate`], public as `specula::prom::{Format, render}` and `specula::http::negotiate`.
//!
//! Below both `prom` (which renders) and `http` (which serves): the exporter and the server
//! each need the formats, and neither needs the other.

use prometheus_client::registry::Registry;

/// Exposition formats the HTTP endpoint can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (`# EOF` terminated).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (what `promtool check metrics` reads).
    Text,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format to answer a client whose `Accept` header is `accept` with, by the same rules
    /// as [`negotiate`] (`specula::http::negotiate`: quality values, specificity,
    /// case-insensitive media types); where neither format is acceptable, the classic text
    /// format, which every scraper reads. A server that answers `406 Not Acceptable` instead
    /// calls [`negotiate`] itself.
    pub fn negotiate(accept: Option<&str>) -> Self {
        negotiate(accept).unwrap_or(Self::Text)
    }
}

/// Encodes `registry` in `format`.
pub fn render(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?,
    }
    Ok(out)
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
