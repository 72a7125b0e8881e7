//! [`CudaDriver`]: the CUDA driver API as a [`specula_core::gpu::Driver`], so the shared GPU
//! orchestration (readback ring, and the staging, launch and graph logic the host driver of
//! `specula-tests` executes in CI) runs on CUDA unchanged. Every driver call goes through
//! `ffi::call`, which counts it (and whether it can block) for [`crate::call_counts`]. The
//! caller's cudarc memory becomes views of this driver through [`CudaDriver::borrow`].

use crate::device::{CudaDevice, CudaEvent};
use crate::error::CudaError;
use crate::ffi::{Blocking, call};
use crate::memory::{CudaDeviceBuffer, CudaPinnedBuffer};
use cudarc::driver::result;
use cudarc::driver::sys::{
    self, CUevent_flags, CUevent_wait_flags, CUgraph, CUgraphExec, CUresult, CUstreamCaptureMode,
};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, DriverError, SyncOnDrop};
use specula_core::gpu::kernels;
use specula_core::gpu::{
    Driver, Element, GpuReadback, GpuVerifier, Launch, Memory, Status, TreeLaunch, View, ViewMut,
};
use specula_core::verify::{Device, DeviceOut, Format, Rows};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

/// The CUDA driver API on one [`CudaDevice`] (a shared handle).
#[derive(Clone, Debug)]
pub struct CudaDriver {
    dev: Arc<CudaDevice>,
}

/// The verification kernel with its device counters (`Counters<K>` plus an error word) on a
/// [`CudaDevice`]'s compute stream: the shared [`GpuVerifier`] over [`CudaDriver`], with no
/// layer of this crate's own. Make one with [`CudaDevice::verifier`].
///
/// Staging, the split entry's scratch, launch, graph capture and replay, token trees and the
/// host-slice path ([`Verifier`](specula_core::verify::Verifier)) are written once in
/// `specula_core::gpu` and run end to end in CI over the host driver of `specula-tests`. The
/// step path is [`launch`](GpuVerifier::launch) on typed views (the verifier's own
/// [`Staging`](specula_core::gpu::Staging) buffers, or the caller's cudarc memory through
/// [`CudaDriver::borrow`]) or a [`VerifyGraph`](specula_core::gpu::VerifyGraph) replay:
/// neither makes a synchronising driver call. Its errors are
/// [`GpuError`](specula_core::gpu::GpuError)`<`[`CudaError`]`>`, which `?` turns into a [`CudaError`]. Take its readbacks
/// with [`CudaReadback::new`] (or [`GpuVerifier::readback`], the same).
pub type CudaVerifier<const K: usize> = GpuVerifier<CudaDriver, K>;

/// A [`Readback`](specula_core::Readback) of a [`CudaVerifier`]'s device counters: the shared
/// ring [`GpuReadback`] over [`CudaDriver`] (`CudaReadback::new(&verifier)`, the same as
/// [`GpuVerifier::readback`]), whose drop waits for its copy stream ([`Driver::drain_copies`]).
/// Its errors are [`GpuError`](specula_core::gpu::GpuError)`<`[`CudaError`]`>`, which `?` turns
/// into a [`CudaError`].
pub type CudaReadback<const K: usize> = GpuReadback<CudaDriver, K>;

// The collector runs on its own thread: the readback must move there.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<CudaReadback<8>>();
};

impl CudaDevice {
    /// A verifier on this device, ordered on its compute stream, with zeroed device counters.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when allocating the counters or creating an event fails.
    pub fn verifier<const K: usize>(self: &Arc<Self>) -> Result<CudaVerifier<K>, CudaError> {
        let stream = self.stream().clone();
        Ok(GpuVerifier::with_stream(
            CudaDriver::new(self.clone()),
            stream,
        )?)
    }
}

impl CudaDriver {
    /// The driver of `dev` (its context; launches use its loaded kernel).
    #[must_use]
    pub fn new(dev: Arc<CudaDevice>) -> Self {
        Self { dev }
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }
}

/// An instantiated CUDA graph, destroyed with its handle.
#[derive(Debug)]
pub struct CudaGraph {
    graph: CUgraph,
    exec: CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: graph handles are owned by this value; launching and destroying them from any thread
// with the context current is allowed.
unsafe impl Send for CudaGraph {}
// SAFETY: as for `Send`.
unsafe impl Sync for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created in `end_capture` and destroyed once, here. Destroying an executable
            // graph with launches still pending is allowed: they complete first.
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

impl CudaDriver {
    fn bind(&self) -> Result<(), CudaError> {
        self.dev.bind()
    }
}

impl Memory for CudaDriver {
    type Buffer = Arc<CudaDeviceBuffer>;

