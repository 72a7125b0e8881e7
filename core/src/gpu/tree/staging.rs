//! [`TreeStep`]: the tree's part of the [`Staging`](super::super::Staging) of host-slice batches,
//! and the tree entry's shape words ([`tree_shape`]).

use super::super::driver::Driver;
use super::super::error::GpuError;
use super::super::staging::{
    ACCEPTED, COMMON, Common, Dst, MAX_SLOTS, SUPPORT, Split, Staging, Step, TOKENS, owned_out,
    sealed, upload,
};
use super::super::verifier::GpuVerifier;
use super::super::view::{Memory, ViewMut};
use super::args::TreeArgs;
use crate::gpu::kernels::{self, ShapeTooLarge};
use crate::verify::tree::{TreeBatch, TreeOutputs, validate_tree_inputs_with, validate_tree_with};
use crate::verify::{Check, Method, Param, Streams, VerifyError};

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
/// type argument ([`Staging<D, TreeStep>`](super::super::Staging)): no value of it exists.
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
