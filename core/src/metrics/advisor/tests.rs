use super::*;
use crate::SeqSlot;
use crate::metrics::Snapshot;

/// A step without an outcome.
fn timing(draft_len: usize, fixed_ns: u64, scaled_ns: u64) -> StepTiming {
    StepTiming {
        draft_len,
        fixed_ns,
        scaled_ns,
        ..StepTiming::default()
    }
}

fn counters<const K: usize>(k: usize, accepted: &[usize]) -> Counters<K> {
    let mut c = Counters::ZERO;
    for &a in accepted {
        c.record(k, a).unwrap();
    }
    c
}

#[test]
fn expected_tokens_are_one_plus_the_reach_probabilities() {
    let c = counters::<4>(4, &[0, 1, 2, 2, 3, 4, 4, 4]);
    let a = advise(&c, &CostModel::from_ratio(0.0).unwrap()).unwrap();
    // P(reach j) = A[j-1] / drafts: 7/8, 6/8, 4/8, 3/8.
    let want = [1.0 + 7.0 / 8.0, 2.625, 3.125, 3.5];
    for (k, w) in (1..=4).zip(want) {
        let got = a.expected_tokens(k).unwrap();
        assert!((got - w).abs() < 1e-12, "{k}: {got} vs {w}");
        // Free drafts: the speedup is the expected tokens.
        assert_eq!(a.expected_speedup(k), Some(got));
    }
    assert_eq!(a.lengths(), 4);
    assert_eq!(a.recommended(), 4);
    assert_eq!(a.best_speedup(), a.expected_speedup(4).unwrap());
    assert_eq!(a.expected_tokens(0), None);
    assert_eq!(a.expected_tokens(5), None);
    assert_eq!(a.expected_speedup(5), None);
    let all: [(usize, f64, f64); 4] = {
        let mut v = [(0, 0.0, 0.0); 4];
        for (slot, x) in v.iter_mut().zip(a.iter()) {
            *slot = x;
        }
        v
    };
    assert_eq!(all[3].0, 4);
    assert_eq!(a.iter().count(), 4);
}

#[test]
fn the_recommendation_is_the_argmax_of_the_speedup() {
    // c = (0.8, 0.5, 0.5): E = 1.8, 2.2, 2.4. With r = 0.1: S = 1.636, 1.833, 1.846.
    let mut c = Counters::<3>::ZERO;
    for (n, a) in [(2, 0), (4, 1), (2, 2), (2, 3)] {
        for _ in 0..n {
            c.record(3, a).unwrap();
        }
    }
    let a = advise(&c, &CostModel::from_ratio(0.1).unwrap()).unwrap();
    assert_eq!(a.recommended(), 3);
    // r = 0.2: S = 1.5, 1.571, 1.5: the middle one.
    let b = advise(&c, &CostModel::from_ratio(0.2).unwrap()).unwrap();
    assert_eq!(b.recommended(), 2);
    let s: [f64; 3] = core::array::from_fn(|i| b.expected_speedup(i + 1).unwrap());
    assert!((s[0] - 1.8 / 1.2).abs() < 1e-12);
    assert!((s[1] - 2.2 / 1.4).abs() < 1e-12);
    assert!((s[2] - 2.4 / 1.6).abs() < 1e-12);
    // Expensive drafts: k = 1 is the best, below 1 (plain decoding is faster).
    let e = advise(&c, &CostModel::from_ratio(2.0).unwrap()).unwrap();
    assert_eq!(e.recommended(), 1);
    assert!(e.best_speedup() < 1.0);
}

#[test]
fn ties_go_to_the_shorter_draft() {
    // Nothing accepted past position 0: E(2) = E(1), and with free drafts S ties.
    let c = counters::<2>(2, &[1, 1]);
    let a = advise(&c, &CostModel::from_ratio(0.0).unwrap()).unwrap();
    assert_eq!(a.expected_speedup(1), a.expected_speedup(2));
    assert_eq!(a.recommended(), 1);
}

