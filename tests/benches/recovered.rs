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

use specula::cpu::CpuVerifier;
use specula_core::verify::{
    AcceptedOut, Check, Filter, Half, HalfLogits, Method, Outputs, TokensOut, draft_slots,
};
use specula_tests::bench_step::{Step, per_call_s, thread_cpu_s};
use specula_tests::conformance::Gen;
use std::hint::black_box;

const K: usize = 4;
const T: f32 = 0.8;

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
            // Logits 3·ln u (a long tail); probabilities = their softmax at T (f64); drafts
            // near the target, so most positions are accepted (the case where the recovered
            // tokens of accepted positions cost the most).
            let step = Step::new(&mut g, b, vocab, K, T);
            let (lb, temps) = (&step.logits_bf16, &step.temps);
            let filters = vec![Filter::NONE.with_top_k(50).with_top_p(0.9); b];
            let base = step.batch();
            let filtered = base
                .with_target_logits_half(HalfLogits {
                    values: Half::Bf16(lb),
                    temperature: temps,
                })
                .with_filters(&filters);
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
