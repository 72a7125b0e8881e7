//! A cheap two-sided bound on the softmax sum of a binary32 logits row ([`SumBound`]), for the
//! acceptance test of rejection sampling.
//!
//! An accepted position reads one probability of its row, `p(x) = RN(e_x / S)`, and compares
//! it with `U·q(x)`; the exact sum `S` (`exp_p` and the fixed-point pieces per id) costs about
//! twice this pass's work, and most rows of a request are accepted ones. This pass finds the
//! row's maximum `m` exactly (the rules' `m`) and a sum `S̃` with `S ∈ [S̃(1 − E), S̃(1 + E)]`;
//! where `U·q(x)` lies outside the probabilities that range allows, the test is decided with
//! the rules' bits, and only the other rows (about one in a thousand, plus every rejected
//! one) take the exact pass. The maximum and the sum come from one read of the row: a chunk
//! of ids is read for its maximum, then again from L1 for its weights, so the row streams
//! from memory once.
//!
//! Why `E` holds (`core/DETERMINISM.md` defines `e_v = exp_p(RN(z_v − m))`, `z_v = RN(l_v /
//! t)`, `S = RN64(Σ ⌊e_v·2⁶⁴⌋)·2⁻⁶⁴`): each id's rough weight is `exp_rough` of `RN(z_v − M)`
//! with `M ≤ m` the running maximum when its chunk was read, times one `exp_rough(RN(M − M'))`
//! per later rise of the maximum (`rescales` of them). The arguments' roundings move the
//! exponent by at most `(m − z_v)·2⁻²³` in all (they have one sign and sum to `z_v − m`):
//! below `2⁻¹⁶` where `m − z_v < 87`, and where it is larger both weights are below `e⁻⁸⁷`
//! (at most `V·2⁻¹²⁵` in all, against `S ≥ 1`: the maximum's weight is 1). `exp_rough` is within
//! `2⁻¹³` of `eˣ` and `exp_p` within `2⁻²⁰` (both checked on every binary32 `x ∈ (−87, 0]`,
//! `exp_rough_is_within_its_bound`); the binary32 lanes add at most 64 weights each before
//! they are emptied into binary64 (`< 2⁻¹⁸`), the floors and the final rounding of `S` cost
//! `V·2⁻⁶⁴` and `2⁻⁵³`. So `S̃ / S` lies within `(rescales + 2)·2⁻¹³ + 2⁻¹⁵` of 1, and
//! [`SumBound::width`] takes twice that, `(rescales + 3)·2⁻¹²`; `sum_bound_holds` checks it
//! on model-like, flat, rising (a rescale per chunk) and hostile rows.

use super::{E6, E24, INV_LN2, Isa, logit_max_range};

/// `ln 2` rounded to binary32 (one constant: the reduction's error, below `2⁻¹⁷` of the
/// result, is inside `exp_rough`'s bound).
const LN2: f32 = f32::from_bits(0x3F31_7218);

/// Blocks of `N` ids per chunk: a chunk is read twice (its maximum, then its weights), the
/// second time from L1 (`64·N` binary32 values: 8 KiB with AVX-512), and each binary32 lane
/// adds at most 64 weights.
const CHUNK_BLOCKS: usize = 64;

/// `eˣ` within `2⁻¹³` (relative) for binary32 `x ∈ (−87, 0]`, `0` for `x ≤ −87` and NaN (as
/// `exp_p`): the same range reduction, a degree-4 polynomial.
#[inline(always)]
pub(super) fn exp_rough(x: f32) -> f32 {
    let xc = if x > -87.0 { x } else { -87.0 };
    let xc = if xc < 0.0 { xc } else { 0.0 };
    let t = xc * INV_LN2;
    // SAFETY: xc ∈ [−87, 0], so t − 0.5 ∈ [−126.1, −0.5]: representable in i32 after
    // truncation.
    let n: i32 = unsafe { (t - 0.5).to_int_unchecked() };
    let nf = n as f32;
    let r = xc - nf * LN2;
    let mut p = E24;
    p = E6 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    let v = p * f32::from_bits(((n + 127) as u32) << 23);
    if x > -87.0 { v } else { 0.0 }
}

