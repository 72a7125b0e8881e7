//! Typed, borrowed views of device buffers: what the step path takes instead of raw pointers.

use core::fmt;
use core::marker::PhantomData;

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u16 {}
}

/// An element type the kernel reads or writes (`u32`, `u64`, `f32`; `i32` for the tree links;
/// `u16` for bf16 / f16 patterns).
pub trait Element: sealed::Sealed + Copy + Default {
    /// Its size in bytes.
    const BYTES: usize;
    /// Its native-endian bytes, written to `out[..BYTES]` (so a driver needs no `unsafe` to
    /// stage a typed slice).
    fn write_ne(self, out: &mut [u8]);
    /// The value of native-endian `bytes[..BYTES]`.
    fn read_ne(bytes: &[u8]) -> Self;
    /// Fills `out` with the consecutive elements of `bytes` from byte `offset`, up to the last
    /// that fits (the rest of `out` keeps its values): a driver's
    /// [`read_host`](super::Driver::read_host) once it holds its page-locked buffer as bytes.
    fn read_slice_ne(bytes: &[u8], offset: usize, out: &mut [Self]) {
        let elements = bytes
            .get(offset..)
            .unwrap_or_default()
            .chunks_exact(Self::BYTES);
        for (x, b) in out.iter_mut().zip(elements) {
            *x = Self::read_ne(b);
        }
    }
}

macro_rules! element {
    ($t:ty, $n:literal) => {
        impl Element for $t {
            const BYTES: usize = $n;
            fn write_ne(self, out: &mut [u8]) {
                out[..$n].copy_from_slice(&self.to_ne_bytes());
            }
            fn read_ne(bytes: &[u8]) -> Self {
                let mut b = [0u8; $n];
                b.copy_from_slice(&bytes[..$n]);
                <$t>::from_ne_bytes(b)
            }
        }
    };
}
element!(u32, 4);
element!(u64, 8);
element!(f32, 4);
element!(i32, 4);
element!(u16, 2);

/// The device memory views point into: a GPU API's buffer handle and its size. The base of
/// [`Driver`](super::Driver), apart from it so that views (which [`VerifyArgs`](super::VerifyArgs)
/// hold) need nothing of the driver's calls.
pub trait Memory {
    /// Device memory (a shared handle: clones refer to the same memory). `'static`: a handle,
    /// not a borrow, so a batch can carry it type-erased ([`Device`](crate::verify::Device)).
    type Buffer: Clone + fmt::Debug + 'static;
    /// The size of `buf` in bytes.
    fn bytes(buf: &Self::Buffer) -> usize;
}

/// A view is out of its buffer's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct OutOfBounds;

fn window<D: Memory, T: Element>(
    buf: &D::Buffer,
    offset: usize,
    len: usize,
) -> Result<(), OutOfBounds> {
    let end = offset.checked_add(len).ok_or(OutOfBounds)?;
    let bytes = end.checked_mul(T::BYTES).ok_or(OutOfBounds)?;
    if bytes > D::bytes(buf) {
        return Err(OutOfBounds);
    }
    Ok(())
}

/// `len` elements of type `T` read by the kernel, starting at element `offset` of a device
/// buffer, borrowed for `'a`.
pub struct View<'a, D: Memory, T: Element> {
    buf: &'a D::Buffer,
    offset: usize,
    len: usize,
    _t: PhantomData<&'a [T]>,
}

impl<D: Memory, T: Element> Clone for View<'_, D, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<D: Memory, T: Element> Copy for View<'_, D, T> {}

impl<D: Memory, T: Element> fmt::Debug for View<'_, D, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<'a, D: Memory, T: Element> View<'a, D, T> {
    /// The whole buffer, as `T`s (a trailing partial element is left out).
    pub fn new(buf: &'a D::Buffer) -> Self {
        Self {
            buf,
            offset: 0,
            len: D::bytes(buf) / T::BYTES,
            _t: PhantomData,
        }
    }

    /// Elements `offset .. offset + len` of the buffer.
    pub fn range(buf: &'a D::Buffer, offset: usize, len: usize) -> Result<Self, OutOfBounds> {
        window::<D, T>(buf, offset, len)?;
        Ok(Self {
            buf,
            offset,
            len,
            _t: PhantomData,
        })
    }

    /// The buffer viewed.
    pub fn buffer(&self) -> &'a D::Buffer {
        self.buf
    }

    /// The first element's byte offset in the buffer.
    pub fn byte_offset(&self) -> usize {
        self.offset * T::BYTES
    }

    /// Elements viewed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no element is viewed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Row tensor a kernel reads through one pointer, in one element format: binary32 values, or
