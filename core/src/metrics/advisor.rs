//! The draft-length advisor: from measured per-position acceptance and what a draft token
//! costs, the expected tokens per target step and the expected speedup for every draft length
//! `1..=K`, and the length that maximises it. Deterministic (IEEE-754 `f64` operations in a
//! fixed order), no allocation, a loop over at most `K` positions.

use crate::metrics::Counters;
use crate::metrics::{Cell64, Words};
use crate::metrics::{Cursor, Taken};

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

/// What a draft token costs relative to a plain (non-speculative) target step, and what a
/// rejection saves: a step of draft length `k` costs `1 + k · r − s · (1 − P_full(k))` plain
/// steps (the [type documentation](Advisor) says why, and lists what this ignores).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CostModel {
    per_draft: f64,
    rejection_saving: f64,
}

impl CostModel {
    /// The cost ratio `r` given directly: draft-step time / target-step time (configured, or
    /// from the runtime's own measurements).
    ///
    /// # Errors
    /// [`AdviceError::BadCost`] for a negative or non-finite `r`.
    pub fn from_ratio(r: f64) -> Result<Self, AdviceError> {
        if r.is_finite() && r >= 0.0 {
            Ok(Self {
                per_draft: r,
                rejection_saving: 0.0,
            })
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

    /// The same `r` with a rejection saving `s`: what a step whose draft is rejected somewhere
    /// costs less than one whose draft is accepted whole, in plain target steps (negative where
    /// a rejection costs more). Configured, or fitted by [`CostMeter::cost_model`].
    ///
    /// # Errors
    /// [`AdviceError::BadCost`] for a non-finite `s` or one of 1 or more (a rejected step would
    /// cost nothing or less).
    pub fn with_rejection_saving(self, s: f64) -> Result<Self, AdviceError> {
        if s.is_finite() && s < 1.0 {
            Ok(Self {
                rejection_saving: s,
                ..self
            })
        } else {
            Err(AdviceError::BadCost)
        }
    }

    /// `r`: one draft token's cost in plain target steps.
    pub fn per_draft(&self) -> f64 {
        self.per_draft
    }

    /// `s`: what a rejection saves over a whole acceptance, in plain target steps (0 unless
    /// configured or fitted).
    pub fn rejection_saving(&self) -> f64 {
        self.rejection_saving
    }

    /// `C(k) = 1 + k · r − s · (1 − p_full)`: a step of draft length `k` whose draft is accepted
    /// whole with probability `p_full`, in plain target steps. Always above 0 (`s < 1`).
    pub fn step_cost(&self, k: usize, p_full: f64) -> f64 {
        1.0 + k as f64 * self.per_draft - self.rejection_saving * (1.0 - p_full.clamp(0.0, 1.0))
    }
}

/// One step as [`CostMeter::record`] takes it: its draft length, its time split into the part
/// that does not grow with the draft length and the part that does, and its outcome (how many
/// of its requests rejected their draft somewhere), which fits the rejection saving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StepTiming {
    /// The step's draft length (draft forwards run for it; a tree's depth).
    pub draft_len: usize,
    /// The time of the step that does not grow with its draft length (ns): on a GPU typically
    /// the target forward over its `k + 1` positions, the verification and the scheduler.
    pub fixed_ns: u64,
    /// The time that does (ns): the `k` draft forwards; on a target that runs positions one
    /// after another, its time for the `k` extra positions.
    pub scaled_ns: u64,
    /// Requests verified in the step; 0 when the outcome is not recorded (the step then
    /// measures `r` only).
    pub requests: u32,
    /// Of those, the requests whose draft was rejected at some position (not accepted whole);
    /// at most `requests`.
    pub rejected: u32,
}

impl StepTiming {
    /// The share of the step's requests that rejected, in 1/[`SHARE_ONE`] units (`None`
    /// without an outcome).
    fn rejected_share(&self) -> Option<u64> {
        (self.requests != 0).then(|| {
            u64::from(self.rejected.min(self.requests)) * SHARE_ONE / u64::from(self.requests)
        })
    }
}

/// The unit of [`CostMeter`]'s rejected shares: a step whose requests all rejected counts
/// `SHARE_ONE`. Integer so that the sums wrap and subtract exactly, as the counters do; 256
/// keeps `Σ share · fixed_ns` within a `u64` for 2^64 / (256 · step time) steps (22 years of
/// 10 ms steps between two readings).
pub const SHARE_ONE: u64 = 256;

/// Step timings a runtime accumulates to measure its [`CostModel`]: per step, the part of its
/// time that does not grow with the draft length, the part that does, and the share of its
/// requests that rejected. Cumulative and wrapping like [`Counters`]; `delta_since` gives an
/// interval's timings. It travels through a [`SeqSlot`](crate::SeqSlot) ([`Words`]) for
/// consumers on other threads.
///
/// The rejection saving is a least-squares line through the steps with an outcome: fixed time
/// against rejected share `x`; the line's value at `x = 0` is the cost of a step accepted
/// whole (the unit of the model: a plain step also samples from the target's row) and its drop
/// from `x = 0` to `x = 1` is the saving. The sums it needs are kept exactly in integers.
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
    /// Steps recorded with an outcome ([`StepTiming::requests`] > 0).
    pub outcome_steps: u64,
    /// Σ their fixed time (ns).
    pub outcome_fixed_ns: u64,
    /// Σ their rejected share `x` (in 1/[`SHARE_ONE`] units).
    pub rejected_share: u64,
    /// Σ `x²`.
    pub rejected_share_sq: u64,
    /// Σ `x · fixed_ns`.
    pub rejected_share_ns: u64,
}

