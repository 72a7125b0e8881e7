//! [`RocmDevice`]: one ROCm GPU with the kernel modules loaded on it, and the streams and events
//! this crate uses on it.

use crate::compile::{CodeObject, c_string, compile, valid_target_id};
use crate::error::RocmError;
use crate::ffi::{self, Hip, RawEvent, RawFunction, RawModule, RawStream};
use core::ffi::c_int;
use specula_core::gpu::kernels::{self, TREE_ENTRY_NAMES};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Options the kernel text is compiled with beyond [`crate::COMPILE_OPTIONS`].
const KERNEL_OPTIONS: &[&str] = &["-DSPECULA_HIP=1"];

/// Number of ROCm devices.
///
/// # Errors
/// [`RocmError::NoRuntime`] when the HIP runtime cannot be loaded, [`RocmError::NoDevice`] when
/// it loads but finds no device (as on a machine without an AMD GPU or without `/dev/kfd`).
pub fn device_count() -> Result<usize, RocmError> {
    let hip = ffi::hip()?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid, writable `int`.
    let status = unsafe { (hip.api.hipGetDeviceCount)(&mut count) };
    if status != ffi::SUCCESS {
        if status == ffi::ERROR_NO_DEVICE || status == ffi::ERROR_INSUFFICIENT_DRIVER {
            return Err(RocmError::NoDevice { code: status });
        }
        hip.check("hipGetDeviceCount", status)?;
    }
    match usize::try_from(count) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(RocmError::NoDevice { code: status }),
    }
}

/// The version of the loaded HIP runtime (`hipRuntimeGetVersion`, e.g. 50221153 for 5.2).
///
/// # Errors
/// [`RocmError::NoRuntime`] when the runtime cannot be loaded, [`RocmError::Hip`] when the call
/// fails.
pub fn runtime_version() -> Result<i32, RocmError> {
    let hip = ffi::hip()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid, writable `int`.
    hip.check("hipRuntimeGetVersion", unsafe {
        (hip.api.hipRuntimeGetVersion)(&mut v)
    })?;
    Ok(v)
}

pub(crate) struct DeviceInner {
    pub(crate) hip: &'static Hip,
    ordinal: c_int,
    arch: Option<String>,
    /// The verification module, compiled for this device once per process.
    module: OnceLock<Result<Arc<Module>, RocmError>>,
    /// The tree module (`kernels::TREE_SOURCE`), compiled on first tree use
    /// (`RocmDriver::launch_tree`); a failure is not kept, so a later launch tries again.
    tree: OnceLock<TreeKernel>,
    /// Serialises that first compile.
    tree_init: Mutex<()>,
}

/// One ROCm GPU. Cheap to clone; every clone (and every `RocmDevice::new` of the same ordinal in
/// this process) shares one compiled kernel module.
#[derive(Clone)]
pub struct RocmDevice {
    pub(crate) inner: Arc<DeviceInner>,
}

impl core::fmt::Debug for RocmDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocmDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("arch", &self.inner.arch)
            .finish()
    }
}

impl RocmDevice {
    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`RocmError::NoRuntime`] without a HIP runtime, [`RocmError::NoDevice`] without a device,
    /// [`RocmError::InvalidDevice`] for an ordinal past the last device.
    pub fn new(ordinal: usize) -> Result<Self, RocmError> {
        static OPEN: Mutex<Vec<RocmDevice>> = Mutex::new(Vec::new());
        let count = device_count()?;
        if ordinal >= count {
            return Err(RocmError::InvalidDevice { ordinal, count });
        }
        let mut open = OPEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(d) = open.iter().find(|d| d.ordinal() == ordinal) {
            return Ok(d.clone());
        }
        let hip = ffi::hip()?;
        let raw = c_int::try_from(ordinal).map_err(|_| RocmError::TooLarge)?;
        let arch = arch_name(hip, raw)?;
        let device = Self {
            inner: Arc::new(DeviceInner {
                hip,
                ordinal: raw,
                arch,
                module: OnceLock::new(),
                tree: OnceLock::new(),
                tree_init: Mutex::new(()),
            }),
        };
        open.push(device.clone());
        Ok(device)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        // The ordinal came from a `usize` and is non-negative.
        self.inner.ordinal.unsigned_abs() as usize
    }

    /// The device's `gcnArchName` (e.g. `gfx90a:sramecc+:xnack-`), or `None` when the runtime's
    /// properties layout was not recognised; hiprtc then targets the current device itself.
    pub fn arch(&self) -> Option<&str> {
        self.inner.arch.as_deref()
    }

    /// Makes this device current on the calling thread (`hipSetDevice`): HIP's current device
    /// is per thread, so every entry point of this crate calls it first.
    pub(crate) fn bind(&self) -> Result<(), RocmError> {
        let hip = self.inner.hip;
        // SAFETY: plain call with an ordinal checked against the device count.
        hip.check("hipSetDevice", unsafe {
            (hip.api.hipSetDevice)(self.inner.ordinal)
        })
    }

    pub(crate) fn hip(&self) -> &'static Hip {
        self.inner.hip
    }

    /// The verification module (`kernels::SOURCE`), compiled with hiprtc for this device's
    /// architecture and loaded on the first call, once per device and process.
    pub(crate) fn module(&self) -> Result<Arc<Module>, RocmError> {
        self.inner
            .module
            .get_or_init(|| {
                let code = compile(
                    kernels::SOURCE,
                    "specula_verify.cu",
                    self.arch(),
                    KERNEL_OPTIONS,
                )?;
                Module::load(self, &code).map(Arc::new)
            })
            .clone()
    }

    /// The tree entry point at `index` of `kernels::TREE_ENTRY_NAMES` (binary32 rows, half
    /// rows; `TreeLaunch::entry_index`): the tree module is compiled with hiprtc and loaded on
    /// the first call (once per device and process, so chain-only runtimes never compile it); a
    /// failure is returned, not kept, so a later call tries again.
    pub(crate) fn tree_function(&self, index: usize) -> Result<RawFunction, RocmError> {
        let inner = &self.inner;
        // An index past the list is never asked for (`TreeLaunch::entry_index` is < 2).
        let entry = |t: &TreeKernel| {
            t.functions
                .get(index)
                .copied()
                .ok_or(RocmError::Unsupported("no such tree entry point"))
        };
        if let Some(t) = inner.tree.get() {
            return entry(t);
        }
        let _first = inner
            .tree_init
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = inner.tree.get() {
            return entry(t);
        }
        let code = compile(
            kernels::TREE_SOURCE,
            "specula_tree.cu",
            self.arch(),
            KERNEL_OPTIONS,
        )?;
        let module = Module::load(self, &code)?;
        let mut functions = [core::ptr::null_mut(); TREE_ENTRY_NAMES.len()];
        for (f, name) in functions.iter_mut().zip(TREE_ENTRY_NAMES) {
            *f = module.function(name)?;
        }
        let t = inner.tree.get_or_init(|| TreeKernel {
            _module: module,
            functions,
        });
        entry(t)
    }
}

