//! The inputs engines hand over (issues 13 and 30), on the CPU backend, in one run: rejection
//! sampling from target **probabilities** (f32, unfiltered, with top-k 50 / top-p 0.9, with
//! top-p 0.9 alone and with min-p 0.05 alone),
//! from target **logits** (f32, bf16 and f16, T = 0.8) unfiltered, from f32 and bf16 logits
//! with **top-k 50 / top-p 0.9**, from f32, bf16 and f16 logits with **top-p 0.9** alone and
//! **min-p 0.05** alone, each next to
//! a read-only pass over the same input bytes (the target tensor plus the draft rows): its
//! physical floor. The probability path reads few of its bytes (8 per accepted position,
//! whole rows only at the rejection and the bonus); the logits paths must read every row once
//! for the softmax, and bf16 or f16 halves those bytes.
//!
//! Two row shapes: **flat** (logits `3·ln u`, a long tail: top-p 0.9 keeps most ids) and
//! **peaked**, shaped like a language model's output (one id with p ≈ 0.7 at T over a
//! `2·N(0, 1)` background: top-p 0.9 keeps about 2 % of the ids, and a sample of the row
//! mostly misses the id that holds the mass). V = 32000 and 128256, batch 1 and 16.
//!
//! `cargo bench -p specula-tests --bench verify_inputs` (a few minutes). Prints one line per
//! (shape, V, batch, input): ms per batch, the read-only pass over that input's bytes, their
//! ratio, and the ratio to the f32 probability path of the same shape. A plain argument runs
//! only the cases whose `shape/V/batch/input` contains it (e.g. `-- peaked/128256/16/`).
//! `SPECULA_CPU_ISA=avx2` (or `portable`) times the narrower kernels on a wider CPU.
//!
//! The read figure is the faster of two read passes, one right before the verifier's timing
//! and one right after it (see the comment at the measurement).
//!
//! By default both sides run on **one thread** (the verifier on the calling thread, the read
//! pass too) and are timed in that thread's **CPU time** (Linux `/proc/thread-self/stat`,
//! accumulated over at least 0.5 s per figure), so the figures hold on a machine shared with
//! other jobs, where wall time would mostly measure the scheduler; elsewhere wall time is
//! used. `SPECULA_BENCH_THREADS=n` (n > 1) runs the verifier on its pool of `n` threads and
//! the read pass on `n` threads of its own, started once before any timing (a pass that
//! spawned its threads per call would time the spawns), both timed in wall time.

use specula::cpu::CpuVerifier;
use specula_core::verify::{Check, Filter, Half, HalfLogits, Logits, Method, Outputs};
use specula_tests::bench_read::ReadPool;
use specula_tests::bench_step::{Step, per_call_s, thread_cpu_s};
use specula_tests::conformance::Gen;
use std::hint::black_box;
use std::time::Instant;

const K: usize = 4;
const T: f32 = 0.8;

/// Seconds per call of `f` in wall time (after one warm-up call), over at least 0.5 s.
fn per_call_wall_s(mut f: impl FnMut()) -> f64 {
    f();
    let t0 = Instant::now();
    let mut n = 0u64;
    loop {
        f();
        n += 1;
        let spent = t0.elapsed().as_secs_f64();
        if spent >= 0.5 && n >= 3 {
            return spent / n as f64;
        }
    }
}

