//! The sampling filter's [`Cut`] of a row of softmax weights, from a few candidates instead of
//! [`Cut::of`]'s radix descent over the whole row (up to ten scalar passes).
//!
//! * Min-p alone: its threshold is `key(min_p × 1)`; one vector pass sums the mass above it.
//! * With top-k: every threshold is at least a key `τ` that a sample of the row suggests
//!   (checked exactly, not assumed: at least `top_k` keys `≥ τ`). The ids with key `≥ τ` are
//!   gathered in one vector pass, sorted, and the definitions (`core/DETERMINISM.md`,
//!   "Sampling filters") are read off the sorted keys: the `top_k`-th largest key, the mass
//!   above a key, the first key whose mass reaches `top_p`.
//! * Top-p without top-k: the sample brackets the key where the mass crosses the target,
//!   `[lo, hi)`; one pass gathers the keys in the bracket and sums the exact mass above `hi`
//!   (checked: below the target there, reaching it at `lo`); the candidates' masses are binned
//!   and only the crossing bin is sorted and walked.
//!
//! For every `θ' ≥ τ` (or in the bracket) the count and the mass of the keys `≥ θ'` are the
//! same over the candidates as over the row, so the result is exact whenever the check passes;
//! otherwise a wider try follows, then the whole-row [`Cut::of`]. The sample only decides how
//! fast, never what.
//!
//! Only for softmax weights: they lie in `[0, 1]`, so no mass wraps (`V·2⁶⁴ < 2¹²⁸`), the mass
//! above a key only grows as the key falls, and "the largest key whose mass reaches the target"
//! (what the sorted walk finds) is what the radix descent finds too.

use super::kernels::{self, Isa};
use specula_core::verify::{Cut, Filter, weight_key};

/// Ids in the sample (it only picks `τ`): enough to place `τ` within a few per cent of the
/// mass, few enough to sort in a fraction of a pass.
const SAMPLE: usize = 2048;
/// Candidate sets larger than `V / MAX_SHARE` are not worth sorting: the whole-row search
/// instead.
const MAX_SHARE: usize = 4;

/// The most bins top-p's candidates are summed in (a power of two).
const MAX_BINS: usize = 1024;

/// The key of binary32 `1.0`: the largest softmax weight of a row with a finite maximum
/// (`exp_p(m − m) = exp_p(0) = 1`).
const ONE_KEY: u32 = 0x3F80_0000;

/// `2⁻⁶⁴`.
pub(crate) const TWO_M64: f64 = 1.0 / 18_446_744_073_709_551_616.0;

/// [`Cut::of`] the softmax weights `w` (each `e_v ∈ [0, 1]`, from a row whose maximum is
/// finite, so the largest is exactly `1`) by `filter`, the same result. `total` is the whole
/// row's mass `Σ ⌊e_v · 2⁶⁴⌋` (the softmax's `F`), needed only when top-p is the sole part on.
/// `cands` is scratch.
pub(crate) fn softmax_cut(
    isa: Isa,
    w: &[f32],
    filter: Filter,
    total: Option<u128>,
    cands: &mut Vec<u32>,
) -> Cut {
    candidate_cut(isa, w, filter, ONE_KEY, total, cands).unwrap_or_else(|| Cut::of(w, filter))
}

/// [`Cut::of`] the stored probabilities `p` by `filter`, the same result: the candidate cut of
/// [`softmax_cut`] whenever every value is at most `1` (what that cut needs: no mass wraps,
/// and each value's mass is read off its key), else the whole-row search. Unlike softmax
/// weights, the largest value is not known to be `1`: min-p and top-p alone (whose sample is
/// placed below it) first find it (one vector pass; top-p alone sums the row's mass in the same
/// pass); with top-k the candidates hold the largest value and are checked instead. `known`:
/// the row's [`kernels::max_mass`], when a pass already found it (read where
/// [`probs_needs_mass`]).
pub(crate) fn probs_cut(
    isa: Isa,
    p: &[f32],
    filter: Filter,
    known: Option<(u32, u128)>,
    cands: &mut Vec<u32>,
) -> Cut {
    probs_candidate_cut(isa, p, filter, known, cands).unwrap_or_else(|| Cut::of(p, filter))
}

