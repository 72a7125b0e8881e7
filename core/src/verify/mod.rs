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

mod error;
mod filter;
mod reference;
mod validate;
mod values;

pub mod tree;

// The numerics of the rules (specified in DETERMINISM.md): public for the backends and the
// test suite, hidden from the documentation, which is for runtimes.
#[doc(hidden)]
pub mod exponential;
#[doc(hidden)]
pub mod fmath;
#[doc(hidden)]
pub mod philox;

pub use error::{Feature, Param, Tensor, VerifyError};
pub use filter::{Cut, Filter, WeightRow, weight_fixed, weight_key};
pub use reference::{
    Processed, RaceRng, RowOps, ScalarOps, Softmax, argmax, race, race_key, race_residual,
    recovered_at, softmax_exp, softmax_fixed, softmax_max, verify_request,
};
// The GPU staging (`crate::gpu::Staging::write`) checks a batch's extents without outputs.
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

/// The vocabulary size and the number of draft slots per request of a padded [`Batch`]
/// (named fields: the two sizes cannot be swapped silently).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dims {
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Draft slots per request (`k_max`).
    pub k_max: usize,
}

/// The drafts of a padded [`Batch`]: per-request lengths and the `B · k_max` padded ids.
#[derive(Clone, Copy, Debug)]
pub struct Drafts<'a> {
    /// `k[b]`: request `b`'s draft length; its length is the batch size `B`.
    pub k: &'a [u32],
    /// `ids[b·k_max + j]` for `j < k[b]`: the draft tokens.
    pub ids: &'a [u32],
}

/// The drafts of a ragged [`Batch`] (vLLM's layout): cumulative draft counts and the
/// `num_tokens` ids packed back to back.
#[derive(Clone, Copy, Debug)]
pub struct RaggedDrafts<'a> {
    /// vLLM's `cu_num_draft_tokens`: `cu[b]` is the number of draft tokens of requests `0..=b`
    /// (non-decreasing); its length is the batch size `B`, its last value `num_tokens`.
    pub cu_num_draft_tokens: &'a [u32],
    /// The draft tokens, request after request: request `b`'s are `ids[cu[b−1]..cu[b]]`
    /// (`cu[−1] = 0`).
    pub ids: &'a [u32],
}

/// The per-request random streams of a [`Batch`] (named fields: seed and offset cannot be
/// swapped silently). Each is `B` values; advance the offsets every step with
/// [`advance_offsets`].
#[derive(Clone, Copy, Debug)]
pub struct Streams<'a> {
    /// Per-request random seed.
    pub seed: &'a [u64],
    /// Per-request random offset (the step counter of the request's stream).
    pub offset: &'a [u64],
}

/// Advances every request's random offset by one step (wrapping). One verification step reads
/// draft positions `0..=k` at one offset, so the next step needs the next offset to draw fresh
/// numbers; call this once per step after verifying.
///
/// ```
/// use specula_core::verify::advance_offsets;
/// let mut offset = [0u64, 41, u64::MAX];
/// advance_offsets(&mut offset);
/// assert_eq!(offset, [1, 42, 0]);
/// ```
pub fn advance_offsets(offsets: &mut [u64]) {
    for o in offsets {
        *o = o.wrapping_add(1);
    }
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
    /// Per-request top-k, top-p and min-p ([`Batch::with_top_k`], [`Batch::with_top_p`],
    /// [`Batch::with_min_p`]).
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
    };
    /// The padded layout with `k = 0` allowed, sampled bonus tokens. (The GPU backends take more:
    /// `specula_core::gpu::SUPPORT`.)
    pub const EMPTY_DRAFTS: Self = Self {
        empty_drafts: true,
        ragged: false,
        bonus: false,
        logits: false,
        filters: false,
        half: false,
        half_probs: false,
        methods: false,
        recovered: false,
    };
    /// Everything: the reference and the CPU backend.
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
    };
}

/// Where each request's drafts sit in a [`Batch`]: the padded layout (`k` per request) or
/// vLLM's ragged one (`cu_num_draft_tokens`). One of the two, never both.
#[derive(Clone, Copy, Debug)]
pub enum Layout<'a> {
    /// `k[b]`: request `b`'s draft length (`≤ k_max`; `≥ 1` unless [`Support::empty_drafts`]);
    /// its length is the batch size `B`. Request `b`'s draft slots are `b·k_max + j`.
    Padded {
        /// Per-request draft lengths.
        k: &'a [u32],
    },
    /// vLLM's `cu_num_draft_tokens`: `cu[b]` is the number of draft tokens of requests `0..=b`
    /// (non-decreasing); its length is `B`, its last value `num_tokens`. Request `b`'s draft
    /// slots are `cu[b−1] + j` (`cu[−1] = 0`).
    Ragged {
        /// Cumulative draft counts.
        cu_num_draft_tokens: &'a [u32],
    },
}

/// A tensor of rows in one element format: row `r` is `V` values from `r · stride`.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    /// The values, binary32 or half precision ([`Values`]).
    pub values: Values<'a>,
    /// The row stride (`≥ V`).
    pub stride: usize,
}

impl<'a> Rows<'a> {
    /// binary32 rows of stride `stride`.
    #[must_use]
    pub const fn f32(values: &'a [f32], stride: usize) -> Self {
        Self {
            values: Values::F32(values),
            stride,
        }
    }

    /// bf16 / f16 rows of stride `stride` (widened exactly on read).
    #[must_use]
    pub const fn half(values: Half<'a>, stride: usize) -> Self {
        Self {
            values: Values::Half(values),
            stride,
        }
    }

