//! A chain request's walk ([`verify_request`], [`recovered_at`]), the softmax and processing
//! of a row, and the plain-loop row reductions ([`ScalarOps`]) that define the reference bits.

use super::walk::{Dist, Shape, Walk, excluding_weight, hit, speculative_residual};
use super::{Batch, Cut, Filter, Method, RequestPlan, SENTINEL, Values, WeightRow};
use crate::verify::exponential::{draw, exponential};
use crate::verify::fmath::{entropy, entropy_by, exp_p};
use crate::verify::philox::{race_words, race_words_lo};

/// Where a row's race draws its uniforms: the request's stream at a draft position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaceRng {
    /// The request's seed.
    pub seed: u64,
    /// The request's offset.
    pub offset: u64,
    /// The row's draft position `j` (`0..=k`).
    pub position: u32,
}

impl RaceRng {
    /// The four race high words (stream 1) for vocabulary ids `4·group .. 4·group + 4`.
    #[inline(always)]
    #[must_use]
    pub fn words(&self, group: u32) -> [u32; 4] {
        race_words(self.seed, self.offset, self.position, group)
    }

    /// The four race low words (stream 2) for the same ids as [`words`](Self::words).
    #[inline(always)]
    #[must_use]
    pub fn words_lo(&self, group: u32) -> [u32; 4] {
        race_words_lo(self.seed, self.offset, self.position, group)
    }
}

/// The race key of weight `w` with the 64-bit race draw `x`: `w / E` with
/// `E = exponential(x)` (`core/DETERMINISM.md`, "Random variates"; never 0 or `+∞`, so the
/// key is positive, or `+∞` only for `w = +∞`), and `−1` (below every candidate) when `w` is
/// not `> 0`.
#[inline(always)]
#[must_use]
pub fn race_key(w: f64, x: u64) -> f64 {
    if w > 0.0 { w / exponential(x) } else { -1.0 }
}

/// Exponential race over the weights `w(v)`, `v < vocab` (in `f64`; see [`race_residual`] for
/// how a residual is formed): the id with the largest key, ties to the lowest id; `None` if no
/// weight is `> 0`.
#[inline]
pub fn race(rng: RaceRng, vocab: usize, mut w: impl FnMut(usize) -> f64) -> Option<u32> {
    let mut best_key = -1.0f64;
    let mut best = None;
    let mut v = 0usize;
    let mut group = 0u32;
    while v < vocab {
        let words = rng.words(group);
        let lo = rng.words_lo(group);
        for (hi, lo) in words.into_iter().zip(lo) {
            if v >= vocab {
                break;
            }
            let key = race_key(w(v), draw(hi, lo));
            // Strict `>`: a later (higher) id never displaces an equal key.
            if key > best_key {
                best_key = key;
                best = Some(v as u32);
            }
            v += 1;
        }
        group = group.wrapping_add(1);
    }
    best
}

/// Argmax of a row, NaN as `−∞`, ties (IEEE equality, so `−0 = +0`) to the lowest id; 0 for a
/// row with no value above `−∞`.
#[inline]
#[must_use]
pub fn argmax(row: &[f32]) -> u32 {
    argmax_by(row.len(), |v| row[v])
}

/// [`argmax`] of the row whose value at `v < len` is `p(v)` (a row computed on the fly).
#[inline]
pub(crate) fn argmax_by(len: usize, mut p: impl FnMut(usize) -> f32) -> u32 {
    let mut best = 0u32;
    let mut best_key = f32::NEG_INFINITY;
    for v in 0..len {
        let x = p(v);
        // NaN compares false, so it never wins: it acts as −∞.
        if x > best_key {
            best_key = x;
            best = v as u32;
        }
    }
    best
}

/// The residual race of rejection sampling: weights `target(v) − draft(v)`, both converted to
/// `f64` first (one `f64` subtraction, exact unless the two differ by more than 2²⁹ in
/// magnitude; a one-hot draft is `1.0` at its token, `0.0` elsewhere). `w > 0` exactly when
/// `target(v) > draft(v)`.
#[inline]
pub fn race_residual(
    rng: RaceRng,
    target: &[f32],
    draft: Option<&[f32]>,
    token: u32,
) -> Option<u32> {
    match draft {
        Some(d) => race(rng, target.len(), |v| {
            f64::from(target[v]) - f64::from(d[v])
        }),
        None => race(rng, target.len(), |v| {
            f64::from(target[v]) - if v == token as usize { 1.0 } else { 0.0 }
        }),
    }
}

