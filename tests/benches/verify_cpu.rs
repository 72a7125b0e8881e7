//! CPU verification throughput: rejection sampling over a grid of batch size 1/16/64,
//! vocabulary 32k/128k and draft length 1/4/8, on all cores.
//!
//! For each point criterion reports requests/s; the table printed at the end adds tokens/s and
//! the GB/s of probability data the verifier actually read (8 bytes per accepted position, plus
//! the full target and draft rows of the residual at a rejection, or the target row of the bonus
//! token), next to a plain `copy_from_slice` of the same number of bytes measured in the same
//! run, and next to a read-only pass (a sum over as many bytes on the same number of threads, started
//! once: `specula_tests::bench_read`).
//! A streaming verifier only reads its inputs, so the read-only pass is its physical limit: the
//! `read` ratio is the one to judge; the copy ratio is kept for comparison with older figures.
//!
//! `cargo bench -p specula-tests --bench verify_cpu` (about two minutes on 2 cores).

use criterion::{BenchmarkId, Criterion, Throughput};
use specula::cpu::CpuVerifier;
use specula_core::verify::{Batch, Check, Dims, Drafts, Method, Outputs, Streams};
use specula_tests::bench_read::ReadPool;
use specula_tests::conformance::{Gen, sample};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BATCHES: [usize; 3] = [1, 16, 64];
const VOCABS: [usize; 2] = [32 * 1024, 128 * 1024];
const KS: [usize; 3] = [1, 4, 8];
const KMAX: usize = 8;

/// (vocab, batch, k) → measured seconds per iteration of verify and of the copy, tokens and
/// bytes per iteration.
#[derive(Default, Clone, Copy)]
struct Row {
    verify_s: f64,
    copy_s: f64,
    read_s: f64,
    tokens: u64,
    bytes: u64,
}
static TABLE: Mutex<BTreeMap<(usize, usize, usize), Row>> = Mutex::new(BTreeMap::new());

fn timed(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed()
}

/// Target rows (dense, skewed) and draft rows near them, so acceptance is realistic (≈ 0.8).
fn data(g: &mut Gen, vocab: usize) -> (Vec<f32>, Vec<f32>) {
    let b = *BATCHES.iter().max().unwrap();
    let mut target = vec![0f32; b * (KMAX + 1) * vocab];
    let mut draft = vec![0f32; b * KMAX * vocab];
    for row in target.chunks_exact_mut(vocab) {
        for p in row.iter_mut() {
            let u = g.unit();
            *p = u * u * u * u;
        }
        let s: f32 = row.iter().sum();
        row.iter_mut().for_each(|p| *p /= s);
    }
    for (r, row) in draft.chunks_exact_mut(vocab).enumerate() {
        let t = &target[r * vocab..(r + 1) * vocab];
        for (p, &q) in row.iter_mut().zip(t) {
            *p = q * (0.7 + 0.6 * g.unit());
        }
        let s: f32 = row.iter().sum();
        row.iter_mut().for_each(|p| *p /= s);
    }
    (target, draft)
}

