//! A simulated device for the collector tests: counters "on the device", readbacks that
//! complete after a latency on a virtual clock (several may be in flight), scripted failures,
//! and readbacks that never complete.

#![allow(dead_code)] // each test target uses part of it

use core::task::Poll;
use specula_core::{Clock, Counters, Readback, VirtualClock};
use std::collections::VecDeque;

pub mod sweep;

/// One simulated copy in flight.
#[derive(Clone, Copy, Debug)]
struct Copy<const K: usize> {
    counters: Counters<K>,
    ready_ns: u64,
    fail_on_poll: bool,
}

/// Counters accumulating "on a device"; a readback copies them when started and becomes ready
/// `latency_ns` later (never, while `stuck` is set at its start).
pub struct SimDevice<'c, const K: usize> {
    /// The clock readbacks complete against.
    pub clock: &'c VirtualClock,
    /// The device's live counters.
    pub totals: Counters<K>,
    /// How long a readback takes.
    pub latency_ns: u64,
    /// Each readback's latency is uniform in `latency_ns ± latency_jitter_ns`; the copies
    /// complete in start order (one copy stream), so a slow one delays those behind it.
    pub latency_jitter_ns: u64,
    /// Draws the latency jitter.
    pub jitter_rng: Mix,
    /// Readbacks started while this is set never complete.
    pub stuck: bool,
    /// How many readbacks may be in flight (what `max_in_flight` reports).
    pub capacity: usize,
    /// Whether `abandon` releases the oldest readback.
    pub can_abandon: bool,
    in_flight: VecDeque<Copy<K>>,
    /// Readback number i (0-based) fails to start when bit `i % 64` is set; when bit
    /// `(i + 32) % 64` is set, it starts but completes with an error.
    pub fail_mask: u64,
    started: u64,
    /// When each successfully started readback becomes (or became) ready on the device, in start
    /// order (`u64::MAX`: never).
    pub ready_times: Vec<u64>,
    /// How many readbacks were abandoned.
    pub abandoned: u32,
    /// The most readbacks ever in flight at once.
    pub max_seen_in_flight: usize,
}

impl<'c, const K: usize> SimDevice<'c, K> {
    /// A device with zero counters whose readbacks take `latency_ns`, one at a time.
    pub fn new(clock: &'c VirtualClock, latency_ns: u64) -> Self {
        Self {
            clock,
            totals: Counters::ZERO,
            latency_ns,
            latency_jitter_ns: 0,
            jitter_rng: Mix(0x5EED),
            stuck: false,
            capacity: 1,
            can_abandon: false,
            in_flight: VecDeque::new(),
            fail_mask: 0,
            started: 0,
            ready_times: Vec::new(),
            abandoned: 0,
            max_seen_in_flight: 0,
        }
    }

    /// Readbacks in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Readbacks started (including those that failed to start).
    pub fn starts(&self) -> u64 {
        self.started
    }
}

/// A failed simulated readback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimError;

impl<const K: usize> Readback<K> for SimDevice<'_, K> {
    type Error = SimError;
    fn start(&mut self) -> Result<(), SimError> {
        assert!(
            self.in_flight.len() < self.capacity.max(1),
            "a readback was started beyond the device's capacity"
        );
        let n = self.started;
        self.started += 1;
        if (self.fail_mask >> (n % 64)) & 1 == 1 {
            return Err(SimError);
        }
        let ready_ns = if self.stuck {
            u64::MAX
        } else {
            let j = self.latency_jitter_ns.min(self.latency_ns);
            let latency = self.latency_ns - j + self.jitter_rng.below(2 * j + 1);
            let after = self.in_flight.back().map_or(0, |c| c.ready_ns);
            self.clock.now_ns().saturating_add(latency).max(after)
        };
        self.ready_times.push(ready_ns);
        self.in_flight.push_back(Copy {
            counters: self.totals,
            ready_ns,
            fail_on_poll: (self.fail_mask >> ((n + 32) % 64)) & 1 == 1,
        });
        self.max_seen_in_flight = self.max_seen_in_flight.max(self.in_flight.len());
        Ok(())
    }
    fn poll(&mut self) -> Poll<Result<Counters<K>, SimError>> {
        match self.in_flight.front() {
            Some(c) if self.clock.now_ns() >= c.ready_ns => {
                let c = *c;
                self.in_flight.pop_front();
                if c.fail_on_poll {
                    return Poll::Ready(Err(SimError));
                }
                Poll::Ready(Ok(c.counters))
            }
            Some(_) => Poll::Pending,
            None => Poll::Ready(Err(SimError)),
        }
    }
    fn flush(&mut self) -> Result<Counters<K>, SimError> {
        self.in_flight.clear();
        Ok(self.totals)
    }
    fn max_in_flight(&self) -> usize {
        self.capacity
    }
    fn abandon(&mut self) -> bool {
        if self.can_abandon && self.in_flight.pop_front().is_some() {
            self.abandoned += 1;
            return true;
        }
        false
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
