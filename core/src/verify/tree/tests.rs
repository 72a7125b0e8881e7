extern crate std;
use super::*;
use crate::error_kind::HasKind;
use crate::verify::{
    AcceptedOut, Batch, Dims, Drafts, Half, Outputs, RaceRng, Softmax, TokensOut, verify_batch,
};

fn chain_links(k: usize) -> ([i32; 8], [i32; 8]) {
    let mut fc = [NO_NODE; 8];
    for (i, f) in fc.iter_mut().enumerate().take(k) {
        *f = i as i32 + 1;
    }
    (fc, [NO_NODE; 8])
}

#[test]
fn a_chain_shaped_tree_gives_the_chain_bits() {
    // k = 3 drafts, V = 5, rows of varied shape; every method, with and without draft probs.
    let v = 5;
    let k = 3;
    let target: std::vec::Vec<f32> = (0..(k + 1) * v)
        .map(|i| ((i * 7 + 3) % 11) as f32 / 10.0)
        .collect();
    let norm = |rows: &[f32]| -> std::vec::Vec<f32> {
        rows.chunks(v)
            .flat_map(|r| {
                let s: f32 = r.iter().sum();
                r.iter().map(move |x| x / s)
            })
            .collect()
    };
    let target = norm(&target);
    let draft: std::vec::Vec<f32> = norm(
        &(0..k * v)
            .map(|i| ((i * 5 + 1) % 7) as f32)
            .collect::<std::vec::Vec<_>>(),
    );
    let ids = [2u32, 0, 4];
    let (fc, ns) = chain_links(k);
    let mut tokens = [0u32; 4];
    tokens[1..].copy_from_slice(&ids);
    // Tree draft rows: node i ≥ 1 holds the chain's row i − 1.
    let mut tree_draft = std::vec![0f32; (k + 1) * v];
    tree_draft[v..].copy_from_slice(&draft);
    // Logits whose softmax is near the rows (a different rounding: a separate check).
    let logits: std::vec::Vec<f32> = target.iter().map(|&p| (p + 0.01).ln()).collect();
    let seeds = if cfg!(miri) { 3 } else { 100u64 };
    // Without a filter, and filters that cut some of the drafted ids (V = 5).
    let filters = [
        None,
        Some(Filter::NONE.with_top_k(2)),
        Some(Filter::NONE.with_top_p(0.6)),
        Some(Filter::NONE.with_min_p(0.3)),
        Some(Filter::NONE.with_top_k(4).with_top_p(0.8).with_min_p(0.1)),
    ];
    for (seed, filter) in (0..seeds).flat_map(|s| filters.map(|f| (s, f))) {
        for method in [Method::Rejection, Method::Greedy, Method::Typical] {
            for (with_draft, temperature) in [
                (false, None),
                (true, None),
                (false, Some(0.7f32)),
                (true, Some(1.3)),
                (true, Some(0.0)),
            ] {
                let temps = [temperature.unwrap_or(0.0)];
                let streams = Streams {
                    seed: &[seed],
                    offset: &[seed * 3],
                };
                let mut chain = Batch::dense(
                    Dims { vocab: v, k_max: k },
                    Drafts { k: &[3], ids: &ids },
                    &target,
                    streams,
                );
                let mut tree = TreeBatch::new(
                    TreeDims {
                        vocab: v,
                        max_nodes: k + 1,
                        max_depth: k,
                    },
                    Tree {
                        nodes: &[4],
                        tokens: &tokens,
                        first_child: &fc[..4],
                        next_sibling: &ns[..4],
                    },
                    &target,
                    streams,
                );
                if with_draft {
                    chain = chain.with_draft_probs(&draft);
                    tree = tree.with_draft_probs(&tree_draft);
                }
                if temperature.is_some() {
                    let l = Logits {
                        values: &logits,
                        temperature: &temps,
                    };
                    chain = chain.with_target_logits(l);
                    tree = tree.with_target_logits(l);
                }
                let f = filter.map(|f| [f]);
                if let Some(f) = &f {
                    chain = chain.with_filters(f);
                    tree = tree.with_filters(f);
                }
                let (mut a1, mut t1) = ([0u32; 1], [0u32; 4]);
                let mut c1 = Counters::<4>::ZERO;
                verify_batch(
                    method,
                    Check::STRICT,
                    &chain,
                    &mut Outputs::new(
                        crate::verify::AcceptedOut(&mut a1),
                        crate::verify::TokensOut(&mut t1),
                    ),
                    &mut c1,
                )
                .unwrap();
                let (mut a2, mut p2, mut t2) = ([0u32; 1], [0u32; 4], [0u32; 4]);
                let mut c2 = Counters::<4>::ZERO;
                verify_tree_batch(
                    method,
                    Check::STRICT,
                    &tree,
                    &mut TreeOutputs::new(
                        AcceptedOut(&mut a2),
                        PathOut(&mut p2),
                        TokensOut(&mut t2),
                    ),
                    &mut c2,
                )
                .unwrap();
                assert_eq!(
                    (a1, t1),
                    (a2, t2),
                    "{method:?} {seed} {with_draft} {temperature:?} {filter:?}"
                );
                // The chain fields are the chain's; the tree fields count one 3-node tree.
                assert_eq!((c2.tree_drafts, c2.tree_draft_tokens), (1, 3));
                c1.tree_drafts = 1;
                c1.tree_draft_tokens = 3;
                assert_eq!(c1, c2);
                let n = a2[0] as usize;
                assert!(p2[..=n].iter().enumerate().all(|(j, &p)| p == j as u32));
                assert!(p2[n + 1..].iter().all(|&p| p == SENTINEL));
            }
        }
    }
}

/// Root (node 0) with three children, tokens `kid_tokens`; node 1 has two children
/// (tokens 0 and 1). V = 4. Rows: `rows[i]` for node i (6 nodes).
struct Small {
    tokens: [u32; 6],
    fc: [i32; 6],
    ns: [i32; 6],
    target: std::vec::Vec<f32>,
    draft: std::vec::Vec<f32>,
}

const ROOT: [f32; 4] = [0.4, 0.3, 0.2, 0.1];
const Q: [f32; 4] = [0.1, 0.2, 0.3, 0.4];

fn small(kid_tokens: [u32; 3]) -> Small {
    let (mut fc, mut ns) = ([0i32; 6], [0i32; 6]);
    links_from_parents(&[-1, 0, 0, 0, 1, 1], &mut fc, &mut ns).unwrap();
    let mut target = std::vec::Vec::new();
    target.extend(ROOT);
    target.extend([0.25f32, 0.5, 0.125, 0.125]); // node 1
    for _ in 2..6 {
        target.extend([0.0f32, 0.0, 0.0, 1.0]);
    }
    let mut draft = std::vec![0f32; 4];
    for _ in 1..6 {
        draft.extend(Q);
    }
    Small {
        tokens: [0, kid_tokens[0], kid_tokens[1], kid_tokens[2], 0, 1],
        fc,
        ns,
        target,
        draft,
    }
}

/// Verifies `n` requests of `s` (offsets `0..n`) and returns (accepted, path, tokens) per
/// request.
/// (accepted, path, tokens) of one request.
type Res = (u32, [u32; 3], [u32; 3]);

fn run_small(s: &Small, method: Method, with_draft: bool, n: usize) -> std::vec::Vec<Res> {
    let offsets: std::vec::Vec<u64> = (0..n as u64).collect();
    let mut out = std::vec::Vec::new();
    for &off in &offsets {
        let off = [off];
        let mut batch = TreeBatch::new(
            TreeDims {
                vocab: 4,
                max_nodes: 6,
                max_depth: 2,
            },
            Tree {
                nodes: &[6],
                tokens: &s.tokens,
                first_child: &s.fc,
                next_sibling: &s.ns,
            },
            &s.target,
            Streams {
                seed: &[9],
                offset: &off,
            },
        );
        if with_draft {
            batch = batch.with_draft_probs(&s.draft);
        }
        let (mut a, mut p, mut t) = ([0u32; 1], [0u32; 3], [0u32; 3]);
        let mut c = Counters::<4>::ZERO;
        verify_tree_batch(
            method,
            Check::STRICT,
            &batch,
            &mut TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t)),
            &mut c,
        )
        .unwrap();
        assert_eq!(c.drafts, 1);
        assert_eq!(c.draft_tokens, 2);
        assert_eq!(c.accepted_tokens, u64::from(a[0]));
        out.push((a[0], p, t));
    }
    out
}

