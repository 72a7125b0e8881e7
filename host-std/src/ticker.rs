//! [`Ticker`]: a [`Collector`] with a [`StdClock`], ticked once per decode step. (Named for what
//! it does, apart from `specula_core::gpu::Driver`, the seam a GPU backend implements.)

use crate::clock::{StdClock, duration_ns};
use specula_core::{Clock, CollectError, Collector, Readback, SlotWriter, Snapshot, Tick};
use std::time::Duration;

/// Drives one rank's [`Collector`] from its decode loop on a [`StdClock`].
///
/// Call [`step`](Ticker::step) once per decode step (it never blocks) and
/// [`flush`](Ticker::flush) at shutdown, before stopping the sinks, so the last counts reach
/// every one of them.
pub struct Ticker<R: Readback<K>, const K: usize> {
    collector: Collector<'static, R, K>,
    clock: StdClock,
}

impl<R: Readback<K>, const K: usize> std::fmt::Debug for Ticker<R, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticker")
            .field("in_flight", &self.collector.in_flight())
            .field("last", self.collector.last())
            .finish_non_exhaustive()
    }
}

impl<R: Readback<K>, const K: usize> Ticker<R, K> {
    /// Collects from `readback` into `writer` every `period`, on a grid starting now.
    ///
    /// # Errors
    /// A zero `period`.
    pub fn new(
        readback: R,
        writer: SlotWriter<'static, Snapshot<K>>,
        period: Duration,
        clock: StdClock,
    ) -> Result<Self, specula_core::ZeroPeriod> {
        let collector = Collector::new(readback, writer, duration_ns(period), clock.now_ns())?;
        Ok(Self { collector, clock })
    }

    /// One decode step's worth of collection; never blocks.
    ///
    /// A readback that completes as soon as it is started (host counters) is published in the
    /// same step rather than the next one, so publication times do not depend on step length.
    #[inline]
    pub fn step(&mut self) -> Tick {
        let now = self.clock.now_ns();
        match self.collector.tick(now) {
            Tick::Started => match self.collector.tick(now) {
                Tick::Pending => Tick::Started,
                done => done,
            },
            t => t,
        }
    }

    /// Final blocking readback and publication (see [`Collector::flush`]).
    pub fn flush(&mut self) -> Result<u64, CollectError<R::Error>>
    where
        R::Error: Clone,
    {
        self.collector.flush(self.clock.now_ns())
    }

    /// The collector.
    pub fn collector(&self) -> &Collector<'static, R, K> {
        &self.collector
    }

    /// The collector, mutably (for instance to reach the readback's counters).
    pub fn collector_mut(&mut self) -> &mut Collector<'static, R, K> {
        &mut self.collector
    }

    /// The clock.
    pub fn clock(&self) -> StdClock {
        self.clock
    }
}
