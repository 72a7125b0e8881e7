//! [`VerifyError`]: why a batch was refused.

use crate::error_kind::{ErrorKind, HasKind};

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
    /// Token trees ([`Verifier::verify_tree`](super::Verifier::verify_tree)).
    Trees,
    /// Tensors in device memory ([`Values::Device`](super::Values::Device) rows,
    /// [`Outputs::on_device`](super::Outputs::on_device)): only the GPU verifiers read them.
    Device,
    /// [`Check::Strict`](super::Check::Strict) over rows in device memory: the host cannot
    /// read them without a copy and a wait (use [`Check::Cheap`](super::Check::Cheap)).
    DeviceCheck,
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
    /// [`Draft::first_row`](super::Draft::first_row) (mixed drafters).
    DraftFirstRow,
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
    /// `filters` ([`Batch::with_filters`](super::Batch::with_filters)).
    Filters,
    /// A filter's `top_p` (in `(0, 1]`).
    TopP,
    /// A filter's `min_p` (in `[0, 1]`).
    MinP,
    /// `methods` (a method per request).
    Methods,
    /// The recovered-token output: `recovered` of the [`Outputs`](super::Outputs) (host or
    /// device) or the slice of [`recovered_tokens`](super::recovered_tokens).
    Recovered,
    /// The accepted counts of the [`Outputs`](super::Outputs) or tree outputs.
    Accepted,
    /// The emitted tokens of the [`Outputs`](super::Outputs) or tree outputs.
    Tokens,
    /// A tree batch's node count per request (`Tree::nodes`).
    Nodes,
    /// A tree batch's token id per node (`Tree::tokens`).
    TreeTokens,
    /// A tree's `first_child` links.
    FirstChild,
    /// A tree's `next_sibling` links.
    NextSibling,
    /// The accepted path of the tree outputs ([`TreeOutputs`](super::tree::TreeOutputs)).
    Path,
    /// The `parents` array of [`links_from_parents`](super::tree::links_from_parents).
    Parents,
}

/// Why a batch was refused. Nothing was verified or counted, and the outputs are untouched.
///
/// Validation reports the first problem in this order: batch-wide shape errors
/// ([`EmptyBatch`](Self::EmptyBatch) … [`Length`](Self::Length), outputs last: `accepted`,
/// `tokens`, then the recovered output, refused as [`Unsupported`](Self::Unsupported) by a
/// backend without it before its length is checked), then for each
/// request in order its draft length, its token ids by position, its typical-acceptance
/// parameters, and (strict check only) its draft rows then its target rows by position, each
/// row's values by index before its sum. A tree batch ([`verify::tree`](super::tree)): the
/// batch-wide shape errors, then for each request in order its node count, its links and shape
/// by node ([`LinkOutOfRange`](Self::LinkOutOfRange), [`Cycle`](Self::Cycle),
/// [`Unreachable`](Self::Unreachable), [`Depth`](Self::Depth)), its token ids, its parameters
/// and (strict check only) its draft rows then its target rows by node.
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
    /// `max_nodes` is 0 or above [`MAX_TREE_NODES`](super::tree::MAX_TREE_NODES).
    MaxNodesOutOfRange {
        /// The `max_nodes` given.
        max_nodes: usize,
        /// The largest allowed.
        max: usize,
    },
    /// `max_depth` is above the counters' maximum `K` (or above `max_nodes − 1`).
    MaxDepthOutOfRange {
        /// The `max_depth` given.
        max_depth: usize,
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
    /// A request's node count is 0 or above the batch's `max_nodes`.
    NodeCount {
        /// The request.
        request: usize,
        /// Its node count.
        nodes: u32,
        /// The batch's `max_nodes`.
        max: usize,
    },
    /// A link is neither `-1` (none) nor a node index `1 ≤ link < nodes`, or the root has a
    /// next sibling.
    LinkOutOfRange {
        /// The request.
        request: usize,
        /// The node holding the link.
        node: usize,
        /// The link's value.
        link: i32,
    },
    /// A node is reached twice from the root: the links form a cycle or share a node.
    Cycle {
        /// The request.
        request: usize,
        /// The node reached a second time.
        node: usize,
    },
    /// A node is not reached from the root.
    Unreachable {
        /// The request.
        request: usize,
        /// The lowest unreached node.
        node: usize,
    },
    /// A node lies deeper than the batch's `max_depth`.
    Depth {
        /// The request.
        request: usize,
        /// The node.
        node: usize,
        /// The batch's `max_depth`.
        max: usize,
    },
    /// A draft token id (or, at position `k`, a caller-supplied bonus token) is not below the
    /// vocabulary size.
    TokenOutOfRange {
        /// The request.
        request: usize,
        /// The draft position (in a tree: the node).
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
        /// [`Param::Eps`], [`Param::Delta`], [`Param::Temperature`], or the part of a
        /// [`Filter`](super::Filter) out of its range ([`Filter::out_of_range`](super::Filter::out_of_range)).
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
        /// The row's position `j` (in a tree: its node).
        position: usize,
        /// The vocabulary index in the row.
        index: usize,
    },
    /// (Strict check) a target logit is NaN or `+∞` (`−∞`, a masked token, is allowed).
    BadLogit {
        /// The request.
        request: usize,
        /// The row's position `j` (in a tree: its node).
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
        /// The row's position `j` (in a tree: its node).
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
            Self::MaxNodesOutOfRange { max_nodes, max } => {
                write!(f, "max_nodes {max_nodes} is outside 1..={max}")
            }
            Self::MaxDepthOutOfRange { max_depth, max } => {
                write!(f, "max_depth {max_depth} is above {max}")
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
            Self::NodeCount {
                request,
                nodes,
                max,
            } => write!(f, "request {request}: {nodes} nodes, outside 1..={max}"),
            Self::LinkOutOfRange {
                request,
                node,
                link,
            } => write!(
                f,
                "request {request}, node {node}: link {link} out of range"
            ),
            Self::Cycle { request, node } => write!(
                f,
                "request {request}: node {node} is reached twice (cycle or shared node)"
            ),
            Self::Unreachable { request, node } => {
                write!(
                    f,
                    "request {request}: node {node} is not reached from the root"
                )
            }
            Self::Depth { request, node, max } => {
                write!(f, "request {request}: node {node} is deeper than {max}")
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
                Param::Eps | Param::Delta | Param::Temperature => write!(
                    f,
                    "request {request}: {param:?} is not finite and non-negative"
                ),
                // A filter's part: `Filter::out_of_range` says which.
                _ => write!(f, "request {request}: {param:?} is outside its range"),
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

impl HasKind for VerifyError {
    /// Every refusal of a batch, chain or tree, is [`ErrorKind::InvalidInput`]: the caller's
    /// batch is wrong (or asks for what this backend does not verify), not the backend.
    fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}
