//! [`Driver`]: the seam between the orchestration in this module and a GPU API (CUDA, HIP, or
//! the host driver of the tests), in the style of wgpu-hal's `Api`: associated types for the
//! handles, one method per driver call the orchestration makes, nothing else.

use super::args::{StepViews, field};
use super::block::ArgBlock;
use super::tree::TreeLaunch;
use super::view::{Element, Memory, View, ViewMut};
use crate::error_kind::HasKind;
use core::fmt::Debug;

/// What an event query answers: the work recorded before the event has finished, or not yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Status {
    /// Everything recorded before the event has completed.
    Ready,
    /// Some of it is still queued or running.
    Pending,
}

/// Which entry point of `core/kernels/specula_verify.cu` a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Entry {
    /// [`VERIFY_ENTRY`](crate::gpu::kernels::VERIFY_ENTRY): one block per request.
    Single,
    /// [`VERIFY_SPLIT_ENTRY`](crate::gpu::kernels::VERIFY_SPLIT_ENTRY): each request's rows over
    /// `slices` blocks, with the scratch buffer of [`Launch::scratch`].
    Split {
        /// Blocks per request (≥ 2).
        slices: u32,
    },
}

impl Entry {
    /// The index in [`ENTRY_NAMES`] of the entry point this block layout runs for `family`:
    /// what a driver (or the host shim's launcher) loads the entries by.
    #[must_use]
    pub const fn index(self, family: Family) -> usize {
        let split = match self {
            Self::Single => 0,
            Self::Split { .. } => 1,
        };
        let f = match family {
            Family::Plain => 0,
            Family::Logits => 1,
        };
        2 * f + split
    }
}

/// Which family of entry points a launch runs (the template instance of the kernel's bodies).
/// The orchestration takes the plain entries unless one of the logits entries' inputs is set
/// (the plain ones are the fastest: fewer live registers, none of those inputs' tests); methods
/// and filters take the logits entries (over probabilities too: `target_logits` null).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Family {
    /// [`VERIFY_ENTRY`](crate::gpu::kernels::VERIFY_ENTRY) /
    /// [`VERIFY_SPLIT_ENTRY`](crate::gpu::kernels::VERIFY_SPLIT_ENTRY): target probabilities,
    /// padded or ragged (`cu_num_draft_tokens`), sampled or caller-supplied (`bonus`) bonus
    /// tokens.
    Plain,
    /// [`VERIFY_LOGITS_ENTRY`](crate::gpu::kernels::VERIFY_LOGITS_ENTRY) /
    /// [`VERIFY_SPLIT_LOGITS_ENTRY`](crate::gpu::kernels::VERIFY_SPLIT_LOGITS_ENTRY): then also
    /// `target_logits`, `temperature`, `sampling`, `recovered` and `draft_first_row`.
    Logits,
}

/// Every chain entry point of `core/kernels/specula_verify.cu`, in the order of
/// [`Launch::entry_index`]: a driver loads them all from the compiled module and picks one per
/// launch by that index.
pub const ENTRY_NAMES: [&str; 4] = [
    crate::gpu::kernels::VERIFY_ENTRY,
    crate::gpu::kernels::VERIFY_SPLIT_ENTRY,
    crate::gpu::kernels::VERIFY_LOGITS_ENTRY,
    crate::gpu::kernels::VERIFY_SPLIT_LOGITS_ENTRY,
];

/// Which optional inputs a launch passes: what a captured graph was captured with, so a
/// replay can check that the batch written for it has the same ones
/// ([`GpuVerifier::replay_staged`](super::GpuVerifier::replay_staged)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Inputs {
    /// Draft probabilities (otherwise a one-hot drafter).
    pub draft_probs: bool,
    /// The ragged layout (`cu_num_draft_tokens`).
    pub ragged: bool,
    /// Caller-supplied bonus tokens.
    pub bonus: bool,
    /// Target logits with per-request temperature.
    pub logits: bool,
    /// Per-request sampling words: a method per request and / or a filter.
    pub sampling: bool,
    /// bf16 / f16 target logits (instead of f32 ones).
    pub logits_half: bool,
    /// bf16 / f16 draft probabilities (instead of f32 ones).
    pub draft_probs_half: bool,
    /// The recovered-token output (vLLM's `recovered_token_ids`).
    pub recovered: bool,
    /// Mixed drafters: each request's first draft row (or none).
    pub draft_first_row: bool,
}

