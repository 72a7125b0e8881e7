//! Statistical tests of the verification rules: rejection sampling is lossless (every emitted
//! token is distributed as the target row) and accepts with probability Σ_v min(p_target, p_draft).
//!
//! Run in release mode: `cargo test -p specula-tests --release --test verify_stats`.
//!
//! Each check is a test at significance α = 0.001 (chi-square with the tabulated critical value,
//! or a two-sided z-test at |z| < 3.29) over ≥ 10⁶ draws with fixed seeds. The seeds make every
//! run identical; the false-positive rate says how likely a correct implementation would have
//! been to fail on a given seed: 0.001 per check, 12 checks in this file, so about 1.2 % for the
//! file as a whole. A failure is therefore almost surely a real bias, not bad luck.

// Positions index several tables (tallies, target and draft rows) at once.
#![allow(clippy::needless_range_loop)]

use specula_core::Counters;
use specula_core::verify::{Batch, Check, Dims, Drafts, Method, Outputs, Streams, verify_batch};
use specula_tests::conformance::{Gen, sample};

const V: usize = 6;
const KD: usize = 3;
/// Requests per batch.
const B: usize = 1000;
/// Batches: B · BATCHES = 10⁶ draws.
const BATCHES: usize = 1000;

/// Chi-square critical value at α = 0.001 for V − 1 = 5 degrees of freedom.
const CHI2_5DOF_0001: f64 = 20.515;
/// Two-sided normal critical value at α = 0.001.
const Z_0001: f64 = 3.291;

const TARGET: [[f32; V]; KD + 1] = [
    [0.30, 0.25, 0.20, 0.15, 0.07, 0.03],
    [0.05, 0.05, 0.40, 0.10, 0.20, 0.20],
    [0.50, 0.10, 0.10, 0.10, 0.10, 0.10],
    [0.02, 0.08, 0.15, 0.25, 0.25, 0.25],
];
const DRAFT: [[f32; V]; KD] = [
    [0.10, 0.30, 0.10, 0.30, 0.10, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
    [0.45, 0.05, 0.05, 0.05, 0.20, 0.20],
];

/// Per position j: histogram of `tokens[j]` over the draws that reached j, and how many of those
/// accepted the draft at j.
struct Tally {
    hist: [[u64; V]; KD + 1],
    reached: [u64; KD + 1],
    accepted_at: [u64; KD],
}

/// Runs 10⁶ draws of one request shape: drafts sampled from `DRAFT` (or fixed at `fixed`, with
/// a one-hot drafter), each draw with its own offset.
fn draw(seed: u64, with_probs: bool, fixed: [u32; KD]) -> Tally {
    let mut g = Gen(seed ^ 0xD1A7);
    let target: Vec<f32> = (0..B)
        .flat_map(|_| TARGET.iter().flatten().copied())
        .collect();
    let draft: Vec<f32> = (0..B)
        .flat_map(|_| DRAFT.iter().flatten().copied())
        .collect();
    let k = vec![KD as u32; B];
    let seeds = vec![seed; B];
    let mut ids = vec![0u32; B * KD];
    let mut offsets = vec![0u64; B];
    let mut accepted = vec![0u32; B];
    let mut tokens = vec![0u32; B * (KD + 1)];
    let mut counters = Counters::<8>::ZERO;
    let mut t = Tally {
        hist: [[0; V]; KD + 1],
        reached: [0; KD + 1],
        accepted_at: [0; KD],
    };
    for batch in 0..BATCHES {
        for (b, o) in offsets.iter_mut().enumerate() {
            *o = (batch * B + b) as u64;
        }
        for (i, id) in ids.iter_mut().enumerate() {
            *id = if with_probs {
                sample(&mut g, &DRAFT[i % KD])
            } else {
                fixed[i % KD]
            };
        }
        let mut view = Batch::dense(
            Dims {
                vocab: V,
                k_max: KD,
            },
            Drafts { k: &k, ids: &ids },
            &target,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        );
        if with_probs {
            view = view.with_draft_probs(&draft);
        }
        let mut out = Outputs::new(
            specula_core::verify::AcceptedOut(&mut accepted),
            specula_core::verify::TokensOut(&mut tokens),
        );
        verify_batch(
            Method::Rejection,
            Check::STRICT,
            &view,
            &mut out,
            &mut counters,
        )
        .unwrap();
        for b in 0..B {
            let a = accepted[b] as usize;
            for j in 0..=a {
                t.reached[j] += 1;
                t.hist[j][tokens[b * (KD + 1) + j] as usize] += 1;
            }
            for c in &mut t.accepted_at[..a] {
                *c += 1;
            }
        }
    }
    // The counters were updated in the same pass: they agree with the outputs.
    assert_eq!(counters.drafts, (B * BATCHES) as u64);
    assert_eq!(&counters.accepted_per_position[..KD], &t.accepted_at[..]);
    t
}

fn chi_square(hist: &[u64; V], p: &[f32; V]) -> f64 {
    let n: u64 = hist.iter().sum();
    let total: f64 = p.iter().map(|&x| f64::from(x)).sum();
    hist.iter()
        .zip(p)
        .map(|(&o, &q)| {
            let e = n as f64 * f64::from(q) / total;
            assert!(e >= 5.0, "expected count {e} too small for chi-square");
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

fn z_score(successes: u64, n: u64, p: f64) -> f64 {
    let phat = successes as f64 / n as f64;
    (phat - p) / (p * (1.0 - p) / n as f64).sqrt()
}

fn overlap(a: &[f32; V], b: &[f32; V]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x.min(y))).sum()
}

#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn rejection_sampling_is_lossless_and_accepts_at_the_overlap() {
    let t = draw(0x5747_0001, true, [0; KD]);
    for j in 0..=KD {
        assert!(
            t.reached[j] > 300_000,
            "position {j} reached only {} times",
            t.reached[j]
        );
        let x2 = chi_square(&t.hist[j], &TARGET[j]);
        assert!(
            x2 < CHI2_5DOF_0001,
            "position {j}: tokens are not distributed as the target (χ² = {x2:.2}, {:?})",
            t.hist[j]
        );
    }
    for j in 0..KD {
        let p = overlap(&TARGET[j], &DRAFT[j]);
        let z = z_score(t.accepted_at[j], t.reached[j], p);
        assert!(
            z.abs() < Z_0001,
            "position {j}: acceptance {} / {} vs Σ min = {p} (z = {z:.2})",
            t.accepted_at[j],
            t.reached[j]
        );
    }
}

/// A drafter without probabilities (a deterministic draft) is one-hot: emitted tokens still follow
/// the target, and position j is accepted with probability p_target_j(x_j).
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn one_hot_drafter_is_lossless() {
    let fixed = [0u32, 4, 0];
    let t = draw(0x5747_0002, false, fixed);
    for j in 0..=1 {
        let x2 = chi_square(&t.hist[j], &TARGET[j]);
        assert!(
            x2 < CHI2_5DOF_0001,
            "position {j}: χ² = {x2:.2}, {:?}",
            t.hist[j]
        );
    }
    for j in 0..KD {
        let p = f64::from(TARGET[j][fixed[j] as usize]);
        let z = z_score(t.accepted_at[j], t.reached[j], p);
        assert!(z.abs() < Z_0001, "position {j}: z = {z:.2}");
    }
}
