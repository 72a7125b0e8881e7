//! [`Staging`]: grow-only device buffers that host-slice batches are copied into, generic over
//! the [`Step`] kind (chain or tree); the chain step's part ([`ChainStep`]).

use super::args::StepViews;
use super::driver::{Driver, Inputs, VerifyArgs};
use super::error::GpuError;
use super::verifier::GpuVerifier;
use super::view::Memory;
use super::view::{Element, RowsView, View, ViewMut};
use crate::gpu::kernels;
use crate::verify::{
    Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Device, DeviceOut, Feature, Format, Half, Method,
    Outputs, Param, Produce, Streams, Support, Target, Values, VerifyError, draft_slots,
    validate_inputs_with, validate_with,
};
use core::marker::PhantomData;

/// What the shared GPU path verifies (every [`GpuVerifier`](super::GpuVerifier), so the CUDA and ROCm backends):
/// `k = 0` and `k_max = 0`, the ragged layout, caller-supplied bonus tokens, f32 target
/// logits with per-request temperature, a method per request and the sampling filters
/// (top-k, top-p, min-p), bf16 / f16 target logits and draft probabilities, and the
/// recovered-token output ([`Outputs::with_recovered`](crate::verify::Outputs::with_recovered),
/// written by the same launch), through the kernel text's plain and `_logits` entries; token
/// trees of binary32, bf16 or f16 rows through the tree entry.
pub const SUPPORT: Support = Support {
    empty_drafts: true,
    ragged: true,
    bonus: true,
    logits: true,
    filters: true,
    half: true,
    // bf16 / f16 target probabilities: no kernel entry reads them yet.
    half_probs: false,
    methods: true,
    recovered: true,
    trees: true,
    // Tree rows of any format: the tree entry reads them as the logits entries do.
    tree_half: true,
    // The tree entries have no filter pass.
    tree_filters: false,
    device: true,
};

/// The buffer slots of the views every step kind has ([`StepViews`]), the first of every
/// kind's (a row tensor's buffer holds it in its format, binary32 or half).
const SHAPE: usize = 0;
const DPROBS: usize = 1;
const TARGET: usize = 2;
const SEED: usize = 3;
const OFFSET: usize = 4;
const EPS: usize = 5;
const DELTA: usize = 6;
pub(super) const ACCEPTED: usize = 7;
pub(super) const TOKENS: usize = 8;
/// The temperatures (target logits only; the logits themselves go to `TARGET`'s buffer).
const TEMP: usize = 9;
/// How many: a step kind's own slots follow them.
pub(super) const COMMON: usize = 10;

/// The chain's own slots, in the order of [`VerifyArgs`]' fields.
const SLOTS: usize = COMMON + 7;
const KS: usize = COMMON;
const IDS: usize = COMMON + 1;
const CU: usize = COMMON + 2;
const BONUS: usize = COMMON + 3;
const SAMPLING: usize = COMMON + 4;
const RECOVERED: usize = COMMON + 5;
const FIRST_ROW: usize = COMMON + 6;
/// The buffers of the optional inputs and outputs (allocated only for a batch that has them).
const OPTIONAL: [usize; 6] = [TEMP, CU, BONUS, SAMPLING, RECOVERED, FIRST_ROW];

/// Where a tensor argument of the kernel comes from: host values (`'h`) the staging uploads
/// into its own buffer, or the caller's device memory (`'d`), read in place (no copy).
pub(super) enum Src<'h, 'd, D: Memory, T: Element> {
    Host(&'h [T]),
    Device(View<'d, D, T>),
}

impl<D: Memory, T: Element> Src<'_, '_, D, T> {
    /// Bytes the staging copies (none for device memory).
    fn staged_bytes(&self) -> Option<usize> {
        match self {
            Self::Host(x) => x.len().checked_mul(T::BYTES),
            Self::Device(_) => Some(0),
        }
    }
}

impl<'d, D: Driver, T: Element> Src<'_, 'd, D, T> {
    /// The view: the caller's device memory as it is, or host values uploaded into `dst`.
    fn view(
        self,
        drv: &D,
        stream: &D::Stream,
        dst: Option<&'d D::Buffer>,
    ) -> Result<View<'d, D, T>, GpuError<D::Error>> {
        match self {
            Self::Device(v) => Ok(v),
            Self::Host(x) => upload(drv, stream, dst.ok_or(GpuError::ViewTooShort)?, x),
        }
    }
}

/// One row tensor by its kernel argument: binary32, or 16-bit patterns of a half format (which
/// one, the batch's [`Values::format`] says: the shape flags).
pub(super) enum Arg<'h, 'd, D: Memory> {
    F32(Src<'h, 'd, D, f32>),
    Half(Src<'h, 'd, D, u16>),
}

impl<D: Memory> Arg<'_, '_, D> {
    /// Bytes the staging copies (none for device memory).
    fn staged_bytes(&self) -> Option<usize> {
        match self {
            Self::F32(x) => x.staged_bytes(),
            Self::Half(x) => x.staged_bytes(),
        }
    }
}