impl Inputs {
    /// The entry family these inputs need: the plain one when none of the logits entries'
    /// inputs is set.
    #[must_use]
    pub const fn family(self) -> Family {
        if self.logits
            || self.logits_half
            || self.draft_probs_half
            || self.sampling
            || self.recovered
            || self.draft_first_row
        {
            Family::Logits
        } else {
            Family::Plain
        }
    }

    /// The optional inputs an argument block passes: its non-null fields, with the half
    /// formats read from the shape's `flags` word
    /// ([`SHAPE_FLAGS`](crate::gpu::kernels::SHAPE_FLAGS)), the same answer
    /// [`VerifyArgs::inputs`] gives for the views the block was filled from. For a block built
    /// without views (the host shim's), so that its entry is chosen by [`family`](Self::family)
    /// as the orchestration's is.
    #[must_use]
    pub const fn of_block(block: &ArgBlock, flags: u32) -> Self {
        use crate::gpu::kernels::{
            FLAG_DRAFT_BF16, FLAG_DRAFT_F16, FLAG_TARGET_BF16, FLAG_TARGET_F16,
        };
        let target_half = flags & (FLAG_TARGET_BF16 | FLAG_TARGET_F16) != 0;
        let draft_half = flags & (FLAG_DRAFT_BF16 | FLAG_DRAFT_F16) != 0;
        Self {
            draft_probs: block.draft_probs != 0 && !draft_half,
            ragged: block.cu_num_draft_tokens != 0,
            bonus: block.bonus != 0,
            logits: block.target_logits != 0 && !target_half,
            sampling: block.sampling != 0,
            logits_half: block.target_logits != 0 && target_half,
            draft_probs_half: block.draft_probs != 0 && draft_half,
            recovered: block.recovered != 0,
            draft_first_row: block.draft_first_row != 0,
        }
    }
}

/// The device buffers of one chain verification step, typed and borrowed: the compiler checks
/// that they outlive every use the orchestration makes of them (a launch, or a captured graph,
/// which borrows them for its own lifetime). Laid out as `core/DETERMINISM.md` says; the values
/// behind them (shape words, `k`, seeds, offsets, ...) are read by the kernel at run time, so a
/// graph replays with new values copied into the same buffers.
#[derive(Debug)]
pub struct VerifyArgs<'a, D: Driver> {
    /// The views every step kind has (shape, rows, per-request values, accepted and tokens).
    pub step: StepViews<'a, D>,
    /// `k[b]`.
    pub k: View<'a, D, u32>,
    /// Draft ids.
    pub draft_ids: View<'a, D, u32>,
    /// The ragged layout: vLLM's `cu_num_draft_tokens` (B values; `k` is then not read, and
    /// draft ids and rows are packed as `core/DETERMINISM.md` lays them out). `None`: padded.
    pub cu_num_draft_tokens: Option<View<'a, D, u32>>,
    /// Caller-supplied bonus tokens (B values; each request's target row `k` is then not read,
    /// and absent from a ragged target). `None`: sampled.
    pub bonus: Option<View<'a, D, u32>>,
    /// Per-request sampling words, [`SAMPLING_WORDS`](crate::gpu::kernels::SAMPLING_WORDS) per
    /// request ([`sampling_words`](crate::gpu::kernels::sampling_words): method code, then the
    /// filter's words), overriding the shape word's method: the logits entries. `None`: the shape
    /// word's method and no filter for every request.
    pub sampling: Option<View<'a, D, u32>>,
    /// Output: vLLM's recovered tokens, one per draft slot as
    /// [`recovered_tokens`](crate::verify::recovered_tokens) lays them out (padded
    /// `b·k_max + j`, [`SENTINEL`](crate::verify::SENTINEL) for `j ≥ k[b]`; ragged
    /// `cu[b−1] + j`), written by the logits entries in the same launch. At least as long as
    /// `draft_ids`. `None`: not written.
    pub recovered: Option<ViewMut<'a, D, u32>>,
    /// Mixed drafters ([`Draft::first_row`](crate::verify::Draft::first_row)): request `b`'s
    /// first row in the draft rows, or [`NO_DRAFT_ROWS`](crate::verify::NO_DRAFT_ROWS) for a
    /// request verified as a one-hot drafter's (B values): the logits entries. `None`: every
    /// request's rows where the layout puts them.
    pub draft_first_row: Option<View<'a, D, u32>>,
}

