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
//! use specula_core::verify::{verify_batch, Batch, Check, Drafts, Method, Outputs, AcceptedOut, TokensOut, Dims, Streams};
//! use specula_core::Counters;
//!
//! // One request, vocabulary 4, a 1-token draft (token 2) from a one-hot drafter.
//! let target = [0.1, 0.2, 0.6, 0.1, /* bonus row */ 0.0, 0.0, 0.0, 1.0];
//! // Rows packed back to back.
//! let batch = Batch::dense(
//!     Dims { vocab: 4, k_max: 1 },
//!     Drafts { k: &[1], ids: &[2] },
//!     &target,
//!     Streams { seed: &[42], offset: &[0] },
//! );
//! let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
//! let mut counters = Counters::<4>::ZERO;
//! let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
//! verify_batch(Method::Greedy, Check::Cheap, &batch, &mut out, &mut counters).unwrap();
//! assert_eq!((accepted, tokens), ([1], [2, 3]));
//! assert_eq!(counters.accepted_tokens, 1);
//! ```

// Checked, not promised: no unsafe code anywhere in verification (so Miri in CI runs the
// modules that have some, gpu/, and the shared-memory metrics; scripts/test.sh says why).
#![forbid(unsafe_code)]

mod batch;
mod device;
mod error;
mod filter;
mod outputs;
mod reference;
mod validate;
mod values;
mod walk;

pub mod tree;

// The numerics of the rules (specified in DETERMINISM.md): public for the backends and the
// test suite, hidden from the documentation, which is for runtimes.
#[doc(hidden)]
pub mod exponential;
#[doc(hidden)]
pub mod fmath;
#[doc(hidden)]
pub mod philox;

pub use batch::{
    Batch, Dims, Draft, Drafts, HalfLogits, Layout, Logits, NO_DRAFT_ROWS, RaggedDrafts,
    RequestPlan, Rows, Streams, Strides, Target, advance_offsets,
};
pub use device::{Device, DeviceOut, DeviceOutputs, Format};
pub use error::{Feature, Param, Tensor, VerifyError};
pub(crate) use filter::FILTER_WORDS;
pub use filter::{Cut, Filter, WeightRow, weight_fixed, weight_key};
pub use reference::{
    Processed, RaceRng, RowOps, ScalarOps, Softmax, argmax, race, race_key, race_residual,
    recovered_at, softmax_exp, softmax_fixed, softmax_max, verify_request,
};
// The GPU staging (`crate::gpu::Staging::write`) checks a batch's extents without outputs.
pub use outputs::{AcceptedOut, Outputs, Produce, TokensOut, to_vllm_recovered, to_vllm_tokens};
pub(crate) use validate::validate_inputs_with;
pub use validate::{
    draft_slots, validate, validate_recovered, validate_request, validate_request_with,
    validate_shape, validate_shape_with, validate_with,
};
pub use values::{Half, Values, bf16_to_f32, f16_to_f32};

use crate::metrics::Counters;

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

/// What a backend can verify beyond the padded layout with `k ≥ 1` every backend supports
/// (see [`Verifier::support`] and [`validate_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct Support {
    /// Requests with `k = 0` (only the bonus token is emitted) and `k_max = 0`.
    pub empty_drafts: bool,
    /// The ragged layout ([`Batch::ragged`]).
    pub ragged: bool,
    /// Caller-supplied bonus tokens ([`Batch::with_bonus`]).
    pub bonus: bool,
    /// Target logits with per-request temperature ([`Batch::with_target_logits`]).
    pub logits: bool,
    /// Per-request sampling filters: top-k, top-p and min-p ([`Batch::with_filters`]).
    pub filters: bool,
    /// bf16 / f16 target logits and draft probabilities ([`Batch::with_target_logits_half`],
    /// [`Batch::with_draft_probs_half`]).
    pub half: bool,
    /// bf16 / f16 target probabilities ([`Batch::with_target`] with half [`Rows`] in
    /// [`Target::Probs`]).
    pub half_probs: bool,
    /// A method per request ([`Batch::with_methods`]).
    pub methods: bool,
    /// The recovered-token output filled by the verification itself
    /// ([`Outputs::with_recovered`]).
    pub recovered: bool,
    /// Token trees ([`Verifier::verify_tree`]): binary32 rows, bf16 / f16 ones with
    /// [`tree_half`](Self::tree_half), rows and outputs in device memory with
    /// [`device`](Self::device).
    pub trees: bool,
    /// bf16 / f16 rows in token trees (target logits or probabilities, draft rows), read as
    /// their exact binary32 widening (the tree of the widened rows, bit for bit): every
    /// verifier (the reference and the CPU backend as chains read them; the GPU verifiers'
    /// tree entry also reads half target probabilities, which their chain entries do not).
    /// Without it: [`Feature::Half`] / [`Feature::HalfProbs`].
    pub tree_half: bool,
    /// Sampling filters in token trees ([`TreeBatch::with_filters`](tree::TreeBatch::with_filters)):
    /// each node's target row filtered as a chain position's (the reference and the CPU
    /// backend; the GPU tree entries have no filter pass). Without it: [`Feature::Filters`].
    pub tree_filters: bool,
    /// Tensors in device memory: [`Values::Device`] rows, [`Outputs::on_device`] and
    /// [`TreeOutputs::on_device`](tree::TreeOutputs::on_device) (the GPU verifiers; a host
    /// verifier cannot read them).
    pub device: bool,
}

