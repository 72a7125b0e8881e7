//! The acceptance-length distribution and per-position conditional acceptance, derived from
//! the per-position counters when they are read (a report, a scrape, an advice), never on the
//! step path: [`Counters::record`], the GPU kernel's counters and the collector are unchanged.

use crate::metrics::Counters;

/// Steps that reached a draft position and had a token there, as far as the counters tell
/// (see the [type documentation](AcceptanceLengths)).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Reached {
    /// The fewest steps consistent with the counters.
    pub min: u64,
    /// The most steps consistent with the counters.
    pub max: u64,
    /// The estimate, in `[min, max]`: `A[i-1] · D[i] / D[i-1]` clamped into the range.
    pub estimate: f64,
}

impl Reached {
    /// True when the counters determine the count (`min == max`).
    pub fn is_exact(&self) -> bool {
        self.min == self.max
    }
}

/// A range of step counts the counters allow, `min ..= max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CountRange {
    /// The fewest consistent with the counters.
    pub min: u64,
    /// The most consistent with the counters.
    pub max: u64,
}

impl CountRange {
    /// True when the counters determine the count (`min == max`).
    pub fn is_exact(&self) -> bool {
        self.min == self.max
    }
}

/// The acceptance-length distribution: for `j = 0, 1, …, K`, the steps that accepted exactly
/// `j` draft tokens ([`Counters::acceptance_lengths`]).
///
/// The acceptance-length distribution and per-position conditional acceptance, derived from
/// the per-position counters when they are read (a report, a scrape, an advice), never on the
/// step path: [`Counters::record`], the GPU kernel's counters and the collector are unchanged.
///
/// # What the counters hold
/// A step that drafted `k` tokens and accepted the first `a` adds 1 to
/// `accepted_per_position[0..a]` and to `drafted_per_position[0..k]`. Writing `A[i]` and `D[i]`
/// for the two arrays (`A[-1] = D[-1] = drafts`, `A[K] = D[K] = 0`):
///
/// * `A[i]` = steps with `a > i`, `D[i]` = steps with `k > i`: the counters hold the
///   distribution of the accepted length and, separately, the distribution of the draft
///   length — not their joint distribution.
/// * **Exact:** steps that accepted exactly `j` tokens, `A[j-1] − A[j]`, for every `j` in
///   `0..=K` ([`Counters::accepted_exactly`], [`Counters::acceptance_lengths`]), and steps that
///   drafted exactly `j`, `D[j-1] − D[j]` ([`Counters::drafted_exactly`]). Interval values are
///   the same functions of the interval's delta (they are linear in the counters), so deltas of
///   the distribution sum to its totals like every other count.
/// * **Exact when the draft length is the same for every step** (a fixed
///   `num_speculative_tokens`), **bounded otherwise:** full acceptances (`a = k`) and the
///   denominator of the conditional acceptance at position `i`, the steps that reached `i`
///   (accepted `0..i`) *and* had a token there. With mixed lengths, a step that accepted `i`
///   tokens either drafted exactly `i` (full acceptance) or was rejected at `i`, and the
///   marginals do not say which. [`Counters::reached`] gives the range the counts allow,
///   `[max(A[i], A[i-1] − (D[i-1] − D[i])), min(A[i-1], D[i])]`, which is a single value
///   whenever no step's draft ended at `i` (`D[i-1] = D[i]`) or every step that had position
///   `i` accepted it.
///
/// Inside that range the estimate is `A[i-1] · D[i] / D[i-1]`: exact when the range is a single
/// value, and otherwise right in expectation when a step's draft length does not depend on how
/// its earlier positions fare (a fixed length cut short at the end of a request, an engine-wide
/// length changed per interval). A drafter that stops early *because* its tokens look unlikely
/// breaks that assumption; the range still holds. The conditional acceptance at `i` is then
/// `A[i] / reached` ([`Counters::conditional_acceptance`]), never above 1.
///
/// Adding a counter of full acceptances per draft length would make all of it exact, but it is
/// device work per step in every kernel and a change of the counters' layout; the range and the
/// estimate above cost nothing on the step path.
#[derive(Clone, Debug)]
pub struct AcceptanceLengths<'a, const K: usize> {
    counters: &'a Counters<K>,
    next: usize,
}

