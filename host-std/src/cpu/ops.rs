//! [`ChunkedOps`]: the row reductions written in fixed-width blocks so the compiler vectorises
//! them, returning exactly the bits of the reference [`ScalarOps`](specula_core::verify::ScalarOps).
//!
//! Each reduction keeps one running best (or sum) per lane of a block and merges the lanes at the
//! end. That is only allowed because the rules make every reduction order-independent: argmax and
//! the race are maxima of a total order on (key, −id), and the entropy is an integer sum. The
//! same property lets [`SplitOps`] cut one row into ranges for several threads.

use super::kernels::{self, Best, Isa, OneHot, Residual, Row, Weights};
use super::tree::TreeRows;
use specula_core::verify::fmath::entropy_from_fixed;
use specula_core::verify::{RaceRng, RowOps, Softmax};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Vectorisable row reductions, bit-identical to the reference, on the calling thread.
///
/// The kernels run with the widest instruction set the CPU offers (AVX-512 or AVX2 on x86-64,
/// detected once per process), or the target's baseline.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkedOps;

impl RowOps for ChunkedOps {
    fn argmax(&self, row: &[f32]) -> u32 {
        SplitOps::single().argmax(row)
    }
    fn entropy(&self, row: &[f32]) -> f32 {
        SplitOps::single().entropy(row)
    }
    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
        SplitOps::single().race(rng, row)
    }
    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32> {
        SplitOps::single().race_residual(rng, target, draft, token)
    }

    // The vectorised tree reductions on the calling thread; a logits row's softmax is reduced
    // anew by each call (no row is kept between calls).
    fn race_excluding(&self, rng: RaceRng, row: &[f32], tried: &[u32]) -> Option<u32> {
        TreeRows::new(SplitOps::single()).race_excluding(rng, row, tried)
    }
    fn race_speculative(
        &self,
        rng: RaceRng,
        row: &[f32],
        drafts: &[&[f32]],
        z: &[f64],
    ) -> Option<u32> {
        TreeRows::new(SplitOps::single()).race_speculative(rng, row, drafts, z)
    }
    fn softmax(&self, row: &[f32], t: f32) -> Softmax {
        TreeRows::new(SplitOps::single()).softmax(row, t)
    }
    fn softmax_argmax(&self, row: &[f32], sm: &Softmax) -> u32 {
        TreeRows::new(SplitOps::single()).softmax_argmax(row, sm)
    }
    fn with_softmax_probs(&self, row: &[f32], sm: &Softmax, f: &mut dyn FnMut(&[f32])) {
        TreeRows::new(SplitOps::single()).with_softmax_probs(row, sm, f);
    }
    fn softmax_entropy(&self, row: &[f32], sm: &Softmax) -> f32 {
        TreeRows::new(SplitOps::single()).softmax_entropy(row, sm)
    }
    fn softmax_race(&self, rng: RaceRng, row: &[f32], sm: &Softmax, tried: &[u32]) -> Option<u32> {
        TreeRows::new(SplitOps::single()).softmax_race(rng, row, sm, tried)
    }
}

/// Ids per range below which a row is not cut further: a rayon task costs a few microseconds,
/// about what the race needs for this many ids.
const MIN_PIECE: usize = 4096;
/// Ranges per thread: small ranges let whichever threads are free share the row evenly.
const RANGES_PER_THREAD: usize = 4;
/// Pieces start at multiples of this: a multiple of every kernel block (so only a row's last
/// block is partial) and of 4 (Philox groups).
const ALIGN: usize = 64;

/// The row reductions of [`ChunkedOps`], each row shared by the calling thread and up to
/// `threads − 1` tasks on `pool` (used when a batch has fewer requests than threads, so one
/// request can use every core without first handing the whole request over to the pool).
/// Results are merged under the same total orders, so they are the same bits for any cut.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitOps<'p> {
    isa: Isa,
    threads: usize,
    min_piece: usize,
    pool: Option<&'p rayon::ThreadPool>,
}

impl<'p> SplitOps<'p> {
    /// Rows are shared by up to `threads` threads of `pool` (without a pool, or with
    /// `threads ≤ 1`, never cut).
    pub(crate) fn new(threads: usize, pool: Option<&'p rayon::ThreadPool>) -> Self {
        Self {
            isa: Isa::detect(),
            threads,
            min_piece: MIN_PIECE,
            pool,
        }
    }

    /// Rows on the calling thread alone.
    pub(crate) fn single() -> Self {
        Self::new(1, None)
    }

    /// The instruction set the kernels run with.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// Kernels of `isa`; with `threads > 1`, rows cut into ranges as small as the kernels
    /// allow, so that even short test rows are shared.
    #[cfg(test)]
    pub(crate) fn for_test(isa: Isa, threads: usize, pool: Option<&'p rayon::ThreadPool>) -> Self {
        Self {
            isa,
            threads,
            min_piece: ALIGN,
            pool,
        }
    }

    /// The range length for a row of `len` ids, or `None` to run it in one range.
    fn piece_len(&self, len: usize) -> Option<usize> {
        if self.threads <= 1 {
            return None;
        }
        let ranges = (self.threads * RANGES_PER_THREAD).min(len / self.min_piece);
        (ranges > 1).then(|| len.div_ceil(ranges).next_multiple_of(ALIGN))
    }

