//! The CPU backend: [`CpuVerifier`] verifies batches on a thread pool it owns, bit-identical to
//! the core reference ([`specula_core::verify::verify_batch`]), and counts them in shared
//! counters that a [`CpuReadback`] reads for a [`Collector`](specula_core::Collector).
//!
//! ```
//! use specula::cpu::CpuVerifier;
//! use specula::specula_core::verify::{
//!     AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut,
//! };
//!
//! let verifier = CpuVerifier::<8>::new(2).unwrap();
//! let target = [0.5, 0.5, 0.0, 1.0];
//! let batch = Batch::dense(Dims { vocab: 2, k_max: 1 }, Drafts { k: &[1], ids: &[1] }, &target, Streams { seed: &[7], offset: &[0] });
//! let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
//! let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
//! verifier.verify(Method::Rejection, Check::STRICT, &batch, &mut out).unwrap();
//! assert_eq!(verifier.totals().drafts, 1);
//! ```
//!
//! # Design
//! * Requests are spread over the pool with rayon; each request runs the shared control flow
//!   ([`verify_request`]) with [`ChunkedOps`], the vectorisable row reductions, compiled for
//!   the widest instruction set the CPU has (AVX-512 or AVX2 on x86-64, detected at run time).
//! * A batch with fewer requests than threads (batch 1 is the latency case) is verified on the
//!   calling thread instead, each row cut into pieces that the pool's threads share; the
//!   reductions are order-independent by the rules, so the bits do not depend on the cut.
//! * Validation comes first (batch shape, then every request, in parallel but reporting the
//!   error of the lowest request, as the reference does), so a refused batch counts nothing.
//! * The batch's counts are summed locally and added to the shared counters under one lock, once
//!   per batch: every snapshot holds whole batches only.

mod cut;
mod kernels;
mod ops;
mod shortcut;
mod tree;
mod unwritten;

pub use ops::ChunkedOps;
use ops::SplitOps;

use kernels::SumBound;
use rayon::prelude::*;
use shortcut::{Found, quick_accept};
use specula_core::verify::exponential::accepts;
use specula_core::verify::philox::accept_draw;
use specula_core::verify::recovered_at;
use specula_core::verify::tree::{TreeBatch, TreeOutputs};
use specula_core::verify::{
    AcceptedOut, Batch, Check, Cut, Dims, Drafts, Filter, Half, Method, Outputs, RequestPlan,
    RowOps, SENTINEL, ScalarOps, Streams, Support, TokensOut, Values, Verifier, VerifyError,
    validate_recovered, validate_request_with, validate_shape_with, verify_request,
};
use specula_core::{Counters, Readback};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use unwritten::{CpuOps, UnwrittenRow};

/// Locks the counters. A panic while holding the lock is impossible (the critical sections only
/// copy and add integers), and even then the counters would be whole, so poison is ignored.
fn lock<const K: usize>(m: &Mutex<Counters<K>>) -> MutexGuard<'_, Counters<K>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes the softmax of the logits `src` at temperature `t > 0`, cut by `filter`, into `out`
/// (the rules of `core/DETERMINISM.md`): maximum, then the weights and their exact
/// fixed-point sum in one pass (the reductions are order-independent), the cut, then each `p`.
fn softmax_into(src: Src<'_>, t: f32, filter: Filter, out: &mut [f32]) {
    let mut weights = Vec::new();
    let cut = softmax_weights_cut(src, t, filter, None, &mut weights, &mut Vec::new());
    kernels::cut_write(kernels::Isa::detect(), &weights, cut, out);
}

/// A target row as the softmax kernels read it: binary32, or bf16 / f16 bit patterns read in
/// place and widened in registers (no copy of the row).
#[derive(Clone, Copy)]
enum Src<'a> {
    F32(&'a [f32]),
    Bf16(kernels::Bf16Row<'a>),
    F16(kernels::F16Row<'a>),
}

impl<'a> Src<'a> {
    /// `row` for the kernels: half rows in place, binary32 ones borrowed (`buf`: for the
    /// device rows that never get here).
    fn of(row: Values<'a>, buf: &'a mut Vec<f32>) -> Self {
        match row {
            Values::Half(Half::Bf16(x)) => Self::Bf16(kernels::Bf16Row(x)),
            Values::Half(Half::F16(x)) => Self::F16(kernels::F16Row(x)),
            _ => Self::F32(f32_row(row, buf)),
        }
    }

    /// The binary32 value of id `i`.
    fn at(&self, i: usize) -> f32 {
        match self {
            Self::F32(x) => x[i],
            Self::Bf16(x) => kernels::LogitRow::at(x, i),
            Self::F16(x) => kernels::LogitRow::at(x, i),
        }
    }

    /// The row as binary32: itself, or widened into `wide`.
    fn as_f32<'b>(&self, wide: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        let half = match *self {
            Self::F32(x) => return x,
            Self::Bf16(x) => Half::Bf16(x.0),
            Self::F16(x) => Half::F16(x.0),
        };
        wide.clear();
        wide.resize(half.len(), 0.0);
        kernels::widen_into(Values::Half(half), wide);
        wide
    }

    /// The softmax maximum at `t` (with a half row's pattern span, for its weight table).
    fn max(&self, isa: kernels::Isa, t: f32) -> kernels::Max {
        match *self {
            Self::F32(x) => kernels::softmax_max_of(isa, x, t),
            Self::Bf16(x) => kernels::softmax_max_of(isa, x, t),
            Self::F16(x) => kernels::softmax_max_of(isa, x, t),
        }
    }

    /// The row's maximum and a bound on its softmax sum at `t` ([`kernels::sum_bound`]).
    fn sum_bound(&self, isa: kernels::Isa, t: f32, known: Option<f32>) -> Option<SumBound> {
        match *self {
            Self::F32(x) => kernels::sum_bound(isa, x, t, known),
            Self::Bf16(x) => kernels::sum_bound(isa, x, t, known),
            Self::F16(x) => kernels::sum_bound(isa, x, t, known),
        }
    }

    /// [`kernels::mass_above`] of the row.
    fn mass_above(&self, isa: kernels::Isa, t: f32, m: f32, e: f32) -> Option<kernels::MassAbove> {
        match *self {
            Self::F32(x) => kernels::mass_above(isa, x, t, m, e),
            Self::Bf16(x) => kernels::mass_above(isa, x, t, m, e),
            Self::F16(x) => kernels::mass_above(isa, x, t, m, e),
        }
    }

    /// The row length.
    fn len(&self) -> usize {
        match self {
            Self::F32(x) => x.len(),
            Self::Bf16(x) => x.0.len(),
            Self::F16(x) => x.0.len(),
        }
    }

    /// The exact fixed-point sum at `t` and `max` of the weights with key `≥ threshold`, and
    /// every weight into `out` ([`kernels::softmax_pass_kept`]).
    fn pass(
        &self,
        isa: kernels::Isa,
        t: f32,
        max: kernels::Max,
        threshold: u32,
        out: &mut [f32],
    ) -> u128 {
        let out = Some(out);
        match *self {
            Self::F32(x) => kernels::softmax_pass_kept(isa, x, t, max, threshold, out),
            Self::Bf16(x) => kernels::softmax_pass_kept(isa, x, t, max, threshold, out),
            Self::F16(x) => kernels::softmax_pass_kept(isa, x, t, max, threshold, out),
        }
    }
}