/// [`probs_cut`] from candidates, if they decide it.
fn probs_candidate_cut(
    isa: Isa,
    p: &[f32],
    filter: Filter,
    known: Option<(u32, u128)>,
    cands: &mut Vec<u32>,
) -> Option<Cut> {
    let top_p_alone = filter.top_p < 1.0 && !top_k_binds(filter, p.len());
    let (max_key, total) = if probs_needs_mass(filter, p.len()) {
        // The largest key and the row's mass in one pass (the mass is meaningful only when
        // that key is at most 1's, checked below).
        let (key, total) = known.unwrap_or_else(|| kernels::max_mass(isa, p));
        (key, Some(total))
    } else if filter.min_p > 0.0 || top_p_alone {
        // The largest value (NaN never wins).
        (weight_key(kernels::softmax_max(isa, p, 1.0)), None)
    } else {
        (ONE_KEY, None)
    };
    // None positive, or any above 1: the whole-row search.
    if max_key == 0 || max_key > ONE_KEY {
        return None;
    }
    candidate_cut(isa, p, filter, max_key, total, cands)
}

/// Whether [`probs_cut`] reads a probability row's mass (top-p alone): its first pass then
/// finds the largest key and the mass together.
pub(crate) fn probs_needs_mass(filter: Filter, len: usize) -> bool {
    top_p_alone(filter, len)
}

/// Whether top-p is the filter's only binding part (top-k off or unable to bind, min-p off).
pub(crate) fn top_p_alone(filter: Filter, len: usize) -> bool {
    filter.top_p < 1.0 && !top_k_binds(filter, len) && filter.min_p <= 0.0
}

/// The cut from candidates, if two tries decide it. `max_key`: the largest key of `w` (at
/// most [`ONE_KEY`]) when min-p or top-p alone is on; otherwise [`ONE_KEY`], and then the
/// candidates are checked to hold no key above it.
fn candidate_cut(
    isa: Isa,
    w: &[f32],
    filter: Filter,
    max_key: u32,
    total: Option<u128>,
    cands: &mut Vec<u32>,
) -> Option<Cut> {
    (0..2).find_map(|attempt| try_cut(isa, w, filter, max_key, total, cands, attempt))
}

/// The key of `min_p × from_bits(max_key)` (min-p's threshold for a row whose largest key is
/// `max_key`), or 0.
fn min_p_key(filter: Filter, max_key: u32) -> u32 {
    if filter.min_p > 0.0 {
        weight_key(filter.min_p * f32::from_bits(max_key))
    } else {
        0
    }
}

/// The cut's key threshold when `filter` is at most min-p (top-k unable to bind, top-p off)
/// on softmax weights: min-p's key, or 0 for no filter; `None` when top-k or top-p takes part.
/// The cut is then known before the weights are, and only its mass is left to sum.
pub(crate) fn plain_threshold(filter: Filter, len: usize) -> Option<u32> {
    (!top_k_binds(filter, len) && filter.top_p >= 1.0).then(|| min_p_key(filter, ONE_KEY))
}

/// Whether top-k is on and can bind (`top_k > V` keeps every id, as no key has `top_k` ids
/// at or above it).
fn top_k_binds(filter: Filter, len: usize) -> bool {
    filter.top_k != 0 && filter.top_k as usize <= len
}

/// One try with the sample's `τ` (`attempt` 1: a more cautious one); `None` if the
/// candidates do not decide the cut (or would be too many).
///
/// With top-p alone the candidates are the keys in a bracket `[lo, hi)` around the key where
/// the mass crosses `top_p`, and the pass also sums the mass of the keys `≥ hi` exactly: that
/// keeps the candidates few even when the kept set is most of the row.
fn try_cut(
    isa: Isa,
    w: &[f32],
    filter: Filter,
    max_key: u32,
    total: Option<u128>,
    cands: &mut Vec<u32>,
    attempt: u32,
) -> Option<Cut> {
    let min_key = min_p_key(filter, max_key);
    let top_k = top_k_binds(filter, w.len());
    let top_p = filter.top_p < 1.0;
    let cap = w.len() / MAX_SHARE;
    if top_p && !top_k {
        return top_p_cut(
            isa,
            w,
            filter.top_p,
            min_key,
            max_key,
            total,
            cands,
            attempt,
        );
    }
    if !top_k {
        // Min-p alone: its threshold is known; only the mass above it is left (one pass, no
        // candidates: no key is in `[u32::MAX, min_key)`).
        cands.clear();
        let fixed = kernels::gather_keys(isa, w, u32::MAX, min_key.max(1), cands, 0)?;
        return Some(Cut {
            threshold: min_key,
            fixed,
        });
    }
    // Top-k's τ, and min-p's threshold under it: every kept key is ≥ both (no key reaches
    // `u32::MAX`, the bits of +∞ being the largest: nothing above).
    let lo = sample_tau_count(w, filter.top_k as usize, attempt).max(min_key);
    if lo == 0 {
        return None;
    }
    cands.clear();
    kernels::gather_keys(isa, w, lo, u32::MAX, cands, cap)?;
    cands.sort_unstable_by(|a, b| b.cmp(a));
    // The candidates hold the row's largest key (≥ lo): above 1 (only stored probabilities
    // can be), masses would not be read off keys; the whole-row search decides.
    if cands.first().is_some_and(|&k| k > max_key) {
        return None;
    }
    // θ₁: min-p, then top-k (the `top_k`-th largest key, ties kept; top-k never brackets).
    let theta = cands
        .get(filter.top_k as usize - 1)
        .map_or(min_key, |&k| min_key.max(k));
    // Whole-row mass above θ₁: from the candidates when θ₁ ≥ lo (they hold every key ≥ lo).
    if theta < lo {
        // Top-k's key lies below lo: the candidates do not decide it.
        return None;
    }
    let mass = fixed_at_or_above(cands, theta);
    if !top_p || mass == 0 {
        return Some(Cut {
            threshold: theta,
            fixed: mass,
        });
    }
    let target = f64::from(filter.top_p) * (mass as f64);
    walk(cands, theta, 0, target)
}

