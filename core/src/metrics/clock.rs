//! The [`Clock`] seam: a monotonic time source in nanoseconds, supplied by the caller.

use core::cell::Cell;

/// A monotonic clock. `now_ns` never decreases; its epoch is arbitrary.
pub trait Clock {
    /// Nanoseconds since the clock's epoch.
    fn now_ns(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// A clock moved by hand: for tests, simulations and replaying traces.
#[derive(Debug, Default)]
pub struct VirtualClock(Cell<u64>);

impl VirtualClock {
    /// A clock at `t` ns.
    pub const fn new(t: u64) -> Self {
        Self(Cell::new(t))
    }
    /// Moves the clock forward by `dt` ns (saturating).
    pub fn advance(&self, dt: u64) {
        self.0.set(self.0.get().saturating_add(dt));
    }
    /// Sets the clock to `t` unless that would move it backwards.
    pub fn set(&self, t: u64) {
        self.0.set(self.0.get().max(t));
    }
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> u64 {
        self.0.get()
    }
}
