//! The draft-length advisor: from measured per-position acceptance and what a draft token
//! costs, the expected tokens per target step and the expected speedup for every draft length
//! `1..=K`, and the length that maximises it. Deterministic (IEEE-754 `f64` operations in a
//! fixed order), no allocation, a loop over at most `K` positions.
//!
//! # The model
//! A step with draft length `k` emits the accepted prefix plus one token, so its expected
//! number of tokens is
//!
//! `E(k) = 1 + Σ_{j=1..k} Π_{i<j} c_i`
//!
//! where `c_i` is the conditional acceptance at position `i`
//! ([`Counters::conditional_acceptance`]: accepted at `i` given `i` was reached and drafted).
//! `Π_{i<j} c_i` is the probability of reaching position `j`; with a fixed draft length it is
//! exactly `accepted_per_position[j-1] / drafts`. The step costs
//!
//! `C(k) = 1 + k · r`
//!
//! plain (non-speculative) target steps, where `r` is the cost of one more draft token
//! relative to a plain target step ([`CostModel`]: a draft forward, plus whatever the target
//! step grows by per extra position, when the runtime knows it). Plain decoding makes one
//! token per plain step, so the expected speedup over it is `S(k) = E(k) / C(k)`, and the
//! advice is the `k` with the largest `S(k)` (the shortest among equals). `S(k) < 1` for every
//! `k` says plain decoding is faster.
//!
//! # What it assumes, and ignores
//! * **Acceptance does not depend on `k`.** `c_i` measured while drafting `k_run` tokens is
//!   used for every `k ≤ k_run`. That holds for the verification rules here (position `i`'s
//!   test reads only the prefix before it) and for a drafter whose earlier tokens do not
//!   depend on how many follow. Lengths above the longest one measured get no prediction: an
//!   adaptive runtime that shortens its drafts should still draft the full length now and then
//!   (mixed lengths are handled by the conditional estimates, see
//!   [`acceptance`](crate::acceptance)).
//! * **Cost grows linearly in `k`.** A target step whose cost grows with its `k + 1` positions
//!   (verification work, attention over more query positions, a target that runs positions one
//!   after another on a CPU) is exact only if that growth is linear and folded into `r`
//!   ([`CostMeter::record`]'s `scaled_ns`). Superlinear growth (the `k + 1` positions
//!   leaving the memory-bound regime of a large batch) is not modelled: `r` measured at one
//!   `k` then flatters longer drafts.
//! * **No batching effects.** The batch is taken as fixed; a longer draft that shrinks the
//!   batch the scheduler can hold (KV cache, token budget) is not modelled.
//! * **One draft per step.** Drafting overlapped with target work (a draft running on other
//!   hardware, pipelined) changes `r`; measure it as the runtime runs.
//!
//! # Token trees
//! A tree is counted as a chain of its depth ([`Counters::record_tree`]), so the per-position
//! counters are per-depth counters, and verification walks a tree from its root: acceptance at
//! depth `d` depends only on the nodes down to `d`. The counters therefore give `E(d)` for the
//! run's tree cut at every depth `d` up to its own ([`advise_tree`]); the cost of the cut tree
//! needs its node count per depth, which the counters do not hold (only the total,
//! `tree_draft_tokens`): the runtime passes its shape. What the counters cannot tell is how a
//! *wider or narrower* tree would do (which sibling was accepted is not counted), nor per-depth
//! acceptance per tree shape when shapes mix.

use crate::counters::Counters;
use crate::cursor::{Cursor, Taken};
use crate::words::{Cell64, Words};

/// Why no advice could be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum AdviceError {
    /// The counters hold no draft: nothing was measured.
    NoDrafts,
    /// A cost is negative, not finite, or (for a target step) zero.
    BadCost,
    /// A [`CostMeter`] without a step, target time or draft forward to derive a cost from.
    NoTimings,
    /// A tree shape with no depth, a depth without nodes, or more depths than `K`.
    BadShape {
        /// Depths given.
        depths: usize,
        /// The maximum, `K`.
        max: usize,
    },
}

