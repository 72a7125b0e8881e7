//! [`GpuVerifier`]: the kernel over a [`Driver`], written once for every GPU API.

use super::driver::{Driver, Entry, Inputs, Launch, VerifyArgs};
use super::error::GpuError;
use super::readback::{GpuReadback, read_stats};
use super::staging::sealed::{Download, Launch as Launches, Stage, download};
use super::staging::{ChainStep, SUPPORT, Staged, Staging, Step};
use super::tree::TreeStep;
use crate::gpu::kernels;
use crate::metrics::Counters;
use crate::metrics::MAX_IN_FLIGHT;
use crate::verify::tree::{TreeBatch, TreeOutputs};
use crate::verify::{Batch, Check, Method, Outputs, Support, Verifier};
use core::marker::PhantomData;

/// The most blocks one request's rows are split over.
pub const MAX_SLICES: u32 = 64;

/// A captured launch of a [`Step`] kind (`S`: [`ChainStep`], the default, or [`TreeStep`]),
/// replayable with new values in the same buffers. It borrows the buffers of the
/// [`VerifyArgs`] or [`TreeArgs`](super::TreeArgs) it was captured on for `'a`, so none can be
/// freed or reallocated while it exists. Replay it only on the verifier that captured it.
///
/// ```compile_fail,E0502
/// use specula_core::gpu::{Driver, GpuVerifier, Staging, TreeStep};
/// use specula_core::verify::{Method, tree::TreeBatch};
/// fn grow_under_a_graph<D: Driver>(
///     v: &GpuVerifier<D, 8>,
///     staging: &mut Staging<D, TreeStep>,
///     batch: &TreeBatch<'_>,
/// ) {
///     let args = staging.write::<8>(v.driver(), v.stream(), Method::Greedy, batch, ()).unwrap();
///     let graph = unsafe { v.capture_staged(&args) }.unwrap();
///     staging.reserve(v.driver(), batch, ()).unwrap(); // the graph still reads the buffers
///     v.replay(&graph).unwrap();
/// }
/// ```
#[derive(Debug)]
pub struct VerifyGraph<'a, D: Driver, S: Step = ChainStep> {
    graph: D::Graph,
    capacity: u32,
    key: S::Key,
    _buffers: PhantomData<&'a D::Buffer>,
}

impl<D: Driver, S: Step> VerifyGraph<'_, D, S> {
    /// The capacity (blocks per slice) it launches.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

impl<D: Driver> VerifyGraph<'_, D> {
    /// The optional inputs it was captured with (and so its entry point).
    pub fn inputs(&self) -> Inputs {
        self.key
    }
}

/// The verification kernel with its device counters (`Counters<K>` plus an error word), its
/// compute stream, split scratch and host-slice staging, over any [`Driver`].
///
/// The step path is [`launch`](GpuVerifier::launch) (or a [`VerifyGraph`] replay) and a
/// [`GpuReadback`]'s `start`/`poll`: they enqueue work and query events, and never call a
/// synchronising driver method. [`sync_calls`](GpuVerifier::sync_calls) counts the
/// synchronising calls this verifier made (the host-slice [`Verifier`] path makes one per
/// call; the step path none).
#[derive(Debug)]
pub struct GpuVerifier<D: Driver, const K: usize> {
    drv: D,
    stream: D::Stream,
    stats: D::Buffer,
    /// Scratch of the split entry and the capacity it is sized for.
    split: Option<(D::Buffer, u32)>,
    pub(super) staging: Staging<D>,
    /// The tree host-slice path's staging: apart from the chain's on purpose, so a tree batch
    /// never grows a buffer that a graph captured on chain views reads.
    pub(super) trees: Staging<D, TreeStep>,
    /// Page-locked outputs of the host-slice path: the stats words, then the outputs.
    host: Option<(D::HostBuffer, usize)>,
    done: D::Event,
    flags_seen: u64,
    syncs: u64,
}

impl<D: Driver, const K: usize> GpuVerifier<D, K> {
    /// A verifier with zeroed device counters and its own stream.
    pub fn new(drv: D) -> Result<Self, GpuError<D::Error>> {
        let stream = drv.stream().map_err(GpuError::Driver)?;
        Self::with_stream(drv, stream)
    }

