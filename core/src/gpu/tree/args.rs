//! The typed views of one launch of a tree entry point
//! ([`kernels::TREE_ENTRY_NAMES`](crate::gpu::kernels::TREE_ENTRY_NAMES)): [`TreeArgs`], [`TreeLaunch`],
//! which [`Driver::launch_tree`](super::super::Driver::launch_tree) takes. They need only the
//! driver's [`Memory`] (views into its buffers), so this file sits below the driver.

use super::super::block::ArgBlock;
use super::super::view::{Memory, RowsView, View, ViewMut};

/// The device buffers of one tree-verification step, typed and borrowed like
/// [`VerifyArgs`](super::super::VerifyArgs): the compiler checks that they outlive every launch
/// and every graph captured on them. Laid out as `core/DETERMINISM.md` ("Token trees") says;
/// the values behind them (shape words, node counts, links, seeds, ...) are read by the kernel
/// at run time, so one graph replays every step's trees copied into the same buffers.
#[derive(Debug)]
pub struct TreeArgs<'a, D: Memory> {
    /// Blocks launched: the largest batch these buffers hold (`≥` the batch shape word).
    pub capacity: u32,
    /// [`TREE_SHAPE_WORDS`](crate::gpu::kernels::TREE_SHAPE_WORDS) shape words
    /// ([`tree_shape`](super::tree_shape)); the counters-`K` word must be `K`.
    pub shape: View<'a, D, u32>,
    /// `nodes[b]`: request `b`'s node count.
    pub nodes: View<'a, D, u32>,
    /// Node tokens, `B · N`.
    pub tree_tokens: View<'a, D, u32>,
    /// First-child links, `B · N` (`-1`: none).
    pub first_child: View<'a, D, i32>,
    /// Next-sibling links, `B · N` (`-1`: none).
    pub next_sibling: View<'a, D, i32>,
    /// Draft rows, one per node slot, binary32 or bf16 / f16 (the shape words'
    /// [`FLAG_DRAFT_BF16`](crate::gpu::kernels::FLAG_DRAFT_BF16) /
    /// [`FLAG_DRAFT_F16`](crate::gpu::kernels::FLAG_DRAFT_F16) say which, strides in
    /// elements); `None` for the target-only rule.
    pub draft_probs: Option<RowsView<'a, D>>,
    /// Target rows, one per node slot: probabilities, or logits when
    /// [`temperature`](Self::temperature) is given; binary32 or bf16 / f16 (the shape words'
    /// [`FLAG_TARGET_BF16`](crate::gpu::kernels::FLAG_TARGET_BF16) /
    /// [`FLAG_TARGET_F16`](crate::gpu::kernels::FLAG_TARGET_F16) say which).
    pub target: RowsView<'a, D>,
    /// Seeds.
    pub seed: View<'a, D, u64>,
    /// Offsets.
    pub offset: View<'a, D, u64>,
    /// Typical acceptance `ε` (read only by typical acceptance).
    pub eps: View<'a, D, f32>,
    /// Typical acceptance `δ` (read only by typical acceptance).
    pub delta: View<'a, D, f32>,
    /// Output: accepted path lengths.
    pub accepted: ViewMut<'a, D, u32>,
    /// Output: accepted node indices, `B · (max_depth + 1)`.
    pub path: ViewMut<'a, D, u32>,
    /// Output: emitted tokens, `B · (max_depth + 1)`.
    pub tokens: ViewMut<'a, D, u32>,
    /// Per-request temperature (B values; `0`: greedy on the logit rows, `> 0`: each row's
    /// softmax, `core/DETERMINISM.md`): with it, [`target`](Self::target) holds logits.
    /// `None`: probabilities.
    pub temperature: Option<View<'a, D, f32>>,
}

/// One launch of the tree entry point as the orchestration asks a driver for it: everything the
/// driver glue turns into its launch parameters, in the kernel's parameter order.
#[derive(Debug)]
pub struct TreeLaunch<'l, 'a, D: Memory> {
    /// Blocks: one per request of the capacity.
    pub grid: u32,
    /// Threads per block ([`Driver::block_threads`](super::super::Driver::block_threads)).
    pub block: u32,
    /// The step's buffers.
    pub args: &'l TreeArgs<'a, D>,
    /// The counters buffer, the chain launches' own ([`stats_words`](crate::gpu::kernels::stats_words)`(K)`
    /// `u64` words): tree counts flow through the same readback and slot.
    pub stats: &'l D::Buffer,
}

impl<'l, D: Memory> TreeLaunch<'l, '_, D> {
    /// The index in [`TREE_ENTRY_NAMES`](crate::gpu::kernels::TREE_ENTRY_NAMES) of the entry
    /// point this launch runs (what a driver loaded them by): `1`, the half entry, when the
    /// args have half rows ([`RowsView::Half`] in [`target`](TreeArgs::target) or
    /// [`draft_probs`](TreeArgs::draft_probs)), else `0`, the binary32 entry. (The shape
    /// words' half flags must agree, the caller's promise; the binary32 entry refuses them
    /// with [`ERR_SHAPE`](crate::gpu::kernels::ERR_SHAPE).)
    #[must_use]
    pub const fn entry_index(&self) -> usize {
        let draft = match &self.args.draft_probs {
            Some(d) => d.is_half(),
            None => false,
        };
        (draft || self.args.target.is_half()) as usize
    }

    /// The name of the tree entry point this launch runs
    /// ([`TREE_ENTRY`](crate::gpu::kernels::TREE_ENTRY) or
    /// [`TREE_HALF_ENTRY`](crate::gpu::kernels::TREE_HALF_ENTRY)).
    #[must_use]
    pub const fn entry_name(&self) -> &'static str {
        crate::gpu::kernels::TREE_ENTRY_NAMES[self.entry_index()]
    }

    /// The launch's only parameter, the kernel's argument block as the chain entries take it:
    /// node counts in [`k`](ArgBlock::k), node tokens in [`draft_ids`](ArgBlock::draft_ids), the
    /// links and the path in their own fields, half rows in the field of their binary32 kind
    /// (as the logits entries take them), every field the tree entry does not read null.
    /// `address` gives a buffer's base address, as in [`Launch::arg_block`](super::super::Launch::arg_block).
    pub fn arg_block(&self, mut address: impl FnMut(&'l D::Buffer) -> u64) -> ArgBlock {
        let a = self.args;
        let mut at = |b: &'l D::Buffer, off: usize| address(b).wrapping_add(off as u64);
        macro_rules! at {
            ($v:expr) => {
                at($v.buffer(), $v.byte_offset())
            };
        }
        ArgBlock {
            shape: at!(a.shape),
            k: at!(a.nodes),
            draft_ids: at!(a.tree_tokens),
            first_child: at!(a.first_child),
            next_sibling: at!(a.next_sibling),
            draft_probs: a.draft_probs.map_or(0, |v| at!(v)),
            target_probs: match a.temperature {
                None => at!(a.target),
                Some(_) => 0,
            },
            seed: at!(a.seed),
            offset: at!(a.offset),
            eps: at!(a.eps),
            delta: at!(a.delta),
            accepted: at!(a.accepted),
            path: at!(a.path),
            tokens: at!(a.tokens),
            stats: at(self.stats, 0),
            target_logits: match a.temperature {
                Some(_) => at!(a.target),
                None => 0,
            },
            temperature: a.temperature.map_or(0, |v| at!(v)),
            slices: 1,
            ..ArgBlock::default()
        }
    }
}
