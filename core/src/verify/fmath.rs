//! Portable, bit-reproducible `ln`, `exp` and entropy for the verification rules
//! (`core/DETERMINISM.md`).
//!
//! Every function uses only IEEE-754 binary32 `+ − × ÷`, comparisons, bit manipulation and
//! exactly defined conversions, evaluated in the order the document writes them. Rust never
//! contracts `a × b + c` into an FMA, so these give the same bits on every target, and a GPU
//! kernel compiled without FMA contraction gives the same bits too. Constants are written as
//! bit patterns, as the document gives them, so no decimal-to-binary rounding can differ.

const SQRT_2: f32 = f32::from_bits(0x3FB5_04F3);
const C3: f32 = f32::from_bits(0x3F2A_AAAB);
const C5: f32 = f32::from_bits(0x3ECC_CCCD);
const C7: f32 = f32::from_bits(0x3E92_4925);
const C9: f32 = f32::from_bits(0x3E63_8E39);
const LN2: f32 = f32::from_bits(0x3F31_7218);
const INV_LN2: f32 = f32::from_bits(0x3FB8_AA3B);
const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
const LN2_LO: f32 = f32::from_bits(0x35BF_BE8E);
const E720: f32 = f32::from_bits(0x3AB6_0B61);
const E120: f32 = f32::from_bits(0x3C08_8889);
const E24: f32 = f32::from_bits(0x3D2A_AAAB);
const E6: f32 = f32::from_bits(0x3E2A_AAAB);
/// 2⁴⁰, the scale of the fixed-point entropy terms.
const TWO_40: f32 = f32::from_bits(0x5380_0000);
/// 2⁻⁴⁰.
const TWO_M40: f32 = f32::from_bits(0x2B80_0000);

/// Natural logarithm for normal, positive, finite `x` (error about 1 ulp near 1, a few ulp
/// elsewhere). Other inputs give an unspecified but deterministic value; callers never pass them.
#[inline(always)]
#[must_use]
pub fn ln_p(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xFF) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007F_FFFF) | 0x3F80_0000);
    if m > SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let mut q = C9;
    q = C7 + z * q;
    q = C5 + z * q;
    q = C3 + z * q;
    q = 2.0 + z * q;
    (e as f32) * LN2 + s * q
}

/// `eˣ`: 0 for `x ≤ −87` (and NaN), `+∞` for `x > 88`, otherwise a degree-6 polynomial on the
/// reduced argument scaled by an exact power of two.
#[inline(always)]
#[must_use]
// The negated comparison is the document's: NaN must take the `return 0` branch.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn exp_p(x: f32) -> f32 {
    if !(x > -87.0) {
        return 0.0;
    }
    if x > 88.0 {
        // Beyond this 2ⁿ (n = 128) has no normal encoding; e⁸⁸ ≈ 1.65e38 is already half of
        // f32::MAX. Reached only when H < 0, i.e. a row holding values above 1.
        return f32::INFINITY;
    }
    let t = x * INV_LN2;
    let n = if t < 0.0 {
        (t - 0.5) as i32
    } else {
        (t + 0.5) as i32
    };
    let nf = n as f32;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    let mut p = E720;
    p = E120 + r * p;
    p = E24 + r * p;
    p = E6 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    if n < -126 {
        return 0.0;
    }
    p * f32::from_bits(((n + 127) as u32) << 23)
}

/// One entropy term in fixed point: `(−(p × ln_p(p)) × 2⁴⁰) as i64` for `p ≥ f32::MIN_POSITIVE`
/// (normal positive values and `+∞`), 0 for anything else (zero, subnormal, negative, NaN).
///
/// The conversion saturates (Rust's `as`): a term at or beyond ±2²³, possible only for
/// `p > 1`, becomes `i64::MAX` or `i64::MIN`. `+∞` follows the same rule (`ln_p(+∞)` is
/// `128 × LN2` by its bits, the term `−∞`): `i64::MIN`, as for `f32::MAX`. Counting `+∞` like
/// the values next to it lets a GPU kernel drop a per-element range test (`core/DETERMINISM.md`).
#[inline(always)]
#[must_use]
pub fn entropy_term(p: f32) -> i64 {
    if p >= f32::MIN_POSITIVE {
        let term = -(p * ln_p(p));
        (term * TWO_40) as i64
    } else {
        0
    }
}

/// `H` from the wrapping sum of [`entropy_term`]s: `(sum as f32) × 2⁻⁴⁰`.
#[inline(always)]
#[must_use]
pub fn entropy_from_fixed(sum: i64) -> f32 {
    (sum as f32) * TWO_M40
}

/// Order-independent entropy of a row (natural log): the fixed-point terms are summed as
/// wrapping integers, so any summation order, split or thread count gives the same bits.
#[must_use]
pub fn entropy(row: &[f32]) -> f32 {
    entropy_by(row.len(), |v| row[v])
}

