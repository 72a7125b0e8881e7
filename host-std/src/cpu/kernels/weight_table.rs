//! The softmax weights of a half row (bf16 or f16) looked up per id in a table of the bit
//! patterns it holds.
//!
//! A half logit is one of 2¹⁶ bit patterns, and its softmax weight `exp_p(l / t − max)` is a
//! function of the pattern alone for a given row (`t` and `max` are the row's). A row of a
//! language model's logits holds a few thousand distinct bf16 patterns (a few dozen binades of
//! 128 values each; f16 has 1024 per binade), far fewer than its 32 000 – 256 000 ids, and
//! `exp_p` with its division is what makes the softmax pass compute-bound
//! (`docs/PERFORMANCE.md`). So the pass computes the weight of each pattern the row can hold
//! once, into a table, and then only looks each id's weight up. Every table entry is computed
//! by the very kernel the row pass runs ([`LogitRow::weights`] over the patterns in order,
//! widened as the row's format widens them), so each id's weight has the bits it had.
//!
//! Which patterns: those of `[0, pos_top)` (`+0` up to the row's largest positive pattern)
//! and of `[0x8000, 0x8000 + neg_top)` (likewise for the negative ones), found in one pass over
//! the row's bits ([`span_range`]). Most of them are tiny logits, every one of which gives the
//! same weight. Both formats are sign-magnitude with the exponent above the mantissa, and
//! their widening to binary32 is exact ([`Half16::value`]), so within a sign the patterns
//! order as their values, and pattern `0x8000 | p` is `−value(p)`. `x(l) = RN(RN(l / t) − max)`
//! is non-decreasing in `l` (correctly rounded division by `t > 0` and subtraction of a
//! constant are monotone), so if `x` has the same value at `−a` and at `a`, it has that value
//! at every `l ∈ [−a, a]`, and the weights there are all `exp_p` of that value (`±0` give the
//! same bits). The largest such `a` among the patterns is found by bisection ([`collapse`]: the
//! test is monotone in `a`); the patterns of magnitude below it share one entry's value. That
//! argument needs only the monotone exact widening, so it holds for f16 as for bf16 (finite
//! magnitudes below `0x7C00` there, `0x7F80` for bf16; NaN patterns never collapse). A row
//! whose patterns are not few (a flat random row, NaN payloads, huge ranges; f16 rows at small
//! vocabularies, whose binades hold 8 times the patterns) is left to the plain pass.

use super::{Half16, Isa, LogitRow, Max, exp_p};
use std::cell::RefCell;

/// The number of 16-bit patterns.
const PATTERNS: usize = 1 << 16;

/// The sign bit of a half pattern (either format).
const SIGN: u32 = 0x8000;

/// A table of one weight per 16-bit pattern.
pub(crate) type Table = [f32; PATTERNS];

thread_local! {
    /// This thread's table (256 KiB): filled anew for each row that uses it.
    static TABLE: RefCell<Box<Table>> = RefCell::new(
        vec![0f32; PATTERNS].into_boxed_slice().try_into().expect("PATTERNS entries"),
    );
}

/// The consecutive patterns `first .. first + len` of `format` as a row of logits: the
/// table's entries are this row's weights, computed by the same kernel as a half row's.
#[derive(Clone, Copy)]
struct Patterns {
    format: Half16,
    first: u32,
    len: usize,
}

impl LogitRow for Patterns {
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize) -> [f32; N] {
        // Patterns stay below `2¹⁶` (`first + len ≤ 0x8000 + 0x8000`).
        let mut p = [0u16; N];
        for (l, o) in p.iter_mut().enumerate() {
            *o = (self.first as usize + start + l) as u16;
        }
        self.format.widen(&p)
    }
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self.format.value((self.first as usize + i) as u16)
    }
}