impl<const K: usize> Iterator for AcceptanceLengths<'_, K> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let n = self.counters.accepted_exactly(self.next)?;
        self.next += 1;
        Some(n)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (K + 1).saturating_sub(self.next);
        (left, Some(left))
    }
}

impl<const K: usize> ExactSizeIterator for AcceptanceLengths<'_, K> {}

impl<const K: usize> Counters<K> {
    /// `A[i]` with `A[-1] = drafts` and `A[K] = 0` (`i` is the position plus one).
    fn accepted_from(&self, i: usize) -> u64 {
        match i {
            0 => self.drafts,
            _ => self.accepted_per_position.get(i - 1).copied().unwrap_or(0),
        }
    }

    /// `D[i]` with `D[-1] = drafts` and `D[K] = 0` (`i` is the position plus one).
    fn drafted_from(&self, i: usize) -> u64 {
        match i {
            0 => self.drafts,
            _ => self.drafted_per_position.get(i - 1).copied().unwrap_or(0),
        }
    }

    /// Steps that accepted exactly `j` draft tokens (`j` in `0..=K`; `None` past `K`): exact,
    /// whatever the draft lengths. Saturates at 0 on counters that are not consistent (a
    /// position accepted more often than the one before it), never wraps.
    ///
    /// ```
    /// use specula_core::Counters;
    /// let mut c = Counters::<4>::ZERO;
    /// c.record(4, 0).unwrap();
    /// c.record(4, 2).unwrap();
    /// c.record(2, 2).unwrap(); // a shorter draft, fully accepted
    /// assert_eq!(c.acceptance_lengths().collect::<Vec<_>>(), [1, 0, 2, 0, 0]);
    /// ```
    pub fn accepted_exactly(&self, j: usize) -> Option<u64> {
        (j <= K).then(|| {
            self.accepted_from(j)
                .saturating_sub(self.accepted_from(j + 1))
        })
    }

    /// Steps that drafted exactly `j` tokens (`j` in `1..=K`; `None` for 0 or past `K`).
    pub fn drafted_exactly(&self, j: usize) -> Option<u64> {
        (1..=K).contains(&j).then(|| {
            self.drafted_from(j)
                .saturating_sub(self.drafted_from(j + 1))
        })
    }