    /// The binary32 values, `None` for half-precision rows.
    #[must_use]
    pub const fn as_f32(&self) -> Option<&'a [f32]> {
        match self.values {
            Values::F32(x) => Some(x),
            Values::Half(_) => None,
        }
    }

    /// The half-precision values, `None` for binary32 rows.
    #[must_use]
    pub const fn as_half(&self) -> Option<Half<'a>> {
        match self.values {
            Values::F32(_) => None,
            Values::Half(h) => Some(h),
        }
    }

    /// Row `r` (`vocab` values), `None` if outside the tensor or the offset overflows.
    #[must_use]
    pub fn row(&self, r: usize, vocab: usize) -> Option<Values<'a>> {
        self.values.get(r.checked_mul(self.stride)?, vocab)
    }
}

/// The target model's rows of a [`Batch`]: probabilities, or logits with a temperature per
/// request. One of the two, in one element format, with one stride.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// Probabilities, verified as given.
    Probs(Rows<'a>),
    /// Logits, turned into probabilities by the softmax of `core/DETERMINISM.md` at each
    /// request's temperature (`B` values, finite, `≥ 0`; `0`: greedy on the logits).
    Logits {
        /// The logits.
        rows: Rows<'a>,
        /// Per-request temperature.
        temperature: &'a [f32],
    },
}

impl<'a> Target<'a> {
    /// The rows, probabilities or logits.
    #[must_use]
    pub const fn rows(&self) -> Rows<'a> {
        match *self {
            Self::Probs(r) | Self::Logits { rows: r, .. } => r,
        }
    }

    /// The per-request temperatures, `None` for probabilities.
    #[must_use]
    pub const fn temperature(&self) -> Option<&'a [f32]> {
        match *self {
            Self::Probs(_) => None,
            Self::Logits { temperature, .. } => Some(temperature),
        }
    }

    /// The same target with row stride `stride`.
    #[must_use]
    pub const fn with_stride(self, stride: usize) -> Self {
        match self {
            Self::Probs(r) => Self::Probs(Rows { stride, ..r }),
            Self::Logits { rows, temperature } => Self::Logits {
                rows: Rows { stride, ..rows },
                temperature,
            },
        }
    }
}

/// A borrowed view of one verification step of `B` requests, laid out as
/// `core/DETERMINISM.md` describes (the same layout a GPU kernel reads).
///
/// Build it with [`Batch::dense`] (the padded layout) or [`Batch::ragged`] (vLLM's layout) and
/// the `with_*` methods; it is `#[non_exhaustive]`, so new inputs are added without breaking
/// callers. What excludes each other is one typed field: the [`Layout`], the [`Target`] rows
/// (probabilities or logits, in one format) and the optional draft [`Rows`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Batch<'a> {
    /// Vocabulary size `V` (`1 ≤ V ≤ u32::MAX`).
    pub vocab: usize,
    /// Draft slots per request (`0 ≤ k_max ≤ K`; `0` only where [`Support::empty_drafts`]).
    /// In the ragged layout, the largest draft length (the output width is `k_max + 1`).
    pub k_max: usize,
    /// Where each request's drafts are.
    pub layout: Layout<'a>,
    /// Padded layout: `draft_ids[b·k_max + j]` for `j < k[b]`, `B · k_max` values. Ragged: the
    /// `num_tokens` ids back to back. Every id read is `< V`.
    pub draft_ids: &'a [u32],
    /// Draft probabilities: padded, row `(b, j)` is row `b·k_max + j` (`B · k_max` rows);
    /// ragged, row `cu[b−1] + j` (`num_tokens` rows). `None`: a drafter without probabilities
    /// (one-hot).
    pub draft: Option<Rows<'a>>,
    /// Target rows: padded, row `(b, j)`, `j ≤ k_max`, is row `b·(k_max+1) + j`
    /// (`B · (k_max+1)` rows); ragged, row `cu[b−1] + b + j` (`num_tokens + B` rows), or
    /// without the bonus rows when bonus tokens are supplied: `cu[b−1] + j` (`num_tokens` rows).
    pub target: Target<'a>,
    /// Per-request random seed (`B` values).
    pub seed: &'a [u64],
    /// Per-request random offset (`B` values); the caller advances it every step
    /// ([`advance_offsets`]).
    pub offset: &'a [u64],
    /// Typical acceptance `ε` per request (`B` values, finite, `≥ 0`); `None`: [`DEFAULT_EPS`].
    pub eps: Option<&'a [f32]>,
    /// Typical acceptance `δ` per request (`B` values, finite, `≥ 0`); `None`: [`DEFAULT_DELTA`].
    pub delta: Option<&'a [f32]>,
    /// Caller-supplied bonus tokens (`B` values, `< V`): emitted when a request accepts all its
    /// drafts, instead of a sample of target row `k`. `None`: sampled.
    pub bonus: Option<&'a [u32]>,
    /// Per-request top-k (`B` values; `0`: off), see [`Filter`].
    pub top_k: Option<&'a [u32]>,
    /// Per-request top-p (`B` values in `(0, 1]`; `1`: off), see [`Filter`].
    pub top_p: Option<&'a [f32]>,
    /// Per-request min-p (`B` values in `[0, 1]`; `0`: off), see [`Filter`].
    pub min_p: Option<&'a [f32]>,
    /// Per-request method (`B` values), overriding the method of the call. `None`: the call's.
    pub methods: Option<&'a [Method]>,
}

