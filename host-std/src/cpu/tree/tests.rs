//! The tree reductions over logits rows ([`TreeRows`]) against the core reference, on every
//! instruction set this CPU runs, on one thread and with rows cut over a pool: the same
//! outputs as `verify_tree_batch` for every method, temperature (0 included), row shape
//! (peaked, flat, −∞ masks, exact ties, every id masked) and draft probabilities or none.

use super::*;
use crate::cpu::ChunkedOps;
use crate::cpu::CpuVerifier;
use specula_core::verify::tree::{
    BatchRows, PathOut, Tree, TreeDims, links_from_parents, validate_tree, verify_tree_batch,
};
use specula_core::verify::{AcceptedOut, Filter, Half, Logits, Rows, Streams, Target, TokensOut};

const K: usize = 6;

/// A xorshift generator (the tests need no statistical quality, only variety).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// A standard normal draw (Box–Muller).
    fn normal(&mut self) -> f32 {
        let u = f64::from(self.unit()) + 1e-9;
        let v = f64::from(self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// One logits row of shape `kind`: 0 flat (`3·ln u`), 1 peaked (one id far above a
/// `2·N(0, 1)` background, as a language model's output), 2 masked (peaked with most ids
/// `−∞`), 3 ties (few distinct values, the largest shared), 4 every id `−∞`.
fn logits_row(g: &mut Rng, kind: usize, v: usize) -> Vec<f32> {
    let mut row: Vec<f32> = match kind {
        0 => (0..v).map(|_| 3.0 * (g.unit() + 1e-6).ln()).collect(),
        1 | 2 => (0..v).map(|_| 2.0 * g.normal()).collect(),
        3 => (0..v).map(|_| (g.below(4) as f32) * 0.5).collect(),
        _ => vec![f32::NEG_INFINITY; v],
    };
    if kind == 1 || kind == 2 {
        // About 0.7 of the mass at T = 0.8 for V = 128256 (less for smaller rows).
        row[g.below(v)] = 19.0;
    }
    if kind == 2 {
        for x in row.iter_mut() {
            if g.below(4) != 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    row
}

/// The probability row of `logits` at `t` (f64 softmax; a uniform row when `t = 0` or every id
/// is masked): where children's tokens are drawn from, so paths are accepted as in real trees.
fn probs_of(logits: &[f32], t: f32) -> Vec<f32> {
    let t = if t > 0.0 { f64::from(t) } else { 1.0 };
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return vec![1.0 / logits.len() as f32; logits.len()];
    }
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| ((f64::from(l) - f64::from(m)) / t).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| (x / s) as f32).collect()
}

fn sample(g: &mut Rng, p: &[f32]) -> u32 {
    let u = g.unit();
    let mut acc = 0f32;
    for (i, &x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return i as u32;
        }
    }
    (p.len() - 1) as u32
}

/// An owned tree batch over logits.
struct Data {
    v: usize,
    n: usize,
    depth: usize,
    nodes: Vec<u32>,
    tokens: Vec<u32>,
    first_child: Vec<i32>,
    next_sibling: Vec<i32>,
    target: Vec<f32>,
    draft: Option<Vec<f32>>,
    temps: Vec<f32>,
    seed: Vec<u64>,
    offset: Vec<u64>,
    /// Per-request sampling filters (none when empty).
    filters: Vec<Filter>,
}

impl Data {
    fn view(&self) -> TreeBatch<'_> {
        let b = TreeBatch::new(
            TreeDims {
                vocab: self.v,
                max_nodes: self.n,
                max_depth: self.depth,
            },
            Tree {
                nodes: &self.nodes,
                tokens: &self.tokens,
                first_child: &self.first_child,
                next_sibling: &self.next_sibling,
            },
            &self.target,
            Streams {
                seed: &self.seed,
                offset: &self.offset,
            },
        )
        .with_target_logits(Logits {
            values: &self.target,
            temperature: &self.temps,
        });
        let b = match &self.draft {
            Some(d) => b.with_draft_probs(d),
            None => b,
        };
        if self.filters.is_empty() {
            b
        } else {
            b.with_filters(&self.filters)
        }
    }
}

