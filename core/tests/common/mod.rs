//! A simulated device for the collector tests: counters "on the device", a readback that
//! completes after a latency on a virtual clock, and scripted failures.

#![allow(dead_code)] // each test target uses part of it

use core::task::Poll;
use specula_core::{Clock, Counters, Readback, VirtualClock};

/// Counters accumulating "on a device"; a readback copies them when started and becomes ready
/// `latency_ns` later.
pub struct SimDevice<'c, const K: usize> {
    /// The clock readbacks complete against.
    pub clock: &'c VirtualClock,
    /// The device's live counters.
    pub totals: Counters<K>,
    /// How long a readback takes.
    pub latency_ns: u64,
    in_flight: Option<(Counters<K>, u64)>,
    /// Readback number i (0-based) fails to start when bit `i % 64` is set; when bit
    /// `(i + 32) % 64` is set, it starts but completes with an error.
    pub fail_mask: u64,
    started: u64,
    fail_on_poll: bool,
}

impl<'c, const K: usize> SimDevice<'c, K> {
    /// A device with zero counters whose readbacks take `latency_ns`.
    pub fn new(clock: &'c VirtualClock, latency_ns: u64) -> Self {
        Self {
            clock,
            totals: Counters::ZERO,
            latency_ns,
            in_flight: None,
            fail_mask: 0,
            started: 0,
            fail_on_poll: false,
        }
    }
}

/// A failed simulated readback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimError;

impl<const K: usize> Readback<K> for SimDevice<'_, K> {
    type Error = SimError;
    fn start(&mut self) -> Result<(), SimError> {
        assert!(self.in_flight.is_none(), "a second readback was started");
        let n = self.started;
        self.started += 1;
        if (self.fail_mask >> (n % 64)) & 1 == 1 {
            return Err(SimError);
        }
        self.in_flight = Some((self.totals, self.clock.now_ns() + self.latency_ns));
        self.fail_on_poll = (self.fail_mask >> ((n + 32) % 64)) & 1 == 1;
        Ok(())
    }
    fn poll(&mut self) -> Poll<Result<Counters<K>, SimError>> {
        match self.in_flight {
            Some((c, ready)) if self.clock.now_ns() >= ready => {
                self.in_flight = None;
                if self.fail_on_poll {
                    return Poll::Ready(Err(SimError));
                }
                Poll::Ready(Ok(c))
            }
            Some(_) => Poll::Pending,
            None => Poll::Ready(Err(SimError)),
        }
    }
    fn flush(&mut self) -> Result<Counters<K>, SimError> {
        self.in_flight = None;
        Ok(self.totals)
    }
}

/// A small deterministic generator (SplitMix64) for step jitter and acceptance patterns.
pub struct Mix(pub u64);

impl Mix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
