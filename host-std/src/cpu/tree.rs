//! Tree verification on the CPU backend ([`CpuVerifier::verify_tree`]): the core's tree control
//! flow ([`verify_tree_request`]) with this backend's row reductions, requests spread over the
//! pool, counted once per batch like chains.

use super::kernels::Weights;
use super::{ChunkedOps, CpuVerifier, SplitOps, lock};
use rayon::prelude::*;
use specula_core::Counters;
use specula_core::verify::tree::{
    TreeBatch, TreeOps, TreeOutputs, validate_tree_request, validate_tree_shape,
    verify_tree_request,
};
use specula_core::verify::{Check, Method, RaceRng, ScalarOps, VerifyError};

/// `target − 1` at the tried tokens (once each), `target` elsewhere: the residual of the
/// target-only rule after several siblings were rejected.
#[derive(Clone, Copy)]
struct Excluding<'a> {
    target: &'a [f32],
    tried: &'a [u32],
}

impl Weights for Excluding<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.target.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        let n = (end - start).min(N);
        out[..n].copy_from_slice(&self.target[start..start + n]);
        out[n..].fill(0.0);
        // Assigned, not subtracted, so a duplicated token counts once. `t − 1` in f32 is
        // positive exactly when the f64 weight is.
        for &t in self.tried {
            let t = t as usize;
            if t >= start && t < start + n {
                out[t - start] = self.target[t] - 1.0;
            }
        }
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        let hit = self.tried.iter().any(|&t| t as usize == v);
        f64::from(self.target[v]) - if hit { 1.0 } else { 0.0 }
    }
}

impl TreeOps for SplitOps<'_> {
    fn race_excluding(&self, rng: RaceRng, row: &[f32], tried: &[u32]) -> Option<u32> {
        self.race_with(rng, Excluding { target: row, tried })
    }
}

impl TreeOps for ChunkedOps {
    fn race_excluding(&self, rng: RaceRng, row: &[f32], tried: &[u32]) -> Option<u32> {
        SplitOps::new(1, None).race_with(rng, Excluding { target: row, tried })
    }
}

impl<const K: usize> CpuVerifier<K> {
    /// Verifies a batch of token trees (EAGLE / Medusa / SpecInfer; layout and rules in
    /// `core/DETERMINISM.md`, "Token trees"), bit-identical to
    /// [`verify_tree_batch`](specula_core::verify::tree::verify_tree_batch), and counts every
    /// request in this verifier's counters as the reference does
    /// (`record_tree(depth, nodes − 1, accepted)`: a chain of the tree's depth plus the tree
    /// counts), so tree steps flow through the same readback, slot, log line and Prometheus
    /// exporter. On error nothing is
    /// written or counted, and the error is the one the reference reports.
    ///
    /// ```
    /// use specula::cpu::CpuVerifier;
    /// use specula::specula_core::verify::tree::{Tree, TreeBatch, TreeDims, TreeOutputs};
    /// use specula::specula_core::verify::{Check, Method, Streams};
    ///
    /// let verifier = CpuVerifier::<8>::new(2).unwrap();
    /// // Root with two candidates, tokens 1 and 0; V = 2; the target puts 0.9 on token 0.
    /// let target = [0.1, 0.9, /* node 1 */ 0.5, 0.5, /* node 2 */ 1.0, 0.0];
    /// let batch = TreeBatch::new(
    ///     TreeDims { vocab: 2, max_nodes: 3, max_depth: 1 },
    ///     Tree { nodes: &[3], tokens: &[0, 0, 1], first_child: &[1, -1, -1], next_sibling: &[-1, 2, -1] },
    ///     &target,
    ///     Streams { seed: &[7], offset: &[0] },
    /// );
    /// let (mut accepted, mut path, mut tokens) = ([0u32; 1], [0u32; 2], [0u32; 2]);
    /// let mut out = TreeOutputs { accepted: &mut accepted, path: &mut path, tokens: &mut tokens };
    /// verifier.verify_tree(Method::Greedy, Check::STRICT, &batch, &mut out).unwrap();
    /// assert_eq!((accepted, path, tokens), ([1], [0, 2], [1, 0]));
    /// assert_eq!(verifier.totals().accepted_tokens, 1);
    /// assert_eq!((verifier.totals().tree_drafts, verifier.totals().tree_draft_tokens), (1, 2));
    /// ```
    pub fn verify_tree(
        &self,
        method: Method,
        check: Check,
        batch: &TreeBatch<'_>,
        out: &mut TreeOutputs<'_>,
    ) -> Result<(), VerifyError> {
        validate_tree_shape::<K>(batch, out)?;
        let n = batch.requests();
        let width = batch.max_depth + 1;
        let mut depths = vec![0usize; n];
        let rows = out
            .accepted
            .iter_mut()
            .zip(out.path.chunks_exact_mut(width))
            .zip(out.tokens.chunks_exact_mut(width));
        match &self.pool {
            Some(pool) if n >= self.threads => pool.install(|| {
                // `try_for_each` may stop at any failing request: report the lowest, as the
                // reference does.
                let first = depths
                    .par_iter_mut()
                    .enumerate()
                    .map(|(b, d)| validate_tree_request(method, check, batch, b).map(|x| *d = x))
                    .find_map_first(Result::err);
                if let Some(e) = first {
                    return Err(e);
                }
                out.accepted
                    .par_iter_mut()
                    .zip(out.path.par_chunks_exact_mut(width))
                    .zip(out.tokens.par_chunks_exact_mut(width))
                    .enumerate()
                    .for_each(|(b, ((acc, path), tokens))| {
                        *acc = verify_tree_request(&ChunkedOps, method, batch, b, path, tokens);
                    });
                Ok(())
            })?,
            pool => {
                for (b, d) in depths.iter_mut().enumerate() {
                    *d = validate_tree_request(method, check, batch, b)?;
                }
                // Fewer requests than threads: one by one, each row cut over the pool.
                let split = SplitOps::new(self.threads, pool.as_ref());
                for (b, ((acc, path), tokens)) in rows.enumerate() {
                    *acc = match (self.reference, pool) {
                        (true, _) => {
                            verify_tree_request(&ScalarOps, method, batch, b, path, tokens)
                        }
                        (false, None) => {
                            verify_tree_request(&ChunkedOps, method, batch, b, path, tokens)
                        }
                        (false, Some(_)) => {
                            verify_tree_request(&split, method, batch, b, path, tokens)
                        }
                    };
                }
            }
        }
        let mut local = Counters::<K>::ZERO;
        for (b, (&depth, &acc)) in depths.iter().zip(out.accepted.iter()).enumerate() {
            if depth > 0 {
                let nodes = batch.node_count(b) - 1;
                let recorded = local.record_tree(depth, nodes, acc as usize);
                // Validated: depth ≤ max_depth ≤ K, the path is at most the depth, and every
                // depth up to the deepest holds a node.
                debug_assert!(recorded.is_ok());
            }
        }
        lock(&self.counters).add(&local);
        Ok(())
    }
}
