//! vLLM's recovered-token output: the separate call (`recovered_tokens`) and the optional output
//! of the verification call itself (`Outputs::with_recovered`).
//!
//! * the CPU backend gives the reference's bits (probabilities and logits, padded and ragged,
//!   `k = 0`), the ragged output is the padded one packed, and at each request's first
//!   rejected position it is the emitted token;
//! * one verification call with the output set gives the same accepted counts, tokens and
//!   counts as without it and the same recovered tokens as `recovered_tokens`, on every CPU
//!   path (one thread, a pool with more requests than threads, a pool with fewer: rows split,
//!   the plain-loop reference backend), `k_max = 0` included; the same at V = 32000 and 151936
//!   (every method, a method per request, f32 / bf16 logits with temperatures and the sampling
//!   filters, ragged with `k = 0` and bonus tokens) is in the statistics tier, optimised
//!   (`tests/statistics/recovered.rs`). Run under each instruction set with
//!   `SPECULA_CPU_ISA=avx2` / `portable`;
//! * a wrong length is `Length { Recovered }` and a bad request its own error, with nothing
//!   written (accepted, tokens, recovered) or counted.

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::verify::{
    Batch, Check, Logits, Method, Param, Reference, SENTINEL, Verifier, VerifyError, draft_slots,
    recovered_tokens, verify_batch,
};
use specula_tests::conformance::{
    self, Gen, K, METHODS, OutData, RaggedData, RandomSpec, sized_batch,
};

#[test]
fn recovered_tokens_match_verification_and_layouts() {
    let mut g = Gen(0x2EC0_7E2D);
    let spec = RandomSpec {
        garbage: false,
        ..RandomSpec::default()
    };
    let cpu = CpuVerifier::<K>::new(2).unwrap();
    let mut counting = CpuVerifier::<K>::new(2).unwrap();
    let mut rejections = 0;
    for i in 0..300 {
        let (mut d, _) = conformance::random_batch(&mut g, spec);
        for k in &mut d.k {
            if g.chance(1, 4) {
                *k = 0;
            }
        }
        let logits: Vec<f32> = d.target_probs.iter().map(|_| 4.0 * g.unit()).collect();
        let temps: Vec<f32> = (0..d.requests())
            .map(|_| if g.chance(1, 3) { 0.0 } else { 0.2 + g.unit() })
            .collect();
        let use_logits = i % 2 == 1;
        let padded: Batch<'_> = if use_logits {
            d.view().with_target_logits(Logits {
                values: &logits,
                temperature: &temps,
            })
        } else {
            d.view()
        };
        let m = METHODS[i % 3];
        let slots = d.requests() * d.k_max;
        let mut want = vec![0u32; slots];
        recovered_tokens::<K>(m, Check::STRICT, &padded, &mut want).unwrap();
        let mut got = vec![0u32; slots];
        cpu.recovered_tokens(m, Check::STRICT, &padded, &mut got)
            .unwrap();
        assert_eq!(got, want, "batch {i}: CPU ≠ reference");
        // At the first rejected position: the emitted token.
        let mut out = OutData::new(d.requests(), d.k_max);
        let mut c = Counters::<K>::ZERO;
        verify_batch(m, Check::STRICT, &padded, &mut out.view(), &mut c).unwrap();
        let w = d.k_max + 1;
        for b in 0..d.requests() {
            let (k, a) = (d.k[b] as usize, out.accepted[b] as usize);
            let row = &want[b * d.k_max..(b + 1) * d.k_max];
            assert!(
                row[k..].iter().all(|&t| t == SENTINEL),
                "batch {i}: padding"
            );
            if a < k {
                rejections += 1;
                assert_eq!(row[a], out.tokens[b * w + a], "batch {i}, request {b}");
            }
        }
        // Ragged: the same tokens, packed.
        let mut src = d.clone();
        if use_logits {
            src.target_probs.clone_from(&logits);
        }
        let r = RaggedData::from_padded(&src, None);
        let mut ragged = r.view();
        if use_logits {
            ragged = ragged.with_target_logits(Logits {
                values: &r.target_probs,
                temperature: &temps,
            });
        }
        let packed: Vec<u32> = (0..d.requests())
            .flat_map(|b| want[b * d.k_max..b * d.k_max + d.k[b] as usize].to_vec())
            .collect();
        let mut rr = vec![0u32; packed.len()];
        cpu.recovered_tokens(m, Check::STRICT, &ragged, &mut rr)
            .unwrap();
        assert_eq!(rr, packed, "batch {i}: ragged ≠ padded");
        // The same from the verification call itself.
        conformance::assert_recovered_matches_reference(
            &mut counting,
            m,
            Check::STRICT,
            &padded,
            &format!("batch {i}"),
        );
        conformance::assert_recovered_matches_reference(
            &mut counting,
            m,
            Check::STRICT,
            &ragged,
            &format!("batch {i}, ragged"),
        );
    }
    assert!(rejections > 100, "only {rejections} rejections exercised");
    assert!(cpu.totals().is_zero(), "recovered tokens count nothing");
}

#[test]
fn recovered_tokens_length_is_checked() {
    let mut g = Gen(1);
    let (d, _) = conformance::random_batch(&mut g, RandomSpec::default());
    let mut short = vec![0u32; d.requests() * d.k_max - 1];
    let e = recovered_tokens::<K>(METHODS[1], Check::Cheap, &d.view(), &mut short);
    assert_eq!(
        e,
        Err(VerifyError::Length {
            param: Param::Recovered,
            len: short.len(),
            expected: short.len() + 1
        })
    );
    assert!(short.iter().all(|&t| t == 0), "nothing written on error");
}

