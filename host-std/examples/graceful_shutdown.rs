//! Graceful shutdown in a runtime: SIGINT/SIGTERM stop the decode loop, the collector's final
//! readback publishes every count, the log thread logs the last line, and the final totals
//! equal the sum of everything logged.
//!
//! `cargo run -p specula --example graceful_shutdown [STEPS]`: runs until SIGINT/SIGTERM
//! (Ctrl-C), or until it sends itself SIGTERM after STEPS decode steps (default 300), so CI can
//! run it unattended. On non-Unix targets it just stops after STEPS steps.

use specula::log;
use specula::shutdown::{Reason, Shutdown, finish};
use specula::specula_core::{Clock, Counters};
use specula::{HostReadback, LineLogger, LogSink, StdClock, Ticker, wire};
use std::time::Duration;

const K: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|e| format!("STEPS {s:?}: {e}"))?,
        None => 300,
    };
    let logger: &'static LineLogger =
        Box::leak(Box::new(LineLogger::stderr(log::LevelFilter::Info)));
    log::set_logger(logger).map_err(|e| e.to_string())?;
    log::set_max_level(log::LevelFilter::Info);

    // The library installs no signal handler: the runtime forwards its signals to a Shutdown.
    let stop = Shutdown::new();
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
        let asker = stop.clone();
        std::thread::spawn(move || {
            for sig in signals.forever() {
                asker.request(Reason::Signal(sig));
            }
        });
    }

    let wired = wire::<K, _>(["rank0"])?;
    let clock = StdClock::new();
    let writer = wired.writers.into_iter().next().ok_or("no slot wired")?;
    let mut driver = Ticker::new(
        HostReadback::<K>::default(),
        writer,
        Duration::from_millis(20),
        clock,
    )?;
    // The log grid, shared with the collector so a readback is published before each log tick.
    let (log_period, start_ns) = (Duration::from_millis(100), clock.now_ns());
    driver
        .collector_mut()
        .set_deadlines(specula::clock::duration_ns(log_period), start_ns)?;
    let log = LogSink::new(&wired.slots, log_period, start_ns, log::Level::Info)?
        .spawn_recording(clock)?;

    let mut step = 0u64;
    while !stop.is_requested() {
        // A decode step: verification counts (here on the host; a GPU backend counts on the
        // device), then the collector's non-blocking tick.
        driver
            .collector_mut()
            .readback_mut()
            .record(K, (step % (K as u64 + 1)) as usize)?;
        driver.step();
        step += 1;
        if step == steps {
            #[cfg(unix)]
            signal_hook::low_level::raise(signal_hook::consts::SIGTERM)?;
            #[cfg(not(unix))]
            stop.request(Reason::Requested);
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    // The order that loses nothing: flush the collector, then stop the log thread.
    let done = finish(&mut driver, Some(log));
    done.flushed.map_err(|e| format!("final readback: {e}"))?;
    let lines = done.log.ok_or("no log thread")??;
    let mut logged = Counters::<K>::ZERO;
    for taken in lines.iter().filter_map(|l| l.taken.as_ref()) {
        logged.add(&taken.delta);
    }
    let t = &done.totals.counters;
    println!(
        "stopped by {} after {step} steps: drafts={} drafted={} accepted={} emitted={} \
         ({} log lines, {} failed writes)",
        stop.reason().map_or("nothing".into(), |r| r.name()),
        t.drafts,
        t.draft_tokens,
        t.accepted_tokens,
        t.emitted_tokens,
        lines.len(),
        logger.failed_writes()
    );
    if logged != *t || t.drafts != step {
        return Err("the logged deltas or the drafts do not add up to the final totals".into());
    }
    Ok(())
}
