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
//! A second table, **the inputs engines send** (issue 30): a 16-node tree (a 4×4 beam: 4 nodes
//! per depth, depth 4) from target **probabilities** and from target **logits** (f32, T = 0.8;
//! `bf16` / `f16`: the same logits as bf16 / f16, whose rows the CPU backend widens as its walk
//! reads them),
//! greedy and rejection sampling (target-only rule; `+q`: with draft rows, SpecInfer's rule, each
//! node's draft row its parent's probabilities times 0.7..1.3, renormalised, its token drawn from
//! it), V = 32000 and 128256, batch 1 and 16, two row shapes: **flat** (logits `3·ln u`) and
//! **peaked**, shaped like a language model's output (one id holding p ≈ 0.7 at T over a
//! `2·N(0, 1)` background); the probabilities are the logits' softmax (f64), each node's token
//! drawn from its parent's row. Printed per point: ms per batch; the read-only pass over the rows
//! the verifier must read (every node of the accepted paths, the stopping node included, in
//! full: a softmax reads the whole row) and the ratio to it (`/read`, the strict floor: those
//! rows stay in the cache between calls at batch 1); the read-only pass over the whole input the
//! engine sends (`B·17` target rows, and as many draft rows with `+q`) and the ratio to it
//! (`/input`, issue 30's measure, as `verify_inputs` prints it; its target is ≤ 2 at batch
//! ≥ 16); the mean accepted length; logits against probabilities. Greedy at T = 0.8 is the
//! argmax of the softmax (at T = 0 it is the argmax of the logits, the probability path's cost).
//!
//! `cargo bench -p specula-tests --bench tree_cpu` (a few minutes on 2 cores). A plain argument
//! runs only the points whose `table/shape/V/batch/input/method` contains it (tables `chain`
//! and `inputs`; e.g. `-- inputs/peaked/128256/16/`).

use specula::cpu::CpuVerifier;
use specula_core::verify::tree::{
    PathOut, Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents,
};
use specula_core::verify::{
    AcceptedOut, Batch, Check, Dims, Drafts, Half, Logits, Method, Outputs, Rows, Streams, Target,
    TokensOut,
};
use specula_tests::bench_read::ReadPool;
use specula_tests::bench_step::Step;
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

/// A beam of `width` nodes per depth, `depth` deep, each node the child of one node of the
/// depth above: its parent array and its first-child / next-sibling links.
fn beam(width: usize, depth: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let mut parents = vec![-1i32];
    for d in 0..depth {
        for i in 0..width {
            let p = if d == 0 {
                0
            } else {
                1 + (d - 1) * width + (i * 7 + d) % width
            };
            parents.push(p as i32);
        }
    }
    let n = parents.len();
    let (mut fc, mut ns) = (vec![0i32; n], vec![0i32; n]);
    links_from_parents(&parents, &mut fc, &mut ns).expect("a tree");
    (parents, fc, ns)
}

fn main() {
    // `cargo bench` passes `--bench`: only a plain argument filters.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wanted = |id: &str| filter.as_deref().is_none_or(|f| id.contains(f));
    versus_chain(&wanted);
    inputs(&wanted);
}

