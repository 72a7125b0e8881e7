//! The CPU backend: [`CpuVerifier`] verifies batches on a thread pool it owns, bit-identical to
//! the core reference ([`specula_core::verify::verify_batch`]), and counts them in shared
//! counters that a [`CpuReadback`] reads for a [`Collector`](specula_core::Collector).
//!
//! ```
//! use specula::cpu::CpuVerifier;
//! use specula::specula_core::verify::{Batch, Drafts, Dims, Streams, Check, Method, Outputs};
//!
//! let verifier = CpuVerifier::<8>::new(2).unwrap();
//! let target = [0.5, 0.5, 0.0, 1.0];
//! let batch = Batch::dense(Dims { vocab: 2, k_max: 1 }, Drafts { k: &[1], ids: &[1] }, &target, Streams { seed: &[7], offset: &[0] });
//! let (mut accepted, mut tokens) = ([0u32; 1], [0u32; 2]);
//! let mut out = Outputs { accepted: &mut accepted, tokens: &mut tokens };
//! verifier.verify(Method::Rejection, Check::STRICT, &batch, &mut out).unwrap();
//! assert_eq!(verifier.totals().drafts, 1);
//! ```
//!
//! # Design
//! * Requests are spread over the pool with rayon; each request runs the shared control flow
//!   ([`verify_request`]) with [`ChunkedOps`], the vectorisable row reductions, compiled for
//!   the widest instruction set the CPU has (AVX-512 or AVX2 on x86-64, detected at run time).
//! * A batch with fewer requests than threads (batch 1 is the latency case) is verified on the
//!   calling thread instead, each row cut into pieces that the pool's threads share; the
//!   reductions are order-independent by the rules, so the bits do not depend on the cut.
//! * Validation comes first (batch shape, then every request, in parallel but reporting the
//!   error of the lowest request, as the reference does), so a refused batch counts nothing.
//! * The batch's counts are summed locally and added to the shared counters under one lock, once
//!   per batch: every snapshot holds whole batches only.

mod kernels;
mod ops;
mod tree;

pub use ops::ChunkedOps;
use ops::SplitOps;

use rayon::prelude::*;
use specula_core::verify::fill_recovered;
use specula_core::verify::{
    Batch, Check, DEFAULT_DELTA, DEFAULT_EPS, Dims, Drafts, Method, Outputs, RowOps, SENTINEL,
    ScalarOps, Softmax, Streams, Support, Verifier, VerifyError, softmax_exp, softmax_fixed,
    softmax_max, validate_recovered, validate_request_with, validate_shape_with, verify_request,
};
use specula_core::{Counters, Readback};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

/// Locks the counters. A panic while holding the lock is impossible (the critical sections only
/// copy and add integers), and even then the counters would be whole, so poison is ignored.
fn lock<const K: usize>(m: &Mutex<Counters<K>>) -> MutexGuard<'_, Counters<K>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ids per piece of the softmax reductions: the maxima and sums of pieces are combined after,
/// which the rules make independent of the cut.
const SOFTMAX_PIECE: usize = 2048;

/// Writes the softmax of the logits `row` at temperature `t > 0` into `out` (the rules of
/// `core/DETERMINISM.md`): maximum and exact fixed-point sum over pieces, then each `p`.
fn softmax_into(row: &[f32], t: f32, out: &mut [f32]) {
    let max = row
        .chunks(SOFTMAX_PIECE)
        .map(|c| {
            c.iter()
                .fold(f32::NEG_INFINITY, |m, &l| softmax_max(m, l / t))
        })
        .fold(f32::NEG_INFINITY, softmax_max);
    let fixed = row
        .chunks(SOFTMAX_PIECE)
        .map(|c| {
            c.iter().fold(0u128, |s, &l| {
                s.wrapping_add(softmax_fixed(softmax_exp(l, t, max)))
            })
        })
        .fold(0u128, u128::wrapping_add);
    let sm = Softmax::from_parts(t, max, fixed);
    for (o, &l) in out.iter_mut().zip(row) {
        *o = sm.p(l);
    }
}

