//! [`Batch`]: one verification step's inputs, borrowed, typed so that what excludes each other
//! cannot be written together (the [`Layout`], the [`Target`] rows, the optional draft [`Rows`]).

use super::{DEFAULT_DELTA, DEFAULT_EPS, Device, Filter, Format, Half, Method, Values};
use crate::verify::fmath::exp_p;

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

/// Where each request's drafts sit in a [`Batch`]: the padded layout (`k` per request) or
/// vLLM's ragged one (`cu_num_draft_tokens`). One of the two, never both.
#[derive(Clone, Copy, Debug)]
pub enum Layout<'a> {
    /// `k[b]`: request `b`'s draft length (`≤ k_max`; `≥ 1` unless [`Support::empty_drafts`](super::Support::empty_drafts));
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

    /// Rows in device memory, of stride `stride`, in the values' format (read in place by the
    /// GPU verifier of their driver and device; host verifiers refuse them).
    #[must_use]
    pub const fn device(values: Device<'a>, stride: usize) -> Self {
        Self {
            values: Values::Device(values),
            stride,
        }
    }

    /// The binary32 host values, `None` for half-precision or device rows.
    #[must_use]
    pub const fn as_f32(&self) -> Option<&'a [f32]> {
        match self.values {
            Values::F32(x) => Some(x),
            Values::Half(_) | Values::Device(_) => None,
        }
    }

    /// The half-precision host values, `None` for binary32 or device rows.
    #[must_use]
    pub const fn as_half(&self) -> Option<Half<'a>> {
        match self.values {
            Values::Half(h) => Some(h),
            Values::F32(_) | Values::Device(_) => None,
        }
    }

    /// The device values, `None` for host rows.
    #[must_use]
    pub const fn as_device(&self) -> Option<Device<'a>> {
        match self.values {
            Values::Device(d) => Some(d),
            Values::F32(_) | Values::Half(_) => None,
        }
    }

    /// The element format (host or device).
    #[must_use]
    pub const fn format(&self) -> Format {
        self.values.format()
    }

    /// The same rows with row stride `stride`.
    pub(crate) const fn with_stride(self, stride: usize) -> Self {
        Self { stride, ..self }
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
        self.with_rows(self.rows().with_stride(stride))
    }

    /// The same kind of target (probabilities, or logits with the same temperatures) over
    /// `rows`: e.g. the same rows in another format or memory.
    #[must_use]
    pub const fn with_rows(self, rows: Rows<'a>) -> Self {
        match self {
            Self::Probs(_) => Self::Probs(rows),
            Self::Logits { temperature, .. } => Self::Logits { rows, temperature },
        }
    }
}

/// A request without draft rows in a batch of mixed drafters ([`Draft::first_row`]).
pub const NO_DRAFT_ROWS: u32 = u32::MAX;

/// The drafter's probability rows of a [`Batch`], and which requests they cover.
#[derive(Clone, Copy, Debug)]
pub struct Draft<'a> {
    /// The rows, in any format and stride.
    pub rows: Rows<'a>,
    /// Mixed drafters (a request from an n-gram drafter next to one from a draft model):
    /// `first_row[b]` is the row of request `b`'s first draft in [`rows`](Self::rows) (its
    /// `k_b` rows follow it), or [`NO_DRAFT_ROWS`] for a request whose drafter gave no
    /// probabilities, which is verified as a one-hot drafter's. `B` values. `None`: every
    /// request has rows, where the layout puts them.
    pub first_row: Option<&'a [u32]>,
}

impl Draft<'_> {
    /// The same rows with row stride `stride` (and the same requests).
    pub(crate) const fn with_stride(self, stride: usize) -> Self {
        Self {
            rows: self.rows.with_stride(stride),
            ..self
        }
    }
}

/// Rows for every request, where the layout puts them.
impl<'a> From<Rows<'a>> for Draft<'a> {
    fn from(rows: Rows<'a>) -> Self {
        Self {
            rows,
            first_row: None,
        }
    }
}

