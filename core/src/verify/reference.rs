//! The per-request algorithm ([`verify_request`]) and the plain-loop row reductions
//! ([`ScalarOps`]) that define the reference bits.

use super::{Batch, Cut, Filter, Method, RequestPlan, SENTINEL, Values, WeightRow};
use crate::verify::exponential::{accepts, draw, exponential};
use crate::verify::fmath::{entropy, entropy_from_fixed, entropy_term, exp_p};
use crate::verify::philox::{accept_draw, race_words, race_words_lo};

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
    let mut best = 0u32;
    let mut best_key = f32::NEG_INFINITY;
    for (v, &x) in row.iter().enumerate() {
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

/// One draft position's rows as the rules read them, resolved by the request's plan: the stored
/// binary32 rows of a [plain](super::RequestPlan::plain) request, reduced by the caller's
/// [`RowOps`], or the [`Processed`] target row (with the draft row in any format), reduced by
/// plain loops computed on the fly (the reference needs no buffer). Both serve the one control
/// flow of [`verify_request`] and [`recovered_at`].
#[derive(Clone, Copy)]
enum PositionRows<'r> {
    Stored {
        target: &'r [f32],
        draft: Option<&'r [f32]>,
    },
    Processed {
        target: Values<'r>,
        pr: Processed,
        draft: Option<Values<'r>>,
    },
}

impl<'r> PositionRows<'r> {
    /// Position `j`'s rows of request `b` (`j ≤ k_b`), the draft row only `with_draft` (the
    /// caller knows: `j < k_b`; row `k_b` has none).
    fn of(plan: &RequestPlan, batch: &Batch<'r>, b: usize, j: usize, with_draft: bool) -> Self {
        if plan.plain {
            return Self::Stored {
                target: batch.target_row(b, j),
                draft: if with_draft {
                    batch.draft_row(b, j)
                } else {
                    None
                },
            };
        }
        let target = batch
            .target_values_checked(b, j)
            .unwrap_or(Values::F32(&[]));
        Self::Processed {
            target,
            pr: Processed::of(target, plan.temperature, plan.filter),
            draft: if with_draft {
                batch.draft_values_checked(b, j)
            } else {
                None
            },
        }
    }

    /// The target's probability of `x`.
    fn target_p(&self, x: u32) -> f32 {
        match self {
            Self::Stored { target, .. } => target[x as usize],
            Self::Processed { target, pr, .. } => pr.p(target.at(x as usize)),
        }
    }

    /// The draft's probability of `x` (`1` for a one-hot drafter).
    fn draft_p(&self, x: u32) -> f32 {
        match self {
            Self::Stored { draft, .. } => draft.map_or(1.0, |d| d[x as usize]),
            Self::Processed { draft, .. } => draft.map_or(1.0, |d| d.at(x as usize)),
        }
    }

    /// The argmax of the target row (NaN as −∞, ties to the lowest id).
    fn argmax<O: RowOps + ?Sized>(&self, ops: &O) -> u32 {
        match self {
            Self::Stored { target, .. } => ops.argmax(target),
            Self::Processed { target, pr, .. } => {
                let (mut best, mut best_key, mut v) = (0u32, f32::NEG_INFINITY, 0u32);
                target.for_each(|l| {
                    let x = pr.p(l);
                    if x > best_key {
                        best_key = x;
                        best = v;
                    }
                    v += 1;
                });
                best
            }
        }
    }

    /// The entropy of the target row.
    fn entropy<O: RowOps + ?Sized>(&self, ops: &O) -> f32 {
        match self {
            Self::Stored { target, .. } => ops.entropy(target),
            Self::Processed { target, pr, .. } => {
                let mut fixed = 0i64;
                target.for_each(|l| fixed = fixed.wrapping_add(entropy_term(pr.p(l))));
                entropy_from_fixed(fixed)
            }
        }
    }