/// `2⁶⁴` as `f64`, the fixed-point scale of the softmax sum.
const TWO_64: f64 = 18_446_744_073_709_551_616.0;
/// `2⁻⁶⁴`.
const TWO_M64: f64 = 1.0 / TWO_64;

/// The softmax of one logits row at temperature `t > 0`, as `core/DETERMINISM.md` defines it:
/// `z_v = l_v / t` (binary32), `m` = the largest `z_v` (NaN ignored), `e_v = exp_p(z_v − m)`,
/// `S` = the exact integer sum of `⌊e_v · 2⁶⁴⌋` (u128, any order) times `2⁻⁶⁴` (binary64),
/// `p_v = (e_v / S)` rounded to binary32 (`0` for every id when `S = 0`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Softmax {
    t: f32,
    max: f32,
    sum: f64,
}

impl Softmax {
    /// The softmax state of `row` at temperature `t` (two passes: the maximum, the sum).
    #[must_use]
    pub fn of(row: &[f32], t: f32) -> Self {
        let mut max = f32::NEG_INFINITY;
        for &l in row {
            max = softmax_max(max, l / t);
        }
        let mut fixed = 0u128;
        for &l in row {
            fixed = fixed.wrapping_add(softmax_fixed(softmax_exp(l, t, max)));
        }
        Self::from_parts(t, max, fixed)
    }

    /// The state from a row's maximum `z` and its fixed-point sum, however they were reduced.
    #[must_use]
    pub fn from_parts(t: f32, max: f32, fixed: u128) -> Self {
        Self {
            t,
            max,
            sum: (fixed as f64) * TWO_M64,
        }
    }

    /// The temperature `t` this state is of.
    #[must_use]
    pub const fn temperature(&self) -> f32 {
        self.t
    }

    /// `p` of the id whose logit is `l`.
    #[inline]
    #[must_use]
    pub fn p(&self, l: f32) -> f32 {
        if self.sum == 0.0 {
            0.0
        } else {
            (f64::from(softmax_exp(l, self.t, self.max)) / self.sum) as f32
        }
    }
}

/// The running maximum of the softmax: `z` replaces `max` iff `z > max` (NaN never does). The
/// sign of a zero maximum does not matter (`z − (±0)` is the same value).
#[inline(always)]
#[must_use]
pub fn softmax_max(max: f32, z: f32) -> f32 {
    if z > max { z } else { max }
}

/// `e = exp_p(l / t − max)`, in `[0, 1]`.
#[inline(always)]
#[must_use]
pub fn softmax_exp(l: f32, t: f32, max: f32) -> f32 {
    exp_p(l / t - max)
}

/// `⌊e · 2⁶⁴⌋` (binary64 product, exact; truncation), the fixed-point term of the softmax sum.
#[inline(always)]
#[must_use]
pub fn softmax_fixed(e: f32) -> u128 {
    (f64::from(e) * TWO_64) as u128
}

/// How one stored target row becomes the probability row a method reads
/// (`core/DETERMINISM.md`: softmax, sampling filters, renormalisation).
///
/// * logits at `T > 0`: `p_v = Cut::p(e_v)` with `e_v` the softmax's `exp_p(l_v/T − m)` and the
///   [`Cut`] of those weights by the request's [`Filter`] (no filter: the plain softmax);
/// * probabilities with an active filter: `p_v = Cut::p(row_v)`;
/// * otherwise (probabilities without a filter, logits at `T = 0`): the stored values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Processed {
    kind: Kind,
    cut: Cut,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Identity,
    Probs,
    Logits { t: f32, max: f32 },
}

impl Processed {
    /// The processing of `row` for a request with temperature `t` (`None`: probabilities) and
    /// `filter`.
    #[must_use]
    pub fn of(row: Values<'_>, t: Option<f32>, filter: Filter) -> Self {
        let none = Cut {
            threshold: 0,
            fixed: 0,
        };
        match t {
            Some(t) if t > 0.0 => {
                let mut max = f32::NEG_INFINITY;
                row.for_each(|l| max = softmax_max(max, l / t));
                let cut = Cut::of(&SoftmaxWeights { row, t, max }, filter);
                Self {
                    kind: Kind::Logits { t, max },
                    cut,
                }
            }
            None if filter.is_active() => Self {
                kind: Kind::Probs,
                cut: Cut::of(&row, filter),
            },
            _ => Self {
                kind: Kind::Identity,
                cut: none,
            },
        }
    }

