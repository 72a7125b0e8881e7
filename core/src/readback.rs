//! The [`Readback`] seam: how a collector gets counters back from where they accumulate.

use crate::counters::Counters;
use core::task::Poll;

/// An asynchronous copy of device-side counters to the host.
///
/// The contract a backend implements:
/// * [`start`](Readback::start) enqueues a copy of the counters as they stand at this point of
///   the device's work and returns at once; it never waits for the device.
/// * [`poll`](Readback::poll) reports whether that copy has finished, without waiting.
/// * [`flush`](Readback::flush) may block: it waits for all work recorded so far and returns
///   the final totals. It is called at shutdown so nothing counted is lost.
///
/// Counters are cumulative totals; each completed readback must be at least the previous one
/// field by field (the collector rejects one that is not).
pub trait Readback<const K: usize> {
    /// Why a readback failed.
    type Error: core::fmt::Debug;

    /// Starts one readback. Called only when none is in flight.
    fn start(&mut self) -> Result<(), Self::Error>;

    /// Polls the readback in flight: `Pending` until it is done. Never blocks.
    fn poll(&mut self) -> Poll<Result<Counters<K>, Self::Error>>;

    /// Waits for everything counted so far and returns the totals. May block.
    fn flush(&mut self) -> Result<Counters<K>, Self::Error>;
}

impl<const K: usize, R: Readback<K> + ?Sized> Readback<K> for &mut R {
    type Error = R::Error;
    fn start(&mut self) -> Result<(), Self::Error> {
        (**self).start()
    }
    fn poll(&mut self) -> Poll<Result<Counters<K>, Self::Error>> {
        (**self).poll()
    }
    fn flush(&mut self) -> Result<Counters<K>, Self::Error> {
        (**self).flush()
    }
}
