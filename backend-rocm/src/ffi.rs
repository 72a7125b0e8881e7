//! Hand-written declarations of the few HIP runtime and hiprtc entry points this crate uses,
//! resolved at run time with `libloading`.
//!
//! Every status is read as a plain `i32`, never as a Rust enum, so an error code added by a later
//! ROCm release cannot produce an invalid enum value. The `hip-sys` feature checks these
//! constants against hip-sys's bindgen output (the `layout_vs_hip_sys` tests below).

use crate::error::RocmError;
use core::ffi::{c_char, c_int, c_uint, c_void};
use libloading::Library;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `hipError_t` / `hiprtcResult`, read as an integer.
pub(crate) type Status = c_int;
/// `hipStream_t`.
pub(crate) type RawStream = *mut c_void;
/// `hipEvent_t`.
pub(crate) type RawEvent = *mut c_void;
/// `hipModule_t`.
pub(crate) type RawModule = *mut c_void;
/// `hipFunction_t`.
pub(crate) type RawFunction = *mut c_void;
/// `hiprtcProgram`.
pub(crate) type RawProgram = *mut c_void;
/// `hipGraph_t`.
pub(crate) type RawGraph = *mut c_void;
/// `hipGraphExec_t`.
pub(crate) type RawGraphExec = *mut c_void;
/// `hipStreamCaptureModeThreadLocal`.
pub(crate) const CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

/// `hipSuccess` and `HIPRTC_SUCCESS`.
pub(crate) const SUCCESS: Status = 0;
/// `hipErrorInsufficientDriver`: no usable kernel driver (`/dev/kfd` missing).
pub(crate) const ERROR_INSUFFICIENT_DRIVER: Status = 35;
/// `hipErrorNoDevice`.
pub(crate) const ERROR_NO_DEVICE: Status = 100;
/// `hipErrorNotReady`: what `hipEventQuery` returns while work is pending.
pub(crate) const ERROR_NOT_READY: Status = 600;
/// `HIPRTC_ERROR_COMPILATION`.
pub(crate) const HIPRTC_ERROR_COMPILATION: Status = 6;
/// `hipMemcpyHostToDevice`.
pub(crate) const MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub(crate) const MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipMemcpyDeviceToDevice`.
pub(crate) const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `hipStreamNonBlocking`: no implicit synchronisation with the null stream.
pub(crate) const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDisableTiming`.
pub(crate) const EVENT_DISABLE_TIMING: c_uint = 2;
/// `hipHostMallocDefault`.
pub(crate) const HOST_MALLOC_DEFAULT: c_uint = 0;
/// Offset of `gcnArchName` (`char[256]`) in ROCm 5's `hipDeviceProp_t`, filled by the
/// `hipGetDeviceProperties` symbol (checked against hip-sys with the `hip-sys` feature).
pub(crate) const GCN_ARCH_NAME_OFFSET_R0000: usize = 396;
/// Offset of `gcnArchName` in ROCm 6's `hipDeviceProp_tR0600`, filled by
/// `hipGetDevicePropertiesR0600`.
pub(crate) const GCN_ARCH_NAME_OFFSET_R0600: usize = 1160;
/// Bytes given to `hipGetDeviceProperties*`: far more than either layout needs (792 and 1472
/// bytes), so a layout that grew cannot write out of bounds.
pub(crate) const DEVICE_PROP_BUFFER: usize = 8192;

