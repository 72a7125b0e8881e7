//! The log line: a [`Report`] formats a [`Taken`] through `core::fmt`, so it works without an
//! allocator (into a `heapless::String`) as well as with one.

use crate::cursor::Taken;
use core::fmt::{self, Display, Write};

/// One "SpecDecoding metrics" log line for one take of a cursor.
///
/// The first part holds the interval since the cursor's previous take (the fields operators
/// read in the well-known engine's log line); the part after `| lifetime:` holds totals.
///
/// ```
/// use specula_core::{Counters, Cursor, Report, SeqSlot, Snapshot};
/// let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
/// let (mut w, r) = slot.split();
/// let mut cursor = Cursor::new(r);
/// let mut s = Snapshot::ZERO;
/// s.counters.record(2, 1).unwrap();
/// w.publish(&s);
/// let line: heapless::String<512> = Report::new("rank0", &cursor.take().unwrap()).to_heapless().unwrap();
/// assert!(line.starts_with("SpecDecoding metrics [rank0]: Mean acceptance length: 2.00"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Report<'a, const K: usize> {
    label: &'a str,
    taken: &'a Taken<K>,
}

impl<'a, const K: usize> Report<'a, K> {
    /// A report of `taken` for the engine/rank `label`.
    pub fn new(label: &'a str, taken: &'a Taken<K>) -> Self {
        Self { label, taken }
    }

    /// Formats into a fixed-capacity string; `Err` if `N` bytes are not enough.
    pub fn to_heapless<const N: usize>(&self) -> Result<heapless::String<N>, fmt::Error> {
        let mut s = heapless::String::new();
        write!(s, "{self}")?;
        Ok(s)
    }
}

struct Opt<T>(Option<T>, &'static str);

impl Display for Opt<f64> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) if self.1 == "%" => write!(f, "{:.1}%", v * 100.0),
            Some(v) => write!(f, "{v:.2}{}", self.1),
            None => f.write_str("n/a"),
        }
    }
}

impl<const K: usize> Display for Report<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.taken.delta;
        let rates = self.taken.rates();
        write!(
            f,
            "SpecDecoding metrics [{}]: Mean acceptance length: {}, Accepted throughput: {}, \
             Drafted throughput: {}, Accepted: {} tokens, Drafted: {} tokens, \
             Per-position acceptance rate: ",
            self.label,
            Opt(d.mean_acceptance_length(), ""),
            Opt(rates.and_then(|r| r.accepted_per_second()), " tokens/s"),
            Opt(rates.and_then(|r| r.drafted_per_second()), " tokens/s"),
            d.accepted_tokens,
            d.draft_tokens,
        )?;
        // Positions no draft reached in this interval are left out (trailing ones only).
        let reached = d
            .drafted_per_position
            .iter()
            .rposition(|&n| n != 0)
            .map_or(0, |i| i + 1);
        for i in 0..reached {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d.position_acceptance_rate(i) {
                Some(r) => write!(f, "{r:.3}")?,
                None => f.write_str("n/a")?,
            }
        }
        if reached == 0 {
            f.write_str("n/a")?;
        }
        let t = &self.taken.snapshot.counters;
        write!(
            f,
            ", Avg Draft acceptance rate: {}",
            Opt(d.acceptance_rate(), "%")
        )?;
        // Token trees: once any was counted (a chain-only runtime's line is unchanged).
        let trees = t.tree_drafts != 0;
        if trees {
            write!(
                f,
                ", Trees: {}, Tree draft nodes: {}, Mean tree size: {}",
                d.tree_drafts,
                d.tree_draft_tokens,
                Opt(d.mean_tree_size(), " nodes"),
            )?;
        }
        write!(
            f,
            " | lifetime: drafts={}, drafted={}, accepted={}, emitted={}, acceptance rate={}, \
             system efficiency={}, mean acceptance length={}",
            t.drafts,
            t.draft_tokens,
            t.accepted_tokens,
            t.emitted_tokens,
            Opt(t.acceptance_rate(), "%"),
            Opt(t.system_efficiency(), "%"),
            Opt(t.mean_acceptance_length(), ""),
        )?;
        if trees {
            write!(
                f,
                ", trees={}, tree draft nodes={}, mean tree size={}",
                t.tree_drafts,
                t.tree_draft_tokens,
                Opt(t.mean_tree_size(), ""),
            )?;
        }
        if self.taken.new_readback_errors != 0 {
            write!(
                f,
                ", readback errors={} (+{})",
                self.taken.snapshot.readback_errors, self.taken.new_readback_errors
            )?;
        }
        Ok(())
    }
}

