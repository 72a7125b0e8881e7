//! The raw calls into NVIDIA's libraries, so the rest of the crate never meets a raw status:
//!
//! * the driver API (reached through cudarc) goes through [`call`], which counts every call and
//!   whether it can block, so a test can assert that the decode-step path (launch, readback
//!   start, poll) made no synchronising call ([`call_counts`]);
//! * [`driver_present`] checks that the driver library exports everything this crate calls
//!   before cudarc touches it (cudarc panics on a missing symbol);
//! * NVRTC is loaded at run time with `libloading` (the seven calls this crate needs).
//!
//! Why NVRTC is not cudarc's wrapper: cudarc fixes the library names it tries at build time, from
//! the CUDA version feature (`libnvrtc.so`, `.so.12`, ... for the 12.6 API this crate uses), so
//! a host with only CUDA 13's `libnvrtc.so.13` (a Python wheel, or a toolkit whose unversioned
//! link is not on the loader path) reports no NVRTC although a working one is installed; and it
//! panics where a library is missing. The program API used here (create, compile, log, PTX,
//! destroy) is unchanged from CUDA 11.2 to 13, so one loader serves every version, and
//! `SPECULA_NVRTC` may name the library file outright.

use crate::error::CudaError;
use core::ffi::{c_char, c_int};
use cudarc::driver::DriverError;
use libloading::Library;
use std::cell::Cell;
use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

// ------------------------------------------------------------------ the driver, counted

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

// ------------------------------------------------------------------ the driver library

/// True if the CUDA driver library loads **and** exports every entry point this crate's path
/// calls through cudarc ([`DRIVER_SYMBOLS`]) **and** cudarc's own loader accepts it. cudarc
/// panics when the library or a symbol is missing; a stub or partial `libcuda` (a container's
/// compat shim, a driver older than the API) must give
/// [`CudaError::NoDriver`](crate::CudaError::NoDriver) instead, so the check runs before cudarc
/// touches the driver. Checked once per process.
///
/// cudarc 0.19.5 and later resolve a driver function on its first call, so the symbol check
/// is the whole answer. Earlier releases (every 0.16 to 0.18 one, 0.19.0 to 0.19.4) resolve
/// the whole driver API of their CUDA version feature on their first call and panic if the
/// library lacks any one function (a driver older than the bindings); that first call is made
/// here, once, with the panic caught (`cudarc_loads`): its message is printed by the panic
/// hook, and a build with `panic = "abort"` aborts there instead.
#[must_use]
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| driver_library_complete(&driver_candidates()) && cudarc_loads())
}

/// Whether cudarc's first driver call returns rather than panics: `cuDriverGetVersion` (in
/// [`DRIVER_SYMBOLS`]; its result does not matter). With cudarc's dynamic loading that first
/// call loads the library (all of its API before 0.19.5, this one function from then); with
/// dynamic or static linking it is a plain call.
fn cudarc_loads() -> bool {
    let mut version = 0;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `version` is a valid out-pointer for the call's duration; the function only
        // writes the driver's version there.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
    }))
    .is_ok()
}

/// The driver entry points (CUDA ≥ 12.0 names) that opening a device, compiling, launching,
/// graph capture and the readback reach through cudarc.
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
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
        unsafe { Library::new(name) }.ok()
    }) else {
        return false;
    };
    DRIVER_SYMBOLS.iter().all(|sym| {
        // SAFETY: the symbol is only looked up, never called, so its type does not matter.
        unsafe { lib.get::<*const core::ffi::c_void>(sym.as_bytes()) }.is_ok()
    })
}

// ------------------------------------------------------------------ NVRTC

/// `nvrtcResult`, read as an integer (never as an enum a later release could extend).
type Status = c_int;
/// `nvrtcProgram`.
type Program = *mut c_void;
/// `NVRTC_SUCCESS`.
const SUCCESS: Status = 0;