/// `requests` random trees of up to `n` nodes (depth ≤ `depth`) over logits rows of random
/// shapes at vocabulary `v`; each child's token drawn from its parent's softmax (or the
/// parent's argmax, or at random), sometimes a sibling's token again.
fn random_data(
    g: &mut Rng,
    requests: usize,
    n: usize,
    depth: usize,
    v: usize,
    draft: bool,
) -> Data {
    let temps: Vec<f32> = (0..requests)
        .map(|_| [0.0, 0.5, 0.8, 0.8, 1.0, 1.7][g.below(6)])
        .collect();
    let mut d = Data {
        v,
        n,
        depth,
        nodes: vec![],
        tokens: vec![0; requests * n],
        first_child: vec![-1; requests * n],
        next_sibling: vec![-1; requests * n],
        target: vec![0.0; requests * n * v],
        draft: draft.then(|| vec![0.0; requests * n * v]),
        temps: temps.clone(),
        seed: (0..requests).map(|_| g.next()).collect(),
        offset: (0..requests).map(|_| g.next() >> 20).collect(),
        filters: vec![],
    };
    for (r, &t) in temps.iter().enumerate() {
        let count = 1 + g.below(n);
        d.nodes.push(count as u32);
        let mut parents = vec![-1i32];
        let mut depths = vec![0usize];
        for _ in 1..count {
            let p = loop {
                let p = g.below(parents.len());
                if depths[p] < depth {
                    break p;
                }
            };
            parents.push(p as i32);
            depths.push(depths[p] + 1);
        }
        let base = r * n;
        links_from_parents(
            &parents,
            &mut d.first_child[base..base + count],
            &mut d.next_sibling[base..base + count],
        )
        .unwrap();
        // Every id masked is rare: one row in about 30.
        let kinds = [0, 1, 1, 2, 3, 0, 1, 2, 3, 1];
        for i in 0..count {
            let kind = if g.below(30) == 0 {
                4
            } else {
                kinds[g.below(kinds.len())]
            };
            let row = logits_row(g, kind, v);
            d.target[(base + i) * v..][..v].copy_from_slice(&row);
        }
        for i in 1..count {
            let p = parents[i] as usize;
            let parent = &d.target[(base + p) * v..][..v];
            let probs = probs_of(parent, t);
            let token = match &mut d.draft {
                Some(dr) => {
                    // A drafter near the target: its probabilities times 0.5..1.5, renormalised.
                    let mut q: Vec<f32> = probs.iter().map(|&x| x * (0.5 + g.unit())).collect();
                    let s: f32 = q.iter().sum();
                    q.iter_mut().for_each(|x| *x /= s);
                    let t = sample(g, &q);
                    dr[(base + i) * v..][..v].copy_from_slice(&q);
                    t
                }
                None => match g.below(4) {
                    0 => g.below(v) as u32,
                    1 => specula_core::verify::argmax(&probs),
                    _ => sample(g, &probs),
                },
            };
            d.tokens[base + i] = token;
        }
        if count > 2 && g.below(3) == 0 {
            // A sibling's token again.
            let i = 1 + g.below(count - 1);
            if let Some(j) = (1..count).find(|&j| j != i && parents[j] == parents[i]) {
                d.tokens[base + j] = d.tokens[base + i];
            }
        }
    }
    d
}

