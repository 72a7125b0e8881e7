//! Token trees on the GPU: the tree entry points of the kernel text
//! ([`kernels::TREE_ENTRY`] for binary32 rows, [`kernels::TREE_HALF_ENTRY`] when the views hold
//! half rows: [`TreeLaunch::entry_name`]; `core/kernels/specula_tree.cu`) launched by [`GpuVerifier`] over
//! any [`Driver`](super::Driver), with the same counters buffer as chain launches (so tree counts flow
//! through the same [`GpuReadback`](super::GpuReadback), slot and exporters).
//!
//! * The step path: [`GpuVerifier::launch`] on typed views ([`TreeArgs`]), or a
//!   [`VerifyGraph`](super::VerifyGraph)`<D, `[`TreeStep`]`>` captured once
//!   ([`GpuVerifier::capture`]) and replayed ([`GpuVerifier::replay`]): the chain's calls, one
//!   block per request, nothing synchronises. A malformed tree on this path is the kernel's to
//!   catch: it sets [`kernels::ERR_TREE`] (a node token `≥ V`: [`kernels::ERR_TOKEN`]) and
//!   skips that request only.
//! * The host-slice path: [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree), as
//!   `CpuVerifier::verify_tree` of the CPU backend (the reference's validation first, with the
//!   same [`VerifyError`](crate::verify::VerifyError)s; one synchronising call), staged in
//!   grow-only buffers ([`Staging`](super::Staging)`<D, `[`TreeStep`]`>`); rows in device memory
//!   ([`Values::Device`](crate::verify::Values::Device)) are read in place, and outputs in
//!   device memory ([`TreeOutputs::on_device`]) are written in place, with no copy down and no
//!   synchronising call.
//!
//! Rows may be binary32, bf16 or f16 (host or device; [`RowsView`](super::RowsView) in the
//! [`target`](super::StepViews::target) and [`draft_probs`](super::StepViews::draft_probs) of
//! [`TreeArgs::step`], and the shape's half flags): the tree entry widens each value exactly as
//! it reads it, so half rows give the bits of the tree of their widened values.
//!
//! The tree entry takes target probabilities, or target logits with a temperature per request
//! ([`target`](super::StepViews::target) with [`temperature`](super::StepViews::temperature);
//! `0`: greedy on the logit rows, `> 0`: each node row's softmax computed on the fly,
//! `core/DETERMINISM.md`).

use super::args::{StepViews, field};
use super::block::ArgBlock;
use super::driver::Driver;
use super::error::GpuError;
use super::kernels::{self, ShapeTooLarge};
use super::staging::sealed::{self, Download, Launch as Launches, download};
use super::staging::{
    ACCEPTED, COMMON, Common, Dst, MAX_SLOTS, SUPPORT, Split, Staging, Step, TOKENS, owned_out,
    upload,
};
use super::verifier::GpuVerifier;
use super::view::{Memory, View, ViewMut};
use crate::verify::tree::{TreeBatch, TreeOutputs, validate_tree_inputs_with, validate_tree_with};
use crate::verify::{Check, Method, Param, Streams, VerifyError};

/// The device buffers of one tree-verification step, typed and borrowed like
/// [`VerifyArgs`](super::VerifyArgs): the compiler checks that they outlive every launch
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
    /// Threads per block ([`Driver::block_threads`](super::Driver::block_threads)).
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
    /// args have half rows ([`RowsView::Half`](super::RowsView::Half) in
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
    /// `address` gives a buffer's base address, as in [`Launch::arg_block`](super::Launch::arg_block).
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

/// The tree's own buffer slots, after the common ones, in the order of [`TreeArgs`]' fields.
const SLOTS: usize = COMMON + 5;
const NODES: usize = COMMON;
const NODE_TOKENS: usize = COMMON + 1;
const FIRST: usize = COMMON + 2;
const NEXT: usize = COMMON + 3;
const PATH: usize = COMMON + 4;
const _: () = assert!(SLOTS <= MAX_SLOTS);

