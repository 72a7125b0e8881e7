//! The `/metrics` server under attack, with real sockets on loopback: a trickling client, a
//! slowloris crowd and a full server never delay a legitimate scrape past a bound (the
//! program's exit under the same attack: `cli/tests/it/http_attacks.rs`).
//!
//! Bounds are generous (the server's own deadline plus seconds of margin): they catch a server
//! that waits on a client (minutes before the fix), not a slow machine.

use specula::http::{MetricsServer, ServerConfig};
use specula::prom::{Options, SpecCollector};
use specula::wire;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(1500);
const HEAD_TIMEOUT: Duration = Duration::from_millis(750);
/// Slack for a loaded two-core CI machine.
const MARGIN: Duration = Duration::from_secs(3);

fn server(max_connections: usize) -> MetricsServer {
    let wired = wire::<4, _>(["rank0"]).unwrap();
    let reg = SpecCollector::new(wired.slots, Options::default()).into_registry();
    let cfg = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_connections,
        timeout: TIMEOUT,
        head_timeout: HEAD_TIMEOUT,
        ..ServerConfig::default()
    };
    MetricsServer::start(cfg, Arc::new(reg)).unwrap()
}

/// A legitimate scrape: its status line and how long it took.
fn scrape(a: SocketAddr) -> (String, Duration) {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&a, Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    (out.lines().next().unwrap_or("").to_owned(), t.elapsed())
}

fn assert_scrape_ok(a: SocketAddr, bound: Duration) {
    let (status, took) = scrape(a);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(took < bound, "a scrape took {took:?} (bound {bound:?})");
}

/// Sends a whole request, then one byte every 10 ms (the drain attack), until the server closes
/// the connection; returns how long the server kept it open, or the connection error when
/// nothing listens (any more).
fn trickle_after_request(a: SocketAddr, stop: &AtomicBool) -> std::io::Result<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect(a)?;
    s.set_nonblocking(true).unwrap();
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(60) {
        if s.write(b"x").is_err() {
            break; // reset: the server closed
        }
        match s.read(&mut buf) {
            Ok(0) => break, // closed
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => break,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(t.elapsed())
}

#[test]
fn trickling_clients_are_cut_off_and_never_delay_a_scrape() {
    let srv = server(8);
    let a = srv.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let trickles: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || trickle_after_request(a, &stop).expect("server listening"))
        })
        .collect();
    // A client trickling its head one byte every 30 ms.
    let head_trickle = std::thread::spawn(move || {
        let t = Instant::now();
        let mut s = TcpStream::connect(a).unwrap();
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: yes-yes-yes-yes-yes-yes-yes-yes\r\n"
        {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        (String::from_utf8_lossy(&out).into_owned(), t.elapsed())
    });
    for _ in 0..3 {
        assert_scrape_ok(a, TIMEOUT + MARGIN);
        std::thread::sleep(Duration::from_millis(200));
    }
    for t in trickles {
        let open = t.join().unwrap();
        assert!(
            open < TIMEOUT + MARGIN,
            "a trickling client kept its connection {open:?}"
        );
    }
    let (out, took) = head_trickle.join().unwrap();
    assert!(
        out.is_empty() || out.starts_with("HTTP/1.1 408 Request Timeout"),
        "{out:?}"
    );
    assert!(took < TIMEOUT + MARGIN, "a head trickle lasted {took:?}");
    stop.store(true, Ordering::Relaxed);
    let t = Instant::now();
    srv.shutdown();
    assert!(t.elapsed() < MARGIN, "shutdown took {:?}", t.elapsed());
}

#[test]
fn a_slowloris_crowd_never_keeps_a_scraper_out() {
    let srv = server(16);
    let a = srv.local_addr();
    // 200 connections (12x the cap), each sending half a head and then a byte now and then.
    let mut crowd: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect_timeout(&a, Duration::from_secs(5)).ok())
        .collect();
    for s in &mut crowd {
        s.set_nonblocking(true).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n");
    }
    assert!(
        crowd.len() > 100,
        "could only open {} connections",
        crowd.len()
    );
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let mut scrapes = 0;
    while start.elapsed() < Duration::from_secs(2) {
        // Keep the crowd busy, reconnecting whoever was cut off.
        for s in &mut crowd {
            if s.write(b"X").is_ok() {
                continue;
            }
            if let Ok(n) = TcpStream::connect_timeout(&a, Duration::from_secs(1)) {
                n.set_nonblocking(true).unwrap();
                let _ = (&n).write(b"GET /metrics HTTP/1.1\r\n");
                *s = n;
            }
        }
        assert_scrape_ok(a, TIMEOUT + MARGIN);
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(scrapes >= 3);
    drop(crowd);
    srv.shutdown();
}

#[test]
fn a_full_server_answers_503_at_once_and_recovers() {
    let srv = server(4);
    let a = srv.local_addr();
    // Four idle connections take every slot; a scrape evicts the oldest (which gets 503) and
    // is served.
    let mut idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(a).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_scrape_ok(a, TIMEOUT + MARGIN);
    idle[0]
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut out = String::new();
    let _ = idle[0].read_to_string(&mut out);
    assert!(
        out.starts_with("HTTP/1.1 503 Service Unavailable"),
        "the evicted connection got {out:?}"
    );
    // A burst of scrapes at a full server: every one answered, none waits out a deadline.
    let burst: Vec<_> = (0..32)
        .map(|_| std::thread::spawn(move || scrape(a)))
        .collect();
    for h in burst {
        let (status, took) = h.join().unwrap();
        assert!(
            status == "HTTP/1.1 503 Service Unavailable" || status == "HTTP/1.1 200 OK",
            "{status:?}"
        );
        assert!(took < TIMEOUT + MARGIN, "{took:?}");
    }
    drop(idle);
    assert_scrape_ok(a, TIMEOUT + MARGIN);
    srv.shutdown();
}