impl core::fmt::Display for AdviceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoDrafts => f.write_str("no draft was counted: nothing to advise from"),
            Self::BadCost => f.write_str("a cost must be finite and ≥ 0 (a target step > 0)"),
            Self::NoTimings => f.write_str("no step timings recorded to derive a cost from"),
            Self::BadShape { depths, max } => write!(
                f,
                "a tree shape needs 1..={max} depths of at least one node each, got {depths} \
                 depths"
            ),
        }
    }
}

impl core::error::Error for AdviceError {}

/// What a draft token costs relative to a plain (non-speculative) target step: a step of draft
/// length `k` costs `1 + k · r` plain steps (the [module documentation](self) lists what this
/// ignores).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CostModel {
    per_draft: f64,
}

impl CostModel {
    /// The cost ratio `r` given directly: draft-step time / target-step time (configured, or
    /// from the runtime's own measurements).
    ///
    /// # Errors
    /// [`AdviceError::BadCost`] for a negative or non-finite `r`.
    pub fn from_ratio(r: f64) -> Result<Self, AdviceError> {
        if r.is_finite() && r >= 0.0 {
            Ok(Self { per_draft: r })
        } else {
            Err(AdviceError::BadCost)
        }
    }

    /// `r` from times in any one unit: a plain target step (`target_step`, > 0) and what each
    /// draft token adds to a step (`per_draft`: its draft forward plus any growth of the
    /// target step per extra position).
    ///
    /// # Errors
    /// [`AdviceError::BadCost`] for a target step that is not positive or a negative or
    /// non-finite value.
    pub fn from_times(target_step: f64, per_draft: f64) -> Result<Self, AdviceError> {
        if !(target_step.is_finite() && target_step > 0.0) {
            return Err(AdviceError::BadCost);
        }
        Self::from_ratio(per_draft / target_step)
    }

    /// `r`: one draft token's cost in plain target steps.
    pub fn per_draft(&self) -> f64 {
        self.per_draft
    }

    /// `C(k) = 1 + k · r`: a step of draft length `k` in plain target steps.
    pub fn step_cost(&self, k: usize) -> f64 {
        1.0 + k as f64 * self.per_draft
    }
}

/// Step timings a runtime accumulates to measure its [`CostModel`]: per step, the part of its
/// time that does not grow with the draft length and the part that does. Cumulative and
/// wrapping like [`Counters`]; `delta_since` gives an interval's timings. It travels through a
/// [`SeqSlot`](crate::SeqSlot) ([`Words`]) for consumers on other threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CostMeter {
    /// Steps recorded.
    pub steps: u64,
    /// Draft forwards recorded (Σ draft length per step).
    pub draft_forwards: u64,
    /// Σ the time of each step that does not grow with its draft length (ns).
    pub fixed_ns: u64,
    /// Σ the time that does (ns).
    pub scaled_ns: u64,
}

impl CostMeter {
    /// Nothing recorded.
    pub const ZERO: Self = Self {
        steps: 0,
        draft_forwards: 0,
        fixed_ns: 0,
        scaled_ns: 0,
    };

    /// Records one step of draft length `draft_len`: `fixed_ns` of it does not grow with the
    /// draft length (on a GPU typically the target forward over its `k + 1` positions, the
    /// verification and the scheduler), `scaled_ns` does (the `k` draft forwards; on a target
    /// that runs positions one after another, its time for the `k` extra positions).
    pub fn record(&mut self, draft_len: usize, fixed_ns: u64, scaled_ns: u64) {
        self.steps = self.steps.wrapping_add(1);
        self.draft_forwards = self.draft_forwards.wrapping_add(draft_len as u64);
        self.fixed_ns = self.fixed_ns.wrapping_add(fixed_ns);
        self.scaled_ns = self.scaled_ns.wrapping_add(scaled_ns);
    }

    /// Adds `other` (wrapping).
    pub fn add(&mut self, other: &Self) {
        self.steps = self.steps.wrapping_add(other.steps);
        self.draft_forwards = self.draft_forwards.wrapping_add(other.draft_forwards);
        self.fixed_ns = self.fixed_ns.wrapping_add(other.fixed_ns);
        self.scaled_ns = self.scaled_ns.wrapping_add(other.scaled_ns);
    }

