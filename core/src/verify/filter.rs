//! Per-request top-k, top-p and min-p on the target distribution (vLLM v1's sampling
//! parameters), as `core/DETERMINISM.md` defines them: thresholds on the binary32 bits of the
//! weights, found by a radix descent over those bits (no sort), with exact integer sums, so
//! any evaluation order or split gives the same kept set and the same renormalised values.

use super::Param;
use super::reference::softmax_fixed;

/// `2⁻⁶⁴`.
const TWO_M64: f64 = 1.0 / 18_446_744_073_709_551_616.0;

/// One request's sampling filter, the one value a sampling parameter lives in: a batch takes
/// a slice of them ([`Batch::with_filters`](super::Batch::with_filters)), and every backend
/// reads a request's from the batch's [`plan`](super::Batch::plan). The neutral values
/// (`top_k = 0`, `top_p = 1`, `min_p = 0`) turn each part off; [`Filter::NONE`] has all three.
/// Build one from [`Filter::NONE`] with the `with_*` methods (it is `#[non_exhaustive]`, so a
/// new part is added without breaking callers):
///
/// ```
/// use specula_core::verify::Filter;
/// let f = Filter::NONE.with_top_k(50).with_top_p(0.9);
/// assert_eq!((f.top_k, f.top_p, f.min_p, f.is_active()), (50, 0.9, 0.0, true));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Filter {
    /// Keep the `top_k` largest weights (ties with the `top_k`-th all kept); `0` or `≥ V`: off.
    pub top_k: u32,
    /// Keep the smallest set of largest weights whose mass reaches `top_p` of the total
    /// (`0 < top_p ≤ 1`; the boundary id and its ties kept); `1`: off.
    pub top_p: f32,
    /// Keep weights `≥ min_p × the largest weight` (`0 ≤ min_p ≤ 1`); `0`: off.
    pub min_p: f32,
}

/// `u32` words of a [`Filter`] in a GPU launch ([`Filter::words`]).
pub(crate) const FILTER_WORDS: usize = 3;

impl Filter {
    /// No filtering.
    pub const NONE: Self = Self {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };

    /// The same filter with top-k (`0`: off).
    #[must_use]
    pub const fn with_top_k(self, top_k: u32) -> Self {
        Self { top_k, ..self }
    }

    /// The same filter with top-p (in `(0, 1]`; `1`: off).
    #[must_use]
    pub const fn with_top_p(self, top_p: f32) -> Self {
        Self { top_p, ..self }
    }

    /// The same filter with min-p (in `[0, 1]`; `0`: off).
    #[must_use]
    pub const fn with_min_p(self, min_p: f32) -> Self {
        Self { min_p, ..self }
    }

    /// Whether any part is on (a probability row is renormalised only then).
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.top_k != 0 || self.top_p < 1.0 || self.min_p > 0.0
    }

    /// The first part out of its range, if any (written so NaN fails): top-p in `(0, 1]`,
    /// min-p in `[0, 1]`; any top-k is valid.
    #[must_use]
    pub fn out_of_range(&self) -> Option<Param> {
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            Some(Param::TopP)
        } else if !(0.0..=1.0).contains(&self.min_p) {
            Some(Param::MinP)
        } else {
            None
        }
    }

    /// The filter as the GPU kernels read it after a request's method code
    /// (`core/kernels/specula_verify.cu`, `SP_SAMPLING_*`): top-k, then the bits of top-p and
    /// of min-p.
    #[must_use]
    pub(crate) const fn words(&self) -> [u32; FILTER_WORDS] {
        [self.top_k, self.top_p.to_bits(), self.min_p.to_bits()]
    }
}

impl Default for Filter {
    fn default() -> Self {
        Self::NONE
    }
}

/// The order key of a weight: its bit pattern if it is `> 0` (positive binary32 values order as
/// their bits), else `0` (zero, negative and NaN weights sort below every positive one).
#[inline(always)]
#[must_use]
pub fn weight_key(w: f32) -> u32 {
    if w > 0.0 { w.to_bits() } else { 0 }
}

/// The fixed-point term of a weight in the exact sums: `⌊w · 2⁶⁴⌋` (binary64 product, exact;
/// conversion truncating and saturating at `2¹²⁸ − 1`) for `w > 0`, else `0`.
#[inline(always)]
#[must_use]
pub fn weight_fixed(w: f32) -> u128 {
    if w > 0.0 { softmax_fixed(w) } else { 0 }
}

/// A row of weights a [`Cut`] reads, pass after pass (each pass must hand over the same
/// values; the order does not matter). Generic, so every pass is a monomorphised loop.
pub trait WeightRow {
    /// Calls `f` with every weight.
    fn for_each_weight(&self, f: impl FnMut(f32));
}

