//! [`RocmVerifier`]: the shared verifier of `specula_core::gpu` ([`GpuVerifier`]) over the HIP
//! driver glue ([`RocmDriver`]), with the fused device counters on its compute stream.
//!
//! Staging, the split entry's scratch, launch, graph capture and replay and the host-slice path
//! are written once in `specula_core::gpu` (and run end to end in CI over the host driver of
//! `specula-tests`); this type ties them to a device and gives ROCm's error type and
//! [`RocmReadback`].

use crate::device::RocmDevice;
use crate::driver::RocmDriver;
use crate::error::RocmError;
use crate::readback::{DeviceCounters, RocmReadback};
use specula_core::Counters;
use specula_core::gpu::{GpuVerifier, Staged, TreeArgs, TreeGraph, VerifyArgs, VerifyGraph};
use specula_core::verify::tree::{TreeBatch, TreeOutputs};
use specula_core::verify::{Batch, Check, Method, Outputs, Support, Verifier};
use std::sync::Arc;

/// The verification kernel on one ROCm device, implementing [`Verifier`].
///
/// Counters live in device memory and are updated by the kernel in the same launch that
/// verifies (64-bit atomics); [`readback`](Self::readback) gives the asynchronous
/// [`RocmReadback`] of them. Work is enqueued on one compute stream. The step path is
/// [`launch`](Self::launch) on typed views ([`VerifyArgs`] over [`RocmDriver`]) or a graph
/// [`replay`](Self::replay): neither makes a synchronising call. [`Verifier::verify`] on host
/// slices waits for its outputs.
pub struct RocmVerifier<const K: usize> {
    device: RocmDevice,
    inner: GpuVerifier<RocmDriver, K>,
    stats: Arc<DeviceCounters<K>>,
}

impl<const K: usize> core::fmt::Debug for RocmVerifier<K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocmVerifier")
            .field("k", &K)
            .field("device", &self.device)
            .finish()
    }
}

impl<const K: usize> RocmVerifier<K> {
    /// A verifier on device `ordinal`: loads the runtime, opens the device, compiles the kernel
    /// for its architecture with hiprtc (once per device and process) and allocates zeroed
    /// counters.
    ///
    /// # Errors
    /// [`RocmError::NoRuntime`] without ROCm, [`RocmError::NoDevice`] without a ROCm device,
    /// [`RocmError::NoHiprtc`] / [`RocmError::Hiprtc`] when the kernel cannot be compiled,
    /// [`RocmError::Hip`] for any other runtime failure.
    pub fn new(ordinal: usize) -> Result<Self, RocmError> {
        Self::on(&RocmDevice::new(ordinal)?)
    }