impl CostMeter {
    /// Nothing recorded.
    pub const ZERO: Self = Self {
        steps: 0,
        draft_forwards: 0,
        fixed_ns: 0,
        scaled_ns: 0,
        outcome_steps: 0,
        outcome_fixed_ns: 0,
        rejected_share: 0,
        rejected_share_sq: 0,
        rejected_share_ns: 0,
    };

    /// Records one step ([`StepTiming`] says which part of its time is which).
    pub fn record(&mut self, step: &StepTiming) {
        let one = Self {
            steps: 1,
            draft_forwards: step.draft_len as u64,
            fixed_ns: step.fixed_ns,
            scaled_ns: step.scaled_ns,
            ..Self::ZERO
        };
        let one = match step.rejected_share() {
            None => one,
            Some(x) => Self {
                outcome_steps: 1,
                outcome_fixed_ns: step.fixed_ns,
                rejected_share: x,
                rejected_share_sq: x * x,
                rejected_share_ns: x.wrapping_mul(step.fixed_ns),
                ..one
            },
        };
        self.add(&one);
    }

    /// Adds `other` (wrapping).
    pub fn add(&mut self, other: &Self) {
        *self = self.zip(other, u64::wrapping_add);
    }

    /// `self − earlier` (wrapping): the timings recorded in between.
    #[must_use]
    pub fn delta_since(&self, earlier: &Self) -> Self {
        self.zip(earlier, u64::wrapping_sub)
    }

    fn zip(&self, other: &Self, f: fn(u64, u64) -> u64) -> Self {
        let (a, b) = (self.words(), other.words());
        Self::from_words(core::array::from_fn(|i| f(a[i], b[i])))
    }

    /// The least-squares line of fixed time against rejected share over the steps with an
    /// outcome: `(fixed time at share 0 in ns, saving from share 0 to 1 in ns)`; `None` with
    /// fewer than two such steps or one share only (no slope to fit).
    fn fit(&self) -> Option<(f64, f64)> {
        // Exact integer sums: n · Σx² − (Σx)² is a difference of nearly equal numbers when the
        // shares barely vary, which f64 would round to noise.
        let n = u128::from(self.outcome_steps);
        let (sx, sxx) = (
            u128::from(self.rejected_share),
            u128::from(self.rejected_share_sq),
        );
        // Zero as well with fewer than two steps (n = 1: x² − x²), so no separate test of n.
        let var = n.checked_mul(sxx)?.checked_sub(sx.checked_mul(sx)?)?;
        if var == 0 {
            return None;
        }
        let (sy, sxy) = (self.outcome_fixed_ns as f64, self.rejected_share_ns as f64);
        let (n, sx) = (n as f64, sx as f64);
        let slope = (n * sxy - sx * sy) / var as f64; // ns per share unit
        let at_zero = (sy - slope * sx) / n;
        Some((at_zero, -slope * SHARE_ONE as f64))
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

    /// The cost model these timings measure. With outcomes that vary (see the type's
    /// documentation): the unit is the fitted fixed time of a step accepted whole, `r` = mean
    /// scaled time per draft forward / that unit, and `s` = the fitted saving / that unit.
    /// Without (no outcome recorded, every step the same share, or a fit that says a step
    /// would cost nothing): the unit is the mean fixed time and `s = 0`.
    ///
    /// # Errors
    /// [`AdviceError::NoTimings`] without steps, fixed time or draft forwards.
    pub fn cost_model(&self) -> Result<CostModel, AdviceError> {
        let (fixed, per_draft) = self.means()?;
        let fitted = self.fit().and_then(|(unit, saving)| {
            CostModel::from_times(unit, per_draft)
                .and_then(|m| m.with_rejection_saving(saving / unit))
                .ok()
        });
        match fitted {
            Some(m) => Ok(m),
            None => CostModel::from_times(fixed, per_draft),
        }
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
pub struct CostMeterStorage([Cell64; METER_WORDS]);

const METER_WORDS: usize = 9;

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
        Self::from_words(<[u64; METER_WORDS]>::load(&s.0))
    }
}

impl CostMeter {
    fn words(&self) -> [u64; METER_WORDS] {
        [
            self.steps,
            self.draft_forwards,
            self.fixed_ns,
            self.scaled_ns,
            self.outcome_steps,
            self.outcome_fixed_ns,
            self.rejected_share,
            self.rejected_share_sq,
            self.rejected_share_ns,
        ]
    }

