//! Sampling at real vocabulary sizes: the tails of peaked rows, flat rows, and rejection
//! sampling at V = 32k, on every backend.
//!
//! Run optimised: `cargo test -p specula-tests --profile statistics --test statistics -- race_tails::`.
//!
//! The race used to draw `E = −ln(u')` from a 24-bit `u'` that is exactly 1 with probability
//! 2⁻²⁴, giving `E = 0` and an infinite key: about `V·2⁻²⁴` of all sampled tokens (0.76 % at
//! V = 128256, 1.6 % at 262144) were then uniform over the support. A row with mass `1 − 10⁻⁶`
//! on one id shows that as a tail count far above what the row allows; these tests fail on that
//! race (about 30 tail tokens in 4 000 bonus draws where fewer than 4 pass) and pass on the 64-bit
//! one (`core/DETERMINISM.md`, "Race draws": bias below 10⁻¹¹ per draw for V ≤ 2²⁰).
//!
//! Each check compares a count with an exact binomial quantile at α = 10⁻⁹ (tails) or 10⁻⁶
//! per side (flat rows and the V = 32k checks), with fixed seeds.

use specula::cpu::CpuVerifier;
use specula_core::verify::{
    Batch, Check, Dims, Drafts, Method, Outputs, Reference, Streams, Verifier,
};
use specula_tests::conformance::{Gen, sample};
use specula_tests::kernel_host::{KernelHost, Mode};

const K: usize = 8;
/// The vocabulary sizes of Llama 3 (128256), Qwen 2 (151936) and Gemma (262144).
const VOCABS: [usize; 3] = [128_256, 151_936, 262_144];
/// Requests per verification call.
const B: usize = 16;

/// Which sampled token a draw looks at.
#[derive(Clone, Copy, Debug)]
enum Sampler {
    /// Rejection sampling, every draft accepted: the bonus token from the row.
    Bonus,
    /// Rejection sampling, the draft rejected: the recovered token from the residual, which is
    /// the row without the draft id.
    Recovered,
    /// Typical acceptance, the draft rejected: the token sampled from the row.
    Typical,
}

const SAMPLERS: [Sampler; 3] = [Sampler::Bonus, Sampler::Recovered, Sampler::Typical];

/// The row under test: weight 1 on `top` and `tail` spread evenly over every other id, or flat.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Peaked { tail: f64 },
    Flat,
}

fn test_row(vocab: usize, shape: Shape) -> (Vec<f32>, usize) {
    let top = vocab / 3 + 1;
    match shape {
        Shape::Peaked { tail } => {
            let mut row = vec![(tail / (vocab - 1) as f64) as f32; vocab];
            row[top] = 1.0;
            (row, top)
        }
        Shape::Flat => (vec![1.0 / vocab as f32; vocab], top),
    }
}

