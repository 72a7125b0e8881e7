//! [`VerifyError`]: why a batch was refused.

/// A probability tensor of a [`Batch`](super::Batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Tensor {
    /// `draft_probs`.
    Draft,
    /// `target_probs`.
    Target,
}

/// An input a backend may not support (see [`Support`](super::Support)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Feature {
    /// The ragged layout (`cu_num_draft_tokens`).
    Ragged,
    /// Caller-supplied bonus tokens.
    Bonus,
    /// Target logits with temperature.
    Logits,
    /// Per-request top-k, top-p and min-p.
    Filters,
    /// bf16 / f16 inputs.
    Half,
    /// bf16 / f16 target probabilities (half-precision target rows without a temperature).
    HalfProbs,
    /// A method per request.
    Methods,
    /// The recovered-token output of [`Outputs`](super::Outputs).
    Recovered,
}

/// A per-request slice or parameter of a [`Batch`](super::Batch) or
/// [`Outputs`](super::Outputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Param {
    /// `draft_ids`.
    DraftIds,
    /// `draft_probs`.
    DraftProbs,
    /// `target_probs`.
    TargetProbs,
    /// `seed`.
    Seed,
    /// `offset`.
    Offset,
    /// `eps` (typical acceptance).
    Eps,
    /// `delta` (typical acceptance).
    Delta,
    /// `cu_num_draft_tokens` (ragged layout).
    CuNumDraftTokens,
    /// `bonus` (caller-supplied bonus tokens).
    Bonus,
    /// `target_logits`.
    TargetLogits,
    /// `temperature`.
    Temperature,
    /// `top_k`.
    TopK,
    /// `top_p` (in `(0, 1]`).
    TopP,
    /// `min_p` (in `[0, 1]`).
    MinP,
    /// `methods` (a method per request).
    Methods,
    /// The recovered-token output: [`Outputs::recovered`](super::Outputs::recovered) or the
    /// slice of [`recovered_tokens`](super::recovered_tokens).
    Recovered,
    /// `Outputs::accepted`.
    Accepted,
    /// `Outputs::tokens`.
    Tokens,
}