/// `|observed − n·p| ≤ 5σ + 1`.
fn close(observed: usize, n: usize, p: f64) -> bool {
    let e = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (observed as f64 - e).abs() <= 5.0 * sd + 1.0
}

#[test]
#[cfg_attr(miri, ignore)] // 20 000 verifications
fn target_only_rule_accepts_each_sibling_with_its_target_mass() {
    // Children tokens 2, 1, 2 (a duplicate): P(node 2, token 2) = 0.2, P(node 1, token 1)
    // = 0.3, the duplicate never; the rest (0.5) is the residual: tokens 0 and 3 in
    // proportion 0.4 : 0.1.
    let s = small([2, 1, 2]);
    let n = 20_000;
    let res = run_small(&s, Method::Rejection, false, n);
    let count = |f: &dyn Fn(&Res) -> bool| res.iter().filter(|r| f(r)).count();
    let at1 = count(&|r| r.0 >= 1 && r.1[1] == 1);
    let at2 = count(&|r| r.0 >= 1 && r.1[1] == 2);
    let at3 = count(&|r| r.0 >= 1 && r.1[1] == 3);
    let t0 = count(&|r| r.0 == 0 && r.2[0] == 0);
    let t3 = count(&|r| r.0 == 0 && r.2[0] == 3);
    assert_eq!(at3, 0, "a duplicated token is never accepted twice");
    assert_eq!(count(&|r| r.0 == 0 && (r.2[0] == 1 || r.2[0] == 2)), 0);
    assert!(close(at1, n, 0.2), "{at1}");
    assert!(close(at2, n, 0.3), "{at2}");
    assert!(close(t0, n, 0.4), "{t0}");
    assert!(close(t3, n, 0.1), "{t3}");
    // Below node 1 (target [0.25, 0.5, ...], children tokens 0 and 1): depth 2 w.p. 0.75.
    let deep = count(&|r| r.0 == 2);
    assert!(close(deep, n, 0.2 * 0.75), "{deep}");
    for r in &res {
        assert_eq!(r.1[0], 0);
        if r.0 == 2 {
            assert_eq!(r.1[1], 1);
            assert!(r.1[2] == 4 || r.1[2] == 5);
            assert_eq!(r.2[2], 3, "nodes 4 and 5 are one-hot at token 3");
        }
    }
}

#[test]
#[cfg_attr(miri, ignore)] // 20 000 verifications
fn multi_step_sampling_follows_specinfer() {
    // Siblings tokens 0, 1, 3 with the same draft row Q for each. Exact law of the accepted
    // rank: rank 0 (token 0): min(1, 0.4/0.1) = 1. Use tokens 3, 2, 0 instead to exercise
    // the residuals: p = ROOT, q = Q.
    //   r0 (token 3): a0 = min(1, 0.1/0.4) = 0.25.
    //   p1 = norm(max(0, p − q)) = norm([0.3, 0.1, 0, 0]) = [0.75, 0.25, 0, 0].
    //   r1 (token 2): a1 = 0 (p1(2) = 0).
    //   p2 = norm(max(0, p1 − q)) = norm([0.65, 0.05, 0, 0]) = [0.9286, 0.0714, 0, 0].
    //   r2 (token 0): a2 = min(1, 0.9286/0.1) = 1.
    // So ranks: 0.25, 0, 0.75, none 0; and the emitted first token: 3 w.p. 0.25, 0 w.p. 0.75.
    let s = small([3, 2, 0]);
    let n = 20_000;
    let res = run_small(&s, Method::Rejection, true, n);
    let rank = |node: u32| res.iter().filter(|r| r.0 >= 1 && r.1[1] == node).count();
    assert!(close(rank(1), n, 0.25), "{}", rank(1));
    assert_eq!(rank(2), 0);
    assert!(close(rank(3), n, 0.75), "{}", rank(3));
    assert_eq!(res.iter().filter(|r| r.0 == 0).count(), 0);
    // Tokens 0, 1, 3: r0 (token 0) a0 = 1: always rank 0.
    let s = small([0, 1, 3]);
    let res = run_small(&s, Method::Rejection, true, 200);
    assert!(res.iter().all(|r| r.0 >= 1 && r.1[1] == 1));
    // Tokens 3, 3, 1: a0 = 0.25; p1 = [0.75, 0.25, 0, 0]: a1 (token 3) = 0;
    // p2 = [0.9286, 0.0714, 0, 0]: a2 (token 1) = min(1, 0.0714/0.2) = 0.357;
    // none: 0.75·0.643 = 0.482, then the residual norm(max(0, p2 − q)) = [1, 0, 0, 0].
    let s = small([3, 3, 1]);
    let res = run_small(&s, Method::Rejection, true, n);
    let p2_1 = 0.05 / 0.7;
    let a2 = p2_1 / 0.2;
    let none = res.iter().filter(|r| r.0 == 0).count();
    assert!(close(none, n, 0.75 * (1.0 - a2)), "{none}");
    assert!(res.iter().filter(|r| r.0 == 0).all(|r| r.2[0] == 0));
    let r2 = res.iter().filter(|r| r.0 >= 1 && r.1[1] == 3).count();
    assert!(close(r2, n, 0.75 * a2), "{r2}");
    assert_eq!(res.iter().filter(|r| r.0 >= 1 && r.1[1] == 2).count(), 0);
}

#[test]
fn typical_takes_the_deepest_passing_path_first_in_pre_order() {
    // Root row: tokens 1 and 2 pass (0.3, 0.2 > thr), 3 does not (0.1 ≤ eps 0.15 with
    // δ large). Children: node 1 (token 2), node 2 (token 1), node 3 (token 3); node 1 has
    // children 4 (token 0), 5 (token 1); node 4's row... depth 2 via node 1 → 4 or 5.
    let s = small([2, 1, 3]);
    let eps = [0.15f32];
    let delta = [10.0f32];
    let batch = TreeBatch::new(
        TreeDims {
            vocab: 4,
            max_nodes: 6,
            max_depth: 2,
        },
        Tree {
            nodes: &[6],
            tokens: &s.tokens,
            first_child: &s.fc,
            next_sibling: &s.ns,
        },
        &s.target,
        Streams {
            seed: &[1],
            offset: &[2],
        },
    )
    .with_typical(&eps, &delta);
    let mut c = Counters::<4>::ZERO;
    let run = |batch: &TreeBatch<'_>, c: &mut Counters<4>| {
        let (mut a, mut p, mut t) = ([0u32; 1], [0u32; 3], [0u32; 3]);
        let mut out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t));
        verify_tree_batch(Method::Typical, Check::STRICT, batch, &mut out, c).unwrap();
        (a, p, t)
    };
    let (a, p, t) = run(&batch, &mut c);
    // Node 1's row [0.25, 0.5, 0.125, 0.125]: token 0 (node 4) 0.25 > 0.15 passes, token 1
    // (node 5) 0.5 passes: the first in pre-order, node 4, wins the tie at depth 2.
    assert_eq!(a[0], 2);
    assert_eq!(p, [0, 1, 4]);
    assert_eq!(t, [2, 0, 3], "node 4's row is one-hot at token 3");
    assert_eq!(c.accepted_per_position, [1, 1, 0, 0]);
    assert_eq!(c.drafted_per_position, [1, 1, 0, 0]);
    // A higher threshold: only node 2 (token 1, 0.3) passes at the root... and node 1
    // (token 2, 0.2) does not; node 2 is a leaf.
    let eps = [0.25f32];
    let higher = TreeBatch {
        eps: Some(&eps),
        ..batch
    };
    let (a, p, t) = run(&higher, &mut c);
    assert_eq!((a[0], p[1], t[0]), (1, 2, 1));
    assert_eq!(t[1], 3);
    assert_eq!(p[2], SENTINEL);
    // Nothing passes (eps 1): the root's row is sampled.
    let eps = [1.0f32];
    let none = TreeBatch {
        eps: Some(&eps),
        ..batch
    };
    let (a, p, t) = run(&none, &mut c);
    assert_eq!(a[0], 0);
    assert_eq!(p[1], SENTINEL);
    assert!(t[0] < 4);
}

