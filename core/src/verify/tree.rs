//! Tree verification: EAGLE / Medusa / SpecInfer token trees (`core/DETERMINISM.md`, "Token
//! trees").
//!
//! A drafter proposes, per request, a **tree** of candidate tokens; the target scored every node
//! in one pass. [`TreeBatch`] takes the tree in the form engines build it (SGLang's
//! `retrive_next_token` / `retrive_next_sibling`: first-child and next-sibling arrays over a
//! per-request node list, `-1` = none; [`links_from_parents`] builds them from a parent array),
//! with one target row per node. Verification walks the tree from the root and writes the
//! accepted node indices (so the engine keeps the KV cache of that path), the emitted tokens and
//! the accepted length ([`TreeOutputs`]).
//!
//! * [`Method::Greedy`]: follow the child whose token is the target argmax, as deep as it goes;
//!   emit the path plus the argmax at the stopping node.
//! * [`Method::Rejection`]: lossless. With draft probabilities, SpecInfer's multi-step
//!   speculative sampling over the siblings (Miao et al. 2024, Algorithm 2); without, the
//!   target-only rule (one uniform per node against the cumulative target mass of the siblings'
//!   tokens). Either way the emitted sequence follows the target distribution exactly.
//! * [`Method::Typical`]: Medusa's rule, the deepest path whose tokens all pass the threshold.
//!
//! A tree that is a chain (one child per node) gives the chain verifier's bits exactly
//! ([`verify_batch`](super::verify_batch) with the same rows, seed and offset): the random
//! draws are keyed by the node whose row is sampled, which is the draft position in a chain.
//!
//! ```
//! use specula_core::verify::tree::{verify_tree_batch, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs};
//! use specula_core::verify::{AcceptedOut, Check, Method, Streams, TokensOut};
//! use specula_core::Counters;
//!
//! // Root 0 with two candidates (tokens 1 and 2); node 2 has a child (token 3). V = 4.
//! let nodes = [4u32];
//! let tokens = [0, 1, 2, 3];
//! let first_child = [1, -1, 3, -1];
//! let next_sibling = [-1, 2, -1, -1];
//! let target = [
//!     0.1, 0.2, 0.7, 0.0, // root: argmax 2 (node 2)
//!     1.0, 0.0, 0.0, 0.0, // node 1 (not reached)
//!     0.0, 0.0, 0.0, 1.0, // node 2: argmax 3 (node 3)
//!     0.0, 1.0, 0.0, 0.0, // node 3 (leaf): argmax 1, the bonus
//! ];
//! let batch = TreeBatch::new(
//!     TreeDims { vocab: 4, max_nodes: 4, max_depth: 2 },
//!     Tree { nodes: &nodes, tokens: &tokens, first_child: &first_child, next_sibling: &next_sibling },
//!     &target,
//!     Streams { seed: &[1], offset: &[0] },
//! );
//! let (mut accepted, mut path, mut emitted) = ([0u32; 1], [0u32; 3], [0u32; 3]);
//! let mut out = TreeOutputs::new(AcceptedOut(&mut accepted), PathOut(&mut path), TokensOut(&mut emitted));
//! let mut counters = Counters::<4>::ZERO;
//! verify_tree_batch(Method::Greedy, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
//! assert_eq!((accepted, path, emitted), ([2], [0, 2, 3], [2, 3, 1]));
//! assert_eq!(counters.accepted_per_position[..2], [1, 1]);
//! ```

mod batch;
mod validate;

pub use batch::{
    DeviceTreeOutputs, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents,
};
pub(crate) use validate::validate_tree_inputs_with;
pub use validate::{
    tree_depth, validate_tree, validate_tree_request, validate_tree_shape,
    validate_tree_shape_with, validate_tree_with,
};

use super::{
    AcceptedOut, Check, DEFAULT_DELTA, DEFAULT_EPS, Feature, Format, Logits, Method, Param,
    RaceRng, RequestPlan, RowOps, Rows, SENTINEL, ScalarOps, Softmax, Streams, Strides, Support,
    Target, Tensor, TokensOut, Values, VerifyError, race,
};
use crate::metrics::Counters;
use crate::verify::exponential::uniform53;
use crate::verify::fmath::{entropy_from_fixed, entropy_term};
use crate::verify::philox::{STREAM_ACCEPT, counter, key, philox4x32_10};

