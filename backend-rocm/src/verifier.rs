//! [`RocmVerifier`]: the verification kernel on a ROCm device, with fused device counters.

use crate::compile::{Module, compile};
use crate::device::Device;
use crate::error::RocmError;
use crate::ffi::RawFunction;
use crate::memory::{DeviceBuffer, DeviceCopy};
use crate::readback::{DeviceCounters, RocmReadback};
use core::ffi::c_void;
use specula_core::Counters;
use specula_core::kernels::{self, BLOCK_THREADS, VERIFY_ENTRY, VERIFY_SPLIT_ENTRY};
use specula_core::verify::{
    Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Method, Outputs, Verifier, VerifyError, validate,
};
use std::sync::Arc;

/// Options the kernel text is compiled with beyond [`crate::COMPILE_OPTIONS`].
const KERNEL_OPTIONS: &[&str] = &["-DSPECULA_HIP=1"];

/// The compiled verification module of `device`, compiled once per device and process.
fn module_for(device: &Device) -> Result<Arc<Module>, RocmError> {
    device
        .inner
        .module
        .get_or_init(|| {
            let code = compile(
                kernels::SOURCE,
                "specula_verify.cu",
                device.arch(),
                KERNEL_OPTIONS,
            )?;
            Module::load(device, &code).map(Arc::new)
        })
        .clone()
}

/// The shape of a batch held in device buffers (the host-side copy of the kernel's shape words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceShape {
    /// Requests `B`.
    pub batch: u32,
    /// Draft slots per request.
    pub k_max: u32,
    /// Vocabulary size `V`.
    pub vocab: u32,
    /// Row stride of `draft_probs`; `None` for a one-hot drafter (no `draft_probs`).
    pub draft_stride: Option<u32>,
    /// Row stride of `target_probs`.
    pub target_stride: u32,
}

/// A batch already in device memory, laid out as `core/DETERMINISM.md` says. Every buffer is
/// checked against [`DeviceShape`] before launch; the contents (`k`, token ids) are checked by the
/// kernel, which skips a bad request without counting it and raises a flag
/// ([`DeviceCounters::error_flags`]).
#[derive(Clone, Copy, Debug)]
pub struct DeviceBatch<'a> {
    /// The shape.
    pub shape: DeviceShape,
    /// `B` draft lengths.
    pub k: &'a DeviceBuffer<u32>,
    /// `B · k_max` draft ids.
    pub draft_ids: &'a DeviceBuffer<u32>,
    /// `B · k_max · draft_stride` draft probabilities, or `None` (one-hot drafter).
    pub draft_probs: Option<&'a DeviceBuffer<f32>>,
    /// `B · (k_max + 1) · target_stride` target probabilities.
    pub target_probs: &'a DeviceBuffer<f32>,
    /// `B` seeds.
    pub seed: &'a DeviceBuffer<u64>,
    /// `B` offsets.
    pub offset: &'a DeviceBuffer<u64>,
    /// `B` values of `ε` (needed by [`Method::Typical`] only).
    pub eps: Option<&'a DeviceBuffer<f32>>,
    /// `B` values of `δ` (needed by [`Method::Typical`] only).
    pub delta: Option<&'a DeviceBuffer<f32>>,
}

/// Output buffers in device memory for a [`DeviceBatch`].
#[derive(Debug)]
pub struct DeviceOutputs<'a> {
    /// `B` accepted counts.
    pub accepted: &'a mut DeviceBuffer<u32>,
    /// `B · (k_max + 1)` emitted tokens.
    pub tokens: &'a mut DeviceBuffer<u32>,
}

/// Grow-only device buffers for the host-slice path.
#[derive(Default)]
struct Scratch {
    shape: Option<DeviceBuffer<u32>>,
    k: Option<DeviceBuffer<u32>>,
    draft_ids: Option<DeviceBuffer<u32>>,
    draft_probs: Option<DeviceBuffer<f32>>,
    target_probs: Option<DeviceBuffer<f32>>,
    seed: Option<DeviceBuffer<u64>>,
    offset: Option<DeviceBuffer<u64>>,
    eps: Option<DeviceBuffer<f32>>,
    delta: Option<DeviceBuffer<f32>>,
    accepted: Option<DeviceBuffer<u32>>,
    tokens: Option<DeviceBuffer<u32>>,
    /// The split entry's scratch (zero between launches: the kernel leaves it so).
    split: Option<DeviceBuffer<u64>>,
}

/// Requests per launch below which each request's rows are split over several blocks
/// (`kernels::VERIFY_SPLIT_ENTRY`): about one request per compute unit of an MI-series GCD.
const SPLIT_BELOW: u32 = 128;
/// The most blocks one request's rows are split over.
const MAX_SLICES: u32 = 64;