/// The builders and per-request accessors that chains ([`Batch`]) and trees
/// ([`TreeBatch`](super::tree::TreeBatch)) share, written once over the fields both have
/// (`vocab`, `target`, `draft`, `eps`, `delta`, `filters`) and expanded into each `impl` block. `draft` is
/// an `Option` of a type with a `with_stride` method ([`Draft`], [`Rows`]); `$d => $rows`
/// projects one onto its [`Rows`]; the type has its own `with_draft(Rows)`. The names in it
/// resolve where it is expanded: both files import them.
macro_rules! rows_builders {
    ($d:ident => $rows:expr) => {
        /// The same batch with these target rows (probabilities or logits, any format and
        /// stride; what a verifier reads is its [`Support`](crate::verify::Support)).
        #[must_use]
        pub const fn with_target(self, target: Target<'a>) -> Self {
            Self { target, ..self }
        }

        /// The same batch with binary32 draft probabilities
        /// ([`with_draft`](Self::with_draft)), at the stride of the draft rows they replace, or
        /// packed back to back (stride `V`) if there were none
        /// ([`with_strides`](Self::with_strides) afterwards, or
        /// [`with_draft`](Self::with_draft), for another stride).
        #[must_use]
        pub const fn with_draft_probs(self, draft_probs: &'a [f32]) -> Self {
            let stride = self.draft_stride();
            self.with_draft(Rows::f32(draft_probs, stride))
        }

        /// [`with_draft_probs`](Self::with_draft_probs) for bf16 / f16 draft probabilities
        /// (the same stride rule), widened exactly to binary32 on read.
        #[must_use]
        pub const fn with_draft_probs_half(self, draft_probs: Half<'a>) -> Self {
            let stride = self.draft_stride();
            self.with_draft(Rows::half(draft_probs, stride))
        }

        /// The same batch verified against binary32 target **logits** instead of
        /// probabilities ([`Logits`](crate::verify::Logits)): rows laid out as the target
        /// probabilities (at their stride), one temperature per request. `T > 0`: each row is
        /// the softmax of `logits / T` defined in `core/DETERMINISM.md` (bit-exact,
        /// order-independent), then the method's rules apply to it; `T = 0`: the request is
        /// verified greedily on the logits (argmax), whatever the method.
        #[must_use]
        pub const fn with_target_logits(self, logits: Logits<'a>) -> Self {
            let rows = Rows::f32(logits.values, self.target.rows().stride);
            self.with_target(Target::Logits {
                rows,
                temperature: logits.temperature,
            })
        }

        /// [`with_target_logits`](Self::with_target_logits) for bf16 / f16 logits
        /// ([`HalfLogits`](crate::verify::HalfLogits): the engine's own tensor, reinterpreted
        /// as 16-bit patterns): each value is widened exactly to binary32, then everything is
        /// as with binary32 logits.
        #[must_use]
        pub const fn with_target_logits_half(self, logits: HalfLogits<'a>) -> Self {
            let rows = Rows::half(logits.values, self.target.rows().stride);
            self.with_target(Target::Logits {
                rows,
                temperature: logits.temperature,
            })
        }

        /// The same batch with per-request typical-acceptance `ε` and `δ` (`B` values each).
        #[must_use]
        pub const fn with_typical(self, eps: &'a [f32], delta: &'a [f32]) -> Self {
            Self {
                eps: Some(eps),
                delta: Some(delta),
                ..self
            }
        }

        /// The same batch with explicit row strides (`≥ V`) for the target rows and, if the
        /// batch has them, the draft rows (call it after
        /// [`with_draft_probs`](Self::with_draft_probs)).
        #[must_use]
        pub const fn with_strides(self, strides: Strides) -> Self {
            Self {
                target: self.target.with_stride(strides.target),
                draft: match self.draft {
                    Some(d) => Some(d.with_stride(strides.draft)),
                    None => None,
                },
                ..self
            }
        }

        /// The draft rows, if the drafter gave probabilities.
        const fn draft_rows(&self) -> Option<Rows<'a>> {
            match self.draft {
                Some($d) => Some($rows),
                None => None,
            }
        }

        /// The stride of the draft rows, `V` where there are none.
        const fn draft_stride(&self) -> usize {
            match self.draft_rows() {
                Some(d) => d.stride,
                None => self.vocab,
            }
        }

        /// Whether the batch has target logits (binary32 or half).
        #[must_use]
        pub fn has_logits(&self) -> bool {
            matches!(self.target, Target::Logits { .. })
        }

        /// Whether the batch holds a half-precision tensor (target or draft rows, in host or
        /// device memory).
        #[must_use]
        pub fn has_half(&self) -> bool {
            let half = |r: Rows<'_>| r.format() != Format::F32;
            half(self.target.rows()) || self.draft_rows().is_some_and(half)
        }

        /// Whether the batch holds a tensor in device memory (target or draft rows).
        #[must_use]
        pub fn has_device(&self) -> bool {
            self.target.rows().values.is_device()
                || self.draft_rows().is_some_and(|d| d.values.is_device())
        }

        /// Request `b`'s temperature, if the batch has logits.
        #[inline]
        pub(crate) fn temperature_of(&self, b: usize) -> Option<f32> {
            self.target.temperature().map(|t| t[b])
        }

        /// Request `b`'s sampling filter ([`Filter::NONE`] without filters). Panics if the
        /// filters are fewer than `b + 1`.
        #[must_use]
        pub fn filter_of(&self, b: usize) -> Filter {
            self.filters.map_or(Filter::NONE, |f| f[b])
        }

        /// Request `b`'s typical-acceptance `ε`: its own, or [`DEFAULT_EPS`].
        #[inline]
        pub(crate) fn eps_of(&self, b: usize) -> f32 {
            self.eps.map_or(DEFAULT_EPS, |e| e[b])
        }

        /// Request `b`'s typical-acceptance `δ`: its own, or [`DEFAULT_DELTA`].
        #[inline]
        pub(crate) fn delta_of(&self, b: usize) -> f32 {
            self.delta.map_or(DEFAULT_DELTA, |d| d[b])
        }

        /// How request `b` is verified by `method` with `filter` (`RequestPlan::resolve`).
        fn resolve_plan(&self, b: usize, method: Method, filter: Filter) -> RequestPlan {
            RequestPlan::resolve(
                method,
                self.temperature_of(b),
                filter,
                (self.eps_of(b), self.delta_of(b)),
                !self.has_half() && !self.has_device(),
            )
        }
    };
}
pub(super) use rows_builders;

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
    /// Draft slots per request (`0 ≤ k_max ≤ K`; `0` only where [`Support::empty_drafts`](super::Support::empty_drafts)).
    /// In the ragged layout, the largest draft length (the output width is `k_max + 1`).
    pub k_max: usize,
    /// Where each request's drafts are.
    pub layout: Layout<'a>,
    /// Padded layout: `draft_ids[b·k_max + j]` for `j < k[b]`, `B · k_max` values. Ragged: the
    /// `num_tokens` ids back to back. Every id read is `< V`.
    pub draft_ids: &'a [u32],
    /// Draft probabilities ([`Draft`]): padded, row `(b, j)` is row `b·k_max + j`
    /// (`B · k_max` rows); ragged, row `cu[b−1] + j` (`num_tokens` rows); with mixed drafters,
    /// wherever [`Draft::first_row`] says. `None`: a drafter without probabilities (one-hot).
    pub draft: Option<Draft<'a>>,
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
    /// Per-request sampling filter (`B` values; [`Filter::NONE`] turns a request's off).
    /// `None`: no filter.
    pub filters: Option<&'a [Filter]>,
    /// Per-request method (`B` values), overriding the method of the call. `None`: the call's.
    pub methods: Option<&'a [Method]>,
}

