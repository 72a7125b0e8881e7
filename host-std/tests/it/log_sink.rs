//! The log sink through the real `StdClock` path, with collection and log grids misaligned.

use specula::specula_core::StepTiming;
use specula::specula_core::{Clock, Collector, Counters, Readback, Snapshot, Tick};
use specula::{HostReadback, LineLogger, LogSink, Shutdown, StdClock, Ticker, wire};
use std::task::Poll;
use std::time::Duration;

use crate::log_capture::captured;

fn lines_for(label: &str) -> Vec<String> {
    let tag = format!("[{label}]");
    captured()
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&tag))
        .cloned()
        .collect()
}

/// SplitMix64, as the demo's generator (`cli/src/ngram.rs`): seeded draft lengths and accepted
/// counts, the same on every run.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        (unit * n as f64) as usize % n.max(1)
    }
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
    let mut driver = Ticker::new(
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
            // A log tick happened: it always logs a line, with new counts or with their age.
            assert_eq!(out.len(), 1, "one line per slot on every tick");
            let fresh = out.iter().any(|l| l.taken.is_some());
            if any_published {
                ticks_after_first += 1;
                ticks_logged += u32::from(fresh);
            }
            if published_since_tick > 0 && !fresh {
                silent_with_news += 1;
            }
            published_since_tick = 0;
        }
        for t in out.iter().filter_map(|l| l.taken.as_ref()) {
            logged.add(&t.delta);
        }
        lines += out.len();
        std::thread::sleep(Duration::from_millis(1 + rng.below(3) as u64));
    }
    driver.flush().unwrap();
    for l in sink.drain() {
        logged.add(&l.taken.expect("drain logs only new counts").delta);
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
    let mut driver = Ticker::new(
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
    let (_, logged) = log.stop().expect("the log thread did not panic");
    let mut sum = Counters::<4>::ZERO;
    for t in logged.iter().filter_map(|l| l.taken.as_ref()) {
        sum.add(&t.delta);
    }
    assert_eq!(sum, *driver.collector().readback().counters());
    assert!(logged.len() >= 2, "{} lines", logged.len());
    assert_eq!(lines_for("threaded").len(), logged.len());
}

/// A readback the test can stall: `poll` stays pending while `stalled`, and `flush` (the
/// blocking path) always recovers the counts.
#[derive(Default)]
struct Stallable {
    counts: Counters<4>,
    stalled: bool,
}

impl Readback<4> for Stallable {
    type Error = ();
    fn start(&mut self) -> Result<(), ()> {
        Ok(())
    }
    fn poll(&mut self) -> Poll<Result<Counters<4>, ()>> {
        if self.stalled {
            Poll::Pending
        } else {
            Poll::Ready(Ok(self.counts))
        }
    }
    fn flush(&mut self) -> Result<Counters<4>, ()> {
        Ok(self.counts)
    }
}

const S: u64 = 1_000_000_000;

/// Ticks the collector twice at `now` (start, then poll), as `Ticker::step` does.
fn collect(c: &mut Collector<'static, Stallable, 4>, now: u64) {
    if let Tick::Started = c.tick(now) {
        c.tick(now);
    }
}

#[test]
fn a_tick_with_no_new_collection_logs_how_old_the_data_is() {
    captured();
    let wired = wire::<4, _>(["stalled"]).unwrap();
    let writer = wired.writers.into_iter().next().unwrap();
    // Collections every 2 s from 0; log ticks every 1 s from 0.2 s: 1.2, 2.2, 3.2, …
    let mut c = Collector::new(Stallable::default(), writer, 2 * S, 0).unwrap();
    let mut sink = LogSink::new(
        &wired.slots,
        Duration::from_secs(1),
        S / 5,
        log::Level::Info,
    )
    .unwrap();
    let mut logged = Counters::<4>::ZERO;
    let mut poll = |sink: &mut LogSink<4>, now: u64| {
        let out = sink.poll(now);
        assert_eq!(out.len(), 1, "a tick at {now} logs a line");
        if let Some(t) = &out[0].taken {
            logged.add(&t.delta);
        }
        out.into_iter().next().unwrap()
    };
    c.readback_mut().counts.record(4, 2).unwrap();
    let before_any = poll(&mut sink, 12 * S / 10);
    assert_eq!((before_any.taken, before_any.age_ns), (None, None));
    collect(&mut c, 2 * S);
    let fresh = poll(&mut sink, 22 * S / 10);
    assert!(fresh.taken.is_some());
    assert_eq!(fresh.age_ns, Some(S / 5));
    // The readback stalls: the engine goes on counting, nothing new is published.
    c.readback_mut().stalled = true;
    c.readback_mut().counts.record(4, 4).unwrap();
    let mut ages = Vec::new();
    for tick in [32, 42, 52] {
        let now = tick * S / 10;
        collect(&mut c, now);
        let l = poll(&mut sink, now);
        assert_eq!(l.taken, None, "nothing new at {now}");
        ages.push(l.age_ns);
    }
    // Seen within one interval, and the age grows by one interval per tick.
    assert_eq!(
        ages,
        [Some(12 * S / 10), Some(22 * S / 10), Some(32 * S / 10)]
    );
    // The blocking flush recovers everything; the next tick logs it.
    c.flush(55 * S / 10).unwrap();
    let after = poll(&mut sink, 62 * S / 10);
    assert_eq!(after.taken.map(|t| t.snapshot.counters.drafts), Some(2));
    assert_eq!(logged, c.readback().counts, "deltas sum to the totals");
    let lines = lines_for("stalled");
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert_eq!(
        lines[0],
        "SpecDecoding metrics [stalled]: no collection yet, 1.00 s after the log started"
    );
    assert_eq!(
        lines[2],
        "SpecDecoding metrics [stalled]: no new collection since the previous line; the newest \
         data is 1.20 s old | lifetime: drafts=1, drafted=4, accepted=2, emitted=3"
    );
    assert!(
        lines[4].contains("the newest data is 3.20 s old"),
        "{}",
        lines[4]
    );
    assert!(lines[5].contains("lifetime: drafts=2,"), "{}", lines[5]);
}

#[test]
fn a_sink_attached_late_rates_its_first_line_over_the_snapshots_it_compares() {
    captured();
    let wired = wire::<4, _>(["late"]).unwrap();
    let mut writer = wired.writers.into_iter().next().unwrap();
    // 60 s of counting (6000 draft tokens) before the sink exists.
    let mut s = Snapshot::<4>::ZERO;
    for _ in 0..1500 {
        s.counters.record(4, 2).unwrap();
    }
    s.at_ns = 60 * S;
    writer.publish(&s);
    let mut sink = LogSink::new(
        &wired.slots,
        Duration::from_secs(3),
        61 * S,
        log::Level::Info,
    )
    .unwrap();
    // 3 s later: 300 more draft tokens.
    for _ in 0..75 {
        s.counters.record(4, 1).unwrap();
    }
    s.at_ns = 63 * S;
    writer.publish(&s);
    let out = sink.poll(64 * S);
    let taken = out[0].taken.expect("new counts");
    assert_eq!(taken.delta.draft_tokens, 300, "only what was counted since");
    assert_eq!(taken.elapsed_ns, Some(3 * S), "between the two snapshots");
    let rates = taken.rates().unwrap();
    assert_eq!(rates.drafted_per_second(), Some(100.0));
    let line = lines_for("late").pop().unwrap();
    assert!(
        line.contains("Drafted throughput: 100.00 tokens/s"),
        "{line}"
    );
    assert!(line.contains("lifetime: drafts=1575,"), "{line}");
}

#[test]
fn every_due_tick_logs_a_line_and_periods_under_1_ms_are_raised_to_it() {
    let wired = wire::<4, _>(["idle"]).unwrap();
    let mut sink =
        LogSink::new(&wired.slots, Duration::from_nanos(1), 0, log::Level::Info).unwrap();
    assert!(sink.poll(999_999).is_empty(), "not due before 1 ms");
    let l = sink.poll(1_000_000);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].taken, None);
    assert_eq!(sink.next_ns(), 2_000_000);
    assert!(sink.drain().is_empty(), "drain logs only new counts");
    assert!(LogSink::new(&wired.slots, Duration::ZERO, 0, log::Level::Info).is_err());
}

