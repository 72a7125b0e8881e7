//! [`SeqSlot`]: a single-writer, many-reader, lock-free seqlock slot.

use crate::metrics::Words;
use crate::sync::{Ordering, Stamp, StampAtomic, fence, spin};

/// A seqlock-protected value with one writer and any number of readers.
///
/// Create it, then [`split`](SeqSlot::split) it into the unique [`SlotWriter`] and a `Copy`
/// [`SlotReader`]. The split borrows the slot mutably for as long as the handles live, so the
/// type system guarantees a single writer.
///
/// ```
/// use specula_core::SeqSlot;
///
/// let mut slot = SeqSlot::new([0u64; 4]);
/// let (mut writer, reader) = slot.split();
/// assert_eq!(reader.read(), ([0; 4], 0)); // version 0: nothing published yet
/// writer.publish(&[1, 2, 3, 4]);
/// assert_eq!(reader.read(), ([1, 2, 3, 4], 1));
/// assert_eq!(reader.try_read(1), Some(([1, 2, 3, 4], 1)));
/// ```
///
/// The writer never waits for readers; a reader retries only while a write is in progress.
/// The protocol is the Linux seqcount / crossbeam `SeqLock` one, written so it is sound in
/// Rust's memory model (Boehm, "Can seqlocks get along with programming language memory
/// models?", 2012):
///
/// * writer: stamp := odd (relaxed); `fence(Release)`; payload stores (relaxed);
///   stamp := even (release)
/// * reader: s1 := stamp (acquire); payload loads (relaxed); `fence(Acquire)`;
///   s2 := stamp (relaxed); the read is good iff s1 == s2 and s1 is even.
///
/// Only loads, stores and fences are used, never compare-and-swap, which is why the slot works
/// on thumbv6m and riscv32imc.
///
/// # Stamp width
/// The stamp is 64 bits wide where the target has 64-bit atomics. On 32-bit targets it is
/// 32 bits: a reader could then accept a torn value only if it were suspended in the middle of
/// one read for exactly a multiple of 2³¹ publications. Specula publishes once per collection
/// interval (milliseconds to seconds), so that is years of suspension; the reported version
/// also wraps after 2³¹ publications there.
pub struct SeqSlot<T: Words> {
    stamp: StampAtomic,
    data: T::Storage,
}

impl<T: Words> SeqSlot<T> {
    /// A slot holding `initial` at version 0.
    pub fn new(initial: T) -> Self {
        Self {
            stamp: StampAtomic::new(0),
            data: initial.to_storage(),
        }
    }

    /// Splits the slot into its unique writer and a reader that can be copied freely.
    pub fn split(&mut self) -> (SlotWriter<'_, T>, SlotReader<'_, T>) {
        let this: &Self = self;
        (SlotWriter::new(this), this.reader())
    }

    pub(crate) fn reader(&self) -> SlotReader<'_, T> {
        SlotReader { slot: self }
    }
}

impl<T: Words + Default> Default for SeqSlot<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: Words> core::fmt::Debug for SeqSlot<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SeqSlot")
            .field("version", &version_of(self.stamp.load(Ordering::Relaxed)))
            .finish_non_exhaustive()
    }
}

#[inline]
fn version_of(stamp: Stamp) -> u64 {
    #[allow(clippy::useless_conversion)] // u32 on 32-bit targets
    u64::from(stamp >> 1)
}

/// The unique writer of a [`SeqSlot`]. Not `Clone`: there is exactly one per split.
pub struct SlotWriter<'a, T: Words> {
    slot: &'a SeqSlot<T>,
    /// The writer's own copy of the stamp: as the only writer it never needs to load it.
    stamp: Stamp,
}

impl<'a, T: Words> SlotWriter<'a, T> {
    /// Only for callers that hold `&mut SeqSlot` for `'a` (split, registry): uniqueness.
    pub(crate) fn new(slot: &'a SeqSlot<T>) -> Self {
        Self {
            slot,
            stamp: slot.stamp.load(Ordering::Relaxed),
        }
    }

    /// Publishes `value` and returns its version (1 for the first publication).
    ///
    /// Wait-free: a fixed number of stores, whatever readers do.
    #[inline]
    pub fn publish(&mut self, value: &T) -> u64 {
        let odd = self.stamp.wrapping_add(1);
        self.slot.stamp.store(odd, Ordering::Relaxed);
        // Orders the odd stamp before the payload stores for any reader whose acquire fence
        // sees one of them.
        fence(Ordering::Release);
        value.store(&self.slot.data);
        let even = odd.wrapping_add(1);
        self.slot.stamp.store(even, Ordering::Release);
        self.stamp = even;
        version_of(even)
    }

    /// The version of the last publication (0 if none).
    pub fn version(&self) -> u64 {
        version_of(self.stamp)
    }

    /// A reader of the same slot.
    pub fn reader(&self) -> SlotReader<'a, T> {
        SlotReader { slot: self.slot }
    }
}

