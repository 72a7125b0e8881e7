//! [`TreeBatch`]: one step of token trees (SGLang's layout), and [`TreeOutputs`].

use super::*;
use crate::verify::batch::rows_builders;
use crate::verify::validate::expect_len;
use crate::verify::{AcceptedOut, DeviceOut, Filter, Half, HalfLogits, RequestPlan, TokensOut};

/// The sizes of a [`TreeBatch`] (named fields: they cannot be swapped silently).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TreeDims {
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Node slots per request `N` (root included, `1 ≤ N ≤ `[`MAX_TREE_NODES`]).
    pub max_nodes: usize,
    /// The deepest a node may lie (the root has depth 0), `≤ K` (the counters' positions): the
    /// outputs have `max_depth + 1` slots per request.
    pub max_depth: usize,
}

/// The trees of a [`TreeBatch`], in SGLang's form. Request `b`'s node `i` is slot `b·N + i`.
#[derive(Clone, Copy, Debug)]
pub struct Tree<'a> {
    /// `nodes[b]`: request `b`'s node count `n_b` (`1 ≤ n_b ≤ N`, root included); its length is
    /// the batch size `B`.
    pub nodes: &'a [u32],
    /// `tokens[b·N + i]`: node `i`'s token (`< V`); the root's (node 0, the last verified token)
    /// is not read. `B · N` values.
    pub tokens: &'a [u32],
    /// `first_child[b·N + i]`: node `i`'s first child (`1 ≤ c < n_b`) or [`NO_NODE`]
    /// (SGLang's `retrive_next_token`). `B · N` values; slots `i ≥ n_b` are ignored.
    pub first_child: &'a [i32],
    /// `next_sibling[b·N + i]`: node `i`'s next sibling or [`NO_NODE`] (the root has none;
    /// SGLang's `retrive_next_sibling`). Siblings are tried in this order.
    pub next_sibling: &'a [i32],
}

/// A borrowed view of one tree-verification step of `B` requests (layout:
/// `core/DETERMINISM.md`, "Token trees"). Build it with [`TreeBatch::new`] and the `with_*`
/// methods. The rows are described as the chain's [`Batch`](crate::verify::Batch) describes
/// them: a [`Target`] (probabilities, or logits with a temperature per request) and optional
/// draft [`Rows`], each in one element format ([`Values`]) with one stride.
///
/// What a verifier reads is its [`Support`](crate::verify::Support): every tree verifier reads
/// binary32 rows; host verifiers (the reference, the CPU backend) refuse rows in device memory
/// ([`Feature::Device`](crate::verify::Feature::Device)), and the GPU verifiers read device
/// rows in place (and write [`TreeOutputs::on_device`] in place). bf16 / f16 rows (target
/// logits or probabilities, draft rows;
/// [`Support::tree_half`](crate::verify::Support::tree_half)) are read as their exact binary32
/// widening, the same bits as the tree of the widened rows: the reference reads them in place
/// as a chain's (no allocation), the CPU backend widens the host rows its walk reads into
/// scratch ([`NodeRows`]) for its vectorised reductions, the GPU verifiers read host or device
/// rows as the chain's logits entries do.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct TreeBatch<'a> {
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Node slots per request `N`.
    pub max_nodes: usize,
    /// The deepest node allowed; outputs have `max_depth + 1` slots per request.
    pub max_depth: usize,
    /// The trees.
    pub tree: Tree<'a>,
    /// Draft probabilities: node `i ≥ 1`'s row is row `b·N + i`, the distribution node `i`'s
    /// token was drawn from (given its parent's path). `None`: the drafter gave no
    /// probabilities (the target-only rule).
    pub draft: Option<Rows<'a>>,
    /// Target rows: node `i`'s row (the target's next-token distribution after the path to node
    /// `i`) is row `b·N + i`, `B · N` rows; probabilities, or logits with a temperature per
    /// request.
    pub target: Target<'a>,
    /// Per-request random seed.
    pub seed: &'a [u64],
    /// Per-request random offset (advance it every step).
    pub offset: &'a [u64],
    /// Typical acceptance `ε` per request; `None`: [`DEFAULT_EPS`].
    pub eps: Option<&'a [f32]>,
    /// Typical acceptance `δ` per request; `None`: [`DEFAULT_DELTA`].
    pub delta: Option<&'a [f32]>,
    /// Per-request sampling filter (`B` values; [`Filter::NONE`] turns a request's off): every
    /// node's target row filtered as a chain position's. `None`: no filter.
    pub filters: Option<&'a [Filter]>,
}

