//! [`RocmDriver`]: the HIP runtime as a [`specula_core::gpu::Driver`], so the shared GPU
//! orchestration of `specula_core::gpu` (staging, launch, graph capture and replay, the readback
//! ring: the code the host driver of `specula-tests` runs end to end in CI) runs on ROCm
//! unchanged. Graph capture uses `hipStreamBeginCapture` / `hipStreamEndCapture` /
//! `hipGraphInstantiate` / `hipGraphLaunch` (libamdhip64 since ROCm 4.3, checked present in
//! ROCm 5.2); a runtime without them answers [`RocmError::Unsupported`].

use crate::device::{Module, RocmDevice, RocmEvent, RocmStream};
use crate::error::RocmError;
use crate::ffi::{self, RawFunction, RawGraph, RawGraphExec};
use crate::memory::{DeviceCopy, RocmDeviceBuffer, RocmPinnedBuffer};
use core::ffi::c_void;
use core::marker::PhantomData;
use specula_core::gpu::kernels;
use specula_core::gpu::{
    ArgBlock, Driver, ENTRY_NAMES, Element, GpuReadback, GpuVerifier, Launch, Memory, Status,
    TreeLaunch, View, ViewMut,
};
use specula_core::verify::{Device, DeviceOut, Format, Rows};
use std::sync::Arc;

/// The compute units the split launch plans for: below this many requests each request's rows
/// are split over `min(⌈256 / batch⌉, 64)` blocks (about one request per compute unit of an
/// MI-series GCD; the ROCm backend's split rule before the shared orchestration).
const SPLIT_BELOW: u32 = 128;

/// The kernel's chain entry points, in the order of `specula_core::gpu::ENTRY_NAMES` (a launch
/// picks one by `Launch::entry_index`); handles valid while their module is loaded (kept here).
struct Kernels {
    _module: Arc<Module>,
    functions: [RawFunction; ENTRY_NAMES.len()],
}

// SAFETY: function handles may be launched from any thread (the runtime locks internally); the
// module that owns them lives as long as this value.
unsafe impl Send for Kernels {}
// SAFETY: as for `Send`.
unsafe impl Sync for Kernels {}

/// The HIP runtime on one [`RocmDevice`] (a shared handle), with the verification kernel when
/// made by [`with_kernel`](RocmDriver::with_kernel).
#[derive(Clone)]
pub struct RocmDriver {
    device: RocmDevice,
    kernels: Option<Arc<Kernels>>,
}

impl core::fmt::Debug for RocmDriver {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocmDriver")
            .field("device", &self.device)
            .field("kernel", &self.kernels.is_some())
            .finish()
    }
}

/// The verification kernel with its device counters (`Counters<K>` plus an error word) on one
/// ROCm device, ordered on a compute stream of its own: the shared [`GpuVerifier`] over
/// [`RocmDriver`], with no layer of this crate's own. Make one with [`RocmDevice::verifier`].
///
/// Counters live in device memory and are updated by the kernel in the same launch that
/// verifies (64-bit atomics). Staging, the split entry's scratch, launch, graph capture and
/// replay, token trees and the host-slice path ([`Verifier`](specula_core::verify::Verifier),
/// which waits for its outputs) are written once in `specula_core::gpu` and run end to end in
/// CI over the host driver of `specula-tests`. The step path is
/// [`launch`](GpuVerifier::launch) on typed views or a
/// [`VerifyGraph`](specula_core::gpu::VerifyGraph) replay: neither makes a synchronising
/// call. Its errors are [`GpuError`](specula_core::gpu::GpuError)`<`[`RocmError`]`>`, which `?`
/// turns into a [`RocmError`]. Take its readbacks with [`RocmReadback::new`] (or
/// [`GpuVerifier::readback`], the same).
pub type RocmVerifier<const K: usize> = GpuVerifier<RocmDriver, K>;

/// A [`Readback`](specula_core::Readback) of a [`RocmVerifier`]'s device counters: the shared
/// ring [`GpuReadback`] over [`RocmDriver`] (`RocmReadback::new(&verifier)`, the same as
/// [`GpuVerifier::readback`]), whose drop waits for its copy stream ([`Driver::drain_copies`]).
/// Its errors are [`GpuError`](specula_core::gpu::GpuError)`<`[`RocmError`]`>`, which `?` turns
/// into a [`RocmError`].
pub type RocmReadback<const K: usize> = GpuReadback<RocmDriver, K>;