    /// A verifier with zeroed device counters whose work is ordered on `stream` (the caller's
    /// compute stream, so verification follows the model's kernels with no host wait).
    pub fn with_stream(drv: D, stream: D::Stream) -> Result<Self, GpuError<D::Error>> {
        let stats = drv
            .alloc(kernels::stats_words(K) * 8)
            .map_err(GpuError::Driver)?;
        Ok(Self {
            stream,
            done: drv.event().map_err(GpuError::Driver)?,
            drv,
            stats,
            split: None,
            staging: Staging::new(),
            trees: Staging::default(),
            host: None,
            flags_seen: 0,
            syncs: 0,
        })
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.drv
    }

    /// The compute stream every launch is enqueued on.
    pub fn stream(&self) -> &D::Stream {
        &self.stream
    }

    /// The counters buffer ([`kernels::stats_words`]`(K)` `u64` words).
    pub fn stats(&self) -> &D::Buffer {
        &self.stats
    }

    /// Synchronising driver calls this verifier has made.
    pub fn sync_calls(&self) -> u64 {
        self.syncs
    }

    /// A readback of this verifier's counters with up to [`MAX_IN_FLIGHT`] copies in flight,
    /// ordered on its compute stream.
    pub fn readback(&self) -> Result<GpuReadback<D, K, MAX_IN_FLIGHT>, GpuError<D::Error>> {
        GpuReadback::new(self)
    }

    /// Blocks per request a launch of `capacity` requests uses: below one request per
    /// multiprocessor, `min(⌈2 · SMs / capacity⌉, 64)` when scratch for that capacity is
    /// reserved ([`reserve_split`](GpuVerifier::reserve_split)); otherwise 1.
    pub fn slices_for(&self, capacity: u32) -> u32 {
        let reserved = self.split.as_ref().is_some_and(|(_, c)| *c >= capacity);
        if !reserved {
            return 1;
        }
        wanted_slices(self.drv.multiprocessors(), capacity)
    }

    /// Allocates (zeroed) the split entry's scratch for launches of up to `capacity` requests,
    /// so small batches spread over the device without allocating on the step path. Set-up;
    /// [`stage`](GpuVerifier::stage) calls it.
    pub fn reserve_split(&mut self, capacity: u32) -> Result<(), GpuError<D::Error>> {
        if self.split.as_ref().is_some_and(|(_, c)| *c >= capacity) {
            return Ok(());
        }
        let sms = self.drv.multiprocessors();
        if wanted_slices(sms, capacity) <= 1 {
            return Ok(());
        }
        // Every launch of a capacity up to this one uses the scratch, with its own slice count
        // (more slices for fewer requests): size it for the largest need among them, not just
        // this capacity's. k_max ≤ K always (the kernel refuses a larger shape).
        let bytes = split_scratch_bytes::<K>(sms, capacity).ok_or(GpuError::TooLarge)?;
        self.split = None;
        self.split = Some((self.drv.alloc(bytes).map_err(GpuError::Driver)?, capacity));
        Ok(())
    }

    /// Set-up for the host-slice path of either step kind (chains: `S` = [`ChainStep`], trees:
    /// [`TreeStep`]): validates `batch` like the reference (with `out`, the host outputs its
    /// results will be copied to; trees: [`validate_tree_with`](crate::verify::tree::validate_tree_with)
    /// with [`SUPPORT`]), makes a tree entry ready ([`Driver::prepare_tree`]: a run-time
    /// compiled driver compiles it here, not on the step path), grows `staging` and a chain's
    /// split scratch for it. Then [`Staging::write`] enqueues the copies and gives the views
    /// for [`launch_staged`](GpuVerifier::launch_staged) or
    /// [`capture_staged`](GpuVerifier::capture_staged).
    pub fn stage<S: Step>(
        &mut self,
        staging: &mut Staging<D, S>,
        method: Method,
        check: Check,
        batch: &S::Batch<'_>,
        out: &S::Outputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        S::check::<K>(method, check, batch, out)?;
        S::prepare(&self.drv)?;
        self.reserve(staging, batch, S::produce(out))
    }

    /// Grows `staging` for `batch`, then what the step kind sets up beside it.
    fn reserve<S: Step>(
        &mut self,
        staging: &mut Staging<D, S>,
        batch: &S::Batch<'_>,
        produce: S::Produce,
    ) -> Result<(), GpuError<D::Error>> {
        staging.reserve(&self.drv, batch, produce)?;
        S::reserved(self, batch)
    }

