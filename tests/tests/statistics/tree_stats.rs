//! Statistical tests of tree verification: rejection sampling on trees is lossless.
//!
//! Run optimised: `cargo test -p specula-tests --profile statistics --test statistics -- tree_stats::
//! --skip gpu_tree_stats`.
//!
//! * Target-only rule (a deterministic top-b drafter, no draft probabilities): over 10⁶ draws
//!   of a 10-node tree, the frequency of **every emitted sequence** (every path of the tree
//!   with every token that can end it) against its exact probability `Π p(y_t | y_<t)` (chi-square).
//!   This also pins the acceptance probabilities: the rule accepts the sibling with token x with
//!   probability exactly `p(x)`.
//! * SpecInfer's multi-step speculative sampling (siblings drawn i.i.d. from the draft): over
//!   10⁶ draws, the emitted sequence continued by the target to full length against the exact
//!   target law of every length-3 sequence (chi-square), and the rank of the accepted root
//!   child against its exact distribution (enumerated over all sibling draws).
//! * The tails at V = 32768 for both rules: the first emitted token, binned, against the exact
//!   target row.
//!
//! `SPECULA_TREE_STATS_BACKEND=kernel-cuda` (or `kernel-hip`) runs the first two tests on the
//! host-executed tree kernel text (`core/kernels/specula_tree.cu`, tests/src/kernel_host.rs)
//! instead of the reference; `kernel_text_gives_the_statistical_batches_bits` checks, in every
//! run, that both macro forms give the reference's bits on these tests' batches.
//!
//! Each check is a chi-square test at α = 0.001 (critical values from the Wilson–Hilferty
//! approximation, which is within 0.5 % of the tabulated values at these degrees of freedom)
//! with fixed seeds: a correct implementation fails a given seed with probability 0.001 per
//! check, 5 checks in this file.

use crate::tree_model::{chi2_critical, contexts, model_row, mss_ranks, shape, top};
use specula::cpu::CpuVerifier;
use specula_core::Counters;
use specula_core::verify::tree::{PathOut, TreeOutputs, links_from_parents, verify_tree_batch};
use specula_core::verify::{AcceptedOut, Check, Method, TokensOut};
use specula_tests::conformance::{Gen, sample};
use specula_tests::kernel_host::{KernelHost, Mode};
use specula_tests::tree::{TreeData, TreeOut};

const K: usize = 8;

/// The chi-square statistic of `observed` against probabilities `expected` (summing to 1) over
/// `n` draws; cells of probability 0 must be empty. Returns (statistic, degrees of freedom).
fn chi2(observed: &[u64], expected: &[f64], n: u64, what: &str) -> (f64, usize) {
    let mut stat = 0.0;
    let mut cells = 0usize;
    for (&o, &p) in observed.iter().zip(expected) {
        if p == 0.0 {
            assert_eq!(o, 0, "{what}: a cell of probability 0 was hit");
            continue;
        }
        let e = p * n as f64;
        assert!(
            e >= 5.0,
            "{what}: expected count {e} too small for chi-square"
        );
        stat += (o as f64 - e).powi(2) / e;
        cells += 1;
    }
    (stat, cells - 1)
}

fn assert_chi2(observed: &[u64], expected: &[f64], n: u64, what: &str) {
    let total: f64 = expected.iter().sum();
    assert!(
        (total - 1.0).abs() < 1e-5,
        "{what}: probabilities sum to {total}"
    );
    let (stat, dof) = chi2(observed, expected, n, what);
    let crit = chi2_critical(dof);
    println!("{what}: chi2 = {stat:.1}, {dof} dof, critical {crit:.1}");
    assert!(stat < crit, "{what}: chi2 {stat} ≥ {crit} ({dof} dof)");
}

