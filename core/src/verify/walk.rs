//! The one walk of verification. A chain's draft positions are a tree whose node `j` has the
//! one child `j + 1` (token `x_j`, target row `j`), so chains and token trees are verified by
//! the same per-node rules here (`core/DETERMINISM.md`, "Token trees": a chain-shaped tree gives
//! the chain's bits because they are one walk). [`verify_request`](super::verify_request) and
//! [`verify_tree_request`](super::tree::verify_tree_request) only say, through [`Shape`], where
//! a request's links, tokens and rows are.

use super::reference::argmax_by;
use super::{Method, Processed, RaceRng, RequestPlan, RowOps, Softmax, Values, race};
use crate::verify::exponential::uniform53;
use crate::verify::fmath::entropy_by;
use crate::verify::philox::{STREAM_ACCEPT, counter, key, philox4x32_10};

/// The most children a node may have, and the most nodes of a tree (root included). SGLang's
/// EAGLE trees use up to 64 draft tokens, Medusa's up to 64 paths; the limit keeps the walk's
/// per-node scratch (a few arrays of this length) on the stack. A chain's node has one child,
/// so a chain is not bounded by it.
pub const MAX_TREE_NODES: usize = 512;

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

/// A draft row as the residuals read it: [`Values`] in any format, or the binary32 slices of
/// rows that all are (the loops over them then index slices).
trait DraftRow: Copy {
    /// The draft probability of id `v`.
    fn at(&self, v: usize) -> f32;
}

impl DraftRow for &[f32] {
    #[inline]
    fn at(&self, v: usize) -> f32 {
        self[v]
    }
}

impl DraftRow for Values<'_> {
    #[inline]
    fn at(&self, v: usize) -> f32 {
        Values::at(self, v)
    }
}

/// No draft row: what the walk's scratch holds before a sibling's row is asked for (a read of
/// it is out of bounds).
const NO_ROW: Values<'static> = Values::F32(&[]);

/// Writes the binary32 slices of `drafts` into `out` and returns them, `None` if one is not
/// binary32.
fn binary32<'q, 'o>(
    drafts: &[Values<'q>],
    out: &'o mut [&'q [f32]; MAX_TREE_NODES],
) -> Option<&'o [&'q [f32]]> {
    for (q, o) in drafts.iter().zip(out.iter_mut()) {
        let Values::F32(q) = *q else { return None };
        *o = q;
    }
    Some(&out[..drafts.len()])
}

/// SpecInfer's residual weight of id `v` whose target probability is `p`, after the siblings
/// whose draft rows are `drafts` were rejected with masses `z` (`z[0] = 1`, one per row):
/// `p` in binary64, less `z[j]·drafts[j][v]` for each `j` in order, a result that is not `> 0`
/// (NaN included) becoming 0 after each step.
#[inline]
#[must_use]
pub fn speculative_residual(p: f32, drafts: &[&[f32]], z: &[f64], v: usize) -> f64 {
    residual(p, drafts, z, v)
}

#[inline]
fn residual<D: DraftRow>(p: f32, drafts: &[D], z: &[f64], v: usize) -> f64 {
    let mut r = f64::from(p);
    for (q, &zj) in drafts.iter().zip(z) {
        r -= zj * f64::from(q.at(v));
        r = if r > 0.0 { r } else { 0.0 };
    }
    r
}

/// The weight of id `v` in the target-only rule's residual race after the siblings `tried` were
/// rejected: `(row[v] as f64) − 1.0` if `v` is one of `tried` (once, however often it appears),
/// else `row[v] as f64`. [`RowOps::race_excluding`] races over it; an implementation that
/// computes the weights another way uses this for the exact value of one id.
#[inline]
#[must_use]
pub fn excluding_weight(row: &[f32], tried: &[u32], v: usize) -> f64 {
    f64::from(row[v]) - hit(tried, v)
}

/// `1.0` if `v` is one of `tried`, else `0.0`.
#[inline]
pub(super) fn hit(tried: &[u32], v: usize) -> f64 {
    if tried.iter().any(|&t| t as usize == v) {
        1.0
    } else {
        0.0
    }
}

/// The 64-bit acceptance draw of the sibling of rank `rank` among the children of `node`:
/// Philox stream 0, counter `[rank, node << 2, offset]`, words 0 (high) and 1 (low). Rank 0 is
/// the chain's acceptance draw at position `node`.
#[inline]
#[must_use]
pub fn sibling_draw(seed: u64, offset: u64, node: u32, rank: u32) -> u64 {
    let w = philox4x32_10(counter(rank, node, STREAM_ACCEPT, offset), key(seed));
    (u64::from(w[0]) << 32) | u64::from(w[1])
}

