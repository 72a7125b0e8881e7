//! [`CudaReadback`]: asynchronous, never-blocking readback of the device counters.
//!
//! `start` enqueues, on the compute stream, a device-to-device copy of `stats` into a staging
//! buffer: the snapshot is taken at one point of the compute stream, after every kernel enqueued
//! before it and before any enqueued after it, so it is consistent (no half-updated step). An
//! event recorded after that copy makes the copy stream wait; the copy stream then moves the
//! staging buffer to page-locked host memory (two buffers, alternating) and records a completion
//! event. `poll` only queries that event. The compute stream never waits for the host copy.
//!
//! One readback is in flight at a time ([`Readback::max_in_flight`] keeps its default of 1):
//! the device-side staging buffer and the snapshot event are single, and a second `start`
//! would overwrite the staging buffer while the copy stream may still be reading it. A ring
//! would need one staging buffer, snapshot event, completion event and pinned buffer per slot;
//! a collector with a latency above its period then starts the next readback as soon as the
//! previous one is published. A stale readback cannot be abandoned ([`Readback::abandon`] keeps
//! its default, `false`): the copy stream may still write its pinned buffer, so the collector
//! keeps polling it and reports it once per staleness deadline until it completes.

use crate::calls::{Blocking, call};
use crate::device::{CudaDevice, DeviceBuffer, PinnedWords};
use crate::error::CudaError;
use cudarc::driver::result;
use cudarc::driver::sys::{CUevent, CUevent_flags, CUevent_wait_flags, CUresult};
use cudarc::driver::{CudaStream, DriverError};
use specula_core::kernels;
use specula_core::{Counters, Misuse, Readback};
use std::sync::Arc;
use std::task::Poll;

/// A [`Readback`] of a [`CudaVerifier`](crate::CudaVerifier)'s device counters.
#[derive(Debug)]
pub struct CudaReadback<const K: usize> {
    dev: Arc<CudaDevice>,
    stats: Arc<DeviceBuffer>,
    staging: DeviceBuffer,
    copy_stream: Arc<CudaStream>,
    snapshot_taken: CUevent,
    done: [CUevent; 2],
    host: [PinnedWords; 2],
    next: usize,
    in_flight: Option<usize>,
    error_flags: u64,
}

// SAFETY: the raw events are owned by this value and only used through `&mut self`; CUDA
// events may be used from any thread once the context is made current (every method binds it).
unsafe impl<const K: usize> Send for CudaReadback<K> {}

fn new_event() -> Result<CUevent, CudaError> {
    call("cuEventCreate", Blocking::No, || {
        result::event::create(CUevent_flags::CU_EVENT_DISABLE_TIMING)
    })
}

impl<const K: usize> CudaReadback<K> {
    pub(crate) fn new(dev: Arc<CudaDevice>, stats: Arc<DeviceBuffer>) -> Result<Self, CudaError> {
        let words = kernels::stats_words(K);
        let ctx = dev.context().clone();
        let staging = DeviceBuffer::zeroed(&ctx, words * 8)?;
        let host = [
            PinnedWords::zeroed(&ctx, words)?,
            PinnedWords::zeroed(&ctx, words)?,
        ];
        let copy_stream = call("cuStreamCreate", Blocking::Yes, || ctx.new_stream())?;
        dev.bind()?;
        Ok(Self {
            snapshot_taken: new_event()?,
            done: [new_event()?, new_event()?],
            dev,
            stats,
            staging,
            copy_stream,
            host,
            next: 0,
            in_flight: None,
            error_flags: 0,
        })
    }

    /// The kernel's error-flag word as of the last completed readback (`kernels::ERR_*` bits):
    /// non-zero if some request was skipped as invalid.
    #[must_use]
    pub fn error_flags(&self) -> u64 {
        self.error_flags
    }

    fn read(&mut self, i: usize) -> Result<Counters<K>, CudaError> {
        let words = self.host[i].words();
        self.error_flags = words[kernels::error_word(K)];
        kernels::counters_from_stats(words).ok_or(CudaError::TooLarge)
    }