#[test]
fn a_root_alone_emits_its_token_and_is_not_counted() {
    // Request 0: the root alone (depth 0); request 1: the small tree (depth 2, 5 nodes).
    let s = small([0, 1, 0]);
    let mut tokens = [0u32; 12];
    let (mut fc, mut ns) = ([-1i32; 12], [-1i32; 12]);
    tokens[6..].copy_from_slice(&s.tokens);
    fc[6..].copy_from_slice(&s.fc);
    ns[6..].copy_from_slice(&s.ns);
    let mut target = std::vec![0f32; 24];
    target[..4].copy_from_slice(&ROOT);
    target.extend_from_slice(&s.target);
    let batch = TreeBatch::new(
        TreeDims {
            vocab: 4,
            max_nodes: 6,
            max_depth: 2,
        },
        Tree {
            nodes: &[1, 6],
            tokens: &tokens,
            first_child: &fc,
            next_sibling: &ns,
        },
        &target,
        Streams {
            seed: &[9, 9],
            offset: &[0, 0],
        },
    );
    let (mut a, mut p, mut t) = ([9u32; 2], [9u32; 6], [9u32; 6]);
    let mut c = Counters::<4>::ZERO;
    verify_tree_batch(
        Method::Greedy,
        Check::STRICT,
        &batch,
        &mut TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t)),
        &mut c,
    )
    .unwrap();
    assert_eq!(a[0], 0);
    assert_eq!(p[..3], [0, SENTINEL, SENTINEL]);
    assert_eq!(
        t[..3],
        [0, SENTINEL, SENTINEL],
        "the root's argmax (token 0)"
    );
    // Only request 1 is counted: one tree of depth 2 with 5 draft nodes.
    assert_eq!((c.drafts, c.draft_tokens), (1, 2));
    assert_eq!((c.tree_drafts, c.tree_draft_tokens), (1, 5));
    assert_eq!(c.emitted_tokens, u64::from(a[1]) + 1);
}

#[test]
fn greedy_takes_the_first_matching_sibling() {
    // Root argmax is token 0 (0.4): node 3 holds token 0 in [2, 1, 0]; with [0, 1, 0] the
    // first (node 1) wins; node 1's argmax is 1 (node 5); nodes 4, 5 are leaves.
    for (kids, want_path, want_tokens) in [
        ([2u32, 1, 0], [0u32, 3, SENTINEL], [0u32, 3, SENTINEL]),
        ([0, 1, 0], [0, 1, 5], [0, 1, 3]),
        ([3, 2, 1], [0, SENTINEL, SENTINEL], [0, SENTINEL, SENTINEL]),
    ] {
        let s = small(kids);
        let res = run_small(&s, Method::Greedy, false, 1);
        assert_eq!((res[0].1, res[0].2), (want_path, want_tokens), "{kids:?}");
    }
}

#[test]
fn greedy_on_softmax_rows_breaks_ties_to_the_lowest_id() {
    // Root logits with a tie between ids 1 and 2 (the same logit, so the same p); the
    // children hold tokens 2 then 1: the argmax is id 1, found at the second child.
    let fc = [1, NO_NODE, NO_NODE];
    let ns = [NO_NODE, 2, NO_NODE];
    let logits = [
        0.0f32, 2.0, 2.0, /* node 1 */ 0.0, 0.0, 0.0, /* node 2 */ 5.0, 0.0, 1.0,
    ];
    for t in [0.5f32, 1.0] {
        let temps = [t];
        let batch = TreeBatch::new(
            TreeDims {
                vocab: 3,
                max_nodes: 3,
                max_depth: 1,
            },
            Tree {
                nodes: &[3],
                tokens: &[0, 2, 1],
                first_child: &fc,
                next_sibling: &ns,
            },
            &[],
            Streams {
                seed: &[3],
                offset: &[4],
            },
        )
        .with_target_logits(Logits {
            values: &logits,
            temperature: &temps,
        });
        let (mut a, mut p, mut tk) = ([0u32; 1], [0u32; 2], [0u32; 2]);
        let mut c = Counters::<4>::ZERO;
        let mut out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut tk));
        verify_tree_batch(Method::Greedy, Check::STRICT, &batch, &mut out, &mut c).unwrap();
        // Node 2's softmax argmax is id 0: the bonus.
        assert_eq!((a, p, tk), ([1], [0, 2], [1, 0]), "T = {t}");
    }
}

#[test]
fn logits_give_the_bits_of_their_softmax_rows() {
    // Every rule on the softmax rows computed on the fly (logits) against the same rows
    // materialised as probabilities: the same bits (the plain loops against `ScalarOps`).
    let t = 0.8f32;
    let logits_rows: std::vec::Vec<f32> = (0..6 * 4)
        .map(|i| ((i * 5 + 2) % 9) as f32 * 0.7 - 2.0)
        .collect();
    let mut probs = std::vec::Vec::new();
    for row in logits_rows.chunks(4) {
        let sm = Softmax::of(row, t);
        probs.extend(row.iter().map(|&l| sm.p(l)));
    }
    let draft: std::vec::Vec<f32> = (0..6).flat_map(|_| Q).collect();
    let temps = [t];
    let offsets = if cfg!(miri) { 4u64 } else { 300 };
    for kids in [[2u32, 1, 3], [0, 0, 1], [3, 2, 1], [1, 3, 3]] {
        let s = small(kids);
        for method in [Method::Rejection, Method::Greedy, Method::Typical] {
            for with_draft in [false, true] {
                for off in 0..offsets {
                    let offset = [off];
                    let base = TreeBatch::new(
                        TreeDims {
                            vocab: 4,
                            max_nodes: 6,
                            max_depth: 2,
                        },
                        Tree {
                            nodes: &[6],
                            tokens: &s.tokens,
                            first_child: &s.fc,
                            next_sibling: &s.ns,
                        },
                        &probs,
                        Streams {
                            seed: &[11],
                            offset: &offset,
                        },
                    );
                    let base = if with_draft {
                        base.with_draft_probs(&draft)
                    } else {
                        base
                    };
                    // Two offsets in three, typical acceptance's threshold is `δ·e^(−H)`: the
                    // row's entropy decides (δ = 0.45 passes the root's and node 1's tokens of
                    // p ≈ 0.29 only with their true entropies, 0.67 and 0.74).
                    let base = match off % 3 {
                        1 => base.with_typical(&[1.0], &[0.6]),
                        2 => base.with_typical(&[1.0], &[0.45]),
                        _ => base,
                    };
                    let soft = base.with_target_logits(Logits {
                        values: &logits_rows,
                        temperature: &temps,
                    });
                    let mut results = [(0u32, [0u32; 3], [0u32; 3]); 2];
                    for (r, batch) in results.iter_mut().zip([base, soft]) {
                        let mut c = Counters::<4>::ZERO;
                        verify_tree_batch(
                            method,
                            Check::Cheap,
                            &batch,
                            &mut TreeOutputs::new(
                                AcceptedOut(core::slice::from_mut(&mut r.0)),
                                PathOut(&mut r.1),
                                TokensOut(&mut r.2),
                            ),
                            &mut c,
                        )
                        .unwrap();
                    }
                    assert_eq!(
                        results[0], results[1],
                        "{kids:?} {method:?} {with_draft} {off}"
                    );
                }
            }
        }
    }
}