// The collector runs on its own thread: the readback must move there.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<RocmReadback<8>>();
};

impl RocmDevice {
    /// A verifier on this device with its own compute stream and zeroed counters: compiles the
    /// kernel for the device's architecture with hiprtc (once per device and process) and
    /// loads it.
    ///
    /// # Errors
    /// [`RocmError::NoHiprtc`] / [`RocmError::Hiprtc`] when the kernel cannot be compiled,
    /// [`RocmError::Hip`] for any other runtime failure.
    pub fn verifier<const K: usize>(&self) -> Result<RocmVerifier<K>, RocmError> {
        Ok(GpuVerifier::new(RocmDriver::with_kernel(self)?)?)
    }
}

impl RocmDriver {
    /// The driver of `device`, without the kernel: copies, events and graphs work, a launch
    /// answers [`RocmError::Unsupported`] (what a readback needs).
    #[must_use]
    pub fn new(device: RocmDevice) -> Self {
        Self {
            device,
            kernels: None,
        }
    }

    /// The driver of `device` with the verification kernel, compiled with hiprtc for its
    /// architecture (once per device and process) and loaded.
    ///
    /// # Errors
    /// [`RocmError::NoHiprtc`] / [`RocmError::Hiprtc`] when the kernel cannot be compiled,
    /// [`RocmError::Hip`] when loading it fails.
    pub fn with_kernel(device: &RocmDevice) -> Result<Self, RocmError> {
        let module = device.module()?;
        let mut functions = [core::ptr::null_mut(); ENTRY_NAMES.len()];
        for (f, name) in functions.iter_mut().zip(ENTRY_NAMES) {
            *f = module.function(name)?;
        }
        Ok(Self {
            device: device.clone(),
            kernels: Some(Arc::new(Kernels {
                _module: module,
                functions,
            })),
        })
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &RocmDevice {
        &self.device
    }

    /// Enqueues writes of the `u32` `words` into `dst` from byte `offset` on `stream`, one
    /// 32-bit fill per word (`hipMemsetD32Async`): the values travel in the calls, so nothing
    /// on the host must outlive them and, unlike [`Driver::upload`] (which waits, since HIP
    /// does not promise to stage a pageable source), nothing waits. For the few shape words of
    /// a step written on the step path.
    ///
    /// # Errors
    /// [`RocmError::TooLarge`] when the range is out of `dst`, [`RocmError::Hip`] when a fill
    /// fails.
    pub fn fill_words(
        &self,
        stream: &RocmStream,
        dst: &RocmDeviceBuffer<u64>,
        offset: usize,
        words: &[u32],
    ) -> Result<(), RocmError> {
        let end = core::mem::size_of_val(words)
            .checked_add(offset)
            .ok_or(RocmError::TooLarge)?;
        if end > bytes_in(dst.len()) || offset % 4 != 0 {
            return Err(RocmError::TooLarge);
        }
        self.device.bind()?;
        let hip = self.device.hip();
        for (i, &w) in words.iter().enumerate() {
            let at = dst
                .as_device_ptr()
                .cast::<u8>()
                .wrapping_add(offset + 4 * i);
            // SAFETY: the word lies inside the buffer (checked above, 4-aligned: device
            // allocations are); the value is passed by value (`c_int` carries the bits of `w`).
            hip.check("hipMemsetD32Async", unsafe {
                (hip.api.hipMemsetD32Async)(at.cast(), w as core::ffi::c_int, 1, stream.raw)
            })?;
        }
        Ok(())
    }

    /// Enqueues `grid` blocks of `block` threads of `function` on `stream`, with `arg` (device
    /// addresses, 0 = null) as its one parameter, copied at launch.
    ///
    /// # Safety
    /// `function` is a loaded entry point of this device whose one parameter is the argument
    /// block `sp_args` (laid out as [`ArgBlock`]), and what `arg` and the shape words in device
    /// memory say is what it may read and write.
    unsafe fn launch_block(
        &self,
        function: RawFunction,
        stream: &RocmStream,
        grid: u32,
        block: u32,
        mut arg: ArgBlock,
    ) -> Result<(), RocmError> {
        let mut params: [*mut c_void; 1] = [core::ptr::from_mut(&mut arg).cast()];
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: as the caller vouches; `params[0]` points to `arg`, live until the call
        // returns; block = 256, a multiple of both AMD wave sizes.
        hip.check("hipModuleLaunchKernel", unsafe {
            (hip.api.hipModuleLaunchKernel)(
                function,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream.raw,
                params.as_mut_ptr(),
                core::ptr::null_mut(),
            )
        })
    }

    fn graph_api(&self) -> Result<&'static ffi::GraphApi, RocmError> {
        self.device.hip().graph.as_ref().ok_or(RocmError::Unsupported(
            "HIP graph capture: the runtime lacks hipStreamBeginCapture/EndCapture/GraphInstantiate/GraphLaunch",
        ))
    }
}