impl<'a> Batch<'a> {
    /// A batch in the padded layout whose rows are packed back to back (both strides equal
    /// `vocab`), from a drafter without probabilities and with the default typical-acceptance
    /// parameters; add those with [`with_draft_probs`](Batch::with_draft_probs) and
    /// [`with_typical`](Batch::with_typical). Nothing is checked here: the verifier validates
    /// the batch.
    ///
    /// ```
    /// use specula_core::verify::{Batch, Drafts, Dims, Streams};
    /// let target = [0.5, 0.5, 0.0, 1.0]; // V = 2, k_max = 1: two target rows
    /// let draft = [0.9, 0.1];
    /// let b = Batch::dense(
    ///     Dims { vocab: 2, k_max: 1 },
    ///     Drafts { k: &[1], ids: &[0] },
    ///     &target,
    ///     Streams { seed: &[7], offset: &[0] },
    /// )
    /// .with_draft_probs(&draft);
    /// assert_eq!((b.requests(), b.draft.map(|d| d.stride), b.target.rows().stride), (1, Some(2), 2));
    /// ```
    #[must_use]
    pub const fn dense(
        dims: Dims,
        drafts: Drafts<'a>,
        target_probs: &'a [f32],
        streams: Streams<'a>,
    ) -> Self {
        Self {
            vocab: dims.vocab,
            k_max: dims.k_max,
            layout: Layout::Padded { k: drafts.k },
            draft_ids: drafts.ids,
            draft: None,
            target: Target::Probs(Rows::f32(target_probs, dims.vocab)),
            seed: streams.seed,
            offset: streams.offset,
            eps: None,
            delta: None,
            bonus: None,
            top_k: None,
            top_p: None,
            min_p: None,
            methods: None,
        }
    }

    /// A batch in the ragged layout (vLLM's): request `b` has `k_b = cu[b] − cu[b−1]` drafts
    /// (`k_b = 0` allowed), its target rows are `cu[b−1] + b + j` for `j ≤ k_b` (`num_tokens + B`
    /// rows, or `num_tokens` rows `cu[b−1] + j` with [`with_bonus`](Batch::with_bonus)). Strides
    /// equal `vocab`; `k_max` is the largest `k_b` (the outputs are `B × (k_max + 1)`).
    ///
    /// ```
    /// use specula_core::verify::{Batch, RaggedDrafts, Streams};
    /// // Two requests, V = 2: the first drafts token 1, the second nothing (k = 0).
    /// let target = [0.0, 1.0, /* bonus */ 1.0, 0.0, /* request 1, bonus */ 0.0, 1.0];
    /// let b = Batch::ragged(
    ///     2,
    ///     RaggedDrafts { cu_num_draft_tokens: &[1, 1], ids: &[1] },
    ///     &target,
    ///     Streams { seed: &[7, 8], offset: &[0, 0] },
    /// );
    /// assert_eq!((b.requests(), b.k_max, b.draft_len(1)), (2, 1, 0));
    /// ```
    #[must_use]
    pub const fn ragged(
        vocab: usize,
        drafts: RaggedDrafts<'a>,
        target_probs: &'a [f32],
        streams: Streams<'a>,
    ) -> Self {
        let cu = drafts.cu_num_draft_tokens;
        let mut k_max = 0usize;
        let mut prev = 0u32;
        let mut i = 0;
        while i < cu.len() {
            // Saturating: a decreasing `cu` is refused by validation, not here.
            let k = cu[i].saturating_sub(prev) as usize;
            if k > k_max {
                k_max = k;
            }
            prev = cu[i];
            i += 1;
        }
        Self {
            vocab,
            k_max,
            layout: Layout::Ragged {
                cu_num_draft_tokens: cu,
            },
            draft_ids: drafts.ids,
            draft: None,
            target: Target::Probs(Rows::f32(target_probs, vocab)),
            seed: streams.seed,
            offset: streams.offset,
            eps: None,
            delta: None,
            bonus: None,
            top_k: None,
            top_p: None,
            min_p: None,
            methods: None,
        }
    }

    /// The same batch with binary32 draft probabilities, at the stride of the draft rows they
    /// replace, or packed back to back (stride `V`) if there were none
    /// ([`with_strides`](Batch::with_strides) afterwards, or [`with_draft`](Batch::with_draft),
    /// for another stride).
    #[must_use]
    pub const fn with_draft_probs(self, draft_probs: &'a [f32]) -> Self {
        self.with_draft(Rows::f32(draft_probs, self.draft_stride()))
    }

    /// The stride of the draft rows, `V` where there are none.
    const fn draft_stride(&self) -> usize {
        match self.draft {
            Some(d) => d.stride,
            None => self.vocab,
        }
    }

    /// The same batch with draft probabilities in any format and stride.
    #[must_use]
    pub const fn with_draft(self, draft: Rows<'a>) -> Self {
        Self {
            draft: Some(draft),
            ..self
        }
    }

