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
            ", Avg Draft acceptance rate: {} | lifetime: drafts={}, drafted={}, accepted={}, \
             emitted={}, acceptance rate={}, system efficiency={}, mean acceptance length={}",
            Opt(d.acceptance_rate(), "%"),
            t.drafts,
            t.draft_tokens,
            t.accepted_tokens,
            t.emitted_tokens,
            Opt(t.acceptance_rate(), "%"),
            Opt(t.system_efficiency(), "%"),
            Opt(t.mean_acceptance_length(), ""),
        )?;
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
}