macro_rules! api {
    ($(#[$m:meta])* $name:ident { $($f:ident : fn($($a:ty),*) -> $r:ty,)* }) => {
        $(#[$m])*
        #[allow(non_snake_case)]
        pub(crate) struct $name {
            $(pub(crate) $f: unsafe extern "C" fn($($a),*) -> $r,)*
        }
        impl $name {
            /// Resolves every entry point in `lib`.
            fn load(lib: &Library, what: &str) -> Result<Self, String> {
                Ok(Self {
                    $($f: {
                        // SAFETY: the declared signature is the one in the HIP headers
                        // (hip_runtime_api.h / hiprtc.h) for this symbol; the pointer is
                        // only used while `lib` is alive (it is stored in a static and
                        // never unloaded).
                        let sym = unsafe {
                            lib.get::<unsafe extern "C" fn($($a),*) -> $r>(
                                concat!(stringify!($f), "\0").as_bytes(),
                            )
                        };
                        *sym.map_err(|e| format!("{what}: symbol {}: {e}", stringify!($f)))?
                    },)*
                })
            }
        }
    };
}

api! {
    /// The HIP runtime entry points (libamdhip64).
    HipApi {
        hipGetDeviceCount: fn(*mut c_int) -> Status,
        hipSetDevice: fn(c_int) -> Status,
        hipRuntimeGetVersion: fn(*mut c_int) -> Status,
        hipGetDeviceProperties: fn(*mut c_void, c_int) -> Status,
        hipMalloc: fn(*mut *mut c_void, usize) -> Status,
        hipFree: fn(*mut c_void) -> Status,
        hipHostMalloc: fn(*mut *mut c_void, usize, c_uint) -> Status,
        hipHostFree: fn(*mut c_void) -> Status,
        hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_int, RawStream) -> Status,
        hipMemsetAsync: fn(*mut c_void, c_int, usize, RawStream) -> Status,
        hipMemsetD32Async: fn(*mut c_void, c_int, usize, RawStream) -> Status,
        hipStreamCreateWithFlags: fn(*mut RawStream, c_uint) -> Status,
        hipStreamDestroy: fn(RawStream) -> Status,
        hipStreamSynchronize: fn(RawStream) -> Status,
        hipStreamWaitEvent: fn(RawStream, RawEvent, c_uint) -> Status,
        hipEventCreateWithFlags: fn(*mut RawEvent, c_uint) -> Status,
        hipEventDestroy: fn(RawEvent) -> Status,
        hipEventRecord: fn(RawEvent, RawStream) -> Status,
        hipEventQuery: fn(RawEvent) -> Status,
        hipEventSynchronize: fn(RawEvent) -> Status,
        hipModuleLoadData: fn(*mut RawModule, *const c_void) -> Status,
        hipModuleUnload: fn(RawModule) -> Status,
        hipModuleGetFunction: fn(*mut RawFunction, RawModule, *const c_char) -> Status,
        hipModuleLaunchKernel: fn(
            RawFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, RawStream,
            *mut *mut c_void, *mut *mut c_void
        ) -> Status,
        hipGetErrorString: fn(Status) -> *const c_char,
    }
}

api! {
    /// HIP graph capture (stream capture, instantiate, launch), in libamdhip64 since ROCm 4.3;
    /// optional: without it graph capture answers a typed error.
    GraphApi {
        hipStreamBeginCapture: fn(RawStream, c_int) -> Status,
        hipStreamEndCapture: fn(RawStream, *mut RawGraph) -> Status,
        hipGraphInstantiate: fn(
            *mut RawGraphExec, RawGraph, *mut *mut c_void, *mut c_char, usize
        ) -> Status,
        hipGraphLaunch: fn(RawGraphExec, RawStream) -> Status,
        hipGraphExecDestroy: fn(RawGraphExec) -> Status,
        hipGraphDestroy: fn(RawGraph) -> Status,
    }
}

api! {
    /// The hiprtc entry points (libhiprtc in ROCm 6, part of libamdhip64 in ROCm 5).
    RtcApi {
        hiprtcVersion: fn(*mut c_int, *mut c_int) -> Status,
        hiprtcCreateProgram: fn(
            *mut RawProgram, *const c_char, *const c_char, c_int, *const *const c_char,
            *const *const c_char
        ) -> Status,
        hiprtcCompileProgram: fn(RawProgram, c_int, *const *const c_char) -> Status,
        hiprtcGetProgramLogSize: fn(RawProgram, *mut usize) -> Status,
        hiprtcGetProgramLog: fn(RawProgram, *mut c_char) -> Status,
        hiprtcGetCodeSize: fn(RawProgram, *mut usize) -> Status,
        hiprtcGetCode: fn(RawProgram, *mut c_char) -> Status,
        hiprtcDestroyProgram: fn(*mut RawProgram) -> Status,
        hiprtcGetErrorString: fn(Status) -> *const c_char,
    }
}

/// The loaded HIP runtime: its entry points and, when it has it, `hipGetDevicePropertiesR0600`.
pub(crate) struct Hip {
    pub(crate) api: HipApi,
    /// ROCm 6's properties entry point (`hipDeviceProp_tR0600` layout); `None` on ROCm 5.
    pub(crate) props_r0600: Option<unsafe extern "C" fn(*mut c_void, c_int) -> Status>,
    /// Graph capture; `None` when the runtime lacks one of its symbols.
    pub(crate) graph: Option<GraphApi>,
    _lib: Library,
}

/// The loaded hiprtc library.
pub(crate) struct Rtc {
    pub(crate) api: RtcApi,
    _lib: Library,
}

/// Directories named by `HIP_PATH` and `ROCM_PATH`, then `/opt/rocm`: where a library is looked
/// for when the dynamic loader's own search (`LD_LIBRARY_PATH`, ld.so.cache, Debian's
/// `/usr/lib/x86_64-linux-gnu`) does not find it.
fn rocm_lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["HIP_PATH", "ROCM_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib"));
            dirs.push(root.join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs
}

/// Opens the first of `names` found by the dynamic loader, then in the ROCm directories.
fn open_first(names: &[&str]) -> Result<Library, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    for dir in rocm_lib_dirs() {
        candidates.extend(names.iter().map(|n| dir.join(n)));
    }
    for path in candidates {
        // SAFETY: loading a ROCm library runs its initialisers; these are the vendor's
        // libraries, loaded as any HIP program would load them at start-up.
        match unsafe { Library::new(&path) } {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    Err(tried.join("; "))
}

const HIP_NAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];
const RTC_NAMES: &[&str] = &[
    "libhiprtc.so",
    "libhiprtc.so.7",
    "libhiprtc.so.6",
    "libhiprtc.so.5",
];

