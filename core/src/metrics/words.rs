//! Conversion of plain values to and from relaxed atomic storage, the payload of a
//! [`SeqSlot`](crate::SeqSlot).

use crate::sync::{AtomicU32, Ordering};

/// A `u64` held in relaxed atomic storage.
///
/// On targets without 64-bit atomics it is two 32-bit halves. A reader can then see halves of
/// two different values, which is harmless inside a seqlock: the stamp check discards such a read.
#[derive(Debug)]
pub struct Cell64 {
    #[cfg(any(loom, target_has_atomic = "64"))]
    v: crate::sync::AtomicU64,
    #[cfg(not(any(loom, target_has_atomic = "64")))]
    lo: AtomicU32,
    #[cfg(not(any(loom, target_has_atomic = "64")))]
    hi: AtomicU32,
}

impl Cell64 {
    /// A cell holding `v`.
    #[inline]
    pub fn new(v: u64) -> Self {
        #[cfg(any(loom, target_has_atomic = "64"))]
        {
            Self {
                v: crate::sync::AtomicU64::new(v),
            }
        }
        #[cfg(not(any(loom, target_has_atomic = "64")))]
        {
            Self {
                lo: AtomicU32::new(v as u32),
                hi: AtomicU32::new((v >> 32) as u32),
            }
        }
    }

    /// Relaxed load.
    #[inline]
    pub fn load(&self) -> u64 {
        #[cfg(any(loom, target_has_atomic = "64"))]
        {
            self.v.load(Ordering::Relaxed)
        }
        #[cfg(not(any(loom, target_has_atomic = "64")))]
        {
            u64::from(self.lo.load(Ordering::Relaxed))
                | (u64::from(self.hi.load(Ordering::Relaxed)) << 32)
        }
    }

    /// Relaxed store.
    #[inline]
    pub fn store(&self, v: u64) {
        #[cfg(any(loom, target_has_atomic = "64"))]
        {
            self.v.store(v, Ordering::Relaxed)
        }
        #[cfg(not(any(loom, target_has_atomic = "64")))]
        {
            self.lo.store(v as u32, Ordering::Relaxed);
            self.hi.store((v >> 32) as u32, Ordering::Relaxed);
        }
    }
}

/// A cell holding 0.
impl Default for Cell64 {
    #[inline]
    fn default() -> Self {
        Self::new(0)
    }
}

/// A `u32` held in relaxed atomic storage.
#[derive(Debug)]
pub struct Cell32(AtomicU32);

impl Cell32 {
    /// A cell holding `v`.
    #[inline]
    pub fn new(v: u32) -> Self {
        Self(AtomicU32::new(v))
    }
    /// Relaxed load.
    #[inline]
    pub fn load(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
    /// Relaxed store.
    #[inline]
    pub fn store(&self, v: u32) {
        self.0.store(v, Ordering::Relaxed)
    }
}

/// A cell holding 0.
impl Default for Cell32 {
    #[inline]
    fn default() -> Self {
        Self::new(0)
    }
}

/// A `Copy` value that can travel through a [`SeqSlot`](crate::SeqSlot) as atomic words.
///
/// Implement it for your own record by giving it a storage type made of [`Cell64`], [`Cell32`]
/// or other `Words` storages, one per field:
///
/// ```
/// use specula_core::metrics::{Cell64, Words};
///
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// struct Pair { a: u64, b: u64 }
///
/// struct PairCells { a: Cell64, b: Cell64 }
///
/// impl Words for Pair {
///     type Storage = PairCells;
///     fn to_storage(&self) -> PairCells { PairCells { a: Cell64::new(self.a), b: Cell64::new(self.b) } }
///     fn store(&self, s: &PairCells) { s.a.store(self.a); s.b.store(self.b); }
///     fn load(s: &PairCells) -> Self { Pair { a: s.a.load(), b: s.b.load() } }
/// }
///
/// let mut slot = specula_core::SeqSlot::new(Pair { a: 0, b: 0 });
/// let (mut w, r) = slot.split();
/// w.publish(&Pair { a: 1, b: 2 });
/// assert_eq!(r.read(), (Pair { a: 1, b: 2 }, 1));
/// ```
///
/// Conversion of plain values to and from relaxed atomic storage, the payload of a
/// [`SeqSlot`](crate::SeqSlot).
///
/// A seqlock that is sound in Rust never reads a payload non-atomically while a writer may be
/// storing it: that would be a data race even if the torn value is later discarded. So every
/// payload lives in atomic cells, stored and loaded with `Relaxed`, and the slot's stamp and
/// fences give the ordering. Values are converted field by field (no transmute of structs with
/// padding).
pub trait Words: Copy {
    /// The relaxed atomic storage for one value.
    type Storage;
    /// Fresh storage holding `self`.
    fn to_storage(&self) -> Self::Storage;
    /// Stores `self` into `storage` with relaxed stores.
    fn store(&self, storage: &Self::Storage);
    /// Loads a value from `storage` with relaxed loads (possibly torn; the slot discards those).
    fn load(storage: &Self::Storage) -> Self;
}

impl Words for u64 {
    type Storage = Cell64;
    #[inline]
    fn to_storage(&self) -> Cell64 {
        Cell64::new(*self)
    }
    #[inline]
    fn store(&self, s: &Cell64) {
        s.store(*self)
    }
    #[inline]
    fn load(s: &Cell64) -> Self {
        s.load()
    }
}

impl Words for u32 {
    type Storage = Cell32;
    #[inline]
    fn to_storage(&self) -> Cell32 {
        Cell32::new(*self)
    }
    #[inline]
    fn store(&self, s: &Cell32) {
        s.store(*self)
    }
    #[inline]
    fn load(s: &Cell32) -> Self {
        s.load()
    }
}

impl Words for i64 {
    type Storage = Cell64;
    #[inline]
    fn to_storage(&self) -> Cell64 {
        Cell64::new(*self as u64)
    }
    #[inline]
    fn store(&self, s: &Cell64) {
        s.store(*self as u64)
    }
    #[inline]
    fn load(s: &Cell64) -> Self {
        s.load() as i64
    }
}

impl Words for f64 {
    type Storage = Cell64;
    #[inline]
    fn to_storage(&self) -> Cell64 {
        Cell64::new(self.to_bits())
    }
    #[inline]
    fn store(&self, s: &Cell64) {
        s.store(self.to_bits())
    }
    #[inline]
    fn load(s: &Cell64) -> Self {
        f64::from_bits(s.load())
    }
}

impl<T: Words, const N: usize> Words for [T; N] {
    type Storage = [T::Storage; N];
    #[inline]
    fn to_storage(&self) -> Self::Storage {
        core::array::from_fn(|i| self[i].to_storage())
    }
    #[inline]
    fn store(&self, s: &Self::Storage) {
        for (v, c) in self.iter().zip(s.iter()) {
            v.store(c);
        }
    }
    #[inline]
    fn load(s: &Self::Storage) -> Self {
        core::array::from_fn(|i| T::load(&s[i]))
    }
}

impl<A: Words, B: Words> Words for (A, B) {
    type Storage = (A::Storage, B::Storage);
    #[inline]
    fn to_storage(&self) -> Self::Storage {
        (self.0.to_storage(), self.1.to_storage())
    }
    #[inline]
    fn store(&self, s: &Self::Storage) {
        self.0.store(&s.0);
        self.1.store(&s.1);
    }
    #[inline]
    fn load(s: &Self::Storage) -> Self {
        (A::load(&s.0), B::load(&s.1))
    }
}
