//! Wiring engine ranks and replicas to labelled slots with `'static` handles.
//!
//! The core's [`SeqSlot::split`] borrows the slot mutably for as long as the handles live:
//! that is what makes the writer unique. A std runtime wants handles it can move into threads
//! and into a Prometheus collector (which must be `'static`), so [`wire`] allocates each slot
//! once and leaks it: a few hundred bytes per rank, once per process, the usual price of
//! process-lifetime telemetry (the same as a `static`). Wire once at start-up, not per request.

use specula_core::{
    Counters, Cursor, Flight, MAX_IN_FLIGHT, Misuse, Readback, SeqSlot, SlotReader, SlotWriter,
    Snapshot,
};
use std::fmt;
use std::sync::Arc;
use std::task::Poll;

/// Longest label accepted, in bytes.
pub const MAX_LABEL: usize = 64;

/// Why [`wire`] refused a set of labels.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// No label was given.
    NoLabels,
    /// A label is empty or longer than [`MAX_LABEL`] bytes.
    BadLength(String),
    /// A label has a character outside `[A-Za-z0-9_.:-]` (labels become Prometheus label
    /// values and log prefixes; keeping them plain keeps both unambiguous).
    BadCharacter(String),
    /// Two entries have the same label.
    Duplicate(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoLabels => f.write_str("no engine labels given"),
            Self::BadLength(l) => write!(f, "label {l:?} must be 1 to {MAX_LABEL} bytes long"),
            Self::BadCharacter(l) => {
                write!(
                    f,
                    "label {l:?} may only use letters, digits, '_', '.', ':' and '-'"
                )
            }
            Self::Duplicate(l) => write!(f, "label {l:?} is used twice"),
        }
    }
}

impl std::error::Error for WireError {}

struct Entry<const K: usize> {
    label: Arc<str>,
    reader: SlotReader<'static, Snapshot<K>>,
}

/// The readable side of every wired slot, with its label; cheap to clone and `Send + Sync`,
/// so every consumer (log sink, Prometheus collector, `metrics` bridge) gets its own.
#[derive(Clone)]
pub struct Slots<const K: usize> {
    entries: Arc<[Entry<K>]>,
}

impl<const K: usize> fmt::Debug for Slots<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| (&*e.label, e.reader.version())))
            .finish()
    }
}

impl<const K: usize> Slots<K> {
    /// `(label, reader)` for each slot, in wiring order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, SlotReader<'static, Snapshot<K>>)> {
        self.entries.iter().map(|e| (&e.label, e.reader))
    }

    /// The reader of the slot labelled `label`.
    pub fn get(&self, label: &str) -> Option<SlotReader<'static, Snapshot<K>>> {
        self.iter().find(|(l, _)| &***l == label).map(|(_, r)| r)
    }

    /// One fresh [`Cursor`] per slot, with its label: what a new consumer starts from.
    pub fn cursors(&self) -> Vec<(Arc<str>, Cursor<'static, K>)> {
        self.iter()
            .map(|(l, r)| (Arc::clone(l), Cursor::new(r)))
            .collect()
    }

    /// Like [`cursors`](Self::cursors), for a consumer that knows when counting started
    /// (`start_ns` on the collectors' clock): its first take reports a rate too, unless the
    /// slot had already been published to (see [`Cursor::new_at`]).
    pub fn cursors_at(&self, start_ns: u64) -> Vec<(Arc<str>, Cursor<'static, K>)> {
        self.iter()
            .map(|(l, r)| (Arc::clone(l), Cursor::new_at(r, start_ns)))
            .collect()
    }

    /// One [`Cursor::attach`]ed cursor per slot, with its label: for a consumer attached after
    /// counting began, whose first interval starts at each slot's current snapshot.
    pub fn cursors_attached(&self) -> Vec<(Arc<str>, Cursor<'static, K>)> {
        self.iter()
            .map(|(l, r)| (Arc::clone(l), Cursor::attach(r)))
            .collect()
    }

    /// The latest snapshot of every slot, added up (totals over all ranks).
    pub fn total(&self) -> Snapshot<K> {
        let mut t = Snapshot::ZERO;
        for (_, r) in self.iter() {
            let (s, _) = r.read();
            t.counters.add(&s.counters);
            t.readback_errors = t.readback_errors.wrapping_add(s.readback_errors);
            t.at_ns = t.at_ns.max(s.at_ns);
        }
        t
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What [`wire`] returns: one writer per label (hand each to its rank's [`Collector`]) and the
/// [`Slots`] every consumer reads.
///
/// [`Collector`]: specula_core::Collector
pub struct Wired<const K: usize> {
    /// The unique writer of each slot, in label order.
    pub writers: Vec<SlotWriter<'static, Snapshot<K>>>,
    /// The readers, with their labels.
    pub slots: Slots<K>,
}

impl<const K: usize> fmt::Debug for Wired<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wired").field("slots", &self.slots).finish()
    }
}