/// How a [`Tabled`] row looks its weights up: plain loads, or a gather instruction. LLVM does
/// not emit gathers for the lane code, and on AVX-512 its lane-by-lane lookups into 32 lanes
/// cost more than the `exp_p` they replace (`softmax_pass_timing`: 185 µs against the plain
/// pass's 114 µs for a 128k row; 60 µs with the gather).
pub(crate) const SCALAR: u8 = 0;
/// 16 weights per AVX-512 gather; a row of this kind is only made on AVX-512.
#[cfg(specula_avx512)]
pub(crate) const GATHER16: u8 = 1;
/// 8 weights per AVX2 gather; a row of this kind is only made on AVX2.
#[cfg(specula_avx2_intrinsics)]
pub(crate) const GATHER8: u8 = 2;

/// A half row whose weights are read from a filled table (`G`: how, [`SCALAR`] or a gather).
#[derive(Clone, Copy)]
pub(crate) struct Tabled<'a, const G: u8> {
    format: Half16,
    row: &'a [u16],
    table: &'a Table,
}

impl<const G: u8> LogitRow for Tabled<'_, G> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.row.len()
    }
    #[inline(always)]
    fn block<const N: usize>(&self, start: usize) -> [f32; N] {
        let src: &[u16; N] = self.row[start..start + N].try_into().expect("N values");
        self.format.widen(src)
    }
    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self.format.value(self.row[i])
    }
    #[inline(always)]
    fn weights<const N: usize>(&self, start: usize, _t: f32, _max: f32) -> [f32; N] {
        let src: &[u16; N] = self.row[start..start + N].try_into().expect("N values");
        #[cfg(specula_avx512)]
        if G == GATHER16 && N % 16 == 0 {
            // SAFETY: a `Tabled` row of kind `GATHER16` is only made after `Isa::detect` said
            // AVX-512 (`with_table`).
            return by_blocks(src, |b| unsafe { super::avx512::lookup16(b, self.table) });
        }
        #[cfg(specula_avx2_intrinsics)]
        if G == GATHER8 && N % 8 == 0 {
            // SAFETY: a `Tabled` row of kind `GATHER8` is only made after `Isa::detect` said
            // AVX2 (`with_table`).
            return by_blocks(src, |b| unsafe { super::avx2::lookup8(b, self.table) });
        }
        // A pattern indexes the table: always in bounds.
        src.map(|b| self.table[usize::from(b)])
    }
    #[inline(always)]
    fn weight_at(&self, i: usize, _t: f32, _max: f32) -> f32 {
        self.table[usize::from(self.row[i])]
    }
}

/// The weights of the patterns `src`, `W` at a time by `lookup` (`N` a multiple of `W`).
#[inline(always)]
fn by_blocks<const N: usize, const W: usize>(
    src: &[u16; N],
    lookup: impl Fn(&[u16; W]) -> [f32; W],
) -> [f32; N] {
    let mut out = [0f32; N];
    for (o, b) in out.chunks_exact_mut(W).zip(src.chunks_exact(W)) {
        o.copy_from_slice(&lookup(b.try_into().expect("W values")));
    }
    out
}

/// What one pass over a half row's patterns finds: the span of patterns the table must hold,
/// and the row's largest logit (which makes it the row's softmax maximum pass too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// One more than the largest positive pattern (`0` without one).
    pub pos_top: u32,
    /// One more than the largest magnitude of a negative pattern (`0` without one).
    pub neg_top: u32,
    /// One more than the largest positive pattern that is not NaN (`0` without one).
    pos_value_top: u32,
    /// The smallest magnitude of a negative pattern that is not NaN (`0x8000` without one).
    neg_value_min: u32,
}

