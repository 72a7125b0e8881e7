//! Memory this crate owns: raw device buffers ([`CudaDeviceBuffer`], also a borrowed view of the
//! caller's memory) and page-locked host buffers ([`CudaPinnedBuffer`]), each freed on drop.

use crate::error::CudaError;
use crate::ffi::{Blocking, call};
use cudarc::driver::CudaContext;
use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;
use std::sync::Arc;

/// Device memory owned by this crate (raw, so no cudarc event tracking runs on the step path).
#[derive(Debug)]
pub struct CudaDeviceBuffer {
    pub(crate) ptr: CUdeviceptr,
    pub(crate) bytes: usize,
    ctx: Arc<CudaContext>,
    /// False for the caller's memory ([`crate::CudaForeign`], made by
    /// [`crate::CudaDriver::borrow`]): never freed here.
    owned: bool,
}

impl CudaDeviceBuffer {
    /// `bytes` (at least 16, so every pointer is valid and 16-byte aligned) zeroed device bytes.
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, CudaError> {
        let bytes = bytes.max(16);
        call("cuCtxSetCurrent", Blocking::No, || ctx.bind_to_thread())?;
        // SAFETY: the context is current; the size is non-zero.
        let ptr = call("cuMemAlloc", Blocking::Yes, || unsafe {
            result::malloc_sync(bytes)
        })?;
        let buf = Self {
            ptr,
            bytes,
            ctx: ctx.clone(),
            owned: true,
        };
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes in the current context.
        call("cuMemsetD8", Blocking::Yes, || unsafe {
            result::memset_d8_sync(ptr, 0, bytes)
        })?;
        Ok(buf)
    }
}

impl CudaDeviceBuffer {
    /// The raw device pointer (for the caller's own driver calls, e.g. filling it; the buffer
    /// stays owned by this handle).
    #[must_use]
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Its size in bytes.
    #[must_use]
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }
}

impl CudaDeviceBuffer {
    /// The caller's device memory, `bytes` at `ptr`, never freed by this handle.
    pub(crate) fn borrowed(ctx: &Arc<CudaContext>, ptr: CUdeviceptr, bytes: usize) -> Self {
        Self {
            ptr,
            bytes,
            ctx: ctx.clone(),
            owned: false,
        }
    }
}

impl CudaDeviceBuffer {
    /// Whether it is memory of `ctx`'s device: the same CUDA context handle (primary contexts
    /// of one device share it, whichever `Arc<CudaContext>` holds them, candle's included).
    pub(crate) fn in_context(&self, ctx: &CudaContext) -> bool {
        self.ctx.cu_ctx() == ctx.cu_ctx()
    }
}

impl Drop for CudaDeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; a failed free leaks device memory at worst.
        if self.owned && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once, here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory of `len` u64 words (the target of asynchronous device-to-host copies).
#[derive(Debug)]
pub struct CudaPinnedBuffer {
    ptr: *mut u64,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value; nothing else aliases it.
unsafe impl Send for CudaPinnedBuffer {}
// SAFETY: shared access only reads (`read_host`) under the orchestration's contract
// that no copy into it is in flight; copies into it are enqueued through `&self` by the
// driver glue, ordered by events before any read.
unsafe impl Sync for CudaPinnedBuffer {}

impl CudaPinnedBuffer {
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, CudaError> {
        call("cuCtxSetCurrent", Blocking::No, || ctx.bind_to_thread())?;
        let bytes = len.max(1) * 8;
        // SAFETY: the context is current; flags 0 = plain page-locked memory.
        let raw = call("cuMemHostAlloc", Blocking::Yes, || unsafe {
            result::malloc_host(bytes, 0)
        })?;
        let ptr = raw.cast::<u64>();
        // SAFETY: `raw` points to `bytes` writable bytes, page aligned.
        unsafe { core::ptr::write_bytes(ptr, 0, len.max(1)) };
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// The first byte (for the driver glue's byte-addressed copies).
    pub(crate) fn as_byte_ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }

    /// Size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.len.max(1) * 8
    }
}

impl Drop for CudaPinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc and freed once, here.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}