/// A code object loaded on a device (`hipModuleLoadData`), unloaded on drop.
pub(crate) struct Module {
    raw: RawModule,
    device: RocmDevice,
}

// SAFETY: module and function handles may be used from any thread (the runtime locks
// internally); the module is only unloaded on drop, when no launch can still use it.
unsafe impl Send for Module {}
// SAFETY: as for `Send`.
unsafe impl Sync for Module {}

impl Module {
    pub(crate) fn load(device: &RocmDevice, code: &CodeObject) -> Result<Self, RocmError> {
        device.bind()?;
        let hip = device.hip();
        let mut raw: RawModule = core::ptr::null_mut();
        // SAFETY: `code` is a complete code object; HIP copies what it needs during the call.
        hip.check("hipModuleLoadData", unsafe {
            (hip.api.hipModuleLoadData)(&mut raw, code.as_bytes().as_ptr().cast())
        })?;
        Ok(Self {
            raw,
            device: device.clone(),
        })
    }

    /// Looks up a kernel by its (unmangled, `extern "C"`) name.
    pub(crate) fn function(&self, name: &str) -> Result<RawFunction, RocmError> {
        let hip = self.device.hip();
        let cname = c_string(name)?;
        let mut f: RawFunction = core::ptr::null_mut();
        // SAFETY: `raw` is a loaded module; `cname` is NUL-terminated.
        hip.check("hipModuleGetFunction", unsafe {
            (hip.api.hipModuleGetFunction)(&mut f, self.raw, cname.as_ptr())
        })?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let hip = self.device.hip();
        if self.device.bind().is_ok() {
            // SAFETY: `raw` is a loaded module, unloaded once.
            let _ = unsafe { (hip.api.hipModuleUnload)(self.raw) };
        }
    }
}

/// The tree module of a device and its entry points, the handles valid while the module is
/// loaded (kept here).
struct TreeKernel {
    _module: Module,
    /// The module's entry points, in the order of `kernels::TREE_ENTRY_NAMES`.
    functions: [RawFunction; TREE_ENTRY_NAMES.len()],
}

// SAFETY: a function handle may be launched from any thread (the runtime locks internally);
// its module lives as long as this value.
unsafe impl Send for TreeKernel {}
// SAFETY: as for `Send`.
unsafe impl Sync for TreeKernel {}

/// Reads `gcnArchName` through the newest properties entry point the runtime has. Returns
/// `None` when the name found there does not look like an AMD target ID.
fn arch_name(hip: &Hip, ordinal: c_int) -> Result<Option<String>, RocmError> {
    let (call, offset) = match hip.props_r0600 {
        Some(f) => (f, ffi::GCN_ARCH_NAME_OFFSET_R0600),
        None => (
            hip.api.hipGetDeviceProperties,
            ffi::GCN_ARCH_NAME_OFFSET_R0000,
        ),
    };
    let mut buf = vec![0u64; ffi::DEVICE_PROP_BUFFER / 8];
    // SAFETY: `buf` is `DEVICE_PROP_BUFFER` writable bytes, 8-aligned, larger than either
    // properties struct; `ordinal` is a valid device.
    hip.check("hipGetDeviceProperties", unsafe {
        call(buf.as_mut_ptr().cast(), ordinal)
    })?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes.get(offset..offset + 256).and_then(parse_arch))
}

