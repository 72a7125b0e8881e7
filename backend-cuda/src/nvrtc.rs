//! NVRTC, loaded at run time with `libloading` (the seven calls this crate needs).
//!
//! Why not cudarc's NVRTC wrapper: cudarc fixes the library names it tries at build time, from
//! the CUDA version feature (`libnvrtc.so`, `.so.12`, ... for the 12.6 API this crate uses), so
//! a host with only CUDA 13's `libnvrtc.so.13` (a Python wheel, or a toolkit whose unversioned
//! link is not on the loader path) reports no NVRTC although a working one is installed; and it
//! panics where a library is missing. The program API used here (create, compile, log, PTX,
//! destroy) is unchanged from CUDA 11.2 to 13, so one loader serves every version, and
//! `SPECULA_NVRTC` may name the library file outright.

use core::ffi::{c_char, c_int};
use libloading::Library;
use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

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
pub(crate) fn present() -> bool {
    api().is_some()
}

/// The loaded NVRTC's version (`(major, minor)`), if one loads.
pub(crate) fn version() -> Option<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let s = unsafe { (api.nvrtcVersion)(&mut major, &mut minor) };
    (s == SUCCESS).then_some((major, minor))
}

/// Why [`compile`] failed.
#[derive(Debug)]
pub(crate) enum Failure {
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

fn check(call: &str, s: Status) -> Result<(), Failure> {
    if s == SUCCESS {
        Ok(())
    } else {
        Err(Failure::Refused(format!(
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
pub(crate) fn compile(source: &str, name: &str, options: &[String]) -> Result<String, Failure> {
    let api = api().ok_or(Failure::Missing)?;
    let nul = |s: &str| CString::new(s).map_err(|_| Failure::Refused(format!("NUL in {s:?}")));
    let src = nul(source)?;
    let cname = nul(name)?;
    let opts = options
        .iter()
        .map(|o| nul(o))
        .collect::<Result<Vec<_>, _>>()?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let n_opts = c_int::try_from(ptrs.len()).map_err(|_| Failure::Refused("options".into()))?;
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
        return Err(Failure::Refused(if log.is_empty() {
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
        .map_err(|s| Failure::Refused(format!("nvrtcGetPTX returned NVRTC status {s}")))
}
