//! The `specula` program under the `/metrics` drain attack: trickling clients never delay its
//! exit (the server alone under attack: `host-std/tests/it/http_attacks.rs`).

use crate::support::free_port;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
fn trickling_clients_do_not_delay_the_program_exit() {
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let start = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_specula"))
        .args([
            "demo",
            "--duration",
            "1",
            "--threads",
            "1",
            "--log-interval",
            "0.2",
        ])
        .args(["--metrics-addr", &addr.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the server, then attack it until the program is gone.
    let up = Instant::now();
    while TcpStream::connect(addr).is_err() && up.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                // Until the program is gone: a refused connection (it can exit between two
                // attacks) ends this attacker, it is not a failure.
                while !stop.load(Ordering::Relaxed) {
                    if trickle_after_request(addr, &stop).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    let out = child.wait_with_output().unwrap();
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in attackers {
        t.join().unwrap();
    }
    assert!(out.status.success(), "{:?}", out.status);
    // 1 s of demo, the server's 500 ms grace, start-up (training) and a loaded machine.
    assert!(
        took < Duration::from_secs(20),
        "the demo took {took:?} to exit"
    );
}