    /// The step path: enqueues one launch on the compute stream and returns; no synchronising
    /// call. Bad requests (malformed trees) are skipped by the kernel and flagged in the error
    /// word.
    ///
    /// The views' lengths are checked against their capacity (per-request buffers and the
    /// shape words; a tree's per-node buffers too).
    ///
    /// A chain's entry point follows the optional views ([`VerifyArgs::inputs`]): the plain one
    /// when none of `temperature` (logits), `sampling`, `recovered`, `draft_first_row` (nor a
    /// half tensor) is set (the ragged layout and bonus tokens included), the `_logits` one
    /// otherwise. A tree launches the tree entry ([`Driver::launch_tree`]), one block per
    /// request.
    ///
    /// # Safety
    /// The shape words in device memory (read by the kernel when it runs) must describe
    /// extents within the views. A chain: rows × strides of the probability (or logit) views,
    /// `capacity · k_max` draft ids, `capacity · (k_max + 1)` tokens; in the ragged layout the
    /// cumulative counts in device memory too (`cu[B−1]` draft ids and draft rows,
    /// `cu[B−1] + B` target rows, or `cu[B−1]` with bonus tokens), and `recovered`, when set,
    /// one value per draft slot. A tree: `batch ≤ capacity` node counts, `batch · N` tokens
    /// and links, `batch · N` rows × strides of the probability views,
    /// `batch · (max_depth + 1)` path and token slots. Views written by [`Staging::write`]
    /// meet this.
    pub unsafe fn launch<A: Launches<D>>(&self, args: &A) -> Result<(), GpuError<D::Error>> {
        if !args.fits() {
            return Err(GpuError::ViewTooShort);
        }
        args.enqueue(self)
    }

    /// [`launch`](GpuVerifier::launch) on views [`Staging::write`] returned, whose shape words
    /// it wrote to describe exactly those views.
    ///
    /// # Safety
    /// Nothing but [`Staging::write`] has written the staging buffers since (device memory is
    /// reachable through the driver's safe calls, so the compiler cannot rule that out).
    pub unsafe fn launch_staged<A: Launches<D>>(
        &self,
        args: &Staged<A>,
    ) -> Result<(), GpuError<D::Error>> {
        // SAFETY: staged views hold exactly the checked batch the shape words describe (the
        // caller vouches that nothing else wrote them).
        unsafe { self.launch(args) }
    }