impl<D: Driver> VerifyArgs<'_, D> {
    /// Which optional inputs these views pass (and so which entry family a launch takes).
    #[must_use]
    pub fn inputs(&self) -> Inputs {
        let s = &self.step;
        Inputs {
            draft_probs: s.draft_probs.is_some_and(|d| !d.is_half()),
            ragged: self.cu_num_draft_tokens.is_some(),
            bonus: self.bonus.is_some(),
            logits: s.temperature.is_some() && !s.target.is_half(),
            sampling: self.sampling.is_some(),
            logits_half: s.temperature.is_some() && s.target.is_half(),
            draft_probs_half: s.draft_probs.is_some_and(|d| d.is_half()),
            recovered: self.recovered.is_some(),
            draft_first_row: self.draft_first_row.is_some(),
        }
    }
}

/// One kernel launch as the orchestration asks a driver for it: everything the driver glue
/// turns into its launch parameters, in the kernel's parameter order.
#[derive(Debug)]
pub struct Launch<'l, 'a, D: Driver> {
    /// Which block layout (one block per request, or rows split); the entry family is the
    /// views' ([`args.inputs().family()`](VerifyArgs::inputs)).
    pub entry: Entry,
    /// Blocks: `capacity` for [`Entry::Single`], `capacity · slices` for [`Entry::Split`].
    pub grid: u32,
    /// Threads per block ([`Driver::block_threads`]).
    pub block: u32,
    /// The step's buffers.
    pub args: &'l VerifyArgs<'a, D>,
    /// The counters buffer ([`stats_words`](crate::gpu::kernels::stats_words)`(K)` `u64` words).
    pub stats: &'l D::Buffer,
    /// The split entry's scratch (zero between launches); `Some` exactly for [`Entry::Split`].
    pub scratch: Option<&'l D::Buffer>,
}

impl<'l, D: Driver> Launch<'l, '_, D> {
    /// The index of the entry point in [`ENTRY_NAMES`] (what a driver loaded them by).
    #[must_use]
    pub fn entry_index(&self) -> usize {
        self.entry.index(self.args.inputs().family())
    }

    /// The name of the entry point this launch runs.
    #[must_use]
    pub fn entry_name(&self) -> &'static str {
        ENTRY_NAMES[self.entry_index()]
    }

    /// The launch's only parameter, the kernel's argument block: every view's device address
    /// (`address` of its buffer plus its byte offset), null (`0`) where a view is not set, the
    /// split entries' scratch and `slices` (`1` for one block per request). A driver calls it
    /// once per launch with its buffers' base addresses (and may keep each buffer `address` is
    /// called with alive until the launch has run), so which field holds what is decided (and
    /// tested) here once.
    pub fn arg_block(&self, address: impl FnMut(&'l D::Buffer) -> u64) -> ArgBlock {
        let a = self.args;
        a.step.arg_block(self.stats, address, |at, step| ArgBlock {
            k: field!(at, a.k),
            draft_ids: field!(at, a.draft_ids),
            scratch: self.scratch.map_or(0, |b| at(b, 0)),
            cu_num_draft_tokens: field!(at, ?a.cu_num_draft_tokens),
            bonus: field!(at, ?a.bonus),
            sampling: field!(at, ?a.sampling),
            recovered: field!(at, ?a.recovered.as_ref()),
            draft_first_row: field!(at, ?a.draft_first_row),
            slices: match self.entry {
                Entry::Single => 1,
                Entry::Split { slices } => slices,
            },
            ..step
        })
    }
}

