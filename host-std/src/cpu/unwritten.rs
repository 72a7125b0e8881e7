//! The lazy path's full row raced without being written out ([`UnwrittenRow`]): the rejected
//! position's row (the residual race) or the bonus row (the plain race) of a request that is not
//! plain, raced over its weights and its cut ([`kernels::CutRow`]) instead of over the
//! probabilities written into the one-request batch. That saved write-out was a division, a
//! store and a reload per id, the row's zeroing afterwards, and (with binary32 draft rows) a
//! copy of the draft row and its zeroing.

use super::kernels::{self, CutRow, Minus};
use super::ops::{ChunkedOps, SplitOps};
use specula_core::verify::{RaceRng, RowOps, ScalarOps, Softmax};

/// The reductions the CPU verifies requests with: [`RowOps`], and the vectorised race over
/// weights where the ops are the vectorised ones.
pub(super) trait CpuOps: RowOps {
    /// The vectorised ops (on this thread, or shared with a pool as `self` shares rows);
    /// `None` for the reference ops, which race over written rows only.
    fn split(&self) -> Option<SplitOps<'_>>;
}

impl CpuOps for ScalarOps {
    fn split(&self) -> Option<SplitOps<'_>> {
        None
    }
}

impl CpuOps for ChunkedOps {
    fn split(&self) -> Option<SplitOps<'_>> {
        Some(SplitOps::single())
    }
}

impl CpuOps for SplitOps<'_> {
    fn split(&self) -> Option<SplitOps<'_>> {
        Some(*self)
    }
}

/// The ops of a lazy request's one-request batch whose one full row was not written (its slot
/// holds zeros but at the drafted id): a race over that slot runs over `row` instead (the same
/// bits: [`CutRow`]); every other call goes to `inner`. The walk races only over that row (the
/// residual race where the row's draft was rejected, then, if no residual weight is positive,
/// the plain race; or the plain race of the bonus row), and reads nothing else of it but
/// `p(x)` and `q(x)` at the drafted id, which the slots hold.
pub(super) struct UnwrittenRow<'a, O: ?Sized> {
    pub inner: &'a O,
    pub split: SplitOps<'a>,
    /// The slot of the row in the one-request batch (its first value).
    pub slot: *const f32,
    /// The row's weights and cut, with nothing subtracted.
    pub row: CutRow<'a>,
    /// The request's binary32 draft row at that position, where the batch has draft rows.
    pub draft: Option<&'a [f32]>,
}

impl<O: RowOps + ?Sized> UnwrittenRow<'_, O> {
    fn is_slot(&self, row: &[f32]) -> bool {
        std::ptr::eq(row.as_ptr(), self.slot) && row.len() == kernels::Weights::len(&self.row)
    }
}

impl<O: RowOps + ?Sized> RowOps for UnwrittenRow<'_, O> {
    fn argmax(&self, row: &[f32]) -> u32 {
        self.inner.argmax(row)
    }
    fn entropy(&self, row: &[f32]) -> f32 {
        self.inner.entropy(row)
    }
    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
        if self.is_slot(row) {
            return self.split.race_with(rng, self.row);
        }
        self.inner.race(rng, row)
    }
    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32> {
        if !self.is_slot(target) {
            return self.inner.race_residual(rng, target, draft, token);
        }
        let minus = match draft {
            // The one-request batch has draft rows exactly when the request has, and then so
            // does `self` (set up that way by the lazy path).
            Some(_) => Minus::Draft(
                self.draft
                    .expect("an unwritten row's request has draft rows when its batch has"),
            ),
            None => Minus::OneHot(token),
        };
        self.split.race_with(rng, self.row.minus(minus))
    }
    fn race_excluding(&self, rng: RaceRng, row: &[f32], tried: &[u32]) -> Option<u32> {
        self.inner.race_excluding(rng, row, tried)
    }
    fn race_speculative(
        &self,
        rng: RaceRng,
        row: &[f32],
        drafts: &[&[f32]],
        z: &[f64],
    ) -> Option<u32> {
        self.inner.race_speculative(rng, row, drafts, z)
    }
    fn softmax(&self, row: &[f32], t: f32) -> Softmax {
        self.inner.softmax(row, t)
    }
    fn softmax_argmax(&self, row: &[f32], sm: &Softmax) -> u32 {
        self.inner.softmax_argmax(row, sm)
    }
    fn softmax_entropy(&self, row: &[f32], sm: &Softmax) -> f32 {
        self.inner.softmax_entropy(row, sm)
    }
    fn softmax_passes(
        &self,
        row: &[f32],
        t: f32,
        x: usize,
        test: &mut dyn FnMut(f32) -> bool,
    ) -> bool {
        self.inner.softmax_passes(row, t, x, test)
    }
    fn with_softmax_probs(&self, row: &[f32], sm: &Softmax, f: &mut dyn FnMut(&[f32])) {
        self.inner.with_softmax_probs(row, sm, f);
    }
    fn softmax_race(&self, rng: RaceRng, row: &[f32], sm: &Softmax, tried: &[u32]) -> Option<u32> {
        self.inner.softmax_race(rng, row, sm, tried)
    }
}
