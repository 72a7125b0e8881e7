//! Lane-wise row kernels, compiled once per instruction set and picked at run time.
//!
//! Every kernel works on a range `start..end` of a row (so a caller can split one row over
//! threads) and returns a result that combines exactly with the results of other ranges: a
//! [`Best`] under the total order "larger key, then lower id", or a wrapping `i64` sum. Inside a
//! range each kernel keeps one running best (or sum) per lane of a fixed-size block, written as
//! plain arrays indexed by lane so that LLVM turns each loop into vector instructions of the
//! width the enabled target features allow.
//!
//! The x86-64 baseline is SSE2, which gives 4-wide float vectors and no 32×32→64 vector multiply
//! of a useful width, so the same generic code is also instantiated inside
//! `#[target_feature(enable = "avx2")]` and AVX-512 functions, chosen once per process by
//! [`Isa::detect`]. Enabling a target feature never changes results here: Rust does not contract
//! `a × b + c` into an FMA on its own (and nothing here calls `mul_add`), and the operations used
//! (`+ − × ÷`, comparisons, selects, exact conversions, integer multiplies) are exactly rounded
//! IEEE / integer operations at every vector width.

// Lane loops index several arrays in lockstep by lane number: the shape the vectoriser wants.
#![allow(clippy::needless_range_loop)]

use specula_core::verify::RaceRng;
use specula_core::verify::exponential::{draw, exponential, exponential_floor};
use specula_core::verify::fmath::ln_p;
use specula_core::verify::philox::{STREAM_RACE, STREAM_RACE_LO, key, philox4x32_10};

/// The best `(key, id)` of a range under "larger key wins, equal keys go to the lower id".
///
/// `id == u32::MAX` means "nothing yet" (no real row id can be `u32::MAX`: validation keeps
/// every id below it).
///
/// Keys are `f64`: race keys are computed in `f64`, and argmax keys (`f32` values) convert
/// exactly and in order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Best {
    pub key: f64,
    pub id: u32,
}

impl Best {
    /// No race candidate: every candidate's key is `≥ 0`, so `−1` is below them all.
    pub const NO_RACE: Self = Self {
        key: -1.0,
        id: u32::MAX,
    };
    /// No argmax candidate: only values `> −∞` ever become a best.
    pub const NO_ARGMAX: Self = Self {
        key: f64::NEG_INFINITY,
        id: u32::MAX,
    };

    /// The better of two results. The order on (key, −id) is total over the keys that occur
    /// (no NaN is ever a best), so merging in any order and grouping gives the same result.
    #[inline(always)]
    #[must_use]
    pub fn merge(self, other: Self) -> Self {
        if other.key > self.key || (other.key == self.key && other.id < self.id) {
            other
        } else {
            self
        }
    }
}

/// Whether the CPU has AVX2, FMA and F16C, what [`Isa::Avx2`] stands for (every AVX2 CPU has
/// the other two: FMA since Haswell and Piledriver, F16C since Ivy Bridge; the bound's pass
/// uses both).
#[cfg(target_arch = "x86_64")]
fn avx2_fma_f16c() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The instruction set the kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The target's baseline (SSE2 on x86-64, whatever the target enables elsewhere).
    Portable,
    /// x86-64 with AVX2 (and FMA and F16C): 8 lanes of 32 bits.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86-64 with AVX-512 F/DQ/BW/VL: 16 lanes of 32 bits.
    #[cfg(specula_avx512)]
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports, detected once and cached. The environment
    /// variable `SPECULA_CPU_ISA` (`avx2` or `portable`) caps it, so that benchmarks can time
    /// the narrower kernels on a wider CPU (results are the same bits on every instruction
    /// set); a value naming a set the CPU lacks, or any other value, changes nothing.
    #[must_use]
    pub fn detect() -> Self {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let best = Self::best();
            match std::env::var("SPECULA_CPU_ISA").as_deref() {
                Ok("portable") => Isa::Portable,
                #[cfg(specula_avx512)]
                Ok("avx2") if best == Isa::Avx512 && avx2_fma_f16c() => Isa::Avx2,
                _ => best,
            }
        })
    }

    /// The best instruction set this CPU supports.
    fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            #[cfg(specula_avx512)]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                // Every AVX-512 CPU has it; the candidate gather counts its kept lanes with it.
                && std::arch::is_x86_feature_detected!("popcnt")
            {
                return Isa::Avx512;
            }
            if avx2_fma_f16c() {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every instruction set this CPU can run, for tests that compare them all.
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if avx2_fma_f16c() {
                v.push(Isa::Avx2);
            }
            #[cfg(specula_avx512)]
            if Isa::best() == Isa::Avx512 {
                v.push(Isa::Avx512);
            }
        }
        v
    }
}

/// The race weights of a row, produced a block at a time.
pub(crate) trait Weights: Copy {
    /// The row length `V`.
    fn len(&self) -> usize;
    /// Writes the weights of ids `start .. start + N` into `out`, with `0.0` (never a candidate)
    /// for ids at or past `end` (`start < end ≤ len`), computed in `f32`: positive exactly when
    /// [`exact`](Self::exact) is, and otherwise within one `f32` rounding of it (the skip test's
    /// input only).
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]);
    /// The weight of id `v` as the rules define it, in `f64` (the key's input).
    fn exact(&self, v: usize) -> f64;
    /// The weights as [`CutParts`], where they are of that form, for kernels that compute
    /// [`block`](Self::block) themselves; `None`: only `block` gives them.
    #[inline(always)]
    fn cut_parts(&self) -> Option<CutParts<'_>> {
        None
    }
}

/// Weights of the form [`CutRow::block`] computes (and [`Row`] and [`Residual`] are, with
/// `up = down = 1` and threshold 0: `x·1 = x` for every `x`, NaN included up to its payload,
/// which no test reads): id `i`'s value is `w_i·u_i` with `u_i = up` where `w_i > 0` and `down`
/// otherwise, or `0` where the key (`w_i`'s bits where `w_i > 0`, else 0) is below
/// `threshold`, minus `draft_i` where there is a draft row.
#[derive(Clone, Copy)]
pub(crate) struct CutParts<'a> {
    pub w: &'a [f32],
    pub threshold: u32,
    pub up: f32,
    pub down: f32,
    pub draft: Option<&'a [f32]>,
}

/// Copies `row[start..end]` (at most `N` values) into `out`, zero-padding the rest.
#[inline(always)]
fn load<const N: usize>(row: &[f32], start: usize, end: usize, out: &mut [f32; N]) {
    if end - start >= N {
        // A full block: a fixed-size copy the compiler does with whole vectors.
        let src: &[f32; N] = row[start..start + N].try_into().expect("N values");
        *out = *src;
    } else {
        let n = end - start;
        out[..n].copy_from_slice(&row[start..end]);
        out[n..].fill(0.0);
    }
}

/// A row's own values as weights.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a>(pub &'a [f32]);

impl Weights for Row<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        load(self.0, start, end, out);
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        f64::from(self.0[v])
    }
    #[inline(always)]
    fn cut_parts(&self) -> Option<CutParts<'_>> {
        Some(CutParts {
            w: self.0,
            threshold: 0,
            up: 1.0,
            down: 1.0,
            draft: None,
        })
    }
}

/// `target − draft`, one `f32` subtraction per id (the residual of rejection sampling).
#[derive(Clone, Copy)]
pub(crate) struct Residual<'a> {
    pub target: &'a [f32],
    pub draft: &'a [f32],
}

impl Weights for Residual<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.target.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        let mut d = [0f32; N];
        load(self.target, start, end, out);
        load(self.draft, start, end, &mut d);
        // Padding is 0 − 0 = 0: still never a candidate.
        for i in 0..N {
            out[i] -= d[i];
        }
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        f64::from(self.target[v]) - f64::from(self.draft[v])
    }
    #[inline(always)]
    fn cut_parts(&self) -> Option<CutParts<'_>> {
        Some(CutParts {
            w: self.target,
            threshold: 0,
            up: 1.0,
            down: 1.0,
            draft: Some(self.draft),
        })
    }
}

/// `target − one_hot(token)`: the residual of a drafter without probabilities.
#[derive(Clone, Copy)]
pub(crate) struct OneHot<'a> {
    pub target: &'a [f32],
    pub token: u32,
}

impl Weights for OneHot<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.target.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        load(self.target, start, end, out);
        // `t − 0.0` is `t` bit for bit, so only the draft token's weight changes.
        let t = self.token as usize;
        if t >= start && t < end && t - start < N {
            out[t - start] -= 1.0;
        }
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        f64::from(self.target[v]) - if v == self.token as usize { 1.0 } else { 0.0 }
    }
}

/// What a [`CutRow`]'s race subtracts from the probabilities: nothing (the plain race), a
/// binary32 draft row (the residual), or `1.0` at one token (a drafter without probabilities).
#[derive(Clone, Copy)]
pub(crate) enum Minus<'a> {
    Nothing,
    Draft(&'a [f32]),
    OneHot(u32),
}

/// The race weights of the probabilities `p_v = cut.p(w_v)` of weights `w` that were never
/// written out (a softmax row's weights, or stored probabilities), minus [`Minus`]: the race
/// reads the weights and divides only at the ids its skip test leaves open (about `ln V` per
/// race), where the written-out row cost a division per id, a store and a reload of every id.
///
/// Why the race gives the bits of the written row's race (`Row`, `Residual`, `OneHot` over
/// `p`): [`block`](Weights::block) returns, for each id, `RN32(w·u)` with `u = up ≥ 1/S` for
/// `w > 0` and `u = down ≤ 1/S` otherwise (`0` below the cut's threshold, as `p`), minus the
/// draft part in binary32, as those rows' blocks subtract it. Rounding is monotone, so
/// `RN32(w·u) ≥ RN32(w/S) = p` (for `w ≤ 0` too: `w·down ≥ w/S` there; NaN stays NaN), and
/// then `RN32(that − q) ≥ RN32(p − q)`: each block value is at least the written row's. The
/// skip test rules an id out only when its value lies below a bound, so every id it rules out
/// here it rules out there (whose proof covers the key), and every id open there (value `> 0`)
/// is open here. An id open here alone gets its exact key from [`exact`](Weights::exact),
/// which is the written row's weight where it is `> 0` and `−∞` (never a best: every best has
/// a key `≥ 0`, [`Best::NO_RACE`] is `−1`) where it is not, the weight for which the written
/// row has no candidate. So the race sees the same candidates with the same keys plus
/// candidates that never win: the same best.
#[derive(Clone, Copy)]
pub(crate) struct CutRow<'a> {
    w: &'a [f32],
    cut: specula_core::verify::Cut,
    up: f32,
    down: f32,
    minus: Minus<'a>,
}

impl<'a> CutRow<'a> {
    /// The race weights `cut.p(w_v)` minus `minus` (`minus`'s draft row as long as `w`), or
    /// `None` where the cut's sum is 0 or its reciprocal out of the normal binary32 range
    /// (the caller writes the row out then).
    pub(crate) fn new(
        w: &'a [f32],
        cut: specula_core::verify::Cut,
        minus: Minus<'a>,
    ) -> Option<Self> {
        let s = (cut.fixed as f64) * (1.0 / 18_446_744_073_709_551_616.0);
        // `1/s` to within a binary64 rounding, widened by far more than that and rounded
        // outwards to binary32: `down ≤ 1/S ≤ up`.
        let r = 1.0 / s;
        let (hi, lo) = (r * (1.0 + 1e-12), r * (1.0 - 1e-12));
        let mut up = hi as f32;
        if f64::from(up) < hi {
            up = f32::from_bits(up.to_bits() + 1);
        }
        let mut down = lo as f32;
        if f64::from(down) > lo {
            down = f32::from_bits(down.to_bits() - 1);
        }
        if cut.fixed == 0 || !up.is_finite() || !down.is_normal() {
            return None;
        }
        if let Minus::Draft(d) = minus {
            debug_assert_eq!(d.len(), w.len());
        }
        Some(Self {
            w,
            cut,
            up,
            down,
            minus,
        })
    }

    /// The same probabilities minus `minus` instead.
    pub(crate) fn minus(self, minus: Minus<'a>) -> Self {
        if let Minus::Draft(d) = minus {
            debug_assert_eq!(d.len(), self.w.len());
        }
        Self { minus, ..self }
    }
}

impl Weights for CutRow<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.w.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize, end: usize, out: &mut [f32; N]) {
        let mut w = [0f32; N];
        load(self.w, start, end, &mut w);
        let th = self.cut.threshold;
        // Padding is 0: `0·u = 0`, minus a padded 0: never a candidate.
        for i in 0..N {
            let key = if w[i] > 0.0 { w[i].to_bits() } else { 0 };
            let u = if w[i] > 0.0 { self.up } else { self.down };
            out[i] = if key >= th { w[i] * u } else { 0.0 };
        }
        match self.minus {
            Minus::Nothing => {}
            Minus::Draft(d) => {
                let mut q = [0f32; N];
                load(d, start, end, &mut q);
                for i in 0..N {
                    out[i] -= q[i];
                }
            }
            Minus::OneHot(t) => {
                let t = t as usize;
                if t >= start && t < end && t - start < N {
                    out[t - start] -= 1.0;
                }
            }
        }
    }
    #[inline(always)]
    fn exact(&self, v: usize) -> f64 {
        let p = f64::from(self.cut.p(self.w[v]));
        let x = match self.minus {
            Minus::Nothing => p,
            Minus::Draft(d) => p - f64::from(d[v]),
            Minus::OneHot(t) => p - if v == t as usize { 1.0 } else { 0.0 },
        };
        if x > 0.0 { x } else { f64::NEG_INFINITY }
    }
    #[inline(always)]
    fn cut_parts(&self) -> Option<CutParts<'_>> {
        let draft = match self.minus {
            Minus::Nothing => None,
            Minus::Draft(d) => Some(d),
            Minus::OneHot(_) => return None,
        };
        Some(CutParts {
            w: self.w,
            threshold: self.cut.threshold,
            up: self.up,
            down: self.down,
            draft,
        })
    }
}

