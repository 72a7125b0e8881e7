//! What the device modules share.

use specula_cuda::CudaDevice;
use std::sync::Arc;

/// Device 0, or `None` after printing SKIPPED when this machine has no usable CUDA driver or
/// device; with `SPECULA_REQUIRE_DEVICE` set (a GPU host) that is a failure instead.
pub fn device() -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => {
            println!(
                "device 0 ({}), NVRTC {:?}",
                d.arch(),
                specula_cuda::nvrtc_version()
            );
            Some(Arc::new(d))
        }
        Err(e) => {
            // On the GPU host (scripts/gpu-check.sh sets this) a skip would hide a failure.
            assert!(
                std::env::var_os("SPECULA_REQUIRE_DEVICE").is_none(),
                "SPECULA_REQUIRE_DEVICE is set but no device opened: {e}"
            );
            println!("SKIPPED: no usable CUDA device ({e})");
            None
        }
    }
}
