//! The `metrics` bridge increments counters by exact cursor deltas: after any number of
//! updates, each counter equals the slot's totals (never a sum of totals).

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use specula::metrics_bridge::MetricsBridge;
use specula::specula_core::StepTiming;
use specula::wire_ranks;
use specula_core::Snapshot;
use std::collections::HashMap;

/// Running sums of every counter (the debugging recorder's snapshot returns, and resets, the
/// increments since the previous snapshot), and the last value of every gauge.
#[derive(Default)]
struct Sums(HashMap<String, u64>, HashMap<String, f64>);

impl Sums {
    fn absorb(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            match value {
                DebugValue::Counter(n) => *self.0.entry(name_of(key.key())).or_default() += n,
                DebugValue::Gauge(v) => {
                    self.1.insert(name_of(key.key()), v.into_inner());
                }
                DebugValue::Histogram(_) => panic!("{key:?}: the bridge records no histogram"),
            }
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let key = metrics::Key::from_parts(
            name.to_string(),
            labels
                .iter()
                .map(|(k, v)| metrics::Label::new(k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        );
        self.1.get(&name_of(&key)).copied()
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let key = metrics::Key::from_parts(
            name.to_string(),
            labels
                .iter()
                .map(|(k, v)| metrics::Label::new(k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        );
        self.0.get(&name_of(&key)).copied().unwrap_or(0)
    }
}

fn name_of(key: &metrics::Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

#[test]
fn counters_equal_totals_after_every_update() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut wired = wire_ranks::<4>(2).unwrap();
    let mut bridge = MetricsBridge::new(&wired.slots);
    let mut totals = [Snapshot::<4>::ZERO; 2];
    let mut sums = Sums::default();
    metrics::with_local_recorder(&recorder, || {
        for round in 0..5u64 {
            for (rank, writer) in wired.writers.iter_mut().enumerate() {
                // Rank 1 publishes only every other round: updates see uneven news.
                if rank == 1 && round % 2 == 1 {
                    continue;
                }
                for _ in 0..=round {
                    totals[rank]
                        .counters
                        .record(4, (round % 5) as usize)
                        .unwrap();
                    // A token tree of depth 2 (round + 2 draft nodes) next to every chain.
                    totals[rank]
                        .counters
                        .record_tree(2, 2 + round as usize, (round % 3) as usize)
                        .unwrap();
                }
                totals[rank].at_ns = round * 1_000;
                writer.publish(&totals[rank]);
            }
            assert!(bridge.update() >= 1);
            assert_eq!(bridge.update(), 0, "nothing new: nothing emitted");
            sums.absorb(&snapshotter);
            for (rank, t) in totals.iter().enumerate() {
                let engine = format!("rank{rank}");
                let l = [("engine", engine.as_str())];
                let c = &t.counters;
                assert_eq!(sums.get("specula_drafts_total", &l), c.drafts);
                assert_eq!(sums.get("specula_draft_tokens_total", &l), c.draft_tokens);
                assert_eq!(
                    sums.get("specula_accepted_tokens_total", &l),
                    c.accepted_tokens
                );
                assert_eq!(
                    sums.get("specula_emitted_tokens_total", &l),
                    c.emitted_tokens
                );
                assert_eq!(sums.get("specula_tree_drafts_total", &l), c.tree_drafts);
                assert_eq!(
                    sums.get("specula_tree_draft_tokens_total", &l),
                    c.tree_draft_tokens
                );
                assert!(c.tree_drafts > 0);
                for i in 0..4 {
                    let pos = i.to_string();
                    let lp = [("engine", engine.as_str()), ("position", pos.as_str())];
                    assert_eq!(
                        sums.get("specula_accepted_tokens_per_position_total", &lp),
                        c.accepted_per_position[i]
                    );
                }
                // The distribution's increments sum to the totals' distribution, exactly.
                for j in 0..=4 {
                    let len = j.to_string();
                    let ll = [("engine", engine.as_str()), ("length", len.as_str())];
                    assert_eq!(
                        sums.get("specula_drafts_by_accepted_length_total", &ll),
                        c.accepted_exactly(j).unwrap(),
                        "{engine} length {j}"
                    );
                }
            }
        }
    });
    assert!(totals[0].counters.drafts > totals[1].counters.drafts);
}

#[test]
fn with_the_clock_the_last_collection_time_and_age_are_gauges() {
    use specula::StdClock;
    use specula::specula_core::Clock;
    use std::time::{SystemTime, UNIX_EPOCH};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut wired = wire_ranks::<4>(2).unwrap();
    let clock = StdClock::new();
    let mut bridge = MetricsBridge::new(&wired.slots).with_clock(clock);
    let mut s = Snapshot::<4>::ZERO;
    s.counters.record(2, 2).unwrap();
    s.at_ns = clock.now_ns();
    wired.writers[0].publish(&s); // rank1 never collects
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    metrics::with_local_recorder(&recorder, || {
        assert_eq!(bridge.update(), 1);
    });
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let mut gauges = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Gauge(v) = value {
            gauges.insert(name_of(key.key()), v.into_inner());
        }
    }
    for rank in ["rank0", "rank1"] {
        let ts = gauges[&format!("specula_last_collection_timestamp_seconds{{engine={rank}}}")];
        let age = gauges[&format!("specula_last_collection_age_seconds{{engine={rank}}}")];
        assert!(age >= 0.0);
        let scrape = ts + age;
        assert!(
            scrape >= before.as_secs_f64() - 1e-3 && scrape <= after.as_secs_f64() + 1e-3,
            "{rank}: {scrape}"
        );
    }
    assert!(
        gauges["specula_last_collection_age_seconds{engine=rank1}"]
            >= gauges["specula_last_collection_age_seconds{engine=rank0}"],
        "the rank that never collected is the older"
    );
}

#[test]
fn constant_labels_and_the_draft_length_reach_every_counter() {
    use specula::prom::{ConstLabels, DraftLenError};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut wired = wire_ranks::<4>(1).unwrap();
    assert_eq!(
        MetricsBridge::new(&wired.slots).with_draft_len(5).err(),
        Some(DraftLenError { got: 5, max: 4 })
    );
    assert!(MetricsBridge::new(&wired.slots).with_draft_len(0).is_err());
    let labels = ConstLabels::model_name("m")
        .unwrap()
        .with("region", "eu")
        .unwrap();
    let mut bridge = MetricsBridge::new(&wired.slots)
        .with_labels(&labels)
        .with_draft_len(2)
        .unwrap();
    let mut s = Snapshot::<4>::ZERO;
    s.counters.record(2, 1).unwrap();
    s.counters.record(2, 2).unwrap();
    wired.writers[0].publish(&s);
    let mut sums = Sums::default();
    metrics::with_local_recorder(&recorder, || assert_eq!(bridge.update(), 1));
    let keys: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, _)| name_of(k.key()))
        .collect();
    assert!(!keys.is_empty());
    for k in &keys {
        assert!(k.contains("model_name=m") && k.contains("region=eu"), "{k}");
        assert!(!k.contains("position=2"), "two positions only: {k}");
    }
    assert!(keys.iter().any(|k| k.contains("position=1")), "{keys:?}");
    // Deltas, not totals: the second update adds only the one new draft.
    s.counters.record(2, 0).unwrap();
    wired.writers[0].publish(&s);
    metrics::with_local_recorder(&recorder, || assert_eq!(bridge.update(), 1));
    sums.absorb(&snapshotter);
    let l = [("model_name", "m"), ("region", "eu"), ("engine", "rank0")];
    assert_eq!(
        sums.get("specula_drafts_total", &l),
        1,
        "the second update's delta"
    );
}

#[test]
fn derived_gauges_advice_and_finished_requests_follow_each_update() {
    use specula::advice::{CostSource, Sources, cost_slot, request_slot};
    use specula::specula_core::metrics::{CostModel, advise};
    use specula::specula_core::{Extremes, RequestAcceptance};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut wired = wire_ranks::<4>(2).unwrap();
    let (mut costs, cost_reader) = cost_slot();
    let (mut finished, finished_reader) = request_slot(Extremes::default());
    let sources = Sources::new()
        .with_costs("rank0", CostSource::Measured(cost_reader))
        .with_requests("rank0", finished_reader)
        .with_costs(
            "rank1",
            CostSource::Fixed(CostModel::from_ratio(0.5).unwrap()),
        );
    let mut bridge = MetricsBridge::new(&wired.slots)
        .with_draft_len(3)
        .unwrap()
        .with_sources(sources);
    let mut s = Snapshot::<4>::ZERO;
    let mut sums = Sums::default();
    // Update 1: all accepted, cheap drafts. Update 2: nothing past position 0, dear drafts.
    for (round, (accepted, scaled)) in [(3usize, 300u64), (1, 30_000)].into_iter().enumerate() {
        let before = s.counters;
        for _ in 0..10 {
            s.counters.record(3, accepted).unwrap();
            costs.record(&StepTiming {
                draft_len: 3,
                fixed_ns: 10_000,
                scaled_ns: scaled,
                ..StepTiming::default()
            });
        }
        s.at_ns = (round as u64 + 1) * 1_000;
        wired.writers[0].publish(&s);
        wired.writers[1].publish(&s);
        let mut r = RequestAcceptance::NEW;
        for _ in 0..40 {
            r.record(3, accepted).unwrap();
        }
        finished.finish(&r);
        metrics::with_local_recorder(&recorder, || assert_eq!(bridge.update(), 2));
        sums.absorb(&snapshotter);
        let delta = s.counters.delta_since(&before);
        let recent = [("engine", "rank0"), ("window", "recent")];
        let g = |name: &str, extra: &[(&str, &str)]| {
            let mut l = vec![("engine", "rank0")];
            l.extend_from_slice(extra);
            l.push(("window", "recent"));
            sums.gauge(name, &l)
        };
        // This update's interval: its counts and the costs recorded during it.
        let cost = CostModel::from_ratio(scaled as f64 / 3.0 / 10_000.0).unwrap();
        let want = advise(&delta, &cost).unwrap();
        assert_eq!(
            sums.gauge("specula_recommended_draft_length", &recent),
            Some(want.recommended() as f64)
        );
        assert_eq!(
            sums.gauge("specula_draft_cost_ratio", &recent),
            Some(cost.per_draft())
        );
        for k in 1..=3 {
            let ks = k.to_string();
            let l = [("draft_length", ks.as_str())];
            assert_eq!(g("specula_expected_speedup", &l), want.expected_speedup(k));
            assert_eq!(
                g("specula_expected_tokens_per_step", &l),
                want.expected_tokens(k)
            );
        }
        assert_eq!(
            g("specula_conditional_acceptance_rate", &[("position", "0")]),
            Some(1.0)
        );
        // The lifetime series: over the totals and every cost recorded.
        let lifetime = advise(&s.counters, &costs.meter().cost_model().unwrap()).unwrap();
        assert_eq!(
            sums.gauge(
                "specula_recommended_draft_length",
                &[("engine", "rank0"), ("window", "lifetime")]
            ),
            Some(lifetime.recommended() as f64)
        );
        // rank1: a configured cost, the same counts.
        let fixed = advise(&delta, &CostModel::from_ratio(0.5).unwrap()).unwrap();
        assert_eq!(
            sums.gauge(
                "specula_expected_speedup",
                &[
                    ("engine", "rank1"),
                    ("draft_length", "3"),
                    ("window", "recent")
                ]
            ),
            fixed.expected_speedup(3)
        );
        // Finished requests: rank0 only.
        let l = [("engine", "rank0")];
        assert_eq!(
            sums.get("specula_requests_finished_total", &l),
            round as u64 + 1
        );
        assert_eq!(
            sums.get("specula_request_acceptance_rate_count", &l),
            round as u64 + 1
        );
        assert_eq!(
            sums.get(
                "specula_request_acceptance_rate_bucket",
                &[("engine", "rank0"), ("le", "+Inf")]
            ),
            round as u64 + 1
        );
        assert_eq!(
            sums.get("specula_requests_finished_total", &[("engine", "rank1")]),
            0
        );
    }
    // Round 1 accepted everything (high: 160 emitted tokens is short of 256, so not high),
    // round 2 a third: buckets 1.0 and 0.4.
    let bucket = |le: &str| {
        sums.get(
            "specula_request_acceptance_rate_bucket",
            &[("engine", "rank0"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.3"), 0);
    assert_eq!(bucket("0.4"), 1);
    assert_eq!(bucket("0.95"), 1);
    assert_eq!(bucket("1"), 2);
    assert_eq!(
        sums.gauge(
            "specula_request_acceptance_rate_sum",
            &[("engine", "rank0")]
        ),
        Some(1.333_333)
    );
    assert_eq!(
        sums.get(
            "specula_requests_high_acceptance_total",
            &[("engine", "rank0")]
        ),
        0
    );
    assert_eq!(
        sums.get(
            "specula_requests_low_acceptance_total",
            &[("engine", "rank0")]
        ),
        0
    );
}