fn bench(c: &mut Criterion) {
    let verifier = CpuVerifier::<KMAX>::new(0).expect("thread pool");
    let mut g = Gen(0xBE4C);
    for &vocab in &VOCABS {
        let (target, draft) = data(&mut g, vocab);
        let mut group = c.benchmark_group(format!("verify_cpu/V{}k", vocab / 1024));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(1));
        for &b in &BATCHES {
            for &k in &KS {
                let tlen = b * (k + 1) * vocab;
                let dlen = b * k * vocab;
                // Draft ids sampled from the draft rows (the first 4096 ids, for speed).
                let mut ids = vec![0u32; b * k];
                for (r, id) in ids.iter_mut().enumerate() {
                    *id = sample(&mut g, &draft[r * vocab..r * vocab + 4096.min(vocab)]);
                }
                let kk = vec![k as u32; b];
                let seed: Vec<u64> = (0..b as u64).collect();
                let offset = vec![17u64; b];
                let batch = Batch::dense(
                    Dims { vocab, k_max: k },
                    Drafts { k: &kk, ids: &ids },
                    &target[..tlen],
                    Streams {
                        seed: &seed,
                        offset: &offset,
                    },
                )
                .with_draft_probs(&draft[..dlen]);
                let mut accepted = vec![0u32; b];
                let mut tokens = vec![0u32; b * (k + 1)];
                let run = |acc: &mut [u32], tok: &mut [u32]| {
                    let mut out = Outputs::new(
                        specula_core::verify::AcceptedOut(acc),
                        specula_core::verify::TokensOut(tok),
                    );
                    verifier
                        .verify(Method::Rejection, Check::Cheap, &batch, &mut out)
                        .expect("valid batch");
                };
                run(&mut accepted, &mut tokens);
                // Outputs are deterministic, so one run tells what every iteration reads.
                let v = vocab as u64;
                let bytes: u64 = accepted
                    .iter()
                    .map(|&a| 8 * u64::from(a) + if (a as usize) < k { 8 * v } else { 4 * v })
                    .sum();
                let emitted: u64 = accepted.iter().map(|&a| u64::from(a) + 1).sum();
                let id = BenchmarkId::from_parameter(format!("b{b}_k{k}"));
                group.throughput(Throughput::Elements(b as u64));
                let mut verify_s = 0.0;
                group.bench_function(id.clone(), |bch| {
                    bch.iter_custom(|iters| {
                        let d = timed(iters, || run(&mut accepted, &mut tokens));
                        verify_s = d.as_secs_f64() / iters as f64;
                        d
                    })
                });
                let n = (bytes / 4) as usize;
                let src = &target[..n.min(target.len())];
                let mut dst = vec![0f32; src.len()];
                group.throughput(Throughput::Bytes(bytes));
                let mut copy_s = 0.0;
                group.bench_function(BenchmarkId::new("copy", format!("b{b}_k{k}")), |bch| {
                    bch.iter_custom(|iters| {
                        let d = timed(iters, || {
                            dst.copy_from_slice(black_box(src));
                            black_box(&mut dst);
                        });
                        copy_s = d.as_secs_f64() / iters as f64;
                        d
                    })
                });
                // The same number of bytes, on as many threads, started once (not per call).
                let reader = ReadPool::new(2 * src.len(), verifier.threads());
                let mut read_s = 0.0;
                group.bench_function(BenchmarkId::new("read", format!("b{b}_k{k}")), |bch| {
                    bch.iter_custom(|iters| {
                        let d = timed(iters, || {
                            black_box(reader.read(reader.words()));
                        });
                        read_s = d.as_secs_f64() / iters as f64;
                        d
                    })
                });
                TABLE.lock().unwrap().insert(
                    (vocab, b, k),
                    Row {
                        verify_s,
                        copy_s,
                        read_s,
                        tokens: emitted,
                        bytes,
                    },
                );
            }
        }
        group.finish();
    }
}

fn print_table() {
    let table = TABLE.lock().unwrap();
    if table.is_empty() {
        return;
    }
    println!();
    println!(
        "{:>6} {:>5} {:>3} {:>12} {:>12} {:>8} {:>10} {:>10} {:>7} {:>7}",
        "V",
        "batch",
        "k",
        "requests/s",
        "tokens/s",
        "GB/s",
        "read GB/s",
        "copy GB/s",
        "/read",
        "/copy"
    );
    // A case filter may leave out a row's read or copy pass (or its verify): print what ran,
    // "-" for the rest, and say why the ratios are missing.
    let rate = |s: f64, x: f64| if s == 0.0 { None } else { Some(x / s) };
    let cell =
        |x: Option<f64>, prec: usize| x.map_or_else(|| "-".to_string(), |x| format!("{x:.prec$}"));
    let mut partial = false;
    for (&(v, b, k), r) in table.iter() {
        let gbs = rate(r.verify_s, r.bytes as f64 / 1e9);
        let copy = rate(r.copy_s, r.bytes as f64 / 1e9);
        let read = rate(r.read_s, r.bytes as f64 / 1e9);
        let ratio = |base: Option<f64>| gbs.zip(base).map(|(g, x)| g / x);
        partial |= gbs.is_none() || copy.is_none() || read.is_none();
        println!(
            "{:>6} {:>5} {:>3} {:>12} {:>12} {:>8} {:>10} {:>10} {:>7} {:>7}",
            format!("{}k", v / 1024),
            b,
            k,
            cell(rate(r.verify_s, b as f64), 0),
            cell(rate(r.verify_s, r.tokens as f64), 0),
            cell(gbs, 2),
            cell(read, 2),
            cell(copy, 2),
            cell(ratio(read), 3),
            cell(ratio(copy), 3),
        );
    }
    if partial {
        println!(
            "(-: not measured in this run; a ratio needs its row's verify, read and copy passes, so filter on the row, e.g. 'b16_k4', not on the pass)"
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    print_table();
}
