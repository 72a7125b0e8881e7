//! Tree verification on the CPU backend ([`CpuVerifier::verify_tree`]): the core's tree control
//! flow ([`verify_tree_request`]) with this backend's row reductions ([`TreeRows`]) and rows
//! (half ones widened as the walk reads them, [`Widening`]), requests spread over the pool,
//! counted once per batch like chains.

mod widen;

use super::kernels::{self, Isa, Weights};
use super::{CpuVerifier, SplitOps, lock};
use rayon::prelude::*;
use specula_core::Counters;
use specula_core::verify::tree::{
    PathOut, TreeBatch, TreeOutputs, excluding_weight, speculative_residual, validate_tree_request,
    validate_tree_shape_with, verify_tree_request,
};
use specula_core::verify::{
    AcceptedOut, Check, Cut, Method, RaceRng, RowOps, ScalarOps, Softmax, Support, TokensOut,
    VerifyError, softmax_exp,
};
use std::cell::Cell;
use widen::Widening;

/// `target − 1` at the tried tokens (once each), `target` elsewhere: the residual of the
/// target-only rule after several siblings were rejected.
#[derive(Clone, Copy)]
struct Excluding<'a> {
    target: &'a [f32],
    tried: &'a [u32],
}

impl Weights for Excluding<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.target.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        let n = (end - start).min(N);
        out[..n].copy_from_slice(&self.target[start..start + n]);
        out[n..].fill(0.0);
        // Assigned, not subtracted, so a duplicated token counts once. `t − 1` in f32 is
        // positive exactly when the f64 weight is.
        for &t in self.tried {
            let t = t as usize;
            if t >= start && t < start + n {
                out[t - start] = self.target[t] - 1.0;
            }
        }
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        excluding_weight(self.target, self.tried, v)
    }
}

/// SpecInfer's residual after every sibling was rejected:
/// [`speculative_residual`] of each id.
#[derive(Clone, Copy)]
struct Speculative<'a> {
    target: &'a [f32],
    drafts: &'a [&'a [f32]],
    z: &'a [f64],
}

impl Weights for Speculative<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.target.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        let n = (end - start).min(N);
        for (i, o) in out[..n].iter_mut().enumerate() {
            let r = self.exact(start + i);
            // Rounded up, never below the exact weight: positive exactly when it is (a tiny
            // weight does not flush to 0), and the skip test's bound stays conservative.
            let f = r as f32;
            *o = if f64::from(f) < r {
                f32::from_bits(f.to_bits() + 1)
            } else {
                f
            };
        }
        out[n..].fill(0.0);
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        speculative_residual(self.target[v], self.drafts, self.z, v)
    }
}

/// The logits row a request reduced last, as [`TreeRows`] keeps it: the softmax weights `e_v`
/// its state was summed from, turned into the probabilities `p_v` in place when a full-row
/// reduction first asks for them.
#[derive(Default)]
struct SoftRow {
    /// The row `buf` holds (its address and length) and its softmax state; `None`: none.
    of: Option<(usize, usize, Softmax)>,
    /// That row's exact fixed-point softmax sum.
    fixed: u128,
    /// `buf` holds the probabilities (else the weights).
    probs: bool,
    buf: Vec<f32>,
}

/// A thread's row scratch, kept between requests and calls: allocating and zeroing a row per
/// request would cost about as much as a softmax pass.
#[derive(Default)]
struct Scratch {
    soft: SoftRow,
    wide: Widening,
}