/// Runs `draws` draws of `sampler` over the row and returns the emitted tokens, plus the row
/// the tokens are distributed as (the test row, with the draft id removed when rejected).
fn run<V: Verifier<K>>(
    v: &mut V,
    vocab: usize,
    shape: Shape,
    sampler: Sampler,
    draws: usize,
    seed: u64,
) -> (Vec<u32>, Vec<f32>) {
    let (row, top) = test_row(vocab, shape);
    // The draft id of a rejected draft: the last id, removed from the row it is rejected from.
    let z = vocab - 1;
    let mut rejected_row = row.clone();
    rejected_row[z] = 0.0;
    let (method, row0, row1, id, dist) = match sampler {
        Sampler::Bonus => {
            // Row 0 gives the draft all its mass: U·1 < 1 always accepts (U < 1).
            let mut one = vec![0f32; vocab];
            one[top] = 1.0;
            (Method::Rejection, one, row.clone(), top as u32, row)
        }
        Sampler::Recovered => (
            Method::Rejection,
            rejected_row.clone(),
            row,
            z as u32,
            rejected_row,
        ),
        Sampler::Typical => (
            Method::Typical,
            rejected_row.clone(),
            row,
            z as u32,
            rejected_row,
        ),
    };
    let mut target = Vec::with_capacity(B * 2 * vocab);
    for _ in 0..B {
        target.extend_from_slice(&row0);
        target.extend_from_slice(&row1);
    }
    let k = [1u32; B];
    let ids = [id; B];
    let seeds: Vec<u64> = (0..B as u64).map(|b| seed ^ (b << 40)).collect();
    let mut offsets = [0u64; B];
    let mut accepted = [0u32; B];
    let mut tokens = [0u32; 2 * B];
    let mut out = Vec::with_capacity(draws);
    let mut call = 0u64;
    while out.len() < draws {
        offsets.fill(call);
        call += 1;
        let batch = Batch::dense(
            Dims { vocab, k_max: 1 },
            Drafts { k: &k, ids: &ids },
            &target,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        );
        let mut o = Outputs::new(
            specula_core::verify::AcceptedOut(&mut accepted),
            specula_core::verify::TokensOut(&mut tokens),
        );
        v.verify(method, Check::Cheap, &batch, &mut o)
            .expect("valid batch");
        for b in 0..B {
            let expect_accept = matches!(sampler, Sampler::Bonus);
            assert_eq!(accepted[b], u32::from(expect_accept), "{sampler:?}");
            out.push(tokens[2 * b + accepted[b] as usize]);
        }
    }
    out.truncate(draws);
    (out, dist)
}

/// ln(n!) for n ≤ `len − 1`.
fn ln_factorials(len: usize) -> Vec<f64> {
    let mut f = vec![0f64; len];
    for i in 1..len {
        f[i] = f[i - 1] + (i as f64).ln();
    }
    f
}

/// The smallest `c` with `P(X ≥ c) ≤ alpha` for `X ~ Binomial(n, p)`, from exact pmf terms.
fn upper_critical(n: usize, p: f64, alpha: f64) -> usize {
    let lf = ln_factorials(n + 1);
    let pmf = |x: usize| {
        (lf[n] - lf[x] - lf[n - x] + x as f64 * p.ln() + (n - x) as f64 * (-p).ln_1p()).exp()
    };
    // P(X ≥ c) = 1 − P(X ≤ c − 1); sum the upper tail from the top for accuracy.
    let mut tail = 0f64;
    let mut c = n + 1;
    while c > 0 {
        let t = tail + pmf(c - 1);
        if t > alpha {
            return c;
        }
        tail = t;
        c -= 1;
    }
    0
}

/// The largest `c` with `P(X ≤ c) ≤ alpha` (so a count at or below `c` is suspiciously low), or
/// `None` when even `P(X = 0) > alpha`.
fn lower_critical(n: usize, p: f64, alpha: f64) -> Option<usize> {
    let lf = ln_factorials(n + 1);
    let pmf = |x: usize| {
        (lf[n] - lf[x] - lf[n - x] + x as f64 * p.ln() + (n - x) as f64 * (-p).ln_1p()).exp()
    };
    let mut cdf = 0f64;
    let mut last = None;
    for x in 0..=n {
        cdf += pmf(x);
        if cdf > alpha {
            return last;
        }
        last = Some(x);
    }
    last
}

/// Mass of `dist` on ids other than `top`, as a fraction of the whole (f64 sums of the f32
/// weights: the race samples in proportion to them).
fn tail_fraction(dist: &[f32], top: usize) -> f64 {
    let total: f64 = dist.iter().map(|&w| f64::from(w)).sum();
    (total - f64::from(dist[top])) / total
}