    /// Maps every range of the row through `f` and merges the results with `merge`.
    ///
    /// The calling thread and up to `threads − 1` pool tasks claim ranges from a shared counter
    /// until none is left, so a task that a busy pool starts late finds nothing to do and the
    /// caller never waits for more than the ranges already being worked on.
    fn reduce<T: Send + Sync + Copy>(
        &self,
        len: usize,
        identity: T,
        f: impl Fn(usize, usize) -> T + Sync,
        merge: impl Fn(T, T) -> T + Sync,
    ) -> T {
        let (Some(piece), Some(pool)) = (self.piece_len(len), self.pool) else {
            return f(0, len);
        };
        let ranges = len.div_ceil(piece);
        let next = AtomicUsize::new(0);
        let work = |slot: &mut T| {
            let mut acc = identity;
            loop {
                let p = next.fetch_add(1, Ordering::Relaxed);
                if p >= ranges {
                    break;
                }
                acc = merge(acc, f(p * piece, ((p + 1) * piece).min(len)));
            }
            *slot = acc;
        };
        let helpers = self.threads.min(pool.current_num_threads()).min(ranges) - 1;
        let mut out = vec![identity; helpers + 1];
        let (first, rest) = out.split_first_mut().expect("one slot at least");
        let work = &work;
        pool.in_place_scope(|s| {
            for slot in rest {
                s.spawn(move |_| work(slot));
            }
            work(first);
        });
        out.into_iter().fold(identity, merge)
    }

    pub(crate) fn race_with<W: Weights + Sync>(&self, rng: RaceRng, w: W) -> Option<u32> {
        let isa = self.isa;
        let best = self.reduce(
            w.len(),
            Best::NO_RACE,
            |s, e| kernels::race(isa, rng, w, s, e),
            Best::merge,
        );
        // Candidates have keys ≥ 0; −1 means no weight was > 0.
        (best.key >= 0.0).then_some(best.id)
    }
}

impl RowOps for SplitOps<'_> {
    fn argmax(&self, row: &[f32]) -> u32 {
        // Not split: argmax reads at memory speed (15–20 µs for a 128k row on one thread), less
        // than waking the pool costs. Measured with `specula bench --batch 1 --k 4 --method
        // greedy --threads 2`: split, 55 µs per 128k request; unsplit, 20 µs.
        // The race and the entropy do ~10× more work per id and gain from the split.
        let best = kernels::argmax(self.isa, row, 0, row.len());
        // No value above −∞ (all NaN or −∞): the rules say 0.
        if best.id == u32::MAX { 0 } else { best.id }
    }

    fn entropy(&self, row: &[f32]) -> f32 {
        let isa = self.isa;
        let sum = self.reduce(
            row.len(),
            0i64,
            |s, e| kernels::entropy_sum(isa, row, s, e),
            i64::wrapping_add,
        );
        entropy_from_fixed(sum)
    }

    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
        self.race_with(rng, Row(row))
    }

    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32> {
        match draft {
            Some(draft) => self.race_with(rng, Residual { target, draft }),
            None => self.race_with(rng, OneHot { target, token }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_core::verify::ScalarOps;

    fn rows() -> Vec<Vec<f32>> {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            -1.0,
            1e-40,
            f32::MAX,
            0.25,
        ];
        let mut out = Vec::new();
        let mut x = 0x1234_5678u32;
        for len in [
            1usize, 3, 4, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 4099, 20_000,
        ] {
            for mode in 0..6 {
                let mut row = Vec::with_capacity(len);
                for _ in 0..len {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let v = match mode {
                        0 => (x >> 8) as f32 / 16_777_216.0,
                        1 => specials[(x % specials.len() as u32) as usize],
                        2 => ((x >> 29) as f32) / 8.0, // many exact ties
                        3 => f32::NAN,
                        // Tiny and subnormal weights: the skip bound near underflow.
                        4 => f32::from_bits(x >> 9) * 0.5,
                        // Normalised, mostly zero: blocks without a candidate.
                        _ => {
                            if x % 16 == 0 {
                                (x >> 8) as f32 / 16_777_216.0 / len as f32
                            } else {
                                0.0
                            }
                        }
                    };
                    row.push(v);
                }
                out.push(row);
            }
        }
        out
    }

    fn check(name: &str, ops: &impl RowOps) {
        let s = ScalarOps;
        for (r, row) in rows().iter().enumerate() {
            assert_eq!(s.argmax(row), ops.argmax(row), "{name} argmax row {r}");
            assert_eq!(
                s.entropy(row).to_bits(),
                ops.entropy(row).to_bits(),
                "{name} entropy row {r}"
            );
            let rng = RaceRng {
                seed: r as u64 * 77,
                offset: 5,
                position: (r % 3) as u32,
            };
            assert_eq!(s.race(rng, row), ops.race(rng, row), "{name} race row {r}");
            let token = (r * 7 % row.len()) as u32;
            assert_eq!(
                s.race_residual(rng, row, None, token),
                ops.race_residual(rng, row, None, token),
                "{name} one-hot residual row {r}"
            );
            let draft: Vec<f32> = row.iter().rev().copied().collect();
            assert_eq!(
                s.race_residual(rng, row, Some(&draft), token),
                ops.race_residual(rng, row, Some(&draft), token),
                "{name} residual row {r}"
            );
        }
    }

    #[test]
    fn chunked_ops_match_the_reference_bit_for_bit() {
        check("chunked", &ChunkedOps);
    }

    #[test]
    fn every_instruction_set_matches_the_reference() {
        for isa in Isa::available() {
            let ops = SplitOps {
                isa,
                threads: 1,
                min_piece: MIN_PIECE,
                pool: None,
            };
            check(&format!("{isa:?}"), &ops);
        }
    }

    #[test]
    fn split_rows_match_the_reference() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for isa in Isa::available() {
            for threads in [2, 3, 7] {
                // Small ranges, so even the short test rows are cut, with a partial last range.
                let ops = SplitOps {
                    isa,
                    threads,
                    min_piece: ALIGN,
                    pool: Some(&pool),
                };
                check(&format!("{isa:?} x{threads}"), &ops);
            }
        }
    }
}