impl<'a> TreeBatch<'a> {
    rows_builders!(d => d);

    /// A batch of trees with binary32 target probabilities, packed rows (stride `V`), no draft
    /// probabilities.
    #[must_use]
    pub const fn new(
        dims: TreeDims,
        tree: Tree<'a>,
        target: &'a [f32],
        streams: Streams<'a>,
    ) -> Self {
        Self {
            vocab: dims.vocab,
            max_nodes: dims.max_nodes,
            max_depth: dims.max_depth,
            tree,
            draft: None,
            target: Target::Probs(Rows::f32(target, dims.vocab)),
            seed: streams.seed,
            offset: streams.offset,
            eps: None,
            delta: None,
            filters: None,
        }
    }

    /// The same batch with a sampling filter per request (`B` values): each node's target row
    /// keeps what its request's [`Filter`] keeps (top-k, top-p, min-p) and is renormalised, as
    /// a chain position's ([`Batch::with_filters`](crate::verify::Batch::with_filters); a
    /// chain-shaped tree gives the chain's bits). Verifiers with
    /// [`Support::tree_filters`](crate::verify::Support::tree_filters) only.
    #[must_use]
    pub const fn with_filters(self, filters: &'a [Filter]) -> Self {
        Self {
            filters: Some(filters),
            ..self
        }
    }

    /// The same batch with the drafter's probabilities in any format and stride (one row per
    /// node, see [`draft`](Self::draft)).
    #[must_use]
    pub const fn with_draft(self, draft: Rows<'a>) -> Self {
        Self {
            draft: Some(draft),
            ..self
        }
    }

    /// The batch size `B`.
    #[must_use]
    pub fn requests(&self) -> usize {
        self.tree.nodes.len()
    }

    /// Request `b`'s node count. Panics if `b ≥ B`.
    #[must_use]
    pub fn node_count(&self, b: usize) -> usize {
        self.tree.nodes[b] as usize
    }

    /// How request `b` of a validated batch is verified by `method`, resolved as a chain's
    /// request is ([`Batch::plan`](crate::verify::Batch::plan)): logits at `T = 0` are greedy
    /// on the logits (and unfiltered). Panics if a per-request slice is shorter than `b + 1`.
    #[must_use]
    pub fn plan(&self, b: usize, method: Method) -> RequestPlan {
        self.resolve_plan(b, method, self.filter_of(b))
    }

    /// Node `i`'s token. Only for a validated batch.
    #[inline]
    pub(super) fn token(&self, b: usize, i: usize) -> u32 {
        self.tree.tokens[b * self.max_nodes + i]
    }

    #[inline]
    pub(super) fn link(links: &[i32], slot: usize) -> Option<usize> {
        usize::try_from(links[slot]).ok()
    }

    /// Node `i`'s first child. Only for a validated batch.
    #[inline]
    pub(super) fn first_child(&self, b: usize, i: usize) -> Option<usize> {
        Self::link(self.tree.first_child, b * self.max_nodes + i)
    }

    /// Node `i`'s next sibling. Only for a validated batch.
    #[inline]
    pub(super) fn next_sibling(&self, b: usize, i: usize) -> Option<usize> {
        Self::link(self.tree.next_sibling, b * self.max_nodes + i)
    }