    /// The race over the target row, `0` when no value is `> 0`.
    fn race<O: RowOps + ?Sized>(&self, ops: &O, rng: RaceRng) -> u32 {
        match self {
            Self::Stored { target, .. } => ops.race(rng, target),
            Self::Processed { target, pr, .. } => {
                race(rng, target.len(), |v| f64::from(pr.p(target.at(v))))
            }
        }
        .unwrap_or(0)
    }

    /// Rejection sampling's token after `x` is rejected: the residual race over the target
    /// minus the draft (one-hot at `x` without draft rows), else the race over the target.
    fn recovered<O: RowOps + ?Sized>(&self, ops: &O, rng: RaceRng, x: u32) -> u32 {
        let residual = match *self {
            Self::Stored { target, draft } => ops.race_residual(rng, target, draft, x),
            Self::Processed { target, pr, draft } => {
                let p = |v: usize| f64::from(pr.p(target.at(v)));
                match draft {
                    Some(d) => race(rng, target.len(), |v| p(v) - f64::from(d.at(v))),
                    None => race(rng, target.len(), |v| {
                        p(v) - if v == x as usize { 1.0 } else { 0.0 }
                    }),
                }
            }
        };
        residual.unwrap_or_else(|| self.race(ops, rng))
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
    let plan = batch.plan(b, method);
    let x = batch.draft_ids_of(b)[j];
    let rng = RaceRng {
        seed: batch.seed[b],
        offset: batch.offset[b],
        position: j as u32,
    };
    // `j < k_b`: the position has a draft row.
    let rows = PositionRows::of(&plan, batch, b, j, true);
    match plan.method {
        Method::Rejection => rows.recovered(ops, rng, x),
        Method::Greedy => rows.argmax(ops),
        Method::Typical => rows.race(ops, rng),
    }
}

/// The four row reductions of the verification rules. Every implementation must return the same
/// values as [`ScalarOps`] for every input (NaN, infinities and negative values included); the
/// rules make each reduction independent of evaluation order, so chunked, vectorised or
/// parallel versions can.
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
/// This is the control flow every CPU-side backend shares; `ops` supplies the row reductions.
/// Calling it on an unvalidated batch may panic on an out-of-bounds index.
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
    let plan = batch.plan(b, method);
    let ids = batch.draft_ids_of(b);
    let k = ids.len();
    let (seed, offset) = (batch.seed[b], batch.offset[b]);
    let rng = |j: usize| RaceRng {
        seed,
        offset,
        position: j as u32,
    };
    let mut accepted = 0usize;
    let mut emitted = None;
    for (j, &x) in ids.iter().enumerate() {
        let rows = PositionRows::of(&plan, batch, b, j, true);
        let pt = rows.target_p(x);
        let accept = match plan.method {
            Method::Rejection => {
                let ok = accepts(accept_draw(seed, offset, j as u32), pt, rows.draft_p(x));
                if !ok {
                    emitted = Some(rows.recovered(ops, rng(j), x));
                }
                ok
            }
            Method::Greedy => {
                let best = rows.argmax(ops);
                if best != x {
                    emitted = Some(best);
                }
                best == x
            }
            Method::Typical => {
                let ok = pt > plan.typical_threshold(rows.entropy(ops));
                if !ok {
                    emitted = Some(rows.race(ops, rng(j)));
                }
                ok
            }
        };
        if !accept {
            break;
        }
        tokens[j] = x;
        accepted += 1;
    }
    let last = match emitted {
        Some(t) => t,
        // All k accepted (or k = 0): the caller's bonus token, if given.
        None if batch.bonus.is_some() => batch.bonus.map_or(0, |x| x[b]),
        None => {
            // All k accepted (or k = 0): the bonus token from target row k.
            let rows = PositionRows::of(&plan, batch, b, k, false);
            match plan.method {
                Method::Greedy => rows.argmax(ops),
                Method::Rejection | Method::Typical => rows.race(ops, rng(k)),
            }
        }
    };
    tokens[accepted] = last;
    for t in &mut tokens[accepted + 1..] {
        *t = SENTINEL;
    }
    accepted as u32
}