    /// `self − earlier` (wrapping): the timings recorded in between.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        Self {
            steps: self.steps.wrapping_sub(earlier.steps),
            draft_forwards: self.draft_forwards.wrapping_sub(earlier.draft_forwards),
            fixed_ns: self.fixed_ns.wrapping_sub(earlier.fixed_ns),
            scaled_ns: self.scaled_ns.wrapping_sub(earlier.scaled_ns),
        }
    }

    /// Mean time of a step's fixed part (ns), and of one draft forward's share (ns).
    fn means(&self) -> Result<(f64, f64), AdviceError> {
        if self.steps == 0 || self.fixed_ns == 0 || self.draft_forwards == 0 {
            return Err(AdviceError::NoTimings);
        }
        Ok((
            self.fixed_ns as f64 / self.steps as f64,
            self.scaled_ns as f64 / self.draft_forwards as f64,
        ))
    }

    /// The cost model these timings measure: `r` = mean scaled time per draft forward / mean
    /// fixed time per step.
    ///
    /// # Errors
    /// [`AdviceError::NoTimings`] without steps, fixed time or draft forwards.
    pub fn cost_model(&self) -> Result<CostModel, AdviceError> {
        let (fixed, per_draft) = self.means()?;
        CostModel::from_times(fixed, per_draft)
    }

    /// The predicted time of one step of draft length `k` (ns): mean fixed part plus `k` mean
    /// draft forwards' shares.
    ///
    /// # Errors
    /// [`AdviceError::NoTimings`] as [`cost_model`](Self::cost_model).
    pub fn step_ns(&self, k: usize) -> Result<f64, AdviceError> {
        let (fixed, per_draft) = self.means()?;
        Ok(fixed + k as f64 * per_draft)
    }
}

/// Atomic storage of a [`CostMeter`].
#[derive(Debug, Default)]
pub struct CostMeterStorage([Cell64; 4]);

impl Words for CostMeter {
    type Storage = CostMeterStorage;
    fn to_storage(&self) -> CostMeterStorage {
        CostMeterStorage(self.words().to_storage())
    }
    #[inline]
    fn store(&self, s: &CostMeterStorage) {
        self.words().store(&s.0);
    }
    #[inline]
    fn load(s: &CostMeterStorage) -> Self {
        let [steps, draft_forwards, fixed_ns, scaled_ns] = <[u64; 4]>::load(&s.0);
        Self {
            steps,
            draft_forwards,
            fixed_ns,
            scaled_ns,
        }
    }
}

impl CostMeter {
    fn words(&self) -> [u64; 4] {
        [
            self.steps,
            self.draft_forwards,
            self.fixed_ns,
            self.scaled_ns,
        ]
    }
}

/// What a token tree costs relative to a plain target step, cut at depth `d` with `N(d)` draft
/// nodes down to `d`: `1 + d · per_level + N(d) · per_node` plain steps (a drafter that expands
/// one level per forward pays `per_level`; the target's tree attention and a drafter that
/// expands node by node pay `per_node`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TreeCostModel {
    per_level: f64,
    per_node: f64,
}

impl TreeCostModel {
    /// Costs per depth level and per draft node, in plain target steps.
    ///
    /// # Errors
    /// [`AdviceError::BadCost`] for a negative or non-finite value.
    pub fn new(per_level: f64, per_node: f64) -> Result<Self, AdviceError> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if ok(per_level) && ok(per_node) {
            Ok(Self {
                per_level,
                per_node,
            })
        } else {
            Err(AdviceError::BadCost)
        }
    }
}

/// The advice for one interval (or the lifetime): expected tokens per step and expected
/// speedup for every measured draft length, and the best one.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Advice<const K: usize> {
    lengths: usize,
    tokens: [f64; K],
    speedup: [f64; K],
    best: usize,
}

impl<const K: usize> Advice<K> {
    /// The draft lengths evaluated are `1..=lengths()`: the positions the counters measured
    /// (some step drafted them).
    pub fn lengths(&self) -> usize {
        self.lengths
    }

    /// The draft length (tree depth) with the largest expected speedup, the shortest among
    /// equals; in `1..=lengths()`.
    pub fn recommended(&self) -> usize {
        self.best
    }

    /// The expected speedup of [`recommended`](Self::recommended); below 1, plain decoding is
    /// expected to be faster than any measured draft length.
    pub fn best_speedup(&self) -> f64 {
        self.speedup[self.best - 1]
    }

