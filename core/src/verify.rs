//! Speculative-decoding verification: the batch layout, the three methods, input validation,
//! and the bit-exact reference every backend must match (rules: `core/DETERMINISM.md`).
//!
//! * [`Batch`] is a borrowed view of one verification step for `B` requests (the document's
//!   layout), [`Outputs`] the caller's output buffers.
//! * [`verify_batch`] is the reference: it validates the whole batch first, then verifies each
//!   request and records it in the [`Counters`], so a batch either counts completely or not at all.
//! * [`Verifier`] is the seam a backend implements ([`Reference`] here, the CPU backend in
//!   `specula::cpu`, the GPU kernels); one conformance suite tests them all against
//!   [`verify_batch`], bit for bit.
//! * [`RowOps`] are the four row reductions (argmax, entropy, race, residual race). The reference
//!   [`ScalarOps`] writes them as plain loops; a backend may vectorise or split them, as long as
//!   the results are the same bits — the rules make every reduction order-independent.
//!
//! ```
//! use specula_core::verify::{verify_batch, Batch, Check, Method, Outputs};
//! use specula_core::Counters;
//!
//! // One request, vocabulary 4, a 1-token draft (token 2) from a one-hot drafter.
//! let target = [0.1, 0.2, 0.6, 0.1, /* bonus row */ 0.0, 0.0, 0.0, 1.0];
//! // V = 4, k_max = 1, k = [1], draft ids [2], rows packed back to back, seed 42, offset 0.
//! let batch = Batch::dense(4, 1, &[1], &[2], &target, &[42], &[0]);
//! let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
//! let mut counters = Counters::<4>::ZERO;
//! let mut out = Outputs { accepted: &mut accepted, tokens: &mut tokens };
//! verify_batch(Method::Greedy, Check::Cheap, &batch, &mut out, &mut counters).unwrap();
//! assert_eq!((accepted, tokens), ([1], [2, 3]));
//! assert_eq!(counters.accepted_tokens, 1);
//! ```

mod error;
mod reference;
mod validate;

pub use error::{Param, Tensor, VerifyError};
pub use reference::{
    RaceRng, RowOps, ScalarOps, argmax, race, race_key, race_residual, verify_request,
};
pub use validate::{validate, validate_request, validate_shape};

use crate::counters::Counters;

/// Default `ε` of typical acceptance (the Medusa paper's hard threshold).
pub const DEFAULT_EPS: f32 = 0.09;
/// Default `δ` of typical acceptance (the entropy-scaled threshold factor).
pub const DEFAULT_DELTA: f32 = 0.3;
/// Default tolerance of [`Check::Strict`]: `|Σ row − 1| ≤ 10⁻³`.
pub const DEFAULT_SUM_TOLERANCE: f32 = 1e-3;
/// The emitted-token slots after the last emitted token hold this.
pub const SENTINEL: u32 = u32::MAX;
/// The largest `k_max` the random-number counter layout allows (`position << 2` fits 32 bits).
pub const MAX_POSITIONS: usize = (1 << 30) - 2;

/// Which verification rule decides acceptance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Method {
    /// Lossless rejection sampling: accept iff `u · p_draft(x) < p_target(x)`; at the first
    /// rejection emit a sample of `max(0, p_target − p_draft)`; after all `k`, a sample of
    /// target row `k`.
    Rejection,
    /// Greedy: accept iff `x` is the target row's argmax (ties to the lowest id); emit the
    /// argmax at the first mismatch, or of row `k`.
    Greedy,
    /// Typical acceptance (Medusa): accept iff `p_target(x) > min(ε, δ · e^(−H(p_target)))`,
    /// with `ε`, `δ` per request from [`Batch::eps`] / [`Batch::delta`]; at the first rejection
    /// emit a sample of that target row, after all `k` a sample of row `k`.
    Typical,
}

/// How much of the input is checked before anything is verified.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Check {
    /// Shapes, lengths, strides, `k`, token ids and typical-acceptance parameters: `O(B · k)`,
    /// always done. Probabilities are used as given (NaN, negative or unnormalised values give
    /// deterministic, but meaningless, results).
    Cheap,
    /// Also every probability that will be read is finite and `≥ 0`, and each such row sums to
    /// within `sum_tolerance` of 1 (summed in `f64`): `O(B · k · V)`.
    Strict {
        /// Allowed `|Σ row − 1|`.
        sum_tolerance: f32,
    },
}

