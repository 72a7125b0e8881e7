//! The CPU backend's shortcut for accepted positions ([`quick_accept`]): a drafted position's
//! rejection test decided from a bound on its row's softmax sum (filtered: for an id the
//! filter certainly keeps, from its unfiltered `p`), without the exact pass and the filter's
//! cut (`core/DETERMINISM.md`, "Logits": why the bits stay).

use super::cut::{self, TWO_M64};
use super::{Src, kernels};
use specula_core::verify::{Cut, Filter, softmax_exp, weight_key};

/// What [`quick_accept`] found of a row in its pass, for the exact path not to find again.
#[derive(Clone, Copy)]
pub(super) enum Found {
    /// A logits row's softmax maximum.
    Max(kernels::Max),
    /// A probability row's largest key and mass ([`kernels::max_mass`]), where the cut reads
    /// them ([`cut::probs_needs_mass`]).
    MaxMass(u32, u128),
}

impl Found {
    pub(super) fn max(self) -> Option<kernels::Max> {
        match self {
            Self::Max(m) => Some(m),
            Self::MaxMass(..) => None,
        }
    }

    pub(super) fn max_mass(self) -> Option<(u32, u128)> {
        match self {
            Self::MaxMass(key, mass) => Some((key, mass)),
            Self::Max(_) => None,
        }
    }
}

/// The acceptance of id `x` on the target row `src` (logits at `t > 0`, or probabilities for
/// `None`), decided without the exact softmax pass and the filter's cut where that can be done
/// with the rules' bits: a value `pt ≤ p(x)` for which `test(pt)` holds, and what the pass
/// found of the row (for the exact path, which then need not find it again).
///
/// * Logits without a filter (binary32, bf16 or f16): the bound on the softmax sum from one
///   read of the row ([`kernels::sum_bound`]) gives `lo ≤ p(x)`.
/// * With a filter, `x` an id the filter certainly keeps ([`kept_lo`], [`probs_kept`]): a kept
///   id's renormalised `p` is at least its unfiltered one (the kept mass is at most the
///   whole), so the unfiltered lower bound decides it: the sum bound's (logits, after the
///   maximum alone, which the exact path reuses when the test is not decided), or the stored
///   value over the row's exact mass (binary32 probabilities with top-p alone: the largest key
///   and the mass from one pass, which the cut then reuses).
///
/// A position decided here is accepted by the one-request batch's test with `pt` in place of
/// `p(x)` (the same test, the same verdict); any other position takes the exact path.
pub(super) fn quick_accept(
    src: Src<'_>,
    t: Option<f32>,
    filter: Filter,
    x: usize,
    test: impl Fn(f32) -> bool,
) -> (Option<f32>, Option<Found>) {
    let isa = kernels::Isa::detect();
    let (lo, found) = match (t, src) {
        // Top-p alone, whose cut costs a few passes and starts with this one; with min-p or
        // top-k the cut is about as cheap as the mass it would save.
        (None, Src::F32(p)) if cut::probs_needs_mass(filter, p.len()) => {
            let (key, mass) = kernels::max_mass(isa, p);
            let found = Found::MaxMass(key, mass);
            // Values above 1 (the mass could saturate) and rows without a positive value
            // take the exact path.
            let a = weight_key(p[x]);
            if key == 0 || key > 1f32.to_bits() || a == 0 {
                return (None, Some(found));
            }
            let whole = Cut {
                threshold: 0,
                fixed: mass,
            };
            let lo = whole.p(p[x]);
            (
                probs_kept(isa, p, filter.top_p, key, a, mass, &test).then_some(lo),
                found,
            )
        }
        (None, _) => return (None, None),
        (Some(t), _) if filter.is_active() => {
            let max = src.max(isa, t);
            let found = Found::Max(max);
            if !max.m.is_finite() {
                return (None, Some(found));
            }
            let e = softmax_exp(src.at(x), t, max.m);
            (kept_lo(isa, src, t, filter, max.m, e, &test), found)
        }
        (Some(t), _) => {
            let Some(b) = src.sum_bound(isa, t, None) else {
                return (None, None);
            };
            let lo = b.p_range(softmax_exp(src.at(x), t, b.m)).map(|(lo, _)| lo);
            (lo, Found::Max(kernels::Max::from(b.m)))
        }
    };
    (lo.filter(|&lo| test(lo)), Some(found))
}