    /// [`capture`](GpuVerifier::capture) on views [`Staging::write`] returned. Replays stay in
    /// bounds while later batches (a chain's: with the same optional inputs,
    /// [`VerifyArgs::inputs`]) are written into the same staging by [`Staging::write`] (which
    /// only writes consistent shape words, and cannot grow the buffers while the graph
    /// borrows them): [`replay_staged`](GpuVerifier::replay_staged) checks the inputs at each
    /// replay.
    ///
    /// # Safety
    /// As [`launch_staged`](GpuVerifier::launch_staged), at every replay; each replay follows a
    /// write of a batch with the graph's inputs (what `replay_staged` checks).
    pub unsafe fn capture_staged<'a, A: Launches<D> + 'a>(
        &self,
        args: &Staged<A>,
    ) -> Result<VerifyGraph<'a, D, A::Step>, GpuError<D::Error>> {
        // SAFETY: as for `launch_staged`, vouched for by the caller.
        unsafe { self.capture(args) }
    }

    /// Captures one launch on `args` as a graph (no work runs; a tree entry is made ready
    /// first, [`Driver::prepare_tree`]). Set-up; a replay is one driver call on the step path.
    ///
    /// # Safety
    /// As for [`launch`](GpuVerifier::launch), at every replay.
    pub unsafe fn capture<'a, A: Launches<D> + 'a>(
        &self,
        args: &A,
    ) -> Result<VerifyGraph<'a, D, A::Step>, GpuError<D::Error>> {
        if !args.fits() {
            return Err(GpuError::ViewTooShort);
        }
        // Compile / load a tree module now, not while the stream is capturing.
        A::Step::prepare(&self.drv)?;
        self.drv
            .begin_capture(&self.stream)
            .map_err(GpuError::Driver)?;
        let launched = args.enqueue(self);
        // End the capture even when the launch failed, so the stream is usable again.
        let graph = self.drv.end_capture(&self.stream).map_err(GpuError::Driver);
        launched?;
        Ok(VerifyGraph {
            graph: graph?,
            capacity: args.capacity(),
            key: args.key(),
            _buffers: PhantomData,
        })
    }

    /// Enqueues one replay of `graph` on the compute stream (the step path: no synchronising
    /// call).
    pub fn replay<S: Step>(&self, graph: &VerifyGraph<'_, D, S>) -> Result<(), GpuError<D::Error>> {
        self.drv
            .replay(&graph.graph, &self.stream)
            .map_err(GpuError::Driver)
    }

    /// [`replay`](GpuVerifier::replay) for a batch [`Staging::write`] wrote into the staging
    /// the graph was captured on: refuses ([`GpuError::GraphMismatch`], nothing enqueued) views
    /// whose optional inputs ([`VerifyArgs::inputs`]) differ from the graph's, or whose batch
    /// exceeds its capacity. A graph reads every view it was captured with, so a replay after a
    /// batch of another kind would read stale buffers (a padded batch through a ragged graph,
    /// probabilities through a logits graph), possibly beyond what the new batch wrote.
    pub fn replay_staged<A: Launches<D>>(
        &self,
        graph: &VerifyGraph<'_, D, A::Step>,
        staged: &Staged<A>,
    ) -> Result<(), GpuError<D::Error>> {
        if staged.key() != graph.key || staged.capacity() > graph.capacity {
            return Err(GpuError::GraphMismatch);
        }
        self.replay(graph)
    }

    /// Copies the outputs of the work enqueued so far to `out`'s host slices and waits (one
    /// synchronising call). A chain's: accepted counts, tokens, and the recovered tokens when
    /// `out` has them (`args.recovered`, staged with
    /// [`Produce::recovered`](crate::verify::Produce::recovered)); a tree's: accepted lengths,
    /// paths, tokens. Outputs on the device ([`Outputs::on_device`],
    /// [`TreeOutputs::on_device`]) are written in place, so then only the counters' words are.
    /// Not the step path. Returns the error-flag word; a host slice longer than its view is
    /// [`GpuError::ViewTooShort`] (nothing copied).
    pub fn download_outputs<A: Launches<D>>(
        &mut self,
        args: &A,
        out: &mut <A::Step as Step>::Outputs<'_>,
    ) -> Result<u64, GpuError<D::Error>> {
        self.download(args.downloads(out)?).map(|(_, flags)| flags)
    }

    /// Copies the counters' words and then `parts` (device buffer, byte offset, host slice)
    /// through the page-locked buffer and waits (one synchronising call).
    #[allow(clippy::type_complexity)]
    fn download(
        &mut self,
        parts: [Option<(&D::Buffer, usize, &mut [u32])>; 3],
    ) -> Result<(Counters<K>, u64), GpuError<D::Error>> {
        let s_bytes = kernels::stats_words(K) * 8;
        let mut total = s_bytes;
        for (_, _, out) in parts.iter().flatten() {
            total = total.checked_add(out.len() * 4).ok_or(GpuError::TooLarge)?;
        }
        let (d, s) = (&self.drv, &self.stream);
        let host = match &mut self.host {
            Some((host, n)) if *n >= total => host,
            host => {
                *host = None; // free before allocating the larger one
                &host
                    .insert((d.alloc_host(total).map_err(GpuError::Driver)?, total))
                    .0
            }
        };
        // Stats words first (8-aligned), then the outputs in order.
        d.download(s, host, 0, &self.stats, 0, s_bytes)
            .map_err(GpuError::Driver)?;
        let mut at = s_bytes;
        for (buf, offset, out) in parts.iter().flatten() {
            d.download(s, host, at, buf, *offset, out.len() * 4)
                .map_err(GpuError::Driver)?;
            at += out.len() * 4;
        }
        d.record(&self.done, s).map_err(GpuError::Driver)?;
        self.syncs += 1;
        d.sync_event(&self.done).map_err(GpuError::Driver)?;
        let mut at = s_bytes;
        for (_, _, out) in parts.into_iter().flatten() {
            // SAFETY: the event recorded after every download into `host` has been waited on.
            unsafe { d.read_host(host, at, out) };
            at += out.len() * 4;
        }
        // SAFETY: as above.
        Ok(unsafe { read_stats::<D, K>(d, host) })
    }
}