/// `B` copies of one tree (offsets `first..first + B`), target rows from the model, draft rows
/// (of each node: the drafter's row at its parent's context) when `draft_salt` is given.
#[allow(clippy::too_many_arguments)]
fn batch_of(
    parents: &[i32],
    tokens: &[u32],
    v: usize,
    target_salt: u64,
    draft_salt: Option<u64>,
    b: usize,
    first: u64,
) -> TreeData {
    let n = parents.len();
    let ctx = contexts(parents, tokens);
    let (mut fc, mut ns) = (vec![0i32; n], vec![0i32; n]);
    links_from_parents(parents, &mut fc, &mut ns).unwrap();
    let target: Vec<f32> = ctx
        .iter()
        .flat_map(|c| model_row(target_salt, c, v))
        .collect();
    let draft: Option<Vec<f32>> = draft_salt.map(|s| {
        (0..n)
            .flat_map(|i| {
                if i == 0 {
                    vec![0.0; v]
                } else {
                    model_row(s, &ctx[parents[i] as usize], v)
                }
            })
            .collect()
    });
    let depth = ctx.iter().map(Vec::len).max().unwrap();
    TreeData {
        vocab: v,
        max_nodes: n,
        max_depth: depth,
        nodes: vec![n as u32; b],
        tokens: tokens.repeat(b),
        first_child: fc.repeat(b),
        next_sibling: ns.repeat(b),
        draft: draft.map(|d| d.repeat(b)),
        target: target.repeat(b),
        temperature: None,
        seed: vec![0x5EED; b],
        offset: (first..first + b as u64).collect(),
        eps: vec![0.09; b],
        delta: vec![0.3; b],
    }
}

/// The backend the statistical tests run on (`SPECULA_TREE_STATS_BACKEND`): `None` for the
/// reference, else the host-executed tree kernel in that macro form.
fn kernel_mode() -> Option<Mode> {
    match std::env::var("SPECULA_TREE_STATS_BACKEND").as_deref() {
        Ok("kernel-cuda") => Some(Mode::Cuda),
        Ok("kernel-hip") => Some(Mode::Hip),
        Ok("reference") | Err(_) => None,
        Ok(other) => {
            panic!("SPECULA_TREE_STATS_BACKEND={other}: reference, kernel-cuda or kernel-hip")
        }
    }
}

/// Verifies `d` on the host-executed tree kernel in `mode` (one warp per block).
fn verify_kernel(mode: Mode, d: &TreeData) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut h = KernelHost::<K>::new(mode, mode.warp_size()).unwrap();
    let mut out = TreeOut::new(d.requests(), d.max_depth);
    h.verify_tree(Method::Rejection, Check::STRICT, d, &mut out)
        .unwrap();
    (out.accepted, out.path, out.tokens)
}

fn verify(d: &TreeData) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    if let Some(mode) = kernel_mode() {
        return verify_kernel(mode, d);
    }
    let w = d.max_depth + 1;
    let (mut acc, mut path, mut tokens) = (
        vec![0; d.requests()],
        vec![0; d.requests() * w],
        vec![0; d.requests() * w],
    );
    let mut c = Counters::<K>::ZERO;
    verify_tree_batch(
        Method::Rejection,
        Check::STRICT,
        &d.view(),
        &mut TreeOutputs::new(
            AcceptedOut(&mut acc),
            PathOut(&mut path),
            TokensOut(&mut tokens),
        ),
        &mut c,
    )
    .unwrap();
    (acc, path, tokens)
}

const B: usize = 1000;
const BATCHES: usize = 1000;