/// The fixed-point residual mass `Σ_v residual_fixed(w_v)` (times `2⁻⁶⁴`) after the siblings
/// with draft rows `q` and masses `z` were rejected: the next sibling's `z`.
fn residual_mass(d: &Dist<'_>, q: &[Values<'_>], z: &[f64]) -> f64 {
    fn sum<D: DraftRow>(d: &Dist<'_>, q: &[D], z: &[f64]) -> f64 {
        let mut fixed = 0u128;
        for v in 0..d.len() {
            fixed = fixed.wrapping_add(residual_fixed(residual(d.p(v), q, z, v)));
        }
        (fixed as f64) * TWO_M64
    }
    match binary32(q, &mut [&[]; MAX_TREE_NODES]) {
        Some(rows) => sum(d, rows, z),
        None => sum(d, q, z),
    }
}

/// A node's target distribution, as the rules read it.
#[derive(Clone, Copy)]
pub(super) enum Dist<'r> {
    /// Stored binary32 values (probabilities, or logits read greedily), reduced by the caller's
    /// [`RowOps`].
    Probs(&'r [f32]),
    /// A binary32 logits row through its softmax, reduced by the ops' softmax reductions.
    Soft(&'r [f32], Softmax),
    /// A row in any format through its [`Processed`] form (softmax, filter), reduced by plain
    /// loops computed on the fly (the reference needs no buffer).
    Processed(Values<'r>, Processed),
}

impl Dist<'_> {
    /// The probability of id `v`.
    #[inline]
    fn p(&self, v: usize) -> f32 {
        match self {
            Self::Probs(r) => r[v],
            Self::Soft(r, sm) => sm.p(r[v]),
            Self::Processed(r, pr) => pr.p(r.at(v)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Probs(r) | Self::Soft(r, _) => r.len(),
            Self::Processed(r, _) => r.len(),
        }
    }

    /// The argmax (NaN as −∞, ties to the lowest id).
    fn argmax<O: RowOps + ?Sized>(&self, ops: &O) -> u32 {
        match self {
            Self::Probs(r) => ops.argmax(r),
            Self::Soft(r, sm) => ops.softmax_argmax(r, sm),
            Self::Processed(..) => argmax_by(self.len(), |v| self.p(v)),
        }
    }

    fn entropy<O: RowOps + ?Sized>(&self, ops: &O) -> f32 {
        match self {
            Self::Probs(r) => ops.entropy(r),
            Self::Soft(r, sm) => ops.softmax_entropy(r, sm),
            Self::Processed(..) => entropy_by(self.len(), |v| self.p(v)),
        }
    }

    /// The plain race over the distribution, `0` when no value is `> 0`.
    fn sample<O: RowOps + ?Sized>(&self, ops: &O, rng: RaceRng) -> u32 {
        match self {
            Self::Probs(r) => ops.race(rng, r),
            Self::Soft(r, sm) => ops.softmax_race(rng, r, sm, &[]),
            Self::Processed(..) => race(rng, self.len(), |v| f64::from(self.p(v))),
        }
        .unwrap_or(0)
    }

    /// The target-only rule's residual race after the siblings with tokens `tried` were
    /// rejected (`tried` not empty).
    fn race_excluding<O: RowOps + ?Sized>(
        &self,
        ops: &O,
        rng: RaceRng,
        tried: &[u32],
    ) -> Option<u32> {
        match self {
            Self::Probs(r) if tried.len() == 1 => ops.race_residual(rng, r, None, tried[0]),
            Self::Probs(r) => ops.race_excluding(rng, r, tried),
            Self::Soft(r, sm) => ops.softmax_race(rng, r, sm, tried),
            Self::Processed(..) => race(rng, self.len(), |v| f64::from(self.p(v)) - hit(tried, v)),
        }
    }
}

/// Where the walk reads one request: its links, tokens and rows. Node 0 is the root; every
/// other node holds a draft token and was proposed from its parent's row.
pub(super) trait Shape<'r> {
    /// Node `u`'s first child.
    fn first_child(&self, u: usize) -> Option<usize>;
    /// Node `c`'s next sibling.
    fn next_sibling(&self, c: usize) -> Option<usize>;
    /// Node `c`'s parent (`c ≥ 1`).
    fn parent(&self, c: usize) -> usize;
    /// Node `c`'s token (`c ≥ 1`).
    fn token(&self, c: usize) -> u32;
    /// Node `u`'s target distribution, reduced now (its softmax, its filter).
    fn dist<O: RowOps + ?Sized>(&self, ops: &O, u: usize) -> Dist<'r>;
    /// Node `u`'s row and temperature where [`dist`](Self::dist) reduces it through
    /// [`RowOps::softmax`] (binary32 logits at `t > 0`), before it does.
    fn logits(&self, u: usize) -> Option<(&'r [f32], f32)> {
        let _ = u;
        None
    }
    /// The draft row that proposed node `c`'s token (`c ≥ 1`), `None` for a one-hot drafter.
    fn draft(&self, c: usize) -> Option<Values<'r>>;
    /// The caller's token for a walk that stops at a leaf (a chain's bonus tokens), if any.
    fn bonus(&self) -> Option<u32>;
}

/// What one node's test decided.
enum Step {
    /// Move to this child.
    Accept(usize),
    /// Stop here and emit this token.
    Emit(u32),
}

/// One request's verification: the rules of `plan` applied node by node.
pub(super) struct Walk<'o, O: ?Sized, S> {
    /// The row reductions.
    pub ops: &'o O,
    /// The request.
    pub shape: S,
    /// How the request is verified.
    pub plan: RequestPlan,
    /// The request's stream: seed.
    pub seed: u64,
    /// The request's stream: offset.
    pub offset: u64,
}