    fn bytes(buf: &Arc<CudaDeviceBuffer>) -> usize {
        buf.bytes
    }
}

impl Driver for CudaDriver {
    type Error = CudaError;
    type Stream = Arc<CudaStream>;
    type Event = Arc<CudaEvent>;
    type HostBuffer = CudaPinnedBuffer;
    type Graph = CudaGraph;

    fn stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        call("cuStreamCreate", Blocking::Yes, || {
            self.dev.context().new_stream()
        })
    }

    fn event(&self) -> Result<Arc<CudaEvent>, CudaError> {
        self.bind()?;
        let ev = call("cuEventCreate", Blocking::No, || {
            result::event::create(CUevent_flags::CU_EVENT_DISABLE_TIMING)
        })?;
        Ok(Arc::new(CudaEvent {
            ev,
            ctx: self.dev.context().clone(),
        }))
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<CudaDeviceBuffer>, CudaError> {
        Ok(Arc::new(CudaDeviceBuffer::zeroed(
            self.dev.context(),
            bytes,
        )?))
    }

    fn alloc_host(&self, bytes: usize) -> Result<CudaPinnedBuffer, CudaError> {
        CudaPinnedBuffer::zeroed(self.dev.context(), bytes.div_ceil(8))
    }

    fn upload<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        dst: &Arc<CudaDeviceBuffer>,
        offset: usize,
        src: &[T],
    ) -> Result<(), CudaError> {
        self.bind()?;
        let s = stream.cu_stream();
        let ptr = dst.ptr + offset as u64;
        // SAFETY: the orchestration checked `offset + size_of_val(src)` against the buffer; a
        // pageable source is staged by the driver before the call returns, so `src` may go away
        // afterwards (counted as possibly blocking).
        call("cuMemcpyHtoDAsync", Blocking::Yes, || unsafe {
            result::memcpy_htod_async(ptr, src, s)
        })
    }

    fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dst: &Arc<CudaDeviceBuffer>,
        src: &Arc<CudaDeviceBuffer>,
        bytes: usize,
    ) -> Result<(), CudaError> {
        self.bind()?;
        let s = stream.cu_stream();
        let (d, sr) = (dst.ptr, src.ptr);
        // SAFETY: both buffers hold at least `bytes` bytes (the orchestration sizes them);
        // device memory of the current context, kept alive by the caller's handles.
        call("cuMemcpyDtoDAsync", Blocking::No, || unsafe {
            result::memcpy_dtod_async(d, sr, bytes, s)
        })
    }

    fn download(
        &self,
        stream: &Arc<CudaStream>,
        dst: &CudaPinnedBuffer,
        dst_offset: usize,
        src: &Arc<CudaDeviceBuffer>,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), CudaError> {
        if dst_offset
            .checked_add(bytes)
            .is_none_or(|end| end > dst.bytes())
        {
            return Err(CudaError::TooLarge);
        }
        self.bind()?;
        let s = stream.cu_stream();
        let from = src.ptr + src_offset as u64;
        // SAFETY: `dst` is page-locked memory of `dst.bytes()` bytes, the range checked above;
        // the host reads it only after an event recorded after this copy completes (the
        // orchestration's contract), and the buffer outlives the copy (its owner waits or
        // keeps it until then).
        let out =
            unsafe { core::slice::from_raw_parts_mut(dst.as_byte_ptr().add(dst_offset), bytes) };
        // SAFETY: `from` holds `bytes` bytes (checked by the orchestration); `out` as above.
        call("cuMemcpyDtoHAsync", Blocking::No, || unsafe {
            result::memcpy_dtoh_async(out, from, s)
        })
    }

    unsafe fn read_host<T: Element>(&self, buf: &CudaPinnedBuffer, offset: usize, out: &mut [T]) {
        // SAFETY: the buffer's `bytes()` bytes of page-locked memory, initialised (zeroed at
        // allocation); the caller guarantees no copy into `buf` is in flight.
        let bytes = unsafe { core::slice::from_raw_parts(buf.as_byte_ptr(), buf.bytes()) };
        T::read_slice_ne(bytes, offset, out);
    }

    fn record(&self, event: &Arc<CudaEvent>, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        self.bind()?;
        let (e, s) = (event.ev, stream.cu_stream());
        // SAFETY: a live event and stream of the current context.
        call("cuEventRecord", Blocking::No, || unsafe {
            result::event::record(e, s)
        })
    }

    fn wait(&self, stream: &Arc<CudaStream>, event: &Arc<CudaEvent>) -> Result<(), CudaError> {
        self.bind()?;
        let (e, s) = (event.ev, stream.cu_stream());
        // SAFETY: a live stream and event of the current context.
        call("cuStreamWaitEvent", Blocking::No, || unsafe {
            result::stream::wait_event(s, e, CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })
    }

    fn query(&self, event: &Arc<CudaEvent>) -> Result<Status, CudaError> {
        self.bind()?;
        let e = event.ev;
        // SAFETY: a live event of the current context; cuEventQuery never waits.
        match call("cuEventQuery", Blocking::No, || unsafe {
            result::event::query(e)
        }) {
            Ok(()) => Ok(Status::Ready),
            Err(CudaError::Driver {
                error: DriverError(CUresult::CUDA_ERROR_NOT_READY),
                ..
            }) => Ok(Status::Pending),
            Err(e) => Err(e),
        }
    }

    fn sync_event(&self, event: &Arc<CudaEvent>) -> Result<(), CudaError> {
        self.bind()?;
        let e = event.ev;
        // SAFETY: a live event of the current context.
        call("cuEventSynchronize", Blocking::Yes, || unsafe {
            result::event::synchronize(e)
        })
    }

    fn sync_stream(&self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        self.bind()?;
        let s = stream.cu_stream();
        // SAFETY: a live stream of the current context.
        call("cuStreamSynchronize", Blocking::Yes, || unsafe {
            result::stream::synchronize(s)
        })
    }

    fn launch(&self, stream: &Arc<CudaStream>, l: &Launch<'_, '_, Self>) -> Result<(), CudaError> {
        let f = self
            .dev
            .cu_entry(l.entry_index())
            .ok_or(CudaError::TooLarge)?;
        self.bind()?;
        // The kernel's one parameter, its argument block (`Launch::arg_block`: device
        // addresses, 0 = null); `args[0]` points to it.
        let mut arg = l.arg_block(|b| b.ptr);
        let mut args: [*mut c_void; 1] = [core::ptr::from_mut(&mut arg).cast()];
        let s = stream.cu_stream();
        let (grid, block) = (l.grid, l.block);
        // SAFETY: `f` is the loaded entry `l.entry_name()`, whose one parameter is the argument
        // block `sp_args`, laid out as `ArgBlock` (the kernel text checks the size on every
        // compile); `args[0]` points to a live `ArgBlock` until the call returns (the driver
        // copies kernel parameters at launch); the orchestration sized stats and scratch and
        // checked the views against the capacity; the caller of its launch vouched for the shape
        // words (and the cumulative counts) in device memory.
        call("cuLaunchKernel", Blocking::No, || unsafe {
            result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, s, &mut args)
        })
    }

    fn begin_capture(&self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        self.bind()?;
        let s = stream.cu_stream();
        // SAFETY: a live stream of the current context.
        call("cuStreamBeginCapture", Blocking::No, || unsafe {
            result::stream::begin_capture(
                s,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    fn end_capture(&self, stream: &Arc<CudaStream>) -> Result<CudaGraph, CudaError> {
        self.bind()?;
        let s = stream.cu_stream();
        // SAFETY: the stream is capturing (begun by `begin_capture`).
        let graph = call("cuStreamEndCapture", Blocking::No, || unsafe {
            result::stream::end_capture(s)
        })?;
        // The driver function itself, not `result::graph::instantiate`: its flags type is an
        // enum before cudarc 0.19.10 and a bit set from it; no flags is 0 in both.
        let mut exec = core::mem::MaybeUninit::<CUgraphExec>::uninit();
        // SAFETY: `graph` is the live graph just captured; `exec` is written on success only,
        // and read only then.
        let instantiated = call("cuGraphInstantiateWithFlags", Blocking::Yes, || unsafe {
            sys::cuGraphInstantiateWithFlags(exec.as_mut_ptr(), graph, 0)
                .result()
                .map(|()| exec.assume_init())
        });
        match instantiated {
            Ok(exec) => Ok(CudaGraph {
                graph,
                exec,
                ctx: self.dev.context().clone(),
            }),
            Err(e) => {
                // SAFETY: not yet owned by a handle; destroyed once, here.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(e)
            }
        }
    }

    fn replay(&self, graph: &CudaGraph, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        self.bind()?;
        let (exec, s) = (graph.exec, stream.cu_stream());
        // SAFETY: a live executable graph and stream of the current context; the orchestration
        // ties the graph to the lifetime of the buffers it was captured on.
        call("cuGraphLaunch", Blocking::No, || unsafe {
            result::graph::launch(exec, s)
        })
    }

    /// Memory of this driver's device (its CUDA context): the caller's memory borrowed from
    /// another device's cudarc tensor is refused.
    fn owns(&self, buf: &Arc<CudaDeviceBuffer>) -> bool {
        buf.in_context(self.dev.context())
    }

    fn multiprocessors(&self) -> u32 {
        self.dev.multiprocessors()
    }

    fn block_threads(&self) -> u32 {
        kernels::BLOCK_THREADS
    }

    /// Compiles (NVRTC) and loads the tree module on the first call, once per device.
    fn prepare_tree(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.dev.tree_function(0).map(|_| ())
    }

    /// Launches the tree entry the views ask for ([`TreeLaunch::entry_name`]:
    /// `specula_verify_tree` or `specula_verify_tree_half`), compiling and loading the tree
    /// module on the first call ([`CudaDevice`]: once per device; a missing NVRTC is
    /// [`CudaError::NoNvrtc`]).
    fn launch_tree(
        &self,
        stream: &Arc<CudaStream>,
        l: &TreeLaunch<'_, '_, Self>,
    ) -> Result<(), CudaError> {
        self.bind()?;
        let f = self.dev.tree_function(l.entry_index())?;
        let mut arg = l.arg_block(|b| b.ptr);
        let mut params: [*mut c_void; 1] = [core::ptr::from_mut(&mut arg).cast()];
        let s = stream.cu_stream();
        let (grid, block) = (l.grid, l.block);
        // SAFETY: `f` is the loaded tree entry `l.entry_name()`, whose one parameter is the argument
        // block (`TreeLaunch::arg_block`), `params[0]` pointing to it; the orchestration sized stats and checked the views against the capacity;
        // the caller of its tree launch vouched for the shape words in device memory.
        call("cuLaunchKernel", Blocking::No, || unsafe {
            result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, s, &mut params)
        })
    }
}

// ------------------------------------------------------------------ the caller's memory
//
// The caller's cudarc device memory (`CudaSlice`, `CudaView`, `CudaViewMut`, what candle's CUDA
// storage and mistral.rs hold) as typed views for the shared step path
// ([`specula_core::gpu::VerifyArgs`]), with no copy and no host staging. A borrow goes through
// cudarc's `DevicePtr`/`DevicePtrMut` on the device's compute stream: the stream waits for the
// slice's last write, and when the borrow ends cudarc records the use, so later cudarc work on
// the slice is ordered after the kernels enqueued meanwhile. The borrow lasts as long as the
// views (and any graph captured on them): the compiler checks it. (Here, not in `memory`: the
// views are views of this driver.)

/// The caller's device memory, read by the kernel, borrowed for `'a`.
pub struct CudaForeign<'a, T: Element> {
    buf: Arc<CudaDeviceBuffer>,
    _use: SyncOnDrop<'a>,
    _t: PhantomData<&'a [T]>,
}

/// The caller's device memory, written by the kernel, borrowed exclusively for `'a`.
pub struct CudaForeignMut<'a, T: Element> {
    buf: Arc<CudaDeviceBuffer>,
    _use: SyncOnDrop<'a>,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Element> core::fmt::Debug for CudaForeign<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaForeign")
            .field("bytes", &self.buf.bytes)
            .finish_non_exhaustive()
    }
}

