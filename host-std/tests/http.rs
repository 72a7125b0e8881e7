//! The `/metrics` endpoint under bad input: it answers correctly and keeps serving.

use specula::http::{MetricsServer, ServeError, ServerConfig};
use specula::prom::{Options, SpecCollector};
use specula::{Driver, HostReadback, StdClock, wire};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

fn server(timeout: Duration) -> (MetricsServer, u64) {
    let wired = wire::<4, _>(["rank0"]).unwrap();
    let w = wired.writers.into_iter().next().unwrap();
    let mut d = Driver::new(
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
        b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
    );
    assert!(r.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"));
    assert!(r.ends_with("# EOF\n"));
    let r = exchange(a, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status(&r), "HTTP/1.1 200 OK");
    assert!(r.ends_with("\r\n\r\n"), "HEAD has no body");
    assert_eq!(
        status(&exchange(a, b"GET / HTTP/1.1\r\n\r\n")),
        "HTTP/1.1 404 Not Found"
    );
    assert_eq!(
        status(&exchange(a, b"GET /metricsx HTTP/1.1\r\n\r\n")),
        "HTTP/1.1 404 Not Found"
    );
    for m in ["POST", "PUT", "DELETE", "OPTIONS"] {
        let r = exchange(
            a,
            format!("{m} /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc").as_bytes(),
        );
        assert_eq!(status(&r), "HTTP/1.1 405 Method Not Allowed", "{m}");
        assert!(r.contains("Allow: GET, HEAD"));
    }
    srv.shutdown();
}

#[test]
fn survives_garbage_huge_headers_slow_clients_and_crowds() {
    let (srv, _) = server(Duration::from_millis(400));
    let a = srv.local_addr();
    // Garbage.
    let r = exchange(a, b"\x00\x01\xff\xfe\r\n\xde\xad\xbe\xef\r\n\r\n");
    assert_eq!(status(&r), "HTTP/1.1 400 Bad Request");
    assert_eq!(
        status(&exchange(a, b"GET /metrics HTTP/9.9\r\n\r\n")),
        "HTTP/1.1 400 Bad Request"
    );
    // A connection closed without a byte gets nothing, and hurts nothing.
    drop(TcpStream::connect(a).unwrap());
    // Huge headers.
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 200_000));
    huge.extend_from_slice(b"\r\n\r\n");
    assert_eq!(
        status(&exchange(a, &huge)),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    // A slow client: half a request line, then silence, is cut off at the deadline...
    let mut slow = TcpStream::connect(a).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    // ...and meanwhile the server keeps answering others.
    assert_eq!(status(&get(a)), "HTTP/1.1 200 OK");
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut out = String::new();
    let _ = slow.read_to_string(&mut out);
    assert_eq!(status(&out), "HTTP/1.1 408 Request Timeout");
    // A client trickling one byte at a time is cut off too (one deadline per connection).
    let mut trickle = TcpStream::connect(a).unwrap();
    trickle
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut cut = false;
    for b in b"GET /metrics HTTP/1.1\r\nX-Slow: yes-yes-yes-yes-yes-yes\r\n" {
        if trickle.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    let mut out = String::new();
    let _ = trickle.read_to_string(&mut out);
    assert!(
        cut || status(&out) == "HTTP/1.1 408 Request Timeout",
        "{out:?}"
    );
    // A crowd: every connection gets a well-formed answer (200, or 503 when the queue is
    // full), none hangs.
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
    // Still serving afterwards.
    assert_eq!(status(&get(a)), "HTTP/1.1 200 OK");
    srv.shutdown();
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
    let bad = ServerConfig {
        workers: 0,
        ..ServerConfig::default()
    };
    assert!(matches!(
        MetricsServer::start(
            bad,
            Arc::new(prometheus_client::registry::Registry::default())
        ),
        Err(ServeError::BadConfig(_))
    ));
}