impl<'r, O: RowOps + ?Sized, S: Shape<'r>> Walk<'_, O, S> {
    /// Walks the request from the root: calls `keep(depth, node)` for each accepted node
    /// (depths `1..=n`) and returns `n` and the token emitted after them.
    pub fn run(&self, mut keep: impl FnMut(usize, usize)) -> (usize, u32) {
        if self.plan.method == Method::Typical {
            return self.typical(&mut keep);
        }
        let (mut u, mut n) = (0usize, 0usize);
        loop {
            let step = match (self.shape.first_child(u), self.shape.bonus()) {
                (None, Some(t)) => Step::Emit(t),
                _ if self.plan.method == Method::Greedy => self.greedy(u),
                _ => self.rejection(u, true),
            };
            match step {
                Step::Accept(c) => {
                    n += 1;
                    keep(n, c);
                    u = c;
                }
                Step::Emit(t) => return (n, t),
            }
        }
    }

    /// The token emitted at node `u` (which has children) if every child is rejected, whether
    /// or not the walk reaches `u` (vLLM's `recovered_token_ids` of a chain): rejection
    /// sampling's residual race (its fallback as in the walk), greedy's argmax, typical
    /// acceptance's race.
    pub fn recovered(&self, u: usize) -> u32 {
        match self.plan.method {
            Method::Rejection => match self.rejection(u, false) {
                Step::Emit(t) => t,
                // No test runs, so no child is accepted.
                Step::Accept(_) => unreachable!("a rejection without tests accepts nothing"),
            },
            Method::Greedy => self.shape.dist(self.ops, u).argmax(self.ops),
            Method::Typical => self.shape.dist(self.ops, u).sample(self.ops, self.rng(u)),
        }
    }

    fn rng(&self, u: usize) -> RaceRng {
        RaceRng {
            seed: self.seed,
            offset: self.offset,
            position: u as u32,
        }
    }

    /// Node `u`'s children in sibling order, written into `out`; returns how many.
    fn children(&self, u: usize, out: &mut [u32; MAX_TREE_NODES]) -> usize {
        let mut m = 0;
        let mut c = self.shape.first_child(u);
        while let Some(x) = c {
            out[m] = x as u32;
            m += 1;
            c = self.shape.next_sibling(x);
        }
        m
    }

    /// Greedy: follow the first child whose token is the argmax, else emit the argmax.
    fn greedy(&self, u: usize) -> Step {
        let a = self.shape.dist(self.ops, u).argmax(self.ops);
        let mut c = self.shape.first_child(u);
        while let Some(x) = c {
            if self.shape.token(x) == a {
                return Step::Accept(x);
            }
            c = self.shape.next_sibling(x);
        }
        Step::Emit(a)
    }

    /// Rejection sampling at node `u`: SpecInfer's rule with draft rows, else the target-only
    /// rule (one uniform against the cumulative mass of the siblings' distinct tokens). A leaf
    /// emits the race over its row. Without `test`, every child is taken as rejected.
    fn rejection(&self, u: usize, test: bool) -> Step {
        let mut kids = [0u32; MAX_TREE_NODES];
        let m = self.children(u, &mut kids);
        let kids = &kids[..m];
        if let (true, Some(&first)) = (test, kids.first()) {
            if self.first_passes(u, first) {
                return Step::Accept(first as usize);
            }
        }
        let d = self.shape.dist(self.ops, u);
        let Some(&first) = kids.first() else {
            return Step::Emit(d.sample(self.ops, self.rng(u)));
        };
        if let Some(q0) = self.shape.draft(first as usize) {
            return self.speculative(u, kids, d, q0, test);
        }
        let token = |c: u32| self.shape.token(c as usize);
        if test {
            let u01 = uniform53(sibling_draw(self.seed, self.offset, u as u32, 0));
            let mut cum = 0f64;
            for (i, &kid) in kids.iter().enumerate() {
                let x = token(kid);
                if kids[..i].iter().any(|&j| token(j) == x) {
                    continue;
                }
                cum += f64::from(d.p(x as usize));
                if u01 < cum {
                    return Step::Accept(kid as usize);
                }
            }
        }
        let mut tried = [0u32; MAX_TREE_NODES];
        for (t, &c) in tried.iter_mut().zip(kids) {
            *t = token(c);
        }
        let residual = d.race_excluding(self.ops, self.rng(u), &tried[..m]);
        Step::Emit(residual.unwrap_or_else(|| d.sample(self.ops, self.rng(u))))
    }

    /// Whether node `u`'s first child `first` passes the test the rules run first, decided by
    /// the ops without reducing the node's logits row ([`RowOps::softmax_passes`]): SpecInfer's
    /// `U·q(x) < p(x)` (`z₀ = 1`, no residual before it) or, without draft rows, the target-only
    /// rule's `U < p(x)` (the cumulative mass of the first distinct token). `false`: not decided.
    fn first_passes(&self, u: usize, first: u32) -> bool {
        let Some((row, t)) = self.shape.logits(u) else {
            return false;
        };
        let x = self.shape.token(first as usize) as usize;
        let den = self
            .shape
            .draft(first as usize)
            .map_or(1.0, |q| f64::from(q.at(x)));
        let u01 = uniform53(sibling_draw(self.seed, self.offset, u as u32, 0));
        self.ops
            .softmax_passes(row, t, x, &mut |p| u01 * den < f64::from(p))
    }

    /// SpecInfer's multi-step speculative sampling at node `u` over its children `kids`
    /// (`q0`: the first one's draft row). Accepting a sibling reads single values of the row;
    /// a rejection reads whole rows (the next sibling's residual mass, the residual race),
    /// which for logits come from the probability row where `ops` keeps one
    /// ([`RowOps::with_softmax_probs`]). A sibling's draft row is asked for when its test comes.
    fn speculative(&self, u: usize, kids: &[u32], d: Dist<'_>, q0: Values<'r>, test: bool) -> Step {
        if let Dist::Soft(row, sm) = d {
            if test && self.sibling_accepts(u, kids, &[q0], &[1.0], &d) {
                return Step::Accept(kids[0] as usize);
            }
            let mut step = None;
            self.ops.with_softmax_probs(row, &sm, &mut |p| {
                step = Some(self.speculative_steps(u, kids, q0, Dist::Probs(p), test));
            });
            if let Some(step) = step {
                return step;
            }
        }
        self.speculative_steps(u, kids, q0, d, test)
    }

    /// Whether sibling `i = z.len() − 1` passes its test after siblings `0..i` were rejected
    /// (`z`: their masses, `z[0] = 1`; `drafts`: the siblings' draft rows).
    fn sibling_accepts(
        &self,
        u: usize,
        kids: &[u32],
        drafts: &[Values<'r>],
        z: &[f64],
        d: &Dist<'_>,
    ) -> bool {
        let i = z.len() - 1;
        let x = self.shape.token(kids[i] as usize) as usize;
        let den = z[i] * f64::from(drafts[i].at(x));
        let u01 = uniform53(sibling_draw(self.seed, self.offset, u as u32, i as u32));
        u01 * den < residual(d.p(x), &drafts[..i], &z[..i], x)
    }

    /// The siblings' tests in order (with `test`), then the residual race (or the plain one).
    fn speculative_steps(
        &self,
        u: usize,
        kids: &[u32],
        q0: Values<'r>,
        d: Dist<'_>,
        test: bool,
    ) -> Step {
        if let [only] = *kids {
            // A chain's node: no scratch for further siblings.
            if test && self.sibling_accepts(u, kids, &[q0], &[1.0], &d) {
                return Step::Accept(only as usize);
            }
            return Step::Emit(self.speculative_race(u, kids, &[q0], &[1.0], &d));
        }
        let m = kids.len();
        let mut drafts = [NO_ROW; MAX_TREE_NODES];
        drafts[0] = q0;
        let mut z = [0f64; MAX_TREE_NODES];
        z[0] = 1.0;
        for i in 0..m {
            if i > 0 {
                // Validated: every node of a batch with draft rows has one.
                drafts[i] = self.shape.draft(kids[i] as usize).unwrap_or(NO_ROW);
            }
            if test && self.sibling_accepts(u, kids, &drafts[..=i], &z[..=i], &d) {
                return Step::Accept(kids[i] as usize);
            }
            if i + 1 < m {
                z[i + 1] = residual_mass(&d, &drafts[..=i], &z[..=i]);
            }
        }
        Step::Emit(self.speculative_race(u, kids, &drafts[..m], &z[..m], &d))
    }

    /// The residual race after every sibling was rejected, else the plain race.
    fn speculative_race(
        &self,
        u: usize,
        kids: &[u32],
        drafts: &[Values<'r>],
        z: &[f64],
        d: &Dist<'_>,
    ) -> u32 {
        let rng = self.rng(u);
        let plain = || race(rng, d.len(), |v| residual(d.p(v), drafts, z, v));
        let residual = match (*d, drafts) {
            (Dist::Probs(row), [Values::F32(q)]) => {
                let token = self.shape.token(kids[0] as usize);
                self.ops.race_residual(rng, row, Some(q), token)
            }
            (Dist::Probs(row), _) => match binary32(drafts, &mut [&[]; MAX_TREE_NODES]) {
                Some(q) => self.ops.race_speculative(rng, row, q, z),
                None => plain(),
            },
            _ => plain(),
        };
        residual.unwrap_or_else(|| d.sample(self.ops, rng))
    }

    /// Medusa's typical acceptance: the deepest node whose path passes, ties to the first in
    /// pre-order. Passing nodes are expanded in pre-order, each reducing its row once for all
    /// its children's tests, so nodes of one depth are tested in pre-order. Calls `keep` for
    /// the path and returns (accepted length, the token sampled at the stopping node).
    fn typical(&self, keep: &mut impl FnMut(usize, usize)) -> (usize, u32) {
        // (node, depth): passing nodes still to expand, the next on top.
        let mut stack = [(0u32, 0u32); MAX_TREE_NODES];
        let mut top = 1usize;
        let (mut best, mut best_depth) = (0usize, 0u32);
        // The best node's row, if it was reduced for its children's tests.
        let mut kept: Option<(usize, Dist<'r>)> = None;
        while top > 0 {
            top -= 1;
            let (p, depth) = stack[top];
            let p = p as usize;
            let Some(first) = self.shape.first_child(p) else {
                continue;
            };
            let d = self.shape.dist(self.ops, p);
            if p == best {
                kept = Some((p, d));
            }
            let t = self.plan.typical_threshold(d.entropy(self.ops));
            let start = top;
            let mut c = Some(first);
            while let Some(x) = c {
                // NaN never passes.
                if d.p(self.shape.token(x) as usize) > t {
                    if depth + 1 > best_depth {
                        (best, best_depth) = (x, depth + 1);
                    }
                    stack[top] = (x as u32, depth + 1);
                    top += 1;
                }
                c = self.shape.next_sibling(x);
            }
            // The first passing child on top: its subtree comes before its next sibling's.
            stack[start..top].reverse();
        }
        let mut x = best;
        for j in (1..=best_depth as usize).rev() {
            keep(j, x);
            x = self.shape.parent(x);
        }
        let last = match (self.shape.first_child(best), self.shape.bonus(), kept) {
            (None, Some(t), _) => t,
            (_, _, Some((u, d))) if u == best => d.sample(self.ops, self.rng(best)),
            _ => self
                .shape
                .dist(self.ops, best)
                .sample(self.ops, self.rng(best)),
        };
        (best_depth as usize, last)
    }
}