fn main() {
    let threads: usize = std::env::var("SPECULA_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    // One thread: timed in this thread's CPU time (see the module docs).
    let verifier = CpuVerifier::<8>::new(threads).expect("verifier");
    let timed = |f: &mut dyn FnMut()| {
        if threads == 1 {
            per_call_s(f)
        } else {
            per_call_wall_s(f)
        }
    };
    let mut g = Gen(0x1A9_0713);
    // `cargo bench` passes `--bench`: only a plain argument filters.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "{:<6} {:>6} {:>5} {:<22} {:>10} {:>10} {:>8} {:>8}",
        "shape", "V", "batch", "input", "ms/batch", "read ms", "/read", "/probs"
    );
    if threads > 1 {
        println!("({threads} threads each: wall time)");
    } else if thread_cpu_s().is_none() {
        println!("(no /proc/thread-self/stat: wall time)");
    }
    let names = [
        "probabilities f32",
        "probs top-k/top-p",
        "probs top-p 0.9",
        "probs min-p 0.05",
        "logits f32",
        "logits bf16",
        "f32 top-p 0.9",
        "f32 top-k/top-p",
        "f32 min-p 0.05",
        "bf16 top-p 0.9",
        "bf16 top-k/top-p",
        "bf16 min-p 0.05",
        "logits f16",
        "f16 top-p 0.9",
        "f16 min-p 0.05",
    ];
    for shape in ["flat", "peaked"] {
        for vocab in [32_000usize, 128_256] {
            for b in [1usize, 16] {
                let id = |name: &str| format!("{shape}/{vocab}/{b}/{name}");
                let wanted = |name: &str| filter.as_deref().is_none_or(|f| id(name).contains(f));
                if !names.iter().any(|n| wanted(n)) {
                    continue;
                }
                // Probabilities = the logits' softmax at T (f64); drafts near the target.
                let step = if shape == "flat" {
                    Step::new(&mut g, b, vocab, K, T)
                } else {
                    Step::peaked(&mut g, b, vocab, K, T)
                };
                let (logits, probs, draft, temps) =
                    (&step.logits, &step.probs, &step.draft, &step.temps);
                let (lb_bits, lh_bits) = (&step.logits_bf16, &step.logits_f16);
                let f = Filter::NONE;
                let top_k_p = vec![f.with_top_k(50).with_top_p(0.9); b];
                let top_p = vec![f.with_top_p(0.9); b];
                let min_p = vec![f.with_min_p(0.05); b];
                let base = step.batch();
                let f32_logits = base.with_target_logits(Logits {
                    values: logits,
                    temperature: temps,
                });
                let bf16_logits = base.with_target_logits_half(HalfLogits {
                    values: Half::Bf16(lb_bits),
                    temperature: temps,
                });
                let f16_logits = base.with_target_logits_half(HalfLogits {
                    values: Half::F16(lh_bits),
                    temperature: temps,
                });
                // Input bytes: the target tensor plus the draft rows.
                let draft_bytes = draft.len() * 4;
                let (f32_bytes, bf16_bytes) = (
                    probs.len() * 4 + draft_bytes,
                    lb_bits.len() * 2 + draft_bytes,
                );
                let cases = [
                    (names[0], base, f32_bytes),
                    (names[1], base.with_filters(&top_k_p), f32_bytes),
                    (names[2], base.with_filters(&top_p), f32_bytes),
                    (names[3], base.with_filters(&min_p), f32_bytes),
                    (names[4], f32_logits, f32_bytes),
                    (names[5], bf16_logits, bf16_bytes),
                    (names[6], f32_logits.with_filters(&top_p), f32_bytes),
                    (names[7], f32_logits.with_filters(&top_k_p), f32_bytes),
                    (names[8], f32_logits.with_filters(&min_p), f32_bytes),
                    (names[9], bf16_logits.with_filters(&top_p), bf16_bytes),
                    (names[10], bf16_logits.with_filters(&top_k_p), bf16_bytes),
                    (names[11], bf16_logits.with_filters(&min_p), bf16_bytes),
                    (names[12], f16_logits, bf16_bytes),
                    (names[13], f16_logits.with_filters(&top_p), bf16_bytes),
                    (names[14], f16_logits.with_filters(&min_p), bf16_bytes),
                ];
                // The read-only pass reads the same number of bytes from one buffer.
                let reader = ReadPool::new(f32_bytes / 2, threads);
                // NaN (printed as such) when a filter left the probability path out.
                let mut probs_s = f64::NAN;
                for (name, batch, bytes) in cases {
                    if !wanted(name) {
                        continue;
                    }
                    let mut accepted = vec![0u32; b];
                    let mut tokens = vec![0u32; b * (K + 1)];
                    let read_once = || {
                        timed(&mut || {
                            black_box(reader.read(black_box(bytes / 2)));
                        })
                    };
                    let read_before = read_once();
                    let s = timed(&mut || {
                        let mut out = Outputs::new(
                            specula_core::verify::AcceptedOut(&mut accepted),
                            specula_core::verify::TokensOut(&mut tokens),
                        );
                        verifier
                            .verify(Method::Rejection, Check::Cheap, &batch, &mut out)
                            .expect("valid batch");
                        black_box(&tokens);
                    });
                    // The faster of a read right before and one right after: the input
                    // (up to 74 MB) may or may not stay in this machine's L3 cache between
                    // calls, which moved a single read's figure by up to 2.5× from case to
                    // case; the faster one is the stricter floor and varies less.
                    let read = read_before.min(read_once());
                    if name == "probabilities f32" {
                        probs_s = s;
                    }
                    println!(
                        "{:<6} {:>6} {:>5} {:<22} {:>10.3} {:>10.3} {:>8.2} {:>8.2}",
                        shape,
                        vocab,
                        b,
                        name,
                        s * 1e3,
                        read * 1e3,
                        s / read,
                        s / probs_s
                    );
                }
            }
        }
    }
}