/// The most nodes a request's tree may have (root included). SGLang's EAGLE trees use up to 64
/// draft tokens, Medusa's up to 64 paths; the limit keeps the verifier's per-request scratch
/// (a few arrays of this length) on the stack.
pub const MAX_TREE_NODES: usize = 512;

/// "No node" in [`Tree::first_child`] and [`Tree::next_sibling`].
pub const NO_NODE: i32 = -1;

/// A node's target distribution: the row as given, or the softmax of a logits row.
#[derive(Clone, Copy)]
enum Dist<'r> {
    Probs(&'r [f32]),
    Soft(&'r [f32], Softmax),
}

impl Dist<'_> {
    #[inline]
    fn p(&self, v: usize) -> f32 {
        match self {
            Self::Probs(r) => r[v],
            Self::Soft(r, sm) => sm.p(r[v]),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Probs(r) | Self::Soft(r, _) => r.len(),
        }
    }

    fn argmax<O: TreeOps + ?Sized>(&self, ops: &O) -> u32 {
        match self {
            Self::Probs(r) => ops.argmax(r),
            Self::Soft(r, sm) => ops.softmax_argmax(r, sm),
        }
    }

    fn entropy<O: TreeOps + ?Sized>(&self, ops: &O) -> f32 {
        match self {
            Self::Probs(r) => ops.entropy(r),
            Self::Soft(r, sm) => ops.softmax_entropy(r, sm),
        }
    }

    /// The plain race over the distribution, `0` when no value is `> 0`.
    fn sample<O: TreeOps + ?Sized>(&self, ops: &O, rng: RaceRng) -> u32 {
        match self {
            Self::Probs(r) => ops.race(rng, r),
            Self::Soft(r, sm) => ops.softmax_race(rng, r, sm, &[]),
        }
        .unwrap_or(0)
    }
}

/// `2⁶⁴`, the fixed-point scale of the residual mass.
const TWO_64: f64 = 18_446_744_073_709_551_616.0;
/// `2⁻⁶⁴`.
const TWO_M64: f64 = 1.0 / TWO_64;
/// The largest residual weight the fixed-point mass takes at face value: `2³²`.
const TWO_32: f64 = 4_294_967_296.0;

/// `⌊min(w, 2³²)·2⁶⁴⌋` of a residual weight `w ≥ 0` (not NaN): one term of the residual mass.
#[inline]
#[must_use]
pub fn residual_fixed(w: f64) -> u128 {
    let w = if w > TWO_32 { TWO_32 } else { w };
    (w * TWO_64) as u128
}

/// SpecInfer's residual weight of id `v` whose target probability is `p`, after the siblings
/// whose draft rows are `drafts` were rejected with masses `z` (`z[0] = 1`, one per row):
/// `p` in binary64, less `z[j]·drafts[j][v]` for each `j` in order, a result that is not `> 0`
/// (NaN included) becoming 0 after each step.
#[inline]
#[must_use]
pub fn speculative_residual(p: f32, drafts: &[&[f32]], z: &[f64], v: usize) -> f64 {
    let mut r = f64::from(p);
    for (q, &zj) in drafts.iter().zip(z) {
        r -= zj * f64::from(q[v]);
        r = if r > 0.0 { r } else { 0.0 };
    }
    r
}

/// The weight of id `v` in the target-only rule's residual race after the siblings `tried` were
/// rejected: `(row[v] as f64) − 1.0` if `v` is one of `tried` (once, however often it appears),
/// else `row[v] as f64`. [`TreeOps::race_excluding`] races over it; an implementation that
/// computes the weights another way uses this for the exact value of one id.
#[inline]
#[must_use]
pub fn excluding_weight(row: &[f32], tried: &[u32], v: usize) -> f64 {
    let hit = tried.iter().any(|&t| t as usize == v);
    f64::from(row[v]) - if hit { 1.0 } else { 0.0 }
}