    /// `E(k)`: expected tokens emitted per step at draft length `k` (accepted plus one);
    /// `None` outside `1..=lengths()`.
    pub fn expected_tokens(&self, k: usize) -> Option<f64> {
        self.get(&self.tokens, k)
    }

    /// `S(k) = E(k) / C(k)`: expected speedup over plain decoding at draft length `k`;
    /// `None` outside `1..=lengths()`.
    pub fn expected_speedup(&self, k: usize) -> Option<f64> {
        self.get(&self.speedup, k)
    }

    /// `(k, E(k), S(k))` for `k` in `1..=lengths()`.
    pub fn iter(&self) -> impl Iterator<Item = (usize, f64, f64)> + '_ {
        (1..=self.lengths).map(|k| (k, self.tokens[k - 1], self.speedup[k - 1]))
    }

    fn get(&self, values: &[f64; K], k: usize) -> Option<f64> {
        (1..=self.lengths).contains(&k).then(|| values[k - 1])
    }
}

/// `E(k)` and `S(k) = E(k) / cost(k)` over the measured positions, and the argmax.
fn advise_with<const K: usize>(
    c: &Counters<K>,
    depths: usize,
    mut cost: impl FnMut(usize) -> f64,
) -> Result<Advice<K>, AdviceError> {
    let mut a = Advice {
        lengths: 0,
        tokens: [0.0; K],
        speedup: [0.0; K],
        best: 1,
    };
    // P(reach position i), starting at position 0 (always reached), and E so far.
    let (mut reach, mut tokens) = (1.0f64, 1.0f64);
    for i in 0..depths.min(K) {
        if c.drafted_per_position[i] == 0 {
            break; // not measured: no prediction for this length or longer ones
        }
        // No step reached i (the previous position was never accepted): reach is already 0.
        reach *= c.conditional_acceptance(i).unwrap_or(0.0);
        tokens += reach;
        a.tokens[i] = tokens;
        a.speedup[i] = tokens / cost(i + 1);
        a.lengths = i + 1;
        if a.speedup[i] > a.speedup[a.best - 1] {
            a.best = i + 1;
        }
    }
    if a.lengths == 0 {
        return Err(AdviceError::NoDrafts);
    }
    Ok(a)
}

/// The advice for chains from `counters` (an interval's delta or lifetime totals) and `cost`:
/// `E(k)`, `S(k)` for every measured `k` and the best `k` (model in the
/// [module documentation](self)).
///
/// ```
/// use specula_core::Counters;
/// use specula_core::advisor::{CostModel, advise};
/// let mut c = Counters::<4>::ZERO;
/// for a in [0, 1, 2, 2, 3, 4, 4, 4] {
///     c.record(4, a).unwrap();
/// }
/// let advice = advise(&c, &CostModel::from_ratio(0.1)?)?;
/// assert_eq!(advice.lengths(), 4);
/// // E(2) = 1 + 7/8 + 6/8; S(2) = E(2) / 1.2.
/// assert!((advice.expected_tokens(2).unwrap() - 2.625).abs() < 1e-12);
/// assert!((advice.expected_speedup(2).unwrap() - 2.625 / 1.2).abs() < 1e-12);
/// assert_eq!(advice.recommended(), 4);
/// # Ok::<(), specula_core::advisor::AdviceError>(())
/// ```
///
/// # Errors
/// [`AdviceError::NoDrafts`] when no draft was counted.
pub fn advise<const K: usize>(
    counters: &Counters<K>,
    cost: &CostModel,
) -> Result<Advice<K>, AdviceError> {
    advise_with(counters, K, |k| cost.step_cost(k))
}

