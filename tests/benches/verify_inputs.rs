//! The inputs engines hand over (issue 13), on the CPU backend, in one run: rejection sampling
//! from target **probabilities** (f32), from target **logits** (f32 and bf16, T = 0.8), and from
//! bf16 logits with **top-k 50 / top-p 0.9**, **top-p 0.9** alone and **min-p 0.05** alone,
//! each next to a read-only pass over the same input bytes (the target tensor plus the draft
//! rows, summed on as many threads as the verifier has): its physical floor. The probability
//! path reads few of its bytes (8 per accepted position, whole rows only at the rejection and
//! the bonus); the logits paths must read every row once for the softmax, and bf16 halves
//! those bytes.
//!
//! `cargo bench -p specula-tests --bench verify_inputs` (a minute or two). Prints one line per
//! (V, batch, input): ms per batch, the read-only pass over that input's bytes, their ratio,
//! and the ratio to the f32 probability path of the same shape. `SPECULA_CPU_ISA=avx2` (or
//! `portable`) times the narrower kernels on a wider CPU.
//!
//! Both sides run on **one thread** (the verifier on the calling thread, the read pass too) and
//! are timed in that thread's **CPU time** (Linux `/proc/thread-self/stat`, accumulated over at
//! least 0.5 s per figure), so the figures hold on a machine shared with other jobs, where wall
//! time would mostly measure the scheduler; elsewhere wall time is used.

use specula::cpu::CpuVerifier;
use specula_core::verify::{Check, Half, HalfLogits, Logits, Method, Outputs};
use specula_tests::bench_step::{Step, per_call_s, thread_cpu_s};
use specula_tests::conformance::Gen;
use std::hint::black_box;

const K: usize = 4;
const T: f32 = 0.8;

/// Sums `bytes` bytes of `src` (as u16 words, so f32 and bf16 inputs read alike) on `threads`
/// threads, one contiguous piece each.
fn read_sum(src: &[u16], threads: usize) -> u64 {
    fn sum(c: &[u16]) -> u64 {
        // Eight independent sums so the loop is bound by loads, not by one add chain.
        let mut acc = [0u64; 8];
        let chunks = c.chunks_exact(8);
        let tail: u64 = chunks.remainder().iter().map(|&x| u64::from(x)).sum();
        for ch in chunks {
            for (a, &x) in acc.iter_mut().zip(ch) {
                *a += u64::from(x);
            }
        }
        acc.iter().sum::<u64>() + tail
    }
    if threads <= 1 {
        // On this thread, so its CPU time counts it.
        return sum(src);
    }
    let piece = src.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = src.chunks(piece).map(|c| s.spawn(move || sum(c))).collect();
        parts.into_iter().map(|h| h.join().expect("sum")).sum()
    })
}

fn main() {
    // One thread: timed in this thread's CPU time (see the module docs).
    let verifier = CpuVerifier::<8>::new(1).expect("verifier");
    let threads = verifier.threads();
    let mut g = Gen(0x1A9_0713);
    // `cargo bench` passes `--bench`: only a plain argument filters.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "{:>6} {:>5} {:<22} {:>10} {:>10} {:>8} {:>8}",
        "V", "batch", "input", "ms/batch", "read ms", "/read", "/probs"
    );
    if thread_cpu_s().is_none() {
        println!("(no /proc/thread-self/stat: wall time)");
    }
    for vocab in [32 * 1024, 128 * 1024] {
        for b in [1usize, 16] {
            let names = [
                "probabilities f32",
                "logits f32",
                "logits bf16",
                "bf16 top-k/top-p",
                "bf16 top-p 0.9",
                "bf16 min-p 0.05",
            ];
            let id = |name: &str| format!("{}k/{b}/{name}", vocab / 1024);
            let wanted = |name: &str| filter.as_deref().is_none_or(|f| id(name).contains(f));
            if !names.iter().any(|n| wanted(n)) {
                continue;
            }
            // Logits 3·ln u (a long tail); probabilities = their softmax at T (f64), drafts near.
            let step = Step::new(&mut g, b, vocab, K, T);
            let (logits, probs, draft, temps) =
                (&step.logits, &step.probs, &step.draft, &step.temps);
            let lb_bits = &step.logits_bf16;
            let (top_k, top_p) = (vec![50u32; b], vec![0.9f32; b]);
            let base = step.batch();
            let f32_logits = base.with_target_logits(Logits {
                values: logits,
                temperature: temps,
            });
            let bf16_logits = base.with_target_logits_half(HalfLogits {
                values: Half::Bf16(lb_bits),
                temperature: temps,
            });
            let filtered = bf16_logits.with_top_k(&top_k).with_top_p(&top_p);
            // Top-p alone keeps most of this flat distribution (the drafts stay likely, so
            // rows are reduced up to the rejection as without a filter); min-p likewise.
            let top_p_only = bf16_logits.with_top_p(&top_p);
            let min_p = vec![0.05f32; b];
            let min_p_only = bf16_logits.with_min_p(&min_p);
            // Input bytes: the target tensor plus the draft rows.
            let draft_bytes = draft.len() * 4;
            let cases = [
                (names[0], base, probs.len() * 4 + draft_bytes),
                (names[1], f32_logits, logits.len() * 4 + draft_bytes),
                (names[2], bf16_logits, lb_bits.len() * 2 + draft_bytes),
                (names[3], filtered, lb_bits.len() * 2 + draft_bytes),
                (names[4], top_p_only, lb_bits.len() * 2 + draft_bytes),
                (names[5], min_p_only, lb_bits.len() * 2 + draft_bytes),
            ];
            // The read-only pass reads the same number of bytes from one buffer.
            let pool: Vec<u16> = (0..(probs.len() * 4 + draft_bytes) / 2)
                .map(|i| i as u16)
                .collect();
            // NaN (printed as such) when a filter left the probability path out.
            let mut probs_s = f64::NAN;
            for (name, batch, bytes) in cases {
                if !wanted(name) {
                    continue;
                }
                let mut accepted = vec![0u32; b];
                let mut tokens = vec![0u32; b * (K + 1)];
                let s = per_call_s(|| {
                    let mut out = Outputs::new(
                        specula_core::verify::AcceptedOut(&mut accepted),
                        specula_core::verify::TokensOut(&mut tokens),
                    );
                    verifier
                        .verify(Method::Rejection, Check::Cheap, &batch, &mut out)
                        .expect("valid batch");
                    black_box(&tokens);
                });
                let read = per_call_s(|| {
                    black_box(read_sum(black_box(&pool[..bytes / 2]), threads));
                });
                if name == "probabilities f32" {
                    probs_s = s;
                }
                println!(
                    "{:>6} {:>5} {:<22} {:>10.3} {:>10.3} {:>8.2} {:>8.2}",
                    format!("{}k", vocab / 1024),
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