/// The 64-bit acceptance draw of the sibling of rank `rank` among the children of `node`:
/// Philox stream 0, counter `[rank, node << 2, offset]`, words 0 (high) and 1 (low). Rank 0 is
/// the chain path's acceptance draw at position `node`.
#[inline]
#[must_use]
pub fn sibling_draw(seed: u64, offset: u64, node: u32, rank: u32) -> u64 {
    let w = philox4x32_10(counter(rank, node, STREAM_ACCEPT, offset), key(seed));
    (u64::from(w[0]) << 32) | u64::from(w[1])
}

/// The row reductions of tree verification: the chain path's four ([`RowOps`]), the residual
/// race of the target-only rule over several tried tokens, and the same reductions over the
/// softmax of a logits row. Every implementation must return the same values as the default
/// (for every input, NaN and values above 1 included); the defaults are the reference's plain
/// loops.
///
/// Verification reduces each logits row it reads once with [`softmax`](Self::softmax) and hands
/// that state to the `softmax_*` reductions of the same row, so an implementation may keep
/// what it computed for the state (the row's weights) for the reductions that follow.
pub trait TreeOps: RowOps {
    /// The race over `w_v = (row[v] as f64) − (1.0 if v is one of `tried` else 0.0)` (each
    /// token subtracted once, however often it appears in `tried`).
    fn race_excluding(&self, rng: RaceRng, row: &[f32], tried: &[u32]) -> Option<u32> {
        race(rng, row.len(), |v| excluding_weight(row, tried, v))
    }

    /// SpecInfer's residual race after every sibling was rejected: over
    /// `w_v = `[`speculative_residual`]`(row[v], drafts, z, v)` (`drafts`: the siblings' draft
    /// rows, `z`: their masses, as many).
    fn race_speculative(
        &self,
        rng: RaceRng,
        row: &[f32],
        drafts: &[&[f32]],
        z: &[f64],
    ) -> Option<u32> {
        race(rng, row.len(), |v| {
            speculative_residual(row[v], drafts, z, v)
        })
    }

    /// The softmax of the logits `row` at temperature `t > 0`: [`Softmax::of`].
    fn softmax(&self, row: &[f32], t: f32) -> Softmax {
        Softmax::of(row, t)
    }

    /// The argmax of the probabilities `p_v = sm.p(row[v])` (`sm`: this row's
    /// [`softmax`](Self::softmax)), NaN as `−∞`, ties to the lowest id; 0 for a row with no
    /// value above `−∞`.
    fn softmax_argmax(&self, row: &[f32], sm: &Softmax) -> u32 {
        let mut best = 0u32;
        let mut best_key = f32::NEG_INFINITY;
        for (v, &l) in row.iter().enumerate() {
            let x = sm.p(l);
            if x > best_key {
                best_key = x;
                best = v as u32;
            }
        }
        best
    }

    /// The entropy of the probabilities `p_v = sm.p(row[v])`, as [`RowOps::entropy`] of that
    /// row.
    fn softmax_entropy(&self, row: &[f32], sm: &Softmax) -> f32 {
        let mut fixed = 0i64;
        for &l in row {
            fixed = fixed.wrapping_add(entropy_term(sm.p(l)));
        }
        entropy_from_fixed(fixed)
    }

    /// Calls `f` with the probability row `p_v = sm.p(row[v])` (`sm`: this row's
    /// [`softmax`](Self::softmax)) where the implementation keeps one, for the reductions that
    /// have no hook of their own (SpecInfer's residuals); the default keeps none and does not
    /// call `f`, and the caller then reads each `p_v` through `sm`.
    fn with_softmax_probs(&self, row: &[f32], sm: &Softmax, f: &mut dyn FnMut(&[f32])) {
        let _ = (row, sm, f);
    }