/// The advice for token trees: the run's tree shape, `nodes_per_depth[d-1]` draft nodes at depth
/// `d` (the root excluded), cut at every depth `1..=nodes_per_depth.len()` it measured; the
/// result is indexed by depth ([`Advice::recommended`] is the best depth). The per-position
/// counters are per-depth for trees (see the [module documentation](self) for what they
/// cannot tell).
///
/// ```
/// use specula_core::Counters;
/// use specula_core::advisor::{TreeCostModel, advise_tree};
/// let mut c = Counters::<4>::ZERO;
/// c.record_tree(3, 14, 3).unwrap(); // a 2x3 tree: 2 + 4 + 8 nodes
/// c.record_tree(3, 14, 1).unwrap();
/// let advice = advise_tree(&c, &TreeCostModel::new(0.05, 0.01)?, &[2, 4, 8])?;
/// assert_eq!(advice.lengths(), 3);
/// // Depth 1: E = 1 + 2/2; cost 1 + 0.05 + 2 · 0.01.
/// assert!((advice.expected_speedup(1).unwrap() - 2.0 / 1.07).abs() < 1e-12);
/// # Ok::<(), specula_core::advisor::AdviceError>(())
/// ```
///
/// # Errors
/// [`AdviceError::BadShape`] for no depth, a depth without nodes or more than `K` depths;
/// [`AdviceError::NoDrafts`] when no tree was counted.
pub fn advise_tree<const K: usize>(
    counters: &Counters<K>,
    cost: &TreeCostModel,
    nodes_per_depth: &[u32],
) -> Result<Advice<K>, AdviceError> {
    let depths = nodes_per_depth.len();
    if depths == 0 || depths > K || nodes_per_depth.contains(&0) {
        return Err(AdviceError::BadShape { depths, max: K });
    }
    let mut nodes = 0u64;
    advise_with(counters, depths, |d| {
        nodes += u64::from(nodes_per_depth[d - 1]);
        1.0 + d as f64 * cost.per_level + nodes as f64 * cost.per_node
    })
}

/// The advice each interval, for an adaptive runtime: a [`Cursor`] of its own over the slot,
/// and the costs it measures.
///
/// ```
/// use specula_core::advisor::{Advisor, CostMeter};
/// use specula_core::{Cursor, SeqSlot, Snapshot};
/// let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
/// let (mut w, r) = slot.split();
/// let mut advisor = Advisor::new(Cursor::attach(r));
/// let mut meter = CostMeter::ZERO;
/// let mut s = Snapshot::ZERO;
/// for a in [1, 4, 4, 2] {
///     s.counters.record(4, a).unwrap();
///     meter.record(4, 10_000, 4_000); // a 10 µs target step, four 1 µs draft forwards
/// }
/// w.publish(&s);
/// let (taken, advice) = advisor.poll(&meter).unwrap();
/// assert_eq!(taken.delta.drafts, 4);
/// let k = advice.unwrap().recommended(); // the next interval's draft length
/// assert!((1..=4).contains(&k));
/// assert!(advisor.poll(&meter).is_none(), "nothing new");
/// ```
#[derive(Debug)]
pub struct Advisor<'a, const K: usize> {
    cursor: Cursor<'a, K>,
    costs_seen: CostMeter,
}

impl<'a, const K: usize> Advisor<'a, K> {
    /// An advisor over `cursor` (attach it: [`Cursor::attach`] starts at the slot's current
    /// counts).
    pub fn new(cursor: Cursor<'a, K>) -> Self {
        Self {
            cursor,
            costs_seen: CostMeter::ZERO,
        }
    }

    /// When a new snapshot was published: what was taken and the advice over the counts since
    /// the previous poll, with the costs recorded in `meter` (the runtime's cumulative timings)
    /// since then, or over all of `meter` when nothing was recorded since.
    pub fn poll(
        &mut self,
        meter: &CostMeter,
    ) -> Option<(Taken<K>, Result<Advice<K>, AdviceError>)> {
        let taken = self.cursor.take()?;
        let window = meter.delta_since(&self.costs_seen);
        self.costs_seen = *meter;
        let advice = window
            .cost_model()
            .or_else(|_| meter.cost_model())
            .and_then(|cost| advise(&taken.delta, &cost));
        Some((taken, advice))
    }