/// Runs `f` on another thread; fails if it has not returned within a minute (a hang).
fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[test]
fn log_thread_stop_never_hangs_at_any_period() {
    captured();
    let wired = wire::<4, _>(["stopper"]).unwrap();
    let clock = StdClock::new();
    for period in [
        Duration::from_nanos(1),
        Duration::from_micros(1),
        Duration::from_millis(1),
        Duration::from_secs(3600),
    ] {
        for run_first in [false, true] {
            let log = LogSink::new(&wired.slots, period, clock.now_ns(), log::Level::Info)
                .unwrap()
                .spawn_recording(clock)
                .unwrap();
            if run_first {
                std::thread::sleep(Duration::from_millis(5));
            }
            let r = returns("LogThread::stop", move || log.stop());
            let (_, lines) = r.expect("no panic");
            assert!(
                lines.iter().all(|l| l.taken.is_none()),
                "{period:?}: nothing was published"
            );
        }
    }
}

#[test]
fn a_panicking_logger_is_returned_by_stop_not_re_raised() {
    captured();
    let wired = wire::<4, _>(["panics"]).unwrap();
    let mut writer = wired.writers.into_iter().next().unwrap();
    let clock = StdClock::new();
    let log = LogSink::new(
        &wired.slots,
        Duration::from_millis(1),
        clock.now_ns(),
        log::Level::Info,
    )
    .unwrap()
    .spawn(clock)
    .unwrap();
    // Something new to log: at the latest the final drain logs it, and the logger panics.
    let mut s = Snapshot::<4>::ZERO;
    s.counters.record(4, 1).unwrap();
    writer.publish(&s);
    let r = returns("LogThread::stop", move || log.stop());
    let err = r.expect_err("the logger panicked");
    assert!(err.0.contains("this logger breaks on"), "{err}");
}

