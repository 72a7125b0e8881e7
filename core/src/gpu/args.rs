//! [`StepViews`]: the views every step kind's launch has, chain ([`VerifyArgs`](super::VerifyArgs))
//! or tree ([`TreeArgs`](super::TreeArgs)), and what is made of them the same way for both:
//! their fields of the argument block ([`field!`]) and their length checks. They need only the
//! driver's [`Memory`], so this file sits below the driver.

use super::block::ArgBlock;
use super::view::{Memory, RowsView, View, ViewMut};

/// An argument block field: what `$at` (a driver's base address of a buffer plus a byte
/// offset) gives view `$v`'s buffer and byte offset; `?` before an optional view: null (`0`)
/// without one.
macro_rules! field {
    ($at:ident, ?$v:expr) => {
        $v.map_or(0, |v| field!($at, v))
    };
    ($at:ident, $v:expr) => {
        $at($v.buffer(), $v.byte_offset())
    };
}
pub(super) use field;

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
    /// The argument block of a launch of these views ([`Launch`](super::Launch::arg_block),
    /// [`TreeLaunch`](super::TreeLaunch::arg_block)): their fields, the counters `stats` and
    /// one slice per request, completed by `own` with the fields of the step kind through the
    /// same `at` (`address` of a buffer plus a byte offset, [`field!`]); every other field
    /// null.
    pub(super) fn arg_block<'l>(
        &'l self,
        stats: &'l D::Buffer,
        mut address: impl FnMut(&'l D::Buffer) -> u64,
        own: impl FnOnce(&mut dyn FnMut(&'l D::Buffer, usize) -> u64, ArgBlock) -> ArgBlock,
    ) -> ArgBlock {
        let mut at = |b: &'l D::Buffer, offset: usize| address(b).wrapping_add(offset as u64);
        let logits = self.temperature.is_some();
        let step = ArgBlock {
            shape: field!(at, self.shape),
            draft_probs: field!(at, ?self.draft_probs),
            target_probs: field!(at, ?(!logits).then_some(self.target)),
            seed: field!(at, self.seed),
            offset: field!(at, self.offset),
            eps: field!(at, self.eps),
            delta: field!(at, self.delta),
            accepted: field!(at, self.accepted),
            tokens: field!(at, self.tokens),
            stats: at(stats, 0),
            target_logits: field!(at, ?logits.then_some(self.target)),
            temperature: field!(at, ?self.temperature),
            slices: 1,
            ..ArgBlock::default()
        };
        own(&mut at, step)
    }

    /// The checks of these views a launch makes without reading device memory: at least
    /// `shape_words` shape words, and at least `capacity` elements in every per-request
    /// buffer (the temperatures included when given), in the outputs and in the step kind's
    /// own buffers, of lengths `lens`.
    pub(super) fn fits(&self, shape_words: usize, lens: &[usize]) -> bool {
        let b = self.capacity as usize;
        let views = [
            self.seed.len(),
            self.offset.len(),
            self.eps.len(),
            self.delta.len(),
        ];
        let outputs = [self.accepted.len(), self.tokens.len()];
        self.shape.len() >= shape_words
            && views.iter().chain(&outputs).chain(lens).all(|&n| n >= b)
            && self.temperature.is_none_or(|t| t.len() >= b)
    }
}
