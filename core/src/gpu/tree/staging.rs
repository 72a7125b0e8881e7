//! [`TreeStep`]: the tree's part of the [`Staging`](super::super::Staging) of host-slice batches,
//! and the tree entry's shape words ([`tree_shape`]).

use super::super::driver::Driver;
use super::super::error::GpuError;
use super::super::staging::{
    Arg, Dst, MAX_SLOTS, SUPPORT, Split, Step, oob, per_request, rows, sealed, upload,
};
use super::super::staging::{Staging, owned_out};
use super::super::verifier::GpuVerifier;
use super::super::view::{Memory, View, ViewMut};
use super::args::TreeArgs;
use crate::gpu::kernels::{self, ShapeTooLarge};
use crate::verify::tree::{TreeBatch, TreeOutputs, validate_tree_inputs_with, validate_tree_with};
use crate::verify::{
    Check, DEFAULT_DELTA, DEFAULT_EPS, Format, Method, Param, Rows, Target, Values, VerifyError,
};

/// Buffers, in the order of [`TreeArgs`]' fields.
const SLOTS: usize = 15;
const SHAPE: usize = 0;
const NODES: usize = 1;
const TOKENS: usize = 2;
const FIRST: usize = 3;
const NEXT: usize = 4;
const DPROBS: usize = 5;
const TPROBS: usize = 6;
const SEED: usize = 7;
const OFFSET: usize = 8;
const EPS: usize = 9;
const DELTA: usize = 10;
const ACCEPTED: usize = 11;
const PATH: usize = 12;
const OUT_TOKENS: usize = 13;
/// The temperatures (target logits only; the logits themselves go to `TPROBS`' buffer).
const TEMP: usize = 14;
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
    let flag = |rows: Rows<'_>, bf16: u32, f16: u32| match rows.format() {
        Format::F32 => 0,
        Format::Bf16 => bf16,
        Format::F16 => f16,
    };
    shape[kernels::SHAPE_FLAGS] |= flag(
        batch.target.rows(),
        kernels::FLAG_TARGET_BF16,
        kernels::FLAG_TARGET_F16,
    ) | batch.draft.map_or(0, |d| {
        flag(d, kernels::FLAG_DRAFT_BF16, kernels::FLAG_DRAFT_F16)
    });
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
    // Every slot is allocated, even for a batch that leaves it unused (probabilities: `TEMP`).
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

    fn tensors<'h>(batch: &<Self as Step>::Batch<'h>) -> (Option<Values<'h>>, Target<'h>) {
        (batch.draft.map(|d| d.values), batch.target)
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
        let w8 = |n: usize| n.checked_mul(8);
        Some([
            kernels::TREE_SHAPE_WORDS * 4,
            w4(b)?,
            w4(batch.tree.tokens.len())?,
            w4(batch.tree.first_child.len())?,
            w4(batch.tree.next_sibling.len())?,
            rows.draft.as_ref().map_or(Some(0), Arg::staged_bytes)?,
            rows.target.staged_bytes()?,
            w8(b)?,
            w8(b)?,
            w4(b)?,
            w4(b)?,
            w4(b)?,
            w4(out)?,
            w4(out)?,
            w4(batch.target.temperature().map_or(0, <[f32]>::len))?,
        ])
    }

    fn write<'s, const K: usize, D: Driver>(
        dst: &Dst<'s, '_, D>,
        method: Method,
        batch: &TreeBatch<'_>,
        rows_in: Split<'_, 's, D>,
        out_views: Option<Out<'s, D>>,
        needs: &[usize; SLOTS],
        (): (),
    ) -> Result<TreeArgs<'s, D>, GpuError<D::Error>> {
        let (drv, stream, bufs) = (dst.drv, dst.stream, &dst.bufs);
        let buf = |i: usize| bufs[i].ok_or(GpuError::ViewTooShort);
        let b = batch.requests();
        let capacity = u32::try_from(b).map_err(|_| GpuError::TooLarge)?;
        let shape = tree_shape::<K>(method, batch).map_err(|_| GpuError::TooLarge)?;
        let out = needs[PATH] / 4;
        let (accepted, path, tokens) = match out_views {
            // Device outputs: `verify_staged` made them from outputs that validation checked
            // against this batch (`b` counts, `out` path and token slots).
            Some(o) => o,
            None => (
                ViewMut::shared(View::range(buf(ACCEPTED)?, 0, b).map_err(oob)?),
                ViewMut::shared(View::range(buf(PATH)?, 0, out).map_err(oob)?),
                ViewMut::shared(View::range(buf(OUT_TOKENS)?, 0, out).map_err(oob)?),
            ),
        };
        let tree = &batch.tree;
        let target = rows(drv, stream, bufs[TPROBS], rows_in.target)?;
        let draft_probs = match rows_in.draft {
            Some(d) => Some(rows(drv, stream, bufs[DPROBS], d)?),
            None => None,
        };
        let temperature = match batch.target.temperature() {
            Some(t) => Some(upload(drv, stream, buf(TEMP)?, t)?),
            None => None,
        };
        Ok(TreeArgs {
            capacity,
            shape: upload(drv, stream, buf(SHAPE)?, &shape)?,
            nodes: upload(drv, stream, buf(NODES)?, tree.nodes)?,
            tree_tokens: upload(drv, stream, buf(TOKENS)?, tree.tokens)?,
            first_child: upload(drv, stream, buf(FIRST)?, tree.first_child)?,
            next_sibling: upload(drv, stream, buf(NEXT)?, tree.next_sibling)?,
            draft_probs,
            target,
            seed: upload(drv, stream, buf(SEED)?, batch.seed)?,
            offset: upload(drv, stream, buf(OFFSET)?, batch.offset)?,
            eps: per_request(drv, stream, buf(EPS)?, batch.eps, DEFAULT_EPS, b)?,
            delta: per_request(drv, stream, buf(DELTA)?, batch.delta, DEFAULT_DELTA, b)?,
            accepted,
            path,
            tokens,
            temperature,
        })
    }
}