/// An instantiated HIP graph, destroyed with its handle.
pub struct RocmGraph {
    graph: RawGraph,
    exec: RawGraphExec,
    device: RocmDevice,
}

impl core::fmt::Debug for RocmGraph {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocmGraph").finish_non_exhaustive()
    }
}

// SAFETY: graph handles are owned by this value; the runtime allows launching and destroying
// them from any thread (it locks internally).
unsafe impl Send for RocmGraph {}
// SAFETY: as for `Send`.
unsafe impl Sync for RocmGraph {}

impl Drop for RocmGraph {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; a failure leaks the graph at worst.
        if let (Some(g), Ok(())) = (self.device.hip().graph.as_ref(), self.device.bind()) {
            // SAFETY: created in `end_capture` and destroyed once, here; pending launches of
            // an executable graph complete before its resources are released.
            unsafe {
                let _ = (g.hipGraphExecDestroy)(self.exec);
                let _ = (g.hipGraphDestroy)(self.graph);
            }
        }
    }
}

/// What a tree launch on a driver made without the kernel answers ([`RocmDriver::new`]).
const NO_TREE_KERNEL: RocmError = RocmError::Unsupported(
    "tree launch on a RocmDriver made without the kernel (use RocmDriver::with_kernel)",
);

fn bytes_in(words: usize) -> usize {
    words.saturating_mul(8)
}

/// The device address of `buf` as the kernel's argument block holds it (no dereference here:
/// the kernel reads it).
fn address(buf: &Arc<RocmDeviceBuffer<u64>>) -> u64 {
    buf.as_device_ptr().addr() as u64
}

impl Memory for RocmDriver {
    type Buffer = Arc<RocmDeviceBuffer<u64>>;

    fn bytes(buf: &Arc<RocmDeviceBuffer<u64>>) -> usize {
        buf.byte_len()
    }
}

impl Driver for RocmDriver {
    type Error = RocmError;
    type Stream = Arc<RocmStream>;
    type Event = Arc<RocmEvent>;
    type HostBuffer = RocmPinnedBuffer<u64>;
    type Graph = RocmGraph;

    fn stream(&self) -> Result<Arc<RocmStream>, RocmError> {
        RocmStream::new(&self.device).map(Arc::new)
    }

