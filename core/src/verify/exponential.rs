//! The exponential variates of the sampling race and the acceptance uniform
//! (`core/DETERMINISM.md`, "Random variates").
//!
//! A race draw is a 64-bit word `x` (two Philox words: stream 1 gives the high half, stream 2 the
//! low half) read as the midpoint `v = (x + ½)·2⁻⁶⁴` of one of 2⁶⁴ equal cells of (0, 1), and
//! mapped to `E = −ln(1 − v)`, an exponential variate. `E` is never 0 and never `+∞`: it lies in
//! `[2⁻⁶⁵, 45.06]`. Near `E = 0`, where a tiny weight can win the race, the cells are
//! `2⁻⁶⁴` wide in `E` itself, so rows with mass `1 − 10⁻⁹` on one id sample their tail exactly
//! (the bound is derived in `DETERMINISM.md`).
//!
//! The map is evaluated in IEEE binary64 with `+ − × ÷`, exact bit manipulation and
//! round-to-nearest integer conversions only, in the order written, so every backend (Rust, CUDA,
//! HIP, the host-compiled kernel) gives the same bits. Its relative error is below
//! [`ETA`] everywhere (checked over every high word by a release-mode test).
//!
//! Why hand-written: no `libm` may be used (its results differ between platforms and GPU
//! toolkits), and the core is `no_std`.

/// An upper bound of the relative error of [`exponential`] against the exact `−ln(1 − v)` at the
/// cell midpoint: 2⁻⁴⁸. The derivation in `DETERMINISM.md` uses it; the exhaustive test checks it.
pub const ETA: f64 = 3.552_713_678_800_501e-15;

/// 1/19, 1/17, …, 1/3, 1 (the odd reciprocals of the `atanh` series, correctly rounded),
/// highest first: the order [`horner`] takes them in.
const ODD_RECIPROCALS: [f64; 10] = [
    f64::from_bits(0x3FAA_F286_BCA1_AF28),
    f64::from_bits(0x3FAE_1E1E_1E1E_1E1E),
    f64::from_bits(0x3FB1_1111_1111_1111),
    f64::from_bits(0x3FB3_B13B_13B1_3B14),
    f64::from_bits(0x3FB7_45D1_745D_1746),
    f64::from_bits(0x3FBC_71C7_1C71_C71C),
    f64::from_bits(0x3FC2_4924_9249_2492),
    f64::from_bits(0x3FC9_9999_9999_999A),
    f64::from_bits(0x3FD5_5555_5555_5555),
    1.0,
];
/// `ln 2` split so that `e × LN2_HI` is exact for `|e| < 2¹¹` (its low 21 bits are zero).
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
/// `ln 2 − LN2_HI`.
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// √2, rounded to nearest: the mantissa fold point.
const SQRT_2: f64 = f64::from_bits(0x3FF6_A09E_667F_3BCD);
/// 2⁻⁶⁴.
const TWO_M64: f64 = f64::from_bits(0x3BF0_0000_0000_0000);
/// 2⁻⁵³.
const TWO_M53: f64 = f64::from_bits(0x3CA0_0000_0000_0000);
/// `x` at and above which the map takes the logarithm branch (`v ≥ ¼`).
const BRANCH: u64 = 1 << 62;

/// `E = −ln(1 − v)` with `v = (x + ½)·2⁻⁶⁴`: the race's exponential variate of the 64-bit draw
/// `x`. Positive, finite, non-decreasing in `x`; relative error below [`ETA`].
///
/// ```
/// use specula_core::verify::exponential::exponential;
/// // The smallest E, 2⁻⁶⁵ (bits written out: Miri perturbs `powi` on purpose): never 0.
/// assert_eq!(exponential(0), f64::from_bits((1023 - 65) << 52));
/// assert!(exponential(u64::MAX) < 45.1); // the largest: never +∞
/// assert!((exponential(1 << 63) - core::f64::consts::LN_2).abs() < 1e-15); // v = ½
/// ```
#[inline(always)]
#[must_use]
pub fn exponential(x: u64) -> f64 {
    if x < BRANCH {
        // v < ¼: −ln(1 − v) = 2·atanh(s) with s = v / (2 − v) < 1/7, so no cancellation near
        // v = 0 and eight terms of the series reach 2⁻⁵⁴.
        let v = ((x as f64) + 0.5) * TWO_M64;
        let s = v / (2.0 - v);
        let z = s * s;
        (s + s) * horner(z, &ODD_RECIPROCALS[1..])
    } else {
        // v ≥ ¼: E = −ln u with u = 1 − v = (!x + ½)·2⁻⁶⁴ in (2⁻⁶⁵, ¾], computed exactly up to
        // the one rounding of `!x as f64`; u = 2ᵉ·m with m in [√½, √2] and ln m = 2·atanh(s),
        // s = (m − 1)/(m + 1), |s| ≤ 0.1716: nine terms reach 2⁻⁵⁵.
        let u = (((!x) as f64) + 0.5) * TWO_M64;
        let bits = u.to_bits();
        let mut e = ((bits >> 52) & 0x7FF) as i32 - 1023;
        let mut m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
        if m > SQRT_2 {
            m *= 0.5;
            e += 1;
        }
        let s = (m - 1.0) / (m + 1.0);
        let z = s * s;
        let ln_m = (s + s) * horner(z, &ODD_RECIPROCALS);
        let ef = e as f64;
        let ln_u = ef * LN2_HI + (ef * LN2_LO + ln_m);
        -ln_u
    }
}