/// A row as binary32: borrowed, or widened into `buf`.
fn f32_row<'a>(row: Values<'a>, buf: &'a mut Vec<f32>) -> &'a [f32] {
    match row {
        Values::F32(x) => x,
        // Device rows never get here: `Support::ALL` refuses them.
        Values::Half(_) | Values::Device(_) => {
            buf.resize(row.len(), 0.0);
            kernels::widen_into(row, buf);
            buf
        }
    }
}

/// The weights `e_v` of the logits `src` at `t > 0` into `weights`, and their [`Cut`] by
/// `filter` (`cands`: scratch). Without a filter the cut keeps every id (threshold 0) and its
/// mass is the softmax's `F`, so `Cut::p(e_v)` is the softmax's `p_v`, bit for bit: the
/// write-out then divides the stored weights instead of recomputing `exp_p`. With min-p alone
/// the cut's threshold is known before the weights are (`key(min_p × 1)`), so the same pass sums
/// the kept mass.
fn softmax_weights_cut(
    src: Src<'_>,
    t: f32,
    filter: Filter,
    known: Option<kernels::Max>,
    weights: &mut Vec<f32>,
    cands: &mut Vec<u32>,
) -> Cut {
    let isa = kernels::Isa::detect();
    let max = known.unwrap_or_else(|| src.max(isa, t));
    let len = src.len();
    weights.resize(len, 0.0);
    let min_p = cut::plain_threshold(filter, len).filter(|&k| k > 0 && max.m.is_finite());
    let total = src.pass(isa, t, max, min_p.unwrap_or(0), weights);
    if !filter.is_active() || min_p.is_some() {
        Cut {
            threshold: min_p.unwrap_or(0),
            fixed: total,
        }
    } else if max.m.is_finite() {
        cut::softmax_cut(isa, weights, filter, Some(total), cands)
    } else {
        // Every weight is 0 (`core/DETERMINISM.md`): the plain search, which is cheap here.
        Cut::of(&weights[..], filter)
    }
}

/// How one target row of a request that is not plain becomes probabilities, reduced once:
/// `p(x)` of any id is then cheap, and the full row can be written on demand.
enum RowState {
    /// The softmax weights `e_v` (in the caller's `weights`) and their [`Cut`] (without a
    /// filter, one that keeps every id: the plain softmax).
    Softmax(Cut),
    /// The stored probabilities and their [`Cut`] by a filter (`weights` not used).
    Probs(Cut),
    /// The stored values as they are (unfiltered probabilities, e.g. with half drafts).
    Identity,
}

impl RowState {
    /// Reduces the row `src` (logits at `t > 0`, or probabilities for `None`);
    /// `weights` receives the softmax weights (`cands`: scratch). Its length is set to the
    /// row's, not cleared first: every weight is written, so zeroing it cost a pass of stores
    /// per row for nothing (a third of the `memset` time of `verify_inputs`' logits rows).
    /// `known`: what a pass already found of the row ([`quick_accept`]).
    fn of(
        src: Src<'_>,
        t: Option<f32>,
        filter: Filter,
        known: Option<Found>,
        weights: &mut Vec<f32>,
        cands: &mut Vec<u32>,
    ) -> Self {
        match (t, src) {
            (Some(t), _) => {
                let known = known.and_then(Found::max);
                Self::Softmax(softmax_weights_cut(src, t, filter, known, weights, cands))
            }
            (None, Src::F32(p)) if filter.is_active() => {
                Self::Probs(cut_of(p, filter, known.and_then(Found::max_mass), cands))
            }
            // Half probabilities (rare: engines hand over half logits) are cut on their widened
            // values; the widening buffer is local because only this case needs it.
            (None, src) if filter.is_active() => {
                let mut wide = Vec::new();
                Self::Probs(cut_of(src.as_f32(&mut wide), filter, None, cands))
            }
            (None, _) => Self::Identity,
        }
    }

