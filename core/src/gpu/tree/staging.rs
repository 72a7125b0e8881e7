//! [`TreeStaging`]: grow-only device buffers that host-slice tree batches are copied into, and
//! the tree entry's shape words ([`tree_shape`]).

use super::super::driver::Driver;
use super::super::error::GpuError;
use super::super::staging::{Buffers, oob, per_request, upload};
use super::super::view::{View, ViewMut};
use super::args::TreeArgs;
use crate::gpu::kernels::{self, ShapeTooLarge};
use crate::verify::tree::{MAX_TREE_NODES, TreeBatch};
use crate::verify::{DEFAULT_DELTA, DEFAULT_EPS, Method, Param, Tensor, VerifyError};

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
/// [`shape_words`](kernels::shape_words) (`k_max` = the tree's `max_depth`), then the node
/// slots per request ([`TREE_SHAPE_NODES`](kernels::TREE_SHAPE_NODES)).
pub fn tree_shape<const K: usize>(
    method: Method,
    batch: &TreeBatch<'_>,
) -> Result<[u32; kernels::TREE_SHAPE_WORDS], ShapeTooLarge> {
    let w = |x: usize| u32::try_from(x).map_err(|_| ShapeTooLarge);
    let draft_stride = match batch.draft_probs {
        Some(_) => Some(w(batch.draft_stride)?),
        None => None,
    };
    let chain = kernels::shape_words(
        w(batch.requests())?,
        w(batch.max_depth)?,
        w(batch.vocab)?,
        draft_stride,
        w(batch.target_stride)?,
        kernels::method_code(method),
        w(K)?,
    );
    let mut shape = [0u32; kernels::TREE_SHAPE_WORDS];
    shape[..kernels::SHAPE_WORDS].copy_from_slice(&chain);
    shape[kernels::TREE_SHAPE_NODES] = w(batch.max_nodes)?;
    Ok(shape)
}

fn length(param: Param, len: usize, expected: Option<usize>) -> Result<(), VerifyError> {
    let expected = expected.unwrap_or(usize::MAX);
    if len == expected {
        Ok(())
    } else {
        Err(VerifyError::Length {
            param,
            len,
            expected,
        })
    }
}

/// The input checks of [`validate_tree_shape`](crate::verify::tree::validate_tree_shape) (the
/// same errors, in the same order; the outputs are this staging's own): what makes the views [`TreeStaging::write`] returns hold every extent its shape
/// words give.
fn check_inputs<const K: usize, E>(batch: &TreeBatch<'_>) -> Result<(), GpuError<E>> {
    let b = batch.requests();
    let v = batch.vocab;
    if b == 0 {
        return Err(VerifyError::EmptyBatch.into());
    }
    if batch.max_nodes == 0 || batch.max_nodes > MAX_TREE_NODES {
        return Err(VerifyError::MaxNodesOutOfRange {
            max_nodes: batch.max_nodes,
            max: MAX_TREE_NODES,
        }
        .into());
    }
    if batch.max_depth > K {
        return Err(VerifyError::MaxDepthOutOfRange {
            max_depth: batch.max_depth,
            max: K,
        }
        .into());
    }
    if v == 0 || v > u32::MAX as usize {
        return Err(VerifyError::VocabOutOfRange { vocab: v }.into());
    }
    let slots = b.checked_mul(batch.max_nodes);
    length(Param::TreeTokens, batch.tree.tokens.len(), slots)?;
    length(Param::FirstChild, batch.tree.first_child.len(), slots)?;
    length(Param::NextSibling, batch.tree.next_sibling.len(), slots)?;
    let rows = |tensor, stride: usize, len, param| {
        if stride < v {
            return Err(VerifyError::StrideTooSmall {
                tensor,
                stride,
                vocab: v,
            });
        }
        length(param, len, slots.and_then(|s| s.checked_mul(stride)))
    };
    if let Some(d) = batch.draft_probs {
        rows(
            Tensor::Draft,
            batch.draft_stride,
            d.len(),
            Param::DraftProbs,
        )?;
    }
    rows(
        Tensor::Target,
        batch.target_stride,
        batch.target.len(),
        if batch.temperature.is_some() {
            Param::TargetLogits
        } else {
            Param::TargetProbs
        },
    )?;
    if let Some(t) = batch.temperature {
        length(Param::Temperature, t.len(), Some(b))?;
    }
    length(Param::Seed, batch.seed.len(), Some(b))?;
    length(Param::Offset, batch.offset.len(), Some(b))?;
    if let Some(e) = batch.eps {
        length(Param::Eps, e.len(), Some(b))?;
    }
    if let Some(d) = batch.delta {
        length(Param::Delta, d.len(), Some(b))?;
    }
    Ok(())
}