/// The shape words of launching `method` over `batch` with `Counters<K>`: the chain's
/// [`shape_words`](kernels::shape_words) (`k_max` = the tree's `max_depth`) with the half
/// flags of the rows' formats ([`FLAG_TARGET_BF16`](kernels::FLAG_TARGET_BF16), ...), then the
/// node slots per request ([`TREE_SHAPE_NODES`](kernels::TREE_SHAPE_NODES)).
pub fn tree_shape<const K: usize>(
    method: Method,
    batch: &TreeBatch<'_>,
) -> Result<[u32; kernels::TREE_SHAPE_WORDS], ShapeTooLarge> {
    let w = |x: usize| u32::try_from(x).map_err(|_| ShapeTooLarge);
    let draft_stride = match batch.draft {
        Some(d) => Some(w(d.stride)?),
        None => None,
    };
    let chain = kernels::shape_words(
        w(batch.requests())?,
        w(batch.max_depth)?,
        w(batch.vocab)?,
        draft_stride,
        w(batch.target.rows().stride)?,
        kernels::method_code(method),
        w(K)?,
    );
    let mut shape = [0u32; kernels::TREE_SHAPE_WORDS];
    shape[..kernels::SHAPE_WORDS].copy_from_slice(&chain);
    let draft = batch.draft.map(|d| d.format());
    shape[kernels::SHAPE_FLAGS] |= kernels::half_flags(batch.target.rows().format(), draft);
    shape[kernels::TREE_SHAPE_NODES] = w(batch.max_nodes)?;
    Ok(shape)
}

/// The tree step: a [`TreeBatch`] staged into [`TreeArgs`] for the tree entries
/// ([`GpuVerifier::launch_staged`]). Only a
/// type argument ([`Staging<D, TreeStep>`](super::Staging)): no value of it exists.
#[derive(Clone, Copy, Debug)]
pub enum TreeStep {}

impl Step for TreeStep {
    type Batch<'b> = TreeBatch<'b>;
    type Args<'s, D: Driver> = TreeArgs<'s, D>;
    type Outputs<'o> = TreeOutputs<'o>;
    type Produce = ();
}

/// The caller's device outputs the launch writes: accepted, path, tokens.
type Out<'d, D> = (
    ViewMut<'d, D, u32>,
    ViewMut<'d, D, u32>,
    ViewMut<'d, D, u32>,
);

impl sealed::Stage for TreeStep {
    type Needs = [usize; SLOTS];
    type Out<'d, D: Memory> = Out<'d, D>;
    // One entry family: any tree batch replays a tree graph of its capacity.
    type Key = ();
    // Every slot is allocated, even for a batch that leaves it unused (probabilities leave the
    // temperatures' unused).
    const OPTIONAL: &'static [usize] = &[];

    fn validate<const K: usize>(batch: &TreeBatch<'_>) -> Result<(), VerifyError> {
        validate_tree_inputs_with::<K>(SUPPORT, batch)
    }

    /// The reference's validation, with what the tree entry reads ([`SUPPORT`]: binary32,
    /// bf16 or f16 rows, in host or device memory).
    fn check<const K: usize>(
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &TreeOutputs<'_>,
    ) -> Result<(), VerifyError> {
        validate_tree_with::<K>(SUPPORT, method, check, batch, out)
    }