    /// The same batch with these target rows (probabilities or logits, any format and stride).
    #[must_use]
    pub const fn with_target(self, target: Target<'a>) -> Self {
        Self { target, ..self }
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

    /// The same batch with caller-supplied bonus tokens (`B` values, the engine's own sampler
    /// made them): a request that accepts all its drafts emits `bonus[b]`. In the ragged layout
    /// the target tensor then has no bonus rows (`num_tokens` rows, as vLLM's).
    #[must_use]
    pub const fn with_bonus(self, bonus: &'a [u32]) -> Self {
        Self {
            bonus: Some(bonus),
            ..self
        }
    }

    /// The same batch verified against target **logits** instead of probabilities: rows laid
    /// out as the target probabilities (the same stride, padded or ragged), one temperature per
    /// request. `T > 0`: each row is the softmax of `logits / T` defined in
    /// `core/DETERMINISM.md` (bit-exact, order-independent), then the method's rules apply to
    /// it; `T = 0`: the request is verified greedily on the logits (argmax), whatever the
    /// method. `target_probs` is set empty.
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, Batch, Check, Dims, Drafts, Logits, Method, Outputs, AcceptedOut, TokensOut, Streams};
    /// use specula_core::Counters;
    /// let logits = [0.0, 3.0, 0.0, /* bonus row */ 5.0, 0.0, 0.0]; // V = 3, k_max = 1
    /// let batch = Batch::dense(
    ///     Dims { vocab: 3, k_max: 1 },
    ///     Drafts { k: &[1], ids: &[1] },
    ///     &[],
    ///     Streams { seed: &[1], offset: &[0] },
    /// )
    /// .with_target_logits(Logits { values: &logits, temperature: &[0.0] });
    /// let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// let mut counters = Counters::<4>::ZERO;
    /// verify_batch(Method::Rejection, Check::Cheap, &batch, &mut out, &mut counters).unwrap();
    /// assert_eq!((accepted, tokens), ([1], [1, 0])); // T = 0: greedy
    /// ```
    #[must_use]
    pub const fn with_target_logits(self, logits: Logits<'a>) -> Self {
        self.with_target(Target::Logits {
            rows: Rows::f32(logits.values, self.target.rows().stride),
            temperature: logits.temperature,
        })
    }