/// The CPU paths a batch of four requests takes: one thread, a pool with fewer threads than
/// requests (requests in parallel), a pool with more (each row split over it), the
/// plain-loop reference backend.
fn cpu_paths() -> [(&'static str, CpuVerifier<K>); 4] {
    [
        ("1 thread", CpuVerifier::new(1).expect("verifier")),
        ("3 threads", CpuVerifier::new(3).expect("pool")),
        ("8 threads", CpuVerifier::new(8).expect("pool")),
        ("reference backend", CpuVerifier::reference()),
    ]
}

/// `k_max = 0` (padded: no draft slot at all) and a ragged batch whose requests all have
/// `k = 0`: the recovered output is empty, and the call still verifies (bonus tokens only).
#[test]
fn no_draft_slots_means_an_empty_recovered_output() {
    let mut g = Gen(0x2EC0_0000);
    let d = sized_batch(&mut g, 4, 1000, 0, true);
    let r = RaggedData::from_padded(&d, None);
    assert_eq!((draft_slots(&d.view()), draft_slots(&r.view())), (0, 0));
    for (path, v) in &mut cpu_paths() {
        for m in METHODS {
            for batch in [d.view(), r.view()] {
                let (want, _) = conformance::assert_recovered_matches_reference(
                    v,
                    m,
                    Check::STRICT,
                    &batch,
                    path,
                );
                assert!(want.recovered.is_empty());
                assert!(want.out.tokens.iter().all(|&t| t < 1000));
            }
        }
    }
}

/// The recovered output of a backend's call is refused like any other bad input: a wrong
/// length is `Length { Recovered }` (after the other outputs' lengths), a bad request its own
/// error; either way the accepted counts, tokens and recovered slots are untouched and nothing
/// is counted, on every CPU path and the core reference.
#[test]
fn wrong_recovered_length_is_a_typed_error_with_nothing_written() {
    let mut g = Gen(0x2EC0_BAD0);
    let d = sized_batch(&mut g, 4, 500, 3, true);
    let r = RaggedData::from_padded(&d, None);
    let mut bad = d.clone();
    bad.draft_ids[3 * 3] = 500; // request 3, position 0: out of range
    bad.k[3] = 1;
    fn check_one<V: Verifier<K>>(v: &mut V, batch: &Batch<'_>, len: usize, want: &VerifyError)
    where
        V::Error: From<VerifyError>,
    {
        let (b, km) = (batch.requests(), batch.k_max);
        let before = v.totals().unwrap();
        let mut out = OutData::new(b, km);
        let mut rec = vec![7u32; len];
        let e = v.verify(
            Method::Rejection,
            Check::STRICT,
            batch,
            &mut out.view().with_recovered(&mut rec),
        );
        assert_eq!(e, Err(V::Error::from(*want)), "len {len}");
        assert_eq!(out, OutData::new(b, km), "outputs written on error");
        assert!(rec.iter().all(|&t| t == 7), "recovered written on error");
        assert!(v.totals().unwrap().delta_since(&before).is_zero());
    }
    let mut cases = vec![];
    for batch in [d.view(), r.view()] {
        let slots = draft_slots(&batch);
        for len in [0, slots - 1, slots + 1] {
            cases.push((
                batch,
                len,
                VerifyError::Length {
                    param: Param::Recovered,
                    len,
                    expected: slots,
                },
            ));
        }
    }
    let bv = bad.view();
    cases.push((
        bv,
        draft_slots(&bv),
        VerifyError::TokenOutOfRange {
            request: 3,
            position: 0,
            token: 500,
            vocab: 500,
        },
    ));
    for (batch, len, want) in &cases {
        for (_, v) in &mut cpu_paths() {
            check_one(v, batch, *len, want);
        }
        check_one(&mut Reference::<K>::new(), batch, *len, want);
    }
    // A short `tokens` is reported before the recovered output.
    let mut out = OutData::new(4, 3);
    out.tokens.pop();
    let mut rec = [0u32; 12];
    let e = CpuVerifier::<K>::new(1).unwrap().verify(
        Method::Greedy,
        Check::Cheap,
        &d.view(),
        &mut out.view().with_recovered(&mut rec[..5]),
    );
    assert_eq!(
        e,
        Err(VerifyError::Length {
            param: Param::Tokens,
            len: 15,
            expected: 16
        })
    );
}

/// The conformance suite's case (`conformance::recovered_output`: random padded and ragged
/// batches, `k = 0`, every method) on the CPU paths and the core reference. Its refusal
/// branch runs on the GPU orchestration (`tests/tests/it/gpu_host_inputs.rs`).
#[test]
fn conformance_case_on_the_cpu_and_the_reference() {
    conformance::recovered_output(
        || CpuVerifier::<K>::new(1).expect("verifier"),
        0x2EC0_C001,
        100,
    );
    conformance::recovered_output(|| CpuVerifier::<K>::new(3).expect("pool"), 0x2EC0_C002, 100);
    conformance::recovered_output(CpuVerifier::<K>::reference, 0x2EC0_C003, 60);
    conformance::recovered_output(Reference::<K>::new, 0x2EC0_C004, 60);
}
