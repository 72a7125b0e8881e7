//! [`GpuReadback`]: the readback ring over a [`Driver`], several copies in flight.
//!
//! `start` enqueues, on the compute stream, a device-to-device copy of `stats` into the free
//! slot's staging buffer: the snapshot is taken at one point of the compute stream, after every
//! kernel enqueued before it and before any enqueued after it, so it is consistent. An event
//! recorded after that copy makes the copy stream wait; the copy stream then moves the staging
//! buffer to the slot's page-locked host buffer and records the slot's completion event. `poll`
//! only queries the oldest slot's event. The compute stream never waits for the host copy, and
//! neither `start` nor `poll` calls a synchronising driver method.
//!
//! Each slot has its own staging buffer, events and host buffer, so up to `N` copies are in
//! flight at once and finish in start order (one copy stream). A stale copy can be abandoned:
//! its slot is set aside, not reused, until its completion event is seen (a later `start`
//! queries it), so the device never writes a buffer the host is reading.
//!
//! The drop hands the copy stream to [`Driver::drain_copies`] before the page-locked buffers are
//! freed: CUDA and HIP wait for it there, so no copy lands in freed memory.

use super::driver::{Driver, Status};
use super::error::GpuError;
use super::verifier::GpuVerifier;
use crate::gpu::kernels;
use crate::metrics::Counters;
use crate::metrics::{Flight, MAX_IN_FLIGHT};
use crate::metrics::{Misuse, Readback};
use core::task::Poll;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    InFlight,
    /// Given up by the collector; free once its completion event is seen.
    Abandoned,
}

struct Slot<D: Driver> {
    staging: D::Buffer,
    snapshot: D::Event,
    done: D::Event,
    host: D::HostBuffer,
    state: State,
}

/// A [`Readback`] of a [`GpuVerifier`](super::GpuVerifier)'s device counters with up to `N`
/// copies in flight.
pub struct GpuReadback<D: Driver, const K: usize, const N: usize = MAX_IN_FLIGHT> {
    drv: D,
    compute: D::Stream,
    copy: D::Stream,
    stats: D::Buffer,
    slots: heapless::Vec<Slot<D>, N>,
    flight: Flight<usize, N>,
    error_flags: u64,
    syncs: u64,
}

impl<D: Driver, const K: usize, const N: usize> core::fmt::Debug for GpuReadback<D, K, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GpuReadback")
            .field("in_flight", &self.flight.len())
            .field("error_flags", &self.error_flags)
            .finish_non_exhaustive()
    }
}

/// Reads the counters and the error word from a host copy of `stats`.
///
/// # Safety
/// As [`Driver::read_host`]: no copy into `host` in flight.
pub(crate) unsafe fn read_stats<D: Driver, const K: usize>(
    drv: &D,
    host: &D::HostBuffer,
) -> (Counters<K>, u64) {
    let word = |i: usize| {
        let mut w = [0u64];
        // SAFETY: the caller vouches that no copy into `host` is in flight; `i` is below
        // stats_words(K), the words every host copy of `stats` holds.
        unsafe { drv.read_host(host, i * 8, &mut w) };
        w[0]
    };
    (kernels::counters_of(word), word(kernels::error_word(K)))
}

impl<D: Driver, const K: usize, const N: usize> GpuReadback<D, K, N> {
    /// A readback of `verifier`'s counters, snapshotted on its compute stream, with its own
    /// copy stream and `N` slots (`N ≥ 1`), each with its events, staging buffer and page-locked
    /// buffer.
    ///
    /// # Errors
    /// [`GpuError::Driver`] when creating a stream, an event or a buffer fails.
    pub fn new(verifier: &GpuVerifier<D, K>) -> Result<Self, GpuError<D::Error>> {
        let drv = verifier.driver().clone();
        let bytes = kernels::stats_words(K) * 8;
        let e = GpuError::Driver;
        let mut slots = heapless::Vec::new();
        for _ in 0..N.max(1) {
            let slot = Slot {
                staging: drv.alloc(bytes).map_err(e)?,
                snapshot: drv.event().map_err(e)?,
                done: drv.event().map_err(e)?,
                host: drv.alloc_host(bytes).map_err(e)?,
                state: State::Free,
            };
            if slots.push(slot).is_err() {
                break; // N = 0: no slot fits; `start` reports Stalled.
            }
        }
        Ok(Self {
            copy: drv.stream().map_err(e)?,
            drv,
            compute: verifier.stream().clone(),
            stats: verifier.stats().clone(),
            slots,
            flight: Flight::new(),
            error_flags: 0,
            syncs: 0,
        })
    }

    /// The kernel's error-flag word as of the last completed readback (`kernels::ERR_*` bits):
    /// non-zero if some request was skipped as invalid.
    pub fn error_flags(&self) -> u64 {
        self.error_flags
    }