/// The skip test's margin: absorbs the roundings between the `f32` test and the exact key
/// (the `f32` copy of the lane's best key, two `f32` products, the `f32` weight, the `f64`
/// division and the map's error `ETA`), together below `(1 + 2⁻²⁴)⁴·(1 + 2⁻⁴⁷) < 1 + 2⁻²¹`.
const SHRINK: f32 = 1.0 - 1.0 / 1_048_576.0;

/// The `f32` stand-in for a lane's best key in the skip test: at most the key (rounded to
/// nearest, so within one rounding above it) and at most `f32::MAX`, so the test stays
/// conservative when keys exceed the `f32` range.
#[inline(always)]
fn skip_key(key: f64) -> f32 {
    key.min(f64::from(f32::MAX)) as f32
}

/// Philox4x32-10 of `G` consecutive groups (lanes) from group `base`, the words returned in id
/// order (`out[4g + w]` is word `w` of group `g`), as the race consumes them.
#[inline(always)]
fn philox_block<const G: usize, const N: usize>(
    base: u32,
    ctr: [u32; 3],
    key: [u32; 2],
    out: &mut [u32; N],
) {
    // Each lane holds its 32-bit word in a u64 whose upper half is left as garbage: the
    // multiplies read only the low halves (`& 0xFFFF_FFFF`, one 32×32→64 vector multiply),
    // the XORs keep low halves exact, and only low halves are returned. That avoids widening
    // and narrowing the words every round.
    const LO: u64 = 0xFFFF_FFFF;
    let mut c0 = [0u64; G];
    for g in 0..G {
        c0[g] = u64::from(base.wrapping_add(g as u32));
    }
    let mut c1 = [u64::from(ctr[0]); G];
    let mut c2 = [u64::from(ctr[1]); G];
    let mut c3 = [u64::from(ctr[2]); G];
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        for g in 0..G {
            let p0 = (c0[g] & LO) * 0xD251_1F53;
            let p1 = (c2[g] & LO) * 0xCD9E_8D57;
            let n0 = (p1 >> 32) ^ c1[g] ^ u64::from(k0);
            let n2 = (p0 >> 32) ^ c3[g] ^ u64::from(k1);
            c0[g] = n0;
            c1[g] = p1;
            c2[g] = n2;
            c3[g] = p0;
        }
        // The key is bumped between rounds only, never after the tenth.
        if round < 9 {
            k0 = k0.wrapping_add(0x9E37_79B9);
            k1 = k1.wrapping_add(0xBB67_AE85);
        }
    }
    for g in 0..G {
        out[4 * g] = c0[g] as u32;
        out[4 * g + 1] = c1[g] as u32;
        out[4 * g + 2] = c2[g] as u32;
        out[4 * g + 3] = c3[g] as u32;
    }
}

/// [`exponential`] kept out of line: the race's hot loop stays small enough for the vectoriser,
/// and the map runs only for the few ids the skip test cannot rule out.
#[inline(never)]
fn exponential_cold(x: u64) -> f64 {
    exponential(x)
}

/// The ids of one race block that the skip test left open (bit `i` of `open`: id `s + i`, its
/// stream-1 word `words[i]`), in increasing order: each needs its stream-2 word (one Philox
/// block per group of four ids, computed once; `lo_ctr`: the block's first group and the
/// stream-2 counter) and the binary64 map, and replaces `best` only on a strictly larger key,
/// so a range's result is its largest key with the lowest id among equals.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn visit_open<W: Weights>(
    w: &W,
    mut open: u64,
    s: usize,
    words: &[u32],
    lo_ctr: [u32; 4],
    k: [u32; 2],
    best: &mut Best,
    best_skip: &mut f32,
) {
    let [base, ctr_lo @ ..] = lo_ctr;
    let mut lo_group = u32::MAX;
    let mut lo = [0u32; 4];
    while open != 0 {
        let i = open.trailing_zeros() as usize;
        open &= open - 1;
        let group = base + (i / 4) as u32;
        if group != lo_group {
            lo = philox4x32_10([group, ctr_lo[0], ctr_lo[1], ctr_lo[2]], k);
            lo_group = group;
        }
        let key = w.exact(s + i) / exponential_cold(draw(words[i], lo[i % 4]));
        if key > best.key {
            *best = Best {
                key,
                id: (s + i) as u32,
            };
            *best_skip = skip_key(key);
        }
    }
}

/// The race over ids `start..end` of `w` (`start` a multiple of 4, so blocks start on Philox
/// group boundaries): the best (key, id) among candidates, or [`Best::NO_RACE`].
///
/// Computing a key needs the id's stream-2 word and the binary64 map, so the kernel computes it
/// only for ids that might beat the best key `b` found so far in the range. The key `w / E`
/// exceeds `b` only if `w > b × E`, and `E ≥ F` with `F = exponential_floor(high word)`, so
/// `w_f32 < (b_f32 × F) × SHRINK` proves the key is below `b` (see [`SHRINK`]; for `b = −1` the
/// bound is negative and never rules out a candidate, for `F = 0` it is 0 and never does either).
/// One vector pass per block builds the mask of ids the test cannot rule out; those few are
/// visited in increasing id order and replace `b` only on a strictly larger key, so the range's
/// result is its largest key with the lowest id among equals. Keeping one `b` for the whole
/// range (not one per lane) makes the test as strong as it can be: after the first block only
/// about `ln V` ids per race need their exact key.
#[inline(always)]
fn race_range<W: Weights, const G: usize, const N: usize>(
    rng: RaceRng,
    w: W,
    start: usize,
    end: usize,
) -> Best {
    debug_assert!(N == 4 * G && N <= 64 && start % 4 == 0 && end <= w.len());
    let k = key(rng.seed);
    let ctr = [
        (rng.position << 2) | STREAM_RACE,
        rng.offset as u32,
        (rng.offset >> 32) as u32,
    ];
    let ctr_lo = [(rng.position << 2) | STREAM_RACE_LO, ctr[1], ctr[2]];
    let mut best = Best::NO_RACE;
    let mut best_skip = -1.0f32;
    let mut wt = [0f32; N];
    let mut words = [0u32; N];
    let mut s = start;
    while s < end {
        w.block(s, end, &mut wt);
        // A block without a positive weight has no candidate (sparse rows, or a residual where
        // the draft covers the target): skip even its random numbers.
        let mut any = false;
        for i in 0..N {
            any |= wt[i] > 0.0;
        }
        if any {
            // V ≤ u32::MAX, so the group index s / 4 fits 32 bits.
            let base = (s / 4) as u32;
            philox_block::<G, N>(base, ctr, k, &mut words);
            // One bit per id that the test cannot rule out (N ≤ 64): a straight vector pass.
            let mut open = 0u64;
            for i in 0..N {
                let bound = (best_skip * exponential_floor(words[i])) * SHRINK;
                // NaN weights fail `> 0`: never candidates. A NaN bound (b = +∞ times F = 0)
                // proves nothing, so the id stays open.
                let proven = wt[i] < bound;
                open |= u64::from(wt[i] > 0.0 && !proven) << i;
            }
            visit_open(
                &w,
                open,
                s,
                &words,
                [base, ctr_lo[0], ctr_lo[1], ctr_lo[2]],
                k,
                &mut best,
                &mut best_skip,
            );
        }
        s += N;
    }
    best
}

/// Argmax over `row[start..end]` (NaN never wins, being below every comparison), or
/// [`Best::NO_ARGMAX`].
#[inline(always)]
fn argmax_range<const N: usize>(row: &[f32], start: usize, end: usize) -> Best {
    let mut best = [f32::NEG_INFINITY; N];
    let mut idx = [u32::MAX; N];
    let chunks = row[start..end].chunks_exact(N);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        let base = (start + c * N) as u32;
        for l in 0..N {
            // Strict `>`: within a lane ids only grow, so the lowest id of equal keys stays.
            if chunk[l] > best[l] {
                best[l] = chunk[l];
                idx[l] = base + l as u32;
            }
        }
    }
    let mut out = Best::NO_ARGMAX;
    for l in 0..N {
        out = out.merge(Best {
            key: f64::from(best[l]),
            id: idx[l],
        });
    }
    let tail_base = (end - tail.len()) as u32;
    for (i, &x) in tail.iter().enumerate() {
        if f64::from(x) > out.key {
            out = Best {
                key: f64::from(x),
                id: tail_base + i as u32,
            };
        }
    }
    out
}

/// 2⁴⁰, the scale of the fixed-point entropy terms (as in `specula_core::verify::fmath`).
const TWO_40: f32 = f32::from_bits(0x5380_0000);

/// `t as i64` (truncation toward zero, saturating at `i64::MIN` / `i64::MAX`) for every
/// non-NaN `t`, from the bits alone: LLVM turns Rust's saturating `as` into one scalar
/// conversion per lane, while these shifts and selects vectorise on 64-bit lanes.
#[inline(always)]
fn f32_to_i64_sat(t: f32) -> i64 {
    let bits = t.to_bits();
    let e = (bits >> 23) & 0xFF;
    // |t| = mant × 2^(e − 150) for normal t (subnormals and zero have e = 0: |t| < 1).
    let mant = u64::from((bits & 0x007F_FFFF) | 0x0080_0000);
    // Both shift amounts are clamped so the unused one cannot overflow; selects pick the right one.
    let up = mant << e.wrapping_sub(150).min(63);
    let down = mant >> 150u32.wrapping_sub(e).min(63);
    let mag = if e >= 150 { up } else { down };
    let mag = if e < 127 { 0 } else { mag };
    let negative = bits >> 31 != 0;
    let v = if negative {
        (mag as i64).wrapping_neg()
    } else {
        mag as i64
    };
    // |t| ≥ 2⁶³ (e ≥ 190): saturate. −2⁶³ itself gives i64::MIN either way.
    let sat = if negative { i64::MIN } else { i64::MAX };
    if e >= 190 { sat } else { v }
}

/// [`entropy_term`](specula_core::verify::fmath::entropy_term), the same bits, written branch-free with
/// [`f32_to_i64_sat`] so it vectorises.
#[inline(always)]
fn entropy_term(p: f32) -> i64 {
    // Normal positive values and +inf (NaN compares false).
    let valid = p >= f32::MIN_POSITIVE;
    let term = -(p * ln_p(p));
    // For valid p the term is never NaN (−∞ for +inf), where the conversion matches `as i64`.
    let fixed = f32_to_i64_sat(term * TWO_40);
    if valid { fixed } else { 0 }
}