/// The byte sizes a (checked) batch needs in each buffer.
fn needs(batch: &TreeBatch<'_>) -> Option<[usize; SLOTS]> {
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
        w4(batch.draft_probs.map_or(0, <[f32]>::len))?,
        w4(batch.target.len())?,
        w8(b)?,
        w8(b)?,
        w4(b)?,
        w4(b)?,
        w4(b)?,
        w4(out)?,
        w4(out)?,
        w4(batch.temperature.map_or(0, <[f32]>::len))?,
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

    /// Grows the buffers to hold `batch` (set-up: allocates; does not synchronise).
    pub fn reserve(&mut self, drv: &D, batch: &TreeBatch<'_>) -> Result<(), GpuError<D::Error>> {
        let needs = needs(batch).ok_or(GpuError::TooLarge)?;
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
    pub fn write<const K: usize>(
        &self,
        drv: &D,
        stream: &D::Stream,
        method: Method,
        batch: &TreeBatch<'_>,
    ) -> Result<TreeStaged<'_, D>, GpuError<D::Error>> {
        check_inputs::<K, D::Error>(batch)?;
        let needs = needs(batch).ok_or(GpuError::TooLarge)?;
        let bufs = self.bufs.take(needs, &[])?;
        let buf = |i: usize| bufs[i].ok_or(GpuError::ViewTooShort);
        let b = batch.requests();
        let capacity = u32::try_from(b).map_err(|_| GpuError::TooLarge)?;
        let shape = tree_shape::<K>(method, batch).map_err(|_| GpuError::TooLarge)?;
        let out = needs[PATH] / 4;
        let tree = &batch.tree;
        // Target logits: the rows go to the target buffer as `target_logits`, and
        // `target_probs` is an empty view of it (not read).
        let (target_probs, target_logits, temperature) = match batch.temperature {
            Some(t) => (
                View::range(buf(TPROBS)?, 0, 0).map_err(oob)?,
                Some(upload(drv, stream, buf(TPROBS)?, batch.target)?),
                Some(upload(drv, stream, buf(TEMP)?, t)?),
            ),
            None => (upload(drv, stream, buf(TPROBS)?, batch.target)?, None, None),
        };
        Ok(TreeStaged(TreeArgs {
            capacity,
            shape: upload(drv, stream, buf(SHAPE)?, &shape)?,
            nodes: upload(drv, stream, buf(NODES)?, tree.nodes)?,
            tree_tokens: upload(drv, stream, buf(TOKENS)?, tree.tokens)?,
            first_child: upload(drv, stream, buf(FIRST)?, tree.first_child)?,
            next_sibling: upload(drv, stream, buf(NEXT)?, tree.next_sibling)?,
            draft_probs: match batch.draft_probs {
                Some(d) => Some(upload(drv, stream, buf(DPROBS)?, d)?),
                None => None,
            },
            target_probs,
            seed: upload(drv, stream, buf(SEED)?, batch.seed)?,
            offset: upload(drv, stream, buf(OFFSET)?, batch.offset)?,
            eps: per_request(drv, stream, buf(EPS)?, batch.eps, DEFAULT_EPS, b)?,
            delta: per_request(drv, stream, buf(DELTA)?, batch.delta, DEFAULT_DELTA, b)?,
            accepted: ViewMut::shared(View::range(buf(ACCEPTED)?, 0, b).map_err(oob)?),
            path: ViewMut::shared(View::range(buf(PATH)?, 0, out).map_err(oob)?),
            tokens: ViewMut::shared(View::range(buf(OUT_TOKENS)?, 0, out).map_err(oob)?),
            target_logits,
            temperature,
        }))
    }
}

/// Views [`TreeStaging::write`] returned: the shape words it wrote describe exactly these
/// views, which is the whole contract of
/// [`GpuVerifier::launch_tree_staged`](super::super::GpuVerifier::launch_tree_staged) and
/// [`capture_tree_staged`](super::super::GpuVerifier::capture_tree_staged) (as long as nothing
/// else writes the buffers). Reads as the [`TreeArgs`] it holds.
#[derive(Debug)]
pub struct TreeStaged<'a, D: Driver>(TreeArgs<'a, D>);

impl<'a, D: Driver> TreeStaged<'a, D> {
    /// The views, to change them (then only the `unsafe` launch takes them).
    pub fn into_args(self) -> TreeArgs<'a, D> {
        self.0
    }
}

impl<'a, D: Driver> core::ops::Deref for TreeStaged<'a, D> {
    type Target = TreeArgs<'a, D>;
    fn deref(&self) -> &TreeArgs<'a, D> {
        &self.0
    }
}
