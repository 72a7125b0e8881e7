//! Property tests: over arbitrary collect and log intervals, step timings, readback latencies,
//! readback failures and several consumers, no delta is lost, none is counted twice, and the
//! counters a consumer sees never decrease.

use crate::sim::SimDevice;
use proptest::prelude::*;
use specula_core::{
    Clock, Collector, Counters, Cursor, Interval, SeqSlot, Snapshot, Tick, VirtualClock,
};

fn config() -> ProptestConfig {
    // Miri runs every case through its interpreter: keep a handful there, and no failure
    // file (Miri's isolation forbids the file system).
    if cfg!(miri) {
        ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(3)
        }
    } else {
        ProptestConfig::with_cases(256)
    }
}

#[derive(Debug, Clone)]
struct Scenario {
    collect_ns: u64,
    consumers: Vec<(u64, u64)>, // (period, phase)
    steps: Vec<(u64, u8, u8)>,  // (dt, k, accepted)
    latency_ns: u64,
    fail_mask: u64,
    /// Consumer deadlines for the collector: (period, phase).
    deadlines: Option<(u64, u64)>,
    /// Readbacks the device lets be in flight.
    capacity: usize,
    /// Whether the device can abandon a stale readback.
    can_abandon: bool,
    stale_after_ns: u64,
    /// Readbacks started in steps whose index has this bit pattern never complete.
    stuck_mask: u64,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        1u64..=200,
        prop::collection::vec((1u64..=300, 0u64..300), 1..5),
        prop::collection::vec(
            (0u64..=40, 1u8..=4, 0u8..=4),
            1..if cfg!(miri) { 40 } else { 400 },
        ),
        0u64..=120,
        any::<u64>(),
        (
            prop::option::of((1u64..=300, 0u64..300)),
            1usize..=6,
            any::<bool>(),
            1u64..=400,
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                collect_ns,
                consumers,
                steps,
                latency_ns,
                fail_mask,
                (deadlines, capacity, can_abandon, stale_after_ns, stuck_mask),
            )| Scenario {
                collect_ns,
                consumers,
                steps: steps
                    .into_iter()
                    .map(|(dt, k, a)| (dt, k, a.min(k)))
                    .collect(),
                latency_ns,
                fail_mask,
                deadlines,
                capacity,
                can_abandon,
                stale_after_ns,
                stuck_mask,
            },
        )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_count_reaches_every_consumer_once(s in scenario()) {
        let clock = VirtualClock::new(0);
        let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
        let (writer, reader) = slot.split();
        let mut device = SimDevice::<4>::new(&clock, s.latency_ns);
        // Readbacks fail to start or to finish by an arbitrary pattern: a harsh device.
        device.fail_mask = s.fail_mask;
        device.capacity = s.capacity;
        device.can_abandon = s.can_abandon;
        let mut collector = Collector::new(&mut device, writer, s.collect_ns, 0).unwrap();
        collector.set_stale_after(s.stale_after_ns);
        if let Some((period, phase)) = s.deadlines {
            collector.set_deadlines(period, phase).unwrap();
        }
        let mut consumers: Vec<_> = s
            .consumers
            .iter()
            .map(|&(p, ph)| (Interval::new(p, ph).unwrap(), Cursor::new(reader), Counters::<4>::ZERO, Snapshot::<4>::ZERO))
            .collect();
        for (i, &(dt, k, a)) in s.steps.iter().enumerate() {
            clock.advance(dt);
            // Some readbacks never complete (abandoned, or flushed at the end).
            collector.readback_mut().stuck = (s.stuck_mask >> (i % 64)) & 1 == 1;
            collector.readback_mut().totals.record(k as usize, a as usize).unwrap();
            let t = collector.tick(clock.now_ns());
            if t == Tick::Failed {
                prop_assert!(collector.last_error().is_some());
            }
            prop_assert!(collector.in_flight_count() <= s.capacity.min(specula_core::MAX_IN_FLIGHT));
            for (interval, cursor, sum, last) in consumers.iter_mut() {
                if let Some(t) = interval.due(clock.now_ns()).then(|| cursor.take()).flatten() {
                    prop_assert!(t.snapshot.counters.dominates(&last.counters), "never decreases");
                    prop_assert!(t.snapshot.at_ns >= last.at_ns);
                    sum.add(&t.delta);
                    prop_assert_eq!(*sum, t.snapshot.counters, "deltas add up to totals");
                    *last = t.snapshot;
                }
            }
        }
        collector.flush(clock.now_ns()).unwrap();
        let device_totals = collector.readback().totals;
        for (_, cursor, sum, _) in consumers.iter_mut() {
            if let Some(t) = cursor.take() {
                sum.add(&t.delta);
            }
            prop_assert_eq!(*sum, device_totals);
        }
    }
}

