//! Slot read and write against `std::sync::Mutex`, `RwLock` and crossbeam's `AtomicCell` on the
//! same 64-byte and 256-byte snapshots, uncontended and with a concurrent reader, and the cost
//! of `Collector::tick` when nothing is due. Ends with a table of ratios against `Mutex`
//! measured in the same run (criterion's medians).
//!
//! Run: `cargo bench -p specula-tests --bench slot`

use criterion::{BenchmarkId, Criterion};
use crossbeam_utils::atomic::AtomicCell;
use specula_core::{Collector, Counters, Readback, SeqSlot, Snapshot};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::task::Poll;

const WORDS: [usize; 2] = [8, 32];

/// The writing half of a contender: one per cell, used by one thread.
trait Write<const N: usize>: Send {
    fn write(&mut self, v: &[u64; N]);
}
/// The reading half: shared by every reader thread.
trait Read<const N: usize>: Sync {
    fn read(&self) -> [u64; N];
}

impl<const N: usize> Write<N> for specula_core::SlotWriter<'static, [u64; N]> {
    fn write(&mut self, v: &[u64; N]) {
        self.publish(v);
    }
}
impl<const N: usize> Read<N> for specula_core::SlotReader<'static, [u64; N]> {
    fn read(&self) -> [u64; N] {
        specula_core::SlotReader::read(self).0
    }
}
impl<const N: usize> Write<N> for &'static Mutex<[u64; N]> {
    fn write(&mut self, v: &[u64; N]) {
        *self.lock().unwrap() = *v;
    }
}
impl<const N: usize> Read<N> for Mutex<[u64; N]> {
    fn read(&self) -> [u64; N] {
        *self.lock().unwrap()
    }
}
impl<const N: usize> Write<N> for &'static RwLock<[u64; N]> {
    fn write(&mut self, v: &[u64; N]) {
        *RwLock::write(self).unwrap() = *v;
    }
}
impl<const N: usize> Read<N> for RwLock<[u64; N]> {
    fn read(&self) -> [u64; N] {
        *RwLock::read(self).unwrap()
    }
}
impl<const N: usize> Write<N> for &'static AtomicCell<[u64; N]> {
    fn write(&mut self, v: &[u64; N]) {
        self.store(*v);
    }
}
impl<const N: usize> Read<N> for AtomicCell<[u64; N]> {
    fn read(&self) -> [u64; N] {
        self.load()
    }
}

type Halves<const N: usize> = (Box<dyn Write<N>>, &'static dyn Read<N>);

/// The four contenders, each split into its writer and its reader. Leaked: a bench process
/// creates a handful and exits.
fn contenders<const N: usize>() -> Vec<(&'static str, Halves<N>)> {
    let slot: &'static mut SeqSlot<[u64; N]> = Box::leak(Box::new(SeqSlot::new([0; N])));
    let (w, r) = slot.split();
    let r: &'static dyn Read<N> = Box::leak(Box::new(r));
    let m: &'static Mutex<[u64; N]> = Box::leak(Box::new(Mutex::new([0; N])));
    let rw: &'static RwLock<[u64; N]> = Box::leak(Box::new(RwLock::new([0; N])));
    let a: &'static AtomicCell<[u64; N]> = Box::leak(Box::new(AtomicCell::new([0; N])));
    vec![
        ("seqslot", (Box::new(w) as Box<dyn Write<N>>, r)),
        ("mutex", (Box::new(m), m)),
        ("rwlock", (Box::new(rw), rw)),
        ("atomiccell", (Box::new(a), a)),
    ]
}

fn bench_size<const N: usize>(c: &mut Criterion) {
    let bytes = N * 8;
    for (name, (mut writer, reader)) in contenders::<N>() {
        for contended in [false, true] {
            let mode = if contended { "reader" } else { "alone" };
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                if contended {
                    // A concurrent reader hammering the same cell.
                    let stop = &stop;
                    s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            black_box(reader.read());
                        }
                    });
                }
                let mut g = c.benchmark_group(format!("read_{bytes}B_{mode}"));
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| black_box(reader.read()))
                });
                g.finish();
                let mut g = c.benchmark_group(format!("write_{bytes}B_{mode}"));
                let mut v = [0u64; N];
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        v[0] = v[0].wrapping_add(1);
                        writer.write(black_box(&v));
                    })
                });
                g.finish();
                stop.store(true, Ordering::Relaxed);
            });
        }
    }
}

struct Never;
impl Readback<8> for Never {
    type Error = ();
    fn start(&mut self) -> Result<(), ()> {
        Ok(())
    }
    fn poll(&mut self) -> Poll<Result<Counters<8>, ()>> {
        Poll::Pending
    }
    fn flush(&mut self) -> Result<Counters<8>, ()> {
        Ok(Counters::ZERO)
    }
}

fn bench_tick(c: &mut Criterion) {
    let mut slot = SeqSlot::new(Snapshot::<8>::ZERO);
    let (w, _r) = slot.split();
    let mut col = Collector::new(Never, w, u64::MAX / 2, 0).unwrap();
    let mut g = c.benchmark_group("collector_tick");
    let mut now = 0u64;
    g.bench_function("idle", |b| {
        b.iter(|| {
            now += 1;
            black_box(col.tick(black_box(now)))
        })
    });
    // A baseline of the same loop without the call: the clock increment alone.
    g.bench_function("empty_loop", |b| {
        b.iter(|| {
            now += 1;
            black_box(now)
        })
    });
    g.finish();
}

fn median_ns(dir: &Path, group: &str, id: &str) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join(group).join(id).join("new/estimates.json")).ok()?;
    // {"mean":{...},"median":{"confidence_interval":{...},"point_estimate":12.3,...
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
    bench_size::<{ WORDS[0] }>(&mut c);
    bench_size::<{ WORDS[1] }>(&mut c);
    bench_tick(&mut c);
    c.final_summary();

    println!("\nmedian ns per op (ratio = contender / mutex, same run)");
    println!(
        "{:<22} {:>14} {:>14} {:>14} {:>14}",
        "case", "seqslot", "mutex", "rwlock", "atomiccell"
    );
    for bytes in WORDS.map(|w| w * 8) {
        for op in ["read", "write"] {
            for mode in ["alone", "reader"] {
                let group = format!("{op}_{bytes}B_{mode}");
                let m = median_ns(&dir, &group, "mutex");
                let cells: Vec<String> = ["seqslot", "mutex", "rwlock", "atomiccell"]
                    .iter()
                    .map(|id| match (median_ns(&dir, &group, id), m) {
                        (Some(v), Some(m)) => format!("{v:.1} ({:.2}x)", v / m),
                        (Some(v), None) => format!("{v:.1}"),
                        _ => "-".into(),
                    })
                    .collect();
                println!(
                    "{group:<22} {:>14} {:>14} {:>14} {:>14}",
                    cells[0], cells[1], cells[2], cells[3]
                );
            }
        }
    }
    if let (Some(t), Some(e)) = (
        median_ns(&dir, "collector_tick", "idle"),
        median_ns(&dir, "collector_tick", "empty_loop"),
    ) {
        println!("collector_tick idle: {t:.2} ns (empty loop {e:.2} ns)");
    }
}
