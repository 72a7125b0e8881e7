//! The recovered-token output (vLLM's `recovered_token_ids`) on the CPU backend, in one run:
//! verification alone, verification then the separate `recovered_tokens` call (two calls),
//! and one verification call that also fills the output (`Outputs::with_recovered`). Rejection
//! sampling and greedy, from f32 target probabilities and from bf16 logits (T = 0.8) with
//! top-k 50 / top-p 0.9, at V = 32000 and 151936, batch 1 and 16, k = 4.
//!
//! `cargo bench -p specula-tests --bench recovered` (a minute or two). Prints ms per batch for
//! each of the three, and the one call's ratio to verification alone and to the two calls.
//! Recovered tokens need every draft position's race (the residual race for rejection
//! sampling), where verification stops at the first rejection, so the one call costs more
//! than verification alone; it saves what the two calls compute twice
//! (`CpuVerifier::recovered_tokens` runs the same per-request path into scratch outputs, so
//! the second call repeats the verification and, for logits and filters, the rows'
//! processing).
//!
//! Timed on **one thread** in that thread's **CPU time** (Linux `/proc/thread-self/stat`,
//! accumulated over at least 0.5 s per figure), as `verify_inputs` does, so the figures hold
//! on a machine shared with other jobs; elsewhere wall time is used.

use half::bf16;
use specula::cpu::CpuVerifier;
use specula_core::verify::{
    AcceptedOut, Batch, Check, Dims, Drafts, Half, HalfLogits, Method, Outputs, Streams, TokensOut,
    draft_slots,
};
use specula_tests::conformance::{Gen, sample};
use std::hint::black_box;
use std::time::Instant;

const K: usize = 4;
const T: f32 = 0.8;

/// This thread's CPU time in seconds (user + system, clock ticks of 10 ms), if readable.
fn thread_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Seconds per call of `f` (after one warm-up call): this thread's CPU time over at least
/// 0.5 s of it, or wall time where CPU time cannot be read.
fn per_call_s(mut f: impl FnMut()) -> f64 {
    f();
    let (cpu0, wall0) = (thread_cpu_s(), Instant::now());
    let mut n = 0u64;
    loop {
        f();
        n += 1;
        let spent = match (cpu0, thread_cpu_s()) {
            (Some(a), Some(b)) => b - a,
            _ => wall0.elapsed().as_secs_f64(),
        };
        if spent >= 0.5 && n >= 3 {
            return spent / n as f64;
        }
    }
}

fn main() {
    let verifier = CpuVerifier::<8>::new(1).expect("verifier");
    let mut g = Gen(0x2EC0_BE4C);
    println!(
        "{:>7} {:>5} {:<18} {:<9} {:>9} {:>9} {:>9} {:>8} {:>7}",
        "V", "batch", "input", "method", "verify", "two", "one", "/verify", "/two"
    );
    if thread_cpu_s().is_none() {
        println!("(no /proc/thread-self/stat: wall time)");
    }
    for vocab in [32_000usize, 151_936] {
        for b in [1usize, 16] {
            let rows = b * (K + 1);
            // Logits 3·ln u (a long tail); probabilities = their softmax at T (f64); drafts
            // near the target, so most positions are accepted (the case where the recovered
            // tokens of accepted positions cost the most).
            let logits: Vec<f32> = (0..rows * vocab)
                .map(|_| 3.0 * (g.unit() + 1e-6).ln())
                .collect();
            let lb: Vec<u16> = logits
                .iter()
                .map(|&x| bf16::from_f32(x).to_bits())
                .collect();
            let mut probs = vec![0f32; rows * vocab];
            for (p, l) in probs
                .chunks_exact_mut(vocab)
                .zip(logits.chunks_exact(vocab))
            {
                let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f64> = l
                    .iter()
                    .map(|&x| (f64::from(x - m) / f64::from(T)).exp())
                    .collect();
                let s: f64 = e.iter().sum();
                for (o, x) in p.iter_mut().zip(&e) {
                    *o = (x / s) as f32;
                }
            }
            let mut draft = vec![0f32; b * K * vocab];
            for r in 0..b {
                for j in 0..K {
                    let t = &probs[(r * (K + 1) + j) * vocab..][..vocab];
                    let d = &mut draft[(r * K + j) * vocab..][..vocab];
                    for (o, &x) in d.iter_mut().zip(t) {
                        *o = x * (0.7 + 0.6 * g.unit());
                    }
                    let s: f32 = d.iter().sum();
                    d.iter_mut().for_each(|x| *x /= s);
                }
            }
            let ids: Vec<u32> = (0..b * K)
                .map(|i| sample(&mut g, &draft[i * vocab..(i + 1) * vocab]))
                .collect();
            let ks = vec![K as u32; b];
            let seed: Vec<u64> = (0..b as u64).collect();
            let offset = vec![3u64; b];
            let temps = vec![T; b];
            let (top_k, top_p) = (vec![50u32; b], vec![0.9f32; b]);
            let base = Batch::dense(
                Dims { vocab, k_max: K },
                Drafts { k: &ks, ids: &ids },
                &probs,
                Streams {
                    seed: &seed,
                    offset: &offset,
                },
            )
            .with_draft_probs(&draft);
            let mut filtered = base
                .with_target_logits_half(HalfLogits {
                    values: Half::Bf16(&lb),
                    temperature: &temps,
                })
                .with_top_k(&top_k)
                .with_top_p(&top_p);
            filtered.target_probs = &[];
            for (name, batch) in [("probabilities f32", base), ("bf16 top-k/top-p", filtered)] {
                for method in [Method::Rejection, Method::Greedy] {
                    let mut accepted = vec![0u32; b];
                    let mut tokens = vec![0u32; b * (K + 1)];
                    let mut recovered = vec![0u32; draft_slots(&batch)];
                    let mut verify = |rec: Option<&mut [u32]>| {
                        let mut out =
                            Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
                        if let Some(r) = rec {
                            out = out.with_recovered(r);
                        }
                        verifier
                            .verify(method, Check::Cheap, &batch, &mut out)
                            .expect("valid batch");
                    };
                    // `verify` writes the outputs and the shared counters: never optimised out.
                    let alone = per_call_s(|| verify(None));
                    let two = per_call_s(|| {
                        verify(None);
                        verifier
                            .recovered_tokens(method, Check::Cheap, &batch, &mut recovered)
                            .expect("valid batch");
                        black_box(&recovered);
                    });
                    let one = per_call_s(|| {
                        verify(Some(&mut recovered));
                        black_box(&recovered);
                    });
                    println!(
                        "{:>7} {:>5} {:<18} {:<9} {:>9.3} {:>9.3} {:>9.3} {:>8.2} {:>7.2}",
                        vocab,
                        b,
                        name,
                        format!("{method:?}").to_lowercase(),
                        alone * 1e3,
                        two * 1e3,
                        one * 1e3,
                        one / alone,
                        one / two
                    );
                }
            }
        }
    }
}
