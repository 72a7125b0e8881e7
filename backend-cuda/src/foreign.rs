//! [`Foreign`] and [`ForeignMut`]: the caller's cudarc device memory (`CudaSlice`, `CudaView`,
//! `CudaViewMut`, what candle's CUDA storage and mistral.rs hold) as typed views for the shared
//! step path ([`specula_core::gpu::VerifyArgs`]), with no copy and no host staging.
//!
//! A borrow goes through cudarc's `DevicePtr`/`DevicePtrMut` on the device's compute stream: the
//! stream waits for the slice's last write, and when the borrow ends cudarc records the use, so
//! later cudarc work on the slice is ordered after the kernels enqueued meanwhile. The borrow
//! lasts as long as the views (and any graph captured on them): the compiler checks it.

use crate::device::DeviceBuffer;
use crate::driver::CudaDriver;
use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};
use specula_core::gpu::{Element, View, ViewMut};
use std::marker::PhantomData;
use std::sync::Arc;

/// The caller's device memory, read by the kernel, borrowed for `'a`.
pub struct Foreign<'a, T: Element> {
    buf: Arc<DeviceBuffer>,
    _use: SyncOnDrop<'a>,
    _t: PhantomData<&'a [T]>,
}

/// The caller's device memory, written by the kernel, borrowed exclusively for `'a`.
pub struct ForeignMut<'a, T: Element> {
    buf: Arc<DeviceBuffer>,
    _use: SyncOnDrop<'a>,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Element> core::fmt::Debug for Foreign<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Foreign")
            .field("bytes", &self.buf.bytes)
            .finish_non_exhaustive()
    }
}

impl<T: Element> core::fmt::Debug for ForeignMut<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ForeignMut")
            .field("bytes", &self.buf.bytes)
            .finish_non_exhaustive()
    }
}

impl<T: Element> Foreign<'_, T> {
    /// The whole borrowed memory as a typed view.
    #[must_use]
    pub fn view(&self) -> View<'_, CudaDriver, T> {
        View::new(&self.buf)
    }
}

impl<T: Element> ForeignMut<'_, T> {
    /// The whole borrowed memory as a typed view the kernel writes.
    pub fn view_mut(&mut self) -> ViewMut<'_, CudaDriver, T> {
        ViewMut::new(&mut self.buf)
    }
}

impl CudaDriver {
    /// Borrows the caller's `slice` (its elements `T` are what the kernel reads: `u32`, `u64`
    /// or `f32`) for a launch on the device's compute stream.
    pub fn borrow<'a, T: Element, S: DevicePtr<T>>(&'a self, slice: &'a S) -> Foreign<'a, T> {
        let bytes = slice.num_bytes();
        let (ptr, guard) = slice.device_ptr(self.device().stream());
        Foreign {
            buf: Arc::new(DeviceBuffer::borrowed(self.device().context(), ptr, bytes)),
            _use: guard,
            _t: PhantomData,
        }
    }

    /// Borrows the caller's `slice` for the kernel to write (accepted counts, tokens).
    pub fn borrow_mut<'a, T: Element, S: DevicePtrMut<T>>(
        &'a self,
        slice: &'a mut S,
    ) -> ForeignMut<'a, T> {
        let bytes = slice.num_bytes();
        let (ptr, guard) = slice.device_ptr_mut(self.device().stream());
        ForeignMut {
            buf: Arc::new(DeviceBuffer::borrowed(self.device().context(), ptr, bytes)),
            _use: guard,
            _t: PhantomData,
        }
    }
}