impl<T: Element> core::fmt::Debug for CudaForeignMut<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaForeignMut")
            .field("bytes", &self.buf.bytes)
            .finish_non_exhaustive()
    }
}

impl<T: Element> CudaForeign<'_, T> {
    /// The whole borrowed memory as a typed view.
    #[must_use]
    pub fn view(&self) -> View<'_, CudaDriver, T> {
        View::new(&self.buf)
    }
}

impl<T: Element> CudaForeignMut<'_, T> {
    /// The whole borrowed memory as a typed view the kernel writes.
    pub fn view_mut(&mut self) -> ViewMut<'_, CudaDriver, T> {
        ViewMut::new(&mut self.buf)
    }
}

impl CudaForeignMut<'_, u32> {
    /// The whole borrowed memory as an output of [`Outputs::on_device`](specula_core::verify::Outputs::on_device)
    /// (accepted counts, tokens or recovered tokens) or
    /// [`TreeOutputs::on_device`](specula_core::verify::tree::TreeOutputs::on_device) (accepted
    /// lengths, path or tokens), written in place by the launch.
    pub fn output(&mut self) -> DeviceOut<'_> {
        DeviceOut::new(self.view_mut())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type of the caller's cudarc rows that the kernel reads in place: `f32`,
/// [`half::bf16`], [`half::f16`] (what candle's CUDA storage holds), with no transmute.
pub trait RowElement: sealed::Sealed {
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

/// The caller's cudarc rows (target logits or probabilities, draft probabilities), borrowed
/// for `'a` by [`CudaDriver::borrow_rows`]: [`rows`](Self::rows) is what a
/// [`Batch`](specula_core::verify::Batch)'s [`Target`](specula_core::verify::Target) or draft
/// takes.
pub struct CudaRows<'a> {
    buf: Arc<CudaDeviceBuffer>,
    format: Format,
    _use: SyncOnDrop<'a>,
}