    /// [`poll`](Self::poll) with a configured cost model instead of measured timings.
    pub fn poll_with(
        &mut self,
        cost: &CostModel,
    ) -> Option<(Taken<K>, Result<Advice<K>, AdviceError>)> {
        let taken = self.cursor.take()?;
        let advice = advise(&taken.delta, cost);
        Some((taken, advice))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::SeqSlot;
    use crate::counters::Snapshot;

    fn counters<const K: usize>(k: usize, accepted: &[usize]) -> Counters<K> {
        let mut c = Counters::ZERO;
        for &a in accepted {
            c.record(k, a).unwrap();
        }
        c
    }

    #[test]
    fn expected_tokens_are_one_plus_the_reach_probabilities() {
        let c = counters::<4>(4, &[0, 1, 2, 2, 3, 4, 4, 4]);
        let a = advise(&c, &CostModel::from_ratio(0.0).unwrap()).unwrap();
        // P(reach j) = A[j-1] / drafts: 7/8, 6/8, 4/8, 3/8.
        let want = [1.0 + 7.0 / 8.0, 2.625, 3.125, 3.5];
        for (k, w) in (1..=4).zip(want) {
            let got = a.expected_tokens(k).unwrap();
            assert!((got - w).abs() < 1e-12, "{k}: {got} vs {w}");
            // Free drafts: the speedup is the expected tokens.
            assert_eq!(a.expected_speedup(k), Some(got));
        }
        assert_eq!(a.lengths(), 4);
        assert_eq!(a.recommended(), 4);
        assert_eq!(a.best_speedup(), a.expected_speedup(4).unwrap());
        assert_eq!(a.expected_tokens(0), None);
        assert_eq!(a.expected_tokens(5), None);
        assert_eq!(a.expected_speedup(5), None);
        let all: [(usize, f64, f64); 4] = {
            let mut v = [(0, 0.0, 0.0); 4];
            for (slot, x) in v.iter_mut().zip(a.iter()) {
                *slot = x;
            }
            v
        };
        assert_eq!(all[3].0, 4);
        assert_eq!(a.iter().count(), 4);
    }

    #[test]
    fn the_recommendation_is_the_argmax_of_the_speedup() {
        // c = (0.8, 0.5, 0.5): E = 1.8, 2.2, 2.4. With r = 0.1: S = 1.636, 1.833, 1.846.
        let mut c = Counters::<3>::ZERO;
        for (n, a) in [(2, 0), (4, 1), (2, 2), (2, 3)] {
            for _ in 0..n {
                c.record(3, a).unwrap();
            }
        }
        let a = advise(&c, &CostModel::from_ratio(0.1).unwrap()).unwrap();
        assert_eq!(a.recommended(), 3);
        // r = 0.2: S = 1.5, 1.571, 1.5: the middle one.
        let b = advise(&c, &CostModel::from_ratio(0.2).unwrap()).unwrap();
        assert_eq!(b.recommended(), 2);
        let s: [f64; 3] = core::array::from_fn(|i| b.expected_speedup(i + 1).unwrap());
        assert!((s[0] - 1.8 / 1.2).abs() < 1e-12);
        assert!((s[1] - 2.2 / 1.4).abs() < 1e-12);
        assert!((s[2] - 2.4 / 1.6).abs() < 1e-12);
        // Expensive drafts: k = 1 is the best, below 1 (plain decoding is faster).
        let e = advise(&c, &CostModel::from_ratio(2.0).unwrap()).unwrap();
        assert_eq!(e.recommended(), 1);
        assert!(e.best_speedup() < 1.0);
    }

    #[test]
    fn ties_go_to_the_shorter_draft() {
        // Nothing accepted past position 0: E(2) = E(1), and with free drafts S ties.
        let c = counters::<2>(2, &[1, 1]);
        let a = advise(&c, &CostModel::from_ratio(0.0).unwrap()).unwrap();
        assert_eq!(a.expected_speedup(1), a.expected_speedup(2));
        assert_eq!(a.recommended(), 1);
    }

    #[test]
    fn only_measured_lengths_are_predicted() {
        let c = counters::<8>(3, &[3, 3, 2]);
        let a = advise(&c, &CostModel::from_ratio(0.0).unwrap()).unwrap();
        assert_eq!(a.lengths(), 3);
        assert_eq!(a.expected_tokens(4), None);
        assert_eq!(
            advise(&Counters::<8>::ZERO, &CostModel::from_ratio(0.1).unwrap()),
            Err(AdviceError::NoDrafts)
        );
        // A position drafted but never reached: measured, and it adds nothing.
        let c = counters::<3>(3, &[0, 0]);
        let a = advise(&c, &CostModel::from_ratio(0.5).unwrap()).unwrap();
        assert_eq!(a.lengths(), 3);
        assert_eq!(a.expected_tokens(3), Some(1.0));
        assert_eq!(a.expected_speedup(3), Some(1.0 / 2.5));
        assert_eq!(a.recommended(), 1);
    }

    #[test]
    fn cost_models_refuse_bad_values() {
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            assert_eq!(CostModel::from_ratio(bad), Err(AdviceError::BadCost));
            assert_eq!(TreeCostModel::new(bad, 0.0), Err(AdviceError::BadCost));
            assert_eq!(TreeCostModel::new(0.0, bad), Err(AdviceError::BadCost));
            assert_eq!(CostModel::from_times(bad, 1.0), Err(AdviceError::BadCost));
        }
        assert_eq!(CostModel::from_times(0.0, 1.0), Err(AdviceError::BadCost));
        assert_eq!(CostModel::from_times(10.0, -1.0), Err(AdviceError::BadCost));
        let m = CostModel::from_times(20.0, 5.0).unwrap();
        assert_eq!(m.per_draft(), 0.25);
        assert_eq!(m.step_cost(4), 2.0);
        assert_eq!(CostModel::from_ratio(0.0).unwrap().step_cost(7), 1.0);
        assert!(TreeCostModel::new(0.0, 0.0).is_ok());
    }