impl WeightRow for [f32] {
    #[inline]
    fn for_each_weight(&self, mut f: impl FnMut(f32)) {
        for &w in self {
            f(w);
        }
    }
}

/// The result of filtering one row of weights: the kept ids are those whose
/// [`weight_key`] is `≥ threshold`, and `fixed` is the exact sum of their [`weight_fixed`]
/// terms (wrapping `u128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The smallest kept key (`0`: every id kept).
    pub threshold: u32,
    /// The kept mass in units of `2⁻⁶⁴`.
    pub fixed: u128,
}

impl Cut {
    /// Filters the weights of `row` with `filter`. At most 1 + 4 + 1 + 4 passes (max, top-k
    /// digits, mass, top-p digits); a part that is off costs nothing.
    pub fn of<R: WeightRow + ?Sized>(row: &R, filter: Filter) -> Self {
        let mut threshold = 0u32;
        if filter.min_p > 0.0 {
            let mut max = 0u32;
            row.for_each_weight(|w| max = max.max(weight_key(w)));
            threshold = weight_key(filter.min_p * f32::from_bits(max));
        }
        if filter.top_k != 0 {
            if let Some((t, _)) = descend(row, 0, |_| 1, |c| c >= u128::from(filter.top_k)) {
                threshold = threshold.max(t);
            }
        }
        if filter.top_p < 1.0 {
            let mass = mass_above(row, threshold);
            if mass != 0 {
                let target = f64::from(filter.top_p) * (mass as f64);
                if let Some((t, m)) =
                    descend(row, threshold, weight_fixed, |m| (m as f64) >= target)
                {
                    return Self {
                        threshold: t,
                        fixed: m,
                    };
                }
            }
            return Self {
                threshold,
                fixed: mass,
            };
        }
        Self {
            threshold,
            fixed: mass_above(row, threshold),
        }
    }

    /// The renormalised value of weight `w`: `((w as f64) / S) as f32` with
    /// `S = (fixed as f64) · 2⁻⁶⁴` if `w` is kept, else `0`; `0` for every id when `fixed = 0`.
    #[inline(always)]
    #[must_use]
    pub fn p(&self, w: f32) -> f32 {
        if weight_key(w) < self.threshold || self.fixed == 0 {
            0.0
        } else {
            (f64::from(w) / ((self.fixed as f64) * TWO_M64)) as f32
        }
    }
}

/// `Σ weight_fixed(w)` over the weights with key `≥ threshold` (wrapping).
fn mass_above<R: WeightRow + ?Sized>(row: &R, threshold: u32) -> u128 {
    let mut m = 0u128;
    row.for_each_weight(|w| {
        if weight_key(w) >= threshold {
            m = m.wrapping_add(weight_fixed(w));
        }
    });
    m
}

