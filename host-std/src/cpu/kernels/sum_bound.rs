//! A cheap two-sided bound on the softmax sum of a logits row ([`SumBound`]; binary32, bf16 or
//! f16), for the acceptance test of rejection sampling.
//!
//! An accepted position reads one probability of its row, `p(x) = RN(e_x / S)`, and compares
//! it with `U·q(x)`; the exact sum `S` (`exp_p` with its division and the fixed-point pieces
//! per id) costs about three times this pass's work, and most rows of a request are accepted
//! ones. This pass finds the row's maximum `m` exactly (the rules' `m`) and a sum `S̃` with
//! `S ∈ [S̃(1 − E), S̃(1 + E)]`; where `U·q(x)` lies outside the probabilities that range
//! allows, the test is decided with the rules' bits, and only the other rows (about one in a
//! thousand, plus every rejected one) take the exact pass. The maximum and the sum come from
//! one read of the row: a chunk of ids is read for its maximum, then again from L1 for its
//! weights, so the row streams from memory once. Per id: one multiply-add for the base-2
//! exponent (no division by `t`), a degree-3 polynomial, an exponent add.
//!
//! Why `E` holds (`core/DETERMINISM.md` defines `e_v = exp_p(RN(z_v − m))`, `z_v = RN(l_v /
//! t)`, `S = RN64(Σ ⌊e_v·2⁶⁴⌋)·2⁻⁶⁴`): each id's rough weight is `exp2_rough(Y_v)`, `Y_v =
//! l_v·c − RN(M·log₂e)` in binary32 (`c = RN(log₂e / t)`; fused where the instruction set has
//! FMA, rounded twice otherwise), `M ≤ m` the running maximum when its chunk was read, times
//! one `exp2_rough(RN(RN(M − M')·log₂e))` per later rise of the maximum to `M'` (`rescales` of
//! them). Against the rules' exponent `x_v = RN(z_v − m)`, `Y_v·ln 2` differs by the roundings
//! of `log₂e`, `c`, the product and the difference (`2⁻²⁴` relative each, on `|z_v|`, `|M|`,
//! `|z_v − M|`), the rules' own two, and the rescale arguments' (on rises summing to at most
//! `m − z_v`); with `|z_v| ≤ |M| + |z_v − M|`, at most `9·2⁻²⁴·(|M| + m − z_v)` in all (a
//! subnormal intermediate errs by at most `2⁻¹⁴⁹`). Where `m − z_v ≤ 88` that is at most
//! `9·2⁻²⁴·(reach + 88)`, `reach` the largest `|M|` the weights were taken against; where it
//! is larger both weights are below `2⁻¹²⁴` (`exp2_rough` clamps its argument at `−125`,
//! `exp_p` gives 0 below `−87`; a rise of the maximum past that drops the sum so far), at
//! most `V·2⁻¹²⁴` in all, against `S ≥ 1` (the maximum's weight is 1). `exp2_rough` is within
//! `2⁻¹³` of `2ʸ` and `exp_p` within `2⁻²⁰` of `eˣ` (checked on every binary32 argument,
//! `exp_rough_is_within_its_bound`); the binary32 lanes add at most 64 weights each before
//! they are emptied into binary64 (`< 2⁻¹⁸`), the floors and the final rounding of `S` cost
//! `V·2⁻⁶⁴` and `2⁻⁵³`. So `S̃ / S` lies within `(rescales + 2)·2⁻¹³ + 2⁻¹⁵ +
//! 9.01·2⁻²⁴·(reach + 88)` of 1, and [`SumBound::width`] takes twice that or more,
//! `(rescales + 3)·2⁻¹² + (reach + 88)·2⁻¹⁹`; `sum_bound_holds` checks it on model-like,
//! flat, rising (a rescale per chunk), wide (`|m|` near 10⁶) and hostile rows in all three
//! formats. A bound of width `≥ ¼` (`reach` beyond about 2¹⁷) is not used
//! ([`SumBound::p_range`]), so `Y_v` stays below 4 wherever it is.

#[cfg(specula_avx512)]
use super::F16Wide512;
#[cfg(target_arch = "x86_64")]
use super::{Bf16Pairs, F16Wide, Half16};
use super::{Isa, LogitRow};
use specula_core::verify::softmax_max;

/// `log₂ e` rounded to binary32.
const LOG2E: f32 = f32::from_bits(0x3FB8_AA3B);