/// The "SpecDecoding metrics: " line exactly as vLLM v1 logs it (its `SpecDecodingLogging`),
/// for log parsers written against vLLM: the same prefix, fields, number formats and
/// definitions.
///
/// `Mean acceptance length` is 1 + accepted / drafts; throughputs are over the time between
/// the two snapshots compared (0.00 when unknown, as vLLM prints 0 for no elapsed time);
/// `Per-position acceptance rate` has one value per position of the runtime's draft length,
/// each the drafts accepted at that position divided by **all** drafts (vLLM's definition);
/// `Avg Draft acceptance rate` is accepted / drafted tokens in percent. An interval without
/// drafts has no line at all ([`new`](Self::new) returns `None`), as vLLM logs nothing then.
///
/// ```
/// use specula_core::{Cursor, SeqSlot, Snapshot, VllmReport};
/// let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
/// let (mut w, r) = slot.split();
/// let mut cursor = Cursor::new(r);
/// let mut s = Snapshot::ZERO;
/// s.counters.record(2, 1).unwrap();
/// w.publish(&s);
/// let taken = cursor.take().unwrap();
/// let line: heapless::String<512> = VllmReport::new(&taken, 2).unwrap().to_heapless().unwrap();
/// assert_eq!(
///     line.as_str(),
///     "SpecDecoding metrics: Mean acceptance length: 2.00, Accepted throughput: 0.00 tokens/s, \
///      Drafted throughput: 0.00 tokens/s, Accepted: 1 tokens, Drafted: 2 tokens, \
///      Per-position acceptance rate: 1.000, 0.000, Avg Draft acceptance rate: 50.0%"
/// );
/// ```
#[derive(Clone, Copy, Debug)]
pub struct VllmReport<'a, const K: usize> {
    taken: &'a Taken<K>,
    positions: usize,
}

impl<'a, const K: usize> VllmReport<'a, K> {
    /// The line for `taken` with `draft_len` per-position values (capped at `K`); `None`
    /// when the interval has no drafts (vLLM prints nothing for it).
    pub fn new(taken: &'a Taken<K>, draft_len: usize) -> Option<Self> {
        (taken.delta.drafts != 0).then_some(Self {
            taken,
            positions: draft_len.min(K),
        })
    }

    /// Formats into a fixed-capacity string; `Err` if `N` bytes are not enough.
    pub fn to_heapless<const N: usize>(&self) -> Result<heapless::String<N>, fmt::Error> {
        let mut s = heapless::String::new();
        write!(s, "{self}")?;
        Ok(s)
    }
}