/// The wrapping sum of the fixed-point entropy terms of `row[start..end]`.
#[inline(always)]
fn entropy_range<const N: usize>(row: &[f32], start: usize, end: usize) -> i64 {
    let mut sums = [0i64; N];
    let chunks = row[start..end].chunks_exact(N);
    let tail = chunks.remainder();
    for chunk in chunks {
        for l in 0..N {
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
    sum
}

// ---- softmax (target logits): `core/DETERMINISM.md`, "Target logits and temperature" ----
//
// Where the time goes, and why the kernels below look as they do (measured on this machine
// with the `softmax_pass_timing` test, one 128k row, AVX-512): a binary32 division per id
// (`l / t`) and a binary64 division per id (`e / S`) cost more than the rest of the pass, and
// Rust's saturating `as` conversions add fix-ups to every lane. So:
// - the maximum is taken over the logits and divided once (division by `t > 0` is monotone,
//   so `max(l) / t` is the rules' `max(l / t)`, NaN and the sign of zero included);
// - in the AVX-512 write-out (`avx512` below), `l / t` and `e / S` are products with a binary64
//   reciprocal rounded to binary32, which gives the rules' bits unless the product lies within
//   a few binary64 ulps of a binary32 rounding boundary (`near_boundary`); a block with such a
//   lane is recomputed with the divisions themselves (about one lane in 2²⁴). The generic lane
//   code keeps the divisions: with the test the vectoriser gives up, which costs more;
// - the sum pass (`softmax_pass_range`, every instruction set) keeps the binary32 division
//   `l / t` (one `vdivps` per 8 or 16 ids, cheaper than the reciprocal and its test once the
//   rest of the pass is 32-bit) and sums the fixed-point terms as three 32-bit pieces
//   (`fixed_pieces`) instead of binary64 products converted to 64-bit integers: 2.3× faster
//   with AVX2 and 4× on the baseline, and no slower than the former AVX-512 intrinsics. Its
//   `l / t` stays a division on purpose: on this machine (Xeon, family 6 model 207) the
//   divider works beside the ~45 other vector instructions per 16 ids, so even the inexact
//   product `l × RN(1/t)` in its place made the f32 passes only 8–14% faster and the bf16
//   ones no faster, and an exact replacement (that product and two Markstein corrections,
//   five FMAs, plus a per-block range test falling back to the division) was no faster for
//   f32 and 2× slower for bf16 (issue 30, 2026-12-06, `softmax_pass_timing`);
// - `exp_p` clamps its input before the float → int conversion, so it is a plain truncation.

const INV_LN2: f32 = f32::from_bits(0x3FB8_AA3B);
const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
const LN2_LO: f32 = f32::from_bits(0x35BF_BE8E);
const E720: f32 = f32::from_bits(0x3AB6_0B61);
const E120: f32 = f32::from_bits(0x3C08_8889);
const E24: f32 = f32::from_bits(0x3D2A_AAAB);
const E6: f32 = f32::from_bits(0x3E2A_AAAB);

/// [`exp_p`](specula_core::verify::fmath::exp_p), the same bits for every `x`, written with selects
/// instead of early returns so that it vectorises.
#[inline(always)]
fn exp_p(x: f32) -> f32 {
    // In range (−87 < x ≤ 88) the clamp changes nothing; out of range (NaN included) the value
    // is discarded by the selects at the end, so any in-range stand-in will do.
    let xc = if x > -87.0 { x } else { -87.0 };
    let xc = if xc > 88.0 { 88.0 } else { xc };
    let t = xc * INV_LN2;
    let tt = if t < 0.0 { t - 0.5 } else { t + 0.5 };
    // SAFETY: `xc ∈ [−87, 88]`, so `tt` is finite with `|tt| < 128`, representable in i32 after
    // truncation (the conversion's precondition); for these values it is the same truncation
    // as `tt as i32`.
    let n: i32 = unsafe { tt.to_int_unchecked() };
    let nf = n as f32;
    let r = (xc - nf * LN2_HI) - nf * LN2_LO;
    let mut p = E720;
    p = E120 + r * p;
    p = E24 + r * p;
    p = E6 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    let scale = f32::from_bits((n.wrapping_add(127) as u32) << 23);
    let v = p * scale;
    let v = if n < -126 { 0.0 } else { v };
    let v = if x > 88.0 { f32::INFINITY } else { v };
    // Last, so NaN (and x ≤ −87) give 0.
    if x > -87.0 { v } else { 0.0 }
}

/// [`exp_p`] for `x ≤ 0` or NaN, the same bits, with the selects that cannot fire there left
/// out (the softmax evaluates `x = z − m` with `m` the row's largest `z`: `x ≤ 0`, or NaN for
/// `±∞ − ±∞`). For `−87 < x ≤ 0`, `t = x / ln 2 ∈ (−125.6, 0]` rounds by `t − 0.5` (for
/// `t = ±0` both `t ± 0.5` truncate to 0), so `n ≥ −126` (no underflow select) and `x ≤ 88` (no
/// overflow select). A positive `x` (a caller's wrong maximum) is clamped to 0: a wrong value,
/// never an out-of-range conversion.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    // NaN and x ≤ −87 become −87 (their value is discarded at the end).
    let xc = if x > -87.0 { x } else { -87.0 };
    let xc = if xc < 0.0 { xc } else { 0.0 };
    let t = xc * INV_LN2;
    // SAFETY: xc ∈ [−87, 0], so t − 0.5 ∈ [−126.1, −0.5]: representable in i32 after
    // truncation, and the same truncation as `as i32`.
    let n: i32 = unsafe { (t - 0.5).to_int_unchecked() };
    let nf = n as f32;
    let r = (xc - nf * LN2_HI) - nf * LN2_LO;
    let mut p = E720;
    p = E120 + r * p;
    p = E24 + r * p;
    p = E6 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    let v = p * f32::from_bits(((n + 127) as u32) << 23);
    if x > -87.0 { v } else { 0.0 }
}

/// `2⁻¹²⁵`, `2¹²⁷`: binary64 values whose binary32 rounding is certainly a normal number.
/// Read by the intrinsic write-outs (build.rs: not compiled before Rust 1.87) and the tests.
#[cfg(any(test, specula_avx2_intrinsics))]
const F32_SAFE_MIN: f64 = f64::from_bits(0x3820_0000_0000_0000);
#[cfg(any(test, specula_avx2_intrinsics))]
const F32_SAFE_MAX: f64 = f64::from_bits(0x47E0_0000_0000_0000);

/// Whether rounding the binary64 `q` to binary32 may differ from rounding the value `q`
/// approximates (within 2⁻⁵¹ relative, see the callers) or its binary64 rounding: `q` within
/// 16 ulps of a binary32 rounding boundary (the midpoints between binary32 values: low 29
/// significand bits `0x1000_0000`), or outside the normal binary32 range (zero excepted: a zero
/// product is exact). 16 ulps leaves room for the 2–3 ulps the approximations can be off, also
/// across a binade boundary where the ulp doubles.
#[cfg(test)]
#[inline(always)]
fn near_boundary(q: f64) -> bool {
    let low = (q.to_bits() & 0x1FFF_FFFF) as i64;
    let near = (low - 0x1000_0000).unsigned_abs() <= 16;
    let a = q.abs();
    let normal = (F32_SAFE_MIN..=F32_SAFE_MAX).contains(&a);
    near || !(normal || a == 0.0)
}

/// `l / t` as `(l as f64) × inv_t` rounded to binary32, and whether that may differ from the
/// binary32 quotient. `inv_t = 1 / (t as f64)` is within 2⁻⁵³ of `1/t`, so the product is within
/// `2⁻⁵¹·⁹` (relative) of the exact quotient, whose binary32 rounding is `l / t`: equal unless a
/// rounding boundary lies within that distance ([`near_boundary`]).
#[cfg(test)]
#[inline(always)]
fn div_t(l: f32, inv_t: f64) -> (f32, bool) {
    let q = f64::from(l) * inv_t;
    (q as f32, near_boundary(q))
}

/// `((e as f64) / s) as f32` as `(e as f64) × inv_s` rounded to binary32, and whether that may
/// differ. `inv_s = 1 / s` (binary64): the product is within `2⁻⁵¹·⁹` of `e / s` and within
/// 2.6 ulps of its binary64 rounding, so both round to the same binary32 unless a rounding
/// boundary is near ([`near_boundary`]).
#[cfg(test)]
#[inline(always)]
fn div_s(e: f32, inv_s: f64) -> (f32, bool) {
    let q = f64::from(e) * inv_s;
    (q as f32, near_boundary(q))
}

/// The largest logit of `row` under `softmax_max`'s rule (NaN never wins), per lane; the
/// caller divides it by `t`.
#[inline(always)]
fn logit_max_range<R: LogitRow, const N: usize>(row: R) -> f32 {
    let mut m = [f32::NEG_INFINITY; N];
    let len = row.len();
    let body = len - len % N;
    let mut s = 0;
    while s < body {
        // A row's first read: its lines asked for ahead ([`FIRST_READ_AHEAD`]).
        row.prefetch::<N>(s + FIRST_READ_AHEAD);
        let c: [f32; N] = row.block(s);
        for l in 0..N {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
        s += N;
    }
    let mut best = f32::NEG_INFINITY;
    for z in m.into_iter().chain((body..len).map(|i| row.at(i))) {
        best = specula_core::verify::softmax_max(best, z);
    }
    best
}

/// A row of logits as the softmax kernels read it: binary32, or bf16 / f16 bit patterns
/// widened exactly ([`Half16::value`]) as they are loaded, so a half row is never copied out
/// to binary32 first (that copy cost a write and a read of four bytes per id, while the row
/// itself is two).
pub(crate) trait LogitRow: Copy {
    /// The row length `V`.
    fn len(&self) -> usize;
    /// The binary32 values of ids `start .. start + N` (all `< len`).
    fn block<const N: usize>(&self, start: usize) -> [f32; N];
    /// The binary32 value of id `i`.
    fn at(&self, i: usize) -> f32;

    /// The softmax weights `e_v = exp_p(l_v / t − max)` of ids `start .. start + N` (`max` the
    /// row's softmax maximum, so `l_v / t − max ≤ 0` or NaN).
    #[inline(always)]
    fn weights<const N: usize>(&self, start: usize, t: f32, max: f32) -> [f32; N] {
        let l: [f32; N] = self.block(start);
        let mut e = [0f32; N];
        for i in 0..N {
            e[i] = exp_nonpos(l[i] / t - max);
        }
        e
    }

    /// The softmax weight of id `i` (as [`weights`](Self::weights)).
    #[inline(always)]
    fn weight_at(&self, i: usize, t: f32, max: f32) -> f32 {
        exp_p(self.at(i) / t - max)
    }

    /// The row's 16-bit patterns and their format, when it is a half row: its weights can
    /// then be looked up in a table of the patterns it holds ([`weight_table`]).
    #[inline(always)]
    fn half_bits(&self) -> Option<(Half16, &[u16])> {
        None
    }

    /// Asks for the cache lines of ids `start .. start + N` ahead of their first read (a hint:
    /// nothing past the row, no effect on any result); the default asks for nothing.
    #[inline(always)]
    fn prefetch<const N: usize>(&self, start: usize) {
        let _ = start;
    }
}

/// How far ahead of its reads a pass that reads a row first (from memory, not from the cache)
/// asks for the row's lines, in ids: 8 KiB of binary32 values, 4 KiB of half ones. Without it
/// such passes stalled on their loads wherever the lanes' work kept too few of them in flight
/// (the sum bound's and the half rows' pattern span: about half of their time).
const FIRST_READ_AHEAD: usize = 2048;

/// Asks for the cache lines of `s[start .. start + n]` (clipped to `s`) to be brought into L1
/// ahead of their first read, on x86-64; elsewhere nothing. A hint: no effect on any result.
#[inline(always)]
fn prefetch_lines<T>(s: &[T], start: usize, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let per_line = (64 / std::mem::size_of::<T>()).max(1);
        let end = s.len().min(start.saturating_add(n));
        let mut i = start;
        while i < end {
            // SAFETY: `i < s.len()`, so the address lies inside `s`; a prefetch reads nothing
            // into the program and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(s.as_ptr().add(i).cast::<i8>()) };
            i += per_line;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, start, n);
}

impl LogitRow for &[f32] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize) -> [f32; N] {
        self[start..start + N].try_into().expect("N values")
    }
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self[i]
    }
    #[inline(always)]
    fn prefetch<const N: usize>(&self, start: usize) {
        prefetch_lines(self, start, N);
    }
}

/// The two 16-bit logit formats, both sign-magnitude: within a sign, patterns order as their
/// values (exponent above mantissa, the widening exact and monotone), which the weight table's
/// collapse of tiny patterns relies on ([`weight_table`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Half16 {
    /// bfloat16: the high half of a binary32.
    Bf16,
    /// IEEE-754 binary16.
    F16,
}

impl Half16 {
    /// The binary32 value of pattern `p`, exact (`core/DETERMINISM.md`).
    #[inline(always)]
    pub(crate) fn value(self, p: u16) -> f32 {
        match self {
            Self::Bf16 => f32::from_bits(u32::from(p) << 16),
            Self::F16 => f16_value(p),
        }
    }

    /// The binary32 values of `N` patterns (one test of the format per block, not per lane).
    #[inline(always)]
    pub(crate) fn widen<const N: usize>(self, src: &[u16; N]) -> [f32; N] {
        let mut out = [0f32; N];
        match self {
            Self::Bf16 => {
                for l in 0..N {
                    out[l] = Self::Bf16.value(src[l]);
                }
            }
            Self::F16 => {
                for l in 0..N {
                    out[l] = f16_value(src[l]);
                }
            }
        }
        out
    }

    /// The pattern of `+∞`: the patterns of smaller magnitude are the finite ones, those of
    /// larger magnitude NaN.
    #[inline(always)]
    pub(crate) const fn inf(self) -> u32 {
        match self {
            Self::Bf16 => 0x7F80,
            Self::F16 => 0x7C00,
        }
    }
}

/// The binary32 value of f16 pattern `b`: the core's `f16_to_f32` (tested equal on every
/// pattern), without its branches and leading-zero count, so that the lane code vectorises.
/// Normals rebias the exponent (15 → 127); infinities and NaNs map exponent 31 to 255 with the
/// payload kept; a subnormal or zero `m·2⁻²⁴` is `(2⁻¹⁴ + m·2⁻²⁴) − 2⁻¹⁴`, two binary32 normals
/// whose difference is representable, hence exact (no subnormal operand either).
#[inline(always)]
fn f16_value(b: u16) -> f32 {
    let b = u32::from(b);
    let sign = (b & 0x8000) << 16;
    // Exponent and mantissa at their binary32 places, the exponent still biased by 15.
    let em = (b & 0x7FFF) << 13;
    let exp = em & 0x0F80_0000;
    let normal = em + (112 << 23);
    let mag = if exp == 0x0F80_0000 {
        normal + (112 << 23)
    } else if exp == 0 {
        (f32::from_bits(em + (113 << 23)) - f32::from_bits(113 << 23)).to_bits()
    } else {
        normal
    };
    f32::from_bits(sign | mag)
}

/// A bf16 row (bit patterns), widened exactly on load.
#[derive(Clone, Copy)]
pub(crate) struct Bf16Row<'a>(pub &'a [u16]);

/// An f16 row (binary16 bit patterns), widened exactly on load.
#[derive(Clone, Copy)]
pub(crate) struct F16Row<'a>(pub &'a [u16]);

/// An f16 row widened by F16C's `vcvtph2ps` (exact for every number; a NaN stays a NaN, and
/// the only weight that reads one is 0), 8 ids an instruction instead of the lane code's ~8
/// operations per id. Only built inside the sum bound's x86 functions, whose target features
/// (F16C: [`Isa::Avx2`] includes it, AVX-512F implies it) its loads need. (The exact passes
/// keep the lane code: measured, F16C there moved `verify_inputs`' f16 rows by −5 to +3 %.)
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct F16Wide<'a>(pub &'a [u16]);

#[cfg(target_arch = "x86_64")]
impl LogitRow for F16Wide<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize) -> [f32; N] {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
        let src = &self.0[start..start + N];
        let mut out = [0f32; N];
        if N % 8 != 0 {
            for (o, &b) in out.iter_mut().zip(src) {
                *o = Half16::F16.value(b);
            }
            return out;
        }
        for (o, b) in out.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
            // SAFETY: `b` holds 8 u16 (16 bytes, an unaligned load) and `o` 8 f32; this type
            // is only read inside the x86 functions, which enable F16C.
            unsafe {
                let h = _mm_loadu_si128(b.as_ptr().cast::<__m128i>());
                _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        out
    }
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        Half16::F16.value(self.0[i])
    }
    #[inline(always)]
    fn prefetch<const N: usize>(&self, start: usize) {
        prefetch_lines(self.0, start, N);
    }
}