impl<T: Words> core::fmt::Debug for SlotWriter<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SlotWriter")
            .field("version", &self.version())
            .finish()
    }
}

/// A reader of a [`SeqSlot`]; `Copy`, so hand one to every consumer.
pub struct SlotReader<'a, T: Words> {
    slot: &'a SeqSlot<T>,
}

impl<T: Words> Clone for SlotReader<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Words> Copy for SlotReader<'_, T> {}

impl<T: Words> core::fmt::Debug for SlotReader<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SlotReader")
            .field("version", &self.version())
            .finish()
    }
}

impl<T: Words> SlotReader<'_, T> {
    /// One attempt: `Some((value, version))` unless a write overlapped it.
    #[inline]
    fn attempt(&self) -> Option<(T, u64)> {
        let s1 = self.slot.stamp.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let value = T::load(&self.slot.data);
        // Orders the payload loads before the second stamp load.
        fence(Ordering::Acquire);
        let s2 = self.slot.stamp.load(Ordering::Relaxed);
        (s1 == s2).then(|| (value, version_of(s1)))
    }

    /// Reads a consistent `(value, version)`, retrying while a write is in progress.
    ///
    /// Lock-free: it can retry only because the writer made progress.
    #[inline]
    pub fn read(&self) -> (T, u64) {
        loop {
            if let Some(r) = self.attempt() {
                return r;
            }
            spin();
        }
    }

    /// At most `attempts` tries (at least one): for interrupt handlers that must not spin on a
    /// writer they preempted. `None` means every try overlapped a write.
    #[inline]
    pub fn try_read(&self, attempts: u32) -> Option<(T, u64)> {
        for i in 0..attempts.max(1) {
            if let Some(r) = self.attempt() {
                return Some(r);
            }
            if i + 1 < attempts {
                spin();
            }
        }
        None
    }

    /// The version of the last completed publication; cheap (one load).
    ///
    /// While a publication is in progress this is still the previous version.
    #[inline]
    pub fn version(&self) -> u64 {
        version_of(self.slot.stamp.load(Ordering::Acquire))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn versions_count_publications() {
        let mut slot = SeqSlot::new((0u64, 0u32));
        let (mut w, r) = slot.split();
        assert_eq!(r.version(), 0);
        for i in 1..=10u64 {
            assert_eq!(w.publish(&(i, i as u32 * 2)), i);
            assert_eq!(r.read(), ((i, i as u32 * 2), i));
            assert_eq!(r.version(), i);
            assert_eq!(w.version(), i);
        }
    }

    #[test]
    fn try_read_fails_while_a_write_is_open() {
        let mut slot = SeqSlot::new(7u64);
        // Simulate a writer preempted mid-write: stamp odd.
        slot.stamp.store(1, Ordering::Relaxed);
        let (_, r) = slot.split();
        assert_eq!(r.try_read(3), None);
        assert_eq!(r.try_read(0), None);
    }

    #[test]
    fn the_stamp_wraps_instead_of_overflowing() {
        let mut slot = SeqSlot::new(1u64);
        // Even, one publication before the stamp wraps: odd = MAX, even = 0.
        slot.stamp.store(Stamp::MAX - 1, Ordering::Relaxed);
        let (mut w, r) = slot.split();
        assert_eq!(w.version(), version_of(Stamp::MAX - 1));
        assert_eq!(w.publish(&2), 0);
        assert_eq!(r.read(), (2, 0));
        assert_eq!(w.publish(&3), 1);
        assert_eq!(r.try_read(1), Some((3, 1)));
    }

    #[test]
    fn wide_payload_round_trips() {
        let mut slot = SeqSlot::new([0u64; 32]);
        let (mut w, r) = slot.split();
        let v: [u64; 32] = core::array::from_fn(|i| (i as u64) << 40 | i as u64);
        w.publish(&v);
        assert_eq!(r.read().0, v);
        let (_, r2) = slot.split();
        assert_eq!(r2.read(), (v, 1));
    }

    #[test]
    fn threads_never_see_torn_values() {
        extern crate std;
        // Each value is [x, x, ..., checksum]; a torn read would break the relation.
        let mut slot = SeqSlot::new([0u64; 8]);
        let (mut w, r) = slot.split();
        let n = if cfg!(miri) { 50 } else { 20_000 };
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(move || {
                    let mut last = 0;
                    for _ in 0..n {
                        let (v, ver) = r.read();
                        assert!(ver >= last, "versions never go back");
                        last = ver;
                        assert!(v[..7].iter().all(|&x| x == v[0]), "torn: {v:?}");
                        assert_eq!(v[7], v[0].wrapping_mul(0x9E37_79B9_7F4A_7C15), "torn");
                    }
                });
            }
            for i in 1..=n as u64 {
                let mut v = [i; 8];
                v[7] = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                w.publish(&v);
            }
        });
    }
}