fn check_label(label: &str) -> Result<(), WireError> {
    if label.is_empty() || label.len() > MAX_LABEL {
        return Err(WireError::BadLength(label.into()));
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
    if !label.chars().all(ok) {
        return Err(WireError::BadCharacter(label.into()));
    }
    Ok(())
}

/// Allocates one slot per label, for the life of the process, and splits each.
///
/// ```
/// use specula::wiring::wire;
/// let wired = wire::<4, _>(["rank0", "rank1"]).unwrap();
/// assert_eq!(wired.writers.len(), 2);
/// assert!(wired.slots.get("rank1").is_some());
/// assert!(wire::<4, _>(["a", "a"]).is_err());
/// ```
pub fn wire<const K: usize, S: AsRef<str>>(
    labels: impl IntoIterator<Item = S>,
) -> Result<Wired<K>, WireError> {
    let labels: Vec<String> = labels.into_iter().map(|l| l.as_ref().to_owned()).collect();
    if labels.is_empty() {
        return Err(WireError::NoLabels);
    }
    for (i, l) in labels.iter().enumerate() {
        check_label(l)?;
        if labels[..i].contains(l) {
            return Err(WireError::Duplicate(l.clone()));
        }
    }
    // Validate everything before leaking anything.
    let mut writers = Vec::with_capacity(labels.len());
    let mut entries = Vec::with_capacity(labels.len());
    for label in labels {
        let slot: &'static mut SeqSlot<Snapshot<K>> =
            Box::leak(Box::new(SeqSlot::new(Snapshot::ZERO)));
        let (w, r) = slot.split();
        writers.push(w);
        entries.push(Entry {
            label: label.into(),
            reader: r,
        });
    }
    Ok(Wired {
        writers,
        slots: Slots {
            entries: entries.into(),
        },
    })
}

/// [`wire`] with the labels `rank0`, `rank1`, … (`n` of them).
pub fn wire_ranks<const K: usize>(n: usize) -> Result<Wired<K>, WireError> {
    wire((0..n).map(|i| format!("rank{i}")))
}

/// A [`Readback`] for counts kept in host memory (a CPU engine, or a GPU engine that already
/// copies its counts back): every readback completes at its first poll. Up to
/// [`MAX_IN_FLIGHT`] copies can be outstanding, and any can be abandoned.
///
/// ```
/// use specula::wiring::HostReadback;
/// let mut host = HostReadback::<4>::default();
/// host.record(3, 2).unwrap();
/// assert_eq!(host.counters().accepted_tokens, 2);
/// ```
#[derive(Clone, Debug, Default)]
pub struct HostReadback<const K: usize> {
    counters: Counters<K>,
    started: Flight<Counters<K>>,
}

impl<const K: usize> HostReadback<K> {
    /// Records one verification step (see [`Counters::record`]).
    pub fn record(&mut self, k: usize, accepted: usize) -> Result<(), specula_core::CountError> {
        self.counters.record(k, accepted)
    }

    /// Records one verified token tree (see [`Counters::record_tree`]).
    pub fn record_tree(
        &mut self,
        depth: usize,
        nodes: usize,
        accepted: usize,
    ) -> Result<(), specula_core::CountError> {
        self.counters.record_tree(depth, nodes, accepted)
    }

    /// Adds counts recorded elsewhere (for instance by a verifier, per step).
    pub fn add(&mut self, delta: &Counters<K>) {
        self.counters.add(delta);
    }

    /// Replaces the totals (for a verifier that keeps its own cumulative counters).
    pub fn set(&mut self, totals: Counters<K>) {
        self.counters = totals;
    }

    /// The counts so far.
    pub fn counters(&self) -> &Counters<K> {
        &self.counters
    }
}

impl<const K: usize> Readback<K> for HostReadback<K> {
    /// Only misuse, answered as every readback does.
    type Error = Misuse;

    fn start(&mut self) -> Result<(), Misuse> {
        // The copy point: counts recorded after this belong to the next readback.
        self.started
            .push(self.counters)
            .map_err(|_| Misuse::AlreadyInFlight)
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, Misuse>> {
        Poll::Ready(self.started.pop().ok_or(Misuse::NothingInFlight))
    }

    fn flush(&mut self) -> Result<Counters<K>, Misuse> {
        self.started.clear();
        Ok(self.counters)
    }

    fn max_in_flight(&self) -> usize {
        MAX_IN_FLIGHT
    }

    fn abandon(&mut self) -> bool {
        // A host copy holds no device resource: it can always be dropped.
        self.started.pop().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_readbacks_complete_in_start_order_and_can_be_abandoned() {
        let mut h = HostReadback::<2>::default();
        assert_eq!(h.max_in_flight(), MAX_IN_FLIGHT);
        assert!(!h.abandon(), "nothing to abandon");
        for i in 1..=MAX_IN_FLIGHT as u64 {
            h.record(1, 0).unwrap();
            h.start().unwrap();
            assert_eq!(h.counters().drafts, i);
        }
        // Beyond capacity: refused as misuse, nothing changes.
        h.record(1, 0).unwrap();
        assert_eq!(h.start(), Err(Misuse::AlreadyInFlight));
        assert!(h.abandon(), "the copy as of 1 draft");
        for expected in 2..=MAX_IN_FLIGHT as u64 {
            assert_eq!(h.poll(), Poll::Ready(Ok(with_drafts(expected))));
        }
        // Nothing in flight: misuse, as for every readback.
        h.record(1, 1).unwrap();
        assert_eq!(h.poll(), Poll::Ready(Err(Misuse::NothingInFlight)));
        h.start().unwrap();
        h.record(2, 2).unwrap();
        assert_eq!(h.flush().map(|c| c.drafts), Ok(7));
        assert!(!h.abandon(), "flush retired the copy in flight");
    }

    #[test]
    fn cursors_attached_start_from_each_slots_current_snapshot() {
        let mut wired = wire::<2, _>(["a", "b"]).unwrap();
        let mut s = Snapshot::<2>::ZERO;
        s.counters.record(2, 1).unwrap();
        s.at_ns = 1_000;
        wired.writers[0].publish(&s);
        let mut attached = wired.slots.cursors_attached();
        let mut from_zero = wired.slots.cursors_at(0);
        assert_eq!(attached.len(), 2);
        assert!(attached.iter_mut().all(|(_, c)| c.take().is_none()));
        s.counters.record(1, 1).unwrap();
        s.at_ns = 3_000;
        wired.writers[0].publish(&s);
        let t = attached[0].1.take().unwrap();
        assert_eq!((t.delta.drafts, t.elapsed_ns), (1, Some(2_000)));
        let z = from_zero[0].1.take().unwrap();
        assert_eq!(
            (z.delta.drafts, z.elapsed_ns),
            (2, None),
            "late: no rate from zero"
        );
        assert_eq!(&*attached[1].0, "b");
    }

    fn with_drafts(n: u64) -> Counters<2> {
        let mut c = Counters::ZERO;
        for _ in 0..n {
            c.record(1, 0).unwrap();
        }
        c
    }
}