    /// A verifier on an already opened device, with its own compute stream.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn on(device: &RocmDevice) -> Result<Self, RocmError> {
        let drv = RocmDriver::with_kernel(device)?;
        let inner = GpuVerifier::new(drv)?;
        let stats = Arc::new(DeviceCounters::from_parts(
            inner.stats().clone(),
            inner.stream().clone(),
            device.clone(),
        ));
        Ok(Self {
            device: device.clone(),
            inner,
            stats,
        })
    }

    /// The device.
    pub fn device(&self) -> &RocmDevice {
        &self.device
    }

    /// The device counters (shared with readbacks).
    pub fn counters(&self) -> &Arc<DeviceCounters<K>> {
        &self.stats
    }

    /// The driver glue (with the kernel), for
    /// [`Staging::write`](specula_core::gpu::Staging::write) and [`RocmDriver::fill_words`].
    #[must_use]
    pub fn driver(&self) -> &RocmDriver {
        self.inner.driver()
    }

    /// The shared verifier this is (its stream, counters buffer and synchronising-call count).
    #[must_use]
    pub fn gpu(&self) -> &GpuVerifier<RocmDriver, K> {
        &self.inner
    }

    /// The shared verifier this is, mutably (for its set-up calls, such as
    /// [`GpuVerifier::stage`]).
    pub fn gpu_mut(&mut self) -> &mut GpuVerifier<RocmDriver, K> {
        &mut self.inner
    }

    /// Blocks per request a launch of `capacity` requests uses: below 128 requests (with the
    /// split scratch reserved) `min(⌈256 / capacity⌉, 64)`, else 1.
    #[must_use]
    pub fn slices_for(&self, capacity: u32) -> u32 {
        self.inner.slices_for(capacity)
    }

    /// Allocates the split entry's scratch for launches of up to `capacity` requests (set-up;
    /// see [`GpuVerifier::reserve_split`]).
    ///
    /// # Errors
    /// [`RocmError::Hip`] when allocation fails, [`RocmError::TooLarge`] on overflow.
    pub fn reserve_split(&mut self, capacity: u32) -> Result<(), RocmError> {
        Ok(self.inner.reserve_split(capacity)?)
    }

    /// A new asynchronous readback of this verifier's counters.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when creating its streams, events or buffers fails.
    pub fn readback(&self) -> Result<RocmReadback<K>, RocmError> {
        RocmReadback::new(Arc::clone(&self.stats))
    }

    /// The step path: enqueues one kernel launch on the compute stream and returns, with no
    /// synchronising call (see [`GpuVerifier::launch`]). Bad requests are skipped by the
    /// kernel and flagged in the error word.
    ///
    /// # Safety
    /// As for [`GpuVerifier::launch`]: the shape words in device memory must describe extents
    /// within the views.
    ///
    /// # Errors
    /// [`RocmError::ViewTooShort`] for views shorter than the capacity, [`RocmError::Hip`] when
    /// the launch fails.
    pub unsafe fn launch(&self, args: &VerifyArgs<'_, RocmDriver>) -> Result<(), RocmError> {
        // SAFETY: the caller's contract is the one of the shared launch.
        Ok(unsafe { self.inner.launch(args) }?)
    }

    /// Captures one launch on `args` in a HIP graph on the compute stream (set-up; see
    /// [`GpuVerifier::capture`]). The graph borrows the views' buffers for its lifetime.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch), at every replay.
    ///
    /// # Errors
    /// [`RocmError::Unsupported`] when the runtime lacks HIP graph capture,
    /// [`RocmError::Hip`] when capture or instantiation fails.
    pub unsafe fn capture<'a>(
        &self,
        args: &VerifyArgs<'a, RocmDriver>,
    ) -> Result<VerifyGraph<'a, RocmDriver>, RocmError> {
        // SAFETY: the caller's contract is the one of the shared capture.
        Ok(unsafe { self.inner.capture(args) }?)
    }

    /// The step path with a graph: one `hipGraphLaunch` on the compute stream, never
    /// synchronising.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when the launch fails.
    pub fn replay(&self, graph: &VerifyGraph<'_, RocmDriver>) -> Result<(), RocmError> {
        Ok(self.inner.replay(graph)?)
    }

    /// [`replay`](Self::replay) for a batch [`Staging::write`](specula_core::gpu::Staging::write)
    /// wrote into the staging the graph was captured on, refused with
    /// [`RocmError::GraphMismatch`] (nothing enqueued) when its optional inputs (ragged layout, bonus
    /// tokens, logits, draft probabilities) or its size do not match the graph's (see
    /// [`GpuVerifier::replay_staged`]).
    pub fn replay_staged(
        &self,
        graph: &VerifyGraph<'_, RocmDriver>,
        staged: &Staged<'_, RocmDriver>,
    ) -> Result<(), RocmError> {
        Ok(self.inner.replay_staged(graph, staged)?)
    }

    /// Copies `accepted` and `tokens` of the work enqueued so far on `args` to the host and
    /// waits (one synchronising call; not the step path). Returns the error-flag word.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when a copy or the wait fails.
    pub fn download_outputs(
        &mut self,
        args: &VerifyArgs<'_, RocmDriver>,
        accepted: &mut [u32],
        tokens: &mut [u32],
    ) -> Result<u64, RocmError> {
        Ok(self.inner.download_outputs(args, accepted, tokens)?)
    }
}

