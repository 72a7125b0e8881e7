//! Sampling inputs (issue 13), the law: rejection sampling from target logits at V = 32000 after
//! temperature, top-k, top-p and min-p emits tokens that follow softmax(logits / T) restricted to
//! the kept set, and never a filtered-out id. The bit-for-bit checks of the filters are the fast
//! tier's (`it`'s `verify_filters`).

// Request and row indices address several tables at once.
#![allow(clippy::needless_range_loop)]

use specula::cpu::CpuVerifier;
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Filter, Half, HalfLogits, Method, Outputs, Processed, Streams,
    Values, advance_offsets,
};
use specula_tests::conformance::{Gen, K, to_bf16};

/// The exact filtered law in binary64: softmax(l / T), then min-p, top-k, top-p (on the
/// renormalised kept mass), renormalised; ties with a boundary value are kept together, as the
/// rules say (bf16 logits tie often, and tied logits give equal binary64 probabilities).
fn filtered_law(l: &[f32], t: f32, f: Filter) -> Vec<f64> {
    let z: Vec<f64> = l.iter().map(|&x| f64::from(x) / f64::from(t)).collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = z.iter().map(|&x| (x - m).exp()).collect();
    let s: f64 = w.iter().sum();
    let mut p: Vec<f64> = w.iter().map(|&x| x / s).collect();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let mut th = f64::from(f.min_p) * p[order[0]];
    if f.top_k > 0 && (f.top_k as usize) <= p.len() {
        th = th.max(p[order[f.top_k as usize - 1]]);
    }
    if f.top_p < 1.0 {
        let mass: f64 = p.iter().filter(|&&x| x >= th).sum();
        let mut acc = 0.0;
        let mut i = 0;
        while i < order.len() {
            let v = p[order[i]];
            while i < order.len() && p[order[i]] == v {
                acc += v;
                i += 1;
            }
            if acc >= f64::from(f.top_p) * mass {
                th = th.max(v);
                break;
            }
        }
    }
    let kept: f64 = p.iter().filter(|&&x| x >= th).sum();
    for x in &mut p {
        *x = if *x >= th { *x / kept } else { 0.0 };
    }
    p
}

