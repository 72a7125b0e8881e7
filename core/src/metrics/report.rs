//! The log line: a [`Report`] formats a [`Taken`] through `core::fmt`, so it works without an
//! allocator (into a `heapless::String`) as well as with one.

use crate::metrics::Counters;
use crate::metrics::Taken;
use crate::metrics::{CostModel, advise};
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
    /// `Some`: the detailed form, with these cost models for the interval's and the
    /// lifetime's advice (`None`: no advice).
    detail: Option<[Option<CostModel>; 2]>,
}

impl<'a, const K: usize> Report<'a, K> {
    /// A report of `taken` for the engine/rank `label`.
    pub fn new(label: &'a str, taken: &'a Taken<K>) -> Self {
        Self {
            label,
            taken,
            detail: None,
        }
    }

    /// The detailed form: after the interval's fields, the acceptance-length distribution
    /// (`Acceptance lengths: 0:N0 1:N1 …`, steps that accepted exactly that many draft
    /// tokens, up to the longest draft of the interval), the conditional acceptance per
    /// position (`Conditional acceptance: …`, accepted given reached and drafted; a value the
    /// counters only bound is an estimate and carries `~`, see
    /// [`AcceptanceLengths`](crate::metrics::AcceptanceLengths)) and, given `cost`, the draft-length advice
    /// (`Advice: k=3 (1.42x; by k: 1.10x, 1.31x, 1.42x, 1.40x)`,
    /// [`advise`]); the lifetime part gains the same three fields over
    /// the totals. Every field is computed from the counters when the line is formatted.
    ///
    /// ```
    /// use specula_core::metrics::CostModel;
    /// use specula_core::{Cursor, Report, SeqSlot, Snapshot};
    /// let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
    /// let (mut w, r) = slot.split();
    /// let mut cursor = Cursor::new(r);
    /// let mut s = Snapshot::ZERO;
    /// for a in [0, 1, 2, 2] {
    ///     s.counters.record(2, a).unwrap();
    /// }
    /// w.publish(&s);
    /// let taken = cursor.take().unwrap();
    /// let cost = CostModel::from_ratio(0.1).unwrap();
    /// let line: heapless::String<1024> =
    ///     Report::new("rank0", &taken).detailed(Some(cost)).to_heapless().unwrap();
    /// assert!(line.contains("Acceptance lengths: 0:1 1:1 2:2, Conditional acceptance: 0.750, 0.667"));
    /// assert!(line.contains("Advice: k=2 (1.88x; by k: 1.59x, 1.88x)"), "{line}");
    /// ```
    #[must_use]
    pub fn detailed(self, cost: Option<CostModel>) -> Self {
        self.detailed_with(cost, cost)
    }

