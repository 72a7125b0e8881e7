//! [`CudaVerifier`]: the shared verifier of `specula_core::gpu` ([`GpuVerifier`]) over the CUDA
//! driver glue ([`CudaDriver`]), on a [`CudaDevice`]'s compute stream.
//!
//! Staging, the split entry's scratch, launch, graph capture and replay and the host-slice path
//! are written once in `specula_core::gpu` (and run end to end in CI over the host driver of
//! `specula-tests`); this type only ties them to a device and gives CUDA's error type and
//! [`CudaReadback`].

use crate::device::CudaDevice;
use crate::driver::CudaDriver;
use crate::error::CudaError;
use crate::readback::CudaReadback;
use specula_core::Counters;
use specula_core::gpu::{GpuVerifier, Staged, TreeArgs, TreeGraph, VerifyArgs, VerifyGraph};
use specula_core::verify::tree::{TreeBatch, TreeOutputs};
use specula_core::verify::{Batch, Check, Method, Outputs, Support, Verifier};
use std::sync::Arc;

/// The verification kernel with its device counters (`Counters<K>` plus an error word), on a
/// [`CudaDevice`]'s compute stream.
///
/// The step path is [`launch`](CudaVerifier::launch) on typed views ([`VerifyArgs`] over
/// [`CudaDriver`]: the verifier's own [`Staging`](specula_core::gpu::Staging) buffers, or the
/// caller's cudarc memory through [`CudaDriver::borrow`]) or a [`VerifyGraph`] replay: neither
/// makes a synchronising driver call.
#[derive(Debug)]
pub struct CudaVerifier<const K: usize> {
    dev: Arc<CudaDevice>,
    inner: GpuVerifier<CudaDriver, K>,
}

impl<const K: usize> CudaVerifier<K> {
    /// A verifier on `dev` (ordered on its compute stream) with zeroed device counters.
    pub fn new(dev: Arc<CudaDevice>) -> Result<Self, CudaError> {
        let stream = dev.stream().clone();
        let inner = GpuVerifier::with_stream(CudaDriver::new(dev.clone()), stream)?;
        Ok(Self { dev, inner })
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// The driver glue, for [`Staging::write`](specula_core::gpu::Staging::write) and
    /// [`CudaDriver::borrow`].
    #[must_use]
    pub fn driver(&self) -> &CudaDriver {
        self.inner.driver()
    }

    /// The shared verifier this is (its stream, counters buffer and synchronising-call count).
    #[must_use]
    pub fn gpu(&self) -> &GpuVerifier<CudaDriver, K> {
        &self.inner
    }

    /// The shared verifier this is, mutably (for its set-up calls, such as
    /// [`GpuVerifier::stage`]).
    pub fn gpu_mut(&mut self) -> &mut GpuVerifier<CudaDriver, K> {
        &mut self.inner
    }

    /// Blocks per request a launch of `capacity` requests uses (see
    /// [`GpuVerifier::slices_for`]).
    #[must_use]
    pub fn slices_for(&self, capacity: u32) -> u32 {
        self.inner.slices_for(capacity)
    }

    /// Allocates the split entry's scratch for launches of up to `capacity` requests (set-up;
    /// see [`GpuVerifier::reserve_split`]).
    pub fn reserve_split(&mut self, capacity: u32) -> Result<(), CudaError> {
        Ok(self.inner.reserve_split(capacity)?)
    }

    /// A readback of this verifier's counters, ordered on its compute stream.
    pub fn readback(&self) -> Result<CudaReadback<K>, CudaError> {
        CudaReadback::new(self.dev.clone(), self.inner.stats().clone())
    }

    /// The decode-step path: enqueues one kernel launch on the compute stream and returns, with
    /// no synchronising call (see [`GpuVerifier::launch`]).
    ///
    /// # Safety
    /// As for [`GpuVerifier::launch`]: the shape words in device memory must describe extents
    /// within the views.
    pub unsafe fn launch(&self, args: &VerifyArgs<'_, CudaDriver>) -> Result<(), CudaError> {
        // SAFETY: the caller's contract is the one of the shared launch.
        Ok(unsafe { self.inner.launch(args) }?)
    }

    /// Captures one launch on `args` in a CUDA graph on the compute stream (set-up; see
    /// [`GpuVerifier::capture`]). The graph borrows the views' buffers for its lifetime.
    ///
    /// # Safety
    /// As for [`launch`](CudaVerifier::launch), at every replay.
    pub unsafe fn capture<'a>(
        &self,
        args: &VerifyArgs<'a, CudaDriver>,
    ) -> Result<VerifyGraph<'a, CudaDriver>, CudaError> {
        // SAFETY: the caller's contract is the one of the shared capture.
        Ok(unsafe { self.inner.capture(args) }?)
    }

    /// The step path with a graph: one `cuGraphLaunch` on the compute stream, never
    /// synchronising.
    pub fn replay(&self, graph: &VerifyGraph<'_, CudaDriver>) -> Result<(), CudaError> {
        Ok(self.inner.replay(graph)?)
    }

    /// [`replay`](Self::replay) for a batch [`Staging::write`](specula_core::gpu::Staging::write)
    /// wrote into the staging the graph was captured on, refused with
    /// [`CudaError::GraphMismatch`] (nothing enqueued) when its optional inputs (ragged layout, bonus
    /// tokens, logits, draft probabilities) or its size do not match the graph's (see
    /// [`GpuVerifier::replay_staged`]).
    pub fn replay_staged(
        &self,
        graph: &VerifyGraph<'_, CudaDriver>,
        staged: &Staged<'_, CudaDriver>,
    ) -> Result<(), CudaError> {
        Ok(self.inner.replay_staged(graph, staged)?)
    }

    /// Copies `accepted` and `tokens` of the work enqueued so far on `args` to the host and
    /// waits (one synchronising call; not the step path). Returns the error-flag word.
    pub fn download_outputs(
        &mut self,
        args: &VerifyArgs<'_, CudaDriver>,
        accepted: &mut [u32],
        tokens: &mut [u32],
    ) -> Result<u64, CudaError> {
        Ok(self.inner.download_outputs(args, accepted, tokens)?)
    }
}