    /// `p` of id `x` (`src` the row, `weights` as left by [`of`](Self::of)).
    fn p(&self, src: Src<'_>, weights: &[f32], x: usize) -> f32 {
        match self {
            Self::Softmax(c) => c.p(weights[x]),
            Self::Probs(c) => c.p(src.at(x)),
            Self::Identity => src.at(x),
        }
    }

    /// Where the row's values are for its race to run over them unwritten
    /// ([`kernels::CutRow`]): the softmax weights, or binary32 stored probabilities with a cut;
    /// `None` for the rest (unfiltered or half probabilities, or a cut whose sum's reciprocal
    /// is out of range), which are written out.
    /// `row`: the row as the batch holds it.
    fn unwritten<'a>(&self, row: Values<'a>) -> Option<Unwritten<'a>> {
        let at = match (self, row) {
            (Self::Softmax(c), _) => Unwritten::Weights(*c),
            (Self::Probs(c), Values::F32(p)) => Unwritten::Probs(p, *c),
            _ => return None,
        };
        let (Unwritten::Weights(c) | Unwritten::Probs(_, c)) = at;
        kernels::CutRow::new(&[], c, kernels::Minus::Nothing).map(|_| at)
    }

    /// Writes the whole probability row (`wide`: scratch).
    fn write(&self, src: Src<'_>, weights: &[f32], out: &mut [f32], wide: &mut Vec<f32>) {
        match self {
            Self::Softmax(c) => kernels::cut_write(kernels::Isa::detect(), weights, *c, out),
            Self::Probs(c) => kernels::cut_write(kernels::Isa::detect(), src.as_f32(wide), *c, out),
            Self::Identity => out.copy_from_slice(src.as_f32(wide)),
        }
    }
}

/// Rejection sampling of a request that is not plain (logits at `t > 0`, filters, half
/// inputs), lazily: the acceptance test of row `j` needs only the row's reduction
/// ([`RowState`]) and `p(x_j)`, so rows are reduced one by one until the first rejection `r`;
/// only row `r` (the residual's, or the bonus row when all are accepted) is reduced in full,
/// rows after it are never read; many accepted positions are decided without their row's
/// exact reduction ([`quick_accept`]). The one-request batch handed to [`verify_request`]
/// holds the values the rules read (`d(x_j)` and `p(x_j)` at accepted positions, or a lower
/// bound of `p(x_j)` that passes the same test; at `r`, `p(x_r)` and `d(x_r)`, and row `r`
/// either written out in full or, with the vectorised ops, raced over its weights in its
/// slot's place: [`UnwrittenRow`]), so the outputs are those of the full rows.
fn verify_rejection_lazy<O: CpuOps + ?Sized>(
    ops: &O,
    batch: &Batch<'_>,
    b: usize,
    t: Option<f32>,
    filter: Filter,
    tokens: &mut [u32],
) -> u32 {
    let mut scratch = LazyScratch::take();
    let acc = verify_rejection_lazy_in(ops, batch, b, t, filter, tokens, &mut scratch);
    scratch.put_back();
    acc
}

/// The buffers of [`verify_rejection_lazy`], kept per thread between requests: allocating and
/// zeroing `(2k + 1)` rows per request cost about as much as the softmax passes (measured with
/// the `verify_inputs` bench). `probs` and `draft` are all zero whenever they are stored, so the
/// one-request batch holds exactly the values a freshly zeroed one would. Each thread that ran
/// such a request keeps `(2k + 1)·V` floats (plus two rows) of its largest request until it ends.
#[derive(Default)]
struct LazyScratch {
    probs: Vec<f32>,
    draft: Vec<f32>,
    buf: Vec<f32>,
    weights: Vec<f32>,
    wide: Vec<f32>,
    cands: Vec<u32>,
}

thread_local! {
    static LAZY_SCRATCH: std::cell::Cell<LazyScratch> = std::cell::Cell::new(LazyScratch::default());
}

impl LazyScratch {
    /// This thread's buffers (empty ones if a caller further up the stack holds them).
    fn take() -> Self {
        LAZY_SCRATCH.with(std::cell::Cell::take)
    }

    /// Hands the buffers back (their `probs` and `draft` zeroed by the caller).
    fn put_back(self) {
        LAZY_SCRATCH.with(|c| c.set(self));
    }

    /// `probs` (and `draft`) with at least `n` (`nd`) zeros.
    fn zeroed(&mut self, n: usize, nd: usize) {
        if self.probs.len() < n {
            self.probs.resize(n, 0.0);
        }
        if self.draft.len() < nd {
            self.draft.resize(nd, 0.0);
        }
    }
}