impl<'b, D: Driver> Arg<'b, 'b, D> {
    /// Device values as a view of `drv`'s memory, in their format: [`GpuError::ForeignMemory`]
    /// for another driver's or device's buffer.
    fn owned(drv: &D, d: Device<'b>, param: Param) -> Result<Self, GpuError<D::Error>> {
        fn view<'b, D: Driver, T: Element>(drv: &D, d: Device<'b>) -> Option<Src<'b, 'b, D, T>> {
            d.view::<D, T>()
                .filter(|v| drv.owns(v.buffer()))
                .map(Src::Device)
        }
        match d.format() {
            Format::F32 => view(drv, d).map(Self::F32),
            Format::Bf16 | Format::F16 => view(drv, d).map(Self::Half),
        }
        .ok_or(GpuError::ForeignMemory { param })
    }
}

/// What every step kind's batch brings for the views they share ([`Stage::common`](sealed::Stage::common)): its
/// draft rows (if any), its target, its random streams, and typical acceptance's `[ε, δ]`.
pub(super) type Common<'h> = (
    Option<Values<'h>>,
    Target<'h>,
    Streams<'h>,
    [Option<&'h [f32]>; 2],
);

/// A batch's inputs to the views every step kind has ([`StepViews`]), chain or tree alike: its
/// row tensors by kernel argument (each in its format), the target rows (probabilities or
/// logits, as the batch says) with the logits' temperatures and the draft rows, and its
/// per-request values.
pub struct Split<'h, 'd, D: Memory> {
    pub(super) draft: Option<Arg<'h, 'd, D>>,
    pub(super) target: Arg<'h, 'd, D>,
    pub(super) temperature: Option<&'h [f32]>,
    pub(super) streams: Streams<'h>,
    /// Typical acceptance's `[ε, δ]` (the defaults where `None`).
    pub(super) typical: [Option<&'h [f32]>; 2],
}

impl<'h, 'd, D: Driver> Split<'h, 'd, D> {
    /// The inputs of a batch ([`Stage::common`](sealed::Stage::common)); `device` makes the views of its device
    /// tensors (or refuses them).
    fn with(
        (draft, target, streams, typical): Common<'h>,
        device: impl Fn(Device<'h>, Param) -> Result<Arg<'h, 'd, D>, GpuError<D::Error>>,
    ) -> Result<Self, GpuError<D::Error>> {
        // Host values as they are (a half tensor as its patterns), device values as `device`
        // makes their view (or refuses them).
        let arg = |v: Values<'h>, param: Param| match v {
            Values::F32(x) => Ok(Arg::F32(Src::Host(x))),
            Values::Half(Half::Bf16(x) | Half::F16(x)) => Ok(Arg::Half(Src::Host(x))),
            Values::Device(d) => device(d, param),
        };
        let param = if target.temperature().is_some() {
            Param::TargetLogits
        } else {
            Param::TargetProbs
        };
        Ok(Self {
            draft: draft.map(|d| arg(d, Param::DraftProbs)).transpose()?,
            target: arg(target.rows().values, param)?,
            temperature: target.temperature(),
            streams,
            typical,
        })
    }

    /// The tensors of a batch in host memory ([`Feature::Device`] refused: the caller's device
    /// memory is borrowed for as long as the views, which [`Staging::write`]'s callers cannot
    /// say).
    fn host(common: Common<'h>) -> Result<Self, GpuError<D::Error>> {
        Self::with(common, |_, _| {
            Err(GpuError::Verify(VerifyError::Unsupported {
                feature: Feature::Device,
            }))
        })
    }
}

impl<D: Memory> Split<'_, '_, D> {
    /// The bytes a batch of `b` requests with these inputs needs in each buffer slot: the
    /// shared ones' (`shape_words` shape words, `tokens` output tokens), then the step kind's
    /// `own`; `None` if a size overflows.
    pub(super) fn needs<const N: usize>(
        &self,
        (shape_words, b, tokens): (usize, usize, usize),
        own: &[usize],
    ) -> Option<[usize; N]> {
        let (w4, w8) = (|n: usize| n.checked_mul(4), |n: usize| n.checked_mul(8));
        let mut needs = [0; N];
        needs[..COMMON].copy_from_slice(&[
            shape_words * 4,
            self.draft.as_ref().map_or(Some(0), Arg::staged_bytes)?,
            self.target.staged_bytes()?,
            w8(self.streams.seed.len())?,
            w8(self.streams.offset.len())?,
            w4(b)?,
            w4(b)?,
            w4(b)?,
            w4(tokens)?,
            w4(self.temperature.map_or(0, <[f32]>::len))?,
        ]);
        needs[COMMON..].copy_from_slice(own);
        Some(needs)
    }
}

impl<'b, D: Driver> Split<'b, 'b, D> {
    /// The tensors of a batch, its device tensors as views of `drv`'s memory:
    /// [`GpuError::ForeignMemory`] for another driver's or device's buffer.
    fn of(drv: &D, common: Common<'b>) -> Result<Self, GpuError<D::Error>> {
        Self::with(common, |d, param| Arg::owned(drv, d, param))
    }
}