/// Blocks per request for a launch of `batch` requests: `min(⌈256 / batch⌉, 64)` below
/// [`SPLIT_BELOW`], else 1.
fn slices_for(batch: u32) -> u32 {
    if batch == 0 || batch >= SPLIT_BELOW {
        1
    } else {
        (2 * SPLIT_BELOW).div_ceil(batch).clamp(1, MAX_SLICES)
    }
}

/// A buffer of at least `len` elements in `slot`, reallocated only when too small.
fn ensure<'s, T: DeviceCopy>(
    slot: &'s mut Option<DeviceBuffer<T>>,
    device: &Device,
    len: usize,
) -> Result<&'s mut DeviceBuffer<T>, RocmError> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        *slot = None;
        *slot = Some(DeviceBuffer::zeroed(device, len.max(1))?);
    }
    slot.as_mut().ok_or(RocmError::TooLarge)
}

/// Uploads `data` into the scratch buffer `slot`, returning its device pointer.
fn stage<T: DeviceCopy>(
    slot: &mut Option<DeviceBuffer<T>>,
    device: &Device,
    data: &[T],
    stream: &crate::device::Stream,
) -> Result<*mut c_void, RocmError> {
    let buf = ensure(slot, device, data.len())?;
    buf.enqueue_upload(data, stream)?;
    Ok(buf.as_device_ptr())
}

fn to_u32(n: usize) -> Result<u32, RocmError> {
    u32::try_from(n).map_err(|_| RocmError::TooLarge)
}

fn need<T: DeviceCopy>(
    what: &'static str,
    buf: &DeviceBuffer<T>,
    n: usize,
) -> Result<(), RocmError> {
    if buf.len() < n {
        return Err(RocmError::LengthMismatch {
            what,
            expected: n,
            actual: buf.len(),
        });
    }
    Ok(())
}

/// The kernel entry point, a handle valid while its module is loaded.
#[derive(Clone, Copy)]
struct Kernel(RawFunction);

// SAFETY: a function handle may be launched from any thread; the verifier keeps its module
// (and so the handle) alive.
unsafe impl Send for Kernel {}
// SAFETY: as for `Send`.
unsafe impl Sync for Kernel {}