    /// The acceptance-length distribution, `K + 1` values: steps that accepted exactly
    /// `0, 1, …, K` draft tokens. They sum to [`drafts`](Counters::drafts) and
    /// `Σ j · count` is [`accepted_tokens`](Counters::accepted_tokens).
    pub fn acceptance_lengths(&self) -> AcceptanceLengths<'_, K> {
        AcceptanceLengths {
            counters: self,
            next: 0,
        }
    }

    /// Steps that reached draft position `i` (accepted every earlier position) and had a token
    /// there: the denominator of the conditional acceptance at `i`. Exact for `i = 0` (every
    /// draft) and whenever the counters determine it (module documentation); otherwise a
    /// range and the estimate inside it. `None` past `K`.
    pub fn reached(&self, i: usize) -> Option<Reached> {
        if i >= K {
            return None;
        }
        // With p = i (the position) and the shifted indices of accepted_from / drafted_from:
        // A[p-1] = accepted_from(p), A[p] = accepted_from(p + 1), the same for D.
        let a_prev = self.accepted_from(i);
        let a_here = self.accepted_from(i + 1);
        let d_prev = self.drafted_from(i);
        let d_here = self.drafted_from(i + 1);
        // Steps that accepted i tokens and drafted exactly i (full acceptances of length i):
        // at most the drafts of length i and the steps that accepted exactly i; at least the
        // steps that accepted i or more minus those that had a token at i.
        let ended = d_prev.saturating_sub(d_here);
        let stopped = a_prev.saturating_sub(a_here);
        let full_max = ended.min(stopped);
        let full_min = a_prev.saturating_sub(d_here);
        let max = a_prev.saturating_sub(full_min);
        // Inconsistent counters (a decreasing readback) must not give min > max.
        let min = a_prev.saturating_sub(full_max).min(max);
        let estimate = if d_prev == 0 {
            0.0
        } else {
            a_prev as f64 * (d_here as f64 / d_prev as f64)
        };
        Some(Reached {
            min,
            max,
            estimate: estimate.clamp(min as f64, max as f64),
        })
    }

    /// Acceptance at draft position `i` among the steps that reached `i` and had a token there
    /// (`P(accept i | accepted 0..i, k > i)`), from [`reached`](Self::reached)'s estimate: exact
    /// when the draft length is the same for every step, and whenever
    /// [`Reached::is_exact`]. In `0..=1`; `None` past `K` or when no step reached `i`.
    ///
    /// ```
    /// use specula_core::Counters;
    /// let mut c = Counters::<3>::ZERO;
    /// for a in [0, 1, 1, 2, 3, 3] {
    ///     c.record(3, a).unwrap();
    /// }
    /// // 5 of 6 accepted position 0, 3 of those 5 position 1, 2 of those 3 position 2.
    /// assert_eq!(c.conditional_acceptance(0), Some(5.0 / 6.0));
    /// assert_eq!(c.conditional_acceptance(1), Some(3.0 / 5.0));
    /// assert_eq!(c.conditional_acceptance(2), Some(2.0 / 3.0));
    /// ```
    pub fn conditional_acceptance(&self, i: usize) -> Option<f64> {
        let r = self.reached(i)?;
        let accepted = self.accepted_per_position[i];
        // The estimate is at least `accepted` when the counters are consistent (min ≥ A[i]);
        // the `min` keeps inconsistent ones in range. A positive estimate implies max > 0.
        (r.estimate > 0.0).then(|| (accepted as f64 / r.estimate).min(1.0))
    }

    /// Steps whose whole draft was accepted (`a = k`): exact when the draft length is the same
    /// for every step (then it is `A[k-1]`), a range otherwise (module documentation).
    pub fn full_acceptances(&self) -> CountRange {
        let (mut min, mut max) = (0u64, 0u64);
        for j in 1..=K {
            // Full acceptances of length j: the same bounds as in `reached`, summed.
            let a_prev = self.accepted_from(j);
            let ended = self
                .drafted_from(j)
                .saturating_sub(self.drafted_from(j + 1));
            let stopped = a_prev.saturating_sub(self.accepted_from(j + 1));
            let hi = ended.min(stopped);
            let lo = a_prev.saturating_sub(self.drafted_from(j + 1)).min(hi);
            min = min.saturating_add(lo);
            max = max.saturating_add(hi);
        }
        CountRange { min, max }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Every (k, a) step of a list, recorded.
    fn counters<const K: usize>(steps: &[(usize, usize)]) -> Counters<K> {
        let mut c = Counters::ZERO;
        for &(k, a) in steps {
            c.record(k, a).unwrap();
        }
        c
    }

    /// The joint truth the counters cannot see: steps that reached `i` with a token there.
    fn true_reached(steps: &[(usize, usize)], i: usize) -> u64 {
        steps.iter().filter(|&&(k, a)| a >= i && k > i).count() as u64
    }

    #[test]
    fn the_distribution_is_exact_for_any_draft_lengths() {
        let steps = [
            (4, 0),
            (4, 2),
            (2, 2),
            (1, 1),
            (3, 0),
            (4, 4),
            (4, 3),
            (2, 1),
        ];
        let c = counters::<4>(&steps);
        let got: [u64; 5] = core::array::from_fn(|j| c.accepted_exactly(j).unwrap());
        let want: [u64; 5] =
            core::array::from_fn(|j| steps.iter().filter(|s| s.1 == j).count() as u64);
        assert_eq!(got, want);
        assert_eq!(got, [2, 2, 2, 1, 1]);
        assert_eq!(c.accepted_exactly(5), None);
        assert_eq!(c.acceptance_lengths().len(), 5);
        assert!(c.acceptance_lengths().eq(got));
        assert_eq!(c.acceptance_lengths().sum::<u64>(), c.drafts);
        let weighted: u64 = c.acceptance_lengths().zip(0u64..).map(|(n, j)| n * j).sum();
        assert_eq!(weighted, c.accepted_tokens);
        let drafted: [Option<u64>; 6] = core::array::from_fn(|j| c.drafted_exactly(j));
        assert_eq!(drafted, [None, Some(1), Some(2), Some(1), Some(4), None]);
    }

    #[test]
    fn an_iterator_reports_what_is_left() {
        let c = counters::<2>(&[(2, 1)]);
        let mut it = c.acceptance_lengths();
        assert_eq!(it.size_hint(), (3, Some(3)));
        assert_eq!(it.next(), Some(0));
        assert_eq!(it.size_hint(), (2, Some(2)));
        assert_eq!((it.next(), it.next(), it.next()), (Some(1), Some(0), None));
        assert_eq!(it.size_hint(), (0, Some(0)));
    }

    #[test]
    fn interval_distributions_are_deltas_of_the_totals() {
        let mut before = counters::<3>(&[(3, 0), (3, 3)]);
        let mut after = before;
        after.record(3, 1).unwrap();
        after.record(2, 2).unwrap();
        let d = after.delta_since(&before);
        let dist: [u64; 4] = core::array::from_fn(|j| d.accepted_exactly(j).unwrap());
        assert_eq!(dist, [0, 1, 1, 0]);
        before.add(&d);
        assert!(before.acceptance_lengths().eq(after.acceptance_lengths()));
    }

    #[test]
    fn fixed_length_drafts_give_exact_conditionals_and_full_acceptances() {
        let steps = [(3, 0), (3, 1), (3, 1), (3, 2), (3, 3), (3, 3)];
        let c = counters::<4>(&steps);
        for i in 0..3 {
            let r = c.reached(i).unwrap();
            assert!(r.is_exact(), "{i}: {r:?}");
            assert_eq!(r.min, true_reached(&steps, i));
            assert_eq!(r.estimate, r.min as f64);
        }
        assert_eq!(c.conditional_acceptance(0), Some(5.0 / 6.0));
        assert_eq!(c.conditional_acceptance(1), Some(3.0 / 5.0));
        assert_eq!(c.conditional_acceptance(2), Some(2.0 / 3.0));
        // Position 3 was never drafted.
        let r3 = c.reached(3).unwrap();
        assert_eq!((r3.min, r3.max), (0, 0));
        assert_eq!(c.conditional_acceptance(3), None);
        assert_eq!(c.reached(4), None);
        assert_eq!(c.conditional_acceptance(4), None);
        let full = c.full_acceptances();
        assert!(full.is_exact());
        assert_eq!(full.min, 2);
    }

    #[test]
    fn mixed_lengths_give_the_range_that_holds_the_truth() {
        // The two step lists have the same counters and a different joint law.
        let one = [(2, 1), (1, 0)];
        let two = [(2, 0), (1, 1)];
        let (a, b) = (counters::<2>(&one), counters::<2>(&two));
        assert_eq!(a, b);
        let r = a.reached(1).unwrap();
        assert_eq!((r.min, r.max), (0, 1));
        assert!(!r.is_exact());
        assert!((r.min..=r.max).contains(&true_reached(&one, 1)));
        assert!((r.min..=r.max).contains(&true_reached(&two, 1)));
        // Estimate: A[0] · D[1] / D[0] = 1 · 1 / 2.
        assert_eq!(r.estimate, 0.5);
        assert_eq!(a.conditional_acceptance(1), Some(0.0));
        let full = a.full_acceptances();
        assert_eq!((full.min, full.max), (0, 1));
        assert!(!full.is_exact());
    }

    #[test]
    fn the_range_pins_the_count_when_the_marginals_determine_it() {
        // The k = 2 draft accepted both positions: the one that reached position 1 with a token
        // there is it, whatever the k = 1 draft did. The unclamped estimate (1 · 1 / 2) is wrong.
        let steps = [(1, 0), (2, 2)];
        let c = counters::<2>(&steps);
        let r = c.reached(1).unwrap();
        assert!(r.is_exact());
        assert_eq!((r.min, r.estimate), (1, 1.0));
        assert_eq!(c.conditional_acceptance(1), Some(1.0));
        // Every step that had position 1 accepted it: exact too (min = max = A[1]).
        let steps = [(1, 0), (1, 1), (2, 2)];
        let c = counters::<2>(&steps);
        let r = c.reached(1).unwrap();
        assert!(r.is_exact());
        assert_eq!(r.min, true_reached(&steps, 1));
        // Not so here: (2, 0) had position 1 and was rejected before it, (1, 1) stopped at 1.
        let steps = [(1, 1), (1, 1), (2, 2), (2, 2), (2, 0)];
        let c = counters::<2>(&steps);
        let r = c.reached(1).unwrap();
        assert_eq!((r.min, r.max), (2, 3));
        assert_eq!(true_reached(&steps, 1), 2);
        let full = c.full_acceptances();
        assert!((full.min..=full.max).contains(&4));
    }

    #[test]
    fn every_range_holds_the_truth_on_all_small_step_lists() {
        // All lists of up to 4 steps with k ≤ 3: each count the range claims includes the truth.
        let kinds: [(usize, usize); 9] = [
            (1, 0),
            (1, 1),
            (2, 0),
            (2, 1),
            (2, 2),
            (3, 0),
            (3, 1),
            (3, 2),
            (3, 3),
        ];
        // Under Miri, lists of up to 2 steps (90 lists instead of 7380; 3 steps took 65 s
        // there): the same cases, smaller.
        let longest = if cfg!(miri) { 2 } else { 4 };
        let mut lists = 0;
        for n in 1..=longest {
            for code in 0..9usize.pow(n) {
                let mut steps = [(0, 0); 4];
                let mut rest = code;
                for s in steps.iter_mut().take(n as usize) {
                    *s = kinds[rest % 9];
                    rest /= 9;
                }
                let steps = &steps[..n as usize];
                let c = counters::<3>(steps);
                for i in 0..3 {
                    let r = c.reached(i).unwrap();
                    let t = true_reached(steps, i);
                    assert!(
                        r.min <= t && t <= r.max,
                        "{steps:?} at {i}: {r:?}, truth {t}"
                    );
                    assert!(r.min as f64 <= r.estimate && r.estimate <= r.max as f64);
                    if let Some(p) = c.conditional_acceptance(i) {
                        assert!((0.0..=1.0).contains(&p));
                    }
                }
                let full = c.full_acceptances();
                let t = steps.iter().filter(|s| s.0 == s.1).count() as u64;
                assert!(
                    full.min <= t && t <= full.max,
                    "{steps:?}: {full:?}, truth {t}"
                );
                let uniform = steps.iter().all(|s| s.0 == steps[0].0);
                if uniform {
                    assert!(full.is_exact() && (0..3).all(|i| c.reached(i).unwrap().is_exact()));
                }
                lists += 1;
            }
        }
        assert_eq!(lists, (1..=longest).map(|n| 9usize.pow(n)).sum::<usize>());
    }

    #[test]
    fn inconsistent_counters_saturate_instead_of_wrapping() {
        let mut c = Counters::<2>::ZERO;
        c.drafts = 1;
        c.accepted_per_position = [1, 5];
        c.drafted_per_position = [1, 0];
        assert_eq!(c.accepted_exactly(0), Some(0));
        assert_eq!(c.accepted_exactly(1), Some(0));
        assert_eq!(c.accepted_exactly(2), Some(5));
        let r = c.reached(1).unwrap();
        assert!(r.min <= r.max);
        assert_eq!(c.conditional_acceptance(1), None);
        let z = Counters::<2>::ZERO;
        assert_eq!(z.conditional_acceptance(0), None);
        assert_eq!(z.reached(0).unwrap().estimate, 0.0);
        assert_eq!(z.full_acceptances(), CountRange { min: 0, max: 0 });
    }
}