    /// [`with_target_logits`](Batch::with_target_logits) for bf16 / f16 logits (the engine's
    /// own tensor, reinterpreted as 16-bit patterns): each value is widened exactly to binary32,
    /// then everything is as with binary32 logits. `target_probs` is set empty and
    /// `target_logits` to `None`.
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, Batch, Check, Dims, Drafts, Half, HalfLogits, Method, Outputs, AcceptedOut, TokensOut, Streams};
    /// use specula_core::Counters;
    /// // bf16 bit patterns of 0, 3, 0 and (bonus row) 5, 0, 0.
    /// let logits = [0x0000, 0x4040, 0x0000, 0x40A0, 0x0000, 0x0000];
    /// let batch = Batch::dense(
    ///     Dims { vocab: 3, k_max: 1 },
    ///     Drafts { k: &[1], ids: &[1] },
    ///     &[],
    ///     Streams { seed: &[1], offset: &[0] },
    /// )
    /// .with_target_logits_half(HalfLogits { values: Half::Bf16(&logits), temperature: &[0.0] });
    /// let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// let mut counters = Counters::<4>::ZERO;
    /// verify_batch(Method::Rejection, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
    /// assert_eq!((accepted, tokens), ([1], [1, 0]));
    /// ```
    #[must_use]
    pub const fn with_target_logits_half(self, logits: HalfLogits<'a>) -> Self {
        self.with_target(Target::Logits {
            rows: Rows::half(logits.values, self.target.rows().stride),
            temperature: logits.temperature,
        })
    }

    /// [`with_draft_probs`](Batch::with_draft_probs) for bf16 / f16 draft probabilities (the
    /// same stride rule), widened exactly to binary32 on read.
    #[must_use]
    pub const fn with_draft_probs_half(self, draft_probs: Half<'a>) -> Self {
        self.with_draft(Rows::half(draft_probs, self.draft_stride()))
    }

    /// The same batch with per-request top-k (`B` values, `0` = off): each request's target
    /// rows keep their `top_k` largest probabilities (ties with the `top_k`-th kept) and are
    /// renormalised before verification (`core/DETERMINISM.md`, "Sampling filters").
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, Batch, Check, Dims, Drafts, Method, Outputs, AcceptedOut, TokensOut, Streams};
    /// use specula_core::Counters;
    /// // Draft token 2 has target probability 0.3, but top-k 1 keeps only token 0.
    /// let target = [0.6, 0.1, 0.3, /* bonus row */ 0.2, 0.5, 0.3];
    /// let batch = Batch::dense(
    ///     Dims { vocab: 3, k_max: 1 },
    ///     Drafts { k: &[1], ids: &[2] },
    ///     &target,
    ///     Streams { seed: &[9], offset: &[0] },
    /// )
    /// .with_top_k(&[1]);
    /// let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// let mut counters = Counters::<4>::ZERO;
    /// verify_batch(Method::Rejection, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
    /// assert_eq!((accepted, tokens), ([0], [0, u32::MAX])); // rejected; the only kept id
    /// ```
    #[must_use]
    pub const fn with_top_k(self, top_k: &'a [u32]) -> Self {
        Self {
            top_k: Some(top_k),
            ..self
        }
    }

    /// The same batch with per-request top-p (`B` values in `(0, 1]`, `1` = off): each
    /// request's target rows keep the smallest set of largest probabilities whose mass reaches
    /// `top_p` (the id that crosses it and its ties kept), renormalised.
    #[must_use]
    pub const fn with_top_p(self, top_p: &'a [f32]) -> Self {
        Self {
            top_p: Some(top_p),
            ..self
        }
    }

    /// The same batch with per-request min-p (`B` values in `[0, 1]`, `0` = off): each
    /// request's target rows keep the probabilities `≥ min_p ×` the row's largest,
    /// renormalised.
    #[must_use]
    pub const fn with_min_p(self, min_p: &'a [f32]) -> Self {
        Self {
            min_p: Some(min_p),
            ..self
        }
    }

    /// The same batch with a verification method per request (`B` values), overriding the
    /// method the verifier is called with: greedy, rejection-sampled and typical-acceptance
    /// requests in one batch (logits at temperature 0 stay greedy whatever the method).
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, Batch, Check, Dims, Drafts, Method, Outputs, AcceptedOut, TokensOut, Streams};
    /// use specula_core::Counters;
    /// // Both requests draft token 1, which has target probability 0.4 (argmax: token 0).
    /// let row = [0.6, 0.4, /* bonus */ 0.0, 1.0];
    /// let target: Vec<f32> = row.iter().chain(&row).copied().collect();
    /// let batch = Batch::dense(
    ///     Dims { vocab: 2, k_max: 1 },
    ///     Drafts { k: &[1, 1], ids: &[1, 1] },
    ///     &target,
    ///     Streams { seed: &[5, 5], offset: &[0, 0] },
    /// )
    /// .with_methods(&[Method::Greedy, Method::Typical]);
    /// let (mut accepted, mut tokens) = ([0u32; 2], [0u32; 4]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// let mut counters = Counters::<4>::ZERO;
    /// verify_batch(Method::Rejection, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
    /// // Greedy rejects (not the argmax) and emits 0; typical accepts (0.4 > ε = 0.09).
    /// assert_eq!((accepted, tokens), ([0, 1], [0, u32::MAX, 1, 1]));
    /// ```
    #[must_use]
    pub const fn with_methods(self, methods: &'a [Method]) -> Self {
        Self {
            methods: Some(methods),
            ..self
        }
    }

    /// Request `b`'s method: its own ([`with_methods`](Batch::with_methods)) or `call`'s.
    #[must_use]
    pub fn method_of(&self, b: usize, call: Method) -> Method {
        self.methods.map_or(call, |m| m[b])
    }

    /// The same batch with explicit row strides (`≥ V`) for the target rows and, if the batch
    /// has them, the draft rows (call it after [`with_draft_probs`](Batch::with_draft_probs)).
    #[must_use]
    pub const fn with_strides(self, strides: Strides) -> Self {
        Self {
            target: self.target.with_stride(strides.target),
            draft: match self.draft {
                Some(d) => Some(Rows {
                    stride: strides.draft,
                    ..d
                }),
                None => None,
            },
            ..self
        }
    }

    /// The batch size `B`.
    #[must_use]
    pub fn requests(&self) -> usize {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens: cu,
            } => cu.len(),
            Layout::Padded { k } => k.len(),
        }
    }

    /// Whether the batch is in the ragged layout.
    #[must_use]
    pub fn is_ragged(&self) -> bool {
        matches!(self.layout, Layout::Ragged { .. })
    }

    /// vLLM's `cu_num_draft_tokens` of a ragged batch, `None` for the padded layout.
    #[must_use]
    pub fn cu_num_draft_tokens(&self) -> Option<&'a [u32]> {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens,
            } => Some(cu_num_draft_tokens),
            Layout::Padded { .. } => None,
        }
    }

    /// The per-request draft lengths of a padded batch (empty for the ragged layout).
    #[must_use]
    pub fn k(&self) -> &'a [u32] {
        match self.layout {
            Layout::Padded { k } => k,
            Layout::Ragged { .. } => &[],
        }
    }

    /// Request `b`'s first draft slot: `b·k_max` (padded) or `cu[b−1]` (ragged).
    #[inline]
    fn draft_start(&self, b: usize) -> usize {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens: cu,
            } => {
                if b == 0 {
                    0
                } else {
                    cu[b - 1] as usize
                }
            }
            Layout::Padded { .. } => b * self.k_max,
        }
    }

    /// Request `b`'s draft length `k_b` (wrapping for a decreasing ragged `cu`, which validation
    /// refuses). Panics if `b ≥ B`.
    #[must_use]
    pub fn draft_len(&self, b: usize) -> u32 {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens: cu,
            } => cu[b].wrapping_sub(if b == 0 { 0 } else { cu[b - 1] }),
            Layout::Padded { k } => k[b],
        }
    }

    /// Request `b`'s draft ids (`k_b` values). Only for a validated batch.
    #[inline]
    pub(crate) fn draft_ids_of(&self, b: usize) -> &[u32] {
        &self.draft_ids[self.draft_start(b)..][..self.draft_len(b) as usize]
    }

    /// The index of target row `(b, j)` in the target tensor, `None` on overflow or a `b`
    /// outside a ragged layout.
    fn target_row_index(&self, b: usize, j: usize) -> Option<usize> {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens: cu,
            } => {
                let start = if b == 0 { 0 } else { *cu.get(b - 1)? as usize };
                let extra = if self.bonus.is_some() { 0 } else { b };
                start.checked_add(extra)?.checked_add(j)
            }
            Layout::Padded { .. } => b.checked_mul(self.k_max.checked_add(1)?)?.checked_add(j),
        }
    }

    /// Binary32 target row `(b, j)` (probabilities or logits), exactly `V` values; `None` if it
    /// is outside the tensor (a batch that passed validation never is, for `j ≤ k_b`, or
    /// `j < k_b` with bonus tokens in the ragged layout) or the rows are half precision.
    #[must_use]
    pub fn target_row_checked(&self, b: usize, j: usize) -> Option<&'a [f32]> {
        match self.target_values_checked(b, j)? {
            Values::F32(x) => Some(x),
            Values::Half(_) => None,
        }
    }

    /// Request `b`'s draft ids (`k_b` values), `None` if outside the slice.
    #[must_use]
    pub fn draft_ids_checked(&self, b: usize) -> Option<&[u32]> {
        let k = self.draft_len_checked(b)? as usize;
        let start = self.draft_start_checked(b)?;
        self.draft_ids.get(start..start.checked_add(k)?)
    }

    /// Binary32 draft row `(b, j)` if the drafter gave binary32 probabilities and it is inside
    /// the tensor.
    #[must_use]
    pub fn draft_row_checked(&self, b: usize, j: usize) -> Option<&'a [f32]> {
        match self.draft_values_checked(b, j)? {
            Values::F32(x) => Some(x),
            Values::Half(_) => None,
        }
    }

    fn draft_start_checked(&self, b: usize) -> Option<usize> {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens: cu,
            } => Some(if b == 0 { 0 } else { *cu.get(b - 1)? as usize }),
            Layout::Padded { .. } => b.checked_mul(self.k_max),
        }
    }

    fn draft_len_checked(&self, b: usize) -> Option<u32> {
        match self.layout {
            Layout::Ragged {
                cu_num_draft_tokens: cu,
            } => cu
                .get(b)?
                .checked_sub(if b == 0 { 0 } else { *cu.get(b - 1)? }),
            Layout::Padded { k } => k.get(b).copied(),
        }
    }

    /// Whether the batch has target logits (binary32 or half).
    #[must_use]
    pub fn has_logits(&self) -> bool {
        matches!(self.target, Target::Logits { .. })
    }

    /// Request `b`'s sampling filter ([`Filter::NONE`] where a part is not given). Panics if
    /// a given slice is shorter than `b + 1`.
    #[must_use]
    pub fn filter_of(&self, b: usize) -> Filter {
        Filter {
            top_k: self.top_k.map_or(0, |x| x[b]),
            top_p: self.top_p.map_or(1.0, |x| x[b]),
            min_p: self.min_p.map_or(0.0, |x| x[b]),
        }
    }

    /// Whether the batch holds a half-precision tensor (target or draft rows).
    #[must_use]
    pub fn has_half(&self) -> bool {
        self.target.rows().as_half().is_some() || self.draft.is_some_and(|d| d.as_half().is_some())
    }

    /// Whether request `b` of a validated batch is verified on its stored binary32 rows as
    /// they are (no softmax, no filter, no widening): then any [`RowOps`] may reduce them.
    #[must_use]
    pub fn is_plain(&self, b: usize) -> bool {
        if self.has_half() {
            return false;
        }
        match self.temperature_of(b) {
            Some(t) if t > 0.0 => false,
            // T = 0: greedy on the logits, filters change no argmax.
            Some(_) => true,
            None => !self.filter_of(b).is_active(),
        }
    }

    /// Target row `(b, j)` in any format, `None` if outside the tensor (see
    /// [`target_row_checked`](Batch::target_row_checked)).
    #[must_use]
    pub fn target_values_checked(&self, b: usize, j: usize) -> Option<Values<'a>> {
        self.target
            .rows()
            .row(self.target_row_index(b, j)?, self.vocab)
    }

    /// Draft row `(b, j)` in any format, if the drafter gave probabilities and it is inside.
    #[must_use]
    pub fn draft_values_checked(&self, b: usize, j: usize) -> Option<Values<'a>> {
        let row = self.draft_start_checked(b)?.checked_add(j)?;
        self.draft?.row(row, self.vocab)
    }

    /// Whether the drafter gave probabilities (in any format).
    #[must_use]
    pub fn has_draft_probs(&self) -> bool {
        self.draft.is_some()
    }

    /// Request `b`'s temperature, if the batch has logits.
    #[inline]
    pub(crate) fn temperature_of(&self, b: usize) -> Option<f32> {
        self.target.temperature().map(|t| t[b])
    }

    /// Binary32 target row `(b, j)`, exactly `V` values. Only for a validated batch whose
    /// request `b` is [plain](Batch::is_plain).
    #[inline]
    pub(crate) fn target_row(&self, b: usize, j: usize) -> &'a [f32] {
        let row = match self.layout {
            Layout::Ragged { .. } if self.bonus.is_some() => self.draft_start(b) + j,
            Layout::Ragged { .. } => self.draft_start(b) + b + j,
            Layout::Padded { .. } => b * (self.k_max + 1) + j,
        };
        let rows = self.target.rows();
        let start = row * rows.stride;
        // Plain requests only exist in batches without half-precision rows.
        let values = rows.as_f32().unwrap_or(&[]);
        &values[start..start + self.vocab]
    }

    /// Binary32 draft row `(b, j)`, exactly `V` values, if the drafter gave probabilities. Only
    /// for a validated batch whose request `b` is [plain](Batch::is_plain).
    #[inline]
    pub(crate) fn draft_row(&self, b: usize, j: usize) -> Option<&'a [f32]> {
        self.draft.map(|d| {
            let start = (self.draft_start(b) + j) * d.stride;
            let values = d.as_f32().unwrap_or(&[]);
            &values[start..start + self.vocab]
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

/// Target logits with a temperature per request (see [`Batch::with_target_logits`]).
#[derive(Clone, Copy, Debug)]
pub struct Logits<'a> {
    /// The logits, laid out exactly as the target probabilities would be (same rows, same
    /// stride, padded or ragged).
    pub values: &'a [f32],
    /// Per-request temperature (`B` values, finite, `≥ 0`); `0` means greedy for that request,
    /// whatever the method.
    pub temperature: &'a [f32],
}

/// bf16 / f16 target logits with a temperature per request (see
/// [`Batch::with_target_logits_half`]).
#[derive(Clone, Copy, Debug)]
pub struct HalfLogits<'a> {
    /// The logits' 16-bit patterns, laid out exactly as the target probabilities would be.
    pub values: Half<'a>,
    /// Per-request temperature (`B` values, finite, `≥ 0`); `0` means greedy for that request.
    pub temperature: &'a [f32],
}