/// [`RowOps::softmax_passes`] decides a node's first child as the node's own test would: ops
/// whose hook answers with the exact `p` give the plain ops' bits (and the walk asks them:
/// they decide some nodes), ops whose hook passes every first child change the outcome (the
/// walk reads the answer), with and without draft rows.
#[test]
fn the_softmax_hook_decides_first_children_as_their_test() {
    struct Hook {
        lie: bool,
        decided: core::cell::Cell<u32>,
    }
    impl RowOps for Hook {
        fn argmax(&self, row: &[f32]) -> u32 {
            ScalarOps.argmax(row)
        }
        fn entropy(&self, row: &[f32]) -> f32 {
            ScalarOps.entropy(row)
        }
        fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
            ScalarOps.race(rng, row)
        }
        fn race_residual(
            &self,
            rng: RaceRng,
            target: &[f32],
            draft: Option<&[f32]>,
            token: u32,
        ) -> Option<u32> {
            ScalarOps.race_residual(rng, target, draft, token)
        }
        fn softmax_passes(
            &self,
            row: &[f32],
            t: f32,
            x: usize,
            test: &mut dyn FnMut(f32) -> bool,
        ) -> bool {
            let p = if self.lie {
                1.0
            } else {
                Softmax::of(row, t).p(row[x])
            };
            let passed = test(p);
            self.decided.set(self.decided.get() + u32::from(passed));
            passed
        }
    }
    let t = 0.8f32;
    let logits: std::vec::Vec<f32> = (0..6 * 4)
        .map(|i| ((i * 5 + 2) % 9) as f32 * 0.7 - 2.0)
        .collect();
    let draft: std::vec::Vec<f32> = (0..6).flat_map(|_| Q).collect();
    let temps = [t];
    let (exact, lying) = (
        Hook {
            lie: false,
            decided: 0.into(),
        },
        Hook {
            lie: true,
            decided: 0.into(),
        },
    );
    let mut lies_showed = 0;
    for kids in [[2u32, 1, 3], [0, 0, 1], [3, 2, 1]] {
        let s = small(kids);
        for with_draft in [false, true] {
            for off in 0..if cfg!(miri) { 4u64 } else { 100 } {
                let offset = [off];
                let batch = TreeBatch::new(
                    TreeDims {
                        vocab: 4,
                        max_nodes: 6,
                        max_depth: 2,
                    },
                    Tree {
                        nodes: &[6],
                        tokens: &s.tokens,
                        first_child: &s.fc,
                        next_sibling: &s.ns,
                    },
                    &[],
                    Streams {
                        seed: &[11],
                        offset: &offset,
                    },
                )
                .with_target_logits(Logits {
                    values: &logits,
                    temperature: &temps,
                });
                let batch = if with_draft {
                    batch.with_draft_probs(&draft)
                } else {
                    batch
                };
                let run = |ops: &dyn RowOps| {
                    let (mut path, mut tokens) = ([0u32; 3], [0u32; 3]);
                    let acc = verify_tree_request(
                        ops,
                        &BatchRows,
                        Method::Rejection,
                        &batch,
                        0,
                        &mut path,
                        &mut tokens,
                    );
                    (acc, path, tokens)
                };
                let want = run(&ScalarOps);
                let before = exact.decided.get();
                assert_eq!(run(&exact), want, "{kids:?} {with_draft} {off}");
                // With the exact `p`, the hook passes exactly the first children the walk
                // accepts (the first test at their parent is theirs).
                let (acc, path, _) = want;
                let firsts = (1..=acc as usize)
                    .filter(|&i| s.fc[path[i - 1] as usize] == path[i] as i32)
                    .count() as u32;
                assert_eq!(
                    exact.decided.get() - before,
                    firsts,
                    "{kids:?} {with_draft} {off}: {want:?}"
                );
                lies_showed += usize::from(run(&lying) != want);
            }
        }
    }
    assert!(exact.decided.get() > 10, "{}", exact.decided.get());
    assert!(lies_showed > 10, "{lies_showed}");
}

#[test]
fn a_token_both_models_rule_out_is_never_accepted() {
    // Child token 0 with q(0) = 0 and p(0) = 0: `U·0 < 0` is false for every U, so it is
    // rejected; the residual p − q is empty, so the fallback samples p: token 1.
    let batch_of = |draft: &'static [f32]| {
        TreeBatch::new(
            TreeDims {
                vocab: 2,
                max_nodes: 2,
                max_depth: 1,
            },
            Tree {
                nodes: &[2],
                tokens: &[0, 0],
                first_child: &[1, NO_NODE],
                next_sibling: &[NO_NODE, NO_NODE],
            },
            &[0.0, 1.0, 0.5, 0.5],
            Streams {
                seed: &[5],
                offset: &[6],
            },
        )
        .with_draft_probs(draft)
    };
    for off in 0..20u64 {
        let offset = [off];
        let batch = TreeBatch {
            offset: &offset,
            ..batch_of(&[0.0, 0.0, 0.0, 1.0])
        };
        let (mut a, mut p, mut t) = ([0u32; 1], [0u32; 2], [0u32; 2]);
        let mut c = Counters::<4>::ZERO;
        let mut out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t));
        verify_tree_batch(Method::Rejection, Check::STRICT, &batch, &mut out, &mut c).unwrap();
        assert_eq!((a, p, t), ([0], [0, SENTINEL], [1, SENTINEL]));
    }
}

#[test]
fn a_request_gives_the_same_bits_alone_and_in_a_batch() {
    // Two different requests (trees, rows, draft rows, streams): each batched result equals
    // the request verified alone, for every method.
    let (a, mut b) = (small([2, 1, 3]), small([3, 0, 0]));
    // Request 1 has another shape: two children, the second with three (other links).
    links_from_parents(&[-1, 0, 0, 2, 2, 2], &mut b.fc, &mut b.ns).unwrap();
    let mut b_target = b.target.clone();
    // Request 1's first child (token 3) has target probability 0.1: its own draft row (0.1)
    // accepts it, request 0's (0.4) would reject it 3 times in 4, so reading the wrong
    // request's draft rows shows.
    b_target[..4].copy_from_slice(&[0.1, 0.1, 0.7, 0.1]);
    let b_draft: std::vec::Vec<f32> = b.draft.iter().map(|&q| 1.0 - q * 2.0).collect();
    let b_draft: std::vec::Vec<f32> = b_draft
        .chunks(4)
        .flat_map(|r| {
            let s: f32 = r.iter().sum();
            r.iter().map(move |x| if s > 0.0 { x / s } else { 0.25 })
        })
        .collect();
    let cat = |x: &[u32], y: &[u32]| [x, y].concat();
    let tokens = cat(&a.tokens, &b.tokens);
    let fc = [&a.fc[..], &b.fc[..]].concat();
    let ns = [&a.ns[..], &b.ns[..]].concat();
    let target = [&a.target[..], &b_target[..]].concat();
    let draft = [&a.draft[..], &b_draft[..]].concat();
    let trees = [
        (a.tokens, a.fc, a.ns, &a.target, &a.draft),
        (b.tokens, b.fc, b.ns, &b_target, &b_draft),
    ];
    let offsets = if cfg!(miri) { 2u64 } else { 40 };
    for method in [Method::Rejection, Method::Greedy, Method::Typical] {
        for with_draft in [false, true] {
            for off in 0..offsets {
                let (seed, offset) = ([3u64, 4], [off, off + 7]);
                let dims = TreeDims {
                    vocab: 4,
                    max_nodes: 6,
                    max_depth: 2,
                };
                let mut both = TreeBatch::new(
                    dims,
                    Tree {
                        nodes: &[6, 6],
                        tokens: &tokens,
                        first_child: &fc,
                        next_sibling: &ns,
                    },
                    &target,
                    Streams {
                        seed: &seed,
                        offset: &offset,
                    },
                );
                if with_draft {
                    both = both.with_draft_probs(&draft);
                }
                let (mut acc, mut path, mut tok) = ([0u32; 2], [0u32; 6], [0u32; 6]);
                let mut c = Counters::<4>::ZERO;
                verify_tree_batch(
                    method,
                    Check::STRICT,
                    &both,
                    &mut TreeOutputs::new(
                        AcceptedOut(&mut acc),
                        PathOut(&mut path),
                        TokensOut(&mut tok),
                    ),
                    &mut c,
                )
                .unwrap();
                let mut alone_c = Counters::<4>::ZERO;
                for (r, (tk, f, n, t, d)) in trees.iter().enumerate() {
                    let mut one = TreeBatch::new(
                        dims,
                        Tree {
                            nodes: &[6],
                            tokens: tk,
                            first_child: f,
                            next_sibling: n,
                        },
                        t,
                        Streams {
                            seed: &seed[r..=r],
                            offset: &offset[r..=r],
                        },
                    );
                    if with_draft {
                        one = one.with_draft_probs(d);
                    }
                    let (mut a1, mut p1, mut t1) = ([0u32; 1], [0u32; 3], [0u32; 3]);
                    verify_tree_batch(
                        method,
                        Check::STRICT,
                        &one,
                        &mut TreeOutputs::new(
                            AcceptedOut(&mut a1),
                            PathOut(&mut p1),
                            TokensOut(&mut t1),
                        ),
                        &mut alone_c,
                    )
                    .unwrap();
                    let what = (method, with_draft, off, r);
                    assert_eq!(a1[0], acc[r], "{what:?}");
                    assert_eq!(p1, path[3 * r..3 * r + 3], "{what:?}");
                    assert_eq!(t1, tok[3 * r..3 * r + 3], "{what:?}");
                }
                assert_eq!(c, alone_c);
            }
        }
    }
}