impl Check {
    /// [`Check::Strict`] with [`DEFAULT_SUM_TOLERANCE`].
    pub const STRICT: Self = Self::Strict {
        sum_tolerance: DEFAULT_SUM_TOLERANCE,
    };
}

/// A borrowed view of one verification step of `B = k.len()` requests, laid out as
/// `core/DETERMINISM.md` describes (the same layout a GPU kernel reads).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// Vocabulary size `V` (`1 ≤ V ≤ u32::MAX`).
    pub vocab: usize,
    /// Draft slots per request (`1 ≤ k_max ≤ K`).
    pub k_max: usize,
    /// `k[b]`: request `b`'s draft length, `1 ≤ k[b] ≤ k_max`. Its length is the batch size `B`.
    pub k: &'a [u32],
    /// `draft_ids[b·k_max + j]` for `j < k[b]`: the draft tokens (`< V`); `B · k_max` values.
    pub draft_ids: &'a [u32],
    /// Draft probabilities: row `(b, j)` starts at `(b·k_max + j) · draft_stride`;
    /// `B · k_max · draft_stride` values. `None`: a drafter without probabilities (one-hot).
    pub draft_probs: Option<&'a [f32]>,
    /// Row stride of `draft_probs` (`≥ V`); ignored when `draft_probs` is `None`.
    pub draft_stride: usize,
    /// Target probabilities: row `(b, j)`, `j ≤ k_max`, starts at
    /// `(b·(k_max+1) + j) · target_stride`; `B · (k_max+1) · target_stride` values.
    pub target_probs: &'a [f32],
    /// Row stride of `target_probs` (`≥ V`).
    pub target_stride: usize,
    /// Per-request random seed (`B` values).
    pub seed: &'a [u64],
    /// Per-request random offset (`B` values); the caller advances it every step.
    pub offset: &'a [u64],
    /// Typical acceptance `ε` per request (`B` values, finite, `≥ 0`); `None`: [`DEFAULT_EPS`].
    pub eps: Option<&'a [f32]>,
    /// Typical acceptance `δ` per request (`B` values, finite, `≥ 0`); `None`: [`DEFAULT_DELTA`].
    pub delta: Option<&'a [f32]>,
}

impl<'a> Batch<'a> {
    /// A batch whose rows are packed back to back (both strides equal `vocab`), from a drafter
    /// without probabilities and with the default typical-acceptance parameters; add those with
    /// [`with_draft_probs`](Batch::with_draft_probs) and [`with_typical`](Batch::with_typical).
    /// Nothing is checked here: the verifier validates the batch.
    ///
    /// ```
    /// use specula_core::verify::Batch;
    /// let target = [0.5, 0.5, 0.0, 1.0]; // V = 2, k_max = 1: two target rows
    /// let draft = [0.9, 0.1];
    /// let b = Batch::dense(2, 1, &[1], &[0], &target, &[7], &[0]).with_draft_probs(&draft);
    /// assert_eq!((b.requests(), b.draft_stride, b.target_stride), (1, 2, 2));
    /// ```
    #[must_use]
    pub const fn dense(
        vocab: usize,
        k_max: usize,
        k: &'a [u32],
        draft_ids: &'a [u32],
        target_probs: &'a [f32],
        seed: &'a [u64],
        offset: &'a [u64],
    ) -> Self {
        Self {
            vocab,
            k_max,
            k,
            draft_ids,
            draft_probs: None,
            draft_stride: vocab,
            target_probs,
            target_stride: vocab,
            seed,
            offset,
            eps: None,
            delta: None,
        }
    }

    /// The same batch with draft probabilities (rows of stride [`draft_stride`](Batch::draft_stride)).
    #[must_use]
    pub const fn with_draft_probs(self, draft_probs: &'a [f32]) -> Self {
        Self {
            draft_probs: Some(draft_probs),
            ..self
        }
    }

    /// The same batch with per-request typical-acceptance `ε` and `δ`.
    #[must_use]
    pub const fn with_typical(self, eps: &'a [f32], delta: &'a [f32]) -> Self {
        Self {
            eps: Some(eps),
            delta: Some(delta),
            ..self
        }
    }

