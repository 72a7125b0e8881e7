//! The log sink through the real `StdClock` path, with collection and log grids misaligned.

use specula::ngram::SplitMix64;
use specula::specula_core::{Clock, Counters, Tick};
use specula::{Driver, HostReadback, LogSink, StdClock, wire};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Captures `specula` log records so the tests see what went through the `log` facade.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.target() == specula::log_sink::TARGET {
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

/// One decode step's counts: a k-token draft with a seeded number accepted.
fn record(host: &mut HostReadback<4>, rng: &mut SplitMix64) {
    let k = 1 + rng.below(4);
    let accepted = rng.below(k + 1);
    host.record(k, accepted).unwrap();
}

#[test]
fn every_log_tick_after_the_first_collection_logs_and_deltas_sum_to_totals() {
    captured();
    let label = "misaligned";
    let wired = wire::<4, _>([label]).unwrap();
    let clock = StdClock::new();
    let writer = wired.writers.into_iter().next().unwrap();
    let mut driver = Driver::new(
        HostReadback::<4>::default(),
        writer,
        Duration::from_millis(50),
        clock,
    )
    .unwrap();
    // The log grid is offset half a period from the collection grid.
    let start = clock.now_ns() + 25_000_000;
    let mut sink = LogSink::new(
        &wired.slots,
        Duration::from_millis(50),
        start,
        log::Level::Info,
    )
    .unwrap();
    let mut rng = SplitMix64::new(7);
    let mut logged = Counters::<4>::ZERO;
    let (mut published_since_tick, mut any_published) = (0u32, false);
    let (mut ticks_after_first, mut ticks_logged, mut silent_with_news) = (0u32, 0u32, 0u32);
    let mut lines = 0usize;
    let end = clock.now_ns() + 1_200_000_000;
    while clock.now_ns() < end {
        record(driver.collector_mut().readback_mut(), &mut rng);
        if let Tick::Published(_) = driver.step() {
            published_since_tick += 1;
            any_published = true;
        }
        let before = sink.next_ns();
        let out = sink.poll(clock.now_ns());
        if sink.next_ns() != before {
            // A log tick happened.
            if any_published {
                ticks_after_first += 1;
                ticks_logged += u32::from(!out.is_empty());
            }
            if published_since_tick > 0 && out.is_empty() {
                silent_with_news += 1;
            }
            published_since_tick = 0;
        }
        for l in &out {
            logged.add(&l.taken.delta);
        }
        lines += out.len();
        std::thread::sleep(Duration::from_millis(1 + rng.below(3) as u64));
    }
    driver.flush().unwrap();
    for l in sink.drain() {
        logged.add(&l.taken.delta);
        lines += 1;
    }
    let totals = *driver.collector().readback().counters();
    assert_eq!(
        silent_with_news, 0,
        "a tick with a new publication must log"
    );
    assert!(ticks_after_first >= 10, "ran {ticks_after_first} log ticks");
    // Same period, offset grids: each log interval holds one collection, so a tick stays silent
    // only when a stall longer than the offset swallowed one. Almost all must log.
    assert!(
        ticks_logged * 10 >= ticks_after_first * 9,
        "{ticks_logged} of {ticks_after_first} ticks logged"
    );
    assert_eq!(logged, totals, "sum of logged deltas == totals after flush");
    assert!(totals.drafts > 100);
    let through_log = lines_for(label);
    assert_eq!(
        through_log.len(),
        lines,
        "every line went through the log facade"
    );
    let last = through_log.last().unwrap();
    assert!(
        last.contains(&format!("lifetime: drafts={},", totals.drafts)),
        "{last}"
    );
}

#[test]
fn log_thread_flushes_the_last_counts_at_shutdown() {
    captured();
    let wired = wire::<4, _>(["threaded"]).unwrap();
    let clock = StdClock::new();
    let writer = wired.writers.into_iter().next().unwrap();
    let mut driver = Driver::new(
        HostReadback::<4>::default(),
        writer,
        Duration::from_millis(30),
        clock,
    )
    .unwrap();
    let log = LogSink::new(
        &wired.slots,
        Duration::from_millis(50),
        clock.now_ns() + 7_000_000,
        log::Level::Info,
    )
    .unwrap()
    .spawn_recording(clock)
    .unwrap();
    let mut rng = SplitMix64::new(11);
    for _ in 0..300 {
        record(driver.collector_mut().readback_mut(), &mut rng);
        driver.step();
        std::thread::sleep(Duration::from_millis(1 + rng.below(3) as u64));
    }
    // Counts recorded after the last collection reach the log only through flush + stop.
    for _ in 0..5 {
        record(driver.collector_mut().readback_mut(), &mut rng);
    }
    driver.flush().unwrap();
    let (_, logged) = log.stop();
    let mut sum = Counters::<4>::ZERO;
    for l in &logged {
        sum.add(&l.taken.delta);
    }
    assert_eq!(sum, *driver.collector().readback().counters());
    assert!(logged.len() >= 2, "{} lines", logged.len());
    assert_eq!(lines_for("threaded").len(), logged.len());
}

#[test]
fn nothing_new_logs_nothing() {
    let wired = wire::<4, _>(["idle"]).unwrap();
    let clock = StdClock::new();
    let mut sink =
        LogSink::new(&wired.slots, Duration::from_nanos(1), 0, log::Level::Info).unwrap();
    assert!(sink.poll(clock.now_ns() + 10).is_empty());
    assert!(sink.drain().is_empty());
    assert!(LogSink::new(&wired.slots, Duration::ZERO, 0, log::Level::Info).is_err());
}