#[test]
fn a_tree_request_is_resolved_as_a_chain_request_is() {
    // One root and one child (V = 2) against a chain with k = 1: the same rows, temperatures,
    // typical parameters and method give the same plan, and bf16 rows make neither plain.
    let (probs, logits) = ([0.5f32, 0.5, 0.25, 0.75], [1.0f32, -1.0, 0.5, 0.0]);
    let bf16 = [0x3f00u16; 4];
    let (eps, delta) = ([0.2f32, 0.1], [0.7f32, 0.4]);
    let streams = Streams {
        seed: &[1, 2],
        offset: &[0, 0],
    };
    let (nodes, tokens, fc, ns) = (
        [2u32, 2],
        [0u32, 1, 0, 1],
        [1, NO_NODE, 1, NO_NODE],
        [NO_NODE; 4],
    );
    let tree = Tree {
        nodes: &nodes,
        tokens: &tokens,
        first_child: &fc,
        next_sibling: &ns,
    };
    let dims = TreeDims {
        vocab: 2,
        max_nodes: 2,
        max_depth: 1,
    };
    let temperature = [0.0f32, 0.8];
    for method in [Method::Rejection, Method::Greedy, Method::Typical] {
        for target in [
            Target::Probs(Rows::f32(&probs, 2)),
            Target::Logits {
                rows: Rows::f32(&logits, 2),
                temperature: &temperature,
            },
            Target::Logits {
                rows: Rows::half(Half::Bf16(&bf16), 2),
                temperature: &temperature,
            },
        ] {
            for typical in [false, true] {
                let mut t = TreeBatch::new(dims, tree, &probs, streams).with_target(target);
                let mut c = Batch::dense(
                    Dims { vocab: 2, k_max: 1 },
                    Drafts {
                        k: &[1, 1],
                        ids: &[1, 1],
                    },
                    &probs,
                    streams,
                )
                .with_target(target);
                if typical {
                    t = t.with_typical(&eps, &delta);
                    c = c.with_typical(&eps, &delta);
                }
                for b in 0..2 {
                    let plan = t.plan(b, method);
                    assert_eq!(plan, c.plan(b, method), "{method:?} {target:?} {b}");
                    let greedy = target.temperature().is_some_and(|_| b == 0);
                    assert_eq!(plan.method, if greedy { Method::Greedy } else { method });
                    assert_eq!(plan.eps, if typical { eps[b] } else { DEFAULT_EPS });
                    assert_eq!(plan.delta, if typical { delta[b] } else { DEFAULT_DELTA });
                    let f32_rows = target.rows().format() == Format::F32;
                    let stored = target.temperature().is_none() || b == 0;
                    assert_eq!(plan.plain, f32_rows && stored, "{target:?} {b}");
                }
            }
        }
    }
}

#[test]
fn sibling_draw_rank_0_is_the_chain_draw() {
    for (seed, off, node) in [(0u64, 0u64, 0u32), (7, 9, 3), (u64::MAX, 1 << 40, 511)] {
        assert_eq!(
            sibling_draw(seed, off, node, 0),
            crate::verify::philox::accept_draw(seed, off, node)
        );
        assert_ne!(
            sibling_draw(seed, off, node, 1),
            sibling_draw(seed, off, node, 0)
        );
    }
    assert_eq!(residual_fixed(1.0), 1u128 << 64);
    assert_eq!(residual_fixed(0.5), 1u128 << 63);
    assert_eq!(residual_fixed(1e30), 1u128 << 96);
    assert_eq!(residual_fixed(0.0), 0);
}

#[test]
fn strict_checks_and_parameters_are_refused_with_their_kind() {
    // Root + one child, V = 2.
    let fc = [1, NO_NODE];
    let ns = [NO_NODE; 2];
    let run = |method: Method,
               target: &[f32],
               draft: Option<&[f32]>,
               temperature: Option<f32>,
               eps: f32| {
        let t = [temperature.unwrap_or(0.0)];
        let e = [eps];
        let d = [0.3f32];
        let mut batch = TreeBatch::new(
            TreeDims {
                vocab: 2,
                max_nodes: 2,
                max_depth: 1,
            },
            Tree {
                nodes: &[2],
                tokens: &[0, 1],
                first_child: &fc,
                next_sibling: &ns,
            },
            target,
            Streams {
                seed: &[0],
                offset: &[0],
            },
        )
        .with_typical(&e, &d);
        if let Some(dr) = draft {
            batch = batch.with_draft_probs(dr);
        }
        if temperature.is_some() {
            batch = batch.with_target_logits(Logits {
                values: target,
                temperature: &t,
            });
        }
        let (mut a, mut p, mut tk) = ([0u32; 1], [0u32; 2], [0u32; 2]);
        let out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut tk));
        validate_tree::<4>(method, Check::STRICT, &batch, &out)
    };
    let good = [0.5f32, 0.5, 0.25, 0.75];
    let g = Method::Greedy;
    assert_eq!(run(g, &good, None, None, 0.1), Ok(()));
    let row_sum = |node, sum, tensor| {
        Err(VerifyError::RowSum {
            request: 0,
            tensor,
            position: node,
            sum,
        })
    };
    assert_eq!(
        run(g, &[0.5, 0.5, 0.25, 0.25], None, None, 0.1),
        row_sum(1, 0.5, Tensor::Target)
    );
    assert_eq!(
        run(g, &[0.5, 0.5, 1.0, 0.5], None, None, 0.1),
        row_sum(1, 1.5, Tensor::Target)
    );
    // Draft row 0 (the root's) is never read; node 1's is.
    assert_eq!(
        run(g, &good, Some(&[9.0, 9.0, 0.5, 0.5]), None, 0.1),
        Ok(())
    );
    assert_eq!(
        run(g, &good, Some(&[0.5, 0.5, 0.5, 0.25]), None, 0.1),
        row_sum(1, 0.75, Tensor::Draft)
    );
    assert_eq!(
        run(g, &[0.5, 0.5, -0.25, 1.25], None, None, 0.1),
        Err(VerifyError::BadProbability {
            request: 0,
            tensor: Tensor::Target,
            position: 1,
            index: 0
        })
    );
    // Logits: −∞ masks a token; NaN and +∞ are refused; temperatures must be ≥ 0.
    let logits = [0.0f32, f32::NEG_INFINITY, 1.0, 2.0];
    assert_eq!(run(g, &logits, None, Some(0.7), 0.1), Ok(()));
    for (bad, index) in [(f32::NAN, 1), (f32::INFINITY, 1)] {
        assert_eq!(
            run(g, &[0.0, bad, 1.0, 2.0], None, Some(0.7), 0.1),
            Err(VerifyError::BadLogit {
                request: 0,
                position: 0,
                index
            })
        );
    }
    for t in [-1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(
            run(g, &logits, None, Some(t), 0.1),
            Err(VerifyError::BadParam {
                request: 0,
                param: Param::Temperature
            })
        );
    }
    // Typical acceptance's parameters are checked for typical acceptance only.
    let typical_err = Err(VerifyError::BadParam {
        request: 0,
        param: Param::Eps,
    });
    assert_eq!(
        run(Method::Typical, &good, None, None, f32::NAN),
        typical_err
    );
    assert_eq!(run(Method::Typical, &good, None, None, -1.0), typical_err);
    assert_eq!(run(Method::Typical, &good, None, None, 0.2), Ok(()));
    assert_eq!(run(g, &good, None, None, f32::NAN), Ok(()));
    assert_eq!(run(Method::Rejection, &good, None, None, f32::NAN), Ok(()));
}