fn load_hip() -> Result<Hip, String> {
    let lib = open_first(HIP_NAMES)?;
    let api = HipApi::load(&lib, "libamdhip64")?;
    // SAFETY: same signature as `hipGetDeviceProperties`, with the R0600 struct behind the
    // pointer; the buffer passed is always `DEVICE_PROP_BUFFER` bytes.
    let props_r0600 = unsafe {
        lib.get::<unsafe extern "C" fn(*mut c_void, c_int) -> Status>(
            b"hipGetDevicePropertiesR0600\0",
        )
    }
    .ok()
    .map(|s| *s);
    let graph = GraphApi::load(&lib, "libamdhip64").ok();
    Ok(Hip {
        api,
        props_r0600,
        graph,
        _lib: lib,
    })
}

fn load_rtc() -> Result<Rtc, String> {
    // ROCm 6 ships hiprtc as its own library; ROCm 5 exports it from libamdhip64.
    let lib = match open_first(RTC_NAMES) {
        Ok(lib) => lib,
        Err(first) => open_first(HIP_NAMES).map_err(|second| format!("{first}; {second}"))?,
    };
    let api = RtcApi::load(&lib, "hiprtc")?;
    Ok(Rtc { api, _lib: lib })
}

/// The HIP runtime, loaded once per process and never unloaded.
pub(crate) fn hip() -> Result<&'static Hip, RocmError> {
    static HIP: OnceLock<Result<Hip, String>> = OnceLock::new();
    HIP.get_or_init(load_hip)
        .as_ref()
        .map_err(|reason| RocmError::NoRuntime {
            reason: reason.clone(),
        })
}

/// hiprtc, loaded once per process and never unloaded.
pub(crate) fn rtc() -> Result<&'static Rtc, RocmError> {
    static RTC: OnceLock<Result<Rtc, String>> = OnceLock::new();
    RTC.get_or_init(load_rtc)
        .as_ref()
        .map_err(|reason| RocmError::NoHiprtc {
            reason: reason.clone(),
        })
}

/// Copies a NUL-terminated C string owned by the library into a `String`.
pub(crate) fn c_str(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: `ptr` is non-null and points to a NUL-terminated string with static lifetime
    // (HIP and hiprtc return string literals from their error-string functions).
    unsafe { core::ffi::CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

impl Hip {
    /// Maps a HIP status to `Ok` or a [`RocmError::Hip`] naming the call.
    pub(crate) fn check(&self, call: &'static str, status: Status) -> Result<(), RocmError> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: `hipGetErrorString` accepts any status value and returns a static string.
        let message = c_str(unsafe { (self.api.hipGetErrorString)(status) });
        Err(RocmError::Hip {
            call,
            code: status,
            message,
        })
    }
}

impl Rtc {
    /// Maps a hiprtc status to `Ok` or a [`RocmError::HiprtcCall`] naming the call.
    pub(crate) fn check(&self, call: &'static str, status: Status) -> Result<(), RocmError> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: `hiprtcGetErrorString` accepts any status value and returns a static string.
        let message = c_str(unsafe { (self.api.hiprtcGetErrorString)(status) });
        Err(RocmError::HiprtcCall {
            call,
            code: status,
            message,
        })
    }
}

#[cfg(all(test, feature = "hip-sys"))]
mod layout_vs_hip_sys {
    //! The hand-written constants against hip-sys's bindgen output (ROCm 5 headers).
    use super::*;
    use hip_sys::hiprt as h;

    #[test]
    fn status_codes_and_flags_match() {
        assert_eq!(h::hipError_t::hipSuccess as i32, SUCCESS);
        assert_eq!(h::hipError_t::hipErrorNoDevice as i32, ERROR_NO_DEVICE);
        assert_eq!(h::hipError_t::hipErrorNotReady as i32, ERROR_NOT_READY);
        assert_eq!(
            h::hipError_t::hipErrorInsufficientDriver as i32,
            ERROR_INSUFFICIENT_DRIVER
        );
        assert_eq!(
            h::hipMemcpyKind::hipMemcpyHostToDevice as i32,
            MEMCPY_HOST_TO_DEVICE
        );
        assert_eq!(
            h::hipMemcpyKind::hipMemcpyDeviceToHost as i32,
            MEMCPY_DEVICE_TO_HOST
        );
        assert_eq!(
            h::hipMemcpyKind::hipMemcpyDeviceToDevice as i32,
            MEMCPY_DEVICE_TO_DEVICE
        );
        assert_eq!(h::hipStreamNonBlocking, STREAM_NON_BLOCKING);
        assert_eq!(h::hipEventDisableTiming, EVENT_DISABLE_TIMING);
        assert_eq!(h::hipHostMallocDefault, HOST_MALLOC_DEFAULT);
    }

    #[test]
    fn device_properties_layout_matches() {
        assert_eq!(
            core::mem::offset_of!(h::hipDeviceProp_t, gcnArchName),
            GCN_ARCH_NAME_OFFSET_R0000
        );
        assert!(size_of::<h::hipDeviceProp_t>() <= DEVICE_PROP_BUFFER);
    }
}