/// The largest key threshold `θ ≥ floor` with `pred(F(θ))`, where
/// `F(θ) = Σ g(w)` over the weights with key `≥ θ` (wrapping), and that `F(θ)`; `None` if
/// `pred(F(floor))` is false. `pred` must be monotone (true for larger `F` once true).
///
/// Radix descent, 8 bits per pass from the top: the answer's top byte is the largest digit `d`
/// whose `F(d·2²⁴)` satisfies `pred`, and so on down, so 4 passes give the exact answer
/// (the same as a 32-step bisection over the bits would).
fn descend<R: WeightRow + ?Sized>(
    row: &R,
    floor: u32,
    g: impl Fn(f32) -> u128,
    pred: impl Fn(u128) -> bool,
) -> Option<(u32, u128)> {
    let mut prefix = 0u32;
    // F of the ids whose key is above every key with the current prefix.
    let mut above = 0u128;
    let mut hist = [0u128; 256];
    for level in 0..4u32 {
        let shift = 24 - 8 * level;
        hist.fill(0);
        row.for_each_weight(|w| {
            let key = weight_key(w);
            // Same higher digits as the prefix (the top level: every key).
            if key >= floor && (level == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8))) {
                let d = ((key >> shift) & 0xFF) as usize;
                hist[d] = hist[d].wrapping_add(g(w));
            }
        });
        let mut acc = above;
        let mut chosen = None;
        for d in (0..256usize).rev() {
            let with = acc.wrapping_add(hist[d]);
            if pred(with) {
                chosen = Some(d);
                break;
            }
            acc = with;
        }
        let d = chosen?;
        // `acc` is F of the keys with a digit above d: they stay above every later prefix.
        above = acc;
        prefix |= (d as u32) << shift;
        if level == 3 {
            let f = acc.wrapping_add(hist[d]);
            return Some((prefix.max(floor), f));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(row: &[f32], f: Filter) -> Cut {
        Cut::of(row, f)
    }

    fn kept(row: &[f32], f: Filter) -> usize {
        let c = cut(row, f);
        row.iter().filter(|&&w| c.p(w) > 0.0).count()
    }

    #[test]
    fn top_k_keeps_ties_and_is_off_at_zero() {
        let row = [0.1, 0.4, 0.2, 0.2, 0.1];
        let f = |k| Filter {
            top_k: k,
            ..Filter::NONE
        };
        assert_eq!(kept(&row, f(1)), 1);
        assert_eq!(kept(&row, f(2)), 3); // the 2nd largest ties with the 3rd
        assert_eq!(kept(&row, f(3)), 3);
        assert_eq!(kept(&row, f(4)), 5);
        assert_eq!(kept(&row, f(0)), 5);
        assert_eq!(kept(&row, f(99)), 5);
    }

    #[test]
    fn top_p_keeps_the_boundary_id() {
        // Exact binary fractions, so the masses are exact.
        let row = [0.5, 0.25, 0.125, 0.125];
        let f = |p| Filter {
            top_p: p,
            ..Filter::NONE
        };
        assert_eq!(kept(&row, f(0.5)), 1); // 0.5 reaches 0.5
        assert_eq!(kept(&row, f(0.51)), 2); // the id that crosses is kept
        assert_eq!(kept(&row, f(0.75)), 2);
        assert_eq!(kept(&row, f(0.8)), 4); // the crossing id's tie too
        assert_eq!(kept(&row, f(1e-9)), 1);
    }

    #[test]
    fn min_p_is_relative_to_the_largest() {
        let row = [0.5, 0.25, 0.2, 0.05];
        let f = |m| Filter {
            min_p: m,
            ..Filter::NONE
        };
        assert_eq!(kept(&row, f(0.5)), 2); // ≥ 0.25 kept
        assert_eq!(kept(&row, f(0.1)), 4);
        assert_eq!(kept(&row, f(1.0)), 1);
    }

    #[test]
    fn kept_mass_renormalises() {
        let row = [0.5, 0.25, 0.25];
        let c = cut(
            &row,
            Filter {
                top_k: 1,
                ..Filter::NONE
            },
        );
        assert_eq!((c.p(0.5), c.p(0.25)), (1.0, 0.0));
        let c = cut(&row, Filter::NONE);
        assert_eq!((c.threshold, c.p(0.25)), (0, 0.25));
    }

    /// The descent equals the definition: a brute-force search over every present key.
    #[test]
    fn descent_matches_brute_force() {
        let mut s = 0x1234_5678_9ABC_DEF0u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..if cfg!(miri) { 20 } else { 300 } {
            let n = 1 + (next() % 40) as usize;
            let row: [f32; 40] = core::array::from_fn(|_| match next() % 5 {
                0 => 0.0,
                1 => 0.25,
                _ => (next() >> 40) as f32 / (1u64 << 24) as f32,
            });
            let row = &row[..n];
            let f = Filter {
                top_k: (next() % 8) as u32,
                top_p: [1.0, 0.9, 0.5, 0.1][(next() % 4) as usize],
                min_p: [0.0, 0.1, 0.5][(next() % 3) as usize],
            };
            let c = cut(row, f);
            // Brute force of the definition.
            let maxk = row.iter().map(|&w| weight_key(w)).max().unwrap();
            let mut th = 0u32;
            if f.min_p > 0.0 {
                th = weight_key(f.min_p * f32::from_bits(maxk));
            }
            let count = |t: u32| row.iter().filter(|&&w| weight_key(w) >= t).count();
            if f.top_k != 0 && f.top_k as usize <= n {
                let tk = row
                    .iter()
                    .map(|&w| weight_key(w))
                    .filter(|&t| count(t) >= f.top_k as usize)
                    .max()
                    .unwrap();
                th = th.max(tk);
            }
            let mass = |t: u32| {
                row.iter()
                    .filter(|&&w| weight_key(w) >= t)
                    .map(|&w| weight_fixed(w))
                    .sum::<u128>()
            };
            if f.top_p < 1.0 && mass(th) != 0 {
                let target = f64::from(f.top_p) * (mass(th) as f64);
                let tp = row
                    .iter()
                    .map(|&w| weight_key(w))
                    .filter(|&t| t >= th && (mass(t) as f64) >= target)
                    .max()
                    .unwrap_or(th);
                th = th.max(tp);
            }
            assert_eq!(c.threshold, th, "{row:?} {f:?}");
            assert_eq!(c.fixed, mass(th));
        }
    }
}