    /// Request `b`'s node `i`'s target row (slot `b·N + i`), `V` values in the batch's format
    /// and memory, `None` if outside the tensor (or `i ≥ N`).
    #[must_use]
    pub fn target_values_checked(&self, b: usize, i: usize) -> Option<Values<'a>> {
        self.target.rows().row(self.slot(b, i)?, self.vocab)
    }

    /// Request `b`'s node `i`'s draft row in the batch's format and memory, if the drafter
    /// gave probabilities and it is inside the tensor (and `i < N`).
    #[must_use]
    pub fn draft_values_checked(&self, b: usize, i: usize) -> Option<Values<'a>> {
        self.draft?.row(self.slot(b, i)?, self.vocab)
    }

    /// Slot `b·N + i`, `None` if `i ≥ N` or it overflows.
    fn slot(&self, b: usize, i: usize) -> Option<usize> {
        if i >= self.max_nodes {
            return None;
        }
        b.checked_mul(self.max_nodes)?.checked_add(i)
    }
}

/// The caller's output buffers for a [`TreeBatch`]: `W = max_depth + 1` slots per request, in
/// host slices ([`TreeOutputs::new`]) or device memory ([`TreeOutputs::on_device`]), never
/// both. Its variants are built by those constructors only (`#[non_exhaustive]`: outputs can
/// be added without breaking callers); a verifier matches them.
#[derive(Debug)]
pub enum TreeOutputs<'a> {
    /// Host slices ([`TreeOutputs::new`]): the verifier writes them before it returns.
    #[non_exhaustive]
    Host {
        /// `accepted[b]`: the accepted path's length (draft nodes, root excluded), `B` values.
        accepted: &'a mut [u32],
        /// `path[b·W + j]`, `j ≤ accepted[b]`: the node indices from the root (`path[b·W] = 0`)
        /// to the stopping node, then [`SENTINEL`]. SGLang's `accept_index`, request-local.
        path: &'a mut [u32],
        /// `tokens[b·W + j]`: the accepted nodes' tokens, then the one token sampled at the
        /// stopping node, then [`SENTINEL`] (the chain path's `tokens`,
        /// [`Outputs::Host`](crate::verify::Outputs::Host)).
        tokens: &'a mut [u32],
    },
    /// Device memory ([`TreeOutputs::on_device`]), written in place by the launch (no copy
    /// down, no wait). Only the GPU verifiers take them
    /// ([`Support::device`](crate::verify::Support::device)).
    #[non_exhaustive]
    Device {
        /// The views the launch writes, in the host outputs' layout.
        outputs: DeviceTreeOutputs<'a>,
    },
}

/// The `path` slice of [`TreeOutputs::new`], named so it cannot be passed as the tokens (both
/// have `B · (max_depth + 1)` values: a swap would pass every length check).
#[derive(Debug)]
pub struct PathOut<'a>(pub &'a mut [u32]);

impl<'a> TreeOutputs<'a> {
    /// Outputs in three named host slices, which cannot be swapped without a compile error.
    ///
    /// ```
    /// use specula_core::verify::tree::{PathOut, TreeOutputs};
    /// use specula_core::verify::{AcceptedOut, TokensOut};
    /// let (mut accepted, mut path, mut tokens) = ([0u32; 2], [0u32; 6], [0u32; 6]);
    /// let out = TreeOutputs::new(
    ///     AcceptedOut(&mut accepted),
    ///     PathOut(&mut path),
    ///     TokensOut(&mut tokens),
    /// );
    /// let TreeOutputs::Host { accepted, path, tokens, .. } = out else { unreachable!() };
    /// assert_eq!((accepted.len(), path.len(), tokens.len()), (2, 6, 6));
    /// ```
    #[must_use]
    pub fn new(accepted: AcceptedOut<'a>, path: PathOut<'a>, tokens: TokensOut<'a>) -> Self {
        Self::Host {
            accepted: accepted.0,
            path: path.0,
            tokens: tokens.0,
        }
    }

