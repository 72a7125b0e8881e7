//! Device memory ([`RocmDeviceBuffer`]) and page-locked host memory ([`RocmPinnedBuffer`]).

use crate::device::{RocmDevice, RocmStream};
use crate::error::RocmError;
use crate::ffi;
use core::ffi::c_void;
use core::marker::PhantomData;

mod sealed {
    pub trait Sealed {}
}

/// Element types that may live in device memory: plain numbers, any bit pattern valid.
pub trait DeviceCopy: Copy + Default + sealed::Sealed + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceCopy for $t {}
    )*};
}
device_copy!(u8, u32, i32, u64, i64, f32, half::bf16, half::f16);

fn bytes_of<T>(len: usize) -> Result<usize, RocmError> {
    len.checked_mul(size_of::<T>()).ok_or(RocmError::TooLarge)
}

/// `len` elements of `T` in device memory (`hipMalloc`), zeroed at allocation, freed on drop.
pub struct RocmDeviceBuffer<T: DeviceCopy> {
    ptr: *mut c_void,
    len: usize,
    /// Its size in bytes (`len · size_of::<T>()`, or a borrowed buffer's exact size).
    bytes: usize,
    device: RocmDevice,
    /// False for an alias of the caller's memory ([`alias`](Self::alias)): never freed here.
    owned: bool,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns device memory reachable only through HIP calls, which may be made
// from any thread; `T` is plain data.
unsafe impl<T: DeviceCopy> Send for RocmDeviceBuffer<T> {}
// SAFETY: shared references only read the pointer value; device access goes through HIP.
unsafe impl<T: DeviceCopy> Sync for RocmDeviceBuffer<T> {}

impl<T: DeviceCopy> core::fmt::Debug for RocmDeviceBuffer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RocmDeviceBuffer")
            .field("len", &self.len)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl<T: DeviceCopy> RocmDeviceBuffer<T> {
    /// Allocates `len` zeroed elements on `device` (the zeroing completes before this returns).
    ///
    /// # Errors
    /// [`RocmError::Hip`] when allocation fails, [`RocmError::TooLarge`] for absurd sizes.
    pub fn zeroed(device: &RocmDevice, len: usize) -> Result<Self, RocmError> {
        let bytes = bytes_of::<T>(len)?;
        device.bind()?;
        let hip = device.hip();
        let mut ptr: *mut c_void = core::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer. A zero-byte request is allowed.
        hip.check("hipMalloc", unsafe {
            (hip.api.hipMalloc)(&mut ptr, bytes.max(1))
        })?;
        let buf = Self {
            ptr,
            len,
            bytes,
            device: device.clone(),
            owned: true,
            _t: PhantomData,
        };
        let stream = RocmStream::new(device)?;
        // SAFETY: `ptr` holds at least `bytes` bytes of device memory owned by `buf`.
        hip.check("hipMemsetAsync", unsafe {
            (hip.api.hipMemsetAsync)(buf.ptr, 0, bytes, stream.raw)
        })?;
        stream.synchronize()?;
        Ok(buf)
    }

    /// Allocates a buffer holding a copy of `data` (blocking).
    ///
    /// # Errors
    /// As [`zeroed`](Self::zeroed).
    pub fn from_host(device: &RocmDevice, data: &[T]) -> Result<Self, RocmError> {
        let mut buf = Self::zeroed(device, data.len())?;
        let stream = RocmStream::new(device)?;
        buf.enqueue_upload(data, &stream)?;
        stream.synchronize()?;
        Ok(buf)
    }

    /// Copies the whole buffer to a new `Vec` (blocking).
    ///
    /// # Errors
    /// [`RocmError::Hip`] when a copy fails.
    pub fn to_host(&self) -> Result<Vec<T>, RocmError> {
        let mut out = vec![T::default(); self.len];
        let stream = RocmStream::new(&self.device)?;
        let hip = self.device.hip();
        let bytes = bytes_of::<T>(self.len)?;
        // SAFETY: `out` has `bytes` writable bytes and lives until the synchronisation below;
        // the source is this buffer's allocation of the same size.
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                out.as_mut_ptr().cast(),
                self.ptr,
                bytes,
                ffi::MEMCPY_DEVICE_TO_HOST,
                stream.raw,
            )
        })?;
        stream.synchronize()?;
        Ok(out)
    }

    /// Copies `data` into the start of the buffer (blocking).
    ///
    /// # Errors
    /// [`RocmError::LengthMismatch`] if `data` is longer than the buffer, [`RocmError::Hip`] when
    /// the copy fails.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<(), RocmError> {
        let stream = RocmStream::new(&self.device)?;
        self.enqueue_upload(data, &stream)?;
        stream.synchronize()
    }

    /// Enqueues a copy of `data` into the start of the buffer on `stream`. `data` must stay
    /// unchanged until the stream has passed this point: every caller in this crate
    /// synchronises `stream` before `data` can go away.
    pub(crate) fn enqueue_upload(
        &mut self,
        data: &[T],
        stream: &RocmStream,
    ) -> Result<(), RocmError> {
        if data.len() > self.len {
            return Err(RocmError::LengthMismatch {
                what: "upload",
                expected: self.len,
                actual: data.len(),
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        let hip = self.device.hip();
        // SAFETY: the device range holds at least `data.len()` elements; the host range outlives
        // the copy because every caller synchronises `stream` before `data` goes away.
        hip.check("hipMemcpyAsync", unsafe {
            (hip.api.hipMemcpyAsync)(
                self.ptr,
                data.as_ptr().cast(),
                bytes_of::<T>(data.len())?,
                ffi::MEMCPY_HOST_TO_DEVICE,
                stream.raw,
            )
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    pub fn device(&self) -> &RocmDevice {
        &self.device
    }

    /// The raw device pointer, for passing to other HIP code.
    pub fn as_device_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Its size in bytes.
    pub(crate) fn byte_len(&self) -> usize {
        self.bytes
    }

    /// The memory of `src`, as whole `T`s (its exact byte size kept), never freed by the alias:
    /// for a view the kernel reads or writes while the caller's borrow of `src` lasts.
    pub(crate) fn alias<U: DeviceCopy>(src: &RocmDeviceBuffer<U>) -> Self {
        Self {
            ptr: src.ptr,
            len: src.bytes / size_of::<T>(),
            bytes: src.bytes,
            device: src.device.clone(),
            owned: false,
            _t: PhantomData,
        }
    }
}

impl<T: DeviceCopy> Drop for RocmDeviceBuffer<T> {
    fn drop(&mut self) {
        let hip = self.device.hip();
        if self.owned && self.device.bind().is_ok() {
            // SAFETY: `ptr` came from `hipMalloc` on this device (an owned buffer, not an alias)
            // and is freed exactly once.
            let _ = unsafe { (hip.api.hipFree)(self.ptr) };
        }
    }
}

/// `len` elements of page-locked host memory (`hipHostMalloc`), the target of asynchronous
/// device-to-host copies. Only read once the copy that wrote it has completed.
#[derive(Debug)]
pub struct RocmPinnedBuffer<T: DeviceCopy> {
    ptr: *mut c_void,
    len: usize,
    device: RocmDevice,
    _t: PhantomData<T>,
}

// SAFETY: page-locked host memory owned by this value; HIP calls on it may come from any thread.
unsafe impl<T: DeviceCopy> Send for RocmPinnedBuffer<T> {}
// SAFETY: shared access only reads, and only after the writing copy has completed.
unsafe impl<T: DeviceCopy> Sync for RocmPinnedBuffer<T> {}

impl<T: DeviceCopy> RocmPinnedBuffer<T> {
    pub(crate) fn new(device: &RocmDevice, len: usize) -> Result<Self, RocmError> {
        let bytes = bytes_of::<T>(len)?;
        device.bind()?;
        let hip = device.hip();
        let mut ptr: *mut c_void = core::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the flag is a documented value.
        hip.check("hipHostMalloc", unsafe {
            (hip.api.hipHostMalloc)(&mut ptr, bytes.max(1), ffi::HOST_MALLOC_DEFAULT)
        })?;
        // SAFETY: `ptr` is a fresh host allocation of at least `bytes` bytes.
        unsafe { core::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(Self {
            ptr,
            len,
            device: device.clone(),
            _t: PhantomData,
        })
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Elements held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl<T: DeviceCopy> Drop for RocmPinnedBuffer<T> {
    fn drop(&mut self) {
        let hip = self.device.hip();
        // SAFETY: `ptr` came from `hipHostMalloc` and is freed exactly once; owners drop their
        // pinned buffers only after the copies into them have completed.
        let _ = unsafe { (hip.api.hipHostFree)(self.ptr) };
    }
}
