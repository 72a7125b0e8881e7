//! NVRTC compilation of the kernel text ([`compile_ptx`]), with the options it always gets and a
//! per-process cache.

use crate::error::CudaError;
use crate::ffi::{self, RtcFailure};
use std::sync::Mutex;

/// True if an NVRTC library (CUDA 11.2 to 13; or the file `SPECULA_NVRTC` names) can be loaded.
#[must_use]
pub fn nvrtc_present() -> bool {
    ffi::rtc_present()
}

/// The version of the NVRTC library that loads (`(major, minor)`), if one does.
#[must_use]
pub fn nvrtc_version() -> Option<(i32, i32)> {
    ffi::rtc_version()
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

/// Compiles an arbitrary `source` (named `name` in messages) to PTX for `arch` with exactly the
/// options the kernel gets ([`nvrtc_options`]), uncached. For tooling that compiles the kernel
/// text together with extra code, e.g. the per-pass probe wrappers that `scripts/kernel-report.py`
/// disassembles (`core/kernels/specula_probes.cu`).
pub fn compile_source_ptx(source: &str, name: &str, arch: &str) -> Result<String, CudaError> {
    ffi::rtc_compile(source, name, &nvrtc_options(arch)).map_err(|e| match e {
        RtcFailure::Missing => CudaError::NoNvrtc,
        RtcFailure::Refused(log) => CudaError::Nvrtc { log },
    })
}

static CACHE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
static TREE_CACHE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Compiles [`specula_core::gpu::kernels::SOURCE`] to PTX for `arch` (e.g. `"compute_90"`), once per
/// process and architecture.
pub fn compile_ptx(arch: &str) -> Result<String, CudaError> {
    cached(
        &CACHE,
        specula_core::gpu::kernels::SOURCE,
        "specula_verify.cu",
        arch,
    )
}

/// Compiles [`specula_core::gpu::kernels::TREE_SOURCE`] (the chain text, then the tree entry
/// `specula_verify_tree`) to PTX for `arch`, once per process and architecture. A
/// [`CudaDevice`](crate::CudaDevice) calls it on its first tree use only, so runtimes that
/// verify chains alone never compile it.
pub fn compile_tree_ptx(arch: &str) -> Result<String, CudaError> {
    cached(
        &TREE_CACHE,
        specula_core::gpu::kernels::TREE_SOURCE,
        "specula_tree.cu",
        arch,
    )
}

fn cached(
    cache: &Mutex<Vec<(String, String)>>,
    source: &str,
    name: &str,
    arch: &str,
) -> Result<String, CudaError> {
    // A poisoned lock only means another thread panicked mid-insert: the Vec is still valid.
    let mut cache = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, ptx)) = cache.iter().find(|(a, _)| a == arch) {
        return Ok(ptx.clone());
    }
    let ptx = compile_source_ptx(source, name, arch)?;
    cache.push((arch.to_owned(), ptx.clone()));
    Ok(ptx)
}
