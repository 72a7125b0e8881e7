//! Validation of a tree batch: the batch-wide shape, then each request's tree, ids and
//! parameters, in the order [`VerifyError`]'s documentation gives.

use super::*;

/// The batch-wide checks: sizes, strides, every slice length (inputs, then outputs).
pub fn validate_tree_shape<const K: usize>(
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), VerifyError> {
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
    if let Some(d) = batch.draft_probs {
        if batch.draft_stride < v {
            return Err(VerifyError::StrideTooSmall {
                tensor: Tensor::Draft,
                stride: batch.draft_stride,
                vocab: v,
            });
        }
        let need = slots.and_then(|s| s.checked_mul(batch.draft_stride));
        expect_len(Param::DraftProbs, d.len(), need)?;
    }
    if batch.target_stride < v {
        return Err(VerifyError::StrideTooSmall {
            tensor: Tensor::Target,
            stride: batch.target_stride,
            vocab: v,
        });
    }
    let need = slots.and_then(|s| s.checked_mul(batch.target_stride));
    expect_len(
        if batch.temperature.is_some() {
            Param::TargetLogits
        } else {
            Param::TargetProbs
        },
        batch.target.len(),
        need,
    )?;
    if let Some(t) = batch.temperature {
        expect_len(Param::Temperature, t.len(), Some(b))?;
    }
    expect_len(Param::Seed, batch.seed.len(), Some(b))?;
    expect_len(Param::Offset, batch.offset.len(), Some(b))?;
    if let Some(e) = batch.eps {
        expect_len(Param::Eps, e.len(), Some(b))?;
    }
    if let Some(d) = batch.delta {
        expect_len(Param::Delta, d.len(), Some(b))?;
    }
    let width = batch
        .max_depth
        .checked_add(1)
        .and_then(|w| w.checked_mul(b));
    expect_len(Param::Accepted, out.accepted.len(), Some(b))?;
    expect_len(Param::Path, out.path.len(), width)?;
    expect_len(Param::Tokens, out.tokens.len(), width)?;
    Ok(())
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

fn check_row(
    row: &[f32],
    tolerance: f32,
    request: usize,
    tensor: Tensor,
    node: usize,
) -> Result<(), VerifyError> {
    let mut sum = 0f64;
    for (index, &p) in row.iter().enumerate() {
        if !(0.0..f32::INFINITY).contains(&p) {
            return Err(VerifyError::BadProbability {
                request,
                tensor,
                position: node,
                index,
            });
        }
        sum += f64::from(p);
    }
    let dev = sum - 1.0;
    if !(dev <= f64::from(tolerance) && -dev <= f64::from(tolerance)) {
        return Err(VerifyError::RowSum {
            request,
            tensor,
            position: node,
            sum,
        });
    }
    Ok(())
}

/// The checks of request `b` of a batch that passed [`validate_tree_shape`]: its tree
/// ([`VerifyError::NodeCount`], [`VerifyError::LinkOutOfRange`], [`VerifyError::Cycle`],
/// [`VerifyError::Unreachable`], [`VerifyError::Depth`]), its tokens, its parameters and, for
/// [`Check::Strict`], every row it may read. Returns the tree's depth.
pub fn validate_tree_request(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    b: usize,
) -> Result<usize, VerifyError> {
    let depth = check_links(batch, b)?;
    let n = batch.node_count(b);
    for node in 1..n {
        let token = batch.token(b, node);
        if token as usize >= batch.vocab {
            return Err(VerifyError::TokenOutOfRange {
                request: b,
                position: node,
                token,
                vocab: batch.vocab,
            });
        }
    }
    let ok = |x: f32| (0.0..f32::INFINITY).contains(&x);
    if batch.temperature.is_some_and(|t| !ok(t[b])) {
        return Err(VerifyError::BadParam {
            request: b,
            param: Param::Temperature,
        });
    }
    if method == Method::Typical {
        if !ok(eps_of(batch, b)) {
            return Err(VerifyError::BadParam {
                request: b,
                param: Param::Eps,
            });
        }
        if !ok(delta_of(batch, b)) {
            return Err(VerifyError::BadParam {
                request: b,
                param: Param::Delta,
            });
        }
    }
    if let Check::Strict { sum_tolerance } = check {
        if batch.draft_probs.is_some() {
            for node in 1..n {
                if let Some(row) = batch.draft_row(b, node) {
                    check_row(row, sum_tolerance, b, Tensor::Draft, node)?;
                }
            }
        }
        for node in 0..n {
            let row = batch.target_row(b, node);
            if batch.temperature.is_some() {
                if let Some(index) = row.iter().position(|&l| l.is_nan() || l == f32::INFINITY) {
                    return Err(VerifyError::BadLogit {
                        request: b,
                        position: node,
                        index,
                    });
                }
            } else {
                check_row(row, sum_tolerance, b, Tensor::Target, node)?;
            }
        }
    }
    Ok(depth)
}

/// Every check, in the documented order: [`validate_tree_shape`], then
/// [`validate_tree_request`] for each request in batch order.
pub fn validate_tree<const K: usize>(
    method: Method,
    check: Check,
    batch: &TreeBatch<'_>,
    out: &TreeOutputs<'_>,
) -> Result<(), VerifyError> {
    validate_tree_shape::<K>(batch, out)?;
    for b in 0..batch.requests() {
        validate_tree_request(method, check, batch, b)?;
    }
    Ok(())
}

pub(super) fn expect_len(
    param: Param,
    len: usize,
    expected: Option<usize>,
) -> Result<(), VerifyError> {
    let expected = expected.unwrap_or(usize::MAX);
    if len == expected {
        Ok(())
    } else {
        Err(VerifyError::Length {
            param,
            len,
            expected,
        })
    }
}
