//! [`CudaDevice`]: a context, a compute stream and the loaded kernel; the events ordered on its
//! streams ([`CudaEvent`]).

use crate::compile::{compile_ptx, compile_tree_ptx};
use crate::error::CudaError;
use crate::ffi::{Blocking, call, driver_present};
use cudarc::driver::result;
use cudarc::driver::sys::{CUevent, CUfunction};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use specula_core::gpu::ENTRY_NAMES;
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
    // Keeps the module loaded while the functions are used.
    _module: Arc<CudaModule>,
    /// Every chain entry point, in the order of `specula_core::gpu::ENTRY_NAMES` (plain,
    /// split; `_logits`): a launch picks one by `Launch::entry_index`.
    functions: [CudaFunction; ENTRY_NAMES.len()],
    arch: String,
    sms: u32,
    /// The tree entry, compiled and loaded on first tree use (`tree_function`).
    tree: OnceLock<TreeKernel>,
    /// Serialises that first compile.
    tree_init: Mutex<()>,
}

/// The tree module (`kernels::TREE_SOURCE`) and its entry point.
#[derive(Debug)]
struct TreeKernel {
    // Keeps the module loaded while `function` is used.
    _module: Arc<CudaModule>,
    function: CudaFunction,
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
        let (major, minor) = call("cuDeviceGetAttribute", Blocking::No, || {
            ctx.compute_capability()
        })?;
        let arch = format!("compute_{major}{minor}");
        let ptx = compile_ptx(&arch)?;
        let module = call("cuModuleLoadData", Blocking::Yes, || {
            ctx.load_module(Ptx::from_src(ptx))
        })?;
        let mut loaded = Vec::with_capacity(ENTRY_NAMES.len());
        for name in ENTRY_NAMES {
            loaded.push(call("cuModuleGetFunction", Blocking::No, || {
                module.load_function(name)
            })?);
        }
        let functions: [CudaFunction; ENTRY_NAMES.len()] =
            loaded.try_into().map_err(|_| CudaError::TooLarge)?; // one per name: never taken
        let sms = call("cuDeviceGetAttribute", Blocking::No, || {
            ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
        })?;
        Ok(Self {
            ctx,
            stream,
            _module: module,
            functions,
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
        self.functions.get(index).map(CudaFunction::cu_function)
    }

    /// The tree entry point (`specula_verify_tree`): on the first call the tree text
    /// ([`TREE_SOURCE`](specula_core::gpu::kernels::TREE_SOURCE)) is compiled with NVRTC for this
    /// device (once per process and architecture) and loaded as a second module, so a runtime
    /// that verifies chains alone pays nothing for it. A failure (no NVRTC, a refused compile, a
    /// failed load) is returned as a typed error and not cached: a later call tries again.
    pub(crate) fn tree_function(&self) -> Result<CUfunction, CudaError> {
        if let Some(t) = self.tree.get() {
            return Ok(t.function.cu_function());
        }
        let _first = self
            .tree_init
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = self.tree.get() {
            return Ok(t.function.cu_function());
        }
        let ptx = compile_tree_ptx(&self.arch)?;
        let module = call("cuModuleLoadData", Blocking::Yes, || {
            self.ctx.load_module(Ptx::from_src(ptx))
        })?;
        let function = call("cuModuleGetFunction", Blocking::No, || {
            module.load_function(specula_core::gpu::kernels::TREE_ENTRY)
        })?;
        let t = self.tree.get_or_init(|| TreeKernel {
            _module: module,
            function,
        });
        Ok(t.function.cu_function())
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