/// Device outputs as a view of `drv`'s memory the kernel writes: [`GpuError::ForeignMemory`]
/// for another driver's or device's buffer.
pub(super) fn owned_out<'d, D: Driver>(
    drv: &D,
    out: &'d mut DeviceOut<'_>,
    param: Param,
) -> Result<ViewMut<'d, D, u32>, GpuError<D::Error>> {
    match out.view_mut::<D>() {
        Some(v) if drv.owns(v.buffer()) => Ok(v),
        _ => Err(GpuError::ForeignMemory { param }),
    }
}

/// Mixed drafters' first rows, if the batch has them.
fn first_row<'a>(batch: &Batch<'a>) -> Option<&'a [u32]> {
    batch.draft.and_then(|d| d.first_row)
}

/// The most buffer slots a step kind has (the chain's).
pub(super) const MAX_SLOTS: usize = SLOTS;

/// What a step kind stages and launches, hidden from the public API: [`Step`] is sealed by it.
pub(super) mod sealed {
    use super::{Common, Dst, Split, Staging, Step};
    use crate::gpu::{Driver, GpuError, GpuVerifier, Memory, ViewMut};
    use crate::verify::{Check, Method, VerifyError};

    /// The step-specific part of a [`Staging`] and of the verifier's stage / launch /
    /// download sequence: its buffer slots, checks, copies and set-up.
    pub trait Stage: Sized {
        /// The bytes a batch needs in each buffer slot, in the order of the args' fields: an
        /// array of one entry per slot (at most [`MAX_SLOTS`](super::MAX_SLOTS)).
        type Needs: AsRef<[usize]>;
        /// The caller's device outputs as views of the verifier's driver, which the launch
        /// writes in place of the staging's output buffers.
        type Out<'d, D: Memory>;
        /// What a staged batch must share with a graph's to replay it (the chain's optional
        /// inputs, [`Inputs`](crate::gpu::Inputs): they pick the entry and the views it reads).
        type Key: Copy + PartialEq + core::fmt::Debug;
        /// The slots of the optional inputs and outputs (allocated only for a batch that has
        /// them, never for a runtime that never passes them).
        const OPTIONAL: &'static [usize];

        /// The reference's checks of the batch's inputs, with what the kernel entries read
        /// ([`SUPPORT`](super::SUPPORT)).
        fn validate<const K: usize>(batch: &<Self as Step>::Batch<'_>) -> Result<(), VerifyError>
        where
            Self: Step;

        /// The reference's whole validation of `batch` with its outputs `out`.
        fn check<const K: usize>(
            method: Method,
            check: Check,
            batch: &<Self as Step>::Batch<'_>,
            out: &<Self as Step>::Outputs<'_>,
        ) -> Result<(), VerifyError>
        where
            Self: Step;

        /// Which outputs `out` asks for.
        fn produce(out: &<Self as Step>::Outputs<'_>) -> <Self as Step>::Produce
        where
            Self: Step;

        /// `out`'s device outputs as views of `drv`'s memory ([`GpuError::ForeignMemory`] for
        /// another driver's or device's); `None` for host slices.
        fn out_views<'d, D: Driver>(
            drv: &D,
            out: &'d mut <Self as Step>::Outputs<'_>,
        ) -> Result<Option<Self::Out<'d, D>>, GpuError<D::Error>>
        where
            Self: Step;

        /// The verifier's own staging of this kind.
        fn staging<D: Driver, const K: usize>(v: &mut GpuVerifier<D, K>) -> &mut Staging<D, Self>
        where
            Self: Step;

        /// Makes the step's entry ready before set-up or a capture (a tree: the driver compiles
        /// the tree module then, not on the step path nor while a stream captures).
        fn prepare<D: Driver>(_drv: &D) -> Result<(), GpuError<D::Error>> {
            Ok(())
        }

        /// Set-up once the staging holds `batch` (a chain: the split entry's scratch; a tree
        /// launches one block per request and needs none).
        fn reserved<D: Driver, const K: usize>(
            _v: &mut GpuVerifier<D, K>,
            _batch: &<Self as Step>::Batch<'_>,
        ) -> Result<(), GpuError<D::Error>>
        where
            Self: Step,
        {
            Ok(())
        }

        /// The batch's inputs to the views every step kind has (the impls spell the batch
        /// `<Self as Step>::Batch<'h>` too: `'h` is early-bound here).
        fn common<'h>(batch: &<Self as Step>::Batch<'h>) -> Common<'h>
        where
            Self: Step;

        /// The bytes `batch`, of common inputs `t`, needs in each buffer (`device_out`: its
        /// outputs are the caller's device memory); `None` if a size overflows.
        fn needs<D: Memory>(
            batch: &<Self as Step>::Batch<'_>,
            t: &Split<'_, '_, D>,
            produce: <Self as Step>::Produce,
            device_out: bool,
        ) -> Option<Self::Needs>
        where
            Self: Step;