/// Target-only rule on a top-b tree (3 children at the root, 2 below each): every emitted
/// sequence's frequency against its exact probability.
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn target_only_rule_emits_every_sequence_with_its_target_probability() {
    const V: usize = 6;
    let salt = 0x7A6;
    let parents = shape(&[3, 2]);
    let n = parents.len();
    // The drafter proposes the target's own top-b at each node (a deterministic drafter).
    let mut tokens = vec![0u32; n];
    let mut ctx: Vec<Vec<u32>> = vec![vec![]; n];
    for u in 0..n {
        let kids: Vec<usize> = (1..n).filter(|&c| parents[c] == u as i32).collect();
        let best = top(&model_row(salt, &ctx[u], V), kids.len());
        for (&c, &t) in kids.iter().zip(&best) {
            tokens[c] = t;
            let mut x = ctx[u].clone();
            x.push(t);
            ctx[c] = x;
        }
    }
    // Exact law of (stopping node, emitted token): P(path to s) · p_s(t) for t not a child's
    // token of s (a child's token would have been accepted).
    let mut expected = vec![0f64; n * V];
    let mut reach = vec![0f64; n];
    reach[0] = 1.0;
    for u in 0..n {
        let row = model_row(salt, &ctx[u], V);
        let kids: Vec<usize> = (1..n).filter(|&c| parents[c] == u as i32).collect();
        for t in 0..V {
            match kids.iter().find(|&&c| tokens[c] as usize == t) {
                Some(&c) => reach[c] = reach[u] * f64::from(row[t]),
                None => expected[u * V + t] = reach[u] * f64::from(row[t]),
            }
        }
    }
    let mut observed = vec![0u64; n * V];
    let mut accepted_total = 0u64;
    for batch in 0..BATCHES {
        let d = batch_of(&parents, &tokens, V, salt, None, B, (batch * B) as u64);
        let (acc, path, emitted) = verify(&d);
        let w = d.max_depth + 1;
        for r in 0..B {
            let a = acc[r] as usize;
            let s = path[r * w + a] as usize;
            observed[s * V + emitted[r * w + a] as usize] += 1;
            accepted_total += a as u64;
        }
    }
    let draws = (B * BATCHES) as u64;
    let mean = accepted_total as f64 / draws as f64;
    let want_mean: f64 = reach[1..].iter().sum();
    println!("target-only: mean accepted length {mean:.4} (exact {want_mean:.4})");
    assert!(mean > 0.5, "the top-b tree should accept most of the time");
    assert_chi2(
        &observed,
        &expected,
        draws,
        "target-only rule: every emitted sequence",
    );
}

/// SpecInfer's multi-step speculative sampling: siblings drawn i.i.d. from the drafter.
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn multi_step_speculative_sampling_is_lossless() {
    const V: usize = 4;
    const M: usize = 3;
    let (tsalt, dsalt) = (0x5EC1, 0xD4AF);
    let parents = shape(&[M, 2]);
    let n = parents.len();
    let mut g = Gen(0x1FE7);
    let mut seq_observed = vec![0u64; V * V * V];
    let mut rank_observed = vec![0u64; M + 1];
    let mut accepted_total = 0u64;
    for batch in 0..BATCHES {
        // One set of sibling draws per batch would correlate the draws: build each request's
        // tree separately, then verify them as one batch.
        let mut parts = Vec::with_capacity(B);
        for r in 0..B {
            let mut tokens = vec![0u32; n];
            let mut ctx: Vec<Vec<u32>> = vec![vec![]; n];
            for c in 1..n {
                let p = parents[c] as usize;
                tokens[c] = sample(&mut g, &model_row(dsalt, &ctx[p], V));
                let mut x = ctx[p].clone();
                x.push(tokens[c]);
                ctx[c] = x;
            }
            parts.push(batch_of(
                &parents,
                &tokens,
                V,
                tsalt,
                Some(dsalt),
                1,
                (batch * B + r) as u64,
            ));
        }
        let mut d = parts[0].clone();
        for p in &parts[1..] {
            d.nodes.extend(&p.nodes);
            d.tokens.extend(&p.tokens);
            d.first_child.extend(&p.first_child);
            d.next_sibling.extend(&p.next_sibling);
            d.draft.as_mut().unwrap().extend(p.draft.as_ref().unwrap());
            d.target.extend(&p.target);
            d.seed.extend(&p.seed);
            d.offset.extend(&p.offset);
            d.eps.extend(&p.eps);
            d.delta.extend(&p.delta);
        }
        let (acc, path, emitted) = verify(&d);
        let w = d.max_depth + 1;
        for r in 0..B {
            let a = acc[r] as usize;
            accepted_total += a as u64;
            // Continue the emitted sequence with the target to length 3.
            let mut seq: Vec<u32> = emitted[r * w..][..=a].to_vec();
            while seq.len() < 3 {
                let t = sample(&mut g, &model_row(tsalt, &seq, V));
                seq.push(t);
            }
            let cell = (seq[0] as usize * V + seq[1] as usize) * V + seq[2] as usize;
            seq_observed[cell] += 1;
            let rank = if a == 0 {
                M
            } else {
                path[r * w + 1] as usize - 1 // root children are nodes 1..=M in order
            };
            rank_observed[rank] += 1;
        }
    }
    let draws = (B * BATCHES) as u64;
    println!(
        "multi-step: mean accepted length {:.4}",
        accepted_total as f64 / draws as f64
    );
    let mut seq_expected = vec![0f64; V * V * V];
    for (cell, e) in seq_expected.iter_mut().enumerate() {
        let s = [
            (cell / (V * V)) as u32,
            ((cell / V) % V) as u32,
            (cell % V) as u32,
        ];
        *e = (0..3)
            .map(|t| f64::from(model_row(tsalt, &s[..t], V)[s[t] as usize]))
            .product();
    }
    assert_chi2(
        &seq_observed,
        &seq_expected,
        draws,
        "multi-step sampling: every length-3 sequence (emitted, then continued)",
    );
    // The rank of the accepted root child, enumerated over all M-tuples of sibling tokens.
    let p = model_row(tsalt, &[], V);
    let q = model_row(dsalt, &[], V);
    let mut rank_expected = vec![0f64; M + 1];
    for tuple in 0..V.pow(M as u32) {
        let xs: Vec<usize> = (0..M).map(|i| (tuple / V.pow(i as u32)) % V).collect();
        let weight: f64 = xs.iter().map(|&x| f64::from(q[x])).product();
        for (e, r) in rank_expected.iter_mut().zip(mss_ranks(&p, &q, &xs)) {
            *e += weight * r;
        }
    }
    println!("multi-step: root ranks {rank_observed:?}, exact {rank_expected:?}");
    assert_chi2(
        &rank_observed,
        &rank_expected,
        draws,
        "multi-step sampling: accepted root child's rank",
    );
}