/// Top-p without top-k, after min-p's `θ₁ = min_key` (0: off): the mass `A` above `θ₁` (the
/// row's `total` for 0, else one exact pass), then the candidates in a bracket `[lo, hi)`
/// around the key where the mass crosses `top_p · A`, with the exact mass above `hi`.
/// `max_key`: the row's largest key (at most [`ONE_KEY`]).
#[allow(clippy::too_many_arguments)] // the row, the filter's parts, its scratch and the try
fn top_p_cut(
    isa: Isa,
    w: &[f32],
    top_p: f32,
    min_key: u32,
    max_key: u32,
    total: Option<u128>,
    cands: &mut Vec<u32>,
    attempt: u32,
) -> Option<Cut> {
    let mass = if min_key == 0 {
        total?
    } else {
        // No key is in [u32::MAX, min_key): only the mass above min_key.
        cands.clear();
        kernels::gather_keys(isa, w, u32::MAX, min_key, cands, 0)?
    };
    if mass == 0 {
        return Some(Cut {
            threshold: min_key,
            fixed: 0,
        });
    }
    let target = f64::from(top_p) * (mass as f64);
    let (lo, hi) = sample_bracket(w, top_p, min_key, max_key, mass, attempt)?;
    let lo = lo.max(min_key);
    if lo == 0 || lo >= hi {
        return None;
    }
    cands.clear();
    // No key lies above `max_key`: a bracket reaching past it has no mass above `hi` to sum.
    let top = if hi > max_key { u32::MAX } else { hi };
    let above = kernels::gather_keys(isa, w, lo, top, cands, w.len() / MAX_SHARE)?;
    // The keys ≥ hi must not reach the target yet (else θ ≥ hi, outside the bracket).
    if (above as f64) >= target {
        return None;
    }
    // The candidates can be many (top-p keeps most of a flat row): rather than sort them all,
    // sum their masses in bins of equal key width (about one per 8 candidates, at most
    // `MAX_BINS`: at 32k a fixed 4096 bins, allocated, zeroed and converted to binary64 one by
    // one, cost a tenth of the row's time), find the bin where the mass crosses the target,
    // and sort only that bin's keys.
    let span = hi - lo;
    let bits = (cands.len() / 8).clamp(16, MAX_BINS).ilog2();
    let shift = (32 - span.leading_zeros()).saturating_sub(bits);
    let bins = ((span - 1) >> shift) as usize + 1;
    // Four sums per bin, candidate `i` adding to sum `i % 4`: a peaked row's candidates crowd
    // into a few bins, where one sum per bin made each addition wait for the previous one.
    let mut lanes = vec![0u128; 4 * bins];
    for (i, &k) in cands.iter().enumerate() {
        lanes[4 * ((k - lo) >> shift) as usize + i % 4] += fixed_of_key(k);
    }
    let mass: Vec<u128> = lanes.chunks_exact(4).map(|l| l.iter().sum()).collect();
    let mut acc = above;
    for b in (0..bins).rev() {
        if ((acc + mass[b]) as f64) >= target {
            // F above this bin is `acc`: walk its keys from the top.
            cands.retain(|&k| ((k - lo) >> shift) as usize == b);
            cands.sort_unstable_by(|x, y| y.cmp(x));
            return walk(cands, min_key, acc, target);
        }
        acc += mass[b];
    }
    // The target lies below lo.
    None
}