/// The row strides of a [`Batch`]'s probability tensors (named: they cannot be swapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Strides {
    /// Row stride of the draft probabilities.
    pub draft: usize,
    /// Row stride of the target probabilities.
    pub target: usize,
}

/// The caller's output buffers for a [`Batch`] of `B` requests. Built with [`Outputs::new`]
/// (`#[non_exhaustive]`: outputs can be added without breaking callers).
#[derive(Debug)]
#[non_exhaustive]
pub struct Outputs<'a> {
    /// `accepted[b]`: how many draft tokens request `b` accepted (`B` values).
    pub accepted: &'a mut [u32],
    /// `tokens[b·(k_max+1) + j]`: the accepted draft tokens, then the one recovered or bonus
    /// token, then [`SENTINEL`] up to `k_max + 1` slots (`B · (k_max+1)` values).
    pub tokens: &'a mut [u32],
    /// vLLM's `recovered_token_ids`, filled by the same call when set
    /// ([`with_recovered`](Self::with_recovered)): one value per draft slot ([`draft_slots`]),
    /// laid out and computed exactly as [`recovered_tokens`] writes them. `None`: not wanted.
    pub recovered: Option<&'a mut [u32]>,
}

/// The `accepted` slice of [`Outputs::new`], named so it cannot be passed as the tokens.
#[derive(Debug)]
pub struct AcceptedOut<'a>(pub &'a mut [u32]);

