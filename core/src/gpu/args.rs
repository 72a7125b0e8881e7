//! [`StepViews`]: the views every step kind's launch has, chain ([`VerifyArgs`](super::VerifyArgs))
//! or tree ([`TreeArgs`](super::TreeArgs)), and what is made of them the same way for both:
//! their fields of the argument block and their length checks. They need only the driver's
//! [`Memory`], so this file sits below the driver.

use super::block::ArgBlock;
use super::view::{Element, Memory, RowsView, View, ViewMut};

/// The device buffers every verification step has, chain or tree, typed and borrowed: the
/// compiler checks that they outlive every launch and every graph captured on them. Laid out as
/// `core/DETERMINISM.md` says; the values behind them are read by the kernel at run time, so a
/// graph replays with new values copied into the same buffers. The
/// [`step`](super::VerifyArgs::step) of [`VerifyArgs`](super::VerifyArgs) and of
/// [`TreeArgs`](super::TreeArgs).
#[derive(Debug)]
pub struct StepViews<'a, D: Memory> {
    /// Blocks launched: the largest batch these buffers hold (`≥` the batch shape word).
    pub capacity: u32,
    /// The shape words: a chain's [`SHAPE_WORDS`](crate::gpu::kernels::SHAPE_WORDS)
    /// ([`shape_words`](crate::gpu::kernels::shape_words)), a tree's
    /// [`TREE_SHAPE_WORDS`](crate::gpu::kernels::TREE_SHAPE_WORDS)
    /// ([`tree_shape`](super::tree_shape)); the counters-`K` word must be `K`.
    pub shape: View<'a, D, u32>,
    /// Draft rows (a tree: one per node slot), binary32 or bf16 / f16 (the shape's
    /// [`FLAG_DRAFT_BF16`](crate::gpu::kernels::FLAG_DRAFT_BF16) /
    /// [`FLAG_DRAFT_F16`](crate::gpu::kernels::FLAG_DRAFT_F16) say which, strides in elements;
    /// a chain's half rows take the logits entries); `None` with a one-hot drafter (a tree: the
    /// target-only rule).
    pub draft_probs: Option<RowsView<'a, D>>,
    /// Target rows (a tree: one per node slot): probabilities, or logits when
    /// [`temperature`](Self::temperature) is given (a chain: the logits entries); binary32 or
    /// bf16 / f16, the shape's [`FLAG_TARGET_BF16`](crate::gpu::kernels::FLAG_TARGET_BF16) /
    /// [`FLAG_TARGET_F16`](crate::gpu::kernels::FLAG_TARGET_F16) say which. A chain's
    /// probabilities are binary32: no chain entry reads half ones (refused at launch).
    pub target: RowsView<'a, D>,
    /// Seeds.
    pub seed: View<'a, D, u64>,
    /// Offsets.
    pub offset: View<'a, D, u64>,
    /// Typical acceptance `ε` (read only by typical acceptance).
    pub eps: View<'a, D, f32>,
    /// Typical acceptance `δ` (read only by typical acceptance).
    pub delta: View<'a, D, f32>,
    /// Output: accepted counts (a tree: accepted path lengths).
    pub accepted: ViewMut<'a, D, u32>,
    /// Output: tokens (a tree: the emitted tokens, `B · (max_depth + 1)`).
    pub tokens: ViewMut<'a, D, u32>,
    /// Per-request temperature (B values; `0`: greedy on the logits, `> 0`: each row's softmax,
    /// `core/DETERMINISM.md`): with it, [`target`](Self::target) holds logits. `None`:
    /// probabilities.
    pub temperature: Option<View<'a, D, f32>>,
}

impl<D: Memory> StepViews<'_, D> {
    /// The argument block's fields these views fill, with the counters `stats` and one slice
    /// per request, every other field null: the block a launch's `arg_block`
    /// ([`Launch`](super::Launch::arg_block), [`TreeLaunch`](super::TreeLaunch::arg_block))
    /// completes with the fields of its step kind, through the same `f`.
    pub(super) fn arg_block<'l, F: FnMut(&'l D::Buffer) -> u64>(
        &'l self,
        stats: &'l D::Buffer,
        f: &mut Fields<F>,
    ) -> ArgBlock {
        let logits = self.temperature.is_some();
        ArgBlock {
            shape: f.of(self.shape),
            draft_probs: f.opt(self.draft_probs),
            target_probs: f.opt((!logits).then_some(self.target)),
            seed: f.of(self.seed),
            offset: f.of(self.offset),
            eps: f.of(self.eps),
            delta: f.of(self.delta),
            accepted: f.of(&self.accepted),
            tokens: f.of(&self.tokens),
            stats: f.of((stats, 0)),
            target_logits: f.opt(logits.then_some(self.target)),
            temperature: f.opt(self.temperature),
            slices: 1,
            ..ArgBlock::default()
        }
    }

    /// The checks of these views a launch makes without reading device memory: at least
    /// `shape_words` shape words, and at least `capacity` elements in every per-request
    /// buffer (the temperatures included when given) and in the outputs.
    pub(super) fn fits(&self, shape_words: usize) -> bool {
        let b = self.capacity as usize;
        self.shape.len() >= shape_words
            && [
                self.seed.len(),
                self.offset.len(),
                self.eps.len(),
                self.delta.len(),
                self.accepted.len(),
                self.tokens.len(),
            ]
            .iter()
            .all(|&n| n >= b)
            && self.temperature.is_none_or(|t| t.len() >= b)
    }
}

/// Where a view starts in device memory: the buffer (borrowed for `'l`) and the byte offset an
/// argument block's field is made of.
pub(super) trait Place<'l, B: 'l> {
    /// The buffer and the byte offset.
    fn place(self) -> (&'l B, usize);
}

impl<'l, 'a: 'l, D: Memory, T: Element> Place<'l, D::Buffer> for View<'a, D, T> {
    fn place(self) -> (&'l D::Buffer, usize) {
        (self.buffer(), self.byte_offset())
    }
}

impl<'l, 'a: 'l, D: Memory> Place<'l, D::Buffer> for RowsView<'a, D> {
    fn place(self) -> (&'l D::Buffer, usize) {
        (self.buffer(), self.byte_offset())
    }
}

impl<'l, D: Memory, T: Element> Place<'l, D::Buffer> for &'l ViewMut<'_, D, T> {
    fn place(self) -> (&'l D::Buffer, usize) {
        (self.buffer(), self.byte_offset())
    }
}

impl<'l, B> Place<'l, B> for (&'l B, usize) {
    fn place(self) -> (&'l B, usize) {
        self
    }
}

/// Argument block fields from a driver's base address of a buffer (`F`, as
/// [`Launch::arg_block`](super::Launch::arg_block) takes it): a view's field is its buffer's
/// address plus its byte offset, an absent view's null (`0`).
pub(super) struct Fields<F>(pub(super) F);

impl<F> Fields<F> {
    /// The field of view `v`.
    pub(super) fn of<'l, B: 'l>(&mut self, v: impl Place<'l, B>) -> u64
    where
        F: FnMut(&'l B) -> u64,
    {
        let (buf, offset) = v.place();
        (self.0)(buf).wrapping_add(offset as u64)
    }

    /// The field of view `v`, null without one.
    pub(super) fn opt<'l, B: 'l>(&mut self, v: Option<impl Place<'l, B>>) -> u64
    where
        F: FnMut(&'l B) -> u64,
    {
        v.map_or(0, |v| self.of(v))
    }
}