/// A logits row's softmax maximum and a bound on its exact softmax sum (module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SumBound {
    /// The row's softmax maximum, the rules' `m` (finite).
    pub m: f32,
    /// `S̃`.
    sum: f64,
    /// How often the running maximum rose over a nonzero sum.
    rescales: u32,
}

impl SumBound {
    /// `E`: the exact sum lies in `[S̃(1 − E), S̃(1 + E)]`.
    pub(crate) fn width(&self) -> f64 {
        f64::from(self.rescales.saturating_add(3)) * f64::from(f32::from_bits(0x3980_0000))
    }

    /// `(lo, hi)` with `lo ≤ RN32(e / S) ≤ hi` for the exact sum `S` (`e` a weight of the
    /// row: `Cut::p(e)` of its unfiltered softmax), `None` when the bound is too wide to
    /// decide anything (a row whose maximum rose thousands of times).
    pub(crate) fn p_range(&self, e: f32) -> Option<(f32, f32)> {
        let w = self.width();
        if w >= 0.25 {
            return None;
        }
        let (lo, hi) = (self.sum - self.sum * w, self.sum + self.sum * w);
        // Division by a larger divisor and both roundings are monotone.
        let e = f64::from(e);
        Some(((e / hi) as f32, (e / lo) as f32))
    }

    /// The bound's `S̃` (tests).
    #[cfg(test)]
    pub(super) fn sum(&self) -> f64 {
        self.sum
    }
}

/// [`SumBound`] of `row` at temperature `t > 0` with `isa`, `None` when its maximum is not
/// finite (no id has weight 1: the exact pass handles it). `known`: the row's softmax maximum
/// when a pass already found it (the chunks' maxima are then not read, nothing is rescaled).
pub(crate) fn sum_bound(isa: Isa, row: &[f32], t: f32, known: Option<f32>) -> Option<SumBound> {
    match isa {
        Isa::Portable => bound_range::<8>(row, t, known),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { bound_avx2(row, t, known) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { bound_avx512(row, t, known) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bound_avx2(row: &[f32], t: f32, known: Option<f32>) -> Option<SumBound> {
    bound_range::<16>(row, t, known)
}

#[cfg(specula_avx512)]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
fn bound_avx512(row: &[f32], t: f32, known: Option<f32>) -> Option<SumBound> {
    bound_range::<32>(row, t, known)
}

/// The running maximum and sum, and how they move when a larger `z` arrives.
struct Running {
    m: f32,
    sum: f64,
    rescales: u32,
}

impl Running {
    /// Raises the maximum to `z` if `z` is larger (NaN never is), rescaling the sum.
    #[inline(always)]
    fn raise(&mut self, z: f32) {
        if z > self.m {
            if self.sum > 0.0 {
                self.sum *= f64::from(exp_rough(self.m - z));
                self.rescales = self.rescales.saturating_add(1);
            }
            self.m = z;
        }
    }
}

#[inline(always)]
fn bound_range<const N: usize>(row: &[f32], t: f32, known: Option<f32>) -> Option<SumBound> {
    let len = row.len();
    let body = len - len % N;
    let mut run = Running {
        m: known.unwrap_or(f32::NEG_INFINITY),
        sum: 0.0,
        rescales: 0,
    };
    let mut s = 0;
    while s < body {
        let chunk = &row[s..body.min(s + CHUNK_BLOCKS * N)];
        if known.is_none() {
            // The chunk's largest logit divided by `t > 0` once: division is monotone, so it is
            // the largest `l / t`, as `softmax_max` finds the row's.
            run.raise(logit_max_range::<&[f32], N>(chunk) / t);
        }
        let m = run.m;
        let mut acc = [0f32; N];
        for block in chunk.chunks_exact(N) {
            let block: &[f32; N] = block.try_into().expect("N values");
            for i in 0..N {
                acc[i] += exp_rough(block[i] / t - m);
            }
        }
        for a in acc {
            run.sum += f64::from(a);
        }
        s += chunk.len();
    }
    for &l in &row[body..] {
        let z = l / t;
        run.raise(z);
        run.sum += f64::from(exp_rough(z - run.m));
    }
    run.m.is_finite().then_some(SumBound {
        m: run.m,
        sum: run.sum,
        rescales: run.rescales,
    })
}

#[cfg(test)]
mod tests;
