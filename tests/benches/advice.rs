//! What issue 32 adds, and where its cost falls: the step path is unchanged (`Counters::record`
//! and an idle `Collector::tick`, timed here for reference; the GPU kernels and the collector
//! were not touched), and everything derived — the acceptance-length distribution, the
//! conditional acceptance, the advice, the detailed log line — is computed when a consumer
//! reads the counters (a scrape, a log line, an advisor's poll), once per interval. The
//! per-request accumulator is the one addition an engine makes per request per step.
//!
//! Run: `cargo bench -p specula-tests --bench advice`

use criterion::Criterion;
use specula_core::metrics::{CostModel, advise};
use specula_core::{
    Collector, Counters, Cursor, Readback, Report, RequestAcceptance, SeqSlot, Snapshot,
};
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::task::Poll;

const K: usize = 8;

/// A readback that never completes (the collector's idle tick, as in the slot bench).
struct Never;

impl Readback<K> for Never {
    type Error = ();
    fn start(&mut self) -> Result<(), ()> {
        Ok(())
    }
    fn poll(&mut self) -> Poll<Result<Counters<K>, ()>> {
        Poll::Pending
    }
    fn flush(&mut self) -> Result<Counters<K>, ()> {
        Ok(Counters::ZERO)
    }
}

/// Counters of a million steps at k = 8, acceptance 0.7 per position (deterministic).
fn counters() -> Counters<K> {
    let mut c = Counters::ZERO;
    let mut x = 0x5eed_u64;
    for _ in 0..1_000_000 {
        let mut a = 0;
        while a < K {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (x >> 33) as f64 / (1u64 << 31) as f64 >= 0.7 {
                break;
            }
            a += 1;
        }
        c.record(K, a).unwrap();
    }
    c
}

fn bench(c: &mut Criterion) {
    let totals = counters();
    let cost = CostModel::from_ratio(0.05).unwrap();
    let mut g = c.benchmark_group("step_path");
    let mut counts = Counters::<K>::ZERO;
    let mut i = 0usize;
    g.bench_function("counters_record", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(counts.record(K, black_box(i % (K + 1))))
        })
    });
    let mut slot = SeqSlot::new(Snapshot::<K>::ZERO);
    let (w, _r) = slot.split();
    let mut col = Collector::new(Never, w, u64::MAX / 2, 0).unwrap();
    let mut now = 0u64;
    g.bench_function("collector_tick_idle", |b| {
        b.iter(|| {
            now += 1;
            black_box(col.tick(black_box(now)))
        })
    });
    let mut request = RequestAcceptance::NEW;
    g.bench_function("request_acceptance_record", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(request.record(K, black_box(i % (K + 1))))
        })
    });
    g.finish();

    let mut g = c.benchmark_group("read_time");
    g.bench_function("acceptance_lengths", |b| {
        b.iter(|| black_box(&totals).acceptance_lengths().sum::<u64>())
    });
    g.bench_function("conditional_acceptance_all_positions", |b| {
        b.iter(|| {
            (0..K)
                .filter_map(|p| black_box(&totals).conditional_acceptance(p))
                .sum::<f64>()
        })
    });
    g.bench_function("advise", |b| {
        b.iter(|| advise(black_box(&totals), black_box(&cost)).map(|a| a.recommended()))
    });
    // The log line of one 5 s interval holding all of those steps.
    let mut slot = SeqSlot::new(Snapshot::<K>::ZERO);
    let (mut writer, reader) = slot.split();
    let mut s = Snapshot::ZERO;
    s.counters = totals;
    s.at_ns = 5_000_000_000;
    writer.publish(&s);
    let taken = Cursor::new_at(reader, 0).take().expect("published");
    let mut line = String::with_capacity(2048);
    g.bench_function("detailed_log_line", |b| {
        b.iter(|| {
            line.clear();
            write!(
                line,
                "{}",
                Report::new("rank0", black_box(&taken)).detailed(Some(cost))
            )
            .unwrap();
            line.len()
        })
    });
    g.finish();
}

fn median_ns(dir: &Path, group: &str, id: &str) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join(group).join(id).join("new/estimates.json")).ok()?;
    let at = text.find("\"median\"")?;
    let rest = &text[at..];
    let p = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let end = rest[p..].find([',', '}'])?;
    rest[p..p + end].trim().parse().ok()
}

fn main() {
    let dir = PathBuf::from(
        std::env::var("CARGO_TARGET_DIR")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_string()),
    )
    .join("criterion");
    let mut c = Criterion::default()
        .output_directory(&dir)
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_millis(800))
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
    println!("\nmedian ns per call");
    for (group, ids) in [
        (
            "step_path",
            &[
                "counters_record",
                "collector_tick_idle",
                "request_acceptance_record",
            ][..],
        ),
        (
            "read_time",
            &[
                "acceptance_lengths",
                "conditional_acceptance_all_positions",
                "advise",
                "detailed_log_line",
            ][..],
        ),
    ] {
        for id in ids {
            match median_ns(&dir, group, id) {
                Some(v) => println!("{group}/{id:<40} {v:>10.1}"),
                None => println!("{group}/{id:<40} {:>10}", "-"),
            }
        }
    }
}
