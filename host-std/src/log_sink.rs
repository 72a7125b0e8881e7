//! The log sink: the core's [`Report`] line through the `log` facade, on its own schedule;
//! and [`LineLogger`], a `log` backend whose failed writes are counted, never a panic.
//!
//! `log` rather than `tracing`: a library should emit through the smallest facade and let the
//! application choose the backend; every `tracing` subscriber can take `log` records (through
//! `tracing-log`), while the reverse needs `tracing`'s heavier dependency tree in every user.

use crate::advice::{CostReading, Sources};
use crate::clock::{StdClock, duration_ns};
use crate::shutdown_request::{Reason, Shutdown};
use crate::wiring::Slots;
use specula_core::{Clock, Cursor, Interval, Report, Snapshot, Taken, VllmReport, ZeroPeriod};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The `log` target of every line.
pub const TARGET: &str = "specula";

/// The shortest log period: a shorter one is raised to this (1 ms). Every tick logs a line,
/// so a shorter period would only flood the log and spin a core.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

/// One line that was logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged<const K: usize> {
    /// The engine/rank label.
    pub label: Arc<str>,
    /// What the cursor took: the interval delta and the lifetime totals; `None` for a tick
    /// with no new collection (the line then says how old the data is).
    pub taken: Option<Taken<K>>,
    /// How old the newest collected data was when the line was logged (the tick's time minus
    /// the snapshot's `at_ns`); `None` when nothing was ever collected, and for the lines of
    /// [`LogSink::drain`], which has no clock.
    pub age_ns: Option<u64>,
}

/// The line of a log tick that found no new collection: how old the data is, and the
/// lifetime totals it still holds.
///
/// `SpecDecoding metrics [rank0]: no new collection since the previous line; the newest data
/// is 12.30 s old | lifetime: drafts=…, drafted=…, accepted=…, emitted=…` (and `, readback
/// errors=N` when there were some); before any collection: `… no collection yet, 5.00 s after
/// the log started`.
#[derive(Clone, Copy, Debug)]
pub struct StaleReport<'a, const K: usize> {
    label: &'a str,
    /// The last snapshot taken (None: never collected).
    last: Option<&'a Snapshot<K>>,
    /// Age of `last`, or time since the sink started when there is none.
    age_ns: u64,
    /// The prefix: "SpecDecoding metrics", or "Specula collection" beside vLLM's lines.
    prefix: &'static str,
}

impl<'a, const K: usize> StaleReport<'a, K> {
    /// The stale line for `label`: `last` is the newest snapshot seen (`None` if nothing was
    /// ever collected) and `age_ns` its age (or the time since the log started).
    pub fn new(label: &'a str, last: Option<&'a Snapshot<K>>, age_ns: u64) -> Self {
        Self {
            label,
            last,
            age_ns,
            prefix: "SpecDecoding metrics",
        }
    }

    /// The same line with the prefix `Specula collection [label]: `, for a log that carries
    /// vLLM's lines ([`LogSink::with_vllm_lines`]): a parser keyed on vLLM's
    /// `SpecDecoding metrics` never mistakes it for one of them.
    #[must_use]
    pub fn beside_vllm_lines(mut self) -> Self {
        self.prefix = "Specula collection";
        self
    }
}

impl<const K: usize> std::fmt::Display for StaleReport<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.age_ns as f64 / 1e9;
        let Some(s) = self.last else {
            return write!(
                f,
                "{} [{}]: no collection yet, {secs:.2} s after the log started",
                self.prefix, self.label
            );
        };
        let t = &s.counters;
        write!(
            f,
            "{} [{}]: no new collection since the previous line; the newest data is {secs:.2} s \
             old | lifetime: drafts={}, drafted={}, accepted={}, emitted={}",
            self.prefix, self.label, t.drafts, t.draft_tokens, t.accepted_tokens, t.emitted_tokens
        )?;
        if s.readback_errors != 0 {
            write!(f, ", readback errors={}", s.readback_errors)?;
        }
        Ok(())
    }
}

struct Entry<const K: usize> {
    label: Arc<str>,
    cursor: Cursor<'static, K>,
    /// The cursor has taken a snapshot (its `seen` is a real collection).
    collected: bool,
    /// The costs read at the previous line (the detailed form's advice is over each line's
    /// interval, costs included).
    costs: Option<CostReading>,
}