#[test]
fn every_error_names_its_figures() {
    use std::string::ToString;
    let t = Tensor::Draft;
    let cases: [(VerifyError, &[&str]); 17] = [
        (VerifyError::EmptyBatch, &["empty"]),
        (
            VerifyError::MaxNodesOutOfRange {
                max_nodes: 900,
                max: 512,
            },
            &["900", "512"],
        ),
        (
            VerifyError::MaxDepthOutOfRange {
                max_depth: 9,
                max: 8,
            },
            &["9", "8"],
        ),
        (VerifyError::VocabOutOfRange { vocab: 0 }, &["0"]),
        (
            VerifyError::StrideTooSmall {
                tensor: t,
                stride: 3,
                vocab: 4,
            },
            &["Draft", "3", "4"],
        ),
        (
            VerifyError::Length {
                param: Param::Path,
                len: 5,
                expected: 6,
            },
            &["Path", "5", "6"],
        ),
        (
            VerifyError::NodeCount {
                request: 2,
                nodes: 7,
                max: 6,
            },
            &["2", "7", "6"],
        ),
        (
            VerifyError::LinkOutOfRange {
                request: 1,
                node: 3,
                link: -4,
            },
            &["1", "3", "-4"],
        ),
        (
            VerifyError::Cycle {
                request: 4,
                node: 5,
            },
            &["4", "5", "twice"],
        ),
        (
            VerifyError::Unreachable {
                request: 4,
                node: 6,
            },
            &["4", "6", "not reached"],
        ),
        (
            VerifyError::Depth {
                request: 3,
                node: 8,
                max: 2,
            },
            &["3", "8", "2"],
        ),
        (
            VerifyError::TokenOutOfRange {
                request: 1,
                position: 2,
                token: 99,
                vocab: 50,
            },
            &["99", "50"],
        ),
        (
            VerifyError::BadParam {
                request: 7,
                param: Param::Delta,
            },
            &["7", "Delta"],
        ),
        (
            VerifyError::BadProbability {
                request: 1,
                tensor: t,
                position: 2,
                index: 33,
            },
            &["Draft", "33"],
        ),
        (
            VerifyError::BadLogit {
                request: 1,
                position: 2,
                index: 34,
            },
            &["34", "logit"],
        ),
        (
            VerifyError::RowSum {
                request: 1,
                tensor: Tensor::Target,
                position: 2,
                sum: 0.5,
            },
            &["Target", "0.5"],
        ),
        (VerifyError::EmptyBatch, &["empty"]),
    ];
    for (e, words) in cases {
        let s = e.to_string();
        for w in words {
            assert!(s.contains(w), "{s:?} lacks {w:?}");
        }
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
    }
}

#[test]
fn shapes_and_lengths_are_checked_before_anything_else() {
    let fc = [1, NO_NODE];
    let ns = [NO_NODE; 2];
    let target = [0.5f32; 4];
    let ok = TreeBatch::new(
        TreeDims {
            vocab: 2,
            max_nodes: 2,
            max_depth: 1,
        },
        Tree {
            nodes: &[2],
            tokens: &[0, 1],
            first_child: &fc,
            next_sibling: &ns,
        },
        &target,
        Streams {
            seed: &[0],
            offset: &[0],
        },
    );
    let check = |batch: TreeBatch<'_>, outs: [usize; 3]| {
        let (mut a, mut p, mut t) = ([0u32; 3], [0u32; 3], [0u32; 3]);
        let out = TreeOutputs::new(
            AcceptedOut(&mut a[..outs[0]]),
            PathOut(&mut p[..outs[1]]),
            TokensOut(&mut t[..outs[2]]),
        );
        validate_tree::<4>(Method::Typical, Check::Cheap, &batch, &out)
    };
    let len = |param, len, expected| {
        Err(VerifyError::Length {
            param,
            len,
            expected,
        })
    };
    assert_eq!(check(ok, [1, 2, 2]), Ok(()));
    assert_eq!(check(ok, [2, 2, 2]), len(Param::Accepted, 2, 1));
    assert_eq!(check(ok, [1, 3, 2]), len(Param::Path, 3, 2));
    assert_eq!(check(ok, [1, 2, 1]), len(Param::Tokens, 1, 2));
    let outs = [1, 2, 2];
    let tree = ok.tree;
    assert_eq!(
        check(
            TreeBatch {
                tree: Tree { nodes: &[], ..tree },
                ..ok
            },
            outs
        ),
        Err(VerifyError::EmptyBatch)
    );
    for max_nodes in [0, MAX_TREE_NODES + 1] {
        assert_eq!(
            check(TreeBatch { max_nodes, ..ok }, outs),
            Err(VerifyError::MaxNodesOutOfRange {
                max_nodes,
                max: MAX_TREE_NODES
            })
        );
    }
    assert_eq!(
        check(TreeBatch { vocab: 0, ..ok }, outs),
        Err(VerifyError::VocabOutOfRange { vocab: 0 })
    );
    // The limits themselves pass those checks (and fail later, on the lengths).
    assert!(matches!(
        check(
            TreeBatch {
                max_nodes: MAX_TREE_NODES,
                ..ok
            },
            outs
        ),
        Err(VerifyError::Length {
            param: Param::TreeTokens,
            ..
        })
    ));
    #[cfg(target_pointer_width = "64")]
    {
        let top = u32::MAX as usize;
        assert!(matches!(
            check(TreeBatch { vocab: top, ..ok }, outs),
            Err(VerifyError::StrideTooSmall { .. })
        ));
        assert_eq!(
            check(
                TreeBatch {
                    vocab: top + 1,
                    ..ok
                },
                outs
            ),
            Err(VerifyError::VocabOutOfRange { vocab: top + 1 })
        );
    }
    assert_eq!(
        check(
            TreeBatch {
                tree: Tree {
                    tokens: &[0],
                    ..tree
                },
                ..ok
            },
            outs
        ),
        len(Param::TreeTokens, 1, 2)
    );
    assert_eq!(
        check(
            TreeBatch {
                tree: Tree {
                    first_child: &[1],
                    ..tree
                },
                ..ok
            },
            outs
        ),
        len(Param::FirstChild, 1, 2)
    );
    assert_eq!(
        check(
            TreeBatch {
                tree: Tree {
                    next_sibling: &[1, 1, 1],
                    ..tree
                },
                ..ok
            },
            outs
        ),
        len(Param::NextSibling, 3, 2)
    );
    assert_eq!(
        check(ok.with_draft_probs(&[0.5; 3]), outs),
        len(Param::DraftProbs, 3, 4)
    );
    assert_eq!(check(ok.with_draft_probs(&[0.5; 4]), outs), Ok(()));
    assert_eq!(
        check(
            ok.with_draft_probs(&[0.5; 4]).with_strides(Strides {
                draft: 1,
                target: 2
            }),
            outs
        ),
        Err(VerifyError::StrideTooSmall {
            tensor: Tensor::Draft,
            stride: 1,
            vocab: 2
        })
    );
    assert_eq!(
        check(
            ok.with_strides(Strides {
                draft: 2,
                target: 1
            }),
            outs
        ),
        Err(VerifyError::StrideTooSmall {
            tensor: Tensor::Target,
            stride: 1,
            vocab: 2
        })
    );
    // A wider target stride needs more values.
    assert_eq!(
        check(
            ok.with_strides(Strides {
                draft: 2,
                target: 3
            }),
            outs
        ),
        len(Param::TargetProbs, 4, 6)
    );
    let t6 = [0.5f32; 6];
    let wide = TreeBatch {
        target: Target::Probs(Rows::f32(&t6, 2)),
        ..ok
    }
    .with_strides(Strides {
        draft: 2,
        target: 3,
    });
    assert_eq!(check(wide, outs), Ok(()));
    let temps = [0.5f32, 0.5];
    assert_eq!(
        check(
            ok.with_target(Target::Logits {
                rows: ok.target.rows(),
                temperature: &temps,
            }),
            outs
        ),
        len(Param::Temperature, 2, 1)
    );
    // Filters: one per request, in range; and only where the verifier filters tree rows.
    let two = [Filter::NONE.with_top_k(1); 2];
    assert_eq!(
        check(ok.with_filters(&two), outs),
        len(Param::Filters, 2, 1)
    );
    assert_eq!(check(ok.with_filters(&two[..1]), outs), Ok(()));
    let bad = [Filter::NONE.with_top_p(1.5)];
    assert!(matches!(
        check(ok.with_filters(&bad), outs),
        Err(VerifyError::BadParam { request: 0, .. })
    ));
    let no_filters = Support {
        tree_filters: false,
        ..Support::ALL
    };
    let (mut a, mut p, mut t) = ([0u32; 1], [0u32; 2], [0u32; 2]);
    let out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t));
    assert_eq!(
        validate_tree_shape_with::<4>(no_filters, &ok.with_filters(&two[..1]), &out),
        Err(VerifyError::Unsupported {
            feature: Feature::Filters
        })
    );
    assert_eq!(validate_tree_shape_with::<4>(no_filters, &ok, &out), Ok(()));
    assert_eq!(
        check(TreeBatch { seed: &[], ..ok }, outs),
        len(Param::Seed, 0, 1)
    );
    assert_eq!(
        check(
            TreeBatch {
                offset: &[1, 2],
                ..ok
            },
            outs
        ),
        len(Param::Offset, 2, 1)
    );
    let two = [0.1f32, 0.1];
    assert_eq!(
        check(
            TreeBatch {
                eps: Some(&two),
                ..ok
            },
            outs
        ),
        len(Param::Eps, 2, 1)
    );
    assert_eq!(
        check(
            TreeBatch {
                delta: Some(&two),
                ..ok
            },
            outs
        ),
        len(Param::Delta, 2, 1)
    );
    let bad = [f32::NAN];
    assert_eq!(
        check(
            TreeBatch {
                delta: Some(&bad),
                ..ok
            },
            outs
        ),
        Err(VerifyError::BadParam {
            request: 0,
            param: Param::Delta
        })
    );
    let neg = [-0.5f32];
    assert_eq!(
        check(
            TreeBatch {
                eps: Some(&neg),
                ..ok
            },
            outs
        ),
        Err(VerifyError::BadParam {
            request: 0,
            param: Param::Eps
        })
    );
    // Depth ≤ K: 4 is fine, 5 is not.
    let depth_ok = TreeBatch { max_depth: 4, ..ok };
    let (mut a, mut p, mut t) = ([0u32; 1], [0u32; 5], [0u32; 5]);
    let out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t));
    assert_eq!(
        validate_tree::<4>(Method::Greedy, Check::Cheap, &depth_ok, &out),
        Ok(())
    );
    assert_eq!(tree_depth(&depth_ok, 0), 1);
    assert_eq!(
        validate_tree::<3>(Method::Greedy, Check::Cheap, &depth_ok, &out),
        Err(VerifyError::MaxDepthOutOfRange {
            max_depth: 4,
            max: 3
        })
    );
}

