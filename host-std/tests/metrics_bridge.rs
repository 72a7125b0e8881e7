//! The `metrics` bridge increments counters by exact cursor deltas: after any number of
//! updates, each counter equals the slot's totals (never a sum of totals).
#![cfg(feature = "metrics")]

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use specula::metrics_bridge::MetricsBridge;
use specula::wire_ranks;
use specula_core::Snapshot;
use std::collections::HashMap;

/// Running sums of every counter: the debugging recorder's snapshot returns (and resets) the
/// increments since the previous snapshot.
#[derive(Default)]
struct Sums(HashMap<String, u64>);

impl Sums {
    fn absorb(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let DebugValue::Counter(n) = value else {
                panic!("{key:?} is not a counter");
            };
            *self.0.entry(name_of(key.key())).or_default() += n;
        }
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
