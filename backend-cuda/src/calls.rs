//! The counting wrapper every driver call of this crate goes through, so a test can assert
//! that the decode-step path (launch, readback start, poll) made no synchronising call.

use crate::error::CudaError;
use cudarc::driver::DriverError;
use std::cell::Cell;

/// Whether a driver call can make the host wait for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blocking {
    /// Enqueues work or queries state; returns at once.
    No,
    /// May wait for the device (synchronise, pageable copies, allocation, module load).
    Yes,
}

/// Driver calls made by this crate on the current thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Every driver call.
    pub calls: u64,
    /// The calls that can block the host until the device catches up.
    pub synchronizing: u64,
}

thread_local! {
    static COUNTS: Cell<CallCounts> = const { Cell::new(CallCounts { calls: 0, synchronizing: 0 }) };
}

/// The driver calls this crate made on the calling thread so far (thread-local, so parallel
/// tests do not disturb each other). Take one before and one after the code under test.
#[must_use]
pub fn call_counts() -> CallCounts {
    COUNTS.with(Cell::get)
}

/// Counts one driver call and converts its error.
pub(crate) fn call<T>(
    name: &'static str,
    blocking: Blocking,
    f: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, CudaError> {
    COUNTS.with(|c| {
        let mut v = c.get();
        v.calls += 1;
        if blocking == Blocking::Yes {
            v.synchronizing += 1;
        }
        c.set(v);
    });
    f().map_err(|error| CudaError::Driver { call: name, error })
}
