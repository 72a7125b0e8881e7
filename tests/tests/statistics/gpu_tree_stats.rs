//! Statistical tests of tree verification on a GPU backend's path: the tree entry of the kernel
//! text (`specula_verify_tree`) launched by the shared orchestration
//! (`GpuVerifier::verify_tree`) over the host driver, many requests per launch. Run optimised:
//! `cargo test -p specula-tests --profile statistics --test statistics -- gpu_tree_stats::`.
//!
//! `tree_stats.rs` shows losslessness on the reference with 10⁶ draws per test; these
//! tests take 250 000 through the host-executed kernel (`DRAWS`: 125 launches of 2 000 requests)
//! on the same kind of trees and test the same laws at the same level (chi-square at α = 0.001,
//! Wilson–Hilferty critical values; cells expected to hold fewer than 5 draws are pooled). Fewer
//! draws than the reference's mean less power: they catch a wrong rule (a mis-weighted sibling,
//! a residual that is not renormalised) and a bias of a few tenths of a percent, not less. (They
//! took 16 000 draws while the shim ran an OS thread per GPU thread; with a fiber per GPU thread
//! 250 000 take about 25 s of one core in release, 10⁶ would take about 95 s.)
//!
//! * target-only rule (a deterministic top-b drafter on a 10-node tree): every emitted sequence
//!   (stopping node and emitted token) against its exact probability `Π p(y_t | y_<t)`;
//! * SpecInfer's rule (three root siblings drawn i.i.d. from a drafter, two below each): the
//!   rank of the accepted root child against its exact law, and the emitted sequence continued by
//!   the target to length 3 against the target's law of every length-3 sequence.
//!
//! With fixed seeds a correct implementation fails a given check with probability 0.001.

use crate::tree_model::{chi2_critical, contexts, model_row, mss_ranks, shape, top};
use specula_core::gpu::GpuVerifier;
use specula_core::verify::tree::links_from_parents;
use specula_core::verify::{Check, Method, Verifier};
use specula_tests::conformance::{Gen, sample};
use specula_tests::host_driver::HostDriver;
use specula_tests::kernel_host::Mode;
use specula_tests::tree::{TreeData, TreeOut};

const K: usize = 8;
/// Requests per launch.
const B: usize = 2_000;
/// Launches per test.
const LAUNCHES: usize = 125;
/// Draws per test.
const DRAWS: usize = B * LAUNCHES;