/// Logs every slot's line once per interval.
///
/// Each slot has its own [`Cursor`], so the sink's grid need not line up with the collectors':
/// a tick that finds a new publication logs the core's [`Report`] (the exact delta since the
/// previous line, rates over the time between the two snapshots compared, lifetime totals); a
/// tick that finds none still logs a line ([`StaleReport`]) that says how old the data is, so a
/// stalled collection shows within one interval.
///
/// A sink created after a slot's first publication starts from the snapshot it finds there:
/// its first line covers what was counted since, and its rates are over the time between that
/// snapshot and the new one (never over the sink's own age). A sink created before the first
/// publication counts from zero, and `start_ns` (when counting started, on the collector's
/// clock) gives its first line a rate.
pub struct LogSink<const K: usize> {
    entries: Vec<Entry<K>>,
    interval: Interval,
    start_ns: u64,
    level: log::Level,
    /// `Some(draft length)`: log vLLM's line ([`VllmReport`]) instead of the native one.
    vllm: Option<usize>,
    /// `Some`: the native line's detailed form, with these cost sources for the advice.
    detail: Option<Sources>,
}

impl<const K: usize> std::fmt::Debug for LogSink<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogSink")
            .field("interval", &self.interval)
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl<const K: usize> LogSink<K> {
    /// A sink over `slots` that logs at `level` every `period` on a grid starting at `start_ns`.
    /// A period under [`MIN_PERIOD`] is raised to it.
    ///
    /// # Errors
    /// A zero `period`.
    pub fn new(
        slots: &Slots<K>,
        period: Duration,
        start_ns: u64,
        level: log::Level,
    ) -> Result<Self, ZeroPeriod> {
        if period.is_zero() {
            return Err(ZeroPeriod);
        }
        let period = period.max(MIN_PERIOD);
        let entries = slots
            .cursors_at(start_ns)
            .into_iter()
            .map(|(label, mut cursor)| {
                // Attached late: the snapshot already there is this sink's baseline, so its
                // first delta and its first rate span the same two snapshots.
                let collected = cursor.reader().version() != 0 && cursor.take().is_some();
                Entry {
                    label,
                    cursor,
                    collected,
                    costs: None,
                }
            })
            .collect();
        Ok(Self {
            entries,
            interval: Interval::new(duration_ns(period), start_ns)?,
            start_ns,
            level,
            vllm: None,
            detail: None,
        })
    }

    /// Logs the native line's detailed form ([`Report::detailed`]): the acceptance-length
    /// distribution, the conditional acceptance per position and, for an engine with a cost
    /// source in `sources`, the draft-length advice, each over the line's interval and over the
    /// lifetime (the advice's costs: those recorded during the interval, or all of them when
    /// none were). No effect on vLLM's lines ([`with_vllm_lines`](Self::with_vllm_lines)),
    /// whose format is vLLM's.
    #[must_use]
    pub fn with_detail(mut self, sources: Sources) -> Self {
        self.detail = Some(sources);
        self
    }

    /// Logs vLLM v1's exact `SpecDecoding metrics: …` line ([`VllmReport`], with `draft_len`
    /// per-position values, capped at `K`) instead of the native line, so a log parser written
    /// for vLLM reads it unchanged: no engine label, no lifetime part, and nothing for an
    /// interval without drafts. What vLLM's line has no room for goes on lines a vLLM parser
    /// does not match, so every tick still has a line: an interval without drafts logs
    /// `Specula collection [label]: no drafts since the previous line | lifetime: drafts=N`, a
    /// tick with no new collection [`StaleReport`] prefixed `Specula collection [label]: `, and
    /// new readback errors a warning `Specula readback errors [label]: N (+n)`.
    #[must_use]
    pub fn with_vllm_lines(mut self, draft_len: usize) -> Self {
        self.vllm = Some(draft_len.clamp(1, K.max(1)));
        self
    }

    /// When the interval is due at `now_ns`, logs one line per slot and returns them: the
    /// report of what is new, or a line that says how old the data is; otherwise returns
    /// nothing.
    pub fn poll(&mut self, now_ns: u64) -> Vec<Logged<K>> {
        if !self.interval.due(now_ns) {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(self.entries.len());
        let (level, vllm, start_ns) = (self.level, self.vllm, self.start_ns);
        for e in &mut self.entries {
            let taken = e.cursor.take();
            let detail = taken
                .as_ref()
                .and_then(|_| detail_of(self.detail.as_ref(), e));
            e.collected |= taken.is_some();
            let seen = *e.cursor.seen();
            let collected = e.collected;
            let age_ns = collected.then(|| now_ns.saturating_sub(seen.at_ns));
            match &taken {
                Some(t) => log_taken(level, vllm, detail, &e.label, t),
                None => {
                    let mut stale = StaleReport::new(
                        &e.label,
                        collected.then_some(&seen),
                        age_ns.unwrap_or_else(|| now_ns.saturating_sub(start_ns)),
                    );
                    if vllm.is_some() {
                        stale = stale.beside_vllm_lines();
                    }
                    log::log!(target: TARGET, level, "{stale}");
                }
            }
            out.push(Logged {
                label: Arc::clone(&e.label),
                taken,
                age_ns,
            });
        }
        out
    }

    /// Logs whatever is new now, whatever the interval (at shutdown, after the collectors'
    /// flush); a slot with nothing new logs nothing here.
    pub fn drain(&mut self) -> Vec<Logged<K>> {
        let mut out = Vec::new();
        let (level, vllm) = (self.level, self.vllm);
        for e in &mut self.entries {
            if let Some(taken) = e.cursor.take() {
                e.collected = true;
                let detail = detail_of(self.detail.as_ref(), e);
                log_taken(level, vllm, detail, &e.label, &taken);
                out.push(Logged {
                    label: Arc::clone(&e.label),
                    taken: Some(taken),
                    age_ns: None,
                });
            }
        }
        out
    }

    /// When the next interval is due.
    pub fn next_ns(&self) -> u64 {
        self.interval.next_ns()
    }

    /// Runs the sink on its own thread, sleeping until each interval is due.
    pub fn spawn(self, clock: StdClock) -> std::io::Result<LogThread<K>> {
        self.spawn_inner(clock, false)
    }

    /// [`spawn`](Self::spawn), keeping every [`Logged`] line for [`LogThread::stop`] to return
    /// (for tests and short runs: it grows with every line).
    pub fn spawn_recording(self, clock: StdClock) -> std::io::Result<LogThread<K>> {
        self.spawn_inner(clock, true)
    }

    fn spawn_inner(self, clock: StdClock, record: bool) -> std::io::Result<LogThread<K>> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("specula-log".into())
            .spawn(move || run(self, clock, &stop2, record))?;
        Ok(LogThread { stop, handle })
    }
}