    /// The race over `w_v = (sm.p(row[v]) as f64) − (1.0 if v is one of `tried` else 0.0)`, as
    /// [`race_excluding`](Self::race_excluding) of the probability row (`tried` empty: the
    /// plain race).
    fn softmax_race(&self, rng: RaceRng, row: &[f32], sm: &Softmax, tried: &[u32]) -> Option<u32> {
        race(rng, row.len(), |v| {
            let hit = tried.iter().any(|&t| t as usize == v);
            f64::from(sm.p(row[v])) - if hit { 1.0 } else { 0.0 }
        })
    }
}

impl TreeOps for ScalarOps {}

/// Where the tree walk reads request `b`'s rows: node `node`'s target row and, with draft
/// probabilities, its draft row, `V` binary32 values each. The walk asks for a row when it
/// reads it, and only then (greedy and the target-only rule: the visited nodes' rows;
/// SpecInfer: also the draft row of each sibling whose test comes; typical acceptance: the
/// tested nodes' parents and the stopping node), so a source may produce a row on its first
/// read, e.g. widen a bf16 / f16 row into scratch. A source must return the batch's row: the
/// binary32 values, or the exact widening of half ones (`core/DETERMINISM.md`), so that the
/// walk gives the bits of the binary32 tree.
///
/// The defaults read the batch's binary32 host rows as given ([`F32Rows`]); a batch they read
/// must have passed [`validate_tree`] (which refuses every other format).
pub trait NodeRows {
    /// Request `b`'s node `node`'s target row.
    fn target<'s>(&'s self, batch: &'s TreeBatch<'_>, b: usize, node: usize) -> &'s [f32] {
        batch.target_row(b, node)
    }

    /// Request `b`'s node `node`'s draft row, `None` without draft probabilities.
    fn draft<'s>(&'s self, batch: &'s TreeBatch<'_>, b: usize, node: usize) -> Option<&'s [f32]> {
        batch.draft_row(b, node)
    }
}

/// The batch's binary32 host rows as given: the reference's [`NodeRows`].
#[derive(Clone, Copy, Debug, Default)]
pub struct F32Rows;

impl NodeRows for F32Rows {}

/// What one node's test decided.
enum Step {
    /// Move to this child.
    Accept(usize),
    /// Stop here and emit this token.
    Emit(u32),
}

/// Request-local context of one verification.
struct Ctx<'r, 'a, O: ?Sized, R: ?Sized> {
    ops: &'r O,
    rows: &'r R,
    batch: &'r TreeBatch<'a>,
    b: usize,
    /// How the request is verified (its rule, temperature, typical parameters).
    plan: RequestPlan,
}

