//! Tree verification: EAGLE / Medusa / SpecInfer token trees (`core/DETERMINISM.md`, "Token
//! trees").
//!
//! A drafter proposes, per request, a **tree** of candidate tokens; the target scored every node
//! in one pass. [`TreeBatch`] takes the tree in the form engines build it (SGLang's
//! `retrive_next_token` / `retrive_next_sibling`: first-child and next-sibling arrays over a
//! per-request node list, `-1` = none; [`links_from_parents`] builds them from a parent array),
//! with one target row per node. Verification walks the tree from the root and writes the
//! accepted node indices (so the engine keeps the KV cache of that path), the emitted tokens and
//! the accepted length ([`TreeOutputs`]).
//!
//! * [`Method::Greedy`]: follow the child whose token is the target argmax, as deep as it goes;
//!   emit the path plus the argmax at the stopping node.
//! * [`Method::Rejection`]: lossless. With draft probabilities, SpecInfer's multi-step
//!   speculative sampling over the siblings (Miao et al. 2024, Algorithm 2); without, the
//!   target-only rule (one uniform per node against the cumulative target mass of the siblings'
//!   tokens). Either way the emitted sequence follows the target distribution exactly.
//! * [`Method::Typical`]: Medusa's rule, the deepest path whose tokens all pass the threshold.
//!
//! Chains and trees are one walk: a chain is a tree whose node `j` has the one child `j + 1`,
//! so a tree that is a chain gives the chain verifier's bits exactly
//! ([`verify_batch`](super::verify_batch) with the same rows, seed and offset): the random
//! draws are keyed by the node whose row is sampled, which is the draft position in a chain.
//!
//! ```
//! use specula_core::verify::tree::{verify_tree_batch, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs};
//! use specula_core::verify::{AcceptedOut, Check, Method, Streams, TokensOut};
//! use specula_core::Counters;
//!
//! // Root 0 with two candidates (tokens 1 and 2); node 2 has a child (token 3). V = 4.
//! let nodes = [4u32];
//! let tokens = [0, 1, 2, 3];
//! let first_child = [1, -1, 3, -1];
//! let next_sibling = [-1, 2, -1, -1];
//! let target = [
//!     0.1, 0.2, 0.7, 0.0, // root: argmax 2 (node 2)
//!     1.0, 0.0, 0.0, 0.0, // node 1 (not reached)
//!     0.0, 0.0, 0.0, 1.0, // node 2: argmax 3 (node 3)
//!     0.0, 1.0, 0.0, 0.0, // node 3 (leaf): argmax 1, the bonus
//! ];
//! let batch = TreeBatch::new(
//!     TreeDims { vocab: 4, max_nodes: 4, max_depth: 2 },
//!     Tree { nodes: &nodes, tokens: &tokens, first_child: &first_child, next_sibling: &next_sibling },
//!     &target,
//!     Streams { seed: &[1], offset: &[0] },
//! );
//! let (mut accepted, mut path, mut emitted) = ([0u32; 1], [0u32; 3], [0u32; 3]);
//! let mut out = TreeOutputs::new(AcceptedOut(&mut accepted), PathOut(&mut path), TokensOut(&mut emitted));
//! let mut counters = Counters::<4>::ZERO;
//! verify_tree_batch(Method::Greedy, Check::STRICT, &batch, &mut out, &mut counters).unwrap();
//! assert_eq!((accepted, path, emitted), ([2], [0, 2, 3], [2, 3, 1]));
//! assert_eq!(counters.accepted_per_position[..2], [1, 1]);
//! ```

mod batch;
mod validate;

pub use batch::{
    DeviceTreeOutputs, PathOut, Tree, TreeBatch, TreeDims, TreeOutputs, links_from_parents,
};
pub(crate) use validate::validate_tree_inputs_with;
pub use validate::{
    tree_depth, validate_tree, validate_tree_request, validate_tree_shape,
    validate_tree_shape_with, validate_tree_with,
};

pub use super::walk::{
    MAX_TREE_NODES, excluding_weight, residual_fixed, sibling_draw, speculative_residual,
};

