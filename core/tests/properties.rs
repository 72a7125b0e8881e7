#![cfg(not(loom))]
//! Property tests: over arbitrary collect and log intervals, step timings, readback latencies,
//! readback failures and several consumers, no delta is lost, none is counted twice, and the
//! counters a consumer sees never decrease.

mod common;

use common::SimDevice;
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
    )
        .prop_map(
            |(collect_ns, consumers, steps, latency_ns, fail_mask)| Scenario {
                collect_ns,
                consumers,
                steps: steps
                    .into_iter()
                    .map(|(dt, k, a)| (dt, k, a.min(k)))
                    .collect(),
                latency_ns,
                fail_mask,
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
        let mut collector = Collector::new(&mut device, writer, s.collect_ns, 0).unwrap();
        let mut consumers: Vec<_> = s
            .consumers
            .iter()
            .map(|&(p, ph)| (Interval::new(p, ph).unwrap(), Cursor::new(reader), Counters::<4>::ZERO, Snapshot::<4>::ZERO))
            .collect();
        for &(dt, k, a) in &s.steps {
            clock.advance(dt);
            collector.readback_mut().totals.record(k as usize, a as usize).unwrap();
            let t = collector.tick(clock.now_ns());
            if t == Tick::Failed {
                prop_assert!(collector.last_error().is_some());
            }
            for (interval, cursor, sum, last) in consumers.iter_mut() {
                if interval.due(clock.now_ns())
                    && let Some(t) = cursor.take()
                {
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