/// The `tokens` slice of [`Outputs::new`], named so it cannot be passed as the accepted counts.
#[derive(Debug)]
pub struct TokensOut<'a>(pub &'a mut [u32]);

impl<'a> Outputs<'a> {
    /// Outputs from two named slices: the struct literal takes two `&mut [u32]` that a caller
    /// can swap without a compile error (both fields have the same type); this cannot be.
    ///
    /// ```
    /// use specula_core::verify::{AcceptedOut, Outputs, TokensOut};
    /// let (mut accepted, mut tokens) = ([0u32; 2], [0u32; 6]);
    /// let out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// assert_eq!((out.accepted.len(), out.tokens.len()), (2, 6));
    /// ```
    #[must_use]
    pub fn new(accepted: AcceptedOut<'a>, tokens: TokensOut<'a>) -> Self {
        Self {
            accepted: accepted.0,
            tokens: tokens.0,
            recovered: None,
        }
    }

    /// Also writes vLLM's `recovered_token_ids` into `recovered`, in the same verification
    /// call: for every draft slot, the token its request emits if that position is the first
    /// rejected one, whether or not verification reaches it. The layout and the bits are those
    /// of [`recovered_tokens`]: one value per draft slot ([`draft_slots`]), padded
    /// `recovered[b·k_max + j]` with [`SENTINEL`] for `j ≥ k_b`, ragged `recovered[cu[b−1] + j]`
    /// (a request with `k = 0` has no slot). The same random draws as the emitted tokens, so
    /// at a request's first rejected position it equals the emitted token.
    ///
    /// Validation checks its length ([`VerifyError::Length`] with [`Param::Recovered`], after
    /// the other outputs) and that the backend fills it ([`Support::recovered`], else
    /// [`VerifyError::Unsupported`] with [`Feature::Recovered`]); on error nothing is written.
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, AcceptedOut, Batch, Check, Dims, Drafts, Method, Outputs, Streams, TokensOut, SENTINEL};
    /// use specula_core::Counters;
    /// // V = 3, k_max = 2: request 0 drafts [1, 2], request 1 drafts [0].
    /// let target = [
    ///     0.0, 1.0, 0.0, /* */ 1.0, 0.0, 0.0, /* bonus */ 0.0, 0.0, 1.0, // request 0
    ///     0.0, 0.0, 1.0, /* */ 0.0, 1.0, 0.0, /* unused */ 0.0, 0.0, 0.0, // request 1
    /// ];
    /// let batch = Batch::dense(
    ///     Dims { vocab: 3, k_max: 2 },
    ///     Drafts { k: &[2, 1], ids: &[1, 2, 0, 0] },
    ///     &target,
    ///     Streams { seed: &[1, 2], offset: &[0, 0] },
    /// );
    /// let (mut accepted, mut tokens, mut recovered) = ([0u32; 2], [0u32; 6], [0u32; 4]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens))
    ///     .with_recovered(&mut recovered);
    /// verify_batch(Method::Greedy, Check::STRICT, &batch, &mut out, &mut Counters::<4>::ZERO)?;
    /// assert_eq!(accepted, [1, 0]);
    /// assert_eq!(tokens, [1, 0, SENTINEL, /* */ 2, SENTINEL, SENTINEL]);
    /// // Greedy: each slot's argmax; request 1 has one draft slot, the other is SENTINEL.
    /// assert_eq!(recovered, [1, 0, /* */ 2, SENTINEL]);
    /// # Ok::<(), specula_core::verify::VerifyError>(())
    /// ```
    #[must_use]
    pub fn with_recovered(mut self, recovered: &'a mut [u32]) -> Self {
        self.recovered = Some(recovered);
        self
    }
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
}