fn verify_rejection_lazy_in<O: CpuOps + ?Sized>(
    ops: &O,
    batch: &Batch<'_>,
    b: usize,
    t: Option<f32>,
    filter: Filter,
    tokens: &mut [u32],
    scratch: &mut LazyScratch,
) -> u32 {
    let v = batch.vocab;
    let ids = batch.draft_ids_checked(b).unwrap_or(&[]);
    let k = ids.len();
    let (seed, offset) = (batch.seed[b], batch.offset[b]);
    let has_draft = batch.has_draft_rows(b);
    scratch.zeroed((k + 1) * v, if has_draft { k * v } else { 0 });
    let LazyScratch {
        probs,
        draft,
        buf,
        weights,
        wide,
        cands,
    } = scratch;
    let probs = &mut probs[..(k + 1) * v];
    let mut draft = has_draft.then(|| &mut draft[..k * v]);
    // The vectorised ops race over a row's weights: the full row is then not written.
    let split = ops.split();
    // Rows written in full (zeroed again before the buffers are handed back): of `probs`, and
    // of `draft`.
    let (mut full_row, mut full_draft) = (None, None);
    // The full row raced unwritten: its position and where its values are.
    let mut unwritten: Option<(usize, Unwritten)> = None;
    let mut r = k;
    for (j, &x) in ids.iter().enumerate() {
        let x = x as usize;
        let Some(row) = batch.target_values_checked(b, j) else {
            break;
        };
        let src = Src::of(row, buf);
        let d = batch.draft_values_checked(b, j);
        let pd = d.map_or(1.0, |d| d.at(x));
        let u = accept_draw(seed, offset, j as u32);
        let (quick, known) = quick_accept(src, t, filter, x, |pt| accepts(u, pt, pd));
        let pt = match quick {
            Some(pt) => pt,
            None => {
                let state = RowState::of(src, t, filter, known, weights, cands);
                let pt = state.p(src, weights, x);
                if !accepts(u, pt, pd) {
                    r = j;
                    let at = split.and_then(|_| state.unwritten(row));
                    // Unwritten, the race reads a binary32 draft row in place; a half one
                    // is widened.
                    let in_place = matches!(d, None | Some(Values::F32(_)));
                    if at.is_none() || !in_place {
                        if let (Some(dr), Some(d)) = (&mut draft, d) {
                            kernels::widen_into(d, &mut dr[j * v..(j + 1) * v]);
                            full_draft = Some(j);
                        }
                    }
                    match at {
                        Some(at) => unwritten = Some((j, at)),
                        None => {
                            state.write(src, weights, &mut probs[j * v..(j + 1) * v], wide);
                            full_row = Some(j);
                            break;
                        }
                    }
                }
                pt
            }
        };
        probs[j * v + x] = pt;
        if full_draft.is_none() {
            if let Some(dr) = &mut draft {
                dr[j * v + x] = pd;
            }
        }
        if r == j {
            break;
        }
    }
    if r == k && batch.bonus.is_none() {
        if let Some(row) = batch.target_values_checked(b, k) {
            let src = Src::of(row, buf);
            let state = RowState::of(src, t, filter, None, weights, cands);
            match split.and_then(|_| state.unwritten(row)) {
                Some(at) => unwritten = Some((k, at)),
                None => {
                    state.write(src, weights, &mut probs[k * v..], wide);
                    full_row = Some(k);
                }
            }
        }
    }
    let k32 = [k as u32];
    let bonus = batch.bonus.map(|x| [x[b]]);
    let mut one = Batch::dense(
        Dims { vocab: v, k_max: k },
        Drafts { k: &k32, ids },
        probs,
        Streams {
            seed: &batch.seed[b..=b],
            offset: &batch.offset[b..=b],
        },
    );
    if let Some(d) = &draft {
        one = one.with_draft_probs(d);
    }
    if let Some(x) = &bonus {
        one = one.with_bonus(x);
    }
    // The unwritten row's weights and cut, raced in its slot's place.
    let fused = match (unwritten, split) {
        (Some((j, at)), Some(split)) => {
            let (w, cut) = match at {
                Unwritten::Weights(c) => (&weights[..v], c),
                Unwritten::Probs(p, c) => (p, c),
            };
            let row = kernels::CutRow::new(w, cut, kernels::Minus::Nothing)
                .expect("a row is left unwritten only where its cut allows it");
            let draft = match full_draft {
                Some(f) => draft.as_deref().map(|d| &d[f * v..(f + 1) * v]),
                None if j < k => match batch.draft_values_checked(b, j) {
                    Some(Values::F32(q)) => Some(q),
                    _ => None,
                },
                None => None,
            };
            Some(UnwrittenRow {
                inner: ops,
                split,
                slot: probs[j * v..].as_ptr(),
                row,
                draft,
            })
        }
        _ => None,
    };
    let acc = match &fused {
        Some(f) => verify_request(f, Method::Rejection, &one, 0, &mut tokens[..=k]),
        None => verify_request(ops, Method::Rejection, &one, 0, &mut tokens[..=k]),
    };
    for x in &mut tokens[k + 1..] {
        *x = SENTINEL;
    }
    // Back to all zeros: the drafted ids' single values, then the full rows.
    for (j, &x) in ids.iter().enumerate().take((r + 1).min(k)) {
        probs[j * v + x as usize] = 0.0;
        if let Some(dr) = &mut draft {
            dr[j * v + x as usize] = 0.0;
        }
    }
    if let Some(j) = full_row {
        probs[j * v..(j + 1) * v].fill(0.0);
    }
    if let (Some(j), Some(dr)) = (full_draft, &mut draft) {
        dr[j * v..(j + 1) * v].fill(0.0);
    }
    acc
}

/// Where an unwritten row's values are ([`RowState::unwritten`]).
#[derive(Clone, Copy)]
enum Unwritten<'a> {
    /// The softmax weights, in the lazy path's `weights`, and their cut.
    Weights(Cut),
    /// The stored binary32 probabilities (the target row itself), and their cut.
    Probs(&'a [f32], Cut),
}