    #[test]
    fn the_meter_measures_the_ratio_and_the_step_time() {
        let mut m = CostMeter::ZERO;
        assert_eq!(m.cost_model(), Err(AdviceError::NoTimings));
        assert_eq!(m.step_ns(1), Err(AdviceError::NoTimings));
        m.record(4, 10_000, 4_000);
        m.record(2, 14_000, 1_000);
        assert_eq!(
            m,
            CostMeter {
                steps: 2,
                draft_forwards: 6,
                fixed_ns: 24_000,
                scaled_ns: 5_000
            }
        );
        // Mean fixed part 12 µs, 5/6 µs per draft forward.
        let r = m.cost_model().unwrap().per_draft();
        assert!((r - (5_000.0 / 6.0) / 12_000.0).abs() < 1e-15);
        assert!((m.step_ns(3).unwrap() - (12_000.0 + 2_500.0)).abs() < 1e-9);
        let earlier = m;
        m.record(1, 1, 1);
        let d = m.delta_since(&earlier);
        assert_eq!(
            d,
            CostMeter {
                steps: 1,
                draft_forwards: 1,
                fixed_ns: 1,
                scaled_ns: 1
            }
        );
        let mut back = earlier;
        back.add(&d);
        assert_eq!(back, m);
        // Steps without draft forwards, or without fixed time: no ratio.
        let mut k0 = CostMeter::ZERO;
        k0.record(0, 100, 0);
        assert_eq!(k0.cost_model(), Err(AdviceError::NoTimings));
        let mut no_fixed = CostMeter::ZERO;
        no_fixed.record(2, 0, 100);
        assert_eq!(no_fixed.cost_model(), Err(AdviceError::NoTimings));
        // Wrapping, as the counters.
        let mut w = CostMeter {
            fixed_ns: u64::MAX,
            ..CostMeter::ZERO
        };
        w.record(1, 2, 0);
        assert_eq!(w.fixed_ns, 1);
    }

    #[test]
    fn the_meter_travels_through_a_slot() {
        let m = CostMeter {
            steps: 1,
            draft_forwards: 2,
            fixed_ns: 3,
            scaled_ns: u64::MAX,
        };
        assert_eq!(CostMeter::load(&m.to_storage()), m);
        let mut slot = SeqSlot::new(CostMeter::ZERO);
        let (mut w, r) = slot.split();
        w.publish(&m);
        assert_eq!(r.read(), (m, 1));
    }