/// A GPU API as the orchestration uses it.
///
/// Handles are cheap to clone where the orchestration shares them (a driver value, a device
/// buffer shared by a verifier, its readbacks and its graphs). Every method that enqueues work
/// returns as soon as the work is queued; only [`sync_event`](Driver::sync_event) and
/// [`sync_stream`](Driver::sync_stream) wait for the device, and the orchestration counts
/// every call it makes to them ([`GpuVerifier::sync_calls`](super::GpuVerifier::sync_calls),
/// [`GpuReadback::sync_calls`](super::GpuReadback::sync_calls)).
///
/// A driver keeps every buffer alive until the work that uses it has completed, even if its last
/// handle is dropped earlier (reference counts, or a free that waits, as `cuMemFree` does).
pub trait Driver: Memory + Clone {
    /// Why a driver call failed.
    type Error: Debug + Clone + PartialEq + core::fmt::Display + HasKind;
    /// An in-order queue of work.
    type Stream: Clone;
    /// A marker in a stream that can be queried and waited on.
    type Event;
    /// Page-locked host memory, target of asynchronous device-to-host copies.
    type HostBuffer;
    /// A captured, executable sequence of stream work.
    type Graph;

    /// A new stream.
    fn stream(&self) -> Result<Self::Stream, Self::Error>;
    /// A new event (no timing).
    fn event(&self) -> Result<Self::Event, Self::Error>;
    /// `bytes` of zeroed device memory (at least 8-byte aligned).
    fn alloc(&self, bytes: usize) -> Result<Self::Buffer, Self::Error>;
    /// `bytes` of zeroed page-locked host memory.
    fn alloc_host(&self, bytes: usize) -> Result<Self::HostBuffer, Self::Error>;
    /// Enqueues a copy of `src` into `dst` at byte `offset` (in bounds: the orchestration checks).
    /// `src` may be reused as soon as this returns (the driver stages it, as a pageable
    /// `cuMemcpyHtoDAsync` does).
    fn upload<T: Element>(
        &self,
        stream: &Self::Stream,
        dst: &Self::Buffer,
        offset: usize,
        src: &[T],
    ) -> Result<(), Self::Error>;
    /// Enqueues a device-to-device copy of `bytes` bytes.
    fn copy(
        &self,
        stream: &Self::Stream,
        dst: &Self::Buffer,
        src: &Self::Buffer,
        bytes: usize,
    ) -> Result<(), Self::Error>;
    /// Enqueues a copy of `bytes` bytes of `src` from byte `src_offset` into the page-locked
    /// `dst` at byte `dst_offset` (both in bounds: the orchestration checks).
    fn download(
        &self,
        stream: &Self::Stream,
        dst: &Self::HostBuffer,
        dst_offset: usize,
        src: &Self::Buffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), Self::Error>;
    /// Reads `out.len()` elements of `buf` from byte `offset` (in bounds: the orchestration
    /// checks).
    ///
    /// # Safety
    /// No copy into `buf` may be in flight: every download into it has been seen complete (an
    /// event recorded after it queried [`Status::Ready`] or was waited on).
    unsafe fn read_host<T: Element>(&self, buf: &Self::HostBuffer, offset: usize, out: &mut [T]);
    /// Enqueues `event` on `stream`: it completes when the work queued before it has.
    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<(), Self::Error>;
    /// Makes `stream` wait (on the device, not the host) for the last recording of `event`.
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<(), Self::Error>;
    /// Whether the last recording of `event` has completed. Never waits. An error is the
    /// failure of the work it tracks.
    fn query(&self, event: &Self::Event) -> Result<Status, Self::Error>;
    /// Waits on the host for the last recording of `event`. Synchronising.
    fn sync_event(&self, event: &Self::Event) -> Result<(), Self::Error>;
    /// Waits on the host for everything queued on `stream`. Synchronising.
    fn sync_stream(&self, stream: &Self::Stream) -> Result<(), Self::Error>;
    /// Called once by a [`GpuReadback`](super::GpuReadback)'s drop, right before its
    /// page-locked buffers are freed, with the stream its copies into them run on. The default
    /// waits for that stream ([`sync_stream`](Self::sync_stream); a drop cannot report its
    /// error), so no copy still in flight or abandoned lands in freed memory: what CUDA and HIP
    /// need. A driver whose page-locked buffers, like its device buffers, live until the work
    /// that uses them has completed may do nothing instead (the host driver of
    /// `specula-tests`, whose shutdown never waits for a copy that may never complete).
    fn drain_copies(&self, stream: &Self::Stream) {
        let _ = self.sync_stream(stream);
    }
    /// Enqueues one launch of the kernel.
    fn launch(
        &self,
        stream: &Self::Stream,
        launch: &Launch<'_, '_, Self>,
    ) -> Result<(), Self::Error>;
    /// Starts capturing `stream`: work enqueued on it is recorded, not run, until
    /// [`end_capture`](Driver::end_capture).
    fn begin_capture(&self, stream: &Self::Stream) -> Result<(), Self::Error>;
    /// Ends the capture and instantiates what was recorded.
    fn end_capture(&self, stream: &Self::Stream) -> Result<Self::Graph, Self::Error>;
    /// Enqueues one replay of `graph` on `stream`.
    fn replay(&self, graph: &Self::Graph, stream: &Self::Stream) -> Result<(), Self::Error>;
    /// Whether `buf` is memory of this driver's device (context), so its launches may read and
    /// write it: checked for the device tensors a batch brings
    /// ([`Values::Device`](crate::verify::Values::Device), [`DeviceOut`](crate::verify::DeviceOut)),
    /// refused otherwise ([`GpuError::ForeignMemory`](super::GpuError::ForeignMemory)). Default:
    /// every buffer of this type (a driver of one device per process).
    fn owns(&self, buf: &Self::Buffer) -> bool {
        let _ = buf;
        true
    }
    /// Multiprocessors (compute units): below one request per multiprocessor, launches split
    /// each request's rows over several blocks.
    fn multiprocessors(&self) -> u32;
    /// Threads per block the kernel text was compiled for.
    fn block_threads(&self) -> u32;