use super::walk::{Dist, Shape, Walk};
use super::{
    AcceptedOut, Check, DEFAULT_DELTA, DEFAULT_EPS, Feature, Filter, Format, Logits, Method, Param,
    Processed, RowOps, Rows, SENTINEL, ScalarOps, Streams, Strides, Support, Target, Tensor,
    TokensOut, Values, VerifyError,
};
use crate::metrics::Counters;

/// "No node" in [`Tree::first_child`] and [`Tree::next_sibling`].
pub const NO_NODE: i32 = -1;

/// Where the tree walk reads request `b`'s rows: node `node`'s target row and, with draft
/// probabilities, its draft row, `V` values each. The walk asks for a row when it reads it,
/// and only then (greedy and the target-only rule: the visited nodes' rows; SpecInfer: also
/// the draft row of each sibling whose test comes; typical acceptance: the tested nodes'
/// parents and the stopping node), so a source may produce a row on its first read, e.g. widen
/// a bf16 / f16 row into binary32 scratch. A source must return the batch's row or its exact
/// widening (`core/DETERMINISM.md`), so that the walk gives the same bits either way.
///
/// Binary32 rows go to the walk's [`RowOps`] (a logits row through
/// [`RowOps::softmax`]); half ones are read in place by plain loops, as a chain's are. The
/// defaults read the batch's host rows as given ([`BatchRows`]); a batch they read must have
/// passed [`validate_tree`].
pub trait NodeRows {
    /// Request `b`'s node `node`'s target row.
    fn target<'s>(&'s self, batch: &'s TreeBatch<'_>, b: usize, node: usize) -> Values<'s> {
        batch
            .target_values_checked(b, node)
            .unwrap_or(Values::F32(&[]))
    }

    /// Request `b`'s node `node`'s draft row, `None` without draft probabilities.
    fn draft<'s>(&'s self, batch: &'s TreeBatch<'_>, b: usize, node: usize) -> Option<Values<'s>> {
        batch.draft_values_checked(b, node)
    }
}

/// The batch's host rows as given, in their format: the reference's [`NodeRows`].
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchRows;

impl NodeRows for BatchRows {}

/// A tree request as the [`Walk`] reads it: its links and tokens from the batch, its rows
/// from `rows` (binary32 ones reduced by the ops, a logits row through their softmax; half
/// and filtered ones through their [`Processed`] form), its parents (for typical acceptance's path) found
/// once from the links.
struct TreeShape<'a, 'r, R: ?Sized> {
    rows: &'a R,
    batch: &'a TreeBatch<'r>,
    b: usize,
    /// The plan's temperature: `Some(t)` with `t > 0`, the rows are read through their softmax.
    temperature: Option<f32>,
    /// The plan's sampling filter: active, every row is read through its [`Processed`] form.
    filter: Filter,
    parent: [u16; MAX_TREE_NODES],
}

impl<'a, R: NodeRows + ?Sized> Shape<'a> for TreeShape<'a, '_, R> {
    fn first_child(&self, u: usize) -> Option<usize> {
        self.batch.first_child(self.b, u)
    }

    fn next_sibling(&self, c: usize) -> Option<usize> {
        self.batch.next_sibling(self.b, c)
    }

    fn parent(&self, c: usize) -> usize {
        usize::from(self.parent[c])
    }

    fn token(&self, c: usize) -> u32 {
        self.batch.token(self.b, c)
    }

    fn dist<O: RowOps + ?Sized>(&self, ops: &O, u: usize) -> Dist<'a> {
        if let Some((row, t)) = self.logits(u) {
            return Dist::Soft(row, ops.softmax(row, t));
        }
        match self.rows.target(self.batch, self.b, u) {
            Values::F32(row) if !self.filter.is_active() => Dist::Probs(row),
            row => Dist::Processed(row, Processed::of(row, self.temperature, self.filter)),
        }
    }

    fn logits(&self, u: usize) -> Option<(&'a [f32], f32)> {
        match (self.rows.target(self.batch, self.b, u), self.temperature) {
            (Values::F32(row), Some(t)) if t > 0.0 && !self.filter.is_active() => Some((row, t)),
            _ => None,
        }
    }

    fn draft(&self, c: usize) -> Option<Values<'a>> {
        self.rows.draft(self.batch, self.b, c)
    }

    fn bonus(&self) -> Option<u32> {
        None
    }
}