/// Why a batch was refused. Nothing was verified or counted, and the outputs are untouched.
///
/// Validation reports the first problem in this order: batch-wide shape errors
/// ([`EmptyBatch`](Self::EmptyBatch) … [`Length`](Self::Length), outputs last: `accepted`,
/// `tokens`, then the recovered output, refused as [`Unsupported`](Self::Unsupported) by a
/// backend without it before its length is checked), then for each
/// request in order its draft length, its token ids by position, its typical-acceptance
/// parameters, and (strict check only) its draft rows then its target rows by position, each
/// row's values by index before its sum.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum VerifyError {
    /// The batch has no request (`k` is empty).
    EmptyBatch,
    /// `k_max` is above the counters' maximum `K` (or the RNG limit), or 0 where the backend
    /// does not support `k = 0`.
    KMaxOutOfRange {
        /// The `k_max` given.
        k_max: usize,
        /// The largest allowed.
        max: usize,
    },
    /// `vocab` is 0 or does not fit a token id below `u32::MAX`.
    VocabOutOfRange {
        /// The vocabulary size given.
        vocab: usize,
    },
    /// A row stride is below the vocabulary size.
    StrideTooSmall {
        /// Which tensor.
        tensor: Tensor,
        /// The stride given.
        stride: usize,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A slice's length does not match the layout (`expected` is `usize::MAX` when the layout
    /// size itself overflows).
    Length {
        /// Which slice.
        param: Param,
        /// Its length.
        len: usize,
        /// The length the layout needs.
        expected: usize,
    },
    /// `k[request]` is above `k_max`, or 0 where the backend does not support `k = 0`.
    DraftLength {
        /// The request (batch slot).
        request: usize,
        /// Its draft length.
        k: u32,
        /// The batch's `k_max`.
        k_max: usize,
    },
    /// A draft token id (or, at position `k`, a caller-supplied bonus token) is not below the
    /// vocabulary size.
    TokenOutOfRange {
        /// The request.
        request: usize,
        /// The draft position.
        position: usize,
        /// The id given.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A typical-acceptance parameter or a temperature is NaN, infinite or negative, or a
    /// top-p / min-p is outside its range.
    BadParam {
        /// The request.
        request: usize,
        /// [`Param::Eps`], [`Param::Delta`], [`Param::Temperature`], [`Param::TopP`] or
        /// [`Param::MinP`].
        param: Param,
    },
    /// The backend does not support this input (see [`Support`](super::Support)).
    Unsupported {
        /// What it does not support.
        feature: Feature,
    },
    /// Ragged layout: `cu_num_draft_tokens` decreases at this request.
    CumulativeDecreases {
        /// The request whose cumulative count is below its predecessor's.
        request: usize,
    },
    /// [`to_vllm_tokens`](super::to_vllm_tokens) or
    /// [`to_vllm_recovered`](super::to_vllm_recovered): a token does not fit vLLM's `i32`.
    VllmTokenRange {
        /// Its index in the tokens.
        index: usize,
        /// The token.
        token: u32,
    },
    /// (Strict check) a probability is NaN, infinite or negative.
    BadProbability {
        /// The request.
        request: usize,
        /// Which tensor.
        tensor: Tensor,
        /// The row's position `j`.
        position: usize,
        /// The vocabulary index in the row.
        index: usize,
    },
    /// (Strict check) a target logit is NaN or `+∞` (`−∞`, a masked token, is allowed).
    BadLogit {
        /// The request.
        request: usize,
        /// The row's position `j`.
        position: usize,
        /// The vocabulary index in the row.
        index: usize,
    },
    /// (Strict check) a row does not sum to 1 within the tolerance.
    RowSum {
        /// The request.
        request: usize,
        /// Which tensor.
        tensor: Tensor,
        /// The row's position `j`.
        position: usize,
        /// The row's sum (in `f64`).
        sum: f64,
    },
}

impl core::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::EmptyBatch => f.write_str("empty batch"),
            Self::KMaxOutOfRange { k_max, max } => {
                write!(f, "k_max {k_max} is outside 1..={max}")
            }
            Self::VocabOutOfRange { vocab } => write!(f, "vocabulary size {vocab} out of range"),
            Self::StrideTooSmall {
                tensor,
                stride,
                vocab,
            } => write!(
                f,
                "{tensor:?} row stride {stride} is below the vocabulary size {vocab}"
            ),
            Self::Length {
                param,
                len,
                expected,
            } => write!(f, "{param:?} has {len} values, the layout needs {expected}"),
            Self::DraftLength { request, k, k_max } => {
                write!(
                    f,
                    "request {request}: draft length {k} is outside 1..={k_max}"
                )
            }
            Self::TokenOutOfRange {
                request,
                position,
                token,
                vocab,
            } => write!(
                f,
                "request {request}, position {position}: token {token} is not below vocabulary size {vocab}"
            ),
            Self::Unsupported { feature } => {
                write!(f, "this backend does not support {feature:?} input")
            }
            Self::CumulativeDecreases { request } => write!(
                f,
                "request {request}: cu_num_draft_tokens is below the previous request's"
            ),
            Self::VllmTokenRange { index, token } => {
                write!(f, "token {token} at {index} does not fit an i32")
            }
            Self::BadParam { request, param } => match param {
                Param::TopP | Param::MinP => {
                    write!(f, "request {request}: {param:?} is outside its range")
                }
                _ => write!(
                    f,
                    "request {request}: {param:?} is not finite and non-negative"
                ),
            },
            Self::BadProbability {
                request,
                tensor,
                position,
                index,
            } => write!(
                f,
                "request {request}, {tensor:?} row {position}, index {index}: probability is not finite and non-negative"
            ),
            Self::BadLogit {
                request,
                position,
                index,
            } => write!(
                f,
                "request {request}, target row {position}, index {index}: logit is NaN or +inf"
            ),
            Self::RowSum {
                request,
                tensor,
                position,
                sum,
            } => write!(
                f,
                "request {request}, {tensor:?} row {position} sums to {sum}, not 1"
            ),
        }
    }
}

impl core::error::Error for VerifyError {}
