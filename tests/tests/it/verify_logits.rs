//! Target logits with per-request temperature (issue 13): the reference and the CPU backend
//! agree bit for bit (padded and ragged, `k = 0`, bonus tokens, mixed temperatures, real
//! vocabulary sizes), a logits request gives exactly the bits of the probability request whose
//! rows are its softmax (temperature 0: greedy on the logits), backends without logits refuse
//! them. That the emitted tokens follow softmax(logits / T) is the statistics tier's
//! (`verify_logits` there).

// Request and row indices address several tables (temperatures, rows, outputs) at once.
#![allow(clippy::needless_range_loop)]

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::verify::{
    Batch, Check, Logits, Method, Param, Reference, Softmax, VerifyError, verify_batch,
};
use specula_tests::conformance::{
    self, BatchData, Gen, K, METHODS, OutData, RaggedData, sized_batch,
};

/// Random logits (`4·ln u`, a long tail, some `−∞` masked ids) in place of `d`'s target rows,
/// keeping its layout and padding; temperatures mixing 0 (greedy) and `(0, 2)`.
fn with_logits(g: &mut Gen, d: &BatchData) -> (Vec<f32>, Vec<f32>) {
    let logits: Vec<f32> = d
        .target_probs
        .iter()
        .map(|_| {
            if g.chance(1, 50) {
                f32::NEG_INFINITY
            } else {
                4.0 * (g.unit() + 1e-6).ln()
            }
        })
        .collect();
    let temps = (0..d.requests())
        .map(|_| {
            if g.chance(1, 4) {
                0.0
            } else {
                0.05 + 1.95 * g.unit()
            }
        })
        .collect();
    (logits, temps)
}

fn logits_view<'a>(d: &'a BatchData, logits: &'a [f32], temps: &'a [f32]) -> Batch<'a> {
    d.view().with_target_logits(Logits {
        values: logits,
        temperature: temps,
    })
}

/// The probability batch a logits batch stands for, request by request: its softmax rows
/// (temperature > 0), or the logits themselves verified greedily (temperature 0).
#[test]
fn logits_are_the_softmax_rows_bit_for_bit() {
    let mut g = Gen(0x10_6175);
    for i in 0..200 {
        let (mut d, _) = conformance::random_batch(&mut g, conformance::RandomSpec::default());
        for k in &mut d.k {
            if g.chance(1, 4) {
                *k = 0;
            }
        }
        let (logits, temps) = with_logits(&mut g, &d);
        let m = METHODS[i % 3];
        let batch = logits_view(&d, &logits, &temps);
        let mut got = OutData::new(d.requests(), d.k_max);
        let mut counted = Counters::<K>::ZERO;
        verify_batch(m, Check::Cheap, &batch, &mut got.view(), &mut counted).unwrap();
        // The same requests as probability rows.
        let mut probs = d.clone();
        let w = d.k_max + 1;
        for b in 0..d.requests() {
            for j in 0..w {
                let at = (b * w + j) * d.target_stride;
                let row = &logits[at..at + d.vocab];
                let out = &mut probs.target_probs[at..at + d.vocab];
                if temps[b] == 0.0 {
                    out.copy_from_slice(row);
                } else {
                    let sm = Softmax::of(row, temps[b]);
                    out.iter_mut().zip(row).for_each(|(o, &l)| *o = sm.p(l));
                }
            }
        }
        for b in 0..d.requests() {
            let mut one = probs.empty_like();
            one.push_from(&probs, b);
            let method = if temps[b] == 0.0 { Method::Greedy } else { m };
            let (want, _) = conformance::reference(method, Check::Cheap, &one).unwrap();
            assert_eq!(
                (got.accepted[b], &got.tokens[b * w..(b + 1) * w]),
                (want.accepted[0], &want.tokens[..]),
                "batch {i}, request {b}, T = {}",
                temps[b]
            );
        }
    }
}