thread_local! {
    /// Each thread's [`Scratch`].
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// Ids per block of [`cut_in_place`]'s copy (16 KiB on the stack).
const CUT_BLOCK: usize = 4096;

/// `buf[v] = cut.p(buf[v])` ([`kernels::cut_write`], a block at a time through a copy: the
/// write-out reads and writes distinct slices).
fn cut_in_place(isa: Isa, buf: &mut [f32], cut: Cut) {
    let mut w = [0f32; CUT_BLOCK];
    for block in buf.chunks_mut(CUT_BLOCK) {
        let w = &mut w[..block.len()];
        w.copy_from_slice(block);
        kernels::cut_write(isa, w, cut, block);
    }
}

impl SoftRow {
    /// Whether `buf` holds `row`'s values at `t`.
    fn holds(&self, row: &[f32], t: f32) -> Option<Softmax> {
        match self.of {
            Some((at, len, sm))
                if at == row.as_ptr() as usize
                    && len == row.len()
                    && sm.temperature().to_bits() == t.to_bits() =>
            {
                Some(sm)
            }
            _ => None,
        }
    }

    /// The softmax of `row` at `t` with the chain's kernels (its maximum, then the weights
    /// into `buf` and their exact sum in one pass), kept for the row's full-row reductions.
    fn reduce(&mut self, isa: Isa, row: &[f32], t: f32) -> Softmax {
        if let Some(sm) = self.holds(row, t) {
            return sm;
        }
        let max = kernels::softmax_max(isa, row, t);
        if self.buf.len() < row.len() {
            self.buf.resize(row.len(), 0.0);
        }
        let fixed = kernels::softmax_pass(isa, row, t, max, Some(&mut self.buf[..row.len()]));
        let sm = Softmax::from_parts(t, max, fixed);
        self.of = Some((row.as_ptr() as usize, row.len(), sm));
        self.fixed = fixed;
        self.probs = false;
        sm
    }

    /// `row`'s probabilities `p_v = sm.p(row[v])` (`sm`: its softmax): the weights of
    /// [`reduce`](Self::reduce) divided by the sum. Without a filter the cut keeps every id
    /// and its mass is the softmax's sum, so `Cut::p(e_v)` is `p_v`, bit for bit (as the
    /// chain's logits path writes its rows).
    fn probs(&mut self, isa: Isa, row: &[f32], sm: &Softmax) -> &[f32] {
        if self.holds(row, sm.temperature()) != Some(*sm) {
            self.of = None;
            self.reduce(isa, row, sm.temperature());
        }
        let buf = &mut self.buf[..row.len()];
        if !self.probs {
            let cut = Cut {
                threshold: 0,
                fixed: self.fixed,
            };
            cut_in_place(isa, buf, cut);
            self.probs = true;
        }
        buf
    }
}

/// The tree reductions of this backend: the chain's vectorised kernels ([`SplitOps`]) for
/// probability rows, and for logits rows the chain's softmax kernels, each row's softmax
/// reduced once: the weights its state was summed from are kept ([`SoftRow`], one row: the
/// one a request reduced last, the row its next full-row reduction reads) and turned into the
/// probability row the same kernels then reduce. With them, the rows the walk reads
/// ([`Widening`]: half ones widened on first read).
pub(crate) struct TreeRows<'p> {
    split: SplitOps<'p>,
    soft: Cell<SoftRow>,
    wide: Widening,
}

impl<'p> TreeRows<'p> {
    /// Reductions with `split`'s kernels and cut, holding this thread's row scratch until
    /// dropped.
    pub(crate) fn new(split: SplitOps<'p>) -> Self {
        let Scratch { mut soft, wide } = SCRATCH.with(Cell::take);
        // Addresses identify rows only within one verification.
        soft.of = None;
        Self {
            split,
            soft: Cell::new(soft),
            wide,
        }
    }

    /// Verifies request `b` ([`verify_tree_request`]) with these reductions (`reference`: the
    /// plain loops, [`ScalarOps`]), reading its rows through this thread's [`Widening`].
    fn verify(
        &mut self,
        reference: bool,
        method: Method,
        batch: &TreeBatch<'_>,
        b: usize,
        path: &mut [u32],
        tokens: &mut [u32],
    ) -> u32 {
        // Within one request, in fact: the widened rows' buffers are reused by the next.
        self.soft.get_mut().of = None;
        self.wide.begin(batch, b);
        let rows = &self.wide;
        if reference {
            verify_tree_request(&ScalarOps, rows, method, batch, b, path, tokens)
        } else {
            verify_tree_request(self, rows, method, batch, b, path, tokens)
        }
    }

    /// `f` of the probability row of `row` (softmax `sm`).
    fn with_probs<R>(&self, row: &[f32], sm: &Softmax, f: impl FnOnce(&[f32]) -> R) -> R {
        // Taken out and put back: no borrow is held while `f` runs.
        let mut soft = self.soft.take();
        let r = f(soft.probs(self.split.isa(), row, sm));
        self.soft.set(soft);
        r
    }
}