/// The variable that may name the NVRTC library file; when set, it is the only file tried.
pub const NVRTC_ENV: &str = "SPECULA_NVRTC";

/// Library names tried when [`NVRTC_ENV`] is not set, newest first: through the dynamic
/// loader's search, then in the toolkit folders ([`toolkit_lib_dirs`]).
#[cfg(not(windows))]
const NAMES: &[&str] = &[
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
];
#[cfg(windows)]
const NAMES: &[&str] = &[
    "nvrtc64_130_0.dll",
    "nvrtc64_120_0.dll",
    "nvrtc64_112_0.dll",
];

#[allow(non_snake_case)]
struct Api {
    nvrtcVersion: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    nvrtcCreateProgram: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    nvrtcCompileProgram: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    nvrtcGetProgramLogSize: unsafe extern "C" fn(Program, *mut usize) -> Status,
    nvrtcGetProgramLog: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    nvrtcGetPTXSize: unsafe extern "C" fn(Program, *mut usize) -> Status,
    nvrtcGetPTX: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    nvrtcDestroyProgram: unsafe extern "C" fn(*mut Program) -> Status,
    // Keeps the functions above loaded; never unloaded (it lives in a static).
    _lib: Library,
}

macro_rules! sym {
    ($lib:expr, $name:ident) => {{
        let name = concat!(stringify!($name), "\0").as_bytes();
        // SAFETY: the symbol's type is inferred from the field it is stored in, which is the
        // signature in nvrtc.h; the pointer is only used while the library (stored beside it,
        // never unloaded) lives.
        let s: libloading::Symbol<'_, _> = unsafe { $lib.get(name) }.ok()?;
        *s
    }};
}

impl Api {
    fn open() -> Option<Self> {
        // A file named in the variable is the only one tried: falling back to another version
        // would hide a mistake.
        let candidates: Vec<PathBuf> = match std::env::var_os(NVRTC_ENV) {
            Some(path) => vec![path.into()],
            None => {
                // The loader's own search first, then the toolkit folders it often lacks.
                let mut c: Vec<PathBuf> = NAMES.iter().map(PathBuf::from).collect();
                for dir in toolkit_lib_dirs() {
                    c.extend(NAMES.iter().map(|n| dir.join(n)));
                }
                c
            }
        };
        let lib = candidates
            .into_iter()
            // SAFETY: loading NVRTC runs only its (side-effect free) initialisers.
            .find_map(|p| unsafe { Library::new(p) }.ok())?;
        Some(Self {
            nvrtcVersion: sym!(lib, nvrtcVersion),
            nvrtcCreateProgram: sym!(lib, nvrtcCreateProgram),
            nvrtcCompileProgram: sym!(lib, nvrtcCompileProgram),
            nvrtcGetProgramLogSize: sym!(lib, nvrtcGetProgramLogSize),
            nvrtcGetProgramLog: sym!(lib, nvrtcGetProgramLog),
            nvrtcGetPTXSize: sym!(lib, nvrtcGetPTXSize),
            nvrtcGetPTX: sym!(lib, nvrtcGetPTX),
            nvrtcDestroyProgram: sym!(lib, nvrtcDestroyProgram),
            _lib: lib,
        })
    }
}

/// `$CUDA_PATH/lib64`, `$CUDA_HOME/lib64`, then `/usr/local/cuda/lib64` (`bin` folders on
/// Windows): where a CUDA toolkit keeps NVRTC when the dynamic loader's search does not look.
fn toolkit_lib_dirs() -> Vec<PathBuf> {
    let sub = if cfg!(windows) { "bin" } else { "lib64" };
    let mut dirs: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|root| PathBuf::from(root).join(sub))
        .collect();
    if cfg!(unix) {
        dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    }
    dirs
}

fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(Api::open).as_ref()
}

/// True if an NVRTC library with every call this crate needs could be loaded.
pub(crate) fn rtc_present() -> bool {
    api().is_some()
}

