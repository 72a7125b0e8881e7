//! [`Cursor`]: one consumer's position in a slot, turning published totals into exact deltas.

use crate::metrics::Rates;
use crate::metrics::SlotReader;
use crate::metrics::{Counters, Snapshot};

/// What [`Cursor::take`] returns: the newest snapshot and what changed since the previous take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Taken<const K: usize> {
    /// The version taken.
    pub version: u64,
    /// The snapshot (lifetime totals).
    pub snapshot: Snapshot<K>,
    /// Counts since this cursor's previous take (for its first take: since zero, or since the
    /// snapshot [`Cursor::attach`] started from). Summing the deltas of every take gives
    /// the totals: increment counters by these, never by totals.
    pub delta: Counters<K>,
    /// Readback failures since the previous take.
    pub new_readback_errors: u64,
    /// Clock time between the two snapshots this take compares: the previous one taken (or the
    /// one [`Cursor::attach`] started from) and this one. On a first take from zero it is the
    /// time since the cursor's start, when [`Cursor::new_at`] knew it (`None` otherwise).
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

    /// Like [`new`](Cursor::new), for a consumer that knows when counting started (`start_ns`,
    /// for instance when the collector was created, on the same clock): its first take then
    /// has an `elapsed_ns` too, so the first log line shows throughput.
    ///
    /// That holds only if nothing was published before the cursor was made: a consumer
    /// attached after counting began does not know when the counts already published were
    /// made, so its first take (everything since zero) has no `elapsed_ns` rather than a rate
    /// over the wrong time. A late consumer that wants an exact first interval uses
    /// [`attach`](Cursor::attach).
    pub fn new_at(reader: SlotReader<'a, Snapshot<K>>, start_ns: u64) -> Self {
        let start_ns = (reader.version() == 0).then_some(start_ns);
        Self {
            start_ns,
            ..Self::new(reader)
        }
    }

    /// A cursor that starts from the slot's current snapshot: its first take reports what
    /// changed since then, over the time between the two snapshots it compares — an exact
    /// first interval for a consumer attached after counting began. The counts published
    /// before it are in the lifetime totals only. On a slot with nothing published it is
    /// [`new`](Cursor::new).
    pub fn attach(reader: SlotReader<'a, Snapshot<K>>) -> Self {
        let (seen, version) = reader.read();
        Self {
            reader,
            version,
            seen,
            start_ns: None,
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
        // Made with a start after publications: the first take has no rate (the counts were
        // not made since 40).
        let mut late_from_zero = Cursor::new_at(r, 40);
        let t = late_from_zero.take().unwrap();
        assert_eq!((t.delta, t.elapsed_ns), (s.counters, None));
        // Attached after publications: starts from the latest snapshot.
        let mut late = Cursor::attach(r);
        assert!(late.take().is_none());
        let before = s.counters;
        s.counters.record(3, 3).unwrap();
        s.at_ns = 200;
        w.publish(&s);
        let t = late.take().unwrap();
        assert_eq!(
            t.elapsed_ns,
            Some(200 - 190),
            "between the two snapshots compared"
        );
        assert_eq!(t.delta, s.counters.delta_since(&before));
        sum_a.add(&a.take().unwrap().delta);
        sum_b.add(&b.take().unwrap().delta);
        assert_eq!(sum_a, s.counters);
        assert_eq!(sum_b, s.counters);
    }

    #[test]
    fn readback_errors_are_reported_as_changes() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (mut w, r) = slot.split();
        let mut cur = Cursor::new(r);
        let mut s = Snapshot::<2>::ZERO;
        s.readback_errors = 2;
        w.publish(&s);
        assert_eq!(cur.take().unwrap().new_readback_errors, 2);
        s.readback_errors = 3;
        w.publish(&s);
        let t = cur.take().unwrap();
        assert_eq!(
            t.new_readback_errors, 1,
            "the change, not the lifetime total"
        );
        assert_eq!(t.snapshot.readback_errors, 3);
        w.publish(&s);
        assert_eq!(cur.take().unwrap().new_readback_errors, 0);
    }

    #[test]
    fn a_start_after_the_first_snapshot_gives_zero_elapsed_not_a_wrap() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (mut w, r) = slot.split();
        let mut cur = Cursor::new_at(r, 500);
        let mut s = Snapshot::<2>::ZERO;
        s.at_ns = 100;
        s.counters.record(1, 1).unwrap();
        w.publish(&s);
        let t = cur.take().unwrap();
        assert_eq!(t.elapsed_ns, Some(0));
        assert_eq!(t.rates().unwrap().accepted_per_second(), None);
        assert_eq!(cur.seen(), &s);
        assert_eq!(cur.reader().version(), 1);
    }

    #[test]
    fn a_cursor_attached_late_measures_its_first_interval_exactly() {
        const S: u64 = 1_000_000_000;
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (mut w, r) = slot.split();
        let mut early = Cursor::new_at(r, 0);
        let mut s = Snapshot::<2>::ZERO;
        // 60 s of counting, collected every 5 s: 100 drafts per second.
        for i in 1..=12u64 {
            for _ in 0..500 {
                s.counters.record(2, 1).unwrap();
            }
            s.at_ns = i * 5 * S;
            w.publish(&s);
        }
        assert_eq!(early.take().unwrap().delta.drafts, 6_000);
        // Made at 63 s "from zero": 65 s of counts over 2 s would be 32× too high.
        let mut from_zero = Cursor::new_at(r, 63 * S);
        assert_eq!(
            from_zero.take().unwrap().rates(),
            None,
            "no rate rather than a wrong one"
        );
        // Attached at 63 s; the next collection is as of 65 s.
        let mut late = Cursor::attach(r);
        assert!(late.take().is_none(), "nothing new since it attached");
        for _ in 0..500 {
            s.counters.record(2, 1).unwrap();
        }
        s.at_ns = 65 * S;
        w.publish(&s);
        let t = late.take().unwrap();
        assert_eq!(
            t.delta.drafts, 500,
            "counts since the snapshot it started from"
        );
        assert_eq!(t.elapsed_ns, Some(5 * S), "time between the two snapshots");
        assert_eq!(t.rates().unwrap().accepted_per_second(), Some(100.0));
        assert_eq!(
            t.snapshot.counters.drafts, 6_500,
            "lifetime totals unchanged"
        );
        let e = early.take().unwrap();
        assert_eq!((e.delta.drafts, e.elapsed_ns), (500, Some(5 * S)));
        let z = from_zero.take().unwrap();
        assert_eq!((z.delta.drafts, z.elapsed_ns), (500, Some(5 * S)));
        // On an empty slot, attach is new.
        let mut empty = SeqSlot::new(Snapshot::<2>::ZERO);
        let (_, er) = empty.split();
        let mut a = Cursor::attach(er);
        assert_eq!(a.seen(), &Snapshot::ZERO);
        assert!(a.take().is_none());
    }
}
