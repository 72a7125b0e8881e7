//! The collector's behaviour over time, on a virtual clock: stale readbacks, the ring of
//! readbacks in flight, and consumer deadlines.

use crate::sim::SimDevice;
use specula_core::{
    Clock, CollectError, Collector, Counters, Cursor, SeqSlot, Snapshot, Tick, VirtualClock,
};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// What a run of steps saw.
#[derive(Debug, Default)]
struct Seen {
    steps: u64,
    /// Clock times of the ticks that reported a failure.
    failed_at: Vec<u64>,
    /// Clock times of the ticks that published.
    published_at: Vec<u64>,
}

/// Steps every `step_ns` until `until_ns`: one count recorded and one tick per step.
fn run<R: specula_core::Readback<2>>(
    clock: &VirtualClock,
    collector: &mut Collector<'_, R, 2>,
    record: impl Fn(&mut R),
    step_ns: u64,
    until_ns: u64,
) -> Seen {
    let mut seen = Seen::default();
    while clock.now_ns() + step_ns <= until_ns {
        clock.advance(step_ns);
        record(collector.readback_mut());
        seen.steps += 1;
        match collector.tick(clock.now_ns()) {
            Tick::Failed => seen.failed_at.push(clock.now_ns()),
            Tick::Published(_) => seen.published_at.push(clock.now_ns()),
            _ => {}
        }
    }
    seen
}

fn record(d: &mut &mut SimDevice<'_, 2>) {
    d.totals.record(2, 1).unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe code on one thread: nothing for Miri to check; slow there"
)]
fn a_readback_that_never_completes_is_reported_within_one_deadline() {
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, reader) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 3 * MS);
    device.stuck = true; // and it cannot be abandoned
    let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
    let stale = collector.stale_after_ns();
    assert_eq!(stale, 15 * S, "three periods by default");
    let mut cursor = Cursor::new(reader);
    let seen = run(&clock, &mut collector, record, 20 * MS, 61 * S);
    // Never blocked: every step ran and ticked.
    assert_eq!(seen.steps, 3050);
    // The readback started at 5 s is reported at the first step at or after 5 s + 15 s, then
    // once per further deadline while it stays stuck.
    assert_eq!(seen.failed_at, [20 * S, 35 * S, 50 * S]);
    assert!(seen.published_at.is_empty());
    assert_eq!(collector.last_error(), Some(&CollectError::Stale));
    assert_eq!(
        collector.in_flight_count(),
        1,
        "not abandoned: the backend cannot"
    );
    let t = cursor.take().expect("each report is published");
    assert_eq!(t.snapshot.readback_errors, 3);
    assert_eq!(t.new_readback_errors, 3);
    assert_eq!(
        t.snapshot.at_ns, 0,
        "no successful collection yet: the data is as of 0"
    );
    // Shutdown still recovers everything.
    collector.flush(clock.now_ns()).unwrap();
    assert!(!collector.in_flight());
    let t = cursor.take().unwrap();
    assert_eq!(t.snapshot.counters, collector.readback().totals);
    assert_eq!(t.snapshot.counters.drafts, 3050);
    assert_eq!(t.delta.drafts, 3050);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe code on one thread: nothing for Miri to check; slow there"
)]
fn a_stale_readback_is_abandoned_when_the_backend_can_and_collection_goes_on() {
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, reader) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 3 * MS);
    device.stuck = true;
    device.can_abandon = true;
    let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
    collector.set_stale_after(7 * S);
    let mut cursor = Cursor::new(reader);
    // The first readback (5 s) sticks; the device recovers right after it started.
    let seen = run(&clock, &mut collector, record, 10 * MS, 5 * S);
    assert!(seen.published_at.is_empty());
    assert_eq!(collector.in_flight_count(), 1);
    collector.readback_mut().stuck = false;
    let seen = run(&clock, &mut collector, record, 10 * MS, 30 * S);
    assert_eq!(
        seen.failed_at,
        [12 * S],
        "reported one deadline after it started"
    );
    assert_eq!(collector.readback().abandoned, 1);
    // Collection goes on at once: the grid point missed at 10 s starts a readback in the freed
    // slot, then the grid goes on.
    assert_eq!(
        seen.published_at,
        [
            12 * S + 10 * MS,
            15 * S + 10 * MS,
            20 * S + 10 * MS,
            25 * S + 10 * MS
        ]
    );
    let t = cursor.take().unwrap();
    assert_eq!(t.snapshot.readback_errors, 1);
    assert_eq!(t.snapshot.at_ns, 25 * S);
    collector.flush(clock.now_ns()).unwrap();
    assert_eq!(
        cursor.take().unwrap().snapshot.counters,
        collector.readback().totals
    );
}

