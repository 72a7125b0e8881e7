//! Tree verification on the CPU backend against the chain path, measured in the same run: a
//! 64-node tree (an 8×8 EAGLE-2-style beam: 8 nodes per depth, depth 8) at V = 128256 against a
//! chain of the same depth (k = 8), batch 1 and 8, greedy and rejection sampling (target-only
//! rule for the tree; for the chain, drafts the target accepts in full: each row's argmax, or
//! a drafter whose rows equal the target's), all cores.
//!
//! Printed per point: µs per call (median of the timed calls) for the tree and the chain, the
//! tree/chain ratio, and the read-only baseline: a sum over as many bytes as the rows the tree
//! verifier reads (one per path node, plus the rows of a rejection's residual), on as many
//! threads, started once, in the same run. `read` = verifier time / read-only time: the
//! physical limit of a streaming verifier is 1. `tree acc` / `chain acc`: mean accepted length
//! of the timed inputs (random rows: a figure of the inputs, not of a drafter; the chain's is 8
//! by construction, its cost the most a chain of 8 pays), and µs per emitted token (accepted
//! plus the one sampled after them) of each.
//!
//! `cargo bench -p specula-tests --bench tree_cpu` (under a minute on 2 cores).

use specula::cpu::CpuVerifier;
use specula_core::verify::tree::{Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents};
use specula_core::verify::{Batch, Check, Dims, Drafts, Method, Outputs, Streams};
use specula_tests::bench_read::ReadPool;
use specula_tests::conformance::{Gen, sample};
use std::hint::black_box;
use std::time::{Duration, Instant};

const V: usize = 128_256;
const WIDTH: usize = 8;
const DEPTH: usize = 8;
const NODES: usize = WIDTH * DEPTH + 1;
const K: usize = 8;

/// Median time of `iters` calls of `f` (after one warm-up call).
fn median(iters: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut t: Vec<Duration> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[iters / 2]
}

