//! The typed views of one launch of a tree entry point
//! ([`kernels::TREE_ENTRY_NAMES`](crate::gpu::kernels::TREE_ENTRY_NAMES)): [`TreeArgs`], [`TreeLaunch`],
//! which [`Driver::launch_tree`](super::super::Driver::launch_tree) takes. They need only the
//! driver's [`Memory`] (views into its buffers), so this file sits below the driver.

use super::super::args::{StepViews, field};
use super::super::block::ArgBlock;
use super::super::view::{Memory, View, ViewMut};

/// The device buffers of one tree-verification step, typed and borrowed like
/// [`VerifyArgs`](super::super::VerifyArgs): the compiler checks that they outlive every launch
/// and every graph captured on them. Laid out as `core/DETERMINISM.md` ("Token trees") says;
/// the values behind them (shape words, node counts, links, seeds, ...) are read by the kernel
/// at run time, so one graph replays every step's trees copied into the same buffers.
#[derive(Debug)]
pub struct TreeArgs<'a, D: Memory> {
    /// The views every step kind has: a tree's shape words
    /// ([`TREE_SHAPE_WORDS`](crate::gpu::kernels::TREE_SHAPE_WORDS)), its rows and per-request
    /// values, its accepted path lengths and emitted tokens.
    pub step: StepViews<'a, D>,
    /// `nodes[b]`: request `b`'s node count.
    pub nodes: View<'a, D, u32>,
    /// Node tokens, `B · N`.
    pub tree_tokens: View<'a, D, u32>,
    /// First-child links, `B · N` (`-1`: none).
    pub first_child: View<'a, D, i32>,
    /// Next-sibling links, `B · N` (`-1`: none).
    pub next_sibling: View<'a, D, i32>,
    /// Output: accepted node indices, `B · (max_depth + 1)`.
    pub path: ViewMut<'a, D, u32>,
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
    /// args have half rows ([`RowsView::Half`](super::super::RowsView::Half) in
    /// [`target`](StepViews::target) or [`draft_probs`](StepViews::draft_probs)), else `0`,
    /// the binary32 entry. (The shape words' half flags must agree, the caller's promise; the
    /// binary32 entry refuses them with [`ERR_SHAPE`](crate::gpu::kernels::ERR_SHAPE).)
    #[must_use]
    pub const fn entry_index(&self) -> usize {
        let s = &self.args.step;
        let draft = match &s.draft_probs {
            Some(d) => d.is_half(),
            None => false,
        };
        (draft || s.target.is_half()) as usize
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
    pub fn arg_block(&self, address: impl FnMut(&'l D::Buffer) -> u64) -> ArgBlock {
        let a = self.args;
        a.step.arg_block(self.stats, address, |at, step| ArgBlock {
            k: field!(at, a.nodes),
            draft_ids: field!(at, a.tree_tokens),
            first_child: field!(at, a.first_child),
            next_sibling: field!(at, a.next_sibling),
            path: field!(at, a.path),
            ..step
        })
    }
}