#[test]
fn a_late_readback_is_reported_stale_then_published_when_it_completes() {
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, reader) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 40 * S);
    let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
    let mut cursor = Cursor::new(reader);
    let seen = run(&clock, &mut collector, record, 100 * MS, 46 * S);
    assert_eq!(seen.failed_at, [20 * S, 35 * S]);
    assert_eq!(seen.published_at, [45 * S], "its counts are still good");
    let t = cursor.take().unwrap();
    assert_eq!(t.snapshot.at_ns, 5 * S);
    assert_eq!(t.snapshot.counters.drafts, 50, "as of the 5 s start");
    assert_eq!(t.snapshot.readback_errors, 2);
    assert_eq!(collector.latency_estimate_ns(), Some(40 * S));
}

#[test]
fn several_readbacks_in_flight_keep_the_cadence_when_latency_exceeds_the_period() {
    for (capacity, expected) in [(1usize, 4usize), (4, 9)] {
        let clock = VirtualClock::new(0);
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (writer, reader) = slot.split();
        let mut device = SimDevice::<2>::new(&clock, 12 * S);
        device.capacity = capacity;
        let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
        assert_eq!(collector.capacity(), capacity);
        let mut cursor = Cursor::new(reader);
        let seen = run(&clock, &mut collector, record, 100 * MS, 59 * S);
        assert_eq!(seen.published_at.len(), expected, "capacity {capacity}");
        assert!(seen.failed_at.is_empty());
        if capacity == 4 {
            // One readback per 5 s grid point, each published 12 s later (+ one step).
            let expected_at: Vec<u64> = (1..=9).map(|i| i * 5 * S + 12 * S).collect();
            assert_eq!(seen.published_at, expected_at);
            assert_eq!(collector.readback().max_seen_in_flight, 3);
        } else {
            // One at a time: each starts when the previous one is published (17, 29, 41, 53 s).
            assert_eq!(seen.published_at, [17 * S, 29 * S, 41 * S, 53 * S]);
            assert_eq!(collector.readback().max_seen_in_flight, 1);
        }
        // Published in start order: `at_ns` only grows, and each delta is as of its start.
        let mut sum = Counters::<2>::ZERO;
        let mut last_at = 0;
        while let Some(t) = cursor.take() {
            assert!(t.snapshot.at_ns >= last_at);
            last_at = t.snapshot.at_ns;
            sum.add(&t.delta);
        }
        collector.flush(clock.now_ns()).unwrap();
        sum.add(&cursor.take().unwrap().delta);
        assert_eq!(sum, collector.readback().totals);
    }
}