/// Verifies request `b` of a validated batch with `ops`. Target logits at a temperature
/// `> 0` are turned into probability rows first ([`softmax_into`]), then verified as a
/// one-request probability batch with the same seed, offset, drafts and parameters (the random
/// streams do not depend on the batch slot, so the bits are those of the whole batch).
fn verify_one<O: RowOps + ?Sized>(
    ops: &O,
    method: Method,
    batch: &Batch<'_>,
    b: usize,
    tokens: &mut [u32],
) -> u32 {
    let t = match batch.temperature.map(|t| t[b]) {
        Some(t) if t > 0.0 => t,
        _ => return verify_request(ops, method, batch, b, tokens),
    };
    let v = batch.vocab;
    let ids = batch.draft_ids_checked(b).unwrap_or(&[]);
    let k = ids.len();
    let rows = if batch.bonus.is_some() { k } else { k + 1 };
    // Always k + 1 rows, the layout of a one-request dense batch (row k unread with a bonus).
    let mut probs = vec![0f32; (k + 1) * v];
    for (j, out) in probs.chunks_exact_mut(v).take(rows).enumerate() {
        if let Some(row) = batch.target_row_checked(b, j) {
            softmax_into(row, t, out);
        }
    }
    let draft: Option<Vec<f32>> = batch.draft_probs.map(|_| {
        (0..k)
            .flat_map(|j| batch.draft_row_checked(b, j).unwrap_or(&[]))
            .copied()
            .collect()
    });
    let k32 = [k as u32];
    let eps = [batch.eps.map_or(DEFAULT_EPS, |e| e[b])];
    let delta = [batch.delta.map_or(DEFAULT_DELTA, |d| d[b])];
    let bonus = batch.bonus.map(|x| [x[b]]);
    let mut one = Batch::dense(
        Dims { vocab: v, k_max: k },
        Drafts { k: &k32, ids },
        &probs,
        Streams {
            seed: &batch.seed[b..=b],
            offset: &batch.offset[b..=b],
        },
    )
    .with_typical(&eps, &delta);
    if let Some(d) = &draft {
        one = one.with_draft_probs(d);
    }
    if let Some(x) = &bonus {
        one = one.with_bonus(x);
    }
    let acc = verify_request(ops, method, &one, 0, &mut tokens[..=k]);
    for x in &mut tokens[k + 1..] {
        *x = SENTINEL;
    }
    acc
}

/// Multithreaded CPU verifier with device-style shared counters (see the [module docs](self)).
///
/// `verify` takes `&self`: one verifier can be shared (e.g. in an `Arc`) by several threads, each
/// submitting batches; counting stays batch-atomic.
#[derive(Debug)]
pub struct CpuVerifier<const K: usize> {
    /// `None`: run on the calling thread.
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    /// Verify with the core's plain-loop [`ScalarOps`] (the reference reductions) instead of
    /// the vectorised kernels: same bits, the reference's speed.
    reference: bool,
    counters: Arc<Mutex<Counters<K>>>,
}