/// The loaded NVRTC's version (`(major, minor)`), if one loads.
pub(crate) fn rtc_version() -> Option<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let s = unsafe { (api.nvrtcVersion)(&mut major, &mut minor) };
    (s == SUCCESS).then_some((major, minor))
}

/// Why [`rtc_compile`] failed.
#[derive(Debug)]
pub(crate) enum RtcFailure {
    /// No NVRTC library loads.
    Missing,
    /// NVRTC refused the program: its log, or the failing call and status.
    Refused(String),
}

/// Owns an `nvrtcProgram` and destroys it on every path.
struct Owned<'a>(&'a Api, Program);

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        // SAFETY: a program created by nvrtcCreateProgram, destroyed once, here.
        let _ = unsafe { (self.0.nvrtcDestroyProgram)(&mut self.1) };
    }
}

fn check(call: &str, s: Status) -> Result<(), RtcFailure> {
    if s == SUCCESS {
        Ok(())
    } else {
        Err(RtcFailure::Refused(format!(
            "{call} returned NVRTC status {s}"
        )))
    }
}

/// Reads a NUL-terminated NVRTC string of `size` bytes (terminator included) through `get`.
fn read(size: usize, get: impl FnOnce(*mut c_char) -> Status) -> Result<String, Status> {
    let mut buf = vec![0u8; size.max(1)];
    let s = get(buf.as_mut_ptr().cast());
    if s != SUCCESS {
        return Err(s);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf.truncate(end);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Compiles `source` (named `name` in messages) with `options` and returns the PTX text.
pub(crate) fn rtc_compile(
    source: &str,
    name: &str,
    options: &[String],
) -> Result<String, RtcFailure> {
    let api = api().ok_or(RtcFailure::Missing)?;
    let nul = |s: &str| CString::new(s).map_err(|_| RtcFailure::Refused(format!("NUL in {s:?}")));
    let src = nul(source)?;
    let cname = nul(name)?;
    let opts = options
        .iter()
        .map(|o| nul(o))
        .collect::<Result<Vec<_>, _>>()?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let n_opts = c_int::try_from(ptrs.len()).map_err(|_| RtcFailure::Refused("options".into()))?;
    let mut prog: Program = core::ptr::null_mut();
    // SAFETY: NUL-terminated source and name that outlive the call; no headers.
    let s = unsafe {
        (api.nvrtcCreateProgram)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            core::ptr::null(),
            core::ptr::null(),
        )
    };
    check("nvrtcCreateProgram", s)?;
    let prog = Owned(api, prog);
    // SAFETY: a live program; `ptrs` holds `n_opts` NUL-terminated strings alive during the call.
    let compiled = unsafe { (api.nvrtcCompileProgram)(prog.1, n_opts, ptrs.as_ptr()) };
    if compiled != SUCCESS {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        let log = if unsafe { (api.nvrtcGetProgramLogSize)(prog.1, &mut size) } == SUCCESS {
            // SAFETY: the buffer `read` passes holds `size` bytes, what NVRTC writes.
            read(size, |p| unsafe { (api.nvrtcGetProgramLog)(prog.1, p) }).unwrap_or_default()
        } else {
            String::new()
        };
        return Err(RtcFailure::Refused(if log.is_empty() {
            format!("nvrtcCompileProgram returned NVRTC status {compiled}")
        } else {
            log
        }));
    }
    let mut size = 0usize;
    // SAFETY: a live, compiled program and a valid out-pointer.
    check("nvrtcGetPTXSize", unsafe {
        (api.nvrtcGetPTXSize)(prog.1, &mut size)
    })?;
    // SAFETY: the buffer `read` passes holds `size` bytes, what NVRTC writes.
    read(size, |p| unsafe { (api.nvrtcGetPTX)(prog.1, p) })
        .map_err(|s| RtcFailure::Refused(format!("nvrtcGetPTX returned NVRTC status {s}")))
}