impl<'r, O: TreeOps + ?Sized, R: NodeRows + ?Sized> Ctx<'r, '_, O, R> {
    /// `Some(t)` with `t > 0`: the rows are read through their softmax.
    fn soft(&self) -> Option<f32> {
        self.plan.temperature.filter(|&t| t > 0.0)
    }

    /// Node `u`'s target row.
    fn target(&self, u: usize) -> &'r [f32] {
        self.rows.target(self.batch, self.b, u)
    }

    /// Node `u`'s draft row (empty without draft probabilities: not read then).
    fn draft(&self, u: usize) -> &'r [f32] {
        self.rows.draft(self.batch, self.b, u).unwrap_or(&[])
    }

    /// Node `u`'s distribution (a logits row's softmax reduced now).
    fn dist(&self, u: usize) -> Dist<'r> {
        let row = self.target(u);
        match self.soft() {
            Some(t) => Dist::Soft(row, self.ops.softmax(row, t)),
            None => Dist::Probs(row),
        }
    }

    /// Node `u`'s distribution, a logits row's softmax reduced once and kept in `states[u]`.
    fn dist_kept(&self, u: usize, states: &mut [Option<Softmax>]) -> Dist<'r> {
        let row = self.target(u);
        match self.soft() {
            Some(t) => Dist::Soft(
                row,
                *states[u].get_or_insert_with(|| self.ops.softmax(row, t)),
            ),
            None => Dist::Probs(row),
        }
    }

    fn rng(&self, u: usize) -> RaceRng {
        RaceRng {
            seed: self.batch.seed[self.b],
            offset: self.batch.offset[self.b],
            position: u as u32,
        }
    }

    /// Node `u`'s children in sibling order, written into `out`; returns how many.
    fn children(&self, u: usize, out: &mut [u16; MAX_TREE_NODES]) -> usize {
        let mut m = 0;
        let mut c = self.batch.first_child(self.b, u);
        while let Some(x) = c {
            out[m] = x as u16;
            m += 1;
            c = self.batch.next_sibling(self.b, x);
        }
        m
    }

    fn greedy(&self, u: usize) -> Step {
        let a = self.dist(u).argmax(self.ops);
        let mut c = self.batch.first_child(self.b, u);
        while let Some(x) = c {
            if self.batch.token(self.b, x) == a {
                return Step::Accept(x);
            }
            c = self.batch.next_sibling(self.b, x);
        }
        Step::Emit(a)
    }

    fn rejection(&self, u: usize) -> Step {
        let d = self.dist(u);
        let mut kids = [0u16; MAX_TREE_NODES];
        let m = self.children(u, &mut kids);
        let kids = &kids[..m];
        if m == 0 {
            return Step::Emit(d.sample(self.ops, self.rng(u)));
        }
        if self.batch.draft.is_some() {
            return self.speculative(u, kids, d);
        }
        // The target-only rule: one uniform against the cumulative mass of the siblings'
        // distinct tokens.
        let (seed, offset) = (self.batch.seed[self.b], self.batch.offset[self.b]);
        let token = |i: usize| self.batch.token(self.b, kids[i] as usize);
        let u01 = uniform53(sibling_draw(seed, offset, u as u32, 0));
        let mut cum = 0f64;
        for (i, &kid) in kids.iter().enumerate() {
            let x = token(i);
            if (0..i).any(|j| token(j) == x) {
                continue;
            }
            cum += f64::from(d.p(x as usize));
            if u01 < cum {
                return Step::Accept(kid as usize);
            }
        }
        let mut tried = [0u32; MAX_TREE_NODES];
        for (t, &c) in tried.iter_mut().zip(kids) {
            *t = self.batch.token(self.b, c as usize);
        }
        let tried = &tried[..m];
        let residual = match d {
            Dist::Probs(row) if m == 1 => self.ops.race_residual(self.rng(u), row, None, tried[0]),
            Dist::Probs(row) => self.ops.race_excluding(self.rng(u), row, tried),
            Dist::Soft(row, sm) => self.ops.softmax_race(self.rng(u), row, &sm, tried),
        };
        Step::Emit(residual.unwrap_or_else(|| d.sample(self.ops, self.rng(u))))
    }

    /// SpecInfer's multi-step speculative sampling at node `u` over its children `kids`.
    /// Accepting a sibling reads single values of the row; a rejection reads whole rows (the
    /// next sibling's residual mass, the residual race), which for logits come from the
    /// probability row where `ops` keeps one ([`TreeOps::with_softmax_probs`]). A sibling's
    /// draft row is asked for when its test comes ([`NodeRows`]).
    fn speculative(&self, u: usize, kids: &[u16], d: Dist<'_>) -> Step {
        let mut drafts: [&[f32]; MAX_TREE_NODES] = [&[]; MAX_TREE_NODES];
        drafts[0] = self.draft(kids[0] as usize);
        if let Dist::Soft(row, sm) = d {
            if self.sibling_accepts(u, kids, &drafts[..1], &[1.0], &d) {
                return Step::Accept(kids[0] as usize);
            }
            let mut step = None;
            self.ops.with_softmax_probs(row, &sm, &mut |p| {
                step = Some(self.speculative_steps(u, kids, &mut drafts, Dist::Probs(p)));
            });
            if let Some(step) = step {
                return step;
            }
        }
        self.speculative_steps(u, kids, &mut drafts, d)
    }

    /// Whether sibling `i = z.len() − 1` passes its test after siblings `0..i` were rejected
    /// (`z`: their masses, `z[0] = 1`; `drafts`: the siblings' draft rows).
    fn sibling_accepts(
        &self,
        u: usize,
        kids: &[u16],
        drafts: &[&[f32]],
        z: &[f64],
        d: &Dist<'_>,
    ) -> bool {
        let i = z.len() - 1;
        let (seed, offset) = (self.batch.seed[self.b], self.batch.offset[self.b]);
        let x = self.batch.token(self.b, kids[i] as usize) as usize;
        let den = z[i] * f64::from(drafts[i][x]);
        let u01 = uniform53(sibling_draw(seed, offset, u as u32, i as u32));
        u01 * den < speculative_residual(d.p(x), &drafts[..i], &z[..i], x)
    }

    /// The siblings' tests in order, then the residual race (or the plain one). `drafts[i]`
    /// is filled before sibling `i`'s test (`drafts[0]` may be already).
    fn speculative_steps(
        &self,
        u: usize,
        kids: &[u16],
        drafts: &mut [&'r [f32]; MAX_TREE_NODES],
        d: Dist<'_>,
    ) -> Step {
        let m = kids.len();
        let mut z = [0f64; MAX_TREE_NODES];
        z[0] = 1.0;
        for i in 0..m {
            if i > 0 {
                drafts[i] = self.draft(kids[i] as usize);
            }
            if self.sibling_accepts(u, kids, &drafts[..=i], &z[..=i], &d) {
                return Step::Accept(kids[i] as usize);
            }
            if i + 1 < m {
                let (q, zs) = (&drafts[..=i], &z[..=i]);
                let mut fixed = 0u128;
                for v in 0..d.len() {
                    fixed =
                        fixed.wrapping_add(residual_fixed(speculative_residual(d.p(v), q, zs, v)));
                }
                z[i + 1] = (fixed as f64) * TWO_M64;
            }
        }
        let drafts = &drafts[..m];
        let residual = match d {
            Dist::Probs(row) if m == 1 => {
                let token = self.batch.token(self.b, kids[0] as usize);
                self.ops
                    .race_residual(self.rng(u), row, Some(drafts[0]), token)
            }
            Dist::Probs(row) => self.ops.race_speculative(self.rng(u), row, drafts, &z[..m]),
            Dist::Soft(..) => race(self.rng(u), d.len(), |v| {
                speculative_residual(d.p(v), drafts, &z[..m], v)
            }),
        };
        Step::Emit(residual.unwrap_or_else(|| d.sample(self.ops, self.rng(u))))
    }

    /// Medusa's typical acceptance on the tree: the deepest node whose path passes, ties to the
    /// first in pre-order. Writes the path and returns (accepted length, the token sampled at
    /// the stopping node).
    fn typical(&self, path: &mut [u32], tokens: &mut [u32]) -> (usize, u32) {
        let mut thr: [Option<f32>; MAX_TREE_NODES] = [None; MAX_TREE_NODES];
        // Each parent's softmax, reduced once for all its children's tests.
        let mut states: [Option<Softmax>; MAX_TREE_NODES] = [None; MAX_TREE_NODES];
        let mut parent = [0u16; MAX_TREE_NODES];
        // (node, its parent, its depth): nodes still to test, in pre-order.
        let mut stack = [(0u16, 0u16, 0u16); MAX_TREE_NODES];
        let mut top = 0usize;
        if let Some(c) = self.batch.first_child(self.b, 0) {
            stack[0] = (c as u16, 0, 1);
            top = 1;
        }
        let (mut best, mut best_depth) = (0usize, 0u16);
        while top > 0 {
            top -= 1;
            let (c, p, dep) = stack[top];
            let (c, p) = (c as usize, p as usize);
            if let Some(s) = self.batch.next_sibling(self.b, c) {
                stack[top] = (s as u16, p as u16, dep);
                top += 1;
            }
            let d = self.dist_kept(p, &mut states);
            let t = *thr[p].get_or_insert_with(|| self.plan.typical_threshold(d.entropy(self.ops)));
            // NaN never passes.
            let passes = d.p(self.batch.token(self.b, c) as usize) > t;
            if !passes {
                continue;
            }
            parent[c] = p as u16;
            if dep > best_depth {
                (best, best_depth) = (c, dep);
            }
            if let Some(f) = self.batch.first_child(self.b, c) {
                // Pushed last: the subtree comes before the next sibling (pre-order).
                stack[top] = (f as u16, c as u16, dep + 1);
                top += 1;
            }
        }
        let n = best_depth as usize;
        let mut x = best;
        for j in (1..=n).rev() {
            path[j] = x as u32;
            tokens[j - 1] = self.batch.token(self.b, x);
            x = parent[x] as usize;
        }
        let d = self.dist_kept(best, &mut states);
        (n, d.sample(self.ops, self.rng(best)))
    }
}