/// An f16 row widened as [`F16Wide`] 16 ids an instruction (`vcvtph2ps` on 512 bits, the same
/// conversion: exact for every number, a NaN for every NaN): with 256 bits LLVM converted each
/// 16 ids in two halves and joined them (five operations instead of two). Only built inside
/// the sum bound's AVX-512 function, whose target features (AVX-512F) its loads need; a block
/// that 16 does not divide is [`F16Wide`]'s.
#[cfg(specula_avx512)]
#[derive(Clone, Copy)]
struct F16Wide512<'a>(pub &'a [u16]);

// The AVX-512 intrinsics are stable from 1.89, which `specula_avx512` requires (build.rs).
#[cfg(specula_avx512)]
#[clippy::msrv = "1.89"]
impl LogitRow for F16Wide512<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize) -> [f32; N] {
        use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
        if !N.is_multiple_of(16) {
            return F16Wide(self.0).block::<N>(start);
        }
        let src = &self.0[start..start + N];
        let mut out = [0f32; N];
        for (o, b) in out.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
            // SAFETY: `b` holds 16 u16 (32 bytes, an unaligned load) and `o` 16 f32; this type
            // is only read inside the AVX-512 function, which enables AVX-512F.
            unsafe {
                let h = _mm256_loadu_si256(b.as_ptr().cast::<__m256i>());
                _mm512_storeu_ps(o.as_mut_ptr(), _mm512_cvtph_ps(h));
            }
        }
        out
    }
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        Half16::F16.value(self.0[i])
    }
    #[inline(always)]
    fn prefetch<const N: usize>(&self, start: usize) {
        prefetch_lines(self.0, start, N);
    }
}

/// A bf16 row read a 32-bit word (two ids) at a time, for the sum bound only: a block of `N`
/// (even) ids holds the even ids' values first, then the odd ids' (`block(s)[k]` is id
/// `s + 2k`, `block(s)[N/2 + k]` id `s + 2k + 1`). On little-endian x86-64 the word's low half
/// is the even id's pattern, its high half the odd one's, so the even value is `w << 16` and
/// the odd one `w & 0xFFFF_0000`, both exact ([`Half16::value`]): one operation per 16 ids a
/// vector instead of a zero-extension and a shift. Only a pass whose result does not depend on
/// the order of the ids within a block may read it (a maximum, a bound's sum); an odd `N` reads
/// in id order.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Bf16Pairs<'a>(pub &'a [u16]);

#[cfg(target_arch = "x86_64")]
impl LogitRow for Bf16Pairs<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize) -> [f32; N] {
        let src = &self.0[start..start + N];
        let mut out = [0f32; N];
        if N % 2 != 0 {
            for (o, &b) in out.iter_mut().zip(src) {
                *o = Half16::Bf16.value(b);
            }
            return out;
        }
        let words = src.as_ptr().cast::<u32>();
        for k in 0..N / 2 {
            // SAFETY: `src` holds `N` u16, so the 4 bytes at `2k < N − 1` lie inside it (an
            // unaligned read); x86-64 is little-endian, so the low half is id `start + 2k`.
            let w = unsafe { words.add(k).read_unaligned() };
            out[k] = f32::from_bits(w << 16);
            out[N / 2 + k] = f32::from_bits(w & 0xFFFF_0000);
        }
        out
    }
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        Half16::Bf16.value(self.0[i])
    }
    #[inline(always)]
    fn prefetch<const N: usize>(&self, start: usize) {
        prefetch_lines(self.0, start, N);
    }
}

/// `LogitRow` for a half row type: the format's widening on load, its patterns for the table.
macro_rules! half_row {
    ($row:ident, $format:expr) => {
        impl LogitRow for $row<'_> {
            #[inline(always)]
            fn len(&self) -> usize {
                self.0.len()
            }
            #[inline(always)]
            fn block<const N: usize>(&self, start: usize) -> [f32; N] {
                let src: &[u16; N] = self.0[start..start + N].try_into().expect("N values");
                $format.widen(src)
            }
            #[inline(always)]
            fn at(&self, i: usize) -> f32 {
                $format.value(self.0[i])
            }
            #[inline(always)]
            fn half_bits(&self) -> Option<(Half16, &[u16])> {
                Some(($format, self.0))
            }
            #[inline(always)]
            fn prefetch<const N: usize>(&self, start: usize) {
                prefetch_lines(self.0, start, N);
            }
        }
    };
}
half_row!(Bf16Row, Half16::Bf16);
half_row!(F16Row, Half16::F16);

/// Writes `values` widened into `out` (same length), exactly: the row's values as the core's
/// `Values::widen_into` gives them (`core/DETERMINISM.md`), but f16 ones with the lane code's
/// widening, which vectorises (the core's, with its branches, took 173 µs for a 128k row on
/// AVX-512, `softmax_pass_timing`'s `f16 widen`). Panics for values in device memory, as the
/// core's.
pub(crate) fn widen_into(values: specula_core::verify::Values<'_>, out: &mut [f32]) {
    use specula_core::verify::{Half, Values};
    match values {
        Values::Half(Half::F16(bits)) => {
            assert_eq!(bits.len(), out.len(), "as many values as slots");
            let mut o = out.chunks_exact_mut(16);
            let mut b = bits.chunks_exact(16);
            for (o, b) in (&mut o).zip(&mut b) {
                let b: &[u16; 16] = b.try_into().expect("16 values");
                o.copy_from_slice(&Half16::F16.widen(b));
            }
            for (o, &b) in o.into_remainder().iter_mut().zip(b.remainder()) {
                *o = f16_value(b);
            }
        }
        _ => values.widen_into(out),
    }
}

/// `2²⁴` and `2¹⁶` (binary32, exact).
const TWO_24: f32 = 16_777_216.0;
const TWO_16: f32 = 65_536.0;

/// `⌊e · 2⁶⁴⌋` for `0 ≤ e ≤ 1` as three 32-bit pieces `(a, b, c)` with
/// `⌊e · 2⁶⁴⌋ = a·2⁴⁰ + b·2¹⁶ + c`, `a ≤ 2²⁴`, `b < 2²⁴`, `c < 2¹⁶`, in binary32 arithmetic
/// that is exact at every step: `x₁ = e·2²⁴` (a power-of-two scaling), `a = ⌊x₁⌋`, `x₁ − a`
/// (the fractional bits of `x₁`), and likewise down. Summing the pieces in 32-bit lanes keeps
/// the whole softmax sum in 32-bit vector lanes, where the binary64 route (`softmax_fixed`:
/// widen, multiply, convert to 64 bits, add with carries) took twice the instructions on
/// AVX-512 and does not vectorise at all on AVX2.
#[inline(always)]
fn fixed_pieces(e: f32) -> (u32, u32, u32) {
    // The softmax's weights are in [0, 1]; the selects only keep other inputs (a caller
    // passing a wrong maximum) from reaching the unchecked conversions.
    let x1 = e * TWO_24;
    let x1 = if x1 <= TWO_24 { x1 } else { TWO_24 };
    let x1 = if x1 >= 0.0 { x1 } else { 0.0 };
    // SAFETY: 0 ≤ x1 ≤ 2²⁴ (NaN was replaced by the first select), so the truncation is
    // representable in i32; it equals `x1 as i32`.
    let a: i32 = unsafe { x1.to_int_unchecked() };
    let x2 = (x1 - a as f32) * TWO_24;
    // SAFETY: x1 − a ∈ [0, 1), so 0 ≤ x2 < 2²⁴.
    let b: i32 = unsafe { x2.to_int_unchecked() };
    let x3 = (x2 - b as f32) * TWO_16;
    // SAFETY: x2 − b ∈ [0, 1), so 0 ≤ x3 < 2¹⁶.
    let c: i32 = unsafe { x3.to_int_unchecked() };
    (a as u32, b as u32, c as u32)
}

/// Blocks whose pieces a 32-bit lane can add before it must be emptied into 64 bits:
/// `255 · 2²⁴ < 2³²`.
const PIECE_BLOCKS: usize = 255;

/// The exact fixed-point softmax sum `Σ ⌊e_v · 2⁶⁴⌋` of a whole row, `e_v = exp_p(l_v / t −
/// max)`, of the weights `≥ floor` (all for `floor ≤ 0`), with the pieces of [`fixed_pieces`]
/// summed per lane (and every `e_v` written to `out` when given: the filters' weights). Needs
/// `max` = the row's softmax maximum (then `e_v ∈ [0, 1]`).
#[inline(always)]
fn softmax_pass_range<R: LogitRow, const N: usize>(
    row: R,
    t: f32,
    max: f32,
    floor: f32,
    out: Option<&mut [f32]>,
) -> u128 {
    // Two instances: the unmasked one (no floor) keeps the pass free of the compare.
    if floor > 0.0 {
        softmax_pass_lanes::<R, N, true>(row, t, max, floor, out)
    } else {
        softmax_pass_lanes::<R, N, false>(row, t, max, floor, out)
    }
}

/// [`softmax_pass_range`], summing only the weights `≥ floor` if `MASKED`.
#[inline(always)]
fn softmax_pass_lanes<R: LogitRow, const N: usize, const MASKED: bool>(
    row: R,
    t: f32,
    max: f32,
    floor: f32,
    mut out: Option<&mut [f32]>,
) -> u128 {
    let kept = |e: f32| if !MASKED || e >= floor { e } else { 0.0 };
    let len = row.len();
    let body = len - len % N;
    let (mut a64, mut b64, mut c64) = ([0u64; N], [0u64; N], [0u64; N]);
    let mut s = 0;
    while s < body {
        let stop = body.min(s + PIECE_BLOCKS * N);
        let (mut a32, mut b32, mut c32) = ([0u32; N], [0u32; N], [0u32; N]);
        while s < stop {
            let e: [f32; N] = row.weights(s, t, max);
            for i in 0..N {
                let (a, b, c) = fixed_pieces(kept(e[i]));
                a32[i] += a;
                b32[i] += b;
                c32[i] += c;
            }
            if let Some(o) = out.as_deref_mut() {
                o[s..s + N].copy_from_slice(&e);
            }
            s += N;
        }
        for i in 0..N {
            a64[i] += u64::from(a32[i]);
            b64[i] += u64::from(b32[i]);
            c64[i] += u64::from(c32[i]);
        }
    }
    let mut total = 0u128;
    for i in 0..N {
        total += (u128::from(a64[i]) << 40) + (u128::from(b64[i]) << 16) + u128::from(c64[i]);
    }
    for i in body..len {
        let e = row.weight_at(i, t, max);
        if let Some(o) = out.as_deref_mut() {
            o[i] = e;
        }
        total += specula_core::verify::softmax_fixed(kept(e));
    }
    total
}

/// The softmax weights `e_v = exp_p(l_v / t − max)` of a whole row into `out`, without a sum:
/// what a weight table's fill needs ([`weight_table`]).
#[inline(always)]
fn softmax_weights_range<R: LogitRow, const N: usize>(row: R, t: f32, max: f32, out: &mut [f32]) {
    let len = row.len();
    let body = len - len % N;
    let mut s = 0;
    while s < body {
        let e: [f32; N] = row.weights(s, t, max);
        out[s..s + N].copy_from_slice(&e);
        s += N;
    }
    for i in body..len {
        out[i] = row.weight_at(i, t, max);
    }
}

/// `out[i] = Cut::p(w[i])` for a cut with key threshold `threshold` and sum `sum > 0`:
/// `((w as f64) / sum) as f32` for kept weights (`key(w) ≥ threshold`), else 0.
#[inline(always)]
fn cut_write_range<const N: usize>(w: &[f32], threshold: u32, sum: f64, out: &mut [f32]) {
    let keep = |x: f32| {
        let key = if x > 0.0 { x.to_bits() } else { 0 };
        key >= threshold
    };
    let src = w.chunks_exact(N);
    let tail = src.remainder();
    let mut dst = out.chunks_exact_mut(N);
    for (c, o) in src.zip(&mut dst) {
        for l in 0..N {
            let p = (f64::from(c[l]) / sum) as f32;
            o[l] = if keep(c[l]) { p } else { 0.0 };
        }
    }
    for (o, &x) in dst.into_remainder().iter_mut().zip(tail) {
        *o = if keep(x) {
            (f64::from(x) / sum) as f32
        } else {
            0.0
        };
    }
}

/// The largest key of the stored probabilities `p` (`key(x) = bits` for `x > 0`, else 0) and
/// the exact mass `Σ ⌊x · 2⁶⁴⌋` of the values with key `≥ 1`, in one pass (the pieces of
/// [`fixed_pieces`] summed per lane). The mass is the row's only when the largest key is at
/// most that of `1.0` (larger values are clamped by the pieces; the caller then takes the
/// whole-row search). Top-p alone on probabilities needs both; two passes read the row twice.
#[inline(always)]
fn max_mass_range<const N: usize>(p: &[f32]) -> (u32, u128) {
    let key = |x: f32| if x > 0.0 { x.to_bits() } else { 0 };
    let len = p.len();
    let body = len - len % N;
    let (mut a64, mut b64, mut c64) = ([0u64; N], [0u64; N], [0u64; N]);
    let mut max = [0u32; N];
    let mut s = 0;
    while s < body {
        let stop = body.min(s + PIECE_BLOCKS * N);
        let (mut a32, mut b32, mut c32) = ([0u32; N], [0u32; N], [0u32; N]);
        while s < stop {
            // A row's first read: its lines asked for ahead ([`FIRST_READ_AHEAD`]).
            prefetch_lines(p, s + FIRST_READ_AHEAD, N);
            let c: &[f32; N] = p[s..s + N].try_into().expect("N values");
            for l in 0..N {
                let k = key(c[l]);
                max[l] = max[l].max(k);
                // NaN and values ≤ 0 have key 0 and add nothing (the pieces of NaN are not 0).
                let (a, b, cc) = fixed_pieces(c[l]);
                let on = k >= 1;
                a32[l] += if on { a } else { 0 };
                b32[l] += if on { b } else { 0 };
                c32[l] += if on { cc } else { 0 };
            }
            s += N;
        }
        for l in 0..N {
            a64[l] += u64::from(a32[l]);
            b64[l] += u64::from(b32[l]);
            c64[l] += u64::from(c32[l]);
        }
    }
    let mut mass = 0u128;
    let mut top = 0;
    for l in 0..N {
        mass += (u128::from(a64[l]) << 40) + (u128::from(b64[l]) << 16) + u128::from(c64[l]);
        top = top.max(max[l]);
    }
    for &x in &p[body..] {
        let k = key(x);
        top = top.max(k);
        if k >= 1 {
            mass += specula_core::verify::softmax_fixed(x.min(1.0));
        }
    }
    (top, mass)
}