#[test]
fn malformed_trees_are_refused_with_their_kind() {
    let target = [0.5f32; 2 * 4];
    let check = |fc: [i32; 4], ns: [i32; 4], n: u32, depth: usize| {
        let nodes = [n];
        let batch = TreeBatch::new(
            TreeDims {
                vocab: 2,
                max_nodes: 4,
                max_depth: depth,
            },
            Tree {
                nodes: &nodes,
                tokens: &[0, 1, 1, 0],
                first_child: &fc,
                next_sibling: &ns,
            },
            &target,
            Streams {
                seed: &[0],
                offset: &[0],
            },
        );
        let (mut a, mut p, mut t) = ([0u32; 1], [0u32; 8], [0u32; 8]);
        let out = TreeOutputs::new(
            AcceptedOut(&mut a),
            PathOut(&mut p[..depth + 1]),
            TokensOut(&mut t[..depth + 1]),
        );
        validate_tree::<4>(Method::Greedy, Check::Cheap, &batch, &out)
    };
    let n = NO_NODE;
    assert_eq!(check([1, 2, 3, n], [n; 4], 4, 3), Ok(()));
    assert_eq!(
        check([1, 2, 3, 1], [n; 4], 4, 3),
        Err(VerifyError::Cycle {
            request: 0,
            node: 1
        })
    );
    assert_eq!(
        check([1, n, n, n], [n, 2, 1, n], 3, 3),
        Err(VerifyError::Cycle {
            request: 0,
            node: 1
        })
    );
    // A link equal to the node count (a padding slot) is out of range.
    assert_eq!(
        check([1, 3, n, n], [n; 4], 3, 3),
        Err(VerifyError::LinkOutOfRange {
            request: 0,
            node: 1,
            link: 3
        })
    );
    assert_eq!(
        check([1, 5, n, n], [n; 4], 4, 3),
        Err(VerifyError::LinkOutOfRange {
            request: 0,
            node: 1,
            link: 5
        })
    );
    assert_eq!(
        check([1, n, n, n], [2, n, n, n], 3, 3),
        Err(VerifyError::LinkOutOfRange {
            request: 0,
            node: 0,
            link: 2
        })
    );
    assert_eq!(
        check([1, 0, n, n], [n; 4], 2, 3),
        Err(VerifyError::LinkOutOfRange {
            request: 0,
            node: 1,
            link: 0
        })
    );
    assert_eq!(
        check([1, n, n, n], [n; 4], 3, 3),
        Err(VerifyError::Unreachable {
            request: 0,
            node: 2
        })
    );
    assert_eq!(
        check([1, 2, 3, n], [n; 4], 4, 2),
        Err(VerifyError::Depth {
            request: 0,
            node: 3,
            max: 2
        })
    );
    assert_eq!(
        check([n; 4], [n; 4], 5, 2),
        Err(VerifyError::NodeCount {
            request: 0,
            nodes: 5,
            max: 4
        })
    );
    assert_eq!(
        check([n; 4], [n; 4], 1, 5),
        Err(VerifyError::MaxDepthOutOfRange {
            max_depth: 5,
            max: 4
        })
    );
    // The second request's own links are checked (a valid first request, a cycle in the
    // second).
    let target2 = [0.5f32; 2 * 8];
    let fc2 = [1, 2, 3, n, 1, 2, 3, 1];
    let ns2 = [n; 8];
    let batch = TreeBatch::new(
        TreeDims {
            vocab: 2,
            max_nodes: 4,
            max_depth: 3,
        },
        Tree {
            nodes: &[4, 4],
            tokens: &[0, 1, 1, 0, 0, 1, 1, 0],
            first_child: &fc2,
            next_sibling: &ns2,
        },
        &target2,
        Streams {
            seed: &[0, 0],
            offset: &[0, 0],
        },
    );
    let (mut a, mut p, mut t) = ([0u32; 2], [0u32; 8], [0u32; 8]);
    let out = TreeOutputs::new(AcceptedOut(&mut a), PathOut(&mut p), TokensOut(&mut t));
    assert_eq!(
        validate_tree::<4>(Method::Greedy, Check::Cheap, &batch, &out),
        Err(VerifyError::Cycle {
            request: 1,
            node: 1
        })
    );
    assert_eq!(
        VerifyError::Cycle {
            request: 0,
            node: 1
        }
        .kind(),
        crate::ErrorKind::InvalidInput
    );
}

