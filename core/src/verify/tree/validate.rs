//! Validation of a tree batch: the batch-wide shape, then each request's tree, ids and
//! parameters, in the order [`VerifyError`]'s documentation gives.

use super::*;
use crate::verify::validate::{
    check_rows, check_temperature, check_token, check_typical, expect_len, rows_fit, rows_readable,
    streams_fit, target_fits,
};

/// The batch-wide checks of the reference ([`Support::ALL`]: binary32 rows in host memory):
/// [`validate_tree_shape_with`].
pub fn validate_tree_shape<const K: usize>(
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), VerifyError> {
    validate_tree_shape_with::<K>(Support::ALL, batch, out)
}

/// Which rows a tree verifier reads: binary32, bf16 / f16 only with [`Support::tree_half`]
/// (every verifier of this workspace), in device memory only with [`Support::device`]. The chain's errors: [`Feature::Half`] for half logits or draft rows,
/// [`Feature::HalfProbs`] for half target probabilities, [`Feature::Device`].
fn rows_supported(support: Support, batch: &TreeBatch<'_>) -> Result<(), VerifyError> {
    let half = |r: Rows<'_>| r.format() != Format::F32 && !support.tree_half;
    if batch.draft.is_some_and(half) || (batch.has_logits() && half(batch.target.rows())) {
        return Err(VerifyError::Unsupported {
            feature: Feature::Half,
        });
    }
    if half(batch.target.rows()) {
        return Err(VerifyError::Unsupported {
            feature: Feature::HalfProbs,
        });
    }
    if batch.has_device() && !support.device {
        return Err(VerifyError::Unsupported {
            feature: Feature::Device,
        });
    }
    if batch.filters.is_some() && !support.tree_filters {
        return Err(VerifyError::Unsupported {
            feature: Feature::Filters,
        });
    }
    Ok(())
}

/// The batch-wide checks for a tree verifier that supports `support`: the rows it reads
/// (binary32; bf16 / f16 with [`Support::tree_half`]; in device memory only with
/// [`Support::device`]), sizes, strides, every slice length (inputs, then outputs: `accepted`,
/// `path`, `tokens`; outputs on the device ([`TreeOutputs::on_device`]) need
/// [`Support::device`] and are checked the same way).
/// Lengths are [`Values::len`], wherever the values are.
pub fn validate_tree_shape_with<const K: usize>(
    support: Support,
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), VerifyError> {
    validate_tree_inputs_with::<K>(support, batch)?;
    let b = batch.requests();
    let width = batch
        .max_depth
        .checked_add(1)
        .and_then(|w| w.checked_mul(b));
    let lens = match out {
        TreeOutputs::Host {
            accepted,
            path,
            tokens,
        } => [accepted.len(), path.len(), tokens.len()],
        TreeOutputs::Device { .. } if !support.device => {
            return Err(VerifyError::Unsupported {
                feature: Feature::Device,
            });
        }
        TreeOutputs::Device { outputs: d } => [d.accepted.len(), d.path.len(), d.tokens.len()],
    };
    expect_len(Param::Accepted, lens[0], Some(b))?;
    expect_len(Param::Path, lens[1], width)?;
    expect_len(Param::Tokens, lens[2], width)?;
    Ok(())
}

/// [`validate_tree_shape_with`] without the outputs (the GPU staging's outputs are its own).
pub(crate) fn validate_tree_inputs_with<const K: usize>(
    support: Support,
    batch: &TreeBatch<'_>,
) -> Result<(), VerifyError> {
    rows_supported(support, batch)?;
    let b = batch.requests();
    if b == 0 {
        return Err(VerifyError::EmptyBatch);
    }
    if batch.max_nodes == 0 || batch.max_nodes > MAX_TREE_NODES {
        return Err(VerifyError::MaxNodesOutOfRange {
            max_nodes: batch.max_nodes,
            max: MAX_TREE_NODES,
        });
    }
    if batch.max_depth > K {
        return Err(VerifyError::MaxDepthOutOfRange {
            max_depth: batch.max_depth,
            max: K,
        });
    }
    let v = batch.vocab;
    if v == 0 || v > u32::MAX as usize {
        return Err(VerifyError::VocabOutOfRange { vocab: v });
    }
    let slots = b.checked_mul(batch.max_nodes);
    expect_len(Param::TreeTokens, batch.tree.tokens.len(), slots)?;
    expect_len(Param::FirstChild, batch.tree.first_child.len(), slots)?;
    expect_len(Param::NextSibling, batch.tree.next_sibling.len(), slots)?;
    if let Some(d) = batch.draft {
        rows_fit(d, v, slots, Tensor::Draft, Param::DraftProbs)?;
    }
    target_fits(batch.target, v, slots)?;
    if let Some(t) = batch.target.temperature() {
        expect_len(Param::Temperature, t.len(), Some(b))?;
    }
    if let Some(f) = batch.filters {
        expect_len(Param::Filters, f.len(), Some(b))?;
    }
    streams_fit(b, batch.seed, batch.offset, batch.eps, batch.delta)
}