/// A peaked row at V = 32768 with a long tail; the first emitted token binned (the top ids
/// alone, the tail in 16 ranges) against the exact row, for the target-only rule (children:
/// ids 1 and 2) and SpecInfer's rule (two siblings drawn from a drafter that differs in the
/// tail).
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn tails_at_v_32k_follow_the_target() {
    const V: usize = 32_768;
    const BINS: usize = 16;
    let verifier = CpuVerifier::<K>::new(0).unwrap();
    let mut p = vec![0f32; V];
    let mut q = vec![0f32; V];
    p[0] = 0.6;
    p[1] = 0.2;
    p[2] = 0.05;
    q[0] = 0.5;
    q[1] = 0.3;
    q[2] = 0.1;
    let (mut pt, mut qt) = (0f64, 0f64);
    for v in 3..V {
        let wp = 1.0 / (1.0 + (v % 97) as f64);
        let wq = 1.0 / (1.0 + (v % 89) as f64);
        p[v] = wp as f32;
        q[v] = wq as f32;
        pt += wp;
        qt += wq;
    }
    for v in 3..V {
        p[v] = (f64::from(p[v]) * 0.15 / pt) as f32;
        q[v] = (f64::from(q[v]) * 0.1 / qt) as f32;
    }
    let bin = |t: usize| {
        if t < 3 {
            t
        } else {
            3 + (t - 3) * BINS / (V - 3)
        }
    };
    let mut expected = vec![0f64; 3 + BINS];
    let total: f64 = p.iter().map(|&x| f64::from(x)).sum();
    for (t, &x) in p.iter().enumerate() {
        expected[bin(t)] += f64::from(x) / total;
    }
    let mut g = Gen(0x7A11);
    for with_draft in [false, true] {
        let start = std::time::Instant::now();
        let draws = if with_draft { 10_000 } else { 30_000 };
        let per = 50usize; // small batches: each holds 3·per rows of V values
        let mut observed = vec![0u64; 3 + BINS];
        for batch in 0..draws / per {
            // Root with two leaf children; the leaves' rows are the same peaked row.
            let parents = [-1i32, 0, 0];
            let (mut fc, mut ns) = ([0i32; 3], [0i32; 3]);
            links_from_parents(&parents, &mut fc, &mut ns).unwrap();
            let mut d = TreeData {
                vocab: V,
                max_nodes: 3,
                max_depth: 1,
                nodes: vec![3; per],
                tokens: Vec::with_capacity(3 * per),
                first_child: fc.repeat(per),
                next_sibling: ns.repeat(per),
                draft: with_draft.then(|| {
                    let mut row = vec![0f32; V];
                    row.extend(&q);
                    row.extend(&q);
                    row.repeat(per)
                }),
                target: p.repeat(3 * per),
                temperature: None,
                seed: vec![0x7A; per],
                offset: (0..per).map(|r| (batch * per + r) as u64).collect(),
                eps: vec![0.09; per],
                delta: vec![0.3; per],
            };
            for _ in 0..per {
                let (a, b) = if with_draft {
                    (sample(&mut g, &q), sample(&mut g, &q))
                } else {
                    (1, 2)
                };
                d.tokens.extend([0, a, b]);
            }
            let w = 2;
            let mut out = specula_tests::tree::TreeOut::new(per, 1);
            verifier
                .verify_tree(Method::Rejection, Check::Cheap, &d.view(), &mut out.view())
                .unwrap();
            for r in 0..per {
                observed[bin(out.tokens[r * w] as usize)] += 1;
            }
        }
        let what = if with_draft {
            "multi-step sampling at V = 32768: first token"
        } else {
            "target-only rule at V = 32768: first token"
        };
        println!("{what}: {observed:?} ({:.1?})", start.elapsed());
        assert_chi2(&observed, &expected, draws as u64, what);
    }
}