impl Drop for TreeRows<'_> {
    fn drop(&mut self) {
        let scratch = Scratch {
            soft: self.soft.take(),
            wide: std::mem::take(&mut self.wide),
        };
        SCRATCH.with(|c| c.set(scratch));
    }
}

impl RowOps for TreeRows<'_> {
    fn argmax(&self, row: &[f32]) -> u32 {
        self.split.argmax(row)
    }
    fn entropy(&self, row: &[f32]) -> f32 {
        self.split.entropy(row)
    }
    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
        self.split.race(rng, row)
    }
    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32> {
        self.split.race_residual(rng, target, draft, token)
    }

    fn race_excluding(&self, rng: RaceRng, row: &[f32], tried: &[u32]) -> Option<u32> {
        self.split.race_with(rng, Excluding { target: row, tried })
    }

    fn race_speculative(
        &self,
        rng: RaceRng,
        row: &[f32],
        drafts: &[&[f32]],
        z: &[f64],
    ) -> Option<u32> {
        let w = Speculative {
            target: row,
            drafts,
            z,
        };
        self.split.race_with(rng, w)
    }

    fn softmax(&self, row: &[f32], t: f32) -> Softmax {
        let mut soft = self.soft.take();
        let sm = soft.reduce(self.split.isa(), row, t);
        self.soft.set(soft);
        sm
    }

    fn softmax_argmax(&self, row: &[f32], sm: &Softmax) -> u32 {
        self.with_probs(row, sm, |p| self.split.argmax(p))
    }

    /// The chain's shortcut ([`kernels::sum_bound`]): the row's maximum, then a bound on its
    /// softmax sum, whose lower bound of `p(x)` decides a passing test; a node whose first
    /// child it does not decide is reduced as before. First the maximum alone: `p(x) ≤ e_x`
    /// (the sum is at least the maximum's weight, 1), so where `e_x` fails the test the bound
    /// is not read (a tree's first children are often rejected: measured, reading it anyway
    /// made the target-only rule 15–27 % slower on rows that reject them).
    fn softmax_passes(
        &self,
        row: &[f32],
        t: f32,
        x: usize,
        test: &mut dyn FnMut(f32) -> bool,
    ) -> bool {
        let isa = self.split.isa();
        let m = kernels::softmax_max(isa, row, t);
        let e = softmax_exp(row[x], t, m);
        m.is_finite()
            && test(e)
            && kernels::sum_bound(isa, row, t, Some(m))
                .and_then(|b| b.p_range(e))
                .is_some_and(|(lo, _)| test(lo))
    }

    fn with_softmax_probs(&self, row: &[f32], sm: &Softmax, f: &mut dyn FnMut(&[f32])) {
        self.with_probs(row, sm, f);
    }

    fn softmax_entropy(&self, row: &[f32], sm: &Softmax) -> f32 {
        self.with_probs(row, sm, |p| self.split.entropy(p))
    }

    fn softmax_race(&self, rng: RaceRng, row: &[f32], sm: &Softmax, tried: &[u32]) -> Option<u32> {
        self.with_probs(row, sm, |p| {
            if tried.is_empty() {
                self.split.race(rng, p)
            } else {
                self.race_excluding(rng, p, tried)
            }
        })
    }
}