/// Checks request `b`'s tree shape (node count, links, one parent per node, depth) and returns
/// its depth (the deepest node's). For a batch that passed [`validate_tree_shape`].
fn check_links(batch: &TreeBatch<'_>, b: usize) -> Result<usize, VerifyError> {
    let n = batch.tree.nodes[b];
    if n == 0 || n as usize > batch.max_nodes {
        return Err(VerifyError::NodeCount {
            request: b,
            nodes: n,
            max: batch.max_nodes,
        });
    }
    let n = n as usize;
    let base = b * batch.max_nodes;
    for node in 0..n {
        for (links, is_sibling) in [
            (batch.tree.first_child, false),
            (batch.tree.next_sibling, true),
        ] {
            let link = links[base + node];
            let in_range =
                link == NO_NODE || (link >= 1 && (link as usize) < n && !(node == 0 && is_sibling));
            if !in_range {
                return Err(VerifyError::LinkOutOfRange {
                    request: b,
                    node,
                    link,
                });
            }
        }
    }
    // Walk from the root: every node must be reached exactly once.
    let mut seen = [0u64; MAX_TREE_NODES / 64];
    let mut depth_of = [0u16; MAX_TREE_NODES];
    let mut stack = [0u16; MAX_TREE_NODES];
    let mut top = 1usize; // stack[0] = root
    seen[0] = 1;
    let mut depth = 0usize;
    while top > 0 {
        top -= 1;
        let u = stack[top] as usize;
        let d = depth_of[u] as usize + 1;
        let mut c = batch.first_child(b, u);
        while let Some(x) = c {
            if seen[x / 64] & (1 << (x % 64)) != 0 {
                return Err(VerifyError::Cycle {
                    request: b,
                    node: x,
                });
            }
            seen[x / 64] |= 1 << (x % 64);
            if d > batch.max_depth {
                return Err(VerifyError::Depth {
                    request: b,
                    node: x,
                    max: batch.max_depth,
                });
            }
            depth = depth.max(d);
            depth_of[x] = d as u16; // d ≤ max_depth < n ≤ MAX_TREE_NODES
            // Each node is pushed once (a second visit is a cycle), so the stack holds ≤ n.
            stack[top] = x as u16;
            top += 1;
            c = batch.next_sibling(b, x);
        }
    }
    if let Some(node) = (1..n).find(|&x| seen[x / 64] & (1 << (x % 64)) == 0) {
        return Err(VerifyError::Unreachable { request: b, node });
    }
    Ok(depth)
}

/// Request `b`'s tree depth (the deepest node's depth; 0 for a root alone). For a validated
/// batch; this is the draft length its verification is counted with.
#[must_use]
pub fn tree_depth(batch: &TreeBatch<'_>, b: usize) -> usize {
    check_links(batch, b).unwrap_or(0)
}

/// The checks of request `b` of a batch that passed [`validate_tree_shape`]: its tree
/// ([`VerifyError::NodeCount`], [`VerifyError::LinkOutOfRange`], [`VerifyError::Cycle`],
/// [`VerifyError::Unreachable`], [`VerifyError::Depth`]), its tokens, its parameters and, for
/// [`Check::Strict`], every row it may read (rows in device memory cannot be read here:
/// [`VerifyError::Unsupported`] with [`Feature::DeviceCheck`]). Returns the tree's depth.
pub fn validate_tree_request(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    b: usize,
) -> Result<usize, VerifyError> {
    let depth = check_links(batch, b)?;
    let n = batch.node_count(b);
    for node in 1..n {
        check_token(b, node, batch.token(b, node), batch.vocab)?;
    }
    check_temperature(b, batch.temperature_of(b))?;
    if let Some(param) = batch.filter_of(b).out_of_range() {
        return Err(VerifyError::BadParam { request: b, param });
    }
    if method == Method::Typical {
        check_typical(b, batch.eps_of(b), batch.delta_of(b))?;
    }
    if let Check::Strict { sum_tolerance } = check {
        rows_readable(batch.has_device())?;
        // Validated shape: every node slot's row is inside the tensors.
        let draft = |node| batch.draft_values_checked(b, node);
        check_rows(b, Tensor::Draft, 1..n, Some(sum_tolerance), draft)?;
        let tolerance = (!batch.has_logits()).then_some(sum_tolerance);
        let target = |node| batch.target_values_checked(b, node);
        check_rows(b, Tensor::Target, 0..n, tolerance, target)?;
    }
    Ok(depth)
}

/// Every check of a host verifier, in the documented order: [`validate_tree_with`] with
/// [`Support::ALL`].
pub fn validate_tree<const K: usize>(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), VerifyError> {
    validate_tree_with::<K>(Support::ALL, method, check, batch, out)
}

/// Every check for a tree verifier that supports `support`, in the documented order:
/// [`validate_tree_shape_with`], then [`validate_tree_request`] for each request in batch
/// order.
pub fn validate_tree_with<const K: usize>(
    support: Support,
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), VerifyError> {
    validate_tree_shape_with::<K>(support, batch, out)?;
    for b in 0..batch.requests() {
        validate_tree_request(method, check, batch, b)?;
    }
    Ok(())
}