/// The largest key `θ' ≥ theta` whose mass `F(θ')` reaches `target`, and `F(θ')`, from the
/// candidates sorted from the largest (`above`: the mass of the keys above all of them), or
/// `None` if the target lies below them. A whole group of equal keys is added at a time (F
/// counts every id with key `≥ θ'`); the mass only grows as the key falls (no wrap for weights
/// in `[0, 1]`), so the first group that reaches the target is the answer.
fn walk(sorted: &[u32], theta: u32, above: u128, target: f64) -> Option<Cut> {
    let mut acc = above;
    let mut i = 0;
    while i < sorted.len() && sorted[i] >= theta {
        let key = sorted[i];
        while i < sorted.len() && sorted[i] == key {
            acc += fixed_of_key(key);
            i += 1;
        }
        if (acc as f64) >= target {
            return Some(Cut {
                threshold: key,
                fixed: acc,
            });
        }
    }
    None
}

/// `Σ weight_fixed` of the sorted candidates with key `≥ theta`.
fn fixed_at_or_above(sorted: &[u32], theta: u32) -> u128 {
    sorted
        .iter()
        .take_while(|&&k| k >= theta)
        .map(|&k| fixed_of_key(k))
        .sum()
}

/// `weight_fixed` of the weight whose key is `key` (a weight in `(0, 1]`), from the bits:
/// `mant · 2^(E − 86)`, shifted up or truncated down (a subnormal has `E = 0` and an implicit
/// 0), where `weight_fixed`'s binary64 route ends in a slow software `f64 → u128` conversion.
#[inline]
fn fixed_of_key(key: u32) -> u128 {
    debug_assert!(key <= ONE_KEY);
    let e = (key >> 23) & 0xFF;
    let mant = u128::from(key & 0x007F_FFFF) | if e == 0 { 0 } else { 0x0080_0000 };
    // A subnormal's value is mant · 2⁻¹⁴⁹: exponent field 1, without the implicit bit.
    let e = e.max(1);
    if e >= 86 {
        mant << (e - 86)
    } else {
        mant >> (86 - e)
    }
}

/// One id in this many is sampled.
fn stride(len: usize) -> usize {
    (len / SAMPLE).max(1)
}

/// The `j`-th sampled id of a row of `len` ids: one in each run of [`stride`] ids, at a
/// scrambled place in it. A fixed step would alias with periodic rows (a vocabulary mask that
/// keeps every tenth id, seen through a step of 62, shows the sample nothing but zeros).
fn sample_id(len: usize, j: usize) -> usize {
    let step = stride(len);
    // A 24-bit scramble of `j` scaled into `0..step` by a multiply and a shift: a division by
    // the run-time `step` per sampled id was a third of the sample's time.
    let h = u64::from((j as u32).wrapping_mul(0x9E37_79B9) >> 8);
    j * step + ((h * step as u64) >> 24) as usize
}

/// The sample's keys (one id in each run of [`stride`]: [`sample_id`]).
fn sampled(w: &[f32]) -> Vec<u32> {
    (0..w.len() / stride(w.len()))
        .map(|j| weight_key(w[sample_id(w.len(), j)]))
        .collect()
}

/// A key that about `4·k` ids (`attempt` 1: `32·k`) of the row reach, going by the sample; 0
/// when the sample is too small to say.
fn sample_tau_count(w: &[f32], k: usize, attempt: u32) -> u32 {
    let mut s = sampled(w);
    let want = (k << (2 + 3 * attempt)).div_ceil(stride(w.len())) + 4;
    if want >= s.len() {
        return 0;
    }
    // The want-th largest, without sorting the sample.
    *s.select_nth_unstable_by(want, |a, b| b.cmp(a)).1
}