        /// Enqueues the copies of a checked `batch` into `dst` (sized for it) and returns the
        /// views, writing into `out` when given.
        fn write<'s, const K: usize, D: Driver>(
            dst: &Dst<'s, '_, D>,
            method: Method,
            batch: &<Self as Step>::Batch<'_>,
            t: Split<'_, 's, D>,
            out: Option<Self::Out<'s, D>>,
            produce: <Self as Step>::Produce,
        ) -> Result<<Self as Step>::Args<'s, D>, GpuError<D::Error>>
        where
            Self: Step;
    }

    /// The launch views of a step kind ([`Step::Args`], or [`Staged`](super::Staged) ones):
    /// what [`GpuVerifier`]'s one launch / capture / download sequence asks of them.
    pub trait Launch<D: Driver> {
        /// The step kind these views launch.
        type Step: Step;
        /// Blocks per slice launched: the largest batch the views hold.
        fn capacity(&self) -> u32;
        /// What a graph captured on them must share with a replayed batch.
        fn key(&self) -> <Self::Step as Stage>::Key;
        /// The lengths checked without reading device memory.
        fn fits(&self) -> bool;
        /// Enqueues the launch on `v`'s stream (no checks).
        fn enqueue<const K: usize>(&self, v: &GpuVerifier<D, K>) -> Result<(), GpuError<D::Error>>;
        /// The output views to copy down into `out`'s host slices, in the order of the host
        /// staging ([`download`]s); [`GpuError::ViewTooShort`] for a slice longer than its
        /// view.
        fn downloads<'x>(
            &'x self,
            out: &'x mut <Self::Step as Step>::Outputs<'_>,
        ) -> Result<[Download<'x, D>; 3], GpuError<D::Error>>;
    }

    /// One copy down: an output view's buffer and byte offset, and the host slice it fills.
    pub(crate) type Download<'x, D> = Option<(&'x <D as Memory>::Buffer, usize, &'x mut [u32])>;

    /// The copy down of output view `v` into `out` ([`GpuError::ViewTooShort`] for a slice
    /// longer than the view).
    pub(crate) fn download<'x, D: Driver>(
        v: &'x ViewMut<'_, D, u32>,
        out: &'x mut [u32],
    ) -> Result<Download<'x, D>, GpuError<D::Error>> {
        if out.len() > v.len() {
            return Err(GpuError::ViewTooShort);
        }
        Ok(Some((v.buffer(), v.byte_offset(), out)))
    }

    impl<D: Driver, A: Launch<D>> Launch<D> for super::Staged<A> {
        type Step = A::Step;
        fn capacity(&self) -> u32 {
            self.0.capacity()
        }
        fn key(&self) -> <A::Step as Stage>::Key {
            self.0.key()
        }
        fn fits(&self) -> bool {
            self.0.fits()
        }
        fn enqueue<const K: usize>(&self, v: &GpuVerifier<D, K>) -> Result<(), GpuError<D::Error>> {
            self.0.enqueue(v)
        }
        fn downloads<'x>(
            &'x self,
            out: &'x mut <A::Step as Step>::Outputs<'_>,
        ) -> Result<[Download<'x, D>; 3], GpuError<D::Error>> {
            self.0.downloads(out)
        }
    }
}

/// A kind of verification step a [`Staging`] stages: [`ChainStep`] (a [`Batch`] into
/// [`VerifyArgs`]) or [`TreeStep`](super::TreeStep) (a
/// [`TreeBatch`](crate::verify::tree::TreeBatch) into [`TreeArgs`](super::TreeArgs)). Sealed:
/// those two are the only ones.
pub trait Step: sealed::Stage {
    /// The host batch it stages.
    type Batch<'b>;
    /// The views of its launch, which [`Staging::write`] returns.
    type Args<'s, D: Driver>: sealed::Launch<D, Step = Self>;
    /// The caller's outputs: [`Outputs`] for chains,
    /// [`TreeOutputs`](crate::verify::tree::TreeOutputs) for trees.
    type Outputs<'o>;
    /// Which outputs beyond the fixed ones to stage: [`Produce`] for chains, `()` for trees
    /// (whose outputs are fixed).
    type Produce: Copy;
}

/// The chain step: a [`Batch`] staged into [`VerifyArgs`] for the chain entries
/// ([`GpuVerifier::launch_staged`](super::GpuVerifier::launch_staged)). Only a type argument
/// ([`Staging<D, ChainStep>`](Staging)): no value of it exists.
#[derive(Clone, Copy, Debug)]
pub enum ChainStep {}

impl Step for ChainStep {
    type Batch<'b> = Batch<'b>;
    type Args<'s, D: Driver> = VerifyArgs<'s, D>;
    type Outputs<'o> = Outputs<'o>;
    type Produce = Produce;
}

