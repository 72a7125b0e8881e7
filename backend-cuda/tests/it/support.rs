//! What the device modules share.

use specula_cuda::CudaDevice;
use specula_cuda::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use std::sync::Arc;

/// `data` in new device memory on `s`, made the way an engine makes it, with calls every
/// supported cudarc major has (`clone_htod` is 0.18 and later; `memcpy_stod` is deprecated
/// from then).
pub fn upload<T: DeviceRepr + ValidAsZeroBits>(s: &Arc<CudaStream>, data: &[T]) -> CudaSlice<T> {
    let mut d = s.alloc_zeros::<T>(data.len()).unwrap();
    s.memcpy_htod(data, &mut d).unwrap();
    d
}

/// `src` copied back to the host (`clone_dtoh` of 0.18 and later, in every major's calls).
pub fn download<T: DeviceRepr + Default + Clone>(
    s: &Arc<CudaStream>,
    src: &CudaSlice<T>,
) -> Vec<T> {
    let mut out = vec![T::default(); src.len()];
    s.memcpy_dtoh(src, &mut out).unwrap();
    out
}

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