impl core::fmt::Debug for CudaRows<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaRows")
            .field("format", &self.format)
            .field("bytes", &self.buf.bytes)
            .finish_non_exhaustive()
    }
}

impl CudaRows<'_> {
    /// The whole borrowed tensor, in its format.
    #[must_use]
    pub fn values(&self) -> Device<'_> {
        match self.format {
            Format::F32 => Device::f32(View::<CudaDriver, f32>::new(&self.buf)),
            Format::Bf16 => Device::bf16(View::<CudaDriver, u16>::new(&self.buf)),
            Format::F16 => Device::f16(View::<CudaDriver, u16>::new(&self.buf)),
        }
    }

    /// The tensor as rows of stride `stride` (`≥ V`; the row length of a `[rows, V]` tensor).
    #[must_use]
    pub fn rows(&self, stride: usize) -> Rows<'_> {
        Rows::device(self.values(), stride)
    }
}

impl CudaDriver {
    /// Borrows the caller's `slice` (its elements `T` are what the kernel reads: `u32`, `u64`
    /// or `f32`) for a launch on the device's compute stream.
    pub fn borrow<'a, T: Element, S: DevicePtr<T>>(&'a self, slice: &'a S) -> CudaForeign<'a, T> {
        let bytes = slice.num_bytes();
        // The slice's own context, so that `owns` sees another device's memory.
        let ctx = slice.stream().context().clone();
        let (ptr, guard) = slice.device_ptr(self.device().stream());
        CudaForeign {
            buf: Arc::new(CudaDeviceBuffer::borrowed(&ctx, ptr, bytes)),
            _use: guard,
            _t: PhantomData,
        }
    }

    /// Borrows the caller's rows (`CudaSlice` / `CudaView` / `CudaViewMut` of `f32`,
    /// [`half::bf16`] or [`half::f16`]) for a batch ([`CudaRows::rows`]), as
    /// [`borrow`](Self::borrow) does: the device's compute stream waits for the slice's last
    /// write, and cudarc records this use when the borrow ends. Memory of another device is
    /// refused when verified ([`GpuError::ForeignMemory`](specula_core::gpu::GpuError::ForeignMemory)).
    pub fn borrow_rows<'a, T: RowElement, S: DevicePtr<T>>(&'a self, slice: &'a S) -> CudaRows<'a> {
        let bytes = slice.num_bytes();
        let ctx = slice.stream().context().clone();
        let (ptr, guard) = slice.device_ptr(self.device().stream());
        CudaRows {
            buf: Arc::new(CudaDeviceBuffer::borrowed(&ctx, ptr, bytes)),
            format: T::FORMAT,
            _use: guard,
        }
    }

    /// Borrows the caller's `slice` for the kernel to write (accepted counts, tokens).
    pub fn borrow_mut<'a, T: Element, S: DevicePtrMut<T>>(
        &'a self,
        slice: &'a mut S,
    ) -> CudaForeignMut<'a, T> {
        let bytes = slice.num_bytes();
        let ctx = slice.stream().context().clone();
        let (ptr, guard) = slice.device_ptr_mut(self.device().stream());
        CudaForeignMut {
            buf: Arc::new(CudaDeviceBuffer::borrowed(&ctx, ptr, bytes)),
            _use: guard,
            _t: PhantomData,
        }
    }
}