/// The detailed form's cost models for one line of `e` (`None`: the plain form): over the
/// interval since `e`'s previous line and over everything, for an engine with a cost source.
/// Moves `e`'s cost reading on.
fn detail_of<const K: usize>(sources: Option<&Sources>, e: &mut Entry<K>) -> Option<Detail> {
    let sources = sources?;
    let now = sources.costs(&e.label).map(|c| c.read());
    let interval = now.and_then(|n| n.since(e.costs.as_ref()).ok());
    let lifetime = now.and_then(|n| n.since(None).ok());
    e.costs = now;
    Some([interval, lifetime])
}

/// The detailed form's cost models: the interval's, the lifetime's.
type Detail = [Option<specula_core::CostModel>; 2];

/// Logs the line of one take: the native [`Report`] (its detailed form with `detail`), or with
/// `vllm` (a draft length) vLLM's.
fn log_taken<const K: usize>(
    level: log::Level,
    vllm: Option<usize>,
    detail: Option<Detail>,
    label: &str,
    t: &Taken<K>,
) {
    match vllm {
        None => {
            let report = Report::new(label, t);
            match detail {
                Some([interval, lifetime]) => log::log!(
                    target: TARGET,
                    level,
                    "{}",
                    report.detailed_with(interval, lifetime)
                ),
                None => log::log!(target: TARGET, level, "{report}"),
            }
        }
        Some(n) => {
            match VllmReport::new(t, n) {
                Some(line) => log::log!(target: TARGET, level, "{line}"),
                // vLLM logs nothing for an interval without drafts; the tick still has its
                // line, on a prefix vLLM parsers do not match.
                None => log::log!(
                    target: TARGET,
                    level,
                    "Specula collection [{label}]: no drafts since the previous line | \
                     lifetime: drafts={}",
                    t.snapshot.counters.drafts
                ),
            }
            if t.new_readback_errors != 0 {
                log::warn!(
                    target: TARGET,
                    "Specula readback errors [{label}]: {} (+{})",
                    t.snapshot.readback_errors,
                    t.new_readback_errors
                );
            }
        }
    }
}

