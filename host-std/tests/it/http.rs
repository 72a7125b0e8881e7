//! The `/metrics` endpoint under bad input: it answers correctly and keeps serving. The
//! attacks (trickling clients, slowloris crowds, a full server) are in `http_attacks`.

use specula::http::{MetricsServer, ServeError, ServerConfig};
use specula::prom::{Options, SpecCollector};
use specula::{HostReadback, StdClock, Ticker, wire};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::log_capture::captured;

fn server(timeout: Duration) -> (MetricsServer, u64) {
    let wired = wire::<4, _>(["rank0"]).unwrap();
    let w = wired.writers.into_iter().next().unwrap();
    let mut d = Ticker::new(
        HostReadback::<4>::default(),
        w,
        Duration::from_secs(60),
        StdClock::new(),
    )
    .unwrap();
    for i in 0..40 {
        d.collector_mut().readback_mut().record(4, i % 5).unwrap();
    }
    d.flush().unwrap();
    let accepted = d.collector().readback().counters().accepted_tokens;
    let reg = SpecCollector::new(wired.slots, Options::default()).into_registry();
    let cfg = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        timeout,
        head_timeout: timeout / 2,
        ..ServerConfig::default()
    };
    (MetricsServer::start(cfg, Arc::new(reg)).unwrap(), accepted)
}

/// Sends `bytes`, then reads the whole response (the server always closes).
fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(addr: SocketAddr) -> String {
    exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
}

fn status(resp: &str) -> &str {
    resp.lines().next().unwrap_or("")
}

