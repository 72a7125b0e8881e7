//! Graceful shutdown: a [`Shutdown`] request any thread can raise (a signal handler, an admin
//! endpoint, a failed output), and [`finish`], the one order that loses no count.
//!
//! The library installs no signal handler (that is the application's choice, and it keeps
//! signal crates out of a runtime's build); a runtime forwards its signals to
//! [`Shutdown::request`], stops stepping when [`Shutdown::is_requested`] says so, and calls
//! [`finish`]: the collector's final blocking readback, then the log thread's last line.
//! `examples/graceful_shutdown.rs` does it with `signal-hook`; the `specula` program does the
//! same for SIGINT and SIGTERM (see its exit codes).
//!
//! ```
//! use specula::shutdown::{Reason, Shutdown, finish};
//! use specula::{Ticker, HostReadback, LogSink, StdClock, wire};
//! use specula::specula_core::Clock;
//! use std::time::Duration;
//!
//! let wired = wire::<4, _>(["rank0"]).unwrap();
//! let clock = StdClock::new();
//! let writer = wired.writers.into_iter().next().unwrap();
//! let mut driver =
//!     Ticker::new(HostReadback::<4>::default(), writer, Duration::from_secs(5), clock).unwrap();
//! let log = LogSink::new(&wired.slots, Duration::from_secs(5), clock.now_ns(), log::Level::Info)
//!     .unwrap()
//!     .spawn(clock)
//!     .unwrap();
//! let stop = Shutdown::new();
//! let asker = stop.clone(); // e.g. moved into a signal-handling thread
//! let mut steps = 0;
//! while !stop.is_requested() {
//!     driver.collector_mut().readback_mut().record(4, 2).unwrap(); // a decode step counts
//!     driver.step();
//!     steps += 1;
//!     if steps == 3 {
//!         asker.request(Reason::Requested);
//!     }
//! }
//! let done = finish(&mut driver, Some(log));
//! assert!(done.flushed.is_ok() && done.log.is_some_and(|r| r.is_ok()));
//! assert_eq!(done.totals.counters.drafts, 3); // nothing counted is lost
//! ```

use crate::log_sink::{LogThread, LogThreadPanicked, Logged};
use crate::ticker::Ticker;
// The request lives below this module and `log_sink` (whose `LineLogger` raises one on a failed
// write), so that `finish`, which stops the log thread, can sit above both.
pub use crate::shutdown_request::{Reason, Shutdown};
use specula_core::{CollectError, Readback, Snapshot};

/// What [`finish`] did.
#[derive(Debug)]
pub struct Finished<E, const K: usize> {
    /// The last snapshot the collector published: the final totals every consumer sees
    /// (after a failed flush, the last good ones, with `readback_errors` raised).
    pub totals: Snapshot<K>,
    /// The final readback: its publication version, or why it failed.
    pub flushed: Result<u64, CollectError<E>>,
    /// The log thread's end, when one was given: every line it recorded (empty unless it was
    /// started with [`spawn_recording`](crate::LogSink::spawn_recording)), or its panic, which
    /// is returned here rather than re-raised, so the caller can still print its summary.
    pub log: Option<Result<Vec<Logged<K>>, LogThreadPanicked>>,
}

/// The shutdown order that loses no count: the collector's final blocking readback
/// ([`Ticker::flush`]) publishes everything counted so far, then the log thread (if any)
/// logs its last line and stops. Prometheus and other scrape-time readers read the slot and
/// need nothing. Returns the final totals; never panics, even if the log thread did.
///
/// For several ranks, flush every driver first, then stop the log thread.
pub fn finish<R, const K: usize>(
    driver: &mut Ticker<R, K>,
    log: Option<LogThread<K>>,
) -> Finished<R::Error, K>
where
    R: Readback<K>,
    R::Error: Clone,
{
    let flushed = driver.flush();
    let totals = *driver.collector().last();
    let log = log.map(|l| l.stop().map(|(_, lines)| lines));
    Finished {
        totals,
        flushed,
        log,
    }
}
