//! The log sink: the core's [`Report`] line through the `log` facade, on its own schedule.
//!
//! `log` rather than `tracing`: a library should emit through the smallest facade and let the
//! application choose the backend; every `tracing` subscriber can take `log` records (through
//! `tracing-log`), while the reverse needs `tracing`'s heavier dependency tree in every user.

use crate::clock::{StdClock, duration_ns};
use crate::wiring::Slots;
use specula_core::{Clock, Cursor, Interval, Report, Taken, ZeroPeriod};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The `log` target of every line.
pub const TARGET: &str = "specula";

/// One line that was logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged<const K: usize> {
    /// The engine/rank label.
    pub label: Arc<str>,
    /// What the cursor took: the interval delta and the lifetime totals.
    pub taken: Taken<K>,
}

/// Logs every slot's [`Report`] once per interval, and only when something new was published.
///
/// Each slot has its own [`Cursor`], so the sink's grid need not line up with the collectors':
/// an interval that saw no publication logs nothing, and the next one logs the whole delta.
pub struct LogSink<const K: usize> {
    cursors: Vec<(Arc<str>, Cursor<'static, K>)>,
    interval: Interval,
    level: log::Level,
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
    pub fn new(
        slots: &Slots<K>,
        period: Duration,
        start_ns: u64,
        level: log::Level,
    ) -> Result<Self, ZeroPeriod> {
        Ok(Self {
            // The log grid's start is when counting starts for this sink: the first line gets
            // a rate too.
            cursors: slots.cursors_at(start_ns),
            interval: Interval::new(duration_ns(period), start_ns)?,
            level,
        })
    }

    /// When the interval is due at `now_ns`, logs each slot with something new and returns what
    /// it logged; otherwise returns nothing.
    pub fn poll(&mut self, now_ns: u64) -> Vec<Logged<K>> {
        if self.interval.due(now_ns) {
            self.drain()
        } else {
            Vec::new()
        }
    }

    /// Logs whatever is new now, whatever the interval (at shutdown, after the collectors'
    /// flush).
    pub fn drain(&mut self) -> Vec<Logged<K>> {
        let mut out = Vec::new();
        for (label, cursor) in &mut self.cursors {
            if let Some(taken) = cursor.take() {
                log::log!(target: TARGET, self.level, "{}", Report::new(label, &taken));
                out.push(Logged {
                    label: Arc::clone(label),
                    taken,
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
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("specula-log".into())
            .spawn(move || run(self, clock, &stop2, record))?;
        Ok(LogThread { stop, handle })
    }
}

fn run<const K: usize>(
    mut sink: LogSink<K>,
    clock: StdClock,
    stop: &(Mutex<bool>, Condvar),
    record: bool,
) -> (LogSink<K>, Vec<Logged<K>>) {
    let mut logged = Vec::new();
    let (lock, cvar) = stop;
    let mut stopped = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        // Checked before waiting too: a `stop` sent before this thread first took the lock
        // must not cost a whole interval.
        if *stopped {
            break;
        }
        let now = clock.now_ns();
        let wait = sink.next_ns().saturating_sub(now);
        if wait > 0 {
            // A condvar, not a sleep: `stop` must not wait for the rest of an interval.
            stopped = cvar
                .wait_timeout(stopped, Duration::from_nanos(wait))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if *stopped {
            break;
        }
        let lines = sink.poll(clock.now_ns());
        if record {
            logged.extend(lines);
        }
    }
    drop(stopped);
    // Shutdown: the collectors were flushed before `stop`, so this logs the last counts.
    let lines = sink.drain();
    if record {
        logged.extend(lines);
    }
    (sink, logged)
}

/// A [`LogSink`] running on its own thread.
#[derive(Debug)]
pub struct LogThread<const K: usize> {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: JoinHandle<(LogSink<K>, Vec<Logged<K>>)>,
}

impl<const K: usize> LogThread<K> {
    /// Stops the thread after one final [`drain`](LogSink::drain); returns the sink and, when
    /// it was started with [`spawn_recording`](LogSink::spawn_recording), every line it logged.
    /// Flush the collectors first.
    pub fn stop(self) -> (LogSink<K>, Vec<Logged<K>>) {
        let (lock, cvar) = &*self.stop;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cvar.notify_all();
        match self.handle.join() {
            Ok(r) => r,
            // The thread only formats and logs; a panic there is a logger's panic: re-raise it.
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}