impl Span {
    /// The row's largest logit, NaN never winning (`−∞` for a row of NaN or no ids): the
    /// largest positive pattern that is not NaN, else the negative one of smallest magnitude.
    /// The same value as the float kernels' maximum (`logit_max_range`), up to the sign of a
    /// zero maximum, which no weight depends on (`±0 − m` and `x − ±0` are the same values).
    pub(crate) fn max_logit(&self, format: Half16) -> f32 {
        if self.pos_value_top > 0 {
            format.value((self.pos_value_top - 1) as u16)
        } else if self.neg_value_min < SIGN {
            format.value((SIGN | self.neg_value_min) as u16)
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// How far ahead of its reads [`span_range`] asks for a row's lines, in ids (8 KiB).
const SPAN_AHEAD: usize = 4096;

/// The [`Span`] of a row's bits, `inf` the format's pattern of `+∞` (larger magnitudes NaN).
#[inline(always)]
pub(super) fn span_range<const N: usize>(row: &[u16], inf: u16) -> Span {
    let (mut pos, mut neg) = ([0u16; N], [0u16; N]);
    let (mut pos_v, mut neg_v) = ([0u16; N], [0x8000u16; N]);
    let mut chunks = row.chunks_exact(N);
    for (i, c) in (&mut chunks).enumerate() {
        // This pass is a half row's first read: its lines are asked for well ahead (the
        // lanes' work alone kept too few loads in flight to stream the row from memory).
        super::prefetch_lines(row, i * N + SPAN_AHEAD, N);
        let c: &[u16; N] = c.try_into().expect("N values");
        for l in 0..N {
            let b = c[l];
            let mag = b & 0x7FFF;
            let negative = b >= 0x8000;
            let value = mag <= inf;
            // Each fits 16 bits: `b + 1 ≤ 0x8000` for a positive pattern, `mag + 1 ≤ 0x8000`.
            let p = if negative { 0 } else { b.wrapping_add(1) };
            let n = if negative { mag.wrapping_add(1) } else { 0 };
            let pv = if !negative && value {
                b.wrapping_add(1)
            } else {
                0
            };
            let nv = if negative && value { mag } else { 0x8000 };
            pos[l] = pos[l].max(p);
            neg[l] = neg[l].max(n);
            pos_v[l] = pos_v[l].max(pv);
            neg_v[l] = neg_v[l].min(nv);
        }
    }
    let mut span = Span {
        pos_top: 0,
        neg_top: 0,
        pos_value_top: 0,
        neg_value_min: SIGN,
    };
    let mut add = |p: u16, n: u16, pv: u16, nv: u16| {
        span.pos_top = span.pos_top.max(u32::from(p));
        span.neg_top = span.neg_top.max(u32::from(n));
        span.pos_value_top = span.pos_value_top.max(u32::from(pv));
        span.neg_value_min = span.neg_value_min.min(u32::from(nv));
    };
    for l in 0..N {
        add(pos[l], neg[l], pos_v[l], neg_v[l]);
    }
    for &b in chunks.remainder() {
        let mag = b & 0x7FFF;
        let (negative, value) = (b >= 0x8000, mag <= inf);
        add(
            if negative { 0 } else { b + 1 },
            if negative { mag + 1 } else { 0 },
            if !negative && value { b + 1 } else { 0 },
            if negative && value { mag } else { 0x8000 },
        );
    }
    span
}

/// The largest `c ≤ top` (`top ≤ format.inf()`) such that every pattern of `format` of
/// magnitude below `c`, of either sign, has the same `x = l / t − max`: the largest with
/// `x(value(c − 1)) == x(−value(c − 1))` (`c = 0`: none), by bisection (the test holds for every
/// smaller `c` once it holds for one: see the module's text).
fn collapse(format: Half16, top: u32, t: f32, max: f32) -> u32 {
    // `p < 2¹⁶`: a pattern.
    let x = |p: u32| format.value(p as u16) / t - max;
    // NaN is never equal: such a `c` fails.
    let same = |c: u32| x(c - 1) == x(SIGN | (c - 1));
    // `same(lo)` holds (vacuously for 0); the answer lies in `lo ..= hi`.
    let (mut lo, mut hi) = (0u32, top);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if same(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// How many patterns a table costs at most, relative to the row: above `len / 2` computed
/// weights the plain pass is cheaper (a table entry costs what a row id does, plus the lookup).
fn worth_it(computed: u32, len: usize) -> bool {
    (computed as usize) * 2 <= len
}

/// Fills `table` with the weights at `t` and `max` of every pattern the `format` row `row`
/// may hold, with `isa`; `false` (nothing written) where the row holds too many patterns for
/// that to pay ([`worth_it`]), unless `force`. `max`'s span: the row's [`Span`] if its maximum
/// pass found it (else one more pass finds it).
fn fill(
    isa: Isa,
    format: Half16,
    row: &[u16],
    t: f32,
    Max { m: max, span }: Max,
    table: &mut Table,
    force: bool,
) -> bool {
    let Span {
        pos_top, neg_top, ..
    } = span.unwrap_or_else(|| super::half_span(isa, format, row));
    let c = collapse(format, pos_top.max(neg_top).min(format.inf()), t, max);
    let computed = pos_top.saturating_sub(c) + neg_top.saturating_sub(c);
    if !(force || worth_it(computed, row.len())) {
        return false;
    }
    // The shared weight of the patterns below `c` (`x(+0)`'s).
    let shared = exp_p(format.value(0) / t - max);
    for (first, top) in [(0, pos_top), (SIGN, neg_top)] {
        let (start, end) = ((first + c.min(top)) as usize, (first + top) as usize);
        table[first as usize..start].fill(shared);
        let n = end - start;
        if n > 0 {
            let patterns = Patterns {
                format,
                first: start as u32,
                len: n,
            };
            super::softmax_weights(isa, patterns, t, max, &mut table[start..end]);
        }
    }
    true
}

/// What [`with_table`] hands over: the row with its table, in the lookup `isa` wants, or
/// nothing.
pub(crate) enum Lookup<'a> {
    /// Too many patterns: the plain pass.
    Plain,
    /// Plain loads (the portable kernels).
    Scalar(Tabled<'a, SCALAR>),
    /// AVX-512 gathers.
    #[cfg(specula_avx512)]
    Gather16(Tabled<'a, GATHER16>),
    /// AVX2 gathers.
    #[cfg(specula_avx2_intrinsics)]
    Gather8(Tabled<'a, GATHER8>),
}

/// Calls `$f` with the row of a [`Lookup`] (one arm per kind, each its own instance), or with
/// `$plain` for [`Lookup::Plain`].
macro_rules! on_lookup {
    ($lookup:expr, $plain:expr, |$r:ident| $f:expr) => {
        match $lookup {
            $crate::cpu::kernels::weight_table::Lookup::Plain => {
                let $r = $plain;
                $f
            }
            $crate::cpu::kernels::weight_table::Lookup::Scalar($r) => $f,
            #[cfg(specula_avx512)]
            $crate::cpu::kernels::weight_table::Lookup::Gather16($r) => $f,
            #[cfg(specula_avx2_intrinsics)]
            $crate::cpu::kernels::weight_table::Lookup::Gather8($r) => $f,
        }
    };
}
pub(crate) use on_lookup;

/// Runs `f` with the `format` row `row` as a [`Tabled`] row at `t` and `max` where a table
/// pays for itself (`force`: always), else with [`Lookup::Plain`] (`max` as [`fill`] takes
/// it).
pub(crate) fn with_table<T>(
    isa: Isa,
    format: Half16,
    row: &[u16],
    t: f32,
    max: Max,
    force: bool,
    f: impl FnOnce(Lookup<'_>) -> T,
) -> T {
    TABLE.with_borrow_mut(|table| {
        if !fill(isa, format, row, t, max, table, force) {
            return f(Lookup::Plain);
        }
        let table = &**table;
        match isa {
            #[cfg(specula_avx512)]
            Isa::Avx512 => f(Lookup::Gather16(Tabled { format, row, table })),
            #[cfg(specula_avx2_intrinsics)]
            Isa::Avx2 => f(Lookup::Gather8(Tabled { format, row, table })),
            _ => f(Lookup::Scalar(Tabled { format, row, table })),
        }
    })
}

#[cfg(test)]
mod tests;