/// A stream that is always full.
struct Full;

impl std::io::Write for Full {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::StorageFull.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failed_log_write_is_counted_and_requests_shutdown_never_panics() {
    let mut streams: Vec<(&str, Box<dyn std::io::Write + Send>)> = vec![("Full", Box::new(Full))];
    match std::fs::OpenOptions::new().write(true).open("/dev/full") {
        Ok(f) => streams.push(("/dev/full", Box::new(f))),
        Err(e) => eprintln!("SKIPPED the /dev/full case: {e}"),
    }
    for (name, out) in streams {
        let logger = LineLogger::new(out, log::LevelFilter::Info);
        let stop = Shutdown::new();
        assert!(logger.request_on_failure(stop.clone()));
        let record = |msg| {
            log::Log::log(
                &logger,
                &log::Record::builder()
                    .level(log::Level::Info)
                    .target("specula")
                    .args(format_args!("{msg}"))
                    .build(),
            );
        };
        record("one");
        record("two");
        log::Log::log(
            &logger,
            &log::Record::builder()
                .level(log::Level::Debug)
                .args(format_args!("below the level: not written"))
                .build(),
        );
        assert_eq!(logger.failed_writes(), 2, "{name}");
        assert_eq!(
            logger.first_error(),
            Some(std::io::ErrorKind::StorageFull),
            "{name}"
        );
        assert_eq!(stop.reason(), Some(specula::shutdown::Reason::Output));
        assert!(stop.output_failed());
    }
}

#[test]
fn vllm_lines_are_vllms_exact_format_and_skip_idle_intervals() {
    captured();
    let label = "vllm-mode";
    let wired = wire::<4, _>([label]).unwrap();
    let mut writer = wired.writers.into_iter().next().unwrap();
    let s = 1_000_000_000u64;
    let mut sink = LogSink::new(&wired.slots, Duration::from_secs(1), 0, log::Level::Info)
        .unwrap()
        .with_vllm_lines(2);
    let vllm_lines = || -> Vec<String> {
        captured()
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("SpecDecoding metrics: "))
            .cloned()
            .collect()
    };
    let mut snap = Snapshot::<4>::ZERO;
    snap.counters.record(2, 1).unwrap();
    snap.counters.record(2, 2).unwrap();
    snap.at_ns = s / 2;
    writer.publish(&snap);
    assert_eq!(sink.poll(s).len(), 1);
    // Over the 0.5 s since counting started; per position: accepted there / all drafts; two
    // positions (the draft length), not K = 4.
    assert_eq!(
        vllm_lines(),
        [
            "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 6.00 \
          tokens/s, Drafted throughput: 8.00 tokens/s, Accepted: 3 tokens, Drafted: 4 tokens, \
          Per-position acceptance rate: 1.000, 0.500, Avg Draft acceptance rate: 75.0%"
        ]
    );
    // A new collection without drafts: no vLLM line (vLLM prints none), but the new readback
    // error is reported on a line of its own.
    snap.at_ns = 3 * s / 2;
    snap.readback_errors = 1;
    writer.publish(&snap);
    let logged = sink.poll(2 * s);
    assert_eq!(logged[0].taken.map(|t| t.delta.drafts), Some(0));
    // No new collection at all: the staleness line, under a prefix vLLM parsers do not match.
    sink.poll(3 * s);
    assert_eq!(vllm_lines().len(), 1, "idle intervals log no vLLM line");
    let own = lines_for(label);
    assert!(
        own.iter()
            .any(|l| l == "Specula readback errors [vllm-mode]: 1 (+1)"),
        "{own:?}"
    );
    // Every tick still has a line: the idle one on Specula's own prefix.
    assert!(
        own.iter().any(|l| l
            == "Specula collection [vllm-mode]: no drafts since the previous line | lifetime: \
                drafts=2"),
        "{own:?}"
    );
    assert!(
        own.iter().any(|l| l.starts_with(
            "Specula collection [vllm-mode]: no new collection since the previous line"
        )),
        "{own:?}"
    );
    assert!(!own.iter().any(|l| l.contains("SpecDecoding")), "{own:?}");
}