/// Writes target row `row` as the probabilities request processing gives
/// ([`Processed`](specula_core::verify::Processed), bit for bit): the softmax at `t > 0`
/// (pieces reduced, then combined), then the sampling filter's [`Cut`] of those weights, or of
/// the stored probabilities when `t` is `None`. Half logits are read in place ([`Src`]); half
/// probabilities are widened into a buffer first.
fn process_into(row: Values<'_>, t: Option<f32>, filter: Filter, out: &mut [f32]) {
    let mut buf = Vec::new();
    if let Some(t) = t.filter(|&t| t > 0.0) {
        return softmax_into(Src::of(row, &mut buf), t, filter, out);
    }
    let src = f32_row(row, &mut buf);
    match t {
        None if filter.is_active() => cut_into(src, filter, out),
        // T = 0 (greedy on the logits) or unfiltered probabilities: the values themselves.
        _ => out.copy_from_slice(src),
    }
}

/// [`Cut::of`] the weights `w` (stored probabilities, or softmax weights that are all 0), the
/// same result, from candidates where they decide it ([`cut::probs_cut`]); `cands`: scratch.
fn cut_of(w: &[f32], filter: Filter, known: Option<(u32, u128)>, cands: &mut Vec<u32>) -> Cut {
    cut::probs_cut(kernels::Isa::detect(), w, filter, known, cands)
}

/// `out[v] = cut.p(w[v])` for the [`Cut`] of the weights `w` by `filter`.
fn cut_into(w: &[f32], filter: Filter, out: &mut [f32]) {
    kernels::cut_write(
        kernels::Isa::detect(),
        w,
        cut_of(w, filter, None, &mut Vec::new()),
        out,
    );
}

/// Verifies request `b` of a validated batch with `ops`. A request that is not
/// [plain](RequestPlan::plain) (logits at a temperature `> 0`, a sampling filter, bf16 / f16
/// inputs) has its rows processed first ([`process_into`]), then is verified as a one-request
/// binary32 probability batch with the same seed, offset, drafts and parameters (the random
/// streams do not depend on the batch slot, so the bits are those of the whole batch).
///
/// With `rec` (the request's slots of the outputs' `recovered`), its recovered tokens are written
/// too ([`fill_recovered_one`]), from the rows verification used.
fn verify_one<O: CpuOps + ?Sized>(
    ops: &O,
    method: Method,
    batch: &Batch<'_>,
    b: usize,
    tokens: &mut [u32],
    rec: Option<&mut [u32]>,
) -> u32 {
    let RequestPlan {
        method: planned,
        temperature: t,
        filter,
        eps,
        delta,
        plain,
        ..
    } = batch.plan(b, method);
    if plain {
        let acc = verify_request(ops, method, batch, b, tokens);
        if let Some(rec) = rec {
            fill_recovered_one(ops, planned, batch, b, tokens, acc, rec);
        }
        return acc;
    }
    let method = planned;
    // The lazy path reduces rows only up to the first rejection; recovered tokens need every
    // draft row processed, so with them every row is processed once, below, and shared by the
    // verification and the recovered tokens.
    if method == Method::Rejection && t.is_none_or(|t| t > 0.0) && rec.is_none() {
        return verify_rejection_lazy(ops, batch, b, t, filter, tokens);
    }
    let v = batch.vocab;
    let ids = batch.draft_ids_checked(b).unwrap_or(&[]);
    let k = ids.len();
    let rows = if batch.bonus.is_some() { k } else { k + 1 };
    // Always k + 1 rows, the layout of a one-request dense batch (row k unread with a bonus).
    let mut probs = vec![0f32; (k + 1) * v];
    for (j, out) in probs.chunks_exact_mut(v).take(rows).enumerate() {
        if let Some(row) = batch.target_values_checked(b, j) {
            process_into(row, t, filter, out);
        }
    }
    let draft: Option<Vec<f32>> = batch.has_draft_rows(b).then(|| {
        let mut d = vec![0f32; k * v];
        for (j, out) in d.chunks_exact_mut(v).enumerate() {
            if let Some(row) = batch.draft_values_checked(b, j) {
                kernels::widen_into(row, out);
            }
        }
        d
    });
    let k32 = [k as u32];
    let (eps, delta) = ([eps], [delta]);
    let bonus = batch.bonus.map(|x| [x[b]]);
    let mut one = Batch::dense(
        Dims { vocab: v, k_max: k },
        Drafts { k: &k32, ids },
        &probs,
        Streams {
            seed: &batch.seed[b..=b],
            offset: &batch.offset[b..=b],
        },
    )
    .with_typical(&eps, &delta);
    if let Some(d) = &draft {
        one = one.with_draft_probs(d);
    }
    if let Some(x) = &bonus {
        one = one.with_bonus(x);
    }
    let acc = verify_request(ops, method, &one, 0, &mut tokens[..=k]);
    for x in &mut tokens[k + 1..] {
        *x = SENTINEL;
    }
    if let Some(rec) = rec {
        fill_recovered_one(ops, method, &one, 0, tokens, acc, rec);
    }
    acc
}

