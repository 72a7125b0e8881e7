//! The CUDA backend's tests that need no toolkit (`specula-cuda`), one module per subject, in one
//! binary: typed errors without a driver or device, and the device tests, which print SKIPPED and
//! pass without a device (CI) unless `SPECULA_REQUIRE_DEVICE` is set (`scripts/gpu-check.sh` runs
//! them on a GPU host). The fast tier; the kernel compiles are the `toolchain` binary.

mod support;

#[cfg(target_os = "linux")]
mod broken_driver;
mod device;
mod tree_device;