/// `1.5·2²³`: adding it rounds a binary32 `|y| < 2²²` to an integer (to nearest), which the
/// sum then holds in its low significand bits.
const ROUND: f32 = 12_582_912.0;

/// The degree-3 polynomial within `2⁻¹³·⁷` (relative) of `2ᶠ` on `f ∈ [−½, ½]` (a minimax fit
/// of the relative error, rounded to binary32; `exp_rough_is_within_its_bound` checks the
/// result, roundings included, on every argument).
const P0: f32 = f32::from_bits(0x3F7F_FB4A);
const P1: f32 = f32::from_bits(0x3F31_798D);
const P2: f32 = f32::from_bits(0x3E78_6EF8);
const P3: f32 = f32::from_bits(0x3D61_FB70);

/// Blocks of `N` ids per chunk: a chunk is read twice (its maximum, then its weights), the
/// second time from L1 (`64·N` binary32 values: 8 KiB with AVX-512), and each binary32 lane
/// adds at most 64 weights.
const CHUNK_BLOCKS: usize = 64;

/// `2ʸ` within `2⁻¹³` (relative) for binary32 `y ∈ [−125, 4]`; `y < −125` and NaN count as
/// `−125` (a weight below `2⁻¹²⁴`, where the rules' is at most that: module docs). Range
/// reduction to `y = n + f`, `f ∈ [−½, ½]`, the polynomial, and `n` added to the exponent
/// bits (the result stays normal: `n ≥ −125`, the polynomial above `½`).
/// `FMA`: whether the polynomial's steps are fused (where the instruction set has FMA; without
/// it `mul_add` is a library call): the bound holds either way.
#[inline(always)]
pub(super) fn exp2_rough<const FMA: bool>(y: f32) -> f32 {
    let y = if y > -125.0 { y } else { -125.0 };
    let k = y + ROUND;
    let f = y - (k - ROUND);
    let mut p = P3;
    p = madd::<FMA>(f, p, P2);
    p = madd::<FMA>(f, p, P1);
    p = madd::<FMA>(f, p, P0);
    // The low bits of `k` hold `n` (two's complement against ROUND's).
    let n = k.to_bits().wrapping_sub(ROUND.to_bits());
    f32::from_bits(p.to_bits().wrapping_add(n << 23))
}

/// `a·b + c`, fused or not.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
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
    /// The largest `|M|` of a running maximum the weights were taken against.
    reach: f32,
}

impl SumBound {
    /// `E`: the exact sum lies in `[S̃(1 − E), S̃(1 + E)]`.
    pub(crate) fn width(&self) -> f64 {
        width_of(self.rescales, self.reach)
    }

    /// `(lo, hi)` with `lo ≤ RN32(e / S) ≤ hi` for the exact sum `S` (`e` a weight of the
    /// row: `Cut::p(e)` of its unfiltered softmax), `None` when the bound is too wide to
    /// decide anything (a row whose maximum rose thousands of times, or whose `|m|` is in the
    /// hundred thousands).
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

/// [`SumBound::width`] of a bound with `rescales` rises of its maximum and `reach`.
fn width_of(rescales: u32, reach: f32) -> f64 {
    f64::from(rescales.saturating_add(3)) * f64::from(f32::from_bits(0x3980_0000))
        + (f64::from(reach) + 88.0) * f64::from(f32::from_bits(0x3600_0000))
}

/// [`SumBound`] of `row` at temperature `t > 0` with `isa`, `None` when its maximum is not
/// finite (no id has weight 1: the exact pass handles it) or `log₂ e / t` is not a normal
/// binary32 number. `known`: the row's softmax maximum when a pass already found it (the
/// chunks' maxima are then not read, nothing is rescaled).
pub(crate) fn sum_bound<R: LogitRow>(
    isa: Isa,
    row: R,
    t: f32,
    known: Option<f32>,
) -> Option<SumBound> {
    bound::<R, false>(isa, row, t, known, f32::INFINITY).map(|(b, _)| b)
}

/// The mass above a weight: for a drafted id of weight `e < 1` on a row of softmax maximum
/// `m`, [`SumBound`] and an upper bound `B` of `Σ e_v` over the ids with `e_v > e` (in the
/// units of `S̃`): a top-p filter certainly keeps the id when `B` lies below `top_p` of the
/// sum ([`MassAbove::keeps`]). `None` as [`sum_bound`].
pub(crate) fn mass_above<R: LogitRow>(
    isa: Isa,
    row: R,
    t: f32,
    m: f32,
    e: f32,
) -> Option<MassAbove> {
    // Every id with `e_v > e` has a rough weight above `e·(1 − width)`: each rough weight
    // is within the width of its weight too (module docs: the width is more than twice the
    // per-id error), and the probe is rounded below that.
    let probe = (f64::from(e) * (1.0 - 2.0 * width_of(0, m.abs()))) as f32;
    let (bound, above) = bound::<R, true>(isa, row, t, Some(m), probe)?;
    Some(MassAbove { bound, above })
}

/// What [`mass_above`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MassAbove {
    /// The row's bound.
    pub bound: SumBound,
    /// The rough weights above the probe, summed as `S̃` is.
    above: f64,
}