/// Scratch bytes of the split entry that launches of every capacity `1..=capacity` need on
/// `sms` multiprocessors, each with its own slice count (`min(⌈2 · sms / c⌉, 64)` below `sms`
/// requests): fewer requests take more slices, and can need more scratch than `capacity` does.
/// `None` on overflow.
pub fn split_scratch_bytes<const K: usize>(sms: u32, capacity: u32) -> Option<usize> {
    let mut most = 0usize;
    for c in 1..=capacity {
        let words = kernels::split_scratch_words(K, wanted_slices(sms, c) as usize);
        most = most.max(words.checked_mul(c as usize)?);
    }
    most.checked_mul(8)
}

fn wanted_slices(sms: u32, capacity: u32) -> u32 {
    if capacity == 0 || capacity >= sms {
        return 1;
    }
    (2 * sms).div_ceil(capacity).clamp(1, MAX_SLICES)
}

/// The chain step's launch: the plain, `_logits` or split entries ([`Driver::launch`]).
impl<D: Driver> Launches<D> for VerifyArgs<'_, D> {
    type Step = ChainStep;

    fn capacity(&self) -> u32 {
        self.step.capacity
    }

    fn key(&self) -> Inputs {
        self.inputs()
    }

    fn fits(&self) -> bool {
        let s = &self.step;
        let b = s.capacity as usize;
        let per_request = |len: Option<usize>| len.is_none_or(|n| n >= b);
        let len = |v: Option<super::View<'_, D, u32>>| v.map(|v| v.len());
        s.fits(kernels::SHAPE_WORDS, &[])
            // The ragged layout never reads `k`.
            && (self.cu_num_draft_tokens.is_some() || self.k.len() >= b)
            && per_request(len(self.cu_num_draft_tokens))
            && per_request(len(self.bonus))
            && self
                .sampling
                .is_none_or(|v| v.len() / kernels::SAMPLING_WORDS >= b)
            && per_request(len(self.draft_first_row))
            // First rows index draft rows: none without them.
            && (self.draft_first_row.is_none() || s.draft_probs.is_some())
            // Probabilities are binary32 (no chain entry reads half ones).
            && (s.temperature.is_some() || !s.target.is_half())
    }

    fn enqueue<const K: usize>(&self, v: &GpuVerifier<D, K>) -> Result<(), GpuError<D::Error>> {
        let capacity = self.step.capacity.max(1);
        // Scratch is only ever reserved below one request per multiprocessor, so a launch that
        // fits it always splits (over ≥ 2 blocks).
        let (entry, slices, scratch) = match &v.split {
            Some((buf, c)) if *c >= capacity => {
                let slices = wanted_slices(v.drv.multiprocessors(), capacity);
                (Entry::Split { slices }, slices, Some(buf))
            }
            _ => (Entry::Single, 1, None),
        };
        let launch = Launch {
            entry,
            grid: capacity.saturating_mul(slices),
            block: v.drv.block_threads(),
            args: self,
            stats: &v.stats,
            scratch,
        };
        v.drv.launch(&v.stream, &launch).map_err(GpuError::Driver)
    }

    fn downloads<'x>(
        &'x self,
        out: &'x mut Outputs<'_>,
    ) -> Result<[Download<'x, D>; 3], GpuError<D::Error>> {
        let (accepted, tokens, recovered) = match out {
            Outputs::Host {
                accepted,
                tokens,
                recovered,
            } => (&mut **accepted, &mut **tokens, recovered.as_deref_mut()),
            // The launch wrote them in place: only the stats words are copied.
            Outputs::Device { .. } => (&mut [][..], &mut [][..], None),
        };
        let recovered = match (&self.recovered, recovered) {
            (Some(v), Some(r)) => download(v, r)?,
            (None, Some(_)) => return Err(GpuError::ViewTooShort),
            (_, None) => None,
        };
        let accepted = download(&self.step.accepted, accepted)?;
        Ok([accepted, download(&self.step.tokens, tokens)?, recovered])
    }
}

impl<D: Driver, const K: usize> Verifier<K> for GpuVerifier<D, K> {
    type Error = GpuError<D::Error>;

