//! NVRTC compilation of the kernel text, with library checks first and a per-process cache.

use crate::error::CudaError;
use std::sync::Mutex;

/// True if the CUDA driver library can be loaded (cudarc would panic on first use otherwise).
#[must_use]
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True if an NVRTC library (CUDA 11.2 to 13; or the file `SPECULA_NVRTC` names) can be loaded.
#[must_use]
pub fn nvrtc_present() -> bool {
    crate::nvrtc::present()
}

/// The version of the NVRTC library that loads (`(major, minor)`), if one does.
#[must_use]
pub fn nvrtc_version() -> Option<(i32, i32)> {
    crate::nvrtc::version()
}

/// The NVRTC options the kernel is always compiled with: no FMA contraction, IEEE division and
/// square root, no flush-to-zero (core/DETERMINISM.md), for virtual architecture `arch`
/// (`compute_80`, ...).
#[must_use]
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        "--fmad=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
        format!("--gpu-architecture={arch}"),
    ]
}

static CACHE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Compiles [`specula_core::kernels::SOURCE`] to PTX for `arch` (e.g. `"compute_90"`), once per
/// process and architecture.
pub fn compile_ptx(arch: &str) -> Result<String, CudaError> {
    // A poisoned lock only means another thread panicked mid-insert: the Vec is still valid.
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, ptx)) = cache.iter().find(|(a, _)| a == arch) {
        return Ok(ptx.clone());
    }
    let ptx = crate::nvrtc::compile(
        specula_core::kernels::SOURCE,
        "specula_verify.cu",
        &nvrtc_options(arch),
    )
    .map_err(|e| match e {
        crate::nvrtc::Failure::Missing => CudaError::NoNvrtc,
        crate::nvrtc::Failure::Refused(log) => CudaError::Nvrtc { log },
    })?;
    cache.push((arch.to_owned(), ptx.clone()));
    Ok(ptx)
}