/// Appends to `out`, in id order, the keys in `[lo, hi)` of the weights `w` (`key(w) = bits`
/// for `w > 0`, else 0; `lo ≥ 1`), a block of `N` at a time (a block without one costs a
/// compare and a test), and returns the exact mass `Σ ⌊w · 2⁶⁴⌋` of the weights with key
/// `≥ hi` (weights in `[0, 1]`: the softmax's), summed in 32-bit pieces as the softmax pass
/// does. `None` as soon as more than `cap` keys are found (`out` then holds some of them).
#[inline(always)]
fn gather_range<const N: usize>(
    w: &[f32],
    lo: u32,
    hi: u32,
    out: &mut Vec<u32>,
    cap: usize,
) -> Option<u128> {
    if hi >= KEY_2_M14 && hi != u32::MAX && w.len() / N < (1 << 16) {
        gather_loop::<N, true>(w, lo, hi, out, cap)
    } else {
        gather_loop::<N, false>(w, lo, hi, out, cap)
    }
}

/// The key of `2⁻¹⁴` (binary32): weights at or above it are multiples of `2⁻³⁷`.
const KEY_2_M14: u32 = 113 << 23;

/// [`gather_range`]'s loop. `F64`: the mass of the keys `≥ hi` (all `≥ 2⁻¹⁴`, at most 2¹⁶ per
/// lane) summed per lane in binary64, which is then exact: every such weight `e ≤ 1` is a
/// multiple of `2⁻³⁷` (a 24-bit significand at exponent `≥ −14`), so is every partial sum,
/// and a multiple of `2⁻³⁷` below `2¹⁶` fits binary64's 53 bits; `⌊e·2⁶⁴⌋ = e·2⁶⁴` for them
/// (an integer), so `2⁶⁴ ×` each lane's sum is its exact fixed-point mass. Two conversions and
/// two masked additions per 16 weights instead of the 32-bit pieces (~17 instructions, whose
/// three sums also spill at 32 lanes). Top-p's bracket usually lies that high: its crossing
/// weight is at least `0.1·F/V` and, on real rows, far above.
#[inline(always)]
fn gather_loop<const N: usize, const F64: bool>(
    w: &[f32],
    lo: u32,
    hi: u32,
    out: &mut Vec<u32>,
    cap: usize,
) -> Option<u128> {
    let key = |x: f32| if x > 0.0 { x.to_bits() } else { 0 };
    let inside = |k: u32| k >= lo && k < hi;
    let cap = out.len() + cap;
    let len = w.len();
    let body = len - len % N;
    let (mut a64, mut b64, mut c64) = ([0u64; N], [0u64; N], [0u64; N]);
    let mut d64 = [0f64; N];
    let mut s = 0;
    while s < body {
        let stop = body.min(s + PIECE_BLOCKS * N);
        let (mut a32, mut b32, mut c32) = ([0u32; N], [0u32; N], [0u32; N]);
        while s < stop {
            let c: &[f32; N] = w[s..s + N].try_into().expect("N values");
            let mut any = false;
            for l in 0..N {
                any |= inside(key(c[l]));
            }
            if F64 {
                for l in 0..N {
                    d64[l] += f64::from(if key(c[l]) >= hi { c[l] } else { 0.0 });
                }
            } else if hi != u32::MAX {
                for l in 0..N {
                    let (a, b, cc) = fixed_pieces(c[l]);
                    let up = key(c[l]) >= hi;
                    a32[l] += if up { a } else { 0 };
                    b32[l] += if up { b } else { 0 };
                    c32[l] += if up { cc } else { 0 };
                }
            }
            if any {
                // Only the kept lanes, found from a bit mask (one vector compare), in id order:
                // a loop over every lane cost about a cycle per id on a flat row under top-p,
                // where most blocks hold a candidate or two.
                let mut mask = 0u64;
                for l in 0..N {
                    mask |= u64::from(inside(key(c[l]))) << l;
                }
                while mask != 0 {
                    out.push(key(c[mask.trailing_zeros() as usize]));
                    mask &= mask - 1;
                }
                if out.len() > cap {
                    return None;
                }
            }
            s += N;
        }
        for l in 0..N {
            a64[l] += u64::from(a32[l]);
            b64[l] += u64::from(b32[l]);
            c64[l] += u64::from(c32[l]);
        }
    }
    let mut above = 0u128;
    for l in 0..N {
        above += (u128::from(a64[l]) << 40) + (u128::from(b64[l]) << 16) + u128::from(c64[l]);
        // An exact integer below 2⁸⁰ (zero unless `F64`).
        above += (d64[l] * 18_446_744_073_709_551_616.0) as u128;
    }
    for &x in &w[body..] {
        let k = key(x);
        if inside(k) {
            out.push(k);
        } else if k >= hi {
            above += specula_core::verify::softmax_fixed(x);
        }
    }
    (out.len() <= cap).then_some(above)
}

/// The softmax write-out for AVX-512, written with intrinsics: the generic lane code above
/// compiles to ~3.5 ns per id here (the `f64` halves and the divisions defeat the vectoriser),
/// this to well under 1 ns. Same operations, same order, same bits
/// (`softmax_kernels_match_the_core` runs every instruction set). (The sum pass needs no
/// intrinsics since its fixed-point terms are summed in 32-bit pieces: [`fixed_pieces`].)
#[cfg(specula_avx512)]
#[clippy::msrv = "1.89"]
mod avx512 {
    use super::{F32_SAFE_MAX, F32_SAFE_MIN};
    use std::arch::x86_64::*;