    /// Synchronising driver calls this readback has made (only [`flush`](Readback::flush)
    /// makes any; the drop may make one more, [`Driver::drain_copies`]).
    pub fn sync_calls(&self) -> u64 {
        self.syncs
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.drv
    }

    /// The stream the copies to the host run on (what the drop hands to
    /// [`Driver::drain_copies`]).
    pub fn copy_stream(&self) -> &D::Stream {
        &self.copy
    }

    /// Readbacks in flight (not counting abandoned ones).
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    /// A free slot: a never-used or retired one, or an abandoned one whose copy has finished
    /// (queried, never waited for).
    fn free_slot(&mut self) -> Option<usize> {
        if let Some(i) = self.slots.iter().position(|s| s.state == State::Free) {
            return Some(i);
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            // An error also ends the copy: the slot may be reused.
            if s.state == State::Abandoned
                && !matches!(self.drv.query(&s.done), Ok(Status::Pending))
            {
                s.state = State::Free;
                return Some(i);
            }
        }
        None
    }

    fn enqueue(&mut self, i: usize) -> Result<(), D::Error> {
        let bytes = kernels::stats_words(K) * 8;
        let d = &self.drv;
        let s = &self.slots[i];
        d.copy(&self.compute, &s.staging, &self.stats, bytes)?;
        d.record(&s.snapshot, &self.compute)?;
        d.wait(&self.copy, &s.snapshot)?;
        d.download(&self.copy, &s.host, 0, &s.staging, 0, bytes)?;
        d.record(&s.done, &self.copy)
    }

    /// Waits on the host for slot `i`'s copy (a synchronising call, counted).
    fn wait(&mut self, i: usize) -> Result<(), GpuError<D::Error>> {
        self.syncs += 1;
        self.drv
            .sync_event(&self.slots[i].done)
            .map_err(GpuError::Driver)
    }

    fn retire(&mut self, i: usize) -> Counters<K> {
        self.slots[i].state = State::Free;
        // SAFETY: slot `i`'s completion event, recorded after its only download, was seen.
        let (c, flags) = unsafe { read_stats::<D, K>(&self.drv, &self.slots[i].host) };
        self.error_flags = flags;
        c
    }
}

impl<D: Driver, const K: usize, const N: usize> Drop for GpuReadback<D, K, N> {
    fn drop(&mut self) {
        // The page-locked buffers are freed right after this: the driver lets copies still in
        // flight (or abandoned) land first where it must.
        self.drv.drain_copies(&self.copy);
    }
}

impl<D: Driver, const K: usize, const N: usize> Readback<K> for GpuReadback<D, K, N> {
    type Error = GpuError<D::Error>;

    fn start(&mut self) -> Result<(), Self::Error> {
        if self.flight.len() >= self.max_in_flight() {
            return Err(Misuse::AlreadyInFlight.into());
        }
        let i = self.free_slot().ok_or(GpuError::Stalled)?;
        // A failed enqueue leaves the slot free: nothing it started can be waited for.
        self.enqueue(i).map_err(GpuError::Driver)?;
        self.slots[i].state = State::InFlight;
        let _ = self.flight.push(i); // room: checked above
        Ok(())
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, Self::Error>> {
        let Some(&i) = self.flight.front() else {
            return Poll::Ready(Err(Misuse::NothingInFlight.into()));
        };
        match self.drv.query(&self.slots[i].done) {
            Ok(Status::Pending) => Poll::Pending,
            Ok(Status::Ready) => {
                self.flight.pop();
                Poll::Ready(Ok(self.retire(i)))
            }
            Err(e) => {
                self.flight.pop();
                self.slots[i].state = State::Free;
                Poll::Ready(Err(GpuError::Driver(e)))
            }
        }
    }

    fn flush(&mut self) -> Result<Counters<K>, Self::Error> {
        // Retire what is in flight (its values are superseded by the final copy).
        while let Some(i) = self.flight.pop() {
            self.slots[i].state = State::Free;
            self.wait(i)?;
        }
        let i = match self.free_slot() {
            Some(i) => i,
            None => {
                // Every slot abandoned and still pending: wait for the oldest (flush may block).
                let i = self
                    .slots
                    .iter()
                    .position(|s| s.state == State::Abandoned)
                    .ok_or(GpuError::Stalled)?;
                self.wait(i)?;
                self.slots[i].state = State::Free;
                i
            }
        };
        self.enqueue(i).map_err(GpuError::Driver)?;
        self.wait(i)?;
        Ok(self.retire(i))
    }

    fn max_in_flight(&self) -> usize {
        self.slots.len().max(1)
    }

    /// Sets the oldest copy aside: its slot is not reused until its completion is seen, so the
    /// collector may start another in its place at once.
    fn abandon(&mut self) -> bool {
        match self.flight.pop() {
            Some(i) => {
                self.slots[i].state = State::Abandoned;
                true
            }
            None => false,
        }
    }
}