impl<const K: usize> CpuVerifier<K> {
    /// A verifier running on `threads` threads: `1` runs on the calling thread (no pool), `0`
    /// means one per CPU (rayon's default), `n > 1` builds a pool of `n` threads it owns.
    pub fn new(threads: usize) -> Result<Self, rayon::ThreadPoolBuildError> {
        let pool = if threads == 1 {
            None
        } else {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("specula-verify-{i}"))
                    .build()?,
            )
        };
        let threads = pool
            .as_ref()
            .map_or(1, rayon::ThreadPool::current_num_threads);
        Ok(Self {
            pool,
            threads,
            reference: false,
            counters: Arc::new(Mutex::new(Counters::ZERO)),
        })
    }

    /// The core reference (plain sequential loops, [`ScalarOps`]) on the calling thread, with the
    /// same shared counters and [`readback`](Self::readback) as the CPU backend: the reference
    /// as a backend a runtime can open (`"reference"`), for debugging and cross-checks.
    #[must_use]
    pub fn reference() -> Self {
        Self {
            pool: None,
            threads: 1,
            reference: true,
            counters: Arc::new(Mutex::new(Counters::ZERO)),
        }
    }

    /// Whether this verifier runs the plain-loop reference reductions.
    #[must_use]
    pub fn is_reference(&self) -> bool {
        self.reference
    }

    /// The number of threads verification runs on.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Validates `batch` (always the cheap checks, plus `check`), verifies every request with
    /// `method` into `out`, then counts the whole batch at once. On error nothing is written or
    /// counted, and the error is the one the core reference would report. Everything the
    /// reference verifies is supported ([`Support::ALL`]: `k = 0`, the ragged layout, bonus
    /// tokens); a request with `k = 0` is not counted.
    pub fn verify(
        &self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), VerifyError> {
        validate_shape_with::<K>(Support::ALL, batch, out)?;
        let n = batch.requests();
        let width = batch.k_max + 1;
        match &self.pool {
            None => {
                for b in 0..n {
                    validate_request_with(Support::ALL, method, check, batch, b)?;
                }
                for (b, (acc, row)) in out
                    .accepted
                    .iter_mut()
                    .zip(out.tokens.chunks_exact_mut(width))
                    .enumerate()
                {
                    *acc = if self.reference {
                        verify_one(&ScalarOps, method, batch, b, row)
                    } else {
                        verify_one(&ChunkedOps, method, batch, b, row)
                    };
                }
            }
            Some(pool) if n < self.threads => {
                // Fewer requests than threads (batch 1 is the latency case): verify them one
                // by one on the calling thread, each row cut over the whole pool.
                for b in 0..n {
                    validate_request_with(Support::ALL, method, check, batch, b)?;
                }
                let ops = SplitOps::new(self.threads, Some(pool));
                for (b, (acc, row)) in out
                    .accepted
                    .iter_mut()
                    .zip(out.tokens.chunks_exact_mut(width))
                    .enumerate()
                {
                    *acc = verify_one(&ops, method, batch, b, row);
                }
            }
            Some(pool) => pool.install(|| {
                // `find_map_first`: the error of the lowest failing request, as in the reference.
                let first = (0..n).into_par_iter().find_map_first(|b| {
                    validate_request_with(Support::ALL, method, check, batch, b).err()
                });
                if let Some(e) = first {
                    return Err(e);
                }
                out.accepted
                    .par_iter_mut()
                    .zip(out.tokens.par_chunks_exact_mut(width))
                    .enumerate()
                    .for_each(|(b, (acc, row))| {
                        *acc = verify_one(&ChunkedOps, method, batch, b, row);
                    });
                Ok(())
            })?,
        }
        let mut local = Counters::<K>::ZERO;
        for (b, &acc) in out.accepted.iter().enumerate() {
            // A request without drafts (k = 0) is not counted, as in the reference.
            let k = batch.draft_len(b) as usize;
            if k > 0 {
                let recorded = local.record(k, acc as usize);
                // Validated: k ≤ k_max ≤ K and acc ≤ k.
                debug_assert!(recorded.is_ok());
            }
        }
        lock(&self.counters).add(&local);
        Ok(())
    }

    /// vLLM's `recovered_token_ids` for `batch` (see
    /// [`specula_core::verify::recovered_tokens`], whose bits it gives): one token per draft
    /// slot, the one emitted if that position is the first rejected. Computed with this
    /// verifier's row reductions on the calling thread; nothing is counted.
    pub fn recovered_tokens(
        &self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        recovered: &mut [u32],
    ) -> Result<(), VerifyError> {
        validate_recovered::<K>(Support::ALL, method, check, batch, recovered)?;
        if self.reference {
            fill_recovered(&ScalarOps, method, batch, recovered);
        } else {
            fill_recovered(&ChunkedOps, method, batch, recovered);
        }
        Ok(())
    }

    /// The counters of every batch verified so far (whole batches only).
    #[must_use]
    pub fn totals(&self) -> Counters<K> {
        *lock(&self.counters)
    }

    /// A [`Readback`] of this verifier's counters, for a [`Collector`](specula_core::Collector).
    /// It may live on another thread; its snapshots are batch-consistent while batches run.
    #[must_use]
    pub fn readback(&self) -> CpuReadback<K> {
        CpuReadback {
            counters: Arc::clone(&self.counters),
            pending: None,
        }
    }
}