#[test]
fn only_measured_lengths_are_predicted() {
    let c = counters::<8>(3, &[3, 3, 2]);
    let a = advise(&c, &CostModel::from_ratio(0.0).unwrap()).unwrap();
    assert_eq!(a.lengths(), 3);
    assert_eq!(a.expected_tokens(4), None);
    assert_eq!(
        advise(&Counters::<8>::ZERO, &CostModel::from_ratio(0.1).unwrap()),
        Err(AdviceError::NoDrafts)
    );
    // A position drafted but never reached: measured, and it adds nothing.
    let c = counters::<3>(3, &[0, 0]);
    let a = advise(&c, &CostModel::from_ratio(0.5).unwrap()).unwrap();
    assert_eq!(a.lengths(), 3);
    assert_eq!(a.expected_tokens(3), Some(1.0));
    assert_eq!(a.expected_speedup(3), Some(1.0 / 2.5));
    assert_eq!(a.recommended(), 1);
}

#[test]
fn cost_models_refuse_bad_values() {
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        assert_eq!(CostModel::from_ratio(bad), Err(AdviceError::BadCost));
        assert_eq!(TreeCostModel::new(bad, 0.0), Err(AdviceError::BadCost));
        assert_eq!(TreeCostModel::new(0.0, bad), Err(AdviceError::BadCost));
        assert_eq!(CostModel::from_times(bad, 1.0), Err(AdviceError::BadCost));
    }
    assert_eq!(CostModel::from_times(0.0, 1.0), Err(AdviceError::BadCost));
    assert_eq!(CostModel::from_times(10.0, -1.0), Err(AdviceError::BadCost));
    let m = CostModel::from_times(20.0, 5.0).unwrap();
    assert_eq!(m.per_draft(), 0.25);
    assert_eq!(m.step_cost(4, 0.3), 2.0);
    assert_eq!(m.rejection_saving(), 0.0);
    assert_eq!(CostModel::from_ratio(0.0).unwrap().step_cost(7, 0.0), 1.0);
    for bad in [1.0, 1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(m.with_rejection_saving(bad), Err(AdviceError::BadCost));
    }
    // C(k) = 1 + k r − s (1 − P_full), P_full taken in [0, 1].
    let s = m.with_rejection_saving(0.5).unwrap();
    assert_eq!(s.per_draft(), 0.25);
    assert_eq!(s.rejection_saving(), 0.5);
    assert_eq!(s.step_cost(4, 1.0), 2.0);
    assert_eq!(s.step_cost(4, 0.0), 1.5);
    assert_eq!(s.step_cost(4, 0.5), 1.75);
    assert_eq!(s.step_cost(4, -3.0), 1.5);
    assert_eq!(s.step_cost(4, 7.0), 2.0);
    let costlier = m.with_rejection_saving(-0.5).unwrap();
    assert_eq!(costlier.step_cost(2, 0.0), 2.0);
    assert!(TreeCostModel::new(0.0, 0.0).is_ok());
}

#[test]
fn the_meter_measures_the_ratio_and_the_step_time() {
    let mut m = CostMeter::ZERO;
    assert_eq!(m.cost_model(), Err(AdviceError::NoTimings));
    assert_eq!(m.step_ns(1), Err(AdviceError::NoTimings));
    m.record(&timing(4, 10_000, 4_000));
    m.record(&timing(2, 14_000, 1_000));
    assert_eq!(
        m,
        CostMeter {
            steps: 2,
            draft_forwards: 6,
            fixed_ns: 24_000,
            scaled_ns: 5_000,
            ..CostMeter::ZERO
        }
    );
    // Mean fixed part 12 µs, 5/6 µs per draft forward.
    let r = m.cost_model().unwrap().per_draft();
    assert!((r - (5_000.0 / 6.0) / 12_000.0).abs() < 1e-15);
    assert!((m.step_ns(3).unwrap() - (12_000.0 + 2_500.0)).abs() < 1e-9);
    let earlier = m;
    m.record(&timing(1, 1, 1));
    let d = m.delta_since(&earlier);
    assert_eq!(
        d,
        CostMeter {
            steps: 1,
            draft_forwards: 1,
            fixed_ns: 1,
            scaled_ns: 1,
            ..CostMeter::ZERO
        }
    );
    let mut back = earlier;
    back.add(&d);
    assert_eq!(back, m);
    // Steps without draft forwards, or without fixed time: no ratio.
    let mut k0 = CostMeter::ZERO;
    k0.record(&timing(0, 100, 0));
    assert_eq!(k0.cost_model(), Err(AdviceError::NoTimings));
    let mut no_fixed = CostMeter::ZERO;
    no_fixed.record(&timing(2, 0, 100));
    assert_eq!(no_fixed.cost_model(), Err(AdviceError::NoTimings));
    // Wrapping, as the counters.
    let mut w = CostMeter {
        fixed_ns: u64::MAX,
        ..CostMeter::ZERO
    };
    w.record(&timing(1, 2, 0));
    assert_eq!(w.fixed_ns, 1);
}

