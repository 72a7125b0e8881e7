//! Token trees on the GPU: the tree entry points of the kernel text
//! ([`kernels::TREE_ENTRY`] for binary32 rows, [`kernels::TREE_HALF_ENTRY`] when the views hold
//! half rows: [`TreeLaunch::entry_name`]; `core/kernels/specula_tree.cu`) launched by [`GpuVerifier`] over
//! any [`Driver`](super::Driver), with the same counters buffer as chain launches (so tree counts flow
//! through the same [`GpuReadback`](super::GpuReadback), slot and exporters).
//!
//! * The step path: [`GpuVerifier::launch_tree`] on typed views ([`TreeArgs`]), or a
//!   [`TreeGraph`] captured once ([`GpuVerifier::capture_tree`]) and replayed
//!   ([`GpuVerifier::replay_tree`]): one block per request, nothing synchronises. A malformed
//!   tree on this path is the kernel's to catch: it sets [`kernels::ERR_TREE`] (a node token
//!   `≥ V`: [`kernels::ERR_TOKEN`]) and skips that request only.
//! * The host-slice path: [`GpuVerifier::verify_tree`], as `CpuVerifier::verify_tree` of the
//!   CPU backend (the reference's validation first, with the same
//!   [`VerifyError`](crate::verify::VerifyError)s; one synchronising call), staged in
//!   grow-only buffers ([`Staging`]`<D, `[`TreeStep`]`>`); rows in device memory
//!   ([`Values::Device`](crate::verify::Values::Device)) are read in place, and outputs in
//!   device memory ([`TreeOutputs::on_device`]) are written in place, with no copy down and no
//!   synchronising call.
//!
//! Rows may be binary32, bf16 or f16 (host or device; [`RowsView`](super::RowsView) in
//! [`TreeArgs::target`] and [`TreeArgs::draft_probs`], and the shape's half flags): the tree entry widens each value
//! exactly as it reads it, so half rows give the bits of the tree of their widened values.
//!
//! The tree entry takes target probabilities, or target logits with a temperature per request
//! ([`TreeArgs::target`] with [`TreeArgs::temperature`]; `0`: greedy on the logit rows,
//! `> 0`: each node row's softmax computed on the fly, `core/DETERMINISM.md`).

pub(super) mod args;
pub(super) mod staging;

pub use args::{TreeArgs, TreeLaunch};
pub use staging::{TreeStep, tree_shape};

use super::driver::Driver;
use super::error::GpuError;
use super::readback::read_stats;
use super::staging::{SUPPORT, Staged, Staging, grow_host, owned_out};
use super::verifier::GpuVerifier;
use super::view::{Memory, ViewMut};
use crate::gpu::kernels;
use crate::verify::tree::{DeviceTreeOutputs, TreeBatch, TreeOutputs, validate_tree_with};
use crate::verify::{Check, Method, Param};
use core::marker::PhantomData;

/// A captured tree launch, replayable with new trees in the same buffers. It borrows the
/// buffers of the [`TreeArgs`] it was captured on for `'a`, so none can be freed or reallocated
/// while it exists. Replay it only on the verifier that captured it.
#[derive(Debug)]
pub struct TreeGraph<'a, D: Driver> {
    graph: D::Graph,
    capacity: u32,
    _buffers: PhantomData<&'a D::Buffer>,
}

impl<D: Driver> TreeGraph<'_, D> {
    /// The capacity (blocks) it launches.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// The caller's device tree outputs as views of the verifier's driver (see
/// [`TreeOutputs::on_device`]).
pub struct TreeOutViews<'d, D: Memory> {
    pub(in crate::gpu) accepted: ViewMut<'d, D, u32>,
    pub(in crate::gpu) path: ViewMut<'d, D, u32>,
    pub(in crate::gpu) tokens: ViewMut<'d, D, u32>,
}

impl<'d, D: Driver> TreeOutViews<'d, D> {
    /// `out` as views of `drv`'s memory: [`GpuError::ForeignMemory`] for another driver's or
    /// device's buffer.
    fn of(drv: &D, out: &'d mut DeviceTreeOutputs<'_>) -> Result<Self, GpuError<D::Error>> {
        Ok(Self {
            accepted: owned_out(drv, &mut out.accepted, Param::Accepted)?,
            path: owned_out(drv, &mut out.path, Param::Path)?,
            tokens: owned_out(drv, &mut out.tokens, Param::Tokens)?,
        })
    }
}

fn enqueue<D: Driver>(
    drv: &D,
    stream: &D::Stream,
    stats: &D::Buffer,
    args: &TreeArgs<'_, D>,
) -> Result<(), GpuError<D::Error>> {
    let launch = TreeLaunch {
        grid: args.capacity.max(1),
        block: drv.block_threads(),
        args,
        stats,
    };
    drv.launch_tree(stream, &launch).map_err(GpuError::Driver)
}

