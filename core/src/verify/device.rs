//! Tensors in device memory, in the one [`Batch`](super::Batch) / [`Outputs`](super::Outputs)
//! API: [`Device`] rows (a [`Values::Device`](super::Values::Device)) and [`DeviceOut`] outputs.
//!
//! A batch names no driver, so the driver's buffer is type-erased (`&dyn Any`, the way
//! [`View`] borrows it): a GPU verifier downcasts it back to its own buffer type and checks
//! that its device owns it ([`Driver::owns`](crate::gpu::Driver::owns)); anything else is a
//! typed error ([`GpuError::ForeignMemory`](crate::gpu::GpuError::ForeignMemory)). Host
//! verifiers never read device memory: they refuse it through [`Support::device`](super::Support::device).
//! Everything here is safe: the values are only built from typed, bounds-checked [`View`]s.

use crate::gpu::{Element, Memory, View, ViewMut};
use core::any::Any;
use core::fmt;
use core::marker::PhantomData;

/// The element format of a tensor: binary32, bfloat16 or IEEE binary16 (the formats the
/// kernel reads rows in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Format {
    /// binary32.
    F32,
    /// bfloat16 (16-bit patterns).
    Bf16,
    /// IEEE binary16 (16-bit patterns).
    F16,
}

impl Format {
    /// Bytes per element.
    #[must_use]
    pub const fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }
}

/// A driver buffer with its type erased (what a [`Device`] or [`DeviceOut`] borrows).
type Erased = dyn Any + Send + Sync;

/// `len` elements of one [`Format`] in device memory, from element `offset` of a driver's
/// buffer, borrowed for `'a`. Built from a [`View`] ([`Device::f32`], [`Device::bf16`],
/// [`Device::f16`]; a backend crate builds it from its API's tensors), read only by the GPU
/// verifier of that buffer's driver and device.
///
/// ```
/// use specula_core::gpu::{Memory, View};
/// use specula_core::verify::{Device, Format, Rows};
/// use std::sync::Arc;
/// // A driver's memory (here plain bytes; a GPU backend's buffer handle in practice).
/// struct Mem;
/// impl Memory for Mem {
///     type Buffer = Arc<Vec<u8>>;
///     fn bytes(b: &Arc<Vec<u8>>) -> usize {
///         b.len()
///     }
/// }
/// let buf = Arc::new(vec![0u8; 64]);
/// let logits = Device::bf16(View::<Mem, u16>::new(&buf));
/// assert_eq!((logits.len(), logits.format()), (32, Format::Bf16));
/// let rows = Rows::device(logits, 8); // 4 rows of V = 8, for a `Target`
/// // What the GPU verifier of `Mem` reads; anything else sees no view.
/// assert!(logits.view::<Mem, u16>().is_some());
/// assert!(logits.view::<Mem, f32>().is_none());
/// # let _ = rows;
/// ```
#[derive(Clone, Copy)]
pub struct Device<'a> {
    buffer: &'a Erased,
    offset: usize,
    len: usize,
    format: Format,
}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("format", &self.format)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<'a> Device<'a> {
    fn of<D: Memory, T: Element>(view: View<'a, D, T>, format: Format) -> Self
    where
        D::Buffer: Send + Sync,
    {
        Self {
            buffer: view.buffer(),
            // Views hold whole elements from an element offset.
            offset: view.byte_offset() / T::BYTES,
            len: view.len(),
            format,
        }
    }

    /// binary32 values in device memory.
    #[must_use]
    pub fn f32<D: Memory>(view: View<'a, D, f32>) -> Self
    where
        D::Buffer: Send + Sync,
    {
        Self::of(view, Format::F32)
    }

    /// bfloat16 values (their 16-bit patterns) in device memory.
    #[must_use]
    pub fn bf16<D: Memory>(view: View<'a, D, u16>) -> Self
    where
        D::Buffer: Send + Sync,
    {
        Self::of(view, Format::Bf16)
    }

    /// IEEE binary16 values (their 16-bit patterns) in device memory.
    #[must_use]
    pub fn f16<D: Memory>(view: View<'a, D, u16>) -> Self
    where
        D::Buffer: Send + Sync,
    {
        Self::of(view, Format::F16)
    }

    /// The element format.
    #[must_use]
    pub const fn format(&self) -> Format {
        self.format
    }

    /// Number of values.
    #[must_use]
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no values.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` values from `start`, `None` if outside.
    #[must_use]
    pub fn get(&self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(Self {
            offset: self.offset.checked_add(start)?,
            len,
            ..*self
        })
    }

    /// The same elements as a view of driver `D`'s memory, as `T`s: `None` if the buffer is
    /// not `D`'s, `T` is not as wide as the format's elements, or the window is out of the
    /// buffer (it never is for a value built from a view).
    #[must_use]
    pub fn view<D: Memory, T: Element>(&self) -> Option<View<'a, D, T>> {
        if T::BYTES != self.format.bytes() {
            return None;
        }
        let buf = self.buffer.downcast_ref::<D::Buffer>()?;
        View::range(buf, self.offset, self.len).ok()
    }
}

/// `len` `u32` outputs in device memory that the launch writes in place, borrowed exclusively
/// for `'a` (built from a [`ViewMut`], which holds the buffer exclusively).
pub struct DeviceOut<'a> {
    buffer: &'a Erased,
    offset: usize,
    len: usize,
    _excl: PhantomData<&'a mut [u32]>,
}

impl fmt::Debug for DeviceOut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceOut")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<'a, D: Memory> From<ViewMut<'a, D, u32>> for DeviceOut<'a>
where
    D::Buffer: Send + Sync,
{
    fn from(view: ViewMut<'a, D, u32>) -> Self {
        let view = view.into_view();
        Self {
            buffer: view.buffer(),
            offset: view.byte_offset() / 4,
            len: view.len(),
            _excl: PhantomData,
        }
    }
}

impl<'a> DeviceOut<'a> {
    /// The outputs of `view` (the same as `DeviceOut::from`).
    #[must_use]
    pub fn new<D: Memory>(view: ViewMut<'a, D, u32>) -> Self
    where
        D::Buffer: Send + Sync,
    {
        Self::from(view)
    }

    /// Number of values.
    #[must_use]
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no values.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same elements as a view of driver `D`'s memory the kernel writes, borrowed from
    /// `self` (so exclusively): `None` if the buffer is not `D`'s.
    #[must_use]
    pub fn view_mut<D: Memory>(&mut self) -> Option<ViewMut<'_, D, u32>> {
        let buf = self.buffer.downcast_ref::<D::Buffer>()?;
        Some(ViewMut::shared(
            View::range(buf, self.offset, self.len).ok()?,
        ))
    }
}

/// Outputs in device memory, for [`Outputs::on_device`](super::Outputs::on_device): named
/// fields, so the accepted counts and the tokens cannot be swapped. Laid out as the host
/// outputs ([`Outputs`](super::Outputs)).
#[derive(Debug)]
pub struct DeviceOutputs<'a> {
    /// `accepted[b]` (`B` values).
    pub accepted: DeviceOut<'a>,
    /// The emitted tokens (`B · (k_max+1)` values).
    pub tokens: DeviceOut<'a>,
    /// vLLM's recovered tokens, one per draft slot; `None`: not wanted.
    pub recovered: Option<DeviceOut<'a>>,
}