/// Where a step's write enqueues its copies: on `stream` of `drv`, into the staging's buffers
/// (`None`: an optional slot the batch does not use), sized for the bytes `needs` in each.
pub struct Dst<'s, 'a, D: Driver> {
    pub(super) drv: &'a D,
    pub(super) stream: &'a D::Stream,
    pub(super) bufs: [Option<&'s D::Buffer>; MAX_SLOTS],
    pub(super) needs: &'a [usize],
}

impl<'s, D: Driver> Dst<'s, '_, D> {
    /// Slot `i`'s buffer ([`GpuError::ViewTooShort`] for an optional one not allocated).
    pub(super) fn buf(&self, i: usize) -> Result<&'s D::Buffer, GpuError<D::Error>> {
        self.bufs[i].ok_or(GpuError::ViewTooShort)
    }

    /// The staging's output buffer of slot `i`, as many values as it was sized for.
    pub(super) fn out(&self, i: usize) -> Result<ViewMut<'s, D, u32>, GpuError<D::Error>> {
        let view = View::range(self.buf(i)?, 0, self.needs[i] / 4).map_err(oob)?;
        Ok(ViewMut::shared(view))
    }

    /// Enqueues the copies of the views every step kind has and returns them: the `shape`
    /// words and a checked batch's inputs `t` (`b` requests), with the outputs `accepted` and
    /// `tokens`.
    pub(super) fn step(
        &self,
        shape: &[u32],
        b: usize,
        t: Split<'_, 's, D>,
        (accepted, tokens): (ViewMut<'s, D, u32>, ViewMut<'s, D, u32>),
    ) -> Result<StepViews<'s, D>, GpuError<D::Error>> {
        let (drv, stream, bufs) = (self.drv, self.stream, &self.bufs);
        let (streams, [eps, delta]) = (t.streams, t.typical);
        Ok(StepViews {
            capacity: u32::try_from(b).map_err(|_| GpuError::TooLarge)?,
            shape: upload(drv, stream, self.buf(SHAPE)?, shape)?,
            draft_probs: t
                .draft
                .map(|d| rows(drv, stream, bufs[DPROBS], d))
                .transpose()?,
            target: rows(drv, stream, bufs[TARGET], t.target)?,
            seed: upload(drv, stream, self.buf(SEED)?, streams.seed)?,
            offset: upload(drv, stream, self.buf(OFFSET)?, streams.offset)?,
            eps: per_request(drv, stream, self.buf(EPS)?, eps, DEFAULT_EPS, b)?,
            delta: per_request(drv, stream, self.buf(DELTA)?, delta, DEFAULT_DELTA, b)?,
            accepted,
            tokens,
            temperature: optional(drv, stream, bufs[TEMP], t.temperature)?,
        })
    }
}

/// Device buffers of the host-slice path of one step kind (`S`: [`ChainStep`], the default, or
/// [`TreeStep`](super::TreeStep)), grown on demand and never shrunk: a batch that needs no
/// more bytes in any buffer than an earlier one is written into the same buffers, so a graph
/// captured on [`write`](Staging::write)'s views of the largest batch replays later, smaller
/// batches written the same way.
///
/// A staging holds one step kind's buffers, and a [`GpuVerifier`](super::GpuVerifier) owns
/// one of each on purpose: a graph captured on chain views borrows the chain staging, and a
/// tree batch's [`reserve`](Staging::reserve) must not grow (free and reallocate) a buffer that
/// graph reads.
#[derive(Debug)]
pub struct Staging<D: Driver, S: Step = ChainStep> {
    bufs: [Option<D::Buffer>; MAX_SLOTS],
    step: PhantomData<S>,
}

impl<D: Driver, S: Step> Default for Staging<D, S> {
    fn default() -> Self {
        Self {
            bufs: core::array::from_fn(|_| None),
            step: PhantomData,
        }
    }
}

impl<D: Driver> Staging<D> {
    /// A chain staging with no buffers yet (a tree's: `Staging::<_, TreeStep>::default()`;
    /// `new` is the chain's alone so that `Staging::new()` needs no type annotation where
    /// only the generic stage / launch / download calls use it).
    pub fn new() -> Self {
        Self::default()
    }
}

impl<D: Driver, S: Step> Staging<D, S> {
    /// Grows the buffers to hold `batch` and the outputs `produce` names (set-up: allocates;
    /// does not synchronise). A batch's device tensors ([`Values::Device`]) need no buffer;
    /// one of another driver or device is [`GpuError::ForeignMemory`] (nothing allocated).
    pub fn reserve(
        &mut self,
        drv: &D,
        batch: &S::Batch<'_>,
        produce: S::Produce,
    ) -> Result<(), GpuError<D::Error>> {
        let split = Split::of(drv, S::common(batch))?;
        let needs = S::needs(batch, &split, produce, false).ok_or(GpuError::TooLarge)?;
        for (i, (slot, &need)) in self.bufs.iter_mut().zip(needs.as_ref()).enumerate() {
            let fits = slot.as_ref().is_some_and(|b| D::bytes(b) >= need);
            // An optional slot the batch does not use exists only once a batch has it.
            let absent = S::OPTIONAL.contains(&i) && need == 0;
            if !fits && !absent {
                *slot = None; // free before allocating the larger one
                // Never 0 bytes: a view of an empty buffer is still a valid pointer.
                *slot = Some(drv.alloc(need.max(8)).map_err(GpuError::Driver)?);
            }
        }
        Ok(())
    }