impl<D: Driver, const K: usize> GpuVerifier<D, K> {
    /// Set-up for the tree paths: validates `batch` like the reference ([`validate_tree_with`]
    /// with [`SUPPORT`], with `out`, the host outputs its results will be copied to), makes the
    /// tree entry ready ([`Driver::prepare_tree`]: a run-time compiled driver compiles it
    /// here, not on the step path) and grows `staging` for it. Then [`Staging::write`] enqueues
    /// the copies and gives the views for [`launch_tree_staged`](GpuVerifier::launch_tree_staged)
    /// or [`capture_tree_staged`](GpuVerifier::capture_tree_staged).
    pub fn stage_tree(
        &mut self,
        staging: &mut Staging<D, TreeStep>,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &TreeOutputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        check_tree::<K, D::Error>(method, check, batch, out)?;
        self.driver().prepare_tree().map_err(GpuError::Driver)?;
        staging.reserve(&self.drv_ref(), batch, ())
    }

    /// The step path for trees: enqueues one launch of the tree entry (one block per request
    /// of `args.capacity`) on the compute stream and returns; no synchronising call. Malformed
    /// trees are skipped by the kernel and flagged in the error word.
    ///
    /// The views' lengths are checked against `args.capacity` and the shape words' count.
    ///
    /// # Safety
    /// The shape words in device memory (read by the kernel when it runs) must describe
    /// extents within the views: `batch ≤ capacity` node counts, `batch · N` tokens and links,
    /// `batch · N` rows × strides of the probability views, `batch · (max_depth + 1)` path and
    /// token slots. Views written by [`Staging::write`] meet this.
    pub unsafe fn launch_tree(&self, args: &TreeArgs<'_, D>) -> Result<(), GpuError<D::Error>> {
        if !args.views_fit() {
            return Err(GpuError::ViewTooShort);
        }
        enqueue(self.driver(), self.stream(), self.stats(), args)
    }

    /// [`launch_tree`](GpuVerifier::launch_tree) on views [`Staging::write`] returned,
    /// whose shape words it wrote to describe exactly those views.
    ///
    /// # Safety
    /// Nothing but [`Staging::write`] has written the staging buffers since.
    pub unsafe fn launch_tree_staged(
        &self,
        args: &Staged<TreeArgs<'_, D>>,
    ) -> Result<(), GpuError<D::Error>> {
        // SAFETY: staged views hold exactly the checked batch the shape words describe (the
        // caller vouches that nothing else wrote them).
        unsafe { self.launch_tree(args) }
    }