    fn produce(_: &TreeOutputs<'_>) {}

    fn out_views<'d, D: Driver>(
        drv: &D,
        out: &'d mut TreeOutputs<'_>,
    ) -> Result<Option<Out<'d, D>>, GpuError<D::Error>> {
        let TreeOutputs::Device { outputs: out } = out else {
            return Ok(None);
        };
        Ok(Some((
            owned_out(drv, &mut out.accepted, Param::Accepted)?,
            owned_out(drv, &mut out.path, Param::Path)?,
            owned_out(drv, &mut out.tokens, Param::Tokens)?,
        )))
    }

    fn staging<D: Driver, const K: usize>(v: &mut GpuVerifier<D, K>) -> &mut Staging<D, Self> {
        &mut v.trees
    }

    fn prepare<D: Driver>(drv: &D) -> Result<(), GpuError<D::Error>> {
        drv.prepare_tree().map_err(GpuError::Driver)
    }

    fn common<'h>(batch: &<Self as Step>::Batch<'h>) -> Common<'h> {
        let (seed, offset, draft) = (batch.seed, batch.offset, batch.draft.map(|d| d.values));
        let typical = [batch.eps, batch.delta];
        (draft, batch.target, Streams { seed, offset }, typical)
    }

    /// The byte sizes a (checked) batch needs in each buffer (device rows need none; device
    /// outputs still get the output buffers).
    fn needs<D: Memory>(
        batch: &TreeBatch<'_>,
        rows: &Split<'_, '_, D>,
        (): (),
        _device_out: bool,
    ) -> Option<[usize; SLOTS]> {
        let b = batch.requests();
        let out = b.checked_mul(batch.max_depth.checked_add(1)?)?;
        let w4 = |n: usize| n.checked_mul(4);
        let tree = &batch.tree;
        rows.needs(
            (kernels::TREE_SHAPE_WORDS, b, out),
            &[
                w4(b)?,
                w4(tree.tokens.len())?,
                w4(tree.first_child.len())?,
                w4(tree.next_sibling.len())?,
                w4(out)?,
            ],
        )
    }

    fn write<'s, const K: usize, D: Driver>(
        dst: &Dst<'s, '_, D>,
        method: Method,
        batch: &TreeBatch<'_>,
        rows: Split<'_, 's, D>,
        out_views: Option<Out<'s, D>>,
        (): (),
    ) -> Result<TreeArgs<'s, D>, GpuError<D::Error>> {
        let shape = tree_shape::<K>(method, batch).map_err(|_| GpuError::TooLarge)?;
        let (accepted, path, tokens) = match out_views {
            // Device outputs: `verify_staged` made them from outputs that validation checked
            // against this batch (`b` counts, `out` path and token slots).
            Some(o) => o,
            None => (dst.out(ACCEPTED)?, dst.out(PATH)?, dst.out(TOKENS)?),
        };
        let (drv, stream, tree) = (dst.drv, dst.stream, &batch.tree);
        Ok(TreeArgs {
            step: dst.step(&shape, batch.requests(), rows, (accepted, tokens))?,
            nodes: upload(drv, stream, dst.buf(NODES)?, tree.nodes)?,
            tree_tokens: upload(drv, stream, dst.buf(NODE_TOKENS)?, tree.tokens)?,
            first_child: upload(drv, stream, dst.buf(FIRST)?, tree.first_child)?,
            next_sibling: upload(drv, stream, dst.buf(NEXT)?, tree.next_sibling)?,
            path,
        })
    }
}

/// The tree step's launch: the tree entry ([`Driver::launch_tree`]), one block per request,
/// never split (apart from the chain's entries: its own kernel parameters and no scratch).
impl<D: Driver> Launches<D> for TreeArgs<'_, D> {
    type Step = TreeStep;

    fn capacity(&self) -> u32 {
        self.step.capacity
    }

    fn key(&self) {}

    /// The tree's shape words, and at least `capacity` elements in every per-request buffer
    /// and in every per-node or per-slot one (each request has at least one node slot and one
    /// output slot), the temperatures included when given. The extents and formats the shape
    /// words give are the caller's promise (the unsafe launch).
    fn fits(&self) -> bool {
        let s = &self.step;
        let own = [
            self.nodes.len(),
            self.tree_tokens.len(),
            self.first_child.len(),
            self.next_sibling.len(),
            self.path.len(),
            s.target.len(),
        ];
        s.fits(kernels::TREE_SHAPE_WORDS, &own)
            && s.draft_probs.is_none_or(|d| d.len() >= s.capacity as usize)
    }

    fn enqueue<const K: usize>(&self, v: &GpuVerifier<D, K>) -> Result<(), GpuError<D::Error>> {
        let launch = TreeLaunch {
            grid: self.step.capacity.max(1),
            block: v.driver().block_threads(),
            args: self,
            stats: v.stats(),
        };
        v.driver()
            .launch_tree(v.stream(), &launch)
            .map_err(GpuError::Driver)
    }

    fn downloads<'x>(
        &'x self,
        out: &'x mut TreeOutputs<'_>,
    ) -> Result<[Download<'x, D>; 3], GpuError<D::Error>> {
        let (accepted, path, tokens) = match out {
            TreeOutputs::Host {
                accepted,
                path,
                tokens,
            } => (&mut **accepted, &mut **path, &mut **tokens),
            // The launch wrote them in place: only the stats words are copied.
            TreeOutputs::Device { .. } => (&mut [][..], &mut [][..], &mut [][..]),
        };
        Ok([
            download(&self.step.accepted, accepted)?,
            download(&self.path, path)?,
            download(&self.step.tokens, tokens)?,
        ])
    }
}