    /// Enqueues copies of `batch` on `stream` and returns the views a launch takes. Does not
    /// allocate or synchronise: the copies are ordered on `stream` before whatever is enqueued
    /// after them, so a launch or a graph replay on the same stream sees this batch. Fails,
    /// with nothing enqueued, with [`GpuError::Verify`] if the batch's inputs fail the
    /// reference's checks (slices shorter than its shape, a layout the kernel lacks; for a
    /// tree the errors of [`validate_tree_shape`](crate::verify::tree::validate_tree_shape))
    /// and [`GpuError::ViewTooShort`] if a buffer is too small (not
    /// [`reserve`](Staging::reserve)d for this batch).
    ///
    /// A chain's [`Produce::recovered`] makes the views' `recovered` the staging's buffer for
    /// it, one value per draft slot, which the launch (the logits entries) writes. Trees
    /// themselves are not validated here: the kernel flags a malformed one
    /// ([`ERR_TREE`](kernels::ERR_TREE)) and skips it, and
    /// [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree) validates before it
    /// stages.
    ///
    /// Host tensors only: a batch with device tensors ([`Values::Device`]) is
    /// [`VerifyError::Unsupported`] with [`Feature::Device`] here (the views this returns
    /// outlive the batch; [`Verifier::verify`](crate::verify::Verifier::verify) and
    /// [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree) on a
    /// [`GpuVerifier`](super::GpuVerifier) read them in place, or the caller builds its own
    /// args).
    ///
    /// Reusing the buffers needs no wait: every copy into them and every launch reading them
    /// is enqueued on the one `stream`, which runs them in order, so this step's copies start
    /// after the previous launch has read the previous step's values.
    pub fn write<const K: usize>(
        &self,
        drv: &D,
        stream: &D::Stream,
        method: Method,
        batch: &S::Batch<'_>,
        produce: S::Produce,
    ) -> Result<Staged<S::Args<'_, D>>, GpuError<D::Error>> {
        S::validate::<K>(batch)?;
        let split = Split::host(S::common(batch))?;
        self.write_split::<K>(drv, stream, method, batch, split, None, produce)
    }

    /// [`write`](Self::write) of a batch whose device tensors are read in place (views of
    /// `drv`'s memory, for as long as the views: [`GpuError::ForeignMemory`] for another
    /// driver's or device's) into outputs on the device (`out`, written in place) or in the
    /// staging's buffers.
    pub(super) fn write_in_place<'s, 'b: 's, const K: usize>(
        &'s self,
        drv: &D,
        stream: &D::Stream,
        method: Method,
        batch: &S::Batch<'b>,
        out: Option<S::Out<'s, D>>,
        produce: S::Produce,
    ) -> Result<Staged<S::Args<'s, D>>, GpuError<D::Error>> {
        let split: Split<'s, 's, D> = Split::of(drv, S::common(batch))?;
        self.write_split::<K>(drv, stream, method, batch, split, out, produce)
    }

    /// [`write`](Self::write) of a batch whose row tensors are `t`.
    #[allow(clippy::too_many_arguments)]
    fn write_split<'s, const K: usize>(
        &'s self,
        drv: &D,
        stream: &D::Stream,
        method: Method,
        batch: &S::Batch<'_>,
        t: Split<'_, 's, D>,
        out: Option<S::Out<'s, D>>,
        produce: S::Produce,
    ) -> Result<Staged<S::Args<'s, D>>, GpuError<D::Error>> {
        // The views are sized from the slices, the kernel reads by the shape words: refuse a
        // batch whose slices do not match its shape (or a layout the kernel lacks), so a
        // launch on what this returns stays in bounds.
        S::validate::<K>(batch)?;
        let needs = S::needs(batch, &t, produce, out.is_some()).ok_or(GpuError::TooLarge)?;
        let mut bufs: [Option<&D::Buffer>; MAX_SLOTS] = [None; MAX_SLOTS];
        let slots = bufs.iter_mut().zip(&self.bufs).zip(needs.as_ref());
        for (i, ((dst, src), &need)) in slots.enumerate() {
            match src {
                Some(b) if D::bytes(b) >= need => *dst = Some(b),
                // An optional input the batch does not have: no view, no buffer needed.
                _ if S::OPTIONAL.contains(&i) && need == 0 => {}
                _ => return Err(GpuError::ViewTooShort),
            }
        }
        let dst = Dst {
            drv,
            stream,
            bufs,
            needs: needs.as_ref(),
        };
        S::write::<K, D>(&dst, method, batch, t, out, produce).map(Staged::new)
    }
}

/// The caller's device outputs the launch writes: accepted, tokens, recovered.
type Out<'d, D> = (
    ViewMut<'d, D, u32>,
    ViewMut<'d, D, u32>,
    Option<ViewMut<'d, D, u32>>,
);

impl sealed::Stage for ChainStep {
    type Needs = [usize; SLOTS];
    type Out<'d, D: Memory> = Out<'d, D>;
    type Key = Inputs;
    const OPTIONAL: &'static [usize] = &OPTIONAL;

