//! The ROCm backend's tests that need no compiler (`specula-rocm`), one module per subject, in one
//! binary: typed errors without a device, and the device tests, which print SKIPPED and pass
//! without a ROCm device (CI has none) unless `SPECULA_REQUIRE_DEVICE` is set. The fast tier; the
//! kernel compiles are the `toolchain` binary.

mod support;

mod device;
mod no_device;
mod tree_device;