impl<const K: usize> CpuVerifier<K> {
    /// Verifies a batch of token trees (EAGLE / Medusa / SpecInfer; layout and rules in
    /// `core/DETERMINISM.md`, "Token trees"), bit-identical to
    /// [`verify_tree_batch`](specula_core::verify::tree::verify_tree_batch), and counts every
    /// request in this verifier's counters as the reference does
    /// (`record_tree(depth, nodes − 1, accepted)`: a chain of the tree's depth plus the tree
    /// counts), so tree steps flow through the same readback, slot, log line and Prometheus
    /// exporter. On error nothing is written or counted, and the error is the one
    /// [`validate_tree_with`](specula_core::verify::tree::validate_tree_with) reports with
    /// [`Support::CPU`], the reference's. bf16 / f16 rows (target logits or probabilities,
    /// draft rows): each row the walk reads is widened exactly into binary32 scratch when it
    /// first reads it (the thread's buffers, kept between calls) for the vectorised
    /// reductions; they give the bits of the tree of the widened rows, as the reference's.
    ///
    /// ```
    /// use specula::cpu::CpuVerifier;
    /// use specula::specula_core::verify::tree::{PathOut, Tree, TreeBatch, TreeDims, TreeOutputs};
    /// use specula::specula_core::verify::{AcceptedOut, Check, Method, Streams, TokensOut};
    ///
    /// let verifier = CpuVerifier::<8>::new(2).unwrap();
    /// // Root with two candidates, tokens 1 and 0; V = 2; the target puts 0.9 on token 0.
    /// let target = [0.1, 0.9, /* node 1 */ 0.5, 0.5, /* node 2 */ 1.0, 0.0];
    /// let batch = TreeBatch::new(
    ///     TreeDims { vocab: 2, max_nodes: 3, max_depth: 1 },
    ///     Tree { nodes: &[3], tokens: &[0, 0, 1], first_child: &[1, -1, -1], next_sibling: &[-1, 2, -1] },
    ///     &target,
    ///     Streams { seed: &[7], offset: &[0] },
    /// );
    /// let (mut accepted, mut path, mut tokens) = ([0u32; 1], [0u32; 2], [0u32; 2]);
    /// let mut out = TreeOutputs::new(AcceptedOut(&mut accepted), PathOut(&mut path), TokensOut(&mut tokens));
    /// verifier.verify_tree(Method::Greedy, Check::STRICT, &batch, &mut out).unwrap();
    /// assert_eq!((accepted, path, tokens), ([1], [0, 2], [1, 0]));
    /// assert_eq!(verifier.totals().accepted_tokens, 1);
    /// assert_eq!((verifier.totals().tree_drafts, verifier.totals().tree_draft_tokens), (1, 2));
    /// ```
    pub fn verify_tree(
        &self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), VerifyError> {
        validate_tree_shape_with::<K>(Support::CPU, batch, out)?;
        // Device outputs were refused by the validation above.
        let (AcceptedOut(accepted), PathOut(path), TokensOut(tokens)) = out.host()?;
        let n = batch.requests();
        let width = batch.max_depth + 1;
        let mut depths = vec![0usize; n];
        let rows = accepted
            .iter_mut()
            .zip(path.chunks_exact_mut(width))
            .zip(tokens.chunks_exact_mut(width));
        match &self.pool {
            Some(pool) if n >= self.threads => pool.install(|| {
                // `try_for_each` may stop at any failing request: report the lowest, as the
                // reference does.
                let first = depths
                    .par_iter_mut()
                    .enumerate()
                    .map(|(b, d)| validate_tree_request(method, check, batch, b).map(|x| *d = x))
                    .find_map_first(Result::err);
                if let Some(e) = first {
                    return Err(e);
                }
                accepted
                    .par_iter_mut()
                    .zip(path.par_chunks_exact_mut(width))
                    .zip(tokens.par_chunks_exact_mut(width))
                    .enumerate()
                    .for_each_init(
                        || TreeRows::new(SplitOps::single()),
                        |ops, (b, ((acc, path), tokens))| {
                            *acc = ops.verify(false, method, batch, b, path, tokens);
                        },
                    );
                Ok(())
            })?,
            pool => {
                for (b, d) in depths.iter_mut().enumerate() {
                    *d = validate_tree_request(method, check, batch, b)?;
                }
                // Fewer requests than threads: one by one, each row cut over the pool (without
                // a pool, on the calling thread).
                let mut ops = TreeRows::new(SplitOps::new(self.threads, pool.as_ref()));
                for (b, ((acc, path), tokens)) in rows.enumerate() {
                    *acc = ops.verify(self.reference, method, batch, b, path, tokens);
                }
            }
        }
        let mut local = Counters::<K>::ZERO;
        for (b, (&depth, &acc)) in depths.iter().zip(accepted.iter()).enumerate() {
            if depth > 0 {
                let nodes = batch.node_count(b) - 1;
                let recorded = local.record_tree(depth, nodes, acc as usize);
                // Validated: depth ≤ max_depth ≤ K, the path is at most the depth, and every
                // depth up to the deepest holds a node.
                debug_assert!(recorded.is_ok());
            }
        }
        lock(&self.counters).add(&local);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
