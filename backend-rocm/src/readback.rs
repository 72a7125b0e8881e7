//! [`RocmReadback`]: asynchronous, never-blocking readback of the device counters — the shared
//! readback ring of `specula_core::gpu` ([`GpuReadback`]) over the HIP driver glue
//! ([`RocmDriver`]).
//!
//! `start` enqueues, on the compute stream, a device-to-device copy of `stats` into a free
//! slot's staging buffer (a consistent snapshot: after every kernel enqueued before it, before
//! any enqueued after it) and records an event; the readback's own copy stream waits for it,
//! moves the staging buffer to the slot's page-locked host buffer and records the slot's
//! completion event. `poll` only queries the oldest slot's event. Up to
//! [`MAX_IN_FLIGHT`](specula_core::MAX_IN_FLIGHT) copies are in flight, and a stale one can be
//! abandoned: its slot is set aside until its copy lands. The same code runs end to end in CI
//! over the host driver of `specula-tests` (`tests/tests/it/gpu_host.rs`).
//!
//! This type is the ring plus one thing: at drop it waits for the copy stream, so no copy still
//! in flight lands in freed page-locked memory. The shared ring has no `Drop` of its own, which
//! is why a backend readback type exists at all.

use crate::driver::{RocmDriver, RocmVerifier};
use crate::error::RocmError;
use specula_core::gpu::{Driver, GpuReadback};
use specula_core::{Counters, Readback};
use std::task::Poll;

/// A [`Readback`] of a [`RocmVerifier`]'s device counters.
#[derive(Debug)]
pub struct RocmReadback<const K: usize> {
    inner: GpuReadback<RocmDriver, K>,
}

impl<const K: usize> RocmReadback<K> {
    /// A readback of `verifier`'s counters, snapshotted on its compute stream, with its own
    /// copy stream, events and page-locked buffers.
    ///
    /// # Errors
    /// [`RocmError::Hip`] when creating a stream, an event or a buffer fails.
    pub fn new(verifier: &RocmVerifier<K>) -> Result<Self, RocmError> {
        let inner = GpuReadback::new(
            verifier.driver().clone(),
            verifier.stream().clone(),
            verifier.stats().clone(),
        )?;
        Ok(Self { inner })
    }

    /// The kernel's error-flag word as of the last completed readback (`kernels::ERR_*` bits):
    /// non-zero if some request was skipped as invalid.
    #[must_use]
    pub fn error_flags(&self) -> u64 {
        self.inner.error_flags()
    }

    /// The shared ring this readback is.
    #[must_use]
    pub fn ring(&self) -> &GpuReadback<RocmDriver, K> {
        &self.inner
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
        // The page-locked buffers are freed right after this: let copies still in flight (or
        // abandoned) land first. Errors cannot be reported from drop.
        let _ = self.inner.driver().sync_stream(self.inner.copy_stream());
    }
}

// The collector runs on its own thread: the readback must move there.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<RocmReadback<8>>();
};