/// Every CPU variant of the tree reductions gives the reference's outputs on `d`.
fn assert_same_bits(d: &Data, what: &str) {
    let batch = d.view();
    let requests = d.nodes.len();
    let w = d.depth + 1;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for method in [Method::Greedy, Method::Rejection, Method::Typical] {
        let (mut acc, mut path, mut tokens) = (
            vec![0u32; requests],
            vec![0u32; requests * w],
            vec![0u32; requests * w],
        );
        let mut out = TreeOutputs::new(
            AcceptedOut(&mut acc),
            PathOut(&mut path),
            TokensOut(&mut tokens),
        );
        let mut c = Counters::<K>::ZERO;
        validate_tree::<K>(method, Check::Cheap, &batch, &out).unwrap();
        verify_tree_batch(method, Check::Cheap, &batch, &mut out, &mut c).unwrap();
        let mut variants: Vec<(String, TreeRows<'_>)> = Vec::new();
        for isa in Isa::available() {
            variants.push((
                format!("{isa:?}"),
                TreeRows::new(SplitOps::for_test(isa, 1, None)),
            ));
            variants.push((
                format!("{isa:?} x3"),
                TreeRows::new(SplitOps::for_test(isa, 3, Some(&pool))),
            ));
        }
        for (name, ops) in &variants {
            for b in 0..requests {
                let (mut p, mut t) = (vec![0u32; w], vec![0u32; w]);
                let a = verify_tree_request(ops, &BatchRows, method, &batch, b, &mut p, &mut t);
                let ctx = format!("{what} {name} {method:?} request {b} T {}", d.temps[b]);
                assert_eq!(a, acc[b], "{ctx}: accepted");
                assert_eq!(p, path[b * w..][..w], "{ctx}: path");
                assert_eq!(t, tokens[b * w..][..w], "{ctx}: tokens");
            }
        }
        // The public vectorised reductions, a fresh row buffer per call.
        for b in 0..requests {
            let (mut p, mut t) = (vec![0u32; w], vec![0u32; w]);
            let a = verify_tree_request(&ChunkedOps, &BatchRows, method, &batch, b, &mut p, &mut t);
            assert_eq!(
                (a, &p[..], &t[..]),
                (acc[b], &path[b * w..][..w], &tokens[b * w..][..w])
            );
        }
    }
}

#[test]
fn logits_trees_match_the_reference_on_every_instruction_set() {
    let mut g = Rng(0x7EE_50F7);
    for i in 0..40 {
        let v = [5, 37, 64, 100, 1000][i % 5];
        let requests = 1 + g.below(4);
        let d = random_data(&mut g, requests, 10, 4, v, i % 3 == 0);
        assert_same_bits(&d, &format!("case {i} V {v}"));
    }
}

/// Trees with a sampling filter per request (each node's row filtered as a chain position's):
/// the CPU backend's reductions and its public verifier (one and two threads) give the
/// reference's outputs and counts.
#[test]
fn filtered_trees_match_the_reference() {
    let mut g = Rng(0xF117_E125);
    let choices = [
        Filter::NONE,
        Filter::NONE.with_top_k(3),
        Filter::NONE.with_top_p(0.9),
        Filter::NONE.with_min_p(0.05),
        Filter::NONE.with_top_k(20).with_top_p(0.8).with_min_p(0.01),
    ];
    for i in 0..24 {
        let v = [5, 37, 64, 1000][i % 4];
        let requests = 1 + g.below(4);
        let mut d = random_data(&mut g, requests, 8, 3, v, i % 2 == 0);
        d.filters = (0..requests)
            .map(|_| choices[g.below(choices.len())])
            .collect();
        assert_same_bits(&d, &format!("filtered case {i} V {v}"));
        let batch = d.view();
        let w = d.depth + 1;
        for method in [Method::Greedy, Method::Rejection, Method::Typical] {
            let run = |verify: &mut dyn FnMut(&mut TreeOutputs<'_>)| {
                let (mut a, mut p, mut t) = (
                    vec![0u32; requests],
                    vec![0u32; requests * w],
                    vec![0u32; requests * w],
                );
                verify(&mut TreeOutputs::new(
                    AcceptedOut(&mut a),
                    PathOut(&mut p),
                    TokensOut(&mut t),
                ));
                (a, p, t)
            };
            let mut c = Counters::<K>::ZERO;
            let want = run(&mut |out| {
                verify_tree_batch(method, Check::STRICT, &batch, out, &mut c).unwrap();
            });
            for threads in [1, 2] {
                let cpu = CpuVerifier::<K>::new(threads).unwrap();
                let got =
                    run(&mut |out| cpu.verify_tree(method, Check::STRICT, &batch, out).unwrap());
                assert_eq!(got, want, "case {i} {method:?} {threads} threads");
                assert_eq!(cpu.totals(), c, "case {i} {method:?} {threads} threads");
            }
        }
    }
}

/// Vocabulary sizes models use: many full kernel blocks, the peaked rows of real outputs.
#[test]
fn logits_trees_match_the_reference_at_model_vocabularies() {
    let mut g = Rng(0xB16_50F7);
    for (i, v) in [32_000usize, 128_256].into_iter().enumerate() {
        let d = random_data(&mut g, 3, 7, 3, v, i == 0);
        assert_same_bits(&d, &format!("V {v}"));
    }
}

/// The row kept between reductions is the right one: two rows at the same address are told
/// apart by their temperature, a state from another row is recomputed, not trusted.
#[test]
fn the_kept_row_is_only_reused_for_the_same_row() {
    let mut g = Rng(0x5EED);
    let a = logits_row(&mut g, 1, 300);
    let b = logits_row(&mut g, 0, 300);
    let ops = TreeRows::new(SplitOps::single());
    let rng = RaceRng {
        seed: 9,
        offset: 1,
        position: 2,
    };
    for t in [0.5f32, 1.3] {
        let (sa, sb) = (ScalarOps.softmax(&a, t), ScalarOps.softmax(&b, t));
        assert_eq!(ops.softmax(&a, t), sa);
        // `a` is kept; `b`'s reductions must not read it.
        assert_eq!(
            ops.softmax_argmax(&b, &sb),
            ScalarOps.softmax_argmax(&b, &sb)
        );
        assert_eq!(ops.softmax(&a, t), sa);
        assert_eq!(ops.softmax(&a, t * 2.0), ScalarOps.softmax(&a, t * 2.0));
        assert_eq!(
            ops.softmax_race(rng, &a, &sa, &[3, 3, 7]),
            ScalarOps.softmax_race(rng, &a, &sa, &[3, 3, 7])
        );
        assert_eq!(
            ops.softmax_entropy(&a, &sa).to_bits(),
            ScalarOps.softmax_entropy(&a, &sa).to_bits()
        );
        assert_eq!(
            ops.softmax_race(rng, &b, &sb, &[]),
            ScalarOps.softmax_race(rng, &b, &sb, &[])
        );
    }
}

/// A row changed in place between two verifications (same address, same temperature) is
/// reduced anew: a new `TreeRows` trusts nothing it kept before.
#[test]
fn a_row_changed_between_verifications_is_reduced_anew() {
    let mut g = Rng(0xA11A5);
    let mut row = logits_row(&mut g, 1, 500);
    let t = 0.8;
    {
        let ops = TreeRows::new(SplitOps::single());
        assert_eq!(ops.softmax(&row, t), ScalarOps.softmax(&row, t));
    }
    row.iter_mut().for_each(|x| *x = -*x);
    let ops = TreeRows::new(SplitOps::single());
    let sm = ScalarOps.softmax(&row, t);
    assert_eq!(ops.softmax(&row, t), sm);
    assert_eq!(
        ops.softmax_argmax(&row, &sm),
        ScalarOps.softmax_argmax(&row, &sm)
    );
}

/// SpecInfer's residual race ([`RowOps::race_speculative`]) gives the reference's id on every
/// instruction set, one thread or rows cut over a pool: normalised rows, garbage (NaN, negative,
/// above 1), and residuals below the smallest binary32 value (`p` just above `z·q` for tiny
/// `q`), which the kernels' binary32 block must not flush to 0.
#[test]
fn speculative_race_matches_the_reference_on_every_instruction_set() {
    let mut g = Rng(0x5BEC_u64);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut variants = vec![];
    for isa in Isa::available() {
        variants.push(TreeRows::new(SplitOps::for_test(isa, 1, None)));
        variants.push(TreeRows::new(SplitOps::for_test(isa, 3, Some(&pool))));
    }
    let mut tiny_cases = 0;
    for case in 0..120 {
        let len = [1usize, 3, 17, 64, 65, 300, 5000][case % 7];
        let m = 2 + g.below(3);
        let mode = case % 3;
        let mut drafts: Vec<Vec<f32>> = (0..m)
            .map(|_| (0..len).map(|_| g.unit() / len as f32).collect())
            .collect();
        let mut z: Vec<f64> = (0..m)
            .map(|j| {
                if j == 0 {
                    1.0
                } else {
                    0.3 + f64::from(g.unit())
                }
            })
            .collect();
        let target: Vec<f32> = match mode {
            0 => (0..len).map(|_| 2.0 * g.unit() / len as f32).collect(),
            1 => (0..len)
                .map(|_| [f32::NAN, -0.5, 3.0, f32::INFINITY, 0.0, 0.25][g.below(6)])
                .collect(),
            _ => {
                // p = q₀ for tiny q₀ and z₀ just below 1: residuals around 1e-46, the only
                // positive weights (the later drafts are 0).
                tiny_cases += 1;
                z[0] = 1.0 - f64::EPSILON;
                for q in drafts.iter_mut().skip(1) {
                    q.fill(0.0);
                }
                drafts[0] = (0..len).map(|_| 1e-30 * (1.0 + g.unit())).collect();
                drafts[0].clone()
            }
        };
        let q: Vec<&[f32]> = drafts.iter().map(Vec::as_slice).collect();
        for position in 0..3 {
            let rng = RaceRng {
                seed: g.next(),
                offset: g.next() >> 30,
                position,
            };
            let want = ScalarOps.race_speculative(rng, &target, &q, &z);
            if mode == 2 {
                assert!(
                    want.is_some(),
                    "case {case}: the tiny residuals are candidates"
                );
            }
            for (i, ops) in variants.iter().enumerate() {
                let got = ops.race_speculative(rng, &target, &q, &z);
                assert_eq!(
                    got, want,
                    "case {case} (len {len}, mode {mode}) variant {i}"
                );
            }
        }
    }
    assert!(tiny_cases > 0);
}

/// `x` rounded to bf16 (`f16: false`) or f16: the patterns and the binary32 values they widen
/// to.
fn rounded(x: &[f32], f16: bool) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = if f16 {
        x.iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect()
    } else {
        x.iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect()
    };
    let wide = bits
        .iter()
        .map(|&b| {
            if f16 {
                specula_core::verify::f16_to_f32(b)
            } else {
                specula_core::verify::bf16_to_f32(b)
            }
        })
        .collect();
    (bits, wide)
}