/// Peaked rows: the number of tokens off the top id stays below the α = 10⁻⁹ binomial bound.
/// Flat rows: the number in the lower half of the vocabulary is inside the two-sided bound.
fn check<V: Verifier<K>>(v: &mut V, vocab: usize, shape: Shape, sampler: Sampler, draws: usize) {
    let seed = 0x7A11 ^ vocab as u64;
    let (tokens, dist) = run(v, vocab, shape, sampler, draws, seed);
    let (_, top) = test_row(vocab, shape);
    assert!(
        tokens
            .iter()
            .all(|&t| (t as usize) < vocab && dist[t as usize] > 0.0)
    );
    match shape {
        Shape::Peaked { tail } => {
            let p = tail_fraction(&dist, top);
            let hits = tokens.iter().filter(|&&t| t as usize != top).count();
            let bound = upper_critical(draws, p, 1e-9);
            println!(
                "V {vocab} {sampler:?} tail {tail:e}: {hits} of {draws} off the top id \
                 (expected {:.4}, bound < {bound}; the old race expected {:.1})",
                draws as f64 * p,
                draws as f64 * vocab as f64 / 16_777_216.0
            );
            assert!(
                hits < bound,
                "{sampler:?} at V = {vocab}, tail {tail:e}: {hits} tail tokens in {draws} draws, \
                 bound {bound}"
            );
        }
        Shape::Flat => {
            let half = vocab / 2;
            let total: f64 = dist.iter().map(|&w| f64::from(w)).sum();
            let p = dist[..half].iter().map(|&w| f64::from(w)).sum::<f64>() / total;
            let hits = tokens.iter().filter(|&&t| (t as usize) < half).count();
            let hi = upper_critical(draws, p, 1e-6);
            let lo = lower_critical(draws, p, 1e-6);
            println!("V {vocab} {sampler:?} flat: {hits} of {draws} in the lower half");
            assert!(
                hits < hi && lo.is_none_or(|lo| hits > lo),
                "{hits} outside ({lo:?}, {hi})"
            );
        }
    }
}

/// Draws per check for the slower backends: enough that the old race would have shown about
/// 6 tail tokens where the bound allows 2 (it passes one such check with probability 6 %, all
/// nine of a test with probability 10⁻¹¹).
fn few_draws(vocab: usize) -> usize {
    (6.0 * 16_777_216.0 / vocab as f64).ceil() as usize
}