/// The verification kernel on one ROCm device, implementing [`Verifier`].
///
/// Counters live in device memory and are updated by the kernel in the same launch that verifies
/// (64-bit atomics); [`readback`](Self::readback) gives the asynchronous [`RocmReadback`] of
/// them. Work is enqueued on one compute stream; [`Verifier::verify`] on host slices waits for
/// its outputs, [`verify_device`](Self::verify_device) does not wait.
pub struct RocmVerifier<const K: usize> {
    device: Device,
    _module: Arc<Module>,
    kernel: Kernel,
    split_kernel: Kernel,
    stats: Arc<DeviceCounters<K>>,
    scratch: Scratch,
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
        Self::on(&Device::new(ordinal)?)
    }

    /// A verifier on an already opened device.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn on(device: &Device) -> Result<Self, RocmError> {
        let module = module_for(device)?;
        let kernel = Kernel(module.function(VERIFY_ENTRY)?);
        let split_kernel = Kernel(module.function(VERIFY_SPLIT_ENTRY)?);
        Ok(Self {
            device: device.clone(),
            _module: module,
            kernel,
            split_kernel,
            stats: Arc::new(DeviceCounters::new(device)?),
            scratch: Scratch::default(),
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device counters (shared with readbacks).
    pub fn counters(&self) -> &Arc<DeviceCounters<K>> {
        &self.stats
    }

    /// A new asynchronous readback of this verifier's counters.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when creating its streams, events or buffers fails.
    pub fn readback(&self) -> Result<RocmReadback<K>, RocmError> {
        RocmReadback::new(Arc::clone(&self.stats))
    }

    /// Enqueues verification of a batch already in device memory on the compute stream and
    /// returns without waiting. Buffer sizes are checked against `batch.shape`.
    ///
    /// # Errors
    /// [`RocmError::LengthMismatch`] for a buffer too small for the shape,
    /// [`RocmError::Verify`] for a shape the kernel would refuse, [`RocmError::Hip`] when the
    /// launch fails.
    pub fn verify_device(
        &mut self,
        method: Method,
        batch: &DeviceBatch<'_>,
        out: &mut DeviceOutputs<'_>,
    ) -> Result<(), RocmError> {
        let s = batch.shape;
        let (b, k_max, v) = (s.batch as usize, s.k_max as usize, s.vocab as usize);
        if b == 0 {
            return Err(VerifyError::EmptyBatch.into());
        }
        if k_max == 0 || k_max > K {
            return Err(VerifyError::KMaxOutOfRange { k_max, max: K }.into());
        }
        if v == 0 || s.vocab == u32::MAX {
            return Err(VerifyError::VocabOutOfRange { vocab: v }.into());
        }
        let mul = |a: usize, c: usize| a.checked_mul(c).ok_or(RocmError::TooLarge);
        need("k", batch.k, b)?;
        need("draft_ids", batch.draft_ids, mul(b, k_max)?)?;
        need("seed", batch.seed, b)?;
        need("offset", batch.offset, b)?;
        need(
            "target_probs",
            batch.target_probs,
            mul(mul(b, k_max + 1)?, s.target_stride as usize)?,
        )?;
        if (s.target_stride as usize) < v {
            return Err(RocmError::LengthMismatch {
                what: "target_stride",
                expected: v,
                actual: s.target_stride as usize,
            });
        }
        match (batch.draft_probs, s.draft_stride) {
            (Some(d), Some(stride)) => {
                if (stride as usize) < v {
                    return Err(RocmError::LengthMismatch {
                        what: "draft_stride",
                        expected: v,
                        actual: stride as usize,
                    });
                }
                need("draft_probs", d, mul(mul(b, k_max)?, stride as usize)?)?;
            }
            (None, None) => {}
            _ => {
                return Err(RocmError::LengthMismatch {
                    what: "draft_probs (present iff draft_stride is)",
                    expected: usize::from(s.draft_stride.is_some()),
                    actual: usize::from(batch.draft_probs.is_some()),
                });
            }
        }
        let (eps, delta) = match method {
            Method::Typical => {
                let (Some(e), Some(d)) = (batch.eps, batch.delta) else {
                    return Err(RocmError::LengthMismatch {
                        what: "eps and delta (required by typical acceptance)",
                        expected: b,
                        actual: 0,
                    });
                };
                need("eps", e, b)?;
                need("delta", d, b)?;
                (e.as_device_ptr(), d.as_device_ptr())
            }
            _ => (core::ptr::null_mut(), core::ptr::null_mut()),
        };
        need("accepted", out.accepted, b)?;
        need("tokens", out.tokens, mul(b, k_max + 1)?)?;

        let shape = kernels::shape_words(
            s.batch,
            s.k_max,
            s.vocab,
            s.draft_stride,
            s.target_stride,
            kernels::method_code(method),
            to_u32(K)?,
        );
        self.device.bind()?;
        // Written by 32-bit fills that carry the values (no host source to keep alive), so
        // nothing here waits: ordered on the compute stream after the previous launch that
        // read them.
        let shape_buf = ensure(&mut self.scratch.shape, &self.device, shape.len())?;
        shape_buf.enqueue_fill_words(&shape, &self.stats.compute)?;
        let shape_ptr = shape_buf.as_device_ptr();
        let args = [
            shape_ptr,
            batch.k.as_device_ptr(),
            batch.draft_ids.as_device_ptr(),
            batch
                .draft_probs
                .map_or(core::ptr::null_mut(), DeviceBuffer::as_device_ptr),
            batch.target_probs.as_device_ptr(),
            batch.seed.as_device_ptr(),
            batch.offset.as_device_ptr(),
            eps,
            delta,
            out.accepted.as_device_ptr(),
            out.tokens.as_device_ptr(),
            self.stats.words.as_device_ptr(),
        ];
        self.launch(s.batch, args)
    }

    /// Launches the kernel with the twelve pointer arguments of the launch contract: one block
    /// per request, or below [`SPLIT_BELOW`] requests the split entry over
    /// [`slices_for`]`(batch)` blocks per request (its scratch grown here; the verify paths
    /// are set-up style and wait anyway).
    fn launch(&mut self, batch: u32, args: [*mut c_void; 12]) -> Result<(), RocmError> {
        let slices = slices_for(batch);
        let mut values = [core::ptr::null_mut::<c_void>(); 13];
        values[..12].copy_from_slice(&args);
        let function = if slices > 1 {
            let words = kernels::split_scratch_words(K, slices as usize)
                .checked_mul(batch as usize)
                .ok_or(RocmError::TooLarge)?;
            values[12] = ensure(&mut self.scratch.split, &self.device, words)?.as_device_ptr();
            self.split_kernel.0
        } else {
            self.kernel.0
        };
        let mut slices_param = slices;
        let mut params: [*mut c_void; 14] = [core::ptr::null_mut(); 14];
        for (p, a) in params.iter_mut().zip(values.iter_mut()) {
            *p = core::ptr::from_mut(a).cast();
        }
        params[13] = core::ptr::from_mut(&mut slices_param).cast();
        let grid = batch.checked_mul(slices).ok_or(RocmError::TooLarge)?;
        let hip = self.device.hip();
        // SAFETY: `function` is a function of the loaded module: `specula_verify` (twelve
        // pointer-sized arguments) or `specula_verify_split` (those, the scratch pointer and a
        // u32); `params` holds one pointer to each argument in the order of the launch contract
        // (HIP reads as many as the function has), all alive for the call (HIP copies the values
        // at launch); every device buffer was checked to hold what the shape words describe, the
        // scratch holds split_scratch_words(K, slices) words per request (zero: fresh, or left
        // so by the kernel); grid and block follow the contract (block = 256, a multiple of
        // both AMD wave sizes).
        hip.check("hipModuleLaunchKernel", unsafe {
            (hip.api.hipModuleLaunchKernel)(
                function,
                grid,
                1,
                1,
                BLOCK_THREADS,
                1,
                1,
                0,
                self.stats.compute.raw,
                params.as_mut_ptr(),
                core::ptr::null_mut(),
            )
        })
    }

    fn verify_host(
        &mut self,
        method: Method,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), RocmError> {
        let b = batch.requests();
        let shape = kernels::batch_shape::<K>(method, batch).map_err(|_| RocmError::TooLarge)?;
        let (dev, sc, stream) = (&self.device, &mut self.scratch, &self.stats.compute);
        dev.bind()?;
        let defaults;
        let (eps, delta): (&[f32], &[f32]) = match (method, batch.eps, batch.delta) {
            (Method::Typical, e, d) => {
                defaults = (vec![DEFAULT_EPS; b], vec![DEFAULT_DELTA; b]);
                (e.unwrap_or(&defaults.0), d.unwrap_or(&defaults.1))
            }
            _ => (&[], &[]),
        };
        let args = [
            stage(&mut sc.shape, dev, &shape, stream)?,
            stage(&mut sc.k, dev, batch.k, stream)?,
            stage(&mut sc.draft_ids, dev, batch.draft_ids, stream)?,
            match batch.draft_probs {
                Some(d) => stage(&mut sc.draft_probs, dev, d, stream)?,
                None => core::ptr::null_mut(),
            },
            stage(&mut sc.target_probs, dev, batch.target_probs, stream)?,
            stage(&mut sc.seed, dev, batch.seed, stream)?,
            stage(&mut sc.offset, dev, batch.offset, stream)?,
            if eps.is_empty() {
                core::ptr::null_mut()
            } else {
                stage(&mut sc.eps, dev, eps, stream)?
            },
            if delta.is_empty() {
                core::ptr::null_mut()
            } else {
                stage(&mut sc.delta, dev, delta, stream)?
            },
            ensure(&mut sc.accepted, dev, out.accepted.len())?.as_device_ptr(),
            ensure(&mut sc.tokens, dev, out.tokens.len())?.as_device_ptr(),
            self.stats.words.as_device_ptr(),
        ];
        let result = self
            .launch(shape[kernels::SHAPE_BATCH], args)
            .and_then(|()| {
                let sc = &self.scratch;
                let stream = &self.stats.compute;
                if let Some(a) = &sc.accepted {
                    a.enqueue_download(out.accepted, stream)?;
                }
                if let Some(t) = &sc.tokens {
                    t.enqueue_download(out.tokens, stream)?;
                }
                Ok(())
            });
        // Always wait: the host slices uploaded above must outlive the copies that read them,
        // and the outputs are only complete after this.
        let synced = self.stats.compute.synchronize();
        result.and(synced)
    }
}

impl<const K: usize> Verifier<K> for RocmVerifier<K> {
    type Error = RocmError;

    /// Validates the batch on the host (as [`validate`]; nothing is launched or counted on
    /// error), uploads it, launches the kernel and waits for the outputs.
    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), RocmError> {
        validate::<K>(method, check, batch, out)?;
        self.verify_host(method, batch, out)
    }

    /// Waits for all work on the compute stream and reads the device counters.
    fn totals(&mut self) -> Result<Counters<K>, RocmError> {
        self.stats.read_blocking()
    }
}

#[cfg(test)]
mod split_tests {
    use super::{MAX_SLICES, SPLIT_BELOW, slices_for};

    #[test]
    fn small_batches_split_large_ones_do_not() {
        assert_eq!(slices_for(1), MAX_SLICES);
        assert_eq!(slices_for(64), 4);
        assert_eq!(slices_for(100), 3);
        assert_eq!(slices_for(SPLIT_BELOW - 1), 3);
        assert_eq!(slices_for(SPLIT_BELOW), 1);
        assert_eq!(slices_for(4096), 1);
        assert_eq!(slices_for(0), 1);
    }
}