/// The first table: the 8×8 tree against the chain (module docs).
fn versus_chain(wanted: &dyn Fn(&str) -> bool) {
    if !["greedy", "rejection"]
        .iter()
        .any(|m| [1, 8].iter().any(|b| wanted(&format!("chain/{b}/{m}"))))
    {
        return;
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let verifier = CpuVerifier::<K>::new(0).expect("pool");
    let mut g = Gen(0xBE7C);
    let (parents, fc, ns) = beam(WIDTH, DEPTH);
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
            let name = format!("{method:?}").to_lowercase();
            if !wanted(&format!("chain/{b}/{name}")) {
                continue;
            }
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
                let mut out = TreeOutputs::new(
                    AcceptedOut(&mut acc),
                    PathOut(&mut path),
                    TokensOut(&mut emitted),
                );
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

/// Nodes of the inputs table's tree: a 4×4 beam plus the root.
const IN_WIDTH: usize = 4;
const IN_DEPTH: usize = 4;
const IN_NODES: usize = IN_WIDTH * IN_DEPTH + 1;
const T: f32 = 0.8;

/// The second table: trees from probabilities and from logits against the read-only pass
/// (module docs).
fn inputs(wanted: &dyn Fn(&str) -> bool) {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let verifier = CpuVerifier::<K>::new(0).expect("pool");
    let mut g = Gen(0x7EE_1A9);
    let (parents, fc, ns) = beam(IN_WIDTH, IN_DEPTH);
    let inputs = ["probs", "logits", "bf16", "f16", "probs+q", "logits+q"];
    let methods = [Method::Greedy, Method::Rejection];
    let mut header = false;
    for shape in ["flat", "peaked"] {
        for vocab in [32_000usize, 128_256] {
            for b in [1usize, 16] {
                let id = |input: &str, m: Method| {
                    format!("inputs/{shape}/{vocab}/{b}/{input}/{m:?}").to_lowercase()
                };
                if !inputs
                    .iter()
                    .any(|i| methods.iter().any(|&m| wanted(&id(i, m))))
                {
                    continue;
                }
                if !header {
                    println!(
                        "\n{:<6} {:>6} {:>5} {:<7} {:<9} {:>9} {:>9} {:>7} {:>9} {:>7} {:>5} {:>8}",
                        "shape",
                        "V",
                        "batch",
                        "input",
                        "method",
                        "ms",
                        "read ms",
                        "/read",
                        "input ms",
                        "/input",
                        "acc",
                        "/probs"
                    );
                    header = true;
                }
                // One row per node: `k + 1 = IN_NODES` rows per request.
                let step = if shape == "flat" {
                    Step::new(&mut g, b, vocab, IN_NODES - 1, T)
                } else {
                    Step::peaked(&mut g, b, vocab, IN_NODES - 1, T)
                };
                let mut tokens = vec![0u32; b * IN_NODES];
                for r in 0..b {
                    for i in 1..IN_NODES {
                        let p = parents[i] as usize;
                        let row = &step.probs[(r * IN_NODES + p) * vocab..][..vocab];
                        tokens[r * IN_NODES + i] = sample(&mut g, row);
                    }
                }
                let nodes = vec![IN_NODES as u32; b];
                let (fcs, nss) = (fc.repeat(b), ns.repeat(b));
                let probs = TreeBatch::new(
                    TreeDims {
                        vocab,
                        max_nodes: IN_NODES,
                        max_depth: IN_DEPTH,
                    },
                    Tree {
                        nodes: &nodes,
                        tokens: &tokens,
                        first_child: &fcs,
                        next_sibling: &nss,
                    },
                    &step.probs,
                    Streams {
                        seed: &step.seed,
                        offset: &step.offset,
                    },
                );
                let logits = probs.with_target_logits(Logits {
                    values: &step.logits,
                    temperature: &step.temps,
                });
                // The same logits as bf16 (the CPU backend widens the rows its walk reads).
                let bf16 = probs.with_target(Target::Logits {
                    rows: Rows::half(Half::Bf16(&step.logits_bf16), vocab),
                    temperature: &step.temps,
                });
                let f16 = probs.with_target(Target::Logits {
                    rows: Rows::half(Half::F16(&step.logits_f16), vocab),
                    temperature: &step.temps,
                });
                // SpecInfer's inputs: node i's draft row its parent's probabilities times
                // 0.7..1.3 (renormalised), its token drawn from that row.
                let with_q = ["probs+q", "logits+q"]
                    .iter()
                    .any(|i| wanted(&id(i, Method::Rejection)));
                let (mut q, mut q_tokens) = (Vec::new(), tokens.clone());
                if with_q {
                    q = vec![0f32; b * IN_NODES * vocab];
                    for r in 0..b {
                        for i in 1..IN_NODES {
                            let p = parents[i] as usize;
                            let parent = &step.probs[(r * IN_NODES + p) * vocab..][..vocab];
                            let row = &mut q[(r * IN_NODES + i) * vocab..][..vocab];
                            for (o, &x) in row.iter_mut().zip(parent) {
                                *o = x * (0.7 + 0.6 * g.unit());
                            }
                            let s: f32 = row.iter().sum();
                            row.iter_mut().for_each(|x| *x /= s);
                            q_tokens[r * IN_NODES + i] = sample(&mut g, row);
                        }
                    }
                }
                let probs_q = TreeBatch::new(
                    TreeDims {
                        vocab,
                        max_nodes: IN_NODES,
                        max_depth: IN_DEPTH,
                    },
                    Tree {
                        tokens: &q_tokens,
                        ..probs.tree
                    },
                    &step.probs,
                    Streams {
                        seed: &step.seed,
                        offset: &step.offset,
                    },
                )
                .with_draft_probs(&q);
                let logits_q = probs_q.with_target_logits(Logits {
                    values: &step.logits,
                    temperature: &step.temps,
                });
                // Sized for the whole target tensor and as many draft rows; the path rows are
                // a prefix of it.
                let tensor = b * IN_NODES * vocab * 2;
                let reader = ReadPool::new(2 * tensor, threads);
                let whole = median(15, || {
                    black_box(reader.read(tensor));
                })
                .as_secs_f64();
                let whole_bf16 = median(15, || {
                    black_box(reader.read(tensor / 2));
                })
                .as_secs_f64();
                let whole_q = median(15, || {
                    black_box(reader.read(2 * tensor));
                })
                .as_secs_f64();
                for method in methods {
                    let mut probs_s = f64::NAN;
                    for (input, batch) in [
                        ("probs", &probs),
                        ("logits", &logits),
                        ("bf16", &bf16),
                        ("f16", &f16),
                        ("probs+q", &probs_q),
                        ("logits+q", &logits_q),
                    ] {
                        let drafts = input.ends_with("+q");
                        if !wanted(&id(input, method)) || (drafts && method == Method::Greedy) {
                            continue;
                        }
                        // Half rows are half the bytes of the f32 ones the reads below assume.
                        let words = if input == "bf16" || input == "f16" {
                            1
                        } else {
                            2
                        };
                        let whole = if drafts {
                            whole_q
                        } else if words == 1 {
                            whole_bf16
                        } else {
                            whole
                        };
                        let (mut acc, mut path, mut emitted) = (
                            vec![0u32; b],
                            vec![0u32; b * (IN_DEPTH + 1)],
                            vec![0u32; b * (IN_DEPTH + 1)],
                        );
                        let s = median(15, || {
                            let mut out = TreeOutputs::new(
                                AcceptedOut(&mut acc),
                                PathOut(&mut path),
                                TokensOut(&mut emitted),
                            );
                            verifier
                                .verify_tree(method, Check::Cheap, black_box(batch), &mut out)
                                .expect("valid");
                        })
                        .as_secs_f64();
                        // Every path node's row, the stopping node's included.
                        let rows: usize = acc.iter().map(|&a| a as usize + 1).sum();
                        let read = median(15, || {
                            black_box(reader.read(rows * vocab * words));
                        })
                        .as_secs_f64();
                        if input.starts_with("probs") {
                            probs_s = s;
                        }
                        let mean_acc = (rows - b) as f64 / b as f64;
                        println!(
                            "{:<6} {:>6} {:>5} {:<7} {:<9} {:>9.3} {:>9.3} {:>7.2} {:>9.3} {:>7.2} {:>5.2} {:>8.2}",
                            shape,
                            vocab,
                            b,
                            input,
                            format!("{method:?}").to_lowercase(),
                            s * 1e3,
                            read * 1e3,
                            s / read,
                            whole * 1e3,
                            s / whole,
                            mean_acc,
                            s / probs_s
                        );
                    }
                }
            }
        }
    }
}