/// Asserts `observed` (over `n` draws) follows `expected` (probabilities summing to 1; cells of
/// probability 0 must stay empty) at α = 0.001. Cells expected to hold fewer than 5 draws are
/// pooled into one cell (Cochran's rule), which must itself expect at least 5.
fn assert_chi2(observed: &[u64], expected: &[f64], n: u64, what: &str) {
    let total: f64 = expected.iter().sum();
    assert!(
        (total - 1.0).abs() < 1e-5,
        "{what}: probabilities sum to {total}"
    );
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_o, mut pooled_e, mut pooled) = (0u64, 0f64, 0usize);
    for (&o, &p) in observed.iter().zip(expected) {
        if p == 0.0 {
            assert_eq!(o, 0, "{what}: a cell of probability 0 was hit");
            continue;
        }
        let e = p * n as f64;
        if e < 5.0 {
            (pooled_o, pooled_e, pooled) = (pooled_o + o, pooled_e + e, pooled + 1);
            continue;
        }
        stat += (o as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pooled > 0 {
        assert!(
            pooled_e >= 5.0,
            "{what}: pooled cells expect only {pooled_e}"
        );
        stat += (pooled_o as f64 - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    let dof = cells - 1;
    let crit = chi2_critical(dof);
    println!(
        "{what}: chi2 = {stat:.1}, {dof} dof ({pooled} small cells pooled), critical {crit:.1}, {n} draws"
    );
    assert!(stat < crit, "{what}: chi2 {stat} ≥ {crit} ({dof} dof)");
}

/// An empty batch of trees of `parents`' shape at vocabulary `v`.
fn empty(parents: &[i32], v: usize, draft: bool) -> TreeData {
    let depth = contexts(parents, &vec![0; parents.len()])
        .iter()
        .map(Vec::len)
        .max()
        .unwrap();
    TreeData {
        vocab: v,
        max_nodes: parents.len(),
        max_depth: depth,
        nodes: vec![],
        tokens: vec![],
        first_child: vec![],
        next_sibling: vec![],
        draft: draft.then(Vec::new),
        target: vec![],
        temperature: None,
        seed: vec![],
        offset: vec![],
        eps: vec![],
        delta: vec![],
    }
}

/// Appends one request: the tree of `parents` with `tokens`, target rows from the model, draft
/// rows (each node's: the drafter's row at its parent's context) when `d` has them.
fn push(d: &mut TreeData, parents: &[i32], tokens: &[u32], salts: (u64, u64), offset: u64) {
    let (n, v) = (parents.len(), d.vocab);
    let ctx = contexts(parents, tokens);
    let (mut fc, mut ns) = (vec![0i32; n], vec![0i32; n]);
    links_from_parents(parents, &mut fc, &mut ns).unwrap();
    d.nodes.push(n as u32);
    d.tokens.extend(tokens);
    d.first_child.extend(fc);
    d.next_sibling.extend(ns);
    for c in &ctx {
        d.target.extend(model_row(salts.0, c, v));
    }
    if let Some(q) = d.draft.as_mut() {
        q.extend(vec![0.0; v]);
        for i in 1..n {
            q.extend(model_row(salts.1, &ctx[parents[i] as usize], v));
        }
    }
    d.seed.push(0x5EED);
    d.offset.push(offset);
    d.eps.push(0.09);
    d.delta.push(0.3);
}

fn verifier() -> GpuVerifier<HostDriver, K> {
    // One CUDA warp per block: the fewest fibers per request.
    GpuVerifier::new(HostDriver::new(Mode::Cuda, 32, 1)).unwrap()
}

fn verify(v: &mut GpuVerifier<HostDriver, K>, d: &TreeData) -> TreeOut {
    let mut out = TreeOut::new(d.requests(), d.max_depth);
    v.verify_tree(Method::Rejection, Check::STRICT, &d.view(), &mut out.view())
        .unwrap();
    out
}

/// Target-only rule on a top-b tree (3 children at the root, 2 below each), through the GPU
/// path: every emitted sequence's frequency against its exact probability.
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn gpu_target_only_rule_emits_every_sequence_with_its_target_probability() {
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
    let mut v = verifier();
    let mut observed = vec![0u64; n * V];
    let mut accepted_total = 0u64;
    for launch in 0..LAUNCHES {
        let mut d = empty(&parents, V, false);
        for r in 0..B {
            // Offsets never used by tree_stats.rs (which starts at 0): fresh draws.
            push(
                &mut d,
                &parents,
                &tokens,
                (salt, 0),
                (1 << 40) + (launch * B + r) as u64,
            );
        }
        let out = verify(&mut v, &d);
        let w = d.max_depth + 1;
        for r in 0..B {
            let a = out.accepted[r] as usize;
            let s = out.path[r * w + a] as usize;
            observed[s * V + out.tokens[r * w + a] as usize] += 1;
            accepted_total += a as u64;
        }
    }
    let mean = accepted_total as f64 / DRAWS as f64;
    let want_mean: f64 = reach[1..].iter().sum();
    println!("target-only (GPU path): mean accepted length {mean:.4} (exact {want_mean:.4})");
    assert_chi2(
        &observed,
        &expected,
        DRAWS as u64,
        "target-only rule on the GPU path: every emitted sequence",
    );
    // Every launch counted every request: the tree's depth is 2.
    let totals = specula_core::verify::Verifier::totals(&mut v).unwrap();
    assert_eq!(totals.drafts, DRAWS as u64);
    assert_eq!(totals.accepted_tokens, accepted_total);
}

/// SpecInfer's multi-step speculative sampling through the GPU path: siblings drawn i.i.d.
/// from the drafter, each request its own draws.
#[test]
#[cfg_attr(debug_assertions, ignore = "statistical: run with --release")]
fn gpu_multi_step_speculative_sampling_is_lossless() {
    const V: usize = 4;
    const M: usize = 3;
    let (tsalt, dsalt) = (0x5EC1, 0xD4AF);
    let parents = shape(&[M, 2]);
    let n = parents.len();
    let mut g = Gen(0x6_1FE7);
    let mut v = verifier();
    let mut seq_observed = vec![0u64; V * V * V];
    let mut rank_observed = vec![0u64; M + 1];
    for launch in 0..LAUNCHES {
        let mut d = empty(&parents, V, true);
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
            push(
                &mut d,
                &parents,
                &tokens,
                (tsalt, dsalt),
                (1 << 40) + (launch * B + r) as u64,
            );
        }
        let out = verify(&mut v, &d);
        let w = d.max_depth + 1;
        for r in 0..B {
            let a = out.accepted[r] as usize;
            let mut seq: Vec<u32> = out.tokens[r * w..][..=a].to_vec();
            while seq.len() < 3 {
                let t = sample(&mut g, &model_row(tsalt, &seq, V));
                seq.push(t);
            }
            seq_observed[(seq[0] as usize * V + seq[1] as usize) * V + seq[2] as usize] += 1;
            let rank = if a == 0 {
                M
            } else {
                out.path[r * w + 1] as usize - 1 // root children are nodes 1..=M in order
            };
            rank_observed[rank] += 1;
        }
    }
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
        DRAWS as u64,
        "multi-step sampling on the GPU path: every length-3 sequence",
    );
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
    println!("multi-step (GPU path): root ranks {rank_observed:?}, exact {rank_expected:?}");
    assert_chi2(
        &rank_observed,
        &rank_expected,
        DRAWS as u64,
        "multi-step sampling on the GPU path: accepted root child's rank",
    );
}