    /// The table entries of 16 half patterns, in one gather.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn lookup16(bits: &[u16; 16], table: &super::weight_table::Table) -> [f32; 16] {
        // SAFETY: `bits` is 32 readable bytes (an unaligned load).
        let idx = _mm512_cvtepu16_epi32(unsafe { _mm256_loadu_si256(bits.as_ptr().cast()) });
        // SAFETY: every index is a 16-bit pattern, below the table's 2¹⁶ entries; scale 4 is
        // the entry size.
        let v = unsafe { _mm512_i32gather_ps::<4>(idx, table.as_ptr().cast()) };
        let mut out = [0f32; 16];
        // SAFETY: `out` is 64 writable bytes (an unaligned store).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out
    }

    /// Lanes whose binary64 value may round differently from the value it approximates
    /// (`near_boundary`'s first test: within 16 ulps of a binary32 midpoint).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn near_mid(q: __m512d) -> __mmask8 {
        // (low 29 bits − 0x1000_0000 + 16) mod 2²⁹ ≤ 32 ⟺ |low 29 bits − 0x1000_0000| ≤ 16.
        let shifted = _mm512_add_epi64(_mm512_castpd_si512(q), _mm512_set1_epi64(16 - 0x1000_0000));
        let d = _mm512_and_si512(shifted, _mm512_set1_epi64(0x1FFF_FFFF));
        _mm512_cmple_epu64_mask(d, _mm512_set1_epi64(32))
    }

    /// Lanes of the binary32 `z` (rounded from `q`) outside `[2⁻¹²⁵, 2¹²⁷]` in magnitude,
    /// NaN included, except where `src` is zero (then `q` is an exact zero).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn out_of_range(z: __m512, src: __m512) -> __mmask16 {
        let a = _mm512_abs_ps(z);
        let lo = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, _mm512_set1_ps(F32_SAFE_MIN as f32));
        let hi = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, _mm512_set1_ps(F32_SAFE_MAX as f32));
        let zero = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(src, _mm512_setzero_ps());
        !((lo & hi) | zero)
    }

    /// `x × m` (binary64 reciprocal `m`) of 16 binary32 lanes, rounded to binary32, and the lanes
    /// where that may differ from the correctly rounded quotient ([`super::near_boundary`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn mul_recip(x: __m512, m: __m512d) -> (__m512, __mmask16) {
        let q0 = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), m);
        let q1 = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps::<1>(x)), m);
        let z = _mm512_insertf32x8::<1>(
            _mm512_castps256_ps512(_mm512_cvtpd_ps(q0)),
            _mm512_cvtpd_ps(q1),
        );
        let near = u16::from(near_mid(q0)) | (u16::from(near_mid(q1)) << 8);
        (z, near | out_of_range(z, x))
    }

    /// `out[i] = Cut::p(w[i])` ([`super::cut_write_range`]): the binary64 reciprocal product
    /// where it gives the division's bits, the division itself in a block where
    /// [`mul_recip`] flags a kept lane.
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn cut_write(w: &[f32], threshold: u32, sum: f64, out: &mut [f32]) {
        let inv_s = _mm512_set1_pd(1.0 / sum);
        let th = _mm512_set1_epi32(threshold as i32);
        let key = |x: f32| if x > 0.0 { x.to_bits() } else { 0 };
        let scalar = |x: f32| {
            if key(x) >= threshold {
                (f64::from(x) / sum) as f32
            } else {
                0.0
            }
        };
        let src = w.chunks_exact(16);
        let tail = src.remainder();
        let mut dst = out.chunks_exact_mut(16);
        for (c, o) in src.zip(&mut dst) {
            // SAFETY: `c` holds 16 f32 values; the load is unaligned.
            let x = unsafe { _mm512_loadu_ps(c.as_ptr()) };
            // key(x) = bits for x > 0, else 0 (NaN included); kept iff key ≥ threshold.
            let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
            let k = _mm512_maskz_mov_epi32(pos, _mm512_castps_si512(x));
            let keep = _mm512_cmpge_epu32_mask(k, th);
            let (p, bad) = mul_recip(x, inv_s);
            if bad & keep == 0 {
                // SAFETY: `o` holds 16 f32 slots; the store is unaligned.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_maskz_mov_ps(keep, p)) };
            } else {
                for (o, &x) in o.iter_mut().zip(c) {
                    *o = scalar(x);
                }
            }
        }
        for (o, &x) in dst.into_remainder().iter_mut().zip(tail) {
            *o = scalar(x);
        }
    }
    /// [`gather`]'s modes for the mass of the keys `≥ hi`: none (`hi = u32::MAX`), summed in
    /// binary64 (exact where [`super::gather_loop`] says), or in the exact 32-bit pieces.
    pub(super) const NO_MASS: u8 = 0;
    pub(super) const BINARY64: u8 = 1;
    pub(super) const PIECES: u8 = 2;

    /// Adds the 16 u32 lanes of each of `pieces` to the 64-bit lane sums `wide` (two per piece:
    /// lanes 0–7, then 8–15).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn widen_into(wide: &mut [__m512i; 6], pieces: [__m512i; 3]) {
        for (i, p) in pieces.into_iter().enumerate() {
            let lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(p));
            let hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(p));
            wide[2 * i] = _mm512_add_epi64(wide[2 * i], lo);
            wide[2 * i + 1] = _mm512_add_epi64(wide[2 * i + 1], hi);
        }
    }

    /// [`super::gather_range`] with intrinsics: one compare into a lane mask per 16 weights,
    /// the keys in `[lo, hi)` compressed into one register and stored whole (the slots past
    /// the last kept key are overwritten by the next store or left beyond `out.len()`), and the
    /// mass above `hi` summed per lane in binary64 (`BINARY64`, exact under the conditions of
    /// [`super::gather_loop`]: every weight `≥ hi ≥ key(2⁻¹⁴)`, at most 2¹⁶ of them per lane),
    /// in [`super::fixed_pieces`] (`PIECES`, the lane code's sums) or not at all (`NO_MASS`,
    /// `hi = u32::MAX`). The lane code builds the mask one lane at a time and
    /// pushes each kept key with a scalar loop: on a peaked row under top-p, where most blocks
    /// hold a candidate, that pass cost as much as the softmax pass.
    /// `None` as soon as more than `cap` keys are found.
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,popcnt")]
    pub(super) fn gather<const MASS: u8>(
        w: &[f32],
        lo: u32,
        hi: u32,
        out: &mut Vec<u32>,
        cap: usize,
    ) -> Option<u128> {
        debug_assert!(lo >= 1 && (MASS != NO_MASS || hi == u32::MAX));
        let (two24, two16) = (_mm512_set1_ps(super::TWO_24), _mm512_set1_ps(super::TWO_16));
        // The pieces' 32-bit lane sums, emptied into 64-bit ones every `PIECE_BLOCKS` blocks.
        let (mut a32, mut b32, mut c32) = (
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        );
        let mut wide = [_mm512_setzero_si512(); 6];
        let mut run = 0;
        let cap = out.len() + cap;
        let (lo_v, hi_v) = (_mm512_set1_epi32(lo as i32), _mm512_set1_epi32(hi as i32));
        let (mut d0, mut d1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        // The length kept in a register, not reloaded and stored through `out` per block.
        let mut len = out.len();
        let mut base = out.as_mut_ptr();
        let blocks = w.chunks_exact(16);
        let tail = blocks.remainder();
        for c in blocks {
            // SAFETY: `c` holds 16 f32 values; the load is unaligned.
            let x = unsafe { _mm512_loadu_ps(c.as_ptr()) };
            // key(x) = bits for x > 0, else 0 (NaN included).
            let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
            let k = _mm512_maskz_mov_epi32(pos, _mm512_castps_si512(x));
            let up = _mm512_cmpge_epu32_mask(k, hi_v);
            let inside = _mm512_cmpge_epu32_mask(k, lo_v) & !up;
            if MASS == BINARY64 {
                let xu = _mm512_maskz_mov_ps(up, x);
                d0 = _mm512_add_pd(d0, _mm512_cvtps_pd(_mm512_castps512_ps256(xu)));
                d1 = _mm512_add_pd(d1, _mm512_cvtps_pd(_mm512_extractf32x8_ps::<1>(xu)));
            } else if MASS == PIECES {
                // `fixed_pieces` of the lanes `≥ hi` (0 elsewhere), step for step: they are
                // positive, so only the upper clamp can act.
                let xu = _mm512_maskz_mov_ps(up, x);
                let x1 = _mm512_min_ps(_mm512_mul_ps(xu, two24), two24);
                let a = _mm512_cvttps_epi32(x1);
                let x2 = _mm512_mul_ps(_mm512_sub_ps(x1, _mm512_cvtepi32_ps(a)), two24);
                let b = _mm512_cvttps_epi32(x2);
                let x3 = _mm512_mul_ps(_mm512_sub_ps(x2, _mm512_cvtepi32_ps(b)), two16);
                let cc = _mm512_cvttps_epi32(x3);
                a32 = _mm512_add_epi32(a32, a);
                b32 = _mm512_add_epi32(b32, b);
                c32 = _mm512_add_epi32(c32, cc);
                run += 1;
                if run == super::PIECE_BLOCKS {
                    widen_into(&mut wide, [a32, b32, c32]);
                    (a32, b32, c32) = (
                        _mm512_setzero_si512(),
                        _mm512_setzero_si512(),
                        _mm512_setzero_si512(),
                    );
                    run = 0;
                }
            }
            if inside != 0 {
                // Room for a whole 16-lane store, grown as the keys come (reserving `cap` up
                // front allocated a quarter row for every call with a fresh vector).
                if len + 16 > out.capacity() {
                    // SAFETY: the slots below `len` were written by the stores below.
                    unsafe { out.set_len(len) };
                    out.reserve(len.max(64));
                    base = out.as_mut_ptr();
                }
                // SAFETY: `len + 16 ≤ capacity` (just ensured), so the 16 slots from `len` are
                // allocated.
                unsafe {
                    _mm512_storeu_si512(
                        base.add(len).cast(),
                        _mm512_maskz_compress_epi32(inside, k),
                    );
                }
                len += inside.count_ones() as usize;
                if len > cap {
                    // SAFETY: the slots below `len` were written by the stores above.
                    unsafe { out.set_len(len) };
                    return None;
                }
            }
        }
        // SAFETY: every slot below `len` was written by a store above (the ones past it are
        // not part of the vector).
        unsafe { out.set_len(len) };
        let mut above = 0u128;
        if MASS == PIECES {
            widen_into(&mut wide, [a32, b32, c32]);
            let mut lanes = [0u64; 48];
            for (i, v) in wide.iter().enumerate() {
                // SAFETY: `lanes` holds 8 u64 slots from `8·i` (i < 6); the store is unaligned.
                unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().add(8 * i).cast(), *v) };
            }
            for l in 0..16 {
                above += (u128::from(lanes[l]) << 40)
                    + (u128::from(lanes[16 + l]) << 16)
                    + u128::from(lanes[32 + l]);
            }
        }
        if MASS == BINARY64 {
            let mut lanes = [0f64; 16];
            // SAFETY: `lanes` holds 16 f64 slots; the stores are unaligned.
            unsafe {
                _mm512_storeu_pd(lanes.as_mut_ptr(), d0);
                _mm512_storeu_pd(lanes.as_mut_ptr().add(8), d1);
            }
            for d in lanes {
                // An exact integer below 2⁸⁰.
                above += (d * 18_446_744_073_709_551_616.0) as u128;
            }
        }
        for &x in tail {
            let k = if x > 0.0 { x.to_bits() } else { 0 };
            if k >= lo && k < hi {
                out.push(k);
            } else if k >= hi {
                above += specula_core::verify::softmax_fixed(x);
            }
        }
        (out.len() <= cap).then_some(above)
    }

    /// Philox4x32-10 of the `8H` groups `base .. base + 8H` (counter words 1–3 `ctr`, round
    /// keys `keys`: the seed's key bumped before each round after the first), the words in id
    /// order: `out[q]` (`q < 2H`) holds the stream words of ids `16q .. 16q + 16` of the `32H`
    /// ids, as [`philox_block`](super::philox_block)`::<16, 64>` returns them for each 64.
    ///
    /// As there, a group's word sits in the low half of a 64-bit lane with garbage above it
    /// (`vpmuludq` reads the low halves, XORs keep them exact). What LLVM made of that loop kept
    /// four shifts per round on port 0 beside the four multiplies; the products' high halves
    /// move down by a shuffle here (port 5), and the words leave through two shuffles and two
    /// unpacks per eight groups instead of a round trip through the stack, and four vectors of
    /// groups in flight (`H = 4`) give each round's multiplies (latency 5) independent work.
    /// `OUT` must be `2H`. Lane `i` of vector `h` holds group `8h + [0, 4, 1, 5, 2, 6, 3, 7][i]`,
    /// so that the final 64-bit unpacks, which work within 128-bit lanes, put the groups in
    /// order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn philox<const H: usize, const OUT: usize>(
        base: u32,
        ctr: [u32; 3],
        keys: &[[u32; 2]; 10],
    ) -> [__m512i; OUT] {
        debug_assert!(OUT == 2 * H && H <= 4);
        let order = _mm512_add_epi64(
            _mm512_set1_epi64(i64::from(base)),
            _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7),
        );
        // The low halves are `base + g` modulo 2³², as `philox_block`'s wrapping add.
        let mut c0 = [_mm512_setzero_si512(); H];
        for (h, c) in c0.iter_mut().enumerate() {
            *c = _mm512_add_epi64(order, _mm512_set1_epi64(8 * h as i64));
        }
        let mut c1 = [_mm512_set1_epi64(i64::from(ctr[0])); H];
        let mut c2 = [_mm512_set1_epi64(i64::from(ctr[1])); H];
        let mut c3 = [_mm512_set1_epi64(i64::from(ctr[2])); H];
        let m0 = _mm512_set1_epi64(0xD251_1F53);
        let m1 = _mm512_set1_epi64(0xCD9E_8D57);
        for &[k0, k1] in keys {
            let k0 = _mm512_set1_epi64(i64::from(k0));
            let k1 = _mm512_set1_epi64(i64::from(k1));
            for h in 0..H {
                let p0 = _mm512_mul_epu32(c0[h], m0);
                let p1 = _mm512_mul_epu32(c2[h], m1);
                // Each product's high half into its low half (dwords 1, 1, 3, 3).
                let hi0 = _mm512_shuffle_epi32::<0xF5>(p0);
                let hi1 = _mm512_shuffle_epi32::<0xF5>(p1);
                // 0x96: the XOR of the three operands.
                c0[h] = _mm512_ternarylogic_epi64::<0x96>(hi1, c1[h], k0);
                c2[h] = _mm512_ternarylogic_epi64::<0x96>(hi0, c3[h], k1);
                c1[h] = p1;
                c3[h] = p0;
            }
        }
        let mut out = [_mm512_setzero_si512(); OUT];
        for h in 0..H {
            // Words 0 and 1 of each group side by side in its 64-bit lane (the odd dwords take
            // the even dwords of the second operand: dwords 0, 0, 2, 2), and words 2 and 3.
            let w01 = _mm512_mask_shuffle_epi32::<0xA0>(c0[h], 0xAAAA, c1[h]);
            let w23 = _mm512_mask_shuffle_epi32::<0xA0>(c2[h], 0xAAAA, c3[h]);
            // 128-bit lane `l`: the lanes `2l` (groups 0–3) and `2l + 1` (groups 4–7).
            out[2 * h] = _mm512_unpacklo_epi64(w01, w23);
            out[2 * h + 1] = _mm512_unpackhi_epi64(w01, w23);
        }
        out
    }

    /// The race values of ids `s .. s + 64` (all below `p.w`'s length) as
    /// [`CutRow::block`](super::CutRow) computes them from `p`, with the same binary32
    /// operations (a product rounded once, the draft value subtracted after it): the same bits,
    /// without the round trip through an array that LLVM made of that loop.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn parts64(p: &super::CutParts<'_>, s: usize) -> [__m512; 4] {
        let w = &p.w[s..s + 64];
        let draft = p.draft.map(|d| &d[s..s + 64]);
        let th = _mm512_set1_epi32(p.threshold as i32);
        let (up, down) = (_mm512_set1_ps(p.up), _mm512_set1_ps(p.down));
        let mut out = [_mm512_setzero_ps(); 4];
        for (q, o) in out.iter_mut().enumerate() {
            // SAFETY: `w[16q..16q + 16]` is 64 readable bytes (an unaligned load).
            let x = unsafe { _mm512_loadu_ps(w.as_ptr().add(16 * q)) };
            let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
            let u = _mm512_mask_blend_ps(gt, down, up);
            // The key: the bits of a positive weight, else 0; kept when `≥ threshold`.
            let key = _mm512_maskz_mov_epi32(gt, _mm512_castps_si512(x));
            let kept = _mm512_cmpge_epu32_mask(key, th);
            *o = _mm512_maskz_mul_ps(kept, x, u);
            if let Some(d) = draft {
                // SAFETY: `d[16q..16q + 16]` is 64 readable bytes (an unaligned load).
                *o = _mm512_sub_ps(*o, unsafe { _mm512_loadu_ps(d.as_ptr().add(16 * q)) });
            }
        }
        out
    }

    /// The race values of ids `s .. s + 64` from [`Weights::block`](super::Weights::block)
    /// (zeros from `end` on; all zeros where `s ≥ end`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn block64<W: super::Weights>(w: &W, s: usize, end: usize) -> [__m512; 4] {
        let mut out = [_mm512_setzero_ps(); 4];
        if s < end {
            let mut wt = [0f32; 64];
            w.block(s, end, &mut wt);
            for (q, o) in out.iter_mut().enumerate() {
                // SAFETY: `wt[16q..16q + 16]` is 64 readable bytes (an unaligned load).
                *o = unsafe { _mm512_loadu_ps(wt.as_ptr().add(16 * q)) };
            }
        }
        out
    }

    /// Bit `i` set where `wt[i] > 0` (NaN is not).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn positive64(wt: &[__m512; 4]) -> u64 {
        let mut pos = 0u64;
        for (q, &x) in wt.iter().enumerate() {
            let m = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
            pos |= u64::from(m) << (16 * q);
        }
        pos
    }

    /// The ids of `pos` that the race's skip test cannot rule out with the best key's stand-in
    /// `b`: those where `!(wt[i] < (b × F) × SHRINK)`, `F` the [`exponential_floor`] of the
    /// id's high word: the same binary32 operations in the same order as
    /// [`race_range`](super::race_range)'s test (`(hi >> 8)` is below 2²⁴, so its conversion is
    /// exact, and so is the product by 2⁻²⁴), hence the same mask.
    ///
    /// [`exponential_floor`]: specula_core::verify::exponential::exponential_floor
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    fn open64(wt: &[__m512; 4], pos: u64, words: &[__m512i], b: f32) -> u64 {
        let bv = _mm512_set1_ps(b);
        let shrink = _mm512_set1_ps(super::SHRINK);
        let scale = _mm512_set1_ps(f32::from_bits(0x3380_0000));
        let mut proven = 0u64;
        for q in 0..4 {
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32::<8>(words[q])), scale);
            let bound = _mm512_mul_ps(_mm512_mul_ps(bv, f), shrink);
            // Ordered: a NaN bound proves nothing, the id stays open.
            let m = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(wt[q], bound);
            proven |= u64::from(m) << (16 * q);
        }
        pos & !proven
    }

    /// One block's part of [`race`]: ids `s .. s + 64` with values `wt`, positive at `pos`,
    /// stream-1 words `words`; the open ones visited with the best so far (`state`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    #[allow(clippy::too_many_arguments)]
    fn block_best<W: super::Weights>(
        w: &W,
        wt: &[__m512; 4],
        pos: u64,
        words: &[__m512i],
        s: usize,
        ctr_lo: [u32; 3],
        k: [u32; 2],
        state: &mut (&mut super::Best, &mut f32),
    ) {
        let open = open64(wt, pos, words, *state.1);
        if open != 0 {
            let mut hi = [0u32; 64];
            for (q, v) in words.iter().enumerate() {
                // SAFETY: `hi[16q..16q + 16]` is 64 writable bytes (an unaligned store).
                unsafe { _mm512_storeu_si512(hi.as_mut_ptr().add(16 * q).cast(), *v) };
            }
            let lo_ctr = [(s / 4) as u32, ctr_lo[0], ctr_lo[1], ctr_lo[2]];
            super::visit_open(w, open, s, &hi, lo_ctr, k, state.0, state.1);
        }
    }

    /// [`race_range`](super::race_range)`::<W, 16, 64>` with its Philox words and skip test in
    /// intrinsics ([`philox`], [`open64`]), two of its blocks at a time: the same words, the
    /// same open ids (the second block is tested after the first's open ids are visited, with
    /// the best they leave), visited in the same order by the same code
    /// ([`visit_open`](super::visit_open)), so the same best.
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn race<W: super::Weights>(
        rng: super::RaceRng,
        w: W,
        start: usize,
        end: usize,
    ) -> super::Best {
        use super::{STREAM_RACE, STREAM_RACE_LO};
        debug_assert!(start.is_multiple_of(4) && end <= w.len());
        let k = super::key(rng.seed);
        let ctr = [
            (rng.position << 2) | STREAM_RACE,
            rng.offset as u32,
            (rng.offset >> 32) as u32,
        ];
        let ctr_lo = [(rng.position << 2) | STREAM_RACE_LO, ctr[1], ctr[2]];
        // The key is bumped between rounds only, never after the tenth.
        let mut keys = [k; 10];
        for r in 1..10 {
            keys[r] = [
                keys[r - 1][0].wrapping_add(0x9E37_79B9),
                keys[r - 1][1].wrapping_add(0xBB67_AE85),
            ];
        }
        let mut best = super::Best::NO_RACE;
        let mut best_skip = -1.0f32;
        let parts = w.cut_parts();
        let mut wt = [[_mm512_setzero_ps(); 4]; 2];
        let mut s = start;
        while s < end {
            for (half, v) in wt.iter_mut().enumerate() {
                let sh = s + 64 * half;
                *v = match &parts {
                    Some(p) if sh + 64 <= end => parts64(p, sh),
                    // A tail, or weights of another form; past `end`, no candidate.
                    _ => block64(&w, sh, end),
                };
            }
            // A block without a positive weight has no candidate: skip its random numbers.
            let pos = [positive64(&wt[0]), positive64(&wt[1])];
            if pos != [0, 0] {
                // V ≤ u32::MAX, so the group index s / 4 fits 32 bits (and s / 4 + 16 too: the
                // second block holds an id below V when it has a positive weight). Both
                // blocks' words at once where both have a candidate, else the one's alone
                // (sparse rows, e.g. a top-k cut, keep skipping per 64 ids).
                let base = (s / 4) as u32;
                let mut state = (&mut best, &mut best_skip);
                if pos[0] != 0 && pos[1] != 0 {
                    let words = philox::<4, 8>(base, ctr, &keys);
                    for half in 0..2 {
                        let words = &words[4 * half..4 * half + 4];
                        let sh = s + 64 * half;
                        block_best(&w, &wt[half], pos[half], words, sh, ctr_lo, k, &mut state);
                    }
                } else {
                    let half = usize::from(pos[0] == 0);
                    let words = philox::<2, 4>(base + 16 * half as u32, ctr, &keys);
                    let sh = s + 64 * half;
                    block_best(&w, &wt[half], pos[half], &words, sh, ctr_lo, k, &mut state);
                }
            }
            s += 128;
        }
        best
    }
}

