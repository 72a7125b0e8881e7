//! [`Flight`]: a fixed-capacity FIFO of readbacks in flight, with no allocation.

/// The most readbacks a [`Collector`](crate::Collector) keeps in flight at once.
///
/// Four covers a latency of up to about three deadline periods plus a step: at the 5 s / 5 s
/// cadence, a 10 s readback latency needs three in flight.
pub const MAX_IN_FLIGHT: usize = 4;

/// A first-in, first-out ring of up to `N` values, stored inline.
///
/// ```
/// use specula_core::metrics::Flight;
/// let mut f = Flight::<u64, 2>::new();
/// assert_eq!(f.push(1), Ok(()));
/// assert_eq!(f.push(2), Ok(()));
/// assert_eq!(f.push(3), Err(3)); // full: the value is handed back
/// assert_eq!(f.pop(), Some(1));
/// assert_eq!(f.push(3), Ok(()));
/// assert_eq!((f.pop(), f.pop(), f.pop()), (Some(2), Some(3), None));
/// ```
///
/// A [`Collector`](crate::Collector) keeps up to [`MAX_IN_FLIGHT`] readbacks outstanding at
/// once (fewer when the backend's [`Readback::max_in_flight`](crate::Readback::max_in_flight)
/// says so), so a readback latency above the collection period does not halve the cadence. A
/// backend that keeps one host buffer per outstanding readback can use the same ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Flight<T: Copy, const N: usize = MAX_IN_FLIGHT> {
    items: [Option<T>; N],
    head: usize,
    len: usize,
}

impl<T: Copy, const N: usize> Default for Flight<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy, const N: usize> Flight<T, N> {
    /// An empty ring.
    pub const fn new() -> Self {
        Self {
            items: [None; N],
            head: 0,
            len: 0,
        }
    }

    /// The number of values held.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// True if it holds nothing.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if it holds `N` values.
    pub const fn is_full(&self) -> bool {
        self.len >= N
    }

    /// The capacity, `N`.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Appends `value` at the back; hands it back if the ring is full.
    pub fn push(&mut self, value: T) -> Result<(), T> {
        if self.is_full() {
            return Err(value);
        }
        // `head < N` and `len < N`, so the sum cannot overflow and the index is in bounds.
        let i = (self.head + self.len) % N;
        self.items[i] = Some(value);
        self.len += 1;
        Ok(())
    }

    /// Removes and returns the oldest value.
    pub fn pop(&mut self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let v = self.items[self.head].take();
        self.head = (self.head + 1) % N;
        self.len -= 1;
        v
    }

    /// The oldest value.
    pub fn front(&self) -> Option<&T> {
        if self.is_empty() {
            return None;
        }
        self.items[self.head].as_ref()
    }

    /// The oldest value, mutably.
    pub fn front_mut(&mut self) -> Option<&mut T> {
        if self.is_empty() {
            return None;
        }
        self.items[self.head].as_mut()
    }

    /// The newest value.
    pub fn back(&self) -> Option<&T> {
        self.iter().last()
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// The values, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        // Only held values are `Some`; they run from `head` to the end, then wrap to 0.
        let (wrapped, from_head) = self.items.split_at(self.head);
        from_head.iter().chain(wrapped).flatten()
    }

    /// The values, mutably, oldest first.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        let (wrapped, from_head) = self.items.split_at_mut(self.head);
        from_head.iter_mut().chain(wrapped).flatten()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_survives_wrapping() {
        let mut f = Flight::<u32, 3>::default();
        assert!(f.is_empty() && !f.is_full());
        assert_eq!(f.capacity(), 3);
        assert_eq!((f.front(), f.back()), (None, None));
        let mut next_in = 0;
        let mut next_out = 0;
        for round in 0..10 {
            // Bounded, so a ring that never fills fails here instead of looping for ever.
            for _ in 0..=3 {
                if f.push(next_in).is_err() {
                    break;
                }
                next_in += 1;
                assert!(f.len() <= 3, "holds at most N");
            }
            assert_eq!(f.push(next_in), Err(next_in), "full: handed back");
            assert!(f.is_full());
            assert_eq!(f.len(), 3);
            assert_eq!(f.back(), Some(&(next_in - 1)));
            let expected: [u32; 3] = core::array::from_fn(|k| next_out + k as u32);
            assert!(f.iter().copied().eq(expected));
            // Drain one or two, so the head moves round the ring.
            for _ in 0..1 + round % 2 {
                assert_eq!(f.front(), Some(&next_out));
                assert_eq!(f.pop(), Some(next_out));
                next_out += 1;
            }
        }
        for v in f.iter_mut() {
            *v += 1000;
        }
        assert!(f.iter().all(|&v| v >= 1000));
        if let Some(v) = f.front_mut() {
            *v = 99;
        }
        assert_eq!(f.pop(), Some(99));
        f.clear();
        assert_eq!((f.len(), f.pop(), f.front_mut()), (0, None, None));
    }
}