/// [`entropy`] of the row whose value at `v < len` is `p(v)` (a row computed on the fly).
#[inline]
pub(crate) fn entropy_by(len: usize, mut p: impl FnMut(usize) -> f32) -> f32 {
    let mut sum = 0i64;
    for v in 0..len {
        sum = sum.wrapping_add(entropy_term(p(v)));
    }
    entropy_from_fixed(sum)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    fn ulps(a: f32, b: f64) -> u64 {
        let b32 = b as f32;
        ((a.to_bits() as i64) - (b32.to_bits() as i64)).unsigned_abs()
    }

    #[test]
    fn constants_are_the_documented_values() {
        assert!((f64::from(LN2) - core::f64::consts::LN_2).abs() < 1e-7);
        assert!((f64::from(LN2_HI) + f64::from(LN2_LO) - core::f64::consts::LN_2).abs() < 1e-12);
        assert!((f64::from(INV_LN2) - 1.0 / core::f64::consts::LN_2).abs() < 1e-7);
        assert_eq!(TWO_40, 1_099_511_627_776.0);
        assert_eq!(TWO_M40 * TWO_40, 1.0);
    }

    #[test]
    fn ln_is_accurate_over_normal_floats() {
        // Walk a sparse but wide set of normal floats (every 4099th bit pattern).
        let mut bits = f32::MIN_POSITIVE.to_bits();
        let mut worst_abs = 0.0f64;
        while bits < 0x7F80_0000 {
            let x = f32::from_bits(bits);
            let exact = f64::from(x).ln();
            let got = f64::from(ln_p(x));
            let err = (got - exact).abs();
            // Relative to max(1, |ln x|): absolute near 1, relative elsewhere.
            worst_abs = worst_abs.max(err / exact.abs().max(1.0));
            // Miri interprets every step: walk far fewer points there.
            bits += if cfg!(miri) { 4099 * 1021 } else { 4099 };
        }
        assert!(worst_abs < 4e-7, "worst scaled error {worst_abs}");
        assert_eq!(ln_p(1.0), 0.0);
        assert!(ln_p(1.0 - f32::EPSILON / 2.0) < 0.0);
    }

    #[test]
    fn ln_of_race_uniforms_is_never_positive() {
        // ln_p(p) must be ≤ 0 for every p in (0, 1] (entropy terms stay ≥ 0): check the top of the range,
        // where rounding could push a value above 0, and a sample of the rest.
        let (top, stride) = if cfg!(miri) {
            (1 << 8, 251 * 1021)
        } else {
            (1 << 16, 251)
        };
        for i in (0u32..(1 << 24)).rev().take(top) {
            let u = (i + 1) as f32 * f32::from_bits(0x3380_0000);
            assert!(ln_p(u) <= 0.0, "ln_p({u}) > 0");
        }
        for i in (0u32..(1 << 24)).step_by(stride) {
            let u = (i + 1) as f32 * f32::from_bits(0x3380_0000);
            assert!(ln_p(u) <= 0.0, "ln_p({u}) > 0");
        }
    }

    #[test]
    fn exp_is_accurate_on_its_range() {
        let mut x = -86.9f32;
        while x < 88.0 {
            let exact = f64::from(x).exp();
            let got = exp_p(x);
            if exact > f64::from(f32::MIN_POSITIVE) {
                assert!(ulps(got, exact) <= 4, "exp_p({x}) = {got}, exact {exact}");
            }
            x += if cfg!(miri) { 1.37 } else { 0.0137 };
        }
        assert_eq!(exp_p(0.0), 1.0);
        assert_eq!(exp_p(-87.0), 0.0);
        assert_eq!(exp_p(f32::NAN), 0.0);
        assert_eq!(exp_p(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_p(88.5), f32::INFINITY);
        assert_eq!(exp_p(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn entropy_of_known_distributions() {
        let uniform = [0.25f32; 4];
        let h = entropy(&uniform);
        assert!((f64::from(h) - 4f64.ln()).abs() < 1e-6, "{h}");
        assert_eq!(entropy(&[1.0, 0.0, 0.0]), 0.0);
        // Garbage contributes 0, never NaN.
        assert_eq!(
            entropy(&[f32::NAN, -1.0, f32::NEG_INFINITY, 1e-40, 0.0, -0.0]),
            0.0
        );
        // Saturation instead of undefined overflow; +inf saturates like f32::MAX.
        assert_eq!(entropy_term(f32::MAX), i64::MIN);
        assert_eq!(entropy_term(f32::INFINITY), i64::MIN);
        assert_eq!(entropy_term(f32::MIN_POSITIVE), 0);
    }

    #[test]
    fn entropy_is_order_independent() {
        let mut row = [0f32; 97];
        for (i, p) in row.iter_mut().enumerate() {
            *p = ((i * 37 % 97) as f32 + 0.5) / 4800.0;
        }
        let h = entropy(&row);
        row.reverse();
        assert_eq!(entropy(&row).to_bits(), h.to_bits());
        row.rotate_left(13);
        assert_eq!(entropy(&row).to_bits(), h.to_bits());
    }

    /// Pins the exact bits of the portable functions. These values were computed once by this
    /// implementation and written here: they are what every backend (GPU kernels included) must
    /// produce, so a change here is a change of behaviour, not a test to update.
    #[test]
    fn value_stability() {
        let lns: [(f32, u32); 4] = [
            (0.5, 0xbf31_7218),
            (0.1, 0xc013_5d8e),
            (3.0e-7, 0xc170_4fce),
            (0.999, 0xba83_22ca),
        ];
        for (x, bits) in lns {
            assert_eq!(ln_p(x).to_bits(), bits, "ln_p({x})");
        }
        let exps: [(f32, u32); 4] = [
            (-1.0, 0x3ebc_5ab2),
            (-0.1, 0x3f67_a36d),
            (-50.0, 0x1b69_2beb),
            (2.5, 0x4142_eb7f),
        ];
        for (x, bits) in exps {
            assert_eq!(exp_p(x).to_bits(), bits, "exp_p({x})");
        }
    }
}