/// bf16 / f16 patterns (which of the two, the launch's shape words say:
/// [`FLAG_TARGET_BF16`](crate::gpu::kernels::FLAG_TARGET_BF16), ...). One value per tensor, so
/// a launch cannot pass a tensor in two formats at once.
pub enum RowsView<'a, D: Memory> {
    /// Binary32 rows.
    F32(View<'a, D, f32>),
    /// bf16 / f16 rows as their 16-bit patterns.
    Half(View<'a, D, u16>),
}

impl<D: Memory> Clone for RowsView<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<D: Memory> Copy for RowsView<'_, D> {}

impl<D: Memory> fmt::Debug for RowsView<'_, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32(v) => f.debug_tuple("F32").field(v).finish(),
            Self::Half(v) => f.debug_tuple("Half").field(v).finish(),
        }
    }
}

impl<'a, D: Memory> RowsView<'a, D> {
    /// The buffer viewed.
    pub fn buffer(&self) -> &'a D::Buffer {
        match self {
            Self::F32(v) => v.buffer(),
            Self::Half(v) => v.buffer(),
        }
    }

    /// The first element's byte offset in the buffer.
    pub fn byte_offset(&self) -> usize {
        match self {
            Self::F32(v) => v.byte_offset(),
            Self::Half(v) => v.byte_offset(),
        }
    }

    /// Elements viewed.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Half(v) => v.len(),
        }
    }

    /// True if no element is viewed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for bf16 / f16 rows.
    pub const fn is_half(&self) -> bool {
        matches!(self, Self::Half(_))
    }
}

/// `len` elements of type `T` written by the kernel: the buffer is borrowed exclusively for
/// `'a`, so nothing else reads or writes it through this orchestration meanwhile.
pub struct ViewMut<'a, D: Memory, T: Element> {
    inner: View<'a, D, T>,
    _excl: PhantomData<&'a mut [T]>,
}

impl<D: Memory, T: Element> fmt::Debug for ViewMut<'_, D, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewMut")
            .field("offset", &self.inner.offset)
            .field("len", &self.inner.len)
            .finish_non_exhaustive()
    }
}

impl<'a, D: Memory, T: Element> ViewMut<'a, D, T> {
    /// The whole buffer, as `T`s.
    pub fn new(buf: &'a mut D::Buffer) -> Self {
        let buf: &'a D::Buffer = buf;
        Self {
            inner: View::new(buf),
            _excl: PhantomData,
        }
    }

    /// Elements `offset .. offset + len` of the buffer.
    pub fn range(buf: &'a mut D::Buffer, offset: usize, len: usize) -> Result<Self, OutOfBounds> {
        let buf: &'a D::Buffer = buf;
        Ok(Self {
            inner: View::range(buf, offset, len)?,
            _excl: PhantomData,
        })
    }

    /// A view the orchestration writes through although it holds the buffer shared (its own
    /// staging buffers, whose writes are ordered on one stream).
    pub(crate) fn shared(inner: View<'a, D, T>) -> Self {
        Self {
            inner,
            _excl: PhantomData,
        }
    }

    /// The view itself, for a type-erased output ([`DeviceOut`](crate::verify::DeviceOut)),
    /// which keeps the exclusive borrow.
    pub(crate) fn into_view(self) -> View<'a, D, T> {
        self.inner
    }

    /// The same elements, read-only (for instance to copy the outputs down).
    pub fn as_view(&self) -> View<'_, D, T> {
        self.inner
    }

    /// The buffer viewed.
    pub fn buffer(&self) -> &D::Buffer {
        self.inner.buf
    }

    /// The first element's byte offset in the buffer.
    pub fn byte_offset(&self) -> usize {
        self.inner.byte_offset()
    }

    /// Elements viewed.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True if no element is viewed.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
}
