//! [`DeviceCounters`]: counters in device memory; [`RocmReadback`]: their asynchronous readback.

use crate::device::{Device, Event, Stream};
use crate::error::RocmError;
use crate::ffi;
use crate::memory::{DeviceBuffer, PinnedBuffer};
use core::task::Poll;
use specula_core::kernels::{counters_from_stats, error_word, stats_words};
use specula_core::{Counters, Misuse, Readback};
use std::sync::Arc;

/// The kernel's `stats` buffer in device memory (`Counters<K>` as `4 + 2K` words, then the
/// error-flag word; see [`specula_core::kernels`]) and the compute stream whose kernels update
/// it. Shared (through `Arc`) by a verifier and its readbacks.
pub struct DeviceCounters<const K: usize> {
    pub(crate) words: DeviceBuffer<u64>,
    pub(crate) compute: Stream,
    pub(crate) device: Device,
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
    pub fn new(device: &Device) -> Result<Self, RocmError> {
        Ok(Self {
            words: DeviceBuffer::zeroed(device, stats_words(K))?,
            compute: Stream::new(device)?,
            device: device.clone(),
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
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

/// One of the two readback slots: a device staging copy, its host destination and two events.
struct Slot {
    staging: DeviceBuffer<u64>,
    host: PinnedBuffer<u64>,
    staged: Event,
    done: Event,
}

/// The [`Readback`] of [`DeviceCounters`], over HIP streams and events.
///
/// `start` enqueues, on the compute stream, a device-to-device copy of the counters into a
/// staging buffer (so the snapshot is exactly the counters after all work enqueued so far) and
/// records an event; a separate copy stream waits on that event and copies the staging buffer to
/// page-locked host memory, then records the completion event. `poll` only queries that event
/// (`hipEventQuery`); it never synchronises. Slots alternate (double buffering), so a `flush`
/// while a readback is in flight never writes host memory that is being read.
///
/// One readback is in flight at a time ([`Readback::max_in_flight`] keeps its default of 1;
/// `start` refuses a second with [`Misuse::AlreadyInFlight`]): the second slot is what lets
/// `flush` run while one is in flight, and `poll` tracks a single slot. A stale readback cannot
/// be abandoned ([`Readback::abandon`] keeps its default, `false`): its copy may still land in
/// the slot's pinned buffer, so the collector keeps polling it and reports it once per
/// staleness deadline until it completes.
pub struct RocmReadback<const K: usize> {
    counters: Arc<DeviceCounters<K>>,
    copy: Stream,
    slots: [Slot; 2],
    next: usize,
    in_flight: Option<usize>,
}

impl<const K: usize> core::fmt::Debug for RocmReadback<K> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocmReadback")
            .field("k", &K)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl<const K: usize> RocmReadback<K> {
    /// A readback of `counters`.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when creating streams, events or buffers fails.
    pub fn new(counters: Arc<DeviceCounters<K>>) -> Result<Self, RocmError> {
        let device = counters.device.clone();
        let slot = || -> Result<Slot, RocmError> {
            Ok(Slot {
                staging: DeviceBuffer::zeroed(&device, stats_words(K))?,
                host: PinnedBuffer::new(&device, stats_words(K))?,
                staged: Event::new(&device)?,
                done: Event::new(&device)?,
            })
        };
        Ok(Self {
            slots: [slot()?, slot()?],
            copy: Stream::new(&device)?,
            counters,
            next: 0,
            in_flight: None,
        })
    }

    fn enqueue(&mut self) -> Result<usize, RocmError> {
        let i = self.next;
        let c = &self.counters;
        c.device.bind()?;
        let hip = c.device.hip();
        let slot = &self.slots[i];
        let bytes = stats_words(K) * size_of::<u64>();
        // SAFETY: both are `stats_words(K)` u64 device allocations on this device, alive for
        // as long as `self` (and the `Arc` it holds); the copy is ordered on the compute stream
        // after every kernel enqueued so far.
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                slot.staging.as_device_ptr(),
                c.words.as_device_ptr(),
                bytes,
                ffi::MEMCPY_DEVICE_TO_DEVICE,
                c.compute.raw,
            )
        })?;
        slot.staged.record(&c.compute)?;
        self.copy.wait(&slot.staged)?;
        // SAFETY: the destination is `bytes` of pinned host memory owned by the slot, which is
        // only read after `done` completes and is not freed before the copy stream finishes
        // (see `Drop`); the source is the slot's staging buffer.
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                slot.host.as_mut_ptr(),
                slot.staging.as_device_ptr(),
                bytes,
                ffi::MEMCPY_DEVICE_TO_HOST,
                self.copy.raw,
            )
        })?;
        slot.done.record(&self.copy)?;
        self.next = 1 - i;
        Ok(i)
    }

    fn finish(&self, i: usize) -> Result<Counters<K>, RocmError> {
        let words = self.slots[i].host.read();
        counters_from_stats(&words).ok_or(RocmError::LengthMismatch {
            what: "stats",
            expected: stats_words(K),
            actual: words.len(),
        })
    }
}

impl<const K: usize> Readback<K> for RocmReadback<K> {
    type Error = RocmError;

    fn start(&mut self) -> Result<(), RocmError> {
        if self.in_flight.is_some() {
            return Err(Misuse::AlreadyInFlight.into());
        }
        self.in_flight = Some(self.enqueue()?);
        Ok(())
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, RocmError>> {
        let Some(i) = self.in_flight else {
            return Poll::Ready(Err(Misuse::NothingInFlight.into()));
        };
        match self.slots[i].done.query() {
            Ok(false) => Poll::Pending,
            Ok(true) => {
                self.in_flight = None;
                Poll::Ready(self.finish(i))
            }
            Err(e) => {
                self.in_flight = None;
                Poll::Ready(Err(e))
            }
        }
    }

    fn flush(&mut self) -> Result<Counters<K>, RocmError> {
        if let Some(i) = self.in_flight.take() {
            self.slots[i].done.synchronize()?;
        }
        let i = self.enqueue()?;
        self.slots[i].done.synchronize()?;
        self.finish(i)
    }
}

impl<const K: usize> Drop for RocmReadback<K> {
    fn drop(&mut self) {
        // The pinned buffers must outlive any copy into them; errors cannot be reported here.
        let _ = self.copy.synchronize();
    }
}
