//! [`TreeError`]: why a tree batch was refused.

use super::super::Tensor;
use crate::error_kind::ErrorKind;

/// A slice or parameter of a [`TreeBatch`](super::TreeBatch) or
/// [`TreeOutputs`](super::TreeOutputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum TreeParam {
    /// `nodes` (node count per request).
    Nodes,
    /// `tokens` (a token id per node).
    Tokens,
    /// `first_child`.
    FirstChild,
    /// `next_sibling`.
    NextSibling,
    /// `draft_probs`.
    DraftProbs,
    /// `target` (probabilities or logits).
    Target,
    /// `temperature`.
    Temperature,
    /// `seed`.
    Seed,
    /// `offset`.
    Offset,
    /// `eps` (typical acceptance).
    Eps,
    /// `delta` (typical acceptance).
    Delta,
    /// `TreeOutputs::accepted`.
    Accepted,
    /// `TreeOutputs::path`.
    Path,
    /// `TreeOutputs::tokens`.
    EmittedTokens,
    /// The `parents` array of [`links_from_parents`](super::links_from_parents).
    Parents,
}

/// Why a tree batch was refused. Nothing was verified or counted, and the outputs are untouched.
///
/// Validation reports the first problem in this order: batch-wide shape errors
/// ([`EmptyBatch`](Self::EmptyBatch) … [`Length`](Self::Length), outputs last), then for each
/// request in order: its node count, its links and shape (by node index), its token ids, its
/// parameters, and (strict check only) its draft rows then its target rows by node.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum TreeError {
    /// The batch has no request.
    EmptyBatch,
    /// `max_nodes` is 0 or above [`MAX_TREE_NODES`](super::MAX_TREE_NODES).
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
        param: TreeParam,
        /// Its length.
        len: usize,
        /// The length the layout needs.
        expected: usize,
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
    /// A node's token id is not below the vocabulary size.
    TokenOutOfRange {
        /// The request.
        request: usize,
        /// The node.
        node: usize,
        /// The id given.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A typical-acceptance parameter or a temperature is NaN, infinite or negative.
    BadParam {
        /// The request.
        request: usize,
        /// [`TreeParam::Eps`], [`TreeParam::Delta`] or [`TreeParam::Temperature`].
        param: TreeParam,
    },
    /// (Strict check) a probability is NaN, infinite or negative.
    BadProbability {
        /// The request.
        request: usize,
        /// Which tensor.
        tensor: Tensor,
        /// The node whose row it is.
        node: usize,
        /// The vocabulary index in the row.
        index: usize,
    },
    /// (Strict check) a target logit is NaN or `+∞`.
    BadLogit {
        /// The request.
        request: usize,
        /// The node whose row it is.
        node: usize,
        /// The vocabulary index in the row.
        index: usize,
    },
    /// (Strict check) a row does not sum to 1 within the tolerance.
    RowSum {
        /// The request.
        request: usize,
        /// Which tensor.
        tensor: Tensor,
        /// The node whose row it is.
        node: usize,
        /// The row's sum (in `f64`).
        sum: f64,
    },
}

impl TreeError {
    /// What the failure means to a runtime: always [`ErrorKind::InvalidInput`] (a tree error is
    /// the caller's input, never the device).
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}

impl core::fmt::Display for TreeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::EmptyBatch => f.write_str("empty tree batch"),
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
                node,
                token,
                vocab,
            } => write!(
                f,
                "request {request}, node {node}: token {token} is not below vocabulary size {vocab}"
            ),
            Self::BadParam { request, param } => write!(
                f,
                "request {request}: {param:?} is not finite and non-negative"
            ),
            Self::BadProbability {
                request,
                tensor,
                node,
                index,
            } => write!(
                f,
                "request {request}, {tensor:?} row of node {node}, index {index}: probability is not finite and non-negative"
            ),
            Self::BadLogit {
                request,
                node,
                index,
            } => write!(
                f,
                "request {request}, target row of node {node}, index {index}: logit is NaN or +inf"
            ),
            Self::RowSum {
                request,
                tensor,
                node,
                sum,
            } => write!(
                f,
                "request {request}, {tensor:?} row of node {node} sums to {sum}, not 1"
            ),
        }
    }
}

impl core::error::Error for TreeError {}