/// Rejection sampling from target logits at V = 32000 (k = 1, a draft that also puts mass on
/// filtered-out ids) for temperature / top-k / top-p / min-p combinations: the kept set equals
/// the binary64 one, no filtered-out id is ever emitted, and the first emitted token follows
/// the filtered law (chi-square over 32 buckets of equal mass, α = 10⁻⁶; plus a z-test on the
/// tail, the least likely 5 % of the kept mass, |z| < 4.9).
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn filtered_logits_are_lossless_at_32k() {
    const VOCAB: usize = 32_000;
    const B: usize = 400;
    const CALLS: usize = 30;
    const BUCKETS: usize = 32;
    /// Chi-square critical value at α = 10⁻⁶ for 31 degrees of freedom.
    const CHI2_31DOF_1E6: f64 = 86.7;
    let mut g = Gen(0xF117_0006);
    let l: Vec<f32> = (0..VOCAB).map(|_| 3.0 * (g.unit() + 1e-6).ln()).collect();
    let lb = to_bf16(&l);
    let mut lw = vec![0f32; VOCAB];
    Values::Half(Half::Bf16(&lb)).widen_into(&mut lw);
    let v = CpuVerifier::<K>::new(0).expect("thread pool");
    let cases = [
        (0.7f32, Filter::NONE.with_top_p(0.9)),
        (1.0, Filter::NONE.with_top_k(50)),
        (1.2, Filter::NONE.with_min_p(0.05)),
        (
            0.8,
            Filter::NONE
                .with_top_k(2000)
                .with_top_p(0.8)
                .with_min_p(0.01),
        ),
    ];
    for (case, &(t, f)) in cases.iter().enumerate() {
        let p = filtered_law(&lw, t, f);
        let ours = Processed::of(Values::Half(Half::Bf16(&lb)), Some(t), f);
        let kept: Vec<bool> = lw.iter().map(|&x| ours.p(x) > 0.0).collect();
        let want: Vec<bool> = p.iter().map(|&x| x > 0.0).collect();
        let differ = kept.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "case {case}: kept set differs from binary64 at {differ} ids"
        );
        let n_kept = kept.iter().filter(|&&k| k).count();
        // The draft: the unfiltered softmax, perturbed, so it also proposes filtered-out ids.
        let mut q: Vec<f32> = {
            let z: Vec<f64> = lw.iter().map(|&x| f64::from(x) / f64::from(t)).collect();
            let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            z.iter()
                .map(|&x| ((x - m).exp() * f64::from(0.5 + g.unit())) as f32)
                .collect()
        };
        let qs: f32 = q.iter().sum();
        q.iter_mut().for_each(|x| *x /= qs);
        // Buckets of equal mass over the ids by decreasing probability; the tail is the last
        // 5 % of the mass.
        let mut order: Vec<usize> = (0..VOCAB).filter(|&i| kept[i]).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let mut bucket = vec![usize::MAX; VOCAB];
        let mut tail = vec![false; VOCAB];
        let mut mass = [0f64; BUCKETS];
        let mut tail_mass = 0f64;
        let mut acc = 0f64;
        for &i in &order {
            let b = ((acc * BUCKETS as f64) as usize).min(BUCKETS - 1);
            bucket[i] = b;
            mass[b] += p[i];
            if acc >= 0.95 {
                tail[i] = true;
                tail_mass += p[i];
            }
            acc += p[i];
        }
        let logits: Vec<u16> = (0..B * 2).flat_map(|_| lb.iter().copied()).collect();
        let draft: Vec<f32> = (0..B).flat_map(|_| q.iter().copied()).collect();
        let ks = vec![1u32; B];
        let temps = vec![t; B];
        let filters = vec![f; B];
        let seeds: Vec<u64> = (0..B as u64).map(|b| 0xF11 ^ (b << 32)).collect();
        let mut offsets = vec![0u64; B];
        let mut ids = vec![0u32; B];
        let mut hist = [0u64; BUCKETS];
        let mut tail_hits = 0u64;
        // Draft ids by inverse CDF (a binary search, not a linear scan per draw).
        let cdf: Vec<f64> = q
            .iter()
            .scan(0f64, |acc, &x| {
                *acc += f64::from(x);
                Some(*acc)
            })
            .collect();
        let total = cdf[VOCAB - 1];
        for _ in 0..CALLS {
            for id in ids.iter_mut() {
                let u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
                *id = cdf.partition_point(|&c| c <= u).min(VOCAB - 1) as u32;
            }
            let batch = Batch::dense(
                Dims {
                    vocab: VOCAB,
                    k_max: 1,
                },
                Drafts { k: &ks, ids: &ids },
                &[],
                Streams {
                    seed: &seeds,
                    offset: &offsets,
                },
            )
            .with_target_logits_half(HalfLogits {
                values: Half::Bf16(&logits),
                temperature: &temps,
            })
            .with_draft_probs(&draft)
            .with_filters(&filters);
            let (mut accepted, mut tokens) = (vec![0u32; B], vec![0u32; B * 2]);
            let mut o = Outputs::new(
                specula_core::verify::AcceptedOut(&mut accepted),
                specula_core::verify::TokensOut(&mut tokens),
            );
            v.verify(Method::Rejection, Check::Cheap, &batch, &mut o)
                .expect("valid batch");
            for b in 0..B {
                let x = tokens[2 * b] as usize;
                assert!(kept[x], "case {case}: emitted filtered-out id {x}");
                hist[bucket[x]] += 1;
                tail_hits += u64::from(tail[x]);
            }
            advance_offsets(&mut offsets);
        }
        let n = (B * CALLS) as f64;
        let chi2: f64 = (0..BUCKETS)
            .map(|b| {
                let e = n * mass[b];
                (hist[b] as f64 - e).powi(2) / e
            })
            .sum();
        let z = (tail_hits as f64 - n * tail_mass) / (n * tail_mass * (1.0 - tail_mass)).sqrt();
        println!("case {case}: T {t}, {f:?}: {n_kept} kept, chi2 {chi2:.1}, tail z {z:.2}");
        assert!(chi2 < CHI2_31DOF_1E6, "case {case}: chi2 {chi2}");
        assert!(z.abs() < 4.9, "case {case}: tail z {z}");
    }
}