impl<'a> Batch<'a> {
    rows_builders!(d => d.rows);

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
    /// assert_eq!((b.requests(), b.draft.map(|d| d.rows.stride), b.target.rows().stride), (1, Some(2), 2));
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
            filters: None,
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
        let padded = Drafts {
            k: &[],
            ids: drafts.ids,
        };
        Self {
            layout: Layout::Ragged {
                cu_num_draft_tokens: cu,
            },
            ..Self::dense(Dims { vocab, k_max }, padded, target_probs, streams)
        }
    }

    /// The same batch with draft probabilities in any format and stride, for every request.
    #[must_use]
    pub const fn with_draft(self, draft: Rows<'a>) -> Self {
        Self {
            draft: Some(Draft {
                rows: draft,
                first_row: None,
            }),
            ..self
        }
    }

    /// The same batch with mixed drafters: draft probabilities for the requests whose
    /// `first_row[b]` is a row of `rows` (their `k_b` rows from there on), none for those whose
    /// `first_row[b]` is [`NO_DRAFT_ROWS`] (verified as a one-hot drafter's, e.g. an n-gram
    /// drafter's), so no synthetic one-hot rows are needed.
    ///
    /// ```
    /// use specula_core::verify::{Batch, Dims, Drafts, Rows, Streams, NO_DRAFT_ROWS};
    /// let target = [0.5f32, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5];
    /// // Request 0 from an n-gram drafter, request 1 from a draft model (its one row).
    /// let draft = [0.25f32, 0.75];
    /// let b = Batch::dense(
    ///     Dims { vocab: 2, k_max: 1 },
    ///     Drafts { k: &[1, 1], ids: &[0, 1] },
    ///     &target,
    ///     Streams { seed: &[1, 2], offset: &[0, 0] },
    /// )
    /// .with_mixed_drafters(Rows::f32(&draft, 2), &[NO_DRAFT_ROWS, 0]);
    /// assert!(!b.has_draft_rows(0) && b.has_draft_rows(1));
    /// ```
    #[must_use]
    pub const fn with_mixed_drafters(self, rows: Rows<'a>, first_row: &'a [u32]) -> Self {
        Self {
            draft: Some(Draft {
                rows,
                first_row: Some(first_row),
            }),
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

    /// The same batch with a sampling filter per request (`B` values): each request's target
    /// rows keep what its [`Filter`] keeps (top-k, top-p, min-p) and are renormalised before
    /// verification (`core/DETERMINISM.md`, "Sampling filters").
    ///
    /// ```
    /// use specula_core::verify::{verify_batch, Batch, Check, Dims, Drafts, Filter, Method, Outputs, AcceptedOut, TokensOut, Streams};
    /// use specula_core::Counters;
    /// // Draft token 2 has target probability 0.3, but top-k 1 keeps only token 0.
    /// let target = [0.6, 0.1, 0.3, /* bonus row */ 0.2, 0.5, 0.3];
    /// let filters = [Filter::NONE.with_top_k(1)];
    /// let batch = Batch::dense(
    ///     Dims { vocab: 3, k_max: 1 },
    ///     Drafts { k: &[1], ids: &[2] },
    ///     &target,
    ///     Streams { seed: &[9], offset: &[0] },
    /// )
    /// .with_filters(&filters);
    /// let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
    /// let mut out = Outputs::new(AcceptedOut(&mut accepted), TokensOut(&mut tokens));
    /// let mut counters = Counters::<4>::ZERO;
    /// verify_batch(Method::Rejection, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
    /// assert_eq!((accepted, tokens), ([0], [0, u32::MAX])); // rejected; the only kept id
    /// ```
    #[must_use]
    pub const fn with_filters(self, filters: &'a [Filter]) -> Self {
        Self {
            filters: Some(filters),
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

    /// How request `b` of a validated batch is verified, resolved once from the batch and the
    /// call's method (`core/DETERMINISM.md`): logits at `T = 0` are greedy on the logits
    /// themselves, whatever the method and the filter (no filter changes the argmax). Panics
    /// if a per-request slice is shorter than `b + 1`.
    #[must_use]
    pub fn plan(&self, b: usize, call: Method) -> RequestPlan {
        self.resolve_plan(b, self.method_of(b, call), self.filter_of(b))
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
            Values::Half(_) | Values::Device(_) => None,
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
            Values::Half(_) | Values::Device(_) => None,
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

    /// Request `b`'s first draft row, `None` if it has none (or `b` is outside `first_row`).
    fn draft_first_row_checked(&self, b: usize) -> Option<usize> {
        match self.draft?.first_row {
            None => self.draft_start_checked(b),
            Some(f) => f
                .get(b)
                .copied()
                .filter(|&r| r != NO_DRAFT_ROWS)
                .map(|r| r as usize),
        }
    }

    /// Whether request `b` has draft probability rows (every request when the batch has rows
    /// and no [`Draft::first_row`]; mixed drafters: those whose first row is not
    /// [`NO_DRAFT_ROWS`]).
    #[must_use]
    pub fn has_draft_rows(&self, b: usize) -> bool {
        self.draft_first_row_checked(b).is_some()
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
        let row = self.draft_first_row_checked(b)?.checked_add(j)?;
        self.draft?.rows.row(row, self.vocab)
    }
}

/// Target logits with a temperature per request (see [`Batch::with_target_logits`]).
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

/// How one request is verified ([`Batch::plan`]): the rule, its parameters, and how its
/// target rows are read, resolved once per request (a backend reads it, not the batch, in its
/// per-row loops).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct RequestPlan {
    /// The rule: the request's own method or the call's; [`Method::Greedy`] for logits at
    /// `T = 0`.
    pub method: Method,
    /// `Some(t)` with `t > 0`: logits, read through their softmax at `t`; `Some(0.0)`: logits,
    /// greedy on them; `None`: probabilities.
    pub temperature: Option<f32>,
    /// The sampling filter ([`Filter::NONE`] for logits at `T = 0`).
    pub filter: Filter,
    /// Typical acceptance's `ε`: the request's ([`Batch::with_typical`]), else [`DEFAULT_EPS`].
    pub eps: f32,
    /// Typical acceptance's `δ`: the request's, else [`DEFAULT_DELTA`].
    pub delta: f32,
    /// Whether the request is verified on its stored binary32 host rows as they are (no
    /// softmax, no filter, no widening: probabilities without a filter, or logits at `T = 0`,
    /// in a batch without half or device tensors): then any [`RowOps`](super::RowOps) may
    /// reduce them.
    pub plain: bool,
}

impl RequestPlan {
    /// The plan of a request verified by `method`, whose target rows are logits at
    /// `temperature` (`None`: probabilities), with `filter` and typical acceptance's
    /// `(ε, δ)`, in a batch whose rows are all binary32 host rows (`host_f32`): the one rule
    /// by which chains ([`Batch::plan`]) and trees
    /// ([`TreeBatch::plan`](super::tree::TreeBatch::plan)) resolve a request.
    pub(crate) fn resolve(
        method: Method,
        temperature: Option<f32>,
        filter: Filter,
        (eps, delta): (f32, f32),
        host_f32: bool,
    ) -> Self {
        let (method, temperature, filter) = match temperature {
            Some(t) if t > 0.0 => (method, Some(t), filter),
            Some(_) => (Method::Greedy, Some(0.0), Filter::NONE),
            None => (method, None, filter),
        };
        let stored = temperature.is_none_or(|t| t == 0.0) && !filter.is_active();
        Self {
            method,
            temperature,
            filter,
            eps,
            delta,
            plain: stored && host_f32,
        }
    }

    /// Typical acceptance's threshold for a row of entropy `h`, for chains and trees alike:
    /// `min(ε, δ·exp_p(−h))` with the minimum as `core/DETERMINISM.md` writes it
    /// (`if a < b {a} else {b}`: a NaN `δ·exp_p(−h)` is the threshold, and no probability
    /// passes it).
    #[must_use]
    pub fn typical_threshold(&self, h: f32) -> f32 {
        let c = self.delta * exp_p(-h);
        if self.eps < c { self.eps } else { c }
    }
}