/// The CPU backend (one thread, a pool) gives the reference's bits for logits batches, padded
/// and ragged, with and without bonus tokens, `k = 0` included.
#[test]
fn cpu_matches_reference_with_logits() {
    let mut g = Gen(0xC0_6175);
    for (threads, vocab, batches) in [(1, 40, 150), (3, 40, 150), (2, 32_000, 2)] {
        let mut v = CpuVerifier::<K>::new(threads).unwrap();
        for i in 0..batches {
            let d = if vocab > 1000 {
                sized_batch(&mut g, 4, vocab, 3, true)
            } else {
                let spec = conformance::RandomSpec {
                    garbage: false,
                    ..Default::default()
                };
                let (mut d, _) = conformance::random_batch(&mut g, spec);
                for k in &mut d.k {
                    if g.chance(1, 4) {
                        *k = 0;
                    }
                }
                d
            };
            let (logits, temps) = with_logits(&mut g, &d);
            let bonus: Vec<u32> = (0..d.requests()).map(|_| g.below(d.vocab) as u32).collect();
            for m in METHODS {
                let what = format!("V {vocab}, {threads} threads, batch {i}");
                let padded = logits_view(&d, &logits, &temps);
                conformance::assert_view_matches_reference(
                    &mut v,
                    m,
                    Check::STRICT,
                    &padded,
                    &what,
                )
                .expect("valid padded logits batch");
                let with_bonus = padded.with_bonus(&bonus);
                conformance::assert_view_matches_reference(
                    &mut v,
                    m,
                    Check::STRICT,
                    &with_bonus,
                    &what,
                )
                .expect("valid padded logits batch with bonus");
                // Ragged: the logits packed as the probabilities would be.
                let mut as_probs = d.clone();
                as_probs.target_probs.clone_from(&logits);
                let r = RaggedData::from_padded(&as_probs, None);
                let ragged = r.view().with_target_logits(Logits {
                    values: &r.target_probs,
                    temperature: &temps,
                });
                let (qo, _) = conformance::assert_view_matches_reference(
                    &mut v,
                    m,
                    Check::STRICT,
                    &ragged,
                    &what,
                )
                .expect("valid ragged logits batch");
                let mut po = OutData::new(d.requests(), d.k_max);
                let mut c = Counters::<K>::ZERO;
                verify_batch(m, Check::STRICT, &padded, &mut po.view(), &mut c).unwrap();
                assert_eq!(
                    conformance::narrow(&po, ragged.k_max + 1),
                    qo,
                    "{what}: ragged ≠ padded"
                );
            }
        }
    }
}

/// Bad temperatures and logits are typed errors; backends without logits refuse them.
#[test]
fn logits_errors() {
    let mut g = Gen(0xE2_6175);
    let (d, _) = conformance::random_batch(&mut g, conformance::RandomSpec::default());
    let (mut logits, mut temps) = with_logits(&mut g, &d);
    let mut v = Reference::<K>::new();
    let mut run = |batch: &Batch<'_>| {
        let mut out = OutData::new(d.requests(), d.k_max);
        specula_core::verify::Verifier::verify(
            &mut v,
            Method::Rejection,
            Check::STRICT,
            batch,
            &mut out.view(),
        )
    };
    temps[0] = f32::NAN;
    assert_eq!(
        run(&logits_view(&d, &logits, &temps)),
        Err(VerifyError::BadParam {
            request: 0,
            param: Param::Temperature
        })
    );
    temps[0] = -1.0;
    assert!(run(&logits_view(&d, &logits, &temps)).is_err());
    temps[0] = 1.0;
    logits[d.vocab - 1] = f32::INFINITY;
    assert_eq!(
        run(&logits_view(&d, &logits, &temps)),
        Err(VerifyError::BadLogit {
            request: 0,
            position: 0,
            index: d.vocab - 1
        })
    );
    // Temperatures without logits, and probabilities next to logits, cannot be written: the
    // target is one `Target`, probabilities or logits with their temperatures.
}

/// Seeded logits batches (padded and ragged, mixed temperatures, `k = 0`, bonus tokens) give
/// pinned outputs: any change to the softmax rules or its streams changes this digest.
#[test]
fn logits_value_stability() {
    let mut g = Gen(0x57AB_1E06);
    let spec = conformance::RandomSpec {
        garbage: false,
        ..Default::default()
    };
    // FNV-1a over every accepted count and token.
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    let mut eat = |x: u32| {
        for byte in x.to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
        }
    };
    for i in 0..40 {
        let (mut d, _) = conformance::random_batch(&mut g, spec);
        for k in &mut d.k {
            if g.chance(1, 4) {
                *k = 0;
            }
        }
        let (logits, temps) = with_logits(&mut g, &d);
        let bonus: Vec<u32> = (0..d.requests()).map(|_| g.below(d.vocab) as u32).collect();
        let mut batch = logits_view(&d, &logits, &temps);
        if i % 2 == 1 {
            batch = batch.with_bonus(&bonus);
        }
        let mut out = OutData::new(d.requests(), d.k_max);
        let mut c = Counters::<K>::ZERO;
        verify_batch(
            METHODS[i % 3],
            Check::STRICT,
            &batch,
            &mut out.view(),
            &mut c,
        )
        .unwrap();
        out.accepted.iter().chain(&out.tokens).for_each(|&x| eat(x));
    }
    println!("digest {h:#018x}");
    assert_eq!(h, PINNED_DIGEST);
}

/// The digest of [`logits_value_stability`].
const PINNED_DIGEST: u64 = 0xac82_5f30_ff27_6239;
