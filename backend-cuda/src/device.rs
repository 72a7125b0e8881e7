//! [`CudaDevice`]: a context, a compute stream and the loaded kernel; the events ordered on its
//! streams ([`CudaEvent`]).

use crate::compile::{compile_ptx, compile_tree_ptx};
use crate::error::CudaError;
use crate::ffi::{Blocking, call, driver_present};
use cudarc::driver::result;
use cudarc::driver::sys::{CUdevice_attribute, CUevent, CUfunction, CUmodule};
use cudarc::driver::{CudaContext, CudaStream};
use specula_core::gpu::ENTRY_NAMES;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A CUDA context with the verification kernel loaded and the stream it runs on.
///
/// Create one with [`CudaDevice::new`] (its own primary context and a new stream) or
/// [`CudaDevice::with_stream`] (the caller's context and stream, e.g. the inference engine's
/// compute stream, so verification is ordered with the model's kernels).
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The chain module: every chain entry point, in the order of
    /// `specula_core::gpu::ENTRY_NAMES` (plain, split; `_logits`): a launch picks one by
    /// `Launch::entry_index`.
    chain: Module,
    arch: String,
    sms: u32,
    /// The tree module (`kernels::TREE_SOURCE`) with its entries, in the order of
    /// `kernels::TREE_ENTRY_NAMES` (binary32 rows, half rows: a launch picks one by
    /// `TreeLaunch::entry_index`), compiled and loaded on first tree use (`tree_function`).
    tree: OnceLock<Module>,
    /// Serialises that first compile.
    tree_init: Mutex<()>,
}

/// A module loaded into a context and the entry points taken from it, unloaded on drop.
///
/// Raw driver handles rather than cudarc's `CudaModule`/`CudaFunction`: the launches need the
/// `CUfunction`, which cudarc's safe API hands out only from 0.19.10
/// (`CudaFunction::cu_function`), while `result::module` is the same in 0.16 to 0.19, so one
/// path serves every supported major.
#[derive(Debug)]
struct Module {
    raw: CUmodule,
    /// The entry points, in the order of the names they were loaded by.
    functions: Vec<CUfunction>,
    ctx: Arc<CudaContext>,
}

// SAFETY: the module and function handles are owned by this value (the functions live as long
// as the module, unloaded only in `drop`); the driver API may use them from any thread with
// the context current, which every use binds.
unsafe impl Send for Module {}
// SAFETY: as for `Send`: shared access only copies the handles out (`cuLaunchKernel` on one
// function from several threads is allowed).
unsafe impl Sync for Module {}