/// The lowest id of the row's largest value.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// A peaked row: most of the mass on a few ids, the rest spread.
fn row(g: &mut Gen, out: &mut [f32]) {
    let mut s = 0f32;
    for x in out.iter_mut() {
        *x = if g.chance(1, 64) {
            g.unit() * 1e-3
        } else {
            0.0
        };
        s += *x;
    }
    for _ in 0..4 {
        let t = g.below(V);
        out[t] += 2.0;
        s += 2.0;
    }
    out.iter_mut().for_each(|x| *x /= s);
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let verifier = CpuVerifier::<K>::new(0).expect("pool");
    let mut g = Gen(0xBE7C);
    // The beam shape: 8 nodes per depth, each the child of one node of the depth above.
    let mut parents = vec![-1i32];
    for d in 0..DEPTH {
        for i in 0..WIDTH {
            let p = if d == 0 {
                0
            } else {
                1 + (d - 1) * WIDTH + (i * 7 + d) % WIDTH
            };
            parents.push(p as i32);
        }
    }
    let (mut fc, mut ns) = (vec![0i32; NODES], vec![0i32; NODES]);
    links_from_parents(&parents, &mut fc, &mut ns).expect("a tree");
    println!(
        "{:>9} {:>5} {:>6} {:>11} {:>11} {:>10} {:>11} {:>6} {:>9} {:>9} {:>12} {:>12}",
        "method",
        "batch",
        "nodes",
        "tree µs",
        "chain µs",
        "tree/chain",
        "read µs",
        "read",
        "tree acc",
        "chain acc",
        "tree µs/tok",
        "chain µs/tok"
    );
    for method in [Method::Greedy, Method::Rejection] {
        for b in [1usize, 8] {
            let mut target = vec![0f32; b * NODES * V];
            for r in target.chunks_exact_mut(V) {
                row(&mut g, r);
            }
            // Tree tokens: each node's token sampled from its parent's row, so paths accept.
            let mut tokens = vec![0u32; b * NODES];
            for r in 0..b {
                for i in 1..NODES {
                    let p = parents[i] as usize;
                    tokens[r * NODES + i] = sample(&mut g, &target[(r * NODES + p) * V..][..V]);
                }
            }
            let nodes = vec![NODES as u32; b];
            let (fcs, nss) = (fc.repeat(b), ns.repeat(b));
            let seeds: Vec<u64> = (0..b as u64).collect();
            let offsets = vec![0u64; b];
            let tree = TreeBatch::new(
                TreeDims {
                    vocab: V,
                    max_nodes: NODES,
                    max_depth: DEPTH,
                },
                Tree {
                    nodes: &nodes,
                    tokens: &tokens,
                    first_child: &fcs,
                    next_sibling: &nss,
                },
                &target,
                Streams {
                    seed: &seeds,
                    offset: &offsets,
                },
            );
            let (mut acc, mut path, mut emitted) = (
                vec![0u32; b],
                vec![0u32; b * (DEPTH + 1)],
                vec![0u32; b * (DEPTH + 1)],
            );
            let tree_t = median(15, || {
                let mut out = TreeOutputs {
                    accepted: &mut acc,
                    path: &mut path,
                    tokens: &mut emitted,
                };
                verifier
                    .verify_tree(method, Check::Cheap, black_box(&tree), &mut out)
                    .expect("valid");
            });
            // The rows the tree verifier read: every path node's row.
            let mut rows = Vec::new();
            for r in 0..b {
                for j in 0..=acc[r] as usize {
                    rows.push(r * NODES + path[r * (DEPTH + 1) + j] as usize);
                }
            }
            let accepted: f64 = acc.iter().map(|&a| f64::from(a)).sum::<f64>() / b as f64;
            // As many bytes as those rows, on as many threads, started once.
            let reader = ReadPool::new(rows.len() * V * 2, threads);
            let read_t = median(15, || {
                black_box(reader.read(reader.words()));
            });
            // The chain: k = 8 drafts the target accepts in full, so that it reads all of its
            // rows (k + 1 per request) as a chain at its best does. Greedy: each row's argmax
            // (the peaked rows tie four ids; the lowest wins). Rejection: drafts sampled from
            // a drafter whose rows equal the target's (min(1, p / q) = 1 at every position).
            let mut chain_target = vec![0f32; b * (K + 1) * V];
            for r in chain_target.chunks_exact_mut(V) {
                row(&mut g, r);
            }
            let mut ids = vec![0u32; b * K];
            let mut draft = vec![0f32; b * K * V];
            for r in 0..b {
                for j in 0..K {
                    let t = &chain_target[(r * (K + 1) + j) * V..][..V];
                    draft[(r * K + j) * V..][..V].copy_from_slice(t);
                    ids[r * K + j] = match method {
                        Method::Greedy => argmax(t),
                        _ => sample(&mut g, t),
                    };
                }
            }
            let ks = vec![K as u32; b];
            let chain = Batch::dense(
                Dims { vocab: V, k_max: K },
                Drafts { k: &ks, ids: &ids },
                &chain_target,
                Streams {
                    seed: &seeds,
                    offset: &offsets,
                },
            );
            let chain = match method {
                Method::Greedy => chain,
                _ => chain.with_draft_probs(&draft),
            };
            let (mut cacc, mut ctok) = (vec![0u32; b], vec![0u32; b * (K + 1)]);
            let chain_t = median(15, || {
                let mut out = Outputs::new(
                    specula_core::verify::AcceptedOut(&mut cacc),
                    specula_core::verify::TokensOut(&mut ctok),
                );
                verifier
                    .verify(method, Check::Cheap, black_box(&chain), &mut out)
                    .expect("valid");
            });
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let chain_accepted: f64 = cacc.iter().map(|&a| f64::from(a)).sum::<f64>() / b as f64;
            println!(
                "{:>9} {:>5} {:>6} {:>11.1} {:>11.1} {:>10.2} {:>11.1} {:>6.2} {:>9.2} {:>9.2} {:>12.1} {:>12.1}",
                format!("{method:?}").to_lowercase(),
                b,
                NODES - 1,
                us(tree_t),
                us(chain_t),
                tree_t.as_secs_f64() / chain_t.as_secs_f64(),
                us(read_t),
                tree_t.as_secs_f64() / read_t.as_secs_f64(),
                accepted,
                chain_accepted,
                us(tree_t) / (accepted + 1.0),
                us(chain_t) / (chain_accepted + 1.0)
            );
        }
    }
}
