//! vLLM's recovered-token output at real vocabulary sizes, optimised: one verification call
//! with the output set (`Outputs::with_recovered`) gives the same accepted counts, tokens and
//! counts as without it and the same recovered tokens as `recovered_tokens`, on every CPU path
//! (one thread, a pool with more requests than threads, a pool with fewer: rows split, the
//! plain-loop reference backend) at V = 32000 and 151936: every method, a method per request,
//! f32 / bf16 logits with temperatures (0 included) and the sampling filters, ragged with
//! `k = 0` and bonus tokens. Run under each instruction set with `SPECULA_CPU_ISA=avx2` /
//! `portable`.
//!
//! Not a sampling law: a bit-for-bit check that sits in this tier because it is optimised. In
//! the debug build of the fast tier (`tests/it/recovered.rs`, the same property at small sizes)
//! it took 67-126 s of the full run; here it takes seconds.

use specula::cpu::CpuVerifier;
use specula_core::verify::{Batch, Check, Half, HalfLogits, Logits, Method, argmax};
use specula_tests::conformance::{
    self, Gen, K, METHODS, RaggedData, filters_of, random_filters, random_logits, sized_batch,
    to_bf16,
};

/// The CPU paths a batch of four requests takes (as `tests/it/recovered.rs`'s): one thread, a
/// pool with fewer threads than requests (requests in parallel), a pool with more (each row
/// split over it), the plain-loop reference backend.
fn cpu_paths() -> [(&'static str, CpuVerifier<K>); 4] {
    [
        ("1 thread", CpuVerifier::new(1).expect("verifier")),
        ("3 threads", CpuVerifier::new(3).expect("pool")),
        ("8 threads", CpuVerifier::new(8).expect("pool")),
        ("reference backend", CpuVerifier::reference()),
    ]
}

/// One call with `Outputs::with_recovered` = verification + `recovered_tokens`, bit for bit,
/// on every CPU path at real vocabulary sizes, every method and input kind (see the module
/// docs), `k = 0` included.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "real sizes: run optimised (the statistics tier)"
)]
fn one_call_gives_the_recovered_tokens_at_real_sizes() {
    let mut g = Gen(0x2EC0_0C41);
    let mut paths = cpu_paths();
    let mut rejected = 0;
    let mut empty = 0;
    let mut greedy_accepted = 0;
    for (vocab, batches) in [(32_000usize, 2usize), (151_936, 1)] {
        for i in 0..batches {
            let mut d = sized_batch(&mut g, 4, vocab, 3, true);
            empty += d.k.iter().filter(|&&k| k == 0).count();
            // Half the drafts are their target row's argmax, so greedy accepts too.
            for b in 0..4 {
                for j in 0..d.k[b] as usize {
                    if g.chance(1, 2) {
                        let t0 = (b * 4 + j) * vocab;
                        d.draft_ids[b * 3 + j] = argmax(&d.target_probs[t0..t0 + vocab]);
                    }
                }
            }
            // The logits keep the rows' order (the same argmax, up to rounding ties).
            let mut logits: Vec<f32> = d.target_probs.iter().map(|&p| 2.0 * p.ln()).collect();
            let temps: Vec<f32> = (0..4)
                .map(|_| if g.chance(1, 4) { 0.0 } else { 0.1 + g.unit() })
                .collect();
            if i == 0 {
                // Independent logits with ties and masked ids for the first batch.
                logits = random_logits(&mut g, &d).0;
            }
            let lb = to_bf16(&logits);
            let (top_k, top_p, min_p) = random_filters(&mut g, 4, vocab);
            let f_k = filters_of(4, Some(&top_k), None, None).expect("a part");
            let f_kpm = filters_of(4, Some(&top_k), Some(&top_p), Some(&min_p)).expect("a part");
            let f_pm = filters_of(4, None, Some(&top_p), Some(&min_p)).expect("a part");
            let methods: Vec<Method> = (0..4).map(|_| METHODS[g.below(3)]).collect();
            let bonus: Vec<u32> = (0..4).map(|_| g.below(vocab) as u32).collect();
            let mut as_logits = d.clone();
            as_logits.target_probs.clone_from(&logits);
            let r = RaggedData::from_padded(&d, None);
            let rl = RaggedData::from_padded(&as_logits, Some(&bonus));
            let rlb = to_bf16(&rl.target_probs);
            let views: Vec<(&str, Batch<'_>)> = vec![
                ("probabilities", d.view()),
                ("probabilities, top-p, min-p", d.view().with_filters(&f_pm)),
                ("f32 logits, top-k", {
                    d.view()
                        .with_target_logits(Logits {
                            values: &logits,
                            temperature: &temps,
                        })
                        .with_filters(&f_k)
                }),
                ("bf16 logits, filters", {
                    d.view()
                        .with_target_logits_half(HalfLogits {
                            values: Half::Bf16(&lb),
                            temperature: &temps,
                        })
                        .with_filters(&f_kpm)
                }),
                ("ragged probabilities", r.view()),
                ("ragged bf16 logits, bonus, filters, methods", {
                    rl.view()
                        .with_target_logits_half(HalfLogits {
                            values: Half::Bf16(&rlb),
                            temperature: &temps,
                        })
                        .with_filters(&f_kpm)
                        .with_methods(&methods)
                }),
            ];
            for m in METHODS {
                for (name, batch) in &views {
                    let what = format!("V = {vocab}, batch {i}, {name}");
                    let want = conformance::recovered_reference(m, Check::STRICT, batch, &what);
                    if m == Method::Greedy && !name.contains("methods") {
                        greedy_accepted += want.out.accepted.iter().sum::<u32>();
                    }
                    for (path, v) in &mut paths {
                        rejected += conformance::assert_recovered_matches(
                            v,
                            &want,
                            m,
                            Check::STRICT,
                            batch,
                            &format!("{what}, {path}"),
                        );
                    }
                }
            }
        }
    }
    assert!(empty > 0, "no request with k = 0 exercised");
    assert!(rejected > 50, "only {rejected} rejections exercised");
    assert!(
        greedy_accepted > 8,
        "only {greedy_accepted} greedy acceptances"
    );
}
