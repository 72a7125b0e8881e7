//! Target logits with per-request temperature (issue 13), the law: rejection sampling from
//! logits at V = 32000 emits tokens that follow softmax(logits / T), and accepts at the overlap
//! of that law with the draft's. The bit-for-bit checks are the fast tier's (`it`'s
//! `verify_logits`).

// Request and row indices address several tables at once.
#![allow(clippy::needless_range_loop)]

use specula::cpu::CpuVerifier;
use specula_core::verify::{Batch, Check, Dims, Drafts, Logits, Method, Streams};
use specula_tests::conformance::{Gen, K, sample};

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