impl MassAbove {
    /// Whether top-p `top_p` alone certainly keeps the id (`core/DETERMINISM.md`: kept when
    /// the mass of the larger weights stays below `top_p·F`): the larger weights' exact mass
    /// is at most `above·(1 + 2⁻¹⁷)/(1 − width)` (their rough weights are within the width,
    /// the lanes' sums within `2⁻¹⁸`), the target at least `top_p·S̃(1 − width)(1 − 2⁻⁵⁰)`.
    pub(crate) fn keeps(&self, top_p: f32) -> bool {
        let w = self.bound.width();
        if w >= 0.25 {
            return false;
        }
        let most = self.above * (1.0 + f64::from(f32::from_bits(0x3700_0000))) / (1.0 - w);
        let least = f64::from(top_p) * self.bound.sum * (1.0 - w) * (1.0 - 2f64.powi(-50));
        most < least
    }
}

/// [`sum_bound`] (and with `PROBE` the sum of the rough weights above `probe`, for a known
/// maximum) on `isa`.
fn bound<R: LogitRow, const PROBE: bool>(
    isa: Isa,
    row: R,
    t: f32,
    known: Option<f32>,
    probe: f32,
) -> Option<(SumBound, f64)> {
    match isa {
        Isa::Portable => bound_range::<R, 8, false, PROBE>(row, t, known, probe),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!` confirmed
        // avx2, fma and f16c.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { bound_avx2::<R, PROBE>(row, t, known, probe) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { bound_avx512::<R, PROBE>(row, t, known, probe) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn bound_avx2<R: LogitRow, const PROBE: bool>(
    row: R,
    t: f32,
    known: Option<f32>,
    probe: f32,
) -> Option<(SumBound, f64)> {
    bound_x86::<R, 16, PROBE>(row, t, known, probe)
}

#[cfg(specula_avx512)]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
fn bound_avx512<R: LogitRow, const PROBE: bool>(
    row: R,
    t: f32,
    known: Option<f32>,
    probe: f32,
) -> Option<(SumBound, f64)> {
    if let Some((Half16::F16, bits)) = row.half_bits() {
        return bound_range::<F16Wide512<'_>, 32, true, PROBE>(F16Wide512(bits), t, known, probe);
    }
    bound_x86::<R, 32, PROBE>(row, t, known, probe)
}

/// The bound with FMA, f16 rows widened by F16C instead of the lane code ([`F16Wide`]) and bf16
/// rows two ids a 32-bit word ([`Bf16Pairs`]): both callers enable FMA and F16C (AVX-512F
/// implies them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bound_x86<R: LogitRow, const N: usize, const PROBE: bool>(
    row: R,
    t: f32,
    known: Option<f32>,
    probe: f32,
) -> Option<(SumBound, f64)> {
    match row.half_bits() {
        Some((Half16::F16, bits)) => {
            return bound_range::<F16Wide<'_>, N, true, PROBE>(F16Wide(bits), t, known, probe);
        }
        // The even ids of a block before its odd ones ([`Bf16Pairs`]): each lane still adds
        // at most 64 weights and each id's weight is the same function of its value, so the
        // bound's proof holds id by id (the lanes' sums are a bound, not the rules' bits); the
        // chunk's maximum is the largest value whichever lane holds it, NaN never winning. Only
        // where that value is a zero of both signs may `m`'s sign differ from the id-order
        // lanes' (as it already could between chunks, where the first chunk's zero stays):
        // `RN(z − m)` then differs only in the sign of a zero, and `exp_p(±0)` is 1 both ways.
        // The tail is read in id order as before.
        Some((Half16::Bf16, bits)) => {
            return bound_range::<Bf16Pairs<'_>, N, true, PROBE>(Bf16Pairs(bits), t, known, probe);
        }
        None => {}
    }
    bound_range::<R, N, true, PROBE>(row, t, known, probe)
}

/// The running maximum and sum, and how they move when a larger `z` arrives.
struct Running {
    m: f32,
    sum: f64,
    rescales: u32,
    reach: f32,
    /// The rough weights above `probe` (with a known maximum only: never rescaled).
    probe: f32,
    above: f64,
}

impl Running {
    /// Raises the maximum to `z` if `z` is larger (NaN never is), rescaling the sum.
    #[inline(always)]
    fn raise(&mut self, z: f32) {
        if z > self.m {
            let y = (self.m - z) * LOG2E;
            if y <= -125.0 {
                // Every weight so far is below `2⁻¹²⁴` of the new maximum's (module docs).
                self.sum = 0.0;
            } else if self.sum > 0.0 {
                self.sum *= f64::from(exp2_rough::<false>(y));
                self.rescales = self.rescales.saturating_add(1);
            }
            self.m = z;
        }
    }

    /// Adds the rough weights of the ids in `blocks` (`c = log₂ e / t`), against the current
    /// maximum.
    #[inline(always)]
    fn add<const N: usize, const FMA: bool, const PROBE: bool>(
        &mut self,
        c: f32,
        blocks: impl Iterator<Item = [f32; N]>,
    ) {
        if self.m == f32::NEG_INFINITY {
            // Every id so far is −∞ or NaN: weight 0.
            return;
        }
        self.reach = self.reach.max(self.m.abs());
        let mc = self.m * LOG2E;
        let (mut acc, mut hi) = ([0f32; N], [0f32; N]);
        for l in blocks {
            for i in 0..N {
                let w = exp2_rough::<FMA>(madd::<FMA>(l[i], c, -mc));
                acc[i] += w;
                if PROBE {
                    hi[i] += if w > self.probe { w } else { 0.0 };
                }
            }
        }
        for (a, h) in acc.into_iter().zip(hi) {
            self.sum += f64::from(a);
            self.above += f64::from(h);
        }
    }
}

#[inline(always)]
fn bound_range<R: LogitRow, const N: usize, const FMA: bool, const PROBE: bool>(
    row: R,
    t: f32,
    known: Option<f32>,
    probe: f32,
) -> Option<(SumBound, f64)> {
    let c = LOG2E / t;
    if !c.is_normal() {
        return None;
    }
    let len = row.len();
    let body = len - len % N;
    let mut run = Running {
        m: known.unwrap_or(f32::NEG_INFINITY),
        sum: 0.0,
        rescales: 0,
        reach: 0.0,
        probe,
        above: 0.0,
    };
    let mut s = 0;
    while s < body {
        let end = body.min(s + CHUNK_BLOCKS * N);
        if known.is_none() {
            // The chunk's largest logit divided by `t > 0` once: division is monotone, so it is
            // the largest `l / t`, as `softmax_max` finds the row's (NaN never wins).
            let mut mx = [f32::NEG_INFINITY; N];
            for b in (s..end).step_by(N) {
                let l: [f32; N] = row.block(b);
                for i in 0..N {
                    mx[i] = if l[i] > mx[i] { l[i] } else { mx[i] };
                }
            }
            run.raise(mx.into_iter().fold(f32::NEG_INFINITY, softmax_max) / t);
        }
        // The next chunk is asked for while this one's weights are computed: the row's first
        // read (from memory) then overlaps the arithmetic instead of following it (the chunk's
        // maximum loop stalled on its loads for about half the pass's time).
        let ahead = end - s;
        run.add::<N, FMA, PROBE>(
            c,
            (s..end).step_by(N).map(|b| {
                row.prefetch::<N>(b + ahead);
                row.block(b)
            }),
        );
        s = end;
    }
    for i in body..len {
        run.raise(row.at(i) / t);
        run.add::<1, FMA, PROBE>(c, std::iter::once([row.at(i)]));
    }
    // A probe's sum is never rescaled: it needs the maximum given.
    debug_assert!(!PROBE || known.is_some());
    run.m.is_finite().then_some((
        SumBound {
            m: run.m,
            sum: run.sum,
            rescales: run.rescales,
            reach: run.reach,
        },
        run.above,
    ))
}

#[cfg(test)]
mod tests;