/// The filled cells of a [`Widening`]: node and row.
fn filled(cells: &[std::cell::OnceCell<Vec<f32>>]) -> Vec<(usize, &[f32])> {
    cells
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.get().map(|r| (i, &r[..])))
        .collect()
}

/// Half rows are widened when the walk reads them, and only those: request by request on one
/// thread's reused buffers (so a buffer holds another request's row before it is widened
/// again), every method, bf16 and f16 logits (T = 0 included) with and without half draft rows.
/// Each request's outputs are the reference's over the widened rows; every widened row is its
/// node's widening; greedy and the target-only rule widen exactly the rows of the visited nodes
/// (the path, the stopping node included) and SpecInfer those and the draft rows of the
/// siblings it tested, at least the accepted ones'. Typical acceptance reads each tested
/// node's parent (a row it reads again for each child): those rows, and the stopping node's.
#[test]
fn half_rows_are_widened_when_read_and_only_then() {
    let mut g = Rng(0x1A2E);
    let (mut visited_rows, mut rows_in_trees) = (0usize, 0usize);
    // Requests where SpecInfer rejected a sibling (a draft row read beyond the path's), and
    // where typical acceptance read rows off its path.
    let (mut rejected, mut off_path) = (0usize, 0usize);
    for case in 0..24 {
        let (f16, draft) = (case % 2 == 1, case % 4 >= 2);
        let v = [37, 300][case % 3 / 2];
        let d = random_data(&mut g, 6, 9, 4, v, draft);
        let (t_bits, t_wide) = rounded(&d.target, f16);
        let (q_bits, q_wide) = match &d.draft {
            Some(q) => {
                let (b, w) = rounded(q, !f16);
                (b, Some(w))
            }
            None => (Vec::new(), None),
        };
        let wide = Data {
            target: t_wide,
            draft: q_wide,
            ..d
        };
        let reference = wide.view();
        fn half(bits: &[u16], f16: bool) -> Half<'_> {
            if f16 {
                Half::F16(bits)
            } else {
                Half::Bf16(bits)
            }
        }
        let mut batch = reference.with_target(Target::Logits {
            rows: Rows::half(half(&t_bits, f16), v),
            temperature: &wide.temps,
        });
        if draft {
            batch = batch.with_draft(Rows::half(half(&q_bits, !f16), v));
        }
        let w = wide.depth + 1;
        let mut ops = TreeRows::new(SplitOps::single());
        for method in [Method::Greedy, Method::Rejection, Method::Typical] {
            for b in 0..wide.nodes.len() {
                let what = format!("case {case} {method:?} request {b}");
                let (mut p, mut t) = (vec![0u32; w], vec![0u32; w]);
                let (mut wp, mut wt) = (vec![0u32; w], vec![0u32; w]);
                let a = ops.verify(false, method, &batch, b, &mut p, &mut t);
                let want = verify_tree_request(
                    &ScalarOps, &BatchRows, method, &reference, b, &mut wp, &mut wt,
                );
                assert_eq!((a, &p, &t), (want, &wp, &wt), "{what}");
                let row = |x: &[f32], i: usize| x[(b * wide.n + i) * v..][..v].to_vec();
                let targets = filled(&ops.wide.target);
                let drafts = filled(&ops.wide.draft);
                for &(i, r) in &targets {
                    assert_eq!(r, row(&wide.target, i), "{what}: target row {i}");
                }
                for &(i, r) in &drafts {
                    assert_eq!(
                        r,
                        row(wide.draft.as_ref().unwrap(), i),
                        "{what}: draft row {i}"
                    );
                }
                let path = &p[..=a as usize];
                let nodes: Vec<usize> = targets.iter().map(|&(i, _)| i).collect();
                let greedy = method == Method::Greedy || wide.temps[b] == 0.0;
                if method != Method::Typical || greedy {
                    let mut want: Vec<usize> = path.iter().map(|&x| x as usize).collect();
                    want.sort_unstable();
                    assert_eq!(nodes, want, "{what}: target rows widened");
                } else if nodes.iter().any(|&i| !path.contains(&(i as u32))) {
                    off_path += 1;
                }
                let tested: Vec<usize> = drafts.iter().map(|&(i, _)| i).collect();
                if greedy || method == Method::Typical || !draft {
                    assert!(tested.is_empty(), "{what}: draft rows widened: {tested:?}");
                } else {
                    for &x in &path[1..] {
                        assert!(tested.contains(&(x as usize)), "{what}: draft row {x}");
                    }
                    if tested.len() > path.len() - 1 {
                        rejected += 1;
                    }
                }
                visited_rows += targets.len();
                rows_in_trees += wide.nodes[b] as usize;
            }
        }
    }
    assert!(
        rejected > 10 && off_path > 10,
        "{rejected} / {off_path}: a weak test"
    );
    // The walk reads fewer rows than the trees have: a test of laziness, not of a full pass.
    assert!(
        visited_rows * 2 < rows_in_trees,
        "{visited_rows} of {rows_in_trees} rows widened"
    );
}