    #[test]
    fn trees_are_advised_by_depth_with_their_node_counts() {
        let mut c = Counters::<4>::ZERO;
        c.record_tree(3, 14, 3).unwrap();
        c.record_tree(3, 14, 1).unwrap();
        c.record_tree(3, 14, 2).unwrap();
        c.record_tree(3, 14, 0).unwrap();
        let cost = TreeCostModel::new(0.1, 0.02).unwrap();
        let a = advise_tree(&c, &cost, &[2, 4, 8]).unwrap();
        // Reach depth 1, 2, 3: 3/4, 2/4, 1/4. Costs 1 + d · 0.1 + N(d) · 0.02, N = 2, 6, 14.
        let want = [
            1.75 / (1.0 + 0.1 + 0.04),
            2.25 / (1.0 + 0.2 + 0.12),
            2.5 / (1.0 + 0.3 + 0.28),
        ];
        for (d, w) in (1..=3).zip(want) {
            let got = a.expected_speedup(d).unwrap();
            assert!((got - w).abs() < 1e-12, "depth {d}: {got} vs {w}");
        }
        assert_eq!(a.recommended(), 2);
        // A shape deeper than the counters measured is cut at what they measured.
        let b = advise_tree(&c, &cost, &[2, 4, 8, 16]).unwrap();
        assert_eq!(b.lengths(), 3);
        for bad in [&[][..], &[2, 0, 8], &[1, 1, 1, 1, 1]] {
            assert_eq!(
                advise_tree(&c, &cost, bad),
                Err(AdviceError::BadShape {
                    depths: bad.len(),
                    max: 4
                })
            );
        }
        assert_eq!(
            advise_tree(&Counters::<4>::ZERO, &cost, &[2]),
            Err(AdviceError::NoDrafts)
        );
    }

    #[test]
    fn the_advisor_advises_over_each_interval_with_its_costs() {
        let mut slot = SeqSlot::new(Snapshot::<2>::ZERO);
        let (mut w, reader) = slot.split();
        let mut advisor = Advisor::new(Cursor::attach(reader));
        let mut meter = CostMeter::ZERO;
        assert!(advisor.poll(&meter).is_none());
        let mut s = Snapshot::<2>::ZERO;
        // Interval 1: every draft fully accepted, drafts nearly free: k = 2.
        for _ in 0..4 {
            s.counters.record(2, 2).unwrap();
            meter.record(2, 1_000, 20);
        }
        w.publish(&s);
        let (t, a) = advisor.poll(&meter).unwrap();
        assert_eq!(t.delta.drafts, 4);
        let a = a.unwrap();
        assert_eq!(a.recommended(), 2);
        assert_eq!(
            a.expected_speedup(2),
            Some(3.0 / (1.0 + 2.0 * (10.0 / 1_000.0)))
        );
        // Interval 2: nothing accepted, expensive drafts: k = 1, over this interval's counts
        // and costs only.
        for _ in 0..4 {
            s.counters.record(2, 0).unwrap();
            meter.record(2, 1_000, 2_000);
        }
        w.publish(&s);
        let a = advisor.poll(&meter).unwrap().1.unwrap();
        assert_eq!(a.recommended(), 1);
        assert_eq!(a.expected_speedup(1), Some(1.0 / 2.0));
        // Interval 3: no new timings: the lifetime costs (r = (8040 / 16) / 1000).
        s.counters.record(2, 2).unwrap();
        w.publish(&s);
        let a = advisor.poll(&meter).unwrap().1.unwrap();
        let r = 8_080.0 / 16.0 / 1_000.0;
        assert_eq!(a.expected_speedup(2), Some(3.0 / (1.0 + 2.0 * r)));
        // Configured costs.
        s.counters.record(2, 1).unwrap();
        w.publish(&s);
        let (t, a) = advisor
            .poll_with(&CostModel::from_ratio(0.5).unwrap())
            .unwrap();
        assert_eq!(t.delta.drafts, 1);
        assert_eq!(a.unwrap().expected_speedup(1), Some(2.0 / 1.5));
        assert!(
            advisor
                .poll_with(&CostModel::from_ratio(0.5).unwrap())
                .is_none()
        );
        // No timings at all: the error, with what was taken.
        let mut fresh = Advisor::new(Cursor::new(reader));
        let (t, a) = fresh.poll(&CostMeter::ZERO).unwrap();
        assert_eq!(t.delta, s.counters);
        assert_eq!(a, Err(AdviceError::NoTimings));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        use core::fmt::Write;
        let mut s = heapless::String::<160>::new();
        write!(s, "{}", AdviceError::BadShape { depths: 9, max: 8 }).unwrap();
        assert!(s.contains("1..=8") && s.contains("9 depths"), "{s}");
        for e in [
            AdviceError::NoDrafts,
            AdviceError::BadCost,
            AdviceError::NoTimings,
        ] {
            s.clear();
            write!(s, "{e}").unwrap();
            assert!(!s.is_empty());
        }
    }
}