#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn cpu_tails_at_real_vocabularies() {
    let mut v = CpuVerifier::<K>::new(0).expect("thread pool");
    for vocab in VOCABS {
        for sampler in SAMPLERS {
            for shape in [
                Shape::Peaked { tail: 1e-6 },
                Shape::Peaked { tail: 1e-9 },
                Shape::Flat,
            ] {
                check(&mut v, vocab, shape, sampler, 4000);
            }
        }
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn reference_tails_at_real_vocabularies() {
    let mut v = Reference::<K>::new();
    for vocab in VOCABS {
        for sampler in SAMPLERS {
            check(
                &mut v,
                vocab,
                Shape::Peaked { tail: 1e-6 },
                sampler,
                few_draws(vocab),
            );
        }
    }
}

fn kernel_tails(mode: Mode) {
    let mut v = KernelHost::<K>::new(mode, 64).expect("block size");
    for vocab in VOCABS {
        for sampler in SAMPLERS {
            check(
                &mut v,
                vocab,
                Shape::Peaked { tail: 1e-6 },
                sampler,
                few_draws(vocab),
            );
        }
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn kernel_text_cuda_form_tails_at_real_vocabularies() {
    kernel_tails(Mode::Cuda);
}

#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn kernel_text_hip_form_tails_at_real_vocabularies() {
    kernel_tails(Mode::Hip);
}

/// Rejection sampling at V = 32000 with realistic rows: the first emitted token follows the
/// target row (chi-square over 64 buckets of equal target mass) and the draft is accepted with
/// probability Σ min(p_target, p_draft) (two-sided binomial bound).
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn rejection_at_32k_is_lossless_and_accepts_at_the_overlap() {
    const VOCAB: usize = 32_000;
    const DRAWS: usize = 200_000;
    const BUCKETS: usize = 64;
    let mut g = Gen(0x32_000);
    let mut t: Vec<f32> = (0..VOCAB)
        .map(|_| {
            let u = g.unit();
            u * u * u * u
        })
        .collect();
    let s: f32 = t.iter().sum();
    t.iter_mut().for_each(|p| *p /= s);
    let mut d: Vec<f32> = t.iter().map(|&p| p * (0.5 + g.unit())).collect();
    let s: f32 = d.iter().sum();
    d.iter_mut().for_each(|p| *p /= s);
    // Buckets of about equal target mass, over ids in order.
    let mut bucket = vec![0usize; VOCAB];
    let mut mass = [0f64; BUCKETS];
    let mut acc = 0f64;
    for v in 0..VOCAB {
        let b = ((acc * BUCKETS as f64) as usize).min(BUCKETS - 1);
        bucket[v] = b;
        mass[b] += f64::from(t[v]);
        acc += f64::from(t[v]);
    }
    let total: f64 = mass.iter().sum();
    let overlap: f64 = t
        .iter()
        .zip(&d)
        .map(|(&a, &b)| f64::from(a.min(b)))
        .sum::<f64>()
        / total;
    let v = CpuVerifier::<K>::new(0).expect("thread pool");
    let mut target = Vec::with_capacity(B * 2 * VOCAB);
    let mut draft = Vec::with_capacity(B * VOCAB);
    for _ in 0..B {
        target.extend_from_slice(&t);
        target.extend_from_slice(&t);
        draft.extend_from_slice(&d);
    }
    let k = [1u32; B];
    let seeds: Vec<u64> = (0..B as u64).map(|b| 0x5EED ^ (b << 32)).collect();
    let mut hist = [0u64; BUCKETS];
    let mut accepts = 0usize;
    let mut offsets = [0u64; B];
    let mut ids = [0u32; B];
    let (mut accepted, mut tokens) = ([0u32; B], [0u32; 2 * B]);
    for call in 0..DRAWS / B {
        offsets.fill(call as u64);
        for id in ids.iter_mut() {
            *id = sample(&mut g, &d);
        }
        let batch = Batch::dense(
            Dims {
                vocab: VOCAB,
                k_max: 1,
            },
            Drafts { k: &k, ids: &ids },
            &target,
            Streams {
                seed: &seeds,
                offset: &offsets,
            },
        )
        .with_draft_probs(&draft);
        let mut o = Outputs::new(
            specula_core::verify::AcceptedOut(&mut accepted),
            specula_core::verify::TokensOut(&mut tokens),
        );
        v.verify(Method::Rejection, Check::Cheap, &batch, &mut o)
            .expect("valid batch");
        for b in 0..B {
            hist[bucket[tokens[2 * b] as usize]] += 1;
            accepts += accepted[b] as usize;
        }
    }
    let n = (DRAWS / B * B) as f64;
    let chi2: f64 = (0..BUCKETS)
        .map(|b| {
            let e = n * mass[b] / total;
            (hist[b] as f64 - e).powi(2) / e
        })
        .sum();
    // Chi-square critical value, 63 degrees of freedom, α = 10⁻⁶.
    const CHI2_63DOF_1E6: f64 = 131.4;
    println!("V 32000: chi-square {chi2:.1} (63 dof), acceptance {accepts} vs {overlap:.5}");
    assert!(chi2 < CHI2_63DOF_1E6, "chi-square {chi2}");
    let draws = DRAWS / B * B;
    let hi = upper_critical(draws, overlap, 1e-6);
    let lo = lower_critical(draws, overlap, 1e-6);
    assert!(
        accepts < hi && lo.is_none_or(|lo| accepts > lo),
        "{accepts} outside ({lo:?}, {hi})"
    );
}

#[test]
fn binomial_bounds_are_exact_quantiles() {
    // n = 10, p = ½: P(X ≥ 10) = 1/1024, P(X ≥ 9) = 11/1024.
    assert_eq!(upper_critical(10, 0.5, 0.002), 10);
    assert_eq!(upper_critical(10, 0.5, 0.0005), 11);
    assert_eq!(lower_critical(10, 0.5, 0.002), Some(0));
    assert_eq!(lower_critical(10, 0.5, 0.0005), None);
    // The tail bound of the peaked rows: λ = n·p = 0.004, so 4 tail tokens are already too many.
    assert_eq!(upper_critical(4000, 1e-6, 1e-9), 4);
}