/// Writes the recovered tokens of request `rb` of `rows` into `rec` (its slots: `k` values,
/// then [`SENTINEL`] in the padded layout's remaining ones), after verification emitted
/// `tokens` with `acc` accepted. `rows` holds the rows the request was verified on (the batch
/// itself for a plain request, the one-request batch of processed rows otherwise) and
/// `method` is its effective method; the bits are those of
/// [`recovered_at`](specula_core::verify::recovered_at) on the original batch.
///
/// What verification already reduced is reused, not read again: at the first rejected
/// position the recovered token is the emitted one (the same reduction with the same draws),
/// and at an accepted greedy position it is the draft token (accepted means it is the
/// argmax). The other slots (the residual race at an accepted rejection-sampling position,
/// the race at an accepted typical position, every position after the first rejection) are
/// computed here with `ops`, right after the request's verification on the same thread while
/// its rows are still hot: folding them into the verification loop would fork the shared
/// [`verify_request`] control flow that every CPU path and the reference use.
fn fill_recovered_one<O: RowOps + ?Sized>(
    ops: &O,
    method: Method,
    rows: &Batch<'_>,
    rb: usize,
    tokens: &[u32],
    acc: u32,
    rec: &mut [u32],
) {
    let ids = rows.draft_ids_checked(rb).unwrap_or(&[]);
    let acc = acc as usize;
    for (j, (slot, &x)) in rec.iter_mut().zip(ids).enumerate() {
        *slot = if j == acc {
            tokens[acc]
        } else if j < acc && method == Method::Greedy {
            x
        } else {
            recovered_at(ops, method, rows, rb, j)
        };
    }
    for slot in rec.iter_mut().skip(ids.len()) {
        *slot = SENTINEL;
    }
}

/// Request by request, its slots of a validated batch's recovered output: `k_max` each in the
/// padded layout, `k_b` in the ragged one.
fn recovered_segments<'r>(batch: &Batch<'_>, mut rec: &'r mut [u32]) -> Vec<&'r mut [u32]> {
    let n = batch.requests();
    let mut segs = Vec::with_capacity(n);
    for b in 0..n {
        let len = if batch.is_ragged() {
            batch.draft_len(b) as usize
        } else {
            batch.k_max
        };
        // Validated: the slice holds exactly the slots of every request.
        let (head, tail) = std::mem::take(&mut rec).split_at_mut(len);
        segs.push(head);
        rec = tail;
    }
    segs
}

/// Multithreaded CPU verifier with device-style shared counters (see the [module docs](self)).
///
/// `verify` takes `&self`: one verifier can be shared (e.g. in an `Arc`) by several threads, each
/// submitting batches; counting stays batch-atomic.
#[derive(Debug)]
pub struct CpuVerifier<const K: usize> {
    /// `None`: run on the calling thread.
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    /// Verify with the core's plain-loop [`ScalarOps`] (the reference reductions) instead of
    /// the vectorised kernels: same bits, the reference's speed.
    reference: bool,
    counters: Arc<Mutex<Counters<K>>>,
}

