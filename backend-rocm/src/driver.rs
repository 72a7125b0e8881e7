//! [`RocmDriver`]: the HIP runtime as a [`specula_core::gpu::Driver`], so the shared readback
//! ring of `specula_core::gpu` (the code the host driver of `specula-tests` runs end to end in
//! CI) is ROCm's readback. The verifier is not ported onto it yet: [`Driver::launch`] and graph
//! capture answer [`RocmError::Unsupported`].

use crate::device::{Device, Event, Stream};
use crate::error::RocmError;
use crate::ffi;
use crate::memory::{DeviceBuffer, PinnedBuffer};
use specula_core::gpu::{Driver, Element, Launch, Status};
use specula_core::kernels;
use std::sync::Arc;

/// The HIP runtime on one [`Device`] (a shared handle).
#[derive(Clone, Debug)]
pub struct RocmDriver {
    device: Device,
}

impl RocmDriver {
    /// The driver of `device`.
    #[must_use]
    pub fn new(device: Device) -> Self {
        Self { device }
    }
}

/// Never constructed: HIP graph capture is not bound by this crate yet.
#[derive(Debug)]
pub enum NoGraph {}

fn bytes_in(words: usize) -> usize {
    words.saturating_mul(8)
}

impl Driver for RocmDriver {
    type Error = RocmError;
    type Stream = Arc<Stream>;
    type Event = Arc<Event>;
    type Buffer = Arc<DeviceBuffer<u64>>;
    type HostBuffer = PinnedBuffer<u64>;
    type Graph = NoGraph;

    fn stream(&self) -> Result<Arc<Stream>, RocmError> {
        Stream::new(&self.device).map(Arc::new)
    }

    fn event(&self) -> Result<Arc<Event>, RocmError> {
        Event::new(&self.device).map(Arc::new)
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<DeviceBuffer<u64>>, RocmError> {
        DeviceBuffer::zeroed(&self.device, bytes.div_ceil(8)).map(Arc::new)
    }

    fn bytes(buf: &Arc<DeviceBuffer<u64>>) -> usize {
        bytes_in(buf.len())
    }

    fn alloc_host(&self, bytes: usize) -> Result<PinnedBuffer<u64>, RocmError> {
        PinnedBuffer::new(&self.device, bytes.div_ceil(8))
    }

    fn upload<T: Element>(
        &self,
        stream: &Arc<Stream>,
        dst: &Arc<DeviceBuffer<u64>>,
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
        stream: &Arc<Stream>,
        dst: &Arc<DeviceBuffer<u64>>,
        src: &Arc<DeviceBuffer<u64>>,
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
        stream: &Arc<Stream>,
        dst: &PinnedBuffer<u64>,
        dst_offset: usize,
        src: &Arc<DeviceBuffer<u64>>,
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
        // stream is synchronised (`RocmReadback`'s drop).
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

    unsafe fn read_host<T: Element>(&self, buf: &PinnedBuffer<u64>, offset: usize, out: &mut [T]) {
        let len = bytes_in(buf.len());
        for (i, x) in out.iter_mut().enumerate() {
            let at = offset + i * T::BYTES;
            if at + T::BYTES > len {
                return; // out of bounds: the orchestration never asks
            }
            // SAFETY: in bounds; the caller guarantees no copy into `buf` is in flight.
            let b = unsafe {
                core::slice::from_raw_parts(buf.as_mut_ptr().cast::<u8>().add(at), T::BYTES)
            };
            *x = T::read_ne(b);
        }
    }

    fn record(&self, event: &Arc<Event>, stream: &Arc<Stream>) -> Result<(), RocmError> {
        self.device.bind()?;
        event.record(stream)
    }

    fn wait(&self, stream: &Arc<Stream>, event: &Arc<Event>) -> Result<(), RocmError> {
        self.device.bind()?;
        stream.wait(event)
    }

    fn query(&self, event: &Arc<Event>) -> Result<Status, RocmError> {
        self.device.bind()?;
        Ok(if event.query()? {
            Status::Ready
        } else {
            Status::Pending
        })
    }

    fn sync_event(&self, event: &Arc<Event>) -> Result<(), RocmError> {
        self.device.bind()?;
        event.synchronize()
    }

    fn sync_stream(&self, stream: &Arc<Stream>) -> Result<(), RocmError> {
        stream.synchronize()
    }

    fn launch(&self, _: &Arc<Stream>, _: &Launch<'_, '_, Self>) -> Result<(), RocmError> {
        Err(RocmError::Unsupported(
            "kernel launch through the shared driver trait",
        ))
    }

    fn begin_capture(&self, _: &Arc<Stream>) -> Result<(), RocmError> {
        Err(RocmError::Unsupported("HIP graph capture"))
    }

    fn end_capture(&self, _: &Arc<Stream>) -> Result<NoGraph, RocmError> {
        Err(RocmError::Unsupported("HIP graph capture"))
    }

    fn replay(&self, graph: &NoGraph, _: &Arc<Stream>) -> Result<(), RocmError> {
        match *graph {}
    }

    fn multiprocessors(&self) -> u32 {
        1
    }

    fn block_threads(&self) -> u32 {
        kernels::BLOCK_THREADS
    }
}