#[test]
fn the_detailed_line_carries_lengths_conditionals_and_the_interval_advice() {
    use specula::advice::{CostSource, Sources, cost_slot};
    use specula::specula_core::Report;
    use specula::specula_core::metrics::{CostModel, advise};
    captured();
    const S: u64 = 1_000_000_000;
    let wired = wire::<4, _>(["detail", "detail-fixed", "detail-none"]).unwrap();
    let mut writers = wired.writers.into_iter();
    let (mut w0, mut w1, mut w2) = (
        writers.next().unwrap(),
        writers.next().unwrap(),
        writers.next().unwrap(),
    );
    let (mut costs, reader) = cost_slot();
    let fixed = CostModel::from_ratio(0.25).unwrap();
    let sources = Sources::new()
        .with_costs("detail", CostSource::Measured(reader))
        .with_costs("detail-fixed", CostSource::Fixed(fixed));
    let mut sink = LogSink::new(&wired.slots, Duration::from_secs(1), 0, log::Level::Info)
        .unwrap()
        .with_detail(sources);
    let mut s = Snapshot::<4>::ZERO;
    // Interval 1: everything accepted, drafts nearly free.
    for _ in 0..10 {
        s.counters.record(3, 3).unwrap();
        costs.record(&StepTiming {
            draft_len: 3,
            fixed_ns: 10_000,
            scaled_ns: 30,
            ..StepTiming::default()
        });
    }
    s.at_ns = S;
    for w in [&mut w0, &mut w1, &mut w2] {
        w.publish(&s);
    }
    assert_eq!(sink.poll(S).len(), 3);
    let first = s;
    // Interval 2: nothing past position 0, dear drafts: this interval's advice is k = 1.
    for _ in 0..10 {
        s.counters.record(3, 1).unwrap();
        costs.record(&StepTiming {
            draft_len: 3,
            fixed_ns: 10_000,
            scaled_ns: 30_000,
            ..StepTiming::default()
        });
    }
    s.at_ns = 2 * S;
    for w in [&mut w0, &mut w1, &mut w2] {
        w.publish(&s);
    }
    let out = sink.poll(2 * S);
    let taken = out[0].taken.expect("new counts");
    assert_eq!(taken.delta, s.counters.delta_since(&first.counters));
    let line = lines_for("detail").pop().unwrap();
    // The line is the core's detailed report with the interval's costs (10 µs per draft
    // forward over a 10 µs fixed part) and, for the lifetime, all of them.
    let cost = CostModel::from_ratio(1.0).unwrap();
    let all = costs.meter().cost_model().unwrap();
    let want: String = Report::new("detail", &taken)
        .detailed_with(Some(cost), Some(all))
        .to_string();
    assert_eq!(line, want);
    assert_eq!(advise(&taken.delta, &cost).unwrap().recommended(), 1);
    assert!(
        line.contains("Acceptance lengths: 0:0 1:10 2:0 3:0, Conditional acceptance: 1.000, 0.000, n/a, Advice: k=1"),
        "{line}"
    );
    assert!(
        line.contains("acceptance lengths=0:0 1:10 2:0 3:10, conditional acceptance=1.000, 0.500, 1.000, advice=k="),
        "{line}"
    );
    // A configured cost; no cost source: the detailed form without advice.
    let fixed_line = lines_for("detail-fixed").pop().unwrap();
    assert_eq!(
        fixed_line,
        Report::new("detail-fixed", &taken)
            .detailed(Some(fixed))
            .to_string()
    );
    let none = lines_for("detail-none").pop().unwrap();
    assert!(
        none.contains("Conditional acceptance: ") && !none.contains("dvice"),
        "{none}"
    );
}