    /// The probability of the id whose stored value is `x`.
    #[inline]
    #[must_use]
    pub fn p(&self, x: f32) -> f32 {
        match self.kind {
            Kind::Identity => x,
            Kind::Probs => self.cut.p(x),
            Kind::Logits { t, max } => self.cut.p(softmax_exp(x, t, max)),
        }
    }
}

/// The softmax weights `e_v = exp_p(l_v / t − max)` of a logits row.
struct SoftmaxWeights<'a> {
    row: Values<'a>,
    t: f32,
    max: f32,
}

impl WeightRow for SoftmaxWeights<'_> {
    fn for_each_weight(&self, mut f: impl FnMut(f32)) {
        self.row.for_each(|l| f(softmax_exp(l, self.t, self.max)));
    }
}

impl WeightRow for Values<'_> {
    fn for_each_weight(&self, f: impl FnMut(f32)) {
        self.for_each(f);
    }
}

/// A chain request as the [`Walk`] reads it: node `j` is draft position `j` (target row `j`),
/// its one child `j + 1` holds draft token `x_j`, proposed from draft row `j`. A
/// [plain](super::RequestPlan::plain) request's stored binary32 rows go to the caller's
/// [`RowOps`]; any other request's [`Processed`] rows (the draft rows in any format) to plain
/// loops.
struct Chain<'a, 'r> {
    batch: &'a Batch<'r>,
    b: usize,
    ids: &'a [u32],
    plan: RequestPlan,
}

impl<'r> Shape<'r> for Chain<'_, 'r> {
    fn first_child(&self, u: usize) -> Option<usize> {
        (u < self.ids.len()).then_some(u + 1)
    }

    fn next_sibling(&self, _: usize) -> Option<usize> {
        None
    }

    fn parent(&self, c: usize) -> usize {
        c - 1
    }

    fn token(&self, c: usize) -> u32 {
        self.ids[c - 1]
    }

    fn dist<O: RowOps + ?Sized>(&self, _: &O, u: usize) -> Dist<'r> {
        // Validated: the row is inside the tensor (and binary32 for a plain request).
        let row = self
            .batch
            .target_values_checked(self.b, u)
            .unwrap_or(Values::F32(&[]));
        match row {
            Values::F32(x) if self.plan.plain => Dist::Probs(x),
            _ => Dist::Processed(
                row,
                Processed::of(row, self.plan.temperature, self.plan.filter),
            ),
        }
    }

    fn draft(&self, c: usize) -> Option<Values<'r>> {
        self.batch.draft_values_checked(self.b, c - 1)
    }

    fn bonus(&self) -> Option<u32> {
        self.batch.bonus.map(|x| x[self.b])
    }
}

/// Request `b`'s walk.
fn chain<'a, 'r, O: RowOps + ?Sized>(
    ops: &'a O,
    method: Method,
    batch: &'a Batch<'r>,
    b: usize,
) -> Walk<'a, O, Chain<'a, 'r>> {
    let plan = batch.plan(b, method);
    Walk {
        ops,
        shape: Chain {
            batch,
            b,
            // Validated: inside the slice.
            ids: batch.draft_ids_checked(b).unwrap_or(&[]),
            plan,
        },
        plan,
        seed: batch.seed[b],
        offset: batch.offset[b],
    }
}

/// The token request `b` emits if its draft position `j < k_b` is the first rejected one
/// (vLLM's `recovered_token_ids`), whether or not it is reached: rejection sampling, the
/// residual race at position `j` (its fallback as in [`verify_request`]); greedy, the argmax
/// of row `j`; typical acceptance, the race over row `j`. Target logits as in
/// [`verify_request`]. Only for a validated batch and `j < k_b`.
pub fn recovered_at<O: RowOps + ?Sized>(
    ops: &O,
    method: Method,
    batch: &Batch<'_>,
    b: usize,
    j: usize,
) -> u32 {
    chain(ops, method, batch, b).recovered(j)
}