/// Verifies request `b` of a batch that passed [`validate_tree`] (or [`validate_tree_with`]
/// the support of `rows`): writes its `max_depth + 1` path and token slots and returns the
/// accepted length. `ops` supplies the row reductions (argmax, entropy, race, single-residual
/// race), `rows` the rows, each when the walk first needs it ([`F32Rows`]: the binary32 rows
/// as given); the control flow is shared by every CPU-side backend. With target logits at
/// temperature `> 0` each row read is reduced once by [`TreeOps::softmax`] and then read
/// through `ops`' softmax reductions; at temperature 0 the method is greedy on the logits.
pub fn verify_tree_request<O: TreeOps + ?Sized, R: NodeRows + ?Sized>(
    ops: &O,
    rows: &R,
    method: Method,
    batch: &TreeBatch<'_>,
    b: usize,
    path: &mut [u32],
    tokens: &mut [u32],
) -> u32 {
    let plan = batch.plan(b, method);
    let method = plan.method;
    let cx = Ctx {
        ops,
        rows,
        batch,
        b,
        plan,
    };
    path[0] = 0;
    let (accepted, last) = if method == Method::Typical {
        cx.typical(path, tokens)
    } else {
        let mut u = 0usize;
        let mut n = 0usize;
        loop {
            let step = if method == Method::Greedy {
                cx.greedy(u)
            } else {
                cx.rejection(u)
            };
            match step {
                Step::Accept(c) => {
                    n += 1;
                    path[n] = c as u32;
                    tokens[n - 1] = batch.token(b, c);
                    u = c;
                }
                Step::Emit(t) => break (n, t),
            }
        }
    };
    tokens[accepted] = last;
    for x in &mut tokens[accepted + 1..] {
        *x = SENTINEL;
    }
    for x in &mut path[accepted + 1..] {
        *x = SENTINEL;
    }
    accepted as u32
}