    /// Stage, launch, copy down, wait (one synchronising call): the host-slice convenience.
    /// Device tensors ([`Values::Device`](crate::verify::Values::Device) rows) are read in
    /// place, and outputs on the device ([`Outputs::on_device`]) are written in place with
    /// neither the copy down nor the wait: then the call only enqueues (the small per-request
    /// values, `k`, ids, seeds, offsets, temperatures, are still copied from the host), and
    /// the results are ready for the caller's next work on this verifier's stream. Device
    /// memory of another driver or device is [`GpuError::ForeignMemory`], and
    /// [`Check::Strict`] over device rows is refused ([`Feature::DeviceCheck`](crate::verify::Feature::DeviceCheck)):
    /// nothing enqueued, written or counted.
    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), Self::Error> {
        self.verify_host::<ChainStep>(method, check, batch, out)
    }

    fn totals(&mut self) -> Result<Counters<K>, Self::Error> {
        self.download([None, None, None]).map(|(c, _)| c)
    }

    /// [`SUPPORT`]: `k = 0`, the ragged layout, bonus tokens and f32 logits with temperature.
    fn support(&self) -> Support {
        SUPPORT
    }

    /// Verifies a batch of token trees from host slices, as the CPU backend's `verify_tree`
    /// does (`core/DETERMINISM.md`, "Token trees"; bit-identical to
    /// [`verify_tree_batch`](crate::verify::tree::verify_tree_batch)): validates it like the
    /// reference ([`GpuError::Verify`] with the reference's error, [`SUPPORT`]'s rows: binary32,
    /// bf16 or f16, on the host or the device; half rows give the bits of the tree of their
    /// widened values), stages it (probabilities, or target logits with their
    /// temperatures; rows in device memory are read in place, another device's or driver's
    /// are [`GpuError::ForeignMemory`], [`Check::Strict`] over them is refused), launches the
    /// tree entry, copies the outputs (host slices) down and waits (one synchronising call).
    /// Outputs on the device ([`TreeOutputs::on_device`]) are written in place by the launch,
    /// with neither the copy down nor the wait (as [`verify`](Verifier::verify)'s; another
    /// device's are [`GpuError::ForeignMemory`]). Each request is counted as a chain of
    /// its tree's depth in this verifier's counters (the chain launches' buffer). On a
    /// validation error nothing is launched, written or counted. A new kernel error flag is
    /// [`GpuError::DeviceFlags`] (reported once).
    fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        self.verify_host::<TreeStep>(method, check, batch, out)
    }
}

impl<D: Driver, const K: usize> GpuVerifier<D, K> {
    /// [`Verifier::verify`] and [`Verifier::verify_tree`]: validate, stage into this verifier's
    /// staging of the step kind, launch, and copy host outputs down.
    fn verify_host<S: Step>(
        &mut self,
        method: Method,
        check: Check,
        batch: &S::Batch<'_>,
        out: &mut S::Outputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        S::check::<K>(method, check, batch, out)?;
        let mut staging = core::mem::take(S::staging(self));
        let result = self.verify_staged(&mut staging, method, batch, out);
        *S::staging(self) = staging;
        result
    }

    fn verify_staged<S: Step>(
        &mut self,
        staging: &mut Staging<D, S>,
        method: Method,
        batch: &S::Batch<'_>,
        out: &mut S::Outputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        let produce = S::produce(out);
        // The caller's device memory is checked before anything is allocated or enqueued
        // (the inputs by `reserve`, the outputs here), once: the views are the launch's.
        let views = S::out_views(&self.drv, out)?;
        self.reserve(staging, batch, produce)?;
        let (drv, stream) = (&self.drv, &self.stream);
        if views.is_some() {
            // Outputs on the device: the launch writes them in place; no copy down, no wait.
            // The kernel's error flags stay in the counters buffer: a validated batch raises
            // none (every input they flag is checked on the host first).
            let args = staging.write_in_place::<K>(drv, stream, method, batch, views, produce)?;
            // SAFETY: written just above by `write_in_place`, whose shape words describe exactly
            // these views (the device ones checked against the batch by validation);
            // nothing else touches this verifier's staging.
            return unsafe { self.launch_staged(&args) };
        }
        drop(views); // `None`: ends its borrow of `out`, which the download writes
        let args = staging.write_in_place::<K>(drv, stream, method, batch, None, produce)?;
        // SAFETY: written just above by `write_in_place`; nothing else touches this verifier's
        // staging.
        unsafe { self.launch_staged(&args)? };
        let flags = self.download_outputs(&args, out)?;
        if flags != self.flags_seen {
            self.flags_seen = flags;
            return Err(GpuError::DeviceFlags(flags));
        }
        Ok(())
    }
}