/// Verifies request `b` of a batch that passed [`validate_tree`] (or [`validate_tree_with`]
/// the support of `rows`): writes its `max_depth + 1` path and token slots and returns the
/// accepted length. `ops` supplies the row reductions (argmax, entropy, race, single-residual
/// race), `rows` the rows, each when the walk first needs it ([`BatchRows`]: the rows as
/// given, in their format). The walk is the one of chains
/// ([`verify_request`](super::verify_request): a chain is a tree whose nodes each have one
/// child), shared by every CPU-side backend. With binary32 target logits at temperature `> 0`
/// each row read is reduced once by [`RowOps::softmax`] and then read through `ops`' softmax
/// reductions; half rows by plain loops; at temperature 0 the method is greedy on the logits.
pub fn verify_tree_request<O: RowOps + ?Sized, R: NodeRows + ?Sized>(
    ops: &O,
    rows: &R,
    method: Method,
    batch: &TreeBatch<'_>,
    b: usize,
    path: &mut [u32],
    tokens: &mut [u32],
) -> u32 {
    let plan = batch.plan(b, method);
    let mut parent = [0u16; MAX_TREE_NODES];
    if plan.method == Method::Typical {
        // Validated: at most `MAX_TREE_NODES` nodes, each reached once from the root.
        for u in 0..batch.node_count(b) {
            let mut c = batch.first_child(b, u);
            while let Some(x) = c {
                parent[x] = u as u16;
                c = batch.next_sibling(b, x);
            }
        }
    }
    let walk = Walk {
        ops,
        shape: TreeShape {
            rows,
            batch,
            b,
            temperature: plan.temperature,
            filter: plan.filter,
            parent,
        },
        plan,
        seed: batch.seed[b],
        offset: batch.offset[b],
    };
    path[0] = 0;
    let (accepted, last) = walk.run(|n, c| {
        path[n] = c as u32;
        tokens[n - 1] = batch.token(b, c);
    });
    tokens[accepted] = last;
    for x in &mut tokens[accepted + 1..] {
        *x = SENTINEL;
    }
    for x in &mut path[accepted + 1..] {
        *x = SENTINEL;
    }
    accepted as u32
}

/// The reference tree verifier: validates everything ([`validate_tree`]), then verifies each
/// request in order with the plain-loop [`ScalarOps`] and records it in `counters`:
/// `record_tree(depth, n − 1, accepted)`, a chain of the tree's depth (`drafts`,
/// `accepted_tokens`, `emitted_tokens` and the per-position counts are the per-depth counts;
/// `draft_tokens` adds the depth, not the node count) plus `tree_drafts` (1) and
/// `tree_draft_tokens` (the `n − 1` draft nodes). A tree of the root alone (depth 0) is not
/// counted, as a chain with `k = 0`. Nothing is counted (and `out` is untouched) on error.
pub fn verify_tree_batch<const K: usize>(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    out: &mut TreeOutputs<'_>,
    counters: &mut Counters<K>,
) -> Result<(), VerifyError> {
    validate_tree::<K>(method, check, batch, out)?;
    // Device outputs were refused by the validation above.
    let (AcceptedOut(accepted), PathOut(path), TokensOut(tokens)) = out.host()?;
    let width = batch.max_depth + 1;
    for (b, ((acc, path), tokens)) in accepted
        .iter_mut()
        .zip(path.chunks_exact_mut(width))
        .zip(tokens.chunks_exact_mut(width))
        .enumerate()
    {
        *acc = verify_tree_request(&ScalarOps, &BatchRows, method, batch, b, path, tokens);
        let depth = tree_depth(batch, b);
        if depth > 0 {
            let nodes = batch.node_count(b) - 1;
            let recorded = counters.record_tree(depth, nodes, *acc as usize);
            // Validated: depth ≤ max_depth ≤ K, the path is at most the depth, and every depth
            // up to the deepest holds a node.
            debug_assert!(recorded.is_ok());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
