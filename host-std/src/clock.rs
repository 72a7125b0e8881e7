//! [`StdClock`]: the monotonic clock of a std runtime.

use specula_core::Clock;
use std::time::{Duration, Instant};

/// A monotonic clock over [`Instant`], in nanoseconds since the clock was created.
///
/// `Copy`: every copy shares the same epoch, so the decode loop, the collector and every sink
/// can hold their own copy and still compare times (a snapshot's `at_ns` with a sink's grid).
///
/// ```
/// use specula::clock::StdClock;
/// use specula::specula_core::Clock;
/// let clock = StdClock::new();
/// let a = clock.now_ns();
/// assert!(clock.now_ns() >= a);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct StdClock {
    epoch: Instant,
}

impl StdClock {
    /// A clock whose epoch (time 0) is now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }

    /// The instant this clock calls 0.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The [`Instant`] at `ns` on this clock (saturating at the far future).
    pub fn instant_at(&self, ns: u64) -> Instant {
        self.epoch
            .checked_add(Duration::from_nanos(ns))
            .unwrap_or_else(|| self.epoch + Duration::from_secs(u32::MAX.into()))
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds last 584 years; saturate rather than wrap past that.
        duration_ns(self.epoch.elapsed())
    }
}

/// A [`Duration`] as whole nanoseconds, saturating (for interval periods).
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