    /// [`detailed`](Self::detailed) with one cost model for the interval's advice and another
    /// for the lifetime's (say, the costs measured during the interval and all of them).
    #[must_use]
    pub fn detailed_with(
        mut self,
        interval: Option<CostModel>,
        lifetime: Option<CostModel>,
    ) -> Self {
        self.detail = Some([interval, lifetime]);
        self
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
        let reached = drafted_positions(d);
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
        if let Some([cost, _]) = self.detail {
            detail_fields(
                f,
                d,
                cost,
                ["Acceptance lengths", "Conditional acceptance", "Advice"],
                ": ",
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
        if let Some([_, cost]) = self.detail {
            detail_fields(
                f,
                t,
                cost,
                ["acceptance lengths", "conditional acceptance", "advice"],
                "=",
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

/// Positions drafted at least once in `c` (trailing positions no draft reached are left out).
fn drafted_positions<const K: usize>(c: &Counters<K>) -> usize {
    c.drafted_per_position
        .iter()
        .rposition(|&n| n != 0)
        .map_or(0, |i| i + 1)
}

/// The detailed form's three fields over `c`, named `names` and joined with `sep`.
fn detail_fields<const K: usize>(
    f: &mut fmt::Formatter<'_>,
    c: &Counters<K>,
    cost: Option<CostModel>,
    names: [&str; 3],
    sep: &str,
) -> fmt::Result {
    // Nothing drafted: every field is n/a (0 of 0 steps of each length says nothing).
    let positions = drafted_positions(c);
    write!(f, ", {}{sep}", names[0])?;
    if positions == 0 {
        f.write_str("n/a")?;
    } else {
        for (j, n) in c.acceptance_lengths().take(positions + 1).enumerate() {
            if j > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{j}:{n}")?;
        }
    }
    write!(f, ", {}{sep}", names[1])?;
    if positions == 0 {
        f.write_str("n/a")?;
    }
    for i in 0..positions {
        if i > 0 {
            f.write_str(", ")?;
        }
        match (c.conditional_acceptance(i), c.reached(i)) {
            (Some(p), Some(r)) if r.is_exact() => write!(f, "{p:.3}")?,
            (Some(p), _) => write!(f, "{p:.3}~")?,
            (None, _) => f.write_str("n/a")?,
        }
    }
    let Some(cost) = cost else {
        return Ok(());
    };
    write!(f, ", {}{sep}", names[2])?;
    match advise(c, &cost) {
        Err(_) => f.write_str("n/a"),
        Ok(a) => {
            write!(f, "k={} ({:.2}x; by k: ", a.recommended(), a.best_speedup())?;
            for (k, _, speedup) in a.iter() {
                if k > 1 {
                    f.write_str(", ")?;
                }
                write!(f, "{speedup:.2}x")?;
            }
            f.write_str(")")
        }
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
    use crate::metrics::CostModel;
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
    fn detailed_line_has_distribution_conditionals_and_advice() {
        let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
        let (mut w, r) = slot.split();
        let mut cur = Cursor::new(r);
        let mut s = Snapshot::<4>::ZERO;
        // Interval 1: fixed length 3 (exact); lifetime then mixes in a length-2 draft.
        for a in [0, 1, 3, 3] {
            s.counters.record(3, a).unwrap();
        }
        s.at_ns = 1_000_000_000;
        w.publish(&s);
        let t = cur.take().unwrap();
        let cost = CostModel::from_ratio(0.25).unwrap();
        let line: heapless::String<1024> = Report::new("r0", &t)
            .detailed(Some(cost))
            .to_heapless()
            .unwrap();
        assert_eq!(
            line.as_str(),
            "SpecDecoding metrics [r0]: Mean acceptance length: 2.75, Accepted throughput: n/a, \
             Drafted throughput: n/a, Accepted: 7 tokens, Drafted: 12 tokens, Per-position \
             acceptance rate: 0.750, 0.500, 0.500, Avg Draft acceptance rate: 58.3%, \
             Acceptance lengths: 0:1 1:1 2:0 3:2, Conditional acceptance: 0.750, 0.667, 1.000, \
             Advice: k=3 (1.57x; by k: 1.40x, 1.50x, 1.57x) | lifetime: drafts=4, drafted=12, \
             accepted=7, emitted=11, acceptance rate=58.3%, system efficiency=68.8%, mean \
             acceptance length=2.75, acceptance lengths=0:1 1:1 2:0 3:2, conditional \
             acceptance=0.750, 0.667, 1.000, advice=k=3 (1.57x; by k: 1.40x, 1.50x, 1.57x)"
        );
        // Interval 2: one length-2 draft accepted in full; the lifetime's position 2 is now
        // only bounded: 2 or 3 steps reached it with a token there, estimated 3 · 4/5 (`~`).
        // No cost: no advice field.
        s.counters.record(2, 2).unwrap();
        s.at_ns = 2_000_000_000;
        w.publish(&s);
        let t = cur.take().unwrap();
        let line: heapless::String<1024> =
            Report::new("r0", &t).detailed(None).to_heapless().unwrap();
        assert!(
            line.contains(
                "Acceptance lengths: 0:0 1:0 2:1, Conditional acceptance: 1.000, 1.000 | lifetime"
            ),
            "{line}"
        );
        assert!(
            line.ends_with(
                "acceptance lengths=0:1 1:1 2:1 3:2, conditional acceptance=0.800, 0.750, 0.833~"
            ),
            "{line}"
        );
        assert!(!line.contains("dvice"), "{line}");
        // Two cost models: the interval's advice with the first, the lifetime's with the second.
        let dear = CostModel::from_ratio(5.0).unwrap();
        let line: heapless::String<1024> = Report::new("r0", &t)
            .detailed_with(Some(dear), Some(cost))
            .to_heapless()
            .unwrap();
        assert!(
            line.contains("Advice: k=1 (0.33x; by k: 0.33x, 0.27x) | lifetime"),
            "{line}"
        );
        assert!(
            line.ends_with("advice=k=3 (1.66x; by k: 1.44x, 1.60x, 1.66x)"),
            "{line}"
        );
        // Nothing drafted in an interval: n/a, advice included.
        s.at_ns = 3_000_000_000;
        w.publish(&s);
        let t = cur.take().unwrap();
        let line: heapless::String<1024> = Report::new("r0", &t)
            .detailed(Some(cost))
            .to_heapless()
            .unwrap();
        assert!(
            line.contains(
                "Acceptance lengths: n/a, Conditional acceptance: n/a, Advice: n/a | lifetime"
            ),
            "{line}"
        );
        // The plain form is unchanged by all of this.
        let plain: heapless::String<1024> = Report::new("r0", &t).to_heapless().unwrap();
        assert!(!plain.contains("Acceptance lengths") && !plain.contains("acceptance lengths"));
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
