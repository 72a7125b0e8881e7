//! [`TreeStaging`]: grow-only device buffers that host-slice tree batches are copied into, and
//! the tree entry's shape words ([`tree_shape`]).

use super::super::driver::Driver;
use super::super::error::GpuError;
use super::super::staging::{Arg, Buffers, SUPPORT, Staged, oob, per_request, rows, upload};
use super::super::view::{Memory, View, ViewMut};
use super::TreeOutViews;
use super::args::TreeArgs;
use crate::gpu::kernels::{self, ShapeTooLarge};
use crate::verify::tree::{TreeBatch, validate_tree_inputs_with};
use crate::verify::{
    DEFAULT_DELTA, DEFAULT_EPS, Device, Feature, Format, Method, Param, Rows, VerifyError,
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

/// The row tensors of a tree batch, binary32 or bf16 / f16 patterns (the format goes into the
/// shape flags, [`tree_shape`]): host values the staging uploads, or the caller's device memory
/// read in place.
pub(in crate::gpu) struct TreeRows<'h, 'd, D: Memory> {
    draft: Option<Arg<'h, 'd, D>>,
    target: Arg<'h, 'd, D>,
}

impl<'h, 'd, D: Driver> TreeRows<'h, 'd, D> {
    /// The rows of `batch`; `device` makes the views of its device rows (or refuses them).
    fn with(
        batch: &TreeBatch<'h>,
        device: impl Fn(Device<'h>, Param) -> Result<Arg<'h, 'd, D>, GpuError<D::Error>>,
    ) -> Result<Self, GpuError<D::Error>> {
        let param = if batch.target.temperature().is_some() {
            Param::TargetLogits
        } else {
            Param::TargetProbs
        };
        Ok(Self {
            draft: match batch.draft {
                Some(d) => Some(Arg::of(d.values, |x| device(x, Param::DraftProbs))?),
                None => None,
            },
            target: Arg::of(batch.target.rows().values, |x| device(x, param))?,
        })
    }

    /// The rows of a batch in host memory ([`Feature::Device`] refused: the caller's device
    /// memory is borrowed for as long as the views, which this staging's callers cannot say).
    fn host(batch: &TreeBatch<'h>) -> Result<Self, GpuError<D::Error>> {
        Self::with(batch, |_, _| {
            Err(GpuError::Verify(VerifyError::Unsupported {
                feature: Feature::Device,
            }))
        })
    }
}

impl<'b, D: Driver> TreeRows<'b, 'b, D> {
    /// The rows of `batch`, its device rows as views of `drv`'s memory
    /// ([`GpuError::ForeignMemory`] for another driver's or device's buffer).
    pub(in crate::gpu) fn of(drv: &D, batch: &TreeBatch<'b>) -> Result<Self, GpuError<D::Error>> {
        Self::with(batch, |d, param| Arg::owned(drv, d, param))
    }
}

/// The byte sizes a (checked) batch needs in each buffer (device rows need none).
fn needs<D: Memory>(batch: &TreeBatch<'_>, rows: &TreeRows<'_, '_, D>) -> Option<[usize; SLOTS]> {
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

/// Device buffers of the tree host-slice path, grown on demand and never shrunk (as
/// [`Staging`](super::super::Staging) for chains): a batch that needs no more bytes in any
/// buffer than an earlier one is written into the same buffers, so a graph captured on
/// [`write`](TreeStaging::write)'s views of the largest batch replays later, smaller trees
/// written the same way.
#[derive(Debug)]
pub struct TreeStaging<D: Driver> {
    bufs: Buffers<D, SLOTS>,
}

impl<D: Driver> Default for TreeStaging<D> {
    fn default() -> Self {
        Self {
            bufs: Buffers::default(),
        }
    }
}

impl<D: Driver> TreeStaging<D> {
    /// No buffers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Grows the buffers to hold `batch` (set-up: allocates; does not synchronise). Rows in
    /// device memory ([`Values::Device`](crate::verify::Values::Device)) need no buffer; rows of
    /// another driver or device are [`GpuError::ForeignMemory`] (nothing allocated).
    pub fn reserve(&mut self, drv: &D, batch: &TreeBatch<'_>) -> Result<(), GpuError<D::Error>> {
        let rows = TreeRows::of(drv, batch)?;
        let needs = needs(batch, &rows).ok_or(GpuError::TooLarge)?;
        self.bufs.reserve(drv, needs, &[])
    }

    /// Enqueues copies of `batch` on `stream` and returns the views a tree launch takes. Does
    /// not allocate or synchronise: the copies are ordered on `stream` before whatever is
    /// enqueued after them. Fails, with nothing enqueued, with [`GpuError::Verify`] if the
    /// batch's slices do not match its sizes (the errors of
    /// [`validate_tree_shape`](crate::verify::tree::validate_tree_shape)), and
    /// [`GpuError::ViewTooShort`] if a buffer was not
    /// [`reserve`](TreeStaging::reserve)d for this batch. The trees themselves are not
    /// validated here: the kernel flags a malformed one ([`ERR_TREE`](kernels::ERR_TREE)) and
    /// skips it, and [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree)
    /// validates before it stages.
    ///
    /// Host rows only: a batch with rows in device memory is [`VerifyError::Unsupported`]
    /// with [`Feature::Device`] here (the views this returns
    /// outlive the batch; [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree) on a
    /// [`GpuVerifier`](super::super::GpuVerifier) reads them in place).
    pub fn write<const K: usize>(
        &self,
        drv: &D,
        stream: &D::Stream,
        method: Method,
        batch: &TreeBatch<'_>,
    ) -> Result<Staged<TreeArgs<'_, D>>, GpuError<D::Error>> {
        validate_tree_inputs_with::<K>(SUPPORT, batch)?;
        let rows = TreeRows::host(batch)?;
        self.write_rows::<K>(drv, stream, method, batch, rows, None)
    }

    /// [`write`](Self::write) of a batch whose row tensors are `rows` (device ones read in
    /// place, for as long as the views), into outputs on the device (`out_views`, written in
    /// place) or in the staging's buffers.
    pub(in crate::gpu) fn write_rows<'s, const K: usize>(
        &'s self,
        drv: &D,
        stream: &D::Stream,
        method: Method,
        batch: &TreeBatch<'_>,
        rows_in: TreeRows<'_, 's, D>,
        out_views: Option<TreeOutViews<'s, D>>,
    ) -> Result<Staged<TreeArgs<'s, D>>, GpuError<D::Error>> {
        // The views are sized from the slices, the kernel reads by the shape words: refuse a
        // batch whose slices do not match its shape, so a launch on what this returns stays in
        // bounds.
        validate_tree_inputs_with::<K>(SUPPORT, batch)?;
        let needs = needs(batch, &rows_in).ok_or(GpuError::TooLarge)?;
        let bufs = self.bufs.take(needs, &[])?;
        let buf = |i: usize| bufs[i].ok_or(GpuError::ViewTooShort);
        let b = batch.requests();
        let capacity = u32::try_from(b).map_err(|_| GpuError::TooLarge)?;
        let shape = tree_shape::<K>(method, batch).map_err(|_| GpuError::TooLarge)?;
        let out = needs[PATH] / 4;
        let outputs = match out_views {
            // Device outputs: `verify_tree_staged` made them from outputs that validation
            // checked against this batch (`b` counts, `out` path and token slots).
            Some(o) => o,
            None => TreeOutViews {
                accepted: ViewMut::shared(View::range(buf(ACCEPTED)?, 0, b).map_err(oob)?),
                path: ViewMut::shared(View::range(buf(PATH)?, 0, out).map_err(oob)?),
                tokens: ViewMut::shared(View::range(buf(OUT_TOKENS)?, 0, out).map_err(oob)?),
            },
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
        Ok(Staged::new(TreeArgs {
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
            accepted: outputs.accepted,
            path: outputs.path,
            tokens: outputs.tokens,
            temperature,
        }))
    }
}