    /// The batch size `B`.
    #[must_use]
    pub fn requests(&self) -> usize {
        self.k.len()
    }

    /// Target row `(b, j)`, exactly `V` values. Only for a validated batch.
    #[inline]
    pub(crate) fn target_row(&self, b: usize, j: usize) -> &[f32] {
        let start = (b * (self.k_max + 1) + j) * self.target_stride;
        &self.target_probs[start..start + self.vocab]
    }

    /// Draft row `(b, j)`, exactly `V` values, if the drafter gave probabilities. Only for a
    /// validated batch.
    #[inline]
    pub(crate) fn draft_row(&self, b: usize, j: usize) -> Option<&[f32]> {
        self.draft_probs.map(|d| {
            let start = (b * self.k_max + j) * self.draft_stride;
            &d[start..start + self.vocab]
        })
    }

    #[inline]
    pub(crate) fn eps_of(&self, b: usize) -> f32 {
        self.eps.map_or(DEFAULT_EPS, |e| e[b])
    }

    #[inline]
    pub(crate) fn delta_of(&self, b: usize) -> f32 {
        self.delta.map_or(DEFAULT_DELTA, |d| d[b])
    }
}

/// The caller's output buffers for a [`Batch`] of `B` requests.
#[derive(Debug)]
pub struct Outputs<'a> {
    /// `accepted[b]`: how many draft tokens request `b` accepted (`B` values).
    pub accepted: &'a mut [u32],
    /// `tokens[b·(k_max+1) + j]`: the accepted draft tokens, then the one recovered or bonus
    /// token, then [`SENTINEL`] up to `k_max + 1` slots (`B · (k_max+1)` values).
    pub tokens: &'a mut [u32],
}

/// A verification backend: verifies a [`Batch`] and counts it, as one operation.
///
/// Contract (tested by the conformance suite in `specula-tests`):
/// * outputs are bit-identical to [`verify_batch`] for every batch, batch size, request order and
///   thread count;
/// * a batch that fails validation returns the same [`VerifyError`] as [`validate`] (converted
///   into `Self::Error`), counts nothing, and leaves the outputs untouched;
/// * after a successful call the totals include every request of the batch.
pub trait Verifier<const K: usize> {
    /// Why verification failed: at least every [`VerifyError`], plus whatever the backend adds
    /// (driver errors, for instance).
    type Error: core::fmt::Debug + From<VerifyError> + PartialEq;

    /// Verifies `batch` with `method` after the `check`s, writes `out` and counts every request.
    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), Self::Error>;

    /// The cumulative counters of every batch verified so far (waits for the device if it has
    /// to).
    fn totals(&mut self) -> Result<Counters<K>, Self::Error>;
}

/// The reference verifier: validates everything, then verifies each request in order with the
/// plain-loop [`ScalarOps`] and records it in `counters`. Nothing is counted (and `out` is
/// untouched) when it returns an error.
pub fn verify_batch<const K: usize>(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    out: &mut Outputs<'_>,
    counters: &mut Counters<K>,
) -> Result<(), VerifyError> {
    validate::<K>(method, check, batch, out)?;
    let width = batch.k_max + 1;
    for (b, (acc, row)) in out
        .accepted
        .iter_mut()
        .zip(out.tokens.chunks_exact_mut(width))
        .enumerate()
    {
        *acc = verify_request(&ScalarOps, method, batch, b, row);
        let recorded = counters.record(batch.k[b] as usize, *acc as usize);
        // Validation guarantees 1 ≤ k ≤ k_max ≤ K and accepted ≤ k, so this cannot fail.
        debug_assert!(recorded.is_ok());
    }
    Ok(())
}

/// [`verify_batch`] as a [`Verifier`], owning its counters.
#[derive(Clone, Debug, Default)]
pub struct Reference<const K: usize> {
    /// Everything counted so far.
    pub counters: Counters<K>,
}

impl<const K: usize> Reference<K> {
    /// A reference verifier with zero counters.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            counters: Counters::ZERO,
        }
    }
}

impl<const K: usize> Verifier<K> for Reference<K> {
    type Error = VerifyError;

    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), VerifyError> {
        verify_batch(method, check, batch, out, &mut self.counters)
    }

    fn totals(&mut self) -> Result<Counters<K>, VerifyError> {
        Ok(self.counters)
    }
}