fn outcome(draft_len: usize, fixed_ns: u64, requests: u32, rejected: u32) -> StepTiming {
    StepTiming {
        draft_len,
        fixed_ns,
        scaled_ns: 1_000 * draft_len as u64,
        requests,
        rejected,
    }
}

#[test]
fn the_meter_fits_the_rejection_saving_from_step_outcomes() {
    // Whole acceptances take 10 µs, rejections 8 µs: s = 2/10 in units of a whole one.
    let mut m = CostMeter::ZERO;
    for (fixed, rejected) in [(10_000, 0), (8_000, 1), (8_000, 1), (10_000, 0), (8_000, 1)] {
        m.record(&outcome(4, fixed, 1, rejected));
    }
    assert_eq!(m.outcome_steps, 5);
    assert_eq!(m.rejected_share, 3 * SHARE_ONE);
    let c = m.cost_model().unwrap();
    assert!((c.rejection_saving() - 0.2).abs() < 1e-12, "{c:?}");
    // r against the whole acceptance's 10 µs, not the 8.8 µs mean.
    assert!((c.per_draft() - 0.1).abs() < 1e-12, "{c:?}");
    // A batch: the step's time falls with the share of its requests that rejected.
    let mut b = CostMeter::ZERO;
    for rejected in [0, 1, 2, 3, 4, 2] {
        b.record(&outcome(2, 20_000 - 500 * u64::from(rejected), 4, rejected));
    }
    let c = b.cost_model().unwrap();
    assert!(
        (c.rejection_saving() - 2_000.0 / 20_000.0).abs() < 1e-12,
        "{c:?}"
    );
    // Rejections that cost more: a negative saving.
    let mut n = CostMeter::ZERO;
    n.record(&outcome(1, 10_000, 1, 0));
    n.record(&outcome(1, 12_000, 1, 1));
    let c = n.cost_model().unwrap();
    assert!((c.rejection_saving() + 0.2).abs() < 1e-12, "{c:?}");
    // An interval's delta fits over its own steps.
    let before = m;
    m.record(&outcome(4, 10_000, 1, 0));
    m.record(&outcome(4, 5_000, 1, 1));
    let d = m.delta_since(&before).cost_model().unwrap();
    assert!((d.rejection_saving() - 0.5).abs() < 1e-12, "{d:?}");
}