    /// Makes the tree entries ready to launch (a driver that compiles kernels at run time
    /// compiles and loads the tree module here, once). Set-up, never the step path: the
    /// orchestration calls it from [`stage`](super::GpuVerifier::stage) and
    /// [`capture`](super::GpuVerifier::capture) of a tree (before the capture begins: no
    /// module is loaded while a stream is capturing). A driver whose tree entry is always ready
    /// keeps the default, which does nothing.
    fn prepare_tree(&self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Enqueues one launch of the tree entry point
    /// [`launch.entry_name()`](TreeLaunch::entry_name) (binary32 or half rows; a driver loads
    /// both, [`TREE_ENTRY_NAMES`](crate::gpu::kernels::TREE_ENTRY_NAMES), and picks by
    /// [`entry_index`](TreeLaunch::entry_index)). Like
    /// [`launch`](Self::launch), the call only enqueues (and is recorded in a capture like any
    /// other stream work). A driver that compiles kernels at run time compiles the tree module
    /// in [`prepare_tree`](Self::prepare_tree), or here on the first launch if nothing prepared
    /// it (set-up cost paid once, and only by runtimes that verify trees); a missing compiler or
    /// entry point is an error, never a panic.
    fn launch_tree(
        &self,
        stream: &Self::Stream,
        launch: &TreeLaunch<'_, '_, Self>,
    ) -> Result<(), Self::Error>;
}