impl<const K: usize> CpuVerifier<K> {
    /// A verifier running on `threads` threads: `1` runs on the calling thread (no pool), `0`
    /// means one per CPU (rayon's default), `n > 1` builds a pool of `n` threads it owns.
    pub fn new(threads: usize) -> Result<Self, rayon::ThreadPoolBuildError> {
        let pool = if threads == 1 {
            None
        } else {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("specula-verify-{i}"))
                    .build()?,
            )
        };
        let threads = pool
            .as_ref()
            .map_or(1, rayon::ThreadPool::current_num_threads);
        Ok(Self {
            pool,
            threads,
            reference: false,
            counters: Arc::new(Mutex::new(Counters::ZERO)),
        })
    }

    /// The core reference (plain sequential loops, [`ScalarOps`]) on the calling thread, with the
    /// same shared counters and [`readback`](Self::readback) as the CPU backend: the reference
    /// as a backend a runtime can open (`"reference"`), for debugging and cross-checks.
    #[must_use]
    pub fn reference() -> Self {
        Self {
            pool: None,
            threads: 1,
            reference: true,
            counters: Arc::new(Mutex::new(Counters::ZERO)),
        }
    }

    /// Whether this verifier runs the plain-loop reference reductions.
    #[must_use]
    pub fn is_reference(&self) -> bool {
        self.reference
    }

    /// The number of threads verification runs on.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Validates `batch` (always the cheap checks, plus `check`), verifies every request with
    /// `method` into `out`, then counts the whole batch at once. On error nothing is written or
    /// counted, and the error is the one the core reference would report. Everything the
    /// reference verifies is supported ([`Support::ALL`]: `k = 0`, the ragged layout, bonus
    /// tokens, the recovered-token output); a request with `k = 0` is not counted. With
    /// `recovered` set ([`Outputs::with_recovered`]), each request's recovered tokens are written by the thread
    /// that verified it, right after it (see [`Outputs::with_recovered`]).
    pub fn verify(
        &self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), VerifyError> {
        validate_shape_with::<K>(Support::ALL, batch, out)?;
        // Device outputs were refused by the validation above.
        let (AcceptedOut(accepted), TokensOut(tokens), recovered) = out.host()?;
        self.verify_requests(method, check, batch, accepted, tokens, recovered)?;
        let mut local = Counters::<K>::ZERO;
        for (b, &acc) in accepted.iter().enumerate() {
            // A request without drafts (k = 0) is not counted, as in the reference.
            let k = batch.draft_len(b) as usize;
            if k > 0 {
                let recorded = local.record(k, acc as usize);
                // Validated: k ≤ k_max ≤ K and acc ≤ k.
                debug_assert!(recorded.is_ok());
            }
        }
        lock(&self.counters).add(&local);
        Ok(())
    }

    /// Validates every request of a batch whose shape (outputs included) is validated, then
    /// verifies them into the outputs on this verifier's threads; counts nothing.
    fn verify_requests(
        &self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        accepted: &mut [u32],
        tokens: &mut [u32],
        recovered: Option<&mut [u32]>,
    ) -> Result<(), VerifyError> {
        let n = batch.requests();
        let width = batch.k_max + 1;
        // Slicing only (the shape is validated); nothing is written before every request is.
        let segs = recovered.map(|r| recovered_segments(batch, r));
        match &self.pool {
            None => {
                for b in 0..n {
                    validate_request_with(Support::ALL, method, check, batch, b)?;
                }
                let mut segs = segs.map(Vec::into_iter);
                for (b, (acc, row)) in accepted
                    .iter_mut()
                    .zip(tokens.chunks_exact_mut(width))
                    .enumerate()
                {
                    let rec = segs.as_mut().and_then(Iterator::next);
                    *acc = if self.reference {
                        verify_one(&ScalarOps, method, batch, b, row, rec)
                    } else {
                        verify_one(&ChunkedOps, method, batch, b, row, rec)
                    };
                }
            }
            Some(pool) if n < self.threads => {
                // Fewer requests than threads (batch 1 is the latency case): verify them one
                // by one on the calling thread, each row cut over the whole pool.
                for b in 0..n {
                    validate_request_with(Support::ALL, method, check, batch, b)?;
                }
                let ops = SplitOps::new(self.threads, Some(pool));
                let mut segs = segs.map(Vec::into_iter);
                for (b, (acc, row)) in accepted
                    .iter_mut()
                    .zip(tokens.chunks_exact_mut(width))
                    .enumerate()
                {
                    let rec = segs.as_mut().and_then(Iterator::next);
                    *acc = verify_one(&ops, method, batch, b, row, rec);
                }
            }
            Some(pool) => pool.install(|| {
                // `find_map_first`: the error of the lowest failing request, as in the reference.
                let first = (0..n).into_par_iter().find_map_first(|b| {
                    validate_request_with(Support::ALL, method, check, batch, b).err()
                });
                if let Some(e) = first {
                    return Err(e);
                }
                let rows = accepted
                    .par_iter_mut()
                    .zip(tokens.par_chunks_exact_mut(width))
                    .enumerate();
                match segs {
                    None => rows.for_each(|(b, (acc, row))| {
                        *acc = verify_one(&ChunkedOps, method, batch, b, row, None);
                    }),
                    Some(segs) => {
                        rows.zip(segs.into_par_iter())
                            .for_each(|((b, (acc, row)), rec)| {
                                *acc = verify_one(&ChunkedOps, method, batch, b, row, Some(rec));
                            })
                    }
                }
                Ok(())
            })?,
        }
        Ok(())
    }

    /// vLLM's `recovered_token_ids` for `batch` (see
    /// [`specula_core::verify::recovered_tokens`], whose bits it gives): one token per draft
    /// slot, the one emitted if that position is the first rejected. Nothing is counted. It
    /// runs the verification call's path with [`Outputs::with_recovered`] into scratch outputs
    /// (on this verifier's threads, rows processed once per request), so a caller that also
    /// verifies the batch saves that second pass by setting the output on its verification
    /// call instead.
    pub fn recovered_tokens(
        &self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        recovered: &mut [u32],
    ) -> Result<(), VerifyError> {
        validate_recovered::<K>(Support::ALL, method, check, batch, recovered)?;
        let n = batch.requests();
        let mut accepted = vec![0u32; n];
        let mut tokens = vec![0u32; n * (batch.k_max + 1)];
        // Every request passed `check` above; the cheap checks again cost O(B·k).
        self.verify_requests(
            method,
            Check::Cheap,
            batch,
            &mut accepted,
            &mut tokens,
            Some(recovered),
        )
    }

    /// The counters of every batch verified so far (whole batches only).
    #[must_use]
    pub fn totals(&self) -> Counters<K> {
        *lock(&self.counters)
    }

    /// A [`Readback`] of this verifier's counters, for a [`Collector`](specula_core::Collector).
    /// It may live on another thread; its snapshots are batch-consistent while batches run.
    #[must_use]
    pub fn readback(&self) -> CpuReadback<K> {
        CpuReadback {
            counters: Arc::clone(&self.counters),
            pending: None,
        }
    }
}

impl<const K: usize> Verifier<K> for CpuVerifier<K> {
    type Error = VerifyError;

    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), VerifyError> {
        CpuVerifier::verify(self, method, check, batch, out)
    }

    fn totals(&mut self) -> Result<Counters<K>, VerifyError> {
        Ok(CpuVerifier::totals(self))
    }

    fn support(&self) -> Support {
        Support::CPU
    }

    fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), VerifyError> {
        CpuVerifier::verify_tree(self, method, check, batch, out)
    }
}

/// Why a [`CpuReadback`] failed: only misuse ([`Misuse`](specula_core::Misuse), the answer
/// every readback gives).
pub type CpuReadbackError = specula_core::Misuse;

/// [`Readback`] of a [`CpuVerifier`]'s counters. `start` copies them under the lock (so the
/// copy holds whole batches), `poll` hands that copy over, `flush` copies the current totals:
/// `verify` is synchronous, so everything submitted before is already counted.
#[derive(Debug)]
pub struct CpuReadback<const K: usize> {
    counters: Arc<Mutex<Counters<K>>>,
    pending: Option<Counters<K>>,
}

impl<const K: usize> Readback<K> for CpuReadback<K> {
    type Error = CpuReadbackError;

