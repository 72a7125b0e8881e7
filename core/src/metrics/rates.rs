//! Derived metrics: acceptance rate, system efficiency, mean acceptance length, per-position
//! rates and throughput. Every ratio with a zero denominator is `None`, never NaN or infinity.

use crate::metrics::Counters;

#[inline]
fn ratio(num: u64, den: u64) -> Option<f64> {
    (den != 0).then(|| num as f64 / den as f64)
}

impl<const K: usize> Counters<K> {
    /// Accepted draft tokens / draft tokens, in 0–1.
    pub fn acceptance_rate(&self) -> Option<f64> {
        ratio(self.accepted_tokens, self.draft_tokens)
    }

    /// Emitted tokens / Σ(k + 1): the share of the target model's scored positions that
    /// became output, in 0–1 (1 means every draft was fully accepted).
    pub fn system_efficiency(&self) -> Option<f64> {
        ratio(
            self.emitted_tokens,
            self.draft_tokens.wrapping_add(self.drafts),
        )
    }

    /// Emitted tokens per draft (= 1 + accepted per draft): tokens produced per target pass.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        ratio(self.emitted_tokens, self.drafts)
    }

    /// Acceptance rate at draft position `i` among drafts that had a token there.
    /// `None` past `K` or when no draft reached position `i`.
    pub fn position_acceptance_rate(&self, i: usize) -> Option<f64> {
        ratio(
            *self.accepted_per_position.get(i)?,
            *self.drafted_per_position.get(i)?,
        )
    }

    /// Draft nodes per token tree ([`tree_draft_tokens`](Counters::tree_draft_tokens) /
    /// [`tree_drafts`](Counters::tree_drafts)): the mean tree size, the root excluded.
    pub fn mean_tree_size(&self) -> Option<f64> {
        ratio(self.tree_draft_tokens, self.tree_drafts)
    }

    /// Acceptance at position `i` per draft, the definition the well-known engine's
    /// `Per-position acceptance rate` uses (equal to
    /// [`position_acceptance_rate`](Self::position_acceptance_rate) when every draft has `K`
    /// tokens).
    pub fn position_acceptance_per_draft(&self, i: usize) -> Option<f64> {
        ratio(*self.accepted_per_position.get(i)?, self.drafts)
    }
}

/// Counts recorded over an interval of known length: throughput.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Rates<const K: usize> {
    /// The counts recorded in the interval.
    pub delta: Counters<K>,
    /// The interval's length in nanoseconds.
    pub elapsed_ns: u64,
}

impl<const K: usize> Rates<K> {
    fn per_second(&self, n: u64) -> Option<f64> {
        (self.elapsed_ns != 0).then(|| n as f64 * 1e9 / self.elapsed_ns as f64)
    }
    /// Accepted draft tokens per second.
    pub fn accepted_per_second(&self) -> Option<f64> {
        self.per_second(self.delta.accepted_tokens)
    }
    /// Drafted tokens per second.
    pub fn drafted_per_second(&self) -> Option<f64> {
        self.per_second(self.delta.draft_tokens)
    }
    /// Emitted tokens per second.
    pub fn emitted_per_second(&self) -> Option<f64> {
        self.per_second(self.delta.emitted_tokens)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn zero_denominators_are_none() {
        let c = Counters::<2>::ZERO;
        assert_eq!(c.acceptance_rate(), None);
        assert_eq!(c.system_efficiency(), None);
        assert_eq!(c.mean_acceptance_length(), None);
        assert_eq!(c.position_acceptance_rate(0), None);
        assert_eq!(c.position_acceptance_rate(5), None);
        let r = Rates {
            delta: c,
            elapsed_ns: 0,
        };
        assert_eq!(r.accepted_per_second(), None);
    }

    #[test]
    fn derived_values_match_definitions() {
        let mut c = Counters::<4>::ZERO;
        c.record(4, 4).unwrap(); // 5 emitted of 5 scored
        c.record(2, 0).unwrap(); // 1 emitted of 3 scored
        assert_eq!(c.acceptance_rate(), Some(4.0 / 6.0));
        assert_eq!(c.system_efficiency(), Some(6.0 / 8.0));
        assert_eq!(c.mean_acceptance_length(), Some(3.0));
        assert_eq!(c.position_acceptance_rate(0), Some(0.5));
        assert_eq!(c.position_acceptance_rate(3), Some(1.0));
        assert_eq!(c.position_acceptance_per_draft(3), Some(0.5));
        let r = Rates {
            delta: c,
            elapsed_ns: 2_000_000_000,
        };
        assert_eq!(r.accepted_per_second(), Some(2.0));
        assert_eq!(r.drafted_per_second(), Some(3.0));
        assert_eq!(r.emitted_per_second(), Some(3.0));
    }
}
