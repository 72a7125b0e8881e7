//! [`CudaVerifier`]: the kernel over device-resident buffers (the step path) and, for
//! convenience and the conformance suite, over host slices.

use crate::calls::{Blocking, call};
use crate::device::{CudaDevice, DeviceBuffer};
use crate::error::CudaError;
use crate::readback::CudaReadback;
use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;
use specula_core::Counters;
use specula_core::kernels;
use specula_core::verify::{
    Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Method, Outputs, Verifier, validate,
};
use std::ffi::c_void;
use std::sync::Arc;

/// Device pointers of one verification step, laid out as `core/DETERMINISM.md` says, all in
/// the verifier's context. The values behind them (shape words, `k`, seeds, offsets, ...) are
/// read by the kernel at run time, so a captured CUDA graph replays with new values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceArgs {
    /// Blocks launched: the largest batch these buffers hold (`≥ shape[SHAPE_BATCH]`).
    pub capacity: u32,
    /// [`kernels::SHAPE_WORDS`] `u32` shape words ([`kernels::shape_words`]); the
    /// `SHAPE_COUNTERS_K` word must be `K`.
    pub shape: CUdeviceptr,
    /// `k[b]` (`u32`).
    pub k: CUdeviceptr,
    /// Draft ids (`u32`).
    pub draft_ids: CUdeviceptr,
    /// Draft probabilities (`f32`), or 0 with a one-hot drafter.
    pub draft_probs: CUdeviceptr,
    /// Target probabilities (`f32`).
    pub target_probs: CUdeviceptr,
    /// Seeds (`u64`).
    pub seed: CUdeviceptr,
    /// Offsets (`u64`).
    pub offset: CUdeviceptr,
    /// Typical acceptance `ε` (`f32`); 0 when not typical acceptance.
    pub eps: CUdeviceptr,
    /// Typical acceptance `δ` (`f32`); 0 when not typical acceptance.
    pub delta: CUdeviceptr,
    /// Output: accepted counts (`u32`).
    pub accepted: CUdeviceptr,
    /// Output: tokens (`u32`).
    pub tokens: CUdeviceptr,
}

const SLOTS: usize = 11;

/// The most blocks one request's rows are split over.
const MAX_SLICES: u32 = 64;

/// The verification kernel with its device counters (`Counters<K>` plus an error word).
#[derive(Debug)]
pub struct CudaVerifier<const K: usize> {
    dev: Arc<CudaDevice>,
    stats: Arc<DeviceBuffer>,
    /// Scratch of the split entry (`kernels::VERIFY_SPLIT_ENTRY`) and the capacity it is sized
    /// for; shared with captured graphs so it outlives them.
    split: Option<(Arc<DeviceBuffer>, u32)>,
    /// Device buffers of the host-slice convenience path, grown on demand.
    staging: [Option<DeviceBuffer>; SLOTS],
    flags_seen: u64,
}