    fn validate<const K: usize>(batch: &Batch<'_>) -> Result<(), VerifyError> {
        validate_inputs_with::<K>(SUPPORT, batch)
    }

    fn check<const K: usize>(
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &Outputs<'_>,
    ) -> Result<(), VerifyError> {
        validate_with::<K>(SUPPORT, method, check, batch, out)
    }

    fn produce(out: &Outputs<'_>) -> Produce {
        out.produce()
    }

    fn out_views<'d, D: Driver>(
        drv: &D,
        out: &'d mut Outputs<'_>,
    ) -> Result<Option<Out<'d, D>>, GpuError<D::Error>> {
        let Outputs::Device { outputs: out } = out else {
            return Ok(None);
        };
        Ok(Some((
            owned_out(drv, &mut out.accepted, Param::Accepted)?,
            owned_out(drv, &mut out.tokens, Param::Tokens)?,
            match out.recovered.as_mut() {
                Some(r) => Some(owned_out(drv, r, Param::Recovered)?),
                None => None,
            },
        )))
    }

    fn staging<D: Driver, const K: usize>(v: &mut GpuVerifier<D, K>) -> &mut Staging<D, Self> {
        &mut v.staging
    }

    fn reserved<D: Driver, const K: usize>(
        v: &mut GpuVerifier<D, K>,
        batch: &Batch<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        v.reserve_split(u32::try_from(batch.requests()).map_err(|_| GpuError::TooLarge)?)
    }

    fn common<'h>(batch: &<Self as Step>::Batch<'h>) -> Common<'h> {
        let (seed, offset, draft) = (batch.seed, batch.offset, batch.draft.map(|d| d.rows.values));
        let typical = [batch.eps, batch.delta];
        (draft, batch.target, Streams { seed, offset }, typical)
    }

    fn needs<D: Memory>(
        batch: &Batch<'_>,
        t: &Split<'_, '_, D>,
        produce: Produce,
        device_out: bool,
    ) -> Option<[usize; SLOTS]> {
        // Device outputs need no staging buffer for the recovered tokens.
        let recovered = produce.recovered && !device_out;
        let b = batch.requests();
        let tokens = b.checked_mul(batch.k_max.checked_add(1)?)?;
        let w4 = |n: usize| n.checked_mul(4);
        t.needs(
            (kernels::SHAPE_WORDS, b, tokens),
            &[
                w4(batch.k().len())?,
                w4(batch.draft_ids.len())?,
                w4(batch.cu_num_draft_tokens().map_or(0, <[u32]>::len))?,
                w4(batch.bonus.map_or(0, <[u32]>::len))?,
                if kernels::has_sampling(batch) {
                    w4(b.checked_mul(kernels::SAMPLING_WORDS)?)?
                } else {
                    0
                },
                // One value per draft slot, as the draft ids are laid out.
                if recovered {
                    w4(draft_slots(batch))?
                } else {
                    0
                },
                w4(first_row(batch).map_or(0, <[u32]>::len))?,
            ],
        )
    }

    fn write<'s, const K: usize, D: Driver>(
        dst: &Dst<'s, '_, D>,
        method: Method,
        batch: &Batch<'_>,
        t: Split<'_, 's, D>,
        out: Option<Out<'s, D>>,
        produce: Produce,
    ) -> Result<VerifyArgs<'s, D>, GpuError<D::Error>> {
        let (drv, stream, bufs) = (dst.drv, dst.stream, &dst.bufs);
        let mut shape = kernels::batch_shape::<K>(method, batch).map_err(|_| GpuError::TooLarge)?;
        // Half tensors: the flags that make the kernel read u16 patterns (as the host shim of
        // the kernel text sets them), and the draft stride `batch_shape` sets for f32 only.
        let draft = batch.draft.map(|d| d.rows.format());
        shape[kernels::SHAPE_FLAGS] |= kernels::half_flags(batch.target.rows().format(), draft);
        if let (Some(Format::Bf16 | Format::F16), Some(d)) = (draft, batch.draft) {
            shape[kernels::SHAPE_DRAFT_STRIDE] =
                u32::try_from(d.rows.stride).map_err(|_| GpuError::TooLarge)?;
            shape[kernels::SHAPE_FLAGS] |= kernels::FLAG_DRAFT_PROBS;
        }
        // Every check is done and every view made before the first copy is enqueued, so an
        // error leaves the stream as it was.
        let (accepted, tokens, recovered) = match out {
            Some(o) => o,
            None => (
                dst.out(ACCEPTED)?,
                dst.out(TOKENS)?,
                produce.recovered.then(|| dst.out(RECOVERED)).transpose()?,
            ),
        };
        Ok(VerifyArgs {
            step: dst.step(&shape, batch.requests(), t, (accepted, tokens))?,
            k: upload(drv, stream, dst.buf(KS)?, batch.k())?,
            draft_ids: upload(drv, stream, dst.buf(IDS)?, batch.draft_ids)?,
            cu_num_draft_tokens: optional(drv, stream, bufs[CU], batch.cu_num_draft_tokens())?,
            bonus: optional(drv, stream, bufs[BONUS], batch.bonus)?,
            sampling: if kernels::has_sampling(batch) {
                Some(sampling(drv, stream, dst.buf(SAMPLING)?, batch, method)?)
            } else {
                None
            },
            draft_first_row: optional(drv, stream, bufs[FIRST_ROW], first_row(batch))?,
            recovered,
        })
    }
}

