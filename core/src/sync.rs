//! Every atomic and fence the crate uses, in one place.
//!
//! Under `cfg(loom)` these are loom's model-checked types; otherwise portable-atomic's, which
//! compile to plain loads and stores on every target that has them (thumbv6m, riscv32imc) and
//! fall back to a `critical-section` only where the user enables that pass-through feature.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(all(not(loom), target_has_atomic = "64"))]
pub(crate) use portable_atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use portable_atomic::{AtomicU32, Ordering, fence};

/// The widest native atomic word: the seqlock stamp uses it.
#[cfg(any(loom, target_has_atomic = "64"))]
pub(crate) type StampAtomic = AtomicU64;
/// The widest native atomic word: the seqlock stamp uses it.
#[cfg(not(any(loom, target_has_atomic = "64")))]
pub(crate) type StampAtomic = AtomicU32;
/// The integer type held by [`StampAtomic`].
#[cfg(any(loom, target_has_atomic = "64"))]
pub(crate) type Stamp = u64;
/// The integer type held by [`StampAtomic`].
#[cfg(not(any(loom, target_has_atomic = "64")))]
pub(crate) type Stamp = u32;

/// Called in every retry loop: lets loom schedule the writer, and hints the CPU otherwise.
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