impl Module {
    /// Loads `ptx` into `ctx` and takes the entry points `names` from it.
    fn load(ctx: &Arc<CudaContext>, ptx: String, names: &[&str]) -> Result<Self, CudaError> {
        let no_nul = |what: &str| CudaError::Nvrtc {
            log: format!("{what} holds a NUL byte: it cannot be passed to the driver"),
        };
        let image = CString::new(ptx).map_err(|_| no_nul("the PTX"))?;
        call("cuCtxSetCurrent", Blocking::No, || ctx.bind_to_thread())?;
        // SAFETY: the context is current; `image` is a NUL-terminated PTX text that lives
        // until the call returns (the driver copies what it keeps).
        let raw = call("cuModuleLoadData", Blocking::Yes, || unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        // Owned from here: an error below unloads it.
        let mut module = Self {
            raw,
            functions: Vec::with_capacity(names.len()),
            ctx: ctx.clone(),
        };
        for name in names {
            let name = CString::new(*name).map_err(|_| no_nul("an entry name"))?;
            // SAFETY: `raw` is the live module just loaded in the current context.
            let f = call("cuModuleGetFunction", Blocking::No, || unsafe {
                result::module::get_function(raw, name)
            })?;
            module.functions.push(f);
        }
        Ok(module)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; a failed unload leaks the module at worst.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by `Module::load` and unloaded once, here; no launch can use its
            // functions afterwards (they are only reachable through this value).
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

impl CudaDevice {
    /// Opens device `ordinal` with its own stream. Fails with [`CudaError::NoDriver`],
    /// [`CudaError::NoDevice`], [`CudaError::NoNvrtc`] or [`CudaError::Nvrtc`], never panics.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let count = call("cuDeviceGetCount", Blocking::Yes, CudaContext::device_count)
            .map_err(|_| CudaError::NoDevice)?;
        if usize::try_from(count).map_or(true, |n| ordinal >= n) {
            return Err(CudaError::NoDevice);
        }
        let ctx = call("cuDevicePrimaryCtxRetain", Blocking::Yes, || {
            CudaContext::new(ordinal)
        })?;
        let stream = call("cuStreamCreate", Blocking::Yes, || ctx.new_stream())?;
        Self::with_stream(stream)
    }

    /// Uses the caller's stream (and its context). The kernel is compiled with NVRTC for the
    /// device's architecture (once per process) and loaded into the context.
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Self, CudaError> {
        let ctx = stream.context().clone();
        // Two attributes, not `compute_capability` (cudarc 0.17 and later only).
        let attribute = |a| call("cuDeviceGetAttribute", Blocking::No, || ctx.attribute(a));
        let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let arch = format!("compute_{major}{minor}");
        let chain = Module::load(&ctx, compile_ptx(&arch)?, &ENTRY_NAMES)?;
        let sms = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Self {
            ctx,
            stream,
            chain,
            arch,
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            tree: OnceLock::new(),
            tree_init: Mutex::new(()),
        })
    }

    /// The context.
    #[must_use]
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The compute stream every launch and readback snapshot is ordered on.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The virtual architecture the kernel was compiled for (`compute_XY`).
    #[must_use]
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The entry point at `index` of `specula_core::gpu::ENTRY_NAMES`, if there is one.
    pub(crate) fn cu_entry(&self, index: usize) -> Option<CUfunction> {
        self.chain.functions.get(index).copied()
    }

    /// The tree entry point at `index` of
    /// [`TREE_ENTRY_NAMES`](specula_core::gpu::kernels::TREE_ENTRY_NAMES): on the first call the
    /// tree text ([`TREE_SOURCE`](specula_core::gpu::kernels::TREE_SOURCE)) is compiled with
    /// NVRTC for this device (once per process and architecture) and loaded as a second module,
    /// so a runtime that verifies chains alone pays nothing for it. A failure (no NVRTC, a
    /// refused compile, a failed load) is returned as a typed error and not cached: a later
    /// call tries again.
    pub(crate) fn tree_function(&self, index: usize) -> Result<CUfunction, CudaError> {
        // An index past the list is never asked for (`TreeLaunch::entry_index` is < 2).
        let entry = |m: &Module| m.functions.get(index).copied().ok_or(CudaError::TooLarge);
        if let Some(t) = self.tree.get() {
            return entry(t);
        }
        let _first = self
            .tree_init
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = self.tree.get() {
            return entry(t);
        }
        let ptx = compile_tree_ptx(&self.arch)?;
        let module = Module::load(
            &self.ctx,
            ptx,
            &specula_core::gpu::kernels::TREE_ENTRY_NAMES,
        )?;
        entry(self.tree.get_or_init(|| module))
    }

    /// Whether the tree module is loaded (after the first tree use).
    #[must_use]
    pub fn tree_loaded(&self) -> bool {
        self.tree.get().is_some()
    }

    /// Streaming multiprocessors of the device.
    #[must_use]
    pub fn multiprocessors(&self) -> u32 {
        self.sms
    }

    /// Makes the context current on this thread (raw driver calls need it). Cheap, never waits.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        call("cuCtxSetCurrent", Blocking::No, || {
            self.ctx.bind_to_thread()
        })
    }
}

/// A CUDA event (no timing), destroyed with its last handle.
#[derive(Debug)]
pub struct CudaEvent {
    pub(crate) ev: CUevent,
    pub(crate) ctx: Arc<CudaContext>,
}

// SAFETY: a CUDA event may be recorded, queried and destroyed from any thread once its context
// is current (every use binds it); the handle is owned by this value.
unsafe impl Send for CudaEvent {}
// SAFETY: as for `Send`: the driver API is thread-safe for these calls.
unsafe impl Sync for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by cuEventCreate and destroyed once, here; destroying an event
            // with work pending is allowed (resources are released when it completes).
            let _ = unsafe { result::event::destroy(self.ev) };
        }
    }
}