/// The cut write-out for AVX2, with intrinsics for the same reason as [`avx512`]: the
/// reciprocal product and its boundary test, with the division where a kept lane is flagged.
#[cfg(specula_avx2_intrinsics)]
mod avx2 {
    use super::{F32_SAFE_MAX, F32_SAFE_MIN};
    use std::arch::x86_64::*;

    /// The table entries of 8 half patterns, in one gather.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn lookup8(bits: &[u16; 8], table: &super::weight_table::Table) -> [f32; 8] {
        // SAFETY: `bits` is 16 readable bytes (an unaligned load).
        let idx = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(bits.as_ptr().cast()) });
        // SAFETY: every index is a 16-bit pattern, below the table's 2¹⁶ entries; scale 4 is
        // the entry size.
        let v = unsafe { _mm256_i32gather_ps::<4>(table.as_ptr().cast(), idx) };
        let mut out = [0f32; 8];
        // SAFETY: `out` is 32 writable bytes (an unaligned store).
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }

    /// Lanes (bits 0–3) of 4 binary64 values within 16 ulps of a binary32 midpoint
    /// (`super::near_boundary`'s first test).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn near_mid(q: __m256d) -> i32 {
        let shifted =
            _mm256_add_epi64(_mm256_castpd_si256(q), _mm256_set1_epi64x(16 - 0x1000_0000));
        let d = _mm256_and_si256(shifted, _mm256_set1_epi64x(0x1FFF_FFFF));
        // 0 ≤ d < 2²⁹: the signed compare is the unsigned one.
        let far = _mm256_cmpgt_epi64(d, _mm256_set1_epi64x(32));
        !_mm256_movemask_pd(_mm256_castsi256_pd(far)) & 0xF
    }

    /// `x × m` (binary64 reciprocal `m`) of 8 binary32 lanes rounded to binary32, and the lanes
    /// (bits 0–7) where that may differ from the correctly rounded quotient: near a binary32
    /// midpoint, or outside `[2⁻¹²⁵, 2¹²⁷]` in magnitude (NaN included) unless `x` is zero.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mul_recip(x: __m256, m: __m256d) -> (__m256, i32) {
        let q0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), m);
        let q1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)), m);
        let z = _mm256_set_m128(_mm256_cvtpd_ps(q1), _mm256_cvtpd_ps(q0));
        let near = near_mid(q0) | (near_mid(q1) << 4);
        let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), z);
        let lo = _mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(F32_SAFE_MIN as f32));
        let hi = _mm256_cmp_ps::<_CMP_LE_OQ>(a, _mm256_set1_ps(F32_SAFE_MAX as f32));
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_setzero_ps());
        let ok = _mm256_movemask_ps(_mm256_or_ps(_mm256_and_ps(lo, hi), zero));
        (z, near | (!ok & 0xFF))
    }

    /// `out[i] = Cut::p(w[i])` ([`super::cut_write_range`]), as [`super::avx512`]'s.
    #[target_feature(enable = "avx2")]
    pub(super) fn cut_write(w: &[f32], threshold: u32, sum: f64, out: &mut [f32]) {
        let inv_s = _mm256_set1_pd(1.0 / sum);
        let th = _mm256_set1_epi32(threshold as i32);
        let key = |x: f32| if x > 0.0 { x.to_bits() } else { 0 };
        let scalar = |x: f32| {
            if key(x) >= threshold {
                (f64::from(x) / sum) as f32
            } else {
                0.0
            }
        };
        let src = w.chunks_exact(8);
        let tail = src.remainder();
        let mut dst = out.chunks_exact_mut(8);
        for (c, o) in src.zip(&mut dst) {
            // SAFETY: `c` holds 8 f32 values; the load is unaligned.
            let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            // key(x) = bits for x > 0, else 0 (NaN included); kept iff key ≥ threshold
            // (unsigned: max(key, threshold) = key).
            let pos = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_setzero_ps()));
            let k = _mm256_and_si256(pos, _mm256_castps_si256(x));
            let keep = _mm256_cmpeq_epi32(_mm256_max_epu32(k, th), k);
            let (p, bad) = mul_recip(x, inv_s);
            if bad & _mm256_movemask_ps(_mm256_castsi256_ps(keep)) == 0 {
                let p = _mm256_and_ps(p, _mm256_castsi256_ps(keep));
                // SAFETY: `o` holds 8 f32 slots; the store is unaligned.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), p) };
            } else {
                for (o, &x) in o.iter_mut().zip(c) {
                    *o = scalar(x);
                }
            }
        }
        for (o, &x) in dst.into_remainder().iter_mut().zip(tail) {
            *o = scalar(x);
        }
    }

    /// Philox4x32-10 of the 8 groups `base .. base + 8`, the words in id order (`out[q]`: ids
    /// `8q .. 8q + 8` of the block), as [`philox_block`](super::philox_block)`::<8, 32>` returns
    /// them: the AVX-512 kernel's scheme ([`avx512`](super::avx512)'s `philox32`) on 256-bit
    /// vectors, without a three-way XOR (two XORs), the group of lane `i` of vector `h` being
    /// `4h + [0, 2, 1, 3][i]` so that the 64-bit unpacks put the groups in order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn philox8(base: u32, ctr: [u32; 3], keys: &[[u32; 2]; 10]) -> [__m256i; 4] {
        let order = _mm256_add_epi64(
            _mm256_set1_epi64x(i64::from(base)),
            _mm256_setr_epi64x(0, 2, 1, 3),
        );
        // The low halves are `base + g` modulo 2³², as `philox_block`'s wrapping add.
        let mut c0 = [order, _mm256_add_epi64(order, _mm256_set1_epi64x(4))];
        let mut c1 = [_mm256_set1_epi64x(i64::from(ctr[0])); 2];
        let mut c2 = [_mm256_set1_epi64x(i64::from(ctr[1])); 2];
        let mut c3 = [_mm256_set1_epi64x(i64::from(ctr[2])); 2];
        let m0 = _mm256_set1_epi64x(0xD251_1F53);
        let m1 = _mm256_set1_epi64x(0xCD9E_8D57);
        for &[k0, k1] in keys {
            let k0 = _mm256_set1_epi64x(i64::from(k0));
            let k1 = _mm256_set1_epi64x(i64::from(k1));
            for h in 0..2 {
                let p0 = _mm256_mul_epu32(c0[h], m0);
                let p1 = _mm256_mul_epu32(c2[h], m1);
                // Each product's high half into its low half (dwords 1, 1, 3, 3).
                let hi0 = _mm256_shuffle_epi32::<0xF5>(p0);
                let hi1 = _mm256_shuffle_epi32::<0xF5>(p1);
                c0[h] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[h]), k0);
                c2[h] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[h]), k1);
                c1[h] = p1;
                c3[h] = p0;
            }
        }
        let mut out = [_mm256_setzero_si256(); 4];
        for h in 0..2 {
            // Words 0 and 1 of each group side by side in its 64-bit lane (dwords 0, 0, 2, 2 of
            // the second operand into the odd dwords), and words 2 and 3.
            let w01 = _mm256_blend_epi32::<0xAA>(c0[h], _mm256_shuffle_epi32::<0xA0>(c1[h]));
            let w23 = _mm256_blend_epi32::<0xAA>(c2[h], _mm256_shuffle_epi32::<0xA0>(c3[h]));
            out[2 * h] = _mm256_unpacklo_epi64(w01, w23);
            out[2 * h + 1] = _mm256_unpackhi_epi64(w01, w23);
        }
        out
    }

    /// The race values of ids `s .. s + 32` (all below `p.w`'s length) as
    /// [`CutRow::block`](super::CutRow) computes them from `p`: the same binary32 operations,
    /// hence the same bits (as `avx512`'s `parts64`; the unsigned key test as
    /// `max(key, threshold) = key`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn parts32(p: &super::CutParts<'_>, s: usize) -> [__m256; 4] {
        let w = &p.w[s..s + 32];
        let draft = p.draft.map(|d| &d[s..s + 32]);
        let th = _mm256_set1_epi32(p.threshold as i32);
        let (up, down) = (_mm256_set1_ps(p.up), _mm256_set1_ps(p.down));
        let mut out = [_mm256_setzero_ps(); 4];
        for (q, o) in out.iter_mut().enumerate() {
            // SAFETY: `w[8q..8q + 8]` is 32 readable bytes (an unaligned load).
            let x = unsafe { _mm256_loadu_ps(w.as_ptr().add(8 * q)) };
            let gt = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_setzero_ps());
            let u = _mm256_blendv_ps(down, up, gt);
            // The key: the bits of a positive weight, else 0; kept when `≥ threshold`.
            let key = _mm256_and_si256(_mm256_castps_si256(x), _mm256_castps_si256(gt));
            let kept = _mm256_cmpeq_epi32(_mm256_max_epu32(key, th), key);
            *o = _mm256_and_ps(_mm256_mul_ps(x, u), _mm256_castsi256_ps(kept));
            if let Some(d) = draft {
                // SAFETY: `d[8q..8q + 8]` is 32 readable bytes (an unaligned load).
                *o = _mm256_sub_ps(*o, unsafe { _mm256_loadu_ps(d.as_ptr().add(8 * q)) });
            }
        }
        out
    }

    /// [`race_range`](super::race_range)`::<W, 8, 32>` with its Philox words, cut-row values
    /// and skip test in intrinsics ([`philox8`], [`parts32`]): the same words, the same open
    /// ids (the test's binary32 operations in the same order, as `avx512`'s `open64`), visited
    /// by the same code ([`visit_open`](super::visit_open)), so the same best.
    #[target_feature(enable = "avx2")]
    pub(super) fn race<W: super::Weights>(
        rng: super::RaceRng,
        w: W,
        start: usize,
        end: usize,
    ) -> super::Best {
        use super::{STREAM_RACE, STREAM_RACE_LO};
        debug_assert!(start % 4 == 0 && end <= w.len());
        let k = super::key(rng.seed);
        let ctr = [
            (rng.position << 2) | STREAM_RACE,
            rng.offset as u32,
            (rng.offset >> 32) as u32,
        ];
        let ctr_lo = [(rng.position << 2) | STREAM_RACE_LO, ctr[1], ctr[2]];
        // The key is bumped between rounds only, never after the tenth.
        let mut keys = [k; 10];
        for r in 1..10 {
            keys[r] = [
                keys[r - 1][0].wrapping_add(0x9E37_79B9),
                keys[r - 1][1].wrapping_add(0xBB67_AE85),
            ];
        }
        let parts = w.cut_parts();
        let zero = _mm256_setzero_ps();
        let shrink = _mm256_set1_ps(super::SHRINK);
        let scale = _mm256_set1_ps(f32::from_bits(0x3380_0000));
        let mut best = super::Best::NO_RACE;
        let mut best_skip = -1.0f32;
        let mut s = start;
        while s < end {
            let wt = match &parts {
                Some(p) if s + 32 <= end => parts32(p, s),
                // A tail, or weights of another form.
                _ => {
                    let mut a = [0f32; 32];
                    w.block(s, end, &mut a);
                    // SAFETY: `a[8q..8q + 8]` is 32 readable bytes (unaligned loads).
                    [0, 1, 2, 3].map(|q| unsafe { _mm256_loadu_ps(a.as_ptr().add(8 * q)) })
                }
            };
            let mut pos = 0u64;
            for (q, &x) in wt.iter().enumerate() {
                let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, zero)) as u32;
                pos |= u64::from(m) << (8 * q);
            }
            // A block without a positive weight has no candidate: skip its random numbers.
            if pos != 0 {
                // V ≤ u32::MAX, so the group index s / 4 fits 32 bits.
                let base = (s / 4) as u32;
                let words = philox8(base, ctr, &keys);
                let bv = _mm256_set1_ps(best_skip);
                let mut proven = 0u64;
                for q in 0..4 {
                    let f = _mm256_cvtepi32_ps(_mm256_srli_epi32::<8>(words[q]));
                    let bound = _mm256_mul_ps(_mm256_mul_ps(bv, _mm256_mul_ps(f, scale)), shrink);
                    // Ordered: a NaN bound proves nothing, the id stays open.
                    let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(wt[q], bound)) as u32;
                    proven |= u64::from(m) << (8 * q);
                }
                let open = pos & !proven;
                if open != 0 {
                    let mut hi = [0u32; 32];
                    for (q, v) in words.iter().enumerate() {
                        // SAFETY: `hi[8q..8q + 8]` is 32 writable bytes (an unaligned store).
                        unsafe { _mm256_storeu_si256(hi.as_mut_ptr().add(8 * q).cast(), *v) };
                    }
                    let lo_ctr = [base, ctr_lo[0], ctr_lo[1], ctr_lo[2]];
                    super::visit_open(&w, open, s, &hi, lo_ctr, k, &mut best, &mut best_skip);
                }
            }
            s += 32;
        }
        best
    }
}