    fn event(&self) -> Result<Arc<RocmEvent>, RocmError> {
        RocmEvent::new(&self.device).map(Arc::new)
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<RocmDeviceBuffer<u64>>, RocmError> {
        RocmDeviceBuffer::zeroed(&self.device, bytes.div_ceil(8)).map(Arc::new)
    }

    fn alloc_host(&self, bytes: usize) -> Result<RocmPinnedBuffer<u64>, RocmError> {
        RocmPinnedBuffer::new(&self.device, bytes.div_ceil(8))
    }

    fn upload<T: Element>(
        &self,
        stream: &Arc<RocmStream>,
        dst: &Arc<RocmDeviceBuffer<u64>>,
        offset: usize,
        src: &[T],
    ) -> Result<(), RocmError> {
        let bytes = core::mem::size_of_val(src);
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > Self::bytes(dst))
        {
            return Err(RocmError::TooLarge);
        }
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: the device range is in bounds (checked above); the host range is read by the
        // copy, and the stream is synchronised right after, before `src` can go away (HIP does
        // not promise to stage a pageable source before returning).
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                dst.as_device_ptr().cast::<u8>().add(offset).cast(),
                src.as_ptr().cast(),
                bytes,
                ffi::MEMCPY_HOST_TO_DEVICE,
                stream.raw,
            )
        })?;
        stream.synchronize()
    }

    fn copy(
        &self,
        stream: &Arc<RocmStream>,
        dst: &Arc<RocmDeviceBuffer<u64>>,
        src: &Arc<RocmDeviceBuffer<u64>>,
        bytes: usize,
    ) -> Result<(), RocmError> {
        if bytes > Self::bytes(dst) || bytes > Self::bytes(src) {
            return Err(RocmError::TooLarge);
        }
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: both device ranges hold `bytes` bytes (checked above), alive through the
        // caller's handles; ordered on `stream`.
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                dst.as_device_ptr(),
                src.as_device_ptr(),
                bytes,
                ffi::MEMCPY_DEVICE_TO_DEVICE,
                stream.raw,
            )
        })
    }

    fn download(
        &self,
        stream: &Arc<RocmStream>,
        dst: &RocmPinnedBuffer<u64>,
        dst_offset: usize,
        src: &Arc<RocmDeviceBuffer<u64>>,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), RocmError> {
        let fits = |off: usize, len: usize| off.checked_add(bytes).is_some_and(|e| e <= len);
        if !fits(dst_offset, bytes_in(dst.len())) || !fits(src_offset, Self::bytes(src)) {
            return Err(RocmError::TooLarge);
        }
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: both ranges in bounds (checked above); the pinned destination is read only
        // after an event recorded after this copy completes, and is not freed before the copy
        // stream is synchronised (`GpuReadback`'s drop, `drain_copies`).
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                dst.as_mut_ptr().cast::<u8>().add(dst_offset).cast(),
                src.as_device_ptr().cast::<u8>().add(src_offset).cast(),
                bytes,
                ffi::MEMCPY_DEVICE_TO_HOST,
                stream.raw,
            )
        })
    }

    unsafe fn read_host<T: Element>(
        &self,
        buf: &RocmPinnedBuffer<u64>,
        offset: usize,
        out: &mut [T],
    ) {
        // SAFETY: the buffer's `len()` words of page-locked memory, initialised (zeroed at
        // allocation); the caller guarantees no copy into `buf` is in flight.
        let bytes = unsafe {
            core::slice::from_raw_parts(buf.as_mut_ptr().cast::<u8>(), bytes_in(buf.len()))
        };
        T::read_slice_ne(bytes, offset, out);
    }

    fn record(&self, event: &Arc<RocmEvent>, stream: &Arc<RocmStream>) -> Result<(), RocmError> {
        self.device.bind()?;
        event.record(stream)
    }

    fn wait(&self, stream: &Arc<RocmStream>, event: &Arc<RocmEvent>) -> Result<(), RocmError> {
        self.device.bind()?;
        stream.wait(event)
    }

    fn query(&self, event: &Arc<RocmEvent>) -> Result<Status, RocmError> {
        self.device.bind()?;
        Ok(if event.query()? {
            Status::Ready
        } else {
            Status::Pending
        })
    }

    fn sync_event(&self, event: &Arc<RocmEvent>) -> Result<(), RocmError> {
        self.device.bind()?;
        event.synchronize()
    }

    fn sync_stream(&self, stream: &Arc<RocmStream>) -> Result<(), RocmError> {
        stream.synchronize()
    }

    fn launch(&self, stream: &Arc<RocmStream>, l: &Launch<'_, '_, Self>) -> Result<(), RocmError> {
        let Some(k) = self.kernels.as_ref() else {
            return Err(RocmError::Unsupported(
                "kernel launch on a RocmDriver made without the kernel (use RocmDriver::with_kernel)",
            ));
        };
        let function = *k
            .functions
            .get(l.entry_index())
            .ok_or(RocmError::TooLarge)?;
        // SAFETY: `function` is the loaded entry `l.entry_name()` of the module, whose one
        // parameter is the argument block `sp_args`, laid out as `ArgBlock` (the kernel text
        // checks size and offsets on every compile); the orchestration sized stats and scratch
        // and checked the views against the capacity, and the caller of its launch vouched for
        // the shape words (and the cumulative counts) in device memory.
        unsafe { self.launch_block(function, stream, l.grid, l.block, l.arg_block(address)) }
    }

    fn begin_capture(&self, stream: &Arc<RocmStream>) -> Result<(), RocmError> {
        let g = self.graph_api()?;
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: a live stream of this device; the mode is a documented value.
        hip.check("hipStreamBeginCapture", unsafe {
            (g.hipStreamBeginCapture)(stream.raw, ffi::CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    fn end_capture(&self, stream: &Arc<RocmStream>) -> Result<RocmGraph, RocmError> {
        let g = self.graph_api()?;
        self.device.bind()?;
        let hip = self.device.hip();
        let mut graph: RawGraph = core::ptr::null_mut();
        // SAFETY: the stream is capturing (begun by `begin_capture`); `graph` is a valid
        // out-pointer.
        hip.check("hipStreamEndCapture", unsafe {
            (g.hipStreamEndCapture)(stream.raw, &mut graph)
        })?;
        let mut exec: RawGraphExec = core::ptr::null_mut();
        // SAFETY: `graph` is the live graph just captured; no error node or log is asked for.
        let made = hip.check("hipGraphInstantiate", unsafe {
            (g.hipGraphInstantiate)(
                &mut exec,
                graph,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                0,
            )
        });
        if let Err(e) = made {
            // SAFETY: not yet owned by a handle; destroyed once, here.
            let _ = unsafe { (g.hipGraphDestroy)(graph) };
            return Err(e);
        }
        Ok(RocmGraph {
            graph,
            exec,
            device: self.device.clone(),
        })
    }

    fn replay(&self, graph: &RocmGraph, stream: &Arc<RocmStream>) -> Result<(), RocmError> {
        let g = self.graph_api()?;
        self.device.bind()?;
        let hip = self.device.hip();
        // SAFETY: a live executable graph and stream of this device; the orchestration ties the
        // graph to the lifetime of the buffers it was captured on.
        hip.check("hipGraphLaunch", unsafe {
            (g.hipGraphLaunch)(graph.exec, stream.raw)
        })
    }

    /// Memory of this driver's device (its ordinal): the caller's buffer of another device is
    /// refused.
    fn owns(&self, buf: &Arc<RocmDeviceBuffer<u64>>) -> bool {
        buf.device().ordinal() == self.device.ordinal()
    }

    fn multiprocessors(&self) -> u32 {
        SPLIT_BELOW
    }

    fn block_threads(&self) -> u32 {
        kernels::BLOCK_THREADS
    }

    /// Compiles (hiprtc) and loads the tree module on the first call, once per device.
    fn prepare_tree(&self) -> Result<(), RocmError> {
        self.kernels.as_ref().ok_or(NO_TREE_KERNEL)?;
        self.device.tree_function(0).map(|_| ())
    }

    /// Launches the tree entry the views ask for ([`TreeLaunch::entry_name`]:
    /// `specula_verify_tree` or `specula_verify_tree_half`), compiling and loading the tree
    /// module on the first call
    /// (once per device; no hiprtc is [`RocmError::NoHiprtc`]). A driver made without the
    /// kernel ([`RocmDriver::new`]) answers [`RocmError::Unsupported`], as for chains.
    fn launch_tree(
        &self,
        stream: &Arc<RocmStream>,
        l: &TreeLaunch<'_, '_, Self>,
    ) -> Result<(), RocmError> {
        self.kernels.as_ref().ok_or(NO_TREE_KERNEL)?;
        let function = self.device.tree_function(l.entry_index())?;
        // SAFETY: `function` is the tree entry `l.entry_name()` of the loaded tree module, whose
        // one parameter is the argument block (`TreeLaunch::arg_block`); the orchestration
        // sized stats and checked the views against the capacity, and the caller of its tree
        // launch vouched for the shape words in device memory.
        unsafe { self.launch_block(function, stream, l.grid, l.block, l.arg_block(address)) }
    }
}

// ------------------------------------------------------------------ the caller's memory
//
// The caller's HIP buffers ([`RocmDeviceBuffer`]) as device tensors of a batch
// ([`Values::Device`](specula_core::verify::Values::Device)) and device outputs
// ([`Outputs::on_device`](specula_core::verify::Outputs::on_device)): an alias of the same
// memory, never freed by it, for as long as the borrow of the caller's buffer. HIP has no
// per-buffer events (cudarc's borrow has): the caller orders the writes of the buffer before
// the verifier's stream runs, as for any HIP kernel on another stream.

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type of the caller's HIP rows that the kernel reads in place: `f32`,
/// [`half::bf16`], [`half::f16`].
pub trait RowElement: DeviceCopy + sealed::Sealed {
    /// Its format.
    const FORMAT: Format;
}

impl RowElement for f32 {
    const FORMAT: Format = Format::F32;
}
impl RowElement for half::bf16 {
    const FORMAT: Format = Format::Bf16;
}
impl RowElement for half::f16 {
    const FORMAT: Format = Format::F16;
}

/// The caller's rows in a [`RocmDeviceBuffer`], borrowed for `'a` by
/// [`RocmDriver::borrow_rows`]: [`rows`](Self::rows) is what a batch's target or draft takes.
#[derive(Debug)]
pub struct RocmRows<'a> {
    buf: Arc<RocmDeviceBuffer<u64>>,
    format: Format,
    _borrow: PhantomData<&'a ()>,
}

impl RocmRows<'_> {
    /// The whole borrowed buffer, in its format.
    #[must_use]
    pub fn values(&self) -> Device<'_> {
        match self.format {
            Format::F32 => Device::f32(View::<RocmDriver, f32>::new(&self.buf)),
            Format::Bf16 => Device::bf16(View::<RocmDriver, u16>::new(&self.buf)),
            Format::F16 => Device::f16(View::<RocmDriver, u16>::new(&self.buf)),
        }
    }

    /// The buffer as rows of stride `stride` (`≥ V`).
    #[must_use]
    pub fn rows(&self, stride: usize) -> Rows<'_> {
        Rows::device(self.values(), stride)
    }
}