/// Token trees (`core/DETERMINISM.md`, "Token trees"): the tree entry of the kernel text,
/// compiled with NVRTC and loaded on first tree use (a runtime that verifies chains alone
/// never compiles it), counted in the same device counters as chains.
impl<const K: usize> CudaVerifier<K> {
    /// Verifies a batch of token trees from host slices, as the CPU backend's `verify_tree`
    /// (bit-identical to `verify_tree_batch`; see [`GpuVerifier::verify_tree`]): validation
    /// errors are [`CudaError::Tree`] (the reference's); probabilities or target logits with a
    /// temperature per request; one synchronising call.
    pub fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), CudaError> {
        Ok(self.inner.verify_tree(method, check, batch, out)?)
    }

    /// The tree step path: enqueues one tree launch on the compute stream, with no
    /// synchronising call (see [`GpuVerifier::launch_tree`]).
    ///
    /// # Safety
    /// As for [`GpuVerifier::launch_tree`]: the shape words in device memory must describe
    /// extents within the views.
    pub unsafe fn launch_tree(&self, args: &TreeArgs<'_, CudaDriver>) -> Result<(), CudaError> {
        // SAFETY: the caller's contract is the one of the shared tree launch.
        Ok(unsafe { self.inner.launch_tree(args) }?)
    }

    /// Captures one tree launch on `args` in a CUDA graph (set-up; see
    /// [`GpuVerifier::capture_tree`]).
    ///
    /// # Safety
    /// As for [`launch_tree`](CudaVerifier::launch_tree), at every replay.
    pub unsafe fn capture_tree<'a>(
        &self,
        args: &TreeArgs<'a, CudaDriver>,
    ) -> Result<TreeGraph<'a, CudaDriver>, CudaError> {
        // SAFETY: the caller's contract is the one of the shared capture.
        Ok(unsafe { self.inner.capture_tree(args) }?)
    }

    /// Replays a captured tree launch: one `cuGraphLaunch`, never synchronising.
    pub fn replay_tree(&self, graph: &TreeGraph<'_, CudaDriver>) -> Result<(), CudaError> {
        Ok(self.inner.replay_tree(graph)?)
    }

    /// Copies the tree outputs of the work enqueued so far on `args` to the host and waits (one
    /// synchronising call; not the step path). Returns the error-flag word.
    pub fn download_tree_outputs(
        &mut self,
        args: &TreeArgs<'_, CudaDriver>,
        accepted: &mut [u32],
        path: &mut [u32],
        tokens: &mut [u32],
    ) -> Result<u64, CudaError> {
        Ok(self
            .inner
            .download_tree_outputs(args, accepted, path, tokens)?)
    }
}

impl<const K: usize> Verifier<K> for CudaVerifier<K> {
    type Error = CudaError;

    /// Host-slice convenience: stage, launch, copy down, wait (one synchronising call).
    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), CudaError> {
        Ok(self.inner.verify(method, check, batch, out)?)
    }

    fn totals(&mut self) -> Result<Counters<K>, CudaError> {
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