/// The reference tree verifier: validates everything ([`validate_tree`]), then verifies each
/// request in order with the plain-loop [`ScalarOps`] and records it in `counters`:
/// `record_tree(depth, n − 1, accepted)`, a chain of the tree's depth (`drafts`,
/// `accepted_tokens`, `emitted_tokens` and the per-position counts are the per-depth counts;
/// `draft_tokens` adds the depth, not the node count) plus `tree_drafts` (1) and
/// `tree_draft_tokens` (the `n − 1` draft nodes). A tree of the root alone (depth 0) is not
/// counted, as a chain with `k = 0`. Nothing is counted (and `out` is untouched) on error.
pub fn verify_tree_batch<const K: usize>(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    out: &mut TreeOutputs<'_>,
    counters: &mut Counters<K>,
) -> Result<(), VerifyError> {
    validate_tree::<K>(method, check, batch, out)?;
    // Device outputs were refused by the validation above.
    let (AcceptedOut(accepted), PathOut(path), TokensOut(tokens)) = out.host()?;
    let width = batch.max_depth + 1;
    for (b, ((acc, path), tokens)) in accepted
        .iter_mut()
        .zip(path.chunks_exact_mut(width))
        .zip(tokens.chunks_exact_mut(width))
        .enumerate()
    {
        *acc = verify_tree_request(&ScalarOps, &F32Rows, method, batch, b, path, tokens);
        let depth = tree_depth(batch, b);
        if depth > 0 {
            let nodes = batch.node_count(b) - 1;
            let recorded = counters.record_tree(depth, nodes, *acc as usize);
            // Validated: depth ≤ max_depth ≤ K, the path is at most the depth, and every depth
            // up to the deepest holds a node.
            debug_assert!(recorded.is_ok());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