/// The log thread: no lock anywhere. It parks until the next tick (or `stop`'s unpark) and
/// re-checks the flag after every wake-up, so `stop` is seen within one park whatever the
/// period (and the period is at least [`MIN_PERIOD`], so it never spins).
fn run<const K: usize>(
    mut sink: LogSink<K>,
    clock: StdClock,
    stop: &AtomicBool,
    record: bool,
) -> (LogSink<K>, Vec<Logged<K>>) {
    let mut logged = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let wait = sink.next_ns().saturating_sub(clock.now_ns());
        if wait > 0 {
            // Spurious wake-ups and `stop`'s unpark both come back here to re-check.
            std::thread::park_timeout(Duration::from_nanos(wait));
            continue;
        }
        let lines = sink.poll(clock.now_ns());
        if record {
            logged.extend(lines);
        }
    }
    // Shutdown: the collectors were flushed before `stop`, so this logs the last counts.
    let lines = sink.drain();
    if record {
        logged.extend(lines);
    }
    (sink, logged)
}

/// The log thread panicked (its logger did): the message, when the panic carried one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogThreadPanicked(pub String);

impl std::fmt::Display for LogThreadPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the log thread panicked: {}", self.0)
    }
}

impl std::error::Error for LogThreadPanicked {}

/// A [`LogSink`] running on its own thread.
#[derive(Debug)]
pub struct LogThread<const K: usize> {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(LogSink<K>, Vec<Logged<K>>)>,
}

impl<const K: usize> LogThread<K> {
    /// Stops the thread after one final [`drain`](LogSink::drain); returns the sink and, when
    /// it was started with [`spawn_recording`](LogSink::spawn_recording), every line it logged.
    /// Flush the collectors first.
    ///
    /// Never hangs on the thread's schedule: the thread holds no lock and is woken at once.
    ///
    /// # Errors
    /// The thread panicked (a logger's panic): returned, not re-raised, so the caller can
    /// still print its summary from the slots.
    pub fn stop(self) -> Result<(LogSink<K>, Vec<Logged<K>>), LogThreadPanicked> {
        self.stop.store(true, Ordering::Release);
        self.handle.thread().unpark();
        self.handle.join().map_err(|p| {
            LogThreadPanicked(
                p.downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into()),
            )
        })
    }
}

/// A `log` backend that writes each record as one line (`LEVEL target: message`) to a stream,
/// stderr by default. A failed write (a closed pipe, a full disk) is counted
/// ([`failed_writes`](Self::failed_writes)) and, if set, requests a [`Shutdown`] with
/// [`Reason::Output`]; it never panics, unlike `eprintln!`.
///
/// ```
/// use specula::log_sink::LineLogger;
/// let logger = LineLogger::new(Box::new(std::io::sink()), log::LevelFilter::Info);
/// log::Log::log(&logger, &log::Record::builder().args(format_args!("hello")).build());
/// assert_eq!(logger.failed_writes(), 0);
/// ```
pub struct LineLogger {
    out: Mutex<Box<dyn Write + Send>>,
    level: log::LevelFilter,
    failed: AtomicU64,
    first_error: OnceLock<std::io::ErrorKind>,
    on_failure: OnceLock<Shutdown>,
}

impl std::fmt::Debug for LineLogger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineLogger")
            .field("level", &self.level)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl LineLogger {
    /// A logger writing records at `level` or above to `out`.
    pub fn new(out: Box<dyn Write + Send>, level: log::LevelFilter) -> Self {
        Self {
            out: Mutex::new(out),
            level,
            failed: AtomicU64::new(0),
            first_error: OnceLock::new(),
            on_failure: OnceLock::new(),
        }
    }

    /// A logger writing to stderr.
    pub fn stderr(level: log::LevelFilter) -> Self {
        Self::new(Box::new(std::io::stderr()), level)
    }

    /// On a failed write, also request `shutdown` with [`Reason::Output`] (the first setting
    /// wins; returns false if one was already set).
    pub fn request_on_failure(&self, shutdown: Shutdown) -> bool {
        self.on_failure.set(shutdown).is_ok()
    }

    /// Lines that could not be written.
    pub fn failed_writes(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// The kind of the first failed write, if any.
    pub fn first_error(&self) -> Option<std::io::ErrorKind> {
        self.first_error.get().copied()
    }
}

impl log::Log for LineLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.level
    }

    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let written = writeln!(out, "{:<5} {}: {}", r.level(), r.target(), r.args())
            .and_then(|()| out.flush());
        drop(out);
        if let Err(e) = written {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let _ = self.first_error.set(e.kind());
            if let Some(s) = self.on_failure.get() {
                s.request(Reason::Output);
            }
        }
    }

    fn flush(&self) {
        let _ = self
            .out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush();
    }
}