/// The kernels inside `#[target_feature]` functions, so the generic code above is compiled (it is
/// `#[inline(always)]`) for wider vectors. Only reachable after [`Isa::detect`] said so.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Best, RaceRng, Weights, argmax_range, entropy_range};

    #[target_feature(enable = "avx2")]
    pub(super) fn race_avx2<W: Weights>(rng: RaceRng, w: W, start: usize, end: usize) -> Best {
        #[cfg(specula_avx2_intrinsics)]
        {
            super::avx2::race(rng, w, start, end)
        }
        #[cfg(not(specula_avx2_intrinsics))]
        {
            super::race_range::<W, 8, 32>(rng, w, start, end)
        }
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn race_avx512<W: Weights>(rng: RaceRng, w: W, start: usize, end: usize) -> Best {
        super::avx512::race(rng, w, start, end)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn argmax_avx2(row: &[f32], start: usize, end: usize) -> Best {
        argmax_range::<32>(row, start, end)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn argmax_avx512(row: &[f32], start: usize, end: usize) -> Best {
        argmax_range::<64>(row, start, end)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn entropy_avx2(row: &[f32], start: usize, end: usize) -> i64 {
        entropy_range::<16>(row, start, end)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn entropy_avx512(row: &[f32], start: usize, end: usize) -> i64 {
        entropy_range::<32>(row, start, end)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn max_mass_avx2(p: &[f32]) -> (u32, u128) {
        super::max_mass_range::<32>(p)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn max_mass_avx512(p: &[f32]) -> (u32, u128) {
        super::max_mass_range::<32>(p)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn half_span_avx2(row: &[u16], inf: u16) -> super::weight_table::Span {
        super::weight_table::span_range::<32>(row, inf)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn half_span_avx512(row: &[u16], inf: u16) -> super::weight_table::Span {
        super::weight_table::span_range::<64>(row, inf)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn logit_max_avx2<R: super::LogitRow>(row: R) -> f32 {
        super::logit_max_range::<R, 32>(row)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn logit_max_avx512<R: super::LogitRow>(row: R) -> f32 {
        super::logit_max_range::<R, 64>(row)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn gather_avx2(
        w: &[f32],
        lo: u32,
        hi: u32,
        out: &mut Vec<u32>,
        cap: usize,
    ) -> Option<u128> {
        super::gather_range::<32>(w, lo, hi, out, cap)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn softmax_weights_avx2<R: super::LogitRow>(
        row: R,
        t: f32,
        max: f32,
        out: &mut [f32],
    ) {
        super::softmax_weights_range::<R, 16>(row, t, max, out)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn softmax_weights_avx512<R: super::LogitRow>(
        row: R,
        t: f32,
        max: f32,
        out: &mut [f32],
    ) {
        super::softmax_weights_range::<R, 32>(row, t, max, out)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn softmax_pass_avx2<R: super::LogitRow>(
        row: R,
        t: f32,
        max: f32,
        floor: f32,
        out: Option<&mut [f32]>,
    ) -> u128 {
        super::softmax_pass_range::<R, 16>(row, t, max, floor, out)
    }

    #[cfg(specula_avx512)]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
    pub(super) fn softmax_pass_avx512<R: super::LogitRow>(
        row: R,
        t: f32,
        max: f32,
        floor: f32,
        out: Option<&mut [f32]>,
    ) -> u128 {
        super::softmax_pass_range::<R, 32>(row, t, max, floor, out)
    }
}

/// The softmax maximum of `row` at temperature `t` with `isa` (the rules' `m`): the largest
/// logit divided by `t` (division by `t > 0` is monotone, so this is the largest `l / t`; no
/// logit above `−∞` gives `−∞ / t = −∞`, as the rules' start value).
#[inline]
pub(crate) fn softmax_max<R: LogitRow>(isa: Isa, row: R, t: f32) -> f32 {
    softmax_max_of(isa, row, t).m
}

/// A row's softmax maximum `m`, and for a half row the [`Span`](weight_table::Span) of its
/// patterns, which the same pass finds: a half row's maximum is read off its patterns (integer
/// lanes, no widening), and the weight table then needs no pass of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Max {
    /// The softmax maximum (the rules' `m`).
    pub m: f32,
    /// The half row's span, `None` for a binary32 row (or one not known).
    pub span: Option<weight_table::Span>,
}

impl From<f32> for Max {
    fn from(m: f32) -> Self {
        Self { m, span: None }
    }
}

/// [`softmax_max`], with a half row's [`Span`](weight_table::Span) (its maximum up to the
/// sign of a zero, which no weight depends on: [`weight_table::Span::max_logit`]).
#[inline]
pub(crate) fn softmax_max_of<R: LogitRow>(isa: Isa, row: R, t: f32) -> Max {
    if let Some((format, bits)) = row.half_bits() {
        let span = half_span(isa, format, bits);
        return Max {
            m: span.max_logit(format) / t,
            span: Some(span),
        };
    }
    let max = match isa {
        Isa::Portable => logit_max_range::<R, 16>(row),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::logit_max_avx2(row) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::logit_max_avx512(row) },
    };
    (max / t).into()
}

/// The [`Span`](weight_table::Span) of a `format` row's patterns with `isa`
/// ([`weight_table::span_range`]).
#[inline]
fn half_span(isa: Isa, format: Half16, row: &[u16]) -> weight_table::Span {
    // Below 2¹⁵.
    let inf = format.inf() as u16;
    match isa {
        Isa::Portable => weight_table::span_range::<16>(row, inf),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::half_span_avx2(row, inf) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::half_span_avx512(row, inf) },
    }
}

/// The largest key of the probabilities `p` and the exact mass of their positive values, in one
/// pass with `isa` ([`max_mass_range`]; the mass is the row's only when that key is at most the
/// key of `1.0`).
#[inline]
pub(crate) fn max_mass(isa: Isa, p: &[f32]) -> (u32, u128) {
    match isa {
        Isa::Portable => max_mass_range::<8>(p),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::max_mass_avx2(p) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::max_mass_avx512(p) },
    }
}

/// Appends to `out` the keys in `[lo, hi)` (`lo ≥ 1`) of the weights `w` (in `[0, 1]`) in id
/// order, and returns the exact mass of the weights with key `≥ hi`, with `isa`; `None` if
/// there are more than `cap` keys (`hi = u32::MAX`: every key `≥ lo`, mass 0, not computed).
#[inline]
pub(crate) fn gather_keys(
    isa: Isa,
    w: &[f32],
    lo: u32,
    hi: u32,
    out: &mut Vec<u32>,
    cap: usize,
) -> Option<u128> {
    debug_assert!(lo >= 1);
    match isa {
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw, avx512vl and popcnt. The keys, their order and the mass
        // are those of `gather_range` (`gather_keys_is_the_filter` checks it).
        #[cfg(specula_avx512)]
        Isa::Avx512 if hi == u32::MAX => unsafe {
            avx512::gather::<{ avx512::NO_MASS }>(w, lo, hi, out, cap)
        },
        // SAFETY: as above; the binary64 sums are exact under these conditions (see `gather`).
        #[cfg(specula_avx512)]
        Isa::Avx512 if hi >= KEY_2_M14 && w.len() / 16 < (1 << 16) => unsafe {
            avx512::gather::<{ avx512::BINARY64 }>(w, lo, hi, out, cap)
        },
        // SAFETY: as above.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { avx512::gather::<{ avx512::PIECES }>(w, lo, hi, out, cap) },
        Isa::Portable => gather_range::<8>(w, lo, hi, out, cap),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::gather_avx2(w, lo, hi, out, cap) },
    }
}

/// The exact fixed-point softmax sum `F` of `row` at `t` with maximum `max` (the row's
/// [`softmax_max`]), with `isa`; with `out`, also writes every weight `e_v` there (same
/// length).
///
/// A half row takes its weights from a table of the patterns it holds where that pays
/// ([`weight_table`]): the same bits.
#[inline]
pub(crate) fn softmax_pass<R: LogitRow>(
    isa: Isa,
    row: R,
    t: f32,
    max: impl Into<Max>,
    out: Option<&mut [f32]>,
) -> u128 {
    softmax_pass_kept(isa, row, t, max, 0, out)
}

/// [`softmax_pass`] summing only the weights with key `≥ threshold` (every weight is written):
/// min-p's exact kept mass in the same pass, its threshold being known before the weights are.
#[inline]
pub(crate) fn softmax_pass_kept<R: LogitRow>(
    isa: Isa,
    row: R,
    t: f32,
    max: impl Into<Max>,
    threshold: u32,
    out: Option<&mut [f32]>,
) -> u128 {
    let max: Max = max.into();
    // Key ≥ threshold ⇔ weight ≥ floor for weights in [0, 1] (positive binary32 values order
    // as their bits; a zero weight, key 0, adds nothing either way).
    let floor = f32::from_bits(threshold);
    match row.half_bits() {
        Some((format, bits)) => weight_table::with_table(isa, format, bits, t, max, false, |l| {
            weight_table::on_lookup!(l, row, |r| softmax_pass_plain(isa, r, t, max.m, floor, out))
        }),
        None => softmax_pass_plain(isa, row, t, max.m, floor, out),
    }
}

/// [`softmax_pass`] with each weight computed as the row's kernel does.
#[inline]
fn softmax_pass_plain<R: LogitRow>(
    isa: Isa,
    row: R,
    t: f32,
    max: f32,
    floor: f32,
    out: Option<&mut [f32]>,
) -> u128 {
    match isa {
        Isa::Portable => softmax_pass_range::<R, 8>(row, t, max, floor, out),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::softmax_pass_avx2(row, t, max, floor, out) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::softmax_pass_avx512(row, t, max, floor, out) },
    }
}

/// The softmax weights of `row` at `t` with maximum `max` (the row's [`softmax_max`]) into
/// `out` (same length), each as the row's kernel computes it, with `isa`.
#[inline]
pub(crate) fn softmax_weights<R: LogitRow>(isa: Isa, row: R, t: f32, max: f32, out: &mut [f32]) {
    match isa {
        Isa::Portable => softmax_weights_range::<R, 8>(row, t, max, out),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::softmax_weights_avx2(row, t, max, out) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::softmax_weights_avx512(row, t, max, out) },
    }
}

/// Writes `cut.p(w[v])` of every weight into `out` (same length) with `isa`: `0` for ids below
/// the cut's threshold or when its mass is `0`, else `((w as f64) / S) as f32`.
#[inline]
pub(crate) fn cut_write(isa: Isa, w: &[f32], cut: specula_core::verify::Cut, out: &mut [f32]) {
    if cut.fixed == 0 {
        out.fill(0.0);
        return;
    }
    let sum = (cut.fixed as f64) * (1.0 / 18_446_744_073_709_551_616.0);
    match isa {
        Isa::Portable => cut_write_range::<4>(w, cut.threshold, sum, out),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(specula_avx2_intrinsics)]
        Isa::Avx2 => unsafe { avx2::cut_write(w, cut.threshold, sum, out) },
        // Before Rust 1.87 the AVX2 write-out is not compiled (build.rs): the portable one.
        #[cfg(all(target_arch = "x86_64", not(specula_avx2_intrinsics)))]
        Isa::Avx2 => cut_write_range::<4>(w, cut.threshold, sum, out),
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { avx512::cut_write(w, cut.threshold, sum, out) },
    }
}

/// Race over ids `start..end` of `w` with `isa` (`start` a multiple of 4).
#[inline]
pub(crate) fn race<W: Weights>(isa: Isa, rng: RaceRng, w: W, start: usize, end: usize) -> Best {
    match isa {
        Isa::Portable => race_range::<W, 4, 16>(rng, w, start, end),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::race_avx2(rng, w, start, end) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::race_avx512(rng, w, start, end) },
    }
}

/// Argmax over `row[start..end]` with `isa`.
#[inline]
pub(crate) fn argmax(isa: Isa, row: &[f32], start: usize, end: usize) -> Best {
    match isa {
        Isa::Portable => argmax_range::<16>(row, start, end),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::argmax_avx2(row, start, end) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::argmax_avx512(row, start, end) },
    }
}

/// Wrapping sum of the fixed-point entropy terms of `row[start..end]` with `isa`.
#[inline]
pub(crate) fn entropy_sum(isa: Isa, row: &[f32], start: usize, end: usize) -> i64 {
    match isa {
        Isa::Portable => entropy_range::<16>(row, start, end),
        // SAFETY: `Isa::Avx2` is only produced after `is_x86_feature_detected!("avx2")`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::entropy_avx2(row, start, end) },
        // SAFETY: `Isa::Avx512` is only produced after `is_x86_feature_detected!` confirmed
        // avx512f, avx512dq, avx512bw and avx512vl.
        #[cfg(specula_avx512)]
        Isa::Avx512 => unsafe { x86::entropy_avx512(row, start, end) },
    }
}

mod sum_bound;
mod weight_table;

pub(crate) use sum_bound::{MassAbove, SumBound, mass_above, sum_bound};

#[cfg(test)]
mod tests;