    fn start(&mut self) -> Result<(), CpuReadbackError> {
        if self.pending.is_some() {
            return Err(CpuReadbackError::AlreadyInFlight);
        }
        self.pending = Some(*lock(&self.counters));
        Ok(())
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, CpuReadbackError>> {
        Poll::Ready(self.pending.take().ok_or(CpuReadbackError::NothingInFlight))
    }

    fn flush(&mut self) -> Result<Counters<K>, CpuReadbackError> {
        self.pending = None;
        Ok(*lock(&self.counters))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_core::verify::{Dims, Drafts, Streams, f16_to_f32};

    /// [`cut_of`] gives [`Cut::of`]'s result (threshold and kept mass) for every filter mix,
    /// with ties and zeros, whether or not it takes the gathered path.
    #[test]
    fn fast_cut_is_the_cut() {
        let mut s = 0xC07_u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for round in 0..400 {
            let n = 1 + (next() % 3000) as usize;
            let w: Vec<f32> = (0..n)
                .map(|_| match next() % 6 {
                    0 => 0.0,
                    1 => 0.001,
                    _ => ((next() >> 40) as f32 / (1u64 << 24) as f32).powi(3),
                })
                .collect();
            let f = Filter::NONE
                .with_top_k([0, 1, 5, 50, 2000][(next() % 5) as usize])
                .with_top_p([1.0, 0.9, 0.5, 0.01][(next() % 4) as usize])
                .with_min_p([0.0, 0.01, 0.3][(next() % 3) as usize]);
            assert_eq!(
                cut_of(&w, f, None, &mut Vec::new()),
                Cut::of(&w[..], f),
                "round {round}: {f:?}"
            );
        }
    }

    /// The softmax weights and their cut ([`softmax_weights_cut`]) are the core's
    /// (`softmax_exp`, [`Cut::of`]) at the vocabularies users run, f32, bf16 and f16 rows read in
    /// place, for the filter mixes (top-p alone above all: the path with the most steps).
    #[test]
    fn softmax_weights_cut_is_the_cut() {
        use specula_core::verify::{softmax_exp, softmax_max};
        let mut s = 0x70_9Fu64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 + 1.0) / 16_777_216.0
        };
        let f = |top_k, top_p, min_p| {
            Filter::NONE
                .with_top_k(top_k)
                .with_top_p(top_p)
                .with_min_p(min_p)
        };
        let filters = [
            f(0, 0.9, 0.0),
            f(0, 0.5, 0.0),
            f(0, 0.99, 0.0),
            f(0, 1e-6, 0.0),
            f(0, 0.999_9, 0.0),
            f(1_000_000, 0.8, 0.0),
            f(50, 0.9, 0.0),
            f(0, 0.9, 0.05),
            f(0, 1.0, 0.05),
            f(1_000_000, 1.0, 0.3),
        ];
        let (mut weights, mut cands) = (Vec::new(), Vec::new());
        for vocab in [32_000usize, 128_256, 151_936] {
            for kind in 0..3 {
                let row: Vec<f32> = (0..vocab)
                    .map(|_| match kind {
                        0 => 3.0 * next().ln(),
                        1 => {
                            if next() < 0.001 {
                                10.0 * next()
                            } else {
                                -12.0 + 4.0 * next().ln()
                            }
                        }
                        _ => (8.0 * next().ln()).round() / 2.0,
                    })
                    .collect();
                let bf: Vec<u16> = row.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                let hf: Vec<u16> = row
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect();
                let t = [0.8f32, 1.0, 0.37][kind];
                for half in ["f32", "bf16", "f16"] {
                    let l: Vec<f32> = match half {
                        "bf16" => bf
                            .iter()
                            .map(|&b| specula_core::verify::bf16_to_f32(b))
                            .collect(),
                        "f16" => hf.iter().map(|&b| f16_to_f32(b)).collect(),
                        _ => row.clone(),
                    };
                    let m = l
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, &x| softmax_max(m, x / t));
                    let want_w: Vec<f32> = l.iter().map(|&x| softmax_exp(x, t, m)).collect();
                    let src = match half {
                        "bf16" => Src::Bf16(kernels::Bf16Row(&bf)),
                        "f16" => Src::F16(kernels::F16Row(&hf)),
                        _ => Src::F32(&row),
                    };
                    for filter in filters {
                        let got =
                            softmax_weights_cut(src, t, filter, None, &mut weights, &mut cands);
                        let what = format!("V {vocab} kind {kind} {half} {filter:?}");
                        assert_eq!(got, Cut::of(&want_w[..], filter), "{what}");
                        assert!(
                            weights
                                .iter()
                                .zip(&want_w)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{what}: weights"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn readback_follows_the_contract() {
        let v = CpuVerifier::<4>::new(1).unwrap();
        let mut r = v.readback();
        assert_eq!(
            r.poll(),
            Poll::Ready(Err(CpuReadbackError::NothingInFlight))
        );
        r.start().unwrap();
        let target = [0.0f32, 1.0, 0.0, 1.0];
        let batch = Batch::dense(
            Dims { vocab: 2, k_max: 1 },
            Drafts { k: &[1], ids: &[1] },
            &target,
            Streams {
                seed: &[1],
                offset: &[0],
            },
        );
        let (mut a, mut t) = ([0u32; 1], [0u32; 2]);
        v.verify(
            Method::Greedy,
            Check::Cheap,
            &batch,
            &mut Outputs::new(
                specula_core::verify::AcceptedOut(&mut a),
                specula_core::verify::TokensOut(&mut t),
            ),
        )
        .unwrap();
        // The readback started before the batch: it shows the counters as they stood then.
        assert_eq!(r.poll(), Poll::Ready(Ok(Counters::ZERO)));
        let f = r.flush().unwrap();
        assert_eq!((f.drafts, f.accepted_tokens, f.emitted_tokens), (1, 1, 2));
        assert_eq!((a, t), ([1], [1, 1]));
    }
}