/// A row tensor's view in its format: the caller's device memory as it is, or host values
/// uploaded into `dst`.
fn rows<'a, D: Driver>(
    drv: &D,
    stream: &D::Stream,
    dst: Option<&'a D::Buffer>,
    arg: Arg<'_, 'a, D>,
) -> Result<RowsView<'a, D>, GpuError<D::Error>> {
    Ok(match arg {
        Arg::F32(x) => RowsView::F32(x.view(drv, stream, dst)?),
        Arg::Half(h) => RowsView::Half(h.view(drv, stream, dst)?),
    })
}

/// Views a staging's [`write`](Staging::write) returned ([`VerifyArgs`] for a chain,
/// [`TreeArgs`](super::TreeArgs) for a tree, [`Step::Args`]): the shape
/// words it wrote describe exactly these views, which is the whole contract of the safe staged
/// launches and captures ([`GpuVerifier::launch_staged`](super::GpuVerifier::launch_staged),
/// [`capture_staged`](super::GpuVerifier::capture_staged)), as long as nothing else
/// writes the buffers. Only a staging makes one; it reads as the args it holds.
#[derive(Debug)]
pub struct Staged<A>(A);

impl<A> Staged<A> {
    /// Views a staging wrote.
    pub(super) fn new(args: A) -> Self {
        Self(args)
    }

    /// The views, to change them (then only the `unsafe` launch takes them).
    pub fn into_args(self) -> A {
        self.0
    }
}

impl<A> core::ops::Deref for Staged<A> {
    type Target = A;
    fn deref(&self) -> &A {
        &self.0
    }
}

pub(super) fn oob<E>(_: super::view::OutOfBounds) -> GpuError<E> {
    GpuError::ViewTooShort
}

pub(super) fn upload<'a, D: Driver, T: Element>(
    drv: &D,
    stream: &D::Stream,
    dst: &'a D::Buffer,
    data: &[T],
) -> Result<View<'a, D, T>, GpuError<D::Error>> {
    let view = View::range(dst, 0, data.len()).map_err(oob)?;
    // Nothing to copy for an empty slice (`k` in the ragged layout, probabilities beside
    // logits): the view still points into a live buffer.
    if !data.is_empty() {
        drv.upload(stream, dst, 0, data).map_err(GpuError::Driver)?;
    }
    Ok(view)
}

/// `Some` view of `data` uploaded into `dst`, or `None` (a null pointer for the kernel).
fn optional<'a, D: Driver, T: Element>(
    drv: &D,
    stream: &D::Stream,
    dst: Option<&'a D::Buffer>,
    data: Option<&[T]>,
) -> Result<Option<View<'a, D, T>>, GpuError<D::Error>> {
    match data {
        Some(d) => {
            let dst = dst.ok_or(GpuError::ViewTooShort)?;
            upload(drv, stream, dst, d).map(Some)
        }
        None => Ok(None),
    }
}

/// Every request's [`kernels::sampling_words`] (`call`: the method of requests without one of
/// their own), written through a small stack array (no allocation).
fn sampling<'a, D: Driver>(
    drv: &D,
    stream: &D::Stream,
    dst: &'a D::Buffer,
    batch: &Batch<'_>,
    call: Method,
) -> Result<View<'a, D, u32>, GpuError<D::Error>> {
    const W: usize = kernels::SAMPLING_WORDS;
    let b = batch.requests();
    let view = View::range(dst, 0, b * W).map_err(oob)?;
    let mut chunk = [0u32; 64 * W];
    let mut at = 0;
    while at < b {
        let n = (b - at).min(64);
        for (i, words) in chunk.chunks_exact_mut(W).take(n).enumerate() {
            words.copy_from_slice(&kernels::sampling_words(batch, at + i, call));
        }
        drv.upload(stream, dst, at * W * 4, &chunk[..n * W])
            .map_err(GpuError::Driver)?;
        at += n;
    }
    Ok(view)
}

/// `values`, or `b` copies of `default` (uploaded from a small stack array, no allocation).
pub(super) fn per_request<'a, D: Driver>(
    drv: &D,
    stream: &D::Stream,
    dst: &'a D::Buffer,
    values: Option<&[f32]>,
    default: f32,
    b: usize,
) -> Result<View<'a, D, f32>, GpuError<D::Error>> {
    if let Some(v) = values {
        return upload(drv, stream, dst, v);
    }
    let view = View::range(dst, 0, b).map_err(oob)?;
    let chunk = [default; 64];
    let mut at = 0;
    while at < b {
        let n = (b - at).min(chunk.len());
        drv.upload(stream, dst, at * 4, &chunk[..n])
            .map_err(GpuError::Driver)?;
        at += n;
    }
    Ok(view)
}