/// The host-executed tree kernel, in both macro forms, gives the reference's bits on the
/// batches of the two whole-tree statistical tests (so their chi-square results hold for it).
#[test]
fn kernel_text_gives_the_statistical_batches_bits() {
    let run = |d: &TreeData, what: &str| {
        let want = {
            let w = d.max_depth + 1;
            let (mut acc, mut path, mut tokens) = (
                vec![0; d.requests()],
                vec![0; d.requests() * w],
                vec![0; d.requests() * w],
            );
            let mut c = Counters::<K>::ZERO;
            verify_tree_batch(
                Method::Rejection,
                Check::STRICT,
                &d.view(),
                &mut TreeOutputs::new(
                    AcceptedOut(&mut acc),
                    PathOut(&mut path),
                    TokensOut(&mut tokens),
                ),
                &mut c,
            )
            .unwrap();
            (acc, path, tokens)
        };
        for mode in [Mode::Cuda, Mode::Hip] {
            assert_eq!(verify_kernel(mode, d), want, "{what} {mode:?}");
        }
    };
    // Target-only rule: the top-b tree of the first test.
    const V: usize = 6;
    let salt = 0x7A6;
    let parents = shape(&[3, 2]);
    let n = parents.len();
    let mut tokens = vec![0u32; n];
    let mut ctx: Vec<Vec<u32>> = vec![vec![]; n];
    for u in 0..n {
        let kids: Vec<usize> = (1..n).filter(|&c| parents[c] == u as i32).collect();
        let best = top(&model_row(salt, &ctx[u], V), kids.len());
        for (&c, &t) in kids.iter().zip(&best) {
            tokens[c] = t;
            let mut x = ctx[u].clone();
            x.push(t);
            ctx[c] = x;
        }
    }
    run(
        &batch_of(&parents, &tokens, V, salt, None, 300, 0),
        "target-only",
    );
    // SpecInfer: siblings drawn from the draft, 300 requests.
    let parents = shape(&[3, 2]);
    let mut g = Gen(0x1FE7);
    for r in 0..300u64 {
        let mut tokens = vec![0u32; n];
        let mut ctx: Vec<Vec<u32>> = vec![vec![]; n];
        for c in 1..n {
            let p = parents[c] as usize;
            tokens[c] = sample(&mut g, &model_row(0xD4AF, &ctx[p], 4));
            let mut x = ctx[p].clone();
            x.push(tokens[c]);
            ctx[c] = x;
        }
        run(
            &batch_of(&parents, &tokens, 4, 0x5EC1, Some(0xD4AF), 1, r),
            "specinfer",
        );
    }
}
