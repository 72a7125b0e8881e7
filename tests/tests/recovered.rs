//! vLLM's recovered-token output (`recovered_tokens`): the CPU backend gives the reference's
//! bits (probabilities and logits, padded and ragged, `k = 0`), the ragged output is the padded
//! one packed, and at each request's first rejected position it is the emitted token.

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::verify::{
    Batch, Check, Logits, Param, SENTINEL, VerifyError, recovered_tokens, verify_batch,
};
use specula_tests::conformance::{self, Gen, K, METHODS, OutData, RaggedData, RandomSpec};

#[test]
fn recovered_tokens_match_verification_and_layouts() {
    let mut g = Gen(0x2EC0_7E2D);
    let spec = RandomSpec {
        garbage: false,
        ..RandomSpec::default()
    };
    let cpu = CpuVerifier::<K>::new(2).unwrap();
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