    /// Captures one tree launch on `args` as a graph (no work runs; the tree entry is made
    /// ready first, [`Driver::prepare_tree`]). Set-up; a replay is one driver call on the
    /// step path.
    ///
    /// # Safety
    /// As for [`launch_tree`](GpuVerifier::launch_tree), at every replay.
    pub unsafe fn capture_tree<'a>(
        &self,
        args: &TreeArgs<'a, D>,
    ) -> Result<TreeGraph<'a, D>, GpuError<D::Error>> {
        if !args.views_fit() {
            return Err(GpuError::ViewTooShort);
        }
        let (drv, stream) = (self.driver(), self.stream());
        // Compile / load the tree module now, not while the stream is capturing.
        drv.prepare_tree().map_err(GpuError::Driver)?;
        drv.begin_capture(stream).map_err(GpuError::Driver)?;
        let launched = enqueue(drv, stream, self.stats(), args);
        // End the capture even when the launch failed, so the stream is usable again.
        let graph = drv.end_capture(stream).map_err(GpuError::Driver);
        launched?;
        Ok(TreeGraph {
            graph: graph?,
            capacity: args.capacity,
            _buffers: PhantomData,
        })
    }

    /// [`capture_tree`](GpuVerifier::capture_tree) on views [`Staging::write`] returned.
    /// Replays stay in bounds while later batches are written into the same staging by
    /// [`Staging::write`] (which only writes consistent shape words, and cannot grow the
    /// buffers while the graph borrows them).
    ///
    /// # Safety
    /// As [`launch_tree_staged`](GpuVerifier::launch_tree_staged), at every replay.
    pub unsafe fn capture_tree_staged<'a>(
        &self,
        args: &Staged<TreeArgs<'a, D>>,
    ) -> Result<TreeGraph<'a, D>, GpuError<D::Error>> {
        // SAFETY: as for `launch_tree_staged`, vouched for by the caller.
        unsafe { self.capture_tree(args) }
    }

    /// Enqueues one replay of `graph` on the compute stream (the step path: no synchronising
    /// call).
    pub fn replay_tree(&self, graph: &TreeGraph<'_, D>) -> Result<(), GpuError<D::Error>> {
        self.driver()
            .replay(&graph.graph, self.stream())
            .map_err(GpuError::Driver)
    }

    /// Copies the tree outputs of the work enqueued so far to `accepted`, `path` and `tokens`
    /// and waits (one synchronising call). Not the step path. Returns the error-flag word.
    pub fn download_tree_outputs(
        &mut self,
        args: &TreeArgs<'_, D>,
        accepted: &mut [u32],
        path: &mut [u32],
        tokens: &mut [u32],
    ) -> Result<u64, GpuError<D::Error>> {
        if accepted.len() > args.accepted.len()
            || path.len() > args.path.len()
            || tokens.len() > args.tokens.len()
        {
            return Err(GpuError::ViewTooShort);
        }
        let (a_bytes, p_bytes, t_bytes) = (accepted.len() * 4, path.len() * 4, tokens.len() * 4);
        let s_bytes = kernels::stats_words(K) * 8;
        let total = s_bytes
            .checked_add(a_bytes)
            .and_then(|x| x.checked_add(p_bytes))
            .and_then(|x| x.checked_add(t_bytes))
            .ok_or(GpuError::TooLarge)?;
        let drv = self.drv_ref();
        grow_host(&drv, &mut self.host, total)?;
        let Some((host, _)) = self.host.as_ref() else {
            return Err(GpuError::TooLarge);
        };
        let (s, stats) = (self.stream(), self.stats());
        // Stats words first (8-aligned), then accepted, path, tokens.
        let p_at = s_bytes + a_bytes;
        let t_at = p_at + p_bytes;
        let down = |at: usize, view: &super::ViewMut<'_, D, u32>, bytes: usize| {
            drv.download(s, host, at, view.buffer(), view.byte_offset(), bytes)
                .map_err(GpuError::Driver)
        };
        drv.download(s, host, 0, stats, 0, s_bytes)
            .map_err(GpuError::Driver)?;
        down(s_bytes, &args.accepted, a_bytes)?;
        down(p_at, &args.path, p_bytes)?;
        down(t_at, &args.tokens, t_bytes)?;
        drv.record(&self.done, s).map_err(GpuError::Driver)?;
        self.syncs += 1;
        drv.sync_event(&self.done).map_err(GpuError::Driver)?;
        // SAFETY: the event recorded after every download into `host` has been waited on.
        unsafe {
            drv.read_host(host, s_bytes, accepted);
            drv.read_host(host, p_at, path);
            drv.read_host(host, t_at, tokens);
        }
        // SAFETY: as above.
        let (_, flags) = unsafe { read_stats::<D, K>(&drv, host) };
        Ok(flags)
    }

    /// The tree path of [`Verifier::verify_tree`](crate::verify::Verifier::verify_tree): host
    /// slices, or outputs on the device.
    pub(super) fn verify_tree_host(
        &mut self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        check_tree::<K, D::Error>(method, check, batch, out)?;
        let mut staging = core::mem::take(&mut self.trees);
        let result = self.verify_tree_staged(&mut staging, method, batch, out);
        self.trees = staging;
        result
    }

    fn verify_tree_staged(
        &mut self,
        staging: &mut Staging<D, TreeStep>,
        method: Method,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), GpuError<D::Error>> {
        let drv = self.drv_ref();
        let (accepted, path, tokens) = match out {
            TreeOutputs::Device { outputs } => {
                // The caller's device memory is checked before anything is allocated or
                // enqueued (the rows by `reserve`, the outputs here), once: the views are the
                // launch's.
                let views = TreeOutViews::of(&drv, outputs)?;
                staging.reserve(&drv, batch, ())?;
                // Device rows are read in place: the views borrow them only for this call.
                // Outputs on the device: the launch writes them in place; no copy down, no
                // wait. The kernel's error flags stay in the counters buffer: a validated
                // batch raises none (every input they flag is checked on the host first).
                let stream = self.stream();
                let args =
                    staging.write_in_place::<K>(&drv, stream, method, batch, Some(views), ())?;
                // SAFETY: written just above by `write_in_place`, whose shape words describe
                // exactly these views (the device outputs checked against the batch by
                // validation); nothing else touches this verifier's staging.
                return unsafe { self.launch_tree_staged(&args) };
            }
            TreeOutputs::Host {
                accepted,
                path,
                tokens,
            } => (accepted, path, tokens),
        };
        staging.reserve(&drv, batch, ())?;
        let args = staging.write_in_place::<K>(&drv, self.stream(), method, batch, None, ())?;
        // SAFETY: written just above by `write_in_place`; nothing else touches this verifier's
        // staging.
        unsafe { self.launch_tree_staged(&args)? };
        let flags = self.download_tree_outputs(&args, accepted, path, tokens)?;
        if flags != self.flags_seen {
            self.flags_seen = flags;
            return Err(GpuError::DeviceFlags(flags));
        }
        Ok(())
    }

    /// A handle of the driver (drivers are cheap shared handles), so `self` can be borrowed
    /// mutably beside it.
    fn drv_ref(&self) -> D {
        self.driver().clone()
    }
}

/// The reference's validation, with what the tree entry reads ([`SUPPORT`]: binary32, bf16 or
/// f16 rows, in host or device memory).
fn check_tree<const K: usize, E>(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), GpuError<E>> {
    validate_tree_with::<K>(SUPPORT, method, check, batch, out).map_err(GpuError::Verify)
}