/// The polynomial with coefficients `c` (highest first) at `z` by Horner's rule, `q = c + z·q`
/// from `q = c[0]`: the operations and their order are the rules' (`DETERMINISM.md`).
#[inline(always)]
fn horner(z: f64, c: &[f64]) -> f64 {
    let mut q = c[0];
    for &c in &c[1..] {
        q = c + z * q;
    }
    q
}

/// The 64-bit race draw of one vocabulary id: the stream-1 word high, the stream-2 word low.
#[inline(always)]
#[must_use]
pub fn draw(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

/// A lower bound of [`exponential`]`(draw(hi, lo))` for every `lo`, from the high word alone:
/// `(hi >> 8)·2⁻²⁴` (exact in `f32`).
///
/// `(hi >> 8)·2⁻²⁴ ≤ hi·2⁻³² < v ≤ −ln(1 − v)`, and the computed `E` is within [`ETA`] of
/// `−ln(1 − v)`, so `floor ≤ E·(1 + ETA)`. Skip filters (which decide that an id cannot win
/// without computing its stream-2 word) use it with a margin that covers `ETA`; they never
/// change a result.
#[inline(always)]
#[must_use]
pub fn exponential_floor(hi: u32) -> f32 {
    (hi >> 8) as f32 * f32::from_bits(0x3380_0000)
}

/// The acceptance uniform of a 64-bit stream-0 draw `x`: `U = ((x >> 11) | 1)·2⁻⁵³`, the
/// midpoint of one of 2⁵² equal cells of (0, 1) (exact in `f64`).
#[inline(always)]
#[must_use]
pub fn uniform53(x: u64) -> f64 {
    (((x >> 11) | 1) as f64) * TWO_M53
}

/// The rejection-sampling test: accept iff `U·pd < pt`, in `f64` (`pt`, `pd` converted exactly;
/// one rounding in the product, so the acceptance probability is `min(1, pt/pd)` within 2⁻⁵²).
/// NaN in either operand rejects.
#[inline(always)]
#[must_use]
pub fn accepts(x: u64, pt: f32, pd: f32) -> bool {
    uniform53(x) * f64::from(pd) < f64::from(pt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_and_branch_point() {
        assert_eq!(exponential(0), f64::from_bits(0x3BE0_0000_0000_0000)); // 2⁻⁶⁵
        let top = exponential(u64::MAX);
        assert!(top > 45.0 && top < 45.1, "{top}");
        // Both sides of the branch agree to the error bound.
        let below = exponential(BRANCH - 1);
        let at = exponential(BRANCH);
        let exact = -(0.75f64).ln();
        assert!(
            (below - exact).abs() <= 4.0 * ETA * exact,
            "{below} vs {exact}"
        );
        assert!((at - exact).abs() <= 4.0 * ETA * exact, "{at} vs {exact}");
        assert!(below <= at);
    }

    #[test]
    fn floor_is_below_every_low_word() {
        for hi in [0u32, 1, 255, 256, 0x8000_0000, 0xFFFF_FF00, u32::MAX] {
            let f = f64::from(exponential_floor(hi));
            for lo in [0u32, 1, u32::MAX] {
                assert!(
                    f <= exponential(draw(hi, lo)) * (1.0 + ETA),
                    "{hi:#x} {lo:#x}"
                );
            }
        }
    }

    #[test]
    fn acceptance_uniform_is_a_cell_midpoint() {
        assert_eq!(uniform53(0), TWO_M53);
        assert_eq!(uniform53(u64::MAX), 1.0 - TWO_M53);
        assert_eq!(uniform53(1 << 63), 0.5 + TWO_M53);
        assert!(accepts(0, 1.0, 1.0) && !accepts(u64::MAX, 0.5, 1.0));
        assert!(accepts(u64::MAX, 1.0, 1.0)); // U < 1: equal probabilities always accept
        assert!(!accepts(0, f32::NAN, 1.0) && !accepts(0, 1.0, f32::NAN));
        assert!(accepts(0, 1e-30, 0.0) && !accepts(0, 0.0, 0.0));
    }
}
