//! The seqlock slot and its payload words: versions, handles, and every `Words` impl
//! round-tripping its bits.

use crate::support::dbg;
use specula_core::metrics::{Cell32, Cell64, Words};
use specula_core::{Counters, SeqSlot, Snapshot};

#[test]
fn slot_handles_debug_show_the_version() {
    let mut slot = SeqSlot::new(5u64);
    assert_eq!(dbg(&slot), "SeqSlot { version: 0, .. }");
    {
        let (mut w, r) = slot.split();
        w.publish(&6);
        w.publish(&7);
        assert_eq!(dbg(&w), "SlotWriter { version: 2 }");
        assert_eq!(dbg(&r), "SlotReader { version: 2 }");
    }
    assert_eq!(dbg(&slot), "SeqSlot { version: 2, .. }");
}

#[test]
fn a_second_split_continues_the_versions() {
    let mut slot = SeqSlot::new(0u32);
    {
        let (mut w, _) = slot.split();
        assert_eq!(w.publish(&1), 1);
        assert_eq!(w.publish(&2), 2);
    }
    let (mut w, r) = slot.split();
    assert_eq!(w.version(), 2, "a new writer starts from the slot's stamp");
    assert_eq!(w.publish(&3), 3);
    assert_eq!(r.read(), (3, 3));
    assert_eq!(w.reader().read(), (3, 3));
}

#[test]
fn try_read_succeeds_on_a_quiet_slot() {
    let mut slot = SeqSlot::new([9u64, 8]);
    let (mut w, r) = slot.split();
    assert_eq!(
        r.try_read(0),
        Some(([9, 8], 0)),
        "0 attempts still tries once"
    );
    assert_eq!(r.try_read(1), Some(([9, 8], 0)));
    w.publish(&[1, 2]);
    assert_eq!(r.try_read(3), Some(([1, 2], 1)));
    assert_eq!(r.version(), 1);
}

#[test]
fn default_slot_holds_the_default_value() {
    let mut slot = SeqSlot::<Snapshot<2>>::default();
    let (mut w, r) = slot.split();
    assert_eq!(r.read(), (Snapshot::ZERO, 0));
    assert_eq!(w.version(), 0);
    let mut s = Snapshot::<2>::default();
    assert_eq!(s, Snapshot::ZERO);
    s.at_ns = 3;
    assert_eq!(w.publish(&s), 1);
    assert_eq!(r.read(), (s, 1));
}

#[test]
fn cells_hold_every_bit() {
    let c = Cell64::new(0xDEAD_BEEF_0123_4567);
    assert_eq!(c.load(), 0xDEAD_BEEF_0123_4567);
    c.store(u64::MAX);
    assert_eq!(c.load(), u64::MAX);
    assert_eq!(Cell64::default().load(), 0);
    let c = Cell32::new(0x89AB_CDEF);
    assert_eq!(c.load(), 0x89AB_CDEF);
    c.store(7);
    assert_eq!(c.load(), 7);
    assert_eq!(Cell32::default().load(), 0);
}

/// `to_storage`, `load` and `store` of every `Words` impl, with values no constant mutant
/// (0, 1, −1, default) can produce.
#[test]
fn every_words_impl_round_trips() {
    fn round_trip<T: Words + PartialEq + core::fmt::Debug>(initial: T, next: T) {
        let mut slot = SeqSlot::new(initial);
        let (mut w, r) = slot.split();
        assert_eq!(r.read(), (initial, 0), "to_storage and load");
        w.publish(&next);
        assert_eq!(r.read(), (next, 1), "store and load");
        let s = initial.to_storage();
        next.store(&s);
        assert_eq!(T::load(&s), next);
    }
    round_trip(0x1234_5678_9ABC_DEF0u64, u64::MAX - 2);
    round_trip(0x1234_5678u32, u32::MAX - 2);
    round_trip(-5i64, i64::MIN + 3);
    round_trip(-2.5f64, 1.0e300);
    round_trip([3u32, 4, 5], [6, 7, 8]);
    round_trip((11u64, 12u32), (13, 14));
    round_trip(((1u32, -2i64), [0.5f64; 2]), ((3, -4), [0.25, 8.0]));
    let mut c = Counters::<3>::ZERO;
    c.record(3, 2).unwrap();
    c.record(2, 1).unwrap();
    let mut d = c;
    d.record(1, 1).unwrap();
    round_trip(c, d);
    let s = Snapshot {
        counters: c,
        at_ns: 17,
        readback_errors: 4,
    };
    let t = Snapshot {
        counters: d,
        at_ns: 29,
        readback_errors: 5,
    };
    round_trip(s, t);
}
