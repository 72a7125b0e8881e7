//! [`ChunkedOps`]: the row reductions written in fixed-width blocks so the compiler vectorises
//! them, returning exactly the bits of the reference [`ScalarOps`](specula_core::verify::ScalarOps).
//!
//! Each reduction keeps one running best (or sum) per lane of a block and merges the lanes at the
//! end. That is only allowed because the rules make every reduction order-independent: argmax and
//! the race are maxima of a total order on (key, −id), and the entropy is an integer sum.

// Lane loops index several arrays in lockstep by lane number: the shape the vectoriser wants.
#![allow(clippy::needless_range_loop)]

use specula_core::fmath::entropy_from_fixed;
use specula_core::fmath::entropy_term;
use specula_core::philox::{STREAM_RACE, counter, key};
use specula_core::verify::{RaceRng, RowOps, race_key};

/// Lanes of the argmax and entropy blocks.
const LANES: usize = 16;
/// Philox calls per race block (4 ids each).
const GROUPS: usize = 8;
/// Vocabulary ids per race block.
const BLOCK: usize = GROUPS * 4;

/// Vectorisable row reductions, bit-identical to the reference.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkedOps;

/// Merges `(key, id)` into `(best_key, best_id)` under "largest key, ties to the lowest id".
#[inline(always)]
fn better(key: f32, id: u32, best_key: f32, best_id: u32) -> bool {
    key > best_key || (key == best_key && id < best_id)
}

/// Race over `len` weights produced block by block by `fill(start, &mut block)`, which writes
/// the weights of ids `start .. start + BLOCK` (only the first `len − start` matter in the last
/// block).
#[inline(always)]
fn race_blocks(rng: RaceRng, len: usize, fill: impl Fn(usize, &mut [f32; BLOCK])) -> Option<u32> {
    let k = key(rng.seed);
    let mut best_key = [-1.0f32; BLOCK];
    let mut best_id = [u32::MAX; BLOCK];
    let mut w = [0f32; BLOCK];
    let mut start = 0usize;
    while start < len {
        fill(start, &mut w);
        // Philox for GROUPS consecutive groups, written lane-wise so the 32×32→64 multiplies
        // of all groups go through vector registers together.
        let mut c = [[0u32; GROUPS]; 4];
        let base = (start / 4) as u32;
        for g in 0..GROUPS {
            let ctr = counter(
                base.wrapping_add(g as u32),
                rng.position,
                STREAM_RACE,
                rng.offset,
            );
            c[0][g] = ctr[0];
            c[1][g] = ctr[1];
            c[2][g] = ctr[2];
            c[3][g] = ctr[3];
        }
        philox_lanes(&mut c, k);
        let n = (len - start).min(BLOCK);
        for i in 0..BLOCK {
            let key = if i < n {
                race_key(w[i], c[i & 3][i >> 2])
            } else {
                -1.0
            };
            // Within a lane ids only grow, so a strict `>` keeps the lowest id of equal keys.
            if key > best_key[i] {
                best_key[i] = key;
                best_id[i] = (start + i) as u32;
            }
        }
        start += BLOCK;
    }
    let (mut bk, mut bi) = (-1.0f32, u32::MAX);
    for i in 0..BLOCK {
        if better(best_key[i], best_id[i], bk, bi) {
            bk = best_key[i];
            bi = best_id[i];
        }
    }
    // Candidates have keys ≥ 0; −1 means no weight was > 0.
    if bk >= 0.0 { Some(bi) } else { None }
}

/// Philox4x32-10 on GROUPS counters at once (`c[word][group]`), same key for all.
#[inline(always)]
fn philox_lanes(c: &mut [[u32; GROUPS]; 4], key: [u32; 2]) {
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        for g in 0..GROUPS {
            let p0 = u64::from(0xD251_1F53u32) * u64::from(c[0][g]);
            let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c[2][g]);
            let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
            let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
            let n0 = hi1 ^ c[1][g] ^ k0;
            let n2 = hi0 ^ c[3][g] ^ k1;
            c[0][g] = n0;
            c[1][g] = lo1;
            c[2][g] = n2;
            c[3][g] = lo0;
        }
        if round < 9 {
            k0 = k0.wrapping_add(0x9E37_79B9);
            k1 = k1.wrapping_add(0xBB67_AE85);
        }
    }
}

/// Copies up to BLOCK values of `row` from `start`, zero-padding past its end.
#[inline(always)]
fn load(row: &[f32], start: usize, w: &mut [f32; BLOCK]) {
    let src = &row[start..];
    if src.len() >= BLOCK {
        w.copy_from_slice(&src[..BLOCK]);
    } else {
        w[..src.len()].copy_from_slice(src);
        w[src.len()..].fill(0.0);
    }
}