/// The NUL-terminated target ID at the start of `field`, if it looks like one (`gfx…`, only
/// characters valid in a target ID).
fn parse_arch(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|&b| b == 0)?;
    let s = core::str::from_utf8(&field[..end]).ok()?;
    (s.starts_with("gfx") && valid_target_id(s)).then(|| s.to_owned())
}

/// A HIP stream on one device, destroyed on drop.
#[derive(Debug)]
pub struct RocmStream {
    pub(crate) raw: RawStream,
    device: RocmDevice,
}

// SAFETY: a HIP stream handle may be used from any thread (the HIP runtime locks internally);
// this crate binds the owning device before each use.
unsafe impl Send for RocmStream {}
// SAFETY: as for `Send`: every operation on the handle goes through the thread-safe runtime.
unsafe impl Sync for RocmStream {}

impl RocmStream {
    /// A non-blocking stream (no implicit synchronisation with the null stream).
    pub(crate) fn new(device: &RocmDevice) -> Result<Self, RocmError> {
        device.bind()?;
        let hip = device.hip();
        let mut raw: RawStream = core::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the flag is a documented value.
        hip.check("hipStreamCreateWithFlags", unsafe {
            (hip.api.hipStreamCreateWithFlags)(&mut raw, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok(Self {
            raw,
            device: device.clone(),
        })
    }

    /// Waits for everything enqueued on the stream.
    pub(crate) fn synchronize(&self) -> Result<(), RocmError> {
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: `self.raw` is a live stream of this device.
        hip.check("hipStreamSynchronize", unsafe {
            (hip.api.hipStreamSynchronize)(self.raw)
        })
    }

    /// Makes later work on this stream wait for `event`.
    pub(crate) fn wait(&self, event: &RocmEvent) -> Result<(), RocmError> {
        let hip = self.device.hip();
        // SAFETY: both handles are live and belong to the same device.
        hip.check("hipStreamWaitEvent", unsafe {
            (hip.api.hipStreamWaitEvent)(self.raw, event.raw, 0)
        })
    }
}

impl Drop for RocmStream {
    fn drop(&mut self) {
        let hip = self.device.hip();
        // Errors cannot be returned from `drop`; a failed bind or destroy leaks the stream.
        if self.device.bind().is_ok() {
            // SAFETY: `self.raw` is a live stream that nothing else owns; it is not used again.
            let _ = unsafe { (hip.api.hipStreamDestroy)(self.raw) };
        }
    }
}

/// A HIP event without timing, destroyed on drop.
#[derive(Debug)]
pub struct RocmEvent {
    raw: RawEvent,
    device: RocmDevice,
}

// SAFETY: a HIP event handle may be used from any thread (the runtime locks internally).
unsafe impl Send for RocmEvent {}
// SAFETY: as for `Send`.
unsafe impl Sync for RocmEvent {}

impl RocmEvent {
    pub(crate) fn new(device: &RocmDevice) -> Result<Self, RocmError> {
        device.bind()?;
        let hip = device.hip();
        let mut raw: RawEvent = core::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the flag is a documented value.
        hip.check("hipEventCreateWithFlags", unsafe {
            (hip.api.hipEventCreateWithFlags)(&mut raw, ffi::EVENT_DISABLE_TIMING)
        })?;
        Ok(Self {
            raw,
            device: device.clone(),
        })
    }

    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, stream: &RocmStream) -> Result<(), RocmError> {
        let hip = self.device.hip();
        // SAFETY: both handles are live and belong to the same device.
        hip.check("hipEventRecord", unsafe {
            (hip.api.hipEventRecord)(self.raw, stream.raw)
        })
    }

    /// `Ok(true)` once the work before the recorded point has finished; never blocks.
    pub(crate) fn query(&self) -> Result<bool, RocmError> {
        let hip = self.device.hip();
        // SAFETY: `self.raw` is a live event.
        let status = unsafe { (hip.api.hipEventQuery)(self.raw) };
        if status == ffi::ERROR_NOT_READY {
            return Ok(false);
        }
        hip.check("hipEventQuery", status).map(|()| true)
    }

    /// Blocks until the work before the recorded point has finished.
    pub(crate) fn synchronize(&self) -> Result<(), RocmError> {
        let hip = self.device.hip();
        // SAFETY: `self.raw` is a live event.
        hip.check("hipEventSynchronize", unsafe {
            (hip.api.hipEventSynchronize)(self.raw)
        })
    }
}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        let hip = self.device.hip();
        // SAFETY: `self.raw` is a live event that nothing else owns; it is not used again.
        let _ = unsafe { (hip.api.hipEventDestroy)(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_are_read_only_when_plausible() {
        let mut field = [0u8; 256];
        field[..22].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(
            parse_arch(&field).as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        assert_eq!(parse_arch(&[0u8; 256]), None);
        assert_eq!(parse_arch(b"AMD Instinct MI210\0"), None);
        assert_eq!(parse_arch(b"gfx90a"), None); // no terminator
    }
}