    /// The host slices, named so they cannot be swapped: what a host verifier writes after
    /// validation. Device outputs are [`VerifyError::Unsupported`] with
    /// [`Feature::Device`](crate::verify::Feature::Device) (what validation without
    /// [`Support::device`](crate::verify::Support::device) refuses them with).
    ///
    /// # Errors
    /// [`VerifyError::Unsupported`] for outputs on the device.
    pub fn host(&mut self) -> Result<(AcceptedOut<'_>, PathOut<'_>, TokensOut<'_>), VerifyError> {
        match self {
            Self::Host {
                accepted,
                path,
                tokens,
            } => Ok((AcceptedOut(accepted), PathOut(path), TokensOut(tokens))),
            Self::Device { .. } => Err(VerifyError::Unsupported {
                feature: crate::verify::Feature::Device,
            }),
        }
    }

    /// Outputs in device memory, in the host outputs' layout: a GPU verifier's launch writes
    /// them in place, so the step makes no copy down and no synchronising call (the kernel's
    /// error flags are then not read back: a batch that passed validation raises none), as
    /// [`Outputs::on_device`](crate::verify::Outputs::on_device) for chains. Validation checks
    /// their lengths as the host ones'; host verifiers refuse them
    /// ([`VerifyError::Unsupported`] with [`Feature::Device`](crate::verify::Feature::Device)).
    #[must_use]
    pub fn on_device(device: DeviceTreeOutputs<'a>) -> Self {
        Self::Device { outputs: device }
    }
}

/// Tree outputs in device memory, for [`TreeOutputs::on_device`]: named fields, so the path and
/// the tokens cannot be swapped. Laid out as the host outputs ([`TreeOutputs`]).
#[derive(Debug)]
pub struct DeviceTreeOutputs<'a> {
    /// `accepted[b]` (`B` values).
    pub accepted: DeviceOut<'a>,
    /// The accepted node indices (`B · (max_depth + 1)` values).
    pub path: DeviceOut<'a>,
    /// The emitted tokens (`B · (max_depth + 1)` values).
    pub tokens: DeviceOut<'a>,
}

/// Builds the first-child / next-sibling links of one tree from its parent array
/// (`parents[0] = -1` for the root, `parents[i]` the parent of node `i`): children are listed
/// in increasing index order. `first_child` and `next_sibling` must have `parents.len()` slots.
/// A cycle in `parents` is not detected here: [`validate_tree`] reports it.
///
/// Errors: [`VerifyError::Length`] for mismatched slices, [`VerifyError::NodeCount`] for an empty
/// tree or one above [`MAX_TREE_NODES`], [`VerifyError::LinkOutOfRange`] (request 0) for a parent
/// outside `0..n` or a root with a parent.
///
/// ```
/// use specula_core::verify::tree::links_from_parents;
/// let (mut first_child, mut next_sibling) = ([0i32; 4], [0i32; 4]);
/// links_from_parents(&[-1, 0, 0, 2], &mut first_child, &mut next_sibling).unwrap();
/// assert_eq!((first_child, next_sibling), ([1, -1, 3, -1], [-1, 2, -1, -1]));
/// ```
pub fn links_from_parents(
    parents: &[i32],
    first_child: &mut [i32],
    next_sibling: &mut [i32],
) -> Result<(), VerifyError> {
    let n = parents.len();
    expect_len(Param::FirstChild, first_child.len(), Some(n))?;
    expect_len(Param::NextSibling, next_sibling.len(), Some(n))?;
    if n == 0 || n > MAX_TREE_NODES {
        return Err(VerifyError::NodeCount {
            request: 0,
            nodes: u32::try_from(n).unwrap_or(u32::MAX),
            max: MAX_TREE_NODES,
        });
    }
    for (node, &p) in parents.iter().enumerate() {
        let ok = if node == 0 {
            p == NO_NODE
        } else {
            usize::try_from(p).is_ok_and(|p| p < n)
        };
        if !ok {
            return Err(VerifyError::LinkOutOfRange {
                request: 0,
                node,
                link: p,
            });
        }
    }
    first_child.fill(NO_NODE);
    next_sibling.fill(NO_NODE);
    // Backwards, so each parent's list ends up in increasing index order.
    for i in (1..n).rev() {
        let p = parents[i] as usize; // checked above: 0 ≤ p < n
        next_sibling[i] = first_child[p];
        first_child[p] = i as i32; // i < MAX_TREE_NODES
    }
    Ok(())
}