#[test]
fn without_varying_outcomes_the_meter_fits_no_saving() {
    let plain = |m: &CostMeter| {
        let c = m.cost_model().unwrap();
        assert_eq!(c.rejection_saving(), 0.0, "{m:?}");
        c
    };
    // No outcome recorded: the mean fixed time is the unit.
    let mut m = CostMeter::ZERO;
    m.record(&timing(2, 10_000, 2_000));
    m.record(&timing(2, 30_000, 2_000));
    assert_eq!(plain(&m).per_draft(), 1_000.0 / 20_000.0);
    // One step with an outcome, then steps that all share one share: no slope.
    m.record(&outcome(2, 5_000, 1, 1));
    plain(&m);
    let mut same = CostMeter::ZERO;
    for fixed in [9_000, 11_000, 10_000] {
        same.record(&outcome(3, fixed, 4, 2));
    }
    assert_eq!(plain(&same).per_draft(), 1_000.0 / 10_000.0);
    // A fit that says a rejection saves the whole step (or more): refused, plain model.
    let mut absurd = CostMeter::ZERO;
    absurd.record(&outcome(1, 10_000, 1, 0));
    absurd.record(&outcome(1, 0, 1, 1));
    assert_eq!(plain(&absurd).per_draft(), 1_000.0 / 5_000.0);
    // More rejected than verified counts as all rejected.
    let mut over = CostMeter::ZERO;
    over.record(&outcome(1, 10_000, 2, 0));
    over.record(&outcome(1, 9_000, 2, 9));
    assert_eq!(over.rejected_share, SHARE_ONE);
    assert!((over.cost_model().unwrap().rejection_saving() - 0.1).abs() < 1e-12);
}

#[test]
fn the_saving_moves_the_advice_to_drafts_rejected_less() {
    // Positions accepted with 0.9, 0.6, 0.3: longer drafts are accepted whole less often,
    // so with a saving they cost less than `1 + k r` says.
    let mut c = Counters::<3>::ZERO;
    let reach = [1000u32, 900, 540, 162];
    for a in 0..=3 {
        let n = reach[a] - reach.get(a + 1).copied().unwrap_or(0);
        for _ in 0..n {
            c.record(3, a).unwrap();
        }
    }
    let r = CostModel::from_ratio(0.2).unwrap();
    let plain = advise(&c, &r).unwrap();
    let saving = advise(&c, &r.with_rejection_saving(0.6).unwrap()).unwrap();
    // Plain: S = 1.9/1.2, 2.44/1.4, 2.602/1.6 = 1.583, 1.743, 1.626: k = 2.
    assert_eq!(plain.recommended(), 2);
    // s = 0.6: C = 1.2 − 0.6·0.1, 1.4 − 0.6·0.46, 1.6 − 0.6·0.838: S = 1.667, 2.268, 2.372.
    for (k, p_full) in [(1, 0.9), (2, 0.54), (3, 0.162)] {
        let cost = 1.0 + 0.2 * k as f64 - 0.6 * (1.0 - p_full);
        let want = plain.expected_tokens(k).unwrap() / cost;
        assert!(
            (saving.expected_speedup(k).unwrap() - want).abs() < 1e-12,
            "{k}"
        );
    }
    assert_eq!(saving.recommended(), 3);
}

#[test]
fn the_meter_travels_through_a_slot() {
    let m = CostMeter {
        steps: 1,
        draft_forwards: 2,
        fixed_ns: 3,
        scaled_ns: u64::MAX,
        outcome_steps: 4,
        outcome_fixed_ns: 5,
        rejected_share: 6,
        rejected_share_sq: 7,
        rejected_share_ns: 8,
    };
    assert_eq!(CostMeter::load(&m.to_storage()), m);
    let mut slot = SeqSlot::new(CostMeter::ZERO);
    let (mut w, r) = slot.split();
    w.publish(&m);
    assert_eq!(r.read(), (m, 1));
}

#[test]
fn trees_are_advised_by_depth_with_their_node_counts() {
    let mut c = Counters::<4>::ZERO;
    c.record_tree(3, 14, 3).unwrap();
    c.record_tree(3, 14, 1).unwrap();
    c.record_tree(3, 14, 2).unwrap();
    c.record_tree(3, 14, 0).unwrap();
    let cost = TreeCostModel::new(0.1, 0.02).unwrap();
    let a = advise_tree(&c, &cost, &[2, 4, 8]).unwrap();
    // Reach depth 1, 2, 3: 3/4, 2/4, 1/4. Costs 1 + d · 0.1 + N(d) · 0.02, N = 2, 6, 14.
    let want = [
        1.75 / (1.0 + 0.1 + 0.04),
        2.25 / (1.0 + 0.2 + 0.12),
        2.5 / (1.0 + 0.3 + 0.28),
    ];
    for (d, w) in (1..=3).zip(want) {
        let got = a.expected_speedup(d).unwrap();
        assert!((got - w).abs() < 1e-12, "depth {d}: {got} vs {w}");
    }
    assert_eq!(a.recommended(), 2);
    // A shape deeper than the counters measured is cut at what they measured.
    let b = advise_tree(&c, &cost, &[2, 4, 8, 16]).unwrap();
    assert_eq!(b.lengths(), 3);
    for bad in [&[][..], &[2, 0, 8], &[1, 1, 1, 1, 1]] {
        assert_eq!(
            advise_tree(&c, &cost, bad),
            Err(AdviceError::BadShape {
                depths: bad.len(),
                max: 4
            })
        );
    }
    assert_eq!(
        advise_tree(&Counters::<4>::ZERO, &cost, &[2]),
        Err(AdviceError::NoDrafts)
    );
}

