//! The CPU backend's shortcut for accepted positions ([`quick_accept`]): a drafted position's
//! rejection test decided from a bound on its row's softmax sum (or, filtered, from the
//! unfiltered `p` of the row's largest weight), without the exact pass and the filter's cut
//! (`core/DETERMINISM.md`, "Logits": why the bits stay).

use super::{Src, cut, kernels};
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
/// * With a filter, `x` of the row's largest weight (logits: weight 1): every filter keeps it
///   (its threshold is at most that weight's key) and keeps at most the whole mass, so its
///   renormalised `p` is at least the unfiltered one: the sum bound's lower bound of it
///   (logits, after the maximum alone, which the exact path reuses when `x` is not the
///   largest), or the stored value over the row's exact mass (binary32 probabilities with
///   top-p alone: the largest key and the mass from one pass, which the cut then reuses).
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
            let top = key > 0 && key <= 1f32.to_bits() && weight_key(p[x]) == key;
            let lo = Cut {
                threshold: 0,
                fixed: mass,
            }
            .p(p[x]);
            (top.then_some(lo), found)
        }
        (None, _) => return (None, None),
        (Some(t), _) if filter.is_active() => {
            let max = src.max(isa, t);
            if !(max.m.is_finite() && softmax_exp(src.at(x), t, max.m) == 1.0) {
                return (None, Some(Found::Max(max)));
            }
            let lo = src
                .sum_bound(isa, t, Some(max.m))
                .and_then(|b| b.p_range(1.0))
                .map(|(lo, _)| lo);
            (lo, Found::Max(max))
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

#[cfg(test)]
mod tests;