#[test]
fn the_ring_is_never_larger_than_the_core_allows() {
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, _) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 100 * S);
    device.capacity = 64;
    let mut collector = Collector::new(&mut device, writer, S, 0).unwrap();
    collector.set_stale_after(u64::MAX);
    assert_eq!(collector.capacity(), specula_core::MAX_IN_FLIGHT);
    run(&clock, &mut collector, record, 100 * MS, 30 * S);
    assert_eq!(collector.in_flight_count(), specula_core::MAX_IN_FLIGHT);
    assert_eq!(
        collector.readback().max_seen_in_flight,
        specula_core::MAX_IN_FLIGHT
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe code on one thread: nothing for Miri to check; slow there"
)]
fn deadlines_put_one_publication_before_each_log_tick() {
    // Collection every 5 s; the log grid is 20 ms after the collection grid, so collecting on
    // the grid would publish just after each log tick (3 ms latency, 10 ms steps).
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, _) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 3 * MS);
    let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
    collector.set_deadlines(5 * S, 20 * MS).unwrap();
    assert_eq!(collector.deadlines().map(|d| d.period_ns()), Some(5 * S));
    let seen = run(&clock, &mut collector, record, 10 * MS, 40 * S + 30 * MS);
    // Calibration: readbacks every half period until four latencies are measured (the first
    // one, started at the first step).
    assert_eq!(seen.published_at[0], 20 * MS);
    assert_eq!(collector.latency_estimate_ns(), Some(10 * MS));
    // Then one publication in each log interval (T − 5 s, T], in the middle of the window of
    // starts that land in it: latencies 10 ms (lo) to 20 ms (plan: lo + a gap), so the aim is
    // T − (5 s + 10 ms + 20 ms) / 2 and the publication 10 ms later, T − 2.505 s ± a step.
    for n in 1..=8u64 {
        let deadline = n * 5 * S + 20 * MS;
        let inside: Vec<_> = seen
            .published_at
            .iter()
            .filter(|&&p| p > deadline - 5 * S && p <= deadline)
            .collect();
        assert!(!inside.is_empty(), "deadline {deadline}: {seen:?}");
        assert!(
            inside
                .iter()
                .any(|&&p| p.abs_diff(deadline - 2_505 * MS) <= 10 * MS),
            "the publication is timed for the deadline, not the collection grid: {inside:?}"
        );
    }
    assert!(
        seen.published_at.len() <= 12,
        "four calibration readbacks, then about one per deadline"
    );
    collector.clear_deadlines();
    assert!(collector.deadlines().is_none());
}

#[test]
#[cfg_attr(miri, ignore = "thousands of simulated steps; too slow under Miri")]
fn a_coarser_deadline_grid_still_collects_every_period() {
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, _) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 3 * MS);
    let mut collector = Collector::new(&mut device, writer, S, 0).unwrap();
    collector.set_deadlines(10 * S, 0).unwrap();
    let seen = run(&clock, &mut collector, record, 10 * MS, 60 * S);
    // About one readback per second for the scrapes, plus one timed for each log deadline.
    let n = seen.published_at.len();
    assert!((55..=70).contains(&n), "{n}");
    for w in seen.published_at.windows(2) {
        assert!(
            w[1] - w[0] <= S + 20 * MS,
            "never more than a period apart: {w:?}"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore = "thousands of simulated steps; too slow under Miri")]
fn after_a_pause_in_the_steps_each_log_interval_still_gets_its_publication() {
    // 30 ms steps, then no step for 10 minutes (an idle engine), then 30 ms steps again: the
    // step-gap estimate is huge for a while, yet readbacks are not all started at once for
    // the next deadlines (which would leave the following intervals empty).
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, _) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 200 * MS);
    device.capacity = 4;
    let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
    collector.set_deadlines(5 * S, 2 * S).unwrap();
    run(&clock, &mut collector, record, 30 * MS, 60 * S);
    clock.advance(600 * S);
    let resumed = clock.now_ns();
    let seen = run(&clock, &mut collector, record, 30 * MS, resumed + 60 * S);
    // Log deadlines at 2 s + n·5 s. Every interval after the first one after the pause has a
    // publication.
    let first = (resumed - 2 * S) / (5 * S) * (5 * S) + 2 * S + 5 * S;
    for n in 1..11u64 {
        let deadline = first + n * 5 * S;
        assert!(
            seen.published_at
                .iter()
                .any(|&p| p > deadline - 5 * S && p <= deadline),
            "interval ending {deadline} (resumed {resumed}): {:?}",
            seen.published_at
        );
    }
    assert!(seen.published_at.len() <= 16, "{:?}", seen.published_at);
}