/// Keys `(lo, hi)` between which, going by the sample, the row's mass crosses `top_p` of
/// `mass`, the exact mass of the keys `≥ floor` (the row's largest key being `max_key`): the
/// estimated mass above `hi` is below `top_p − δ` of the whole, above `lo` at least
/// `top_p + δ` (`δ = 2 %`, `attempt` 1: 6 %), to the resolution of bins of 1/16 binade (the
/// sample's masses are binned, not sorted). Where that keeps few ids, `hi` is above every key
/// and `lo` one that several times as many sampled keys reach. `None` when the sample cannot
/// say.
///
/// Each sampled weight stands for the [`stride`] ids around it, except a heavy one (whose
/// share alone would be an eighth of `mass` or more), which stands for itself: on a row where
/// one id holds most of the mass (a language model's usual output) the sample mostly misses
/// it, and once in a stride hits it. Mass the sample then misses (more than a tenth) is held
/// by ids it did not see, which are heavy, so it is placed above every sampled key; otherwise
/// the estimate's shares are of its own total, the few per cent it is off cancelling.
fn sample_bracket(
    w: &[f32],
    top_p: f32,
    floor: u32,
    max_key: u32,
    mass: u128,
    attempt: u32,
) -> Option<(u32, u32)> {
    const SHIFT: u32 = 19;
    // Bins of 1/16 binade up to the key of 1 (`max_key` is at most that).
    const BINS: usize = (ONE_KEY >> SHIFT) as usize + 1;
    let mass = (mass as f64) * TWO_M64;
    let len = w.len();
    let n = len / stride(len);
    let scale = len as f64 / n.max(1) as f64;
    let top = (max_key.min(ONE_KEY) >> SHIFT) as usize;
    // Each bin's estimated mass and its count of sampled keys `≥ max(floor, 1)`, in one pass
    // over the sample: the counts place `lo` below (a bin boundary, not a sampled key found
    // by a selection, which with the sample's own copy cost a third of this function).
    // Four of each, sample `j` going to `j % 4`: most of a peaked row's sampled keys fall in a
    // few bins, and one histogram made each addition wait for the previous one to the same bin
    // (through memory), most of this function's time.
    let mut hist = [[0f64; BINS]; 4];
    let mut count = [[0u32; BINS]; 4];
    let mut seen = [0f64; 4];
    let mut above_floor = 0usize;
    for j in 0..n {
        let k = weight_key(w[sample_id(len, j)]);
        let lane = j % 4;
        if k >= floor.max(1) && k <= max_key {
            let x = f64::from(f32::from_bits(k));
            let x = if scale * x >= mass / 8.0 {
                x
            } else {
                scale * x
            };
            let b = (k >> SHIFT) as usize;
            hist[lane][b] += x;
            count[lane][b] += 1;
            seen[lane] += x;
            above_floor += 1;
        } else if k > max_key {
            above_floor += 1;
        }
    }
    let hist: Vec<f64> = (0..=top)
        .map(|b| (hist[0][b] + hist[1][b]) + (hist[2][b] + hist[3][b]))
        .collect();
    let count: Vec<u32> = (0..=top)
        .map(|b| count[0][b] + count[1][b] + count[2][b] + count[3][b])
        .collect();
    let mut hist = hist;
    let seen = (seen[0] + seen[1]) + (seen[2] + seen[3]);
    let total = if mass - seen > mass / 10.0 {
        hist[top] += mass - seen;
        mass
    } else {
        seen
    };
    let delta = if attempt == 0 { 0.02 } else { 0.06 };
    let p = f64::from(top_p);
    let mut hi = None;
    let mut acc = 0.0;
    let mut reach = 0usize;
    let mut bracket = None;
    for b in (0..=top).rev() {
        acc += hist[b];
        reach += count[b] as usize;
        if hi.is_none() && acc >= (p - delta) * total {
            // Keys from the next bin up: their estimated mass is below the lower share.
            hi = Some(((b as u32) + 1) << SHIFT);
        }
        if total > 0.0 && acc >= (p + delta).min(1.0) * total {
            bracket = hi.map(|hi| ((b as u32) << SHIFT, (hi, reach)));
            break;
        }
    }
    // Few kept ids (a sixteenth of the sample or fewer reach `lo`, or fewer than 64 sampled
    // keys: most ids masked): there the sample is coarsest (each sampled weight a large
    // share; 64 keys place a share to about ±12 %, far wider than `δ`), and unseen heavy ids
    // may hold the crossing itself. Gather every key from one that several times as many
    // sampled keys reach (few ids still) up: only the mass above `lo` must then reach the
    // target.
    let few = match bracket {
        Some((_, (_, reach))) => reach,
        None => above_floor / 16,
    };
    if few * 16 > above_floor && few >= 64 {
        return bracket.map(|(lo, (hi, _))| (lo, hi));
    }
    let want = (few << (1 + 2 * attempt)) + (16 << (2 * attempt));
    // The boundary of the bin where the sampled keys from the top reach `want` (fewer sampled
    // keys than that: every key from `floor` up; the cap on the candidates still applies).
    let mut reach = 0usize;
    let mut lo = floor.max(1);
    for b in (0..=top).rev() {
        reach += count[b] as usize;
        if reach > want {
            lo = lo.max((b as u32) << SHIFT);
            break;
        }
    }
    Some((lo, max_key + 1))
}

#[cfg(test)]
mod tests;