impl RowOps for ChunkedOps {
    fn argmax(&self, row: &[f32]) -> u32 {
        let mut best = [f32::NEG_INFINITY; LANES];
        let mut idx = [0u32; LANES];
        let chunks = row.chunks_exact(LANES);
        let tail = chunks.remainder();
        for (c, chunk) in chunks.enumerate() {
            let base = (c * LANES) as u32;
            for l in 0..LANES {
                // NaN compares false: it never replaces anything, i.e. it is −∞.
                if chunk[l] > best[l] {
                    best[l] = chunk[l];
                    idx[l] = base + l as u32;
                }
            }
        }
        let (mut bk, mut bi) = (f32::NEG_INFINITY, u32::MAX);
        for l in 0..LANES {
            // A lane that never beat −∞ has no id: skip it (keeps "no comparable value → 0").
            if best[l] > f32::NEG_INFINITY && better(best[l], idx[l], bk, bi) {
                bk = best[l];
                bi = idx[l];
            }
        }
        let tail_base = (row.len() - tail.len()) as u32;
        for (i, &x) in tail.iter().enumerate() {
            if x > bk {
                bk = x;
                bi = tail_base + i as u32;
            }
        }
        if bi == u32::MAX { 0 } else { bi }
    }

    fn entropy(&self, row: &[f32]) -> f32 {
        let mut sums = [0i64; LANES];
        let chunks = row.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for l in 0..LANES {
                sums[l] = sums[l].wrapping_add(entropy_term(chunk[l]));
            }
        }
        let mut sum = 0i64;
        for s in sums {
            sum = sum.wrapping_add(s);
        }
        for &p in tail {
            sum = sum.wrapping_add(entropy_term(p));
        }
        entropy_from_fixed(sum)
    }

    fn race(&self, rng: RaceRng, row: &[f32]) -> Option<u32> {
        race_blocks(rng, row.len(), |start, w| load(row, start, w))
    }

    fn race_residual(
        &self,
        rng: RaceRng,
        target: &[f32],
        draft: Option<&[f32]>,
        token: u32,
    ) -> Option<u32> {
        match draft {
            Some(d) => race_blocks(rng, target.len(), |start, w| {
                let mut dw = [0f32; BLOCK];
                load(target, start, w);
                load(d, start, &mut dw);
                for i in 0..BLOCK {
                    w[i] -= dw[i];
                }
            }),
            None => race_blocks(rng, target.len(), |start, w| {
                load(target, start, w);
                // `t − 0.0` is `t` bit for bit, so only the draft token's weight changes.
                let t = token as usize;
                if t >= start && t < start + BLOCK {
                    w[t - start] -= 1.0;
                }
            }),
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
        for len in [1usize, 3, 4, 15, 16, 17, 31, 32, 33, 64, 100, 257] {
            for mode in 0..4 {
                let mut row = Vec::with_capacity(len);
                for _ in 0..len {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let v = match mode {
                        0 => (x >> 8) as f32 / 16_777_216.0,
                        1 => specials[(x % specials.len() as u32) as usize],
                        2 => ((x >> 29) as f32) / 8.0, // many exact ties
                        _ => f32::NAN,
                    };
                    row.push(v);
                }
                out.push(row);
            }
        }
        out
    }

    #[test]
    fn chunked_ops_match_the_reference_bit_for_bit() {
        let s = ScalarOps;
        let c = ChunkedOps;
        for (r, row) in rows().iter().enumerate() {
            assert_eq!(s.argmax(row), c.argmax(row), "argmax row {r}: {row:?}");
            assert_eq!(
                s.entropy(row).to_bits(),
                c.entropy(row).to_bits(),
                "entropy row {r}"
            );
            let rng = RaceRng {
                seed: r as u64 * 77,
                offset: 5,
                position: (r % 3) as u32,
            };
            assert_eq!(s.race(rng, row), c.race(rng, row), "race row {r}");
            let token = (r * 7 % row.len()) as u32;
            assert_eq!(
                s.race_residual(rng, row, None, token),
                c.race_residual(rng, row, None, token),
                "one-hot residual row {r}"
            );
            let draft: Vec<f32> = row.iter().rev().copied().collect();
            assert_eq!(
                s.race_residual(rng, row, Some(&draft), token),
                c.race_residual(rng, row, Some(&draft), token),
                "residual row {r}"
            );
        }
    }
}