/// The first-child shortcut ([`TreeRows`]' `softmax_passes`, the chain's sum bound) decides as
/// the node's own test, attacked where it is closest: at the seeds whose `U·q(x)` (or `U`,
/// without draft rows) lies inside the bound's range of `p(x)`, on both sides of `p(x)`, and at
/// others, the CPU backend's tree outputs are the core reference's (V = 32000, a root whose
/// first child holds a good part of the mass, then a second child).
#[test]
fn the_first_child_shortcut_decides_as_the_test() {
    use specula_core::verify::exponential::uniform53;
    use specula_core::verify::tree::sibling_draw;
    use specula_core::verify::{Check, Method, Softmax, softmax_exp};
    let (v, t) = (32_000usize, 0.8f32);
    let mut g = Rng(0x71EE);
    let mut logits: Vec<f32> = (0..3 * v).map(|_| 6.0 * g.unit() - 3.0).collect();
    logits[17] = 9.0;
    // Draft rows for nodes 1 and 2 (row 0 unread): q(17) = 0.4.
    let draft: Vec<f32> = (0..3 * v)
        .map(|i| match (i / v, i % v) {
            (0, _) => 0.0,
            (_, 17) => 0.4,
            _ => 0.6 / (v - 1) as f32,
        })
        .collect();
    let row = &logits[..v];
    let bound = kernels::sum_bound(Isa::detect(), row, t, None).expect("finite");
    let (lo, hi) = bound
        .p_range(softmax_exp(row[17], t, bound.m))
        .expect("narrow");
    let exact = Softmax::of(row, t).p(row[17]);
    assert!(lo <= exact && exact < hi, "{lo} {exact} {hi}");
    let (mut fc, mut ns) = ([0i32; 3], [0i32; 3]);
    links_from_parents(&[-1, 0, 0], &mut fc, &mut ns).expect("a tree");
    let tokens = [0u32, 17, 5];
    let verifier = CpuVerifier::<K>::new(1).expect("pool");
    for with_draft in [false, true] {
        let den = if with_draft { 0.4f64 } else { 1.0 };
        let (mut inside_accepted, mut inside_rejected, mut outside) = (0, 0, 0);
        for seed in 0..60_000u64 {
            let u = uniform53(sibling_draw(seed, 0, 0, 0)) * den;
            let class = if u < f64::from(lo) || u >= f64::from(hi) {
                &mut outside
            } else if u < f64::from(exact) {
                &mut inside_accepted
            } else {
                &mut inside_rejected
            };
            *class += 1;
            if *class > 30 {
                continue;
            }
            let (seeds, temps) = ([seed], [t]);
            let batch = TreeBatch::new(
                TreeDims {
                    vocab: v,
                    max_nodes: 3,
                    max_depth: 1,
                },
                Tree {
                    nodes: &[3],
                    tokens: &tokens,
                    first_child: &fc,
                    next_sibling: &ns,
                },
                &[],
                Streams {
                    seed: &seeds,
                    offset: &[0],
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
            let mut want = ([0u32; 1], [0u32; 2], [0u32; 2]);
            let mut counters = specula_core::Counters::<K>::ZERO;
            verify_tree_batch(
                Method::Rejection,
                Check::STRICT,
                &batch,
                &mut TreeOutputs::new(
                    AcceptedOut(&mut want.0),
                    PathOut(&mut want.1),
                    TokensOut(&mut want.2),
                ),
                &mut counters,
            )
            .expect("valid");
            let mut got = ([0u32; 1], [0u32; 2], [0u32; 2]);
            verifier
                .verify_tree(
                    Method::Rejection,
                    Check::STRICT,
                    &batch,
                    &mut TreeOutputs::new(
                        AcceptedOut(&mut got.0),
                        PathOut(&mut got.1),
                        TokensOut(&mut got.2),
                    ),
                )
                .expect("valid");
            assert_eq!(got, want, "draft rows {with_draft}, seed {seed}");
        }
        assert!(
            inside_accepted >= 3 && inside_rejected >= 3,
            "draft rows {with_draft}: {inside_accepted} {inside_rejected} {outside}"
        );
    }
}