    fn from_words(w: [u64; METER_WORDS]) -> Self {
        let [
            steps,
            draft_forwards,
            fixed_ns,
            scaled_ns,
            outcome_steps,
            outcome_fixed_ns,
            rejected_share,
            rejected_share_sq,
            rejected_share_ns,
        ] = w;
        Self {
            steps,
            draft_forwards,
            fixed_ns,
            scaled_ns,
            outcome_steps,
            outcome_fixed_ns,
            rejected_share,
            rejected_share_sq,
            rejected_share_ns,
        }
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
    mut cost: impl FnMut(usize, f64) -> f64,
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
        // `reach` is now P(all of the first i + 1 accepted): P_full(i + 1).
        a.speedup[i] = tokens / cost(i + 1, reach);
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
/// [type documentation](Advisor)).
///
/// ```
/// use specula_core::Counters;
/// use specula_core::metrics::{CostModel, advise};
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
/// # Ok::<(), specula_core::metrics::AdviceError>(())
/// ```
///
/// # Errors
/// [`AdviceError::NoDrafts`] when no draft was counted.
pub fn advise<const K: usize>(
    counters: &Counters<K>,
    cost: &CostModel,
) -> Result<Advice<K>, AdviceError> {
    advise_with(counters, K, |k, p_full| cost.step_cost(k, p_full))
}

/// The advice for token trees: the run's tree shape, `nodes_per_depth[d-1]` draft nodes at depth
/// `d` (the root excluded), cut at every depth `1..=nodes_per_depth.len()` it measured; the
/// result is indexed by depth ([`Advice::recommended`] is the best depth). The per-position
/// counters are per-depth for trees (see the [type documentation](Advisor) for what they
/// cannot tell).
///
/// ```
/// use specula_core::Counters;
/// use specula_core::metrics::{TreeCostModel, advise_tree};
/// let mut c = Counters::<4>::ZERO;
/// c.record_tree(3, 14, 3).unwrap(); // a 2x3 tree: 2 + 4 + 8 nodes
/// c.record_tree(3, 14, 1).unwrap();
/// let advice = advise_tree(&c, &TreeCostModel::new(0.05, 0.01)?, &[2, 4, 8])?;
/// assert_eq!(advice.lengths(), 3);
/// // Depth 1: E = 1 + 2/2; cost 1 + 0.05 + 2 · 0.01.
/// assert!((advice.expected_speedup(1).unwrap() - 2.0 / 1.07).abs() < 1e-12);
/// # Ok::<(), specula_core::metrics::AdviceError>(())
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
    advise_with(counters, depths, |d, _| {
        nodes += u64::from(nodes_per_depth[d - 1]);
        1.0 + d as f64 * cost.per_level + nodes as f64 * cost.per_node
    })
}

/// The advice each interval, for an adaptive runtime: a [`Cursor`] of its own over the slot,
/// and the costs it measures.
///
/// ```
/// use specula_core::metrics::{Advisor, CostMeter, StepTiming};
/// use specula_core::{Cursor, SeqSlot, Snapshot};
/// let mut slot = SeqSlot::new(Snapshot::<4>::ZERO);
/// let (mut w, r) = slot.split();
/// let mut advisor = Advisor::new(Cursor::attach(r));
/// let mut meter = CostMeter::ZERO;
/// let mut s = Snapshot::ZERO;
/// for a in [1, 4, 4, 2] {
///     s.counters.record(4, a).unwrap();
///     // A 10 µs target step, four 1 µs draft forwards; one request, rejected unless a = 4.
///     meter.record(&StepTiming {
///         draft_len: 4,
///         fixed_ns: 10_000,
///         scaled_ns: 4_000,
///         requests: 1,
///         rejected: u32::from(a < 4),
///     });
/// }
/// w.publish(&s);
/// let (taken, advice) = advisor.poll(&meter).unwrap();
/// assert_eq!(taken.delta.drafts, 4);
/// let k = advice.unwrap().recommended(); // the next interval's draft length
/// assert!((1..=4).contains(&k));
/// assert!(advisor.poll(&meter).is_none(), "nothing new");
/// ```
///
/// The draft-length advisor: from measured per-position acceptance and what a draft token
/// costs, the expected tokens per target step and the expected speedup for every draft length
/// `1..=K`, and the length that maximises it. Deterministic (IEEE-754 `f64` operations in a
/// fixed order), no allocation, a loop over at most `K` positions.
///
/// # The model
/// A step with draft length `k` emits the accepted prefix plus one token, so its expected
/// number of tokens is
///
/// `E(k) = 1 + Σ_{j=1..k} Π_{i<j} c_i`
///
/// where `c_i` is the conditional acceptance at position `i`
/// ([`Counters::conditional_acceptance`]: accepted at `i` given `i` was reached and drafted).
/// `Π_{i<j} c_i` is the probability of reaching position `j`; with a fixed draft length it is
/// exactly `accepted_per_position[j-1] / drafts`. The step costs
///
/// `C(k) = 1 + k · r − s · (1 − P_full(k))`
///
/// plain (non-speculative) target steps, where `r` is the cost of one more draft token
/// relative to a plain target step ([`CostModel`]: a draft forward, plus whatever the target
/// step grows by per extra position, when the runtime knows it), `P_full(k) = Π_{i<k} c_i` is
/// the probability that all `k` drafts are accepted, and `s` is what a step saves when its
/// draft is rejected somewhere instead of accepted whole ([`CostModel::with_rejection_saving`]).
/// The two outcomes cost differently: a whole acceptance samples the bonus token from the
/// target's row after `k` tests, a rejection stops at its position and samples the recovered
/// token there, and on a host the difference is a visible share of a small step (the `specula`
/// demo measures it at about 0.8 µs a request). Leaving it out makes long drafts, which are
/// accepted whole more often, look cheaper than they run; [`CostMeter`] fits `s` from the
/// outcomes of the steps it records, and `s = 0` is the plain `1 + k · r`. Plain decoding makes one
/// token per plain step, so the expected speedup over it is `S(k) = E(k) / C(k)`, and the
/// advice is the `k` with the largest `S(k)` (the shortest among equals). `S(k) < 1` for every
/// `k` says plain decoding is faster.
///
/// # What it assumes, and ignores
/// * **Acceptance does not depend on `k`.** `c_i` measured while drafting `k_run` tokens is
///   used for every `k ≤ k_run`. That holds for the verification rules here (position `i`'s
///   test reads only the prefix before it) and for a drafter whose earlier tokens do not
///   depend on how many follow. Lengths above the longest one measured get no prediction: an
///   adaptive runtime that shortens its drafts should still draft the full length now and then
///   (mixed lengths are handled by the conditional estimates, see
///   [`AcceptanceLengths`](crate::metrics::AcceptanceLengths)).
/// * **The outcome's cost is one number.** Where the rejection happens (position 1 or `k`) is
///   not told apart: `s` is the mean saving of a rejected step over a whole acceptance, and a
///   batch's step is taken to save `s` times the share of its requests that rejected.
/// * **Cost grows linearly in `k`.** A target step whose cost grows with its `k + 1` positions
///   (verification work, attention over more query positions, a target that runs positions one
///   after another on a CPU) is exact only if that growth is linear and folded into `r`
///   ([`CostMeter::record`]'s `scaled_ns`). Superlinear growth (the `k + 1` positions
///   leaving the memory-bound regime of a large batch) is not modelled: `r` measured at one
///   `k` then flatters longer drafts.
/// * **No batching effects.** The batch is taken as fixed; a longer draft that shrinks the
///   batch the scheduler can hold (KV cache, token budget) is not modelled.
/// * **One draft per step.** Drafting overlapped with target work (a draft running on other
///   hardware, pipelined) changes `r`; measure it as the runtime runs.
///
/// # Token trees
/// A tree is counted as a chain of its depth ([`Counters::record_tree`]), so the per-position
/// counters are per-depth counters, and verification walks a tree from its root: acceptance at
/// depth `d` depends only on the nodes down to `d`. The counters therefore give `E(d)` for the
/// run's tree cut at every depth `d` up to its own ([`advise_tree`]); the cost of the cut tree
/// needs its node count per depth, which the counters do not hold (only the total,
/// `tree_draft_tokens`): the runtime passes its shape. What the counters cannot tell is how a
/// *wider or narrower* tree would do (which sibling was accepted is not counted), nor per-depth
/// acceptance per tree shape when shapes mix.
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
mod tests;