/// Token trees (`core/DETERMINISM.md`, "Token trees"): the tree entry of the kernel text,
/// compiled with hiprtc and loaded on first tree use (a runtime that verifies chains
/// alone never compiles it), counted in the same device counters as chains.
impl<const K: usize> RocmVerifier<K> {
    /// Verifies a batch of token trees from host slices, as the CPU backend's `verify_tree`
    /// (bit-identical to `verify_tree_batch`; see [`GpuVerifier::verify_tree`]).
    ///
    /// # Errors
    /// [`RocmError::Tree`] with the reference's validation error (nothing launched or counted
    /// then), [`RocmError::NoHiprtc`] / [`RocmError::Hiprtc`] when the tree module cannot be compiled,
    /// [`RocmError::Hip`] for a runtime failure or new kernel error flags.
    pub fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), RocmError> {
        Ok(self.inner.verify_tree(method, check, batch, out)?)
    }

    /// The tree step path: enqueues one tree launch on the compute stream, with no
    /// synchronising call (see [`GpuVerifier::launch_tree`]).
    ///
    /// # Safety
    /// As for [`GpuVerifier::launch_tree`]: the shape words in device memory must describe
    /// extents within the views.
    ///
    /// # Errors
    /// [`RocmError::ViewTooShort`] for views shorter than the capacity, [`RocmError::Hip`] when
    /// the launch fails, the compile errors on first tree use.
    pub unsafe fn launch_tree(&self, args: &TreeArgs<'_, RocmDriver>) -> Result<(), RocmError> {
        // SAFETY: the caller's contract is the one of the shared tree launch.
        Ok(unsafe { self.inner.launch_tree(args) }?)
    }

    /// Captures one tree launch on `args` in a HIP graph (set-up; see
    /// [`GpuVerifier::capture_tree`]).
    ///
    /// # Safety
    /// As for [`launch_tree`](Self::launch_tree), at every replay.
    ///
    /// # Errors
    /// As [`capture`](Self::capture).
    pub unsafe fn capture_tree<'a>(
        &self,
        args: &TreeArgs<'a, RocmDriver>,
    ) -> Result<TreeGraph<'a, RocmDriver>, RocmError> {
        // SAFETY: the caller's contract is the one of the shared capture.
        Ok(unsafe { self.inner.capture_tree(args) }?)
    }

    /// Replays a captured tree launch: one `hipGraphLaunch`, never synchronising.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when the launch fails.
    pub fn replay_tree(&self, graph: &TreeGraph<'_, RocmDriver>) -> Result<(), RocmError> {
        Ok(self.inner.replay_tree(graph)?)
    }

    /// Copies the tree outputs of the work enqueued so far on `args` to the host and waits (one
    /// synchronising call; not the step path). Returns the error-flag word.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when a copy or the wait fails.
    pub fn download_tree_outputs(
        &mut self,
        args: &TreeArgs<'_, RocmDriver>,
        accepted: &mut [u32],
        path: &mut [u32],
        tokens: &mut [u32],
    ) -> Result<u64, RocmError> {
        Ok(self
            .inner
            .download_tree_outputs(args, accepted, path, tokens)?)
    }
}

impl<const K: usize> Verifier<K> for RocmVerifier<K> {
    type Error = RocmError;

    /// Validates the batch on the host (nothing is launched or counted on error), stages it,
    /// launches the kernel and waits for the outputs (one synchronising call).
    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), RocmError> {
        Ok(self.inner.verify(method, check, batch, out)?)
    }

    /// Reads the device counters after all work on the compute stream (one wait).
    fn totals(&mut self) -> Result<Counters<K>, RocmError> {
        Ok(self.inner.totals()?)
    }

    /// [`specula_core::gpu::SUPPORT`]: `k = 0`, the ragged layout, bonus tokens, f32 / bf16 /
    /// f16 logits with per-request temperature, bf16 / f16 draft probabilities, top-k / top-p /
    /// min-p, a method per request and recovered tokens (the kernel's `_ex` and `_logits`
    /// entries).
    fn support(&self) -> Support {
        self.inner.support()
    }
}