/// The caller's `u32` outputs in a [`RocmDeviceBuffer`], borrowed exclusively for `'a` by
/// [`RocmDriver::borrow_out`].
#[derive(Debug)]
pub struct RocmOut<'a> {
    buf: Arc<RocmDeviceBuffer<u64>>,
    _borrow: PhantomData<&'a mut ()>,
}

impl RocmOut<'_> {
    /// The whole borrowed buffer as an output of
    /// [`Outputs::on_device`](specula_core::verify::Outputs::on_device) or
    /// [`TreeOutputs::on_device`](specula_core::verify::tree::TreeOutputs::on_device), written
    /// in place.
    pub fn output(&mut self) -> DeviceOut<'_> {
        DeviceOut::new(ViewMut::<RocmDriver, u32>::new(&mut self.buf))
    }
}

impl RocmDriver {
    /// Borrows the caller's rows (`f32`, [`half::bf16`] or [`half::f16`]) for a batch
    /// ([`RocmRows::rows`]). A buffer of another device is refused when verified
    /// ([`GpuError::ForeignMemory`](specula_core::gpu::GpuError::ForeignMemory)).
    #[must_use]
    pub fn borrow_rows<'a, T: RowElement>(&self, buf: &'a RocmDeviceBuffer<T>) -> RocmRows<'a> {
        RocmRows {
            buf: Arc::new(RocmDeviceBuffer::alias(buf)),
            format: T::FORMAT,
            _borrow: PhantomData,
        }
    }

    /// Borrows the caller's `u32` buffer for the kernel to write (accepted counts, tokens,
    /// recovered tokens: [`RocmOut::output`]).
    #[must_use]
    pub fn borrow_out<'a>(&self, buf: &'a mut RocmDeviceBuffer<u32>) -> RocmOut<'a> {
        RocmOut {
            buf: Arc::new(RocmDeviceBuffer::alias(buf)),
            _borrow: PhantomData,
        }
    }
}