#[test]
#[cfg_attr(miri, ignore = "thousands of simulated steps; too slow under Miri")]
fn a_backend_that_cannot_start_is_retried_on_the_schedule_not_every_step() {
    for deadlines in [false, true] {
        let clock = VirtualClock::new(0);
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (writer, reader) = slot.split();
        let mut device = SimDevice::<2>::new(&clock, 3 * MS);
        device.fail_mask = u64::MAX; // every start fails
        let mut collector = Collector::new(&mut device, writer, 5 * S, 0).unwrap();
        if deadlines {
            collector.set_deadlines(5 * S, S).unwrap();
        }
        let seen = run(&clock, &mut collector, record, 10 * MS, 30 * S);
        // On the grid: one try per 5 s; before calibration with deadlines: one per 2.5 s.
        let expected = if deadlines { 12 } else { 6 };
        assert_eq!(seen.failed_at.len(), expected, "deadlines {deadlines}");
        assert_eq!(reader.read().0.readback_errors, expected as u64);
        assert!(!collector.in_flight());
        // The device still counted every step, and flush gets it all.
        collector.flush(clock.now_ns()).unwrap();
        assert_eq!(reader.read().0.counters.drafts, 3000);
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe code on one thread: nothing for Miri to check; slow there"
)]
fn tree_counts_reach_every_consumer_exactly_once_a_late_one_included() {
    // Chain steps and token trees counted on one device; consumers take on their own
    // schedules, one attaches late. Every consumer's deltas sum to the totals it was there for,
    // tree fields included, and the late one sees the trees counted after it attached once.
    let clock = VirtualClock::new(0);
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (writer, reader) = slot.split();
    let mut device = SimDevice::<2>::new(&clock, 3 * MS);
    let mut collector = Collector::new(&mut device, writer, 100 * MS, 0).unwrap();
    let mut early = Cursor::new(reader);
    let mut early_sum = Counters::<2>::ZERO;
    let mut late: Option<(Cursor<'_, 2>, Counters<2>, Counters<2>)> = None;
    for step in 1..=2_000u64 {
        clock.advance(MS);
        let d = &mut collector.readback_mut().totals;
        d.record(2, (step % 3) as usize).unwrap();
        // A 2-wide tree of depth 2 (6 draft nodes) every step, a 1x1 tree every 7th.
        d.record_tree(2, 6, (step % 2) as usize).unwrap();
        if step % 7 == 0 {
            d.record_tree(1, 1, 1).unwrap();
        }
        collector.tick(clock.now_ns());
        if step % 130 == 0 {
            if let Some(t) = early.take() {
                early_sum.add(&t.delta);
            }
        }
        if step == 777 {
            let c = Cursor::attach(reader);
            let from = c.seen().counters;
            late = Some((c, from, Counters::ZERO));
        }
        if step % 333 == 0 {
            if let Some((c, _, sum)) = late.as_mut() {
                if let Some(t) = c.take() {
                    sum.add(&t.delta);
                }
            }
        }
    }
    collector.flush(clock.now_ns()).unwrap();
    let totals = collector.readback().totals;
    early_sum.add(&early.take().unwrap().delta);
    assert_eq!(early_sum, totals);
    assert_eq!(totals.tree_drafts, 2_000 + 2_000 / 7);
    assert_eq!(totals.tree_draft_tokens, 2_000 * 6 + 2_000 / 7);
    let (mut c, from, mut sum) = late.unwrap();
    sum.add(&c.take().unwrap().delta);
    assert!(
        from.tree_drafts > 0,
        "the late consumer attached after trees were counted"
    );
    assert_eq!(
        sum,
        totals.delta_since(&from),
        "each count after it attached, once"
    );
    assert!(c.take().is_none());
}