impl Support {
    /// The padded layout with `1 ≤ k ≤ k_max`, sampled bonus tokens: what every backend verifies
    /// (the GPU kernels, today).
    pub const PADDED: Self = Self {
        empty_drafts: false,
        ragged: false,
        bonus: false,
        logits: false,
        filters: false,
        half: false,
        half_probs: false,
        methods: false,
        recovered: false,
        trees: false,
        tree_half: false,
        tree_filters: false,
        device: false,
    };
    /// The padded layout with `k = 0` allowed, sampled bonus tokens. (The GPU backends take more:
    /// `specula_core::gpu::SUPPORT`.)
    pub const EMPTY_DRAFTS: Self = Self {
        empty_drafts: true,
        ..Self::PADDED
    };
    /// Everything in host memory the reference verifies (it cannot read
    /// [`device`](Self::device) tensors).
    pub const ALL: Self = Self {
        empty_drafts: true,
        ragged: true,
        bonus: true,
        logits: true,
        filters: true,
        half: true,
        half_probs: true,
        methods: true,
        recovered: true,
        trees: true,
        tree_half: true,
        tree_filters: true,
        // The reference reads every value on the host.
        device: false,
    };
    /// What the CPU backend verifies: all the reference does ([`ALL`](Self::ALL)).
    pub const CPU: Self = Self::ALL;
}

/// A verification backend: verifies a [`Batch`] and counts it, as one operation.
///
/// Contract (tested by the conformance suite in `specula-tests`):
/// * outputs are bit-identical to [`verify_batch`] for every batch it [supports](Self::support),
///   batch size, request order and thread count;
/// * a batch that fails validation returns the same [`VerifyError`] as [`validate_with`] with
///   its [`support`](Self::support) (converted into `Self::Error`), counts nothing, and leaves
///   the outputs untouched;
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

    /// What this backend verifies beyond the padded layout with `k ≥ 1`; a batch using anything
    /// else is refused by validation ([`VerifyError::DraftLength`] for `k = 0`,
    /// [`VerifyError::KMaxOutOfRange`] for `k_max = 0`, [`VerifyError::Unsupported`] for the
    /// ragged layout or bonus tokens). Default: [`Support::PADDED`].
    fn support(&self) -> Support {
        Support::PADDED
    }

    /// Verifies a batch of token trees (`core/DETERMINISM.md`, "Token trees"; bit-identical to
    /// [`verify_tree_batch`](tree::verify_tree_batch)) with `method` after the `check`s, writes
    /// `out` and counts each tree as a chain of its depth
    /// ([`Counters::record_tree`](crate::Counters::record_tree)). A refused batch is a
    /// [`VerifyError`] with nothing written or counted. Default, for a backend without trees
    /// ([`Support::trees`] false): [`VerifyError::Unsupported`] with [`Feature::Trees`].
    fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &tree::TreeBatch<'_>,
        out: &mut tree::TreeOutputs<'_>,
    ) -> Result<(), Self::Error> {
        let _ = (method, check, batch, out);
        Err(VerifyError::Unsupported {
            feature: Feature::Trees,
        }
        .into())
    }
}