impl<const K: usize> Verifier<K> for CpuVerifier<K> {
    type Error = VerifyError;

    fn verify(
        &mut self,
        method: Method,
        check: Check,
        batch: &Batch<'_>,
        out: &mut Outputs<'_>,
    ) -> Result<(), VerifyError> {
        CpuVerifier::verify(self, method, check, batch, out)
    }

    fn totals(&mut self) -> Result<Counters<K>, VerifyError> {
        Ok(CpuVerifier::totals(self))
    }

    fn support(&self) -> Support {
        Support::ALL
    }
}

/// Why a [`CpuReadback`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuReadbackError {
    /// `poll` was called with no readback started.
    NotStarted,
}

impl std::fmt::Display for CpuReadbackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotStarted => f.write_str("poll called with no readback in flight"),
        }
    }
}

impl std::error::Error for CpuReadbackError {}

/// [`Readback`] of a [`CpuVerifier`]'s counters. `start` copies them under the lock (so the
/// copy holds whole batches), `poll` hands that copy over, `flush` copies the current totals:
/// `verify` is synchronous, so everything submitted before is already counted.
#[derive(Debug)]
pub struct CpuReadback<const K: usize> {
    counters: Arc<Mutex<Counters<K>>>,
    pending: Option<Counters<K>>,
}

impl<const K: usize> Readback<K> for CpuReadback<K> {
    type Error = CpuReadbackError;

    fn start(&mut self) -> Result<(), CpuReadbackError> {
        self.pending = Some(*lock(&self.counters));
        Ok(())
    }

    fn poll(&mut self) -> Poll<Result<Counters<K>, CpuReadbackError>> {
        Poll::Ready(self.pending.take().ok_or(CpuReadbackError::NotStarted))
    }

    fn flush(&mut self) -> Result<Counters<K>, CpuReadbackError> {
        self.pending = None;
        Ok(*lock(&self.counters))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_core::verify::{Dims, Drafts, Streams};

    #[test]
    fn readback_follows_the_contract() {
        let v = CpuVerifier::<4>::new(1).unwrap();
        let mut r = v.readback();
        assert_eq!(r.poll(), Poll::Ready(Err(CpuReadbackError::NotStarted)));
        r.start().unwrap();
        let target = [0.0f32, 1.0, 0.0, 1.0];
        let batch = Batch::dense(
            Dims { vocab: 2, k_max: 1 },
            Drafts { k: &[1], ids: &[1] },
            &target,
            Streams {
                seed: &[1],
                offset: &[0],
            },
        );
        let (mut a, mut t) = ([0u32; 1], [0u32; 2]);
        v.verify(
            Method::Greedy,
            Check::Cheap,
            &batch,
            &mut Outputs {
                accepted: &mut a,
                tokens: &mut t,
            },
        )
        .unwrap();
        // The readback started before the batch: it shows the counters as they stood then.
        assert_eq!(r.poll(), Poll::Ready(Ok(Counters::ZERO)));
        let f = r.flush().unwrap();
        assert_eq!((f.drafts, f.accepted_tokens, f.emitted_tokens), (1, 1, 2));
        assert_eq!((a, t), ([1], [1, 1]));
    }
}