#[test]
fn answers_metrics_and_rejects_everything_else() {
    let (srv, accepted) = server(Duration::from_secs(5));
    let a = srv.local_addr();
    assert!(a.ip().is_loopback());
    let r = get(a);
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    assert!(r.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
    assert!(r.contains(&format!(
        "specula_accepted_tokens_total{{engine=\"rank0\"}} {accepted}"
    )));
    let r = exchange(
        a,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
    );
    assert!(r.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"));
    assert!(r.ends_with("# EOF\n"));
    let r = exchange(a, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert!(status(&r).ends_with(" 200 OK"), "{r}");
    assert!(r.ends_with("\r\n\r\n"), "HEAD has no body");
    assert_eq!(
        status(&exchange(a, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")),
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        status(&exchange(a, b"GET /metricsx HTTP/1.1\r\nHost: x\r\n\r\n")),
        "HTTP/1.1 404 Not Found"
    );
    for m in ["POST", "PUT", "DELETE", "OPTIONS"] {
        let r = exchange(
            a,
            format!("{m} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").as_bytes(),
        );
        assert_eq!(status(&r), "HTTP/1.1 405 Method Not Allowed", "{m}");
        assert!(r.contains("Allow: GET, HEAD"));
    }
    srv.shutdown();
}

/// `GET /metrics` with `Accept: {accept}`: (status line, Content-Type header line).
fn with_accept(a: SocketAddr, accept: &str) -> (String, String) {
    let r = exchange(
        a,
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n").as_bytes(),
    );
    let ct = r
        .lines()
        .find(|l| l.starts_with("Content-Type: "))
        .unwrap_or("")
        .to_owned();
    (status(&r).to_owned(), ct)
}

#[test]
fn negotiates_by_quality_and_case_insensitively() {
    let (srv, _) = server(Duration::from_secs(5));
    let a = srv.local_addr();
    const OM: &str = "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8";
    const TEXT: &str = "Content-Type: text/plain; version=0.0.4; charset=utf-8";
    for (accept, want_status, want_type) in [
        (
            "application/openmetrics-text;q=0, */*",
            "HTTP/1.1 200 OK",
            TEXT,
        ),
        ("APPLICATION/OpenMetrics-Text", "HTTP/1.1 200 OK", OM),
        (
            "text/plain;q=0.2, application/openmetrics-text;q=0.9",
            "HTTP/1.1 200 OK",
            OM,
        ),
        (
            "text/plain;q=0.9, application/openmetrics-text;q=0.2",
            "HTTP/1.1 200 OK",
            TEXT,
        ),
        (
            "application/openmetrics-text;q=0",
            "HTTP/1.1 406 Not Acceptable",
            "",
        ),
        ("application/json", "HTTP/1.1 406 Not Acceptable", ""),
    ] {
        let (st, ct) = with_accept(a, accept);
        assert_eq!(st, want_status, "{accept}");
        if !want_type.is_empty() {
            assert_eq!(ct, want_type, "{accept}");
        }
    }
    // Two Accept lines are one list.
    let r = exchange(
        a,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain;q=0\r\n\
          Accept: application/openmetrics-text;q=0.5\r\n\r\n",
    );
    assert!(r.contains(OM), "{r}");
    srv.shutdown();
}

#[test]
fn rejects_malformed_requests_and_keeps_serving() {
    let (srv, _) = server(Duration::from_secs(2));
    let a = srv.local_addr();
    for (bad, want) in [
        (
            &b"\x00\x01\xff\xfe\r\n\xde\xad\xbe\xef\r\n\r\n"[..],
            "400 Bad Request",
        ),
        (
            b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n",
            "400 Bad Request",
        ),
        // A space before the colon (RFC 9112 §5.1: must be rejected).
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept : x\r\n\r\n",
            "400 Bad Request",
        ),
        // An obsolete line fold.
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain,\r\n */*\r\n\r\n",
            "400 Bad Request",
        ),
        // HTTP/1.1 needs exactly one Host (RFC 9112 §3.2); HTTP/1.0 may omit it.
        (b"GET /metrics HTTP/1.1\r\n\r\n", "400 Bad Request"),
        (
            b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "400 Bad Request",
        ),
        (b"GET /metrics HTTP/1.0\r\n\r\n", "200 OK"),
        // A header line without a colon.
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
            "400 Bad Request",
        ),
        (
            b"get /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            "405 Method Not Allowed",
        ),
    ] {
        let r = exchange(a, bad);
        assert!(
            status(&r).ends_with(want),
            "{:?} got {:?}",
            String::from_utf8_lossy(bad),
            status(&r)
        );
    }
    // A connection closed without a byte gets nothing, and hurts nothing.
    drop(TcpStream::connect(a).unwrap());
    // Huge headers.
    let mut huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 200_000));
    huge.extend_from_slice(b"\r\n\r\n");
    assert_eq!(
        status(&exchange(a, &huge)),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    // Half a request line, then silence: 408 at the head timeout.
    let mut slow = TcpStream::connect(a).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    assert_eq!(status(&get(a)), "HTTP/1.1 200 OK");
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut out = String::new();
    let _ = slow.read_to_string(&mut out);
    assert_eq!(status(&out), "HTTP/1.1 408 Request Timeout");
    // A crowd of well-behaved scrapes: each gets a well-formed answer (200, or 503 if the
    // server is full), none hangs.
    let handles: Vec<_> = (0..64)
        .map(|_| std::thread::spawn(move || status(&get(a)).to_owned()))
        .collect();
    let statuses: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        statuses
            .iter()
            .all(|s| s == "HTTP/1.1 200 OK" || s == "HTTP/1.1 503 Service Unavailable"),
        "{statuses:?}"
    );
    assert!(statuses.iter().any(|s| s == "HTTP/1.1 200 OK"));
    assert_eq!(status(&get(a)), "HTTP/1.1 200 OK");
    srv.shutdown();
}

#[test]
fn binding_a_non_loopback_address_warns() {
    // The warnings go through the binary's one logger.
    let log = captured();
    let reg = Arc::new(prometheus_client::registry::Registry::default());
    let local = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..ServerConfig::default()
    };
    MetricsServer::start(local, Arc::clone(&reg))
        .unwrap()
        .shutdown();
    let count = || {
        log.warnings
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.starts_with("specula::http: ") && w.contains("not a loopback"))
            .count()
    };
    assert_eq!(count(), 0);
    // Binding every interface (nothing is sent anywhere: the server is stopped at once).
    let all = ServerConfig {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        ..ServerConfig::default()
    };
    MetricsServer::start(all, reg).unwrap().shutdown();
    assert_eq!(count(), 1);
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let (srv, _) = server(Duration::from_secs(1));
    let reg = prometheus_client::registry::Registry::default();
    let cfg = ServerConfig {
        addr: srv.local_addr(),
        ..ServerConfig::default()
    };
    let err = MetricsServer::start(cfg, Arc::new(reg)).unwrap_err();
    assert!(matches!(err, ServeError::Bind { .. }));
    assert!(err.to_string().contains("already in use"), "{err}");
    for bad in [
        ServerConfig {
            max_connections: 0,
            ..ServerConfig::default()
        },
        ServerConfig {
            timeout: Duration::ZERO,
            ..ServerConfig::default()
        },
        ServerConfig {
            max_head_bytes: 100,
            ..ServerConfig::default()
        },
    ] {
        assert!(matches!(
            MetricsServer::start(
                bad,
                Arc::new(prometheus_client::registry::Registry::default())
            ),
            Err(ServeError::BadConfig(_))
        ));
    }
}
