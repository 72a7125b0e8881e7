//! Tests written to kill the surviving mutants of `scripts/mutants.sh` (issue 19): every test
//! here pins a value or a boundary that some mutation of the core changes. The known-answer bit
//! patterns were computed once by this implementation and are what every backend (the GPU
//! kernels included) must produce: a change here is a change of behaviour, not a test to update.
//!
//! Everything runs under Miri too (`cargo +nightly miri test -p specula-core --test
//! mutation_gaps`); the few sweeps that would take minutes there take fewer points under Miri.

use core::fmt::Write as _;
use specula_core::error_kind::ErrorKind;
use specula_core::words::{Cell32, Cell64, Words};
use specula_core::{CountError, Counters, Registry, RegistryError, SeqSlot, Snapshot};

/// `format!` without alloc: the core's tests stay `no_std`-shaped, and a buffer overflow fails.
fn fmt<T: core::fmt::Display>(v: &T) -> heapless::String<256> {
    let mut s = heapless::String::new();
    write!(s, "{v}").expect("fits 256 bytes");
    s
}

fn dbg<T: core::fmt::Debug>(v: &T) -> heapless::String<256> {
    let mut s = heapless::String::new();
    write!(s, "{v:?}").expect("fits 256 bytes");
    s
}

// ---------------------------------------------------------------------------------------------
// Slot and words
// ---------------------------------------------------------------------------------------------

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
    assert_eq!(r.try_read(0), Some(([9, 8], 0)), "0 attempts still tries once");
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

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

#[test]
fn registry_len_and_is_empty() {
    let mut reg: Registry<u64, 4> = Registry::default();
    assert_eq!((reg.len(), reg.is_empty()), (0, true));
    {
        let (ws, rd) = reg.split();
        assert!(ws.is_empty());
        assert_eq!((rd.len(), rd.is_empty()), (0, true));
        assert_eq!(rd.iter().count(), 0);
    }
    assert_eq!(reg.add("a", 10), Ok(0));
    assert_eq!((reg.len(), reg.is_empty()), (1, false));
    assert_eq!(reg.add("b", 20), Ok(1));
    assert_eq!(reg.add("c", 30), Ok(2));
    assert_eq!((reg.len(), reg.is_empty()), (3, false));
    let (mut ws, rd) = reg.split();
    assert_eq!((ws.len(), rd.len(), rd.is_empty()), (3, 3, false));
    ws[2].publish(&33);
    let got: heapless::Vec<(&str, (u64, u64)), 4> =
        rd.iter().map(|(l, r)| (l, r.read())).collect();
    assert_eq!(got, [("a", (10, 0)), ("b", (20, 0)), ("c", (33, 1))]);
    assert_eq!(rd.get("b").map(|r| r.read()), Some((20, 0)));
    assert_eq!(rd.get("c").map(|r| r.read()), Some((33, 1)));
    let copy = rd;
    assert_eq!(copy.get("a").map(|r| r.read()), Some((10, 0)));
}

#[test]
fn registry_labels_up_to_the_limit() {
    let mut reg: Registry<u32, 2> = Registry::new();
    let max = "0123456789abcdef0123456789abcdef";
    assert_eq!(max.len(), specula_core::registry::MAX_LABEL);
    assert_eq!(reg.add(max, 1), Ok(0));
    assert_eq!(
        reg.add("0123456789abcdef0123456789abcdefg", 1),
        Err(RegistryError::LabelTooLong)
    );
    assert_eq!(reg.len(), 1, "a refused entry is not added");
}

// ---------------------------------------------------------------------------------------------
// Error types: Display and Debug
// ---------------------------------------------------------------------------------------------

#[test]
fn registry_and_count_errors_display() {
    assert_eq!(fmt(&RegistryError::Full), "registry is full");
    assert_eq!(
        fmt(&RegistryError::LabelTooLong),
        "label longer than 32 bytes"
    );
    assert_eq!(
        fmt(&RegistryError::DuplicateLabel),
        "label already registered"
    );
    assert_eq!(dbg(&RegistryError::Full), "Full");
    assert_eq!(fmt(&CountError::EmptyDraft), "draft length k is 0");
    assert_eq!(
        fmt(&CountError::DraftTooLong { k: 9, max: 4 }),
        "draft length 9 exceeds maximum 4"
    );
    assert_eq!(
        fmt(&CountError::AcceptedExceedsDraft { accepted: 3, k: 2 }),
        "3 tokens accepted of a 2-token draft"
    );
    assert_eq!(
        dbg(&CountError::DraftTooLong { k: 9, max: 4 }),
        "DraftTooLong { k: 9, max: 4 }"
    );
}

#[test]
fn error_kinds_display_their_names() {
    let all = [
        (ErrorKind::NotCompiledIn, "not compiled in"),
        (ErrorKind::NoDriver, "no driver"),
        (ErrorKind::NoDevice, "no device"),
        (ErrorKind::NoCompiler, "no kernel compiler"),
        (ErrorKind::Compile, "kernel compilation failed"),
        (ErrorKind::InvalidInput, "invalid input"),
        (ErrorKind::Misuse, "misuse"),
        (ErrorKind::Device, "device failure"),
        (ErrorKind::Resource, "resource exhausted"),
    ];
    for (kind, name) in all {
        assert_eq!(kind.as_str(), name);
        assert_eq!(fmt(&kind), name);
    }
    assert_eq!(dbg(&ErrorKind::NoDevice), "NoDevice");
}