impl<const K: usize> CudaVerifier<K> {
    /// A verifier on `dev` with zeroed device counters.
    pub fn new(dev: Arc<CudaDevice>) -> Result<Self, CudaError> {
        let stats = DeviceBuffer::zeroed(dev.context(), kernels::stats_words(K) * 8)?;
        Ok(Self {
            dev,
            stats: Arc::new(stats),
            split: None,
            staging: Default::default(),
            flags_seen: 0,
        })
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// The counters buffer, shared with readbacks and captured graphs so it outlives them.
    pub(crate) fn stats_buffer(&self) -> Arc<DeviceBuffer> {
        self.stats.clone()
    }

    /// The split entry's scratch, when one is reserved (graphs keep it alive).
    pub(crate) fn split_buffer(&self) -> Option<Arc<DeviceBuffer>> {
        self.split.as_ref().map(|(b, _)| b.clone())
    }

    /// Blocks per request a launch of `capacity` requests uses: below one request per
    /// multiprocessor, the rows of each request are split over
    /// `min(⌈2 · SMs / capacity⌉, 64)` blocks (`kernels::VERIFY_SPLIT_ENTRY`), when scratch for
    /// that capacity is reserved ([`reserve_split`](CudaVerifier::reserve_split)); otherwise 1.
    #[must_use]
    pub fn slices_for(&self, capacity: u32) -> u32 {
        let sms = self.dev.multiprocessors();
        let reserved = self.split.as_ref().is_some_and(|(_, c)| *c >= capacity);
        if capacity == 0 || capacity >= sms || !reserved {
            return 1;
        }
        (2 * sms).div_ceil(capacity).clamp(1, MAX_SLICES)
    }

    /// Allocates (zeroed) the scratch the split entry needs for launches of up to `capacity`
    /// requests, so that [`launch`](CudaVerifier::launch) can spread small batches over the GPU
    /// without allocating on the step path. Set-up, blocking; [`stage`](CudaVerifier::stage)
    /// calls it. Without it every launch uses one block per request.
    pub fn reserve_split(&mut self, capacity: u32) -> Result<(), CudaError> {
        if self.split.as_ref().is_some_and(|(_, c)| *c >= capacity) {
            return Ok(());
        }
        let sms = self.dev.multiprocessors();
        if capacity == 0 || capacity >= sms {
            return Ok(());
        }
        // Every capacity up to this one launches with its own slice count (more slices for
        // fewer requests), so the scratch is sized for the largest need among them, not just
        // this capacity's (which overflowed it for, say, 3 requests after reserving 4 on 16 SMs).
        // k_max <= K always (the kernel refuses a larger shape), so K sizes every launch.
        let bytes = specula_core::gpu::split_scratch_bytes::<K>(sms, capacity)
            .ok_or(CudaError::TooLarge)?;
        let buf = DeviceBuffer::zeroed(self.dev.context(), bytes)?;
        self.split = Some((Arc::new(buf), capacity));
        Ok(())
    }

    /// The device `stats` buffer: [`kernels::stats_words`]`(K)` `u64` words.
    #[must_use]
    pub fn stats_ptr(&self) -> CUdeviceptr {
        self.stats.ptr
    }

    /// A readback of this verifier's counters, ordered on its compute stream.
    pub fn readback(&self) -> Result<CudaReadback<K>, CudaError> {
        CudaReadback::new(self.dev.clone(), self.stats.clone())
    }

    /// The decode-step path: enqueues one kernel launch on the compute stream and returns.
    /// Exactly two driver calls (make the context current, launch), neither synchronising; the
    /// counters are updated by the same kernel. Bad requests are skipped by the kernel and
    /// flagged in the error word (see [`CudaReadback::error_flags`]). Below one request per
    /// multiprocessor, with scratch reserved for the capacity, each request's rows are split
    /// over [`slices_for`](CudaVerifier::slices_for) blocks (same results, bit for bit).
    ///
    /// # Safety
    /// Every pointer in `args` must be device memory of this context, valid for the extent the
    /// shape words imply and not freed before the kernel has run.
    pub unsafe fn launch(&mut self, args: &DeviceArgs) -> Result<(), CudaError> {
        self.dev.bind()?;
        let slices = self.slices_for(args.capacity);
        let scratch = self.split.as_ref().map_or(0, |(b, _)| b.ptr);
        let mut values: [u64; 13] = [
            args.shape,
            args.k,
            args.draft_ids,
            args.draft_probs,
            args.target_probs,
            args.seed,
            args.offset,
            args.eps,
            args.delta,
            args.accepted,
            args.tokens,
            self.stats.ptr,
            scratch,
        ];
        let mut slices_param = slices;
        let mut params: [*mut c_void; 14] = [core::ptr::null_mut(); 14];
        for (p, v) in params.iter_mut().zip(values.iter_mut()) {
            *p = core::ptr::from_mut(v).cast();
        }
        params[13] = core::ptr::from_mut(&mut slices_param).cast();
        let stream = self.dev.cu_stream();
        let (f, n) = if slices > 1 {
            (self.dev.cu_split_function(), 14)
        } else {
            (self.dev.cu_function(), 12)
        };
        let grid = args.capacity.max(1).saturating_mul(slices);
        // SAFETY: `f` is the loaded `specula_verify` (12 pointer parameters) or
        // `specula_verify_split` (those, the scratch pointer and a u32), passed in that order;
        // the scratch holds split_scratch_words(K, slices) words per request of the capacity
        // (slices > 1 only when reserved for it); the caller vouches for the other buffers.
        call("cuLaunchKernel", Blocking::No, || unsafe {
            result::launch_kernel(
                f,
                (grid, 1, 1),
                (kernels::BLOCK_THREADS, 1, 1),
                0,
                stream,
                &mut params[..n],
            )
        })
    }

    /// Validates `batch` like the reference (outputs sized for it are assumed) and copies it into
    /// this verifier's own device buffers (grown when too small), returning the [`DeviceArgs`]
    /// that [`launch`](CudaVerifier::launch) takes. Blocking: this is set-up, not the step path.
    /// The buffers stay valid until the next `stage` or `verify`, and those reuse them while
    /// they are large enough: a batch that needs no more bytes in any buffer than an earlier one
    /// gets the same pointers (only `capacity` differs, and `draft_probs` is 0 without draft
    /// probabilities). So a [`VerifyGraph`](crate::VerifyGraph) captured on the largest batch
    /// replays later, smaller batches staged this way.
    pub fn stage(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
    ) -> Result<DeviceArgs, CudaError> {
        let b = batch.requests();
        let width = batch.k_max.checked_add(1).ok_or(CudaError::TooLarge)?;
        let tokens_len = b.checked_mul(width).ok_or(CudaError::TooLarge)?;
        let (mut acc, mut tok) = (vec![0u32; b], vec![0u32; tokens_len]);
        let out = Outputs {
            accepted: &mut acc,
            tokens: &mut tok,
        };
        validate::<K>(method, check, batch, &out)?;
        self.stage_validated(method, batch)
    }

    /// [`stage`](CudaVerifier::stage) for a batch that passed `validate`.
    fn stage_validated(
        &mut self,
        method: Method,
        batch: &Batch<'_>,
    ) -> Result<DeviceArgs, CudaError> {
        let b = batch.requests();
        let tokens_len = b * (batch.k_max + 1);
        let shape = kernels::batch_shape::<K>(method, batch).map_err(|_| CudaError::TooLarge)?;
        let eps = batch
            .eps
            .map_or_else(|| vec![DEFAULT_EPS; b], <[f32]>::to_vec);
        let delta = batch
            .delta
            .map_or_else(|| vec![DEFAULT_DELTA; b], <[f32]>::to_vec);
        self.dev.bind()?;
        self.reserve_split(to_u32(b)?)?;
        Ok(DeviceArgs {
            capacity: to_u32(b)?,
            shape: self.upload(0, &shape)?,
            k: self.upload(1, batch.k)?,
            draft_ids: self.upload(2, batch.draft_ids)?,
            draft_probs: match batch.draft_probs {
                Some(d) => self.upload(3, d)?,
                None => 0,
            },
            target_probs: self.upload(4, batch.target_probs)?,
            seed: self.upload(5, batch.seed)?,
            offset: self.upload(6, batch.offset)?,
            eps: self.upload(7, &eps)?,
            delta: self.upload(8, &delta)?,
            accepted: self.buffer(9, b * 4)?,
            tokens: self.buffer(10, tokens_len * 4)?,
        })
    }

    /// Copies `accepted` and `tokens` of the last launch on `args` to the host (waits).
    pub fn download_outputs(
        &mut self,
        args: &DeviceArgs,
        accepted: &mut [u32],
        tokens: &mut [u32],
    ) -> Result<(), CudaError> {
        self.dev.bind()?;
        self.download(accepted, args.accepted)?;
        self.download(tokens, args.tokens)
    }

    fn buffer(&mut self, slot: usize, bytes: usize) -> Result<CUdeviceptr, CudaError> {
        let fits = self.staging[slot]
            .as_ref()
            .is_some_and(|b| b.bytes >= bytes);
        if !fits {
            self.staging[slot] = None; // free before allocating the larger one
            self.staging[slot] = Some(DeviceBuffer::zeroed(self.dev.context(), bytes)?);
        }
        Ok(self.staging[slot].as_ref().map_or(0, |b| b.ptr))
    }

    fn upload<T>(&mut self, slot: usize, data: &[T]) -> Result<CUdeviceptr, CudaError> {
        let ptr = self.buffer(slot, core::mem::size_of_val(data))?;
        let stream = self.dev.cu_stream();
        // SAFETY: `ptr` holds at least `size_of_val(data)` bytes; the copy is ordered on the
        // compute stream before the launch that reads it. A pageable source makes the call
        // return only once the data is staged, so `data` may go away afterwards.
        call("cuMemcpyHtoDAsync", Blocking::Yes, || unsafe {
            result::memcpy_htod_async(ptr, data, stream)
        })?;
        Ok(ptr)
    }

    fn download<T>(&self, dst: &mut [T], src: CUdeviceptr) -> Result<(), CudaError> {
        let stream = self.dev.cu_stream();
        // SAFETY: `src` holds at least `size_of_val(dst)` bytes; the stream is synchronised
        // right after, before `dst` is read.
        call("cuMemcpyDtoHAsync", Blocking::Yes, || unsafe {
            result::memcpy_dtoh_async(dst, src, stream)
        })?;
        self.sync()
    }

    fn sync(&self) -> Result<(), CudaError> {
        let stream = self.dev.cu_stream();
        // SAFETY: a live stream of the current context.
        call("cuStreamSynchronize", Blocking::Yes, || unsafe {
            result::stream::synchronize(stream)
        })
    }

    /// The error-flag word as the device holds it now (waits for the compute stream).
    pub fn error_flags(&mut self) -> Result<u64, CudaError> {
        self.dev.bind()?;
        let mut w = [0u64];
        self.download(&mut w, self.stats.ptr + kernels::error_word(K) as u64 * 8)?;
        Ok(w[0])
    }
}

fn to_u32(x: usize) -> Result<u32, CudaError> {
    u32::try_from(x).map_err(|_| CudaError::TooLarge)
}

impl<const K: usize> Verifier<K> for CudaVerifier<K> {
    type Error = CudaError;

    /// Host-slice convenience: [`stage`](CudaVerifier::stage), launch, copy down, wait.
    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), CudaError> {
        validate::<K>(method, check, batch, out)?;
        let args = self.stage_validated(method, batch)?;
        let b = batch.requests();
        // SAFETY: every buffer was sized from the validated batch just above.
        unsafe { self.launch(&args)? };
        let mut accepted = vec![0u32; b];
        let mut tokens = vec![0u32; out.tokens.len()];
        self.download(&mut accepted, args.accepted)?;
        self.download(&mut tokens, args.tokens)?;
        let flags = self.error_flags()?;
        if flags != self.flags_seen {
            self.flags_seen = flags;
            return Err(CudaError::DeviceFlags(flags));
        }
        out.accepted.copy_from_slice(&accepted);
        out.tokens.copy_from_slice(&tokens);
        Ok(())
    }

    fn totals(&mut self) -> Result<Counters<K>, CudaError> {
        self.dev.bind()?;
        let mut words = vec![0u64; kernels::stats_words(K)];
        self.download(&mut words, self.stats.ptr)?;
        kernels::counters_from_stats(&words).ok_or(CudaError::TooLarge)
    }
}