#[test]
fn parents_build_the_same_links_as_written_by_hand() {
    let (mut fc, mut ns) = ([0i32; 6], [0i32; 6]);
    links_from_parents(&[-1, 0, 0, 1, 1, 0], &mut fc, &mut ns).unwrap();
    assert_eq!(fc, [1, 3, -1, -1, -1, -1]);
    assert_eq!(ns, [-1, 2, 5, 4, -1, -1]);
    assert_eq!(
        links_from_parents(&[0, 0], &mut fc[..2], &mut ns[..2]),
        Err(VerifyError::LinkOutOfRange {
            request: 0,
            node: 0,
            link: 0
        })
    );
    assert!(matches!(
        links_from_parents(&[-1, 7], &mut fc[..2], &mut ns[..2]),
        Err(VerifyError::LinkOutOfRange { node: 1, .. })
    ));
    assert!(matches!(
        links_from_parents(&[], &mut [], &mut []),
        Err(VerifyError::NodeCount { nodes: 0, .. })
    ));
    // A parent equal to the node count is out of range.
    assert_eq!(
        links_from_parents(&[-1, 0, 3], &mut fc[..3], &mut ns[..3]),
        Err(VerifyError::LinkOutOfRange {
            request: 0,
            node: 2,
            link: 3
        })
    );
    assert_eq!(
        links_from_parents(&[-1, 0], &mut fc[..3], &mut ns[..2]),
        Err(VerifyError::Length {
            param: Param::FirstChild,
            len: 3,
            expected: 2
        })
    );
    assert_eq!(
        links_from_parents(&[-1, 0], &mut fc[..2], &mut ns[..1]),
        Err(VerifyError::Length {
            param: Param::NextSibling,
            len: 1,
            expected: 2
        })
    );
    // The largest tree (a chain of MAX_TREE_NODES nodes) builds; one more node does not.
    let chain: std::vec::Vec<i32> = (0..MAX_TREE_NODES as i32 + 1).map(|i| i - 1).collect();
    let (mut fc, mut ns) = (
        std::vec![0i32; MAX_TREE_NODES + 1],
        std::vec![0i32; MAX_TREE_NODES + 1],
    );
    links_from_parents(
        &chain[..MAX_TREE_NODES],
        &mut fc[..MAX_TREE_NODES],
        &mut ns[..MAX_TREE_NODES],
    )
    .unwrap();
    assert_eq!(fc[MAX_TREE_NODES - 2], MAX_TREE_NODES as i32 - 1);
    assert_eq!(
        links_from_parents(&chain, &mut fc, &mut ns),
        Err(VerifyError::NodeCount {
            request: 0,
            nodes: MAX_TREE_NODES as u32 + 1,
            max: MAX_TREE_NODES
        })
    );
}

#[test]
fn trees_go_through_the_verifier_seam() {
    use crate::verify::{Feature, Reference, Support, Verifier};
    let s = small([1, 2, 3]);
    let batch = TreeBatch::new(
        TreeDims {
            vocab: 4,
            max_nodes: 6,
            max_depth: 2,
        },
        Tree {
            nodes: &[6],
            tokens: &s.tokens,
            first_child: &s.fc,
            next_sibling: &s.ns,
        },
        &s.target,
        Streams {
            seed: &[9],
            offset: &[3],
        },
    )
    .with_draft_probs(&s.draft);
    let run = |v: &mut dyn FnMut(&mut TreeOutputs<'_>) -> Result<(), VerifyError>| {
        let (mut a, mut p, mut t) = ([7u32; 1], [7u32; 3], [7u32; 3]);
        let r = v(&mut TreeOutputs::new(
            AcceptedOut(&mut a),
            PathOut(&mut p),
            TokensOut(&mut t),
        ));
        (r, a, p, t)
    };
    // The reference through the seam: the bits and counts of verify_tree_batch.
    let mut want_counters = Counters::<4>::ZERO;
    let want = run(&mut |o| {
        verify_tree_batch(
            Method::Rejection,
            Check::STRICT,
            &batch,
            o,
            &mut want_counters,
        )
    });
    let mut r = Reference::<4>::new();
    assert!(r.support().trees);
    let got = run(&mut |o| r.verify_tree(Method::Rejection, Check::STRICT, &batch, o));
    assert_eq!(got, want);
    assert_eq!(r.totals(), Ok(want_counters));

    // A backend without trees keeps the default: Unsupported, nothing written or counted.
    struct ChainsOnly(Counters<4>);
    impl Verifier<4> for ChainsOnly {
        type Error = VerifyError;
        fn verify(
            &mut self,
            _: Method,
            _: Check,
            _: &Batch<'_>,
            _: &mut Outputs<'_>,
        ) -> Result<(), VerifyError> {
            Ok(())
        }
        fn totals(&mut self) -> Result<Counters<4>, VerifyError> {
            Ok(self.0)
        }
    }
    let mut chains = ChainsOnly(Counters::ZERO);
    assert_eq!(chains.support(), Support::PADDED);
    assert!(!chains.support().trees);
    let (r, a, p, t) = run(&mut |o| chains.verify_tree(Method::Greedy, Check::Cheap, &batch, o));
    assert_eq!(
        r,
        Err(VerifyError::Unsupported {
            feature: Feature::Trees
        })
    );
    assert_eq!((a, p, t), ([7], [7; 3], [7; 3]), "nothing written");
    assert_eq!(chains.totals(), Ok(Counters::ZERO));
}

#[test]
fn excluding_weight_subtracts_one_once_per_tried_token() {
    let row = [0.5f32, 0.25, 1.5, 0.0];
    // Token 2 tried twice still loses 1.0 once; untried ids keep their value exactly.
    let tried = [2u32, 2, 0];
    assert_eq!(excluding_weight(&row, &tried, 0), -0.5);
    assert_eq!(excluding_weight(&row, &tried, 1), 0.25);
    assert_eq!(excluding_weight(&row, &tried, 2), 0.5);
    assert_eq!(excluding_weight(&row, &[], 3), 0.0);
    // The default race uses it: with ids 0 and 2 tried, only ids 1 and 2 keep a weight > 0.
    let hit = ScalarOps.race_excluding(
        RaceRng {
            seed: 7,
            offset: 0,
            position: 0,
        },
        &row,
        &tried,
    );
    assert!(matches!(hit, Some(1 | 2)), "{hit:?}");
}

/// An unfiltered tree's stored rows are reduced by the caller's [`RowOps`] (a backend's
/// vectorised ones); a filtered one goes through its processed rows and the plain loops.
#[test]
fn unfiltered_tree_rows_are_reduced_by_the_callers_ops() {
    struct Counting(core::cell::Cell<usize>);
    impl RowOps for Counting {
        fn argmax(&self, row: &[f32]) -> u32 {
            self.0.set(self.0.get() + 1);
            ScalarOps.argmax(row)
        }
        fn entropy(&self, row: &[f32]) -> f32 {
            ScalarOps.entropy(row)
        }
        fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
            ScalarOps.race(rng, row)
        }
        fn race_residual(
            &self,
            rng: RaceRng,
            target: &[f32],
            draft: Option<&[f32]>,
            token: u32,
        ) -> Option<u32> {
            ScalarOps.race_residual(rng, target, draft, token)
        }
    }
    let (fc, ns) = chain_links(1);
    let target = [0.1f32, 0.6, 0.3, /* node 1 */ 0.0, 0.0, 1.0];
    let batch = TreeBatch::new(
        TreeDims {
            vocab: 3,
            max_nodes: 2,
            max_depth: 1,
        },
        Tree {
            nodes: &[2],
            tokens: &[0, 1],
            first_child: &fc[..2],
            next_sibling: &ns[..2],
        },
        &target,
        Streams {
            seed: &[1],
            offset: &[0],
        },
    );
    let filters = [Filter::NONE.with_top_k(2)];
    for (batch, calls) in [(batch, 2), (batch.with_filters(&filters), 0)] {
        let ops = Counting(core::cell::Cell::new(0));
        let (mut path, mut tokens) = ([0u32; 2], [0u32; 2]);
        let accepted = verify_tree_request(
            &ops,
            &BatchRows,
            Method::Greedy,
            &batch,
            0,
            &mut path,
            &mut tokens,
        );
        assert_eq!((accepted, path, tokens), (1, [0, 1], [1, 2]));
        assert_eq!(ops.0.get(), calls, "argmax calls through the ops");
    }
}