impl<const K: usize> Display for VllmReport<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.taken.delta;
        // `new` guarantees at least one draft.
        let drafts = d.drafts.max(1) as f64;
        let rates = self.taken.rates();
        write!(
            f,
            "SpecDecoding metrics: Mean acceptance length: {:.2}, Accepted throughput: {:.2} \
             tokens/s, Drafted throughput: {:.2} tokens/s, Accepted: {} tokens, Drafted: {} \
             tokens, Per-position acceptance rate: ",
            1.0 + d.accepted_tokens as f64 / drafts,
            rates.and_then(|r| r.accepted_per_second()).unwrap_or(0.0),
            rates.and_then(|r| r.drafted_per_second()).unwrap_or(0.0),
            d.accepted_tokens,
            d.draft_tokens,
        )?;
        for (i, n) in d.accepted_per_position[..self.positions].iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{:.3}", *n as f64 / drafts)?;
        }
        f.write_str(", Avg Draft acceptance rate: ")?;
        match d.acceptance_rate() {
            Some(r) => write!(f, "{:.1}%", r * 100.0),
            // Python's "%.1f" of NaN.
            None => f.write_str("nan%"),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Cursor, SeqSlot, Snapshot};

    #[test]
    fn line_has_interval_and_lifetime_fields() {
        let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
        let (mut w, r) = slot.split();
        let mut cur = Cursor::new(r);
        let mut s = Snapshot::<4>::ZERO;
        s.counters.record(4, 2).unwrap();
        s.at_ns = 1_000_000_000;
        w.publish(&s);
        cur.take().unwrap();
        s.counters.record(3, 3).unwrap();
        s.counters.record(3, 0).unwrap();
        s.at_ns = 3_000_000_000;
        s.readback_errors = 2;
        w.publish(&s);
        let t = cur.take().unwrap();
        let line: heapless::String<512> = Report::new("r0", &t).to_heapless().unwrap();
        assert_eq!(
            line.as_str(),
            "SpecDecoding metrics [r0]: Mean acceptance length: 2.50, Accepted throughput: \
             1.50 tokens/s, Drafted throughput: 3.00 tokens/s, Accepted: 3 tokens, Drafted: 6 \
             tokens, Per-position acceptance rate: 0.500, 0.500, 0.500, Avg Draft acceptance \
             rate: 50.0% | lifetime: drafts=3, drafted=10, accepted=5, emitted=8, acceptance \
             rate=50.0%, system efficiency=61.5%, mean acceptance length=2.67, readback \
             errors=2 (+2)"
        );
        // Too small a buffer is an error, not a panic or a truncated line.
        assert!(Report::new("r0", &t).to_heapless::<16>().is_err());
    }

    #[test]
    fn tree_counts_join_the_line_once_a_tree_was_counted() {
        let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
        let (mut w, r) = slot.split();
        let mut cur = Cursor::new(r);
        let mut s = Snapshot::<4>::ZERO;
        s.counters.record_tree(2, 6, 1).unwrap();
        s.counters.record_tree(3, 14, 3).unwrap();
        s.at_ns = 1_000_000_000;
        w.publish(&s);
        let t = cur.take().unwrap();
        let line: heapless::String<512> = Report::new("r0", &t).to_heapless().unwrap();
        assert_eq!(
            line.as_str(),
            "SpecDecoding metrics [r0]: Mean acceptance length: 3.00, Accepted throughput: n/a, \
             Drafted throughput: n/a, Accepted: 4 tokens, Drafted: 5 tokens, Per-position \
             acceptance rate: 1.000, 0.500, 1.000, Avg Draft acceptance rate: 80.0%, Trees: 2, \
             Tree draft nodes: 20, Mean tree size: 10.00 nodes | lifetime: drafts=2, drafted=5, \
             accepted=4, emitted=6, acceptance rate=80.0%, system efficiency=85.7%, mean \
             acceptance length=3.00, trees=2, tree draft nodes=20, mean tree size=10.00"
        );
        // An interval without trees still shows the (zero) tree fields once trees were seen.
        s.counters.record(4, 0).unwrap();
        s.at_ns = 2_000_000_000;
        w.publish(&s);
        let t = cur.take().unwrap();
        let line: heapless::String<512> = Report::new("r0", &t).to_heapless().unwrap();
        assert!(
            line.contains("Trees: 0, Tree draft nodes: 0, Mean tree size: n/a |"),
            "{line}"
        );
        assert!(
            line.ends_with("trees=2, tree draft nodes=20, mean tree size=10.00"),
            "{line}"
        );
    }

    #[test]
    fn vllm_line_is_vllms_format_and_definitions() {
        let mut slot = SeqSlot::new(Snapshot::<8>::ZERO);
        let (mut w, r) = slot.split();
        let mut cur = Cursor::new(r);
        let mut s = Snapshot::<8>::ZERO;
        s.at_ns = 1_000_000_000;
        w.publish(&s);
        let idle = cur.take().unwrap();
        assert!(VllmReport::new(&idle, 4).is_none(), "no drafts: no line");
        // Draft lengths 1..=4, every token accepted but the last one of each draft.
        for k in 1..=4 {
            s.counters.record(k, k - 1).unwrap();
        }
        s.at_ns = 3_000_000_000;
        w.publish(&s);
        let t = cur.take().unwrap();
        let line: heapless::String<512> = VllmReport::new(&t, 4).unwrap().to_heapless().unwrap();
        // Per position: accepted there / all 4 drafts (0.75, 0.5, 0.25, 0), not / drafts that
        // reached the position; 4 positions (the draft length), not K = 8.
        assert_eq!(
            line.as_str(),
            "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 3.00 \
             tokens/s, Drafted throughput: 5.00 tokens/s, Accepted: 6 tokens, Drafted: 10 \
             tokens, Per-position acceptance rate: 0.750, 0.500, 0.250, 0.000, Avg Draft \
             acceptance rate: 60.0%"
        );
        assert!(VllmReport::new(&t, 4).unwrap().to_heapless::<32>().is_err());
    }
}