/// Whether top-p `top_p` alone certainly keeps a drafted id of key `a` on the stored
/// probabilities `p` (every value in `[0, 1]`, largest key `key`, mass `mass`), and the test
/// is worth asking of its `p`: the largest value is kept; another id when the exact mass of
/// the larger values (one more pass, [`kernels::gather_keys`]) stays below the rules' target,
/// which decides it exactly. First the test is asked of an upper bound of `p(x)` (at least
/// `top_p` of the mass is kept): a row it rejects is not read again here.
fn probs_kept(
    isa: kernels::Isa,
    p: &[f32],
    top_p: f32,
    key: u32,
    a: u32,
    mass: u128,
    test: &impl Fn(f32) -> bool,
) -> bool {
    if a == key {
        return true;
    }
    let target = f64::from(top_p) * (mass as f64);
    // No key lies in `[u32::MAX, a + 1)`: no candidates, only the mass of the keys above `a`.
    test(at_most(f32::from_bits(a), target * TWO_M64))
        && kernels::gather_keys(isa, p, u32::MAX, a + 1, &mut Vec::new(), 0)
            .is_some_and(|above| (above as f64) < target)
}

/// An upper bound of a kept id's `p` = `RN32(w / S_K)` from its weight `w` and a lower bound
/// `kept ≤ S_K` of the kept mass (rounded up by a margin far above the roundings'), for the
/// test to rule a row out before any further pass.
fn at_most(w: f32, kept: f64) -> f32 {
    (f64::from(w) / (kept * (1.0 - 2f64.powi(-40)))) as f32
}

/// A lower bound of the filtered `p(x)` of a drafted id of weight `e` on a logits row of
/// softmax maximum `m`, where the filter certainly keeps the id: a kept id's renormalised `p`
/// is at least its unfiltered one (the kept mass is at most the whole), whose lower bound
/// [`kernels::sum_bound`] gives. Certainly kept: the row's largest weight (`e = 1`, by every
/// filter); with min-p alone, a weight of key at least min-p's threshold (known exactly before
/// any pass: `key(min_p × 1)`); with top-p alone, an id whose larger weights' mass stays below
/// `top_p` of the row's ([`kernels::mass_above`]). Before the bound's pass, the test is asked
/// of an upper bound of `p(x)` (the kept mass is at least the largest weight, 1, and with
/// top-p at least `top_p` of the whole): a row it rejects is not read again here.
fn kept_lo(
    isa: kernels::Isa,
    src: Src<'_>,
    t: f32,
    filter: Filter,
    m: f32,
    e: f32,
    test: &impl Fn(f32) -> bool,
) -> Option<f32> {
    let lo = |b: kernels::SumBound| b.p_range(e).map(|(lo, _)| lo);
    if e == 1.0 {
        return src.sum_bound(isa, t, Some(m)).and_then(lo);
    }
    if let Some(theta) = cut::plain_threshold(filter, src.len()) {
        // Min-p alone.
        if weight_key(e) < theta || !test(e) {
            return None;
        }
        return src.sum_bound(isa, t, Some(m)).and_then(lo);
    }
    if !cut::top_p_alone(filter, src.len()) {
        return None;
    }
    // At least `top_p` of the mass is kept, and the mass is at least 1.
    if !test(at_most(e, f64::from(filter.top_p))) {
        return None;
    }
    let a = src.mass_above(isa, t, m, e)?;
    if a.keeps(filter.top_p) {
        lo(a.bound)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
