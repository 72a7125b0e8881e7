//! NVRTC compilation of the kernel text, with library checks first and a per-process cache.

use crate::error::CudaError;
use std::sync::Mutex;

/// True if the CUDA driver library loads **and** exports every entry point this crate's path
/// calls through cudarc ([`DRIVER_SYMBOLS`]). cudarc resolves a driver function on its first
/// call and panics when the library or the symbol is missing; a stub or partial `libcuda` (a
/// container's compat shim, a driver older than the API) must give
/// [`CudaError::NoDriver`](crate::CudaError::NoDriver) instead, so the check runs before cudarc
/// touches the driver. Checked once per process.
#[must_use]
pub fn driver_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| driver_library_complete(&driver_candidates()))
}

/// The driver entry points (CUDA ≥ 12.0 names) that opening a device, compiling, launching,
/// graph capture and the readback reach through cudarc.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
];

/// The file names cudarc's loader tries for the driver, in its order (its Windows names with
/// a CUDA version in them aside): the first that loads is the one it uses.
fn driver_candidates() -> Vec<String> {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let mut names = Vec::new();
    for lib in ["cuda", "nvcuda"] {
        names.push(format!("{DLL_PREFIX}{lib}{DLL_SUFFIX}"));
        names.push(format!("{DLL_PREFIX}{lib}64{DLL_SUFFIX}"));
        for major in ["13", "12", "11", "10", "9", "1"] {
            names.push(format!("{DLL_PREFIX}{lib}{DLL_SUFFIX}.{major}"));
        }
    }
    names
}

/// Whether the first of `candidates` that loads exports every one of [`DRIVER_SYMBOLS`].
fn driver_library_complete(candidates: &[String]) -> bool {
    let Some(lib) = candidates.iter().find_map(|name| {
        // SAFETY: loading the driver runs only its initialisers (cudarc loads the same file);
        // no symbol is called here.
        unsafe { libloading::Library::new(name) }.ok()
    }) else {
        return false;
    };
    DRIVER_SYMBOLS.iter().all(|sym| {
        // SAFETY: the symbol is only looked up, never called, so its type does not matter.
        unsafe { lib.get::<*const core::ffi::c_void>(sym.as_bytes()) }.is_ok()
    })
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

/// Compiles an arbitrary `source` (named `name` in messages) to PTX for `arch` with exactly the
/// options the kernel gets ([`nvrtc_options`]), uncached. For tooling that compiles the kernel
/// text together with extra code, e.g. the per-pass probe wrappers that `scripts/kernel-report.py`
/// disassembles (`core/kernels/specula_probes.cu`).
pub fn compile_source_ptx(source: &str, name: &str, arch: &str) -> Result<String, CudaError> {
    crate::nvrtc::compile(source, name, &nvrtc_options(arch)).map_err(|e| match e {
        crate::nvrtc::Failure::Missing => CudaError::NoNvrtc,
        crate::nvrtc::Failure::Refused(log) => CudaError::Nvrtc { log },
    })
}

static CACHE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
static TREE_CACHE: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Compiles [`specula_core::kernels::SOURCE`] to PTX for `arch` (e.g. `"compute_90"`), once per
/// process and architecture.
pub fn compile_ptx(arch: &str) -> Result<String, CudaError> {
    cached(
        &CACHE,
        specula_core::kernels::SOURCE,
        "specula_verify.cu",
        arch,
    )
}

/// Compiles [`specula_core::kernels::TREE_SOURCE`] (the chain text, then the tree entry
/// `specula_verify_tree`) to PTX for `arch`, once per process and architecture. A
/// [`CudaDevice`](crate::CudaDevice) calls it on its first tree launch only, so runtimes that
/// verify chains alone never compile it.
pub fn compile_tree_ptx(arch: &str) -> Result<String, CudaError> {
    cached(
        &TREE_CACHE,
        specula_core::kernels::TREE_SOURCE,
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
