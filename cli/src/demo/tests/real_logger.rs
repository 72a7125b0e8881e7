//! The demo under a real `log` logger (the process-wide one, installed once for this test
//! binary): a logger that panics does not prevent the summary, and a shutdown request stops
//! the loop with every count flushed.

use crate::demo::{self, DemoConfig, MAX_K};
use specula::Shutdown;
use specula::cpu::CpuVerifier;
use specula::shutdown::Reason;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Captures `specula` log records so the tests see what went through the `log` facade. A
/// record for a label starting with `panics` panics, as a broken logger would.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.target() == specula::log_sink::TARGET {
            let line = r.args().to_string();
            if line.contains("[panics") {
                panic!("this logger breaks on {line:.40}");
            }
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn captured() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(c).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        c
    })
}

fn lines_for(label: &str) -> Vec<String> {
    let tag = format!("[{label}]");
    captured()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&tag))
        .cloned()
        .collect()
}

/// Runs `f` on another thread; fails if it has not returned within a minute (a hang).
fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[test]
fn a_log_thread_panic_does_not_prevent_the_demo_summary() {
    captured();
    let cfg = DemoConfig {
        max_tokens: Some(40),
        duration: None,
        label: "panics-demo".into(),
        ..DemoConfig::default()
    };
    let verifier = CpuVerifier::<MAX_K>::new(1).unwrap();
    let readback = verifier.readback();
    let mut summary = None;
    let r = demo::run(
        &cfg,
        demo::CORPUS,
        verifier,
        readback,
        &mut std::io::sink(),
        &mut |s| summary = Some(s.totals),
    );
    assert!(
        matches!(r, Err(demo::DemoError::LogThread(_))),
        "the panic is reported: {r:?}"
    );
    let totals = summary.expect("the summary was produced");
    assert!(totals.emitted_tokens >= 40, "{totals:?}");
}

#[test]
fn a_demo_stops_early_on_a_shutdown_request_and_flushes() {
    captured();
    let stop = Shutdown::new();
    let cfg = DemoConfig {
        duration: Some(Duration::from_secs(3600)),
        log_interval: Duration::from_millis(50),
        label: "stopped-demo".into(),
        shutdown: stop.clone(),
        ..DemoConfig::default()
    };
    let verifier = CpuVerifier::<MAX_K>::new(1).unwrap();
    let readback = verifier.readback();
    let asker = stop.clone();
    let summary = returns("a demo asked to stop", move || {
        let mut on_done = |s: &demo::DemoSummary| {
            if s.steps == 0 {
                eprintln!("stopped before the first step");
            }
        };
        // Asked to stop once the loop has logged counts (so there is something to flush).
        let t = std::thread::spawn(move || {
            while !lines_for("stopped-demo")
                .iter()
                .any(|l| l.contains("Accepted: "))
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            asker.request(Reason::Requested);
        });
        let r = demo::run(
            &cfg,
            demo::CORPUS,
            verifier,
            readback,
            &mut std::io::sink(),
            &mut on_done,
        );
        t.join().unwrap();
        r
    })
    .unwrap();
    assert_eq!(summary.stopped_by, Some(Reason::Requested));
    assert!(summary.steps > 0);
    assert!(
        summary
            .to_string()
            .contains("stopped early by:        request")
    );
    // Flushed: the slot's totals are the verifier's, step for step.
    assert_eq!(summary.totals.drafts, summary.steps * 8);
}