fn timing_config() -> ProptestConfig {
    if cfg!(miri) {
        ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::with_cases(1)
        }
    } else {
        ProptestConfig::with_cases(48)
    }
}

proptest! {
    #![proptest_config(timing_config())]

    /// Issue 11's target as a property: with the log grid given to the collector as deadlines,
    /// 5 s / 5 s, any log phase, steps from 1 ms to 1 s with up to 10 % jitter and a constant
    /// readback latency up to the period, every log tick after the first publication has new
    /// counts, and every count is logged once. (Coarser steps, two or three per log interval,
    /// leave about one tick in 10 000 stale: core/tests/statistics/freshness.rs.)
    #[test]
    #[cfg_attr(miri, ignore = "safe code on one thread: nothing for Miri to check; slow there")]
    fn with_deadlines_every_log_tick_has_new_counts(
        log_phase_ms in 0u64..5_000,
        step_exp in 0.0f64..=3.0,
        jitter_permille in 0u64..=100,
        latency_permille in 0u64..=1_000,
        seed in any::<u64>(),
    ) {
        freshness(log_phase_ms, step_exp, jitter_permille, latency_permille, 0, seed)?;
    }

    /// The same with the readback latency varying by up to ±25 % from copy to copy, for steps
    /// from 1 ms to a third of a second (coarser steps: core/tests/statistics/freshness.rs).
    #[test]
    #[cfg_attr(miri, ignore = "safe code on one thread: nothing for Miri to check; slow there")]
    fn with_deadlines_every_log_tick_has_new_counts_despite_latency_jitter(
        log_phase_ms in 0u64..5_000,
        step_exp in 0.0f64..=2.52,
        jitter_permille in 0u64..=100,
        latency_permille in 0u64..=1_000,
        latency_jitter_permille in 0u64..=250,
        seed in any::<u64>(),
    ) {
        freshness(
            log_phase_ms,
            step_exp,
            jitter_permille,
            latency_permille,
            latency_jitter_permille,
            seed,
        )?;
    }
}

/// One run of the freshness properties: steps of `10^step_exp` ms.
fn freshness(
    log_phase_ms: u64,
    step_exp: f64,
    jitter_permille: u64,
    latency_permille: u64,
    latency_jitter_permille: u64,
    seed: u64,
) -> Result<(), TestCaseError> {
    const S: u64 = 1_000_000_000;
    // Log-uniform step period from 1 ms.
    let step_ns = ((10f64.powf(step_exp) * 1e6) as u64).clamp(1_000_000, 2 * S);
    let latency_ns = 5 * S / 1000 * latency_permille;
    let o = crate::sim::sweep::run(crate::sim::sweep::Config {
        collect_ns: 5 * S,
        log_ns: 5 * S,
        log_phase_ns: log_phase_ms * 1_000_000,
        step_ns,
        jitter_ns: step_ns / 1000 * jitter_permille,
        latency_ns,
        latency_jitter_ns: latency_ns / 1000 * latency_jitter_permille,
        run_ns: if cfg!(miri) { 12 * S } else { 40 * S },
        deadlines: true,
        capacity: specula_core::MAX_IN_FLIGHT,
        seed,
        count_after_ns: 0,
    });
    prop_assert_eq!(o.logged, o.device);
    prop_assert!(cfg!(miri) || o.ticks >= 5, "{:?}", o);
    prop_assert_eq!(o.empty, 0, "{:?}", o);
    Ok(())
}
