//! Target logits with per-request temperature (issue 13): the reference and the CPU backend
//! agree bit for bit (padded and ragged, `k = 0`, bonus tokens, mixed temperatures, real
//! vocabulary sizes), a logits request gives exactly the bits of the probability request whose
//! rows are its softmax (temperature 0: greedy on the logits), backends without logits refuse
//! them, and (release mode) the emitted tokens follow softmax(logits / T) at V = 32000.

// Request and row indices address several tables (temperatures, rows, outputs) at once.
#![allow(clippy::needless_range_loop)]

use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Logits, Method, Param, Reference, Softmax, Streams, VerifyError,
    verify_batch,
};
use specula_tests::conformance::{
    self, BatchData, Gen, K, METHODS, OutData, RaggedData, sample, sized_batch,
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

/// Rejection sampling from target logits at V = 32000, T = 0.8 (k = 1), and bonus-only requests
/// (k = 0) at T = 1.3: the first emitted token follows the exact softmax(logits / T) (computed
/// here in binary64; chi-square over 64 buckets of equal mass, α = 10⁻⁶), and the draft is
/// accepted with probability Σ min(p, q) (|z| < 4.9, α ≈ 10⁻⁶).
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn logits_are_lossless_at_32k() {
    const VOCAB: usize = 32_000;
    const B: usize = 500;
    const CALLS: usize = 60;
    const BUCKETS: usize = 64;
    let mut g = Gen(0x1061_7532);
    let l: Vec<f32> = (0..VOCAB).map(|_| 4.0 * (g.unit() + 1e-6).ln()).collect();
    let v = CpuVerifier::<K>::new(0).expect("thread pool");
    for (t, k) in [(0.8f32, 1usize), (1.3, 0)] {
        // The exact law, in binary64.
        let z: Vec<f64> = l.iter().map(|&x| f64::from(x) / f64::from(t)).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = z.iter().map(|&x| (x - m).exp()).collect();
        let s: f64 = w.iter().sum();
        let p: Vec<f64> = w.iter().map(|&x| x / s).collect();
        let mut q: Vec<f32> = p
            .iter()
            .map(|&x| (x * f64::from(0.5 + g.unit())) as f32)
            .collect();
        let qs: f32 = q.iter().sum();
        q.iter_mut().for_each(|x| *x /= qs);
        let overlap: f64 = p.iter().zip(&q).map(|(&a, &b)| a.min(f64::from(b))).sum();
        let mut bucket = vec![0usize; VOCAB];
        let mut mass = [0f64; BUCKETS];
        let mut acc = 0f64;
        for i in 0..VOCAB {
            let b = ((acc * BUCKETS as f64) as usize).min(BUCKETS - 1);
            bucket[i] = b;
            mass[b] += p[i];
            acc += p[i];
        }
        let rows = k + 1;
        let mut logits = Vec::with_capacity(B * rows * VOCAB);
        let mut draft = Vec::with_capacity(B * k * VOCAB);
        for _ in 0..B {
            for _ in 0..rows {
                logits.extend_from_slice(&l);
            }
            for _ in 0..k {
                draft.extend_from_slice(&q);
            }
        }
        let ks = vec![k as u32; B];
        let temps = vec![t; B];
        let seeds: Vec<u64> = (0..B as u64).map(|b| 0x5EED ^ (b << 32)).collect();
        let mut offsets = vec![0u64; B];
        let mut ids = vec![0u32; B * k];
        let mut hist = [0u64; BUCKETS];
        let mut accepts = 0u64;
        for _ in 0..CALLS {
            for id in ids.iter_mut() {
                *id = sample(&mut g, &q);
            }
            let mut batch = Batch::dense(
                Dims {
                    vocab: VOCAB,
                    k_max: k,
                },
                Drafts { k: &ks, ids: &ids },
                &[],
                Streams {
                    seed: &seeds,
                    offset: &offsets,
                },
            )
            .with_target_logits(Logits {
                values: &logits,
                temperature: &temps,
            });
            if k > 0 {
                batch = batch.with_draft_probs(&draft);
            }
            let (mut accepted, mut tokens) = (vec![0u32; B], vec![0u32; B * rows]);
            let mut o = specula_core::verify::Outputs::new(
                specula_core::verify::AcceptedOut(&mut accepted),
                specula_core::verify::TokensOut(&mut tokens),
            );
            v.verify(Method::Rejection, Check::Cheap, &batch, &mut o)
                .expect("valid batch");
            for b in 0..B {
                hist[bucket[tokens[rows * b] as usize]] += 1;
                accepts += u64::from(accepted[b]);
            }
            specula_core::verify::advance_offsets(&mut offsets);
        }
        let n = (B * CALLS) as f64;
        let chi2: f64 = (0..BUCKETS)
            .map(|b| {
                let e = n * mass[b];
                (hist[b] as f64 - e).powi(2) / e
            })
            .sum();
        // Chi-square critical value, 63 degrees of freedom, α = 10⁻⁶.
        const CHI2_63DOF_1E6: f64 = 131.4;
        println!("T {t}, k {k}: chi-square {chi2:.1} (63 dof), accepted {accepts} vs {overlap:.4}");
        assert!(chi2 < CHI2_63DOF_1E6, "T {t}: chi-square {chi2}");
        if k == 1 {
            let zs = (accepts as f64 / n - overlap) / (overlap * (1.0 - overlap) / n).sqrt();
            assert!(zs.abs() < 4.9, "acceptance z = {zs}");
        } else {
            assert_eq!(accepts, 0);
            assert!(v.totals().drafts > 0, "the k = 1 requests were counted");
        }
    }
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
