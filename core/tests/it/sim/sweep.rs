//! The collection/log timing sweep of issue 11, as a simulation on a virtual clock.
//!
//! Decode steps arrive every `step_ns ± jitter_ns`; each records one verification on the
//! simulated device and ticks the collector. A log consumer wakes at exact grid times
//! `log_phase + n·log_ns` (a log thread sleeping until its deadline) and takes its cursor. At
//! equal times the step runs first.

use super::{Mix, SimDevice};
use specula_core::{Clock, Collector, Counters, Cursor, SeqSlot, Snapshot, Tick, VirtualClock};

/// One simulated run.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Collection period.
    pub collect_ns: u64,
    /// Log period.
    pub log_ns: u64,
    /// The log grid's start: its first tick is at `log_phase_ns + log_ns`.
    pub log_phase_ns: u64,
    /// Mean time between decode steps.
    pub step_ns: u64,
    /// Each step gap is uniform in `step_ns ± jitter_ns`.
    pub jitter_ns: u64,
    /// Readback latency.
    pub latency_ns: u64,
    /// Each readback's latency is uniform in `latency_ns ± latency_jitter_ns`.
    pub latency_jitter_ns: u64,
    /// Length of the run.
    pub run_ns: u64,
    /// Tell the collector the log grid (`set_deadlines`); `false` is the collection grid only.
    pub deadlines: bool,
    /// Readbacks the device lets be in flight at once.
    pub capacity: usize,
    /// Seed of the step jitter and acceptance pattern.
    pub seed: u64,
    /// Log ticks up to this time are not counted (nor are those before the first
    /// publication): comparisons between two ways of collecting count the same ticks.
    pub count_after_ns: u64,
}

/// What one run saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Log ticks after the first publication.
    pub ticks: u32,
    /// Of those, ticks whose take had nothing new.
    pub empty: u32,
    /// Of those, ticks whose interval saw a readback complete on the device with a decode step
    /// after the completion and before the tick (so the collector could publish it).
    pub ticks_with_completion: u32,
    /// Ticks with a completion in their interval that still had nothing new.
    pub empty_despite_completion: u32,
    /// Sum of every delta logged (including the last take after `flush`).
    pub logged: Counters<4>,
    /// The device's totals at the end.
    pub device: Counters<4>,
    /// The most readbacks in flight at once.
    pub max_in_flight: usize,
    /// Readbacks started.
    pub starts: u64,
    /// When the empty log ticks were.
    pub empty_at: Vec<u64>,
    /// When publications happened.
    pub published_at: Vec<u64>,
}

/// Runs one configuration.
pub fn run(cfg: Config) -> Outcome {
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
    let (writer, reader) = slot.split();
    let mut device = SimDevice::<4>::new(&clock, cfg.latency_ns);
    device.capacity = cfg.capacity;
    device.latency_jitter_ns = cfg.latency_jitter_ns;
    device.jitter_rng = Mix(cfg.seed ^ 0xA5A5_A5A5_A5A5_A5A5);
    let mut rng = Mix(cfg.seed);
    let mut collector = Collector::new(&mut device, writer, cfg.collect_ns, 0).unwrap();
    if cfg.deadlines {
        collector
            .set_deadlines(cfg.log_ns, cfg.log_phase_ns)
            .unwrap();
    }
    let mut cursor = Cursor::new(reader);
    let mut out = Outcome::default();
    let gap = |rng: &mut Mix| {
        cfg.step_ns - cfg.jitter_ns.min(cfg.step_ns - 1) + rng.below(2 * cfg.jitter_ns + 1)
    };
    let mut next_step = gap(&mut rng);
    let mut next_log = cfg.log_phase_ns + cfg.log_ns;
    let mut last_step = 0u64;
    let mut first_publication = false;
    // Completions (device-side ready times) not yet attributed to a log interval.
    let mut ready_seen = 0usize;
    while next_step.min(next_log) < cfg.run_ns {
        if next_step <= next_log {
            clock.set(next_step);
            let k = 1 + rng.below(4) as usize;
            let accepted = rng.below(k as u64 + 1) as usize;
            collector.readback_mut().totals.record(k, accepted).unwrap();
            if let Tick::Published(_) = collector.tick(next_step) {
                first_publication = true;
                out.published_at.push(next_step);
            }
            last_step = next_step;
            next_step += gap(&mut rng);
        } else {
            clock.set(next_log);
            let prev_log = next_log - cfg.log_ns;
            // Did a readback complete in (prev_log, last_step]?
            let ready = &collector.readback().ready_times;
            let mut completion = false;
            while ready_seen < ready.len() && ready[ready_seen] < last_step {
                completion |= ready[ready_seen] > prev_log && ready[ready_seen] < last_step;
                ready_seen += 1;
            }
            let taken = cursor.take();
            if first_publication && next_log > cfg.count_after_ns {
                out.ticks += 1;
                out.ticks_with_completion += u32::from(completion);
                if taken.is_none() {
                    out.empty += 1;
                    out.empty_at.push(next_log);
                    out.empty_despite_completion += u32::from(completion);
                }
            }
            if let Some(t) = taken {
                out.logged.add(&t.delta);
            }
            next_log += cfg.log_ns;
        }
    }
    collector.flush(clock.now_ns()).unwrap();
    if let Some(t) = cursor.take() {
        out.logged.add(&t.delta);
    }
    out.device = collector.readback().totals;
    out.max_in_flight = collector.readback().max_seen_in_flight;
    out.starts = collector.readback().starts();
    out
}