/// The reference verifier: validates everything ([`validate_with`] and [`Support::ALL`]), then
/// verifies each request in order with the plain-loop [`ScalarOps`] and records it in
/// `counters` — except a request with `k = 0`, which is not counted (as vLLM counts no draft
/// for it) — and, if [`Outputs::recovered`] is set, fills it as [`recovered_tokens`] does.
/// Nothing is counted (and `out` is untouched) when it returns an error.
pub fn verify_batch<const K: usize>(
    method: Method,
    check: Check,
    batch: &Batch<'_>,
    out: &mut Outputs<'_>,
    counters: &mut Counters<K>,
) -> Result<(), VerifyError> {
    validate_with::<K>(Support::ALL, method, check, batch, out)?;
    let width = batch.k_max + 1;
    for (b, (acc, row)) in out
        .accepted
        .iter_mut()
        .zip(out.tokens.chunks_exact_mut(width))
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
    if let Some(recovered) = out.recovered.as_deref_mut() {
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

/// Converts emitted tokens (`B · (k_max+1)` values, [`SENTINEL`]-padded, as in
/// [`Outputs::tokens`]) into vLLM's `output_token_ids` layout: `[B, k_max+1]` `i32`, `-1`-padded.
///
/// Errors: [`VerifyError::Length`] ([`Param::Tokens`]) if `vllm` is not as long as `tokens`;
/// [`VerifyError::VllmTokenRange`] if a token does not fit an `i32` (nothing is written then).
///
/// ```
/// use specula_core::verify::{to_vllm_tokens, SENTINEL};
/// let mut out = [0i32; 4];
/// to_vllm_tokens(&[5, 9, 2, SENTINEL], &mut out).unwrap();
/// assert_eq!(out, [5, 9, 2, -1]);
/// ```
pub fn to_vllm_tokens(tokens: &[u32], vllm: &mut [i32]) -> Result<(), VerifyError> {
    if vllm.len() != tokens.len() {
        return Err(VerifyError::Length {
            param: Param::Tokens,
            len: vllm.len(),
            expected: tokens.len(),
        });
    }
    if let Some(index) = tokens
        .iter()
        .position(|&t| t != SENTINEL && i32::try_from(t).is_err())
    {
        return Err(VerifyError::VllmTokenRange {
            index,
            token: tokens[index],
        });
    }
    for (o, &t) in vllm.iter_mut().zip(tokens) {
        // Checked above: every non-sentinel token fits.
        *o = if t == SENTINEL { -1 } else { t as i32 };
    }
    Ok(())
}

/// Converts recovered tokens (as [`Outputs::with_recovered`] and [`recovered_tokens`] lay them
/// out for `batch`) into vLLM's `recovered_token_ids`: flat `[num_tokens]` `i32`, request after
/// request, `k_b` values each. The ragged layout already is that order (a plain conversion);
/// the padded one is packed, its [`SENTINEL`] slots (`j ≥ k_b`) dropped.
///
/// Errors (nothing is written then): [`VerifyError::Length`] with [`Param::Recovered`] if
/// `recovered` does not hold one value per draft slot ([`draft_slots`]), or if `vllm` is not
/// `num_tokens = Σ k_b` long (`expected` tells which); [`VerifyError::DraftLength`] if a padded
/// `k_b` exceeds `k_max`; [`VerifyError::VllmTokenRange`] if a token does not fit an `i32`
/// (`index` into `recovered`).
///
/// ```
/// use specula_core::verify::{to_vllm_recovered, Batch, Dims, Drafts, Streams, SENTINEL};
/// let target = [0.0f32; 2 * 3 * 4]; // V = 4, k_max = 2, two requests
/// let batch = Batch::dense(
///     Dims { vocab: 4, k_max: 2 },
///     Drafts { k: &[2, 1], ids: &[1, 2, 3, 0] },
///     &target,
///     Streams { seed: &[1, 2], offset: &[0, 0] },
/// );
/// let mut vllm = [0i32; 3];
/// to_vllm_recovered(&batch, &[3, 0, 2, SENTINEL], &mut vllm).unwrap();
/// assert_eq!(vllm, [3, 0, 2]);
/// ```
pub fn to_vllm_recovered(
    batch: &Batch<'_>,
    recovered: &[u32],
    vllm: &mut [i32],
) -> Result<(), VerifyError> {
    let slots = draft_slots(batch);
    if recovered.len() != slots {
        return Err(VerifyError::Length {
            param: Param::Recovered,
            len: recovered.len(),
            expected: slots,
        });
    }
    let ragged = batch.is_ragged();
    let mut tokens = slots;
    if !ragged {
        tokens = 0;
        for (request, &k) in batch.k().iter().enumerate() {
            if k as usize > batch.k_max {
                return Err(VerifyError::DraftLength {
                    request,
                    k,
                    k_max: batch.k_max,
                });
            }
            tokens += k as usize;
        }
    }
    if vllm.len() != tokens {
        return Err(VerifyError::Length {
            param: Param::Recovered,
            len: vllm.len(),
            expected: tokens,
        });
    }
    // Request b's values start at `b·k_max` (padded; `k_b` of them, in bounds as `k_b ≤ k_max`
    // and `recovered` holds `B·k_max`); the ragged ones are all of `recovered`, in order.
    let segments = if ragged { 1 } else { batch.k().len() };
    let segment = |b: usize| {
        if ragged {
            (0, recovered)
        } else {
            let start = b * batch.k_max;
            (start, &recovered[start..start + batch.k()[b] as usize])
        }
    };
    // Range check first, so nothing is written on error.
    for b in 0..segments {
        let (start, values) = segment(b);
        if let Some(j) = values.iter().position(|&t| i32::try_from(t).is_err()) {
            return Err(VerifyError::VllmTokenRange {
                index: start + j,
                token: values[j],
            });
        }
    }
    let mut out = vllm.iter_mut();
    for b in 0..segments {
        for (&t, o) in segment(b).1.iter().zip(&mut out) {
            // Checked above: every token fits.
            *o = t as i32;
        }
    }
    Ok(())
}