/// The reference verifier: validates everything ([`validate_with`] and [`Support::ALL`]), then
/// verifies each request in order with the plain-loop [`ScalarOps`] and records it in
/// `counters` — except a request with `k = 0`, which is not counted (as vLLM counts no draft
/// for it) — and, if its outputs have `recovered` ([`Outputs::with_recovered`]), fills it as
/// [`recovered_tokens`] does. Nothing is counted (and `out` is untouched) when it returns an error.
pub fn verify_batch<const K: usize>(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    out: &mut Outputs<'_>,
    counters: &mut Counters<K>,
) -> Result<(), VerifyError> {
    validate_with::<K>(Support::ALL, method, check, batch, out)?;
    // Device outputs were refused by the validation above.
    let (AcceptedOut(accepted), TokensOut(tokens), recovered) = out.host()?;
    let width = batch.k_max + 1;
    for (b, (acc, row)) in accepted
        .iter_mut()
        .zip(tokens.chunks_exact_mut(width))
        .enumerate()
    {
        *acc = verify_request(&ScalarOps, method, batch, b, row);
        let k = batch.draft_len(b) as usize;
        if k > 0 {
            let recorded = counters.record(k, *acc as usize);
            // Validation guarantees k ≤ k_max ≤ K and accepted ≤ k, so this cannot fail.
            debug_assert!(recorded.is_ok());
        }
    }
    if let Some(recovered) = recovered {
        // The reference recomputes every slot with `recovered_at` (the definition itself);
        // backends may reuse what verification already reduced.
        fill_recovered(&ScalarOps, method, batch, recovered);
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

    fn support(&self) -> Support {
        Support::ALL
    }

    fn verify_tree(
        &mut self,
        method: Method,
        check: Check,
        batch: &tree::TreeBatch<'_>,
        out: &mut tree::TreeOutputs<'_>,
    ) -> Result<(), VerifyError> {
        tree::verify_tree_batch(method, check, batch, out, &mut self.counters)
    }
}

/// vLLM's `recovered_token_ids`, as a separate call (the same values as
/// [`Outputs::with_recovered`] gives from the verification call itself): for every draft slot,
/// the token its request emits if that position is the first rejected one
/// ([`recovered_at`]), whether or not verification reaches it. Layout: one value per draft
/// slot ([`draft_slots`]) — padded, `recovered[b·k_max + j]` with [`SENTINEL`] for `j ≥ k_b`;
/// ragged, `recovered[cu[b−1] + j]`. It uses the same random draws as [`verify_batch`], so at
/// a request's first rejected position it equals the emitted token. Nothing is counted.
///
/// Errors: those of [`validate_with`] with [`Support::ALL`] (the outputs replaced by
/// `recovered`'s length, [`Param::Recovered`]); nothing is written then.
///
/// ```
/// use specula_core::verify::{recovered_tokens, Batch, Check, Dims, Drafts, Method, Streams, SENTINEL};
/// let target = [0.0, 1.0, 0.0, /* bonus row */ 1.0, 0.0, 0.0]; // V = 3, k_max = 1
/// let batch = Batch::dense(
///     Dims { vocab: 3, k_max: 1 },
///     Drafts { k: &[1], ids: &[1] },
///     &target,
///     Streams { seed: &[1], offset: &[0] },
/// );
/// let mut recovered = [SENTINEL; 1];
/// recovered_tokens::<4>(Method::Greedy, Check::STRICT, &batch, &mut recovered).unwrap();
/// assert_eq!(recovered, [1]); // greedy: the argmax of row 0, though the draft is accepted
/// ```
pub fn recovered_tokens<const K: usize>(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    recovered: &mut [u32],
) -> Result<(), VerifyError> {
    validate_recovered::<K>(Support::ALL, method, check, batch, recovered)?;
    fill_recovered(&ScalarOps, method, batch, recovered);
    Ok(())
}

/// Writes [`recovered_tokens`] of a batch that passed [`validate_recovered`], with `ops`.
pub fn fill_recovered<O: RowOps + ?Sized>(
    ops: &O,
    method: Method,
    batch: &Batch<'_>,
    recovered: &mut [u32],
) {
    let mut start = 0usize;
    for b in 0..batch.requests() {
        let k = batch.draft_len(b) as usize;
        if !batch.is_ragged() {
            start = b * batch.k_max;
            for slot in &mut recovered[start + k..start + batch.k_max] {
                *slot = SENTINEL;
            }
        }
        for j in 0..k {
            recovered[start + j] = recovered_at(ops, method, batch, b, j);
        }
        if batch.is_ragged() {
            start += k;
        }
    }
}
