//! [`DeviceCounters`]: counters in device memory; [`RocmReadback`]: their asynchronous readback.

use crate::device::{RocmDevice, RocmStream};
use crate::driver::RocmDriver;
use crate::error::RocmError;
use crate::memory::RocmDeviceBuffer;
use core::task::Poll;
use specula_core::gpu::GpuReadback;
use specula_core::kernels::{counters_from_stats, error_word, stats_words};
use specula_core::{Counters, Readback};
use std::sync::Arc;

/// The kernel's `stats` buffer in device memory (`Counters<K>` as `4 + 2K` words, then the
/// error-flag word; see [`specula_core::kernels`]) and the compute stream whose kernels update
/// it. Shared (through `Arc`) by a verifier and its readbacks.
pub struct DeviceCounters<const K: usize> {
    pub(crate) words: Arc<RocmDeviceBuffer<u64>>,
    pub(crate) compute: Arc<RocmStream>,
    pub(crate) device: RocmDevice,
}

impl<const K: usize> core::fmt::Debug for DeviceCounters<K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceCounters")
            .field("k", &K)
            .field("device", &self.device)
            .finish()
    }
}

impl<const K: usize> DeviceCounters<K> {
    /// Zeroed counters on `device`, with a new compute stream.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when allocation or stream creation fails.
    pub fn new(device: &RocmDevice) -> Result<Self, RocmError> {
        Ok(Self {
            words: Arc::new(RocmDeviceBuffer::zeroed(device, stats_words(K))?),
            compute: Arc::new(RocmStream::new(device)?),
            device: device.clone(),
        })
    }

    /// The counters `words` that `compute`'s kernels update (a verifier's).
    pub(crate) fn from_parts(
        words: Arc<RocmDeviceBuffer<u64>>,
        compute: Arc<RocmStream>,
        device: RocmDevice,
    ) -> Self {
        Self {
            words,
            compute,
            device,
        }
    }

    /// The device.
    pub fn device(&self) -> &RocmDevice {
        &self.device
    }

    /// Reads the counters now, after all work enqueued on the compute stream (blocking).
    ///
    /// # Errors
    /// [`RocmError::Hip`] when the synchronisation or the copy fails.
    pub fn read_blocking(&self) -> Result<Counters<K>, RocmError> {
        self.device.bind()?;
        self.compute.synchronize()?;
        let words = self.words.to_host()?;
        counters_from_stats(&words).ok_or(RocmError::LengthMismatch {
            what: "stats",
            expected: stats_words(K),
            actual: words.len(),
        })
    }

    /// The kernel's error-flag word after all work enqueued so far (blocking): an OR of
    /// [`specula_core::kernels::ERR_SHAPE`], `ERR_DRAFT_LEN` and `ERR_TOKEN`, never cleared.
    /// Only device-buffer launches can set it; host-slice verification validates first.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when the synchronisation or the copy fails.
    pub fn error_flags(&self) -> Result<u64, RocmError> {
        self.device.bind()?;
        self.compute.synchronize()?;
        let words = self.words.to_host()?;
        words
            .get(error_word(K))
            .copied()
            .ok_or(RocmError::LengthMismatch {
                what: "stats",
                expected: stats_words(K),
                actual: words.len(),
            })
    }
}

/// The [`Readback`] of [`DeviceCounters`]: the shared readback ring of `specula_core::gpu`
/// ([`GpuReadback`]) over this crate's HIP driver glue ([`RocmDriver`]).
///
/// `start` enqueues, on the compute stream, a device-to-device copy of the counters into a free
/// slot's staging buffer (so the snapshot is exactly the counters after all work enqueued so
/// far) and records an event; a separate copy stream waits on that event and copies the staging
/// buffer to the slot's page-locked host memory, then records the slot's completion event.
/// `poll` only queries the oldest slot's event (`hipEventQuery`); it never synchronises. Up to
/// [`MAX_IN_FLIGHT`](specula_core::MAX_IN_FLIGHT) copies are in flight; a stale one can be
/// abandoned, its slot reused only once its copy has landed. The same ring runs end to end in
/// CI over the host driver of `specula-tests` (`tests/tests/gpu_host.rs`).
#[derive(Debug)]
pub struct RocmReadback<const K: usize> {
    inner: GpuReadback<RocmDriver, K>,
    _counters: Arc<DeviceCounters<K>>,
}

impl<const K: usize> RocmReadback<K> {
    /// A readback of `counters`.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when creating streams, events or buffers fails.
    pub fn new(counters: Arc<DeviceCounters<K>>) -> Result<Self, RocmError> {
        let drv = RocmDriver::new(counters.device.clone());
        let inner = GpuReadback::new(drv, counters.compute.clone(), counters.words.clone())?;
        Ok(Self {
            inner,
            _counters: counters,
        })
    }

    /// The kernel's error-flag word as of the last completed readback.
    #[must_use]
    pub fn last_error_flags(&self) -> u64 {
        self.inner.error_flags()
    }
}

impl<const K: usize> Readback<K> for RocmReadback<K> {
    type Error = RocmError;

    fn start(&mut self) -> Result<(), RocmError> {
        self.inner.start().map_err(RocmError::from)
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, RocmError>> {
        self.inner.poll().map_err(RocmError::from)
    }

    fn flush(&mut self) -> Result<Counters<K>, RocmError> {
        self.inner.flush().map_err(RocmError::from)
    }

    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight()
    }

    fn abandon(&mut self) -> bool {
        self.inner.abandon()
    }
}

impl<const K: usize> Drop for RocmReadback<K> {
    fn drop(&mut self) {
        // The pinned buffers must outlive any copy into them (abandoned ones included); errors
        // cannot be reported here.
        let _ = self.inner.copy_stream().synchronize();
    }
}

// The collector runs on its own thread: the readback must move there.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<RocmReadback<8>>();
};
