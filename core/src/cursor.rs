//! [`Cursor`]: one consumer's position in a slot, turning published totals into exact deltas.

use crate::counters::{Counters, Snapshot};
use crate::metrics::Rates;
use crate::slot::SlotReader;

/// What [`Cursor::take`] returns: the newest snapshot and what changed since the previous take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Taken<const K: usize> {
    /// The version taken.
    pub version: u64,
    /// The snapshot (lifetime totals).
    pub snapshot: Snapshot<K>,
    /// Counts since this cursor's previous take (since zero for its first take). Summing the
    /// deltas of every take gives the totals: increment counters by these, never by totals.
    pub delta: Counters<K>,
    /// Readback failures since the previous take.
    pub new_readback_errors: u64,
    /// Clock time between the previous snapshot taken and this one (`None` on the first take).
    pub elapsed_ns: Option<u64>,
}

impl<const K: usize> Taken<K> {
    /// Throughput over the interval since the previous take, when its length is known.
    pub fn rates(&self) -> Option<Rates<K>> {
        self.elapsed_ns.map(|elapsed_ns| Rates {
            delta: self.delta,
            elapsed_ns,
        })
    }
}

/// A consumer's private view of a snapshot slot.
///
/// Every consumer (log line, Prometheus, `metrics` bridge, …) owns its own cursor and calls
/// [`take`](Cursor::take) on its own schedule; each count published reaches each cursor
/// exactly once.
#[derive(Debug)]
pub struct Cursor<'a, const K: usize> {
    reader: SlotReader<'a, Snapshot<K>>,
    version: u64,
    seen: Snapshot<K>,
    /// Clock time the cursor started counting from, when known: gives the first take a rate.
    start_ns: Option<u64>,
}

impl<'a, const K: usize> Cursor<'a, K> {
    /// A cursor that has seen nothing: its first take reports everything since zero.
    pub fn new(reader: SlotReader<'a, Snapshot<K>>) -> Self {
        Self {
            reader,
            version: 0,
            seen: Snapshot::ZERO,
            start_ns: None,
        }
    }

    /// Like [`new`](Cursor::new), for a consumer that knows when counting started (for
    /// instance when the collector was created, on the same clock): its first take then has an
    /// `elapsed_ns` too, so the first log line shows throughput.
    pub fn new_at(reader: SlotReader<'a, Snapshot<K>>, start_ns: u64) -> Self {
        Self {
            start_ns: Some(start_ns),
            ..Self::new(reader)
        }
    }

    /// The newest snapshot and the exact delta since this cursor's previous take, or `None` if
    /// nothing was published since.
    #[inline]
    pub fn take(&mut self) -> Option<Taken<K>> {
        if self.reader.version() == self.version {
            return None; // cheap path: one load
        }
        let (snapshot, version) = self.reader.read();
        if version == self.version {
            return None;
        }
        let taken = Taken {
            version,
            snapshot,
            delta: snapshot.counters.delta_since(&self.seen.counters),
            new_readback_errors: snapshot
                .readback_errors
                .wrapping_sub(self.seen.readback_errors),
            elapsed_ns: match (self.version, self.start_ns) {
                (0, None) => None,
                (0, Some(start)) => Some(snapshot.at_ns.saturating_sub(start)),
                _ => Some(snapshot.at_ns.saturating_sub(self.seen.at_ns)),
            },
        };
        self.version = version;
        self.seen = snapshot;
        Some(taken)
    }

    /// The last snapshot this cursor took.
    pub fn seen(&self) -> &Snapshot<K> {
        &self.seen
    }

    /// The slot reader behind this cursor.
    pub fn reader(&self) -> SlotReader<'a, Snapshot<K>> {
        self.reader
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::SeqSlot;

    #[test]
    fn deltas_sum_to_totals_per_cursor() {
        let mut slot = SeqSlot::new(Snapshot::<3>::ZERO);
        let (mut w, r) = slot.split();
        let mut a = Cursor::new(r);
        let mut b = Cursor::new(r);
        let mut s = Snapshot::<3>::ZERO;
        let (mut sum_a, mut sum_b) = (Counters::<3>::ZERO, Counters::<3>::ZERO);
        assert!(a.take().is_none());
        for i in 0..20u64 {
            s.counters
                .record(1 + (i % 3) as usize, (i % 2) as usize)
                .unwrap();
            s.at_ns = i * 10;
            w.publish(&s);
            if i % 2 == 0 {
                sum_a.add(&a.take().unwrap().delta);
            }
            if i % 7 == 0 {
                let t = b.take().unwrap();
                sum_b.add(&t.delta);
                assert_eq!(t.elapsed_ns.is_some(), i != 0);
                assert!(b.take().is_none(), "no new version → nothing");
            }
        }
        sum_b.add(&b.take().unwrap().delta);
        sum_a.add(&a.take().unwrap().delta);
        assert!(a.take().is_none());
        let mut late = Cursor::new_at(r, 40);
        let t = late.take().unwrap();
        assert_eq!(
            t.elapsed_ns,
            Some(190 - 40),
            "first take measured from the start"
        );
        assert_eq!(t.delta, s.counters);
        assert_eq!(sum_a, s.counters);
        assert_eq!(sum_b, s.counters);
    }
}