/// The row reductions of the verification rules: the four every walk uses (argmax, entropy,
/// race, residual race), the residual races after several siblings of a tree were rejected,
/// and the same reductions over the softmax of a binary32 logits row. Every implementation must
/// return the same values as [`ScalarOps`] (the required four) and the defaults (the rest)
/// for every input (NaN, infinities, negative values and values above 1 included); the rules
/// make each reduction independent of evaluation order, so chunked, vectorised or parallel
/// versions can.
pub trait RowOps {
    /// [`argmax`] of `row` (exactly `V` values).
    fn argmax(&self, row: &[f32]) -> u32;
    /// [`entropy`](crate::verify::fmath::entropy) of `row`.
    fn entropy(&self, row: &[f32]) -> f32;
    /// [`race`] over the row's values.
    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32>;
    /// [`race_residual`].
    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32>;

    /// The race over `w_v = (row[v] as f64) − (1.0 if v is one of `tried` else 0.0)` (each
    /// token subtracted once, however often it appears in `tried`): the target-only rule's
    /// residual race after several siblings of a tree were rejected.
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

    /// The softmax of the logits `row` at temperature `t > 0`: [`Softmax::of`]. Verification
    /// reduces each binary32 logits row it reads once with this and hands that state to the
    /// `softmax_*` reductions of the same row, so an implementation may keep what it computed
    /// for the state (the row's weights) for the reductions that follow.
    fn softmax(&self, row: &[f32], t: f32) -> Softmax {
        Softmax::of(row, t)
    }

    /// The argmax of the probabilities `p_v = sm.p(row[v])` (`sm`: this row's
    /// [`softmax`](Self::softmax)), NaN as `−∞`, ties to the lowest id; 0 for a row with no
    /// value above `−∞`.
    fn softmax_argmax(&self, row: &[f32], sm: &Softmax) -> u32 {
        argmax_by(row.len(), |v| sm.p(row[v]))
    }

    /// The entropy of the probabilities `p_v = sm.p(row[v])`, as [`entropy`](Self::entropy)
    /// of that row.
    fn softmax_entropy(&self, row: &[f32], sm: &Softmax) -> f32 {
        entropy_by(row.len(), |v| sm.p(row[v]))
    }

    /// Whether the softmax probability `p` of id `x` of the binary32 logits row `row` at
    /// temperature `t > 0` passes `test`, decided without the row's exact reduction: `true`
    /// only where a value `lo ≤ p` passes it (`test` is monotone: a value that passes makes
    /// every larger one pass), so the verdict is the one `p` gets. `false` decides nothing (the
    /// caller reduces the row); the default, which bounds nothing.
    fn softmax_passes(
        &self,
        row: &[f32],
        t: f32,
        x: usize,
        test: &mut dyn FnMut(f32) -> bool,
    ) -> bool {
        let _ = (row, t, x, test);
        false
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
        race(rng, row.len(), |v| f64::from(sm.p(row[v])) - hit(tried, v))
    }
}

/// The reference reductions: plain sequential loops.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScalarOps;

impl RowOps for ScalarOps {
    fn argmax(&self, row: &[f32]) -> u32 {
        argmax(row)
    }
    fn entropy(&self, row: &[f32]) -> f32 {
        entropy(row)
    }
    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
        race(rng, row.len(), |v| f64::from(row[v]))
    }
    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32> {
        race_residual(rng, target, draft, token)
    }
}

/// Verifies request `b` of a batch that passed [`validate`](super::validate): writes its
/// `k_max + 1` token slots into `tokens` and returns the accepted count.
///
/// This is the walk every CPU-side backend shares (the tree's: a chain is a tree whose nodes
/// each have one child); `ops` supplies the row reductions. Calling it on an unvalidated batch
/// may panic on an out-of-bounds index.
///
/// With target logits: temperature 0 verifies greedily on the logit rows (with `ops`).
/// A request that is not [plain](super::RequestPlan::plain) (temperature `> 0`, a sampling filter,
/// half-precision inputs) runs its [`Processed`] rows through the plain-loop reductions,
/// ignoring `ops` (a backend that wants its own reductions materialises the rows first).
pub fn verify_request<O: RowOps + ?Sized>(
    ops: &O,
    method: Method,
    batch: &Batch<'_>,
    b: usize,
    tokens: &mut [u32],
) -> u32 {
    let walk = chain(ops, method, batch, b);
    let (accepted, last) = walk.run(|n, c| tokens[n - 1] = walk.shape.token(c));
    tokens[accepted] = last;
    for t in &mut tokens[accepted + 1..] {
        *t = SENTINEL;
    }
    accepted as u32
}