    fn wait(&mut self, i: usize) -> Result<(), CudaError> {
        let ev = self.done[i];
        // SAFETY: a live event of this context.
        call("cuEventSynchronize", Blocking::Yes, || unsafe {
            result::event::synchronize(ev)
        })
    }
}

impl<const K: usize> Readback<K> for CudaReadback<K> {
    type Error = CudaError;

    fn start(&mut self) -> Result<(), CudaError> {
        if self.in_flight.is_some() {
            return Err(Misuse::AlreadyInFlight.into());
        }
        self.dev.bind()?;
        let i = self.next;
        let bytes = kernels::stats_words(K) * 8;
        let compute = self.dev.cu_stream();
        let copy = self.copy_stream.cu_stream();
        let (staging, stats, snap, done) = (
            self.staging.ptr,
            self.stats.ptr,
            self.snapshot_taken,
            self.done[i],
        );
        // The staging buffer is free: no readback is in flight, so the copy stream has finished
        // reading it (its completion event was observed by `poll` or `flush`).
        // SAFETY: both buffers hold `bytes` bytes; the stream belongs to the current context.
        call("cuMemcpyDtoDAsync", Blocking::No, || unsafe {
            result::memcpy_dtod_async(staging, stats, bytes, compute)
        })?;
        // SAFETY: a live event and stream of the current context.
        call("cuEventRecord", Blocking::No, || unsafe {
            result::event::record(snap, compute)
        })?;
        // SAFETY: a live stream and event of the current context.
        call("cuStreamWaitEvent", Blocking::No, || unsafe {
            result::stream::wait_event(copy, snap, CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })?;
        let len = self.host[i].words().len();
        let dst_ptr = self.host[i].as_mut_ptr();
        // SAFETY: page-locked memory of `len` words owned by `self.host[i]`; no other reference
        // to it exists while this one does, and the host reads it only after `done[i]`.
        let dst = unsafe { core::slice::from_raw_parts_mut(dst_ptr, len) };
        // SAFETY: `staging` holds `len` words; `dst` is page-locked and outlives the copy:
        // `self` owns it and `Drop` waits for an in-flight copy before freeing it.
        call("cuMemcpyDtoHAsync", Blocking::No, || unsafe {
            result::memcpy_dtoh_async(dst, staging, copy)
        })?;
        // SAFETY: a live event and stream of the current context.
        call("cuEventRecord", Blocking::No, || unsafe {
            result::event::record(done, copy)
        })?;
        self.in_flight = Some(i);
        self.next = 1 - i;
        Ok(())
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, CudaError>> {
        let Some(i) = self.in_flight else {
            return Poll::Ready(Err(Misuse::NothingInFlight.into()));
        };
        if let Err(e) = self.dev.bind() {
            return Poll::Ready(Err(e));
        }
        let ev = self.done[i];
        // SAFETY: a live event of the current context; cuEventQuery never waits.
        match call("cuEventQuery", Blocking::No, || unsafe {
            result::event::query(ev)
        }) {
            Ok(()) => {
                self.in_flight = None;
                Poll::Ready(self.read(i))
            }
            Err(CudaError::Driver {
                error: DriverError(CUresult::CUDA_ERROR_NOT_READY),
                ..
            }) => Poll::Pending,
            Err(e) => {
                self.in_flight = None;
                Poll::Ready(Err(e))
            }
        }
    }

    fn flush(&mut self) -> Result<Counters<K>, CudaError> {
        self.dev.bind()?;
        if let Some(i) = self.in_flight.take() {
            self.wait(i)?;
        }
        self.start()?;
        let i = self.in_flight.take().unwrap_or(0);
        self.wait(i)?;
        self.read(i)
    }
}

impl<const K: usize> Drop for CudaReadback<K> {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // The pinned buffers are freed right after this: let an in-flight copy land first.
            if let Some(i) = self.in_flight.take() {
                let _ = self.wait(i);
            }
            for ev in [self.snapshot_taken, self.done[0], self.done[1]] {
                // SAFETY: events created in `new`, destroyed once, here, after any copy they
                // track has completed.
                let _ = unsafe { result::event::destroy(ev) };
            }
        }
    }
}