#[test]
fn the_advisor_advises_over_each_interval_with_its_costs() {
    let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    let (mut w, reader) = slot.split();
    let mut advisor = Advisor::new(Cursor::attach(reader));
    let mut meter = CostMeter::ZERO;
    assert!(advisor.poll(&meter).is_none());
    let mut s = Snapshot::<2>::ZERO;
    // Interval 1: every draft fully accepted, drafts nearly free: k = 2.
    for _ in 0..4 {
        s.counters.record(2, 2).unwrap();
        meter.record(&timing(2, 1_000, 20));
    }
    w.publish(&s);
    let (t, a) = advisor.poll(&meter).unwrap();
    assert_eq!(t.delta.drafts, 4);
    let a = a.unwrap();
    assert_eq!(a.recommended(), 2);
    assert_eq!(
        a.expected_speedup(2),
        Some(3.0 / (1.0 + 2.0 * (10.0 / 1_000.0)))
    );
    // Interval 2: nothing accepted, expensive drafts: k = 1, over this interval's counts
    // and costs only.
    for _ in 0..4 {
        s.counters.record(2, 0).unwrap();
        meter.record(&timing(2, 1_000, 2_000));
    }
    w.publish(&s);
    let a = advisor.poll(&meter).unwrap().1.unwrap();
    assert_eq!(a.recommended(), 1);
    assert_eq!(a.expected_speedup(1), Some(1.0 / 2.0));
    // Interval 3: no new timings: the lifetime costs (r = (8040 / 16) / 1000).
    s.counters.record(2, 2).unwrap();
    w.publish(&s);
    let a = advisor.poll(&meter).unwrap().1.unwrap();
    let r = 8_080.0 / 16.0 / 1_000.0;
    assert_eq!(a.expected_speedup(2), Some(3.0 / (1.0 + 2.0 * r)));
    // Configured costs.
    s.counters.record(2, 1).unwrap();
    w.publish(&s);
    let (t, a) = advisor
        .poll_with(&CostModel::from_ratio(0.5).unwrap())
        .unwrap();
    assert_eq!(t.delta.drafts, 1);
    assert_eq!(a.unwrap().expected_speedup(1), Some(2.0 / 1.5));
    assert!(
        advisor
            .poll_with(&CostModel::from_ratio(0.5).unwrap())
            .is_none()
    );
    // No timings at all: the error, with what was taken.
    let mut fresh = Advisor::new(Cursor::new(reader));
    let (t, a) = fresh.poll(&CostMeter::ZERO).unwrap();
    assert_eq!(t.delta, s.counters);
    assert_eq!(a, Err(AdviceError::NoTimings));
}

#[test]
fn errors_say_what_is_wrong() {
    use core::fmt::Write;
    let mut s = heapless::String::<160>::new();
    write!(s, "{}", AdviceError::BadShape { depths: 9, max: 8 }).unwrap();
    assert!(s.contains("1..=8") && s.contains("9 depths"), "{s}");
    for e in [
        AdviceError::NoDrafts,
        AdviceError::BadCost,
        AdviceError::NoTimings,
    ] {
        s.clear();
        write!(s, "{e}").unwrap();
        assert!(!s.is_empty());
    }
}
